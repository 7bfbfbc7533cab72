/* wordpiece.c - BERT's uncased WordPiece tokenizer, reading vocab.txt.
 *
 * Three steps, as Hugging Face tokenizers' BertNormalizer, BertPreTokenizer
 * and WordPiece model (the tokenizer sentence-transformers runs):
 *  1. normalize: drop NUL, U+FFFD and control characters, turn whitespace
 *     into spaces, put spaces around CJK ideographs, strip accents (NFD
 *     without nonspacing marks) and lowercase;
 *  2. split into words at whitespace (dropped) and punctuation (each
 *     punctuation character a word of its own);
 *  3. cut each word greedily into the longest vocabulary pieces from the
 *     left, continuations prefixed with "##"; a word with no such cut, or
 *     longer than 100 characters, is [UNK].
 * Then [CLS] ... [SEP] around the pieces. */
#include "minilm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WP_MAX_WORD_CHARS 100      /* tokenizers' max_input_chars_per_word */
#define WP_MAX_VOCAB_BYTES (64u << 20) /* a vocabulary file larger is refused */

struct wp_vocab {
    char *text;          /* the file, lines NUL-terminated in place */
    const char **tok;    /* tokens by id */
    size_t *len;
    int count;
    int32_t *slots;      /* open addressing: id + 1, 0 for empty */
    size_t mask;
    int32_t cls, sep, unk;
};

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

int32_t wp_vocab_id(const wp_vocab *v, const char *s, size_t n) {
    for (size_t i = hash_bytes(s, n) & v->mask;; i = (i + 1) & v->mask) {
        int32_t id = v->slots[i] - 1;
        if (id < 0) return -1;
        if (v->len[id] == n && !memcmp(v->tok[id], s, n)) return id;
    }
}

int wp_vocab_size(const wp_vocab *v) { return v ? v->count : 0; }

/* Reads the whole file (bounded) into a NUL-terminated buffer. */
static char *read_file(const char *path, size_t *len, ml_error *e) {
    FILE *f = fopen(path, "rb");
    if (!f) return ml_fail(e, ML_ERR_IO, "cannot open %s", path), NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (cap - n < 65536) {
            cap = cap ? 2 * cap : 1 << 20;
            char *b = cap > WP_MAX_VOCAB_BYTES + 1 ? NULL : realloc(buf, cap + 1);
            if (!b) {
                ml_fail(e, cap > WP_MAX_VOCAB_BYTES + 1 ? ML_ERR_FORMAT : ML_ERR_NOMEM,
                        "%s: too large for a vocabulary (or out of memory)", path);
                free(buf);
                fclose(f);
                return NULL;
            }
            buf = b;
        }
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0) break;
    }
    bool err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return ml_fail(e, ML_ERR_IO, "error reading %s", path), NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* Splits text into lines in place: tokens by id, "\r\n" endings allowed. */
static ml_status index_lines(wp_vocab *v, size_t n, const char *path, ml_error *e) {
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += v->text[i] == '\n';
    lines += n > 0 && v->text[n - 1] != '\n';
    if (lines == 0) return ml_fail(e, ML_ERR_FORMAT, "%s: empty vocabulary", path);
    v->tok = malloc(sizeof *v->tok * (size_t)lines);
    v->len = malloc(sizeof *v->len * (size_t)lines);
    if (!v->tok || !v->len) return ml_fail(e, ML_ERR_NOMEM, "out of memory");
    char *p = v->text, *end = v->text + n;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        char *stop = nl ? nl : end;
        if (stop > p && stop[-1] == '\r') stop--;
        *stop = '\0';
        v->tok[v->count] = p;
        v->len[v->count++] = (size_t)(stop - p);
        p = nl ? nl + 1 : end;
    }
    return ML_OK;
}

static ml_status build_table(wp_vocab *v, ml_error *e) {
    size_t cap = 16;
    while (cap < 2 * (size_t)v->count) cap *= 2;
    v->slots = calloc(cap, sizeof *v->slots);
    if (!v->slots) return ml_fail(e, ML_ERR_NOMEM, "out of memory");
    v->mask = cap - 1;
    for (int id = 0; id < v->count; id++) {
        if (wp_vocab_id(v, v->tok[id], v->len[id]) >= 0) continue; /* first one wins */
        size_t i = hash_bytes(v->tok[id], v->len[id]) & v->mask;
        while (v->slots[i]) i = (i + 1) & v->mask;
        v->slots[i] = id + 1;
    }
    return ML_OK;
}

wp_vocab *wp_vocab_load(const char *path, ml_error *e) {
    wp_vocab *v = calloc(1, sizeof *v);
    size_t n = 0;
    if (!v) return ml_fail(e, ML_ERR_NOMEM, "out of memory"), NULL;
    if (!(v->text = read_file(path, &n, e)) || index_lines(v, n, path, e) != ML_OK ||
        build_table(v, e) != ML_OK) {
        wp_vocab_free(v);
        return NULL;
    }
    v->cls = wp_vocab_id(v, "[CLS]", 5);
    v->sep = wp_vocab_id(v, "[SEP]", 5);
    v->unk = wp_vocab_id(v, "[UNK]", 5);
    if (v->cls < 0 || v->sep < 0 || v->unk < 0) {
        ml_fail(e, ML_ERR_FORMAT, "%s: no [CLS], [SEP] or [UNK] token: not a BERT vocabulary", path);
        wp_vocab_free(v);
        return NULL;
    }
    return v;
}

void wp_vocab_free(wp_vocab *v) {
    if (!v) return;
    free(v->text);
    free(v->tok);
    free(v->len);
    free(v->slots);
    free(v);
}

/* ---- encoding ---- */

typedef struct wp_out {
    int32_t *ids;
    int n, max;         /* pieces kept, room for pieces (max_tokens - 2) */
} wp_out;

static void emit(wp_out *o, int32_t id) {
    if (o->n < o->max) o->ids[o->n++] = id;
}

/* Step 1: text -> normalized code points (at most 3 per input byte). */
static size_t normalize(const char *text, size_t len, uint32_t *cps) {
    const unsigned char *s = (const unsigned char *)text;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t c;
        i += mu_utf8_decode(s + i, len - i, &c);
        if (c == 0 || c == 0xFFFD || mu_is_control(c)) continue;
        if (mu_is_whitespace(c)) {
            cps[n++] = ' ';
        } else if (mu_is_cjk(c)) {
            /* the ideograph itself is folded too: compatibility ideographs
             * (U+F900...) decompose to unified ones */
            uint32_t f[3];
            int k = mu_fold_char(c, f);
            cps[n++] = ' ';
            for (int j = 0; j < k; j++) cps[n++] = f[j];
            cps[n++] = ' ';
        } else {
            n += (size_t)mu_fold_char(c, cps + n);
        }
    }
    return n;
}

/* Step 3 for one word w[0..n): its pieces, or [UNK]. */
static void wordpiece(const wp_vocab *v, const uint32_t *w, size_t n, char *buf, wp_out *o) {
    if (n > WP_MAX_WORD_CHARS) {
        emit(o, v->unk);
        return;
    }
    int32_t pieces[WP_MAX_WORD_CHARS];
    int np = 0;
    for (size_t start = 0; start < n;) {
        int32_t id = -1;
        size_t end = n;
        for (; end > start; end--) {
            size_t b = 0;
            if (start > 0) buf[b++] = '#', buf[b++] = '#';
            for (size_t k = start; k < end; k++) b += mu_utf8_encode(w[k], buf + b);
            if ((id = wp_vocab_id(v, buf, b)) >= 0) break;
        }
        if (id < 0) {
            emit(o, v->unk);
            return;
        }
        pieces[np++] = id;
        start = end;
    }
    for (int i = 0; i < np; i++) emit(o, pieces[i]);
}

/* Step 2: words at whitespace and punctuation, each cut by wordpiece(). */
static void split_words(const wp_vocab *v, const uint32_t *cps, size_t n, char *buf, wp_out *o) {
    size_t start = 0;
    for (size_t i = 0; i <= n && o->n < o->max; i++) {
        bool ws = i < n && mu_is_whitespace(cps[i]), p = i < n && mu_is_punct(cps[i]);
        if (i < n && !ws && !p) continue;
        if (i > start) wordpiece(v, cps + start, i - start, buf, o);
        if (p) wordpiece(v, cps + i, 1, buf, o);
        start = i + 1;
    }
}

ml_status wp_encode(const wp_vocab *v, const char *text, size_t len, int max_tokens,
                    int32_t *ids, int *n, ml_error *e) {
    if (!v || !ids || !n || (!text && len) || max_tokens < 2)
        return ml_fail(e, ML_ERR_ARG, "wp_encode: bad arguments");
    if (len > (SIZE_MAX / sizeof(uint32_t) - 4) / 3) return ml_fail(e, ML_ERR_ARG, "text too long");
    uint32_t *cps = malloc(sizeof *cps * (3 * len + 1));
    /* a piece: "##" and up to 100 code points of 4 bytes */
    char *buf = malloc(2 + 4 * WP_MAX_WORD_CHARS);
    if (!cps || !buf) {
        free(cps);
        free(buf);
        return ml_fail(e, ML_ERR_NOMEM, "out of memory");
    }
    ids[0] = v->cls;
    wp_out o = {ids + 1, 0, max_tokens - 2};
    split_words(v, cps, normalize(text, len, cps), buf, &o);
    ids[o.n + 1] = v->sep;
    *n = o.n + 2;
    free(cps);
    free(buf);
    return ML_OK;
}
