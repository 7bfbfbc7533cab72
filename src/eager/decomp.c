/* decomp.c - ops defined by decomposition into primitives.
 *
 * One definition serves eager mode and, later, tracing: recording sees the
 * primitives these call, as Inductor sees ATen decompositions. */
#include "eager.h"

#include <math.h>

/* Checks x and dim for the softmax family (naming the caller's function). */
static bool softmax_args(const char *fn, const em_tensor *x, int dim) {
    int d;
    if (!x) {
        em_error_null(fn, "x");
        return false;
    }
    if (!em_norm_dim(dim, x->ndim, &d)) {
        em_error(EM_ERR_DIM, "%s: dim %d is out of range for a %d-d tensor", fn, dim, x->ndim);
        return false;
    }
    return true;
}

static em_tensor *kept(em_tensor *r) {
    r = em_keep(r);
    em_scope_end();
    return r;
}

/* The dtype these compute in: x's when it is f32 or f64; f32 for integers
 * and bool, and for f16 and bf16, whose statistics (max, sums, mean,
 * variance) torch computes in f32 too. */
static em_tensor *compute_in(const em_tensor *x) {
    bool wide = em_dtype_is_float(x->dtype) && !em_is_half(x->dtype);
    return wide ? (em_tensor *)x : em_cast(x, EM_F32);
}

/* The result r (computed in f32 for a half x) rounded to x's half type
 * once; under autocast (which keeps softmax, log_softmax and layer_norm in
 * f32) r stays f32. */
static em_tensor *as_input_type(em_tensor *r, const em_tensor *x) {
    bool half = em_is_half(x->dtype) && em_autocast_for_f32(x->dtype) == x->dtype;
    return r && half ? em_cast(r, x->dtype) : r;
}

/* x - max(x) along dim.  Over a dim of size 0 there is no max (amax has no
 * identity to return) and no element to shift: x itself, so that softmax
 * of an empty dim is an empty tensor, as in torch. */
static em_tensor *shift_by_max(em_tensor *xf, int dim) {
    int d;
    if (!xf || !em_norm_dim(dim, xf->ndim, &d) || (xf->ndim > 0 && xf->sizes[d] == 0)) return xf;
    return em_sub(xf, em_amax(xf, 1, &dim, true));
}

/* softmax(x) = exp(x - max) / sum(exp(x - max)); subtracting the max keeps
 * exp from overflowing and does not change the result. */
em_tensor *em_softmax(const em_tensor *x, int dim) {
    if (!softmax_args("em_softmax", x, dim)) return NULL;
    em_scope_begin();
    em_tensor *xf = compute_in(x);
    em_tensor *e = em_exp(shift_by_max(xf, dim));
    return kept(as_input_type(em_div(e, em_sum(e, 1, &dim, true)), x));
}

/* log_softmax(x) = (x - max) - log(sum(exp(x - max))). */
em_tensor *em_log_softmax(const em_tensor *x, int dim) {
    if (!softmax_args("em_log_softmax", x, dim)) return NULL;
    em_scope_begin();
    em_tensor *xf = compute_in(x);
    em_tensor *shifted = shift_by_max(xf, dim);
    return kept(as_input_type(em_sub(shifted, em_log(em_sum(em_exp(shifted), 1, &dim, true))), x));
}

/* (x - mean) / sqrt(var + eps) * weight + bias over the last nnorm dims,
 * with the population variance (correction 0), as torch.layer_norm. */
em_tensor *em_layer_norm(const em_tensor *x, int nnorm, const em_tensor *weight,
                         const em_tensor *bias, double eps) {
    if (!x) {
        em_error_null("em_layer_norm", "x");
        return NULL;
    }
    if (nnorm < 1 || nnorm > x->ndim) {
        em_error(EM_ERR_DIM, "em_layer_norm: cannot normalize over the last %d dims of a %d-d "
                 "tensor", nnorm, x->ndim);
        return NULL;
    }
    if (!(eps >= 0)) {
        em_error(EM_ERR_ARG, "em_layer_norm: eps %g is negative or NaN", eps);
        return NULL;
    }
    const em_tensor *affine[2] = {weight, bias};
    for (int k = 0; k < 2; k++) {
        const em_tensor *p = affine[k];
        if (!p) continue;
        bool ok = p->ndim == nnorm;
        for (int i = 0; ok && i < nnorm; i++)
            ok = p->sizes[i] == x->sizes[x->ndim - nnorm + i];
        if (!ok) {
            char s1[160], s2[160];
            em_error(EM_ERR_SHAPE, "em_layer_norm: %s of sizes %s does not match the normalized "
                     "sizes %s", k ? "bias" : "weight", em_shape_str(p->ndim, p->sizes, s1, sizeof s1),
                     em_shape_str(nnorm, x->sizes + x->ndim - nnorm, s2, sizeof s2));
            return NULL;
        }
    }
    int dims[EM_MAX_DIMS];
    for (int i = 0; i < nnorm; i++) dims[i] = x->ndim - nnorm + i;
    em_scope_begin();
    em_tensor *xf = compute_in(x);
    em_tensor *centered = em_sub(xf, em_mean(xf, nnorm, dims, true));
    em_tensor *var = em_var(xf, nnorm, dims, 0, true);
    em_tensor *y = em_mul(centered, em_rsqrt(em_add_scalar(var, eps)));
    if (weight) y = em_mul(y, weight); /* a half weight promotes to f32 here */
    if (bias) y = em_add(y, bias);
    return kept(as_input_type(y, x));
}

/* Checks attention's arguments and resolves its scale into *scale. */
static bool attention_args(const em_tensor *q, const em_tensor *k, const em_tensor *v,
                           const em_tensor *mask, bool causal, double *scale) {
    static const char fn[] = "em_scaled_dot_product_attention";
    if (!q || !k || !v) {
        em_error_null(fn, !q ? "q" : !k ? "k" : "v");
        return false;
    }
    if (!em_dtype_is_float(q->dtype) || k->dtype != q->dtype || v->dtype != q->dtype) {
        em_error(EM_ERR_DTYPE, "%s: q, k and v must have one float dtype (got %s, %s, %s)", fn,
                 em_dtype_name(q->dtype), em_dtype_name(k->dtype), em_dtype_name(v->dtype));
        return false;
    }
    if (mask && mask->dtype != EM_BOOL && mask->dtype != q->dtype) {
        em_error(EM_ERR_DTYPE, "%s: mask must be bool or q's dtype %s, not %s", fn,
                 em_dtype_name(q->dtype), em_dtype_name(mask->dtype));
        return false;
    }
    if (mask && causal) { /* as torch: which of the two would win is not obvious */
        em_error(EM_ERR_ARG, "%s: give a mask or causal, not both", fn);
        return false;
    }
    if (isinf(*scale)) {
        em_error(EM_ERR_ARG, "%s: scale %g is not finite (NAN: the default)", fn, *scale);
        return false;
    }
    em_meta m;
    if (em_attention_sizes(fn, q, k, v, mask, &m) != EM_OK) return false;
    int64_t D = q->sizes[q->ndim - 1];
    /* over D = 0 every score is 0 whatever the scale: 1 avoids 0 * inf */
    if (isnan(*scale)) *scale = D > 0 ? 1.0 / sqrt((double)D) : 1.0;
    return true;
}

/* [Tq, Tk] bool: key j is after query i (j > i), the keys torch's
 * is_causal drops (upper-left aligned).  Written as GPT-2 code writes it,
 * arange and a comparison, which the attention pass recognizes. */
static em_tensor *future_keys(int64_t Tq, int64_t Tk, em_device dev) {
    em_tensor *i = em_unsqueeze(em_arange(0, (double)Tq, 1, EM_I64, dev), 1);
    em_tensor *j = em_unsqueeze(em_arange(0, (double)Tk, 1, EM_I64, dev), 0);
    return em_gt(j, i);
}

/* softmax(q k^T * scale + mask) v, as torch's math backend: a bool mask
 * keeps the keys where it is true (the others get -inf), a float mask is
 * added to the scores; causal drops the keys after each query.  A row with
 * every key dropped is NaN (0/0), as in torch. */
em_tensor *em_scaled_dot_product_attention(const em_tensor *q, const em_tensor *k,
                                           const em_tensor *v, const em_tensor *mask, bool causal,
                                           double scale) {
    if (!attention_args(q, k, v, mask, causal, &scale)) return NULL;
    em_scope_begin();
    em_tensor *ninf = em_scalar(-INFINITY, q->dtype, q->device);
    em_tensor *s = em_mul_scalar(em_matmul(q, em_transpose(k, -2, -1)), scale);
    if (mask && mask->dtype == EM_BOOL)
        s = em_add(s, em_where(mask, em_scalar(0, q->dtype, q->device), ninf));
    else if (mask)
        s = em_add(s, mask);
    if (causal)
        s = em_where(future_keys(q->sizes[q->ndim - 2], k->sizes[k->ndim - 2], q->device), ninf, s);
    return kept(em_matmul(em_softmax(s, -1), v));
}
