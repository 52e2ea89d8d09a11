/*
 * batch.c - vmap (batch.h).
 */
#include <string.h>

#include "array/prim.h"
#include "base/intern.h"
#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/ops.h"
#include "lang/pytree.h"
#include "spmd/collective.h"
#include "spmd/device.h"
#include "spmd/shardmap.h"
#include "transform/batch.h"
#include "transform/trace.h"

/* ==== batch traces ========================================================== */

/* One vmap in progress on this thread. */
typedef struct BatchTrace {
  unsigned id;
  int64_t size;
  const char *name;   /* axis_name (interned), or NULL */
  struct BatchTrace *parent;
  bool owned;         /* allocated by batch_begin (xmap), not on a C stack */
  Value *resources;   /* xmap axis_resources: the mesh axes (a tuple) this named
                         axis is split over, owned, or NULL; [size] is then the
                         device's block and the axis's size size * res_size */
  int64_t res_size;
} BatchTrace;

static _Thread_local BatchTrace *batch_top;

static BatchTrace *batch_find(unsigned id) {
  for (BatchTrace *b = batch_top; b; b = b->parent)
    if (b->id == id) return b;
  return NULL;
}

/* The innermost vmap of this thread named [name], or NULL. */
static BatchTrace *batch_named(const char *name) {
  for (BatchTrace *b = batch_top; b; b = b->parent)
    if (b->name && !strcmp(b->name, name)) return b;
  return NULL;
}

/* A batch tracer of trace [id] for [batched] (stolen), batch axis [bdim]. */
static Value *batch_tracer(unsigned id, Value *batched, int bdim) {
  AVal a;
  if (prim_value_aval(batched, &a) < 0) {
    val_decref(batched);
    return NULL;
  }
  AVal e = a;   /* one example's: without the batch axis */
  for (int d = bdim; d + 1 < a.ndim; d++) e.shape[d] = a.shape[d + 1];
  e.ndim = a.ndim - 1;
  Tracer *x = tracer_alloc(TR_BATCH, id, &e);
  if (!x) {
    val_decref(batched);
    return NULL;
  }
  x->batched = batched;
  x->bdim = bdim;
  return &x->hdr;
}

/* The results of a primitive of several results (a tuple, stolen), each
 * batched along [bdim]: a tuple of batch tracers. */
static Value *batch_tracers(unsigned id, Value *results, int bdim) {
  size_t n = tuple_len(results);
  Value *t = tuple_new(n);
  for (size_t k = 0; t && k < n; k++) {
    Value *x = batch_tracer(id, val_incref(tuple_get(results, k)), bdim);
    if (!x) {
      val_decref(t);
      t = NULL;
    } else {
      tuple_set_steal(t, k, x);
    }
  }
  val_decref(results);
  return t;
}

static bool is_batch_of(Value *v, unsigned id) {
  return IS_BATCH_TRACER(v) && ((Tracer *)v)->trace_id == id;
}

/* ==== applying a primitive ==================================================== */

/* Example [b] of [x] along its axis [d]: a slice without the axis. */
static Value *example(Value *x, int d, int64_t b) {
  AVal a;
  if (prim_value_aval(x, &a) < 0) return NULL;
  int64_t st[SHM_MAXDIM] = {0}, li[SHM_MAXDIM], sh[SHM_MAXDIM];
  for (int i = 0, k = 0; i < a.ndim; i++) {
    li[i] = i == d ? b + 1 : a.shape[i];
    if (i != d) sh[k++] = a.shape[i];
  }
  st[d] = b;
  Params p;
  params_init(&p);
  params_add(&p, "start_indices", val_int_tuple(a.ndim, st));
  params_add(&p, "limit_indices", val_int_tuple(a.ndim, li));
  params_add(&p, "strides", val_incref(VAL_NONE));
  Value *s = prim_apply(P_SLICE, 1, &x, &p);
  params_clear(&p);
  if (!s) return NULL;
  params_init(&p);
  params_add(&p, "new_sizes", val_int_tuple(a.ndim - 1, sh));
  params_add(&p, "dimensions", val_incref(VAL_NONE));
  Value *r = prim_apply(P_RESHAPE, 1, &s, &p);
  params_clear(&p);
  val_decref(s);
  return r;
}

/* [x] with a new leading axis of size 1. */
static Value *lift(Value *x) {
  AVal a;
  if (prim_value_aval(x, &a) < 0) return NULL;
  int64_t sh[SHM_MAXDIM];
  sh[0] = 1;
  for (int i = 0; i < a.ndim; i++) sh[i + 1] = a.shape[i];
  Params p;
  params_init(&p);
  params_add(&p, "new_sizes", val_int_tuple(a.ndim + 1, sh));
  params_add(&p, "dimensions", val_incref(VAL_NONE));
  Value *r = prim_apply(P_RESHAPE, 1, &x, &p);
  params_clear(&p);
  return r;
}

static void values_free_n(Value **v, int n) {
  for (int i = 0; v && i < n; i++)
    if (v[i]) val_decref(v[i]);
}

/* The primitive applied example by example, the results stacked along a
 * new leading axis: what a batching rule leaves open. */
static Value *by_loop(BatchTrace *bt, PrimId id, int nin, Value **vals, const int *dims,
                      const Params *p) {
  if (prim_table[id].nout != 1)
    return err_set(ERR_NOT_IMPLEMENTED, "vmap of '%s' is not implemented", prim_table[id].name);
  if (bt->size == 0)
    return err_set(ERR_NOT_IMPLEMENTED, "vmap of '%s' over an empty batch is not implemented",
                   prim_table[id].name);
  Value **rows = shm_calloc((size_t)bt->size + (size_t)nin, sizeof(Value *)), *r = NULL;
  Value **ops = rows + bt->size;   /* one example's operands */
  int64_t b = 0;
  if (!rows) return err_nomem();
  for (; b < bt->size; b++) {
    int k = 0;
    for (; k < nin; k++)
      if (!(ops[k] = dims[k] < 0 ? val_incref(vals[k]) : example(vals[k], dims[k], b))) break;
    Value *y = k == nin ? prim_apply(id, nin, ops, p) : NULL;
    values_free_n(ops, k);
    rows[b] = y ? lift(y) : NULL;
    if (y) val_decref(y);
    if (!rows[b]) goto out;
  }
  Params q;
  params_init(&q);
  params_add(&q, "dimension", val_int(0));
  r = prim_apply(P_CONCATENATE, (int)bt->size, rows, &q);
  params_clear(&q);
out:
  values_free_n(rows, (int)b);
  shm_free(rows);
  return r;
}

/* Whether collective parameters [p] name [name] among their axes; the
 * others into [rest] (a tuple, or NULL when none remain). */
static bool names_axis(const Params *p, const char *name, Value **rest) {
  Value *v = params_get(p, "axes");
  if (!v) v = params_get(p, "axis_name");
  *rest = NULL;
  if (!v || !name) return false;
  size_t n = 1;
  Value *const *items = &v;
  if (v->type != V_STR && !val_seq(v, &n, &items)) return false;
  bool found = false;
  Value *keep[16];
  size_t k = 0;
  for (size_t i = 0; i < n && i < 16; i++) {
    if (items[i]->type == V_STR && !strcmp(str_cstr(items[i]), name))
      found = true;
    else
      keep[k++] = items[i];
  }
  if (found && k) *rest = tuple_pack(k, keep);
  return found;
}

/* The named axis's whole size: its block times the mesh axes it is split
 * over (xmap axis_resources). */
static int64_t global_size(const BatchTrace *b) { return b->size * (b->resources ? b->res_size : 1); }

/* A collective over the vmap axis's name, by its row's named-axis
 * batching rule (CollRules.named_batch); [*od]: the result's batch axis
 * (-1: the same for every example). */
static Value *named_collective(BatchTrace *bt, PrimId id, Value *x, int d, Value *rest,
                               const Params *p, int *od) {
  *od = -1;
  const CollRules *c = prim_table[id].rules.coll;
  CollNamedAxis ax = {bt->name, bt->size, bt->resources, bt->res_size};
  Value *r = NULL;
  int rc = c && c->named_batch ? c->named_batch(id, x, d, &ax, rest, p, &r, od) : COLL_NAMED_MISSING;
  if (rc != COLL_NAMED_MISSING) return rc == 0 ? r : NULL;
  return err_set(ERR_NOT_IMPLEMENTED, "%s over the vmap axis '%s'%s is not implemented",
                 prim_table[id].name, bt->name,
                 bt->resources ? " with axis_resources" : rest ? " together with mesh axes" : "");
}

/* Whether two named axes mapped to a common mesh axis would meet in one
 * value: an operand of [bt]'s operation carries another named axis whose
 * resources share a mesh axis with [bt]'s (seed 001: they can never both
 * be in one named shape; the seed's first release did not check it).
 * -1 with the error naming both axes, the mesh axis and the line. */
static int resources_clash(const BatchTrace *bt, int nin, Value **in) {
  size_t na, nb;
  Value *const *ia, *const *ib;
  if (!val_seq(bt->resources, &na, &ia)) return 0;
  for (int i = 0; i < nin; i++)
    for (Value *v = in[i]; IS_BATCH_TRACER(v); v = ((Tracer *)v)->batched) {
      const BatchTrace *o = batch_find(((Tracer *)v)->trace_id);
      if (!o || o == bt || !o->resources || !val_seq(o->resources, &nb, &ib)) continue;
      for (size_t a = 0; a < na; a++)
        for (size_t b = 0; b < nb; b++)
          if (!strcmp(str_cstr(ia[a]), str_cstr(ib[b]))) {
            err_set(ERR_VALUE, "xmap: the named axes '%s' and '%s' are both mapped to mesh axis "
                               "'%s', so they cannot meet in one value (line %d); reduce one "
                               "of them first, or map them to different mesh axes",
                    bt->name, o->name, str_cstr(ia[a]), prim_line_hook ? prim_line_hook() : 0);
            return -1;
          }
    }
  return 0;
}

/* The batched result of [id] on the operands' batched values [vals] at
 * [dims] (-1: unbatched): a new tracer, or the plain value when the
 * result is unbatched. */
static Value *batch_rule_apply(BatchTrace *bt, PrimId id, int nin, Value **in, Value **vals,
                               int *dims, const Params *p) {
  Value *rest, *r = NULL;
  int od = 0;
  if (prim_table[id].kind == PK_COLLECTIVE && nin == 1 && names_axis(p, bt->name, &rest)) {
    r = named_collective(bt, id, vals[0], dims[0], rest, p, &od);
    if (rest) val_decref(rest);
    return r && od >= 0 ? batch_tracer(bt->id, r, od) : r;
  }
  if (bt->resources && resources_clash(bt, nin, in) < 0) return NULL;
  BatchRule rule = prim_table[id].rules.batch;
  int rc = rule ? rule(vals, dims, nin, p, &r, &od) : BATCH_BY_LOOP;
  if (rc == BATCH_BY_LOOP) {
    r = by_loop(bt, id, nin, vals, dims, p);
    od = 0;
    rc = r ? 0 : -1;
  }
  if (rc < 0) return NULL;
  if (prim_table[id].nout > 1 && od >= 0) return batch_tracers(bt->id, r, od);
  return od >= 0 ? batch_tracer(bt->id, r, od) : r;
}

/* The batch trace's KindApply: any number of operands (a concatenate
 * stacks every iteration of an eager scan), on the stack for most. */
static Value *batch_apply(Tracer *top, PrimId id, int nin, Value **in, const Params *p) {
  BatchTrace *bt = batch_find(top->trace_id);
  if (!bt)
    return err_set(ERR_VALUE, "a batched value escaped from the function vmap vectorizes, or "
                              "reached a shard_map body where the call does not pass it (an "
                              "object's attribute, or an argument the body also uses whole)");
  Value *few_vals[64], **vals = few_vals;
  int few_dims[64], *dims = few_dims;
  if (nin > 64) {
    vals = shm_malloc(sizeof(Value *) * (size_t)nin);
    dims = shm_malloc(sizeof(int) * (size_t)nin);
  }
  Value *r = NULL;
  if (vals && dims) {
    for (int i = 0; i < nin; i++) {
      bool mine = is_batch_of(in[i], bt->id);
      vals[i] = mine ? ((Tracer *)in[i])->batched : in[i];
      dims[i] = mine ? ((Tracer *)in[i])->bdim : -1;
    }
    r = batch_rule_apply(bt, id, nin, in, vals, dims, p);
  } else {
    err_nomem();
  }
  if (vals != few_vals) {
    shm_free(vals);
    shm_free(dims);
  }
  return r;
}

static int batch_truth(Value *v) {
  char av[128];
  Tracer *x = (Tracer *)v;
  aval_str(av, sizeof av, x->aval.dtype, x->aval.ndim, x->aval.shape);
  err_set(ERR_TYPE, "the truth value of a batched value (%s) differs between the examples of "
                    "a vmap; use jnp.where, lax.select or lax.cond instead of Python control "
                    "flow", av);
  return -1;
}

/* ==== named axes seen by the collectives' built-ins ============================= */

/* Axis sizes: a vmap/xmap batch trace's, else a staged xmap body's
 * (trace.h: xmap under jit). */
static bool vmap_axis_size(const char *name, int64_t *size) {
  BatchTrace *b = batch_named(name);
  if (b) *size = global_size(b);
  return b != NULL || trace_axis_size(name, size);
}

/* Whether staging tracer [v] (under any batch tracers) carries [name]. */
static bool staged_carries(Value *v, const char *name) {
  while (IS_BATCH_TRACER(v)) v = ((Tracer *)v)->batched;
  const NamedShape *ns = trace_named(v);
  for (int i = 0; ns && i < ns->n; i++)
    if (!strcmp(ns->name[i], name)) return true;
  return false;
}

static bool vmap_carries(Value *x, const char *name) {
  BatchTrace *b = batch_named(name);
  for (Value *v = x; b && IS_BATCH_TRACER(v); v = ((Tracer *)v)->batched)
    if (((Tracer *)v)->trace_id == b->id) return true;
  return !b && staged_carries(x, name);
}

static Value *vmap_axis_index(const char *name);

Value *batch_axis_index(const char *name) { return vmap_axis_index(name); }

/* axis_index over a vmap axis: each example's position. */
static Value *vmap_axis_index(const char *name) {
  BatchTrace *b = batch_named(name);
  if (!b) return NULL;
  Params p;
  params_init(&p);
  params_add(&p, "dtype", dtype_value(DT_I32));
  params_add(&p, "shape", val_int_tuple(1, &b->size));
  params_add(&p, "dimension", val_int(0));
  Value *r = prim_apply(P_IOTA, 0, NULL, &p);
  params_clear(&p);
  if (r && b->resources) {   /* this device's block starts at its index times the block */
    params_init(&p);
    params_add(&p, "axis_name", val_incref(b->resources));
    Value *dev = prim_bind(P_AXIS_INDEX, 0, NULL, &p);
    params_clear(&p);
    Value *blk = dev ? val_int(b->size) : NULL, *start = blk ? ops_binary(OP_MUL, dev, blk) : NULL;
    Value *sum = start ? ops_binary(OP_ADD, r, start) : NULL;
    Value *tmp[] = {dev, blk, start, r};
    for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
      if (tmp[i]) val_decref(tmp[i]);
    r = sum;
  }
  return r ? batch_tracer(b->id, r, 0) : NULL;
}

/* ==== vmap ======================================================================= */

static bool array_leaf(Value *v) { return ops_is_array(v); }

/* [tree] with each array leaf replaced by fn(leaf, ctx). */
static Value *pytree_map_arrays(Value *tree, Value *(*fn)(Value *, void *), void *ctx) {
  return pytree_map(tree, array_leaf, fn, ctx);
}

/* The axis of each leaf of [tree] under the pytree prefix [spec] (an int,
 * None, or a container like [tree]'s): appended to [axes] (INT64_MIN:
 * None). */
typedef struct Axes {
  int64_t *v;   /* inl, or allocated past its length */
  int n, cap;
  int64_t inl[8];
} Axes;

static int axes_push(Axes *a, int64_t x) {
  if (!a->cap) {
    a->v = a->inl;
    a->cap = (int)(sizeof a->inl / sizeof *a->inl);
  }
  if (a->n == a->cap) {
    int cap = a->cap * 2;
    int64_t *v = shm_realloc(a->v == a->inl ? NULL : a->v, sizeof(int64_t) * (size_t)cap);
    if (!v) return err_nomem(), -1;
    if (a->v == a->inl) memcpy(v, a->inl, sizeof a->inl);
    a->v = v, a->cap = cap;
  }
  a->v[a->n++] = x;
  return 0;
}

#define NO_AXIS INT64_MIN

static int spec_axes(const char *what, Value *tree, Value *spec, Axes *out) {
  if (spec == VAL_NONE || IS_ARRAY(spec)) {
    int64_t ax = NO_AXIS;
    if (spec != VAL_NONE && arr_to_index(spec, &ax) < 0) return -1;
    PyLeaves l = {0};
    if (pytree_flatten(tree, array_leaf, &l) < 0) return -1;
    int rc = 0;
    for (int i = 0; i < l.n && rc == 0; i++) rc = axes_push(out, ax);
    pytree_leaves_free(&l);
    return rc;
  }
  Value *tk, *sk;   /* a registered class's instance holding axes */
  int custom = pytree_prefix_children(tree, spec, &tk, &sk, what);
  if (custom) {
    int rc = custom < 0 ? -1 : spec_axes(what, tk, sk, out);
    val_decref(tk);
    val_decref(sk);
    return rc;
  }
  size_t n, m;
  Value *const *ts, *const *ss;
  if ((spec->type == V_TUPLE || spec->type == V_LIST) && val_seq(tree, &n, &ts) &&
      val_seq(spec, &m, &ss) && n == m && tree->type != V_DICT) {
    for (size_t i = 0; i < n; i++)
      if (spec_axes(what, ts[i], ss[i], out) < 0) return -1;
    return 0;
  }
  if (spec->type == V_DICT && tree->type == V_DICT) {
    Dict *d = (Dict *)tree;
    size_t *order = pytree_key_order(tree);
    int rc = order ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < d->len; i++) {
      Value *k = d->keys[order[i]];
      Value *sv = dict_get(spec, k), *tv = d->vals[order[i]];
      if (!sv) {
        err_set(ERR_VALUE, "vmap %s is not a tree prefix of the arguments: a dict lacks a key "
                           "of the argument's", what);
        rc = -1;
      } else {
        rc = spec_axes(what, tv, sv, out);
      }
    }
    shm_free(order);
    return rc;
  }
  err_set(ERR_VALUE, "vmap %s specification must be a tree prefix of the corresponding value, "
                     "got %s for a %s", what, val_type_name(spec), val_type_name(tree));
  return -1;
}

/* The vmap configuration a vmapped function carries. */
enum { VM_FUN, VM_IN, VM_OUT, VM_NAME, VM_SIZE, VM_N };

typedef struct WrapCtx {
  BatchTrace *bt;
  const int64_t *axes;
  int pos;
} WrapCtx;

static Value *wrap_leaf(Value *v, void *vctx) {
  WrapCtx *c = vctx;
  int64_t ax = c->axes[c->pos++];
  return ax == NO_AXIS ? val_incref(v) : batch_tracer(c->bt->id, val_incref(v), (int)ax);
}

typedef struct OutCtx {
  BatchTrace *bt;
  const int64_t *axes;
  int pos;
} OutCtx;

/* A result leaf with its batch axis at its out_axes position. */
static Value *out_leaf(Value *v, void *vctx) {
  OutCtx *c = vctx;
  int64_t ax = c->axes[c->pos++];
  AVal a;
  if (prim_value_aval(v, &a) < 0) return NULL;
  bool mine = is_batch_of(v, c->bt->id);
  if (ax == NO_AXIS) {
    if (mine)
      return err_set(ERR_VALUE, "vmap has mapped output but out_axes is None");
    return val_incref(v);
  }
  int nd = a.ndim + 1;
  if (ax < 0) ax += nd;
  if (ax < 0 || ax >= nd)
    return err_set(ERR_VALUE, "vmap out_axes %lld is out of bounds for a result of rank %d",
                   (long long)ax, a.ndim);
  if (mine) return prim_batch_moveaxis(((Tracer *)v)->batched, ((Tracer *)v)->bdim, (int)ax);
  int64_t sh[SHM_MAXDIM], bd[SHM_MAXDIM];
  for (int i = 0, k = 0; i < nd; i++) {
    sh[i] = i == ax ? c->bt->size : a.shape[k];
    if (i != ax) bd[k] = i, k++;
  }
  Params p;
  params_init(&p);
  params_add(&p, "shape", val_int_tuple(nd, sh));
  params_add(&p, "broadcast_dimensions", val_int_tuple(a.ndim, bd));
  Value *r = prim_apply(P_BROADCAST_IN_DIM, 1, &v, &p);
  params_clear(&p);
  return r;
}

/* The batch size from the mapped leaves (checked to agree and to be in
 * range), or the axis_size given. */
static int batch_size(Value *args, const Axes *ax, Value *size_v, int64_t *size) {
  PyLeaves l = {0};
  if (pytree_flatten(args, array_leaf, &l) < 0) return -1;
  int64_t n = -1;
  int first = -1, rc = 0;
  for (int i = 0; i < l.n && rc == 0; i++) {
    if (ax->v[i] == NO_AXIS) continue;
    AVal a;
    if ((rc = prim_value_aval(l.v[i], &a)) < 0) break;
    int64_t k = ax->v[i] < 0 ? ax->v[i] + a.ndim : ax->v[i];
    if (k < 0 || k >= a.ndim) {
      char s[128];
      aval_str(s, sizeof s, a.dtype, a.ndim, a.shape);
      err_set(ERR_VALUE, "vmap was requested to map its argument along axis %lld, which implies "
                         "that its rank should be at least %lld, but is only %d (its type is %s)",
              (long long)ax->v[i], (long long)(ax->v[i] < 0 ? -ax->v[i] : ax->v[i] + 1), a.ndim, s);
      rc = -1;
      break;
    }
    ax->v[i] = k;
    if (n >= 0 && a.shape[k] != n) {
      err_set(ERR_VALUE, "vmap got inconsistent sizes for array axes to be mapped: leaf %d has "
                         "size %lld along axis %lld, leaf %d has size %lld", first, (long long)n,
              (long long)ax->v[first], i, (long long)a.shape[k]);
      rc = -1;
    }
    if (n < 0) n = a.shape[k], first = i;
  }
  pytree_leaves_free(&l);
  if (rc < 0) return -1;
  if (size_v != VAL_NONE) {
    int64_t s;
    if (arr_to_index(size_v, &s) < 0) return -1;
    if (n >= 0 && s != n) {
      err_set(ERR_VALUE, "vmap got axis_size=%lld but the mapped axes have size %lld",
              (long long)s, (long long)n);
      return -1;
    }
    n = s;
  }
  if (n < 0) {
    err_set(ERR_VALUE, "vmap must have at least one non-None value in in_axes, or be given "
                       "axis_size");
    return -1;
  }
  *size = n;
  return 0;
}

static Value *vmap_call(Value *self, const CallArgs *a) {
  Value *fun = tuple_get(self, VM_FUN), *in_axes = tuple_get(self, VM_IN);
  Value *name = tuple_get(self, VM_NAME);
  Value *args = tuple_pack((size_t)a->nargs, a->args), *spec = NULL, *r = NULL, *res = NULL;
  Value *wrapped = NULL, *kw = NULL;
  Axes ax = {0}, oax = {0};
  if (!args) return NULL;
  /* in_axes: one spec for all, or one per positional argument */
  size_t n;
  Value *const *items;
  if (in_axes->type == V_LIST && val_seq(in_axes, &n, &items))
    spec = tuple_pack(n, items);
  else
    spec = val_incref(in_axes);
  if (spec->type == V_TUPLE && tuple_len(spec) != (size_t)a->nargs) {
    err_set(ERR_VALUE, "vmap in_axes must be an int, None, or a tuple of entries corresponding "
                       "to the positional arguments passed to the function, but got "
                       "len(in_axes)=%zu, len(args)=%d", tuple_len(spec), a->nargs);
    goto out;
  }
  if (spec_axes("in_axes", args, spec, &ax) < 0) goto out;
  /* keyword arguments are mapped over their leading axis, as in JAX */
  Value *kwt = a->nkw ? tuple_pack((size_t)a->nkw, a->kwvals) : NULL;
  Value *zero = val_int(0);
  if (kwt && spec_axes("in_axes", kwt, zero, &ax) < 0) {
    val_decref(kwt);
    val_decref(zero);
    goto out;
  }
  val_decref(zero);
  Value *all = kwt ? tuple_pack(2, (Value *[]){args, kwt}) : val_incref(args);
  if (kwt) val_decref(kwt);
  BatchTrace bt = {trace_next_id(), 0, name == VAL_NONE ? NULL : intern_cstr(str_cstr(name)),
                   batch_top, false, NULL, 0};
  int rc = all ? batch_size(all, &ax, tuple_get(self, VM_SIZE), &bt.size) : -1;
  if (rc < 0) {
    if (all) val_decref(all);
    goto out;
  }
  batch_top = &bt;
  WrapCtx wc = {&bt, ax.v, 0};
  wrapped = pytree_map_arrays(all, wrap_leaf, &wc);
  val_decref(all);
  if (wrapped) {
    Value *pos = a->nkw ? tuple_get(wrapped, 0) : wrapped;
    kw = a->nkw ? tuple_get(wrapped, 1) : NULL;
    CallArgs c = {a->nargs, ((Tuple *)pos)->items, a->nkw, a->kwnames,
                  kw ? ((Tuple *)kw)->items : NULL};
    res = val_call(fun, &c);
  }
  batch_top = bt.parent;
  if (!res) goto out;
  Value *out_axes = tuple_get(self, VM_OUT);
  Value *ospec = out_axes->type == V_LIST && val_seq(out_axes, &n, &items)
                     ? tuple_pack(n, items) : val_incref(out_axes);
  if (ospec && spec_axes("out_axes", res, ospec, &oax) == 0) {
    OutCtx oc = {&bt, oax.v, 0};
    r = pytree_map_arrays(res, out_leaf, &oc);
  }
  if (ospec) val_decref(ospec);
out:
  if (ax.v != ax.inl) shm_free(ax.v);
  if (oax.v != oax.inl) shm_free(oax.v);
  if (res) val_decref(res);
  if (wrapped) val_decref(wrapped);
  if (spec) val_decref(spec);
  val_decref(args);
  return r;
}

/* vmap(fun, in_axes=0, out_axes=0, axis_name=None, axis_size=None) */
static Value *bi_vmap(const CallArgs *a) {
  Value *fun, *in_axes = NULL, *out_axes = NULL, *name = NULL, *size = NULL;
  if (args_bind("vmap", a, "fun, in_axes=, out_axes=, axis_name=, axis_size=",
                (Value **[]){&fun, &in_axes, &out_axes, &name, &size}) < 0)
    return NULL;
  if (name && name != VAL_NONE && name->type != V_STR)
    return err_set(ERR_TYPE, "vmap axis_name must be a str, got %s", val_type_name(name));
  Value *zero = val_int(0);
  Value *cfg = tuple_pack(VM_N, (Value *[]){fun, in_axes ? in_axes : zero,
                                            out_axes ? out_axes : zero, name ? name : VAL_NONE,
                                            size ? size : VAL_NONE});
  val_decref(zero);
  if (!cfg) return NULL;
  Value *r = bound_new("vmap", vmap_call, cfg);
  val_decref(cfg);
  return r;
}

/* ==== vmap in and around shard_map bodies ========================================= */

Value *batch_vmap_of(unsigned id, Value *fun, Value *in_axes) {
  BatchTrace *bt = batch_find(id);
  if (!bt) return err_set(ERR_VALUE, "vmap: batch trace %u is not open on this thread", id);
  Value *zero = val_int(0), *name = bt->name ? str_from(bt->name) : val_incref(VAL_NONE);
  Value *cfg = tuple_pack(VM_N, (Value *[]){fun, in_axes, zero, name, VAL_NONE});
  Value *r = cfg ? bound_new("vmap", vmap_call, cfg) : NULL;
  Value *tmp[] = {zero, name, cfg};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  return r;
}

/* The callable a vmap of a shard_map body wraps; else NULL. */
static Value *vmap_inner(Value *body) {
  BoundMethod *b = (BoundMethod *)body;
  if (body->type != V_BOUND) return NULL;
  return b->fn == vmap_call ? tuple_get(b->self, VM_FUN) : NULL;
}

/* The slots of what the body a vmap of a shard_map body wraps records
 * (shardmap_add_shared). */
static int vmap_shared(Value *body, Value ***slots, int cap) {
  Value *inner = vmap_inner(body);
  return inner ? shardmap_shared_slots(inner, slots, cap) : 0;
}

/* shardmap_settle for such a body: the body it wraps settles. */
static int vmap_settle(Value *body) {
  Value *inner = vmap_inner(body);
  if (!inner || shardmap_settle(inner) < 0) return inner ? -1 : 0;
  return 0;
}

/* ==== named batch traces (xmap) ===================================================== */

unsigned batch_begin(const char *name, int64_t size) {
  BatchTrace *b = shm_calloc(1, sizeof *b);
  if (!b) return err_nomem(), 0;
  b->id = trace_next_id();
  b->size = size;
  b->name = name;
  b->parent = batch_top;
  b->owned = true;
  batch_top = b;
  return b->id;
}

void batch_end(unsigned id) {
  BatchTrace *b = batch_top;
  if (!b || b->id != id || !b->owned) return;
  batch_top = b->parent;
  if (b->resources) val_decref(b->resources);
  shm_free(b);
}

void batch_set_resources(unsigned id, Value *axes, int64_t size) {
  BatchTrace *b = batch_find(id);
  if (!b || !b->owned) return;
  if (b->resources) val_decref(b->resources);
  b->resources = axes ? val_incref(axes) : NULL;
  b->res_size = size;
}

Value *batch_wrap(unsigned id, Value *x, int axis) { return batch_tracer(id, val_incref(x), axis); }

bool batch_carries(Value *v, unsigned id) {
  for (; IS_BATCH_TRACER(v); v = ((Tracer *)v)->batched)
    if (((Tracer *)v)->trace_id == id) return true;
  return false;
}

Value *batch_unwrap_front(unsigned id, Value *v, int64_t size) {
  if (is_batch_of(v, id)) return prim_batch_moveaxis(((Tracer *)v)->batched, ((Tracer *)v)->bdim, 0);
  if (batch_carries(v, id))   /* callers unwrap the innermost traces first */
    return err_set(ERR_VALUE, "xmap: a named axis is nested under another one");
  return prim_batch_repeat_front(v, size);
}

/* ==== named axes seen by the language: reductions, .named_shape, one_hot ========= */

/* Whether mesh axis [name] holds a named axis in scope (xmap
 * axis_resources): the body runs on its devices, but the name is not one
 * of the body's (reducing over it would depend on the resources). */
static bool is_resource(const char *name) {
  for (BatchTrace *b = batch_top; b; b = b->parent) {
    size_t n = 0;
    Value *const *axes;
    if (!b->resources || !val_seq(b->resources, &n, &axes)) continue;
    for (size_t i = 0; i < n; i++)
      if (axes[i]->type == V_STR && !strcmp(str_cstr(axes[i]), name)) return true;
  }
  return false;
}

/* The size of [name] for a reduction over it: a vmap/xmap axis in scope
 * (*named set), a staged xmap body's, or a mesh axis of the enclosing
 * shard_map body that no named axis is mapped to; else JAX's "unbound
 * axis name" error.  0 or -1. */
static int reduce_axis_size(const char *name, int64_t *size, bool *named) {
  *named = vmap_axis_size(name, size);
  if (*named) return 0;
  DevCtx *d = dev_ctx();
  int ax = d && d->mesh && !is_resource(name) ? dev_mesh_axis(d->mesh, name) : -1;
  if (ax < 0) return err_set(ERR_NAME, "unbound axis name: %s", name), -1;
  if (d->mesh->auto_axes >> ax & 1) return coll_auto_axis("reduction", d->mesh, ax);
  *size = d->mesh->sizes[ax];
  return 0;
}

/* [x] reduced over the [n] axes [names] by one collective of [kind]'s
 * row: over several mesh axes, the same order of additions as the eager
 * body's psum over them, which reducing name by name would change. */
static Value *reduce_mesh_axes(PrimId kind, Value *x, Value *const *names, size_t n) {
  Params p;
  params_init(&p);
  params_add(&p, "axes", tuple_pack(n, (Value **)names));
  params_add(&p, "axis_index_groups", val_incref(VAL_NONE));
  Value *r = prim_bind(coll_for_reduce(kind), 1, &x, &p);
  params_clear(&p);
  return r;
}

/* [x] reduced over one named axis [nm] as [kind] (sum, max, min: the
 * collective whose row reduces so; any other, such as prod: gathered,
 * then reduced, coll_named_gathered); *size gets the axis's size. */
static Value *reduce_one_name(PrimId kind, Value *x, Value *nm, int64_t *size) {
  bool named;
  if (reduce_axis_size(str_cstr(nm), size, &named) < 0) return NULL;
  bool same = named && !vmap_carries(x, str_cstr(nm));   /* the same at every index */
  int coll = coll_for_reduce(kind);
  if (coll < 0) return coll_named_gathered(kind, x, nm, *size, !same);
  if (same) {
    if (kind != P_REDUCE_SUM) return val_incref(x);
    Array *n = arr_scalar_i64(DT_I32, *size, true);
    Value *r = n ? ops_binary(OP_MUL, &n->hdr, x) : NULL;
    if (n) val_decref(&n->hdr);
    return r;
  }
  return reduce_mesh_axes(kind, x, &nm, 1);
}

/* Reduces [x] over the named axes [names], one after the other; a run
 * of consecutive mesh axes is one collective (reduce_mesh_axes)
 * (ops_named_reduce_hook). */
static Value *named_reduce_hook(PrimId kind, Value *x, Value *names, int64_t *size) {
  Value *r = val_incref(x), *const *items = ((Tuple *)names)->items;
  int64_t total = 1, one = 1;
  size_t n = tuple_len(names), mesh = 0;   /* names[i - mesh, i) are mesh axes */
  bool collective = coll_for_reduce(kind) >= 0, named = true;
  for (size_t i = 0; r && i <= n; i++) {
    if (i < n && collective) {
      if (reduce_axis_size(str_cstr(items[i]), &one, &named) < 0) {
        val_decref(r);
        return NULL;
      }
      if (!named) {
        total *= one;
        mesh++;
        continue;
      }
    }
    Value *next;
    if (mesh) {
      next = reduce_mesh_axes(kind, r, items + i - mesh, mesh);
      val_decref(r);
      r = next;
      mesh = 0;
    }
    if (r && i < n) {   /* a vmap or xmap name, or a reduction with no collective */
      next = reduce_one_name(kind, r, items[i], &one);
      total *= one;
      val_decref(r);
      r = next;
    }
  }
  if (size) *size = total;
  return r;
}

/* .named_shape: the names of the vmap/xmap axes a value varies along. */
static Value *named_shape_hook(Value *x) {
  Value *d = dict_new();
  Value *v = x;
  for (; d && IS_BATCH_TRACER(v); v = ((Tracer *)v)->batched) {
    BatchTrace *bt = batch_find(((Tracer *)v)->trace_id);
    if (!bt || !bt->name) continue;
    Value *n = val_int(bt->size);
    dict_set_str(d, bt->name, n);
    val_decref(n);
  }
  /* a staged xmap body's value (jit): its named shape, innermost name
   * first like the batch traces' */
  const NamedShape *ns = trace_named(v);
  for (int i = ns ? ns->n - 1 : -1; d && i >= 0; i--) {
    Value *n = val_int(ns->size[i]);
    dict_set_str(d, ns->name[i], n);
    val_decref(n);
  }
  return d;
}

/* ==== registration ================================================================ */

int batch_register(Env *b) {
  trace_set_kind(TR_BATCH, batch_apply, batch_truth);
  shardmap_add_shared(vmap_shared, vmap_settle);
  static const NamedAxisHooks hooks = {vmap_axis_size, vmap_axis_index, vmap_carries};
  shardmap_set_named_axes(&hooks);
  ops_named_reduce_hook = named_reduce_hook;
  ops_named_shape_hook = named_shape_hook;
  Value *v = builtin_new("vmap", bi_vmap,
                         "vmap(fun, in_axes=0, out_axes=0, axis_name=None, axis_size=None)");
  int rc = v && env_set(b, intern_cstr("vmap"), v) == 0 && builtins_add_to("jax", "vmap", v) == 0
               ? 0 : -1;
  if (v) val_decref(v);
  return rc;
}

/* ==== queries for control flow ==================================================== */

static bool is_array_leaf(Value *v) { return ops_is_array(v); }

bool batch_has_leaf(Value *tree) {
  PyLeaves l = {0};
  bool any = false;
  if (pytree_flatten(tree, is_array_leaf, &l) == 0)
    for (int i = 0; i < l.n && !any; i++) any = IS_BATCH_TRACER(l.v[i]);
  else
    err_clear();
  pytree_leaves_free(&l);
  return any;
}

bool batch_axis_info(const char *name, unsigned *id, int64_t *size, Value **resources) {
  BatchTrace *b = batch_named(name);
  if (!b) return false;
  *id = b->id;
  *size = b->size;
  *resources = b->resources;
  return true;
}

bool batch_trace_open(unsigned id, int64_t *size) {
  BatchTrace *b = batch_find(id);
  if (b) *size = b->size;
  return b != NULL;
}

int64_t batch_trace_size(unsigned id) {
  BatchTrace *b = batch_find(id);
  return b ? b->size : 0;
}

Value *batch_wrap_steal(unsigned id, Value *x, int axis) { return batch_tracer(id, x, axis); }
