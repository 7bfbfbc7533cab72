/* cpu_gccjit.h - the CPU code generator: kernel IR (kir.h) -> libgccjit ->
 * native code.
 *
 * A compiled kernel is a shared object exporting two functions:
 *
 *   void NAME(void *const *bufs, const int64_t *sizes, int64_t begin, int64_t end);
 *       runs the kernel.  bufs[i] is buffer parameter #i (typed by its
 *       K_BUF), sizes[i] size parameter #i.  If the kernel has a parallel
 *       range, only its iterations [begin, end) (clipped to [0, extent))
 *       run; otherwise begin and end are ignored and everything runs.
 *   const unsigned char NAME__key[16];
 *       the cache key the object was compiled for (jit_cpu_kernel_key):
 *       a loader checks it, so that an object filed under another key is
 *       refused, not run (jit_cpu_load_fd).
 *   int64_t NAME__plan(void *const *bufs, const int64_t *sizes, double *work);
 *       the extent of the parallel range for these arguments, or -1 when
 *       the kernel must run as one call (no parallel range, or code outside
 *       it that the threads would race on: stores or accumulators at the
 *       top level); *work: estimated scalar operations per iteration of the
 *       parallel range (inner extents known at the top level multiplied in).
 *
 * jit_cpu_run splits the parallel range over em_parallel_for's threads with
 * a grain of about 64K operations, so that small kernels run on the calling
 * thread.  Code generation: -O3, -march=x86-64-v4/v3/v2 as the running CPU
 * supports (cpuid), -fno-math-errno -fno-trapping-math (no -ffast-math:
 * NaN, inf and signed zeros keep IEEE semantics); float32 exp, log, tanh,
 * sigmoid, erf, gelu, gelu_tanh are vmath.h's approximations, inlined
 * (vectorizable); float64 ones call libm.  Float add reductions in an
 * innermost loop accumulate into 16 (f32) or 8 (f64) partial sums, float
 * max/min reductions compare order-preserving integer keys, so that both
 * vectorize without -ffast-math.  f16 and bf16 are computed in f32 (loads
 * convert up, stores round to nearest even).
 *
 * Dtype semantics follow the eager CPU kernels: i32 arithmetic wraps (i64
 * is signed C arithmetic: it is index arithmetic, which gcc analyses
 * assuming no overflow); float max/min propagate NaN; float -> int casts
 * truncate, saturate, NaN -> 0; anything -> bool is x != 0; bool values
 * are bytes 0/1.  KA_IDIV/KA_MOD (integer, non-negative operands) by 0
 * give a and 0 instead of trapping. */
#ifndef EMBER_CPU_GCCJIT_H
#define EMBER_CPU_GCCJIT_H

#include "cache.h"
#include "kir.h"

typedef struct jit_cpu_kernel jit_cpu_kernel;

typedef void (*jit_cpu_fn)(void *const *bufs, const int64_t *sizes, int64_t begin, int64_t end);

/* Compiles k in process.  EM_ERR_ARG for IR that fails kir_verify (or a
 * kernel name longer than 200 characters), EM_ERR_UNSUPPORTED for dtypes
 * the generator lacks, EM_ERR_STATE with libgccjit's first
 * error message when compilation fails. */
em_status jit_cpu_compile(const k_kernel *k, jit_cpu_kernel **out);
/* Runs the whole iteration space, split over threads when it pays. */
em_status jit_cpu_run(const jit_cpu_kernel *ck, void *const *bufs, const int64_t *sizes);
/* Compiles k to a shared object at path, its functions named k->name,
 * with NAME__key holding jit_cpu_kernel_key(k) (for tests and tools). */
em_status jit_cpu_write_so(const k_kernel *k, const char *path);

/* A compile unit: ks[0..n) (1 <= n <= JIT_CPU_UNIT_MAX) compiled in one
 * libgccjit context into one shared object at path, each kernel's
 * functions named by its key (jit_cpu_symbol), each with its NAME__key:
 * what the engine stores under every one of the n keys (one object holds
 * the n kernels; a loader takes the one its key names).  One context pays
 * libgccjit's fixed cost per compile (the assembler and the linker, ~30
 * ms) once for the n kernels.  Any kernel's error fails the unit. */
#define JIT_CPU_UNIT_MAX 16
em_status jit_cpu_write_unit(k_kernel *const *ks, int n, const char *path);
/* The name of the kernel filed under key in a unit: "k_" and the key's
 * hex. */
#define JIT_CPU_SYMBOL_SIZE (2 + KC_KEY_HEX_SIZE)
void jit_cpu_symbol(const kc_key *key, char out[JIT_CPU_SYMBOL_SIZE]);
/* Loads a shared object written by jit_cpu_write_so for the kernel name
 * (no key check: for tests and tools). */
em_status jit_cpu_load_so(const char *path, const char *name, jit_cpu_kernel **out);
/* Loads the kernel named by key (jit_cpu_symbol) from the shared object
 * in the open file fd (a sealed memory file from kc_get_fd: exactly the
 * verified bytes; a compile unit's) and checks that its NAME__key is
 * key: EM_ERR_STATE when it is missing or another key's (an artifact
 * filed under the wrong key), which the caller treats as a miss.  fd is
 * the caller's (it may be closed once this returns). */
em_status jit_cpu_load_fd(int fd, const kc_key *key, jit_cpu_kernel **out);
/* The cache key of k's shared object: the field "ember cpu kernel",
 * jit_cpu_target() and k's printed IR; m (may be NULL) gets its manifest
 * (fields what, target, kernel_ir). */
bool jit_cpu_kernel_key(const k_kernel *k, kc_key *key, kc_manifest *m);
void jit_cpu_free(jit_cpu_kernel *ck);
/* What the generated code depends on besides the kernel IR: libgccjit's
 * version, the generator's version and the target options (part of every
 * cache key).  A per-thread buffer, valid until the thread's next call. */
const char *jit_cpu_target(void);
/* The architecture level generated for ("x86-64-v4"...; "" when none is
 * passed): EMBER_JIT_MARCH, else what the running CPU supports. */
const char *jit_cpu_march(void);

/* For tests and tools: the generated entry point, and a run that cuts the
 * parallel range into exactly nchunks contiguous pieces (spread over the
 * threads em_parallel_for has; with one thread, run in order). */
jit_cpu_fn jit_cpu_entry(const jit_cpu_kernel *ck);
em_status jit_cpu_run_chunks(const jit_cpu_kernel *ck, void *const *bufs, const int64_t *sizes,
                             int nchunks);

#endif
