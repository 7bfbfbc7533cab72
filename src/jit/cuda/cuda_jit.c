/* cuda_jit.c - the CUDA device of the engine (engine.h): kernel IR
 * printed as CUDA C (cuda_emit.c), compiled by NVRTC in process (one
 * thread per kernel, up to the cores), loaded through the driver API
 * (cuda_kernel.c) and launched on the device's stream.  Matmul and the
 * other ops that are no kernel run as their eager CUDA ops (cuBLAS).
 *
 * The target names the GPU architecture: a process with a GPU compiles
 * for it; `ember-cache warmup --target sm_90` compiles for a named one
 * with NVRTC alone (no driver, no GPU).  Without a CUDA build every
 * entry reports EM_ERR_DEVICE. */
#include "cuda_jit.h"

#include "cuda_eager.h" /* cuda_graph.c */
#include "cuda_kernel.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef EMBER_HAVE_CUDA

static bool cuda_target(int index, const jit_env *env, char *buf, size_t n) {
    int arch;
    if (env && env->target) {
        if ((arch = cuda_target_arch(env->target)) < 0) {
            em_error(EM_ERR_ARG, "cuda: target '%s' is not sm_<arch> (e.g. sm_90)", env->target);
            return false;
        }
    } else if ((arch = cuda_device_arch(index)) < 0) {
        return false;
    }
    if (cuda_target_string(arch, buf, n)) return true;
    em_error(EM_ERR_ARG, "cuda: target string too long");
    return false;
}

static bool cuda_key(const k_kernel *k, const char *target, kc_key *key, kc_manifest *m) {
    return jit_kernel_key("cuda", target, k, key, m);
}

/* One NVRTC compile (a thread's share of cuda_compile). */
typedef struct nvrtc_job {
    k_kernel *const *ks;
    const kc_key *keys;
    const jit_params *params; /* NULL: defaults */
    jit_artifact *out;
    em_status *res;
    char (*why)[256];
    int n, step, first, arch;
    const em_allocator *alloc; /* the caller's: it frees the images */
} nvrtc_job;

static void *compile_some(void *arg) {
    const nvrtc_job *j = arg;
    em_set_allocator(j->alloc);
    for (int i = j->first; i < j->n; i += j->step) {
        cuda_row_params rp = cuda_row_params_of(j->params ? &j->params[i] : NULL);
        j->res[i] = cuda_kernel_compile(j->ks[i], &rp, &j->keys[i], j->arch, &j->out[i].bytes, &j->out[i].n);
        if (j->res[i] != EM_OK) snprintf(j->why[i], sizeof j->why[i], "%s", em_last_error());
        em_clear_error();
    }
    return NULL;
}

/* NVRTC is thread-safe and single-threaded per program: the kernels of a
 * graph compile in parallel (attention's 8 took 1 s one after another). */
static em_status cuda_compile(int index, const char *target, k_kernel *const *ks, const kc_key *keys,
                              const jit_params *params, int n, jit_env *env, jit_artifact *out) {
    (void)index;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int nt = n < cores ? n : (int)(cores > 0 ? cores : 1);
    pthread_t *tid = em_calloc((size_t)nt + 1, sizeof *tid);
    nvrtc_job *jobs = em_calloc((size_t)nt + 1, sizeof *jobs);
    em_status *res = em_calloc((size_t)n + 1, sizeof *res);
    char (*why)[256] = em_calloc((size_t)n + 1, sizeof *why);
    if (!tid || !jobs || !res || !why) {
        em_free(tid), em_free(jobs), em_free(res), em_free(why);
        return em_last_status();
    }
    for (int t = 0; t < nt; t++) {
        jobs[t] = (nvrtc_job){ks, keys, params, out, res, why, n, nt, t, cuda_target_arch(target),
                              em_get_allocator()};
        if (t > 0 && pthread_create(&tid[t], NULL, compile_some, &jobs[t]) != 0)
            jobs[t].step = -1; /* not started: its share runs on this thread below */
    }
    compile_some(&jobs[0]);
    for (int t = 1; t < nt; t++) {
        if (jobs[t].step < 0) {
            jobs[t].step = nt;
            compile_some(&jobs[t]);
        } else {
            pthread_join(tid[t], NULL);
        }
    }
    em_status s = EM_OK;
    for (int i = 0; i < n; i++) {
        if (res[i] == EM_OK) continue;
        jit_logf(env->log, JIT_LOG_CODE, "cuda: kernel %d not compiled: %s", i, why[i]);
        if (res[i] == EM_ERR_NOMEM || n == 1) s = em_error(res[i], "%s", why[i]); /* an eager op's */
    }
    em_free(tid), em_free(jobs), em_free(res), em_free(why);
    return s;
}

/* The whole of fd (a sealed memory file), em_malloc'd. */
static void *read_all(int fd, size_t *n) {
    off_t size = lseek(fd, 0, SEEK_END);
    char *buf = size >= 0 ? em_malloc((size_t)size + 1) : NULL;
    size_t got = 0;
    while (buf && got < (size_t)size) {
        ssize_t r = pread(fd, buf + got, (size_t)size - got, (off_t)got);
        if (r <= 0) {
            em_free(buf);
            em_error(EM_ERR_STATE, "cuda: cannot read a kernel image");
            return NULL;
        }
        got += (size_t)r;
    }
    if (buf) buf[got] = '\0';
    *n = got;
    return buf;
}

static em_status cuda_load(int index, const jit_blob *b, const kc_key *key, jit_kernel **out) {
    cuda_device *d = cuda_device_get(index);
    if (!d) return em_last_status();
    size_t n = b->n;
    void *img = b->fd >= 0 ? read_all(b->fd, &n) : (void *)b->bytes;
    if (!img) return em_last_status();
    em_status s = cuda_kernel_load(d, img, key, (cuda_kernel **)out);
    if (b->fd >= 0) em_free(img);
    return s;
}

static em_status cuda_launch(const jit_kernel *k, void *const *bufs, const int64_t *sizes) {
    const cuda_kernel *ck = (const cuda_kernel *)k;
    cuda_device *d = cuda_device_get(ck->device);
    return d ? cuda_kernel_launch(d, ck, bufs, sizes) : em_last_status();
}

/* ---- autotuning (engine.h): rows kernels' parameters ---- */

static int cuda_variants(int index, const k_kernel *k, jit_params *out, int max) {
    (void)index;
    return cuda_kernel_variants(k, out, max);
}

static em_status cuda_time(const jit_kernel *k, void *const *bufs, const int64_t *sizes, int reps,
                           double *seconds) {
    const cuda_kernel *ck = (const cuda_kernel *)k;
    cuda_device *d = cuda_device_get(ck->device);
    return d ? cuda_kernel_time(d, ck, bufs, sizes, reps, seconds) : em_last_status();
}

/* "NVIDIA H200 sm_90 132 SMs": what a choice depends on beyond the
 * architecture (two GPUs of one architecture differ in SMs, clocks and
 * bandwidth). */
static bool cuda_model(int index, char *buf, size_t n) {
    cuda_device_info info;
    if (cuda_device_info_get(index, &info) != EM_OK) return false;
    int w = snprintf(buf, n, "%s sm_%d%d %d SMs", info.name, info.major, info.minor, info.sm_count);
    return w > 0 && (size_t)w < n;
}

static jit_kernel *cuda_find(int index, const kc_key *key) {
    cuda_device *d = cuda_device_get(index);
    if (!d) {
        em_clear_error();
        return NULL;
    }
    pthread_mutex_lock(&d->lock);
    cuda_kernel *ck = cuda_kernel_table_find(d, key);
    pthread_mutex_unlock(&d->lock);
    return (jit_kernel *)ck;
}

/* Adds k to the device's table; when another thread added the same key
 * first, k stays loaded unused (rare: two threads compiled one kernel). */
static void cuda_add(int index, const kc_key *key, jit_kernel *k) {
    cuda_device *d = cuda_device_get(index);
    if (!d) return;
    pthread_mutex_lock(&d->lock);
    if (!cuda_kernel_table_find(d, key)) cuda_kernel_table_add(d, key, (cuda_kernel *)k);
    pthread_mutex_unlock(&d->lock);
}

/* The node of group gi when the group is one sum/mean/amax/amin with
 * fewer rows than the GPU has SMs and long rows: the eager CUDA op runs it
 * in two launches (cuda_eager.c's split scheme) where one kernel would
 * use a block per row.  -1 otherwise. */
/* The skinny matmul kernel adds a bias as it writes (cuda_native.c), and
 * keeps the shapes it takes (it beats cuBLAS there): an act after it
 * stays a node of its own.  Elsewhere cuBLASLt's epilogue adds the bias
 * and applies relu or gelu_tanh (cuda_matmul.c); without cuBLASLt (or
 * with EMBER_CUDA_LT=0) cuBLAS's gemms add nothing, and the bias add
 * fuses with its readers. */
static bool cuda_fuse_linear(int index, const em_meta *a, const em_meta *w, const em_meta *bias, em_act act) {
    (void)index;
    if (cuda_native_skinny_takes(a, w, bias)) return act == EM_ACT_NONE;
    return cuda_linear_takes(a, w, bias, act);
}

static int cuda_prefer_eager(int index, const sc_schedule *s, int gi) {
    const tr_graph *g = s->g;
    /* a group of one node: from the group's member list (a scan of the
     * graph per group would be quadratic in a large graph) */
    if (s->member_start[gi + 1] - s->member_start[gi] != 1) return -1;
    int node = s->members[s->member_start[gi]];
    const tr_node *n = &g->nodes[node];
    if (n->op != EM_OP_SUM && n->op != EM_OP_MEAN && n->op != EM_OP_AMAX && n->op != EM_OP_AMIN)
        return -1;
    int in = n->in[0]; /* its input must be in memory when the step runs */
    if (g->nodes[in].kind == TR_CALL && s->fusible[in] && !s->materialized[in]) return -1;
    cuda_device *d = cuda_device_get(index);
    if (!d) {
        em_clear_error();
        return -1;
    }
    int64_t rows = em_shape_numel(n->meta.ndim, n->meta.sizes);
    int64_t all = em_shape_numel(g->nodes[in].meta.ndim, g->nodes[in].meta.sizes);
    return rows > 0 && rows < d->sm_count && all / rows >= (1 << 16) ? node : -1;
}

const char *jit_cuda_nvrtc_version(void) {
    const char *v = cuda_nvrtc_version();
    em_clear_error();
    return v;
}

em_status cuda_kernel_get(cuda_device *d, const k_kernel *k, kc_cache *cache, const jit_log *log,
                          cuda_get_stats *stats, const cuda_kernel **out) {
    char target[256];
    kc_key key;
    jit_env env = {.cache = cache, .log = log};
    if (!cuda_target(d->index, NULL, target, sizeof target) || !cuda_key(k, target, &key, NULL))
        return em_last_status();
    jit_kernel *got = cuda_find(d->index, &key); /* every eager op: quiet on a hit */
    if (got) {
        env.loaded = 1;
    } else {
        k_kernel *ks[1] = {(k_kernel *)k};
        em_status s = jit_get_kernels(&jit_cuda_device, d->index, &env, ks, &key, 1, &got);
        if (s != EM_OK) return s;
    }
    pthread_mutex_lock(&d->lock);
    stats->compiled += env.compiled;
    stats->loaded += env.loaded;
    pthread_mutex_unlock(&d->lock);
    *out = (const cuda_kernel *)got;
    return EM_OK;
}

#else /* no CUDA headers at build time */

static bool cuda_target(int index, const jit_env *env, char *buf, size_t n) {
    (void)index, (void)env, (void)buf, (void)n;
    em_error(EM_ERR_DEVICE, "cuda backend: this build of Ember has no CUDA backend");
    return false;
}

static bool cuda_key(const k_kernel *k, const char *target, kc_key *key, kc_manifest *m) {
    return jit_kernel_key("cuda", target, k, key, m);
}

static em_status cuda_compile(int index, const char *target, k_kernel *const *ks, const kc_key *keys,
                              const jit_params *params, int n, jit_env *env, jit_artifact *out) {
    (void)index, (void)target, (void)ks, (void)keys, (void)params, (void)n, (void)env, (void)out;
    return em_error(EM_ERR_DEVICE, "cuda backend: this build of Ember has no CUDA backend");
}

static em_status cuda_load(int index, const jit_blob *b, const kc_key *key, jit_kernel **out) {
    (void)index, (void)b, (void)key, (void)out;
    return em_error(EM_ERR_DEVICE, "cuda backend: this build of Ember has no CUDA backend");
}

static em_status cuda_launch(const jit_kernel *k, void *const *bufs, const int64_t *sizes) {
    (void)k, (void)bufs, (void)sizes;
    return em_error(EM_ERR_DEVICE, "cuda backend: this build of Ember has no CUDA backend");
}

const char *jit_cuda_nvrtc_version(void) { return NULL; }

#define cuda_find NULL
#define cuda_add NULL
#define cuda_prefer_eager NULL
#define cuda_fuse_linear NULL
#define cuda_attention_takes NULL
#define cuda_graph_capture_begin NULL
#define cuda_graph_capture_end NULL
#define cuda_graph_launch NULL
#define cuda_graph_bytes NULL
#define cuda_graph_free NULL
#define cuda_variants NULL
#define cuda_time NULL
#define cuda_model NULL

#endif

const jit_device jit_cuda_device = {
    .name = "cuda",
    .type = EM_CUDA,
    .kind = "cubin",
    .target = cuda_target,
    .key = cuda_key,
    .compile = cuda_compile,
    .load = cuda_load,
    .launch = cuda_launch,
    .find = cuda_find,
    .add = cuda_add,
    .prefer_eager = cuda_prefer_eager,
    .fused_attention = true, /* cuda_attention.c */
    .fused_attention_takes = cuda_attention_takes, /* f16/bf16 on sm_80 on */
    .fuse_linear = cuda_fuse_linear,
    .split_rows = 1024,      /* rows kernels: a block a row, 132 SMs on an H200 */
    .split_long = 0,         /* never: measured slower on an H200 than a cluster
                                kernel a row (docs/benchmarks.md); try with
                                EMBER_SPLIT_LONG=32769 */
    .half_kernels = true,    /* computed in f32; cuda_emit.c converts */
    .capture_begin = cuda_graph_capture_begin, /* CUDA graphs: cuda_graph.c */
    .capture_end = cuda_graph_capture_end,
    .graph_launch = cuda_graph_launch,
    .graph_bytes = cuda_graph_bytes,
    .graph_free = cuda_graph_free,
    .variants = cuda_variants, /* rows kernels' parameters (cuda_kernel.c) */
    .time = cuda_time,
    .model = cuda_model,
};
