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

/* The module [name] ("math", "os.path", "typing", ...) or NULL;
 * borrowed, made by stdmod_register. */
Value *stdmod_namespace(const char *name);

/* Makes the modules and fills the built-ins' functools namespace [ft]
 * (which holds partial) with the rest of functools; main thread, at
 * start-up, once the interpreter's argv list exists (sys.argv is it).
 * 0, or -1 with the error set. */
int stdmod_register(Value *ft);

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

/* Fills functools' [ft], itertools' [it] and operator's [op] globals'
 * modules (stdmod_func.c). */
int stdmod_func_register(Value *ft, Value *it, Value *op);

#endif
