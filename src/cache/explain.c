/* explain.c - keys with named fields (kc_fields), their manifests, and why
 * a lookup missed (kc_explain): cache.h describes the text form.
 *
 * The cache still knows keys and bytes, not what they mean: a manifest is
 * names and values, compared as text; the caller chose the names. */
#include "cache.h"

#include "eager.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MANIFEST_MAGIC "ember-manifest"
#define MAX_FIELDS 64      /* more is not a manifest Ember writes */
#define SHOW_MAX 160       /* longest value quoted in an explanation */
#define DIFFS_SHOWN 4      /* fields described in full; the others counted */

/* ---- the builder ---- */

static bool name_valid(const char *name) {
    size_t n = name ? strlen(name) : 0;
    if (n < 1 || n > KC_FIELD_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++)
        if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') || name[i] == '_'))
            return false;
    return true;
}

/* A new field at the end of m, or NULL (m marked failed). */
static kc_field *field_add(kc_manifest *m, const char *name, kc_field_type type) {
    if (m->failed) return NULL;
    if (!name_valid(name) || m->n >= MAX_FIELDS) {
        m->failed = true;
        return NULL;
    }
    if (m->n == m->cap) {
        int cap = m->cap ? 2 * m->cap : 8;
        kc_field *f = em_malloc(sizeof *f * (size_t)cap);
        if (!f) {
            m->failed = true;
            return NULL;
        }
        if (m->n) memcpy(f, m->fields, sizeof *f * (size_t)m->n);
        em_free(m->fields);
        m->fields = f;
        m->cap = cap;
    }
    kc_field *f = &m->fields[m->n++];
    memset(f, 0, sizeof *f);
    memcpy(f->name, name, strlen(name) + 1);
    f->type = type;
    return f;
}

void kc_fields_begin(kc_fields *f, kc_manifest *m) {
    kc_hasher_reset(&f->h);
    f->m = m;
    if (!m) return;
    kc_manifest_clear(m);
    m->version = KC_FORMAT_VERSION;
}

void kc_fields_str(kc_fields *f, const char *name, const char *value) {
    kc_hasher_update_str(&f->h, value);
    if (!f->m) return;
    kc_field *fl = field_add(f->m, name, value ? KC_FIELD_STR : KC_FIELD_NULL);
    if (!fl || !value) return;
    fl->n = strlen(value);
    if ((fl->s = em_malloc(fl->n + 1))) memcpy(fl->s, value, fl->n + 1);
    else f->m->failed = true;
}

void kc_fields_u64(kc_fields *f, const char *name, uint64_t v) {
    kc_hasher_update_u64(&f->h, v);
    kc_field *fl = f->m ? field_add(f->m, name, KC_FIELD_U64) : NULL;
    if (fl) fl->u = v;
}

kc_key kc_fields_digest(kc_fields *f) {
    kc_key k = kc_hasher_digest(&f->h);
    if (f->m) f->m->key = k;
    return k;
}

void kc_manifest_clear(kc_manifest *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) em_free(m->fields[i].s);
    em_free(m->fields);
    memset(m, 0, sizeof *m);
}

const kc_field *kc_manifest_field(const kc_manifest *m, const char *name) {
    for (int i = 0; m && i < m->n; i++)
        if (!strcmp(m->fields[i].name, name)) return &m->fields[i];
    return NULL;
}

kc_key kc_manifest_digest(const kc_manifest *m) {
    kc_hasher h;
    kc_hasher_reset_version(&h, m->version);
    for (int i = 0; i < m->n; i++) {
        const kc_field *f = &m->fields[i];
        if (f->type == KC_FIELD_U64) kc_hasher_update_u64(&h, f->u);
        else kc_hasher_update_str(&h, f->type == KC_FIELD_STR ? f->s : NULL);
    }
    return kc_hasher_digest(&h);
}

/* ---- the text form ---- */

char *kc_manifest_format(const kc_manifest *m, size_t *n) {
    char *text = NULL, hex[KC_KEY_HEX_SIZE];
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        em_error(EM_ERR_NOMEM, "kc_manifest_format: out of memory");
        return NULL;
    }
    kc_key_hex(&m->key, hex);
    fprintf(f, MANIFEST_MAGIC " %u\nkey-format %u\nkey %s\nfields %d\n", KC_MANIFEST_VERSION,
            m->version, hex, m->n);
    for (int i = 0; i < m->n; i++) {
        const kc_field *fl = &m->fields[i];
        if (fl->type == KC_FIELD_U64) fprintf(f, "u64 %s %" PRIu64 "\n", fl->name, fl->u);
        else if (fl->type == KC_FIELD_NULL) fprintf(f, "nul %s\n", fl->name);
        else fprintf(f, "str %s %zu\n%s\n", fl->name, fl->n, fl->s);
    }
    bool ok = fclose(f) == 0 && text;
    /* copied into em_malloc'd memory: callers free with em_free */
    char *out = ok ? em_malloc(len + 1) : NULL;
    if (out) memcpy(out, text, len + 1);
    else if (!ok) em_error(EM_ERR_NOMEM, "kc_manifest_format: out of memory");
    free(text);
    *n = len;
    return out;
}

typedef struct cursor {
    const char *p, *end;
} cursor;

/* One line (without its newline) into line/len; false at the end. */
static bool next_line(cursor *c, const char **line, size_t *len) {
    const char *nl = c->p < c->end ? memchr(c->p, '\n', (size_t)(c->end - c->p)) : NULL;
    if (!nl) return false;
    *line = c->p;
    *len = (size_t)(nl - c->p);
    c->p = nl + 1;
    return true;
}

/* A decimal number of at most 20 digits, the whole of s[0..n). */
static bool parse_u64(const char *s, size_t n, uint64_t *out) {
    uint64_t v = 0;
    if (n == 0 || n > 20) return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9' || v > (UINT64_MAX - (uint64_t)(s[i] - '0')) / 10) return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return true;
}

/* "word rest": the word w, one space, rest (at *rest, length *nrest). */
static bool starts(const char *line, size_t len, const char *w, const char **rest, size_t *nrest) {
    size_t n = strlen(w);
    if (len <= n || memcmp(line, w, n) != 0 || line[n] != ' ') return false;
    *rest = line + n + 1;
    *nrest = len - n - 1;
    return true;
}

/* "w <number>" as a whole line. */
static bool header_number(cursor *c, const char *w, uint64_t max, uint64_t *out) {
    const char *line, *rest;
    size_t len, nrest;
    return next_line(c, &line, &len) && starts(line, len, w, &rest, &nrest) &&
           parse_u64(rest, nrest, out) && *out <= max;
}

/* A field's name from s[0..n) (up to a space or the end); *used its length. */
static bool field_name(const char *s, size_t n, char out[KC_FIELD_NAME_MAX + 1], size_t *used) {
    const char *sp = memchr(s, ' ', n);
    size_t k = sp ? (size_t)(sp - s) : n;
    if (k < 1 || k > KC_FIELD_NAME_MAX) return false;
    memcpy(out, s, k);
    out[k] = '\0';
    *used = k;
    return name_valid(out);
}

/* A string value of n bytes at the cursor, then a newline. */
static bool field_value(cursor *c, kc_field *f, uint64_t n) {
    if ((uint64_t)(c->end - c->p) < n + 1 || c->p[n] != '\n' || memchr(c->p, '\0', n)) return false;
    if (!(f->s = em_malloc(n + 1))) return false;
    memcpy(f->s, c->p, n);
    f->s[n] = '\0';
    f->n = n;
    c->p += n + 1;
    return true;
}

static bool parse_field(cursor *c, kc_manifest *m) {
    const char *line, *rest;
    size_t len, nrest, used;
    char name[KC_FIELD_NAME_MAX + 1];
    if (!next_line(c, &line, &len)) return false;
    kc_field_type t;
    if (starts(line, len, "str", &rest, &nrest)) t = KC_FIELD_STR;
    else if (starts(line, len, "u64", &rest, &nrest)) t = KC_FIELD_U64;
    else if (starts(line, len, "nul", &rest, &nrest)) t = KC_FIELD_NULL;
    else return false;
    if (!field_name(rest, nrest, name, &used) || kc_manifest_field(m, name)) return false;
    if (t == KC_FIELD_NULL) return used == nrest && field_add(m, name, t);
    uint64_t v;
    if (used == nrest || !parse_u64(rest + used + 1, nrest - used - 1, &v)) return false;
    kc_field *f = field_add(m, name, t);
    if (!f) return false;
    if (t == KC_FIELD_U64) f->u = v;
    return t == KC_FIELD_U64 || field_value(c, f, v);
}

em_status kc_manifest_parse(const char *text, size_t n, kc_manifest *out) {
    memset(out, 0, sizeof *out);
    if (!text) return em_error(EM_ERR_NULL, "kc_manifest_parse: text is NULL");
    cursor c = {text, text + n};
    uint64_t version = 0, kf = 0, nf = 0;
    const char *line, *rest;
    size_t len, nrest;
    char hex[KC_KEY_HEX_SIZE];
    bool ok = header_number(&c, MANIFEST_MAGIC, KC_MANIFEST_VERSION, &version) &&
              version == KC_MANIFEST_VERSION && header_number(&c, "key-format", UINT32_MAX, &kf) &&
              next_line(&c, &line, &len) && starts(line, len, "key", &rest, &nrest) &&
              nrest == KC_KEY_HEX_SIZE - 1;
    if (ok) {
        memcpy(hex, rest, KC_KEY_HEX_SIZE - 1);
        hex[KC_KEY_HEX_SIZE - 1] = '\0';
        ok = kc_key_from_hex(hex, &out->key) && header_number(&c, "fields", MAX_FIELDS, &nf);
    }
    out->version = (uint32_t)kf;
    for (uint64_t i = 0; ok && i < nf; i++) ok = parse_field(&c, out);
    ok = ok && !out->failed && c.p == c.end;
    if (ok) return EM_OK;
    bool nomem = out->failed && em_last_status() == EM_ERR_NOMEM;
    kc_manifest_clear(out);
    return nomem ? EM_ERR_NOMEM : em_error(EM_ERR_ARG, "kc_manifest_parse: not a manifest");
}

/* ---- storing ---- */

bool kc_why_kind(const char *kind, char out[KC_KIND_MAX + 1]) {
    int w = snprintf(out, KC_KIND_MAX + 1, "why_%s", kind ? kind : "");
    return kind && w > 0 && w <= KC_KIND_MAX && kc_kind_valid(out);
}

em_status kc_put_manifest(kc_cache *c, const kc_manifest *m, const char *kind) {
    char wk[KC_KIND_MAX + 1];
    if (!c || !m) return em_error(EM_ERR_NULL, "kc_put_manifest: cache or manifest is NULL");
    if (!kc_why_kind(kind, wk)) return em_error(EM_ERR_ARG, "kc_put_manifest: kind '%s' too long", kind);
    if (m->failed) return em_error(EM_ERR_STATE, "kc_put_manifest: the manifest is incomplete");
    size_t n;
    char *text = kc_manifest_format(m, &n);
    if (!text) return em_last_status();
    em_status s = kc_put(c, &m->key, wk, text, n); /* a lost one costs an explanation */
    em_free(text);
    return s;
}

/* ---- describing a difference ---- */

/* Prints s[0..n) quoted, cut at SHOW_MAX bytes. */
static void quote(FILE *f, const char *s, size_t n) {
    if (n > SHOW_MAX) fprintf(f, "'%.*s...'", SHOW_MAX, s);
    else fprintf(f, "'%.*s'", (int)n, s);
}

/* Line `no` (0-based) of s: its start and length; false past the end. */
static bool line_at(const char *s, int no, const char **line, size_t *len) {
    for (int i = 0; i < no; i++) {
        const char *nl = strchr(s, '\n');
        if (!nl || !nl[1]) return false; /* a final newline starts no line */
        s = nl + 1;
    }
    const char *nl = strchr(s, '\n');
    *line = s;
    *len = nl ? (size_t)(nl - s) : strlen(s);
    return *s || no == 0;
}

static void show_line(FILE *f, const char *s, int no) {
    const char *line;
    size_t len;
    if (line_at(s, no, &line, &len)) quote(f, line, len);
    else fprintf(f, "(no line %d)", no + 1);
}

/* Multi-line values: the first line that differs, numbered from 1. */
static void diff_lines(FILE *f, const char *name, const char *a, const char *b) {
    int no = 0;
    const char *pa = a, *pb = b;
    for (;;) {
        size_t la = strcspn(pa, "\n"), lb = strcspn(pb, "\n");
        if (la != lb || memcmp(pa, pb, la) != 0) break;
        if (!pa[la] || !pb[lb]) { /* equal so far, and one of them ends */
            no += pa[la] || pb[lb];
            break;
        }
        pa += la + 1, pb += lb + 1, no++;
    }
    fprintf(f, "%s at line %d: cached ", name, no + 1);
    show_line(f, a, no);
    fprintf(f, ", now ");
    show_line(f, b, no);
}

/* Word `no` (0-based, space-separated) of s: start and length; false past the end. */
static bool word_at(const char *s, int no, const char **w, size_t *len) {
    for (int i = 0;; i++) {
        s += strspn(s, " ");
        if (!*s) return false;
        size_t n = strcspn(s, " ");
        if (i == no) {
            *w = s;
            *len = n;
            return true;
        }
        s += n;
    }
}

/* Whether a word names the one after it ("libgccjit 13.2", "codegen 2",
 * "CUDA 12080"): letters only. */
static bool is_label(const char *w, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!((w[i] >= 'a' && w[i] <= 'z') || (w[i] >= 'A' && w[i] <= 'Z'))) return false;
    return n > 0;
}

/* One-line values of several words (a target: compiler, generator and
 * option versions): the first word that differs, named by the word
 * before it or by its option ("-march=..."). */
static void diff_words(FILE *f, const char *name, const char *a, const char *b) {
    int no = 0;
    const char *wa = NULL, *wb = NULL;
    size_t la = 0, lb = 0;
    for (;; no++) {
        bool ha = word_at(a, no, &wa, &la), hb = word_at(b, no, &wb, &lb);
        if (!ha || !hb || la != lb || memcmp(wa, wb, la) != 0) {
            if (!ha) wa = NULL;
            if (!hb) wb = NULL;
            break;
        }
    }
    const char *eq = wa && wb && wa[0] == '-' ? memchr(wa, '=', la) : NULL;
    size_t opt = eq ? (size_t)(eq - wa) + 1 : 0;
    const char *prev;
    size_t lp;
    if (opt && lb > opt && !memcmp(wa, wb, opt)) {
        fprintf(f, "%s, option %.*s: cached ", name, (int)opt - 1, wa);
        wa += opt, la -= opt, wb += opt, lb -= opt;
    } else if (no > 0 && word_at(a, no - 1, &prev, &lp) && is_label(prev, lp)) {
        fprintf(f, "%s, %.*s: cached ", name, (int)lp, prev);
    } else {
        fprintf(f, "%s, word %d: cached ", name, no + 1);
    }
    if (wa) quote(f, wa, la);
    else fprintf(f, "(no word %d)", no + 1);
    fprintf(f, ", now ");
    if (wb) quote(f, wb, lb);
    else fprintf(f, "(no word %d)", no + 1);
}

static void show_value(FILE *f, const kc_field *x) {
    if (!x) fprintf(f, "(no such field)");
    else if (x->type == KC_FIELD_U64) fprintf(f, "%" PRIu64, x->u);
    else if (x->type == KC_FIELD_NULL) fprintf(f, "(none)");
    else quote(f, x->s, x->n);
}

/* How field name differs: cached c, wanted w (either may be NULL). */
static void describe(FILE *f, const char *name, const kc_field *c, const kc_field *w) {
    bool strs = c && w && c->type == KC_FIELD_STR && w->type == KC_FIELD_STR;
    if (strs && (strchr(c->s, '\n') || strchr(w->s, '\n'))) {
        diff_lines(f, name, c->s, w->s);
    } else if (strs && (strchr(c->s, ' ') || strchr(w->s, ' '))) {
        diff_words(f, name, c->s, w->s);
    } else {
        fprintf(f, "%s: cached ", name);
        show_value(f, c);
        fprintf(f, ", now ");
        show_value(f, w);
    }
}

static bool field_equal(const kc_field *a, const kc_field *b) {
    if (!a || !b || a->type != b->type) return false;
    if (a->type == KC_FIELD_U64) return a->u == b->u;
    return a->type == KC_FIELD_NULL || (a->n == b->n && !memcmp(a->s, b->s, a->n));
}

/* Fields of want equal in m, counting the key format as one. */
static int score(const kc_manifest *m, const kc_manifest *want) {
    int s = m->version == want->version;
    for (int i = 0; i < want->n; i++)
        s += field_equal(kc_manifest_field(m, want->fields[i].name), &want->fields[i]);
    return s;
}

/* "differs in A: ...; in B: ..." for every field of cached vs want. */
static void describe_all(FILE *f, const kc_manifest *cached, const kc_manifest *want) {
    int shown = 0, more = 0;
    if (cached->version != want->version) {
        fprintf(f, " differs in the key format: cached %u, now %u", cached->version, want->version);
        shown++;
    }
    for (int pass = 0; pass < 2; pass++) { /* the wanted fields, then the cached only */
        const kc_manifest *m = pass ? cached : want;
        for (int i = 0; i < m->n; i++) {
            const char *name = m->fields[i].name;
            const kc_field *c = kc_manifest_field(cached, name), *w = kc_manifest_field(want, name);
            if ((pass && w) || field_equal(c, w)) continue;
            if (shown == DIFFS_SHOWN) {
                more++;
                continue;
            }
            fprintf(f, shown ? "; and in " : " differs in ");
            describe(f, name, c, w);
            shown++;
        }
    }
    if (more) fprintf(f, "; and in %d more fields", more);
    if (!shown) fprintf(f, " has the same fields (its artifact is missing or was not usable)");
}

/* ---- finding the nearest entry ---- */

/* Reads (k, kind) whole and verified without marking it used (as
 * kc_verify); NULL on any problem (*nomem: out of memory). */
static char *read_quiet(const char *root, const kc_key *k, const char *kind, size_t *n,
                        bool *nomem) {
    char *mpath = kc_store_path(root, k, kind, true);
    struct stat st;
    bool have_time = mpath && lstat(mpath, &st) == 0;
    void *data = NULL;
    kc_meta m;
    char why[256];
    kc_read r = kc_store_read(root, k, kind, &data, &m, why, sizeof why);
    if (have_time && r == KC_READ_OK) {
        struct timespec t[2] = {st.st_atim, st.st_mtim};
        (void)utimensat(AT_FDCWD, mpath, t, AT_SYMLINK_NOFOLLOW);
    }
    em_free(mpath);
    *nomem |= r == KC_READ_NOMEM || (!mpath && em_last_status() == EM_ERR_NOMEM);
    if (r != KC_READ_OK) {
        em_free(data);
        return NULL;
    }
    *n = (size_t)m.size;
    return data;
}

/* The manifest of entry e, parsed and checked to hash to e's key. */
static bool read_manifest(const char *root, const kc_entry_info *e, kc_manifest *m, bool *nomem) {
    memset(m, 0, sizeof *m);
    size_t n = 0;
    char *text = read_quiet(root, &e->key, e->kind, &n, nomem);
    em_status s = text ? kc_manifest_parse(text, n, m) : EM_ERR_ARG;
    *nomem |= s == EM_ERR_NOMEM;
    bool ok = s == EM_OK;
    em_free(text);
    kc_key k;
    if (ok) k = kc_manifest_digest(m);
    ok = ok && kc_key_equal(&k, &e->key) && kc_key_equal(&m->key, &e->key);
    if (!ok) kc_manifest_clear(m);
    em_clear_error();
    return ok;
}

/* The entry (key, kind) of the listing, or NULL. */
static const kc_entry_info *find_entry(const kc_entry_info *es, size_t n, const kc_key *key,
                                       const char *kind) {
    for (size_t i = 0; i < n; i++)
        if (kc_key_equal(&es[i].key, key) && !strcmp(es[i].kind, kind)) return &es[i];
    return NULL;
}

/* When the wanted key itself has an entry: why it was a miss; false
 * when there is none. */
static bool explain_same_key(FILE *f, kc_cache *c, const kc_entry_info *es, size_t n,
                             const kc_key *key, const char *kind, const char *wk) {
    const kc_entry_info *art = find_entry(es, n, key, kind);
    if (!art) {
        if (!find_entry(es, n, key, wk)) return false;
        fprintf(f, "the entry's manifest is in the cache but its artifact is missing (removed?)");
        return true;
    }
    char why[512];
    kc_read r = kc_verify(c, art, why, sizeof why);
    em_clear_error();
    if (r == KC_READ_OK)
        fprintf(f, "an entry with this key is in the cache and intact, but could not be used "
                   "(EMBER_LOG=cache logs why)");
    else
        fprintf(f, "the entry with this key is corrupt or refused: %s", why[0] ? why : "unreadable");
    return true;
}

typedef struct nearest {
    kc_manifest m;             /* the best so far */
    const kc_entry_info *e;
    int score;
    int manifests, skipped, artifacts;
    bool nomem;                /* a manifest could not be read for want of memory */
} nearest;

static void find_nearest(kc_cache *c, const kc_entry_info *es, size_t n, const kc_manifest *want,
                         const char *kind, const char *wk, nearest *b) {
    for (size_t i = 0; i < n; i++) { /* least recently used first: a tie goes to the later */
        b->artifacts += !strcmp(es[i].kind, kind);
        if (strcmp(es[i].kind, wk) != 0) continue;
        b->manifests++;
        kc_manifest m;
        if (!read_manifest(kc_dir(c), &es[i], &m, &b->nomem)) {
            b->skipped++;
            continue;
        }
        int s = score(&m, want);
        if (b->e && s < b->score) {
            kc_manifest_clear(&m);
            continue;
        }
        kc_manifest_clear(&b->m);
        b->m = m;
        b->e = &es[i];
        b->score = s;
    }
}

static void explain_nearest(FILE *f, kc_cache *c, const kc_entry_info *es, size_t n,
                            const kc_manifest *want, const char *kind, const char *wk) {
    nearest b = {0};
    find_nearest(c, es, n, want, kind, wk, &b);
    if (b.nomem) { /* the nearest may be the one not read: say nothing wrong */
        fprintf(f, "not explained: out of memory while reading the manifests");
        kc_manifest_clear(&b.m);
        return;
    }
    if (!b.e) {
        if (b.manifests) fprintf(f, "no usable entry of this kind: %d manifests, all corrupt (skipped)",
                                 b.manifests);
        else if (b.artifacts) fprintf(f, "none of the %d entries of this kind has a manifest (written "
                                      "by an older Ember?)", b.artifacts);
        else fprintf(f, "no entry of this kind in the cache");
        return;
    }
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(&b.e->key, hex);
    fprintf(f, "nearest entry %s", hex);
    if (b.manifests > 1) fprintf(f, " (of %d)", b.manifests - b.skipped);
    describe_all(f, &b.m, want);
    if (!find_entry(es, n, &b.e->key, kind)) fprintf(f, "; the nearest entry's artifact is missing");
    if (b.skipped) fprintf(f, "; %d corrupt manifests skipped", b.skipped);
    kc_manifest_clear(&b.m);
}

/* The explanation into f. */
static void explain_to(FILE *f, kc_cache *c, const kc_manifest *want, const char *kind) {
    char wk[KC_KIND_MAX + 1];
    kc_entry_info *es = NULL;
    size_t n = 0;
    if (!kc_why_kind(kind, wk)) {
        fprintf(f, "kind '%s' has no manifests", kind ? kind : "(null)");
    } else if (!c || !kc_on_disk(c)) {
        fprintf(f, "the cache has no directory to search");
    } else if (kc_list(c, &es, &n) != EM_OK) {
        fprintf(f, "the cache cannot be listed: %s", em_last_error());
    } else if (!explain_same_key(f, c, es, n, &want->key, kind, wk)) {
        explain_nearest(f, c, es, n, want, kind, wk);
    }
    em_free(es);
    em_clear_error();
}

char *kc_explain(kc_cache *c, const kc_manifest *want, const char *kind) {
    if (!want) {
        em_error(EM_ERR_NULL, "kc_explain: the wanted manifest is NULL");
        return NULL;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        em_error(EM_ERR_NOMEM, "kc_explain: out of memory");
        return NULL;
    }
    explain_to(f, c, want, kind);
    bool ok = fclose(f) == 0 && text;
    char *out = ok ? em_malloc(len + 1) : NULL;
    if (out) memcpy(out, text, len + 1);
    else if (!ok) em_error(EM_ERR_NOMEM, "kc_explain: out of memory");
    free(text);
    return out;
}
