/*
 * prim_batch.h - the batching rules of the array primitives
 * (PrimRules.batch, prim.h's contract; semantics: JAX's batching rules,
 * jax/_src/interpreters/batching.py and lax.py), for vmap.
 */
#ifndef SHMAP_PRIM_BATCH_H
#define SHMAP_PRIM_BATCH_H

#include "array/prim.h"

/* What a batching rule returns for a case it does not cover: the
 * interpreter then applies the primitive one example at a time. */
#define BATCH_BY_LOOP 1

/* Installs the rules into prim_table.  Called once, before any thread
 * runs, by the transformation that uses them. */
void prim_batch_install(void);

/* The batch size: the length of the first batched operand's batch axis
 * ([dims][i] >= 0), or 1 when none is batched. */
int64_t prim_batch_size(Value **in, const int *dims, int nin);

/* [x] (borrowed) with axis [from] moved to position [to] (a transpose;
 * a new reference, or NULL with the error set). */
Value *prim_batch_moveaxis(Value *x, int from, int to);

/* [x] repeated [b] times along a new leading axis, its own axes after it
 * (a new reference, or NULL with the error set). */
Value *prim_batch_repeat_front(Value *x, int64_t b);

#endif
