/* kernels.c - the one kernel cache sequence (engine.h): key -> the
 * device's loaded table -> the disk cache -> compile -> verified store ->
 * load, for every device.
 *
 * An artifact is always loaded from the cache's verified bytes (a sealed
 * memory file, kc_get_fd) once it is stored, never from the file the
 * compiler wrote, and the device checks the key embedded in it: a file
 * swapped in the cache directory, or filed under another kernel's key, is
 * a miss and is compiled again. */
#include "engine.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Per thread by nature: which thread runs a compile. */
static _Thread_local bool background_thread;

void jit_set_background_thread(void) { background_thread = true; }

bool jit_on_background_thread(void) { return background_thread; }

double jit_compile_timeout(const jit_log *log) {
    char buf[64];
    const char *e = em_getenv("EMBER_COMPILE_TIMEOUT", buf, sizeof buf);
    if (!e || !*e) return JIT_COMPILE_TIMEOUT;
    char *end;
    double v = strtod(e, &end);
    if (*end || !(v > 0) || v > 1e6) {
        if (log) jit_logf(log, 0, "EMBER_COMPILE_TIMEOUT=%s is not a number of seconds: using %g", e,
                          (double)JIT_COMPILE_TIMEOUT);
        return JIT_COMPILE_TIMEOUT;
    }
    return v;
}

bool jit_kernel_key(const char *name, const char *target, const k_kernel *k, kc_key *key,
                    kc_manifest *m) {
    char *text = kir_to_text(k);
    if (!text) return false;
    kc_fields fl;
    kc_fields_begin(&fl, m);
    kc_fields_str(&fl, "what", "ember kernel");
    kc_fields_str(&fl, "device", name);
    kc_fields_str(&fl, "target", target);
    kc_fields_str(&fl, "kernel_ir", text);
    *key = kc_fields_digest(&fl);
    em_free(text);
    return true;
}

/* Whether the disk cache holds a verified artifact under key. */
static bool present(const jit_device *d, jit_env *env, const kc_key *key) {
    int fd = -1;
    bool ok = env->cache && kc_get_fd(env->cache, key, d->kind, &fd) == EM_OK && fd >= 0;
    if (fd >= 0) close(fd);
    em_clear_error();
    return ok;
}

/* The kernel filed under key in the disk cache, loaded; NULL on a miss
 * (absent, bad, or another key's artifact: logged). */
static jit_kernel *load_cached(const jit_device *d, int index, jit_env *env, const kc_key *key) {
    int fd = -1;
    if (kc_get_fd(env->cache, key, d->kind, &fd) != EM_OK || fd < 0) {
        em_clear_error();
        return NULL;
    }
    jit_kernel *k = NULL;
    jit_blob b = {.fd = fd};
    em_status s = d->load(index, &b, key, &k);
    close(fd);
    if (s == EM_OK) return k;
    jit_logf(env->log, JIT_LOG_CACHE, "cache entry unusable, a miss: %s", em_last_error());
    em_clear_error();
    return NULL;
}

/* The kernel under key: loaded from the device's table or the disk cache (*out),
 * or, for a named target or a dry run, only present there; false on a miss
 * (the caller logs it). */
static bool lookup(const jit_device *d, int index, jit_env *env, const k_kernel *k, const kc_key *key,
                   jit_kernel **out) {
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(key, hex);
    *out = NULL;
    if (env->target || env->dry_run) { /* nothing to load: present or not */
        bool have = present(d, env, key);
        if (have) env->loaded++;
        if (have) jit_logf(env->log, JIT_LOG_CACHE, "cache hit: kernel %s (%s), %s", k->name, hex,
                           env->target ? env->target : "present");
        return have;
    }
    jit_kernel *got = d->find ? d->find(index, key) : NULL;
    if (!got && env->cache && (got = load_cached(d, index, env, key)) && d->add)
        d->add(index, key, got); /* the next lookup (every eager CUDA op) finds it loaded */
    if (got) {
        env->loaded++;
        jit_logf(env->log, JIT_LOG_CACHE, "cache hit: kernel %s (%s)", k->name, hex);
        *out = got;
        return true;
    }
    return false;
}

/* After a miss of k under key: its manifest into *m (for the store after
 * the compile; left empty without a cache), and the miss logged with why
 * it missed (EMBER_LOG=cache; a dry run's explain). */
static void note_miss(const jit_device *d, jit_env *env, const char *target, const k_kernel *k,
                      const kc_key *key, kc_manifest *m) {
    kc_key again;
    bool have = env->cache && d->key(k, target, &again, m) && !m->failed && kc_key_equal(&again, key);
    if (!have) kc_manifest_clear(m); /* (out of memory: no manifest, no explanation) */
    em_clear_error();
    char what[96];
    snprintf(what, sizeof what, "kernel %s", k->name);
    bool wanted = (env->log && (env->log->flags & JIT_LOG_CACHE)) || (env->dry_run && env->explain);
    if (have && wanted) {
        jit_explain_miss(env, what, m, d->kind);
    } else {
        char hex[KC_KEY_HEX_SIZE];
        kc_key_hex(key, hex);
        jit_logf(env->log, JIT_LOG_CACHE, "cache miss: %s (%s)", what, hex);
    }
}

void jit_explain_miss(const jit_env *env, const char *what, const kc_manifest *want,
                      const char *kind) {
    bool log = env->log && (env->log->flags & JIT_LOG_CACHE);
    FILE *to = env->dry_run ? env->explain : NULL;
    if (!log && !to) return; /* kc_explain reads every manifest of the kind */
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(&want->key, hex);
    char *why = kc_explain(env->cache, want, kind);
    const char *text = why ? why : "(not explained: out of memory)";
    jit_logf(env->log, JIT_LOG_CACHE, "cache miss: %s (%s): %s", what, hex, text);
    if (to) fprintf(to, "%s (%s): %s\n", what, hex, text);
    em_free(why);
    em_clear_error();
}

void jit_store_manifest(const jit_env *env, const kc_manifest *m, const char *kind) {
    if (env->cache && m->n > 0 && !m->failed) (void)kc_put_manifest(env->cache, m, kind);
    em_clear_error(); /* a manifest not stored only costs a later miss its explanation */
}

static void artifact_clear(jit_artifact *a) {
    if (a->path) unlink(a->path); /* already moved into the cache when stored */
    em_free(a->path);
    em_free(a->bytes);
    memset(a, 0, sizeof *a);
}

/* Loads an artifact that is not in the cache (no cache, or the store
 * failed): from its file or bytes, still checked for key. */
static em_status load_direct(const jit_device *d, int index, const jit_artifact *a,
                             const kc_key *key, jit_kernel **out) {
    jit_blob b = {.fd = -1, .bytes = a->bytes, .n = a->n};
    if (a->path && (b.fd = open(a->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0)
        return em_error(EM_ERR_STATE, "%s: cannot open %s: %s", d->name, a->path, strerror(errno));
    em_status s = d->load(index, &b, key, out);
    if (b.fd >= 0) close(b.fd);
    return s;
}

/* Stores artifact a under key (logged), then loads it back from the
 * cache; without a cache (or when the store fails), loads it directly. */
static em_status store_and_load(const jit_device *d, int index, jit_env *env, const k_kernel *k,
                                const kc_key *key, const kc_manifest *m, jit_artifact *a,
                                jit_kernel **out) {
    if (a->loaded) {
        *out = a->loaded;
        a->loaded = NULL;
        return EM_OK;
    }
    em_status s = EM_ERR_STATE;
    if (env->cache)
        s = a->path ? kc_put_file(env->cache, key, d->kind, a->path)
                    : kc_put(env->cache, key, d->kind, a->bytes, a->n);
    if (s == EM_OK) {
        char hex[KC_KEY_HEX_SIZE];
        kc_key_hex(key, hex);
        jit_logf(env->log, JIT_LOG_CACHE, "cache write: kernel %s (%s)", k->name, hex);
        jit_store_manifest(env, m, d->kind);
        if (env->target) return EM_OK; /* compiled for another machine: not loaded */
        if ((*out = load_cached(d, index, env, key))) return EM_OK;
        return em_error(EM_ERR_STATE, "%s: kernel %s not loadable from the cache after its write",
                        d->name, k->name);
    }
    em_clear_error(); /* a cache that fails only costs the next process a compile */
    if (env->target) return em_error(EM_ERR_STATE, "%s: kernel %s for %s not stored", d->name, k->name,
                                     env->target);
    return load_direct(d, index, a, key, out);
}

/* The index of key among keys[0..n), or -1. */
static int find_key(const kc_key *keys, int n, const kc_key *key) {
    for (int t = 0; t < n; t++)
        if (kc_key_equal(&keys[t], key)) return t;
    return -1;
}

/* A dry run's end: each miss counted (explained at its lookup), each
 * duplicate of a miss too; nothing compiled. */
static void count_missing(jit_env *env, const int *dup, int n, int m) {
    env->missing += m;
    for (int i = 0; i < n; i++) env->missing += dup[i] >= 0;
}

/* The misses miss[0..m) compiled together (each artifact then stored and
 * loaded into out[at[t]]); the ones not compiled are logged by the device
 * and checked by the caller. */
static em_status compile_misses(const jit_device *d, int index, jit_env *env, const char *target,
                                k_kernel **miss, const kc_key *mkeys, const int *at,
                                const jit_params *params, const kc_manifest *mans,
                                jit_artifact *arts, int m, jit_kernel **out) {
    if (m == 0) return EM_OK;
    jit_params *mp = params ? em_calloc((size_t)m, sizeof *mp) : NULL; /* by miss */
    if (params && !mp) return em_last_status();
    for (int t = 0; mp && t < m; t++) mp[t] = params[at[t]];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    em_status s = d->compile(index, target, miss, mkeys, mp, m, env, arts);
    em_free(mp);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    jit_logf(env->log, JIT_LOG_CACHE, "%s: %d kernel%s compiled in %.1f ms", d->name, m, m == 1 ? "" : "s",
             1e3 * (double)(t1.tv_sec - t0.tv_sec) + 1e-6 * (double)(t1.tv_nsec - t0.tv_nsec));
    for (int t = 0; s == EM_OK && t < m; t++) {
        if (!arts[t].path && !arts[t].bytes && !arts[t].loaded) continue; /* not compiled: logged */
        env->compiled++;
        s = store_and_load(d, index, env, miss[t], &mkeys[t], &mans[t], &arts[t], &out[at[t]]);
        if (s == EM_OK && out[at[t]] && d->add) d->add(index, &mkeys[t], out[at[t]]);
    }
    return s;
}

/* Swaps misses t and u (every per-miss array). */
static void swap_miss(k_kernel **miss, kc_key *mkeys, int *at, kc_manifest *mans, int *claim, int t,
                      int u) {
    k_kernel *k = miss[t];
    kc_key key = mkeys[t];
    int a = at[t], c = claim[t];
    kc_manifest man = mans[t];
    miss[t] = miss[u], mkeys[t] = mkeys[u], at[t] = at[u], claim[t] = claim[u], mans[t] = mans[u];
    miss[u] = k, mkeys[u] = key, at[u] = a, claim[u] = c, mans[u] = man;
}

/* Claims each of the *m misses (cache.h), so that a kernel another
 * thread or process is compiling now is not compiled twice: the misses it
 * holds move to the end, and their count is returned; claim[t] is the
 * claim's lock (-1: none).  A miss stored by another compile between its
 * lookup and its claim is loaded now and dropped from the misses (*m). */
static int claim_misses(const jit_device *d, int index, jit_env *env, k_kernel **miss, kc_key *mkeys,
                        int *at, kc_manifest *mans, int *claim, int *m, jit_kernel **out) {
    int busy = 0;
    for (int t = 0; t < *m; t++) claim[t] = -1;
    for (int t = *m - 1; env->cache && t >= 0; t--) {
        kc_claim_result r = kc_claim(env->cache, &mkeys[t], d->kind, 0, &claim[t]);
        if (r == KC_CLAIM_BUSY) {
            swap_miss(miss, mkeys, at, mans, claim, t, *m - 1 - busy++);
        } else if (r == KC_CLAIM_OURS && lookup(d, index, env, miss[t], &mkeys[t], &out[at[t]])) {
            kc_release(claim[t]);
            claim[t] = -1;
            kc_manifest_clear(&mans[t]);
            swap_miss(miss, mkeys, at, mans, claim, t, *m - 1 - busy); /* the last one claimed */
            if (busy) swap_miss(miss, mkeys, at, mans, claim, *m - 1 - busy, *m - 1);
            (*m)--;
        }
    }
    return busy;
}

/* The misses another compile held (claim_misses): each waited for (at
 * most a compile's timeout), then looked up again; one still missing (that
 * compile failed, or outlasted the wait) is compiled here.  One at a time,
 * each claim released before the next wait, so that no claim is held
 * while waiting for another. */
static em_status await_misses(const jit_device *d, int index, jit_env *env, const char *target,
                              k_kernel **miss, const kc_key *mkeys, const int *at,
                              const jit_params *params, const kc_manifest *mans,
                              jit_artifact *arts, int busy, jit_kernel **out) {
    em_status s = EM_OK;
    double wait = jit_compile_timeout(env->log);
    for (int t = 0; s == EM_OK && t < busy; t++) {
        int fd = -1;
        (void)kc_claim(env->cache, &mkeys[t], d->kind, wait, &fd);
        if (lookup(d, index, env, miss[t], &mkeys[t], &out[at[t]]))
            jit_logf(env->log, JIT_LOG_CACHE, "kernel %s: compiled by another thread or process",
                     miss[t]->name);
        else
            s = compile_misses(d, index, env, target, &miss[t], &mkeys[t], &at[t], params, &mans[t],
                               &arts[t], 1, out);
        kc_release(fd);
    }
    return s;
}

em_status jit_get_kernels(const jit_device *d, int index, jit_env *env, k_kernel *const *ks,
                          const kc_key *keys, int n, jit_kernel **out) {
    return jit_get_kernels_with(d, index, env, ks, keys, NULL, n, out);
}

em_status jit_get_kernels_with(const jit_device *d, int index, jit_env *env, k_kernel *const *ks,
                               const kc_key *keys, const jit_params *params, int n,
                               jit_kernel **out) {
    char target[256];
    if (!d->target(index, env, target, sizeof target)) return em_last_status();
    k_kernel **miss = em_calloc((size_t)n + 1, sizeof *miss);
    kc_key *mkeys = em_calloc((size_t)n + 1, sizeof *mkeys);
    int *at = em_calloc((size_t)n + 1, sizeof *at);
    int *claim = em_calloc((size_t)n + 1, sizeof *claim);
    jit_artifact *arts = em_calloc((size_t)n + 1, sizeof *arts);
    kc_manifest *mans = em_calloc((size_t)n + 1, sizeof *mans); /* per miss: stored beside it */
    em_status s = miss && mkeys && at && claim && arts && mans ? EM_OK : em_last_status();
    /* identical kernels of one graph (a model's repeated layers) compile
     * once: the others are looked up again once it is stored (or, for a
     * named target, are present then) */
    int *dup = em_malloc(sizeof(int) * ((size_t)n + 1));
    bool dedupe = env->cache || d->find || env->target;
    if (s == EM_OK && !dup) s = em_last_status();
    int m = 0, busy = 0;
    for (int i = 0; s == EM_OK && i < n; i++) {
        out[i] = NULL;
        dup[i] = -1;
        if (!ks[i]) continue; /* a dead group */
        if (dedupe && (dup[i] = find_key(mkeys, m, &keys[i])) >= 0) continue;
        if (lookup(d, index, env, ks[i], &keys[i], &out[i])) continue; /* loaded, or present for a target */
        note_miss(d, env, target, ks[i], &keys[i], &mans[m]);
        miss[m] = ks[i], mkeys[m] = keys[i], at[m] = i;
        m++;
    }
    if (s == EM_OK && env->dry_run) count_missing(env, dup, n, m);
    if (s == EM_OK && m > 0 && !env->dry_run) {
        busy = claim_misses(d, index, env, miss, mkeys, at, mans, claim, &m, out);
        s = compile_misses(d, index, env, target, miss, mkeys, at, params, mans, arts, m - busy, out);
        for (int t = 0; t < m - busy; t++) kc_release(claim[t]);
        if (s == EM_OK)
            s = await_misses(d, index, env, target, miss + m - busy, mkeys + m - busy, at + m - busy,
                             params, mans + m - busy, arts + m - busy, busy, out);
    }
    for (int t = 0; s == EM_OK && !env->dry_run && t < m; t++) /* not compiled (logged): the graph runs op by op */
        if (env->target ? !arts[t].path && !arts[t].bytes && !present(d, env, &mkeys[t]) : !out[at[t]])
            s = em_error(EM_ERR_UNSUPPORTED, "%s: kernel %s was not compiled", d->name, miss[t]->name);
    for (int i = 0; s == EM_OK && !env->target && !env->dry_run && i < n; i++)
        if (dup[i] >= 0 && !lookup(d, index, env, ks[i], &keys[i], &out[i]))
            s = em_error(EM_ERR_UNSUPPORTED, "%s: kernel %s was not compiled", d->name, ks[i]->name);
    for (int t = 0; arts && t < m; t++) {
        if (arts[t].loaded && d->unload) d->unload(arts[t].loaded);
        artifact_clear(&arts[t]);
        kc_manifest_clear(&mans[t]);
    }
    em_free(miss);
    em_free(mkeys);
    em_free(at);
    em_free(claim);
    em_free(arts);
    em_free(mans);
    em_free(dup);
    return s;
}

bool jit_load_kernels(const jit_device *d, int index, jit_env *env, const kc_key *keys,
                      const bool *live, int n, jit_kernel **out) {
    bool ok = true;
    for (int i = 0; i < n; i++) out[i] = NULL;
    for (int i = 0; ok && i < n; i++) {
        if (!live[i]) continue;
        if (env->target || env->dry_run) { /* nothing to load */
            ok = present(d, env, &keys[i]);
            continue;
        }
        out[i] = d->find ? d->find(index, &keys[i]) : NULL;
        if (!out[i] && env->cache && (out[i] = load_cached(d, index, env, &keys[i])) && d->add)
            d->add(index, &keys[i], out[i]);
        ok = out[i] != NULL;
    }
    if (ok) return true;
    for (int i = 0; i < n; i++) {
        if (out[i] && d->unload) d->unload(out[i]);
        out[i] = NULL;
    }
    return false;
}
