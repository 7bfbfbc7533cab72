/* cuda_native.c - eager CUDA ops that run as generated CUDA C (cuda_source.h)
 * rather than as a one-node graph: cat, index_select (and so embedding),
 * index_copy_,
 * arange, rand, randn and argmax.  Before, these ran the CPU kernel on a
 * host copy of their inputs (index_select copied only its indices, to check
 * them); now nothing leaves the GPU and no call waits for the stream.
 *
 * Why generated text and not kernel IR:
 *  - rand/randn need Philox's 32-bit mulhi, which the IR cannot say;
 *  - arange must equal the CPU bit for bit, start + i*step rounded twice,
 *    and NVRTC contracts a multiply and an add into an FMA by default
 *    (--fmad=true, which cuda_kernel.c leaves on): the text says
 *    __dmul_rn/__dadd_rn, which are never contracted;
 *  - sizes, strides and scalars are kernel arguments, not constants of the
 *    text: one compile per (kind, element size, rank) serves every shape
 *    (an IR kernel bakes its sizes in: arange(T) for each T, or a cat for
 *    each shape, would compile anew);
 *  - cat and index_select copy bytes, so one kernel per element size takes
 *    every dtype, f16 and bf16 included.
 *
 * One generator per kernel kind (cuda_native_copy_text, _arange_text,
 * _rand_text, _argmax_text); each text is a few #defines over one fixed
 * body, so the distinct texts are few and each is compiled once per target
 * (cuda_source_get: the device's table, then the kernel cache, then NVRTC).
 *
 * index_select's bounds: the kernel never reads out of bounds (an index
 * outside [0, size) reads nothing and writes 0) and records the first bad
 * index it meets in the device's kernel-error words (cuda_kerror_launch,
 * cuda_lib.h); the next synchronization of the device (cuda_sync: any copy
 * between host and device, em_item, em_copy_to_host) returns EM_ERR_INDEX
 * with it.  No copy of the indices, no wait per call; docs/cuda.md says
 * when the error surfaces. */
#include "cuda_eager.h"

#ifdef EMBER_HAVE_CUDA

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cuda_emit.h" /* cuda_half_helpers */
#include "cuda_source.h"
#include "schedule.h" /* JIT_KERNEL_NAME */
#include "trace.h"    /* tr_meta_of */

enum { BLOCK = 256 };

/* ---- text helpers ---- */

/* printf into a buffer from em_malloc, or NULL with the error set. */
static char *textf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *textf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n < 0 ? NULL : em_malloc((size_t)n + 1);
    if (!s) {
        if (n < 0) em_error(EM_ERR_STATE, "cuda_native: a kernel text could not be formatted");
        return NULL;
    }
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

/* The unsigned C type of an element of esize bytes (copies move bits). */
static const char *bits_type(size_t esize) {
    switch (esize) {
    case 1: return "unsigned char";
    case 2: return "unsigned short";
    case 4: return "unsigned int";
    default: return "unsigned long long";
    }
}

/* The loaded kernel for text (consumed), or an error. */
static em_status get_kernel(cuda_device *d, char *text, cuda_get_stats *stats,
                            const cuda_kernel **k) {
    if (!text) return em_last_status();
    em_status s = cuda_source_get(d, text, cuda_eager_cache(), cuda_eager_log(), stats, k);
    em_free(text);
    return s;
}

/* A grid-stride launch over n items, BLOCK threads a block, per_block items
 * a block per pass; at most 16 blocks per SM in flight. */
static em_status launch(cuda_device *d, const cuda_kernel *k, int64_t n, int per_block,
                        void **args) {
    int64_t grid = (n + per_block - 1) / per_block, cap = 16 * (int64_t)(d->sm_count > 0 ? d->sm_count : 1);
    if (grid > cap) grid = cap;
    return cuda_source_launch(d, k, (unsigned)grid, BLOCK, 0, args);
}

/* ---- strided geometry ----
 * The dims a kernel walks, merged where both sides step alike (a cat of
 * contiguous tensors along dim 0 is one run); size-1 dims are dropped but
 * the gathered one, which keeps its own index. */

typedef struct native_geom { /* the kernels' struct em_geom, field for field */
    long long n;                                      /* elements to write */
    long long size[EM_MAX_DIMS];                      /* the merged dims, outermost first */
    long long sst[EM_MAX_DIMS], dst[EM_MAX_DIMS];     /* source, destination strides */
    long long gdim;                                   /* merged dim read through idx, or -1 */
    long long ist;                                    /* idx's stride (argmax: the reduced dim's) */
    long long bound;                                  /* x's size at the gathered dim (argmax:
                                                         the reduced dim's length) */
    long long dim;                                    /* the gathered dim's number (messages) */
} native_geom;

/* The text's copy of native_geom (every field long long: no padding). */
#define GEOM_DECL                                                                                \
    "struct em_geom {\n"                                                                         \
    "  long long n, size[8], sst[8], dst[8], gdim, ist, bound, dim;\n"                          \
    "};\n"

_Static_assert(EM_MAX_DIMS == 8, "GEOM_DECL spells out EM_MAX_DIMS");
_Static_assert(sizeof(native_geom) == (5 + 3 * EM_MAX_DIMS) * sizeof(long long), "no padding");

/* g over nd dims of sizes with source strides sst and destination strides
 * dst; gdim the gathered dim or -1.  Returns the merged rank (>= 1). */
static int geom_build(native_geom *g, int nd, const int64_t *sizes, const int64_t *sst,
                      const int64_t *dst, int gdim) {
    memset(g, 0, sizeof *g);
    g->gdim = -1;
    g->n = 1;
    int m = 0;
    for (int d = 0; d < nd; d++) {
        g->n *= sizes[d];
        if (sizes[d] == 1 && d != gdim) continue;
        bool merge = m > 0 && d != gdim && g->gdim != m - 1 && g->sst[m - 1] == sizes[d] * sst[d] &&
                     g->dst[m - 1] == sizes[d] * dst[d];
        if (merge) {
            g->size[m - 1] *= sizes[d];
            g->sst[m - 1] = sst[d];
            g->dst[m - 1] = dst[d];
            continue;
        }
        if (d == gdim) g->gdim = m;
        g->size[m] = sizes[d], g->sst[m] = sst[d], g->dst[m] = dst[d];
        m++;
    }
    if (m == 0) g->size[m++] = 1; /* one element (strides 0) */
    return m;
}

/* A kernel's text: the generator's #defines (defs, from textf; consumed),
 * the launch bound and the name, then its kind's fixed body. */
static char *text_of(char *defs, const char *body) {
    if (!defs) return NULL;
    char *t = textf("%s#define EM_THREADS %d\n#define EM_NAME %s\n%s", defs, BLOCK, JIT_KERNEL_NAME, body);
    em_free(defs);
    return t;
}

/* ---- the copy kernel: cat's inputs, index_select's rows ---- */

static const char copy_body[] =
    GEOM_DECL
    "#if GATHER\n"
    "/* The first bad index of the stream's kernels wins (cuda_lib.h's words). */\n"
    "__device__ void em_report(unsigned long long *err, long long j, const em_geom &g) {\n"
    "  if (atomicCAS(err, 0ull, (unsigned long long)EM_KERROR_INDEX) == 0ull) {\n"
    "    err[1] = (unsigned long long)j;\n"
    "    err[2] = (unsigned long long)g.bound;\n"
    "    err[3] = (unsigned long long)g.dim;\n"
    "  }\n"
    "}\n"
    "#endif\n"
    "extern \"C\" __global__ void __launch_bounds__(EM_THREADS) EM_NAME(const T *__restrict__ src,\n"
    "    T *__restrict__ dst, const I *__restrict__ idx, unsigned long long *err, em_geom g) {\n"
    "  EM_AFTER_PRIOR();\n"
    "  const long long step = (long long)gridDim.x * blockDim.x;\n"
    "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < g.n; i += step) {\n"
    "    long long r = i, so = 0, dof = 0;\n"
    "    bool ok = true;\n"
    "#pragma unroll\n"
    "    for (int d = ND - 1; d >= 0; d--) {\n"
    "      long long c = d ? r % g.size[d] : r;\n"
    "      r = d ? r / g.size[d] : 0;\n"
    "#if SCATTER\n"
    "      so += c * g.sst[d];\n"
    "#else\n"
    "      dof += c * g.dst[d];\n"
    "#endif\n"
    "#if GATHER\n"
    "      if (d == g.gdim) {\n"
    "        const long long j = (long long)idx[c * g.ist];\n"
    "        ok = j >= 0 && j < g.bound; /* else no read (or no write): the error recorded */\n"
    "        if (!ok) em_report(err, j, g);\n"
    "        c = ok ? j : 0;\n"
    "      }\n"
    "#endif\n"
    "#if SCATTER\n"
    "      dof += c * g.dst[d];\n"
    "#else\n"
    "      so += c * g.sst[d];\n"
    "#endif\n"
    "    }\n"
    "#if SCATTER\n"
    "    if (ok) dst[dof] = src[so];\n"
    "#else\n"
    "    dst[dof] = ok ? src[so] : (T)0;\n"
    "#endif\n"
    "  }\n"
    "}\n";

char *cuda_native_copy_text(size_t esize, int nd, em_dtype idx, bool scatter) {
    bool gather = idx == EM_I32 || idx == EM_I64;
    return text_of(textf("/* ember native: copy */\n#define ND %d\n#define GATHER %d\n#define SCATTER %d\n"
                        "#define EM_KERROR_INDEX %d\ntypedef %s T;\ntypedef %s I;\n",
                        nd, (int)gather, (int)(gather && scatter), CUDA_KERROR_INDEX, bits_type(esize),
                        idx == EM_I32 ? "int" : "long long"),
                   copy_body);
}

/* One launch of the copy kernel (its arguments but the error words). */
typedef struct copy_launch {
    cuda_device *d;
    const cuda_kernel *k;
    native_geom *g;
    const void *src;
    void *dst;
    const void *idx; /* NULL: no gather */
} copy_launch;

static em_status launch_copy(void *ctx, CUdeviceptr err) {
    copy_launch *L = ctx;
    void *args[] = {&L->src, &L->dst, &L->idx, &err, L->g};
    return launch(L->d, L->k, L->g->n, BLOCK, args);
}

/* The copy kernel for g (rank nd) from src to dst, gathering through idx
 * (then armed for cuda_sync to report bad indices) unless it is NULL. */
static em_status run_copy(cuda_device *d, cuda_get_stats *stats, size_t esize, int nd,
                          native_geom *g, const void *src, void *dst, const em_tensor *idx,
                          bool scatter) {
    if (g->n == 0) return EM_OK;
    if (!idx && nd == 1 && g->sst[0] == 1 && g->dst[0] == 1) { /* one run: a plain copy */
        const cu_api *cu = cuda_driver();
        return cuda_check(cu->MemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src,
                                              (size_t)g->n * esize, d->stream),
                          "cuMemcpyDtoDAsync");
    }
    copy_launch L = {d, NULL, g, src, dst, idx ? em_data(idx) : NULL};
    em_status s = get_kernel(d, cuda_native_copy_text(esize, nd, idx ? idx->dtype : EM_DTYPE_COUNT, scatter),
                             stats, &L.k);
    if (s != EM_OK) return s;
    return idx ? cuda_kerror_launch(d, launch_copy, &L) : launch_copy(&L, 0);
}

static em_status cat_input(cuda_device *d, cuda_get_stats *stats, const em_tensor *x,
                           em_tensor *out, int dim, int64_t off) {
    size_t es = em_dtype_size(x->dtype);
    native_geom g;
    int nd = geom_build(&g, x->ndim, x->sizes, x->strides, out->strides, -1);
    char *dst = (char *)em_data(out) + (size_t)(off * out->strides[dim]) * es;
    return run_copy(d, stats, es, nd, &g, em_data(x), dst, NULL, false);
}

/* Each input copied into its slab of out (the checks are cpu_cat's). */
static em_status run_cat(cuda_device *d, const em_op_call *c, em_tensor *out, cuda_get_stats *stats) {
    int dim = c->attrs->dim;
    if (out->ndim == 0 || dim < 0 || dim >= out->ndim)
        return em_error(EM_ERR_DIM, "cat: dim %d is out of range for a %d-d tensor", dim, out->ndim);
    int64_t off = 0;
    em_status s = EM_OK;
    for (int k = 0; k < c->nin && s == EM_OK; k++) {
        const em_tensor *x = c->in[k];
        if (x->dtype != out->dtype || x->ndim != out->ndim)
            return em_error(EM_ERR_SHAPE, "cat: input %d does not match the output", k);
        if (off + x->sizes[dim] > out->sizes[dim])
            return em_error(EM_ERR_SHAPE, "cat: inputs exceed the output along dim %d", dim);
        s = cat_input(d, stats, x, out, dim, off);
        off += x->sizes[dim];
    }
    return s;
}

/* The copy kernel from src to dst over sizes, dim read (or with scatter
 * written) through idx, whose entries must be below bound. */
static em_status run_indexed(cuda_device *d, cuda_get_stats *stats, const em_tensor *src, em_tensor *dst,
                             const int64_t *sizes, const em_tensor *idx, int dim, int64_t bound,
                             bool scatter) {
    native_geom g;
    int nd = geom_build(&g, dst->ndim, sizes, src->strides, dst->strides, dim);
    g.ist = idx->ndim ? idx->strides[0] : 0;
    g.bound = bound;
    g.dim = dim;
    return run_copy(d, stats, em_dtype_size(src->dtype), nd, &g, em_data(src), em_data(dst), idx, scatter);
}

/* out[..., j, ...] = x[..., idx[j], ...]; bad indices are found by the
 * kernel (the file's comment), so nothing here reads idx. */
static em_status run_index_select(cuda_device *d, const em_op_call *c, em_tensor *out,
                                  cuda_get_stats *stats) {
    const em_tensor *x = c->in[0], *idx = c->in[1];
    int dim = c->attrs->dim;
    if (x->ndim == 0 || dim < 0 || dim >= x->ndim)
        return em_error(EM_ERR_DIM, "index_select: dim %d is out of range for a %d-d tensor", dim,
                        x->ndim);
    if (idx->dtype != EM_I32 && idx->dtype != EM_I64)
        return em_error(EM_ERR_DTYPE, "index_select: indices have dtype %s (expects i32 or i64)",
                        em_dtype_name(idx->dtype));
    if (idx->ndim > 1)
        return em_error(EM_ERR_SHAPE, "index_select: indices must be 1-d, not %d-d", idx->ndim);
    if (out->ndim != x->ndim || out->dtype != x->dtype)
        return em_error(EM_ERR_SHAPE, "index_select: the output does not match x");
    return run_indexed(d, stats, x, out, out->sizes, idx, dim, x->sizes[dim], false);
}

/* out (a view of dst)[..., idx[j], ...] = src[..., j, ...]: the copy kernel
 * over src's elements, scattering along dim; a bad index writes nothing
 * and is reported as index_select's are.  Repeated indices: one write wins. */
static em_status run_index_copy(cuda_device *d, const em_op_call *c, em_tensor *out,
                                cuda_get_stats *stats) {
    const em_tensor *idx = c->in[1], *src = c->in[2];
    int dim = c->attrs->dim;
    if (out->ndim == 0 || dim < 0 || dim >= out->ndim || src->ndim != out->ndim ||
        src->dtype != out->dtype)
        return em_error(EM_ERR_SHAPE, "index_copy_: the source does not match the tensor");
    if (idx->dtype != EM_I32 && idx->dtype != EM_I64)
        return em_error(EM_ERR_DTYPE, "index_copy_: indices have dtype %s (expects i32 or i64)",
                        em_dtype_name(idx->dtype));
    return run_indexed(d, stats, src, out, src->sizes, idx, dim, out->sizes[dim], true);
}

/* ---- arange ----
 * cpu_arange's two ways, element for element: integer dtypes with integral
 * start and step in exact int64 (saturated past int64 from the first i
 * whose i*step or i*step + start overflows: thr, below, found on the host);
 * else start + (double)i * step in double, each operation rounded (no FMA),
 * converted as store_f64 converts (floats rounded, integers truncated and
 * saturated, NaN to 0, f16/bf16 through float). */

static const char arange_body[] =
    "__device__ __forceinline__ long long em_to_i64(double v) {\n"
    "  return v != v ? 0 : v >= 9223372036854775808.0 ? 9223372036854775807ll\n"
    "       : v <= -9223372036854775808.0 ? (-9223372036854775807ll - 1) : (long long)v;\n"
    "}\n"
    "__device__ __forceinline__ int em_sat_i32(long long v) {\n"
    "  return v > 2147483647ll ? 2147483647 : v < -2147483648ll ? (-2147483647 - 1) : (int)v;\n"
    "}\n"
    "__device__ __forceinline__ int em_to_i32(double v) {\n"
    "  return v != v ? 0 : v >= 2147483648.0 ? 2147483647 : v <= -2147483648.0 ? (-2147483647 - 1) : (int)v;\n"
    "}\n"
    "extern \"C\" __global__ void __launch_bounds__(EM_THREADS) EM_NAME(T *__restrict__ out, long long n,\n"
    "    double start, double step, long long istart, long long istep, long long thr) {\n"
    "  EM_AFTER_PRIOR();\n"
    "  const long long stride = (long long)gridDim.x * blockDim.x;\n"
    "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {\n"
    "#if EXACT\n"
    "    const long long sat = istep > 0 ? 9223372036854775807ll : (-9223372036854775807ll - 1);\n"
    "    const long long v = i > thr ? sat : (i * istep + istart);\n"
    "    out[i] = CONVERT_I(v);\n"
    "#else\n"
    "    const double v = __dadd_rn(start, __dmul_rn((double)i, step));\n"
    "    out[i] = CONVERT(v);\n"
    "#endif\n"
    "  }\n"
    "}\n";

/* The element type and conversion from double of each dtype. */
static const char *arange_convert(em_dtype d, const char **type) {
    switch (d) {
    case EM_F32: *type = "float"; return "(float)";
    case EM_F64: *type = "double"; return "";
    case EM_I32: *type = "int"; return "em_to_i32";
    case EM_I64: *type = "long long"; return "em_to_i64";
    case EM_BOOL: *type = "unsigned char"; return "(unsigned char)0 != ";
    case EM_F16: *type = "unsigned short"; return "em_to_f16((float)";
    case EM_BF16: *type = "unsigned short"; return "em_to_bf16((float)";
    default: *type = NULL; return NULL;
    }
}

char *cuda_native_arange_text(em_dtype d, bool exact) {
    const char *type, *cv = arange_convert(d, &type);
    if (!cv) {
        em_error(EM_ERR_DTYPE, "arange: no CUDA kernel for dtype %s", em_dtype_name(d));
        return NULL;
    }
    bool half = d == EM_F16 || d == EM_BF16;
    /* exact is i32/i64 only: i32 saturates the int64 value */
    return text_of(textf("/* ember native: arange */\n#define EXACT %d\ntypedef %s T;\n"
                        "#define CONVERT(v) %s(v)%s\n#define CONVERT_I(v) %s(v)\n%s",
                        (int)exact, type, cv, half ? ")" : "", d == EM_I32 ? "em_sat_i32" : "",
                        half ? cuda_half_helpers : ""),
                   arange_body);
}

/* Whether v is an integer int64 holds exactly (cpu_arange's test). */
static bool integral_i64(double v) {
    return v == floor(v) && v >= -0x1p63 && v < 0x1p63;
}

/* The last i (< 2^63) for which i*step and i*step + start stay in int64,
 * as cpu_arange's overflow checks find it (i >= 0: both fail from some i
 * on, never again succeed). */
static int64_t arange_threshold(int64_t start, int64_t step) {
    if (step == 0) return INT64_MAX;
    __int128 mag = step > 0 ? (__int128)step : -(__int128)step;
    __int128 lim = step > 0 ? (__int128)INT64_MAX / mag : ((__int128)1 << 63) / mag; /* the product */
    if (step > 0 && start > 0) { /* start + i*step <= INT64_MAX */
        __int128 t = ((__int128)INT64_MAX - start) / mag;
        if (t < lim) lim = t;
    } else if (step < 0 && start < 0) { /* start + i*step >= INT64_MIN */
        __int128 t = ((__int128)start - (__int128)INT64_MIN) / mag;
        if (t < lim) lim = t;
    }
    return lim > INT64_MAX ? INT64_MAX : (int64_t)lim;
}

static em_status run_arange(cuda_device *d, const em_op_call *c, em_tensor *out,
                            cuda_get_stats *stats) {
    const em_op_attrs *a = c->attrs;
    bool exact = (out->dtype == EM_I32 || out->dtype == EM_I64) && integral_i64(a->fstart) &&
                 integral_i64(a->fstep);
    long long n = em_numel(out), istart = exact ? (int64_t)a->fstart : 0;
    long long istep = exact ? (int64_t)a->fstep : 0, thr = exact ? arange_threshold(istart, istep) : 0;
    double start = a->fstart, step = a->fstep;
    const cuda_kernel *k = NULL;
    em_status s = get_kernel(d, cuda_native_arange_text(out->dtype, exact), stats, &k);
    void *p = em_data(out);
    void *args[] = {&p, &n, &start, &step, &istart, &istep, &thr};
    return s == EM_OK ? launch(d, k, n, BLOCK, args) : s;
}

/* ---- rand, randn ----
 * cpu_rand/cpu_randn's values: element i from Philox4x32-10 (em_philox,
 * philox.c) at counter offset + i under seed.  Uniform values are exact
 * (a power-of-two scaling of the bits); randn's Box-Muller uses CUDA's
 * logf/cosf (log/cos), a few ulp from the CPU's libm: equal to a
 * tolerance, not bit for bit (docs/cuda.md).  The angle's product is
 * __fmul_rn (__dmul_rn), rounded as on the CPU, never fused into cos's
 * range reduction. */

static const char rand_body[] =
    "__device__ __forceinline__ void em_philox(unsigned long long seed, unsigned long long ctr,\n"
    "                                          unsigned o[4]) {\n"
    "  unsigned c0 = (unsigned)ctr, c1 = (unsigned)(ctr >> 32), c2 = 0, c3 = 0;\n"
    "  unsigned k0 = (unsigned)seed, k1 = (unsigned)(seed >> 32);\n"
    "#pragma unroll\n"
    "  for (int r = 0; r < 10; r++) {\n"
    "    const unsigned h0 = __umulhi(0xD2511F53u, c0), l0 = 0xD2511F53u * c0;\n"
    "    const unsigned h1 = __umulhi(0xCD9E8D57u, c2), l1 = 0xCD9E8D57u * c2;\n"
    "    const unsigned n0 = h1 ^ c1 ^ k0, n2 = h0 ^ c3 ^ k1;\n"
    "    c1 = l1;\n"
    "    c3 = l0;\n"
    "    c0 = n0;\n"
    "    c2 = n2;\n"
    "    k0 += 0x9E3779B9u;\n"
    "    k1 += 0xBB67AE85u;\n"
    "  }\n"
    "  o[0] = c0, o[1] = c1, o[2] = c2, o[3] = c3;\n"
    "}\n"
    "__device__ __forceinline__ float em_u01f(unsigned r) {\n"
    "  return (float)(r >> 8) * __int_as_float(0x33800000); /* 2^-24 */\n"
    "}\n"
    "__device__ __forceinline__ double em_u01d(unsigned hi, unsigned lo) {\n"
    "  return (double)(((unsigned long long)hi << 21) ^ (lo >> 11)) * __longlong_as_double(0x3ca0000000000000ll);\n"
    "}\n"
    "extern \"C\" __global__ void __launch_bounds__(EM_THREADS) EM_NAME(T *__restrict__ out, long long n,\n"
    "    unsigned long long seed, unsigned long long offset) {\n"
    "  EM_AFTER_PRIOR();\n"
    "  const long long stride = (long long)gridDim.x * blockDim.x;\n"
    "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {\n"
    "    unsigned x[4];\n"
    "    em_philox(seed, offset + (unsigned long long)i, x);\n"
    "#if F32 && !NORMAL\n"
    "    out[i] = em_u01f(x[0]);\n"
    "#elif !NORMAL\n"
    "    out[i] = em_u01d(x[0], x[1]);\n"
    "#elif F32 /* u1 in (0, 1]: log never sees 0 */\n"
    "    const float u1 = 1.0f - em_u01f(x[0]), u2 = em_u01f(x[1]);\n"
    "    out[i] = sqrtf(-2.0f * logf(u1)) * cosf(__fmul_rn(__int_as_float(0x40c90fdb), u2));\n"
    "#else\n"
    "    const double u1 = 1.0 - em_u01d(x[0], x[1]), u2 = em_u01d(x[2], x[3]);\n"
    "    out[i] = sqrt(-2.0 * log(u1)) * cos(__dmul_rn(__longlong_as_double(0x401921fb54442d18ll), u2));\n"
    "#endif\n"
    "  }\n"
    "}\n";

char *cuda_native_rand_text(em_dtype d, bool normal) {
    if (d != EM_F32 && d != EM_F64) {
        em_error(EM_ERR_DTYPE, "%s: dtype %s is not supported (f32 or f64)", normal ? "randn" : "rand",
                 em_dtype_name(d));
        return NULL;
    }
    return text_of(textf("/* ember native: %s */\n#define F32 %d\n#define NORMAL %d\ntypedef %s T;\n",
                        normal ? "randn" : "rand", (int)(d == EM_F32), (int)normal,
                        d == EM_F32 ? "float" : "double"),
                   rand_body);
}

static em_status run_rand(cuda_device *d, const em_op_call *c, em_tensor *out, cuda_get_stats *stats) {
    const cuda_kernel *k = NULL;
    em_status s = get_kernel(d, cuda_native_rand_text(out->dtype, c->op == EM_OP_RANDN), stats, &k);
    long long n = em_numel(out);
    unsigned long long seed = c->attrs->seed, offset = c->attrs->offset;
    void *p = em_data(out);
    void *args[] = {&p, &n, &seed, &offset};
    return s == EM_OK ? launch(d, k, n, BLOCK, args) : s;
}

/* ---- argmax ----
 * A warp per output, its lanes striding down the reduced dim, then a warp
 * reduction of (value, index) pairs; cpu_argmax's answer: the first
 * maximum, a NaN greater than everything (the first NaN wins).  Few long
 * rows (a sampler's argmax over a vocabulary: one row of 50257 took one
 * warp ~500 us on the H200) split: pass 1 gives each (output, chunk of
 * ARGMAX_CHUNK) a block, whose warps reduce through shared memory to one
 * (value, index) pair; pass 2 reduces each output's pairs with a warp,
 * by the same order (values, then earlier indices), so the answer is the
 * unsplit one's. */

#define ARGMAX_CHUNK 2048

static const char argmax_body[] =
    GEOM_DECL
    "/* Whether (v, iv) beats (b, ib): greater, or equal and earlier; a NaN\n"
    "   beats all but an earlier NaN; ib < 0: nothing seen yet. */\n"
    "__device__ __forceinline__ bool em_beats(K v, long long iv, K b, long long ib) {\n"
    "  if (iv < 0) return false;\n"
    "  if (ib < 0) return true;\n"
    "#if ISFLOAT\n"
    "  if (b != b) return v != v && iv < ib;\n"
    "  if (v != v) return true;\n"
    "#endif\n"
    "  return v > b || (v == b && iv < ib);\n"
    "}\n"
    "__device__ __forceinline__ void em_warp_best(K &b, long long &bi) {\n"
    "  for (int m = 16; m > 0; m >>= 1) {\n"
    "    const K v = __shfl_xor_sync(0xffffffffu, b, m);\n"
    "    const long long iv = __shfl_xor_sync(0xffffffffu, bi, m);\n"
    "    if (em_beats(v, iv, b, bi)) b = v, bi = iv;\n"
    "  }\n"
    "}\n"
    "/* the offset of output o's row in x */\n"
    "__device__ __forceinline__ long long em_row(long long o, const em_geom &g) {\n"
    "  long long r = o, base = 0;\n"
    "#pragma unroll\n"
    "  for (int d = ND - 1; d >= 0; d--) {\n"
    "    const long long c = d ? r % g.size[d] : r;\n"
    "    r = d ? r / g.size[d] : 0;\n"
    "    base += c * g.sst[d];\n"
    "  }\n"
    "  return base;\n"
    "}\n"
    "#if PASS == 0\n"
    "extern \"C\" __global__ void __launch_bounds__(EM_THREADS) EM_NAME(const T *__restrict__ x,\n"
    "    long long *__restrict__ out, em_geom g) {\n"
    "  EM_AFTER_PRIOR();\n"
    "  const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;\n"
    "  const long long step = (long long)gridDim.x * wpb;\n"
    "  /* o is the warp's: its lanes stay together for the shuffles */\n"
    "  for (long long o = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); o < g.n; o += step) {\n"
    "    const long long base = em_row(o, g);\n"
    "    K b = 0;\n"
    "    long long bi = -1;\n"
    "    for (long long j = lane; j < g.bound; j += 32) {\n"
    "      const K v = (K)LOAD(x[base + j * g.ist]);\n"
    "      if (em_beats(v, j, b, bi)) b = v, bi = j;\n"
    "    }\n"
    "    em_warp_best(b, bi);\n"
    "    if (lane == 0) out[o] = bi;\n"
    "  }\n"
    "}\n"
    "#elif PASS == 1\n"
    "/* block (o, s) of g.n * S: chunk s of row o to one pair (pv, pi)[o * S + s];\n"
    "   g.dim is S */\n"
    "extern \"C\" __global__ void __launch_bounds__(EM_THREADS) EM_NAME(const T *__restrict__ x,\n"
    "    K *__restrict__ pv, long long *__restrict__ pi, em_geom g) {\n"
    "  EM_AFTER_PRIOR();\n"
    "  __shared__ K sv[EM_THREADS / 32];\n"
    "  __shared__ long long si[EM_THREADS / 32];\n"
    "  const long long S = g.dim, o = blockIdx.x / S, s = blockIdx.x % S;\n"
    "  const long long base = em_row(o, g), j1 = (s + 1) * CHUNK < g.bound ? (s + 1) * CHUNK : g.bound;\n"
    "  K b = 0;\n"
    "  long long bi = -1;\n"
    "  for (long long j = s * CHUNK + threadIdx.x; j < j1; j += EM_THREADS) {\n"
    "    const K v = (K)LOAD(x[base + j * g.ist]);\n"
    "    if (em_beats(v, j, b, bi)) b = v, bi = j;\n"
    "  }\n"
    "  em_warp_best(b, bi);\n"
    "  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;\n"
    "  if (lane == 0) sv[w] = b, si[w] = bi;\n"
    "  __syncthreads();\n"
    "  if (w == 0) {\n"
    "    b = lane < EM_THREADS / 32 ? sv[lane] : (K)0;\n"
    "    bi = lane < EM_THREADS / 32 ? si[lane] : -1;\n"
    "    em_warp_best(b, bi);\n"
    "    if (lane == 0) pv[blockIdx.x] = b, pi[blockIdx.x] = bi;\n"
    "  }\n"
    "}\n"
    "#else\n"
    "/* a warp per output over its S = g.dim pairs */\n"
    "extern \"C\" __global__ void __launch_bounds__(EM_THREADS) EM_NAME(const K *__restrict__ pv,\n"
    "    const long long *__restrict__ pi, long long *__restrict__ out, em_geom g) {\n"
    "  EM_AFTER_PRIOR();\n"
    "  const int lane = threadIdx.x & 31, wpb = blockDim.x >> 5;\n"
    "  const long long step = (long long)gridDim.x * wpb, S = g.dim;\n"
    "  for (long long o = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); o < g.n; o += step) {\n"
    "    K b = 0;\n"
    "    long long bi = -1;\n"
    "    for (long long s = lane; s < S; s += 32)\n"
    "      if (em_beats(pv[o * S + s], pi[o * S + s], b, bi)) b = pv[o * S + s], bi = pi[o * S + s];\n"
    "    em_warp_best(b, bi);\n"
    "    if (lane == 0) out[o] = bi;\n"
    "  }\n"
    "}\n"
    "#endif\n";

char *cuda_native_argmax_text(em_dtype d, int nd, int pass) {
    const char *t, *k = NULL;
    switch (d) {
    case EM_F32: t = k = "float"; break;
    case EM_F64: t = k = "double"; break;
    case EM_I32: t = k = "int"; break;
    case EM_I64: t = k = "long long"; break;
    case EM_BOOL: t = "unsigned char", k = "int"; break;
    default: em_error(EM_ERR_DTYPE, "argmax: dtype %s is not supported", em_dtype_name(d)); return NULL;
    }
    if (pass < 0 || pass > 2) {
        em_error(EM_ERR_ARG, "argmax: pass %d", pass);
        return NULL;
    }
    return text_of(textf("/* ember native: argmax */\n#define ND %d\n#define ISFLOAT %d\n#define PASS %d\n"
                        "#define CHUNK %d\ntypedef %s T;\ntypedef %s K;\n#define LOAD(v) %s\n",
                        nd, (int)(d == EM_F32 || d == EM_F64), pass, ARGMAX_CHUNK, t, k,
                        d == EM_BOOL ? "((v) != 0)" : "(v)"),
                   argmax_body);
}

/* The outputs walk x's kept dims (g.size, g.sst); the reduced dim is
 * g.bound long, g.ist apart (a 0-d x: one element).  Split in two passes
 * when the outputs' warps would leave most of the GPU idle on long rows. */
static em_status run_argmax(cuda_device *d, const em_op_call *c, em_tensor *out,
                            cuda_get_stats *stats) {
    const em_tensor *x = c->in[0];
    int dim = c->attrs->dim, nk = 0;
    if (x->ndim > 0 && (dim < 0 || dim >= x->ndim))
        return em_error(EM_ERR_DIM, "argmax: dim %d out of range for a %d-d tensor", dim, x->ndim);
    if (out->dtype != EM_I64) return em_error(EM_ERR_DTYPE, "argmax: output must be i64");
    int64_t ks[EM_MAX_DIMS], kst[EM_MAX_DIMS], ost[EM_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++)
        if (i != dim) ks[nk] = x->sizes[i], kst[nk++] = x->strides[i];
    em_contiguous_strides(nk, ks, ost);
    native_geom g;
    int nd = geom_build(&g, nk, ks, kst, ost, -1);
    g.bound = x->ndim ? x->sizes[dim] : 1;
    g.ist = x->ndim ? x->strides[dim] : 0;
    if (g.bound == 0) return em_error(EM_ERR_SHAPE, "argmax: reduction over an empty dim");
    void *xp = em_data(x), *op = em_data(out);
    const cuda_kernel *k = NULL;
    int64_t S = (g.bound + ARGMAX_CHUNK - 1) / ARGMAX_CHUNK;
    /* one warp a row fills the GPU only with ~8 rows an SM */
    if (S < 2 || g.n >= 8 * (int64_t)d->sm_count || g.n * S > INT32_MAX) {
        em_status s = get_kernel(d, cuda_native_argmax_text(x->dtype, nd, 0), stats, &k);
        void *args[] = {&xp, &op, &g};
        return s == EM_OK ? launch(d, k, g.n, BLOCK / 32, args) : s;
    }
    g.dim = S;
    em_meta pm;
    memset(&pm, 0, sizeof pm);
    pm.ndim = 1, pm.sizes[0] = g.n * S, pm.strides[0] = 1, pm.device = out->device;
    pm.dtype = x->dtype == EM_BOOL ? EM_I32 : x->dtype; /* K */
    em_scope_begin();
    em_tensor *pv = em_tensor_alloc(&pm);
    pm.dtype = EM_I64;
    em_tensor *pi = pv ? em_tensor_alloc(&pm) : NULL;
    em_status s = pi ? get_kernel(d, cuda_native_argmax_text(x->dtype, nd, 1), stats, &k) : em_last_status();
    void *pvp = pi ? em_data(pv) : NULL, *pip = pi ? em_data(pi) : NULL;
    void *a1[] = {&xp, &pvp, &pip, &g};
    if (s == EM_OK) s = cuda_source_launch(d, k, (unsigned)(g.n * S), BLOCK, 0, a1);
    if (s == EM_OK) s = get_kernel(d, cuda_native_argmax_text(x->dtype, nd, 2), stats, &k);
    void *a2[] = {&pvp, &pip, &op, &g};
    if (s == EM_OK) s = launch(d, k, g.n, BLOCK / 32, a2);
    em_scope_end(); /* the pairs are freed in stream order, after the launches */
    return s;
}

/* ---- column reductions ----
 * sum, mean, amax, amin over a block of middle or leading dims of a
 * contiguous x, viewed as [A, R, C] -> [A, C]: the rows kernel reduces
 * rows, so it read these columns with a stride (the sum over the leading
 * dim of a [16384, 4096] tensor ran at 14% of copy bandwidth).  Here a
 * block's 32 x 8 threads take 32 adjacent columns (one 128-byte read per
 * warp and row) and 8 rows at a time, and the R rows are cut into S
 * chunks when A x C alone gives too few blocks; the chunks' partials (in
 * the accumulator's type) are then reduced by the same kernel over S.
 * Sums accumulate in double for float types (the CPU's reductions do)
 * and in int64 for integers; max and min compare in the element's type,
 * a NaN winning as on the CPU. */

static const char colred_body[] =
    "struct em_col { long long A, R, C, chunk, ncb; double inv; };\n"
    "extern \"C\" __global__ void __launch_bounds__(256) EM_NAME(const T *__restrict__ x,\n"
    "    O *__restrict__ out, em_col g) {\n"
    "  EM_AFTER_PRIOR();\n"
    "  __shared__ ACC sh[8][33];\n"
    "  const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;\n"
    "  const long long bid = blockIdx.x, cb = bid % g.ncb, as = bid / g.ncb;\n"
    "  const long long a = as % g.A, s = as / g.A, c = cb * 32 + tx;\n"
    "  const long long r0 = s * g.chunk, r1 = r0 + g.chunk < g.R ? r0 + g.chunk : g.R;\n"
    "  ACC acc = INIT;\n"
    "  if (c < g.C)\n"
    "    for (long long r = r0 + ty; r < r1; r += 8) acc = COMBINE(acc, LOAD(x[(a * g.R + r) * g.C + c]));\n"
    "  sh[ty][tx] = acc;\n"
    "  __syncthreads();\n"
    "  if (ty == 0 && c < g.C) {\n"
    "#pragma unroll\n"
    "    for (int i = 1; i < 8; i++) acc = COMBINE(acc, sh[i][tx]);\n"
    "    out[(s * g.A + a) * g.C + c] = STORE(FINAL(acc));\n"
    "  }\n"
    "}\n";

/* The accumulator's dtype for op over dtype d (sum, mean: double or int64;
 * max, min: d itself, halves as float), or -1 where the kernel has no
 * case (bool, mean of integers). */
static int colred_acc(em_op op, em_dtype d) {
    bool fl = d == EM_F32 || d == EM_F64 || d == EM_F16 || d == EM_BF16;
    bool in = d == EM_I32 || d == EM_I64;
    if (op == EM_OP_SUM || op == EM_OP_MEAN) return fl ? EM_F64 : in && op == EM_OP_SUM ? EM_I64 : -1;
    if (!fl && !in) return -1;
    return d == EM_F16 || d == EM_BF16 ? EM_F32 : d;
}

static const char *c_type(em_dtype d) {
    switch (d) {
    case EM_F32: return "float";
    case EM_F64: return "double";
    case EM_I32: return "int";
    case EM_I64: return "long long";
    default: return "unsigned short"; /* f16, bf16: the bits */
    }
}

/* The column kernel reading dtype in, accumulating in acc, writing dtype
 * o: the partial pass (in -> acc, final false) or the last (final: mean's
 * division, the result's rounding). */
char *cuda_native_colreduce_text(em_op op, em_dtype in, em_dtype acc, em_dtype o, bool final) {
    bool half_in = in == EM_F16 || in == EM_BF16, half_out = o == EM_F16 || o == EM_BF16;
    bool fl = acc == EM_F32 || acc == EM_F64;
    const char *comb = op == EM_OP_SUM || op == EM_OP_MEAN ? "((p) + (q))"
                       : op == EM_OP_AMAX ? (fl ? "((p) != (p) || (p) > (q) ? (p) : (q))" : "((p) > (q) ? (p) : (q))")
                                          : (fl ? "((p) != (p) || (p) < (q) ? (p) : (q))" : "((p) < (q) ? (p) : (q))");
    /* max, min start from the first element's place: +-inf for floats,
     * the type's extreme for integers */
    const char *init = op == EM_OP_SUM || op == EM_OP_MEAN ? "0"
                       : op == EM_OP_AMAX ? (fl ? "-INFINITY" : acc == EM_I32 ? "(-2147483647 - 1)" : "(-9223372036854775807ll - 1)")
                                          : (fl ? "INFINITY" : acc == EM_I32 ? "2147483647" : "9223372036854775807ll");
    char load[96], store[128];
    snprintf(load, sizeof load, half_in ? "(ACC)em_from_%s(v)" : "(ACC)(v)", in == EM_F16 ? "f16" : "bf16");
    if (half_out)
        snprintf(store, sizeof store, acc == EM_F64 ? "em_to_%s(em_f64_to_f32_odd(v))" : "em_to_%s((float)(v))",
                 o == EM_F16 ? "f16" : "bf16");
    else
        snprintf(store, sizeof store, "(O)(v)");
    return text_of(textf("/* ember native: column reduction */\n#define INFINITY __int_as_float(0x7f800000)\n"
                        "typedef %s T;\ntypedef %s ACC;\ntypedef %s O;\n#define LOAD(v) %s\n"
                        "#define STORE(v) %s\n#define COMBINE(p, q) %s\n#define INIT %s\n#define FINAL(v) %s\n%s",
                        c_type(in), c_type(acc), c_type(o), load, store, comb, init,
                        final && op == EM_OP_MEAN ? "((v) * g.inv)" : "(v)",
                        half_in || half_out ? cuda_half_helpers : ""),
                   colred_body);
}

/* Whether c reduces one block of dims [lo, hi) of a contiguous input that
 * is not its trailing dims (the rows kernel's case), into *A, *R, *C. */
bool cuda_native_column_reduction(const em_op_call *c, int64_t *A, int64_t *R, int64_t *C) {
    em_op op = c->op;
    if (op != EM_OP_SUM && op != EM_OP_MEAN && op != EM_OP_AMAX && op != EM_OP_AMIN) return false;
    const em_tensor *x = c->nin == 1 ? c->in[0] : NULL; /* (creation ops have no input) */
    if (!x || c->attrs->ndims == 0 || !em_is_contiguous(x) || colred_acc(op, x->dtype) < 0) return false;
    bool red[EM_MAX_DIMS] = {false};
    for (int i = 0; i < c->attrs->ndims; i++) red[c->attrs->dims[i]] = true;
    int lo = 0, hi;
    while (lo < x->ndim && !red[lo]) lo++;
    for (hi = lo; hi < x->ndim && red[hi]; hi++) {
    }
    for (int d = hi; d < x->ndim; d++)
        if (red[d]) return false; /* not one block */
    if (hi == x->ndim) return false;
    *A = em_shape_numel(lo, x->sizes);
    *R = em_shape_numel(hi - lo, x->sizes + lo);
    *C = em_shape_numel(x->ndim - hi, x->sizes + hi);
    return *R > 0;
}

typedef struct col_args { /* the kernel's struct em_col */
    long long A, R, C, chunk, ncb;
    double inv;
} col_args;

/* One launch: out[s, a, c] = op over rows [s chunk, (s + 1) chunk) of x
 * [A, R, C]. */
static em_status colred_launch(cuda_device *d, char *text, const void *x, void *out, col_args g,
                               int64_t S, cuda_get_stats *stats) {
    const cuda_kernel *k = NULL;
    em_status s = get_kernel(d, text, stats, &k);
    int64_t blocks = g.ncb * g.A * S;
    if (s == EM_OK && blocks > INT32_MAX)
        s = em_error(EM_ERR_UNSUPPORTED, "column reduction: %lld blocks", (long long)blocks);
    void *xp = (void *)x, *op = out;
    void *args[] = {&xp, &op, &g};
    return s == EM_OK ? cuda_source_launch(d, k, (unsigned)blocks, 256, 0, args) : s;
}

em_status cuda_native_reduce_columns(cuda_device *d, const em_op_call *c, em_tensor *out,
                                     cuda_get_stats *stats) {
    int64_t A, R, C;
    if (!cuda_native_column_reduction(c, &A, &R, &C))
        return em_error(EM_ERR_UNSUPPORTED, "cuda: not a column reduction");
    const em_tensor *x = c->in[0];
    em_dtype acc = (em_dtype)colred_acc(c->op, x->dtype);
    col_args g = {A, R, C, R, (C + 31) / 32, 1.0 / (double)R};
    /* enough blocks for 4 a multiprocessor, each chunk at least 64 rows */
    int64_t want = 4 * (int64_t)d->sm_count, have = g.ncb * A, S = 1;
    while (have * S < want && R / (2 * S) >= 64) S *= 2;
    if (S == 1)
        return colred_launch(d, cuda_native_colreduce_text(c->op, x->dtype, acc, out->dtype, true),
                             em_data(x), em_data(out), g, 1, stats);
    g.chunk = (R + S - 1) / S;
    em_meta pm;
    memset(&pm, 0, sizeof pm);
    pm.ndim = 1, pm.sizes[0] = S * A * C, pm.strides[0] = 1;
    pm.dtype = acc, pm.device = out->device;
    em_scope_begin();
    em_tensor *part = em_tensor_alloc(&pm);
    em_status s = part ? colred_launch(d, cuda_native_colreduce_text(c->op, x->dtype, acc, acc, false),
                                       em_data(x), em_data(part), g, S, stats)
                       : em_last_status();
    /* the S partials of each (a, c): [S, A * C] reduced over S */
    col_args g2 = {1, S, A * C, S, (A * C + 31) / 32, 1.0 / (double)R};
    if (s == EM_OK)
        s = colred_launch(d, cuda_native_colreduce_text(c->op, acc, acc, out->dtype, true), em_data(part),
                          em_data(out), g2, 1, stats);
    em_scope_end(); /* part is freed in stream order, after the launches that use it */
    return s;
}

/* ---- skinny matmul: out[M, N] = A[M, K] @ B[K, N] for M <= 8 ----
 * What a decoder's batch-1 to batch-8 steps are made of: every weight is
 * read once per token, so the matmul is a read of B at memory bandwidth,
 * which cuBLAS's gemv kernels reached only 30-50% of on the H200 for
 * GPT-2's [768, 3072] (docs/benchmarks.md, issue 20).  One kernel: block
 * (tile, s) of 8 warps takes 128 columns (a float4 a lane, rows of B read
 * in 512-byte runs) and chunk s of K, the warps splitting the chunk's rows,
 * each lane's loads all issued before the first product (a decoder's
 * matmul is a few microseconds: latency, not issue, bounds it);
 * A's chunk sits in shared memory; the warps' sums meet in shared memory
 * and the block writes its partial [M, 128].  The tile's last block to
 * finish (an arrival counter, cuda_device.sems) adds the S partials in a
 * fixed order and writes the result: no second launch, which in a
 * decoder step of ~50 matmuls costs more than the adds, and no atomics on
 * the values (the result is the same on every run).  f32 only, B
 * row-major with N a multiple of 4; anything else is cuBLAS's
 * (EM_ERR_UNSUPPORTED).  EMBER_CUDA_GEMV=0 turns it off. */

#define SKINNY_MAX_M 8
#define SKINNY_KC_MAX 128

static const char skinny_body[] =
    "struct em_mm { long long K, N, ldb, S, kc, nt, nd; long long asz[8], ast[8]; };\n"
    "/* the offset in A of row r (A's dims but the last, sizes asz, strides ast) */\n"
    "__device__ __forceinline__ long long em_arow(long long r, const em_mm &g) {\n"
    "  long long off = 0;\n"
    "  for (int d = (int)g.nd - 1; d >= 0; d--) {\n"
    "    const long long c = d ? r % g.asz[d] : r;\n"
    "    r = d ? r / g.asz[d] : 0;\n"
    "    off += c * g.ast[d];\n"
    "  }\n"
    "  return off;\n"
    "}\n"
    "/* t + bias[col..col+4) (a linear layer's bias; NULL: none) */\n"
    "__device__ __forceinline__ float4 em_biased(float4 t, const float *bias, long long col) {\n"
    "  if (!bias) return t;\n"
    "  const float4 u = *(const float4 *)(bias + col);\n"
    "  return make_float4(t.x + u.x, t.y + u.y, t.z + u.z, t.w + u.w);\n"
    "}\n"
    "/* part: [S, M, N] (out itself when S is 1); sem: a counter a tile;\n"
    "   bias: added to the result (NULL: none) */\n"
    "extern \"C\" __global__ void __launch_bounds__(256) EM_NAME(const float *__restrict__ a,\n"
    "    const float *__restrict__ b, const float *__restrict__ bias, float *part, float *__restrict__ out,\n"
    "    unsigned *sem, em_mm g) {\n"
    "  EM_AFTER_PRIOR();\n"
    "  __shared__ float sa[M][KC_MAX];\n"
    "  __shared__ float4 red[8][M][32];\n"
    "  __shared__ bool last;\n"
    "  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;\n"
    "  const long long tile = blockIdx.x % g.nt, s = blockIdx.x / g.nt;\n"
    "  const long long k0 = s * g.kc, k1 = k0 + g.kc < g.K ? k0 + g.kc : g.K;\n"
    "  const long long n = tile * 128 + lane * 4;\n"
    "  float4 acc[M];\n"
    "#pragma unroll\n"
    "  for (int m = 0; m < M; m++) acc[m] = make_float4(0.f, 0.f, 0.f, 0.f);\n"
    "  /* every row of the chunk a lane reads (w, w + 8, ...), its loads all\n"
    "     in flight at once, then A's chunk into shared memory, then the\n"
    "     products */\n"
    "  float4 bv[KC_MAX / 8];\n"
    "#pragma unroll\n"
    "  for (int r = 0; r < KC_MAX / 8; r++) {\n"
    "    const long long k = k0 + w + 8 * r;\n"
    "    bv[r] = n < g.N && k < k1 ? __ldg((const float4 *)(b + k * g.ldb + n)) : make_float4(0.f, 0.f, 0.f, 0.f);\n"
    "  }\n"
    "  for (int i = threadIdx.x; i < M * g.kc; i += 256) {\n"
    "    const int m = i / (int)g.kc, kk = i % (int)g.kc;\n"
    "    sa[m][kk] = k0 + kk < g.K ? a[em_arow(m, g) + (k0 + kk) * g.ast[7]] : 0.0f;\n"
    "  }\n"
    "  __syncthreads();\n"
    "#pragma unroll\n"
    "  for (int r = 0; r < KC_MAX / 8; r++) {\n"
    "    const int kk = w + 8 * r;\n"
    "#pragma unroll\n"
    "    for (int m = 0; m < M; m++) {\n"
    "      const float x = k0 + kk < k1 ? sa[m][kk] : 0.f; /* sa is only kc wide */\n"
    "      acc[m].x = fmaf(x, bv[r].x, acc[m].x), acc[m].y = fmaf(x, bv[r].y, acc[m].y);\n"
    "      acc[m].z = fmaf(x, bv[r].z, acc[m].z), acc[m].w = fmaf(x, bv[r].w, acc[m].w);\n"
    "    }\n"
    "  }\n"
    "#pragma unroll\n"
    "  for (int m = 0; m < M; m++) red[w][m][lane] = acc[m];\n"
    "  __syncthreads();\n"
    "  for (int i = threadIdx.x; i < M * 32; i += 256) {\n"
    "    const int m = i / 32, l = i % 32;\n"
    "    const long long col = tile * 128 + l * 4;\n"
    "    if (col >= g.N) continue;\n"
    "    float4 t = red[0][m][l];\n"
    "    for (int j = 1; j < 8; j++) {\n"
    "      const float4 u = red[j][m][l];\n"
    "      t.x += u.x, t.y += u.y, t.z += u.z, t.w += u.w;\n"
    "    }\n"
    "    if (g.S == 1) t = em_biased(t, bias, col);\n"
    "    *(float4 *)(part + (s * M + m) * g.N + col) = t;\n"
    "  }\n"
    "  if (g.S == 1) return;\n"
    "  /* the partial is out before the arrival is counted */\n"
    "  __threadfence();\n"
    "  __syncthreads();\n"
    "  if (threadIdx.x == 0) last = atomicAdd(sem + tile, 1u) == (unsigned)g.S - 1;\n"
    "  __syncthreads();\n"
    "  if (!last) return;\n"
    "  __threadfence();\n"
    "  /* the tile's M x 32 float4 outputs, 256 / (M * 32) groups of threads\n"
    "     each adding every G-th partial (L2 reads: other blocks wrote them),\n"
    "     then the groups' sums in order */\n"
    "  const int G = 256 / (M * 32), o = threadIdx.x % (M * 32), grp = threadIdx.x / (M * 32);\n"
    "  const int m = o / 32;\n"
    "  const long long col = tile * 128 + (o % 32) * 4;\n"
    "  float4 t = make_float4(0.f, 0.f, 0.f, 0.f);\n"
    "  if (grp < G && col < g.N)\n"
    "#pragma unroll 4\n"
    "    for (long long j = grp; j < g.S; j += G) {\n"
    "      const float4 u = __ldcg((const float4 *)(part + (j * M + m) * g.N + col));\n"
    "      t.x += u.x, t.y += u.y, t.z += u.z, t.w += u.w;\n"
    "    }\n"
    "  __syncthreads();\n"
    "  if (grp < G) ((float4 *)red[grp])[o] = t;\n"
    "  __syncthreads();\n"
    "  if (grp == 0 && col < g.N) {\n"
    "    for (int j = 1; j < G; j++) {\n"
    "      const float4 u = ((float4 *)red[j])[o];\n"
    "      t.x += u.x, t.y += u.y, t.z += u.z, t.w += u.w;\n"
    "    }\n"
    "    *(float4 *)(out + (long long)m * g.N + col) = em_biased(t, bias, col);\n"
    "  }\n"
    "  if (threadIdx.x == 0) sem[tile] = 0; /* for the next kernel that counts */\n"
    "}\n";

char *cuda_native_skinny_text(int m) {
    if (m < 1 || m > SKINNY_MAX_M) {
        em_error(EM_ERR_ARG, "skinny matmul: %d rows (1 to %d)", m, SKINNY_MAX_M);
        return NULL;
    }
    return text_of(textf("/* ember native: skinny matmul */\n#define M %d\n#define KC_MAX %d\n", m, SKINNY_KC_MAX),
                   skinny_body);
}

typedef struct skinny_args { /* the kernel's struct em_mm, field for field */
    long long K, N, ldb, S, kc, nt, nd;
    long long asz[8], ast[8]; /* A's dims but the last (ast[7]: the last's stride) */
} skinny_args;

static bool skinny_off(void) {
    char off[8];
    return em_getenv("EMBER_CUDA_GEMV", off, sizeof off) && !strcmp(off, "0");
}

/* Whether a @ b fits the kernel by shapes, dtypes and strides (the
 * file's comment), and its geometry: a's rows, merged. */
static bool skinny_shape(const em_meta *a, const em_meta *b, skinny_args *g, int64_t *M) {
    if (a->dtype != EM_F32 || b->dtype != EM_F32 || b->ndim != 2 || a->ndim < 2 || a->ndim - 1 > 7)
        return false;
    int64_t K = b->sizes[0], N = b->sizes[1];
    if (a->sizes[a->ndim - 1] != K || K < 1 || N < 4 || N % 4 || b->strides[1] != 1 || b->strides[0] % 4 ||
        b->strides[0] < N)
        return false;
    memset(g, 0, sizeof *g);
    *M = 1;
    for (int d = 0; d < a->ndim - 1; d++) {
        *M *= a->sizes[d];
        g->asz[d] = a->sizes[d], g->ast[d] = a->strides[d];
    }
    if (*M < 1 || *M > SKINNY_MAX_M) return false;
    g->nd = a->ndim - 1;
    g->ast[7] = a->strides[a->ndim - 1];
    g->K = K, g->N = N, g->ldb = b->strides[0];
    return true;
}

bool cuda_native_skinny_takes(const em_meta *a, const em_meta *b, const em_meta *bias) {
    skinny_args g;
    int64_t M;
    return !skinny_off() && skinny_shape(a, b, &g, &M) &&
           (!bias || (bias->dtype == EM_F32 && bias->strides[bias->ndim - 1] == 1));
}

/* Whether the call fits the kernel: its shapes, out contiguous, b and
 * the bias (linear's third input) 16-byte aligned for float4 loads. */
static bool skinny_fits(const em_op_call *c, const em_tensor *out, skinny_args *g, int64_t *M) {
    em_meta a, b, bias;
    tr_meta_of(c->in[0], &a), tr_meta_of(c->in[1], &b);
    const em_tensor *bt = c->op == EM_OP_LINEAR ? c->in[2] : NULL;
    if (bt) tr_meta_of(bt, &bias);
    return out->dtype == EM_F32 && em_is_contiguous(out) && !((uintptr_t)em_data(c->in[1]) & 15) &&
           (!bt || !((uintptr_t)em_data(bt) & 15)) && cuda_native_skinny_takes(&a, &b, bt ? &bias : NULL) &&
           skinny_shape(&a, &b, g, M);
}

em_status cuda_native_skinny_matmul(cuda_device *d, const em_op_call *c, em_tensor *out,
                                    struct cuda_get_stats *stats) {
    skinny_args g;
    int64_t M;
    if ((c->op != EM_OP_MATMUL && c->op != EM_OP_LINEAR) || !skinny_fits(c, out, &g, &M))
        return em_error(EM_ERR_UNSUPPORTED, "cuda: not a skinny matmul");
    /* enough blocks for ~1 an SM (EMBER_CUDA_GEMV_BLOCKS: 1 to 16; on
     * the H200 a GPT-2 decode step was fastest at 1, 1-3% ahead of 2 and
     * 20% ahead of 3: fewer, longer chunks leave fewer partials to add,
     * and a block's 256 lanes already keep 64 KiB of loads in flight); a
     * chunk of K is a multiple of the 8 warps, at most KC_MAX rows (a lane
     * holds its rows' loads in registers); one chunk when there are more
     * tiles than counters */
    g.nt = (g.N + 127) / 128;
    char per[8];
    int64_t f = em_getenv("EMBER_CUDA_GEMV_BLOCKS", per, sizeof per) ? atoi(per) : 1;
    f = f < 1 || f > 16 ? 1 : f;
    int64_t want = f * (int64_t)(d->sm_count > 0 ? d->sm_count : 1), S = (want + g.nt - 1) / g.nt;
    int64_t kc = (g.K + S - 1) / S;
    kc = (kc + 7) / 8 * 8;
    if (kc > SKINNY_KC_MAX) kc = SKINNY_KC_MAX;
    g.kc = kc, g.S = S = (g.K + kc - 1) / kc;
    if (g.nt * S > INT32_MAX || (S > 1 && g.nt > CUDA_NSEMS))
        return em_error(EM_ERR_UNSUPPORTED, "cuda: skinny matmul too large");
    void *ap = em_data(c->in[0]), *bp = em_data(c->in[1]), *op = em_data(out);
    void *biasp = c->op == EM_OP_LINEAR ? em_data(c->in[2]) : NULL;
    CUdeviceptr sem = d->sems;
    em_meta pm;
    memset(&pm, 0, sizeof pm);
    pm.ndim = 1, pm.sizes[0] = S * M * g.N, pm.strides[0] = 1, pm.dtype = EM_F32, pm.device = out->device;
    em_scope_begin();
    em_tensor *part = S > 1 ? em_tensor_alloc(&pm) : NULL;
    void *pp = S > 1 ? (part ? em_data(part) : NULL) : op;
    const cuda_kernel *k = NULL;
    em_status s = pp ? get_kernel(d, cuda_native_skinny_text((int)M), stats, &k) : em_last_status();
    void *args[] = {&ap, &bp, &biasp, &pp, &op, &sem, &g};
    if (s == EM_OK) s = cuda_source_launch(d, k, (unsigned)(g.nt * S), 256, 0, args);
    em_scope_end(); /* the partials are freed in stream order */
    return s;
}

/* ---- dispatch ---- */

bool cuda_native_takes(em_op op) {
    return op == EM_OP_CAT || op == EM_OP_INDEX_SELECT || op == EM_OP_INDEX_COPY ||
           op == EM_OP_ARANGE || op == EM_OP_RAND || op == EM_OP_RANDN || op == EM_OP_ARGMAX;
}

em_status cuda_native_run(cuda_device *d, const em_op_call *c, em_tensor *out,
                          struct cuda_get_stats *stats) {
    switch (c->op) {
    case EM_OP_CAT: return run_cat(d, c, out, stats);
    case EM_OP_INDEX_SELECT: return run_index_select(d, c, out, stats);
    case EM_OP_INDEX_COPY: return run_index_copy(d, c, out, stats);
    case EM_OP_ARANGE: return run_arange(d, c, out, stats);
    case EM_OP_RAND:
    case EM_OP_RANDN: return run_rand(d, c, out, stats);
    case EM_OP_ARGMAX: return run_argmax(d, c, out, stats);
    default: return em_error(EM_ERR_UNSUPPORTED, "cuda: %s has no native kernel", em_op_table[c->op].name);
    }
}

#endif /* EMBER_HAVE_CUDA */
