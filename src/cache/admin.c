/* admin.c - what the ember-cache tool does to a cache directory: list,
 * verify, remove, prune by age, clear, and portable bundles (export and
 * import).  These work on the disk tier of an open cache (kc_dir), so the
 * directory has passed the same trust checks as at run time. */
#include "cache.h"

#include "eager.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *root_of(kc_cache *c, const char *fn) {
    const char *root = c && kc_on_disk(c) ? kc_dir(c) : NULL;
    if (!c) em_error(EM_ERR_NULL, "%s: the cache is NULL", fn);
    else if (!root) em_error(EM_ERR_STATE, "%s: the cache has no usable directory", fn);
    return root;
}

static em_status scan(kc_cache *c, const char *fn, kc_items *l) {
    const char *root = root_of(c, fn);
    if (!root) return em_last_status();
    char why[512];
    if (!kc_store_scan(root, l, why, sizeof why))
        return em_error(em_last_status() == EM_ERR_NOMEM ? EM_ERR_NOMEM : EM_ERR_IO, "%s: %s", fn,
                        why);
    return EM_OK;
}

/* Reads an entry's header, for listing (no verification of the payload). */
static bool read_meta(const kc_item *it, kc_meta *m) {
    if (!it->meta) return false;
    int fd = open(it->meta, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return false;
    char text[KC_META_MAX];
    ssize_t n = read(fd, text, sizeof text);
    close(fd);
    return n > 0 && kc_meta_parse(text, (size_t)n, m) && kc_key_equal(&m->key, &it->key) &&
           !strcmp(m->kind, it->kind);
}

em_status kc_list(kc_cache *c, kc_entry_info **out, size_t *n) {
    if (!out || !n) return em_error(EM_ERR_NULL, "kc_list: out is NULL");
    *out = NULL;
    *n = 0;
    kc_items l;
    em_status s = scan(c, "kc_list", &l);
    if (s != EM_OK) return s;
    kc_entry_info *e = em_calloc(l.n + 1, sizeof *e);
    if (!e) {
        kc_items_free(&l);
        return em_last_status();
    }
    for (size_t i = 0; i < l.n; i++) {
        const kc_item *it = &l.items[i];
        kc_meta m;
        e[i].key = it->key;
        memcpy(e[i].kind, it->kind, sizeof e[i].kind);
        e[i].disk_bytes = it->size;
        e[i].last_use = it->t.tv_sec;
        e[i].has_header = it->meta != NULL;
        if (read_meta(it, &m)) {
            e[i].size = m.size;
            e[i].created = m.created;
        }
    }
    *out = e;
    *n = l.n;
    kc_items_free(&l);
    return EM_OK;
}

kc_read kc_verify(kc_cache *c, const kc_entry_info *e, char *why, size_t nwhy) {
    if (nwhy) why[0] = '\0';
    const char *root = root_of(c, "kc_verify");
    if (!root || !e) return KC_READ_NOMEM;
    if (!e->has_header) {
        snprintf(why, nwhy, "a payload without its header (a writer died mid-way)");
        return KC_READ_CORRUPT;
    }
    /* kc_store_read marks a good entry used; verifying is not a use */
    char *mpath = kc_store_path(root, &e->key, e->kind, true);
    struct stat st;
    bool have_time = mpath && lstat(mpath, &st) == 0;
    kc_meta m;
    kc_read r = kc_store_read(root, &e->key, e->kind, NULL, &m, why, nwhy);
    if (have_time && r == KC_READ_OK) {
        struct timespec t[2] = {st.st_atim, st.st_mtim};
        (void)utimensat(AT_FDCWD, mpath, t, AT_SYMLINK_NOFOLLOW);
    }
    if (r == KC_READ_ABSENT) {
        snprintf(why, nwhy, "the entry disappeared while checking it");
        r = KC_READ_CORRUPT;
    }
    em_free(mpath);
    return r;
}

em_status kc_remove(kc_cache *c, const kc_key *k, const char *kind) {
    const char *root = root_of(c, "kc_remove");
    if (!root) return em_last_status();
    if (!k || !kind) return em_error(EM_ERR_NULL, "kc_remove: key or kind is NULL");
    kc_item it = {.meta = kc_store_path(root, k, kind, true),
                  .payload = kc_store_path(root, k, kind, false)};
    em_status s = it.meta && it.payload ? EM_OK : em_last_status();
    /* Honest: an entry that stays (a directory that cannot go, no
     * permission) is an error, so "all removed" means removed. */
    if (s == EM_OK && !kc_item_remove(&it))
        s = em_error(EM_ERR_IO, "kc_remove: cannot remove %s: %s", it.payload, strerror(errno));
    em_free(it.meta);
    em_free(it.payload);
    return s;
}

/* Removes the entries last used before cutoff (all when cutoff is
 * INT64_MAX). */
static em_status remove_before(kc_cache *c, const char *fn, int64_t cutoff, uint64_t *removed) {
    if (removed) *removed = 0;
    kc_items l;
    em_status s = scan(c, fn, &l);
    if (s != EM_OK) return s;
    for (size_t i = 0; i < l.n; i++) {
        if (cutoff != INT64_MAX && l.items[i].t.tv_sec >= cutoff) continue;
        if (kc_item_remove(&l.items[i]) && removed) (*removed)++;
    }
    kc_items_free(&l);
    return EM_OK;
}

em_status kc_prune_older(kc_cache *c, int64_t max_age, uint64_t *removed) {
    if (max_age < 0) return em_error(EM_ERR_ARG, "kc_prune_older: negative age %" PRId64, max_age);
    return remove_before(c, "kc_prune_older", (int64_t)time(NULL) - max_age, removed);
}

em_status kc_clear(kc_cache *c, uint64_t *removed) {
    return remove_before(c, "kc_clear", INT64_MAX, removed);
}

/* ---- bundles ----
 *
 *   ember-bundle 1
 *   tag <name>=<value>          (the versions the artifacts were made for)
 *   entry <32 hex key> <kind> <size> <32 hex xxh3-128>
 *   <size bytes>
 *   ...
 *   end <entries>
 */

static bool write_entry(FILE *f, const kc_entry_info *e, const void *data, size_t n) {
    char hex[KC_KEY_HEX_SIZE], sum[KC_KEY_HEX_SIZE];
    kc_sum s = kc_checksum(data, n);
    kc_key k;
    memcpy(k.bytes, s.bytes, 16);
    kc_key_hex(&e->key, hex);
    kc_key_hex(&k, sum);
    return fprintf(f, "entry %s %s %zu %s\n", hex, e->kind, n, sum) > 0 &&
           fwrite(data, 1, n, f) == n && fputc('\n', f) != EOF;
}

em_status kc_export(kc_cache *c, const char *path, const char *const *tags, int ntags,
                    uint64_t *exported, uint64_t *skipped) {
    if (!path) return em_error(EM_ERR_NULL, "kc_export: path is NULL");
    *exported = *skipped = 0;
    kc_entry_info *es;
    size_t n;
    em_status s = kc_list(c, &es, &n);
    if (s != EM_OK) return s;
    char *tmp = kc_strfmt("%s.tmp-XXXXXX", path);
    int fd = tmp ? mkstemp(tmp) : -1;
    FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
    if (!f) {
        s = tmp ? em_error(EM_ERR_IO, "kc_export: cannot create %s: %s", tmp, strerror(errno))
                : em_last_status();
        if (fd >= 0) close(fd);
        goto done;
    }
    bool ok = fprintf(f, "ember-bundle 1\n") > 0;
    for (int i = 0; ok && i < ntags; i++) ok = fprintf(f, "tag %s\n", tags[i]) > 0;
    for (size_t i = 0; ok && i < n; i++) {
        void *data = NULL;
        size_t len = 0;
        /* through kc_get: only verified bytes leave the cache */
        if (kc_get(c, &es[i].key, es[i].kind, &data, &len) != EM_OK || !data) {
            em_clear_error();
            (*skipped)++;
            continue;
        }
        ok = write_entry(f, &es[i], data, len);
        em_free(data);
        if (ok) (*exported)++;
    }
    ok = ok && fprintf(f, "end %" PRIu64 "\n", *exported) > 0 && fflush(f) == 0 && fsync(fd) == 0;
    if (fclose(f) != 0) ok = false;
    if (ok && rename(tmp, path) != 0) ok = false;
    if (!ok) {
        s = em_error(EM_ERR_IO, "kc_export: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
    }
done:
    em_free(tmp);
    em_free(es);
    return s;
}

/* Reads one line (without its newline) into buf; false at EOF or when the
 * line is too long. */
static bool read_line(FILE *f, char *buf, size_t n) {
    if (!fgets(buf, (int)n, f)) return false;
    size_t len = strlen(buf);
    if (len == 0 || buf[len - 1] != '\n') return false;
    buf[len - 1] = '\0';
    return true;
}

/* Whether the bundle's tag "name=value" is one of ours; *why otherwise. */
static bool tag_matches(const char *tag, const char *const *tags, int ntags, char *why,
                        size_t nwhy) {
    const char *eq = strchr(tag, '=');
    if (!eq) {
        snprintf(why, nwhy, "malformed tag '%s'", tag);
        return false;
    }
    size_t nlen = (size_t)(eq - tag) + 1;
    for (int i = 0; i < ntags; i++) {
        if (strncmp(tags[i], tag, nlen) != 0) continue;
        if (!strcmp(tags[i], tag)) return true;
        snprintf(why, nwhy, "the bundle was made for %s, but this machine has %s", tag, tags[i]);
        return false;
    }
    snprintf(why, nwhy, "the bundle was made for %s, which this machine does not have", tag);
    return false;
}

static em_status import_entry(kc_cache *c, FILE *f, const char *line, const char *path,
                              uint64_t remaining) {
    char hex[40], kind[32], sumhex[40];
    uint64_t size;
    kc_key k, sk;
    if (sscanf(line, "entry %39s %31s %" SCNu64 " %39s", hex, kind, &size, sumhex) != 4 ||
        !kc_key_from_hex(hex, &k) || !kc_kind_valid(kind) || !kc_key_from_hex(sumhex, &sk))
        return em_error(EM_ERR_ARG, "kc_import: %s: malformed entry line", path);
    if (size > remaining)
        return em_error(EM_ERR_ARG, "kc_import: %s: an entry of %" PRIu64 " bytes runs past the end "
                        "(truncated bundle)", path, size);
    void *data = em_malloc(size ? size : 1);
    if (!data) return em_last_status();
    em_status s = EM_OK;
    kc_sum sum;
    if (fread(data, 1, size, f) != size || fgetc(f) != '\n') {
        s = em_error(EM_ERR_ARG, "kc_import: %s: truncated entry %s.%s", path, hex, kind);
    } else if ((sum = kc_checksum(data, size)), memcmp(sum.bytes, sk.bytes, 16) != 0) {
        s = em_error(EM_ERR_ARG, "kc_import: %s: entry %s.%s fails its checksum", path, hex, kind);
    } else {
        s = kc_put(c, &k, kind, data, size);
    }
    em_free(data);
    return s;
}

em_status kc_import(kc_cache *c, const char *path, const char *const *tags, int ntags,
                    uint64_t *imported) {
    if (!path) return em_error(EM_ERR_NULL, "kc_import: path is NULL");
    *imported = 0;
    if (!root_of(c, "kc_import")) return em_last_status();
    FILE *f = fopen(path, "rb");
    if (!f) return em_error(EM_ERR_IO, "kc_import: cannot open %s: %s", path, strerror(errno));
    struct stat st;
    uint64_t total = fstat(fileno(f), &st) == 0 ? (uint64_t)st.st_size : 0;
    char line[512], why[600];
    em_status s = EM_OK;
    if (!read_line(f, line, sizeof line) || strcmp(line, "ember-bundle 1") != 0) {
        fclose(f);
        return em_error(EM_ERR_ARG, "kc_import: %s is not an Ember cache bundle (format 1)", path);
    }
    /* every tag first: a mismatched bundle imports nothing */
    long pos = ftell(f);
    while (s == EM_OK && read_line(f, line, sizeof line) && !strncmp(line, "tag ", 4)) {
        if (!tag_matches(line + 4, tags, ntags, why, sizeof why))
            s = em_error(EM_ERR_ARG, "kc_import: refusing %s: %s", path, why);
        pos = ftell(f);
    }
    if (s == EM_OK) fseek(f, pos, SEEK_SET);
    bool ended = false;
    while (s == EM_OK && read_line(f, line, sizeof line)) {
        uint64_t count;
        if (sscanf(line, "end %" SCNu64, &count) == 1) {
            ended = count == *imported;
            break;
        }
        long at = ftell(f);
        s = import_entry(c, f, line, path, at < 0 ? 0 : total - (uint64_t)at);
        if (s == EM_OK) (*imported)++;
    }
    if (s == EM_OK && !ended)
        s = em_error(EM_ERR_ARG, "kc_import: %s is truncated or malformed after %" PRIu64
                     " entries (they were imported)", path, *imported);
    fclose(f);
    return s;
}
