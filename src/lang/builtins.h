/*
 * builtins.h - the built-in functions of LANGUAGE.md §2, §5, §6, with
 * NumPy/JAX names, argument names and semantics, and the namespaces
 * `jnp`, `lax`, `jax`, `jax.lax`, `jax.numpy` that name the same functions.
 */
#ifndef SHMAP_BUILTINS_H
#define SHMAP_BUILTINS_H

#include "lang/eval.h"

/* Binds every built-in (functions, dtype names, namespaces) into [e].
 * Called once by interp_init; 0 or -1 with the error set. */
int builtins_register(Env *e);

/* [v] (borrowed) as an array of [dtype] (-1: the inferred one); a Python
 * number becomes an array without the host mark (a weak one keeps its
 * weak type): what an array function, or calling a dtype, makes of its
 * argument.  A new reference, or NULL with the error set. */
Value *bi_arr_dtype(Value *v, int dtype);

/* Registration helper for other subsystems (shard_map, jit, the debugger):
 * binds a C function [fn] as [name] in [e]. */
int builtins_add(Env *e, const char *name, BuiltinFn fn, const char *doc);

/* The namespace module [name] ("jnp", "lax", "jax", "jax.numpy", "jax.lax",
 * "jax.nn", "nn"), borrowed, so later subsystems can add members to its
 * globals dict; NULL (no error) for an unknown name or before
 * builtins_register ran. */
Value *builtins_namespace(const char *name);

/* type(x), as the built-in gives it: a class, printed <class 'name'>, the
 * same object for every value of the type (so `type(a) is type(b)`): int,
 * float, bool, str, list, tuple, dict, range, jax.Array (also for traced
 * values), an exception's class, `type` for a class, else the class of
 * the value's kind under Python's or JAX's name (NoneType, function,
 * builtin_function_or_method, method, module, slice, PjitFunction,
 * jax.sharding.Mesh, PartitionSpec, ...; `object` for any other).  A
 * new reference, never NULL once builtins_register ran. */
Value *builtins_type_of(Value *x);

/* The class type() gives for the opaque values whose type is named
 * [name] (one of builtins.c's table: "SymbolicZero", "CustomVJPPrimal",
 * "generator", ...), for the layer that makes such values to export
 * under its module.  Borrowed (classes live as long as the program), or
 * NULL with a ValueError for a name not in the table. */
Value *builtins_opaque_class(const char *name);

/* [a] op [b] for two sets or frozensets (value.h, val_is_set): | & - ^
 * (a new set of [a]'s kind) and the subset comparisons < <= > >= (a
 * bool); NULL with no error for any other operator or operands.
 * Semantics: Python's set types (builtins_set.c). */
Value *builtins_set_binary(OpKind op, Value *a, Value *b);

/* The method [name] of set [s], bound; NULL with Python's AttributeError
 * for any other name (a dict's methods are not a set's). */
Value *builtins_set_attr(Value *s, const char *name);

/* dir() of set [s]: its methods' names, a new list (NULL out of memory). */
Value *builtins_set_dir(Value *s);

/* Makes [cls] (a built-in that constructs values of VType [kind], e.g.
 * jax.sharding.Mesh) the class type() gives for them, and marks it a
 * class.  Main thread, at start-up, after builtins_register. */
void builtins_set_class(int kind, Value *cls);  /* hook */

/* Lays [x] (consumed) out as [sharding] (borrowed; NULL or None: as it
 * is): the `out_sharding=` of constructors, reshape and contractions
 * (JAX's Explicit mode).  Set by spmd/sharding.c (a device_put eagerly,
 * a sharding_constraint under a trace); a new reference or NULL with the
 * error set. */
extern Value *(*builtins_out_sharding_hook)(Value *x, Value *sharding);  /* hook */

/* Binds [v] (borrowed) as [name] in the namespace [ns] ("jnp", "lax",
 * "jax", "jax.nn"), e.g. builtins_add_to("lax", "psum", psum_builtin) so
 * `lax.psum` and `jax.lax.psum` resolve.  0, or -1 with the error set
 * (unknown namespace, out of memory).  Main thread, at start-up. */
int builtins_add_to(const char *ns, const char *name, Value *v);

/* The names classes_lib.c gives typing (NamedTuple, ClassVar) or
 * collections (namedtuple), made at start-up: a namespace the standard
 * module of that name takes in when it is made at its first import
 * (stdmod.c).  NULL for another name.  Borrowed. */
Value *builtins_classes_namespace(const char *name);

/* Registers jax.random (builtins_random.c) and the PRNG primitives' rules.
 * Main thread, at start-up. */
int builtins_random_register(Env *builtins);

#endif
