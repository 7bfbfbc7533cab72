/* bench_remote.c - the remote cache tier under load (make bench-remote,
 * which starts a redis-server on a loopback port and a fresh key):
 *
 *   1. fetch rate: N kernel-sized entries published once, then fetched by
 *      1 and by 8 concurrent reader processes, each with an empty cache
 *      directory (every lookup a remote hit: GET, signature check, write to
 *      disk); entries per second and MB/s, median of the runs;
 *   2. first-call latency of a compiled program started warm from the
 *      remote tier (an empty directory) against warm from its disk (a full
 *      directory, no remote tier), alternated, medians.
 *
 * Needs EMBER_CACHE_REMOTE and EMBER_CACHE_KEY_FILE (make bench-remote sets
 * them).  Prints a table; --json FILE writes the figures. */
#include "bench_stats.h"
#include "cache.h"
#include "eager.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ENTRIES 400
#define ENTRY_BYTES (16 << 10) /* about a fused CPU kernel's shared object */
#define READERS 8
#define RUNS 5

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}


static kc_key key_of(int i) {
    kc_hasher h;
    kc_hasher_reset(&h);
    kc_hasher_update_str(&h, "bench_remote");
    kc_hasher_update_u64(&h, (uint64_t)i);
    return kc_hasher_digest(&h);
}

static char root[64];

static kc_cache *cache_in(const char *name) {
    char dir[128];
    snprintf(dir, sizeof dir, "%s/%s", root, name);
    kc_options o = {.dir = dir};
    return kc_open_with(&o);
}

static void rm_dir(const char *name) {
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf %s/%s", root, name);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s/%s\n", root, name);
}

/* A reader process: every entry through an empty cache; exit 0 if all hit. */
static void reader(int r, int run) {
    char name[32];
    snprintf(name, sizeof name, "r%d-%d", run, r);
    kc_cache *c = cache_in(name);
    int hits = 0;
    for (int i = 0; c && i < ENTRIES; i++) {
        kc_key k = key_of(i);
        void *d = NULL;
        size_t n = 0;
        if (kc_get(c, &k, "so", &d, &n) == EM_OK && d && n == ENTRY_BYTES) hits++;
        em_free(d);
    }
    kc_close(c);
    _exit(hits == ENTRIES ? 0 : 1);
}

/* Seconds for nr readers to fetch every entry, concurrently. */
static double fetch_round(int nr, int run) {
    double t0 = now_s();
    pid_t pids[READERS];
    for (int r = 0; r < nr; r++)
        if ((pids[r] = fork()) == 0) reader(r, run);
    int bad = 0;
    for (int r = 0; r < nr; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        bad += !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
    double t = now_s() - t0;
    for (int r = 0; r < nr; r++) {
        char name[32];
        snprintf(name, sizeof name, "r%d-%d", run, r);
        rm_dir(name);
    }
    if (bad) {
        fprintf(stderr, "bench_remote: %d readers missed entries\n", bad);
        exit(1);
    }
    return t;
}

/* The demo's first call (the MiniLM encoder: trace, then its kernels
 * loaded), in seconds, read from its output; -1 when it cannot run. */
static double demo_first_call(const char *demo, const char *dir, bool remote) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%sEMBER_CACHE_DIR=%s/%s %s --reps 1 'A man is eating food.' "
             "'The sky is blue.' 2>&1", remote ? "" : "EMBER_CACHE_REMOTE= ", root, dir, demo);
    FILE *p = popen(cmd, "r");
    char line[512];
    double s = -1;
    long long compiled = -1;
    while (p && fgets(line, sizeof line, p))
        if (sscanf(line, "compile:  first call %lf s (trace, then %lld", &s, &compiled) == 2) {
        }
    if (p) pclose(p);
    if (compiled != 0) return -1; /* not warm: the comparison would be wrong */
    return s;
}

int main(int argc, char **argv) {
    const char *json = NULL, *demo = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
        else if (!strcmp(argv[i], "--demo") && i + 1 < argc) demo = argv[++i];
        else {
            fprintf(stderr, "usage: bench_remote [--json FILE] [--demo PATH-TO-MINILM]\n");
            return 2;
        }
    }
    snprintf(root, sizeof root, "/tmp/ember-bench-remote-XXXXXX");
    if (!mkdtemp(root)) return 1;
    char prefix[64];
    snprintf(prefix, sizeof prefix, "bench-%d:", (int)getpid());
    setenv("EMBER_CACHE_REMOTE_PREFIX", prefix, 1);
    kc_cache *w = cache_in("writer");
    if (!w || !kc_remote_url(w)) {
        fprintf(stderr, "bench_remote: no remote tier (set EMBER_CACHE_REMOTE and "
                "EMBER_CACHE_KEY_FILE; make bench-remote does)\n");
        return 1;
    }
    char *payload = malloc(ENTRY_BYTES);
    for (int i = 0; i < ENTRY_BYTES; i++) payload[i] = (char)(i * 7 + 3);
    double t0 = now_s();
    for (int i = 0; i < ENTRIES; i++) {
        kc_key k = key_of(i);
        memcpy(payload, &i, sizeof i);
        kc_put(w, &k, "so", payload, ENTRY_BYTES);
    }
    double publish = now_s() - t0;
    kc_counters st;
    kc_stats(w, &st);
    if (st.remote_writes != ENTRIES) {
        fprintf(stderr, "bench_remote: %llu of %d entries published\n",
                (unsigned long long)st.remote_writes, ENTRIES);
        return 1;
    }
    double one[RUNS], eight[RUNS];
    for (int run = 0; run < RUNS; run++) {
        one[run] = fetch_round(1, 2 * run);
        eight[run] = fetch_round(READERS, 2 * run + 1);
    }
    double t1 = median(one, RUNS), t8 = median(eight, RUNS);
    double rate1 = ENTRIES / t1, rate8 = READERS * ENTRIES / t8;
    double mb = ENTRY_BYTES / 1e6;
    printf("remote tier %s, %d entries of %d KiB\n", kc_remote_url(w), ENTRIES, ENTRY_BYTES >> 10);
    printf("  publish (1 writer):   %8.0f entries/s\n", ENTRIES / publish);
    printf("  fetch, 1 reader:      %8.0f entries/s  %6.1f MB/s\n", rate1, rate1 * mb);
    printf("  fetch, %d readers:     %8.0f entries/s  %6.1f MB/s (all readers together)\n",
           READERS, rate8, rate8 * mb);
    double disk[RUNS], remote[RUNS];
    int nd = 0;
    if (demo) {
        /* a directory filled once; each remote run starts empty */
        if (demo_first_call(demo, "demo-seed", true) < 0 && demo_first_call(demo, "demo-seed", true) < 0)
            fprintf(stderr, "bench_remote: the demo did not run warm\n");
        for (int run = 0; run < RUNS; run++) {
            double d = demo_first_call(demo, "demo-seed", false);
            rm_dir("demo-empty");
            double r = demo_first_call(demo, "demo-empty", true);
            if (d < 0 || r < 0) break;
            disk[nd] = d, remote[nd] = r, nd++;
        }
        if (nd) {
            printf("  demo first call (MiniLM, warm): from disk %.1f ms, from the remote tier "
                   "%.1f ms (medians of %d, alternated)\n",
                   1e3 * median(disk, nd), 1e3 * median(remote, nd), nd);
        }
    }
    if (json) {
        FILE *f = fopen(json, "w");
        if (f) {
            fprintf(f, "{\"entries\":%d,\"entry_bytes\":%d,\"publish_per_s\":%.1f,"
                    "\"fetch_per_s_1\":%.1f,\"fetch_per_s_%d\":%.1f", ENTRIES, ENTRY_BYTES,
                    ENTRIES / publish, rate1, READERS, rate8);
            if (nd)
                fprintf(f, ",\"demo_first_call_disk_ms\":%.2f,\"demo_first_call_remote_ms\":%.2f",
                        1e3 * median(disk, nd), 1e3 * median(remote, nd));
            fprintf(f, "}\n");
            fclose(f);
        }
    }
    kc_close(w);
    free(payload);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    return system(cmd) == 0 ? 0 : 1;
}
