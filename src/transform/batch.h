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
 * applies the primitive's batching rule (array/prim_batch.h) to the
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

/* Registers vmap (also jax.vmap), the batching rules (prim_batch_install)
 * and the batch tracer's handlers.  Call once at start-up, after
 * jit_register.  0 or -1. */
int batch_register(Env *builtins);

/* A shard_map function [f] called on batched arguments (the innermost
 * tracer among them a batch tracer): a shard_map of the body's vmap over
 * the same mesh, the batch axis first and unsplit (P(None, ...)); the
 * results batched along it.  Same contract as shardmap_call. */
Value *batch_shard_map(Value *f, const CallArgs *a);

#endif
