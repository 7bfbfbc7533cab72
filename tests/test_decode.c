/* test_decode.c - the token-by-token decoder of examples/gpt2 (issue 20):
 * its KV caches, position and history written in place by index_copy_
 * inside one compiled step.  Compiled, lazy and (on a GPU) CUDA-graph
 * runs must generate eager mode's tokens with eager mode's logits; the
 * compiled step is one entry (no graph break, no retrace as pos moves)
 * holding every write and one fused attention per layer. */
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../examples/gpt2/decoder.h"

enum { STEPS = 14 };

static const dec_config SMALL = {.layers = 2, .dim = 32, .heads = 4, .vocab = 97, .ctx = 16, .batch = 3};

typedef enum { EAGER, COMPILED, GRAPHS, LAZY } mode;

typedef struct run {
    int64_t tokens[3 * 16];
    float logits[STEPS][3 * 97];
    em_compile_stats st;
    char *text; /* the compiled entry's graph */
} run;

static void run_steps(mode md, em_device dev, run *r) {
    dec_error e = {""};
    dec_model *m = dec_new(&SMALL, 7, dev, &e);
    ck_assert_msg(m != NULL, "%s", e.msg);
    const int64_t first[3] = {5, 0, 96};
    ck_assert_msg(dec_reset(m, first, &e) == EM_OK, "%s", e.msg);
    em_compile_options o = {.ninputs = 1, .noutputs = 2, .name = "step", .cuda_graphs = md == GRAPHS ? 1 : -1};
    em_compiled *f = md == COMPILED || md == GRAPHS ? em_compile(dec_step, m, &o) : NULL;
    for (int i = 0; i < STEPS; i++) {
        em_scope_begin();
        em_tensor *in = dec_history(m), *out[2];
        em_status s;
        if (md == LAZY) {
            ck_assert_int_eq(em_lazy_begin(), EM_OK);
            s = dec_step(m, &in, NULL, out);
            ck_assert_int_eq(em_lazy_end(), EM_OK);
        } else {
            s = f ? em_call(f, &in, NULL, out) : dec_step(m, &in, NULL, out);
        }
        ck_assert_msg(s == EM_OK, "mode %d step %d: %s", md, i, em_last_error());
        ck_assert_int_eq(em_copy_to_host(out[1], r->logits[i], sizeof r->logits[i]), EM_OK);
        em_scope_end();
    }
    ck_assert_int_eq(dec_tokens(m, r->tokens), EM_OK);
    if (f) {
        em_compiled_stats(f, &r->st);
        char *buf = NULL;
        size_t len = 0;
        FILE *fp = open_memstream(&buf, &len);
        ck_assert_int_eq(em_compiled_print(f, 0, false, fp), EM_OK);
        fclose(fp);
        r->text = buf;
        em_compiled_free(f);
    }
    dec_free(m);
}

static int count(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p++) n++;
    return n;
}

/* b's tokens are a's, its logits within tol of a's, at every step. */
static void check_same(const run *a, const run *b, double tol, const char *what) {
    ck_assert_msg(!memcmp(a->tokens, b->tokens, sizeof a->tokens), "%s: other tokens", what);
    for (int i = 0; i < STEPS; i++)
        for (int j = 0; j < 3 * 97; j++)
            ck_assert_msg(fabs(a->logits[i][j] - b->logits[i][j]) <= tol * (1 + fabs(a->logits[i][j])),
                          "%s: step %d logit %d: %g vs %g", what, i, j, a->logits[i][j], b->logits[i][j]);
}

/* The compiled step was traced once, ran from its entry on every later
 * call, and its graph holds each write and a fused attention per layer. */
static void check_entry(const run *r) {
    ck_assert_msg(r->st.traces == 1 && r->st.hits == STEPS - 1 && !r->st.broken,
                  "traces %lld hits %lld broken %d", (long long)r->st.traces, (long long)r->st.hits, r->st.broken);
    ck_assert_ptr_nonnull(r->text);
    /* per layer the key and value caches; then the history and pos */
    ck_assert_int_eq(count(r->text, "index_copy_("), 2 * SMALL.layers + 2);
}

START_TEST(compiled_and_lazy_steps_generate_eagers_tokens) {
    static run eager, compiled, lazy;
    run_steps(EAGER, em_cpu(), &eager);
    run_steps(COMPILED, em_cpu(), &compiled);
    run_steps(LAZY, em_cpu(), &lazy);
    check_same(&eager, &compiled, 1e-5, "compiled");
    check_same(&eager, &lazy, 1e-5, "lazy");
    check_entry(&compiled);
    /* the tokens are not all one: the test compares real choices */
    int distinct = 0;
    for (int i = 1; i <= STEPS; i++) distinct += eager.tokens[i] != eager.tokens[i - 1];
    ck_assert_int_gt(distinct, 0);
    free(compiled.text);
}
END_TEST

START_TEST(bad_sizes_tokens_and_steps_past_the_context_fail) {
    dec_error e = {""};
    dec_config c = SMALL;
    c.heads = 5; /* 32 is not a multiple */
    ck_assert_ptr_null(dec_new(&c, 0, em_cpu(), &e));
    ck_assert(strstr(e.msg, "bad sizes"));
    c = SMALL;
    c.ctx = 1;
    ck_assert_ptr_null(dec_new(&c, 0, em_cpu(), NULL));
    ck_assert_ptr_null(dec_new(NULL, 0, em_cpu(), &e));
    dec_model *m = dec_new(&SMALL, 1, em_cpu(), &e);
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(dec_reset(m, (int64_t[]){1, 97, 2}, &e), EM_ERR_ARG);
    ck_assert_int_eq(dec_reset(m, NULL, &e), EM_ERR_NULL);
    ck_assert_int_eq(dec_reset(m, (int64_t[]){1, 2, 3}, &e), EM_OK);
    /* ctx - 1 steps fill the history; the next one has nowhere to write */
    em_status s = EM_OK;
    for (int i = 0; i < SMALL.ctx && s == EM_OK; i++) {
        em_scope_begin();
        em_tensor *in = dec_history(m), *out[2];
        s = dec_step(m, &in, NULL, out);
        ck_assert_msg(i < SMALL.ctx - 1 ? s == EM_OK : s == EM_ERR_INDEX, "step %d: %d %s", i, s, em_last_error());
        em_scope_end();
    }
    ck_assert_int_eq(dec_save_weights(m, "/nonexistent-dir/w.bin", &e), EM_ERR_IO);
    dec_free(m);
    dec_free(NULL);
}
END_TEST

/* On the GPU: eager CUDA, compiled, and compiled with CUDA graphs (every
 * step after the warm-up one replayed) against the CPU's eager run. */
START_TEST(cuda_steps_and_graph_replays_generate_the_same_tokens) {
    static run cpu, eager, compiled, graphs;
    run_steps(EAGER, em_cpu(), &cpu);
    run_steps(EAGER, em_cuda(0), &eager);
    run_steps(COMPILED, em_cuda(0), &compiled);
    run_steps(GRAPHS, em_cuda(0), &graphs);
    check_same(&cpu, &eager, 1e-4, "cuda eager");
    check_same(&eager, &compiled, 1e-4, "cuda compiled");
    check_same(&eager, &graphs, 1e-4, "cuda graphs");
    check_entry(&compiled);
    check_entry(&graphs);
    ck_assert_msg(graphs.st.graph_replays >= STEPS - 2, "replays %lld", (long long)graphs.st.graph_replays);
    free(compiled.text);
    free(graphs.text);
}
END_TEST

int main(void) {
    const tu_test cpu_tests[] = {
        {"compiled_and_lazy_steps_generate_eagers_tokens", compiled_and_lazy_steps_generate_eagers_tokens},
        {"bad_sizes_tokens_and_steps_past_the_context_fail", bad_sizes_tokens_and_steps_past_the_context_fail},
    };
    char why[256] = "";
    if (!tu_probe_gpu(why, sizeof why)) {
        printf("SKIP: the decoder's CUDA test: no CUDA device: %s\n", why[0] ? why : "(unknown)");
        return tu_run(tu_suite("decode", cpu_tests, 2, 120));
    }
    const tu_test all[] = {cpu_tests[0], cpu_tests[1],
                           {"cuda_steps_and_graph_replays_generate_the_same_tokens",
                            cuda_steps_and_graph_replays_generate_the_same_tokens}};
    return tu_run(tu_suite("decode", all, 3, 300));
}
