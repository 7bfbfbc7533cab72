/* tune.c - autotuning with remembered choices (engine.h): a kernel whose
 * schedule has free parameters (the device's variants: a CUDA rows
 * kernel's elements per thread, lanes per short row) is compiled in each
 * candidate schedule, timed on scratch buffers of its real sizes, and the
 * fastest kept.  The choice is a "tune" record in the kernel cache, keyed
 * by the device, its model and the kernel's plain key, so that a later
 * compile (another process, a warmed fleet) reads it instead of timing;
 * the tuned kernel's own key goes into the plan, so a plan hit needs
 * nothing from here.
 *
 * A record is only a hint: it must name the kernel and model it is filed
 * under and a candidate the device still proposes with the same
 * parameters, else the default schedule runs.  Every candidate computes
 * the same values (the parameters change how work is split, never what
 * is computed), so a choice can cost time, never a wrong result. */
#include "engine-impl.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- parameters and keys ---- */

bool jit_params_default(const jit_params *p) {
    for (size_t i = 0; i < sizeof p->v / sizeof p->v[0]; i++)
        if (p->v[i] != 0) return false;
    return true;
}

static void params_text(const jit_params *p, char *buf, size_t n) {
    snprintf(buf, n, "%d %d %d %d", (int)p->v[0], (int)p->v[1], (int)p->v[2], (int)p->v[3]);
}

kc_key jit_tune_key(const kc_key *base, const jit_params *p) {
    if (jit_params_default(p)) return *base; /* the default keeps its plain key */
    char hex[KC_KEY_HEX_SIZE], text[64];
    kc_key_hex(base, hex);
    params_text(p, text, sizeof text);
    kc_fields fl;
    kc_fields_begin(&fl, NULL);
    kc_fields_str(&fl, "what", "ember kernel variant");
    kc_fields_str(&fl, "kernel", hex);
    kc_fields_str(&fl, "params", text);
    return kc_fields_digest(&fl);
}

/* A background compile (the compile queue) does not tune: its timings
 * would share the device with the calls running meanwhile, and measure
 * them too. */
bool jit_tune_on(const jit_device *d, int index, const jit_env *env) {
    char model[256];
    if (!env->autotune || env->target || env->dry_run || !d->variants || !d->model) return false;
    if (jit_on_background_thread()) return false;
    if (!d->time && !env->tune_time) return false;
    bool ok = d->model(index, model, sizeof model);
    em_clear_error();
    return ok;
}

void jit_tune_plan_target(const jit_device *d, int index, const jit_env *env, const char *target,
                          char *buf, size_t n) {
    char model[256];
    if (jit_tune_on(d, index, env) && d->model(index, model, sizeof model))
        snprintf(buf, n, "%s autotune %s", target, model);
    else
        snprintf(buf, n, "%s", target);
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double jit_median(double *x, int n) {
    qsort(x, (size_t)n, sizeof *x, by_value);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* ---- records ---- */

kc_key jit_tune_record_key(const jit_device *d, const char *model, const kc_key *base) {
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(base, hex);
    kc_fields fl;
    kc_fields_begin(&fl, NULL);
    kc_fields_str(&fl, "what", "ember tune");
    kc_fields_str(&fl, "device", d->name);
    kc_fields_str(&fl, "model", model);
    kc_fields_str(&fl, "kernel", hex);
    return kc_fields_digest(&fl);
}

#define RECORD_HEAD "ember-tune 1\n"

/* The record's text: what it is for (checked when read) and the choice. */
static char *record_format(const char *model, const kc_key *base, int c, int nc,
                           const jit_params *p, size_t *n) {
    char hex[KC_KEY_HEX_SIZE], params[64];
    kc_key_hex(base, hex);
    params_text(p, params, sizeof params);
    const char *fmt = RECORD_HEAD "kernel %s\nmodel %s\nchoice %d of %d\nparams %s\n";
    int len = snprintf(NULL, 0, fmt, hex, model, c, nc, params);
    char *text = len > 0 ? em_malloc((size_t)len + 1) : NULL;
    if (text) snprintf(text, (size_t)len + 1, fmt, hex, model, c, nc, params);
    *n = text ? (size_t)len : 0;
    return text;
}

/* The candidate the record text[0..n) chooses for base on model among
 * cands[0..nc), or -1 when it is not a valid record of exactly that. */
static int record_parse(const char *text, size_t n, const char *model, const kc_key *base,
                        const jit_params *cands, int nc) {
    char *want = NULL;
    size_t wn = 0;
    for (int c = 0; c < nc; c++) { /* the one well-formed text per candidate */
        want = record_format(model, base, c, nc, &cands[c], &wn);
        bool same = want && wn == n && memcmp(want, text, n) == 0;
        em_free(want);
        if (same) return c;
    }
    em_clear_error();
    return -1;
}

/* The remembered choice for kernel base among cands; -1: no record;
 * -2: a record that does not fit (logged: the default runs, untimed, so
 * that a bad record costs neither a wrong result nor a compile's time). */
static int recall(const jit_device *d, jit_env *env, const char *model, const kc_key *base,
                  const jit_params *cands, int nc) {
    if (!env->cache) return -1;
    kc_key rk = jit_tune_record_key(d, model, base);
    void *text = NULL;
    size_t n = 0;
    if (kc_get(env->cache, &rk, "tune", &text, &n) != EM_OK || !text) {
        em_clear_error();
        return -1;
    }
    int c = record_parse(text, n, model, base, cands, nc);
    em_free(text);
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(base, hex);
    if (c >= 0) return c;
    jit_logf(env->log, JIT_LOG_TUNE, "tune: kernel %s: its record does not fit this kernel, "
             "model or candidates: the default runs", hex);
    return -2;
}

static void remember(const jit_device *d, jit_env *env, const char *model, const kc_key *base, int c,
                     int nc, const jit_params *p) {
    size_t n;
    char *text = env->cache ? record_format(model, base, c, nc, p, &n) : NULL;
    kc_key rk = jit_tune_record_key(d, model, base);
    if (text) (void)kc_put(env->cache, &rk, "tune", text, n);
    em_free(text);
    em_clear_error(); /* a choice not stored only costs the next process its timing */
}

/* ---- timing ---- */

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Elements a buffer of meta m spans (its strides may skip or repeat). */
static int64_t span_of(const em_meta *m) {
    int64_t span = 1;
    for (int i = 0; i < m->ndim; i++) {
        if (m->sizes[i] == 0) return 0;
        span += (m->sizes[i] - 1) * (m->strides[i] < 0 ? -m->strides[i] : m->strides[i]);
    }
    return span;
}

/* Bytes kernel pk's buffers span in g: what one launch moves at most. */
static int64_t kernel_bytes(const tr_graph *g, const jit_plan_kernel *pk) {
    int64_t bytes = 0;
    for (int b = 0; b < pk->nbufs; b++) {
        const em_meta *m = &g->nodes[pk->bufs[b]].meta;
        bytes += span_of(m) * (int64_t)em_dtype_size(m->dtype);
    }
    return bytes;
}

/* "k3 (<key>)": plan kernel i, by its plain key, for the log. */
enum { LABEL_SIZE = 48 };
static void label_of(int i, const kc_key *plain, char out[LABEL_SIZE]) {
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(plain, hex);
    snprintf(out, LABEL_SIZE, "k%d (%s)", i, hex);
}

/* A kernel being tuned: its plan kernel, candidates and their times. */
typedef struct tune_job {
    int i;                                   /* plan kernel */
    char label[LABEL_SIZE];                  /* label_of it */
    int64_t bytes;                           /* its buffers' (kernel_bytes) */
    jit_params cands[JIT_TUNE_MAX_CANDIDATES];
    int nc;
    jit_kernel *loaded[JIT_TUNE_MAX_CANDIDATES];
    double t[JIT_TUNE_MAX_CANDIDATES];
} tune_job;

/* Times every candidate of job j on scratch buffers of kernel pk's real
 * sizes, through the device (or env's substitute timer); false: not timed
 * (logged, the default stays). */
static bool time_job(const jit_device *d, jit_env *env, const tr_graph *g, const jit_plan_kernel *pk,
                     const k_kernel *k, tune_job *j) {
    if (env->tune_time) {
        for (int c = 0; c < j->nc; c++, env->timed++)
            j->t[c] = env->tune_time(env->tune_ctx, k, c, &j->cands[c]);
        return true;
    }
    em_tensor *bufs[64] = {0};
    void *ptrs[64];
    bool ok = pk->nbufs <= 64;
    for (int b = 0; ok && b < pk->nbufs; b++) {
        const em_meta *m = &g->nodes[pk->bufs[b]].meta;
        em_meta s = {.ndim = 1, .sizes = {span_of(m)}, .strides = {1}, .dtype = m->dtype,
                     .device = m->device};
        ok = (bufs[b] = em_tensor_alloc(&s)) != NULL;
        if (ok) ptrs[b] = em_data(bufs[b]);
    }
    for (int c = 0; ok && c < j->nc; c++, env->timed++)
        ok = d->time(j->loaded[c], ptrs, NULL, JIT_TUNE_REPS, &j->t[c]) == EM_OK;
    for (int b = 0; b < pk->nbufs && b < 64; b++) em_release(bufs[b]);
    if (!ok) jit_logf(env->log, JIT_LOG_TUNE, "tune: kernel %s not timed: %s", j->label,
                      em_last_error()[0] ? em_last_error() : "too many buffers");
    em_clear_error();
    return ok;
}

/* The fastest candidate of j (ties: the earlier, so the default wins). */
static int fastest(const jit_env *env, const tune_job *j) {
    int best = 0;
    for (int c = 0; c < j->nc; c++) {
        char text[64];
        params_text(&j->cands[c], text, sizeof text);
        jit_logf(env->log, JIT_LOG_TUNE, "tune: kernel %s: candidate %d [%s]: %.4f ms", j->label, c,
                 text, 1e3 * j->t[c]);
        if (j->t[c] < j->t[best]) best = c;
    }
    return best;
}

/* Kernel i takes candidate p: its parameters and key. */
static void choose(jit_plan *p, kc_key *keys, jit_params *params, int i, const jit_params *cand) {
    params[i] = *cand;
    keys[i] = jit_tune_key(&keys[i], cand);
    p->kernels[i].key = keys[i];
}

/* ---- the pass ---- */

/* What the pass over a plan's kernels shares. */
typedef struct tuner {
    const jit_device *d;
    int index;
    jit_env *env;
    const tr_graph *g;
    jit_plan *p;
    k_kernel *const *ks;
    kc_key *keys;
    jit_params *params;
    char model[256];
    tune_job *jobs;
    int njobs;
    int *follow; /* per plan kernel: an identical earlier kernel with a job, or -1 */
} tuner;

/* Kernel i: its remembered choice taken, or a job made for it (or it
 * follows an identical kernel's job, or keeps its default). */
static void consider(tuner *T, int i) {
    const k_kernel *k = T->ks[i];
    if (!k || k->nsizes > 0) return; /* dynamic kernels keep their defaults */
    for (int j = 0; j < T->njobs; j++)
        if (kc_key_equal(&T->keys[T->jobs[j].i], &T->keys[i])) {
            T->follow[i] = T->jobs[j].i;
            return;
        }
    tune_job job = {.i = i};
    label_of(i, &T->keys[i], job.label);
    job.nc = T->d->variants(T->index, k, job.cands, JIT_TUNE_MAX_CANDIDATES);
    em_clear_error();
    if (job.nc <= 1) return;
    if (job.nc > JIT_TUNE_MAX_CANDIDATES) job.nc = JIT_TUNE_MAX_CANDIDATES;
    if ((job.bytes = kernel_bytes(T->g, &T->p->kernels[i])) < JIT_TUNE_MIN_BYTES) {
        jit_logf(T->env->log, JIT_LOG_TUNE, "tune: kernel %s: too small to tune", job.label);
        return;
    }
    int c = recall(T->d, T->env, T->model, &T->keys[i], job.cands, job.nc);
    if (c == -2) return;
    if (c >= 0) {
        jit_logf(T->env->log, JIT_LOG_TUNE, "tune: kernel %s: candidate %d of %d, remembered", job.label, c,
                 job.nc);
        T->env->tune_hits++;
        choose(T->p, T->keys, T->params, i, &job.cands[c]);
        return;
    }
    if (T->njobs < JIT_TUNE_MAX_KERNELS) {
        T->jobs[T->njobs++] = job;
        return;
    }
    /* past the cap, the largest kernels are tuned (what they move is
     * what tuning can win back) */
    int least = 0;
    for (int j = 1; j < T->njobs; j++)
        if (T->jobs[j].bytes < T->jobs[least].bytes) least = j;
    if (job.bytes > T->jobs[least].bytes) T->jobs[least] = job;
}

/* Every job's candidates compiled and loaded in one device call; false
 * (logged) when any failed: nothing is tuned. */
static bool load_candidates(tuner *T) {
    int n = T->njobs * JIT_TUNE_MAX_CANDIDATES;
    k_kernel **ks = em_calloc((size_t)n, sizeof *ks);
    kc_key *keys = em_calloc((size_t)n, sizeof *keys);
    jit_params *ps = em_calloc((size_t)n, sizeof *ps);
    jit_kernel **out = em_calloc((size_t)n, sizeof *out);
    bool ok = ks && keys && ps && out;
    for (int j = 0; ok && j < T->njobs; j++)
        for (int c = 0; c < T->jobs[j].nc; c++) {
            int at = j * JIT_TUNE_MAX_CANDIDATES + c, i = T->jobs[j].i;
            ks[at] = T->ks[i];
            ps[at] = T->jobs[j].cands[c];
            keys[at] = jit_tune_key(&T->keys[i], &ps[at]);
        }
    ok = ok && jit_get_kernels_with(T->d, T->index, T->env, ks, keys, ps, n, out) == EM_OK;
    if (!ok) jit_logf(T->env->log, JIT_LOG_TUNE, "tune: candidates not compiled (%s): defaults run",
                      em_last_error());
    em_clear_error();
    for (int at = 0; out && at < n; at++) {
        if (ok) T->jobs[at / JIT_TUNE_MAX_CANDIDATES].loaded[at % JIT_TUNE_MAX_CANDIDATES] = out[at];
        else if (out[at] && T->d->unload) T->d->unload(out[at]);
    }
    em_free(ks), em_free(keys), em_free(ps), em_free(out);
    return ok;
}

/* Times each job (until the budget is spent), keeps and remembers the
 * fastest candidate; unloads the candidates (the chosen one is loaded
 * again with the graph's kernels, from the device's table or the cache). */
static void run_jobs(tuner *T, double start) {
    for (int j = 0; j < T->njobs; j++) {
        tune_job *job = &T->jobs[j];
        int i = job->i;
        const k_kernel *k = T->ks[i];
        double budget = T->env->tune_budget > 0 ? T->env->tune_budget : JIT_TUNE_BUDGET;
        if (now() - start > budget) {
            jit_logf(T->env->log, JIT_LOG_TUNE, "tune: kernel %s: time budget spent, default", job->label);
        } else if (time_job(T->d, T->env, T->g, &T->p->kernels[i], k, job)) {
            int c = fastest(T->env, job);
            jit_logf(T->env->log, JIT_LOG_TUNE, "tune: kernel %s: chose candidate %d of %d", job->label, c,
                     job->nc);
            remember(T->d, T->env, T->model, &T->keys[i], c, job->nc, &job->cands[c]);
            T->env->tuned++;
            choose(T->p, T->keys, T->params, i, &job->cands[c]);
        }
        for (int c = 0; T->d->unload && c < job->nc; c++) T->d->unload(job->loaded[c]);
    }
}

em_status jit_tune_kernels(const jit_device *d, int index, jit_env *env, const tr_graph *g,
                           jit_plan *p, k_kernel *const *ks, kc_key *keys, jit_params *params) {
    tuner T = {d, index, env, g, p, ks, keys, params, {0}, NULL, 0, NULL};
    if (!d->model(index, T.model, sizeof T.model)) {
        em_clear_error();
        return EM_OK;
    }
    T.jobs = em_calloc(JIT_TUNE_MAX_KERNELS, sizeof *T.jobs);
    T.follow = em_malloc(sizeof(int) * ((size_t)p->nkernels + 1));
    if (!T.jobs || !T.follow) {
        em_free(T.jobs), em_free(T.follow);
        return em_last_status();
    }
    for (int i = 0; i < p->nkernels; i++) T.follow[i] = -1;
    for (int i = 0; i < p->nkernels; i++) consider(&T, i);
    /* the budget bounds the timing, not the candidates' compile: NVRTC took
     * 0.25-0.7 s for one kernel in a cold process on the H200, so a
     * budget that counted it never timed anything there */
    if (T.njobs > 0 && load_candidates(&T)) run_jobs(&T, now());
    for (int i = 0; i < p->nkernels; i++) /* identical kernels take the same choice */
        if (T.follow[i] >= 0) choose(p, keys, params, i, &params[T.follow[i]]);
    em_free(T.jobs);
    em_free(T.follow);
    return EM_OK;
}
