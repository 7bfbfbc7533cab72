/* cuda_source.c - generated CUDA C kernels: keys, the kernel cache,
 * NVRTC and launches (see cuda_source.h). */
#include "cuda_source.h"

#ifdef EMBER_HAVE_CUDA

#include <stdlib.h>
#include <string.h>

/* The key of the text parts[0..n) for target (the fields cuda_source.h
 * names; the text as one "source" field per part). */
static kc_key source_key(const char *target, const char *const *parts, int n) {
    kc_fields fl;
    kc_fields_begin(&fl, NULL);
    kc_fields_str(&fl, "what", "ember cuda source");
    kc_fields_str(&fl, "device", "cuda");
    kc_fields_str(&fl, "target", target);
    for (int i = 0; i < n; i++) kc_fields_str(&fl, "source", parts[i]);
    return kc_fields_digest(&fl);
}

/* parts[0..n) as one string (em_malloc'd), or NULL. */
static char *joined(const char *const *parts, int n) {
    size_t len = 0;
    for (int i = 0; i < n; i++) len += strlen(parts[i]);
    char *t = em_malloc(len + 1), *w = t;
    for (int i = 0; t && i < n; i++) {
        size_t k = strlen(parts[i]);
        memcpy(w, parts[i], k);
        w += k;
    }
    if (t) *w = '\0';
    return t;
}

/* NVRTC on text with key embedded (cuda_text_with_key; the launch
 * descriptor is a serial one, unused: the generator sizes its launches),
 * as a cubin for arch, else PTX for an NVRTC that does not know it. */
static em_status compile(const char *text, const kc_key *key, int arch, void **bin, size_t *n) {
    cuda_src src = {.text = (char *)text, .shape = CU_SERIAL, .threads = 1, .unroll = 1,
                    .extent_size = -1};
    char *keyed = cuda_text_with_key(&src, JIT_KERNEL_NAME, key->bytes);
    if (!keyed) return em_last_status();
    em_status s = cuda_nvrtc_compile(keyed, JIT_KERNEL_NAME, arch, false, bin, n);
    if (s == EM_ERR_UNSUPPORTED) {
        em_clear_error();
        s = cuda_nvrtc_compile(keyed, JIT_KERNEL_NAME, arch, true, bin, n);
    }
    em_free(keyed);
    return s;
}

/* The kernel under key from the disk cache, loaded; NULL on a miss or an
 * entry that does not load (logged: it is then compiled again). */
static cuda_kernel *load_cached(cuda_device *d, kc_cache *cache, const kc_key *key,
                                const jit_log *log) {
    void *img = NULL;
    size_t n = 0;
    cuda_kernel *k = NULL;
    if (cache && kc_get(cache, key, "cubin", &img, &n) == EM_OK && img &&
        cuda_kernel_load(d, img, key, &k) != EM_OK) {
        jit_logf(log, JIT_LOG_CACHE, "cache: a generated kernel's image did not load: %s",
                 em_last_error());
        k = NULL;
    }
    em_free(img);
    em_clear_error();
    return k;
}

/* k under key in d's table, or the kernel another thread put there first
 * (k then stays loaded unused: two threads compiled one text). */
static cuda_kernel *publish(cuda_device *d, const kc_key *key, cuda_kernel *k) {
    pthread_mutex_lock(&d->lock);
    cuda_kernel *have = cuda_kernel_table_find(d, key);
    if (!have && cuda_kernel_table_add(d, key, k)) have = k;
    pthread_mutex_unlock(&d->lock);
    return have ? have : k; /* out of memory for the table: used, not kept */
}

static void count(cuda_device *d, cuda_get_stats *stats, bool compiled) {
    pthread_mutex_lock(&d->lock);
    if (compiled) stats->compiled++;
    else stats->loaded++;
    pthread_mutex_unlock(&d->lock);
}

em_status cuda_source_get(cuda_device *d, const char *text, kc_cache *cache, const jit_log *log,
                          cuda_get_stats *stats, const cuda_kernel **out) {
    return cuda_source_get_parts(d, &text, 1, cache, log, stats, out);
}

em_status cuda_source_get_parts(cuda_device *d, const char *const *parts, int nparts, kc_cache *cache,
                                const jit_log *log, cuda_get_stats *stats, const cuda_kernel **out) {
    char target[256];
    int arch = d->major * 10 + d->minor;
    if (!cuda_target_string(arch, target, sizeof target))
        return em_error(EM_ERR_ARG, "cuda: target string too long");
    kc_key key = source_key(target, parts, nparts);
    pthread_mutex_lock(&d->lock);
    cuda_kernel *k = cuda_kernel_table_find(d, &key);
    pthread_mutex_unlock(&d->lock);
    if (k) {
        *out = k;
        return EM_OK;
    }
    if ((k = load_cached(d, cache, &key, log))) {
        count(d, stats, false);
        *out = publish(d, &key, k);
        return EM_OK;
    }
    void *img = NULL;
    size_t n = 0;
    char *text = joined(parts, nparts);
    em_status s = text ? compile(text, &key, arch, &img, &n) : em_last_status(); /* unlocked: slow */
    em_free(text);
    if (s == EM_OK) s = cuda_kernel_load(d, img, &key, &k);
    if (s == EM_OK && cache && kc_put(cache, &key, "cubin", img, n) != EM_OK) {
        jit_logf(log, JIT_LOG_CACHE, "cache: a generated kernel not stored: %s", em_last_error());
        em_clear_error(); /* only the next process pays a compile */
    }
    em_free(img);
    if (s != EM_OK) return s;
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(&key, hex);
    jit_logf(log, JIT_LOG_CACHE, "compiled: generated cuda kernel (%s)", hex);
    count(d, stats, true);
    *out = publish(d, &key, k);
    return EM_OK;
}

em_status cuda_source_launch(cuda_device *d, const cuda_kernel *k, unsigned grid, unsigned block,
                             unsigned smem, void **args) {
    const cu_api *cu = cuda_driver();
    if (!cu) return em_last_status();
    if (grid == 0) return EM_OK;
    /* past 48 KiB a function must opt in, once per size (a driver call
     * per launch cost about a microsecond); two threads may both opt in */
    int *optin = (int *)&k->smem_optin;
    if (smem > 48 * 1024 && (int)smem > __atomic_load_n(optin, __ATOMIC_RELAXED)) {
        em_status s = cuda_check(cu->FuncSetAttribute(k->fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                                      (int)smem),
                                 "cuFuncSetAttribute");
        if (s != EM_OK) return s;
        __atomic_store_n(optin, (int)smem, __ATOMIC_RELAXED);
    }
    return cuda_launch_fn(d, k->fn, grid, block, smem, args);
}

#endif /* EMBER_HAVE_CUDA */
