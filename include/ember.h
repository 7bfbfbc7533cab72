/* ember.h - Ember's public C API: eager tensors on CPU (CUDA designed in).
 *
 * Conventions (docs/api.md has the full reference):
 *  - Every function is prefixed em_.  Functions that make a tensor return it,
 *    or NULL on error; the reason is then readable with em_last_error().
 *  - An op given a NULL tensor returns NULL and keeps the error that made the
 *    NULL, so a chain such as em_add(em_mul(x, w), b) is checked once, at its
 *    end.
 *  - Ownership (docs/memory.md): a tensor made while a scope is open
 *    (em_scope_begin) belongs to that scope and is released by em_scope_end,
 *    unless it was moved out with em_keep.  A tensor made while no scope is
 *    open belongs to the caller, who releases it with em_release.
 */
#ifndef EMBER_H
#define EMBER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define EM_API __attribute__((visibility("default")))
#else
#define EM_API
#endif

#define EM_MAX_DIMS 8

/* Element types.  F16 and BF16 compute wherever F32 does on the CPU, in
 * f32 internally with one rounding per result (docs/api.md, "Half
 * precision"); em_rand and em_randn make F32 and F64 only. */
typedef enum em_dtype {
    EM_F32,
    EM_F64,
    EM_I32,
    EM_I64,
    EM_BOOL,
    EM_F16,
    EM_BF16,
    EM_DTYPE_COUNT
} em_dtype;

typedef enum em_device_type { EM_CPU, EM_CUDA, EM_DEVICE_TYPE_COUNT } em_device_type;

/* A device: its type and, for CUDA, the ordinal of the GPU. */
typedef struct em_device {
    em_device_type type;
    int index;
} em_device;

#define EM_CPU_DEVICE ((em_device){EM_CPU, 0})

/* Status codes.  EM_OK is 0; every error is negative. */
typedef enum em_status {
    EM_OK = 0,
    EM_ERR_NULL = -1,        /* a required argument was NULL */
    EM_ERR_SHAPE = -2,       /* sizes that do not agree or broadcast */
    EM_ERR_DIM = -3,         /* a dim out of range, repeated, or too many dims */
    EM_ERR_DTYPE = -4,       /* a dtype the op does not accept */
    EM_ERR_DEVICE = -5,      /* tensors on different devices, or a device not available */
    EM_ERR_OVERFLOW = -6,    /* sizes whose product or byte count overflows */
    EM_ERR_NOMEM = -7,       /* an allocation failed */
    EM_ERR_INDEX = -8,       /* an index out of range */
    EM_ERR_ARG = -9,         /* any other invalid argument (negative size, zero step...) */
    EM_ERR_STATE = -10,      /* a call out of order (em_scope_end without a scope...) */
    EM_ERR_UNSUPPORTED = -11, /* valid, but not implemented for these inputs */
    EM_ERR_IO = -12          /* a file could not be opened, read or written */
} em_status;

typedef struct em_tensor em_tensor;
typedef struct em_generator em_generator;

/* ---- Errors (per thread) ---- */

/* The message of the most recent failure on this thread ("" if none). */
EM_API const char *em_last_error(void);
/* The status of the most recent failure on this thread (EM_OK if none). */
EM_API em_status em_last_status(void);
/* Forget the last failure. */
EM_API void em_clear_error(void);
EM_API const char *em_status_name(em_status s);

/* ---- Allocation hook (per thread) ----
 * Every host allocation Ember makes goes through the allocator current on
 * the calling thread.  Objects remember the allocator that made them, so the
 * allocator must outlive them.  NULL restores the default (aligned malloc). */
typedef struct em_allocator {
    void *(*alloc)(void *ud, size_t size, size_t align); /* NULL on failure */
    void (*free)(void *ud, void *ptr);
    void *ud;
} em_allocator;
EM_API void em_set_allocator(const em_allocator *a);
EM_API const em_allocator *em_get_allocator(void);

/* ---- Scopes (per thread) ---- */

/* Open a scope; returns its depth (1 for the outermost). */
EM_API int em_scope_begin(void);
/* Release every tensor the innermost scope owns. */
EM_API em_status em_scope_end(void);
/* Move t out of the innermost scope to the enclosing one (or, outside all
 * scopes, to the caller, who then em_release's it).  A tensor the scope does
 * not own (an input) gets a new reference for the enclosing owner.
 * Returns t, or NULL if t is NULL. */
EM_API em_tensor *em_keep(em_tensor *t);
/* Reference counting, for tensors held beyond a scope (weights in a
 * struct): em_retain adds a reference the caller owns; em_release drops one
 * the caller owns.  em_release(NULL) is a no-op. */
EM_API em_tensor *em_retain(em_tensor *t);
EM_API void em_release(em_tensor *t);

/* ---- Dtypes and devices ---- */
EM_API const char *em_dtype_name(em_dtype d);
EM_API size_t em_dtype_size(em_dtype d); /* 0 for an invalid dtype */
EM_API bool em_dtype_is_float(em_dtype d);
EM_API em_dtype em_promote_types(em_dtype a, em_dtype b);
EM_API em_device em_cpu(void);
EM_API em_device em_cuda(int index);
/* Whether tensors can be made on d in this process. */
EM_API bool em_device_available(em_device d);

/* ---- Creation ---- */
/* Copies numel(sizes) elements of dtype from host memory. */
EM_API em_tensor *em_from_data(const void *data, em_dtype dtype, int ndim,
                               const int64_t *sizes, em_device dev);
EM_API em_tensor *em_empty(int ndim, const int64_t *sizes, em_dtype dtype, em_device dev);
EM_API em_tensor *em_zeros(int ndim, const int64_t *sizes, em_dtype dtype, em_device dev);
EM_API em_tensor *em_ones(int ndim, const int64_t *sizes, em_dtype dtype, em_device dev);
EM_API em_tensor *em_full(int ndim, const int64_t *sizes, double value, em_dtype dtype,
                          em_device dev);
/* A 0-dim tensor holding value. */
EM_API em_tensor *em_scalar(double value, em_dtype dtype, em_device dev);
/* [start, end) by step, ceil((end-start)/step) elements. */
EM_API em_tensor *em_arange(double start, double end, double step, em_dtype dtype,
                            em_device dev);

/* A counter-based (Philox4x32-10) generator: the values depend only on the
 * seed and on how many values were drawn before, never on threads. */
EM_API em_generator *em_generator_new(uint64_t seed);
EM_API void em_generator_free(em_generator *g);
EM_API uint64_t em_generator_seed(const em_generator *g);
EM_API uint64_t em_generator_offset(const em_generator *g);
/* Uniform in [0, 1) and standard normal; f32 or f64. */
EM_API em_tensor *em_rand(em_generator *g, int ndim, const int64_t *sizes, em_dtype dtype,
                          em_device dev);
EM_API em_tensor *em_randn(em_generator *g, int ndim, const int64_t *sizes, em_dtype dtype,
                           em_device dev);

/* ---- Reading values ---- */
/* Copies t's elements in row-major order into buf, which holds nbytes
 * (at least numel * dtype size). */
EM_API em_status em_copy_to_host(const em_tensor *t, void *buf, size_t nbytes);
/* The value of a one-element tensor. */
EM_API em_status em_item(const em_tensor *t, double *out);
EM_API em_status em_item_i64(const em_tensor *t, int64_t *out);
/* Prints t (shape, dtype and values, abbreviated past 6 per dim). */
EM_API em_status em_print(const em_tensor *t, FILE *f);

/* ---- Metadata (pure getters; they never fail on a valid tensor) ---- */
EM_API int em_ndim(const em_tensor *t);          /* -1 for NULL */
EM_API int64_t em_size(const em_tensor *t, int dim);   /* dim may be negative; -1 on error */
EM_API int64_t em_stride(const em_tensor *t, int dim); /* in elements; 0 on error */
EM_API const int64_t *em_sizes(const em_tensor *t);
EM_API const int64_t *em_strides(const em_tensor *t);
EM_API int64_t em_offset(const em_tensor *t);    /* storage offset in elements */
EM_API int64_t em_numel(const em_tensor *t);     /* -1 for NULL */
EM_API em_dtype em_dtype_of(const em_tensor *t);
EM_API em_device em_device_of(const em_tensor *t);
EM_API bool em_is_contiguous(const em_tensor *t);
/* Whether a and b view the same storage. */
EM_API bool em_shares_storage(const em_tensor *a, const em_tensor *b);

/* ---- Pointwise ops ----
 * Binary ops broadcast as numpy does and promote dtypes
 * (bool < i32 < i64 < f32 < f64).  Ops that are only defined on floats
 * (exp, div, pow...) compute integer inputs in f32. */
EM_API em_tensor *em_neg(const em_tensor *x);
EM_API em_tensor *em_abs(const em_tensor *x);
EM_API em_tensor *em_exp(const em_tensor *x);
EM_API em_tensor *em_log(const em_tensor *x);
EM_API em_tensor *em_sqrt(const em_tensor *x);
EM_API em_tensor *em_rsqrt(const em_tensor *x);
EM_API em_tensor *em_sin(const em_tensor *x);
EM_API em_tensor *em_cos(const em_tensor *x);
EM_API em_tensor *em_tanh(const em_tensor *x);
EM_API em_tensor *em_sigmoid(const em_tensor *x);
EM_API em_tensor *em_relu(const em_tensor *x);
EM_API em_tensor *em_gelu(const em_tensor *x);      /* erf form: x/2 (1 + erf(x/sqrt 2)) */
EM_API em_tensor *em_gelu_tanh(const em_tensor *x); /* tanh approximation */
EM_API em_tensor *em_erf(const em_tensor *x);

EM_API em_tensor *em_add(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_sub(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_mul(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_div(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_pow(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_maximum(const em_tensor *a, const em_tensor *b); /* NaN propagates */
EM_API em_tensor *em_minimum(const em_tensor *a, const em_tensor *b);

/* Scalar forms: x OP s.  The scalar takes x's dtype, except that a
 * non-integral scalar with an integer x computes in f32. */
EM_API em_tensor *em_add_scalar(const em_tensor *x, double s);
EM_API em_tensor *em_sub_scalar(const em_tensor *x, double s);
EM_API em_tensor *em_mul_scalar(const em_tensor *x, double s);
EM_API em_tensor *em_div_scalar(const em_tensor *x, double s);
EM_API em_tensor *em_pow_scalar(const em_tensor *x, double s);
EM_API em_tensor *em_maximum_scalar(const em_tensor *x, double s);
EM_API em_tensor *em_minimum_scalar(const em_tensor *x, double s);

/* Comparisons give EM_BOOL.  NaN compares unequal to everything. */
EM_API em_tensor *em_eq(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_ne(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_lt(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_le(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_gt(const em_tensor *a, const em_tensor *b);
EM_API em_tensor *em_ge(const em_tensor *a, const em_tensor *b);

/* cond ? a : b, elementwise; cond must be EM_BOOL; all three broadcast. */
EM_API em_tensor *em_where(const em_tensor *cond, const em_tensor *a, const em_tensor *b);
/* Converts to dtype (floats to integers truncate toward zero; to bool is x != 0). */
EM_API em_tensor *em_cast(const em_tensor *x, em_dtype dtype);

/* ---- Reductions ----
 * dims lists ndims dims (negative counts from the end; ndims == 0 reduces
 * over every dim); keepdim keeps reduced dims with size 1. */
EM_API em_tensor *em_sum(const em_tensor *x, int ndims, const int *dims, bool keepdim);
EM_API em_tensor *em_mean(const em_tensor *x, int ndims, const int *dims, bool keepdim);
EM_API em_tensor *em_amax(const em_tensor *x, int ndims, const int *dims, bool keepdim);
EM_API em_tensor *em_amin(const em_tensor *x, int ndims, const int *dims, bool keepdim);
/* Variance with Bessel's correction `correction` (1: unbiased, 0: population). */
EM_API em_tensor *em_var(const em_tensor *x, int ndims, const int *dims, int correction,
                         bool keepdim);
/* Index (EM_I64) of the first maximum along dim; NaN counts as the maximum. */
EM_API em_tensor *em_argmax(const em_tensor *x, int dim, bool keepdim);

/* ---- Views: they share x's storage ---- */
/* sizes may hold one -1, inferred.  A view when strides allow; otherwise
 * the result is a contiguous copy (as torch.reshape). */
EM_API em_tensor *em_reshape(const em_tensor *x, int ndim, const int64_t *sizes);
EM_API em_tensor *em_permute(const em_tensor *x, int ndim, const int *perm);
EM_API em_tensor *em_transpose(const em_tensor *x, int dim0, int dim1);
/* Elements start, start+step, ... < end along dim.  start and end may be
 * negative (from the end) and are clamped as in Python; step > 0. */
EM_API em_tensor *em_slice(const em_tensor *x, int dim, int64_t start, int64_t end,
                           int64_t step);
/* Broadcasts size-1 dims (and new leading dims) to sizes; -1 keeps a size. */
EM_API em_tensor *em_expand(const em_tensor *x, int ndim, const int64_t *sizes);
/* Removes dim, which must have size 1. */
EM_API em_tensor *em_squeeze(const em_tensor *x, int dim);
/* Inserts a size-1 dim at dim (-1: at the end). */
EM_API em_tensor *em_unsqueeze(const em_tensor *x, int dim);
/* x itself (a new reference) if contiguous, else a contiguous copy. */
EM_API em_tensor *em_contiguous(const em_tensor *x);

/* ---- Joining and indexing ---- */
EM_API em_tensor *em_cat(int n, em_tensor *const *xs, int dim);
/* x's slices at idx (1-D, EM_I32 or EM_I64) along dim.  An index outside
 * [0, size) is an EM_ERR_INDEX error: on the CPU from this call; on CUDA,
 * where the indices are checked by the kernel without waiting for it, from
 * the next call that waits for the device (em_copy_to_host, em_item,
 * em_print, em_from_data onto it), and nothing outside x is read. */
EM_API em_tensor *em_index_select(const em_tensor *x, int dim, const em_tensor *idx);
/* weight[V, D] rows at idx (any shape): shape idx.shape + [D]. */
EM_API em_tensor *em_embedding(const em_tensor *weight, const em_tensor *idx);
/* In place: dst[..., idx[j], ...] = src[..., j, ...] along dim (torch's
 * index_copy_), for idx 1-D (EM_I32 or EM_I64; a 0-d index is one entry)
 * and src of dst's dtype and sizes but numel(idx) along dim.  dst may be a
 * view (its base is written) but not a broadcast one; src and idx must not
 * share dst's storage.  With repeated indices one of the writes wins.  Bad
 * indices are EM_ERR_INDEX as for em_index_select (on CUDA at the next
 * wait, with nothing written for them).  Under em_compile and lazy mode
 * the write happens in order with the reads around it; a traced write is
 * kept only into a tensor the function did not compute (an input or a
 * tensor it reaches from outside, such as a KV cache): the write into a
 * tensor it computed is a graph break.  Returns EM_OK or the error. */
EM_API em_status em_index_copy_(em_tensor *dst, int dim, const em_tensor *idx, const em_tensor *src);

/* ---- Linear algebra ----
 * torch.matmul semantics: 1-D operands are promoted and the added dim
 * removed; batch dims broadcast.  f32/f64 run on OpenBLAS. */
EM_API em_tensor *em_matmul(const em_tensor *a, const em_tensor *b);

/* ---- Decompositions: defined by the primitives above ---- */
EM_API em_tensor *em_softmax(const em_tensor *x, int dim);
EM_API em_tensor *em_log_softmax(const em_tensor *x, int dim);
/* Normalizes over the last nnorm dims; weight and bias (shape of those
 * dims) may be NULL. */
EM_API em_tensor *em_layer_norm(const em_tensor *x, int nnorm, const em_tensor *weight,
                                const em_tensor *bias, double eps);
/* torch.nn.functional.scaled_dot_product_attention (no dropout):
 * softmax(q @ k^T * scale + mask) @ v over the last dim, for q [..., Tq, D],
 * k [..., Tk, D], v [..., Tk, Dv] of one float dtype (batch dims, heads
 * included, broadcast); the result is [batch..., Tq, Dv].
 *  mask   NULL, or a tensor broadcasting to the scores [batch..., Tq, Tk]:
 *         bool keeps the keys where true (torch's convention), a float mask
 *         (q's dtype) is added to the scores;
 *  causal drop key j for query i when j > i (torch's is_causal: upper-left
 *         aligned, also for Tq != Tk); not together with a mask;
 *  scale  EM_SCALE_DEFAULT (NAN) for 1/sqrt(D), else any finite value.
 * A query whose keys are all dropped gives NaN, as in torch.  Errors:
 * EM_ERR_NULL, EM_ERR_DTYPE, EM_ERR_DIM (fewer than 2 dims), EM_ERR_SHAPE
 * (head sizes, key lengths, batch dims or mask that do not agree),
 * EM_ERR_ARG (mask and causal, an infinite scale).  Compiled on a CPU,
 * the pattern runs as one fused, tiled kernel (docs/api.md). */
#define EM_SCALE_DEFAULT (__builtin_nan(""))
EM_API em_tensor *em_scaled_dot_product_attention(const em_tensor *q, const em_tensor *k,
                                                  const em_tensor *v, const em_tensor *mask,
                                                  bool causal, double scale);


/* ---- Compiled functions (em_compile) ----
 *
 * A function Ember can compile reads its input tensors and scalars and
 * writes its output tensors:
 *
 *   em_status fn(void *ctx, em_tensor *const *in, const double *scalars,
 *                em_tensor **out);
 *
 * It must be a function of in, scalars and the tensors it reaches through
 * ctx (weights), with no other side effects: the first call for a given
 * set of input shapes runs it while recording a graph; later matching
 * calls run the graph, not fn (docs/compile.md). */
typedef em_status (*em_fn)(void *ctx, em_tensor *const *in, const double *scalars,
                           em_tensor **out);

typedef struct em_compiled em_compiled;

typedef struct em_compile_options {
    int ninputs;                   /* input tensors (0..64) */
    int nscalars;                  /* scalar arguments (0..64) */
    int noutputs;                  /* output tensors (1..64) */
    const char *name;              /* for logs (default "fn") */
    const char *const *input_names; /* optional, ninputs names (default in0...) */
    int recompile_limit;           /* entries before falling back to eager; 0: the
                                      EMBER_RECOMPILE_LIMIT variable, else 8 */
    const char *backend;           /* "auto" (default): "cuda" for graphs on a CUDA
                                      device, else "cpu"; "cpu": fused kernels
                                      compiled with libgccjit; "cuda": fused NVRTC
                                      kernels and cuBLAS; "replay": the graph run
                                      op by op */
    /* Optional: slots (e.g. &model->w1) that hold the tensors fn reaches
     * through ctx.  A captured tensor found in a slot is guarded on
     * identity: if the slot later holds another tensor, the entry no
     * longer matches. */
    em_tensor *const *const *watch;
    int nwatch;
    /* Dynamic shapes (docs/compile.md): 0: EMBER_DYNAMIC, else automatic
     * (a recompile caused only by sizes makes the dims that changed
     * dynamic); -1: off (every size is its own entry); 1: every dim of
     * size >= 2 is dynamic from the first call. */
    int dynamic;
    /* 1: compile new entries in a background thread while calls run
     * eagerly (the replay backend); -1: compile in the call; 0:
     * EMBER_ASYNC_COMPILE (default: in the call). */
    int async_compile;
    /* How a call that makes a new entry runs fn.  1: its ops are recorded
     * without being computed (lazy mode's recording), the graph is
     * compiled, and the call's outputs come from the compiled entry (or,
     * for graphs with random draws, made once while recording, from lazy
     * mode); -1: fn runs eagerly while it is recorded; 0 (default): 1 when
     * an input is on a CUDA device, where an eager run compiles a kernel
     * for each distinct op, else -1.  With async_compile, always -1. */
    int lazy_trace;
    /* EM_F16 or EM_BF16: every call runs fn inside em_autocast_begin(it)
     * (below); EM_F32 (default, 0): calls run under the calling thread's
     * autocast state, which each entry is guarded on. */
    em_dtype autocast;
    /* CUDA graphs (docs/cuda.md#cuda-graphs): each entry on a CUDA device
     * is captured once per size into a graph and replayed with one launch
     * per call (outputs copied out, so kept outputs stay valid).  1: on;
     * -1: off; 0 (default): EMBER_CUDA_GRAPHS (default off). */
    int cuda_graphs;
    /* Autotuning (docs/cuda.md#autotuning): a kernel with free schedule
     * parameters is timed in a few candidate schedules at its first
     * compile on a device model, the fastest kept and remembered in the
     * kernel cache.  1: on; -1: off; 0 (default): EMBER_AUTOTUNE (default
     * off). */
    int autotune;
    /* The eager check (docs/compile.md#the-eager-check): the calls after
     * a new CPU entry's first compiled one alternate between its compiled
     * plan and its graph op by op, this many of each, timed; the entry
     * keeps whichever had the lower median.  N (1..15): that many; -1:
     * off; 0 (default): EMBER_EAGER_CHECK (default 3). */
    int eager_check;
} em_compile_options;

typedef struct em_compile_stats {
    int64_t calls;        /* em_call invocations that ran */
    int64_t hits;         /* calls served by an existing entry */
    int64_t traces;       /* calls that recorded a new entry */
    int64_t eager;        /* calls run eagerly (recompile limit, graph break) */
    int entries;          /* entries (graphs) held */
    int kernels;          /* native kernels of the most recent entry */
    int64_t kernels_compiled; /* kernels this function had to compile */
    int64_t kernels_loaded;   /* kernels it found in the kernel cache instead */
    int64_t graphs_loaded;    /* entries whose whole plan came from the cache (no
                                 fusion, lowering or code generation) */
    int64_t graphs_lowered;   /* graphs this function scheduled and lowered to
                                 kernel IR (0 when every plan came from the cache) */
    bool broken;          /* a graph break was seen: fn now runs as segments */
    int64_t segmented;    /* calls run as compiled segments around reads (lazy mode) */
    int dynamic_entries;  /* entries whose kernels take some sizes as arguments */
    int64_t pending;      /* calls served by an entry still compiling (async
                             compile): run op by op with the eager kernels;
                             counted in hits too */
    char last_failure[256]; /* why the last non-matching call matched no entry */
    int64_t graphs_captured;  /* device graphs captured (cuda_graphs), over all entries */
    int64_t graph_replays;    /* calls that ran as one replay of such a graph */
    int64_t kernels_tuned;    /* kernels whose schedule this function chose by timing
                                 (autotune) */
    int64_t tune_hits;        /* kernels whose schedule came from a choice in the cache */
    int eager_entries;        /* entries the eager check moved to op by op */
} em_compile_stats;

/* Wraps fn; nothing runs until the first em_call.  NULL on bad options. */
EM_API em_compiled *em_compile(em_fn fn, void *ctx, const em_compile_options *opts);
/* Calls the compiled function: in has opts.ninputs tensors, scalars
 * opts.nscalars values, out room for opts.noutputs results, which are
 * owned as any new tensor (by the innermost scope, or by the caller). */
EM_API em_status em_call(em_compiled *f, em_tensor *const *in, const double *scalars,
                         em_tensor **out);
EM_API em_status em_compiled_stats(const em_compiled *f, em_compile_stats *out);
/* Prints entry i's graph (0: most recently used) as text (dot false) or
 * Graphviz DOT (dot true), then its guards as comments (text only). */
EM_API em_status em_compiled_print(const em_compiled *f, int entry, bool dot, FILE *out);
/* Appends every entry's graph of f (oldest first) to the warmup list at
 * path (created 0600 if absent), for `ember-cache warmup` (docs/cache.md).
 * EMBER_RECORD=path does the same automatically for each new entry of
 * every compiled function.  EM_ERR_UNSUPPORTED for the replay backend. */
EM_API em_status em_compiled_save(const em_compiled *f, const char *path);
/* Frees f, its entries and their references to captured tensors. */
EM_API void em_compiled_free(em_compiled *f);

/* ---- Autocast (docs/api.md#autocast) ----
 * As torch.autocast: between em_autocast_begin(dtype) and em_autocast_end()
 * on this thread, em_matmul takes its float operands in dtype (EM_F16 or
 * EM_BF16: products accumulate in f32, the result has dtype), and the ops
 * torch keeps in f32 under autocast (em_exp, em_log, em_rsqrt, em_pow,
 * em_pow_scalar, em_sum, em_mean, em_var, em_softmax, em_log_softmax,
 * em_layer_norm) take a half input in f32 and return f32; every other op
 * follows the usual promotion.  Scopes nest (at most 16); EM_F32 turns
 * autocast off inside its scope.  EM_ERR_DTYPE for another dtype,
 * EM_ERR_STATE for an end without a begin or past the depth. */
EM_API em_status em_autocast_begin(em_dtype dtype);
EM_API em_status em_autocast_end(void);
/* The innermost scope's dtype on this thread, EM_F32 outside any. */
EM_API em_dtype em_autocast_dtype(void);

/* ---- Lazy mode (docs/lazy.md) ----
 * In lazy mode, ops on CPU tensors are recorded instead of run; a tensor
 * is computed when its values are needed (em_copy_to_host, em_item,
 * em_print, an op that runs eagerly, em_sync), by compiling the ops that
 * lead to it into fused kernels, cached by structure.  Results are those
 * of eager mode.  EMBER_JIT=1 turns it on for every thread. */
EM_API em_status em_lazy_begin(void);  /* on this thread (nests) */
/* Turns lazy mode off (when the outermost em_lazy_begin ends).  Pending
 * tensors stay pending: they are computed when read, as before. */
EM_API em_status em_lazy_end(void);
/* Computes every pending tensor of this thread (intermediates still held
 * by a scope included), in one graph. */
EM_API em_status em_sync(void);
/* Computes t now if it is pending (and only what t needs); a no-op for a
 * tensor that has its values.  For timing, or to cut a long program. */
EM_API em_status em_realize(const em_tensor *t);
EM_API bool em_lazy_active(void);
typedef struct em_lazy_stats {
    int64_t ops_deferred;     /* ops recorded instead of run */
    int64_t flushes;          /* graphs run to compute pending tensors */
    int64_t graph_hits;       /* flushes whose graph was already compiled */
    int64_t graphs_compiled;  /* distinct graphs compiled */
    int64_t eager_graphs;     /* graphs run op by op: past the per-structure limit */
    int64_t dynamic_graphs;   /* dynamic entries: one compile serving many sizes */
    int64_t async_runs;       /* flushes run op by op while their graph compiled in
                                 the background (EMBER_ASYNC_COMPILE=1) */
    int64_t kernels_compiled; /* native kernels compiled for them */
    int64_t kernels_loaded;   /* kernels found in the cache instead */
} em_lazy_stats;
/* This thread's lazy-mode counters (zero if it never used lazy mode). */
EM_API em_status em_lazy_get_stats(em_lazy_stats *out);

/* ---- Runtime settings ---- */
/* Threads for eager CPU kernels (EMBER_NUM_THREADS; default: all cores). */
EM_API int em_num_threads(void);

#ifdef __cplusplus
}
#endif
#endif
