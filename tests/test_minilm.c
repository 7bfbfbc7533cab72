/* test_minilm.c - the MiniLM demo (examples/minilm) against
 * sentence-transformers: token ids, and embeddings eager and compiled
 * (cosine distance <= 1e-4), from tests/data/minilm_ref.json (made by
 * tools/minilm_reference.py).  Also the error paths of the safetensors
 * reader, the JSON parser and the model loader on broken files.
 *
 * The weights are found in $EMBER_MODEL_DIR, else where tools/fetch-minilm
 * puts them; without them, the file-format tests still run and the program
 * exits 77 (skipped), saying so.
 *
 * cuda_matches_reference runs the model on cuda:0 (weights, ids and mask
 * on the GPU, eager and compiled) when main's probe finds a GPU; without
 * one it is left out, with a line saying why, and the rest still runs.
 * CUDA cannot be used in a child of a process that initialized it, and
 * Check forks a process per test: the probe runs in a child of its own. */
#include "testutil.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../examples/minilm/minilm.h"

/* Under valgrind (make check-valgrind) the model runs some 50 times slower:
 * the embedding tests then take the first three (short) sentences only,
 * enough to run every code path of the tokenizer, the loader and the eager
 * and compiled encoders under the memory checker; the full set, with the
 * 256-token sentence, runs in make check. */
#if defined(__has_include)
#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

#ifndef MINILM_DIR
#define MINILM_DIR "models/all-MiniLM-L6-v2"
#endif
#ifndef MINILM_REF
#define MINILM_REF "tests/data/minilm_ref.json"
#endif

static const char *model_dir(void) {
    const char *d = getenv("EMBER_MODEL_DIR");
    return d && *d ? d : MINILM_DIR;
}

static bool have_weights(void) {
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", model_dir());
    return access(path, R_OK) == 0;
}

/* ---- the reference file ---- */

typedef struct ref {
    js_doc *doc;
    int sentences, cases; /* the arrays' nodes */
} ref;

static ref load_ref(void) {
    FILE *f = fopen(MINILM_REF, "rb");
    ck_assert_msg(f, "cannot open %s", MINILM_REF);
    static char buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    ck_assert(n > 0 && n < sizeof buf);
    ml_error e = {""};
    ref r = {js_parse(buf, n, &e), -1, -1};
    ck_assert_msg(r.doc, "%s: %s", MINILM_REF, e.msg);
    r.sentences = js_get(r.doc, 0, "sentences");
    r.cases = js_get(r.doc, 0, "tokenizer_cases");
    ck_assert(js_type_of(r.doc, r.sentences) == JS_ARR && js_type_of(r.doc, r.cases) == JS_ARR);
    return r;
}

/* The n entries of an array node (texts, or id/embedding arrays). */
static int count(const js_doc *d, int arr) {
    int n = 0;
    for (int c = js_first(d, arr); c >= 0; c = js_next(d, c)) n++;
    return n;
}

/* Asserts that Ember's tokenizer gives the reference ids of item (an
 * object with "text" and "ids"). */
static void check_ids(const wp_vocab *v, int max_seq, const js_doc *d, int item) {
    const char *text = js_str(d, js_get(d, item, "text"));
    int want = js_get(d, item, "ids"), nwant = count(d, want);
    ck_assert(text && nwant >= 2);
    size_t len = js_len(d, js_get(d, item, "text")); /* a text may hold a NUL */
    int32_t got[512];
    int n = 0;
    ml_error e = {""};
    ck_assert_int_eq(wp_encode(v, text, len, max_seq, got, &n, &e), ML_OK);
    int k = 0;
    for (int c = js_first(d, want); c >= 0; c = js_next(d, c), k++) {
        int64_t id;
        ck_assert(js_int(d, c, &id));
        ck_assert_msg(k < n && got[k] == id, "\"%.40s\": token %d is %d, reference %lld", text, k,
                      k < n ? got[k] : -1, (long long)id);
    }
    ck_assert_msg(n == nwant, "\"%.40s\": %d tokens, reference %d", text, n, nwant);
}

START_TEST(test_tokenizer_matches_reference) {
    ref r = load_ref();
    ml_error e = {""};
    char path[4096];
    snprintf(path, sizeof path, "%s/vocab.txt", model_dir());
    wp_vocab *v = wp_vocab_load(path, &e);
    ck_assert_msg(v, "%s", e.msg);
    int64_t max_seq;
    ck_assert(js_int(r.doc, js_get(r.doc, 0, "max_seq_length"), &max_seq));
    for (int c = js_first(r.doc, r.sentences); c >= 0; c = js_next(r.doc, c))
        check_ids(v, (int)max_seq, r.doc, c);
    for (int c = js_first(r.doc, r.cases); c >= 0; c = js_next(r.doc, c))
        check_ids(v, (int)max_seq, r.doc, c);
    wp_vocab_free(v);
    js_free(r.doc);
}
END_TEST

/* ---- embeddings ---- */

#define MAX_COMPONENT_DIFF 1e-5

/* How close an embedding must be to sentence-transformers' (f32) one. */
typedef struct tolerance {
    double dist, component, norm; /* cosine distance; |difference| of a component; |norm - 1| */
} tolerance;

/* The f32 model: 1e-4 and MAX_COMPONENT_DIFF (below), the norm to 1e-5. */
static const tolerance F32_TOL = {1e-4, 1e-5, 1e-5};
/* A bf16 model (issue 15: within 1e-2 cosine distance of f32): each
 * weight and each stored activation rounded to 8 bits (relative 2^-9),
 * the unit-norm output too; measured 3e-5 cosine distance, components
 * within 2e-3 (of about 0.05). */
static const tolerance BF16_TOL = {1e-3, 1e-2, 1e-2};

/* Embeds the reference sentences (eagerly, or through f) and asserts each
 * is within t of sentence-transformers'. */
static void check_embeddings_within(const bert_model *m, bert_compiled *f, const ref *r, tolerance t) {
    const js_doc *d = r->doc;
    int n = count(d, r->sentences), h = m->cfg.hidden, i = 0;
    const char *texts[16];
    ck_assert(n >= 3 && n <= 16);
    if (RUNNING_ON_VALGRIND) n = 3;
    for (int c = js_first(d, r->sentences); i < n; c = js_next(d, c)) texts[i++] = js_str(d, js_get(d, c, "text"));
    em_tensor *ids, *mask, *out = NULL;
    ml_error e = {""};
    ck_assert_msg(bert_tokenize(m, n, texts, 8, &ids, &mask, NULL, &e) == ML_OK, "%s", e.msg);
    em_tensor *in[2] = {ids, mask};
    em_status s = f ? bert_compiled_call(f, m, in, &out) : bert_forward((void *)m, in, NULL, &out);
    ck_assert_msg(s == EM_OK && out, "%s", em_last_error());
    ck_assert_int_eq(em_size(out, 0), n);
    ck_assert_int_eq(em_size(out, 1), h);
    ck_assert_int_eq(em_device_of(ids).type, m->device.type);
    ck_assert_int_eq(em_device_of(out).type, m->device.type);
    double *got = tu_values(out);
    i = 0;
    for (int c = js_first(d, r->sentences); i < n; c = js_next(d, c), i++) {
        int want = js_get(d, c, "embedding");
        ck_assert_int_eq(count(d, want), h);
        double dot = 0, ng = 0, nw = 0, w, maxdiff = 0;
        int k = 0;
        for (int x = js_first(d, want); x >= 0; x = js_next(d, x), k++) {
            ck_assert(js_num(d, x, &w));
            double g = got[(size_t)i * h + k];
            dot += g * w, ng += g * g, nw += w * w;
            maxdiff = fmax(maxdiff, fabs(g - w));
        }
        double dist = 1 - dot / sqrt(ng * nw);
        ck_assert_msg(dist <= t.dist, "%s on %s: sentence %d (\"%.30s\"): cosine distance %.3g",
                      f ? "compiled" : "eager", m->device.type == EM_CUDA ? "cuda" : "cpu", i, texts[i], dist);
        ck_assert_msg(fabs(sqrt(ng) - 1) < t.norm, "sentence %d: norm %g, not 1", i, sqrt(ng));
        /* cosine distance is second order in the error (1 - cos ~ |e|^2 / 2):
         * a per-component bound catches what it would let through, such as
         * gelu's tanh approximation in place of erf */
        ck_assert_msg(maxdiff <= t.component, "%s: sentence %d: a component differs by %.3g",
                      f ? "compiled" : "eager", i, maxdiff);
    }
    free(got);
    ck_assert_int_eq(em_dtype_of(out), m->dtype);
}

static void check_embeddings(const bert_model *m, bert_compiled *f, const ref *r) {
    check_embeddings_within(m, f, r, m->dtype == EM_F32 ? F32_TOL : BF16_TOL);
}

START_TEST(test_eager_matches_reference) {
    ref r = load_ref();
    bert_model m;
    ml_error e = {""};
    ck_assert_msg(bert_load(&m, model_dir(), &e) == ML_OK, "%s", e.msg);
    ck_assert_int_eq(m.cfg.layers, 6);
    ck_assert_int_eq(m.cfg.hidden, 384);
    ck_assert_int_eq(m.cfg.max_seq, 256);
    check_embeddings(&m, NULL, &r);
    em_scope_end(); /* the outputs go before the weights */
    em_scope_begin();
    bert_free(&m);
    js_free(r.doc);
}
END_TEST

/* Compiles m's stages, checks the traced and the compiled embeddings and
 * the counters, then the same eager code in lazy mode (EMBER_JIT=1's path:
 * recorded, cut into graphs, compiled); frees m and r.  cpu: also that the
 * six layers share their kernels (the cuda backend keeps no such count). */
static void check_compiled_and_lazy(bert_model *m, ref *r, bool cpu) {
    ml_error e = {""};
    bert_compiled f;
    ck_assert_msg(bert_compile(m, &f, &e) == ML_OK, "%s", e.msg);
    check_embeddings(m, &f, r); /* traced (eager) */
    check_embeddings(m, &f, r); /* the compiled graphs */
    em_compile_stats st;
    bert_compiled_stats(&f, &st);
    ck_assert_int_eq(st.traces, 8); /* embeddings, 6 layers, pooling: once each */
    ck_assert_int_eq(st.hits, 8);
    ck_assert_int_eq(st.eager, 0);
    ck_assert(!st.broken);
    ck_assert_int_gt(st.kernels, 0);
    if (cpu) { /* the six layers' kernels are the same code: compiled once, then loaded */
        ck_assert_int_gt(st.kernels_loaded, 0);
        ck_assert_int_lt(st.kernels_compiled, st.kernels_loaded);
    }
    ck_assert_int_eq(em_lazy_begin(), EM_OK);
    check_embeddings(m, NULL, r);
    ck_assert_int_eq(em_lazy_end(), EM_OK);
    em_lazy_stats ls;
    ck_assert_int_eq(em_lazy_get_stats(&ls), EM_OK);
    ck_assert_int_gt(ls.ops_deferred, 100);
    ck_assert_int_gt(ls.graphs_compiled, 0);
    em_scope_end();
    em_scope_begin();
    bert_compiled_free(&f);
    bert_free(m);
    js_free(r->doc);
}

START_TEST(test_compiled_matches_reference) {
    ref r = load_ref();
    bert_model m;
    ml_error e = {""};
    ck_assert_msg(bert_load(&m, model_dir(), &e) == ML_OK, "%s", e.msg);
    check_compiled_and_lazy(&m, &r, true);
}
END_TEST

/* The same sentences on cuda:0: weights copied there at load, ids and
 * mask made there, eager, compiled (traced, then from the graphs) and
 * lazy; every embedding within 1e-4 cosine distance (and 1e-5 per
 * component) of sentence-transformers'.  Only added to the suite when a
 * GPU is found. */
START_TEST(test_cuda_matches_reference) {
    ref r = load_ref();
    bert_model m;
    ml_error e = {""};
    ck_assert_msg(bert_load_on(&m, model_dir(), em_cuda(0), &e) == ML_OK, "%s", e.msg);
    ck_assert_int_eq(em_device_of(m.word).type, EM_CUDA);
    ck_assert_int_eq(em_device_of(m.layer[5].w2).type, EM_CUDA);
    check_embeddings(&m, NULL, &r);
    check_compiled_and_lazy(&m, &r, false);
}
END_TEST

/* The model converted to bf16 (bert_to_dtype): eager and compiled, within
 * BF16_TOL of the f32 reference, on the CPU and, with a GPU, on cuda:0. */
static void check_bf16_on(em_device dev) {
    ref r = load_ref();
    bert_model m;
    ml_error e = {""};
    ck_assert_msg(bert_load_on(&m, model_dir(), dev, &e) == ML_OK, "%s", e.msg);
    ck_assert_msg(bert_to_dtype(&m, EM_BF16, &e) == ML_OK, "%s", e.msg);
    ck_assert_int_eq(em_dtype_of(m.layer[3].wqkv), EM_BF16);
    ck_assert_int_eq(bert_to_dtype(&m, EM_I32, &e), ML_ERR_ARG);
    check_embeddings(&m, NULL, &r);
    bert_compiled f;
    ck_assert_msg(bert_compile(&m, &f, &e) == ML_OK, "%s", e.msg);
    check_embeddings(&m, &f, &r);
    check_embeddings(&m, &f, &r);
    em_scope_end();
    em_scope_begin();
    bert_compiled_free(&f);
    bert_free(&m);
    js_free(r.doc);
}

START_TEST(test_bf16_matches_reference) { check_bf16_on(em_cpu()); }
END_TEST

START_TEST(test_cuda_bf16_matches_reference) { check_bf16_on(em_cuda(0)); }
END_TEST

/* ---- devices ---- */

START_TEST(test_parse_device) {
    em_device d = em_cpu();
    ck_assert(bert_parse_device("cuda", &d) && d.type == EM_CUDA && d.index == 0);
    ck_assert(bert_parse_device("cpu", &d) && d.type == EM_CPU);
    ck_assert(bert_parse_device("cuda:3", &d) && d.type == EM_CUDA && d.index == 3);
    const char *bad[] = {"gpu", "", "cuda:", "cuda:x", "cuda:-1", "cuda3", "cuda:1x", "CPU", "cuda:99999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        d = em_cpu();
        ck_assert_msg(!bert_parse_device(bad[i], &d), "'%s' parsed", bad[i]);
        ck_assert_int_eq(d.type, EM_CPU); /* left alone */
    }
    ck_assert(!bert_parse_device(NULL, &d));
}
END_TEST

/* A device that is not there (no driver here; an index past the count on
 * a GPU machine) is refused before any file is read, with a message. */
START_TEST(test_model_load_bad_device) {
    bert_model m;
    ml_error e = {""};
    ck_assert_int_eq(bert_load_on(&m, "/nonexistent/minilm", em_cuda(1000), &e), ML_ERR_ARG);
    ck_assert_msg(strstr(e.msg, "cuda:1000 is not available: ") && strlen(e.msg) > 30, "%s", e.msg);
    ck_assert_ptr_null(m.layer); /* nothing left to free */
}
END_TEST

/* ---- broken files ---- */

static char tmpdir[64];

static void make_tmpdir(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ember-minilm-XXXXXX");
    ck_assert(mkdtemp(tmpdir));
}

static const char *tmp_path(const char *name) {
    static char p[128];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    return p;
}

static void write_file(const char *name, const void *data, size_t n) {
    FILE *f = fopen(tmp_path(name), "wb");
    ck_assert(f);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* A safetensors file: header length, header, then ndata bytes of data. */
static void write_st(const char *name, const char *header, size_t ndata) {
    size_t hn = strlen(header);
    unsigned char *buf = calloc(1, 8 + hn + ndata);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hn >> (8 * i));
    memcpy(buf + 8, header, hn);
    write_file(name, buf, 8 + hn + ndata);
    free(buf);
}

static void remove_tmpdir(const char *const *names, size_t n) {
    for (size_t i = 0; i < n; i++) unlink(tmp_path(names[i]));
    rmdir(tmpdir);
}

#define GOOD_HEADER "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}," \
                    "\"h\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[16,20]}}"

START_TEST(test_safetensors_reads_tensors) {
    make_tmpdir();
    write_st("good.safetensors", GOOD_HEADER, 20);
    st_file f;
    ml_error e = {""};
    ck_assert_msg(st_open(&f, tmp_path("good.safetensors"), &e) == ML_OK, "%s", e.msg);
    ck_assert_int_eq(f.count, 2);
    em_tensor *w = st_load_f32(&f, "w", 2, TU_SIZES(2, 2), &e);
    tu_check_close(w, ((double[]){0, 0, 0, 0}), 2, TU_SIZES(2, 2), 0, 0);
    em_tensor *h = st_load_f32(&f, "h", -1, NULL, &e);
    ck_assert_msg(h && em_dtype_of(h) == EM_F32, "%s", e.msg);
    em_release(w);
    em_release(h);
    ck_assert(!st_load_f32(&f, "missing", -1, NULL, &e));
    ck_assert(strstr(e.msg, "missing"));
    ck_assert(!st_load_f32(&f, "w", 1, TU_SIZES(4), &e)); /* wrong shape */
    st_close(&f);
    remove_tmpdir((const char *[]){"good.safetensors"}, 1);
}
END_TEST

START_TEST(test_safetensors_rejects_broken_files) {
    make_tmpdir();
    static const struct { const char *header; size_t ndata; const char *why; } bad[] = {
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 8, "offsets past the end"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 16, "size mismatch"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[8,4]}}", 16, "reversed offsets"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-2],\"data_offsets\":[0,16]}}", 16, "negative dim"},
        {"{\"w\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,2]}}", 16, "unknown dtype"},
        {"{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 16, "no dtype"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,16]}}", 16, "overflow"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 16, "too many dims"},
        {"[1,2,3]", 0, "not an object"},
        {"{\"w\":", 0, "truncated JSON"},
        {"{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 4, "trailing bytes"},
    };
    ml_error e = {""};
    st_file f;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_st("bad.safetensors", bad[i].header, bad[i].ndata);
        e.msg[0] = '\0';
        ck_assert_msg(st_open(&f, tmp_path("bad.safetensors"), &e) == ML_ERR_FORMAT, "%s accepted", bad[i].why);
        ck_assert_msg(e.msg[0], "%s: no message", bad[i].why);
    }
    /* too short for the length prefix; a length past the end of the file */
    write_file("bad.safetensors", "\x10\0\0", 3);
    ck_assert_int_eq(st_open(&f, tmp_path("bad.safetensors"), &e), ML_ERR_FORMAT);
    write_file("bad.safetensors", "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10);
    ck_assert_int_eq(st_open(&f, tmp_path("bad.safetensors"), &e), ML_ERR_FORMAT);
    ck_assert(strstr(e.msg, "header length"));
    ck_assert_int_eq(st_open(&f, tmp_path("absent.safetensors"), &e), ML_ERR_IO);
    ck_assert(strstr(e.msg, "absent.safetensors"));
    remove_tmpdir((const char *[]){"bad.safetensors"}, 1);
}
END_TEST

/* Every prefix of a valid file, and of a valid header, is refused cleanly:
 * the reader never reads past what it was given (valgrind checks that). */
START_TEST(test_safetensors_truncated_everywhere) {
    make_tmpdir();
    write_st("good.safetensors", GOOD_HEADER, 20);
    FILE *fp = fopen(tmp_path("good.safetensors"), "rb");
    unsigned char buf[512];
    size_t n = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    ml_error e;
    st_file f;
    for (size_t k = 0; k < n; k++) {
        write_file("cut.safetensors", buf, k);
        ck_assert_msg(st_open(&f, tmp_path("cut.safetensors"), &e) != ML_OK, "a %zu-byte prefix was accepted", k);
    }
    const char *h = GOOD_HEADER;
    for (size_t k = 0; k < strlen(h); k++) {
        char *copy = malloc(k ? k : 1); /* exactly k bytes: no terminator to lean on */
        memcpy(copy, h, k);
        js_doc *d = js_parse(copy, k, &e);
        ck_assert_msg(!d, "a %zu-byte prefix of the header parsed", k);
        free(copy);
    }
    remove_tmpdir((const char *[]){"good.safetensors", "cut.safetensors"}, 2);
}
END_TEST

START_TEST(test_json_parses_escapes_and_limits) {
    ml_error e = {""};
    const char *s = "{\"a\\u00e9\\n\":[1,-2.5e3,true,null,\"\\ud83d\\ude00\"], \"big\": 9223372036854775807}";
    js_doc *d = js_parse(s, strlen(s), &e);
    ck_assert_msg(d, "%s", e.msg);
    int a = js_first(d, 0);
    ck_assert_str_eq(js_key(d, a), "a\xc3\xa9\n");
    int x = js_first(d, a);
    int64_t i;
    double v;
    ck_assert(js_int(d, x, &i) && i == 1);
    x = js_next(d, x);
    ck_assert(!js_int(d, x, &i) && js_num(d, x, &v) && v == -2500);
    x = js_next(d, js_next(d, js_next(d, x)));
    ck_assert_str_eq(js_str(d, x), "\xf0\x9f\x98\x80");
    ck_assert(js_int(d, js_get(d, 0, "big"), &i) && i == INT64_MAX);
    js_free(d);
    char deep[200];
    memset(deep, '[', sizeof deep);
    ck_assert(!js_parse(deep, sizeof deep, &e));
    ck_assert(strstr(e.msg, "deep"));
    const char *bad[] = {"", "{", "{\"a\" 1}", "[1,]", "\"\\x\"", "\"\x01\"", "tru", "-", "[1 2]", "{1:2}"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        ck_assert_msg(!js_parse(bad[k], strlen(bad[k]), &e), "'%s' parsed", bad[k]);
}
END_TEST

/* bert_load on a missing folder, and on one whose weights are cut short. */
START_TEST(test_model_load_errors) {
    bert_model m;
    ml_error e = {""};
    ck_assert_int_eq(bert_load(&m, "/nonexistent/minilm", &e), ML_ERR_FORMAT);
    ck_assert(strstr(e.msg, "/nonexistent/minilm/config.json"));
    make_tmpdir();
    const char *cfg = "{\"hidden_size\":4,\"num_attention_heads\":2,\"num_hidden_layers\":1,"
                      "\"intermediate_size\":8,\"max_position_embeddings\":16,\"vocab_size\":4,"
                      "\"type_vocab_size\":2,\"layer_norm_eps\":1e-12,\"hidden_act\":\"gelu\"}";
    write_file("config.json", cfg, strlen(cfg));
    write_file("vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n", 24);
    ck_assert_int_eq(bert_load(&m, tmpdir, &e), ML_ERR_IO); /* no model.safetensors */
    ck_assert(strstr(e.msg, "model.safetensors"));
    write_st("model.safetensors", "{\"embeddings.word_embeddings.weight\":{\"dtype\":\"F32\",\"shape\":[4,4],"
                                  "\"data_offsets\":[0,64]}}", 64);
    ck_assert_int_eq(bert_load(&m, tmpdir, &e), ML_ERR_FORMAT); /* the other tensors are missing */
    ck_assert(strstr(e.msg, "embeddings.position_embeddings.weight"));
    write_file("model.safetensors", "\x08\0\0\0\0\0\0\0{\"a\":", 13);
    ck_assert_int_eq(bert_load(&m, tmpdir, &e), ML_ERR_FORMAT);
    write_file("vocab.txt", "[PAD]\n[UNK]\n", 12);
    ck_assert_int_eq(bert_load(&m, tmpdir, &e), ML_ERR_FORMAT); /* no [CLS] */
    write_file("config.json", "{\"hidden_size\":-4}", 18);
    ck_assert_int_eq(bert_load(&m, tmpdir, &e), ML_ERR_FORMAT);
    ck_assert(strstr(e.msg, "hidden_size"));
    remove_tmpdir((const char *[]){"config.json", "vocab.txt", "model.safetensors"}, 3);
}
END_TEST

/* The demo prints sentences cut at 60 characters: whole UTF-8 characters
 * are kept (issue 21, item 19: `%.60s` cut "é" and CJK characters in
 * half), and the count is of characters, not bytes. */
START_TEST(test_utf8_prefix_keeps_whole_characters) {
    bool more = true;
    ck_assert_uint_eq(mu_utf8_prefix("", 60, &more), 0);
    ck_assert(!more);
    ck_assert_uint_eq(mu_utf8_prefix("abc", 60, &more), 3);
    ck_assert(!more);
    ck_assert_uint_eq(mu_utf8_prefix("abc", 2, &more), 2);
    ck_assert(more);
    /* 59 ASCII bytes then "é" (2 bytes): 60 characters are 61 bytes */
    char s[128];
    memset(s, 'a', 59);
    strcpy(s + 59, "\xc3\xa9xyz");
    ck_assert_uint_eq(mu_utf8_prefix(s, 60, &more), 61);
    ck_assert(more);
    /* 30 CJK characters (3 bytes each) fit in 60 characters: all 90 bytes */
    char cjk[128] = "";
    for (int i = 0; i < 30; i++) strcat(cjk, "\xe4\xb8\xad");
    ck_assert_uint_eq(mu_utf8_prefix(cjk, 60, &more), 90);
    ck_assert(!more);
    /* every prefix ends at a character boundary: never before a continuation byte */
    const char *mixed = "\xf0\x9f\x98\x80 caf\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87";
    for (size_t k = 0; k < 12; k++) {
        size_t n = mu_utf8_prefix(mixed, k, NULL);
        ck_assert_uint_le(n, strlen(mixed));
        ck_assert((mixed[n] & 0xC0) != 0x80);
    }
    ck_assert_uint_eq(mu_utf8_prefix(mixed, 1, NULL), 4); /* the emoji whole */
    /* a malformed byte counts as one character and is not run past */
    ck_assert_uint_eq(mu_utf8_prefix("\xff\xfe" "ab", 3, &more), 3);
    ck_assert(more);
    /* a sequence truncated by the end of the string */
    ck_assert_uint_eq(mu_utf8_prefix("a\xe4\xb8", 5, &more), 3);
    ck_assert(!more);
}
END_TEST

static Suite *files_suite(void) {
    const tu_test tests[] = {
        {"safetensors_reads_tensors", test_safetensors_reads_tensors},
        {"safetensors_rejects_broken_files", test_safetensors_rejects_broken_files},
        {"safetensors_truncated_everywhere", test_safetensors_truncated_everywhere},
        {"json_parses_escapes_and_limits", test_json_parses_escapes_and_limits},
        {"model_load_errors", test_model_load_errors},
        {"parse_device", test_parse_device},
        {"model_load_bad_device", test_model_load_bad_device},
        {"utf8_prefix_keeps_whole_characters", test_utf8_prefix_keeps_whole_characters},
    };
    return tu_suite("minilm_files", tests, sizeof tests / sizeof tests[0], 60);
}

static Suite *model_suite(bool gpu) {
    const tu_test tests[] = {
        {"tokenizer_matches_reference", test_tokenizer_matches_reference},
        {"eager_matches_reference", test_eager_matches_reference},
        {"compiled_matches_reference", test_compiled_matches_reference},
        {"bf16_matches_reference", test_bf16_matches_reference},
        {"cuda_matches_reference", test_cuda_matches_reference}, /* last two: GPU only */
        {"cuda_bf16_matches_reference", test_cuda_bf16_matches_reference},
    };
    size_t n = sizeof tests / sizeof tests[0];
    return tu_suite("minilm_model", tests, gpu ? n : n - 2, 600);
}

int main(void) {
    char why[512] = "";
    bool gpu = tu_probe_gpu(why, sizeof why); /* first: before anything here touches CUDA */
    int rc = tu_run(files_suite());
    if (!have_weights()) {
        printf("SKIP: no all-MiniLM-L6-v2 weights in %s (run tools/fetch-minilm, or set EMBER_MODEL_DIR); "
               "the file-format tests ran\n", model_dir());
        return rc == EXIT_SUCCESS ? 77 : rc;
    }
    if (!gpu) printf("SKIP cuda_matches_reference: no CUDA device: %s\n", why[0] ? why : "(unknown)");
    int rc2 = tu_run(model_suite(gpu));
    return rc == EXIT_SUCCESS ? rc2 : rc;
}
