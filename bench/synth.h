/* synth.h - synthetic graphs of a given node count (issue 22): a pointwise
 * chain, a wide graph of many short branches, and the mixed chain (the
 * chain with a mean-subtract every SY_MEAN_EVERY nodes).  bench_bound.c
 * times their cold first calls; tests/test_bound.c checks their schedules
 * and values against synth_ref (float64).  Header-only, public API. */
#ifndef EMBER_BENCH_SYNTH_H
#define EMBER_BENCH_SYNTH_H

#include <math.h>
#include <stdbool.h>
#include <string.h>

#include "ember.h"

typedef enum sy_kind { SY_CHAIN, SY_WIDE, SY_MIXED } sy_kind;

/* A graph's description: the em_compile ctx of sy_fn. */
typedef struct sy_graph {
    sy_kind kind;
    int nodes; /* graph call nodes, as recorded (each op is one) */
    bool cheap; /* relu where the graph has tanh: no transcendental, whose
                   inlined approximation dominates libgccjit's time */
} sy_graph;

#define SY_MEAN_EVERY 50

static inline const char *sy_name(sy_kind k) {
    return k == SY_CHAIN ? "chain" : k == SY_WIDE ? "wide" : "mixed";
}

/* One link of a chain, by its position: tanh(h) (cheap: relu(h)), h * 0.9,
 * h + y, h - 0.1 (bounded values, y a broadcast input in the tests). */
static inline em_tensor *sy_link(em_tensor *h, em_tensor *y, int i, bool cheap) {
    switch (i % 4) {
    case 0: return cheap ? em_relu(h) : em_tanh(h);
    case 1: return em_mul_scalar(h, 0.9);
    case 2: return em_add(h, y);
    default: return em_sub_scalar(h, 0.1);
    }
}

/* The graph on inputs x and y (y broadcasts to x, or x to y).
 * chain: links; mixed: links, every SY_MEAN_EVERY-th node a mean over the
 * last dim (keepdim) subtracted (two nodes); wide: branches
 * acc += tanh(x * c_b) + y, five nodes each (c_b is a node). */
static inline em_tensor *sy_build(const sy_graph *gr, em_tensor *x, em_tensor *y) {
    int last = -1;
    if (gr->kind == SY_WIDE) {
        em_tensor *acc = NULL;
        for (int i = 0, b = 0; i < gr->nodes; b++) {
            em_tensor *t = em_mul_scalar(x, 1.0 - 1e-4 * b);
            t = em_add(gr->cheap ? em_relu(t) : em_tanh(t), y);
            acc = acc ? em_add(acc, t) : t;
            i += b ? 5 : 4;
        }
        return acc;
    }
    em_tensor *h = x;
    for (int i = 0; i < gr->nodes; i++) {
        if (gr->kind == SY_MIXED && i % SY_MEAN_EVERY == SY_MEAN_EVERY - 2) {
            h = em_sub(h, em_mean(h, 1, &last, true));
            i++;
        } else {
            h = sy_link(h, y, i, gr->cheap);
        }
    }
    return h;
}

static inline em_status sy_fn(void *c, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    out[0] = sy_build(c, in[0], in[1]);
    return out[0] ? EM_OK : em_last_status();
}

/* Float64 reference of sy_build on x [rows, cols] and y [cols] (both
 * row-major), into out [rows, cols]. */
static inline void sy_ref(const sy_graph *gr, int64_t rows, int64_t cols, const double *x,
                          const double *y, double *out) {
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * cols;
        double *h = out + r * cols;
        if (gr->kind == SY_WIDE) {
            for (int64_t c = 0; c < cols; c++) h[c] = 0;
            for (int i = 0, b = 0; i < gr->nodes; b++) {
                for (int64_t c = 0; c < cols; c++) {
                    double t = xr[c] * (1.0 - 1e-4 * b);
                    h[c] += (gr->cheap ? fmax(t, 0) : tanh(t)) + y[c];
                }
                i += b ? 5 : 4;
            }
            continue;
        }
        memcpy(h, xr, sizeof(double) * (size_t)cols);
        for (int i = 0; i < gr->nodes; i++) {
            if (gr->kind == SY_MIXED && i % SY_MEAN_EVERY == SY_MEAN_EVERY - 2) {
                double m = 0;
                for (int64_t c = 0; c < cols; c++) m += h[c];
                m /= (double)cols;
                for (int64_t c = 0; c < cols; c++) h[c] -= m;
                i++;
                continue;
            }
            for (int64_t c = 0; c < cols; c++) {
                switch (i % 4) {
                case 0: h[c] = gr->cheap ? fmax(h[c], 0) : tanh(h[c]); break;
                case 1: h[c] *= 0.9; break;
                case 2: h[c] += y[c]; break;
                default: h[c] -= 0.1; break;
                }
            }
        }
    }
}

#endif
