/* passes.c - the pass pipeline, as a flat list. */
#include "trace.h"

em_status tr_optimize(tr_graph *g, bool verify_each) {
    em_status s = verify_each ? tr_verify(g) : EM_OK;
    if (s == EM_OK) {
        tr_cse(g);
        if (verify_each) s = tr_verify(g);
    }
    if (s == EM_OK) {
        tr_dce(g);
        if (verify_each) s = tr_verify(g);
    }
    if (s == EM_OK) {
        tr_inputs_first(g);
        if (verify_each) s = tr_verify(g);
    }
    return s;
}
