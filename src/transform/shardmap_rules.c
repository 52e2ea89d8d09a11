/*
 * shardmap_rules.c - the rules of shard_map (higher.h), side by side: how
 * the compiled executor prepares and runs its equation (jit), that dead
 * code elimination must keep it, its JVP and partial evaluation (grad:
 * jvp_call, and the transpose of the equation a linearized call records)
 * and its batching (vmap: batch_call).  jit.c stages shard_map equations;
 * shardmap.c's call machinery hands a call on values being differentiated
 * or batched to ad.c, which dispatches to this row's jvp_call or
 * batch_call by the innermost trace among the arguments.
 *
 * Semantics: JAX's shard_map_p (the body on every device of the mesh,
 * operands split by in_specs and results assembled by out_specs, an
 * effect the compiler keeps since every device must meet every
 * collective) and its JVP, partial evaluation, transpose and batching
 * rules (experimental/shard_map.py).
 */
#include <pthread.h>
#include <string.h>

#include "base/mem.h"
#include "lang/ops.h"
#include "lang/pytree.h"
#include "spmd/collective.h"
#include "spmd/shardmap.h"
#include "spmd/sharding.h"
#include "transform/ad_impl.h"
#include "transform/batch.h"
#include "transform/compile_impl.h"
#include "transform/higher.h"
#include "transform/jit.h"
#include "transform/trace.h"

/* ==== helpers ======================================================================= */


static bool is_jvp_of(Value *v, unsigned id) {
  return IS_JVP_TRACER(v) && ((Tracer *)v)->trace_id == id;
}

static bool is_batch_of(Value *v, unsigned id) {
  return IS_BATCH_TRACER(v) && ((Tracer *)v)->trace_id == id;
}

static bool array_leaf(Value *v) { return ops_is_array(v); }

/* Whether [v] is, or a JVP tracer's primal or tangent within it holds, a
 * batch tracer (a vmap around the differentiation). */
static bool holds_batched(const Value *v) {
  if (IS_BATCH_TRACER(v)) return true;
  if (!IS_JVP_TRACER(v)) return false;
  const Tracer *t = (const Tracer *)v;
  return holds_batched(t->primal) || holds_batched(t->tangent);
}

/* ==== jit: the compiled step ======================================================== */

/* The replication error's explanation for [f] (a ShardFn) running the
 * compiled [body], whose blocks record none: the plan's reason for each
 * result (plan_vma_whys) and where the traced body returned.  0, or -1
 * on out of memory. */
static int body_whys(Value *fv, const Plan *body) {
  ShardFn *f = (ShardFn *)fv;
  VmaWhy *why = shm_calloc((size_t)body->nvars + 1, sizeof(VmaWhy));
  if (!why || !(f->out_why = shm_calloc((size_t)body->nout + 1, sizeof(VmaWhy)))) {
    shm_free(why);
    return err_nomem(), -1;
  }
  plan_vma_whys(body, why);
  for (int k = 0; k < body->nout; k++)
    if (body->outs[k].var >= 0) f->out_why[k] = why[body->outs[k].var];
  shm_free(why);
  if (body->ret.src) {
    src_incref(body->ret.src);
    f->ret = body->ret;
  }
  return 0;
}

/* A ShardFn running the compiled body of shard_map equation [q] (a new
 * reference, named [name]), or NULL with the error set.  [internal]: a
 * jit that does not partition runs the staged body replicated along the
 * automatic axes (its arguments are unsharded). */
static Value *eqn_shard_fn(const PlanEqn *q, const char *name, bool internal) {
  Plan *body = cmp_param_plan(q, "jaxpr");
  Value *mesh = params_get(&q->params, "mesh"), *ins = params_get(&q->params, "in_specs");
  Value *outs = params_get(&q->params, "out_specs"), *cr = params_get(&q->params, "check_rep");
  if (!body || !mesh || !ins || !outs || cmp_compile(body) < 0) return NULL;
  bool check = cr && IS_ARRAY(cr) && arr_get_i64(AS_ARRAY(cr), 0);
  /* the printed out_specs is a tuple; one result is one array */
  if (outs->type == V_TUPLE && tuple_len(outs) == 1 && body->nout == 1) outs = tuple_get(outs, 0);
  Value *f = shardmap_new(name, &body->hdr, mesh, ins, outs, check);
  Value *manual = params_get(&q->params, "manual_axes");
  if (f && manual && shardmap_set_manual(f, manual, NULL) < 0) goto fail;
  if (f) ((ShardFn *)f)->internal = internal;
  if (f && body->in_labels && (int)tuple_len(body->in_labels) == body->nin)
    ((ShardFn *)f)->arg_labels = val_incref(body->in_labels);   /* messages name them */
  if (f && check && body_whys(f, body) < 0) goto fail;
  return f;
fail:
  val_decref(f);
  return NULL;
}

/* A ShardFn running the compiled body, kept as the step's own:
 * shardmap.c's call machinery then runs one plan on every device. */
static int prepare_shard_map(Exec *e, Step *s, const Plan *p) {
  (void)e;
  s->own = eqn_shard_fn(s->eqn, p->name ? p->name : "shard_map", true);
  return s->own ? 0 : -1;
}

/* The equation evaluated as an eager call runs it (xmap_eval_plan: a jit
 * whose shard_maps' meshes differ, part_meshes_differ): its arguments
 * laid out as they are, its results as its out_specs say. */
static Value *eval_shard_map(const PlanEqn *q, Value **in) {
  Value *f = eqn_shard_fn(q, "shard_map", false);
  if (!f) return NULL;
  CallArgs a = {.nargs = q->nin, .args = in};
  Value *r = shardmap_call(f, &a);
  val_decref(f);
  if (!r || r->type == V_TUPLE) return r;
  Value *t = tuple_pack(1, &r);
  val_decref(r);
  return t;
}

static int run_shard_map(Step *s, Workspace *w) {
  CallArgs a = {.nargs = s->nin, .args = cmp_step_values(s, w)};
  Value *r = shardmap_call(s->own, &a);
  if (!r) return -1;
  for (int k = 0; k < s->nout; k++) {
    Value *x = r->type == V_TUPLE ? tuple_get(r, (size_t)k) : r;
    if (w->slot[s->out[k]]) cmp_copy_into(w->slot[s->out[k]], AS_ARRAY(x));
    else if (cmp_adopt(s, w, k, AS_ARRAY(x)) < 0) {
      val_decref(r);
      return -1;
    }
  }
  val_decref(r);
  return 0;
}

/* ==== grad: JVP, partial evaluation and transpose ================================== */

/*
 * A shard_map call on values being differentiated differentiates its body
 * on every device, with the collectives' rules, as JAX's shard_map JVP
 * and partial evaluation rules do.  Forward mode calls a shard_map of the
 * body's jvp on (primals, tangents).  Reverse mode calls a shard_map that
 * linearizes the body on each device, keeping each device's linear plan
 * and residuals, and records one shard_map equation in the caller's
 * linear trace; its transpose rule calls a shard_map of the devices'
 * backward passes on the results' cotangents.
 */
typedef struct SmCall {
  Opaque base;
  ShardFn *f;              /* the user's (a reference) */
  int nargs, ndiff;
  bool *diff;              /* owned: the arguments being differentiated */
  int ndev;
  bool single;             /* the body returns one array (rank 0 tells) */
  int nout;                /* results (rank 0 tells) */
  AVal *out_avals;         /* owned: the global results' (reverse mode) */
  Plan **plans;            /* reverse: each device's linear plan */
  Value ***caps;           /* and its residuals */
  int *ncaps;
  /* Staged (under jit): one traced body for every device, whose residuals
   * leave the forward shard_map as extra results, a leading axis over all
   * devices (P(mesh axes)), and enter the backward one the same way, as
   * JAX's shard_map partial evaluation passes them. */
  bool staged;
  bool nested;             /* called on a device inside another shard_map's body:
                              this device's own call, which it alone runs */
  bool autorun;            /* an eager call of a partial-manual shard_map: its
                              shard_maps run through the partitioned jit
                              (shardmap_run_auto), reverse mode staged as under
                              jit; cleared when that jit cannot run the body */
  bool laid;               /* autorun, and an argument had a NamedSharding: the
                              partitioned jit ran the forward pass */
  bool jitted;             /* eager, the primals differentiated again (grad of
                              grad): staged as under jit, the shard_maps it calls
                              run through the jit (ShardFn.jit_run), so the outer
                              derivative is built in jit's order */
  bool declined;           /* jitted, and a device ran the forward body itself
                              (that jit could not trace it): linearized again
                              instead (remat) */
  ShardFn *fwd;            /* the forward shard_map (its out_specs grow) */
  bool fwd_specs;          /* fwd's out_specs were taken from the body's result */
  Value *told;             /* (single, nout), as the first device of this process
                              recorded them; under mpirun a process without a
                              device of the mesh gets them from another one */
  int nres;
  Value **res_globals;     /* the residuals, global values of the jit trace */
  Value *res_specs;        /* the forward's out_specs: results', then residuals' */
  /* Batched primals (vmap outside the differentiation): the forward pass
   * runs each device's body under a vmap of its own, whose batch trace
   * ends with the call, so its residuals cannot reach the backward pass.
   * The backward shard_map then linearizes the body again on the primals
   * (kept here) and transposes it in the same call, under the same vmap.
   * So do primals differentiated again eagerly whose body the jit cannot
   * trace (jitted, then declined), and, eagerly and under jit alike,
   * primals of an outer differentiation that a vmap batches (vmap of grad
   * of grad: sm_reverse). */
  Value **remat;           /* owned: the primal arguments, or NULL */
} SmCall;

static Value *specs_tuple(Value *specs, int n, int times);
static void fwd_out_specs(SmCall *c, int times);

static void smcall_free(Value *v) {
  SmCall *c = (SmCall *)v;
  if (c->remat) ad_values_free(c->remat, c->nargs);
  if (c->told) val_decref(c->told);
  for (int i = 0; c->res_globals && i < c->nres; i++)
    if (c->res_globals[i]) val_decref(c->res_globals[i]);
  shm_free(c->res_globals);
  shm_free(c->diff);
  shm_free(c->out_avals);
  if (c->res_specs) val_decref(c->res_specs);
  for (int r = 0; c->plans && r < c->ndev; r++) {
    if (c->plans[r]) val_decref(&c->plans[r]->hdr);
    trace_caps_free(c->caps[r], c->ncaps[r]);
  }
  shm_free(c->plans);
  shm_free(c->caps);
  shm_free(c->ncaps);
  val_decref(&c->f->hdr);
}

static Value *smcall_repr(Value *v) {
  return str_printf("<differentiated shard_map %s>", ((SmCall *)v)->f->name);
}

static const OpaqueType smcall_type = {"differentiated shard_map", smcall_free, smcall_repr, NULL, NULL, NULL, NULL};

/* The body's results on one device as leaves: the tuple's items or the
 * one array; the first device of this process records which (under
 * mpirun device 0 may run elsewhere); a nested call's device, its own. */
static int body_results(SmCall *c, Value *res, Value *const **items, size_t *n) {
  bool single = !val_seq(res, n, items) || res->type != V_TUPLE;
  if (single) *items = NULL, *n = 1;
  if (*n > SHARDMAP_MAX_ARGS) {
    err_set(ERR_VALUE, "shard_map: at most %d results can be differentiated", SHARDMAP_MAX_ARGS);
    return -1;
  }
  DevCtx *d = dev_ctx();
  if (c->nested) {
    c->single = single, c->nout = (int)*n;
  } else if (d && coll_first_local(d)) {
    c->single = single, c->nout = (int)*n;
    Value *one = c->told ? NULL : arr_python_int(single);
    Value *count = one ? arr_python_int((int64_t)*n) : NULL;
    Value *pair[2] = {one, count};
    if (count) c->told = tuple_pack(2, pair);
    if (one) val_decref(one);
    if (count) val_decref(count);
  }
  return 0;
}

/* The body's arguments on one device: differentiated blocks wrapped into
 * JVP tracers of [j] with tangents from [tan] (or new inputs of [lin]). */
static int wrap_blocks(SmCall *c, JvpTrace *j, Trace *lin, Value **blocks, Value **tan,
                       Value **args) {
  int k = 0;
  for (int i = 0; i < c->nargs; i++) {
    if (!c->diff[i]) {
      args[i] = val_incref(blocks[i]);
      continue;
    }
    AVal a;
    Value *t = NULL;
    if (ops_aval(blocks[i], &a) == 0)
      t = lin ? trace_new_arg(lin, &a, NULL) : val_incref(tan[k++]);
    if (!t || !(args[i] = ad_jvp_tracer(j->id, val_incref(blocks[i]), t))) {
      ad_values_free_n(args, i);
      return -1;
    }
  }
  return 0;
}

/* Forward mode on one device: (x blocks..., t blocks...) -> (primals...,
 * tangents...). */
static Value *sm_jvp_body(Value *self, const CallArgs *a) {
  SmCall *c = (SmCall *)self;
  Value *args[SHARDMAP_MAX_ARGS], *res = NULL, *r = NULL;
  JvpTrace j;
  ad_jvp_push(&j, NULL);
  if (wrap_blocks(c, &j, NULL, a->args, a->args + c->nargs, args) == 0) {
    res = val_call_n(c->f->body, c->nargs, args);
    for (int i = 0; i < c->nargs; i++) val_decref(args[i]);
  }
  ad_jvp_pop(&j);
  Value *const *items;
  size_t n;
  if (!res || body_results(c, res, &items, &n) < 0) goto out;
  fwd_out_specs(c, 2);
  Value *outs = tuple_new(2 * n);
  for (size_t k = 0; outs && k < n; k++) {
    Value *o = items ? items[k] : res;
    Value *p = ad_primal_of(o, j.id), *t = ad_tangent_of(o, j.id);
    tuple_set_steal(outs, k, p);
    tuple_set_steal(outs, n + k, t ? t : val_incref(VAL_NONE));
    if (!t) {
      val_decref(outs);
      outs = NULL;
    }
  }
  r = outs;
out:
  if (res) val_decref(res);
  return r;
}

/* A residual block with a leading axis of 1 (staged: one row per device
 * of the residual's global value), or without it again. */
static Value *residual_row(Value *x, bool add) {
  AVal a;
  if (prim_value_aval(x, &a) < 0) return NULL;
  int64_t sh[SHM_MAXDIM + 1];
  int nd = add ? a.ndim + 1 : a.ndim - 1;
  for (int i = 0; i < nd; i++) sh[i] = add ? (i ? a.shape[i - 1] : 1) : a.shape[i + 1];
  Params p;
  params_init(&p);
  params_add(&p, "new_sizes", val_int_tuple(nd, sh));
  params_add(&p, "dimensions", val_incref(VAL_NONE));
  return prim_apply_rule(P_RESHAPE, 1, &x, &p);
}

/* The spec of a residual's row: its leading axis split over the mesh axes
 * the residual varies over (so each device's block keeps its replication
 * type), P(None) when it varies over none. */
static Value *residual_spec(SmCall *c, Value *res) {
  AVal a;
  if (prim_value_aval(res, &a) < 0) return NULL;
  a.vma &= ~c->f->auto_axes;   /* nested: the enclosing body's manual axes stay its own */
  int n = 0;
  for (int i = 0; i < c->f->mesh->naxes; i++) n += (a.vma >> i) & 1u;
  Value *names = n ? tuple_new((size_t)n) : val_incref(VAL_NONE);
  for (int i = 0, k = 0; n && names && i < c->f->mesh->naxes; i++)
    if ((a.vma >> i) & 1u) tuple_set_steal(names, (size_t)k++, str_from(c->f->mesh->axis_names[i]));
  Value *s = names ? pspec_from_args(1, &names) : NULL;
  if (names) val_decref(names);
  return s;
}

/* Staged: the primal results [r] ([n] of them) and then the residuals,
 * a row each; the forward shard_map's out_specs become the results'
 * specs and each residual's row spec. */
static Value *with_residuals(SmCall *c, Value *r, size_t n) {
  int k = c->ncaps[0];
  Value *t = tuple_new(n + (size_t)k);
  Value *specs = tuple_new(n + (size_t)k);
  bool ok = t && specs;
  for (size_t i = 0; ok && i < n; i++) {
    tuple_set_steal(t, i, val_incref(c->single ? r : tuple_get(r, i)));
    tuple_set_steal(specs, i, val_incref(&shardmap_out_spec(c->f, (int)i)->hdr));
  }
  for (int i = 0; ok && i < k; i++) {
    Value *row = residual_row(c->caps[0][i], true), *rs = residual_spec(c, c->caps[0][i]);
    tuple_set_steal(t, n + (size_t)i, row ? row : val_incref(VAL_NONE));
    tuple_set_steal(specs, n + (size_t)i, rs ? rs : val_incref(VAL_NONE));
    ok = row && rs;
  }
  if (ok) {
    val_decref(c->fwd->out_specs);
    c->fwd->out_specs = val_incref(specs);
    if (c->res_specs) val_decref(c->res_specs);
    c->res_specs = val_incref(specs);
  }
  if (specs) val_decref(specs);
  if (!ok && t) {
    for (size_t i = 0; i < n + (size_t)k; i++)
      if (!tuple_get(t, i)) tuple_set_steal(t, i, val_incref(VAL_NONE));
    val_decref(t);
    t = NULL;
  }
  return t;
}

/* Linearizes the body on one device's argument [blocks]: the primal
 * results as the body gives them (JVP tracers stripped), its linear plan
 * and residuals in [*plan], [*caps], [*ncaps] (owned by the caller), the
 * number of results in [*n]; NULL with the error set. */
static Value *sm_linearize(SmCall *c, Value **blocks, Plan **plan, Value ***caps, int *ncaps,
                           size_t *n) {
  Value *args[SHARDMAP_MAX_ARGS], *res = NULL, *r = NULL, *tans[SHARDMAP_MAX_ARGS] = {0};
  Trace *lt = trace_begin_linear(c->f->name);
  if (!lt) return NULL;
  JvpTrace j;
  ad_jvp_push(&j, lt);
  if (wrap_blocks(c, &j, lt, blocks, NULL, args) == 0) {
    res = val_call_n(c->f->body, c->nargs, args);
    for (int i = 0; i < c->nargs; i++) val_decref(args[i]);
  }
  ad_jvp_pop(&j);
  Value *const *items;
  size_t k = 0;
  *n = 0;
  if (!res || body_results(c, res, &items, n) < 0) goto fail;
  for (; k < *n; k++)
    if (!(tans[k] = ad_tangent_of(items ? items[k] : res, j.id))) goto fail;
  *plan = trace_end(lt, (int)*n, tans, caps, ncaps);
  lt = NULL;
  if (*plan) r = ad_strip(res, j.id);
fail:
  for (size_t i = 0; i < k; i++) val_decref(tans[i]);
  if (lt) trace_abort(lt);
  if (res) val_decref(res);
  return r;
}

/* The forward shard_map's out_specs once the body ran on a device: the
 * user's call's, which a pytree call's wrapper sets from the body's first
 * result (a spec of the prefix covering a subtree: (P(), P()) for
 * ((a, b), c)), [times] over (primals, then tangents).  Every device
 * calls it; the first sets them. */
static void fwd_out_specs(SmCall *c, int times) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  Value *out = c->f->out_specs;
  if (out->type == V_PSPEC || !c->fwd) return;
  pthread_mutex_lock(&lock);
  Value *specs = c->fwd_specs ? NULL : specs_tuple(out, (int)tuple_len(out), times);
  if (specs) {
    val_decref(c->fwd->out_specs);
    c->fwd->out_specs = specs;
    c->fwd_specs = true;
  }
  pthread_mutex_unlock(&lock);
}

/* Reverse mode on one device: linearizes the body; returns the primal
 * results as the body does and keeps the linear plan and residuals. */
static Value *sm_lin_body(Value *self, const CallArgs *a) {
  SmCall *c = (SmCall *)self;
  DevCtx *d = dev_ctx();
  if (c->jitted && d && d->mesh && !prim_tracing()) {   /* one trace for all devices */
    c->declined = true;
    return err_set(ERR_NOT_IMPLEMENTED, "%s(): a staged forward pass run on a device",
                   c->f->name);
  }
  /* staged, its forward call over: an outer call running the body forward
   * again (SmCall.remat) would trace a second plan (sm_reverse linearizes
   * such primals again instead; kept against a path that does not) */
  if (c->staged && !c->fwd)
    return err_set(ERR_NOT_IMPLEMENTED, "%s(): the forward body of a staged reverse-mode "
                   "shard_map call run again after the call", c->f->name);
  int rank = d && !c->staged ? d->rank : 0;
  size_t n;
  Value *r = sm_linearize(c, a->args, &c->plans[rank], &c->caps[rank], &c->ncaps[rank], &n);
  if (r && !c->staged) fwd_out_specs(c, 1);
  if (r && c->staged) {
    Value *all = with_residuals(c, r, n);
    val_decref(r);
    r = all;
  }
  return r;
}

/* The backward pass on one device: result cotangent blocks -> the
 * differentiated arguments' cotangent blocks (a tuple). */
static Value *sm_back_body(Value *self, const CallArgs *a) {
  SmCall *c = (SmCall *)self;
  DevCtx *d = dev_ctx();
  int rank = d && !c->staged ? d->rank : 0;
  Value *res[2 * SHARDMAP_MAX_ARGS];
  int nres = c->staged ? a->nargs - c->nout : 0, made = 0;
  for (; made < nres; made++)   /* staged: the residual rows, as blocks */
    if (!(res[made] = residual_row(a->args[c->nout + made], false))) {
      ad_values_free_n(res, made);
      return NULL;
    }
  Lin lin = {NULL, NULL, c->plans[rank], c->staged ? res : c->caps[rank],
             c->staged ? nres : c->ncaps[rank], c->nout, true};
  Value **cts = ad_backward(&lin, a->args);
  ad_values_free_n(res, made);
  if (!cts) return NULL;
  Value *t = tuple_pack((size_t)c->ndiff, cts);
  ad_values_free(cts, c->ndiff);
  return t;
}

/* The backward pass on one device from the primals: (argument blocks...,
 * result cotangent blocks...) -> the differentiated arguments' cotangent
 * blocks (a tuple); the body is linearized again here (SmCall.remat). */
static Value *sm_remat_body(Value *self, const CallArgs *a) {
  SmCall *c = (SmCall *)self;
  Lin lin = {0};
  size_t n;
  Value *r = NULL, *res = sm_linearize(c, a->args, &lin.plan, &lin.caps, &lin.ncap, &n);
  lin.nout = (int)n;
  lin.shard_out = true;
  Value **cts = res ? ad_backward(&lin, a->args + c->nargs) : NULL;
  if (res) val_decref(res);
  if (cts) {
    r = tuple_pack((size_t)c->ndiff, cts);
    ad_values_free(cts, c->ndiff);
  }
  ad_lin_free(&lin);
  return r;
}

/* A tuple of [n] specs: [one] repeated, or the items of [specs] (repeated
 * [times] times). */
static Value *specs_tuple(Value *specs, int n, int times) {
  Value *t = tuple_new((size_t)(n * times));
  for (int r = 0; t && r < times; r++)
    for (int k = 0; k < n; k++)
      tuple_set_steal(t, (size_t)(r * n + k),
                      val_incref(specs->type == V_PSPEC ? specs : tuple_get(specs, (size_t)k)));
  return t;
}

static Value *sm_lin_body(Value *self, const CallArgs *a);
static Value *sm_jvp_body(Value *self, const CallArgs *a);

/* The slots of what a differentiated shard_map's devices record: its
 * (single, nout), and what the body it differentiates records. */
static int sm_shared(Value *body, Value ***slots, int cap) {
  BoundMethod *b = (BoundMethod *)body;
  if (body->type != V_BOUND || (b->fn != sm_lin_body && b->fn != sm_jvp_body) || cap < 1)
    return 0;
  SmCall *c = (SmCall *)b->self;
  slots[0] = &c->told;
  return 1 + shardmap_shared_slots(c->f->body, slots + 1, cap - 1);
}

/* shardmap_settle for a differentiated shard_map's body: on a process
 * without a device of the mesh, the forward call's out_specs as its
 * devices would have set them (fwd_out_specs), once the body it
 * differentiates has settled its own. */
static int sm_settle(Value *body) {
  BoundMethod *b = (BoundMethod *)body;
  if (body->type != V_BOUND || (b->fn != sm_lin_body && b->fn != sm_jvp_body)) return 0;
  SmCall *c = (SmCall *)b->self;
  if (shardmap_settle(c->f->body) < 0) return -1;
  if (b->fn == sm_jvp_body) fwd_out_specs(c, 2);
  else if (!c->staged) fwd_out_specs(c, 1);
  return 0;
}

/* Whether an eager transformed call of [f] may run through the
 * partitioned jit: a partial-manual shard_map of the user's, or one made
 * for a call of it whose body traces as the user's does. */
static bool sm_traceable(const ShardFn *f) {
  return (f->auto_axes && (!f->internal || f->traceable)) || f->jit_run;
}

/* [c] unstaged again: its forward call's residuals, recorded results and
 * plans dropped. */
static void sm_unstage(SmCall *c) {
  c->staged = false;
  c->fwd_specs = false;
  if (c->res_specs) val_decref(c->res_specs);
  c->res_specs = NULL;
  if (c->told) val_decref(c->told);
  c->told = NULL;
  for (int k = 0; c->plans && k < c->ndev; k++) {
    if (c->plans[k]) val_decref(&c->plans[k]->hdr);
    trace_caps_free(c->caps[k], c->ncaps[k]);
    c->plans[k] = NULL, c->caps[k] = NULL, c->ncaps[k] = 0;
  }
}

/* An eager call [sf] of [c]'s through the partitioned jit, as under jit:
 * the forward pass of reverse mode ([lin]) staged, its residuals leaving
 * as results.  NULL with no error when that jit cannot run it: [c] then
 * runs as before the attempt, replicated along the automatic axes (a
 * body's Python side effects run again, as an eager call's do); a staged
 * backward pass (jax.disable_jit around the vjp function) runs on each
 * device from the same plan and residual rows. */
static Value *sm_run_auto(SmCall *c, bool lin, Value *sf, const CallArgs *a) {
  Value *specs = val_incref(((ShardFn *)sf)->out_specs);
  if (lin) c->staged = true;
  Value *r = shardmap_run_auto(sf, a);
  if (!r && !err_occurred()) c->autorun = false;
  if (!r && !err_occurred() && lin) {   /* unstaged again */
    sm_unstage(c);
    val_decref(((ShardFn *)sf)->out_specs);
    ((ShardFn *)sf)->out_specs = val_incref(specs);
  }
  val_decref(specs);
  return r;
}

/* Calls a shard_map of [body] (a method of [c]) over [c]'s mesh; the
 * staged forward one is [c]->fwd while it runs (its body sets its
 * out_specs). */
static Value *sm_run(SmCall *c, MethodFn body, Value *in_specs, Value *out_specs, int n,
                     Value **args) {
  Value *fn = bound_new(c->f->name, body, &c->base.hdr);
  Value *sf = fn && in_specs && out_specs
                  ? shardmap_new(c->f->name, fn, &c->f->mesh->hdr, in_specs, out_specs,
                                 c->f->check_rep)
                  : NULL;
  Value *r = NULL;
  if (sf) {
    ((ShardFn *)sf)->auto_axes = c->f->auto_axes;
    ((ShardFn *)sf)->internal = true;
    /* every body but the backward one takes the call's arguments first */
    if (body != sm_back_body && !(((ShardFn *)sf)->arg_labels = shardmap_arg_labels(c->f, 0, c->nargs, 0)))
      err_clear();   /* out of memory: the messages say "argument i" */
    /* a body that keeps nothing per device outside its trace: a
     * transformation of this call (vmap, grad of grad) may partition it */
    ((ShardFn *)sf)->traceable = sm_traceable(c->f) && !c->nested &&
                                 (body == sm_jvp_body || body == sm_remat_body);
    ((ShardFn *)sf)->jit_run = c->jitted || (c->f->jit_run && !c->nested);
    CallArgs ca = {n, args, 0, NULL, NULL};
    if (body == sm_lin_body || body == sm_jvp_body) c->fwd = (ShardFn *)sf;
    c->fwd_specs = false;
    if (c->autorun) r = sm_run_auto(c, body == sm_lin_body, sf, &ca);
    if (!r && !err_occurred()) r = shardmap_call(sf, &ca);
    c->fwd = NULL;
    if (c->told) {   /* what this process's devices, or another process's, saw */
      c->single = arr_get_i64((Array *)tuple_get(c->told, 0), 0) != 0;
      c->nout = (int)arr_get_i64((Array *)tuple_get(c->told, 1), 0);
      val_decref(c->told);
      c->told = NULL;
    }
    val_decref(sf);
  }
  if (fn) val_decref(fn);
  if (in_specs) val_decref(in_specs);
  if (out_specs) val_decref(out_specs);
  return r;
}

/* The innermost JVP trace among the arguments (one of this thread). */
static JvpTrace *args_trace(const CallArgs *a) {
  unsigned id = 0;
  for (int i = 0; i < a->nargs; i++)
    if (IS_JVP_TRACER(a->args[i]) && ((Tracer *)a->args[i])->trace_id > id)
      id = ((Tracer *)a->args[i])->trace_id;
  return ad_jvp_find(id);
}

/* The results as the body gave them: one value, or a tuple of [vals]. */
static Value *sm_results(SmCall *c, Value **vals) {
  return c->single ? val_incref(vals[0]) : tuple_pack((size_t)c->nout, vals);
}

static Value *sm_forward(SmCall *c, JvpTrace *j, const CallArgs *a) {
  Value *args[2 * SHARDMAP_MAX_ARGS];
  int k = 0;
  for (int i = 0; i < c->nargs; i++) args[i] = ad_primal_of(a->args[i], j->id);
  for (int i = 0; i < c->nargs; i++)
    if (c->diff[i]) args[c->nargs + k++] = val_incref(((Tracer *)a->args[i])->tangent);
  Value *in = specs_tuple(c->f->in_specs, c->nargs, 1);
  if (in && c->ndiff) {   /* the tangents' specs after the primals' */
    Value *all = tuple_new((size_t)(c->nargs + c->ndiff));
    for (int i = 0, m = 0; all && i < c->nargs; i++) {
      tuple_set_steal(all, (size_t)i, val_incref(tuple_get(in, (size_t)i)));
      if (c->diff[i]) tuple_set_steal(all, (size_t)(c->nargs + m++), val_incref(tuple_get(in, (size_t)i)));
    }
    val_decref(in);
    in = all;
  }
  Value *out_specs = c->f->out_specs->type == V_PSPEC
                         ? val_incref(c->f->out_specs)
                         : specs_tuple(c->f->out_specs, (int)tuple_len(c->f->out_specs), 2);
  Value *res = sm_run(c, sm_jvp_body, in, out_specs, c->nargs + c->ndiff, args);
  ad_values_free_n(args, c->nargs + c->ndiff);
  if (!res) return NULL;
  Value *vals[SHARDMAP_MAX_ARGS];
  int n = c->nout;
  for (int k2 = 0; k2 < n; k2++) {
    Value *p = tuple_get(res, (size_t)k2), *t = tuple_get(res, (size_t)(n + k2));
    AVal pa;
    vals[k2] = ops_aval(p, &pa) == 0 && dt_is_float(pa.dtype)
                   ? ad_jvp_tracer(j->id, val_incref(p), val_incref(t)) : val_incref(p);
  }
  val_decref(res);
  Value *r = sm_results(c, vals);
  ad_values_free_n(vals, n);
  return r;
}

static Value *sm_reverse(SmCall *c, JvpTrace *j, const CallArgs *a) {
  Value *args[SHARDMAP_MAX_ARGS], *tans[2 * SHARDMAP_MAX_ARGS];
  int k = 0;
  for (int i = 0; i < c->nargs; i++) {
    args[i] = ad_primal_of(a->args[i], j->id);
    if (c->diff[i]) tans[k++] = ((Tracer *)a->args[i])->tangent;
  }
  /* Primals of an outer transformation (batched, or differentiated again
   * eagerly): each device's residuals would be tracers of a trace that
   * ends with the forward call, so the backward pass linearizes again
   * (staged, the residuals leave the forward call as results instead;
   * an eager outer differentiation stages it too, below).  Primals of an
   * outer differentiation that a vmap batches (vmap of grad of grad) are
   * linearized again eagerly and under jit alike: the outer call's
   * backward pass, batched, runs its forward body, this call's forward
   * shard_map, again, which a staged call would trace a second time. */
  bool outer = false, batched = false;
  for (int i = 0; i < c->nargs; i++) batched |= holds_batched(args[i]);
  for (int i = 0; i < c->nargs; i++)
    outer |= IS_BATCH_TRACER(args[i]) || (IS_JVP_TRACER(args[i]) && (!c->staged || batched));
  if (outer) c->autorun = false;
  for (int i = 0; c->autorun && i < c->nargs; i++) {
    Value *sh = IS_ARRAY(args[i]) ? AS_ARRAY(args[i])->sharding : NULL;
    c->laid |= sh && sharding_is(sh) && ((NamedSharding *)sh)->mesh;
  }
  /* Differentiated again eagerly (grad of grad): staged as under jit,
   * the outer differentiation's shard_maps run through the jit, so the
   * second-order terms are built and summed as jit's one trace does; a
   * body that jit cannot trace is linearized again (remat). */
  c->jitted = outer && !batched && !c->nested && !prim_tracing();
  Value *res = NULL;
  if (c->jitted) {
    c->staged = true;
    c->plans = shm_calloc((size_t)c->ndev, sizeof(Plan *));
    c->caps = shm_calloc((size_t)c->ndev, sizeof(Value **));
    c->ncaps = shm_calloc((size_t)c->ndev, sizeof(int));
    for (int i = 0; i < c->nargs; i++) val_incref(args[i]);
    res = c->plans && c->caps && c->ncaps
              ? sm_run(c, sm_lin_body, specs_tuple(c->f->in_specs, c->nargs, 1),
                       val_incref(c->f->out_specs), c->nargs, args)
              : err_nomem();
    ad_values_free_n(args, c->nargs);
    if (!res && c->declined && err_kind() == ERR_NOT_IMPLEMENTED) {
      err_clear();
      sm_unstage(c);
      c->jitted = false;
    } else {
      outer = false;
    }
  }
  if (c->jitted) {
    ad_values_free_n(args, c->nargs);
  } else if (outer) {   /* the primals move into c->remat; no residuals */
    CallArgs ca = {c->nargs, args, 0, NULL, NULL};
    c->staged = false;
    res = (c->remat = shm_calloc((size_t)c->nargs + 1, sizeof(Value *)))
              ? shardmap_call(&c->f->hdr, &ca) : err_nomem();
    if (c->remat) memcpy(c->remat, args, sizeof(Value *) * (size_t)c->nargs);
    else ad_values_free_n(args, c->nargs);
    if (res) {
      c->single = res->type != V_TUPLE;
      c->nout = c->single ? 1 : (int)tuple_len(res);
    }
  } else {
    c->plans = shm_calloc((size_t)c->ndev, sizeof(Plan *));
    c->caps = shm_calloc((size_t)c->ndev, sizeof(Value **));
    c->ncaps = shm_calloc((size_t)c->ndev, sizeof(int));
    res = c->plans && c->caps && c->ncaps
              ? sm_run(c, sm_lin_body, specs_tuple(c->f->in_specs, c->nargs, 1),
                       val_incref(c->f->out_specs), c->nargs, args)
              : err_nomem();
    ad_values_free_n(args, c->nargs);
  }
  if (!res) return NULL;
  Value *outs[SHARDMAP_MAX_ARGS], *r = NULL, *tup = NULL;
  if (c->staged) {   /* the results, then the residuals */
    c->nres = (int)tuple_len(res) - c->nout;
    c->res_globals = shm_calloc((size_t)c->nres + 1, sizeof(Value *));
    if (!c->res_globals) {
      val_decref(res);
      return err_nomem();
    }
    for (int i = 0; i < c->nres; i++)
      c->res_globals[i] = val_incref(tuple_get(res, (size_t)(c->nout + i)));
  }
  if (!(c->out_avals = shm_calloc((size_t)c->nout + 1, sizeof(AVal)))) {
    err_nomem();
    goto out;
  }
  for (int m = 0; m < c->nout; m++) {
    outs[m] = c->single && !c->staged ? res : tuple_get(res, (size_t)m);
    if (ops_aval(outs[m], &c->out_avals[m]) < 0) goto out;
    /* a nested call's results still vary over the enclosing body's axes */
    if (!c->nested) c->out_avals[m].vma = 0;
  }
  /* Staged inside another shard_map's body, whose backward pass is traced
   * apart from its forward one: the residuals are operands, which that
   * body's linearization keeps as its own residuals. */
  int nops = c->ndiff;
  if (c->staged && c->nested && c->ndiff + c->nres > 2 * SHARDMAP_MAX_ARGS) {
    err_set(ERR_VALUE, "shard_map: more than %d arguments and residuals to differentiate",
            2 * SHARDMAP_MAX_ARGS);
    goto out;
  }
  if (c->staged && c->nested)
    for (int i = 0; i < c->nres; i++) tans[nops++] = c->res_globals[i];
  Params p;
  params_init(&p);
  params_add(&p, "linearized", val_incref(&c->base.hdr));
  tup = trace_emit(P_SHARD_MAP, &p, nops, tans, c->nout, c->out_avals);
  if (!tup) goto out;
  Value *vals[SHARDMAP_MAX_ARGS];
  for (int m = 0; m < c->nout; m++)
    vals[m] = dt_is_float(c->out_avals[m].dtype)
                  ? ad_jvp_tracer(j->id, val_incref(outs[m]), val_incref(tuple_get(tup, (size_t)m)))
                  : val_incref(outs[m]);
  r = sm_results(c, vals);
  ad_values_free_n(vals, c->nout);
out:
  if (tup) val_decref(tup);
  val_decref(res);
  return r;
}

/* shard_map's jvp_call: a shard_map call on values being differentiated
 * (the innermost tracer among the arguments a JVP tracer). */
static Value *jvp_call_shard_map(Value *fv, const CallArgs *a) {
  ShardFn *f = (ShardFn *)fv;
  /* the rule takes each result as an array: nested results go through
   * the call over leaves, which comes back here */
  if (!shardmap_returns_leaves(f)) return shardmap_call_leaves(fv, a);
  JvpTrace *j = args_trace(a);
  if (!j)
    return err_set(ERR_VALUE, "%s(): an argument is an abstract value of another thread or of "
                              "a finished differentiation", f->name);
  if (a->nkw || a->nargs > SHARDMAP_MAX_ARGS)
    return err_set(ERR_TYPE, "%s() takes at most %d positional arguments", f->name, SHARDMAP_MAX_ARGS);
  for (int i = 0; i < a->nargs; i++)
    if (shardmap_check_arg(f, a, i) < 0) return NULL;
  SmCall *c = shm_calloc(1, sizeof *c);
  if (!c) return err_nomem();
  val_init(&c->base.hdr, V_OPAQUE);
  c->base.ot = &smcall_type;
  c->f = (ShardFn *)val_incref(fv);
  c->nargs = a->nargs;
  c->ndev = f->mesh->size;
  c->staged = prim_tracing();
  DevCtx *d = dev_ctx();
  c->nested = d && d->mesh;
  if (!(c->diff = shm_calloc((size_t)a->nargs + 1, sizeof(bool)))) {
    val_decref(&c->base.hdr);
    return err_nomem();
  }
  for (int i = 0; i < a->nargs; i++) c->ndiff += c->diff[i] = is_jvp_of(a->args[i], j->id);
  c->autorun = sm_traceable(f) && !c->nested && !c->staged;
  Value *r = j->lin ? sm_reverse(c, j, a) : sm_forward(c, j, a);
  val_decref(&c->base.hdr);
  return r;
}

/* The transpose of a shard_map whose primals were batched (SmCall.remat):
 * a shard_map of sm_remat_body on (primals..., cotangents...). */
static int tr_shard_map_remat(SmCall *c, Value **ct, const bool *lin, int nin, Value **cts) {
  Value *args[2 * SHARDMAP_MAX_ARGS];
  int n = 0;
  for (; n < c->nargs; n++) args[n] = val_incref(c->remat[n]);
  for (int m = 0; m < c->nout; m++, n++)
    if (!(args[n] = ct[m] ? val_incref(ct[m]) : prim_zeros(&c->out_avals[m]))) {
      ad_values_free_n(args, n);
      return -1;
    }
  Value *in_specs = tuple_new((size_t)n), *out_specs = tuple_new((size_t)c->ndiff);
  for (int i = 0, k = 0; out_specs && i < c->nargs; i++)
    if (c->diff[i]) tuple_set_steal(out_specs, (size_t)k++, val_incref(&shardmap_in_spec(c->f, i)->hdr));
  for (int i = 0; in_specs && i < c->nargs; i++)
    tuple_set_steal(in_specs, (size_t)i, val_incref(&shardmap_in_spec(c->f, i)->hdr));
  for (int m = 0; in_specs && m < c->nout; m++)
    tuple_set_steal(in_specs, (size_t)(c->nargs + m), val_incref(&shardmap_out_spec(c->f, m)->hdr));
  Value *res = sm_run(c, sm_remat_body, in_specs, out_specs, n, args);
  ad_values_free_n(args, n);
  if (!res) return -1;
  for (int i = 0; i < nin; i++)
    cts[i] = lin[i] ? val_incref(tuple_get(res, (size_t)i)) : NULL;
  val_decref(res);
  return 0;
}

/* An eager cotangent [x] (consumed) of a call whose forward pass the
 * partitioned jit ran ([c]->laid): one without a layout laid out
 * replicated over the mesh, so the backward pass is partitioned too, as
 * the jit of the whole gradient partitions it (else a jit of
 * unsharded arguments would run it whole and give unsharded results). */
static Value *ct_laid(SmCall *c, Value *x) {
  if (!IS_ARRAY(x) || AS_ARRAY(x)->sharding || prim_tracing()) return x;
  Value *spec = pspec_from_args(0, NULL);
  Value *sh = spec ? sharding_new(c->f->mesh, (PSpec *)spec) : NULL;
  Value *r = sh ? sharding_device_put(x, sh) : NULL;
  if (spec) val_decref(spec);
  if (sh) val_decref(sh);
  val_decref(x);
  return r;
}

/* The transpose of a linearized shard_map equation: the devices' backward
 * passes on the results' cotangents, split by the out_specs; the
 * arguments' cotangents assembled by the in_specs. */
static int transpose_shard_map(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                               const Params *p, Value **cts) {
  (void)av;
  Value *cv = params_get(p, "linearized");
  if (!cv || cv->type != V_OPAQUE || ((Opaque *)cv)->ot != &smcall_type)
    return prim_rule_missing(P_SHARD_MAP, "transpose of a staged shard_map");
  SmCall *c = (SmCall *)cv;
  Value *args[2 * SHARDMAP_MAX_ARGS];
  if (c->nout + c->nres > 2 * SHARDMAP_MAX_ARGS) {
    err_set(ERR_VALUE, "shard_map: more than %d results and residuals to transpose",
            2 * SHARDMAP_MAX_ARGS);
    return -1;
  }
  if (c->remat) return tr_shard_map_remat(c, ct, lin, nin, cts);
  for (int m = 0; m < c->nout; m++)
    if (!(args[m] = ct[m] ? val_incref(ct[m]) : prim_zeros(&c->out_avals[m])) ||
        (c->laid && !(args[m] = ct_laid(c, args[m])))) {
      ad_values_free_n(args, m);
      return -1;
    }
  for (int i = 0; i < c->nres; i++) {   /* nested: the operands after the tangents */
    Value *r = c->nested ? (c->ndiff + i < nin && in ? in[c->ndiff + i] : NULL) : c->res_globals[i];
    if (!r) {
      ad_values_free_n(args, c->nout + i);
      return prim_rule_missing(P_SHARD_MAP, "transpose without a nested call's residuals");
    }
    args[c->nout + i] = val_incref(r);
  }
  Value *out_specs = tuple_new((size_t)c->ndiff);
  for (int i = 0, k = 0; out_specs && i < c->nargs; i++)
    if (c->diff[i]) tuple_set_steal(out_specs, (size_t)k++, val_incref(&shardmap_in_spec(c->f, i)->hdr));
  Value *in_specs = tuple_new((size_t)(c->nout + c->nres));
  for (int m = 0; in_specs && m < c->nout; m++)
    tuple_set_steal(in_specs, (size_t)m, val_incref(&shardmap_out_spec(c->f, m)->hdr));
  for (int i = 0; in_specs && i < c->nres; i++)   /* the residuals' rows, as they left */
    tuple_set_steal(in_specs, (size_t)(c->nout + i),
                    val_incref(tuple_get(c->res_specs, (size_t)(c->nout + i))));
  Value *res = sm_run(c, sm_back_body, in_specs, out_specs, c->nout + c->nres, args);
  ad_values_free_n(args, c->nout + c->nres);
  if (!res) return -1;
  for (int i = 0; i < nin; i++)
    cts[i] = lin[i] ? val_incref(tuple_get(res, (size_t)i)) : NULL;
  val_decref(res);
  return 0;
}

/* ==== vmap: shard_map of batched arguments =========================================== */

/* [specs] (one P or a tuple) with None put first in the entries of the
 * batched ones ([batched] NULL: all). */
static Value *specs_batched(Value *specs, int n, const bool *batched) {
  if (specs->type == V_PSPEC && !batched) return pspec_prepend_none((PSpec *)specs);
  Value *t = tuple_new((size_t)n);
  for (int i = 0; t && i < n; i++) {
    PSpec *s = (PSpec *)(specs->type == V_PSPEC ? specs : tuple_get(specs, (size_t)i));
    Value *e = !batched || batched[i] ? pspec_prepend_none(s) : val_incref(&s->hdr);
    tuple_set_steal(t, (size_t)i, e ? e : val_incref(VAL_NONE));
  }
  return t;
}

static Value *batch_result_leaf(Value *v, void *id) {
  return batch_wrap(*(unsigned *)id, v, 0);
}

/*
 * The body of a batched shard_map: the vmap of the body of the shard_map
 * [f] it batches.  [f]'s out_specs may be settled only by its body's
 * first result (a prefix covering subtrees: shardmap_settle), so the
 * batched call [call] takes them, batched, once the first device's vmap
 * returned, and on a process without a device of the mesh when it
 * settles.
 */
typedef struct SmBatch {
  Opaque base;
  Value *vmapped;        /* vmap of f's body (batch_vmap_of) */
  ShardFn *f, *call;     /* borrowed, during the call */
  bool specs;            /* call's out_specs were taken from f's */
  pthread_mutex_t lock;
} SmBatch;

static void smbatch_free(Value *v) {
  SmBatch *b = (SmBatch *)v;
  val_decref(b->vmapped);
  pthread_mutex_destroy(&b->lock);
}

static const OpaqueType smbatch_type = {"batched shard_map", smbatch_free, NULL, NULL, NULL,
                                        NULL, NULL};

/* [b]'s call's out_specs: f's, now settled, batched (once).  A backward
 * pass that runs the body again after the call (SmCall.remat) finds them
 * set. */
static void smbatch_specs(SmBatch *b) {
  pthread_mutex_lock(&b->lock);
  Value *os = b->specs || !b->f ? NULL : b->f->out_specs;
  Value *out = !os ? NULL
                   : specs_batched(os, os->type == V_PSPEC ? 1 : (int)tuple_len(os), NULL);
  if (out) {
    val_decref(b->call->out_specs);
    b->call->out_specs = out;
    b->specs = true;
  }
  pthread_mutex_unlock(&b->lock);
}

static Value *smbatch_body(Value *self, const CallArgs *a) {
  SmBatch *b = (SmBatch *)self;
  Value *r = val_call(b->vmapped, a);
  if (r) smbatch_specs(b);
  return r;
}

/* A new batched shard_map body over [vmapped] (stolen). */
static Value *smbatch_new(const char *name, Value *vmapped) {
  SmBatch *b = shm_calloc(1, sizeof *b);
  if (!b) {
    val_decref(vmapped);
    return err_nomem();
  }
  val_init(&b->base.hdr, V_OPAQUE);
  b->base.ot = &smbatch_type;
  pthread_mutex_init(&b->lock, NULL);
  b->vmapped = vmapped;
  Value *r = bound_new(name, smbatch_body, &b->base.hdr);
  val_decref(&b->base.hdr);
  return r;
}

/* shard_map's batch_call: a shard_map call on batched arguments (the
 * innermost tracer among them a batch tracer): a shard_map of the body's
 * vmap over the same mesh, the batch axis first and unsplit (P(None,
 * ...)); the results batched along it. */
static Value *batch_call_shard_map(Value *fv, const CallArgs *a) {
  ShardFn *f = (ShardFn *)fv;
  unsigned id = 0;
  for (int i = 0; i < a->nargs; i++)
    if (IS_TRACER(a->args[i]) && ((Tracer *)a->args[i])->trace_id > id)
      id = ((Tracer *)a->args[i])->trace_id;
  int64_t size;
  if (!batch_trace_open(id, &size) || a->nkw || a->nargs > 64)
    return err_set(ERR_VALUE, "%s(): called on batched values of another thread, or with "
                              "keyword arguments", f->name);
  bool batched[64];
  Value *args[64], *axes = tuple_new((size_t)a->nargs), *r = NULL;
  int made = 0;
  for (; axes && made < a->nargs; made++) {
    Value *x = a->args[made];
    batched[made] = is_batch_of(x, id);
    args[made] = batched[made] ? prim_batch_moveaxis(((Tracer *)x)->batched, ((Tracer *)x)->bdim, 0)
                               : val_incref(x);
    tuple_set_steal(axes, (size_t)made, batched[made] ? val_int(0) : val_incref(VAL_NONE));
    if (!args[made]) break;
  }
  Value *vm = axes && made == a->nargs ? batch_vmap_of(id, f->body, axes) : NULL;
  Value *body = vm ? smbatch_new(f->name, vm) : NULL;
  Value *in = body ? specs_batched(f->in_specs, a->nargs, batched) : NULL;
  Value *out = in ? specs_batched(f->out_specs, f->out_specs->type == V_PSPEC ? 1
                                  : (int)tuple_len(f->out_specs), NULL) : NULL;
  Value *sf = out ? shardmap_new(f->name, body, &f->mesh->hdr, in, out, f->check_rep) : NULL;
  if (sf) {
    ((ShardFn *)sf)->auto_axes = f->auto_axes;
    ((ShardFn *)sf)->internal = true;
    if (!(((ShardFn *)sf)->arg_labels = shardmap_arg_labels(f, 0, a->nargs, 0)))
      err_clear();   /* out of memory: the messages say "argument i" */
    CallArgs c = {a->nargs, args, 0, NULL, NULL};
    SmBatch *sb = (SmBatch *)((BoundMethod *)body)->self;
    sb->f = f, sb->call = (ShardFn *)sf;
    /* an eager call of a partial-manual shard_map: partitioned along the
     * automatic axes, as under jit, when the partitioned jit can run it */
    DevCtx *d = dev_ctx();
    ((ShardFn *)sf)->traceable = sm_traceable(f) && !(d && d->mesh);
    Value *res = ((ShardFn *)sf)->traceable ? shardmap_run_auto(sf, &c) : NULL;
    if (!res && !err_occurred()) res = shardmap_call(sf, &c);
    sb->f = sb->call = NULL;
    if (res) r = pytree_map(res, array_leaf, batch_result_leaf, &id);
    if (res) val_decref(res);
  }
  Value *tmp[] = {body, in, out, sf, axes};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  ad_values_free_n(args, made);
  return r;
}

/* ==== what the devices of a transformed call record ================================== */

/* The slots of what the devices of a differentiated or batched shard_map
 * record (shardmap_add_shared): a differentiated one's (sm_shared); a
 * batched one's, what the vmap of the body it batches records. */
static int rules_shared(Value *body, Value ***slots, int cap) {
  BoundMethod *b = (BoundMethod *)body;
  if (body->type == V_BOUND && b->fn == smbatch_body)
    return shardmap_shared_slots(((SmBatch *)b->self)->vmapped, slots, cap);
  return sm_shared(body, slots, cap);
}

/* shardmap_settle for such a body: a differentiated one's (sm_settle); a
 * batched one's: the vmap it wraps settles, then the batched shard_map
 * takes the out_specs of the one it batches. */
static int rules_settle(Value *body) {
  BoundMethod *b = (BoundMethod *)body;
  if (body->type != V_BOUND || b->fn != smbatch_body) return sm_settle(body);
  SmBatch *sb = (SmBatch *)b->self;
  if (shardmap_settle(sb->vmapped) < 0) return -1;
  smbatch_specs(sb);
  return 0;
}

/* ==== the row ======================================================================= */

/* Its errors (specs, replication) belong to the call; not lowerable in
 * an xmap body (the body takes the batching path). */
static const HigherRules shard_map_rules = {
    .prepare = prepare_shard_map,
    .run = run_shard_map,
    .effectful = true,
    .own_errors = true,
    .adopts_results = true,
    .eval = eval_shard_map,
    .eval_tuple = true,
    .jvp_call = jvp_call_shard_map,
    .batch_call = batch_call_shard_map,
};

void jit_register_shard_map_rules(void) {
  PrimRules sm = {.transpose = transpose_shard_map, .higher = &shard_map_rules};
  prim_register(P_SHARD_MAP, &sm);
  shardmap_add_shared(rules_shared, rules_settle);
}
