/* cache.h - the kernel cache (src/cache): a content-addressed store of
 * compiled artifacts (shared objects, PTX, CUBIN, graph text), in memory and
 * on disk.
 *
 * The cache knows keys and bytes, not what they mean.  The caller hashes
 * everything that determines an artifact (kernel source, compiler and its
 * options, target) into a kc_key with a kc_hasher, then asks for the pair
 * (key, kind); kind says which artifact of that key ("so", "ptx", "cubin",
 * "graph").  Same key and kind, same bytes: an entry is never updated, only
 * written again whole.
 *
 * Two tiers.  The memory tier is a table (key, kind) -> bytes and/or the
 * path of a verified file, so a second lookup in a process costs a hash
 * probe.  The disk tier lives under one directory and survives the process:
 *
 *   <dir>/v1/<first 2 hex digits of key>/<32 hex key>.<kind>        payload
 *   <dir>/v1/<first 2 hex digits of key>/<32 hex key>.<kind>.meta   header
 *
 * The payload file holds exactly the artifact's bytes; code is loaded from
 * a sealed memory copy of the verified bytes (kc_get_fd), never from the
 * directory by name.  The header is a sidecar text file, byte for byte as
 * kc_meta_format writes it:
 *
 *   ember-cache 1
 *   key <32 hex: the entry's key>
 *   kind <kind>
 *   size <payload length in bytes, decimal>
 *   xxh3-128 <32 hex: XXH3-128 of the payload>
 *   created <creation time, seconds since the epoch>
 *
 * A read verifies the header (exact text, version, key, kind), the payload's
 * length and its checksum; anything else (unreadable, truncated, foreign,
 * another kind) is a miss counted as corrupt, never wrong bytes.  Writes go
 * to mkstemp files in the entry's directory, both written (not fsync'ed:
 * a torn entry after a crash is a checked miss) before either is renamed over its final name, payload first then header:
 * a failed write (full disk) leaves no part of the entry, concurrent
 * writers of one key each leave complete files and the last rename wins;
 * a directory planted at an entry's name is removed by the next put.  The header's mtime is
 * the entry's last use (set on put and on each disk hit): kc_prune evicts
 * the least recently used entries first.
 *
 * Trust: the directory is created 0700.  A directory or entry writable by
 * group or others, or owned by another user, is refused with a message: a
 * refused directory (or one that cannot be created or written) leaves the
 * cache memory-only; a refused entry is a miss, replaced by the next put.
 * v1/ and the fan-out directories are checked on every read and write
 * (also: not symbolic links); one that fails is a miss, never a load.
 *
 * Environment (read by kc_open): EMBER_CACHE_DIR (used when no directory is
 * given; default $XDG_CACHE_HOME/ember, else $HOME/.cache/ember),
 * EMBER_CACHE=0 (memory only), EMBER_CACHE_MAX_SIZE ("500M", "2G", bytes:
 * prune to that size after each put).  docs/cache.md has the details.
 *
 * Errors: functions return em_status (or NULL) and set em_last_error();
 * problems with the disk are not errors but warnings, each kind printed
 * once per cache object, and the cache carries on in memory.
 * Threads: one kc_cache may be shared; a mutex inside serializes calls.
 * Ownership: a kc_cache owns its table and everything in it; buffers and
 * paths it returns belong to the caller (em_free). */
#ifndef EMBER_CACHE_H
#define EMBER_CACHE_H

#include "ember.h"

#include <time.h>

/* Version of the key derivation and of the on-disk format: part of every
 * key, of every header and of the layout's "v1" directory. */
#define KC_FORMAT_VERSION 1u

/* ---- keys ---- */

/* An XXH3-128 digest, as its canonical (big-endian) bytes. */
typedef struct kc_key {
    uint8_t bytes[16];
} kc_key;

#define KC_KEY_HEX_SIZE 33 /* 32 hex digits and a NUL */

/* "0123...ef": the key as it appears in file names. */
void kc_key_hex(const kc_key *k, char out[KC_KEY_HEX_SIZE]);
/* Parses 32 lowercase hex digits; false if s is anything else. */
bool kc_key_from_hex(const char *s, kc_key *k);
bool kc_key_equal(const kc_key *a, const kc_key *b);

/* A streaming hasher for key material.  The caller owns it (it may live on
 * the stack; it allocates nothing).  reset starts a key with the cache's
 * format version, so a new format never meets an old key.  update feeds raw
 * bytes (pieces concatenate: update("ab"), update("c") == update("abc"));
 * update_str and update_u64 feed one self-delimiting field each, so
 * ("ab", "c") and ("a", "bc") give different keys.  digest does not change
 * the state: more material may follow. */
typedef struct kc_hasher {
    _Alignas(64) unsigned char state[640]; /* an XXH3 state (hash.c checks the size) */
} kc_hasher;

void kc_hasher_reset(kc_hasher *h);
/* reset with another format version: for tests and tools reading old keys. */
void kc_hasher_reset_version(kc_hasher *h, uint32_t version);
void kc_hasher_update(kc_hasher *h, const void *data, size_t n);
/* The length, then the bytes; NULL is a field distinct from "". */
void kc_hasher_update_str(kc_hasher *h, const char *s);
/* 8 bytes, little-endian. */
void kc_hasher_update_u64(kc_hasher *h, uint64_t v);
kc_key kc_hasher_digest(const kc_hasher *h);

/* ---- the cache ---- */

typedef struct kc_cache kc_cache;

enum {
    KC_MEMORY_ONLY = 1u << 0, /* no disk tier (nor remote), whatever the environment says */
    KC_NO_REMOTE = 1u << 1    /* no remote tier, whatever the environment says */
};

/* Receives each warning once per cache object, as "cache: ..." with no
 * newline.  Without one, warnings go to stderr as "[ember] cache: ...". */
typedef void (*kc_log_fn)(void *ud, const char *msg);

typedef struct kc_options {
    const char *dir;   /* NULL or "": EMBER_CACHE_DIR, $XDG_CACHE_HOME/ember,
                          $HOME/.cache/ember (the first that is set) */
    unsigned flags;    /* KC_* */
    kc_log_fn log;     /* optional */
    void *log_ud;
    uint64_t max_size; /* prune to this many bytes after each put; 0:
                          EMBER_CACHE_MAX_SIZE, or no limit */
    const char *remote;   /* the remote tier, "redis://host:port/db"; NULL:
                             EMBER_CACHE_REMOTE; "": none */
    const char *key_file; /* the remote tier's signing key; NULL:
                             EMBER_CACHE_KEY_FILE */
    int remote_timeout_ms; /* each remote wait; 0: EMBER_CACHE_REMOTE_TIMEOUT, else 200 */
    kc_log_fn trace;      /* optional: every remote hit, miss, publish and error
                             (EMBER_LOG=cache), as "cache remote ..." */
    void *trace_ud;
} kc_options;

/* Opens a cache.  A disk tier that cannot be used (refused, not creatable,
 * not writable) is not an error: the cache is memory-only and says why once
 * (EMBER_CACHE=0 and KC_MEMORY_ONLY make it memory-only silently).  NULL
 * (with the error set) only when memory or a mutex cannot be had. */
kc_cache *kc_open(const char *dir, unsigned flags);
kc_cache *kc_open_with(const kc_options *o);
/* Frees the cache and its table; files on disk stay.  NULL is a no-op. */
void kc_close(kc_cache *c);
/* Whether entries go to disk.  A cache whose disk fails later becomes
 * memory-only; this tells the present state. */
bool kc_on_disk(kc_cache *c);
/* The absolute cache directory (the one holding v1/), or NULL when the
 * cache never had a disk tier.  Valid until kc_close. */
const char *kc_dir(const kc_cache *c);

/* Kinds are 1 to 15 characters of [a-z0-9_]. */
#define KC_KIND_MAX 15

/* ---- claim.c: compiles in flight ----
 * A claim on (key, kind) says that its holder is producing that entry now:
 * another thread or process that wants the same entry waits for the claim
 * and then reads the entry, instead of producing it a second time.  A
 * claim is an exclusive flock on <dir>/v1/locks/<32 hex key>.<kind>.lock, so it
 * ends with kc_release or with its holder (a crash, a kill).  Claims only
 * ever save work: without a disk tier, on a file system without flock, or
 * when the wait runs out, the caller produces the entry itself, and the
 * last complete write wins as for any two writers. */
typedef enum kc_claim_result {
    KC_CLAIM_OURS, /* *fd holds the claim: produce the entry, then kc_release */
    KC_CLAIM_BUSY, /* someone else held it for the whole wait */
    KC_CLAIM_NONE  /* claims are not available here: produce it unclaimed */
} kc_claim_result;

/* Claims (key, kind), waiting up to wait_s seconds (0: only tries) for a
 * holder to release it.  *fd is -1 unless KC_CLAIM_OURS. */
kc_claim_result kc_claim(kc_cache *c, const kc_key *key, const char *kind, double wait_s, int *fd);
/* Ends a claim (fd from kc_claim; -1 is a no-op). */
void kc_release(int fd);

/* Looks up (key, kind).  Hit: EM_OK, *data a copy of the payload (from
 * em_malloc, the caller em_free's it; never NULL, even for 0 bytes) and *n
 * its length.  Miss: EM_OK, *data NULL, *n 0.  Any other status is an error
 * in the arguments (EM_ERR_NULL, EM_ERR_ARG) or EM_ERR_NOMEM. */
em_status kc_get(kc_cache *c, const kc_key *key, const char *kind, void **data, size_t *n);
/* As kc_get, for use in place (not for loading code: the file can change
 * after the call; use kc_get_fd): on a hit *path is the absolute path of a file
 * holding exactly the verified payload (em_malloc'd, the caller em_free's
 * it), on a miss NULL.  The file stays valid until a prune evicts it (or,
 * memory-only, until kc_close). */
em_status kc_get_file(kc_cache *c, const kc_key *key, const char *kind, char **path);
/* As kc_get_file, for loading code: on a hit *fd is a sealed memory file
 * (memfd_create, F_SEAL_WRITE|GROW|SHRINK|SEAL) holding exactly the bytes
 * that were verified, copied from the one descriptor they were read and
 * checksummed through, so nothing done to the cache directory after the
 * check can change what is loaded (dlopen "/proc/self/fd/N"); the caller
 * closes it.  Miss: EM_OK, *fd -1 (also when no memory file can be made,
 * with a warning).  Errors as kc_get. */
em_status kc_get_fd(kc_cache *c, const kc_key *key, const char *kind, int *fd);
/* Stores n bytes under (key, kind), replacing any entry (a corrupt one
 * too).  When the disk fails the bytes still go to memory (EM_OK).  Not
 * fsync'ed (no entry is): after a crash a torn entry fails its read's size
 * and checksum check and is a miss, compiled again; a flush would cost
 * milliseconds per file on the cold-start path of every compile. */
em_status kc_put(kc_cache *c, const kc_key *key, const char *kind, const void *data,
                 size_t n);
/* Stores the file at path (a regular file the caller made, e.g. a compiler's
 * output) under (key, kind), moving it into the cache (renamed, or copied
 * then removed when it is on another file system or has other links); it
 * becomes mode 0600.  On success the file is gone from path; EM_ERR_ARG (not
 * a readable regular file, or a symbolic link) leaves it there.
 * Memory-only, the file moves to a private directory ($TMPDIR/ember-cache-*)
 * that kc_close removes; EM_ERR_STATE if that directory cannot be made. */
em_status kc_put_file(kc_cache *c, const kc_key *key, const char *kind, const char *path);

/* Removes least recently used disk entries (by header mtime; stale temporary
 * files too) until the disk tier holds at most max_bytes (payloads and
 * headers).  EM_OK, also when memory-only (nothing to do). */
em_status kc_prune(kc_cache *c, uint64_t max_bytes);

typedef struct kc_counters {
    uint64_t hits_mem;      /* lookups served by the memory table */
    uint64_t hits_disk;     /* lookups read and verified from disk */
    uint64_t misses;        /* lookups that found nothing usable */
    uint64_t writes;        /* entries written to disk */
    uint64_t bytes_written; /* payload bytes written to disk */
    uint64_t corrupt;       /* disk entries that failed verification (each a miss too) */
    uint64_t refused;       /* disk entries refused by the trust checks (each a miss too) */
    uint64_t evicted;       /* disk entries removed by kc_prune */
    uint64_t entries;       /* entries in the memory table */
    uint64_t remote_hits;   /* lookups served by the remote tier (then written to disk) */
    uint64_t remote_misses; /* lookups the remote tier did not have either */
    uint64_t remote_writes; /* entries published to the remote tier */
    uint64_t remote_errors; /* remote calls that failed (down, timed out, refused) */
    uint64_t remote_rejected; /* remote entries refused: unsigned, wrongly signed, damaged */
} kc_counters;

em_status kc_stats(kc_cache *c, kc_counters *out);

/* ---- keys with named fields, and why a lookup missed (explain.c) ----
 * A key is built from fields, each a name and a value (kc_fields): the
 * digest hashes the values exactly as kc_hasher_update_str and _u64 would
 * (so a key is the one a bare kc_hasher gives), and the names and values
 * are recorded in a manifest, so that the key and its description cannot
 * drift apart.  A manifest is stored next to its artifact, under the same
 * key with the kind "why_" + the artifact's kind (kc_put_manifest); on a
 * miss, kc_explain reads the manifests of that kind and says in which
 * fields the nearest one differs from the key wanted.  The text form
 * (kc_manifest_format), line by line:
 *
 *   ember-manifest 1
 *   key-format <the hasher's version, KC_FORMAT_VERSION>
 *   key <32 hex: the key the fields hash to>
 *   fields <count>
 *   u64 <name> <decimal value>
 *   str <name> <length in bytes>
 *   <exactly that many bytes (newlines included), then a newline>
 *   nul <name>                      (a NULL string)
 *
 * Names are [a-z0-9_]{1,31}.  The parser takes exactly this form, and a
 * manifest whose fields do not hash to its key is not one (corrupt).
 * Ownership: a kc_manifest owns its fields' strings (kc_manifest_clear);
 * a kc_fields owns nothing (it may live on the stack). */

#define KC_FIELD_NAME_MAX 31
#define KC_MANIFEST_VERSION 1u

typedef enum kc_field_type { KC_FIELD_STR, KC_FIELD_U64, KC_FIELD_NULL } kc_field_type;

typedef struct kc_field {
    char name[KC_FIELD_NAME_MAX + 1];
    kc_field_type type;
    uint64_t u; /* KC_FIELD_U64's value */
    char *s;    /* KC_FIELD_STR's value (em_malloc'd, NUL-terminated), else NULL */
    size_t n;   /* its length */
} kc_field;

typedef struct kc_manifest {
    uint32_t version; /* the key derivation's (kc_hasher_reset_version) */
    kc_key key;       /* what the fields hash to */
    kc_field *fields; /* in the order they were hashed */
    int n, cap;
    bool failed;      /* recording ran out of memory (or a bad name): incomplete */
} kc_manifest;

/* A key being built: the hasher, and the manifest that records it (NULL:
 * the key only, nothing allocated). */
typedef struct kc_fields {
    kc_hasher h;
    kc_manifest *m;
} kc_fields;

/* Starts a key (kc_hasher_reset); m (may be NULL) is cleared, then records. */
void kc_fields_begin(kc_fields *f, kc_manifest *m);
/* One field: value hashed as kc_hasher_update_str (NULL distinct from ""). */
void kc_fields_str(kc_fields *f, const char *name, const char *value);
/* One field: v hashed as kc_hasher_update_u64. */
void kc_fields_u64(kc_fields *f, const char *name, uint64_t v);
/* The key (also into the manifest's key). */
kc_key kc_fields_digest(kc_fields *f);

void kc_manifest_clear(kc_manifest *m);
/* The field called name, or NULL. */
const kc_field *kc_manifest_field(const kc_manifest *m, const char *name);
/* The key m's fields hash to (replaying them with m->version). */
kc_key kc_manifest_digest(const kc_manifest *m);
/* The text form (em_malloc'd, *n its length), or NULL (error set). */
char *kc_manifest_format(const kc_manifest *m, size_t *n);
/* Parses exactly what kc_manifest_format writes; EM_ERR_ARG (with the
 * reason) on anything else, out then empty. */
em_status kc_manifest_parse(const char *text, size_t n, kc_manifest *out);
/* "why_" + kind into out; false when that is not a kind (too long). */
bool kc_why_kind(const char *kind, char out[KC_KIND_MAX + 1]);
/* Stores m under (m->key, "why_" + kind).  EM_ERR_STATE for an incomplete
 * manifest. */
em_status kc_put_manifest(kc_cache *c, const kc_manifest *m, const char *kind);
/* Why a lookup of (want->key, kind) missed, as one paragraph without a
 * final newline (em_malloc'd; NULL only when out of memory): the nearest
 * manifest of kind "why_" + kind on disk (most fields equal; ties: the
 * most recently used) and the fields it differs in, or why there is none.
 * Reads the disk tier without marking entries used; a manifest that does
 * not parse or hash to its key is skipped. */
char *kc_explain(kc_cache *c, const kc_manifest *want, const char *kind);

/* "500M", "2G", "64k", "123" (bytes); K, M, G, T are powers of 1024, an
 * optional trailing "B" or "iB" is accepted.  EM_ERR_ARG on anything else. */
em_status kc_parse_size(const char *s, uint64_t *out);

/* The outcome of reading a disk entry. */
typedef enum kc_read {
    KC_READ_OK,
    KC_READ_ABSENT,  /* no header: a plain miss */
    KC_READ_CORRUPT, /* present but unusable */
    KC_READ_REFUSED, /* fails the trust checks */
    KC_READ_NOMEM
} kc_read;

/* ---- administration (admin.c): the ember-cache tool's commands ----
 * They work on c's disk tier (EM_ERR_STATE when it has none) and do not
 * update the memory table of c: a process serving kernels from c keeps
 * what it already read.  Disk problems are EM_ERR_IO with a message. */

typedef struct kc_entry_info {
    kc_key key;
    char kind[KC_KIND_MAX + 1];
    uint64_t size;        /* payload bytes, per the header (0 if unreadable) */
    uint64_t disk_bytes;  /* payload and header on disk */
    int64_t created;      /* seconds since the epoch, per the header (0 if unreadable) */
    int64_t last_use;     /* the header's mtime */
    bool has_header;      /* false: a payload left by a writer that died */
} kc_entry_info;

/* Every disk entry, least recently used first (*out: em_free). */
em_status kc_list(kc_cache *c, kc_entry_info **out, size_t *n);
/* Reads and checks one entry whole (header, size, checksum, trust) without
 * counting it as a use: KC_READ_OK, or the problem with why set. */
kc_read kc_verify(kc_cache *c, const kc_entry_info *e, char *why, size_t nwhy);
em_status kc_remove(kc_cache *c, const kc_key *k, const char *kind);
/* Removes the entries not used in the last max_age seconds. */
em_status kc_prune_older(kc_cache *c, int64_t max_age, uint64_t *removed);
/* Removes every entry (the directory itself stays). */
em_status kc_clear(kc_cache *c, uint64_t *removed);
/* Writes every verified entry into one bundle file at path (atomically),
 * headed by tags ("name=value": the versions the artifacts need). */
em_status kc_export(kc_cache *c, const char *path, const char *const *tags, int ntags,
                    uint64_t *exported, uint64_t *skipped);
/* Imports a bundle: a regular file (a FIFO or device is refused, never
 * waited on).  Its tags must be exactly tags (this machine's: every one
 * present, each equal; one marked optional, "?name=value", may be absent
 * -- a CPU-only bundle on a GPU machine -- but if present must be equal):
 * otherwise nothing is imported and the error says which version differs
 * or is missing.  Each entry's size is checked
 * before it is read (within the file, at most the cache's size limit and
 * 256 MiB); its bytes are streamed through the checksum into a temporary
 * file that becomes the entry only when the checksum matches. */
em_status kc_import(kc_cache *c, const char *path, const char *const *tags, int ntags,
                    uint64_t *imported);

/* ---- the remote tier (remote.c, seal.c, fleet.c) ----
 * A Redis server many machines share (EMBER_CACHE_REMOTE).  Lookups go
 * memory -> disk -> remote -> (the caller compiles); a remote hit is
 * checked and written to the disk tier; every kc_put/kc_put_file is
 * published.  Entries travel signed (HMAC-SHA256 with the key in
 * EMBER_CACHE_KEY_FILE) and a reader checks the signature before anything
 * reaches its disk; without a key the remote tier is off, with a warning.
 * A remote failure never fails a call: the cache goes on locally, warns
 * once and rests the tier (KC_REMOTE_RETRY_S).  docs/cache.md. */

/* The remote tier's address (no password), or NULL when there is none. */
const char *kc_remote_url(const kc_cache *c);

/* Reports progress: done of total items. */
typedef void (*kc_progress_fn)(void *ud, uint64_t done, uint64_t total);

/* Publishes every verified disk entry to the remote tier.  EM_ERR_STATE
 * without a remote tier or a disk tier; EM_ERR_IO when the server fails
 * (*pushed says how far it got). */
em_status kc_push(kc_cache *c, kc_progress_fn progress, void *ud, uint64_t *pushed);
/* Fetches every entry of the remote tier's namespace that the disk tier
 * lacks, each checked as a lookup checks it: *fetched written to disk,
 * *present already there, *rejected refused (unsigned, wrongly signed,
 * damaged).  Errors as kc_push. */
em_status kc_pull(kc_cache *c, kc_progress_fn progress, void *ud, uint64_t *fetched,
                  uint64_t *present, uint64_t *rejected);

typedef struct kc_remote_kind {
    char kind[KC_KIND_MAX + 1];
    uint64_t entries, bytes; /* bytes: as stored remotely (signed envelopes) */
} kc_remote_kind;

typedef struct kc_remote_info {
    char server[64];          /* the server's version */
    uint64_t entries, bytes;  /* in Ember's namespace, this format version */
    kc_remote_kind kinds[16]; /* by kind, the most common first */
    int nkinds;
} kc_remote_info;

/* What the remote tier holds.  Errors as kc_push. */
em_status kc_remote_stats(kc_cache *c, kc_remote_info *out);

/* ==== Internals shared by the files of src/cache ==== */

/* An XXH3-128 checksum of a payload. */
typedef struct kc_sum {
    uint8_t bytes[16];
} kc_sum;

/* ---- cache.c ---- */
/* The size limit the cache prunes to (kc_options.max_size or
 * EMBER_CACHE_MAX_SIZE); 0: none. */
uint64_t kc_max_size(const kc_cache *c);

/* ---- hash.c ---- */
kc_sum kc_checksum(const void *data, size_t n);
/* A streaming checksum over a file descriptor from its current offset:
 * false on a read error; *n gets the bytes read. */
bool kc_checksum_fd(int fd, kc_sum *sum, uint64_t *n);
/* Writes all n bytes of data to fd, through short writes and EINTR; false
 * (errno set, no error message) when a write fails. */
bool kc_write_all(int fd, const void *data, size_t n);
/* kc_checksum_fd that also writes every byte it reads to out (-1: none):
 * the bytes checksummed are exactly the bytes copied.  false on a read or
 * write error. */
bool kc_checksum_copy(int fd, int out, kc_sum *sum, uint64_t *n);
/* kc_parse_size without setting an error. */
bool kc_size_from_str(const char *s, uint64_t *out);

/* ---- store.c: the disk tier ---- */

/* An entry's header, parsed. */
typedef struct kc_meta {
    uint32_t version;
    kc_key key;
    char kind[KC_KIND_MAX + 1];
    uint64_t size;
    kc_sum sum;
    int64_t created;
} kc_meta;

#define KC_META_MAX 256 /* longer header files are foreign */

/* The header text of m into buf (KC_META_MAX bytes); returns its length. */
size_t kc_meta_format(const kc_meta *m, char *buf);
/* Parses exactly what kc_meta_format writes (n bytes of text); false on
 * any difference. */
bool kc_meta_parse(const char *text, size_t n, kc_meta *m);


/* Opens and checks the disk root <dir>: creates it (0700) and v1/, refuses
 * it if untrusted or unwritable.  false with the reason in why. */
bool kc_store_open(const char *dir, char **root, char *why, size_t nwhy);
/* Path of an entry's payload (meta: of its header) under root, em_malloc'd. */
char *kc_store_path(const char *root, const kc_key *k, const char *kind, bool meta);
/* Reads and verifies an entry.  With data, *data gets the payload in a
 * buffer from em_malloc; without, the payload is only checksummed (for
 * kc_get_file).  *m gets the header.  On a hit, the header's mtime is set
 * to now (LRU).  why gets the reason of a CORRUPT or REFUSED result. */
kc_read kc_store_read(const char *root, const kc_key *k, const char *kind, void **data,
                      kc_meta *m, char *why, size_t nwhy);
/* Checks the payload file at path (as an entry: regular, trusted) against
 * size and sum; with data, also returns its bytes (em_malloc). */
kc_read kc_file_read(const char *path, uint64_t size, const kc_sum *sum, void **data,
                     char *why, size_t nwhy);
/* kc_store_read that copies the payload into sink (a file descriptor)
 * while checksumming it, instead of returning it. */
kc_read kc_store_read_to(const char *root, const kc_key *k, const char *kind, int sink,
                         kc_meta *m, char *why, size_t nwhy);
/* kc_file_read into sink, as kc_store_read_to. */
kc_read kc_file_read_to(const char *path, uint64_t size, const kc_sum *sum, int sink,
                        char *why, size_t nwhy);
/* A new memory file for a payload (memfd_create); -1 with why set. */
int kc_memfd_new(const char *name, char *why, size_t nwhy);
/* Seals a memory file against any change and rewinds it. */
bool kc_memfd_seal(int fd, char *why, size_t nwhy);
/* Writes an entry atomically from bytes (not fsync'ed: see kc_put).
 * false with the reason in why. */
bool kc_store_write(const char *root, const kc_meta *m, const void *data, char *why, size_t nwhy);
/* Moves the open regular file fd (at src, of header m) into place as an
 * entry's payload under root, then writes the header. */
bool kc_store_move(const char *root, const kc_meta *m, int fd, const char *src, char *why,
                   size_t nwhy);
/* Moves fd (at src) to dir/name, or copies it there and removes src. */
bool kc_move_file(int fd, const char *src, const char *dir, const char *name, char *why,
                  size_t nwhy);
/* Opens (creating it, 0600) the lock file of (k, kind) under root's
 * v1/locks (created 0700 and checked like the entry directories); -1
 * with why set. */
int kc_store_lock_file(const char *root, const kc_key *k, const char *kind, char *why,
                       size_t nwhy);
/* Removes root's lock files that no claim holds (kc_clear). */
void kc_store_clear_locks(const char *root);
/* Writes data to dir/name atomically (mkstemp, fsync, rename). */
bool kc_write_file(const char *dir, const char *name, const void *data, size_t n, char *why,
                   size_t nwhy);

/* ---- seal.c: signed envelopes ---- */

#define KC_SEAL_KEY_MIN 16   /* bytes: a shorter secret is guessable */
#define KC_SEAL_KEY_MAX 1024

typedef struct kc_seal_key {
    uint8_t bytes[KC_SEAL_KEY_MAX];
    size_t n;
    char id[17]; /* 16 hex: names the key in messages, reveals nothing of it */
} kc_seal_key;

/* Reads the key file at path (a regular file writable by no one else and
 * not readable by everyone; trailing whitespace is not part of the key).
 * false with the reason in why. */
bool kc_seal_key_load(const char *path, kc_seal_key *k, char *why, size_t nwhy);
/* The signed envelope of an entry (em_malloc'd, *out_n bytes); NULL with
 * the error set when libcrypto fails. */
void *kc_seal(const kc_seal_key *k, const kc_key *key, const char *kind, const void *data,
              size_t n, size_t *out_n);
/* Checks an envelope for (key, kind): KC_READ_OK with *payload pointing
 * into env; KC_READ_REFUSED (signed with another key) or KC_READ_CORRUPT
 * (no envelope, damaged, a signature that does not match, another name)
 * with why set. */
kc_read kc_unseal(const kc_seal_key *k, const kc_key *key, const char *kind, const void *env,
                  size_t n, const void **payload, size_t *np, char *why, size_t nwhy);

/* ---- remote.c: the connection to the server ---- */

#define KC_REMOTE_TIMEOUT_MS 200   /* default wait: a LAN round trip is < 1 ms */
#define KC_REMOTE_RETRY_S 5        /* rest after a failure before reconnecting */
#define KC_REMOTE_MAX (256u << 20) /* the largest entry published (Redis takes 512 MiB) */

typedef struct kc_remote kc_remote;

typedef enum kc_remote_status {
    KC_REMOTE_OK,
    KC_REMOTE_MISS,  /* the server has no such entry */
    KC_REMOTE_DOWN,  /* not tried: the tier rests after a failure */
    KC_REMOTE_ERROR, /* failed now (why says how); the tier rests from now */
    KC_REMOTE_PRESENT /* not written: the server has the entry already */
} kc_remote_status;

/* Parses url (redis://[[user]:password@]host[:port][/db]); connects at the
 * first call.  password (EMBER_CACHE_REMOTE_PASSWORD) replaces the URL's.
 * NULL with why set for a bad address or a build without hiredis. */
kc_remote *kc_remote_open(const char *url, const char *password, const char *prefix,
                          int timeout_ms, char *why, size_t nwhy);
void kc_remote_close(kc_remote *r);
/* redis://host:port/db: never the password. */
const char *kc_remote_name(const kc_remote *r);
int kc_remote_timeout(const kc_remote *r);
/* name is "<32 hex key>.<kind>"; the server's key is prefix "v1:" name. */
kc_remote_status kc_remote_get(kc_remote *r, const char *name, void **data, size_t *n, char *why,
                               size_t nwhy);
/* replace false: only if the server lacks the name (SET NX), else
 * KC_REMOTE_PRESENT; true: whatever it holds. */
kc_remote_status kc_remote_set(kc_remote *r, const char *name, const void *data, size_t n,
                               bool replace, char *why, size_t nwhy);
kc_remote_status kc_remote_scan(kc_remote *r, void (*each)(void *ud, const char *name), void *ud,
                                char *why, size_t nwhy);
kc_remote_status kc_remote_strlen(kc_remote *r, const char *name, uint64_t *n, char *why,
                                  size_t nwhy);
kc_remote_status kc_remote_version(kc_remote *r, char *out, size_t nout, char *why, size_t nwhy);

/* ---- cache.c: the remote tier inside a cache, for fleet.c ---- */

/* The cache's remote connection, or NULL. */
kc_remote *kc_remote_of(kc_cache *c);
/* Fetches (k, kind) from the remote tier, checks it and writes it to the
 * local tiers: KC_READ_OK, KC_READ_ABSENT (not there, or the tier is
 * down), KC_READ_REFUSED/CORRUPT (rejected, warned once). */
kc_read kc_fetch(kc_cache *c, const kc_key *k, const char *kind);
/* Publishes (k, kind) to the remote tier: the status of the SET.  An entry
 * the server has already stays (a machine with another key cannot replace
 * a fleet's entries) unless replace, or unless this cache found the
 * server's copy damaged (then a good one replaces it). */
kc_remote_status kc_publish(kc_cache *c, const kc_key *k, const char *kind, const void *data,
                            size_t n, bool replace);

/* ---- prune.c ---- */

/* One disk entry as a scan finds it. */
typedef struct kc_item {
    char *meta;         /* header path, or NULL for a payload without one */
    char *payload;
    uint64_t size;      /* both files */
    struct timespec t;  /* last use: the header's mtime (the payload's without one) */
    kc_key key;
    char kind[KC_KIND_MAX + 1];
} kc_item;

typedef struct kc_items {
    kc_item *items;     /* least recently used first */
    size_t n, cap;
    uint64_t total;     /* bytes of all items */
} kc_items;

/* Lists the entries under root (removing stale temporaries on the way). */
bool kc_store_scan(const char *root, kc_items *l, char *why, size_t nwhy);
void kc_items_free(kc_items *l);
/* Removes an entry's files, header first (a file or directory planted at
 * either name goes too); false with errno set when something stays. */
bool kc_item_remove(const kc_item *it);
/* Removes path: a file, a link, or a directory tree (not following links,
 * at most 16 levels deep).  true when nothing is left at path. */
bool kc_remove_path(const char *path);

/* An evicted entry, as kc_store_prune reports it to forget. */
typedef void (*kc_forget_fn)(void *ud, const kc_key *k, const char *kind);
/* kc_prune's work on root: *evicted gets the entries removed, *total the
 * bytes left.  keep (with keep_kind; may be NULL) is never evicted: the
 * entry a put just wrote, whose mtime may tie with older ones (file times
 * advance by the kernel's clock tick, a few ms). */
bool kc_store_prune(const char *root, uint64_t max_bytes, const kc_key *keep,
                    const char *keep_kind, kc_forget_fn forget, void *ud, uint64_t *evicted,
                    uint64_t *total, char *why, size_t nwhy);

/* A kind of [a-z0-9_]{1,15}. */
bool kc_kind_valid(const char *kind);
/* printf into a new em_malloc'd string; NULL (EM_ERR_NOMEM set) on failure. */
char *kc_strfmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
