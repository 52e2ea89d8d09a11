/*
 * collective.h - named-axis collectives over device threads.
 * (Being written; the function names below are fixed because prim.c's
 * table refers to them.)
 *
 * For each collective primitive X of prim.def (axis_index psum pmax pmin
 * all_gather psum_scatter ppermute all_to_all ragged_all_to_all) this
 * module defines its shape rule, kernel and replication (vma) rule with the
 * signatures of prim.h.
 */
#ifndef SHMAP_COLLECTIVE_H
#define SHMAP_COLLECTIVE_H

#include "prim.h"

#define COLLECTIVE_LIST(X) \
  X(axis_index) X(psum) X(pmax) X(pmin) X(all_gather) X(psum_scatter) \
  X(ppermute) X(all_to_all) X(ragged_all_to_all)

#define X(n)                                                              \
  int coll_shape_##n(const AVal *in, int nin, const Params *p, AVal *out); \
  int coll_kernel_##n(Array **in, int nin, const Params *p, Array **out);  \
  uint32_t coll_vma_##n(const uint32_t *in, int nin, const Params *p);
COLLECTIVE_LIST(X)
#undef X

#endif
