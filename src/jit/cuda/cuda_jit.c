/* backend_cuda.c - the "cuda" jit backend: a graph's fused groups as NVRTC
 * kernels (cuda_emit.c, cuda_kernel.c), the other ops (matmul through
 * cuBLAS, views...) run eagerly on the device between them.  Mirrors
 * backend_cpu.c: the same schedule and lowering, another code generator.
 *
 * A graph any of whose groups cannot be lowered or compiled runs op by op
 * (eager CUDA ops), with the reason logged under EMBER_LOG=code; so does a
 * graph with tensors off the GPU.  Without a CUDA build, compile reports
 * EM_ERR_DEVICE. */
#include "jit.h"

#include "cuda_kernel.h"
#include "schedule.h"

#include <string.h>

#ifdef EMBER_HAVE_CUDA

typedef struct cuda_step {
    const cuda_kernel *kernel; /* owned by the device; NULL: eager_node instead */
    int eager_node;            /* a lone long-row reduction run as the eager op
                                  (which splits it over blocks), or -1 */
    int *bufs;                 /* node of each buffer parameter */
    int nbufs, nouts;          /* the last nouts buffers are results */
} cuda_step;

typedef struct cuda_state {
    cuda_device *dev;
    sc_schedule *sched; /* NULL: run op by op */
    cuda_step *steps;   /* by group */
    int nsteps;
} cuda_state;

static void state_free(cuda_state *st) {
    if (!st) return;
    for (int i = 0; i < st->nsteps; i++) em_free(st->steps[i].bufs);
    em_free(st->steps);
    sc_free(st->sched);
    em_free(st);
}

/* The device every tensor of g lives on, or -1 (error set). */
static int graph_device(const tr_graph *g) {
    int dev = -1;
    for (int i = 0; i < g->nnodes; i++) {
        em_device d = g->nodes[i].meta.device;
        if (d.type != EM_CUDA) {
            em_error(EM_ERR_DEVICE, "cuda backend: node %d is not on a CUDA device", i);
            return -1;
        }
        if (dev >= 0 && d.index != dev) {
            em_error(EM_ERR_DEVICE, "cuda backend: the graph spans two CUDA devices");
            return -1;
        }
        dev = d.index;
    }
    return dev < 0 ? 0 : dev;
}

static void log_kernel(const jit_env *env, const k_kernel *k) {
    if (!env->log || !(env->log->flags & JIT_LOG_CODE)) return;
    jit_logf(env->log, JIT_LOG_CODE, "cuda kernel %s:", k->name);
    kir_print(k, env->log->f);
}

/* The node of group gi when the group is one sum/mean/amax/amin with
 * fewer rows than the GPU has SMs and long rows: the eager CUDA op runs it
 * in two launches (cuda_backend.c's split scheme) where one kernel would
 * use a block per row.  -1 otherwise. */
static int lone_long_reduction(const cuda_state *st, const tr_graph *g, int gi) {
    int node = -1;
    for (int v = 0; v < g->nnodes; v++) {
        if (st->sched->group[v] != gi) continue;
        if (node >= 0) return -1;
        node = v;
    }
    if (node < 0) return -1;
    const tr_node *n = &g->nodes[node];
    if (n->op != EM_OP_SUM && n->op != EM_OP_MEAN && n->op != EM_OP_AMAX && n->op != EM_OP_AMIN)
        return -1;
    int in = n->in[0]; /* its input must be in memory when the step runs */
    if (g->nodes[in].kind == TR_CALL && st->sched->fusible[in] && !st->sched->materialized[in])
        return -1;
    int64_t rows = em_shape_numel(n->meta.ndim, n->meta.sizes);
    int64_t all = em_shape_numel(g->nodes[n->in[0]].meta.ndim, g->nodes[n->in[0]].meta.sizes);
    return rows > 0 && rows < st->dev->sm_count && all / rows >= (1 << 16) ? node : -1;
}

static em_status compile_groups(cuda_state *st, const tr_graph *g, jit_env *env) {
    int n = st->sched->ngroups;
    st->steps = em_calloc((size_t)n + 1, sizeof *st->steps);
    if (!st->steps) return em_last_status();
    st->nsteps = n;
    cuda_get_stats stats = {0};
    em_status s = EM_OK;
    for (int gi = 0; gi < n && s == EM_OK; gi++) {
        cuda_step *cs = &st->steps[gi];
        if ((cs->eager_node = lone_long_reduction(st, g, gi)) >= 0) continue;
        cs->bufs = em_malloc(sizeof(int) * ((size_t)g->nnodes + 1));
        k_kernel *k = cs->bufs ? sc_lower(st->sched, gi, cs->bufs, &cs->nbufs, &cs->nouts) : NULL;
        if (!k) {
            s = em_last_status() ? em_last_status() : EM_ERR_UNSUPPORTED;
            break;
        }
        log_kernel(env, k);
        s = cuda_kernel_get(st->dev, k, env->cache, &stats, &cs->kernel);
        kir_free(k);
    }
    env->compiled += stats.compiled;
    env->loaded += stats.loaded;
    return s;
}

static void run_op_by_op(cuda_state *st, const jit_env *env) {
    jit_logf(env->log, JIT_LOG_CODE, "graph runs op by op: %s", em_last_error());
    for (int i = 0; i < st->nsteps; i++) em_free(st->steps[i].bufs);
    em_free(st->steps);
    st->steps = NULL;
    st->nsteps = 0;
    sc_free(st->sched);
    st->sched = NULL;
    em_clear_error();
}

static em_status cuda_compile(const tr_graph *g, jit_env *env, void **state) {
    *state = NULL;
    cuda_state *st = em_calloc(1, sizeof *st);
    if (!st) return em_last_status();
    *state = st;
    int index = graph_device(g);
    if (index < 0) { /* tensors off the GPU (or on two): the ops know where to run */
        jit_logf(env->log, JIT_LOG_CODE, "graph runs op by op: %s", em_last_error());
        em_clear_error();
        return EM_OK;
    }
    cuda_device *dev = cuda_device_get(index);
    if (!dev) return em_last_status();
    st->dev = dev;
    st->sched = sc_build(g);
    if (!st->sched) return em_last_status();
    em_status s = compile_groups(st, g, env);
    if (s == EM_ERR_NOMEM) return s;
    if (s != EM_OK) run_op_by_op(st, env);
    return EM_OK;
}

static em_status run_group(cuda_state *st, const tr_graph *g, const cuda_step *cs, em_tensor **vals) {
    void *stack[16], **ptrs = cs->nbufs <= 16 ? stack : em_malloc(sizeof(void *) * (size_t)cs->nbufs);
    if (!ptrs) return em_last_status();
    em_status s = EM_OK;
    for (int b = 0; b < cs->nbufs && s == EM_OK; b++) {
        int v = cs->bufs[b];
        if (b >= cs->nbufs - cs->nouts) {
            em_meta m = g->nodes[v].meta;
            vals[v] = em_tensor_alloc(&m);
            if (!vals[v]) s = em_last_status();
        }
        if (s == EM_OK) ptrs[b] = em_data(vals[v]);
    }
    if (s == EM_OK) s = cuda_kernel_launch(st->dev, cs->kernel, ptrs, NULL);
    if (ptrs != stack) em_free(ptrs);
    return s;
}

static em_status cuda_run(void *state, const tr_graph *g, em_tensor *const *in, em_tensor **out) {
    cuda_state *st = state;
    if (!st->sched) return jit_replay_backend.run(NULL, g, in, out);
    em_tensor *stack[64], **vals = g->nnodes <= 64 ? stack : em_malloc(sizeof *vals * (size_t)g->nnodes);
    if (!vals) return em_last_status();
    memset(vals, 0, sizeof *vals * (size_t)(g->nnodes <= 64 ? 64 : g->nnodes));
    em_status s = EM_OK;
    em_scope_begin();
    for (int i = 0; i < g->nnodes; i++) {
        const tr_node *n = &g->nodes[i];
        if (n->kind == TR_INPUT) vals[i] = in[n->index];
        else if (n->kind == TR_CONST) vals[i] = g->consts[n->index];
    }
    for (int i = 0; i < st->sched->nsteps && s == EM_OK; i++) {
        const sc_step *step = &st->sched->steps[i];
        const cuda_step *cs = step->kind == SC_KERNEL ? &st->steps[step->group] : NULL;
        if (cs && cs->eager_node < 0) {
            s = run_group(st, g, cs, vals);
        } else if (cs) {
            vals[cs->eager_node] = jit_replay_node(&g->nodes[cs->eager_node], vals);
            if (!vals[cs->eager_node]) s = em_last_status() ? em_last_status() : EM_ERR_STATE;
        } else {
            vals[step->node] = jit_replay_node(&g->nodes[step->node], vals);
            if (!vals[step->node]) s = em_last_status() ? em_last_status() : EM_ERR_STATE;
        }
    }
    for (int i = 0; i < g->noutputs; i++) {
        em_tensor *v = vals[g->outputs[i]];
        if (s == EM_OK && !v) s = em_error(EM_ERR_STATE, "cuda backend: output %d was not computed", i);
        out[i] = s == EM_OK ? em_keep(v) : NULL;
    }
    em_scope_end();
    if (vals != stack) em_free(vals);
    return s;
}

static void cuda_free_state(void *state) { state_free(state); }

static int cuda_kernels(const void *state) { return ((const cuda_state *)state)->nsteps; }

#else /* no CUDA headers at build time */

static em_status cuda_compile(const tr_graph *g, jit_env *env, void **state) {
    (void)g, (void)env;
    *state = NULL;
    return em_error(EM_ERR_DEVICE, "cuda backend: this build of Ember has no CUDA backend");
}

static em_status cuda_run(void *state, const tr_graph *g, em_tensor *const *in, em_tensor **out) {
    (void)state, (void)g, (void)in, (void)out;
    return em_error(EM_ERR_DEVICE, "cuda backend: this build of Ember has no CUDA backend");
}

static void cuda_free_state(void *state) { (void)state; }

static int cuda_kernels(const void *state) { (void)state; return 0; }

#endif

const jit_backend jit_cuda_backend = {
    .name = "cuda",
    .compile = cuda_compile,
    .run = cuda_run,
    .free = cuda_free_state,
    .kernels = cuda_kernels,
};

/* ---- "auto": the backend of the graph's device ----
 * em_compile picks its backend before any input is seen; the default
 * decides per captured graph instead: CUDA tensors -> "cuda", otherwise
 * "cpu".  Its state remembers which one it chose. */

typedef struct auto_state {
    const jit_backend *b;
    void *state;
} auto_state;

static const jit_backend *backend_of(const tr_graph *g) {
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].meta.device.type == EM_CUDA) return &jit_cuda_backend;
    return &jit_cpu_backend;
}

const jit_backend *jit_backend_for_graph(const jit_backend *b, const tr_graph *g) {
    return b == &jit_auto_backend ? backend_of(g) : b;
}

bool jit_backend_has_artifacts(const jit_backend *b) {
    return b == &jit_auto_backend ? jit_cpu_backend.target != NULL : b && b->target;
}

static em_status auto_compile(const tr_graph *g, jit_env *env, void **state) {
    auto_state *st = em_calloc(1, sizeof *st);
    *state = st;
    if (!st) return em_last_status();
    st->b = backend_of(g);
    return st->b->compile(g, env, &st->state);
}

static em_status auto_run(void *state, const tr_graph *g, em_tensor *const *in, em_tensor **out) {
    auto_state *st = state;
    return st->b->run(st->state, g, in, out);
}

static void auto_free(void *state) {
    auto_state *st = state;
    if (!st) return;
    if (st->state) st->b->free(st->state);
    em_free(st);
}

static int auto_kernels(const void *state) {
    const auto_state *st = state;
    return st->b->kernels && st->state ? st->b->kernels(st->state) : 0;
}

const jit_backend jit_auto_backend = {
    .name = "auto",
    .compile = auto_compile,
    .run = auto_run,
    .free = auto_free,
    .kernels = auto_kernels,
};
