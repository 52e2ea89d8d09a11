/*
 * hostnp.h - host NumPy: the `numpy` module a script imports beside
 * jax.numpy (`import numpy as np`), with NumPy's defaults rather than
 * JAX's: float64 and int64 where NumPy makes them, `dtype=float` is
 * float64, and numpy.random draws NumPy's own numbers (hostnp_random.c).
 *
 * A host array is an ordinary shmap array of NumPy's dtype, so it meets
 * jax.numpy and the operators as any array of that dtype does (64-bit
 * arrays exist when asked for: LANGUAGE.md section 2).
 *
 * It is therefore immutable, as a jax.Array is: `a[i] = v` is JAX's
 * TypeError naming a.at[i].set(v).  NumPy's in-place writes are not here
 * because they would break what the layers below rely on: value.h's rule
 * that a shared value never changes (device threads read arrays with no
 * lock; jit plans keep the constants they closed over by reference, where
 * JAX bakes a copy at trace time), and array.h's views (zeros, ones and
 * full are broadcast views of one element; reshape, transpose and basic
 * slices share a buffer whatever function made them, so jnp.reshape of a
 * host array would see its later writes).  Doing it right takes a mark on
 * the buffer that every array result of numpy, of the operators and of
 * the array methods carries when its operands are host arrays and no
 * jax.Array, a copy wherever such a buffer would reach a jax.Array
 * (jnp.asarray, jnp functions' views, jit constants), writes through the
 * view's strides with NumPy's casting, in-place `a += b` on a name, and
 * copies of 0-d results of integer indexing (NumPy's scalars).  What of NumPy is
 * here is listed in shmap(7), HOST NUMPY; any other name is an
 * AttributeError naming it, never a jax.numpy function under NumPy's name.
 */
#ifndef SHMAP_HOSTNP_H
#define SHMAP_HOSTNP_H

#include "base/value.h"

/* The module [name] ("numpy", "numpy.random", "numpy.testing"), made at
 * the first call for any of them (any thread; the jax.numpy namespace,
 * whose functions most of NumPy's delegate to, exists by then), or NULL:
 * another name, or out of memory with the error set.  Borrowed. */
Value *hostnp_namespace(const char *name);

/* A `dtype=` argument read as NumPy reads it: the built-ins int and float
 * are int64 and float64 (ops_dtype_arg otherwise); -1 in [*out] for
 * None or absent.  0, or -1 with the error set. */
int hostnp_dtype_arg(Value *v, int *out);

/* [x] (borrowed) as NumPy's functions take an operand: Python numbers
 * and their lists as np.asarray makes them (float64, int64, bool), other
 * values as they are.  A new reference, or NULL with the error set. */
Value *hostnp_operand(Value *x);

/* Fills the numpy.random module's [globals] (a Dict): the legacy
 * functions over np.random's RandomState, RandomState and default_rng.
 * (hostnp_random.c) */
int hostnp_random_register(Value *globals);

#endif
