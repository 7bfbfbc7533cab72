/* cache.c - the cache object: configuration from the environment, the
 * memory tier (a hash table of entries), the public get/put calls that
 * combine it with the disk tier (store.c) and the remote tier (remote.c,
 * seal.c), warnings and statistics. */
#include "cache.h"

#include "eager.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* One (key, kind) the process knows.  data and path describe the same
 * payload (size bytes, checksum sum); either may be missing.  An entry with
 * neither is a leftover of an eviction and counts as absent. */
typedef struct kc_entry {
    kc_key key;
    char kind[KC_KIND_MAX + 1];
    void *data;       /* the payload, or NULL */
    uint64_t size;
    kc_sum sum;
    char *path;       /* a verified file holding the payload, or NULL */
    bool in_session;  /* path is in the session directory (kc_close removes it) */
    bool remote_bad;  /* the remote tier's copy was damaged: our put replaces it */
} kc_entry;

/* Warnings, each printed once per cache object. */
enum {
    W_DIR = 1 << 0,      /* the disk tier could not be used at open */
    W_WRITE = 1 << 1,    /* a write failed: memory-only from then on */
    W_CORRUPT = 1 << 2,  /* an entry failed verification */
    W_REFUSED = 1 << 3,  /* an entry failed the trust checks */
    W_SIZE = 1 << 4,     /* EMBER_CACHE_MAX_SIZE unreadable */
    W_PRUNE = 1 << 5,    /* pruning failed */
    W_SESSION = 1 << 6,  /* no session directory for a memory-only file */
    W_NOMEM = 1 << 7,    /* out of memory locating the directory (retried) */
    W_LOAD = 1 << 8,     /* no memory file to load code from */
    W_REMOTE_CFG = 1 << 9,  /* the remote tier is configured but cannot be used */
    W_REMOTE_DOWN = 1 << 10, /* a remote call failed */
    W_REMOTE_BAD = 1 << 11   /* a remote entry was rejected */
};

struct kc_cache {
    pthread_mutex_t lock;      /* held by every public call */
    const em_allocator *alloc; /* made everything the cache owns */
    char *dir;                 /* absolute cache directory; NULL: never had a disk tier */
    bool disk;                 /* entries go to and come from dir */
    char *session;             /* memory-only files (mkdtemp); made on first need */
    kc_log_fn log;
    void *log_ud;
    kc_log_fn trace;           /* remote events (EMBER_LOG=cache), or NULL */
    void *trace_ud;
    kc_remote *remote;         /* the remote tier, or NULL; set at open */
    kc_seal_key *seal;         /* its signing key (with remote) */
    char *want;                /* the directory kc_open was given (a copy), or NULL */
    bool retry;                /* the directory could not be located for want of
                                  memory: the next call tries again */
    unsigned warned;           /* W_* already printed */
    uint64_t max_size;         /* prune to this after puts; 0: no limit */
    int64_t disk_bytes;        /* the disk tier's size as of the last prune plus
                                  our writes since; -1: unknown */
    kc_entry **slots;          /* open addressing, linear probing; cap a power of 2 */
    size_t cap, count;
    kc_counters st;
};

/* ---- memory the cache owns: through the allocator it was made with ---- */

static void *own_alloc(kc_cache *c, size_t n) {
    return c->alloc->alloc(c->alloc->ud, n ? n : 1, 64);
}

static void own_free(kc_cache *c, void *p) { em_free_with(c->alloc, p); }

static char *own_strdup(kc_cache *c, const char *s) {
    size_t n = strlen(s) + 1;
    char *d = own_alloc(c, n);
    if (d) memcpy(d, s, n);
    return d;
}

/* A copy for the caller, from em_malloc. */
static char *caller_strdup(const char *s) { return kc_strfmt("%s", s); }

/* ---- warnings ---- */

static void warn(kc_cache *c, unsigned what, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void warn(kc_cache *c, unsigned what, const char *fmt, ...) {
    if (c->warned & what) return;
    c->warned |= what;
    char msg[1024]; /* a message: a long path in it may be cut */
    int n = snprintf(msg, sizeof msg, "cache: ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    if (c->log) c->log(c->log_ud, msg);
    else fprintf(stderr, "[ember] %s\n", msg);
}

/* ---- the memory table ---- */

static size_t slot_of(const kc_cache *c, const kc_key *k, const char *kind) {
    uint64_t h;
    memcpy(&h, k->bytes, sizeof h); /* a key is already a good hash */
    for (const char *p = kind; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001b3ull;
    return (size_t)(h ^ h >> 29) & (c->cap - 1);
}

static kc_entry *table_find(kc_cache *c, const kc_key *k, const char *kind) {
    if (!c->cap) return NULL;
    for (size_t i = slot_of(c, k, kind);; i = (i + 1) & (c->cap - 1)) {
        kc_entry *e = c->slots[i];
        if (!e) return NULL;
        if (kc_key_equal(&e->key, k) && !strcmp(e->kind, kind)) return e;
    }
}

static bool table_grow(kc_cache *c) {
    size_t cap = c->cap ? 2 * c->cap : 64;
    kc_entry **slots = own_alloc(c, cap * sizeof *slots);
    if (!slots) return false;
    memset(slots, 0, cap * sizeof *slots);
    kc_entry **old = c->slots;
    size_t oldcap = c->cap;
    c->slots = slots;
    c->cap = cap;
    for (size_t i = 0; i < oldcap; i++) {
        if (!old[i]) continue;
        size_t j = slot_of(c, &old[i]->key, old[i]->kind);
        while (slots[j]) j = (j + 1) & (cap - 1);
        slots[j] = old[i];
    }
    own_free(c, old);
    return true;
}

/* The entry of (k, kind), added empty if new; NULL when out of memory. */
static kc_entry *table_add(kc_cache *c, const kc_key *k, const char *kind) {
    kc_entry *e = table_find(c, k, kind);
    if (e) return e;
    if ((c->count + 1) * 10 > c->cap * 7 && !table_grow(c)) return NULL; /* load <= 0.7 */
    e = own_alloc(c, sizeof *e);
    if (!e) return NULL;
    memset(e, 0, sizeof *e);
    e->key = *k;
    strcpy(e->kind, kind); /* kind was checked: at most KC_KIND_MAX */
    size_t i = slot_of(c, k, kind);
    while (c->slots[i]) i = (i + 1) & (c->cap - 1);
    c->slots[i] = e;
    c->count++;
    return e;
}

static void entry_drop_path(kc_cache *c, kc_entry *e) {
    if (e->path && e->in_session) (void)unlink(e->path);
    own_free(c, e->path);
    e->path = NULL;
    e->in_session = false;
}

static void entry_drop_data(kc_cache *c, kc_entry *e) {
    own_free(c, e->data);
    e->data = NULL;
}

/* Makes e describe a payload of (size, sum): what it held of another
 * payload goes. */
static void entry_describe(kc_cache *c, kc_entry *e, uint64_t size, const kc_sum *sum) {
    if (e->size != size || memcmp(e->sum.bytes, sum->bytes, sizeof sum->bytes) != 0) {
        entry_drop_data(c, e);
        entry_drop_path(c, e);
    }
    e->size = size;
    e->sum = *sum;
}

/* Sets e's file to path (copied); false when out of memory. */
static bool entry_set_path(kc_cache *c, kc_entry *e, const char *path, bool in_session) {
    char *p = own_strdup(c, path);
    if (!p) return false;
    if (e->path && e->in_session && !in_session) (void)unlink(e->path);
    own_free(c, e->path);
    e->path = p;
    e->in_session = in_session;
    return true;
}

/* ---- opening ---- */

static bool env_off(const char *v) {
    return v && (!strcmp(v, "0") || !strcasecmp(v, "off") || !strcasecmp(v, "no") ||
                 !strcasecmp(v, "false"));
}

/* Whether variable name is set at all (em_getenv cannot tell an unset
 * variable from one too long for its buffer). */
static bool env_present(const char *name) {
    em_env_lock(false);
    bool set = getenv(name) != NULL;
    em_env_unlock();
    return set;
}

/* How locating the cache directory went. */
typedef enum dir_found {
    DIR_FOUND,  /* *out holds it */
    DIR_NONE,   /* nothing configured: no EMBER_CACHE_DIR, XDG_CACHE_HOME or HOME */
    DIR_BAD,    /* a configured location that cannot be used: why says which */
    DIR_NOMEM   /* out of memory: worth trying again later */
} dir_found;

/* Reads variable name into buf (*v NULL when unset); false with why when it
 * is set but too long to be a path, so that it is reported rather than
 * skipped for the next location (the rule: a configured location that
 * cannot be used never silently becomes another one). */
static bool read_var(const char *name, char *buf, const char **v, char *why, size_t nwhy) {
    *v = em_getenv(name, buf, EM_ENV_MAX);
    if (*v || !env_present(name)) return true;
    snprintf(why, nwhy, "cannot use %s: longer than the %d bytes a path may have", name,
             EM_ENV_MAX - 1);
    return false;
}

/* Where the cache lives when kc_open is given no directory, first set
 * first: a variable and what to append to its value. */
static const struct {
    const char *var, *suffix;
    bool absolute; /* a relative value is ignored (the XDG spec says so) */
} LOCATIONS[] = {
    {"EMBER_CACHE_DIR", "", false},
    {"XDG_CACHE_HOME", "/ember", true},
    {"HOME", "/.cache/ember", false},
};

/* The directory to use (em_malloc'd) in *out: dir, else the environment's. */
static dir_found resolve_dir(const char *dir, char **out, char *why, size_t nwhy) {
    *out = NULL;
    if (dir && *dir) return (*out = kc_strfmt("%s", dir)) ? DIR_FOUND : DIR_NOMEM;
    char *buf = em_malloc(EM_ENV_MAX);
    if (!buf) return DIR_NOMEM;
    dir_found r = DIR_NONE;
    for (size_t i = 0; i < sizeof LOCATIONS / sizeof LOCATIONS[0] && r == DIR_NONE; i++) {
        const char *v;
        if (!read_var(LOCATIONS[i].var, buf, &v, why, nwhy)) r = DIR_BAD;
        else if (v && (LOCATIONS[i].absolute ? v[0] == '/' : v[0] != '\0'))
            r = (*out = kc_strfmt("%s%s", v, LOCATIONS[i].suffix)) ? DIR_FOUND : DIR_NOMEM;
    }
    em_free(buf);
    return r;
}

/* Locates and opens the disk tier.  Out of memory is not a verdict on the
 * directory: it is reported and retried on a later call (c->retry). */
static void open_disk(kc_cache *c) {
    char why[1024] = "";
    char *d = NULL, *root = NULL;
    dir_found f = resolve_dir(c->want, &d, why, sizeof why);
    c->retry = false;
    if (f == DIR_FOUND && kc_store_open(d, &root, why, sizeof why)) {
        c->dir = own_strdup(c, root);
        c->disk = c->dir != NULL;
        if (!c->disk) f = DIR_NOMEM;
    } else if (f == DIR_FOUND) {
        f = !strcmp(why, "out of memory") ? DIR_NOMEM : DIR_BAD;
    }
    if (f == DIR_NOMEM) {
        c->retry = true;
        em_clear_error();
        warn(c, W_NOMEM, "out of memory locating the cache directory: keeping compiled kernels "
             "in memory until a later call finds it");
    } else if (f == DIR_NONE) {
        warn(c, W_DIR, "no cache directory (set EMBER_CACHE_DIR or HOME): keeping compiled "
             "kernels in memory only");
    } else if (!c->disk) {
        warn(c, W_DIR, "%s: keeping compiled kernels in memory only", why);
    }
    em_free(root);
    em_free(d);
}

/* Called by every lookup and put: a disk tier that could not be had for
 * want of memory is tried again. */
static void retry_disk(kc_cache *c) {
    if (c->retry && !c->disk) open_disk(c);
}

/* EMBER_CACHE_MAX_SIZE into c->max_size; a value that is not a size (or
 * too long to read) is reported, never silently ignored. */
static void read_max_size(kc_cache *c) {
    char buf[128];
    const char *v = em_getenv("EMBER_CACHE_MAX_SIZE", buf, sizeof buf);
    if (!v && env_present("EMBER_CACHE_MAX_SIZE"))
        warn(c, W_SIZE, "ignoring EMBER_CACHE_MAX_SIZE: its value is too long to be a size "
             "(expected bytes, or a number with K, M, G or T: \"500M\"); no size limit");
    else if (v && *v && !kc_size_from_str(v, &c->max_size))
        warn(c, W_SIZE, "ignoring EMBER_CACHE_MAX_SIZE='%s': expected bytes, or a number with "
             "K, M, G or T (\"500M\"); no size limit", v);
}

/* ---- the remote tier: configuration ---- */

/* Remote events, for EMBER_LOG=cache: none when no one listens. */
static void trace(kc_cache *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void trace(kc_cache *c, const char *fmt, ...) {
    if (!c->trace) return;
    char msg[1024];
    int n = snprintf(msg, sizeof msg, "cache remote ");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    va_end(ap);
    c->trace(c->trace_ud, msg);
}

/* A remote tier setting: the option, else the variable (into buf). */
static const char *setting(const char *opt, const char *var, char *buf) {
    return opt ? opt : em_getenv(var, buf, EM_ENV_MAX);
}

/* EMBER_CACHE_REMOTE_TIMEOUT: milliseconds, 1 to 60000. */
static int remote_timeout(kc_cache *c, const kc_options *o, char *buf) {
    if (o->remote_timeout_ms > 0) return o->remote_timeout_ms;
    const char *v = em_getenv("EMBER_CACHE_REMOTE_TIMEOUT", buf, EM_ENV_MAX);
    char *end;
    long ms = v && *v ? strtol(v, &end, 10) : 0;
    if (v && *v && (*end || ms < 1 || ms > 60000)) {
        warn(c, W_REMOTE_CFG, "ignoring EMBER_CACHE_REMOTE_TIMEOUT='%.32s': expected "
             "milliseconds from 1 to 60000; using %d", v, KC_REMOTE_TIMEOUT_MS);
        ms = 0;
    }
    return ms > 0 ? (int)ms : KC_REMOTE_TIMEOUT_MS;
}

/* EMBER_CACHE_REMOTE_PREFIX: the namespace, printable without spaces. */
static bool prefix_valid(const char *p) {
    size_t n = strlen(p);
    for (size_t i = 0; i < n; i++)
        if (p[i] <= ' ' || p[i] > '~') return false;
    return n >= 1 && n <= 64;
}

/* Opens the remote tier the options or the environment name, with its key.
 * Anything that stops it is said once; the cache works without it. */
static void open_remote(kc_cache *c, const kc_options *o) {
    char *buf = em_malloc(4 * EM_ENV_MAX);
    if (!buf) return;
    char *b0 = buf, *b1 = buf + EM_ENV_MAX, *b2 = buf + 2 * EM_ENV_MAX, *b3 = buf + 3 * EM_ENV_MAX;
    const char *url = setting(o->remote, "EMBER_CACHE_REMOTE", b0);
    const char *keyf = url && *url ? setting(o->key_file, "EMBER_CACHE_KEY_FILE", b1) : NULL;
    const char *prefix = url && *url ? em_getenv("EMBER_CACHE_REMOTE_PREFIX", b2, EM_ENV_MAX) : NULL;
    char why[1024] = "";
    kc_seal_key *k = NULL;
    if (!url || !*url) {
        /* no remote tier asked for */
    } else if (!keyf || !*keyf) {
        warn(c, W_REMOTE_CFG, "EMBER_CACHE_REMOTE is set but EMBER_CACHE_KEY_FILE is not: the "
             "remote tier is off (a shared cache is trusted only through signatures made with "
             "that key; docs/cache.md)");
    } else if (prefix && *prefix && !prefix_valid(prefix)) {
        warn(c, W_REMOTE_CFG, "EMBER_CACHE_REMOTE_PREFIX must be 1 to 64 printable characters "
             "without spaces: the remote tier is off");
    } else if (!(k = own_alloc(c, sizeof *k)) || !kc_seal_key_load(keyf, k, why, sizeof why)) {
        warn(c, W_REMOTE_CFG, "%s: the remote tier is off", k ? why : "out of memory");
    } else {
        int ms = remote_timeout(c, o, b3);
        const char *pw = em_getenv("EMBER_CACHE_REMOTE_PASSWORD", b3, EM_ENV_MAX);
        c->remote = kc_remote_open(url, pw, prefix && *prefix ? prefix : "ember:", ms, why,
                                   sizeof why);
        memset(b3, 0, EM_ENV_MAX); /* the password */
        if (!c->remote) warn(c, W_REMOTE_CFG, "EMBER_CACHE_REMOTE: %s: the remote tier is off", why);
    }
    if (c->remote) {
        c->seal = k;
    } else if (k) {
        memset(k, 0, sizeof *k);
        own_free(c, k);
    }
    em_free(buf);
}

kc_cache *kc_open_with(const kc_options *o) {
    static const kc_options none = {0};
    if (!o) o = &none;
    const em_allocator *a = em_get_allocator();
    kc_cache *c = a->alloc(a->ud, sizeof *c, 64);
    if (!c) {
        em_error(EM_ERR_NOMEM, "kc_open: out of memory");
        return NULL;
    }
    memset(c, 0, sizeof *c);
    c->alloc = a;
    c->log = o->log;
    c->log_ud = o->log_ud;
    c->trace = o->trace;
    c->trace_ud = o->trace_ud;
    c->disk_bytes = -1;
    if (pthread_mutex_init(&c->lock, NULL) != 0) {
        em_free_with(a, c);
        em_error(EM_ERR_STATE, "kc_open: cannot make a mutex");
        return NULL;
    }
    c->max_size = o->max_size;
    if (!c->max_size) read_max_size(c);
    char cbuf[64];
    if (o->flags & KC_MEMORY_ONLY || env_off(em_getenv("EMBER_CACHE", cbuf, sizeof cbuf)))
        return c;
    /* kept for a retry: the caller's string need not outlive kc_open */
    if (o->dir && *o->dir && !(c->want = own_strdup(c, o->dir))) {
        kc_close(c);
        em_error(EM_ERR_NOMEM, "kc_open: out of memory");
        return NULL;
    }
    open_disk(c);
    if (!(o->flags & KC_NO_REMOTE)) open_remote(c, o);
    return c;
}

kc_cache *kc_open(const char *dir, unsigned flags) {
    kc_options o = {.dir = dir, .flags = flags};
    return kc_open_with(&o);
}

void kc_close(kc_cache *c) {
    if (!c) return;
    for (size_t i = 0; i < c->cap; i++) {
        kc_entry *e = c->slots[i];
        if (!e) continue;
        entry_drop_path(c, e);
        entry_drop_data(c, e);
        own_free(c, e);
    }
    own_free(c, c->slots);
    if (c->session) (void)rmdir(c->session);
    own_free(c, c->session);
    own_free(c, c->dir);
    own_free(c, c->want);
    kc_remote_close(c->remote);
    if (c->seal) memset(c->seal, 0, sizeof *c->seal);
    own_free(c, c->seal);
    pthread_mutex_destroy(&c->lock);
    em_free_with(c->alloc, c);
}

bool kc_on_disk(kc_cache *c) {
    if (!c) return false;
    pthread_mutex_lock(&c->lock);
    bool d = c->disk;
    pthread_mutex_unlock(&c->lock);
    return d;
}

const char *kc_dir(const kc_cache *c) { return c ? c->dir : NULL; }

/* Set once by kc_open: read without the lock. */
uint64_t kc_max_size(const kc_cache *c) { return c ? c->max_size : 0; }

/* ---- shared steps of the calls ---- */

static em_status check_args(const char *fn, kc_cache *c, const kc_key *k, const char *kind) {
    if (!c) return em_error(EM_ERR_NULL, "%s: cache is NULL", fn);
    if (!k) return em_error(EM_ERR_NULL, "%s: key is NULL", fn);
    if (!kind) return em_error(EM_ERR_NULL, "%s: kind is NULL", fn);
    if (!kc_kind_valid(kind))
        return em_error(EM_ERR_ARG, "%s: bad kind '%.32s': expected 1 to %d characters of "
                        "[a-z0-9_]", fn, kind, KC_KIND_MAX);
    return EM_OK;
}

/* Counts and reports a disk read that did not give an entry. */
static void note_bad_read(kc_cache *c, kc_read r, const char *why) {
    if (r == KC_READ_CORRUPT) {
        c->st.corrupt++;
        warn(c, W_CORRUPT, "%s: ignored (a miss; the next put replaces it; further corrupt "
             "entries are only counted)", why);
    } else if (r == KC_READ_REFUSED) {
        c->st.refused++;
        warn(c, W_REFUSED, "%s: ignored (a miss; the next put replaces it)", why);
    }
}

static void disk_failed(kc_cache *c, const char *why) {
    c->disk = false;
    warn(c, W_WRITE, "%s: keeping compiled kernels in memory only from now on", why);
}

static void forget_file(void *ud, const kc_key *k, const char *kind) {
    kc_cache *c = ud;
    kc_entry *e = table_find(c, k, kind);
    if (e && e->path && !e->in_session) entry_drop_path(c, e);
}

static void prune_locked(kc_cache *c, uint64_t max_bytes, const kc_key *keep,
                         const char *keep_kind) {
    if (!c->disk) return;
    char why[1024] = "";
    uint64_t evicted = 0, total = 0;
    bool ok = kc_store_prune(c->dir, max_bytes, keep, keep_kind, forget_file, c, &evicted,
                             &total, why, sizeof why);
    c->st.evicted += evicted;
    c->disk_bytes = ok ? (int64_t)total : -1;
    if (!ok) warn(c, W_PRUNE, "cannot prune: %s", why);
}

/* After a put of (k, kind), added bytes on disk: prune when the limit may be
 * passed, sparing the new entry.  The running estimate spares a directory
 * scan per put. */
static void after_put(kc_cache *c, const kc_key *k, const char *kind, uint64_t added) {
    if (!c->max_size || !c->disk) return;
    if (c->disk_bytes >= 0 && (uint64_t)c->disk_bytes + added <= c->max_size) {
        c->disk_bytes += (int64_t)added;
        return;
    }
    prune_locked(c, c->max_size, k, kind);
}

/* The memory-only file store, made on first need. */
static bool session_dir(kc_cache *c, char *why, size_t nwhy) {
    if (c->session) return true;
    char buf[EM_ENV_MAX];
    const char *tmp = em_getenv("TMPDIR", buf, sizeof buf);
    char *t = kc_strfmt("%s/ember-cache-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!t) {
        snprintf(why, nwhy, "out of memory");
        return false;
    }
    if (!mkdtemp(t)) snprintf(why, nwhy, "cannot create %s: %s", t, strerror(errno));
    else c->session = own_strdup(c, t);
    if (!c->session && !why[0]) snprintf(why, nwhy, "out of memory");
    em_free(t);
    return c->session != NULL;
}

static char *entry_name(const kc_key *k, const char *kind) {
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(k, hex);
    return kc_strfmt("%s.%s", hex, kind);
}

/* ---- the remote tier: lookups and publishing ---- */

kc_remote *kc_remote_of(kc_cache *c) { return c ? c->remote : NULL; }

const char *kc_remote_url(const kc_cache *c) {
    return c && c->remote ? kc_remote_name(c->remote) : NULL;
}

/* A failed remote call: counted and traced, said once. */
static void remote_failed(kc_cache *c, const char *why) {
    pthread_mutex_lock(&c->lock);
    c->st.remote_errors++;
    warn(c, W_REMOTE_DOWN, "remote tier: %s; compiling and caching locally meanwhile "
         "(EMBER_LOG=cache reports each remote error)", why);
    pthread_mutex_unlock(&c->lock);
    trace(c, "error: %s", why);
}

static void count(kc_cache *c, uint64_t *counter) {
    pthread_mutex_lock(&c->lock);
    (*counter)++;
    pthread_mutex_unlock(&c->lock);
}

/* A rejected remote entry: counted, traced, said once; never stored.  A
 * damaged one (not one signed with another key: that machine may be the
 * one whose key is wrong) is replaced by the next put of (k, kind). */
static void rejected(kc_cache *c, const kc_key *k, const char *kind, kc_read r, const char *name,
                     const char *why) {
    pthread_mutex_lock(&c->lock);
    c->st.remote_rejected++;
    kc_entry *e = r == KC_READ_CORRUPT ? table_add(c, k, kind) : NULL;
    if (e) e->remote_bad = true;
    warn(c, W_REMOTE_BAD, "remote entry %s rejected: %s (a miss: never loaded; further "
         "rejections are only counted)", name, why);
    pthread_mutex_unlock(&c->lock);
    trace(c, "rejected: %s: %s", name, why);
}

static em_status put_locked(kc_cache *c, const kc_key *k, const char *kind, const void *data,
                            size_t n);

/* Stores a checked remote payload in the local tiers (not published
 * again: it came from there). */
static kc_read keep_fetched(kc_cache *c, const kc_key *k, const char *kind, const void *p,
                            size_t n) {
    pthread_mutex_lock(&c->lock);
    em_status s = put_locked(c, k, kind, p, n);
    if (s == EM_OK) c->st.remote_hits++;
    pthread_mutex_unlock(&c->lock);
    em_clear_error();
    return s == EM_OK ? KC_READ_OK : KC_READ_NOMEM;
}

kc_read kc_fetch(kc_cache *c, const kc_key *k, const char *kind) {
    char *name = c && c->remote ? entry_name(k, kind) : NULL;
    if (!name) return KC_READ_ABSENT;
    void *env = NULL;
    size_t n = 0;
    char why[1024] = "";
    kc_read r = KC_READ_ABSENT;
    kc_remote_status st = kc_remote_get(c->remote, name, &env, &n, why, sizeof why);
    if (st == KC_REMOTE_MISS) {
        count(c, &c->st.remote_misses);
        trace(c, "miss: %s", name);
    } else if (st == KC_REMOTE_ERROR) {
        remote_failed(c, why);
    } else if (st == KC_REMOTE_OK) {
        const void *p = NULL;
        size_t np = 0;
        r = kc_unseal(c->seal, k, kind, env, n, &p, &np, why, sizeof why);
        if (r == KC_READ_OK) r = keep_fetched(c, k, kind, p, np);
        if (r == KC_READ_OK) trace(c, "hit: %s (%zu bytes), now in the local cache", name, np);
        else if (r != KC_READ_NOMEM) rejected(c, k, kind, r, name, why);
    }
    em_free(env);
    em_free(name);
    return r;
}

/* On a local miss: whether the remote tier had (k, kind), now local. */
static bool remote_fill(kc_cache *c, const kc_key *k, const char *kind) {
    return c->remote && kc_fetch(c, k, kind) == KC_READ_OK;
}

/* The second lookup after a remote fill found the entry the fill stored:
 * counted as the one remote hit the lookup was, not as a miss and a hit. */
static void recount(kc_cache *c, const kc_counters *was) {
    c->st.hits_mem = was->hits_mem;
    c->st.hits_disk = was->hits_disk;
    c->st.misses = was->misses - (was->misses > 0);
}

/* Whether the server's copy of (k, kind) was found damaged (then forgotten:
 * one put replaces it). */
static bool take_remote_bad(kc_cache *c, const kc_key *k, const char *kind) {
    pthread_mutex_lock(&c->lock);
    kc_entry *e = table_find(c, k, kind);
    bool bad = e && e->remote_bad;
    if (e) e->remote_bad = false;
    pthread_mutex_unlock(&c->lock);
    return bad;
}

kc_remote_status kc_publish(kc_cache *c, const kc_key *k, const char *kind, const void *data,
                            size_t n, bool replace) {
    if (!c || !c->remote) return KC_REMOTE_DOWN;
    replace = take_remote_bad(c, k, kind) || replace;
    char *name = entry_name(k, kind);
    size_t ne = 0;
    void *env = name && n <= KC_REMOTE_MAX ? kc_seal(c->seal, k, kind, data, n, &ne) : NULL;
    char why[1024] = "";
    kc_remote_status st = KC_REMOTE_ERROR;
    if (env) st = kc_remote_set(c->remote, name, env, ne, replace, why, sizeof why);
    else snprintf(why, sizeof why, n > KC_REMOTE_MAX ? "%s is larger than the remote tier takes"
                  : "cannot sign %s", name ? name : "an entry");
    em_clear_error();
    if (st == KC_REMOTE_OK) {
        count(c, &c->st.remote_writes);
        trace(c, "publish: %s (%zu bytes)%s", name, n, replace ? ", replacing the server's copy" : "");
    } else if (st == KC_REMOTE_PRESENT) {
        trace(c, "publish: %s is on the server already", name);
    } else if (st == KC_REMOTE_ERROR) {
        remote_failed(c, why);
    }
    em_free(env);
    em_free(name);
    return st;
}

/* Publishes the file a kc_put_file stored, from the descriptor it was
 * checksummed through, if its bytes are still the ones checksummed. */
static void publish_fd(kc_cache *c, const kc_key *k, const char *kind, int fd, uint64_t size,
                       const kc_sum *sum) {
    if (size > KC_REMOTE_MAX) {
        (void)kc_publish(c, k, kind, NULL, (size_t)size, false); /* says why not */
        return;
    }
    uint8_t *p = em_malloc(size ? (size_t)size : 1);
    size_t got = 0;
    while (p && got < size) {
        ssize_t r = pread(fd, p + got, (size_t)size - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    kc_sum now = p && got == size ? kc_checksum(p, got) : (kc_sum){{0}};
    if (p && got == size && !memcmp(now.bytes, sum->bytes, sizeof now.bytes))
        (void)kc_publish(c, k, kind, p, got, false);
    else
        remote_failed(c, "a stored file changed before it could be published");
    em_free(p);
    em_clear_error();
}

/* ---- get ---- */

static em_status get_locked(kc_cache *c, const kc_key *k, const char *kind, void **data,
                            size_t *n) {
    retry_disk(c);
    kc_entry *e = table_find(c, k, kind);
    if (e && e->data) {
        void *p = em_malloc(e->size ? (size_t)e->size : 1);
        if (!p) return EM_ERR_NOMEM;
        memcpy(p, e->data, (size_t)e->size);
        *data = p;
        *n = (size_t)e->size;
        c->st.hits_mem++;
        return EM_OK;
    }
    if (e && e->path && e->in_session) {
        /* A memory-only file entry (kc_put_file): its bytes, checked
         * against the checksum it was verified with.  A file on disk is
         * read below, through the directory checks. */
        char why[1024] = "";
        void *p = NULL;
        kc_read r = kc_file_read(e->path, e->size, &e->sum, &p, why, sizeof why);
        if (r == KC_READ_NOMEM) return EM_ERR_NOMEM;
        if (r == KC_READ_OK) {
            e->data = own_alloc(c, (size_t)e->size);
            if (e->data) memcpy(e->data, p, (size_t)e->size);
            *data = p;
            *n = (size_t)e->size;
            c->st.hits_mem++;
            return EM_OK;
        }
        entry_drop_path(c, e); /* gone or changed: ask the disk */
    }
    if (c->disk) {
        kc_meta m;
        char why[1024] = "";
        void *p = NULL;
        kc_read r = kc_store_read(c->dir, k, kind, &p, &m, why, sizeof why);
        if (r == KC_READ_NOMEM) return EM_ERR_NOMEM;
        if (r == KC_READ_OK) {
            /* Kept for the next lookup; without memory for it, only not kept. */
            e = table_add(c, k, kind);
            if (e) {
                entry_describe(c, e, m.size, &m.sum);
                e->data = own_alloc(c, (size_t)m.size);
                if (e->data) memcpy(e->data, p, (size_t)m.size);
            }
            *data = p;
            *n = (size_t)m.size;
            c->st.hits_disk++;
            return EM_OK;
        }
        note_bad_read(c, r, why);
    }
    c->st.misses++;
    return EM_OK;
}

em_status kc_get(kc_cache *c, const kc_key *key, const char *kind, void **data, size_t *n) {
    if (!data || !n) return em_error(EM_ERR_NULL, "kc_get: data or n is NULL");
    *data = NULL;
    *n = 0;
    em_status s = check_args("kc_get", c, key, kind);
    if (s != EM_OK) return s;
    pthread_mutex_lock(&c->lock);
    s = get_locked(c, key, kind, data, n);
    pthread_mutex_unlock(&c->lock);
    if (s == EM_OK && !*data && remote_fill(c, key, kind)) {
        pthread_mutex_lock(&c->lock);
        kc_counters was = c->st;
        s = get_locked(c, key, kind, data, n);
        recount(c, &was);
        pthread_mutex_unlock(&c->lock);
    }
    return s;
}

static em_status get_file_locked(kc_cache *c, const kc_key *k, const char *kind, char **path) {
    retry_disk(c);
    kc_entry *e = table_find(c, k, kind);
    if (e && e->path) {
        /* A lookup; the stat notices an eviction by another process. */
        struct stat st;
        if (stat(e->path, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size == e->size) {
            if (!(*path = caller_strdup(e->path))) return EM_ERR_NOMEM;
            c->st.hits_mem++;
            return EM_OK;
        }
        entry_drop_path(c, e);
    }
    if (c->disk) {
        kc_meta m;
        char why[1024] = "";
        kc_read r = kc_store_read(c->dir, k, kind, NULL, &m, why, sizeof why);
        if (r == KC_READ_NOMEM) return EM_ERR_NOMEM;
        if (r == KC_READ_OK) {
            char *p = kc_store_path(c->dir, k, kind, false);
            if (!p) return EM_ERR_NOMEM;
            e = table_add(c, k, kind);
            if (e) {
                entry_describe(c, e, m.size, &m.sum);
                entry_set_path(c, e, p, false);
            }
            *path = p;
            c->st.hits_disk++;
            return EM_OK;
        }
        note_bad_read(c, r, why);
    }
    if (e && e->data) {
        /* The bytes are known but no file holds them: write one. */
        char why[1024] = "";
        char *name = entry_name(k, kind);
        if (!name) return EM_ERR_NOMEM;
        char *p = NULL;
        bool ok = session_dir(c, why, sizeof why) &&
                  (p = kc_strfmt("%s/%s", c->session, name)) &&
                  kc_write_file(c->session, name, e->data, (size_t)e->size, why, sizeof why);
        em_free(name);
        if (!ok && !why[0]) snprintf(why, sizeof why, "out of memory");
        if (ok && entry_set_path(c, e, p, true)) {
            *path = p;
            c->st.hits_mem++;
            return EM_OK;
        }
        if (ok) (void)unlink(p);
        em_free(p);
        warn(c, W_SESSION, "cannot keep a file for the memory-only cache: %s", why);
    }
    c->st.misses++;
    return EM_OK;
}

em_status kc_get_file(kc_cache *c, const kc_key *key, const char *kind, char **path) {
    if (!path) return em_error(EM_ERR_NULL, "kc_get_file: path is NULL");
    *path = NULL;
    em_status s = check_args("kc_get_file", c, key, kind);
    if (s != EM_OK) return s;
    pthread_mutex_lock(&c->lock);
    s = get_file_locked(c, key, kind, path);
    pthread_mutex_unlock(&c->lock);
    if (s == EM_OK && !*path && remote_fill(c, key, kind)) {
        pthread_mutex_lock(&c->lock);
        kc_counters was = c->st;
        s = get_file_locked(c, key, kind, path);
        recount(c, &was);
        pthread_mutex_unlock(&c->lock);
    }
    return s;
}

/* ---- get into a memory file (code is loaded from those) ---- */

/* Copies the verified payload of (k, kind) into fd: from the memory
 * table's bytes, else from disk (directories, header, payload checked and
 * checksummed on the very descriptor the bytes are copied from), else
 * (memory-only) from the session file, checked against its checksum. */
static kc_read fill_fd(kc_cache *c, const kc_key *k, const char *kind, int fd, char *why,
                       size_t nwhy) {
    kc_entry *e = table_find(c, k, kind);
    if (e && e->data) {
        if (!kc_write_all(fd, e->data, (size_t)e->size)) {
            snprintf(why, nwhy, "cannot fill a memory file: %s", strerror(errno));
            return KC_READ_CORRUPT;
        }
        c->st.hits_mem++;
        return KC_READ_OK;
    }
    kc_read r = KC_READ_ABSENT;
    kc_meta m;
    if (c->disk) r = kc_store_read_to(c->dir, k, kind, fd, &m, why, nwhy);
    else if (e && e->path && e->in_session)
        r = kc_file_read_to(e->path, e->size, &e->sum, fd, why, nwhy);
    if (r == KC_READ_OK && c->disk) {
        c->st.hits_disk++;
        if ((e = table_add(c, k, kind))) entry_describe(c, e, m.size, &m.sum);
    } else if (r == KC_READ_OK) {
        c->st.hits_mem++;
    }
    return r;
}

static em_status get_fd_locked(kc_cache *c, const kc_key *k, const char *kind, int *out) {
    retry_disk(c);
    char why[1024] = "";
    int fd = kc_memfd_new(kind, why, sizeof why);
    kc_read r = fd >= 0 ? fill_fd(c, k, kind, fd, why, sizeof why) : KC_READ_ABSENT;
    if (r == KC_READ_OK && !kc_memfd_seal(fd, why, sizeof why)) r = KC_READ_ABSENT;
    if (r == KC_READ_OK) {
        *out = fd;
        return EM_OK;
    }
    if (fd >= 0) close(fd);
    if (r == KC_READ_NOMEM) return em_error(EM_ERR_NOMEM, "kc_get_fd: out of memory");
    if (why[0] && r == KC_READ_ABSENT) warn(c, W_LOAD, "%s: loading nothing from the cache", why);
    note_bad_read(c, r, why);
    c->st.misses++;
    return EM_OK;
}

em_status kc_get_fd(kc_cache *c, const kc_key *key, const char *kind, int *fd) {
    if (!fd) return em_error(EM_ERR_NULL, "kc_get_fd: fd is NULL");
    *fd = -1;
    em_status s = check_args("kc_get_fd", c, key, kind);
    if (s != EM_OK) return s;
    pthread_mutex_lock(&c->lock);
    s = get_fd_locked(c, key, kind, fd);
    pthread_mutex_unlock(&c->lock);
    if (s == EM_OK && *fd < 0 && remote_fill(c, key, kind)) {
        pthread_mutex_lock(&c->lock);
        kc_counters was = c->st;
        s = get_fd_locked(c, key, kind, fd);
        recount(c, &was);
        pthread_mutex_unlock(&c->lock);
    }
    return s;
}

/* ---- put ---- */

static kc_meta meta_of(const kc_key *k, const char *kind, uint64_t size, const kc_sum *sum) {
    kc_meta m;
    memset(&m, 0, sizeof m);
    m.version = KC_FORMAT_VERSION;
    m.key = *k;
    strcpy(m.kind, kind);
    m.size = size;
    m.sum = *sum;
    m.created = (int64_t)time(NULL);
    return m;
}

static em_status put_locked(kc_cache *c, const kc_key *k, const char *kind, const void *data,
                            size_t n) {
    retry_disk(c);
    kc_sum sum = kc_checksum(data, n);
    kc_entry *e = table_add(c, k, kind);
    void *copy = own_alloc(c, n);
    if (!e || !copy) {
        own_free(c, copy);
        return em_error(EM_ERR_NOMEM, "kc_put: out of memory");
    }
    if (n) memcpy(copy, data, n);
    entry_describe(c, e, n, &sum);
    entry_drop_data(c, e);
    e->data = copy;
    if (!c->disk) return EM_OK;
    kc_meta m = meta_of(k, kind, n, &sum);
    char why[1024] = "";
    if (!kc_store_write(c->dir, &m, data, why, sizeof why)) {
        disk_failed(c, why);
        return EM_OK;
    }
    c->st.writes++;
    c->st.bytes_written += n;
    char *p = kc_store_path(c->dir, k, kind, false);
    if (p) entry_set_path(c, e, p, false); /* just written: verified */
    em_free(p);
    char text[KC_META_MAX];
    after_put(c, k, kind, n + kc_meta_format(&m, text));
    return EM_OK;
}

em_status kc_put(kc_cache *c, const kc_key *key, const char *kind, const void *data,
                 size_t n) {
    em_status s = check_args("kc_put", c, key, kind);
    if (s != EM_OK) return s;
    if (!data && n) return em_error(EM_ERR_NULL, "kc_put: data is NULL");
    pthread_mutex_lock(&c->lock);
    s = put_locked(c, key, kind, data, n);
    pthread_mutex_unlock(&c->lock);
    if (s == EM_OK && c->remote) (void)kc_publish(c, key, kind, data, n, false);
    return s;
}

static em_status put_file_locked(kc_cache *c, const kc_key *k, const char *kind, int fd,
                                 const char *src, uint64_t size, const kc_sum *sum) {
    retry_disk(c);
    kc_entry *e = table_add(c, k, kind);
    char *name = entry_name(k, kind);
    if (!e || !name) {
        em_free(name);
        return em_error(EM_ERR_NOMEM, "kc_put_file: out of memory");
    }
    entry_describe(c, e, size, sum);
    char why[1024] = "";
    char *p = NULL;
    bool in_session = false;
    if (c->disk) {
        kc_meta m = meta_of(k, kind, size, sum);
        if (kc_store_move(c->dir, &m, fd, src, why, sizeof why)) {
            c->st.writes++;
            c->st.bytes_written += size;
            p = kc_store_path(c->dir, k, kind, false);
            char text[KC_META_MAX];
            after_put(c, k, kind, size + kc_meta_format(&m, text));
        } else {
            disk_failed(c, why);
        }
    }
    if (!c->disk) {
        /* The file may have moved already (a disk write that failed half
         * way): kc_move_file copies from fd then. */
        why[0] = '\0';
        if (!session_dir(c, why, sizeof why) ||
            !kc_move_file(fd, src, c->session, name, why, sizeof why)) {
            em_free(name);
            return em_error(EM_ERR_STATE, "kc_put_file: memory-only cache has nowhere to keep "
                            "%s: %s", src, why);
        }
        p = kc_strfmt("%s/%s", c->session, name);
        in_session = true;
    }
    em_free(name);
    if (p && !entry_set_path(c, e, p, in_session) && in_session) (void)unlink(p);
    em_free(p);
    return EM_OK;
}

em_status kc_put_file(kc_cache *c, const kc_key *key, const char *kind, const char *path) {
    em_status s = check_args("kc_put_file", c, key, kind);
    if (s != EM_OK) return s;
    if (!path) return em_error(EM_ERR_NULL, "kc_put_file: path is NULL");
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return em_error(EM_ERR_ARG, "kc_put_file: cannot open %s: %s", path, strerror(errno));
    struct stat st;
    kc_sum sum;
    uint64_t size = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        s = em_error(EM_ERR_ARG, "kc_put_file: %s is not a regular file", path);
    } else if (!kc_checksum_fd(fd, &sum, &size)) {
        s = em_error(EM_ERR_ARG, "kc_put_file: cannot read %s: %s", path, strerror(errno));
    } else {
        pthread_mutex_lock(&c->lock);
        s = put_file_locked(c, key, kind, fd, path, size, &sum);
        pthread_mutex_unlock(&c->lock);
        if (s == EM_OK && c->remote) publish_fd(c, key, kind, fd, size, &sum);
    }
    close(fd);
    return s;
}

/* ---- prune and statistics ---- */

em_status kc_prune(kc_cache *c, uint64_t max_bytes) {
    if (!c) return em_error(EM_ERR_NULL, "kc_prune: cache is NULL");
    pthread_mutex_lock(&c->lock);
    prune_locked(c, max_bytes, NULL, NULL);
    pthread_mutex_unlock(&c->lock);
    return EM_OK;
}

em_status kc_stats(kc_cache *c, kc_counters *out) {
    if (!c || !out) return em_error(EM_ERR_NULL, "kc_stats: argument is NULL");
    pthread_mutex_lock(&c->lock);
    *out = c->st;
    out->entries = 0;
    for (size_t i = 0; i < c->cap; i++)
        if (c->slots[i] && (c->slots[i]->data || c->slots[i]->path)) out->entries++;
    pthread_mutex_unlock(&c->lock);
    return EM_OK;
}
