/* cpu_index.c - cat, index_select and index_copy_ on CPU.
 *
 * Both copy blocks of the source into a contiguous output.  Around the op's
 * dim the source is [outer..., dim, inner...]:
 *  - cat: for each outer index, the slab source[o, :, ...] (the dim and the
 *    inner dims together) lands contiguously at the input's offset in the
 *    output's dim;
 *  - index_select: for each outer index o and j < numel(idx), the block
 *    source[o, idx[j], ...] lands at output row (o, j).
 * A block is one memcpy when it is contiguous in the source (after merging
 * dims that are contiguous with each other), else a strided copy run by run.
 * Long blocks are split into chunks so that few outer indices still spread
 * over threads. */
#include "cpu.h"

#include <string.h>

#define COPY_CHUNK 65536 /* elements per work item at most */

typedef struct rowcopy {
    const char *src;  /* source element 0 */
    char *dst;        /* output element 0 */
    int64_t esz;
    /* source dims before dim (the outer dims), merged */
    int no;
    int64_t osz[EM_MAX_DIMS], ost[EM_MAX_DIMS];
    int64_t nouter;
    int64_t nrows;    /* blocks per outer index */
    int64_t sdim;     /* source stride between blocks j (elements) */
    const char *idx;  /* index_select: the indices; NULL: block j is source block j */
    em_dtype idt;
    int64_t idst;     /* byte stride of idx */
    int64_t dst_ost;  /* output elements per outer index */
    int64_t dst0;     /* output element offset of block (0, 0) */
    /* one block's dims, merged, innermost last */
    int ni;
    int64_t isz[EM_MAX_DIMS], ist[EM_MAX_DIMS];
    int64_t len;      /* elements per block */
    bool contig;      /* the block is one contiguous run */
    int64_t chunk, nch;
} rowcopy;

/* em_dims_push, leaving out size-1 dims (they step nowhere) */
static void push_dim(int64_t *sz, int64_t *st, int *n, int64_t s, int64_t t) {
    if (s != 1) em_dims_push(sz, st, n, s, t);
}

/* The geometry of copying src: outer dims [0, dim), block dims [bdim, ndim). */
static void rowcopy_init(rowcopy *R, const em_tensor *src, int dim, int bdim) {
    memset(R, 0, sizeof *R);
    R->src = em_data(src);
    R->esz = (int64_t)em_dtype_size(src->dtype);
    R->nouter = 1;
    for (int d = 0; d < dim; d++) {
        push_dim(R->osz, R->ost, &R->no, src->sizes[d], src->strides[d]);
        R->nouter *= src->sizes[d];
    }
    R->len = 1;
    for (int d = bdim; d < src->ndim; d++) {
        push_dim(R->isz, R->ist, &R->ni, src->sizes[d], src->strides[d]);
        R->len *= src->sizes[d];
    }
    R->contig = R->ni == 0 || (R->ni == 1 && R->ist[0] == 1);
    if (R->ni == 0) { /* one element */
        R->isz[0] = 1;
        R->ist[0] = 0;
        R->ni = 1;
    }
    R->nch = R->len > COPY_CHUNK ? (R->len + COPY_CHUNK - 1) / COPY_CHUNK : 1;
    R->chunk = R->nch > 1 ? COPY_CHUNK : R->len;
}

/* Copies elements [lo, hi) of the block at src into dst (contiguous). */
static void copy_range(const rowcopy *R, char *dst, const char *src, int64_t lo, int64_t hi) {
    int64_t esz = R->esz;
    if (R->contig) {
        memcpy(dst + lo * esz, src + lo * esz, (size_t)((hi - lo) * esz));
        return;
    }
    int ni = R->ni;
    int64_t last = R->isz[ni - 1], lst = R->ist[ni - 1] * esz;
    int64_t idx[EM_MAX_DIMS], off = 0, r = lo / last, pos = lo % last;
    for (int d = ni - 2; d >= 0; d--) {
        idx[d] = r % R->isz[d];
        r /= R->isz[d];
        off += idx[d] * R->ist[d] * esz;
    }
    dst += lo * esz;
    for (int64_t cur = lo; cur < hi;) {
        int64_t n = last - pos;
        if (n > hi - cur) n = hi - cur;
        const char *s = src + off + pos * lst;
        switch (esz) {
        case 1:
            for (int64_t i = 0; i < n; i++) ((uint8_t *)dst)[i] = *(const uint8_t *)(s + i * lst);
            break;
        case 2:
            for (int64_t i = 0; i < n; i++)
                ((uint16_t *)dst)[i] = *(const uint16_t *)(s + i * lst);
            break;
        case 4:
            for (int64_t i = 0; i < n; i++)
                ((uint32_t *)dst)[i] = *(const uint32_t *)(s + i * lst);
            break;
        case 8:
            for (int64_t i = 0; i < n; i++)
                ((uint64_t *)dst)[i] = *(const uint64_t *)(s + i * lst);
            break;
        default:
            for (int64_t i = 0; i < n; i++) memcpy(dst + i * esz, s + i * lst, (size_t)esz);
            break;
        }
        dst += n * esz;
        cur += n;
        pos = 0;
        for (int d = ni - 2; d >= 0; d--) {
            off += R->ist[d] * esz;
            if (++idx[d] < R->isz[d]) break;
            off -= R->ist[d] * R->isz[d] * esz;
            idx[d] = 0;
        }
    }
}

static int64_t load_index(const rowcopy *R, int64_t j) {
    const char *p = R->idx + j * R->idst;
    return R->idt == EM_I32 ? (int64_t) * (const int32_t *)p : *(const int64_t *)p;
}

/* Work items [b, e): item = ((o * nrows) + j) * nch + chunk. */
static void copy_items(void *ctx, int64_t b, int64_t e) {
    const rowcopy *R = ctx;
    int64_t ch = b % R->nch, row = b / R->nch;
    int64_t o = row / R->nrows, j = row % R->nrows;
    int64_t oidx[EM_MAX_DIMS], ooff = 0, r = o;
    for (int d = R->no - 1; d >= 0; d--) {
        oidx[d] = r % R->osz[d];
        r /= R->osz[d];
        ooff += oidx[d] * R->ost[d];
    }
    for (int64_t it = b; it < e; it++) {
        int64_t s = R->idx ? load_index(R, j) : j;
        const char *src = R->src + (ooff + s * R->sdim) * R->esz;
        char *dst = R->dst + (R->dst0 + o * R->dst_ost + j * R->len) * R->esz;
        int64_t lo = ch * R->chunk, hi = lo + R->chunk;
        if (hi > R->len) hi = R->len;
        copy_range(R, dst, src, lo, hi);
        if (++ch < R->nch) continue;
        ch = 0;
        if (++j < R->nrows) continue;
        j = 0;
        o++;
        for (int d = R->no - 1; d >= 0; d--) {
            ooff += R->ost[d];
            if (++oidx[d] < R->osz[d]) break;
            ooff -= R->ost[d] * R->osz[d];
            oidx[d] = 0;
        }
    }
}

static void run_copy(rowcopy *R) {
    int64_t n = R->nouter * R->nrows * R->nch;
    if (n == 0 || R->len == 0) return;
    int64_t grain = EM_PARALLEL_GRAIN / (R->chunk > 0 ? R->chunk : 1);
    if (grain < 1) grain = 1;
    em_parallel_for(n, grain, copy_items, R);
}

static int64_t numel_of(const em_tensor *t) {
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= t->sizes[d];
    return n;
}

em_status cpu_cat(const em_op_call *c, em_tensor *out) {
    if (numel_of(out) == 0) return EM_OK;
    int dim = c->attrs->dim;
    if (out->ndim == 0 || dim < 0 || dim >= out->ndim)
        return em_error(EM_ERR_DIM, "cat: dim %d is out of range for a %d-d tensor", dim,
                        out->ndim);
    int64_t inner = 1;
    for (int d = dim + 1; d < out->ndim; d++) inner *= out->sizes[d];
    int64_t off = 0;
    for (int k = 0; k < c->nin; k++) {
        const em_tensor *x = c->in[k];
        if (x->dtype != out->dtype || x->ndim != out->ndim)
            return em_error(EM_ERR_SHAPE, "cat: input %d does not match the output", k);
        if (off + x->sizes[dim] > out->sizes[dim])
            return em_error(EM_ERR_SHAPE, "cat: inputs exceed the output along dim %d", dim);
        if (x->sizes[dim] > 0) {
            rowcopy R;
            rowcopy_init(&R, x, dim, dim); /* the slab: dim and the inner dims */
            R.dst = em_data(out);
            R.nrows = 1;
            R.dst_ost = out->sizes[dim] * inner;
            R.dst0 = off * inner;
            run_copy(&R);
        }
        off += x->sizes[dim];
    }
    return EM_OK;
}

em_status cpu_index_select(const em_op_call *c, em_tensor *out) {
    const em_tensor *x = c->in[0], *idx = c->in[1];
    int dim = c->attrs->dim;
    if (x->ndim == 0 || dim < 0 || dim >= x->ndim)
        return em_error(EM_ERR_DIM, "index_select: dim %d is out of range for a %d-d tensor", dim,
                        x->ndim);
    if (idx->dtype != EM_I32 && idx->dtype != EM_I64)
        return em_error(EM_ERR_DTYPE, "index_select: indices have dtype %s (expects i32 or i64)",
                        em_dtype_name(idx->dtype));
    if (idx->ndim > 1)
        return em_error(EM_ERR_SHAPE, "index_select: indices must be 1-d, not %d-d", idx->ndim);
    int64_t n = idx->ndim == 1 ? idx->sizes[0] : 1;
    rowcopy R;
    rowcopy_init(&R, x, dim, dim + 1);
    R.idt = idx->dtype;
    R.idst = (idx->ndim == 1 ? idx->strides[0] : 0) * (int64_t)em_dtype_size(idx->dtype);
    /* Every index is checked before anything is written. */
    if (n > 0) {
        R.idx = em_data(idx);
        int64_t size = x->sizes[dim];
        for (int64_t j = 0; j < n; j++) {
            int64_t i = load_index(&R, j);
            if (i < 0 || i >= size)
                return em_error(EM_ERR_INDEX,
                                "index_select: index %lld is out of range for dim %d of size %lld",
                                (long long)i, dim, (long long)size);
        }
    }
    if (numel_of(out) == 0) return EM_OK;
    R.dst = em_data(out);
    R.nrows = n;
    R.sdim = x->strides[dim];
    R.dst_ost = n * R.len;
    R.dst0 = 0;
    run_copy(&R);
    return EM_OK;
}

/* ---- index_copy_: out (a view of dst) [..., idx[j], ...] = src[..., j, ...] ----
 * Each item is one row of src (all dims but the last), copied element by
 * element through both tensors' strides: the rows a KV cache takes are
 * few, and dst may be any non-broadcast view. */

typedef struct scatter {
    const em_tensor *src, *idx;
    em_tensor *dst;
    int dim;
    int64_t esz, rows, len;
} scatter;

static int64_t index_at(const em_tensor *idx, int64_t j) {
    const char *p = (const char *)em_data(idx) + j * (idx->ndim ? idx->strides[0] : 0) *
                                                     (int64_t)em_dtype_size(idx->dtype);
    return idx->dtype == EM_I32 ? (int64_t) * (const int32_t *)p : *(const int64_t *)p;
}

static void scatter_rows(void *ctx, int64_t b, int64_t e) {
    const scatter *S = ctx;
    const em_tensor *src = S->src;
    em_tensor *dst = S->dst;
    int nd = src->ndim, last = nd - 1;
    const char *s0 = em_data(src);
    char *d0 = em_data(dst);
    for (int64_t row = b; row < e; row++) {
        int64_t soff = 0, doff = 0, r = row;
        for (int d = last - 1; d >= 0; d--) {
            int64_t c = r % src->sizes[d];
            r /= src->sizes[d];
            soff += c * src->strides[d];
            doff += (d == S->dim ? index_at(S->idx, c) : c) * dst->strides[d];
        }
        int64_t ss = src->strides[last], ds = dst->strides[last];
        for (int64_t i = 0; i < S->len; i++) {
            int64_t di = last == S->dim ? index_at(S->idx, i) : i;
            memcpy(d0 + (doff + di * ds) * S->esz, s0 + (soff + i * ss) * S->esz, (size_t)S->esz);
        }
    }
}

em_status cpu_index_copy(const em_op_call *c, em_tensor *out) {
    const em_tensor *idx = c->in[1], *src = c->in[2];
    int dim = c->attrs->dim;
    if (out->ndim == 0 || dim < 0 || dim >= out->ndim || src->ndim != out->ndim ||
        src->dtype != out->dtype)
        return em_error(EM_ERR_SHAPE, "index_copy_: the source does not match the tensor");
    /* Every index is checked before anything is written. */
    int64_t n = idx->ndim == 1 ? idx->sizes[0] : 1, size = out->sizes[dim];
    for (int64_t j = 0; j < n && numel_of(src) > 0; j++) {
        int64_t i = index_at(idx, j);
        if (i < 0 || i >= size)
            return em_error(EM_ERR_INDEX, "index_copy_: index %lld is out of range for dim %d of size %lld",
                            (long long)i, dim, (long long)size);
    }
    scatter S = {src, idx, out, dim, (int64_t)em_dtype_size(out->dtype), 1, src->sizes[src->ndim - 1]};
    for (int d = 0; d < src->ndim - 1; d++) S.rows *= src->sizes[d];
    if (S.rows == 0 || S.len == 0) return EM_OK;
    int64_t grain = EM_PARALLEL_GRAIN / S.len;
    em_parallel_for(S.rows, grain < 1 ? 1 : grain, scatter_rows, &S);
    return EM_OK;
}
