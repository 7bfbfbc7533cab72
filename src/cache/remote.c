/* remote.c - the remote tier's connection: a Redis server that many
 * machines read and fill (EMBER_CACHE_REMOTE=redis://host:port/db),
 * through hiredis.  It moves named byte strings and knows nothing of what
 * they hold: cache.c seals (seal.c) what it sends and checks what it gets.
 *
 * Every call is bounded: the connection is made with a timeout and every
 * command waits at most that long for the network (SO_RCVTIMEO and
 * SO_SNDTIMEO, per wait).  A failure (refused, timed out, a dropped
 * connection, an error reply) closes the connection, and the tier is then
 * skipped for KC_REMOTE_RETRY_S seconds before a new connection is tried,
 * so an outage costs one timeout, not one per lookup.
 *
 * Threads: a mutex inside serializes the calls on the one connection.  A
 * forked child never uses its parent's connection (the socket is shared
 * with the parent): it opens its own. */
#include "config.h" /* EMBER_HAVE_REMOTE */

#include "cache.h"

#include "eager.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#ifdef EMBER_HAVE_REMOTE
#include <hiredis/hiredis.h>
#endif

struct kc_remote {
    pthread_mutex_t lock;
    const em_allocator *alloc; /* made the strings below and r itself */
    char *host;
    int port;
    int db;
    char *user;        /* NULL: AUTH with the password alone */
    char *password;    /* NULL: no AUTH; never printed */
    char *prefix;      /* the namespace every name is put under */
    char name[320];    /* redis://host:port/db, for messages */
    int timeout_ms;
    void *ctx;         /* a redisContext, or NULL when not connected */
    pid_t pid;         /* the process ctx belongs to */
    double down_until; /* monotonic seconds: skip the tier until then */
};

#ifdef EMBER_HAVE_REMOTE

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static char *dup_n(const kc_remote *r, const char *s, size_t n) {
    char *d = r->alloc->alloc(r->alloc->ud, n + 1, 1);
    if (d) {
        memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

/* ---- the address ---- */

/* %XX escapes in a user or password, in place. */
static bool unescape(char *s) {
    char *o = s;
    for (char *p = s; *p; p++) {
        if (*p != '%') {
            *o++ = *p;
            continue;
        }
        unsigned v;
        if (sscanf(p + 1, "%2x", &v) != 1 || !p[1] || !p[2]) return false;
        *o++ = (char)v;
        p += 2;
    }
    *o = '\0';
    return true;
}

static bool parse_int(const char *s, size_t n, long lo, long hi, int *out) {
    char buf[16];
    if (n == 0 || n >= sizeof buf) return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    char *end;
    long v = strtol(buf, &end, 10);
    if (*end || v < lo || v > hi || buf[0] == '+' || buf[0] == '-') return false;
    *out = (int)v;
    return true;
}

/* user:password@ (both optional) of the authority [a, at). */
static bool parse_userinfo(kc_remote *r, const char *a, const char *at, char *why, size_t nwhy) {
    const char *colon = memchr(a, ':', (size_t)(at - a));
    const char *pe = colon ? colon + 1 : a;
    if (colon && colon > a && !(r->user = dup_n(r, a, (size_t)(colon - a)))) return false;
    if (at > pe && !(r->password = dup_n(r, pe, (size_t)(at - pe)))) return false;
    if (!colon && at > a) { /* redis://secret@host: the password alone, as redis-cli reads it */
        r->password = r->user;
        r->user = NULL;
    }
    if ((r->user && !unescape(r->user)) || (r->password && !unescape(r->password))) {
        snprintf(why, nwhy, "a bad %%-escape in the user or password");
        return false;
    }
    return true;
}

/* redis://[[user]:password@]host[:port][/db] into r. */
static bool parse_url(kc_remote *r, const char *url, char *why, size_t nwhy) {
    if (!strncmp(url, "rediss://", 9)) {
        snprintf(why, nwhy, "rediss:// (TLS) is not supported: Debian 12's hiredis 0.14 has no "
                 "TLS; reach the server through a TLS tunnel (stunnel, spiped) at a redis:// "
                 "address");
        return false;
    }
    if (strncmp(url, "redis://", 8) != 0) {
        snprintf(why, nwhy, "'%.64s' is not a redis://host:port/db address", url);
        return false;
    }
    const char *a = url + 8, *slash = strchr(a, '/');
    const char *end = slash ? slash : a + strlen(a);
    const char *at = NULL;
    for (const char *p = a; p < end; p++)
        if (*p == '@') at = p; /* the last @: a password may hold one, escaped or not */
    if (at && !parse_userinfo(r, a, at, why, nwhy)) return why[0] || (snprintf(why, nwhy, "out of memory"), false);
    const char *h = at ? at + 1 : a;
    const char *colon = memchr(h, ':', (size_t)(end - h));
    const char *he = colon ? colon : end;
    r->port = 6379;
    if (he == h || (colon && !parse_int(colon + 1, (size_t)(end - colon - 1), 1, 65535, &r->port))) {
        snprintf(why, nwhy, "'redis://%.*s': expected host[:port] with a port from 1 to 65535",
                 (int)(end - h > 64 ? 64 : end - h), h);
        return false;
    }
    if (slash && slash[1] && !parse_int(slash + 1, strlen(slash + 1), 0, 1 << 20, &r->db)) {
        snprintf(why, nwhy, "'/%.32s' is not a database number", slash + 1);
        return false;
    }
    if (!(r->host = dup_n(r, h, (size_t)(he - h)))) {
        snprintf(why, nwhy, "out of memory");
        return false;
    }
    snprintf(r->name, sizeof r->name, "redis://%s:%d/%d", r->host, r->port, r->db);
    return true;
}

kc_remote *kc_remote_open(const char *url, const char *password, const char *prefix,
                          int timeout_ms, char *why, size_t nwhy) {
    why[0] = '\0';
    const em_allocator *a = em_get_allocator();
    kc_remote *r = a->alloc(a->ud, sizeof *r, 64);
    if (r) memset(r, 0, sizeof *r);
    if (!r || pthread_mutex_init(&r->lock, NULL) != 0) {
        em_free_with(a, r);
        snprintf(why, nwhy, "out of memory");
        return NULL;
    }
    r->alloc = a;
    r->timeout_ms = timeout_ms > 0 ? timeout_ms : KC_REMOTE_TIMEOUT_MS;
    bool ok = parse_url(r, url, why, nwhy);
    if (ok && password && *password) { /* EMBER_CACHE_REMOTE_PASSWORD wins over the URL's */
        em_free_with(r->alloc, r->password);
        ok = (r->password = dup_n(r, password, strlen(password))) != NULL;
    }
    ok = ok && (r->prefix = dup_n(r, prefix, strlen(prefix))) != NULL;
    if (!ok) {
        if (!why[0]) snprintf(why, nwhy, "out of memory");
        kc_remote_close(r);
        return NULL;
    }
    return r;
}

const char *kc_remote_name(const kc_remote *r) { return r ? r->name : ""; }

int kc_remote_timeout(const kc_remote *r) { return r ? r->timeout_ms : 0; }

static void drop(kc_remote *r) {
    if (r->ctx) redisFree(r->ctx); /* closes only this process's descriptor */
    r->ctx = NULL;
}

/* A failure: the connection goes, the tier rests for a while. */
static kc_remote_status failed(kc_remote *r, char *why, size_t nwhy, const char *what,
                               const char *detail) {
    snprintf(why, nwhy, "%s %s: %s (working without it for %d s)", what, r->name,
             detail && *detail ? detail : "no answer", KC_REMOTE_RETRY_S);
    drop(r);
    r->down_until = now_s() + KC_REMOTE_RETRY_S;
    return KC_REMOTE_ERROR;
}

/* One command.  hiredis writes with write(2): to a connection the server
 * closed, that raises SIGPIPE, which would kill the program.  The signal is
 * blocked in this thread for the call, and one it raised is taken back
 * (sigtimedwait) unless one was already pending for someone else. */
static redisReply *command(kc_remote *r, int argc, const char **argv, const size_t *lens) {
    sigset_t pipe, old, pending;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, &old);
    sigpending(&pending);
    bool was_pending = sigismember(&pending, SIGPIPE);
    redisReply *rp = redisCommandArgv(r->ctx, argc, argv, lens);
    if (!was_pending) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe, NULL, &zero) == SIGPIPE) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rp;
}

/* AUTH and SELECT on a new connection: NULL, or what went wrong. */
static const char *handshake(kc_remote *r, char *buf, size_t nbuf) {
    const char *argv[3];
    size_t lens[3];
    int argc = 0;
    if (r->password) {
        argv[argc] = "AUTH", lens[argc++] = 4;
        if (r->user) argv[argc] = r->user, lens[argc] = strlen(r->user), argc++;
        argv[argc] = r->password, lens[argc] = strlen(r->password), argc++;
        redisReply *rp = command(r, argc, argv, lens);
        bool ok = rp && rp->type == REDIS_REPLY_STATUS;
        /* the server's words, never the password */
        snprintf(buf, nbuf, "AUTH refused: %s", rp && rp->type == REDIS_REPLY_ERROR ? rp->str
                 : ((redisContext *)r->ctx)->errstr);
        if (rp) freeReplyObject(rp);
        if (!ok) return buf;
    }
    if (r->db) {
        char db[16];
        snprintf(db, sizeof db, "%d", r->db);
        const char *sv[2] = {"SELECT", db};
        size_t sl[2] = {6, strlen(db)};
        redisReply *rp = command(r, 2, sv, sl);
        bool ok = rp && rp->type == REDIS_REPLY_STATUS;
        snprintf(buf, nbuf, "SELECT %d: %s", r->db, rp && rp->type == REDIS_REPLY_ERROR ? rp->str
                 : ((redisContext *)r->ctx)->errstr);
        if (rp) freeReplyObject(rp);
        if (!ok) return buf;
    }
    return NULL;
}

/* A usable connection, or KC_REMOTE_DOWN/ERROR with why set. */
static kc_remote_status connect_remote(kc_remote *r, char *why, size_t nwhy) {
    if (r->ctx && r->pid == getpid()) return KC_REMOTE_OK;
    if (r->ctx) { /* inherited through fork: the parent's socket, never ours to use */
        drop(r);
    }
    if (r->down_until > now_s()) {
        snprintf(why, nwhy, "%s is resting after a failure", r->name);
        return KC_REMOTE_DOWN;
    }
    struct timeval tv = {r->timeout_ms / 1000, (r->timeout_ms % 1000) * 1000};
    redisContext *c = redisConnectWithTimeout(r->host, r->port, tv);
    r->ctx = c;
    r->pid = getpid();
    if (!c || c->err) return failed(r, why, nwhy, "cannot connect to", c ? c->errstr : "out of memory");
    if (redisSetTimeout(c, tv) != REDIS_OK) return failed(r, why, nwhy, "cannot set a timeout on", c->errstr);
    char buf[256];
    const char *bad = handshake(r, buf, sizeof buf);
    if (bad) return failed(r, why, nwhy, "refused by", bad);
    return KC_REMOTE_OK;
}

/* The full name of an entry: prefix, format version, key, kind. */
static size_t full_name(const kc_remote *r, const char *name, char *out, size_t nout) {
    int n = snprintf(out, nout, "%sv%u:%s", r->prefix, KC_FORMAT_VERSION, name);
    return n > 0 && (size_t)n < nout ? (size_t)n : 0;
}

/* One command on the connection: the reply, or NULL with the status in *st. */
static redisReply *run(kc_remote *r, int argc, const char **argv, const size_t *lens,
                       kc_remote_status *st, char *why, size_t nwhy, const char *what) {
    *st = connect_remote(r, why, nwhy);
    if (*st != KC_REMOTE_OK) return NULL;
    redisReply *rp = command(r, argc, argv, lens);
    if (!rp) {
        /* a wait that ran out shows as EAGAIN: say what it means */
        redisContext *c = r->ctx;
        char late[64];
        snprintf(late, sizeof late, "no answer within %d ms", r->timeout_ms);
        bool timed_out = c->err == REDIS_ERR_IO && strstr(c->errstr, "temporarily unavailable");
        *st = failed(r, why, nwhy, what, timed_out ? late : c->errstr);
        return NULL;
    }
    if (rp->type == REDIS_REPLY_ERROR) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s", rp->str);
        freeReplyObject(rp);
        *st = failed(r, why, nwhy, what, msg);
        return NULL;
    }
    return rp;
}

/* cmd (GET, STRLEN) on the entry name: its reply, or NULL with the status
 * in *st.  A reply is the caller's (freeReplyObject) and needs no lock. */
static redisReply *on_name(kc_remote *r, const char *cmd, const char *name, kc_remote_status *st,
                           char *why, size_t nwhy, const char *what) {
    char full[256];
    size_t nf = full_name(r, name, full, sizeof full);
    if (!nf) {
        snprintf(why, nwhy, "a name too long");
        *st = KC_REMOTE_ERROR;
        return NULL;
    }
    const char *argv[2] = {cmd, full};
    size_t lens[2] = {strlen(cmd), nf};
    pthread_mutex_lock(&r->lock);
    redisReply *rp = run(r, 2, argv, lens, st, why, nwhy, what);
    pthread_mutex_unlock(&r->lock);
    return rp;
}

/* A reply of the wrong type: the server is not behaving as Redis does. */
static kc_remote_status unexpected(kc_remote *r, char *why, size_t nwhy, const char *what) {
    pthread_mutex_lock(&r->lock);
    kc_remote_status st = failed(r, why, nwhy, what, "an unexpected reply");
    pthread_mutex_unlock(&r->lock);
    return st;
}

kc_remote_status kc_remote_get(kc_remote *r, const char *name, void **data, size_t *n, char *why,
                               size_t nwhy) {
    *data = NULL;
    *n = 0;
    kc_remote_status st;
    redisReply *rp = on_name(r, "GET", name, &st, why, nwhy, "GET from");
    if (rp && rp->type == REDIS_REPLY_STRING) {
        if ((*data = em_malloc(rp->len ? rp->len : 1))) {
            memcpy(*data, rp->str, rp->len);
            *n = rp->len;
        } else {
            st = KC_REMOTE_ERROR;
            snprintf(why, nwhy, "out of memory for a %zu-byte entry", rp->len);
        }
    } else if (rp) {
        st = rp->type == REDIS_REPLY_NIL ? KC_REMOTE_MISS : unexpected(r, why, nwhy, "GET from");
    }
    if (rp) freeReplyObject(rp);
    return st;
}

kc_remote_status kc_remote_set(kc_remote *r, const char *name, const void *data, size_t n,
                               bool replace, char *why, size_t nwhy) {
    char full[256];
    size_t nf = full_name(r, name, full, sizeof full);
    if (!nf) return snprintf(why, nwhy, "a name too long"), KC_REMOTE_ERROR;
    const char *argv[4] = {"SET", full, data, "NX"};
    size_t lens[4] = {3, nf, n, 2};
    kc_remote_status st;
    pthread_mutex_lock(&r->lock);
    redisReply *rp = run(r, replace ? 3 : 4, argv, lens, &st, why, nwhy, "SET on");
    if (rp && rp->type == REDIS_REPLY_NIL && !replace) st = KC_REMOTE_PRESENT;
    else if (rp && rp->type != REDIS_REPLY_STATUS) st = failed(r, why, nwhy, "SET on", "an unexpected reply");
    if (rp) freeReplyObject(rp);
    pthread_mutex_unlock(&r->lock);
    return st;
}

/* Calls each(name within the namespace and version) for every entry
 * there, through SCAN (which never blocks the server as KEYS does). */
kc_remote_status kc_remote_scan(kc_remote *r, void (*each)(void *ud, const char *name), void *ud,
                                char *why, size_t nwhy) {
    char pattern[256];
    size_t np = full_name(r, "*", pattern, sizeof pattern);
    if (!np) return snprintf(why, nwhy, "a prefix too long"), KC_REMOTE_ERROR;
    size_t skip = np - 1;
    char cursor[32] = "0";
    kc_remote_status st = KC_REMOTE_OK;
    pthread_mutex_lock(&r->lock);
    do {
        const char *argv[6] = {"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"};
        size_t lens[6] = {4, strlen(cursor), 5, np, 5, 4};
        redisReply *rp = run(r, 6, argv, lens, &st, why, nwhy, "SCAN on");
        if (!rp) break;
        bool ok = rp->type == REDIS_REPLY_ARRAY && rp->elements == 2 &&
                  rp->element[0]->type == REDIS_REPLY_STRING && rp->element[0]->len < sizeof cursor &&
                  rp->element[1]->type == REDIS_REPLY_ARRAY;
        if (ok) {
            memcpy(cursor, rp->element[0]->str, rp->element[0]->len);
            cursor[rp->element[0]->len] = '\0';
            for (size_t i = 0; i < rp->element[1]->elements; i++) {
                redisReply *e = rp->element[1]->element[i];
                if (e->type == REDIS_REPLY_STRING && e->len > skip && !memchr(e->str, '\0', e->len))
                    each(ud, e->str + skip);
            }
        } else {
            st = failed(r, why, nwhy, "SCAN on", "an unexpected reply");
        }
        freeReplyObject(rp);
    } while (st == KC_REMOTE_OK && strcmp(cursor, "0") != 0);
    pthread_mutex_unlock(&r->lock);
    return st;
}

kc_remote_status kc_remote_version(kc_remote *r, char *out, size_t nout, char *why, size_t nwhy) {
    const char *argv[2] = {"INFO", "server"};
    size_t lens[2] = {4, 6};
    kc_remote_status st;
    snprintf(out, nout, "unknown");
    pthread_mutex_lock(&r->lock);
    redisReply *rp = run(r, 2, argv, lens, &st, why, nwhy, "INFO on");
    const char *v = rp && rp->type == REDIS_REPLY_STRING ? strstr(rp->str, "redis_version:") : NULL;
    if (v) snprintf(out, nout, "%.*s", (int)strcspn(v + 14, "\r\n"), v + 14);
    if (rp) freeReplyObject(rp);
    pthread_mutex_unlock(&r->lock);
    return st;
}

kc_remote_status kc_remote_strlen(kc_remote *r, const char *name, uint64_t *n, char *why,
                                  size_t nwhy) {
    kc_remote_status st;
    redisReply *rp = on_name(r, "STRLEN", name, &st, why, nwhy, "STRLEN on");
    *n = rp && rp->type == REDIS_REPLY_INTEGER && rp->integer > 0 ? (uint64_t)rp->integer : 0;
    if (rp) freeReplyObject(rp);
    return st;
}

void kc_remote_close(kc_remote *r) {
    if (!r) return;
    if (r->ctx && r->pid == getpid()) drop(r);
    else if (r->ctx) redisFree(r->ctx);
    pthread_mutex_destroy(&r->lock);
    if (r->password) memset(r->password, 0, strlen(r->password));
    em_free_with(r->alloc, r->host);
    em_free_with(r->alloc, r->user);
    em_free_with(r->alloc, r->password);
    em_free_with(r->alloc, r->prefix);
    em_free_with(r->alloc, r);
}

#else /* no hiredis: kc_remote_open never returns a remote */

kc_remote *kc_remote_open(const char *url, const char *password, const char *prefix,
                          int timeout_ms, char *why, size_t nwhy) {
    (void)url, (void)password, (void)prefix, (void)timeout_ms;
    snprintf(why, nwhy, "this Ember was built without the remote tier (it needs hiredis and "
             "libcrypto: install libhiredis-dev and libssl-dev, then configure and build again)");
    return NULL;
}

const char *kc_remote_name(const kc_remote *r) {
    (void)r;
    return "";
}

int kc_remote_timeout(const kc_remote *r) {
    (void)r;
    return 0;
}

kc_remote_status kc_remote_get(kc_remote *r, const char *name, void **data, size_t *n, char *why,
                               size_t nwhy) {
    (void)r, (void)name, (void)nwhy, (void)why;
    *data = NULL;
    *n = 0;
    return KC_REMOTE_DOWN;
}

kc_remote_status kc_remote_set(kc_remote *r, const char *name, const void *data, size_t n,
                               bool replace, char *why, size_t nwhy) {
    (void)r, (void)name, (void)data, (void)n, (void)replace, (void)why, (void)nwhy;
    return KC_REMOTE_DOWN;
}

kc_remote_status kc_remote_scan(kc_remote *r, void (*each)(void *ud, const char *name), void *ud,
                                char *why, size_t nwhy) {
    (void)r, (void)each, (void)ud, (void)why, (void)nwhy;
    return KC_REMOTE_DOWN;
}

kc_remote_status kc_remote_version(kc_remote *r, char *out, size_t nout, char *why, size_t nwhy) {
    (void)r, (void)why, (void)nwhy;
    snprintf(out, nout, "unknown");
    return KC_REMOTE_DOWN;
}

kc_remote_status kc_remote_strlen(kc_remote *r, const char *name, uint64_t *n, char *why,
                                  size_t nwhy) {
    (void)r, (void)name, (void)why, (void)nwhy;
    *n = 0;
    return KC_REMOTE_DOWN;
}

void kc_remote_close(kc_remote *r) { (void)r; }

#endif
