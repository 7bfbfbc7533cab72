/* print.c - a readable dump of a tensor, in the style of numpy/torch. */
#include "cpu.h"

#include <math.h>
#include <string.h>

#define EDGE 3 /* values shown at each end of a long dim */

static void print_value(FILE *f, const char *p, em_dtype d) {
    if (d == EM_BOOL) {
        fputs(*(const uint8_t *)p ? "true" : "false", f);
    } else if (d == EM_I32 || d == EM_I64) {
        fprintf(f, "%lld", (long long)em_load_i64(p, d));
    } else {
        double v = em_load_f64(p, d);
        if (isnan(v)) fputs("nan", f);
        else if (isinf(v)) fputs(v > 0 ? "inf" : "-inf", f);
        else fprintf(f, "%.6g", v);
    }
}

static void print_dim(FILE *f, const em_tensor *t, const char *base, int d, int indent) {
    size_t es = em_dtype_size(t->dtype);
    if (d == t->ndim) {
        print_value(f, base, t->dtype);
        return;
    }
    int64_t n = t->sizes[d];
    fputc('[', f);
    for (int64_t i = 0; i < n; i++) {
        if (n > 2 * EDGE && i == EDGE) {
            fputs(d == t->ndim - 1 ? "..., " : "...,\n", f);
            if (d != t->ndim - 1) fprintf(f, "%*s", indent + 1, "");
            i = n - EDGE;
        }
        print_dim(f, t, base + i * t->strides[d] * (int64_t)es, d + 1, indent + 1);
        if (i + 1 < n) {
            if (d == t->ndim - 1) fputs(", ", f);
            else fprintf(f, ",\n%*s", indent + 1, "");
        }
    }
    fputc(']', f);
}

em_status em_print(const em_tensor *t, FILE *f) {
    if (!t) return em_error_null("em_print", "tensor");
    if (!f) return em_error_null("em_print", "f");
    em_dispatch_hook saved = em_begin_host_read(t, "em_print");
    em_scope_begin();
    em_tensor *h = (em_tensor *)t;
    em_status s = t->storage ? EM_OK : em_force(t);
    if (s == EM_OK && (t->device.type != EM_CPU || !t->storage)) {
        s = em_error(EM_ERR_UNSUPPORTED, "em_print: only CPU tensors can be printed for now");
    }
    if (s == EM_OK) {
        char shape[160], dev[32];
        fprintf(f, "tensor(");
        if (em_numel(h) == 0) fputs("[]", f);
        else print_dim(f, h, em_data(h), 0, 7);
        fprintf(f, ", sizes=%s, dtype=%s, device=%s)\n",
                em_shape_str(h->ndim, h->sizes, shape, sizeof shape), em_dtype_name(h->dtype),
                em_device_name(h->device, dev, sizeof dev));
    }
    em_scope_end();
    em_end_host_read(saved);
    return s;
}
