/*
 * classes.h - Python's classes: the `class` statement's objects, their
 * instances and methods, and the library that builds on them: dataclasses,
 * enum.Enum, typing.NamedTuple and collections.namedtuple, and the
 * registration of classes as pytree nodes (jax.tree_util).
 *
 * Semantics are Python's for what array programs use: a class has one
 * base (single inheritance; `object` when none), a dict of attributes in
 * the order the body defined them; an instance has a class and a dict.
 * Looking up `x.name`: a property of the class (or its bases) first, then
 * the instance's dict, then the class's attribute (a function bound to x
 * as a method, a staticmethod's function, a classmethod bound to the
 * class), then `__getattr__`; else AttributeError naming the class and
 * the attribute.  The class body runs in its own scope that methods do
 * not see (as in Python), so a method names class attributes through
 * self or the class; `super()` finds the method's class in the scope the
 * methods close over (`__class__`, as CPython's cell) and self as the
 * frame's first argument.
 *
 * Classes are immortal (val_make_static): a program defines a handful,
 * once, and device threads share them; a named tuple points at its class
 * without a reference (value.h, VAL_NAMED).
 *
 * Pytrees.  A named tuple is a tuple, a pytree node by being one.  A class
 * registered with jax.tree_util.register_pytree_node (flatten and
 * unflatten functions), register_pytree_node_class (the class's
 * tree_flatten method and tree_unflatten classmethod) or
 * register_dataclass (data and meta fields) makes its instances custom
 * nodes: their children are what flattening gives, their auxiliary data is
 * part of the structure (compared with ==), and rebuilding calls the
 * unflatten side, as JAX does.  lang/pytree.c walks them, and through it
 * jit, grad, vmap, shard_map and the control flow.
 *
 * Every function here may run user code (a method) and so may fail with
 * any error; the values follow value.h's ownership rule.
 */
#ifndef SHMAP_CLASSES_H
#define SHMAP_CLASSES_H

#include <stdbool.h>

#include "lang/eval.h"

/* Registers object, super, property, staticmethod, classmethod in
 * [builtins]; dataclasses, enum, typing.NamedTuple,
 * collections.namedtuple and jax.tree_util's register_* in their
 * namespaces (builtins.c makes them); the hooks that make instances
 * callable, hashable, comparable and printable.  0, or -1 with the error
 * set.  Main thread, at start-up, after builtins_register. */
int cls_register(Env *builtins);

/* Makes the class of `class [name](bases): body`: [bases] (borrowed, n of
 * them, at most one a class) and the scope [body] the body ran in (its
 * bindings become the class's attributes, in the order of [stmts], the
 * body's statements; the scope is emptied); [cell] is the scope the
 * methods close over through [body], where `__class__` is bound to the
 * new class.  A new (immortal) class, or NULL with the error set
 * (TypeError for a base that is not a class, or several). */
Value *cls_new(const char *name, int nbases, Value **bases, Env *body, Env *cell,
               const NodeList *stmts);

/* Whether [v] is a class made by the class statement (or namedtuple). */
bool cls_is_class(const Value *v);

/* The class of [x] (borrowed) when [x] is an instance of a user class or
 * a named tuple, else NULL. */
Value *cls_class_of(Value *x);

/* isinstance(x, cls) for a user class [cls]: 1 or 0; -1 (no error set)
 * when [cls] is not one. */
int cls_isinstance(Value *x, Value *cls);

/* Sets attribute [name] of [obj] to [v] (borrowed): an instance's dict (a
 * property's setter, FrozenInstanceError for a frozen dataclass) or a
 * class's attributes.  0, or -1 with the error set ("'int' object has no
 * attribute 'x'" style for other values, as Python's). */
int cls_setattr(Value *obj, const char *name, Value *v);

/* For a class derived from a built-in exception class (class
 * MyError(ValueError)), or an instance of one: that built-in class's
 * index in exceptions.c (raise and except use it); else -1. */
int cls_exc_base(Value *v);

/* Whether [v] is an instance of a class statement's class (not a named
 * tuple, which is a tuple). */
bool cls_is_instance(const Value *v);

/* Makes values of opaque type [ot] (a higher layer's, e.g. aot.h's
 * Compiled) callable: calling one runs [call].  At start-up; at most 8
 * types. */
void cls_register_call(const OpaqueType *ot, Value *(*call)(Value *self, const CallArgs *a));  /* hook */

/* Whether the opaque value [f] is callable as cls_call calls it: a class,
 * a bound method, a staticmethod, an instance whose class has __call__
 * (Python's callable() asks only that the class has one), or a type
 * registered with cls_register_call.  Never an error. */
bool cls_callable(const Value *f);

/* Whether [v] is a custom pytree node: an instance of a registered class. */
bool cls_is_tree_node(const Value *v);

/* The children of custom node [v], a new tuple, and its auxiliary data
 * into *[aux] (a new reference; None when it has none).  NULL with the
 * error set when the flatten function fails or gives no (children, aux)
 * pair. */
Value *cls_tree_children(Value *v, Value **aux);

/* A node of the registered class [cls] with auxiliary data [aux] and
 * [children] (a tuple; both borrowed): the unflatten function's result,
 * a new reference, or NULL with the error set. */
Value *cls_tree_unflatten(Value *cls, Value *aux, Value *children);

/* Classes by number, in the order this process made them (namedtuple's
 * included): the same in every process of an MPI job, which run the same
 * program, so a result names its class so between them (spmd/xcall.c).
 * cls_from_id: the class (borrowed), or NULL for no such number. */
int cls_id(const Value *cls);
Value *cls_from_id(int id);

/* The name of [v]'s class, for pytree structures' repr ("Params"). */
const char *cls_name(const Value *cls);

/* Iterating over class [v] (cls_is_class): a new list of an enum's
 * members; TypeError for another class. */
Value *cls_iter_items(Value *v);

/* Class [obj][key] (cls_is_class): an enum's member by name, KeyError
 * when none; TypeError for another class. */
Value *cls_getitem(Value *obj, Value *key);

/* Attribute [name] of the named tuple [obj] (tuple_class(obj) set): its
 * field, _replace, _asdict, _fields, its class's attributes; else
 * AttributeError. */
Value *cls_getattr(Value *obj, const char *name);

/* functools.cached_property(func): a descriptor whose first read through
 * an instance calls func(instance) and stores the result in the
 * instance's dict under the attribute's name, where later reads find it
 * (Python's non-data descriptor); read through the class it is itself.
 * A named tuple has no dict: TypeError, as Python's.  (A BuiltinFn.) */
Value *cls_cached_property(const CallArgs *a);

/* `a == b` when either is an instance of a user class: the user's
 * __eq__, a dataclass's fields (same class, fields equal), else identity.
 * 1 or 0, -1 with the error set, or CLS_NOT_MINE when neither is one. */
#define CLS_NOT_MINE (-2)
int cls_equal(Value *a, Value *b);

#endif
