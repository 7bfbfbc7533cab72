/* eager_demo.c - Ember's eager tensors at work: a tiny two-layer network
 * with softmax, layer norm, broadcasting and views, on seeded random data.
 *
 *   ./examples/eager_demo            prints each step and the result
 */
#include <ember.h>
#include <stdio.h>
#include <time.h>

#define CHECK(t)                                                         \
    do {                                                                 \
        if (!(t)) {                                                      \
            fprintf(stderr, "error: %s\n", em_last_error());             \
            return 1;                                                    \
        }                                                                \
    } while (0)

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(void) {
    em_generator *g = em_generator_new(42);
    CHECK(g);
    em_scope_begin();

    /* A batch of 4 inputs of 8 features, a 8 -> 16 -> 3 MLP. */
    em_tensor *x = em_randn(g, 2, (int64_t[]){4, 8}, EM_F32, em_cpu());
    em_tensor *w1 = em_mul_scalar(em_randn(g, 2, (int64_t[]){8, 16}, EM_F32, em_cpu()), 0.35);
    em_tensor *b1 = em_zeros(1, (int64_t[]){16}, EM_F32, em_cpu());
    em_tensor *w2 = em_mul_scalar(em_randn(g, 2, (int64_t[]){16, 3}, EM_F32, em_cpu()), 0.25);
    em_tensor *b2 = em_mul_scalar(em_arange(-1, 2, 1, EM_F32, em_cpu()), 0.1);
    CHECK(x && w1 && b1 && w2 && b2);
    printf("input x:\n");
    em_print(x, stdout);

    /* Expression code: no intermediate leaks, the scope owns them all. */
    em_tensor *h = em_gelu(em_add(em_matmul(em_layer_norm(x, 1, NULL, NULL, 1e-5), w1), b1));
    em_tensor *logits = em_add(em_matmul(h, w2), b2);
    em_tensor *probs = em_softmax(logits, -1);
    CHECK(probs);
    printf("\nclass probabilities (softmax over the last dim):\n");
    em_print(probs, stdout);

    em_tensor *pred = em_argmax(probs, -1, false);
    CHECK(pred);
    printf("\npredicted classes:\n");
    em_print(pred, stdout);

    /* Views share storage: a transposed slice, made contiguous. */
    em_tensor *view = em_slice(em_transpose(x, 0, 1), 0, 0, 8, 3);
    CHECK(view);
    printf("\nx^T[::3] (a view: contiguous=%s, shares storage=%s):\n",
           em_is_contiguous(view) ? "yes" : "no", em_shares_storage(view, x) ? "yes" : "no");
    em_print(view, stdout);

    /* Errors are values, not aborts. */
    em_tensor *bad = em_add(x, em_ones(1, (int64_t[]){5}, EM_F32, em_cpu()));
    printf("\nadding [4, 8] and [5]: %s (%s)\n", bad ? "ok?" : "refused",
           em_last_error());
    em_clear_error();

    /* A bigger eager workload, timed. */
    em_tensor *big = em_randn(g, 2, (int64_t[]){2048, 1024}, EM_F32, em_cpu());
    CHECK(big);
    /* timed to the result (a value read), three times: the last is the
     * steady state (under EMBER_JIT=1 the first one also compiles) */
    double total = 0, t0 = 0, t1 = 0;
    for (int rep = 0; rep < 3; rep++) {
        em_scope_begin();
        t0 = now();
        em_tensor *y = em_add(em_mul_scalar(em_tanh(big), 0.5), big);
        em_tensor *s = em_softmax(y, -1);
        CHECK(s);
        CHECK(em_item(em_sum(s, 0, NULL, false), &total) == EM_OK ? s : NULL);
        t1 = now();
        em_scope_end();
    }
    printf("\nsoftmax(tanh(x)*0.5 + x) over 2048 x 1024, summed: %.2f ms on %d threads, "
           "rows sum to %.1f (expected 2048)\n",
           (t1 - t0) * 1e3, em_num_threads(), total);

    em_scope_end();
    em_generator_free(g);
    return 0;
}
