/* test_corpus.c - every parser of user-supplied text replayed over a
 * checked-in corpus (tests/corpus/<parser>/), as SQLite replays its fuzzers'
 * finds in the normal test run:
 *
 *   graph/     the graph text form (tr_parse, tr_parse_placeholders)
 *   warmlist/  warmup lists (jit_records_read), and each record's graph
 *   bundle/    cache bundles (kc_import)
 *   plan/      graph plans (jit_plan_parse), against the graph below
 *   meta/      cache entry headers (kc_meta_parse, and read from disk)
 *
 * Each input is accepted or rejected with an error, never a crash or a read
 * out of bounds (make check-valgrind runs this too; inputs are handed over
 * in buffers of exactly their size where the API takes a length).  What is
 * accepted must print back to itself: a graph's print -> parse -> print is
 * a fixed point, and so is a plan's; a header prints back to its exact
 * bytes (the header parser takes the canonical form only).
 * A file named ok-* must be accepted and bad-* rejected (the seeds and the
 * known-bad cases of issue 21); anything else (mutants, fuzzer finds) may
 * go either way.
 *
 * Built with -DEMBER_FUZZ and clang -fsanitize=fuzzer,address, the same
 * code is a libFuzzer target (EMBER_FUZZ_PARSER=graph|warmlist|bundle|plan|
 * meta picks the parser); tests/corpus/README says how the corpus was
 * grown. */
#include "testutil.h"

#include "cache.h"
#include "jit.h"
#include "plan.h"
#include "trace.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef CORPUS_DIR
#define CORPUS_DIR "tests/corpus"
#endif

/* Where a parser must fail cleanly: the check, or (fuzzing) an abort the
 * fuzzer reports. */
#ifdef EMBER_FUZZ
#define CHECK(cond, ...) ((cond) ? (void)0 : (fprintf(stderr, __VA_ARGS__), abort()))
#else
#define CHECK(cond, ...) ck_assert_msg((cond), __VA_ARGS__)
#endif

/* A scratch directory for the parsers that read files. */
static char scratch[64];

static void scratch_make(void) {
    if (scratch[0]) return;
    snprintf(scratch, sizeof scratch, "/tmp/ember-corpus-XXXXXX");
    CHECK(mkdtemp(scratch) != NULL, "mkdtemp: %s", strerror(errno));
}

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *f) {
    (void)st, (void)flag, (void)f;
    return remove(p);
}

static void scratch_remove(void) {
    if (scratch[0]) nftw(scratch, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    scratch[0] = '\0';
}

/* Writes data to a new file under the scratch directory; its path. */
static void scratch_file(const char *name, const unsigned char *data, size_t n, char *path,
                         size_t np) {
    scratch_make();
    snprintf(path, np, "%s/%s", scratch, name);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL, "%s: %s", path, strerror(errno));
    CHECK(fwrite(data, 1, n, f) == n && fclose(f) == 0, "cannot write %s", path);
}

/* A copy of data with a NUL after it, for the parsers of C strings (an
 * embedded NUL ends the text there, as it would for any caller). */
static char *cstr(const unsigned char *data, size_t n) {
    char *s = malloc(n + 1);
    CHECK(s != NULL, "out of memory");
    memcpy(s, data, n);
    s[n] = '\0';
    return s;
}

/* A copy of exactly n bytes (no NUL after them): reading past them is an
 * invalid read that valgrind reports. */
static char *exact(const unsigned char *data, size_t n) {
    char *s = malloc(n ? n : 1);
    CHECK(s != NULL, "out of memory");
    if (n) memcpy(s, data, n);
    return s;
}

/* A failure sets a status and a message. */
static void check_error(const char *what) {
    CHECK(em_last_status() != EM_OK, "%s failed without a status", what);
    CHECK(em_last_error()[0] != '\0', "%s failed without a message", what);
}

/* A cache at dir that keeps its warnings (damaged entries: expected here)
 * to itself. */
static void no_log(void *ud, const char *msg) { (void)ud, (void)msg; }
static kc_cache *open_cache(const char *dir) {
    kc_options o = {.dir = dir, .log = no_log};
    kc_cache *c = kc_open_with(&o);
    CHECK(c && kc_on_disk(c), "cannot open a cache at %s", dir);
    return c;
}

/* ---- graph text ---- */

/* Parses text; when it is a graph, print -> parse -> print must be a fixed
 * point. */
static bool graph_round_trip(const char *text) {
    em_clear_error();
    tr_graph *g = tr_parse_placeholders(text);
    if (!g) {
        check_error("tr_parse_placeholders");
        return false;
    }
    char *t1 = tr_to_text(g);
    CHECK(t1 != NULL, "tr_to_text: %s", em_last_error());
    tr_graph *g2 = tr_parse_placeholders(t1);
    CHECK(g2 != NULL, "the printed graph does not parse back: %s\n%s", em_last_error(), t1);
    char *t2 = tr_to_text(g2);
    CHECK(t2 != NULL && !strcmp(t1, t2), "print -> parse -> print is not a fixed point:\n%s\n%s",
          t1, t2 ? t2 : "(null)");
    em_free(t1);
    em_free(t2);
    tr_graph_free(g2);
    tr_graph_free(g);
    return true;
}

static bool run_graph(const unsigned char *data, size_t n) {
    char *text = cstr(data, n);
    bool ok = graph_round_trip(text);
    /* without the constants' tensors: accepted only when there are none */
    em_clear_error();
    tr_graph *g = tr_parse(text, NULL, 0);
    if (g) tr_graph_free(g);
    else check_error("tr_parse");
    free(text);
    return ok;
}

/* ---- warmup lists ---- */

static bool run_warmlist(const unsigned char *data, size_t n) {
    char path[128];
    scratch_file("list.txt", data, n, path, sizeof path);
    jit_record *rs;
    int nr;
    em_clear_error();
    if (jit_records_read(path, &rs, &nr) != EM_OK) {
        check_error("jit_records_read");
        return false;
    }
    for (int i = 0; i < nr; i++) {
        CHECK(rs[i].name && rs[i].backend && rs[i].graph, "record %d lacks a field", i);
        (void)graph_round_trip(rs[i].graph); /* what ember-cache warmup parses */
    }
    jit_records_free(rs, nr);
    return true;
}

/* ---- bundles ---- */

/* The tags a corpus bundle must carry to be accepted. */
static const char *const bundle_tags[] = {"cache-format=1", "cpu=corpus"};

static bool run_bundle(const unsigned char *data, size_t n) {
    char path[128], dir[128];
    scratch_file("bundle.ember", data, n, path, sizeof path);
    snprintf(dir, sizeof dir, "%s/cache", scratch);
    kc_cache *c = open_cache(dir);
    uint64_t imported = 0;
    em_clear_error();
    em_status s = kc_import(c, path, bundle_tags, 2, &imported);
    if (s != EM_OK) check_error("kc_import");
    uint64_t removed;
    CHECK(kc_clear(c, &removed) == EM_OK, "kc_clear: %s", em_last_error());
    CHECK(s != EM_OK || removed <= imported, "%llu entries on disk after importing %llu",
          (unsigned long long)removed, (unsigned long long)imported);
    kc_close(c);
    return s == EM_OK;
}

/* ---- plans ---- */

/* The graph every corpus plan is read for: nodes 0-1 inputs, 2 a
 * constant, 3-5 calls. */
static const char plan_graph[] =
    "graph(%x: f32[4, 8]{8, 1}, %w: f32[8, 16]{16, 1}) {\n"
    "  %2 = constant #0 : f32[16]{1}\n"
    "  %3 = matmul(%x, %w) : f32[4, 16]{16, 1}\n"
    "  %4 = add(%3, %2) : f32[4, 16]{16, 1}\n"
    "  %5 = relu(%4) : f32[4, 16]{16, 1}\n"
    "  return (%5)\n"
    "}\n";

/* The key every corpus plan names on its "graph" line: a plan is read
 * under the key it was filed by, and one that names another is refused. */
static const char plan_key[] = "00112233445566778899aabbccddeeff";

static bool run_plan(const unsigned char *data, size_t n) {
    tr_graph *g = tr_parse_placeholders(plan_graph);
    CHECK(g != NULL, "the plan corpus's graph: %s", em_last_error());
    kc_key key;
    CHECK(kc_key_from_hex(plan_key, &key), "the plan corpus's key");
    char *text = exact(data, n);
    jit_plan p;
    bool ok = jit_plan_parse(text, n, g, &key, &p);
    if (ok) { /* print -> parse -> print is a fixed point */
        size_t len = 0, len2 = 0;
        char *t1 = jit_plan_format(&p, &len);
        CHECK(t1 != NULL, "jit_plan_format: out of memory");
        jit_plan p2;
        CHECK(jit_plan_parse(t1, len, g, &key, &p2), "a printed plan does not parse back:\n%s", t1);
        char *t2 = jit_plan_format(&p2, &len2);
        CHECK(t2 && len == len2 && !memcmp(t1, t2, len), "print -> parse -> print of a plan is "
              "not a fixed point:\n%s\n---\n%s", t1, t2 ? t2 : "(null)");
        em_free(t1);
        em_free(t2);
        jit_plan_clear(&p2);
        jit_plan_clear(&p);
    }
    free(text);
    tr_graph_free(g);
    return ok;
}

/* ---- entry headers ---- */

/* Parses data as a header; then puts it on disk as the header of an entry
 * (of its own key and kind when it parses) and reads that entry. */
static bool run_meta(const unsigned char *data, size_t n) {
    char *text = exact(data, n);
    kc_meta m;
    bool ok = kc_meta_parse(text, n, &m);
    if (ok) {
        char again[KC_META_MAX];
        CHECK(kc_meta_format(&m, again) == n && !memcmp(again, data, n),
              "an accepted header prints back differently");
    }
    free(text);
    char dir[128];
    scratch_make();
    snprintf(dir, sizeof dir, "%s/cache", scratch);
    kc_cache *c = open_cache(dir);
    kc_key k = {{0}};
    const char *kind = ok ? m.kind : "so";
    if (ok) k = m.key;
    char *meta = kc_store_path(kc_dir(c), &k, kind, true);
    char *payload = kc_store_path(kc_dir(c), &k, kind, false);
    CHECK(meta && payload, "out of memory");
    char fan[160];
    snprintf(fan, sizeof fan, "%.*s", (int)(strrchr(meta, '/') - meta), meta);
    (void)mkdir(fan, 0700);
    FILE *f = fopen(payload, "wb");
    CHECK(f && fwrite("payload", 1, 7, f) == 7 && fclose(f) == 0, "cannot write %s", payload);
    f = fopen(meta, "wb");
    CHECK(f && fwrite(data, 1, n, f) == n && fclose(f) == 0, "cannot write %s", meta);
    void *got = NULL;
    size_t len = 0;
    CHECK(kc_get(c, &k, kind, &got, &len) == EM_OK, "kc_get: %s", em_last_error());
    CHECK(!got || (len == 7 && !memcmp(got, "payload", 7)), "kc_get returned other bytes");
    em_free(got);
    uint64_t removed;
    (void)kc_clear(c, &removed);
    em_free(meta);
    em_free(payload);
    kc_close(c);
    return ok;
}

/* ---- the replay ---- */

typedef bool (*parser_fn)(const unsigned char *data, size_t n);

typedef struct parser {
    const char *name; /* its corpus directory */
    parser_fn run;    /* true: accepted */
} parser;

static const parser parsers[] = {
    {"graph", run_graph}, {"warmlist", run_warmlist}, {"bundle", run_bundle},
    {"plan", run_plan},   {"meta", run_meta},
};

static const parser *parser_named(const char *name) {
    for (size_t i = 0; i < sizeof parsers / sizeof parsers[0]; i++)
        if (!strcmp(parsers[i].name, name)) return &parsers[i];
    return NULL;
}

#ifdef EMBER_FUZZ

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    static const parser *p;
    if (!p) {
        const char *name = getenv("EMBER_FUZZ_PARSER");
        p = parser_named(name ? name : "graph");
        if (!p) abort();
    }
    em_scope_begin();
    p->run(data, n);
    em_scope_end();
    em_clear_error();
    return 0;
}

#else

static int by_name(const struct dirent **a, const struct dirent **b) {
    return strcmp((*a)->d_name, (*b)->d_name);
}

/* Replays every file of CORPUS_DIR/<name>; returns how many. */
static int replay(const char *name) {
    const parser *p = parser_named(name);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", CORPUS_DIR, name);
    struct dirent **des;
    int nd = scandir(dir, &des, NULL, by_name);
    ck_assert_msg(nd >= 0, "cannot list %s: %s", dir, strerror(errno));
    int files = 0, accepted = 0;
    for (int i = 0; i < nd; i++) {
        const char *f = des[i]->d_name;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, f);
        struct stat st;
        if (f[0] == '.' || stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
            free(des[i]);
            continue;
        }
        size_t n = (size_t)st.st_size;
        unsigned char *data = malloc(n ? n : 1);
        FILE *fp = fopen(path, "rb");
        ck_assert_msg(data && fp && fread(data, 1, n, fp) == n, "cannot read %s", path);
        fclose(fp);
        bool ok = p->run(data, n);
        ck_assert_msg(strncmp(f, "ok-", 3) || ok, "%s/%s is a seed but was rejected: %s", name,
                      f, em_last_error());
        ck_assert_msg(strncmp(f, "bad-", 4) || !ok, "%s/%s was accepted", name, f);
        accepted += ok;
        files++;
        free(data);
        free(des[i]);
    }
    free(des);
    scratch_remove();
    fprintf(stderr, "corpus %s: %d inputs, %d accepted\n", name, files, accepted);
    return files;
}

START_TEST(graph_corpus) { ck_assert_int_gt(replay("graph"), 0); }
END_TEST
START_TEST(warmlist_corpus) { ck_assert_int_gt(replay("warmlist"), 0); }
END_TEST
START_TEST(bundle_corpus) { ck_assert_int_gt(replay("bundle"), 0); }
END_TEST
START_TEST(plan_corpus) { ck_assert_int_gt(replay("plan"), 0); }
END_TEST
START_TEST(meta_corpus) { ck_assert_int_gt(replay("meta"), 0); }
END_TEST

int main(void) {
    const tu_test tests[] = {
        {"graph_corpus", graph_corpus},       {"warmlist_corpus", warmlist_corpus},
        {"bundle_corpus", bundle_corpus},     {"plan_corpus", plan_corpus},
        {"meta_corpus", meta_corpus},
    };
    return tu_run(tu_suite("corpus", tests, sizeof tests / sizeof tests[0], 300));
}

#endif
