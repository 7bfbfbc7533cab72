/* plan.c - the graph-level cache entry (plan.h): key, text form, strict
 * parser.  The parser trusts nothing: a plan with a checksum that matches
 * can still come from an older Ember or another graph with a colliding
 * key, so every number is range-checked against the graph. */
#include "plan.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_VERSION 3 /* 2: the plan names its own key; 3: each kernel its buffers' abi */

bool jit_graph_key(const tr_graph *g, const char *backend, const char *target, kc_key *key,
                   kc_manifest *m) {
    char *text = tr_to_text(g);
    if (!text) return false;
    kc_fields f;
    kc_fields_begin(&f, m);
    kc_fields_str(&f, "what", "ember graph plan");
    kc_fields_u64(&f, "plan_format_version", PLAN_VERSION);
    kc_fields_u64(&f, "schedule_version", SC_VERSION);
    kc_fields_str(&f, "backend", backend);
    kc_fields_str(&f, "target", target);
    kc_fields_str(&f, "graph", text);
    *key = kc_fields_digest(&f);
    em_free(text);
    return true;
}

char *jit_plan_format(const jit_plan *p, size_t *n) {
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        em_error(EM_ERR_NOMEM, "plan: out of memory");
        return NULL;
    }
    char gk[KC_KEY_HEX_SIZE];
    kc_key_hex(&p->key, gk);
    fprintf(f, "ember-plan %d\ngraph %s\nsteps %d\n", PLAN_VERSION, gk, p->nsteps);
    for (int i = 0; i < p->nsteps; i++)
        fprintf(f, "%c %d\n", p->steps[i].kind == SC_KERNEL ? 'k' : 'e',
                p->steps[i].kind == SC_KERNEL ? p->steps[i].group : p->steps[i].node);
    fprintf(f, "kernels %d\n", p->nkernels);
    for (int i = 0; i < p->nkernels; i++) {
        const jit_plan_kernel *k = &p->kernels[i];
        char hex[KC_KEY_HEX_SIZE];
        kc_key_hex(&k->key, hex);
        char abi[KC_KEY_HEX_SIZE];
        kc_key_hex(&k->abi, abi);
        fprintf(f, "kernel %s %s %d %d", hex, abi, k->nbufs, k->nouts);
        for (int b = 0; b < k->nbufs; b++) fprintf(f, " %d", k->bufs[b]);
        fputc('\n', f);
    }
    if (fclose(f) != 0 || !text) {
        free(text);
        em_error(EM_ERR_NOMEM, "plan: out of memory");
        return NULL;
    }
    /* copy into em_malloc'd memory: callers free with em_free */
    char *out = em_malloc(len + 1);
    if (out) memcpy(out, text, len + 1);
    free(text);
    *n = len;
    return out;
}

/* ---- parsing ---- */

typedef struct cursor {
    const char *p, *end;
} cursor;

/* Reads the word w followed by one space or newline. */
static bool word(cursor *c, const char *w) {
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) <= n || memcmp(c->p, w, n) != 0) return false;
    if (c->p[n] != ' ' && c->p[n] != '\n') return false;
    c->p += n + 1;
    return true;
}

/* Reads a decimal integer in [lo, hi] and the one separator after it. */
static bool number(cursor *c, int lo, int hi, int *out) {
    long v = 0;
    const char *q = c->p;
    bool neg = q < c->end && *q == '-';
    if (neg) q++;
    if (q >= c->end || *q < '0' || *q > '9') return false;
    for (; q < c->end && *q >= '0' && *q <= '9'; q++) {
        v = v * 10 + (*q - '0');
        if (v > INT_MAX) return false;
    }
    if (neg) v = -v;
    if (q >= c->end || (*q != ' ' && *q != '\n') || v < lo || v > hi) return false;
    c->p = q + 1;
    *out = (int)v;
    return true;
}

/* 32 hex digits and the separator sep. */
static bool key_hex(cursor *c, kc_key *k, char sep) {
    char hex[KC_KEY_HEX_SIZE];
    if (c->end - c->p < 33 || c->p[32] != sep) return false;
    memcpy(hex, c->p, 32);
    hex[32] = '\0';
    c->p += 33;
    return kc_key_from_hex(hex, k);
}

static bool parse_steps(cursor *c, const tr_graph *g, jit_plan *p) {
    if (!word(c, "steps") || !number(c, 0, 4 * g->nnodes + 4, &p->nsteps)) return false;
    p->steps = em_calloc((size_t)p->nsteps + 1, sizeof *p->steps);
    if (!p->steps) return false;
    for (int i = 0; i < p->nsteps; i++) {
        sc_step *s = &p->steps[i];
        if (word(c, "e")) {
            s->kind = SC_EAGER;
            if (!number(c, 0, g->nnodes - 1, &s->node) || g->nodes[s->node].kind != TR_CALL)
                return false;
        } else if (word(c, "k")) {
            s->kind = SC_KERNEL;
            if (!number(c, 0, g->nnodes, &s->group)) return false;
        } else {
            return false;
        }
    }
    return true;
}

static bool parse_kernel(cursor *c, const tr_graph *g, jit_plan_kernel *k) {
    /* 0 buffers: a dead group, never run */
    if (!word(c, "kernel") || !key_hex(c, &k->key, ' ') || !key_hex(c, &k->abi, ' ') ||
        !number(c, 0, g->nnodes, &k->nbufs) ||
        !number(c, k->nbufs ? 1 : 0, k->nbufs, &k->nouts))
        return false;
    k->bufs = em_malloc(sizeof(int) * (size_t)k->nbufs + 1);
    if (!k->bufs) return false;
    for (int b = 0; b < k->nbufs; b++) {
        if (!number(c, 0, g->nnodes - 1, &k->bufs[b])) return false;
        /* results are computed nodes: never an input or a constant */
        if (b >= k->nbufs - k->nouts && g->nodes[k->bufs[b]].kind != TR_CALL) return false;
    }
    return c->p[-1] == '\n';
}

bool jit_plan_parse(const char *text, size_t n, const tr_graph *g, const kc_key *key,
                    jit_plan *out) {
    memset(out, 0, sizeof *out);
    cursor c = {text, text + n};
    int version;
    bool ok = word(&c, "ember-plan") && number(&c, PLAN_VERSION, PLAN_VERSION, &version) &&
              word(&c, "graph") && key_hex(&c, &out->key, '\n') &&
              kc_key_equal(&out->key, key) && parse_steps(&c, g, out) && word(&c, "kernels") &&
              number(&c, 0, g->nnodes, &out->nkernels);
    if (ok) {
        out->kernels = em_calloc((size_t)out->nkernels + 1, sizeof *out->kernels);
        ok = out->kernels != NULL;
    }
    for (int i = 0; ok && i < out->nkernels; i++) ok = parse_kernel(&c, g, &out->kernels[i]);
    for (int i = 0; ok && i < out->nsteps; i++)
        ok = out->steps[i].kind != SC_KERNEL || (out->steps[i].group < out->nkernels &&
                                                 out->kernels[out->steps[i].group].nbufs > 0);
    ok = ok && c.p == c.end;
    if (!ok) jit_plan_clear(out);
    return ok;
}

void jit_plan_abi(const tr_graph *g, const jit_plan_kernel *k, kc_key *abi) {
    kc_hasher h;
    kc_hasher_reset(&h);
    kc_hasher_update_str(&h, "ember kernel abi");
    kc_hasher_update_u64(&h, (uint64_t)k->nbufs);
    kc_hasher_update_u64(&h, (uint64_t)k->nouts);
    for (int b = 0; b < k->nbufs; b++) {
        const em_meta *m = &g->nodes[k->bufs[b]].meta;
        kc_hasher_update_u64(&h, (uint64_t)m->dtype);
        kc_hasher_update_u64(&h, (uint64_t)m->ndim);
        kc_hasher_update(&h, m->sizes, sizeof(int64_t) * (size_t)m->ndim);
        kc_hasher_update(&h, m->strides, sizeof(int64_t) * (size_t)m->ndim);
    }
    *abi = kc_hasher_digest(&h);
}

/* Marks v computed; false when it already was (a result written twice or
 * over an input). */
static bool define(bool *done, int v) {
    if (done[v]) return false;
    done[v] = true;
    return true;
}

static bool check_step(const tr_graph *g, const jit_plan *p, const sc_step *st, bool *done) {
    if (st->kind == SC_EAGER) {
        const tr_node *n = &g->nodes[st->node];
        for (int k = 0; k < n->nin; k++)
            if (!done[n->in[k]]) return false;
        return define(done, st->node);
    }
    const jit_plan_kernel *k = &p->kernels[st->group];
    for (int b = 0; b < k->nbufs - k->nouts; b++)
        if (!done[k->bufs[b]]) return false;
    for (int b = k->nbufs - k->nouts; b < k->nbufs; b++)
        if (!define(done, k->bufs[b])) return false;
    kc_key abi;
    jit_plan_abi(g, k, &abi);
    return kc_key_equal(&abi, &k->abi);
}

bool jit_plan_check(const tr_graph *g, const jit_plan *p) {
    bool *done = em_calloc((size_t)g->nnodes + 1, sizeof *done);
    bool ok = done != NULL;
    for (int i = 0; ok && i < g->nnodes; i++) done[i] = g->nodes[i].kind != TR_CALL;
    for (int i = 0; ok && i < p->nsteps; i++) ok = check_step(g, p, &p->steps[i], done);
    for (int o = 0; ok && o < g->noutputs; o++) ok = done[g->outputs[o]];
    em_free(done);
    em_clear_error();
    return ok;
}

void jit_plan_clear(jit_plan *p) {
    for (int i = 0; p->kernels && i < p->nkernels; i++) em_free(p->kernels[i].bufs);
    em_free(p->kernels);
    em_free(p->steps);
    memset(p, 0, sizeof *p);
}
