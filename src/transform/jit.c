/*
 * jit.c - jit wrappers, the signature cache, plan() and --dump-plans
 * (jit.h).
 */
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "lang/builtins.h"
#include "lang/classes.h"
#include "lang/eval.h"
#include "transform/compile.h"
#include "spmd/device.h"
#include "base/intern.h"
#include "transform/jit.h"
#include "spmd/transport.h"
#include "transform/partition.h"
#include "transform/aot.h"
#include "lang/jaxconfig.h"
#include "transform/eager_fusion.h"
#include "base/mem.h"
#include "spmd/mesh.h"
#include "lang/ops.h"
#include "lang/pytree.h"
#include "array/print.h"
#include "spmd/shardmap.h"
#include "transform/trace.h"
#include "transform/xmap.h"

/* One traced signature.  The cache holds a reference, and so does each
 * call running its plan, so an entry evicted while a call runs it is
 * freed when that call ends. */
typedef struct Entry {
  struct Entry *next;  /* the next less recently used; guarded by JitFn.lock */
  atomic_int refs;
  uint64_t hash;       /* of the key: compared before the key */
  char *key;           /* owned signature bytes */
  size_t keylen;
  Value *holds;        /* List: static objects keyed by identity, kept alive */
  Plan *plan;          /* owned, compiled */
  Value *out_tree;     /* owned: the traced result, its structure */
  /* on sharded leaves (the key holds their shardings): the plan's layouts
   * and the jit of the shard_map running it per device (partition.h),
   * made by the first call; guarded by JitFn.lock */
  PartPlan *part;
  Value *part_fn;
  bool constrained;    /* the plan has a sharding_constraint over a mesh */
  bool meshes_differ;  /* its shard_maps' meshes differ (part_meshes_differ) */
} Entry;

typedef struct JitFn {
  Value hdr;           /* V_JITFN */
  Value *fn;           /* owned: the wrapped callable */
  const char *name;    /* interned */
  int n_nums, n_names;
  int64_t *nums;       /* owned: static_argnums */
  const char **names;  /* owned array of interned static_argnames */
  pthread_mutex_t lock;/* guards [cache], [ncache] and the entries' next links */
  Entry *cache;        /* most recently used first */
  int ncache;
  Value *in_shardings, *out_shardings;  /* owned or NULL: jax.jit's, device_put
                                           on the arguments and results */
  bool manual;         /* a partitioned plan's shard_map: never partitioned again */
} JitFn;

/* Signatures kept per jit function (jit_set_cache_size; the YAML
 * configuration's jit.cache_size).  Read without a lock: set before any
 * device thread runs. */
static int cache_bound = JIT_CACHE_DEFAULT;

void jit_set_cache_size(int n) { cache_bound = n > 0 ? n : 1; }

/* ==== the signature ========================================================= */

/* The key bytes, the traced leaves (borrowed) and objects to keep alive.
 * Small signatures live in the inline arrays: a cache hit allocates
 * nothing here. */
#define SIG_INLINE 8
typedef struct Sig {
  char *key;
  size_t len, cap;
  Value **leaves;
  const char **names;  /* the parameter each leaf came from, or NULL */
  const char *cur;     /* the parameter being walked */
  int nleaves, capleaves;
  Value *holds;
  Value *kids;         /* List: custom pytree nodes' children, whose leaves
                          [leaves] borrows, kept for this call only */
  bool failed;
  char inl_key[256];
  Value *inl_leaves[SIG_INLINE];
  const char *inl_names[SIG_INLINE];
} Sig;

static void sig_init(Sig *s) {
  memset(s, 0, offsetof(Sig, inl_key));
  s->key = s->inl_key;
  s->cap = sizeof s->inl_key;
  s->leaves = s->inl_leaves;
  s->names = s->inl_names;
  s->capleaves = SIG_INLINE;
}

/* Grows [*p] (initially the inline [inl]) from [old] to [n] bytes. */
static bool grow_inline(void **p, void *inl, size_t old, size_t n) {
  void *q = *p == inl ? shm_malloc(n) : shm_realloc(*p, n);
  if (!q) return false;
  if (*p == inl) shm_memcpy(q, inl, old);
  *p = q;
  return true;
}

static void sig_bytes(Sig *s, const void *p, size_t n) {
  if (s->failed) return;
  if (s->len + n > s->cap) {
    size_t c = s->cap * 2;
    while (c < s->len + n) c *= 2;
    if (!grow_inline((void **)&s->key, s->inl_key, s->len, c)) {
      s->failed = true;
      return;
    }
    s->cap = c;
  }
  shm_memcpy(s->key + s->len, p, n);
  s->len += n;
}

static void sig_tag(Sig *s, char tag) { sig_bytes(s, &tag, 1); }

/* A traced leaf: an array, a tracer, or a ShapeDtypeStruct standing for
 * an array (aot.h: jit(f).lower, eval_shape). */
static bool traced_leaf(Value *v) { return ops_is_array(v) || aot_is_sds(v); }

static int leaf_aval(Value *v, AVal *a) {
  if (!aot_is_sds(v)) return ops_aval(v, a);
  aot_sds_aval(v, a);
  return 0;
}

static void sig_static(Sig *s, Value *v);

/* A sharded leaf's layout (an array's, or a ShapeDtypeStruct's being
 * lowered): its mesh's axes and each dimension's mesh axes, as JAX keys
 * its cache on the arguments' shardings; a jit partitions differently for
 * each (partition.h). */
static void sig_sharding(Sig *s, Value *v, int ndim) {
  Value *sv = IS_ARRAY(v) ? AS_ARRAY(v)->sharding : aot_is_sds(v) ? aot_sds_sharding(v) : NULL;
  if (!sv || !sharding_is(sv) || !((NamedSharding *)sv)->mesh) return;
  NamedSharding *ns = (NamedSharding *)sv;
  Sharding r;
  sharding_to_rule(ns, ndim, &r);
  sig_tag(s, 'H');
  /* the mesh by its axes: a program lowered on an AbstractMesh runs on
   * arrays laid out over a real mesh of that shape */
  for (int i = 0; i < ns->mesh->naxes; i++) {
    sig_bytes(s, ns->mesh->axis_names[i], strlen(ns->mesh->axis_names[i]) + 1);
    sig_bytes(s, &ns->mesh->axis_sizes[i], sizeof(int));
    /* and its types: an Explicit axis is part of the traced types, and
     * its sharding rules raise where an Auto one's choose */
    sig_bytes(s, &ns->mesh->axis_types[i], 1);
  }
  /* and its devices when they are not in order (an AbstractMesh's are) */
  bool ordered = true;
  for (int i = 0; ns->mesh->devices && i < ns->mesh->size; i++) ordered &= ns->mesh->devices[i] == i;
  if (!ordered) {
    sig_tag(s, 'D');
    sig_bytes(s, ns->mesh->devices, sizeof(int) * (size_t)ns->mesh->size);
  }
  for (int d = 0; d < ndim; d++) {
    sig_bytes(s, &r.nsplit[d], 1);
    sig_bytes(s, r.split[d], (size_t)r.nsplit[d]);
  }
}

static void sig_leaf(Sig *s, Value *v) {
  AVal a;
  if (leaf_aval(v, &a) < 0) {
    err_clear();
    s->failed = true;
    return;
  }
  unsigned char hdr[4] = {'A', (unsigned char)a.dtype, a.weak, (unsigned char)a.ndim};
  sig_bytes(s, hdr, 4);
  sig_bytes(s, a.shape, sizeof(int64_t) * (size_t)a.ndim);
  sig_bytes(s, &a.vma, sizeof a.vma);
  sig_sharding(s, v, a.ndim);
  if (s->nleaves == s->capleaves) {
    size_t old = (size_t)s->capleaves, n = old * 2;
    if (!grow_inline((void **)&s->leaves, s->inl_leaves, old * sizeof(Value *), n * sizeof(Value *)) ||
        !grow_inline((void **)&s->names, s->inl_names, old * sizeof(char *), n * sizeof(char *))) {
      s->failed = true;
      return;
    }
    s->capleaves = (int)n;
  }
  s->names[s->nleaves] = s->cur;
  s->leaves[s->nleaves++] = v;
}

/* A static value: strings, numbers, dtypes and tuples of them by value,
 * everything else by identity. */
static void sig_static(Sig *s, Value *v) {
  sig_tag(s, 'S');
  sig_tag(s, (char)v->type);
  switch ((VType)v->type) {
  case V_NONE: case V_ELLIPSIS: return;
  case V_STR: sig_bytes(s, str_cstr(v), ((Str *)v)->len + 1); return;
  case V_DTYPE: sig_tag(s, (char)((DTypeVal *)v)->dtype); return;
  case V_TUPLE: {
    int64_t n = (int64_t)tuple_len(v);
    sig_bytes(s, &n, sizeof n);
    for (size_t i = 0; i < tuple_len(v); i++) sig_static(s, tuple_get(v, i));
    return;
  }
  case V_ARRAY:
    if (AS_ARRAY(v)->ndim == 0) {
      double x = arr_get_f64(AS_ARRAY(v), 0);
      sig_tag(s, (char)AS_ARRAY(v)->dtype);
      sig_bytes(s, &x, sizeof x);
      return;
    }
    break;
  default: break;
  }
  sig_bytes(s, &v, sizeof v);
  if (!s->holds) s->holds = list_new(4);
  if (!s->holds || list_append(s->holds, v) < 0) s->failed = true;
}

static bool is_int_scalar(Value *v) {
  return IS_ARRAY(v) && AS_ARRAY(v)->ndim == 0 && AS_ARRAY(v)->weak && !dt_is_float(AS_ARRAY(v)->dtype);
}

/* A tuple of Python ints (a shape) is static; JAX users pass shapes so. */
static bool is_int_tuple(Value *v) {
  if (v->type != V_TUPLE || tuple_len(v) == 0) return false;
  for (size_t i = 0; i < tuple_len(v); i++)
    if (!is_int_scalar(tuple_get(v, i))) return false;
  return true;
}

/* The traced leaves of a pytree: arrays (pytree_replace's predicate). */
static bool array_leaf(Value *v) { return traced_leaf(v); }

static bool is_pytree_node(Value *v) {
  return (v->type == V_TUPLE && !is_int_tuple(v)) || v->type == V_LIST || v->type == V_DICT ||
         cls_is_tree_node(v);
}

/* Keeps [v] (stolen) for the signature's life: a custom node's children. */
static void sig_keep(Sig *s, Value *v) {
  if (!v || (!s->kids && !(s->kids = list_new(4))) || list_append_steal(s->kids, v) < 0)
    s->failed = true;
}

static void sig_traced(Sig *s, Value *v);

/* A dict argument: its keys (static) and values, in JAX's order. */
static void sig_dict(Sig *s, Value *v) {
  Dict *d = (Dict *)v;
  size_t *idx = pytree_key_order(v);
  if (!idx) {   /* keys that do not order: the error stays set (sig_build) */
    s->failed = true;
    return;
  }
  int64_t len = (int64_t)d->len;
  sig_tag(s, '{');
  sig_bytes(s, &len, sizeof len);
  for (size_t i = 0; i < d->len; i++) {
    sig_static(s, d->keys[idx[i]]);
    sig_traced(s, d->vals[idx[i]]);
  }
  shm_free(idx);
}

/* A traced argument: arrays are leaves, tuples, lists and dicts are
 * walked (lang/pytree.h's order); a tuple of ints is static (a shape). */
static void sig_traced(Sig *s, Value *v) {
  if (aot_is_sds(v)) {
    sig_leaf(s, v);
    return;
  }
  if (ops_is_array(v)) {
    /* a Python int past int32 is JAX's OverflowError: traced, it would
     * wrap silently wherever it meets an array, as it does not eagerly */
    if (ops_check_python_int(v) < 0) {
      s->failed = true;
      return;
    }
    sig_leaf(s, v);
    return;
  }
  if (cls_is_instance(v) && !cls_is_tree_node(v)) {
    /* as JAX: by identity, a changed attribute would keep the old plan */
    err_set(ERR_TYPE, "argument '%s' of type '%s' is not a valid JAX type: register its class "
            "as a pytree (jax.tree_util.register_dataclass, register_pytree_node_class) or "
            "make the argument static", s->cur ? s->cur : "?", val_type_name(v));
    s->failed = true;
    return;
  }
  if (!is_pytree_node(v)) {
    sig_static(s, v);
    return;
  }
  if (v->type == V_DICT) {
    sig_dict(s, v);
    return;
  }
  if (v->type == V_OPAQUE) {   /* a custom node: its class and aux data are static */
    Value *aux, *kids = cls_tree_children(v, &aux);
    if (!kids) {
      s->failed = true;
      return;
    }
    sig_tag(s, 'C');
    sig_static(s, cls_class_of(v));
    sig_static(s, aux);
    val_decref(aux);
    sig_keep(s, kids);
    sig_traced(s, kids);
    return;
  }
  size_t n;
  Value *const *items;
  val_seq(v, &n, &items);
  int64_t len = (int64_t)n;
  if (tuple_class(v)) sig_static(s, tuple_class(v));   /* a named tuple's class */
  sig_tag(s, v->type == V_TUPLE ? '(' : '[');
  sig_bytes(s, &len, sizeof len);
  for (size_t i = 0; i < n; i++) sig_traced(s, items[i]);
}

static void sig_free(Sig *s) {
  if (s->names != s->inl_names) shm_free(s->names);
  if (s->key != s->inl_key) shm_free(s->key);
  if (s->leaves != s->inl_leaves) shm_free(s->leaves);
  val_decref(s->holds);
  val_decref(s->kids);
}

/* ==== static arguments ====================================================== */

/* The name of positional parameter [i] of a Func, or NULL. */
static const char *param_name(Value *fn, int i) {
  if (fn->type != V_FUNC) return NULL;
  const Node *d = ((Func *)fn)->node;
  return i < d->nparams && !d->params[i].star && !d->params[i].starstar ? d->params[i].name : NULL;
}

static bool annotated_static(Value *fn, const char *name) {
  if (fn->type != V_FUNC || !name) return false;
  const Node *d = ((Func *)fn)->node;
  for (int i = 0; i < d->nparams; i++) {
    const Node *an = d->params[i].annotation;
    if (d->params[i].name && !strcmp(d->params[i].name, name) && an && an->kind == N_NAME &&
        !strcmp(an->name, "static"))
      return true;
  }
  return false;
}

static bool is_static(const JitFn *j, int pos, const char *name) {
  for (int i = 0; pos >= 0 && i < j->n_nums; i++)
    if (j->nums[i] == pos) return true;
  for (int i = 0; name && i < j->n_names; i++)
    if (!strcmp(j->names[i], name)) return true;
  return annotated_static(j->fn, name);
}

/* The signature of a call of [j] with [a]. */
static int sig_build(const JitFn *j, const CallArgs *a, Sig *s) {
  /* the context mesh (`with m:`): an xmap's axis_resources are read from
   * it when it is traced, so a trace under one mesh (or none) is not
   * another's, as JAX's jit keys its cache on the resource environment */
  Mesh *cm = mesh_context();
  if (cm) {
    sig_tag(s, 'M');
    sig_static(s, &cm->hdr);
  }
  for (int i = 0; i < a->nargs; i++) {
    s->cur = param_name(j->fn, i);
    if (is_static(j, i, s->cur)) sig_static(s, a->args[i]);
    else sig_traced(s, a->args[i]);
  }
  for (int k = 0; k < a->nkw; k++) {
    sig_tag(s, 'K');
    sig_bytes(s, a->kwnames[k], strlen(a->kwnames[k]) + 1);
    s->cur = a->kwnames[k];
    if (is_static(j, -1, a->kwnames[k])) sig_static(s, a->kwvals[k]);
    else sig_traced(s, a->kwvals[k]);
  }
  if (s->failed) return err_occurred() ? -1 : (err_nomem(), -1);
  return 0;
}

/* ==== rebuilding structures =================================================== */

/* [v] with its traced leaves replaced, in order, by [repl] from [*pos]. */
static Value *rebuild(Value *v, Value **repl, int *pos) {
  if (traced_leaf(v)) return val_incref(repl[(*pos)++]);
  if (!is_pytree_node(v)) return val_incref(v);
  if (v->type == V_DICT || v->type == V_OPAQUE) return pytree_replace(v, array_leaf, repl, pos);
  size_t n;
  Value *const *items;
  val_seq(v, &n, &items);
  Value *r = v->type == V_TUPLE ? tuple_new_like(v, n) : list_new(n);
  for (size_t i = 0; r && i < n; i++) {
    Value *x = rebuild(items[i], repl, pos);
    if (!x) {
      for (size_t k = i; v->type == V_TUPLE && k < n; k++) tuple_set_steal(r, k, val_incref(VAL_NONE));
      val_decref(r);
      return NULL;
    }
    if (v->type == V_TUPLE) tuple_set_steal(r, i, x);
    else if (list_append_steal(r, x) < 0) {
      val_decref(r);
      return NULL;
    }
  }
  return r;
}

/* Arguments for a traced call: statics as they are, traced leaves by [repl]. */
static int rebuild_args(const JitFn *j, const CallArgs *a, Value **repl, CallArgs *out) {
  int pos = 0;
  out->nargs = a->nargs;
  out->nkw = a->nkw;
  out->kwnames = a->kwnames;
  out->args = shm_calloc((size_t)(a->nargs + a->nkw) + 1, sizeof(Value *));
  if (!out->args) return err_nomem(), -1;
  out->kwvals = out->args + a->nargs;
  for (int i = 0; i < a->nargs; i++) {
    bool st = is_static(j, i, param_name(j->fn, i));
    if (!(out->args[i] = st ? val_incref(a->args[i]) : rebuild(a->args[i], repl, &pos))) return -1;
  }
  for (int k = 0; k < a->nkw; k++) {
    bool st = is_static(j, -1, a->kwnames[k]);
    if (!(out->kwvals[k] = st ? val_incref(a->kwvals[k]) : rebuild(a->kwvals[k], repl, &pos)))
      return -1;
  }
  return 0;
}

static void args_release(CallArgs *c) {
  for (int i = 0; c->args && i < c->nargs + c->nkw; i++) val_decref(c->args[i]);
  shm_free(c->args);
}

/* The array leaves of a result, a pytree (lang/pytree.h), in order
 * (borrowed), into [s]; strings are static leaves, anything else an error. */
static int flatten_out(Value *v, Sig *s) {
  PyLeaves l = {0};
  int rc = pytree_flatten(v, NULL, &l);
  if (l.held) sig_keep(s, val_incref(l.held));   /* custom nodes' children */
  for (int i = 0; rc == 0 && i < l.n; i++) {
    if (ops_is_array(l.v[i])) sig_leaf(s, l.v[i]);
    else if (l.v[i]->type != V_STR) {
      err_set(ERR_TYPE, "a jit function must return arrays (or pytrees of them: tuples, "
                        "lists, dicts), got %s", val_type_name(l.v[i]));
      rc = -1;
    }
  }
  pytree_leaves_free(&l);
  if (rc == 0 && s->failed) rc = (err_nomem(), -1);
  return rc;
}

/* The result: [tree] with its array leaves replaced by [vals]. */
static Value *unflatten(Value *tree, Value **vals, int *pos) {
  return pytree_replace(tree, array_leaf, vals, pos);
}

/* ==== tracing ================================================================== */

static Value *trace_shard_map(Value *sf, int nleaves, Value **tracers);

/* Tracers for the leaves of [s] as inputs of [t], named after their
 * parameters. */
static Value **make_tracers(Trace *t, Sig *s) {
  Value **tr = shm_calloc((size_t)s->nleaves + 1, sizeof(Value *));
  if (!tr) return err_nomem();
  for (int i = 0; i < s->nleaves; i++) {
    AVal a;
    leaf_aval(s->leaves[i], &a);
    /* a value of a staged xmap body keeps its named shape (trace.h) */
    if (!(tr[i] = trace_new_arg_named(t, &a, trace_named(s->leaves[i]), s->names[i]))) {
      for (int k = 0; k < i; k++) val_decref(tr[k]);
      shm_free(tr);
      return NULL;
    }
  }
  return tr;
}

static void values_free(Value **v, int n) {
  for (int i = 0; v && i < n; i++) val_decref(v[i]);
  shm_free(v);
}

/* Calls the wrapped function on tracers: a new reference to its result. */
static Value *call_traced(const JitFn *j, const CallArgs *a, Value **tracers, int n) {
  if (j->fn->type == V_SHARDFN && !shardmap_needs_tree((ShardFn *)j->fn, a)) {
    if (a->nkw) return err_set(ERR_TYPE, "%s() takes no keyword arguments", j->name);
    for (int i = 0; i < a->nargs; i++)
      if (shardmap_check_arg((ShardFn *)j->fn, a, i) < 0) return NULL;
    return trace_shard_map(j->fn, n, tracers);
  }
  CallArgs c = {0};
  Value *r = rebuild_args(j, a, tracers, &c) == 0 ? val_call(j->fn, &c) : NULL;
  args_release(&c);
  return r;
}

/* What tracing a call produced. */
typedef struct Traced {
  Plan *plan;
  Value *out_tree;
  Value **caps;
  int ncap;
} Traced;

/* Traces [j] on [a] whose leaves are in [s]: a top-level plan ([top]) or a
 * nested one (captures handed back in [tr]). */
static int trace_call(const JitFn *j, const CallArgs *a, Sig *s, bool top, Traced *tr) {
  Trace *t = trace_begin(j->name, top);
  if (!t) return -1;
  Value **tracers = make_tracers(t, s);
  PartTraced scope;
  part_trace_enter(&scope, t, s->leaves, s->nleaves);   /* jax.typeof's layouts */
  Value *r = tracers ? call_traced(j, a, tracers, s->nleaves) : NULL;
  part_trace_leave(&scope);
  values_free(tracers, s->nleaves);
  Sig outs;
  sig_init(&outs);
  if (!r || flatten_out(r, &outs) < 0) {
    val_decref(r);
    sig_free(&outs);
    trace_abort(t);
    return -1;
  }
  tr->plan = trace_end(t, outs.nleaves, outs.leaves, &tr->caps, &tr->ncap);
  tr->out_tree = r;
  sig_free(&outs);
  if (tr->plan) return 0;
  val_decref(r);
  return -1;
}

/* --dump-plans: the plan, as it is compiled. */
static void dump_plan(const JitFn *j, Plan *p) {
  if (!shm_interp || !shm_interp->dump_plans) return;
  Value *s = plan_str(p);
  if (!s) {
    err_clear();
    return;
  }
  char head[256];
  snprintf(head, sizeof head, "# plan of %s\n", j->name);
  eval_write(head, strlen(head));
  eval_write(str_cstr(s), ((Str *)s)->len);
  eval_write("\n", 1);
  val_decref(s);
}

/* ==== the cache ================================================================= */

/* FNV-1a over the signature's bytes. */
static uint64_t key_hash(const char *k, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)k[i]) * 1099511628211ull;
  return h;
}

static bool entry_is(const Entry *e, uint64_t h, const char *key, size_t len) {
  return e->hash == h && e->keylen == len && !memcmp(e->key, key, len);
}

static void entry_free(Entry *e) {
  shm_free(e->key);
  val_decref(e->holds);
  val_decref(e->plan ? &e->plan->hdr : NULL);
  val_decref(e->out_tree);
  if (e->part) val_decref(&e->part->base.hdr);
  if (e->part_fn) val_decref(e->part_fn);
  shm_free(e);
}

static void entry_release(Entry *e) {
  if (e && atomic_fetch_sub(&e->refs, 1) == 1) entry_free(e);
}

/* The entry of [key] (lock held), moved to the front as the most
 * recently used, with a reference for the caller; NULL when absent. */
static Entry *take_locked(JitFn *j, uint64_t h, const char *key, size_t len) {
  Entry **link = &j->cache;
  while (*link && !entry_is(*link, h, key, len)) link = &(*link)->next;
  Entry *e = *link;
  if (!e) return NULL;
  *link = e->next;
  e->next = j->cache;
  j->cache = e;
  atomic_fetch_add(&e->refs, 1);
  return e;
}

static Entry *cache_find(JitFn *j, const Sig *s) {
  uint64_t h = key_hash(s->key, s->len);
  pthread_mutex_lock(&j->lock);
  Entry *e = take_locked(j, h, s->key, s->len);
  pthread_mutex_unlock(&j->lock);
  return e;
}

/* Drops the least recently used entries past the bound (lock held);
 * their last users free them. */
static void evict_locked(JitFn *j) {
  if (j->ncache <= cache_bound) return;
  Entry **link = &j->cache;
  for (int k = 0; k < cache_bound && *link; k++) link = &(*link)->next;
  Entry *e = *link;
  *link = NULL;
  while (e) {
    Entry *next = e->next;
    j->ncache--;
    entry_release(e);
    e = next;
  }
}

/* Inserts [e] unless an equal entry arrived meanwhile; the one kept, with
 * a reference for the caller. */
static Entry *cache_insert(JitFn *j, Entry *e) {
  e->hash = key_hash(e->key, e->keylen);
  pthread_mutex_lock(&j->lock);
  Entry *o = take_locked(j, e->hash, e->key, e->keylen);
  if (!o) {
    atomic_init(&e->refs, 2);   /* the cache's and the caller's */
    e->next = j->cache;
    j->cache = e;
    j->ncache++;
    evict_locked(j);
  }
  pthread_mutex_unlock(&j->lock);
  if (o) entry_free(e);
  return o ? o : e;
}

/* Traces and compiles a missing signature. */
static Entry *cache_fill(JitFn *j, const CallArgs *a, Sig *s) {
  Traced tr = {0};
  if (trace_call(j, a, s, true, &tr) < 0) return NULL;
  trace_caps_free(tr.caps, tr.ncap);
  Entry *e = shm_calloc(1, sizeof *e);
  if (!e || cmp_compile(tr.plan) < 0) {
    if (!e) err_nomem();
    val_decref(&tr.plan->hdr);
    val_decref(tr.out_tree);
    shm_free(e);
    return NULL;
  }
  dump_plan(j, tr.plan);
  aot_estimate_note(j->name, tr.plan);
  if (!(e->key = shm_malloc(s->len + 1))) {
    err_nomem();
    entry_free(e);
    val_decref(&tr.plan->hdr);
    val_decref(tr.out_tree);
    return NULL;
  }
  shm_memcpy(e->key, s->key, s->len);
  e->keylen = s->len;
  e->holds = s->holds;
  s->holds = NULL;
  e->plan = tr.plan;
  e->out_tree = tr.out_tree;
  e->constrained = part_constraint_mesh(tr.plan) != NULL;
  e->meshes_differ = tr.plan->nin == s->nleaves &&
                     part_meshes_differ(tr.plan, s->leaves, s->nleaves, j->out_shardings);
  return cache_insert(j, e);
}

/* ==== calling ==================================================================== */

static Value *jit_call_laid(JitFn *j, const CallArgs *a);

/* Whether a call of [j] on the leaves of [s] runs plan [p] partitioned
 * (partition.h): a leaf is sharded, out_shardings asks for a layout, or
 * [constrained] (p has a sharding_constraint); never the shard_map a
 * partitioned plan runs as. */
static bool partitions(const JitFn *j, const Plan *p, Sig *s, bool constrained) {
  return !j->manual && p->nin == s->nleaves &&
         (constrained || part_mesh(s->leaves, s->nleaves, j->out_shardings));
}

/* The jit of the shard_map running [e]'s plan per device on the leaves
 * of [s] (borrowed; made by the first call). */
static Value *partitioned_fn(JitFn *j, Entry *e, Sig *s) {
  pthread_mutex_lock(&j->lock);
  Value *f = e->part_fn ? val_incref(e->part_fn) : NULL;
  pthread_mutex_unlock(&j->lock);
  if (f) return f;
  PartPlan *pp = part_plan_call(e->plan, s->leaves, j->out_shardings);
  Value *sf = pp ? part_shard_fn(pp) : NULL;
  f = sf ? jit_new(sf, 0, NULL, 0, NULL) : NULL;
  if (sf) val_decref(sf);
  if (!f) {
    if (pp) val_decref(&pp->base.hdr);
    return NULL;
  }
  ((JitFn *)f)->manual = true;
  ((JitFn *)f)->name = j->name;
  pthread_mutex_lock(&j->lock);
  if (!e->part_fn) {
    e->part = pp;
    e->part_fn = f;
    pp = NULL;
  } else {
    val_decref(f);
  }
  f = val_incref(e->part_fn);
  pthread_mutex_unlock(&j->lock);
  if (pp) val_decref(&pp->base.hdr);
  return f;
}

/* Runs [e] partitioned (Auto mode, partition.h): a shard_map over the
 * mesh of the sharded leaves, each result laid out as propagation says. */
/* Whether under mpirun an output of [e]'s partitioned plan would hold
 * only each process's blocks (array.h, "Process-local shards"). */
static bool outputs_local(const Entry *e) {
  if (!transport_active()) return false;
  for (int i = 0; i < e->plan->nout; i++) {
    AVal av;
    Value *sh = part_out_sharding(e->part, i);
    plan_atom_aval(e->plan, &e->plan->outs[i], &av);
    bool local = sh && sharding_is_local((NamedSharding *)sh, av.ndim, av.shape);
    if (sh) val_decref(sh);
    if (local) return true;
  }
  return false;
}

/* [e]'s result tree from [outs], of which the first [made] (new
 * references) were made from the plan's results [t]; consumes [outs]
 * and [t].  NULL unless all were made (out of memory: [t] and no
 * [outs]). */
static Value *outs_tree(const Entry *e, Value *t, Value **outs, int made) {
  Value *r = NULL;
  if (outs && made == e->plan->nout) {
    int pos = 0;
    r = unflatten(e->out_tree, outs, &pos);
  } else if (t && !outs) {
    err_nomem();
  }
  for (int i = 0; i < made; i++) val_decref(outs[i]);
  shm_free(outs);
  if (t) val_decref(t);
  return r;
}

static Value *run_partitioned(JitFn *j, Entry *e, Sig *s) {
  Value *f = partitioned_fn(j, e, s);
  if (!f) return NULL;
  CallArgs c = {.nargs = s->nleaves, .args = s->leaves};
  /* Outputs each process keeps only its blocks of come from the plan
   * interpreted on the devices (the same values: eager and jit agree),
   * whose call hands back blocks rather than copying the whole into a
   * compiled plan's workspace. */
  Value *t = outputs_local(e) ? shardmap_run(((JitFn *)f)->fn, &c) : jit_call_laid((JitFn *)f, &c);
  val_decref(f);
  int n = e->plan->nout;
  Value **outs = t ? shm_calloc((size_t)n + 1, sizeof(Value *)) : NULL;
  int made = 0;
  const Array *user = NULL;   /* the first argument laid out over a mesh */
  for (int i = 0; !user && i < s->nleaves; i++)
    if (IS_ARRAY(s->leaves[i]) && AS_ARRAY(s->leaves[i])->sharding &&
        ((NamedSharding *)AS_ARRAY(s->leaves[i])->sharding)->mesh)
      user = AS_ARRAY(s->leaves[i]);
  for (; outs && made < n; made++) {
    AVal av;
    plan_atom_aval(e->plan, &e->plan->outs[made], &av);
    Value *sh = part_out_sharding(e->part, made);
    if (user) sh = sharding_as_users(sh, av.ndim, user->sharding, user->ndim);
    outs[made] = sh ? sharding_put(tuple_get(t, (size_t)made), (NamedSharding *)sh) : NULL;
    if (sh) val_decref(sh);
    if (!outs[made]) break;
    /* the per-device program's results are its blocks' type; a weakly
     * typed result of the plan stays weak (a fresh array: an argument
     * passed through already has the plan's type) */
    if (IS_ARRAY(outs[made]) && AS_ARRAY(outs[made])->weak != av.weak)
      AS_ARRAY(outs[made])->weak = av.weak;
  }
  return outs_tree(e, t, outs, made);
}

/* Runs [e]'s plan on the leaves of [s] equation by equation as eager
 * code runs it (xmap_eval_plan: each primitive dispatched on its
 * operands' layouts, each shard_map over its own mesh), its results put
 * where out_shardings asks: for a plan whose shard_maps run over meshes
 * that differ (part_meshes_differ), which no one per-device program
 * runs.  Values and layouts are so eager code's. */
static Value *run_interpreted(JitFn *j, Entry *e, Sig *s) {
  Value *t = xmap_eval_plan(e->plan, s->leaves);
  int n = e->plan->nout, made = 0;
  Value **outs = t ? shm_calloc((size_t)n + 1, sizeof(Value *)) : NULL;
  for (; outs && made < n; made++) {
    Value *w = part_want_at(j->out_shardings, made), *v = tuple_get(t, (size_t)made);
    if (!(outs[made] = w ? sharding_put(v, (NamedSharding *)w) : val_incref(v))) break;
  }
  return outs_tree(e, t, outs, made);
}

/* Runs the compiled plan of [e] on the leaves of [s]: per device when a
 * leaf is sharded (or out_shardings asks for a layout); as eager code
 * when its shard_maps' meshes differ. */
static Value *run_entry(JitFn *j, Entry *e, Sig *s) {
  Plan *p = e->plan;
  if (e->meshes_differ && !j->manual && !dev_ctx()) return run_interpreted(j, e, s);
  if (!dev_ctx() && partitions(j, p, s, e->constrained))
    return run_partitioned(j, e, s);
  Array *in_stack[SIG_INLINE];
  Value *out_stack[SIG_INLINE];
  Array **in = s->nleaves <= SIG_INLINE ? in_stack : shm_calloc((size_t)s->nleaves, sizeof(Array *));
  Value **out = p->nout <= SIG_INLINE ? out_stack : shm_calloc((size_t)p->nout, sizeof(Value *));
  Value *r = NULL;
  if (!in || !out) {
    err_nomem();
    goto done;
  }
  for (int i = 0; i < s->nleaves; i++) in[i] = AS_ARRAY(s->leaves[i]);
  if (cmp_run(p, in, (Array **)out) == 0) {
    int pos = 0;
    r = unflatten(e->out_tree, out, &pos);
    for (int i = 0; i < p->nout; i++) val_decref(out[i]);
  }
done:
  if (in != in_stack) shm_free(in);
  if (out != out_stack) shm_free(out);
  return r;
}

/* Inside another trace: records pjit[jaxpr=... name=f]. */
static Value *call_nested(JitFn *j, const CallArgs *a, Sig *s) {
  Traced tr = {0};
  if (trace_call(j, a, s, false, &tr) < 0) return NULL;
  int n = tr.ncap + s->nleaves;
  Value **ops = shm_calloc((size_t)n + 1, sizeof(Value *));
  AVal *avs = shm_calloc((size_t)tr.plan->nout + 1, sizeof(AVal));
  /* in a staged xmap body, the results' named shapes are the body's */
  NamedShape *named = shm_calloc((size_t)tr.plan->nout + 1, sizeof(NamedShape));
  Value *res = NULL;
  if (ops && avs && named) {
    shm_memcpy(ops, tr.caps, sizeof(Value *) * (size_t)tr.ncap);
    shm_memcpy(ops + tr.ncap, s->leaves, sizeof(Value *) * (size_t)s->nleaves);
    for (int i = 0; i < tr.plan->nout; i++) {
      plan_atom_aval(tr.plan, &tr.plan->outs[i], &avs[i]);
      const NamedShape *ns = plan_var_named(tr.plan, tr.plan->outs[i].var);
      if (ns) named[i] = *ns;
    }
    Params p;
    params_init(&p);
    params_add(&p, "jaxpr", val_incref(&tr.plan->hdr));
    params_add(&p, "name", str_from(j->name));
    res = trace_emit_named(P_PJIT, &p, n, ops, tr.plan->nout, avs, named);
  } else {
    err_nomem();
  }
  Value *r = NULL;
  if (res) {
    int pos = 0;
    r = unflatten(tr.out_tree, ((Tuple *)res)->items, &pos);
  }
  val_decref(res);
  shm_free(ops);
  shm_free(avs);
  shm_free(named);
  trace_caps_free(tr.caps, tr.ncap);
  val_decref(&tr.plan->hdr);
  val_decref(tr.out_tree);
  return r;
}

/* Converts non-array leaves? Leaves are arrays or tracers already; a
 * traced leaf inside a concrete call means a leaked tracer. */
static bool any_tracer(const Sig *s) {
  for (int i = 0; i < s->nleaves; i++)
    if (IS_TRACER(s->leaves[i])) return true;
  return false;
}

/* Whether a leaf is being transformed (differentiated, batched). */
static bool any_jvp(const Sig *s) {
  for (int i = 0; i < s->nleaves; i++)
    if (IS_TRACER(s->leaves[i]) && !IS_STAGE_TRACER(s->leaves[i])) return true;
  return false;
}

/* How many functions deep holds_transformed looks through closures
 * (a closure calling a closure...), and how deep into containers. */
#define CLOSURE_SCAN_DEPTH 4

static bool closes_over_transformed(Value *fn, int depth);

/* Whether [v] is a value being transformed (differentiated, batched), or
 * holds one in a tuple, list or dict, or in the closure of a function,
 * up to [depth] levels down. */
static bool holds_transformed(Value *v, int depth) {
  if (!v || depth < 0) return false;
  if (IS_TRACER(v)) return !IS_STAGE_TRACER(v);
  switch (v->type) {
  case V_TUPLE:
    for (size_t i = 0; i < tuple_len(v); i++)
      if (holds_transformed(tuple_get(v, i), depth - 1)) return true;
    return false;
  case V_LIST:
    for (size_t i = 0; i < list_len(v); i++)
      if (holds_transformed(list_get(v, i), depth - 1)) return true;
    return false;
  case V_DICT:
    for (size_t i = 0; i < ((Dict *)v)->len; i++)
      if (holds_transformed(((Dict *)v)->vals[i], depth - 1)) return true;
    return false;
  case V_FUNC:
    return closes_over_transformed(v, depth - 1);
  default:
    return false;
  }
}

typedef struct ScanArg {
  int depth;
  bool found;
} ScanArg;

static void scan_binding(const char *name, Value *v, void *arg) {
  ScanArg *s = arg;
  (void)name;
  if (!s->found) s->found = holds_transformed(v, s->depth);
}

/* Whether user function [fn] closes over a value being transformed: a
 * binding of a scope that encloses it other than its module's (a value
 * being transformed lives in the frame of a function a transformation
 * called). */
static bool closes_over_transformed(Value *fn, int depth) {
  if (!fn || fn->type != V_FUNC || depth < 0) return false;
  ScanArg s = {depth, false};
  for (Env *e = ((Func *)fn)->closure; e && env_parent(e) && !s.found; e = env_parent(e))
    env_each(e, scan_binding, &s);
  return s.found;
}

/* jax_debug_nans after jit function [j] returned [r] (consumed) holding a
 * NaN: its function runs again without jit, op by op, so the operation
 * that made the NaN raises FloatingPointError where it is (JAX's
 * de-optimized call); when none does, the error names the jit function. */
static Value *rerun_for_nan(const JitFn *j, const CallArgs *a, Value *r) {
  val_decref(r);
  bool saved = atomic_exchange(&jaxcfg_disable_jit, true);
  r = val_call(j->fn, a);
  atomic_store(&jaxcfg_disable_jit, saved);
  if (!r) return NULL;
  val_decref(r);
  return err_set(ERR_FLOATING_POINT, "invalid value (nan) encountered in jit(%s)", j->name);
}

/* The arguments of a jit with in_shardings: each positional one put
 * (jax.device_put) as its entry says, or as the one sharding says. */
static int put_args(const JitFn *j, const CallArgs *a, Value **args) {
  size_t n;
  Value *const *items;
  bool each = !sharding_is(j->in_shardings) && val_seq(j->in_shardings, &n, &items);
  if (each && n != (size_t)a->nargs) {
    err_set(ERR_VALUE, "jit: in_shardings has %zu entries for %d positional arguments", n, a->nargs);
    return -1;
  }
  for (int i = 0; i < a->nargs; i++) {
    Value *sh = each ? items[i] : j->in_shardings;
    args[i] = sh == VAL_NONE ? val_incref(a->args[i]) : sharding_device_put(a->args[i], sh);
    if (!args[i]) {
      while (i--) val_decref(args[i]);
      return -1;
    }
  }
  return 0;
}

/* A ShapeDtypeStruct describes an argument for lower or eval_shape; a
 * call needs the array (JAX's TypeError). */
static int no_sds(const Sig *s) {
  for (int i = 0; i < s->nleaves; i++)
    if (aot_is_sds(s->leaves[i]))
      return err_set(ERR_TYPE, "argument '%s' of type ShapeDtypeStruct is not a valid JAX type: "
                     "a ShapeDtypeStruct stands for an array in jit(f).lower(...) and "
                     "jax.eval_shape, not in a call", s->names[i] ? s->names[i] : "?"), -1;
  return 0;
}

Value *jit_call(Value *f, const CallArgs *a) {
  JitFn *j = (JitFn *)f;
  if (!j->in_shardings && !j->out_shardings) return jit_call_laid(j, a);
  Value *stack[16], **args = a->nargs <= 16 ? stack : shm_calloc((size_t)a->nargs, sizeof(Value *));
  if (!args) return err_nomem();
  Value *r = NULL;
  if (!j->in_shardings || put_args(j, a, args) == 0) {
    CallArgs b = {a->nargs, j->in_shardings ? args : a->args, a->nkw, a->kwnames, a->kwvals};
    r = jit_call_laid(j, &b);
    for (int i = 0; j->in_shardings && i < a->nargs; i++) val_decref(args[i]);
  }
  if (args != stack) shm_free(args);
  if (r && j->out_shardings && !trace_current()) {   /* a strict constraint, as JAX's */
    Value *t = sharding_device_put(r, j->out_shardings);
    val_decref(r);
    r = t;
  }
  return r;
}

/* jit_call once the arguments are laid out as in_shardings says. */
static Value *jit_call_laid(JitFn *j, const CallArgs *a) {
  if (atomic_load(&jaxcfg_disable_jit)) return val_call(j->fn, a);
  Sig s;
  sig_init(&s);
  Value *r = NULL;
  if (sig_build(j, a, &s) < 0 || no_sds(&s) < 0) goto out;
  /* being transformed, as an argument or closed over: the same result,
   * evaluated inline (staging cannot take a transformation's value in; a
   * closed-over one found by tracing would run the function's Python side
   * effects once more, for the failed trace) */
  if (any_jvp(&s) || closes_over_transformed(j->fn, CLOSURE_SCAN_DEPTH)) {
    r = val_call(j->fn, a);
    goto out;
  }
  trace_transformed_operand();
  if (part_traced_explicit()) {   /* Explicit axes: the body's types and errors */
    r = val_call(j->fn, a);
  } else if (trace_current() || any_tracer(&s)) {
    r = call_nested(j, a, &s);
  } else {
    Entry *e = cache_find(j, &s);
    if (!e) e = cache_fill(j, a, &s);
    if (e) r = run_entry(j, e, &s);
    entry_release(e);
    if (r && atomic_load(&jaxcfg_debug_nans) && jaxcfg_has_nan(r)) r = rerun_for_nan(j, a, r);
  }
  if (!r && trace_transformed_operand()) {
    /* a value being transformed the scan above does not see (past its
     * depth, in a global, behind another kind of object) reached the
     * staging: evaluated inline all the same */
    err_clear();
    r = val_call(j->fn, a);
  }
out:
  sig_free(&s);
  return r;
}

/* ==== jit shard_map ================================================================ */


static PSpec *spec_at(Value *specs, int i) {
  return specs->type == V_PSPEC ? (PSpec *)specs : (PSpec *)tuple_get(specs, (size_t)i);
}

static uint32_t spec_bits(const PSpec *s, const Mesh *m) {
  uint32_t bits = 0;
  for (int ax = 0; ax < s->n; ax++)
    for (int k = 0; k < s->e[ax].nnames; k++) bits |= 1u << mesh_axis(m, s->e[ax].names[k]);
  return bits;
}

/* The block aval device code sees for global aval [g] under [s]; a
 * nested call's block still varies over what [g] varies over. */
static int block_aval(const ShardFn *f, int i, int n, const AVal *g, AVal *b, bool nested) {
  PSpec *s = spec_at(f->in_specs, i);
  if (shardmap_check_shape(f, i, n, g->ndim, g->shape) < 0) return -1;
  *b = *g;
  for (int ax = 0; ax < s->n; ax++) b->shape[ax] = g->shape[ax] / pspec_entry_size(s, f->mesh, ax);
  b->vma = spec_bits(s, f->mesh) | (nested ? g->vma : 0);
  return 0;
}

/* The global aval of result [i] from its block aval: a nested call's
 * still varies over the enclosing body's manual axes it varied over. */
static int global_aval(const ShardFn *f, PSpec *s, const AVal *b, AVal *g, bool nested) {
  if (!s) return err_set(ERR_VALUE, "%s(): the body's results do not match its out_specs", f->name), -1;
  if (pspec_check(s, f->mesh, b->ndim, "out_specs") < 0) return -1;
  *g = *b;
  g->vma = nested ? b->vma & f->auto_axes : 0;
  for (int ax = 0; ax < s->n; ax++) g->shape[ax] = b->shape[ax] * pspec_entry_size(s, f->mesh, ax);
  return 0;
}

/* Traces the body of [f] on block tracers, with the mesh's device context
 * installed so collectives know their axes.  [nested]: called inside
 * another shard_map's body (the current device context's), whose manual
 * axes stay manual in this one's. */
static Plan *trace_body(ShardFn *f, int n, Value **args, Value ***caps, int *ncap,
                        Value **result, bool nested) {
  DevCtx *saved = dev_ctx();
  MeshDesc md;
  if (nested) {
    md = *saved->mesh;
    md.auto_axes &= f->auto_axes;
  } else {
    mesh_to_desc(f->mesh, &md);
    md.auto_axes = f->auto_axes;
  }
  DevCtx ctx = {.mesh = &md, .rank = 0, .unchecked = !f->check_rep};
  Trace *t = trace_begin(f->name, false);
  if (!t) return NULL;
  Value **bt = shm_calloc((size_t)n + 1, sizeof(Value *));
  Value *r = NULL;
  for (int i = 0; bt && i < n; i++) {
    AVal g, b;
    if (ops_aval(args[i], &g) < 0 || block_aval(f, i, n, &g, &b, nested) < 0 ||
        !(bt[i] = trace_new_arg(t, &b, NULL)))
      goto fail;
  }
  dev_ctx_set(&ctx);
  Loc before = eval_current_loc();
  r = bt ? val_call_n(f->body, n, bt) : err_nomem();
  Loc after = eval_current_loc();   /* the body's return, when the interpreter ran it */
  dev_ctx_set(saved);
  Sig outs;
  sig_init(&outs);
  if (!r || flatten_out(r, &outs) < 0) {
    sig_free(&outs);
    goto fail;
  }
  Plan *p = trace_end(t, outs.nleaves, outs.leaves, caps, ncap);
  sig_free(&outs);
  values_free(bt, n);
  if (p && !(p->in_labels = shardmap_arg_labels(f, *ncap, n, 0))) {
    val_decref(&p->hdr);
    val_decref(r);
    return NULL;
  }
  if (p && after.src && (after.src != before.src || after.line != before.line ||
                         after.col != before.col)) {
    src_incref(after.src);
    p->ret = after;
  }
  *result = r;   /* its structure: the call's result is rebuilt in it */
  return p;
fail:
  values_free(bt, n);
  val_decref(r);
  trace_abort(t);
  return NULL;
}

/* in_specs for the equation: P() for each capture, then the function's. */
static Value *eqn_in_specs(const ShardFn *f, int ncap, int n) {
  Value *t = tuple_new((size_t)(ncap + n));
  for (int i = 0; t && i < ncap + n; i++) {
    Value *s = i < ncap ? pspec_from_args(0, NULL) : val_incref(&spec_at(f->in_specs, i - ncap)->hdr);
    if (!s) {
      for (int k = i; k < ncap + n; k++) tuple_set_steal(t, (size_t)k, val_incref(VAL_NONE));
      val_decref(t);
      return NULL;
    }
    tuple_set_steal(t, (size_t)i, s);
  }
  return t;
}

/* The names of [f]'s manual axes (a new tuple of Str), as a partial-manual
 * shard_map equation's manual_axes parameter lists them in mesh order. */
static Value *manual_axes_tuple(const ShardFn *f) {
  Value *items[MESH_MAX_AXES];
  int n = 0;
  for (int a = 0; a < f->mesh->naxes; a++)
    if (!(f->auto_axes >> a & 1)) {
      if (!(items[n] = str_from(f->mesh->axis_names[a]))) break;
      n++;
    }
  Value *t = tuple_pack((size_t)n, items);
  for (int i = 0; i < n; i++) val_decref(items[i]);
  return t;
}

/* Records shard_map[...] over [args] in the current trace. */
static Value *emit_shard_map(ShardFn *f, Plan *body, Value *out_specs, Value **caps, int ncap,
                             int n, Value **args, bool nested) {
  int nout = body->nout;
  AVal *avs = shm_calloc((size_t)nout + 1, sizeof(AVal));
  Value **ops = shm_calloc((size_t)(ncap + n) + 1, sizeof(Value *));
  if (!avs || !ops) {
    shm_free(avs);
    shm_free(ops);
    return err_nomem();
  }
  Value *r = NULL;
  for (int i = 0; i < nout; i++) {
    AVal b;
    plan_atom_aval(body, &body->outs[i], &b);
    if (global_aval(f, (PSpec *)tuple_get(out_specs, (size_t)i), &b, &avs[i], nested) < 0)
      goto out;
  }
  shm_memcpy(ops, caps, sizeof(Value *) * (size_t)ncap);
  shm_memcpy(ops + ncap, args, sizeof(Value *) * (size_t)n);
  Params p;
  params_init(&p);
  params_add(&p, "mesh", val_incref(&f->mesh->hdr));
  params_add(&p, "in_specs", eqn_in_specs(f, ncap, n));
  params_add(&p, "out_specs", val_incref(out_specs));
  params_add(&p, "jaxpr", val_incref(&body->hdr));
  params_add(&p, "check_rep", val_incref(val_bool(f->check_rep)));
  int want = 5;
  if (f->auto_axes) {   /* partial manual: the axes the body may name */
    want++;
    params_add(&p, "manual_axes", manual_axes_tuple(f));
  }
  if (p.n == want) r = trace_emit(P_SHARD_MAP, &p, ncap + n, ops, nout, avs);
  else params_clear(&p);
out:
  shm_free(avs);
  shm_free(ops);
  return r;
}

/* A shard_map called on tracers: its body as a sub-plan.  The result has
 * the structure the un-jitted call would have (one array or a tuple). */
static Value *trace_shard_map(Value *sfv, int n, Value **args) {
  ShardFn *f = (ShardFn *)sfv;
  if (f->in_specs->type == V_TUPLE && (int)tuple_len(f->in_specs) != n)
    return err_set(ERR_TYPE, "%s() has %zu in_specs but was called with %d argument%s", f->name,
                   tuple_len(f->in_specs), n, n == 1 ? "" : "s");
  Value **caps = NULL, *tmpl = NULL;
  int ncap = 0;
  DevCtx *dc = dev_ctx();
  bool nested = dc && dc->mesh;   /* inside a shard_map body being traced */
  Plan *body = trace_body(f, n, args, &caps, &ncap, &tmpl, nested);
  if (!body) return NULL;
  /* one spec per result leaf, from the out_specs prefix of the result */
  Value *specs = shardmap_out_leaf_specs(f, tmpl);
  Value *res = specs && (int)tuple_len(specs) == body->nout
                   ? emit_shard_map(f, body, specs, caps, ncap, n, args, nested)
                   : specs ? err_set(ERR_VALUE, "%s(): the body's results do not match its "
                                                "out_specs", f->name)
                           : NULL;
  trace_caps_free(caps, ncap);
  val_decref(&body->hdr);
  if (specs) val_decref(specs);
  Value *r = NULL;
  int pos = 0;
  if (res) r = pytree_replace(tmpl, NULL, ((Tuple *)res)->items, &pos);
  if (res) val_decref(res);
  val_decref(tmpl);
  return r;
}

Value *jit_trace_shard_map(Value *sf, const CallArgs *a) {
  if (a->nkw) return err_set(ERR_TYPE, "%s() takes no keyword arguments", ((ShardFn *)sf)->name);
  Value **args = shm_calloc((size_t)a->nargs + 1, sizeof(Value *));
  if (!args) return err_nomem();
  int i = 0;
  for (; i < a->nargs; i++)
    if (!(args[i] = shardmap_arg((ShardFn *)sf, a, i))) break;
  Value *r = i == a->nargs ? trace_shard_map(sf, a->nargs, args) : NULL;
  values_free(args, i);
  return r;
}

/* An eager call of partial-manual shard_map [sf] (shardmap_set_auto_runner):
 * the call as jit runs it, whose partitioner partitions the body along
 * the automatic axes (partition.c), so eager and jit calls agree.  A body
 * that cannot be traced (Python control flow on values, a shard_map
 * nested in it), or jax.disable_jit, gives NULL with no error: the call
 * runs it replicated (its trace's side effects already done). */
static Value *run_auto_shard_map(Value *sf, const CallArgs *a) {
  static _Thread_local bool busy;   /* the body's own call, when jit calls it inline */
  if (busy || atomic_load(&jaxcfg_disable_jit)) return NULL;
  Value *jv = jit_new(sf, 0, NULL, 0, NULL);
  if (!jv) return NULL;
  JitFn *j = (JitFn *)jv;
  Sig s;
  sig_init(&s);
  Value *r = NULL;
  busy = true;
  if (sig_build(j, a, &s) == 0 && no_sds(&s) == 0) {
    Entry *e = cache_fill(j, a, &s);
    if (e) {
      r = run_entry(j, e, &s);
      entry_release(e);
    } else {
      ErrKind k = err_kind();
      if (k != ERR_INTERRUPT && k != ERR_MEMORY && k != ERR_QUIT) err_clear();
    }
  }
  busy = false;
  sig_free(&s);
  val_decref(jv);
  return r;
}

/* ==== values, builtins, registration ================================================= */

static void jit_free(Value *v) {
  JitFn *j = (JitFn *)v;
  while (j->cache) {   /* no call runs: the cache's are the last references */
    Entry *e = j->cache;
    j->cache = e->next;
    entry_release(e);
  }
  val_decref(j->fn);
  if (j->in_shardings) val_decref(j->in_shardings);
  if (j->out_shardings) val_decref(j->out_shardings);
  shm_free(j->nums);
  shm_free(j->names);
  pthread_mutex_destroy(&j->lock);
  shm_free(j);
}

static Value *jit_repr(Value *v) { return str_printf("<jit function %s>", ((JitFn *)v)->name); }

static const char *callable_name(Value *fn) {
  switch (fn->type) {
  case V_FUNC: return ((Func *)fn)->name;
  case V_SHARDFN: return ((ShardFn *)fn)->name;
  case V_BUILTIN: return intern_cstr(((Builtin *)fn)->name);
  case V_JITFN: return ((JitFn *)fn)->name;
  default: return intern_cstr("<jit>");
  }
}

Value *jit_new(Value *fn, int n_nums, const int64_t *static_nums, int n_names,
               const char **static_names) {
  if (fn->type == V_NONE || IS_ARRAY(fn) || fn->type == V_STR)
    return err_set(ERR_TYPE, "jit: expected a function, got %s", val_type_name(fn));
  JitFn *j = shm_calloc(1, sizeof *j);
  if (!j) return err_nomem();
  val_init(&j->hdr, V_JITFN);
  pthread_mutex_init(&j->lock, NULL);
  j->fn = val_incref(fn->type == V_JITFN ? ((JitFn *)fn)->fn : fn);
  j->name = callable_name(fn);
  j->nums = shm_calloc((size_t)n_nums + 1, sizeof(int64_t));
  j->names = shm_calloc((size_t)n_names + 1, sizeof(char *));
  if (!j->nums || !j->names) {
    val_decref(&j->hdr);
    return err_nomem();
  }
  shm_memcpy(j->nums, static_nums, sizeof(int64_t) * (size_t)n_nums);
  shm_memcpy(j->names, static_names, sizeof(char *) * (size_t)n_names);
  j->n_nums = n_nums;
  j->n_names = n_names;
  return &j->hdr;
}

static Value *make_jit_hook(Value *fn) {
  Value *j = jit_new(fn, 0, NULL, 0, NULL);
  val_decref(fn);
  return j;
}

/* static_argnums: an int or a sequence of ints. */
static int read_nums(Value *v, int *n, int64_t *out) {
  *n = 0;
  if (!v || v == VAL_NONE) return 0;
  size_t len = 1;
  Value *const *items = &v;
  if (v->type == V_TUPLE || v->type == V_LIST) val_seq(v, &len, &items);
  for (size_t i = 0; i < len && i < 32; i++)
    if (arr_to_index(items[i], &out[(*n)++]) < 0) return -1;
  return 0;
}

static int read_names(Value *v, int *n, const char **out) {
  *n = 0;
  if (!v || v == VAL_NONE) return 0;
  size_t len = 1;
  Value *const *items = &v;
  if (v->type == V_TUPLE || v->type == V_LIST) val_seq(v, &len, &items);
  for (size_t i = 0; i < len && i < 32; i++) {
    if (items[i]->type != V_STR) {
      err_set(ERR_TYPE, "static_argnames must be strings, got %s", val_type_name(items[i]));
      return -1;
    }
    out[(*n)++] = intern_cstr(str_cstr(items[i]));
  }
  return 0;
}

/* jit(fun, static_argnums=None, static_argnames=None) */
/* jax.jit(fun, static_argnums=, static_argnames=, in_shardings=,
 * out_shardings=, donate_argnums=): donation is advice JAX may ignore,
 * and shmap does. */
static Value *bi_jit(const CallArgs *a) {
  Value *fn, *nums_v, *names_v, *ins = NULL, *outs = NULL, *donate = NULL;
  if (args_bind("jit", a, "fun, static_argnums=, static_argnames=, in_shardings=, out_shardings=, donate_argnums=",
                (Value **[]){&fn, &nums_v, &names_v, &ins, &outs, &donate}) < 0)
    return NULL;
  int64_t nums[32];
  const char *names[32];
  int nn, nm;
  if (read_nums(nums_v, &nn, nums) < 0 || read_names(names_v, &nm, names) < 0) return NULL;
  Value *r = jit_new(fn, nn, nums, nm, names);
  if (r && ins && ins != VAL_NONE) ((JitFn *)r)->in_shardings = val_incref(ins);
  if (r && outs && outs != VAL_NONE) ((JitFn *)r)->out_shardings = val_incref(outs);
  return r;
}

/* The plan a call of [j] on the sharded leaves of [s] runs (its global
 * plan [p]): a shard_map whose body is the per-device program, each
 * inserted collective commented with its source line and reason. */
static Value *partitioned_plan(JitFn *j, Plan *p, Sig *s) {
  PartPlan *pp = part_plan_call(p, s->leaves, j->out_shardings);
  if (!pp) return NULL;
  part_plan_set_annotate(pp);
  Value *sf = part_shard_fn(pp), *f = sf ? jit_new(sf, 0, NULL, 0, NULL) : NULL, *r = NULL;
  val_decref(&pp->base.hdr);
  if (sf) val_decref(sf);
  if (f) {
    ((JitFn *)f)->manual = true;
    ((JitFn *)f)->name = j->name;
    CallArgs c = {.nargs = s->nleaves, .args = s->leaves};
    r = jit_plan_of(f, &c, true);
    val_decref(f);
  }
  return r;
}

Value *jit_plan_of(Value *fn, const CallArgs *a, bool per_device) {
  Value *jv = fn->type == V_JITFN ? val_incref(fn) : jit_new(fn, 0, NULL, 0, NULL);
  if (!jv) return NULL;
  JitFn *j = (JitFn *)jv;
  Sig s;
  sig_init(&s);
  Traced tr = {0};
  Value *r = NULL;
  if (sig_build(j, a, &s) == 0 && trace_call(j, a, &s, trace_current() == NULL, &tr) == 0) {
    r = &tr.plan->hdr;
    /* sharded arguments: the per-device plan the partitioner runs */
    if (per_device && partitions(j, tr.plan, &s, part_constraint_mesh(tr.plan) != NULL)) {
      Value *q = partitioned_plan(j, tr.plan, &s);
      val_decref(r);
      r = q;
    }
    trace_caps_free(tr.caps, tr.ncap);
    val_decref(tr.out_tree);
  }
  sig_free(&s);
  val_decref(jv);
  return r;
}

/* The static arguments of [a]: (position, value) and (keyword, value)
 * pairs, in a tuple; an empty one on out of memory (the call then needs
 * them passed, and says so by its signature). */
static Value *statics_of(const JitFn *j, const CallArgs *a) {
  Value *l = list_new(2);
  for (int i = 0; l && i < a->nargs + a->nkw; i++) {
    bool pos = i < a->nargs;
    const char *name = pos ? param_name(j->fn, i) : a->kwnames[i - a->nargs];
    if (!is_static(j, pos ? i : -1, name)) continue;
    Value *k = pos ? val_int(i) : str_from(name);
    Value *pair = k ? tuple_pack(2, (Value *[]){k, pos ? a->args[i] : a->kwvals[i - a->nargs]}) : NULL;
    val_decref(k);
    if (list_append_steal(l, pair) < 0) err_clear();
  }
  Value *t = l ? tuple_pack(list_len(l), ((List *)l)->items) : NULL;
  val_decref(l);
  if (!t) err_clear();
  return t ? t : tuple_new(0);
}

/* [a] with the lowered call's static arguments put back where they were:
 * positional ones at their positions, keywords after [a]'s. */
static int with_statics(const JitLowered *l, const CallArgs *a, CallArgs *out, Value ***args,
                        const char ***kwn, Value ***kwv) {
  size_t ns = l->statics ? tuple_len(l->statics) : 0;
  int npos = 0, nkw = 0;
  for (size_t k = 0; k < ns; k++)
    IS_ARRAY(tuple_get(tuple_get(l->statics, k), 0)) ? npos++ : nkw++;
  *args = shm_calloc((size_t)(a->nargs + npos) + 1, sizeof(Value *));
  *kwn = shm_calloc((size_t)(a->nkw + nkw) + 1, sizeof(char *));
  *kwv = shm_calloc((size_t)(a->nkw + nkw) + 1, sizeof(Value *));
  if (!*args || !*kwn || !*kwv) return err_nomem(), -1;
  int next = 0;
  for (int i = 0; i < a->nargs + npos; i++) {
    Value *v = NULL;
    for (size_t k = 0; k < ns && !v; k++) {
      Value *pr = tuple_get(l->statics, k), *key = tuple_get(pr, 0);
      if (IS_ARRAY(key) && arr_get_i64(AS_ARRAY(key), 0) == i) v = tuple_get(pr, 1);
    }
    (*args)[i] = v ? v : next < a->nargs ? a->args[next++] : VAL_NONE;
  }
  int m = 0;
  for (int k = 0; k < a->nkw; k++, m++) (*kwn)[m] = a->kwnames[k], (*kwv)[m] = a->kwvals[k];
  for (size_t k = 0; k < ns; k++) {
    Value *pr = tuple_get(l->statics, k), *key = tuple_get(pr, 0);
    if (IS_ARRAY(key)) continue;
    (*kwn)[m] = intern_cstr(str_cstr(key)), (*kwv)[m++] = tuple_get(pr, 1);
  }
  *out = (CallArgs){a->nargs + npos, *args, m, *kwn, *kwv};
  return 0;
}

Plan *jit_lower(Value *fn, const CallArgs *a, JitLowered *out) {
  Value *jv = fn->type == V_JITFN ? val_incref(fn) : jit_new(fn, 0, NULL, 0, NULL);
  if (!jv) return NULL;
  if (trace_current()) {
    val_decref(jv);
    return err_set(ERR_TYPE, "lower: cannot lower while tracing (call it outside jit)");
  }
  JitFn *j = (JitFn *)jv;
  Sig s;
  sig_init(&s);
  Traced tr = {0};
  Plan *p = NULL;
  if (sig_build(j, a, &s) == 0 && trace_call(j, a, &s, true, &tr) == 0) {
    trace_caps_free(tr.caps, tr.ncap);
    /* sharded arguments (arrays, or ShapeDtypeStructs with a sharding,
     * on a real or abstract mesh): the per-device program partitioned
     * from them, whose costs are per device as a shard_map's */
    if (partitions(j, tr.plan, &s, part_constraint_mesh(tr.plan) != NULL)) {
      Value *q = partitioned_plan(j, tr.plan, &s);
      val_decref(&tr.plan->hdr);
      tr.plan = q ? AS_PLAN(q) : NULL;
      if (!q) {
        val_decref(tr.out_tree);
        sig_free(&s);
        val_decref(jv);
        return NULL;
      }
    }
    out->key = shm_malloc(s.len + 1);
    if (out->key) {
      shm_memcpy(out->key, s.key, s.len);
      out->keylen = s.len;
      out->out_tree = tr.out_tree;
      out->jit = jv;
      out->holds = s.holds;
      s.holds = NULL;
      out->statics = statics_of(j, a);
      p = tr.plan;
    } else {
      err_nomem();
      val_decref(tr.out_tree);
      val_decref(&tr.plan->hdr);
    }
  }
  sig_free(&s);
  if (!p) val_decref(jv);
  return p;
}

/* The type JAX prints for an aval, float32[8,16]{weak_type=True}. */
static void jax_type_str(const AVal *a, char *buf, size_t cap) {
  size_t len = (size_t)snprintf(buf, cap, "%s[", dt_name(a->dtype));
  for (int i = 0; i < a->ndim && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? "," : "", (long long)a->shape[i]);
  if (len < cap) snprintf(buf + len, cap - len, a->weak ? "]{weak_type=True}" : "]");
}

/* The error of a call whose signature is not the lowered one: JAX's
 * wording, each differing argument named. */
static void mismatch_error(const Plan *p, const Sig *s) {
  if (s->nleaves != p->nin) {
    err_set(ERR_TYPE, "Function compiled with input pytree does not match the input pytree it "
            "was called with: compiled for %d arrays, called with %d", p->nin, s->nleaves);
    return;
  }
  char msg[1024], want[128], got[128];
  size_t len = (size_t)snprintf(msg, sizeof msg, "Argument types differ from the types for which "
                                "this computation was compiled. The mismatches are:");
  int bad = 0;
  for (int i = 0; i < s->nleaves && len < sizeof msg; i++) {
    AVal g;
    if (leaf_aval(s->leaves[i], &g) < 0) {
      err_clear();
      continue;
    }
    const AVal *w = &p->vars[p->invars[i]];
    jax_type_str(w, want, sizeof want);
    jax_type_str(&g, got, sizeof got);
    if (strcmp(want, got) == 0) continue;
    bad++;
    char pos[32];
    snprintf(pos, sizeof pos, "args[%d]", i);
    len += (size_t)snprintf(msg + len, sizeof msg - len, "\nArgument '%s' compiled with %s and "
                            "called with %s", s->names[i] ? s->names[i] : pos, want, got);
  }
  if (!bad) snprintf(msg + len, sizeof msg - len, "\nthe static arguments or the context mesh "
                     "differ from the lowered call's");
  err_set(ERR_TYPE, "%s", msg);
}

Value *jit_run_lowered(JitLowered *l, Plan *p, const CallArgs *given) {
  JitFn *j = (JitFn *)l->jit;
  Sig s;
  sig_init(&s);
  Value *r = NULL, **args = NULL, **kwv = NULL;
  const char **kwn = NULL;
  CallArgs full, *a = &full;
  if (with_statics(l, given, &full, &args, &kwn, &kwv) < 0) goto out;
  if (sig_build(j, a, &s) < 0 || no_sds(&s) < 0) goto out;
  if (any_tracer(&s)) {
    err_set(ERR_TYPE, "a Compiled function cannot be called on traced values (call the jit "
            "function instead)");
    goto out;
  }
  if (s.len != l->keylen || memcmp(s.key, l->key, s.len) != 0) {
    mismatch_error(p, &s);
    goto out;
  }
  Entry e = {.plan = p, .out_tree = l->out_tree, .constrained = part_constraint_mesh(p) != NULL,
             .meshes_differ = p->nin == s.nleaves &&
                              part_meshes_differ(p, s.leaves, s.nleaves, j->out_shardings),
             .part = (PartPlan *)l->part, .part_fn = l->part_fn};
  r = run_entry(j, &e, &s);
  l->part = e.part ? &e.part->base.hdr : NULL;
  l->part_fn = e.part_fn;
out:
  sig_free(&s);
  shm_free(args);
  shm_free(kwn);
  shm_free(kwv);
  return r;
}

void jit_lowered_clear(JitLowered *l) {
  shm_free(l->key);
  val_decref(l->out_tree);
  val_decref(l->jit);
  val_decref(l->holds);
  val_decref(l->statics);
  val_decref(l->part);
  val_decref(l->part_fn);
  memset(l, 0, sizeof *l);
}

/* plan(f, *args, **kwargs): the staged plan of calling f on args. */
static Value *bi_plan(const CallArgs *a) {
  if (a->nargs < 1) return err_set(ERR_TYPE, "plan() missing required argument 'f'");
  CallArgs rest = {a->nargs - 1, a->args + 1, a->nkw, a->kwnames, a->kwvals};
  return jit_plan_of(a->args[0], &rest, true);
}

/* jax.make_jaxpr(f)(*args): a callable giving the plan. */
static Value *make_jaxpr_call(Value *self, const CallArgs *a) {
  return jit_plan_of(self, a, false);
}

static Value *bi_make_jaxpr(const CallArgs *a) {
  Value *fn;
  if (args_bind("make_jaxpr", a, "fun", (Value **[]){&fn}) < 0) return NULL;
  return bound_new("make_jaxpr", make_jaxpr_call, fn);
}

static int add_both(Env *b, const char *name, BuiltinFn fn, const char *doc, const char *ns) {
  Value *v = builtin_new(name, fn, doc);
  int rc = v && env_set(b, intern_cstr(name), v) == 0 && builtins_add_to(ns, name, v) == 0 ? 0 : -1;
  val_decref(v);
  return rc;
}

/* A jitted function's attributes: functools.wraps' __wrapped__, the
 * function it stages (the debugger's `b f` breaks in it). */
static Value *jit_getattr(Value *self, const char *name) {
  if (strcmp(name, "__wrapped__") == 0) return val_incref(((JitFn *)self)->fn);
  if (strcmp(name, "__name__") == 0) return ops_getattr(((JitFn *)self)->fn, name);
  if (strcmp(name, "lower") == 0) return bound_new("lower", aot_lower_method, self);
  if (strcmp(name, "eval_shape") == 0) return bound_new("eval_shape", aot_eval_shape_method, self);
  return err_set(ERR_ATTRIBUTE, "'jit' object has no attribute '%s'", name);
}

int jit_register(Env *b) {
  shardmap_typeof_sharding_hook = part_traced_sharding;
  jit_register_rules();
  jit_register_shard_map_rules();
  trace_register();
  plan_register();
  cmp_register();
  eager_fusion_register();
  partition_eager_register();
  val_register_free(V_JITFN, jit_free);
  print_register(V_JITFN, jit_repr, jit_repr);
  eval_register_call(V_JITFN, jit_call);
  ops_register_getattr(V_JITFN, jit_getattr);
  eval_make_jit = make_jit_hook;
  shardmap_set_stager(jit_trace_shard_map);
  shardmap_set_auto_runner(run_auto_shard_map);
  if (aot_register(b) < 0) return -1;
  if (add_both(b, "jit", bi_jit, "jit(fun, static_argnums=None, static_argnames=None)", "jax") < 0 ||
      add_both(b, "plan", bi_plan, "plan(f, *args): the staged plan of f(*args)", "jax") < 0 ||
      add_both(b, "make_jaxpr", bi_make_jaxpr, "make_jaxpr(f)(*args): the staged plan", "jax") < 0)
    return -1;
  /* jax.experimental.pjit.pjit: JAX's former name of jit */
  Value *pj = builtin_new("pjit", bi_jit, "pjit(fun, static_argnums=None, static_argnames=None): jit");
  int rc = pj ? builtins_add_to("jax.experimental.pjit", "pjit", pj) : -1;
  val_decref(pj);
  return rc;
}
