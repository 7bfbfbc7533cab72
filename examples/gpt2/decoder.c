/* decoder.c - the GPT-2-shaped decoder of decoder.h, written with Ember's
 * eager API only: the step function is plain eager code that em_compile,
 * lazy mode and eager mode all run. */
#include "decoder.h"

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct dec_layer {
    em_tensor *ln1_w, *ln1_b, *w_qkv, *b_qkv, *w_proj, *b_proj;
    em_tensor *ln2_w, *ln2_b, *w_fc, *b_fc, *w_out, *b_out;
    em_tensor *k_cache, *v_cache; /* [B, H, ctx, D] */
} dec_layer;

enum { LAYER_WEIGHTS = 12 };

struct dec_model {
    dec_config c;
    em_device dev;
    em_tensor *wte, *wpe, *lnf_w, *lnf_b; /* wte [vocab, dim], wpe [ctx, dim] */
    dec_layer *layers;
    em_tensor *pos;     /* [1] i64 */
    em_tensor *zero;    /* [1] i64: 0, the index pos is written at */
    em_tensor *history; /* [B, ctx] i64 */
};

dec_config dec_gpt2_small(int ctx, int batch) {
    return (dec_config){.layers = 12, .dim = 768, .heads = 12, .vocab = 50257, .ctx = ctx, .batch = batch};
}

static em_tensor **layer_weights(dec_layer *l, int i) {
    em_tensor **w[LAYER_WEIGHTS] = {&l->ln1_w, &l->ln1_b, &l->w_qkv, &l->b_qkv, &l->w_proj, &l->b_proj,
                                    &l->ln2_w, &l->ln2_b, &l->w_fc,  &l->b_fc,  &l->w_out,  &l->b_out};
    return w[i];
}

/* A weight of sizes (cols 0: a vector): normal * 0.02, or fill for layer
 * norms (std < 0), kept past the caller's scope. */
static em_tensor *weight(em_generator *g, em_device dev, int64_t rows, int64_t cols, double fill) {
    int64_t sizes[2] = {rows, cols};
    int nd = cols ? 2 : 1;
    em_scope_begin();
    em_tensor *t = fill >= 0 ? em_full(nd, sizes, fill, EM_F32, dev)
                             : em_mul_scalar(em_randn(g, nd, sizes, EM_F32, dev), 0.02);
    t = em_keep(t);
    em_scope_end();
    return t;
}

/* Writes the reason into e (if not NULL); returns s. */
static em_status say(dec_error *e, em_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static em_status say(dec_error *e, em_status s, const char *fmt, ...) {
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return s;
}

/* s, with Ember's message in e when it failed. */
static em_status ember(dec_error *e, const char *what, em_status s) {
    return s == EM_OK ? s : say(e, s, "%s: %s", what, em_last_error());
}

dec_model *dec_new(const dec_config *c, uint64_t seed, em_device dev, dec_error *e) {
    if (!c || c->layers < 1 || c->dim < 1 || c->heads < 1 || c->dim % c->heads || c->vocab < 1 ||
        c->ctx < 2 || c->batch < 1) {
        say(e, EM_ERR_ARG, "dec_new: bad sizes (every size >= 1, ctx >= 2, dim a multiple of heads)");
        return NULL;
    }
    dec_model *m = calloc(1, sizeof *m);
    em_generator *g = em_generator_new(seed);
    if (!m || !g || !(m->layers = calloc((size_t)c->layers, sizeof *m->layers))) {
        say(e, EM_ERR_NOMEM, "dec_new: out of memory");
        goto fail;
    }
    m->c = *c;
    m->dev = dev;
    int64_t C = c->dim, D = C / c->heads;
    m->wte = weight(g, dev, c->vocab, C, -1);
    m->wpe = weight(g, dev, c->ctx, C, -1);
    bool ok = m->wte && m->wpe;
    for (int l = 0; ok && l < c->layers; l++) {
        dec_layer *L = &m->layers[l];
        L->ln1_w = weight(g, dev, C, 0, 1), L->ln1_b = weight(g, dev, C, 0, 0);
        L->w_qkv = weight(g, dev, C, 3 * C, -1), L->b_qkv = weight(g, dev, 3 * C, 0, -1);
        L->w_proj = weight(g, dev, C, C, -1), L->b_proj = weight(g, dev, C, 0, -1);
        L->ln2_w = weight(g, dev, C, 0, 1), L->ln2_b = weight(g, dev, C, 0, 0);
        L->w_fc = weight(g, dev, C, 4 * C, -1), L->b_fc = weight(g, dev, 4 * C, 0, -1);
        L->w_out = weight(g, dev, 4 * C, C, -1), L->b_out = weight(g, dev, C, 0, -1);
        int64_t cs[4] = {c->batch, c->heads, c->ctx, D};
        L->k_cache = em_zeros(4, cs, EM_F32, dev);
        L->v_cache = em_zeros(4, cs, EM_F32, dev);
        for (int i = 0; i < LAYER_WEIGHTS; i++) ok = ok && *layer_weights(L, i);
        ok = ok && L->k_cache && L->v_cache;
    }
    m->lnf_w = weight(g, dev, C, 0, 1);
    m->lnf_b = weight(g, dev, C, 0, 0);
    m->pos = em_zeros(1, (int64_t[]){1}, EM_I64, dev);
    m->zero = em_zeros(1, (int64_t[]){1}, EM_I64, dev);
    m->history = em_zeros(2, (int64_t[]){c->batch, c->ctx}, EM_I64, dev);
    if (ok && m->lnf_w && m->lnf_b && m->pos && m->zero && m->history) {
        em_generator_free(g);
        return m;
    }
    ember(e, "dec_new", em_last_status() != EM_OK ? em_last_status() : EM_ERR_STATE);
fail:
    em_generator_free(g);
    dec_free(m);
    return NULL;
}

void dec_free(dec_model *m) {
    if (!m) return;
    for (int l = 0; m->layers && l < m->c.layers; l++) {
        for (int i = 0; i < LAYER_WEIGHTS; i++) em_release(*layer_weights(&m->layers[l], i));
        em_release(m->layers[l].k_cache);
        em_release(m->layers[l].v_cache);
    }
    free(m->layers);
    em_release(m->wte), em_release(m->wpe), em_release(m->lnf_w), em_release(m->lnf_b);
    em_release(m->pos), em_release(m->zero), em_release(m->history);
    free(m);
}

const dec_config *dec_config_of(const dec_model *m) { return &m->c; }
em_tensor *dec_history(const dec_model *m) { return m->history; }

/* t (written in place) = zeros, through one index_copy_ over dim 0. */
static em_status zero_fill(em_tensor *t, em_device dev) {
    em_tensor *all = em_arange(0, (double)em_size(t, 0), 1, EM_I64, dev);
    em_tensor *z = em_zeros(em_ndim(t), em_sizes(t), em_dtype_of(t), dev);
    return all && z ? em_index_copy_(t, 0, all, z) : em_last_status();
}

em_status dec_reset(dec_model *m, const int64_t *first, dec_error *e) {
    if (!m || !first) return say(e, EM_ERR_NULL, "dec_reset: model or first tokens are NULL");
    for (int b = 0; b < m->c.batch; b++)
        if (first[b] < 0 || first[b] >= m->c.vocab)
            return say(e, EM_ERR_ARG, "dec_reset: token %lld is outside the vocabulary", (long long)first[b]);
    em_scope_begin();
    em_status s = EM_OK;
    for (int l = 0; s == EM_OK && l < m->c.layers; l++) {
        s = zero_fill(m->layers[l].k_cache, m->dev);
        if (s == EM_OK) s = zero_fill(m->layers[l].v_cache, m->dev);
    }
    if (s == EM_OK) s = zero_fill(m->pos, m->dev);
    if (s == EM_OK) s = zero_fill(m->history, m->dev);
    em_tensor *tok = s == EM_OK ? em_from_data(first, EM_I64, 2, (int64_t[]){m->c.batch, 1}, m->dev) : NULL;
    if (s == EM_OK) s = tok ? em_index_copy_(m->history, 1, m->zero, tok) : em_last_status();
    em_scope_end();
    return ember(e, "dec_reset", s);
}

/* Heads `which` (0 q, 1 k, 2 v) of qkv [B, 1, 3C]: [B, H, 1, D]. */
static em_tensor *heads(const dec_config *c, em_tensor *qkv, int which) {
    int64_t C = c->dim;
    em_tensor *t = em_slice(qkv, -1, which * C, (which + 1) * C, 1);
    t = em_reshape(t, 4, (int64_t[]){c->batch, 1, c->heads, C / c->heads});
    return em_transpose(t, 1, 2);
}

/* Attention of one token over the cache, after writing its key and value
 * at pos; mask: 0 for the positions <= pos, -inf after. */
static em_tensor *attention(const dec_model *m, const dec_layer *L, em_tensor *h, em_tensor *mask) {
    const dec_config *c = &m->c;
    em_tensor *qkv = em_add(em_matmul(h, L->w_qkv), L->b_qkv);
    if (em_index_copy_(L->k_cache, 2, m->pos, heads(c, qkv, 1)) != EM_OK ||
        em_index_copy_(L->v_cache, 2, m->pos, heads(c, qkv, 2)) != EM_OK)
        return NULL;
    em_tensor *y = em_scaled_dot_product_attention(heads(c, qkv, 0), L->k_cache, L->v_cache, mask,
                                                   false, EM_SCALE_DEFAULT);
    y = em_reshape(em_transpose(y, 1, 2), 3, (int64_t[]){c->batch, 1, c->dim});
    return em_add(em_matmul(y, L->w_proj), L->b_proj);
}

static em_tensor *block(const dec_model *m, const dec_layer *L, em_tensor *x, em_tensor *mask) {
    x = em_add(x, attention(m, L, em_layer_norm(x, 1, L->ln1_w, L->ln1_b, 1e-5), mask));
    em_tensor *h = em_layer_norm(x, 1, L->ln2_w, L->ln2_b, 1e-5);
    h = em_gelu_tanh(em_add(em_matmul(h, L->w_fc), L->b_fc));
    return em_add(x, em_add(em_matmul(h, L->w_out), L->b_out));
}

em_status dec_step(void *model, em_tensor *const *in, const double *scalars, em_tensor **out) {
    (void)scalars;
    dec_model *m = model;
    const dec_config *c = &m->c;
    em_tensor *history = in[0];
    em_tensor *tok = em_index_select(history, 1, m->pos); /* [B, 1] */
    em_tensor *x = em_add(em_embedding(m->wte, tok), em_embedding(m->wpe, m->pos));
    em_tensor *keys = em_arange(0, c->ctx, 1, EM_I64, m->dev);
    em_tensor *mask = em_where(em_le(keys, m->pos), em_scalar(0, EM_F32, m->dev),
                               em_scalar(-INFINITY, EM_F32, m->dev));
    for (int l = 0; x && l < c->layers; l++) x = block(m, &m->layers[l], x, mask);
    em_tensor *h = em_layer_norm(x, 1, m->lnf_w, m->lnf_b, 1e-5);
    em_tensor *logits = em_matmul(h, em_transpose(m->wte, 0, 1)); /* [B, 1, vocab] */
    em_tensor *next = em_argmax(logits, -1, false);               /* [B, 1] */
    em_tensor *p1 = em_add_scalar(m->pos, 1);
    if (!next || !p1) return em_last_status();
    em_status s = em_index_copy_(history, 1, p1, next);
    if (s == EM_OK) s = em_index_copy_(m->pos, 0, m->zero, p1);
    out[0] = next;
    out[1] = logits;
    return s;
}

em_status dec_tokens(const dec_model *m, int64_t *out) {
    if (!m || !out) return EM_ERR_NULL;
    return em_copy_to_host(m->history, out, sizeof *out * (size_t)m->c.batch * (size_t)m->c.ctx);
}

/* t's values as little-endian f32 (the host's order: x86-64 and arm64). */
static em_status put(FILE *f, const em_tensor *t, dec_error *e) {
    size_t n = (size_t)em_numel(t);
    float *buf = malloc(sizeof *buf * (n ? n : 1));
    if (!buf) return say(e, EM_ERR_NOMEM, "dec_save_weights: out of memory");
    em_status s = ember(e, "dec_save_weights", em_copy_to_host(t, buf, sizeof *buf * n));
    if (s == EM_OK && fwrite(buf, sizeof *buf, n, f) != n) s = say(e, EM_ERR_IO, "dec_save_weights: write failed");
    free(buf);
    return s;
}

em_status dec_save_weights(const dec_model *m, const char *path, dec_error *e) {
    if (!m || !path) return say(e, EM_ERR_NULL, "dec_save_weights: model or path is NULL");
    FILE *f = fopen(path, "wb");
    if (!f) return say(e, EM_ERR_IO, "dec_save_weights: cannot open %s", path);
    em_status s = put(f, m->wte, e);
    if (s == EM_OK) s = put(f, m->wpe, e);
    for (int l = 0; l < m->c.layers; l++)
        for (int i = 0; s == EM_OK && i < LAYER_WEIGHTS; i++) s = put(f, *layer_weights(&m->layers[l], i), e);
    if (s == EM_OK) s = put(f, m->lnf_w, e);
    if (s == EM_OK) s = put(f, m->lnf_b, e);
    if (fclose(f) != 0 && s == EM_OK) s = say(e, EM_ERR_IO, "dec_save_weights: write failed");
    return s;
}
