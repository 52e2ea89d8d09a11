/*
 * stdmod.h - the standard modules that array programs import: math,
 * functools, itertools, operator, typing, __future__, collections, os
 * (os.environ, os.path), time and sys, each with Python's names and
 * semantics for the part that exists (listed in shmap(7), STANDARD
 * MODULES).  A name a module does not have is an AttributeError (or
 * "cannot import name") naming it, never another value.
 *
 * Iterators are eager here, as map() and zip() are: itertools' functions
 * return lists, and the infinite ones (count, cycle, repeat without
 * times) do not exist.
 */
#ifndef SHMAP_STDMOD_H
#define SHMAP_STDMOD_H

#include "base/value.h"

/* The module [name] ("math", "os.path", "functools", ...), made at its
 * first call (any thread), or NULL: another name, or out of memory with
 * the error set.  Borrowed. */
Value *stdmod_namespace(const char *name);

/* Keeps [partial] (functools.partial, which builtins.c makes and
 * shard_map's decorator form uses) for the functools module, and makes
 * typing's forms subscriptable; main thread, at start-up.  0, or -1 with
 * the error set. */
int stdmod_register(Value *partial);

/* Adds a built-in [fn] as [name] to the module [m] (a Module). */
int stdmod_add(Value *m, const char *name, BuiltinFn fn, const char *doc);

/* A module's function; tables end with a NULL name. */
typedef struct StdFn {
  const char *name;
  BuiltinFn fn;
  const char *doc;
} StdFn;

/* stdmod_add for each entry of [fns]. */
int stdmod_add_all(Value *m, const StdFn *fns);

/* Fill the modules functools (beside partial), itertools and operator
 * (stdmod_func.c).  0, or -1 with the error set. */
int stdmod_functools(Value *m);
int stdmod_itertools(Value *m);
int stdmod_operator(Value *m);

#endif
