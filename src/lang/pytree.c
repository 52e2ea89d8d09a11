/*
 * pytree.c - flattening and rebuilding pytrees, and jax.tree_util
 * (pytree.h).
 */
#include "lang/pytree.h"

#include <stdlib.h>
#include <string.h>

#include "array/array.h"
#include "base/error.h"
#include "array/print.h"
#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/classes.h"
#include "lang/eval.h"
#include "lang/ops.h"

/* Trees nested deeper than this are an error, not a stack overflow (a list
 * that contains itself is infinitely deep). */
#define PYTREE_MAX_DEPTH 1000

int pytree_push(PyLeaves *l, Value *v) {
  if (!l->cap) {
    l->v = l->inl;
    l->cap = PYTREE_INLINE;
  }
  if (l->n == l->cap) {
    int c = l->cap * 2;
    Value **q = shm_realloc(l->v == l->inl ? NULL : l->v, sizeof(Value *) * (size_t)c);
    if (!q) return err_nomem(), -1;
    if (l->v == l->inl) memcpy(q, l->inl, sizeof l->inl);
    l->v = q;
    l->cap = c;
  }
  l->v[l->n++] = v;
  return 0;
}

void pytree_leaves_free(PyLeaves *l) {
  if (l->v != l->inl) shm_free(l->v);
  val_decref(l->held);
  *l = (PyLeaves){0};
}

bool pytree_is_node(const Value *v) {
  /* JAX registers list and dict by exact type: a deque and a Counter are
   * leaves; OrderedDict and defaultdict are registered nodes */
  if (v->type == V_LIST) return ((const List *)v)->kind == LIST_PLAIN;
  if (v->type == V_DICT) return ((const Dict *)v)->kind != DICT_COUNTER && !val_is_set(v);   /* a set: JAX registers none */
  return v->type == V_TUPLE || v->type == V_NONE || cls_is_tree_node(v);
}

/* The is_leaf= of the jax.tree_util call running on this thread (NULL:
 * none): a value it calls true is a leaf, node or not, as JAX's. */
static _Thread_local Value *tls_is_leaf;

Value *pytree_is_leaf_enter(Value *is_leaf) {
  Value *prev = tls_is_leaf;
  tls_is_leaf = is_leaf && is_leaf != VAL_NONE ? is_leaf : NULL;
  return prev;
}

void pytree_is_leaf_leave(Value *prev) { tls_is_leaf = prev; }

int pytree_cut(Value *t) {
  if (!tls_is_leaf) return 0;
  Value *f = tls_is_leaf;
  tls_is_leaf = NULL;   /* trees the predicate itself walks have none */
  Value *r = val_call_n(f, 1, &t);
  tls_is_leaf = f;
  int v = r ? val_truth(r) : -1;
  val_decref(r);
  return v;
}

static int too_deep(void) {
  err_set(ERR_VALUE, "maximum recursion depth exceeded while walking a pytree (deeper than "
                     "%d, or a container that holds itself)", PYTREE_MAX_DEPTH);
  return -1;
}

/* ---- dict keys in JAX's order ---------------------------------------------- */

/* The key kind for ordering: 0 a string, 1 a number, -1 neither. */
static int key_kind(Value *k) {
  if (k->type == V_STR) return 0;
  if (IS_ARRAY(k) && AS_ARRAY(k)->ndim == 0) return 1;
  return -1;
}

static _Thread_local Value **tls_keys;   /* the keys being ordered: qsort has no context */

static int by_key(const void *pa, const void *pb) {
  Value *a = tls_keys[*(const size_t *)pa], *b = tls_keys[*(const size_t *)pb];
  if (a->type == V_STR) return strcmp(str_cstr(a), str_cstr(b));
  double x = arr_get_f64(AS_ARRAY(a), 0), y = arr_get_f64(AS_ARRAY(b), 0);
  return x < y ? -1 : x > y;
}

/* The positions of [d]'s items in sorted-key order, a new array of
 * d->len (+1) entries; NULL with the error set when the keys mix kinds
 * that do not order, as Python's sorted() refuses them. */
size_t *pytree_key_order(Value *dv) {
  Dict *d = (Dict *)dv;
  size_t *idx = shm_malloc(sizeof(size_t) * (d->len + 1));
  if (!idx) return err_nomem();
  for (size_t i = 0; i < d->len; i++) idx[i] = i;
  if (d->kind == DICT_ORDERED) return idx;   /* JAX flattens an OrderedDict in its own order */
  int kind = d->len ? key_kind(d->keys[0]) : 0;
  for (size_t i = 0; i < d->len; i++)
    if (key_kind(d->keys[i]) != kind || kind < 0) {
      shm_free(idx);
      return err_set(ERR_TYPE, "'<' not supported between dict keys of types '%s' and '%s': "
                     "a pytree's dict keys must be sortable", val_type_name(d->keys[0]),
                     val_type_name(d->keys[i]));
    }
  tls_keys = d->keys;
  qsort(idx, d->len, sizeof *idx, by_key);
  return idx;
}

/* ---- flatten and replace ---------------------------------------------------- */

Value *pytree_map(Value *tree, bool (*is_leaf)(Value *v), Value *(*fn)(Value *leaf, void *ctx),
                  void *ctx) {
  PyLeaves l = {0};
  if (pytree_flatten(tree, is_leaf, &l) < 0) return NULL;
  Value *few[PYTREE_INLINE];
  Value **vals = l.n <= PYTREE_INLINE ? few : shm_calloc((size_t)l.n + 1, sizeof(Value *));
  Value *r = NULL;
  int i = 0;
  if (!vals) {
    err_nomem();
    goto out;
  }
  for (; i < l.n; i++)
    if (!(vals[i] = fn(l.v[i], ctx))) goto out;
  int pos = 0;
  r = pytree_replace(tree, is_leaf, vals, &pos);
out:
  for (int k = 0; k < i; k++) val_decref(vals[k]);
  if (vals != few) shm_free(vals);
  pytree_leaves_free(&l);
  return r;
}

static int flatten_at(Value *t, bool (*is_leaf)(Value *v), PyLeaves *out, int depth);

/* A custom node's children, kept in [out]'s held list: its leaves are
 * borrowed from them. */
static int flatten_custom(Value *t, bool (*is_leaf)(Value *v), PyLeaves *out, int depth) {
  Value *aux, *kids = cls_tree_children(t, &aux);
  if (!kids) return -1;
  val_decref(aux);
  if ((!out->held && !(out->held = list_new(4))) || list_append_steal(out->held, kids) < 0)
    return err_nomem(), -1;
  return flatten_at(kids, is_leaf, out, depth + 1);
}

static int flatten_at(Value *t, bool (*is_leaf)(Value *v), PyLeaves *out, int depth) {
  if (depth > PYTREE_MAX_DEPTH) return too_deep();
  int cut = pytree_is_node(t) ? pytree_cut(t) : 1;
  if (cut < 0) return -1;
  if (cut) return is_leaf && !is_leaf(t) ? 0 : pytree_push(out, t);
  if (t->type == V_NONE) return 0;
  if (t->type == V_OPAQUE) return flatten_custom(t, is_leaf, out, depth);
  if (t->type == V_DICT) {
    Dict *d = (Dict *)t;
    size_t *idx = pytree_key_order(t);
    if (!idx) return -1;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < d->len; i++)
      rc = flatten_at(d->vals[idx[i]], is_leaf, out, depth + 1);
    shm_free(idx);
    return rc;
  }
  size_t n;
  Value *const *items;
  val_seq(t, &n, &items);
  for (size_t i = 0; i < n; i++)
    if (flatten_at(items[i], is_leaf, out, depth + 1) < 0) return -1;
  return 0;
}

int pytree_flatten(Value *tree, bool (*is_leaf)(Value *v), PyLeaves *out) {
  return flatten_at(tree, is_leaf, out, 0);
}

static Value *replace_at(Value *t, bool (*is_leaf)(Value *v), Value **vals, int *pos, int depth);

static Value *replace_dict(Dict *d, bool (*is_leaf)(Value *v), Value **vals, int *pos,
                           int depth) {
  size_t *idx = pytree_key_order(&d->hdr);
  Value *r = idx ? dict_new() : NULL;
  if (r) {   /* an OrderedDict or a defaultdict comes back as one */
    ((Dict *)r)->kind = d->kind;
    ((Dict *)r)->missing = val_incref(d->missing);
  }
  for (size_t i = 0; r && i < d->len; i++) {
    Value *x = replace_at(d->vals[idx[i]], is_leaf, vals, pos, depth + 1);
    if (!x || dict_set(r, d->keys[idx[i]], x) < 0) {
      val_decref(x);
      val_decref(r);
      r = NULL;
      break;
    }
    val_decref(x);
  }
  shm_free(idx);
  return r;
}

/* A custom node with new leaves: its unflatten function over its
 * children with theirs. */
static Value *replace_custom(Value *t, bool (*is_leaf)(Value *v), Value **vals, int *pos,
                             int depth) {
  Value *aux, *kids = cls_tree_children(t, &aux);
  Value *fresh = kids ? replace_at(kids, is_leaf, vals, pos, depth + 1) : NULL;
  Value *r = fresh ? cls_tree_unflatten(cls_class_of(t), aux, fresh) : NULL;
  val_decref(fresh);
  val_decref(kids);
  if (kids) val_decref(aux);
  return r;
}

static Value *replace_at(Value *t, bool (*is_leaf)(Value *v), Value **vals, int *pos, int depth) {
  if (depth > PYTREE_MAX_DEPTH) return too_deep(), NULL;
  int cut = pytree_is_node(t) ? pytree_cut(t) : 1;
  if (cut < 0) return NULL;
  if (cut) return is_leaf && !is_leaf(t) ? val_incref(t) : val_incref(vals[(*pos)++]);
  if (t->type == V_NONE) return val_incref(t);
  if (t->type == V_DICT) return replace_dict((Dict *)t, is_leaf, vals, pos, depth);
  if (t->type == V_OPAQUE) return replace_custom(t, is_leaf, vals, pos, depth);
  size_t n;
  Value *const *items;
  val_seq(t, &n, &items);
  Value *r = t->type == V_TUPLE ? tuple_new_like(t, n) : list_new(n);
  for (size_t i = 0; r && i < n; i++) {
    Value *x = replace_at(items[i], is_leaf, vals, pos, depth + 1);
    if (t->type == V_TUPLE) tuple_set_steal(r, i, x ? x : val_incref(VAL_NONE));
    else if (x && list_append_steal(r, x) < 0) x = NULL;
    if (!x) {
      val_decref(r);
      return NULL;
    }
  }
  return r;
}

Value *pytree_replace(Value *tree, bool (*is_leaf)(Value *v), Value **vals, int *pos) {
  return replace_at(tree, is_leaf, vals, pos, 0);
}

/* ==== jax.tree_util ========================================================== */

/* A tree's structure (PyTreeDef): the tree it was taken from, whose
 * non-node values stand for the leaves. */
typedef struct TreeDef {
  Opaque base;
  Value *tree;   /* owned */
} TreeDef;

static void treedef_free(Value *v) { val_decref(((TreeDef *)v)->tree); }

/* A growing text, for a structure's repr. */
typedef struct Text {
  char *s;
  size_t len, cap;
} Text;

static int text_put(Text *t, const char *x) {
  size_t n = strlen(x);
  if (t->len + n + 1 > t->cap) {
    size_t cap = (t->len + n + 1) * 2;
    char *q = shm_realloc(t->s, cap);
    if (!q) return err_nomem(), -1;
    t->s = q;
    t->cap = cap;
  }
  memcpy(t->s + t->len, x, n + 1);
  t->len += n;
  return 0;
}

static int structure_str(Value *t, Text *out, int depth);

/* A custom node's structure, as JAX prints it: CustomNode(Name[aux], [children]). */
static int custom_str(Value *t, Text *out, int depth) {
  Value *aux, *kids = cls_tree_children(t, &aux);
  if (!kids) return -1;
  Value *ar = val_repr(aux);
  int rc = ar ? 0 : -1;
  if (rc == 0) rc = text_put(out, "CustomNode(");
  if (rc == 0) rc = text_put(out, cls_name(cls_class_of(t)));
  if (rc == 0) rc = text_put(out, "[");
  if (rc == 0) rc = text_put(out, str_cstr(ar));
  if (rc == 0) rc = text_put(out, "], [");
  for (size_t i = 0; rc == 0 && i < tuple_len(kids); i++) {
    if (i) rc = text_put(out, ", ");
    if (rc == 0) rc = structure_str(tuple_get(kids, i), out, depth + 1);
  }
  if (rc == 0) rc = text_put(out, "])");
  val_decref(ar);
  val_decref(aux);
  val_decref(kids);
  return rc;
}

/* A named tuple's structure: Name(field=..., ...). */
static int named_str(Value *t, Text *out, int depth) {
  Value *cls = tuple_class(t), *fields = ops_getattr(cls, "_fields");
  int rc = fields ? text_put(out, cls_name(cls)) : -1;
  if (rc == 0) rc = text_put(out, "(");
  for (size_t i = 0; rc == 0 && i < tuple_len(t); i++) {
    if (i) rc = text_put(out, ", ");
    if (rc == 0) rc = text_put(out, str_cstr(tuple_get(fields, i)));
    if (rc == 0) rc = text_put(out, "=");
    if (rc == 0) rc = structure_str(tuple_get(t, i), out, depth + 1);
  }
  val_decref(fields);
  return rc == 0 ? text_put(out, ")") : -1;
}

/* Appends the structure of [t] to [out] as JAX prints it: "*" a leaf. */
static int structure_str(Value *t, Text *out, int depth) {
  if (depth > PYTREE_MAX_DEPTH) return too_deep();
  if (!pytree_is_node(t)) return text_put(out, "*");
  if (t->type == V_NONE) return text_put(out, "None");
  if (t->type == V_OPAQUE) return custom_str(t, out, depth);
  if (tuple_class(t)) return named_str(t, out, depth);
  if (t->type == V_DICT) {
    Dict *d = (Dict *)t;
    size_t *idx = pytree_key_order(t);
    int rc = idx ? text_put(out, "{") : -1;
    for (size_t i = 0; rc == 0 && i < d->len; i++) {
      Value *k = val_repr(d->keys[idx[i]]);
      rc = k ? 0 : -1;
      if (rc == 0 && i) rc = text_put(out, ", ");
      if (rc == 0) rc = text_put(out, str_cstr(k));
      if (rc == 0) rc = text_put(out, ": ");
      if (rc == 0) rc = structure_str(d->vals[idx[i]], out, depth + 1);
      val_decref(k);
    }
    shm_free(idx);
    return rc == 0 ? text_put(out, "}") : -1;
  }
  size_t n;
  Value *const *items;
  val_seq(t, &n, &items);
  bool tuple = t->type == V_TUPLE;
  int rc = text_put(out, tuple ? "(" : "[");
  for (size_t i = 0; rc == 0 && i < n; i++) {
    if (i) rc = text_put(out, ", ");
    if (rc == 0) rc = structure_str(items[i], out, depth + 1);
  }
  if (rc == 0 && tuple && n == 1) rc = text_put(out, ",");
  return rc == 0 ? text_put(out, tuple ? ")" : "]") : -1;
}

Value *pytree_structure_repr(Value *tree) {
  Text t = {0};
  Value *r = NULL;
  if (text_put(&t, "PyTreeDef(") == 0 && structure_str(tree, &t, 0) == 0 &&
      text_put(&t, ")") == 0)
    r = str_new(t.s, t.len);
  shm_free(t.s);
  return r;
}

static Value *treedef_repr(Value *v) { return pytree_structure_repr(((TreeDef *)v)->tree); }

static Value *treedef_getattr(Value *v, const char *name) {
  if (strcmp(name, "num_leaves") == 0) {
    PyLeaves l = {0};
    if (pytree_flatten(((TreeDef *)v)->tree, NULL, &l) < 0) return NULL;
    Value *n = val_int(l.n);
    pytree_leaves_free(&l);
    return n;
  }
  return err_set(ERR_ATTRIBUTE, "'PyTreeDef' object has no attribute '%s'", name);
}

static const OpaqueType treedef_type = {"PyTreeDef", treedef_free, treedef_repr, treedef_getattr, NULL, NULL, NULL};

static Value *treedef_new(Value *tree) {
  TreeDef *d = shm_calloc(1, sizeof *d);
  if (!d) return err_nomem();
  val_init(&d->base.hdr, V_OPAQUE);
  d->base.ot = &treedef_type;
  d->tree = val_incref(tree);
  return &d->base.hdr;
}

static int same_structure(Value *a, Value *b, int depth);

/* Whether custom nodes [a] and [b] have one structure: one class, equal
 * auxiliary data, children of one structure. */
static int same_custom(Value *a, Value *b, int depth) {
  if (cls_class_of(a) != cls_class_of(b)) return 0;
  Value *xa, *xb = NULL, *ka = cls_tree_children(a, &xa), *kb = ka ? cls_tree_children(b, &xb) : NULL;
  int r = -1;
  if (kb) {
    Value *eq = ops_compare(OP_EQ, xa, xb);
    r = eq ? val_truth(eq) : -1;
    val_decref(eq);
    if (r == 1) r = same_structure(ka, kb, depth + 1);
  }
  if (ka) val_decref(xa);
  if (kb) val_decref(xb);
  val_decref(ka);
  val_decref(kb);
  return r;
}

/* Whether [a] and [b] have the same structure (their leaves aside). */
static int same_structure(Value *a, Value *b, int depth) {
  if (depth > PYTREE_MAX_DEPTH) return too_deep();
  int ca = pytree_is_node(a) ? pytree_cut(a) : 1, cb = ca < 0 ? -1 : pytree_is_node(b) ? pytree_cut(b) : 1;
  if (ca < 0 || cb < 0) return -1;
  if (ca || cb) return ca && cb;
  if (a->type != b->type || tuple_class(a) != tuple_class(b)) return 0;
  if (a->type == V_NONE) return 1;
  if (a->type == V_OPAQUE) return same_custom(a, b, depth);
  if (a->type == V_DICT) {
    Dict *x = (Dict *)a, *y = (Dict *)b;
    if (x->len != y->len) return 0;
    for (size_t i = 0; i < x->len; i++) {
      Value *other = dict_get(b, x->keys[i]);
      int r = other ? same_structure(x->vals[i], other, depth + 1) : 0;
      if (r != 1) return r;
    }
    return 1;
  }
  size_t n, m;
  Value *const *xs, *const *ys;
  val_seq(a, &n, &xs);
  val_seq(b, &m, &ys);
  if (n != m) return 0;
  for (size_t i = 0; i < n; i++) {
    int r = same_structure(xs[i], ys[i], depth + 1);
    if (r != 1) return r;
  }
  return 1;
}

int pytree_same_structure(Value *a, Value *b) { return same_structure(a, b, 0); }

int pytree_prefix_children(Value *tree, Value *prefix, Value **tk, Value **pk, const char *what) {
  *tk = *pk = NULL;
  if (!cls_is_tree_node(prefix) || cls_class_of(prefix) != cls_class_of(tree)) return 0;
  Value *ta, *pa = NULL;
  *tk = cls_tree_children(tree, &ta);
  *pk = *tk ? cls_tree_children(prefix, &pa) : NULL;
  Value *eq = *pk ? ops_compare(OP_EQ, ta, pa) : NULL;
  int same = eq ? val_truth(eq) : -1;
  val_decref(eq);
  if (*tk) val_decref(ta);
  if (*pk) val_decref(pa);
  if (same == 0)
    err_set(ERR_VALUE, "%s must be a pytree prefix of the value: its '%s' has other auxiliary "
            "data (static fields) than the value's", what, cls_name(cls_class_of(tree)));
  if (same == 1) return 1;
  val_decref(*tk);
  val_decref(*pk);
  *tk = *pk = NULL;
  return -1;
}

/* A list of the leaves in [l] (new reference). */
static Value *leaves_list(const PyLeaves *l) {
  Value *r = list_new((size_t)l->n);
  for (int i = 0; r && i < l->n; i++)
    if (list_append_steal(r, val_incref(l->v[i])) < 0) {
      val_decref(r);
      return NULL;
    }
  return r;
}

/* The PyTreeDef of [tree] whose leaves [l] gave (under is_leaf=): of the
 * tree itself, or with is_leaf= of the tree with each leaf (a cut node
 * too) an Ellipsis, so it flattens to as many leaves without it. */
static Value *treedef_of(Value *tree, const PyLeaves *l) {
  if (!tls_is_leaf) return treedef_new(tree);
  Value **dots = shm_calloc((size_t)l->n + 1, sizeof *dots);
  if (!dots) return err_nomem();
  for (int i = 0; i < l->n; i++) dots[i] = VAL_ELLIPSIS;
  int pos = 0;
  Value *sk = pytree_replace(tree, NULL, dots, &pos), *r = sk ? treedef_new(sk) : NULL;
  val_decref(sk);
  shm_free(dots);
  return r;
}

/* tree_leaves(tree, is_leaf=None), tree_structure and tree_flatten:
 * [what] 0, 1 or 2. */
static Value *flatten_call(const CallArgs *a, const char *name, int what) {
  Value *tree, *is_leaf = NULL;
  if (args_bind(name, a, "tree, is_leaf=", (Value **[]){&tree, &is_leaf}) < 0) return NULL;
  Value *prev = pytree_is_leaf_enter(is_leaf), *leaves = NULL, *def = NULL, *r = NULL;
  PyLeaves l = {0};
  if (pytree_flatten(tree, NULL, &l) == 0) {   /* checks the keys and the depth */
    leaves = what != 1 ? leaves_list(&l) : NULL;
    def = what != 0 && (what == 1 || leaves) ? treedef_of(tree, &l) : NULL;
    r = what == 0 ? val_incref(leaves) : what == 1 ? val_incref(def)
        : def ? tuple_pack(2, (Value *[]){leaves, def}) : NULL;
  }
  pytree_is_leaf_leave(prev);
  pytree_leaves_free(&l);
  val_decref(leaves);
  val_decref(def);
  return r;
}

Value *pytree_treedef(Value *tree) {
  PyLeaves l = {0};
  Value *r = pytree_flatten(tree, NULL, &l) < 0 ? NULL : treedef_of(tree, &l);
  pytree_leaves_free(&l);
  return r;
}

static Value *bi_tree_leaves(const CallArgs *a) { return flatten_call(a, "tree_leaves", 0); }
static Value *bi_tree_structure(const CallArgs *a) { return flatten_call(a, "tree_structure", 1); }
static Value *bi_tree_flatten(const CallArgs *a) { return flatten_call(a, "tree_flatten", 2); }

static Value *bi_tree_unflatten(const CallArgs *a) {
  Value *def, *leaves;
  Value **slots[] = {&def, &leaves};
  if (args_bind("tree_unflatten", a, "treedef, leaves", slots) < 0) return NULL;
  if (def->type != V_OPAQUE || ((Opaque *)def)->ot != &treedef_type)
    return err_set(ERR_TYPE, "tree_unflatten: treedef must be a PyTreeDef, got %s",
                   val_type_name(def));
  size_t n;
  Value *const *items;
  if (!val_seq(leaves, &n, &items))
    return err_set(ERR_TYPE, "tree_unflatten: leaves must be a list or tuple, got %s",
                   val_type_name(leaves));
  Value *tree = ((TreeDef *)def)->tree;
  PyLeaves l = {0};
  if (pytree_flatten(tree, NULL, &l) < 0) return NULL;
  int want = l.n;
  pytree_leaves_free(&l);
  if ((size_t)want != n)
    return err_set(ERR_VALUE, "Too %s leaves for PyTreeDef; expected %d, got %zu",
                   n < (size_t)want ? "few" : "many", want, n);
  int pos = 0;
  return pytree_replace(tree, NULL, (Value **)items, &pos);
}

/* tree_all(tree): Python's all() over the leaves (an array leaf must be
 * one element, as bool() of it is). */
static Value *bi_tree_all(const CallArgs *a) {
  Value *tree;
  Value **slots[] = {&tree};
  if (args_bind("tree_all", a, "tree", slots) < 0) return NULL;
  PyLeaves l = {0};
  if (pytree_flatten(tree, NULL, &l) < 0) return NULL;
  int all = 1;
  for (int i = 0; i < l.n && all == 1; i++) all = val_truth(l.v[i]);
  pytree_leaves_free(&l);
  return all < 0 ? NULL : val_bool(all == 1);
}

/* tree_reduce(function, tree[, initializer]): functools.reduce over the
 * leaves. */
static Value *bi_tree_reduce(const CallArgs *a) {
  Value *fn, *tree, *init = NULL;
  Value **slots[] = {&fn, &tree, &init};
  if (args_bind("tree_reduce", a, "function, tree, initializer=", slots) < 0) return NULL;
  PyLeaves l = {0};
  if (pytree_flatten(tree, NULL, &l) < 0) return NULL;
  int i = 0;
  Value *acc = init ? val_incref(init) : l.n ? val_incref(l.v[i++]) : NULL;
  if (!acc) err_set(ERR_TYPE, "reduce() of empty iterable with no initial value");
  for (; acc && i < l.n; i++) {
    Value *next = val_call_n(fn, 2, (Value *[]){acc, l.v[i]});
    val_decref(acc);
    acc = next;
  }
  pytree_leaves_free(&l);
  return acc;
}

/* tree_map(f, tree, *rest): f applied to each leaf of [tree] and the
 * leaves at the same place in each of [rest], which must have tree's
 * structure. */
static Value *tree_map_in(const CallArgs *a);

static Value *bi_tree_map(const CallArgs *a) {
  Value *is_leaf = NULL;
  if (a->nkw > 1 || (a->nkw && strcmp(a->kwnames[0], "is_leaf")))
    return err_set(ERR_TYPE, "tree_map() got an unexpected keyword argument '%s'",
                   a->kwnames[a->nkw > 1 && !strcmp(a->kwnames[0], "is_leaf")]);
  if (a->nkw) is_leaf = a->kwvals[0];
  Value *prev = pytree_is_leaf_enter(is_leaf);
  Value *r = tree_map_in(a);
  pytree_is_leaf_leave(prev);
  return r;
}

/* tree_map with its is_leaf= in force. */
static Value *tree_map_in(const CallArgs *a) {
  if (a->nargs < 2) return err_set(ERR_TYPE, "tree_map() missing required argument 'tree'");
  int nt = a->nargs - 1;
  PyLeaves *ls = shm_calloc((size_t)nt, sizeof *ls);
  Value **args = shm_calloc((size_t)nt, sizeof *args), **outs = NULL, *r = NULL;
  int nout = 0;
  if (!ls || !args) goto out;
  for (int t = 0; t < nt; t++) {
    int same = t ? same_structure(a->args[1], a->args[1 + t], 0) : 1;
    if (same < 0 || pytree_flatten(a->args[1 + t], NULL, &ls[t]) < 0) goto out;
    if (!same) {
      err_set(ERR_VALUE, "tree_map: tree %d does not have the structure of the first tree", t);
      goto out;
    }
  }
  if (!(outs = shm_calloc((size_t)ls[0].n + 1, sizeof *outs))) goto out;
  /* f runs without the is_leaf= (its own trees, a jit's arguments, are
   * flattened plainly); the rebuild below has it again */
  Value *cut = pytree_is_leaf_enter(NULL);
  for (; nout < ls[0].n; nout++) {
    for (int t = 0; t < nt; t++) args[t] = ls[t].v[nout];
    if (!(outs[nout] = val_call_n(a->args[0], nt, args))) break;
  }
  pytree_is_leaf_leave(cut);
  if (nout < ls[0].n) goto out;
  int pos = 0;
  r = pytree_replace(a->args[1], NULL, outs, &pos);
out:
  if (!ls || !args || (outs == NULL && !err_occurred())) err_nomem();
  for (int i = 0; outs && i < nout; i++) val_decref(outs[i]);
  for (int t = 0; ls && t < nt; t++) pytree_leaves_free(&ls[t]);
  shm_free(outs);
  shm_free(args);
  shm_free(ls);
  return r;
}

int pytree_add_fns(const TreeFn *fns, size_t n) {
  for (size_t i = 0; i < n; i++) {
    Value *b = builtin_new(fns[i].name, fns[i].fn, fns[i].doc);
    int rc = b ? builtins_add_to("jax.tree_util", fns[i].name, b) : -1;
    if (rc == 0 && fns[i].short_name) rc = builtins_add_to("jax.tree", fns[i].short_name, b);
    val_decref(b);
    if (rc < 0) return -1;
  }
  return 0;
}

int pytree_register(void) {
  static const TreeFn fns[] = {
      {"tree_map", "map", "tree_map(f, tree, *rest, is_leaf=None): f over the leaves", bi_tree_map},
      {"tree_leaves", "leaves", "tree_leaves(tree, is_leaf=None): the leaves, in order", bi_tree_leaves},
      {"tree_flatten", "flatten", "tree_flatten(tree, is_leaf=None): (leaves, treedef)", bi_tree_flatten},
      {"tree_unflatten", "unflatten", "tree_unflatten(treedef, leaves): the tree",
       bi_tree_unflatten},
      {"tree_structure", "structure", "tree_structure(tree, is_leaf=None): its PyTreeDef",
       bi_tree_structure},
      {"tree_all", "all", "tree_all(tree): whether every leaf is true", bi_tree_all},
      {"tree_reduce", "reduce", "tree_reduce(function, tree[, initializer]): reduce over leaves",
       bi_tree_reduce},
  };
  if (pytree_add_fns(fns, sizeof fns / sizeof *fns) < 0) return -1;
  return pytree_path_register();
}
