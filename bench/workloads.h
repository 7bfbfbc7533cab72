/* workloads.h - the workloads of ../shared/bench/WORKLOADS.md, written once
 * against the eager API.  make bench (bench_eager.c), make bench-cuda
 * (bench_cuda.c) and the fusion tests (test_fuse.c, test_cuda_emit.c,
 * test_cuda.c) run these same functions; only sizes and devices differ.
 * Header-only: the benchmarks and the tests link no common code. */
#ifndef EMBER_BENCH_WORKLOADS_H
#define EMBER_BENCH_WORKLOADS_H

#include <math.h>

#include "ember.h"

/* tanh(x * y + z) * 0.5 + x; in: x, y, z */
static inline em_tensor *wl_pointwise(em_tensor *const *in) {
    return em_add(em_mul_scalar(em_tanh(em_add(em_mul(in[0], in[1]), in[2])), 0.5), in[0]);
}

/* softmax over the last dim; in: x */
static inline em_tensor *wl_softmax(em_tensor *const *in) { return em_softmax(in[0], -1); }

/* layer_norm over the last dim; in: x, weight, bias */
static inline em_tensor *wl_layernorm(em_tensor *const *in) {
    return em_layer_norm(in[0], 1, in[1], in[2], 1e-5);
}

/* gelu_tanh(x @ w1 + b1) @ w2 + b2; in: x, w1, b1, w2, b2 */
static inline em_tensor *wl_mlp(em_tensor *const *in) {
    return em_add(em_matmul(em_gelu_tanh(em_add(em_matmul(in[0], in[1]), in[2])), in[3]), in[4]);
}

/* five rounds of relu(x * y + 1) - 0.5 on a few floats (call overhead);
 * in: x, y */
static inline em_tensor *wl_tiny_chain(em_tensor *const *in) {
    em_tensor *x = in[0];
    for (int i = 0; i < 5; i++) x = em_sub_scalar(em_relu(em_add_scalar(em_mul(x, in[1]), 1.0)), 0.5);
    return x;
}

/* which (0 q, 1 k, 2 v) of qkv [B, T, 3E] as [B, nh, T, E / nh] */
static inline em_tensor *wl_heads(em_tensor *qkv, int which, int64_t nh) {
    int64_t B = em_size(qkv, 0), T = em_size(qkv, 1), E = em_size(qkv, 2) / 3;
    em_tensor *t = em_slice(qkv, -1, which * E, (which + 1) * E, 1);
    return em_transpose(em_reshape(t, 4, (int64_t[]){B, T, nh, E / nh}), 1, 2);
}

/* A GPT-2 block with nh heads: x + attention(ln1(x)), then + mlp(ln2(.)).
 * in: x [B, T, E], ln1 weight and bias [E], w_qkv [E, 3E], b_qkv [3E],
 * w_proj [E, E], b_proj [E], ln2 weight and bias [E], w_fc [E, 4E],
 * b_fc [4E], w_out [4E, E], b_out [E], mask [T, T] (-inf above the
 * diagonal: causal) */
static inline em_tensor *wl_attention_block(em_tensor *const *in, int64_t nh) {
    em_tensor *x = in[0];
    int64_t B = em_size(x, 0), T = em_size(x, 1), E = em_size(x, 2);
    em_tensor *h = em_layer_norm(x, 1, in[1], in[2], 1e-5);
    em_tensor *qkv = em_add(em_matmul(h, in[3]), in[4]);
    em_tensor *q = wl_heads(qkv, 0, nh), *k = wl_heads(qkv, 1, nh), *v = wl_heads(qkv, 2, nh);
    em_tensor *att = em_mul_scalar(em_matmul(q, em_transpose(k, -2, -1)), 1.0 / sqrt((double)(E / nh)));
    att = em_softmax(em_add(att, in[13]), -1);
    em_tensor *y = em_reshape(em_transpose(em_matmul(att, v), 1, 2), 3, (int64_t[]){B, T, E});
    x = em_add(x, em_add(em_matmul(y, in[5]), in[6]));
    h = em_layer_norm(x, 1, in[7], in[8], 1e-5);
    em_tensor *m = em_gelu_tanh(em_add(em_matmul(h, in[9]), in[10]));
    return em_add(x, em_add(em_matmul(m, in[11]), in[12]));
}

/* The same as em_compile functions (em_fn): one output. */
#define WL_EM_FN(name)                                                                    \
    static inline em_status name##_fn(void *c, em_tensor *const *in, const double *s,     \
                                      em_tensor **out) {                                  \
        (void)c, (void)s;                                                                 \
        out[0] = name(in);                                                                \
        return out[0] ? EM_OK : em_last_status();                                         \
    }
WL_EM_FN(wl_pointwise)
WL_EM_FN(wl_softmax)
WL_EM_FN(wl_layernorm)
WL_EM_FN(wl_mlp)
WL_EM_FN(wl_tiny_chain)
#undef WL_EM_FN

#endif
