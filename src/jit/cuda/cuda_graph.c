/* cuda_graph.c - CUDA graphs for the engine's device graphs (engine.h's
 * capture_begin, capture_end, graph_launch, graph_bytes, graph_free; the
 * engine's graphs.c decides when to capture and owns what a replay needs).
 *
 * A capture is stream capture through the driver API: from capture_begin
 * to capture_end the calling thread's ops on the device go to the
 * device's capture stream (cuda_stream), which records them instead of
 * running them; its allocations come from and return to the capture's
 * pool (cuda_lib.c), so the blocks the graph's nodes read and write stay
 * reserved for it until graph_free, whatever the other threads allocate.
 * The capture is thread-local (CU_STREAM_CAPTURE_MODE_THREAD_LOCAL): other
 * threads keep using the device's stream meanwhile, outside the graph,
 * and a potentially unsafe call of the capturing thread (a synchronizing
 * copy, a driver allocation outside the pool's relaxed window) fails the
 * capture instead of running out of order.  One capture at a time per
 * device (capture_lock): the capture stream, the capture's cuBLAS handle
 * and its workspace are the device's.
 *
 * Replays run on the device's stream, in order with every other op of it:
 * the graph reads its inputs after the ops that wrote them, and a block
 * its replay writes is reused by the allocator only in stream order after
 * the graph is freed. */
#include "cuda_eager.h"

#ifdef EMBER_HAVE_CUDA

#include <stdlib.h>
#include <string.h>

/* cuBLAS's recommended workspace for Hopper (4 MiB suffices before it):
 * under capture cuBLAS cannot allocate its own. */
#define CAPTURE_BLAS_WORKSPACE ((size_t)32 << 20)

typedef struct cuda_graph {
    cuda_device *d;
    CUgraph graph;
    CUgraphExec exec;
    cuda_pool pool;  /* the blocks its nodes use, reserved until it is freed */
    bool kerror;     /* it may set the kernel-error words: each launch arms them */
} cuda_graph;

/* Creates d's capture cuBLAS handle (once; d->capture_lock held): on the
 * capture stream, with its own workspace.  Without cuBLAS, or a cuBLAS
 * without cublasSetWorkspace, there is none and captured matmuls refuse. */
static em_status capture_blas(cuda_device *d) {
    const cublas_api *bl = cuda_cublas();
    if (!bl || !bl->SetWorkspace) {
        em_clear_error();
        return EM_OK;
    }
    const cu_api *cu = cuda_driver();
    if (!d->blas_capture) {
        cublasHandle_t h = NULL;
        CUdeviceptr ws = 0;
        if (bl->Create(&h) != CUBLAS_STATUS_SUCCESS)
            return em_error(EM_ERR_DEVICE, "cuda:%d: cublasCreate failed", d->index);
        em_status s = cuda_check(cu->MemAlloc(&ws, CAPTURE_BLAS_WORKSPACE), "cuMemAlloc");
        if (s == EM_OK && (bl->SetStream(h, d->capture_stream) != CUBLAS_STATUS_SUCCESS ||
                           bl->SetWorkspace(h, (void *)(uintptr_t)ws, CAPTURE_BLAS_WORKSPACE) !=
                               CUBLAS_STATUS_SUCCESS))
            s = em_error(EM_ERR_DEVICE, "cuda:%d: cannot set up cuBLAS for capture", d->index);
        if (s != EM_OK) {
            bl->Destroy(h);
            if (ws) cu->MemFree(ws);
            return s;
        }
        d->blas_capture = h; /* process-long, as the device's own handle */
        d->blas_workspace = ws;
        d->blas_capture_tf32 = !cuda_tf32_enabled(); /* set the mode below */
    }
    bool tf32 = cuda_tf32_enabled();
    if (tf32 != d->blas_capture_tf32) {
        bl->SetMathMode(d->blas_capture, cuda_blas_math(tf32));
        d->blas_capture_tf32 = tf32;
    }
    return EM_OK;
}

/* The capture stream and handle, and the capture started on it (d's
 * capture_lock held). */
static em_status start(cuda_device *d, cuda_capture **out) {
    const cu_api *cu = cuda_driver();
    em_status s = d->capture_stream ? EM_OK
                  : cuda_check(cu->StreamCreate(&d->capture_stream, CU_STREAM_NON_BLOCKING),
                               "cuStreamCreate");
    if (s == EM_OK) s = capture_blas(d);
    cuda_capture *c = s == EM_OK ? calloc(1, sizeof *c) : NULL;
    if (s == EM_OK && !c) s = em_error(EM_ERR_NOMEM, "cuda: out of host memory");
    if (s == EM_OK)
        s = cuda_check(cu->StreamBeginCapture(d->capture_stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                       "cuStreamBeginCapture");
    if (s != EM_OK) {
        free(c);
        return s;
    }
    c->d = d;
    *out = c;
    return EM_OK;
}

em_status cuda_graph_capture_begin(int index, jit_capture **out) {
    *out = NULL;
    const cu_api *cu = cuda_driver();
    if (!cu) return em_last_status();
    if (!cu->graphs)
        return em_error(EM_ERR_UNSUPPORTED, "cuda: this driver has no graph API (cuStreamBeginCapture, "
                        "cuGraphInstantiateWithFlags, cuGraphLaunch...)");
    cuda_device *d = cuda_device_get(index);
    if (!d) return em_last_status();
    if (pthread_mutex_trylock(&d->capture_lock) != 0)
        return em_error(EM_ERR_STATE, "cuda:%d: another thread is capturing a graph", index);
    cuda_capture *c = NULL;
    em_status s = start(d, &c);
    if (s != EM_OK) {
        pthread_mutex_unlock(&d->capture_lock);
        return s;
    }
    cuda_capture_set(c);
    *out = (jit_capture *)c;
    return EM_OK;
}

/* The instantiated graph of a capture that ended well, or an error. */
static em_status instantiate(cuda_capture *c, CUgraph graph, cuda_graph **out) {
    const cu_api *cu = cuda_driver();
    CUgraphExec exec = NULL;
    em_status s = cuda_check(cu->GraphInstantiate(&exec, graph, 0), "cuGraphInstantiate");
    cuda_graph *g = s == EM_OK ? calloc(1, sizeof *g) : NULL;
    if (s == EM_OK && !g) s = em_error(EM_ERR_NOMEM, "cuda: out of host memory");
    if (s != EM_OK) {
        if (exec) cu->GraphExecDestroy(exec);
        return s;
    }
    *g = (cuda_graph){.d = c->d, .graph = graph, .exec = exec, .pool = c->pool, .kerror = c->kerror};
    c->pool = (cuda_pool){0}; /* the graph's now */
    *out = g;
    return EM_OK;
}

em_status cuda_graph_capture_end(jit_capture *jc, bool ok, jit_graph **out) {
    *out = NULL;
    cuda_capture *c = (cuda_capture *)jc;
    cuda_device *d = c->d;
    const cu_api *cu = cuda_driver();
    cuda_capture_set(NULL);
    CUgraph graph = NULL;
    CUresult r = cu->StreamEndCapture(d->capture_stream, &graph);
    em_status s;
    if (c->refused[0]) s = em_error(EM_ERR_UNSUPPORTED, "cuda:%d: %s cannot be captured", d->index, c->refused);
    else if (!ok) s = em_error(EM_ERR_UNSUPPORTED, "cuda:%d: the captured run failed", d->index);
    else s = cuda_check(r, "cuStreamEndCapture");
    cuda_graph *g = NULL;
    if (s == EM_OK && graph) s = instantiate(c, graph, &g);
    else if (s == EM_OK) s = em_error(EM_ERR_STATE, "cuda:%d: the capture gave no graph", d->index);
    if (s != EM_OK && graph) cu->GraphDestroy(graph);
    cuda_pool_release(d, &c->pool); /* empty when the graph took it */
    free(c);
    pthread_mutex_unlock(&d->capture_lock);
    *out = (jit_graph *)g;
    return s;
}

static em_status launch_graph(void *ctx, CUdeviceptr words) {
    (void)words; /* baked into the graph's kernels when they were captured */
    const cuda_graph *g = ctx;
    return cuda_check(cuda_driver()->GraphLaunch(g->exec, g->d->stream), "cuGraphLaunch");
}

em_status cuda_graph_launch(jit_graph *jg) {
    cuda_graph *g = (cuda_graph *)jg;
    if (!cuda_device_get(g->d->index)) return em_last_status(); /* current on this thread */
    /* a graph with index_select's check arms the next sync, as its launch did */
    return g->kerror ? cuda_kerror_launch(g->d, launch_graph, g) : launch_graph(g, 0);
}

size_t cuda_graph_bytes(const jit_graph *jg) { return ((const cuda_graph *)jg)->pool.bytes; }

void cuda_graph_free(jit_graph *jg) {
    cuda_graph *g = (cuda_graph *)jg;
    if (!g) return;
    const cu_api *cu = cuda_driver();
    if (cuda_device_get(g->d->index)) {
        /* a launch still in flight finishes first: the driver frees the
         * executable graph after it, and the blocks are reused only in
         * stream order after it */
        cu->GraphExecDestroy(g->exec);
        cu->GraphDestroy(g->graph);
    }
    em_clear_error();
    cuda_pool_release(g->d, &g->pool);
    free(g);
}

#endif /* EMBER_HAVE_CUDA */
