/* engine.h - the device-independent middle of the JIT (src/jit/engine):
 * how a captured graph becomes a plan of eager steps and kernel launches,
 * how kernels are found or compiled, and how a plan runs, for every device.
 *
 *   graph --sched/--> schedule --lower--> kernel IR --device.compile--> artifact
 *     |                                        |                          |
 *     +-- plan cache (plan.c) ----------------- kernel key -- kernel cache +
 *   run: plan steps in order; eager steps through em_dispatch, kernel
 *   steps through device.launch; each intermediate freed after its last
 *   reader (the allocator reuses its block).
 *
 * A device is a narrow table (jit_device): it names its target, keys,
 * compiles, loads and launches kernels.  Everything else -- plans, plan
 * caching, the kernel-cache sequence (key -> loaded table -> disk ->
 * compile -> verified store), dynamic shapes, buffer lifetimes -- is
 * written once, here.  A third device means one such table and one code
 * generator.
 *
 * The engine sits below src/jit/runtime (em_compile, lazy mode) and above
 * sched/ and kir/. */
#ifndef EMBER_ENGINE_H
#define EMBER_ENGINE_H

#include <stdio.h>

#include "cache.h"
#include "guards.h"
#include "kir.h"
#include "schedule.h"
#include "trace.h"

/* ---- logging (EMBER_LOG, EMBER_LOG_FILE; runtime/log.c) ---- */
enum {
    JIT_LOG_GRAPH = 1 << 0,      /* each captured graph */
    JIT_LOG_GUARDS = 1 << 1,     /* each entry's guards */
    JIT_LOG_RECOMPILES = 1 << 2, /* each recompile, with the failed guard */
    JIT_LOG_BREAKS = 1 << 3,     /* each graph break */
    JIT_LOG_CODE = 1 << 4,       /* each generated kernel, as kernel IR */
    JIT_LOG_CACHE = 1 << 5,      /* kernel and plan cache hits, misses and writes */
    JIT_LOG_DEVGRAPHS = 1 << 6,  /* device graphs captured, and why an entry runs without */
    JIT_LOG_TUNE = 1 << 7        /* autotuning: each candidate, its time, the choice (tune.c) */
};

typedef struct jit_log {
    unsigned flags;
    FILE *f;       /* stderr or the EMBER_LOG_FILE */
    bool own;      /* f was opened here */
} jit_log;

/* Reads EMBER_LOG and EMBER_LOG_FILE; unknown names are reported once on
 * the log itself and ignored. */
void jit_log_open(jit_log *l);
void jit_log_close(jit_log *l);
/* The kernel cache (kc_open's defaults) reporting its remote-tier events
 * under l's EMBER_LOG=cache; l must outlive it. */
kc_cache *jit_cache_open(const jit_log *l);
/* Prints "[ember] " + the message + newline when flag is on (flag 0:
 * always).  l may be NULL (nothing printed). */
void jit_logf(const jit_log *l, unsigned flag, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* A kernel's free schedule parameters (autotuning, tune.c): what a
 * device's variants hook proposes and its compile takes, opaque to the
 * engine.  All 0: the device's defaults (the kernel's plain key). */
typedef struct jit_params {
    int32_t v[4];
} jit_params;

/* A substitute for the device's timing (tests): the time in seconds of
 * candidate i (params p) of kernel k; ctx is jit_env.tune_ctx. */
typedef double (*jit_tune_timer)(void *ctx, const k_kernel *k, int i, const jit_params *p);

/* What a compile may use: owned by the compiled function (or lazy state,
 * or warmup). */
typedef struct jit_env {
    kc_cache *cache;            /* compiled artifacts; NULL: none */
    const jit_log *log;         /* NULL: quiet */
    /* A target named explicitly (ember-cache warmup --target sm_90): the
     * kernels are compiled and stored for it, not loaded, and no device
     * is needed.  NULL: the graph's own device. */
    const char *target;
    int64_t compiled;           /* kernels compiled */
    int64_t loaded;             /* kernels found loaded or in the cache instead */
    int64_t plans_loaded;       /* graphs whose plan came from the cache */
    int64_t plans_stored;       /* graphs whose plan this env wrote to the cache */
    int64_t lowered;            /* graphs scheduled and lowered to kernel IR */
    /* Look up only (ember-cache explain): a plan miss lowers the graph
     * and looks each kernel up (only whether it is present: nothing is
     * loaded); nothing is compiled or stored, and every miss is
     * explained (kc_explain) into explain. */
    bool dry_run;
    FILE *explain;              /* dry_run: where explanations go, one line each; NULL: nowhere */
    int64_t missing;            /* dry_run: kernels not in the cache */
    int64_t plans_missing;      /* dry_run: graphs whose plan is not in the cache (or unusable) */
    int64_t plans_unusable;     /* dry_run: of those, plans there but bad or missing kernels */
    /* Device graphs (graphs.c): states compiled with this env replay their
     * plans as one captured graph per size, where the device has them.
     * em_compile sets it (the cuda_graphs option, EMBER_CUDA_GRAPHS); the
     * log must then outlive the states. */
    bool graphs;
    /* Autotuning (tune.c): a static compile times each kernel's candidate
     * schedules (the device's variants) on its real sizes and keeps the
     * fastest, remembered in the cache (kind "tune") per device model.
     * em_compile and lazy mode set it (the autotune option, EMBER_AUTOTUNE). */
    bool autotune;
    jit_tune_timer tune_time;   /* NULL: the device's time hook */
    void *tune_ctx;
    double tune_budget;         /* seconds a graph's tuning may take; 0: JIT_TUNE_BUDGET */
    int64_t tuned;              /* kernels timed and their choice stored */
    int64_t tune_hits;          /* kernels whose choice came from the cache */
    int64_t timed;              /* candidate timings taken */
} jit_env;

/* ---- devices ---- */

/* A device's loaded kernel: opaque to the engine. */
typedef struct jit_kernel jit_kernel;
/* A device graph being captured, and a captured one (CUDA graphs): opaque
 * to the engine (graphs.c). */
typedef struct jit_capture jit_capture;
typedef struct jit_graph jit_graph;

/* An artifact as a device's compile leaves it: a file it wrote (path, the
 * engine stores or removes it), bytes (em_malloc'd), or a kernel already
 * loaded (compiled in memory: nothing to store).  Exactly one is set. */
typedef struct jit_artifact {
    char *path;
    void *bytes;
    size_t n;
    jit_kernel *loaded;
} jit_artifact;

/* Where a device reads an artifact to load: an open file (a sealed memory
 * file of the cache's verified bytes) or bytes in memory. */
typedef struct jit_blob {
    int fd;               /* -1: bytes instead */
    const void *bytes;
    size_t n;
} jit_blob;

typedef struct jit_device {
    const char *name;      /* "cpu", "cuda": its backend's name, in keys and records */
    em_device_type type;   /* the tensors it runs kernels on */
    const char *kind;      /* the kernel cache kind of its artifacts ("so", "cubin") */
    /* What its artifacts depend on besides the kernel IR for device index
     * (compiler, generator and options versions, architecture), into buf;
     * with env->target set, that target instead.  false (error set): no
     * kernel can be made here. */
    bool (*target)(int index, const jit_env *env, char *buf, size_t n);
    /* The cache key of k's artifact for target (the key the artifact
     * embeds and load checks); m (NULL: the key only) gets its manifest,
     * the named fields it hashes (kc_fields). */
    bool (*key)(const k_kernel *k, const char *target, kc_key *key, kc_manifest *m);
    /* Compiles ks[i] (NULL: skip) for target, keyed keys[i], with the
     * schedule parameters params[i] (params NULL: all defaults; a device
     * without variants only ever gets defaults), into out[i]; n >= 1.  An
     * item it cannot compile is left empty with the reason logged (the
     * graph then runs op by op); an error return stops all. */
    em_status (*compile)(int index, const char *target, k_kernel *const *ks, const kc_key *keys,
                         const jit_params *params, int n, jit_env *env, jit_artifact *out);
    /* Loads the artifact in b for device index, checking that it carries
     * key (the key it was compiled for): EM_ERR_STATE otherwise. */
    em_status (*load)(int index, const jit_blob *b, const kc_key *key, jit_kernel **out);
    /* Launches k: bufs[i] is buffer parameter #i's data, sizes[i] size
     * parameter #i (NULL: none). */
    em_status (*launch)(const jit_kernel *k, void *const *bufs, const int64_t *sizes);
    /* Releases k (NULL: kernels stay loaded for the process: the device
     * owns them, and find/add keep them). */
    void (*unload)(jit_kernel *k);
    /* Optional: the device's table of loaded kernels (this process), the
     * first tier of the kernel cache sequence. */
    jit_kernel *(*find)(int index, const kc_key *key);
    void (*add)(int index, const kc_key *key, jit_kernel *k);
    /* Optional: the node of group gi that the device runs better with its
     * eager op (a kernel step becomes an eager step of the plan), or -1. */
    int (*prefer_eager)(int index, const sc_schedule *s, int gi);
    /* Optional (false): the device runs the fused attention op
     * (EM_OP_ATTENTION) as an eager step of its plans, so the engine
     * rewrites attention into it (tr_fuse_attention) before scheduling,
     * static and dynamic compiles alike. */
    bool fused_attention;
    /* Optional (NULL: f32 only): whether device index's fused attention
     * op takes dt operands (f16, bf16) with head sizes D, Dv, so the
     * attention pass fuses half attention too (tr_fuse_attention_for). */
    bool (*fused_attention_takes)(int index, em_dtype dt, int64_t D, int64_t Dv);
    /* Optional (NULL: never): whether the device's matmul kernel adds a
     * bias as it writes a @ w's product (metas of a, w, bias) and then
     * applies act (EM_ACT_NONE: nothing; relu, gelu_tanh), so that the
     * engine rewrites such a matmul, its bias add and act into one linear
     * node (tr_fuse_linear_map) before scheduling a static compile.  A
     * device that cannot apply act says no, and the act stays a node. */
    bool (*fuse_linear)(int index, const em_meta *a, const em_meta *w, const em_meta *bias, em_act act);
    /* Optional (0: never): how many result elements a reduction needs to
     * keep the device's kernels busy; a compile splits reductions with
     * fewer (and a large input) in two (tr_split_reductions).  A
     * constant of the device kind, not of the machine (a plan is cached
     * for the device kind's graph: a thread count here would make two
     * processes' graphs differ). */
    int64_t split_rows;
    /* Optional (0: never): the reduced elements from which a row is too
     * long for the device's row kernels to keep (a GPU block's registers),
     * so that reductions over longer rows split whatever their number
     * (tr_split_reductions' long_row).  EMBER_SPLIT_LONG overrides it. */
    int64_t split_long;
    /* Optional (false): its generator takes f16/bf16 buffers, loads, stores
     * and conversions, so the scheduler fuses half values (computed in
     * f32: sched/lower.c); otherwise they run as eager steps. */
    bool half_kernels;
    /* Optional, all five or none: device graphs (graphs.c replays a
     * compiled entry's plan with one launch).  capture_begin makes the
     * calling thread's work on device index, until capture_end, a graph
     * instead of running it: its launches, copies between device buffers,
     * and the device memory allocated meanwhile, which the graph owns
     * until graph_free (its replays write it).  Work that cannot be
     * captured (a copy with the host, an op the device runs on the host,
     * a random draw) fails with EM_ERR_UNSUPPORTED and the reason.
     * capture_end (ok false: abandon) gives the graph, or an error saying
     * why none was made, and ends the capture either way; graph_launch
     * replays it in order with the device's other work; graph_bytes is
     * the device memory it owns.  An error from capture_begin (no graph
     * API in the driver, another thread capturing) means: not now. */
    em_status (*capture_begin)(int index, jit_capture **out);
    em_status (*capture_end)(jit_capture *c, bool ok, jit_graph **out);
    em_status (*graph_launch)(jit_graph *g);
    size_t (*graph_bytes)(const jit_graph *g);
    void (*graph_free)(jit_graph *g);
    /* Optional, for autotuning (tune.c): variants and model, and time
     * unless the env substitutes a timer.  variants fills out (room for
     * max) with k's candidate schedules, the default (all 0) first, each
     * printing a distinct kernel; the count (<= 1: nothing to tune).
     * time launches k max(reps, 1) times after one untimed launch and
     * gives the median seconds (jit_median).  model names the device as
     * its choices depend on it (a GPU's name and architecture, a CPU's
     * brand string), into buf; false: not known (nothing tuned). */
    int (*variants)(int index, const k_kernel *k, jit_params *out, int max);
    em_status (*time)(const jit_kernel *k, void *const *bufs, const int64_t *sizes, int reps,
                      double *seconds);
    bool (*model)(int index, char *buf, size_t n);
} jit_device;

/* EMBER_COMPILE_TIMEOUT (seconds, default JIT_COMPILE_TIMEOUT): the
 * longest a kernel's compile may take, and the longest a compile waits
 * for another thread or process compiling the same kernel; a bad value
 * is logged (when log) and the default used. */
#define JIT_COMPILE_TIMEOUT 120.0 /* a kernel compiles in 20-500 ms */
double jit_compile_timeout(const jit_log *log);

/* A key for devices to use as their key function: the hash of "ember
 * kernel", name, target and k's printed IR (fields what, device, target,
 * kernel_ir of the manifest m, when not NULL). */
bool jit_kernel_key(const char *name, const char *target, const k_kernel *k, kc_key *key,
                    kc_manifest *m);

/* Why the lookup of want's key (an artifact of kind, described as what:
 * "graph plan", "kernel k0") missed: logged as "cache miss: <what>
 * (<key>): <kc_explain's paragraph>" under EMBER_LOG=cache, and written
 * to env->explain as "<what> (<key>): <paragraph>".  Scans the disk
 * tier's manifests, so only when one of the two wants it. */
void jit_explain_miss(const jit_env *env, const char *what, const kc_manifest *want,
                      const char *kind);
/* Stores m next to its artifact of kind (kc_put_manifest); a failure only
 * costs a later miss its explanation (cleared, never an error). */
void jit_store_manifest(const jit_env *env, const kc_manifest *m, const char *kind);

/* The one kernel cache sequence, for every device: for each ks[i]
 * (NULL: skip), its key keys[i] -> the device's loaded table -> the disk
 * cache -> compiled (all misses in one device compile; kernels of one key
 * compiled once; a miss that another thread or process is compiling now
 * (a claim, cache.h) is waited for, not compiled again) -> stored ->
 * loaded back from the verified store; out[i]
 * gets the kernel (NULL when it could
 * not be compiled: the caller runs the graph op by op).  With
 * env->target, nothing is loaded: the misses are compiled and stored.
 * With env->dry_run, nothing is loaded, compiled or stored: the misses are
 * counted into env->missing (out[i] NULL) and explained.  Each kernel
 * stored gets its key's manifest beside it (kind "why_" + d->kind).
 * Counts into env->compiled and env->loaded; logs under EMBER_LOG=cache,
 * each miss with why it missed (jit_explain_miss). */
em_status jit_get_kernels(const jit_device *d, int index, jit_env *env, k_kernel *const *ks,
                          const kc_key *keys, int n, jit_kernel **out);

/* jit_get_kernels with the schedule parameters params[i] of each kernel
 * (params NULL: defaults), each keys[i] the key of its parameters
 * (jit_tune_key). */
em_status jit_get_kernels_with(const jit_device *d, int index, jit_env *env, k_kernel *const *ks,
                               const kc_key *keys, const jit_params *params, int n,
                               jit_kernel **out);

/* ---- autotuning (tune.c) ----
 * A static compile with env->autotune on a device with variants, model and
 * a timer, and no named target or dry run, on a thread that is not a
 * background compile's (jit_set_background_thread), tunes each kernel worth it
 * (static sizes, at least JIT_TUNE_MIN_BYTES of buffers, at most
 * JIT_TUNE_MAX_KERNELS a graph): its candidates are compiled in one
 * device call, timed on scratch buffers of the real sizes (JIT_TUNE_REPS
 * launches, the median), and the fastest is kept; the choice is stored
 * as a "tune" record keyed by the device, its model and the kernel's
 * plain key, which a later compile reuses without timing.  Timing stops
 * after JIT_TUNE_BUDGET seconds a graph (the rest keep their defaults,
 * unrecorded).  A record that is bad, another kernel's or device's, or
 * names a candidate the device no longer proposes is ignored: the
 * default runs. */
#define JIT_TUNE_MAX_CANDIDATES 4
#define JIT_TUNE_MAX_KERNELS 8
#define JIT_TUNE_REPS 5
#define JIT_TUNE_MIN_BYTES ((int64_t)1 << 20) /* smaller: launch-bound, nothing to win */
#define JIT_TUNE_BUDGET 0.2                   /* seconds of timing a graph, after its compiles */

/* Whether compiles on d with env tune (above). */
bool jit_tune_on(const jit_device *d, int index, const jit_env *env);
/* Whether p is all defaults. */
bool jit_params_default(const jit_params *p);
/* The key of kernel k's artifact with parameters p: base (the device's key
 * of k) for defaults, else the hash of base and p. */
kc_key jit_tune_key(const kc_key *base, const jit_params *p);
/* The cache key (kind "tune") of the record of kernel base's choice on
 * device d of model (d->model's text). */
kc_key jit_tune_record_key(const jit_device *d, const char *model, const kc_key *base);
/* The median of x[0..n) (reordered), n >= 1: for devices' time hooks. */
double jit_median(double *x, int n);

/* The kernels filed under keys[i] (where live[i]), from the device's
 * table or the disk cache, without their IR (a plan cache hit); with
 * env->target or env->dry_run, only whether all are present.  false (out all NULL) on any
 * miss. */
bool jit_load_kernels(const jit_device *d, int index, jit_env *env, const kc_key *keys,
                      const bool *live, int n, jit_kernel **out);

/* Marks the calling thread as a background compile thread (the runtime's
 * compile queue), for good: a device must not run in-process compilers
 * that are unsafe there (libgccjit, whose driver calls putenv while it
 * makes a shared object, and which must not start while exit tears the
 * process down). */
void jit_set_background_thread(void);
bool jit_on_background_thread(void);

/* ---- dynamic shapes (dynamic.c) ---- */

/* The attribute of a node a dynamic size may set (jit_sym_size.field). */
typedef enum jit_sym_field {
    JIT_SYM_SIZE,  /* attrs.sizes[j]: a reshape's, an expand's or a creation op's
                      (arange's count, zeros' sizes...) */
    JIT_SYM_START, /* a slice's bounds */
    JIT_SYM_END,
    JIT_SYM_VALUE, /* a fill or scalar value */
} jit_sym_field;

/* How a value follows its size s (JIT_SYM_VALUE): f * s, f / s,
 * f * sqrt(s), f / sqrt(s).  One coefficient, so the second trace checks
 * the form instead of fitting it. */
typedef enum jit_sym_form { JIT_SYM_TIMES, JIT_SYM_OVER, JIT_SYM_TIMES_SQRT, JIT_SYM_OVER_SQRT } jit_sym_form;

/* An attribute that follows a dynamic size: node's attribute `field`
 * (index j of the sizes) is a * s + b for s the size of dim `dim` of input
 * `input` (a reshape to [b, t, 4, 16] follows b and t; em_arange(0, t)
 * has t elements), or for a value f and form.  With product, s is that
 * size times the size of dim `dim2` of input `input2` (two symbols:
 * em_arange(0, b * t); b is 0 then). */
typedef struct jit_sym_size {
    int node, j, input, dim;
    bool product;
    int input2, dim2;
    jit_sym_field field;
    int64_t a, b;
    double f;
    jit_sym_form form;
    bool rest; /* a reshape's size that is whatever its input's element
                  count leaves (a product of sizes: [b * t, 64]) */
} jit_sym_size;

#define JIT_MAX_SYM_SIZES 32

/* What makes an entry dynamic: the inputs' metas with each dynamic size
 * changed (probe, one per input), and the attribute sizes that follow
 * dynamic sizes. */
typedef struct jit_dyn {
    em_meta *probe;
    jit_sym_size sizes[JIT_MAX_SYM_SIZES];
    int nsizes;
    /* Set by a jit_dyn_check that failed because a reshape splits dynamic
     * dim `dim` of input `input`, whose size must then be a multiple of q
     * (0: no such reason): with that divisor guarded, it may pass. */
    struct { int input, dim; int64_t q; } need;
} jit_dyn;

/* Whether graph g, traced with inputs in, may serve other sizes of the
 * dims its guards gs mark dynamic.  The graph's shapes must follow (they
 * are inferred again at probe sizes: dims of one traced size share one
 * probe, as Dynamo's duck sizing), and no op may carry a size, bound or
 * value the C code computed from a dynamic size: prev (the same function
 * traced at other sizes, or NULL) must equal g in everything but metas,
 * except attributes that follow one dynamic size (jit_sym_size: reshape,
 * expand and creation sizes, slice bounds, values; recorded in
 * dyn->sizes; prev_dyn: the attributes that already followed in prev's
 * entry, kept while they hold); without prev,
 * conservative rules decide.  Fills dyn (probe has g->ninputs slots).  false, with the
 * reason in why: the entry must be static. */
bool jit_dyn_check(const tr_graph *g, const tr_graph *prev, const jit_dyn *prev_dyn,
                   const gd_guards *gs, em_tensor *const *in, jit_dyn *dyn, char *why,
                   size_t nwhy);
/* The metas of g's nodes (into metas) for inputs of metas inputs, with
 * the attribute sizes dyn lists set in g's nodes (a copy of the graph's
 * own) as it goes.  An error names the node whose op rejects its inputs. */
em_status jit_dyn_infer(const jit_dyn *dyn, tr_graph *g, const em_meta *inputs, em_meta *metas);
/* Only the probe metas (no check): for a graph already checked when it
 * was traced (warmup of a recorded dynamic entry).  false: too many
 * distinct dynamic sizes. */
bool jit_dyn_probe(const gd_guards *gs, em_tensor *const *in, int ninputs, em_meta *probe);
/* The metas of in (ninputs of them) with every dynamic dim of size
 * traced set to size (one symbol, as duck sizing makes it), laid out as
 * the guards accept. */
void jit_dyn_metas_at(const gd_guards *gs, em_tensor *const *in, int ninputs, int64_t traced,
                      int64_t size, em_meta *m);
/* Dynamic hints: which input dims the entries of a graph's structure
 * were dynamic in, kept in the cache (kind "dynhint") across processes,
 * as Dynamo's automatic-dynamic profile: a new process whose first call
 * has that structure makes those dims dynamic at once instead of tracing
 * a static entry first.  The key is the graph without its sizes (ops,
 * wiring, dtypes, ranks, the attributes no size sets) and the backend;
 * the payload one u32 mask per input.  A hint only proposes: the graph
 * is checked as any dynamic entry is.  put merges with what is there
 * (the union: entries traced at size 1 make fewer dims dynamic). */
void jit_dyn_hint_put(kc_cache *c, const char *backend, const tr_graph *g, const gd_guards *gs);
/* The hint's masks for g into mask (g->ninputs of them); false: none. */
bool jit_dyn_hint_get(kc_cache *c, const char *backend, const tr_graph *g, uint32_t *mask);
/* Whether every attribute dyn makes follow the sizes, computed from g's
 * own input sizes, is g's attribute (g: the function traced at other
 * sizes; a rest always holds). */
bool jit_dyn_holds(const jit_dyn *dyn, const tr_graph *g);
/* Whether graph g, with the attributes dyn makes follow the sizes, is the
 * graph dry (the same function traced at other input sizes, a dry trace):
 * the same nodes, attributes and inferred sizes.  What lets a dynamic dim
 * take the size 1, which graphs need not follow as they follow others
 * (a branch on it, a broadcast it makes): the function is traced there. */
bool jit_dyn_same(const jit_dyn *dyn, const tr_graph *g, const tr_graph *dry);
/* z as one line of text for warmup lists (the input named in<i>):
 *   follow %23 size[0] = 1 * in0[1] + 0     (an integer attribute)
 *   follow %7 size[0] = rest                (a reshape's rest)
 *   follow %9 value[0] = 0x1p+0 over_sqrt in0[1]
 * and back: false when s is not such a line. */
void jit_sym_print(const jit_sym_size *z, FILE *f);
bool jit_sym_parse(const char *s, jit_sym_size *z);

/* ---- compiled graphs ----
 * A compiled graph (jit_compiled, engine.c) is its plan and loaded kernels
 * on one device, or nothing (then it runs op by op, eagerly, still
 * correct).  Ownership: the state owns its plan, kernels (when the device
 * unloads them) and size specializations; jit_engine_free releases all. */
typedef struct jit_compiled jit_compiled;

/* Compiles g for device d: its plan from the plan cache (checked against
 * g, no scheduling or lowering), else scheduled, lowered, its kernels got
 * (jit_get_kernels) and its plan stored.  A graph that cannot be compiled
 * (an op the lowering lacks, tensors off the device) gets a state that
 * runs op by op, with the reason logged under EMBER_LOG=code: EM_OK.
 * Errors: out of memory. */
em_status jit_engine_compile(const jit_device *d, const tr_graph *g, jit_env *env,
                             jit_compiled **out);
/* The same for sizes that vary as dyn says: kernels with size
 * parameters, one state for every size the guards pass (specialize says
 * whether it serves given inputs).  When the kernels differ in more than
 * sizes, compiles g for its traced sizes (*dynamic false, why says why). */
em_status jit_engine_compile_dynamic(const jit_device *d, const tr_graph *g, const jit_dyn *dyn,
                                     jit_env *env, jit_compiled **out, bool *dynamic, char *why,
                                     size_t nwhy);
/* Whether st serves inputs in, and the size specialization its run needs
 * (*spec; NULL for a static state). */
bool jit_engine_specialize(jit_compiled *st, const tr_graph *g, em_tensor *const *in, void **spec);
/* Why st last refused a call's sizes in jit_engine_specialize ("" if it
 * never did): a sentence for stats.last_failure. */
const char *jit_engine_declined(const jit_compiled *st);
/* Runs g: outputs new tensors (owned as any op result).  spec: from
 * jit_engine_specialize, or NULL. */
em_status jit_engine_run(jit_compiled *st, void *spec, const tr_graph *g, em_tensor *const *in,
                         em_tensor **out);
void jit_engine_free(jit_compiled *st);
/* Kernels the state holds (statistics). */
int jit_engine_kernels(const jit_compiled *st);
/* Device graphs the state captured, and calls it replayed through one
 * (statistics; graphs.c). */
void jit_engine_graph_stats(jit_compiled *st, int64_t *captured, int64_t *replays);

/* Runs call node n eagerly on the values of its inputs (vals, by node);
 * random ops draw from their generator's current state, as eager code
 * (exec.c). */
em_tensor *jit_replay_node(const tr_node *n, em_tensor **vals);
/* Runs g op by op with the eager ops, each intermediate freed after its
 * last reader (exec.c): the replay backend, and every graph that has no
 * compiled form. */
em_status jit_exec_op_by_op(const tr_graph *g, em_tensor *const *in, em_tensor **out);

#endif
