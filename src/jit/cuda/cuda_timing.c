/* cuda_timing.c - device descriptions, stream sync and copy, event timers
 * (cuda_jit.h): what bench/bench_cuda.c needs, over cuda_lib.c's device
 * state, so that it does not include the folder's private headers. */
#include "cuda_jit.h"

#ifdef EMBER_HAVE_CUDA

#include <string.h>

#include "cuda_lib.h"

em_status cuda_device_info_get(int index, cuda_device_info *out) {
    if (!out) return em_error_null("cuda_device_info_get", "out");
    memset(out, 0, sizeof *out);
    cuda_device *d = cuda_device_get(index); /* loads the driver too */
    if (!d) return em_last_status();
    em_status s = cuda_check(cuda_driver()->DeviceGetName(out->name, sizeof out->name, d->dev),
                             "cuDeviceGetName");
    out->major = d->major, out->minor = d->minor;
    out->sm_count = d->sm_count;
    out->tf32 = cuda_tf32_enabled();
    return s;
}

em_status cuda_stream_sync(int index) {
    cuda_device *d = cuda_device_get(index);
    return d ? cuda_sync(d) : em_last_status();
}

em_status cuda_stream_copy(em_tensor *dst, const em_tensor *src) {
    if (!dst) return em_error_null("cuda_stream_copy", "dst");
    if (!src) return em_error_null("cuda_stream_copy", "src");
    if (dst->device.type != EM_CUDA || !em_same_device(dst->device, src->device))
        return em_error(EM_ERR_DEVICE, "cuda_stream_copy: dst and src must be on one CUDA device");
    if (dst->dtype != src->dtype || em_numel(dst) != em_numel(src))
        return em_error(EM_ERR_SHAPE, "cuda_stream_copy: dst and src differ in dtype or element count");
    if (!dst->storage || !src->storage || !em_is_contiguous(dst) || !em_is_contiguous(src))
        return em_error(EM_ERR_ARG, "cuda_stream_copy: dst and src must be contiguous and have storage");
    cuda_device *d = cuda_device_get(dst->device.index);
    if (!d) return em_last_status();
    size_t n = (size_t)em_numel(dst) * em_dtype_size(dst->dtype);
    return cuda_check(cuda_driver()->MemcpyDtoDAsync((CUdeviceptr)(uintptr_t)em_data(dst),
                                                     (CUdeviceptr)(uintptr_t)em_data(src), n, d->stream),
                      "cuMemcpyDtoDAsync");
}

struct cuda_timer {
    int index;
    CUevent start, stop;
    const em_allocator *alloc; /* the allocator that made this struct */
};

cuda_timer *cuda_timer_new(int index) {
    cuda_device *d = cuda_device_get(index); /* makes its context current: the events' */
    if (!d) return NULL;
    cuda_timer *t = em_calloc(1, sizeof *t);
    if (!t) return NULL;
    t->index = index;
    t->alloc = em_get_allocator();
    const cu_api *cu = cuda_driver();
    if (cuda_check(cu->EventCreate(&t->start, CU_EVENT_DEFAULT), "cuEventCreate") != EM_OK ||
        cuda_check(cu->EventCreate(&t->stop, CU_EVENT_DEFAULT), "cuEventCreate") != EM_OK) {
        cuda_timer_free(t);
        return NULL;
    }
    return t;
}

static em_status record(cuda_timer *t, CUevent e) {
    cuda_device *d = cuda_device_get(t->index); /* current on this thread */
    if (!d) return em_last_status();
    return cuda_check(cuda_driver()->EventRecord(e, d->stream), "cuEventRecord");
}

em_status cuda_timer_start(cuda_timer *t) {
    if (!t) return em_error_null("cuda_timer_start", "timer");
    return record(t, t->start);
}

em_status cuda_timer_stop(cuda_timer *t, double *seconds) {
    if (!t) return em_error_null("cuda_timer_stop", "timer");
    if (!seconds) return em_error_null("cuda_timer_stop", "seconds");
    const cu_api *cu = cuda_driver();
    float ms = 0;
    em_status s = record(t, t->stop);
    if (s == EM_OK) s = cuda_check(cu->EventSynchronize(t->stop), "cuEventSynchronize");
    if (s == EM_OK) s = cuda_check(cu->EventElapsedTime(&ms, t->start, t->stop), "cuEventElapsedTime");
    *seconds = s == EM_OK ? ms * 1e-3 : 0;
    return s;
}

void cuda_timer_free(cuda_timer *t) {
    if (!t) return;
    const cu_api *cu = cuda_driver(); /* loaded: the timer was made */
    if (t->start) cu->EventDestroy(t->start);
    if (t->stop) cu->EventDestroy(t->stop);
    em_free_with(t->alloc, t);
}

#endif /* EMBER_HAVE_CUDA */
