/* cuda_kernel.c - NVRTC compilation, the kernel cache and launches (see
 * cuda_kernel.h). */
#include "cuda_kernel.h"

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
 * and ~180 ms cold (TOOLCHAIN.md) -- most of a warm first call. */
#define STR_(x) #x
#define STR(x) STR_(x)
#define NVRTC_ID "libnvrtc.so.13 from CUDA " STR(CUDA_VERSION)

static kc_key kernel_key(const cuda_device *d, const char *text, bool ptx) {
    kc_hasher h;
    char target[64];
    snprintf(target, sizeof target, "%s_%d%d --std=c++17", ptx ? "compute" : "sm", d->major, d->minor);
    kc_hasher_reset(&h);
    kc_hasher_update_str(&h, "ember cuda kernel " CUDA_EMIT_VERSION);
    kc_hasher_update_str(&h, NVRTC_ID);
    kc_hasher_update_str(&h, target);
    kc_hasher_update_str(&h, text);
    return kc_hasher_digest(&h);
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

/* Loads a cubin or PTX image as a kernel of the shape src describes,
 * checking that it was compiled for key. */
static em_status load_image(cuda_device *d, const void *img, const cuda_src *src,
                            const k_kernel *k, const kc_key *key, cuda_kernel **out) {
    const cu_api *cu = cuda_driver();
    cuda_kernel *ck = calloc(1, sizeof *ck); /* owned by the device, process-long */
    if (!ck) return em_error(EM_ERR_NOMEM, "cuda: out of host memory");
    em_status s = cuda_check(cu->ModuleLoadData(&ck->module, img), "cuModuleLoadData");
    if (s == EM_OK) s = check_key(d, ck->module, k->name, key);
    if (s == EM_OK) s = cuda_check(cu->ModuleGetFunction(&ck->fn, ck->module, k->name), "cuModuleGetFunction");
    if (s == EM_OK && src->vec4) {
        char v4[80];
        snprintf(v4, sizeof v4, "%s_v4", k->name);
        s = cuda_check(cu->ModuleGetFunction(&ck->fn_v4, ck->module, v4), "cuModuleGetFunction");
    }
    if (s != EM_OK) {
        if (ck->module) cu->ModuleUnload(ck->module);
        free(ck);
        return s;
    }
    ck->shape = src->shape;
    ck->threads = src->threads;
    ck->unroll = src->unroll;
    ck->extent = src->extent;
    ck->nbufs = k->nbufs;
    ck->nsizes = k->nsizes;
    *out = ck;
    return EM_OK;
}

/* Compiles src: a cubin for the device, or PTX when NVRTC does not know
 * the device's architecture (a GPU newer than the NVRTC). */
/* NVRTC on src's text with the key of (src, ptx) embedded. */
static em_status compile_keyed(const cuda_device *d, const cuda_src *src, const k_kernel *k,
                               int arch, bool ptx, void **bin, size_t *n) {
    kc_key key = kernel_key(d, src->text, ptx);
    char *text = cuda_text_with_key(src->text, k->name, key.bytes);
    if (!text) return em_last_status();
    em_status s = cuda_nvrtc_compile(text, k->name, arch, ptx, bin, n);
    em_free(text);
    return s;
}

static em_status compile_for(const cuda_device *d, const cuda_src *src, const k_kernel *k,
                             bool *ptx, void **bin, size_t *n) {
    int arch = d->major * 10 + d->minor;
    *ptx = false;
    em_status s = compile_keyed(d, src, k, arch, false, bin, n);
    if (s == EM_ERR_UNSUPPORTED) {
        em_clear_error();
        *ptx = true;
        s = compile_keyed(d, src, k, arch, true, bin, n);
        if (s == EM_ERR_UNSUPPORTED) {
            em_clear_error();
            s = compile_keyed(d, src, k, 90, true, bin, n);
        }
    }
    return s;
}

/* From the kernel cache (cubin, then ptx), else compiled and stored. */
static em_status fetch_or_compile(cuda_device *d, const cuda_src *src, const k_kernel *k,
                                  kc_cache *cache, cuda_get_stats *stats, cuda_kernel **out) {
    void *bin = NULL;
    size_t n = 0;
    for (int ptx = 0; cache && ptx < 2 && !bin; ptx++) {
        kc_key key = kernel_key(d, src->text, ptx);
        if (kc_get(cache, &key, ptx ? "ptx" : "cubin", &bin, &n) != EM_OK) bin = NULL;
        if (bin && load_image(d, bin, src, k, &key, out) != EM_OK) { /* stale or foreign: rebuild */
            em_clear_error();
            em_free(bin);
            bin = NULL;
        }
    }
    if (bin) {
        stats->loaded++;
        em_free(bin);
        return EM_OK;
    }
    bool ptx;
    em_status s = compile_for(d, src, k, &ptx, &bin, &n);
    if (s != EM_OK) return s;
    stats->compiled++;
    kc_key key = kernel_key(d, src->text, ptx);
    if (cache && kc_put(cache, &key, ptx ? "ptx" : "cubin", bin, n) != EM_OK) em_clear_error();
    s = load_image(d, bin, src, k, &key, out);
    em_free(bin);
    return s;
}

em_status cuda_kernel_get(cuda_device *d, const k_kernel *k, kc_cache *cache,
                          cuda_get_stats *stats, const cuda_kernel **out) {
    cuda_src src;
    em_status s = cuda_emit(k, &src);
    if (s != EM_OK) return s;
    kc_key key = kernel_key(d, src.text, false);
    /* One lock for lookup and compile: two threads wanting the same new
     * kernel compile it once. */
    pthread_mutex_lock(&d->lock);
    cuda_kernel *ck = cuda_kernel_table_find(d, &key);
    if (ck) {
        stats->loaded++;
    } else if ((s = fetch_or_compile(d, &src, k, cache, stats, &ck)) == EM_OK &&
               !cuda_kernel_table_add(d, &key, ck)) {
        s = em_error(EM_ERR_NOMEM, "cuda: out of host memory");
    }
    pthread_mutex_unlock(&d->lock);
    cuda_src_free(&src);
    if (s == EM_OK) *out = ck;
    return s;
}

/* ---- launching ---- */

static unsigned grid_of(const cuda_device *d, const cuda_kernel *ck, bool v4) {
    int64_t per_sm = 2048 / ck->threads, cap = (int64_t)d->sm_count * (per_sm > 0 ? per_sm : 1);
    int64_t want, per_block = (int64_t)ck->threads * (v4 ? 4 : ck->unroll);
    switch (ck->shape) {
    case CU_FLAT: want = (ck->extent + per_block - 1) / per_block; break;
    case CU_ROWS: want = ck->extent; break;
    default: return 1;
    }
    if (want > cap) want = cap;
    return want > 0 ? (unsigned)want : 1;
}

em_status cuda_kernel_launch(cuda_device *d, const cuda_kernel *ck, void *const *bufs,
                             const int64_t *sizes) {
    if (ck->extent <= 0 && ck->shape != CU_SERIAL) return EM_OK; /* nothing to do */
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
        s = cuda_check(cuda_driver()->LaunchKernel(v4 ? ck->fn_v4 : ck->fn, grid_of(d, ck, v4), 1, 1,
                                                    (unsigned)ck->threads, 1, 1, 0, d->stream,
                                                    args, NULL),
                       "cuLaunchKernel");
    if (args != args_stack) em_free(args);
    if (ptrs != ptr_stack) em_free(ptrs);
    if (sz != size_stack) em_free(sz);
    return s;
}

#endif /* EMBER_HAVE_CUDA */
