/* cpu_create.c - the CPU's creation kernels: empty, full, arange, rand, randn.
 *
 * The output is freshly allocated and contiguous; element i of the result
 * depends only on i (and the attributes), so large outputs are split with
 * em_parallel_for and the values never depend on the number of threads.
 *
 * rand/randn: element i comes from em_philox(seed, offset + i), one Philox
 * block per element, so a generator that has drawn k values continues at
 * counter k whatever the shapes of the earlier draws. */
#include "cpu.h"

#include <math.h>
#include <string.h>

/* Philox is ~10 rounds of multiplies per element: smaller chunks pay. */
#define RAND_GRAIN (EM_PARALLEL_GRAIN / 8)

static int64_t out_numel(const em_tensor *out) {
    int64_t n = 1;
    for (int i = 0; i < out->ndim; i++) n *= out->sizes[i];
    return n;
}

static bool dtype_ok(em_dtype d) { return (unsigned)d < EM_DTYPE_COUNT; }

/* ---- Conversions from double to each dtype's bits ----
 * Integers by Ember's rule (em_f64_to_int, eager.h: truncated, saturated,
 * NaN -> 0); bool is v != 0 (NaN -> true); f16/bf16 round to nearest even
 * once (em_double_to_half, cpu.h). */

/* Writes v converted to d into p (em_dtype_size(d) bytes). */
static void store_f64(void *p, em_dtype d, double v) {
    switch (d) {
    case EM_F32: { float x = (float)v; memcpy(p, &x, 4); break; }
    case EM_F64: memcpy(p, &v, 8); break;
    case EM_I32: { int32_t x = em_f64_to_i32(v); memcpy(p, &x, 4); break; }
    case EM_I64: { int64_t x = em_f64_to_i64(v); memcpy(p, &x, 8); break; }
    case EM_BOOL: { uint8_t x = v != 0; memcpy(p, &x, 1); break; }
    case EM_F16: { uint16_t x = em_double_to_half(v); memcpy(p, &x, 2); break; }
    case EM_BF16: { uint16_t x = em_double_to_bf16(v); memcpy(p, &x, 2); break; }
    default: break;
    }
}

/* ---- empty ---- */

em_status cpu_empty(const em_op_call *c, em_tensor *out) {
    (void)c;
    (void)out;
    return EM_OK;
}

/* ---- full: every element the same bits; fill by element size ---- */

typedef struct fill_ctx {
    char *data;
    size_t esize;
    uint64_t bits; /* the element's bytes in the low esize bytes (memcpy'd) */
} fill_ctx;

static void fill_range(void *vctx, int64_t begin, int64_t end) {
    const fill_ctx *f = vctx;
    int64_t n = end - begin;
    switch (f->esize) {
    case 1: {
        uint8_t v;
        memcpy(&v, &f->bits, 1);
        memset(f->data + begin, v, (size_t)n);
        break;
    }
    case 2: {
        uint16_t v, *o = (uint16_t *)f->data + begin;
        memcpy(&v, &f->bits, 2);
        for (int64_t i = 0; i < n; i++) o[i] = v;
        break;
    }
    case 4: {
        uint32_t v, *o = (uint32_t *)f->data + begin;
        memcpy(&v, &f->bits, 4);
        for (int64_t i = 0; i < n; i++) o[i] = v;
        break;
    }
    default: {
        uint64_t v = f->bits, *o = (uint64_t *)f->data + begin;
        for (int64_t i = 0; i < n; i++) o[i] = v;
        break;
    }
    }
}

em_status cpu_full(const em_op_call *c, em_tensor *out) {
    if (!dtype_ok(out->dtype))
        return em_error(EM_ERR_DTYPE, "full: no CPU kernel for dtype %s", em_dtype_name(out->dtype));
    int64_t n = out_numel(out);
    if (n == 0) return EM_OK;
    fill_ctx f = {em_data(out), em_dtype_size(out->dtype), 0};
    store_f64(&f.bits, out->dtype, c->attrs->value);
    em_parallel_for(n, EM_PARALLEL_GRAIN, fill_range, &f);
    return EM_OK;
}

/* ---- arange: element i = fstart + i * fstep ---- */

typedef struct arange_ctx {
    char *data;
    em_dtype dtype;
    double start, step;
    bool exact;            /* integer dtype, integral start and step: int64 math */
    int64_t istart, istep;
} arange_ctx;

/* Element i of an exact arange, start + i * step in exact integers, past
 * int64's range saturated by the conversion rule (the value is exact, so
 * only its direction, that of step, matters then). */
static int64_t arange_exact(const arange_ctx *a, int64_t i) {
    int64_t v;
    if (__builtin_mul_overflow(i, a->istep, &v) || __builtin_add_overflow(v, a->istart, &v))
        return a->istep > 0 ? INT64_MAX : INT64_MIN;
    return v;
}

static void arange_range(void *vctx, int64_t begin, int64_t end) {
    const arange_ctx *a = vctx;
    if (a->exact) {
        if (a->dtype == EM_I64) {
            int64_t *o = (int64_t *)a->data;
            for (int64_t i = begin; i < end; i++) o[i] = arange_exact(a, i);
        } else { /* to i32 by the conversion rule: saturated */
            int32_t *o = (int32_t *)a->data;
            for (int64_t i = begin; i < end; i++) {
                int64_t v = arange_exact(a, i);
                o[i] = v > INT32_MAX ? INT32_MAX : v < INT32_MIN ? INT32_MIN : (int32_t)v;
            }
        }
        return;
    }
    switch (a->dtype) {
    case EM_F64: {
        double *o = (double *)a->data;
        for (int64_t i = begin; i < end; i++) o[i] = a->start + (double)i * a->step;
        break;
    }
    case EM_F32: {
        float *o = (float *)a->data;
        for (int64_t i = begin; i < end; i++) o[i] = (float)(a->start + (double)i * a->step);
        break;
    }
    default: {
        size_t es = em_dtype_size(a->dtype);
        for (int64_t i = begin; i < end; i++)
            store_f64(a->data + (size_t)i * es, a->dtype, a->start + (double)i * a->step);
        break;
    }
    }
}

/* Whether v is an integer that int64 holds exactly. */
static bool integral_i64(double v) {
    return v == floor(v) && v >= -9223372036854775808.0 && v < 9223372036854775808.0;
}

em_status cpu_arange(const em_op_call *c, em_tensor *out) {
    if (!dtype_ok(out->dtype))
        return em_error(EM_ERR_DTYPE, "arange: no CPU kernel for dtype %s",
                        em_dtype_name(out->dtype));
    int64_t n = out_numel(out);
    if (n == 0) return EM_OK;
    const em_op_attrs *at = c->attrs;
    arange_ctx a = {em_data(out), out->dtype, at->fstart, at->fstep, false, 0, 0};
    if ((out->dtype == EM_I32 || out->dtype == EM_I64) && integral_i64(at->fstart) &&
        integral_i64(at->fstep)) {
        a.exact = true;
        a.istart = (int64_t)at->fstart;
        a.istep = (int64_t)at->fstep;
    }
    em_parallel_for(n, EM_PARALLEL_GRAIN, arange_range, &a);
    return EM_OK;
}

/* ---- rand, randn ---- */

typedef struct rand_ctx {
    char *data;
    uint64_t seed, offset;
} rand_ctx;

static inline float u01_f32(uint32_t r) { return (float)(r >> 8) * 0x1p-24f; }
static inline double u01_f64(uint32_t hi, uint32_t lo) {
    return (double)(((uint64_t)hi << 21) ^ (lo >> 11)) * 0x1p-53;
}

static void rand_f32(void *vctx, int64_t begin, int64_t end) {
    const rand_ctx *r = vctx;
    float *o = (float *)r->data;
    uint32_t x[4];
    for (int64_t i = begin; i < end; i++) {
        em_philox(r->seed, r->offset + (uint64_t)i, x);
        o[i] = u01_f32(x[0]);
    }
}

static void rand_f64(void *vctx, int64_t begin, int64_t end) {
    const rand_ctx *r = vctx;
    double *o = (double *)r->data;
    uint32_t x[4];
    for (int64_t i = begin; i < end; i++) {
        em_philox(r->seed, r->offset + (uint64_t)i, x);
        o[i] = u01_f64(x[0], x[1]);
    }
}

/* Box-Muller: u1 in (0, 1] (1 - u, so log never sees 0), u2 in [0, 1). */
static void randn_f32(void *vctx, int64_t begin, int64_t end) {
    const rand_ctx *r = vctx;
    float *o = (float *)r->data;
    uint32_t x[4];
    for (int64_t i = begin; i < end; i++) {
        em_philox(r->seed, r->offset + (uint64_t)i, x);
        float u1 = 1.0f - u01_f32(x[0]), u2 = u01_f32(x[1]);
        o[i] = sqrtf(-2.0f * logf(u1)) * cosf(2.0f * (float)M_PI * u2);
    }
}

static void randn_f64(void *vctx, int64_t begin, int64_t end) {
    const rand_ctx *r = vctx;
    double *o = (double *)r->data;
    uint32_t x[4];
    for (int64_t i = begin; i < end; i++) {
        em_philox(r->seed, r->offset + (uint64_t)i, x);
        double u1 = 1.0 - u01_f64(x[0], x[1]), u2 = u01_f64(x[2], x[3]);
        o[i] = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
    }
}

static em_status run_rand(const em_op_call *c, em_tensor *out, const char *name,
                          em_range_fn f32, em_range_fn f64) {
    em_range_fn fn = out->dtype == EM_F32 ? f32 : out->dtype == EM_F64 ? f64 : NULL;
    if (!fn)
        return em_error(EM_ERR_DTYPE, "%s: dtype %s is not supported (f32 or f64)", name,
                        em_dtype_name(out->dtype));
    int64_t n = out_numel(out);
    if (n == 0) return EM_OK;
    rand_ctx r = {em_data(out), c->attrs->seed, c->attrs->offset};
    em_parallel_for(n, RAND_GRAIN, fn, &r);
    return EM_OK;
}

em_status cpu_rand(const em_op_call *c, em_tensor *out) {
    return run_rand(c, out, "rand", rand_f32, rand_f64);
}

em_status cpu_randn(const em_op_call *c, em_tensor *out) {
    return run_rand(c, out, "randn", randn_f32, randn_f64);
}
