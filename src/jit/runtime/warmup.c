/* warmup.c - compiling a recorded graph ahead of time (ember-cache warmup):
 * the graph is parsed with stand-ins for its constants (their values never
 * reach a kernel: constants are buffer arguments), then handed to its
 * backend's compile exactly as em_compile would, which stores the graph's
 * plan and kernels in the cache. */
#include "jit.h"

#include <string.h>


/* Whether follow z names an attribute g's node has (a rest: a reshape's
 * size) and a dim of one of its inputs in. */
static bool follow_fits(const jit_sym_size *z, const tr_graph *g, em_tensor *const *in) {
    static const unsigned need[] = {A_SIZES, A_RANGE, A_RANGE, A_VALUE};
    if (z->node < 0 || z->node >= g->nnodes || g->nodes[z->node].kind != TR_CALL) return false;
    const tr_node *n = &g->nodes[z->node];
    if (!(em_op_table[n->op].attrs & need[z->field])) return false;
    if (z->field == JIT_SYM_SIZE && z->j >= n->attrs.ndim) return false;
    if (z->rest) return n->op == EM_OP_RESHAPE;
    if (z->product && !(z->input2 >= 0 && z->input2 < g->ninputs && z->dim2 >= 0 &&
                        z->dim2 < in[z->input2]->ndim))
        return false;
    return z->input < g->ninputs && z->dim < in[z->input]->ndim;
}

/* A recorded dynamic entry: its kernels with size parameters, from the
 * graph's input metas with the recorded dims dynamic (the graph was
 * checked when it was traced).  Dynamic kernels have no plan entry. */
static em_status compile_dynamic(const jit_backend *b, const jit_record *r, tr_graph *g,
                                 jit_env *env, void **state, bool *dynamic) {
    em_tensor **in = em_calloc((size_t)g->ninputs + 1, sizeof *in);
    jit_dyn dyn = {.probe = em_calloc((size_t)g->ninputs + 1, sizeof *dyn.probe)};
    gd_guards *gs = NULL;
    em_status s = in && dyn.probe ? EM_OK : em_last_status();
    for (int i = 0; s == EM_OK && i < g->nnodes; i++)
        if (g->nodes[i].kind == TR_INPUT && !(in[g->nodes[i].index] = em_tensor_meta_only(&g->nodes[i].meta)))
            s = em_last_status();
    if (s == EM_OK && !(gs = gd_build(g, in, NULL, 0, NULL, 0))) s = em_last_status();
    for (int i = 0; s == EM_OK && i < r->ndyn && i < g->ninputs; i++) gd_set_dynamic(gs, i, r->dyn[i]);
    for (int i = 0; s == EM_OK && i < r->ndiv; i++)
        if (r->div[i].input < g->ninputs) (void)gd_set_divisor(gs, r->div[i].input, r->div[i].dim, r->div[i].q);
    /* the attributes that follow the sizes, as the trace found them: a
     * follow naming a node or an input the graph lacks is refused */
    for (int i = 0; s == EM_OK && i < r->nfollow; i++) {
        const jit_sym_size *z = &r->follow[i];
        if (!follow_fits(z, g, in))
            s = em_error(EM_ERR_ARG, "record of %s: follow line %d names a node or input the graph lacks",
                         r->name, i + 1);
        else
            dyn.sizes[dyn.nsizes++] = *z;
    }
    if (s == EM_OK && gd_is_dynamic(gs) && jit_dyn_probe(gs, in, g->ninputs, dyn.probe)) {
        char why[256];
        s = b->compile_dynamic(g, &dyn, env, state, dynamic, why, sizeof why);
        /* a warmed process's first call of this structure is dynamic too */
        if (s == EM_OK && *dynamic && !env->dry_run) jit_dyn_hint_put(env->cache, b->name, g, gs);
    } else if (s == EM_OK) {
        s = b->compile(g, env, state);
    }
    for (int i = 0; in && i < g->ninputs; i++) em_release(in[i]);
    em_free(in);
    em_free(dyn.probe);
    gd_free(gs);
    return s;
}

/* The backend that compiles r into cache, or NULL with why. */
static const jit_backend *record_backend(const jit_record *r, kc_cache *cache, char *why,
                                         size_t nwhy) {
    const jit_backend *b = r && r->backend ? jit_backend_find(r->backend) : NULL;
    if (!b || !b->device) {
        snprintf(why, nwhy, "backend '%s' has nothing to compile ahead of time",
                 r && r->backend ? r->backend : "(none)");
        return NULL;
    }
    if (!cache || !kc_on_disk(cache)) {
        snprintf(why, nwhy, "no cache directory to compile into");
        return NULL;
    }
    return b;
}

/* Parses r and compiles it with b under env, as em_compile would (env
 * says whether for real or as a dry run); false with why. */
static bool compile_record(const jit_backend *b, const jit_record *r, jit_env *env, bool *dynamic,
                           char *why, size_t nwhy) {
    tr_graph *g = tr_parse_placeholders(r->graph);
    if (!g) {
        snprintf(why, nwhy, "%s", em_last_error());
        em_clear_error();
        return false;
    }
    void *state = NULL;
    *dynamic = false;
    em_status s = r->ndyn > 0 && b->compile_dynamic ? compile_dynamic(b, r, g, env, &state, dynamic)
                                                    : b->compile(g, env, &state);
    if (s != EM_OK) snprintf(why, nwhy, "%s", em_last_error());
    if (state) b->free(state);
    tr_graph_free(g);
    em_clear_error();
    return s == EM_OK;
}

static const char NO_COMPILED_FORM[] =
    "the graph has no compiled form (it runs op by op; EMBER_LOG=code says why)";

jit_warm_result jit_warmup(const jit_record *r, kc_cache *cache, const char *target, char *why,
                           size_t nwhy) {
    why[0] = '\0';
    const jit_backend *b = record_backend(r, cache, why, nwhy);
    if (!b) return JIT_WARM_FAILED;
    jit_log quiet = {0};
    quiet.f = stderr;
    /* a named target is the GPU's: CPU records compile for this machine */
    jit_env env = {.cache = cache, .log = &quiet,
                   .target = b->device->type == EM_CUDA ? target : NULL,
                   .autotune = jit_env_autotune(&quiet)}; /* tunes only on the device itself */
    bool dynamic = false;
    if (!compile_record(b, r, &env, &dynamic, why, nwhy)) return JIT_WARM_FAILED;
    if (dynamic) return env.compiled > 0 ? JIT_WARM_COMPILED : JIT_WARM_PRESENT;
    if (env.plans_loaded > 0) return JIT_WARM_PRESENT;
    if (env.plans_stored > 0) return JIT_WARM_COMPILED;
    snprintf(why, nwhy, "%s", NO_COMPILED_FORM);
    return JIT_WARM_FAILED;
}

bool jit_explain(const jit_record *r, kc_cache *cache, const char *target, FILE *out,
                 jit_explained *res, char *why, size_t nwhy) {
    why[0] = '\0';
    memset(res, 0, sizeof *res);
    const jit_backend *b = record_backend(r, cache, why, nwhy);
    if (!b) return false;
    jit_log quiet = {0};
    quiet.f = stderr;
    jit_env env = {.cache = cache, .log = &quiet, .dry_run = true, .explain = out,
                   .target = b->device->type == EM_CUDA ? target : NULL};
    if (!compile_record(b, r, &env, &res->dynamic, why, nwhy)) return false;
    res->plan = env.plans_loaded > 0;
    res->unusable = env.plans_unusable > 0;
    res->kernels = env.loaded + env.missing;
    res->present = env.loaded;
    if (res->dynamic || env.plans_loaded > 0 || env.plans_missing > 0) return true;
    snprintf(why, nwhy, "%s", NO_COMPILED_FORM);
    return false;
}
