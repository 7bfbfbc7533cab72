/* prune.c - the disk tier's size limit: scans the entries, evicts the least
 * recently used (oldest header mtime) first, and clears the debris of
 * crashed writers (stale temporaries, payloads without a header). */
#include "cache.h"

#include "eager.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Temporary files older than this are debris of a crashed writer. */
#define KC_STALE_TMP_SECONDS 3600

typedef kc_item prune_item;
typedef kc_items prune_list;

static int item_cmp(const void *a, const void *b) {
    const prune_item *x = a, *y = b;
    if (x->t.tv_sec != y->t.tv_sec) return x->t.tv_sec < y->t.tv_sec ? -1 : 1;
    if (x->t.tv_nsec != y->t.tv_nsec) return x->t.tv_nsec < y->t.tv_nsec ? -1 : 1;
    return strcmp(x->payload, y->payload);
}

/* Parses "<32 hex>.<kind>" (the payload's name). */
static bool parse_entry_name(const char *name, size_t len, kc_key *k, char *kind) {
    char hex[KC_KEY_HEX_SIZE];
    if (len < 34 || len > 33 + KC_KIND_MAX || name[32] != '.') return false;
    memcpy(hex, name, 32);
    hex[32] = '\0';
    memcpy(kind, name + 33, len - 33);
    kind[len - 33] = '\0';
    return kc_key_from_hex(hex, k) && kc_kind_valid(kind);
}

static bool list_push(prune_list *l, const prune_item *it) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        prune_item *items = em_malloc(cap * sizeof *items);
        if (!items) return false;
        if (l->n) memcpy(items, l->items, l->n * sizeof *items);
        em_free(l->items);
        l->items = items;
        l->cap = cap;
    }
    l->items[l->n++] = *it;
    l->total += it->size;
    return true;
}

/* Adds the entries of one fan-out directory; removes stale temporaries. */
static bool scan_fan(const char *dir, prune_list *l) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT;
    int dfd = dirfd(d);
    time_t now = time(NULL);
    bool ok = true;
    struct dirent *de;
    while (ok && (de = readdir(d))) {
        const char *name = de->d_name;
        size_t len = strlen(name);
        struct stat st, pst;
        if (!strcmp(name, ".") || !strcmp(name, "..")) continue;
        if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        if (!strncmp(name, ".tmp-", 5)) {
            if (S_ISREG(st.st_mode) && now - st.st_mtime > KC_STALE_TMP_SECONDS)
                (void)unlinkat(dfd, name, 0);
            continue;
        }
        /* Whatever has an entry's name is listed, a directory or link too:
         * verify must see it (as bad) and remove must be able to take it. */
        bool is_meta = len > 5 && !strcmp(name + len - 5, ".meta");
        size_t plen = is_meta ? len - 5 : len;
        prune_item it;
        memset(&it, 0, sizeof it);
        if (!parse_entry_name(name, plen, &it.key, it.kind)) continue; /* not ours */
        it.size = (uint64_t)st.st_size;
        it.t = st.st_mtim;
        if (is_meta) {
            it.meta = kc_strfmt("%s/%s", dir, name);
            it.payload = kc_strfmt("%s/%.*s", dir, (int)plen, name);
            if (it.payload && lstat(it.payload, &pst) == 0) it.size += (uint64_t)pst.st_size;
        } else {
            /* Counted with its header, unless it has none (a writer died
             * between the two renames, or is between them now). */
            char *meta = kc_strfmt("%s/%s.meta", dir, name);
            bool has_meta = meta && lstat(meta, &pst) == 0;
            em_free(meta);
            if (has_meta) continue;
            it.payload = kc_strfmt("%s/%s", dir, name);
        }
        ok = it.payload && (!is_meta || it.meta) && list_push(l, &it);
        if (!ok) {
            em_free(it.meta);
            em_free(it.payload);
        }
    }
    closedir(d);
    return ok;
}

void kc_items_free(kc_items *l) {
    for (size_t i = 0; i < l->n; i++) {
        em_free(l->items[i].meta);
        em_free(l->items[i].payload);
    }
    em_free(l->items);
    memset(l, 0, sizeof *l);
}

bool kc_store_scan(const char *root, kc_items *l, char *why, size_t nwhy) {
    memset(l, 0, sizeof *l);
    if (nwhy) why[0] = '\0';
    char *v1 = kc_strfmt("%s/v1", root);
    bool ok = v1 != NULL;
    DIR *d = v1 ? opendir(v1) : NULL;
    if (v1 && !d) {
        snprintf(why, nwhy, "cannot list %s: %s", v1, strerror(errno));
        ok = false;
    }
    struct dirent *de;
    while (ok && d && (de = readdir(d))) {
        const char *n = de->d_name;
        bool fan = strlen(n) == 2 && strchr("0123456789abcdef", n[0]) &&
                   strchr("0123456789abcdef", n[1]);
        if (!fan) continue;
        char *sub = kc_strfmt("%s/%s", v1, n);
        ok = sub && scan_fan(sub, l);
        em_free(sub);
    }
    if (d) closedir(d);
    if (!ok && !why[0]) snprintf(why, nwhy, "out of memory listing the cache");
    em_free(v1);
    if (ok && l->n) qsort(l->items, l->n, sizeof *l->items, item_cmp); /* no NULL to qsort (UBSan) */
    else kc_items_free(l);
    return ok;
}

bool kc_store_prune(const char *root, uint64_t max_bytes, const kc_key *keep,
                    const char *keep_kind, kc_forget_fn forget, void *ud, uint64_t *evicted,
                    uint64_t *total, char *why, size_t nwhy) {
    *evicted = 0;
    *total = 0;
    prune_list l;
    if (!kc_store_scan(root, &l, why, nwhy)) return false;
    for (size_t i = 0; i < l.n && l.total > max_bytes; i++) {
        prune_item *it = &l.items[i];
        if (keep && kc_key_equal(&it->key, keep) && !strcmp(it->kind, keep_kind)) continue;
        if (!kc_item_remove(it)) continue; /* still there: still counted */
        l.total -= it->size;
        (*evicted)++;
        if (forget) forget(ud, &it->key, it->kind);
    }
    *total = l.total;
    kc_items_free(&l);
    return true;
}

/* Removes the tree under the open directory dfd (depth levels left). */
static bool remove_tree_at(int dfd, int depth) {
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return false;
    }
    bool ok = true;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..")) continue;
        if (unlinkat(dirfd(d), n, 0) == 0 || errno == ENOENT) continue;
        if (errno != EISDIR && errno != EPERM) {
            ok = false;
            continue;
        }
        int sub = depth > 0 ? openat(dirfd(d), n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
        if (sub < 0 || !remove_tree_at(sub, depth - 1) || unlinkat(dirfd(d), n, AT_REMOVEDIR) != 0)
            ok = false;
    }
    closedir(d);
    return ok;
}

bool kc_remove_path(const char *path) {
    if (unlink(path) == 0 || errno == ENOENT) return true;
    if (errno != EISDIR && errno != EPERM) return false;
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) return false;
    /* A directory at an entry's name is damage: the tree goes with it. */
    if (!remove_tree_at(dfd, 16)) return false;
    return rmdir(path) == 0 || errno == ENOENT;
}

bool kc_item_remove(const kc_item *it) {
    /* Header first: without it the entry is a plain miss. */
    bool ok = !it->meta || kc_remove_path(it->meta);
    return kc_remove_path(it->payload) && ok;
}
