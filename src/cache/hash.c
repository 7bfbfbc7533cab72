/* hash.c - keys and checksums: the key hasher, hex forms, payload checksums,
 * and the size syntax of EMBER_CACHE_MAX_SIZE. */
#include "cache.h"

#include "eager.h"

#include <errno.h>
#include <stdalign.h>
#include <string.h>
#include <unistd.h>

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t's size, to keep it in kc_hasher */
#include <xxhash.h>

_Static_assert(sizeof(XXH3_state_t) <= sizeof(((kc_hasher *)0)->state),
               "kc_hasher cannot hold an XXH3 state: enlarge kc_hasher.state");
_Static_assert(alignof(XXH3_state_t) <= 64, "kc_hasher.state is 64-byte aligned");

/* What every key starts with: the domain and the format version. */
static const char key_domain[8] = {'e', 'm', 'b', 'e', 'r', '-', 'k', 'c'};

static XXH3_state_t *state_of(kc_hasher *h) { return (XXH3_state_t *)h->state; }

void kc_hasher_reset_version(kc_hasher *h, uint32_t version) {
    XXH3_128bits_reset(state_of(h));
    XXH3_128bits_update(state_of(h), key_domain, sizeof key_domain);
    kc_hasher_update_u64(h, version);
}

void kc_hasher_reset(kc_hasher *h) { kc_hasher_reset_version(h, KC_FORMAT_VERSION); }

void kc_hasher_update(kc_hasher *h, const void *data, size_t n) {
    if (n) XXH3_128bits_update(state_of(h), data, n);
}

void kc_hasher_update_u64(kc_hasher *h, uint64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)(v >> (8 * i));
    XXH3_128bits_update(state_of(h), b, sizeof b);
}

void kc_hasher_update_str(kc_hasher *h, const char *s) {
    /* A length of 2^64-1 marks NULL: no string has it. */
    if (!s) {
        kc_hasher_update_u64(h, UINT64_MAX);
        return;
    }
    size_t n = strlen(s);
    kc_hasher_update_u64(h, n);
    kc_hasher_update(h, s, n);
}

kc_key kc_hasher_digest(const kc_hasher *h) {
    XXH128_hash_t d = XXH3_128bits_digest((const XXH3_state_t *)h->state);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, d);
    kc_key k;
    memcpy(k.bytes, c.digest, sizeof k.bytes);
    return k;
}

static const char hexdigits[] = "0123456789abcdef";

void kc_key_hex(const kc_key *k, char out[KC_KEY_HEX_SIZE]) {
    for (int i = 0; i < 16; i++) {
        out[2 * i] = hexdigits[k->bytes[i] >> 4];
        out[2 * i + 1] = hexdigits[k->bytes[i] & 15];
    }
    out[32] = '\0';
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

bool kc_key_from_hex(const char *s, kc_key *k) {
    for (int i = 0; i < 16; i++) {
        int hi = hexval(s[2 * i]);
        if (hi < 0) return false;
        int lo = hexval(s[2 * i + 1]);
        if (lo < 0) return false;
        k->bytes[i] = (uint8_t)(hi << 4 | lo);
    }
    return s[32] == '\0';
}

bool kc_key_equal(const kc_key *a, const kc_key *b) {
    return memcmp(a->bytes, b->bytes, sizeof a->bytes) == 0;
}

static kc_sum sum_of(XXH128_hash_t d) {
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, d);
    kc_sum s;
    memcpy(s.bytes, c.digest, sizeof s.bytes);
    return s;
}

kc_sum kc_checksum(const void *data, size_t n) { return sum_of(XXH3_128bits(data, n)); }

bool kc_checksum_fd(int fd, kc_sum *sum, uint64_t *n) { return kc_checksum_copy(fd, -1, sum, n); }

bool kc_write_all(int out, const void *data, size_t n) {
    const unsigned char *p = data;
    while (n > 0) {
        ssize_t w = write(out, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

bool kc_checksum_copy(int fd, int out, kc_sum *sum, uint64_t *n) {
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    unsigned char buf[16384];
    uint64_t total = 0;
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return false;
        if (r == 0) break;
        XXH3_128bits_update(&st, buf, (size_t)r);
        if (out >= 0 && !kc_write_all(out, buf, (size_t)r)) return false;
        total += (uint64_t)r;
    }
    *sum = sum_of(XXH3_128bits_digest(&st));
    *n = total;
    return true;
}

bool kc_size_from_str(const char *s, uint64_t *out) {
    const char *p = s;
    uint64_t v = 0;
    if (*p < '0' || *p > '9') return false;
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - (uint64_t)(*p - '0')) / 10) return false;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    int shift = 0;
    switch (*p) {
    case 'k': case 'K': shift = 10; p++; break;
    case 'm': case 'M': shift = 20; p++; break;
    case 'g': case 'G': shift = 30; p++; break;
    case 't': case 'T': shift = 40; p++; break;
    default: break;
    }
    if (shift && (*p == 'i' || *p == 'I')) p++;
    if (*p == 'b' || *p == 'B') p++;
    if (*p != '\0' || (shift && v > UINT64_MAX >> shift)) return false;
    *out = v << shift;
    return true;
}

em_status kc_parse_size(const char *s, uint64_t *out) {
    if (!s || !out) return em_error(EM_ERR_NULL, "kc_parse_size: argument is NULL");
    if (kc_size_from_str(s, out)) return EM_OK;
    return em_error(EM_ERR_ARG, "kc_parse_size: bad size '%s': expected bytes, or a number "
                    "with K, M, G or T", s);
}
