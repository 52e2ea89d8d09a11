/*
 * builtins_impl.h - what the files of the built-ins share (not a public
 * interface: other subsystems use builtins.h and ops.h).
 *
 * The built-ins are split by subject, each file ending with a table of
 * the names it binds:
 *     builtins.c         Python built-ins, files, print options; the
 *                        helpers below; registration and the namespaces
 *     builtins_array.c   creation and layout (arange, reshape, concatenate, ...)
 *     builtins_math.c    elementwise functions and contractions (einsum)
 *     builtins_reduce.c  reductions, nn helpers, dynamic slices, dtypes
 *     builtins_lax.c     jax.lax functions that take primitive parameters
 *
 * Conventions (the helpers' and every built-in's): Value arguments are
 * borrowed; a Value * result is a new reference or NULL with the error
 * set; int results are 0 or -1 with the error set.
 */
#ifndef SHMAP_BUILTINS_IMPL_H
#define SHMAP_BUILTINS_IMPL_H

#include <stdbool.h>
#include <stdint.h>

#include "array/array.h"
#include "array/prim.h"
#include "base/value.h"
#include "lang/ops.h"

/* ---- the tables ------------------------------------------------------------ */

/* Scopes a name is bound in: the global built-ins, the jnp (jax.numpy)
 * namespace, lax (jax.lax), jax.nn. */
enum { IN_TOP = 1, IN_JNP = 2, IN_LAX = 4, IN_NN = 8, IN_LINALG = 16 /* jnp.linalg */,
       IN_LAX_LINALG = 32 /* jax.lax.linalg */ };
#define NP (IN_TOP | IN_JNP)  /* NumPy names: global and jnp */

/* One binding: [fn] as [name] in the scopes [where], with a one-line
 * [doc] for help and completion.  Tables end with a NULL name. */
typedef struct BiEntry {
  const char *name;
  BuiltinFn fn;
  unsigned where;
  const char *doc;
} BiEntry;

extern const BiEntry bi_python_table[];  /* builtins.c */
extern const BiEntry bi_array_table[];   /* builtins_array.c */
extern const BiEntry bi_math_table[];    /* builtins_math.c */
extern const BiEntry bi_reduce_table[];  /* builtins_reduce.c */
extern const BiEntry bi_lax_table[];     /* builtins_lax.c */
extern const BiEntry bi_linalg_table[];  /* builtins_linalg.c */
extern const BiEntry bi_set_table[];     /* builtins_set.c */

/* ---- argument helpers (builtins.c) ------------------------------------------- */

/* Releases up to four references; NULLs are skipped. */
void bi_drop(Value *a, Value *b, Value *c, Value *d);

/* A tuple or a list. */
bool bi_is_seq(const Value *v);

/* An absent (NULL) or None argument. */
bool bi_is_none(const Value *v);

/* Reads the optional integer argument [v] of [fname] named [pname] into
 * [*out]; [dflt] when absent or None.  ERR_TYPE "f() argument 'n' must be
 * an integer, not str". */
int bi_int_arg(const char *fname, const char *pname, Value *v, int64_t dflt, int64_t *out);

/* The same for a number read as a double. */
int bi_float_arg(const char *fname, const char *pname, Value *v, double dflt, double *out);

/* Reads an optional truth value (val_truth); [dflt] when absent or None. */
int bi_bool_arg(Value *v, bool dflt, bool *out);

/* The [n] normalised axes [ax] as int64, in increasing order, into [out]
 * (the order expand_dims and squeeze take). */
void bi_sorted_axes(int n, const int *ax, int64_t *out);

/* ops_aval of an array or tracer, zeroed when [x] is neither. */
AVal bi_aval(Value *x);

/* [x] (borrowed) as an array (bi_arr_dtype with the inferred dtype). */
Value *bi_arr(Value *x);

/* The two operands [x], [y] (borrowed) of a binary array function as
 * arrays into [xa], [ya] (new references): a Python number beside an
 * array stays a Python number, so it meets the array's dtype as in an
 * operator (0.3 beside float64 is the double 0.3; 300 beside int8 is an
 * OverflowError); two Python numbers become weak arrays, as bi_arr makes
 * them (jnp.add(0.1, 0.2) computes in float32).  0, or -1 with the error
 * set and nothing to release. */
int bi_arr2(Value *x, Value *y, Value **xa, Value **ya);

/* ---- array helpers (builtins.c), all through primitives ----------------------- */

/* A 0-d constant of dtype [t] holding [v], not weak. */
Value *bi_scalar(DType t, double v);

/* lax.full: the constant [v] of dtype [t] broadcast to [shape]. */
Value *bi_fill(DType t, double v, int ndim, const int64_t *shape);

/* lax.broadcasted_iota: dtype [t], [shape], counting along [dim]. */
Value *bi_iota(DType t, int ndim, const int64_t *shape, int dim);

/* Elementwise binary [id] after promotion and broadcasting. */
Value *bi_bin(PrimId id, Value *a, Value *b);

/* [x] op the 0-d constant [v] in [x]'s dtype. */
Value *bi_bin_const(PrimId id, Value *x, double v);

/* [x] converted to its float dtype (ints and bool to float32), as
 * jax.numpy's promote_args_inexact does. */
Value *bi_inexact(Value *x);

/* [x] flattened to 1-D. */
Value *bi_ravel_of(Value *x);

/* [x] (an array, borrowed) sliced to [lo, hi) along axis [axis]
 * (normalised): lax.slice, a new reference or NULL with the error set. */
Value *bi_slice_axis(Value *x, int axis, int64_t lo, int64_t hi);

/* ---- shared between files --------------------------------------------------- */

/* The arrays of a sequence argument of [fname] (converted; at least one):
 * a new array of [*n] new references, freed with bi_free_arrays.
 * (builtins_array.c) */
Value **bi_arrays_arg(const char *fname, Value *seq, int *n);
void bi_free_arrays(Value **xs, int n);

/* lax.concatenate of [n] arrays, promoted to one dtype, along [axis]
 * (normalised); ERR_VALUE for 0-d operands. (builtins_array.c) */
Value *bi_concat(Value **xs, int n, int axis);

/* jnp.sum, jnp.max, jnp.min: the top-level sum/max/min use them for
 * arrays and Python's semantics otherwise. (builtins_reduce.c) */
Value *bi_jnp_sum(const CallArgs *a);
Value *bi_jnp_max(const CallArgs *a);
Value *bi_jnp_min(const CallArgs *a);

/* [r] (consumed) laid out as out_sharding= [sh] says (builtins.h,
 * builtins_out_sharding_hook); [r] itself when [sh] is NULL or None. */
static inline Value *bi_out_sharding(Value *r, Value *sh);

/* [f]([a]) with out_sharding= [sh] (NULL or None: none) given: the
 * dot_general and reshape it makes say so (ops.h,
 * ops_out_sharding_enter), and the result is laid out so. */
static inline Value *bi_with_out_sharding(Value *(*f)(const CallArgs *), const CallArgs *a,
                                          Value *sh) {
  Value *prev = ops_out_sharding_enter(sh);
  Value *r = f(a);
  ops_out_sharding_leave(prev);
  return bi_out_sharding(r, sh);
}

static inline Value *bi_out_sharding(Value *r, Value *sh) {
  if (!r || !sh || sh == VAL_NONE) return r;
  if (!builtins_out_sharding_hook) {
    val_decref(r);
    return err_set(ERR_NOT_IMPLEMENTED, "out_sharding= needs the sharding module");
  }
  Value *o = builtins_out_sharding_hook(r, sh);
  val_decref(r);
  return o;
}

/* int(s) ([want_int]) or float(s) of str [s], as Python parses it:
 * white space (Unicode's too, as str.strip() removes it) may surround
 * the number.  A new Python number, or NULL with Python's ValueError
 * ("could not convert string to float: 'abc'"). */
Value *bi_parse_str(Value *s, bool want_int);

#endif
