/* compile_demo.c - em_compile at work on a small model.
 *
 * A two-layer MLP with a softmax head is compiled with em_compile, then
 * called with changing batch sizes and dtypes.  Run it with
 *
 *   EMBER_LOG=graph,recompiles,breaks ./examples/compile_demo
 *
 * to see the captured graph and each recompile with the guard that failed:
 * the second batch size makes the batch dim dynamic (one entry then serves
 * every batch size), the f64 call gets an entry of its own.  With
 * EMBER_DYNAMIC=0 every size is its own entry, and calls switch to eager
 * once the recompile limit (3 here) is hit. */
#include <ember.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct model {
    em_tensor *w1, *b1, *w2, *b2;
} model;

/* softmax(gelu(x @ w1 + b1) @ w2 + b2): the weights come from ctx and are
 * captured as constants. */
static em_status forward(void *ctx, em_tensor *const *in, const double *scalars, em_tensor **out) {
    (void)scalars;
    const model *m = ctx;
    em_tensor *h = em_gelu(em_add(em_matmul(in[0], m->w1), m->b1));
    out[0] = em_softmax(em_add(em_matmul(h, m->w2), m->b2), -1);
    return out[0] ? EM_OK : em_last_status();
}

#define CHECK(cond)                                                   \
    do {                                                              \
        if (!(cond)) {                                                \
            fprintf(stderr, "error: %s\n", em_last_error());          \
            return 1;                                                 \
        }                                                             \
    } while (0)

int main(void) {
    em_generator *g = em_generator_new(7);
    em_scope_begin();
    model m = {
        em_mul_scalar(em_randn(g, 2, (int64_t[]){16, 32}, EM_F32, em_cpu()), 0.25),
        em_zeros(1, (int64_t[]){32}, EM_F32, em_cpu()),
        em_mul_scalar(em_randn(g, 2, (int64_t[]){32, 4}, EM_F32, em_cpu()), 0.2),
        em_zeros(1, (int64_t[]){4}, EM_F32, em_cpu()),
    };
    CHECK(m.w1 && m.b1 && m.w2 && m.b2);
    em_tensor *const *watch[] = {&m.w1, &m.b1, &m.w2, &m.b2};
    em_compile_options opts = {
        .ninputs = 1, .noutputs = 1, .name = "mlp",
        .input_names = (const char *[]){"x"},
        .recompile_limit = 3,
        .watch = watch, .nwatch = 4,
    };
    em_compiled *f = em_compile(forward, &m, &opts);
    CHECK(f);

    /* batch sizes change, then the dtype: a new signature is a recompile
     * (a new batch size only until the batch dim is dynamic), up to the
     * limit; repeated ones hit their entries */
    struct { int64_t batch; em_dtype dtype; } calls[] = {
        {8, EM_F32}, {8, EM_F32}, {16, EM_F32}, {8, EM_F32}, {16, EM_F64},
        {32, EM_F32}, {64, EM_F32}, {16, EM_F32},
    };
    for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
        em_scope_begin();
        em_tensor *x = em_cast(em_randn(g, 2, (int64_t[]){calls[i].batch, 16}, EM_F32, em_cpu()),
                               calls[i].dtype);
        em_tensor *y;
        CHECK(x && em_call(f, &x, NULL, &y) == EM_OK);
        double total;
        CHECK(em_item(em_sum(y, 0, NULL, false), &total) == EM_OK);
        em_compile_stats st;
        em_compiled_stats(f, &st);
        printf("call %zu: x %s[%lld, 16] -> probabilities summing to %.3f "
               "(entries %d, hits %lld, traces %lld, eager %lld)\n",
               i + 1, em_dtype_name(calls[i].dtype), (long long)calls[i].batch, total,
               st.entries, (long long)st.hits, (long long)st.traces, (long long)st.eager);
        em_scope_end();
    }
    em_compile_stats st;
    em_compiled_stats(f, &st);
    printf("\nlast guard failure: %s\n", st.last_failure);
    printf("native kernels: %lld compiled, %lld loaded from the kernel cache "
           "(run the demo again: they all load)\n",
           (long long)st.kernels_compiled, (long long)st.kernels_loaded);
    printf("\nthe most recent entry:\n");
    em_compiled_print(f, 0, false, stdout);

    em_compiled_free(f);
    em_scope_end();
    em_generator_free(g);
    return 0;
}
