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

#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack: streaming checksums */
#include <xxhash.h>

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
    em_status s = remove_before(c, "kc_clear", INT64_MAX, removed);
    if (s == EM_OK) kc_store_clear_locks(kc_dir(c));
    return s;
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

/* An entry larger than this is refused without reading it, whatever the
 * cache's size limit: compiled kernels and plans are kilobytes to a few
 * megabytes, so 256 MiB bounds what one forged size can cost (time, disk)
 * with room to spare. */
#define KC_BUNDLE_ENTRY_MAX ((uint64_t)256 << 20)

/* Reads one line (without its newline) into buf; false at EOF, when the
 * line is too long or when it holds a NUL byte. */
static bool read_line(FILE *f, char *buf, size_t n) {
    if (!fgets(buf, (int)n, f)) return false;
    size_t len = strlen(buf);
    if (len == 0 || buf[len - 1] != '\n') return false;
    buf[len - 1] = '\0';
    return true;
}

/* Opens the bundle at path.  O_NONBLOCK so that a FIFO or a device never
 * blocks the open; only a regular file is read (a FIFO would block the
 * first read instead, and sizes are checked against the file's length). */
static FILE *open_bundle(const char *path, uint64_t *size) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) {
        em_error(EM_ERR_IO, "kc_import: cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    int fl = -1;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        em_error(EM_ERR_ARG, "kc_import: %s is not a regular file", path);
    } else if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        em_error(EM_ERR_IO, "kc_import: cannot read %s: %s", path, strerror(errno));
        fl = -1;
    }
    FILE *f = fl >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        if (fl >= 0) em_error(EM_ERR_NOMEM, "kc_import: out of memory");
        close(fd);
        return NULL;
    }
    *size = (uint64_t)st.st_size;
    return f;
}

/* tags[i] without its optional mark ('?'). */
static const char *tag_text(const char *t) { return t[0] == '?' ? t + 1 : t; }

/* Which of this machine's tags the bundle's "name=value" is: its index, or
 * -1 with *why set (malformed, another value, a name we lack). */
static int tag_match(const char *tag, const char *const *tags, int ntags, char *why,
                     size_t nwhy) {
    const char *eq = strchr(tag, '=');
    if (!eq || eq == tag) {
        snprintf(why, nwhy, "malformed tag '%s'", tag);
        return -1;
    }
    size_t nlen = (size_t)(eq - tag) + 1;
    for (int i = 0; i < ntags; i++) {
        const char *mine = tag_text(tags[i]);
        if (strncmp(mine, tag, nlen) != 0) continue;
        if (!strcmp(mine, tag)) return i;
        snprintf(why, nwhy, "the bundle was made for %s, but this machine has %s", tag, mine);
        return -1;
    }
    snprintf(why, nwhy, "the bundle was made for %s, which this machine does not have", tag);
    return -1;
}

/* Reads the tag lines and leaves f at the first line after them.  Every
 * tag must be one of this machine's, and every one of this machine's must
 * be there: a bundle without a tag says nothing about what its artifacts
 * were made for, so it is refused like a wrong one. */
static em_status check_tags(FILE *f, const char *path, const char *const *tags, int ntags) {
    char line[512], why[700];
    uint64_t seen = 0; /* bit i: tags[i] was found */
    long pos = ftell(f);
    while (read_line(f, line, sizeof line) && !strncmp(line, "tag ", 4)) {
        int i = tag_match(line + 4, tags, ntags, why, sizeof why);
        if (i < 0) return em_error(EM_ERR_ARG, "kc_import: refusing %s: %s", path, why);
        seen |= (uint64_t)1 << i;
        pos = ftell(f);
    }
    for (int i = 0; i < ntags; i++) {
        if ((seen & ((uint64_t)1 << i)) || tags[i][0] == '?') continue; /* optional: may be absent */
        const char *eq = strchr(tags[i], '=');
        int nlen = eq ? (int)(eq - tags[i]) : (int)strlen(tags[i]);
        return em_error(EM_ERR_ARG, "kc_import: refusing %s: the bundle has no %.*s tag (this "
                        "machine has %s)", path, nlen, tags[i], tags[i]);
    }
    if (pos < 0 || fseek(f, pos, SEEK_SET) != 0)
        return em_error(EM_ERR_IO, "kc_import: cannot read %s: %s", path, strerror(errno));
    return EM_OK;
}

/* One entry line, parsed. */
typedef struct bundle_entry {
    kc_key key;
    char kind[KC_KIND_MAX + 1];
    uint64_t size;
    kc_key sum; /* the payload's XXH3-128, as 16 bytes like a key */
    char hex[KC_KEY_HEX_SIZE];
} bundle_entry;

/* Copies the word at p (up to a space or the end; 1 to cap - 1 bytes) into
 * out; returns where it ends, or NULL. */
static const char *token(const char *p, char *out, size_t cap) {
    size_t n = strcspn(p, " ");
    if (n == 0 || n >= cap) return NULL;
    memcpy(out, p, n);
    out[n] = '\0';
    return p + n;
}

/* Parses exactly "entry <32 hex> <kind> <decimal size> <32 hex>", as
 * write_entry writes it: no signs, no extra spaces, nothing after. */
static bool parse_entry_line(const char *line, bundle_entry *e) {
    char sumhex[KC_KEY_HEX_SIZE], digits[24];
    const char *p = line;
    if (strncmp(p, "entry ", 6) != 0) return false;
    if (!(p = token(p + 6, e->hex, sizeof e->hex)) || *p++ != ' ' ||
        !(p = token(p, e->kind, sizeof e->kind)) || *p++ != ' ' ||
        !(p = token(p, digits, sizeof digits)) || *p++ != ' ' ||
        !(p = token(p, sumhex, sizeof sumhex)) || *p != '\0')
        return false;
    e->size = 0;
    for (const char *d = digits; *d; d++) {
        if (*d < '0' || *d > '9' || e->size > (UINT64_MAX - (uint64_t)(*d - '0')) / 10)
            return false;
        e->size = e->size * 10 + (uint64_t)(*d - '0');
    }
    return kc_key_from_hex(e->hex, &e->key) && kc_kind_valid(e->kind) &&
           kc_key_from_hex(sumhex, &e->sum);
}

/* The most bytes one entry may have: the cache's size limit when it has
 * one, and KC_BUNDLE_ENTRY_MAX. */
static uint64_t entry_limit(kc_cache *c) {
    uint64_t lim = kc_max_size(c);
    return lim && lim < KC_BUNDLE_ENTRY_MAX ? lim : KC_BUNDLE_ENTRY_MAX;
}

/* A temporary file in the entry's fan-out directory, named as every
 * writer's (.tmp-*: a crashed import's is removed by the next prune), so
 * that kc_put_file renames it into place.  The fan-out directory is
 * checked by kc_put_file. */
static int entry_tmp(const char *root, const bundle_entry *e, char **tmp) {
    char *dir = kc_strfmt("%s/v1/%.2s", root, e->hex);
    *tmp = dir ? kc_strfmt("%s/.tmp-XXXXXX", dir) : NULL;
    int fd = -1;
    if (*tmp && (mkdir(dir, 0700) == 0 || errno == EEXIST)) fd = mkostemp(*tmp, O_CLOEXEC);
    if (*tmp && fd < 0)
        em_error(EM_ERR_IO, "kc_import: cannot create a file in %s: %s", dir, strerror(errno));
    em_free(dir);
    if (fd < 0) {
        em_free(*tmp);
        *tmp = NULL;
    }
    return fd;
}

/* Copies e->size bytes and the newline after them from f to fd, hashing
 * them on the way: never more than one buffer in memory. */
static em_status copy_entry(FILE *f, int fd, const bundle_entry *e, const char *path) {
    XXH3_state_t st;
    XXH3_128bits_reset(&st);
    unsigned char buf[65536];
    for (uint64_t left = e->size; left > 0;) {
        size_t want = left < sizeof buf ? (size_t)left : sizeof buf;
        if (fread(buf, 1, want, f) != want)
            return em_error(EM_ERR_ARG, "kc_import: %s: truncated entry %s.%s", path, e->hex, e->kind);
        XXH3_128bits_update(&st, buf, want);
        if (!kc_write_all(fd, buf, want))
            return em_error(EM_ERR_IO, "kc_import: cannot write the entry %s.%s: %s", e->hex,
                            e->kind, strerror(errno));
        left -= want;
    }
    if (fgetc(f) != '\n')
        return em_error(EM_ERR_ARG, "kc_import: %s: truncated entry %s.%s", path, e->hex, e->kind);
    XXH128_canonical_t sum;
    XXH128_canonicalFromHash(&sum, XXH3_128bits_digest(&st));
    if (memcmp(sum.digest, e->sum.bytes, sizeof e->sum.bytes) != 0)
        return em_error(EM_ERR_ARG, "kc_import: %s: entry %s.%s fails its checksum", path, e->hex,
                        e->kind);
    return EM_OK;
}

/* Imports the entry of line: its size is checked before anything is read
 * (remaining: the bytes left in the file), its bytes streamed to a
 * temporary file that becomes the entry only when the checksum matches. */
static em_status import_entry(kc_cache *c, FILE *f, const char *line, const char *path,
                              uint64_t remaining) {
    bundle_entry e;
    if (!parse_entry_line(line, &e))
        return em_error(EM_ERR_ARG, "kc_import: %s: malformed entry line", path);
    if (e.size >= remaining) /* the payload and its newline */
        return em_error(EM_ERR_ARG, "kc_import: %s: entry %s.%s of %" PRIu64 " bytes runs past "
                        "the end of the file (truncated bundle)", path, e.hex, e.kind, e.size);
    uint64_t limit = entry_limit(c);
    if (e.size > limit)
        return em_error(EM_ERR_ARG, "kc_import: %s: entry %s.%s of %" PRIu64 " bytes is over the "
                        "limit of %" PRIu64 " bytes an entry may have", path, e.hex, e.kind,
                        e.size, limit);
    char *tmp;
    int fd = entry_tmp(kc_dir(c), &e, &tmp);
    if (fd < 0) return em_last_status();
    em_status s = copy_entry(f, fd, &e, path);
    if (close(fd) != 0 && s == EM_OK)
        s = em_error(EM_ERR_IO, "kc_import: cannot write %s: %s", tmp, strerror(errno));
    if (s == EM_OK) s = kc_put_file(c, &e.key, e.kind, tmp);
    /* A disk that fails turns the cache memory-only and kc_put_file still
     * succeeds: for an import, whose point is the disk, that is a failure. */
    if (s == EM_OK && !kc_on_disk(c))
        s = em_error(EM_ERR_IO, "kc_import: the cache directory failed while storing entry "
                     "%s.%s (see the message above)", e.hex, e.kind);
    if (s != EM_OK) (void)unlink(tmp); /* kc_put_file moved it on success */
    em_free(tmp);
    return s;
}

/* Parses exactly "end <decimal>". */
static bool parse_end(const char *line, uint64_t *count) {
    if (strncmp(line, "end ", 4) != 0 || !line[4]) return false;
    *count = 0;
    for (const char *d = line + 4; *d; d++) {
        if (*d < '0' || *d > '9' || *count > (UINT64_MAX - 9) / 10) return false;
        *count = *count * 10 + (uint64_t)(*d - '0');
    }
    return true;
}

/* The entries up to the end line, which must count them and be the last
 * bytes of the file. */
static em_status import_entries(kc_cache *c, FILE *f, const char *path, uint64_t total,
                                uint64_t *imported) {
    char line[512];
    while (read_line(f, line, sizeof line)) {
        uint64_t count;
        if (parse_end(line, &count)) {
            if (count == *imported && fgetc(f) == EOF) return EM_OK;
            break;
        }
        long at = ftell(f);
        uint64_t left = at >= 0 && (uint64_t)at <= total ? total - (uint64_t)at : 0;
        em_status s = import_entry(c, f, line, path, left);
        if (s != EM_OK) return s;
        (*imported)++;
    }
    return em_error(EM_ERR_ARG, "kc_import: %s is truncated or malformed after %" PRIu64
                    " entries (they were imported)", path, *imported);
}

em_status kc_import(kc_cache *c, const char *path, const char *const *tags, int ntags,
                    uint64_t *imported) {
    if (!path || !imported || (ntags && !tags))
        return em_error(EM_ERR_NULL, "kc_import: path, tags or imported is NULL");
    *imported = 0;
    if (ntags < 0 || ntags > 64)
        return em_error(EM_ERR_ARG, "kc_import: %d tags (at most 64)", ntags);
    if (!root_of(c, "kc_import")) return em_last_status();
    uint64_t total = 0;
    FILE *f = open_bundle(path, &total);
    if (!f) return em_last_status();
    char line[512];
    em_status s;
    if (!read_line(f, line, sizeof line) || strcmp(line, "ember-bundle 1") != 0)
        s = em_error(EM_ERR_ARG, "kc_import: %s is not an Ember cache bundle (format 1)", path);
    else if ((s = check_tags(f, path, tags, ntags)) == EM_OK)
        s = import_entries(c, f, path, total, imported);
    fclose(f);
    return s;
}
