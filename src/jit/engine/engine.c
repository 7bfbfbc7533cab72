/* engine.c - compiling a graph for a device (engine.h): the plan from the
 * plan cache, else schedule (sched/schedule.c) -> lower each group
 * (sched/lower.c) -> the kernels (kernels.c) -> the plan stored; and the
 * dynamic-shape form, whose kernels take sizes as parameters.
 *
 * A graph any of whose groups cannot be lowered or compiled, or with
 * tensors off the device, runs op by op with the eager ops, with the
 * reason logged under EMBER_LOG=code... never a wrong result. */
#include "engine-impl.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- state ---- */

void jit_spec_free(const jit_compiled *st, jit_spec *sp) {
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

static void drop_dynamic(jit_compiled *st) {
    for (int i = 0; i < st->nmemo; i++) jit_spec_free(st, st->memo[i]);
    st->nmemo = 0;
    for (int i = 0; st->model && i < st->plan.nkernels; i++) kir_free(st->model[i]);
    for (int i = 0; st->size_of && i < st->plan.nkernels; i++) em_free(st->size_of[i]);
    em_free(st->model);
    em_free(st->size_of);
    em_free(st->vary);
    st->model = NULL;
    st->size_of = NULL;
    st->vary = NULL;
    st->dynamic = false;
}

static void drop_kernels(jit_compiled *st) {
    drop_dynamic(st);
    for (int i = 0; st->dev->unload && st->kernels && i < st->plan.nkernels; i++)
        if (st->kernels[i] && !(st->alias && st->alias[i])) st->dev->unload(st->kernels[i]);
    em_free(st->kernels);
    em_free(st->alias);
    st->kernels = NULL;
    st->alias = NULL;
    jit_exec_unprepare(st);
    jit_plan_clear(&st->plan);
}

void jit_engine_free(jit_compiled *st) {
    if (!st) return;
    const em_allocator *caller = em_get_allocator();
    em_set_allocator(st->alloc);
    jit_graphs_free(st);
    pthread_mutex_destroy(&st->graph_lock);
    drop_kernels(st);
    tr_graph_free(st->graph);
    em_free(st);
    em_set_allocator(caller);
}

int jit_engine_kernels(const jit_compiled *st) {
    int n = 0;
    for (int i = 0; st && st->kernels && i < st->plan.nkernels; i++) n += st->kernels[i] != NULL;
    return n;
}

static jit_compiled *state_new(const jit_device *d) {
    jit_compiled *st = em_calloc(1, sizeof *st);
    if (!st) return NULL;
    st->dev = d;
    st->alloc = em_get_allocator();
    if (pthread_mutex_init(&st->graph_lock, NULL) != 0) {
        em_free(st);
        em_error(EM_ERR_NOMEM, "%s: cannot make a compiled graph's lock", d->name);
        return NULL;
    }
    return st;
}

/* Drops the kernels: the graph then runs op by op, correct but slower. */
static void run_op_by_op(jit_compiled *st, const jit_env *env) {
    jit_logf(env->log, JIT_LOG_CODE, "graph runs op by op: %s", em_last_error());
    drop_kernels(st);
    em_clear_error();
}

/* The index of the device every tensor of g lives on, or -1 (error set):
 * the graph then runs op by op, the ops know where their tensors are. */
static int graph_device(const jit_device *d, const tr_graph *g) {
    int index = -1;
    for (int i = 0; i < g->nnodes; i++) {
        em_device dv = g->nodes[i].meta.device;
        if (dv.type != d->type) {
            em_error(EM_ERR_DEVICE, "%s backend: node %d is on another device", d->name, i);
            return -1;
        }
        if (index >= 0 && dv.index != index) {
            em_error(EM_ERR_DEVICE, "%s backend: the graph spans two devices", d->name);
            return -1;
        }
        index = dv.index;
    }
    return index < 0 ? 0 : index;
}

static void log_kernel(const jit_env *env, const jit_device *d, const k_kernel *k) {
    if (!env->log || !(env->log->flags & JIT_LOG_CODE)) return;
    jit_logf(env->log, JIT_LOG_CODE, "%s kernel %s:", d->name, k->name);
    kir_print(k, env->log->f);
}

/* ---- the plan's steps ---- */

/* The schedule's steps as the device runs them: a group the device runs
 * better with its eager op becomes that node's eager step.  steps has
 * room for s->nsteps. */
static void device_steps(const jit_compiled *st, const sc_schedule *s, sc_step *steps) {
    for (int i = 0; i < s->nsteps; i++) {
        steps[i] = s->steps[i];
        int node = steps[i].kind == SC_KERNEL && st->dev->prefer_eager
                       ? st->dev->prefer_eager(st->index, s, steps[i].group) : -1;
        if (node >= 0) steps[i] = (sc_step){.kind = SC_EAGER, .node = node};
    }
}

/* Per plan kernel, whether a step runs it (the others are dead or run
 * eagerly: nothing to compile); NULL when out of memory.  One pass over
 * the steps: asking each kernel's question of every step was O(kernels x
 * steps), 4 million step reads for the 2,001 kernels of a 100k-node graph. */
static bool *groups_with_steps(const jit_plan *p) {
    bool *has = em_calloc((size_t)p->nkernels + 1, sizeof *has);
    for (int i = 0; has && i < p->nsteps; i++)
        if (p->steps[i].kind == SC_KERNEL) has[p->steps[i].group] = true;
    return has;
}

/* Whether s, run on st's device, has the steps of st's plan. */
static bool same_steps(const jit_compiled *st, const sc_schedule *s) {
    const jit_plan *p = &st->plan;
    if (s->nsteps != p->nsteps || s->ngroups != p->nkernels) return false;
    sc_step *steps = em_calloc((size_t)s->nsteps + 1, sizeof *steps);
    bool ok = steps != NULL;
    if (ok) device_steps(st, s, steps);
    for (int i = 0; ok && i < s->nsteps; i++) {
        const sc_step *x = &steps[i], *y = &p->steps[i];
        ok = x->kind == y->kind && (x->kind == SC_KERNEL ? x->group == y->group : x->node == y->node);
    }
    em_free(steps);
    return ok;
}

/* The plan's steps and (empty) kernels for schedule s. */
static em_status plan_init(jit_compiled *st, const sc_schedule *s) {
    jit_plan *p = &st->plan;
    int n = s->ngroups;
    p->steps = em_calloc((size_t)s->nsteps + 1, sizeof *p->steps);
    p->kernels = em_calloc((size_t)n + 1, sizeof *p->kernels);
    st->kernels = em_calloc((size_t)n + 1, sizeof *st->kernels);
    if (!p->steps || !p->kernels || !st->kernels) return em_last_status();
    p->nkernels = n;
    p->nsteps = s->nsteps;
    device_steps(st, s, p->steps);
    return EM_OK;
}

/* Lowers group gi of s; NULL unless its buffers are the plan kernel pk's. */
static k_kernel *lower_like(const sc_schedule *s, int gi, const jit_plan_kernel *pk, int *bufs) {
    int nbufs, nouts;
    k_kernel *k = sc_lower(s, gi, bufs, &nbufs, &nouts);
    if (k && (nbufs != pk->nbufs || nouts != pk->nouts ||
              memcmp(bufs, pk->bufs, sizeof(int) * (size_t)nbufs))) {
        kir_free(k);
        return NULL;
    }
    return k;
}

/* Lowers group gi of s, its buffer list into pk in an array of its own
 * length (scratch: room for every node of the graph, reused: one such
 * array per kernel would be kernels x nodes, 800 MB at 100k nodes). */
static k_kernel *lower_into(const sc_schedule *s, int gi, jit_plan_kernel *pk, int *scratch) {
    k_kernel *k = sc_lower(s, gi, scratch, &pk->nbufs, &pk->nouts);
    if (!k) return NULL;
    if (!(pk->bufs = em_malloc(sizeof(int) * ((size_t)pk->nbufs + 1)))) {
        kir_free(k);
        return NULL;
    }
    memcpy(pk->bufs, scratch, sizeof(int) * (size_t)pk->nbufs);
    return k;
}

/* ---- identical kernels share one loaded kernel ----
 * A periodic graph (a model's repeated layers, a long chain) has many
 * kernels with the same key.  The kernel cache sequence compiles such a
 * kernel once, but loaded each occurrence again: one shared object per
 * plan kernel, 2,001 copies of 4 kernels' code for the mixed chain of
 * 100k nodes, each with its own mappings, and a call ran through all the
 * copies.  Loaded once and shared, a call runs the same code (a kernel has
 * no state: the device launches it with the buffers). */

/* For each of the n plan kernels used (use[i]), the first used one with
 * its key (itself when none before it has that key); NULL when out of
 * memory.  A hash table on the key: linear in n. */
static int *first_of_keys(const kc_key *keys, const bool *use, int n) {
    int cap = 16;
    while (cap < 2 * n) cap *= 2;
    int *table = em_malloc(sizeof(int) * (size_t)cap), *first = em_malloc(sizeof(int) * ((size_t)n + 1));
    if (!table || !first) {
        em_free(table), em_free(first);
        em_clear_error(); /* not shared: each loaded, as before */
        return NULL;
    }
    memset(table, -1, sizeof(int) * (size_t)cap);
    for (int i = 0; i < n; i++) {
        first[i] = i;
        if (!use[i]) continue;
        uint64_t h;
        memcpy(&h, keys[i].bytes, sizeof h);
        for (size_t t = (size_t)(h & (uint64_t)(cap - 1));; t = (t + 1) & (size_t)(cap - 1)) {
            if (table[t] < 0) {
                table[t] = i;
                break;
            }
            if (kc_key_equal(&keys[table[t]], &keys[i])) {
                first[i] = table[t];
                break;
            }
        }
    }
    em_free(table);
    return first;
}

/* Whether st's kernels may be shared: they are loaded in this process
 * (not a named target's or a dry run's lookups), and the cache sequence
 * compiles identical kernels once (with a cache or a device table). */
static bool may_share(const jit_compiled *st, const jit_env *env) {
    return (env->cache || st->dev->find) && !env->target && !env->dry_run;
}

/* Gives each later used plan kernel with an earlier one's key (first)
 * that kernel; false when out of memory (nothing shared). */
static bool share_kernels(jit_compiled *st, const int *first, const bool *use) {
    int n = st->plan.nkernels;
    if (!(st->alias = em_calloc((size_t)n + 1, sizeof *st->alias))) return false;
    for (int i = 0; i < n; i++) {
        if (!use[i] || first[i] == i) continue;
        st->kernels[i] = st->kernels[first[i]];
        st->alias[i] = true;
    }
    return true;
}

/* The shared kernels counted and logged as the lookups that found them
 * loaded again were (the cache sequence's second lookup of a duplicate). */
static void note_shared(const jit_compiled *st, jit_env *env, const kc_key *keys) {
    for (int i = 0; i < st->plan.nkernels; i++) {
        if (!st->alias[i]) continue;
        env->loaded++;
        char hex[KC_KEY_HEX_SIZE];
        kc_key_hex(&keys[i], hex);
        jit_logf(env->log, JIT_LOG_CACHE, "cache hit: kernel %s (%s)", JIT_KERNEL_NAME, hex);
    }
}

/* Compiles the kernels ks (by plan kernel) into st, after the plan's abi
 * of each is set; identical ones once, shared (above). */
static em_status get_kernels(jit_compiled *st, const tr_graph *g, jit_env *env, k_kernel **ks,
                             const kc_key *keys, const jit_params *params) {
    int n = st->plan.nkernels;
    bool *use = em_calloc((size_t)n + 1, sizeof *use);
    if (!use) return em_last_status();
    for (int gi = 0; gi < n; gi++) {
        use[gi] = ks[gi] != NULL;
        if (ks[gi]) jit_plan_abi(g, &st->plan.kernels[gi], &st->plan.kernels[gi].abi);
    }
    int *first = may_share(st, env) ? first_of_keys(keys, use, n) : NULL;
    k_kernel **once = first ? em_calloc((size_t)n + 1, sizeof *once) : NULL;
    if (first && !once) em_clear_error(); /* out of memory: each kernel on its own, as before */
    for (int gi = 0; once && gi < n; gi++) once[gi] = first[gi] == gi ? ks[gi] : NULL;
    em_status s = jit_get_kernels_with(st->dev, st->index, env, once ? once : ks, keys, params, n,
                                       st->kernels);
    if (s == EM_OK && once && !share_kernels(st, first, use)) s = em_last_status();
    if (s == EM_OK && once) note_shared(st, env, keys);
    if (s == EM_OK) jit_exec_prepare(st, g);
    em_free(once);
    em_free(first);
    em_free(use);
    return s;
}

/* Schedules, lowers and compiles g into st's plan and kernels. */
static em_status build(jit_compiled *st, const tr_graph *g, jit_env *env, const char *target) {
    sc_schedule *sched = sc_build_for(g, st->dev->half_kernels);
    if (!sched) return em_last_status();
    env->lowered++;
    em_status s = plan_init(st, sched);
    int n = sched->ngroups;
    k_kernel **ks = em_calloc((size_t)n + 1, sizeof *ks);
    kc_key *keys = em_calloc((size_t)n + 1, sizeof *keys);
    int *scratch = em_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    bool *has = s == EM_OK ? groups_with_steps(&st->plan) : NULL;
    if (s == EM_OK && (!ks || !keys || !scratch || !has)) s = em_last_status();
    for (int gi = 0; gi < n && s == EM_OK; gi++) {
        jit_plan_kernel *pk = &st->plan.kernels[gi];
        if (!has[gi]) continue; /* dead, or run eagerly: nothing to compile */
        ks[gi] = lower_into(sched, gi, pk, scratch);
        if (!ks[gi] || !st->dev->key(ks[gi], target, &pk->key, NULL))
            s = em_last_status() ? em_last_status() : EM_ERR_UNSUPPORTED;
        else
            log_kernel(env, st->dev, ks[gi]);
        if (ks[gi]) keys[gi] = pk->key;
    }
    /* the tuned kernels' keys replace their plain ones, in the plan too;
     * identical kernels get identical choices, so they still share */
    jit_params *params = s == EM_OK && jit_tune_on(st->dev, st->index, env)
                             ? em_calloc((size_t)n + 1, sizeof *params) : NULL;
    if (params) s = jit_tune_kernels(st->dev, st->index, env, g, &st->plan, ks, keys, params);
    if (s == EM_OK) s = get_kernels(st, g, env, ks, keys, params);
    for (int gi = 0; ks && gi < n; gi++) kir_free(ks[gi]);
    em_free(params);
    em_free(ks);
    em_free(keys);
    em_free(scratch);
    em_free(has);
    sc_free(sched);
    return s;
}

/* ---- the plan cache ---- */

/* Loads g's plan and every kernel it names; false (st empty) on any miss.
 * The plan is checked against g (jit_plan_check), and each artifact
 * against its key, so nothing is scheduled or lowered. */
static bool load_plan(jit_compiled *st, const tr_graph *g, jit_env *env, const kc_key *gkey,
                      const kc_manifest *why) {
    void *text = NULL;
    size_t n = 0;
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(gkey, hex);
    if (kc_get(env->cache, gkey, "plan", &text, &n) != EM_OK || !text) {
        em_clear_error();
        if (why->n > 0) jit_explain_miss(env, "graph plan", why, "plan");
        else jit_logf(env->log, JIT_LOG_CACHE, "cache miss: graph plan (%s)", hex);
        return false;
    }
    bool ok = jit_plan_parse(text, n, g, gkey, &st->plan) && jit_plan_check(g, &st->plan);
    em_free(text);
    int nk_plan = st->plan.nkernels;
    kc_key *keys = ok ? em_calloc((size_t)nk_plan + 1, sizeof *keys) : NULL;
    bool *live = ok ? em_calloc((size_t)nk_plan + 1, sizeof *live) : NULL;
    bool *once = ok ? em_calloc((size_t)nk_plan + 1, sizeof *once) : NULL;
    ok = ok && keys && live && once && (st->kernels = em_calloc((size_t)nk_plan + 1, sizeof *st->kernels));
    for (int i = 0; ok && i < nk_plan; i++) {
        keys[i] = st->plan.kernels[i].key;
        live[i] = st->plan.kernels[i].nbufs > 0;
    }
    /* identical kernels loaded once and shared (get_kernels says why) */
    int *first = ok && may_share(st, env) ? first_of_keys(keys, live, nk_plan) : NULL;
    for (int i = 0; ok && i < nk_plan; i++) once[i] = live[i] && (!first || first[i] == i);
    ok = ok && jit_load_kernels(st->dev, st->index, env, keys, once, nk_plan, st->kernels);
    if (ok && first) ok = share_kernels(st, first, live);
    int nk = 0;
    for (int i = 0; ok && i < nk_plan; i++) nk += live[i];
    em_free(first);
    em_free(once);
    em_free(keys);
    em_free(live);
    if (!ok) {
        jit_logf(env->log, JIT_LOG_CACHE, "graph plan %s unusable (bad or kernels missing): compiling", hex);
        env->plans_unusable += env->dry_run;
        if (env->dry_run && env->explain) /* the kernels' lookups below say which are missing */
            fprintf(env->explain, "graph plan (%s): in the cache, but bad or some of its kernels "
                    "are missing\n", hex);
        drop_kernels(st);
        em_clear_error();
        return false;
    }
    jit_exec_prepare(st, g);
    env->loaded += nk;
    env->plans_loaded++;
    jit_logf(env->log, JIT_LOG_CACHE, "cache hit: graph plan (%s), %d kernels", hex, nk);
    return true;
}

/* Stores p under gkey, and beside it its key's manifest why. */
static void store_plan(jit_env *env, const kc_key *gkey, const kc_manifest *why, jit_plan *p) {
    size_t n;
    p->key = *gkey; /* the plan carries the key it is filed under */
    char *text = jit_plan_format(p, &n);
    if (text && kc_put(env->cache, gkey, "plan", text, n) == EM_OK) {
        char hex[KC_KEY_HEX_SIZE];
        kc_key_hex(gkey, hex);
        jit_logf(env->log, JIT_LOG_CACHE, "cache write: graph plan (%s)", hex);
        env->plans_stored++;
        jit_store_manifest(env, why, "plan");
    }
    em_free(text);
    em_clear_error(); /* a plan not stored only costs the next process a compile */
}

/* Whether st's device adds bias b in the kernel of matmul m of g and
 * applies act (tr_linear_want). */
static bool device_takes_linear(void *ctx, const tr_graph *g, int m, int b, em_act act) {
    const jit_compiled *st = ctx;
    const tr_node *mm = &g->nodes[m];
    return st->dev->fuse_linear(st->index, &g->nodes[mm->in[0]].meta, &g->nodes[mm->in[1]].meta,
                                &g->nodes[b].meta, act);
}

/* What the device rewrites fused (fused_graph). */
typedef struct fused_counts {
    int attention, linear, split;
} fused_counts;

/* f (g with attention fused, or NULL: g) with each matmul's bias add
 * fused where the device takes it, for a static compile; NULL: nothing
 * fused or out of memory (unfused is still correct).  Takes f. */
static tr_graph *with_linear(const jit_compiled *st, const tr_graph *g, tr_graph *f, fused_counts *n) {
    if (!st->dev->fuse_linear) return f;
    tr_graph *l = tr_fuse_linear_map(f ? f : g, device_takes_linear, (void *)st, &n->linear, NULL);
    if (n->linear < 0) {
        em_clear_error();
        n->linear = 0;
    }
    if (!l) return f;
    tr_graph_free(f);
    return l;
}

/* The row length from which a reduction splits however many rows it has:
 * EMBER_SPLIT_LONG (0 or less: never), else the device's.  A value that
 * is not a number is logged and ignored. */
static int64_t split_long_of(const jit_compiled *st, const jit_env *env) {
    char buf[32], *end;
    const char *e = em_getenv("EMBER_SPLIT_LONG", buf, sizeof buf);
    if (!e || !*e) return st->dev->split_long;
    errno = 0;
    long long v = strtoll(e, &end, 10);
    if (*end || errno) {
        jit_logf(env->log, 0, "EMBER_SPLIT_LONG=%s is not a number of elements: using %lld", e,
                 (long long)st->dev->split_long);
        return st->dev->split_long;
    }
    return v;
}

/* f (or g, when f is NULL) with its few-row and long-row reductions
 * split where st's device asks (jit_device's split_rows and split_long,
 * EMBER_SPLIT_LONG); NULL: nothing split or out of memory (unsplit is
 * still correct).  Takes f.  map (dynamic compiles, else NULL): where g's
 * nodes are in f (or in g, f NULL) on entry, in the result on return; a
 * dynamic graph's reductions split over inner dims only (no view of the
 * traced sizes). */
static tr_graph *with_split(const jit_compiled *st, const tr_graph *g, tr_graph *f, int *map, fused_counts *n,
                            const jit_env *env) {
    char buf[32];
    const char *e = em_getenv("EMBER_SPLIT_REDUCTIONS", buf, sizeof buf);
    if (st->dev->split_rows <= 0 || (e && !strcmp(e, "0"))) return f;
    int64_t long_row = split_long_of(st, env);
    const tr_graph *from = f ? f : g;
    int *where = map ? em_malloc(sizeof(int) * ((size_t)from->nnodes + 1)) : NULL;
    tr_graph *s = map && !where ? NULL
                                : tr_split_reductions(from, st->dev->split_rows, long_row, !map, &n->split, where);
    if (n->split < 0) {
        em_clear_error();
        n->split = 0;
    }
    if (s && map)
        for (int i = 0; i < g->nnodes; i++) {
            int at = f ? map[i] : i;
            map[i] = at < 0 ? -1 : where[at];
        }
    em_free(where);
    if (!s) return f;
    tr_graph_free(f);
    return s;
}

/* tr_attention_takes over st's device (ctx: st). */
static bool device_takes(void *ctx, em_dtype dt, int64_t D, int64_t Dv) {
    const jit_compiled *st = ctx;
    return st->dev->fused_attention_takes(st->index, dt, D, Dv);
}

/* g with attention fused, when st's device runs the fused op and some
 * attention matched (map, when not NULL, gets where g's nodes went), and
 * with linear (static compiles: map NULL), or NULL: g as it is (also out
 * of memory: unfused is still correct). */
static tr_graph *fused_graph(const jit_compiled *st, const tr_graph *g, int *map, fused_counts *n,
                             const jit_env *env) {
    *n = (fused_counts){0, 0, 0};
    tr_graph *f = NULL;
    if (st->dev->fused_attention) {
        tr_attention_takes takes = st->dev->fused_attention_takes ? device_takes : NULL;
        f = tr_fuse_attention_for(g, takes, (void *)st, &n->attention, map);
        if (n->attention < 0) {
            em_clear_error();
            n->attention = 0;
        }
    }
    if (!map) f = with_linear(st, g, f, n);
    f = with_split(st, g, f, map, n, env);
    /* the rewrite is checked as every pass is (once per compile, linear in
     * the nodes): a graph it broke runs unfused, never wrong */
    if (f && tr_verify(f) != EM_OK) {
        jit_logf(env->log, JIT_LOG_CODE, "attention, linear or split rewrite rejected by the verifier: %s",
                 em_last_error());
        em_clear_error();
        tr_graph_free(f);
        return NULL;
    }
    return f;
}

/* Keeps f as the graph st runs, logged under EMBER_LOG=graph. */
static const tr_graph *keep_graph(jit_compiled *st, tr_graph *f, const fused_counts *n, const jit_env *env) {
    st->graph = f;
    if (n->linear > 0)
        jit_logf(env->log, JIT_LOG_GRAPH, "%s: %d linear layer%s (a matmul's bias add) fused", st->dev->name,
                 n->linear, n->linear == 1 ? "" : "s");
    if (n->split > 0)
        jit_logf(env->log, JIT_LOG_GRAPH, "%s: %d reduction%s split in two (few result rows)", st->dev->name,
                 n->split, n->split == 1 ? "" : "s");
    jit_logf(env->log, JIT_LOG_GRAPH, "%s: %d attention pattern%s fused:", st->dev->name, n->attention,
             n->attention == 1 ? "" : "s");
    if (env->log && (env->log->flags & JIT_LOG_GRAPH)) tr_print(f, env->log->f);
    return f;
}

/* The graph st's device runs for g: st->graph when a rewrite made one,
 * else g fused for the device (fused_graph), else g. */
static const tr_graph *device_graph(jit_compiled *st, const tr_graph *g, const jit_env *env) {
    if (st->graph) return st->graph;
    fused_counts n;
    tr_graph *f = fused_graph(st, g, NULL, &n, env);
    return f ? keep_graph(st, f, &n, env) : g;
}

/* The same for a dynamic compile, whose attribute sizes (dyn) name g's
 * nodes: they are renumbered into *fd for the fused graph.  A size of a
 * node the rewrite removed may only be an arange's (the causal mask,
 * which the fused node's causal flag gives at any size); any other (the
 * scale's value following a head size, say) keeps g unfused.  *use: the
 * sizes that go with the graph returned. */
static const tr_graph *dynamic_graph(jit_compiled *st, const tr_graph *g, const jit_dyn *dyn,
                                     jit_dyn *fd, const jit_dyn **use, const jit_env *env) {
    *use = dyn;
    fused_counts nfused;
    int *map = st->dev->fused_attention ? em_malloc(sizeof(int) * ((size_t)g->nnodes + 1)) : NULL;
    tr_graph *f = map ? fused_graph(st, g, map, &nfused, env) : NULL;
    em_clear_error(); /* out of memory for map: unfused */
    bool ok = f != NULL;
    *fd = *dyn;
    fd->nsizes = 0;
    for (int i = 0; ok && i < dyn->nsizes; i++) {
        jit_sym_size z = dyn->sizes[i];
        const tr_node *n = &g->nodes[z.node];
        if (map[z.node] < 0) {
            ok = n->kind == TR_CALL && n->op == EM_OP_ARANGE && z.field == JIT_SYM_SIZE;
            continue;
        }
        z.node = map[z.node];
        fd->sizes[fd->nsizes++] = z;
    }
    em_free(map);
    if (!ok) {
        tr_graph_free(f);
        return g;
    }
    *use = fd;
    return keep_graph(st, f, &nfused, env);
}

/* The static compile: plan from the cache, else build (and store the
 * plan), for the graph the device runs (device_graph). */
static em_status compile_static(jit_compiled *st, const tr_graph *g, jit_env *env) {
    g = device_graph(st, g, env);
    char target[256];
    if (!st->dev->target(st->index, env, target, sizeof target)) {
        run_op_by_op(st, env);
        return EM_OK;
    }
    kc_key gkey;
    kc_manifest why = {0}; /* the key's fields: explain a miss, stored beside the plan */
    char plan_target[512]; /* a tuned plan is its device model's */
    jit_tune_plan_target(st->dev, st->index, env, target, plan_target, sizeof plan_target);
    bool keyed = env->cache && jit_graph_key(g, st->dev->name, plan_target, &gkey, &why);
    if (why.failed) kc_manifest_clear(&why); /* out of memory: no manifest */
    em_clear_error();
    if (keyed && load_plan(st, g, env, &gkey, &why)) {
        kc_manifest_clear(&why);
        return EM_OK;
    }
    em_status s = build(st, g, env, target);
    if (s != EM_OK && s != EM_ERR_NOMEM) run_op_by_op(st, env);
    else if (s == EM_OK && keyed && env->dry_run) env->plans_missing++; /* looked up only */
    else if (s == EM_OK && keyed) store_plan(env, &gkey, &why, &st->plan);
    kc_manifest_clear(&why);
    if (s == EM_ERR_NOMEM) return s;
    return env->target && s != EM_OK ? EM_ERR_UNSUPPORTED : EM_OK;
}

/* A new state for g on d, or NULL with *out set to a state that runs op
 * by op (tensors off the device). */
static jit_compiled *begin(const jit_device *d, const tr_graph *g, jit_env *env, jit_compiled **out) {
    jit_compiled *st = *out = state_new(d);
    if (!st) return NULL;
    st->graphs = env->graphs && !env->target && !env->dry_run && d->capture_begin;
    st->log = env->log;
    st->index = env->target ? 0 : graph_device(d, g);
    if (st->index >= 0) return st;
    st->index = 0;
    jit_logf(env->log, JIT_LOG_CODE, "graph runs op by op: %s", em_last_error());
    em_clear_error();
    return NULL;
}

em_status jit_engine_compile(const jit_device *d, const tr_graph *g, jit_env *env,
                             jit_compiled **out) {
    jit_compiled *st = begin(d, g, env, out);
    if (!st) return *out ? EM_OK : em_last_status();
    return compile_static(st, g, env);
}

/* ---- dynamic shapes ----
 * The graph is scheduled and lowered twice, for the traced sizes and for
 * the probe sizes (jit_dyn_check's).  When both give the same steps, the
 * same buffers and kernels that differ only in i64 constants, those
 * constants become size parameters (kir_parametrize) and the kernels are
 * compiled once.  For each new set of sizes, specialize infers the metas
 * again, schedules and lowers again (microseconds, no code generation) and
 * requires the very same kernels up to those constants (kir_match), whose
 * values are the size arguments: a kernel never runs with sizes it was not
 * checked for.  Dynamic states have no plan entry: their kernels are in
 * the kernel cache. */

/* g at the sizes of inputs (one meta per input): *out shares g's inputs
 * lists, but has nodes of its own (em_free out->nodes) whose attribute
 * sizes follow (jit_dyn_infer) and whose metas are inferred into metas.
 * false: the shapes do not infer (error cleared) or out of memory. */
static bool at_sizes(const tr_graph *g, const jit_dyn *follow, const em_meta *inputs,
                     em_meta *metas, tr_graph *out, char *why, size_t nwhy) {
    *out = *g;
    out->nodes = em_malloc(sizeof *out->nodes * ((size_t)g->nnodes + 1));
    if (!out->nodes) return false;
    memcpy(out->nodes, g->nodes, sizeof *out->nodes * (size_t)g->nnodes);
    if (jit_dyn_infer(follow, out, inputs, metas) != EM_OK) {
        if (why) snprintf(why, nwhy, "%s", em_last_error());
        em_clear_error();
        return false;
    }
    for (int i = 0; i < g->nnodes; i++) out->nodes[i].meta = metas[i];
    return true;
}

/* Lowers kernel gi at the traced sizes (sa) and the probe sizes (sp) and
 * makes its parametrized form, into ks[gi] and keys[gi]. */
static bool dynamic_kernel(jit_compiled *st, const sc_schedule *sa, const sc_schedule *sp, int gi,
                           int *scratch, const char *target, k_kernel **ks, kc_key *keys) {
    jit_plan_kernel *pk = &st->plan.kernels[gi];
    k_kernel *ka = st->model[gi] = lower_into(sa, gi, pk, scratch);
    k_kernel *kp = ka ? lower_like(sp, gi, pk, scratch) : NULL;
    bool *vary = ka ? em_calloc((size_t)ka->n + 1, sizeof(bool)) : NULL;
    st->size_of[gi] = ka ? em_malloc(sizeof(int) * ((size_t)ka->n + 1)) : NULL;
    bool ok = kp && vary && st->size_of[gi] && kir_vary(ka, kp, vary) &&
              (ks[gi] = kir_parametrize(ka, vary, st->size_of[gi])) &&
              st->dev->key(ks[gi], target, &keys[gi], NULL);
    if (ok) pk->key = keys[gi];
    kir_free(kp);
    em_free(vary);
    return ok;
}

/* The arrays a dynamic state keeps per plan kernel. */
static em_status dynamic_init(jit_compiled *st, const sc_schedule *sa, k_kernel ***ks, kc_key **keys) {
    em_status s = plan_init(st, sa);
    int n = sa->ngroups;
    st->model = em_calloc((size_t)n + 1, sizeof *st->model);
    st->size_of = em_calloc((size_t)n + 1, sizeof *st->size_of);
    *ks = em_calloc((size_t)n + 1, sizeof **ks);
    *keys = em_calloc((size_t)n + 1, sizeof **keys);
    return s == EM_OK && st->model && st->size_of && *ks && *keys ? EM_OK : em_last_status();
}

/* Per node of g, the dims whose size differs between g's metas and
 * metas (the probe's): which loops of a kernel the sizes move. */
static uint32_t *varying_dims(const tr_graph *g, const em_meta *metas) {
    uint32_t *v = em_calloc((size_t)g->nnodes + 1, sizeof *v);
    for (int i = 0; v && i < g->nnodes; i++)
        for (int d = 0; d < metas[i].ndim && d < g->nodes[i].meta.ndim; d++)
            if (metas[i].sizes[d] != g->nodes[i].meta.sizes[d]) v[i] |= 1u << d;
    return v;
}

/* Schedules g at the traced and at the probe sizes and compiles the
 * parametrized kernels; EM_ERR_UNSUPPORTED, with why, when the two differ
 * in more than sizes. */
static em_status build_dynamic(jit_compiled *st, const tr_graph *g, const jit_dyn *dyn,
                               jit_env *env, char *why, size_t nwhy) {
    char target[256];
    if (!st->dev->target(st->index, env, target, sizeof target)) return em_last_status();
    em_meta *metas = em_malloc(sizeof *metas * ((size_t)g->nnodes + 1));
    tr_graph gp = {0};
    sc_schedule *sa = NULL, *sp = NULL;
    k_kernel **ks = NULL;
    kc_key *keys = NULL;
    int *scratch = em_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    em_status s = metas && scratch ? EM_OK : em_last_status();
    if (s == EM_OK && !at_sizes(g, dyn, dyn->probe, metas, &gp, NULL, 0)) {
        snprintf(why, nwhy, "the shapes do not infer at other sizes");
        s = em_last_status() == EM_ERR_NOMEM ? EM_ERR_NOMEM : EM_ERR_UNSUPPORTED;
    }
    if (s == EM_OK && !(st->vary = varying_dims(g, metas))) s = em_last_status();
    bool half = st->dev->half_kernels;
    if (s == EM_OK && (!(sa = sc_build_for(g, half)) || !(sp = sc_build_for(&gp, half))))
        s = em_last_status();
    if (s == EM_OK) sa->vary = sp->vary = st->vary;
    if (s == EM_OK) env->lowered++;
    if (s == EM_OK) s = dynamic_init(st, sa, &ks, &keys);
    if (s == EM_OK && !same_steps(st, sp)) {
        snprintf(why, nwhy, "fusion differs at other sizes");
        s = EM_ERR_UNSUPPORTED;
    }
    bool *has = s == EM_OK ? groups_with_steps(&st->plan) : NULL;
    if (s == EM_OK && !has) s = em_last_status();
    for (int gi = 0; s == EM_OK && gi < sa->ngroups; gi++) {
        if (!has[gi]) continue;
        if (dynamic_kernel(st, sa, sp, gi, scratch, target, ks, keys)) {
            log_kernel(env, st->dev, ks[gi]);
            continue;
        }
        s = em_last_status() == EM_ERR_NOMEM ? EM_ERR_NOMEM : EM_ERR_UNSUPPORTED;
        snprintf(why, nwhy, "kernel k%d differs at other sizes in more than its sizes", gi);
    }
    if (s == EM_OK) s = get_kernels(st, g, env, ks, keys, NULL);
    for (int gi = 0; ks && gi < st->plan.nkernels; gi++) kir_free(ks[gi]);
    em_free(has);
    em_free(ks);
    em_free(keys);
    sc_free(sa);
    sc_free(sp);
    em_free(gp.nodes);
    em_free(metas);
    em_free(scratch);
    return s;
}

em_status jit_engine_compile_dynamic(const jit_device *d, const tr_graph *g, const jit_dyn *dyn,
                                     jit_env *env, jit_compiled **out, bool *dynamic, char *why,
                                     size_t nwhy) {
    why[0] = '\0';
    *dynamic = false;
    jit_compiled *st = begin(d, g, env, out);
    if (!st) {
        snprintf(why, nwhy, "the graph runs op by op");
        return *out ? EM_OK : em_last_status();
    }
    jit_dyn fd;
    const tr_graph *gd = dynamic_graph(st, g, dyn, &fd, &dyn, env);
    em_status s = build_dynamic(st, gd, dyn, env, why, nwhy);
    *dynamic = st->dynamic = s == EM_OK;
    if (s == EM_OK) {
        memcpy(st->follow.sizes, dyn->sizes, sizeof dyn->sizes);
        st->follow.nsizes = dyn->nsizes;
    }
    if (s == EM_OK || s == EM_ERR_NOMEM) return s;
    if (!why[0]) snprintf(why, nwhy, "%s", em_last_error());
    drop_kernels(st);
    em_clear_error();
    return compile_static(st, g, env);
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
static bool kernel_sizes(const jit_compiled *st, const sc_schedule *sx, int gi, int *scratch,
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
static jit_spec *make_spec(jit_compiled *st, const tr_graph *g, em_tensor *const *in) {
    jit_spec *sp = em_calloc(1, sizeof *sp);
    if (sp) sp->alloc = em_get_allocator();
    tr_graph gx = {0};
    sc_schedule *sx = NULL;
    int *scratch = em_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    bool ok = sp && scratch && (sp->in = em_malloc(sizeof *sp->in * ((size_t)g->ninputs + 1))) &&
              (sp->metas = em_malloc(sizeof *sp->metas * ((size_t)g->nnodes + 1))) &&
              (sp->sizes = em_calloc((size_t)st->plan.nkernels + 1, sizeof *sp->sizes));
    for (int i = 0; ok && i < g->ninputs; i++) tr_meta_of(in[i], &sp->in[i]);
    ok = ok && at_sizes(g, &st->follow, sp->in, sp->metas, &gx, st->declined, sizeof st->declined);
    if (sp) sp->nodes = gx.nodes; /* the spec owns them from here */
    bool shaped = ok;
    ok = ok && (sx = sc_build_for(&gx, st->dev->half_kernels));
    if (ok) sx->vary = st->vary;
    ok = ok && same_steps(st, sx);
    for (int gi = 0; ok && gi < st->plan.nkernels; gi++)
        if (st->model[gi]) ok = kernel_sizes(st, sx, gi, scratch, &sp->sizes[gi]);
    if (shaped && !ok)
        snprintf(st->declined, sizeof st->declined,
                 "at these sizes the graph fuses or lowers into kernels of another structure");
    sc_free(sx);
    if (!sp) em_free(gx.nodes);
    em_free(scratch);
    if (!ok) {
        em_clear_error(); /* not an error: the call gets an entry of its own */
        jit_spec_free(st, sp);
        return NULL;
    }
    return sp;
}

bool jit_engine_specialize(jit_compiled *st, const tr_graph *g, em_tensor *const *in, void **spec) {
    *spec = NULL;
    if (!st || !st->dynamic) return true;
    if (st->graph) g = st->graph; /* the sizes follow its nodes */
    for (int i = 0; i < st->nmemo; i++) {
        if (same_inputs(st->memo[i]->in, in, g->ninputs)) {
            *spec = st->memo[i];
            return true;
        }
    }
    jit_spec *sp = make_spec(st, g, in);
    if (!sp) return false;
    if (st->nmemo < JIT_SPEC_MEMO) st->memo[st->nmemo++] = sp;
    else sp->owned = true;
    *spec = sp;
    return true;
}

const char *jit_engine_declined(const jit_compiled *st) { return st ? st->declined : ""; }

em_status jit_engine_run(jit_compiled *st, void *spec, const tr_graph *g, em_tensor *const *in,
                         em_tensor **out) {
    if (st && st->graph) g = st->graph; /* what the plan was made for */
    if (!st || !st->kernels) return jit_exec_op_by_op(g, in, out);
    jit_spec *sp = spec;
    bool ran = false;
    em_status s = jit_graphs_run(st, g, sp, in, out, &ran);
    if (s == EM_OK && !ran) s = jit_exec(st, g, sp, in, out);
    if (sp && sp->owned) jit_spec_free(st, sp);
    return s;
}
