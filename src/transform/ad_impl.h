/*
 * ad_impl.h - what ad.c's differentiation machinery offers the rules of
 * primitives that differentiate sub-programs of their own (shard_map's
 * row, shardmap_rules.c): its JVP traces, linearizations and backward
 * pass.  Private to transform/; ad.h is the interface of the rest.
 */
#ifndef SHMAP_AD_IMPL_H
#define SHMAP_AD_IMPL_H

#include "transform/ad.h"
#include "transform/trace.h"

/* One differentiation in progress on this thread; [lin]: the linear trace
 * its tangents belong to (reverse mode), or NULL (forward mode). */
typedef struct JvpTrace {
  unsigned id;
  Trace *lin;
  struct JvpTrace *parent;
} JvpTrace;

/* What one linearization gave: the primal output tree, the linear plan
 * from the differentiated input leaves' tangents to the output leaves'
 * tangents, and its captured residuals. */
typedef struct Lin {
  Value *out;        /* primal output tree (JVP tracers stripped) */
  Value *aux;        /* has_aux: the aux tree, stripped; else NULL */
  Plan *plan;
  Value **caps;
  int ncap;
  int nout;          /* output leaves */
  bool shard_out;    /* the outputs are a shard_map body's (seed_share) */
} Lin;

/* The differentiation of this thread with trace [id], or NULL. */
JvpTrace *ad_jvp_find(unsigned id);
/* Opens [j] (on the caller's stack) as this thread's innermost
 * differentiation, recording into [lin] (NULL: forward mode). */
void ad_jvp_push(JvpTrace *j, Trace *lin);
/* Closes [j], this thread's innermost differentiation. */
void ad_jvp_pop(JvpTrace *j);
/* [tree] with every JVP tracer of [id] replaced by its primal: a new
 * tree, or NULL with the error set. */
Value *ad_strip(Value *tree, unsigned id);
/* The cotangents of [lin]'s differentiated leaves from the output leaves'
 * cotangents [ct_out] (NULL entries are zeros): a new array of new
 * references, or NULL with the error set. */
Value **ad_backward(const Lin *lin, Value **ct_out);
/* Releases what [l] holds and zeroes it. */
void ad_lin_free(Lin *l);

/* Releases [n] values (NULLs skipped) of a caller-owned array; and, with
 * ad_values_free, the shm_malloc'd array itself. */
void ad_values_free_n(Value **v, int n);
void ad_values_free(Value **v, int n);

#endif
