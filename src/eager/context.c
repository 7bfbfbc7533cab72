/* context.c - the per-thread context: last error, allocator, scope stack.
 *
 * Ember keeps no process-wide mutable state: what a call needs beyond its
 * arguments lives in its thread's context (like errno), which is freed when
 * the thread exits. */
#include "eager.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local em_context tls_ctx;

em_context *em_ctx(void) { return &tls_ctx; }

/* ---- Errors ---- */

em_status em_error(em_status s, const char *fmt, ...) {
    em_context *c = em_ctx();
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->message, sizeof c->message, fmt, ap);
    va_end(ap);
    c->status = s;
    return s;
}

em_status em_error_null(const char *fn, const char *arg) {
    em_context *c = em_ctx();
    /* A NULL argument is usually the result of an earlier failed op: keep
     * that error, which says what really went wrong. */
    if (c->status != EM_OK) return c->status;
    return em_error(EM_ERR_NULL, "%s: %s is NULL", fn, arg);
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
    }
    return "EM_ERR_UNKNOWN";
}

/* ---- Allocation ---- */

static void *default_alloc(void *ud, size_t size, size_t align) {
    (void)ud;
    void *p = NULL;
    if (posix_memalign(&p, align, size ? size : 1) != 0) return NULL;
    return p;
}

static void default_free(void *ud, void *p) {
    (void)ud;
    free(p);
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
