/* cuda_lib.c - dlopen of the CUDA libraries, per-device state and the
 * caching device allocator (see cuda_lib.h for why they are per process). */
#include "cuda_lib.h"

#ifdef EMBER_HAVE_CUDA

#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* A macro's expansion as a string: cuda.h maps cuMemAlloc to cuMemAlloc_v2
 * and so on, and the library exports the expanded names. */
#define SYM_(x) #x
#define SYM(x) SYM_(x)

typedef struct lib_state {
    pthread_once_t once;
    void *handle;
    bool ok;
    char why[256];
} lib_state;

/* The loaded library's table api, loading it (load) at the first call;
 * NULL with the reason as an EM_ERR_DEVICE error when it did not load. */
static const void *lib_ready(lib_state *st, void (*load)(void), const void *api) {
    pthread_once(&st->once, load);
    if (!st->ok) {
        em_error(EM_ERR_DEVICE, "%s", st->why);
        return NULL;
    }
    return api;
}

static bool load_sym(void *h, const char *name, void **slot, char *why, size_t n) {
    *slot = dlsym(h, name);
    if (!*slot) snprintf(why, n, "symbol %s missing", name);
    return *slot != NULL;
}

/* Opens soname (or, for sonames that also exist unversioned, name) and
 * reports why not. */
static void *open_lib(const char *soname, const char *what, char *why, size_t n) {
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, n, "%s: %s not found (%s)", what, soname, e ? e : "dlopen failed");
    }
    return h;
}

/* ---- driver ---- */
static cu_api cu;
static lib_state cu_state = {.once = PTHREAD_ONCE_INIT};

/* The optional entry points: an older driver without one has no graphs
 * (cu.graphs false), never a failure to load. */
static void load_graph_syms(void *h) {
    char why[128];
#define O(field, fn) load_sym(h, SYM(fn), (void **)&cu.field, why, sizeof why)
    O(MemGetInfo, cuMemGetInfo);
    bool ok = O(StreamBeginCapture, cuStreamBeginCapture);
    ok = O(StreamEndCapture, cuStreamEndCapture) && ok;
    ok = O(ThreadExchangeStreamCaptureMode, cuThreadExchangeStreamCaptureMode) && ok;
    ok = O(GraphInstantiate, cuGraphInstantiate) && ok;
    ok = O(GraphLaunch, cuGraphLaunch) && ok;
    ok = O(GraphExecDestroy, cuGraphExecDestroy) && ok;
    ok = O(GraphDestroy, cuGraphDestroy) && ok;
    O(LaunchKernelEx, cuLaunchKernelEx);
    O(OccupancyMaxActiveClusters, cuOccupancyMaxActiveClusters);
#undef O
    cu.graphs = ok;
}

static void load_driver(void) {
    lib_state *st = &cu_state;
    st->handle = open_lib("libcuda.so.1", "no CUDA driver", st->why, sizeof st->why);
    if (!st->handle) return;
    void *h = st->handle;
    char *w = st->why;
    size_t n = sizeof st->why;
#define L(field, fn) load_sym(h, SYM(fn), (void **)&cu.field, w, n)
    bool ok = L(Init, cuInit) && L(DriverGetVersion, cuDriverGetVersion) &&
              L(DeviceGetCount, cuDeviceGetCount) && L(DeviceGet, cuDeviceGet) &&
              L(DeviceGetAttribute, cuDeviceGetAttribute) && L(DeviceGetName, cuDeviceGetName) &&
              L(DevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain) &&
              L(CtxSetCurrent, cuCtxSetCurrent) && L(StreamCreate, cuStreamCreate) &&
              L(StreamSynchronize, cuStreamSynchronize) && L(MemAlloc, cuMemAlloc) &&
              L(MemFree, cuMemFree) && L(MemcpyHtoDAsync, cuMemcpyHtoDAsync) &&
              L(MemcpyDtoHAsync, cuMemcpyDtoHAsync) && L(MemcpyDtoDAsync, cuMemcpyDtoDAsync) &&
              L(ModuleLoadData, cuModuleLoadData) && L(ModuleGetFunction, cuModuleGetFunction) &&
              L(ModuleGetGlobal, cuModuleGetGlobal) &&
              L(ModuleUnload, cuModuleUnload) && L(LaunchKernel, cuLaunchKernel) &&
              L(FuncSetAttribute, cuFuncSetAttribute) &&
              L(GetErrorString, cuGetErrorString) && L(EventCreate, cuEventCreate) &&
              L(EventRecord, cuEventRecord) && L(EventSynchronize, cuEventSynchronize) &&
              L(EventElapsedTime, cuEventElapsedTime) && L(EventDestroy, cuEventDestroy);
#undef L
    if (!ok) return;
    load_graph_syms(h);
    CUresult r = cu.Init(0);
    if (r != CUDA_SUCCESS) {
        const char *msg = NULL;
        cu.GetErrorString(r, &msg);
        snprintf(w, n, "the CUDA driver failed to initialize: %s (error %d)", msg ? msg : "?",
                 (int)r);
        return;
    }
    st->ok = true;
}

const cu_api *cuda_driver(void) { return lib_ready(&cu_state, load_driver, &cu); }

/* ---- NVRTC ---- */
static nvrtc_api nv;
static lib_state nv_state = {.once = PTHREAD_ONCE_INIT};

static void load_nvrtc(void) {
    lib_state *st = &nv_state;
    st->handle = open_lib("libnvrtc.so.13", "no NVRTC", st->why, sizeof st->why);
    if (!st->handle) return;
    void *h = st->handle;
    char *w = st->why;
    size_t n = sizeof st->why;
#define L(field, fn) load_sym(h, SYM(fn), (void **)&nv.field, w, n)
    st->ok = L(Version, nvrtcVersion) && L(GetErrorString, nvrtcGetErrorString) &&
             L(CreateProgram, nvrtcCreateProgram) && L(CompileProgram, nvrtcCompileProgram) &&
             L(DestroyProgram, nvrtcDestroyProgram) &&
             L(GetProgramLogSize, nvrtcGetProgramLogSize) &&
             L(GetProgramLog, nvrtcGetProgramLog) && L(GetPTXSize, nvrtcGetPTXSize) &&
             L(GetPTX, nvrtcGetPTX) && L(GetCUBINSize, nvrtcGetCUBINSize) &&
             L(GetCUBIN, nvrtcGetCUBIN);
#undef L
}

const nvrtc_api *cuda_nvrtc(void) { return lib_ready(&nv_state, load_nvrtc, &nv); }

/* ---- cuBLAS ---- */
static cublas_api bl;
static lib_state bl_state = {.once = PTHREAD_ONCE_INIT};

static void load_cublas(void) {
    lib_state *st = &bl_state;
    st->handle = open_lib("libcublas.so.13", "no cuBLAS", st->why, sizeof st->why);
    if (!st->handle) return;
    void *h = st->handle;
    char *w = st->why;
    size_t n = sizeof st->why;
#define L(field, fn) load_sym(h, SYM(fn), (void **)&bl.field, w, n)
    st->ok = L(Create, cublasCreate) && L(Destroy, cublasDestroy) &&
             L(SetStream, cublasSetStream) && L(SetMathMode, cublasSetMathMode) &&
             L(Sgemm, cublasSgemm) && L(Dgemm, cublasDgemm) &&
             L(SgemmStridedBatched, cublasSgemmStridedBatched) &&
             L(DgemmStridedBatched, cublasDgemmStridedBatched) && L(GemmEx, cublasGemmEx) &&
             L(GemmStridedBatchedEx, cublasGemmStridedBatchedEx);
#undef L
    char why[128]; /* optional: without it, matmuls refuse to be captured */
    load_sym(h, SYM(cublasSetWorkspace), (void **)&bl.SetWorkspace, why, sizeof why);
}

const cublas_api *cuda_cublas(void) { return lib_ready(&bl_state, load_cublas, &bl); }

/* ---- cuBLASLt ---- */
static cublaslt_api lt;
static lib_state lt_state = {.once = PTHREAD_ONCE_INIT};

static void load_cublaslt(void) {
    lib_state *st = &lt_state;
    st->handle = open_lib("libcublasLt.so.13", "no cuBLASLt", st->why, sizeof st->why);
    if (!st->handle) return;
    void *h = st->handle;
    char *w = st->why;
    size_t n = sizeof st->why;
#define L(field, fn) load_sym(h, SYM(fn), (void **)&lt.field, w, n)
    st->ok = L(Create, cublasLtCreate) && L(GetStatusName, cublasLtGetStatusName) &&
             L(Matmul, cublasLtMatmul) && L(MatmulDescCreate, cublasLtMatmulDescCreate) &&
             L(MatmulDescDestroy, cublasLtMatmulDescDestroy) &&
             L(MatmulDescSetAttribute, cublasLtMatmulDescSetAttribute) &&
             L(MatrixLayoutCreate, cublasLtMatrixLayoutCreate) &&
             L(MatrixLayoutDestroy, cublasLtMatrixLayoutDestroy) &&
             L(MatrixLayoutSetAttribute, cublasLtMatrixLayoutSetAttribute) &&
             L(MatmulPreferenceCreate, cublasLtMatmulPreferenceCreate) &&
             L(MatmulPreferenceDestroy, cublasLtMatmulPreferenceDestroy) &&
             L(MatmulPreferenceSetAttribute, cublasLtMatmulPreferenceSetAttribute) &&
             L(MatmulAlgoGetHeuristic, cublasLtMatmulAlgoGetHeuristic);
#undef L
}

const cublaslt_api *cuda_cublaslt(void) { return lib_ready(&lt_state, load_cublaslt, &lt); }

em_status cuda_check(CUresult r, const char *what) {
    if (r == CUDA_SUCCESS) return EM_OK;
    const char *msg = NULL;
    if (cu_state.ok) cu.GetErrorString(r, &msg);
    return em_error(r == CUDA_ERROR_OUT_OF_MEMORY ? EM_ERR_NOMEM : EM_ERR_DEVICE,
                    "%s: CUDA error %d (%s)", what, (int)r, msg ? msg : "unknown");
}

/* EMBER_CUDA_PDL: 0 turns programmatic dependent launch off (on by
 * default where the device and driver have it). */
static bool pdl_wanted(void) {
    char buf[32];
    const char *e = em_getenv("EMBER_CUDA_PDL", buf, sizeof buf);
    return !e || strcmp(e, "0") != 0;
}

em_status cuda_launch_fn(const cuda_device *d, CUfunction fn, unsigned grid, unsigned block, unsigned smem,
                      void **args) {
    if (!d->pdl)
        return cuda_check(cu.LaunchKernel(fn, grid, 1, 1, block, 1, 1, smem, cuda_stream(d), args, NULL),
                          "cuLaunchKernel");
    CUlaunchAttribute attr = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION};
    attr.value.programmaticStreamSerializationAllowed = 1;
    CUlaunchConfig cfg = {.gridDimX = grid, .gridDimY = 1, .gridDimZ = 1, .blockDimX = block,
                          .blockDimY = 1, .blockDimZ = 1, .sharedMemBytes = smem,
                          .hStream = cuda_stream(d), .attrs = &attr, .numAttrs = 1};
    return cuda_check(cu.LaunchKernelEx(&cfg, fn, args, NULL), "cuLaunchKernelEx");
}

em_status cuda_launch_cluster(const cuda_device *d, CUfunction fn, unsigned grid, unsigned block,
                              unsigned cluster, void **args) {
    if (cluster <= 1) return cuda_launch_fn(d, fn, grid, block, 0, args);
    if (!cu.LaunchKernelEx || d->major < 9 || grid % cluster != 0)
        return em_error(EM_ERR_DEVICE, "cuda: a kernel of clusters of %u blocks (sm_90 and up, "
                        "cuLaunchKernelEx) cannot launch %u blocks on this device", cluster, grid);
    CUlaunchAttribute attr[2] = {{.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION}};
    attr[0].value.clusterDim.x = cluster;
    attr[0].value.clusterDim.y = attr[0].value.clusterDim.z = 1;
    unsigned n = 1;
    if (d->pdl) {
        attr[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr[n++].value.programmaticStreamSerializationAllowed = 1;
    }
    CUlaunchConfig cfg = {.gridDimX = grid, .gridDimY = 1, .gridDimZ = 1, .blockDimX = block,
                          .blockDimY = 1, .blockDimZ = 1, .hStream = cuda_stream(d), .attrs = attr,
                          .numAttrs = n};
    return cuda_check(cu.LaunchKernelEx(&cfg, fn, args, NULL), "cuLaunchKernelEx (cluster)");
}

bool cuda_tf32_enabled(void) {
    char buf[32];
    const char *e = em_getenv("EMBER_CUDA_TF32", buf, sizeof buf);
    return e && *e && strcmp(e, "0") != 0;
}

cublasMath_t cuda_blas_math(bool tf32) {
    return (cublasMath_t)((tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH) |
                          CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION);
}

/* ---- devices ---- */
#define MAX_DEVICES 64

static pthread_mutex_t devices_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(cuda_device *) devices[MAX_DEVICES];
static pthread_once_t count_once = PTHREAD_ONCE_INIT;
static int ndevices = -1; /* devices do not come and go while a process runs */
static char count_why[256];
/* The context last made current on this thread: skips a driver call per op. */
static _Thread_local CUcontext current_ctx;

static void read_count(void) {
    int n = 0;
    CUresult r = cu.DeviceGetCount(&n);
    if (r == CUDA_SUCCESS) ndevices = n < MAX_DEVICES ? n : MAX_DEVICES;
    else snprintf(count_why, sizeof count_why, "cuDeviceGetCount failed (CUDA error %d)", (int)r);
}

int cuda_device_count(void) {
    if (!cuda_driver()) return -1;
    pthread_once(&count_once, read_count);
    if (ndevices < 0) em_error(EM_ERR_DEVICE, "%s", count_why);
    return ndevices;
}

static cuda_device *make_current(cuda_device *d) {
    if (current_ctx == d->ctx) return d;
    if (cuda_check(cu.CtxSetCurrent(d->ctx), "cuCtxSetCurrent") != EM_OK) return NULL;
    current_ctx = d->ctx;
    return d;
}

static const unsigned sems_zero[CUDA_NSEMS]; /* never written */

static em_status device_init(cuda_device *d, int index) {
    const cu_api *c = &cu;
    em_status s = cuda_check(c->DeviceGet(&d->dev, index), "cuDeviceGet");
    if (s == EM_OK) s = cuda_check(c->DevicePrimaryCtxRetain(&d->ctx, d->dev), "cuDevicePrimaryCtxRetain");
    if (s == EM_OK) s = cuda_check(c->CtxSetCurrent(d->ctx), "cuCtxSetCurrent");
    if (s == EM_OK) current_ctx = d->ctx;
    if (s == EM_OK) s = cuda_check(c->StreamCreate(&d->stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    if (s == EM_OK)
        s = cuda_check(c->DeviceGetAttribute(&d->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d->dev),
                       "cuDeviceGetAttribute");
    if (s == EM_OK)
        s = cuda_check(c->DeviceGetAttribute(&d->major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d->dev),
                       "cuDeviceGetAttribute");
    if (s == EM_OK)
        s = cuda_check(c->DeviceGetAttribute(&d->minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d->dev),
                       "cuDeviceGetAttribute");
    if (s == EM_OK) s = cuda_check(c->MemAlloc(&d->sems, sizeof sems_zero), "cuMemAlloc");
    if (s == EM_OK)
        s = cuda_check(c->MemcpyHtoDAsync(d->sems, sems_zero, sizeof sems_zero, d->stream), "cuMemcpyHtoDAsync");
    d->pdl = s == EM_OK && d->major >= 9 && c->LaunchKernelEx && pdl_wanted();
    d->index = index;
    pthread_mutex_init(&d->lock, NULL);
    pthread_mutex_init(&d->kerror_lock, NULL);
    pthread_mutex_init(&d->capture_lock, NULL);
    pthread_mutex_init(&d->lt_lock, NULL);
    return s;
}

int cuda_device_arch(int index) {
    cuda_device *d = index >= 0 && index < MAX_DEVICES
                         ? atomic_load_explicit(&devices[index], memory_order_acquire) : NULL;
    if (d) return d->major * 10 + d->minor;
    int n = cuda_device_count();
    if (n < 0) return -1;
    if (index < 0 || index >= n) {
        em_error(EM_ERR_DEVICE, "cuda:%d: no such device (%d CUDA device%s)", index, n, n == 1 ? "" : "s");
        return -1;
    }
    CUdevice dev;
    int major = 0, minor = 0;
    if (cuda_check(cu.DeviceGet(&dev, index), "cuDeviceGet") != EM_OK ||
        cuda_check(cu.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
                   "cuDeviceGetAttribute") != EM_OK ||
        cuda_check(cu.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
                   "cuDeviceGetAttribute") != EM_OK)
        return -1;
    return major * 10 + minor;
}

cuda_device *cuda_device_get(int index) {
    if (index >= 0 && index < MAX_DEVICES) { /* fast path: already set up */
        cuda_device *d = atomic_load_explicit(&devices[index], memory_order_acquire);
        if (d) return make_current(d);
    }
    int n = cuda_device_count();
    if (n < 0) return NULL;
    if (index < 0 || index >= n) {
        em_error(EM_ERR_DEVICE, "cuda:%d: no such device (%d CUDA device%s)", index, n,
                 n == 1 ? "" : "s");
        return NULL;
    }
    pthread_mutex_lock(&devices_lock);
    cuda_device *d = atomic_load(&devices[index]);
    if (!d) {
        /* calloc, not em_malloc: the device outlives every per-thread
         * allocator (it lives until the process exits) */
        d = calloc(1, sizeof *d);
        if (!d) em_error(EM_ERR_NOMEM, "cuda:%d: out of host memory", index);
        else if (device_init(d, index) != EM_OK) {
            free(d);
            d = NULL;
        } else
            atomic_store_explicit(&devices[index], d, memory_order_release);
    }
    pthread_mutex_unlock(&devices_lock);
    return d ? make_current(d) : NULL;
}

/* ---- errors found by kernels (cuda_lib.h) ---- */

static const unsigned long long kerror_zero[4]; /* never written: a pageable source is safe */

/* The words, allocated and zeroed (d->kerror_lock held).  Process-long,
 * like the loaded modules: never freed. */
static em_status kerror_alloc(cuda_device *d) {
    CUdeviceptr p = 0;
    em_status s = cuda_check(cu.MemAlloc(&p, sizeof kerror_zero), "cuMemAlloc");
    if (s == EM_OK)
        s = cuda_check(cu.MemcpyHtoDAsync(p, kerror_zero, sizeof kerror_zero, d->stream), "cuMemcpyHtoDAsync");
    if (s == EM_OK) d->kerror = p;
    else if (p) cu.MemFree(p);
    return s;
}

em_status cuda_kerror_launch(cuda_device *d, cuda_kerror_fn launch, void *ctx) {
    pthread_mutex_lock(&d->kerror_lock);
    em_status s = d->kerror ? EM_OK : kerror_alloc(d);
    if (s == EM_OK) s = launch(ctx, d->kerror);
    if (s == EM_OK) d->kerror_armed = true;
    cuda_capture *c = cuda_capturing(d);
    if (s == EM_OK && c) c->kerror = true; /* each replay arms them again */
    pthread_mutex_unlock(&d->kerror_lock);
    return s;
}

/* The error kernels recorded since the last read, then the words cleared
 * (d->kerror_lock held; the stream has just been waited for). */
static em_status read_kerror_locked(cuda_device *d) {
    unsigned long long h[4];
    CUdeviceptr w = d->kerror;
    d->kerror_armed = false;
    em_status s = cuda_check(cu.MemcpyDtoHAsync(h, w, sizeof h, d->stream), "cuMemcpyDtoHAsync");
    if (s == EM_OK) s = cuda_check(cu.StreamSynchronize(d->stream), "cuStreamSynchronize");
    if (s != EM_OK || h[0] == 0) return s;
    s = cuda_check(cu.MemcpyHtoDAsync(w, kerror_zero, sizeof kerror_zero, d->stream), "cuMemcpyHtoDAsync");
    if (s != EM_OK) return s;
    if (h[0] == CUDA_KERROR_INDEX)
        return em_error(EM_ERR_INDEX,
                        "index_select: index %lld is out of range for dim %lld of size %lld (found on "
                        "cuda:%d by a kernel queued before this synchronization; its result holds 0 there)",
                        (long long)h[1], (long long)h[3], (long long)h[2], d->index);
    return em_error(EM_ERR_STATE, "cuda:%d: a kernel reported error %llu", d->index, h[0]);
}

static em_status read_kerror(cuda_device *d) {
    pthread_mutex_lock(&d->kerror_lock);
    em_status s = d->kerror_armed ? read_kerror_locked(d) : EM_OK;
    pthread_mutex_unlock(&d->kerror_lock);
    return s;
}

em_status cuda_sync(cuda_device *d) {
    em_status s = cuda_check(cu.StreamSynchronize(d->stream), "cuStreamSynchronize");
    return s == EM_OK ? read_kerror(d) : s;
}

/* ---- graph capture (cuda_lib.h) ---- */

static _Thread_local cuda_capture *thread_capture;

cuda_capture *cuda_capturing(const cuda_device *d) {
    cuda_capture *c = thread_capture;
    return c && c->d == d ? c : NULL;
}

void cuda_capture_set(cuda_capture *c) { thread_capture = c; }

CUstream cuda_stream(const cuda_device *d) {
    cuda_capture *c = thread_capture;
    return c && c->d == d ? d->capture_stream : d->stream;
}

em_status cuda_capture_refuse(cuda_capture *c, const char *why) {
    if (!c->refused[0]) snprintf(c->refused, sizeof c->refused, "%s", why);
    return em_error(EM_ERR_UNSUPPORTED, "cuda:%d: not captured into a graph: %s", c->d->index, why);
}

/* Keeps block (p, size) in the pool's free list; false: no host memory. */
static bool pool_keep(cuda_pool *p, CUdeviceptr ptr, size_t size) {
    if (p->nfree == p->capfree) {
        int cap = p->capfree ? 2 * p->capfree : 32;
        cuda_free_block *f = realloc(p->free, sizeof *f * (size_t)cap);
        if (!f) return false;
        p->free = f;
        p->capfree = cap;
    }
    p->free[p->nfree++] = (cuda_free_block){ptr, size};
    return true;
}

/* A block of bucket size from the pool's free list, or 0. */
static CUdeviceptr pool_take(cuda_pool *p, size_t size) {
    for (int i = p->nfree - 1; i >= 0; i--) {
        if (p->free[i].size != size) continue;
        CUdeviceptr ptr = p->free[i].ptr;
        p->free[i] = p->free[--p->nfree];
        return ptr;
    }
    return 0;
}

static bool cache_block(cuda_device *d, CUdeviceptr p, size_t size);

void cuda_pool_release(cuda_device *d, cuda_pool *p) {
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < p->nfree; i++)
        if (!cache_block(d, p->free[i].ptr, p->free[i].size)) {
            pthread_mutex_unlock(&d->lock);
            if (make_current(d)) cu.MemFree(p->free[i].ptr);
            pthread_mutex_lock(&d->lock);
        }
    pthread_mutex_unlock(&d->lock);
    free(p->free);
    *p = (cuda_pool){0};
}

void cuda_mem_usage(cuda_device *d, size_t *live, size_t *cached) {
    pthread_mutex_lock(&d->lock);
    *live = d->live_bytes;
    *cached = d->cached_bytes;
    pthread_mutex_unlock(&d->lock);
}

/* ---- caching allocator ---- */

size_t cuda_mem_bucket(size_t n) {
    const size_t big = (size_t)64 << 20, step = (size_t)2 << 20;
    if (n <= 512) return 512;
    if (n > big) return (n + step - 1) / step * step;
    size_t b = 512;
    while (b < n) b <<= 1;
    return b;
}

static size_t live_slot(const cuda_device *d, CUdeviceptr p) {
    uint64_t h = (uint64_t)p * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (d->caplive - 1);
}

/* Records p -> size in the live table (growing it at half load). */
static bool live_put(cuda_device *d, CUdeviceptr p, size_t size) {
    if (2 * (d->nlive + 1) > d->caplive) {
        size_t cap = d->caplive ? 2 * d->caplive : 256;
        cuda_free_block *old = d->live;
        size_t oldcap = d->caplive;
        cuda_free_block *t = calloc(cap, sizeof *t);
        if (!t) return false;
        d->live = t;
        d->caplive = cap;
        for (size_t i = 0; i < oldcap; i++) {
            if (!old[i].ptr) continue;
            size_t j = live_slot(d, old[i].ptr);
            while (t[j].ptr) j = (j + 1) & (cap - 1);
            t[j] = old[i];
        }
        free(old);
    }
    size_t j = live_slot(d, p);
    while (d->live[j].ptr) j = (j + 1) & (d->caplive - 1);
    d->live[j] = (cuda_free_block){p, size};
    d->nlive++;
    d->live_bytes += size;
    return true;
}

/* Removes p from the live table; its bucket size, or 0 if unknown. */
static size_t live_take(cuda_device *d, CUdeviceptr p) {
    if (!d->caplive) return 0;
    size_t j = live_slot(d, p);
    while (d->live[j].ptr && d->live[j].ptr != p) j = (j + 1) & (d->caplive - 1);
    if (!d->live[j].ptr) return 0;
    size_t size = d->live[j].size;
    /* backward-shift deletion keeps every probe chain unbroken */
    size_t i = j;
    for (;;) {
        d->live[i] = (cuda_free_block){0, 0};
        size_t k = i;
        for (;;) {
            k = (k + 1) & (d->caplive - 1);
            if (!d->live[k].ptr) {
                d->nlive--;
                d->live_bytes -= size;
                return size;
            }
            size_t home = live_slot(d, d->live[k].ptr);
            bool between = i <= k ? (i < home && home <= k) : (i < home || home <= k);
            if (!between) break;
        }
        d->live[i] = d->live[k];
        i = k;
    }
}

void cuda_mem_trim(cuda_device *d) {
    if (!make_current(d)) return;
    pthread_mutex_lock(&d->lock);
    for (int i = 0; i < d->nfree; i++) cu.MemFree(d->free[i].ptr);
    d->nfree = 0;
    d->cached_bytes = 0;
    pthread_mutex_unlock(&d->lock);
}

/* A block of bucket size from d's free list, or 0. */
static CUdeviceptr cached_take(cuda_device *d, size_t size) {
    CUdeviceptr p = 0;
    pthread_mutex_lock(&d->lock);
    for (int i = d->nfree - 1; i >= 0; i--) {
        if (d->free[i].size != size) continue;
        p = d->free[i].ptr;
        d->free[i] = d->free[--d->nfree];
        d->cached_bytes -= size;
        break;
    }
    pthread_mutex_unlock(&d->lock);
    return p;
}

/* cuMemAlloc, giving the cache back and retrying when the device is full.
 * Inside a capture the thread's capture mode is relaxed around it: the
 * allocation is no stream operation (the graph does not replay it, the
 * pool keeps the block for the graph's lifetime), and the capture's
 * thread-local mode would refuse it as potentially unsafe. */
static CUresult driver_alloc(cuda_device *d, CUdeviceptr *p, size_t size) {
    bool relax = cuda_capturing(d) != NULL;
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (relax) cu.ThreadExchangeStreamCaptureMode(&mode);
    CUresult r = cu.MemAlloc(p, size);
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
        cuda_mem_trim(d);
        r = cu.MemAlloc(p, size);
    }
    if (relax) cu.ThreadExchangeStreamCaptureMode(&mode);
    return r;
}

em_status cuda_mem_alloc(cuda_device *d, size_t nbytes, void **ptr) {
    *ptr = NULL;
    if (nbytes == 0) return EM_OK; /* nothing to point at: kernels never touch it */
    size_t size = cuda_mem_bucket(nbytes);
    cuda_capture *c = cuda_capturing(d);
    CUdeviceptr p = c ? pool_take(&c->pool, size) : 0;
    bool from_pool = p != 0;
    if (!p) p = cached_take(d, size);
    em_status s = p ? EM_OK : cuda_check(driver_alloc(d, &p, size), "cuMemAlloc");
    if (s != EM_OK) return s;
    if (c && !from_pool) c->pool.bytes += size;
    pthread_mutex_lock(&d->lock);
    bool ok = live_put(d, p, size);
    pthread_mutex_unlock(&d->lock);
    if (!ok) {
        cu.MemFree(p);
        return em_error(EM_ERR_NOMEM, "cuda:%d: out of host memory", d->index);
    }
    *ptr = (void *)(uintptr_t)p;
    return EM_OK;
}

/* Puts block (p, size) on d's free list (d->lock held); false: no room. */
static bool cache_block(cuda_device *d, CUdeviceptr p, size_t size) {
    if (d->nfree == d->capfree) {
        int cap = d->capfree ? 2 * d->capfree : 64;
        cuda_free_block *f = realloc(d->free, sizeof *f * (size_t)cap);
        if (!f) return false;
        d->free = f;
        d->capfree = cap;
    }
    d->free[d->nfree++] = (cuda_free_block){p, size};
    d->cached_bytes += size;
    return true;
}

void cuda_mem_free(cuda_device *d, void *ptr) {
    if (!ptr) return;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
    cuda_capture *c = cuda_capturing(d);
    pthread_mutex_lock(&d->lock);
    size_t size = live_take(d, p);
    /* freed inside a capture: the graph's later nodes may reuse it, and
     * its replays write it, so it stays the capture's */
    bool kept = size && c && pool_keep(&c->pool, p, size);
    if (size && c && !kept) /* no host memory: the graph is not made, so the block is free */
        snprintf(c->refused, sizeof c->refused, "out of host memory for the capture's pool");
    bool cached = kept || (size && cache_block(d, p, size));
    pthread_mutex_unlock(&d->lock);
    if (!cached && make_current(d)) cu.MemFree(p);
}

#endif /* EMBER_HAVE_CUDA */
