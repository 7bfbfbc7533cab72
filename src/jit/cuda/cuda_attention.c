/* cuda_attention.c - fused attention on CUDA (the attention op of ops.def:
 * out = softmax(q k^T * scale + mask [causal]) v, f32, f16 or bf16), as one generated
 * kernel compiled through NVRTC (cuda_source.h): FlashAttention's schedule
 * (Dao et al. 2022), so the Tq x Tk scores never reach global memory.
 *
 * A block of NT threads takes one batch (head) and BQ queries.  It keeps
 * its q tile in shared memory (transposed, pre-scaled by scale * log2 e so
 * that the softmax runs on exp2) and walks the keys in tiles of BK:
 *  - the BQ x BK scores tile, each thread a 4 x 8 piece of it in registers
 *    (4 queries, 8 keys), from the k tile in shared memory: three 16-byte
 *    shared loads per 32 multiply-adds;
 *  - the mask added, causal and out-of-range keys dropped, and the online
 *    softmax step (running max and sum per query, kept by the 8 threads of
 *    a query row and combined with warp shuffles);
 *  - the probabilities through shared memory, and out += p v with each
 *    thread holding 4 queries x DVP/8 output columns in registers; the v
 *    tile reuses the k tile's space.
 * A causal block stops at its last query's key tile, and blocks run the
 * longest query blocks first (causal work grows with the query index).
 * f32 on CUDA cores: TF32 stays off for f32 (docs/cuda.md), as for matmul.
 * On sm_80 on the tiled kernel runs on tensor cores instead
 * (attention_mma, below: 3xTF32 for f32; for f16 and bf16 operands
 * attention_fa2, FlashAttention-2's schedule with m16n8k16 and f32
 * accumulation, the only kernel half operands take); at most 8 queries
 * take the decode kernel (f32).
 *
 * The text is specialized on the operand dtype, the head sizes, causal,
 * the mask and the number of batch dims (so each has its own cache key);
 * strides and lengths are arguments, so one kernel
 * serves every sequence length and layout (q, k, v and the mask read
 * through their strides: a qkv split or heads permuted need no copy).
 * Head sizes past MAX_D / MAX_DV (registers, shared memory), and half
 * operands before sm_80, are EM_ERR_UNSUPPORTED: the caller then runs the
 * CPU kernel on a copy (f32 only: a half one fails there; the attention
 * pass asks cuda_attention_takes before it makes a half node). */
#include "cuda_eager.h"

#ifdef EMBER_HAVE_CUDA

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_source.h"

enum { MAX_D = 256, MAX_DV = 128 };

/* The kernel's arguments after the pointers, as the text declares them
 * (struct attn_args): batch sizes and per-operand batch strides aligned
 * to the result's batch dims (0 where broadcast), row and column strides. */
typedef struct attn_args {
    long long bsz[EM_MAX_DIMS];
    long long qb[EM_MAX_DIMS], kb[EM_MAX_DIMS], vb[EM_MAX_DIMS], mb[EM_MAX_DIMS];
    long long qr, qc, kr, kc, vr, vc, mr, mc;
    long long Tq, Tk, nqblk, nbatch;
    long long nsplit, chunk; /* the decode kernel: key chunks a query row, keys a chunk */
    float scale; /* scale * log2(e) */
    int vec;     /* bit 0, 1, 2: q, k, v read as 16-byte vectors; 3: a half mask's pairs as 4 bytes */
} attn_args;

/* The kernel body; the generator puts the defines in front of it (D, DV:
 * head sizes; D4, DVP: D rounded up to 4, DV to 32, the zero-padded tile
 * widths; QP: the q and k tiles' row pitch; RM x CN: each thread's piece
 * of the scores; CAUSAL, MASK, NB).  Tiles are row-major in shared memory
 * and read as 16-byte vectors: a thread's keys are tx + 8c, so the 8
 * threads of a row group read 8 different rows, which the pitch (4 mod 8
 * floats) puts in 8 different bank groups; its queries are shared by the
 * 8 (one broadcast read). */
static const char attention_prelude[] =
    "#define LOG2E 1.4426950408889634f\n#define INFINITY __int_as_float(0x7f800000)\n"
    "struct attn_args {\n"
    "  long long bsz[8], qb[8], kb[8], vb[8], mb[8];\n"
    "  long long qr, qc, kr, kc, vr, vc, mr, mc;\n"
    "  long long Tq, Tk, nqblk, nbatch;\n"
    "  long long nsplit, chunk;\n"
    "  float scale;\n"
    "  int vec;\n"
    "};\n"
    "/* x times mul: f32 elements scaled (the q tile), half ones moved as\n"
    " * they are (their kernel scales the scores instead) */\n"
    "__device__ __forceinline__ float scaled(float x, float mul) { return x * mul; }\n"
    "__device__ __forceinline__ unsigned short scaled(unsigned short x, float) { return x; }\n"
    "__device__ __forceinline__ uint4 scaled(uint4 x, float mul, const float *) {\n"
    "  return make_uint4(__float_as_uint(__uint_as_float(x.x) * mul), __float_as_uint(__uint_as_float(x.y) * mul),\n"
    "                    __float_as_uint(__uint_as_float(x.z) * mul), __float_as_uint(__uint_as_float(x.w) * mul));\n"
    "}\n"
    "__device__ __forceinline__ uint4 scaled(uint4 x, float, const unsigned short *) { return x; }\n"
    "/* dst[r][c] = src row r0 + r, column c, times mul, for ROWS x COLSV\n"
    " * elements E (zero past nrows or COLS); vec: 16-byte loads (unit column\n"
    " * stride, rows and base 16-byte aligned, COLS a multiple of a vector's\n"
    " * 16 / sizeof(E) elements). */\n"
    "template <int ROWS, int COLS, int COLSV, int PITCH, typename E>\n"
    "__device__ __forceinline__ void load_tile(E *dst, const E *__restrict__ src,\n"
    "    long long r0, long long nrows, long long rs, long long cs, float mul, bool vec) {\n"
    "  const int W = 16 / sizeof(E);\n"
    "  if (vec) {\n"
    "    for (int e = threadIdx.x; e < ROWS * (COLSV / W); e += NT) {\n"
    "      int r = e / (COLSV / W), c = e % (COLSV / W) * W;\n"
    "      uint4 x = make_uint4(0u, 0u, 0u, 0u);\n"
    "      if (r0 + r < nrows && c < COLS) x = scaled(*(const uint4 *)(src + (r0 + r) * rs + c), mul, src);\n"
    "      *(uint4 *)&dst[r * PITCH + c] = x;\n"
    "    }\n"
    "  } else {\n"
    "    for (int e = threadIdx.x; e < ROWS * COLSV; e += NT) {\n"
    "      int r = e / COLSV, c = e % COLSV;\n"
    "      dst[r * PITCH + c] = r0 + r < nrows && c < COLS ? scaled(src[(r0 + r) * rs + c * cs], mul) : (E)0;\n"
    "    }\n"
    "  }\n"
    "}\n"
    "__device__ __forceinline__ float lane4(float4 v, int i) {\n"
    "  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;\n"
    "}\n"
    "/* The offsets of batch b in q, k, v and the mask. */\n"
    "__device__ __forceinline__ void batch_offsets(const attn_args &a, long long b,\n"
    "    long long *qo, long long *ko, long long *vo, long long *mo) {\n"
    "  long long rem = b;\n"
    "  *qo = *ko = *vo = *mo = 0;\n"
    "  for (int d = NB - 1; d >= 0; d--) {\n"
    "    long long c = rem % a.bsz[d];\n"
    "    rem /= a.bsz[d];\n"
    "    *qo += c * a.qb[d], *ko += c * a.kb[d], *vo += c * a.vb[d], *mo += c * a.mb[d];\n"
    "  }\n"
    "}\n"
    "/* This block's batch b and first query i0 (the longest query blocks\n"
    " * first: causal work grows with the query), and its batch's offsets. */\n"
    "__device__ __forceinline__ void block_of(const attn_args &a, long long *b, long long *i0,\n"
    "    long long *qo, long long *ko, long long *vo, long long *mo) {\n"
    "  const long long bid = blockIdx.x;\n"
    "  *b = bid % a.nbatch;\n"
    "  *i0 = (a.nqblk - 1 - bid / a.nbatch) * BQ;\n"
    "  batch_offsets(a, *b, qo, ko, vo, mo);\n"
    "}\n";

/* The decode kernel: few queries (a decoder's step has one a head), where
 * the tiled kernels' 64-query tiles would be mostly empty and their one
 * block a head would walk every key alone (13 us a layer for GPT-2 at
 * context 128 on the H200, docs/benchmarks.md, issue 20).  Block (row,
 * split) of DNT threads takes one query row and chunk `split` of the keys
 * (FlashDecoding's split over keys, Dao et al. 2023), in sub-tiles of
 * SUB keys: four threads a key's score (q in shared memory, the key's row
 * in registers, read as 16-byte vectors where it can be), the sub-tile's
 * v rows in shared memory, all of a sub-tile's loads in flight before
 * any is used (the kernel is a few microseconds: latency bounds it); the
 * online softmax with block reductions; p v with a thread an output
 * column (DNT / DVP groups of threads taking every G-th key, added in
 * order).  With one chunk the
 * block writes the row; with several, each writes (m, l, o) to part and
 * the row's last block (an arrival counter, cuda_device.sems) merges them
 * in chunk order: no second launch, the same result on every run. */
static const char attention_decode[] =
    "#define DNT 128\n"
    "#define SUB 32 /* keys a sub-tile: 4 threads a key */\n"
    "#define NKV ((D4 + 15) / 16)\n"
    "#define G (DNT / DVP)\n"
    "__device__ __forceinline__ float block_max(float x, float *red) {\n"
    "  for (int o = 16; o; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));\n"
    "  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;\n"
    "  __syncthreads();\n"
    "  return fmaxf(fmaxf(red[0], red[1]), fmaxf(red[2], red[3]));\n"
    "}\n"
    "__device__ __forceinline__ float block_sum(float x, float *red) {\n"
    "  for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);\n"
    "  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;\n"
    "  __syncthreads();\n"
    "  return (red[0] + red[1]) + (red[2] + red[3]);\n"
    "}\n"
    "/* part: [rows, nsplit, DV + 2] (o, then m and l); sem: a counter a row */\n"
    "extern \"C\" __global__ void __launch_bounds__(DNT) k(const float *__restrict__ q,\n"
    "    const float *__restrict__ kk, const float *__restrict__ v,\n"
    "    const float *__restrict__ mask, float *__restrict__ out, attn_args a,\n"
    "    float *part, unsigned *sem) {\n"
    "  EM_AFTER_PRIOR();\n"
    "  __shared__ __align__(16) float qs[D4];\n"
    "  __shared__ __align__(16) float vs[SUB][DVP];\n"
    "  __shared__ float ps[SUB], redm[4], reds[4], os[G][DVP];\n"
    "  __shared__ bool last;\n"
    "  const int tid = threadIdx.x, c = tid % DVP, grp = tid / DVP, kq = tid >> 2, pt = tid & 3;\n"
    "  const long long row = blockIdx.x / a.nsplit, sp = blockIdx.x % a.nsplit;\n"
    "  const long long b = row / a.Tq, i = row % a.Tq;\n"
    "  long long qo, ko, vo, mo;\n"
    "  batch_offsets(a, b, &qo, &ko, &vo, &mo);\n"
    "  for (int d = tid; d < D4; d += DNT) qs[d] = d < D ? q[qo + i * a.qr + d * a.qc] * a.scale : 0.f;\n"
    "  long long kend = a.Tk;\n"
    "  if (CAUSAL && i + 1 < kend) kend = i + 1;\n"
    "  const long long j0 = sp * a.chunk, j1 = j0 + a.chunk < kend ? j0 + a.chunk : kend;\n"
    "  float m = -INFINITY, l = 0.f, o = 0.f;\n"
    "  for (long long t0 = j0; t0 < j1; t0 += SUB) {\n"
    "    const int nk = j1 - t0 < SUB ? (int)(j1 - t0) : SUB;\n"
    "    /* every load of the sub-tile issued before any is used: 4 threads\n"
    "       a key hold its row's pieces 4 (pt + 4 n) in registers, and the\n"
    "       block copies the sub-tile's v rows to shared memory */\n"
    "    const float *kr = kk + ko + (t0 + kq) * a.kr;\n"
    "    float4 kv[NKV];\n"
    "#pragma unroll\n"
    "    for (int n = 0; n < NKV; n++) {\n"
    "      const int d = 4 * (pt + 4 * n);\n"
    "      float4 x = make_float4(0.f, 0.f, 0.f, 0.f);\n"
    "      if (kq < nk && d < D4) {\n"
    "        if (a.vec & 2) x = __ldg((const float4 *)(kr + d));\n"
    "        else {\n"
    "          x.x = kr[d * a.kc];\n"
    "          if (d + 1 < D) x.y = kr[(d + 1) * a.kc];\n"
    "          if (d + 2 < D) x.z = kr[(d + 2) * a.kc];\n"
    "          if (d + 3 < D) x.w = kr[(d + 3) * a.kc];\n"
    "        }\n"
    "      }\n"
    "      kv[n] = x;\n"
    "    }\n"
    "    if (a.vec & 4)\n"
    "      for (int e = tid; e < nk * (DV / 4); e += DNT) {\n"
    "        const int r = e / (DV / 4), c4 = e % (DV / 4) * 4;\n"
    "        *(float4 *)&vs[r][c4] = __ldg((const float4 *)(v + vo + (t0 + r) * a.vr + c4));\n"
    "      }\n"
    "    else\n"
    "      for (int e = tid; e < nk * DV; e += DNT) {\n"
    "        const int r = e / DV, cc = e % DV;\n"
    "        vs[r][cc] = v[vo + (t0 + r) * a.vr + cc * a.vc];\n"
    "      }\n"
    "    __syncthreads(); /* qs (the first time) and vs */\n"
    "    float acc = 0.f;\n"
    "#pragma unroll\n"
    "    for (int n = 0; n < NKV; n++) {\n"
    "      const int d = 4 * (pt + 4 * n);\n"
    "      if (d < D4) {\n"
    "        const float4 y = *(const float4 *)&qs[d];\n"
    "        acc = fmaf(kv[n].x, y.x, acc), acc = fmaf(kv[n].y, y.y, acc);\n"
    "        acc = fmaf(kv[n].z, y.z, acc), acc = fmaf(kv[n].w, y.w, acc);\n"
    "      }\n"
    "    }\n"
    "    acc += __shfl_xor_sync(0xffffffffu, acc, 1);\n"
    "    acc += __shfl_xor_sync(0xffffffffu, acc, 2);\n"
    "    float s = -INFINITY;\n"
    "    if (kq < nk) {\n"
    "      s = acc;\n"
    "      if (MASK) s += mask[mo + i * a.mr + (t0 + kq) * a.mc] * LOG2E;\n"
    "    }\n"
    "    const float mnew = fmaxf(m, block_max(s, redm));\n"
    "    const float p = mnew == -INFINITY ? 0.f : exp2f(s - mnew);\n"
    "    const float alpha = mnew == -INFINITY ? 1.f : exp2f(m - mnew);\n"
    "    if (pt == 0) ps[kq] = p;\n"
    "    /* each key once (its first thread); the barrier also publishes ps */\n"
    "    l = l * alpha + block_sum(pt == 0 ? p : 0.f, reds);\n"
    "    m = mnew;\n"
    "    o *= alpha;\n"
    "    if (c < DV)\n"
    "#pragma unroll 4\n"
    "      for (int jj = grp; jj < nk; jj += G) o = fmaf(ps[jj], vs[jj][c], o);\n"
    "    __syncthreads(); /* ps, vs, redm and reds are rewritten next */\n"
    "  }\n"
    "  __syncthreads(); /* no sub-tile (an empty chunk): qs and os */\n"
    "  os[grp][c] = o;\n"
    "  __syncthreads();\n"
    "  if (grp == 0) {\n"
    "    o = os[0][c];\n"
    "    for (int g2 = 1; g2 < G; g2++) o += os[g2][c];\n"
    "  }\n"
    "  if (a.nsplit == 1) {\n"
    "    if (grp == 0 && c < DV)\n"
    "      out[row * DV + c] = a.Tk == 0 ? 0.f : m == -INFINITY ? __int_as_float(0x7fc00000) : o / l;\n"
    "    return;\n"
    "  }\n"
    "  float *mine = part + (row * a.nsplit + sp) * (DV + 2);\n"
    "  if (grp == 0 && c < DV) mine[c] = o;\n"
    "  if (tid == 0) mine[DV] = m, mine[DV + 1] = l;\n"
    "  /* the partial is out before the arrival is counted */\n"
    "  __threadfence();\n"
    "  __syncthreads();\n"
    "  if (tid == 0) last = atomicAdd(sem + row, 1u) == (unsigned)a.nsplit - 1;\n"
    "  __syncthreads();\n"
    "  if (!last) return;\n"
    "  __threadfence();\n"
    "  /* the chunks merged in order: their maxima to the row's, then the\n"
    "     rescaled sums (L2 reads: other blocks wrote them) */\n"
    "  const float *all = part + row * a.nsplit * (DV + 2);\n"
    "  float M = -INFINITY;\n"
    "  for (long long t = 0; t < a.nsplit; t++) M = fmaxf(M, __ldcg(all + t * (DV + 2) + DV));\n"
    "  if (grp == 0 && c < DV) {\n"
    "    float L = 0.f, O = 0.f;\n"
    "    if (M != -INFINITY)\n"
    "      for (long long t = 0; t < a.nsplit; t++) {\n"
    "        const float *pt = all + t * (DV + 2);\n"
    "        const float mt = __ldcg(pt + DV);\n"
    "        if (mt == -INFINITY) continue;\n"
    "        const float f = exp2f(mt - M);\n"
    "        L = fmaf(__ldcg(pt + DV + 1), f, L), O = fmaf(__ldcg(pt + c), f, O);\n"
    "      }\n"
    "    out[row * DV + c] = M == -INFINITY ? __int_as_float(0x7fc00000) : O / L;\n"
    "  }\n"
    "  if (tid == 0) sem[row] = 0; /* for the next kernel that counts */\n"
    "}\n";

static const char attention_simt[] =
    "extern \"C\" __global__ void __launch_bounds__(NT, 1) k(const float *__restrict__ q,\n"
    "    const float *__restrict__ kk, const float *__restrict__ v,\n"
    "    const float *__restrict__ mask, float *__restrict__ out, attn_args a) {\n"
    "  EM_AFTER_PRIOR();\n"
    "  extern __shared__ float4 smem4[];\n"
    "  float *Qs = (float *)smem4, *Ks = Qs + BQ * QP, *Vs = Ks + BK * QP, *Ps = Vs + BK * DVP;\n"
    "  const int tid = threadIdx.x, tx = tid & 7, ty = tid >> 3;\n"
    "  long long b, i0, qo, ko, vo, mo;\n"
    "  block_of(a, &b, &i0, &qo, &ko, &vo, &mo);\n"
    "  load_tile<BQ, D, D4, QP>(Qs, q + qo, i0, a.Tq, a.qr, a.qc, a.scale, a.vec & 1);\n"
    "  float o[RM][DVP / 8], m[RM], l[RM];\n"
    "#pragma unroll\n"
    "  for (int r = 0; r < RM; r++) {\n"
    "    m[r] = -INFINITY, l[r] = 0.f;\n"
    "#pragma unroll\n"
    "    for (int c = 0; c < DVP / 8; c++) o[r][c] = 0.f;\n"
    "  }\n"
    "  long long kend = a.Tk;\n"
    "  if (CAUSAL && i0 + BQ < kend) kend = i0 + BQ;\n"
    "  for (long long j0 = 0; j0 < kend; j0 += BK) {\n"
    "    if (MASK) {\n"
    "      /* a tile the mask drops for every query costs nothing (padding\n"
    "       * keys, an additive causal mask's upper tiles) */\n"
    "      bool live = false;\n"
    "#pragma unroll\n"
    "      for (int r = 0; r < RM; r++)\n"
    "#pragma unroll\n"
    "        for (int c = 0; c < CN; c++) {\n"
    "          long long i = i0 + ty * RM + r, j = j0 + tx + 8 * c;\n"
    "          if (i < a.Tq && j < a.Tk && !(CAUSAL && j > i))\n"
    "            live |= mask[mo + i * a.mr + j * a.mc] != -INFINITY;\n"
    "        }\n"
    "      if (!__syncthreads_or(live)) continue;\n"
    "    } else {\n"
    "      __syncthreads();\n"
    "    }\n"
    "    load_tile<BK, D, D4, QP>(Ks, kk + ko, j0, a.Tk, a.kr, a.kc, 1.f, a.vec & 2);\n"
    "    load_tile<BK, DV, DVP, DVP>(Vs, v + vo, j0, a.Tk, a.vr, a.vc, 1.f, a.vec & 4);\n"
    "    __syncthreads();\n"
    "    float s[RM][CN];\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < RM; r++)\n"
    "#pragma unroll\n"
    "      for (int c = 0; c < CN; c++) s[r][c] = 0.f;\n"
    "#pragma unroll 1\n"
    "    for (int d = 0; d < D4; d += 4) {\n"
    "      float4 kv[CN];\n"
    "#pragma unroll\n"
    "      for (int c = 0; c < CN; c++) kv[c] = *(const float4 *)&Ks[(tx + 8 * c) * QP + d];\n"
    "#pragma unroll\n"
    "      for (int r = 0; r < RM; r++) {\n"
    "        float4 qv = *(const float4 *)&Qs[(ty * RM + r) * QP + d];\n"
    "#pragma unroll\n"
    "        for (int c = 0; c < CN; c++) {\n"
    "          s[r][c] = fmaf(qv.x, kv[c].x, s[r][c]);\n"
    "          s[r][c] = fmaf(qv.y, kv[c].y, s[r][c]);\n"
    "          s[r][c] = fmaf(qv.z, kv[c].z, s[r][c]);\n"
    "          s[r][c] = fmaf(qv.w, kv[c].w, s[r][c]);\n"
    "        }\n"
    "      }\n"
    "    }\n"
    "#pragma unroll\n"
    "    for (int r = 0; r < RM; r++) {\n"
    "      long long i = i0 + ty * RM + r;\n"
    "      float mx = -INFINITY;\n"
    "#pragma unroll\n"
    "      for (int c = 0; c < CN; c++) {\n"
    "        long long j = j0 + tx + 8 * c;\n"
    "        if (j >= a.Tk || (CAUSAL && j > i)) s[r][c] = -INFINITY;\n"
    "        else if (MASK && i < a.Tq) s[r][c] += mask[mo + i * a.mr + j * a.mc] * LOG2E;\n"
    "        mx = fmaxf(mx, s[r][c]);\n"
    "      }\n"
    "      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));\n"
    "      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));\n"
    "      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));\n"
    "      float mnew = fmaxf(m[r], mx), alpha = 1.f, sum = 0.f;\n"
    "      if (mnew == -INFINITY) {\n"
    "#pragma unroll\n"
    "        for (int c = 0; c < CN; c++) s[r][c] = 0.f;\n"
    "      } else {\n"
    "        alpha = exp2f(m[r] - mnew);\n"
    "#pragma unroll\n"
    "        for (int c = 0; c < CN; c++) {\n"
    "          s[r][c] = exp2f(s[r][c] - mnew);\n"
    "          sum += s[r][c];\n"
    "        }\n"
    "      }\n"
    "      sum += __shfl_xor_sync(0xffffffffu, sum, 1);\n"
    "      sum += __shfl_xor_sync(0xffffffffu, sum, 2);\n"
    "      sum += __shfl_xor_sync(0xffffffffu, sum, 4);\n"
    "      l[r] = l[r] * alpha + sum;\n"
    "      m[r] = mnew;\n"
    "#pragma unroll\n"
    "      for (int c = 0; c < DVP / 8; c++) o[r][c] *= alpha;\n"
    "#pragma unroll\n"
    "      for (int c = 0; c < CN; c++) Ps[(ty * RM + r) * PP + tx + 8 * c] = s[r][c];\n"
    "    }\n"
    "    __syncthreads();\n"
    "#pragma unroll 1\n"
    "    for (int j = 0; j < BK; j += 4) {\n"
    "      float4 pr[RM];\n"
    "#pragma unroll\n"
    "      for (int r = 0; r < RM; r++) pr[r] = *(const float4 *)&Ps[(ty * RM + r) * PP + j];\n"
    "#pragma unroll\n"
    "      for (int jj = 0; jj < 4; jj++)\n"
    "#pragma unroll\n"
    "        for (int g = 0; g < DVP / 32; g++) {\n"
    "          float4 vv = *(const float4 *)&Vs[(j + jj) * DVP + g * 32 + tx * 4];\n"
    "#pragma unroll\n"
    "          for (int r = 0; r < RM; r++) {\n"
    "            float p = lane4(pr[r], jj);\n"
    "            o[r][g * 4 + 0] = fmaf(p, vv.x, o[r][g * 4 + 0]);\n"
    "            o[r][g * 4 + 1] = fmaf(p, vv.y, o[r][g * 4 + 1]);\n"
    "            o[r][g * 4 + 2] = fmaf(p, vv.z, o[r][g * 4 + 2]);\n"
    "            o[r][g * 4 + 3] = fmaf(p, vv.w, o[r][g * 4 + 3]);\n"
    "          }\n"
    "        }\n"
    "    }\n"
    "  }\n"
    "#pragma unroll\n"
    "  for (int r = 0; r < RM; r++) {\n"
    "    long long i = i0 + ty * RM + r;\n"
    "    if (i >= a.Tq) continue;\n"
    "    float f = a.Tk == 0 ? 0.f : m[r] == -INFINITY ? __int_as_float(0x7fc00000) : 1.f / l[r];\n"
    "    float *row = out + (b * a.Tq + i) * DV;\n"
    "#pragma unroll\n"
    "    for (int g = 0; g < DVP / 32; g++)\n"
    "#pragma unroll\n"
    "      for (int e = 0; e < 4; e++) {\n"
    "        int col = g * 32 + tx * 4 + e;\n"
    "        if (col < DV) row[col] = a.Tk == 0 ? 0.f : o[r][g * 4 + e] * f;\n"
    "      }\n"
    "  }\n"
    "}\n";

/* The tensor-core kernel's operand types, one of them in front of its
 * body: T (the elements of q, k, v, the mask and out), FROM_T and TO_T
 * (to and from f32), QMUL (what the q tile is multiplied by as it is
 * loaded), scores_of (a tile of scores, scaled, into the mma's C
 * fragments) and pv_of (o += p v from those fragments). */
static const char attention_mma_f32[] =
    "/* f32 operands: the q tile pre-scaled as it is loaded, products on tf32\n"
    " * tensor cores three at a time (3xTF32, about f32's accuracy) */\n"
    "typedef float T;\n"
    "#define FROM_T(x) (x)\n"
    "#define TO_T(x) (x)\n"
    "#define QMUL(a) (a).scale\n"
    "#define KSTEP 8\n"
    "/* x as a tf32 pair: big (the top 19 bits) and small (the rest, which\n"
    " * the tensor core truncates to tf32 in turn) */\n"
    "__device__ __forceinline__ void split(float x, unsigned &big, unsigned &small) {\n"
    "  big = __float_as_uint(x) & 0xffffe000u;\n"
    "  small = __float_as_uint(x - __uint_as_float(big));\n"
    "}\n"
    "__device__ __forceinline__ void mma(float *c, const unsigned *a, const unsigned *b) {\n"
    "  asm volatile(\"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, \"\n"
    "      \"{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\"\n"
    "      : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3])\n"
    "      : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));\n"
    "}\n"
    "/* c += a b to about f32's accuracy: three tf32 products (3xTF32; the\n"
    " * small x small one is below f32's rounding) */\n"
    "__device__ __forceinline__ void mma3(float *c, const float *a, const float *b) {\n"
    "  unsigned ab[4], as[4], bb[2], bs[2];\n"
    "#pragma unroll\n"
    "  for (int i = 0; i < 4; i++) split(a[i], ab[i], as[i]);\n"
    "  split(b[0], bb[0], bs[0]);\n"
    "  split(b[1], bb[1], bs[1]);\n"
    "  mma(c, as, bb);\n"
    "  mma(c, ab, bs);\n"
    "  mma(c, ab, bb);\n"
    "}\n"
    "/* s[n] = the scores of the warp's queries m0 + g, + 8 and keys 8n + 2t,\n"
    " * + 1 of the tile (the mma's C; q came scaled) */\n"
    "__device__ __forceinline__ void scores_of(float (*s)[4], const float *Qs, const float *Ks, int m0, int g,\n"
    "                                          int t, float) {\n"
    "#pragma unroll 2\n"
    "  for (int k0 = 0; k0 < D8; k0 += 8) {\n"
    "    const float *qr = Qs + (m0 + g) * QP + k0 + t;\n"
    "    float af[4] = {qr[0], qr[8 * QP], qr[4], qr[8 * QP + 4]};\n"
    "#pragma unroll\n"
    "    for (int n = 0; n < BK / 8; n++) {\n"
    "      const float *kr = Ks + (8 * n + g) * QP + k0 + t;\n"
    "      float bf[2] = {kr[0], kr[4]};\n"
    "      mma3(s[n], af, bf);\n"
    "    }\n"
    "  }\n"
    "}\n"
    "/* o += p v over the tile's keys, 8 at a time: the A operand's k = t,\n"
    " * t + 4 are the keys 2t, 2t + 1 the scores' C fragment holds, so v's rows\n"
    " * are read in that order (no shuffle) */\n"
    "__device__ __forceinline__ void pv_of(float (*o)[4], float (*s)[4], const float *Vs, int g, int t, int) {\n"
    "#pragma unroll\n"
    "  for (int kb = 0; kb < BK / 8; kb++) {\n"
    "    float af[4] = {s[kb][0], s[kb][2], s[kb][1], s[kb][3]};\n"
    "    const float *vr = Vs + (8 * kb + 2 * t) * VP + g;\n"
    "#pragma unroll\n"
    "    for (int n = 0; n < DV8 / 8; n++) {\n"
    "      float bf[2] = {vr[8 * n], vr[VP + 8 * n]};\n"
    "      mma3(o[n], af, bf);\n"
    "    }\n"
    "  }\n"
    "}\n";

static const char attention_mma_half[] =
    "/* f16/bf16 operands (HALF 1, 2; the bits as unsigned short): one\n"
    " * m16n8k16 product with f32 accumulation for q k^T and for p v, the\n"
    " * probabilities rounded to the half type for the second (as\n"
    " * FlashAttention does); the scores scaled in f32 after the product.\n"
    " * Fragments (PTX ISA, mma.m16n8k16 with .bf16/.f16): A's registers hold\n"
    " * rows g, g + 8 and columns 2t, 2t + 1 (registers 0, 1) and 2t + 8, 2t + 9\n"
    " * (2, 3); B's columns g and rows 2t, 2t + 1 (0) and 2t + 8, 2t + 9 (1); C\n"
    " * as for m16n8k8, the lower index in a register's lower 16 bits. */\n"
    "typedef unsigned short T;\n"
    "#if HALF == 2\n"
    "#define FROM_T(x) em_from_bf16(x)\n"
    "#define TO_T(x) em_to_bf16(x)\n"
    "#define MMA_HALF \"bf16\"\n"
    "#define CVT_HALF2 \"bf16x2\"\n"
    "#else\n"
    "#define FROM_T(x) em_from_f16(x)\n"
    "#define TO_T(x) em_to_f16(x)\n"
    "#define MMA_HALF \"f16\"\n"
    "#define CVT_HALF2 \"f16x2\"\n"
    "#endif\n"
    "#define QMUL(a) 1.f\n"
    "#define KSTEP 16\n"
    "__device__ __forceinline__ void mma16(float *c, const unsigned *a, const unsigned *b) {\n"
    "  asm volatile(\"mma.sync.aligned.m16n8k16.row.col.f32.\" MMA_HALF \".\" MMA_HALF \".f32 {%0,%1,%2,%3}, \"\n"
    "      \"{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\"\n"
    "      : \"+f\"(c[0]), \"+f\"(c[1]), \"+f\"(c[2]), \"+f\"(c[3])\n"
    "      : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"r\"(b[0]), \"r\"(b[1]));\n"
    "}\n"
    "/* lo and hi rounded to nearest even (TO_T's rounding, one instruction\n"
    " * for both), lo in the lower bits: cvt puts its first source high */\n"
    "__device__ __forceinline__ unsigned pack_pair(float lo, float hi) {\n"
    "  unsigned r;\n"
    "  asm(\"cvt.rn.\" CVT_HALF2 \".f32 %0, %2, %1;\" : \"=r\"(r) : \"f\"(lo), \"f\"(hi));\n"
    "  return r;\n"
    "}\n"
    "/* B fragments of two 8-column blocks of v: ldmatrix .x4 .trans gives\n"
    " * thread (g, t) rows 2t, 2t + 1 and column g of each of the four 8 x 8\n"
    " * matrices whose rows lanes 8i .. 8i + 7 address (i = lane / 8) */\n"
    "__device__ __forceinline__ void ldmatrix_t4(unsigned *r, const T *p) {\n"
    "  unsigned a = (unsigned)__cvta_generic_to_shared(p);\n"
    "  asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\"\n"
    "      : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(a));\n"
    "}\n"
    "/* A fragments of 16 rows x 16 columns, or B fragments of two 8-key\n"
    " * blocks, from a row-major tile: ldmatrix .x4 gives thread (g, t) row g\n"
    " * and columns 2t, 2t + 1 of each of the four 8 x 8 matrices whose rows\n"
    " * lanes 8i .. 8i + 7 address */\n"
    "__device__ __forceinline__ void ldmatrix_x4(unsigned *r, const T *p) {\n"
    "  unsigned a = (unsigned)__cvta_generic_to_shared(p);\n"
    "  asm volatile(\"ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\"\n"
    "      : \"=r\"(r[0]), \"=r\"(r[1]), \"=r\"(r[2]), \"=r\"(r[3]) : \"r\"(a));\n"
    "}\n"
    "/* s[n] = the scores of the warp's queries g, g + 8 and keys 8n + 2t, + 1\n"
    " * of the tile (the mma's C), times scale (* log2 e): q's A fragments\n"
    " * from registers (qf, loaded once), k's B fragments by ldmatrix (matrix\n"
    " * i: keys 8 (n + i / 2) .., columns 16 kk + 8 (i & 1) ..) */\n"
    "__device__ __forceinline__ void scores_of(float (*s)[4], const unsigned (*qf)[4], const T *Ks, int lane,\n"
    "                                          float scale) {\n"
    "  const T *kr = Ks + ((lane & 7) + ((lane >> 4) << 3)) * QP + 8 * ((lane >> 3) & 1);\n"
    "#pragma unroll\n"
    "  for (int kk = 0; kk < D8 / 16; kk++)\n"
    "#pragma unroll\n"
    "    for (int n = 0; n < BK / 8; n += 2) {\n"
    "      unsigned bf[4];\n"
    "      ldmatrix_x4(bf, kr + 8 * n * QP + 16 * kk);\n"
    "      mma16(s[n], qf[kk], bf);\n"
    "      mma16(s[n + 1], qf[kk], bf + 2);\n"
    "    }\n"
    "#pragma unroll\n"
    "  for (int n = 0; n < BK / 8; n++) s[n][0] *= scale, s[n][1] *= scale, s[n][2] *= scale, s[n][3] *= scale;\n"
    "}\n"
    "/* o += p v over the tile's keys, 16 at a time: the scores' C fragments\n"
    " * of keys 16kb .. + 7 and + 8 .. + 15 are the A fragment of p (rounded\n"
    " * to T); v's B fragments from its row-major tile by ldmatrix .trans\n"
    " * (matrix i: keys 16kb + 8 (i & 1) .., columns 8 (n + i / 2) ..) */\n"
    "__device__ __forceinline__ void pv_of(float (*o)[4], float (*s)[4], const T *Vs, int, int, int lane) {\n"
    "#pragma unroll\n"
    "  for (int kb = 0; kb < BK / 16; kb++) {\n"
    "    const float *s0 = s[2 * kb], *s1 = s[2 * kb + 1];\n"
    "    unsigned af[4] = {pack_pair(s0[0], s0[1]), pack_pair(s0[2], s0[3]), pack_pair(s1[0], s1[1]),\n"
    "                      pack_pair(s1[2], s1[3])};\n"
    "    const T *vr = Vs + (16 * kb + (lane & 7) + (lane & 8)) * VP + 8 * (lane >> 4);\n"
    "#pragma unroll\n"
    "    for (int n = 0; n < DV8 / 8; n += 2) {\n"
    "      unsigned bf[4];\n"
    "      ldmatrix_t4(bf, vr + 8 * n);\n"
    "      mma16(o[n], af, bf);\n"
    "      mma16(o[n + 1], af, bf + 2);\n"
    "    }\n"
    "  }\n"
    "}\n";

/* The tensor-core kernels' steps (either operand type, either body): a
 * thread holds two queries iq[h] (rows g, g + 8 of its warp's 16) and,
 * of a key tile at j0, the keys j0 + 8n + 2t, + 1 (the mma's C layout);
 * mrow: its queries' mask rows. */
static const char attention_mma_steps[] =
    "#define MCOL(j) (MASK == 2 ? (j) : (j) * a.mc) /* MASK 2: unit column stride */\n"
    "/* The mask at keys j, j + 1 (j even; 0 past Tk) of row mr: half masks\n"
    " * with unit column stride and rows 4-byte aligned (a.vec bit 3) read\n"
    " * both in one load where both keys exist */\n"
    "__device__ __forceinline__ float2 mask_pair(const attn_args &a, const T *mr, long long j) {\n"
    "  if (HALF && MASK == 2 && (a.vec & 8) && j + 1 < a.Tk) {\n"
    "    const unsigned w = *(const unsigned *)(mr + j);\n"
    "    return make_float2(FROM_T((T)(w & 0xffffu)), FROM_T((T)(w >> 16)));\n"
    "  }\n"
    "  return make_float2(j < a.Tk ? FROM_T(mr[MCOL(j)]) : 0.f, j + 1 < a.Tk ? FROM_T(mr[MCOL(j + 1)]) : 0.f);\n"
    "}\n"
    "/* Whether the mask keeps any of this thread's scores of the tile at j0\n"
    " * (the block's threads together: a tile the mask drops for every query\n"
    " * costs nothing, padding keys or an additive causal mask's upper tiles) */\n"
    "__device__ __forceinline__ bool tile_live(const attn_args &a, const long long *iq, const T *const *mrow,\n"
    "                                          long long j0, int t) {\n"
    "  bool live = false;\n"
    "#pragma unroll\n"
    "  for (int h = 0; h < 2; h++)\n"
    "#pragma unroll\n"
    "    for (int n = 0; n < BK / 8; n++) {\n"
    "      const long long j = j0 + 8 * n + 2 * t;\n"
    "      if (iq[h] >= a.Tq || j >= a.Tk || (CAUSAL && j > iq[h])) continue;\n"
    "      const float2 mk = mask_pair(a, mrow[h], j);\n"
    "      live |= mk.x != -INFINITY || (j + 1 < a.Tk && !(CAUSAL && j + 1 > iq[h]) && mk.y != -INFINITY);\n"
    "    }\n"
    "  return live;\n"
    "}\n"
    "/* The online softmax step of the tile at j0 for the thread's two\n"
    " * queries: on an edge tile (the diagonal, past the keys, a mask) the\n"
    " * dropped scores to -inf and the mask added; the running max m and sum\n"
    " * l updated, the scores s turned into probabilities, o rescaled */\n"
    "__device__ __forceinline__ void softmax_step(float (*s)[4], float (*o)[4], float *m, float *l,\n"
    "    const attn_args &a, const long long *iq, const T *const *mrow, long long j0, int t, bool edge) {\n"
    "  float alpha[2];\n"
    "#pragma unroll\n"
    "  for (int h = 0; h < 2; h++) {\n"
    "    float mx = -INFINITY;\n"
    "#pragma unroll\n"
    "    for (int n = 0; n < BK / 8; n++) {\n"
    "      const long long j = j0 + 8 * n + 2 * t;\n"
    "      const float2 mk = MASK && edge && iq[h] < a.Tq && j < a.Tk ? mask_pair(a, mrow[h], j)\n"
    "                                                                : make_float2(0.f, 0.f);\n"
    "#pragma unroll\n"
    "      for (int e = 0; e < 2; e++) {\n"
    "        float &x = s[n][2 * h + e];\n"
    "        if (edge) {\n"
    "          if (j + e >= a.Tk || (CAUSAL && j + e > iq[h])) x = -INFINITY;\n"
    "          else if (MASK && iq[h] < a.Tq) x += (e ? mk.y : mk.x) * LOG2E;\n"
    "        }\n"
    "        mx = fmaxf(mx, x);\n"
    "      }\n"
    "    }\n"
    "    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));\n"
    "    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));\n"
    "    float mnew = fmaxf(m[h], mx), sum = 0.f;\n"
    "    alpha[h] = 1.f;\n"
    "    if (mnew == -INFINITY) {\n"
    "#pragma unroll\n"
    "      for (int n = 0; n < BK / 8; n++) s[n][2 * h] = s[n][2 * h + 1] = 0.f;\n"
    "    } else {\n"
    "      alpha[h] = exp2f(m[h] - mnew);\n"
    "#pragma unroll\n"
    "      for (int n = 0; n < BK / 8; n++)\n"
    "#pragma unroll\n"
    "        for (int e = 0; e < 2; e++) {\n"
    "          s[n][2 * h + e] = exp2f(s[n][2 * h + e] - mnew);\n"
    "          sum += s[n][2 * h + e];\n"
    "        }\n"
    "    }\n"
    "    sum += __shfl_xor_sync(0xffffffffu, sum, 1);\n"
    "    sum += __shfl_xor_sync(0xffffffffu, sum, 2);\n"
    "    l[h] = l[h] * alpha[h] + sum;\n"
    "    m[h] = mnew;\n"
    "  }\n"
    "#pragma unroll\n"
    "  for (int n = 0; n < DV8 / 8; n++)\n"
    "    o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];\n"
    "}\n"
    "/* out's rows of the thread's queries: o / l (NaN where every key was\n"
    " * dropped, 0 without keys) */\n"
    "__device__ __forceinline__ void store_rows(T *__restrict__ out, const attn_args &a, long long b,\n"
    "    const long long *iq, float (*o)[4], const float *m, const float *l, int t) {\n"
    "#pragma unroll\n"
    "  for (int h = 0; h < 2; h++) {\n"
    "    if (iq[h] >= a.Tq) continue;\n"
    "    float f = a.Tk == 0 ? 0.f : m[h] == -INFINITY ? __int_as_float(0x7fc00000) : 1.f / l[h];\n"
    "    T *row = out + (b * a.Tq + iq[h]) * DV;\n"
    "#pragma unroll\n"
    "    for (int n = 0; n < DV8 / 8; n++)\n"
    "#pragma unroll\n"
    "      for (int e = 0; e < 2; e++) {\n"
    "        int col = 8 * n + 2 * t + e;\n"
    "        if (col < DV) row[col] = TO_T(a.Tk == 0 ? 0.f : o[n][2 * h + e] * f);\n"
    "      }\n"
    "  }\n"
    "}\n";

/* The 3xTF32 kernel's body (f32 operands): each of 4 warps takes 16
 * queries of the block's 64 and every key of a 64-key tile; the tiles
 * load synchronously into one buffer. */
static const char attention_mma[] =
    "extern \"C\" __global__ void BOUNDS k(const T *__restrict__ q,\n"
    "    const T *__restrict__ kk, const T *__restrict__ v,\n"
    "    const T *__restrict__ mask, T *__restrict__ out, attn_args a) {\n"
    "  EM_AFTER_PRIOR();\n"
    "  extern __shared__ float4 smem4[];\n"
    "  T *Qs = (T *)smem4, *Ks = Qs + BQ * QP, *Vs = Ks + BK * QP;\n"
    "  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
    "  const int m0 = (threadIdx.x >> 5) * 16; /* the warp's 16 queries */\n"
    "  long long b, i0, qo, ko, vo, mo;\n"
    "  block_of(a, &b, &i0, &qo, &ko, &vo, &mo);\n"
    "  load_tile<BQ, D, D8, QP>(Qs, q + qo, i0, a.Tq, a.qr, a.qc, QMUL(a), a.vec & 1);\n"
    "  const long long iq[2] = {i0 + m0 + g, i0 + m0 + g + 8}; /* this thread's two queries */\n"
    "  /* their mask rows (row 0 past Tq: never read there) */\n"
    "  const T *mrow[2] = {mask + mo + (iq[0] < a.Tq ? iq[0] : 0) * a.mr,\n"
    "                      mask + mo + (iq[1] < a.Tq ? iq[1] : 0) * a.mr};\n"
    "  float o[DV8 / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};\n"
    "#pragma unroll\n"
    "  for (int n = 0; n < DV8 / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;\n"
    "  long long kend = a.Tk;\n"
    "  if (CAUSAL && i0 + BQ < kend) kend = i0 + BQ;\n"
    "  for (long long j0 = 0; j0 < kend; j0 += BK) {\n"
    "    if (MASK) {\n"
    "      if (!__syncthreads_or(tile_live(a, iq, mrow, j0, t))) continue;\n"
    "    } else {\n"
    "      __syncthreads();\n"
    "    }\n"
    "    load_tile<BK, D, D8, QP>(Ks, kk + ko, j0, a.Tk, a.kr, a.kc, 1.f, a.vec & 2);\n"
    "    load_tile<BK, DV, DV8, VP>(Vs, v + vo, j0, a.Tk, a.vr, a.vc, 1.f, a.vec & 4);\n"
    "    __syncthreads();\n"
    "    /* s[n]: keys j0 + 8n + 2t, +1 of queries g, g + 8 (the mma's C) */\n"
    "    float s[BK / 8][4];\n"
    "#pragma unroll\n"
    "    for (int n = 0; n < BK / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;\n"
    "    scores_of(s, Qs, Ks, m0, g, t, a.scale);\n"
    "    /* a tile on the diagonal or past the keys drops some scores */\n"
    "    bool edge = j0 + BK > a.Tk || (CAUSAL && j0 + BK - 1 > i0) || MASK;\n"
    "    softmax_step(s, o, m, l, a, iq, mrow, j0, t, edge);\n"
    "    pv_of(o, s, Vs, g, t, lane);\n"
    "  }\n"
    "  store_rows(out, a, b, iq, o, m, l, t);\n"
    "}\n";

/* The half kernel's body (f16, bf16; FlashAttention-2's schedule, Dao
 * 2023): NW warps of 16 queries each, the warp's q fragments loaded once
 * into registers (ldmatrix); the k and v tiles through a ring of two
 * shared-memory stages filled by 16-byte cp.async copies, tile j + 1's
 * copies issued before tile j is computed (rows that cannot be read as
 * 16-byte vectors take load_tile's synchronous path instead); k's and
 * v's B fragments by ldmatrix (.trans for v).  The row pitches (8 mod 16
 * halves) put the 8 rows an ldmatrix matrix reads in 8 different 4-bank
 * groups: no bank conflicts, and every row 16-byte aligned for cp.async. */
static const char attention_fa2[] =
    "/* A 16-byte copy from global to shared memory in flight (cp.async.cg,\n"
    " * through L2 only); src_bytes 0 reads nothing and zero-fills dst */\n"
    "__device__ __forceinline__ void cp_async16(T *dst, const T *src, int src_bytes) {\n"
    "  unsigned d = (unsigned)__cvta_generic_to_shared(dst);\n"
    "  asm volatile(\"cp.async.cg.shared.global [%0], [%1], 16, %2;\" :: \"r\"(d), \"l\"(src), \"r\"(src_bytes)\n"
    "               : \"memory\");\n"
    "}\n"
    "__device__ __forceinline__ void cp_commit() { asm volatile(\"cp.async.commit_group;\" ::: \"memory\"); }\n"
    "/* the thread's copies but the last N groups done */\n"
    "template <int N> __device__ __forceinline__ void cp_wait() {\n"
    "  asm volatile(\"cp.async.wait_group %0;\" :: \"n\"(N) : \"memory\");\n"
    "}\n"
    "/* load_tile's tile (zero past nrows and COLS) by cp.async (vec: unit\n"
    " * column stride, 16-byte aligned rows), else by load_tile (it is then\n"
    " * in shared memory when this returns) */\n"
    "template <int ROWS, int COLS, int COLSV, int PITCH>\n"
    "__device__ __forceinline__ void fetch_tile(T *dst, const T *__restrict__ src, long long r0, long long nrows,\n"
    "    long long rs, long long cs, bool vec) {\n"
    "  if (!vec) {\n"
    "    load_tile<ROWS, COLS, COLSV, PITCH>(dst, src, r0, nrows, rs, cs, 1.f, false);\n"
    "    return;\n"
    "  }\n"
    "  const int NV = ROWS * (COLSV / 8);\n"
    "  /* rolled: unrolled, the copies' offsets (the same for every tile)\n"
    "   * would be hoisted out of the key loop into registers */\n"
    "#pragma unroll 1\n"
    "  for (int i = 0; i < (NV + NT - 1) / NT; i++) {\n"
    "    const int e = threadIdx.x + i * NT, r = e / (COLSV / 8), c = e % (COLSV / 8) * 8;\n"
    "    const bool in = r0 + r < nrows && c < COLS;\n"
    "    if (NV % NT == 0 || e < NV) cp_async16(dst + r * PITCH + c, in ? src + (r0 + r) * rs + c : src, in ? 16 : 0);\n"
    "  }\n"
    "}\n"
    "/* The first key tile from j0 on that the mask keeps a score of the\n"
    " * block in (j0 itself without a mask), kend when none: the same answer\n"
    " * in every thread */\n"
    "__device__ __forceinline__ long long next_live(const attn_args &a, long long j0, long long kend,\n"
    "    const long long *iq, const T *const *mrow, int t) {\n"
    "  if (MASK)\n"
    "    for (; j0 < kend; j0 += BK)\n"
    "      if (__syncthreads_or(tile_live(a, iq, mrow, j0, t))) return j0;\n"
    "  return j0 < kend ? j0 : kend;\n"
    "}\n"
    "extern \"C\" __global__ void BOUNDS k(const T *__restrict__ q,\n"
    "    const T *__restrict__ kk, const T *__restrict__ v,\n"
    "    const T *__restrict__ mask, T *__restrict__ out, attn_args a) {\n"
    "  EM_AFTER_PRIOR();\n"
    "  extern __shared__ float4 smem4[];\n"
    "  /* the q tile, then the k tile's two stages, then v's */\n"
    "  T *Qs = (T *)smem4, *Ks = Qs + BQ * QP, *Vs = Ks + 2 * BK * QP;\n"
    "  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;\n"
    "  const int m0 = (threadIdx.x >> 5) * 16; /* the warp's 16 queries */\n"
    "  long long b, i0, qo, ko, vo, mo;\n"
    "  block_of(a, &b, &i0, &qo, &ko, &vo, &mo);\n"
    "  const long long iq[2] = {i0 + m0 + g, i0 + m0 + g + 8}; /* this thread's two queries */\n"
    "  /* their mask rows (row 0 past Tq: never read there) */\n"
    "  const T *mrow[2] = {mask + mo + (iq[0] < a.Tq ? iq[0] : 0) * a.mr,\n"
    "                      mask + mo + (iq[1] < a.Tq ? iq[1] : 0) * a.mr};\n"
    "  long long kend = a.Tk;\n"
    "  if (CAUSAL && i0 + BQ < kend) kend = i0 + BQ;\n"
    "  /* q's copies one group, the first live tile's the next */\n"
    "  fetch_tile<BQ, D, D8, QP>(Qs, q + qo, i0, a.Tq, a.qr, a.qc, a.vec & 1);\n"
    "  cp_commit();\n"
    "  long long j0 = next_live(a, 0, kend, iq, mrow, t);\n"
    "  if (j0 < kend) {\n"
    "    fetch_tile<BK, D, D8, QP>(Ks, kk + ko, j0, a.Tk, a.kr, a.kc, a.vec & 2);\n"
    "    fetch_tile<BK, DV, DV8, VP>(Vs, v + vo, j0, a.Tk, a.vr, a.vc, a.vec & 4);\n"
    "  }\n"
    "  cp_commit();\n"
    "  cp_wait<1>();\n"
    "  __syncthreads();\n"
    "  unsigned qf[D8 / 16][4]; /* the warp's q as A fragments, for every tile */\n"
    "#pragma unroll\n"
    "  for (int kk = 0; kk < D8 / 16; kk++)\n"
    "    ldmatrix_x4(qf[kk], Qs + (m0 + (lane & 15)) * QP + 16 * kk + 8 * (lane >> 4));\n"
    "  float o[DV8 / 8][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};\n"
    "#pragma unroll\n"
    "  for (int n = 0; n < DV8 / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;\n"
    "  /* a warp past the queries, or (causal) before every key of a tile,\n"
    "   * skips the tile's work (but not the block's barriers) */\n"
    "  const long long wfirst = i0 + m0, wlast = wfirst + 15;\n"
    "  for (int st = 0; j0 < kend; st ^= 1) {\n"
    "    const long long jn = next_live(a, j0 + BK, kend, iq, mrow, t);\n"
    "    __syncthreads(); /* every warp is done with stage st ^ 1 (the tile before j0) */\n"
    "    if (jn < kend) {\n"
    "      fetch_tile<BK, D, D8, QP>(Ks + (st ^ 1) * BK * QP, kk + ko, jn, a.Tk, a.kr, a.kc, a.vec & 2);\n"
    "      fetch_tile<BK, DV, DV8, VP>(Vs + (st ^ 1) * BK * VP, v + vo, jn, a.Tk, a.vr, a.vc, a.vec & 4);\n"
    "    }\n"
    "    cp_commit();\n"
    "    cp_wait<1>(); /* tile j0's copies (this thread's) */\n"
    "    __syncthreads(); /* and every thread's */\n"
    "    if (wfirst < a.Tq && !(CAUSAL && j0 > wlast)) {\n"
    "      /* s[n]: keys j0 + 8n + 2t, +1 of queries g, g + 8 (the mma's C) */\n"
    "      float s[BK / 8][4];\n"
    "#pragma unroll\n"
    "      for (int n = 0; n < BK / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;\n"
    "      scores_of(s, qf, Ks + st * BK * QP, lane, a.scale);\n"
    "      /* a tile on the warp's diagonal or past the keys drops some scores */\n"
    "      const bool edge = j0 + BK > a.Tk || (CAUSAL && j0 + BK - 1 > wfirst) || MASK;\n"
    "      softmax_step(s, o, m, l, a, iq, mrow, j0, t, edge);\n"
    "      pv_of(o, s, Vs + st * BK * VP, g, t, lane);\n"
    "    }\n"
    "    j0 = jn;\n"
    "  }\n"
    "  store_rows(out, a, b, iq, o, m, l, t);\n"
    "}\n";

/* How a call runs: which kernel, its tiling, its launch. */
typedef struct attn_plan {
    bool mma;       /* tensor cores (sm_80 on): 3xTF32 or half, else CUDA cores */
    int half;       /* operands f32 (0), f16 (1) or bf16 (2): the text's HALF */
    int esize;      /* bytes an element */
    int tr, rm, cn; /* CUDA cores: 8 x tr threads, each rm queries x cn keys */
    int nt, bq, bk; /* threads, queries and keys of a block's tiles */
    int blocks;     /* half: the blocks an SM should hold (__launch_bounds__) */
    int64_t D, Dv, dp, dvp, qp, vp; /* head sizes, their tile widths, row pitches */
} attn_plan;

static int64_t up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* A row pitch for tiles of w floats (w a multiple of 4) that is 4 mod 8
 * (mod 16 when mod16): consecutive rows start in different bank groups,
 * so the fragment reads of 8 rows (4 threads each) hit 32 banks. */
static int64_t pitch_of(int64_t w, bool mod16) {
    int64_t p = w + 4;
    while (p % (mod16 ? 16 : 8) != 4) p += 4;
    return p;
}

/* The same for tiles of w halves (w a multiple of 8): 8 mod 16 halves, so
 * that a row is 16-byte aligned (vector stores, ldmatrix) and the rows
 * 32-bit fragment loads and ldmatrix read together (8 rows, 16 bytes
 * each at most) fall in 8 different 4-bank groups. */
static int64_t half_pitch_of(int64_t w) {
    int64_t p = w + 8;
    while (p % 16 != 8) p += 8;
    return p;
}

/* The text's HALF for dtype dt: 0 f32, 1 f16, 2 bf16; -1 any other. */
static int half_of(em_dtype dt) {
    return dt == EM_F32 ? 0 : dt == EM_F16 ? 1 : dt == EM_BF16 ? 2 : -1;
}

/* EMBER_CUDA_ATTENTION: "simt" runs the CUDA-core tiled kernel (the only
 * one before sm_80), "tiled" the tiled kernels even for few queries; the
 * tests run every kernel on one GPU. */
static bool attention_env_is(const char *what) {
    char v[16];
    return em_getenv("EMBER_CUDA_ATTENTION", v, sizeof v) && !strcmp(v, what);
}

/* Whether cuda:d runs the tensor-core tiled kernel: sm_80 on, unless
 * EMBER_CUDA_ATTENTION=simt. */
static bool use_mma(const cuda_device *d) {
    return d->major >= 8 && !attention_env_is("simt");
}

/* Whether a call of Tq queries runs the decode kernel: at most 8 (past
 * that the tiled kernels' 64-query tiles are at least an eighth full, and
 * their blocks many enough), unless EMBER_CUDA_ATTENTION picks a tiled one. */
static bool use_decode(int64_t Tq) {
    return Tq <= 8 && !attention_env_is("simt") && !attention_env_is("tiled");
}

/* The plan of the half kernel (attention_fa2) for head sizes D and Dv
 * padded to dp and dvp.  A thread keeps q's A fragments (dp / 4
 * registers), the output's C fragments (dvp / 2) and the scores' (bk / 2)
 * for the whole key loop, so the rule comes from the register file
 * (64K a SM, at most 255 a thread; ptxas for sm_90 takes about twice the
 * fragments' registers) and shared memory (227 KB a SM; q's tile plus
 * two stages of k's and v's):
 *  - at most 64 registers of fragments with 32-key tiles (dp and dvp
 *    up to 64): 8 warps of 16 queries (each k and v tile serving 128
 *    queries), 2 blocks (16 warps) an SM at 128 registers, no spills;
 *    37 KB a block at 64;
 *  - else dp <= 128: 8 warps, 64 keys (up to 128 registers of fragments,
 *    about 235 in all): 1 block of 8 warps an SM, as FlashAttention-2
 *    runs head size 128; 104 KB at 128;
 *  - past (up to 256, dvp up to 128): 4 warps, 32 keys (the k tile's
 *    rows are long), 2 blocks an SM at 255 registers (ptxas spills about
 *    100 bytes at 256); 85 KB a block at 256. */
static void plan_half(attn_plan *p) {
    p->dp = up(p->D, 16), p->dvp = up(p->Dv, 16);
    p->qp = half_pitch_of(p->dp), p->vp = half_pitch_of(p->dvp);
    bool small = p->dp / 4 + p->dvp / 2 + 16 <= 64, wide = p->dp > 128;
    p->nt = wide ? 128 : 256, p->bq = p->nt / 2, p->bk = small || wide ? 32 : 64;
    p->blocks = small || wide ? 2 : 1;
}

/* The plan for head sizes D, Dv and operands half (half_of).  Half
 * operands: plan_half.  Tensor cores for f32: 4 warps of 16 queries, 64
 * keys a tile (the C fragments of the scores are the A fragments of p v).  CUDA
 * cores: 8 x 8 scores a thread for head sizes up to 64 (a
 * 128 x 64 tile), else 4 x 4 (the output's registers, rm x Dv/8, and the
 * tiles' shared memory). */
static attn_plan plan_for(bool mma, int half, int64_t D, int64_t Dv) {
    attn_plan p = {.mma = mma || half, .half = half, .esize = half ? 2 : 4, .D = D, .Dv = Dv};
    if (half) {
        plan_half(&p);
        return p;
    }
    if (p.mma) {
        p.nt = 128, p.bq = 64, p.bk = 64;
        p.dp = up(D, 8), p.dvp = up(Dv, 8);
        p.qp = pitch_of(p.dp, false), p.vp = pitch_of(p.dvp, true);
        return p;
    }
    bool small = D <= 64 && Dv <= 64;
    p.tr = 16, p.rm = small ? 8 : 4, p.cn = small ? 8 : 4;
    p.nt = 8 * p.tr, p.bq = p.tr * p.rm, p.bk = 8 * p.cn;
    p.dp = up(D, 4), p.dvp = up(Dv, 32);
    p.qp = pitch_of(p.dp, false), p.vp = p.dvp;
    return p;
}

/* Shared memory of p's kernel, in bytes: the q, k and v tiles (two
 * stages of k and v for half operands; on CUDA cores the probabilities'
 * too). */
static unsigned smem_bytes(const attn_plan *p) {
    int stages = p->half ? 2 : 1;
    int64_t n = p->bq * p->qp + stages * p->bk * (p->qp + p->vp);
    if (!p->mma) n += p->bq * (p->bk + 4);
    return (unsigned)(n * p->esize);
}

/* The defines of p's kernel text, into buf. */
static void plan_defines(const attn_plan *p, char *buf, size_t n) {
    if (p->mma)
        snprintf(buf, n, "#define NW %d\n#define NT %d\n#define BQ %d\n#define BK %d\n#define D8 %lld\n"
                 "#define DV8 %lld\n#define QP %lld\n#define VP %lld\n", p->nt / 32, p->nt, p->bq, p->bk,
                 (long long)p->dp, (long long)p->dvp, (long long)p->qp, (long long)p->vp);
    else
        snprintf(buf, n, "#define TR %d\n#define RM %d\n#define CN %d\n#define NT %d\n#define BQ %d\n"
                 "#define BK %d\n#define PP (BK + 4)\n#define D4 %lld\n#define DVP %lld\n#define QP %lld\n",
                 p->tr, p->rm, p->cn, p->nt, p->bq, p->bk, (long long)p->dp, (long long)p->dvp,
                 (long long)p->qp);
}

enum { ATTN_PARTS = 6 }; /* plan_parts' most */

/* The tensor-core kernel's __launch_bounds__ (the text's BOUNDS), into
 * buf: half kernels, the plan's blocks an SM (plan_half); f32, threads
 * only (a minimum of 1 block made ptxas take 218 registers instead of
 * 162). */
static void launch_bounds(const attn_plan *p, char *buf, size_t n) {
    if (p->half) snprintf(buf, n, "__launch_bounds__(NT, %d)", p->blocks);
    else snprintf(buf, n, "__launch_bounds__(NT)");
}

/* p's kernel text as parts (the defines into head, then the conversions
 * of half operands, the prelude, the operand type's part and the body as
 * they are); mask 0: none, 1: any strides, 2: unit column stride.
 * Returns the number of parts. */
static int plan_parts(const attn_plan *p, bool causal, int mask, int nb, char *head, size_t n,
                      const char *parts[ATTN_PARTS]) {
    char defs[512], bounds[64];
    plan_defines(p, defs, sizeof defs);
    launch_bounds(p, bounds, sizeof bounds);
    snprintf(head, n, "/* ember fused attention */\n#define D %lld\n#define DV %lld\n#define CAUSAL %d\n"
             "#define MASK %d\n#define NB %d\n#define HALF %d\n#define BOUNDS %s\n%s", (long long)p->D,
             (long long)p->Dv, causal, mask, nb, p->half, bounds, defs);
    int k = 0;
    parts[k++] = head;
    if (p->half) parts[k++] = cuda_half_helpers;
    parts[k++] = attention_prelude;
    if (p->mma) {
        parts[k++] = p->half ? attention_mma_half : attention_mma_f32;
        parts[k++] = attention_mma_steps;
    }
    parts[k++] = !p->mma ? attention_simt : p->half ? attention_fa2 : attention_mma;
    return k;
}

/* The n parts as one string (em_free), or NULL (out of memory). */
static char *joined(const char *const *parts, int n) {
    size_t len = 0;
    for (int i = 0; i < n; i++) len += strlen(parts[i]);
    char *text = em_malloc(len + 1);
    if (!text) return NULL;
    char *at = text;
    for (int i = 0; i < n; i++) {
        size_t k = strlen(parts[i]);
        memcpy(at, parts[i], k);
        at += k;
    }
    *at = '\0';
    return text;
}

static char *plan_text(const attn_plan *p, bool causal, int mask, int nb) {
    char head[768];
    const char *parts[ATTN_PARTS];
    return joined(parts, plan_parts(p, causal, mask, nb, head, sizeof head, parts));
}

char *cuda_attention_text(int64_t D, int64_t Dv, bool causal, int mask, int nb, bool mma) {
    attn_plan p = plan_for(mma, 0, D, Dv);
    return plan_text(&p, causal, mask, nb);
}

char *cuda_attention_half_text(em_dtype dt, int64_t D, int64_t Dv, bool causal, int mask, int nb) {
    int half = half_of(dt);
    if (half < 1 || D < 1 || D > MAX_D || Dv < 0 || Dv > MAX_DV || nb < 0 || nb > EM_MAX_DIMS) {
        em_error(EM_ERR_ARG, "attention half kernel: dtype %s, head sizes %lld/%lld, %d batch dims",
                 em_dtype_name(dt), (long long)D, (long long)Dv, nb);
        return NULL;
    }
    attn_plan p = plan_for(true, half, D, Dv);
    return plan_text(&p, causal, mask, nb);
}

static int64_t pow2_at_least(int64_t x) {
    int64_t p = 1;
    while (p < x) p *= 2;
    return p;
}

/* The decode kernel's text as parts (its defines into head, the prelude,
 * the body). */
static bool decode_parts(int64_t D, int64_t Dv, bool causal, int mask, int nb, char *head, size_t n,
                         const char *parts[3]) {
    if (D < 1 || D > MAX_D || Dv < 0 || Dv > MAX_DV || nb < 0 || nb > EM_MAX_DIMS) {
        em_error(EM_ERR_ARG, "attention decode kernel: head sizes %lld/%lld, %d batch dims", (long long)D,
                 (long long)Dv, nb);
        return false;
    }
    snprintf(head, n, "/* ember decode attention */\n#define D %lld\n#define DV %lld\n#define CAUSAL %d\n"
             "#define MASK %d\n#define NB %d\n#define D4 %lld\n#define DVP %lld\n"
             "#define BQ 1 /* the prelude's block_of (unused here) */\n#define NT 128\n", (long long)D, (long long)Dv,
             causal, mask, nb, (long long)up(D, 4), (long long)pow2_at_least(Dv > 0 ? Dv : 1));
    parts[0] = head;
    parts[1] = attention_prelude;
    parts[2] = attention_decode;
    return true;
}

char *cuda_attention_decode_text(int64_t D, int64_t Dv, bool causal, int mask, int nb) {
    char head[512];
    const char *parts[3];
    if (!decode_parts(D, Dv, causal, mask, nb, head, sizeof head, parts)) return NULL;
    return joined(parts, 3);
}

/* Runs the decode kernel on a's problem (ptrs: q, k, v, mask, out):
 * rows x nsplit blocks, the split chosen for about four blocks an SM and
 * chunks of at least 32 keys; one chunk when there are more rows than
 * counters. */
static em_status run_decode(cuda_device *d, const em_op_call *c, int mkind, int nb, attn_args *a,
                            CUdeviceptr *ptrs, cuda_get_stats *stats) {
    int64_t D = c->in[0]->sizes[c->in[0]->ndim - 1], Dv = c->in[2]->sizes[c->in[2]->ndim - 1];
    int64_t rows = a->nbatch * a->Tq, want = 4 * (int64_t)(d->sm_count > 0 ? d->sm_count : 1);
    int64_t split = (want + rows - 1) / rows, most = (a->Tk + 31) / 32;
    if (split > most) split = most;
    if (split < 1 || rows > CUDA_NSEMS) split = 1;
    a->chunk = (a->Tk + split - 1) / split;
    a->nsplit = a->chunk ? (a->Tk + a->chunk - 1) / a->chunk : 1;
    if (rows * a->nsplit > INT32_MAX)
        return em_error(EM_ERR_UNSUPPORTED, "attention on CUDA: %lld query rows", (long long)rows);
    char head[512];
    const char *parts[3];
    if (!decode_parts(D, Dv, c->attrs->causal, mkind, nb, head, sizeof head, parts)) return em_last_status();
    const cuda_kernel *ck = NULL;
    em_status s = cuda_source_get_parts(d, parts, 3, cuda_eager_cache(), cuda_eager_log(), stats, &ck);
    if (s != EM_OK) return s;
    em_meta pm;
    memset(&pm, 0, sizeof pm);
    pm.ndim = 1, pm.sizes[0] = rows * a->nsplit * (Dv + 2), pm.strides[0] = 1;
    pm.dtype = EM_F32, pm.device = c->in[0]->device;
    em_scope_begin();
    em_tensor *part = a->nsplit > 1 ? em_tensor_alloc(&pm) : NULL;
    CUdeviceptr pp = part ? (CUdeviceptr)(uintptr_t)em_data(part) : 0, sem = d->sems;
    void *args[] = {&ptrs[0], &ptrs[1], &ptrs[2], &ptrs[3], &ptrs[4], a, &pp, &sem};
    s = a->nsplit == 1 || part ? cuda_source_launch(d, ck, (unsigned)(rows * a->nsplit), 128, 0, args)
                               : em_last_status();
    em_scope_end(); /* the partials are freed in stream order */
    return s;
}

/* t's strides aligned to the result's nb batch dims (0 where t lacks the
 * dim or broadcasts it), and its row and column strides (0 where
 * broadcast): cpu_attention.c's operand_of, on the kernel's fields. */
static void strides_of(const em_tensor *t, int nb, long long *bst, long long *rs, long long *cs) {
    int nd = t->ndim, tb = nd - 2;
    for (int d = 0; d < nb; d++) {
        int td = d - (nb - tb);
        bst[d] = td >= 0 && t->sizes[td] != 1 ? t->strides[td] : 0;
    }
    *rs = nd >= 2 && t->sizes[nd - 2] != 1 ? t->strides[nd - 2] : 0;
    *cs = nd >= 1 && t->sizes[nd - 1] != 1 ? t->strides[nd - 1] : 0;
}

/* Whether t's rows of cols elements can be read as 16-byte vectors (w
 * elements: 4 floats, 8 halves): unit column stride, every other stride
 * and the base 16-byte aligned. */
static bool vector_rows(const em_tensor *t, int nb, const long long *bst, long long rs, long long cs,
                        int64_t cols, int w) {
    bool ok = cols % w == 0 && (cs == 1 || cols == 1) && rs % w == 0 &&
              (uintptr_t)em_data(t) % 16 == 0;
    for (int i = 0; ok && i < nb; i++) ok = bst[i] % w == 0;
    return ok;
}

/* Whether the device takes half operands: m16n8k16 with bf16 is sm_80 on
 * (cuda_attention_takes asks the same). */
static bool half_device(const cuda_device *d) { return d->major >= 8; }

bool cuda_attention_takes(int index, em_dtype dt, int64_t D, int64_t Dv) {
    if (dt == EM_F32) return true;
    if (half_of(dt) < 1 || D < 1 || D > MAX_D || Dv < 0 || Dv > MAX_DV) return false;
    int arch = cuda_device_arch(index); /* no context made for a question */
    if (arch < 0) em_clear_error();        /* no device: unfused; the error comes where it runs */
    return arch >= 80;
}

em_status cuda_attention(cuda_device *d, const em_op_call *c, em_tensor *out, cuda_get_stats *stats) {
    const em_tensor *q = c->in[0], *k = c->in[1], *v = c->in[2];
    const em_tensor *mask = c->nin == 4 ? c->in[3] : NULL;
    int64_t D = q->sizes[q->ndim - 1], Dv = v->sizes[v->ndim - 1];
    int half = half_of(out->dtype);
    if (half < 0 || D < 1 || D > MAX_D || Dv > MAX_DV)
        return em_error(EM_ERR_UNSUPPORTED, "attention on CUDA: %s, head sizes %lld/%lld (at most %d/%d)",
                        em_dtype_name(out->dtype), (long long)D, (long long)Dv, MAX_D, MAX_DV);
    if (half && !half_device(d))
        return em_error(EM_ERR_UNSUPPORTED, "attention on CUDA: %s needs sm_80 or later (this is sm_%d%d)",
                        em_dtype_name(out->dtype), d->major, d->minor);
    attn_args a;
    memset(&a, 0, sizeof a);
    int nb = out->ndim - 2;
    for (int i = 0; i < nb; i++) a.bsz[i] = out->sizes[i];
    a.Tq = out->sizes[nb];
    a.Tk = k->sizes[k->ndim - 2];
    a.nbatch = em_shape_numel(nb, out->sizes);
    attn_plan p = plan_for(use_mma(d), half, D, Dv);
    a.nqblk = (a.Tq + p.bq - 1) / p.bq;
    a.scale = (float)(c->attrs->value * 1.4426950408889634);
    if (a.nbatch * a.nqblk > INT32_MAX)
        return em_error(EM_ERR_UNSUPPORTED, "attention on CUDA: %lld query blocks",
                        (long long)(a.nbatch * a.nqblk));
    if (a.nbatch * a.nqblk == 0) return EM_OK;
    strides_of(q, nb, a.qb, &a.qr, &a.qc);
    strides_of(k, nb, a.kb, &a.kr, &a.kc);
    strides_of(v, nb, a.vb, &a.vr, &a.vc);
    if (mask) strides_of(mask, nb, a.mb, &a.mr, &a.mc);
    int w = 16 / p.esize;
    a.vec = vector_rows(q, nb, a.qb, a.qr, a.qc, D, w) | vector_rows(k, nb, a.kb, a.kr, a.kc, D, w) << 1 |
            vector_rows(v, nb, a.vb, a.vr, a.vc, Dv, w) << 2;
    /* MASK 2: the mask's columns are adjacent, no multiply per score;
     * half ones read two at a time where every row starts 4-byte aligned */
    int mkind = !mask ? 0 : a.mc == 1 ? 2 : 1;
    if (mkind == 2 && half && vector_rows(mask, nb, a.mb, a.mr, 1, 2, 2)) a.vec |= 8;
    CUdeviceptr ptrs[5] = {(CUdeviceptr)(uintptr_t)em_data(q), (CUdeviceptr)(uintptr_t)em_data(k),
                           (CUdeviceptr)(uintptr_t)em_data(v), mask ? (CUdeviceptr)(uintptr_t)em_data(mask) : 0,
                           (CUdeviceptr)(uintptr_t)em_data(out)};
    if (!half && use_decode(a.Tq)) return run_decode(d, c, mask != NULL, nb, &a, ptrs, stats);
    char head[768];
    const char *parts[ATTN_PARTS];
    int nparts = plan_parts(&p, c->attrs->causal, mkind, nb, head, sizeof head, parts);
    const cuda_kernel *ck = NULL;
    em_status s = cuda_source_get_parts(d, parts, nparts, cuda_eager_cache(), cuda_eager_log(), stats, &ck);
    if (s != EM_OK) return s;
    void *args[] = {&ptrs[0], &ptrs[1], &ptrs[2], &ptrs[3], &ptrs[4], &a};
    return cuda_source_launch(d, ck, (unsigned)(a.nbatch * a.nqblk), (unsigned)p.nt, smem_bytes(&p),
                              args);
}

#endif /* EMBER_HAVE_CUDA */
