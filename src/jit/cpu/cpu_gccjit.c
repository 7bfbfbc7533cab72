/* cpu_gccjit.c - the CPU code generator's entry points (see cpu_gccjit.h):
 * checking the IR, libgccjit contexts and their options, compiling in
 * process or to a shared object, loading, and running over threads.  The
 * code itself is emitted by cpu_gccjit_emit.c (loops, accumulators, the
 * plan function) and cpu_vmath_gccjit.c (scalar ops and the float32
 * approximations). */
#include "cpu_gccjit.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cpu_gccjit_impl.h"

/* Operations per parallel chunk below which a thread is not worth waking. */
#define GRAIN_WORK 65536.0

typedef int64_t (*plan_fn)(void *const *bufs, const int64_t *sizes, double *work);

struct jit_cpu_kernel {
    jit_cpu_fn fn;
    plan_fn plan;
    gcc_jit_result *result; /* in-process compile */
    void *dl;               /* load_so */
    const em_allocator *alloc;
};

/* ---- checks ---- */

/* The dtypes this generator implements; f16 and bf16 only as buffers, loads,
 * stores and conversions (kir_check_half_moved). */
#define CPU_DTYPES                                                                                 \
    (KIR_DTYPE(EM_F32) | KIR_DTYPE(EM_F64) | KIR_DTYPE(EM_I32) | KIR_DTYPE(EM_I64) |               \
     KIR_DTYPE(EM_BOOL) | KIR_DTYPE(EM_F16) | KIR_DTYPE(EM_BF16))

/* The IR's rules (kir_verify), then what this generator adds: a name that
 * fits its buffers, and its dtypes. */
static em_status check_kernel(const k_kernel *k) {
    if (!k) return em_error_null("jit_cpu_compile", "k");
    if (kir_verify(k) != EM_OK) return em_error_context("jit_cpu");
    if (strlen(k->name) > CG_MAX_NAME)
        return em_error(EM_ERR_ARG, "jit_cpu: kernel name longer than %d characters", CG_MAX_NAME);
    em_status s = kir_check_dtypes(k, CPU_DTYPES, "jit_cpu");
    return s == EM_OK ? kir_check_half_moved(k, "jit_cpu") : s;
}

/* ---- contexts ---- */

/* -march for the running CPU (gccjit rejects -march=native), unless
 * EMBER_JIT_MARCH names the level to generate for: compile workers get the
 * parent's, so that a worker's code runs where its parent runs (under
 * valgrind, which hides AVX-512, the two CPUs differ) and matches the
 * cache key the parent computed. */
static const char *march_option(void) {
    static const char *const levels[] = {"-march=x86-64-v4", "-march=x86-64-v3",
                                         "-march=x86-64-v2", "-march=x86-64"};
    char buf[64];
    const char *e = em_getenv("EMBER_JIT_MARCH", buf, sizeof buf);
    for (size_t i = 0; e && i < sizeof levels / sizeof levels[0]; i++)
        if (!strcmp(e, levels[i] + 7)) return levels[i];
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("x86-64-v4")) return "-march=x86-64-v4";
    if (__builtin_cpu_supports("x86-64-v3")) return "-march=x86-64-v3";
    if (__builtin_cpu_supports("x86-64-v2")) return "-march=x86-64-v2";
#endif
    return NULL;
}

/* Options besides -march and -O3 (what the code depends on: they are part
 * of jit_cpu_target).  No -ffast-math: vmath needs IEEE NaN, inf, -0.
 * No inlining but vmath's always-inline functions: a blocked loop's calls
 * to a function's NAME_blk copy (cpu_gccjit_emit.c) must stay calls, or
 * each would bring its own vectorized and scalar loop back (measured: a
 * kernel of 13 tanh compiled in 0.2 s instead of 0.5 s). */
static const char *const CODE_OPTIONS[] = {"-fno-math-errno", "-fno-trapping-math",
                                           "-fno-inline-functions", "-fno-inline-small-functions",
                                           "-fno-inline-functions-called-once"};
/* Bumped when the generated code changes for the same kernel IR (cached
 * shared objects of older generators are then not reused). */
#define CODEGEN_VERSION 6

static gcc_jit_context *new_context(void) {
    gcc_jit_context *ctx = gcc_jit_context_acquire();
    if (!ctx) return NULL;
    gcc_jit_context_set_int_option(ctx, GCC_JIT_INT_OPTION_OPTIMIZATION_LEVEL, 3);
    gcc_jit_context_set_bool_print_errors_to_stderr(ctx, 0);
    gcc_jit_context_set_bool_allow_unreachable_blocks(ctx, 1);
    const char *march = march_option();
    if (march) gcc_jit_context_add_command_line_option(ctx, march);
    for (size_t i = 0; i < sizeof CODE_OPTIONS / sizeof CODE_OPTIONS[0]; i++)
        gcc_jit_context_add_command_line_option(ctx, CODE_OPTIONS[i]);
    /* no crt files or default libraries: the kernel needs none (libm is
     * added when it calls libm), and linking is faster */
    gcc_jit_context_add_driver_option(ctx, "-nostdlib");
    return ctx;
}

static em_status gccjit_error(gcc_jit_context *ctx, const char *what, const char *name) {
    const char *e = gcc_jit_context_get_first_error(ctx);
    return em_error(EM_ERR_STATE, "jit_cpu: %s of kernel %s failed: %s", what, name,
                    e ? e : "libgccjit reported no error message");
}

static void plan_name(const char *name, char *out, size_t n) {
    snprintf(out, n, "%s" CG_PLAN_SUFFIX, name);
}

#define KEY_SUFFIX "__key"

static void key_name(const char *name, char *out, size_t n) {
    snprintf(out, n, "%s" KEY_SUFFIX, name);
}

/* const unsigned char NAME__key[16] = {the key's bytes}, exported: what a
 * loader compares with the key it looked the object up by. */
static void emit_key(gcc_jit_context *ctx, const char *name, const kc_key *key) {
    char kname[CG_MAX_NAME + sizeof KEY_SUFFIX];
    key_name(name, kname, sizeof kname);
    gcc_jit_type *u8 = gcc_jit_type_get_const(gcc_jit_context_get_type(ctx, GCC_JIT_TYPE_UNSIGNED_CHAR));
    gcc_jit_type *arr = gcc_jit_context_new_array_type(ctx, NULL, u8, (int)sizeof key->bytes);
    gcc_jit_lvalue *g = gcc_jit_context_new_global(ctx, NULL, GCC_JIT_GLOBAL_EXPORTED, arr, kname);
    if (g) gcc_jit_global_set_initializer(g, key->bytes, sizeof key->bytes);
}

bool jit_cpu_kernel_key(const k_kernel *k, kc_key *key, kc_manifest *m) {
    char *text = kir_to_text(k);
    if (!text) return false;
    kc_fields fl;
    kc_fields_begin(&fl, m);
    kc_fields_str(&fl, "what", "ember cpu kernel");
    /* "libgccjit X.Y.Z codegen N -march=... options": the compiler's
     * version, the generator's, the CPU level and the code options */
    kc_fields_str(&fl, "target", jit_cpu_target());
    kc_fields_str(&fl, "kernel_ir", text);
    *key = kc_fields_digest(&fl);
    em_free(text);
    return true;
}

void jit_cpu_symbol(const kc_key *key, char out[JIT_CPU_SYMBOL_SIZE]) {
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(key, hex);
    snprintf(out, JIT_CPU_SYMBOL_SIZE, "k_%s", hex);
}

/* Checks ks[0..n) and populates a new context with their functions, one
 * context for all (a compile unit: libgccjit's fixed cost per context,
 * ~30 ms of the assembler and the linker, is paid once).  Each kernel is
 * named syms[i], or with keys by its key (jit_cpu_symbol) and then
 * carries NAME__key too. */
static em_status gen(k_kernel *const *ks, const char *const *syms, const kc_key *keys, int n,
                     gcc_jit_context **out) {
    *out = NULL;
    em_status s = EM_OK;
    for (int i = 0; i < n && s == EM_OK; i++) s = check_kernel(ks[i]);
    if (s != EM_OK) return s;
    gcc_jit_context *ctx = new_context();
    if (!ctx) return em_error(EM_ERR_NOMEM, "jit_cpu: gcc_jit_context_acquire failed");
    cg_lib lib = {0};
    for (int i = 0; i < n && s == EM_OK; i++) {
        char sym[JIT_CPU_SYMBOL_SIZE];
        if (keys) jit_cpu_symbol(&keys[i], sym);
        s = cg_emit_kernel(ctx, &lib, ks[i], keys ? sym : syms[i]);
        if (s == EM_OK && keys) emit_key(ctx, sym, &keys[i]);
        if (s == EM_OK && gcc_jit_context_get_first_error(ctx))
            s = gccjit_error(ctx, "code generation", ks[i]->name);
    }
    if (s == EM_OK && lib.uses_libm) gcc_jit_context_add_driver_option(ctx, "-lm");
    if (s != EM_OK)
        gcc_jit_context_release(ctx);
    else
        *out = ctx;
    return s;
}

static em_status make_kernel(jit_cpu_fn fn, plan_fn plan, gcc_jit_result *res, void *dl,
                             jit_cpu_kernel **out) {
    jit_cpu_kernel *ck = em_calloc(1, sizeof *ck);
    if (!ck) return em_last_status();
    ck->fn = fn;
    ck->plan = plan;
    ck->result = res;
    ck->dl = dl;
    ck->alloc = em_get_allocator();
    *out = ck;
    return EM_OK;
}

em_status jit_cpu_compile(const k_kernel *k, jit_cpu_kernel **out) {
    if (!out) return em_error_null("jit_cpu_compile", "out");
    *out = NULL;
    if (!k) return check_kernel(k);
    gcc_jit_context *ctx;
    k_kernel *const ks[1] = {(k_kernel *)k};
    const char *const syms[1] = {k->name};
    em_status s = gen(ks, syms, NULL, 1, &ctx);
    if (s != EM_OK) return s;
    em_env_lock(true); /* the driver calls putenv (env.c) */
    gcc_jit_result *res = gcc_jit_context_compile(ctx);
    em_env_unlock();
    if (!res) {
        s = gccjit_error(ctx, "compilation", k->name);
        gcc_jit_context_release(ctx);
        return s;
    }
    gcc_jit_context_release(ctx);
    char pname[CG_MAX_NAME + sizeof CG_PLAN_SUFFIX];
    plan_name(k->name, pname, sizeof pname);
    jit_cpu_fn fn = (jit_cpu_fn)gcc_jit_result_get_code(res, k->name);
    plan_fn plan = (plan_fn)gcc_jit_result_get_code(res, pname);
    if (!fn || !plan)
        s = em_error(EM_ERR_STATE, "jit_cpu: %s: compiled code lacks its functions", k->name);
    else
        s = make_kernel(fn, plan, res, NULL, out);
    if (s != EM_OK) gcc_jit_result_release(res);
    return s;
}

/* Compiles the context to a shared object at path. */
static em_status write_context(gcc_jit_context *ctx, const char *path, const char *first) {
    em_env_lock(true); /* the driver calls putenv (env.c) */
    gcc_jit_context_compile_to_file(ctx, GCC_JIT_OUTPUT_KIND_DYNAMIC_LIBRARY, path);
    em_env_unlock();
    em_status s = EM_OK;
    if (gcc_jit_context_get_first_error(ctx)) s = gccjit_error(ctx, "compilation to a file", first);
    gcc_jit_context_release(ctx);
    return s;
}

em_status jit_cpu_write_so(const k_kernel *k, const char *path) {
    if (!path) return em_error_null("jit_cpu_write_so", "path");
    if (!k) return check_kernel(k);
    kc_key key;
    if (!jit_cpu_kernel_key(k, &key, NULL)) return em_error(EM_ERR_NOMEM, "jit_cpu_write_so: out of memory");
    /* named k->name, with NAME__key: gen's keyed naming, by hand */
    gcc_jit_context *ctx;
    k_kernel *const ks[1] = {(k_kernel *)k};
    const char *const syms[1] = {k->name};
    em_status s = gen(ks, syms, NULL, 1, &ctx);
    if (s != EM_OK) return s;
    emit_key(ctx, k->name, &key);
    return write_context(ctx, path, k->name);
}

em_status jit_cpu_write_unit(k_kernel *const *ks, int n, const char *path) {
    if (!path) return em_error_null("jit_cpu_write_unit", "path");
    if (!ks) return em_error_null("jit_cpu_write_unit", "ks");
    if (n < 1 || n > JIT_CPU_UNIT_MAX)
        return em_error(EM_ERR_ARG, "jit_cpu_write_unit: %d kernels (1 to %d)", n, JIT_CPU_UNIT_MAX);
    kc_key keys[JIT_CPU_UNIT_MAX];
    for (int i = 0; i < n; i++) {
        if (!ks[i]) return check_kernel(ks[i]);
        if (!jit_cpu_kernel_key(ks[i], &keys[i], NULL))
            return em_error(EM_ERR_NOMEM, "jit_cpu_write_unit: out of memory");
    }
    gcc_jit_context *ctx;
    em_status s = gen(ks, NULL, keys, n, &ctx);
    return s == EM_OK ? write_context(ctx, path, ks[0]->name) : s;
}

em_status jit_cpu_load_so(const char *path, const char *name, jit_cpu_kernel **out) {
    if (!out) return em_error_null("jit_cpu_load_so", "out");
    *out = NULL;
    if (!path) return em_error_null("jit_cpu_load_so", "path");
    if (!name) return em_error_null("jit_cpu_load_so", "name");
    if (strlen(name) > CG_MAX_NAME)
        return em_error(EM_ERR_ARG, "jit_cpu_load_so: kernel name too long");
    void *dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *e = dlerror();
        return em_error(EM_ERR_ARG, "jit_cpu_load_so: %s", e ? e : path);
    }
    char pname[CG_MAX_NAME + sizeof CG_PLAN_SUFFIX];
    plan_name(name, pname, sizeof pname);
    jit_cpu_fn fn;
    plan_fn plan;
    /* POSIX's way of turning a dlsym result into a function pointer */
    void *f = dlsym(dl, name), *p = dlsym(dl, pname);
    memcpy(&fn, &f, sizeof fn);
    memcpy(&plan, &p, sizeof plan);
    em_status s;
    if (!f || !p)
        s = em_error(EM_ERR_ARG, "jit_cpu_load_so: %s has no kernel %s", path, name);
    else
        s = make_kernel(fn, plan, NULL, dl, out);
    if (s != EM_OK) dlclose(dl);
    return s;
}

/* "/proc/self/fd/N" for fd, made unique to the open file.  glibc's dlopen
 * returns an already loaded object whose name equals the one asked for,
 * and fd numbers are reused as soon as they are closed: two different
 * memory files both opened as "/proc/self/fd/5" would give the first
 * one's code.  So the name also spells the file's inode number (pinned
 * while an object mapped from it is loaded), as no-op "." components
 * followed by 1 to 10 slashes per decimal digit: a distinct file, a
 * distinct name.  (The key check after loading would catch a reuse
 * anyway; this keeps it from turning every load into a miss.) */
static bool fd_path(int fd, char *buf, size_t n) {
    struct stat st;
    if (fstat(fd, &st) != 0) return false;
    char digits[24];
    int nd = snprintf(digits, sizeof digits, "%llu", (unsigned long long)st.st_ino);
    size_t at = (size_t)snprintf(buf, n, "/proc/self/fd/");
    for (int i = 0; i < nd && at + 12 < n; i++) {
        buf[at++] = '.';
        for (int j = 0; j <= digits[i] - '0'; j++) buf[at++] = '/';
    }
    return at + 24 < n && snprintf(buf + at, n - at, "%d", fd) > 0;
}

/* Whether the loaded object dl carries NAME__key equal to key. */
static bool key_matches(void *dl, const char *name, const kc_key *key) {
    char kname[CG_MAX_NAME + sizeof KEY_SUFFIX];
    key_name(name, kname, sizeof kname);
    const unsigned char *got = dlsym(dl, kname);
    return got && memcmp(got, key->bytes, sizeof key->bytes) == 0;
}

em_status jit_cpu_load_fd(int fd, const kc_key *key, jit_cpu_kernel **out) {
    if (!out) return em_error_null("jit_cpu_load_fd", "out");
    *out = NULL;
    if (!key) return em_error_null("jit_cpu_load_fd", "key");
    char name[JIT_CPU_SYMBOL_SIZE];
    jit_cpu_symbol(key, name);
    char path[320];
    if (fd < 0 || !fd_path(fd, path, sizeof path))
        return em_error(EM_ERR_ARG, "jit_cpu_load_fd: bad file descriptor %d", fd);
    em_status s = jit_cpu_load_so(path, name, out);
    if (s != EM_OK) return s;
    if (key_matches((*out)->dl, name, key)) return EM_OK;
    jit_cpu_free(*out);
    *out = NULL;
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(key, hex);
    return em_error(EM_ERR_STATE, "jit_cpu_load_fd: the shared object filed under %s was "
                    "compiled for another key (or carries none): not loaded", hex);
}

void jit_cpu_free(jit_cpu_kernel *ck) {
    if (!ck) return;
    if (ck->result) gcc_jit_result_release(ck->result);
    if (ck->dl) dlclose(ck->dl);
    em_free_with(ck->alloc, ck);
}

jit_cpu_fn jit_cpu_entry(const jit_cpu_kernel *ck) { return ck ? ck->fn : NULL; }

/* ---- running ---- */

typedef struct run_ctx {
    const jit_cpu_kernel *ck;
    void *const *bufs;
    const int64_t *sizes;
    int64_t n, nchunks; /* run_chunks: chunk c is [n c / nchunks, n (c+1) / nchunks) */
} run_ctx;

static void run_range(void *p, int64_t begin, int64_t end) {
    const run_ctx *rc = p;
    rc->ck->fn(rc->bufs, rc->sizes, begin, end);
}

static void run_chunk_range(void *p, int64_t c0, int64_t c1) {
    const run_ctx *rc = p;
    for (int64_t c = c0; c < c1; c++)
        rc->ck->fn(rc->bufs, rc->sizes, rc->n * c / rc->nchunks, rc->n * (c + 1) / rc->nchunks);
}

em_status jit_cpu_run(const jit_cpu_kernel *ck, void *const *bufs, const int64_t *sizes) {
    if (!ck) return em_error_null("jit_cpu_run", "ck");
    double work = 0;
    int64_t n = ck->plan(bufs, sizes, &work);
    if (n < 0) {
        ck->fn(bufs, sizes, 0, INT64_MAX);
        return EM_OK;
    }
    double g = GRAIN_WORK / (work > 1 ? work : 1);
    int64_t grain = g >= (double)n ? n : (int64_t)ceil(g);
    run_ctx rc = {ck, bufs, sizes, n, 1};
    em_parallel_for(n, grain, run_range, &rc);
    return EM_OK;
}

em_status jit_cpu_run_chunks(const jit_cpu_kernel *ck, void *const *bufs, const int64_t *sizes,
                             int nchunks) {
    if (!ck) return em_error_null("jit_cpu_run_chunks", "ck");
    if (nchunks < 1) return em_error(EM_ERR_ARG, "jit_cpu_run_chunks: %d chunks", nchunks);
    double work = 0;
    int64_t n = ck->plan(bufs, sizes, &work);
    if (n < 0) {
        ck->fn(bufs, sizes, 0, INT64_MAX);
        return EM_OK;
    }
    run_ctx rc = {ck, bufs, sizes, n, nchunks};
    em_parallel_for(nchunks, 1, run_chunk_range, &rc);
    return EM_OK;
}

const char *jit_cpu_march(void) {
    const char *m = march_option();
    return m ? m + 7 : "";
}

const char *jit_cpu_target(void) {
    static _Thread_local char buf[160];
    const char *march = march_option();
    int n = snprintf(buf, sizeof buf, "libgccjit %d.%d.%d codegen %d %s -O3",
                     gcc_jit_version_major(), gcc_jit_version_minor(), gcc_jit_version_patchlevel(),
                     CODEGEN_VERSION, march ? march : "-march=default");
    for (size_t i = 0; i < sizeof CODE_OPTIONS / sizeof CODE_OPTIONS[0]; i++)
        if (n > 0 && (size_t)n < sizeof buf)
            n += snprintf(buf + n, sizeof buf - (size_t)n, " %s", CODE_OPTIONS[i]);
    return buf;
}
