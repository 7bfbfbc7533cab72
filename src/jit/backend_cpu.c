/* backend_cpu.c - the "cpu" backend: a graph's fused groups compiled into
 * native kernels with libgccjit, the other ops run eagerly between them.
 *
 * compile: schedule (schedule.c) -> lower each group (lower.c) -> compile
 * each kernel (cpu_gccjit.c).  A graph any of whose groups cannot be
 * lowered or compiled runs op by op like the replay backend, with the
 * reason logged under EMBER_LOG=code... never a wrong result. */
#include "cpu_gccjit.h"
#include "jit.h"
#include "fuse.h"
#include "worker.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct cpu_kernel_step {
    jit_cpu_kernel *kernel;
    int *bufs;   /* node of each buffer parameter */
    int nbufs;
    int nouts;   /* the last nouts buffers are results, allocated per run */
} cpu_kernel_step;

typedef struct cpu_state {
    sc_schedule *sched;        /* NULL: run op by op */
    cpu_kernel_step *kernels;  /* by group */
    int nkernels;
} cpu_state;

static void state_free(cpu_state *st) {
    if (!st) return;
    for (int i = 0; i < st->nkernels; i++) {
        jit_cpu_free(st->kernels[i].kernel);
        em_free(st->kernels[i].bufs);
    }
    em_free(st->kernels);
    sc_free(st->sched);
    em_free(st);
}

/* The cache key of kernel k: everything that determines the shared
 * object (the cache adds its own format version). */
static bool kernel_key(const k_kernel *k, kc_key *key) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return false;
    kir_print(k, f);
    fclose(f);
    kc_hasher h;
    kc_hasher_reset(&h);
    kc_hasher_update_str(&h, "ember cpu kernel");
    kc_hasher_update_str(&h, jit_cpu_target());
    kc_hasher_update_str(&h, text);
    *key = kc_hasher_digest(&h);
    free(text);
    return true;
}

static void log_kernel(const jit_env *env, const k_kernel *k) {
    if (!env->log || !(env->log->flags & JIT_LOG_CODE)) return;
    jit_logf(env->log, JIT_LOG_CODE, "kernel %s:", k->name);
    kir_print(k, env->log->f);
}

/* A temporary file name for a compiler's output (the caller unlinks it). */
static bool temp_path(char *buf, size_t n) {
    const char *dir = getenv("TMPDIR");
    snprintf(buf, n, "%s/ember-kernel-XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(buf);
    if (fd < 0) return false;
    close(fd);
    return true;
}

/* Stores the shared object at tmp under key and loads it from the cache. */
static em_status store_and_load(jit_env *env, const kc_key *key, const char *name,
                                const char *tmp, jit_cpu_kernel **out) {
    char *path = NULL, hex[KC_KEY_HEX_SIZE];
    em_status s = kc_put_file(env->cache, key, "so", tmp);
    if (s == EM_OK) s = kc_get_file(env->cache, key, "so", &path);
    if (s == EM_OK && path) {
        s = jit_cpu_load_so(path, name, out);
        em_free(path);
        kc_key_hex(key, hex);
        if (s == EM_OK) jit_logf(env->log, JIT_LOG_CACHE, "cache write: kernel %s (%s)", name, hex);
        return s;
    }
    unlink(tmp);
    return s == EM_OK ? EM_ERR_STATE : s;
}

/* The kernel from the cache: *out set on a hit, NULL on a miss. */
static void lookup(jit_env *env, const k_kernel *k, const kc_key *key, jit_cpu_kernel **out) {
    char hex[KC_KEY_HEX_SIZE], *path = NULL;
    *out = NULL;
    kc_key_hex(key, hex);
    if (kc_get_file(env->cache, key, "so", &path) == EM_OK && path) {
        em_status s = jit_cpu_load_so(path, k->name, out);
        em_free(path);
        if (s == EM_OK) {
            env->loaded++;
            jit_logf(env->log, JIT_LOG_CACHE, "cache hit: kernel %s (%s)", k->name, hex);
            return;
        }
        *out = NULL;
        em_clear_error();
    }
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

/* Gets every kernel: from the cache, else compiled.  With several misses,
 * worker processes take a share each while this process compiles its own
 * (libgccjit compiles one kernel at a time per process). */
static em_status get_kernels(jit_env *env, k_kernel **ks, const kc_key *keys, int n,
                             jit_cpu_kernel **out) {
    int *mine = em_malloc(sizeof(int) * (size_t)(n + 1)), *theirs = em_malloc(sizeof(int) * (size_t)(n + 1));
    k_kernel **wk = em_calloc((size_t)n + 1, sizeof *wk);
    char **paths = em_calloc((size_t)n + 1, sizeof *paths);
    bool *ok = em_calloc((size_t)n + 1, sizeof *ok);
    em_status s = mine && theirs && wk && paths && ok ? EM_OK : em_last_status();
    int nmine = 0, ntheirs = 0, nmiss = 0;
    int share = env->cache ? em_num_threads() : 1; /* this process and the workers */
    for (int i = 0; s == EM_OK && i < n; i++) {
        if (env->cache) lookup(env, ks[i], &keys[i], &out[i]);
        if (out[i]) continue;
        if (nmiss++ % share == 0) mine[nmine++] = i;
        else theirs[ntheirs++] = i;
    }
    int m = 0;
    while (m < ntheirs && (paths[m] = em_malloc(4096)) && temp_path(paths[m], 4096)) {
        wk[m] = ks[theirs[m]];
        m++;
    }
    jit_workers *workers =
        s == EM_OK && m == ntheirs ? jit_workers_start(wk, (const char *const *)paths, m, share - 1) : NULL;
    if (!workers) { /* no workers: compile their share here too */
        for (int t = 0; t < ntheirs; t++) mine[nmine++] = theirs[t];
        ntheirs = 0;
    }
    for (int j = 0; j < nmine && s == EM_OK; j++)
        s = compile_here(env, ks[mine[j]], &keys[mine[j]], &out[mine[j]]);
    if (workers) jit_workers_finish(workers, ok);
    for (int t = 0; t < ntheirs && s == EM_OK; t++) {
        int i = theirs[t];
        if (ok[t]) {
            env->compiled++;
            if (store_and_load(env, &keys[i], ks[i]->name, paths[t], &out[i]) == EM_OK) continue;
            em_clear_error();
            env->compiled--;
        }
        s = compile_here(env, ks[i], &keys[i], &out[i]); /* the worker failed */
    }
    for (int t = 0; t < m; t++) {
        unlink(paths[t]); /* already moved into the cache when stored */
        em_free(paths[t]);
    }
    em_free(mine);
    em_free(theirs);
    em_free(wk);
    em_free(paths);
    em_free(ok);
    return s;
}

/* Drops the schedule: the graph then runs op by op, correct but slower. */
static void run_op_by_op(cpu_state *st, const jit_env *env) {
    jit_logf(env->log, JIT_LOG_CODE, "graph runs op by op: %s", em_last_error());
    for (int i = 0; i < st->nkernels; i++) {
        jit_cpu_free(st->kernels[i].kernel);
        em_free(st->kernels[i].bufs);
    }
    em_free(st->kernels);
    st->kernels = NULL;
    st->nkernels = 0;
    sc_free(st->sched);
    st->sched = NULL;
    em_clear_error();
}

static em_status cpu_compile(const tr_graph *g, jit_env *env, void **state) {
    cpu_state *st = em_calloc(1, sizeof *st);
    if (!st) return em_last_status();
    *state = st;
    st->sched = sc_build(g);
    if (!st->sched) return em_last_status();
    int n = st->sched->ngroups;
    st->kernels = em_calloc((size_t)n + 1, sizeof *st->kernels);
    k_kernel **ks = em_calloc((size_t)n + 1, sizeof *ks);
    kc_key *keys = em_calloc((size_t)n + 1, sizeof *keys);
    jit_cpu_kernel **compiled = em_calloc((size_t)n + 1, sizeof *compiled);
    em_status s = st->kernels && ks && keys && compiled ? EM_OK : em_last_status();
    if (s == EM_OK) st->nkernels = n;
    for (int gi = 0; gi < n && s == EM_OK; gi++) {
        cpu_kernel_step *kst = &st->kernels[gi];
        kst->bufs = em_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
        ks[gi] = kst->bufs ? sc_lower(st->sched, gi, kst->bufs, &kst->nbufs, &kst->nouts) : NULL;
        if (!ks[gi] || !kernel_key(ks[gi], &keys[gi]))
            s = em_last_status() ? em_last_status() : EM_ERR_UNSUPPORTED;
        else
            log_kernel(env, ks[gi]);
    }
    if (s == EM_OK) s = get_kernels(env, ks, keys, n, compiled);
    for (int gi = 0; gi < n; gi++) {
        if (st->kernels && compiled) st->kernels[gi].kernel = compiled[gi];
        if (ks) kir_free(ks[gi]);
    }
    em_free(ks);
    em_free(keys);
    em_free(compiled);
    if (s != EM_OK && st->kernels) run_op_by_op(st, env);
    return st->kernels || s == EM_OK ? EM_OK : s;
}

static em_status run_kernel(const tr_graph *g, const cpu_kernel_step *ks, em_tensor **vals) {
    void *stack[16], **ptrs = ks->nbufs <= 16 ? stack : em_malloc(sizeof(void *) * (size_t)ks->nbufs);
    if (!ptrs) return em_last_status();
    em_status s = EM_OK;
    for (int b = 0; b < ks->nbufs && s == EM_OK; b++) {
        int v = ks->bufs[b];
        if (b >= ks->nbufs - ks->nouts) {
            em_meta m = g->nodes[v].meta;
            vals[v] = em_tensor_alloc(&m);
            if (!vals[v]) s = em_last_status();
        }
        if (s == EM_OK) ptrs[b] = em_data(vals[v]);
    }
    if (s == EM_OK) s = jit_cpu_run(ks->kernel, ptrs, NULL);
    if (ptrs != stack) em_free(ptrs);
    return s;
}

static em_status cpu_run(void *state, const tr_graph *g, em_tensor *const *in, em_tensor **out) {
    cpu_state *st = state;
    if (!st->sched) return jit_replay_backend.run(NULL, g, in, out);
    em_tensor **vals = em_calloc((size_t)g->nnodes + 1, sizeof *vals);
    if (!vals) return em_last_status();
    em_status s = EM_OK;
    em_scope_begin();
    for (int i = 0; i < g->nnodes; i++) {
        const tr_node *n = &g->nodes[i];
        if (n->kind == TR_INPUT) vals[i] = in[n->index];
        else if (n->kind == TR_CONST) vals[i] = g->consts[n->index];
    }
    for (int i = 0; i < st->sched->nsteps && s == EM_OK; i++) {
        const sc_step *step = &st->sched->steps[i];
        if (step->kind == SC_KERNEL) {
            s = run_kernel(g, &st->kernels[step->group], vals);
        } else {
            vals[step->node] = jit_replay_node(&g->nodes[step->node], vals);
            if (!vals[step->node]) s = em_last_status() ? em_last_status() : EM_ERR_STATE;
        }
    }
    for (int i = 0; i < g->noutputs; i++) {
        em_tensor *v = vals[g->outputs[i]];
        if (s == EM_OK && !v) s = em_error(EM_ERR_STATE, "cpu backend: output %d was not computed", i);
        out[i] = s == EM_OK ? em_keep(v) : NULL;
    }
    em_scope_end();
    em_free(vals);
    return s;
}

static void cpu_free(void *state) { state_free(state); }

static int cpu_kernels(const void *state) { return ((const cpu_state *)state)->nkernels; }

const jit_backend jit_cpu_backend = {
    .name = "cpu",
    .compile = cpu_compile,
    .run = cpu_run,
    .free = cpu_free,
    .kernels = cpu_kernels,
};
