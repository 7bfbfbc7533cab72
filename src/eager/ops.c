/* ops.c - the public op functions: argument checks, normalization (negative
 * dims, -1 sizes, Python-style slice bounds) and dtype promotion, then one
 * call to em_dispatch.  No op computes anything here. */
#include "eager.h"

#include <math.h>
#include <string.h>

struct em_generator {
    uint64_t seed;
    uint64_t offset;             /* values drawn so far */
    const em_allocator *alloc;
};

static em_tensor *dispatch1(em_op op, const em_tensor *x, const em_op_attrs *a) {
    em_tensor *in[1] = {(em_tensor *)x};
    return em_dispatch(op, 1, in, a);
}

static em_tensor *dispatch2(em_op op, const em_tensor *x, const em_tensor *y,
                            const em_op_attrs *a) {
    em_tensor *in[2] = {(em_tensor *)x, (em_tensor *)y};
    return em_dispatch(op, 2, in, a);
}

static em_tensor *null_arg(const char *fn, const char *arg) {
    em_error_null(fn, arg);
    return NULL;
}

/* A NULL that is not a tensor is the caller's mistake, never the result of
 * an earlier failure: always report it. */
static em_tensor *null_ptr(const char *fn, const char *arg) {
    em_error(EM_ERR_NULL, "%s: %s is NULL", fn, arg);
    return NULL;
}

/* x converted to dtype d: x itself when it already is (no new tensor). */
static const em_tensor *as_dtype(const em_tensor *x, em_dtype d) {
    return x && x->dtype != d ? em_cast(x, d) : x;
}

/* Ends a wrapper's private scope, moving r out of it. */
static em_tensor *scope_return(em_tensor *r) {
    r = em_keep(r);
    em_scope_end();
    return r;
}

/* ---- autocast's casts ---- */

em_dtype em_autocast_for_f32(em_dtype d) {
    return em_is_half(d) && em_is_half(em_autocast_dtype()) ? EM_F32 : d;
}

em_dtype em_autocast_low(em_dtype d) {
    em_dtype a = em_autocast_dtype();
    return em_is_half(a) && (d == EM_F32 || em_is_half(d)) ? a : d; /* f64 stays f64, as torch keeps it */
}

/* ---- creation ---- */

static em_tensor *create(em_op op, const char *fn, int ndim, const int64_t *sizes,
                         em_dtype dtype, em_device dev, em_op_attrs *a) {
    if (em_check_creation(fn, ndim, sizes, dtype, dev) != EM_OK) return NULL;
    a->ndim = ndim;
    if (ndim) memcpy(a->sizes, sizes, sizeof(int64_t) * (size_t)ndim);
    a->dtype = dtype;
    a->device = dev;
    return em_dispatch(op, 0, NULL, a);
}

em_tensor *em_empty(int ndim, const int64_t *sizes, em_dtype dtype, em_device dev) {
    em_op_attrs a = {0};
    return create(EM_OP_EMPTY, "em_empty", ndim, sizes, dtype, dev, &a);
}

em_tensor *em_full(int ndim, const int64_t *sizes, double value, em_dtype dtype, em_device dev) {
    em_op_attrs a = {.value = value};
    return create(EM_OP_FULL, "em_full", ndim, sizes, dtype, dev, &a);
}

em_tensor *em_zeros(int ndim, const int64_t *sizes, em_dtype dtype, em_device dev) {
    return em_full(ndim, sizes, 0.0, dtype, dev);
}

em_tensor *em_ones(int ndim, const int64_t *sizes, em_dtype dtype, em_device dev) {
    return em_full(ndim, sizes, 1.0, dtype, dev);
}

em_tensor *em_scalar(double value, em_dtype dtype, em_device dev) {
    return em_full(0, NULL, value, dtype, dev);
}

em_tensor *em_arange(double start, double end, double step, em_dtype dtype, em_device dev) {
    if (!isfinite(start) || !isfinite(end) || !isfinite(step)) {
        em_error(EM_ERR_ARG, "em_arange: start, end and step must be finite");
        return NULL;
    }
    if (step == 0) {
        em_error(EM_ERR_ARG, "em_arange: step is 0");
        return NULL;
    }
    double n = ceil((end - start) / step);
    if (n < 0) n = 0;
    if (n > 0x1p53) {
        em_error(EM_ERR_OVERFLOW, "em_arange: %g elements is too many", n);
        return NULL;
    }
    int64_t size = (int64_t)n;
    em_op_attrs a = {.fstart = start, .fstep = step};
    return create(EM_OP_ARANGE, "em_arange", 1, &size, dtype, dev, &a);
}

em_generator *em_generator_new(uint64_t seed) {
    em_generator *g = em_malloc(sizeof *g);
    if (!g) return NULL;
    g->seed = seed;
    g->offset = 0;
    g->alloc = em_get_allocator();
    return g;
}

void em_generator_free(em_generator *g) {
    if (g) em_free_with(g->alloc, g);
}

uint64_t em_generator_seed(const em_generator *g) { return g ? g->seed : 0; }
uint64_t em_generator_offset(const em_generator *g) { return g ? g->offset : 0; }

static em_tensor *random(em_op op, const char *fn, em_generator *g, int ndim,
                         const int64_t *sizes, em_dtype dtype, em_device dev) {
    if (!g) return null_ptr(fn, "generator");
    em_op_attrs a = {.seed = g->seed, .offset = g->offset, .generator = g};
    em_tensor *t = create(op, fn, ndim, sizes, dtype, dev, &a);
    /* Each element consumes one Philox counter, so the next draw starts
     * where this one ended whatever the shapes. */
    if (t) g->offset += (uint64_t)em_shape_numel(ndim, sizes);
    return t;
}

em_tensor *em_rand(em_generator *g, int ndim, const int64_t *sizes, em_dtype dtype,
                   em_device dev) {
    return random(EM_OP_RAND, "em_rand", g, ndim, sizes, dtype, dev);
}

em_tensor *em_randn(em_generator *g, int ndim, const int64_t *sizes, em_dtype dtype,
                    em_device dev) {
    return random(EM_OP_RANDN, "em_randn", g, ndim, sizes, dtype, dev);
}

/* ---- pointwise ---- */

/* Ops defined on floats compute integer and bool inputs in f32; those
 * autocast keeps in f32 (f32 set) compute half inputs in f32 under it. */
static em_tensor *float_unary(em_op op, const char *fn, const em_tensor *x, bool f32) {
    if (!x) return null_arg(fn, "x");
    bool cast = !em_dtype_is_float(x->dtype) || (f32 && em_autocast_for_f32(x->dtype) != x->dtype);
    if (!cast) return dispatch1(op, x, NULL);
    em_scope_begin();
    return scope_return(dispatch1(op, em_cast(x, EM_F32), NULL));
}

#define FLOAT_UNARY(fn, OP) \
    em_tensor *fn(const em_tensor *x) { return float_unary(EM_OP_##OP, #fn, x, false); }
#define F32_UNARY(fn, OP) \
    em_tensor *fn(const em_tensor *x) { return float_unary(EM_OP_##OP, #fn, x, true); }
F32_UNARY(em_exp, EXP)
F32_UNARY(em_log, LOG)
FLOAT_UNARY(em_sqrt, SQRT)
F32_UNARY(em_rsqrt, RSQRT)
FLOAT_UNARY(em_sin, SIN)
FLOAT_UNARY(em_cos, COS)
FLOAT_UNARY(em_tanh, TANH)
FLOAT_UNARY(em_sigmoid, SIGMOID)
FLOAT_UNARY(em_gelu, GELU)
FLOAT_UNARY(em_gelu_tanh, GELU_TANH)
FLOAT_UNARY(em_erf, ERF)

em_tensor *em_neg(const em_tensor *x) { return dispatch1(EM_OP_NEG, x, NULL); }
em_tensor *em_abs(const em_tensor *x) { return dispatch1(EM_OP_ABS, x, NULL); }
em_tensor *em_relu(const em_tensor *x) { return dispatch1(EM_OP_RELU, x, NULL); }

em_tensor *em_cast(const em_tensor *x, em_dtype dtype) {
    em_op_attrs a = {.dtype = dtype};
    return dispatch1(EM_OP_CAST, x, &a);
}

typedef enum promote_rule {
    PROMOTE_ARITH,   /* bool computes as i32 */
    PROMOTE_FLOAT,   /* integers and bool compute as f32 */
    PROMOTE_ANY      /* comparisons: any common dtype */
} promote_rule;

/* Dtype categories, lowest first: bool, integers, floats. */
static int category(em_dtype d) { return d == EM_BOOL ? 0 : em_dtype_is_float(d) ? 2 : 1; }

/* The dtype a and b compute in: Ember's one promotion rule, torch's
 * result_type.  Tensors of at least one dim promote by em_promote_types
 * (f16 with bf16 -> f32, a half type with an integer -> the half type,
 * with f32 -> f32).  A 0-d tensor beside one that has dims (an em_scalar,
 * or the scalar an em_*_scalar call makes) counts only when its category
 * is above the other's: a half tensor with a 0-d f32 stays half, an i32
 * tensor with a 0-d f64 becomes f64. */
static em_dtype result_type(const em_tensor *a, const em_tensor *b) {
    if ((a->ndim == 0) != (b->ndim == 0)) {
        const em_tensor *t = a->ndim ? a : b, *z = a->ndim ? b : a;
        if (category(z->dtype) <= category(t->dtype)) return t->dtype;
    }
    return em_promote_types(a->dtype, b->dtype);
}

static em_dtype promoted(const em_tensor *a, const em_tensor *b, promote_rule r) {
    em_dtype d = result_type(a, b);
    if (r == PROMOTE_FLOAT && !em_dtype_is_float(d)) return EM_F32;
    if (r == PROMOTE_ARITH && d == EM_BOOL) return EM_I32;
    return d;
}

static em_tensor *binary(em_op op, const char *fn, const em_tensor *a, const em_tensor *b,
                         promote_rule r) {
    if (!a) return null_arg(fn, "a");
    if (!b) return null_arg(fn, "b");
    em_dtype d = promoted(a, b, r);
    if (op == EM_OP_POW) d = em_autocast_for_f32(d); /* autocast keeps pow in f32 */
    if (a->dtype == d && b->dtype == d) return dispatch2(op, a, b, NULL);
    em_scope_begin();
    return scope_return(dispatch2(op, as_dtype(a, d), as_dtype(b, d), NULL));
}

#define BINARY(fn, OP, rule) \
    em_tensor *fn(const em_tensor *a, const em_tensor *b) { \
        return binary(EM_OP_##OP, #fn, a, b, rule); \
    }
BINARY(em_add, ADD, PROMOTE_ARITH)
BINARY(em_sub, SUB, PROMOTE_ARITH)
BINARY(em_mul, MUL, PROMOTE_ARITH)
BINARY(em_div, DIV, PROMOTE_FLOAT)
BINARY(em_pow, POW, PROMOTE_FLOAT)
BINARY(em_maximum, MAXIMUM, PROMOTE_ARITH)
BINARY(em_minimum, MINIMUM, PROMOTE_ARITH)
BINARY(em_eq, EQ, PROMOTE_ANY)
BINARY(em_ne, NE, PROMOTE_ANY)
BINARY(em_lt, LT, PROMOTE_ANY)
BINARY(em_le, LE, PROMOTE_ANY)
BINARY(em_gt, GT, PROMOTE_ANY)
BINARY(em_ge, GE, PROMOTE_ANY)

/* x OP s: the scalar becomes a 0-d tensor of x's dtype (a "wrapped number"
 * in PyTorch's terms, which does not widen x: a half x stays half, the
 * scalar rounded to it); bool x computes in i64.  A
 * scalar that the integer dtype does not hold exactly (fractional, NaN,
 * +-inf, or out of its range: 3e9 for i32) computes in f32, as torch
 * computes an integer tensor with a float scalar: converting it to the
 * integer dtype would saturate it (1 + 3e9 would wrap to INT32_MIN). */
static em_tensor *binary_scalar(em_op op, const char *fn, const em_tensor *x, double s,
                                promote_rule r) {
    if (!x) return null_arg(fn, "x");
    em_dtype d = x->dtype == EM_BOOL ? EM_I64 : x->dtype;
    if (!em_dtype_is_float(d) && !em_int_holds(d, s)) d = EM_F32;
    em_scope_begin();
    return scope_return(binary(op, fn, x, em_scalar(s, d, x->device), r));
}

#define BINARY_SCALAR(fn, OP, rule) \
    em_tensor *fn(const em_tensor *x, double s) { \
        return binary_scalar(EM_OP_##OP, #fn, x, s, rule); \
    }
BINARY_SCALAR(em_add_scalar, ADD, PROMOTE_ARITH)
BINARY_SCALAR(em_sub_scalar, SUB, PROMOTE_ARITH)
BINARY_SCALAR(em_mul_scalar, MUL, PROMOTE_ARITH)
BINARY_SCALAR(em_div_scalar, DIV, PROMOTE_FLOAT)
BINARY_SCALAR(em_pow_scalar, POW, PROMOTE_FLOAT)
BINARY_SCALAR(em_maximum_scalar, MAXIMUM, PROMOTE_ARITH)
BINARY_SCALAR(em_minimum_scalar, MINIMUM, PROMOTE_ARITH)

em_tensor *em_where(const em_tensor *cond, const em_tensor *a, const em_tensor *b) {
    if (!cond) return null_arg("em_where", "cond");
    if (!a) return null_arg("em_where", "a");
    if (!b) return null_arg("em_where", "b");
    em_dtype d = result_type(a, b);
    em_scope_begin();
    em_tensor *in[3] = {(em_tensor *)cond, (em_tensor *)as_dtype(a, d),
                        (em_tensor *)as_dtype(b, d)};
    return scope_return(em_dispatch(EM_OP_WHERE, 3, in, NULL));
}

/* ---- reductions ---- */

/* Fills a->dims with dims normalized and sorted (all of x's dims when
 * ndims is 0). */
static em_status reduce_attrs(const char *fn, const em_tensor *x, int ndims, const int *dims,
                              em_op_attrs *a) {
    if (ndims < 0 || ndims > EM_MAX_DIMS)
        return em_error(EM_ERR_DIM, "%s: %d dims given", fn, ndims);
    if (ndims > 0 && !dims) return em_error(EM_ERR_NULL, "%s: dims is NULL", fn);
    if (ndims == 0) {
        a->ndims = x->ndim;
        for (int i = 0; i < x->ndim; i++) a->dims[i] = i;
        return EM_OK;
    }
    if (x->ndim == 0) {
        /* a 0-d tensor reduces over "dim 0 or -1" to itself */
        for (int i = 0; i < ndims; i++)
            if (dims[i] != 0 && dims[i] != -1)
                return em_error(EM_ERR_DIM, "%s: dim %d is out of range for a 0-d tensor", fn,
                                dims[i]);
        a->ndims = 0;
        return EM_OK;
    }
    a->ndims = ndims;
    for (int i = 0; i < ndims; i++) {
        int d;
        if (!em_norm_dim(dims[i], x->ndim, &d))
            return em_error(EM_ERR_DIM, "%s: dim %d is out of range for a %d-d tensor", fn,
                            dims[i], x->ndim);
        int j = i; /* insertion sort: at most 8 */
        while (j > 0 && a->dims[j - 1] > d) {
            a->dims[j] = a->dims[j - 1];
            j--;
        }
        a->dims[j] = d;
    }
    return EM_OK;
}

static em_tensor *reduce(em_op op, const char *fn, const em_tensor *x, int ndims,
                         const int *dims, bool keepdim, int correction, bool float_only) {
    if (!x) return null_arg(fn, "x");
    em_op_attrs a = {.keepdim = keepdim, .correction = correction};
    if (reduce_attrs(fn, x, ndims, dims, &a) != EM_OK) return NULL;
    /* autocast keeps sum, mean and var in f32 */
    bool f32 = op != EM_OP_AMAX && op != EM_OP_AMIN && em_autocast_for_f32(x->dtype) != x->dtype;
    if (!f32 && (!float_only || em_dtype_is_float(x->dtype))) return dispatch1(op, x, &a);
    em_scope_begin();
    return scope_return(dispatch1(op, em_cast(x, EM_F32), &a));
}

em_tensor *em_sum(const em_tensor *x, int ndims, const int *dims, bool keepdim) {
    return reduce(EM_OP_SUM, "em_sum", x, ndims, dims, keepdim, 0, false);
}
em_tensor *em_mean(const em_tensor *x, int ndims, const int *dims, bool keepdim) {
    return reduce(EM_OP_MEAN, "em_mean", x, ndims, dims, keepdim, 0, true);
}
em_tensor *em_amax(const em_tensor *x, int ndims, const int *dims, bool keepdim) {
    return reduce(EM_OP_AMAX, "em_amax", x, ndims, dims, keepdim, 0, false);
}
em_tensor *em_amin(const em_tensor *x, int ndims, const int *dims, bool keepdim) {
    return reduce(EM_OP_AMIN, "em_amin", x, ndims, dims, keepdim, 0, false);
}
em_tensor *em_var(const em_tensor *x, int ndims, const int *dims, int correction, bool keepdim) {
    if (correction < 0) {
        em_error(EM_ERR_ARG, "em_var: correction %d is negative", correction);
        return NULL;
    }
    return reduce(EM_OP_VAR, "em_var", x, ndims, dims, keepdim, correction, true);
}

em_tensor *em_argmax(const em_tensor *x, int dim, bool keepdim) {
    if (!x) return null_arg("em_argmax", "x");
    em_op_attrs a = {.keepdim = keepdim};
    if (!em_norm_dim(dim, x->ndim, &a.dim)) {
        em_error(EM_ERR_DIM, "em_argmax: dim %d is out of range for a %d-d tensor", dim, x->ndim);
        return NULL;
    }
    return dispatch1(EM_OP_ARGMAX, x, &a);
}

/* ---- views ---- */

bool em_can_view(const em_tensor *x, int nd, const int64_t *sizes);

em_tensor *em_reshape(const em_tensor *x, int ndim, const int64_t *sizes) {
    if (!x) return null_arg("em_reshape", "x");
    if (ndim < 0 || ndim > EM_MAX_DIMS) {
        em_error(EM_ERR_DIM, "em_reshape: %d dims (at most %d)", ndim, EM_MAX_DIMS);
        return NULL;
    }
    if (ndim > 0 && !sizes) return null_ptr("em_reshape", "sizes");
    em_op_attrs a = {.ndim = ndim};
    int infer = -1;
    int64_t known = 1;
    for (int i = 0; i < ndim; i++) {
        a.sizes[i] = sizes[i];
        if (sizes[i] == -1 && infer < 0) {
            infer = i;
            continue;
        }
        if (sizes[i] < 0) {
            em_error(EM_ERR_ARG, "em_reshape: size %lld at dim %d is invalid", (long long)sizes[i], i);
            return NULL;
        }
        if (sizes[i] && known > INT64_MAX / sizes[i]) {
            em_error(EM_ERR_OVERFLOW, "em_reshape: sizes overflow");
            return NULL;
        }
        known *= sizes[i];
    }
    int64_t numel = em_numel(x);
    if (infer >= 0) {
        if (known == 0 || numel % known != 0) {
            char s[160];
            em_error(EM_ERR_SHAPE, "em_reshape: cannot infer the -1 size of %lld elements "
                     "in %s", (long long)numel, em_shape_str(ndim, sizes, s, sizeof s));
            return NULL;
        }
        a.sizes[infer] = numel / known;
    }
    if (em_shape_numel(ndim, a.sizes) == numel && !em_can_view(x, ndim, a.sizes)) {
        em_scope_begin();
        return scope_return(dispatch1(EM_OP_RESHAPE, em_contiguous(x), &a));
    }
    return dispatch1(EM_OP_RESHAPE, x, &a);
}

em_tensor *em_permute(const em_tensor *x, int ndim, const int *perm) {
    if (!x) return null_arg("em_permute", "x");
    if (ndim > 0 && !perm) return null_ptr("em_permute", "perm");
    if (ndim != x->ndim) {
        em_error(EM_ERR_DIM, "em_permute: %d dims given for a %d-d tensor", ndim, x->ndim);
        return NULL;
    }
    em_op_attrs a = {.ndims = ndim};
    for (int i = 0; i < ndim; i++) {
        if (!em_norm_dim(perm[i], x->ndim, &a.dims[i])) {
            em_error(EM_ERR_DIM, "em_permute: dim %d is out of range for a %d-d tensor", perm[i],
                     x->ndim);
            return NULL;
        }
    }
    return dispatch1(EM_OP_PERMUTE, x, &a);
}

em_tensor *em_transpose(const em_tensor *x, int dim0, int dim1) {
    if (!x) return null_arg("em_transpose", "x");
    int d0, d1, perm[EM_MAX_DIMS];
    if (!em_norm_dim(dim0, x->ndim, &d0) || !em_norm_dim(dim1, x->ndim, &d1)) {
        em_error(EM_ERR_DIM, "em_transpose: dims %d, %d are out of range for a %d-d tensor", dim0,
                 dim1, x->ndim);
        return NULL;
    }
    for (int i = 0; i < x->ndim; i++) perm[i] = i;
    if (x->ndim > 0) {
        perm[d0] = d1;
        perm[d1] = d0;
    }
    return em_permute(x, x->ndim, perm);
}

em_tensor *em_slice(const em_tensor *x, int dim, int64_t start, int64_t end, int64_t step) {
    if (!x) return null_arg("em_slice", "x");
    em_op_attrs a = {.step = step};
    if (x->ndim == 0 || !em_norm_dim(dim, x->ndim, &a.dim)) {
        em_error(EM_ERR_DIM, "em_slice: dim %d is out of range for a %d-d tensor", dim, x->ndim);
        return NULL;
    }
    if (step <= 0) {
        em_error(EM_ERR_ARG, "em_slice: step %lld is not positive", (long long)step);
        return NULL;
    }
    int64_t n = x->sizes[a.dim];
    /* Python's rules: negative bounds count from the end, then clamp. */
    if (start < 0) start = start < -n ? 0 : start + n;
    if (end < 0) end = end < -n ? 0 : end + n;
    if (start > n) start = n;
    if (end > n) end = n;
    if (end < start) end = start;
    a.start = start;
    a.end = end;
    return dispatch1(EM_OP_SLICE, x, &a);
}

em_tensor *em_expand(const em_tensor *x, int ndim, const int64_t *sizes) {
    if (!x) return null_arg("em_expand", "x");
    if (ndim > 0 && !sizes) return null_ptr("em_expand", "sizes");
    if (ndim < 0 || ndim > EM_MAX_DIMS) {
        em_error(EM_ERR_DIM, "em_expand: %d dims (at most %d)", ndim, EM_MAX_DIMS);
        return NULL;
    }
    em_op_attrs a = {.ndim = ndim};
    if (ndim) memcpy(a.sizes, sizes, sizeof(int64_t) * (size_t)ndim);
    return dispatch1(EM_OP_EXPAND, x, &a);
}

em_tensor *em_squeeze(const em_tensor *x, int dim) {
    if (!x) return null_arg("em_squeeze", "x");
    em_op_attrs a = {0};
    if (x->ndim == 0 || !em_norm_dim(dim, x->ndim, &a.dim)) {
        em_error(EM_ERR_DIM, "em_squeeze: dim %d is out of range for a %d-d tensor", dim, x->ndim);
        return NULL;
    }
    return dispatch1(EM_OP_SQUEEZE, x, &a);
}

em_tensor *em_unsqueeze(const em_tensor *x, int dim) {
    if (!x) return null_arg("em_unsqueeze", "x");
    em_op_attrs a = {0};
    if (!em_norm_dim(dim, x->ndim + 1, &a.dim)) {
        em_error(EM_ERR_DIM, "em_unsqueeze: dim %d is out of range for a %d-d tensor", dim,
                 x->ndim);
        return NULL;
    }
    return dispatch1(EM_OP_UNSQUEEZE, x, &a);
}

em_tensor *em_contiguous(const em_tensor *x) { return dispatch1(EM_OP_CONTIGUOUS, x, NULL); }

/* ---- joining and indexing ---- */

em_tensor *em_cat(int n, em_tensor *const *xs, int dim) {
    if (n < 1) {
        em_error(EM_ERR_ARG, "em_cat: %d tensors given (at least 1)", n);
        return NULL;
    }
    if (!xs) return null_ptr("em_cat", "xs");
    for (int i = 0; i < n; i++) {
        if (!xs[i]) {
            char arg[32];
            snprintf(arg, sizeof arg, "xs[%d]", i);
            return null_arg("em_cat", arg);
        }
    }
    em_op_attrs a = {0};
    if (xs[0]->ndim == 0 || !em_norm_dim(dim, xs[0]->ndim, &a.dim)) {
        em_error(EM_ERR_DIM, "em_cat: dim %d is out of range for a %d-d tensor", dim, xs[0]->ndim);
        return NULL;
    }
    em_dtype d = xs[0]->dtype;
    for (int i = 1; i < n; i++) d = em_promote_types(d, xs[i]->dtype);
    em_tensor **in = em_malloc(sizeof *in * (size_t)n);
    if (!in) return NULL;
    em_scope_begin();
    for (int i = 0; i < n; i++) in[i] = (em_tensor *)as_dtype(xs[i], d);
    em_tensor *r = scope_return(em_dispatch(EM_OP_CAT, n, in, &a));
    em_free(in);
    return r;
}

em_tensor *em_index_select(const em_tensor *x, int dim, const em_tensor *idx) {
    if (!x) return null_arg("em_index_select", "x");
    if (!idx) return null_arg("em_index_select", "idx");
    em_op_attrs a = {0};
    if (x->ndim == 0 || !em_norm_dim(dim, x->ndim, &a.dim)) {
        em_error(EM_ERR_DIM, "em_index_select: dim %d is out of range for a %d-d tensor", dim,
                 x->ndim);
        return NULL;
    }
    return dispatch2(EM_OP_INDEX_SELECT, x, idx, &a);
}

em_status em_index_copy_(em_tensor *dst, int dim, const em_tensor *idx, const em_tensor *src) {
    if (!dst) return em_error_null("em_index_copy_", "dst");
    if (!idx) return em_error_null("em_index_copy_", "idx");
    if (!src) return em_error_null("em_index_copy_", "src");
    em_op_attrs a = {0};
    if (dst->ndim == 0 || !em_norm_dim(dim, dst->ndim, &a.dim))
        return em_error(EM_ERR_DIM, "em_index_copy_: dim %d is out of range for a %d-d tensor", dim,
                        dst->ndim);
    if (dst->storage && ((src->storage == dst->storage) || idx->storage == dst->storage))
        return em_error(EM_ERR_ARG, "em_index_copy_: the source or the indices share the tensor's "
                        "storage (the write would overwrite what it reads)");
    em_tensor *in[3] = {dst, (em_tensor *)idx, (em_tensor *)src};
    em_tensor *view = em_dispatch(EM_OP_INDEX_COPY, 3, in, &a);
    if (!view) return em_last_status() != EM_OK ? em_last_status() : EM_ERR_STATE;
    em_tensor_discard(view);
    return EM_OK;
}

em_tensor *em_embedding(const em_tensor *weight, const em_tensor *idx) {
    if (!weight) return null_arg("em_embedding", "weight");
    if (!idx) return null_arg("em_embedding", "idx");
    if (weight->ndim != 2) {
        em_error(EM_ERR_SHAPE, "em_embedding: weight must be 2-d [V, D], not %d-d", weight->ndim);
        return NULL;
    }
    if (idx->ndim + 1 > EM_MAX_DIMS) {
        em_error(EM_ERR_DIM, "em_embedding: indices of %d dims leave no room for D", idx->ndim);
        return NULL;
    }
    int64_t flat = -1, out[EM_MAX_DIMS];
    memcpy(out, idx->sizes, sizeof(int64_t) * (size_t)idx->ndim);
    out[idx->ndim] = weight->sizes[1];
    em_scope_begin();
    em_tensor *rows = em_index_select(weight, 0, em_reshape(idx, 1, &flat));
    return scope_return(em_reshape(rows, idx->ndim + 1, out));
}

/* ---- linear algebra ---- */

em_tensor *em_matmul(const em_tensor *a, const em_tensor *b) {
    if (!a) return null_arg("em_matmul", "a");
    if (!b) return null_arg("em_matmul", "b");
    if (a->ndim == 0 || b->ndim == 0) {
        em_error(EM_ERR_SHAPE, "em_matmul: operands must have at least 1 dim (%d, %d)", a->ndim,
                 b->ndim);
        return NULL;
    }
    em_dtype d = em_autocast_low(em_promote_types(a->dtype, b->dtype)); /* autocast: its dtype */
    em_scope_begin();
    /* torch.matmul: a 1-d operand gains a dim that the result then loses */
    const em_tensor *a2 = a->ndim == 1 ? em_unsqueeze(a, 0) : a;
    const em_tensor *b2 = b->ndim == 1 ? em_unsqueeze(b, 1) : b;
    em_tensor *r = dispatch2(EM_OP_MATMUL, as_dtype(a2, d), as_dtype(b2, d), NULL);
    if (r && b->ndim == 1) r = em_squeeze(r, -1);
    if (r && a->ndim == 1) r = em_squeeze(r, -2 + (b->ndim == 1));
    return scope_return(r);
}
