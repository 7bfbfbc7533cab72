/* unicode.c - UTF-8 and the character classes of BERT's normalizer.
 *
 * The definitions follow Hugging Face tokenizers' BertNormalizer and
 * BertPreTokenizer (what sentence-transformers runs), not Python's slow
 * BertTokenizer: control is "category C*", whitespace is Rust's
 * char::is_whitespace (the White_Space property), and the CJK ranges are
 * tokenizers' own.  Tables for code points >= 0x80 are in unicode_data.c. */
#include "minilm.h"

#include <stdlib.h>
#include <string.h>

size_t mu_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    /* lead byte: sequence length and the smallest code point it may hold */
    size_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    *cp = 0xFFFD;
    if (len == 0 || len > n) return 1;
    uint32_t v = c & (0x7F >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 1;
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 1;
    *cp = v;
    return len;
}

size_t mu_utf8_prefix(const char *s, size_t maxchars, bool *more) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = strlen(s), at = 0;
    uint32_t cp;
    for (size_t c = 0; c < maxchars && at < n; c++) at += mu_utf8_decode(u + at, n - at, &cp);
    if (more) *more = at < n;
    return at;
}

size_t mu_utf8_encode(uint32_t cp, char *out) {
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static bool in_ranges(const mu_range *r, size_t n, uint32_t c) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c < r[mid].lo) hi = mid;
        else if (c > r[mid].hi) lo = mid + 1;
        else return true;
    }
    return false;
}

bool mu_is_control(uint32_t c) {
    if (c == '\t' || c == '\n' || c == '\r') return false;
    if (c < 0x80) return c < 0x20 || c == 0x7F;
    return in_ranges(mu_other, mu_other_count, c);
}

bool mu_is_whitespace(uint32_t c) {
    switch (c) {
    case ' ': case '\t': case '\n': case '\v': case '\f': case '\r':
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F:
    case 0x205F: case 0x3000:
        return true;
    default:
        return c >= 0x2000 && c <= 0x200A;
    }
}

bool mu_is_punct(uint32_t c) {
    if (c < 0x80)
        return (c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) ||
               (c >= 123 && c <= 126);
    return in_ranges(mu_punct, mu_punct_count, c);
}

bool mu_is_cjk(uint32_t c) {
    return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
           (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
           (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
           (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

static int cmp_fold(const void *key, const void *elem) {
    uint32_t c = *(const uint32_t *)key, e = ((const mu_fold *)elem)->cp;
    return (c > e) - (c < e);
}

/* Hangul syllables decompose under NFD into two or three jamo (Unicode
 * 3.12), which have no case and no marks to strip. */
static int hangul(uint32_t c, uint32_t out[3]) {
    uint32_t s = c - 0xAC00, t = s % 28;
    out[0] = 0x1100 + s / (21 * 28);
    out[1] = 0x1161 + (s % (21 * 28)) / 28;
    if (t == 0) return 2;
    out[2] = 0x11A7 + t;
    return 3;
}

int mu_fold_char(uint32_t c, uint32_t out[3]) {
    if (c < 0x80) {
        out[0] = c >= 'A' && c <= 'Z' ? c + 32 : c;
        return 1;
    }
    if (c >= 0xAC00 && c <= 0xD7A3) return hangul(c, out);
    const mu_fold *f = bsearch(&c, mu_folds, mu_folds_count, sizeof *mu_folds, cmp_fold);
    if (!f) {
        out[0] = c;
        return 1;
    }
    for (int i = 0; i < f->n; i++) out[i] = f->out[i];
    return f->n;
}
