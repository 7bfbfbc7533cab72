/* infer.c - shape and dtype rules: one per row kind of ops.def.
 *
 * A rule checks one op call and computes its result's meta.  It reads only
 * meta, never data, so recording and lazy mode can run it on tensors that
 * have no values yet.  Wrappers in ops.c normalize arguments (negative dims,
 * -1 sizes, dtype promotion) before the call; rules re-check everything, as
 * a recorded graph may be replayed without the wrappers. */
#include "eager.h"

#include <math.h>
#include <string.h>

#define OPNAME(c) (em_op_table[(c)->op].name)

static em_status dtype_error(const em_op_call *c, em_dtype d, const char *accepted) {
    return em_error(EM_ERR_DTYPE, "%s: dtype %s is not supported (accepts %s)", OPNAME(c),
                    em_dtype_name(d), accepted);
}

/* f16 and bf16 compute wherever f32 does (their kernels compute in f32,
 * docs/api.md "Half precision"); rand and randn make f32 and f64 only. */
static bool is_numeric(em_dtype d) { return em_dtype_is_float(d) || d == EM_I32 || d == EM_I64; }
static bool is_f32_f64(em_dtype d) { return d == EM_F32 || d == EM_F64; }
#define NUMERIC "f32, f64, f16, bf16, i32, i64"
#define FLOATS "f32, f64, f16, bf16"

static void meta_like(em_meta *m, const em_tensor *t, em_dtype dtype) {
    m->ndim = t->ndim;
    memcpy(m->sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim);
    m->dtype = dtype;
    m->device = t->device;
}

static em_status check_size(const em_op_call *c, const em_meta *m) {
    int64_t n;
    char shape[160];
    if (!em_meta_check_numel(m, &n))
        return em_error(EM_ERR_OVERFLOW, "%s: result sizes %s overflow", OPNAME(c),
                        em_shape_str(m->ndim, m->sizes, shape, sizeof shape));
    return EM_OK;
}

/* Broadcasts the sizes of tensors in[0..n) (numpy rules) into m. */
static em_status broadcast(const em_op_call *c, int n, em_meta *m) {
    int nd = 0;
    for (int k = 0; k < n; k++)
        if (c->in[k]->ndim > nd) nd = c->in[k]->ndim;
    m->ndim = nd;
    for (int d = 0; d < nd; d++) {
        int64_t s = 1;
        for (int k = 0; k < n; k++) {
            const em_tensor *t = c->in[k];
            int td = d - (nd - t->ndim);
            if (td < 0 || t->sizes[td] == 1) continue;
            if (s != 1 && s != t->sizes[td]) {
                char a[160], b[160];
                return em_error(EM_ERR_SHAPE, "%s: shapes %s and %s do not broadcast",
                                OPNAME(c),
                                em_shape_str(c->in[0]->ndim, c->in[0]->sizes, a, sizeof a),
                                em_shape_str(t->ndim, t->sizes, b, sizeof b));
            }
            s = t->sizes[td];
        }
        m->sizes[d] = s;
    }
    return EM_OK;
}

static em_status same_dtypes(const em_op_call *c, int first, int n) {
    for (int k = first + 1; k < first + n; k++)
        if (c->in[k]->dtype != c->in[first]->dtype)
            return em_error(EM_ERR_DTYPE, "%s: inputs of dtypes %s and %s (expected one dtype)",
                            OPNAME(c), em_dtype_name(c->in[first]->dtype),
                            em_dtype_name(c->in[k]->dtype));
    return EM_OK;
}

/* ---- creation ---- */

em_status infer_create(const em_op_call *c, em_meta *m) {
    const em_op_attrs *a = c->attrs;
    em_status s = em_check_creation(OPNAME(c), a->ndim, a->sizes, a->dtype, a->device);
    if (s != EM_OK) return s;
    if ((c->op == EM_OP_RAND || c->op == EM_OP_RANDN) && !is_f32_f64(a->dtype))
        return dtype_error(c, a->dtype, "f32, f64");
    m->ndim = a->ndim;
    memcpy(m->sizes, a->sizes, sizeof(int64_t) * (size_t)a->ndim);
    m->dtype = a->dtype;
    m->device = a->device;
    return EM_OK;
}

/* ---- pointwise ---- */

em_status infer_same(const em_op_call *c, em_meta *m) {
    meta_like(m, c->in[0], c->in[0]->dtype);
    return EM_OK;
}

em_status infer_unary(const em_op_call *c, em_meta *m) {
    if (!is_numeric(c->in[0]->dtype)) return dtype_error(c, c->in[0]->dtype, NUMERIC);
    return infer_same(c, m);
}

em_status infer_float_unary(const em_op_call *c, em_meta *m) {
    if (!em_dtype_is_float(c->in[0]->dtype)) return dtype_error(c, c->in[0]->dtype, FLOATS);
    return infer_same(c, m);
}

em_status infer_cast(const em_op_call *c, em_meta *m) {
    if ((unsigned)c->attrs->dtype >= EM_DTYPE_COUNT)
        return em_error(EM_ERR_DTYPE, "cast: invalid target dtype %d", (int)c->attrs->dtype);
    meta_like(m, c->in[0], c->attrs->dtype);
    return EM_OK;
}

em_status infer_binary(const em_op_call *c, em_meta *m) {
    em_status s = same_dtypes(c, 0, 2);
    if (s != EM_OK) return s;
    if (!is_numeric(c->in[0]->dtype)) return dtype_error(c, c->in[0]->dtype, NUMERIC);
    m->dtype = c->in[0]->dtype;
    return broadcast(c, 2, m);
}

em_status infer_float_binary(const em_op_call *c, em_meta *m) {
    em_status s = same_dtypes(c, 0, 2);
    if (s != EM_OK) return s;
    if (!em_dtype_is_float(c->in[0]->dtype)) return dtype_error(c, c->in[0]->dtype, FLOATS);
    m->dtype = c->in[0]->dtype;
    return broadcast(c, 2, m);
}

em_status infer_compare(const em_op_call *c, em_meta *m) {
    em_status s = same_dtypes(c, 0, 2);
    if (s != EM_OK) return s;
    em_dtype d = c->in[0]->dtype;
    if (!is_numeric(d) && d != EM_BOOL) return dtype_error(c, d, NUMERIC ", bool");
    m->dtype = EM_BOOL;
    return broadcast(c, 2, m);
}

em_status infer_where(const em_op_call *c, em_meta *m) {
    if (c->in[0]->dtype != EM_BOOL)
        return em_error(EM_ERR_DTYPE, "where: the condition has dtype %s, not bool",
                        em_dtype_name(c->in[0]->dtype));
    em_status s = same_dtypes(c, 1, 2);
    if (s != EM_OK) return s;
    m->dtype = c->in[1]->dtype;
    return broadcast(c, 3, m);
}

/* ---- reductions ---- */

static em_status reduce_dims(const em_op_call *c, bool *reduced) {
    const em_op_attrs *a = c->attrs;
    const em_tensor *x = c->in[0];
    memset(reduced, 0, sizeof(bool) * EM_MAX_DIMS);
    if (a->ndims < 0 || a->ndims > (x->ndim ? x->ndim : 0))
        return em_error(EM_ERR_DIM, "%s: %d dims given for a %d-d tensor", OPNAME(c), a->ndims,
                        x->ndim);
    for (int i = 0; i < a->ndims; i++) {
        int d = a->dims[i];
        if (d < 0 || d >= x->ndim)
            return em_error(EM_ERR_DIM, "%s: dim %d is out of range for a %d-d tensor",
                            OPNAME(c), d, x->ndim);
        if (reduced[d]) return em_error(EM_ERR_DIM, "%s: dim %d is repeated", OPNAME(c), d);
        reduced[d] = true;
    }
    return EM_OK;
}

static void reduce_meta(const em_op_call *c, const bool *reduced, em_meta *m) {
    const em_tensor *x = c->in[0];
    m->ndim = 0;
    for (int d = 0; d < x->ndim; d++) {
        if (!reduced[d]) m->sizes[m->ndim++] = x->sizes[d];
        else if (c->attrs->keepdim) m->sizes[m->ndim++] = 1;
    }
}

em_status infer_reduce(const em_op_call *c, em_meta *m) {
    bool reduced[EM_MAX_DIMS];
    em_status s = reduce_dims(c, reduced);
    if (s != EM_OK) return s;
    const em_tensor *x = c->in[0];
    if (!is_numeric(x->dtype) && x->dtype != EM_BOOL)
        return dtype_error(c, x->dtype, NUMERIC ", bool");
    if (c->op == EM_OP_AMAX || c->op == EM_OP_AMIN) {
        for (int d = 0; d < x->ndim; d++)
            if (reduced[d] && x->sizes[d] == 0)
                return em_error(EM_ERR_SHAPE, "%s: dim %d has size 0 (no identity to return)",
                                OPNAME(c), d);
        m->dtype = x->dtype;
    } else {
        m->dtype = em_dtype_is_float(x->dtype) ? x->dtype : EM_I64; /* sum of integers */
    }
    reduce_meta(c, reduced, m);
    return EM_OK;
}

em_status infer_reduce_float(const em_op_call *c, em_meta *m) {
    bool reduced[EM_MAX_DIMS];
    em_status s = reduce_dims(c, reduced);
    if (s != EM_OK) return s;
    if (!em_dtype_is_float(c->in[0]->dtype)) return dtype_error(c, c->in[0]->dtype, FLOATS);
    m->dtype = c->in[0]->dtype;
    reduce_meta(c, reduced, m);
    return EM_OK;
}

em_status infer_argmax(const em_op_call *c, em_meta *m) {
    const em_tensor *x = c->in[0];
    int d = c->attrs->dim;
    if (!is_numeric(x->dtype) && x->dtype != EM_BOOL)
        return dtype_error(c, x->dtype, NUMERIC ", bool");
    if (x->ndim == 0) {
        if (d != 0) return em_error(EM_ERR_DIM, "argmax: dim %d is out of range for a 0-d tensor", d);
        m->ndim = 0;
        m->dtype = EM_I64;
        return EM_OK;
    }
    if (d < 0 || d >= x->ndim)
        return em_error(EM_ERR_DIM, "argmax: dim %d is out of range for a %d-d tensor", d, x->ndim);
    if (x->sizes[d] == 0)
        return em_error(EM_ERR_SHAPE, "argmax: dim %d has size 0", d);
    bool reduced[EM_MAX_DIMS] = {0};
    reduced[d] = true;
    reduce_meta(c, reduced, m);
    m->dtype = EM_I64;
    return EM_OK;
}

/* ---- views ---- */

static void view_of(em_meta *m, const em_tensor *x) {
    m->dtype = x->dtype;
    m->device = x->device;
    m->offset = x->offset;
}

/* The strides that view x with sizes (numel equal), or false when x's
 * strides cannot express it (then reshape must copy).  As ATen's
 * computeStride: walk x's dims in chunks that are contiguous among
 * themselves and map each chunk onto a run of new dims. */
static bool view_strides(const em_tensor *x, int nd, const int64_t *sizes, int64_t *strides) {
    int64_t numel = em_shape_numel(x->ndim, x->sizes);
    if (numel == 0) {
        em_contiguous_strides(nd, sizes, strides);
        return true;
    }
    int view_d = nd - 1;
    int64_t chunk_base_stride = x->ndim ? x->strides[x->ndim - 1] : 1;
    int64_t tensor_numel = 1, view_numel = 1;
    for (int td = x->ndim - 1; td >= 0; td--) {
        tensor_numel *= x->sizes[td];
        if (td == 0 || (x->sizes[td - 1] != 1 &&
                        x->strides[td - 1] != tensor_numel * chunk_base_stride)) {
            while (view_d >= 0 && (view_numel < tensor_numel || sizes[view_d] == 1)) {
                strides[view_d] = view_numel * chunk_base_stride;
                view_numel *= sizes[view_d];
                view_d--;
            }
            if (view_numel != tensor_numel) return false;
            if (td > 0) {
                chunk_base_stride = x->strides[td - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    if (view_d != -1) {
        /* only size-1 dims left */
        for (; view_d >= 0; view_d--) strides[view_d] = 1;
    }
    return true;
}

bool em_can_view(const em_tensor *x, int nd, const int64_t *sizes);
bool em_can_view(const em_tensor *x, int nd, const int64_t *sizes) {
    int64_t strides[EM_MAX_DIMS];
    return view_strides(x, nd, sizes, strides);
}

em_status infer_reshape(const em_op_call *c, em_meta *m) {
    const em_tensor *x = c->in[0];
    const em_op_attrs *a = c->attrs;
    char s1[160], s2[160];
    if (a->ndim < 0 || a->ndim > EM_MAX_DIMS)
        return em_error(EM_ERR_DIM, "reshape: %d dims (at most %d)", a->ndim, EM_MAX_DIMS);
    int64_t n = em_shape_numel(a->ndim, a->sizes);
    if (n < 0 || n != em_shape_numel(x->ndim, x->sizes))
        return em_error(EM_ERR_SHAPE, "reshape: cannot view %s as %s",
                        em_shape_str(x->ndim, x->sizes, s1, sizeof s1),
                        em_shape_str(a->ndim, a->sizes, s2, sizeof s2));
    view_of(m, x);
    m->ndim = a->ndim;
    memcpy(m->sizes, a->sizes, sizeof(int64_t) * (size_t)a->ndim);
    if (!view_strides(x, a->ndim, a->sizes, m->strides))
        return em_error(EM_ERR_SHAPE, "reshape: the strides of %s cannot view it as %s "
                        "(make it contiguous first)",
                        em_shape_str(x->ndim, x->sizes, s1, sizeof s1),
                        em_shape_str(a->ndim, a->sizes, s2, sizeof s2));
    return EM_OK;
}

em_status infer_permute(const em_op_call *c, em_meta *m) {
    const em_tensor *x = c->in[0];
    const em_op_attrs *a = c->attrs;
    bool seen[EM_MAX_DIMS] = {0};
    if (a->ndims != x->ndim)
        return em_error(EM_ERR_DIM, "permute: %d dims given for a %d-d tensor", a->ndims, x->ndim);
    view_of(m, x);
    m->ndim = x->ndim;
    for (int i = 0; i < a->ndims; i++) {
        int d = a->dims[i];
        if (d < 0 || d >= x->ndim || seen[d])
            return em_error(EM_ERR_DIM, "permute: entry %d (%d) is out of range or repeated", i, d);
        seen[d] = true;
        m->sizes[i] = x->sizes[d];
        m->strides[i] = x->strides[d];
    }
    return EM_OK;
}

em_status infer_slice(const em_op_call *c, em_meta *m) {
    const em_tensor *x = c->in[0];
    const em_op_attrs *a = c->attrs;
    int d = a->dim;
    if (d < 0 || d >= x->ndim)
        return em_error(EM_ERR_DIM, "slice: dim %d is out of range for a %d-d tensor", d, x->ndim);
    if (a->step <= 0) return em_error(EM_ERR_ARG, "slice: step %lld is not positive", (long long)a->step);
    if (a->start < 0 || a->start > a->end || a->end > x->sizes[d])
        return em_error(EM_ERR_ARG, "slice: range [%lld, %lld) is not within [0, %lld]",
                        (long long)a->start, (long long)a->end, (long long)x->sizes[d]);
    view_of(m, x);
    m->ndim = x->ndim;
    memcpy(m->sizes, x->sizes, sizeof(int64_t) * (size_t)x->ndim);
    memcpy(m->strides, x->strides, sizeof(int64_t) * (size_t)x->ndim);
    m->sizes[d] = (a->end - a->start + a->step - 1) / a->step;
    m->strides[d] = x->strides[d] * a->step;
    if (m->sizes[d] > 0) m->offset += a->start * x->strides[d];
    return EM_OK;
}

em_status infer_expand(const em_op_call *c, em_meta *m) {
    const em_tensor *x = c->in[0];
    const em_op_attrs *a = c->attrs;
    char s1[160], s2[160];
    if (a->ndim < x->ndim || a->ndim > EM_MAX_DIMS)
        return em_error(EM_ERR_DIM, "expand: %d dims given for a %d-d tensor", a->ndim, x->ndim);
    view_of(m, x);
    m->ndim = a->ndim;
    int shift = a->ndim - x->ndim;
    for (int d = 0; d < a->ndim; d++) {
        int xd = d - shift;
        int64_t want = a->sizes[d];
        if (xd < 0) {
            if (want < 0) return em_error(EM_ERR_ARG, "expand: size %lld for a new dim", (long long)want);
            m->sizes[d] = want;
            m->strides[d] = 0;
        } else if (want == -1 || want == x->sizes[xd]) {
            m->sizes[d] = x->sizes[xd];
            m->strides[d] = x->strides[xd];
        } else if (x->sizes[xd] == 1 && want >= 0) {
            m->sizes[d] = want;
            m->strides[d] = 0;
        } else {
            return em_error(EM_ERR_SHAPE, "expand: cannot expand %s to %s",
                            em_shape_str(x->ndim, x->sizes, s1, sizeof s1),
                            em_shape_str(a->ndim, a->sizes, s2, sizeof s2));
        }
    }
    return check_size(c, m);
}

em_status infer_squeeze(const em_op_call *c, em_meta *m) {
    const em_tensor *x = c->in[0];
    int d = c->attrs->dim;
    if (d < 0 || d >= x->ndim)
        return em_error(EM_ERR_DIM, "squeeze: dim %d is out of range for a %d-d tensor", d, x->ndim);
    if (x->sizes[d] != 1)
        return em_error(EM_ERR_SHAPE, "squeeze: dim %d has size %lld, not 1", d,
                        (long long)x->sizes[d]);
    view_of(m, x);
    m->ndim = 0;
    for (int i = 0; i < x->ndim; i++) {
        if (i == d) continue;
        m->sizes[m->ndim] = x->sizes[i];
        m->strides[m->ndim++] = x->strides[i];
    }
    return EM_OK;
}

em_status infer_unsqueeze(const em_op_call *c, em_meta *m) {
    const em_tensor *x = c->in[0];
    int d = c->attrs->dim;
    if (x->ndim >= EM_MAX_DIMS)
        return em_error(EM_ERR_DIM, "unsqueeze: the tensor already has %d dims", x->ndim);
    if (d < 0 || d > x->ndim)
        return em_error(EM_ERR_DIM, "unsqueeze: dim %d is out of range [0, %d]", d, x->ndim);
    view_of(m, x);
    m->ndim = x->ndim + 1;
    for (int i = 0, j = 0; i < m->ndim; i++) {
        if (i == d) {
            m->sizes[i] = 1;
            /* any stride works for size 1; this one keeps contiguity visible */
            m->strides[i] = j < x->ndim ? x->strides[j] * x->sizes[j] : 1;
            continue;
        }
        m->sizes[i] = x->sizes[j];
        m->strides[i] = x->strides[j++];
    }
    return EM_OK;
}

/* ---- data movement ---- */

em_status infer_cat(const em_op_call *c, em_meta *m) {
    if (c->nin < 1) return em_error(EM_ERR_ARG, "cat: no tensors given");
    const em_tensor *x = c->in[0];
    int d = c->attrs->dim;
    if (x->ndim == 0) return em_error(EM_ERR_DIM, "cat: cannot concatenate 0-d tensors");
    if (d < 0 || d >= x->ndim)
        return em_error(EM_ERR_DIM, "cat: dim %d is out of range for a %d-d tensor", d, x->ndim);
    em_status s = same_dtypes(c, 0, c->nin);
    if (s != EM_OK) return s;
    meta_like(m, x, x->dtype);
    m->sizes[d] = 0;
    for (int k = 0; k < c->nin; k++) {
        const em_tensor *t = c->in[k];
        char s1[160], s2[160];
        bool ok = t->ndim == x->ndim;
        for (int i = 0; ok && i < x->ndim; i++)
            if (i != d && t->sizes[i] != x->sizes[i]) ok = false;
        if (!ok)
            return em_error(EM_ERR_SHAPE, "cat: input %d of sizes %s does not match %s outside dim %d",
                            k, em_shape_str(t->ndim, t->sizes, s1, sizeof s1),
                            em_shape_str(x->ndim, x->sizes, s2, sizeof s2), d);
        if (__builtin_add_overflow(m->sizes[d], t->sizes[d], &m->sizes[d]))
            return em_error(EM_ERR_OVERFLOW, "cat: the sizes along dim %d overflow", d);
    }
    return check_size(c, m);
}

/* index_select's and index_copy_'s checks of x (in 0), idx (in 1) and dim. */
static em_status check_indexing(const em_op_call *c) {
    const em_tensor *x = c->in[0], *idx = c->in[1];
    int d = c->attrs->dim;
    if (idx->dtype != EM_I32 && idx->dtype != EM_I64)
        return em_error(EM_ERR_DTYPE, "%s: indices have dtype %s (expects i32 or i64)", OPNAME(c),
                        em_dtype_name(idx->dtype));
    if (idx->ndim > 1)
        return em_error(EM_ERR_SHAPE, "%s: indices must be 1-d, not %d-d", OPNAME(c), idx->ndim);
    if (x->ndim == 0) return em_error(EM_ERR_DIM, "%s: cannot index a 0-d tensor", OPNAME(c));
    if (d < 0 || d >= x->ndim)
        return em_error(EM_ERR_DIM, "%s: dim %d is out of range for a %d-d tensor", OPNAME(c), d,
                        x->ndim);
    return EM_OK;
}

em_status infer_index_select(const em_op_call *c, em_meta *m) {
    const em_tensor *x = c->in[0], *idx = c->in[1];
    int d = c->attrs->dim;
    em_status st = check_indexing(c);
    if (st != EM_OK) return st;
    meta_like(m, x, x->dtype);
    m->sizes[d] = em_shape_numel(idx->ndim, idx->sizes);
    return check_size(c, m);
}

/* index_copy_(dst, idx, src): src is dst's shape but for dim, where it has
 * numel(idx) entries; the result is dst itself (its layout too). */
em_status infer_index_copy(const em_op_call *c, em_meta *m) {
    const em_tensor *x = c->in[0], *idx = c->in[1], *src = c->in[2];
    int d = c->attrs->dim;
    char s1[160], s2[160];
    em_status st = check_indexing(c);
    if (st != EM_OK) return st;
    if (src->dtype != x->dtype)
        return em_error(EM_ERR_DTYPE, "index_copy_: source dtype %s differs from the tensor's %s",
                        em_dtype_name(src->dtype), em_dtype_name(x->dtype));
    bool ok = src->ndim == x->ndim;
    for (int i = 0; ok && i < x->ndim; i++)
        ok = i == d ? src->sizes[i] == em_shape_numel(idx->ndim, idx->sizes) : src->sizes[i] == x->sizes[i];
    if (!ok)
        return em_error(EM_ERR_SHAPE,
                        "index_copy_: source of sizes %s does not fit %s with %lld indices along dim %d",
                        em_shape_str(src->ndim, src->sizes, s1, sizeof s1),
                        em_shape_str(x->ndim, x->sizes, s2, sizeof s2),
                        (long long)em_shape_numel(idx->ndim, idx->sizes), d);
    for (int i = 0; i < x->ndim; i++)
        if (x->strides[i] == 0 && x->sizes[i] > 1)
            return em_error(EM_ERR_ARG, "index_copy_: the tensor is broadcast along dim %d (several "
                            "elements share one location, so it cannot be written)", i);
    meta_like(m, x, x->dtype);
    memcpy(m->strides, x->strides, sizeof(int64_t) * (size_t)x->ndim);
    m->offset = x->offset;
    return EM_OK;
}

em_status infer_matmul(const em_op_call *c, em_meta *m) {
    const em_tensor *a = c->in[0], *b = c->in[1];
    char s1[160], s2[160];
    em_status s = same_dtypes(c, 0, 2);
    if (s != EM_OK) return s;
    if (!is_numeric(a->dtype)) return dtype_error(c, a->dtype, NUMERIC);
    if (a->ndim < 2 || b->ndim < 2)
        return em_error(EM_ERR_SHAPE, "matmul: operands must have at least 2 dims here (%d, %d)",
                        a->ndim, b->ndim);
    int64_t k1 = a->sizes[a->ndim - 1], k2 = b->sizes[b->ndim - 2];
    if (k1 != k2)
        return em_error(EM_ERR_SHAPE, "matmul: %s @ %s: inner sizes %lld and %lld differ",
                        em_shape_str(a->ndim, a->sizes, s1, sizeof s1),
                        em_shape_str(b->ndim, b->sizes, s2, sizeof s2), (long long)k1,
                        (long long)k2);
    int nb = (a->ndim > b->ndim ? a->ndim : b->ndim) - 2;
    m->ndim = nb + 2;
    for (int d = 0; d < nb; d++) {
        int ad = d - (nb - (a->ndim - 2)), bd = d - (nb - (b->ndim - 2));
        int64_t sa = ad >= 0 ? a->sizes[ad] : 1, sb = bd >= 0 ? b->sizes[bd] : 1;
        if (sa != sb && sa != 1 && sb != 1)
            return em_error(EM_ERR_SHAPE, "matmul: batch dims of %s and %s do not broadcast",
                            em_shape_str(a->ndim, a->sizes, s1, sizeof s1),
                            em_shape_str(b->ndim, b->sizes, s2, sizeof s2));
        m->sizes[d] = sa == 1 ? sb : sa;
    }
    m->sizes[nb] = a->sizes[a->ndim - 2];
    m->sizes[nb + 1] = b->sizes[b->ndim - 1];
    m->dtype = a->dtype;
    return check_size(c, m);
}

/* Whether bias adds along the rows of a result of meta m: sizes 1 but
 * its last, which is m's last, and no more dims than m. */
bool em_is_row_bias(const em_meta *m, int ndim, const int64_t *sizes) {
    if (ndim < 1 || ndim > m->ndim || sizes[ndim - 1] != m->sizes[m->ndim - 1]) return false;
    for (int d = 0; d < ndim - 1; d++)
        if (sizes[d] != 1) return false;
    return true;
}

em_status infer_linear(const em_op_call *c, em_meta *m) {
    em_status s = infer_matmul(c, m);
    if (s != EM_OK) return s;
    const em_tensor *bias = c->in[2];
    char s1[160], s2[160];
    if ((unsigned)c->attrs->act >= EM_ACT_COUNT)
        return em_error(EM_ERR_ARG, "linear: activation %d is not none, relu, gelu_tanh or gelu",
                        (int)c->attrs->act);
    if (bias->dtype != m->dtype)
        return em_error(EM_ERR_DTYPE, "linear: bias is %s, the product %s", em_dtype_name(bias->dtype),
                        em_dtype_name(m->dtype));
    if (!em_is_row_bias(m, bias->ndim, bias->sizes))
        return em_error(EM_ERR_SHAPE, "linear: bias %s does not add along the rows of %s",
                        em_shape_str(bias->ndim, bias->sizes, s1, sizeof s1),
                        em_shape_str(m->ndim, m->sizes, s2, sizeof s2));
    return EM_OK;
}

/* ---- attention ---- */

/* Whether n batch dims of t (right-aligned to the last nb of the result,
 * t's own last two dims excluded) broadcast into bsz; widens bsz. */
static bool broadcast_batch(const em_tensor *t, int nb, int64_t *bsz) {
    int tb = t->ndim - 2;
    for (int d = 0; d < tb; d++) {
        int64_t s = t->sizes[d], *o = &bsz[d + nb - tb];
        if (s != 1 && *o != 1 && s != *o) return false;
        if (s != 1) *o = s;
    }
    return true;
}

/* Whether mask broadcasts to the scores' sizes (ndim, sizes) without
 * widening them (torch: "broadcastable to the attention weights"). */
static bool mask_fits(const em_tensor *mask, int ndim, const int64_t *sizes) {
    if (mask->ndim > ndim) return false;
    for (int d = 0; d < mask->ndim; d++) {
        int64_t s = mask->sizes[d], o = sizes[d + ndim - mask->ndim];
        if (s != 1 && s != o) return false;
    }
    return true;
}

em_status em_attention_sizes(const char *fn, const em_tensor *q, const em_tensor *k,
                             const em_tensor *v, const em_tensor *mask, em_meta *m) {
    char s1[160], s2[160];
    const em_tensor *qkv[3] = {q, k, v};
    for (int i = 0; i < 3; i++)
        if (qkv[i]->ndim < 2)
            return em_error(EM_ERR_DIM, "%s: %s must have at least 2 dims [..., T, D], not %d", fn,
                            i == 0 ? "q" : i == 1 ? "k" : "v", qkv[i]->ndim);
    int64_t D = q->sizes[q->ndim - 1], Tq = q->sizes[q->ndim - 2];
    int64_t Tk = k->sizes[k->ndim - 2], Dv = v->sizes[v->ndim - 1];
    if (k->sizes[k->ndim - 1] != D)
        return em_error(EM_ERR_SHAPE, "%s: q %s and k %s have different head sizes", fn,
                        em_shape_str(q->ndim, q->sizes, s1, sizeof s1),
                        em_shape_str(k->ndim, k->sizes, s2, sizeof s2));
    if (v->sizes[v->ndim - 2] != Tk)
        return em_error(EM_ERR_SHAPE, "%s: k %s and v %s have different sequence lengths", fn,
                        em_shape_str(k->ndim, k->sizes, s1, sizeof s1),
                        em_shape_str(v->ndim, v->sizes, s2, sizeof s2));
    int nb = 0;
    for (int i = 0; i < 3; i++)
        if (qkv[i]->ndim - 2 > nb) nb = qkv[i]->ndim - 2;
    memset(m, 0, sizeof *m);
    m->ndim = nb + 2;
    for (int d = 0; d < nb; d++) m->sizes[d] = 1;
    for (int i = 0; i < 3; i++)
        if (!broadcast_batch(qkv[i], nb, m->sizes))
            return em_error(EM_ERR_SHAPE, "%s: the batch dims of q, k and v do not broadcast "
                            "(%s is %s)", fn, i == 0 ? "q" : i == 1 ? "k" : "v",
                            em_shape_str(qkv[i]->ndim, qkv[i]->sizes, s1, sizeof s1));
    m->sizes[nb] = Tq;
    m->sizes[nb + 1] = Tk;
    if (mask && !mask_fits(mask, m->ndim, m->sizes))
        return em_error(EM_ERR_SHAPE, "%s: mask %s does not broadcast to the scores %s", fn,
                        em_shape_str(mask->ndim, mask->sizes, s1, sizeof s1),
                        em_shape_str(m->ndim, m->sizes, s2, sizeof s2));
    m->sizes[nb + 1] = Dv;
    m->dtype = q->dtype;
    m->device = q->device;
    return EM_OK;
}

/* attention(q, k, v [, mask]): f32, or f16/bf16 (the CUDA kernel's, on
 * sm_80 on; the CPU kernel takes f32 only, and the attention pass makes
 * half nodes only for a device that takes them); the additive mask, when
 * given, has q's dtype too. */
em_status infer_attention(const em_op_call *c, em_meta *m) {
    if (c->nin != 3 && c->nin != 4)
        return em_error(EM_ERR_ARG, "attention: takes q, k, v and an optional mask, not %d inputs",
                        c->nin);
    em_dtype dt = c->in[0]->dtype;
    for (int i = 0; i < c->nin; i++)
        if (c->in[i]->dtype != dt || (dt != EM_F32 && !em_is_half(dt)))
            return dtype_error(c, c->in[i]->dtype, "one of f32, f16, bf16 for q, k, v and the mask");
    if (!(c->attrs->value == c->attrs->value) || isinf(c->attrs->value))
        return em_error(EM_ERR_ARG, "attention: scale %g is not finite", c->attrs->value);
    em_status s = em_attention_sizes("attention", c->in[0], c->in[1], c->in[2],
                                     c->nin == 4 ? c->in[3] : NULL, m);
    return s == EM_OK ? check_size(c, m) : s;
}
