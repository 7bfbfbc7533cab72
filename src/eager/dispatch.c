/* dispatch.c - the one dispatch point every op goes through.
 *
 * em_dispatch: check the inputs -> infer the result's meta -> hand the call
 * to the thread's hook (recording, lazy mode) or run it eagerly on the
 * inputs' device.  Keeping this the only path is what lets a later mode see
 * every op without the ops knowing. */
#include "eager.h"

#include <string.h>

/* The thread's mode (EMBER_JIT=1: lazy mode) starts before its hook is
 * first seen or changed: code that sets the hook aside and restores it (a
 * recording, em_force, a host read, em_call) must save the mode's hook, or
 * a mode started inside would be dropped by the restore, and the hook it
 * displaced (a recorder) would miss the ops after it. */
static void (*_Atomic mode_start_fn)(void); /* the registry's mode slot (eager.h) */

em_status em_register_mode_start(void (*fn)(void)) {
    if (!fn) return em_error(EM_ERR_NULL, "em_register_mode_start: the function is NULL");
    void (*old)(void) = NULL;
    if (atomic_compare_exchange_strong_explicit(&mode_start_fn, &old, fn, memory_order_acq_rel,
                                                memory_order_acquire) || old == fn)
        return EM_OK;
    return em_error(EM_ERR_STATE, "em_register_mode_start: another mode start is registered");
}

static void mode_start(em_context *c) {
    if (c->mode_started) return;
    c->mode_started = true;
    void (*fn)(void) = atomic_load_explicit(&mode_start_fn, memory_order_acquire);
    if (fn) fn();
}

em_dispatch_hook em_set_dispatch_hook(em_dispatch_hook h) {
    em_context *c = em_ctx();
    mode_start(c);
    em_dispatch_hook old = c->hook;
    c->hook = h;
    return old;
}

em_dispatch_hook em_begin_host_read(const em_tensor *t, const char *what) {
    em_dispatch_hook saved = em_set_dispatch_hook((em_dispatch_hook){0});
    if (saved.on_read) saved.on_read(saved.ud, t, what);
    return saved;
}

void em_end_host_read(em_dispatch_hook saved) { em_set_dispatch_hook(saved); }

/* Another thread may be giving t its values meanwhile (lazy mode publishes
 * the storage last, then clears ext_force): acquire loads, so that seeing
 * the storage means seeing the layout written before it. */
static bool has_storage(const em_tensor *t) {
    return __atomic_load_n(&t->storage, __ATOMIC_ACQUIRE) != NULL;
}

em_status em_force(const em_tensor *t) {
    if (!t) return em_error(EM_ERR_NULL, "em_force: tensor is NULL");
    if (has_storage(t)) return EM_OK;
    em_status (*compute)(em_tensor *) = __atomic_load_n(&t->ext_force, __ATOMIC_ACQUIRE);
    if (!compute)
        return has_storage(t) ? EM_OK
                              : em_error(EM_ERR_STATE, "the tensor has no data (and no way to compute it)");
    em_dispatch_hook saved = em_set_dispatch_hook((em_dispatch_hook){0});
    em_status s = compute((em_tensor *)t);
    em_set_dispatch_hook(saved);
    if (s == EM_OK && !has_storage(t)) s = em_error(EM_ERR_STATE, "computing a deferred tensor gave no data");
    return s;
}

static em_status check_inputs(const em_op_call *c) {
    const em_op_info *info = &em_op_table[c->op];
    if (info->nin >= 0 && c->nin != info->nin)
        return em_error(EM_ERR_ARG, "%s: takes %d inputs, got %d", info->name, info->nin, c->nin);
    for (int i = 0; i < c->nin; i++) {
        if (!c->in[i]) {
            char arg[32];
            snprintf(arg, sizeof arg, "input %d", i);
            return em_error_null(info->name, arg);
        }
        /* a deferred input is computed now, unless a mode takes the call */
        if (!c->in[i]->storage && !em_ctx()->hook.fn && em_force(c->in[i]) != EM_OK)
            return em_error_context("%s: input %d", info->name, i);
        if (i > 0 && !em_same_device(c->in[i]->device, c->in[0]->device)) {
            char a[32], b[32];
            return em_error(EM_ERR_DEVICE, "%s: input %d is on %s but input 0 is on %s",
                            info->name, i, em_device_name(c->in[i]->device, a, sizeof a),
                            em_device_name(c->in[0]->device, b, sizeof b));
        }
    }
    return EM_OK;
}

em_tensor *em_dispatch(em_op op, int nin, em_tensor *const *in, const em_op_attrs *a) {
    static const em_op_attrs no_attrs;
    em_op_call c = {op, nin, in, a ? a : &no_attrs};
    if ((unsigned)op >= EM_OP_COUNT) {
        em_error(EM_ERR_ARG, "invalid op %d", (int)op);
        return NULL;
    }
    em_context *ctx = em_ctx();
    mode_start(ctx);
    if (check_inputs(&c) != EM_OK) return NULL;
    /* zeroed field by field: a memset of the struct compiles to `rep stos`,
     * 9% of recording an op in lazy mode */
    em_meta m;
    m.ndim = 0;
    memset(m.sizes, 0, sizeof m.sizes);
    memset(m.strides, 0, sizeof m.strides);
    m.offset = 0;
    m.dtype = 0;
    m.device = nin > 0 ? in[0]->device : c.attrs->device;
    if (em_op_table[op].infer(&c, &m) != EM_OK) return NULL;
    if (ctx->hook.fn) return ctx->hook.fn(ctx->hook.ud, &c, &m);
    return em_dispatch_eager(&c, &m);
}

em_tensor *em_dispatch_eager(const em_op_call *c, const em_meta *m) {
    const em_op_info *info = &em_op_table[c->op];
    /* a hook (a recorder) may hand over inputs a mode deferred */
    for (int i = 0; i < c->nin; i++)
        if (!c->in[i]->storage && em_force(c->in[i]) != EM_OK) return NULL;
    if (info->kind == EM_KIND_VIEW) return em_tensor_view(c->in[0], m);
    if (info->kind == EM_KIND_COPY && em_is_contiguous(c->in[0])) {
        /* contiguous of a contiguous tensor is an alias, as in torch */
        em_meta v = *m;
        memcpy(v.strides, c->in[0]->strides, sizeof(int64_t) * (size_t)v.ndim);
        v.offset = c->in[0]->offset;
        return em_tensor_view(c->in[0], &v);
    }
    const em_backend *b = em_backend_for(m->device);
    if (!b) return NULL;
    /* an update writes its input 0 where it is: the result is a view of it */
    em_tensor *out = info->kind == EM_KIND_UPDATE ? em_tensor_view(c->in[0], m) : em_tensor_alloc(m);
    if (!out) return NULL;
    if (b->run(c, out) != EM_OK) {
        em_tensor_discard(out);
        return NULL;
    }
    return out;
}
