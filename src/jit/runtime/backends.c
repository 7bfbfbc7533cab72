/* backends.c - the backends em_compile and lazy mode name (jit.h): the
 * engine on each device ("cpu", "cuda"), "auto" (the device of each
 * graph) and "replay" (op by op with the eager ops: it proves capture and
 * guards independently of code generation, and is the reference the
 * compiling backends are tested against -- its results equal eager
 * mode's bit for bit).
 *
 * The devices are listed here, once: adding one means its jit_device
 * table (engine.h) and its line below. */
#include "jit.h"

#include "cpu_jit.h"
#include "cuda_jit.h"

#include <string.h>

/* ---- replay ---- */

static em_status replay_compile(const tr_graph *g, jit_env *env, void **state) {
    (void)g, (void)env;
    *state = NULL; /* nothing to prepare: the graph is the program */
    return EM_OK;
}

static em_status replay_run(void *state, const tr_graph *g, em_tensor *const *in, em_tensor **out) {
    (void)state;
    return jit_exec_op_by_op(g, in, out);
}

static void replay_free(void *state) { (void)state; }

/* Every op re-infers its shapes when it runs: any sizes jit_dyn_check
 * allowed are served as they are, unless attribute sizes must follow
 * them (the graph is replayed as recorded). */
static em_status replay_compile_dynamic(const tr_graph *g, const jit_dyn *dyn, jit_env *env,
                                        void **state, bool *dynamic, char *why, size_t nwhy) {
    *dynamic = dyn->nsizes == 0;
    if (!*dynamic) snprintf(why, nwhy, "replayed reshape or expand sizes cannot follow the sizes");
    return replay_compile(g, env, state);
}

const jit_backend jit_replay_backend = {
    .name = "replay",
    .compile = replay_compile,
    .run = replay_run,
    .free = replay_free,
    .compile_dynamic = replay_compile_dynamic,
};

/* ---- the engine on a device ----
 * A state is a jit_compiled, which knows its device: only compile needs
 * to be told which one. */

static em_status engine_run(void *state, const tr_graph *g, em_tensor *const *in, em_tensor **out) {
    return jit_engine_run(state, NULL, g, in, out);
}

static em_status engine_run_dynamic(void *state, void *spec, const tr_graph *g, em_tensor *const *in,
                                    em_tensor **out) {
    return jit_engine_run(state, spec, g, in, out);
}

static bool engine_specialize(void *state, const tr_graph *g, em_tensor *const *in, void **spec) {
    return jit_engine_specialize(state, g, in, spec);
}

static const char *engine_declined(const void *state) { return jit_engine_declined(state); }

static void engine_free(void *state) { jit_engine_free(state); }

static int engine_kernels(const void *state) { return jit_engine_kernels(state); }

static void engine_graph_stats(void *state, int64_t *captured, int64_t *replays) {
    jit_engine_graph_stats(state, captured, replays);
}

/* The device's target as a string (for records and ember-cache), in a
 * per-thread buffer; NULL when it has none here. */
static const char *device_target(const jit_device *d) {
    static __thread char buf[256];
    if (d->target(0, NULL, buf, sizeof buf)) return buf;
    em_clear_error();
    return NULL;
}

#define ENGINE_BACKEND(id, dev, timed)                                                               \
    static em_status id##_compile(const tr_graph *g, jit_env *env, void **state) {               \
        return jit_engine_compile(&dev, g, env, (jit_compiled **)state);                         \
    }                                                                                            \
    static em_status id##_compile_dynamic(const tr_graph *g, const jit_dyn *dyn, jit_env *env,   \
                                          void **state, bool *dynamic, char *why, size_t nwhy) { \
        return jit_engine_compile_dynamic(&dev, g, dyn, env, (jit_compiled **)state, dynamic,    \
                                          why, nwhy);                                            \
    }                                                                                            \
    static const char *id##_target(void) { return device_target(&dev); }                         \
    const jit_backend jit_##id##_backend = {                                                     \
        .name = #id, .compile = id##_compile, .run = engine_run, .free = engine_free,            \
        .kernels = engine_kernels, .graph_stats = engine_graph_stats, .target = id##_target,     \
        .compile_dynamic = id##_compile_dynamic, .specialize = engine_specialize,                \
        .declined = engine_declined, .run_dynamic = engine_run_dynamic, .device = &dev,          \
        .host_timed = timed,                                                                     \
    };

ENGINE_BACKEND(cpu, jit_cpu_device, true)
ENGINE_BACKEND(cuda, jit_cuda_device, false) /* a run returns once its launches are queued */

/* ---- "auto": the backend of the graph's device ----
 * em_compile picks its backend before any input is seen; the default
 * decides per captured graph instead: each graph's entry gets the backend
 * of its tensors' device (jit_backend_for_graph), so "auto" itself never
 * compiles. */

static const jit_backend *const engines[] = {&jit_cpu_backend, &jit_cuda_backend};

static const jit_backend *backend_of(const tr_graph *g) {
    for (int i = 0; i < g->nnodes; i++)
        for (size_t e = 1; e < sizeof engines / sizeof engines[0]; e++)
            if (g->nodes[i].meta.device.type == engines[e]->device->type) return engines[e];
    return engines[0];
}

const jit_backend *jit_backend_for_graph(const jit_backend *b, const tr_graph *g) {
    return b == &jit_auto_backend ? backend_of(g) : b;
}

bool jit_backend_has_artifacts(const jit_backend *b) { return b && (b == &jit_auto_backend || b->target); }

static em_status auto_compile(const tr_graph *g, jit_env *env, void **state) {
    return backend_of(g)->compile(g, env, state);
}

const jit_backend jit_auto_backend = {
    .name = "auto",
    .compile = auto_compile,
    .run = engine_run,
    .free = engine_free,
    .kernels = engine_kernels,
    .graph_stats = engine_graph_stats,
};

const jit_backend *jit_backend_find(const char *name) {
    static const jit_backend *const all[] = {&jit_auto_backend, &jit_cpu_backend,
                                             &jit_cuda_backend, &jit_replay_backend};
    if (!name) return all[0];
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (!strcmp(all[i]->name, name)) return all[i];
    return NULL;
}

const char *jit_backend_target(const jit_backend *b) { return b && b->target ? b->target() : NULL; }
