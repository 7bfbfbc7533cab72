/* safetensors.c - reading tensors from a .safetensors file.
 *
 * The format: an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
 * ..., optionally "__metadata__": {..}}), then the data section, offsets
 * relative to its start.  The file is mapped read-only; st_open checks
 * every entry against the data section once, so loading needs no further
 * checks. */
#include "minilm.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reference implementation refuses headers above 100 MB. */
#define ST_MAX_HEADER (100u << 20)

typedef struct st_dtype {
    const char *name;
    size_t size;
    em_dtype em;    /* EM_DTYPE_COUNT: recognized, but not loadable */
} st_dtype;

static const st_dtype dtypes[] = {
    {"F32", 4, EM_F32}, {"F16", 2, EM_F16}, {"BF16", 2, EM_BF16}, {"F64", 8, EM_F64},
    {"I64", 8, EM_I64}, {"I32", 4, EM_I32}, {"BOOL", 1, EM_BOOL},
    {"I8", 1, EM_DTYPE_COUNT}, {"U8", 1, EM_DTYPE_COUNT}, {"I16", 2, EM_DTYPE_COUNT},
    {"U16", 2, EM_DTYPE_COUNT}, {"U32", 4, EM_DTYPE_COUNT}, {"U64", 8, EM_DTYPE_COUNT},
};

static const st_dtype *find_dtype(const char *name) {
    for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++)
        if (!strcmp(dtypes[i].name, name)) return &dtypes[i];
    return NULL;
}

/* shape: an array of at most EM_MAX_DIMS non-negative integers; *numel
 * gets their product, checked against overflow. */
static bool read_shape(const js_doc *d, int node, st_entry *t, uint64_t *numel) {
    if (js_type_of(d, node) != JS_ARR) return false;
    *numel = 1;
    t->ndim = 0;
    for (int c = js_first(d, node); c >= 0; c = js_next(d, c)) {
        int64_t v;
        if (t->ndim == EM_MAX_DIMS || !js_int(d, c, &v) || v < 0) return false;
        if (v > 0 && *numel > UINT64_MAX / (uint64_t)v) return false;
        *numel *= (uint64_t)v;
        t->shape[t->ndim++] = v;
    }
    return true;
}

static bool read_offsets(const js_doc *d, int node, int64_t *b, int64_t *e) {
    int c0 = js_first(d, node), c1 = js_next(d, c0);
    return js_type_of(d, node) == JS_ARR && c0 >= 0 && c1 >= 0 && js_next(d, c1) < 0 &&
           js_int(d, c0, b) && js_int(d, c1, e);
}

static ml_status read_entry(const st_file *f, int node, st_entry *t, const char *path,
                            ml_error *e) {
    const js_doc *d = f->header;
    t->name = js_key(d, node);
    const char *dt = js_str(d, js_get(d, node, "dtype"));
    const st_dtype *ty = dt ? find_dtype(dt) : NULL;
    uint64_t numel;
    int64_t b, end;
    if (js_type_of(d, node) != JS_OBJ || !ty)
        return ml_fail(e, ML_ERR_FORMAT, "%s: tensor '%s' has a missing or unknown dtype", path, t->name);
    if (!read_shape(d, js_get(d, node, "shape"), t, &numel) || numel > SIZE_MAX / ty->size)
        return ml_fail(e, ML_ERR_FORMAT, "%s: tensor '%s' has a bad shape", path, t->name);
    if (!read_offsets(d, js_get(d, node, "data_offsets"), &b, &end) || b < 0 || end < b ||
        (uint64_t)end > f->data_len)
        return ml_fail(e, ML_ERR_FORMAT, "%s: tensor '%s' has data offsets outside the file's %zu data bytes",
                       path, t->name, f->data_len);
    if ((uint64_t)(end - b) != numel * ty->size)
        return ml_fail(e, ML_ERR_FORMAT, "%s: tensor '%s': %lld data bytes for %llu elements of %s",
                       path, t->name, (long long)(end - b), (unsigned long long)numel, dt);
    t->dtype_name = dt;
    t->begin = (size_t)b;
    t->nbytes = (size_t)(end - b);
    return ML_OK;
}

static ml_status read_header(st_file *f, const char *path, ml_error *e) {
    if (f->size < 8) return ml_fail(e, ML_ERR_FORMAT, "%s: %zu bytes, too short for a safetensors file", path, f->size);
    const unsigned char *p = f->map;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | p[i];
    if (n > ST_MAX_HEADER || n > f->size - 8)
        return ml_fail(e, ML_ERR_FORMAT, "%s: header length %llu does not fit in the file (%zu bytes)",
                       path, (unsigned long long)n, f->size);
    ml_error je = {""};
    if (!(f->header = js_parse((const char *)p + 8, (size_t)n, &je)))
        return ml_fail(e, ML_ERR_FORMAT, "%s: bad safetensors header: %s", path, je.msg);
    if (js_type_of(f->header, 0) != JS_OBJ)
        return ml_fail(e, ML_ERR_FORMAT, "%s: the header is not a JSON object", path);
    f->data = p + 8 + n;
    f->data_len = f->size - 8 - (size_t)n;
    int count = 0;
    for (int c = js_first(f->header, 0); c >= 0; c = js_next(f->header, c)) count++;
    if (!(f->entries = calloc((size_t)count + 1, sizeof *f->entries)))
        return ml_fail(e, ML_ERR_NOMEM, "out of memory");
    for (int c = js_first(f->header, 0); c >= 0; c = js_next(f->header, c)) {
        if (!strcmp(js_key(f->header, c), "__metadata__")) continue;
        ml_status s = read_entry(f, c, &f->entries[f->count], path, e);
        if (s != ML_OK) return s;
        f->count++;
    }
    return ML_OK;
}

ml_status st_open(st_file *f, const char *path, ml_error *e) {
    memset(f, 0, sizeof *f);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return ml_fail(e, ML_ERR_IO, "cannot open %s", path);
    struct stat sb;
    ml_status s = ML_OK;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) s = ml_fail(e, ML_ERR_IO, "%s is not a regular file", path);
    else if (sb.st_size == 0) s = ml_fail(e, ML_ERR_FORMAT, "%s is empty", path);
    else {
        f->size = (size_t)sb.st_size;
        f->map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f->map == MAP_FAILED) {
            f->map = NULL;
            s = ml_fail(e, ML_ERR_IO, "cannot map %s", path);
        }
    }
    close(fd);
    if (s == ML_OK) s = read_header(f, path, e);
    if (s != ML_OK) st_close(f);
    return s;
}

void st_close(st_file *f) {
    if (f->map) munmap(f->map, f->size);
    js_free(f->header);
    free(f->entries);
    memset(f, 0, sizeof *f);
}

const st_entry *st_find(const st_file *f, const char *name) {
    for (int i = 0; i < f->count; i++)
        if (!strcmp(f->entries[i].name, name)) return &f->entries[i];
    return NULL;
}

static bool same_shape(const st_entry *t, int ndim, const int64_t *shape) {
    if (ndim < 0) return true;
    if (t->ndim != ndim) return false;
    for (int i = 0; i < ndim; i++)
        if (t->shape[i] != shape[i]) return false;
    return true;
}

em_tensor *st_load_f32(const st_file *f, const char *name, int ndim, const int64_t *shape,
                       ml_error *e) {
    const st_entry *t = st_find(f, name);
    if (!t) return ml_fail(e, ML_ERR_MISSING, "the weights have no tensor '%s'", name), NULL;
    const st_dtype *ty = find_dtype(t->dtype_name);
    if (ty->em != EM_F32 && ty->em != EM_F16 && ty->em != EM_BF16)
        return ml_fail(e, ML_ERR_FORMAT, "tensor '%s' is %s, not a float type", name, ty->name), NULL;
    if (!same_shape(t, ndim, shape))
        return ml_fail(e, ML_ERR_FORMAT, "tensor '%s' does not have the shape config.json implies", name), NULL;
    em_scope_begin();
    em_tensor *x = em_from_data(f->data + t->begin, ty->em, t->ndim, t->shape, em_cpu());
    if (x && ty->em != EM_F32) x = em_cast(x, EM_F32);
    x = em_keep(x);
    em_scope_end();
    if (!x) ml_fail(e, ML_ERR_EMBER, "loading '%s': %s", name, em_last_error());
    return x;
}
