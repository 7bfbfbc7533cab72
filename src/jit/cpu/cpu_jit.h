/* cpu_jit.h - what src/jit/cpu offers: the CPU device of the engine
 * (cpu_jit.c) -- kernel IR compiled with libgccjit (cpu_gccjit.h, the
 * generator's own interface) in worker processes (worker.h). */
#ifndef EMBER_CPU_JIT_H
#define EMBER_CPU_JIT_H

#include "engine.h"

/* Whether the calling thread is one of the compile queue's
 * (runtime/compile_queue.c): such a thread must not run libgccjit in
 * process. */
bool jit_queue_on_queue_thread(void);

extern const jit_device jit_cpu_device;

#endif
