/* text.c - the graph's text form (printing and parsing) and Graphviz DOT.
 *
 *   graph(%x: f32[4, 8]{8, 1}, %w: f32[8, 16]{16, 1}) {
 *     %2 = constant #0 : f32[16]{1}
 *     %3 = matmul(%x, %w) : f32[4, 16]{16, 1}
 *     return (%3)
 *   }
 *
 * Grammar of what tr_parse reads (blanks are spaces, tabs and CRs; they may
 * separate any two tokens; lines are significant):
 *
 *   text   := blank-lines 'graph' '(' [input {',' input}] ')' '{' EOL
 *             {node EOL} 'return' '(' ref {',' ref} ')' EOL '}' EOL blank-lines
 *   input  := '%' name ':' meta
 *   node   := '%' INT '=' 'constant' '#' INT ':' meta
 *           | '%' INT '=' OP '(' [ref {',' ref}] ')' ['[' attr {',' attr} ']'] ':' meta
 *   ref    := '%' INT | '%' name
 *   name   := IDENT | '"' chars with \" \\ \xHH escapes '"'
 *   meta   := DTYPE '[' ints ']' '{' ints '}' ['+' INT] ['@' device]
 *   attr   := key '=' value       (every key the op reads, once, in any order)
 *   device := 'cpu' | 'cuda:' INT
 *
 * EOL is a newline followed by any number of blank lines.  Names that are
 * not identifiers ([A-Za-z_][A-Za-z0-9_.]*) print quoted (and may not be
 * empty).  Doubles print %.17g, or inf, -inf, nan, -nan (NaN's sign kept).
 * Node numbers are labels: the parsed graph numbers its nodes densely,
 * inputs first (in header order), constants in order of appearance.
 *
 * Beyond syntax, each line is checked as tr_verify will check the graph
 * (arity, the op's infer rule reproducing the meta, a constant's meta being
 * its tensor's), so that every error says where; tr_verify runs at the end.
 *
 * The parser is a hand-written scanner and recursive descent over a
 * NUL-terminated string: every read is of the current character (never past
 * the NUL), every number is range-checked, and the first error stops it. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* newlocale, uselocale, strtod_l, open_memstream */
#endif
#include "trace.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- numbers in the C locale, whatever the host set ---- */

static locale_t c_loc;
static pthread_once_t c_loc_once = PTHREAD_ONCE_INIT;
static void c_loc_init(void) { c_loc = newlocale(LC_ALL_MASK, "C", (locale_t)0); }
static locale_t c_locale(void) {
    pthread_once(&c_loc_once, c_loc_init);
    return c_loc;
}

/* %.17g (so that it parses back to the same bits), or inf, -inf, nan, -nan. */
static void fmt_double(double v, char *buf, size_t n) {
    if (isnan(v)) {
        snprintf(buf, n, "%s", signbit(v) ? "-nan" : "nan");
    } else if (isinf(v)) {
        snprintf(buf, n, "%s", v < 0 ? "-inf" : "inf");
    } else {
        locale_t c = c_locale(), old = (locale_t)0;
        if (c) old = uselocale(c);
        snprintf(buf, n, "%.17g", v);
        if (c) uselocale(old);
    }
}

/* ---- the shared vocabulary: attribute keys, in printing order ---- */

enum {
    K_SIZES, K_DIMS, K_DIM, K_START, K_END, K_STEP, K_VALUE, K_FROM, K_BY,
    K_CORRECTION, K_KEEPDIM, K_CAUSAL, K_ACT, K_DTYPE, K_DEVICE, K_SEED, K_OFFSET, K_COUNT
};

static const struct {
    const char *name;
    unsigned flag;
} attr_keys[K_COUNT] = {
    [K_SIZES] = {"sizes", A_SIZES},
    [K_DIMS] = {"dims", A_DIMS},
    [K_DIM] = {"dim", A_DIM},
    [K_START] = {"start", A_RANGE},
    [K_END] = {"end", A_RANGE},
    [K_STEP] = {"step", A_RANGE},
    [K_VALUE] = {"value", A_VALUE},
    [K_FROM] = {"from", A_ARANGE},
    [K_BY] = {"by", A_ARANGE},
    [K_CORRECTION] = {"correction", A_CORRECTION},
    [K_KEEPDIM] = {"keepdim", A_KEEPDIM},
    [K_CAUSAL] = {"causal", A_CAUSAL},
    [K_ACT] = {"act", A_ACT},
    [K_DTYPE] = {"dtype", A_DTYPE},
    [K_DEVICE] = {"device", A_DEVICE},
    [K_SEED] = {"seed", A_RNG},
    [K_OFFSET] = {"offset", A_RNG},
};

/* A linear node's activation by em_act (attrs.act). */
static const char *const act_names[EM_ACT_COUNT] = {"none", "relu", "gelu_tanh", "gelu"};

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_ident_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_ident_char(char c) { return is_ident_start(c) || is_digit(c) || c == '.'; }

/* Whether name prints bare (%name) rather than quoted (%"name"). */
static bool plain_name(const char *name) {
    if (!is_ident_start(name[0])) return false;
    for (const char *p = name + 1; *p; p++)
        if (!is_ident_char(*p)) return false;
    return true;
}

static int clamp_dims(int n) { return n < 0 ? 0 : n > EM_MAX_DIMS ? EM_MAX_DIMS : n; }

/* ======================================================================
 * Printing
 * ====================================================================== */

static void print_name(FILE *f, const char *name) {
    if (!name) name = "";
    if (plain_name(name)) {
        fputs(name, f);
        return;
    }
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\x%02x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

static void print_ref(FILE *f, const tr_graph *g, int k) {
    fputc('%', f);
    if (k >= 0 && k < g->nnodes && g->nodes[k].kind == TR_INPUT) print_name(f, g->nodes[k].name);
    else fprintf(f, "%d", k);
}

static void print_i64s(FILE *f, char open, char close, int n, const int64_t *v) {
    fputc(open, f);
    for (int i = 0; i < n; i++) fprintf(f, "%s%" PRId64, i ? ", " : "", v[i]);
    fputc(close, f);
}

static void print_device(FILE *f, em_device d) {
    char buf[32];
    fputs(em_device_name(d, buf, sizeof buf), f);
}

static void print_meta(FILE *f, const em_meta *m) {
    int n = clamp_dims(m->ndim);
    fputs(em_dtype_name(m->dtype), f);
    print_i64s(f, '[', ']', n, m->sizes);
    print_i64s(f, '{', '}', n, m->strides);
    if (m->offset != 0) fprintf(f, "+%" PRId64, m->offset);
    if (m->device.type != EM_CPU) {
        fputc('@', f);
        print_device(f, m->device);
    }
}

static const char *op_name(em_op op, char *buf, size_t n) {
    if ((unsigned)op < EM_OP_COUNT) return em_op_table[op].name;
    snprintf(buf, n, "invalid_op_%d", (int)op);
    return buf;
}

static unsigned op_attrs(em_op op) {
    return (unsigned)op < EM_OP_COUNT ? em_op_table[op].attrs : 0;
}

static void print_attrs(FILE *f, const em_op_attrs *a, unsigned mask) {
    char num[64];
    bool first = true;
    fputc('[', f);
    for (int k = 0; k < K_COUNT; k++) {
        if (!(mask & attr_keys[k].flag)) continue;
        fprintf(f, "%s%s=", first ? "" : ", ", attr_keys[k].name);
        first = false;
        switch (k) {
        case K_SIZES: print_i64s(f, '[', ']', clamp_dims(a->ndim), a->sizes); break;
        case K_DIMS: {
            int n = clamp_dims(a->ndims);
            fputc('[', f);
            for (int i = 0; i < n; i++) fprintf(f, "%s%d", i ? ", " : "", a->dims[i]);
            fputc(']', f);
            break;
        }
        case K_DIM: fprintf(f, "%d", a->dim); break;
        case K_START: fprintf(f, "%" PRId64, a->start); break;
        case K_END: fprintf(f, "%" PRId64, a->end); break;
        case K_STEP: fprintf(f, "%" PRId64, a->step); break;
        case K_VALUE: fmt_double(a->value, num, sizeof num); fputs(num, f); break;
        case K_FROM: fmt_double(a->fstart, num, sizeof num); fputs(num, f); break;
        case K_BY: fmt_double(a->fstep, num, sizeof num); fputs(num, f); break;
        case K_CORRECTION: fprintf(f, "%d", a->correction); break;
        case K_KEEPDIM: fputs(a->keepdim ? "true" : "false", f); break;
        case K_CAUSAL: fputs(a->causal ? "true" : "false", f); break;
        case K_ACT:
            if ((unsigned)a->act < EM_ACT_COUNT) fputs(act_names[a->act], f);
            else fprintf(f, "invalid_act_%d", (int)a->act);
            break;
        case K_DTYPE: fputs(em_dtype_name(a->dtype), f); break;
        case K_DEVICE: print_device(f, a->device); break;
        case K_SEED: fprintf(f, "%" PRIu64, a->seed); break;
        case K_OFFSET: fprintf(f, "%" PRIu64, a->offset); break;
        }
    }
    fputc(']', f);
}

typedef struct input_pos {
    int index, node;
} input_pos;

static int cmp_input_pos(const void *a, const void *b) {
    const input_pos *x = a, *y = b;
    if (x->index != y->index) return x->index < y->index ? -1 : 1;
    return x->node < y->node ? -1 : x->node > y->node;
}

em_status tr_print(const tr_graph *g, FILE *f) {
    if (!g) return em_error_null("tr_print", "g");
    if (!f) return em_error_null("tr_print", "f");
    /* the header lists inputs by input number, wherever their nodes are */
    int nin = 0;
    for (int i = 0; i < g->nnodes; i++) nin += g->nodes[i].kind == TR_INPUT;
    input_pos *ins = em_malloc(sizeof(input_pos) * (size_t)(nin ? nin : 1));
    if (!ins) return em_last_status();
    nin = 0;
    for (int i = 0; i < g->nnodes; i++)
        if (g->nodes[i].kind == TR_INPUT) ins[nin++] = (input_pos){g->nodes[i].index, i};
    qsort(ins, (size_t)nin, sizeof *ins, cmp_input_pos);

    char buf[48];
    fputs("graph(", f);
    for (int i = 0; i < nin; i++) {
        const tr_node *n = &g->nodes[ins[i].node];
        if (i) fputs(", ", f);
        fputc('%', f);
        print_name(f, n->name);
        fputs(": ", f);
        print_meta(f, &n->meta);
    }
    fputs(") {\n", f);
    em_free(ins);

    for (int i = 0; i < g->nnodes; i++) {
        const tr_node *n = &g->nodes[i];
        if (n->kind == TR_INPUT) continue;
        fprintf(f, "  %%%d = ", i);
        if (n->kind == TR_CONST) {
            fprintf(f, "constant #%d", n->index);
        } else {
            fputs(op_name(n->op, buf, sizeof buf), f);
            fputc('(', f);
            for (int j = 0; j < n->nin; j++) {
                if (j) fputs(", ", f);
                print_ref(f, g, n->in ? n->in[j] : -1);
            }
            fputc(')', f);
            unsigned mask = op_attrs(n->op);
            if (mask) {
                fputc(' ', f);
                print_attrs(f, &n->attrs, mask);
            }
        }
        fputs(" : ", f);
        print_meta(f, &n->meta);
        fputc('\n', f);
    }
    fputs("  return (", f);
    for (int i = 0; i < g->noutputs; i++) {
        if (i) fputs(", ", f);
        print_ref(f, g, g->outputs ? g->outputs[i] : -1);
    }
    fputs(")\n}\n", f);
    if (ferror(f)) return em_error(EM_ERR_ARG, "tr_print: writing the graph failed");
    return EM_OK;
}

char *tr_to_text(const tr_graph *g) {
    if (!g) {
        em_error_null("tr_to_text", "g");
        return NULL;
    }
    char *mem = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&mem, &len);
    if (!f) {
        em_error(EM_ERR_NOMEM, "tr_to_text: open_memstream failed");
        return NULL;
    }
    em_status s = tr_print(g, f);
    if (fclose(f) != 0 && s == EM_OK)
        s = em_error(EM_ERR_NOMEM, "tr_to_text: writing the text failed");
    char *out = NULL;
    if (s == EM_OK && mem) {
        out = em_malloc(len + 1);
        if (out) {
            memcpy(out, mem, len);
            out[len] = '\0';
        }
    } else if (s == EM_OK) {
        em_error(EM_ERR_NOMEM, "tr_to_text: writing the text failed");
    }
    free(mem);
    return out;
}

/* ---- DOT ---- */

/* s inside a DOT string: quotes and backslashes escaped, newlines as \n. */
static void dot_escape(FILE *f, const char *s) {
    for (; s && *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if (*s == '\n') fputs("\\n", f);
        else if (*s == '\r') continue;
        else fputc(*s, f);
    }
}

static void dot_meta(FILE *f, const em_meta *m) {
    fputs(em_dtype_name(m->dtype), f);
    print_i64s(f, '[', ']', clamp_dims(m->ndim), m->sizes);
    if (m->device.type != EM_CPU) {
        fputc('@', f);
        print_device(f, m->device);
    }
}

em_status tr_print_dot(const tr_graph *g, FILE *f) {
    if (!g) return em_error_null("tr_print_dot", "g");
    if (!f) return em_error_null("tr_print_dot", "f");
    char buf[48];
    fputs("digraph G {\n", f);
    for (int i = 0; i < g->nnodes; i++) {
        const tr_node *n = &g->nodes[i];
        fprintf(f, "  n%d [label=\"", i);
        const char *shape = "box";
        if (n->kind == TR_INPUT) {
            fputc('%', f);
            dot_escape(f, n->name);
            shape = "ellipse";
        } else if (n->kind == TR_CONST) {
            fprintf(f, "%%%d = constant #%d", i, n->index);
            shape = "diamond";
        } else {
            fprintf(f, "%%%d = ", i);
            dot_escape(f, op_name(n->op, buf, sizeof buf));
        }
        fputs("\\n", f);
        dot_meta(f, &n->meta);
        fprintf(f, "\", shape=%s];\n", shape);
    }
    for (int i = 0; i < g->nnodes; i++) {
        const tr_node *n = &g->nodes[i];
        if (n->kind != TR_CALL || !n->in) continue;
        for (int j = 0; j < n->nin; j++) fprintf(f, "  n%d -> n%d;\n", n->in[j], i);
    }
    fputs("  out [label=\"return\", shape=plaintext];\n", f);
    for (int i = 0; i < g->noutputs && g->outputs; i++)
        fprintf(f, "  n%d -> out;\n", g->outputs[i]);
    fputs("}\n", f);
    if (ferror(f)) return em_error(EM_ERR_ARG, "tr_print_dot: writing the graph failed");
    return EM_OK;
}

/* ======================================================================
 * Parsing
 * ====================================================================== */

/* Symbols: node labels (%3) and input names (%x), to node indices of the
 * graph being built.  Open addressing; names live in the graph's nodes. */
typedef struct sym {
    bool used;
    int label; /* -1 for an input name */
    int node;
} sym;

typedef struct parser {
    const char *text, *p;
    bool failed; /* the first error is set; stop */
    tr_graph *g;
    em_tensor *const *consts;
    int nconsts;
    bool placeholders; /* constants made from the text's metas */
    sym *syms;
    int nsyms, capsyms;
    int *refs; /* the current node's inputs */
    int nrefs, caprefs;
} parser;

/* A short description of the character at p, for "found ..." */
static const char *describe(const char *p, char *buf, size_t n) {
    unsigned char c = (unsigned char)*p;
    if (c == '\0') return "the end of the text";
    if (c == '\n') return "the end of the line";
    if (c >= 0x20 && c < 0x7f) snprintf(buf, n, "'%c'", c);
    else snprintf(buf, n, "byte 0x%02x", c);
    return buf;
}

/* Records the parse error at `at` (the first one only) and returns false. */
static bool fail_at(parser *ps, const char *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static bool fail_at(parser *ps, const char *at, const char *fmt, ...) {
    if (ps->failed) return false;
    ps->failed = true;
    long line = 1;
    const char *ls = ps->text;
    for (const char *q = ps->text; q < at; q++)
        if (*q == '\n') {
            line++;
            ls = q + 1;
        }
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    em_error(EM_ERR_ARG, "graph text line %ld, column %ld: %s", line, (long)(at - ls) + 1, msg);
    return false;
}

/* "expected WHAT, found X" at the current position. */
static bool expected(parser *ps, const char *what) {
    char buf[16];
    return fail_at(ps, ps->p, "expected %s, found %s", what, describe(ps->p, buf, sizeof buf));
}

/* An allocation failed (em_malloc set EM_ERR_NOMEM): stop, keeping that. */
static bool nomem(parser *ps) {
    ps->failed = true;
    return false;
}

static void skip_blanks(parser *ps) {
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\r') ps->p++;
}

static bool accept(parser *ps, char c) {
    skip_blanks(ps);
    if (*ps->p != c) return false;
    ps->p++;
    return true;
}

static bool expect(parser *ps, char c, const char *what) {
    if (accept(ps, c)) return true;
    return expected(ps, what);
}

/* A newline, then any blank lines. */
static bool expect_eol(parser *ps) {
    skip_blanks(ps);
    if (*ps->p != '\n') return expected(ps, "the end of the line");
    ps->p++;
    for (;;) {
        const char *line = ps->p;
        skip_blanks(ps);
        if (*ps->p != '\n') {
            ps->p = line;
            return true;
        }
        ps->p++;
    }
}

/* An identifier-like word [A-Za-z_][A-Za-z0-9_]*: its start and length
 * (0 if none is here). */
static size_t word(parser *ps, const char **start) {
    skip_blanks(ps);
    *start = ps->p;
    if (!is_ident_start(*ps->p)) return 0;
    const char *q = ps->p + 1;
    while (is_ident_start(*q) || is_digit(*q)) q++;
    return (size_t)(q - *start);
}

static bool word_is(const char *s, size_t n, const char *w) {
    return strlen(w) == n && memcmp(s, w, n) == 0;
}

/* Expects the keyword w. */
static bool keyword(parser *ps, const char *w) {
    const char *s;
    size_t n = word(ps, &s);
    if (!word_is(s, n, w)) {
        if (n) return fail_at(ps, s, "expected '%s', found '%.*s'", w, (int)(n > 40 ? 40 : n), s);
        char what[32];
        snprintf(what, sizeof what, "'%s'", w);
        return expected(ps, what);
    }
    ps->p += n;
    return true;
}

/* The decimal digits at q (after an optional '-', when allowed) as a
 * magnitude; false when there are none.  *over when it exceeds UINT64_MAX. */
static bool scan_digits(const char **q, uint64_t *v, bool *over) {
    *v = 0;
    *over = false;
    if (!is_digit(**q)) return false;
    for (; is_digit(**q); (*q)++) {
        unsigned d = (unsigned)(**q - '0');
        if (*v > (UINT64_MAX - d) / 10) *over = true;
        else *v = *v * 10 + d;
    }
    return true;
}

/* A decimal integer in [lo, hi]. */
static bool parse_i64(parser *ps, int64_t lo, int64_t hi, const char *what, int64_t *out) {
    skip_blanks(ps);
    const char *s = ps->p, *q = s;
    bool neg = *q == '-';
    if (neg) q++;
    uint64_t v;
    bool over;
    if (!scan_digits(&q, &v, &over)) return expected(ps, what);
    int64_t x = 0;
    if (!neg && v > (uint64_t)INT64_MAX) over = true;
    if (neg && v > (uint64_t)INT64_MAX + 1) over = true;
    if (!over) x = neg ? (v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v) : (int64_t)v;
    if (over || x < lo || x > hi)
        return fail_at(ps, s, "%s out of range: %.*s (expected %" PRId64 " to %" PRId64 ")", what,
                       (int)(q - s > 40 ? 40 : q - s), s, lo, hi);
    ps->p = q;
    *out = x;
    return true;
}

static bool parse_int(parser *ps, int lo, int hi, const char *what, int *out) {
    int64_t v;
    if (!parse_i64(ps, lo, hi, what, &v)) return false;
    *out = (int)v;
    return true;
}

static bool parse_u64(parser *ps, const char *what, uint64_t *out) {
    skip_blanks(ps);
    const char *s = ps->p, *q = s;
    uint64_t v;
    bool over;
    if (!scan_digits(&q, &v, &over)) return expected(ps, what);
    if (over)
        return fail_at(ps, s, "%s out of range: %.*s (expected 0 to %" PRIu64 ")", what,
                       (int)(q - s > 40 ? 40 : q - s), s, UINT64_MAX);
    ps->p = q;
    *out = v;
    return true;
}

/* A float: [-] (inf | nan | digits[.digits][e[+-]digits] | .digits...). */
static bool parse_double(parser *ps, const char *what, double *out) {
    skip_blanks(ps);
    const char *s = ps->p, *q = s;
    bool neg = *q == '-';
    if (neg) q++;
    if ((strncmp(q, "inf", 3) == 0 || strncmp(q, "nan", 3) == 0) && !is_ident_char(q[3])) {
        *out = copysign(q[0] == 'i' ? INFINITY : NAN, neg ? -1.0 : 1.0);
        ps->p = q + 3;
        return true;
    }
    int nd = 0;
    for (; is_digit(*q); q++) nd++;
    if (*q == '.')
        for (q++; is_digit(*q); q++) nd++;
    if (nd == 0) return expected(ps, what);
    if (*q == 'e' || *q == 'E') {
        q++;
        if (*q == '+' || *q == '-') q++;
        if (!is_digit(*q)) {
            char buf[16];
            return fail_at(ps, q, "expected the digits of an exponent, found %s",
                           describe(q, buf, sizeof buf));
        }
        while (is_digit(*q)) q++;
    }
    char buf[400];
    size_t len = (size_t)(q - s);
    if (len >= sizeof buf) return fail_at(ps, s, "%s is too long (%zu characters)", what, len);
    memcpy(buf, s, len);
    buf[len] = '\0';
    char *end;
    locale_t c = c_locale();
    errno = 0;
    double v = c ? strtod_l(buf, &end, c) : strtod(buf, &end);
    if (end != buf + len) return fail_at(ps, s, "%s is malformed: %s", what, buf);
    if (errno == ERANGE && isinf(v)) return fail_at(ps, s, "%s out of range: %.40s", what, buf);
    ps->p = q;
    *out = v;
    return true;
}

static bool parse_bool(parser *ps, const char *what, bool *out) {
    const char *s;
    size_t n = word(ps, &s);
    if (word_is(s, n, "true")) *out = true;
    else if (word_is(s, n, "false")) *out = false;
    else return expected(ps, what);
    ps->p += n;
    return true;
}

static bool parse_act(parser *ps, em_act *out) {
    const char *s;
    size_t n = word(ps, &s);
    for (int k = 0; k < EM_ACT_COUNT; k++)
        if (n && word_is(s, n, act_names[k])) {
            *out = (em_act)k;
            ps->p += n;
            return true;
        }
    return expected(ps, "an activation (none, relu, gelu_tanh or gelu)");
}

static bool parse_dtype(parser *ps, em_dtype *out) {
    const char *s;
    size_t n = word(ps, &s);
    for (int d = 0; d < EM_DTYPE_COUNT; d++)
        if (n && word_is(s, n, em_dtype_name((em_dtype)d))) {
            *out = (em_dtype)d;
            ps->p += n;
            return true;
        }
    if (n)
        return fail_at(ps, s, "unknown dtype '%.*s' (expected f32, f64, i32, i64, bool, f16 or bf16)",
                       (int)(n > 40 ? 40 : n), s);
    return expected(ps, "a dtype (f32, f64, i32, i64, bool, f16 or bf16)");
}

static bool parse_device(parser *ps, em_device *out) {
    const char *s;
    size_t n = word(ps, &s);
    if (word_is(s, n, "cpu")) {
        ps->p += n;
        *out = EM_CPU_DEVICE;
        return true;
    }
    if (!word_is(s, n, "cuda")) {
        if (n)
            return fail_at(ps, s, "unknown device '%.*s' (expected cpu or cuda:N)",
                           (int)(n > 40 ? 40 : n), s);
        return expected(ps, "a device (cpu or cuda:N)");
    }
    ps->p += n;
    if (*ps->p != ':') return expected(ps, "':' and the CUDA device's number");
    ps->p++;
    if (!is_digit(*ps->p)) return expected(ps, "the CUDA device's number");
    int index;
    if (!parse_int(ps, 0, INT_MAX, "the CUDA device's number", &index)) return false;
    *out = em_cuda(index);
    return true;
}

/* open list close, at most EM_MAX_DIMS int64s in [lo, hi]. */
static bool parse_i64_list(parser *ps, char open, char close, int64_t lo, int64_t hi,
                           const char *what, int *n, int64_t *v) {
    char want[8] = {'\'', open, '\'', '\0'};
    if (!expect(ps, open, want)) return false;
    *n = 0;
    if (accept(ps, close)) return true;
    char sep[24];
    snprintf(sep, sizeof sep, "',' or '%c'", close);
    for (;;) {
        skip_blanks(ps);
        if (*n == EM_MAX_DIMS)
            return fail_at(ps, ps->p, "more than %d %ss", EM_MAX_DIMS, what);
        if (!parse_i64(ps, lo, hi, what, &v[*n])) return false;
        (*n)++;
        if (accept(ps, close)) return true;
        if (!expect(ps, ',', sep)) return false;
    }
}

static bool meta_equal(const em_meta *a, const em_meta *b) {
    if (a->ndim != b->ndim || a->offset != b->offset || a->dtype != b->dtype ||
        !em_same_device(a->device, b->device))
        return false;
    size_t n = sizeof(int64_t) * (size_t)clamp_dims(a->ndim);
    return !memcmp(a->sizes, b->sizes, n) && !memcmp(a->strides, b->strides, n);
}

/* dtype[sizes]{strides}[+offset][@device] */
static bool parse_meta(parser *ps, em_meta *m) {
    memset(m, 0, sizeof *m);
    m->device = EM_CPU_DEVICE;
    skip_blanks(ps);
    const char *start = ps->p;
    if (!parse_dtype(ps, &m->dtype)) return false;
    if (!parse_i64_list(ps, '[', ']', 0, INT64_MAX, "size", &m->ndim, m->sizes)) return false;
    skip_blanks(ps);
    const char *at = ps->p;
    int nstrides;
    if (!parse_i64_list(ps, '{', '}', INT64_MIN, INT64_MAX, "stride", &nstrides, m->strides))
        return false;
    if (nstrides != m->ndim)
        return fail_at(ps, at, "%d stride%s for %d dim%s", nstrides, nstrides == 1 ? "" : "s",
                       m->ndim, m->ndim == 1 ? "" : "s");
    if (accept(ps, '+')) {
        if (!parse_i64(ps, INT64_MIN, INT64_MAX, "an offset", &m->offset)) return false;
    }
    if (accept(ps, '@')) {
        if (!parse_device(ps, &m->device)) return false;
    }
    int64_t numel;
    if (!em_meta_check_numel(m, &numel))
        return fail_at(ps, start, "the sizes overflow (too many elements)");
    return true;
}

/* ---- symbols ---- */

static uint64_t hash_label(int label) { return (uint64_t)(unsigned)label * 0x9E3779B97F4A7C15ull; }
static uint64_t hash_name(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h ^ 1;
}

/* The slot of (label, or name when label < 0): its entry, or the empty
 * slot where it would go. */
static sym *sym_slot(parser *ps, int label, const char *name) {
    uint64_t h = label >= 0 ? hash_label(label) : hash_name(name);
    size_t mask = (size_t)ps->capsyms - 1;
    for (size_t i = (size_t)(h ^ (h >> 29)) & mask;; i = (i + 1) & mask) {
        sym *s = &ps->syms[i];
        if (!s->used) return s;
        if (label >= 0 ? s->label == label
                       : s->label < 0 && strcmp(ps->g->nodes[s->node].name, name) == 0)
            return s;
    }
}

/* The node of a label or an input name, or -1. */
static int sym_find(parser *ps, int label, const char *name) {
    if (!ps->capsyms) return -1;
    sym *s = sym_slot(ps, label, name);
    return s->used ? s->node : -1;
}

/* Adds a symbol known not to be there. */
static bool sym_add(parser *ps, int label, int node) {
    if ((ps->nsyms + 1) * 2 > ps->capsyms) {
        if (ps->capsyms > INT_MAX / 4) return fail_at(ps, ps->p, "too many nodes");
        int cap = ps->capsyms ? ps->capsyms * 2 : 32;
        sym *old = ps->syms;
        int oldcap = ps->capsyms;
        ps->syms = em_malloc(sizeof(sym) * (size_t)cap);
        if (!ps->syms) {
            ps->syms = old;
            return nomem(ps);
        }
        memset(ps->syms, 0, sizeof(sym) * (size_t)cap);
        ps->capsyms = cap;
        for (int i = 0; i < oldcap; i++)
            if (old[i].used) {
                const sym *o = &old[i];
                *sym_slot(ps, o->label, o->label < 0 ? ps->g->nodes[o->node].name : NULL) = *o;
            }
        em_free(old);
    }
    sym *s = sym_slot(ps, label, label < 0 ? ps->g->nodes[node].name : NULL);
    *s = (sym){true, label, node};
    ps->nsyms++;
    return true;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* An input name after '%' (bare or quoted), in a new buffer (em_free). */
static char *parse_name(parser *ps) {
    const char *s = ps->p;
    if (is_ident_start(*s)) {
        const char *q = s;
        while (is_ident_char(*q)) q++;
        char *name = em_malloc((size_t)(q - s) + 1);
        if (!name) {
            nomem(ps);
            return NULL;
        }
        memcpy(name, s, (size_t)(q - s));
        name[q - s] = '\0';
        ps->p = q;
        return name;
    }
    if (*s != '"') {
        expected(ps, "a name");
        return NULL;
    }
    /* the decoded name is no longer than the quoted text */
    const char *q = s + 1;
    while (*q && *q != '"' && *q != '\n') q += (*q == '\\' && q[1] && q[1] != '\n') ? 2 : 1;
    if (*q != '"') {
        fail_at(ps, s, "unterminated quoted name");
        return NULL;
    }
    char *name = em_malloc((size_t)(q - s));
    if (!name) {
        nomem(ps);
        return NULL;
    }
    size_t n = 0;
    for (const char *r = s + 1; r < q;) {
        if (*r != '\\') {
            name[n++] = *r++;
            continue;
        }
        if (r[1] == '"' || r[1] == '\\') {
            name[n++] = r[1];
            r += 2;
            continue;
        }
        int hi = -1, lo = -1;
        if (r[1] == 'x' && r + 4 <= q) { /* r[2], r[3] lie before the closing quote */
            hi = hex_digit(r[2]);
            lo = hex_digit(r[3]);
        }
        if (hi < 0 || lo < 0 || (hi == 0 && lo == 0)) {
            em_free(name);
            fail_at(ps, r, "bad escape in a quoted name (use \\\", \\\\ or \\xHH, not \\x00)");
            return NULL;
        }
        name[n++] = (char)(hi * 16 + lo);
        r += 4;
    }
    name[n] = '\0';
    ps->p = q + 1;
    return name;
}

/* %k or %name: the node it names. */
static bool parse_ref(parser *ps, int *node) {
    skip_blanks(ps);
    const char *at = ps->p;
    if (*ps->p != '%') return expected(ps, "a node reference ('%k' or '%name')");
    ps->p++;
    if (is_digit(*ps->p)) {
        int label;
        if (!parse_int(ps, 0, INT_MAX, "a node number", &label)) return false;
        *node = sym_find(ps, label, NULL);
        if (*node < 0) return fail_at(ps, at, "%%%d is not a node defined above", label);
        return true;
    }
    char *name = parse_name(ps);
    if (!name) return false;
    *node = sym_find(ps, -1, name);
    if (*node < 0) fail_at(ps, at, "no input is named %%%.64s", name);
    em_free(name);
    return *node >= 0;
}

/* ( [ref {, ref}] ) into ps->refs */
static bool parse_refs(parser *ps) {
    ps->nrefs = 0;
    if (!expect(ps, '(', "'('")) return false;
    if (accept(ps, ')')) return true;
    for (;;) {
        int node = -1;
        if (!parse_ref(ps, &node)) return false;
        if (ps->nrefs == ps->caprefs) {
            if (ps->caprefs > INT_MAX / 4) return fail_at(ps, ps->p, "too many inputs");
            int cap = ps->caprefs ? ps->caprefs * 2 : 8;
            int *r = em_malloc(sizeof(int) * (size_t)cap);
            if (!r) return nomem(ps);
            if (ps->nrefs) memcpy(r, ps->refs, sizeof(int) * (size_t)ps->nrefs);
            em_free(ps->refs);
            ps->refs = r;
            ps->caprefs = cap;
        }
        ps->refs[ps->nrefs++] = node;
        if (accept(ps, ')')) return true;
        if (!expect(ps, ',', "',' or ')'")) return false;
    }
}

/* [key=value, ...]: every key of mask once. */
static bool parse_attrs(parser *ps, const char *opname, unsigned mask, em_op_attrs *a) {
    unsigned seen = 0;
    if (!expect(ps, '[', "'[' and the attributes")) return false;
    skip_blanks(ps);
    if (*ps->p != ']') {
        for (;;) {
            const char *s;
            size_t n = word(ps, &s);
            if (!n) return expected(ps, "an attribute name");
            int k = 0;
            while (k < K_COUNT && !word_is(s, n, attr_keys[k].name)) k++;
            if (k == K_COUNT)
                return fail_at(ps, s, "unknown attribute '%.*s'", (int)(n > 40 ? 40 : n), s);
            if (!(mask & attr_keys[k].flag))
                return fail_at(ps, s, "%s has no attribute '%s'", opname, attr_keys[k].name);
            if (seen & (1u << k))
                return fail_at(ps, s, "attribute '%s' is given twice", attr_keys[k].name);
            seen |= 1u << k;
            ps->p += n;
            if (!expect(ps, '=', "'='")) return false;
            bool ok = true;
            switch (k) {
            case K_SIZES:
                ok = parse_i64_list(ps, '[', ']', INT64_MIN, INT64_MAX, "size", &a->ndim, a->sizes);
                break;
            case K_DIMS: {
                int64_t d[EM_MAX_DIMS];
                ok = parse_i64_list(ps, '[', ']', INT_MIN, INT_MAX, "dim", &a->ndims, d);
                for (int i = 0; ok && i < a->ndims; i++) a->dims[i] = (int)d[i];
                break;
            }
            case K_DIM: ok = parse_int(ps, INT_MIN, INT_MAX, "a dim", &a->dim); break;
            case K_START: ok = parse_i64(ps, INT64_MIN, INT64_MAX, "a start", &a->start); break;
            case K_END: ok = parse_i64(ps, INT64_MIN, INT64_MAX, "an end", &a->end); break;
            case K_STEP: ok = parse_i64(ps, INT64_MIN, INT64_MAX, "a step", &a->step); break;
            case K_VALUE: ok = parse_double(ps, "a value", &a->value); break;
            case K_FROM: ok = parse_double(ps, "a number", &a->fstart); break;
            case K_BY: ok = parse_double(ps, "a number", &a->fstep); break;
            case K_CORRECTION:
                ok = parse_int(ps, INT_MIN, INT_MAX, "a correction", &a->correction);
                break;
            case K_KEEPDIM: ok = parse_bool(ps, "true or false", &a->keepdim); break;
            case K_CAUSAL: ok = parse_bool(ps, "true or false", &a->causal); break;
            case K_ACT: ok = parse_act(ps, &a->act); break;
            case K_DTYPE: ok = parse_dtype(ps, &a->dtype); break;
            case K_DEVICE: ok = parse_device(ps, &a->device); break;
            case K_SEED: ok = parse_u64(ps, "a seed", &a->seed); break;
            case K_OFFSET: ok = parse_u64(ps, "an offset", &a->offset); break;
            }
            if (!ok) return false;
            if (accept(ps, ']')) break;
            if (!expect(ps, ',', "',' or ']'")) return false;
        }
    } else {
        ps->p++;
    }
    for (int k = 0; k < K_COUNT; k++)
        if ((mask & attr_keys[k].flag) && !(seen & (1u << k)))
            return fail_at(ps, ps->p - 1, "%s needs attribute '%s'", opname, attr_keys[k].name);
    return true;
}

static void fake_tensor(const em_meta *m, em_tensor *t) {
    memset(t, 0, sizeof *t);
    t->ndim = m->ndim;
    memcpy(t->sizes, m->sizes, sizeof t->sizes);
    memcpy(t->strides, m->strides, sizeof t->strides);
    t->offset = m->offset;
    t->dtype = m->dtype;
    t->device = m->device;
}

/* Runs op's infer rule on the inputs' metas, as em_dispatch does, and
 * checks the written meta against it as tr_verify will (dtype, sizes,
 * device; for views, strides and offset too), so that the error can say
 * where.  at: the op's name; mat: the meta. */
static bool check_call(parser *ps, em_op op, const em_op_attrs *a, const em_meta *m,
                       const char *at, const char *mat) {
    int nin = ps->nrefs;
    em_tensor *fake = em_malloc(sizeof(em_tensor) * (size_t)(nin ? nin : 1));
    em_tensor **in = em_malloc(sizeof(em_tensor *) * (size_t)(nin ? nin : 1));
    if (!fake || !in) {
        em_free(fake);
        em_free(in);
        return nomem(ps);
    }
    for (int i = 0; i < nin; i++) {
        fake_tensor(&ps->g->nodes[ps->refs[i]].meta, &fake[i]);
        in[i] = &fake[i];
    }
    em_op_call c = {op, nin, in, a};
    em_meta want;
    memset(&want, 0, sizeof want);
    want.device = nin > 0 ? in[0]->device : a->device;
    em_status s = em_op_table[op].infer(&c, &want);
    em_free(fake);
    em_free(in);
    const char *name = em_op_table[op].name;
    if (s != EM_OK) {
        char why[256];
        snprintf(why, sizeof why, "%s", em_last_error());
        return fail_at(ps, at, "%s does not apply here: %s", name, why);
    }
    if (want.dtype != m->dtype || want.ndim != m->ndim ||
        memcmp(want.sizes, m->sizes, sizeof(int64_t) * (size_t)m->ndim) ||
        !em_same_device(want.device, m->device)) {
        char dev[32], shape[160];
        return fail_at(ps, mat, "%s gives %s%s on %s, not this meta", name,
                       em_dtype_name(want.dtype),
                       em_shape_str(want.ndim, want.sizes, shape, sizeof shape),
                       em_device_name(want.device, dev, sizeof dev));
    }
    bool same = true; /* as tr_verify: strides of dims of size > 1; the offset if any element */
    for (int d = 0; d < m->ndim; d++)
        if (m->sizes[d] > 1 && want.strides[d] != m->strides[d]) same = false;
    if (want.offset != m->offset && em_shape_numel(m->ndim, m->sizes) > 0) same = false;
    if (em_op_table[op].kind == EM_KIND_VIEW && !same) {
        char strides[160];
        return fail_at(ps, mat, "%s gives strides %s and offset %" PRId64 ", not these", name,
                       em_shape_str(want.ndim, want.strides, strides, sizeof strides),
                       want.offset);
    }
    return true;
}

/* %name: meta */
static bool parse_input(parser *ps) {
    skip_blanks(ps);
    const char *at = ps->p;
    if (!expect(ps, '%', "'%' and an input's name")) return false;
    if (is_digit(*ps->p)) return expected(ps, "an input's name (not a number)");
    char *name = parse_name(ps);
    if (!name) return false;
    if (!name[0]) {
        fail_at(ps, at, "an input's name cannot be empty");
        em_free(name);
        return false;
    }
    if (sym_find(ps, -1, name) >= 0) {
        fail_at(ps, at, "input %%%.64s is declared twice", name);
        em_free(name);
        return false;
    }
    em_meta m;
    if (!expect(ps, ':', "':' and the input's meta") || !parse_meta(ps, &m)) {
        em_free(name);
        return false;
    }
    int node = tr_add_input(ps->g, name, &m);
    em_free(name);
    if (node < 0) return nomem(ps);
    return sym_add(ps, -1, node);
}

/* %k = ... : meta */
/* A constant of the placeholder parse: a tensor with the text's meta and
 * no storage (tr_parse_placeholders). */
static bool parse_placeholder(parser *ps, int label, const em_meta *m) {
    int64_t numel;
    if (!em_meta_check_numel(m, &numel)) return fail_at(ps, ps->p, "the constant is too large");
    em_tensor *t = em_tensor_meta_only(m);
    if (!t) return nomem(ps);
    int node = tr_add_const(ps->g, t);
    em_release(t);
    if (node < 0) return nomem(ps);
    return sym_add(ps, label, node);
}

static bool parse_node(parser *ps) {
    skip_blanks(ps);
    const char *at = ps->p;
    ps->p++; /* '%' */
    if (!is_digit(*ps->p)) return expected(ps, "a node number after '%'");
    int label;
    if (!parse_int(ps, 0, INT_MAX, "a node number", &label)) return false;
    if (sym_find(ps, label, NULL) >= 0) return fail_at(ps, at, "%%%d is defined twice", label);
    if (!expect(ps, '=', "'='")) return false;
    const char *opat;
    size_t n = word(ps, &opat);
    if (!n) return expected(ps, "'constant' or an op's name");
    em_meta m;
    int node;
    if (word_is(opat, n, "constant")) {
        ps->p += n;
        if (!expect(ps, '#', "'#' and the constant's number")) return false;
        skip_blanks(ps);
        const char *iat = ps->p;
        int index;
        if (!parse_int(ps, 0, INT_MAX, "a constant number", &index)) return false;
        if (ps->placeholders && index != ps->g->nconsts)
            return fail_at(ps, iat, "constant #%d, but the next constant is #%d", index,
                           ps->g->nconsts);
        if (!ps->placeholders && index >= ps->nconsts)
            return fail_at(ps, iat, "constant #%d, but %d constant%s given", index, ps->nconsts,
                           ps->nconsts == 1 ? " is" : "s are");
        if (!ps->placeholders && !ps->consts[index])
            return fail_at(ps, iat, "constant #%d is NULL", index);
        if (!expect(ps, ':', "':' and the meta")) return false;
        skip_blanks(ps);
        const char *mat = ps->p;
        if (!parse_meta(ps, &m)) return false;
        if (ps->placeholders) return parse_placeholder(ps, label, &m);
        em_meta have;
        tr_meta_of(ps->consts[index], &have);
        if (!meta_equal(&m, &have)) {
            char dev[32], shape[160];
            return fail_at(ps, mat, "constant #%d is %s%s on %s, not this meta", index,
                           em_dtype_name(have.dtype),
                           em_shape_str(have.ndim, have.sizes, shape, sizeof shape),
                           em_device_name(have.device, dev, sizeof dev));
        }
        node = tr_add_const(ps->g, ps->consts[index]);
    } else {
        int op = 0;
        while (op < EM_OP_COUNT && !word_is(opat, n, em_op_table[op].name)) op++;
        if (op == EM_OP_COUNT)
            return fail_at(ps, opat, "unknown op '%.*s'", (int)(n > 40 ? 40 : n), opat);
        ps->p += n;
        const em_op_info *info = &em_op_table[op];
        if (!parse_refs(ps)) return false;
        if (info->nin >= 0 && ps->nrefs != info->nin)
            return fail_at(ps, opat, "%s takes %d input%s, not %d", info->name, info->nin,
                           info->nin == 1 ? "" : "s", ps->nrefs);
        if (info->nin < 0 && ps->nrefs < 1)
            return fail_at(ps, opat, "%s takes at least 1 input", info->name);
        em_op_attrs a;
        memset(&a, 0, sizeof a);
        if (info->attrs && !parse_attrs(ps, info->name, info->attrs, &a)) return false;
        if (!expect(ps, ':', info->attrs ? "':' and the meta" : "':' and the meta (this op has no attributes)"))
            return false;
        skip_blanks(ps);
        const char *mat = ps->p;
        if (!parse_meta(ps, &m)) return false;
        if (!check_call(ps, (em_op)op, &a, &m, opat, mat)) return false;
        node = tr_add_call(ps->g, (em_op)op, ps->nrefs, ps->refs, &a, &m);
    }
    if (node < 0) return nomem(ps);
    return sym_add(ps, label, node);
}

static bool parse_graph(parser *ps) {
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\r' || *ps->p == '\n') ps->p++;
    if (!keyword(ps, "graph") || !expect(ps, '(', "'('")) return false;
    if (!accept(ps, ')')) {
        for (;;) {
            if (!parse_input(ps)) return false;
            if (accept(ps, ')')) break;
            if (!expect(ps, ',', "',' or ')'")) return false;
        }
    }
    if (!expect(ps, '{', "'{'") || !expect_eol(ps)) return false;
    for (;;) {
        skip_blanks(ps);
        if (*ps->p != '%') break;
        if (!parse_node(ps) || !expect_eol(ps)) return false;
    }
    const char *s;
    size_t n = word(ps, &s);
    if (!word_is(s, n, "return")) return expected(ps, "a node ('%k = ...') or 'return'");
    ps->p += n;
    if (!parse_refs(ps)) return false;
    if (ps->nrefs == 0) return fail_at(ps, ps->p - 1, "a graph returns at least one node");
    if (tr_set_outputs(ps->g, ps->nrefs, ps->refs) != EM_OK) return nomem(ps);
    if (!expect_eol(ps) || !expect(ps, '}', "'}'") || !expect_eol(ps)) return false;
    while (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\r' || *ps->p == '\n') ps->p++;
    if (*ps->p) return expected(ps, "the end of the text after the graph");
    return true;
}

static tr_graph *parse_text(const char *text, em_tensor *const *consts, int nconsts,
                            bool placeholders);

tr_graph *tr_parse_placeholders(const char *text) {
    if (!text) {
        em_error_null("tr_parse_placeholders", "text");
        return NULL;
    }
    return parse_text(text, NULL, 0, true);
}

tr_graph *tr_parse(const char *text, em_tensor *const *consts, int nconsts) {
    if (!text) {
        em_error_null("tr_parse", "text");
        return NULL;
    }
    if (nconsts < 0) {
        em_error(EM_ERR_ARG, "tr_parse: nconsts is %d", nconsts);
        return NULL;
    }
    if (nconsts > 0 && !consts) {
        em_error_null("tr_parse", "consts");
        return NULL;
    }
    return parse_text(text, consts, nconsts, false);
}

static tr_graph *parse_text(const char *text, em_tensor *const *consts, int nconsts,
                            bool placeholders) {
    parser ps;
    memset(&ps, 0, sizeof ps);
    ps.text = ps.p = text;
    ps.consts = consts;
    ps.nconsts = nconsts;
    ps.placeholders = placeholders;
    ps.g = tr_graph_new();
    if (!ps.g) return NULL;
    bool ok = parse_graph(&ps);
    em_free(ps.syms);
    em_free(ps.refs);
    if (ok && tr_verify(ps.g) != EM_OK) {
        if (em_last_status() != EM_ERR_NOMEM) {
            char why[400];
            snprintf(why, sizeof why, "%s", em_last_error());
            em_error(EM_ERR_ARG, "graph text line 1, column 1: the graph is not valid: %s", why);
        }
        ok = false;
    }
    if (!ok) {
        tr_graph_free(ps.g);
        return NULL;
    }
    return ps.g;
}
