/* decoder.h - a GPT-2-shaped decoder that generates tokens one at a time
 * with a static KV cache written in place: the token-by-token workload of
 * issue 20 (examples/gpt2/main.c runs it; tests/test_decode.c links it).
 *
 * The model is GPT-2's (pre-norm blocks, gelu_tanh MLP, tied output
 * embedding) on seeded random weights (normal, std 0.02; layer norms at 1
 * and 0).  Everything a step changes lives on the device and is written
 * in place, so a step has no host traffic and one compiled step is one
 * CUDA graph replay:
 *  - per layer, the key and value caches [B, H, ctx, D];
 *  - the position pos [1] (i64) of the token being read;
 *  - the token history [B, ctx] (i64), the function's one input: the step
 *    reads history[:, pos], writes the argmax token at pos + 1, and
 *    advances pos.
 * Attention reads the whole cache every step, the positions after pos
 * masked by an additive -inf (what a static cache does: one shape for
 * every step).  A model of context ctx generates at most ctx - 1 tokens
 * after its first.
 *
 * Ownership: dec_new's model owns its weights, caches and history; dec_free
 * releases them.  Errors: functions return EM_OK or an em_status; those
 * that take a dec_error (may be NULL) write the reason into it, Ember's
 * message (em_last_error) for a failed Ember call. */
#ifndef DECODER_H
#define DECODER_H

#include <ember.h>
#include <stdint.h>

typedef struct dec_config {
    int layers, dim, heads, vocab, ctx, batch;
} dec_config;

/* GPT-2 small: 12 layers, d 768, 12 heads, vocab 50257; ctx and batch
 * given. */
dec_config dec_gpt2_small(int ctx, int batch);

typedef struct dec_model dec_model;

typedef struct dec_error {
    char msg[256];
} dec_error;

/* f32 weights from seed on dev, caches zeroed, pos 0, history zeros.
 * NULL (e says why) on bad sizes (any size < 1, ctx < 2, dim not a
 * multiple of heads) or a failed allocation. */
dec_model *dec_new(const dec_config *c, uint64_t seed, em_device dev, dec_error *e);
void dec_free(dec_model *m);
const dec_config *dec_config_of(const dec_model *m);

/* Starts a new generation: caches zeroed, pos 0, history[b, 0] =
 * first[b] (batch entries, each in [0, vocab)), the rest 0. */
em_status dec_reset(dec_model *m, const int64_t *first, dec_error *e);

/* One step, as an em_fn (ctx: the model; in[0]: the history tensor,
 * dec_history; no scalars): out[0] the next token of each sequence [B, 1]
 * (i64), out[1] its logits [B, 1, vocab].  Fails (EM_ERR_INDEX) once
 * pos + 1 reaches ctx. */
em_status dec_step(void *model, em_tensor *const *in, const double *scalars, em_tensor **out);

/* The history tensor (borrowed): the step function's input. */
em_tensor *dec_history(const dec_model *m);

/* The history's values: batch * ctx token ids, row by row. */
em_status dec_tokens(const dec_model *m, int64_t *out);

/* Writes every weight as little-endian f32, in dec_new's order (wte, wpe,
 * then per layer ln1 w b, qkv w b, proj w b, ln2 w b, fc w b, out w b,
 * then ln_f w b; matrices [in, out] row-major), for bench/torch_decode.py
 * to run the same model. */
em_status dec_save_weights(const dec_model *m, const char *path, dec_error *e);

#endif
