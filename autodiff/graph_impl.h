/* Private to autodiff/: the graph's storage, shared by graph.c (building), grad.c (backward
 * rules) and plan.c (planning and execution). */
#ifndef MR_GRAPH_IMPL_H
#define MR_GRAPH_IMPL_H

#include "autodiff/graph.h"

#define MR_NAME_MAX 96

typedef struct mr_gval {
    mr_val_kind kind;
    mr_dtype dtype;
    mr_shape shape;
    int32_t node;    /* MR_VAL_NODE: producing node; else -1 */
    int32_t slot;    /* MR_VAL_NODE: output index of that node */
    int32_t base;    /* MR_VAL_VIEW: the value it views */
    int64_t view_off; /* MR_VAL_VIEW: first element, counted in the base's elements */
    void *cdata;     /* MR_VAL_CONST: owned bytes */
    char name[MR_NAME_MAX];
} mr_gval;

typedef struct mr_gnode {
    mr_op_id op;
    int n_in, n_out;
    int32_t in[MR_OP_MAX_IO];  /* value ids; 0 for an optional input left out */
    int32_t out[MR_OP_MAX_IO]; /* value ids; 0 for an output left out */
    mr_op_params p;
} mr_gnode;

struct mr_graph {
    mr_gval *vals; /* vals[0] is the "none" value */
    int32_t nvals, capvals;
    mr_gnode *nodes;
    int32_t nnodes, capnodes;
    int32_t *params; /* value ids of params, in creation order */
    int32_t nparams, capparams;
    mr_status err;
    char errmsg[512];
    int allow_tf32; /* copied into the params of later GEMM nodes (mr_graph_set_allow_tf32) */
};

/* The value record for v (v must be valid). */
static inline const mr_gval *mr_graph_val(const mr_graph *g, mr_val v) { return &g->vals[v.id]; }

/* Non-zero when v names an existing value of g. */
int mr_graph_valid(const mr_graph *g, mr_val v);

#endif
