/* cuda_matmul.c - matmul on CUDA through cuBLAS, and the linear op
 * (act(a @ w + bias)) through cuBLASLt's fused epilogues (below).
 *
 * Row-major C[M,N] = A[M,K] B[K,N] is column-major C^T = B^T A^T, so cuBLAS
 * is called with the operands swapped.  An operand whose last two dims
 * have unit stride in either dim is used in place (a transposed view
 * becomes op T); batch dims must collapse to one stride (or be broadcast,
 * stride 0): strided-batched GEMM covers attention's q @ k^T on views.
 * Anything else is made contiguous first with the CUDA contiguous kernel.
 * f32 uses no TF32 unless EMBER_CUDA_TF32=1; f16 and bf16 run on tensor
 * cores with f32 accumulation and a result in the half type (cublasGemmEx,
 * as torch's half matmul); integer dtypes are EM_ERR_UNSUPPORTED (the
 * backend then computes them on the host). */
#include "cuda_eager.h"

#ifdef EMBER_HAVE_CUDA

#include <stdint.h>
#include <string.h>

typedef struct mm_operand {
    const void *data;
    cublasOperation_t op; /* applied to the column-major view */
    int64_t ld;
    int64_t batch_stride; /* elements; 0: the same matrix for every batch */
} mm_operand;

/* The column-major description of the transpose of row-major X[R, C] with
 * strides (sr, sc), which cuBLAS needs; false when neither dim is unit-stride. */
static bool describe(int64_t R, int64_t C, int64_t sr, int64_t sc, cublasOperation_t *op,
                     int64_t *ld) {
    int64_t c1 = C > 1 ? C : 1, r1 = R > 1 ? R : 1;
    if ((sc == 1 || C == 1) && (R == 1 || sr >= c1)) {
        *op = CUBLAS_OP_N; /* X^T is the C x R column-major matrix at ld sr */
        *ld = R == 1 ? c1 : sr;
        return true;
    }
    if ((sr == 1 || R == 1) && (C == 1 || sc >= r1)) {
        *op = CUBLAS_OP_T; /* X is the R x C column-major matrix at ld sc */
        *ld = C == 1 ? r1 : sc;
        return true;
    }
    return false;
}

/* Batch dims of t (the out's nb batch dims, aligned right) as one stride. */
static bool batch_stride(const em_tensor *t, int nb, const int64_t *out_sizes, int64_t *stride) {
    int tb = t->ndim - 2, shift = nb - tb;
    bool any = false, broadcast = false;
    int64_t inner = -1, expect = -1;
    for (int d = nb - 1; d >= 0; d--) {
        int td = d - shift;
        int64_t size = td >= 0 ? t->sizes[td] : 1;
        if (out_sizes[d] == 1) continue;
        if (size == 1) {
            broadcast = true;
            continue;
        }
        if (broadcast) return false; /* broadcast inside a real batch dim */
        int64_t s = t->strides[td];
        if (!any) {
            inner = s;
            any = true;
        } else if (s != expect) {
            return false;
        }
        expect = s * size;
    }
    if (any && broadcast) return false; /* partly broadcast: no single stride */
    *stride = any ? inner : 0;
    return true;
}

static bool operand(const em_tensor *t, int nb, const int64_t *out_sizes, mm_operand *o) {
    int n = t->ndim;
    if (!describe(t->sizes[n - 2], t->sizes[n - 1], t->strides[n - 2], t->strides[n - 1], &o->op,
                  &o->ld))
        return false;
    if (!batch_stride(t, nb, out_sizes, &o->batch_stride)) return false;
    o->data = em_data(t);
    return true;
}

static em_status device_handle(cuda_device *d, const cublas_api *bl);

/* The handle a matmul of the calling thread uses: the device's, or while
 * the thread captures a graph, the capture's (cuda_graph.c: on the capture
 * stream, with a workspace of its own, which capture needs). */
static em_status blas_handle(cuda_device *d, const cublas_api *bl, cublasHandle_t *h) {
    cuda_capture *cap = cuda_capturing(d);
    if (cap) {
        *h = d->blas_capture;
        return *h ? EM_OK : cuda_capture_refuse(cap, "a matmul (no cuBLAS handle for capture)");
    }
    em_status s = device_handle(d, bl);
    *h = d->blas;
    return s;
}

static em_status device_handle(cuda_device *d, const cublas_api *bl) {
    bool tf32 = cuda_tf32_enabled();
    if (!d->blas) {
        if (bl->Create(&d->blas) != CUBLAS_STATUS_SUCCESS)
            return em_error(EM_ERR_DEVICE, "cuda:%d: cublasCreate failed", d->index);
        bl->SetStream(d->blas, d->stream);
        d->blas_tf32 = !tf32; /* force the mode below */
    }
    if (d->blas_tf32 != tf32) {
        bl->SetMathMode(d->blas, cuda_blas_math(tf32));
        d->blas_tf32 = tf32;
    }
    return EM_OK;
}

static em_status gemm(cuda_device *d, cublasHandle_t h, const cublas_api *bl, em_dtype dt, const mm_operand *A,
                      const mm_operand *B, void *C, int64_t M, int64_t N, int64_t K, int64_t batch) {
    if (M > INT32_MAX || N > INT32_MAX || K > INT32_MAX || batch > INT32_MAX || A->ld > INT32_MAX ||
        B->ld > INT32_MAX)
        return em_error(EM_ERR_UNSUPPORTED, "matmul: sizes past cuBLAS's int range");
    int m = (int)N, n = (int)M, k = (int)K; /* C^T[N, M] = B^T[N, K] A^T[K, M] */
    cublasStatus_t r;
    if (dt == EM_F16 || dt == EM_BF16) {
        const float one = 1.0f, zero = 0.0f;
        cudaDataType_t t = dt == EM_F16 ? CUDA_R_16F : CUDA_R_16BF;
        r = batch == 1 ? bl->GemmEx(h, B->op, A->op, m, n, k, &one, B->data, t, (int)B->ld,
                                    A->data, t, (int)A->ld, &zero, C, t, m, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT)
                       : bl->GemmStridedBatchedEx(h, B->op, A->op, m, n, k, &one, B->data, t,
                                                  (int)B->ld, B->batch_stride, A->data, t, (int)A->ld,
                                                  A->batch_stride, &zero, C, t, m, M * N, (int)batch,
                                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    } else if (dt == EM_F32) {
        const float one = 1.0f, zero = 0.0f;
        r = batch == 1 ? bl->Sgemm(h, B->op, A->op, m, n, k, &one, B->data, (int)B->ld, A->data,
                                   (int)A->ld, &zero, C, m)
                       : bl->SgemmStridedBatched(h, B->op, A->op, m, n, k, &one, B->data,
                                                 (int)B->ld, B->batch_stride, A->data, (int)A->ld,
                                                 A->batch_stride, &zero, C, m, M * N, (int)batch);
    } else {
        const double one = 1.0, zero = 0.0;
        r = batch == 1 ? bl->Dgemm(h, B->op, A->op, m, n, k, &one, B->data, (int)B->ld, A->data,
                                   (int)A->ld, &zero, C, m)
                       : bl->DgemmStridedBatched(h, B->op, A->op, m, n, k, &one, B->data,
                                                 (int)B->ld, B->batch_stride, A->data, (int)A->ld,
                                                 A->batch_stride, &zero, C, m, M * N, (int)batch);
    }
    if (r != CUBLAS_STATUS_SUCCESS)
        return em_error(EM_ERR_DEVICE, "cuda:%d: cuBLAS gemm failed (status %d)", d->index, (int)r);
    return EM_OK;
}

/* A contiguous copy of t made with the CUDA kernel, outside any recording
 * (this runs inside an op the hook has already seen). */
static em_tensor *contiguous_copy(const em_tensor *t) {
    em_dispatch_hook saved = em_set_dispatch_hook((em_dispatch_hook){0});
    em_meta m;
    memset(&m, 0, sizeof m);
    m.ndim = t->ndim;
    memcpy(m.sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
    m.dtype = t->dtype;
    m.device = t->device;
    em_tensor *in[1] = {(em_tensor *)t};
    em_op_call c = {EM_OP_CONTIGUOUS, 1, in, &(em_op_attrs){0}};
    em_tensor *r = em_dispatch_eager(&c, &m);
    em_set_dispatch_hook(saved);
    return r;
}

em_status cuda_matmul(cuda_device *d, const em_op_call *c, em_tensor *out) {
    const em_tensor *a = c->in[0], *b = c->in[1];
    if (out->dtype != EM_F32 && out->dtype != EM_F64 && out->dtype != EM_F16 && out->dtype != EM_BF16)
        return em_error(EM_ERR_UNSUPPORTED, "matmul on CUDA: %s", em_dtype_name(out->dtype));
    int nb = out->ndim - 2;
    int64_t M = out->sizes[nb], N = out->sizes[nb + 1], K = a->sizes[a->ndim - 1];
    if (K == 0) return em_error(EM_ERR_UNSUPPORTED, "matmul on CUDA: K = 0");
    int64_t batch = 1;
    for (int i = 0; i < nb; i++) batch *= out->sizes[i];
    const cublas_api *bl = cuda_cublas();
    if (!bl) return em_last_status();
    cublasHandle_t h;
    em_status s = blas_handle(d, bl, &h);
    if (s != EM_OK) return s;
    em_scope_begin();
    mm_operand A, B;
    if (!operand(a, nb, out->sizes, &A)) {
        a = contiguous_copy(a);
        if (!a || !operand(a, nb, out->sizes, &A)) s = a ? em_error(EM_ERR_UNSUPPORTED, "matmul: layout of a") : em_last_status();
    }
    if (s == EM_OK && !operand(b, nb, out->sizes, &B)) {
        b = contiguous_copy(b);
        if (!b || !operand(b, nb, out->sizes, &B)) s = b ? em_error(EM_ERR_UNSUPPORTED, "matmul: layout of b") : em_last_status();
    }
    if (s == EM_OK) s = gemm(d, h, bl, out->dtype, &A, &B, em_data(out), M, N, K, batch);
    em_scope_end(); /* the copies are freed in stream order: the gemm is queued first */
    return s;
}

/* ---- linear through cuBLASLt: the bias and activation in the epilogue ----
 *
 * act(a @ w + bias) is one cublasLtMatmul whose epilogue adds the bias
 * (a vector along D's rows: the column-major view's rows are the result's
 * columns) and applies relu or gelu (the tanh form, as Ember's gelu_tanh),
 * so the product is written once instead of written, read back by the add
 * and written again.  Operands are used in place as for cuBLAS (describe,
 * batch_stride); a shared w (batch stride 0) over a whose batches follow
 * one another at M rows folds the batches into M (one larger gemm); other
 * batches run strided.  What does not fit, and a problem the heuristic has
 * no algorithm for, is EM_ERR_UNSUPPORTED: the caller then runs the matmul,
 * add and act unfused (never a wrong result).  The heuristic's answer is
 * kept per problem in a bounded table on the device, so a call costs no
 * query after the first. */

enum {
    LT_WORKSPACE = 32 << 20, /* bytes: what cuBLASLt's fastest Hopper kernels ask at most */
    LT_ALGOS = 256           /* problems whose answer the device keeps */
};

/* What the heuristic's answer depends on (zeroed first: compared with
 * memcmp). */
typedef struct lt_key {
    int32_t dtype, epilogue, compute, wop, aop, align;
    int64_t M, N, K, batch, ldw, lda, sw, sa;
} lt_key;

typedef struct lt_algo {
    lt_key key;
    bool found; /* false: the heuristic had none (the caller runs unfused) */
    cublasLtMatmulAlgo_t algo;
} lt_algo;

struct cuda_lt_algos {
    lt_algo e[LT_ALGOS];
    int n, next; /* entries used; the one the next new problem replaces when full */
};

bool cuda_lt_enabled(void) {
    char buf[8];
    const char *e = em_getenv("EMBER_CUDA_LT", buf, sizeof buf);
    return !e || strcmp(e, "0") != 0;
}

/* The largest power of two (at most 16) that every pointer is a multiple
 * of: the heuristic's algorithms depend on the operands' alignment. */
static int32_t alignment(const void *const *p, int n) {
    uintptr_t v = 16;
    for (int i = 0; i < n; i++) v |= (uintptr_t)p[i];
    return (int32_t)(v & -v);
}

static em_status lt_fail(const cuda_device *d, const cublaslt_api *lt, const char *what, cublasStatus_t r) {
    return em_error(EM_ERR_DEVICE, "cuda:%d: %s failed: %s", d->index, what, lt->GetStatusName(r));
}

/* One problem's descriptors: the matmul (compute type, transposes,
 * epilogue, bias) and the layouts of w, a and the result (C and D alike). */
typedef struct lt_desc {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t w, a, out;
} lt_desc;

static void lt_desc_free(const cublaslt_api *lt, lt_desc *x) {
    if (x->op) lt->MatmulDescDestroy(x->op);
    if (x->w) lt->MatrixLayoutDestroy(x->w);
    if (x->a) lt->MatrixLayoutDestroy(x->a);
    if (x->out) lt->MatrixLayoutDestroy(x->out);
}

/* A layout of rows x cols at ld, batch matrices stride apart. */
static cublasStatus_t lt_layout(const cublaslt_api *lt, cublasLtMatrixLayout_t *l, cudaDataType_t t, int64_t rows,
                                int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
    cublasStatus_t r = lt->MatrixLayoutCreate(l, t, (uint64_t)rows, (uint64_t)cols, ld);
    int32_t n = (int32_t)batch;
    if (r == CUBLAS_STATUS_SUCCESS && batch > 1)
        r = lt->MatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof n);
    if (r == CUBLAS_STATUS_SUCCESS && batch > 1)
        r = lt->MatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride);
    return r;
}

/* D^T[N, M] = W^T[N, K] A^T[K, M] (the column-major view of the row-major
 * product, as gemm's): cuBLASLt's A is w, its B is a. */
static cublasStatus_t lt_describe(const cublaslt_api *lt, const lt_key *k, const void *bias, lt_desc *x) {
    cudaDataType_t t = k->dtype == EM_F16 ? CUDA_R_16F : k->dtype == EM_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasOperation_t wop = (cublasOperation_t)k->wop, aop = (cublasOperation_t)k->aop;
    cublasLtEpilogue_t epi = (cublasLtEpilogue_t)k->epilogue;
    int32_t bt = (int32_t)t;
    cublasStatus_t r = lt->MatmulDescCreate(&x->op, (cublasComputeType_t)k->compute, CUDA_R_32F);
    if (r == CUBLAS_STATUS_SUCCESS)
        r = lt->MatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_TRANSA, &wop, sizeof wop);
    if (r == CUBLAS_STATUS_SUCCESS)
        r = lt->MatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_TRANSB, &aop, sizeof aop);
    if (r == CUBLAS_STATUS_SUCCESS)
        r = lt->MatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (r == CUBLAS_STATUS_SUCCESS)
        r = lt->MatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (r == CUBLAS_STATUS_SUCCESS)
        r = lt->MatmulDescSetAttribute(x->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
    bool wn = wop == CUBLAS_OP_N, an = aop == CUBLAS_OP_N;
    if (r == CUBLAS_STATUS_SUCCESS)
        r = lt_layout(lt, &x->w, t, wn ? k->N : k->K, wn ? k->K : k->N, k->ldw, k->batch, k->sw);
    if (r == CUBLAS_STATUS_SUCCESS)
        r = lt_layout(lt, &x->a, t, an ? k->K : k->M, an ? k->M : k->K, k->lda, k->batch, k->sa);
    if (r == CUBLAS_STATUS_SUCCESS) r = lt_layout(lt, &x->out, t, k->N, k->M, k->N, k->batch, k->M * k->N);
    return r;
}

/* The device's answer for k (d->lt_lock held): its slot, asked of the
 * heuristic the first time; NULL with the error set. */
static const lt_algo *lt_algo_for(cuda_device *d, const cublaslt_api *lt, const lt_key *k, lt_desc *x) {
    struct cuda_lt_algos *t = d->lt_algos;
    for (int i = 0; i < t->n; i++)
        if (!memcmp(&t->e[i].key, k, sizeof *k)) return &t->e[i];
    cublasLtMatmulPreference_t pref = NULL;
    size_t ws = LT_WORKSPACE;
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t r = lt->MatmulPreferenceCreate(&pref);
    if (r == CUBLAS_STATUS_SUCCESS)
        r = lt->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
    /* split-K partials reduced in f32 only: the in-place and output-type
     * schemes add them in the output's type, and a half output then
     * rounds sums far larger than the result (bf16 gelu_tanh results
     * 0.03 off at K = 1000 on the H200, 9 ulps of a value near 0.6) */
    uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    if (r == CUBLAS_STATUS_SUCCESS && k->dtype != EM_F32 && k->dtype != EM_F64)
        r = lt->MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes,
                                             sizeof schemes);
    if (r == CUBLAS_STATUS_SUCCESS)
        r = lt->MatmulAlgoGetHeuristic(d->lt, x->op, x->w, x->a, x->out, x->out, pref, 1, &res, &found);
    if (pref) lt->MatmulPreferenceDestroy(pref);
    if (r != CUBLAS_STATUS_SUCCESS && r != CUBLAS_STATUS_NOT_SUPPORTED) {
        lt_fail(d, lt, "cublasLtMatmulAlgoGetHeuristic", r);
        return NULL;
    }
    int i = t->n < LT_ALGOS ? t->n++ : t->next++ % LT_ALGOS;
    t->e[i].key = *k;
    t->e[i].found = r == CUBLAS_STATUS_SUCCESS && found > 0 && res.state == CUBLAS_STATUS_SUCCESS;
    if (t->e[i].found) t->e[i].algo = res.algo;
    return &t->e[i];
}

/* The handle, workspace and table of d (d->lt_lock held), made at the
 * first call; never while the thread captures a graph (the workspace
 * would be the graph's). */
static em_status lt_ready(cuda_device *d, const cublaslt_api *lt) {
    if (d->lt && d->lt_workspace && d->lt_algos) return EM_OK;
    if (cuda_capturing(d)) return em_error(EM_ERR_UNSUPPORTED, "cuBLASLt is set up outside a graph capture");
    cublasStatus_t r = d->lt ? CUBLAS_STATUS_SUCCESS : lt->Create(&d->lt);
    if (r != CUBLAS_STATUS_SUCCESS) return lt_fail(d, lt, "cublasLtCreate", r);
    if (!d->lt_workspace) {
        em_status s = cuda_check(cuda_driver()->MemAlloc(&d->lt_workspace, LT_WORKSPACE), "cuMemAlloc");
        if (s != EM_OK) return s;
    }
    if (!d->lt_algos && !(d->lt_algos = em_calloc(1, sizeof *d->lt_algos)))
        return em_error(EM_ERR_NOMEM, "cuda:%d: out of memory for cuBLASLt's algorithms", d->index);
    return EM_OK;
}

/* cuBLASLt, or NULL (error set); the first miss on d is logged. */
static const cublaslt_api *lt_api(cuda_device *d) {
    const cublaslt_api *lt = cuda_cublaslt();
    if (lt) return lt;
    pthread_mutex_lock(&d->lt_lock);
    bool said = d->lt_said;
    d->lt_said = true;
    pthread_mutex_unlock(&d->lt_lock);
    if (!said)
        jit_logf(cuda_eager_log(), JIT_LOG_CODE, "cuda:%d: %s: linear layers run as gemm, then bias and act",
                 d->index, em_last_error());
    return NULL;
}

/* Whether cuBLASLt's epilogues apply act: gelu's erf form is not among
 * them (theirs is the tanh form), so such a linear runs unfused. */
static bool lt_has_act(em_act act) {
    return act == EM_ACT_NONE || act == EM_ACT_RELU || act == EM_ACT_GELU_TANH;
}

static int32_t lt_epilogue(em_act act) {
    return act == EM_ACT_RELU ? CUBLASLT_EPILOGUE_RELU_BIAS
           : act == EM_ACT_GELU_TANH ? CUBLASLT_EPILOGUE_GELU_BIAS
                                     : CUBLASLT_EPILOGUE_BIAS;
}

/* The problem c (a linear) is on out, in k; false when its operands do
 * not fit (their layouts, out not contiguous, the bias not a contiguous
 * vector, K = 0, sizes past int32 where cuBLASLt needs them). */
static bool lt_problem(const em_op_call *c, const em_tensor *out, lt_key *k, mm_operand *A, mm_operand *W) {
    const em_tensor *a = c->in[0], *w = c->in[1], *bias = c->in[2];
    int nb = out->ndim - 2;
    memset(k, 0, sizeof *k);
    if (nb < 0 || a->ndim < 2 || w->ndim < 2) return false;
    k->M = out->sizes[nb], k->N = out->sizes[nb + 1], k->K = a->sizes[a->ndim - 1];
    k->batch = 1;
    for (int i = 0; i < nb; i++) k->batch *= out->sizes[i];
    if (k->K == 0 || k->batch > INT32_MAX || !em_is_contiguous(out) || bias->dtype != out->dtype ||
        (k->N > 1 && bias->strides[bias->ndim - 1] != 1) || !operand(a, nb, out->sizes, A) ||
        !operand(w, nb, out->sizes, W))
        return false;
    if (k->batch > 1 && W->batch_stride == 0 && A->op == CUBLAS_OP_N && A->batch_stride == k->M * A->ld) {
        k->M *= k->batch; /* a's batches are one run of rows: one gemm */
        k->batch = 1;
    }
    const void *p[4] = {A->data, W->data, em_data(out), em_data(bias)};
    k->dtype = out->dtype;
    k->epilogue = lt_epilogue(c->attrs->act);
    k->compute = out->dtype == EM_F32 && cuda_tf32_enabled() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    k->wop = W->op, k->aop = A->op, k->align = alignment(p, 4);
    k->ldw = W->ld, k->lda = A->ld;
    k->sw = k->batch > 1 ? W->batch_stride : 0, k->sa = k->batch > 1 ? A->batch_stride : 0;
    return true;
}

/* Runs k (d->lt_lock held: the table's slot is read under it). */
static em_status lt_run(cuda_device *d, const cublaslt_api *lt, const lt_key *k, const mm_operand *A,
                        const mm_operand *W, const void *bias, void *out) {
    lt_desc x = {0};
    cublasStatus_t r = lt_describe(lt, k, bias, &x);
    em_status s = r == CUBLAS_STATUS_SUCCESS ? EM_OK : lt_fail(d, lt, "cuBLASLt's descriptors", r);
    const lt_algo *al = s == EM_OK ? lt_algo_for(d, lt, k, &x) : NULL;
    if (s == EM_OK && !al) s = em_last_status();
    if (s == EM_OK && !al->found) s = em_error(EM_ERR_UNSUPPORTED, "cuBLASLt has no algorithm for this linear");
    const float one = 1.0f, zero = 0.0f;
    if (s == EM_OK) {
        r = lt->Matmul(d->lt, x.op, &one, W->data, x.w, A->data, x.a, &zero, out, x.out, out, x.out, &al->algo,
                       (void *)(uintptr_t)d->lt_workspace, LT_WORKSPACE, (cudaStream_t)cuda_stream(d));
        if (r != CUBLAS_STATUS_SUCCESS) s = lt_fail(d, lt, "cublasLtMatmul", r);
        else d->lt_calls++;
    }
    lt_desc_free(lt, &x);
    return s;
}

em_status cuda_linear(cuda_device *d, const em_op_call *c, em_tensor *out) {
    if (c->op != EM_OP_LINEAR || !lt_has_act(c->attrs->act) ||
        (out->dtype != EM_F32 && out->dtype != EM_F16 && out->dtype != EM_BF16) || !cuda_lt_enabled())
        return em_error(EM_ERR_UNSUPPORTED, "linear on cuBLASLt: %s", em_dtype_name(out->dtype));
    lt_key k;
    mm_operand A, W;
    if (!lt_problem(c, out, &k, &A, &W)) return em_error(EM_ERR_UNSUPPORTED, "linear on cuBLASLt: layout");
    const cublaslt_api *lt = lt_api(d);
    if (!lt) return em_error(EM_ERR_UNSUPPORTED, "no cuBLASLt");
    pthread_mutex_lock(&d->lt_lock);
    em_status s = lt_ready(d, lt);
    if (s == EM_OK) s = lt_run(d, lt, &k, &A, &W, em_data(c->in[2]), em_data(out));
    pthread_mutex_unlock(&d->lt_lock);
    return s;
}

bool cuda_linear_takes(const em_meta *a, const em_meta *w, const em_meta *bias, em_act act) {
    em_dtype dt = a->dtype;
    if (!lt_has_act(act) || (dt != EM_F32 && dt != EM_F16 && dt != EM_BF16) || w->dtype != dt ||
        bias->dtype != dt || a->ndim < 2 || w->ndim < 2 || !cuda_lt_enabled())
        return false;
    if (cuda_cublaslt()) return true;
    em_clear_error();
    return false;
}

#endif /* EMBER_HAVE_CUDA */
