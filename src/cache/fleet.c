/* fleet.c - what the ember-cache tool does with the remote tier: push a
 * machine's disk entries to it, pull its entries onto the disk, and say
 * what it holds.  Every entry goes through the same paths as at run time
 * (kc_publish signs, kc_fetch checks the signature before the disk sees a
 * byte), so the tool trusts nothing a lookup would not. */
#include "cache.h"

#include "eager.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The remote and disk tiers, or an error naming fn. */
static em_status need_tiers(kc_cache *c, const char *fn) {
    if (!c) return em_error(EM_ERR_NULL, "%s: the cache is NULL", fn);
    if (!kc_remote_of(c))
        return em_error(EM_ERR_STATE, "%s: no remote tier (set EMBER_CACHE_REMOTE and "
                        "EMBER_CACHE_KEY_FILE; a warning above says why if they are set)", fn);
    if (!kc_on_disk(c)) return em_error(EM_ERR_STATE, "%s: the cache has no usable directory", fn);
    return EM_OK;
}

em_status kc_push(kc_cache *c, kc_progress_fn progress, void *ud, uint64_t *pushed) {
    if (!pushed) return em_error(EM_ERR_NULL, "kc_push: pushed is NULL");
    *pushed = 0;
    em_status s = need_tiers(c, "kc_push");
    kc_entry_info *es = NULL;
    size_t n = 0;
    if (s == EM_OK) s = kc_list(c, &es, &n);
    for (size_t i = 0; s == EM_OK && i < n; i++) {
        if (progress) progress(ud, i, n);
        if (!es[i].has_header) continue;
        kc_meta m;
        char why[512];
        void *data = NULL;
        /* read and checked as a lookup would: a bad entry is never published */
        kc_read r = kc_store_read(kc_dir(c), &es[i].key, es[i].kind, &data, &m, why, sizeof why);
        if (r == KC_READ_NOMEM) s = em_error(EM_ERR_NOMEM, "kc_push: out of memory");
        if (r != KC_READ_OK) continue;
        kc_remote_status st = kc_publish(c, &es[i].key, es[i].kind, data, (size_t)m.size, true);
        em_free(data);
        if (st == KC_REMOTE_OK) (*pushed)++;
        else s = em_error(EM_ERR_IO, "kc_push: the remote tier %s failed after %" PRIu64
                          " entries (the warning above says how)", kc_remote_url(c), *pushed);
    }
    if (progress && s == EM_OK) progress(ud, n, n);
    em_free(es);
    return s;
}

/* The names a SCAN returned, "<32 hex>.<kind>". */
typedef struct names {
    char (*v)[KC_KEY_HEX_SIZE + KC_KIND_MAX + 1];
    size_t n, cap;
    bool nomem;
} names;

static void add_name(void *ud, const char *name) {
    names *l = ud;
    if (l->nomem || strlen(name) >= sizeof l->v[0]) return; /* not one of ours */
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        void *v = em_malloc(cap * sizeof l->v[0]);
        if (!v) {
            l->nomem = true;
            return;
        }
        if (l->n) memcpy(v, l->v, l->n * sizeof l->v[0]);
        em_free(l->v);
        l->v = v;
        l->cap = cap;
    }
    strcpy(l->v[l->n++], name);
}

/* "<32 hex>.<kind>" into its key and kind; false for anything else. */
static bool split_name(const char *name, kc_key *k, char *kind) {
    char hex[KC_KEY_HEX_SIZE];
    if (strlen(name) < KC_KEY_HEX_SIZE || name[KC_KEY_HEX_SIZE - 1] != '.') return false;
    memcpy(hex, name, KC_KEY_HEX_SIZE - 1);
    hex[KC_KEY_HEX_SIZE - 1] = '\0';
    const char *kd = name + KC_KEY_HEX_SIZE;
    if (!kc_key_from_hex(hex, k) || !kc_kind_valid(kd)) return false;
    strcpy(kind, kd);
    return true;
}

static em_status scan_names(kc_cache *c, const char *fn, names *l) {
    char why[1024] = "";
    kc_remote_status st = kc_remote_scan(kc_remote_of(c), add_name, l, why, sizeof why);
    if (l->nomem) return em_error(EM_ERR_NOMEM, "%s: out of memory", fn);
    if (st != KC_REMOTE_OK) return em_error(EM_ERR_IO, "%s: %s", fn, why);
    return EM_OK;
}

em_status kc_pull(kc_cache *c, kc_progress_fn progress, void *ud, uint64_t *fetched,
                  uint64_t *present, uint64_t *rejected) {
    if (!fetched || !present || !rejected) return em_error(EM_ERR_NULL, "kc_pull: a count is NULL");
    *fetched = *present = *rejected = 0;
    em_status s = need_tiers(c, "kc_pull");
    names l = {0};
    if (s == EM_OK) s = scan_names(c, "kc_pull", &l);
    for (size_t i = 0; s == EM_OK && i < l.n; i++) {
        if (progress) progress(ud, i, l.n);
        kc_key k;
        char kind[KC_KIND_MAX + 1], why[512];
        if (!split_name(l.v[i], &k, kind)) continue;
        kc_meta m;
        kc_read r = kc_store_read(kc_dir(c), &k, kind, NULL, &m, why, sizeof why);
        if (r == KC_READ_OK) {
            (*present)++;
            continue;
        }
        kc_counters before, after;
        kc_stats(c, &before);
        r = kc_fetch(c, &k, kind);
        kc_stats(c, &after);
        if (r == KC_READ_OK) (*fetched)++;
        else if (r == KC_READ_REFUSED || r == KC_READ_CORRUPT) (*rejected)++;
        else if (r == KC_READ_NOMEM) s = em_error(EM_ERR_NOMEM, "kc_pull: out of memory");
        else if (after.remote_errors > before.remote_errors)
            s = em_error(EM_ERR_IO, "kc_pull: the remote tier %s failed after %" PRIu64
                         " entries (the warning above says how)", kc_remote_url(c), *fetched);
    }
    if (progress && s == EM_OK) progress(ud, l.n, l.n);
    em_free(l.v);
    return s;
}

/* Adds one entry to the table of kinds (the first 16 kinds seen). */
static void add_kind(kc_remote_info *out, const char *kind, uint64_t bytes) {
    int i = 0;
    while (i < out->nkinds && strcmp(out->kinds[i].kind, kind) != 0) i++;
    if (i == out->nkinds) {
        if (out->nkinds == (int)(sizeof out->kinds / sizeof out->kinds[0])) return;
        snprintf(out->kinds[out->nkinds++].kind, sizeof out->kinds[0].kind, "%s", kind);
    }
    out->kinds[i].entries++;
    out->kinds[i].bytes += bytes;
}

static int by_count(const void *a, const void *b) {
    const kc_remote_kind *x = a, *y = b;
    return x->entries < y->entries ? 1 : x->entries > y->entries ? -1 : strcmp(x->kind, y->kind);
}

em_status kc_remote_stats(kc_cache *c, kc_remote_info *out) {
    if (!out) return em_error(EM_ERR_NULL, "kc_remote_stats: out is NULL");
    memset(out, 0, sizeof *out);
    if (!c) return em_error(EM_ERR_NULL, "kc_remote_stats: the cache is NULL");
    if (!kc_remote_of(c)) return need_tiers(c, "kc_remote_stats");
    char why[1024] = "";
    if (kc_remote_version(kc_remote_of(c), out->server, sizeof out->server, why, sizeof why) !=
        KC_REMOTE_OK)
        return em_error(EM_ERR_IO, "kc_remote_stats: %s", why);
    names l = {0};
    em_status s = scan_names(c, "kc_remote_stats", &l);
    for (size_t i = 0; s == EM_OK && i < l.n; i++) {
        kc_key k;
        char kind[KC_KIND_MAX + 1];
        uint64_t bytes = 0;
        if (!split_name(l.v[i], &k, kind)) continue;
        if (kc_remote_strlen(kc_remote_of(c), l.v[i], &bytes, why, sizeof why) != KC_REMOTE_OK)
            s = em_error(EM_ERR_IO, "kc_remote_stats: %s", why);
        out->entries++;
        out->bytes += bytes;
        add_kind(out, kind, bytes);
    }
    qsort(out->kinds, (size_t)out->nkinds, sizeof out->kinds[0], by_count);
    em_free(l.v);
    return s;
}
