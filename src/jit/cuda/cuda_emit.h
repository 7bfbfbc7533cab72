/* cuda_emit.h - the kernel IR (kir.h) printed as CUDA C for NVRTC.
 *
 * Sibling of cpu_gccjit_emit.c.  The kernel's parallel range becomes the
 * grid; what happens inside it decides the kernel's shape:
 *
 *  - CU_FLAT: no loop inside the parallel range (pointwise kernels).  A
 *    grid-stride loop in which each thread handles U elements per step,
 *    T apart (coalesced), with every buffer __restrict__ so the U loads of
 *    a step are all in flight before the first store; a tail loop does the
 *    last partial step.  The launch makes a block per step (cuda_kernel.c).
 *    When every load and store is element v of a 4-byte buffer, NAME_v4 does
 *    the same with one 16-byte load or store per buffer for four elements.
 *  - CU_ROWS: loops inside (rows with reductions, broadcasts along a row).
 *    A block per row (grid-stride over rows); the first inner loop of each
 *    pass is split over the block's threads (j = tid + it*T for a constant,
 *    unrolled trip count when the extent is constant), deeper loops run in
 *    each thread.  A buffer read or written only at base + j in such
 *    passes is kept in registers between them (rc<key>[it]): the row is
 *    read from memory once, and a store a later pass overwrites is not
 *    made.  An accumulator updated in such a pass is a
 *    per-thread partial, combined after the pass by a block reduction (warp
 *    shuffles, then one value per warp through shared memory) whose result
 *    every thread gets.  Row-scope stores are done by thread 0.  Every pass
 *    splits j the same way, so a value a thread stores in one pass (lower.c's
 *    stash) is read back by the same thread in the next.  Rows a warp
 *    covers take a warp each, or when short a part of one (1 to 32 lanes,
 *    64 bytes a lane: several rows a warp, shuffles over the row's lanes).
 *    NAME_v4, where vec4 is set, steps each pass by 16-byte vectors of the
 *    row (with a one-element-a-thread head and tail for rows that start or
 *    end off a vector boundary); cuda_emit.c (plan_vec) says when.  On
 *    sm_90 (cuda_emit_for), a row too long for one block's registers is
 *    split over a thread-block cluster whose blocks act as one block,
 *    partials combined through distributed shared memory (cuda_emit.c,
 *    choose_cluster).
 *  - tiled (launched as CU_ROWS, one 32 x 32 tile a block): a pointwise
 *    kernel over (a, j) with lower.c's tile hint (kir.h's K_TILE): the
 *    loads that walk a rather than j (a transposed operand) are read
 *    through shared memory, lanes along a, and everything else along j,
 *    so both are coalesced (cuda_emit.c says how).
 *  - CU_SERIAL: anything else (stores or loops outside the parallel range):
 *    one thread runs the whole kernel.  Correct, slow; lower.c does not
 *    produce such kernels today.
 *
 * Arithmetic follows the eager CPU kernels (cpu_gccjit.h states them): i32
 * wraps, float max/min propagate NaN, float -> int truncates and saturates
 * with NaN -> 0 (cvt.rzi), index division by 0 acts as division by 1.
 * Transcendentals are CUDA's own accurate functions (expf, tanhf, erff...,
 * no fast-math); constants are written as bit patterns, so they are exact
 * and need no INFINITY macro (NVRTC has no libc headers). */
#ifndef EMBER_CUDA_EMIT_H
#define EMBER_CUDA_EMIT_H

#include "kir.h"

typedef enum cuda_shape { CU_FLAT, CU_ROWS, CU_SERIAL } cuda_shape;

typedef struct cuda_src {
    char *text;       /* the CUDA C translation unit (em_malloc; cuda_src_free) */
    cuda_shape shape;
    int threads;      /* block size */
    int unroll;       /* CU_FLAT: elements per thread per step; CU_ROWS: rows per block */
    int64_t extent;   /* iterations of the parallel range (rows, or elements) */
    int extent_size;  /* or, >= 0, the size parameter that holds it (dynamic shapes) */
    int nbufs, nsizes; /* the kernel's parameters */
    bool vec4;        /* CU_FLAT and CU_ROWS: the text also defines NAME_v4,
                         the same kernel stepping by 16-byte vectors (for
                         buffers that are all 16-byte aligned) */
    bool tiled;       /* a tiled kernel (below), launched as CU_ROWS with
                         one tile a block */
    int cluster;      /* CU_ROWS: blocks a row, launched as a thread-block
                         cluster of that many (sm_90 and up), else 1 (or 0) */
} cuda_src;

/* Prints k as one `extern "C" __global__` function named k->name whose
 * parameters are the buffers (T *, in parameter order) then the sizes
 * (long long).  EM_ERR_UNSUPPORTED for IR it cannot map (f16/bf16),
 * EM_ERR_ARG for IR that fails kir_verify.  A parallel extent that is
 * neither a constant nor a size parameter gives a CU_SERIAL kernel. */
em_status cuda_emit(const k_kernel *k, cuda_src *out);
/* cuda_emit for compute capability arch (90: sm_90; 0: unknown, as
 * cuda_emit): from 90 on, a rows kernel whose rows are too long for one
 * block's registers splits each row over a thread-block cluster
 * (out->cluster blocks, combined through distributed shared memory;
 * cuda_emit.c says when).  Every other kernel's text is cuda_emit's. */
em_status cuda_emit_for(const k_kernel *k, int arch, cuda_src *out);

/* A rows kernel's free schedule parameters (autotuning, docs/cuda.md#autotuning);
 * 0 in a field: its default.  The environment's knobs override them
 * (EMBER_CUDA_ROW_ELEMS, EMBER_CUDA_ROW_LANE_BYTES, EMBER_CUDA_ROW_VEC), so
 * a candidate the knobs fix prints the same text as the default. */
enum { CUDA_ROW_ELEMS = 32, CUDA_ROW_LANE_BYTES = 64 };
typedef struct cuda_row_params {
    int elems;      /* elements per thread a rows kernel aims for, 1..64
                       (twice that in a half-typed row longer than a warp's) */
    int lane_bytes; /* bytes a lane of a short row aims for, 4..4096 */
    int vec;        /* the 16-byte variant: 0 default (on), 1 on, -1 off */
} cuda_row_params;
/* cuda_emit_for arch with the rows kernels' parameters p (NULL: defaults). */
em_status cuda_emit_with(const k_kernel *k, int arch, const cuda_row_params *p, cuda_src *out);

/* CUDA C device functions em_from_f16, em_from_bf16 (exact), em_to_f16 and
 * em_to_bf16 (round to nearest even, as the CPU's conversions): printed
 * into every kernel that has half buffers, and into cuda_native's. */
extern const char cuda_half_helpers[];
void cuda_src_free(cuda_src *s);
/* The definition of EM_AFTER_PRIOR(), the statement every kernel text
 * begins each __global__ function with (cuda_launch_fn's programmatic
 * dependent launch relies on it). */
extern const char cuda_after_prior[];
/* cuda_after_prior, then src's text, followed by the definitions of
 *   extern "C" __constant__ unsigned char NAME__key[16] = {key's bytes};
 *   extern "C" __constant__ long long NAME__launch[9] =
 *       {shape, threads, unroll, extent, extent_size, vec4, nbufs, nsizes,
 *        cluster};
 * (em_malloc'd, or NULL).  The key is the cache key the image is compiled
 * for, which a loader reads back from the module (cuModuleGetGlobal) and
 * compares with the key it looked the image up by, so that an image filed
 * under another kernel's key is refused.  The launch descriptor is how
 * the image must be launched: a loader needs neither the kernel IR nor
 * the CUDA C text (a plan cache hit lowers nothing).  NULL with
 * EM_ERR_STATE when a __global__ function of the text does not begin with
 * EM_AFTER_PRIOR();. */
char *cuda_text_with_key(const cuda_src *src, const char *name, const uint8_t key[16]);
#define CUDA_KEY_SUFFIX "__key"
#define CUDA_LAUNCH_SUFFIX "__launch"
#define CUDA_LAUNCH_WORDS 9

/* The version of the generator: part of every cache key. */
#define CUDA_EMIT_VERSION "cuda-emit-8" /* 8: half rows longer than a warp's take 2x the elements a thread; 7: long rows over thread-block clusters, cluster in the launch descriptor; 6: kernels begin with EM_AFTER_PRIOR (programmatic dependent launch); 5: rows a part of a warp, 16-byte rows steps; 4: tiled transposes; 3: extents as size parameters, launch descriptor */

#endif
