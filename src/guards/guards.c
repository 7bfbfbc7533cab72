/* guards.c - building, checking and explaining guard sets. */
#include "guards.h"

#include <string.h>

void gd_free(gd_guards *gs) {
    if (!gs) return;
    for (int i = 0; gs->names && i < gs->ntensors; i++) em_free(gs->names[i]);
    em_free(gs->names);
    em_free(gs->tensors);
    em_free(gs->ties);
    em_free(gs->scalars);
    em_free(gs->watch);
    em_free(gs);
}

static void guard_of(gd_tensor *gt, const em_tensor *t) {
    memset(gt, 0, sizeof *gt);
    gt->dtype = t->dtype;
    gt->device = t->device;
    gt->ndim = t->ndim;
    for (int d = 0; d < t->ndim; d++) {
        gt->sizes[d] = t->sizes[d];
        gt->strides[d] = t->sizes[d] > 1 ? t->strides[d] : 0;
    }
}

static void *dup_array(const void *p, size_t n) {
    void *q = em_malloc(n ? n : 1);
    if (q && n) memcpy(q, p, n);
    return q;
}

static size_t ptr_slot(const void *p, size_t cap) {
    return (size_t)(((uint64_t)(uintptr_t)p * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

/* Each constant of g that a watched slot holds, guarded on that slot (the
 * first slot that holds it), in constant order.  The slots' tensors are
 * hashed: comparing every constant with every slot was O(constants x
 * slots), a graph of many constants against a model's weight list. */
static em_status watch_consts(gd_guards *gs, const tr_graph *g, em_tensor *const *const *watch,
                              int nwatch) {
    if (nwatch == 0 || g->nconsts == 0) return EM_OK;
    size_t cap = 16;
    while (cap < 2 * (size_t)nwatch) cap *= 2;
    int *table = em_malloc(sizeof(int) * cap); /* slot index, -1 empty */
    if (!table) return em_last_status();
    memset(table, -1, sizeof(int) * cap);
    for (int w = 0; w < nwatch; w++) {
        if (!*watch[w]) continue;
        size_t h = ptr_slot(*watch[w], cap);
        while (table[h] >= 0 && *watch[table[h]] != *watch[w]) h = (h + 1) & (cap - 1);
        if (table[h] < 0) table[h] = w; /* the first slot holding it */
    }
    for (int c = 0; c < g->nconsts; c++) {
        size_t h = ptr_slot(g->consts[c], cap);
        while (table[h] >= 0 && *watch[table[h]] != g->consts[c]) h = (h + 1) & (cap - 1);
        if (table[h] >= 0) gs->watch[gs->nwatch++] = (gd_watch){watch[table[h]], g->consts[c]};
    }
    em_free(table);
    return EM_OK;
}

gd_guards *gd_build(const tr_graph *g, em_tensor *const *in, const double *scalars,
                    int nscalars, em_tensor *const *const *watch, int nwatch) {
    gd_guards *gs = em_calloc(1, sizeof *gs);
    if (!gs) return NULL;
    gs->ntensors = g->ninputs;
    gs->tensors = em_calloc((size_t)(g->ninputs ? g->ninputs : 1), sizeof *gs->tensors);
    gs->names = em_calloc((size_t)(g->ninputs ? g->ninputs : 1), sizeof *gs->names);
    gs->nscalars = nscalars;
    gs->scalars = dup_array(scalars, sizeof(double) * (size_t)nscalars);
    gs->watch = em_calloc((size_t)(nwatch ? nwatch : 1), sizeof *gs->watch);
    if (!gs->tensors || !gs->names || !gs->scalars || !gs->watch) goto fail;
    /* the inputs come first in a graph em_compile makes (tr_inputs_first):
     * the search ends at the last one, not at the graph's end */
    for (int i = 0, found = 0; i < g->nnodes && found < g->ninputs; i++) {
        const tr_node *n = &g->nodes[i];
        if (n->kind != TR_INPUT) continue;
        found++;
        guard_of(&gs->tensors[n->index], in[n->index]);
        gs->names[n->index] = dup_array(n->name, strlen(n->name) + 1);
        if (!gs->names[n->index]) goto fail;
    }
    /* a constant is guarded on identity when the user told us where it lives */
    if (watch_consts(gs, g, watch, nwatch) != EM_OK) goto fail;
    gs->autocast = em_autocast_dtype();
    return gs;
fail:
    gd_free(gs);
    return NULL;
}

/* Whether the traced layout of g is dense; if so, fills its order. */
static bool find_order(gd_tensor *g) {
    int n = 0;
    for (int d = 0; d < g->ndim; d++)
        if (g->sizes[d] > 1 || (g->dyn >> d & 1)) g->order[n++] = (int8_t)d;
    /* insertion sort by stride, largest first (n <= 8) */
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && g->strides[g->order[j]] > g->strides[g->order[j - 1]]; j--) {
            int8_t t = g->order[j];
            g->order[j] = g->order[j - 1];
            g->order[j - 1] = t;
        }
    int64_t expect = 1;
    for (int i = n - 1; i >= 0; i--) {
        if (g->strides[g->order[i]] != expect) return false;
        expect *= g->sizes[g->order[i]];
    }
    g->norder = n;
    return true;
}

/* The stride a dim traced at size 1 (whose stride no kernel read) takes
 * in a dense layout when it becomes dynamic: where row-major order puts
 * it, outside the next dim of size > 1. */
static int64_t unit_stride(const gd_tensor *g, int d) {
    for (int k = d + 1; k < g->ndim; k++)
        if (g->sizes[k] > 1) return g->strides[k] * g->sizes[k];
    return 1;
}

void gd_set_dynamic(gd_guards *gs, int i, uint32_t dims) {
    gd_tensor *g = &gs->tensors[i];
    gs->nties = 0; /* the caller ties the final set (gd_tie_dynamic) */
    g->dyn = g->one = 0;
    g->dense = false;
    for (int d = 0; d < g->ndim; d++) {
        bool dyn = g->sizes[d] > 0 && (dims >> d & 1);
        if (dyn) g->dyn |= 1u << d;
        else g->div[d] = 0;
        if (g->sizes[d] == 1) g->strides[d] = 0;
    }
    for (int d = 0; d < g->ndim; d++)
        if ((g->dyn >> d & 1) && g->sizes[d] == 1) {
            g->one |= 1u << d;
            g->strides[d] = unit_stride(g, d);
        }
    if (g->dyn) g->dense = find_order(g);
}

void gd_allow_one(gd_guards *gs, int i, uint32_t dims) { gs->tensors[i].one |= dims & gs->tensors[i].dyn; }

bool gd_set_divisor(gd_guards *gs, int i, int d, int64_t q) {
    gd_tensor *g = &gs->tensors[i];
    if (d < 0 || d >= g->ndim || !(g->dyn >> d & 1) || q < 2 || g->sizes[d] % q) return false;
    g->div[d] = q;
    return true;
}

/* The first dynamic dim (in input and dim order) of traced size v. */
static void first_of_size(const gd_guards *gs, int64_t v, int *j, int *k) {
    for (*j = 0; *j < gs->ntensors; (*j)++)
        for (*k = 0; *k < gs->tensors[*j].ndim; (*k)++)
            if ((gs->tensors[*j].dyn >> *k & 1) && gs->tensors[*j].sizes[*k] == v) return;
}

em_status gd_tie_dynamic(gd_guards *gs) {
    gs->nties = 0;
    int n = 0;
    for (int i = 0; i < gs->ntensors; i++) n += __builtin_popcount(gs->tensors[i].dyn);
    gd_tie *t = em_malloc(sizeof *t * ((size_t)n + 1));
    if (!t) return em_last_status();
    em_free(gs->ties);
    gs->ties = t;
    for (int i = 0; i < gs->ntensors; i++)
        for (int d = 0; d < gs->tensors[i].ndim; d++) {
            if (!(gs->tensors[i].dyn >> d & 1)) continue;
            int j, k;
            first_of_size(gs, gs->tensors[i].sizes[d], &j, &k);
            if (j != i || k != d) gs->ties[gs->nties++] = (gd_tie){i, d, j, k};
        }
    return EM_OK;
}

void gd_make_static(gd_guards *gs) {
    gs->nties = 0;
    for (int i = 0; i < gs->ntensors; i++) {
        gs->tensors[i].dyn = gs->tensors[i].one = 0;
        gs->tensors[i].dense = false;
        for (int d = 0; d < gs->tensors[i].ndim; d++)
            if (gs->tensors[i].sizes[d] == 1) gs->tensors[i].strides[d] = 0;
        memset(gs->tensors[i].div, 0, sizeof gs->tensors[i].div);
    }
}

bool gd_is_dynamic(const gd_guards *gs) {
    for (int i = 0; i < gs->ntensors; i++)
        if (gs->tensors[i].dyn) return true;
    return false;
}

/* The least size dynamic dim d of g takes. */
static inline int64_t least(const gd_tensor *g, int d) { return g->one >> d & 1 ? 1 : 2; }

/* Dynamic dims: each at least its least size (and a multiple of its
 * divisor), and the layout the kernels were made for (a dim of size 1
 * has no stride that matters). */
static bool dynamic_ok(const gd_tensor *g, const em_tensor *t) {
    for (int d = 0; d < g->ndim; d++) {
        if (g->dyn >> d & 1 ? t->sizes[d] < least(g, d) || (g->div[d] > 1 && t->sizes[d] % g->div[d])
                            : t->sizes[d] != g->sizes[d])
            return false;
        if (!g->dense && t->sizes[d] > 1 && t->strides[d] != g->strides[d]) return false;
    }
    int64_t expect = 1;
    for (int i = g->dense ? g->norder - 1 : -1; i >= 0; i--) {
        int d = g->order[i];
        if (t->sizes[d] != 1 && t->strides[d] != expect) return false;
        expect *= t->sizes[d];
    }
    return true;
}

/* The fast path: called on every call of a compiled function, for every
 * entry until one matches.  Straight-line compares, no allocation. */
static inline bool tensor_ok(const gd_tensor *g, const em_tensor *t) {
    if (t->dtype != g->dtype || t->ndim != g->ndim || t->device.type != g->device.type ||
        t->device.index != g->device.index)
        return false;
    if (g->dyn) return dynamic_ok(g, t);
    for (int d = 0; d < g->ndim; d++) {
        if (t->sizes[d] != g->sizes[d]) return false;
        if (g->sizes[d] > 1 && t->strides[d] != g->strides[d]) return false;
    }
    return true;
}

bool gd_check(const gd_guards *gs, em_tensor *const *in, const double *scalars) {
    for (int i = 0; i < gs->ntensors; i++)
        if (!tensor_ok(&gs->tensors[i], in[i])) return false;
    for (int t = 0; t < gs->nties; t++) {
        const gd_tie *e = &gs->ties[t];
        if (in[e->i]->sizes[e->d] != in[e->j]->sizes[e->k]) return false;
    }
    if (gs->nscalars && memcmp(gs->scalars, scalars, sizeof(double) * (size_t)gs->nscalars))
        return false;
    for (int w = 0; w < gs->nwatch; w++)
        if (*gs->watch[w].slot != gs->watch[w].expect) return false;
    return em_autocast_dtype() == gs->autocast;
}

/* The strides g accepts for t's sizes (dims of size > 1): the traced
 * ones, or for a dense dynamic layout, that layout at t's sizes. */
static void expected_strides(const gd_tensor *g, const em_tensor *t, int64_t *want) {
    memcpy(want, g->strides, sizeof(int64_t) * (size_t)g->ndim);
    int64_t st = 1;
    for (int i = g->dyn && g->dense ? g->norder - 1 : -1; i >= 0; i--) {
        want[g->order[i]] = st;
        st *= t->sizes[g->order[i]];
    }
}

/* "autocast to bf16", or "no autocast". */
static const char *autocast_name(em_dtype d) {
    return d == EM_BF16 ? "autocast to bf16" : d == EM_F16 ? "autocast to f16" : "no autocast";
}

int gd_explain(const gd_guards *gs, em_tensor *const *in, const double *scalars, char *buf,
               size_t n) {
    char a[32], b[32];
    int passed = 0;
    buf[0] = '\0';
    for (int i = 0; i < gs->ntensors; i++) {
        const gd_tensor *g = &gs->tensors[i];
        const em_tensor *t = in[i];
        const char *nm = gs->names[i];
        if (t->dtype != g->dtype) {
            snprintf(buf, n, "input %d (%s): dtype mismatch: expected %s, got %s", i, nm,
                     em_dtype_name(g->dtype), em_dtype_name(t->dtype));
            return passed;
        }
        if (!em_same_device(t->device, g->device) || t->device.index != g->device.index) {
            snprintf(buf, n, "input %d (%s): device mismatch: expected %s, got %s", i, nm,
                     em_device_name(g->device, a, sizeof a), em_device_name(t->device, b, sizeof b));
            return passed;
        }
        if (t->ndim != g->ndim) {
            snprintf(buf, n, "input %d (%s): rank mismatch: expected %d dims, got %d", i, nm,
                     g->ndim, t->ndim);
            return passed;
        }
        passed += 3; /* dtype, device, rank */
        for (int d = 0; d < g->ndim; d++, passed++) {
            if (g->dyn >> d & 1) {
                int64_t lo = least(g, d);
                if (t->sizes[d] >= lo && (g->div[d] < 2 || t->sizes[d] % g->div[d] == 0)) continue;
                if (t->sizes[d] >= lo)
                    snprintf(buf, n, "%s[%d] (input %d dim %d) must be divisible by %lld, got %lld",
                             nm, d, i, d, (long long)g->div[d], (long long)t->sizes[d]);
                else
                    snprintf(buf, n, "input %d (%s): size at dynamic dim %d is %lld (%s)", i, nm, d,
                             (long long)t->sizes[d],
                             lo == 1 ? "0 is specialized" : "0 and 1 are specialized: the function "
                             "traced at 1 gives another graph, or was never tried there");
                return passed;
            }
            if (t->sizes[d] != g->sizes[d]) {
                snprintf(buf, n, "input %d (%s): size mismatch at dim %d: expected %lld, got %lld",
                         i, nm, d, (long long)g->sizes[d], (long long)t->sizes[d]);
                return passed;
            }
        }
        int64_t want[EM_MAX_DIMS];
        expected_strides(g, t, want);
        for (int d = 0; d < g->ndim; d++, passed++) {
            if (t->sizes[d] > 1 && t->strides[d] != want[d]) {
                snprintf(buf, n,
                         "input %d (%s): stride mismatch at dim %d: expected %lld, got %lld", i,
                         nm, d, (long long)want[d], (long long)t->strides[d]);
                return passed;
            }
        }
    }
    for (int t = 0; t < gs->nties; t++, passed++) {
        const gd_tie *e = &gs->ties[t];
        if (in[e->i]->sizes[e->d] != in[e->j]->sizes[e->k]) {
            snprintf(buf, n, "%s[%d] (input %d dim %d) must equal %s[%d] (input %d dim %d), "
                     "got %lld and %lld", gs->names[e->i], e->d, e->i, e->d, gs->names[e->j], e->k,
                     e->j, e->k, (long long)in[e->i]->sizes[e->d], (long long)in[e->j]->sizes[e->k]);
            return passed;
        }
    }
    for (int i = 0; i < gs->nscalars; i++, passed++) {
        if (memcmp(&gs->scalars[i], &scalars[i], sizeof(double))) {
            snprintf(buf, n, "scalar %d: value mismatch: expected %.17g, got %.17g", i,
                     gs->scalars[i], scalars[i]);
            return passed;
        }
    }
    for (int w = 0; w < gs->nwatch; w++) {
        if (*gs->watch[w].slot != gs->watch[w].expect) {
            snprintf(buf, n, "a watched constant slot holds another tensor than the one captured");
            return passed;
        }
    }
    if (em_autocast_dtype() != gs->autocast) {
        snprintf(buf, n, "autocast: traced under %s, called under %s", autocast_name(gs->autocast),
                 autocast_name(em_autocast_dtype()));
        return passed;
    }
    return passed;
}

em_status gd_print(const gd_guards *gs, FILE *f) {
    if (gs->autocast != EM_F32) fprintf(f, "guard autocast == %s\n", em_dtype_name(gs->autocast));
    char shape[160], strides[160], dev[32];
    for (int i = 0; i < gs->ntensors; i++) {
        const gd_tensor *g = &gs->tensors[i];
        em_shape_str(g->ndim, g->sizes, shape, sizeof shape);
        em_shape_str(g->ndim, g->strides, strides, sizeof strides);
        fprintf(f, "guard input %d (%s): dtype=%s device=%s sizes=%s strides=%s", i,
                gs->names[i], em_dtype_name(g->dtype), em_device_name(g->device, dev, sizeof dev),
                shape, g->dyn && g->dense ? "dense" : strides);
        if (g->dyn) {
            fputs(" dynamic=[", f);
            for (int d = 0, first = 1; d < g->ndim; d++)
                if (g->dyn >> d & 1) fprintf(f, "%s%d", first ? "" : ", ", d), first = 0;
            fputs("] (", f);
            if (!g->one) fputs(">= 2", f);
            for (int d = 0, first = 1; g->one && d < g->ndim; d++)
                if (g->dyn >> d & 1)
                    fprintf(f, "%sdim %d >= %lld", first ? "" : ", ", d, (long long)least(g, d)), first = 0;
            fputc(')', f);
            for (int d = 0; d < g->ndim; d++)
                if (g->div[d] > 1) fprintf(f, " divisible=%d:%lld", d, (long long)g->div[d]);
        }
        fputc('\n', f);
    }
    for (int t = 0; t < gs->nties; t++) {
        const gd_tie *e = &gs->ties[t];
        fprintf(f, "guard %s[%d] (input %d dim %d) == %s[%d] (input %d dim %d)\n", gs->names[e->i],
                e->d, e->i, e->d, gs->names[e->j], e->k, e->j, e->k);
    }
    for (int i = 0; i < gs->nscalars; i++)
        fprintf(f, "guard scalar %d == %.17g\n", i, gs->scalars[i]);
    for (int w = 0; w < gs->nwatch; w++)
        fprintf(f, "guard watched slot %p holds the captured tensor %p\n",
                (const void *)gs->watch[w].slot, (const void *)gs->watch[w].expect);
    return EM_OK;
}
