/* json.c - a small JSON parser for safetensors headers and config files.
 *
 * Recursive descent over a length-bounded buffer: every read checks the
 * position against the end first, so input that is not NUL-terminated or
 * stops mid-token is an error, never an overread.  Nodes live in one array
 * (children linked by index); decoded strings live in one buffer as long
 * as the input, which is enough because a decoded JSON string plus its NUL
 * is never longer than its quoted source. */
#include "minilm.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JS_MAX_DEPTH 64

typedef struct js_node {
    js_type type;
    int first, next, last;  /* children (first, last) and next sibling: -1 for none */
    const char *key;        /* member name, in doc->strings */
    const char *str;        /* JS_STR value, in doc->strings */
    size_t len;             /* its length in bytes (it may hold \0) */
    double num;
    int64_t i;              /* JS_NUM: the integer value when is_int */
    bool is_int, boolean;
} js_node;

struct js_doc {
    js_node *nodes;
    int count, cap;
    char *strings;          /* decoded strings, back to back */
    size_t used;
};

typedef struct parser {
    const char *s;
    size_t len, pos;
    js_doc *d;
    ml_error *e;
} parser;

ml_status ml_fail(ml_error *e, ml_status s, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return s;
}

static bool fail(parser *p, const char *what) {
    ml_fail(p->e, ML_ERR_FORMAT, "JSON: %s at byte %zu", what, p->pos);
    return false;
}

static void skip_ws(parser *p) {
    while (p->pos < p->len && strchr(" \t\r\n", p->s[p->pos]) && p->s[p->pos]) p->pos++;
}

static int new_node(parser *p, js_type t, int parent) {
    js_doc *d = p->d;
    if (d->count == d->cap) {
        int cap = d->cap ? 2 * d->cap : 64;
        js_node *n = realloc(d->nodes, sizeof *n * (size_t)cap);
        if (!n) {
            ml_fail(p->e, ML_ERR_NOMEM, "JSON: out of memory");
            return -1;
        }
        d->nodes = n;
        d->cap = cap;
    }
    int k = d->count++;
    d->nodes[k] = (js_node){.type = t, .first = -1, .next = -1, .last = -1};
    if (parent >= 0) {
        js_node *par = &d->nodes[parent];
        if (par->last >= 0) d->nodes[par->last].next = k;
        else par->first = k;
        par->last = k;
    }
    return k;
}

static int hex4(parser *p) {
    if (p->len - p->pos < 4) return -1;
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p->s[p->pos++];
        int h = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (h < 0) return -1;
        v = v * 16 + h;
    }
    return v;
}

/* \uXXXX, with a following low surrogate when XXXX is a high one. */
static bool unicode_escape(parser *p, char *out, size_t *n) {
    int c = hex4(p);
    if (c < 0) return fail(p, "bad \\u escape");
    uint32_t cp = (uint32_t)c;
    if (c >= 0xD800 && c <= 0xDBFF && p->len - p->pos >= 6 && p->s[p->pos] == '\\' &&
        p->s[p->pos + 1] == 'u') {
        size_t save = p->pos;
        p->pos += 2;
        int lo = hex4(p);
        if (lo >= 0xDC00 && lo <= 0xDFFF) cp = 0x10000 + ((uint32_t)(c - 0xD800) << 10) + (uint32_t)(lo - 0xDC00);
        else p->pos = save;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* a lone surrogate */
    *n += mu_utf8_encode(cp, out + *n);
    return true;
}

/* A string at p->pos (after its opening quote): decoded into d->strings;
 * *len (if not NULL) gets its length. */
static const char *parse_string(parser *p, size_t *len) {
    char *out = p->d->strings + p->d->used;
    size_t n = 0;
    for (;;) {
        if (p->pos >= p->len) return fail(p, "unterminated string"), NULL;
        unsigned char c = (unsigned char)p->s[p->pos++];
        if (c == '"') break;
        if (c < 0x20) return fail(p, "control character in string"), NULL;
        if (c != '\\') {
            out[n++] = (char)c;
            continue;
        }
        if (p->pos >= p->len) return fail(p, "unterminated escape"), NULL;
        char esc = p->s[p->pos++];
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        const char *hit = esc ? strchr(from, esc) : NULL;
        if (hit) out[n++] = to[hit - from];
        else if (esc == 'u') {
            if (!unicode_escape(p, out, &n)) return NULL;
        } else return fail(p, "bad escape"), NULL;
    }
    out[n] = '\0';
    p->d->used += n + 1;
    if (len) *len = n;
    return out;
}

static bool parse_number(parser *p, js_node *node) {
    size_t start = p->pos;
    while (p->pos < p->len && strchr("+-0123456789.eE", p->s[p->pos]) && p->s[p->pos]) p->pos++;
    size_t n = p->pos - start;
    char buf[64];
    if (n == 0 || n >= sizeof buf) return fail(p, "bad number");
    memcpy(buf, p->s + start, n);
    buf[n] = '\0';
    char *end;
    errno = 0;
    node->num = strtod(buf, &end);
    if (*end || (buf[0] != '-' && (buf[0] < '0' || buf[0] > '9'))) return fail(p, "bad number");
    if (!strpbrk(buf, ".eE")) {
        errno = 0;
        long long v = strtoll(buf, &end, 10);
        node->is_int = errno == 0 && !*end;
        node->i = v;
    }
    return true;
}

static bool parse_literal(parser *p, js_node *node) {
    static const struct { const char *word; js_type t; bool b; } lits[] = {
        {"true", JS_BOOL, true}, {"false", JS_BOOL, false}, {"null", JS_NULL, false}};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(lits[i].word);
        if (p->len - p->pos >= n && !memcmp(p->s + p->pos, lits[i].word, n)) {
            p->pos += n;
            node->type = lits[i].t;
            node->boolean = lits[i].b;
            return true;
        }
    }
    return fail(p, "unexpected character");
}

static int parse_value(parser *p, int parent, const char *key, int depth);

/* The members or elements of a container whose opening bracket is read. */
static bool parse_items(parser *p, int k, bool object, int depth) {
    char close = object ? '}' : ']';
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        return true;
    }
    for (;;) {
        const char *key = NULL;
        skip_ws(p);
        if (object) {
            if (p->pos >= p->len || p->s[p->pos] != '"') return fail(p, "expected a member name");
            p->pos++;
            if (!(key = parse_string(p, NULL))) return false;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') return fail(p, "expected ':'");
            p->pos++;
        }
        if (parse_value(p, k, key, depth + 1) < 0) return false;
        skip_ws(p);
        if (p->pos >= p->len) return fail(p, "unterminated container");
        char c = p->s[p->pos++];
        if (c == close) return true;
        if (c != ',') return fail(p, "expected ',' or a closing bracket");
    }
}

static int parse_value(parser *p, int parent, const char *key, int depth) {
    if (depth > JS_MAX_DEPTH) return fail(p, "nesting too deep"), -1;
    skip_ws(p);
    if (p->pos >= p->len) return fail(p, "unexpected end"), -1;
    int k = new_node(p, JS_NULL, parent);
    if (k < 0) return -1;
    p->d->nodes[k].key = key;
    char c = p->s[p->pos];
    bool ok;
    if (c == '{' || c == '[') {
        p->d->nodes[k].type = c == '{' ? JS_OBJ : JS_ARR;
        p->pos++;
        ok = parse_items(p, k, c == '{', depth);
    } else if (c == '"') {
        p->pos++;
        size_t n = 0;
        const char *s = parse_string(p, &n);
        p->d->nodes[k].type = JS_STR;
        p->d->nodes[k].len = n;
        p->d->nodes[k].str = s;
        ok = s != NULL;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        p->d->nodes[k].type = JS_NUM;
        ok = parse_number(p, &p->d->nodes[k]);
    } else ok = parse_literal(p, &p->d->nodes[k]);
    return ok ? k : -1;
}

js_doc *js_parse(const char *src, size_t len, ml_error *e) {
    js_doc *d = calloc(1, sizeof *d);
    if (!d || !(d->strings = malloc(len + 1))) {
        free(d);
        ml_fail(e, ML_ERR_NOMEM, "JSON: out of memory");
        return NULL;
    }
    parser p = {src, len, 0, d, e};
    bool ok = parse_value(&p, -1, NULL, 0) == 0;
    if (ok) {
        skip_ws(&p);
        if (p.pos != len) ok = fail(&p, "trailing characters");
    }
    if (!ok) {
        js_free(d);
        return NULL;
    }
    return d;
}

void js_free(js_doc *d) {
    if (!d) return;
    free(d->nodes);
    free(d->strings);
    free(d);
}

static const js_node *node_at(const js_doc *d, int k) {
    return d && k >= 0 && k < d->count ? &d->nodes[k] : NULL;
}

js_type js_type_of(const js_doc *d, int k) {
    const js_node *n = node_at(d, k);
    return n ? n->type : JS_NULL;
}

int js_first(const js_doc *d, int k) {
    const js_node *n = node_at(d, k);
    return n ? n->first : -1;
}

int js_next(const js_doc *d, int k) {
    const js_node *n = node_at(d, k);
    return n ? n->next : -1;
}

const char *js_key(const js_doc *d, int k) {
    const js_node *n = node_at(d, k);
    return n ? n->key : NULL;
}

const char *js_str(const js_doc *d, int k) {
    const js_node *n = node_at(d, k);
    return n && n->type == JS_STR ? n->str : NULL;
}

size_t js_len(const js_doc *d, int k) {
    const js_node *n = node_at(d, k);
    return n && n->type == JS_STR ? n->len : 0;
}

int js_get(const js_doc *d, int k, const char *key) {
    if (js_type_of(d, k) != JS_OBJ) return -1;
    for (int c = js_first(d, k); c >= 0; c = js_next(d, c))
        if (!strcmp(d->nodes[c].key, key)) return c;
    return -1;
}

bool js_int(const js_doc *d, int k, int64_t *out) {
    const js_node *n = node_at(d, k);
    if (!n || n->type != JS_NUM || !n->is_int) return false;
    *out = n->i;
    return true;
}

bool js_num(const js_doc *d, int k, double *out) {
    const js_node *n = node_at(d, k);
    if (!n || n->type != JS_NUM) return false;
    *out = n->num;
    return true;
}
