/* test_bound.c - issue 22: the scheduler's recompute cost model and kernel
 * bound keep kernel code linear in the graph (the mixed chain, which used
 * to recompute itself before each mean), graphs of 10,000 nodes trace,
 * schedule and lower in bounded time with the expected counts, and the
 * splits compute what eager mode computes (odd sizes, size-1 dims,
 * broadcast inputs), checked against a float64 reference; and graphs of
 * 10,000 nodes of each kind compile and run with the counts their
 * structure implies (nodes after CSE and DCE, kernels, guards) and the
 * float64 reference's values. */
#include "testutil.h"
#include "../bench/synth.h"

#include "guards.h"
#include "schedule.h"
#include "trace.h"

#if __has_include(<valgrind/valgrind.h>)
#include <valgrind/valgrind.h>
#endif
#ifndef RUNNING_ON_VALGRIND
#define RUNNING_ON_VALGRIND 0
#endif

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The optimized graph of sy_fn on x and y, as em_compile captures it. */
static tr_graph *capture(const sy_graph *gr, em_tensor *x, em_tensor *y) {
    em_tensor *in[2] = {x, y}, *out = NULL;
    char why[256] = "";
    tr_recorder *r = tr_record_begin(2, in, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(sy_fn((void *)gr, in, NULL, &out), EM_OK);
    tr_graph *g = tr_record_end(r, 1, &out, why, sizeof why);
    ck_assert_msg(g != NULL, "record: %s %s", why, em_last_error());
    ck_assert_int_eq(tr_optimize(g, true), EM_OK);
    return g;
}

static int calls(const tr_graph *g) {
    int c = 0;
    for (int i = 0; i < g->nnodes; i++) c += g->nodes[i].kind == TR_CALL;
    return c;
}

typedef struct lowered {
    int kernels;   /* kernel steps */
    long insts;    /* kernel IR instructions, all kernels */
    long largest;  /* of the largest kernel */
    int stored;    /* values stored by kernels (outputs included) */
} lowered;

/* Schedules g and lowers every kernel step, each verified. */
static lowered lower_all(const tr_graph *g) {
    lowered r = {0, 0, 0, 0};
    sc_schedule *s = sc_build(g);
    ck_assert_msg(s != NULL, "sc_build: %s", em_last_error());
    int *bufs = malloc(sizeof(int) * ((size_t)g->nnodes + 1));
    for (int i = 0; i < s->nsteps; i++) {
        if (s->steps[i].kind != SC_KERNEL) continue;
        int nbufs, nouts;
        k_kernel *k = sc_lower(s, s->steps[i].group, bufs, &nbufs, &nouts);
        ck_assert_msg(k != NULL, "sc_lower: %s", em_last_error());
        ck_assert_msg(kir_verify(k) == EM_OK, "kir_verify: %s", em_last_error());
        r.kernels++;
        r.insts += k->n;
        r.stored += nouts;
        if (k->n > r.largest) r.largest = k->n;
        kir_free(k);
    }
    free(bufs);
    sc_free(s);
    return r;
}

static lowered lower_synth(sy_kind kind, int nodes, int64_t rows, int64_t cols) {
    sy_graph gr = {kind, nodes, false};
    em_tensor *x = tu_random(1, 2, TU_SIZES(rows, cols), EM_F32, 1.0);
    em_tensor *y = tu_random(2, 1, TU_SIZES(cols), EM_F32, 0.5);
    tr_graph *g = capture(&gr, x, y);
    lowered r = lower_all(g);
    tr_graph_free(g);
    return r;
}

/* The mixed chain's kernel code grows linearly: it was one kernel of 634,
 * 2,449 and 9,829 IR lines at 250, 500 and 1,000 nodes. */
START_TEST(mixed_chain_code_grows_linearly) {
    lowered a = lower_synth(SY_MIXED, 250, 16, 100), b = lower_synth(SY_MIXED, 500, 16, 100),
            c = lower_synth(SY_MIXED, 1000, 16, 100);
    ck_assert_msg(c.insts < 5 * a.insts && b.insts < 3 * a.insts,
                  "IR instructions %ld, %ld, %ld at 250, 500, 1000 nodes", a.insts, b.insts, c.insts);
    ck_assert_msg(c.largest <= 2 * a.largest, "largest kernel %ld at 250, %ld at 1000", a.largest,
                  c.largest);
    /* a kernel per mean or two, not one for the whole chain */
    ck_assert_int_ge(c.kernels, 1000 / SY_MEAN_EVERY / 2);
    ck_assert_int_le(c.kernels, 1000 / SY_MEAN_EVERY + 1);
}
END_TEST

/* em_compile of graph gr (on the cpu backend) against sy_ref. */
static void check_against_ref(sy_kind kind, int nodes, int64_t rows, int64_t cols, int min_kernels) {
    sy_graph gr = {kind, nodes, false};
    em_tensor *x = tu_random(3, 2, TU_SIZES(rows, cols), EM_F32, 1.0);
    em_tensor *y = tu_random(4, 1, TU_SIZES(cols), EM_F32, 0.5);
    em_compile_options o = {.ninputs = 2, .noutputs = 1, .name = "synth", .backend = "cpu"};
    em_compiled *f = em_compile(sy_fn, &gr, &o);
    ck_assert_ptr_nonnull(f);
    em_tensor *in[2] = {x, y}, *out;
    ck_assert_msg(em_call(f, in, NULL, &out) == EM_OK, "%s", em_last_error());
    ck_assert_msg(em_call(f, in, NULL, &out) == EM_OK, "%s", em_last_error());
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert_int_eq(st.hits, 1);
    ck_assert_msg(st.kernels >= min_kernels, "%d kernels", st.kernels);
    double *xv = tu_values(x), *yv = tu_values(y);
    double *ref = malloc(sizeof(double) * (size_t)(rows * cols));
    sy_ref(&gr, rows, cols, xv, yv, ref);
    tu_check_close(out, ref, 2, TU_SIZES(rows, cols), 1e-4, 1e-4);
    free(xv), free(yv), free(ref);
    em_compiled_free(f);
}

START_TEST(mixed_chain_matches_float64) {
    check_against_ref(SY_MIXED, 250, 16, 100, 3);
    check_against_ref(SY_MIXED, 500, 7, 33, 6);
    check_against_ref(SY_MIXED, 1000, 16, 100, 10);
}
END_TEST

/* The bound splits a long chain and a wide graph; both still compute the
 * reference. */
START_TEST(bounded_chain_and_wide_match_float64) {
    check_against_ref(SY_CHAIN, 1000, 5, 31, 3);
    check_against_ref(SY_WIDE, 1000, 5, 31, 3);
}
END_TEST

/* With a tiny bound, every kind of graph splits many times: the kernels
 * agree with eager mode on odd sizes, size-1 dims and broadcast inputs. */
START_TEST(splits_agree_with_eager_on_odd_shapes) {
    setenv("EMBER_KERNEL_MAX_WEIGHT", "40", 1);
    const int64_t shapes[][4] = {/* x, y */ {3, 7, 1, 7}, {1, 5, 1, 5}, {5, 1, 1, 1}, {4, 1, 1, 9},
                                 {1, 1, 1, 1}, {2, 3, 1, 1}};
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            sy_graph gr = {(sy_kind)k, 120, false};
            const int64_t *sh = shapes[i];
            em_tensor *x = tu_random(5 + i, 2, sh, EM_F32, 1.0);
            em_tensor *y = tu_random(6 + i, 2, sh + 2, EM_F32, 0.5);
            em_tensor *in[2] = {x, y}, *ref, *out;
            ck_assert_int_eq(sy_fn(&gr, in, NULL, &ref), EM_OK);
            em_compile_options o = {.ninputs = 2, .noutputs = 1, .name = "split", .backend = "cpu"};
            em_compiled *f = em_compile(sy_fn, &gr, &o);
            ck_assert_msg(em_call(f, in, NULL, &out) == EM_OK, "%s", em_last_error());
            ck_assert_msg(em_call(f, in, NULL, &out) == EM_OK, "%s", em_last_error());
            em_compile_stats st;
            em_compiled_stats(f, &st);
            ck_assert_msg(st.kernels >= 2 || em_numel(ref) == 1,
                          "%s %zu: %d kernels", sy_name(gr.kind), i, st.kernels);
            double *r = tu_values(ref);
            tu_check_close(out, r, em_ndim(ref), em_sizes(ref), 1e-4, 1e-4);
            free(r);
            em_compiled_free(f);
        }
    unsetenv("EMBER_KERNEL_MAX_WEIGHT");
}
END_TEST

/* A chain with an eager op (a matmul it does not read) in its middle and
 * a second output: cuts around it move the eager step, which must still
 * run before its reader. */
static em_status chain_around_eager(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)c, (void)s;
    em_tensor *h = in[0], *e = NULL;
    for (int i = 0; i < 60; i++) {
        if (i == 30) e = em_matmul(in[1], in[2]);
        if (i == 45) out[1] = h;
        h = sy_link(h, in[3], i, false);
    }
    out[0] = em_add(h, e);
    return out[0] && out[1] ? EM_OK : em_last_status();
}

START_TEST(cuts_move_eager_steps_in_order) {
    em_tensor *in[4] = {tu_random(9, 2, TU_SIZES(5, 7), EM_F32, 1.0),
                        tu_random(10, 2, TU_SIZES(5, 3), EM_F32, 1.0),
                        tu_random(11, 2, TU_SIZES(3, 7), EM_F32, 1.0),
                        tu_random(12, 1, TU_SIZES(7), EM_F32, 0.5)};
    const char *bounds[] = {"30", "40", "60", "384"};
    for (int b = 0; b < 4; b++) {
        setenv("EMBER_KERNEL_MAX_WEIGHT", bounds[b], 1);
        em_tensor *ref[2], *out[2];
        ck_assert_int_eq(chain_around_eager(NULL, in, NULL, ref), EM_OK);
        em_compile_options o = {.ninputs = 4, .noutputs = 2, .name = "eager_mid", .backend = "cpu"};
        em_compiled *f = em_compile(chain_around_eager, NULL, &o);
        ck_assert_msg(em_call(f, in, NULL, out) == EM_OK, "%s", em_last_error());
        ck_assert_msg(em_call(f, in, NULL, out) == EM_OK, "%s", em_last_error());
        for (int k = 0; k < 2; k++) {
            double *r = tu_values(ref[k]);
            tu_check_close(out[k], r, 2, TU_SIZES(5, 7), 1e-4, 1e-4);
            free(r);
        }
        em_compiled_free(f);
    }
    unsetenv("EMBER_KERNEL_MAX_WEIGHT");
}
END_TEST

/* 10,000 nodes: capture, the passes, scheduling and lowering stay near
 * linear (a generous bound: seconds, not minutes), with the counts the
 * graph implies. */
static void ten_thousand(sy_kind kind, int min_kernels, int max_kernels) {
    sy_graph gr = {kind, 10000, false};
    em_tensor *x = tu_random(7, 2, TU_SIZES(4, 8), EM_F32, 1.0);
    em_tensor *y = tu_random(8, 1, TU_SIZES(8), EM_F32, 0.5);
    double t0 = now();
    tr_graph *g = capture(&gr, x, y);
    double t1 = now();
    ck_assert_int_ge(calls(g), 10000);
    ck_assert_int_le(calls(g), 10004);
    lowered r = lower_all(g);
    double t2 = now();
    ck_assert_msg(r.kernels >= min_kernels && r.kernels <= max_kernels, "%s: %d kernels",
                  sy_name(kind), r.kernels);
    ck_assert_msg(r.largest < 384 * 8, "%s: a kernel of %ld instructions", sy_name(kind), r.largest);
    ck_assert_msg(t1 - t0 < 20 && t2 - t1 < 20, "%s: capture %.2f s, schedule and lower %.2f s",
                  sy_name(kind), t1 - t0, t2 - t1);
    tr_graph_free(g);
}

START_TEST(ten_thousand_nodes_schedule_in_bounded_time) {
    /* the bound's weight (schedule.c): a tanh 24, other ops 1, kernels of
     * 192 to 384; a chain's 4 links weigh 27, a wide branch 28 (5 nodes),
     * the mixed chain is cut at each mean and by the bound */
    ten_thousand(SY_CHAIN, 10000 / 4 * 27 / 384, 2 * 10000 / 4 * 27 / 192);
    ten_thousand(SY_WIDE, 10000 / 5 * 28 / 384, 2 * 10000 / 5 * 28 / 192);
    ten_thousand(SY_MIXED, 10000 / SY_MEAN_EVERY, 4 * 10000 / SY_MEAN_EVERY);
}
END_TEST

/* What a 10,000-node graph of each kind (relu for tanh) gives, as counted
 * on this scheduler: nodes after CSE and DCE (the inputs, one full() per
 * distinct scalar, the calls), plan kernels, distinct kernels (identical
 * ones compile once and are loaded once, shared). */
typedef struct scale_case {
    sy_kind kind;
    int nodes, kernels, distinct;
} scale_case;

/* The graph's counts at capture (nodes, guards), then em_compile's
 * (kernels: each compiled or found once, the rest shared) and values. */
static void check_scale(const scale_case *c) {
    sy_graph gr = {c->kind, 10000, true};
    em_tensor *x = tu_random(21, 2, TU_SIZES(2, 3), EM_F32, 1.0);
    em_tensor *y = tu_random(22, 1, TU_SIZES(3), EM_F32, 0.5);
    em_tensor *in[2] = {x, y}, *out = NULL;
    tr_graph *g = capture(&gr, x, y);
    ck_assert_msg(g->nnodes == c->nodes, "%s: %d nodes after CSE and DCE", sy_name(c->kind), g->nnodes);
    gd_guards *gs = gd_build(g, in, NULL, 0, NULL, 0);
    ck_assert_ptr_nonnull(gs);
    ck_assert_int_eq(gs->ntensors, 2);
    ck_assert_int_eq(gs->nwatch, 0);
    ck_assert(gd_check(gs, in, NULL));
    gd_free(gs);
    tr_graph_free(g);
    em_compile_options o = {.ninputs = 2, .noutputs = 1, .name = "scale", .backend = "cpu"};
    em_compiled *f = em_compile(sy_fn, &gr, &o);
    ck_assert_ptr_nonnull(f);
    for (int r = 0; r < 2; r++) ck_assert_msg(em_call(f, in, NULL, &out) == EM_OK, "%s", em_last_error());
    em_compile_stats st;
    em_compiled_stats(f, &st);
    ck_assert_msg(st.kernels == c->kernels, "%s: %d kernels", sy_name(c->kind), st.kernels);
    ck_assert_int_eq(st.hits, 1);
    /* every plan kernel compiled or found, the duplicates found loaded */
    ck_assert_int_eq(st.kernels_compiled + st.kernels_loaded, c->kernels);
    ck_assert_msg(st.kernels_compiled <= c->distinct, "%s: %lld kernels compiled", sy_name(c->kind),
                  (long long)st.kernels_compiled);
    double *xv = tu_values(x), *yv = tu_values(y), ref[6];
    sy_ref(&gr, 2, 3, xv, yv, ref);
    tu_check_close(out, ref, 2, TU_SIZES(2, 3), 1e-4, 1e-4);
    free(xv), free(yv);
    em_compiled_free(f);
}

START_TEST(ten_thousand_node_graphs_count_and_compute) {
    const scale_case cases[] = {
        /* 2 inputs, the scalars 0.9 and 0.1 once each (CSE), 10,000 calls;
         * the bound (384 units, a relu link 1) cuts 27 kernels, the
         * periodic ones identical */
        {SY_CHAIN, 10004, 27, 3},
        /* a kernel per mean (every 50 nodes), nearly all identical */
        {SY_MIXED, 10004, 201, 4},
        /* each branch's scalar differs: every kernel is distinct */
        {SY_WIDE, 10006, 27, 27},
    };
    /* under valgrind (50x slower) the mixed chain alone: the most kernels */
    int n = RUNNING_ON_VALGRIND ? 1 : 3;
    for (int i = 0; i < n; i++) check_scale(&cases[RUNNING_ON_VALGRIND ? 1 : i]);
}
END_TEST

int main(void) {
    const tu_test tests[] = {
        {"mixed_chain_code_grows_linearly", mixed_chain_code_grows_linearly},
        {"mixed_chain_matches_float64", mixed_chain_matches_float64},
        {"bounded_chain_and_wide_match_float64", bounded_chain_and_wide_match_float64},
        {"splits_agree_with_eager_on_odd_shapes", splits_agree_with_eager_on_odd_shapes},
        {"cuts_move_eager_steps_in_order", cuts_move_eager_steps_in_order},
        {"ten_thousand_nodes_schedule_in_bounded_time", ten_thousand_nodes_schedule_in_bounded_time},
        {"ten_thousand_node_graphs_count_and_compute", ten_thousand_node_graphs_count_and_compute},
    };
    return tu_run(tu_suite("bound", tests, sizeof tests / sizeof tests[0], 600));
}
