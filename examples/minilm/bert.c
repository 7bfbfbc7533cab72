/* bert.c - all-MiniLM-L6-v2: a BERT encoder, mean pooling and L2
 * normalization, written with Ember's public eager API.
 *
 * The same stage functions (embeddings, encoder layer, pooling) run
 * eagerly (bert_forward) and compiled, one em_compile'd function per stage
 * (bert_compile; main.c says why). */
#include "minilm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- configuration ---- */

static char *slurp(const char *path, size_t max, size_t *len, ml_error *e) {
    FILE *f = fopen(path, "rb");
    if (!f) return ml_fail(e, ML_ERR_IO, "cannot open %s", path), NULL;
    char *buf = malloc(max + 1);
    size_t n = buf ? fread(buf, 1, max + 1, f) : 0;
    bool bad = ferror(f);
    fclose(f);
    if (!buf) return ml_fail(e, ML_ERR_NOMEM, "out of memory"), NULL;
    if (bad || n > max) {
        free(buf);
        return ml_fail(e, ML_ERR_FORMAT, "%s: unreadable or larger than %zu bytes", path, max), NULL;
    }
    *len = n;
    return buf;
}

static js_doc *read_json(const char *dir, const char *name, ml_error *e) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    size_t n;
    char *text = slurp(path, 1 << 20, &n, e);
    if (!text) return NULL;
    ml_error je = {""};
    js_doc *d = js_parse(text, n, &je);
    free(text);
    if (!d) ml_fail(e, ML_ERR_FORMAT, "%s: %s", path, je.msg);
    else if (js_type_of(d, 0) != JS_OBJ) {
        js_free(d);
        d = NULL;
        ml_fail(e, ML_ERR_FORMAT, "%s: not a JSON object", path);
    }
    return d;
}

/* An integer setting in [1, max]. */
static bool get_int(const js_doc *d, const char *key, int max, int *out, ml_error *e) {
    int64_t v;
    if (!js_int(d, js_get(d, 0, key), &v) || v < 1 || v > max) {
        ml_fail(e, ML_ERR_MISSING, "config.json: '%s' is missing or not an integer in [1, %d]", key, max);
        return false;
    }
    *out = (int)v;
    return true;
}

static ml_status read_config(bert_config *c, const char *dir, ml_error *e) {
    js_doc *d = read_json(dir, "config.json", e);
    if (!d) return ML_ERR_FORMAT;
    bool ok = get_int(d, "hidden_size", 1 << 16, &c->hidden, e) &&
              get_int(d, "num_attention_heads", 1024, &c->heads, e) &&
              get_int(d, "num_hidden_layers", 1024, &c->layers, e) &&
              get_int(d, "intermediate_size", 1 << 18, &c->intermediate, e) &&
              get_int(d, "max_position_embeddings", 1 << 20, &c->max_positions, e) &&
              get_int(d, "vocab_size", 1 << 24, &c->vocab, e) &&
              get_int(d, "type_vocab_size", 1 << 10, &c->type_vocab, e);
    if (ok && !js_num(d, js_get(d, 0, "layer_norm_eps"), &c->eps)) c->eps = 1e-12;
    const char *act = js_str(d, js_get(d, 0, "hidden_act"));
    if (ok && act && strcmp(act, "gelu")) ok = !ml_fail(e, ML_ERR_FORMAT, "config.json: hidden_act '%s' is not supported (gelu only)", act);
    if (ok && c->hidden % c->heads) ok = !ml_fail(e, ML_ERR_FORMAT, "config.json: hidden_size is not a multiple of num_attention_heads");
    js_free(d);
    if (!ok) return ML_ERR_FORMAT;
    /* sentence-transformers truncates to max_seq_length (256 for this model) */
    c->max_seq = c->max_positions < 256 ? c->max_positions : 256;
    ml_error ignored;
    if ((d = read_json(dir, "sentence_bert_config.json", &ignored))) {
        int v;
        if (get_int(d, "max_seq_length", c->max_positions, &v, &ignored)) c->max_seq = v;
        js_free(d);
    }
    if (c->max_seq < 2) return ml_fail(e, ML_ERR_FORMAT, "max_seq_length below 2");
    return ML_OK;
}

/* ---- weights ---- */

typedef struct loader {
    st_file st;
    ml_error *e;
    bool failed;
} loader;

/* The tensor `name` (formatted with the layer index), of shape d0[, d1]. */
static em_tensor *load(loader *l, const char *fmt, int layer, int64_t d0, int64_t d1) {
    if (l->failed) return NULL;
    char name[256];
    snprintf(name, sizeof name, fmt, layer);
    int64_t shape[2] = {d0, d1};
    em_tensor *t = st_load_f32(&l->st, name, d1 ? 2 : 1, shape, l->e);
    l->failed = !t;
    return t;
}

/* A linear layer's weight [out, in] as the [in, out] matrix of x @ w. */
static em_tensor *transposed(em_tensor *w) { return em_contiguous(em_transpose(w, 0, 1)); }

#define LAYER "encoder.layer.%d."

static void load_layer(loader *l, bert_layer *L, int i, const bert_config *c) {
    int64_t h = c->hidden, f = c->intermediate;
    em_tensor *wq = load(l, LAYER "attention.self.query.weight", i, h, h);
    em_tensor *wk = load(l, LAYER "attention.self.key.weight", i, h, h);
    em_tensor *wv = load(l, LAYER "attention.self.value.weight", i, h, h);
    em_tensor *bq = load(l, LAYER "attention.self.query.bias", i, h, 0);
    em_tensor *bk = load(l, LAYER "attention.self.key.bias", i, h, 0);
    em_tensor *bv = load(l, LAYER "attention.self.value.bias", i, h, 0);
    /* one [h, 3h] matmul for query, key and value instead of three */
    L->wqkv = l->failed ? NULL : transposed(em_cat(3, (em_tensor *[]){wq, wk, wv}, 0));
    L->bqkv = l->failed ? NULL : em_cat(3, (em_tensor *[]){bq, bk, bv}, 0);
    L->wo = transposed(load(l, LAYER "attention.output.dense.weight", i, h, h));
    L->bo = load(l, LAYER "attention.output.dense.bias", i, h, 0);
    L->ln1_w = load(l, LAYER "attention.output.LayerNorm.weight", i, h, 0);
    L->ln1_b = load(l, LAYER "attention.output.LayerNorm.bias", i, h, 0);
    L->w1 = transposed(load(l, LAYER "intermediate.dense.weight", i, f, h));
    L->b1 = load(l, LAYER "intermediate.dense.bias", i, f, 0);
    L->w2 = transposed(load(l, LAYER "output.dense.weight", i, h, f));
    L->b2 = load(l, LAYER "output.dense.bias", i, h, 0);
    L->ln2_w = load(l, LAYER "output.LayerNorm.weight", i, h, 0);
    L->ln2_b = load(l, LAYER "output.LayerNorm.bias", i, h, 0);
}

/* Every weight tensor slot of m, for keeping and releasing them together. */
static int weight_slots(bert_model *m, em_tensor ***slots, int max) {
    int n = 0;
    em_tensor **top[] = {&m->word, &m->pos, &m->type0, &m->ln_w, &m->ln_b};
    for (size_t i = 0; i < 5 && n < max; i++) slots[n++] = top[i];
    for (int i = 0; m->layer && i < m->cfg.layers; i++) {
        bert_layer *L = &m->layer[i];
        em_tensor **ls[] = {&L->wqkv, &L->bqkv, &L->wo, &L->bo, &L->ln1_w, &L->ln1_b,
                            &L->w1, &L->b1, &L->w2, &L->b2, &L->ln2_w, &L->ln2_b};
        for (size_t k = 0; k < 12 && n < max; k++) slots[n++] = ls[k];
    }
    return n;
}

/* t's values in a new contiguous f32 tensor on dev (t itself when dev is
 * the CPU), owned by the open scope. */
static em_tensor *to_device(em_tensor *t, em_device dev) {
    if (!t || dev.type == EM_CPU) return t;
    size_t n = (size_t)em_numel(t) * sizeof(float);
    float *buf = malloc(n ? n : 1);
    em_tensor *d = NULL;
    if (buf && em_copy_to_host(t, buf, n) == EM_OK) d = em_from_data(buf, EM_F32, em_ndim(t), em_sizes(t), dev);
    free(buf);
    return d;
}

static ml_status load_weights(bert_model *m, const char *dir, ml_error *e) {
    const bert_config *c = &m->cfg;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    loader l = {.e = e};
    ml_status s = st_open(&l.st, path, e);
    if (s != ML_OK) return s;
    if (!(m->layer = calloc((size_t)c->layers, sizeof *m->layer))) {
        st_close(&l.st);
        return ml_fail(e, ML_ERR_NOMEM, "out of memory");
    }
    em_scope_begin(); /* intermediates (untransposed weights) die here */
    m->word = load(&l, "embeddings.word_embeddings.weight", 0, c->vocab, c->hidden);
    m->pos = load(&l, "embeddings.position_embeddings.weight", 0, c->max_positions, c->hidden);
    em_tensor *types = load(&l, "embeddings.token_type_embeddings.weight", 0, c->type_vocab, c->hidden);
    m->type0 = l.failed ? NULL : em_squeeze(em_slice(types, 0, 0, 1, 1), 0); /* one segment: type 0 */
    m->ln_w = load(&l, "embeddings.LayerNorm.weight", 0, c->hidden, 0);
    m->ln_b = load(&l, "embeddings.LayerNorm.bias", 0, c->hidden, 0);
    for (int i = 0; i < c->layers && !l.failed; i++) load_layer(&l, &m->layer[i], i, c);
    em_tensor **slots[5 + 12 * 1024];
    int n = weight_slots(m, slots, (int)(sizeof slots / sizeof slots[0]));
    bool ember_failed = false;
    /* m takes a reference of its own to each weight: the scope's goes at
     * em_scope_end.  (em_keep would hand them to the enclosing scope, if
     * the caller has one open, which could end before bert_free.) */
    for (int i = 0; i < n; i++) {
        if (!l.failed && !ember_failed) *slots[i] = to_device(*slots[i], m->device);
        if (!l.failed && !*slots[i]) ember_failed = true;
        em_retain(*slots[i]);
    }
    em_scope_end();
    st_close(&l.st);
    if (l.failed) return ML_ERR_FORMAT;
    if (ember_failed) return ml_fail(e, ML_ERR_EMBER, "preparing the weights: %s", em_last_error());
    return ML_OK;
}

bool bert_parse_device(const char *s, em_device *dev) {
    if (!s) return false;
    if (!strcmp(s, "cpu")) return *dev = em_cpu(), true;
    if (strncmp(s, "cuda", 4)) return false;
    if (!s[4]) return *dev = em_cuda(0), true;
    char *end;
    long i = s[4] == ':' && s[5] >= '0' && s[5] <= '9' ? strtol(s + 5, &end, 10) : -1;
    if (i < 0 || i > 1023 || *end) return false;
    return *dev = em_cuda((int)i), true;
}

ml_status bert_load(bert_model *m, const char *dir, ml_error *e) { return bert_load_on(m, dir, em_cpu(), e); }

ml_status bert_load_on(bert_model *m, const char *dir, em_device dev, ml_error *e) {
    memset(m, 0, sizeof *m);
    if (!dir) return ml_fail(e, ML_ERR_ARG, "no model directory");
    if (dev.type != EM_CPU && !em_device_available(dev))
        return ml_fail(e, ML_ERR_ARG, "device %s:%d is not available: %s",
                       dev.type == EM_CUDA ? "cuda" : "?", dev.index, em_last_error());
    m->device = dev;
    ml_status s = read_config(&m->cfg, dir, e);
    if (s == ML_OK) {
        char path[4096];
        snprintf(path, sizeof path, "%s/vocab.txt", dir);
        if (!(m->vocab = wp_vocab_load(path, e))) s = ML_ERR_FORMAT;
        else if (wp_vocab_size(m->vocab) != m->cfg.vocab)
            s = ml_fail(e, ML_ERR_FORMAT, "%s has %d tokens, config.json says %d", path,
                        wp_vocab_size(m->vocab), m->cfg.vocab);
    }
    if (s == ML_OK) s = load_weights(m, dir, e);
    if (s != ML_OK) bert_free(m);
    return s;
}

ml_status bert_to_dtype(bert_model *m, em_dtype dtype, ml_error *e) {
    if (dtype != EM_F32 && dtype != EM_F16 && dtype != EM_BF16)
        return ml_fail(e, ML_ERR_ARG, "bert_to_dtype: f32, f16 or bf16, not %s", em_dtype_name(dtype));
    em_tensor **slots[5 + 12 * 1024];
    int n = weight_slots(m, slots, (int)(sizeof slots / sizeof slots[0]));
    em_scope_begin();
    for (int i = 0; i < n; i++) {
        em_tensor *t = em_cast(*slots[i], dtype); /* owned by the scope until retained */
        if (!t) {
            em_scope_end();
            return ml_fail(e, ML_ERR_EMBER, "converting the weights: %s", em_last_error());
        }
        em_retain(t);
        em_release(*slots[i]);
        *slots[i] = t;
    }
    em_scope_end();
    m->dtype = dtype;
    return ML_OK;
}

void bert_free(bert_model *m) {
    em_tensor **slots[5 + 12 * 1024];
    int n = weight_slots(m, slots, (int)(sizeof slots / sizeof slots[0]));
    for (int i = 0; i < n; i++) em_release(*slots[i]);
    free(m->layer);
    wp_vocab_free(m->vocab);
    memset(m, 0, sizeof *m);
}

/* ---- tokenization ---- */

ml_status bert_tokenize(const bert_model *m, int n, const char *const *texts, int pad_to,
                        em_tensor **ids, em_tensor **mask, int *ntokens, ml_error *e) {
    if (n < 1 || !texts || pad_to < 1 || !ids || !mask) return ml_fail(e, ML_ERR_ARG, "bert_tokenize: bad arguments");
    int cap = m->cfg.max_seq;
    int32_t *tok = malloc(sizeof *tok * (size_t)n * (size_t)cap);
    int *len = calloc((size_t)n, sizeof *len);
    ml_status s = tok && len ? ML_OK : ml_fail(e, ML_ERR_NOMEM, "out of memory");
    int T = 0;
    for (int i = 0; i < n && s == ML_OK; i++) {
        const char *t = texts[i] ? texts[i] : "";
        s = wp_encode(m->vocab, t, strlen(t), cap, tok + (size_t)i * cap, &len[i], e);
        if (len[i] > T) T = len[i];
    }
    T = (T + pad_to - 1) / pad_to * pad_to;
    if (T > m->cfg.max_positions) T = m->cfg.max_positions;
    int64_t *iv = s == ML_OK ? calloc((size_t)n * T, sizeof *iv) : NULL;
    float *mv = s == ML_OK ? calloc((size_t)n * T, sizeof *mv) : NULL;
    if (s == ML_OK && (!iv || !mv)) s = ml_fail(e, ML_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n && s == ML_OK; i++) {
        for (int j = 0; j < len[i]; j++) iv[(size_t)i * T + j] = tok[(size_t)i * cap + j], mv[(size_t)i * T + j] = 1;
        if (ntokens) ntokens[i] = len[i];
    }
    if (s == ML_OK) {
        *ids = em_from_data(iv, EM_I64, 2, (int64_t[]){n, T}, m->device);
        *mask = em_from_data(mv, EM_F32, 2, (int64_t[]){n, T}, m->device);
        if (*mask && m->dtype != EM_F32) *mask = em_cast(*mask, m->dtype); /* 0 and 1: exact */
        if (!*ids || !*mask) s = ml_fail(e, ML_ERR_EMBER, "%s", em_last_error());
    }
    free(tok), free(len), free(iv), free(mv);
    return s;
}

/* ---- the encoder ---- */

/* One of query/key/value (which = 0, 1, 2) of qkv [B, T, 3H] as heads
 * [B, NH, T, HD]: views, no copies. */
static em_tensor *heads(const bert_config *c, em_tensor *qkv, int which, int64_t B, int64_t T) {
    int64_t H = c->hidden, NH = c->heads;
    em_tensor *t = em_slice(qkv, -1, which * H, (which + 1) * H, 1);
    return em_transpose(em_reshape(t, 4, (int64_t[]){B, T, NH, H / NH}), 1, 2);
}

/* Self-attention; bias [B, 1, 1, T] is 0 for tokens, -1e9 for padding, so
 * padded keys get exactly zero weight after the softmax. */
static em_tensor *attention(const bert_config *c, const bert_layer *L, em_tensor *x, em_tensor *bias) {
    int64_t B = em_size(x, 0), T = em_size(x, 1), H = c->hidden;
    em_tensor *qkv = em_add(em_matmul(x, L->wqkv), L->bqkv);
    em_tensor *q = heads(c, qkv, 0, B, T), *k = heads(c, qkv, 1, B, T), *v = heads(c, qkv, 2, B, T);
    em_tensor *s = em_mul_scalar(em_matmul(q, em_transpose(k, -2, -1)), 1.0 / sqrt((double)H / c->heads));
    em_tensor *p = em_softmax(em_add(s, bias), -1);
    em_tensor *y = em_reshape(em_transpose(em_matmul(p, v), 1, 2), 3, (int64_t[]){B, T, H});
    return em_add(em_matmul(y, L->wo), L->bo);
}

static em_tensor *encoder_layer(const bert_config *c, const bert_layer *L, em_tensor *x, em_tensor *bias) {
    x = em_layer_norm(em_add(x, attention(c, L, x, bias)), 1, L->ln1_w, L->ln1_b, c->eps);
    em_tensor *h = em_gelu(em_add(em_matmul(x, L->w1), L->b1));
    return em_layer_norm(em_add(x, em_add(em_matmul(h, L->w2), L->b2)), 1, L->ln2_w, L->ln2_b, c->eps);
}

/* Mean over the tokens the mask keeps, then x / max(|x|, 1e-12), as
 * sentence-transformers' Pooling and Normalize modules. */
static em_tensor *pool(em_tensor *x, em_tensor *mask) {
    em_tensor *sum = em_sum(em_mul(x, em_unsqueeze(mask, -1)), 1, (int[]){1}, false);
    em_tensor *count = em_maximum_scalar(em_sum(mask, 1, (int[]){1}, true), 1e-9);
    em_tensor *mean = em_div(sum, count);
    em_tensor *norm = em_sqrt(em_sum(em_mul(mean, mean), 1, (int[]){-1}, true));
    return em_div(mean, em_maximum_scalar(norm, 1e-12));
}

/* The stages as em_fns, each compiled on its own by bert_compile. */

/* in: ids [B, T] (I64), mask [B, T]; out: x [B, T, H], the attention
 * bias [B, 1, 1, T].  ctx: the model. */
static em_status embed_fn(void *ctx, em_tensor *const *in, const double *scalars, em_tensor **out) {
    (void)scalars;
    const bert_model *m = ctx;
    em_tensor *ids = in[0], *mask = in[1];
    int64_t B = em_size(ids, 0), T = em_size(ids, 1);
    em_tensor *x = em_add(em_add(em_embedding(m->word, ids), em_slice(m->pos, 0, 0, T, 1)), m->type0);
    out[0] = em_layer_norm(x, 1, m->ln_w, m->ln_b, m->cfg.eps);
    out[1] = em_reshape(em_mul_scalar(em_sub_scalar(mask, 1.0), 1e9), 4, (int64_t[]){B, 1, 1, T});
    return out[0] && out[1] ? EM_OK : em_last_status();
}

typedef struct layer_ctx {
    const bert_config *cfg;
    const bert_layer *layer;
} layer_ctx;

/* in: x, bias; out: x after the layer.  ctx: a layer_ctx. */
static em_status layer_fn(void *ctx, em_tensor *const *in, const double *scalars, em_tensor **out) {
    (void)scalars;
    const layer_ctx *l = ctx;
    out[0] = encoder_layer(l->cfg, l->layer, in[0], in[1]);
    return out[0] ? EM_OK : em_last_status();
}

/* in: x, mask; out: the embeddings [B, H]. */
static em_status pool_fn(void *ctx, em_tensor *const *in, const double *scalars, em_tensor **out) {
    (void)ctx, (void)scalars;
    out[0] = pool(in[0], in[1]);
    return out[0] ? EM_OK : em_last_status();
}

/* Runs the stages: each through its compiled function when c is not NULL,
 * else directly (eagerly).  Each layer's intermediates are freed when it
 * ends, so an eager call holds one layer's activations, not six. */
static em_status run_stages(const bert_model *m, bert_compiled *c, em_tensor *const *in, em_tensor **out) {
    em_tensor *xb[2] = {NULL, NULL};
    em_status s = c ? em_call(c->embed, in, NULL, xb) : embed_fn((void *)m, in, NULL, xb);
    for (int i = 0; i < m->cfg.layers && s == EM_OK; i++) {
        layer_ctx l = {&m->cfg, &m->layer[i]};
        em_tensor *y = NULL;
        em_scope_begin();
        s = c ? em_call(c->layer[i], xb, NULL, &y) : layer_fn(&l, xb, NULL, &y);
        xb[0] = em_keep(y);
        em_scope_end();
    }
    if (s != EM_OK) return s;
    em_tensor *pin[2] = {xb[0], in[1]};
    return c ? em_call(c->pool, pin, NULL, out) : pool_fn(NULL, pin, NULL, out);
}

em_status bert_forward(void *ctx, em_tensor *const *in, const double *scalars, em_tensor **out) {
    (void)scalars;
    return run_stages(ctx, NULL, in, out);
}

/* ---- compiled ---- */

ml_status bert_compile(const bert_model *m, bert_compiled *c, ml_error *e) {
    memset(c, 0, sizeof *c);
    int n = m->cfg.layers;
    c->layer = calloc((size_t)n, sizeof *c->layer);
    c->ctx = calloc((size_t)n, sizeof(layer_ctx));
    if (!c->layer || !c->ctx) {
        bert_compiled_free(c);
        return ml_fail(e, ML_ERR_NOMEM, "out of memory");
    }
    c->count = n;
    em_compile_options eo = {.ninputs = 2, .noutputs = 2, .name = "minilm_embed",
                             .input_names = (const char *[]){"ids", "mask"}};
    em_compile_options lo = {.ninputs = 2, .noutputs = 1, .name = "minilm_layer",
                             .input_names = (const char *[]){"x", "bias"}};
    em_compile_options po = {.ninputs = 2, .noutputs = 1, .name = "minilm_pool",
                             .input_names = (const char *[]){"x", "mask"}};
    c->embed = em_compile(embed_fn, (void *)m, &eo);
    c->pool = em_compile(pool_fn, NULL, &po);
    bool ok = c->embed && c->pool;
    layer_ctx *lc = c->ctx;
    for (int i = 0; i < n && ok; i++) {
        lc[i] = (layer_ctx){&m->cfg, &m->layer[i]};
        ok = (c->layer[i] = em_compile(layer_fn, &lc[i], &lo)) != NULL;
    }
    if (!ok) {
        bert_compiled_free(c);
        return ml_fail(e, ML_ERR_EMBER, "em_compile: %s", em_last_error());
    }
    return ML_OK;
}

em_status bert_compiled_call(bert_compiled *c, const bert_model *m, em_tensor *const *in, em_tensor **out) {
    return run_stages(m, c, in, out);
}

void bert_compiled_stats(const bert_compiled *c, em_compile_stats *sum) {
    memset(sum, 0, sizeof *sum);
    for (int i = -2; i < c->count; i++) {
        em_compile_stats st;
        const em_compiled *f = i == -2 ? c->embed : i == -1 ? c->pool : c->layer[i];
        if (!f || em_compiled_stats(f, &st) != EM_OK) continue;
        sum->calls += st.calls, sum->hits += st.hits, sum->traces += st.traces, sum->eager += st.eager;
        sum->entries += st.entries, sum->kernels += st.kernels;
        sum->kernels_compiled += st.kernels_compiled, sum->kernels_loaded += st.kernels_loaded;
        sum->graphs_loaded += st.graphs_loaded, sum->graphs_lowered += st.graphs_lowered;
        sum->segmented += st.segmented, sum->dynamic_entries += st.dynamic_entries;
        sum->pending += st.pending;
        sum->broken |= st.broken;
        if (st.last_failure[0]) memcpy(sum->last_failure, st.last_failure, sizeof sum->last_failure);
    }
}

void bert_compiled_free(bert_compiled *c) {
    em_compiled_free(c->embed);
    em_compiled_free(c->pool);
    for (int i = 0; c->layer && i < c->count; i++) em_compiled_free(c->layer[i]);
    free(c->layer);
    free(c->ctx);
    memset(c, 0, sizeof *c);
}
