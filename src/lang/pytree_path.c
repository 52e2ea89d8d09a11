/*
 * pytree_path.c - jax.tree_util's key paths (pytree.h): where each leaf
 * sits in its tree, as a tuple of keys, and the functions that hand them
 * out (semantics: jax.tree_util, "Pytrees: key paths").
 *
 * A dict's entry is DictKey(key), a list's or tuple's item
 * SequenceKey(idx), a named tuple's field GetAttrKey(name), a custom
 * node's child FlattenedIndexKey(i) (its children in the order its
 * flatten gives them).  str() of a key is its piece of keystr's text:
 * "['a']", "[0]", ".name", "[<flat index 0>]".  The walk visits the
 * leaves in the order pytree_flatten gives them, with the same is_leaf=.
 */
#include <string.h>

#include "array/print.h"
#include "base/mem.h"
#include "base/strbuf.h"
#include "lang/builtins.h"
#include "lang/classes.h"
#include "lang/ops.h"
#include "lang/pytree.h"

/* ==== keys ==================================================================== */

enum { KEY_DICT, KEY_SEQ, KEY_ATTR, KEY_FLAT };

typedef struct Key {
  Opaque base;
  int kind;
  Value *v;   /* owned: the key, index or name */
} Key;

static const char *const key_field[] = {"key", "idx", "name", "key"};

static void key_free(Value *self) { val_decref(((Key *)self)->v); }

static Value *key_repr(Value *self) {
  Key *k = (Key *)self;
  Value *r = val_repr(k->v);
  if (!r) return NULL;
  StrBuf b = {0};
  sbuf_puts(&b, ((Opaque *)self)->ot->name);
  sbuf_puts(&b, "(");
  sbuf_puts(&b, key_field[k->kind]);
  sbuf_puts(&b, "=");
  sbuf_puts(&b, str_cstr(r));
  sbuf_puts(&b, ")");
  val_decref(r);
  Value *s = b.failed ? err_nomem() : str_new(b.data ? b.data : "", b.len);
  sbuf_free(&b);
  return s;
}

/* Its piece of keystr: ['a'], [0], .name, [<flat index 0>]. */
static Value *key_str(Value *self) {
  Key *k = (Key *)self;
  Value *r = k->kind == KEY_ATTR ? val_str(k->v) : val_repr(k->v);
  if (!r) return NULL;
  StrBuf b = {0};
  sbuf_puts(&b, k->kind == KEY_ATTR ? "." : k->kind == KEY_FLAT ? "[<flat index " : "[");
  sbuf_puts(&b, str_cstr(r));
  sbuf_puts(&b, k->kind == KEY_ATTR ? "" : k->kind == KEY_FLAT ? ">]" : "]");
  val_decref(r);
  Value *s = b.failed ? err_nomem() : str_new(b.data ? b.data : "", b.len);
  sbuf_free(&b);
  return s;
}

static Value *key_getattr(Value *self, const char *name) {
  Key *k = (Key *)self;
  if (!strcmp(name, key_field[k->kind])) return val_incref(k->v);
  return err_set(ERR_ATTRIBUTE, "'%s' object has no attribute '%s'", ((Opaque *)self)->ot->name, name);
}

static const OpaqueType key_types[] = {
  {"DictKey", key_free, key_repr, key_getattr, key_str, NULL, NULL},
  {"SequenceKey", key_free, key_repr, key_getattr, key_str, NULL, NULL},
  {"GetAttrKey", key_free, key_repr, key_getattr, key_str, NULL, NULL},
  {"FlattenedIndexKey", key_free, key_repr, key_getattr, key_str, NULL, NULL},
};

/* A new key of [kind] holding [v] (stolen). */
static Value *key_new(int kind, Value *v) {
  if (!v) return NULL;
  Key *k = shm_calloc(1, sizeof *k);
  if (!k) {
    val_decref(v);
    return err_nomem();
  }
  val_init(&k->base.hdr, V_OPAQUE);
  k->base.ot = &key_types[kind];
  k->kind = kind;
  k->v = v;
  return &k->base.hdr;
}

/* ==== the walk ================================================================= */

/* Deeper paths are an error, as deeper trees are to pytree_flatten. */
#define PYTREE_PATH_MAX 1000

typedef struct Walk {
  Value *paths, *leaves;   /* lists, in flatten's order */
  Value *path[PYTREE_PATH_MAX];
  int depth;
} Walk;

static int walk_at(Value *t, Walk *w);

/* The child [t] under key [k] (stolen). */
static int walk_child(Value *t, Value *k, Walk *w) {
  if (!k) return -1;
  if (w->depth >= PYTREE_PATH_MAX) {
    val_decref(k);
    return err_set(ERR_VALUE, "maximum recursion depth exceeded while walking a pytree"), -1;
  }
  w->path[w->depth++] = k;
  int rc = walk_at(t, w);
  val_decref(w->path[--w->depth]);
  return rc;
}

static int walk_leaf(Value *t, Walk *w) {
  Value *p = tuple_pack((size_t)w->depth, w->path);
  int rc = p && list_append_steal(w->paths, p) == 0 ? list_append(w->leaves, t) : -1;
  if (!p) err_nomem();
  return rc;
}

static int walk_at(Value *t, Walk *w) {
  int cut = pytree_is_node(t) ? pytree_cut(t) : 1;
  if (cut) return cut < 0 ? -1 : walk_leaf(t, w);
  if (t->type == V_NONE) return 0;
  if (t->type == V_OPAQUE) {   /* a custom node: its children in order */
    Value *aux, *kids = cls_tree_children(t, &aux);
    if (!kids) return -1;
    val_decref(aux);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < tuple_len(kids); i++)
      rc = walk_child(tuple_get(kids, i), key_new(KEY_FLAT, val_int((int64_t)i)), w);
    val_decref(kids);
    return rc;
  }
  if (t->type == V_DICT) {
    Dict *d = (Dict *)t;
    size_t *idx = pytree_key_order(t);
    int rc = idx ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < d->len; i++)
      rc = walk_child(d->vals[idx[i]], key_new(KEY_DICT, val_incref(d->keys[idx[i]])), w);
    shm_free(idx);
    return rc;
  }
  Value *cls = tuple_class(t), *fields = cls ? ops_getattr(cls, "_fields") : NULL;
  if (cls && !fields) return -1;
  size_t n;
  Value *const *items;
  val_seq(t, &n, &items);
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < n; i++)
    rc = walk_child(items[i], fields ? key_new(KEY_ATTR, val_incref(tuple_get(fields, i)))
                                     : key_new(KEY_SEQ, val_int((int64_t)i)), w);
  val_decref(fields);
  return rc;
}

/* [tree]'s leaves and their paths (new lists into *paths, *leaves), under
 * the is_leaf= in force: 0, or -1 with the error set. */
static int walk(Value *tree, Value **paths, Value **leaves) {
  Walk w = {.paths = list_new(0), .leaves = list_new(0)};
  int rc = w.paths && w.leaves ? walk_at(tree, &w) : (err_nomem(), -1);
  if (rc < 0) {
    val_decref(w.paths);
    val_decref(w.leaves);
    return -1;
  }
  *paths = w.paths;
  *leaves = w.leaves;
  return 0;
}

/* ==== the functions ============================================================ */

/* [(path, leaf), ...] of [paths] and [leaves]. */
static Value *pairs(Value *paths, Value *leaves) {
  Value *r = list_new(list_len(paths));
  for (size_t i = 0; r && i < list_len(paths); i++) {
    Value *t = tuple_pack(2, (Value *[]){list_get(paths, i), list_get(leaves, i)});
    if (!t || list_append_steal(r, t) < 0) {
      val_decref(r);
      return err_nomem();
    }
  }
  return r;
}

/* tree_leaves_with_path(tree, is_leaf=None), and tree_flatten_with_path
 * ([with_def]): the pairs, and the PyTreeDef. */
static Value *with_path(const CallArgs *a, const char *name, bool with_def) {
  Value *tree, *is_leaf = NULL, *paths = NULL, *leaves = NULL, *r = NULL;
  if (args_bind(name, a, "tree, is_leaf=", (Value **[]){&tree, &is_leaf}) < 0) return NULL;
  Value *prev = pytree_is_leaf_enter(is_leaf);
  if (walk(tree, &paths, &leaves) == 0) {
    Value *p = pairs(paths, leaves), *def = p && with_def ? pytree_treedef(tree) : NULL;
    r = !with_def ? val_incref(p) : def ? tuple_pack(2, (Value *[]){p, def}) : NULL;
    val_decref(p);
    val_decref(def);
  }
  pytree_is_leaf_leave(prev);
  val_decref(paths);
  val_decref(leaves);
  return r;
}

static Value *bi_leaves_with_path(const CallArgs *a) {
  return with_path(a, "tree_leaves_with_path", false);
}

static Value *bi_flatten_with_path(const CallArgs *a) {
  return with_path(a, "tree_flatten_with_path", true);
}

/* f(path, leaf, *leaves of rest) for each leaf of tree: the new tree. */
static Value *map_with_path(const CallArgs *a) {
  Value *f = a->args[0], *tree = a->args[1], *paths = NULL, *leaves = NULL, *r = NULL;
  int nt = a->nargs - 1;
  PyLeaves *rest = shm_calloc((size_t)nt, sizeof *rest);
  Value **args = shm_calloc((size_t)nt + 1, sizeof *args), **outs = NULL;
  size_t n = 0, done = 0;
  if (!rest || !args) {
    err_nomem();
    goto out;
  }
  if (walk(tree, &paths, &leaves) < 0) goto out;
  n = list_len(leaves);
  for (int t = 1; t < nt; t++) {
    int same = pytree_same_structure(tree, a->args[1 + t]);
    if (same < 0 || pytree_flatten(a->args[1 + t], NULL, &rest[t]) < 0) goto out;
    if (!same) {
      err_set(ERR_VALUE, "tree_map_with_path: tree %d does not have the structure of the first tree", t);
      goto out;
    }
  }
  if (!(outs = shm_calloc(n + 1, sizeof *outs))) {
    err_nomem();
    goto out;
  }
  Value *cut = pytree_is_leaf_enter(NULL);   /* f's own trees are flattened plainly */
  for (; done < n; done++) {
    args[0] = list_get(paths, done);
    args[1] = list_get(leaves, done);
    for (int t = 1; t < nt; t++) args[1 + t] = rest[t].v[done];
    if (!(outs[done] = val_call_n(f, nt + 1, args))) break;
  }
  pytree_is_leaf_leave(cut);
  if (done < n) goto out;
  int pos = 0;
  r = pytree_replace(tree, NULL, outs, &pos);
out:
  for (size_t i = 0; outs && i < done; i++) val_decref(outs[i]);
  for (int t = 0; rest && t < nt; t++) pytree_leaves_free(&rest[t]);
  shm_free(outs);
  shm_free(args);
  shm_free(rest);
  val_decref(paths);
  val_decref(leaves);
  return r;
}

/* tree_map_with_path(f, tree, *rest, is_leaf=None) */
static Value *bi_map_with_path(const CallArgs *a) {
  if (a->nargs < 2) return err_set(ERR_TYPE, "tree_map_with_path() missing required argument 'tree'");
  Value *is_leaf = NULL;
  for (int i = 0; i < a->nkw; i++) {
    if (strcmp(a->kwnames[i], "is_leaf"))
      return err_set(ERR_TYPE, "tree_map_with_path() got an unexpected keyword argument '%s'",
                     a->kwnames[i]);
    is_leaf = a->kwvals[i];
  }
  Value *prev = pytree_is_leaf_enter(is_leaf);
  Value *r = map_with_path(a);
  pytree_is_leaf_leave(prev);
  return r;
}

/* keystr(keys, *, simple=False, separator=''): the keys' text, each str()
 * joined; simple: their values' str() joined by separator. */
static Value *bi_keystr(const CallArgs *a) {
  Value *keys, *simple = NULL, *sep = NULL;
  if (args_bind("keystr", a, "keys, simple=, separator=", (Value **[]){&keys, &simple, &sep}) < 0)
    return NULL;
  size_t n;
  Value *const *ks;
  if (!val_seq(keys, &n, &ks)) return err_set(ERR_TYPE, "keystr: keys must be a tuple of keys");
  int plain = simple ? val_truth(simple) : 0;
  if (plain < 0) return NULL;
  if (sep && sep->type != V_STR) return err_set(ERR_TYPE, "keystr: separator must be a str");
  StrBuf b = {0};
  for (size_t i = 0; i < n; i++) {
    Key *k = ks[i]->type == V_OPAQUE && ((Opaque *)ks[i])->ot >= key_types &&
                     ((Opaque *)ks[i])->ot < key_types + 4
                 ? (Key *)ks[i]
                 : NULL;
    if (!k) {
      sbuf_free(&b);
      return err_set(ERR_TYPE, "keystr: expected a key (DictKey, SequenceKey, ...), got %s",
                     val_type_name(ks[i]));
    }
    Value *s = plain ? val_str(k->v) : key_str(ks[i]);
    if (!s) {
      sbuf_free(&b);
      return NULL;
    }
    if (plain && i && sep) sbuf_puts(&b, str_cstr(sep));
    sbuf_puts(&b, str_cstr(s));
    val_decref(s);
  }
  Value *r = b.failed ? err_nomem() : str_new(b.data ? b.data : "", b.len);
  sbuf_free(&b);
  return r;
}

int pytree_path_register(void) {
  static const TreeFn fns[] = {
      {"tree_map_with_path", "map_with_path",
       "tree_map_with_path(f, tree, *rest, is_leaf=None): f(path, leaf, ...) over the leaves",
       bi_map_with_path},
      {"tree_leaves_with_path", "leaves_with_path",
       "tree_leaves_with_path(tree, is_leaf=None): [(path, leaf), ...]", bi_leaves_with_path},
      {"tree_flatten_with_path", "flatten_with_path",
       "tree_flatten_with_path(tree, is_leaf=None): ([(path, leaf), ...], treedef)",
       bi_flatten_with_path},
      {"keystr", NULL, "keystr(keys, simple=False, separator=''): a key path's text", bi_keystr},
  };
  if (pytree_add_fns(fns, sizeof fns / sizeof *fns) < 0) return -1;
  for (size_t i = 0; i < sizeof key_types / sizeof *key_types; i++) {
    Value *c = builtins_opaque_class(key_types[i].name);
    if (!c || builtins_add_to("jax.tree_util", key_types[i].name, c) < 0) return -1;
  }
  return 0;
}
