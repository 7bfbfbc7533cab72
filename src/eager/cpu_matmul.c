/* cpu_matmul.c - batched matrix product on CPU.
 *
 * in[0] [..., M, K] @ in[1] [..., K, N] -> out [batch..., M, N] (contiguous),
 * batch dims broadcast (a missing or size-1 batch dim reads with stride 0).
 * f32/f64 go through the BLAS of cpu_blas.c (em_sgemm, em_dgemm), reading
 * each operand in place when one of its two matrix strides is 1 (as
 * is, or transposed) and the other a valid leading dimension; otherwise the
 * operand is first copied contiguous (its distinct batches only).  Integers
 * use plain loops with wrapping (modular) accumulation, which gives the same
 * bits as accumulating in int64. */
#include "cpu.h"
#include "vmath.h" /* em_vgelu_tanhf: a linear layer's epilogue */

#include <limits.h>
#include <string.h>

/* Below this many multiply-adds per product a batch's products run in
 * parallel across the batch rather than each split over the threads. */
#define MM_SMALL 65536

typedef struct operand {
    const char *data;
    int64_t bst[EM_MAX_DIMS]; /* batch strides (elements), aligned to out's batch dims */
    int64_t rs, cs;           /* matrix row and column strides (elements) */
    int64_t rows, cols;
    bool trans;               /* BLAS reads it transposed */
    int64_t ld;               /* BLAS leading dimension */
    void *tmp;                /* a contiguous copy we own, or NULL */
} operand;

static void operand_init(operand *op, const em_tensor *t, int nb, const int64_t *bsz) {
    int nd = t->ndim;
    op->data = em_data(t);
    op->rows = t->sizes[nd - 2];
    op->cols = t->sizes[nd - 1];
    op->rs = t->strides[nd - 2];
    op->cs = t->strides[nd - 1];
    int tb = nd - 2; /* t's batch dims, aligned right */
    for (int d = 0; d < nb; d++) {
        int td = d - (nb - tb);
        op->bst[d] = td >= 0 && t->sizes[td] != 1 && bsz[d] != 1 ? t->strides[td] : 0;
    }
    op->tmp = NULL;
}

/* Whether BLAS can read the matrix in place; sets trans and ld. */
static bool blas_layout(operand *op) {
    int64_t r = op->rows, c = op->cols;
    int64_t mr = r > 1 ? r : 1, mc = c > 1 ? c : 1;
    if ((c == 1 || op->cs == 1) && (r == 1 || op->rs >= mc)) {
        op->trans = false;
        op->ld = r == 1 ? mc : op->rs;
    } else if ((r == 1 || op->rs == 1) && (c == 1 || op->cs >= mr)) {
        op->trans = true;
        op->ld = c == 1 ? mr : op->cs;
    } else {
        return false;
    }
    return op->ld <= INT_MAX;
}

/* Copies t's distinct data (broadcast batch dims taken once) into a
 * contiguous buffer and points op at it; a half t (f16, bf16) is converted
 * to f32 on the way, a row at a time (em_half_to_f32_n). */
static em_status operand_copy(operand *op, const em_tensor *t, int nb, const int64_t *bsz) {
    int nd = t->ndim, tb = nd - 2;
    bool half = em_is_half(t->dtype);
    int64_t tsz = (int64_t)em_dtype_size(t->dtype), esz = half ? 4 : tsz;
    int64_t sz[EM_MAX_DIMS], st[EM_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        bool bcast = d < tb && (t->sizes[d] == 1 || t->strides[d] == 0);
        sz[d] = bcast ? 1 : t->sizes[d];
        st[d] = t->strides[d];
    }
    int64_t n = em_shape_numel(nd, sz);
    char *buf = em_malloc((size_t)(n > 0 ? n : 1) * (size_t)esz);
    if (!buf) return em_error(EM_ERR_NOMEM, "matmul: out of memory (%lld elements)", (long long)n);
    /* strided copy, innermost dim in a loop */
    const char *src = em_data(t);
    int64_t idx[EM_MAX_DIMS] = {0}, off = 0, last = sz[nd - 1], lst = st[nd - 1];
    char *dst = buf;
    for (int64_t r = 0, nrun = last ? n / last : 0; r < nrun; r++) {
        if (half)
            em_half_to_f32_n(t->dtype, src + off * tsz, lst * tsz, (float *)dst, last);
        else if (esz == 4)
            for (int64_t i = 0; i < last; i++)
                ((uint32_t *)dst)[i] = ((const uint32_t *)src)[off + i * lst];
        else
            for (int64_t i = 0; i < last; i++)
                ((uint64_t *)dst)[i] = ((const uint64_t *)src)[off + i * lst];
        dst += last * esz;
        for (int d = nd - 2; d >= 0; d--) {
            off += st[d];
            if (++idx[d] < sz[d]) break;
            off -= st[d] * sz[d];
            idx[d] = 0;
        }
    }
    /* the copy's strides */
    int64_t cst[EM_MAX_DIMS];
    em_contiguous_strides(nd, sz, cst);
    em_free(op->tmp); /* a second copy (never needed in practice) replaces the first */
    op->tmp = buf;
    op->data = buf;
    op->rs = cst[nd - 2];
    op->cs = cst[nd - 1];
    for (int d = 0; d < nb; d++) {
        int td = d - (nb - tb);
        op->bst[d] = td >= 0 && sz[td] != 1 && bsz[d] != 1 ? cst[td] : 0;
    }
    return EM_OK;
}

typedef struct mmctx {
    operand a, b;
    const em_tensor *a_t, *b_t; /* the operands' tensors */
    char *c;
    em_dtype dt;                /* the operands'; bf16: c is f32 (em_bf16gemm) */
    int64_t esz, M, N, K;       /* esz: bytes of an element of c */
    int nb;
    int64_t bsz[EM_MAX_DIMS];
    int64_t nbatch;
    const float *bias; /* f32 c only: a linear layer's bias [N] (NULL: none), */
    em_act act;        /* then its activation, applied a piece at a time */
    const uint16_t *hbias; /* f16/bf16 out: its bias [N], applied with act as
                              the f32 product is rounded into out (NULL: none) */
} mmctx;

/* A linear layer's epilogue on rows x n of f32 c (row stride ldc) just
 * written by the BLAS, while they are in cache: + bias[j], then act, each
 * as the eager add and relu / gelu_tanh / gelu compute it (the same bits
 * as the three ops one after another). */
EM_VMATH_CLONES static void epilogue(float *c, int64_t ldc, int64_t rows, int64_t n,
                                     const float *bias, em_act act) {
    for (int64_t r = 0; r < rows; r++) {
        float *restrict row = c + r * ldc;
        const float *restrict b = bias;
        if (act == EM_ACT_RELU)
            EM_SIMD for (int64_t j = 0; j < n; j++) {
                float v = row[j] + b[j];
                row[j] = v < 0 ? 0 : v;
            }
        else if (act == EM_ACT_GELU_TANH)
            EM_SIMD for (int64_t j = 0; j < n; j++) row[j] = em_vgelu_tanhf(row[j] + b[j]);
        else if (act == EM_ACT_GELU)
            EM_SIMD for (int64_t j = 0; j < n; j++) row[j] = em_vgeluf(row[j] + b[j]);
        else
            EM_SIMD for (int64_t j = 0; j < n; j++) row[j] += b[j];
    }
}

/* Element offsets of batch bi in a and b. */
static void batch_offsets(const mmctx *X, int64_t bi, int64_t *ao, int64_t *bo) {
    *ao = *bo = 0;
    for (int d = X->nb - 1; d >= 0; d--) {
        int64_t i = bi % X->bsz[d];
        bi /= X->bsz[d];
        *ao += i * X->a.bst[d];
        *bo += i * X->b.bst[d];
    }
}

/* One BLAS product of X's dtype: m x k times k x n at element offsets ao,
 * bo of a and b into c (row stride ldc). */
static void gemm_one(const mmctx *X, int M, int N, int K, int64_t ao, int64_t bo, char *c, int ldc) {
    bool ta = X->a.trans, tb = X->b.trans;
    int lda = (int)X->a.ld, ldb = (int)X->b.ld;
    if (X->dt == EM_F32)
        em_sgemm(ta, tb, M, N, K, 1.0f, (const float *)X->a.data + ao, lda,
                 (const float *)X->b.data + bo, ldb, 0.0f, (float *)c, ldc);
    else if (X->dt == EM_BF16)
        em_bf16gemm(ta, tb, M, N, K, 1.0f, (const uint16_t *)X->a.data + ao, lda,
                    (const uint16_t *)X->b.data + bo, ldb, 0.0f, (float *)c, ldc);
    else
        em_dgemm(ta, tb, M, N, K, 1.0, (const double *)X->a.data + ao, lda,
                 (const double *)X->b.data + bo, ldb, 0.0, (double *)c, ldc);
}

static void gemm_batches(void *ctx, int64_t b, int64_t e) {
    const mmctx *X = ctx;
    int ldc = X->N > 1 ? (int)X->N : 1;
    for (int64_t bi = b; bi < e; bi++) {
        int64_t ao, bo;
        batch_offsets(X, bi, &ao, &bo);
        char *c = X->c + bi * X->M * X->N * X->esz;
        gemm_one(X, (int)X->M, (int)X->N, (int)X->K, ao, bo, c, ldc);
        if (X->bias) epilogue((float *)c, ldc, X->M, X->N, X->bias, X->act);
    }
}

/* One gemm of a single batch, split over Ember's threads: by rows of C
 * when there are enough, else by columns.  Pieces are [b, e) of that dim. */
static void gemm_piece(const mmctx *X, bool by_rows, int64_t b, int64_t e) {
    int M = (int)X->M, N = (int)X->N, ldc = N > 1 ? N : 1;
    int64_t ao = 0, bo = 0, co;
    if (by_rows) { /* rows b..e of A (a column offset when A is transposed) */
        ao = X->a.trans ? b : b * X->a.ld;
        co = b * ldc;
        M = (int)(e - b);
    } else {       /* columns b..e of B */
        bo = X->b.trans ? b * X->b.ld : b;
        co = b;
        N = (int)(e - b);
    }
    gemm_one(X, M, N, (int)X->K, ao, bo, X->c + co * X->esz, ldc);
    if (X->bias) epilogue((float *)X->c + co, ldc, M, N, X->bias + (by_rows ? 0 : b), X->act);
}

static void gemm_rows(void *ctx, int64_t b, int64_t e) { gemm_piece(ctx, true, b, e); }
static void gemm_cols(void *ctx, int64_t b, int64_t e) { gemm_piece(ctx, false, b, e); }

/* Plain loops over rows (batch, i) of the output: c[i, :] += a[i, k] * b[k, :].
 * Integers wrap (unsigned arithmetic); floats (only for sizes BLAS cannot
 * take) accumulate in the output's type. */
#define LOOP_ROWS(NAME, T, U)                                                             \
    static void NAME(void *ctx, int64_t b, int64_t e) {                                    \
        const mmctx *X = ctx;                                                              \
        int64_t N = X->N, K = X->K;                                                        \
        for (int64_t row = b; row < e; row++) {                                            \
            int64_t bi = row / X->M, i = row % X->M, ao, bo;                               \
            batch_offsets(X, bi, &ao, &bo);                                                \
            const T *A = (const T *)X->a.data + ao + i * X->a.rs;                          \
            const T *B = (const T *)X->b.data + bo;                                        \
            U *C = (U *)X->c + row * N;                                                    \
            for (int64_t j = 0; j < N; j++) C[j] = 0;                                      \
            for (int64_t k = 0; k < K; k++) {                                              \
                U av = (U)A[k * X->a.cs];                                                  \
                const T *Bk = B + k * X->b.rs;                                             \
                if (X->b.cs == 1)                                                          \
                    for (int64_t j = 0; j < N; j++) C[j] += av * (U)Bk[j];                 \
                else                                                                       \
                    for (int64_t j = 0; j < N; j++) C[j] += av * (U)Bk[j * X->b.cs];       \
            }                                                                              \
        }                                                                                  \
    }
LOOP_ROWS(rows_i32, int32_t, uint32_t)
LOOP_ROWS(rows_i64, int64_t, uint64_t)
LOOP_ROWS(rows_f32, float, float)
LOOP_ROWS(rows_f64, double, double)

/* x[.., M, K] @ w[K, N] with w shared by every batch, and x's batches one
 * after another at M rows apart (a contiguous activation times a weight):
 * one gemm of nbatch * M rows instead of nbatch gemms.  The BLAS packs w
 * once rather than once a batch, which cost as much as the multiply itself
 * for MiniLM's 24-token sentences.  C is contiguous, so its rows line up. */
static bool fold_batches(mmctx *X) {
    if (X->nbatch <= 1 || X->a.trans) return false;
    int64_t step = X->M * X->a.ld;
    for (int d = X->nb - 1; d >= 0; d--) {
        if (X->bsz[d] == 1) continue;
        if (X->b.bst[d] != 0 || X->a.bst[d] != step) return false;
        step *= X->bsz[d];
    }
    if (X->nbatch * X->M > INT_MAX) return false;
    X->M *= X->nbatch;
    X->nbatch = 1;
    return true;
}

/* The multiplication X describes (operands set up, X->c the output),
 * copying an operand BLAS cannot read in place (a, b: the tensors). */
static em_status run_gemm(mmctx *X, const em_tensor *a, const em_tensor *b) {
    em_status st = EM_OK;
    em_range_fn rows = NULL;
    if (X->dt == EM_I32) rows = rows_i32;
    if (X->dt == EM_I64) rows = rows_i64;
    bool blas = rows == NULL && X->M <= INT_MAX && X->N <= INT_MAX && X->K <= INT_MAX;
    /* bf16 operands come here only in place, with em_bf16gemm ready */
    blas = blas && (X->dt == EM_BF16 || em_blas_ready(X->dt));
    if (rows == NULL && !blas) rows = X->dt == EM_F32 ? rows_f32 : rows_f64;

    if (blas) {
        if (!blas_layout(&X->a)) {
            st = operand_copy(&X->a, a, X->nb, X->bsz);
            if (st == EM_OK && !blas_layout(&X->a)) blas = false;
        }
        if (st == EM_OK && !blas_layout(&X->b)) {
            st = operand_copy(&X->b, b, X->nb, X->bsz);
            if (st == EM_OK && !blas_layout(&X->b)) blas = false;
        }
        if (st == EM_OK && !blas) rows = X->dt == EM_F32 ? rows_f32 : rows_f64;
        if (st == EM_OK && blas) fold_batches(X);
    }
    if (st == EM_OK) {
        if (blas) {
            int64_t mnk = X->M * X->N * X->K;
            if (X->nbatch > 1) {
                int64_t grain = mnk < MM_SMALL ? MM_SMALL / mnk : 1;
                em_parallel_for(X->nbatch, grain > 0 ? grain : 1, gemm_batches, X);
            } else if (X->M >= X->N) { /* pieces of at least 16 rows and ~64K multiply-adds */
                int64_t grain = MM_SMALL / (X->N * X->K > 0 ? X->N * X->K : 1);
                em_parallel_for(X->M, grain > 16 ? grain : 16, gemm_rows, X);
            } else {
                int64_t grain = MM_SMALL / (X->M * X->K > 0 ? X->M * X->K : 1);
                em_parallel_for(X->N, grain > 16 ? grain : 16, gemm_cols, X);
            }
        } else {
            int64_t work = X->N * X->K;
            int64_t grain = work > 0 ? EM_PARALLEL_GRAIN / work : 1;
            em_parallel_for(X->nbatch * X->M, grain > 0 ? grain : 1, rows, X);
            if (X->bias) epilogue((float *)X->c, X->N, X->nbatch * X->M, X->N, X->bias, X->act);
        }
    }
    return st;
}

/* A half linear layer's epilogue on n values of one row: the f32 product
 * c rounded into out as the eager matmul rounds it, + bias, rounded, then
 * act, rounded: each step as the eager matmul, add and act compute it on
 * half tensors (f32 arithmetic, one rounding a result), so the same bits
 * as the three ops.  TO rounds a float to the half type, FROM widens. */
#define HALF_EPILOGUE(NAME, TO, FROM)                                                            \
    EM_VMATH_CLONES static void NAME(const float *restrict c, const uint16_t *restrict b,       \
                                     em_act act, uint16_t *restrict o, int64_t n) {             \
        if (act == EM_ACT_RELU)                                                                  \
            EM_SIMD for (int64_t j = 0; j < n; j++) {                                            \
                float v = FROM(TO(FROM(TO(c[j])) + FROM(b[j])));                                 \
                o[j] = TO(v < 0 ? 0 : v);                                                        \
            }                                                                                    \
        else if (act == EM_ACT_GELU_TANH)                                                        \
            EM_SIMD for (int64_t j = 0; j < n; j++)                                              \
                o[j] = TO(em_vgelu_tanhf(FROM(TO(FROM(TO(c[j])) + FROM(b[j])))));               \
        else if (act == EM_ACT_GELU)                                                             \
            EM_SIMD for (int64_t j = 0; j < n; j++)                                              \
                o[j] = TO(em_vgeluf(FROM(TO(FROM(TO(c[j])) + FROM(b[j])))));                    \
        else                                                                                     \
            EM_SIMD for (int64_t j = 0; j < n; j++) o[j] = TO(FROM(TO(c[j])) + FROM(b[j]));      \
    }
HALF_EPILOGUE(epilogue_bf16, em_float_to_bf16, em_bf16_to_float)
HALF_EPILOGUE(epilogue_f16, em_float_to_half, em_half_to_float)

typedef struct half_out {
    const mmctx *X;
    const float *c32;
    uint16_t *out;
    em_dtype dt;
} half_out;

/* Rows [b, e) of the f32 product into out: rounded, or through the half
 * epilogue when the linear layer has a bias. */
static void half_rows(void *ctx, int64_t b, int64_t e) {
    const half_out *H = ctx;
    int64_t N = H->X->N;
    for (int64_t r = b; r < e; r++) {
        const float *c = H->c32 + r * N;
        uint16_t *o = H->out + r * N;
        if (!H->X->hbias)
            em_f32_to_half_n(H->dt, c, (char *)o, 2, N);
        else if (H->dt == EM_BF16)
            epilogue_bf16(c, H->X->hbias, H->X->act, o, N);
        else
            epilogue_f16(c, H->X->hbias, H->X->act, o, N);
    }
}

/* f16 and bf16: one product with f32 accumulation into an f32 buffer,
 * each element of it rounded into out once (with a linear layer's bias
 * and act, half_rows), rows split over Ember's threads.  bf16 operands that the BLAS
 * reads in place go to its bf16 gemm where there is one (em_bf16gemm:
 * oneDNN on AVX-512, AMX); otherwise both operands are converted to f32
 * once (operand_copy: whole rows through em_half_to_f32_n, never element
 * by element calls) for the f32 product (BLAS sgemm). */
static em_status matmul_half(mmctx *X, em_tensor *out) {
    const em_tensor *a = X->a_t, *b = X->b_t;
    int64_t numel = X->nbatch * X->M * X->N;
    /* K = 0: a product of zeros, which the epilogue still reads */
    float *c32 = X->K ? em_malloc((size_t)numel * sizeof(float)) : em_calloc((size_t)numel, sizeof(float));
    if (!c32) return em_error(EM_ERR_NOMEM, "matmul: out of memory (%lld elements)", (long long)numel);
    bool bf16 = out->dtype == EM_BF16 && X->M <= INT_MAX && X->N <= INT_MAX && X->K <= INT_MAX &&
                em_bf16gemm_ready() && blas_layout(&X->a) && blas_layout(&X->b);
    X->dt = bf16 ? EM_BF16 : EM_F32;
    X->esz = 4;
    X->c = (char *)c32;
    em_status st = EM_OK;
    if (X->K && !bf16) st = operand_copy(&X->a, a, X->nb, X->bsz);
    if (X->K && st == EM_OK && !bf16) st = operand_copy(&X->b, b, X->nb, X->bsz);
    if (X->K && st == EM_OK) st = run_gemm(X, a, b);
    if (st == EM_OK) {
        half_out H = {X, c32, (uint16_t *)em_data(out), out->dtype};
        int64_t rows = X->nbatch * X->M;
        int64_t grain = EM_PARALLEL_GRAIN / (X->N > 0 ? X->N : 1);
        em_parallel_for(rows, grain > 0 ? grain : 1, half_rows, &H);
    }
    em_free(c32);
    return st;
}

/* out = a @ b, then with bias ([N] contiguous of out's dtype; NULL: none)
 * the linear epilogue: + bias and act; f32 a piece at a time as the BLAS
 * writes it, f16/bf16 as the f32 product is rounded into out. */
static em_status matmul_into(const em_tensor *a, const em_tensor *b, em_tensor *out,
                             const void *bias, em_act act) {
    if (a->ndim < 2 || b->ndim < 2 || out->ndim < 2)
        return em_error(EM_ERR_SHAPE, "matmul: operands must have at least 2 dims");
    mmctx X;
    bool half = out->dtype == EM_F16 || out->dtype == EM_BF16;
    X.bias = half ? NULL : bias;
    X.hbias = half ? bias : NULL;
    X.act = act;
    X.a_t = a;
    X.b_t = b;
    X.nb = out->ndim - 2;
    X.M = out->sizes[X.nb];
    X.N = out->sizes[X.nb + 1];
    X.K = a->sizes[a->ndim - 1];
    X.dt = out->dtype;
    X.esz = (int64_t)em_dtype_size(out->dtype);
    if (a->dtype != X.dt || b->dtype != X.dt)
        return em_error(EM_ERR_DTYPE, "matmul: operands must have the output's dtype");
    if (b->sizes[b->ndim - 2] != X.K || a->sizes[a->ndim - 2] != X.M ||
        b->sizes[b->ndim - 1] != X.N)
        return em_error(EM_ERR_SHAPE, "matmul: operand sizes do not match the output");
    X.nbatch = 1;
    for (int d = 0; d < X.nb; d++) {
        X.bsz[d] = out->sizes[d];
        X.nbatch *= X.bsz[d];
    }
    int64_t numel = X.nbatch * X.M * X.N;
    if (numel == 0) return EM_OK;
    X.c = em_data(out);
    if (X.K == 0 && !half) {
        memset(X.c, 0, (size_t)(numel * X.esz));
        if (bias) epilogue((float *)X.c, X.N, X.nbatch * X.M, X.N, bias, act);
        return EM_OK;
    }
    operand_init(&X.a, a, X.nb, X.bsz);
    operand_init(&X.b, b, X.nb, X.bsz);
    em_status st;
    switch (X.dt) {
    case EM_I32:
    case EM_I64:
    case EM_F32:
    case EM_F64: st = run_gemm(&X, a, b); break;
    case EM_F16:
    case EM_BF16: st = matmul_half(&X, out); break;
    default:
        return em_error(EM_ERR_DTYPE, "matmul: dtype %s is not supported", em_dtype_name(X.dt));
    }
    em_free(X.a.tmp);
    em_free(X.b.tmp);
    return st;
}

em_status cpu_matmul(const em_op_call *c, em_tensor *out) {
    return matmul_into(c->in[0], c->in[1], out, NULL, EM_ACT_NONE);
}

/* Whether bias holds n values of dtype dt one after another: sizes 1 but
 * the last, n, read with stride 1 (or n = 1). */
static bool contiguous_row_bias(const em_tensor *bias, em_dtype dt, int64_t n) {
    if (bias->dtype != dt || bias->ndim < 1 || bias->sizes[bias->ndim - 1] != n) return false;
    for (int d = 0; d < bias->ndim - 1; d++)
        if (bias->sizes[d] != 1) return false;
    return n <= 1 || bias->strides[bias->ndim - 1] == 1;
}

/* act(a @ w + bias).  f32, f16 or bf16 with a contiguous bias: the bias
 * and act applied to each piece of the product as the BLAS writes it, in
 * cache (f32: epilogue()), or as the product is rounded into out (half:
 * half_rows()), the same bits as the three ops; otherwise the product, then the bias
 * added in place by add's own kernel, then the activation in place by its
 * own.  The linear pass makes the node (src/trace/linear.c). */
em_status cpu_linear(const em_op_call *c, em_tensor *out) {
    em_act act = c->attrs->act;
    if ((unsigned)act >= EM_ACT_COUNT)
        return em_error(EM_ERR_ARG, "linear: activation %d is not none, relu, gelu_tanh or gelu", (int)act);
    em_dtype dt = out->dtype;
    if ((dt == EM_F32 || dt == EM_F16 || dt == EM_BF16) && out->ndim >= 2 &&
        contiguous_row_bias(c->in[2], dt, out->sizes[out->ndim - 1]))
        return matmul_into(c->in[0], c->in[1], out, em_data(c->in[2]), act);
    em_op_call mm = {.op = EM_OP_MATMUL, .nin = 2, .in = c->in, .attrs = c->attrs};
    em_status s = cpu_matmul(&mm, out);
    if (s != EM_OK) return s;
    em_tensor *in[2] = {out, c->in[2]};
    em_op_call add = {.op = EM_OP_ADD, .nin = 2, .in = in, .attrs = c->attrs};
    s = cpu_add(&add, out);
    if (s != EM_OK || act == EM_ACT_NONE) return s;
    em_op_call f = {.op = em_act_op(act), .nin = 1, .in = in, .attrs = c->attrs};
    return em_op_table[f.op].cpu(&f, out);
}

em_op em_act_op(em_act act) {
    return act == EM_ACT_RELU        ? EM_OP_RELU
           : act == EM_ACT_GELU_TANH ? EM_OP_GELU_TANH
           : act == EM_ACT_GELU      ? EM_OP_GELU
                                     : EM_OP_COUNT;
}

