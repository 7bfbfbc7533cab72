/* store.c - the disk tier: directory setup and trust checks, entry paths,
 * the header format, verified reads and atomic writes (prune.c evicts).
 *
 * Nothing here keeps state: each function gets the cache directory and
 * reports failures as a reason string (why, nwhy) for the caller to warn
 * with.  Reasons are messages: a long path in one may be truncated. */
#include "cache.h"

#include "eager.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void set_why(char *why, size_t nwhy, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_why(char *why, size_t nwhy, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, nwhy, fmt, ap);
    va_end(ap);
}

char *kc_strfmt(const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *s = n < 0 ? NULL : em_malloc((size_t)n + 1);
    if (s) vsnprintf(s, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    return s;
}

bool kc_kind_valid(const char *kind) {
    size_t n = 0;
    for (; kind[n]; n++) {
        char ch = kind[n];
        if (n >= KC_KIND_MAX) return false;
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_')) return false;
    }
    return n > 0;
}

/* ---- trust ---- */

/* Ours and writable only by us: what every directory and entry must be. */
static bool trusted(const struct stat *st, const char *what, const char *path, char *why,
                    size_t nwhy) {
    if (st->st_uid != geteuid()) {
        set_why(why, nwhy, "refusing %s %s: owned by uid %u, not by this user (uid %u)", what,
                path, (unsigned)st->st_uid, (unsigned)geteuid());
        return false;
    }
    if (st->st_mode & (S_IWGRP | S_IWOTH)) {
        set_why(why, nwhy, "refusing %s %s: writable by group or others (mode %04o; "
                "chmod go-w fixes it)", what, path, (unsigned)(st->st_mode & 07777));
        return false;
    }
    return true;
}

/* lstat: a directory of the layout that is a symbolic link could point
 * anywhere, so it is refused like an untrusted one. */
static bool trusted_dir(const char *path, char *why, size_t nwhy) {
    struct stat st;
    if (lstat(path, &st) != 0) {
        set_why(why, nwhy, "cannot use cache directory %s: %s", path, strerror(errno));
        return false;
    }
    if (!S_ISDIR(st.st_mode)) {
        set_why(why, nwhy, "cannot use cache directory %s: not a directory%s", path,
                S_ISLNK(st.st_mode) ? " (a symbolic link)" : "");
        return false;
    }
    return trusted(&st, "cache directory", path, why, nwhy);
}

/* Checks every directory from root down to the fan-out directory of k
 * (root, v1, the fan-out one), in that order: each is ours and writable
 * only by us, so once it passes nobody else can change what lies in it,
 * and the entry files opened next are the ones the checks covered.
 * KC_READ_ABSENT when the fan-out directory does not exist (a plain
 * miss), KC_READ_REFUSED with why otherwise. */
static kc_read entry_dirs(const char *root, const kc_key *k, char *why, size_t nwhy) {
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(k, hex);
    char *v1 = kc_strfmt("%s/v1", root);
    char *fan = kc_strfmt("%s/v1/%.2s", root, hex);
    kc_read r = KC_READ_OK;
    struct stat st;
    if (!v1 || !fan) {
        set_why(why, nwhy, "out of memory");
        r = KC_READ_NOMEM;
    } else if (lstat(fan, &st) != 0 && errno == ENOENT) {
        r = KC_READ_ABSENT; /* nothing there to trust or load */
    } else if (!trusted_dir(root, why, nwhy) || !trusted_dir(v1, why, nwhy) ||
             !trusted_dir(fan, why, nwhy)) {
        r = KC_READ_REFUSED;
    }
    em_free(v1);
    em_free(fan);
    return r;
}

/* mkdir with mode 0700 exactly (the umask could narrow it); an existing
 * directory is fine: the caller checks it. */
static bool make_dir(const char *path, char *why, size_t nwhy) {
    if (mkdir(path, 0700) == 0) {
        if (chmod(path, 0700) == 0) return true;
    } else if (errno == EEXIST) {
        return true;
    }
    set_why(why, nwhy, "cannot create cache directory %s: %s", path, strerror(errno));
    return false;
}

/* mkdir -p: only the parts we create get 0700; existing parents are left
 * as they are. */
static bool make_dirs(const char *dir, char *why, size_t nwhy) {
    char *p = kc_strfmt("%s", dir);
    if (!p) {
        set_why(why, nwhy, "out of memory");
        return false;
    }
    bool ok = true;
    for (char *s = p + 1; *s && ok; s++) {
        if (*s != '/') continue;
        *s = '\0';
        ok = make_dir(p, why, nwhy);
        *s = '/';
    }
    if (ok) ok = make_dir(p, why, nwhy);
    em_free(p);
    return ok;
}

bool kc_store_open(const char *dir, char **root, char *why, size_t nwhy) {
    *root = NULL;
    if (!make_dirs(dir, why, nwhy)) return false;
    /* Absolute, so that paths handed out stay valid if the cwd changes. */
    char *abs = realpath(dir, NULL); /* libc's malloc: copied and freed below */
    if (!abs) {
        set_why(why, nwhy, "cannot use cache directory %s: %s", dir, strerror(errno));
        return false;
    }
    char *r = kc_strfmt("%s", abs);
    char *v1 = kc_strfmt("%s/v1", abs);
    free(abs);
    bool ok = r && v1;
    if (!ok) set_why(why, nwhy, "out of memory");
    if (ok) ok = trusted_dir(r, why, nwhy);
    if (ok && faccessat(AT_FDCWD, r, W_OK | X_OK, AT_EACCESS) != 0) {
        set_why(why, nwhy, "cannot write to cache directory %s: %s", r, strerror(errno));
        ok = false;
    }
    if (ok) ok = make_dir(v1, why, nwhy) && trusted_dir(v1, why, nwhy);
    em_free(v1);
    if (!ok) {
        em_free(r);
        return false;
    }
    *root = r;
    return true;
}

/* ---- paths ---- */

char *kc_store_path(const char *root, const kc_key *k, const char *kind, bool meta) {
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(k, hex);
    return kc_strfmt("%s/v1/%.2s/%s.%s%s", root, hex, hex, kind, meta ? ".meta" : "");
}

/* The fan-out directory of k, created if needed and checked, with every
 * directory above it up to root. */
static char *fan_dir(const char *root, const kc_key *k, char *why, size_t nwhy) {
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(k, hex);
    char *v1 = kc_strfmt("%s/v1", root);
    char *d = kc_strfmt("%s/v1/%.2s", root, hex);
    bool ok = v1 && d;
    if (!ok) set_why(why, nwhy, "out of memory");
    /* v1 is made again in case someone removed it since kc_open. */
    if (ok) ok = make_dir(v1, why, nwhy) && make_dir(d, why, nwhy) &&
                 entry_dirs(root, k, why, nwhy) == KC_READ_OK;
    em_free(v1);
    if (!ok) {
        em_free(d);
        return NULL;
    }
    return d;
}

/* ---- the header ---- */

static void hex16(const uint8_t b[16], char out[KC_KEY_HEX_SIZE]) {
    kc_key k;
    memcpy(k.bytes, b, 16);
    kc_key_hex(&k, out);
}

size_t kc_meta_format(const kc_meta *m, char *buf) {
    char key[KC_KEY_HEX_SIZE], sum[KC_KEY_HEX_SIZE];
    hex16(m->key.bytes, key);
    hex16(m->sum.bytes, sum);
    int n = snprintf(buf, KC_META_MAX,
                     "ember-cache %" PRIu32 "\nkey %s\nkind %s\nsize %" PRIu64
                     "\nxxh3-128 %s\ncreated %" PRId64 "\n",
                     m->version, key, m->kind, m->size, sum, m->created);
    return n < 0 ? 0 : (size_t)n;
}

bool kc_meta_parse(const char *text, size_t n, kc_meta *m) {
    char buf[KC_META_MAX];
    if (n == 0 || n >= sizeof buf) return false;
    memcpy(buf, text, n);
    buf[n] = '\0';
    if (strlen(buf) != n) return false; /* a NUL inside */
    char key[KC_KEY_HEX_SIZE], sum[KC_KEY_HEX_SIZE];
    kc_meta p;
    memset(&p, 0, sizeof p);
    if (sscanf(buf,
               "ember-cache %" SCNu32 " key %32[0-9a-f] kind %15[a-z0-9_] size %" SCNu64
               " xxh3-128 %32[0-9a-f] created %" SCNd64,
               &p.version, key, p.kind, &p.size, sum, &p.created) != 6)
        return false;
    kc_key s;
    if (!kc_key_from_hex(key, &p.key) || !kc_key_from_hex(sum, &s)) return false;
    memcpy(p.sum.bytes, s.bytes, 16);
    /* Canonical form only: sscanf skips any whitespace, accepts signs... */
    char again[KC_META_MAX];
    if (kc_meta_format(&p, again) != n || memcmp(again, buf, n) != 0) return false;
    *m = p;
    return true;
}

/* ---- reading ---- */

/* Reads up to n bytes; the count read, or -1. */
static ssize_t read_full(int fd, void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* Opens an entry file for reading and checks it; -1 with *res set when it
 * is absent, unusable (CORRUPT) or untrusted (REFUSED).  O_NONBLOCK: a FIFO
 * planted at the path must not hang the open. */
static int open_entry(const char *path, struct stat *st, kc_read *res, char *why, size_t nwhy) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT) {
            *res = KC_READ_ABSENT;
        } else if (errno == ELOOP) {
            *res = KC_READ_REFUSED;
            set_why(why, nwhy, "refusing cache entry %s: a symbolic link", path);
        } else {
            *res = KC_READ_CORRUPT;
            set_why(why, nwhy, "cannot read cache entry %s: %s", path, strerror(errno));
        }
        return -1;
    }
    if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
        *res = KC_READ_CORRUPT;
        set_why(why, nwhy, "cache entry %s is not a regular file", path);
    } else if (!trusted(st, "cache entry", path, why, nwhy)) {
        *res = KC_READ_REFUSED;
    } else {
        return fd;
    }
    close(fd);
    return -1;
}

/* Reads the payload of size bytes from fd whole into a new buffer (*data)
 * or through sink (-1: nowhere), checksumming what was read into *got. */
static kc_read payload_read(int fd, const char *path, uint64_t size, void **data, int sink,
                            kc_sum *got, char *why, size_t nwhy) {
    uint64_t n = 0;
    errno = 0;
    if (!data) {
        if (kc_checksum_copy(fd, sink, got, &n) && n == size) return KC_READ_OK;
        set_why(why, nwhy, "cannot read cache entry %s: %s", path,
                errno ? strerror(errno) : "its size changed while reading");
        return KC_READ_CORRUPT;
    }
    char *buf = em_malloc(size ? (size_t)size : 1);
    if (!buf) return KC_READ_NOMEM;
    if (read_full(fd, buf, (size_t)size) != (ssize_t)size) {
        set_why(why, nwhy, "cannot read cache entry %s: %s", path,
                errno ? strerror(errno) : "short read");
        em_free(buf);
        return KC_READ_CORRUPT;
    }
    *got = kc_checksum(buf, (size_t)size);
    *data = buf;
    return KC_READ_OK;
}

/* kc_file_read's work: data (a buffer) or sink (a descriptor) or neither. */
static kc_read file_read(const char *path, uint64_t size, const kc_sum *sum, void **data,
                         int sink, char *why, size_t nwhy) {
    struct stat st;
    kc_read res = KC_READ_OK;
    int fd = open_entry(path, &st, &res, why, nwhy);
    if (fd < 0) {
        if (res == KC_READ_ABSENT) {
            set_why(why, nwhy, "cache entry %s: header without payload", path);
            res = KC_READ_CORRUPT;
        }
        return res;
    }
    kc_sum got;
    if ((uint64_t)st.st_size != size || size > (uint64_t)PTRDIFF_MAX) {
        set_why(why, nwhy, "cache entry %s: %lld bytes, its header says %" PRIu64
                " (truncated or replaced)", path, (long long)st.st_size, size);
        res = KC_READ_CORRUPT;
    } else {
        res = payload_read(fd, path, size, data, sink, &got, why, nwhy);
    }
    if (res == KC_READ_OK && memcmp(got.bytes, sum->bytes, sizeof got.bytes) != 0) {
        set_why(why, nwhy, "cache entry %s: checksum mismatch", path);
        res = KC_READ_CORRUPT;
        if (data) {
            em_free(*data);
            *data = NULL;
        }
    }
    close(fd);
    return res;
}

kc_read kc_file_read(const char *path, uint64_t size, const kc_sum *sum, void **data,
                     char *why, size_t nwhy) {
    return file_read(path, size, sum, data, -1, why, nwhy);
}

kc_read kc_file_read_to(const char *path, uint64_t size, const kc_sum *sum, int sink,
                        char *why, size_t nwhy) {
    return file_read(path, size, sum, NULL, sink, why, nwhy);
}

/* Reads and checks an entry's header (fd open on it) for (k, kind). */
static kc_read header_read(int fd, const char *mpath, const kc_key *k, const char *kind,
                           kc_meta *m, char *why, size_t nwhy) {
    char text[KC_META_MAX];
    ssize_t n = read_full(fd, text, sizeof text);
    if (n < 0 || !kc_meta_parse(text, (size_t)n, m) || m->version != KC_FORMAT_VERSION) {
        set_why(why, nwhy, "cache entry %s: not an Ember cache header of format %u", mpath,
                KC_FORMAT_VERSION);
        return KC_READ_CORRUPT;
    }
    if (!kc_key_equal(&m->key, k) || strcmp(m->kind, kind) != 0) {
        set_why(why, nwhy, "cache entry %s: the header of another entry", mpath);
        return KC_READ_CORRUPT;
    }
    return KC_READ_OK;
}

/* The directories, then the header, then the payload (into data, sink or
 * nowhere): the order the trust model needs (docs/cache.md, Trust). */
static kc_read store_read(const char *root, const kc_key *k, const char *kind, void **data,
                          int sink, kc_meta *m, char *why, size_t nwhy) {
    if (data) *data = NULL;
    kc_read res = entry_dirs(root, k, why, nwhy);
    if (res != KC_READ_OK) return res;
    char *mpath = kc_store_path(root, k, kind, true);
    char *ppath = kc_store_path(root, k, kind, false);
    int fd = -1;
    struct stat st;
    if (!mpath || !ppath) res = KC_READ_NOMEM;
    else fd = open_entry(mpath, &st, &res, why, nwhy);
    if (fd >= 0) res = header_read(fd, mpath, k, kind, m, why, nwhy);
    if (fd >= 0 && res == KC_READ_OK) res = file_read(ppath, m->size, &m->sum, data, sink, why, nwhy);
    /* The header's mtime is the entry's last use, for kc_prune. */
    if (fd >= 0 && res == KC_READ_OK) (void)futimens(fd, NULL);
    if (fd >= 0) close(fd);
    em_free(mpath);
    em_free(ppath);
    return res;
}

kc_read kc_store_read(const char *root, const kc_key *k, const char *kind, void **data,
                      kc_meta *m, char *why, size_t nwhy) {
    return store_read(root, k, kind, data, -1, m, why, nwhy);
}

kc_read kc_store_read_to(const char *root, const kc_key *k, const char *kind, int sink,
                         kc_meta *m, char *why, size_t nwhy) {
    return store_read(root, k, kind, NULL, sink, m, why, nwhy);
}

/* ---- memory files: what code is loaded from ---- */

int kc_memfd_new(const char *name, char *why, size_t nwhy) {
    unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
#ifdef MFD_EXEC
    /* kernels with vm.memfd_noexec set want executable memory files asked
     * for; older kernels reject the flag (EINVAL) */
    int fd = memfd_create(name, flags | MFD_EXEC);
    if (fd < 0 && errno == EINVAL) fd = memfd_create(name, flags);
#else
    int fd = memfd_create(name, flags);
#endif
    if (fd < 0) set_why(why, nwhy, "cannot make a memory file to load from: %s", strerror(errno));
    return fd;
}

bool kc_memfd_seal(int fd, char *why, size_t nwhy) {
    int seals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;
    if (fcntl(fd, F_ADD_SEALS, seals) != 0 || lseek(fd, 0, SEEK_SET) != 0) {
        set_why(why, nwhy, "cannot seal a memory file: %s", strerror(errno));
        return false;
    }
    return true;
}

/* ---- writing ---- */

/* A new temporary file in dir (mode 0600, from mkstemp): its fd, its path
 * in *tmp (em_malloc'd); -1 on failure. */
static int make_tmp(const char *dir, char **tmp, char *why, size_t nwhy) {
    *tmp = kc_strfmt("%s/.tmp-XXXXXX", dir);
    if (!*tmp) {
        set_why(why, nwhy, "out of memory");
        return -1;
    }
    int fd = mkostemp(*tmp, O_CLOEXEC);
    if (fd < 0) {
        set_why(why, nwhy, "cannot create a file in %s: %s", dir, strerror(errno));
        em_free(*tmp);
        *tmp = NULL;
    }
    return fd;
}

/* fsync (when sync) and close fd (holding tmp); removes tmp on failure.
 * ok says whether the caller's writes succeeded. */
static bool finish_tmp(int fd, const char *tmp, bool ok, bool sync, char *why, size_t nwhy) {
    if (!ok) set_why(why, nwhy, "cannot write %s: %s", tmp, strerror(errno));
    if (ok && sync && fsync(fd) != 0) {
        set_why(why, nwhy, "cannot sync %s: %s", tmp, strerror(errno));
        ok = false;
    }
    if (close(fd) != 0 && ok) {
        set_why(why, nwhy, "cannot write %s: %s", tmp, strerror(errno));
        ok = false;
    }
    if (!ok) (void)unlink(tmp);
    return ok;
}

/* Renames tmp over dir/name.  Something that is not a file at that name
 * (a directory left by damage) cannot be renamed over: it is removed and
 * the rename tried again, so a damaged entry is replaced like any other. */
static bool rename_over(const char *tmp, const char *dir, const char *name, char *why,
                        size_t nwhy) {
    char *dst = kc_strfmt("%s/%s", dir, name);
    if (!dst) {
        set_why(why, nwhy, "out of memory");
        return false;
    }
    bool ok = rename(tmp, dst) == 0;
    if (!ok && (errno == EISDIR || errno == ENOTEMPTY || errno == EEXIST) && kc_remove_path(dst))
        ok = rename(tmp, dst) == 0;
    if (!ok) set_why(why, nwhy, "cannot rename %s to %s: %s", tmp, dst, strerror(errno));
    em_free(dst);
    return ok;
}

/* fsync and close fd (holding tmp), then rename tmp to dir/name; removes tmp
 * on failure.  Frees tmp. */
static bool commit_tmp(int fd, char *tmp, const char *dir, const char *name, bool ok,
                       char *why, size_t nwhy) {
    ok = finish_tmp(fd, tmp, ok, true, why, nwhy) && rename_over(tmp, dir, name, why, nwhy);
    if (!ok) (void)unlink(tmp);
    em_free(tmp);
    return ok;
}

int kc_store_lock_file(const char *root, const kc_key *k, const char *kind, char *why,
                       size_t nwhy) {
    char hex[KC_KEY_HEX_SIZE];
    kc_key_hex(k, hex);
    char *v1 = kc_strfmt("%s/v1", root);
    char *dir = kc_strfmt("%s/v1/locks", root);
    char *path = kc_strfmt("%s/v1/locks/%s.%s.lock", root, hex, kind);
    int fd = -1;
    if (!v1 || !dir || !path) set_why(why, nwhy, "out of memory");
    else if (make_dir(v1, why, nwhy) && make_dir(dir, why, nwhy) && trusted_dir(root, why, nwhy) &&
             trusted_dir(v1, why, nwhy) && trusted_dir(dir, why, nwhy))
        fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    struct stat st;
    if (fd < 0 && path && (!nwhy || !why[0]))
        set_why(why, nwhy, "cannot open %s: %s", path, strerror(errno));
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
                    !trusted(&st, "lock file", path, why, nwhy))) {
        close(fd);
        fd = -1;
    }
    em_free(v1);
    em_free(dir);
    em_free(path);
    return fd;
}

bool kc_write_file(const char *dir, const char *name, const void *data, size_t n, char *why,
                   size_t nwhy) {
    char *tmp;
    int fd = make_tmp(dir, &tmp, why, nwhy);
    if (fd < 0) return false;
    return commit_tmp(fd, tmp, dir, name, kc_write_all(fd, data, n), why, nwhy);
}

/* Copies fd's whole content to out. */
static bool copy_fd(int fd, int out) {
    if (lseek(fd, 0, SEEK_SET) != 0) return false;
    char buf[16384];
    for (;;) {
        ssize_t r = read(fd, buf, sizeof buf);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return false;
        if (r == 0) return true;
        if (!kc_write_all(out, buf, (size_t)r)) return false;
    }
}

/* Puts the content of fd (the file at src) into a new temporary file in
 * dir, *tmp its path: src itself renamed there when it can be (one link,
 * same file system), else a copy (src is then removed).  Nothing is at
 * the entry's name yet. */
static bool tmp_from_file(int fd, const char *src, const char *dir, char **tmp, char *why,
                          size_t nwhy) {
    int out = make_tmp(dir, tmp, why, nwhy);
    if (out < 0) return false;
    struct stat st;
    /* Entries are 0600 whatever the producer's umask made; a file with other
     * links could still be changed through them, so it is copied. */
    bool can_rename = fstat(fd, &st) == 0 && st.st_nlink == 1 && fchmod(fd, 0600) == 0;
    if (can_rename && rename(src, *tmp) == 0) {
        close(out);
        return true;
    }
    /* Another file system (EXDEV), or src gone already (a failed earlier
     * move): copy from the open descriptor. */
    if (!finish_tmp(out, *tmp, copy_fd(fd, out), false, why, nwhy)) {
        em_free(*tmp);
        *tmp = NULL;
        return false;
    }
    (void)unlink(src);
    return true;
}

bool kc_move_file(int fd, const char *src, const char *dir, const char *name, char *why,
                  size_t nwhy) {
    char *tmp;
    if (!tmp_from_file(fd, src, dir, &tmp, why, nwhy)) return false;
    bool ok = rename_over(tmp, dir, name, why, nwhy);
    if (!ok) (void)unlink(tmp);
    em_free(tmp);
    return ok;
}

/* Writes n bytes to a new temporary file in dir (not synced: kc_put): its
 * path in *tmp. */
static bool tmp_from_bytes(const char *dir, const void *data, size_t n, char **tmp, char *why,
                           size_t nwhy) {
    int fd = make_tmp(dir, tmp, why, nwhy);
    if (fd < 0) return false;
    if (finish_tmp(fd, *tmp, kc_write_all(fd, data, n), false, why, nwhy)) return true;
    em_free(*tmp);
    *tmp = NULL;
    return false;
}

/* Both files are written to temporaries before either is renamed into
 * place, payload first, then header: a full disk (ENOSPC,
 * EFBIG) fails while writing a temporary, which is removed, and leaves
 * the entry as it was; it never leaves a new payload without its header.
 * A reader that sees the new header sees the new payload. */
static bool store_entry(const char *root, const kc_meta *m, const void *data, int fd,
                        const char *src, char *why, size_t nwhy) {
    char *dir = fan_dir(root, &m->key, why, nwhy);
    if (!dir) return false;
    char hex[KC_KEY_HEX_SIZE], text[KC_META_MAX];
    kc_key_hex(&m->key, hex);
    size_t tn = kc_meta_format(m, text);
    char *name = kc_strfmt("%s.%s", hex, m->kind);
    char *mname = kc_strfmt("%s.%s.meta", hex, m->kind);
    char *ptmp = NULL, *mtmp = NULL;
    bool ok = name && mname;
    if (!ok) set_why(why, nwhy, "out of memory");
    if (ok) ok = src ? tmp_from_file(fd, src, dir, &ptmp, why, nwhy)
                     : tmp_from_bytes(dir, data, (size_t)m->size, &ptmp, why, nwhy);
    if (ok) ok = tmp_from_bytes(dir, text, tn, &mtmp, why, nwhy);
    bool placed = ok && rename_over(ptmp, dir, name, why, nwhy);
    if (placed) {
        em_free(ptmp); /* renamed: the name may be another writer's by now */
        ptmp = NULL;
        if (rename_over(mtmp, dir, mname, why, nwhy)) {
            em_free(mtmp);
            mtmp = NULL;
        } else {
            char *p = kc_strfmt("%s/%s", dir, name);
            if (p) (void)unlink(p); /* no payload without its header */
            em_free(p);
            placed = false;
        }
    }
    if (ptmp) (void)unlink(ptmp);
    if (mtmp) (void)unlink(mtmp);
    em_free(ptmp);
    em_free(mtmp);
    em_free(name);
    em_free(mname);
    em_free(dir);
    return placed;
}

bool kc_store_write(const char *root, const kc_meta *m, const void *data, char *why, size_t nwhy) {
    return store_entry(root, m, data, -1, NULL, why, nwhy);
}

bool kc_store_move(const char *root, const kc_meta *m, int fd, const char *src, char *why,
                   size_t nwhy) {
    return store_entry(root, m, NULL, fd, src, why, nwhy);
}
