/* cuda_kernel.h - kernel IR to a loaded CUDA function, through NVRTC and
 * the kernel cache, and its launch.
 *
 * Getting a kernel: print it (cuda_emit.c) -> key = hash of the generator
 * version, NVRTC's identity (soname and the CUDA_VERSION built against, so
 * that a hit needs no NVRTC), the target, the options and the text -> the
 * device's table of loaded kernels (this process) -> the kernel cache
 * (kind "cubin", or "ptx" when NVRTC cannot target the device's
 * architecture and the driver compiles PTX) -> NVRTC.  Loaded modules stay
 * loaded for the life of the process (the device owns them). */
#ifndef EMBER_CUDA_KERNEL_H
#define EMBER_CUDA_KERNEL_H

#include "cache.h"
#include "cuda_emit.h"
#include "cuda_lib.h"

#ifdef EMBER_HAVE_CUDA

typedef struct cuda_kernel {
    CUmodule module;
    CUfunction fn;
    CUfunction fn_v4; /* the 16-byte vector variant, or NULL */
    cuda_shape shape;
    int threads, unroll;
    int64_t extent;
    int nbufs, nsizes;
} cuda_kernel;

struct cuda_kernel_entry {
    kc_key key;
    cuda_kernel *kernel;
};

/* What a lookup did, for statistics and logs. */
typedef struct cuda_get_stats {
    int64_t compiled; /* kernels compiled by NVRTC */
    int64_t loaded;   /* kernels found loaded or in the kernel cache */
} cuda_get_stats;

/* The loaded kernel for k on device d; cache may be NULL (no disk tier).
 * *out is owned by the device. */
em_status cuda_kernel_get(cuda_device *d, const k_kernel *k, kc_cache *cache,
                          cuda_get_stats *stats, const cuda_kernel **out);
/* Launches ck on d's stream: bufs[i] is device pointer of buffer #i,
 * sizes[i] size parameter #i. */
em_status cuda_kernel_launch(cuda_device *d, const cuda_kernel *ck, void *const *bufs,
                             const int64_t *sizes);

/* The device's table of loaded kernels (d->lock held; exposed for tests):
 * the kernel under key or NULL; add returns false when out of memory. */
cuda_kernel *cuda_kernel_table_find(cuda_device *d, const kc_key *key);
bool cuda_kernel_table_add(cuda_device *d, const kc_key *key, cuda_kernel *k);

/* NVRTC alone (no driver needed): compiles src to a cubin for sm_<arch>
 * (ptx false) or PTX for compute_<arch> (ptx true).  *bin from em_malloc.
 * EM_ERR_STATE with NVRTC's log when the source does not compile. */
em_status cuda_nvrtc_compile(const char *src, const char *name, int arch, bool ptx, void **bin,
                             size_t *n);
/* "nvrtc 13.0": the loaded NVRTC's version (for logs and tests), or NULL. */
const char *cuda_nvrtc_version(void);

#endif
#endif
