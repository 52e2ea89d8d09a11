/*
 * ops_impl.h - what the three files of the operator layer share (not a
 * public interface: use ops.h).
 *
 *     ops.c        operand helpers, operators, comparisons, matmul and
 *                  reductions, conversion to arrays, len and iteration
 *     ops_index.c  NumPy indexing of arrays, Python sequence indexing,
 *                  the `x.at[idx]` update helpers
 *     ops_attr.c   attributes and methods of arrays, dicts, lists,
 *                  modules and dtypes; str.format
 *     ops_str.c    the methods of str, in code points
 *
 * Conventions as in ops.h: Value arguments borrowed, results new
 * references or NULL with the error set.
 */
#ifndef SHMAP_OPS_IMPL_H
#define SHMAP_OPS_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "array/prim.h"
#include "base/value.h"

/* A tuple or a list. */
bool ops_is_seq(const Value *v);

/* Primitive [id] of [n] operands with no parameters (through ops_apply:
 * the operands stay intact). */
Value *ops_apply_plain(PrimId id, int n, Value **in);

/* Primitive [id] of the one operand [x] with the parameters [p], which
 * are released afterwards. */
Value *ops_apply1(PrimId id, Value *x, Params *p);

/* Binary primitive [id] of [a] and the 0-d constant [v] made in [a]'s
 * dtype and weakness (jax.numpy's _constant_like). */
Value *ops_with_const(PrimId id, Value *a, double v);

/* Reads the Python index [index] of a sequence of length [len] (negative
 * counts from the end) into [*out].  ERR_TYPE "[what] indices must be
 * integers or slices, not str"; ERR_INDEX "[what] index out of range". */
int ops_seq_index(Value *index, int64_t len, const char *what, int64_t *out);

/* The `x.at` helper of the array [array] (ops_index.c); indexing it makes
 * the update reference whose .set/.add/.get do the functional update. */
Value *ops_at_new(Value *array, Value *index);

/* A method: its name and its C function (value.h's MethodFn). */
typedef struct Method {
  const char *name;
  MethodFn fn;
} Method;

/* The methods of str (ops_str.c), Python's, ending with {NULL, NULL}. */
extern const Method ops_str_methods[];

#endif
