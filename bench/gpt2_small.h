/* gpt2_small.h - GPT-2 small's 12 blocks (d 768, 12 heads, MLP 3072,
 * causal attention, then the final layer norm; no vocabulary: the input
 * is embeddings [G2_B, G2_T, 768]) written with Ember's eager API as
 * examples/gpt_block.c writes a block, with seeded random weights: the
 * model of bench_cold (cold first calls) and bench_eager (steady-state
 * forward beside PyTorch's, bench/torch_cold.py's gpt2_modules). */
#ifndef EMBER_BENCH_GPT2_SMALL_H
#define EMBER_BENCH_GPT2_SMALL_H

#include <ember.h>
#include <math.h>
#include <stdbool.h>

enum { G2_B = 2, G2_T = 64, G2_C = 768, G2_NH = 12, G2_HD = G2_C / G2_NH, G2_NL = 12 };

typedef struct g2_block {
    em_tensor *ln1_w, *ln1_b, *w_qkv, *b_qkv, *w_proj, *b_proj;
    em_tensor *ln2_w, *ln2_b, *w_fc, *b_fc, *w_out, *b_out;
} g2_block;

typedef struct g2_model {
    g2_block layer[G2_NL];
    em_tensor *lnf_w, *lnf_b;
} g2_model;

static inline em_tensor *g2_param(em_generator *g, int64_t rows, int64_t cols, double scale) {
    int64_t sizes[2] = {rows, cols};
    return em_mul_scalar(em_randn(g, cols ? 2 : 1, sizes, EM_F32, em_cpu()), scale);
}

static inline bool g2_block_init(g2_block *w, em_generator *g) {
    const int64_t C = G2_C;
    *w = (g2_block){
        g2_param(g, C, 0, 0.1), g2_param(g, C, 0, 0.1), g2_param(g, C, 3 * C, 1 / sqrt(C)),
        g2_param(g, 3 * C, 0, 0.1), g2_param(g, C, C, 1 / sqrt(C)), g2_param(g, C, 0, 0.1),
        g2_param(g, C, 0, 0.1), g2_param(g, C, 0, 0.1), g2_param(g, C, 4 * C, 1 / sqrt(C)),
        g2_param(g, 4 * C, 0, 0.1), g2_param(g, 4 * C, C, 1 / sqrt(4 * C)), g2_param(g, C, 0, 0.1),
    };
    em_tensor **all = (em_tensor **)w;
    for (size_t i = 0; i < sizeof *w / sizeof *all; i++)
        if (!all[i]) return false;
    return true;
}

/* nl blocks (1 or G2_NL) and the final layer norm, from generator g. */
static inline bool g2_model_init(g2_model *m, int nl, em_generator *g) {
    for (int l = 0; l < nl; l++)
        if (!g2_block_init(&m->layer[l], g)) return false;
    m->lnf_w = g2_param(g, G2_C, 0, 0.1), m->lnf_b = g2_param(g, G2_C, 0, 0.1);
    return m->lnf_w && m->lnf_b;
}

static inline em_tensor *g2_heads(em_tensor *qkv, int which) {
    int64_t B = em_size(qkv, 0), T = em_size(qkv, 1);
    em_tensor *t = em_slice(qkv, -1, which * G2_C, (which + 1) * G2_C, 1);
    return em_transpose(em_reshape(t, 4, (int64_t[]){B, T, G2_NH, G2_HD}), 1, 2);
}

/* Causal self-attention: a key after the query gets -inf before the softmax. */
static inline em_tensor *g2_attention(const g2_block *w, em_tensor *h) {
    int64_t B = em_size(h, 0), T = em_size(h, 1);
    em_tensor *qkv = em_add(em_matmul(h, w->w_qkv), w->b_qkv);
    em_tensor *q = g2_heads(qkv, 0), *k = g2_heads(qkv, 1), *v = g2_heads(qkv, 2);
    em_tensor *pos = em_arange(0, (double)T, 1, EM_I64, em_cpu());
    em_tensor *future = em_gt(em_unsqueeze(pos, 0), em_unsqueeze(pos, 1));
    em_tensor *att = em_mul_scalar(em_matmul(q, em_transpose(k, -2, -1)), 1.0 / sqrt(G2_HD));
    att = em_softmax(em_where(future, em_scalar(-INFINITY, EM_F32, em_cpu()), att), -1);
    em_tensor *y = em_reshape(em_transpose(em_matmul(att, v), 1, 2), 3, (int64_t[]){B, T, G2_C});
    return em_add(em_matmul(y, w->w_proj), w->b_proj);
}

static inline em_tensor *g2_block_fwd(const g2_block *w, em_tensor *x) {
    x = em_add(x, g2_attention(w, em_layer_norm(x, 1, w->ln1_w, w->ln1_b, 1e-5)));
    em_tensor *h = em_layer_norm(x, 1, w->ln2_w, w->ln2_b, 1e-5);
    h = em_gelu_tanh(em_add(em_matmul(h, w->w_fc), w->b_fc));
    return em_add(x, em_add(em_matmul(h, w->w_out), w->b_out));
}

/* The whole forward: G2_NL blocks, then the final layer norm. */
static inline em_tensor *g2_forward(const g2_model *m, em_tensor *x) {
    for (int l = 0; l < G2_NL; l++) x = g2_block_fwd(&m->layer[l], x);
    return em_layer_norm(x, 1, m->lnf_w, m->lnf_b, 1e-5);
}

/* Multiply-adds x 2 of a forward over B x T tokens: the matmuls (12 C^2
 * per token and layer) and attention's two products (causal or not). */
static inline double g2_flops(int64_t B, int64_t T) {
    return (2.0 * B * T * 12.0 * G2_C * G2_C + 4.0 * B * G2_NH * T * T * G2_HD) * G2_NL;
}

#endif
