/* guards.h - the checks that decide whether a captured graph applies to a
 * call (src/guards).
 *
 * A guard set is built at the end of a trace from the call's arguments: for
 * each input tensor its dtype, device, rank, sizes and strides (strides of
 * size-1 dims are free: no kernel reads them), for each scalar its value
 * (bitwise), and for each captured constant found in a watched slot, the
 * slot's identity.  gd_check is the fast path run on every call;
 * gd_explain says, in words, why a call does not match.
 * Ownership: a guard set owns copies of everything it compares. */
#ifndef EMBER_GUARDS_H
#define EMBER_GUARDS_H

#include "trace.h"

typedef struct gd_tensor {
    em_dtype dtype;
    em_device device;
    int ndim;
    int64_t sizes[EM_MAX_DIMS];   /* as traced; dynamic dims: only their lower bound */
    int64_t strides[EM_MAX_DIMS]; /* 0 where the size is 0 or 1 */
    /* Dynamic shapes: dims (bit d: dim d) whose size may vary.  When the
     * traced layout was dense (a permutation of a contiguous tensor), the
     * guard checks that same layout for the call's sizes (order: the dims
     * of size > 1 and the dynamic ones, outermost first); otherwise the
     * exact strides. */
    uint32_t dyn;
    /* The dynamic dims that may be 1 (the others must be >= 2, as
     * torch's 0/1 specialization): traced at 1, or shown by a dry trace at
     * 1 to give the same graph (gd_allow_one). */
    uint32_t one;
    bool dense;
    int norder;
    int8_t order[EM_MAX_DIMS];
    /* A dynamic dim's divisor (0 or 1: none): its size must be a multiple
     * (a reshape splits it: [b, t / 2, 16] of [b, t, 8]). */
    int64_t div[EM_MAX_DIMS];
} gd_tensor;

typedef struct gd_watch {
    em_tensor *const *slot;  /* where the user keeps the tensor */
    const em_tensor *expect; /* the tensor the graph captured */
} gd_watch;

/* Two dynamic dims an entry was traced and checked with as one size (duck
 * sizing: equal when traced, one probe): input i's dim d must equal input
 * j's dim k, as torch guards Eq(s0, s1). */
typedef struct gd_tie {
    int i, d, j, k;
} gd_tie;

typedef struct gd_guards {
    int ntensors;
    gd_tensor *tensors;
    gd_tie *ties;
    int nties;
    char **names;            /* input names, for messages */
    int nscalars;
    double *scalars;
    int nwatch;
    gd_watch *watch;
    em_dtype autocast;       /* the thread's autocast dtype at the trace (EM_F32: none):
                                the graph holds its casts */
} gd_guards;

/* Guards for a graph traced with inputs in and scalars: constants of g
 * found in one of the nwatch slots are guarded on identity. */
gd_guards *gd_build(const tr_graph *g, em_tensor *const *in, const double *scalars,
                    int nscalars, em_tensor *const *const *watch, int nwatch);
void gd_free(gd_guards *gs);
/* Lets the sizes of input i's dims in mask dims vary, and only those
 * (each >= 2, or >= 1 for a dim traced at 1; dims traced at 0 are
 * ignored).  gd_make_static undoes it for every input: the guards then
 * check the traced sizes again. */
void gd_set_dynamic(gd_guards *gs, int i, uint32_t dims);
/* Lets input i's dynamic dims in dims be 1 as well. */
void gd_allow_one(gd_guards *gs, int i, uint32_t dims);
/* Requires dynamic dim d of input i to be a multiple of q (> 1) as well;
 * false when d is not dynamic or its traced size is not one. */
bool gd_set_divisor(gd_guards *gs, int i, int d, int64_t q);
/* Ties every dynamic dim to the first dynamic dim of its traced size (in
 * input and dim order), replacing the ties there were; an error when out
 * of memory.  gd_set_dynamic does not tie: the caller ties the final
 * set, once. */
em_status gd_tie_dynamic(gd_guards *gs);
void gd_make_static(gd_guards *gs);
/* Whether any input has a dynamic dim. */
bool gd_is_dynamic(const gd_guards *gs);
/* Whether the call (in, scalars) passes every guard. */
bool gd_check(const gd_guards *gs, em_tensor *const *in, const double *scalars);
/* The first guard the call fails, as a sentence (empty if none fails).
 * Returns how many guards passed before it: among several entries, the
 * one that got furthest gives the most useful explanation. */
int gd_explain(const gd_guards *gs, em_tensor *const *in, const double *scalars, char *buf,
               size_t n);
em_status gd_print(const gd_guards *gs, FILE *f);

#endif
