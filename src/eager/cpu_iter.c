/* cpu_iter.c - the strided N-operand iterator behind every pointwise CPU
 * kernel, and scalar load/store/convert helpers. */
#include "cpu.h"

#include <math.h>
#include <string.h>

void em_iter_init(em_iter *it, em_tensor *out, int nin, em_tensor *const *in) {
    int nd = out->ndim;
    memset(it, 0, sizeof *it);
    it->nops = nin + 1;
    it->numel = em_shape_numel(nd, out->sizes);
    int64_t sizes[EM_MAX_DIMS];
    int64_t strides[EM_ITER_MAX_OPS][EM_MAX_DIMS];
    em_tensor *ops[EM_ITER_MAX_OPS];
    ops[0] = out;
    for (int k = 0; k < nin; k++) ops[k + 1] = in[k];
    for (int k = 0; k < it->nops; k++) {
        em_tensor *t = ops[k];
        int64_t es = (int64_t)em_dtype_size(t->dtype);
        int shift = nd - t->ndim; /* numpy broadcasting aligns trailing dims */
        for (int d = 0; d < nd; d++) {
            int td = d - shift;
            bool bcast = td < 0 || (t->sizes[td] == 1 && out->sizes[d] != 1);
            strides[k][d] = bcast ? 0 : t->strides[td] * es;
        }
        it->ptrs[k] = em_data(t);
    }
    memcpy(sizes, out->sizes, sizeof(int64_t) * (size_t)nd);
    /* Merge dim d into d+1 (the inner one) when every operand steps over
     * d exactly as over a whole run of d+1; drop size-1 dims. */
    int n = 0;
    for (int d = 0; d < nd; d++) {
        if (sizes[d] == 1) continue;
        if (n > 0) {
            bool merge = true;
            for (int k = 0; k < it->nops; k++)
                if (it->strides[k][n - 1] != strides[k][d] * sizes[d]) merge = false;
            if (merge) {
                it->sizes[n - 1] *= sizes[d];
                for (int k = 0; k < it->nops; k++) it->strides[k][n - 1] = strides[k][d];
                continue;
            }
        }
        it->sizes[n] = sizes[d];
        for (int k = 0; k < it->nops; k++) it->strides[k][n] = strides[k][d];
        n++;
    }
    if (n == 0) { /* a single element */
        it->sizes[0] = 1;
        n = 1;
    }
    it->ndim = n;
}

typedef struct iter_job {
    const em_iter *it;
    em_loop_fn loop;
    const em_op_attrs *a;
} iter_job;

/* Runs the elements [begin, end) of the flattened iteration space. */
static void iter_range(void *ctx, int64_t begin, int64_t end) {
    const iter_job *j = ctx;
    const em_iter *it = j->it;
    int nd = it->ndim, nops = it->nops;
    int64_t inner = it->sizes[nd - 1];
    int64_t idx[EM_MAX_DIMS];
    int64_t rest = begin;
    for (int d = nd - 1; d >= 0; d--) {
        idx[d] = rest % it->sizes[d];
        rest /= it->sizes[d];
    }
    int64_t inner_strides[EM_ITER_MAX_OPS];
    for (int k = 0; k < nops; k++) inner_strides[k] = it->strides[k][nd - 1];
    int64_t pos = begin;
    while (pos < end) {
        char *ptrs[EM_ITER_MAX_OPS];
        for (int k = 0; k < nops; k++) {
            int64_t off = 0;
            for (int d = 0; d < nd; d++) off += idx[d] * it->strides[k][d];
            ptrs[k] = it->ptrs[k] + off;
        }
        int64_t n = inner - idx[nd - 1];
        if (n > end - pos) n = end - pos;
        j->loop(ptrs, inner_strides, n, j->a);
        pos += n;
        idx[nd - 1] += n;
        for (int d = nd - 1; d > 0 && idx[d] == it->sizes[d]; d--) {
            idx[d] = 0;
            idx[d - 1]++;
        }
    }
}

void em_iter_run(const em_iter *it, em_loop_fn loop, const em_op_attrs *a) {
    if (it->numel <= 0) return;
    iter_job j = {it, loop, a};
    em_parallel_for(it->numel, EM_PARALLEL_GRAIN, iter_range, &j);
}

void em_dims_push(int64_t *sizes, int64_t *strides, int *n, int64_t s, int64_t t) {
    if (*n > 0 && strides[*n - 1] == t * s) {
        sizes[*n - 1] *= s;
        strides[*n - 1] = t;
        return;
    }
    sizes[*n] = s;
    strides[*n] = t;
    (*n)++;
}

/* ---- Scalars ---- */

/* Plain loops over the inline helpers (cpu.h): the contiguous ones
 * vectorize (`omp simd` lifts -O2's cost model, which would leave them
 * scalar).  The format is chosen once per call, outside the loops. */
#if defined(_OPENMP) || defined(EM_OPENMP_SIMD)
#define CVT_SIMD _Pragma("omp simd")
#else
#define CVT_SIMD
#endif
EM_VMATH_CLONES
void em_half_to_f32_n(em_dtype h, const char *src, int64_t sb, float *dst, int64_t n) {
    if (sb == 2) {
        const uint16_t *s = (const uint16_t *)src;
        if (h == EM_F16)
            CVT_SIMD for (int64_t i = 0; i < n; i++) dst[i] = em_half_to_float(s[i]);
        else
            CVT_SIMD for (int64_t i = 0; i < n; i++) dst[i] = em_bf16_to_float(s[i]);
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        uint16_t v = *(const uint16_t *)(src + i * sb);
        dst[i] = h == EM_F16 ? em_half_to_float(v) : em_bf16_to_float(v);
    }
}

EM_VMATH_CLONES
void em_f32_to_half_n(em_dtype h, const float *src, char *dst, int64_t sb, int64_t n) {
    if (sb == 2) {
        uint16_t *d = (uint16_t *)dst;
        if (h == EM_F16)
            CVT_SIMD for (int64_t i = 0; i < n; i++) d[i] = em_float_to_half(src[i]);
        else
            CVT_SIMD for (int64_t i = 0; i < n; i++) d[i] = em_float_to_bf16(src[i]);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        *(uint16_t *)(dst + i * sb) = h == EM_F16 ? em_float_to_half(src[i]) : em_float_to_bf16(src[i]);
}

double em_load_f64(const void *p, em_dtype d) {
    switch (d) {
    case EM_F32: return *(const float *)p;
    case EM_F64: return *(const double *)p;
    case EM_I32: return *(const int32_t *)p;
    case EM_I64: return (double)*(const int64_t *)p;
    case EM_BOOL: return *(const uint8_t *)p ? 1.0 : 0.0;
    case EM_F16: return em_half_to_float(*(const uint16_t *)p);
    case EM_BF16: return em_bf16_to_float(*(const uint16_t *)p);
    default: return NAN;
    }
}

int64_t em_load_i64(const void *p, em_dtype d) {
    if (d == EM_I64) return *(const int64_t *)p;
    if (d == EM_I32) return *(const int32_t *)p;
    if (d == EM_BOOL) return *(const uint8_t *)p != 0;
    return em_f64_to_i64(em_load_f64(p, d));
}

void em_store_f64(void *p, em_dtype d, double v) {
    switch (d) {
    case EM_F32: *(float *)p = (float)v; break;
    case EM_F64: *(double *)p = v; break;
    case EM_I32: *(int32_t *)p = em_f64_to_i32(v); break;
    case EM_I64: *(int64_t *)p = em_f64_to_i64(v); break;
    case EM_BOOL: *(uint8_t *)p = v != 0; break;
    case EM_F16: *(uint16_t *)p = em_double_to_half(v); break;
    case EM_BF16: *(uint16_t *)p = em_double_to_bf16(v); break;
    default: break;
    }
}
