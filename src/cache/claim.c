/* claim.c - compiles in flight (cache.h): a claim is an exclusive flock
 * on a per-entry lock file in the disk tier, so it is seen by every
 * thread (each claim opens the file anew: flock locks belong to the open
 * file, not the process) and every process sharing the directory, and
 * the kernel drops it when its holder dies.  Lock files are empty and
 * stay (one per entry ever claimed); nothing reads them. */
#include "cache.h"

#include "eager.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void nap(double s) {
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

kc_claim_result kc_claim(kc_cache *c, const kc_key *key, const char *kind, double wait_s, int *fd) {
    if (fd) *fd = -1;
    if (!c || !key || !kind || !fd || !kc_on_disk(c) || !kc_dir(c)) return KC_CLAIM_NONE;
    char why[256] = "";
    int lf = kc_store_lock_file(kc_dir(c), key, kind, why, sizeof why);
    if (lf < 0) return KC_CLAIM_NONE; /* (a cache that cannot lock still works) */
    double until = now_s() + (wait_s > 0 ? wait_s : 0), pause = 0.001;
    for (;;) {
        if (flock(lf, LOCK_EX | LOCK_NB) == 0) {
            *fd = lf;
            return KC_CLAIM_OURS;
        }
        if (errno == EINTR) continue;
        bool busy = errno == EWOULDBLOCK;
        if (!busy || now_s() >= until) {
            close(lf);
            return busy ? KC_CLAIM_BUSY : KC_CLAIM_NONE; /* ENOLCK and the like: no claims here */
        }
        /* a compile takes tens of ms to seconds: polling at up to 20 ms
         * costs nothing next to it, and flock has no timed wait */
        nap(pause);
        pause = pause * 2 < 0.02 ? pause * 2 : 0.02;
    }
}

void kc_release(int fd) {
    if (fd < 0) return;
    (void)flock(fd, LOCK_UN);
    close(fd);
}

void kc_store_clear_locks(const char *root) {
    char *dir = root ? kc_strfmt("%s/v1/locks", root) : NULL;
    DIR *d = dir ? opendir(dir) : NULL;
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        /* one held stays; one opened by a claim just before the unlink
         * only costs that claim's kernel a second compile */
        if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0) (void)unlinkat(dirfd(d), de->d_name, 0);
        if (fd >= 0) close(fd);
    }
    if (d) closedir(d);
    em_free(dir);
}
