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

/* The kernel from the cache, or compiled (and then stored in the cache). */
static em_status get_kernel(jit_env *env, const k_kernel *k, jit_cpu_kernel **out) {
    kc_key key;
    char hex[KC_KEY_HEX_SIZE], *path = NULL;
    if (!env->cache || !kernel_key(k, &key)) {
        env->compiled++;
        return jit_cpu_compile(k, out);
    }
    kc_key_hex(&key, hex);
    if (kc_get_file(env->cache, &key, "so", &path) == EM_OK && path) {
        em_status s = jit_cpu_load_so(path, k->name, out);
        em_free(path);
        if (s == EM_OK) {
            env->loaded++;
            jit_logf(env->log, JIT_LOG_CACHE, "cache hit: kernel %s (%s)", k->name, hex);
            return EM_OK;
        }
    }
    jit_logf(env->log, JIT_LOG_CACHE, "cache miss: kernel %s (%s): compiling", k->name, hex);
    env->compiled++;
    const char *dir = getenv("TMPDIR");
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s/ember-kernel-XXXXXX", dir && *dir ? dir : "/tmp");
    int fd = mkstemp(tmp);
    if (fd < 0) return jit_cpu_compile(k, out);
    close(fd);
    em_status s = jit_cpu_write_so(k, tmp);
    if (s == EM_OK) s = kc_put_file(env->cache, &key, "so", tmp);
    if (s == EM_OK) s = kc_get_file(env->cache, &key, "so", &path);
    if (s == EM_OK && path) {
        s = jit_cpu_load_so(path, k->name, out);
        em_free(path);
        jit_logf(env->log, JIT_LOG_CACHE, "cache write: kernel %s (%s)", k->name, hex);
    } else {
        unlink(tmp);
        em_clear_error();
        s = jit_cpu_compile(k, out); /* the cache failed: compile in memory */
    }
    return s;
}

static em_status compile_group(const sc_schedule *s, int gi, jit_env *env, cpu_kernel_step *ks) {
    int n = s->g->nnodes + 1;
    ks->bufs = em_malloc(sizeof(int) * (size_t)n);
    if (!ks->bufs) return em_last_status();
    k_kernel *k = sc_lower(s, gi, ks->bufs, &ks->nbufs, &ks->nouts);
    if (!k) return em_last_status() ? em_last_status() : EM_ERR_UNSUPPORTED;
    log_kernel(env, k);
    em_status st = get_kernel(env, k, &ks->kernel);
    kir_free(k);
    return st;
}

static em_status cpu_compile(const tr_graph *g, jit_env *env, void **state) {
    cpu_state *st = em_calloc(1, sizeof *st);
    if (!st) return em_last_status();
    *state = st;
    st->sched = sc_build(g);
    if (!st->sched) return em_last_status();
    st->kernels = em_calloc((size_t)st->sched->ngroups + 1, sizeof *st->kernels);
    if (!st->kernels) return em_last_status();
    st->nkernels = st->sched->ngroups;
    for (int gi = 0; gi < st->sched->ngroups; gi++) {
        if (compile_group(st->sched, gi, env, &st->kernels[gi]) != EM_OK) {
            jit_logf(env->log, JIT_LOG_CODE, "graph runs op by op: %s", em_last_error());
            /* run this graph op by op instead: correct, only slower */
            for (int i = 0; i <= gi; i++) {
                jit_cpu_free(st->kernels[i].kernel);
                em_free(st->kernels[i].bufs);
            }
            em_free(st->kernels);
            st->kernels = NULL;
            st->nkernels = 0;
            sc_free(st->sched);
            st->sched = NULL;
            em_clear_error();
            break;
        }
    }
    return EM_OK;
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
