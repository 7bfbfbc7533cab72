/* test_cuda_graphs.c - CUDA graph replay of compiled entries (em_compile's
 * cuda_graphs, src/jit/engine/graphs.c, src/jit/cuda/cuda_graph.c): replays
 * against a float64 reference computed here and against the same function
 * compiled without graphs, over many calls with changing input contents;
 * inputs that move (staged) and sizes that change (one graph per size);
 * outputs kept across calls; captures that must fail (a host-path op, cat,
 * random draws) falling back with one log line; the memory of the graphs
 * given back with the entry and no growth over many calls.
 *
 * Needs a GPU: without one it checks the option's validation only and
 * exits 77 (SKIP).  CUDA is probed in a child process, as in test_cuda,
 * because Check forks a process per test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "config.h"
#include "eager.h" /* em_backend_for, em_data: refilling an input in place */
#ifdef EMBER_HAVE_CUDA
#include "cuda_lib.h" /* cuda_mem_usage */
#endif

#define GPU em_cuda(0)

enum { M = 8, K = 64, H = 96, N = 48 };

/* in: x [m, K], w1 [K, H], b1 [H], w2 [H, N], b2 [N]; out: softmax(y) and
 * y = relu(x @ w1 + b1) @ w2 + b2: two cuBLAS gemms and fused kernels. */
static em_status mlp_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx, (void)s;
    em_tensor *h = em_relu(em_add(em_matmul(in[0], in[1]), in[2]));
    em_tensor *y = em_add(em_matmul(h, in[3]), in[4]);
    out[0] = em_softmax(y, -1);
    out[1] = y;
    return out[0] && out[1] ? EM_OK : em_last_status();
}

/* t's values (host, float64) put on the GPU as f32. */
static em_tensor *gpu_random(uint64_t seed, int ndim, const int64_t *sizes, double scale) {
    em_tensor *c = tu_random(seed, ndim, sizes, EM_F32, scale);
    size_t n = (size_t)em_numel(c) * 4;
    float *buf = malloc(n);
    ck_assert_int_eq(em_copy_to_host(c, buf, n), EM_OK);
    em_tensor *g = em_from_data(buf, EM_F32, ndim, sizes, GPU);
    free(buf);
    ck_assert_msg(g != NULL, "%s", em_last_error());
    return g;
}

/* Writes fresh values (seed) into GPU tensor t in place: its address stays. */
static void refill(em_tensor *t, uint64_t seed, double scale) {
    em_tensor *c = tu_random(seed, em_ndim(t), em_sizes(t), EM_F32, scale);
    size_t n = (size_t)em_numel(c) * 4;
    float *buf = malloc(n);
    ck_assert_int_eq(em_copy_to_host(c, buf, n), EM_OK);
    const em_backend *b = em_backend_for(GPU);
    ck_assert_int_eq(b->copy(em_data(t), GPU, buf, em_cpu(), n), EM_OK);
    free(buf);
}

/* The float64 reference of mlp_fn's outputs for inputs in (m rows). */
static void mlp_ref(em_tensor *const *in, int64_t m, double *soft, double *y) {
    double *x = tu_values(in[0]), *w1 = tu_values(in[1]), *b1 = tu_values(in[2]);
    double *w2 = tu_values(in[3]), *b2 = tu_values(in[4]);
    double h[H];
    for (int64_t i = 0; i < m; i++) {
        for (int j = 0; j < H; j++) {
            double a = b1[j];
            for (int k = 0; k < K; k++) a += x[i * K + k] * w1[k * H + j];
            h[j] = a > 0 ? a : 0;
        }
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j < N; j++) {
            double a = b2[j];
            for (int k = 0; k < H; k++) a += h[k] * w2[k * N + j];
            y[i * N + j] = a;
            mx = a > mx ? a : mx;
        }
        for (int j = 0; j < N; j++) sum += exp(y[i * N + j] - mx);
        for (int j = 0; j < N; j++) soft[i * N + j] = exp(y[i * N + j] - mx) / sum;
    }
    free(x), free(w1), free(b1), free(w2), free(b2);
}

/* Checks f's outputs out against the reference for in. */
static void check_mlp(em_tensor *const *in, int64_t m, em_tensor *const *out) {
    double *soft = malloc(sizeof(double) * (size_t)(m * N)), *y = malloc(sizeof(double) * (size_t)(m * N));
    mlp_ref(in, m, soft, y);
    tu_check_close(out[0], soft, 2, TU_SIZES(m, N), 1e-4, 1e-6);
    tu_check_close(out[1], y, 2, TU_SIZES(m, N), 1e-4, 1e-4);
    free(soft), free(y);
}

static void weights(em_tensor **in) {
    in[1] = gpu_random(2, 2, TU_SIZES(K, H), 0.2);
    in[2] = gpu_random(3, 1, TU_SIZES(H), 0.5);
    in[3] = gpu_random(4, 2, TU_SIZES(H, N), 0.2);
    in[4] = gpu_random(5, 1, TU_SIZES(N), 0.5);
}

static em_compiled *compile_mlp(int graphs, int dynamic) {
    em_compile_options o = {.ninputs = 5, .noutputs = 2, .name = "mlp", .cuda_graphs = graphs,
                            .dynamic = dynamic};
    em_compiled *f = em_compile(mlp_fn, NULL, &o);
    ck_assert_msg(f != NULL, "%s", em_last_error());
    return f;
}

static em_compile_stats stats_of(const em_compiled *f) {
    em_compile_stats st;
    ck_assert_int_eq(em_compiled_stats(f, &st), EM_OK);
    return st;
}

/* Asserts that a and b hold the same values to rtol. */
static void same_values(const em_tensor *a, const em_tensor *b, double rtol) {
    double *r = tu_values(b);
    tu_check_close(a, r, em_ndim(b), em_sizes(b), rtol, 1e-7);
    free(r);
}

/* ---- replay against the plain path and float64 ---- */

START_TEST(replay_matches_plain_and_reference) {
    em_tensor *in[5];
    in[0] = gpu_random(1, 2, TU_SIZES(M, K), 1);
    weights(in);
    em_compiled *on = compile_mlp(1, -1), *off = compile_mlp(-1, -1);
    enum { CALLS = 200 };
    for (int c = 0; c < CALLS; c++) {
        refill(in[0], 100 + (uint64_t)c, 1 + c % 3); /* new contents, same address */
        em_scope_begin();
        em_tensor *a[2], *b[2];
        ck_assert_msg(em_call(on, in, NULL, a) == EM_OK, "call %d: %s", c, em_last_error());
        ck_assert_msg(em_call(off, in, NULL, b) == EM_OK, "call %d: %s", c, em_last_error());
        if (c % 20 == 0 || c < 4) check_mlp(in, M, a);
        same_values(a[0], b[0], 1e-5);
        same_values(a[1], b[1], 1e-5);
        em_scope_end();
    }
    em_compile_stats st = stats_of(on);
    ck_assert_int_eq(st.graphs_captured, 1);
    /* the trace call and the warm-up run plainly; every later call replays */
    ck_assert_msg(st.graph_replays >= CALLS - 2, "%lld replays", (long long)st.graph_replays);
    ck_assert_int_eq(stats_of(off).graphs_captured, 0);
    ck_assert_int_eq(stats_of(off).graph_replays, 0);
    em_compiled_free(on);
    em_compiled_free(off);
}
END_TEST

/* An input made anew each call, with the old ones still alive, is at a new
 * address every call: the graph is captured once more with it staged, and
 * each call copies it in. */
START_TEST(moving_inputs_are_staged) {
    em_tensor *in[5];
    weights(in);
    em_compiled *f = compile_mlp(1, -1);
    enum { CALLS = 40 };
    em_tensor *keep[CALLS];
    for (int c = 0; c < CALLS; c++) {
        keep[c] = in[0] = gpu_random(200 + (uint64_t)c, 2, TU_SIZES(M, K), 1);
        em_tensor *out[2];
        ck_assert_msg(em_call(f, in, NULL, out) == EM_OK, "call %d: %s", c, em_last_error());
        check_mlp(in, M, out);
    }
    (void)keep;
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.graphs_captured, 2); /* baked, then staged */
    ck_assert_msg(st.graph_replays >= CALLS - 3, "%lld replays", (long long)st.graph_replays);
    em_compiled_free(f);
}
END_TEST

/* in[0] (a cache [R, C]) gets row in[1] = in[2] + 1 in place; out: the
 * cache's column sums after the write. */
enum { R = 6, C = 5 };
static em_status write_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx, (void)s;
    em_status st = em_index_copy_(in[0], 0, in[1], em_add_scalar(in[2], 1));
    out[0] = st == EM_OK ? em_sum(in[0], 1, (int[]){0}, false) : NULL;
    return out[0] ? EM_OK : em_last_status();
}

/* A cache written in place by the graph: where it stays, and where a new
 * cache comes each call (staged: the graph writes its staging buffer,
 * copied back into the caller's tensor after each replay). */
START_TEST(inputs_written_in_place_get_the_writes) {
    em_compile_options o = {.ninputs = 3, .noutputs = 1, .name = "write", .cuda_graphs = 1};
    em_compiled *f = em_compile(write_fn, NULL, &o);
    for (int moving = 0; moving <= 1; moving++) {
        em_tensor *cache = gpu_random(300, 2, TU_SIZES(R, C), 1), *keep[12] = {0};
        double *ref = tu_values(cache);
        for (int c = 0; c < 12; c++) {
            if (moving) { /* a new cache with the old one's values, the old one kept */
                keep[c] = cache;
                cache = em_add_scalar(cache, 0);
            }
            int64_t row = (c * 5) % R;
            em_tensor *pos = em_from_data(&row, EM_I64, 1, TU_SIZES(1), GPU);
            em_tensor *src = gpu_random(310 + (uint64_t)c, 2, TU_SIZES(1, C), 1), *out;
            double *sv = tu_values(src), want[C] = {0};
            for (int j = 0; j < C; j++) ref[row * C + j] = sv[j] + 1;
            for (int i = 0; i < R * C; i++) want[i % C] += ref[i];
            em_tensor *in[3] = {cache, pos, src};
            ck_assert_msg(em_call(f, in, NULL, &out) == EM_OK, "call %d: %s", c, em_last_error());
            tu_check_close(out, want, 1, TU_SIZES(C), 1e-5, 1e-6);
            tu_check_close(cache, ref, 2, TU_SIZES(R, C), 1e-6, 1e-7);
            free(sv);
        }
        free(ref);
        (void)keep;
    }
    em_compile_stats st = stats_of(f);
    ck_assert_msg(st.graph_replays >= 18, "%lld replays", (long long)st.graph_replays);
    em_compiled_free(f);
}
END_TEST

/* A dynamic entry gets one graph per size; each size replays its own. */
START_TEST(each_size_has_its_graph) {
    em_tensor *in[5];
    weights(in);
    em_compiled *f = compile_mlp(1, 0); /* automatic: the second size makes dim 0 dynamic */
    const int64_t sizes[] = {4, 8, 4, 16, 8, 16, 4, 8, 12, 12, 4, 16};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    em_tensor *x[17] = {0};
    for (int r = 0; r < 3; r++) {
        for (int c = 0; c < NS; c++) {
            int64_t m = sizes[c];
            if (!x[m]) x[m] = gpu_random(300 + (uint64_t)m, 2, TU_SIZES(m, K), 1);
            refill(x[m], 400 + (uint64_t)(r * NS + c), 1);
            in[0] = x[m];
            em_scope_begin(); /* the outputs are dropped: replays hand out the graph's blocks */
            em_tensor *out[2];
            ck_assert_msg(em_call(f, in, NULL, out) == EM_OK, "size %lld: %s", (long long)m, em_last_error());
            ck_assert_int_eq(em_size(out[0], 0), m);
            check_mlp(in, m, out);
            em_scope_end();
        }
    }
    em_compile_stats st = stats_of(f);
    ck_assert_int_eq(st.dynamic_entries, 1);
    /* sizes 4, 8, 12, 16 (4 perhaps twice: its static first entry, then the
     * dynamic entry, which serves it too) */
    ck_assert_msg(st.graphs_captured >= 4 && st.graphs_captured <= 5, "%lld graphs",
                  (long long)st.graphs_captured);
    ck_assert_msg(st.graph_replays >= 3 * NS - 10, "%lld replays", (long long)st.graph_replays);
    em_compiled_free(f);
}
END_TEST

/* Outputs kept across calls keep their values: each call's are fresh. */
START_TEST(kept_outputs_stay_valid) {
    em_tensor *in[5];
    in[0] = gpu_random(1, 2, TU_SIZES(M, K), 1);
    weights(in);
    em_compiled *f = compile_mlp(1, -1);
    enum { CALLS = 12 };
    em_tensor *out[CALLS][2];
    double *ref_soft[CALLS], *ref_y[CALLS];
    for (int c = 0; c < CALLS; c++) {
        refill(in[0], 500 + (uint64_t)c, 1);
        ref_soft[c] = malloc(sizeof(double) * M * N);
        ref_y[c] = malloc(sizeof(double) * M * N);
        mlp_ref(in, M, ref_soft[c], ref_y[c]);
        ck_assert_msg(em_call(f, in, NULL, out[c]) == EM_OK, "%s", em_last_error());
    }
    for (int c = 0; c < CALLS; c++) {
        tu_check_close(out[c][0], ref_soft[c], 2, TU_SIZES(M, N), 1e-4, 1e-6);
        tu_check_close(out[c][1], ref_y[c], 2, TU_SIZES(M, N), 1e-4, 1e-4);
        ck_assert_ptr_ne(em_data(out[c][0]), em_data(out[(c + 1) % CALLS][0]));
        free(ref_soft[c]), free(ref_y[c]);
    }
    ck_assert_msg(stats_of(f).graph_replays >= CALLS - 2, "%lld", (long long)stats_of(f).graph_replays);
    /* the third call found the second's outputs held: captured again, its
     * outputs copied out from then on */
    ck_assert_int_eq(stats_of(f).graphs_captured, 2);
    em_compiled_free(f);
}
END_TEST

/* A loop that drops each call's outputs gets views of the graph's own
 * blocks (no copy): the same address every call, the values right. */
START_TEST(dropped_outputs_are_handed_out_in_place) {
    em_tensor *in[5];
    in[0] = gpu_random(1, 2, TU_SIZES(M, K), 1);
    weights(in);
    em_compiled *f = compile_mlp(1, -1);
    void *seen = NULL;
    for (int c = 0; c < 8; c++) {
        refill(in[0], 700 + (uint64_t)c, 1);
        em_scope_begin();
        em_tensor *out[2];
        ck_assert_msg(em_call(f, in, NULL, out) == EM_OK, "%s", em_last_error());
        check_mlp(in, M, out);
        if (c == 2) seen = em_data(out[0]);
        if (c > 2) ck_assert_ptr_eq(em_data(out[0]), seen);
        em_scope_end();
    }
    ck_assert_int_eq(stats_of(f).graphs_captured, 1);
    em_compiled_free(f);
}
END_TEST

/* ---- captures that must fail, and fall back ---- */

/* in: a, b (i32 [4, 4]): an integer matmul runs on the host path. */
static em_status int_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx, (void)s;
    out[0] = em_add(em_matmul(in[0], in[1]), in[0]);
    return out[0] ? EM_OK : em_last_status();
}

/* in: a, b (f32 [4, 8]): cat. */
static em_status cat_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)ctx, (void)s;
    em_tensor *xs[2] = {em_relu(in[0]), em_mul_scalar(in[1], 2)};
    out[0] = em_mul_scalar(em_cat(2, xs, 0), 3);
    return out[0] ? EM_OK : em_last_status();
}

/* in: a (f32 [4, 8]): a random draw, which must move on each call. */
static em_status rand_fn(void *ctx, em_tensor *const *in, const double *s, em_tensor **out) {
    (void)s;
    out[0] = em_add(em_relu(in[0]), em_randn(ctx, 2, TU_SIZES(4, 8), EM_F32, GPU));
    return out[0] ? EM_OK : em_last_status();
}

/* The lines of file path containing needle. */
static int count_lines(const char *path, const char *needle) {
    FILE *f = fopen(path, "r");
    int n = 0;
    char line[1024];
    while (f && fgets(line, sizeof line, f))
        n += strstr(line, needle) != NULL;
    if (f) fclose(f);
    return n;
}

/* Compiles fn with graphs on and EMBER_LOG=cudagraphs into a file. */
static em_compiled *compile_logged(em_fn fn, void *ctx, int nin, char *log, size_t n) {
    snprintf(log, n, "/tmp/ember_graphs_log_%d.txt", (int)getpid());
    unlink(log);
    setenv("EMBER_LOG", "cudagraphs", 1);
    setenv("EMBER_LOG_FILE", log, 1);
    em_compile_options o = {.ninputs = nin, .noutputs = 1, .name = "fb", .cuda_graphs = 1};
    em_compiled *f = em_compile(fn, ctx, &o);
    unsetenv("EMBER_LOG");
    unsetenv("EMBER_LOG_FILE");
    ck_assert_msg(f != NULL, "%s", em_last_error());
    return f;
}

START_TEST(host_path_op_falls_back) {
    double av[16], bv[16];
    for (int i = 0; i < 16; i++) av[i] = i % 5 - 2, bv[i] = (i * 7) % 3 - 1;
    em_tensor *ac = tu_tensor(av, 2, TU_SIZES(4, 4), EM_I32), *bc = tu_tensor(bv, 2, TU_SIZES(4, 4), EM_I32);
    int32_t a32[16], b32[16];
    em_copy_to_host(ac, a32, sizeof a32), em_copy_to_host(bc, b32, sizeof b32);
    em_tensor *in[2] = {em_from_data(a32, EM_I32, 2, TU_SIZES(4, 4), GPU),
                        em_from_data(b32, EM_I32, 2, TU_SIZES(4, 4), GPU)};
    char log[128];
    em_compiled *f = compile_logged(int_fn, NULL, 2, log, sizeof log);
    double ref[16];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            double s = av[i * 4 + j];
            for (int k = 0; k < 4; k++) s += av[i * 4 + k] * bv[k * 4 + j];
            ref[i * 4 + j] = s;
        }
    for (int c = 0; c < 6; c++) {
        em_tensor *out[1];
        ck_assert_msg(em_call(f, in, NULL, out) == EM_OK, "call %d: %s", c, em_last_error());
        tu_check_close(out[0], ref, 2, TU_SIZES(4, 4), 0, 0);
    }
    ck_assert_int_eq(stats_of(f).graphs_captured, 0);
    ck_assert_int_eq(stats_of(f).graph_replays, 0);
    em_compiled_free(f);
    ck_assert_int_eq(count_lines(log, "graph not used"), 1);
    ck_assert_int_eq(count_lines(log, "host path"), 1);
    unlink(log);
}
END_TEST

START_TEST(cat_falls_back) {
    em_tensor *in[2] = {gpu_random(7, 2, TU_SIZES(4, 8), 1), gpu_random(8, 2, TU_SIZES(4, 8), 1)};
    char log[128];
    em_compiled *f = compile_logged(cat_fn, NULL, 2, log, sizeof log);
    for (int c = 0; c < 5; c++) {
        refill(in[0], 600 + (uint64_t)c, 1);
        double *a = tu_values(in[0]), *b = tu_values(in[1]), ref[64];
        for (int i = 0; i < 32; i++) ref[i] = 3 * (a[i] > 0 ? a[i] : 0), ref[32 + i] = 6 * b[i];
        em_tensor *out[1];
        ck_assert_msg(em_call(f, in, NULL, out) == EM_OK, "call %d: %s", c, em_last_error());
        tu_check_close(out[0], ref, 2, TU_SIZES(8, 8), 1e-6, 1e-6);
        free(a), free(b);
    }
    ck_assert_int_eq(stats_of(f).graph_replays, 0);
    em_compiled_free(f);
    ck_assert_int_eq(count_lines(log, "graph not used"), 1);
    unlink(log);
}
END_TEST

/* A graph with a random draw is never replayed: each call's draw differs,
 * as with plain launches. */
START_TEST(random_draws_are_not_replayed) {
    em_generator *gen = em_generator_new(42);
    em_tensor *in[1] = {gpu_random(9, 2, TU_SIZES(4, 8), 1)};
    char log[128];
    em_compiled *f = compile_logged(rand_fn, gen, 1, log, sizeof log);
    em_tensor *prev = NULL;
    for (int c = 0; c < 5; c++) {
        em_tensor *out[1];
        ck_assert_msg(em_call(f, in, NULL, out) == EM_OK, "call %d: %s", c, em_last_error());
        if (prev) {
            double *p = tu_values(prev), *q = tu_values(out[0]);
            int same = 0;
            for (int i = 0; i < 32; i++) same += p[i] == q[i];
            ck_assert_msg(same < 8, "call %d repeated %d values of the previous draw", c, same);
            free(p), free(q);
        }
        prev = out[0];
    }
    ck_assert_int_eq(stats_of(f).graph_replays, 0);
    em_compiled_free(f);
    em_generator_free(gen);
    ck_assert_int_le(count_lines(log, "graph not used"), 1);
    unlink(log);
}
END_TEST

/* ---- memory ---- */

#ifdef EMBER_HAVE_CUDA
static size_t live_bytes(void) {
    cuda_device *d = cuda_device_get(0);
    ck_assert_ptr_nonnull(d);
    size_t live, cached;
    cuda_mem_usage(d, &live, &cached);
    return live;
}
#endif

/* 10,000 replays hold no more device memory than the first few; freeing
 * the compiled function gives its graphs' blocks back. */
START_TEST(memory_is_bounded_and_freed) {
#ifdef EMBER_HAVE_CUDA
    em_tensor *in[5];
    in[0] = gpu_random(1, 2, TU_SIZES(M, K), 1);
    weights(in);
    size_t base = live_bytes();
    em_compiled *f = compile_mlp(1, -1);
    size_t after_warm = 0;
    enum { CALLS = 10000 };
    for (int c = 0; c < CALLS; c++) {
        em_scope_begin();
        em_tensor *out[2];
        ck_assert_msg(em_call(f, in, NULL, out) == EM_OK, "call %d: %s", c, em_last_error());
        if (c == CALLS - 1) check_mlp(in, M, out);
        em_scope_end();
        if (c == 10) after_warm = live_bytes();
    }
    size_t after = live_bytes();
    ck_assert_msg(after == after_warm, "live device bytes grew from %zu to %zu", after_warm, after);
    ck_assert_msg(after > base, "the graph holds no memory (%zu, %zu)", base, after);
    ck_assert_int_ge(stats_of(f).graph_replays, CALLS - 2);
    em_compiled_free(f);
    size_t freed = live_bytes();
    ck_assert_msg(freed == base, "live device bytes %zu after the free, %zu before", freed, base);
#endif
}
END_TEST

/* ---- options ---- */

START_TEST(option_is_checked) {
    em_compile_options o = {.ninputs = 5, .noutputs = 2, .cuda_graphs = 2};
    ck_assert_ptr_null(em_compile(mlp_fn, NULL, &o));
    ck_assert_int_eq(em_last_status(), EM_ERR_ARG);
    ck_assert(strstr(em_last_error(), "cuda_graphs") != NULL);
    o.cuda_graphs = -2;
    ck_assert_ptr_null(em_compile(mlp_fn, NULL, &o));
    ck_assert_int_eq(em_last_status(), EM_ERR_ARG);
}
END_TEST

int main(void) {
    const tu_test cpu_tests[] = {{"option_is_checked", option_is_checked}};
    char why[512];
    if (!tu_probe_gpu(why, sizeof why)) {
        printf("SKIP: the CUDA graph tests: no CUDA device: %s\n", why[0] ? why : "(unknown)");
        int rc = tu_run(tu_suite("cuda_graphs_cpu", cpu_tests, 1, 60));
        return rc == 0 ? 77 : rc;
    }
    const tu_test tests[] = {
        {"option_is_checked", option_is_checked},
        {"replay_matches_plain_and_reference", replay_matches_plain_and_reference},
        {"moving_inputs_are_staged", moving_inputs_are_staged},
        {"inputs_written_in_place_get_the_writes", inputs_written_in_place_get_the_writes},
        {"each_size_has_its_graph", each_size_has_its_graph},
        {"kept_outputs_stay_valid", kept_outputs_stay_valid},
        {"dropped_outputs_are_handed_out_in_place", dropped_outputs_are_handed_out_in_place},
        {"host_path_op_falls_back", host_path_op_falls_back},
        {"cat_falls_back", cat_falls_back},
        {"random_draws_are_not_replayed", random_draws_are_not_replayed},
        {"memory_is_bounded_and_freed", memory_is_bounded_and_freed},
    };
    return tu_run(tu_suite("cuda_graphs", tests, sizeof tests / sizeof tests[0], 120));
}
