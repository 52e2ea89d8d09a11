/*
 * hostnp.h - host NumPy: the `numpy` module a script imports beside
 * jax.numpy (`import numpy as np`), with NumPy's defaults rather than
 * JAX's: float64 and int64 where NumPy makes them, `dtype=float` is
 * float64, and numpy.random draws NumPy's own numbers (hostnp_random.c).
 *
 * A host array is a shmap array of NumPy's dtype whose buffer carries
 * the host NumPy mark (array.h, "Host NumPy arrays"), so it meets
 * jax.numpy and the operators as any array of that dtype does (64-bit
 * arrays exist when asked for: LANGUAGE.md section 2), and the host
 * writes it in place as NumPy does: `a[idx] = v` (basic, integer-array
 * and mask indices, v broadcast and cast unsafely) and `a op= v` on a
 * name (same_kind casting), every view (basic slices, reshape,
 * transpose, .T) seeing the write.
 *
 * Why a mark, and where it is kept.  The layers below rely on a shared
 * value never changing (value.h): device threads read arrays with no
 * lock, jit plans keep the constants they closed over by reference (JAX
 * bakes a copy at trace time), zeros/ones/full are broadcast views of
 * one element, and reshape, transpose and basic slices share a buffer
 * whatever function made them.  So the writable buffers are marked, and
 * the ownership rule is: a marked buffer is viewed by NumPy arrays only,
 * and only the thread that runs the program outside shard_map bodies
 * writes it.  It is kept at these places:
 *   - prim_apply settles every result (arr_np_settle): a NumPy array
 *     under numpy's functions (ARR_NP_HOST, set by this module's
 *     wrappers) and for operators, indexing and methods whose operands
 *     are NumPy arrays and no jax.Array (ARR_NP_AUTO); a jax.Array
 *     otherwise, copied when it would view a marked buffer.  A NumPy
 *     result never views an unmarked buffer either (zeros' broadcast
 *     element is materialised), so writes never reach a jax.Array.
 *   - val_call (eval.c) runs jax's built-in functions under ARR_NP_JAX
 *     and copies a NumPy array they return as it is (jnp.asarray(a),
 *     jax.device_put(a)); a jit or shard_map call gets copies of its
 *     NumPy arguments and returns none (hostnp_detach).
 *   - prim_bind gives the tracer copies of NumPy operands, and
 *     plan_add_const copies a NumPy array it is given (a trace returning
 *     a closed-over array), so a plan's constant is the value at trace
 *     time, as in JAX.
 *   - a write on a device thread (inside a shard_map body) is an error:
 *     the host thread is the only writer, and it waits for a shard_map
 *     call's devices, which read copies, before writing again.
 *   - 0-d results of integer indexing are copies (NumPy's scalars).
 *     A buffer may also say read-only (np.broadcast_to: no write) and
 *     0-d array (np.array(5.0), np.zeros(()): `a += 1` writes it in
 *     place, where other 0-d results, NumPy's scalars, are bound anew).
 * A script that never imports numpy runs none of this: each check is a
 * load of arr_np_live, false until numpy's first import.  What of NumPy is
 * here is listed in shmap(7), HOST NUMPY; any other name is an
 * AttributeError naming it, never a jax.numpy function under NumPy's name.
 */
#ifndef SHMAP_HOSTNP_H
#define SHMAP_HOSTNP_H

#include "array/array.h"
#include "base/value.h"
#include "lang/ast.h"

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

/* obj[key] = v for a NumPy array [obj]: the elements [key] selects
 * (NumPy's indexing) get [v] broadcast to their shape and cast to obj's
 * dtype (NumPy's unsafe casting; a str as float(), int() or bool() of
 * it, ValueError when it is no number); every view of obj sees them.  0, or
 * -1 with NumPy's error: ValueError "could not broadcast input array
 * from shape (2,) into shape (3,)", IndexError out of bounds, ValueError
 * "assignment destination is read-only" (np.broadcast_to), and an
 * error for a traced value or a device thread (hostnp_write.c). */
int hostnp_setitem(Value *obj, Value *key, Value *v);

/* cur op= rhs for a NumPy array [cur] (ndim >= 1, or a 0-d array, not
 * a NumPy scalar: array.h, Buffer's np_0d): cur op rhs written
 * into cur in place (NumPy's same_kind casting: "Cannot cast ufunc
 * 'add' output from dtype('float64') to dtype('int64') with casting rule
 * 'same_kind'"; a result of another shape is NumPy's "non-broadcastable
 * output operand" ValueError; np.broadcast_to's read-only result:
 * "output array is read-only").  A new reference to cur, or NULL. */
Value *hostnp_inplace(OpKind op, Value *cur, Value *rhs);

/* The operands of binary operator [op] of two arrays, at least one a
 * NumPy array, replaced (new references in [*a], [*b], which the caller
 * releases) by what NumPy computes with: a Python float beside an int or
 * bool array is float64 and a Python int beside a bool array int64 (JAX's
 * weak types would make float32 and int32), and `/` of ints or bools
 * divides float64s.  Idempotent.  0, or -1 with the error set. */
int hostnp_promote(OpKind op, Value **a, Value **b);

/* [v] (stolen: an array, or a tuple or list of them) with its arrays
 * made NumPy arrays (mark) or jax.Arrays (detach), copied where a buffer
 * is shared (array.h, arr_np_as); Python numbers untouched.  NULL on
 * out of memory. */
Value *hostnp_mark(Value *v);
Value *hostnp_detach(Value *v);

/* [f] (stolen: a builtin or bound method of numpy.random) wrapped to run
 * under NumPy's mode, its results NumPy arrays.  A new reference. */
Value *hostnp_wrap(Value *f);

/* An array method [bound] (stolen) of a NumPy array, wrapped so its
 * arrays are NumPy arrays, and copies where NumPy always copies (copy,
 * flatten, astype), never views.  Non-methods are returned as they are. */
Value *hostnp_method(Value *bound);

/* Fills the numpy.random module's [globals] (a Dict): the legacy
 * functions over np.random's RandomState, RandomState and default_rng.
 * (hostnp_random.c) */
int hostnp_random_register(Value *globals);

#endif
