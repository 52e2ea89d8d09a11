/*
 * partition.h - Auto mode's sharding propagation over a plan (shmap(7),
 * THE THREE MODES; semantics: GSPMD's propagation as JAX's jit applies
 * it to sharded arguments, in_shardings and out_shardings).
 *
 * From the shardings of a plan's inputs, each equation's sharding rule
 * (prim.h, PrimRules.sharding) gives its results' layout and the
 * resharding of its operands; a primitive without a rule has its operands
 * replicated.  The pass records, per equation, the communication a
 * per-device program needs there (all_gather, a local slice, all_to_all,
 * psum/pmax/pmin of partial results) with the source line and the
 * reason, as comments plan() prints.  A jit called on sharded arrays
 * returns its results laid out as the pass says, so eager (one primitive
 * at a time, spmd/sharding.c) and jit agree on values and shardings.
 */
#ifndef SHMAP_PARTITION_H
#define SHMAP_PARTITION_H

#include "spmd/sharding.h"
#include "transform/plan.h"

/* Propagates shardings through [p] from [in] (p->nin NamedSharding
 * values or NULL for an unsharded input; borrowed) over [mesh], writing
 * each output's NamedSharding (new references) to [out] (p->nout slots).
 * [want] (p->nout values or NULL; borrowed) are out_shardings asked for:
 * an output is laid out so, noting the reshard.  With [annotate], the
 * notes become p->notes (replacing any).  0, or -1 with the error set. */
int part_propagate(Plan *p, Mesh *mesh, Value *const *in, Value *const *want, Value **out,
                   bool annotate);

#endif

/* The mesh of the first sharded array among [leaves] (borrowed), else
 * that of [out_shardings] (a sharding or a tuple of them, or NULL), else
 * NULL: the mesh a jit call partitions over. */
Mesh *part_mesh(Value *const *leaves, int n, Value *out_shardings);

/* After a jit's compiled plan [p] ran on [leaves] (p->nin arrays,
 * borrowed) into [outs] (p->nout owned arrays): each output replaced by
 * a view laid out as propagation says (partition's eager agreement).
 * Nothing to do when no leaf is sharded.  0, or -1 with the error set. */
int part_lay_out(Plan *p, Value *const *leaves, Value **outs);

/* plan(f, *args) on sharded arguments (or with out_shardings): [p]'s
 * notes, from the leaves' shardings and the out_shardings asked for
 * (one sharding for every output, or a tuple of one per output).  0, or
 * -1 with the error set. */
int part_annotate_plan(Plan *p, Value *const *leaves, Value *out_shardings);
