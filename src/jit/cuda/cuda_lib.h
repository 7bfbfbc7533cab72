/* cuda_lib.h - the CUDA libraries, loaded at run time, and per-device state.
 *
 * Ember links no CUDA library: libcuda.so.1 (driver API), libnvrtc.so.13,
 * libcublas.so.13 and libcublasLt.so.13 (optional: linear layers' fused
 * epilogues) are opened with dlopen the first time something asks for
 * them, once per process (pthread_once), into function-pointer tables.
 * One build therefore runs on machines with and without a GPU; without a
 * driver, every entry point returns EM_ERR_DEVICE with a message such as
 * "no CUDA driver: libcuda.so.1 not found".
 *
 * Process-wide state, and why: the loaded tables (a library is loaded once
 * per process anyway) and, per device, the primary context, one stream, the
 * cuBLAS handle, the cuBLASLt handle, workspace and algorithm table, the
 * caching allocator's free lists and the loaded kernel modules, and for graph capture a capture stream, a cuBLAS handle with its
 * workspace on it and the lock that admits one capture at a time (a capture
 * in progress is the capturing thread's: one thread-local pointer).  These mirror what the driver itself keeps per process (the
 * primary context is per process and device), and device memory freed by
 * one tensor must be reusable by any other: a per-runtime copy would split
 * the cache and the context for no gain.  Every mutable part sits behind
 * the device's mutex.
 *
 * Only built when configure found the CUDA headers (EMBER_HAVE_CUDA). */
#ifndef EMBER_CUDA_LIB_H
#define EMBER_CUDA_LIB_H

#include "config.h"
#ifdef EMBER_HAVE_CUDA

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda.h>
#include <nvrtc.h>
#include <pthread.h>

#include "eager.h"

/* ---- the driver (libcuda.so.1) ---- */
typedef struct cu_api {
    __typeof__(&cuInit) Init;
    __typeof__(&cuDriverGetVersion) DriverGetVersion;
    __typeof__(&cuDeviceGetCount) DeviceGetCount;
    __typeof__(&cuDeviceGet) DeviceGet;
    __typeof__(&cuDeviceGetAttribute) DeviceGetAttribute;
    __typeof__(&cuDeviceGetName) DeviceGetName;
    __typeof__(&cuDevicePrimaryCtxRetain) DevicePrimaryCtxRetain;
    __typeof__(&cuCtxSetCurrent) CtxSetCurrent;
    __typeof__(&cuStreamCreate) StreamCreate;
    __typeof__(&cuStreamSynchronize) StreamSynchronize;
    __typeof__(&cuMemAlloc) MemAlloc;
    __typeof__(&cuMemFree) MemFree;
    __typeof__(&cuMemcpyHtoDAsync) MemcpyHtoDAsync;
    __typeof__(&cuMemcpyDtoHAsync) MemcpyDtoHAsync;
    __typeof__(&cuMemcpyDtoDAsync) MemcpyDtoDAsync;
    __typeof__(&cuModuleLoadData) ModuleLoadData;
    __typeof__(&cuModuleGetFunction) ModuleGetFunction;
    __typeof__(&cuModuleGetGlobal) ModuleGetGlobal;
    __typeof__(&cuModuleUnload) ModuleUnload;
    __typeof__(&cuLaunchKernel) LaunchKernel;
    __typeof__(&cuFuncSetAttribute) FuncSetAttribute;
    __typeof__(&cuGetErrorString) GetErrorString;
    __typeof__(&cuEventCreate) EventCreate;
    __typeof__(&cuEventRecord) EventRecord;
    __typeof__(&cuEventSynchronize) EventSynchronize;
    __typeof__(&cuEventElapsedTime) EventElapsedTime;
    __typeof__(&cuEventDestroy) EventDestroy;
    __typeof__(&cuMemGetInfo) MemGetInfo;
    /* Graphs (stream capture and replay: cuda_graph.c).  Optional: a
     * driver without them loads, and `graphs` is false ("no graphs"). */
    bool graphs;
    __typeof__(&cuStreamBeginCapture) StreamBeginCapture;
    __typeof__(&cuStreamEndCapture) StreamEndCapture;
    __typeof__(&cuThreadExchangeStreamCaptureMode) ThreadExchangeStreamCaptureMode;
    __typeof__(&cuGraphInstantiate) GraphInstantiate; /* cuGraphInstantiateWithFlags */
    __typeof__(&cuGraphLaunch) GraphLaunch;
    __typeof__(&cuGraphExecDestroy) GraphExecDestroy;
    __typeof__(&cuGraphDestroy) GraphDestroy;
    /* Optional (NULL: plain launches): launches with attributes, for
     * programmatic dependent launch (cuda_launch_fn). */
    __typeof__(&cuLaunchKernelEx) LaunchKernelEx;
    /* Optional (NULL: a guess from 2048 threads an SM): how many clusters
     * of a function run at once (cuda_kernel.c launches one wave of them). */
    __typeof__(&cuOccupancyMaxActiveClusters) OccupancyMaxActiveClusters;
} cu_api;

/* ---- NVRTC (libnvrtc.so.13) ---- */
typedef struct nvrtc_api {
    __typeof__(&nvrtcVersion) Version;
    __typeof__(&nvrtcGetErrorString) GetErrorString;
    __typeof__(&nvrtcCreateProgram) CreateProgram;
    __typeof__(&nvrtcCompileProgram) CompileProgram;
    __typeof__(&nvrtcDestroyProgram) DestroyProgram;
    __typeof__(&nvrtcGetProgramLogSize) GetProgramLogSize;
    __typeof__(&nvrtcGetProgramLog) GetProgramLog;
    __typeof__(&nvrtcGetPTXSize) GetPTXSize;
    __typeof__(&nvrtcGetPTX) GetPTX;
    __typeof__(&nvrtcGetCUBINSize) GetCUBINSize;
    __typeof__(&nvrtcGetCUBIN) GetCUBIN;
} nvrtc_api;

/* ---- cuBLAS (libcublas.so.13, which loads libcublasLt.so.13) ---- */
typedef struct cublas_api {
    __typeof__(&cublasCreate) Create;
    __typeof__(&cublasDestroy) Destroy;
    __typeof__(&cublasSetStream) SetStream;
    __typeof__(&cublasSetMathMode) SetMathMode;
    __typeof__(&cublasSgemm) Sgemm;
    __typeof__(&cublasDgemm) Dgemm;
    __typeof__(&cublasSgemmStridedBatched) SgemmStridedBatched;
    __typeof__(&cublasDgemmStridedBatched) DgemmStridedBatched;
    __typeof__(&cublasGemmEx) GemmEx;                             /* f16, bf16 */
    __typeof__(&cublasGemmStridedBatchedEx) GemmStridedBatchedEx;
    /* Optional (NULL: matmuls are not captured into graphs): a workspace
     * of the caller's, which a captured gemm needs (cuda_graph.c). */
    __typeof__(&cublasSetWorkspace) SetWorkspace;
} cublas_api;

/* ---- cuBLASLt (libcublasLt.so.13): matmuls with a fused bias and
 * activation (cuda_matmul.c's linear path; absent: the unfused one) ---- */
typedef struct cublaslt_api {
    __typeof__(&cublasLtCreate) Create;
    __typeof__(&cublasLtGetStatusName) GetStatusName;
    __typeof__(&cublasLtMatmul) Matmul;
    __typeof__(&cublasLtMatmulDescCreate) MatmulDescCreate;
    __typeof__(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
    __typeof__(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
    __typeof__(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
    __typeof__(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
    __typeof__(&cublasLtMatrixLayoutSetAttribute) MatrixLayoutSetAttribute;
    __typeof__(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
    __typeof__(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
    __typeof__(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
    __typeof__(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
} cublaslt_api;

/* Each returns the loaded table, or NULL with an EM_ERR_DEVICE error that
 * says which library is missing (or which symbol it lacks). */
const cu_api *cuda_driver(void);
const nvrtc_api *cuda_nvrtc(void);
const cublas_api *cuda_cublas(void);
const cublaslt_api *cuda_cublaslt(void);

/* Records a driver failure "what: CUDA_ERROR_... (text)" and returns
 * EM_ERR_DEVICE (EM_ERR_NOMEM for out-of-memory). */
em_status cuda_check(CUresult r, const char *what);

/* ---- devices ---- */
typedef struct cuda_kernel_entry cuda_kernel_entry;

typedef struct cuda_free_block {
    CUdeviceptr ptr;
    size_t size; /* the bucket size it was allocated with */
} cuda_free_block;

/* Blocks a graph capture took (cuda_graph.c): the ones it freed again are
 * kept here, for the capture's later allocations and then for the graph's
 * lifetime (its replays write them), never in the device's free lists. */
typedef struct cuda_pool {
    cuda_free_block *free;
    int nfree, capfree;
    size_t bytes;            /* every block the capture allocated, live or in free */
} cuda_pool;

typedef struct cuda_device {
    int index;
    CUdevice dev;
    CUcontext ctx;           /* the primary context (retained once) */
    CUstream stream;         /* every op of this device runs on it, in order */
    int sm_count;            /* multiprocessors: grids are sized from it */
    int major, minor;        /* compute capability: the NVRTC target */
    pthread_mutex_t lock;    /* guards everything below */
    cuda_free_block *free;   /* the caching allocator's free blocks */
    int nfree, capfree;
    size_t cached_bytes;     /* bytes held in free */
    cuda_free_block *live;   /* open-addressed table: live block -> bucket size */
    size_t caplive, nlive;
    cublasHandle_t blas;     /* created on first matmul */
    bool blas_tf32;          /* the math mode set on blas */
    cuda_kernel_entry *kernels; /* loaded modules by kernel key (cuda_kernel.c) */
    int nkernels, capkernels;
    int *kindex;             /* open-addressed index into kernels (-1: empty) */
    int capindex;
    pthread_mutex_t kerror_lock; /* guards the two below; see cuda_kerror_launch */
    CUdeviceptr kerror;      /* the kernel-error words (below), or 0 before the first use */
    bool kerror_armed;       /* a kernel that may set them ran since they were last read */
    size_t live_bytes;       /* bytes of the live blocks (under lock; tests read it) */
    /* graph capture (cuda_graph.c): one capture at a time per device */
    pthread_mutex_t capture_lock; /* held from capture begin to end */
    CUstream capture_stream; /* what the capturing thread's ops go to (created at the first) */
    cublasHandle_t blas_capture; /* the capturing thread's cuBLAS handle, on capture_stream,
                                    with workspace */
    CUdeviceptr blas_workspace;
    bool blas_capture_tf32;
    /* cuBLASLt (cuda_matmul.c), all under lt_lock: the handle and the
     * workspace (created at the first linear it runs, process-long as the
     * cuBLAS handle), the heuristic's answers by problem (a bounded
     * table), whether the log was told that cuBLASLt is missing, and
     * how many linears it ran (tests read it) */
    pthread_mutex_t lt_lock;
    cublasLtHandle_t lt;
    CUdeviceptr lt_workspace;
    struct cuda_lt_algos *lt_algos;
    bool lt_said;
    int64_t lt_calls;
    /* CUDA_NSEMS arrival counters, zero between kernels: a kernel split
     * into groups of blocks counts each group's arrivals here, and the
     * group's last block finishes the work (adds the partials) and sets
     * its counter back to 0.  Kernels run one at a time in stream order
     * (d->stream; a capture only records; with pdl, a kernel starts early
     * but waits for the one before it), so one array serves all. */
    CUdeviceptr sems;
    /* Programmatic dependent launch (compute capability 9.0 and up, a
     * driver with cuLaunchKernelEx, EMBER_CUDA_PDL not 0): each kernel
     * is launched to start while the one before it finishes, and waits
     * for it (EM_AFTER_PRIOR, cuda_emit.h) before touching memory. */
    bool pdl;
} cuda_device;

enum { CUDA_NSEMS = 4096 };

/* Launches fn on d's stream (the capturing thread's capture stream while
 * it captures): grid x block threads, smem bytes of dynamic shared
 * memory, with programmatic dependent launch where d->pdl.  fn must be a
 * kernel of cuda_text_with_key's texts, which all begin by waiting for
 * the kernel before them (EM_AFTER_PRIOR): a kernel that did not would
 * run beside its predecessor. */
em_status cuda_launch_fn(const cuda_device *d, CUfunction fn, unsigned grid, unsigned block, unsigned smem,
                         void **args);
/* cuda_launch_fn for a kernel of thread-block clusters of `cluster`
 * blocks along x (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION; grid a multiple
 * of it), with programmatic dependent launch where d->pdl; cluster <= 1
 * is cuda_launch_fn.  EM_ERR_DEVICE below sm_90 or without
 * cuLaunchKernelEx. */
em_status cuda_launch_cluster(const cuda_device *d, CUfunction fn, unsigned grid, unsigned block,
                              unsigned cluster, void **args);

/* Number of devices, or -1 (error set) without a driver. */
int cuda_device_count(void);
/* Device index, initialized on first use (context, stream, attributes) and
 * made current on the calling thread; NULL with an error for a bad index
 * or a missing driver. */
cuda_device *cuda_device_get(int index);
/* cuda:index's compute capability as major * 10 + minor, without setting
 * the device up (no context: ember-cache reads it for bundle tags, and a
 * context costs ~100 MB); -1 with the error set. */
int cuda_device_arch(int index);

/* ---- the caching allocator ----
 * Sizes are rounded up to a bucket (powers of two up to 64 MiB, then
 * multiples of 2 MiB); a freed block goes on its device's free list and
 * the next request of the same bucket takes it without a driver call.
 * Every kernel runs on the device's one stream, so a block reused in
 * stream order is never touched by an earlier kernel still running.
 * When cuMemAlloc fails, the cached blocks are released and it retries. */
em_status cuda_mem_alloc(cuda_device *d, size_t nbytes, void **ptr);
void cuda_mem_free(cuda_device *d, void *ptr);
/* Returns every cached block to the driver. */
void cuda_mem_trim(cuda_device *d);
size_t cuda_mem_bucket(size_t nbytes);

/* Waits for the device's stream (before the host reads results), then
 * reports what kernels recorded in the kernel-error words, if any armed
 * them since the last sync (the error is then cleared: the next sync is
 * clean). */
em_status cuda_sync(cuda_device *d);

/* ---- errors found by kernels, reported without a wait per launch ----
 * Four 64-bit words of device memory per device: [0] the error's kind (0:
 * none), [1..3] its values; a kernel that finds an error sets them with an
 * atomicCAS on word 0, so the first error of the stream is kept.  The next
 * cuda_sync reads them and returns the error:
 *  CUDA_KERROR_INDEX: an index out of range ([1] the index, [2] the dim's
 *  size, [3] the dim), EM_ERR_INDEX (index_select: cuda_native.c). */
enum { CUDA_KERROR_INDEX = 1 };
typedef em_status (*cuda_kerror_fn)(void *ctx, CUdeviceptr words);
/* Runs launch(ctx, words) (words allocated and zeroed at the first call)
 * and arms the next cuda_sync to read them, under d->kerror_lock, which
 * cuda_sync holds from reading the words to clearing them: a launch
 * therefore falls wholly before the read (and is reported by it) or after
 * the clearing (and is reported by the next sync), whatever the threads. */
em_status cuda_kerror_launch(cuda_device *d, cuda_kerror_fn launch, void *ctx);

/* ---- graph capture (the mechanism; cuda_graph.c drives it) ----
 * While a thread captures on a device, every op it queues there goes to
 * the device's capture stream instead of its stream (cuda_stream), its
 * allocations come from and go back to the capture's pool (cuda_mem_alloc,
 * cuda_mem_free), and an op that cannot be captured refuses
 * (cuda_capture_refuse).  Other threads are untouched: their ops stay on
 * the device's stream, outside the graph.  The state is one thread-local
 * pointer: a capture belongs to the thread that runs it. */
typedef struct cuda_capture {
    cuda_device *d;
    cuda_pool pool;
    bool kerror;             /* a captured launch may set the kernel-error words */
    char refused[160];       /* why an op refused to be captured ("" : none did) */
} cuda_capture;

/* The calling thread's capture on d, or NULL. */
cuda_capture *cuda_capturing(const cuda_device *d);
/* Makes c (NULL: none) the calling thread's capture. */
void cuda_capture_set(cuda_capture *c);
/* The stream the calling thread's ops on d go to. */
CUstream cuda_stream(const cuda_device *d);
/* Records why op cannot be captured and returns EM_ERR_UNSUPPORTED (the
 * capture then fails and the entry runs with plain launches). */
em_status cuda_capture_refuse(cuda_capture *c, const char *why);
/* Gives a finished capture's pool blocks back to d's free lists. */
void cuda_pool_release(cuda_device *d, cuda_pool *p);
/* Bytes of d's live blocks and of its cached free blocks (tests). */
void cuda_mem_usage(cuda_device *d, size_t *live, size_t *cached);

/* Whether TF32 tensor cores may be used for f32 matmuls: the environment
 * variable EMBER_CUDA_TF32=1 (default off: full f32 accuracy). */
bool cuda_tf32_enabled(void);
/* The math mode of Ember's cuBLAS handles: TF32 as above, and never
 * split-K partials reduced in a half output's precision (cuBLAS allows
 * that by default; Ember's half matmuls accumulate in f32). */
cublasMath_t cuda_blas_math(bool tf32);

#endif /* EMBER_HAVE_CUDA */
#endif
