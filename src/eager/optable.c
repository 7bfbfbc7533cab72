/* optable.c - em_op_table, built from ops.def. */
#include "cpu.h"

#define X(NAME, name, kind, nin, attrs, infer, cpu) em_status infer(const em_op_call *, em_meta *);
#include "ops.def"
#undef X

const em_op_info em_op_table[EM_OP_COUNT] = {
#define X(NAME, name, kind, nin, attrs, infer, cpu) [EM_OP_##NAME] = {name, kind, nin, attrs, infer, cpu},
#include "ops.def"
#undef X
};

/* Adding an op means adding its row: this catches a table edited halfway. */
_Static_assert(EM_OP_COUNT == 53, "ops.def changed: update this count and the op docs");
