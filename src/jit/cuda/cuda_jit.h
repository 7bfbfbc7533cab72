/* cuda_jit.h - what src/jit/cuda offers: the CUDA device of the engine
 * (cuda_jit.c: NVRTC kernels, cuBLAS for matmul through the eager ops)
 * and the eager CUDA device (cuda_eager.c).  The driver loader
 * (cuda_lib.h), the printer (cuda_emit.h) and the kernel loader
 * (cuda_kernel.h) are the folder's own. */
#ifndef EMBER_CUDA_JIT_H
#define EMBER_CUDA_JIT_H

#include "engine.h"

extern const jit_device jit_cuda_device;

/* "nvrtc 13.0": the version of the NVRTC loaded in this process (loading
 * it if need be), or NULL when there is none. */
const char *jit_cuda_nvrtc_version(void);

#endif
