/*
 * stdmod.h - the standard modules that array programs import: math,
 * functools, itertools, operator, typing, __future__, collections, os
 * (os.environ, os.path), time and sys, each with Python's names and
 * semantics for the part that exists (listed in shmap(7), STANDARD
 * MODULES).  A name a module does not have is an AttributeError (or
 * "cannot import name") naming it, never another value.
 *
 * Iterators are eager here, as map() and zip() are: itertools' functions
 * return lists, except the infinite ones (count, cycle, repeat without
 * times) and islice of them, which are lazy iterators (iter.h).
 */
#ifndef SHMAP_STDMOD_H
#define SHMAP_STDMOD_H

#include "base/value.h"
#include "lang/ops.h"

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
/* collections' defaultdict, Counter, OrderedDict and deque into [m],
 * [dict] being the built-in dict (stdmod_coll.c).  0, or -1 with the
 * error set. */
int stdmod_collections(Value *m, Value *dict);

/* d[key] for a [key] the dict [d] lacks: a defaultdict's factory's
 * value (stored), a Counter's 0 (not stored), else KeyError.  A new
 * reference, or NULL with the error set. */
Value *stdmod_dict_missing(Value *d, Value *key);

/* Attribute [name] of a defaultdict, Counter or OrderedDict [d] that a
 * dict lacks or has otherwise (default_factory; most_common, update,
 * subtract, elements, total; move_to_end, popitem, copy): a new
 * reference, or NULL with no error set when it has none. */
Value *stdmod_dict_attr(Value *d, const char *name);

/* Counter [a] [op] Counter [b]: + and - keep the positive counts, as
 * Python's; other operators are a TypeError.  A new Counter, or NULL
 * with the error set. */
Value *stdmod_counter_binary(OpKind op, Value *a, Value *b);
int stdmod_itertools(Value *m);
int stdmod_operator(Value *m);

/* ---- collections.deque (stdmod_deque.c) ----------------------------------
 * A deque is a List of kind LIST_DEQUE (value.h): a list to everything
 * that reads one, with the methods, bound, operators and class below. */

/* Adds collections.deque, the constructor and class, to the module [m].
 * 0, or -1 with the error set. */
int stdmod_deque_register(Value *m);

/* Whether [v] is a deque. */
bool stdmod_is_deque(const Value *v);

/* The class collections.deque (borrowed, immortal), what type() of a
 * deque gives; NULL before collections is imported (no deque exists). */
Value *stdmod_deque_class(void);

/* d.extend(it) and d += it for the deque [d]: the items of [it] pushed at
 * the right, those past maxlen dropping off the left.  0, or -1 with the
 * error set. */
int stdmod_deque_extend(Value *d, Value *it);

/* Attribute [name] of the deque [d]: maxlen or a bound method (append,
 * appendleft, pop, popleft, extend, extendleft, rotate, clear, copy,
 * count, index, remove, insert, reverse).  A new reference, or NULL with
 * the AttributeError "'collections.deque' object has no attribute ...". */
Value *stdmod_deque_attr(Value *d, const char *name);

/* [a] [op] [b] where one is a deque: deque + deque (a new deque of [a]'s
 * maxlen), deque * int and int * deque; anything else is Python's
 * TypeError ("can only concatenate deque (not \"list\") to deque").  A
 * new reference, or NULL with the error set. */
Value *stdmod_deque_binary(OpKind op, Value *a, Value *b);

/* The class of a value of collections' kinds that type() gives apart
 * from its base's: deque, OrderedDict (borrowed), or NULL for any other
 * value (defaultdict and Counter are dicts to type() here). */
Value *stdmod_class_of(const Value *v);

#endif
