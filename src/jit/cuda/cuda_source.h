/* cuda_source.h - kernels that a generator of this folder writes as CUDA C
 * text directly, for computations the kernel IR cannot say (fused
 * attention's shared-memory tiles: cuda_attention.c), compiled and cached
 * as the kernel-IR kernels are.
 *
 * The generator names its kernel JIT_KERNEL_NAME (extern "C") and
 * specializes the text on everything it fixes at compile time (sizes,
 * flags); its launch geometry is its own (cuda_source_launch).  The key
 * hashes the fields what "ember cuda source", device "cuda", the target
 * (cuda_target_string: architecture, generator, NVRTC) and the text: one
 * text is compiled once per target, in a process (the device's table of
 * loaded kernels) and across processes (the kernel cache, kind "cubin").
 * The image embeds its key, which loading checks, so a corrupt or
 * misfiled entry is recompiled, never run. */
#ifndef EMBER_CUDA_SOURCE_H
#define EMBER_CUDA_SOURCE_H

#include "cuda_kernel.h"

#ifdef EMBER_HAVE_CUDA

/* The loaded kernel for text (a whole translation unit defining
 * JIT_KERNEL_NAME) on device d; cache may be NULL (no disk tier), log
 * too.  stats counts compiles and loads (under d->lock).  *out is owned by
 * the device, process-long.  EM_ERR_STATE with NVRTC's log when the text
 * does not compile. */
em_status cuda_source_get(cuda_device *d, const char *text, kc_cache *cache, const jit_log *log,
                          cuda_get_stats *stats, const cuda_kernel **out);
/* The same for the text that is parts[0..n) concatenated: the key hashes
 * the parts as they are (no copy), and the text is put together only to
 * compile it, so a call that finds its kernel loaded (every call but the
 * first) costs a hash of the parts and a table lookup. */
em_status cuda_source_get_parts(cuda_device *d, const char *const *parts, int n, kc_cache *cache,
                                const jit_log *log, cuda_get_stats *stats, const cuda_kernel **out);

/* Launches k on d's stream with grid x block threads and smem bytes of
 * dynamic shared memory (over 48 KiB is opted into per launch); args as
 * cuLaunchKernel takes them. */
em_status cuda_source_launch(cuda_device *d, const cuda_kernel *k, unsigned grid, unsigned block,
                             unsigned smem, void **args);

#endif
#endif
