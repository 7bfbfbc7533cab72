/* cpu_jit.h - what src/jit/cpu offers: the CPU device of the engine
 * (cpu_jit.c) -- kernel IR compiled with libgccjit (cpu_gccjit.h, the
 * generator's own interface) in worker processes (worker.h). */
#ifndef EMBER_CPU_JIT_H
#define EMBER_CPU_JIT_H

#include "engine.h"

extern const jit_device jit_cpu_device;

#endif
