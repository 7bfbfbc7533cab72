/* cuda_eager.h - the CUDA device for eager ops (cuda_backend.c, the
 * em_backend table) and for compiled graphs (backend_cuda.c, the "cuda"
 * jit backend), with matmul through cuBLAS (cuda_matmul.c). */
#ifndef EMBER_CUDA_EAGER_H
#define EMBER_CUDA_EAGER_H

#include "cache.h"
#include "cuda_kernel.h"
#include "cuda_lib.h"
#include "engine.h"

#ifdef EMBER_HAVE_CUDA

/* out = c's matmul on device d via cuBLAS; EM_ERR_UNSUPPORTED for dtypes
 * and layouts it does not take (the caller then uses the host). */
em_status cuda_matmul(cuda_device *d, const em_op_call *c, em_tensor *out);
/* out = c's linear (act(a @ w + bias)) on device d as one cuBLASLt matmul
 * whose epilogue adds the bias and applies the activation;
 * EM_ERR_UNSUPPORTED where cuBLASLt is missing or off (EMBER_CUDA_LT=0),
 * for layouts it does not take, and where its heuristic has no algorithm
 * (the caller then runs the matmul, add and act apart); EM_ERR_DEVICE
 * with cuBLASLt's status name when a call fails. */
em_status cuda_linear(cuda_device *d, const em_op_call *c, em_tensor *out);
/* Whether cuda_linear may run a linear of these metas and act (dtypes,
 * ranks, cuBLASLt loaded and on): what the linear pass asks the device. */
bool cuda_linear_takes(const em_meta *a, const em_meta *w, const em_meta *bias, em_act act);
/* Whether cuBLASLt is used (EMBER_CUDA_LT, default on; 0: off). */
bool cuda_lt_enabled(void);

/* out = c's fused attention (the attention op) on device d, one generated
 * kernel (cuda_attention.c); its compile or load is counted in stats.
 * EM_ERR_UNSUPPORTED for head sizes it does not take (the caller then
 * uses the host, whose kernel takes f32 only: half operands past the
 * kernel's sizes, or before sm_80, fail there; the attention pass asks
 * cuda_attention_takes first). */
em_status cuda_attention(cuda_device *d, const em_op_call *c, em_tensor *out, cuda_get_stats *stats);
/* The kernel's CUDA C for head sizes D (q, k) and Dv (v), causal, an
 * additive mask (0: none, 1: any strides, 2: unit column stride) and nb
 * batch dims, for tensor cores (mma: sm_80 on) or CUDA cores (em_malloc'd;
 * exposed for tests, which compile it with NVRTC alone). */
char *cuda_attention_text(int64_t D, int64_t Dv, bool causal, int mask, int nb, bool mma);
/* The tensor-core kernel's text for f16 or bf16 operands (dt); NULL
 * (EM_ERR_ARG) for another dtype or past its head sizes. */
char *cuda_attention_half_text(em_dtype dt, int64_t D, int64_t Dv, bool causal, int mask, int nb);
/* Whether cuda:index runs the fused attention op on dt operands with head
 * sizes D, Dv on the device (f32: always, past the kernel's head sizes on
 * the host; f16/bf16: sm_80 on, within the kernel's head sizes), so the
 * attention pass may make it (jit_device.fused_attention_takes). */
bool cuda_attention_takes(int index, em_dtype dt, int64_t D, int64_t Dv);
/* The decode kernel's (at most 8 queries: keys split over blocks), mask
 * 0 or 1; NULL (EM_ERR_ARG) past its head sizes. */
char *cuda_attention_decode_text(int64_t D, int64_t Dv, bool causal, int mask, int nb);

/* The kernel cache eager CUDA ops use (opened once per process; NULL when
 * it could not be opened), and how many kernels eager ops compiled and
 * loaded so far in this process. */
kc_cache *cuda_eager_cache(void);
/* The log eager ops' kernel lookups report to (EMBER_LOG, opened once). */
const jit_log *cuda_eager_log(void);
void cuda_eager_stats(int64_t *compiled, int64_t *loaded);

/* ---- cuda_native.c: ops as generated CUDA C (cuda_source.h) ----
 * cat, index_select, arange, rand, randn and argmax, on the GPU without a
 * host copy or a wait (cuda_native.c says how; index_select's bad indices
 * surface at the next cuda_sync as EM_ERR_INDEX). */

/* Whether op has a native kernel. */
bool cuda_native_takes(em_op op);
/* out = c on device d; kernels are looked up through the eager kernel
 * cache, counted in stats. */
struct cuda_get_stats; /* cuda_kernel.h */
em_status cuda_native_run(cuda_device *d, const em_op_call *c, em_tensor *out,
                          struct cuda_get_stats *stats);
/* The generators (em_malloc'd text defining JIT_KERNEL_NAME, or NULL with
 * the error set; exposed so tests compile each with NVRTC alone):
 * the strided copy of esize-byte elements over nd dims (cat), gathering
 * one dim through i32/i64 indices when idx is EM_I32 or EM_I64
 * (index_select; any other value: no gather), or with scatter writing
 * that dim through them (index_copy_: the elements walked are the
 * source's); arange of dtype d (exact:
 * int64 arithmetic, integer dtypes only); rand/randn (normal) of f32/f64;
 * argmax of a d tensor whose outputs walk nd dims. */
char *cuda_native_copy_text(size_t esize, int nd, em_dtype idx, bool scatter);
char *cuda_native_arange_text(em_dtype d, bool exact);
char *cuda_native_rand_text(em_dtype d, bool normal);
char *cuda_native_argmax_text(em_dtype d, int nd, int pass);
/* out = a @ b (matmul) or a @ b + bias (linear) by cuda_native.c's
 * skinny kernels (f32, a of at most 8 rows, b a row-major [K, N] with
 * N % 4 == 0, b and bias 16-byte aligned, the bias's last stride 1):
 * EM_ERR_UNSUPPORTED (no error worth keeping) for anything else, which
 * cuBLAS then runs. */
em_status cuda_native_skinny_matmul(cuda_device *d, const em_op_call *c, em_tensor *out,
                                    struct cuda_get_stats *stats);
/* Whether the skinny kernel takes a @ b (+ bias, NULL: none) by their
 * metas, alignment aside: what the CUDA device asks before the linear
 * pass fuses a bias into a matmul. */
bool cuda_native_skinny_takes(const em_meta *a, const em_meta *b, const em_meta *bias);
/* Its kernel's text, for m rows (1..8). */
char *cuda_native_skinny_text(int m);
/* Column reductions: sum, mean, amax, amin over one block of leading or
 * middle dims of a contiguous input, as [A, R, C] -> [A, C] (whether c is
 * one: cuda_native_column_reduction); the kernel reading in, accumulating
 * in acc, writing o (final: mean's division and the result's rounding). */
bool cuda_native_column_reduction(const em_op_call *c, int64_t *A, int64_t *R, int64_t *C);
em_status cuda_native_reduce_columns(cuda_device *d, const em_op_call *c, em_tensor *out,
                                     struct cuda_get_stats *stats);
char *cuda_native_colreduce_text(em_op op, em_dtype in, em_dtype acc, em_dtype o, bool final);

/* ---- cuda_graph.c: the engine's device graphs (engine.h), as CUDA graphs ---- */
em_status cuda_graph_capture_begin(int index, jit_capture **out);
em_status cuda_graph_capture_end(jit_capture *c, bool ok, jit_graph **out);
em_status cuda_graph_launch(jit_graph *g);
size_t cuda_graph_bytes(const jit_graph *g);
void cuda_graph_free(jit_graph *g);

#endif
#endif
