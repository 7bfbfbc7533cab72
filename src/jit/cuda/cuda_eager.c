/* cuda_backend.c - the EM_CUDA device's eager backend table (em_backend).
 *
 * Why it lives in src/jit and not in src/eager: an eager CUDA op has no
 * hand-written kernel.  It is a one-node graph, fused and lowered to kernel
 * IR like any compiled graph (schedule.c, lower.c), printed as CUDA C and
 * compiled once by NVRTC (cuda_kernel.c: memoized per kernel text in the
 * process and in the kernel cache on disk).  That needs trace, jit and
 * cache, which eager must not know; eager only sees this table, which
 * registers itself with eager's device registry (the end of this file),
 * as it sees the CPU's.
 *
 * What runs how:
 *  - pointwise ops, casts, contiguous copies, full, and sum/mean/amax/amin/
 *    var (over any dims: the reduced dims are permuted to the end first):
 *    an NVRTC kernel (two for few, long rows: the split scheme below);
 *  - matmul: cuBLAS (cuda_matmul.c);
 *  - attention (the fused op the attention pass makes): one generated
 *    flash-attention kernel (cuda_attention.c);
 *  - cat, index_select (and so embedding), arange, rand, randn, argmax:
 *    generated CUDA C kernels (cuda_native.c), nothing copied to the host;
 *    index_select's out-of-range indices surface at the next cuda_sync;
 *  - empty: nothing;
 *  - the rest (integer matmul): the CPU kernel on a host copy of the
 *    inputs, result copied back.  Slow but exact; docs/cuda.md lists it. */
#include "cuda_eager.h"

#ifdef EMBER_HAVE_CUDA

#include <string.h>

#include "cuda_jit.h" /* jit_cuda_device.half_kernels */
#include "cuda_kernel.h"
#include "schedule.h"
#include "trace.h"

/* ---- the process's kernel cache for eager ops ----
 * Opened once: eager ops have no compiled function to own one. */
static pthread_once_t cache_once = PTHREAD_ONCE_INIT;
static kc_cache *eager_cache;
static jit_log eager_log;          /* EMBER_LOG=cache reports eager ops' cubins too */
static cuda_get_stats eager_stats; /* updated under the device lock */

static void open_cache(void) {
    const em_allocator *cur = em_get_allocator();
    em_set_allocator(NULL); /* the cache outlives any thread's allocator */
    jit_log_open(&eager_log);
    eager_cache = jit_cache_open(&eager_log); /* remote events under EMBER_LOG=cache too */
    em_set_allocator(cur);
    em_clear_error();
}

kc_cache *cuda_eager_cache(void) {
    pthread_once(&cache_once, open_cache);
    return eager_cache;
}

const jit_log *cuda_eager_log(void) {
    pthread_once(&cache_once, open_cache);
    return &eager_log;
}

void cuda_eager_stats(int64_t *compiled, int64_t *loaded) {
    *compiled = eager_stats.compiled;
    *loaded = eager_stats.loaded;
}

/* ---- the table's memory functions ---- */

static bool cuda_available(em_device d) {
    if (d.type != EM_CUDA) return false;
    return cuda_device_get(d.index) != NULL;
}

static em_status cuda_alloc(em_device d, size_t nbytes, void **ptr) {
    cuda_device *dev = cuda_device_get(d.index);
    return dev ? cuda_mem_alloc(dev, nbytes, ptr) : em_last_status();
}

static void cuda_free(em_device d, void *ptr) {
    cuda_device *dev = cuda_device_get(d.index);
    if (dev) cuda_mem_free(dev, ptr);
}

/* Copies between host and device, or within one device, on the device's
 * stream; a copy to the host waits for it (the host reads next). */
static em_status cuda_copy(void *dst, em_device dd, const void *src, em_device sd, size_t n) {
    if (n == 0) return EM_OK;
    const cu_api *cu = cuda_driver();
    if (!cu) return em_last_status();
    if (dd.type == EM_CUDA && sd.type == EM_CUDA && dd.index != sd.index) { /* through the host */
        void *tmp = em_malloc(n);
        em_status s = tmp ? cuda_copy(tmp, em_cpu(), src, sd, n) : em_last_status();
        if (s == EM_OK) s = cuda_copy(dst, dd, tmp, em_cpu(), n);
        em_free(tmp);
        return s;
    }
    cuda_device *d = cuda_device_get(dd.type == EM_CUDA ? dd.index : sd.index);
    if (!d) return em_last_status();
    CUdeviceptr dp = (CUdeviceptr)(uintptr_t)dst, sp = (CUdeviceptr)(uintptr_t)src;
    if (dd.type == EM_CUDA && sd.type == EM_CUDA)
        return cuda_check(cu->MemcpyDtoDAsync(dp, sp, n, cuda_stream(d)), "cuMemcpyDtoDAsync");
    cuda_capture *cap = cuda_capturing(d);
    if (cap) /* a graph would copy from or to the host memory of this call */
        return cuda_capture_refuse(cap, "a copy between the host and the device");
    em_status s = dd.type == EM_CUDA
                      ? cuda_check(cu->MemcpyHtoDAsync(dp, src, n, d->stream), "cuMemcpyHtoDAsync")
                      : cuda_check(cu->MemcpyDtoHAsync(dst, sp, n, d->stream), "cuMemcpyDtoHAsync");
    /* the host buffer may be reused or read as soon as we return */
    return s == EM_OK ? cuda_sync(d) : s;
}

/* ---- an op as a one-node graph ---- */

/* Input i's meta for the graph; for a reduction, the reduced dims moved
 * last (the kernels reduce trailing dims) and the attrs changed to match. */
static void reduction_view(const em_op_call *c, em_meta *in, em_op_attrs *a, em_meta *out) {
    bool red[EM_MAX_DIMS] = {false};
    const em_tensor *x = c->in[0];
    for (int i = 0; i < c->attrs->ndims; i++) red[c->attrs->dims[i]] = true;
    for (int d = 0; c->attrs->ndims == 0 && d < x->ndim; d++) red[d] = true; /* all */
    int perm[EM_MAX_DIMS], n = 0, k = 0;
    for (int d = 0; d < x->ndim; d++)
        if (!red[d]) perm[n++] = d;
    for (int d = 0; d < x->ndim; d++)
        if (red[d]) perm[n++] = d, k++;
    for (int d = 0; d < x->ndim; d++) {
        in->sizes[d] = x->sizes[perm[d]];
        in->strides[d] = x->strides[perm[d]];
    }
    a->ndims = k;
    for (int i = 0; i < k; i++) a->dims[i] = x->ndim - k + i;
    a->keepdim = false; /* keepdim's unit dims change no byte of the result */
    out->ndim = x->ndim - k;
    memcpy(out->sizes, in->sizes, sizeof(int64_t) * (size_t)out->ndim);
    em_contiguous_strides(out->ndim, out->sizes, out->strides);
}

static bool is_kernel_reduction(em_op op) {
    return op == EM_OP_SUM || op == EM_OP_MEAN || op == EM_OP_AMAX || op == EM_OP_AMIN ||
           op == EM_OP_VAR;
}

/* The one-node graph of call c writing out. */
static tr_graph *graph_of(const em_op_call *c, const em_tensor *out) {
    tr_graph *g = tr_graph_new();
    if (!g) return NULL;
    int ins[3], nin = c->nin;
    em_op_attrs a = *c->attrs;
    em_meta om;
    tr_meta_of(out, &om);
    for (int i = 0; i < nin; i++) {
        em_meta m;
        tr_meta_of(c->in[i], &m);
        if (is_kernel_reduction(c->op)) reduction_view(c, &m, &a, &om);
        char nm[8];
        snprintf(nm, sizeof nm, "in%d", i);
        ins[i] = tr_add_input(g, nm, &m);
    }
    int node = tr_add_call(g, c->op, nin, ins, &a, &om);
    if (node < 0 || tr_set_outputs(g, 1, &node) != EM_OK) {
        tr_graph_free(g);
        return NULL;
    }
    return g;
}

/* Whether c runs as one NVRTC kernel. */
static bool has_kernel(const em_op_call *c) {
    if (c->nin > 3) return false;
    switch (em_op_table[c->op].kind) {
    case EM_KIND_UNARY:
    case EM_KIND_BINARY:
    case EM_KIND_TERNARY:
    case EM_KIND_COPY: return true;
    case EM_KIND_CREATE: return c->op == EM_OP_FULL;
    case EM_KIND_REDUCE: return is_kernel_reduction(c->op);
    default: return false;
    }
}

/* Runs c's kernel: schedule and lower the one-node graph, then launch. */
static em_status run_kernel(cuda_device *d, const em_op_call *c, em_tensor *out) {
    tr_graph *g = graph_of(c, out);
    if (!g) return em_last_status();
    sc_schedule *sc = sc_build_for(g, jit_cuda_device.half_kernels);
    int *bufs = em_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    k_kernel *k = NULL;
    int nbufs = 0, nouts = 0;
    em_status s = sc && bufs ? EM_OK : em_last_status();
    if (s == EM_OK && (sc->ngroups != 1 || sc->nsteps != 1))
        s = em_error(EM_ERR_UNSUPPORTED, "cuda: %s is not one kernel", em_op_table[c->op].name);
    if (s == EM_OK && !(k = sc_lower(sc, 0, bufs, &nbufs, &nouts))) s = em_last_status();
    const cuda_kernel *ck = NULL;
    if (s == EM_OK) s = cuda_kernel_get(d, k, cuda_eager_cache(), cuda_eager_log(), &eager_stats, &ck);
    void *ptrs[4];
    for (int b = 0; s == EM_OK && b < nbufs; b++) {
        const tr_node *n = &g->nodes[bufs[b]];
        ptrs[b] = n->kind == TR_INPUT ? (void *)em_data(c->in[n->index]) : (void *)em_data(out);
    }
    if (s == EM_OK) s = cuda_kernel_launch(d, ck, ptrs, NULL);
    kir_free(k);
    em_free(bufs);
    sc_free(sc);
    tr_graph_free(g);
    return s;
}

/* ---- the split scheme for few, long rows ----
 * A rows kernel runs a block per row: a reduction with fewer rows than
 * the GPU has SMs (a full sum) would leave most of it idle.  When the
 * reduced part of each row is contiguous, the rows are cut into S equal
 * chunks: one launch reduces the O*S chunks, a second the S partials of
 * each row.  sum, amax, amin compose exactly (sums in another order); so
 * does mean, the chunks being equal.  var is not split. */

enum { SPLIT_MIN_ROW = 1 << 16, SPLIT_MIN_CHUNK = 1024 };

/* Whether reduction c reduces the trailing dims of its input (all: none
 * listed). */
static bool trailing_dims(const em_op_call *c) {
    const em_tensor *x = c->in[0];
    int k = c->attrs->ndims ? c->attrs->ndims : x->ndim;
    for (int i = 0; i < c->attrs->ndims; i++)
        if (c->attrs->dims[i] != x->ndim - k + i) return false;
    return true;
}

/* The number of chunks per row, or 1 for no split. */
static int64_t split_count(const cuda_device *d, const em_op_call *c, int64_t rows, int64_t len) {
    em_op op = c->op;
    if (op != EM_OP_SUM && op != EM_OP_MEAN && op != EM_OP_AMAX && op != EM_OP_AMIN) return 1;
    if (rows >= d->sm_count || len < SPLIT_MIN_ROW || !em_is_contiguous(c->in[0])) return 1;
    if (!trailing_dims(c)) return 1; /* the reduced dims must be the trailing ones */
    int64_t S = 1;
    while (S < 1024 && rows * S < 4 * (int64_t)d->sm_count && len / (2 * S) >= SPLIT_MIN_CHUNK) S *= 2;
    while (S > 1 && len % S) S /= 2;
    return S;
}

/* A 2-d view [r, n] of t's storage from t's offset, contiguous. */
static em_tensor *view2(const em_tensor *t, int64_t r, int64_t n) {
    em_meta m;
    memset(&m, 0, sizeof m);
    m.ndim = 2;
    m.sizes[0] = r, m.sizes[1] = n;
    m.strides[0] = n, m.strides[1] = 1;
    m.offset = t->offset;
    m.dtype = t->dtype;
    m.device = t->device;
    return em_tensor_view(t, &m);
}

/* out = op over dim 1 of the [r, n] view of in. */
static em_status reduce_rows(cuda_device *d, em_op op, em_tensor *in, int64_t r, int64_t n,
                             em_tensor *out) {
    em_tensor *v = view2(in, r, n);
    if (!v) return em_last_status();
    em_op_attrs a = {.ndims = 1, .dims = {1}};
    em_op_call c = {op, 1, &v, &a};
    return run_kernel(d, &c, out);
}

static em_status run_split_reduction(cuda_device *d, const em_op_call *c, em_tensor *out,
                                     int64_t rows, int64_t len, int64_t S) {
    em_meta pm;
    memset(&pm, 0, sizeof pm);
    pm.ndim = 1;
    pm.sizes[0] = rows * S;
    pm.dtype = out->dtype; /* a partial has the result's dtype (sum of i32: i64) */
    pm.device = out->device;
    em_scope_begin();
    em_tensor *part = em_tensor_alloc(&pm);
    em_status s = part ? reduce_rows(d, c->op, c->in[0], rows * S, len / S, part) : em_last_status();
    if (s == EM_OK) s = reduce_rows(d, c->op, part, rows, S, out);
    em_scope_end(); /* part is freed in stream order: the second launch is queued first */
    return s;
}

/* Reduction c of a non-contiguous input (a slice) to fewer rows than the
 * GPU has SMs, on a contiguous copy of it, which the split scheme then
 * spreads: on the view itself a rows kernel ran the few rows on one SM (a
 * mean over a [2048, 1000] slice of a [2048, 50257] tensor: 273 ms on the
 * H200; the copy moves 8 MB). */
static em_status reduce_copied(cuda_device *d, const em_op_call *c, em_tensor *out, int64_t rows,
                               int64_t len) {
    em_meta m;
    tr_meta_of(c->in[0], &m);
    em_contiguous_strides(m.ndim, m.sizes, m.strides);
    m.offset = 0;
    em_scope_begin();
    em_tensor *x = em_tensor_alloc(&m);
    em_op_attrs none = {0};
    em_op_call copy = {EM_OP_CONTIGUOUS, 1, c->in, &none}, red = *c;
    red.in = &x;
    em_status s = x ? run_kernel(d, &copy, x) : em_last_status();
    int64_t S = s == EM_OK ? split_count(d, &red, rows, len) : 1;
    if (s == EM_OK) s = S > 1 ? run_split_reduction(d, &red, out, rows, len, S) : run_kernel(d, &red, out);
    em_scope_end(); /* x is freed in stream order, after the launches that read it */
    return s;
}

/* ---- the host path for ops without a kernel ---- */

/* A host tensor with t's values and layout (its storage copied whole). */
static em_tensor *to_host(const em_tensor *t) {
    em_meta sm = {.ndim = 1, .sizes = {(int64_t)t->storage->nbytes}, .dtype = EM_BOOL,
                  .device = em_cpu()};
    em_tensor *raw = em_tensor_alloc(&sm);
    if (!raw) return NULL;
    if (cuda_copy(raw->storage->data, em_cpu(), t->storage->data, t->device, t->storage->nbytes) != EM_OK)
        return NULL;
    em_meta m;
    memset(&m, 0, sizeof m);
    m.ndim = t->ndim;
    memcpy(m.sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
    memcpy(m.strides, t->strides, sizeof(int64_t) * (size_t)t->ndim);
    m.offset = t->offset;
    m.dtype = t->dtype;
    m.device = em_cpu();
    return em_tensor_view(raw, &m);
}

static em_status run_on_host(cuda_device *d, const em_op_call *c, em_tensor *out) {
    cuda_capture *cap = cuda_capturing(d);
    if (cap) return cuda_capture_refuse(cap, "an op on the host path");
    int nin = c->nin;
    em_tensor *stack[4], **hin = nin <= 4 ? stack : em_malloc(sizeof *hin * (size_t)nin);
    if (!hin) return em_last_status();
    em_status s = EM_OK;
    em_scope_begin();
    for (int i = 0; i < nin && s == EM_OK; i++)
        if (!(hin[i] = to_host(c->in[i]))) s = em_last_status();
    em_meta m;
    memset(&m, 0, sizeof m);
    m.ndim = out->ndim;
    memcpy(m.sizes, out->sizes, sizeof(int64_t) * (size_t)out->ndim);
    m.dtype = out->dtype;
    m.device = em_cpu();
    em_tensor *hout = s == EM_OK ? em_tensor_alloc(&m) : NULL;
    if (s == EM_OK && !hout) s = em_last_status();
    em_op_attrs a = *c->attrs;
    a.device = em_cpu();
    em_op_call hc = {c->op, nin, hin, &a};
    if (s == EM_OK) s = em_op_table[c->op].cpu(&hc, hout);
    if (s == EM_OK)
        s = cuda_copy(em_data(out), out->device, em_data(hout), em_cpu(),
                      (size_t)em_numel(out) * em_dtype_size(out->dtype));
    em_scope_end();
    if (hin != stack) em_free(hin);
    return s;
}

/* Whether c can be recorded into the calling thread's graph capture on d
 * (EM_OK when none runs).  cat copies a contiguous run with the device's
 * stream itself (cuda_native.c), which would run now, outside the graph:
 * refused until that copy goes to cuda_stream. */
static em_status capturable(cuda_device *d, const em_op_call *c) {
    cuda_capture *cap = cuda_capturing(d);
    if (!cap) return EM_OK;
    if (c->op == EM_OP_CAT) return cuda_capture_refuse(cap, "cat");
    if ((c->op == EM_OP_RAND || c->op == EM_OP_RANDN) && c->attrs->generator)
        return cuda_capture_refuse(cap, "a random draw (a replay would repeat its numbers)");
    return EM_OK;
}

static em_status cuda_run(const em_op_call *c, em_tensor *out);

/* out = act(a @ w + bias) as the matmul, the add and the act it stands
 * for, when neither the skinny kernel nor cuBLASLt can run it (alignment,
 * a size they do not take, no cuBLASLt): the same bits as the unfused
 * graph.  The add and the act write out in place, element by element. */
static em_status linear_unfused(const em_op_call *c, em_tensor *out) {
    em_op_call mm = {.op = EM_OP_MATMUL, .nin = 2, .in = c->in, .attrs = c->attrs};
    em_meta m;
    memset(&m, 0, sizeof m);
    m.device = out->device;
    em_status s = em_op_table[EM_OP_MATMUL].infer(&mm, &m);
    if (s != EM_OK) return s;
    em_scope_begin();
    em_tensor *p = em_dispatch_eager(&mm, &m);
    em_tensor *in[2] = {p, c->in[2]};
    em_op_call add = {.op = EM_OP_ADD, .nin = 2, .in = in, .attrs = c->attrs};
    s = p ? cuda_run(&add, out) : em_last_status();
    em_scope_end(); /* the product is freed in stream order, after the add */
    if (s != EM_OK || c->attrs->act == EM_ACT_NONE) return s;
    em_tensor *o[1] = {out};
    em_op_call act = {.op = em_act_op(c->attrs->act), .nin = 1, .in = o, .attrs = c->attrs};
    return cuda_run(&act, out);
}

static em_status cuda_run(const em_op_call *c, em_tensor *out) {
    cuda_device *d = cuda_device_get(out->device.index);
    if (!d) return em_last_status();
    if (c->op == EM_OP_EMPTY || em_numel(out) == 0) return EM_OK;
    em_status cs = capturable(d, c);
    if (cs != EM_OK) return cs;
    if (c->op == EM_OP_MATMUL || c->op == EM_OP_LINEAR) {
        bool lin = c->op == EM_OP_LINEAR;
        if (!lin || c->attrs->act == EM_ACT_NONE) { /* the skinny kernel adds a bias, no act */
            em_status s = cuda_native_skinny_matmul(d, c, out, &eager_stats);
            if (s != EM_ERR_UNSUPPORTED) return s;
            em_clear_error();
        }
        em_status s = lin ? cuda_linear(d, c, out) : EM_ERR_UNSUPPORTED;
        if (s != EM_ERR_UNSUPPORTED) return s;
        em_clear_error();
        if (lin) return linear_unfused(c, out);
        s = cuda_matmul(d, c, out);
        if (s != EM_ERR_UNSUPPORTED) return s;
        em_clear_error();
    } else if (c->op == EM_OP_ATTENTION) {
        em_status s = cuda_attention(d, c, out, &eager_stats);
        if (s != EM_ERR_UNSUPPORTED) return s; /* head sizes past the kernel's: the host */
        em_clear_error();
    } else if (cuda_native_takes(c->op)) { /* cat, index_select, arange, rand(n), argmax */
        return cuda_native_run(d, c, out, &eager_stats);
    } else if (cuda_native_column_reduction(c, &(int64_t){0}, &(int64_t){0}, &(int64_t){0})) {
        return cuda_native_reduce_columns(d, c, out, &eager_stats);
    } else if (has_kernel(c)) {
        bool red = em_op_table[c->op].kind == EM_KIND_REDUCE; /* creation ops have no input */
        int64_t rows = em_numel(out), len = red && rows ? em_numel(c->in[0]) / rows : 0;
        int64_t S = red ? split_count(d, c, rows, len) : 1;
        bool copied = red && S == 1 && rows < d->sm_count && len >= SPLIT_MIN_ROW &&
                      !em_is_contiguous(c->in[0]) && trailing_dims(c);
        em_status s = copied  ? reduce_copied(d, c, out, rows, len)
                      : S > 1 ? run_split_reduction(d, c, out, rows, len, S)
                              : run_kernel(d, c, out);
        if (s != EM_ERR_UNSUPPORTED) return s;
        em_clear_error();
    }
    return run_on_host(d, c, out);
}

static const em_backend cuda_eager_backend = {
    .name = "cuda",
    .available = cuda_available,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy = cuda_copy,
    .run = cuda_run,
};

/* Registered when the library is loaded: eager names nothing of src/jit.
 * Only the table's address is stored (no CUDA call, no allocation), so it
 * fails only if another EM_CUDA table came first, which nothing in Ember
 * registers; CUDA itself starts at the first available().  A static link
 * must keep this file for the constructor to run (Makefile.am's
 * EMBER_CORE_WHOLE links the core whole). */
__attribute__((constructor)) static void cuda_eager_register(void) {
    em_register_device(EM_CUDA, &cuda_eager_backend);
}

#endif /* EMBER_HAVE_CUDA */
