/*
 * ops.h - the operators and attribute access of the language, as thin
 * layers over the primitives (prim.h), with NumPy's broadcasting and JAX's
 * promotion.  The evaluator calls these for `a + b`, `a[i]`, `a.shape`.
 *
 * All return new references or NULL with the error set; operands borrowed.
 */
#ifndef SHMAP_OPS_H
#define SHMAP_OPS_H

#include "ast.h"
#include "value.h"

/* Binary arithmetic and bitwise operators.  Arrays (and numbers, which are
 * arrays): promote (dtype.h), broadcast, apply the primitive; `/` is true
 * division (ints give f32), `//` floor division, `%` Python's modulo
 * (sign of the divisor), `**` pow (integer_pow for a small integer
 * literal exponent), `@` matmul (dot_general).  Also str + str, tuple +
 * tuple, list + list, str/tuple/list * int.  Errors: "unsupported operand
 * types for +: 'str' and 'array'", broadcasting errors. */
Value *ops_binary(OpKind op, Value *a, Value *b);

/* -x, +x, ~x, not x. */
Value *ops_unary(OpKind op, Value *a);

/* ==, !=, <, <=, >, >= (elementwise on arrays, giving bool arrays), `in`,
 * `not in`, `is`, `is not`. */
Value *ops_compare(OpKind op, Value *a, Value *b);

/* obj[index]: arrays (NumPy basic and advanced indexing: ints, slices,
 * None, ..., integer and boolean arrays; out-of-range ints are errors
 * "index 5 is out of bounds for axis 0 with size 4"), tuples, lists,
 * strings, dicts, `x.at[idx]` helpers. */
Value *ops_getitem(Value *obj, Value *index);

/* obj.name: array attributes and methods (.shape .dtype .ndim .size .T
 * .reshape .astype .sum .mean .max .min .tolist .at ...), dict methods,
 * module members, mesh attributes.  Error "'array' object has no
 * attribute 'foo'". */
Value *ops_getattr(Value *obj, const char *name);

/* Names of the attributes of [obj], for tab completion: a List of Str. */
Value *ops_dir(Value *obj);

/* Converts numbers, nested lists/tuples of numbers and arrays to an Array
 * (jnp.asarray); [dtype] < 0 infers it.  Error "cannot convert 'str' to
 * an array". */
Value *ops_to_array(Value *v, int dtype);

/* len(obj). */
int ops_len(Value *obj, int64_t *out);

/* Iteration support for `for` and comprehensions: a List of items (arrays
 * iterate over their first axis; ranges are handled by the evaluator). */
Value *ops_iter_items(Value *obj);

#endif
