/* warmup.c - compiling a recorded graph ahead of time (ember-cache warmup):
 * the graph is parsed with stand-ins for its constants (their values never
 * reach a kernel: constants are buffer arguments), then handed to its
 * backend's compile exactly as em_compile would, which stores the graph's
 * plan and kernels in the cache. */
#include "jit.h"

#include <string.h>

const char *jit_backend_target(const jit_backend *b) { return b && b->target ? b->target() : NULL; }

jit_warm_result jit_warmup(const jit_record *r, kc_cache *cache, char *why, size_t nwhy) {
    why[0] = '\0';
    const jit_backend *b = r && r->backend ? jit_backend_find(r->backend) : NULL;
    if (!b || !b->target) {
        snprintf(why, nwhy, "backend '%s' has nothing to compile ahead of time",
                 r && r->backend ? r->backend : "(none)");
        return JIT_WARM_FAILED;
    }
    if (!cache || !kc_on_disk(cache)) {
        snprintf(why, nwhy, "no cache directory to compile into");
        return JIT_WARM_FAILED;
    }
    tr_graph *g = tr_parse_placeholders(r->graph);
    if (!g) {
        snprintf(why, nwhy, "%s", em_last_error());
        em_clear_error();
        return JIT_WARM_FAILED;
    }
    jit_log quiet = {0};
    quiet.f = stderr;
    jit_env env = {.cache = cache, .log = &quiet};
    void *state = NULL;
    em_status s = b->compile(g, &env, &state);
    if (s != EM_OK) snprintf(why, nwhy, "%s", em_last_error());
    if (state) b->free(state);
    tr_graph_free(g);
    em_clear_error();
    if (s != EM_OK) return JIT_WARM_FAILED;
    if (env.plans_loaded > 0) return JIT_WARM_PRESENT;
    if (env.plans_stored > 0) return JIT_WARM_COMPILED;
    snprintf(why, nwhy, "the graph has no compiled form (it runs op by op; EMBER_LOG=code says why)");
    return JIT_WARM_FAILED;
}
