/* backend_cpu.c - the "cpu" backend: a graph's fused groups compiled into
 * native kernels with libgccjit, the other ops run eagerly between them.
 *
 * compile: schedule (schedule.c) -> lower each group (lower.c) -> compile
 * each kernel (cpu_gccjit.c).  A graph any of whose groups cannot be
 * lowered or compiled runs op by op like the replay backend, with the
 * reason logged under EMBER_LOG=code... never a wrong result. */
#include "cpu_gccjit.h"
#include "jit.h"
#include "schedule.h"
#include "plan.h"
#include "compile_queue.h"
#include "worker.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Dynamic shapes: what a run needs for one set of input sizes: every
 * node's meta and each kernel's size arguments. */
typedef struct cpu_spec {
    em_meta *in;      /* the inputs' metas it was made for */
    em_meta *metas;   /* per node */
    tr_node *nodes;   /* the graph's nodes with these metas and attribute sizes
                         (eager steps run them) */
    int64_t **sizes;  /* per plan kernel (NULL: none) */
    bool owned;       /* not in the memo: run_dynamic frees it */
    const em_allocator *alloc; /* the state owner's (specialize runs under it);
                                  run_dynamic may free it under a caller's */
} cpu_spec;

/* Specs kept per dynamic state: a function called with more distinct sizes
 * than this redoes the (microsecond) check for the others on each call. */
#define SPEC_MEMO 16

/* A graph's compiled form: its plan (steps, and per kernel its cache key
 * and buffers) and the loaded kernels.  No steps: run op by op.  A
 * dynamic state also keeps each kernel as lowered for the traced sizes
 * (the model the kernels of other sizes must match, kir_match) and which
 * of its constants are size arguments. */
typedef struct cpu_state {
    jit_plan plan;
    jit_cpu_kernel **kernels; /* by plan kernel */
    bool dynamic;
    k_kernel **model;         /* per plan kernel (NULL: dead) */
    int **size_of;            /* per plan kernel: instruction -> size argument or -1 */
    cpu_spec *memo[SPEC_MEMO];
    int nmemo;
    jit_dyn follow;           /* attribute sizes that follow the sizes (no probe) */
} cpu_state;

static void spec_free(const cpu_state *st, cpu_spec *sp) {
    if (!sp) return;
    const em_allocator *caller = em_get_allocator();
    em_set_allocator(sp->alloc);
    for (int i = 0; sp->sizes && i < st->plan.nkernels; i++) em_free(sp->sizes[i]);
    em_free(sp->sizes);
    em_free(sp->in);
    em_free(sp->metas);
    em_free(sp->nodes);
    em_free(sp);
    em_set_allocator(caller);
}

static void drop_dynamic(cpu_state *st) {
    for (int i = 0; i < st->nmemo; i++) spec_free(st, st->memo[i]);
    st->nmemo = 0;
    for (int i = 0; st->model && i < st->plan.nkernels; i++) {
        kir_free(st->model[i]);
        em_free(st->size_of[i]);
    }
    em_free(st->model);
    em_free(st->size_of);
    st->model = NULL;
    st->size_of = NULL;
    st->dynamic = false;
}

static void drop_kernels(cpu_state *st) {
    drop_dynamic(st);
    for (int i = 0; st->kernels && i < st->plan.nkernels; i++) jit_cpu_free(st->kernels[i]);
    em_free(st->kernels);
    st->kernels = NULL;
    jit_plan_clear(&st->plan);
}

static void state_free(cpu_state *st) {
    if (!st) return;
    drop_kernels(st);
    em_free(st);
}

/* The cache key of kernel k: everything that determines the shared
 * object (the cache adds its own format version). */
static bool kernel_key(const k_kernel *k, kc_key *key) { return jit_cpu_kernel_key(k, key); }

static void log_kernel(const jit_env *env, const k_kernel *k) {
    if (!env->log || !(env->log->flags & JIT_LOG_CODE)) return;
    jit_logf(env->log, JIT_LOG_CODE, "kernel %s:", k->name);
    kir_print(k, env->log->f);
}

/* A temporary file name for a compiler's output (the caller unlinks it):
 * in the process's private directory, removed at exit (worker_pool.c). */
static bool temp_path(char *buf, size_t n) { return jit_worker_temp_path(buf, n); }

/* Loads the kernel filed under key: the cache's verified bytes, in a
 * sealed memory file, whose embedded key must be key.  EM_OK with *out
 * NULL on a miss (absent, bad, or another key's object). */
static em_status load_cached(jit_env *env, const kc_key *key, const char *name,
                             jit_cpu_kernel **out) {
    int fd = -1;
    *out = NULL;
    em_status s = kc_get_fd(env->cache, key, "so", &fd);
    if (s != EM_OK || fd < 0) return s;
    s = jit_cpu_load_fd(fd, name, key, out);
    close(fd);
    if (s == EM_OK) return EM_OK;
    jit_logf(env->log, JIT_LOG_CACHE, "cache entry unusable, a miss: %s", em_last_error());
    em_clear_error();
    *out = NULL;
    return EM_OK;
}

/* Stores the shared object at tmp under key and loads it from the cache. */
static em_status store_and_load(jit_env *env, const kc_key *key, const char *name,
                                const char *tmp, jit_cpu_kernel **out) {
    char hex[KC_KEY_HEX_SIZE];
    em_status s = kc_put_file(env->cache, key, "so", tmp);
    if (s == EM_OK) s = load_cached(env, key, name, out);
    if (s == EM_OK && *out) {
        kc_key_hex(key, hex);
        jit_logf(env->log, JIT_LOG_CACHE, "cache write: kernel %s (%s)", name, hex);
        return EM_OK;
    }
    unlink(tmp);
    return s == EM_OK ? em_error(EM_ERR_STATE, "cpu backend: kernel %s not loadable from the "
                                 "cache after its write", name) : s;
}

/* The kernel from the cache: *out set on a hit, NULL on a miss. */
static void lookup(jit_env *env, const k_kernel *k, const kc_key *key, jit_cpu_kernel **out) {
    char hex[KC_KEY_HEX_SIZE];
    *out = NULL;
    kc_key_hex(key, hex);
    if (load_cached(env, key, k->name, out) == EM_OK && *out) {
        env->loaded++;
        jit_logf(env->log, JIT_LOG_CACHE, "cache hit: kernel %s (%s)", k->name, hex);
        return;
    }
    em_clear_error();
    jit_logf(env->log, JIT_LOG_CACHE, "cache miss: kernel %s (%s): compiling", k->name, hex);
}

/* Compiles k in this process, through the cache when there is one. */
static em_status compile_here(jit_env *env, const k_kernel *k, const kc_key *key,
                              jit_cpu_kernel **out) {
    char tmp[4096];
    env->compiled++;
    if (env->cache && temp_path(tmp, sizeof tmp)) {
        if (jit_cpu_write_so(k, tmp) == EM_OK && store_and_load(env, key, k->name, tmp, out) == EM_OK)
            return EM_OK;
        unlink(tmp);
        em_clear_error(); /* the cache failed: compile in memory */
    }
    return jit_cpu_compile(k, out);
}

/* A kernel a worker wrote to path: into the cache and loaded from there,
 * or (no cache) loaded from path itself. */
static em_status take_worker_output(jit_env *env, const k_kernel *k, const kc_key *key,
                                    const char *path, jit_cpu_kernel **out) {
    if (env->cache) return store_and_load(env, key, k->name, path, out);
    /* no cache: loaded where the worker wrote it, still checked for key */
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return em_error(EM_ERR_STATE, "cpu backend: cannot open %s: %s", path, strerror(errno));
    em_status s = jit_cpu_load_fd(fd, k->name, key, out);
    close(fd);
    return s;
}

/* Gets every kernel: from the cache, else compiled in worker processes
 * (ember-jit-worker), one per thread at most, which share the misses
 * round robin.  Not in this process, where it can be avoided: libgccjit's
 * embedded driver calls putenv while it makes a shared object, which
 * moves the environ array under any other thread's getenv (the program's
 * own, Check's, libc's): test_async crashed so.  Only when no worker can
 * run (EMBER_JIT_WORKER=0, none installed) or one fails does this process
 * compile itself. */
static em_status get_kernels(jit_env *env, k_kernel **ks, const kc_key *keys, int n,
                             jit_cpu_kernel **out) {
    int *miss = em_malloc(sizeof(int) * (size_t)(n + 1));
    k_kernel **wk = em_calloc((size_t)n + 1, sizeof *wk);
    char **paths = em_calloc((size_t)n + 1, sizeof *paths);
    jit_worker_result *ok = em_calloc((size_t)n + 1, sizeof *ok);
    em_status s = miss && wk && paths && ok ? EM_OK : em_last_status();
    int nmiss = 0;
    for (int i = 0; s == EM_OK && i < n; i++) {
        if (!ks[i]) continue; /* a dead group */
        if (env->cache) lookup(env, ks[i], &keys[i], &out[i]);
        if (!out[i]) miss[nmiss++] = i;
    }
    /* at exit the compile queue's jobs must end soon, and libgccjit must
     * not start while exit tears down the process around it */
    if (s == EM_OK && nmiss > 0 && jit_workers_exiting())
        s = em_error(EM_ERR_STATE, "cpu backend: the process is exiting: %d kernels not compiled", nmiss);
    int m = 0;
    while (s == EM_OK && m < nmiss && (paths[m] = em_malloc(4096)) && temp_path(paths[m], 4096)) {
        wk[m] = ks[miss[m]];
        m++;
    }
    jit_workers *workers =
        m > 0 && m == nmiss ? jit_workers_start(wk, (const char *const *)paths, m, em_num_threads(), env->log)
                            : NULL;
    if (workers) jit_workers_finish(workers, ok);
    for (int t = 0; t < nmiss && s == EM_OK; t++) {
        int i = miss[t];
        env->compiled++;
        if (workers && ok[t] == JIT_WORKER_DONE) {
            if (take_worker_output(env, ks[i], &keys[i], paths[t], &out[i]) == EM_OK) continue;
            em_clear_error();
        }
        if (workers && ok[t] == JIT_WORKER_FAILED) { /* hung or crashed: not in this process */
            s = em_error(EM_ERR_STATE, "a compile worker failed on kernel %d (logged)", i);
            break;
        }
        env->compiled--;
        if (jit_workers_exiting()) { /* exit began during the compiles */
            s = em_error(EM_ERR_STATE, "cpu backend: the process is exiting: kernels not compiled");
            break;
        }
        if (jit_queue_on_queue_thread()) { /* see compile_queue.c: not safe at exit */
            s = em_error(EM_ERR_STATE, "cpu backend: kernel %d: no compile worker could compile "
                         "it, and a background compile does not run libgccjit in process", i);
            break;
        }
        s = compile_here(env, ks[i], &keys[i], &out[i]); /* no worker, or it failed */
    }
    for (int t = 0; t < m; t++) {
        unlink(paths[t]); /* already moved into the cache when stored */
        em_free(paths[t]);
    }
    em_free(miss);
    em_free(wk);
    em_free(paths);
    em_free(ok);
    return s;
}

/* Drops the kernels: the graph then runs op by op, correct but slower. */
static void run_op_by_op(cpu_state *st, const jit_env *env) {
    jit_logf(env->log, JIT_LOG_CODE, "graph runs op by op: %s", em_last_error());
    drop_kernels(st);
    em_clear_error();
}

static bool group_has_step(const sc_schedule *sched, int gi) {
    for (int i = 0; i < sched->nsteps; i++)
        if (sched->steps[i].kind == SC_KERNEL && sched->steps[i].group == gi) return true;
    return false;
}

/* Schedules, lowers and compiles g into st's plan and kernels. */
static em_status build(const tr_graph *g, jit_env *env, cpu_state *st) {
    sc_schedule *sched = sc_build(g);
    if (!sched) return em_last_status();
    jit_plan *p = &st->plan;
    int n = sched->ngroups;
    p->steps = em_calloc((size_t)sched->nsteps + 1, sizeof *p->steps);
    p->kernels = em_calloc((size_t)n + 1, sizeof *p->kernels);
    st->kernels = em_calloc((size_t)n + 1, sizeof *st->kernels);
    k_kernel **ks = em_calloc((size_t)n + 1, sizeof *ks);
    kc_key *keys = em_calloc((size_t)n + 1, sizeof *keys);
    em_status s = p->steps && p->kernels && st->kernels && ks && keys ? EM_OK : em_last_status();
    if (s == EM_OK) {
        p->nkernels = n;
        p->nsteps = sched->nsteps;
        em_copy_bytes(p->steps, sched->steps, sizeof *p->steps * (size_t)sched->nsteps);
    }
    for (int gi = 0; gi < n && s == EM_OK; gi++) {
        jit_plan_kernel *pk = &p->kernels[gi];
        if (!group_has_step(sched, gi)) continue; /* dead: nothing to compile */
        pk->bufs = em_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
        ks[gi] = pk->bufs ? sc_lower(sched, gi, pk->bufs, &pk->nbufs, &pk->nouts) : NULL;
        if (!ks[gi] || !kernel_key(ks[gi], &pk->key))
            s = em_last_status() ? em_last_status() : EM_ERR_UNSUPPORTED;
        else
            log_kernel(env, ks[gi]);
        keys[gi] = pk->key;
    }
    if (s == EM_OK) s = get_kernels(env, ks, keys, n, st->kernels);
    for (int gi = 0; ks && gi < n; gi++) kir_free(ks[gi]);
    em_free(ks);
    em_free(keys);
    sc_free(sched);
    return s;
}

/* Kernels that exist (dead groups have none). */
static int count_kernels(const cpu_state *st) {
    int n = 0;
    for (int i = 0; st->kernels && i < st->plan.nkernels; i++) n += st->kernels[i] != NULL;
    return n;
}

/* The kernel name of plan kernel i (lower.c names every kernel the same). */
static void kernel_name(int i, char *buf, size_t n) {
    (void)i;
    snprintf(buf, n, "%s", JIT_KERNEL_NAME);
}

static bool same_steps(const sc_schedule *a, const jit_plan *p);
static k_kernel *lower_like(const sc_schedule *sched, int gi, const jit_plan_kernel *pk, int *bufs);

/* Whether kernel gi of p is what build() makes of group gi of sched: the
 * same buffers (nodes, order, results) and the same kernel key, which
 * hashes the kernel's IR and so its every buffer's dtype, extents and
 * strides. */
static bool kernel_fits(const sc_schedule *sched, int gi, const jit_plan_kernel *pk, int *bufs) {
    if (!group_has_step(sched, gi)) return pk->nbufs == 0;
    k_kernel *k = lower_like(sched, gi, pk, bufs);
    kc_key key;
    bool ok = k && kernel_key(k, &key) && kc_key_equal(&key, &pk->key);
    kir_free(k);
    return ok;
}

/* Whether p is the plan build() would make for g.  A plan read from disk
 * is checked, not trusted: one filed under another graph's key, or with
 * steps dropped or buffers shifted, would run the wrong kernels on the
 * wrong buffers.  Scheduling and lowering cost microseconds; what a plan
 * hit saves is the code generation.  Nothing has run yet. */
static bool plan_fits(const tr_graph *g, const jit_plan *p) {
    sc_schedule *sched = sc_build(g);
    int *bufs = em_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    bool ok = sched && bufs && same_steps(sched, p);
    for (int gi = 0; ok && gi < p->nkernels; gi++) ok = kernel_fits(sched, gi, &p->kernels[gi], bufs);
    sc_free(sched);
    em_free(bufs);
    return ok;
}

/* Loads g's plan and every kernel it names from the cache; false (st
 * empty) on any miss. */
static bool load_plan(jit_env *env, const tr_graph *g, const kc_key *gkey, cpu_state *st) {
    void *text = NULL;
    size_t n = 0;
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(gkey, hex);
    if (kc_get(env->cache, gkey, "plan", &text, &n) != EM_OK || !text) {
        em_clear_error();
        jit_logf(env->log, JIT_LOG_CACHE, "cache miss: graph plan (%s)", hex);
        return false;
    }
    bool ok = jit_plan_parse(text, n, g, gkey, &st->plan) && plan_fits(g, &st->plan);
    em_free(text);
    if (ok) ok = (st->kernels = em_calloc((size_t)st->plan.nkernels + 1, sizeof *st->kernels)) != NULL;
    for (int i = 0; ok && i < st->plan.nkernels; i++) {
        if (st->plan.kernels[i].nbufs == 0) continue; /* a dead group */
        char name[32];
        kernel_name(i, name, sizeof name);
        ok = load_cached(env, &st->plan.kernels[i].key, name, &st->kernels[i]) == EM_OK &&
             st->kernels[i];
    }
    if (!ok) {
        jit_logf(env->log, JIT_LOG_CACHE, "graph plan %s unusable (bad or kernels missing): compiling", hex);
        drop_kernels(st);
        em_clear_error();
        return false;
    }
    env->loaded += count_kernels(st);
    env->plans_loaded++;
    jit_logf(env->log, JIT_LOG_CACHE, "cache hit: graph plan (%s), %d kernels", hex, count_kernels(st));
    return true;
}

static void store_plan(jit_env *env, const kc_key *gkey, jit_plan *p) {
    size_t n;
    p->key = *gkey; /* the plan carries the key it is filed under */
    char *text = jit_plan_format(p, &n);
    if (text && kc_put(env->cache, gkey, "plan", text, n) == EM_OK) {
        char hex[KC_KEY_HEX_SIZE];
        kc_key_hex(gkey, hex);
        jit_logf(env->log, JIT_LOG_CACHE, "cache write: graph plan (%s)", hex);
        env->plans_stored++;
    }
    em_free(text);
    em_clear_error(); /* a plan not stored only costs the next process a compile */
}

/* The static compile: plan from the cache, else build (and store the plan). */
static em_status compile_static(const tr_graph *g, jit_env *env, cpu_state *st) {
    kc_key gkey;
    bool keyed = env->cache && jit_graph_key(g, "cpu", jit_cpu_target(), &gkey);
    if (keyed && load_plan(env, g, &gkey, st)) return EM_OK;
    em_status s = build(g, env, st);
    if (s == EM_ERR_NOMEM) return s;
    if (s != EM_OK) run_op_by_op(st, env);
    else if (keyed) store_plan(env, &gkey, &st->plan);
    return EM_OK;
}

static em_status cpu_compile(const tr_graph *g, jit_env *env, void **state) {
    cpu_state *st = em_calloc(1, sizeof *st);
    if (!st) return em_last_status();
    *state = st;
    return compile_static(g, env, st);
}

static em_status cpu_run(void *state, const tr_graph *g, em_tensor *const *in, em_tensor **out);
static em_status run_plan(const cpu_state *st, const tr_graph *g, const cpu_spec *sp,
                          em_tensor *const *in, em_tensor **out);

/* ---- dynamic shapes ----
 * The graph is scheduled and lowered twice, for the traced sizes and for
 * the probe sizes (jit_dyn_check's).  When both give the same steps, the
 * same buffers and kernels that differ only in i64 constants, those
 * constants become size parameters (kir_parametrize) and the kernels are
 * compiled once.  For each new set of sizes, specialize infers the metas
 * again, schedules and lowers again (microseconds, no code generation) and
 * requires the very same kernels up to those constants (kir_match), whose
 * values are the size arguments: a kernel never runs with sizes it was not
 * checked for. */

/* g at the sizes of inputs (one meta per input): *out shares g's inputs
 * lists, but has nodes of its own (em_free out->nodes) whose attribute
 * sizes follow (jit_dyn_infer) and whose metas are inferred into metas.
 * false: the shapes do not infer (error cleared) or out of memory. */
static bool at_sizes(const tr_graph *g, const jit_dyn *follow, const em_meta *inputs,
                     em_meta *metas, tr_graph *out) {
    *out = *g;
    out->nodes = em_malloc(sizeof *out->nodes * ((size_t)g->nnodes + 1));
    if (!out->nodes) return false;
    memcpy(out->nodes, g->nodes, sizeof *out->nodes * (size_t)g->nnodes);
    if (jit_dyn_infer(follow, out, inputs, metas) != EM_OK) {
        em_clear_error();
        return false;
    }
    for (int i = 0; i < g->nnodes; i++) out->nodes[i].meta = metas[i];
    return true;
}

static bool same_steps(const sc_schedule *a, const jit_plan *p) {
    if (a->nsteps != p->nsteps || a->ngroups != p->nkernels) return false;
    for (int i = 0; i < a->nsteps; i++) {
        const sc_step *x = &a->steps[i], *y = &p->steps[i];
        if (x->kind != y->kind || (x->kind == SC_KERNEL ? x->group != y->group : x->node != y->node))
            return false;
    }
    return true;
}

/* Lowers group gi of sched; NULL unless its buffers are the plan kernel pk's. */
static k_kernel *lower_like(const sc_schedule *sched, int gi, const jit_plan_kernel *pk, int *bufs) {
    int nbufs, nouts;
    k_kernel *k = sc_lower(sched, gi, bufs, &nbufs, &nouts);
    if (k && (nbufs != pk->nbufs || nouts != pk->nouts ||
              memcmp(bufs, pk->bufs, sizeof(int) * (size_t)nbufs))) {
        kir_free(k);
        return NULL;
    }
    return k;
}

/* Lowers kernel gi at the traced sizes (sa) and the probe sizes (sp) and
 * makes its parametrized form, into ks[gi] and keys[gi]. */
static bool dynamic_kernel(cpu_state *st, const sc_schedule *sa, const sc_schedule *sp, int gi,
                           int *scratch, k_kernel **ks, kc_key *keys) {
    jit_plan_kernel *pk = &st->plan.kernels[gi];
    pk->bufs = em_malloc(sizeof(int) * ((size_t)sa->g->nnodes + 1));
    if (!pk->bufs) return false;
    k_kernel *ka = st->model[gi] = sc_lower(sa, gi, pk->bufs, &pk->nbufs, &pk->nouts);
    k_kernel *kp = ka ? lower_like(sp, gi, pk, scratch) : NULL;
    bool *vary = ka ? em_calloc((size_t)ka->n + 1, sizeof(bool)) : NULL;
    st->size_of[gi] = ka ? em_malloc(sizeof(int) * ((size_t)ka->n + 1)) : NULL;
    bool ok = kp && vary && st->size_of[gi] && kir_vary(ka, kp, vary) &&
              (ks[gi] = kir_parametrize(ka, vary, st->size_of[gi])) &&
              kir_verify(ks[gi]) == EM_OK && kernel_key(ks[gi], &keys[gi]);
    if (ok) pk->key = keys[gi];
    kir_free(kp);
    em_free(vary);
    return ok;
}

/* Schedules g at the traced and at the probe sizes and compiles the
 * parametrized kernels; EM_ERR_UNSUPPORTED, with why, when the two differ
 * in more than sizes. */
static em_status build_dynamic(const tr_graph *g, const jit_dyn *dyn, jit_env *env,
                               cpu_state *st, char *why, size_t nwhy) {
    em_meta *metas = em_malloc(sizeof *metas * ((size_t)g->nnodes + 1));
    tr_graph gp = {0};
    sc_schedule *sa = NULL, *sp = NULL;
    k_kernel **ks = NULL;
    kc_key *keys = NULL;
    int *scratch = em_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    em_status s = metas && scratch ? EM_OK : em_last_status();
    if (s == EM_OK && !at_sizes(g, dyn, dyn->probe, metas, &gp)) {
        snprintf(why, nwhy, "the shapes do not infer at other sizes");
        s = em_last_status() == EM_ERR_NOMEM ? EM_ERR_NOMEM : EM_ERR_UNSUPPORTED;
    }
    if (s == EM_OK && (!(sa = sc_build(g)) || !(sp = sc_build(&gp)))) s = em_last_status();
    jit_plan *p = &st->plan;
    int n = sa ? sa->ngroups : 0;
    if (s == EM_OK) {
        p->steps = em_calloc((size_t)sa->nsteps + 1, sizeof *p->steps);
        p->kernels = em_calloc((size_t)n + 1, sizeof *p->kernels);
        st->kernels = em_calloc((size_t)n + 1, sizeof *st->kernels);
        st->model = em_calloc((size_t)n + 1, sizeof *st->model);
        st->size_of = em_calloc((size_t)n + 1, sizeof *st->size_of);
        ks = em_calloc((size_t)n + 1, sizeof *ks);
        keys = em_calloc((size_t)n + 1, sizeof *keys);
        s = p->steps && p->kernels && st->kernels && st->model && st->size_of && ks && keys
                ? EM_OK : em_last_status();
    }
    if (s == EM_OK) {
        p->nkernels = n;
        p->nsteps = sa->nsteps;
        em_copy_bytes(p->steps, sa->steps, sizeof *p->steps * (size_t)sa->nsteps);
        if (!same_steps(sp, p)) {
            snprintf(why, nwhy, "fusion differs at other sizes");
            s = EM_ERR_UNSUPPORTED;
        }
    }
    for (int gi = 0; gi < n && s == EM_OK; gi++) {
        if (!group_has_step(sa, gi)) continue;
        if (dynamic_kernel(st, sa, sp, gi, scratch, ks, keys)) {
            log_kernel(env, ks[gi]);
            continue;
        }
        s = em_last_status() == EM_ERR_NOMEM ? EM_ERR_NOMEM : EM_ERR_UNSUPPORTED;
        snprintf(why, nwhy, "kernel k%d differs at other sizes in more than its sizes", gi);
    }
    if (s == EM_OK) s = get_kernels(env, ks, keys, n, st->kernels);
    for (int gi = 0; ks && gi < n; gi++) kir_free(ks[gi]);
    em_free(ks);
    em_free(keys);
    sc_free(sa);
    sc_free(sp);
    em_free(gp.nodes);
    em_free(metas);
    em_free(scratch);
    return s;
}

static em_status cpu_compile_dynamic(const tr_graph *g, const jit_dyn *dyn, jit_env *env,
                                     void **state, bool *dynamic, char *why, size_t nwhy) {
    cpu_state *st = em_calloc(1, sizeof *st);
    if (!st) return em_last_status();
    *state = st;
    why[0] = '\0';
    em_status s = build_dynamic(g, dyn, env, st, why, nwhy);
    *dynamic = st->dynamic = s == EM_OK;
    if (s == EM_OK) {
        memcpy(st->follow.sizes, dyn->sizes, sizeof dyn->sizes);
        st->follow.nsizes = dyn->nsizes;
    }
    if (s == EM_OK || s == EM_ERR_NOMEM) return s;
    if (!why[0]) snprintf(why, nwhy, "%s", em_last_error());
    drop_kernels(st);
    em_clear_error();
    return compile_static(g, env, st);
}

static bool same_inputs(const em_meta *a, em_tensor *const *in, int n) {
    for (int i = 0; i < n; i++) {
        const em_tensor *t = in[i];
        if (a[i].ndim != t->ndim || memcmp(a[i].sizes, t->sizes, sizeof(int64_t) * (size_t)t->ndim) ||
            memcmp(a[i].strides, t->strides, sizeof(int64_t) * (size_t)t->ndim))
            return false;
    }
    return true;
}

/* Kernel gi at the sizes of sx, checked against the model; its size
 * arguments into *sizes (em_malloc'd). */
static bool kernel_sizes(const cpu_state *st, const sc_schedule *sx, int gi, int *scratch,
                         int64_t **sizes) {
    const k_kernel *m = st->model[gi];
    int nsizes = 0;
    for (int i = 0; i < m->n; i++) nsizes += st->size_of[gi][i] >= 0;
    k_kernel *kx = lower_like(sx, gi, &st->plan.kernels[gi], scratch);
    *sizes = em_malloc(sizeof(int64_t) * ((size_t)nsizes + 1));
    bool ok = kx && *sizes && kir_match(m, kx, st->size_of[gi], *sizes);
    kir_free(kx);
    return ok;
}

/* A new spec for inputs in, or NULL when these sizes need another entry. */
static cpu_spec *make_spec(const cpu_state *st, const tr_graph *g, em_tensor *const *in) {
    cpu_spec *sp = em_calloc(1, sizeof *sp);
    if (sp) sp->alloc = em_get_allocator();
    tr_graph gx = {0};
    sc_schedule *sx = NULL;
    int *scratch = em_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    bool ok = sp && scratch && (sp->in = em_malloc(sizeof *sp->in * ((size_t)g->ninputs + 1))) &&
              (sp->metas = em_malloc(sizeof *sp->metas * ((size_t)g->nnodes + 1))) &&
              (sp->sizes = em_calloc((size_t)st->plan.nkernels + 1, sizeof *sp->sizes));
    for (int i = 0; ok && i < g->ninputs; i++) tr_meta_of(in[i], &sp->in[i]);
    ok = ok && at_sizes(g, &st->follow, sp->in, sp->metas, &gx);
    if (sp) sp->nodes = gx.nodes; /* the spec owns them from here */
    ok = ok && (sx = sc_build(&gx)) && same_steps(sx, &st->plan);
    for (int gi = 0; ok && gi < st->plan.nkernels; gi++)
        if (st->model[gi]) ok = kernel_sizes(st, sx, gi, scratch, &sp->sizes[gi]);
    sc_free(sx);
    if (!sp) em_free(gx.nodes);
    em_free(scratch);
    if (!ok) {
        em_clear_error(); /* not an error: the call gets an entry of its own */
        spec_free(st, sp);
        return NULL;
    }
    return sp;
}

static bool cpu_specialize(void *state, const tr_graph *g, em_tensor *const *in, void **spec) {
    cpu_state *st = state;
    *spec = NULL;
    if (!st->dynamic) return true;
    for (int i = 0; i < st->nmemo; i++) {
        if (same_inputs(st->memo[i]->in, in, g->ninputs)) {
            *spec = st->memo[i];
            return true;
        }
    }
    cpu_spec *sp = make_spec(st, g, in);
    if (!sp) return false;
    if (st->nmemo < SPEC_MEMO) st->memo[st->nmemo++] = sp;
    else sp->owned = true;
    *spec = sp;
    return true;
}

static em_status cpu_run_dynamic(void *state, void *spec, const tr_graph *g, em_tensor *const *in,
                                 em_tensor **out) {
    cpu_state *st = state;
    cpu_spec *sp = spec;
    if (!sp) return cpu_run(state, g, in, out);
    em_status s = run_plan(st, g, sp, in, out);
    if (sp->owned) spec_free(st, sp);
    return s;
}

static em_status run_kernel(const tr_graph *g, const em_meta *metas, const jit_plan_kernel *pk,
                            const jit_cpu_kernel *kernel, const int64_t *sizes, em_tensor **vals) {
    void *stack[16], **ptrs = pk->nbufs <= 16 ? stack : em_malloc(sizeof(void *) * (size_t)pk->nbufs);
    if (!ptrs) return em_last_status();
    em_status s = EM_OK;
    for (int b = 0; b < pk->nbufs && s == EM_OK; b++) {
        int v = pk->bufs[b];
        if (b >= pk->nbufs - pk->nouts) {
            vals[v] = em_tensor_alloc(metas ? &metas[v] : &g->nodes[v].meta);
            if (!vals[v]) s = em_last_status();
        } else if (!vals[v]) {
            s = em_error(EM_ERR_STATE, "cpu backend: kernel input %%%d is not computed yet", v);
        }
        if (s == EM_OK) ptrs[b] = em_data(vals[v]);
    }
    if (s == EM_OK) s = jit_cpu_run(kernel, ptrs, sizes);
    if (ptrs != stack) em_free(ptrs);
    return s;
}

/* The node a non-kernel step runs (its attributes and sizes those of sp
 * when given). */
static const tr_node *step_node(const tr_graph *g, const cpu_spec *sp, const sc_step *step) {
    return sp ? &sp->nodes[step->node] : &g->nodes[step->node];
}

/* The last step that reads or writes each node's value; graph outputs get
 * nsteps (never freed).  run_plan frees an intermediate after its last
 * step, as eager code's scopes do: holding every value until the end made
 * a whole-model graph (lazy mode makes those) take several times eager
 * mode's memory, and the fresh pages (page faults, zeroing) cost more than
 * fusion saved (MiniLM under EMBER_JIT=1). */
static int *last_steps(const cpu_state *st, const tr_graph *g, const cpu_spec *sp) {
    int *last = em_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    if (!last) return NULL;
    for (int v = 0; v < g->nnodes; v++) last[v] = -1;
    for (int i = 0; i < st->plan.nsteps; i++) {
        const sc_step *step = &st->plan.steps[i];
        if (step->kind == SC_KERNEL) {
            const jit_plan_kernel *pk = &st->plan.kernels[step->group];
            for (int b = 0; b < pk->nbufs; b++) last[pk->bufs[b]] = i;
            continue;
        }
        const tr_node *n = step_node(g, sp, step);
        for (int k = 0; k < n->nin; k++) last[n->in[k]] = i;
        last[step->node] = i;
    }
    for (int o = 0; o < g->noutputs; o++) last[g->outputs[o]] = st->plan.nsteps;
    return last;
}

/* Frees node v's value if step i was its last and run_plan's scope (depth)
 * made it (inputs and constants belong to others). */
static void free_if_done(em_tensor **vals, const int *last, int v, int i, int depth) {
    if (last[v] == i && vals[v] && vals[v]->scope == depth) {
        em_tensor_discard(vals[v]);
        vals[v] = NULL;
    }
}

/* Frees the values step i used up. */
static void free_used(const cpu_state *st, const tr_graph *g, const cpu_spec *sp, em_tensor **vals,
                      const int *last, int i, int depth) {
    const sc_step *step = &st->plan.steps[i];
    if (step->kind == SC_KERNEL) {
        const jit_plan_kernel *pk = &st->plan.kernels[step->group];
        for (int b = 0; b < pk->nbufs; b++) free_if_done(vals, last, pk->bufs[b], i, depth);
        return;
    }
    const tr_node *n = step_node(g, sp, step);
    for (int k = 0; k < n->nin; k++) free_if_done(vals, last, n->in[k], i, depth);
    free_if_done(vals, last, step->node, i, depth);
}

/* Runs the plan, for the sizes of sp (NULL: static, the graph as
 * recorded): its nodes' metas and attributes, its kernels' size
 * arguments. */
static em_status run_plan(const cpu_state *st, const tr_graph *g, const cpu_spec *sp,
                          em_tensor *const *in, em_tensor **out) {
    const em_meta *metas = sp ? sp->metas : NULL;
    int64_t *const *sizes = sp ? sp->sizes : NULL;
    em_tensor **vals = em_calloc((size_t)g->nnodes + 1, sizeof *vals);
    int *last = vals ? last_steps(st, g, sp) : NULL;
    if (!last) {
        em_free(vals);
        return em_last_status();
    }
    em_status s = EM_OK;
    int depth = em_scope_begin();
    for (int i = 0; i < g->nnodes; i++) {
        const tr_node *n = &g->nodes[i];
        if (n->kind == TR_INPUT) vals[i] = in[n->index];
        else if (n->kind == TR_CONST) vals[i] = g->consts[n->index];
    }
    for (int i = 0; i < st->plan.nsteps && s == EM_OK; i++) {
        const sc_step *step = &st->plan.steps[i];
        if (step->kind == SC_KERNEL) {
            s = run_kernel(g, metas, &st->plan.kernels[step->group], st->kernels[step->group],
                           sizes ? sizes[step->group] : NULL, vals);
        } else {
            const tr_node *n = step_node(g, sp, step);
            for (int k = 0; k < n->nin && s == EM_OK; k++)
                if (!vals[n->in[k]])
                    s = em_error(EM_ERR_STATE, "cpu backend: input %%%d of %%%d is not computed yet",
                                 n->in[k], step->node);
            if (s == EM_OK) vals[step->node] = jit_replay_node(n, vals);
            if (s == EM_OK && !vals[step->node]) s = em_last_status() ? em_last_status() : EM_ERR_STATE;
        }
        if (s == EM_OK) free_used(st, g, sp, vals, last, i, depth);
    }
    for (int i = 0; i < g->noutputs; i++) {
        em_tensor *v = vals[g->outputs[i]];
        if (s == EM_OK && !v) s = em_error(EM_ERR_STATE, "cpu backend: output %d was not computed", i);
        out[i] = s == EM_OK ? em_keep(v) : NULL;
    }
    em_scope_end();
    em_free(last);
    em_free(vals);
    return s;
}

static em_status cpu_run(void *state, const tr_graph *g, em_tensor *const *in, em_tensor **out) {
    cpu_state *st = state;
    if (!st->kernels) return jit_replay_backend.run(NULL, g, in, out);
    return run_plan(st, g, NULL, in, out);
}

static void cpu_free(void *state) { state_free(state); }

static int cpu_kernels(const void *state) { return count_kernels(state); }

const jit_backend jit_cpu_backend = {
    .name = "cpu",
    .compile = cpu_compile,
    .run = cpu_run,
    .free = cpu_free,
    .kernels = cpu_kernels,
    .target = jit_cpu_target,
    .compile_dynamic = cpu_compile_dynamic,
    .specialize = cpu_specialize,
    .run_dynamic = cpu_run_dynamic,
};
