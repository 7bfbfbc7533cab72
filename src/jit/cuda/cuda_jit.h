/* cuda_jit.h - what the cuda folder (src/jit/cuda) offers the rest of
 * Ember, tools/ and bench/: the CUDA device of the engine (cuda_jit.c:
 * NVRTC kernels; matmul through cuBLAS as eager ops), and what a
 * benchmark needs to time GPU work without the CUDA headers
 * (cuda_timing.c).  Its other headers (cuda_lib.h: the loaded libraries
 * and per-device state, cuda_kernel.h, cuda_emit.h, cuda_eager.h) are its
 * own files' business.
 *
 * Timing:  Devices are named by index, as em_cuda(index) names
 * them; each call works on that device's one stream, on which every Ember
 * op of the device runs in order.  Every function reports failure as an
 * em_status (NULL for the timer) with em_last_error() saying why (no
 * driver, no such device, a driver error).
 *
 * Only in builds with the CUDA headers (EMBER_HAVE_CUDA), as the rest of
 * the folder. */
#ifndef EMBER_CUDA_JIT_H
#define EMBER_CUDA_JIT_H

#include "config.h"

/* The engine's CUDA device (engine.h's jit_device table); present in
 * every build (without CUDA headers its entries report EM_ERR_DEVICE). */
extern const struct jit_device jit_cuda_device;

/* "nvrtc 13.0": the version of the NVRTC loaded in this process (loading
 * it if need be), or NULL when there is none. */
const char *jit_cuda_nvrtc_version(void);

#ifdef EMBER_HAVE_CUDA

#include <stdbool.h>
#include <stddef.h>

#include "ember.h"

/* ---- devices ---- */
typedef struct cuda_device_info {
    char name[128];   /* the driver's name, e.g. "NVIDIA H200" */
    int major, minor; /* compute capability */
    int sm_count;     /* multiprocessors */
    bool tf32;        /* f32 matmuls may use TF32 (EMBER_CUDA_TF32=1) */
} cuda_device_info;

/* Fills out with cuda:index's description (setting the device up, as its
 * first op would). */
em_status cuda_device_info_get(int index, cuda_device_info *out);

/* ---- the device's stream ---- */
/* Waits until every op queued on cuda:index is done. */
em_status cuda_stream_sync(int index);
/* Queues the driver's copy of src's values into dst on their device's
 * stream: no Ember op, so a benchmark's bandwidth floor.  Both contiguous,
 * with storage, on one CUDA device, of one dtype and element count. */
em_status cuda_stream_copy(em_tensor *dst, const em_tensor *src);

/* ---- timers: CUDA events on the device's stream ----
 * cuda_timer_stop gives the GPU time of what was queued on the stream
 * between start and stop, which host-side clocks cannot see.  A timer is
 * used on one thread at a time. */
typedef struct cuda_timer cuda_timer;
cuda_timer *cuda_timer_new(int index);
em_status cuda_timer_start(cuda_timer *t);
/* Records the end, waits for it and sets *seconds to the time since start. */
em_status cuda_timer_stop(cuda_timer *t, double *seconds);
void cuda_timer_free(cuda_timer *t); /* NULL: nothing */

#endif /* EMBER_HAVE_CUDA */
#endif
