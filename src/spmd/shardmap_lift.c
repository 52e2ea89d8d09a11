/*
 * shardmap_lift.c - values a shard_map body closes over that a
 * transformation traces (shardmap.h: shardmap_lift_call, shardmap_lifted).
 *
 * A body runs on the device threads, where a value being differentiated
 * or batched by a trace of the calling thread means nothing: its trace is
 * not theirs.  JAX traces a body to a jaxpr, so a closed-over tracer
 * becomes a constant of it that shard_map passes as one more input,
 * replicated (P()): the transformation then sees it as an argument, and
 * the transpose of its implicit broadcast to every device is a psum over
 * the mesh axes (experimental/shard_map.py; seed 000).  Here the call
 * finds such values in the scopes the body closes over and passes them
 * the same way; on each device, while the body runs, an operation on one
 * of them takes the device's block of that input instead (the trace's
 * dispatch asks shardmap_lifted).
 */
#include <string.h>

#include "array/prim.h"
#include "base/mem.h"
#include "lang/pytree.h"
#include "spmd/mesh.h"
#include "spmd/shardmap.h"

/* Closed-over values one call passes as inputs: at most this many. */
#define LIFT_MAX 32
/* Scopes a search visits, and how deep it follows containers. */
#define LIFT_SCOPES 64
#define LIFT_DEPTH 16
/* Values a search looks at in all: containers are not remembered, so one
 * that holds itself several times would otherwise be walked for long. */
#define LIFT_BUDGET 100000

/* ==== finding them =============================================================== */

typedef struct Scan {
  Value **found;            /* borrowed: the scopes hold them during the call */
  int n, cap;
  bool overflow;
  Value *const *skip;       /* the arguments' own tracers */
  int nskip;
  const Env *seen[LIFT_SCOPES];
  int nseen;
  int depth;
  long budget;
  bool partial;             /* looking for process-local shards instead (module scopes too) */
  bool failed;              /* materialising one failed: the error is set */
} Scan;

static Value *lift_body(Value *self, const CallArgs *a);
static void scan_value(Scan *s, Value *v);

static void scan_binding(const char *name, Value *v, void *ctx) {
  (void)name;
  scan_value(ctx, v);
}

/* The bindings of [e] and the scopes enclosing it, module scopes aside: a
 * transformation's tracers live in the scopes of the functions it calls. */
static void scan_env(Scan *s, Env *e) {
  for (; e && (env_parent(e) || s->partial); e = env_parent(e)) {
    for (int i = 0; i < s->nseen; i++)
      if (s->seen[i] == e) return;
    if (s->nseen == LIFT_SCOPES) return;
    s->seen[s->nseen++] = e;
    /* in name order: every process must find the same values in the
     * same order (and cut at the same budget): the tracers lifted into
     * the body's arguments, whose order every device's body shares, and
     * the process-local shards made whole, a collective each */
    if (env_each_sorted(e, scan_binding, s) < 0) s->failed = true;
  }
}

static void scan_items(Scan *s, Value *const *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (v[i]) scan_value(s, v[i]);
}

static void scan_tracer(Scan *s, Value *v) {
  /* one an enclosing call on this device passes already: a nested call
   * passes on this device's value of it, which the dispatch takes after
   * it (shardmap_lifted) */
  Value *here = shardmap_lifted(v);
  if (here && here->type != V_TRACER) return;
  if (here) v = here;
  if (prim_value_is_staged(v)) return;   /* jit's: the staging lifts them */
  for (int i = 0; i < s->nskip; i++)
    if (s->skip[i] == v) return;
  for (int i = 0; i < s->n; i++)
    if (s->found[i] == v) return;
  if (s->n == s->cap) s->overflow = true;
  else s->found[s->n++] = v;
}

/* A value reachable from the body: a tracer of a transformation (not a
 * staged one), or what a function, a functools.partial or a container
 * holds. */
static void scan_value(Scan *s, Value *v) {
  if (s->depth >= LIFT_DEPTH) return;
  if (++s->budget > LIFT_BUDGET) return;   /* what it found so far is passed */
  s->depth++;
  switch ((VType)v->type) {
  case V_TRACER:
    if (!s->partial) scan_tracer(s, v);
    break;
  case V_ARRAY:
    if (s->partial && AS_ARRAY(v)->buf->part && !s->failed && arr_make_whole(AS_ARRAY(v)) < 0)
      s->failed = true;
    break;
  case V_FUNC: {
    Func *f = (Func *)v;
    if (f->defaults) scan_items(s, f->defaults, (size_t)f->node->nparams);
    scan_env(s, f->closure);
    break;
  }
  case V_BOUND:
    if (((BoundMethod *)v)->fn != lift_body) scan_value(s, ((BoundMethod *)v)->self);
    break;
  case V_TUPLE: scan_items(s, ((Tuple *)v)->items, tuple_len(v)); break;
  case V_LIST: scan_items(s, ((List *)v)->items, list_len(v)); break;
  case V_DICT: scan_items(s, ((Dict *)v)->vals, ((Dict *)v)->len); break;
  default: break;
  }
  s->depth--;
}

/* ==== the devices' view of them ====================================================== */

/* The captured values of the calls running a body on this thread,
 * innermost first, and each one's block of this device. */
typedef struct LiftFrame {
  Value *const *from, *const *to;
  int n;
  struct LiftFrame *up;
} LiftFrame;

static _Thread_local LiftFrame *lift_top;

const Value shardmap_lift_none;

Value *shardmap_lifted(const Value *v) {
  for (LiftFrame *f = lift_top; f; f = f->up)
    for (int i = 0; i < f->n; i++)
      if (f->from[i] == v) return f->to[i];
  return NULL;
}

/* The body of a call with its captured values passed as inputs: the
 * user's body, the inputs after its arguments. */
typedef struct LiftCall {
  Opaque base;
  Value *body;               /* the user's body */
  int n;
  Value *caps[LIFT_MAX];     /* owned: the values it closes over */
} LiftCall;

static void liftcall_free(Value *v) {
  LiftCall *l = (LiftCall *)v;
  val_decref(l->body);
  for (int i = 0; i < l->n; i++) val_decref(l->caps[i]);
}

static const OpaqueType liftcall_type = {"shard_map body with its closed-over values",
                                         liftcall_free, NULL, NULL, NULL, NULL, NULL};

static bool any_leaf(Value *v) { return !(v->type == V_TUPLE || v->type == V_LIST || v->type == V_DICT); }

/* A result that is a captured value itself (the body returns it) is the
 * device's block of it, as any use of it is. */
static Value *result_leaf(Value *v, void *ctx) {
  (void)ctx;
  Value *b = v->type == V_TRACER ? shardmap_lifted(v) : NULL;
  return val_incref(b ? b : v);
}

static Value *lift_body(Value *self, const CallArgs *a) {
  LiftCall *l = (LiftCall *)self;
  int nargs = a->nargs - l->n;
  if (nargs < 0 || a->nkw) return err_set(ERR_TYPE, "shard_map: a body lost its closed-over inputs");
  LiftFrame fr = {l->caps, a->args + nargs, l->n, lift_top};
  lift_top = &fr;
  CallArgs c = {nargs, a->args, 0, NULL, NULL};
  Value *r = val_call(l->body, &c);
  Value *out = r ? pytree_map(r, any_leaf, result_leaf, NULL) : NULL;
  lift_top = fr.up;
  if (r) val_decref(r);
  return out;
}

/* ==== the call ======================================================================= */

/* The user's in_specs (or their pytree prefix) for [nargs] arguments,
 * then P() for each of [n] captured values; NULL (no error) when the
 * specs do not fit the arguments, whose call then says so. */
static Value *lifted_in_specs(const ShardFn *f, int nargs, int n) {
  Value *in = f->in_tree ? f->in_tree : f->in_specs;
  size_t ni = (size_t)nargs;
  Value *const *is = NULL;
  bool one = in->type == V_PSPEC || in == VAL_NONE;
  if (!one && (!val_seq(in, &ni, &is) || (int)ni != nargs)) return NULL;
  Value *t = tuple_new((size_t)(nargs + n));
  for (int i = 0; t && i < nargs + n; i++) {
    Value *s = i >= nargs ? pspec_from_args(0, NULL) : val_incref(one ? in : is[i]);
    if (!s) {
      for (; i < nargs + n; i++) tuple_set_steal(t, (size_t)i, val_incref(VAL_NONE));
      val_decref(t);
      return NULL;
    }
    tuple_set_steal(t, (size_t)i, s);
  }
  return t;
}

/* Calls [f] on [a] and the [n] values [caps] as its inputs. */
static Value *call_lifted(ShardFn *f, const CallArgs *a, Value **caps, int n) {
  Value *in = lifted_in_specs(f, a->nargs, n);
  if (!in) return err_occurred() ? NULL : LIFT_NONE;
  LiftCall *l = shm_calloc(1, sizeof *l);
  Value **args = shm_calloc((size_t)(a->nargs + n) + 1, sizeof(Value *));
  Value *body = NULL, *w = NULL, *r = NULL;
  if (!l || !args) {
    shm_free(l);
    err_nomem();
    goto out;
  }
  val_init(&l->base.hdr, V_OPAQUE);
  l->base.ot = &liftcall_type;
  l->body = val_incref(f->body);
  for (; l->n < n; l->n++) l->caps[l->n] = val_incref(caps[l->n]);
  body = bound_new(f->name, lift_body, &l->base.hdr);
  val_decref(&l->base.hdr);
  w = body ? shardmap_new(f->name, body, &f->mesh->hdr, in,
                          f->out_tree ? f->out_tree : f->out_specs, f->check_rep)
           : NULL;
  if (!w) goto out;
  ((ShardFn *)w)->auto_axes = f->auto_axes;
  ((ShardFn *)w)->internal = true;
  ((ShardFn *)w)->traceable = !f->internal || f->traceable;
  ((ShardFn *)w)->jit_run = f->jit_run;
  if (!(((ShardFn *)w)->arg_labels = shardmap_arg_labels(f, 0, a->nargs, n)))
    err_clear();   /* out of memory: the messages say "argument i" */
  memcpy(args, a->args, sizeof(Value *) * (size_t)a->nargs);
  memcpy(args + a->nargs, caps, sizeof(Value *) * (size_t)n);
  CallArgs c = {a->nargs + n, args, 0, NULL, NULL};
  r = shardmap_call(w, &c);
out:
  shm_free(args);
  if (w) val_decref(w);
  if (body) val_decref(body);
  val_decref(in);
  return r;
}

/* The tracers the body reaches, not those of [skip] ([nskip]), into
 * [found] (LIFT_MAX); false when there are more. */
static bool scan_body(const ShardFn *f, Value *const *skip, int nskip, Value **found, int *n) {
  Scan s = {.found = found, .cap = LIFT_MAX, .skip = skip, .nskip = nskip};
  scan_value(&s, f->body);
  *n = s.n;
  return !s.overflow;
}

int shardmap_whole_closures(const ShardFn *f) {
  if (!atomic_load_explicit(&arr_partial_live, memory_order_relaxed)) return 0;
  Scan s = {.partial = true};
  scan_value(&s, f->body);
  return s.failed ? -1 : 0;
}

/*
 * A scope that holds what it passes as arguments (a function's
 * parameters) passes them again, whole, as the body may use them so; when
 * that makes too many, the arguments' own tracers are left out (the body
 * sees them as its arguments' blocks).  A body that reaches more than
 * LIFT_MAX values even then, or one through an object's attribute, meets
 * a value of another thread's trace on its devices, which the trace
 * reports as an error.
 */
Value *shardmap_lift_call(ShardFn *f, const CallArgs *a) {
  BoundMethod *b = (BoundMethod *)f->body;
  if (a->nkw || (f->body->type == V_BOUND && b->fn == lift_body)) return LIFT_NONE;
  Value *found[LIFT_MAX];
  int n;
  if (scan_body(f, NULL, 0, found, &n)) return n ? call_lifted(f, a, found, n) : LIFT_NONE;
  Value **mine = shm_malloc(sizeof(Value *) * SHARDMAP_MAX_ARGS);
  if (!mine) return err_nomem();
  Scan args = {.found = mine, .cap = SHARDMAP_MAX_ARGS};
  scan_items(&args, a->args, (size_t)a->nargs);
  bool fits = !args.overflow && scan_body(f, mine, args.n, found, &n);
  Value *r = fits && n ? call_lifted(f, a, found, n) : LIFT_NONE;
  shm_free(mine);
  return r;
}
