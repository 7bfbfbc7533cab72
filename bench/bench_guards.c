/* bench_guards.c - how long deciding that a compiled entry applies takes.
 *
 *   bench/bench_guards
 *
 * Times gd_check on a guard set of 4 tensor inputs (the per-call cost of a
 * cache hit before any kernel runs), gd_check against 8 entries of which
 * the last matches, and a whole em_call of tiny_chain (one fused kernel
 * on the default cpu backend) next to the same function run eagerly, and
 * lazy mode's cost: recording one op, and tiny_chain computed lazily. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "guards.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median over 21 rounds of the per-iteration time of body, in ns. */
#define TIME_NS(iters, body)                                         \
    ({                                                               \
        double r_[21];                                               \
        for (int k_ = 0; k_ < 21; k_++) {                            \
            double t0_ = now();                                      \
            for (long i_ = 0; i_ < (iters); i_++) { body; }          \
            r_[k_] = (now() - t0_) / (iters) * 1e9;                  \
        }                                                            \
        qsort(r_, 21, sizeof(double), cmp);                          \
        r_[10];                                                      \
    })

static em_status add4(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx, (void)s;
    out[0] = em_add(em_add(in[0], in[1]), em_add(in[2], in[3]));
    return out[0] ? EM_OK : em_last_status();
}

static em_status tiny_chain(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx, (void)s;
    em_tensor *x = in[0];
    for (int i = 0; i < 5; i++)
        x = em_sub_scalar(em_relu(em_add_scalar(em_mul(x, in[1]), 1.0)), 0.5);
    out[0] = x;
    return x ? EM_OK : em_last_status();
}

int main(void) {
    em_generator *g = em_generator_new(0);
    em_scope_begin();
    /* one entry per batch size 25..32; the call (batch 32) matches the last */
    gd_guards *gs[8];
    tr_graph *gr[8];
    em_tensor *in[4];
    for (int e = 0; e < 8; e++) {
        int64_t b = 25 + e, full[2] = {b, 64}, wide[2] = {64, b}, col[2] = {b, 1};
        in[0] = em_randn(g, 2, full, EM_F32, em_cpu());
        in[1] = em_randn(g, 2, full, EM_F32, em_cpu());
        in[2] = em_transpose(em_randn(g, 2, wide, EM_F32, em_cpu()), 0, 1); /* strided */
        in[3] = em_randn(g, 2, col, EM_F32, em_cpu());                      /* broadcast */
        tr_recorder *r = tr_record_begin(4, in, NULL);
        em_tensor *y;
        if (!r || add4(NULL, in, NULL, &y) != EM_OK) {
            fprintf(stderr, "bench_guards: %s\n", em_last_error());
            return 1;
        }
        gr[e] = tr_record_end(r, 1, &y, NULL, 0);
        gs[e] = gd_build(gr[e], in, NULL, 0, NULL, 0);
    }
    volatile int sink = 0;
    double one = TIME_NS(1000000, sink += gd_check(gs[7], in, NULL));
    double eight = TIME_NS(200000, {
        for (int e = 0; e < 8; e++)
            if (gd_check(gs[e], in, NULL)) {
                sink += e;
                break;
            }
    });
    printf("guard check, 4 tensor inputs (2-d), matching entry:     %6.1f ns\n", one);
    printf("guard checks, 8 entries, the last one matching:          %6.1f ns\n", eight);

    em_compile_options o = {.ninputs = 2, .noutputs = 1, .name = "tiny_chain"};
    em_compiled *f = em_compile(tiny_chain, NULL, &o);
    int64_t n16 = 16;
    em_tensor *t[2] = {em_randn(g, 1, &n16, EM_F32, em_cpu()), em_randn(g, 1, &n16, EM_F32, em_cpu())};
    em_tensor *y;
    em_call(f, t, NULL, &y);
    double eager = TIME_NS(2000, {
        em_scope_begin();
        tiny_chain(NULL, t, NULL, &y);
        em_scope_end();
    });
    double call = TIME_NS(2000, {
        em_scope_begin();
        em_call(f, t, NULL, &y);
        em_scope_end();
    });
    printf("tiny_chain eager:                                        %6.2f us\n", eager / 1e3);
    printf("tiny_chain em_call (guards + one fused kernel):         %6.2f us\n", call / 1e3);
    /* lazy mode: recording alone (ops deferred, then dropped unread), and
     * a whole tiny_chain computed through the lazy entry table */
    em_lazy_begin();
    double record = TIME_NS(200, {
        em_scope_begin();
        em_tensor *x = t[0];
        for (int k = 0; k < 100; k++) x = em_add(x, t[1]);
        em_scope_end();
    }) / 100;
    double lazy = TIME_NS(2000, {
        em_scope_begin();
        tiny_chain(NULL, t, NULL, &y);
        em_sync();
        em_scope_end();
    });
    /* em_sync computes every pending tensor (each intermediate becomes an
     * output); em_realize only the result, as a read of it would */
    double realize = TIME_NS(2000, {
        em_scope_begin();
        tiny_chain(NULL, t, NULL, &y);
        em_realize(y);
        em_scope_end();
    });
    em_lazy_end();
    printf("lazy mode, recording one op (deferred, never run):      %6.1f ns\n", record);
    printf("tiny_chain in lazy mode (record 20 ops, table hit, run): %6.2f us\n", lazy / 1e3);
    printf("tiny_chain in lazy mode, em_realize of the result:       %6.2f us\n", realize / 1e3);
    em_compiled_free(f);
    for (int e = 0; e < 8; e++) {
        gd_free(gs[e]);
        tr_graph_free(gr[e]);
    }
    em_scope_end();
    em_generator_free(g);
    return sink == -1;
}
