/* worker.c - ember-jit-worker: compiles kernels to shared objects in its
 * own process, one after the other, for as long as its parent feeds it.
 *
 * libgccjit serializes compiles within a process (a global lock), so the
 * cpu backend compiles a graph's kernels in parallel by handing them to
 * these workers (worker_pool.c), which it keeps between compiles.
 * Protocol (from the same build of Ember): on stdin, records written by
 * jit_worker_write (a compile unit: its kernels in binary kir, each with
 * its output path), one at a time; on stdout, one byte per record: '+'
 * when the unit's shared object is written at every path, '-' when the
 * compiler reported an error (the message on stderr; the next record is
 * read as usual).  At end of input it exits 0; on a malformed record, 2. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_gccjit.h"
#include "worker.h"

/* Exits once nothing holds the write end of stdin: the parent process is
 * gone (exited, or killed by any signal), so nobody wants what we
 * compile.  poll with no events asked reports only the hang-up and
 * consumes nothing.  (PR_SET_PDEATHSIG would fire when the parent's
 * spawning thread exits, while the parent still uses us.) */
static void *watch_parent(void *arg) {
    (void)arg;
    for (;;) {
        struct pollfd p = {0, 0, 0};
        if (poll(&p, 1, -1) > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL))) _exit(3);
    }
    return NULL;
}

/* Copies the file at from to the file at to (replacing its contents). */
static bool copy_file(const char *from, const char *to) {
    int in = open(from, O_RDONLY | O_CLOEXEC), out = open(to, O_WRONLY | O_TRUNC | O_CLOEXEC);
    bool ok = in >= 0 && out >= 0;
    char buf[65536];
    for (ssize_t r; ok && (r = read(in, buf, sizeof buf)) != 0;) {
        if (r < 0 && errno == EINTR) continue;
        ok = r > 0;
        for (ssize_t w = 0; ok && w < r;) {
            ssize_t d = write(out, buf + w, (size_t)(r - w));
            if (d < 0 && errno == EINTR) continue;
            ok = d > 0;
            w += d;
        }
    }
    if (in >= 0) close(in);
    if (out >= 0 && close(out) != 0) ok = false;
    return ok;
}

/* Compiles unit u into its first path and copies it to the others. */
static em_status compile_unit(const jit_worker_unit *u) {
    em_status s = jit_cpu_write_unit(u->ks, u->n, u->paths[0]);
    for (int i = 1; s == EM_OK && i < u->n; i++)
        if (!copy_file(u->paths[0], u->paths[i]))
            s = em_error(EM_ERR_IO, "cannot copy the unit's object to %s: %s", u->paths[i], strerror(errno));
    return s;
}

static bool answer(char c) {
    for (;;) {
        ssize_t r = write(1, &c, 1);
        if (r == 1) return true;
        if (r < 0 && errno == EINTR) continue;
        return false;
    }
}

int main(void) {
    pthread_t t;
    sigset_t all, old;
    sigfillset(&all); /* the watcher takes no signal of ours */
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&t, NULL, watch_parent, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        fprintf(stderr, "ember-jit-worker: cannot start its watcher thread\n");
        return 1;
    }
    /* the compiler's own children (as, collect2) must not hold our answer
     * pipe open after we exit */
    fcntl(1, F_SETFD, FD_CLOEXEC);
    int c;
    while ((c = getc(stdin)) != EOF) {
        ungetc(c, stdin);
        jit_worker_unit u;
        if (!jit_worker_read(stdin, &u)) {
            fprintf(stderr, "ember-jit-worker: %s\n", em_last_error());
            return 2;
        }
        em_status s = compile_unit(&u);
        jit_worker_unit_free(&u);
        if (s != EM_OK) fprintf(stderr, "ember-jit-worker: %s\n", em_last_error());
        em_clear_error();
        if (!answer(s == EM_OK ? '+' : '-')) break;
    }
    /* no destructors: the libraries' (OpenBLAS's joins its threads) have
     * nothing to save, and one can hang under a memory limit */
    fflush(stderr);
    _exit(0);
}
