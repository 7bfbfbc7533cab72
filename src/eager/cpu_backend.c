/* cpu_backend.c - the CPU device's backend table. */
#include "cpu.h"

#include <string.h>

static bool cpu_available(em_device d) { return d.type == EM_CPU; }

static em_status cpu_alloc(em_device d, size_t nbytes, void **ptr) {
    (void)d;
    *ptr = em_malloc(nbytes);
    return *ptr ? EM_OK : em_last_status();
}

static void cpu_free(em_device d, void *ptr) {
    (void)d;
    em_free(ptr);
}

static em_status cpu_copy(void *dst, em_device dd, const void *src, em_device sd, size_t n) {
    if (dd.type != EM_CPU || sd.type != EM_CPU)
        return em_error(EM_ERR_DEVICE, "the CPU backend copies only between host buffers");
    if (n) memmove(dst, src, n);
    return EM_OK;
}

static em_status cpu_run(const em_op_call *c, em_tensor *out) {
    return em_op_table[c->op].cpu(c, out);
}

em_status cpu_view(const em_op_call *c, em_tensor *out) {
    (void)c;
    (void)out;
    return EM_OK; /* a view's data is its base's */
}

const em_backend em_cpu_backend = {
    .name = "cpu",
    .available = cpu_available,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .run = cpu_run,
};
