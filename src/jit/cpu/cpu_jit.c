/* cpu_jit.c - the CPU device of the engine (engine.h): kernels compiled
 * with libgccjit (cpu_gccjit.c) into shared objects, in worker processes
 * (worker_pool.c), loaded from the cache's sealed memory files and run
 * over em_parallel_for's threads. */
#include "cpu_jit.h"

#include "cpu_gccjit.h"
#include "worker.h"

#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

static bool cpu_target(int index, const jit_env *env, char *buf, size_t n) {
    (void)index;
    const char *own = jit_cpu_target();
    if (env && env->target && strcmp(env->target, own) != 0) {
        em_error(EM_ERR_UNSUPPORTED, "cpu: kernels are compiled for this machine only, not for '%s'",
                 env->target);
        return false;
    }
    snprintf(buf, n, "%s", own);
    return true;
}

/* The key the shared object embeds and names its kernel by
 * (jit_cpu_write_unit computes it too: jit_cpu_target() is the target). */
static bool cpu_key(const k_kernel *k, const char *target, kc_key *key, kc_manifest *m) {
    (void)target;
    return jit_cpu_kernel_key(k, key, m);
}

/* Compiles k in this process: to a shared object at a temporary path
 * (stored and loaded by the engine), or in memory when no file can be
 * made. */
static em_status compile_here(const k_kernel *k, jit_artifact *out) {
    char tmp[4096];
    if (jit_worker_temp_path(tmp, sizeof tmp)) {
        k_kernel *const one[1] = {(k_kernel *)k};
        if (jit_cpu_write_unit(one, 1, tmp) == EM_OK && (out->path = em_malloc(strlen(tmp) + 1))) {
            memcpy(out->path, tmp, strlen(tmp) + 1);
            return EM_OK;
        }
        unlink(tmp);
        em_clear_error(); /* compile in memory instead */
    }
    return jit_cpu_compile(k, (jit_cpu_kernel **)&out->loaded);
}

/* Why a kernel that no worker compiled may not be compiled here either,
 * or NULL: libgccjit's embedded driver calls putenv while it makes a
 * shared object, which moves the environ array under any other thread's
 * getenv (test_async crashed so), and at exit it must not start while
 * exit tears the process down around it. */
static const char *no_compile_here(void) {
    if (jit_workers_exiting()) return "the process is exiting";
    if (jit_on_background_thread())
        return "no compile worker could compile it, and a background compile does not run "
               "libgccjit in process";
    return NULL;
}

/* Every miss compiled in worker processes (ember-jit-worker), one per
 * core at most, in compile units of several kernels (worker.h); only when no worker can
 * run (EMBER_JIT_WORKER=0, none installed) or one reports an error does
 * this process compile itself. */
static em_status cpu_compile(int index, const char *target, k_kernel *const *ks, const kc_key *keys,
                             const jit_params *params, int n, jit_env *env, jit_artifact *out) {
    (void)index, (void)target, (void)keys, (void)params; /* no variants: params are defaults */
    if (jit_workers_exiting())
        return em_error(EM_ERR_STATE, "cpu backend: the process is exiting: %d kernels not compiled", n);
    char **paths = em_calloc((size_t)n + 1, sizeof *paths);
    jit_worker_result *res = em_calloc((size_t)n + 1, sizeof *res);
    em_status s = paths && res ? EM_OK : em_last_status();
    int m = 0;
    while (s == EM_OK && m < n && (paths[m] = em_malloc(4096)) && jit_worker_temp_path(paths[m], 4096)) m++;
    jit_workers *w = m == n ? jit_workers_start(ks, (const char *const *)paths, n, em_num_threads(), env->log)
                            : NULL;
    if (w) jit_workers_finish(w, res);
    for (int i = 0; s == EM_OK && i < n; i++) {
        if (w && res[i] == JIT_WORKER_DONE) {
            out[i].path = paths[i];
            paths[i] = NULL;
            continue;
        }
        if (w && res[i] == JIT_WORKER_FAILED) { /* hung or crashed: not in this process */
            s = em_error(EM_ERR_STATE, "a compile worker failed on kernel %d (logged)", i);
            break;
        }
        const char *why = no_compile_here();
        s = why ? em_error(EM_ERR_STATE, "cpu backend: kernel %d: %s", i, why) : compile_here(ks[i], &out[i]);
    }
    for (int i = 0; paths && i < n; i++) {
        if (paths[i]) unlink(paths[i]);
        em_free(paths[i]);
    }
    em_free(paths);
    em_free(res);
    return s;
}

static em_status cpu_load(int index, const jit_blob *b, const kc_key *key, jit_kernel **out) {
    (void)index;
    if (b->fd < 0) return em_error(EM_ERR_STATE, "cpu: a kernel loads from a file only");
    return jit_cpu_load_fd(b->fd, key, (jit_cpu_kernel **)out);
}

static em_status cpu_launch(const jit_kernel *k, void *const *bufs, const int64_t *sizes) {
    return jit_cpu_run((const jit_cpu_kernel *)k, bufs, sizes);
}

static void cpu_unload(jit_kernel *k) { jit_cpu_free((jit_cpu_kernel *)k); }

/* Autotuning's timer and model (engine.h).  The CPU proposes no variants
 * (its generator has no free parameter worth a compile per candidate: the
 * thread split is made at each launch), so it tunes nothing by itself; a
 * device that wraps its kernels (tests/test_tune.c) times them here. */
static em_status cpu_time(const jit_kernel *k, void *const *bufs, const int64_t *sizes, int reps,
                          double *seconds) {
    enum { MAX_REPS = 16 };
    double t[MAX_REPS];
    int n = reps < 1 ? 1 : reps > MAX_REPS ? MAX_REPS : reps;
    em_status s = cpu_launch(k, bufs, sizes); /* untimed: caches, page faults */
    for (int r = 0; s == EM_OK && r < n; r++) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        s = cpu_launch(k, bufs, sizes);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        t[r] = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    }
    if (s == EM_OK) *seconds = jit_median(t, n);
    return s;
}

/* The cpuid brand string ("AMD EPYC 7B13"), trimmed; false without one. */
static bool cpu_model(int index, char *buf, size_t n) {
    (void)index;
    unsigned r[12] = {0};
#if defined(__x86_64__) || defined(__i386__)
    for (unsigned i = 0; i < 3; i++)
        if (!__get_cpuid(0x80000002u + i, &r[4 * i], &r[4 * i + 1], &r[4 * i + 2], &r[4 * i + 3]))
            return false;
#endif
    char brand[sizeof r + 1];
    memcpy(brand, r, sizeof r);
    brand[sizeof r] = '\0';
    const char *b = brand;
    while (*b == ' ') b++;
    if (!*b) return false;
    snprintf(buf, n, "%s", b);
    return true;
}

/* f32, f16 and bf16 linear layers: cpu_linear adds the bias and applies
 * the act to each piece of the product as the BLAS writes it, while it is
 * in cache (f32), or as the f32 product is rounded into the half output,
 * instead of a kernel reading the whole product back
 * (src/eager/cpu_matmul.c). */
static bool cpu_fuse_linear(int index, const em_meta *a, const em_meta *w, const em_meta *bias,
                            em_act act) {
    (void)index, (void)act;
    em_dtype dt = a->dtype;
    return (dt == EM_F32 || dt == EM_F16 || dt == EM_BF16) && w->dtype == dt && bias->dtype == dt;
}

const jit_device jit_cpu_device = {
    .name = "cpu",
    .type = EM_CPU,
    .kind = "so",
    .target = cpu_target,
    .key = cpu_key,
    .compile = cpu_compile,
    .load = cpu_load,
    .launch = cpu_launch,
    .unload = cpu_unload,
    .fused_attention = true, /* src/eager/cpu_attention.c */
    .fuse_linear = cpu_fuse_linear,
    .split_rows = 64,        /* a reduction's rows, split over up to 64 threads */
    .half_kernels = true,    /* computed in f32; cpu_vmath_gccjit.c converts */
    .time = cpu_time,
    .model = cpu_model,
};
