/* cpu_reduce.c - reductions on CPU: sum mean amax amin var argmax.
 *
 * The input is viewed (no copy) as an outer iteration over the kept dims and
 * an inner block over the reduced dims.  Both are built from the input's own
 * sizes and strides: size-1 dims are dropped, the inner dims are ordered by
 * decreasing stride (broadcast dims outermost), and adjacent dims that are
 * contiguous with each other are merged, so a reduction over a contiguous
 * block is one flat run.  Each output element reduces its block with typed
 * "run" loops (a contiguous fast path with several accumulators, a strided
 * path otherwise).
 *
 * When the block's innermost run is strided but the outputs are contiguous
 * in the input (sum over dim 0 of a row-major matrix), a "vertical" path
 * reduces tiles of adjacent outputs together, reading the input row by row
 * (four rows per pass over the tile's accumulators).
 *
 * Floats accumulate in double (sum, mean, var; f16 and bf16 elements load
 * through f32, exactly, and the result rounds once), integers in int64 with
 * wrapping; max/min propagate NaN; var is two-pass (mean, then the sum of
 * squared deviations) in double.
 *
 * Work is split into items: (output or tile of outputs) x (chunk of the
 * block).  The block is split into chunks only when there are few outputs,
 * and how depends only on the shape, never on the thread count: partial
 * results are combined in chunk order, so a result is the same bits
 * whatever the number of threads. */
#include "cpu.h"

#include <math.h>
#include <string.h>

#define RED_CHUNK 16384   /* inner elements per work item when outputs are few */
#define RED_FEW 64        /* below this many output groups, split the blocks */
#define RED_VTILE 2048    /* outputs per tile on the vertical path (on the stack) */
#define RED_VROWS 64      /* rows per chunk at least on the vertical path */
#define RED_VMIN 8        /* a vertical tile needs this many contiguous outputs */

/* `omp simd` lifts -O2's vectorizer cost model where OpenMP is on. */
#define RED_PRAGMA(x) _Pragma(#x)
#if defined(_OPENMP) || defined(EM_OPENMP_SIMD)
#define RED_SIMD RED_PRAGMA(omp simd)
#define RED_SIMD_RED(clauses) RED_PRAGMA(omp simd clauses)
#else
#define RED_SIMD
#define RED_SIMD_RED(clauses)
#endif

/* A partial result: floats accumulate in double, integers in int64. */
typedef union acc {
    double f;
    int64_t i;
} acc_t;

enum { R_SUM, R_MAX, R_MIN, R_SQDEV, R_NOPS, R_VARF = R_NOPS /* fused mean + sqdev */ };
enum { K_SUM, K_MEAN, K_EXT /* amax, amin */, K_VAR };

/* Reduces n elements from p, st elements apart, into *a (m: the mean, for
 * R_SQDEV). */
typedef void (*run_fn)(const char *p, int64_t n, int64_t st, acc_t *a, double m);
/* Vertical: folds nr rows of w contiguous elements (row r at p + r * rs
 * elements) into a[0..w) (m[0..w): the means, for R_SQDEV). */
typedef void (*vrun_fn)(const char *p, int64_t nr, int64_t rs, int64_t w, acc_t *a,
                        const double *m);

typedef struct rfuns {
    bool is_float;
    run_fn run[R_NOPS];
    vrun_fn vrun[R_NOPS];
} rfuns;

/* max / min that propagate NaN: once the accumulator is NaN it stays NaN. */
#define MAXN(a, b) (((b) > (a) || (b) != (b)) ? (b) : (a))
#define MINN(a, b) (((b) < (a) || (b) != (b)) ? (b) : (a))

/* ---- typed run loops ---- */

/* Vertical loops: STEP(c, v, t) folds element v of output t into c (of type
 * ACC, kept in a[t].FIELD).  Four rows per pass over the accumulators. */
#define VRUN(NAME, S, T, ACC, FIELD, STEP, LD)                                             \
    static void vrun_##NAME##_##S(const char *p_, int64_t nr, int64_t rs, int64_t w,       \
                                  acc_t *a, const double *m) {                             \
        (void)m;                                                                           \
        int64_t r = 0;                                                                     \
        for (; r + 4 <= nr; r += 4) {                                                      \
            const T *q0 = (const T *)p_ + r * rs, *q1 = q0 + rs, *q2 = q1 + rs,            \
                    *q3 = q2 + rs;                                                         \
            RED_SIMD                                                                       \
            for (int64_t t = 0; t < w; t++) {                                              \
                ACC c = a[t].FIELD;                                                        \
                STEP(c, LD(q0[t]), t);                                                     \
                STEP(c, LD(q1[t]), t);                                                     \
                STEP(c, LD(q2[t]), t);                                                     \
                STEP(c, LD(q3[t]), t);                                                     \
                a[t].FIELD = c;                                                            \
            }                                                                              \
        }                                                                                  \
        for (; r < nr; r++) {                                                              \
            const T *q = (const T *)p_ + r * rs;                                           \
            RED_SIMD                                                                       \
            for (int64_t t = 0; t < w; t++) {                                              \
                ACC c = a[t].FIELD;                                                        \
                STEP(c, LD(q[t]), t);                                                      \
                a[t].FIELD = c;                                                            \
            }                                                                              \
        }                                                                                  \
    }

#define STEP_FSUM(c, v, t) (c += (double)(v))
#define STEP_FSQDEV(c, v, t)                                                               \
    do {                                                                                   \
        double d_ = (double)(v) - m[t];                                                    \
        c += d_ * d_;                                                                      \
    } while (0)
#define STEP_FMAX(c, v, t)                                                                 \
    do {                                                                                   \
        double v_ = (v);                                                                   \
        c = (v_ > c || v_ != v_) ? v_ : c;                                                 \
    } while (0)
#define STEP_FMIN(c, v, t)                                                                 \
    do {                                                                                   \
        double v_ = (v);                                                                   \
        c = (v_ < c || v_ != v_) ? v_ : c;                                                 \
    } while (0)

/* max/min of a run: a NaN flag plus a plain max, so the loop vectorizes. */
#define FLOAT_EXT_RUN(T, VT, S, NAME, INIT, CMP, RED, PICK, LD)                            \
    static void run_##NAME##_##S(const char *p_, int64_t n, int64_t st, acc_t *a,          \
                                 double m_) {                                              \
        const T *p = (const T *)p_;                                                        \
        (void)m_;                                                                          \
        VT m = INIT;                                                                       \
        int nan = 0;                                                                       \
        if (st == 1) {                                                                     \
            RED_SIMD_RED(reduction(RED : m) reduction(| : nan))                            \
            for (int64_t i = 0; i < n; i++) {                                              \
                VT v = LD(p[i]);                                                           \
                m = v CMP m ? v : m;                                                       \
                nan |= v != v;                                                             \
            }                                                                              \
        } else {                                                                           \
            for (int64_t i = 0; i < n; i++) {                                              \
                VT v = LD(p[i * st]);                                                      \
                m = v CMP m ? v : m;                                                       \
                nan |= v != v;                                                             \
            }                                                                              \
        }                                                                                  \
        a->f = nan ? (double)NAN : PICK(a->f, (double)m);                                  \
    }

#define FLOAT_RUNS(T, VT, S, LD)                                                           \
    static void run_sum_##S(const char *p_, int64_t n, int64_t st, acc_t *a, double m) {   \
        const T *p = (const T *)p_;                                                        \
        (void)m;                                                                           \
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;             \
        int64_t i = 0;                                                                     \
        if (st == 1) {                                                                     \
            for (; i + 8 <= n; i += 8) {                                                   \
                s0 += LD(p[i]);                                                            \
                s1 += LD(p[i + 1]);                                                        \
                s2 += LD(p[i + 2]);                                                        \
                s3 += LD(p[i + 3]);                                                        \
                s4 += LD(p[i + 4]);                                                        \
                s5 += LD(p[i + 5]);                                                        \
                s6 += LD(p[i + 6]);                                                        \
                s7 += LD(p[i + 7]);                                                        \
            }                                                                              \
            for (; i < n; i++) s0 += LD(p[i]);                                             \
        } else {                                                                           \
            for (; i + 4 <= n; i += 4) {                                                   \
                s0 += LD(p[i * st]);                                                       \
                s1 += LD(p[(i + 1) * st]);                                                 \
                s2 += LD(p[(i + 2) * st]);                                                 \
                s3 += LD(p[(i + 3) * st]);                                                 \
            }                                                                              \
            for (; i < n; i++) s0 += LD(p[i * st]);                                        \
        }                                                                                  \
        a->f += ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));                         \
    }                                                                                      \
    static void run_sqdev_##S(const char *p_, int64_t n, int64_t st, acc_t *a, double m) { \
        const T *p = (const T *)p_;                                                        \
        double s0 = 0, s1 = 0, s2 = 0, s3 = 0;                                             \
        int64_t i = 0;                                                                     \
        if (st == 1) {                                                                     \
            for (; i + 4 <= n; i += 4) {                                                   \
                double d0 = LD(p[i]) - m, d1 = LD(p[i + 1]) - m, d2 = LD(p[i + 2]) - m,    \
                       d3 = LD(p[i + 3]) - m;                                              \
                s0 += d0 * d0;                                                             \
                s1 += d1 * d1;                                                             \
                s2 += d2 * d2;                                                             \
                s3 += d3 * d3;                                                             \
            }                                                                              \
        }                                                                                  \
        for (; i < n; i++) {                                                               \
            double d = LD(p[i * st]) - m;                                                  \
            s0 += d * d;                                                                   \
        }                                                                                  \
        a->f += (s0 + s1) + (s2 + s3);                                                     \
    }                                                                                      \
    FLOAT_EXT_RUN(T, VT, S, max, -INFINITY, >, max, MAXN, LD)                              \
    FLOAT_EXT_RUN(T, VT, S, min, INFINITY, <, min, MINN, LD)                               \
    VRUN(sum, S, T, double, f, STEP_FSUM, LD)                                              \
    VRUN(sqdev, S, T, double, f, STEP_FSQDEV, LD)                                          \
    VRUN(max, S, T, double, f, STEP_FMAX, LD)                                              \
    VRUN(min, S, T, double, f, STEP_FMIN, LD)                                              \
    static const rfuns funs_##S = {true,                                                   \
                                   {run_sum_##S, run_max_##S, run_min_##S, run_sqdev_##S}, \
                                   {vrun_sum_##S, vrun_max_##S, vrun_min_##S, vrun_sqdev_##S}};

#define INT_EXT_RUN(T, S, CV, NAME, CMP, RED)                                              \
    static void run_##NAME##_##S(const char *p_, int64_t n, int64_t st, acc_t *a,          \
                                 double m) {                                               \
        const T *p = (const T *)p_;                                                        \
        (void)m;                                                                           \
        int64_t r = a->i;                                                                  \
        if (st == 1) {                                                                     \
            RED_SIMD_RED(reduction(RED : r))                                               \
            for (int64_t i = 0; i < n; i++) {                                              \
                int64_t v = CV(p[i]);                                                      \
                r = v CMP r ? v : r;                                                       \
            }                                                                              \
        } else {                                                                           \
            for (int64_t i = 0; i < n; i++) {                                              \
                int64_t v = CV(p[i * st]);                                                 \
                r = v CMP r ? v : r;                                                       \
            }                                                                              \
        }                                                                                  \
        a->i = r;                                                                          \
    }

/* Integers: sums wrap (computed in uint64, no UB); CV converts an element to
 * int64 (bool: 0/1). */
#define INT_RUNS(T, S, CV)                                                                 \
    static void run_sum_##S(const char *p_, int64_t n, int64_t st, acc_t *a, double m) {   \
        const T *p = (const T *)p_;                                                        \
        (void)m;                                                                           \
        uint64_t s = 0;                                                                    \
        if (st == 1) {                                                                     \
            RED_SIMD_RED(reduction(+ : s))                                                 \
            for (int64_t i = 0; i < n; i++) s += (uint64_t)CV(p[i]);                       \
        } else {                                                                           \
            for (int64_t i = 0; i < n; i++) s += (uint64_t)CV(p[i * st]);                  \
        }                                                                                  \
        a->i = (int64_t)((uint64_t)a->i + s);                                              \
    }                                                                                      \
    INT_EXT_RUN(T, S, CV, max, >, max)                                                     \
    INT_EXT_RUN(T, S, CV, min, <, min)                                                     \
    VRUN(sum, S, T, int64_t, i, STEP_ISUM_##S, ID)                                         \
    VRUN(max, S, T, int64_t, i, STEP_IMAX_##S, ID)                                         \
    VRUN(min, S, T, int64_t, i, STEP_IMIN_##S, ID)                                         \
    static const rfuns funs_##S = {false,                                                  \
                                   {run_sum_##S, run_max_##S, run_min_##S, NULL},          \
                                   {vrun_sum_##S, vrun_max_##S, vrun_min_##S, NULL}};

#define CV_INT(x) ((int64_t)(x))
#define CV_BOOL(x) ((int64_t)((x) != 0))

#define STEP_ISUM_i32(c, v, t) (c = (int64_t)((uint64_t)c + (uint64_t)CV_INT(v)))
#define STEP_ISUM_i64(c, v, t) (c = (int64_t)((uint64_t)c + (uint64_t)CV_INT(v)))
#define STEP_ISUM_b8(c, v, t) (c = (int64_t)((uint64_t)c + (uint64_t)CV_BOOL(v)))
#define STEP_IMAX_i32(c, v, t) (c = CV_INT(v) > c ? CV_INT(v) : c)
#define STEP_IMAX_i64(c, v, t) (c = CV_INT(v) > c ? CV_INT(v) : c)
#define STEP_IMAX_b8(c, v, t) (c = CV_BOOL(v) > c ? CV_BOOL(v) : c)
#define STEP_IMIN_i32(c, v, t) (c = CV_INT(v) < c ? CV_INT(v) : c)
#define STEP_IMIN_i64(c, v, t) (c = CV_INT(v) < c ? CV_INT(v) : c)
#define STEP_IMIN_b8(c, v, t) (c = CV_BOOL(v) < c ? CV_BOOL(v) : c)

/* identity load; half types load through f32 (cpu.h) */
#define ID(x) (x)
FLOAT_RUNS(float, float, f32, ID)
FLOAT_RUNS(double, double, f64, ID)
FLOAT_RUNS(uint16_t, float, f16, em_half_to_float)
FLOAT_RUNS(uint16_t, float, bf16, em_bf16_to_float)
INT_RUNS(int32_t, i32, CV_INT)
INT_RUNS(int64_t, i64, CV_INT)
INT_RUNS(uint8_t, b8, CV_BOOL)

static const rfuns *funs_for(em_dtype d) {
    switch (d) {
    case EM_F32: return &funs_f32;
    case EM_F64: return &funs_f64;
    case EM_F16: return &funs_f16;
    case EM_BF16: return &funs_bf16;
    case EM_I32: return &funs_i32;
    case EM_I64: return &funs_i64;
    case EM_BOOL: return &funs_b8;
    default: return NULL;
    }
}

/* ---- the reduction's geometry ---- */

typedef struct plan {
    int no, ni;                                  /* outer (kept) and inner (reduced) dims */
    int64_t osz[EM_MAX_DIMS], ost[EM_MAX_DIMS];  /* row-major over the output */
    int64_t isz[EM_MAX_DIMS], ist[EM_MAX_DIMS];  /* innermost last */
    int64_t nout, nred;
} plan;


/* Stride order key for the inner dims: broadcast (stride 0) dims first. */
static int64_t stride_key(int64_t st) { return st == 0 ? INT64_MAX : st; }

/* Steps the output multi-index idx (row-major) and returns the input
 * offset of the next output's block, given the current one. */
static inline int64_t next_output(const plan *P, int64_t *idx, int64_t off) {
    for (int d = P->no - 1; d >= 0; d--) {
        off += P->ost[d];
        if (++idx[d] < P->osz[d]) break;
        off -= P->ost[d] * P->osz[d];
        idx[d] = 0;
    }
    return off;
}

static void make_plan(plan *P, const em_tensor *x, const bool *red) {
    P->no = P->ni = 0;
    P->nout = 1;
    P->nred = 1;
    for (int d = 0; d < x->ndim; d++)
        if (!red[d]) {
            P->nout *= x->sizes[d];
            if (x->sizes[d] != 1) em_dims_push(P->osz, P->ost, &P->no, x->sizes[d], x->strides[d]);
        }
    if (P->no == 0) {
        P->osz[0] = 1;
        P->ost[0] = 0;
        P->no = 1;
    }
    int64_t rsz[EM_MAX_DIMS], rst[EM_MAX_DIMS];
    int nr = 0;
    bool empty = false;
    for (int d = 0; d < x->ndim; d++)
        if (red[d]) {
            if (x->sizes[d] == 0) empty = true;
            if (x->sizes[d] != 1) {
                rsz[nr] = x->sizes[d];
                rst[nr] = x->strides[d];
                nr++;
            }
        }
    if (empty) {
        P->nred = 0;
        P->isz[0] = 0;
        P->ist[0] = 0;
        P->ni = 1;
        return;
    }
    /* stable insertion sort by decreasing stride (broadcast dims first) */
    for (int a = 1; a < nr; a++) {
        int64_t s = rsz[a], t = rst[a];
        int b = a - 1;
        while (b >= 0 && stride_key(rst[b]) < stride_key(t)) {
            rsz[b + 1] = rsz[b];
            rst[b + 1] = rst[b];
            b--;
        }
        rsz[b + 1] = s;
        rst[b + 1] = t;
    }
    for (int a = 0; a < nr; a++) {
        em_dims_push(P->isz, P->ist, &P->ni, rsz[a], rst[a]);
        P->nred *= rsz[a];
    }
    if (P->ni == 0) {
        P->isz[0] = 1;
        P->ist[0] = 0;
        P->ni = 1;
    }
}

/* The reduced dims of a call: attrs.dims, or every dim when ndims == 0. */
static em_status reduced_dims(const em_op_call *c, bool *red) {
    const em_tensor *x = c->in[0];
    const em_op_attrs *a = c->attrs;
    for (int d = 0; d < EM_MAX_DIMS; d++) red[d] = a->ndims == 0;
    for (int k = 0; k < a->ndims; k++) {
        int d = a->dims[k];
        if (d < 0 || d >= x->ndim)
            return em_error(EM_ERR_DIM, "%s: dim %d out of range for a %d-d tensor",
                            em_op_table[c->op].name, d, x->ndim);
        red[d] = true;
    }
    return EM_OK;
}

/* ---- execution ---- */

typedef struct rctx {
    const plan *P;
    const char *base;
    int64_t esz;
    const rfuns *F;
    int op;               /* R_SUM..R_SQDEV, or R_VARF */
    bool vertical;
    int64_t nch, chunk;   /* chunks per group; inner elements per chunk */
    int64_t L, ntile;     /* vertical: size of the last outer dim, tiles per row */
    acc_t *partial;       /* [nch][nout], or NULL: results go to out */
    const double *means;  /* R_SQDEV: one per output */
    /* finishing */
    int kind;
    char *out;
    em_dtype odt;
    double N;
    int correction;
} rctx;

static acc_t acc_init(const rctx *R, int op) {
    acc_t a;
    if (R->F->is_float)
        a.f = op == R_MAX ? -INFINITY : op == R_MIN ? INFINITY : 0.0;
    else
        a.i = op == R_MAX ? INT64_MIN : op == R_MIN ? INT64_MAX : 0;
    return a;
}

static void acc_combine(const rctx *R, int op, acc_t *a, acc_t b) {
    if (R->F->is_float) {
        switch (op) {
        case R_MAX: a->f = MAXN(a->f, b.f); break;
        case R_MIN: a->f = MINN(a->f, b.f); break;
        default: a->f += b.f; break;
        }
    } else {
        switch (op) {
        case R_MAX: a->i = b.i > a->i ? b.i : a->i; break;
        case R_MIN: a->i = b.i < a->i ? b.i : a->i; break;
        default: a->i = (int64_t)((uint64_t)a->i + (uint64_t)b.i); break;
        }
    }
}

static double var_of(const rctx *R, double ss) {
    double den = R->N - (double)R->correction;
    if (den < 0) den = 0;
    return ss / den;
}

/* Stores output o's final value. */
static void finish(const rctx *R, int64_t o, acc_t a) {
    double v = 0;
    switch (R->kind) {
    case K_SUM:
    case K_EXT:
        if (!R->F->is_float) {
            switch (R->odt) {
            case EM_I64: ((int64_t *)R->out)[o] = a.i; return;
            case EM_I32: ((int32_t *)R->out)[o] = (int32_t)a.i; return;
            case EM_BOOL: ((uint8_t *)R->out)[o] = a.i != 0; return;
            default: v = (double)a.i; break;
            }
        } else {
            v = a.f;
        }
        break;
    case K_MEAN: v = a.f / R->N; break;
    case K_VAR: v = var_of(R, a.f); break;
    }
    switch (R->odt) {
    case EM_F32: ((float *)R->out)[o] = (float)v; break;
    case EM_F16: ((uint16_t *)R->out)[o] = em_double_to_half(v); break; /* one rounding */
    case EM_BF16: ((uint16_t *)R->out)[o] = em_double_to_bf16(v); break;
    default: ((double *)R->out)[o] = v; break;
    }
}

static void emit(const rctx *R, int64_t o, int64_t c, acc_t a) {
    if (R->partial)
        R->partial[c * R->P->nout + o] = a;
    else
        finish(R, o, a);
}

/* The runs along the innermost inner dim that cover inner elements
 * [lo, hi) (row-major over the inner dims): each run_next gives the element
 * offset of a run and its length. */
typedef struct runs {
    const plan *P;
    int64_t idx[EM_MAX_DIMS], off, pos, cur, hi;
} runs;

static void runs_init(runs *it, const plan *P, int64_t lo, int64_t hi) {
    int ni = P->ni;
    int64_t last = P->isz[ni - 1], r = lo / last;
    it->P = P;
    it->off = 0;
    it->pos = lo % last;
    it->cur = lo;
    it->hi = hi;
    for (int d = ni - 2; d >= 0; d--) {
        it->idx[d] = r % P->isz[d];
        r /= P->isz[d];
        it->off += it->idx[d] * P->ist[d];
    }
}

static bool run_next(runs *it, int64_t *off, int64_t *len) {
    const plan *P = it->P;
    int ni = P->ni;
    if (it->cur >= it->hi) return false;
    int64_t last = P->isz[ni - 1];
    *len = last - it->pos;
    if (*len > it->hi - it->cur) *len = it->hi - it->cur;
    *off = it->off + it->pos * P->ist[ni - 1];
    it->cur += *len;
    it->pos = 0;
    for (int d = ni - 2; d >= 0; d--) {
        it->off += P->ist[d];
        if (++it->idx[d] < P->isz[d]) break;
        it->off -= P->ist[d] * P->isz[d];
        it->idx[d] = 0;
    }
    return true;
}

/* Folds inner elements [lo, hi) at p. */
static void hwalk(const rctx *R, const char *p, int64_t lo, int64_t hi, run_fn fn, acc_t *a,
                  double m) {
    runs it;
    int64_t off, len;
    if (lo >= hi) return;
    runs_init(&it, R->P, lo, hi);
    while (run_next(&it, &off, &len)) fn(p + off * R->esz, len, R->P->ist[R->P->ni - 1], a, m);
}

/* Vertical: folds the w outputs' rows for inner elements [lo, hi), one
 * call per run along the innermost inner dim. */
static void vwalk(const rctx *R, const char *p, int64_t lo, int64_t hi, vrun_fn fn, acc_t *a,
                  int64_t w, const double *m) {
    runs it;
    int64_t off, len;
    if (lo >= hi) return;
    runs_init(&it, R->P, lo, hi);
    while (run_next(&it, &off, &len)) fn(p + off * R->esz, len, R->P->ist[R->P->ni - 1], w, a, m);
}

static void h_items(void *ctx, int64_t b, int64_t e) {
    const rctx *R = ctx;
    const plan *P = R->P;
    int64_t o = b / R->nch, c = b % R->nch;
    int64_t idx[EM_MAX_DIMS], off = 0, r = o;
    for (int d = P->no - 1; d >= 0; d--) {
        idx[d] = r % P->osz[d];
        r /= P->osz[d];
        off += idx[d] * P->ost[d];
    }
    for (int64_t it = b; it < e; it++) {
        const char *p = R->base + off * R->esz;
        acc_t a;
        if (R->op == R_VARF) {
            acc_t s = acc_init(R, R_SUM);
            hwalk(R, p, 0, P->nred, R->F->run[R_SUM], &s, 0);
            double mean = s.f / R->N;
            a = acc_init(R, R_SQDEV);
            hwalk(R, p, 0, P->nred, R->F->run[R_SQDEV], &a, mean);
        } else {
            int64_t lo = c * R->chunk, hi = lo + R->chunk;
            if (hi > P->nred) hi = P->nred;
            a = acc_init(R, R->op);
            hwalk(R, p, lo, hi, R->F->run[R->op], &a, R->means ? R->means[o] : 0.0);
        }
        emit(R, o, c, a);
        if (++c == R->nch) {
            c = 0;
            o++;
            off = next_output(P, idx, off);
        }
    }
}

static void v_items(void *ctx, int64_t b, int64_t e) {
    const rctx *R = ctx;
    const plan *P = R->P;
    acc_t a[RED_VTILE];
    double m[RED_VTILE];
    for (int64_t it = b; it < e; it++) {
        int64_t g = it / R->nch, c = it % R->nch;
        int64_t row = g / R->ntile, tile = g % R->ntile;
        int64_t off = 0, r = row;
        for (int d = P->no - 2; d >= 0; d--) {
            off += (r % P->osz[d]) * P->ost[d];
            r /= P->osz[d];
        }
        int64_t j0 = tile * RED_VTILE, w = R->L - j0;
        if (w > RED_VTILE) w = RED_VTILE;
        int64_t o0 = row * R->L + j0;
        const char *p = R->base + (off + j0) * R->esz; /* last outer stride is 1 */
        if (R->op == R_VARF) {
            for (int64_t t = 0; t < w; t++) a[t] = acc_init(R, R_SUM);
            vwalk(R, p, 0, P->nred, R->F->vrun[R_SUM], a, w, NULL);
            for (int64_t t = 0; t < w; t++) {
                m[t] = a[t].f / R->N;
                a[t] = acc_init(R, R_SQDEV);
            }
            vwalk(R, p, 0, P->nred, R->F->vrun[R_SQDEV], a, w, m);
        } else {
            int64_t lo = c * R->chunk, hi = lo + R->chunk;
            if (hi > P->nred) hi = P->nred;
            for (int64_t t = 0; t < w; t++) a[t] = acc_init(R, R->op);
            vwalk(R, p, lo, hi, R->F->vrun[R->op], a, w, R->means ? R->means + o0 : NULL);
        }
        for (int64_t t = 0; t < w; t++) emit(R, o0 + t, c, a[t]);
    }
}

static void run_items(rctx *R, int op, int64_t ngroups) {
    R->op = op;
    int64_t per = R->nch > 1 ? R->chunk : R->P->nred;
    if (R->vertical) per *= R->L < RED_VTILE ? R->L : RED_VTILE;
    if (op == R_VARF) per *= 2;
    if (per < 1) per = 1;
    int64_t grain = EM_PARALLEL_GRAIN / per;
    if (grain < 1) grain = 1;
    em_parallel_for(ngroups * R->nch, grain, R->vertical ? v_items : h_items, R);
}

/* Combines the chunks' partial results of output o, in chunk order. */
static acc_t combined(const rctx *R, int op, int64_t o) {
    int64_t nout = R->P->nout;
    acc_t a = R->partial[o];
    for (int64_t c = 1; c < R->nch; c++) acc_combine(R, op, &a, R->partial[c * nout + o]);
    return a;
}

static em_status reduce(const em_op_call *c, em_tensor *out, int kind, int op) {
    const em_tensor *x = c->in[0];
    const char *name = em_op_table[c->op].name;
    int64_t onumel = 1;
    for (int d = 0; d < out->ndim; d++) onumel *= out->sizes[d];
    if (onumel == 0) return EM_OK;
    const rfuns *F = funs_for(x->dtype);
    if (!F || ((kind == K_VAR || kind == K_MEAN) && !F->is_float))
        return em_error(EM_ERR_DTYPE, "%s: dtype %s is not supported", name,
                        em_dtype_name(x->dtype));
    bool red[EM_MAX_DIMS];
    em_status st = reduced_dims(c, red);
    if (st != EM_OK) return st;
    plan P;
    make_plan(&P, x, red);
    if (P.nout != onumel)
        return em_error(EM_ERR_SHAPE, "%s: output has %lld elements, expected %lld", name,
                        (long long)onumel, (long long)P.nout);
    if (P.nred == 0 && (op == R_MAX || op == R_MIN))
        return em_error(EM_ERR_SHAPE, "%s: reduction over an empty dim", name);

    rctx R = {0};
    R.P = &P;
    R.base = em_data(x);
    R.esz = (int64_t)em_dtype_size(x->dtype);
    R.F = F;
    R.kind = kind;
    R.out = em_data(out);
    R.odt = out->dtype;
    R.N = (double)P.nred;
    R.correction = c->attrs->correction;

    int64_t L = P.osz[P.no - 1];
    R.vertical = P.ost[P.no - 1] == 1 && L >= RED_VMIN && P.ist[P.ni - 1] != 1 && P.nred > 1;
    int64_t ngroups, chunk;
    if (R.vertical) {
        R.L = L;
        R.ntile = (L + RED_VTILE - 1) / RED_VTILE;
        ngroups = P.nout / L * R.ntile;
        chunk = RED_CHUNK / (L < RED_VTILE ? L : RED_VTILE);
        if (chunk < RED_VROWS) chunk = RED_VROWS; /* partials stay small beside the input */
    } else {
        ngroups = P.nout;
        chunk = RED_CHUNK;
    }
    /* Split blocks only for few groups: a rule on the shape alone, so the
     * result never depends on the thread count. */
    if (ngroups < RED_FEW && P.nred > chunk) {
        R.chunk = chunk;
        R.nch = (P.nred + chunk - 1) / chunk;
    } else {
        R.chunk = P.nred > 0 ? P.nred : 1;
        R.nch = 1;
    }

    if (R.nch == 1) {
        run_items(&R, kind == K_VAR ? R_VARF : op, ngroups);
        return EM_OK;
    }

    size_t np = (size_t)R.nch * (size_t)P.nout;
    R.partial = em_malloc(np * sizeof(acc_t));
    if (!R.partial) return em_error(EM_ERR_NOMEM, "%s: out of memory", name);
    if (kind == K_VAR) {
        double *means = em_malloc((size_t)P.nout * sizeof(double));
        if (!means) {
            em_free(R.partial);
            return em_error(EM_ERR_NOMEM, "%s: out of memory", name);
        }
        run_items(&R, R_SUM, ngroups);
        for (int64_t o = 0; o < P.nout; o++) means[o] = combined(&R, R_SUM, o).f / R.N;
        R.means = means;
        run_items(&R, R_SQDEV, ngroups);
        for (int64_t o = 0; o < P.nout; o++) finish(&R, o, combined(&R, R_SQDEV, o));
        em_free(means);
    } else {
        run_items(&R, op, ngroups);
        for (int64_t o = 0; o < P.nout; o++) finish(&R, o, combined(&R, op, o));
    }
    em_free(R.partial);
    return EM_OK;
}

em_status cpu_sum(const em_op_call *c, em_tensor *out) { return reduce(c, out, K_SUM, R_SUM); }
em_status cpu_mean(const em_op_call *c, em_tensor *out) { return reduce(c, out, K_MEAN, R_SUM); }
em_status cpu_amax(const em_op_call *c, em_tensor *out) { return reduce(c, out, K_EXT, R_MAX); }
em_status cpu_amin(const em_op_call *c, em_tensor *out) { return reduce(c, out, K_EXT, R_MIN); }
em_status cpu_var(const em_op_call *c, em_tensor *out) { return reduce(c, out, K_VAR, R_SQDEV); }

/* ---- argmax ----
 * The index of the first maximum along one dim; a NaN is the maximum (the
 * first NaN wins).  Same layout as above: rows of outputs reduced down the
 * dim when the outputs are contiguous in the input (vertical), else one
 * output at a time, its run split in chunks when the outputs are few. */

/* The first maximum of elements [lo, hi) (p[i * st]): *best (NaN if any)
 * and *bi (absolute index). */
typedef void (*argrun_fn)(const char *p, int64_t lo, int64_t hi, int64_t st, acc_t *best,
                          int64_t *bi);
/* Vertical: the first maxima of w outputs over n rows (row r at p + r * rs). */
typedef void (*argvrun_fn)(const char *p, int64_t n, int64_t rs, int64_t w, int64_t *bi);

/* Vertical argmax: b[t] / bi[t] the best so far of output t; four rows per
 * pass.  ARGSTEP(c, k, v, r) takes v (row r) over c when it is greater or a
 * NaN, unless c is already a NaN. */
#define ARGSTEP_F(c, k, v, r)                                                              \
    do {                                                                                   \
        int take_ = ((v) > c || (v) != (v)) && c == c;                                     \
        c = take_ ? (v) : c;                                                               \
        k = take_ ? (r) : k;                                                               \
    } while (0)
#define ARGSTEP_I(c, k, v, r)                                                              \
    do {                                                                                   \
        int take_ = (v) > c;                                                               \
        c = take_ ? (v) : c;                                                               \
        k = take_ ? (r) : k;                                                               \
    } while (0)
#define ARGVRUN(S, T, B, CV, STEP)                                                         \
    static void argvrun_##S(const char *p_, int64_t n, int64_t rs, int64_t w, int64_t *bi) {   \
        const T *p = (const T *)p_;                                                        \
        B b[RED_VTILE];                                                                    \
        for (int64_t t = 0; t < w; t++) {                                                  \
            b[t] = CV(p[t]);                                                               \
            bi[t] = 0;                                                                     \
        }                                                                                  \
        int64_t r = 1;                                                                     \
        for (; r + 4 <= n; r += 4) {                                                       \
            const T *q0 = p + r * rs, *q1 = q0 + rs, *q2 = q1 + rs, *q3 = q2 + rs;         \
            RED_SIMD                                                                       \
            for (int64_t t = 0; t < w; t++) {                                              \
                B c = b[t];                                                                \
                int64_t k = bi[t];                                                         \
                STEP(c, k, CV(q0[t]), r);                                                  \
                STEP(c, k, CV(q1[t]), r + 1);                                              \
                STEP(c, k, CV(q2[t]), r + 2);                                              \
                STEP(c, k, CV(q3[t]), r + 3);                                              \
                b[t] = c;                                                                  \
                bi[t] = k;                                                                 \
            }                                                                              \
        }                                                                                  \
        for (; r < n; r++) {                                                               \
            const T *q = p + r * rs;                                                       \
            RED_SIMD                                                                       \
            for (int64_t t = 0; t < w; t++) {                                              \
                B c = b[t];                                                                \
                int64_t k = bi[t];                                                         \
                STEP(c, k, CV(q[t]), r);                                                   \
                b[t] = c;                                                                  \
                bi[t] = k;                                                                 \
            }                                                                              \
        }                                                                                  \
    }

#define ARGMAX_FLOAT(T, VT, S, LD)                                                         \
    static void argrun_##S(const char *p_, int64_t lo, int64_t hi, int64_t st, acc_t *best,    \
                           int64_t *bi) {                                                  \
        const T *p = (const T *)p_;                                                        \
        if (st == 1) {                                                                     \
            /* max and NaN flag in one vectorized pass, then the first match */            \
            VT m = -INFINITY;                                                              \
            int nan = 0;                                                                   \
            RED_SIMD_RED(reduction(max : m) reduction(| : nan))                            \
            for (int64_t i = lo; i < hi; i++) {                                            \
                VT v = LD(p[i]);                                                           \
                m = v > m ? v : m;                                                         \
                nan |= v != v;                                                             \
            }                                                                              \
            int64_t i = lo;                                                                \
            if (nan)                                                                       \
                while (i < hi - 1 && LD(p[i]) == LD(p[i])) i++;                            \
            else                                                                           \
                while (i < hi - 1 && LD(p[i]) != m) i++;                                   \
            best->f = LD(p[i]);                                                            \
            *bi = i;                                                                       \
            return;                                                                        \
        }                                                                                  \
        VT b = LD(p[lo * st]);                                                             \
        int64_t k = lo;                                                                    \
        if (b == b)                                                                        \
            for (int64_t i = lo + 1; i < hi; i++) {                                        \
                VT v = LD(p[i * st]);                                                      \
                if (v > b) {                                                               \
                    b = v;                                                                 \
                    k = i;                                                                 \
                } else if (v != v) {                                                       \
                    b = v;                                                                 \
                    k = i;                                                                 \
                    break;                                                                 \
                }                                                                          \
            }                                                                              \
        best->f = b;                                                                       \
        *bi = k;                                                                           \
    }                                                                                      \
    ARGVRUN(S, T, VT, LD, ARGSTEP_F)

#define ARGMAX_INT(T, S, CV)                                                               \
    static void argrun_##S(const char *p_, int64_t lo, int64_t hi, int64_t st, acc_t *best,    \
                           int64_t *bi) {                                                  \
        const T *p = (const T *)p_;                                                        \
        if (st == 1) {                                                                     \
            int64_t m = INT64_MIN;                                                         \
            RED_SIMD_RED(reduction(max : m))                                               \
            for (int64_t i = lo; i < hi; i++) {                                            \
                int64_t v = CV(p[i]);                                                      \
                m = v > m ? v : m;                                                         \
            }                                                                              \
            int64_t i = lo;                                                                \
            while (i < hi - 1 && CV(p[i]) != m) i++;                                       \
            best->i = m;                                                                   \
            *bi = i;                                                                       \
            return;                                                                        \
        }                                                                                  \
        int64_t b = CV(p[lo * st]), k = lo;                                                \
        for (int64_t i = lo + 1; i < hi; i++) {                                            \
            int64_t v = CV(p[i * st]);                                                     \
            if (v > b) {                                                                   \
                b = v;                                                                     \
                k = i;                                                                     \
            }                                                                              \
        }                                                                                  \
        best->i = b;                                                                       \
        *bi = k;                                                                           \
    }                                                                                      \
    ARGVRUN(S, T, int64_t, CV, ARGSTEP_I)

ARGMAX_FLOAT(float, float, f32, ID)
ARGMAX_FLOAT(double, double, f64, ID)
ARGMAX_FLOAT(uint16_t, float, f16, em_half_to_float)
ARGMAX_FLOAT(uint16_t, float, bf16, em_bf16_to_float)
ARGMAX_INT(int32_t, i32, CV_INT)
ARGMAX_INT(int64_t, i64, CV_INT)
ARGMAX_INT(uint8_t, b8, CV_BOOL)

typedef struct actx {
    const plan *P;
    const char *base;
    int64_t esz, n, st;
    bool is_float, vertical;
    argrun_fn run;
    argvrun_fn vrun;
    int64_t nch, chunk;   /* horizontal: chunks per output */
    int64_t L, ntile;     /* vertical */
    acc_t *pbest;         /* [nch][nout] partial maxima, or NULL */
    int64_t *pidx;        /* [nch][nout] their indices */
    int64_t *out;
} actx;

static void argmax_items(void *ctx, int64_t b, int64_t e) {
    const actx *A = ctx;
    const plan *P = A->P;
    int64_t o = b / A->nch, c = b % A->nch;
    int64_t idx[EM_MAX_DIMS], off = 0, r = o;
    for (int d = P->no - 1; d >= 0; d--) {
        idx[d] = r % P->osz[d];
        r /= P->osz[d];
        off += idx[d] * P->ost[d];
    }
    for (int64_t it = b; it < e; it++) {
        int64_t lo = c * A->chunk, hi = lo + A->chunk, k;
        if (hi > A->n) hi = A->n;
        acc_t best;
        A->run(A->base + off * A->esz, lo, hi, A->st, &best, &k);
        if (A->pbest) {
            A->pbest[c * P->nout + o] = best;
            A->pidx[c * P->nout + o] = k;
        } else {
            A->out[o] = k;
        }
        if (++c == A->nch) {
            c = 0;
            o++;
            off = next_output(P, idx, off);
        }
    }
}

static void argmax_vitems(void *ctx, int64_t b, int64_t e) {
    const actx *A = ctx;
    const plan *P = A->P;
    for (int64_t g = b; g < e; g++) {
        int64_t row = g / A->ntile, tile = g % A->ntile;
        int64_t off = 0, r = row;
        for (int d = P->no - 2; d >= 0; d--) {
            off += (r % P->osz[d]) * P->ost[d];
            r /= P->osz[d];
        }
        int64_t j0 = tile * RED_VTILE, w = A->L - j0;
        if (w > RED_VTILE) w = RED_VTILE;
        A->vrun(A->base + (off + j0) * A->esz, A->n, A->st, w, A->out + row * A->L + j0);
    }
}

em_status cpu_argmax(const em_op_call *c, em_tensor *out) {
    const em_tensor *x = c->in[0];
    int64_t onumel = 1;
    for (int d = 0; d < out->ndim; d++) onumel *= out->sizes[d];
    if (onumel == 0) return EM_OK;
    actx A = {0};
    switch (x->dtype) {
    case EM_F32: A.run = argrun_f32; A.vrun = argvrun_f32; A.is_float = true; break;
    case EM_F64: A.run = argrun_f64; A.vrun = argvrun_f64; A.is_float = true; break;
    case EM_F16: A.run = argrun_f16; A.vrun = argvrun_f16; A.is_float = true; break;
    case EM_BF16: A.run = argrun_bf16; A.vrun = argvrun_bf16; A.is_float = true; break;
    case EM_I32: A.run = argrun_i32; A.vrun = argvrun_i32; break;
    case EM_I64: A.run = argrun_i64; A.vrun = argvrun_i64; break;
    case EM_BOOL: A.run = argrun_b8; A.vrun = argvrun_b8; break;
    default:
        return em_error(EM_ERR_DTYPE, "argmax: dtype %s is not supported",
                        em_dtype_name(x->dtype));
    }
    if (out->dtype != EM_I64) return em_error(EM_ERR_DTYPE, "argmax: output must be i64");
    int dim = c->attrs->dim;
    bool red[EM_MAX_DIMS] = {false};
    if (x->ndim == 0) {
        A.n = 1;
        A.st = 0;
    } else {
        if (dim < 0 || dim >= x->ndim)
            return em_error(EM_ERR_DIM, "argmax: dim %d out of range for a %d-d tensor", dim,
                            x->ndim);
        red[dim] = true;
        A.n = x->sizes[dim];
        A.st = A.n == 1 ? 0 : x->strides[dim];
    }
    if (A.n == 0) return em_error(EM_ERR_SHAPE, "argmax: reduction over an empty dim");
    plan P;
    make_plan(&P, x, red);
    if (P.nout != onumel)
        return em_error(EM_ERR_SHAPE, "argmax: output has %lld elements, expected %lld",
                        (long long)onumel, (long long)P.nout);
    A.P = &P;
    A.base = em_data(x);
    A.esz = (int64_t)em_dtype_size(x->dtype);
    A.out = (int64_t *)em_data(out);

    int64_t L = P.osz[P.no - 1];
    A.vertical = P.ost[P.no - 1] == 1 && L >= RED_VMIN && A.st != 1 && A.n > 1;
    if (A.vertical) {
        A.L = L;
        A.ntile = (L + RED_VTILE - 1) / RED_VTILE;
        int64_t ngroups = P.nout / L * A.ntile;
        int64_t per = A.n * (L < RED_VTILE ? L : RED_VTILE);
        int64_t grain = EM_PARALLEL_GRAIN / per;
        em_parallel_for(ngroups, grain > 0 ? grain : 1, argmax_vitems, &A);
        return EM_OK;
    }
    /* few outputs with long runs: chunks, combined in order (shape-only rule) */
    if (P.nout < RED_FEW && A.n > RED_CHUNK) {
        A.chunk = RED_CHUNK;
        A.nch = (A.n + RED_CHUNK - 1) / RED_CHUNK;
        size_t np = (size_t)A.nch * (size_t)P.nout;
        A.pbest = em_malloc(np * sizeof(acc_t));
        A.pidx = em_malloc(np * sizeof(int64_t));
        if (!A.pbest || !A.pidx) {
            em_free(A.pbest);
            em_free(A.pidx);
            return em_error(EM_ERR_NOMEM, "argmax: out of memory");
        }
    } else {
        A.chunk = A.n;
        A.nch = 1;
    }
    int64_t per = A.nch > 1 ? A.chunk : A.n;
    int64_t grain = EM_PARALLEL_GRAIN / per;
    em_parallel_for(P.nout * A.nch, grain > 0 ? grain : 1, argmax_items, &A);
    if (A.pbest) {
        for (int64_t o = 0; o < P.nout; o++) {
            acc_t b = A.pbest[o];
            int64_t k = A.pidx[o];
            for (int64_t ch = 1; ch < A.nch; ch++) {
                acc_t v = A.pbest[ch * P.nout + o];
                bool take = A.is_float ? (b.f == b.f && (v.f > b.f || v.f != v.f)) : v.i > b.i;
                if (take) {
                    b = v;
                    k = A.pidx[ch * P.nout + o];
                }
            }
            A.out[o] = k;
        }
        em_free(A.pbest);
        em_free(A.pidx);
    }
    return EM_OK;
}
