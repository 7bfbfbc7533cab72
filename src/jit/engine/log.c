/* log.c - EMBER_LOG: which events a compiled function reports, and where. */
#include "engine.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static const struct {
    const char *name;
    unsigned flag;
} log_names[] = {
    {"graph", JIT_LOG_GRAPH},
    {"guards", JIT_LOG_GUARDS},
    {"recompiles", JIT_LOG_RECOMPILES},
    {"breaks", JIT_LOG_BREAKS},
    {"code", JIT_LOG_CODE},
    {"cache", JIT_LOG_CACHE},
    {"cudagraphs", JIT_LOG_DEVGRAPHS},
    {"tune", JIT_LOG_TUNE},
    {"all", JIT_LOG_GRAPH | JIT_LOG_GUARDS | JIT_LOG_RECOMPILES | JIT_LOG_BREAKS | JIT_LOG_CODE |
                JIT_LOG_CACHE | JIT_LOG_DEVGRAPHS | JIT_LOG_TUNE},
};

void jit_log_open(jit_log *l) {
    memset(l, 0, sizeof *l);
    l->f = stderr;
    char fbuf[EM_ENV_MAX], sbuf[256];
    const char *file = em_getenv("EMBER_LOG_FILE", fbuf, sizeof fbuf);
    if (file && *file) {
        FILE *f = fopen(file, "a");
        if (f) {
            l->f = f;
            l->own = true;
        } else {
            fprintf(stderr, "[ember] cannot open EMBER_LOG_FILE %s: logging to stderr\n", file);
        }
    }
    const char *spec = em_getenv("EMBER_LOG", sbuf, sizeof sbuf);
    if (!spec) return;
    char word[32];
    for (const char *p = spec; *p;) {
        size_t n = strcspn(p, ",");
        if (n > 0 && n < sizeof word) {
            memcpy(word, p, n);
            word[n] = '\0';
            size_t k;
            for (k = 0; k < sizeof log_names / sizeof log_names[0]; k++)
                if (!strcmp(word, log_names[k].name)) break;
            if (k < sizeof log_names / sizeof log_names[0]) l->flags |= log_names[k].flag;
            else fprintf(l->f, "[ember] EMBER_LOG: unknown option '%s' (graph, guards, "
                         "recompiles, breaks, code, cache, cudagraphs, all)\n", word);
        }
        p += n;
        if (*p == ',') p++;
    }
}

void jit_log_close(jit_log *l) {
    if (l->own) fclose(l->f);
    l->f = NULL;
    l->own = false;
}

void jit_logf(const jit_log *l, unsigned flag, const char *fmt, ...) {
    if (!l || !l->f || (flag && !(l->flags & flag))) return;
    va_list ap;
    va_start(ap, fmt);
    fputs("[ember] ", l->f);
    vfprintf(l->f, fmt, ap);
    fputc('\n', l->f);
    va_end(ap);
    fflush(l->f);
}

/* Remote-tier events of the cache, as EMBER_LOG=cache lines. */
static void log_cache_event(void *ud, const char *msg) { jit_logf(ud, JIT_LOG_CACHE, "%s", msg); }

kc_cache *jit_cache_open(const jit_log *l) {
    kc_options o = {.trace = l && (l->flags & JIT_LOG_CACHE) ? log_cache_event : NULL,
                    .trace_ud = (void *)l};
    return kc_open_with(&o);
}
