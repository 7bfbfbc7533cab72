/* eager.h - internals of the eager tensor library (src/eager).
 *
 * What this room offers the rest of Ember:
 *  - the tensor and storage objects (em_tensor, em_storage) and their meta;
 *  - the op table (ops.def) as enum em_op and em_op_info[];
 *  - the one dispatch point (em_dispatch) every public op goes through, and
 *    the per-thread hook that recording and lazy mode will install there;
 *  - device backends as function-pointer tables (em_backend);
 *  - the per-thread context: last error, scope stack, allocator, hook.
 * Eager knows nothing of trace, guards, jit or cache. */
#ifndef EMBER_EAGER_H
#define EMBER_EAGER_H

#include "ember.h"

#include <stdarg.h>
#include <stdatomic.h>

/* ---- Op table ---- */
typedef enum em_op {
#define X(NAME, name, kind, nin, attrs, infer, cpu) EM_OP_##NAME,
#include "ops.def"
#undef X
    EM_OP_COUNT
} em_op;

typedef enum em_op_kind {
    EM_KIND_CREATE,  /* no tensor inputs: empty, full, arange, rand, randn */
    EM_KIND_UNARY,   /* pointwise, one input */
    EM_KIND_BINARY,  /* pointwise, two inputs of one dtype, broadcast */
    EM_KIND_TERNARY, /* where */
    EM_KIND_REDUCE,  /* reduction over attrs.dims */
    EM_KIND_VIEW,    /* shares the input's storage; no kernel */
    EM_KIND_COPY,    /* contiguous */
    EM_KIND_CAT,
    EM_KIND_INDEX,
    EM_KIND_MATMUL,
    EM_KIND_ATTENTION, /* fused softmax(q k^T * scale + mask) v: made only by the
                          attention pass (src/trace/attention.c) */
    EM_KIND_UPDATE     /* writes into its input 0 in place (index_copy_); its
                          result is a view of that input.  A trace rebinds input
                          0 to the result and keeps the order of reads and
                          writes (record.c, schedule.c) */
} em_op_kind;

/* Which em_op_attrs fields an op reads (the attrs column of ops.def). */
enum {
    A_SIZES = 1 << 0,      /* ndim, sizes */
    A_DIMS = 1 << 1,       /* ndims, dims */
    A_DIM = 1 << 2,        /* dim */
    A_RANGE = 1 << 3,      /* start, end, step */
    A_VALUE = 1 << 4,      /* value */
    A_ARANGE = 1 << 5,     /* fstart, fstep */
    A_CORRECTION = 1 << 6, /* correction */
    A_KEEPDIM = 1 << 7,    /* keepdim */
    A_DTYPE = 1 << 8,      /* dtype */
    A_DEVICE = 1 << 9,     /* device */
    A_RNG = 1 << 10,       /* seed, offset, generator */
    A_CAUSAL = 1 << 11,    /* causal */
    A_ACT = 1 << 12        /* act */
};

/* The activation a linear node applies after its bias (attrs.act): the
 * linear pass folds relu and gelu_tanh readers into the node for a device
 * whose matmul epilogue applies them (src/trace/linear.c). */
typedef enum em_act { EM_ACT_NONE, EM_ACT_RELU, EM_ACT_GELU_TANH, EM_ACT_GELU, EM_ACT_COUNT } em_act;

/* Scalar attributes of an op call.  One flat struct for every op, so that a
 * graph node can hold any call; each op reads only the fields it documents. */
typedef struct em_op_attrs {
    int ndim;                      /* creation, reshape, expand: target rank */
    int64_t sizes[EM_MAX_DIMS];    /* creation, reshape, expand: target sizes */
    int ndims;                     /* reductions: how many dims; permute: rank */
    int dims[EM_MAX_DIMS];         /* reductions: dims (normalized); permute: perm */
    int dim;                       /* slice, squeeze, unsqueeze, cat, index_select, argmax */
    int64_t start, end, step;      /* slice (normalized, clamped) */
    double value;                  /* full: fill value; attention: the scale */
    double fstart, fstep;          /* arange: value i is fstart + i * fstep */
    int correction;                /* var */
    bool keepdim;                  /* reductions */
    bool causal;                   /* attention: key j > query i is masked out */
    em_act act;                    /* linear: activation after the bias */
    em_dtype dtype;                /* creation, cast: result dtype */
    em_device device;              /* creation: result device */
    uint64_t seed, offset;         /* rand, randn: Philox key and first counter */
    em_generator *generator;       /* rand, randn: the generator drawn from (kernels
                                      read only seed and offset; recording needs
                                      to know whose state advanced) */
} em_op_attrs;

/* One call of an op: what the dispatcher, kernels and hooks see. */
typedef struct em_op_call {
    em_op op;
    int nin;
    em_tensor *const *in;
    const em_op_attrs *attrs;
} em_op_call;

/* The result's meta, computed by the op's infer rule before any data. */
typedef struct em_meta {
    int ndim;
    int64_t sizes[EM_MAX_DIMS];
    int64_t strides[EM_MAX_DIMS]; /* views only: strides and offset of the view */
    int64_t offset;
    em_dtype dtype;
    em_device device;
} em_meta;

typedef em_status (*em_infer_fn)(const em_op_call *c, em_meta *out);
typedef em_status (*em_kernel_fn)(const em_op_call *c, em_tensor *out);

typedef struct em_op_info {
    const char *name;
    em_op_kind kind;
    int nin;             /* -1: variadic */
    unsigned attrs;      /* A_* flags */
    em_infer_fn infer;
    em_kernel_fn cpu;    /* views: cpu_view, which computes nothing */
} em_op_info;

extern const em_op_info em_op_table[EM_OP_COUNT];

/* ---- Objects ---- */

/* Refcounted memory on one device.  Views share it. */
typedef struct em_storage {
    atomic_int refcount;
    void *data;
    size_t nbytes;
    em_device device;
    const em_allocator *alloc; /* host memory: the allocator that made it */
} em_storage;

struct em_tensor {
    atomic_int refcount;
    int ndim;
    int64_t sizes[EM_MAX_DIMS];
    int64_t strides[EM_MAX_DIMS]; /* in elements; 0 on broadcast dims */
    int64_t offset;               /* in elements, into storage */
    em_dtype dtype;
    em_device device;
    em_storage *storage;          /* NULL only for a tensor whose value a mode will
                                     compute later (lazy mode) */
    int scope;                    /* depth of the owning scope; 0: none */
    const em_allocator *alloc;    /* the allocator that made this struct */
    /* A slot for the mode that recorded this tensor (trace, lazy): ext_free
     * is called with ext when the tensor dies. */
    void *ext;
    void (*ext_free)(void *ext);
    /* Set with ext by a mode that defers computing this tensor (lazy
     * mode): computes it, giving it storage (em_force). */
    em_status (*ext_force)(em_tensor *t);
};

/* ---- Device backends ----
 * Each device type has one table.  alloc/free/copy are required; run
 * executes one op call into out (whose storage is allocated). */
typedef struct em_backend {
    const char *name;
    bool (*available)(em_device d);
    em_status (*alloc)(em_device d, size_t nbytes, void **ptr);
    void (*free)(em_device d, void *ptr);
    /* Copies n bytes between two devices of which at least one is this one. */
    em_status (*copy)(void *dst, em_device dd, const void *src, em_device sd, size_t n);
    em_status (*run)(const em_op_call *c, em_tensor *out);
} em_backend;

extern const em_backend em_cpu_backend;
/* The table for d's type, or NULL (with an error set) if none is
 * registered or d is not available. */
const em_backend *em_backend_for(em_device d);

/* ---- Registry: what layers above eager plug into it ----
 * Eager names no symbol of src/jit: the devices whose tables live there
 * (EM_CUDA: an eager CUDA op is a one-node graph compiled by the JIT, in
 * src/jit/cuda/cuda_eager.c) and the mode a thread starts in (EMBER_JIT=1:
 * lazy mode, src/jit/runtime/lazy.c) register themselves when the library
 * is loaded (a constructor in their own file; docs/architecture.md says
 * how static links keep them).  The registry is process-wide because what
 * it holds is: a device's table is the same for every thread, and the
 * mode start must reach threads the program creates, which Ember never
 * sees start (so it cannot live in a thread's context).  Each
 * slot is written once (compare-and-swap), so registering is thread-safe
 * and idempotent, and a lookup is one atomic load. */
/* Makes b the table of device type t (EM_CPU's is built in).  EM_OK also
 * when b is already t's table; EM_ERR_NULL for a NULL b, EM_ERR_ARG for an
 * invalid t or a table without a required member, EM_ERR_STATE when t
 * has another table. */
em_status em_register_device(em_device_type t, const em_backend *b);
/* t's registered table, whether or not a device of it is available; NULL
 * (no error set) when there is none or t is invalid. */
const em_backend *em_registered_device(em_device_type t);
/* Makes fn the thread mode's start: called once on each thread, before
 * its dispatch hook is first seen or changed (em_set_dispatch_hook).
 * EM_OK also when fn is already registered; EM_ERR_NULL for NULL,
 * EM_ERR_STATE when another function is. */
em_status em_register_mode_start(void (*fn)(void));

/* ---- Dispatch ----
 * Every op goes through em_dispatch: it checks the inputs, infers the
 * result's meta, then gives the call to the thread's hook if one is
 * installed (recording, lazy mode), else runs it eagerly. */
em_tensor *em_dispatch(em_op op, int nin, em_tensor *const *in, const em_op_attrs *a);
/* Runs a checked call eagerly: allocates the result (or makes the view) and
 * calls the device's kernel.  Hooks call this to compute real values. */
em_tensor *em_dispatch_eager(const em_op_call *c, const em_meta *m);

typedef em_tensor *(*em_hook_fn)(void *ud, const em_op_call *c, const em_meta *m);
typedef struct em_dispatch_hook {
    em_hook_fn fn;
    void *ud;
    /* Optional: told before the host reads t's values (what: the public
     * function reading).  Recording sees a graph break here; lazy mode will
     * materialize t.  Ops the read runs internally bypass the hook. */
    void (*on_read)(void *ud, const em_tensor *t, const char *what);
    /* Optional: told when the program reads size d of t (em_size): a
     * recording learns which sizes the code computes with. */
    void (*on_size)(void *ud, const em_tensor *t, int d);
} em_dispatch_hook;
/* Installs h on this thread and returns the previous hook (to restore).
 * The thread's mode (em_register_mode_start) starts first, so the hook
 * returned is the mode's when it has one. */
em_dispatch_hook em_set_dispatch_hook(em_dispatch_hook h);
/* Gives t its values if a mode deferred them (lazy mode): EM_OK when t
 * has storage afterwards, else the error that prevented it.  Runs with the
 * thread's hook uninstalled. */
em_status em_force(const em_tensor *t);
/* Tells the hook that the host is about to read t, then uninstalls it until
 * em_end_host_read (the read's own ops are not the program's). */
em_dispatch_hook em_begin_host_read(const em_tensor *t, const char *what);
void em_end_host_read(em_dispatch_hook saved);

/* ---- Attention's shapes (infer.c) ----
 * q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv], batch dims broadcast;
 * mask (NULL: none) must broadcast to the scores [batch..., Tq, Tk]
 * without widening them.  m gets the result's sizes [batch..., Tq, Dv],
 * q's dtype and device; errors (EM_ERR_DIM, EM_ERR_SHAPE) name fn.  One
 * rule for em_scaled_dot_product_attention and the fused op. */
em_status em_attention_sizes(const char *fn, const em_tensor *q, const em_tensor *k,
                             const em_tensor *v, const em_tensor *mask, em_meta *m);

/* Whether a tensor of sizes (ndim of them) adds along the rows of a
 * result of meta m, as a linear layer's bias: sizes 1 but its last, which
 * is m's last, and at most m's dims (infer.c: the linear op's rule, and
 * the linear pass's). */
bool em_is_row_bias(const em_meta *m, int ndim, const int64_t *sizes);
/* The pointwise op activation act applies (relu, gelu_tanh), or
 * EM_OP_COUNT for none (cpu_matmul.c: the linear op's semantics). */
em_op em_act_op(em_act act);

/* ---- Per-thread context ---- */
typedef struct em_scope_frame {
    em_tensor **items;
    int n, cap;
} em_scope_frame;

enum { EM_AUTOCAST_DEPTH = 16 };

typedef struct em_context {
    em_status status;
    char message[512];
    const em_allocator *alloc;
    em_scope_frame *scopes; /* scopes[0] is the outermost */
    int nscopes, capscopes;
    em_dispatch_hook hook;
    bool mode_started;     /* the registered mode start ran on this thread */
    em_dtype autocast[EM_AUTOCAST_DEPTH]; /* em_autocast_begin's stack */
    int nautocast;
} em_context;

em_context *em_ctx(void);

/* Records a failure (printf-style message) and returns s.  The message is
 * formatted into a temporary first, so the arguments may include
 * em_last_error() itself. */
em_status em_error(em_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Adds context to the pending error: its message becomes "<fmt...>: <old
 * message>" and its status is kept and returned (EM_ERR_STATE, saying so,
 * when no error is pending: a caller that adds context has failed). */
em_status em_error_context(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* NULL input: keeps a pending error (the one that made the NULL) or sets
 * EM_ERR_NULL naming the function and argument. */
em_status em_error_null(const char *fn, const char *arg);

/* ---- Memory ---- */
void *em_malloc(size_t size);          /* through the thread's allocator, 64-byte aligned */
void *em_calloc(size_t n, size_t size);
void em_free_with(const em_allocator *a, void *p);
void em_free(void *p);                 /* with the thread's allocator */

/* ---- Tensor internals ---- */
/* A new tensor of meta m with fresh storage (uninitialized), owned as a
 * newly made tensor is (by the innermost scope, or by the caller). */
em_tensor *em_tensor_alloc(const em_meta *m);
/* A view of base's storage with m's sizes, strides and offset. */
em_tensor *em_tensor_view(const em_tensor *base, const em_meta *m);
/* A tensor with meta m and no storage, owned by the caller (not by a
 * scope): a stand-in whose value is never read, e.g. the constants of a
 * graph compiled ahead of time from its text (ember-cache warmup). */
em_tensor *em_tensor_meta_only(const em_meta *m);
/* The same with extra bytes for the mode's data in the tensor's own block
 * (*ext, 16-byte aligned, uninitialized): freed with the tensor. */
em_tensor *em_tensor_meta_only_ext(const em_meta *m, size_t extra, void **ext);
/* Hands a new tensor to the innermost scope (or leaves it to the caller). */
em_tensor *em_tensor_adopt(em_tensor *t);
/* Drops a tensor just made (on a failure path): out of its scope, released. */
void em_tensor_discard(em_tensor *t);
/* Validates creation arguments (ndim, sizes >= 0, dtype, device, overflow). */
em_status em_check_creation(const char *fn, int ndim, const int64_t *sizes, em_dtype dtype,
                            em_device dev);
/* Address of element 0 of t. */
static inline char *em_data(const em_tensor *t) {
    return (char *)t->storage->data + t->offset * (int64_t)em_dtype_size(t->dtype);
}
bool em_meta_check_numel(const em_meta *m, int64_t *numel); /* false on overflow */
int64_t em_shape_numel(int ndim, const int64_t *sizes);     /* -1 on overflow */
void em_contiguous_strides(int ndim, const int64_t *sizes, int64_t *strides);
/* Normalizes dim against ndim (negative from the end); false if out of range. */
bool em_norm_dim(int dim, int ndim, int *out);
bool em_same_device(em_device a, em_device b);
/* A new reference to t unless its last one is being released right now
 * (refcount 0: NULL).  For lists that find tensors by something other
 * than a reference (lazy mode's pending list), whose entry lives until
 * the dying tensor's ext_free unlinks it under the list's lock. */
em_tensor *em_retain_live(em_tensor *t);
/* The environment (env.c): libgccjit's driver calls putenv while it
 * compiles, which may move the array getenv walks.  em_getenv copies
 * NAME's value into buf and returns buf (NULL: unset, or not shorter than
 * n); a call into a library that changes the environment holds
 * em_env_lock(true); code that hands environ to a child holds
 * em_env_lock(false).  Use em_getenv, never getenv, in the library. */
#define EM_ENV_MAX 4096 /* buffer for a path-valued variable */
const char *em_getenv(const char *name, char *buf, size_t n);
void em_env_lock(bool write);
void em_env_unlock(void);
const char *em_device_name(em_device d, char *buf, size_t n);
/* "[2, 3, 4]" into buf. */
const char *em_shape_str(int ndim, const int64_t *sizes, char *buf, size_t n);

/* ---- Byte copies that accept an empty range ----
 * memcpy, memcmp and memset take pointers that must be valid even for
 * n == 0 (C11 7.24.1): an empty array is often NULL here (no steps, no
 * watched slots, no constants), which UBSan reports.  These skip n == 0. */
static inline void em_copy_bytes(void *dst, const void *src, size_t n) {
    if (n) __builtin_memcpy(dst, src, n);
}
static inline bool em_same_bytes(const void *a, const void *b, size_t n) {
    return n == 0 || __builtin_memcmp(a, b, n) == 0;
}

/* Whether d is f16 or bf16: formats that compute through f32 (the CPU
 * kernels upcast, compute in f32 and round once: docs/api.md). */
static inline bool em_is_half(em_dtype d) { return d == EM_F16 || d == EM_BF16; }

/* Autocast's dtypes (em_autocast_begin): under a half scope, a half
 * operand of the ops torch keeps in f32 is computed in f32 (for), and a
 * float operand of em_matmul in the scope's dtype (low); otherwise d. */
em_dtype em_autocast_for_f32(em_dtype d);
em_dtype em_autocast_low(em_dtype d);

/* ---- Conversion of values to integer dtypes: Ember's one rule ----
 * A float becomes an integer by truncation toward zero, saturated to the
 * integer's range, with NaN -> 0 (em_cast's documented rule; C leaves an
 * out-of-range conversion undefined, and x86 gives INT_MIN).  Bool is
 * v != 0 (NaN -> true).  The eager kernels convert with these; the kernel
 * IR expresses the same steps (kir_convert, src/jit/kir.c), so the CPU and
 * CUDA generators emit one computation, and lower.c folds constants with
 * them. */
static inline int64_t em_f64_to_i64(double v) {
    if (v != v) return 0;
    if (v >= 0x1p63) return INT64_MAX; /* 2^63 itself is not an int64 */
    if (v <= -0x1p63) return INT64_MIN;
    return (int64_t)v;
}
static inline int32_t em_f64_to_i32(double v) {
    if (v != v) return 0;
    if (v >= 0x1p31) return INT32_MAX;
    if (v <= -0x1p31) return INT32_MIN;
    return (int32_t)v;
}
/* v as a value of integer dtype d (i32, i64 or bool), widened to int64. */
static inline int64_t em_f64_to_int(double v, em_dtype d) {
    return d == EM_I32 ? em_f64_to_i32(v) : d == EM_BOOL ? (int64_t)(v != 0) : em_f64_to_i64(v);
}
/* Whether integer dtype d (i32, i64; bool as i64) holds v exactly: a
 * scalar operand that it does not hold is applied in f32 instead (ops.c). */
static inline bool em_int_holds(em_dtype d, double v) {
    double lim = d == EM_I32 ? 0x1p31 : 0x1p63;
    /* NaN and +-inf fail the range test; in range, the cast is defined */
    return v >= -lim && v < lim && v == (double)(int64_t)v;
}

/* ---- CPU threading ---- */
typedef void (*em_range_fn)(void *ctx, int64_t begin, int64_t end);
/* Splits [0, n) into chunks of at least grain and runs fn on them, in
 * parallel when n is large enough to pay for it. */
void em_parallel_for(int64_t n, int64_t grain, em_range_fn fn, void *ctx);

/* ---- Philox4x32-10 ---- */
void em_philox(uint64_t seed, uint64_t counter, uint32_t out[4]);

#endif
