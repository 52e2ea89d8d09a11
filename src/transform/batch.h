/*
 * batch.h - vmap: vectorizing a function over a batch axis (LANGUAGE.md
 * §10, "vmap is xmap with one axis"; semantics: jax.vmap and JAX's
 * batching interpreter, docs/autodidax.py).
 *
 * vmap(f, in_axes=0, out_axes=0, axis_name=None, axis_size=None)(*args)
 * runs f once, on batch tracers (trace.h, TR_BATCH): each holds the whole
 * batch of its argument with the position of the batch axis.  Every
 * operation reaches the primitive table through prim_apply, whose hook
 * gives the innermost trace among the operands its turn; a batch trace
 * applies the primitive's batching rule (its row's, array/prim.h) to the
 * batched values, or, where a rule leaves a case open, the primitive to
 * each example in turn.  Results that do not depend on the batch stay
 * unbatched.  So vmap nests, composes with grad and jit in every order,
 * and runs inside and around shard_map bodies.
 *
 * With axis_name, collectives over that name act across the batch:
 * psum/pmean/pmax/pmin reduce over it, all_gather stacks it, axis_index
 * is each example's position, axis_size and psum(1, name) its size.
 *
 * Python control flow on a batched value is an error (JAX's), pointing
 * to jnp.where, lax.cond and friends.
 */
#ifndef SHMAP_BATCH_H
#define SHMAP_BATCH_H

#include "lang/eval.h"

/* Registers vmap (also jax.vmap), the batching hooks
 * and the batch tracer's handlers.  Call once at start-up, after
 * jit_register.  0 or -1. */
int batch_register(Env *builtins);

/* ---- named batch traces, for xmap (transform/xmap.c) ---------------------- */

/* Opens a batch trace for named axis [name] (interned) of [size] on this
 * thread, innermost; returns its id. */
unsigned batch_begin(const char *name, int64_t size);

/* Marks xmap trace [id] as split over the mesh axes [axes] (a tuple of
 * names, borrowed) of total size [size] (axis_resources): its size is
 * then the device's block; collectives over its name reduce the block,
 * then across those mesh axes; axis_index and axis_size count the whole
 * axis (LANGUAGE.md §10). */
void batch_set_resources(unsigned id, Value *axes, int64_t size);

/* Closes trace [id], which must be this thread's innermost. */
void batch_end(unsigned id);

/* [x] (borrowed) batched by trace [id] along its axis [axis]: a new
 * reference, or NULL with the error set. */
Value *batch_wrap(unsigned id, Value *x, int axis);

/* Whether [v] varies along trace [id]'s axis (at any depth of batch
 * tracers). */
bool batch_carries(Value *v, unsigned id);

/* [v] with trace [id]'s axis as its leading positional axis, unbatched
 * by [id]: the batched value with its axis moved to the front, or [v]
 * repeated [size] times along a new front axis when it does not vary
 * along it.  A new reference, or NULL with the error set. */
Value *batch_unwrap_front(unsigned id, Value *v, int64_t size);

/* vmap(fun, in_axes, out_axes=0, axis_name=A) as a callable (a new
 * reference, or NULL with the error set), A the axis name of batch trace
 * [id] of this thread (None when it has none): for shard_map's batching
 * rule (shardmap_rules.c), whose body is the vmap of the user's. */
Value *batch_vmap_of(unsigned id, Value *fun, Value *in_axes);

/* The innermost trace of named axis [name] in scope on this thread: its
 * id, its (block) size and its resources (a borrowed tuple of mesh axes,
 * or NULL); false when no such axis is in scope. */
bool batch_axis_info(const char *name, unsigned *id, int64_t *size, Value **resources);

/* axis_index over the innermost vmap/xmap axis [name] in scope: each
 * index's position along the whole axis (a new reference); NULL without
 * an error when no such axis is in scope. */
Value *batch_axis_index(const char *name);

/* The (block) size of batch trace [id] of this thread, 0 if none. */
int64_t batch_trace_size(unsigned id);

/* Whether batch trace [id] is open on this thread, its (block) size
 * then written to [size]. */
bool batch_trace_open(unsigned id, int64_t *size);

/* batch_wrap, taking [x]'s reference (also on failure). */
Value *batch_wrap_steal(unsigned id, Value *x, int axis);

/* Whether [tree] has a batch tracer among its leaves. */
bool batch_has_leaf(Value *tree);

#endif
