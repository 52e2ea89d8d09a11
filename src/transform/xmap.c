/*
 * xmap.c - xmap, named axes (xmap.h).
 */
#include <string.h>

#include "array/prim.h"
#include "array/print.h"
#include "base/intern.h"
#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/ops.h"
#include "lang/pytree.h"
#include "spmd/collective.h"
#include "spmd/device.h"
#include "spmd/mesh.h"
#include "spmd/shardmap.h"
#include "transform/batch.h"
#include "transform/compile_impl.h"
#include "transform/control.h"
#include "transform/higher.h"
#include "transform/plan.h"
#include "transform/trace.h"
#include "transform/xmap.h"

enum { XM_MAXNAMES = 16 };

/* One axis mapping: positional axis -> name, sorted by position. */
typedef struct Mapping {
  int n;
  int64_t pos[XM_MAXNAMES];
  const char *name[XM_MAXNAMES];   /* interned */
  Value *spec;                     /* the user's spelling (borrowed), for messages */
} Mapping;

/* Whether [v] is an axis mapping: a dict {position: name} or a list of
 * names ending in `...` (seed 001). */
static bool is_mapping(Value *v) {
  if (v->type == V_DICT) {
    Dict *d = (Dict *)v;
    for (size_t i = 0; i < d->len; i++)
      if (!IS_ARRAY(d->keys[i])) return false;
    return true;
  }
  size_t n;
  Value *const *items;
  if (v->type != V_LIST || !val_seq(v, &n, &items) || n == 0 || items[n - 1] != VAL_ELLIPSIS)
    return false;
  for (size_t i = 0; i + 1 < n; i++)
    if (items[i]->type != V_STR) return false;
  return true;
}

static int mapping_read(Value *v, Mapping *m) {
  memset(m, 0, sizeof *m);
  m->spec = v;
  if (v->type == V_DICT) {
    Dict *d = (Dict *)v;
    for (size_t i = 0; i < d->len; i++) {
      if (m->n == XM_MAXNAMES || d->vals[i]->type != V_STR ||
          arr_to_index(d->keys[i], &m->pos[m->n]) < 0) {
        err_clear();
        err_set(ERR_TYPE, "xmap axis mappings are {position: name} dicts with str names");
        return -1;
      }
      m->name[m->n++] = intern_cstr(str_cstr(d->vals[i]));
    }
  } else {
    size_t n;
    Value *const *items;
    val_seq(v, &n, &items);
    for (size_t i = 0; i + 1 < n && m->n < XM_MAXNAMES; i++) {
      m->pos[m->n] = (int64_t)i;
      m->name[m->n++] = intern_cstr(str_cstr(items[i]));
    }
  }
  for (int i = 1; i < m->n; i++)   /* by position */
    for (int j = i; j > 0 && m->pos[j - 1] > m->pos[j]; j--) {
      int64_t p = m->pos[j];
      const char *nm = m->name[j];
      m->pos[j] = m->pos[j - 1], m->name[j] = m->name[j - 1];
      m->pos[j - 1] = p, m->name[j - 1] = nm;
    }
  for (int i = 0; i < m->n; i++)
    for (int j = 0; j < i; j++)
      if (m->name[i] == m->name[j]) {
        err_set(ERR_VALUE, "xmap: the axis mapping names '%s' twice", m->name[i]);
        return -1;
      }
  return 0;
}

/* The mappings of the array leaves of [tree] under the prefix [spec]. */
typedef struct Mappings {
  Mapping *v;
  int n, cap;
} Mappings;

static int mappings_push(Mappings *ms, Value *spec) {
  if (ms->n == ms->cap) {
    int cap = ms->cap ? 2 * ms->cap : 8;
    Mapping *v = shm_realloc(ms->v, sizeof(Mapping) * (size_t)cap);
    if (!v) return err_nomem(), -1;
    ms->v = v, ms->cap = cap;
  }
  return mapping_read(spec, &ms->v[ms->n++]);
}

static bool array_leaf(Value *v) { return ops_is_array(v); }

/* [tree] with each array leaf replaced by fn(leaf, ctx). */
static Value *pytree_map_arrays(Value *tree, Value *(*fn)(Value *, void *), void *ctx) {
  return pytree_map(tree, array_leaf, fn, ctx);
}

static int spec_leaves(const char *what, Value *tree, Value *spec, Mappings *out) {
  if (is_mapping(spec)) {
    PyLeaves l = {0};
    if (pytree_flatten(tree, array_leaf, &l) < 0) return -1;
    int rc = 0;
    for (int i = 0; i < l.n && rc == 0; i++) rc = mappings_push(out, spec);
    pytree_leaves_free(&l);
    return rc;
  }
  size_t n, m;
  Value *const *ts, *const *ss;
  if ((spec->type == V_TUPLE || spec->type == V_LIST) && tree->type != V_DICT &&
      val_seq(tree, &n, &ts) && val_seq(spec, &m, &ss) && n == m) {
    for (size_t i = 0; i < n; i++)
      if (spec_leaves(what, ts[i], ss[i], out) < 0) return -1;
    return 0;
  }
  err_set(ERR_VALUE, "xmap %s must be a tree prefix of the %s whose leaves are axis mappings "
                     "({position: name} or [name, ..., ...]), got %s for a %s", what,
          strcmp(what, "in_axes") ? "results" : "arguments", val_type_name(spec),
          val_type_name(tree));
  return -1;
}

/* ==== the call ===================================================================== */

/* The named axes of a call, in order of first appearance. */
typedef struct Names {
  int n;
  const char *name[XM_MAXNAMES];
  int64_t size[XM_MAXNAMES];
  unsigned id[XM_MAXNAMES];
} Names;

static int names_find(const Names *ns, const char *name) {
  for (int i = 0; i < ns->n; i++)
    if (ns->name[i] == name) return i;
  return -1;
}

/* Records the names and sizes [leaf] brings under [m], checking that
 * every name has one size (the seed's error). */
static int names_add(Names *ns, Value *leaf, const Mapping *m) {
  AVal a;
  if (prim_value_aval(leaf, &a) < 0) return -1;
  for (int k = 0; k < m->n; k++) {
    int64_t p = m->pos[k] < 0 ? m->pos[k] + a.ndim : m->pos[k];
    char sh[128], sp[128] = "";
    if (p < 0 || p >= a.ndim) {
      aval_str(sh, sizeof sh, a.dtype, a.ndim, a.shape);
      return err_set(ERR_VALUE, "xmap: in_axes maps axis %lld of an argument of type %s",
                     (long long)m->pos[k], sh), -1;
    }
    int i = names_find(ns, m->name[k]);
    if (i >= 0 && ns->size[i] != a.shape[p]) {
      if (m->spec->type == V_LIST) {   /* written as the user wrote it: ['i', ...] */
        int o = snprintf(sp, sizeof sp, "[");
        for (int q = 0; q < m->n && o < 100; q++)
          o += snprintf(sp + o, sizeof sp - (size_t)o, "'%s', ", m->name[q]);
        snprintf(sp + o, sizeof sp - (size_t)o, "...]");
      } else {
        Value *r = val_repr(m->spec);
        if (r) snprintf(sp, sizeof sp, "%s", str_cstr(r)), val_decref(r);
      }
      int o = snprintf(sh, sizeof sh, "(");
      for (int d = 0; d < a.ndim && o < 100; d++)
        o += snprintf(sh + o, sizeof sh - (size_t)o, "%s%lld", d ? ", " : "", (long long)a.shape[d]);
      snprintf(sh + o, sizeof sh - (size_t)o, a.ndim == 1 ? ",)" : ")");
      return err_set(ERR_VALUE, "the size of axis '%s' was previously inferred to be %lld, but "
                                "found an argument of shape %s with in_axes %s: %lld != %lld",
                     m->name[k], (long long)ns->size[i], sh, sp, (long long)a.shape[p],
                     (long long)ns->size[i]), -1;
    }
    if (i < 0) {
      if (ns->n == XM_MAXNAMES) return err_set(ERR_VALUE, "xmap: too many named axes"), -1;
      ns->name[ns->n] = m->name[k];
      ns->size[ns->n++] = a.shape[p];
    }
  }
  return 0;
}

/* [leaf] with the axes of [m] made named: wrapped by each name's trace,
 * outermost trace first, each position counted without the axes already
 * named. */
static Value *name_leaf(Value *leaf, const Mapping *m, const Names *ns) {
  AVal a;
  if (prim_value_aval(leaf, &a) < 0) return NULL;
  Value *v = val_incref(leaf);
  bool done[XM_MAXNAMES] = {false};
  for (int t = 0; t < ns->n && v; t++) {   /* traces in order of their ids */
    int k = -1;
    for (int i = 0; i < m->n; i++)
      if (m->name[i] == ns->name[t]) k = i;
    if (k < 0) continue;
    int64_t p = m->pos[k] < 0 ? m->pos[k] + a.ndim : m->pos[k], q = p;
    for (int i = 0; i < m->n; i++) {
      int64_t pi = m->pos[i] < 0 ? m->pos[i] + a.ndim : m->pos[i];
      if (done[i] && pi < p) q--;
    }
    Value *w = batch_wrap(ns->id[t], v, (int)q);
    val_decref(v);
    v = w;
    done[k] = true;
  }
  return v;
}

/* A result leaf back to positions: each named axis it carries, and each
 * [m] places, unwrapped to the front (innermost trace first), then moved
 * where [m] puts it. */
static Value *place_leaf(Value *leaf, const Mapping *m, const Names *ns, int k_leaf) {
  Value *v = val_incref(leaf);
  int order[XM_MAXNAMES], no = 0;   /* names now in front, front first */
  for (int t = ns->n - 1; t >= 0 && v; t--) {
    bool placed = false;
    for (int i = 0; i < m->n; i++) placed |= m->name[i] == ns->name[t];
    bool carried = batch_carries(v, ns->id[t]);
    if (!placed && carried) {
      val_decref(v);
      return err_set(ERR_VALUE, "xmap: result %d has the named axis '%s', which out_axes does "
                                "not place; name its position in out_axes", k_leaf, ns->name[t]);
    }
    if (!placed) continue;
    Value *u = batch_unwrap_front(ns->id[t], v, ns->size[t]);
    val_decref(v);
    v = u;
    for (int i = no; i > 0; i--) order[i] = order[i - 1];
    order[0] = t;
    no++;
  }
  for (int i = 0; v && i < m->n; i++)
    if (names_find(ns, m->name[i]) < 0) {
      val_decref(v);
      return err_set(ERR_NAME, "xmap: out_axes names '%s', which no argument introduced",
                     m->name[i]);
    }
  if (!v) return NULL;
  AVal a;
  if (prim_value_aval(v, &a) < 0) {
    val_decref(v);
    return NULL;
  }
  /* the result's axis d: the named front axis of the name mapped there,
   * else the next positional axis (after the front block) */
  int64_t perm[SHM_MAXDIM];
  int next = no;
  for (int d = 0; d < a.ndim; d++) {
    int k = -1;
    for (int i = 0; i < m->n; i++) {
      int64_t p = m->pos[i] < 0 ? m->pos[i] + a.ndim : m->pos[i];
      if (p == d) k = i;
    }
    if (k >= 0) {
      int t = names_find(ns, m->name[k]), f = 0;
      while (f < no && order[f] != t) f++;
      perm[d] = f;
    } else {
      perm[d] = next++;
    }
  }
  bool ident = true;
  for (int d = 0; d < a.ndim; d++) ident &= perm[d] == d;
  if (ident) return v;
  Params p;
  params_init(&p);
  params_add(&p, "permutation", val_int_tuple(a.ndim, perm));
  Value *r = prim_apply_rule(P_TRANSPOSE, 1, &v, &p);
  val_decref(v);
  return r;
}

enum { XM_FUN, XM_IN, XM_OUT, XM_RES, XM_N };

/* A list spec at the top is a tuple of per-argument specs unless it is
 * itself an axis mapping. */
static Value *top_spec(Value *spec) {
  size_t n;
  Value *const *items;
  if (spec->type == V_LIST && !is_mapping(spec) && val_seq(spec, &n, &items))
    return tuple_pack(n, items);
  return val_incref(spec);
}

typedef struct LeafCtx {
  Mappings *ms;
  Names *ns;
  int pos;
} LeafCtx;

static Value *in_leaf(Value *v, void *vctx) {
  LeafCtx *c = vctx;
  return name_leaf(v, &c->ms->v[c->pos++], c->ns);
}

static Value *out_leaf(Value *v, void *vctx) {
  LeafCtx *c = vctx;
  int k = c->pos++;
  return place_leaf(v, &c->ms->v[k], c->ns, k);
}


/* The mesh axes (a tuple of names, new reference) [res] maps [name] to,
 * and their total size on the device's mesh [m]; NULL without error when
 * it has none. */
static Value *resource_axes(Value *res, const char *name, const MeshDesc *m, int64_t *size) {
  Value *r = res && res->type == V_DICT ? dict_get_str(res, name) : NULL;
  if (!r) return NULL;
  Value *t = r->type == V_STR ? tuple_pack(1, &r) : val_incref(r);
  size_t n;
  Value *const *items;
  *size = 1;
  for (size_t i = 0; t && val_seq(t, &n, &items) && i < n; i++) {
    int ax = m ? dev_mesh_axis(m, intern_cstr(str_cstr(items[i]))) : -1;
    *size *= ax >= 0 ? m->sizes[ax] : 1;
  }
  return t;
}

static Value *xmap_run(Value *self, const CallArgs *a, bool local);
static Value *xmap_on_mesh(Value *self, const CallArgs *a, Mesh *m);
static bool stage_here(Value *self, const CallArgs *a);
static Value *xmap_stage(Value *self, const CallArgs *a);

/* The body of an xmap with resources, on one device of the mesh: the
 * resource-free xmap of the device's blocks, its named axes marked as
 * split over their mesh axes. */
static Value *xmap_local(Value *self, const CallArgs *a) { return xmap_run(self, a, true); }

/* Under jit, one xmap equation (xmap_stage); else the batching run. */
static Value *xmap_call(Value *self, const CallArgs *a) {
  return stage_here(self, a) ? xmap_stage(self, a) : xmap_run(self, a, false);
}

static Value *xmap_run(Value *self, const CallArgs *a, bool local) {
  if (a->nkw) return err_set(ERR_TYPE, "xmap functions take positional arguments only");
  Value *resv = tuple_get(self, XM_RES);
  if (!local && resv->type == V_DICT && ((Dict *)resv)->len) return xmap_on_mesh(self, a, mesh_context());
  Value *args = tuple_pack((size_t)a->nargs, a->args);
  Value *in = top_spec(tuple_get(self, XM_IN)), *out = top_spec(tuple_get(self, XM_OUT));
  Mappings ims = {0}, oms = {0};
  Names ns = {0};
  Value *wrapped = NULL, *res = NULL, *r = NULL;
  int opened = 0;
  if (!args || !in || !out || spec_leaves("in_axes", args, in, &ims) < 0) goto done;
  PyLeaves l = {0};
  if (pytree_flatten(args, array_leaf, &l) < 0) goto done;
  int rc = 0;
  for (int i = 0; i < l.n && rc == 0; i++) rc = names_add(&ns, l.v[i], &ims.v[i]);
  pytree_leaves_free(&l);
  if (rc < 0) goto done;
  for (; opened < ns.n; opened++) {
    if (!(ns.id[opened] = batch_begin(ns.name[opened], ns.size[opened]))) goto done;
    int64_t rs;
    Value *axes = local ? resource_axes(resv, ns.name[opened], dev_ctx() ? dev_ctx()->mesh : NULL, &rs) : NULL;
    if (axes) {
      batch_set_resources(ns.id[opened], axes, rs);
      val_decref(axes);
    }
  }
  LeafCtx ic = {&ims, &ns, 0};
  if (!(wrapped = pytree_map_arrays(args, in_leaf, &ic))) goto done;
  res = val_call_n(tuple_get(self, XM_FUN), a->nargs, ((Tuple *)wrapped)->items);
  if (!res || spec_leaves("out_axes", res, out, &oms) < 0) goto done;
  LeafCtx oc = {&oms, &ns, 0};
  r = pytree_map_arrays(res, out_leaf, &oc);
done:
  while (opened > 0) batch_end(ns.id[--opened]);
  shm_free(ims.v);
  shm_free(oms.v);
  Value *tmp[] = {args, in, out, wrapped, res};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  return r;
}

/* The shard_map spec of one axis mapping under [res]: each named
 * position split over its name's mesh axes (None where the name has
 * none).  Positions must be non-negative here. */
static Value *mapping_spec(Value *spec, Value *res) {
  Mapping m;
  if (mapping_read(spec, &m) < 0) return NULL;
  int64_t top = -1;
  for (int i = 0; i < m.n; i++) {
    if (m.pos[i] < 0)
      return err_set(ERR_VALUE, "xmap: with axis_resources, axis mappings take non-negative "
                                "positions");
    if (m.pos[i] > top) top = m.pos[i];
  }
  Value *entries[SHM_MAXDIM + 1];
  if (top >= SHM_MAXDIM) return err_set(ERR_VALUE, "xmap: axis position %lld out of range", (long long)top);
  for (int64_t p = 0; p <= top; p++) entries[p] = VAL_NONE;
  for (int i = 0; i < m.n; i++) {
    Value *r = res->type == V_DICT ? dict_get_str(res, m.name[i]) : NULL;
    if (r) entries[m.pos[i]] = r;
  }
  return pspec_from_args((int)(top + 1), entries);
}

/* in_axes or out_axes as shard_map specs: the same tree, each axis
 * mapping a P(...). */
static Value *specs_of(Value *spec, Value *res) {
  if (is_mapping(spec)) return mapping_spec(spec, res);
  if (spec->type == V_DICT) {
    Dict *d = (Dict *)spec;
    Value *out = dict_new();
    for (size_t i = 0; out && i < d->len; i++) {
      Value *v = specs_of(d->vals[i], res);
      if (!v || dict_set(out, d->keys[i], v) < 0) {
        if (v) val_decref(v);
        val_decref(out);
        return NULL;
      }
      val_decref(v);
    }
    return out;
  }
  size_t n;
  Value *const *items;
  if ((spec->type == V_TUPLE || spec->type == V_LIST) && val_seq(spec, &n, &items)) {
    Value *t = tuple_new(n);
    for (size_t i = 0; t && i < n; i++) {
      Value *v = specs_of(items[i], res);
      if (!v) {
        for (size_t j = i; j < n; j++) tuple_set_steal(t, j, val_incref(VAL_NONE));
        val_decref(t);
        return NULL;
      }
      tuple_set_steal(t, i, v);
    }
    return t;
  }
  return err_set(ERR_TYPE, "xmap: in_axes and out_axes hold axis mappings ({position: name} "
                           "or [name, ..., ...])");
}

/* The seed's error when mapped resources are not in scope. */
static int check_resources(Value *res, const Mesh *m) {
  const char *miss[32];
  int nm = 0;
  Dict *d = (Dict *)res;
  for (size_t i = 0; i < d->len; i++) {
    Value *r = d->vals[i], *one[1] = {r};
    size_t n;
    Value *const *items = one;
    if (r->type != V_STR && !val_seq(r, &n, &items))
      return err_set(ERR_TYPE, "xmap: axis_resources maps names to mesh axes (a name or a tuple "
                               "of names)"), -1;
    if (r->type == V_STR) n = 1;
    for (size_t k = 0; k < n && nm < 32; k++) {
      if (items[k]->type != V_STR)
        return err_set(ERR_TYPE, "xmap: axis_resources maps names to mesh axis names"), -1;
      const char *ax = intern_cstr(str_cstr(items[k]));
      bool dup = false;
      for (int j = 0; j < nm; j++) dup |= miss[j] == ax;
      if (!dup && (!m || mesh_axis(m, ax) < 0)) miss[nm++] = ax;
    }
  }
  if (!nm) return 0;
  for (int i = 1; i < nm; i++)   /* sorted, so the message is the same every run */
    for (int j = i; j > 0 && strcmp(miss[j - 1], miss[j]) > 0; j--) {
      const char *t = miss[j];
      miss[j] = miss[j - 1], miss[j - 1] = t;
    }
  char buf[512];
  int o = snprintf(buf, sizeof buf, "{");
  for (int i = 0; i < nm && o < 400; i++) o += snprintf(buf + o, sizeof buf - (size_t)o, "%s'%s'", i ? ", " : "", miss[i]);
  snprintf(buf + o, sizeof buf - (size_t)o, "}");
  err_set(ERR_VALUE, "In-scope resources are insufficient to execute the xmapped function. The "
                     "missing resources are: %s", buf);
  return -1;
}

static const char *fun_name(Value *f) {
  return f->type == V_FUNC ? ((Func *)f)->name : intern_cstr("xmap");
}

/* Every named axis must split evenly over the mesh axes it is mapped to
 * (LANGUAGE.md §10: an error naming both sizes). */
static int check_divides(Value *self, const CallArgs *a, Value *in, Value *res, const Mesh *m) {
  (void)self;
  Value *args = tuple_pack((size_t)a->nargs, a->args);
  Mappings ms = {0};
  PyLeaves l = {0};
  int rc = args && spec_leaves("in_axes", args, in, &ms) == 0 &&
                   pytree_flatten(args, array_leaf, &l) == 0 ? 0 : -1;
  for (int i = 0; rc == 0 && i < l.n; i++) {
    AVal av;
    if (prim_value_aval(l.v[i], &av) < 0) {
      rc = -1;
      break;
    }
    const Mapping *mp = &ms.v[i];
    for (int k = 0; rc == 0 && k < mp->n; k++) {
      Value *r = dict_get_str(res, mp->name[k]);
      int64_t p = mp->pos[k] < 0 ? mp->pos[k] + av.ndim : mp->pos[k], size = 1;
      if (!r || p < 0 || p >= av.ndim) continue;
      Value *one[1] = {r};
      Value *const *items = one;
      size_t n = 1;
      if (r->type != V_STR) val_seq(r, &n, &items);
      char names[160] = "";
      int o = 0;
      for (size_t q = 0; q < n; q++) {
        int ax = mesh_axis(m, intern_cstr(str_cstr(items[q])));
        size *= ax >= 0 ? m->axis_sizes[ax] : 1;
        o += snprintf(names + o, sizeof names - (size_t)o, "%s'%s'", q ? ", " : "", str_cstr(items[q]));
      }
      if (av.shape[p] % size) {
        err_set(ERR_VALUE, "xmap: the named axis '%s' (size %lld) is mapped to mesh axis %s "
                           "(size %lld), which does not divide it", mp->name[k],
                (long long)av.shape[p], names, (long long)size);
        rc = -1;
      }
    }
  }
  pytree_leaves_free(&l);
  shm_free(ms.v);
  if (args) val_decref(args);
  return rc;
}

/* An xmap with axis_resources: a shard_map over the context mesh whose
 * specs split each mapped named axis over its mesh axes, and whose body
 * is the same xmap on the device's blocks (LANGUAGE.md §10, seed 001's
 * resources; results equal the resource-free xmap's). */
static Value *xmap_on_mesh(Value *self, const CallArgs *a, Mesh *m) {
  Value *res = tuple_get(self, XM_RES);
  if (check_resources(res, m) < 0) return NULL;
  Value *in = top_spec(tuple_get(self, XM_IN)), *out = top_spec(tuple_get(self, XM_OUT));
  if (in && check_divides(self, a, in, res, m) < 0) in = (val_decref(in), NULL);
  Value *ins = in ? specs_of(in, res) : NULL, *outs = ins && out ? specs_of(out, res) : NULL;
  if (ins && ins->type != V_TUPLE && ins->type != V_PSPEC) {   /* one argument's tree */
    Value *t = tuple_pack(1, &ins);
    val_decref(ins);
    ins = t;
  }
  Value *body = outs ? bound_new("xmap", xmap_local, self) : NULL;
  Value *sf = body ? shardmap_new(fun_name(tuple_get(self, XM_FUN)), body, &m->hdr, ins, outs, false) : NULL;
  Value *r = sf ? val_call(sf, a) : NULL;
  Value *tmp[] = {in, out, ins, outs, body, sf};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  return r;
}

/* ==== under jit: one xmap equation (LANGUAGE.md §10) ================================ */

/*
 * Called while a jit trace is open, an xmap stages as one `xmap` equation,
 * as JAX's xmap_p did: its body is traced once per named index, each
 * argument a tracer of the positional axes its mapping leaves, carrying the
 * mapped names in its named shape (trace.h), with the xmap's names in
 * scope.  The equation's parameters are the per-operand axis mappings
 * (in_axes, out_axes), axis_resources, the mesh they refer to and the body
 * (call_jaxpr).  The compiled executor runs it by lowering (xmap_lower):
 * the body plan is evaluated equation by equation through the primitive
 * table inside the very batching (and resource) machinery an eager call
 * uses, which records the positional plan that is compiled.
 */

static bool lowerable(const Plan *p);

/* Whether [a]'s names are all in [b]'s. */
static bool named_within(const NamedShape *a, const NamedShape *b) {
  for (int k = 0; a && k < a->n; k++)
    if (!b || plan_named_find(b, a->name[k]) < 0) return false;
  return true;
}

bool xmap_carries_settle(const Plan *body, int first, int n, const NamedShape *pred) {
  if (first + n > body->nin || n > body->nout) return false;
  for (int i = 0; i < n; i++) {
    const NamedShape *in = plan_var_named(body, body->invars[first + i]);
    if (!named_within(plan_var_named(body, body->outs[i].var), in) || !named_within(pred, in))
      return false;
  }
  return true;
}

bool xmap_subs_lowerable(Value *v) {
  if (!v) return false;
  if (IS_PLAN(v)) return lowerable(AS_PLAN(v));
  for (size_t i = 0; v->type == V_TUPLE && i < tuple_len(v); i++)
    if (!xmap_subs_lowerable(tuple_get(v, i))) return false;
  return v->type == V_TUPLE;
}

/* Primitives a staged body may hold and the lowering can evaluate: the
 * first-order ones and collectives, and the higher-order ones whose row
 * says so (pdot; pjit, xmap, cond, while and scan of such bodies, loops
 * whose carries keep their named shapes).  A body with shard_map or a
 * callback, or a loop whose carry gains a name, is run by the batching
 * path instead (the trace of it discarded). */
static bool lowerable(const Plan *p) {
  for (int i = 0; i < p->neqn; i++) {
    const PlanEqn *e = &p->eqns[i];
    const HigherRules *h = higher_rules(e->prim);
    bool ok = prim_table[e->prim].kind != PK_HIGHER || (h && h->lowerable && h->lowerable(e));
    if (!ok) return false;
  }
  return true;
}

/* Whether a call is staged as one equation: a trace is open on this
 * thread (jit) outside a shard_map body, and every array leaf is concrete
 * or a staging tracer (values being differentiated or batched take the
 * batching path, as eagerly). */
static bool stage_here(Value *self, const CallArgs *a) {
  (void)self;
  if (!trace_current() || dev_ctx() || a->nkw) return false;
  bool ok = true;
  for (int i = 0; i < a->nargs && ok; i++) {
    PyLeaves l = {0};
    if (pytree_flatten(a->args[i], array_leaf, &l) < 0) {
      err_clear();
      return false;
    }
    for (int k = 0; k < l.n && ok; k++) ok = !IS_TRACER(l.v[k]) || IS_STAGE_TRACER(l.v[k]);
    pytree_leaves_free(&l);
  }
  return ok;
}

static int64_t norm_pos(int64_t p, int ndim) { return p < 0 ? p + ndim : p; }

/* What the body sees of argument leaf [leaf] under [m]: the positional
 * axes [m] does not name, and a named shape of the leaf's own names (an
 * enclosing staged xmap's) and [m]'s, in the call's order. */
static int body_aval(Value *leaf, const Mapping *m, const Names *ns, AVal *out, NamedShape *named) {
  AVal a;
  if (prim_value_aval(leaf, &a) < 0) return -1;
  bool drop[SHM_MAXDIM] = {false};
  for (int k = 0; k < m->n; k++) drop[norm_pos(m->pos[k], a.ndim)] = true;   /* checked by names_add */
  *out = a;
  out->ndim = 0;
  for (int d = 0; d < a.ndim; d++)
    if (!drop[d]) out->shape[out->ndim++] = a.shape[d];
  const NamedShape *own = trace_named(leaf);
  named->n = 0;
  if (own) *named = *own;
  for (int t = 0; t < ns->n; t++)
    for (int k = 0; k < m->n; k++)
      if (m->name[k] == ns->name[t] && plan_named_add(named, ns->name[t], ns->size[t]) < 0) return -1;
  return 0;
}

/* Result leaf [k] of the body (positional aval [pa], named shape [vn])
 * placed by [m]: the eager call's errors in its order (a name the result
 * carries and out_axes does not place; a placed name no argument
 * introduced), then the xmap's result aval [out] and the names it keeps
 * [named] (an enclosing staged xmap's). */
static int out_aval(const AVal *pa, const NamedShape *vn, const Mapping *m, const Names *ns, int k,
                    AVal *out, NamedShape *named) {
  for (int t = ns->n - 1; t >= 0; t--) {
    bool placed = false;
    for (int i = 0; i < m->n; i++) placed |= m->name[i] == ns->name[t];
    if (!placed && plan_named_find(vn, ns->name[t]) >= 0)
      return err_set(ERR_VALUE, "xmap: result %d has the named axis '%s', which out_axes does "
                                "not place; name its position in out_axes", k, ns->name[t]), -1;
  }
  for (int i = 0; i < m->n; i++)
    if (names_find(ns, m->name[i]) < 0)
      return err_set(ERR_NAME, "xmap: out_axes names '%s', which no argument introduced",
                     m->name[i]), -1;
  int nd = pa->ndim + m->n, next = 0;
  if (nd > SHM_MAXDIM) return err_set(ERR_VALUE, "xmap: a result of more than %d axes", SHM_MAXDIM), -1;
  *out = *pa;
  out->ndim = nd;
  out->vma = 0;
  for (int d = 0; d < nd; d++) {
    int at = -1;
    for (int i = 0; i < m->n; i++)
      if (norm_pos(m->pos[i], nd) == d) at = i;
    if (at >= 0) out->shape[d] = ns->size[names_find(ns, m->name[at])];
    else if (next < pa->ndim) out->shape[d] = pa->shape[next++];
    else return err_set(ERR_VALUE, "xmap: out_axes places axis %d of result %d, which has %d axes",
                        d, k, nd), -1;
  }
  *named = *vn;
  for (int t = 0; t < ns->n; t++) plan_named_remove(named, ns->name[t]);
  return 0;
}

/* An axis mapping as the equation shows it: {position: name}, positions
 * counted from 0 in a value of [ndim] axes. */
static Value *mapping_dict(const Mapping *m, int ndim) {
  Value *d = dict_new();
  for (int i = 0; d && i < m->n; i++) {
    Value *k = val_int(norm_pos(m->pos[i], ndim)), *v = str_from(m->name[i]);
    int rc = k && v ? dict_set(d, k, v) : -1;
    if (k) val_decref(k);
    if (v) val_decref(v);
    if (rc < 0) {
      val_decref(d);
      return NULL;
    }
  }
  return d;
}

/* Records xmap[...] over [ncap] captures and [nl] argument leaves. */
static Value *emit_xmap(Value *self, Plan *body, Value **caps, int ncap, PyLeaves *l,
                        const Mappings *ims, const Mappings *oms, const AVal *oav,
                        const NamedShape *onm, Mesh *mesh) {
  int n = ncap + l->n;
  Value **ops = shm_calloc((size_t)n + 1, sizeof(Value *));
  Value *ia = tuple_new((size_t)n), *oa = tuple_new((size_t)body->nout), *r = NULL;
  bool ok = ops && ia && oa;
  for (int i = 0; ia && i < n; i++) {
    AVal av;
    Value *d = !ok ? NULL : i < ncap ? dict_new()
               : prim_value_aval(l->v[i - ncap], &av) == 0 ? mapping_dict(&ims->v[i - ncap], av.ndim) : NULL;
    ok = ok && d != NULL;
    tuple_set_steal(ia, (size_t)i, d ? d : val_incref(VAL_NONE));
    if (ops) ops[i] = i < ncap ? caps[i] : l->v[i - ncap];
  }
  for (int k = 0; oa && k < body->nout; k++) {
    Value *d = ok ? mapping_dict(&oms->v[k], oav[k].ndim) : NULL;
    ok = ok && d != NULL;
    tuple_set_steal(oa, (size_t)k, d ? d : val_incref(VAL_NONE));
  }
  if (ok) {
    Params p;
    params_init(&p);
    params_add(&p, "name", str_from(fun_name(tuple_get(self, XM_FUN))));
    params_add(&p, "in_axes", val_incref(ia));
    params_add(&p, "out_axes", val_incref(oa));
    params_add(&p, "axis_resources", val_incref(tuple_get(self, XM_RES)));
    if (mesh) params_add(&p, "mesh", val_incref(&mesh->hdr));
    params_add(&p, "call_jaxpr", val_incref(&body->hdr));
    r = p.n == (mesh ? 6 : 5) ? trace_emit_named(P_XMAP, &p, n, ops, body->nout, oav, onm)
                              : (params_clear(&p), NULL);
  } else if (!err_occurred()) {
    err_nomem();
  }
  shm_free(ops);
  if (ia) val_decref(ia);
  if (oa) val_decref(oa);
  return r;
}

static Value *xmap_stage(Value *self, const CallArgs *a) {
  Value *resv = tuple_get(self, XM_RES), *fun = tuple_get(self, XM_FUN);
  bool has_res = resv->type == V_DICT && ((Dict *)resv)->len;
  Mesh *mesh = has_res ? mesh_context() : NULL;
  Value *args = tuple_pack((size_t)a->nargs, a->args);
  Value *in = top_spec(tuple_get(self, XM_IN)), *out = top_spec(tuple_get(self, XM_OUT));
  Mappings ims = {0}, oms = {0};
  Names ns = {0};
  PyLeaves l = {0}, rl = {0};
  Trace *t = NULL;
  Plan *body = NULL;
  Value **tr = NULL, *wrapped = NULL, *res = NULL, *r = NULL, **caps = NULL, *em = NULL;
  AVal *oav = NULL;
  NamedShape *onm = NULL;
  int ncap = 0;
  if (!args || !in || !out) goto done;
  if (has_res && (check_resources(resv, mesh) < 0 || check_divides(self, a, in, resv, mesh) < 0))
    goto done;
  if (spec_leaves("in_axes", args, in, &ims) < 0 || pytree_flatten(args, array_leaf, &l) < 0) goto done;
  for (int i = 0; i < l.n; i++)
    if (names_add(&ns, l.v[i], &ims.v[i]) < 0) goto done;
  if (!(t = trace_begin(fun_name(fun), false))) goto done;
  NamedShape axes = {.n = ns.n};
  for (int i = 0; i < ns.n; i++) axes.name[i] = ns.name[i], axes.size[i] = ns.size[i];
  if (trace_set_axes(t, &axes, has_res ? resv : NULL) < 0 ||
      !(tr = shm_calloc((size_t)l.n + 1, sizeof(Value *))))
    goto fail;
  for (int i = 0; i < l.n; i++) {
    AVal ba;
    NamedShape bn;
    if (body_aval(l.v[i], &ims.v[i], &ns, &ba, &bn) < 0 || !(tr[i] = trace_new_arg_named(t, &ba, &bn, NULL)))
      goto fail;
  }
  int pos = 0;
  if (!(wrapped = pytree_replace(args, array_leaf, tr, &pos))) goto fail;
  res = val_call_n(fun, a->nargs, ((Tuple *)wrapped)->items);
  if (!res || spec_leaves("out_axes", res, out, &oms) < 0 || pytree_flatten(res, array_leaf, &rl) < 0)
    goto fail;
  body = trace_end(t, rl.n, rl.v, &caps, &ncap);
  t = NULL;
  if (!body) goto done;
  if (!lowerable(body)) {   /* shard_map or a callback in the body: the batching path */
    r = xmap_run(self, a, false);
    goto done;
  }
  oav = shm_calloc((size_t)rl.n + 1, sizeof(AVal));
  onm = shm_calloc((size_t)rl.n + 1, sizeof(NamedShape));
  if (!oav || !onm) {
    err_nomem();
    goto done;
  }
  for (int k = 0; k < rl.n; k++) {
    AVal pa;
    const NamedShape *vn = plan_var_named(body, body->outs[k].var);
    NamedShape none = {0};
    plan_atom_aval(body, &body->outs[k], &pa);
    if (out_aval(&pa, vn ? vn : &none, &oms.v[k], &ns, k, &oav[k], &onm[k]) < 0) goto done;
  }
  if ((em = emit_xmap(self, body, caps, ncap, &l, &ims, &oms, oav, onm, mesh))) {
    pos = 0;
    r = pytree_replace(res, array_leaf, ((Tuple *)em)->items, &pos);
  }
  goto done;
fail:
  trace_abort(t);
done:
  for (int i = 0; tr && i < l.n; i++)
    if (tr[i]) val_decref(tr[i]);
  shm_free(tr);
  trace_caps_free(caps, ncap);
  if (body) val_decref(&body->hdr);
  pytree_leaves_free(&l);
  pytree_leaves_free(&rl);
  shm_free(ims.v);
  shm_free(oms.v);
  shm_free(oav);
  shm_free(onm);
  Value *tmp[] = {args, in, out, wrapped, res, em};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  return r;
}

/* ---- lowering: the staged body through the batching machinery ---------------------- */

static Value *pdot_apply(Value *x, Value *y, Value *names, Value *pc, Value *pb);
static Value *xmap_eqn_run(const Params *ps, int n, Value **in);

/* self of xmap_sub_fn's functions: (plan, its leading constants, an
 * int: scan's number of carries). */
Value *xmap_sub_fn(const char *name, MethodFn fn, Value *plan, int nconsts, Value **consts, int64_t k) {
  Value *c = tuple_pack((size_t)nconsts, consts), *kv = val_int(k);
  Value *self = c && kv ? tuple_pack(3, (Value *[]){plan, c, kv}) : NULL;
  Value *r = self ? bound_new(name, fn, self) : NULL;
  Value *tmp[] = {c, kv, self};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  return r;
}

/* Runs self's plan on its constants and then the array leaves of
 * [trees]: a tuple of its results.  In place of the plan, a callable
 * taking those arrays and giving that tuple (a partitioned sub-plan's
 * per-device body, partition_run.c). */
static Value *sub_run(Value *self, int ntrees, Value *const *trees) {
  Value *sub = tuple_get(self, 0), *consts = tuple_get(self, 1), *r = NULL;
  int n = (int)tuple_len(consts), cap = n;
  PyLeaves *l = shm_calloc((size_t)ntrees + 1, sizeof(PyLeaves));
  if (!l) return err_nomem();
  int t = 0;
  for (; t < ntrees; t++) {
    if (pytree_flatten(trees[t], array_leaf, &l[t]) < 0) goto out;
    cap += l[t].n;
  }
  Value **args = shm_calloc((size_t)cap + 1, sizeof(Value *));
  if (!args) {
    err_nomem();
    goto out;
  }
  for (int i = 0; i < n; i++) args[i] = tuple_get(consts, (size_t)i);
  for (int k = 0; k < ntrees; k++)
    for (int j = 0; j < l[k].n; j++) args[n++] = l[k].v[j];   /* borrowed from the trees */
  if (!IS_PLAN(sub)) {
    CallArgs c = {.nargs = n, .args = args};
    r = val_call(sub, &c);
  } else if (n == AS_PLAN(sub)->nin) {
    r = xmap_eval_plan(AS_PLAN(sub), args);
  } else {
    err_set(ERR_VALUE, "xmap under jit: a control-flow sub-plan of %d inputs got %d", AS_PLAN(sub)->nin, n);
  }
  shm_free(args);
out:
  for (int k = 0; k < t; k++) pytree_leaves_free(&l[k]);
  shm_free(l);
  return r;
}

Value *xmap_branch_call(Value *self, const CallArgs *a) { return sub_run(self, a->nargs, a->args); }

Value *xmap_pred_call(Value *self, const CallArgs *a) {
  Value *r = sub_run(self, a->nargs, a->args), *pred = r ? val_incref(tuple_get(r, 0)) : NULL;
  if (r) val_decref(r);
  return pred;
}

Value *xmap_scan_call(Value *self, const CallArgs *a) {
  Value *r = sub_run(self, a->nargs, a->args);
  if (!r) return NULL;
  int64_t nc = 0;
  arr_to_index(tuple_get(self, 2), &nc);
  size_t n = tuple_len(r);
  Value *c = tuple_pack((size_t)nc, ((Tuple *)r)->items);
  Value *y = c ? tuple_pack(n - (size_t)nc, ((Tuple *)r)->items + nc) : NULL;
  Value *pair = y ? tuple_pack(2, (Value *[]){c, y}) : NULL;
  Value *tmp[] = {r, c, y};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  return pair;
}

/* One equation of a staged body on [in]: a new reference to its result
 * (a tuple when the equation has other than one output, and when its
 * row's eval rule gives one: HigherRules.eval_tuple).  A higher-order
 * equation goes through its row's eval rule (higher.h).  Collectives
 * over names go through the language's named reduction, as the eager
 * body's psum does: a value that does not vary along a name is the same
 * on every index. */
static Value *eval_eqn(const PlanEqn *e, Value **in) {
  const Params *ps = &e->params;
  Value *g = params_get(ps, "axis_index_groups");
  const HigherRules *h = higher_rules(e->prim);
  if (h && h->eval) return h->eval(e, in);
  const CollRules *c = prim_table[e->prim].rules.coll;
  Value *an = c && c->named == COLL_NAMED_ADDS ? params_get(ps, "axis_name") : NULL;
  if (an && an->type == V_TUPLE && tuple_len(an) == 1 && tuple_get(an, 0)->type == V_STR) {
    /* axis_index over a name: each index's position */
    Value *r = batch_axis_index(str_cstr(tuple_get(an, 0)));
    if (r || err_occurred()) return r;
  }
  /* psum, pmax, pmin: their row's positional reduction */
  if (c && c->reduces && (!g || g == VAL_NONE))
    return ops_named_reduce(c->reduce, in[0], params_get(ps, "axes"), NULL);
  return prim_bind(e->prim, e->nin, in, ps);
}

Value *xmap_eval_plan(Plan *p, Value **args) {
  int most = 1;
  for (int i = 0; i < p->neqn; i++) most = p->eqns[i].nin > most ? p->eqns[i].nin : most;
  Value **env = shm_calloc((size_t)p->nvars + 1, sizeof(Value *)), *r = NULL;
  Value **ins = env ? shm_calloc((size_t)most, sizeof(Value *)) : NULL;
  if (!ins) {
    shm_free(env);
    return err_nomem();
  }
  for (int i = 0; i < p->nconst; i++) env[p->constvars[i]] = val_incref(p->consts[i]);
  for (int i = 0; i < p->nin; i++) env[p->invars[i]] = val_incref(args[i]);
  for (int i = 0; i < p->neqn; i++) {
    const PlanEqn *e = &p->eqns[i];
    /* held across the call, so no operand's buffer becomes the result */
    for (int k = 0; k < e->nin; k++) ins[k] = val_incref(e->in[k].var < 0 ? e->in[k].lit : env[e->in[k].var]);
    Value *res = eval_eqn(e, ins);
    for (int k = 0; k < e->nin; k++) val_decref(ins[k]);
    if (!res) {
      if (e->loc.src) err_locate(e->loc);
      goto out;
    }
    const HigherRules *h = higher_rules(e->prim);
    bool tup = e->nout != 1 || (h && h->eval && h->eval_tuple);
    for (int k = 0; k < e->nout; k++) env[e->out[k]] = val_incref(tup ? tuple_get(res, (size_t)k) : res);
    val_decref(res);
  }
  r = tuple_new((size_t)p->nout);
  for (int k = 0; r && k < p->nout; k++)
    tuple_set_steal(r, (size_t)k, val_incref(p->outs[k].var < 0 ? p->outs[k].lit : env[p->outs[k].var]));
out:
  for (int i = 0; i < p->nvars; i++)
    if (env[i]) val_decref(env[i]);
  shm_free(env);
  shm_free(ins);
  return r;
}

static Value *body_call(Value *self, const CallArgs *a) {
  Plan *p = AS_PLAN(self);
  if (a->nkw || a->nargs != p->nin)
    return err_set(ERR_TYPE, "xmap body: %d arguments for %d inputs", a->nargs, p->nin);
  return xmap_eval_plan(p, a->args);
}

/* An xmap equation's call on [in]: the eager machinery (xmap_run, or
 * xmap_on_mesh under the equation's mesh) with the body plan evaluated as
 * its function.  A tuple of the results. */
static Value *xmap_eqn_run(const Params *ps, int n, Value **in) {
  Value *body = params_get(ps, "call_jaxpr"), *res = params_get(ps, "axis_resources");
  Value *ia = params_get(ps, "in_axes"), *oa = params_get(ps, "out_axes"), *m = params_get(ps, "mesh");
  if (!body || !res || !ia || !oa) return err_set(ERR_VALUE, "xmap equation without its parameters");
  Value *fn = bound_new("xmap", body_call, body);
  Value *cfg = fn ? tuple_pack(XM_N, (Value *[]){fn, ia, oa, res}) : NULL, *r = NULL;
  if (cfg) {
    CallArgs c = {.nargs = n, .args = in};
    r = m && m->type == V_MESH ? xmap_on_mesh(cfg, &c, (Mesh *)m) : xmap_run(cfg, &c, false);
  }
  if (fn) val_decref(fn);
  if (cfg) val_decref(cfg);
  return r;
}

static bool aval_same(const AVal *a, const AVal *b) {
  if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->shape[d] != b->shape[d]) return false;
  return true;
}

Plan *xmap_lower(const PlanEqn *e, const AVal *in, const AVal *out) {
  Value *nm = params_get(&e->params, "name");
  Trace *t = trace_begin(nm && nm->type == V_STR ? intern_cstr(str_cstr(nm)) : NULL, true);
  if (!t) return NULL;
  Value **tr = shm_calloc((size_t)e->nin + 1, sizeof(Value *)), *r = NULL, **caps = NULL;
  int k = 0, ncap = 0;
  for (; tr && k < e->nin; k++)
    if (!(tr[k] = trace_new_arg(t, &in[k], NULL))) break;
  if (tr && k == e->nin) r = xmap_eqn_run(&e->params, e->nin, tr);
  for (int i = 0; tr && i < k; i++) val_decref(tr[i]);
  shm_free(tr);
  if (!r || (int)tuple_len(r) != e->nout) {
    if (r) err_set(ERR_VALUE, "xmap: the lowered body has %zu results for %d", tuple_len(r), e->nout);
    if (r) val_decref(r);
    trace_abort(t);
    return NULL;
  }
  Plan *p = trace_end(t, e->nout, ((Tuple *)r)->items, &caps, &ncap);
  val_decref(r);
  trace_caps_free(caps, ncap);
  for (int i = 0; p && i < p->nout; i++) {
    AVal av;
    plan_atom_aval(p, &p->outs[i], &av);
    if (!aval_same(&av, &out[i])) {
      char a1[128], a2[128];
      aval_str(a1, sizeof a1, av.dtype, av.ndim, av.shape);
      aval_str(a2, sizeof a2, out[i].dtype, out[i].ndim, out[i].shape);
      err_set(ERR_VALUE, "xmap under jit: the lowered result %d is %s where the staged one is %s",
              i, a1, a2);
      val_decref(&p->hdr);
      return NULL;
    }
  }
  return p;
}

/* xmap(fun, in_axes, out_axes, axis_resources={}) */
static Value *bi_xmap(const CallArgs *a) {
  Value *fun, *in_axes, *out_axes, *res = NULL, *backend = NULL;
  if (args_bind("xmap", a, "fun, in_axes, out_axes, axis_resources=, backend=",
                (Value **[]){&fun, &in_axes, &out_axes, &res, &backend}) < 0)
    return NULL;
  if (res && res != VAL_NONE && res->type != V_DICT)
    return err_set(ERR_TYPE, "xmap: axis_resources must be a dict from axis names to mesh axes");
  Value *empty = res && res != VAL_NONE ? NULL : dict_new();
  Value *cfg = tuple_pack(XM_N, (Value *[]){fun, in_axes, out_axes, empty ? empty : res});
  if (empty) val_decref(empty);
  Value *r = cfg ? bound_new("xmap", xmap_call, cfg) : NULL;
  if (cfg) val_decref(cfg);
  return r;
}

/* ==== pdot ========================================================================== */

/* lax.pdot(x, y, axis_name, pos_contract=((), ()), pos_batch=((), ())):
 * multiplies with name broadcasting (a dot_general over the positional
 * dimensions given) and sums over the named axes axis_name. */
/* The batch traces [v] is wrapped in, outermost (largest id) first. */
static int chain_ids(Value *v, unsigned *ids, int cap) {
  int n = 0;
  for (; IS_BATCH_TRACER(v) && n < cap; v = ((Tracer *)v)->batched) ids[n++] = ((Tracer *)v)->trace_id;
  return IS_BATCH_TRACER(v) ? -1 : n;
}

static int index_of(const unsigned *ids, int n, unsigned id) {
  for (int i = 0; i < n; i++)
    if (ids[i] == id) return i;
  return -1;
}

/* [v] with every batch trace of [ids] (outermost first) unwrapped: a plain
 * value whose leading axes are those traces' in ascending id order. */
static Value *unwrap_all(Value *v, const unsigned *ids, const int64_t *sizes, int n) {
  Value *u = val_incref(v);
  for (int i = 0; u && i < n; i++) {
    Value *w = batch_unwrap_front(ids[i], u, sizes[i]);
    val_decref(u);
    u = w;
  }
  return u;
}

/* Reads pdot's ((lhs dims), (rhs dims)) [pair] into [l], [r], each shifted
 * by [sl], [sr]; its length, or -1 when malformed. */
static int dims_pair(Value *pair, int64_t *l, int64_t *r, int64_t sl, int64_t sr) {
  if (!pair || pair == VAL_NONE) return 0;
  size_t two, k1, k2;
  Value *const *pp, *const *a, *const *b;
  if (!val_seq(pair, &two, &pp) || two != 2 || !val_seq(pp[0], &k1, &a) || !val_seq(pp[1], &k2, &b) ||
      k1 != k2 || k1 > SHM_MAXDIM)
    return -1;
  for (size_t i = 0; i < k1; i++) {
    if (arr_to_index(a[i], &l[i]) < 0 || arr_to_index(b[i], &r[i]) < 0) return err_clear(), -1;
    l[i] += sl, r[i] += sr;
  }
  return (int)k1;
}

/* pdot over names both operands carry, as one dot_general: every named
 * axis of both made positional, the pdot names contracted, the names both
 * carry besides made batch dimensions, the others free; the named axes
 * then put back (a batched matmul, not a broadcast product and a sum), and
 * a psum across the mesh axes of a contracted name's resources.  NULL
 * without an error when it does not apply (a name one operand lacks). */
static Value *pdot_fast(Value *x, Value *y, Value *names, Value *pc, Value *pb) {
  size_t nn;
  Value *const *items;
  unsigned xi[16], yi[16], ci[16];
  int nx = chain_ids(x, xi, 16), ny = chain_ids(y, yi, 16);
  if (nx < 0 || ny < 0 || !val_seq(names, &nn, &items) || nn == 0 || nn > 16) return NULL;
  Value *res[16];
  for (size_t i = 0; i < nn; i++) {
    int64_t sz;
    if (items[i]->type != V_STR ||
        !batch_axis_info(intern_cstr(str_cstr(items[i])), &ci[i], &sz, &res[i]) ||
        index_of(xi, nx, ci[i]) < 0 || index_of(yi, ny, ci[i]) < 0)
      return NULL;
  }
  /* every trace either carries, ascending: their positions once unwrapped */
  unsigned all[32];
  int na = 0;
  for (int i = 0; i < nx; i++) all[na++] = xi[i];
  for (int i = 0; i < ny; i++)
    if (index_of(all, na, yi[i]) < 0) all[na++] = yi[i];
  for (int i = 1; i < na; i++)
    for (int j = i; j > 0 && all[j - 1] > all[j]; j--) {
      unsigned t = all[j];
      all[j] = all[j - 1], all[j - 1] = t;
    }
  int64_t sizes[32];
  for (int i = 0; i < na; i++) sizes[i] = batch_trace_size(all[i]);
  int64_t xs[16], ys[16];
  for (int i = 0; i < nx; i++) xs[i] = sizes[index_of(all, na, xi[i])];
  for (int i = 0; i < ny; i++) ys[i] = sizes[index_of(all, na, yi[i])];
  /* a trace's axis in x: its rank among x's traces, ascending */
  int64_t lc[SHM_MAXDIM], rc[SHM_MAXDIM], lb[SHM_MAXDIM], rb[SHM_MAXDIM];
  int nc = 0, nb = 0, px[32], py[32];
  for (int t = 0, kx = 0, ky = 0; t < na; t++) {
    px[t] = index_of(xi, nx, all[t]) >= 0 ? kx++ : -1;
    py[t] = index_of(yi, ny, all[t]) >= 0 ? ky++ : -1;
  }
  unsigned outn[32];
  int nout = 0, nbn = 0;
  for (int t = 0; t < na; t++) {
    bool contracted = index_of(ci, (int)nn, all[t]) >= 0;
    if (contracted) lc[nc] = px[t], rc[nc++] = py[t];
    else if (px[t] >= 0 && py[t] >= 0) lb[nb] = px[t], rb[nb++] = py[t], outn[nout++] = all[t], nbn++;
  }
  int npc = dims_pair(pc, lc + nc, rc + nc, nx, ny), npb = dims_pair(pb, lb + nb, rb + nb, nx, ny);
  if (npc < 0 || npb < 0 || nc + npc > SHM_MAXDIM || nb + npb > SHM_MAXDIM) return NULL;
  nc += npc;
  nb += npb;
  /* output: batch dims (named, then positional), x's free, y's free */
  int pos_out[32];
  for (int i = 0; i < nbn; i++) pos_out[i] = i;
  int next = nb;
  for (int t = 0; t < na; t++)   /* x-only names: x's free axes, names first */
    if (px[t] >= 0 && py[t] < 0) outn[nout] = all[t], pos_out[nout++] = next++;
  AVal xa;
  if (prim_value_aval(x, &xa) < 0) return NULL;
  next += xa.ndim - npc - npb;   /* x's positional free axes */
  for (int t = 0; t < na; t++)
    if (py[t] >= 0 && px[t] < 0) outn[nout] = all[t], pos_out[nout++] = next++;
  Value *xu = unwrap_all(x, xi, xs, nx), *yu = xu ? unwrap_all(y, yi, ys, ny) : NULL, *r = NULL;
  if (xu && yu) {
    Value *dn = val_dot_dimension_numbers(nc, lc, rc, nb, lb, rb);
    Params p;
    params_init(&p);
    params_add(&p, "dimension_numbers", dn);
    r = prim_apply_rule(P_DOT_GENERAL, 2, (Value *[]){xu, yu}, &p);
  }
  if (xu) val_decref(xu);
  if (yu) val_decref(yu);
  /* the names back, the smallest id innermost; each wrap removes an axis */
  for (int k = 0; r && k < nout; k++) {
    int best = -1;
    for (int j = 0; j < nout; j++)
      if (pos_out[j] >= 0 && (best < 0 || outn[j] < outn[best])) best = j;
    int at = pos_out[best];
    r = batch_wrap_steal(outn[best], r, at);
    pos_out[best] = -1;
    for (int j = 0; j < nout; j++)
      if (pos_out[j] > at) pos_out[j]--;
  }
  for (size_t i = 0; r && i < nn; i++) {   /* a name split over mesh axes: the other blocks too */
    if (!res[i]) continue;
    Params q;
    params_init(&q);
    params_add(&q, "axes", val_incref(res[i]));
    params_add(&q, "axis_index_groups", val_incref(VAL_NONE));
    Value *s2 = prim_bind(P_PSUM, 1, &r, &q);
    params_clear(&q);
    val_decref(r);
    r = s2;
  }
  return r;
}

/* pdot in a staged xmap body (trace.h): one `pdot` equation, its
 * positional result dot_general's over pos_contract and pos_batch, its
 * named shape the operands' union without the contracted names.  Only
 * where both operands carry every contracted name (the one dot_general of
 * pdot_fast when lowered); NULL without an error otherwise. */
static Value *pdot_stage(Value *x, Value *y, Value *names, Value *pc, Value *pb) {
  size_t nn;
  Value *const *items;
  if (!trace_current() || !IS_STAGE_TRACER(x) || !IS_STAGE_TRACER(y) || !val_seq(names, &nn, &items))
    return NULL;
  const NamedShape *nx = trace_named(x), *ny = trace_named(y);
  for (size_t i = 0; i < nn; i++) {
    int64_t sz;
    if (items[i]->type != V_STR || !nx || !ny || !trace_axis_size(str_cstr(items[i]), &sz)) return NULL;
    const char *nm = intern_cstr(str_cstr(items[i]));
    if (plan_named_find(nx, nm) < 0 || plan_named_find(ny, nm) < 0) return NULL;
  }
  int64_t lc[SHM_MAXDIM], rc[SHM_MAXDIM], lb[SHM_MAXDIM], rb[SHM_MAXDIM];
  int nc = dims_pair(pc, lc, rc, 0, 0), nb = dims_pair(pb, lb, rb, 0, 0);
  AVal av[2], out;
  if (nc < 0 || nb < 0 || prim_value_aval(x, &av[0]) < 0 || prim_value_aval(y, &av[1]) < 0) return NULL;
  Params dp;
  params_init(&dp);
  params_add(&dp, "dimension_numbers", val_dot_dimension_numbers(nc, lc, rc, nb, lb, rb));
  int rcode = prim_infer(P_DOT_GENERAL, av, 2, &dp, &out);
  params_clear(&dp);
  if (rcode < 0) return NULL;
  Params p;
  params_init(&p);
  params_add(&p, "axis_name", val_incref(names));
  params_add(&p, "pos_contract", val_incref(pc ? pc : VAL_NONE));
  params_add(&p, "pos_batch", val_incref(pb ? pb : VAL_NONE));
  Value *t = trace_emit(P_PDOT, &p, 2, (Value *[]){x, y}, 1, &out);
  Value *r = t ? val_incref(tuple_get(t, 0)) : NULL;
  if (t) val_decref(t);
  return r;
}

static Value *bi_pdot(const CallArgs *a) {
  Value *x, *y, *name, *pc = NULL, *pb = NULL;
  if (args_bind("pdot", a, "x, y, axis_name, pos_contract=, pos_batch=",
                (Value **[]){&x, &y, &name, &pc, &pb}) < 0)
    return NULL;
  Value *names = name->type == V_STR ? tuple_pack(1, &name) : val_incref(name);
  if (!names) return NULL;
  Value *st = pdot_stage(x, y, names, pc, pb);
  Value *r = st || err_occurred() ? st : pdot_apply(x, y, names, pc, pb);
  val_decref(names);
  return r;
}

/* pdot of [x] and [y] over the names [names] (a tuple): one dot_general
 * where the operands' batch traces allow (pdot_fast), else the product
 * and a named sum.  [pc], [pb]: the positional dimensions, or NULL/None. */
static Value *pdot_apply(Value *x, Value *y, Value *names, Value *pc, Value *pb) {
  if (pc == VAL_NONE) pc = NULL;
  if (pb == VAL_NONE) pb = NULL;
  Value *fast = pdot_fast(x, y, names, pc, pb);
  if (fast || err_occurred()) return fast;
  Value *prod;
  bool positional = (pc && pc != VAL_NONE) || (pb && pb != VAL_NONE);
  if (positional) {
    Value *empty = tuple_new(0);
    Value *c = pc && pc != VAL_NONE ? pc : NULL, *b = pb && pb != VAL_NONE ? pb : NULL;
    Value *cc = c ? val_incref(c) : tuple_pack(2, (Value *[]){empty, empty});
    Value *bb = b ? val_incref(b) : tuple_pack(2, (Value *[]){empty, empty});
    Value *dn = tuple_pack(2, (Value *[]){cc, bb});
    Params p;
    params_init(&p);
    params_add(&p, "dimension_numbers", dn);
    prod = prim_apply_rule(P_DOT_GENERAL, 2, (Value *[]){x, y}, &p);
    val_decref(empty);
    val_decref(cc);
    val_decref(bb);
  } else {
    prod = ops_binary(OP_MUL, x, y);
  }
  Value *r = prod ? ops_named_reduce(P_REDUCE_SUM, prod, names, NULL) : NULL;
  if (prod) val_decref(prod);
  return r;
}

/* ==== the rows of xmap and pdot (higher.h) ========================================= */

/* jit: an xmap equation lowered through the eager call's batching and
 * resource machinery into a positional plan (xmap_lower), compiled, kept
 * as the step's own. */
static int prepare_xmap(Exec *e, Step *s, const Plan *p) {
  (void)e;
  const PlanEqn *q = s->eqn;
  AVal *av = shm_calloc((size_t)(q->nin + q->nout) + 1, sizeof(AVal));
  if (!av) return err_nomem(), -1;
  for (int k = 0; k < q->nin; k++) plan_atom_aval(p, &q->in[k], &av[k]);
  for (int k = 0; k < q->nout; k++) av[q->nin + k] = p->vars[q->out[k]];
  Plan *lowered = xmap_lower(q, av, av + q->nin);
  shm_free(av);
  if (!lowered) {
    if (q->loc.src) err_locate(q->loc);
    return -1;
  }
  s->own = &lowered->hdr;
  return cmp_compile(lowered);
}

static int run_xmap(Step *s, Workspace *w) {
  Array **outs = cmp_step_outs(s, w);
  return cmp_run_into(AS_PLAN(s->own), cmp_step_ins(s, w, 0), outs);
}

/* xmap's interpreter: a nested xmap equation's call (xmap_eqn_run). */
static Value *eval_xmap(const PlanEqn *e, Value **in) { return xmap_eqn_run(&e->params, e->nin, in); }

static bool lowerable_xmap(const PlanEqn *e) {
  return xmap_subs_lowerable(params_get(&e->params, "call_jaxpr"));
}

static const HigherRules xmap_rules = {
    .prepare = prepare_xmap,
    .run = run_xmap,
    .eval = eval_xmap,
    .eval_tuple = true,
    .lowerable = lowerable_xmap,
};

/* xmap's interpreter: pdot over the names of the xmap's batch traces.
 * Not compiled by itself: only an xmap body holds it. */
static Value *eval_pdot(const PlanEqn *e, Value **in) {
  const Params *ps = &e->params;
  return pdot_apply(in[0], in[1], params_get(ps, "axis_name"), params_get(ps, "pos_contract"),
                    params_get(ps, "pos_batch"));
}

static bool lowerable_pdot(const PlanEqn *e) {
  (void)e;
  return true;
}

static const HigherRules pdot_rules = {
    .eval = eval_pdot,
    .lowerable = lowerable_pdot,
};

/* pdot contracts the names it is given: they leave the named shape, as
 * a collective's reduction's do (trace.c reads CollRules.named). */
static const CollRules pdot_named = {.named = COLL_NAMED_REMOVES};

void xmap_register_rules(void) {
  higher_register(P_XMAP, &xmap_rules);
  prim_register(P_PDOT, &(const PrimRules){.higher = &pdot_rules, .coll = &pdot_named});
}

int xmap_register(Env *b) {
  xmap_register_rules();
  Value *x = builtin_new("xmap", bi_xmap, "xmap(fun, in_axes, out_axes, axis_resources={})");
  Value *p = builtin_new("pdot", bi_pdot, "pdot(x, y, axis_name, pos_contract=, pos_batch=)");
  int rc = x && p && env_set(b, intern_cstr("xmap"), x) == 0 &&
                   builtins_add_to("jax", "xmap", x) == 0 &&
                   builtins_add_to("jax.experimental.maps", "xmap", x) == 0 &&
                   builtins_add_to("lax", "pdot", p) == 0
               ? 0 : -1;
  if (x) val_decref(x);
  if (p) val_decref(p);
  return rc;
}
