/*
 * builtins.h - the built-in functions of LANGUAGE.md §2, §5, §6, with
 * NumPy/JAX names, argument names and semantics, and the namespaces
 * `jnp`, `lax`, `jax`, `jax.lax`, `jax.numpy` that name the same functions.
 */
#ifndef SHMAP_BUILTINS_H
#define SHMAP_BUILTINS_H

#include "eval.h"

/* Binds every built-in (functions, dtype names, namespaces) into [e].
 * Called once by interp_init; 0 or -1 with the error set. */
int builtins_register(Env *e);

/* Registration helper for other subsystems (shard_map, jit, the debugger):
 * binds a C function [fn] as [name] in [e]. */
int builtins_add(Env *e, const char *name, BuiltinFn fn, const char *doc);

#endif
