/* cpu_attention.c - fused attention on the CPU (the attention op of
 * ops.def): out = softmax(q k^T * scale + mask [causal]) v, f32.
 *
 * FlashAttention's schedule (Dao et al. 2022, "online softmax"): a task is
 * one batch (head) and a block of BQ queries; it walks the keys in blocks
 * of BK, computes the BQ x BK tile of scores with one sgemm, and keeps per
 * query the running max m and sum l of exp(score - m), rescaling the
 * output rows it accumulates (in the result itself) when the max grows.
 * The Tq x Tk scores never exist: only one tile per thread.  A causal task
 * stops at the first key block after its last query.  Tasks are split over
 * Ember's thread pool; the BLAS runs single-threaded inside it, as for
 * matmul (cpu_blas.c).  Exponentials are em_vexpf (vmath.h), which gcc vectorizes.
 *
 * Operands are read in place when their rows are contiguous (a qkv split,
 * heads permuted: only the row stride differs); otherwise each tile is
 * first copied into the piece's scratch. */
#include "cpu.h"
#include "vmath.h"

#include <math.h>
#include <string.h>

/* `omp simd` lifts -O2's cost model (as in cpu_pointwise.c); its
 * reduction may reassociate, which a sum of positive terms tolerates. */
#if defined(_OPENMP) || defined(EM_OPENMP_SIMD)
#define EM_SIMD_SUM_SUM _Pragma("omp simd reduction(+:sum)")
#else
#define EM_SIMD_SUM_SUM
#endif

/* Tile sizes: the scores tile is BQ x BK floats (128 KiB, in L2).  Against
 * 64 x 128 these were ~10% faster at T = 512 and 2048 (fewer, larger sgemm
 * calls, each packing its operands), on the 2-core machine. */
/* The row helpers are inlined into softmax_tile's clones, so that they
 * are built for the clone's instruction set (a call runs them as SSE2). */
#define ALWAYS_INLINE inline __attribute__((always_inline))

#define BQ 128 /* queries per task */
#define BK 256 /* keys per tile */
#define PIECES_PER_THREAD 4 /* tasks cost unequally (causal): smaller pieces balance */

/* One operand as the kernel reads it: batch strides aligned to the
 * result's batch dims (0 where broadcast), row and column strides. */
typedef struct attn_operand {
    const float *data;
    int64_t bst[EM_MAX_DIMS];
    int64_t rs, cs;
} attn_operand;

typedef struct attn_ctx {
    attn_operand q, k, v, mask; /* mask.data NULL: none */
    float *out;                 /* [batch, Tq, Dv], contiguous */
    int nb;                     /* batch dims */
    int64_t bsz[EM_MAX_DIMS];
    int64_t Tq, Tk, D, Dv, nqblk, ntasks, npieces;
    float scale;
    bool causal, blas;
    float *scratch;             /* npieces x piece_floats */
    size_t piece_floats;
} attn_ctx;

/* Aligns t's dims (its last two the matrix) to the result's nb batch dims;
 * dims t lacks or has of size 1 read with stride 0. */
static void operand_of(attn_operand *op, const em_tensor *t, int nb) {
    int nd = t->ndim, tb = nd - 2;
    op->data = (const float *)em_data(t);
    for (int d = 0; d < nb; d++) {
        int td = d - (nb - tb);
        op->bst[d] = td >= 0 && t->sizes[td] != 1 ? t->strides[td] : 0;
    }
    /* a mask may lack the matrix dims or have them of size 1 (broadcast) */
    op->rs = nd >= 2 && t->sizes[nd - 2] != 1 ? t->strides[nd - 2] : 0;
    op->cs = nd >= 1 && t->sizes[nd - 1] != 1 ? t->strides[nd - 1] : 0;
}

static int64_t batch_offset(const attn_ctx *X, const attn_operand *op, int64_t bi) {
    int64_t off = 0;
    for (int d = X->nb - 1; d >= 0; d--) {
        off += (bi % X->bsz[d]) * op->bst[d];
        bi /= X->bsz[d];
    }
    return off;
}

/* Rows [r0, r0 + n) of a [.., cols] matrix at base: in place when its rows
 * are contiguous (*ld its row stride), else copied into buf (*ld cols). */
static const float *rows_of(const float *base, const attn_operand *op, int64_t r0, int64_t n,
                            int64_t cols, float *buf, int64_t *ld) {
    if ((op->cs == 1 || cols <= 1) && (n <= 1 || (op->rs >= cols && op->rs <= INT32_MAX)) &&
        cols >= 1) {
        *ld = n <= 1 ? cols : op->rs;
        return base + r0 * op->rs;
    }
    for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < cols; c++) buf[r * cols + c] = base[(r0 + r) * op->rs + c * op->cs];
    *ld = cols > 0 ? cols : 1;
    return buf;
}

/* s[m x n] = scale * qt[m x D] @ kt[n x D]^T. */
static void scores_tile(const attn_ctx *X, int64_t m, int64_t n, const float *qt, int64_t ldq,
                        const float *kt, int64_t ldk, float *s) {
    if (X->D == 0) {
        memset(s, 0, sizeof(float) * (size_t)(m * BK));
        return;
    }
    if (X->blas) {
        em_sgemm(false, true, (int)m, (int)n, (int)X->D, X->scale, qt, (int)ldq, kt, (int)ldk, 0.0f, s, BK);
        return;
    }
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float acc = 0;
            for (int64_t d = 0; d < X->D; d++) acc += qt[i * ldq + d] * kt[j * ldk + d];
            s[i * BK + j] = acc * X->scale;
        }
}

/* o[m x Dv] += p[m x n] @ vt[n x Dv]. */
static void accumulate_tile(const attn_ctx *X, int64_t m, int64_t n, const float *p,
                            const float *vt, int64_t ldv, float *o) {
    if (X->blas) {
        em_sgemm(false, false, (int)m, (int)X->Dv, (int)n, 1.0f, p, BK, vt, (int)ldv, 1.0f, o, (int)X->Dv);
        return;
    }
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            float pij = p[i * BK + j];
            for (int64_t d = 0; d < X->Dv; d++) o[i * X->Dv + d] += pij * vt[j * ldv + d];
        }
}

/* Adds the mask and drops the causal keys of row i (n keys from j0). */
ALWAYS_INLINE static void mask_row(const attn_ctx *X, const float *mrow, int64_t i, int64_t j0, int64_t n,
                     float *s) {
    if (mrow) EM_SIMD for (int64_t c = 0; c < n; c++) s[c] += mrow[(j0 + c) * X->mask.cs];
    if (X->causal)
        for (int64_t c = i - j0 + 1 < 0 ? 0 : i - j0 + 1; c < n; c++) s[c] = -INFINITY;
}

/* The online softmax step of one row: s becomes exp(s - m') for the new
 * max m', and the row's sum and output are rescaled to m'. */
/* The max of s[0..n): 16 running maxima, which gcc keeps in vector
 * registers (a `reduction(max)` loop kept its one accumulator in memory:
 * a quarter of the kernel's own time at T = 2048). */
ALWAYS_INLINE static float row_max(const float *s, int64_t n) {
    float part[16], mx = -INFINITY;
    for (int u = 0; u < 16; u++) part[u] = -INFINITY;
    int64_t c = 0;
    for (; c + 16 <= n; c += 16)
        for (int u = 0; u < 16; u++) part[u] = s[c + u] > part[u] ? s[c + u] : part[u];
    for (; c < n; c++) mx = s[c] > mx ? s[c] : mx;
    for (int u = 0; u < 16; u++) mx = part[u] > mx ? part[u] : mx;
    return mx;
}

/* n rounded up to whole vectors of 16 floats (never past the tile's BK
 * columns): the columns past n are set to -inf, whose exponentials are 0,
 * so the exp and sum loops run no scalar tail.  A scalar tail was half of
 * the kernel's time at T = 24 (MiniLM's sentences): 8 of every 24 keys. */
ALWAYS_INLINE static int64_t pad_row(float *s, int64_t n) {
    int64_t n16 = (n + 15) & ~(int64_t)15;
    if (n16 > BK) n16 = BK;
    for (int64_t c = n; c < n16; c++) s[c] = -INFINITY;
    return n16;
}

ALWAYS_INLINE static void softmax_row(const attn_ctx *X, float *s, int64_t n, float *m, float *l, float *o) {
    n = pad_row(s, n);
    float mx = row_max(s, n);
    float mnew = mx > *m ? mx : *m;
    if (mnew == -INFINITY) { /* every key so far dropped: nothing to add */
        memset(s, 0, sizeof(float) * (size_t)n);
        return;
    }
    float sum = 0;
    EM_SIMD_SUM_SUM for (int64_t c = 0; c < n; c++) {
        s[c] = em_vexpf(s[c] - mnew);
        sum += s[c];
    }
    float alpha = em_vexpf(*m - mnew); /* exp(-inf) = 0 on the first keys */
    if (alpha != 1.0f) EM_SIMD for (int64_t d = 0; d < X->Dv; d++) o[d] *= alpha;
    *l = *l * alpha + sum;
    *m = mnew;
}

/* out rows = o / l; a row with no key left is NaN (0/0, as the
 * decomposition gives), and with no keys at all 0 (an empty matmul). */
static void finish_rows(const attn_ctx *X, int64_t m, const float *mx, const float *l, float *o) {
    for (int64_t r = 0; r < m; r++) {
        float *row = o + r * X->Dv;
        float f = X->Tk == 0 ? 0.0f : mx[r] == -INFINITY ? NAN : 1.0f / l[r];
        for (int64_t d = 0; d < X->Dv; d++) row[d] = X->Tk == 0 ? 0.0f : row[d] * f;
    }
}

/* Masks rows [0, m) of the scores tile s (queries from i0, n keys from
 * j0) and takes their online softmax step.  Built for AVX2 and AVX-512
 * too (EM_VMATH_CLONES): its exponentials are half of the kernel's own
 * time. */
EM_VMATH_CLONES static void softmax_tile(const attn_ctx *X, const float *mb, int64_t i0, int64_t j0,
                                         int64_t m, int64_t n, float *s, float *mx, float *l,
                                         float *o) {
    for (int64_t r = 0; r < m; r++) {
        const float *mrow = mb ? mb + (i0 + r) * X->mask.rs : NULL;
        mask_row(X, mrow, i0 + r, j0, n, s + r * BK);
        softmax_row(X, s + r * BK, n, &mx[r], &l[r], o + r * X->Dv);
    }
}

/* Whether the mask drops every key of the tile (queries from i0, n keys
 * from j0): a padding mask's padded keys, whose tile then costs nothing.
 * Skipping it changes no finite result (its weights are exp(-inf) = 0);
 * only a NaN or inf score in such a tile would have shown. */
static bool tile_dropped(const attn_ctx *X, const float *mb, int64_t i0, int64_t j0, int64_t m,
                         int64_t n) {
    if (!mb) return false;
    int64_t rows = X->mask.rs == 0 ? 1 : m; /* a per-key mask: one row says it */
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < n; c++)
            if (mb[(i0 + r) * X->mask.rs + (j0 + c) * X->mask.cs] != -INFINITY) return false;
    return true;
}

/* Task t: batch t / nqblk, queries of block t % nqblk. */
static void run_task(const attn_ctx *X, int64_t t, float *scratch) {
    int64_t bi = t / X->nqblk, i0 = (t % X->nqblk) * BQ;
    int64_t m = X->Tq - i0 < BQ ? X->Tq - i0 : BQ;
    float *qbuf = scratch, *kbuf = qbuf + BQ * X->D, *vbuf = kbuf + BK * X->D;
    float *s = vbuf + BK * X->Dv, *mx = s + BQ * BK, *l = mx + BQ;
    const float *qb = X->q.data + batch_offset(X, &X->q, bi);
    const float *kb = X->k.data + batch_offset(X, &X->k, bi);
    const float *vb = X->v.data + batch_offset(X, &X->v, bi);
    const float *mb = X->mask.data ? X->mask.data + batch_offset(X, &X->mask, bi) : NULL;
    float *o = X->out + (bi * X->Tq + i0) * X->Dv;
    memset(o, 0, sizeof(float) * (size_t)(m * X->Dv));
    for (int64_t r = 0; r < m; r++) {
        mx[r] = -INFINITY;
        l[r] = 0;
    }
    int64_t ldq, ldk, ldv;
    const float *qt = rows_of(qb, &X->q, i0, m, X->D, qbuf, &ldq);
    int64_t kend = X->causal && i0 + m < X->Tk ? i0 + m : X->Tk; /* later keys: all dropped */
    for (int64_t j0 = 0; j0 < kend; j0 += BK) {
        int64_t n = kend - j0 < BK ? kend - j0 : BK;
        if (tile_dropped(X, mb, i0, j0, m, n)) continue;
        const float *kt = rows_of(kb, &X->k, j0, n, X->D, kbuf, &ldk);
        scores_tile(X, m, n, qt, ldq, kt, ldk, s);
        softmax_tile(X, mb, i0, j0, m, n, s, mx, l, o);
        const float *vt = rows_of(vb, &X->v, j0, n, X->Dv, vbuf, &ldv);
        accumulate_tile(X, m, n, s, vt, ldv, o);
    }
    finish_rows(X, m, mx, l, o);
}

/* Pieces [b, e): piece p runs tasks [p * ntasks / npieces, (p+1) * ...)
 * with its own scratch. */
static void run_pieces(void *ctx, int64_t b, int64_t e) {
    const attn_ctx *X = ctx;
    for (int64_t p = b; p < e; p++) {
        float *scratch = X->scratch + (size_t)p * X->piece_floats;
        for (int64_t t = p * X->ntasks / X->npieces; t < (p + 1) * X->ntasks / X->npieces; t++)
            run_task(X, t, scratch);
    }
}

/* How many pieces to split ntasks into: one below ~1M multiply-adds
 * (a thread's start costs more), else a few per thread. */
static int64_t piece_count(const attn_ctx *X) {
    double work = (double)X->ntasks * BQ * (double)X->Tk * (double)(X->D + X->Dv);
    int64_t n = work < 1e6 ? 1 : (int64_t)em_num_threads() * PIECES_PER_THREAD;
    return n < X->ntasks ? n : X->ntasks;
}

em_status cpu_attention(const em_op_call *c, em_tensor *out) {
    const em_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2];
    if (out->dtype != EM_F32) /* half: the CUDA kernel's; on the CPU the pass leaves it unfused */
        return em_error(EM_ERR_UNSUPPORTED, "attention on the CPU: %s operands (f32 only)",
                        em_dtype_name(out->dtype));
    attn_ctx X = {0};
    X.nb = out->ndim - 2;
    for (int d = 0; d < X.nb; d++) X.bsz[d] = out->sizes[d];
    X.Tq = q->sizes[q->ndim - 2];
    X.Tk = k->sizes[k->ndim - 2];
    X.D = q->sizes[q->ndim - 1];
    X.Dv = v->sizes[v->ndim - 1];
    X.scale = (float)c->attrs->value;
    X.causal = c->attrs->causal;
    int64_t nbatch = em_shape_numel(X.nb, X.bsz);
    if (nbatch == 0 || X.Tq == 0 || X.Dv == 0) return EM_OK;
    X.blas = X.D <= INT32_MAX && X.Dv <= INT32_MAX && em_blas_ready(EM_F32);
    operand_of(&X.q, q, X.nb);
    operand_of(&X.k, k, X.nb);
    operand_of(&X.v, v, X.nb);
    if (c->nin == 4) operand_of(&X.mask, c->in[3], X.nb);
    X.out = (float *)em_data(out);
    X.nqblk = (X.Tq + BQ - 1) / BQ;
    X.ntasks = nbatch * X.nqblk;
    X.npieces = piece_count(&X);
    X.piece_floats = (size_t)(BQ * X.D + BK * X.D + BK * X.Dv + BQ * BK + 2 * BQ + 16) & ~(size_t)15;
    X.scratch = em_malloc(sizeof(float) * X.piece_floats * (size_t)X.npieces);
    if (!X.scratch) return em_error(EM_ERR_NOMEM, "attention: out of memory for %lld tiles",
                                    (long long)X.npieces);
    em_parallel_for(X.npieces, 1, run_pieces, &X);
    em_free(X.scratch);
    return EM_OK;
}
