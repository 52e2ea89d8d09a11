/*
 * xmap.h - xmap: named axes (LANGUAGE.md §10; semantics: seed
 * 001_71b408bfe3872e8c.txt, JAX's xmap tutorial).
 *
 * xmap(f, in_axes, out_axes)(*args) names axes of its arguments: each
 * array leaf's axis mapping ({position: name}, or [name, ..., ...] for
 * the leading positions) removes those positional axes and makes them
 * named axes of the value f sees.  Every named axis is a batch trace of
 * transform/batch.h carrying its name, opened in order of first
 * appearance, so every operation acts per named index (the batching
 * rules), operands broadcast by name (a value lacking a name is the same
 * along it), and the collectives, reductions (sum(z, axis=(0, 'x'))),
 * logsumexp, one_hot(..., axis='classes') and lax.pdot take names.  On
 * the way out, out_axes puts each named axis of a result at its position
 * (broadcasting a result that does not vary along a placed name); a named
 * axis the result carries and out_axes does not place is an error naming
 * it.  One name has one size within a call: an argument that disagrees is
 * the seed's error.
 *
 * Not yet: axis_resources (an error that says so; without them the call
 * is vectorised on the calling thread, the results the same).
 */
#ifndef SHMAP_XMAP_H
#define SHMAP_XMAP_H

#include "lang/eval.h"

/* Registers xmap (also jax.xmap) and lax.pdot.  0 or -1. */
int xmap_register(Env *builtins);

#endif
