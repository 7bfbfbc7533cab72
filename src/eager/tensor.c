/* tensor.c - tensors and storage: lifetime, metadata, host I/O.
 *
 * A tensor is a view (sizes, strides, offset, dtype) of a refcounted
 * storage; views share it.  Ownership of a tensor is a count of references:
 * one held by its scope (or by the caller) plus one per em_retain. */
#include "config.h"
#include "eager.h"
#include "cpu.h"

#include <stdatomic.h>
#include <string.h>

static const size_t dtype_sizes[EM_DTYPE_COUNT] = {
    [EM_F32] = 4, [EM_F64] = 8, [EM_I32] = 4, [EM_I64] = 8,
    [EM_BOOL] = 1, [EM_F16] = 2, [EM_BF16] = 2,
};
static const char *const dtype_names[EM_DTYPE_COUNT] = {
    [EM_F32] = "f32", [EM_F64] = "f64", [EM_I32] = "i32", [EM_I64] = "i64",
    [EM_BOOL] = "bool", [EM_F16] = "f16", [EM_BF16] = "bf16",
};

static bool dtype_valid(em_dtype d) { return (unsigned)d < EM_DTYPE_COUNT; }

const char *em_dtype_name(em_dtype d) { return dtype_valid(d) ? dtype_names[d] : "invalid"; }
size_t em_dtype_size(em_dtype d) { return dtype_valid(d) ? dtype_sizes[d] : 0; }
bool em_dtype_is_float(em_dtype d) {
    return d == EM_F32 || d == EM_F64 || d == EM_F16 || d == EM_BF16;
}

/* bool < i32 < i64 < f16, bf16 < f32 < f64; f16 with bf16 meets at f32. */
em_dtype em_promote_types(em_dtype a, em_dtype b) {
    static const int rank[EM_DTYPE_COUNT] = {
        [EM_BOOL] = 0, [EM_I32] = 1, [EM_I64] = 2, [EM_F16] = 3,
        [EM_BF16] = 3, [EM_F32] = 4, [EM_F64] = 5,
    };
    if (a == b) return a;
    if (!dtype_valid(a) || !dtype_valid(b)) return EM_DTYPE_COUNT;
    if (rank[a] == rank[b]) return EM_F32; /* f16 with bf16 */
    return rank[a] > rank[b] ? a : b;
}

em_device em_cpu(void) { return (em_device){EM_CPU, 0}; }
em_device em_cuda(int index) { return (em_device){EM_CUDA, index}; }

bool em_same_device(em_device a, em_device b) {
    return a.type == b.type && (a.type == EM_CPU || a.index == b.index);
}

const char *em_device_name(em_device d, char *buf, size_t n) {
    if (d.type == EM_CPU) snprintf(buf, n, "cpu");
    else if (d.type == EM_CUDA) snprintf(buf, n, "cuda:%d", d.index);
    else snprintf(buf, n, "device(%d)", (int)d.type);
    return buf;
}

/* ---- The device registry (eager.h says why it is process-wide) ---- */

static const char *const device_type_names[EM_DEVICE_TYPE_COUNT] = {[EM_CPU] = "cpu", [EM_CUDA] = "cuda"};
static const em_backend *_Atomic device_tables[EM_DEVICE_TYPE_COUNT] = {[EM_CPU] = &em_cpu_backend};

static bool device_type_valid(em_device_type t) { return (unsigned)t < EM_DEVICE_TYPE_COUNT; }

em_status em_register_device(em_device_type t, const em_backend *b) {
    if (!device_type_valid(t))
        return em_error(EM_ERR_ARG, "em_register_device: invalid device type %d", (int)t);
    const char *tn = device_type_names[t];
    if (!b) return em_error(EM_ERR_NULL, "em_register_device: the %s table is NULL", tn);
    if (!b->name || !b->available || !b->alloc || !b->free || !b->copy || !b->run)
        return em_error(EM_ERR_ARG, "em_register_device: the %s table lacks a required member "
                        "(name, available, alloc, free, copy and run are)", tn);
    const em_backend *old = NULL;
    if (atomic_compare_exchange_strong_explicit(&device_tables[t], &old, b, memory_order_acq_rel,
                                                memory_order_acquire) || old == b)
        return EM_OK;
    return em_error(EM_ERR_STATE, "em_register_device: device type %s already has a table (\"%s\"); "
                    "\"%s\" cannot replace it", tn, old->name, b->name);
}

const em_backend *em_registered_device(em_device_type t) {
    return device_type_valid(t) ? atomic_load_explicit(&device_tables[t], memory_order_acquire) : NULL;
}

bool em_device_available(em_device d) { return em_backend_for(d) != NULL; }

const em_backend *em_backend_for(em_device d) {
    char name[32];
    if (d.type == EM_CPU) return &em_cpu_backend; /* every op's path: no indirect call */
    if (!device_type_valid(d.type)) {
        em_error(EM_ERR_DEVICE, "invalid device type %d", (int)d.type);
        return NULL;
    }
    const em_backend *b = em_registered_device(d.type);
    if (!b) {
#ifdef EMBER_HAVE_CUDA
        const char *why = "no backend is registered for its type";
#else
        const char *why = d.type == EM_CUDA ? "this build of Ember has no CUDA backend"
                                            : "no backend is registered for its type";
#endif
        em_error(EM_ERR_DEVICE, "device %s: %s", em_device_name(d, name, sizeof name), why);
        return NULL;
    }
    return b->available(d) ? b : NULL; /* available() sets the reason (no driver, no such device) */
}

/* ---- Shapes ---- */

/* A shape is valid when the product of its sizes, each at least 1, fits
 * in int64: that bounds the element count and also every contiguous stride
 * (a size-0 tensor of sizes [0, 2^40, 2^40] holds nothing, but its strides
 * would overflow, and so would offsets computed from them). */
int64_t em_shape_numel(int ndim, const int64_t *sizes) {
    int64_t n = 1, span = 1;
    for (int i = 0; i < ndim; i++) {
        if (sizes[i] < 0) return -1;
        if (__builtin_mul_overflow(span, sizes[i] > 1 ? sizes[i] : 1, &span)) return -1;
        n *= sizes[i]; /* n <= span: no overflow */
    }
    return n;
}

/* Saturates instead of overflowing for a shape em_shape_numel rejects, so
 * that a caller that has not validated the shape gets no undefined
 * behaviour (it must still reject the shape). */
void em_contiguous_strides(int ndim, const int64_t *sizes, int64_t *strides) {
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        strides[i] = s;
        if (__builtin_mul_overflow(s, sizes[i] > 1 ? sizes[i] : 1, &s)) s = INT64_MAX;
    }
}

bool em_norm_dim(int dim, int ndim, int *out) {
    int n = ndim > 0 ? ndim : 1; /* a 0-d tensor accepts dim 0 and -1, as torch */
    if (dim < -n || dim >= n) return false;
    *out = dim < 0 ? dim + n : dim;
    return true;
}

const char *em_shape_str(int ndim, const int64_t *sizes, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ", %lld" : "%lld", (long long)sizes[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

/* ---- Lifetime ---- */

static void storage_release(em_storage *s) {
    if (!s || atomic_fetch_sub(&s->refcount, 1) != 1) return;
    if (s->device.type == EM_CPU) {
        em_free_with(s->alloc, s->data);
    } else {
        const em_backend *b = em_backend_for(s->device);
        if (b) b->free(s->device, s->data);
    }
    em_free_with(s->alloc, s);
}

/* Fills a new tensor's header.  Every field is written: a memset of the
 * whole struct compiles to `rep stos`, which took 10% of recording an op
 * in lazy mode (fixed-size stores of the arrays do not). */
static void tensor_init(em_tensor *t, const em_meta *m, em_storage *s) {
    atomic_init(&t->refcount, 1);
    t->ndim = m->ndim;
    memset(t->sizes, 0, sizeof t->sizes);
    memset(t->strides, 0, sizeof t->strides);
    memcpy(t->sizes, m->sizes, sizeof(int64_t) * (size_t)m->ndim);
    memcpy(t->strides, m->strides, sizeof(int64_t) * (size_t)m->ndim);
    t->offset = m->offset;
    t->dtype = m->dtype;
    t->device = m->device;
    t->storage = s;
    t->scope = 0;
    t->alloc = em_get_allocator();
    t->ext = NULL;
    t->ext_free = NULL;
    t->ext_force = NULL;
}

static em_tensor *tensor_new(const em_meta *m, em_storage *s) {
    em_tensor *t = em_malloc(sizeof *t);
    if (t) tensor_init(t, m, s);
    return t;
}

bool em_meta_check_numel(const em_meta *m, int64_t *numel) {
    int64_t n = em_shape_numel(m->ndim, m->sizes);
    if (n < 0 || (uint64_t)n > SIZE_MAX / 8 / em_dtype_size(m->dtype)) return false;
    *numel = n;
    return true;
}

em_tensor *em_tensor_alloc(const em_meta *m) {
    int64_t n;
    char shape[160];
    if (!em_meta_check_numel(m, &n)) {
        em_error(EM_ERR_OVERFLOW, "tensor of sizes %s and dtype %s is too large",
                 em_shape_str(m->ndim, m->sizes, shape, sizeof shape), em_dtype_name(m->dtype));
        return NULL;
    }
    const em_backend *b = em_backend_for(m->device);
    if (!b) return NULL;
    em_storage *s = em_malloc(sizeof *s);
    if (!s) return NULL;
    atomic_init(&s->refcount, 1);
    s->nbytes = (size_t)n * em_dtype_size(m->dtype);
    s->device = m->device;
    s->alloc = em_get_allocator();
    s->data = NULL;
    if (b->alloc(m->device, s->nbytes, &s->data) != EM_OK) {
        em_free_with(s->alloc, s);
        return NULL;
    }
    em_meta cm = *m;
    em_contiguous_strides(cm.ndim, cm.sizes, cm.strides);
    cm.offset = 0;
    em_tensor *t = tensor_new(&cm, s);
    if (!t) {
        storage_release(s);
        return NULL;
    }
    return em_tensor_adopt(t);
}

em_tensor *em_tensor_view(const em_tensor *base, const em_meta *m) {
    em_tensor *t = tensor_new(m, base->storage);
    if (!t) return NULL;
    if (base->storage) atomic_fetch_add(&base->storage->refcount, 1);
    return em_tensor_adopt(t);
}

em_tensor *em_tensor_meta_only(const em_meta *m) { return tensor_new(m, NULL); }

em_tensor *em_tensor_meta_only_ext(const em_meta *m, size_t extra, void **ext) {
    /* one block: the tensor, then the mode's data, 16-byte aligned */
    size_t head = (sizeof(em_tensor) + 15) & ~(size_t)15;
    em_tensor *t = em_malloc(head + extra);
    if (!t) return NULL;
    tensor_init(t, m, NULL);
    *ext = (char *)t + head;
    return t;
}

em_tensor *em_retain(em_tensor *t) {
    if (t) atomic_fetch_add(&t->refcount, 1);
    return t;
}

em_tensor *em_retain_live(em_tensor *t) {
    int n = t ? atomic_load(&t->refcount) : 0;
    while (n > 0)
        if (atomic_compare_exchange_weak(&t->refcount, &n, n + 1)) return t;
    return NULL;
}

void em_release(em_tensor *t) {
    if (!t) return;
    /* The last reference of a scope-owned tensor belongs to the scope:
     * releasing it here would free it under the scope's feet. */
    if (t->scope && atomic_load(&t->refcount) == 1) {
        em_error(EM_ERR_STATE,
                 "em_release: the tensor belongs to scope %d (use em_keep to take it, "
                 "or em_retain before em_release)", t->scope);
        return;
    }
    if (atomic_fetch_sub(&t->refcount, 1) != 1) return;
    if (t->ext_free) t->ext_free(t->ext);
    storage_release(t->storage);
    em_free_with(t->alloc, t);
}

/* ---- Metadata ---- */

int em_ndim(const em_tensor *t) { return t ? t->ndim : -1; }

int64_t em_size(const em_tensor *t, int dim) {
    int d;
    if (!t || !em_norm_dim(dim, t->ndim, &d) || t->ndim == 0) return -1;
    const em_dispatch_hook *h = &em_ctx()->hook;
    if (h->on_size) h->on_size(h->ud, t, d); /* a recording notes what the code reads */
    return t->sizes[d];
}

int64_t em_stride(const em_tensor *t, int dim) {
    int d;
    if (!t || !em_norm_dim(dim, t->ndim, &d) || t->ndim == 0) return 0;
    return t->strides[d];
}

const int64_t *em_sizes(const em_tensor *t) { return t ? t->sizes : NULL; }
const int64_t *em_strides(const em_tensor *t) { return t ? t->strides : NULL; }
int64_t em_offset(const em_tensor *t) { return t ? t->offset : 0; }
int64_t em_numel(const em_tensor *t) { return t ? em_shape_numel(t->ndim, t->sizes) : -1; }
em_dtype em_dtype_of(const em_tensor *t) { return t ? t->dtype : EM_DTYPE_COUNT; }
em_device em_device_of(const em_tensor *t) { return t ? t->device : em_cpu(); }

bool em_is_contiguous(const em_tensor *t) {
    if (!t) return false;
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->sizes[i] == 0) return true;
        if (t->sizes[i] != 1 && t->strides[i] != s) return false;
        s *= t->sizes[i];
    }
    return true;
}

bool em_shares_storage(const em_tensor *a, const em_tensor *b) {
    return a && b && a->storage && a->storage == b->storage;
}

/* ---- Host I/O ---- */

static em_status check_dims(const char *fn, int ndim, const int64_t *sizes) {
    if (ndim < 0 || ndim > EM_MAX_DIMS)
        return em_error(EM_ERR_DIM, "%s: ndim %d is outside [0, %d]", fn, ndim, EM_MAX_DIMS);
    if (ndim > 0 && !sizes) return em_error(EM_ERR_NULL, "%s: sizes is NULL", fn);
    for (int i = 0; i < ndim; i++)
        if (sizes[i] < 0)
            return em_error(EM_ERR_ARG, "%s: size %lld at dim %d is negative", fn,
                            (long long)sizes[i], i);
    return EM_OK;
}

em_status em_check_creation(const char *fn, int ndim, const int64_t *sizes, em_dtype dtype,
                            em_device dev) {
    em_status s = check_dims(fn, ndim, sizes);
    if (s != EM_OK) return s;
    if (!dtype_valid(dtype)) return em_error(EM_ERR_DTYPE, "%s: invalid dtype %d", fn, (int)dtype);
    if (!em_backend_for(dev)) return em_last_status();
    /* the numel check of em_meta_check_numel, without building a meta (its
     * zeroing was a third of this check, which every creation op runs twice:
     * at the call and in its infer rule) */
    int64_t n = em_shape_numel(ndim, sizes);
    char shape[160];
    if (n < 0 || (uint64_t)n > SIZE_MAX / 8 / em_dtype_size(dtype))
        return em_error(EM_ERR_OVERFLOW, "%s: sizes %s of %s overflow", fn,
                        em_shape_str(ndim, sizes, shape, sizeof shape), em_dtype_name(dtype));
    return EM_OK;
}

em_tensor *em_from_data(const void *data, em_dtype dtype, int ndim, const int64_t *sizes,
                        em_device dev) {
    if (em_check_creation("em_from_data", ndim, sizes, dtype, dev) != EM_OK) return NULL;
    if (!data) {
        em_error(EM_ERR_NULL, "em_from_data: data is NULL");
        return NULL;
    }
    em_meta m = {.ndim = ndim, .dtype = dtype, .device = dev};
    if (ndim > 0) memcpy(m.sizes, sizes, sizeof(int64_t) * (size_t)ndim);
    em_tensor *t = em_tensor_alloc(&m);
    if (!t) return NULL;
    const em_backend *b = em_backend_for(dev);
    if (b->copy(t->storage->data, dev, data, em_cpu(), t->storage->nbytes) != EM_OK) {
        em_tensor_discard(t);
        return NULL;
    }
    return t;
}

/* Copies t's values to buf for the public function fn. */
static em_status copy_out(const em_tensor *t, void *buf, size_t nbytes, const char *fn) {
    if (!t) return em_error_null(fn, "tensor");
    if (!buf) return em_error(EM_ERR_NULL, "%s: buf is NULL", fn);
    size_t need = (size_t)em_numel(t) * em_dtype_size(t->dtype);
    if (nbytes < need)
        return em_error(EM_ERR_ARG, "%s: buffer of %zu bytes, %zu needed", fn, nbytes, need);
    em_dispatch_hook saved = em_begin_host_read(t, fn);
    em_status s = EM_OK;
    if (em_force(t) != EM_OK) /* it checks t's storage (which another thread may be giving it) */
        s = em_error_context("%s", fn);
    if (s == EM_OK && need > 0) {
        em_scope_begin();
        em_tensor *c = em_contiguous(t);
        s = c ? EM_OK : em_last_status();
        if (c) {
            const em_backend *b = em_backend_for(c->device);
            s = b ? b->copy(buf, em_cpu(), em_data(c), c->device, need) : em_last_status();
        }
        em_scope_end();
    }
    em_end_host_read(saved);
    return s;
}

em_status em_copy_to_host(const em_tensor *t, void *buf, size_t nbytes) {
    return copy_out(t, buf, nbytes, "em_copy_to_host");
}

em_status em_item(const em_tensor *t, double *out) {
    if (!t) return em_error_null("em_item", "tensor");
    if (!out) return em_error(EM_ERR_NULL, "em_item: out is NULL");
    if (em_numel(t) != 1)
        return em_error(EM_ERR_SHAPE, "em_item: the tensor has %lld elements, not 1",
                        (long long)em_numel(t));
    unsigned char buf[8];
    em_status s = copy_out(t, buf, sizeof buf, "em_item");
    if (s == EM_OK) *out = em_load_f64(buf, t->dtype);
    return s;
}

em_status em_item_i64(const em_tensor *t, int64_t *out) {
    if (!t) return em_error_null("em_item_i64", "tensor");
    if (!out) return em_error(EM_ERR_NULL, "em_item_i64: out is NULL");
    if (em_numel(t) != 1)
        return em_error(EM_ERR_SHAPE, "em_item_i64: the tensor has %lld elements, not 1",
                        (long long)em_numel(t));
    unsigned char buf[8];
    em_status s = copy_out(t, buf, sizeof buf, "em_item_i64");
    if (s == EM_OK) *out = em_load_i64(buf, t->dtype);
    return s;
}
