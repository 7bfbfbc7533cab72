/* seal.c - signed envelopes: how an artifact travels through the remote
 * tier (remote.c).  A shared server is written by many machines, so what a
 * reader gets from it is trusted only when it carries an HMAC-SHA256 of
 * the whole entry (its key, kind, size, checksum and bytes) made with the
 * fleet's secret key (EMBER_CACHE_KEY_FILE).  An envelope is
 *
 *   ember-remote 1
 *   key <32 hex: the entry's key>
 *   kind <kind>
 *   size <payload bytes, decimal>
 *   xxh3-128 <32 hex: the payload's checksum>
 *   signer <16 hex: the id of the key that signed>
 *   hmac-sha256 <64 hex: over the lines above and the payload>
 *   <the payload>
 *
 * The key and kind inside the signature make an envelope valid under its
 * own name only: one copied to another key's name is refused.  The signer
 * id (a hash of the key, which reveals nothing about it) only lets a
 * reader say "signed with another key" instead of "tampered". */
#include "config.h" /* EMBER_HAVE_REMOTE */

#include "cache.h"

#include "eager.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef EMBER_HAVE_REMOTE
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#endif

#define HMAC_LEN 32

#ifdef EMBER_HAVE_REMOTE

/* HMAC-SHA256 of head then body, with k.  false when libcrypto fails. */
static bool hmac(const kc_seal_key *k, const void *head, size_t nhead, const void *body,
                 size_t nbody, uint8_t out[HMAC_LEN]) {
    EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                           OSSL_PARAM_construct_end()};
    size_t n = 0;
    bool ok = ctx && EVP_MAC_init(ctx, k->bytes, k->n, params) &&
              EVP_MAC_update(ctx, head, nhead) && (!nbody || EVP_MAC_update(ctx, body, nbody)) &&
              EVP_MAC_final(ctx, out, &n, HMAC_LEN) && n == HMAC_LEN;
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
    return ok;
}

/* The key's id: the first 8 bytes of SHA-256("ember-cache key id" key). */
static bool key_id(kc_seal_key *k) {
    static const char domain[] = "ember-cache key id";
    uint8_t d[32];
    unsigned n = 0;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    bool ok = ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) &&
              EVP_DigestUpdate(ctx, domain, sizeof domain - 1) &&
              EVP_DigestUpdate(ctx, k->bytes, k->n) && EVP_DigestFinal_ex(ctx, d, &n) && n == 32;
    EVP_MD_CTX_free(ctx);
    for (int i = 0; ok && i < 8; i++) snprintf(k->id + 2 * i, 3, "%02x", d[i]);
    return ok;
}

static bool same_mac(const uint8_t *a, const uint8_t *b) { return CRYPTO_memcmp(a, b, HMAC_LEN) == 0; }

#else

static bool hmac(const kc_seal_key *k, const void *head, size_t nhead, const void *body,
                 size_t nbody, uint8_t out[HMAC_LEN]) {
    (void)k, (void)head, (void)nhead, (void)body, (void)nbody, (void)out;
    return false;
}

static bool same_mac(const uint8_t *a, const uint8_t *b) { return memcmp(a, b, HMAC_LEN) == 0; }

#endif

/* ---- the key file ---- */

#ifdef EMBER_HAVE_REMOTE
/* Reads at most max bytes of the regular file at path into buf. */
static bool read_small(const char *path, uint8_t *buf, size_t max, size_t *n, char *why,
                       size_t nwhy) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    struct stat st;
    if (fd < 0) {
        snprintf(why, nwhy, "cannot open the key file %s: %s", path, strerror(errno));
        return false;
    }
    bool ok = false;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        snprintf(why, nwhy, "the key file %s is not a regular file", path);
    else if (st.st_mode & (S_IWGRP | S_IWOTH))
        snprintf(why, nwhy, "the key file %s is writable by others (mode %03o): anyone could "
                 "replace the key; chmod 600 it", path, (unsigned)(st.st_mode & 0777));
    else if (st.st_mode & S_IROTH)
        snprintf(why, nwhy, "the key file %s is readable by everyone (mode %03o): the key is no "
                 "secret; chmod 600 it", path, (unsigned)(st.st_mode & 0777));
    else if (st.st_uid != getuid() && st.st_uid != 0)
        snprintf(why, nwhy, "the key file %s belongs to another user (uid %u)", path,
                 (unsigned)st.st_uid);
    else if ((uint64_t)st.st_size > max)
        snprintf(why, nwhy, "the key file %s is larger than %zu bytes: not a key", path, max);
    else
        ok = true;
    ssize_t got = ok ? read(fd, buf, max) : -1;
    if (ok && got < 0) {
        snprintf(why, nwhy, "cannot read the key file %s: %s", path, strerror(errno));
        ok = false;
    }
    close(fd);
    *n = got > 0 ? (size_t)got : 0;
    return ok;
}

#endif

bool kc_seal_key_load(const char *path, kc_seal_key *k, char *why, size_t nwhy) {
    memset(k, 0, sizeof *k);
#ifndef EMBER_HAVE_REMOTE
    (void)path;
    snprintf(why, nwhy, "this Ember was built without the remote tier (it needs hiredis and "
             "libcrypto: install libhiredis-dev and libssl-dev, then configure and build again)");
    return false;
#else
    size_t n;
    if (!read_small(path, k->bytes, sizeof k->bytes, &n, why, nwhy)) return false;
    /* `openssl rand -hex 32 > key` leaves a newline: not part of the key */
    while (n > 0 && (k->bytes[n - 1] == '\n' || k->bytes[n - 1] == '\r' ||
                     k->bytes[n - 1] == ' ' || k->bytes[n - 1] == '\t'))
        n--;
    if (n < KC_SEAL_KEY_MIN) {
        snprintf(why, nwhy, "the key file %s holds %zu bytes: a key has at least %d (make one "
                 "with `ember-cache keygen FILE`)", path, n, KC_SEAL_KEY_MIN);
        memset(k, 0, sizeof *k);
        return false;
    }
    k->n = n;
    if (!key_id(k)) {
        snprintf(why, nwhy, "libcrypto cannot hash the key");
        memset(k, 0, sizeof *k);
        return false;
    }
    return true;
#endif
}

/* ---- envelopes ---- */

/* The signed header of an envelope (without its hmac line) into buf. */
static size_t head_format(const kc_seal_key *k, const kc_key *key, const char *kind, size_t n,
                          const kc_sum *sum, char *buf, size_t nbuf) {
    char hex[KC_KEY_HEX_SIZE], sh[KC_KEY_HEX_SIZE];
    kc_key_hex(key, hex);
    kc_key sk;
    memcpy(sk.bytes, sum->bytes, sizeof sk.bytes);
    kc_key_hex(&sk, sh);
    int len = snprintf(buf, nbuf, "ember-remote 1\nkey %s\nkind %s\nsize %zu\nxxh3-128 %s\nsigner %s\n",
                       hex, kind, n, sh, k->id);
    return len > 0 && (size_t)len < nbuf ? (size_t)len : 0;
}

void *kc_seal(const kc_seal_key *k, const kc_key *key, const char *kind, const void *data,
              size_t n, size_t *out_n) {
    char head[KC_META_MAX];
    kc_sum sum = kc_checksum(data, n);
    size_t nh = head_format(k, key, kind, n, &sum, head, sizeof head);
    uint8_t mac[HMAC_LEN];
    if (!nh || !hmac(k, head, nh, data, n, mac)) {
        em_error(EM_ERR_STATE, "cache: cannot sign an entry (libcrypto failed)");
        return NULL;
    }
    char line[16 + 2 * HMAC_LEN];
    int nl = snprintf(line, sizeof line, "hmac-sha256 ");
    for (int i = 0; i < HMAC_LEN; i++) nl += snprintf(line + nl, sizeof line - (size_t)nl, "%02x", mac[i]);
    line[nl++] = '\n';
    uint8_t *out = em_malloc(nh + (size_t)nl + n);
    if (!out) return NULL;
    memcpy(out, head, nh);
    memcpy(out + nh, line, (size_t)nl);
    if (n) memcpy(out + nh + (size_t)nl, data, n);
    *out_n = nh + (size_t)nl + n;
    return out;
}

static bool parse_hex(const char *s, size_t len, uint8_t *out) {
    for (size_t i = 0; i < len / 2; i++) {
        unsigned v = 0;
        for (int j = 0; j < 2; j++) {
            char c = s[2 * i + (size_t)j];
            unsigned d = c >= '0' && c <= '9' ? (unsigned)(c - '0')
                         : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10) : 16u;
            if (d > 15) return false;
            v = v << 4 | d;
        }
        out[i] = (uint8_t)v;
    }
    return true;
}

/* An envelope's header, parsed. */
typedef struct seal_head {
    kc_key key;
    char kind[KC_KIND_MAX + 1];
    uint64_t size;
    kc_sum sum;
    char signer[17];
    uint8_t mac[HMAC_LEN];
    size_t nhead;  /* bytes of the signed header */
    size_t nbody;  /* where the payload starts */
} seal_head;

/* The line at *p (before end) into buf without its newline, NUL-ended, and
 * *p past it: the bytes come from the network, so sscanf only ever sees a
 * copy that ends.  false when there is no newline within nbuf bytes. */
static bool next_line(const char **p, const char *end, char *buf, size_t nbuf) {
    size_t room = (size_t)(end - *p) < nbuf ? (size_t)(end - *p) : nbuf;
    const char *nl = memchr(*p, '\n', room);
    if (!nl) return false;
    memcpy(buf, *p, (size_t)(nl - *p));
    buf[nl - *p] = '\0';
    *p = nl + 1;
    return true;
}

/* Reads the header's fields; false if it is not one kc_seal writes (the
 * caller checks the exact text by writing it again). */
static bool head_parse(const char *env, size_t n, seal_head *h) {
    const char *p = env, *end = env + n;
    char l[160], hex[40], sh[40], mac[2 * HMAC_LEN + 1];
    kc_key sk;
    if (!next_line(&p, end, l, sizeof l) || strcmp(l, "ember-remote 1") != 0) return false;
    if (!next_line(&p, end, l, sizeof l) || sscanf(l, "key %32[0-9a-f]", hex) != 1 ||
        !kc_key_from_hex(hex, &h->key))
        return false;
    if (!next_line(&p, end, l, sizeof l) || sscanf(l, "kind %15[a-z0-9_]", h->kind) != 1) return false;
    if (!next_line(&p, end, l, sizeof l) || sscanf(l, "size %" SCNu64, &h->size) != 1) return false;
    if (!next_line(&p, end, l, sizeof l) || sscanf(l, "xxh3-128 %32[0-9a-f]", sh) != 1 ||
        !kc_key_from_hex(sh, &sk))
        return false;
    memcpy(h->sum.bytes, sk.bytes, sizeof h->sum.bytes);
    if (!next_line(&p, end, l, sizeof l) || sscanf(l, "signer %16[0-9a-f]", h->signer) != 1 ||
        strlen(h->signer) != 16)
        return false;
    h->nhead = (size_t)(p - env);
    if (!next_line(&p, end, l, sizeof l) || sscanf(l, "hmac-sha256 %64[0-9a-f]", mac) != 1 ||
        strlen(mac) != 2 * HMAC_LEN || !parse_hex(mac, 2 * HMAC_LEN, h->mac))
        return false;
    h->nbody = (size_t)(p - env);
    return true;
}

kc_read kc_unseal(const kc_seal_key *k, const kc_key *key, const char *kind, const void *env,
                  size_t n, const void **payload, size_t *np, char *why, size_t nwhy) {
    seal_head h;
    memset(&h, 0, sizeof h);
    if (!head_parse(env, n, &h)) {
        snprintf(why, nwhy, "not a signed Ember entry (no or a damaged envelope)");
        return KC_READ_CORRUPT;
    }
    /* the exact text kc_seal writes, so that nothing unsigned hides in it */
    char again[KC_META_MAX];
    kc_seal_key signer = *k;
    memcpy(signer.id, h.signer, sizeof signer.id);
    size_t nh = head_format(&signer, &h.key, h.kind, (size_t)h.size, &h.sum, again, sizeof again);
    if (nh != h.nhead || memcmp(again, env, nh) != 0) {
        snprintf(why, nwhy, "a damaged envelope header");
        return KC_READ_CORRUPT;
    }
    if (strcmp(h.signer, k->id) != 0) {
        snprintf(why, nwhy, "signed with another key (key id %s; ours is %s)", h.signer, k->id);
        return KC_READ_REFUSED;
    }
    const uint8_t *body = (const uint8_t *)env + h.nbody;
    size_t nbody = n - h.nbody;
    uint8_t mac[HMAC_LEN];
    if (!hmac(k, env, h.nhead, body, nbody, mac)) {
        snprintf(why, nwhy, "libcrypto cannot check the signature");
        return KC_READ_REFUSED;
    }
    if (!same_mac(mac, h.mac)) {
        snprintf(why, nwhy, "the signature does not match: the entry was changed after signing");
        return KC_READ_CORRUPT;
    }
    /* signed: what follows only catches a signer's own mistakes */
    if (!kc_key_equal(&h.key, key) || strcmp(h.kind, kind) != 0) {
        snprintf(why, nwhy, "a signed entry filed under another name");
        return KC_READ_CORRUPT;
    }
    kc_sum sum = kc_checksum(body, nbody);
    if (h.size != nbody || memcmp(sum.bytes, h.sum.bytes, sizeof sum.bytes) != 0) {
        snprintf(why, nwhy, "the payload does not match its signed size and checksum");
        return KC_READ_CORRUPT;
    }
    *payload = body;
    *np = nbody;
    return KC_READ_OK;
}
