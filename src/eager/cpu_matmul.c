/* cpu_matmul.c - batched matrix product on CPU.
 *
 * in[0] [..., M, K] @ in[1] [..., K, N] -> out [batch..., M, N] (contiguous),
 * batch dims broadcast (a missing or size-1 batch dim reads with stride 0).
 * f32/f64 go through OpenBLAS's cblas_?gemm (dlopen'ed: see blas_load),
 * reading each operand in place when one of its two matrix strides is 1 (as
 * is, or transposed) and the other a valid leading dimension; otherwise the
 * operand is first copied contiguous (its distinct batches only).  Integers
 * use plain loops with wrapping (modular) accumulation, which gives the same
 * bits as accumulating in int64. */
#include "config.h" /* EMBER_OPENBLAS_SONAME */
#include "cpu.h"

#include <cblas.h> /* types and prototypes only: OpenBLAS is dlopen'ed (blas_load) */
#include <dlfcn.h>
#include <pthread.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/resource.h>

/* Below this many multiply-adds per product OpenBLAS runs single-threaded,
 * so small products of a batch run in parallel across the batch. */
#define MM_SMALL 65536

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
static char blas_kernels[64]; /* the core or arch it runs */

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
    if (want && *want && !blis && !openblas && strcmp(want, "auto"))
        snprintf(msg, n, "EMBER_BLAS=%s is not auto, openblas or blis: using auto", want);
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

static void blas_use(void *h, em_blas_lib lib) {
    blas_sgemm = (__typeof__(cblas_sgemm) *)dlsym(h, "cblas_sgemm");
    blas_dgemm = (__typeof__(cblas_dgemm) *)dlsym(h, "cblas_dgemm");
    blas_lib = blas_sgemm && blas_dgemm ? lib : EM_BLAS_NONE;
}

static void blas_load(void);

em_blas_lib em_blas_in_use(char *buf, size_t n) {
    pthread_once(&blas_once, blas_load);
    if (n) snprintf(buf, n, "%s", blas_ok ? blas_kernels : "");
    return blas_ok ? blas_lib : EM_BLAS_NONE;
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
    if (blas_lib == EM_BLAS_NONE) return; /* no BLAS (or no room for it): the plain loops */
    /* the buffer check is OpenBLAS's (BLIS packs into small pooled blocks) */
    blas_ok = blas_lib == EM_BLAS_BLIS || !limited || blas_headroom();
    if (blas_ok) blas_say(msg);
}

typedef struct operand {
    const char *data;
    int64_t bst[EM_MAX_DIMS]; /* batch strides (elements), aligned to out's batch dims */
    int64_t rs, cs;           /* matrix row and column strides (elements) */
    int64_t rows, cols;
    bool trans;               /* BLAS reads it transposed */
    int64_t ld;               /* BLAS leading dimension */
    void *tmp;                /* a contiguous copy we own, or NULL */
} operand;

static void operand_init(operand *op, const em_tensor *t, int nb, const int64_t *bsz) {
    int nd = t->ndim;
    op->data = em_data(t);
    op->rows = t->sizes[nd - 2];
    op->cols = t->sizes[nd - 1];
    op->rs = t->strides[nd - 2];
    op->cs = t->strides[nd - 1];
    int tb = nd - 2; /* t's batch dims, aligned right */
    for (int d = 0; d < nb; d++) {
        int td = d - (nb - tb);
        op->bst[d] = td >= 0 && t->sizes[td] != 1 && bsz[d] != 1 ? t->strides[td] : 0;
    }
    op->tmp = NULL;
}

/* Whether BLAS can read the matrix in place; sets trans and ld. */
static bool blas_layout(operand *op) {
    int64_t r = op->rows, c = op->cols;
    int64_t mr = r > 1 ? r : 1, mc = c > 1 ? c : 1;
    if ((c == 1 || op->cs == 1) && (r == 1 || op->rs >= mc)) {
        op->trans = false;
        op->ld = r == 1 ? mc : op->rs;
    } else if ((r == 1 || op->rs == 1) && (c == 1 || op->cs >= mr)) {
        op->trans = true;
        op->ld = c == 1 ? mr : op->cs;
    } else {
        return false;
    }
    return op->ld <= INT_MAX;
}

/* Copies t's distinct data (broadcast batch dims taken once) into a
 * contiguous buffer and points op at it; a half t (f16, bf16) is converted
 * to f32 on the way, a row at a time (em_half_to_f32_n). */
static em_status operand_copy(operand *op, const em_tensor *t, int nb, const int64_t *bsz) {
    int nd = t->ndim, tb = nd - 2;
    bool half = em_is_half(t->dtype);
    int64_t tsz = (int64_t)em_dtype_size(t->dtype), esz = half ? 4 : tsz;
    int64_t sz[EM_MAX_DIMS], st[EM_MAX_DIMS];
    for (int d = 0; d < nd; d++) {
        bool bcast = d < tb && (t->sizes[d] == 1 || t->strides[d] == 0);
        sz[d] = bcast ? 1 : t->sizes[d];
        st[d] = t->strides[d];
    }
    int64_t n = em_shape_numel(nd, sz);
    char *buf = em_malloc((size_t)(n > 0 ? n : 1) * (size_t)esz);
    if (!buf) return em_error(EM_ERR_NOMEM, "matmul: out of memory (%lld elements)", (long long)n);
    /* strided copy, innermost dim in a loop */
    const char *src = em_data(t);
    int64_t idx[EM_MAX_DIMS] = {0}, off = 0, last = sz[nd - 1], lst = st[nd - 1];
    char *dst = buf;
    for (int64_t r = 0, nrun = last ? n / last : 0; r < nrun; r++) {
        if (half)
            em_half_to_f32_n(t->dtype, src + off * tsz, lst * tsz, (float *)dst, last);
        else if (esz == 4)
            for (int64_t i = 0; i < last; i++)
                ((uint32_t *)dst)[i] = ((const uint32_t *)src)[off + i * lst];
        else
            for (int64_t i = 0; i < last; i++)
                ((uint64_t *)dst)[i] = ((const uint64_t *)src)[off + i * lst];
        dst += last * esz;
        for (int d = nd - 2; d >= 0; d--) {
            off += st[d];
            if (++idx[d] < sz[d]) break;
            off -= st[d] * sz[d];
            idx[d] = 0;
        }
    }
    /* the copy's strides */
    int64_t cst[EM_MAX_DIMS];
    em_contiguous_strides(nd, sz, cst);
    em_free(op->tmp); /* a second copy (never needed in practice) replaces the first */
    op->tmp = buf;
    op->data = buf;
    op->rs = cst[nd - 2];
    op->cs = cst[nd - 1];
    for (int d = 0; d < nb; d++) {
        int td = d - (nb - tb);
        op->bst[d] = td >= 0 && sz[td] != 1 && bsz[d] != 1 ? cst[td] : 0;
    }
    return EM_OK;
}

typedef struct mmctx {
    operand a, b;
    const em_tensor *a_t, *b_t; /* the operands' tensors */
    char *c;
    em_dtype dt;
    int64_t esz, M, N, K;
    int nb;
    int64_t bsz[EM_MAX_DIMS];
    int64_t nbatch;
} mmctx;

/* Element offsets of batch bi in a and b. */
static void batch_offsets(const mmctx *X, int64_t bi, int64_t *ao, int64_t *bo) {
    *ao = *bo = 0;
    for (int d = X->nb - 1; d >= 0; d--) {
        int64_t i = bi % X->bsz[d];
        bi /= X->bsz[d];
        *ao += i * X->a.bst[d];
        *bo += i * X->b.bst[d];
    }
}

static void gemm_batches(void *ctx, int64_t b, int64_t e) {
    const mmctx *X = ctx;
    int M = (int)X->M, N = (int)X->N, K = (int)X->K;
    int ldc = N > 1 ? N : 1;
    enum CBLAS_TRANSPOSE ta = X->a.trans ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE tb = X->b.trans ? CblasTrans : CblasNoTrans;
    for (int64_t bi = b; bi < e; bi++) {
        int64_t ao, bo;
        batch_offsets(X, bi, &ao, &bo);
        char *cp = X->c + bi * X->M * X->N * X->esz;
        if (X->dt == EM_F32)
            blas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f,
                       (const float *)X->a.data + ao, (int)X->a.ld,
                       (const float *)X->b.data + bo, (int)X->b.ld, 0.0f, (float *)cp, ldc);
        else
            blas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, (const double *)X->a.data + ao,
                       (int)X->a.ld, (const double *)X->b.data + bo, (int)X->b.ld, 0.0,
                       (double *)cp, ldc);
    }
}

/* One gemm of a single batch, split over Ember's threads: by rows of C
 * when there are enough, else by columns.  Pieces are [b, e) of that dim. */
static void gemm_piece(const mmctx *X, bool by_rows, int64_t b, int64_t e) {
    int M = (int)X->M, N = (int)X->N, K = (int)X->K, ldc = N > 1 ? N : 1;
    enum CBLAS_TRANSPOSE ta = X->a.trans ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE tb = X->b.trans ? CblasTrans : CblasNoTrans;
    int64_t ao = 0, bo = 0, co;
    if (by_rows) { /* rows b..e of A (a column offset when A is transposed) */
        ao = X->a.trans ? b : b * X->a.ld;
        co = b * ldc;
        M = (int)(e - b);
    } else {       /* columns b..e of B */
        bo = X->b.trans ? b * X->b.ld : b;
        co = b;
        N = (int)(e - b);
    }
    if (X->dt == EM_F32)
        blas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0f, (const float *)X->a.data + ao,
                   (int)X->a.ld, (const float *)X->b.data + bo, (int)X->b.ld, 0.0f,
                   (float *)X->c + co, ldc);
    else
        blas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, (const double *)X->a.data + ao,
                   (int)X->a.ld, (const double *)X->b.data + bo, (int)X->b.ld, 0.0,
                   (double *)X->c + co, ldc);
}

static void gemm_rows(void *ctx, int64_t b, int64_t e) { gemm_piece(ctx, true, b, e); }
static void gemm_cols(void *ctx, int64_t b, int64_t e) { gemm_piece(ctx, false, b, e); }

/* Plain loops over rows (batch, i) of the output: c[i, :] += a[i, k] * b[k, :].
 * Integers wrap (unsigned arithmetic); floats (only for sizes BLAS cannot
 * take) accumulate in the output's type. */
#define LOOP_ROWS(NAME, T, U)                                                             \
    static void NAME(void *ctx, int64_t b, int64_t e) {                                    \
        const mmctx *X = ctx;                                                              \
        int64_t N = X->N, K = X->K;                                                        \
        for (int64_t row = b; row < e; row++) {                                            \
            int64_t bi = row / X->M, i = row % X->M, ao, bo;                               \
            batch_offsets(X, bi, &ao, &bo);                                                \
            const T *A = (const T *)X->a.data + ao + i * X->a.rs;                          \
            const T *B = (const T *)X->b.data + bo;                                        \
            U *C = (U *)X->c + row * N;                                                    \
            for (int64_t j = 0; j < N; j++) C[j] = 0;                                      \
            for (int64_t k = 0; k < K; k++) {                                              \
                U av = (U)A[k * X->a.cs];                                                  \
                const T *Bk = B + k * X->b.rs;                                             \
                if (X->b.cs == 1)                                                          \
                    for (int64_t j = 0; j < N; j++) C[j] += av * (U)Bk[j];                 \
                else                                                                       \
                    for (int64_t j = 0; j < N; j++) C[j] += av * (U)Bk[j * X->b.cs];       \
            }                                                                              \
        }                                                                                  \
    }
LOOP_ROWS(rows_i32, int32_t, uint32_t)
LOOP_ROWS(rows_i64, int64_t, uint64_t)
LOOP_ROWS(rows_f32, float, float)
LOOP_ROWS(rows_f64, double, double)

/* The multiplication X describes (operands set up, X->c the output),
 * copying an operand BLAS cannot read in place (a, b: the tensors). */
static em_status run_gemm(mmctx *X, const em_tensor *a, const em_tensor *b) {
    em_status st = EM_OK;
    em_range_fn rows = NULL;
    if (X->dt == EM_I32) rows = rows_i32;
    if (X->dt == EM_I64) rows = rows_i64;
    bool blas = rows == NULL && X->M <= INT_MAX && X->N <= INT_MAX && X->K <= INT_MAX;
    if (rows == NULL) pthread_once(&blas_once, blas_load);
    blas = blas && blas_ok;
    if (rows == NULL && !blas) rows = X->dt == EM_F32 ? rows_f32 : rows_f64;

    if (blas) {
        if (!blas_layout(&X->a)) {
            st = operand_copy(&X->a, a, X->nb, X->bsz);
            if (st == EM_OK && !blas_layout(&X->a)) blas = false;
        }
        if (st == EM_OK && !blas_layout(&X->b)) {
            st = operand_copy(&X->b, b, X->nb, X->bsz);
            if (st == EM_OK && !blas_layout(&X->b)) blas = false;
        }
        if (st == EM_OK && !blas) rows = X->dt == EM_F32 ? rows_f32 : rows_f64;
    }
    if (st == EM_OK) {
        if (blas) {
            int64_t mnk = X->M * X->N * X->K;
            if (X->nbatch > 1) {
                int64_t grain = mnk < MM_SMALL ? MM_SMALL / mnk : 1;
                em_parallel_for(X->nbatch, grain > 0 ? grain : 1, gemm_batches, X);
            } else if (X->M >= X->N) { /* pieces of at least 16 rows and ~64K multiply-adds */
                int64_t grain = MM_SMALL / (X->N * X->K > 0 ? X->N * X->K : 1);
                em_parallel_for(X->M, grain > 16 ? grain : 16, gemm_rows, X);
            } else {
                int64_t grain = MM_SMALL / (X->M * X->K > 0 ? X->M * X->K : 1);
                em_parallel_for(X->N, grain > 16 ? grain : 16, gemm_cols, X);
            }
        } else {
            int64_t work = X->N * X->K;
            int64_t grain = work > 0 ? EM_PARALLEL_GRAIN / work : 1;
            em_parallel_for(X->nbatch * X->M, grain > 0 ? grain : 1, rows, X);
        }
    }
    return st;
}

/* f16 and bf16: both operands converted to f32 once (operand_copy: whole
 * rows through em_half_to_f32_n, never element by element calls), one f32
 * product (BLAS sgemm, f32 accumulation) into an f32 buffer, each element
 * of it rounded into out once. */
static em_status matmul_half(mmctx *X, em_tensor *out) {
    const em_tensor *a = X->a_t, *b = X->b_t;
    int64_t numel = X->nbatch * X->M * X->N;
    float *c32 = em_malloc((size_t)numel * sizeof(float));
    if (!c32) return em_error(EM_ERR_NOMEM, "matmul: out of memory (%lld elements)", (long long)numel);
    X->dt = EM_F32;
    X->esz = 4;
    X->c = (char *)c32;
    em_status st = operand_copy(&X->a, a, X->nb, X->bsz);
    if (st == EM_OK) st = operand_copy(&X->b, b, X->nb, X->bsz);
    if (st == EM_OK) st = run_gemm(X, a, b);
    if (st == EM_OK) em_f32_to_half_n(out->dtype, c32, em_data(out), 2, numel);
    em_free(c32);
    return st;
}

em_status cpu_matmul(const em_op_call *c, em_tensor *out) {
    const em_tensor *a = c->in[0], *b = c->in[1];
    if (a->ndim < 2 || b->ndim < 2 || out->ndim < 2)
        return em_error(EM_ERR_SHAPE, "matmul: operands must have at least 2 dims");
    mmctx X;
    X.a_t = a;
    X.b_t = b;
    X.nb = out->ndim - 2;
    X.M = out->sizes[X.nb];
    X.N = out->sizes[X.nb + 1];
    X.K = a->sizes[a->ndim - 1];
    X.dt = out->dtype;
    X.esz = (int64_t)em_dtype_size(out->dtype);
    if (a->dtype != X.dt || b->dtype != X.dt)
        return em_error(EM_ERR_DTYPE, "matmul: operands must have the output's dtype");
    if (b->sizes[b->ndim - 2] != X.K || a->sizes[a->ndim - 2] != X.M ||
        b->sizes[b->ndim - 1] != X.N)
        return em_error(EM_ERR_SHAPE, "matmul: operand sizes do not match the output");
    X.nbatch = 1;
    for (int d = 0; d < X.nb; d++) {
        X.bsz[d] = out->sizes[d];
        X.nbatch *= X.bsz[d];
    }
    int64_t numel = X.nbatch * X.M * X.N;
    if (numel == 0) return EM_OK;
    X.c = em_data(out);
    if (X.K == 0) {
        memset(X.c, 0, (size_t)(numel * X.esz));
        return EM_OK;
    }
    operand_init(&X.a, a, X.nb, X.bsz);
    operand_init(&X.b, b, X.nb, X.bsz);
    em_status st;
    switch (X.dt) {
    case EM_I32:
    case EM_I64:
    case EM_F32:
    case EM_F64: st = run_gemm(&X, a, b); break;
    case EM_F16:
    case EM_BF16: st = matmul_half(&X, out); break;
    default:
        return em_error(EM_ERR_DTYPE, "matmul: dtype %s is not supported", em_dtype_name(X.dt));
    }
    em_free(X.a.tmp);
    em_free(X.b.tmp);
    return st;
}

/* The product, then the bias added in place by add's own kernel: the same
 * bits as the matmul and add it stands for (the CPU gains nothing from
 * the fused form, which only the linear pass makes, for devices whose
 * matmul kernels add the bias: src/trace/linear.c). */
em_status cpu_linear(const em_op_call *c, em_tensor *out) {
    em_op_call mm = {.op = EM_OP_MATMUL, .nin = 2, .in = c->in, .attrs = c->attrs};
    em_status s = cpu_matmul(&mm, out);
    if (s != EM_OK) return s;
    em_tensor *in[2] = {out, c->in[2]};
    em_op_call add = {.op = EM_OP_ADD, .nin = 2, .in = in, .attrs = c->attrs};
    return cpu_add(&add, out);
}

bool em_blas_ready(void) { return em_blas_in_use(NULL, 0) != EM_BLAS_NONE; }

void em_sgemm_tile(bool transb, int m, int n, int k, float alpha, const float *a, int lda,
                   const float *b, int ldb, float beta, float *c, int ldc) {
    blas_sgemm(CblasRowMajor, CblasNoTrans, transb ? CblasTrans : CblasNoTrans, m, n, k, alpha,
               a, lda, b, ldb, beta, c, ldc);
}
