/*
 * ops.h - the operators and attribute access of the language, as thin
 * layers over the primitives (prim.h), with NumPy's broadcasting and JAX's
 * promotion.  The evaluator calls these for `a + b`, `a[i]`, `a.shape`.
 *
 * All return new references or NULL with the error set; operands borrowed.
 */
#ifndef SHMAP_OPS_H
#define SHMAP_OPS_H

#include "lang/ast.h"
#include "array/prim.h"
#include "base/value.h"

/* Binary arithmetic and bitwise operators.  Arrays (and numbers, which are
 * arrays): promote (dtype.h), broadcast, apply the primitive; `/` is true
 * division (ints give f32), `//` floor division, `%` Python's modulo
 * (sign of the divisor), `**` pow (integer_pow for a small integer
 * literal exponent), `@` matmul (dot_general).  Also str + str, tuple +
 * tuple, list + list, str/tuple/list * int.  Errors: "unsupported operand
 * types for +: 'str' and 'array'", broadcasting errors. */
Value *ops_binary(OpKind op, Value *a, Value *b);

/* x[index] for an array or tracer [x] by NumPy's indexing, with no
 * NumPy-scalar copy of a 0-d result: a basic index gives a view of x's
 * buffer (what hostnp_setitem writes through).  New reference or NULL. */
Value *ops_index_array(Value *x, Value *index);
/* (ops_binary and ops_compare, as prim_apply does, may reuse an operand
 * whose reference count is 1 as the result's buffer: pass only values you
 * own and drop afterwards, or hold a second reference.) */

/* As ops_binary, but the operands marked in [kept] (bit 0: a, bit 1: b)
 * are borrowed from bindings that outlive the call (the evaluator's
 * names, read without taking a reference): they are never overwritten as
 * the result, whatever their reference count.  Same results and errors
 * as ops_binary. */
Value *ops_binary_kept(OpKind op, Value *a, Value *b, unsigned kept);

/* a <op> b (borrowed) written into [dst], the array a binding is about
 * to drop for the result, when prim_binary_into can (an operator that is
 * one primitive on arrays that already agree: +, -, *, / of floats, or a
 * comparison ==, !=, <, <=, >, >=, whose result is bool): true when
 * done, false with nothing changed and no error, the result then to be
 * made the usual way (ops_binary_kept, ops_compare).  The same array as
 * theirs, bit for bit. */
bool ops_binary_into(OpKind op, Value *a, Value *b, Value *dst);

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

/* x[index] (x an array, borrowed) with JAX's out-of-range [mode] (a str,
 * borrowed: "fill"/"drop" give [fill_value], or NaN, the most negative
 * integer, True; "clip" and "promise_in_bounds" clamp; NULL or None is
 * indexing's own: an error eagerly): jnp.take's and x.at[...].get()'s.
 * A new reference, or NULL with ValueError for an unknown mode. */
Value *ops_getitem_mode(Value *x, Value *index, Value *mode, Value *fill_value);

/* obj.name: array attributes and methods (.shape .dtype .ndim .size .T
 * .reshape .astype .sum .mean .max .min .tolist .at ...), dict methods,
 * module members, mesh attributes.  Error "'array' object has no
 * attribute 'foo'". */
Value *ops_getattr(Value *obj, const char *name);

/* Names of the attributes of [obj], for tab completion: a List of Str. */
Value *ops_dir(Value *obj);

/* Converts numbers, nested lists/tuples of numbers and arrays to an Array
 * (jnp.asarray); [dtype] < 0 infers it.  Errors: "cannot convert 'str' to
 * an array"; OverflowError "Python int N too large to convert to int32"
 * where a Python int past int32 would make an integer array of an
 * inferred dtype (JAX's 32-bit default; dtype=int64 takes it). */
Value *ops_to_array(Value *v, int dtype);

/* JAX's OverflowError for Python int [x] where dtype [t] cannot hold it
 * ("Python int N too large to convert to int8"); always NULL. */
Value *ops_int_overflow(int64_t x, DType t);

/* -1 with that OverflowError when [v] is a Python int int32 cannot hold
 * (a weak int64 past JAX's 32-bit default), else 0. */
int ops_check_python_int(const Value *v);

/* int() of the float [d], truncated toward zero, into *out: 0, or -1
 * with Python's error (NaN: ValueError; infinity, or past the 64 bits a
 * Python int has here: OverflowError).  int() and %d share it. */
int ops_float_to_int(double d, int64_t *out);

/* len(obj). */
int ops_len(Value *obj, int64_t *out);

/* Iteration support for `for` and comprehensions: a List of items (arrays
 * iterate over their first axis; ranges are handled by the evaluator). */
Value *ops_iter_items(Value *obj);
/* list.extend: appends the items of iterable [x] to list [l] in place (a
 * list extended by itself gets its items once more, as Python's).  0, or
 * -1 with the error set (x not iterable, l made outside a shard_map body
 * being run, out of memory). */
int ops_list_extend(Value *l, Value *x);

/* Sorts the list [l] in place as Python's list.sort(key=, reverse=):
 * stable (a merge sort; with [reverse] equal items keep their order),
 * by `<` of the items or of key(item) ([key] NULL or None: the items),
 * each key computed once.  0, or -1 with the error a key or a comparison
 * raised ([l] then keeps its order). */
int ops_list_sort(Value *l, Value *key, bool reverse);

/* Reverses the list [l] in place (list.reverse, reversed()). */
void ops_list_reverse(Value *l);

/* Registers attribute access for a value type defined by a later subsystem
 * (V_MESH, V_PSPEC, V_PLAN, ...): ops_getattr calls [fn], which returns a
 * new reference or NULL with the error set.  Call at start-up. */
void ops_register_getattr(VType t, Value *(*fn)(Value *self, const char *name));  /* hook */

/* Registers [fn] as `==` between two values of type [t] (a type a higher
 * layer owns: PartitionSpec); ops_equal_hook calls it: 1 or 0, or -1 when
 * none is registered for the pair. */
void ops_register_equal(VType t, bool (*fn)(Value *a, Value *b));  /* hook */
int ops_equal_hook(Value *a, Value *b);

/* Makes the opaque values of type [ot] subscriptable: obj[index] calls
 * [fn] (a new reference, or NULL with the error set).  Main thread, at
 * start-up; a few types at most (typing's forms). */
void ops_register_getitem(const OpaqueType *ot, Value *(*fn)(Value *self, Value *index));  /* hook */

/* ---- helpers shared with builtins.c ------------------------------------------
 * The jax.numpy layer's building blocks.  Operands are V_ARRAY or V_TRACER
 * (borrowed); results are new references or NULL with the error set. */

/* True for arrays and tracers (numbers are 0-d arrays). */
bool ops_is_array(const Value *v);

/* The aval of an array or tracer; error "expected an array, got 'str'". */
int ops_aval(Value *v, AVal *out);

/* convert_element_type to [t] with weak flag [weak]; [x] itself when it
 * already is; a weak 0-d concrete constant is remade in [t] directly. */
Value *ops_convert(Value *x, DType t, bool weak);

/* broadcast_in_dim to [shape] with NumPy's trailing alignment; [x] itself
 * when the shape already matches.  ERR_VALUE "Incompatible shapes for
 * broadcasting: (3,) and requested shape (2, 4)". */
Value *ops_broadcast_to(Value *x, int ndim, const int64_t *shape);

/* prim_apply that never overwrites its operands: prim_apply may reuse an
 * operand whose refcount is 1 as its output (prim.h); this holds one more
 * reference to each for the call.  Every helper below applies primitives
 * this way, so operands stay intact; only ops_binary, ops_unary and
 * ops_compare let prim_apply reuse an operand the caller holds alone. */
Value *ops_apply(PrimId id, int n, Value **in, const Params *p);

/* Elementwise primitive [id] of [n] (<= 8) operands after JAX promotion and
 * NumPy broadcasting (rank-0 operands stay rank 0). */
Value *ops_elementwise(PrimId id, int n, Value **args);

/* A unary primitive with no parameters, applied as is. */
Value *ops_unary_prim(PrimId id, Value *x);

/* jnp.where(pred, on_true, on_false): select_n after promotion and
 * broadcasting of all three; a non-bool predicate is compared with 0. */
Value *ops_select(Value *pred, Value *on_true, Value *on_false);

/* jnp.matmul semantics (1-D operands, batch broadcasting) via dot_general. */
Value *ops_matmul(Value *a, Value *b);

/* out_sharding= given to the jnp/lax call being computed ([sh]; NULL or
 * None: none, borrowed until the leave): the dot_general and reshape
 * primitives made until ops_out_sharding_leave([the result]) carry it
 * as their "out_sharding" parameter, as JAX's do, so Explicit mode's
 * sharding rules do not call the result's layout ambiguous (the caller
 * lays the result out so afterwards).  Returns the one it replaces. */
Value *ops_out_sharding_enter(Value *sh);

/* Adds the out_sharding= being computed (ops_out_sharding_enter; none:
 * nothing) to a primitive's params [p]: Explicit mode's rules then take
 * the result's layout as the caller's (dot_general, reshape, gather). */
void ops_add_out_sharding(Params *p);
void ops_out_sharding_leave(Value *prev);

/* dot_general of the promoted operands with contracting dims lc/rc and
 * batch dims lb/rb; [preferred] < 0 means the promoted dtype. */
Value *ops_dot_general(Value *a, Value *b, int nc, const int64_t *lc, const int64_t *rc,
                       int nb, const int64_t *lb, const int64_t *rb, int preferred);

/* lax.reshape to [shape] (one -1 allowed, inferred); ERR_VALUE "cannot
 * reshape array of size 6 into shape (4,)".  [x] itself when unchanged. */
Value *ops_reshape(Value *x, int ndim, const int64_t *shape);

/* lax.transpose by [perm] (already validated); [x] itself when identity. */
Value *ops_transpose(Value *x, int ndim, const int *perm);

/* lax.expand_dims / lax.squeeze at [dims] (already normalised). */
Value *ops_expand_dims(Value *x, int n, const int64_t *dims);
Value *ops_squeeze(Value *x, int n, const int64_t *dims);

/* Reduction primitive [id] (reduce_sum, reduce_max, argmax, ...) over
 * [axes]; keepdims re-inserts them with expand_dims. */
Value *ops_reduce(PrimId id, Value *x, int naxes, const int *axes, bool keepdims);

/* NumPy's `axis` argument (None: all, an int, or a tuple of ints) for rank
 * [ndim], normalised; errors for out-of-range and repeated axes. */
int ops_axes_arg(Value *axis, int ndim, int *naxes, int *axes);

/* Python's slice.indices for a sequence of [len]: the start, step and
 * count of slice [sv].  0, or -1 with the error set (a zero step). */
int ops_slice_indices(Value *sv, int64_t len, int64_t *start, int64_t *step, int64_t *n);

/* l[key] = seq and del l[key] of a list: an int or a slice key, with
 * Python's errors.  0 or -1. */
int ops_list_setitem(Value *l, Value *key, Value *v);
int ops_list_delitem(Value *l, Value *key);

/* Splits an `axis=` argument that mixes positions and names (xmap's named
 * axes, vmap's axis_name; seed 001: sum(z, axis=(0, 'x', 'y'))): [*pos]
 * gets the positions (a new tuple; the axis itself when it has no name),
 * [*names] a new tuple of the names, or NULL when there are none.  0, or
 * -1 with the error set (ERR_VALUE "repeated axis name: i"). */
int ops_split_named_axes(Value *axis, Value **pos, Value **names);

/* A reduction of [x] over the named axes [names] (a tuple of str; JAX's
 * reduction over a name is the collective over it, seed 001): [kind]
 * P_REDUCE_SUM (psum), P_REDUCE_MAX (pmax), P_REDUCE_MIN (pmin) or
 * P_REDUCE_PROD (all_gather over the name, then the product along it: JAX
 * has no pprod).  Each name is a vmap/xmap axis in scope or a mesh axis of
 * the enclosing shard_map body that no xmap axis_resources maps a name to;
 * any other is ERR_NAME "unbound axis name: k".  [*size] (when not NULL) gets the product of the names' sizes, the
 * divisor of a mean.  Set by the transform layer (transform/batch.c),
 * which owns named axes; NULL until then.  A new reference, or NULL with
 * the error set. */
extern Value *(*ops_named_reduce_hook)(PrimId kind, Value *x, Value *names, int64_t *size);  /* hook */

/* A value's named shape (`.named_shape`): a new dict from axis name to
 * size, {} outside xmap.  Set by the transform layer; NULL: always {}. */
extern Value *(*ops_named_shape_hook)(Value *x);  /* hook */

/* The attributes of arrays a higher layer defines (spmd/sharding.c:
 * x.sharding, x.addressable_shards, ...): a new reference, NULL with the
 * error set, or NULL with no error when [name] is not one of them. */
extern Value *(*ops_array_attr_hook)(Value *x, const char *name);  /* hook */

/* Explicit mode's rule for x.at[index] updates (spmd/sharding.c; JAX's
 * scatter rule): [x] may not be split over Explicit mesh axes along the
 * dimensions [touched] (bits) of which the index selects a part; JAX's
 * ShardingTypeError then (NULL, the error set), naming the operand, the
 * gather indices JAX's update makes (aval [ind], unsplit) and its
 * updates (aval [upd]: the value [y] broadcast, typed as y where their
 * trailing dimensions meet); else the sharding x's type gives the result
 * (a new reference), or NULL with no error when x is split over no
 * Explicit axis. */
extern Value *(*ops_scatter_type_hook)(Value *x, uint64_t touched, const AVal *ind, Value *y, const AVal *upd);  /* hook */  /* hook */

/* Explicit mode (spmd/sharding.c): whether [x] is split over an
 * Explicit mesh axis along one of the dimensions [dims] (bits); [ty]
 * ([cap] bytes) gets x's type as JAX's str of an aval prints it,
 * "float32[8@X,4]".  For the errors of JAX's rules of primitives shmap
 * composes from others (x[i, j]: one gather in JAX; top_k).  NULL: no
 * Explicit axes anywhere. */
extern bool (*ops_explicit_split_hook)(Value *x, uint64_t dims, char *ty, size_t cap);  /* hook */

/* Explicit mode (spmd/sharding.c; JAX's _sort_abstract_eval): the type
 * of lax.sort's results over the [n] operands [xs] of rank [ndim] sorted
 * together along [axis]: JAX's ShardingTypeError (NULL, the error set)
 * when one is split over an Explicit axis along [axis] or their types
 * differ; else the sharding of their one type (a new reference), or NULL
 * with no error when it splits nothing. */
extern Value *(*ops_sort_type_hook)(Value *const *xs, int n, int ndim, int axis);  /* hook */

/* Explicit mode (spmd/sharding.c; JAX's gather rule of
 * jnp.take_along_axis, the dimensions but [axis] batch dimensions): the
 * result's type, from [x]'s and [idx]'s where they split a batch
 * dimension (they may not split it differently), [axis] unsplit; JAX's
 * gather ShardingTypeError (NULL, the error set) when either splits
 * [axis] or they differ; NULL with no error when it splits nothing. */
extern Value *(*ops_take_along_type_hook)(Value *x, Value *idx, int axis);  /* hook */

/* A value of a higher layer's type that stands for an integer where an
 * array is built from a nested sequence (a jax Device: its id, so that
 * np.array(jax.devices()) is an array of ids): true with [*out] set. */
extern bool (*ops_index_hook)(const Value *v, int64_t *out);  /* hook */

/* ops_named_reduce_hook, or the error that no named axis is in scope. */
Value *ops_named_reduce(PrimId kind, Value *x, Value *names, int64_t *size);

/* A `dtype=` argument: a dtype value, a name string, or the built-ins
 * int/float/bool; None or NULL gives -1.  ERR_TYPE "data type 'x' not
 * understood". */
int ops_dtype_arg(Value *v, int *out);

/* A shape argument: an int or a tuple/list of ints. */
int ops_shape_arg(Value *v, int *ndim, int64_t *shape);

/* str.format: `{}`, `{0}`, `{name}` (a keyword argument of [a]), with
 * specs such as `{:.3f}` and `{:>8}`; values are printed by val_str when
 * no numeric spec applies.  Errors: a missing index or keyword. */
Value *ops_format(const char *fmt, const CallArgs *a);

/* fmt % values, Python's printf-style formatting of the str [fmt]: a
 * tuple [values] gives the arguments, anything else is the one argument
 * (a dict also the mapping `%(key)s` reads).  %d %i %u %o %x %X %e %E
 * %f %F %g %G %c %s %r %a %%, flags `-+ #0`, widths and precisions
 * (`*` too, from the arguments); numbers are Python numbers or size-1
 * arrays.  A new str.  Errors are Python's: TypeError for a wrong or
 * missing argument, one left over ("not all arguments converted"), a
 * traced number; ValueError for a bad or incomplete specification;
 * KeyError (ERR_INDEX) for a missing key.  Semantics: Python's
 * "printf-style String Formatting" (CPython's str.__mod__). */
Value *ops_percent_format(Value *fmt, Value *values);

/* str.strip() of the str [s]: without Python's white space (ASCII's and
 * Unicode's, '\u3000' ...) at either end.  A new reference (ops_str.c). */
Value *ops_str_strip(Value *s);

#endif
