/* cuda_matmul.c - matmul on CUDA through cuBLAS.
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
        bl->SetMathMode(d->blas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
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

#endif /* EMBER_HAVE_CUDA */
