/* cpu_blas.c - the GEMM libraries CPU matmuls run on, chosen once per
 * process at the first matmul (blas_load), and the two calls the rest of
 * Ember makes: em_sgemm and em_dgemm (row-major, one thread each: Ember's
 * pool splits the work).
 *
 * f32 products run on oneDNN's sgemm where it loads and auto chooses it
 * (em_blas_choose_onednn: AVX-512, or AVX2 with no native cblas core) or
 * EMBER_BLAS=onednn asks: it generates its kernels at run time for the ISA
 * cpuid reports (AVX2, AVX-512, AMX), so it never runs a generic core, and
 * on the 2-core Xeon it ran 1.1-1.3x OpenBLAS's SkylakeX kernels per
 * thread on the shapes of MiniLM, GPT-2 and the benchmark; on an AVX2 AMD
 * EPYC its wide products ran at half OpenBLAS's Zen kernels' rate
 * (bench/bench_blas, docs/benchmarks.md).  Products of at most 64^3
 * multiply-adds (attention's per-head tiles) stay on the cblas library,
 * whose small-matrix kernels were up to 2x oneDNN's there; so do f64
 * products (oneDNN has no dgemm).  The cblas library is OpenBLAS, or BLIS
 * where OpenBLAS would run a generic core below the CPU (em_blas_choose). */
#include "config.h" /* EMBER_OPENBLAS_SONAME */
#include "cpu.h"

#include <cblas.h> /* types and prototypes only: the libraries are dlopen'ed */
#include <dlfcn.h>
#include <pthread.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/resource.h>
#ifdef HAVE_VALGRIND_VALGRIND_H
#include <valgrind/valgrind.h> /* RUNNING_ON_VALGRIND: a no-op outside valgrind */
#endif

/* OpenBLAS is loaded with dlopen at the first matmul, not linked, because
 * its library constructor starts a thread pool (cores - 1 threads) and each
 * of those threads first allocates a ~128 MiB buffer, retrying forever when
 * that fails.  Under ulimit -v (RLIMIT_AS) of 150-250 MB a pool thread
 * spun from the program's start, and its exit hung: OpenBLAS's destructor
 * (gotoblas_quit -> blas_thread_shutdown_) joins the pool, and a thread
 * looks for the shutdown request only after its buffer came (seen with gdb;
 * blas_thread_server and blas_memory_alloc, OpenBLAS 0.3.21).  A fork
 * (pthread_atfork runs the same shutdown) would hang the same way.  Nothing
 * run after the constructor can stop that: openblas_set_num_threads(1) does
 * not end threads, and the join waits for them.  Loaded by Ember, the
 * pool's size is chosen before it exists (blas_open). */
#ifndef EMBER_OPENBLAS_SONAME
#define EMBER_OPENBLAS_SONAME "libopenblas.so.0"
#endif

/* BLIS (Debian's libblis4-serial: single-threaded, so that it runs inside
 * Ember's pool as OpenBLAS does) picks its kernels at run time from cpuid
 * and knows CPUs that Debian 12's OpenBLAS does not (bench/bench_blas). */
static const char *const blis_paths[] = {
    "libblis.so.4",
#if defined(__x86_64__)
    "/usr/lib/x86_64-linux-gnu/blis-serial/libblis.so.4",
#elif defined(__aarch64__)
    "/usr/lib/aarch64-linux-gnu/blis-serial/libblis.so.4",
#endif
};

/* The process's BLAS, set once by blas_load (blas_once) and read-only
 * after: one library per process, as the loader gives it. */
static __typeof__(cblas_sgemm) *blas_sgemm;
static __typeof__(cblas_dgemm) *blas_dgemm;
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static bool blas_ok; /* a BLAS loaded and usable: else the plain loops below */
static em_blas_lib blas_lib;
static char blas_kernels[128]; /* the core or arch it runs */

static bool address_space_limited(void) {
    struct rlimit r;
    return getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY;
}

/* OpenBLAS also takes a buffer of ~128 MiB per thread that calls it, on
 * that thread's first call, with the same endless retry: a matmul hung
 * instead of failing.  Under a limit on the address space, the first
 * matmul checks that a buffer for each of Ember's threads can be had (a
 * reservation that uses no memory); if not, every matmul of the process
 * runs the plain loops (same values, slower). */
#define BLAS_BUFFER ((size_t)160 << 20)
static bool blas_headroom(void) {
    size_t n = BLAS_BUFFER * (size_t)em_num_threads();
    void *p = mmap(NULL, n, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return false;
    munmap(p, n);
    return true;
}

/* Opens OpenBLAS.  Under an address-space limit the calling thread is
 * pinned to one of its CPUs meanwhile (and then given its mask back):
 * OpenBLAS sizes its pool from the loading thread's affinity
 * (get_num_procs), so it starts no thread, whose buffer would not fit.
 * Affinity is per thread, so no other thread sees it (setting
 * OPENBLAS_NUM_THREADS instead would change the environment under other
 * threads' getenv).  If the mask cannot be set, OpenBLAS is not loaded. */
static void *blas_open(bool limited) {
    int flags = RTLD_NOW | RTLD_LOCAL;
    if (!limited) return dlopen(EMBER_OPENBLAS_SONAME, flags);
    cpu_set_t old, one;
    if (sched_getaffinity(0, sizeof old, &old) != 0) return NULL;
    CPU_ZERO(&one);
    for (int i = 0; i < CPU_SETSIZE; i++)
        if (CPU_ISSET(i, &old)) {
            CPU_SET(i, &one);
            break;
        }
    if (sched_setaffinity(0, sizeof one, &one) != 0) return NULL;
    void *h = dlopen(EMBER_OPENBLAS_SONAME, flags);
    sched_setaffinity(0, sizeof old, &old);
    return h;
}

/* ---- the core OpenBLAS chose ----
 * Debian 12's OpenBLAS 0.3.21 does not know some current CPUs (a Xeon with
 * AVX-512 and AMX, the H200 machine's host) and falls back to its generic
 * Prescott (SSE3) kernels: 15-20 GFLOP/s for an sgemm that runs at 110-140
 * with OPENBLAS_CORETYPE=SkylakeX.  The core is chosen in OpenBLAS's
 * constructor from cpuid and that variable; once loaded it cannot be
 * changed (and setting the variable here would change the environment
 * under other threads' getenv), so Ember says so, once, and how to fix it. */

static const struct {
    const char *name;
    em_isa isa;
} blas_cores[] = {
    {"SapphireRapids", EM_ISA_AVX512}, {"Cooperlake", EM_ISA_AVX512}, {"SkylakeX", EM_ISA_AVX512},
    {"Haswell", EM_ISA_AVX2},          {"Zen", EM_ISA_AVX2},          {"Excavator", EM_ISA_AVX2},
    {"Sandybridge", EM_ISA_AVX},       {"Bulldozer", EM_ISA_AVX},     {"Piledriver", EM_ISA_AVX},
    {"Steamroller", EM_ISA_AVX},
};

em_isa em_blas_core_isa(const char *core) {
    for (size_t i = 0; core && i < sizeof blas_cores / sizeof blas_cores[0]; i++)
        if (!strcasecmp(core, blas_cores[i].name)) return blas_cores[i].isa;
    return EM_ISA_SSE;
}

em_isa em_cpu_isa(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
        return EM_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return EM_ISA_AVX2;
    return __builtin_cpu_supports("avx") ? EM_ISA_AVX : EM_ISA_SSE;
}

bool em_blas_core_warning(const char *core, em_isa cpu, char *buf, size_t n) {
    static const char *const isa_names[] = {"SSE", "AVX", "AVX2", "AVX-512"};
    em_isa have = em_blas_core_isa(core);
    if (cpu < EM_ISA_AVX2 || have >= EM_ISA_AVX2) return false;
    snprintf(buf, n, "matmul: OpenBLAS runs its '%s' kernels (%s) on a CPU with %s: it does not "
             "know this CPU, and every matmul runs several times slower than it could; set "
             "OPENBLAS_CORETYPE=%s in the environment", core && *core ? core : "unknown",
             isa_names[have], isa_names[cpu], cpu == EM_ISA_AVX512 ? "SkylakeX" : "Haswell");
    return true;
}

em_blas_lib em_blas_choose(const char *want, const char *core, bool coretype_set, em_isa cpu,
                           bool have_blis, char *msg, size_t n) {
    msg[0] = '\0';
    bool blis = want && !strcmp(want, "blis"), openblas = want && !strcmp(want, "openblas");
    if (want && *want && !blis && !openblas && strcmp(want, "auto") && strcmp(want, "onednn"))
        snprintf(msg, n, "EMBER_BLAS=%s is not auto, onednn, openblas or blis: using auto", want);
    if (blis && have_blis) return EM_BLAS_BLIS;
    if (blis) snprintf(msg, n, "EMBER_BLAS=blis: BLIS (libblis.so.4) does not load: using %s",
                       core ? "OpenBLAS" : "plain loops");
    if (!core) return have_blis && !openblas ? EM_BLAS_BLIS : EM_BLAS_NONE;
    char why[384];
    if (openblas || blis || coretype_set || !em_blas_core_warning(core, cpu, why, sizeof why))
        return EM_BLAS_OPENBLAS;
    if (have_blis) {
        snprintf(msg, n, "matmul: OpenBLAS would run its generic '%s' kernels on this CPU: "
                 "using BLIS instead (EMBER_BLAS=openblas keeps OpenBLAS)", core);
        return EM_BLAS_BLIS;
    }
    snprintf(msg, n, "%s, or install BLIS (libblis4-serial), which Ember then uses", why);
    return EM_BLAS_OPENBLAS;
}

bool em_blas_choose_onednn(const char *want, em_isa cpu, bool cblas_native, bool have_onednn,
                           char *msg, size_t n) {
    bool asked = want && !strcmp(want, "onednn");
    if (want && *want && !asked && strcmp(want, "auto")) return false; /* openblas, blis */
    if (asked && !have_onednn)
        snprintf(msg, n, "EMBER_BLAS=onednn: oneDNN (libdnnl.so, Debian's libdnnl2) does not load: "
                 "using the cblas library");
    return have_onednn &&
           (asked || cpu >= EM_ISA_AVX512 || (cpu >= EM_ISA_AVX2 && !cblas_native));
}

/* Says msg once (stderr, or EMBER_LOG_FILE's file). */
static void blas_say(const char *msg) {
    char buf[EM_ENV_MAX];
    if (!msg[0]) return;
    const char *file = em_getenv("EMBER_LOG_FILE", buf, sizeof buf);
    FILE *f = file && *file ? fopen(file, "a") : NULL;
    fprintf(f ? f : stderr, "[ember] %s\n", msg);
    if (f) fclose(f);
}

/* BLIS, from the first of blis_paths that loads and has both gemms. */
static void *blis_open(void) {
    for (size_t i = 0; i < sizeof blis_paths / sizeof *blis_paths; i++) {
        void *h = dlopen(blis_paths[i], RTLD_NOW | RTLD_LOCAL);
        if (h && dlsym(h, "cblas_sgemm") && dlsym(h, "cblas_dgemm")) return h;
        if (h) dlclose(h);
    }
    return NULL;
}

/* The kernel set BLIS chose (bli_arch_string of bli_arch_query_id). */
static void blis_arch(void *h, char *buf, size_t n) {
    int (*id)(void) = (int (*)(void))dlsym(h, "bli_arch_query_id");
    const char *(*name)(int) = (const char *(*)(int))dlsym(h, "bli_arch_string");
    snprintf(buf, n, "%s", id && name ? name(id()) : "unknown");
}

/* ---- oneDNN ----
 * Its sgemm is row-major (dnnl_dim_t is int64_t) and returns a status.
 * Debian builds it on OpenMP: a call runs on omp_get_max_threads()
 * threads of libgomp's own pool, a second pool on Ember's cores.  Each
 * call therefore sets the calling thread's OpenMP thread count to 1 and
 * gives it back after (a per-thread setting: the program's own OpenMP
 * code never sees it), so oneDNN runs on the thread that called it, as
 * the cblas library does. */
typedef int dnnl_sgemm_fn(char, char, int64_t, int64_t, int64_t, float, const float *, int64_t,
                          const float *, int64_t, float, float *, int64_t);
static const char *const onednn_paths[] = {"libdnnl.so.3", "libdnnl.so.2"};
typedef int dnnl_bf16gemm_fn(char, char, int64_t, int64_t, int64_t, float, const uint16_t *,
                             int64_t, const uint16_t *, int64_t, float, float *, int64_t);
static dnnl_sgemm_fn *onednn_sgemm; /* NULL: f32 on the cblas library */
/* NULL: bf16 products convert their operands to f32 (cpu_matmul.c) */
static dnnl_bf16gemm_fn *onednn_bf16gemm;
static void (*omp_set_threads)(int);
static int (*omp_max_threads)(void);

/* oneDNN, from the first of onednn_paths that loads and has dnnl_sgemm
 * and libgomp's two calls (linked by it, so found through its handle). */
static void *onednn_open(void) {
    for (size_t i = 0; i < sizeof onednn_paths / sizeof *onednn_paths; i++) {
        void *h = dlopen(onednn_paths[i], RTLD_NOW | RTLD_LOCAL);
        if (h && dlsym(h, "dnnl_sgemm") && dlsym(h, "omp_set_num_threads") &&
            dlsym(h, "omp_get_max_threads"))
            return h;
        if (h) dlclose(h);
    }
    return NULL;
}

/* Whether LeakSanitizer runs in this process (a program built with
 * -fsanitize=address): its exit-time scan crashes (SIGSEGV in its tracer)
 * on the thread-local storage oneDNN and libgomp give Ember's pool threads,
 * as it does on BLIS's, so auto leaves oneDNN out there. */
static bool leak_sanitizer(void) { return dlsym(RTLD_DEFAULT, "__lsan_do_leak_check") != NULL; }

/* Whether the process runs under valgrind, whose memcheck reports reads of
 * uninitialised values inside oneDNN's JIT-generated kernels and its own
 * code (its sgemm on operands that OpenBLAS multiplies without a report):
 * auto leaves oneDNN out there too, so that valgrind checks Ember's code. */
static bool under_valgrind(void) {
#ifdef RUNNING_ON_VALGRIND
    return RUNNING_ON_VALGRIND != 0;
#else
    return false;
#endif
}

/* Whether oneDNN's bf16 gemm runs on this CPU: it has kernels from
 * AVX-512 on (AVX512-BF16 and AMX natively) and answers dnnl_unimplemented
 * (3) below, so one 1x1x1 product tells, once. */
static bool bf16gemm_works(dnnl_bf16gemm_fn *f) {
    const uint16_t one = 0x3f80; /* 1.0 */
    float c = 0;
    int threads = omp_max_threads();
    omp_set_threads(1);
    int st = f('N', 'N', 1, 1, 1, 1.0f, &one, 1, &one, 1, 0.0f, &c, 1);
    omp_set_threads(threads);
    return st == 0 && c == 1.0f;
}

static void onednn_use(void *h) {
    onednn_sgemm = (dnnl_sgemm_fn *)dlsym(h, "dnnl_sgemm");
    omp_set_threads = (void (*)(int))dlsym(h, "omp_set_num_threads");
    omp_max_threads = (int (*)(void))dlsym(h, "omp_get_max_threads");
    dnnl_bf16gemm_fn *bf = (dnnl_bf16gemm_fn *)dlsym(h, "dnnl_gemm_bf16bf16f32");
    onednn_bf16gemm = bf && bf16gemm_works(bf) ? bf : NULL;
}

/* Plain loops for a product no library could run (oneDNN out of memory
 * and no cblas library): the same product, slower.  LOAD reads an operand
 * element as float. */
#define GEMM_LOOPS(NAME, T, LOAD)                                                            \
    static void NAME(bool ta, bool tb, int m, int n, int k, float alpha, const T *a, int lda, \
                     const T *b, int ldb, float beta, float *c, int ldc) {                   \
        for (int i = 0; i < m; i++)                                                          \
            for (int j = 0; j < n; j++) {                                                    \
                float acc = 0;                                                               \
                for (int p = 0; p < k; p++)                                                  \
                    acc += LOAD(ta ? a[(int64_t)p * lda + i] : a[(int64_t)i * lda + p]) *    \
                           LOAD(tb ? b[(int64_t)j * ldb + p] : b[(int64_t)p * ldb + j]);     \
                float *cij = c + (int64_t)i * ldc + j;                                       \
                *cij = alpha * acc + (beta == 0.0f ? 0.0f : beta * *cij);                    \
            }                                                                                \
    }
#define AS_FLOAT(x) (x)
GEMM_LOOPS(sgemm_loops, float, AS_FLOAT)
GEMM_LOOPS(bf16gemm_loops, uint16_t, em_bf16_to_float)

static void blas_use(void *h, em_blas_lib lib) {
    blas_sgemm = (__typeof__(cblas_sgemm) *)dlsym(h, "cblas_sgemm");
    blas_dgemm = (__typeof__(cblas_dgemm) *)dlsym(h, "cblas_dgemm");
    blas_lib = blas_sgemm && blas_dgemm ? lib : EM_BLAS_NONE;
}

static void blas_load(void);

em_blas_lib em_blas_in_use(char *buf, size_t n) {
    pthread_once(&blas_once, blas_load);
    if (n) snprintf(buf, n, "%s", blas_ok ? blas_kernels : "");
    return !blas_ok ? EM_BLAS_NONE : onednn_sgemm ? EM_BLAS_ONEDNN : blas_lib;
}

/* Once per process, before the first gemm.  When the program itself links
 * OpenBLAS (RTLD_NOLOAD finds it) its pool runs already, as before; under
 * a limit it then needs OPENBLAS_NUM_THREADS=1 (docs/compile.md). The
 * handle is never closed: OpenBLAS's destructor runs at exit. */
static void blas_load(void) {
    bool limited = address_space_limited();
    void *h = dlopen(EMBER_OPENBLAS_SONAME, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h) h = blas_open(limited);
    char *(*corename)(void) = h ? (char *(*)(void))dlsym(h, "openblas_get_corename") : NULL;
    void (*set_threads)(int) = h ? (void (*)(int))dlsym(h, "openblas_set_num_threads") : NULL;
    /* OpenBLAS runs single-threaded inside Ember's pool: two pools on the
     * same cores (OpenBLAS's workers spin with sched_yield after each
     * call) made every fused kernel that followed a matmul wait a
     * scheduler slice for a descheduled worker (MiniLM compiled: 1.3 s a
     * batch instead of 18 ms). */
    if (set_threads) set_threads(1);
    const char *core = h ? (corename ? corename() : "unknown") : NULL;
    char want[EM_ENV_MAX], ct[EM_ENV_MAX], msg[512];
    const char *w = em_getenv("EMBER_BLAS", want, sizeof want);
    bool coretype = em_getenv("OPENBLAS_CORETYPE", ct, sizeof ct) != NULL;
    /* BLIS is opened only where it may be chosen: an OpenBLAS that runs
     * well never pays for a second library */
    bool may_blis = !h || (w && !strcmp(w, "blis")) ||
                    (!(w && !strcmp(w, "openblas")) && !coretype &&
                     em_blas_core_warning(core, em_cpu_isa(), msg, sizeof msg));
    void *blis = may_blis ? blis_open() : NULL;
    em_blas_lib lib = em_blas_choose(w, core, coretype, em_cpu_isa(), blis != NULL, msg, sizeof msg);
    if (lib == EM_BLAS_BLIS) {
        blas_use(blis, EM_BLAS_BLIS);
        blis_arch(blis, blas_kernels, sizeof blas_kernels);
    } else if (lib == EM_BLAS_OPENBLAS) {
        blas_use(h, EM_BLAS_OPENBLAS);
        snprintf(blas_kernels, sizeof blas_kernels, "%s", core);
    }
    if (blis && lib != EM_BLAS_BLIS) dlclose(blis);
    char dmsg[256] = "";
    /* the cblas library runs kernels for this CPU: BLIS (its own choice)
     * or OpenBLAS on a core it knows (or one the user set) */
    bool native = blas_lib == EM_BLAS_BLIS ||
                  (blas_lib == EM_BLAS_OPENBLAS &&
                   (coretype || !em_blas_core_warning(core, em_cpu_isa(), dmsg, sizeof dmsg)));
    dmsg[0] = '\0';
    /* oneDNN is opened only where it may be chosen (and not under the
     * tools that trip on it, unless asked for) */
    bool may_onednn = em_blas_choose_onednn(w, em_cpu_isa(), native, true, dmsg, sizeof dmsg) &&
                      ((!leak_sanitizer() && !under_valgrind()) || (w && !strcmp(w, "onednn")));
    void *dnnl = may_onednn ? onednn_open() : NULL;
    if (em_blas_choose_onednn(w, em_cpu_isa(), native, dnnl != NULL, dmsg, sizeof dmsg)) {
        onednn_use(dnnl);
        char cblas[sizeof blas_kernels];
        memcpy(cblas, blas_kernels, sizeof cblas);
        snprintf(blas_kernels, sizeof blas_kernels, "oneDNN; small and f64: %.64s",
                 blas_lib == EM_BLAS_NONE ? "loops" : cblas);
    } else if (dnnl) {
        dlclose(dnnl);
    }
    if (dmsg[0]) blas_say(dmsg);
    /* no BLAS (or no room for it): the plain loops */
    if (blas_lib == EM_BLAS_NONE && !onednn_sgemm) return;
    /* the buffer check is OpenBLAS's (BLIS packs into small pooled blocks) */
    blas_ok = blas_lib != EM_BLAS_OPENBLAS || !limited || blas_headroom();
    if (blas_ok) blas_say(msg);
}


bool em_blas_ready(em_dtype dt) {
    pthread_once(&blas_once, blas_load);
    return blas_ok && (dt == EM_F32 || (dt == EM_F64 && blas_lib != EM_BLAS_NONE));
}

/* Products of at most this many multiply-adds stay on the cblas library:
 * OpenBLAS's small-matrix kernels ran 64x64x64 at 148 GFLOP/s and 24x24x32
 * at 144 against oneDNN's 138 and 71, while from 128x64x128 up oneDNN was
 * 1.1-2.5x faster (one thread of the 2-core Xeon, bench/bench_blas). */
#define ONEDNN_MIN_MNK ((int64_t)64 * 64 * 64)

void em_sgemm(bool ta, bool tb, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc) {
    bool cblas = blas_lib != EM_BLAS_NONE;
    if (onednn_sgemm && (!cblas || (int64_t)m * n * k > ONEDNN_MIN_MNK)) {
        int threads = omp_max_threads();
        omp_set_threads(1);
        int st = onednn_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta,
                              c, ldc);
        omp_set_threads(threads);
        if (st == 0) return; /* dnnl_success; else (out of memory) the cblas library */
    }
    if (cblas)
        blas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                   n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else
        sgemm_loops(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

bool em_bf16gemm_ready(void) {
    pthread_once(&blas_once, blas_load);
    return blas_ok && onednn_bf16gemm != NULL;
}

void em_bf16gemm(bool ta, bool tb, int m, int n, int k, float alpha, const uint16_t *a, int lda,
                 const uint16_t *b, int ldb, float beta, float *c, int ldc) {
    int threads = omp_max_threads();
    omp_set_threads(1);
    int st = onednn_bf16gemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta,
                             c, ldc);
    omp_set_threads(threads);
    if (st != 0) /* out of memory inside oneDNN: the same product, slower */
        bf16gemm_loops(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void em_dgemm(bool ta, bool tb, int m, int n, int k, double alpha, const double *a, int lda,
              const double *b, int ldb, double beta, double *c, int ldc) {
    blas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n,
               k, alpha, a, lda, b, ldb, beta, c, ldc);
}
