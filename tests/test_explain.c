/* test_explain.c - why a cache lookup missed (issue 19, item 4): keys built
 * from named fields are the keys a bare hasher gives; manifests round-trip;
 * kc_explain names the nearest entry's differing fields (a target word, a
 * graph line, a version), and copes with an empty cache and corrupt
 * manifests; EMBER_LOG=cache explains a real miss; ember-cache explain says
 * what a warmup list lacks, compiling and writing nothing. */
#include "testutil.h"

#include "cache.h"
#include "cpu_gccjit.h"
#include "jit.h"
#include "plan.h"

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define tool tu_tool

/* ---- helpers ---- */

typedef struct dirs {
    char root[64];
    char cache[128]; /* a cache directory */
    char list[128];  /* a warmup list */
    char log[128];   /* an EMBER_LOG_FILE */
} dirs;

static void make_dirs(dirs *d) {
    snprintf(d->root, sizeof d->root, "/tmp/ember-explain-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(d->root));
    snprintf(d->cache, sizeof d->cache, "%s/cache", d->root);
    snprintf(d->list, sizeof d->list, "%s/graphs.txt", d->root);
    snprintf(d->log, sizeof d->log, "%s/log.txt", d->root);
}

static void remove_dirs(const dirs *d) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", d->root);
    ck_assert_int_eq(system(cmd), 0);
}

static const char GRAPH_8[] = "graph(%x: f32[4,8]{8,1}) {\n"
                              "  %1 = exp(%x) : f32[4,8]{8,1}\n"
                              "  %2 = add(%1, %x) : f32[4,8]{8,1}\n"
                              "  return (%2)\n"
                              "}\n";

/* A plan-like manifest: its fields as jit_graph_key names them. */
static void plan_manifest(kc_manifest *m, uint64_t version, const char *target, const char *graph) {
    kc_fields f;
    kc_fields_begin(&f, m);
    kc_fields_str(&f, "what", "ember graph plan");
    kc_fields_u64(&f, "plan_format_version", version);
    kc_fields_u64(&f, "schedule_version", 3);
    kc_fields_str(&f, "backend", "cpu");
    kc_fields_str(&f, "target", target);
    kc_fields_str(&f, "graph", graph);
    kc_fields_digest(&f);
    ck_assert(!m->failed);
}

static const char TARGET_V4[] = "libgccjit 13.2.0 codegen 2 -march=x86-64-v4 -O3 -fno-math-errno";
static const char TARGET_V3[] = "libgccjit 13.2.0 codegen 2 -march=x86-64-v3 -O3 -fno-math-errno";

/* Stores m's manifest and a plan artifact under its key. */
static void put_entry(kc_cache *c, const kc_manifest *m) {
    ck_assert_int_eq(kc_put(c, &m->key, "plan", "plan bytes", 10), EM_OK);
    ck_assert_int_eq(kc_put_manifest(c, m, "plan"), EM_OK);
}

/* kc_explain of want for kind "plan" (the caller frees). */
static char *explain(kc_cache *c, const kc_manifest *want) {
    char *s = kc_explain(c, want, "plan");
    ck_assert_ptr_nonnull(s);
    return s;
}

#define assert_has(text, needle) ck_assert_msg(strstr((text), (needle)), "no '%s' in: %s", (needle), (text))

/* A small kernel: group 0 of exp(x) + x. */
static k_kernel *small_kernel(tr_graph **g, sc_schedule **s) {
    *g = tr_parse(GRAPH_8, NULL, 0);
    ck_assert_ptr_nonnull(*g);
    *s = sc_build(*g);
    ck_assert_ptr_nonnull(*s);
    int bufs[16], nbufs, nouts;
    k_kernel *k = sc_lower(*s, 0, bufs, &nbufs, &nouts);
    ck_assert_ptr_nonnull(k);
    return k;
}

static char *kernel_text(const k_kernel *k) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(kir_print(k, f), EM_OK);
    fclose(f);
    return text;
}

/* ---- keys ---- */

START_TEST(fields_give_the_keys_a_bare_hasher_gives) {
    kc_manifest m = {0};
    kc_fields f;
    kc_fields_begin(&f, &m);
    kc_fields_str(&f, "a", "ab");
    kc_fields_str(&f, "b", "");
    kc_fields_str(&f, "c", NULL);
    kc_fields_u64(&f, "d", 42);
    kc_key got = kc_fields_digest(&f);
    kc_hasher h;
    kc_hasher_reset(&h);
    kc_hasher_update_str(&h, "ab");
    kc_hasher_update_str(&h, "");
    kc_hasher_update_str(&h, NULL);
    kc_hasher_update_u64(&h, 42);
    kc_key want = kc_hasher_digest(&h);
    ck_assert(kc_key_equal(&got, &want));
    ck_assert(kc_key_equal(&m.key, &want));
    ck_assert_int_eq(m.n, 4);
    kc_key replay = kc_manifest_digest(&m);
    ck_assert(kc_key_equal(&replay, &want));
    /* without a manifest: the same key, nothing recorded */
    kc_fields_begin(&f, NULL);
    kc_fields_str(&f, "a", "ab");
    kc_fields_str(&f, "b", "");
    kc_fields_str(&f, "c", NULL);
    kc_fields_u64(&f, "d", 42);
    got = kc_fields_digest(&f);
    ck_assert(kc_key_equal(&got, &want));
    kc_manifest_clear(&m);
}
END_TEST

START_TEST(the_plan_and_kernel_keys_are_the_keys_of_before) {
    tr_graph *g;
    sc_schedule *s;
    k_kernel *k = small_kernel(&g, &s);
    char *gtext = tr_to_text(g), *ktext = kernel_text(k);
    /* the plan key as plan.c computed it before manifests */
    kc_hasher h;
    kc_hasher_reset(&h);
    kc_hasher_update_str(&h, "ember graph plan");
    kc_hasher_update_u64(&h, 3); /* PLAN_VERSION */
    kc_hasher_update_u64(&h, SC_VERSION);
    kc_hasher_update_str(&h, "cpu");
    kc_hasher_update_str(&h, "some target");
    kc_hasher_update_str(&h, gtext);
    kc_key old = kc_hasher_digest(&h), now;
    kc_manifest m = {0};
    ck_assert(jit_graph_key(g, "cpu", "some target", &now, &m));
    ck_assert(kc_key_equal(&old, &now));
    ck_assert_str_eq(kc_manifest_field(&m, "graph")->s, gtext);
    ck_assert_int_eq(kc_manifest_field(&m, "plan_format_version")->u, 3);
    ck_assert(jit_graph_key(g, "cpu", "some target", &now, NULL));
    ck_assert(kc_key_equal(&old, &now));
    /* the generic kernel key (CUDA's) */
    kc_hasher_reset(&h);
    kc_hasher_update_str(&h, "ember kernel");
    kc_hasher_update_str(&h, "cuda");
    kc_hasher_update_str(&h, "sm_90 cuda-emit-3");
    kc_hasher_update_str(&h, ktext);
    old = kc_hasher_digest(&h);
    ck_assert(jit_kernel_key("cuda", "sm_90 cuda-emit-3", k, &now, &m));
    ck_assert(kc_key_equal(&old, &now));
    ck_assert_str_eq(kc_manifest_field(&m, "kernel_ir")->s, ktext);
    /* the CPU kernel key */
    kc_hasher_reset(&h);
    kc_hasher_update_str(&h, "ember cpu kernel");
    kc_hasher_update_str(&h, jit_cpu_target());
    kc_hasher_update_str(&h, ktext);
    old = kc_hasher_digest(&h);
    ck_assert(jit_cpu_kernel_key(k, &now, &m));
    ck_assert(kc_key_equal(&old, &now));
    ck_assert_str_eq(kc_manifest_field(&m, "target")->s, jit_cpu_target());
    ck_assert(jit_cpu_kernel_key(k, &now, NULL));
    ck_assert(kc_key_equal(&old, &now));
    kc_manifest_clear(&m);
    free(ktext);
    em_free(gtext);
    kir_free(k);
    sc_free(s);
    tr_graph_free(g);
}
END_TEST

START_TEST(manifest_text_round_trips_and_rejects_the_rest) {
    kc_manifest m = {0}, back;
    plan_manifest(&m, 3, TARGET_V4, GRAPH_8);
    size_t n, n2;
    char *text = kc_manifest_format(&m, &n);
    ck_assert_ptr_nonnull(text);
    ck_assert(!strncmp(text, "ember-manifest 1\nkey-format 1\nkey ", 34));
    assert_has(text, "\nfields 6\nstr what 16\nember graph plan\nu64 plan_format_version 3\n");
    ck_assert_int_eq(kc_manifest_parse(text, n, &back), EM_OK);
    ck_assert_int_eq(back.n, 6);
    ck_assert(kc_key_equal(&back.key, &m.key));
    kc_key k = kc_manifest_digest(&back);
    ck_assert(kc_key_equal(&k, &m.key));
    char *again = kc_manifest_format(&back, &n2);
    ck_assert_int_eq(n, n2);
    ck_assert(!memcmp(text, again, n));
    kc_manifest_clear(&back);
    em_free(again);
    /* a NULL string and an empty one are distinct fields */
    kc_fields f;
    kc_fields_begin(&f, &m);
    kc_fields_str(&f, "x", NULL);
    kc_fields_str(&f, "y", "");
    kc_fields_digest(&f);
    em_free(text);
    text = kc_manifest_format(&m, &n);
    assert_has(text, "fields 2\nnul x\nstr y 0\n\n");
    ck_assert_int_eq(kc_manifest_parse(text, n, &back), EM_OK);
    ck_assert_int_eq(back.fields[0].type, KC_FIELD_NULL);
    ck_assert_int_eq(back.fields[1].type, KC_FIELD_STR);
    kc_manifest_clear(&back);
    /* truncations, and a byte more or less anywhere in a length */
    for (size_t cut = 0; cut < n; cut++)
        ck_assert_msg(kc_manifest_parse(text, cut, &back) != EM_OK, "accepted a cut at %zu", cut);
    const char *bad[] = {
        "ember-manifest 2\nkey-format 1\nkey 00000000000000000000000000000000\nfields 0\n",
        "ember-manifest 1\nkey-format 1\nkey 0000000000000000000000000000000\nfields 0\n",
        "ember-manifest 1\nkey-format 1\nkey 00000000000000000000000000000000\nfields 1\n",
        "ember-manifest 1\nkey-format 1\nkey 00000000000000000000000000000000\nfields 1\nstr a 2\nabc\n",
        "ember-manifest 1\nkey-format 1\nkey 00000000000000000000000000000000\nfields 1\nstr A 1\na\n",
        "ember-manifest 1\nkey-format 1\nkey 00000000000000000000000000000000\nfields 2\nu64 a 1\nu64 a 2\n",
        "ember-manifest 1\nkey-format 1\nkey 00000000000000000000000000000000\nfields 1\nu64 a -1\n",
        "ember-manifest 1\nkey-format 1\nkey 00000000000000000000000000000000\nfields 0\nextra",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(kc_manifest_parse(bad[i], strlen(bad[i]), &back) == EM_ERR_ARG, "accepted %zu", i);
    em_clear_error();
    em_free(text);
    kc_manifest_clear(&m);
}
END_TEST

/* ---- explain ---- */

START_TEST(explain_names_a_changed_target_option) {
    dirs d;
    make_dirs(&d);
    kc_cache *c = kc_open(d.cache, 0);
    kc_manifest cached = {0}, want = {0};
    plan_manifest(&cached, 3, TARGET_V4, GRAPH_8);
    put_entry(c, &cached);
    plan_manifest(&want, 3, TARGET_V3, GRAPH_8);
    char *s = explain(c, &want), hex[KC_KEY_HEX_SIZE], line[128];
    kc_key_hex(&cached.key, hex);
    snprintf(line, sizeof line, "nearest entry %s differs in target, option -march: "
             "cached 'x86-64-v4', now 'x86-64-v3'", hex);
    ck_assert_str_eq(s, line);
    em_free(s);
    /* the compiler's version: named by the word before it */
    kc_manifest_clear(&want);
    plan_manifest(&want, 3, "libgccjit 14.1.0 codegen 2 -march=x86-64-v4 -O3 -fno-math-errno", GRAPH_8);
    s = explain(c, &want);
    assert_has(s, "differs in target, libgccjit: cached '13.2.0', now '14.1.0'");
    em_free(s);
    /* a CUDA target: the CUDA version, and the architecture (the first word) */
    kc_manifest_clear(&cached);
    plan_manifest(&cached, 3, "sm_90 cuda-emit-3 libnvrtc.so.13 from CUDA 13000 --std=c++17", GRAPH_8);
    put_entry(c, &cached);
    kc_manifest_clear(&want);
    plan_manifest(&want, 3, "sm_90 cuda-emit-3 libnvrtc.so.13 from CUDA 12080 --std=c++17", GRAPH_8);
    s = explain(c, &want);
    assert_has(s, "differs in target, CUDA: cached '13000', now '12080'");
    em_free(s);
    kc_manifest_clear(&want);
    plan_manifest(&want, 3, "sm_80 cuda-emit-3 libnvrtc.so.13 from CUDA 13000 --std=c++17", GRAPH_8);
    s = explain(c, &want);
    assert_has(s, "differs in target, word 1: cached 'sm_90', now 'sm_80'");
    em_free(s);
    kc_manifest_clear(&want);
    kc_manifest_clear(&cached);
    kc_close(c);
    remove_dirs(&d);
}
END_TEST

START_TEST(explain_names_the_first_differing_line_of_the_graph) {
    dirs d;
    make_dirs(&d);
    kc_cache *c = kc_open(d.cache, 0);
    kc_manifest cached = {0}, far = {0}, want = {0};
    plan_manifest(&cached, 3, TARGET_V4, GRAPH_8);
    put_entry(c, &cached);
    /* a farther one: other target and other graph */
    plan_manifest(&far, 3, TARGET_V3, "graph() {\n  return ()\n}\n");
    put_entry(c, &far);
    const char *g9 = "graph(%x: f32[4,8]{8,1}) {\n"
                     "  %1 = exp(%x) : f32[4,8]{8,1}\n"
                     "  %2 = add(%1, %x) : f32[4,9]{9,1}\n"
                     "  return (%2)\n"
                     "}\n";
    plan_manifest(&want, 3, TARGET_V4, g9);
    char *s = explain(c, &want), hex[KC_KEY_HEX_SIZE];
    kc_key_hex(&cached.key, hex);
    assert_has(s, hex);
    assert_has(s, "(of 2)");
    assert_has(s, "differs in graph at line 3: cached '  %2 = add(%1, %x) : f32[4,8]{8,1}', "
                  "now '  %2 = add(%1, %x) : f32[4,9]{9,1}'");
    ck_assert_ptr_null(strstr(s, "target"));
    em_free(s);
    /* a graph with a line more */
    kc_manifest_clear(&want);
    plan_manifest(&want, 3, TARGET_V4, "graph(%x: f32[4,8]{8,1}) {\n"
                                       "  %1 = exp(%x) : f32[4,8]{8,1}\n"
                                       "  %2 = add(%1, %x) : f32[4,8]{8,1}\n"
                                       "  return (%2)\n"
                                       "}\n"
                                       "extra\n");
    s = explain(c, &want);
    assert_has(s, "differs in graph at line 6: cached (no line 6), now 'extra'");
    em_free(s);
    kc_manifest_clear(&want);
    kc_manifest_clear(&far);
    kc_manifest_clear(&cached);
    kc_close(c);
    remove_dirs(&d);
}
END_TEST

START_TEST(explain_names_a_changed_version_and_the_most_recent_of_a_tie) {
    dirs d;
    make_dirs(&d);
    kc_cache *c = kc_open(d.cache, 0);
    kc_manifest a = {0}, b = {0}, want = {0};
    /* two entries one field away each: the more recently used is nearest */
    plan_manifest(&a, 2, TARGET_V4, GRAPH_8);
    plan_manifest(&b, 3, TARGET_V3, GRAPH_8);
    put_entry(c, &a);
    put_entry(c, &b);
    char *meta = kc_store_path(kc_dir(c), &b.key, "why_plan", true);
    struct timespec old[2] = {{.tv_sec = 1000000}, {.tv_sec = 1000000}};
    ck_assert_int_eq(utimensat(AT_FDCWD, meta, old, 0), 0);
    plan_manifest(&want, 3, TARGET_V4, GRAPH_8);
    char *s = explain(c, &want), hex[KC_KEY_HEX_SIZE];
    kc_key_hex(&a.key, hex);
    assert_has(s, hex);
    assert_has(s, "differs in plan_format_version: cached 2, now 3");
    em_free(s);
    /* explaining is not a use: b's manifest keeps its old time */
    struct stat st;
    ck_assert_int_eq(stat(meta, &st), 0);
    ck_assert_int_eq(st.st_mtim.tv_sec, 1000000);
    em_free(meta);
    kc_manifest_clear(&want);
    kc_manifest_clear(&a);
    kc_manifest_clear(&b);
    kc_close(c);
    remove_dirs(&d);
}
END_TEST

START_TEST(explain_an_empty_cache_and_entries_without_manifests) {
    dirs d;
    make_dirs(&d);
    kc_cache *c = kc_open(d.cache, 0);
    kc_manifest want = {0};
    plan_manifest(&want, 3, TARGET_V4, GRAPH_8);
    char *s = explain(c, &want);
    ck_assert_str_eq(s, "no entry of this kind in the cache");
    em_free(s);
    kc_key other = want.key;
    other.bytes[0] ^= 1;
    ck_assert_int_eq(kc_put(c, &other, "plan", "x", 1), EM_OK);
    s = explain(c, &want);
    assert_has(s, "none of the 1 entries of this kind has a manifest");
    em_free(s);
    /* memory-only: nothing to search */
    kc_cache *mem = kc_open(NULL, KC_MEMORY_ONLY);
    s = explain(mem, &want);
    ck_assert_str_eq(s, "the cache has no directory to search");
    em_free(s);
    kc_close(mem);
    kc_manifest_clear(&want);
    kc_close(c);
    remove_dirs(&d);
}
END_TEST

START_TEST(corrupt_manifests_are_skipped) {
    dirs d;
    make_dirs(&d);
    kc_cache *c = kc_open(d.cache, 0);
    kc_manifest good = {0}, want = {0}, liar = {0};
    /* garbage, and a manifest filed under a key its fields do not hash to */
    kc_key k1 = {{1}}, k2 = {{2}};
    ck_assert_int_eq(kc_put(c, &k1, "why_plan", "garbage\n", 8), EM_OK);
    plan_manifest(&liar, 3, TARGET_V4, GRAPH_8);
    size_t n;
    char *text = kc_manifest_format(&liar, &n);
    ck_assert_int_eq(kc_put(c, &k2, "why_plan", text, n), EM_OK);
    em_free(text);
    plan_manifest(&want, 3, TARGET_V3, GRAPH_8);
    char *s = explain(c, &want);
    assert_has(s, "no usable entry of this kind: 2 manifests, all corrupt (skipped)");
    em_free(s);
    plan_manifest(&good, 2, TARGET_V3, GRAPH_8);
    put_entry(c, &good);
    s = explain(c, &want);
    assert_has(s, "differs in plan_format_version: cached 2, now 3");
    assert_has(s, "; 2 corrupt manifests skipped");
    em_free(s);
    kc_manifest_clear(&good);
    kc_manifest_clear(&liar);
    kc_manifest_clear(&want);
    kc_close(c);
    remove_dirs(&d);
}
END_TEST

START_TEST(explain_an_entry_whose_artifact_is_missing_or_corrupt) {
    dirs d;
    make_dirs(&d);
    kc_cache *c = kc_open(d.cache, 0);
    kc_manifest want = {0};
    plan_manifest(&want, 3, TARGET_V4, GRAPH_8);
    ck_assert_int_eq(kc_put_manifest(c, &want, "plan"), EM_OK);
    char *s = explain(c, &want);
    assert_has(s, "the entry's manifest is in the cache but its artifact is missing");
    em_free(s);
    ck_assert_int_eq(kc_put(c, &want.key, "plan", "plan bytes", 10), EM_OK);
    char *payload = kc_store_path(kc_dir(c), &want.key, "plan", false);
    FILE *f = fopen(payload, "w");
    ck_assert_ptr_nonnull(f);
    fputs("other bytes", f);
    fclose(f);
    s = explain(c, &want);
    assert_has(s, "the entry with this key is corrupt or refused: ");
    em_free(s);
    em_free(payload);
    kc_manifest_clear(&want);
    kc_close(c);
    remove_dirs(&d);
}
END_TEST

/* ---- allocation failures ---- */

typedef struct counting {
    int allocs, fail_at;
} counting;

static void *count_alloc(void *ud, size_t size, size_t align) {
    counting *c = ud;
    if (++c->allocs == c->fail_at) return NULL;
    void *p = NULL;
    return posix_memalign(&p, align < sizeof(void *) ? sizeof(void *) : align, size ? size : 1) ? NULL : p;
}

static void count_free(void *ud, void *p) {
    (void)ud;
    free(p);
}

/* Builds, formats, parses and explains want under the current allocator;
 * whatever fails comes back as a failure, never a crash or a leak
 * (valgrind); true when everything succeeded. */
static bool explain_everything(kc_cache *c) {
    kc_manifest want = {0}, back = {0};
    kc_fields f;
    kc_fields_begin(&f, &want);
    kc_fields_str(&f, "target", TARGET_V3);
    kc_fields_str(&f, "graph", GRAPH_8);
    kc_fields_u64(&f, "plan_format_version", 3);
    kc_fields_digest(&f);
    size_t n = 0;
    char *text = want.failed ? NULL : kc_manifest_format(&want, &n);
    bool parsed = text && kc_manifest_parse(text, n, &back) == EM_OK;
    char *why = want.failed ? NULL : kc_explain(c, &want, "plan");
    bool ok = !want.failed && text && parsed && why && strstr(why, "differs in target");
    ck_assert(!why || why[0]);
    em_free(why);
    em_free(text);
    kc_manifest_clear(&back);
    kc_manifest_clear(&want);
    em_clear_error();
    return ok;
}

START_TEST(allocation_failures_fail_cleanly) {
    dirs d;
    make_dirs(&d);
    kc_cache *c = kc_open(d.cache, 0);
    kc_manifest cached = {0};
    kc_fields f;
    kc_fields_begin(&f, &cached);
    kc_fields_str(&f, "target", TARGET_V4);
    kc_fields_str(&f, "graph", GRAPH_8);
    kc_fields_u64(&f, "plan_format_version", 3);
    kc_fields_digest(&f);
    put_entry(c, &cached);
    bool completed = false;
    for (int n = 1; n < 1000 && !completed; n++) {
        counting cnt = {0, n};
        em_allocator a = {count_alloc, count_free, &cnt};
        em_set_allocator(&a);
        bool ok = explain_everything(c);
        em_set_allocator(NULL);
        completed = cnt.fail_at > cnt.allocs;
        ck_assert_msg(!completed || ok, "no failure injected, yet it failed");
    }
    ck_assert(completed);
    kc_manifest_clear(&cached);
    kc_close(c);
    remove_dirs(&d);
}
END_TEST

/* ---- a real compile ---- */

static em_status exp_add_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx, (void)s;
    out[0] = em_add(em_exp(in[0]), in[0]);
    return out[0] ? EM_OK : em_last_status();
}

/* Compiles exp_add_fn and calls it twice on an [rows, cols] input (the
 * first call captures, the second runs the compiled graph). */
static void compile_and_call(int64_t rows, int64_t cols) {
    em_compile_options o = {.ninputs = 1, .noutputs = 1, .name = "exp_add", .dynamic = -1};
    em_compiled *f = em_compile(exp_add_fn, NULL, &o);
    if (!f) _exit(3);
    em_tensor *x = tu_random(5, 2, TU_SIZES(rows, cols), EM_F32, 1), *y;
    for (int i = 0; i < 2; i++)
        if (em_call(f, &x, NULL, &y) != EM_OK) _exit(4);
    em_compiled_free(f); /* with it, its cache object */
}

/* In a child with EMBER_CACHE_DIR=dir and, when given, EMBER_LOG=cache
 * into log and EMBER_RECORD=list: compile_and_call at each shape. */
static void run_child(const char *dir, const char *log, const char *list, const int64_t (*shapes)[2],
                      int nshapes) {
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setenv("EMBER_CACHE_DIR", dir, 1);
        unsetenv("EMBER_LOG");
        if (log) setenv("EMBER_LOG", "cache", 1), setenv("EMBER_LOG_FILE", log, 1);
        if (list) setenv("EMBER_RECORD", list, 1);
        for (int i = 0; i < nshapes; i++) compile_and_call(shapes[i][0], shapes[i][1]);
        _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
}

static char *read_all(const char *path) {
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    char *buf = calloc(1, 1 << 20);
    size_t n = fread(buf, 1, (1 << 20) - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

START_TEST(ember_log_cache_explains_a_miss_at_another_shape) {
    dirs d;
    make_dirs(&d);
    const int64_t shapes[2][2] = {{4, 8}, {4, 9}};
    run_child(d.cache, d.log, NULL, shapes, 2);
    char *log = read_all(d.log);
    /* the first compile: an empty cache */
    assert_has(log, "cache miss: graph plan (");
    assert_has(log, "): no entry of this kind in the cache");
    /* the second, in a fresh cache object: the plan at 4x8 is nearest */
    assert_has(log, "differs in graph at line 1: cached 'graph(%in0: f32[4, 8]{8, 1}) {', "
                    "now 'graph(%in0: f32[4, 9]{9, 1}) {'");
    assert_has(log, "cache miss: kernel ");
    assert_has(log, "differs in kernel_ir at line ");
    free(log);
    remove_dirs(&d);
}
END_TEST

/* ---- ember-cache explain ---- */

/* The cache directory's files, one path a line (sorted). */
static char *file_list(const char *dir) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "cd %s && find . -type f | sort", dir);
    FILE *p = popen(cmd, "r");
    ck_assert_ptr_nonnull(p);
    char *buf = calloc(1, 1 << 16);
    size_t n = fread(buf, 1, (1 << 16) - 1, p);
    buf[n] = '\0';
    pclose(p);
    return buf;
}

START_TEST(ember_cache_explain_says_what_a_warmup_list_lacks) {
    dirs d;
    make_dirs(&d);
    char rec[160], out[16384];
    snprintf(rec, sizeof rec, "%s/rec", d.root);
    const int64_t shapes[2][2] = {{4, 8}, {3, 5}};
    run_child(rec, NULL, d.list, shapes, 2);
    /* an empty cache: everything missing, nothing compiled or written */
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s clear", d.cache), 0);
    char *before = file_list(d.cache);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s explain %s", d.cache, d.list), 1);
    assert_has(out, "entry 1 exp_add (cpu, 1 kernel): plan miss, 0/1 kernels present");
    assert_has(out, "  graph plan (");
    assert_has(out, "): no entry of this kind in the cache");
    assert_has(out, "explain: 2 entries: 0 complete, 2 with something missing, 0 not looked up");
    char *after = file_list(d.cache);
    ck_assert_str_eq(before, after);
    free(before);
    free(after);
    /* after a warmup: all present */
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s warmup -j 1 %s", d.cache, d.list), 0);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s explain %s", d.cache, d.list), 0);
    assert_has(out, "entry 1 exp_add (cpu, 1 kernel): plan hit, 1/1 kernels present");
    assert_has(out, "entry 2 exp_add (cpu, 1 kernel): plan hit, 1/1 kernels present");
    ck_assert_int_eq(tool(out, sizeof out, "--json --dir %s explain %s", d.cache, d.list), 0);
    assert_has(out, "\"entry\":1,\"name\":\"exp_add\",\"backend\":\"cpu\",\"dynamic\":false,"
                    "\"plan\":\"hit\",\"kernels\":1,\"present\":1,\"misses\":[]}");
    assert_has(out, "\"complete\":2,\"missing\":0,\"errors\":0}");
    /* one kernel removed: named, exit 1, and still nothing written */
    kc_cache *c = kc_open(d.cache, 0);
    kc_entry_info *es;
    size_t n;
    ck_assert_int_eq(kc_list(c, &es, &n), EM_OK);
    char hex[KC_KEY_HEX_SIZE] = "";
    for (size_t i = 0; i < n && !hex[0]; i++)
        if (!strcmp(es[i].kind, "so")) {
            kc_key_hex(&es[i].key, hex);
            ck_assert_int_eq(kc_remove(c, &es[i].key, "so"), EM_OK);
        }
    em_free(es);
    kc_close(c);
    ck_assert(hex[0]);
    before = file_list(d.cache);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s explain %s", d.cache, d.list), 1);
    assert_has(out, "plan unusable, 0/1 kernels present");
    assert_has(out, "in the cache, but bad or some of its kernels are missing");
    char want[200];
    snprintf(want, sizeof want, " (%s): the entry's manifest is in the cache but its artifact is missing", hex);
    assert_has(out, want);
    assert_has(out, "explain: 2 entries: 1 complete, 1 with something missing, 0 not looked up");
    after = file_list(d.cache);
    ck_assert_str_eq(before, after);
    free(before);
    free(after);
    /* a record that cannot be looked up: exit 2, named */
    char cmd[400];
    snprintf(cmd, sizeof cmd, "sed 's/backend=cpu/backend=replay/' %s > %s/replay.txt", d.list, d.root);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s explain %s/replay.txt", d.cache, d.root), 2);
    assert_has(out, "entry 1 exp_add (replay): cannot be looked up: backend 'replay' has nothing "
                    "to compile ahead of time");
    assert_has(out, "explain: 2 entries: 0 complete, 0 with something missing, 2 not looked up");
    /* usage and unreadable lists */
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s explain", d.cache), 2);
    ck_assert_int_eq(tool(out, sizeof out, "--dir %s explain %s/none", d.cache, d.root), 2);
    remove_dirs(&d);
}
END_TEST

int main(void) {
    const tu_test tests[] = {
        {"fields_give_the_keys_a_bare_hasher_gives", fields_give_the_keys_a_bare_hasher_gives},
        {"the_plan_and_kernel_keys_are_the_keys_of_before", the_plan_and_kernel_keys_are_the_keys_of_before},
        {"manifest_text_round_trips_and_rejects_the_rest", manifest_text_round_trips_and_rejects_the_rest},
        {"explain_names_a_changed_target_option", explain_names_a_changed_target_option},
        {"explain_names_the_first_differing_line_of_the_graph", explain_names_the_first_differing_line_of_the_graph},
        {"explain_names_a_changed_version_and_the_most_recent_of_a_tie",
         explain_names_a_changed_version_and_the_most_recent_of_a_tie},
        {"explain_an_empty_cache_and_entries_without_manifests",
         explain_an_empty_cache_and_entries_without_manifests},
        {"corrupt_manifests_are_skipped", corrupt_manifests_are_skipped},
        {"explain_an_entry_whose_artifact_is_missing_or_corrupt",
         explain_an_entry_whose_artifact_is_missing_or_corrupt},
        {"allocation_failures_fail_cleanly", allocation_failures_fail_cleanly},
        {"ember_log_cache_explains_a_miss_at_another_shape", ember_log_cache_explains_a_miss_at_another_shape},
        {"ember_cache_explain_says_what_a_warmup_list_lacks", ember_cache_explain_says_what_a_warmup_list_lacks},
    };
    return tu_run(tu_suite("explain", tests, sizeof tests / sizeof tests[0], 120));
}
