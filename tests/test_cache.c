/* test_cache.c - the kernel cache (src/cache): key hashing, both tiers,
 * verification of every way an entry can go bad (each a miss, never wrong
 * bytes), the trust checks, memory-only modes, concurrent writers, pruning.
 *
 * Each test works in its own directory made by mkdtemp under /tmp and
 * removed at the end.  Entry paths are built here from the documented
 * layout (v1/<2 hex>/<32 hex>.<kind>[.meta]), not asked from the cache. */
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cache.h"
#include "eager.h"

/* ---- fixture: a temporary directory, a clean environment ---- */

static char tmp[64];       /* this test's directory */
static char cachedir[128]; /* tmp/cache: where the cache lives */

static void setup(void) {
    em_clear_error();
    unsetenv("EMBER_CACHE");
    unsetenv("EMBER_CACHE_DIR");
    unsetenv("EMBER_CACHE_MAX_SIZE");
    strcpy(tmp, "/tmp/ember-test-cache-XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmp));
    snprintf(cachedir, sizeof cachedir, "%s/cache", tmp);
    setenv("TMPDIR", tmp, 1); /* memory-only session directories land here */
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)ftw;
    if (flag == FTW_DP) chmod(path, 0700); /* undo a test's chmod 0500 */
    return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

static void teardown(void) {
    chmod(cachedir, 0700);
    ck_assert_int_eq(nftw(tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS), 0);
    unsetenv("TMPDIR");
    unsetenv("EMBER_CACHE");
    unsetenv("EMBER_CACHE_MAX_SIZE");
}

/* ---- helpers ---- */

/* Captures the warnings of a cache. */
typedef struct logbuf {
    char text[4096];
    int count;
} logbuf;

static void log_to(void *ud, const char *msg) {
    logbuf *l = ud;
    l->count++;
    size_t n = strlen(l->text);
    snprintf(l->text + n, sizeof l->text - n, "%s\n", msg);
}

static kc_cache *open_logged(const char *dir, logbuf *l) {
    memset(l, 0, sizeof *l);
    kc_options o = {.dir = dir, .log = log_to, .log_ud = l};
    kc_cache *c = kc_open_with(&o);
    ck_assert_msg(c != NULL, "kc_open: %s", em_last_error());
    return c;
}

static kc_key key_of(const char *material) {
    kc_hasher h;
    kc_hasher_reset(&h);
    kc_hasher_update_str(&h, material);
    return kc_hasher_digest(&h);
}

/* The documented path of an entry's payload (meta: its header). */
static const char *entry_path(const kc_key *k, const char *kind, bool meta) {
    static char buf[2][512];
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(k, hex);
    char *b = buf[meta];
    snprintf(b, sizeof buf[0], "%s/v1/%.2s/%s.%s%s", cachedir, hex, hex, kind,
             meta ? ".meta" : "");
    return b;
}

static kc_counters stats(kc_cache *c) {
    kc_counters s;
    ck_assert_int_eq(kc_stats(c, &s), EM_OK);
    return s;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "fopen %s: %s", path, strerror(errno));
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

/* A file's bytes (malloc'd) and length. */
static char *read_bytes(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "fopen %s: %s", path, strerror(errno));
    char *buf = malloc(1 << 20);
    *n = fread(buf, 1, (1 << 20) - 1, f);
    buf[*n] = '\0';
    fclose(f);
    return buf;
}

static bool exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

static int nfiles;
static int count_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)path;
    (void)st;
    (void)ftw;
    if (flag == FTW_F || flag == FTW_SL) nfiles++;
    return 0;
}
/* Files (not directories) under dir; 0 if dir does not exist. */
static int count_files(const char *dir) {
    nfiles = 0;
    if (exists(dir)) ck_assert_int_eq(nftw(dir, count_one, 16, FTW_PHYS), 0);
    return nfiles;
}

static void fill(char *buf, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) buf[i] = (char)((i * 131 + seed * 7919) >> 3);
}

/* Asserts a lookup hits with exactly want[0..n). */
static void expect_hit(kc_cache *c, const kc_key *k, const char *kind, const void *want,
                       size_t n) {
    void *data = (void *)1;
    size_t got = 12345;
    ck_assert_msg(kc_get(c, k, kind, &data, &got) == EM_OK, "kc_get: %s", em_last_error());
    ck_assert_msg(data != NULL, "expected a hit");
    ck_assert_uint_eq(got, n);
    ck_assert_int_eq(memcmp(data, want, n), 0);
    em_free(data);
}

static void expect_miss(kc_cache *c, const kc_key *k, const char *kind) {
    void *data = (void *)1;
    size_t got = 12345;
    ck_assert_msg(kc_get(c, k, kind, &data, &got) == EM_OK, "kc_get: %s", em_last_error());
    ck_assert_msg(data == NULL, "expected a miss, got %zu bytes", got);
    ck_assert_uint_eq(got, 0);
}

/* A fresh cache on cachedir (the next process, as far as the cache can
 * tell): its lookup of (k, kind) must miss and count one corrupt entry. */
static void expect_corrupt_miss(const kc_key *k, const char *kind) {
    logbuf l;
    kc_cache *c = open_logged(cachedir, &l);
    expect_miss(c, k, kind);
    char *path = (char *)1;
    ck_assert_int_eq(kc_get_file(c, k, kind, &path), EM_OK);
    ck_assert_ptr_null(path);
    kc_counters s = stats(c);
    ck_assert_uint_eq(s.corrupt, 2);
    ck_assert_uint_eq(s.misses, 2);
    ck_assert_uint_eq(s.hits_disk + s.hits_mem, 0);
    ck_assert_int_eq(l.count, 1); /* warned once per cache object */
    ck_assert_msg(strstr(l.text, "cache: ") == l.text, "%s", l.text);
    kc_close(c);
}

/* A cache on cachedir holding "payload" under key_of("entry"), kind "ptx". */
static const char payload[] = "// PTX for a fused kernel\n.version 8.0\n.target sm_90\n";

static kc_key make_entry(void) {
    kc_cache *c = kc_open(cachedir, 0);
    ck_assert(kc_on_disk(c));
    kc_key k = key_of("entry");
    ck_assert_int_eq(kc_put(c, &k, "ptx", payload, sizeof payload), EM_OK);
    kc_close(c);
    ck_assert(exists(entry_path(&k, "ptx", false)));
    ck_assert(exists(entry_path(&k, "ptx", true)));
    return k;
}

/* ---- keys ---- */

START_TEST(hasher_same_material_same_key) {
    kc_key a = key_of("kernel source"), b = key_of("kernel source");
    ck_assert(kc_key_equal(&a, &b));
    /* raw updates concatenate, fields do not */
    kc_hasher h;
    kc_hasher_reset(&h);
    kc_hasher_update(&h, "ab", 2);
    kc_hasher_update(&h, "c", 1);
    kc_key k1 = kc_hasher_digest(&h);
    kc_hasher_reset(&h);
    kc_hasher_update(&h, "abc", 3);
    kc_key k2 = kc_hasher_digest(&h);
    ck_assert(kc_key_equal(&k1, &k2));
    kc_hasher_reset(&h);
    kc_hasher_update_str(&h, "ab");
    kc_hasher_update_str(&h, "c");
    k1 = kc_hasher_digest(&h);
    kc_hasher_reset(&h);
    kc_hasher_update_str(&h, "a");
    kc_hasher_update_str(&h, "bc");
    k2 = kc_hasher_digest(&h);
    ck_assert(!kc_key_equal(&k1, &k2));
    /* NULL and "" are different fields */
    kc_hasher_reset(&h);
    kc_hasher_update_str(&h, NULL);
    k1 = kc_hasher_digest(&h);
    kc_hasher_reset(&h);
    kc_hasher_update_str(&h, "");
    k2 = kc_hasher_digest(&h);
    ck_assert(!kc_key_equal(&k1, &k2));
    /* digest leaves the state alone */
    kc_hasher_reset(&h);
    kc_hasher_update_u64(&h, 42);
    k1 = kc_hasher_digest(&h);
    k2 = kc_hasher_digest(&h);
    ck_assert(kc_key_equal(&k1, &k2));
    /* hex round trip */
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(&a, hex);
    ck_assert_uint_eq(strlen(hex), 32);
    ck_assert(kc_key_from_hex(hex, &b));
    ck_assert(kc_key_equal(&a, &b));
    ck_assert(!kc_key_from_hex("0123", &b));
    hex[5] = 'G';
    ck_assert(!kc_key_from_hex(hex, &b));
}
END_TEST

START_TEST(hasher_any_byte_changes_key) {
    enum { N = 64 };
    unsigned char m[N];
    for (int i = 0; i < N; i++) m[i] = (unsigned char)(i * 37);
    kc_key keys[N * 8 + 1];
    kc_hasher h;
    kc_hasher_reset(&h);
    kc_hasher_update(&h, m, N);
    keys[0] = kc_hasher_digest(&h);
    for (int i = 0; i < N; i++) {
        for (int bit = 0; bit < 8; bit++) {
            m[i] ^= (unsigned char)(1u << bit);
            kc_hasher_reset(&h);
            kc_hasher_update(&h, m, N);
            keys[1 + i * 8 + bit] = kc_hasher_digest(&h);
            m[i] ^= (unsigned char)(1u << bit);
        }
    }
    for (int i = 0; i <= N * 8; i++)
        for (int j = 0; j < i; j++)
            ck_assert_msg(!kc_key_equal(&keys[i], &keys[j]), "keys %d and %d agree", i, j);
    /* u64 fields: every bit counts, and a u64 is not its low byte */
    kc_hasher_reset(&h);
    kc_hasher_update_u64(&h, 1);
    kc_key a = kc_hasher_digest(&h);
    kc_hasher_reset(&h);
    kc_hasher_update_u64(&h, 1ull << 63 | 1);
    kc_key b = kc_hasher_digest(&h);
    ck_assert(!kc_key_equal(&a, &b));
}
END_TEST

START_TEST(hasher_includes_format_version) {
    kc_hasher h;
    kc_hasher_reset(&h);
    kc_hasher_update_str(&h, "material");
    kc_key now = kc_hasher_digest(&h);
    kc_hasher_reset_version(&h, KC_FORMAT_VERSION);
    kc_hasher_update_str(&h, "material");
    kc_key same = kc_hasher_digest(&h);
    kc_hasher_reset_version(&h, KC_FORMAT_VERSION + 1);
    kc_hasher_update_str(&h, "material");
    kc_key next = kc_hasher_digest(&h);
    ck_assert(kc_key_equal(&now, &same));
    ck_assert(!kc_key_equal(&now, &next));
}
END_TEST

/* ---- round trips and tiers ---- */

START_TEST(put_get_bytes_round_trip) {
    logbuf l;
    kc_cache *c = open_logged(cachedir, &l);
    ck_assert(kc_on_disk(c));
    ck_assert_str_eq(kc_dir(c), cachedir);
    kc_key k = key_of("k1");
    char big[70000];
    fill(big, sizeof big, 1);
    ck_assert_int_eq(kc_put(c, &k, "cubin", big, sizeof big), EM_OK);
    expect_hit(c, &k, "cubin", big, sizeof big);
    /* zero bytes is an entry too, and its hit is not NULL */
    kc_key z = key_of("empty");
    ck_assert_int_eq(kc_put(c, &z, "graph", "", 0), EM_OK);
    expect_hit(c, &z, "graph", "", 0);
    kc_counters s = stats(c);
    ck_assert_uint_eq(s.hits_mem, 2);
    ck_assert_uint_eq(s.hits_disk, 0);
    ck_assert_uint_eq(s.writes, 2);
    ck_assert_uint_eq(s.bytes_written, sizeof big);
    ck_assert_uint_eq(s.entries, 2);
    ck_assert_uint_eq(s.misses + s.corrupt + s.refused, 0);
    /* on disk: the payload holds exactly the bytes, the header is text */
    size_t n;
    char *disk = read_bytes(entry_path(&k, "cubin", false), &n);
    ck_assert_uint_eq(n, sizeof big);
    ck_assert_int_eq(memcmp(disk, big, n), 0);
    free(disk);
    char *meta = read_bytes(entry_path(&k, "cubin", true), &n);
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(&k, hex);
    char want[128];
    snprintf(want, sizeof want, "ember-cache 1\nkey %s\nkind cubin\nsize 70000\nxxh3-128 ", hex);
    ck_assert_msg(n > strlen(want) && !strncmp(meta, want, strlen(want)), "%.*s", (int)n, meta);
    free(meta);
    /* 0700 directories, 0600 files */
    struct stat st;
    ck_assert_int_eq(stat(cachedir, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0700);
    ck_assert_int_eq(stat(entry_path(&k, "cubin", false), &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0600);
    ck_assert_int_eq(l.count, 0);
    kc_close(c);
}
END_TEST

START_TEST(put_get_file_round_trip) {
    kc_cache *c = kc_open(cachedir, 0);
    kc_key k = key_of("so");
    char src[256], body[5000];
    fill(body, sizeof body, 2);
    snprintf(src, sizeof src, "%s/kernel.so", tmp);
    write_bytes(src, body, sizeof body);
    chmod(src, 0775); /* as a compiler might leave it */
    ck_assert_int_eq(kc_put_file(c, &k, "so", src), EM_OK);
    ck_assert(!exists(src)); /* moved */
    char *path = NULL;
    ck_assert_int_eq(kc_get_file(c, &k, "so", &path), EM_OK);
    ck_assert_ptr_nonnull(path);
    ck_assert_str_eq(path, entry_path(&k, "so", false));
    size_t n;
    char *got = read_bytes(path, &n);
    ck_assert_uint_eq(n, sizeof body);
    ck_assert_int_eq(memcmp(got, body, n), 0);
    free(got);
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0600);
    em_free(path);
    /* the bytes of a file entry, and the file of a bytes entry */
    expect_hit(c, &k, "so", body, sizeof body);
    kc_key kb = key_of("bytes");
    ck_assert_int_eq(kc_put(c, &kb, "so", body, 100), EM_OK);
    ck_assert_int_eq(kc_get_file(c, &kb, "so", &path), EM_OK);
    ck_assert_str_eq(path, entry_path(&kb, "so", false));
    em_free(path);
    kc_counters s = stats(c);
    /* the bytes of a file on disk are read again from disk, through the
     * directory checks: a disk hit */
    ck_assert_uint_eq(s.hits_mem, 2);
    ck_assert_uint_eq(s.hits_disk, 1);
    ck_assert_uint_eq(s.writes, 2);
    ck_assert_uint_eq(s.bytes_written, sizeof body + 100);
    /* errors: no such file, not a regular file; the caller's file stays */
    ck_assert_int_eq(kc_put_file(c, &k, "so", src), EM_ERR_ARG);
    ck_assert_msg(strstr(em_last_error(), "cannot open"), "%s", em_last_error());
    ck_assert_int_eq(kc_put_file(c, &k, "so", tmp), EM_ERR_ARG);
    ck_assert_msg(strstr(em_last_error(), "not a regular file"), "%s", em_last_error());
    kc_close(c);
}
END_TEST

START_TEST(memory_hit_then_disk_hit_in_new_object) {
    kc_cache *a = kc_open(cachedir, 0);
    kc_key k = key_of("shared");
    ck_assert_int_eq(kc_put(a, &k, "ptx", payload, sizeof payload), EM_OK);
    expect_hit(a, &k, "ptx", payload, sizeof payload);
    kc_counters s = stats(a);
    ck_assert_uint_eq(s.hits_mem, 1);
    ck_assert_uint_eq(s.hits_disk, 0);
    /* a second object (another process, as far as the cache can tell) */
    kc_cache *b = kc_open(cachedir, 0);
    expect_hit(b, &k, "ptx", payload, sizeof payload);
    s = stats(b);
    ck_assert_uint_eq(s.hits_disk, 1);
    ck_assert_uint_eq(s.hits_mem, 0);
    ck_assert_uint_eq(s.writes, 0);
    /* now in b's memory */
    expect_hit(b, &k, "ptx", payload, sizeof payload);
    s = stats(b);
    ck_assert_uint_eq(s.hits_disk, 1);
    ck_assert_uint_eq(s.hits_mem, 1);
    ck_assert_uint_eq(s.entries, 1);
    /* files the same way */
    kc_cache *f = kc_open(cachedir, 0);
    char *path = NULL;
    ck_assert_int_eq(kc_get_file(f, &k, "ptx", &path), EM_OK);
    ck_assert_str_eq(path, entry_path(&k, "ptx", false));
    em_free(path);
    ck_assert_int_eq(kc_get_file(f, &k, "ptx", &path), EM_OK);
    em_free(path);
    s = stats(f);
    ck_assert_uint_eq(s.hits_disk, 1);
    ck_assert_uint_eq(s.hits_mem, 1);
    kc_close(f);
    kc_close(b);
    kc_close(a);
}
END_TEST

START_TEST(miss) {
    kc_cache *c = kc_open(cachedir, 0);
    kc_key k = key_of("absent");
    expect_miss(c, &k, "so");
    char *path = (char *)1;
    ck_assert_int_eq(kc_get_file(c, &k, "so", &path), EM_OK);
    ck_assert_ptr_null(path);
    kc_counters s = stats(c);
    ck_assert_uint_eq(s.misses, 2);
    ck_assert_uint_eq(s.corrupt, 0);
    ck_assert_uint_eq(s.hits_mem + s.hits_disk, 0);
    kc_close(c);
}
END_TEST

START_TEST(wrong_kind_misses) {
    kc_key k = make_entry();
    kc_cache *c = kc_open(cachedir, 0);
    expect_miss(c, &k, "cubin");
    ck_assert_uint_eq(stats(c).corrupt, 0);
    kc_close(c);
    /* an entry renamed to another kind: its header says ptx */
    char p[1024], m[1024];
    snprintf(p, sizeof p, "%s", entry_path(&k, "cubin", false));
    snprintf(m, sizeof m, "%s", entry_path(&k, "cubin", true));
    ck_assert_int_eq(rename(entry_path(&k, "ptx", false), p), 0);
    ck_assert_int_eq(rename(entry_path(&k, "ptx", true), m), 0);
    expect_corrupt_miss(&k, "cubin");
}
END_TEST

/* ---- entries gone bad: each a miss, counted corrupt, never wrong bytes ---- */

START_TEST(corrupted_payload_misses) {
    kc_key k = make_entry();
    const char *p = entry_path(&k, "ptx", false);
    size_t n;
    char *b = read_bytes(p, &n);
    b[n / 2] ^= 0x20;
    write_bytes(p, b, n);
    free(b);
    expect_corrupt_miss(&k, "ptx");
}
END_TEST

START_TEST(truncated_payload_misses) {
    kc_key k = make_entry();
    ck_assert_int_eq(truncate(entry_path(&k, "ptx", false), 10), 0);
    expect_corrupt_miss(&k, "ptx");
    ck_assert_int_eq(truncate(entry_path(&k, "ptx", false), 0), 0);
    expect_corrupt_miss(&k, "ptx");
    ck_assert_int_eq(unlink(entry_path(&k, "ptx", false)), 0);
    expect_corrupt_miss(&k, "ptx");
}
END_TEST

START_TEST(truncated_meta_misses) {
    kc_key k = make_entry();
    const char *m = entry_path(&k, "ptx", true);
    size_t n;
    char *b = read_bytes(m, &n);
    for (size_t cut = 0; cut < n; cut += 7) {
        write_bytes(m, b, cut);
        expect_corrupt_miss(&k, "ptx");
    }
    /* a header of another format version, of another key, with junk after */
    write_bytes(m, b, n);
    b[12] = '2';
    write_bytes(m, b, n);
    expect_corrupt_miss(&k, "ptx");
    b[12] = '1';
    write_bytes(m, b, n);
    kc_key other = key_of("other");
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(&other, hex);
    char *keyline = strstr(b, "key ");
    memcpy(keyline + 4, hex, 32);
    write_bytes(m, b, n);
    expect_corrupt_miss(&k, "ptx");
    free(b);
    kc_cache *c = kc_open(cachedir, 0);
    ck_assert_int_eq(kc_put(c, &k, "ptx", payload, sizeof payload), EM_OK);
    kc_close(c);
    b = read_bytes(m, &n);
    b[n] = ' ';
    write_bytes(m, b, n + 1);
    expect_corrupt_miss(&k, "ptx");
    free(b);
}
END_TEST

/* Every single-byte change to a header gives a miss or the right bytes
 * (a change the format tolerates: the creation time), never other bytes. */
START_TEST(header_mutations_never_give_wrong_bytes) {
    kc_key k = make_entry();
    const char *m = entry_path(&k, "ptx", true);
    size_t n;
    char *orig = read_bytes(m, &n);
    char *b = malloc(n + 1);
    const char repl[] = {'0', '9', 'a', ' ', '\n', '\0', '-', (char)0xff};
    int hits = 0, misses = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t r = 0; r < sizeof repl; r++) {
            if (orig[i] == repl[r]) continue;
            memcpy(b, orig, n);
            b[i] = repl[r];
            write_bytes(m, b, n);
            logbuf l;
            kc_cache *c = open_logged(cachedir, &l);
            void *d = NULL;
            size_t got = 0;
            ck_assert_int_eq(kc_get(c, &k, "ptx", &d, &got), EM_OK);
            if (d) {
                ck_assert_msg(got == sizeof payload && !memcmp(d, payload, got),
                              "byte %zu -> %d gave other bytes", i, repl[r]);
                hits++;
            } else {
                ck_assert_uint_eq(stats(c).corrupt, 1);
                misses++;
            }
            em_free(d);
            kc_close(c);
        }
    }
    ck_assert_int_gt(misses, 0);
    ck_assert_int_gt(hits, 0); /* digits of "created" */
    free(b);
    free(orig);
}
END_TEST

START_TEST(foreign_files_miss) {
    kc_key k = make_entry();
    char junk[4000];
    fill(junk, sizeof junk, 3);
    /* random bytes for the header */
    write_bytes(entry_path(&k, "ptx", true), junk, 100);
    expect_corrupt_miss(&k, "ptx");
    write_bytes(entry_path(&k, "ptx", true), junk, sizeof junk); /* longer than any header */
    expect_corrupt_miss(&k, "ptx");
    /* a payload with no header is no entry: a plain miss */
    kc_key k2 = key_of("foreign");
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", entry_path(&k2, "so", false));
    *strrchr(dir, '/') = '\0';
    ck_assert(mkdir(dir, 0700) == 0 || errno == EEXIST);
    write_bytes(entry_path(&k2, "so", false), junk, sizeof junk);
    kc_cache *c = kc_open(cachedir, 0);
    expect_miss(c, &k2, "so");
    ck_assert_uint_eq(stats(c).corrupt, 0);
    kc_close(c);
    /* a directory, a FIFO or a symlink where the header should be */
    unlink(entry_path(&k, "ptx", true));
    ck_assert_int_eq(mkdir(entry_path(&k, "ptx", true), 0700), 0);
    expect_corrupt_miss(&k, "ptx");
    rmdir(entry_path(&k, "ptx", true));
    ck_assert_int_eq(mkfifo(entry_path(&k, "ptx", true), 0600), 0);
    expect_corrupt_miss(&k, "ptx");
    unlink(entry_path(&k, "ptx", true));
    ck_assert_int_eq(symlink(entry_path(&k, "ptx", false), entry_path(&k, "ptx", true)), 0);
    logbuf l;
    c = open_logged(cachedir, &l);
    expect_miss(c, &k, "ptx");
    ck_assert_uint_eq(stats(c).refused, 1);
    ck_assert_msg(strstr(l.text, "symbolic link"), "%s", l.text);
    kc_close(c);
}
END_TEST

START_TEST(corrupt_entry_replaced_by_next_put) {
    kc_key k = make_entry();
    write_bytes(entry_path(&k, "ptx", false), "garbage", 7);
    /* without a log callback the warning goes to stderr, once */
    char errpath[256];
    snprintf(errpath, sizeof errpath, "%s/stderr", tmp);
    fflush(stderr);
    int saved = dup(2), fd = open(errpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ck_assert_int_ge(fd, 0);
    dup2(fd, 2);
    close(fd);
    kc_cache *c = kc_open(cachedir, 0);
    expect_miss(c, &k, "ptx");
    expect_miss(c, &k, "ptx");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    size_t n;
    char *err = read_bytes(errpath, &n);
    ck_assert_msg(!strncmp(err, "[ember] cache: ", 15) && strstr(err, "checksum") == NULL &&
                  strstr(err, "truncated") && strchr(err, '\n') == err + n - 1, "%s", err);
    free(err);
    unlink(errpath);
    ck_assert_uint_eq(stats(c).corrupt, 2);
    ck_assert_int_eq(kc_put(c, &k, "ptx", payload, sizeof payload), EM_OK);
    kc_close(c);
    c = kc_open(cachedir, 0);
    expect_hit(c, &k, "ptx", payload, sizeof payload);
    kc_counters s = stats(c);
    ck_assert_uint_eq(s.hits_disk, 1);
    ck_assert_uint_eq(s.corrupt, 0);
    kc_close(c);
    /* and a header-less payload is replaced too, header and all */
    unlink(entry_path(&k, "ptx", true));
    c = kc_open(cachedir, 0);
    expect_miss(c, &k, "ptx");
    ck_assert_int_eq(kc_put(c, &k, "ptx", payload, sizeof payload), EM_OK);
    kc_close(c);
    c = kc_open(cachedir, 0);
    expect_hit(c, &k, "ptx", payload, sizeof payload);
    kc_close(c);
}
END_TEST

/* ---- concurrency ---- */

START_TEST(two_processes_write_same_key) {
    kc_key k = key_of("contended");
    char body[8192];
    fill(body, sizeof body, 4);
    pid_t pids[2];
    for (int p = 0; p < 2; p++) {
        pids[p] = fork();
        ck_assert_int_ge(pids[p], 0);
        if (pids[p] == 0) {
            kc_cache *c = kc_open(cachedir, 0);
            int bad = !kc_on_disk(c);
            for (int i = 0; i < 200 && !bad; i++) {
                bad |= kc_put(c, &k, "so", body, sizeof body) != EM_OK;
                /* read back through a fresh object: never wrong bytes */
                if (i % 20 == 0) {
                    kc_cache *r = kc_open(cachedir, 0);
                    void *d = NULL;
                    size_t n = 0;
                    bad |= kc_get(r, &k, "so", &d, &n) != EM_OK;
                    if (d) bad |= n != sizeof body || memcmp(d, body, n) != 0;
                    em_free(d);
                    kc_close(r);
                }
            }
            bad |= stats(c).writes != 200;
            kc_close(c);
            _exit(bad);
        }
    }
    for (int p = 0; p < 2; p++) {
        int status;
        ck_assert_int_eq(waitpid(pids[p], &status, 0), pids[p]);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "writer %d failed", p);
    }
    kc_cache *c = kc_open(cachedir, 0);
    expect_hit(c, &k, "so", body, sizeof body);
    ck_assert_uint_eq(stats(c).corrupt, 0);
    kc_close(c);
    ck_assert_int_eq(count_files(cachedir), 2); /* no temporaries left */
}
END_TEST

typedef struct worker {
    kc_cache *c;
    int id;
    int bad;
} worker;

static void *work(void *arg) {
    worker *w = arg;
    char body[300], name[32];
    for (int i = 0; i < 50; i++) {
        snprintf(name, sizeof name, "t%d-%d", w->id, i % 10);
        kc_key k = key_of(name);
        fill(body, sizeof body, (unsigned)(w->id * 100 + i % 10));
        if (i < 10) w->bad |= kc_put(w->c, &k, "graph", body, sizeof body) != EM_OK;
        void *d = NULL;
        size_t n = 0;
        w->bad |= kc_get(w->c, &k, "graph", &d, &n) != EM_OK || !d || n != sizeof body ||
                  memcmp(d, body, n) != 0;
        em_free(d);
    }
    return NULL;
}

START_TEST(one_object_shared_by_threads) {
    kc_cache *c = kc_open(cachedir, 0);
    pthread_t th[4];
    worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker){c, i, 0};
        ck_assert_int_eq(pthread_create(&th[i], NULL, work, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(pthread_join(th[i], NULL), 0);
        ck_assert_int_eq(w[i].bad, 0);
    }
    kc_counters s = stats(c);
    ck_assert_uint_eq(s.writes, 40);
    ck_assert_uint_eq(s.hits_mem, 200);
    ck_assert_uint_eq(s.entries, 40);
    kc_close(c);
}
END_TEST

/* ---- trust ---- */

START_TEST(world_writable_dir_refused) {
    ck_assert_int_eq(mkdir(cachedir, 0700), 0);
    ck_assert_int_eq(chmod(cachedir, 0777), 0);
    logbuf l;
    kc_cache *c = open_logged(cachedir, &l);
    ck_assert(!kc_on_disk(c));
    ck_assert_ptr_null(kc_dir(c));
    ck_assert_int_eq(l.count, 1);
    ck_assert_msg(strstr(l.text, "refusing cache directory") &&
                  strstr(l.text, "writable by group or others") &&
                  strstr(l.text, "memory only"), "%s", l.text);
    /* memory-only: entries work, no file is made */
    kc_key k = key_of("mem");
    ck_assert_int_eq(kc_put(c, &k, "ptx", payload, sizeof payload), EM_OK);
    expect_hit(c, &k, "ptx", payload, sizeof payload);
    kc_counters s = stats(c);
    ck_assert_uint_eq(s.writes, 0);
    ck_assert_uint_eq(s.hits_mem, 1);
    ck_assert_int_eq(count_files(cachedir), 0);
    kc_close(c);
    /* group-writable too */
    ck_assert_int_eq(chmod(cachedir, 0770), 0);
    c = open_logged(cachedir, &l);
    ck_assert(!kc_on_disk(c));
    kc_close(c);
}
END_TEST

START_TEST(writable_entry_refused) {
    kc_key k = make_entry();
    const char *files[2] = {entry_path(&k, "ptx", false), entry_path(&k, "ptx", true)};
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(chmod(files[i], 0666), 0);
        logbuf l;
        kc_cache *c = open_logged(cachedir, &l);
        ck_assert(kc_on_disk(c));
        expect_miss(c, &k, "ptx");
        kc_counters s = stats(c);
        ck_assert_uint_eq(s.refused, 1);
        ck_assert_uint_eq(s.misses, 1);
        ck_assert_msg(strstr(l.text, "refusing cache entry") &&
                      strstr(l.text, "writable by group or others"), "%s", l.text);
        /* the next put replaces it with a trusted entry */
        ck_assert_int_eq(kc_put(c, &k, "ptx", payload, sizeof payload), EM_OK);
        kc_close(c);
        c = kc_open(cachedir, 0);
        expect_hit(c, &k, "ptx", payload, sizeof payload);
        kc_close(c);
    }
}
END_TEST

START_TEST(foreign_owner_refused) {
    if (geteuid() != 0) return; /* only root can give files away */
    kc_key k = make_entry();
    ck_assert_int_eq(chown(entry_path(&k, "ptx", true), 65534, 65534), 0);
    logbuf l;
    kc_cache *c = open_logged(cachedir, &l);
    expect_miss(c, &k, "ptx");
    ck_assert_uint_eq(stats(c).refused, 1);
    ck_assert_msg(strstr(l.text, "owned by uid 65534"), "%s", l.text);
    kc_close(c);
    ck_assert_int_eq(chown(cachedir, 65534, 65534), 0);
    c = open_logged(cachedir, &l);
    ck_assert(!kc_on_disk(c));
    ck_assert_msg(strstr(l.text, "refusing cache directory") && strstr(l.text, "owned by uid"),
                  "%s", l.text);
    kc_close(c);
}
END_TEST

START_TEST(unwritable_dir_memory_only) {
    logbuf l;
    kc_cache *c;
    kc_key k = key_of("unwritable");
    if (geteuid() != 0) { /* root writes through any mode */
        ck_assert_int_eq(mkdir(cachedir, 0700), 0);
        ck_assert_int_eq(chmod(cachedir, 0500), 0);
        c = open_logged(cachedir, &l);
        ck_assert(!kc_on_disk(c));
        ck_assert_int_eq(l.count, 1);
        ck_assert_msg(strstr(l.text, "cannot"), "%s", l.text);
        ck_assert_int_eq(kc_put(c, &k, "ptx", payload, sizeof payload), EM_OK);
        expect_hit(c, &k, "ptx", payload, sizeof payload);
        kc_close(c);
        chmod(cachedir, 0700);
    }
    /* a path that cannot be a directory: under a regular file */
    char file[256], dir[300];
    snprintf(file, sizeof file, "%s/plain", tmp);
    snprintf(dir, sizeof dir, "%s/plain/cache", tmp);
    write_bytes(file, "x", 1);
    c = open_logged(dir, &l);
    ck_assert(!kc_on_disk(c));
    ck_assert_int_eq(l.count, 1);
    ck_assert_msg(strstr(l.text, "cannot create cache directory") && strstr(l.text, "memory only"),
                  "%s", l.text);
    ck_assert_int_eq(kc_put(c, &k, "ptx", payload, sizeof payload), EM_OK);
    expect_hit(c, &k, "ptx", payload, sizeof payload);
    /* a file entry lives in a private directory until kc_close */
    char src[256], *path = NULL;
    snprintf(src, sizeof src, "%s/k.so", tmp);
    write_bytes(src, payload, sizeof payload);
    ck_assert_int_eq(kc_put_file(c, &k, "so", src), EM_OK);
    ck_assert_int_eq(kc_get_file(c, &k, "so", &path), EM_OK);
    ck_assert_ptr_nonnull(path);
    ck_assert(strncmp(path, tmp, strlen(tmp)) == 0);
    em_free(path);
    kc_close(c);
    ck_assert_int_eq(count_files(tmp), 1); /* only "plain" is left */
}
END_TEST

START_TEST(disabled_by_environment) {
    setenv("EMBER_CACHE", "0", 1);
    logbuf l;
    kc_cache *c = open_logged(cachedir, &l);
    ck_assert(!kc_on_disk(c));
    ck_assert_int_eq(l.count, 0); /* asked for: nothing to warn about */
    kc_key k = key_of("off");
    ck_assert_int_eq(kc_put(c, &k, "ptx", payload, sizeof payload), EM_OK);
    expect_hit(c, &k, "ptx", payload, sizeof payload);
    /* a file for bytes put in memory, and a file put as a file */
    char *path = NULL;
    ck_assert_int_eq(kc_get_file(c, &k, "ptx", &path), EM_OK);
    ck_assert_ptr_nonnull(path);
    size_t n;
    char *got = read_bytes(path, &n);
    ck_assert_uint_eq(n, sizeof payload);
    ck_assert_int_eq(memcmp(got, payload, n), 0);
    free(got);
    em_free(path);
    char src[256];
    snprintf(src, sizeof src, "%s/k.so", tmp);
    write_bytes(src, "ELF", 3);
    ck_assert_int_eq(kc_put_file(c, &k, "so", src), EM_OK);
    expect_hit(c, &k, "so", "ELF", 3);
    kc_counters s = stats(c);
    ck_assert_uint_eq(s.writes, 0);
    ck_assert_uint_eq(s.entries, 2);
    ck_assert(!exists(cachedir));
    kc_close(c);
    ck_assert_int_eq(count_files(tmp), 0); /* the private directory went with it */
    /* the flag does the same */
    unsetenv("EMBER_CACHE");
    c = kc_open(cachedir, KC_MEMORY_ONLY);
    ck_assert(!kc_on_disk(c));
    ck_assert_int_eq(kc_put(c, &k, "ptx", payload, sizeof payload), EM_OK);
    kc_close(c);
    ck_assert(!exists(cachedir));
}
END_TEST

START_TEST(directory_from_environment) {
    char home[256];
    snprintf(home, sizeof home, "%s/home", tmp);
    ck_assert_int_eq(mkdir(home, 0755), 0);
    const char *old_home = getenv("HOME"), *old_xdg = getenv("XDG_CACHE_HOME");
    char *saved_home = old_home ? strdup(old_home) : NULL;
    char *saved_xdg = old_xdg ? strdup(old_xdg) : NULL;
    setenv("EMBER_CACHE_DIR", cachedir, 1);
    kc_cache *c = kc_open(NULL, 0);
    ck_assert_str_eq(kc_dir(c), cachedir);
    kc_close(c);
    unsetenv("EMBER_CACHE_DIR");
    setenv("XDG_CACHE_HOME", home, 1);
    c = kc_open(NULL, 0);
    char want[300];
    snprintf(want, sizeof want, "%s/ember", home);
    ck_assert_str_eq(kc_dir(c), want);
    kc_close(c);
    unsetenv("XDG_CACHE_HOME");
    setenv("HOME", home, 1);
    c = kc_open(NULL, 0);
    snprintf(want, sizeof want, "%s/.cache/ember", home);
    ck_assert_str_eq(kc_dir(c), want);
    kc_close(c);
    /* the parts we created are 0700; existing parents are left alone */
    struct stat st;
    ck_assert_int_eq(stat(want, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0700);
    snprintf(want, sizeof want, "%s/.cache", home);
    ck_assert_int_eq(stat(want, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0700);
    ck_assert_int_eq(stat(home, &st), 0);
    ck_assert_uint_eq(st.st_mode & 0777, 0755);
    if (saved_home) setenv("HOME", saved_home, 1);
    else unsetenv("HOME");
    if (saved_xdg) setenv("XDG_CACHE_HOME", saved_xdg, 1);
    free(saved_home);
    free(saved_xdg);
}
END_TEST

/* ---- size limit ---- */

static void set_mtime(const char *path, time_t t) {
    struct timespec ts[2] = {{t, 0}, {t, 0}};
    ck_assert_int_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
}

static uint64_t entry_bytes(const kc_key *k, const char *kind) {
    struct stat a, b;
    ck_assert_int_eq(stat(entry_path(k, kind, false), &a), 0);
    ck_assert_int_eq(stat(entry_path(k, kind, true), &b), 0);
    return (uint64_t)(a.st_size + b.st_size);
}

START_TEST(prune_evicts_least_recently_used) {
    kc_cache *c = kc_open(cachedir, 0);
    kc_key k[3] = {key_of("A"), key_of("B"), key_of("C")};
    char body[1000];
    for (int i = 0; i < 3; i++) {
        fill(body, sizeof body, (unsigned)i);
        ck_assert_int_eq(kc_put(c, &k[i], "so", body, sizeof body), EM_OK);
    }
    kc_close(c);
    time_t now = time(NULL);
    for (int i = 0; i < 3; i++) set_mtime(entry_path(&k[i], "so", true), now - 300 + 100 * i);
    uint64_t one = entry_bytes(&k[0], "so");
    /* A is used again (a disk hit refreshes it): B is now the oldest */
    c = kc_open(cachedir, 0);
    char *path = NULL;
    ck_assert_int_eq(kc_get_file(c, &k[0], "so", &path), EM_OK);
    ck_assert_ptr_nonnull(path);
    em_free(path);
    ck_assert_int_eq(kc_prune(c, 2 * one), EM_OK);
    ck_assert(!exists(entry_path(&k[1], "so", true)));
    ck_assert(!exists(entry_path(&k[1], "so", false)));
    ck_assert(exists(entry_path(&k[0], "so", false)));
    ck_assert(exists(entry_path(&k[2], "so", false)));
    ck_assert_uint_eq(stats(c).evicted, 1);
    /* under the limit: nothing to do */
    ck_assert_int_eq(kc_prune(c, 2 * one), EM_OK);
    ck_assert_uint_eq(stats(c).evicted, 1);
    /* next C (older than A's refresh), then A; an evicted file is no hit */
    ck_assert_int_eq(kc_prune(c, one), EM_OK);
    ck_assert(!exists(entry_path(&k[2], "so", false)));
    ck_assert(exists(entry_path(&k[0], "so", false)));
    ck_assert_int_eq(kc_prune(c, 0), EM_OK);
    ck_assert_int_eq(count_files(cachedir), 0);
    ck_assert_int_eq(kc_get_file(c, &k[0], "so", &path), EM_OK);
    ck_assert_ptr_null(path);
    ck_assert_uint_eq(stats(c).evicted, 3);
    kc_close(c);
}
END_TEST

START_TEST(prune_removes_debris) {
    kc_key k = make_entry();
    /* a payload without header, an old temporary, a fresh temporary */
    kc_key o = key_of("orphan");
    kc_cache *c = kc_open(cachedir, 0);
    ck_assert_int_eq(kc_put(c, &o, "so", payload, sizeof payload), EM_OK);
    unlink(entry_path(&o, "so", true));
    char old_tmp[1024], new_tmp[1024];
    snprintf(old_tmp, sizeof old_tmp, "%s", entry_path(&k, "ptx", false));
    strcpy(strrchr(old_tmp, '/'), "/.tmp-AAAAAA");
    snprintf(new_tmp, sizeof new_tmp, "%s", old_tmp);
    strcpy(strrchr(new_tmp, '/'), "/.tmp-BBBBBB");
    write_bytes(old_tmp, "x", 1);
    write_bytes(new_tmp, "x", 1);
    set_mtime(old_tmp, time(NULL) - 7200);
    set_mtime(entry_path(&o, "so", false), time(NULL) - 1000);
    ck_assert_int_eq(kc_prune(c, entry_bytes(&k, "ptx")), EM_OK);
    ck_assert(!exists(old_tmp));
    ck_assert(exists(new_tmp));
    ck_assert(!exists(entry_path(&o, "so", false)));
    ck_assert(exists(entry_path(&k, "ptx", false)));
    kc_close(c);
}
END_TEST

START_TEST(size_limit_from_environment) {
    setenv("EMBER_CACHE_MAX_SIZE", "4K", 1);
    kc_cache *c = kc_open(cachedir, 0);
    char body[700];
    for (int i = 0; i < 20; i++) {
        char name[16];
        snprintf(name, sizeof name, "e%d", i);
        kc_key k = key_of(name);
        fill(body, sizeof body, (unsigned)i);
        ck_assert_int_eq(kc_put(c, &k, "ptx", body, sizeof body), EM_OK);
        expect_hit(c, &k, "ptx", body, sizeof body);
    }
    kc_counters s = stats(c);
    ck_assert_uint_eq(s.writes, 20);
    ck_assert_uint_gt(s.evicted, 10);
    kc_close(c);
    ck_assert_int_le(count_files(cachedir), 2 * 5);
    /* the newest stays */
    kc_key last = key_of("e19");
    ck_assert(exists(entry_path(&last, "ptx", true)));
    /* a bad value is ignored with a warning */
    setenv("EMBER_CACHE_MAX_SIZE", "lots", 1);
    logbuf l;
    c = open_logged(cachedir, &l);
    ck_assert_msg(strstr(l.text, "EMBER_CACHE_MAX_SIZE"), "%s", l.text);
    ck_assert(kc_on_disk(c));
    kc_close(c);
}
END_TEST

START_TEST(parse_size) {
    uint64_t v = 0;
    ck_assert_int_eq(kc_parse_size("123", &v), EM_OK);
    ck_assert_uint_eq(v, 123);
    ck_assert_int_eq(kc_parse_size("64k", &v), EM_OK);
    ck_assert_uint_eq(v, 64 << 10);
    ck_assert_int_eq(kc_parse_size("500M", &v), EM_OK);
    ck_assert_uint_eq(v, 500ull << 20);
    ck_assert_int_eq(kc_parse_size("2G", &v), EM_OK);
    ck_assert_uint_eq(v, 2ull << 30);
    ck_assert_int_eq(kc_parse_size("1GiB", &v), EM_OK);
    ck_assert_uint_eq(v, 1ull << 30);
    ck_assert_int_eq(kc_parse_size("3TB", &v), EM_OK);
    ck_assert_uint_eq(v, 3ull << 40);
    const char *bad[] = {"", "M", "-1", "1.5G", "5X", "12 M", "1iB", "99999999999999999999",
                         "20000000T"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        em_clear_error();
        ck_assert_msg(kc_parse_size(bad[i], &v) == EM_ERR_ARG, "'%s' accepted", bad[i]);
        ck_assert_msg(strstr(em_last_error(), "bad size"), "%s", em_last_error());
    }
}
END_TEST

/* ---- arguments ---- */

START_TEST(bad_arguments) {
    kc_cache *c = kc_open(cachedir, 0);
    kc_key k = key_of("args");
    void *d;
    size_t n;
    ck_assert_int_eq(kc_get(NULL, &k, "so", &d, &n), EM_ERR_NULL);
    ck_assert_int_eq(kc_get(c, NULL, "so", &d, &n), EM_ERR_NULL);
    ck_assert_int_eq(kc_get(c, &k, NULL, &d, &n), EM_ERR_NULL);
    ck_assert_int_eq(kc_get(c, &k, "so", NULL, &n), EM_ERR_NULL);
    ck_assert_int_eq(kc_put(c, &k, "so", NULL, 3), EM_ERR_NULL);
    ck_assert_int_eq(kc_put_file(c, &k, "so", NULL), EM_ERR_NULL);
    ck_assert_int_eq(kc_get_file(c, &k, "so", NULL), EM_ERR_NULL);
    ck_assert_int_eq(kc_stats(c, NULL), EM_ERR_NULL);
    ck_assert_int_eq(kc_prune(NULL, 0), EM_ERR_NULL);
    const char *kinds[] = {"", "SO", "a/b", "so.meta", "../x", "abcdefghijklmnop", "a b"};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        em_clear_error();
        ck_assert_msg(kc_put(c, &k, kinds[i], "x", 1) == EM_ERR_ARG, "kind '%s'", kinds[i]);
        ck_assert_msg(strstr(em_last_error(), "bad kind"), "%s", em_last_error());
        ck_assert_int_eq(kc_get(c, &k, kinds[i], &d, &n), EM_ERR_ARG);
    }
    ck_assert_int_eq(kc_put(c, &k, "abcdefghijklmno", "x", 1), EM_OK); /* 15: the longest */
    ck_assert_uint_eq(stats(c).writes, 1);
    kc_close(c);
    kc_close(NULL);
}
END_TEST


/* ---- regressions of issue 21 ---- */

/* The fan-out directory of k (tmp/cache/v1/<2 hex>). */
static const char *fan_path(const kc_key *k) {
    static char buf[512];
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(k, hex);
    snprintf(buf, sizeof buf, "%s/v1/%.2s", cachedir, hex);
    return buf;
}

/* Item 4: a fan-out directory others can write (or a link in its place)
 * is refused like the top directory: a miss with a reason, never a hit. */
START_TEST(untrusted_fan_out_dir_refused) {
    kc_key k = make_entry();
    for (int how = 0; how < 2; how++) {
        char moved[600];
        snprintf(moved, sizeof moved, "%s/elsewhere", tmp);
        if (how == 0) {
            ck_assert_int_eq(chmod(fan_path(&k), 0777), 0);
        } else { /* the fan-out directory becomes a link to a directory elsewhere */
            ck_assert_int_eq(chmod(fan_path(&k), 0700), 0);
            ck_assert_int_eq(rename(fan_path(&k), moved), 0);
            ck_assert_int_eq(symlink(moved, fan_path(&k)), 0);
        }
        logbuf l;
        kc_cache *c = open_logged(cachedir, &l);
        ck_assert(kc_on_disk(c));
        expect_miss(c, &k, "ptx");
        char *path = (char *)1;
        ck_assert_int_eq(kc_get_file(c, &k, "ptx", &path), EM_OK);
        ck_assert_ptr_null(path);
        int fd = 7;
        ck_assert_int_eq(kc_get_fd(c, &k, "ptx", &fd), EM_OK);
        ck_assert_int_eq(fd, -1);
        kc_counters s = stats(c);
        ck_assert_uint_eq(s.hits_disk + s.hits_mem, 0);
        ck_assert_uint_eq(s.refused, 3);
        ck_assert_msg(strstr(l.text, how == 0 ? "writable by group or others" : "symbolic link"),
                      "%s", l.text);
        kc_close(c);
    }
}
END_TEST

/* Item 4: kc_get_fd gives a sealed memory file of the verified bytes,
 * which nothing done to the directory afterwards changes. */
START_TEST(get_fd_is_a_sealed_copy_of_the_verified_bytes) {
    kc_key k = make_entry();
    kc_cache *c = kc_open(cachedir, 0);
    int fd = -1;
    ck_assert_int_eq(kc_get_fd(c, &k, "ptx", &fd), EM_OK);
    ck_assert_int_ge(fd, 0);
    int seals = fcntl(fd, F_GET_SEALS);
    ck_assert_int_eq(seals & (F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL),
                     F_SEAL_WRITE | F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);
    write_bytes(entry_path(&k, "ptx", false), "swapped after the check", 23);
    char buf[256];
    ck_assert_int_eq(pread(fd, buf, sizeof buf, 0), (ssize_t)sizeof payload);
    ck_assert_int_eq(memcmp(buf, payload, sizeof payload), 0);
    ck_assert_int_lt(write(fd, "x", 1), 0); /* sealed */
    close(fd);
    /* the replaced payload is now a corrupt miss */
    kc_close(c);
    c = kc_open(cachedir, 0);
    ck_assert_int_eq(kc_get_fd(c, &k, "ptx", &fd), EM_OK);
    ck_assert_int_eq(fd, -1);
    kc_close(c);
}
END_TEST

/* Item 3: a payload or header that became a directory (with files in it)
 * is a miss, and the next put replaces it: the disk tier stays in use. */
START_TEST(directory_at_an_entry_name_is_replaced) {
    for (int meta = 0; meta < 2; meta++) {
        kc_key k = key_of(meta ? "header dir" : "payload dir");
        kc_cache *c = kc_open(cachedir, 0);
        ck_assert_int_eq(kc_put(c, &k, "so", payload, sizeof payload), EM_OK);
        kc_close(c);
        const char *p = entry_path(&k, "so", meta);
        char sub[1100], file[1200];
        snprintf(sub, sizeof sub, "%s/sub", p);
        snprintf(file, sizeof file, "%s/junk", sub);
        ck_assert_int_eq(unlink(p), 0);
        ck_assert_int_eq(mkdir(p, 0700), 0);
        ck_assert_int_eq(mkdir(sub, 0700), 0);
        write_bytes(file, "junk", 4);
        c = kc_open(cachedir, 0);
        expect_miss(c, &k, "so");
        ck_assert_int_eq(kc_put(c, &k, "so", payload, sizeof payload), EM_OK);
        ck_assert_msg(kc_on_disk(c), "the put fell back to memory");
        ck_assert_uint_eq(stats(c).writes, 1);
        kc_close(c);
        struct stat st;
        ck_assert_int_eq(lstat(p, &st), 0);
        ck_assert(S_ISREG(st.st_mode));
        c = kc_open(cachedir, 0);
        expect_hit(c, &k, "so", payload, sizeof payload);
        ck_assert_uint_eq(stats(c).hits_disk, 1);
        kc_close(c);
    }
}
END_TEST

/* Item 3: verify sees an entry whose payload or header is a directory, and
 * remove takes it away (or says it could not). */
START_TEST(verify_and_remove_see_directories) {
    kc_key k[2] = {key_of("payload dir"), key_of("header dir")};
    kc_cache *c = kc_open(cachedir, 0);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(kc_put(c, &k[i], "so", payload, sizeof payload), EM_OK);
        const char *p = entry_path(&k[i], "so", i == 1);
        ck_assert_int_eq(unlink(p), 0);
        ck_assert_int_eq(mkdir(p, 0700), 0);
    }
    kc_entry_info *es;
    size_t n;
    ck_assert_int_eq(kc_list(c, &es, &n), EM_OK);
    ck_assert_uint_eq(n, 2);
    char why[512];
    for (size_t i = 0; i < n; i++) {
        ck_assert_int_eq(kc_verify(c, &es[i], why, sizeof why), KC_READ_CORRUPT);
        ck_assert_msg(strstr(why, "not a regular file"), "%s", why);
        ck_assert_int_eq(kc_remove(c, &es[i].key, es[i].kind), EM_OK);
    }
    em_free(es);
    for (int i = 0; i < 2; i++) {
        ck_assert(!exists(entry_path(&k[i], "so", false)));
        ck_assert(!exists(entry_path(&k[i], "so", true)));
    }
    ck_assert_int_eq(kc_list(c, &es, &n), EM_OK);
    ck_assert_uint_eq(n, 0);
    em_free(es);
    kc_close(c);
}
END_TEST

/* Item 7: a write that fails for space (RLIMIT_FSIZE makes write() fail
 * with EFBIG, as a full disk does with ENOSPC) leaves no payload without
 * its header and no temporary file; the entry is still served from memory. */
START_TEST(full_disk_leaves_no_half_written_entry) {
    for (int as_file = 0; as_file < 2; as_file++) {
        logbuf l;
        kc_cache *c = open_logged(cachedir, &l);
        kc_key k = key_of(as_file ? "full disk file" : "full disk bytes");
        char src[256];
        snprintf(src, sizeof src, "%s/kernel.so", tmp);
        if (as_file) write_bytes(src, "0123456789", 10);
        struct rlimit old, lim;
        ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
        lim = old;
        lim.rlim_cur = 100; /* the 10-byte payload fits, its ~130-byte header does not */
        /* no ck_assert while the limit holds: Check's own message file
         * would hit it too */
        signal(SIGXFSZ, SIG_IGN);
        int set = setrlimit(RLIMIT_FSIZE, &lim);
        em_status s = as_file ? kc_put_file(c, &k, "so", src) : kc_put(c, &k, "so", "0123456789", 10);
        int reset = setrlimit(RLIMIT_FSIZE, &old);
        signal(SIGXFSZ, SIG_DFL);
        ck_assert_int_eq(set, 0);
        ck_assert_int_eq(reset, 0);
        ck_assert_int_eq(s, EM_OK);
        ck_assert_msg(strstr(l.text, "File too large"), "%s", l.text);
        ck_assert_msg(!exists(entry_path(&k, "so", false)), "a payload without its header");
        ck_assert(!exists(entry_path(&k, "so", true)));
        ck_assert_int_eq(count_files(cachedir), 0); /* no temporaries either */
        expect_hit(c, &k, "so", "0123456789", 10);
        kc_close(c);
    }
}
END_TEST

/* Item 5: an EMBER_CACHE_DIR too long to be a path is reported and never
 * becomes another location ($HOME/.cache/ember). */
START_TEST(unusable_cache_dir_variable_is_reported_not_replaced) {
    char home[128];
    snprintf(home, sizeof home, "%s/home", tmp);
    ck_assert_int_eq(mkdir(home, 0700), 0);
    setenv("HOME", home, 1);
    unsetenv("XDG_CACHE_HOME");
    size_t len = 5000;
    char *dir = malloc(len + 1);
    memset(dir, 'd', len);
    dir[0] = '/';
    dir[len] = '\0';
    setenv("EMBER_CACHE_DIR", dir, 1);
    logbuf l;
    kc_cache *c = open_logged(NULL, &l);
    ck_assert(!kc_on_disk(c));
    ck_assert_msg(strstr(l.text, "EMBER_CACHE_DIR") && strstr(l.text, "memory only"), "%s", l.text);
    kc_key k = key_of("x");
    ck_assert_int_eq(kc_put(c, &k, "ptx", payload, sizeof payload), EM_OK);
    kc_close(c);
    ck_assert_int_eq(count_files(home), 0);
    char def[256];
    snprintf(def, sizeof def, "%s/.cache", home);
    ck_assert(!exists(def));
    unsetenv("EMBER_CACHE_DIR");
    free(dir);
}
END_TEST

/* ---- allocation hook: fail the Nth allocation ---- */

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

/* Item 15: an allocation failure while the cache locates its directory
 * is reported as what it is (not "no cache directory", not an empty
 * reason), and a later call finds the directory. */
START_TEST(out_of_memory_locating_the_dir_is_reported_and_retried) {
    setenv("EMBER_CACHE_DIR", cachedir, 1);
    setenv("HOME", tmp, 1);
    bool completed = false;
    for (int n = 1; n < 200 && !completed; n++) {
        counting cnt = {0, n};
        em_allocator a = {count_alloc, count_free, &cnt};
        logbuf l;
        memset(&l, 0, sizeof l);
        kc_options o = {.log = log_to, .log_ud = &l};
        em_set_allocator(&a);
        kc_cache *c = kc_open_with(&o);
        em_set_allocator(NULL);
        completed = cnt.fail_at > cnt.allocs;
        cnt.fail_at = 0; /* the cache keeps allocating through a: no more failures */
        if (!c) {
            ck_assert_int_eq(em_last_status(), EM_ERR_NOMEM);
            continue;
        }
        ck_assert_msg(!strstr(l.text, "no cache directory"), "fail at %d: %s", n, l.text);
        ck_assert_msg(!strstr(l.text, "cache: : "), "fail at %d: %s", n, l.text);
        kc_key k = key_of("retry");
        ck_assert_int_eq(kc_put(c, &k, "ptx", payload, sizeof payload), EM_OK);
        ck_assert_msg(kc_on_disk(c), "fail at %d: still memory-only: %s", n, l.text);
        kc_close(c);
    }
    ck_assert(completed);
    unsetenv("EMBER_CACHE_DIR");
}
END_TEST

/* Item 17: a garbage EMBER_CACHE_MAX_SIZE, however long, is reported. */
START_TEST(garbage_max_size_is_reported) {
    char v[300];
    memset(v, 'x', sizeof v - 1);
    v[sizeof v - 1] = '\0';
    const char *values[] = {"lots", "12Q", v};
    for (int i = 0; i < 3; i++) {
        setenv("EMBER_CACHE_MAX_SIZE", values[i], 1);
        logbuf l;
        kc_cache *c = open_logged(cachedir, &l);
        ck_assert_msg(strstr(l.text, "ignoring EMBER_CACHE_MAX_SIZE"), "value %d: '%s'", i, l.text);
        kc_close(c);
    }
}
END_TEST

/* Claims (claim.c): one holder at a time across threads and processes,
 * a wait that ends when the holder releases or dies, BUSY when it
 * outlasts the wait, and none without a disk tier. */
static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

typedef struct claim_arg {
    kc_cache *c;
    kc_key k;
    int fd;
} claim_arg;

static void *release_later(void *p) {
    claim_arg *a = p;
    usleep(100 * 1000);
    kc_release(a->fd);
    return NULL;
}

START_TEST(claims_are_exclusive_and_end_with_their_holder) {
    kc_cache *c = kc_open(cachedir, 0);
    ck_assert(kc_on_disk(c));
    kc_key k = key_of("claimed"), other = key_of("other");
    int fd = -1, fd2 = -1;
    ck_assert_int_eq(kc_claim(c, &k, "so", 0, &fd), KC_CLAIM_OURS);
    ck_assert_int_ge(fd, 0);
    /* the same thread asking again is another holder: busy */
    ck_assert_int_eq(kc_claim(c, &k, "so", 0, &fd2), KC_CLAIM_BUSY);
    ck_assert_int_eq(fd2, -1);
    double t0 = mono();
    ck_assert_int_eq(kc_claim(c, &k, "so", 0.15, &fd2), KC_CLAIM_BUSY);
    ck_assert(mono() - t0 >= 0.14);
    /* other keys and other kinds are free */
    ck_assert_int_eq(kc_claim(c, &other, "so", 0, &fd2), KC_CLAIM_OURS);
    kc_release(fd2);
    ck_assert_int_eq(kc_claim(c, &k, "cubin", 0, &fd2), KC_CLAIM_OURS);
    kc_release(fd2);
    /* a wait ends when the holder releases */
    claim_arg a = {c, k, fd};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, release_later, &a), 0);
    t0 = mono();
    ck_assert_int_eq(kc_claim(c, &k, "so", 10, &fd2), KC_CLAIM_OURS);
    ck_assert(mono() - t0 < 5);
    pthread_join(th, NULL);
    /* another process sees the claim; it ends when that process dies */
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int cfd = -1;
        kc_cache *cc = kc_open(cachedir, 0);
        bool busy = kc_claim(cc, &k, "so", 0, &cfd) == KC_CLAIM_BUSY;
        bool ours = kc_claim(cc, &other, "so", 0, &cfd) == KC_CLAIM_OURS;
        char b = busy && ours ? 'y' : 'n';
        if (write(ready[1], &b, 1) != 1) _exit(2);
        pause(); /* holds `other` until killed */
        _exit(0);
    }
    char b = 0;
    ck_assert_int_eq(read(ready[0], &b, 1), 1);
    ck_assert_int_eq(b, 'y');
    kc_release(fd2);
    ck_assert_int_eq(kc_claim(c, &other, "so", 0, &fd), KC_CLAIM_BUSY);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    ck_assert_int_eq(kc_claim(c, &other, "so", 5, &fd), KC_CLAIM_OURS);
    kc_release(fd);
    close(ready[0]);
    close(ready[1]);
    /* lock files are not entries */
    kc_entry_info *list = NULL;
    size_t n = 99;
    ck_assert_int_eq(kc_list(c, &list, &n), EM_OK);
    ck_assert_uint_eq(n, 0);
    em_free(list);
    /* clear removes the lock files no claim holds */
    char locks[256];
    snprintf(locks, sizeof locks, "%s/v1/locks", cachedir);
    ck_assert_int_eq(count_files(locks), 3);
    ck_assert_int_eq(kc_claim(c, &k, "so", 0, &fd), KC_CLAIM_OURS);
    ck_assert_int_eq(kc_clear(c, NULL), EM_OK);
    ck_assert_int_eq(count_files(locks), 1);
    kc_release(fd);
    ck_assert_int_eq(kc_clear(c, NULL), EM_OK);
    ck_assert_int_eq(count_files(locks), 0);
    kc_close(c);
    /* memory only: no claims, and no error */
    c = kc_open(cachedir, KC_MEMORY_ONLY);
    ck_assert_int_eq(kc_claim(c, &k, "so", 1, &fd), KC_CLAIM_NONE);
    ck_assert_int_eq(fd, -1);
    kc_close(c);
    ck_assert_int_eq(kc_claim(NULL, &k, "so", 0, &fd), KC_CLAIM_NONE);
    kc_release(-1);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("cache");
    TCase *keys = tcase_create("keys");
    tcase_add_test(keys, hasher_same_material_same_key);
    tcase_add_test(keys, hasher_any_byte_changes_key);
    tcase_add_test(keys, hasher_includes_format_version);
    tcase_add_test(keys, parse_size);
    suite_add_tcase(s, keys);
    TCase *tc = tcase_create("store");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, put_get_bytes_round_trip);
    tcase_add_test(tc, put_get_file_round_trip);
    tcase_add_test(tc, memory_hit_then_disk_hit_in_new_object);
    tcase_add_test(tc, miss);
    tcase_add_test(tc, wrong_kind_misses);
    tcase_add_test(tc, corrupted_payload_misses);
    tcase_add_test(tc, truncated_payload_misses);
    tcase_add_test(tc, truncated_meta_misses);
    tcase_add_test(tc, header_mutations_never_give_wrong_bytes);
    tcase_add_test(tc, foreign_files_miss);
    tcase_add_test(tc, corrupt_entry_replaced_by_next_put);
    tcase_add_test(tc, two_processes_write_same_key);
    tcase_add_test(tc, one_object_shared_by_threads);
    tcase_add_test(tc, world_writable_dir_refused);
    tcase_add_test(tc, writable_entry_refused);
    tcase_add_test(tc, foreign_owner_refused);
    tcase_add_test(tc, unwritable_dir_memory_only);
    tcase_add_test(tc, disabled_by_environment);
    tcase_add_test(tc, directory_from_environment);
    tcase_add_test(tc, prune_evicts_least_recently_used);
    tcase_add_test(tc, prune_removes_debris);
    tcase_add_test(tc, size_limit_from_environment);
    tcase_add_test(tc, bad_arguments);
    tcase_add_test(tc, untrusted_fan_out_dir_refused);
    tcase_add_test(tc, get_fd_is_a_sealed_copy_of_the_verified_bytes);
    tcase_add_test(tc, directory_at_an_entry_name_is_replaced);
    tcase_add_test(tc, verify_and_remove_see_directories);
    tcase_add_test(tc, full_disk_leaves_no_half_written_entry);
    tcase_add_test(tc, unusable_cache_dir_variable_is_reported_not_replaced);
    tcase_add_test(tc, out_of_memory_locating_the_dir_is_reported_and_retried);
    tcase_add_test(tc, garbage_max_size_is_reported);
    tcase_add_test(tc, claims_are_exclusive_and_end_with_their_holder);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run(suite()); }
