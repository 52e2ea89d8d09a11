/*
 * eval_fusable.c - eager evaluation of element-wise expressions in one pass
 * (eval.h, eval_fuse_try).
 *
 * `x * y + z` evaluated operator by operator writes x * y to memory and
 * reads it back: two passes where a C loop makes one.  An expression tree
 * made only of + - * / and unary minus, over names, number literals and
 * calls of the built-ins named as the unary primitives with fused loops
 * (sin, cos, exp, log, sqrt, abs), is instead handed whole to
 * the transform layer (eval_fuse_hook), which stages it once per shape of
 * its operands, compiles it (fused into one blocked loop, as under jit)
 * and runs it.  What the user sees is unchanged: the fused loop performs
 * the same float32 operations the eager kernels do, element by element,
 * so the result is the same array bit for bit (tests/lang/eager_fusion*).
 *
 * The tree's leaves are read first, left to right, as the operators would
 * read them; nothing else in such a tree can run user code.  Only float32
 * arrays of one shape, not weakly typed, with no mesh axes to vary over,
 * and Python ints and floats take this path, and every operator must have
 * an array operand (two Python numbers combine in double precision);
 * anything else (other dtypes, broadcasting, a rebound `sin`, a tracer, a
 * name that is not defined) goes the operator-by-operator way, which
 * raises the errors.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "array/array.h"
#include "array/prim.h"
#include "lang/builtins.h"
#include "lang/eval.h"
#include "lang/ops.h"

Value *(*eval_fuse_hook)(const Node *root, int nleaf, Value **leaves);

/* Elements below which operator-by-operator evaluation is as fast: the
 * staged loop's call costs about what two small operations do. */
#define FUSE_MIN_SIZE 16384

/* The built-in [n] (an N_CALL) calls when it has the shape of a call of
 * a built-in named as a unary primitive with a loop in fused plans (sin,
 * cos, exp, log, sqrt, abs: PrimRules.fuse), else NULL (the name may
 * still be rebound: checked against the value). */
static const char *fused_call_name(const Node *n) {
  if (n->a->kind != N_NAME || n->items.n != 1 || n->nkw != 0 ||
      n->items.items[0]->kind == N_STARRED)
    return NULL;
  int id = prim_lookup(n->a->name);
  if (id < 0 || prim_table[id].kind != PK_UNARY || !prim_table[id].rules.fuse) return NULL;
  return n->a->name;
}

static bool fused_binop(OpKind op) {
  return op == OP_ADD || op == OP_SUB || op == OP_MUL || op == OP_DIV;
}

/* Operations in the tree under [n], or -1 when it has a node of another
 * kind. */
static int tree_ops(const Node *n) {
  switch (n->kind) {
  case N_NAME:
  case N_CONST:
    return 0;
  case N_BINOP: {
    if (!fused_binop(n->op)) return -1;
    int a = tree_ops(n->a), b = a < 0 ? -1 : tree_ops(n->b);
    return b < 0 ? -1 : a + b + 1;
  }
  case N_UNARY: {
    int a = n->op == OP_NEG ? tree_ops(n->a) : -1;
    return a < 0 ? -1 : a + 1;
  }
  case N_CALL: {
    int a = fused_call_name(n) ? tree_ops(n->items.items[0]) : -1;
    return a < 0 ? -1 : a + 1;
  }
  default:
    return -1;
  }
}

/* Whether [n] roots a tree worth fusing; the answer is kept in the node
 * (a cache, not the tree's meaning; relaxed atomics, as device threads
 * may share the tree). */
static bool is_fused_tree(const Node *n) {
  Node *m = (Node *)n;
  uint8_t f = __atomic_load_n(&m->fuse, __ATOMIC_RELAXED);
  if (f == EVAL_FUSE_UNKNOWN) {
    f = tree_ops(n) >= 2 ? EVAL_FUSE_TREE : EVAL_FUSE_NO;
    __atomic_store_n(&m->fuse, f, __ATOMIC_RELAXED);
  }
  return f == EVAL_FUSE_TREE;
}

/* Gathering the leaves. */
typedef struct Leaves {
  int n;
  Value *v[EVAL_FUSE_MAX_LEAVES];   /* borrowed */
  const Array *shape;               /* the first array leaf */
} Leaves;

/* Whether array [a] may be a leaf: float32, contiguous, not weak, no mesh
 * axes, as large as the first one and of its shape. */
static bool array_leaf_ok(Leaves *l, const Array *a) {
  if (a->dtype != DT_F32 || a->weak || !a->contiguous || a->vma) return false;
  if (!l->shape) {
    l->shape = a;
    return a->size >= FUSE_MIN_SIZE;
  }
  const Array *s = l->shape;
  return a->ndim == s->ndim && !memcmp(a->shape, s->shape, sizeof(int64_t) * (size_t)a->ndim);
}

/* Whether [v] may be a leaf; sets *is_array. */
static bool leaf_ok(Leaves *l, Value *v, bool *is_array) {
  if (!v || v->type != V_ARRAY) return false;
  const Array *a = (const Array *)v;
  *is_array = !a->host;
  if (a->host) return a->dtype == DT_F32 || a->dtype == DT_I32 || a->dtype == DT_I64;
  return array_leaf_ok(l, a);
}

/* Appends the leaves under [n] in evaluation order; false to decline.
 * *has_array: whether the subtree reads an array. */
static bool gather(const Node *n, Env *env, Leaves *l, bool *has_array) {
  switch (n->kind) {
  case N_NAME:
  case N_CONST: {
    if (l->n == EVAL_FUSE_MAX_LEAVES) return false;
    Value *v = n->kind == N_NAME ? eval_lookup_name(n, env) : n->value;
    if (!leaf_ok(l, v, has_array)) return false;
    l->v[l->n++] = v;
    return true;
  }
  case N_BINOP: {
    bool a = false, b = false;
    if (!gather(n->a, env, l, &a) || !gather(n->b, env, l, &b)) return false;
    *has_array = a || b;
    return *has_array;
  }
  case N_UNARY:
    return gather(n->a, env, l, has_array) && *has_array;
  case N_CALL: {
    Value *f = eval_lookup_name(n->a, env);
    if (!f || f != env_lookup(shm_interp->builtins, n->a->name)) return false;
    return gather(n->items.items[0], env, l, has_array) && *has_array;
  }
  default:
    return false;
  }
}

/* Whether a leaf is a host NumPy array (array.h): its expression runs
 * through the primitives, which settle whose its result is. */
static bool np_leaf(const Leaves *l) {
  if (!arr_np_is_live()) return false;
  for (int i = 0; i < l->n; i++)
    if (arr_is_np(l->v[i])) return true;
  return false;
}

/* The declined trees this thread is evaluating the usual way: their
 * subtrees are not offered again (their leaves were just found wanting). */
static _Thread_local int declined_depth;

Value *eval_fuse_try(const Node *n, Env *env, Value *(*eval_plain)(const Node *, Env *)) {
  if (!eval_fuse_hook || !is_fused_tree(n) || declined_depth)
    return eval_plain(n, env);
  Leaves l = {0};
  bool has_array = false;
  Value *r = EVAL_DECLINED;
  if (gather(n, env, &l, &has_array) && l.shape && !np_leaf(&l)) r = eval_fuse_hook(n, l.n, l.v);
  if (r != EVAL_DECLINED) return r;
  declined_depth++;
  r = eval_plain(n, env);
  declined_depth--;
  return r;
}

/* Applies the tree's operations to [vals] (its leaves' stand-ins, in
 * gather's order; *k counts them off).  A new reference, or NULL with the
 * error set. */
static Value *apply(const Node *n, Value **vals, int *k) {
  switch (n->kind) {
  case N_NAME:
  case N_CONST:
    return val_incref(vals[(*k)++]);
  case N_BINOP: {
    Value *a = apply(n->a, vals, k);
    if (!a) return NULL;
    Value *b = apply(n->b, vals, k);
    Value *r = b ? ops_binary(n->op, a, b) : NULL;
    val_decref(a);
    if (b) val_decref(b);
    return r;
  }
  case N_UNARY: {
    Value *a = apply(n->a, vals, k);
    Value *r = a ? ops_unary(n->op, a) : NULL;
    if (a) val_decref(a);
    return r;
  }
  case N_CALL: {
    Value *a = apply(n->items.items[0], vals, k);
    if (!a) return NULL;
    Value *r = val_call_n(env_lookup(shm_interp->builtins, n->a->name), 1, &a);
    val_decref(a);
    return r;
  }
  default:
    return NULL;
  }
}

Value *eval_fuse_apply(const Node *root, Value **vals) {
  int k = 0;
  return apply(root, vals, &k);
}
