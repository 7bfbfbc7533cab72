/* cuda_kernel.c - NVRTC compilation, the kernel cache and launches (see
 * cuda_kernel.h). */
#include "cuda_kernel.h"

#include "cuda_jit.h" /* cuda_timer: autotuning's timing */

#ifdef EMBER_HAVE_CUDA

#include <stdlib.h>
#include <string.h>

/* ---- NVRTC ---- */

static pthread_once_t version_once = PTHREAD_ONCE_INIT;
static char version_text[32];

static void read_version(void) {
    const nvrtc_api *nv = cuda_nvrtc();
    int major = 0, minor = 0;
    if (nv && nv->Version(&major, &minor) == NVRTC_SUCCESS)
        snprintf(version_text, sizeof version_text, "nvrtc %d.%d", major, minor);
}

const char *cuda_nvrtc_version(void) {
    if (!cuda_nvrtc()) return NULL;
    pthread_once(&version_once, read_version);
    return version_text[0] ? version_text : NULL;
}

static em_status nvrtc_failed(const nvrtc_api *nv, nvrtcProgram p, nvrtcResult r, const char *name) {
    size_t n = 0;
    char *log = NULL;
    if (p && nv->GetProgramLogSize(p, &n) == NVRTC_SUCCESS && n > 1 && (log = malloc(n)))
        nv->GetProgramLog(p, log);
    em_status s = em_error(r == NVRTC_ERROR_INVALID_OPTION ? EM_ERR_UNSUPPORTED : EM_ERR_STATE,
                           "NVRTC: kernel %s: %s%s%.300s", name, nv->GetErrorString(r),
                           log ? ": " : "", log ? log : "");
    free(log);
    return s;
}

em_status cuda_nvrtc_compile(const char *src, const char *name, int arch, bool ptx, void **bin,
                             size_t *n) {
    *bin = NULL;
    *n = 0;
    const nvrtc_api *nv = cuda_nvrtc();
    if (!nv) return em_last_status();
    char opt[64];
    snprintf(opt, sizeof opt, "--gpu-architecture=%s_%d", ptx ? "compute" : "sm", arch);
    const char *opts[] = {opt, "--std=c++17"};
    nvrtcProgram p = NULL;
    nvrtcResult r = nv->CreateProgram(&p, src, name, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS) return nvrtc_failed(nv, NULL, r, name);
    r = nv->CompileProgram(p, 2, opts);
    size_t size = 0;
    if (r == NVRTC_SUCCESS) r = ptx ? nv->GetPTXSize(p, &size) : nv->GetCUBINSize(p, &size);
    em_status s = EM_OK;
    if (r != NVRTC_SUCCESS) {
        s = nvrtc_failed(nv, p, r, name);
    } else if (!(*bin = em_malloc(size ? size : 1))) {
        s = em_last_status();
    } else {
        r = ptx ? nv->GetPTX(p, *bin) : nv->GetCUBIN(p, *bin);
        if (r != NVRTC_SUCCESS) {
            s = nvrtc_failed(nv, p, r, name);
            em_free(*bin);
            *bin = NULL;
        } else {
            *n = size;
        }
    }
    nv->DestroyProgram(&p);
    return s;
}

/* ---- keys and the device's table ---- */

/* The key names NVRTC by the toolkit Ember was built against and the
 * soname it loads (libnvrtc.so.13 of CUDA_VERSION), not by asking the
 * library: a cache hit then never loads NVRTC, which costs 6-15 ms warm
 * and ~180 ms cold (TOOLCHAIN.md) -- most of a warm first call.  Bundles
 * carry the NVRTC version as loaded (ember-cache export). */
#define STR_(x) #x
#define STR(x) STR_(x)
#define NVRTC_ID "libnvrtc.so.13 from CUDA " STR(CUDA_VERSION)

bool cuda_target_string(int arch, char *buf, size_t n) {
    int w = snprintf(buf, n, "sm_%d %s %s --std=c++17", arch, CUDA_EMIT_VERSION, NVRTC_ID);
    return w > 0 && (size_t)w < n;
}

int cuda_target_arch(const char *target) {
    int arch = 0;
    return target && sscanf(target, "sm_%d", &arch) == 1 && arch >= 10 && arch < 1000 ? arch : -1;
}

/* The kernel table's index: open addressing on the key's first 8 bytes
 * (a hash already), every eager op looks a kernel up. */
static int index_slot(const kc_key *key, int cap) {
    uint64_t h;
    memcpy(&h, key->bytes, sizeof h);
    return (int)(h & (uint64_t)(cap - 1));
}

/* The loaded kernel under key, or NULL.  Called with d->lock held. */
cuda_kernel *cuda_kernel_table_find(cuda_device *d, const kc_key *key) {
    if (!d->capindex) return NULL;
    for (int j = index_slot(key, d->capindex); d->kindex[j] >= 0; j = (j + 1) & (d->capindex - 1))
        if (kc_key_equal(&d->kernels[d->kindex[j]].key, key)) return d->kernels[d->kindex[j]].kernel;
    return NULL;
}

/* Rebuilds the index at cap slots (a power of two over twice the entries). */
static bool index_rebuild(cuda_device *d, int cap) {
    int *ix = malloc(sizeof(int) * (size_t)cap);
    if (!ix) return false;
    for (int j = 0; j < cap; j++) ix[j] = -1;
    for (int i = 0; i < d->nkernels; i++) {
        int j = index_slot(&d->kernels[i].key, cap);
        while (ix[j] >= 0) j = (j + 1) & (cap - 1);
        ix[j] = i;
    }
    free(d->kindex);
    d->kindex = ix;
    d->capindex = cap;
    return true;
}

bool cuda_kernel_table_add(cuda_device *d, const kc_key *key, cuda_kernel *k) {
    if (d->nkernels == d->capkernels) {
        int cap = d->capkernels ? 2 * d->capkernels : 32;
        cuda_kernel_entry *e = realloc(d->kernels, sizeof *e * (size_t)cap);
        if (!e) return false;
        d->kernels = e;
        d->capkernels = cap;
    }
    d->kernels[d->nkernels++] = (cuda_kernel_entry){*key, k};
    if (2 * d->nkernels > d->capindex) { /* the rebuilt index holds the new entry too */
        if (index_rebuild(d, d->capindex ? 2 * d->capindex : 64)) return true;
        d->nkernels--;
        return false;
    }
    int j = index_slot(key, d->capindex);
    while (d->kindex[j] >= 0) j = (j + 1) & (d->capindex - 1);
    d->kindex[j] = d->nkernels - 1;
    return true;
}

/* Whether module carries NAME__key (cuda_text_with_key) equal to key: an
 * image filed under another kernel's key (with a header that fits it)
 * loads and links fine, and would compute the other kernel. */
static em_status check_key(cuda_device *d, CUmodule module, const char *name, const kc_key *key) {
    const cu_api *cu = cuda_driver();
    char sym[96];
    snprintf(sym, sizeof sym, "%s" CUDA_KEY_SUFFIX, name);
    CUdeviceptr p = 0;
    size_t bytes = 0;
    unsigned char got[16];
    bool ok = cu->ModuleGetGlobal(&p, &bytes, module, sym) == CUDA_SUCCESS && bytes == sizeof got &&
              cu->MemcpyDtoHAsync(got, p, sizeof got, d->stream) == CUDA_SUCCESS &&
              cu->StreamSynchronize(d->stream) == CUDA_SUCCESS &&
              memcmp(got, key->bytes, sizeof got) == 0;
    if (ok) return EM_OK;
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(key, hex);
    return em_error(EM_ERR_STATE, "cuda: the image filed under %s was compiled for another key "
                    "(or carries none): not loaded", hex);
}

/* The launch descriptor NAME__launch (cuda_text_with_key) of module. */
static em_status read_launch(cuda_device *d, CUmodule module, const char *name, cuda_kernel *ck) {
    const cu_api *cu = cuda_driver();
    char sym[96];
    snprintf(sym, sizeof sym, "%s" CUDA_LAUNCH_SUFFIX, name);
    CUdeviceptr p = 0;
    size_t bytes = 0;
    long long w[CUDA_LAUNCH_WORDS];
    bool ok = cu->ModuleGetGlobal(&p, &bytes, module, sym) == CUDA_SUCCESS && bytes == sizeof w &&
              cu->MemcpyDtoHAsync(w, p, sizeof w, d->stream) == CUDA_SUCCESS &&
              cu->StreamSynchronize(d->stream) == CUDA_SUCCESS;
    /* range-checked: a launch with nonsense geometry is refused, not made */
    ok = ok && w[0] >= CU_FLAT && w[0] <= CU_SERIAL && w[1] >= 1 && w[1] <= 1024 && w[2] >= 1 &&
         w[2] <= 64 && w[3] >= 0 && (w[5] == 0 || w[5] == 1) && w[6] >= 0 && w[6] <= 4096 &&
         w[7] >= 0 && w[7] <= 4096 && w[4] >= -1 && w[4] < w[7] && w[8] >= 1 && w[8] <= 16 &&
         (w[8] == 1 || w[0] == CU_ROWS);
    if (!ok) return em_error(EM_ERR_STATE, "cuda: the image has no valid launch descriptor: not loaded");
    ck->shape = (cuda_shape)w[0];
    ck->threads = (int)w[1];
    ck->unroll = (int)w[2];
    ck->extent = w[3];
    ck->extent_size = (int)w[4];
    ck->vec4 = w[5] != 0;
    ck->nbufs = (int)w[6];
    ck->nsizes = (int)w[7];
    ck->cluster = (int)w[8];
    return EM_OK;
}

/* Clusters of more than 8 blocks (not portable) must be allowed per
 * function before their launch. */
static em_status allow_cluster(const cuda_kernel *ck) {
    const cu_api *cu = cuda_driver();
    if (ck->cluster <= 8) return EM_OK;
    em_status s = cuda_check(cu->FuncSetAttribute(ck->fn, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                             "cuFuncSetAttribute (clusters above 8 blocks)");
    if (s == EM_OK && ck->fn_v4)
        s = cuda_check(cu->FuncSetAttribute(ck->fn_v4, CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                       "cuFuncSetAttribute (clusters above 8 blocks)");
    return s;
}

/* Clusters of fn that run at once on d (its registers and shared memory
 * decide how many fit), 0 when the driver cannot say or fn is not a
 * cluster kernel. */
static int clusters_of(const cuda_device *d, const cuda_kernel *ck, CUfunction fn) {
    const cu_api *cu = cuda_driver();
    if (ck->cluster <= 1 || !cu->OccupancyMaxActiveClusters) return 0;
    CUlaunchAttribute attr = {.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION};
    attr.value.clusterDim.x = (unsigned)ck->cluster;
    attr.value.clusterDim.y = attr.value.clusterDim.z = 1;
    CUlaunchConfig cfg = {.gridDimX = (unsigned)ck->cluster, .gridDimY = 1, .gridDimZ = 1,
                          .blockDimX = (unsigned)ck->threads, .blockDimY = 1, .blockDimZ = 1,
                          .hStream = cuda_stream(d), .attrs = &attr, .numAttrs = 1};
    int n = 0;
    return cu->OccupancyMaxActiveClusters(&n, fn, &cfg) == CUDA_SUCCESS && n > 0 ? n : 0;
}

em_status cuda_kernel_load(cuda_device *d, const void *img, const kc_key *key, cuda_kernel **out) {
    const cu_api *cu = cuda_driver();
    cuda_kernel *ck = calloc(1, sizeof *ck); /* owned by the device, process-long */
    if (!ck) return em_error(EM_ERR_NOMEM, "cuda: out of host memory");
    const char *name = JIT_KERNEL_NAME;
    em_status s = cuda_check(cu->ModuleLoadData(&ck->module, img), "cuModuleLoadData");
    if (s == EM_OK) s = check_key(d, ck->module, name, key);
    if (s == EM_OK) s = read_launch(d, ck->module, name, ck);
    if (s == EM_OK) s = cuda_check(cu->ModuleGetFunction(&ck->fn, ck->module, name), "cuModuleGetFunction");
    if (s == EM_OK && ck->vec4)
        s = cuda_check(cu->ModuleGetFunction(&ck->fn_v4, ck->module, JIT_KERNEL_NAME "_v4"),
                       "cuModuleGetFunction");
    if (s == EM_OK) s = allow_cluster(ck);
    if (s == EM_OK) {
        ck->clusters[0] = clusters_of(d, ck, ck->fn);
        ck->clusters[1] = ck->fn_v4 ? clusters_of(d, ck, ck->fn_v4) : 0;
    }
    if (s != EM_OK) {
        if (ck->module) cu->ModuleUnload(ck->module);
        free(ck);
        return s;
    }
    ck->device = d->index;
    *out = ck;
    return EM_OK;
}

/* NVRTC on src's text with key and the launch descriptor embedded. */
static em_status compile_keyed(const cuda_src *src, const kc_key *key, int arch, bool ptx,
                               void **bin, size_t *n) {
    char *text = cuda_text_with_key(src, JIT_KERNEL_NAME, key->bytes);
    if (!text) return em_last_status();
    em_status s = cuda_nvrtc_compile(text, JIT_KERNEL_NAME, arch, ptx, bin, n);
    em_free(text);
    return s;
}

em_status cuda_kernel_compile(const k_kernel *k, const cuda_row_params *p, const kc_key *key, int arch,
                              void **bin, size_t *n) {
    /* every image names its function JIT_KERNEL_NAME: a loader knows only
     * the key (the name is not part of the computation) */
    k_kernel named = *k;
    named.name = (char *)JIT_KERNEL_NAME;
    cuda_src src;
    em_status s = cuda_emit_with(&named, arch, p, &src);
    if (s != EM_OK) return s;
    s = compile_keyed(&src, key, arch, false, bin, n);
    if (s == EM_ERR_UNSUPPORTED) { /* an NVRTC older than the GPU: PTX for the driver to finish */
        em_clear_error();
        s = compile_keyed(&src, key, arch, true, bin, n);
        if (s == EM_ERR_UNSUPPORTED) {
            em_clear_error();
            s = compile_keyed(&src, key, 90, true, bin, n);
        }
    }
    cuda_src_free(&src);
    return s;
}

/* ---- autotuning ---- */

cuda_row_params cuda_row_params_of(const jit_params *p) {
    return (cuda_row_params){.elems = p ? p->v[0] : 0, .lane_bytes = p ? p->v[1] : 0};
}

/* Whether candidate c prints a rows kernel unlike every one in texts
 * (then its text joins them). */
static bool distinct(const k_kernel *k, const jit_params *c, char **texts, int n) {
    cuda_row_params rp = cuda_row_params_of(c);
    cuda_src src;
    if (cuda_emit_with(k, 0, &rp, &src) != EM_OK) {
        em_clear_error();
        return false;
    }
    bool rows = src.shape == CU_ROWS && !src.tiled, fresh = rows;
    for (int i = 0; fresh && i < n; i++) fresh = strcmp(texts[i], src.text) != 0;
    if (fresh) texts[n] = src.text;
    else cuda_src_free(&src);
    return fresh;
}

/* The candidates: elements per thread about the default for rows a block
 * or more wide (16 was within 3% of 32 on the H200's 4096-wide rows, 64
 * halves the blocks of the widest), lane bytes about the default for
 * short rows (lanes a 37-wide row: 4 at 64 bytes, 2 at 128, 8 at 32:
 * docs/benchmarks.md).  Candidates that print the default's text (an
 * override in the environment, a row too short or too long for the
 * parameter to matter) are dropped: every candidate left is a different
 * kernel. */
int cuda_kernel_variants(const k_kernel *k, jit_params *out, int max) {
    static const jit_params cands[] = {
        {{0, 0, 0, 0}}, {{16, 0, 0, 0}}, {{64, 0, 0, 0}}, {{0, 32, 0, 0}}, {{0, 128, 0, 0}},
    };
    char *texts[sizeof cands / sizeof cands[0]];
    int n = 0;
    for (size_t c = 0; c < sizeof cands / sizeof cands[0] && n < max; c++)
        if (distinct(k, &cands[c], texts, n)) out[n++] = cands[c];
    for (int i = 0; i < n; i++) em_free(texts[i]);
    if (n == 0 && max > 0) out[n++] = cands[0]; /* not a rows kernel: the default only */
    return n;
}

em_status cuda_kernel_time(cuda_device *d, const cuda_kernel *ck, void *const *bufs,
                           const int64_t *sizes, int reps, double *seconds) {
    enum { MAX_REPS = 16 };
    double t[MAX_REPS];
    int n = reps < 1 ? 1 : reps > MAX_REPS ? MAX_REPS : reps;
    cuda_timer *timer = cuda_timer_new(d->index);
    if (!timer) return em_last_status();
    em_status s = cuda_kernel_launch(d, ck, bufs, sizes); /* untimed: caches, clocks */
    for (int r = 0; s == EM_OK && r < n; r++) {
        s = cuda_timer_start(timer);
        if (s == EM_OK) s = cuda_kernel_launch(d, ck, bufs, sizes);
        if (s == EM_OK) s = cuda_timer_stop(timer, &t[r]);
    }
    cuda_timer_free(timer);
    if (s == EM_OK) *seconds = jit_median(t, n);
    return s;
}

/* ---- launching ---- */

/* Blocks to launch.  A block (a cluster) for each step of work, as many
 * as that makes: the hardware hands blocks to SMs as others finish, which
 * balances the tail better than fewer blocks stepping over the range by
 * the grid (on the H200 the sweep's rows and pointwise kernels ran 3-20%
 * faster than with one block an SM's thread capacity: docs/benchmarks.md).
 * Cluster kernels, whose rows are long, keep to one wave of the clusters
 * that fit at once: there many clusters of a few rows each ran slower. */
static unsigned grid_of(const cuda_device *d, const cuda_kernel *ck, int64_t extent, bool v4) {
    int64_t want, per_block = (int64_t)ck->threads * (v4 ? 4 : ck->unroll);
    switch (ck->shape) {
    case CU_FLAT: want = (extent + per_block - 1) / per_block; break;
    case CU_ROWS: want = (extent + ck->unroll - 1) / (ck->unroll > 0 ? ck->unroll : 1); break; /* unroll: rows a block */
    default: return 1;
    }
    int64_t unit = ck->cluster > 1 ? ck->cluster : 1, cap = INT32_MAX / unit;
    if (unit > 1 && ck->clusters[v4] > 0) cap = ck->clusters[v4];
    else if (unit > 1) { /* the driver cannot say: 2048 threads an SM */
        int64_t per_sm = 2048 / ck->threads;
        cap = (int64_t)d->sm_count * (per_sm > 0 ? per_sm : 1) / unit;
    }
    if (want > cap) want = cap;
    return (unsigned)((want > 0 ? want : 1) * unit);
}

em_status cuda_kernel_launch(cuda_device *d, const cuda_kernel *ck, void *const *bufs,
                             const int64_t *sizes) {
    if (ck->nsizes > 0 && !sizes)
        return em_error(EM_ERR_ARG, "cuda: a kernel with %d size parameters launched without sizes",
                        ck->nsizes);
    int64_t extent = ck->extent_size >= 0 ? sizes[ck->extent_size] : ck->extent;
    if (extent <= 0 && ck->shape != CU_SERIAL) return EM_OK; /* nothing to do */
    enum { STACK = 32 };
    void *args_stack[STACK];
    CUdeviceptr ptr_stack[STACK];
    long long size_stack[STACK];
    int na = ck->nbufs + ck->nsizes;
    void **args = na <= STACK ? args_stack : em_malloc(sizeof(void *) * (size_t)na);
    CUdeviceptr *ptrs = ck->nbufs <= STACK ? ptr_stack : em_malloc(sizeof *ptrs * (size_t)ck->nbufs);
    long long *sz = ck->nsizes <= STACK ? size_stack : em_malloc(sizeof *sz * (size_t)ck->nsizes);
    em_status s = args && ptrs && sz ? EM_OK : em_last_status();
    for (int i = 0; s == EM_OK && i < ck->nbufs; i++) {
        ptrs[i] = (CUdeviceptr)(uintptr_t)bufs[i];
        args[i] = &ptrs[i];
    }
    for (int i = 0; s == EM_OK && i < ck->nsizes; i++) {
        sz[i] = sizes[i];
        args[ck->nbufs + i] = &sz[i];
    }
    bool v4 = ck->fn_v4 != NULL; /* needs every buffer 16-byte aligned */
    for (int i = 0; v4 && i < ck->nbufs; i++) v4 = (ptrs[i] & 15) == 0;
    if (s == EM_OK)
        s = cuda_launch_cluster(d, v4 ? ck->fn_v4 : ck->fn, grid_of(d, ck, extent, v4),
                                (unsigned)ck->threads, (unsigned)ck->cluster, args);
    if (args != args_stack) em_free(args);
    if (ptrs != ptr_stack) em_free(ptrs);
    if (sz != size_stack) em_free(sz);
    return s;
}

#endif /* EMBER_HAVE_CUDA */
