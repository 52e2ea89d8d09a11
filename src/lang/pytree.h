/*
 * pytree.h - pytrees: values nested in tuples, lists and dicts, as JAX's
 * jax.tree_util defines them.
 *
 * A tuple, a list or a dict is a node whose children are its items (a
 * dict's in the order of its sorted keys, as JAX orders them); None is a
 * node with no children; an instance of a class registered with
 * jax.tree_util (lang/classes.h) is a custom node whose children its
 * flatten function gives, and whose auxiliary data is part of its
 * structure; a named tuple is a tuple that keeps its class; every other
 * value is a leaf.  The transformations
 * and control flow that carry pytrees (cond, while_loop, fori_loop, scan,
 * the tree_util built-ins) all flatten and rebuild them here, so they agree
 * on the order of the leaves.
 *
 * A tree's structure is kept as the tree itself: pytree_replace walks it
 * again, putting new leaves where the old ones were.  Semantics: JAX's
 * jax.tree_util (tree_flatten, tree_unflatten, tree_map, tree_leaves,
 * tree_structure).
 */
#ifndef SHMAP_PYTREE_H
#define SHMAP_PYTREE_H

#include <stdbool.h>

#include "base/value.h"

/* The leaves of a tree, borrowed from it, in order.  A custom node's
 * children are made by its flatten function (classes.h), perhaps anew:
 * [held] keeps them alive until pytree_leaves_free.  The first
 * PYTREE_INLINE leaves are kept in [inl] (v points there), so the
 * trees of most calls (a few arguments) allocate nothing: a PyLeaves is
 * used where it was declared, by pointer, never copied. */
#define PYTREE_INLINE 8
typedef struct PyLeaves {
  Value **v;
  int n, cap;
  Value *held;   /* a List of the custom nodes' children, or NULL */
  Value *inl[PYTREE_INLINE];
} PyLeaves;

/* Appends [v] (borrowed): 0, or -1 on out of memory. */
int pytree_push(PyLeaves *l, Value *v);

/* Frees the array of leaves (not the leaves) and what [held] holds; [l]
 * is empty after.  Every PyLeaves a flatten filled is freed so. */
void pytree_leaves_free(PyLeaves *l);

/* The positions of dict [d]'s items in JAX's order (its keys sorted; an
 * OrderedDict's own order): a new array of d->len + 1 entries (shm_free
 * it), or NULL with the error set (keys that do not order: TypeError, as
 * Python's sorted()). */
size_t *pytree_key_order(Value *d);

/* Whether [v] is a node: a tuple, list, dict (OrderedDict and
 * defaultdict too, which rebuild as themselves), None or a custom node;
 * a deque and a Counter are leaves, as JAX registers types exactly. */
bool pytree_is_node(const Value *v);

/* Whether [a] and [b] have the same structure, their leaves aside: 1 or
 * 0, or -1 with the error set (nested too deeply). */
int pytree_same_structure(Value *a, Value *b);

/* For the walks of a pytree prefix beside a tree (shard_map's specs,
 * vmap's axes): when [prefix] is a custom node of [tree]'s class (an
 * instance holding specs), the children of both, new tuples, into *[tk]
 * and *[pk], and 1; 0 when [prefix] is no such node (no error set); -1
 * with the error set, ValueError "[what] must be a pytree prefix of the
 * value: ..." when their auxiliary data (static fields) differ. */
int pytree_prefix_children(Value *tree, Value *prefix, Value **tk, Value **pk, const char *what);

/* Appends the leaves of [tree] to [out] for which [is_leaf] holds (all of
 * them when it is NULL); the others are static parts of the structure,
 * as control flow treats non-array leaves.  0, or -1 with the error set
 * (out of memory; a dict whose keys cannot be ordered: TypeError as
 * JAX's). */
int pytree_flatten(Value *tree, bool (*is_leaf)(Value *v), PyLeaves *out);

/* [tree] with the leaves that pytree_flatten(tree, is_leaf) gave replaced
 * by vals[*pos], vals[*pos + 1], ... (borrowed; *pos advanced): a new
 * reference, or NULL with the error set.  Dicts come back with their keys
 * in sorted order, as JAX's unflatten makes them. */
Value *pytree_replace(Value *tree, bool (*is_leaf)(Value *v), Value **vals, int *pos);

/* [tree] with each leaf (per [is_leaf]) replaced by fn(leaf, ctx), a new
 * reference or NULL with the error set (which fails the whole map): a new
 * tree, or NULL with the error set.  jax.tree_util.tree_map over C. */
Value *pytree_map(Value *tree, bool (*is_leaf)(Value *v), Value *(*fn)(Value *leaf, void *ctx),
                  void *ctx);

/* JAX's repr of [tree]'s structure (every non-node a leaf, "*"), as
 * jax.tree_util.tree_structure(tree) prints: "PyTreeDef((*, {'a': *}))".
 * A new Str, or NULL with the error set. */
Value *pytree_structure_repr(Value *tree);

/* JAX's is_leaf= (a callable, or NULL/None for none) in force on this
 * thread until pytree_is_leaf_leave(the returned previous one): every
 * flatten and replace then takes a value it calls true for a leaf, node
 * or not (jax.tree_util's functions that take is_leaf=). */
Value *pytree_is_leaf_enter(Value *is_leaf);
void pytree_is_leaf_leave(Value *prev);

/* The PyTreeDef (jax.tree_util.tree_structure) of [tree] under the
 * is_leaf= in force: a new reference, or NULL with the error set. */
Value *pytree_treedef(Value *tree);

/* Whether is_leaf= calls [t] a leaf: 1 yes, 0 no (or none in force), -1
 * with its error. */
int pytree_cut(Value *t);

/* A jax.tree_util function: bound as [name] there and, when [short_name]
 * is not NULL, as jax.tree.[short_name]. */
typedef struct TreeFn {
  const char *name, *short_name, *doc;
  BuiltinFn fn;
} TreeFn;

/* Binds the [n] functions [fns]: 0, or -1 out of memory. */
int pytree_add_fns(const TreeFn *fns, size_t n);

/* Registers jax.tree_util's key paths (pytree_path.c): the key classes,
 * keystr, tree_flatten_with_path, tree_leaves_with_path and
 * tree_map_with_path.  0, or -1. */
int pytree_path_register(void);

/* Registers jax.tree_util's tree_map, tree_leaves, tree_flatten,
 * tree_unflatten, tree_structure, in the jax.tree_util namespace and as
 * jax.tree.map, .leaves, .flatten, .unflatten, .structure.  0, or -1. */
int pytree_register(void);

#endif
