/* getting_started.c - the program of docs/getting-started.md: your own
 * function, run eagerly and compiled with em_compile.  Built by `make`, so
 * the page's code is known to compile and run. */
#include <ember.h>
#include <stdio.h>

/* The model's weights, reached by the compiled function through ctx. */
typedef struct model {
    em_tensor *w, *b;
} model;

/* y = softmax(gelu(x @ w + b)): a function of its input and the weights */
static em_status forward(void *ctx, em_tensor *const *in, const double *scalars, em_tensor **out) {
    (void)scalars;
    const model *m = ctx;
    out[0] = em_softmax(em_gelu(em_add(em_matmul(in[0], m->w), m->b)), -1);
    return out[0] ? EM_OK : em_last_status(); /* NULL: the first error is kept */
}

int main(void) {
    em_generator *gen = em_generator_new(42);
    /* tensors made outside any scope belong to us: released at the end */
    model m = {
        em_randn(gen, 2, (int64_t[]){64, 10}, EM_F32, em_cpu()),
        em_zeros(1, (int64_t[]){10}, EM_F32, em_cpu()),
    };
    em_compile_options opts = {.ninputs = 1, .noutputs = 1, .name = "forward"};
    em_compiled *f = em_compile(forward, &m, &opts);
    if (!m.w || !m.b || !f) {
        fprintf(stderr, "error: %s\n", em_last_error());
        return 1;
    }
    for (int step = 0; step < 3; step++) {
        em_scope_begin(); /* everything made until em_scope_end is freed there */
        em_tensor *x = em_randn(gen, 2, (int64_t[]){32, 64}, EM_F32, em_cpu());
        em_tensor *eager = NULL, *compiled = NULL;
        if (forward(&m, &x, NULL, &eager) != EM_OK || em_call(f, &x, NULL, &compiled) != EM_OK) {
            fprintf(stderr, "error: %s\n", em_last_error());
            em_scope_end();
            return 1;
        }
        double diff;
        em_item(em_amax(em_abs(em_sub(eager, compiled)), 0, NULL, false), &diff);
        printf("step %d: y is [%lld, %lld], eager and compiled differ by at most %.1e\n", step,
               (long long)em_size(compiled, 0), (long long)em_size(compiled, 1), diff);
        em_scope_end();
    }
    em_compile_stats st;
    em_compiled_stats(f, &st);
    printf("calls %lld: %lld traced, %lld served by the compiled graph (%d kernels, "
           "%lld compiled now, %lld loaded from the cache)\n",
           (long long)st.calls, (long long)st.traces, (long long)st.hits, st.kernels,
           (long long)st.kernels_compiled, (long long)st.kernels_loaded);
    em_compiled_free(f);
    em_release(m.w);
    em_release(m.b);
    em_generator_free(gen);
    return 0;
}
