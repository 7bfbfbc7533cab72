/* context.c - the per-thread context: last error, allocator, scope stack.
 *
 * Ember keeps no process-wide mutable state: what a call needs beyond its
 * arguments lives in its thread's context (like errno), which is freed when
 * the thread exits. */
#include "eager.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local em_context tls_ctx;

em_context *em_ctx(void) { return &tls_ctx; }

/* ---- Errors ---- */

/* Through a temporary: vsnprintf into the buffer an argument points into
 * (em_last_error()) is undefined and garbled messages. */
static void set_message(em_context *c, const char *fmt, va_list ap) {
    char tmp[sizeof c->message];
    vsnprintf(tmp, sizeof tmp, fmt, ap);
    memcpy(c->message, tmp, sizeof tmp);
}

em_status em_error(em_status s, const char *fmt, ...) {
    em_context *c = em_ctx();
    va_list ap;
    va_start(ap, fmt);
    set_message(c, fmt, ap);
    va_end(ap);
    c->status = s;
    return s;
}

em_status em_error_context(const char *fmt, ...) {
    em_context *c = em_ctx();
    char prefix[sizeof c->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (c->status == EM_OK)
        return em_error(EM_ERR_STATE, "%s: failed without reporting why", prefix);
    return em_error(c->status, "%s: %s", prefix, c->message);
}

em_status em_error_null(const char *fn, const char *arg) {
    em_context *c = em_ctx();
    /* A NULL argument is usually the result of an earlier failed op: keep
     * that error, which says what really went wrong. */
    if (c->status != EM_OK) return c->status;
    return em_error(EM_ERR_NULL, "%s: %s is NULL", fn, arg);
}

/* ---- Autocast: a stack of dtypes per thread ---- */

em_status em_autocast_begin(em_dtype dtype) {
    em_context *c = em_ctx();
    if (dtype != EM_F16 && dtype != EM_BF16 && dtype != EM_F32)
        return em_error(EM_ERR_DTYPE, "em_autocast_begin: autocast is to f16 or bf16 (f32: off), not %s",
                        (unsigned)dtype < EM_DTYPE_COUNT ? em_dtype_name(dtype) : "an unknown dtype");
    if (c->nautocast == EM_AUTOCAST_DEPTH)
        return em_error(EM_ERR_STATE, "em_autocast_begin: more than %d nested scopes", EM_AUTOCAST_DEPTH);
    c->autocast[c->nautocast++] = dtype;
    return EM_OK;
}

em_status em_autocast_end(void) {
    em_context *c = em_ctx();
    if (c->nautocast == 0) return em_error(EM_ERR_STATE, "em_autocast_end: no autocast scope is open");
    c->nautocast--;
    return EM_OK;
}

em_dtype em_autocast_dtype(void) {
    const em_context *c = em_ctx();
    return c->nautocast ? c->autocast[c->nautocast - 1] : EM_F32;
}

const char *em_last_error(void) { return em_ctx()->message; }
em_status em_last_status(void) { return em_ctx()->status; }

void em_clear_error(void) {
    em_context *c = em_ctx();
    c->status = EM_OK;
    c->message[0] = '\0';
}

const char *em_status_name(em_status s) {
    switch (s) {
    case EM_OK: return "EM_OK";
    case EM_ERR_NULL: return "EM_ERR_NULL";
    case EM_ERR_SHAPE: return "EM_ERR_SHAPE";
    case EM_ERR_DIM: return "EM_ERR_DIM";
    case EM_ERR_DTYPE: return "EM_ERR_DTYPE";
    case EM_ERR_DEVICE: return "EM_ERR_DEVICE";
    case EM_ERR_OVERFLOW: return "EM_ERR_OVERFLOW";
    case EM_ERR_NOMEM: return "EM_ERR_NOMEM";
    case EM_ERR_INDEX: return "EM_ERR_INDEX";
    case EM_ERR_ARG: return "EM_ERR_ARG";
    case EM_ERR_STATE: return "EM_ERR_STATE";
    case EM_ERR_UNSUPPORTED: return "EM_ERR_UNSUPPORTED";
    case EM_ERR_IO: return "EM_ERR_IO";
    }
    return "EM_ERR_UNKNOWN";
}

/* ---- Allocation ---- */

/* The default allocator keeps a few freed blocks per thread and hands them
 * out again.  Big blocks: a fresh block of 64 KiB or more costs a page
 * fault per 4 KiB on first touch (2 ms for 16 MiB here), which would
 * dominate a memory-bound kernel; glibc maps such blocks afresh on each
 * malloc (its mmap threshold) or trims them back, so a compiled GPT-2 block
 * at 128 tokens, whose intermediates are 128-512 KiB, took 260 page faults
 * a call (10-15% of its time) before blocks of that size were kept too.  Small blocks (tensor headers, lazy mode's pending
 * tensors): posix_memalign and free cost about 60 ns a pair here, 40% of
 * recording an op in lazy mode; a per-thread free list costs a few ns.
 * Each block carries a 64-byte header with its size class. */
#define BIG_BLOCK ((size_t)64 << 10) /* blocks this large are kept when freed */
#define BIG_GRAIN ((size_t)64 << 10) /* size classes: multiples of 64 KiB */
#define BIG_SLOTS 32 /* a model's live intermediates: a few of each size */
#define BIG_KEEP ((size_t)256 << 20) /* at most this much kept per thread */
#define HEADER 64
#define SMALL_GRAIN 64               /* small size classes: multiples of 64 bytes */
#define SMALL_MAX 1024               /* blocks up to this size are kept when freed */
#define SMALL_CLASSES (SMALL_MAX / SMALL_GRAIN)
#define SMALL_KEEP 256               /* at most this many blocks kept per class */

typedef struct big_cache {
    void *blocks[BIG_SLOTS];
    size_t sizes[BIG_SLOTS];
    size_t total;
    int next; /* the slot to drop first */
    /* small blocks: a free list per class, linked through the block itself */
    void *small[SMALL_CLASSES];
    int nsmall[SMALL_CLASSES];
} big_cache;

static _Thread_local big_cache tls_big;
static pthread_key_t big_key;
static pthread_once_t big_once = PTHREAD_ONCE_INIT;

static void big_release(void *unused) {
    (void)unused;
    for (int i = 0; i < BIG_SLOTS; i++) {
        free(tls_big.blocks[i]);
        tls_big.blocks[i] = NULL;
    }
    tls_big.total = 0;
    for (int c = 0; c < SMALL_CLASSES; c++) {
        while (tls_big.small[c]) {
            void *p = tls_big.small[c];
            tls_big.small[c] = *(void **)p;
            free(p);
        }
        tls_big.nsmall[c] = 0;
    }
}

static void big_key_create(void) { pthread_key_create(&big_key, big_release); }

/* Registers the thread's cache for freeing at thread exit. */
static void cache_register(void) {
    pthread_once(&big_once, big_key_create);
    pthread_setspecific(big_key, &tls_big);
}

static size_t size_class(size_t size) {
    if (size <= SMALL_MAX) return size ? (size + SMALL_GRAIN - 1) / SMALL_GRAIN * SMALL_GRAIN : SMALL_GRAIN;
    return size >= BIG_BLOCK ? (size + BIG_GRAIN - 1) / BIG_GRAIN * BIG_GRAIN : size;
}

static void *small_take(size_t cls) {
    int c = (int)(cls / SMALL_GRAIN) - 1;
    char *p = tls_big.small[c];
    if (!p) return NULL;
    tls_big.small[c] = *(void **)p;
    tls_big.nsmall[c]--;
    return p + HEADER;
}

/* Keeps block p (header included) of small class cls; false when full. */
static bool small_keep(char *p, size_t cls) {
    int c = (int)(cls / SMALL_GRAIN) - 1;
    if (tls_big.nsmall[c] >= SMALL_KEEP) return false;
    if (tls_big.nsmall[c] == 0) cache_register();
    *(void **)p = tls_big.small[c]; /* the header's first word: the class is written again on reuse */
    tls_big.small[c] = p;
    tls_big.nsmall[c]++;
    return true;
}

static void *default_alloc(void *ud, size_t size, size_t align) {
    (void)ud;
    if (align > HEADER || size > SIZE_MAX - 2 * HEADER) return NULL;
    size_t cls = size_class(size);
    if (cls <= SMALL_MAX) {
        char *q = small_take(cls);
        if (q) {
            *(size_t *)(q - HEADER) = cls;
            return q;
        }
    }
    if (cls >= BIG_BLOCK) {
        for (int i = 0; i < BIG_SLOTS; i++) {
            if (tls_big.blocks[i] && tls_big.sizes[i] == cls) {
                char *p = tls_big.blocks[i];
                tls_big.blocks[i] = NULL;
                tls_big.total -= cls;
                return p + HEADER;
            }
        }
    }
    void *p = NULL;
    if (posix_memalign(&p, HEADER, cls + HEADER) != 0) return NULL;
    *(size_t *)p = cls;
    return (char *)p + HEADER;
}

static void default_free(void *ud, void *ptr) {
    (void)ud;
    char *p = (char *)ptr - HEADER;
    size_t cls = *(size_t *)p;
    if (cls <= SMALL_MAX && small_keep(p, cls)) return;
    if (cls < BIG_BLOCK || cls > BIG_KEEP) {
        free(p);
        return;
    }
    /* make room by dropping kept blocks, oldest slot first, so that the
     * sizes a program uses now replace those it used before */
    int slot = -1;
    for (int i = 0; i < BIG_SLOTS; i++) {
        int k = (tls_big.next + i) % BIG_SLOTS;
        if (slot < 0 && !tls_big.blocks[k]) slot = k;
    }
    while (slot < 0 || tls_big.total + cls > BIG_KEEP) {
        int k = tls_big.next;
        tls_big.next = (tls_big.next + 1) % BIG_SLOTS;
        if (!tls_big.blocks[k]) continue;
        free(tls_big.blocks[k]);
        tls_big.blocks[k] = NULL;
        tls_big.total -= tls_big.sizes[k];
        if (slot < 0) slot = k;
    }
    cache_register(); /* frees the blocks at thread exit */
    tls_big.blocks[slot] = p;
    tls_big.sizes[slot] = cls;
    tls_big.total += cls;
}

static const em_allocator default_allocator = {default_alloc, default_free, NULL};

void em_set_allocator(const em_allocator *a) { em_ctx()->alloc = a; }

const em_allocator *em_get_allocator(void) {
    const em_allocator *a = em_ctx()->alloc;
    return a ? a : &default_allocator;
}

void *em_malloc(size_t size) {
    void *p = em_get_allocator()->alloc(em_get_allocator()->ud, size, 64);
    if (!p) em_error(EM_ERR_NOMEM, "out of memory allocating %zu bytes", size);
    return p;
}

void *em_calloc(size_t n, size_t size) {
    if (size && n > SIZE_MAX / size) {
        em_error(EM_ERR_OVERFLOW, "allocation of %zu x %zu bytes overflows", n, size);
        return NULL;
    }
    void *p = em_malloc(n * size);
    if (p) memset(p, 0, n * size);
    return p;
}

void em_free_with(const em_allocator *a, void *p) {
    if (p) a->free(a->ud, p);
}

void em_free(void *p) { em_free_with(em_get_allocator(), p); }

/* ---- Scopes ---- */

int em_scope_begin(void) {
    em_context *c = em_ctx();
    if (c->nscopes == c->capscopes) {
        int cap = c->capscopes ? 2 * c->capscopes : 8;
        /* The scope stack uses libc directly: it belongs to the thread, not
         * to any allocator a user installs and removes. */
        em_scope_frame *s = realloc(c->scopes, sizeof *s * (size_t)cap);
        if (!s) {
            em_error(EM_ERR_NOMEM, "em_scope_begin: out of memory");
            return -1;
        }
        c->scopes = s;
        c->capscopes = cap;
    }
    c->scopes[c->nscopes] = (em_scope_frame){0};
    return ++c->nscopes;
}

em_status em_scope_end(void) {
    em_context *c = em_ctx();
    if (c->nscopes == 0) return em_error(EM_ERR_STATE, "em_scope_end: no scope is open");
    em_scope_frame *f = &c->scopes[c->nscopes - 1];
    /* Release newest first, so that a view dies before its base. */
    for (int i = f->n - 1; i >= 0; i--) {
        em_tensor *t = f->items[i];
        t->scope = 0;
        em_release(t);
    }
    free(f->items);
    c->nscopes--;
    if (c->nscopes == 0) {
        free(c->scopes);
        c->scopes = NULL;
        c->capscopes = 0;
    }
    return EM_OK;
}

static bool frame_push(em_scope_frame *f, em_tensor *t) {
    if (f->n == f->cap) {
        int cap = f->cap ? 2 * f->cap : 32;
        em_tensor **items = realloc(f->items, sizeof *items * (size_t)cap);
        if (!items) return false;
        f->items = items;
        f->cap = cap;
    }
    f->items[f->n++] = t;
    return true;
}

/* Removes t from frame f; false if f does not own it. */
static bool frame_remove(em_scope_frame *f, em_tensor *t) {
    for (int i = f->n - 1; i >= 0; i--) { /* usually the newest */
        if (f->items[i] == t) {
            memmove(&f->items[i], &f->items[i + 1], sizeof *f->items * (size_t)(f->n - i - 1));
            f->n--;
            return true;
        }
    }
    return false;
}

em_tensor *em_tensor_adopt(em_tensor *t) {
    em_context *c = em_ctx();
    if (!t || c->nscopes == 0) return t;
    if (!frame_push(&c->scopes[c->nscopes - 1], t)) {
        em_release(t);
        em_error(EM_ERR_NOMEM, "out of memory recording a tensor in its scope");
        return NULL;
    }
    t->scope = c->nscopes;
    return t;
}

em_tensor *em_keep(em_tensor *t) {
    if (!t) return NULL;
    em_context *c = em_ctx();
    if (c->nscopes == 0) return t; /* already the caller's */
    em_scope_frame *inner = &c->scopes[c->nscopes - 1];
    if (t->scope == c->nscopes && frame_remove(inner, t)) {
        t->scope = 0;
    } else {
        em_retain(t); /* not ours to move: the enclosing owner gets a new reference */
    }
    if (c->nscopes >= 2) {
        if (!frame_push(&c->scopes[c->nscopes - 2], t)) {
            em_release(t);
            em_error(EM_ERR_NOMEM, "em_keep: out of memory");
            return NULL;
        }
        t->scope = c->nscopes - 1;
    }
    return t;
}

void em_tensor_discard(em_tensor *t) {
    if (!t) return;
    em_context *c = em_ctx();
    if (t->scope && t->scope <= c->nscopes && frame_remove(&c->scopes[t->scope - 1], t))
        t->scope = 0;
    em_release(t);
}
