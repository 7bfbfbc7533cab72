/* cuda_kernel.h - kernel IR to a loaded CUDA function through NVRTC, and
 * its launch: the pieces of the CUDA device of the engine (cuda_jit.c),
 * which also serves eager CUDA ops (cuda_kernel_get).
 *
 * The key hashes the kernel IR, the target (sm_XY, generator version, the
 * NVRTC Ember was built for, options): the kernel cache sequence is the
 * engine's (engine/kernels.c), for eager ops too.  An image embeds its key
 * and its launch descriptor (cuda_emit.h), so loading one needs neither
 * the IR nor NVRTC.  Loaded modules stay loaded for the life of the
 * process (the device owns them, in its table). */
#ifndef EMBER_CUDA_KERNEL_H
#define EMBER_CUDA_KERNEL_H

#include "cache.h"
#include "cuda_emit.h"
#include "cuda_lib.h"
#include "engine.h"

#ifdef EMBER_HAVE_CUDA

typedef struct cuda_kernel {
    CUmodule module;
    CUfunction fn;
    CUfunction fn_v4; /* the 16-byte vector variant, or NULL */
    cuda_shape shape;
    int threads, unroll;
    int64_t extent;   /* or sizes[extent_size] when extent_size >= 0 */
    int extent_size;
    bool vec4;
    int nbufs, nsizes;
    int cluster;      /* CU_ROWS: blocks a row, launched as a cluster (>= 1) */
    int clusters[2];  /* cluster kernels: clusters of fn, fn_v4 the device
                         runs at once (the driver's occupancy), 0: unknown */
    int device;       /* the index of the device it is loaded on */
    int smem_optin;   /* dynamic shared memory opted into so far (generated
                         kernels, cuda_source_launch; set atomically) */
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

/* The loaded kernel for k on device d (an eager op's one-node graph),
 * through the engine's kernel cache sequence; cache may be NULL (no disk
 * tier), log too (quiet).  stats is updated under d->lock.  *out is owned
 * by the device. */
em_status cuda_kernel_get(cuda_device *d, const k_kernel *k, kc_cache *cache,
                          const jit_log *log, cuda_get_stats *stats, const cuda_kernel **out);
/* Launches ck on d's stream: bufs[i] is device pointer of buffer #i,
 * sizes[i] size parameter #i (NULL when it has none). */
em_status cuda_kernel_launch(cuda_device *d, const cuda_kernel *ck, void *const *bufs,
                             const int64_t *sizes);
/* NVRTC: k (named JIT_KERNEL_NAME) printed with the rows parameters p
 * (NULL: defaults) and with key and its launch descriptor embedded,
 * compiled to a cubin for sm_<arch>, or PTX when NVRTC does not know the
 * architecture.  *bin from em_malloc. */
em_status cuda_kernel_compile(const k_kernel *k, const cuda_row_params *p, const kc_key *key, int arch,
                              void **bin, size_t *n);
/* Autotuning (engine.h's variants): k's distinct rows schedules, the
 * default first, as engine parameters (v[0] elements per thread, v[1]
 * lane bytes); 1 for a kernel that is not a rows kernel. */
int cuda_kernel_variants(const k_kernel *k, jit_params *out, int max);
/* The engine's parameters p as rows parameters. */
cuda_row_params cuda_row_params_of(const jit_params *p);
/* Launches ck reps times after one untimed launch, each between two
 * events on d's stream, and gives the median seconds. */
em_status cuda_kernel_time(cuda_device *d, const cuda_kernel *ck, void *const *bufs,
                           const int64_t *sizes, int reps, double *seconds);
/* Loads a cubin or PTX image on d, checking its embedded key against key
 * and reading its launch descriptor. */
em_status cuda_kernel_load(cuda_device *d, const void *img, const kc_key *key, cuda_kernel **out);
/* "sm_<arch> <generator> <NVRTC id> <options>": the target of kernels for
 * that architecture (part of their keys); false when buf is too short. */
bool cuda_target_string(int arch, char *buf, size_t n);
/* The architecture a target names ("sm_90..." -> 90), or -1. */
int cuda_target_arch(const char *target);

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
