/* test_graph.c - the graph IR's text form: printing (golden texts), parsing
 * (round trips, every malformed input an error), DOT output. */
#include "testutil.h"

#include <locale.h>
#include <string.h>

#include "trace.h"

static const em_device CPU = {EM_CPU, 0};

/* ---- helpers ---- */

static em_meta meta_of(const em_tensor *t) {
    ck_assert_msg(t != NULL, "tensor: %s", em_last_error());
    em_meta m;
    tr_meta_of(t, &m);
    return m;
}

static int input(tr_graph *g, const char *name, const em_meta *m) {
    int k = tr_add_input(g, name, m);
    ck_assert_int_ge(k, 0);
    return k;
}

static int constant(tr_graph *g, em_tensor *t) {
    ck_assert_ptr_nonnull(t);
    int k = tr_add_const(g, t);
    ck_assert_int_ge(k, 0);
    return k;
}

/* A call whose meta is that of the eager tensor `like` (computed by the same
 * op on real tensors), or of m when like is NULL. */
static int call(tr_graph *g, em_op op, int nin, const int *in, const em_op_attrs *a,
                const em_tensor *like) {
    em_meta m = meta_of(like);
    int k = tr_add_call(g, op, nin, in, a, &m);
    ck_assert_int_ge(k, 0);
    return k;
}

static void outputs(tr_graph *g, int n, const int *nodes) {
    ck_assert_int_eq(tr_set_outputs(g, n, nodes), EM_OK);
}

#define INS(...) ((const int[]){__VA_ARGS__})
#define NINS(...) ((int)(sizeof(INS(__VA_ARGS__)) / sizeof(int)))
#define CALL(g, op, attrs, like, ...) call((g), (op), NINS(__VA_ARGS__), INS(__VA_ARGS__), (attrs), (like))
#define CREATE(g, op, attrs, like) call((g), (op), 0, NULL, (attrs), (like))

static char *text_of(const tr_graph *g) {
    char *t = tr_to_text(g);
    ck_assert_msg(t != NULL, "tr_to_text: %s", em_last_error());
    return t;
}

static void assert_meta_eq(const em_meta *a, const em_meta *b, int node) {
    ck_assert_msg(a->ndim == b->ndim, "node %d: ndim %d vs %d", node, a->ndim, b->ndim);
    size_t n = sizeof(int64_t) * (size_t)a->ndim;
    ck_assert_msg(!memcmp(a->sizes, b->sizes, n), "node %d: sizes differ", node);
    ck_assert_msg(!memcmp(a->strides, b->strides, n), "node %d: strides differ", node);
    ck_assert_msg(a->offset == b->offset, "node %d: offset differs", node);
    ck_assert_msg(a->dtype == b->dtype, "node %d: dtype differs", node);
    ck_assert_msg(a->device.type == b->device.type && a->device.index == b->device.index,
                  "node %d: device differs", node);
}

/* b (parsed from a's text) holds the same nodes as a, node for node. */
static void assert_same_graph(const tr_graph *a, const tr_graph *b) {
    ck_assert_int_eq(a->nnodes, b->nnodes);
    ck_assert_int_eq(a->ninputs, b->ninputs);
    ck_assert_int_eq(a->nconsts, b->nconsts);
    ck_assert_int_eq(a->noutputs, b->noutputs);
    for (int i = 0; i < a->noutputs; i++) ck_assert_int_eq(a->outputs[i], b->outputs[i]);
    for (int i = 0; i < a->nconsts; i++) ck_assert_ptr_eq(a->consts[i], b->consts[i]);
    for (int i = 0; i < a->nnodes; i++) {
        const tr_node *x = &a->nodes[i], *y = &b->nodes[i];
        ck_assert_msg(x->kind == y->kind, "node %d: kind differs", i);
        assert_meta_eq(&x->meta, &y->meta, i);
        if (x->kind == TR_CALL) {
            ck_assert_msg(tr_same_call(x, y), "node %d (%s): calls differ", i,
                          em_op_table[x->op].name);
        } else {
            ck_assert_int_eq(x->index, y->index);
            if (x->kind == TR_INPUT) ck_assert_str_eq(x->name, y->name);
        }
    }
}

/* print -> parse -> print: the same text and the same graph. */
static void assert_round_trip(const tr_graph *g) {
    char *t1 = text_of(g);
    tr_graph *p = tr_parse(t1, g->consts, g->nconsts);
    ck_assert_msg(p != NULL, "parse failed: %s\n%s", em_last_error(), t1);
    char *t2 = text_of(p);
    ck_assert_str_eq(t1, t2);
    assert_same_graph(g, p);
    em_free(t2);
    em_free(t1);
    tr_graph_free(p);
}

/* Asserts that parsing text fails with EM_ERR_ARG and a positioned message;
 * returns nothing, frees everything. */
static void assert_parse_fails_at(const char *file, int line, const char *text,
                                  em_tensor *const *consts, int nconsts) {
    em_clear_error();
    tr_graph *g = tr_parse(text, consts, nconsts);
    if (g) {
        tr_graph_free(g);
        ck_abort_msg("%s:%d: parsing succeeded:\n%s", file, line, text);
    }
    ck_assert_msg(em_last_status() == EM_ERR_ARG, "%s:%d: status %s (%s) for:\n%s", file, line,
                  em_status_name(em_last_status()), em_last_error(), text);
    ck_assert_msg(strstr(em_last_error(), "graph text line ") &&
                      strstr(em_last_error(), ", column "),
                  "%s:%d: message without a position: %s", file, line, em_last_error());
}
#define assert_parse_fails(text, consts, n) assert_parse_fails_at(__FILE__, __LINE__, (text), (consts), (n))

#define X_F4_ "graph(%x: f32[4]{1}) {\n"

/* ---- the graphs ---- */

static const char *mlp_text =
    "graph(%x: f32[4, 8]{8, 1}, %w: f32[8, 16]{16, 1}) {\n"
    "  %2 = constant #0 : f32[16]{1}\n"
    "  %3 = matmul(%x, %w) : f32[4, 16]{16, 1}\n"
    "  %4 = add(%3, %2) : f32[4, 16]{16, 1}\n"
    "  %5 = relu(%4) : f32[4, 16]{16, 1}\n"
    "  return (%5)\n"
    "}\n";

/* relu(x @ w + b), b = arange(16) as a constant; *b_out: the constant. */
static tr_graph *mlp_graph(em_tensor **b_out) {
    em_tensor *x = em_ones(2, TU_SIZES(4, 8), EM_F32, CPU);
    em_tensor *w = em_ones(2, TU_SIZES(8, 16), EM_F32, CPU);
    em_tensor *b = em_arange(0, 16, 1, EM_F32, CPU);
    em_tensor *xw = em_matmul(x, w), *y = em_add(xw, b), *r = em_relu(y);
    tr_graph *g = tr_graph_new();
    ck_assert_ptr_nonnull(g);
    em_meta mx = meta_of(x), mw = meta_of(w);
    int ix = input(g, "x", &mx), iw = input(g, "w", &mw);
    int ib = constant(g, b);
    int k = CALL(g, EM_OP_MATMUL, NULL, xw, ix, iw);
    k = CALL(g, EM_OP_ADD, NULL, y, k, ib);
    k = CALL(g, EM_OP_RELU, NULL, r, k);
    outputs(g, 1, INS(k));
    if (b_out) *b_out = b;
    return g;
}

static const char *attrs_text =
    "graph(%a: f32[2, 3, 4]{12, 4, 1}, %c: f32[2, 3, 1]{3, 1, 1}, %s: f32[2, 1, 4]{4, 4, 1}) {\n"
    "  %3 = constant #0 : i64[2]{1}\n"
    "  %4 = full() [sizes=[2, 3], value=0.5, dtype=f32, device=cpu] : f32[2, 3]{3, 1}\n"
    "  %5 = full() [sizes=[4], value=-inf, dtype=f64, device=cpu] : f64[4]{1}\n"
    "  %6 = arange() [sizes=[5], from=1.5, by=-0.25, dtype=f64, device=cpu] : f64[5]{1}\n"
    "  %7 = randn() [sizes=[3, 4], dtype=f32, device=cpu, seed=42, offset=7] : f32[3, 4]{4, 1}\n"
    "  %8 = sum(%a) [dims=[0, 2], keepdim=true] : f32[1, 3, 1]{3, 1, 1}\n"
    "  %9 = var(%a) [dims=[1], correction=1, keepdim=false] : f32[2, 4]{4, 1}\n"
    "  %10 = argmax(%a) [dim=2, keepdim=false] : i64[2, 3]{3, 1}\n"
    "  %11 = slice(%a) [dim=1, start=1, end=3, step=1] : f32[2, 2, 4]{12, 4, 1}+4\n"
    "  %12 = permute(%a) [dims=[2, 0, 1]] : f32[4, 2, 3]{1, 12, 4}\n"
    "  %13 = reshape(%a) [sizes=[6, 4]] : f32[6, 4]{4, 1}\n"
    "  %14 = expand(%c) [sizes=[2, 3, 5]] : f32[2, 3, 5]{3, 1, 0}\n"
    "  %15 = cat(%a, %s, %a) [dim=1] : f32[2, 7, 4]{28, 4, 1}\n"
    "  %16 = index_select(%a, %3) [dim=2] : f32[2, 3, 2]{6, 2, 1}\n"
    "  %17 = cast(%a) [dtype=bf16] : bf16[2, 3, 4]{12, 4, 1}\n"
    "  %18 = contiguous(%11) : f32[2, 2, 4]{8, 4, 1}\n"
    "  return (%4, %5, %6, %7, %8, %9, %10, %12, %13, %14, %15, %16, %17, %18)\n"
    "}\n";

/* One call of (nearly) every attribute kind, metas from the eager ops. */
static tr_graph *attrs_graph(void) {
    em_tensor *a = tu_random(1, 3, TU_SIZES(2, 3, 4), EM_F32, 1.0);
    em_tensor *c = em_ones(3, TU_SIZES(2, 3, 1), EM_F32, CPU);
    em_tensor *s = em_ones(3, TU_SIZES(2, 1, 4), EM_F32, CPU);
    em_tensor *idx = em_arange(0, 4, 2, EM_I64, CPU);
    em_generator *gen = em_generator_new(42);
    em_tensor *rn = em_randn(gen, 2, TU_SIZES(3, 4), EM_F32, CPU);
    em_generator_free(gen);
    em_tensor *sl = em_slice(a, 1, 1, 3, 1);
    em_tensor *parts[3] = {a, s, a};

    tr_graph *g = tr_graph_new();
    ck_assert_ptr_nonnull(g);
    em_meta ma = meta_of(a), mc = meta_of(c), ms = meta_of(s);
    int ia = input(g, "a", &ma), ic = input(g, "c", &mc), is = input(g, "s", &ms);
    int ii = constant(g, idx);
    int o[14], n = 0;
    o[n++] = CREATE(g, EM_OP_FULL,
                    (&(em_op_attrs){.ndim = 2, .sizes = {2, 3}, .value = 0.5, .dtype = EM_F32}),
                    em_full(2, TU_SIZES(2, 3), 0.5, EM_F32, CPU));
    o[n++] = CREATE(g, EM_OP_FULL,
                    (&(em_op_attrs){.ndim = 1, .sizes = {4}, .value = -INFINITY, .dtype = EM_F64}),
                    em_full(1, TU_SIZES(4), -INFINITY, EM_F64, CPU));
    o[n++] = CREATE(g, EM_OP_ARANGE,
                    (&(em_op_attrs){.ndim = 1, .sizes = {5}, .fstart = 1.5, .fstep = -0.25,
                                    .dtype = EM_F64}),
                    em_arange(1.5, 0.25, -0.25, EM_F64, CPU));
    o[n++] = CREATE(g, EM_OP_RANDN,
                    (&(em_op_attrs){.ndim = 2, .sizes = {3, 4}, .dtype = EM_F32, .seed = 42,
                                    .offset = 7}),
                    rn);
    o[n++] = CALL(g, EM_OP_SUM, (&(em_op_attrs){.ndims = 2, .dims = {0, 2}, .keepdim = true}),
                  em_sum(a, 2, (int[]){0, 2}, true), ia);
    o[n++] = CALL(g, EM_OP_VAR, (&(em_op_attrs){.ndims = 1, .dims = {1}, .correction = 1}),
                  em_var(a, 1, (int[]){1}, 1, false), ia);
    o[n++] = CALL(g, EM_OP_ARGMAX, (&(em_op_attrs){.dim = 2}), em_argmax(a, 2, false), ia);
    int isl = CALL(g, EM_OP_SLICE, (&(em_op_attrs){.dim = 1, .start = 1, .end = 3, .step = 1}),
                   sl, ia);
    o[n++] = CALL(g, EM_OP_PERMUTE, (&(em_op_attrs){.ndims = 3, .dims = {2, 0, 1}}),
                  em_permute(a, 3, (int[]){2, 0, 1}), ia);
    o[n++] = CALL(g, EM_OP_RESHAPE, (&(em_op_attrs){.ndim = 2, .sizes = {6, 4}}),
                  em_reshape(a, 2, TU_SIZES(6, 4)), ia);
    o[n++] = CALL(g, EM_OP_EXPAND, (&(em_op_attrs){.ndim = 3, .sizes = {2, 3, 5}}),
                  em_expand(c, 3, TU_SIZES(2, 3, 5)), ic);
    o[n++] = CALL(g, EM_OP_CAT, (&(em_op_attrs){.dim = 1}), em_cat(3, parts, 1), ia, is, ia);
    o[n++] = CALL(g, EM_OP_INDEX_SELECT, (&(em_op_attrs){.dim = 2}), em_index_select(a, 2, idx),
                  ia, ii);
    o[n++] = CALL(g, EM_OP_CAST, (&(em_op_attrs){.dtype = EM_BF16}), em_cast(a, EM_BF16), ia);
    o[n++] = CALL(g, EM_OP_CONTIGUOUS, NULL, em_contiguous(sl), isl);
    outputs(g, n, o);
    return g;
}

/* A CUDA input and ops on it, inputs with offsets and names to quote. */
static tr_graph *odd_graph(void) {
    tr_graph *g = tr_graph_new();
    em_meta cuda = {.ndim = 2, .sizes = {3, 5}, .strides = {5, 1}, .dtype = EM_F32,
                    .device = em_cuda(1)};
    em_meta off = {.ndim = 1, .sizes = {2}, .strides = {2}, .offset = 1, .dtype = EM_F64};
    int ig = input(g, "gpu", &cuda);
    int i1 = input(g, "my input", &off);
    int i2 = input(g, "q\"uo\\te\n", &off);
    int i3 = input(g, "3", &off);
    int i4 = input(g, "a b,c", &off);
    em_meta r = cuda;
    int k1 = tr_add_call(g, EM_OP_RELU, 1, INS(ig), NULL, &r);
    em_meta tr = {.ndim = 2, .sizes = {5, 3}, .strides = {1, 5}, .dtype = EM_F32,
                  .device = em_cuda(1)};
    int k2 = tr_add_call(g, EM_OP_PERMUTE, 1, INS(k1), &(em_op_attrs){.ndims = 2, .dims = {1, 0}},
                         &tr);
    em_meta sum = {.ndim = 1, .sizes = {2}, .strides = {1}, .dtype = EM_F64};
    int k3 = tr_add_call(g, EM_OP_ADD, 2, INS(i1, i2), NULL, &sum);
    int k4 = tr_add_call(g, EM_OP_MUL, 2, INS(i3, i4), NULL, &sum);
    ck_assert(k1 >= 0 && k2 >= 0 && k3 >= 0 && k4 >= 0);
    outputs(g, 4, INS(k2, k3, k4, i1));
    return g;
}

static const char *odd_text =
    "graph(%gpu: f32[3, 5]{5, 1}@cuda:1, %\"my input\": f64[2]{2}+1, "
    "%\"q\\\"uo\\\\te\\x0a\": f64[2]{2}+1, %\"3\": f64[2]{2}+1, %\"a b,c\": f64[2]{2}+1) {\n"
    "  %5 = relu(%gpu) : f32[3, 5]{5, 1}@cuda:1\n"
    "  %6 = permute(%5) [dims=[1, 0]] : f32[5, 3]{1, 5}@cuda:1\n"
    "  %7 = add(%\"my input\", %\"q\\\"uo\\\\te\\x0a\") : f64[2]{1}\n"
    "  %8 = mul(%\"3\", %\"a b,c\") : f64[2]{1}\n"
    "  return (%6, %7, %8, %\"my input\")\n"
    "}\n";

/* ---- (a) golden texts ---- */

/* ---- the linear pass (linear.c) ---- */

/* The pass on text with want (ctx), as text (NULL: no rewrite); *n: the
 * linear nodes made. */
static char *linear_want_of(const char *text, tr_linear_want want, void *ctx, int *n) {
    tr_graph *g = tr_parse_placeholders(text);
    ck_assert_msg(g != NULL, "%s", em_last_error());
    tr_graph *f = tr_fuse_linear_map(g, want, ctx, n, NULL);
    char *t = f ? text_of(f) : NULL;
    if (f) ck_assert_int_eq(tr_verify(f), EM_OK);
    tr_graph_free(f);
    tr_graph_free(g);
    return t;
}

/* The same with want NULL (every match). */
static char *linear_of(const char *text, int *n) { return linear_want_of(text, NULL, NULL, n); }

static bool say_no(void *ctx, const tr_graph *g, int m, int b, em_act act) {
    (void)g, (void)m, (void)b, (void)act;
    (*(int *)ctx)++;
    return false;
}

/* A device hook that adds the bias and applies no activation (as CUDA's
 * skinny kernel): counts the questions in *ctx. */
static bool bias_only(void *ctx, const tr_graph *g, int m, int b, em_act act) {
    (void)g, (void)m, (void)b;
    (*(int *)ctx)++;
    return act == EM_ACT_NONE;
}

START_TEST(linear_pass_golden) {
    int n;
    char *t = linear_of(mlp_text, &n);
    ck_assert_int_eq(n, 1);
    ck_assert_str_eq(t, "graph(%x: f32[4, 8]{8, 1}, %w: f32[8, 16]{16, 1}) {\n"
                        "  %2 = constant #0 : f32[16]{1}\n"
                        "  %3 = linear(%x, %w, %2) [act=relu] : f32[4, 16]{16, 1}\n"
                        "  return (%3)\n"
                        "}\n");
    em_free(t);
    /* a device that applies no activation: the relu stays, asked twice
     * (with relu, then without) */
    int asked = 0;
    t = linear_want_of(mlp_text, bias_only, &asked, &n);
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(asked, 2);
    ck_assert_str_eq(t, "graph(%x: f32[4, 8]{8, 1}, %w: f32[8, 16]{16, 1}) {\n"
                        "  %2 = constant #0 : f32[16]{1}\n"
                        "  %3 = linear(%x, %w, %2) [act=none] : f32[4, 16]{16, 1}\n"
                        "  %4 = relu(%3) : f32[4, 16]{16, 1}\n"
                        "  return (%4)\n"
                        "}\n");
    em_free(t);
    /* bias first, a [1, 1, N] bias over a batched product */
    t = linear_of("graph(%x: f32[2, 1, 8]{8, 8, 1}, %w: f32[8, 16]{16, 1}, %b: f32[1, 1, 16]{16, 16, 1}) {\n"
                  "  %3 = matmul(%x, %w) : f32[2, 1, 16]{16, 16, 1}\n"
                  "  %4 = add(%b, %3) : f32[2, 1, 16]{16, 16, 1}\n"
                  "  return (%4)\n"
                  "}\n", &n);
    ck_assert_int_eq(n, 1);
    ck_assert_str_eq(t, "graph(%x: f32[2, 1, 8]{8, 8, 1}, %w: f32[8, 16]{16, 1}, %b: f32[1, 1, 16]{16, 16, 1}) {\n"
                        "  %3 = linear(%x, %w, %b) [act=none] : f32[2, 1, 16]{16, 16, 1}\n"
                        "  return (%3)\n"
                        "}\n");
    em_free(t);
    /* the device's no: nothing rewritten, each match asked once */
    tr_graph *g = tr_parse_placeholders(mlp_text);
    asked = 0;
    ck_assert_ptr_null(tr_fuse_linear_map(g, say_no, &asked, &n, NULL));
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(asked, 2); /* with the relu, then without */
    tr_graph_free(g);
}
END_TEST

/* What the pass must leave alone. */
START_TEST(linear_pass_leaves_non_bias_adds) {
    static const char *cases[] = {
        /* the product read twice */
        "graph(%x: f32[4, 8]{8, 1}, %w: f32[8, 16]{16, 1}, %b: f32[16]{1}) {\n"
        "  %3 = matmul(%x, %w) : f32[4, 16]{16, 1}\n"
        "  %4 = add(%3, %b) : f32[4, 16]{16, 1}\n"
        "  %5 = mul(%3, %4) : f32[4, 16]{16, 1}\n"
        "  return (%5)\n}\n",
        /* the product an output */
        "graph(%x: f32[4, 8]{8, 1}, %w: f32[8, 16]{16, 1}, %b: f32[16]{1}) {\n"
        "  %3 = matmul(%x, %w) : f32[4, 16]{16, 1}\n"
        "  %4 = add(%3, %b) : f32[4, 16]{16, 1}\n"
        "  return (%4, %3)\n}\n",
        /* a full-size addend, and one along the columns */
        "graph(%x: f32[4, 8]{8, 1}, %w: f32[8, 16]{16, 1}, %b: f32[4, 16]{16, 1}) {\n"
        "  %3 = matmul(%x, %w) : f32[4, 16]{16, 1}\n"
        "  %4 = add(%3, %b) : f32[4, 16]{16, 1}\n"
        "  return (%4)\n}\n",
        "graph(%x: f32[4, 8]{8, 1}, %w: f32[8, 16]{16, 1}, %b: f32[4, 1]{1, 1}) {\n"
        "  %3 = matmul(%x, %w) : f32[4, 16]{16, 1}\n"
        "  %4 = add(%3, %b) : f32[4, 16]{16, 1}\n"
        "  return (%4)\n}\n",
        /* a bias that widens the result */
        "graph(%x: f32[4, 8]{8, 1}, %w: f32[8, 16]{16, 1}, %b: f32[3, 1, 16]{16, 16, 1}) {\n"
        "  %3 = matmul(%x, %w) : f32[4, 16]{16, 1}\n"
        "  %4 = add(%3, %b) : f32[3, 4, 16]{64, 16, 1}\n"
        "  return (%4)\n}\n",
        /* a product added to itself */
        "graph(%x: f32[4, 8]{8, 1}, %w: f32[8, 16]{16, 1}) {\n"
        "  %2 = matmul(%x, %w) : f32[4, 16]{16, 1}\n"
        "  %3 = add(%2, %2) : f32[4, 16]{16, 1}\n"
        "  return (%3)\n}\n",
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        int n = -1;
        char *t = linear_of(cases[i], &n);
        ck_assert_msg(t == NULL && n == 0, "case %zu rewritten:\n%s", i, t ? t : "");
    }
}
END_TEST

/* The linear pass's activations: gelu_tanh folds as relu does (golden);
 * gelu with erf, an add read twice and an add that is an output keep
 * their act as a node, the add still made linear; a product and bias of
 * different dtypes fuse nothing. */
static const char *gelu_mlp_text =
    "graph(%x: bf16[3, 5]{5, 1}, %w1: bf16[5, 7]{7, 1}, %b1: bf16[7]{1}, %w2: bf16[7, 2]{2, 1}, %b2: bf16[2]{1}) {\n"
    "  %5 = matmul(%x, %w1) : bf16[3, 7]{7, 1}\n"
    "  %6 = add(%5, %b1) : bf16[3, 7]{7, 1}\n"
    "  %7 = gelu_tanh(%6) : bf16[3, 7]{7, 1}\n"
    "  %8 = matmul(%7, %w2) : bf16[3, 2]{2, 1}\n"
    "  %9 = add(%b2, %8) : bf16[3, 2]{2, 1}\n"
    "  return (%9)\n"
    "}\n";

START_TEST(linear_pass_activations) {
    int n;
    char *t = linear_of(gelu_mlp_text, &n);
    ck_assert_int_eq(n, 2);
    ck_assert_str_eq(t, "graph(%x: bf16[3, 5]{5, 1}, %w1: bf16[5, 7]{7, 1}, %b1: bf16[7]{1}, %w2: bf16[7, 2]{2, 1}, "
                        "%b2: bf16[2]{1}) {\n"
                        "  %5 = linear(%x, %w1, %b1) [act=gelu_tanh] : bf16[3, 7]{7, 1}\n"
                        "  %6 = linear(%5, %w2, %b2) [act=none] : bf16[3, 2]{2, 1}\n"
                        "  return (%6)\n"
                        "}\n");
    em_free(t);
    static const struct {
        const char *why, *text, *want;
    } kept[] = {
        {"gelu's erf form (folded as gelu_tanh is)",
         "graph(%x: f32[4, 8]{8, 1}, %w: f32[8, 16]{16, 1}, %b: f32[16]{1}) {\n"
         "  %3 = matmul(%x, %w) : f32[4, 16]{16, 1}\n"
         "  %4 = add(%3, %b) : f32[4, 16]{16, 1}\n"
         "  %5 = gelu(%4) : f32[4, 16]{16, 1}\n"
         "  return (%5)\n}\n",
         "  %3 = linear(%x, %w, %b) [act=gelu] : f32[4, 16]{16, 1}\n"
         "  return (%3)\n}\n"},
        {"the linear read twice",
         "graph(%x: f32[4, 8]{8, 1}, %w: f32[8, 16]{16, 1}, %b: f32[16]{1}) {\n"
         "  %3 = matmul(%x, %w) : f32[4, 16]{16, 1}\n"
         "  %4 = add(%3, %b) : f32[4, 16]{16, 1}\n"
         "  %5 = relu(%4) : f32[4, 16]{16, 1}\n"
         "  %6 = mul(%5, %4) : f32[4, 16]{16, 1}\n"
         "  return (%6)\n}\n",
         "  %3 = linear(%x, %w, %b) [act=none] : f32[4, 16]{16, 1}\n"
         "  %4 = relu(%3) : f32[4, 16]{16, 1}\n"
         "  %5 = mul(%4, %3) : f32[4, 16]{16, 1}\n"
         "  return (%5)\n}\n"},
        {"the linear an output",
         "graph(%x: f32[4, 8]{8, 1}, %w: f32[8, 16]{16, 1}, %b: f32[16]{1}) {\n"
         "  %3 = matmul(%x, %w) : f32[4, 16]{16, 1}\n"
         "  %4 = add(%3, %b) : f32[4, 16]{16, 1}\n"
         "  %5 = gelu_tanh(%4) : f32[4, 16]{16, 1}\n"
         "  return (%5, %4)\n}\n",
         "  %3 = linear(%x, %w, %b) [act=none] : f32[4, 16]{16, 1}\n"
         "  %4 = gelu_tanh(%3) : f32[4, 16]{16, 1}\n"
         "  return (%4, %3)\n}\n"},
    };
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++) {
        t = linear_of(kept[i].text, &n);
        ck_assert_msg(t != NULL && n == 1, "%s: %d rewritten", kept[i].why, n);
        const char *body = strstr(t, "{\n");
        ck_assert_msg(body && !strcmp(body + 2, kept[i].want), "%s:\n%s", kept[i].why, t);
        em_free(t);
    }
    /* a bias of another dtype (f16 product, f32 bias: the add reads the
     * product's cast): nothing fused */
    t = linear_of("graph(%x: f16[4, 8]{8, 1}, %w: f16[8, 16]{16, 1}, %b: f32[16]{1}) {\n"
                  "  %3 = matmul(%x, %w) : f16[4, 16]{16, 1}\n"
                  "  %4 = cast(%3) [dtype=f32] : f32[4, 16]{16, 1}\n"
                  "  %5 = add(%4, %b) : f32[4, 16]{16, 1}\n"
                  "  %6 = relu(%5) : f32[4, 16]{16, 1}\n"
                  "  return (%6)\n}\n", &n);
    ck_assert_msg(t == NULL && n == 0, "rewritten:\n%s", t ? t : "");
}
END_TEST

/* The activation in the text form: printed, parsed back, checked. */
START_TEST(linear_act_text) {
    static const char *acts[] = {"none", "relu", "gelu_tanh", "gelu"};
    for (int a = 0; a < 4; a++) {
        char text[512];
        snprintf(text, sizeof text,
                 "graph(%%x: f32[2, 3]{3, 1}, %%w: f32[3, 4]{4, 1}, %%b: f32[4]{1}) {\n"
                 "  %%3 = linear(%%x, %%w, %%b) [act=%s] : f32[2, 4]{4, 1}\n"
                 "  return (%%3)\n"
                 "}\n", acts[a]);
        tr_graph *g = tr_parse_placeholders(text);
        ck_assert_msg(g != NULL, "%s", em_last_error());
        ck_assert_int_eq((int)g->nodes[3].attrs.act, a);
        ck_assert_int_eq(tr_verify(g), EM_OK);
        char *t = text_of(g);
        ck_assert_str_eq(t, text);
        em_free(t);
        tr_graph_free(g);
    }
    static const struct {
        const char *attrs, *error;
    } bad[] = {
        {"[act=tanh]", "an activation (none, relu, gelu_tanh or gelu)"},
        {"[act=gelu_erf]", "an activation (none, relu, gelu_tanh or gelu)"},
        {"[]", "linear needs attribute 'act'"},
        {"[act=relu, act=relu]", "given twice"},
        {"[dim=1]", "linear has no attribute 'dim'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "graph(%%x: f32[2, 3]{3, 1}, %%w: f32[3, 4]{4, 1}, %%b: f32[4]{1}) {\n"
                 "  %%3 = linear(%%x, %%w, %%b) %s : f32[2, 4]{4, 1}\n"
                 "  return (%%3)\n"
                 "}\n", bad[i].attrs);
        ck_assert_ptr_null(tr_parse_placeholders(text));
        ck_assert_msg(strstr(em_last_error(), bad[i].error), "%s: %s", bad[i].attrs, em_last_error());
        em_clear_error();
    }
    /* two linears that differ only in the act are different calls */
    tr_node x = {.kind = TR_CALL, .op = EM_OP_LINEAR, .nin = 0}, y = x;
    y.attrs.act = EM_ACT_RELU;
    ck_assert(!tr_same_call(&x, &y));
    ck_assert(tr_same_call(&x, &x));
}
END_TEST

START_TEST(golden_mlp) {
    tr_graph *g = mlp_graph(NULL);
    char *t = text_of(g);
    ck_assert_str_eq(t, mlp_text);
    em_free(t);
    /* tr_print writes the same */
    char *mem = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&mem, &len);
    ck_assert_int_eq(tr_print(g, f), EM_OK);
    fclose(f);
    ck_assert_str_eq(mem, mlp_text);
    free(mem);
    tr_graph_free(g);
}
END_TEST

START_TEST(golden_attrs) {
    tr_graph *g = attrs_graph();
    char *t = text_of(g);
    ck_assert_str_eq(t, attrs_text);
    em_free(t);
    tr_graph_free(g);
}
END_TEST

START_TEST(golden_odd_names_and_devices) {
    tr_graph *g = odd_graph();
    char *t = text_of(g);
    ck_assert_str_eq(t, odd_text);
    em_free(t);
    tr_graph_free(g);
}
END_TEST

/* Inputs print in the header by input number, wherever their nodes are. */
START_TEST(golden_inputs_by_number) {
    em_meta m = {.ndim = 1, .sizes = {3}, .strides = {1}, .dtype = EM_F32};
    em_meta mf = {.ndim = 0, .dtype = EM_F32};
    tr_graph *g = tr_graph_new();
    int kf = tr_add_call(g, EM_OP_FULL, 0, NULL,
                         &(em_op_attrs){.value = -0.0, .dtype = EM_F32}, &mf);
    int ia = input(g, "a", &m);
    int ib = input(g, "b", &m);
    /* b is input 0, a input 1 */
    g->nodes[ia].index = 1;
    g->nodes[ib].index = 0;
    int k = tr_add_call(g, EM_OP_SUB, 2, INS(ia, ib), NULL, &m);
    outputs(g, 2, INS(k, kf));
    char *t = text_of(g);
    ck_assert_str_eq(t, "graph(%b: f32[3]{1}, %a: f32[3]{1}) {\n"
                        "  %0 = full() [sizes=[], value=-0, dtype=f32, device=cpu] : f32[]{}\n"
                        "  %3 = sub(%a, %b) : f32[3]{1}\n"
                        "  return (%3, %0)\n"
                        "}\n");
    /* parsed: inputs first, numbered by the header, nodes renumbered */
    tr_graph *p = tr_parse(t, NULL, 0);
    ck_assert_msg(p != NULL, "%s", em_last_error());
    ck_assert_int_eq(p->nnodes, 4);
    ck_assert_int_eq(p->nodes[0].kind, TR_INPUT);
    ck_assert_str_eq(p->nodes[0].name, "b");
    ck_assert_int_eq(p->nodes[0].index, 0);
    ck_assert_str_eq(p->nodes[1].name, "a");
    ck_assert_int_eq(p->nodes[1].index, 1);
    ck_assert_int_eq(p->nodes[2].op, EM_OP_FULL);
    ck_assert(signbit(p->nodes[2].attrs.value));
    ck_assert_int_eq(p->nodes[3].in[0], 1);
    ck_assert_int_eq(p->nodes[3].in[1], 0);
    char *t2 = text_of(p);
    ck_assert_str_eq(t2, "graph(%b: f32[3]{1}, %a: f32[3]{1}) {\n"
                         "  %2 = full() [sizes=[], value=-0, dtype=f32, device=cpu] : f32[]{}\n"
                         "  %3 = sub(%a, %b) : f32[3]{1}\n"
                         "  return (%3, %2)\n"
                         "}\n");
    /* and that text is a fixed point */
    assert_round_trip(p);
    em_free(t);
    em_free(t2);
    tr_graph_free(p);
    tr_graph_free(g);
}
END_TEST

/* tr_inputs_first (run by tr_optimize) puts the graph above in the parser's
 * order: its text is then the parsed text, so a plan key computed before a
 * warmup list's print and parse equals the one computed after. */
START_TEST(inputs_first_makes_print_parse_print_an_identity) {
    em_meta m = {.ndim = 1, .sizes = {3}, .strides = {1}, .dtype = EM_F32};
    em_meta mf = {.ndim = 0, .dtype = EM_F32};
    tr_graph *g = tr_graph_new();
    int kf = tr_add_call(g, EM_OP_FULL, 0, NULL, &(em_op_attrs){.value = 2, .dtype = EM_F32}, &mf);
    int ia = input(g, "a", &m);
    int k1 = tr_add_call(g, EM_OP_MUL, 2, INS(ia, kf), NULL, &m);
    int ib = input(g, "b", &m); /* an input between calls, as lazy mode adds them */
    int k2 = tr_add_call(g, EM_OP_SUB, 2, INS(k1, ib), NULL, &m);
    outputs(g, 3, INS(k2, kf, k1));
    char *before = text_of(g);
    tr_graph *parsed = tr_parse(before, NULL, 0);
    ck_assert_msg(parsed != NULL, "%s", em_last_error());
    char *want = text_of(parsed);
    ck_assert_str_ne(before, want); /* the problem: a gap in the numbering */
    ck_assert_msg(tr_optimize(g, true) == EM_OK, "%s", em_last_error());
    char *after = text_of(g);
    ck_assert_str_eq(after, want);
    ck_assert_str_eq(after, "graph(%a: f32[3]{1}, %b: f32[3]{1}) {\n"
                            "  %2 = full() [sizes=[], value=2, dtype=f32, device=cpu] : f32[]{}\n"
                            "  %3 = mul(%a, %2) : f32[3]{1}\n"
                            "  %4 = sub(%3, %b) : f32[3]{1}\n"
                            "  return (%4, %2, %3)\n"
                            "}\n");
    ck_assert_int_eq(g->nodes[1].index, 1);
    ck_assert_str_eq(g->nodes[1].name, "b");
    ck_assert_int_eq(tr_verify(g), EM_OK);
    ck_assert_int_eq(tr_inputs_first(g), 0); /* canonical: nothing moves */
    ck_assert_int_eq(tr_inputs_first(parsed), 0);
    em_free(before);
    em_free(want);
    em_free(after);
    tr_graph_free(parsed);
    tr_graph_free(g);
}
END_TEST

/* Attributes the op does not read are not printed (and parse as zero). */
START_TEST(only_read_attrs_print) {
    em_meta m = {.ndim = 1, .sizes = {3}, .strides = {1}, .dtype = EM_F32};
    tr_graph *g = tr_graph_new();
    int ix = input(g, "x", &m);
    em_op_attrs junk = {.ndim = 3, .dim = 5, .value = 7, .keepdim = true, .seed = 9};
    int k = tr_add_call(g, EM_OP_EXP, 1, INS(ix), &junk, &m);
    outputs(g, 1, INS(k));
    char *t = text_of(g);
    ck_assert_str_eq(t, "graph(%x: f32[3]{1}) {\n  %1 = exp(%x) : f32[3]{1}\n  return (%1)\n}\n");
    tr_graph *p = tr_parse(t, NULL, 0);
    ck_assert_ptr_nonnull(p);
    em_op_attrs zero;
    memset(&zero, 0, sizeof zero);
    ck_assert(!memcmp(&p->nodes[1].attrs, &zero, sizeof zero));
    em_free(t);
    tr_graph_free(p);
    tr_graph_free(g);
}
END_TEST

/* A creation op on a CUDA device prints its device attribute. */
START_TEST(print_cuda_device_attr) {
    em_meta m = {.ndim = 1, .sizes = {2}, .strides = {1}, .dtype = EM_F32, .device = em_cuda(0)};
    tr_graph *g = tr_graph_new();
    int k = tr_add_call(g, EM_OP_EMPTY, 0, NULL,
                        &(em_op_attrs){.ndim = 1, .sizes = {2}, .device = em_cuda(0)}, &m);
    outputs(g, 1, INS(k));
    char *t = text_of(g);
    ck_assert_str_eq(t, "graph() {\n"
                        "  %0 = empty() [sizes=[2], dtype=f32, device=cuda:0] : f32[2]{1}@cuda:0\n"
                        "  return (%0)\n"
                        "}\n");
    em_free(t);
    tr_graph_free(g);
}
END_TEST

/* ---- (b) round trips ---- */

START_TEST(round_trip_mlp) {
    em_tensor *b;
    tr_graph *g = mlp_graph(&b);
    assert_round_trip(g);
    /* the constant is shared, with one more reference per graph */
    tr_graph *p = tr_parse(mlp_text, &b, 1);
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_eq(p->consts[0], b);
    tr_graph_free(p);
    tr_graph_free(g);
}
END_TEST

START_TEST(round_trip_attrs) {
    tr_graph *g = attrs_graph();
    assert_round_trip(g);
    tr_graph_free(g);
}
END_TEST

START_TEST(round_trip_odd) {
    tr_graph *g = odd_graph();
    assert_round_trip(g);
    tr_graph_free(g);
}
END_TEST

/* Doubles and integers at their extremes come back bit for bit. */
START_TEST(round_trip_numbers) {
    static const double values[] = {0.0, -0.0, 0.1, 1.0 / 3, -2.5e-300, 4.9406564584124654e-324,
                                    1.7976931348623157e308, -1.7976931348623157e308, 1e22,
                                    123456789012345678.0, INFINITY, -INFINITY, NAN, -NAN};
    tr_graph *g = tr_graph_new();
    int n = (int)(sizeof values / sizeof values[0]);
    int o[32];
    em_meta m = {.ndim = 0, .dtype = EM_F64};
    for (int i = 0; i < n; i++) {
        o[i] = tr_add_call(g, EM_OP_FULL, 0, NULL,
                           &(em_op_attrs){.value = values[i], .dtype = EM_F64}, &m);
        ck_assert_int_ge(o[i], 0);
    }
    em_meta m2 = {.ndim = 1, .sizes = {0}, .strides = {1}, .dtype = EM_F32};
    o[n++] = tr_add_call(g, EM_OP_ARANGE, 0, NULL,
                         &(em_op_attrs){.ndim = 1, .fstart = -1e-310, .fstep = NAN,
                                        .dtype = EM_F32},
                         &m2);
    em_meta m3 = {.ndim = 1, .sizes = {1}, .strides = {1}, .dtype = EM_F64};
    o[n++] = tr_add_call(g, EM_OP_RAND, 0, NULL,
                         &(em_op_attrs){.ndim = 1, .sizes = {1}, .dtype = EM_F64,
                                        .seed = UINT64_MAX, .offset = UINT64_MAX - 1},
                         &m3);
    outputs(g, n, o);
    assert_round_trip(g);
    char *t = text_of(g);
    ck_assert_ptr_nonnull(strstr(t, "value=-0,"));
    ck_assert_ptr_nonnull(strstr(t, "value=0.10000000000000001,"));
    ck_assert_ptr_nonnull(strstr(t, "value=inf,"));
    ck_assert_ptr_nonnull(strstr(t, "value=-inf,"));
    ck_assert_ptr_nonnull(strstr(t, "value=nan,"));
    ck_assert_ptr_nonnull(strstr(t, "seed=18446744073709551615, offset=18446744073709551614]"));
    em_free(t);
    tr_graph_free(g);
}
END_TEST

/* Node numbers are labels: any increasing or not, renumbered densely;
 * blank lines, extra blanks, CRLF and attributes in any order are read. */
START_TEST(parse_relabels_and_is_lenient_on_layout) {
    const char *text =
        "\n\n  graph( %x : f32[4, 8]{8, 1} ,%w:f32[8,16]{16,1} )   {  \r\n"
        "\n"
        "    %70 = matmul( %x,%w ):f32[4,16]{16,1}\r\n"
        "  \t\n"
        "%3 = sum(%70) [keepdim=false,  dims=[1]] : f32[4]{1}\n"
        "  %12 = constant #0 : f32[16]{1}\n"
        "  return (%3, %70 , %12)\n"
        "}\n\n  \n";
    em_tensor *b = em_arange(0, 16, 1, EM_F32, CPU);
    tr_graph *g = tr_parse(text, &b, 1);
    ck_assert_msg(g != NULL, "%s", em_last_error());
    char *t = text_of(g);
    ck_assert_str_eq(t, "graph(%x: f32[4, 8]{8, 1}, %w: f32[8, 16]{16, 1}) {\n"
                        "  %2 = matmul(%x, %w) : f32[4, 16]{16, 1}\n"
                        "  %3 = sum(%2) [dims=[1], keepdim=false] : f32[4]{1}\n"
                        "  %4 = constant #0 : f32[16]{1}\n"
                        "  return (%3, %2, %4)\n"
                        "}\n");
    em_free(t);
    tr_graph_free(g);
}
END_TEST

/* Views reproduce their op's strides and offset, except (as tr_verify)
 * strides of dims of size 1 and the offset of an empty view. */
START_TEST(parse_view_metas_as_verify) {
    const char *ok = X_F4_ "  %1 = unsqueeze(%x) [dim=0] : f32[1, 4]{99, 1}\n"
                     "  %2 = slice(%x) [dim=0, start=4, end=4, step=1] : f32[0]{1}+7\n"
                     "  return (%1, %2)\n}\n";
    tr_graph *g = tr_parse(ok, NULL, 0);
    ck_assert_msg(g != NULL, "%s", em_last_error());
    ck_assert_int_eq(g->nodes[1].meta.strides[0], 99);
    ck_assert_int_eq(g->nodes[2].meta.offset, 7);
    tr_graph_free(g);
    assert_parse_fails(X_F4_ "  %1 = unsqueeze(%x) [dim=0] : f32[1, 4]{4, 2}\n  return (%1)\n}\n",
                       NULL, 0);
    ck_assert_str_eq(em_last_error(), "graph text line 2, column 32: unsqueeze gives strides "
                                      "[4, 1] and offset 0, not these");
}
END_TEST

/* The numbers of the text do not depend on the host's locale. */
START_TEST(numbers_ignore_locale) {
    const char *names[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "C.UTF-8"};
    const char *got = NULL;
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !got; i++)
        got = setlocale(LC_NUMERIC, names[i]);
    tr_graph *g = attrs_graph();
    char *t = text_of(g);
    tr_graph *p = tr_parse(t, g->consts, g->nconsts);
    setlocale(LC_NUMERIC, "C");
    ck_assert_str_eq(t, attrs_text);
    ck_assert_msg(p != NULL, "%s", em_last_error());
    assert_same_graph(g, p);
    em_free(t);
    tr_graph_free(p);
    tr_graph_free(g);
}
END_TEST

/* ---- (c) parse errors ---- */

#define X_F4 X_F4_
#define RET1 "  return (%1)\n}\n"

static const struct {
    const char *text;
    const char *where; /* expected "line L, column C" (NULL: not checked) */
} bad_texts[] = {
    {"", "line 1, column 1"},
    {"graph", "line 1, column 6"},
    {"grap() {\n  return ()\n}\n", "line 1, column 1"},
    {"graph() {\n}\n", "line 2, column 1"},
    {"graph() {\n  return ()\n}\n", "line 2, column 11"},
    {X_F4 "  return (%x)\n}", "line 3, column 2"},
    {X_F4 "  return (%x)\n}\njunk\n", "line 4, column 1"},
    {X_F4 "  return (%x)\n}\n}\n", "line 4, column 1"},
    {X_F4 "  return (%x)\n", "line 3, column 1"},
    {X_F4 "  return (%x) }\n", "line 2, column 15"},
    /* unknown ops and names, bad references */
    {X_F4 "  %1 = frobnicate(%x) : f32[4]{1}\n" RET1, "line 2, column 8"},
    {X_F4 "  %1 = relu(%y) : f32[4]{1}\n" RET1, "line 2, column 13"},
    {X_F4 "  %1 = relu(%2) : f32[4]{1}\n  %2 = relu(%x) : f32[4]{1}\n" RET1, "line 2, column 13"},
    {X_F4 "  %1 = relu(%1) : f32[4]{1}\n" RET1, "line 2, column 13"},
    {X_F4 "  %1 = relu(%x) : f32[4]{1}\n  return (%2)\n}\n", "line 3, column 11"},
    {X_F4 "  %1 = relu(%x) : f32[4]{1}\n  %1 = relu(%x) : f32[4]{1}\n" RET1, "line 3, column 3"},
    {"graph(%x: f32[4]{1}, %x: f32[4]{1}) {\n  return (%x)\n}\n", "line 1, column 22"},
    {"graph(%0: f32[4]{1}) {\n  return (%0)\n}\n", "line 1, column 8"},
    {X_F4 "  %x = relu(%x) : f32[4]{1}\n" RET1, "line 2, column 4"},
    {X_F4 "  %99999999999 = relu(%x) : f32[4]{1}\n" RET1, "line 2, column 4"},
    {X_F4 "  %1 = relu(%x, ) : f32[4]{1}\n" RET1, "line 2, column 17"},
    {X_F4 "  %1 = relu(%x : f32[4]{1}\n" RET1, "line 2, column 16"},
    /* arity */
    {X_F4 "  %1 = add(%x) : f32[4]{1}\n" RET1, "line 2, column 8"},
    {X_F4 "  %1 = relu(%x, %x) : f32[4]{1}\n" RET1, "line 2, column 8"},
    {X_F4 "  %1 = cat() [dim=0] : f32[4]{1}\n" RET1, "line 2, column 8"},
    {X_F4 "  %1 = full(%x) [sizes=[], value=1, dtype=f32, device=cpu] : f32[]{}\n" RET1,
     "line 2, column 8"},
    /* constants */
    {X_F4 "  %1 = constant #1 : f32[16]{1}\n" RET1, "line 2, column 18"},
    {X_F4 "  %1 = constant #-1 : f32[16]{1}\n" RET1, "line 2, column 18"},
    {X_F4 "  %1 = constant 0 : f32[16]{1}\n" RET1, "line 2, column 17"},
    {X_F4 "  %1 = constant #0 : f32[15]{1}\n" RET1, "line 2, column 22"},
    {X_F4 "  %1 = constant #0 : f64[16]{1}\n" RET1, "line 2, column 22"},
    /* metas */
    {X_F4 "  %1 = relu(%x) : f33[4]{1}\n" RET1, "line 2, column 19"},
    {X_F4 "  %1 = relu(%x) : f32[4]{1, 1}\n" RET1, "line 2, column 25"},
    {X_F4 "  %1 = relu(%x) : f32[4]\n" RET1, "line 2, column 25"},
    {X_F4 "  %1 = relu(%x) : f32[-4]{1}\n" RET1, "line 2, column 23"},
    {X_F4 "  %1 = relu(%x) : f32[4.0]{1}\n" RET1, "line 2, column 24"},
    {X_F4 "  %1 = relu(%x) : f32[99999999999999999999]{1}\n" RET1, "line 2, column 23"},
    {X_F4 "  %1 = relu(%x) : f32[4611686018427387904, 4]{4, 1}\n" RET1, "line 2, column 19"},
    {"graph(%x: f32[1, 1, 1, 1, 1, 1, 1, 1, 1]{1, 1, 1, 1, 1, 1, 1, 1, 1}) {\n"
     "  return (%x)\n}\n", "line 1, column 39"},
    {X_F4 "  %1 = relu(%x) : f32[4]{1}@cuda\n" RET1, "line 2, column 33"},
    {X_F4 "  %1 = relu(%x) : f32[4]{1}@tpu:0\n" RET1, "line 2, column 29"},
    {X_F4 "  %1 = relu(%x) : f32[4]{1}+\n" RET1, "line 2, column 29"},
    {X_F4 "  %1 = relu(%x) : f32[4]{1} extra\n" RET1, "line 2, column 29"},
    {X_F4 "  %1 = relu(%x)\n" RET1, "line 2, column 16"},
    {"graph(%x f32[4]{1}) {\n  return (%x)\n}\n", "line 1, column 10"},
    /* metas that the op does not give */
    {X_F4 "  %1 = relu(%x) : f32[5]{1}\n" RET1, "line 2, column 19"},
    {X_F4 "  %1 = relu(%x) : f64[4]{1}\n" RET1, "line 2, column 19"},
    {X_F4 "  %1 = relu(%x) : f32[4]{1}@cuda:0\n" RET1, "line 2, column 19"},
    {X_F4 "  %1 = matmul(%x, %x) : f32[]{}\n" RET1, "line 2, column 8"},
    {X_F4 "  %1 = sum(%x) [dims=[3], keepdim=false] : f32[]{}\n" RET1, "line 2, column 8"},
    {X_F4 "  %1 = slice(%x) [dim=0, start=1, end=3, step=1] : f32[2]{1}\n" RET1,
     "line 2, column 52"},
    {X_F4 "  %1 = slice(%x) [dim=0, start=1, end=3, step=1] : f32[2]{1}+2\n" RET1,
     "line 2, column 52"},
    /* attributes */
    {X_F4 "  %1 = sum(%x) : f32[]{}\n" RET1, "line 2, column 16"},
    {X_F4 "  %1 = relu(%x) [dim=0] : f32[4]{1}\n" RET1, "line 2, column 17"},
    {X_F4 "  %1 = sum(%x) [dims=[0], keepdim=false, foo=1] : f32[]{}\n" RET1, "line 2, column 42"},
    {X_F4 "  %1 = sum(%x) [dims=[0], dims=[0], keepdim=false] : f32[]{}\n" RET1,
     "line 2, column 27"},
    {X_F4 "  %1 = sum(%x) [dims=[0]] : f32[]{}\n" RET1, "line 2, column 25"},
    {X_F4 "  %1 = sum(%x) [] : f32[]{}\n" RET1, "line 2, column 17"},
    {X_F4 "  %1 = sum(%x) [dim=0, keepdim=false] : f32[]{}\n" RET1, "line 2, column 17"},
    {X_F4 "  %1 = sum(%x) [dims=[0], keepdim=maybe] : f32[]{}\n" RET1, "line 2, column 35"},
    {X_F4 "  %1 = sum(%x) [dims=[0] keepdim=false] : f32[]{}\n" RET1, "line 2, column 26"},
    {X_F4 "  %1 = sum(%x) [dims=0, keepdim=false] : f32[]{}\n" RET1, "line 2, column 22"},
    {X_F4 "  %1 = reshape(%x) [sizes=[1, 1, 1, 1, 1, 1, 1, 1, 4]] : f32[4]{1}\n" RET1,
     "line 2, column 52"},
    {X_F4 "  %1 = argmax(%x) [dim=99999999999, keepdim=false] : i64[]{}\n" RET1,
     "line 2, column 24"},
    {X_F4 "  %1 = cast(%x) [dtype=f128] : f32[4]{1}\n" RET1, "line 2, column 24"},
    {"graph() {\n  %0 = full() [sizes=[], value=abc, dtype=f32, device=cpu] : f32[]{}\n"
     "  return (%0)\n}\n", "line 2, column 32"},
    {"graph() {\n  %0 = full() [sizes=[], value=1e, dtype=f32, device=cpu] : f32[]{}\n"
     "  return (%0)\n}\n", "line 2, column 34"},
    {"graph() {\n  %0 = full() [sizes=[], value=1e999, dtype=f32, device=cpu] : f32[]{}\n"
     "  return (%0)\n}\n", "line 2, column 32"},
    {"graph() {\n  %0 = full() [sizes=[], value=infinity, dtype=f32, device=cpu] : f32[]{}\n"
     "  return (%0)\n}\n", "line 2, column 32"},
    {"graph() {\n  %0 = full() [sizes=[], value=1, dtype=f32, device=gpu] : f32[]{}\n"
     "  return (%0)\n}\n", "line 2, column 53"},
    {"graph() {\n  %0 = full() [sizes=[], value=1, dtype=f32, device=cuda:x] : f32[]{}\n"
     "  return (%0)\n}\n", "line 2, column 58"},
    {"graph() {\n  %0 = full() [sizes=[-1], value=1, dtype=f32, device=cpu] : f32[1]{1}\n"
     "  return (%0)\n}\n", "line 2, column 8"},
    {"graph() {\n  %0 = randn() [sizes=[], dtype=f32, device=cpu, seed=-1, offset=0] : f32[]{}\n"
     "  return (%0)\n}\n", "line 2, column 55"},
    {"graph() {\n  %0 = randn() [sizes=[], dtype=f32, device=cpu, seed=18446744073709551616, "
     "offset=0] : f32[]{}\n  return (%0)\n}\n", "line 2, column 55"},
    /* names */
    {"graph(%\"abc: f32[4]{1}) {\n  return (%x)\n}\n", "line 1, column 8"},
    {"graph(%\"a\\qb\": f32[4]{1}) {\n  return (%x)\n}\n", "line 1, column 10"},
    {"graph(%\"a\\x00\": f32[4]{1}) {\n  return (%x)\n}\n", "line 1, column 10"},
    {"graph(%\"a\\x4\": f32[4]{1}) {\n  return (%x)\n}\n", "line 1, column 10"},
    {"graph(%: f32[4]{1}) {\n  return (%x)\n}\n", "line 1, column 8"},
    {"graph(%\"\": f32[4]{1}) {\n  return (%\"\")\n}\n", "line 1, column 7"},
    {X_F4 "  %1 = unsqueeze(%x) [dim=0] : f32[1, 4]{4, 1}\n"
     "  %2 = slice(%1) [dim=1, start=0, end=4, step=2] : f32[1, 2]{4, 1}\n  return (%2)\n}\n",
     "line 3, column 52"},
    /* garbage */
    {"\x01\xff\xfe", "line 1, column 1"},
    {"graph(\xff) {\n}\n", "line 1, column 7"},
    {X_F4 "  %1 = relu(%x) : f32[4]{1}\0 trailing after a NUL\n" RET1, "line 2, column 28"},
    {"graph(graph(%x: f32[4]{1}) {\n  return (%x)\n}\n", "line 1, column 7"},
};

START_TEST(parse_errors_table) {
    em_tensor *b = em_arange(0, 16, 1, EM_F32, CPU);
    int n = (int)(sizeof bad_texts / sizeof bad_texts[0]);
    ck_assert_int_ge(n, 25);
    int wrong = 0;
    for (int i = 0; i < n; i++) {
        assert_parse_fails(bad_texts[i].text, &b, 1);
        if (bad_texts[i].where && !strstr(em_last_error(), bad_texts[i].where)) {
            fprintf(stderr, "case %d: message '%s', expected %s, for:\n%s\n", i,
                    em_last_error(), bad_texts[i].where, bad_texts[i].text);
            wrong++;
        }
    }
    ck_assert_msg(wrong == 0, "%d errors at unexpected positions", wrong);
}
END_TEST

/* The messages say what was expected. */
START_TEST(parse_error_messages) {
    em_tensor *b = em_arange(0, 16, 1, EM_F32, CPU);
    assert_parse_fails(X_F4 "  %1 = frobnicate(%x) : f32[4]{1}\n" RET1, &b, 1);
    ck_assert_str_eq(em_last_error(), "graph text line 2, column 8: unknown op 'frobnicate'");
    assert_parse_fails(X_F4 "  %1 = relu(%2) : f32[4]{1}\n" RET1, &b, 1);
    ck_assert_str_eq(em_last_error(),
                     "graph text line 2, column 13: %2 is not a node defined above");
    assert_parse_fails(X_F4 "  %1 = add(%x) : f32[4]{1}\n" RET1, &b, 1);
    ck_assert_str_eq(em_last_error(), "graph text line 2, column 8: add takes 2 inputs, not 1");
    assert_parse_fails(X_F4 "  %1 = relu(%x) : f32[5]{1}\n" RET1, &b, 1);
    ck_assert_str_eq(em_last_error(),
                     "graph text line 2, column 19: relu gives f32[4] on cpu, not this meta");
    assert_parse_fails(X_F4 "  %1 = sum(%x) [dims=[0]] : f32[]{}\n" RET1, &b, 1);
    ck_assert_str_eq(em_last_error(),
                     "graph text line 2, column 25: sum needs attribute 'keepdim'");
    assert_parse_fails(X_F4 "  return (%x)\n}", &b, 1);
    ck_assert_str_eq(em_last_error(),
                     "graph text line 3, column 2: expected the end of the line, found the end "
                     "of the text");
    assert_parse_fails(X_F4 "  %1 = constant #1 : f32[16]{1}\n" RET1, &b, 1);
    ck_assert_str_eq(em_last_error(),
                     "graph text line 2, column 18: constant #1, but 1 constant is given");
}
END_TEST

/* Constants: as many as the text uses, none NULL. */
START_TEST(parse_errors_constants) {
    em_tensor *b = em_arange(0, 16, 1, EM_F32, CPU);
    assert_parse_fails(mlp_text, NULL, 0);
    ck_assert_ptr_nonnull(strstr(em_last_error(), "line 2, column 18"));
    em_tensor *none[1] = {NULL};
    assert_parse_fails(mlp_text, none, 1);
    ck_assert_ptr_nonnull(strstr(em_last_error(), "constant #0 is NULL"));
    /* more constants than used is fine */
    em_tensor *two[2] = {b, NULL};
    tr_graph *g = tr_parse(mlp_text, two, 2);
    ck_assert_msg(g != NULL, "%s", em_last_error());
    tr_graph_free(g);
    /* bad arguments */
    em_clear_error();
    ck_assert_ptr_null(tr_parse(NULL, &b, 1));
    ck_assert_int_eq(em_last_status(), EM_ERR_NULL);
    em_clear_error();
    ck_assert_ptr_null(tr_parse(mlp_text, NULL, 1));
    ck_assert_int_eq(em_last_status(), EM_ERR_NULL);
    em_clear_error();
    ck_assert_ptr_null(tr_parse(mlp_text, &b, -1));
    ck_assert_int_eq(em_last_status(), EM_ERR_ARG);
    em_clear_error();
    ck_assert_int_eq(tr_print(NULL, stdout), EM_ERR_NULL);
    ck_assert_ptr_null(tr_to_text(NULL));
    ck_assert_int_eq(tr_print_dot(NULL, stdout), EM_ERR_NULL);
}
END_TEST

/* Every proper prefix of a valid text is an error. */
static void check_prefixes(const char *text, em_tensor *const *consts, int nconsts) {
    size_t len = strlen(text);
    char *buf = malloc(len + 1);
    for (size_t n = 0; n < len; n++) {
        memcpy(buf, text, n);
        buf[n] = '\0';
        em_clear_error();
        tr_graph *g = tr_parse(buf, consts, nconsts);
        if (g) {
            tr_graph_free(g);
            free(buf);
            ck_abort_msg("prefix of %zu bytes parsed", n);
        }
        ck_assert_msg(em_last_status() == EM_ERR_ARG && strstr(em_last_error(), "line"),
                      "prefix of %zu bytes: %s (%s)", n, em_status_name(em_last_status()),
                      em_last_error());
    }
    free(buf);
    /* and the whole text parses */
    tr_graph *g = tr_parse(text, consts, nconsts);
    ck_assert_msg(g != NULL, "%s", em_last_error());
    tr_graph_free(g);
}

START_TEST(parse_errors_prefixes) {
    em_tensor *b = em_arange(0, 16, 1, EM_F32, CPU);
    check_prefixes(mlp_text, &b, 1);
    tr_graph *g = attrs_graph();
    check_prefixes(attrs_text, g->consts, g->nconsts);
    check_prefixes(odd_text, NULL, 0);
    tr_graph_free(g);
}
END_TEST

static uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Random edits of valid texts: never a crash (valgrind watches the reads);
 * either an error with a position or a graph that prints and parses back. */
START_TEST(parse_fuzz) {
    tr_graph *ga = attrs_graph();
    const char *texts[] = {mlp_text, attrs_text, odd_text};
    static const char alphabet[] = "%#:=,()[]{}+@-.\"\\\n 0123456789eafinxcudt";
    uint64_t s = 0x1234567u;
    int ok = 0;
    for (int iter = 0; iter < 3000; iter++) {
        const char *src = texts[iter % 3];
        size_t len = strlen(src);
        char *buf = malloc(len + 16);
        memcpy(buf, src, len + 1);
        int edits = 1 + (int)(rng_next(&s) % 3);
        for (int e = 0; e < edits; e++) {
            size_t at = (size_t)(rng_next(&s) % len);
            char c = (rng_next(&s) % 4) ? alphabet[rng_next(&s) % (sizeof alphabet - 1)]
                                        : (char)(rng_next(&s) % 255 + 1);
            switch (rng_next(&s) % 3) {
            case 0: buf[at] = c; break;                                  /* replace */
            case 1: memmove(buf + at, buf + at + 1, len - at); len--; break; /* delete */
            default: memmove(buf + at + 1, buf + at, len - at + 1); buf[at] = c; len++; /* insert */
            }
            if (len == 0) break;
        }
        em_clear_error();
        tr_graph *g = tr_parse(buf, ga->consts, ga->nconsts);
        if (g) {
            ok++;
            char *t = text_of(g);
            tr_graph *p = tr_parse(t, g->consts, g->nconsts);
            ck_assert_msg(p != NULL, "reparse of an accepted edit failed: %s\n%s",
                          em_last_error(), t);
            char *t2 = text_of(p);
            ck_assert_str_eq(t, t2);
            em_free(t2);
            em_free(t);
            tr_graph_free(p);
            tr_graph_free(g);
        } else {
            ck_assert_msg(em_last_status() == EM_ERR_ARG && strstr(em_last_error(), "line"),
                          "%s: %s\n%s", em_status_name(em_last_status()), em_last_error(), buf);
        }
        free(buf);
    }
    ck_assert_int_gt(ok, 0); /* some edits (blanks, labels) are harmless */
    tr_graph_free(ga);
}
END_TEST

/* An allocator that fails after a number of allocations. */
typedef struct {
    int left;
} fail_state;

static void *failing_alloc(void *ud, size_t size, size_t align) {
    fail_state *st = ud;
    if (st->left-- <= 0) return NULL;
    void *p = NULL;
    return posix_memalign(&p, align, size ? size : 1) ? NULL : p;
}

static void failing_free(void *ud, void *p) {
    (void)ud;
    free(p);
}

/* Out of memory at every allocation of a parse (and of a print): an error,
 * no leak (valgrind), never a crash. */
START_TEST(parse_out_of_memory) {
    tr_graph *ga = attrs_graph();
    fail_state st;
    em_allocator al = {failing_alloc, failing_free, &st};
    const em_allocator *old = em_get_allocator();
    bool done = false;
    for (int n = 0; n < 10000 && !done; n++) {
        st.left = n;
        em_clear_error();
        em_set_allocator(&al);
        tr_graph *g = tr_parse(attrs_text, ga->consts, ga->nconsts);
        char *t = g ? tr_to_text(g) : NULL;
        bool ok = g && t && !strcmp(t, attrs_text);
        em_status s = em_last_status();
        /* graphs are freed with the allocator that made them */
        em_free(t);
        tr_graph_free(g);
        em_set_allocator(old);
        if (g && t) {
            ck_assert(ok);
            done = true;
        } else {
            ck_assert_int_eq(s, EM_ERR_NOMEM);
        }
    }
    ck_assert(done);
    tr_graph_free(ga);
}
END_TEST

/* ---- (d) DOT ---- */

static char *dot_of(const tr_graph *g) {
    char *mem = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&mem, &len);
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(tr_print_dot(g, f), EM_OK);
    fclose(f);
    return mem;
}

START_TEST(dot_mlp) {
    tr_graph *g = mlp_graph(NULL);
    char *d = dot_of(g);
    static const char *lines[] = {
        "  n0 [label=\"%x\\nf32[4, 8]\", shape=ellipse];\n",
        "  n1 [label=\"%w\\nf32[8, 16]\", shape=ellipse];\n",
        "  n2 [label=\"%2 = constant #0\\nf32[16]\", shape=diamond];\n",
        "  n3 [label=\"%3 = matmul\\nf32[4, 16]\", shape=box];\n",
        "  n4 [label=\"%4 = add\\nf32[4, 16]\", shape=box];\n",
        "  n5 [label=\"%5 = relu\\nf32[4, 16]\", shape=box];\n",
        "  n0 -> n3;\n",
        "  n1 -> n3;\n",
        "  n3 -> n4;\n",
        "  n2 -> n4;\n",
        "  n4 -> n5;\n",
        "  out [label=\"return\", shape=plaintext];\n",
        "  n5 -> out;\n",
    };
    ck_assert_msg(strncmp(d, "digraph G {\n", 12) == 0, "%s", d);
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        ck_assert_msg(strstr(d, lines[i]), "missing %s in:\n%s", lines[i], d);
    size_t len = strlen(d);
    ck_assert_str_eq(d + len - 2, "}\n");
    /* 6 nodes, 5 edges, the out node and its edge */
    int nl = 0;
    for (const char *p = d; *p; p++) nl += *p == '\n';
    ck_assert_int_eq(nl, 1 + 6 + 5 + 2 + 1);
    free(d);
    tr_graph_free(g);
}
END_TEST

START_TEST(dot_escapes_labels) {
    tr_graph *g = odd_graph();
    char *d = dot_of(g);
    ck_assert_msg(strstr(d, "  n2 [label=\"%q\\\"uo\\\\te\\n\\nf64[2]\", shape=ellipse];\n"), "%s", d);
    ck_assert_msg(strstr(d, "  n0 [label=\"%gpu\\nf32[3, 5]@cuda:1\", shape=ellipse];\n"), "%s", d);
    ck_assert_msg(strstr(d, "  n1 -> n7;\n  n2 -> n7;\n"), "%s", d);
    ck_assert_msg(strstr(d, "  n6 -> out;\n  n7 -> out;\n  n8 -> out;\n  n1 -> out;\n"), "%s", d);
    free(d);
    tr_graph_free(g);
}
END_TEST

/* ---- the split-reduction pass (split.c) ---- */

/* The pass on text at rows, as text (NULL: nothing split); *n: the
 * reductions split. */
static char *split_of(const char *text, int64_t rows, int64_t long_row, int *n) {
    tr_graph *g = tr_parse_placeholders(text);
    ck_assert_msg(g != NULL, "%s", em_last_error());
    tr_graph *f = tr_split_reductions(g, rows, long_row, true, n, NULL);
    char *t = f ? text_of(f) : NULL;
    if (f) ck_assert_msg(tr_verify(f) == EM_OK, "%s", em_last_error());
    tr_graph_free(f);
    tr_graph_free(g);
    return t;
}

#define check_split(text, rows, want_n, want) check_split_long(text, rows, 0, want_n, want)
#define check_split_long(text, rows, long_row, want_n, want)                     \
    do {                                                                         \
        int n_;                                                                  \
        char *t_ = split_of(text, rows, long_row, &n_);                          \
        ck_assert_int_eq(n_, want_n);                                            \
        if (want) ck_assert_str_eq(t_, want);                                    \
        else ck_assert_ptr_null(t_);                                             \
        em_free(t_);                                                             \
    } while (0)

START_TEST(split_pass_golden) {
    /* a mean over a slice of long rows: the partial reduces the inner dim */
    check_split("graph(%x: f32[2048, 50257]{50257, 1}) {\n"
                "  %1 = slice(%x) [dim=1, start=0, end=1000, step=1] : f32[2048, 1000]{50257, 1}\n"
                "  %2 = mean(%1) [dims=[0, 1], keepdim=false] : f32[]{}\n"
                "  return (%2)\n"
                "}\n", 1024, 1,
                "graph(%x: f32[2048, 50257]{50257, 1}) {\n"
                "  %1 = slice(%x) [dim=1, start=0, end=1000, step=1] : f32[2048, 1000]{50257, 1}\n"
                "  %2 = mean(%1) [dims=[1], keepdim=false] : f32[2048]{1}\n"
                "  %3 = mean(%2) [dims=[0], keepdim=false] : f32[]{}\n"
                "  return (%3)\n"
                "}\n");
    /* a few long rows, keepdim: the row cut into 16 views of 62500 */
    check_split("graph(%x: f32[4, 1000000]{1000000, 1}) {\n"
                "  %1 = sum(%x) [dims=[1], keepdim=true] : f32[4, 1]{1, 1}\n"
                "  return (%1)\n"
                "}\n", 64, 1,
                "graph(%x: f32[4, 1000000]{1000000, 1}) {\n"
                "  %1 = reshape(%x) [sizes=[4, 16, 62500]] : f32[4, 16, 62500]{1000000, 62500, 1}\n"
                "  %2 = sum(%1) [dims=[2], keepdim=false] : f32[4, 16]{16, 1}\n"
                "  %3 = sum(%2) [dims=[1], keepdim=false] : f32[4]{1}\n"
                "  %4 = reshape(%3) [sizes=[4, 1]] : f32[4, 1]{1, 1}\n"
                "  return (%4)\n"
                "}\n");
    /* a transposed input, the first reduced dim prime (7): the second cut
     * (into 64 of 625); without and with keepdim */
    check_split("graph(%x: f32[40000, 7]{7, 1}) {\n"
                "  %1 = permute(%x) [dims=[1, 0]] : f32[7, 40000]{1, 7}\n"
                "  %2 = amax(%1) [dims=[0, 1], keepdim=false] : f32[]{}\n"
                "  return (%2)\n"
                "}\n", 64, 1,
                "graph(%x: f32[40000, 7]{7, 1}) {\n"
                "  %1 = permute(%x) [dims=[1, 0]] : f32[7, 40000]{1, 7}\n"
                "  %2 = reshape(%1) [sizes=[7, 64, 625]] : f32[7, 64, 625]{1, 4375, 7}\n"
                "  %3 = amax(%2) [dims=[0, 2], keepdim=false] : f32[64]{1}\n"
                "  %4 = amax(%3) [dims=[0], keepdim=false] : f32[]{}\n"
                "  return (%4)\n"
                "}\n");
    check_split("graph(%x: f32[7, 40000]{40000, 1}) {\n"
                "  %1 = amin(%x) [dims=[0, 1], keepdim=true] : f32[1, 1]{1, 1}\n"
                "  return (%1)\n"
                "}\n", 64, 1,
                "graph(%x: f32[7, 40000]{40000, 1}) {\n"
                "  %1 = reshape(%x) [sizes=[7, 64, 625]] : f32[7, 64, 625]{40000, 625, 1}\n"
                "  %2 = amin(%1) [dims=[0, 2], keepdim=false] : f32[64]{1}\n"
                "  %3 = amin(%2) [dims=[0], keepdim=false] : f32[]{}\n"
                "  %4 = reshape(%3) [sizes=[1, 1]] : f32[1, 1]{1, 1}\n"
                "  return (%4)\n"
                "}\n");
    /* a graph of dynamic sizes (cuts false): over inner dims, or whole */
    int n;
    tr_graph *g = tr_parse_placeholders("graph(%x: f32[4, 1000000]{1000000, 1}) {\n"
                                        "  %1 = sum(%x) [dims=[1], keepdim=true] : f32[4, 1]{1, 1}\n"
                                        "  return (%1)\n"
                                        "}\n");
    ck_assert_ptr_null(tr_split_reductions(g, 64, 0, false, &n, NULL));
    ck_assert_int_eq(n, 0);
    tr_graph_free(g);
    g = tr_parse_placeholders("graph(%a: f32[3]{1}, %x: f32[2048, 1000]{1000, 1}) {\n"
                              "  %2 = exp(%x) : f32[2048, 1000]{1000, 1}\n"
                              "  %3 = sum(%2) [dims=[0, 1], keepdim=false] : f32[]{}\n"
                              "  return (%3, %a)\n"
                              "}\n");
    int map[4] = {9, 9, 9, 9};
    tr_graph *f = tr_split_reductions(g, 1024, 0, false, &n, map);
    ck_assert_int_eq(n, 1);
    char *t = text_of(f);
    ck_assert_str_eq(t, "graph(%a: f32[3]{1}, %x: f32[2048, 1000]{1000, 1}) {\n"
                        "  %2 = exp(%x) : f32[2048, 1000]{1000, 1}\n"
                        "  %3 = sum(%2) [dims=[1], keepdim=false] : f32[2048]{1}\n"
                        "  %4 = sum(%3) [dims=[0], keepdim=false] : f32[]{}\n"
                        "  return (%4, %a)\n"
                        "}\n");
    ck_assert(map[0] == 0 && map[1] == 1 && map[2] == 2 && map[3] == 4);
    em_free(t);
    tr_graph_free(f);
    tr_graph_free(g);
    /* a half sum: its partials and final in f32 between two casts (one
     * rounding, as the one reduction's); a half maximum as it is */
    check_split("graph(%x: bf16[4, 1000000]{1000000, 1}) {\n"
                "  %1 = sum(%x) [dims=[1], keepdim=false] : bf16[4]{1}\n"
                "  return (%1)\n"
                "}\n", 64, 1,
                "graph(%x: bf16[4, 1000000]{1000000, 1}) {\n"
                "  %1 = cast(%x) [dtype=f32] : f32[4, 1000000]{1000000, 1}\n"
                "  %2 = reshape(%1) [sizes=[4, 16, 62500]] : f32[4, 16, 62500]{1000000, 62500, 1}\n"
                "  %3 = sum(%2) [dims=[2], keepdim=false] : f32[4, 16]{16, 1}\n"
                "  %4 = sum(%3) [dims=[1], keepdim=false] : f32[4]{1}\n"
                "  %5 = cast(%4) [dtype=bf16] : bf16[4]{1}\n"
                "  return (%5)\n"
                "}\n");
    check_split("graph(%x: f16[4, 1000000]{1000000, 1}) {\n"
                "  %1 = amax(%x) [dims=[1], keepdim=false] : f16[4]{1}\n"
                "  return (%1)\n"
                "}\n", 64, 1,
                "graph(%x: f16[4, 1000000]{1000000, 1}) {\n"
                "  %1 = reshape(%x) [sizes=[4, 16, 62500]] : f16[4, 16, 62500]{1000000, 62500, 1}\n"
                "  %2 = amax(%1) [dims=[2], keepdim=false] : f16[4, 16]{16, 1}\n"
                "  %3 = amax(%2) [dims=[1], keepdim=false] : f16[4]{1}\n"
                "  return (%3)\n"
                "}\n");
    /* integers: the partial sums are i64 already */
    check_split("graph(%x: i32[131072]{1}) {\n"
                "  %1 = sum(%x) [dims=[0], keepdim=false] : i64[]{}\n"
                "  return (%1)\n"
                "}\n", 64, 1,
                "graph(%x: i32[131072]{1}) {\n"
                "  %1 = reshape(%x) [sizes=[64, 2048]] : i32[64, 2048]{2048, 1}\n"
                "  %2 = sum(%1) [dims=[1], keepdim=false] : i64[64]{1}\n"
                "  %3 = sum(%2) [dims=[0], keepdim=false] : i64[]{}\n"
                "  return (%3)\n"
                "}\n");
}
END_TEST

/* What the split pass leaves alone. */
START_TEST(split_pass_leaves) {
    /* enough result rows already; too few elements; a prime row; var
     * (not split) */
    static const char *const keep[] = {
        "graph(%x: f32[128, 65536]{65536, 1}) {\n  %1 = sum(%x) [dims=[1], keepdim=false] : f32[128]{1}\n  return (%1)\n}\n",
        "graph(%x: f32[100, 100]{100, 1}) {\n  %1 = sum(%x) [dims=[0, 1], keepdim=false] : f32[]{}\n  return (%1)\n}\n",
        "graph(%x: f32[1, 65537]{65537, 1}) {\n  %1 = mean(%x) [dims=[1], keepdim=false] : f32[1]{1}\n  return (%1)\n}\n",
        "graph(%x: f32[4, 1000000]{1000000, 1}) {\n  %1 = var(%x) [dims=[1], correction=1, keepdim=false] : f32[4]{1}\n  return (%1)\n}\n",
    };
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++) check_split(keep[i], 64, 0, NULL);
    /* statistics broadcast back over their rows (a softmax's max and sum
     * of a few long rows; the total that divides every element): whole */
    check_split("graph(%x: f32[4, 1000000]{1000000, 1}) {\n"
                "  %1 = amax(%x) [dims=[1], keepdim=true] : f32[4, 1]{1, 1}\n"
                "  %2 = sub(%x, %1) : f32[4, 1000000]{1000000, 1}\n"
                "  %3 = exp(%2) : f32[4, 1000000]{1000000, 1}\n"
                "  %4 = sum(%3) [dims=[1], keepdim=true] : f32[4, 1]{1, 1}\n"
                "  %5 = div(%3, %4) : f32[4, 1000000]{1000000, 1}\n"
                "  return (%5)\n"
                "}\n", 64, 0, NULL);
    check_split("graph(%x: f32[1000, 1000]{1000, 1}) {\n"
                "  %1 = sum(%x) [dims=[0, 1], keepdim=false] : f32[]{}\n"
                "  %2 = log(%1) : f32[]{}\n"
                "  %3 = sub(%x, %2) : f32[1000, 1000]{1000, 1}\n"
                "  return (%3, %1)\n"
                "}\n", 64, 0, NULL);
    /* a cross-entropy's log-sum-exp of 512 vocabulary rows: the max is
     * broadcast back, the sum is computed from it (the same rows) */
    check_split("graph(%x: f32[512, 50257]{50257, 1}) {\n"
                "  %1 = amax(%x) [dims=[1], keepdim=true] : f32[512, 1]{1, 1}\n"
                "  %2 = sub(%x, %1) : f32[512, 50257]{50257, 1}\n"
                "  %3 = exp(%2) : f32[512, 50257]{50257, 1}\n"
                "  %4 = sum(%3) [dims=[1], keepdim=true] : f32[512, 1]{1, 1}\n"
                "  %5 = log(%4) : f32[512, 1]{1, 1}\n"
                "  %6 = add(%5, %1) : f32[512, 1]{1, 1}\n"
                "  return (%6)\n"
                "}\n", 4096, 0, NULL);
    /* a quarter of rows results already (300 of 1024): one kernel */
    check_split("graph(%x: f32[300, 70000]{70000, 1}) {\n"
                "  %1 = sum(%x) [dims=[1], keepdim=false] : f32[300]{1}\n"
                "  return (%1)\n"
                "}\n", 1024, 0, NULL);
    /* two long prime dims: the inner one alone is the partial (7 rows) */
    check_split("graph(%x: f32[7, 65537]{65537, 1}) {\n"
                "  %1 = sum(%x) [dims=[0, 1], keepdim=false] : f32[]{}\n"
                "  return (%1)\n"
                "}\n", 64, 1,
                "graph(%x: f32[7, 65537]{65537, 1}) {\n"
                "  %1 = sum(%x) [dims=[1], keepdim=false] : f32[7]{1}\n"
                "  %2 = sum(%1) [dims=[0], keepdim=false] : f32[]{}\n"
                "  return (%2)\n"
                "}\n");
}
END_TEST

/* A log_softmax over vocabulary rows, sliced and averaged (a
 * cross-entropy's shape). */
static const char lsm_slice_mean[] =
    "graph(%x: f32[2048, 50257]{50257, 1}) {\n"
    "  %1 = amax(%x) [dims=[1], keepdim=true] : f32[2048, 1]{1, 1}\n"
    "  %2 = sub(%x, %1) : f32[2048, 50257]{50257, 1}\n"
    "  %3 = exp(%2) : f32[2048, 50257]{50257, 1}\n"
    "  %4 = sum(%3) [dims=[1], keepdim=true] : f32[2048, 1]{1, 1}\n"
    "  %5 = log(%4) : f32[2048, 1]{1, 1}\n"
    "  %6 = sub(%2, %5) : f32[2048, 50257]{50257, 1}\n"
    "  %7 = slice(%6) [dim=1, start=0, end=1000, step=1] : f32[2048, 1000]{50257, 1}\n"
    "  %8 = mean(%7) [dims=[0, 1], keepdim=false] : f32[]{}\n"
    "  return (%8)\n"
    "}\n";

/* Rows longer than long_row split whatever their number: the softmax's
 * max and sum together (an online softmax's statistics), cut into 29
 * parts of 1733. */
START_TEST(split_pass_long_rows) {
    check_split_long(lsm_slice_mean, 1024, 32769, 3,
                     "graph(%x: f32[2048, 50257]{50257, 1}) {\n"
                     "  %1 = reshape(%x) [sizes=[2048, 29, 1733]] : f32[2048, 29, 1733]{50257, 1733, 1}\n"
                     "  %2 = amax(%1) [dims=[2], keepdim=false] : f32[2048, 29]{29, 1}\n"
                     "  %3 = full() [sizes=[], value=-3.4028234663852886e+38, dtype=f32, device=cpu] : f32[]{}\n"
                     "  %4 = reshape(%2) [sizes=[2048, 29, 1]] : f32[2048, 29, 1]{29, 1, 1}\n"
                     "  %5 = maximum(%4, %3) : f32[2048, 29, 1]{29, 1, 1}\n"
                     "  %6 = sub(%1, %5) : f32[2048, 29, 1733]{50257, 1733, 1}\n"
                     "  %7 = exp(%6) : f32[2048, 29, 1733]{50257, 1733, 1}\n"
                     "  %8 = sum(%7) [dims=[2], keepdim=false] : f32[2048, 29]{29, 1}\n"
                     "  %9 = amax(%2) [dims=[1], keepdim=false] : f32[2048]{1}\n"
                     "  %10 = reshape(%9) [sizes=[2048, 1]] : f32[2048, 1]{1, 1}\n"
                     "  %11 = maximum(%2, %3) : f32[2048, 29]{29, 1}\n"
                     "  %12 = sub(%11, %10) : f32[2048, 29]{29, 1}\n"
                     "  %13 = exp(%12) : f32[2048, 29]{29, 1}\n"
                     "  %14 = mul(%8, %13) : f32[2048, 29]{29, 1}\n"
                     "  %15 = sum(%14) [dims=[1], keepdim=false] : f32[2048]{1}\n"
                     "  %16 = reshape(%15) [sizes=[2048, 1]] : f32[2048, 1]{1, 1}\n"
                     "  %17 = sub(%x, %10) : f32[2048, 50257]{50257, 1}\n"
                     "  %18 = log(%16) : f32[2048, 1]{1, 1}\n"
                     "  %19 = sub(%17, %18) : f32[2048, 50257]{50257, 1}\n"
                     "  %20 = slice(%19) [dim=1, start=0, end=1000, step=1] : f32[2048, 1000]{50257, 1}\n"
                     "  %21 = mean(%20) [dims=[1], keepdim=false] : f32[2048]{1}\n"
                     "  %22 = mean(%21) [dims=[0], keepdim=false] : f32[]{}\n"
                     "  return (%22)\n"
                     "}\n");
    /* a softmax of 256 long rows: split though broadcast back; a norm's
     * mean beside its var, and a prime row, whole */
    static const char softmax[] =
        "graph(%x: f32[256, 50304]{50304, 1}) {\n"
        "  %1 = amax(%x) [dims=[1], keepdim=true] : f32[256, 1]{1, 1}\n"
        "  %2 = sub(%x, %1) : f32[256, 50304]{50304, 1}\n"
        "  %3 = exp(%2) : f32[256, 50304]{50304, 1}\n"
        "  %4 = sum(%3) [dims=[1], keepdim=true] : f32[256, 1]{1, 1}\n"
        "  %5 = div(%3, %4) : f32[256, 50304]{50304, 1}\n"
        "  return (%5)\n"
        "}\n";
    int n;
    char *t = split_of(softmax, 1024, 32769, &n);
    ck_assert_int_eq(n, 2);
    ck_assert_msg(strstr(t, "reshape(%x) [sizes=[256, 8, 6288]]"), "%s", t); /* parts of 6288 */
    em_free(t);
    check_split_long(softmax, 1024, 0, 0, NULL); /* no long_row: whole */
    check_split_long("graph(%x: f32[64, 65536]{65536, 1}) {\n"
                     "  %1 = mean(%x) [dims=[1], keepdim=true] : f32[64, 1]{1, 1}\n"
                     "  %2 = var(%x) [dims=[1], correction=0, keepdim=true] : f32[64, 1]{1, 1}\n"
                     "  %3 = sub(%x, %1) : f32[64, 65536]{65536, 1}\n"
                     "  %4 = div(%3, %2) : f32[64, 65536]{65536, 1}\n"
                     "  return (%4)\n"
                     "}\n", 1024, 32769, 0, NULL);
    check_split_long("graph(%x: f32[4096, 65537]{65537, 1}) {\n"
                     "  %1 = sum(%x) [dims=[1], keepdim=false] : f32[4096]{1}\n"
                     "  return (%1)\n"
                     "}\n", 1024, 32769, 0, NULL);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("graph");
    TCase *tc = tcase_create("text");
    tcase_add_checked_fixture(tc, tu_setup, tu_teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, golden_mlp);
    tcase_add_test(tc, linear_pass_golden);
    tcase_add_test(tc, linear_pass_leaves_non_bias_adds);
    tcase_add_test(tc, linear_pass_activations);
    tcase_add_test(tc, linear_act_text);
    tcase_add_test(tc, split_pass_golden);
    tcase_add_test(tc, split_pass_leaves);
    tcase_add_test(tc, split_pass_long_rows);
    tcase_add_test(tc, golden_attrs);
    tcase_add_test(tc, golden_odd_names_and_devices);
    tcase_add_test(tc, golden_inputs_by_number);
    tcase_add_test(tc, inputs_first_makes_print_parse_print_an_identity);
    tcase_add_test(tc, only_read_attrs_print);
    tcase_add_test(tc, print_cuda_device_attr);
    tcase_add_test(tc, round_trip_mlp);
    tcase_add_test(tc, round_trip_attrs);
    tcase_add_test(tc, round_trip_odd);
    tcase_add_test(tc, round_trip_numbers);
    tcase_add_test(tc, parse_relabels_and_is_lenient_on_layout);
    tcase_add_test(tc, parse_view_metas_as_verify);
    tcase_add_test(tc, numbers_ignore_locale);
    tcase_add_test(tc, parse_errors_table);
    tcase_add_test(tc, parse_error_messages);
    tcase_add_test(tc, parse_errors_constants);
    tcase_add_test(tc, parse_errors_prefixes);
    tcase_add_test(tc, parse_fuzz);
    tcase_add_test(tc, parse_out_of_memory);
    tcase_add_test(tc, dot_mlp);
    tcase_add_test(tc, dot_escapes_labels);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run(suite()); }
