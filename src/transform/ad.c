/*
 * ad.c - jvp, vjp, grad and value_and_grad (ad.h).
 */
#include <stdatomic.h>
#include <string.h>

#include "array/prim.h"
#include "base/intern.h"
#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/ops.h"
#include "lang/pytree.h"
#include "transform/ad_impl.h"
#include "transform/batch.h"
#include "transform/higher.h"
#include "transform/partition.h"
#include "spmd/collective.h"
#include "spmd/shardmap.h"
#include "transform/trace.h"
#include "transform/xmap.h"

/* ==== JVP traces ========================================================== */

static _Thread_local JvpTrace *jvp_top;

static JvpTrace *jvp_find(unsigned id) {
  for (JvpTrace *j = jvp_top; j; j = j->parent)
    if (j->id == id) return j;
  return NULL;
}

static void jvp_push(JvpTrace *j, Trace *lin) {
  j->id = trace_next_id();
  j->lin = lin;
  j->parent = jvp_top;
  jvp_top = j;
}

static void jvp_pop(JvpTrace *j) {
  if (jvp_top == j) jvp_top = j->parent;
}

/* A JVP tracer of trace [id] for [primal] and [tangent] (both stolen). */
static Value *jvp_tracer(unsigned id, Value *primal, Value *tangent) {
  AVal a;
  Tracer *x = prim_value_aval(primal, &a) == 0 ? tracer_alloc(TR_JVP, id, &a) : NULL;
  if (!x) {
    val_decref(primal);
    val_decref(tangent);
    return NULL;
  }
  x->primal = primal;
  x->tangent = tangent;
  return &x->hdr;
}

static bool is_jvp_of(Value *v, unsigned id) {
  return IS_JVP_TRACER(v) && ((Tracer *)v)->trace_id == id;
}

/* ==== the dispatch ======================================================== */

/* How often each primitive's JVP and transpose rules have run in this
 * process (jax._primitive_table: a test checks that its finite-difference
 * checks reach every rule of the table). */
static _Atomic long jvp_runs[P_COUNT], transpose_runs[P_COUNT];

/* Applies [id]'s JVP rule at trace [j]. */
static Value *jvp_apply(JvpTrace *j, PrimId id, int nin, Value **in, const Params *p) {
  JvpRule rule = prim_table[id].rules.jvp;
  int nout = prim_table[id].nout;
  if (!rule) return prim_rule_missing(id, "differentiation"), NULL;
  if (nout < 1 || nout > 8 || nin > SHARDMAP_MAX_ARGS)
    return err_set(ERR_NOT_IMPLEMENTED, "differentiation of '%s' is not implemented",
                   prim_table[id].name);
  Value *pr[SHARDMAP_MAX_ARGS], *tg[SHARDMAP_MAX_ARGS], *po[8] = {0}, *to[8] = {0};
  for (int i = 0; i < nin; i++) {
    bool mine = is_jvp_of(in[i], j->id);
    pr[i] = mine ? ((Tracer *)in[i])->primal : in[i];
    tg[i] = mine ? ((Tracer *)in[i])->tangent : NULL;
  }
  atomic_fetch_add_explicit(&jvp_runs[id], 1, memory_order_relaxed);
  if (rule(pr, tg, nin, p, po, to) < 0) return NULL;
  Value *r[8];
  for (int k = 0; k < nout; k++) {
    AVal a;
    bool diff = to[k] && prim_value_aval(po[k], &a) == 0 && dt_is_float(a.dtype);
    if (to[k] && !diff) {
      val_decref(to[k]);
      to[k] = NULL;
    }
    r[k] = to[k] ? jvp_tracer(j->id, po[k], to[k]) : po[k];
  }
  if (nout == 1) return r[0];
  Value *t = tuple_new((size_t)nout);
  for (int k = 0; k < nout; k++) {
    if (t && r[k])
      tuple_set_steal(t, (size_t)k, r[k]);
    else if (r[k])
      val_decref(r[k]);
  }
  return t;
}

/* The JVP trace's KindApply: [top]'s trace applies the JVP rule. */
static Value *ad_apply(Tracer *top, PrimId id, int nin, Value **in, const Params *p) {
  JvpTrace *j = jvp_find(top->trace_id);
  if (!j)
    return err_set(ERR_VALUE, "a value being differentiated escaped from the function that "
                              "grad, vjp or jvp differentiates, or reached a shard_map body "
                              "where the call does not pass it (an object's attribute, or an "
                              "argument the body also uses whole); return it, or pass it to "
                              "the shard_map function as an argument");
  return jvp_apply(j, id, nin, in, p);
}

/* ---- the value model's view of a JVP tracer: its primal's ---------------- */

static int ad_truth(Value *v) { return val_truth(((Tracer *)v)->primal); }

/* ==== pytrees of arguments and results ===================================== */

static bool array_leaf(Value *v) { return ops_is_array(v); }

/* The leaves of [tree] (borrowed) into [l]; 0 or -1. */
static int leaves_of(Value *tree, PyLeaves *l) { return pytree_flatten(tree, array_leaf, l); }

/* [tree] with its leaves replaced by [vals] (borrowed). */
static Value *rebuild(Value *tree, Value **vals) {
  int pos = 0;
  return pytree_replace(tree, array_leaf, vals, &pos);
}

void ad_values_free_n(Value **v, int n) {
  for (int i = 0; v && i < n; i++)
    if (v[i]) val_decref(v[i]);
}

void ad_values_free(Value **v, int n) {
  ad_values_free_n(v, n);
  shm_free(v);
}

/* A leaf's replacement: a new reference, or NULL with the error set. */
typedef Value *(*LeafFn)(Value *leaf, void *ctx);

/* [tree] with each array leaf replaced by fn(leaf, ctx): a new tree. */
static Value *map_leaves(Value *tree, LeafFn fn, void *ctx) {
  return pytree_map(tree, array_leaf, fn, ctx);
}

/* The primal of [v] for trace [id] (new reference): JVP tracers of other
 * traces and everything else are their own primal. */
static Value *primal_of(Value *v, unsigned id) {
  return val_incref(is_jvp_of(v, id) ? ((Tracer *)v)->primal : v);
}

static Value *strip_leaf(Value *v, void *id) { return primal_of(v, *(unsigned *)id); }

/* [tree] with every JVP tracer of [id] replaced by its primal (aux data,
 * results). */
static Value *strip(Value *tree, unsigned id) { return map_leaves(tree, strip_leaf, &id); }

/* ==== linearizing: the JVP pass with staged tangents ======================== */

static void lin_free(Lin *l) {
  if (l->out) val_decref(l->out);
  if (l->aux) val_decref(l->aux);
  if (l->plan) val_decref(&l->plan->hdr);
  trace_caps_free(l->caps, l->ncap);
  memset(l, 0, sizeof *l);
}

typedef struct WrapCtx {
  JvpTrace *j;
  Trace *lin;
} WrapCtx;

/* A float leaf as a JVP tracer whose tangent is a new input of the linear
 * trace; other leaves as they are. */
static Value *wrap_leaf(Value *v, void *vctx) {
  WrapCtx *c = vctx;
  AVal a;
  if (ops_aval(v, &a) < 0) return NULL;
  if (!dt_is_float(a.dtype)) return val_incref(v);
  Value *t = trace_new_arg(c->lin, &a, NULL);
  return t ? jvp_tracer(c->j->id, val_incref(v), t) : NULL;
}

/* Wraps the float leaves of [tree] (the others stay) into JVP tracers of
 * [j] whose tangents are new inputs of [lin]; the new tree. */
static Value *wrap_linear(Value *tree, JvpTrace *j, Trace *lin) {
  WrapCtx c = {j, lin};
  return map_leaves(tree, wrap_leaf, &c);
}

/* Zeros of [v]'s aval, weakly typed when [v] is, as JAX instantiates a
 * symbolic zero tangent (zeros_like_aval keeps weak_type); a new
 * reference. */
static Value *zeros_like(Value *v) {
  AVal a;
  if (ops_aval(v, &a) < 0) return NULL;
  Value *z = prim_zeros(&a);
  if (z && IS_ARRAY(z)) AS_ARRAY(z)->weak = a.weak;
  return z;
}

/* The tangent of output leaf [v] for trace [id]: its tangent, or zeros of
 * its aval (a new reference). */
static Value *tangent_of(Value *v, unsigned id) {
  if (is_jvp_of(v, id)) return val_incref(((Tracer *)v)->tangent);
  return zeros_like(v);
}

Value *ad_jvp_tracer(unsigned id, Value *primal, Value *tangent) {
  return jvp_tracer(id, primal, tangent);
}

Value *ad_primal_of(Value *v, unsigned id) { return primal_of(v, id); }

Value *ad_tangent_of(Value *v, unsigned id) { return tangent_of(v, id); }

/* Splits [res] into (out, aux) when [has_aux]. */
static int split_aux(Value *res, bool has_aux, Value **out, Value **aux) {
  *aux = NULL;
  if (!has_aux) {
    *out = res;
    return 0;
  }
  size_t n;
  Value *const *items;
  if (!val_seq(res, &n, &items) || n != 2) {
    err_set(ERR_TYPE, "has_aux=True requires the function to return a pair (output, aux), "
                      "got %s", val_type_name(res));
    return -1;
  }
  *out = items[0];
  *aux = items[1];
  return 0;
}

/* Runs [fn] on [a] whose positional arguments at [diff] (nargs flags) are
 * differentiated: fills [lin].  0 or -1. */
static int linearize(Value *fn, const CallArgs *a, const bool *diff, bool has_aux, Lin *lin) {
  memset(lin, 0, sizeof *lin);
  Trace *lt = trace_begin_linear("vjp");
  if (!lt) return -1;
  JvpTrace j;
  jvp_push(&j, lt);
  Value **args = shm_calloc((size_t)a->nargs + 1, sizeof(Value *));
  Value *res = NULL;
  int ok = args ? 1 : (err_nomem(), 0);
  for (int i = 0; ok && i < a->nargs; i++)
    ok = (args[i] = diff[i] ? wrap_linear(a->args[i], &j, lt) : val_incref(a->args[i])) != NULL;
  if (ok) {
    CallArgs c = {a->nargs, args, a->nkw, a->kwnames, a->kwvals};
    res = val_call(fn, &c);
  }
  jvp_pop(&j);
  ad_values_free(args, a->nargs);
  Value *out, *aux;
  PyLeaves l = {0};
  Value **tans = NULL;
  int n = 0;
  if (!res || split_aux(res, has_aux, &out, &aux) < 0 || leaves_of(out, &l) < 0) goto fail;
  tans = shm_calloc((size_t)l.n + 1, sizeof(Value *));
  if (!tans) {
    err_nomem();
    goto fail;
  }
  for (; n < l.n; n++)
    if (!(tans[n] = tangent_of(l.v[n], j.id))) goto fail;
  lin->out = strip(out, j.id);
  lin->aux = aux ? strip(aux, j.id) : NULL;
  lin->nout = l.n;
  if (!lin->out || (aux && !lin->aux)) goto fail;
  lin->plan = trace_end(lt, l.n, tans, &lin->caps, &lin->ncap);
  lt = NULL;
  if (!lin->plan) goto fail;
  ad_values_free(tans, n);
  pytree_leaves_free(&l);
  val_decref(res);
  return 0;
fail:
  ad_values_free(tans, n);
  pytree_leaves_free(&l);
  if (res) val_decref(res);
  if (lt) trace_abort(lt);
  lin_free(lin);
  return -1;
}

/* ==== the backward pass ====================================================== */

typedef struct Back {
  Plan *p;
  Value **val;   /* forward values of the non-linear variables */
  Value **ct;    /* cotangents of the linear variables */
  bool *lin;
} Back;

static Value *atom_value(Back *b, const PlanAtom *a) { return a->var < 0 ? a->lit : b->val[a->var]; }

static bool atom_linear(Back *b, const PlanAtom *a) { return a->var >= 0 && b->lin[a->var]; }

/* Evaluates the non-linear equation [e] (on residuals) forward. */
static int forward_eqn(Back *b, const PlanEqn *e) {
  Value *ops[SHARDMAP_MAX_ARGS];
  if (e->nin > SHARDMAP_MAX_ARGS || !prim_table[e->prim].rules.kernel) {
    err_set(ERR_NOT_IMPLEMENTED, "grad: cannot replay '%s' in the backward pass",
            prim_table[e->prim].name);
    return -1;
  }
  for (int k = 0; k < e->nin; k++) ops[k] = val_incref(atom_value(b, &e->in[k]));
  /* the residuals are read again later: no operand may become the output */
  Value *r = prim_apply(e->prim, e->nin, ops, &e->params);
  for (int k = 0; k < e->nin; k++) val_decref(ops[k]);
  if (!r) return -1;
  if (e->nout == 1) {
    b->val[e->out[0]] = r;
    return 0;
  }
  for (int k = 0; k < e->nout; k++) b->val[e->out[k]] = val_incref(tuple_get(r, (size_t)k));
  val_decref(r);
  return 0;
}

/* [prim] (psum or pvary) of [c] (stolen) over the mesh axes of [mask];
 * [c] itself when [mask] is empty.  NULL with the error set. */
static Value *over_axes(PrimId prim, Value *c, uint32_t mask) {
  if (!mask) return c;
  Params q;
  params_init(&q);
  params_add(&q, "axes", coll_axis_names(mask));
  if (prim == P_PSUM) params_add(&q, "axis_index_groups", val_incref(VAL_NONE));
  Value *r = prim_apply(prim, 1, &c, &q);
  params_clear(&q);
  val_decref(c);
  return r;
}

/* Adds [c] (stolen, may be NULL) into the cotangent of variable [var].
 * Inside a shard_map body a cotangent takes its variable's replication
 * type (LANGUAGE.md §11): a contribution that varies over mesh axes the
 * variable does not vary over is first summed over them (the transpose
 * of the implicit pvary where an invariant value met varying ones), and
 * one invariant over axes the variable varies over is typed as varying
 * over them (pvary: the same values), as a transpose rule may give an
 * invariant cotangent for a varying operand (psum's, whose result is
 * invariant); an invariant value that met it is then summed over those
 * axes further back, as it must be.  Under check_vma=False there are no
 * replication types (JAX's, LANGUAGE.md §11: psum transposes to psum, as
 * in pmap): a cotangent is added as it comes, so the gradient of a
 * body's replicated input is each device's own, which pmap-style code
 * then averages with pmean. */
static int ct_add(Back *b, int var, Value *c) {
  if (!c) return 0;
  AVal ca;
  uint32_t want = b->p->vars[var].vma;
  if (dev_checks_vma() && prim_value_aval(c, &ca) == 0) {
    c = over_axes(P_PSUM, c, ca.vma & ~want);
    if (c) c = over_axes(P_PVARY, c, want & ~ca.vma);
    if (!c) return -1;
  }
  Value *s = prim_add_any(b->ct[var], c);
  val_decref(c);
  if (!s) return -1;
  if (b->ct[var]) val_decref(b->ct[var]);
  b->ct[var] = s;
  return 0;
}

/* The manual axes (bits) of a body's mesh [m]: all but its automatic ones. */
static uint32_t manual_axes(const MeshDesc *m) {
  return ((m->naxes >= 32 ? 0u : 1u << m->naxes) - 1u) & ~m->auto_axes;
}

/* The cotangent [c] (stolen) of a shard_map body's argument of aval [av]:
 * under check_vma=False (no replication types, so no cotangent was
 * summed on its way) summed over the manual mesh axes its in_spec leaves
 * it unsplit along, as JAX's transpose of shard_map does then; [c]
 * itself otherwise.  NULL with the error set. */
static Value *unchecked_input_ct(const AVal *av, Value *c) {
  const DevCtx *d = dev_ctx();
  if (!d || !d->mesh || !d->unchecked) return c;
  return over_axes(P_PSUM, c, manual_axes(d->mesh) & ~av->vma);
}

/* The seed [c] (stolen) of a shard_map body's output variable [var]: a
 * cotangent invariant over mesh axes the variable's tangent varies over
 * (a cond on an index varying over them, whose tangent is selected among
 * its branches) belongs to the one value that out_specs takes from any
 * of the devices along them, so each device takes an equal share.  Under
 * check_vma=False (no replication types: LANGUAGE.md §11, as JAX and
 * pmap) every output's cotangent is divided by the size of the manual
 * axes its out_spec leaves it unsplit over, and psum transposes to psum
 * (tr_psum), which sums the shares back. */
static Value *seed_share(Back *b, int var, Value *c) {
  AVal ca;
  const DevCtx *d = dev_ctx();
  if (prim_value_aval(c, &ca) < 0 || !d || !d->mesh) return c;
  uint32_t spread = (d->unchecked ? manual_axes(d->mesh) : b->p->vars[var].vma) & ~ca.vma;
  int64_t n = 1;
  for (int k = 0; k < d->mesh->naxes; k++)
    if (spread & (1u << k)) n *= d->mesh->sizes[k];
  if (n == 1) return c;
  Array *share = arr_scalar_f64(ca.dtype, 1.0 / (double)n, true);
  Params none;
  params_init(&none);
  Value *r = share ? prim_apply(P_MUL, 2, (Value *[]){c, &share->hdr}, &none) : NULL;
  if (share) val_decref(&share->hdr);
  val_decref(c);
  return r;
}

static int transpose_with(Back *b, const PlanEqn *e, TransposeRule rule, Value **cts_out,
                          Value **ops, Value **cts_in, AVal *avs, bool *lin);

/* Transposes the linear equation [e]. */
static int transpose_eqn(Back *b, const PlanEqn *e) {
  bool any = false;
  for (int k = 0; k < e->nout; k++) any |= b->ct[e->out[k]] != NULL;
  if (!any || (e->nout == 1 && !b->ct[e->out[0]])) return 0;
  TransposeRule rule = prim_table[e->prim].rules.transpose;
  if (!rule) return prim_rule_missing(e->prim, "transpose");
  /* the operand lists: on the stack for a primitive's few operands, on
   * the heap for a shard_map equation's (one operand per differentiated
   * leaf and one result per result leaf) */
  size_t n = (size_t)e->nin + 1, m = (size_t)e->nout + 1;
  enum { FEW = 4 };
  Value *few_v[3 * FEW] = {0};
  AVal few_av[FEW];
  bool few_lin[FEW] = {0};
  bool heap = n > FEW || m > FEW;
  Value **cts_out = heap ? shm_calloc(m + 2 * n, sizeof(Value *)) : few_v, **ops = cts_out + m,
        **cts_in = ops + n;
  if (!heap) memset(few_av, 0, sizeof few_av);
  AVal *avs = heap ? shm_calloc(n, sizeof(AVal)) : few_av;
  bool *lin = heap ? shm_calloc(n, sizeof(bool)) : few_lin;
  int rc = cts_out && avs && lin ? 0 : (err_nomem(), -1);
  if (rc == 0) rc = transpose_with(b, e, rule, cts_out, ops, cts_in, avs, lin);
  if (heap) {
    shm_free(cts_out);
    shm_free(avs);
    shm_free(lin);
  }
  return rc;
}

/* transpose_eqn with its operand lists. */
static int transpose_with(Back *b, const PlanEqn *e, TransposeRule rule, Value **cts_out,
                          Value **ops, Value **cts_in, AVal *avs, bool *lin) {
  for (int k = 0; k < e->nout; k++) cts_out[k] = b->ct[e->out[k]];
  for (int k = 0; k < e->nin; k++) {
    lin[k] = atom_linear(b, &e->in[k]);
    ops[k] = lin[k] ? NULL : atom_value(b, &e->in[k]);
    plan_atom_aval(b->p, &e->in[k], &avs[k]);
  }
  atomic_fetch_add_explicit(&transpose_runs[e->prim], 1, memory_order_relaxed);
  if (rule(cts_out, ops, avs, lin, e->nin, &e->params, cts_in) < 0) return -1;
  int rc = 0;
  for (int k = 0; k < e->nin; k++) {
    if (lin[k] && rc == 0)
      rc = ct_add(b, e->in[k].var, cts_in[k]);
    else if (cts_in[k])
      val_decref(cts_in[k]);
  }
  for (int k = 0; k < e->nout; k++) {
    if (b->ct[e->out[k]]) val_decref(b->ct[e->out[k]]);
    b->ct[e->out[k]] = NULL;
  }
  return rc;
}

static void back_free(Back *b) {
  for (int i = 0; i < b->p->nvars; i++) {
    if (b->val && b->val[i]) val_decref(b->val[i]);
    if (b->ct && b->ct[i]) val_decref(b->ct[i]);
  }
  shm_free(b->val);   /* one block: val, ct, then lin (backward) */
}

/* The cotangents of [lin]'s differentiated leaves (nargs = plan inputs
 * after the captures) from the output leaves' cotangents [ct_out] (NULL
 * entries are zeros): a new array of new references. */
static Value **backward(const Lin *lin, Value **ct_out) {
  Plan *p = lin->plan;
  size_t nv = (size_t)p->nvars + 1;
  Value **blk = shm_calloc(2 * nv * sizeof(Value *) + nv, 1);   /* val, ct, lin */
  Back b = {p, blk, blk ? blk + nv : NULL, blk ? (bool *)(blk + 2 * nv) : NULL};
  int nargs = p->nin - lin->ncap;
  Value **res = NULL;
  if (!b.val || !b.ct || !b.lin) {
    err_nomem();
    goto out;
  }
  for (int i = 0; i < lin->ncap; i++) b.val[p->invars[i]] = val_incref(lin->caps[i]);
  for (int i = lin->ncap; i < p->nin; i++) b.lin[p->invars[i]] = true;
  for (int i = 0; i < p->neqn; i++) {
    const PlanEqn *e = &p->eqns[i];
    bool l = false;
    for (int k = 0; k < e->nin; k++) l |= atom_linear(&b, &e->in[k]);
    if (l)
      for (int k = 0; k < e->nout; k++) b.lin[e->out[k]] = true;
    else if (forward_eqn(&b, e) < 0)
      goto out;
  }
  for (int i = 0; i < p->nout; i++) {
    if (!atom_linear(&b, &p->outs[i]) || !ct_out[i]) continue;
    Value *seed = val_incref(ct_out[i]);
    if (lin->shard_out && !(seed = seed_share(&b, p->outs[i].var, seed))) goto out;
    if (ct_add(&b, p->outs[i].var, seed) < 0) goto out;
  }
  for (int i = p->neqn - 1; i >= 0; i--) {
    const PlanEqn *e = &p->eqns[i];
    bool l = false;
    for (int k = 0; k < e->nout; k++) l |= b.lin[e->out[k]];
    if (l && transpose_eqn(&b, e) < 0) goto out;
  }
  res = shm_calloc((size_t)nargs + 1, sizeof(Value *));
  if (!res) {
    err_nomem();
    goto out;
  }
  for (int i = 0; i < nargs; i++) {
    int v = p->invars[lin->ncap + i];
    res[i] = b.ct[v] ? b.ct[v] : prim_zeros(&p->vars[v]);
    b.ct[v] = NULL;
    if (res[i] && lin->shard_out) res[i] = unchecked_input_ct(&p->vars[v], res[i]);
    if (!res[i]) {
      ad_values_free(res, i);
      res = NULL;
      goto out;
    }
  }
out:
  back_free(&b);
  return res;
}

typedef struct CtCtx {
  Value **cts;
  int pos;
} CtCtx;

/* A float leaf's cotangent has its primal's weak type, as JAX's autodiff
 * keeps weak types (grad of a Python float is weakly typed), and its
 * Explicit type (part_typed_like). */
static Value *ct_leaf(Value *v, void *vctx) {
  CtCtx *c = vctx;
  AVal a, ca;
  if (ops_aval(v, &a) < 0) return NULL;
  if (!dt_is_float(a.dtype)) return prim_zeros(&a);
  Value *ct = part_typed_like(c->cts[c->pos++], v, a.ndim);
  if (ct && a.weak && ops_aval(ct, &ca) == 0 && ca.dtype == a.dtype && !ca.weak) {
    Value *w = ops_convert(ct, a.dtype, true);
    val_decref(ct);
    return w;
  }
  return ct;
}

/* The cotangent trees of the differentiated arguments: each float leaf
 * takes the next of [cts] (borrowed), other leaves zeros of their aval. */
static Value *ct_tree(Value *arg, Value **cts, int *pos) {
  CtCtx c = {cts, *pos};
  Value *r = map_leaves(arg, ct_leaf, &c);
  *pos = c.pos;
  return r;
}

/* ==== for the rules of shard_map's row (ad_impl.h) ============================= */

JvpTrace *ad_jvp_find(unsigned id) { return jvp_find(id); }

void ad_jvp_push(JvpTrace *j, Trace *lin) { jvp_push(j, lin); }

void ad_jvp_pop(JvpTrace *j) { jvp_pop(j); }

Value *ad_strip(Value *tree, unsigned id) { return strip(tree, id); }

Value **ad_backward(const Lin *lin, Value **ct_out) { return backward(lin, ct_out); }

void ad_lin_free(Lin *l) { lin_free(l); }

/* shardmap_set_differentiator: a shard_map call on values being
 * differentiated or batched goes to the rule of shard_map's row for the
 * innermost trace among its arguments (higher.h): a batch trace's
 * batch_call, else jvp_call. */
static Value *ad_shard_map(Value *fv, const CallArgs *a) {
  Tracer *top = NULL;
  for (int i = 0; i < a->nargs; i++)
    if (IS_TRACER(a->args[i]) && (!top || ((Tracer *)a->args[i])->trace_id > top->trace_id))
      top = (Tracer *)a->args[i];
  bool batch = top && top->kind == TR_BATCH;
  const HigherRules *h = higher_rules(P_SHARD_MAP);
  HigherCallRule rule = !h ? NULL : batch ? h->batch_call : h->jvp_call;
  if (!rule) return prim_rule_missing(P_SHARD_MAP, batch ? "vmap" : "differentiation"), NULL;
  return rule(fv, a);
}

/* ==== grad and value_and_grad ================================================ */

/* The configuration a grad function carries: (fun, argnums, has_aux,
 * with_value). */
enum { G_FUN, G_ARGNUMS, G_AUX, G_VALUE, G_N };

/* Reads argnums (an int or a tuple of ints) against [nargs] arguments into
 * the flags [diff]; [single]: an int was given. */
static int read_argnums(const char *who, Value *v, int nargs, bool *diff, bool *single) {
  size_t n = 1;
  Value *const *items = &v;
  *single = !val_seq(v, &n, &items);
  if (*single) items = &v, n = 1;
  if (n == 0) {
    err_set(ERR_VALUE, "%s: argnums must not be empty", who);
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    int64_t k;
    if (arr_to_index(items[i], &k) < 0) return -1;
    if (k < 0) k += nargs;
    if (k < 0 || k >= nargs) {
      err_set(ERR_TYPE, "differentiating with respect to argnums=%lld requires at least %lld "
                        "positional arguments to be passed by the caller, but got only %d "
                        "positional arguments", (long long)(k < 0 ? k - nargs : k),
              (long long)(k < 0 ? -k : k + 1), nargs);
      return -1;
    }
    diff[k] = true;
  }
  return 0;
}

/* JAX's checks on grad's inputs: float leaves only. */
static int check_grad_inputs(Value *arg) {
  PyLeaves l = {0};
  if (leaves_of(arg, &l) < 0) return -1;
  int rc = 0;
  for (int i = 0; i < l.n && rc == 0; i++) {
    AVal a;
    if ((rc = ops_aval(l.v[i], &a)) < 0) break;
    if (!dt_is_float(a.dtype)) {
      err_set(ERR_TYPE, "grad requires real- or complex-valued inputs (input dtype that is a "
                        "sub-dtype of np.inexact), but got %s. If you want to use Boolean- or "
                        "integer-valued inputs, use vjp or set allow_int to True.",
              dt_name(a.dtype));
      rc = -1;
    }
  }
  pytree_leaves_free(&l);
  return rc;
}

/* JAX's checks on grad's output: a float scalar. */
static int check_grad_output(Value *out, AVal *a) {
  if (!ops_is_array(out)) {
    err_set(ERR_TYPE, "Gradient only defined for scalar-output functions. Output was %s.",
            val_type_name(out));
    return -1;
  }
  if (ops_aval(out, a) < 0) return -1;
  if (a->ndim != 0) {
    char s[128];
    int n = snprintf(s, sizeof s, "(");
    for (int i = 0; i < a->ndim && n < 100; i++)
      n += snprintf(s + n, sizeof s - (size_t)n, "%s%lld", i ? ", " : "", (long long)a->shape[i]);
    snprintf(s + n, sizeof s - (size_t)n, a->ndim == 1 ? ",)" : ")");
    err_set(ERR_TYPE, "Gradient only defined for scalar-output functions. Output had shape: %s.", s);
    return -1;
  }
  if (!dt_is_float(a->dtype)) {
    err_set(ERR_TYPE, "grad requires real-valued outputs (output dtype that is a sub-dtype of "
                      "np.floating), but got %s. For differentiation of functions with integer "
                      "outputs, use jax.vjp directly.", dt_name(a->dtype));
    return -1;
  }
  return 0;
}

/* The gradients of [a]'s arguments at [diff] (tuple when !single). */
static Value *grads_of(const CallArgs *a, const bool *diff, bool single, Value **cts) {
  int pos = 0, nd = 0;
  for (int i = 0; i < a->nargs; i++) nd += diff[i];
  Value *t = single ? NULL : tuple_new((size_t)nd);
  if (!single && !t) return NULL;
  int k = 0;
  for (int i = 0; i < a->nargs; i++) {
    if (!diff[i]) continue;
    Value *g = ct_tree(a->args[i], cts, &pos);
    if (!g) {
      if (t) {
        for (; k < nd; k++) tuple_set_steal(t, (size_t)k, val_incref(VAL_NONE));
        val_decref(t);
      }
      return NULL;
    }
    if (single) return g;
    tuple_set_steal(t, (size_t)k++, g);
  }
  return t;
}

static Value *pair(Value *a, Value *b) {
  Value *t = a && b ? tuple_pack(2, (Value *[]){a, b}) : NULL;
  if (a) val_decref(a);
  if (b) val_decref(b);
  return t;
}

static Value *grad_call(Value *self, const CallArgs *a) {
  Value *fun = tuple_get(self, G_FUN);
  bool has_aux = val_truth(tuple_get(self, G_AUX)) == 1;
  bool with_value = val_truth(tuple_get(self, G_VALUE)) == 1;
  const char *who = with_value ? "value_and_grad" : "grad";
  bool *diff = shm_calloc((size_t)a->nargs + 1, sizeof(bool)), single;
  Value *r = NULL, **cts = NULL;
  Lin lin = {0};
  if (!diff) return err_nomem();
  if (read_argnums(who, tuple_get(self, G_ARGNUMS), a->nargs, diff, &single) < 0) goto out;
  for (int i = 0; i < a->nargs; i++)
    if (diff[i] && check_grad_inputs(a->args[i]) < 0) goto out;
  if (linearize(fun, a, diff, has_aux, &lin) < 0) goto out;
  AVal oa;
  if (check_grad_output(lin.out, &oa) < 0) goto out;
  oa.vma = 0;
  Array *onea = arr_scalar_f64(oa.dtype, 1.0, false);
  Value *one = onea ? &onea->hdr : NULL;
  if (!one || !(cts = backward(&lin, &one))) {
    if (one) val_decref(one);
    goto out;
  }
  val_decref(one);
  Value *g = grads_of(a, diff, single, cts);
  if (!g) goto out;
  if (has_aux) g = with_value ? pair(pair(val_incref(lin.out), val_incref(lin.aux)), g)
                              : pair(g, val_incref(lin.aux));
  else if (with_value)
    g = pair(val_incref(lin.out), g);
  r = g;
out:
  if (cts) ad_values_free(cts, lin.plan ? lin.plan->nin - lin.ncap : 0);
  lin_free(&lin);
  shm_free(diff);
  return r;
}

/* grad(fun, argnums=0, has_aux=False) and value_and_grad(...) */
static Value *make_grad(const CallArgs *a, const char *who, bool with_value) {
  Value *fun, *argnums = NULL, *has_aux = NULL, *allow_int = NULL;
  if (args_bind(who, a, "fun, argnums=, has_aux=, allow_int=",
                (Value **[]){&fun, &argnums, &has_aux, &allow_int}) < 0)
    return NULL;
  if (allow_int && val_truth(allow_int) == 1)
    return err_set(ERR_NOT_IMPLEMENTED, "%s: allow_int=True is not implemented", who);
  Value *zero = argnums ? NULL : val_int(0);
  Value *cfg = tuple_pack(G_N, (Value *[]){fun, argnums ? argnums : zero,
                                           has_aux ? has_aux : val_false(), val_bool(with_value)});
  if (zero) val_decref(zero);
  if (!cfg) return NULL;
  Value *r = bound_new(who, grad_call, cfg);
  val_decref(cfg);
  return r;
}

static Value *bi_grad(const CallArgs *a) { return make_grad(a, "grad", false); }
static Value *bi_value_and_grad(const CallArgs *a) { return make_grad(a, "value_and_grad", true); }

/* ==== vjp ====================================================================== */

/* A vjp function's state: (plan, captures, primals tuple, out tree). */
enum { V_PLANV, V_CAPS, V_PRIMALS, V_OUT, V_N };

/* The cotangent leaves [got] in the dtypes of the outputs [want] (same
 * count and shapes): a weakly typed one (a Python number) takes its
 * output's float dtype, as JAX's default float would be under x64; a
 * strongly typed float of another dtype is JAX's error, not converted.
 * A new array of new references, or NULL with the error set. */
static Value **ct_dtypes(const PyLeaves *want, const PyLeaves *got) {
  Value **v = shm_calloc((size_t)got->n + 1, sizeof(Value *));
  if (!v) return err_nomem();
  for (int i = 0; i < got->n; i++) {
    AVal x, y;
    if (ops_aval(want->v[i], &x) < 0 || ops_aval(got->v[i], &y) < 0) goto fail;
    if (x.dtype == y.dtype || !dt_is_float(x.dtype)) {
      v[i] = val_incref(got->v[i]);
    } else if (y.weak) {
      if (!(v[i] = ops_convert(got->v[i], x.dtype, false))) goto fail;
    } else {
      char s1[128], s2[128];
      aval_str(s1, sizeof s1, x.dtype, x.ndim, x.shape);
      aval_str(s2, sizeof s2, y.dtype, y.ndim, y.shape);
      err_set(ERR_TYPE, "unexpected JAX type (e.g. shape/dtype) for argument to vjp function: "
                        "got %s, but expected %s because the corresponding output of the "
                        "function had JAX type %s", s2, s1, s1);
      goto fail;
    }
  }
  return v;
fail:
  ad_values_free(v, got->n);
  return NULL;
}

static Value *vjp_fn_call(Value *self, const CallArgs *a) {
  if (a->nargs != 1 || a->nkw)
    return err_set(ERR_TYPE, "the vjp function takes one argument, the cotangent of the "
                             "output, got %d", a->nargs);
  Value *caps = tuple_get(self, V_CAPS);
  Lin lin = {NULL, NULL, (Plan *)tuple_get(self, V_PLANV), ((Tuple *)caps)->items,
             (int)tuple_len(caps), 0, false};
  PyLeaves want = {0}, got = {0};
  Value *r = NULL, **cts = NULL, **ctv;
  if (leaves_of(tuple_get(self, V_OUT), &want) < 0 || leaves_of(a->args[0], &got) < 0) goto out;
  if (want.n != got.n || want.n != lin.plan->nout) {
    err_set(ERR_TYPE, "the cotangent has %d leaves, but the function's output has %d", got.n,
            want.n);
    goto out;
  }
  for (int i = 0; i < got.n; i++) {
    AVal x, y;
    if (ops_aval(want.v[i], &x) < 0 || ops_aval(got.v[i], &y) < 0) goto out;
    if (x.ndim != y.ndim || memcmp(x.shape, y.shape, sizeof(int64_t) * (size_t)x.ndim)) {
      char s1[128], s2[128];
      aval_str(s1, sizeof s1, x.dtype, x.ndim, x.shape);
      aval_str(s2, sizeof s2, y.dtype, y.ndim, y.shape);
      err_set(ERR_VALUE, "the cotangent of output leaf %d has aval %s, but the output is %s", i,
              s2, s1);
      goto out;
    }
  }
  if (!(ctv = ct_dtypes(&want, &got))) goto out;
  cts = backward(&lin, ctv);
  ad_values_free(ctv, got.n);
  if (!cts) goto out;
  Value *prims = tuple_get(self, V_PRIMALS);
  size_t n = tuple_len(prims);
  Value *t = tuple_new(n);
  int pos = 0;
  for (size_t i = 0; t && i < n; i++) {
    Value *g = ct_tree(tuple_get(prims, i), cts, &pos);
    if (!g) {
      for (; i < n; i++) tuple_set_steal(t, i, val_incref(VAL_NONE));
      val_decref(t);
      t = NULL;
      break;
    }
    tuple_set_steal(t, i, g);
  }
  r = t;
out:
  if (cts) ad_values_free(cts, lin.plan->nin - lin.ncap);
  pytree_leaves_free(&want);
  pytree_leaves_free(&got);
  return r;
}

/* [fname](fun, *primals, has_aux=False) -> (out, fn) or (out, fn, aux):
 * fun linearized at primals, and [fn] (named [bname], called through
 * [call]) bound to the state (plan, captures, primals, out tree).  The
 * body of jax.vjp and jax.linearize. */
static Value *staged_fn(const CallArgs *a, const char *fname, const char *bname,
                        Value *(*call)(Value *self, const CallArgs *a)) {
  if (a->nargs < 1) return err_set(ERR_TYPE, "%s() missing required argument 'fun'", fname);
  bool has_aux = false;
  for (int i = 0; i < a->nkw; i++) {
    if (strcmp(a->kwnames[i], "has_aux"))
      return err_set(ERR_TYPE, "%s() got an unexpected keyword argument '%s'", fname, a->kwnames[i]);
    has_aux = val_truth(a->kwvals[i]) == 1;
  }
  int n = a->nargs - 1;
  bool *diff = shm_calloc((size_t)n + 1, sizeof(bool));
  if (!diff) return err_nomem();
  for (int i = 0; i < n; i++) diff[i] = true;
  CallArgs c = {n, a->args + 1, 0, NULL, NULL};
  Lin lin;
  Value *r = NULL;
  if (linearize(a->args[0], &c, diff, has_aux, &lin) == 0) {
    Value *caps = tuple_pack((size_t)lin.ncap, lin.caps);
    Value *prims = tuple_pack((size_t)n, a->args + 1);
    Value *st = caps && prims ? tuple_pack(V_N, (Value *[]){&lin.plan->hdr, caps, prims, lin.out})
                              : NULL;
    Value *fn = st ? bound_new(bname, call, st) : NULL;
    if (fn)
      r = has_aux ? tuple_pack(3, (Value *[]){lin.out, fn, lin.aux}) : tuple_pack(2, (Value *[]){lin.out, fn});
    if (fn) val_decref(fn);
    if (st) val_decref(st);
    if (caps) val_decref(caps);
    if (prims) val_decref(prims);
    lin_free(&lin);
  }
  shm_free(diff);
  return r;
}

/* vjp(fun, *primals, has_aux=False) -> (out, vjp_fun) or (out, vjp_fun, aux) */
static Value *bi_vjp(const CallArgs *a) { return staged_fn(a, "vjp", "vjp_fun", vjp_fn_call); }

/* A linearized function's state: (plan, captures, primals tuple, out tree);
 * the V_* slots of a vjp function's state. */

/* Checks tangent leaf [t] against primal leaf [p] as JAX's linearized
 * function does: the same shape, and a float primal's dtype.  0, or -1
 * with JAX's ValueError. */
static int lin_check(Value *p, Value *t) {
  AVal pa, ta;
  if (ops_aval(p, &pa) < 0 || ops_aval(t, &ta) < 0) return -1;
  if (pa.ndim == ta.ndim && !memcmp(pa.shape, ta.shape, sizeof(int64_t) * (size_t)pa.ndim) &&
      (!dt_is_float(pa.dtype) || pa.dtype == ta.dtype))
    return 0;
  char s1[128], s2[128];   /* JAX's ShapedArray str: float32[3,2] */
  aval_str(s1, sizeof s1, pa.dtype, pa.ndim, pa.shape);
  aval_str(s2, sizeof s2, ta.dtype, ta.ndim, ta.shape);
  const char *d1 = strchr(s1, '['), *d2 = strchr(s2, '[');
  err_set(ERR_VALUE, "linearized function called on tangent values inconsistent with the "
                     "original primal values:\nGot tangent aval %s%s for primal aval %s%s but "
                     "expected %s%s.", dt_name(ta.dtype), d2 ? d2 : "", dt_name(pa.dtype),
          d1 ? d1 : "", dt_name(pa.dtype), d1 ? d1 : "");
  return -1;
}

/* f_jvp(*tangents): the linear plan of jax.linearize run on the tangents
 * (one per primal, each a tree like its primal's); the output tangents as
 * a tree like the primal output.  Evaluates the staged linear equations
 * (JAX's eval_jaxpr of the linearized jaxpr), so the forward pass is not
 * run again.  Raises JAX's ValueError for a tangent of another shape. */
static Value *lin_fn_call(Value *self, const CallArgs *a) {
  Value *prims = tuple_get(self, V_PRIMALS), *caps = tuple_get(self, V_CAPS);
  Plan *plan = (Plan *)tuple_get(self, V_PLANV);
  if (a->nkw || (size_t)a->nargs != tuple_len(prims))
    return err_set(ERR_TYPE, "the linearized function takes %zu positional arguments (one "
                             "tangent per primal), got %d", tuple_len(prims), a->nargs);
  Value *tans = tuple_pack((size_t)a->nargs, a->args);
  PyLeaves pl = {0}, tl = {0};
  Value **in = NULL, *outs = NULL, *r = NULL;
  int ncap = (int)tuple_len(caps), k = ncap;
  if (!tans || leaves_of(prims, &pl) < 0 || leaves_of(tans, &tl) < 0) goto out;
  if (pl.n != tl.n) {
    err_set(ERR_VALUE, "linearized function called on tangent values inconsistent with the "
                       "original primal values: %d tangent leaves for %d primal leaves",
            tl.n, pl.n);
    goto out;
  }
  if (!(in = shm_calloc((size_t)plan->nin + 1, sizeof(Value *)))) {
    err_nomem();
    goto out;
  }
  for (int i = 0; i < ncap; i++) in[i] = tuple_get(caps, (size_t)i);
  for (int i = 0; i < pl.n; i++) {
    AVal pa;
    if (lin_check(pl.v[i], tl.v[i]) < 0 || ops_aval(pl.v[i], &pa) < 0) goto out;
    if (dt_is_float(pa.dtype) && k < plan->nin) in[k++] = tl.v[i];   /* only float leaves are inputs */
  }
  if (k != plan->nin) {
    err_set(ERR_VALUE, "linearized function: %d tangent inputs for a plan of %d", k - ncap,
            plan->nin - ncap);
    goto out;
  }
  if ((outs = xmap_eval_plan(plan, in))) r = rebuild(tuple_get(self, V_OUT), ((Tuple *)outs)->items);
out:
  if (outs) val_decref(outs);
  shm_free(in);
  pytree_leaves_free(&pl);
  pytree_leaves_free(&tl);
  if (tans) val_decref(tans);
  return r;
}

/* linearize(fun, *primals, has_aux=False) -> (out, f_jvp) or (out, f_jvp,
 * aux): fun's output at primals and its JVP as a function of the
 * tangents, staged once (the linear part of the JVP trace, residuals
 * captured).  semantics: jax.linearize. */
static Value *bi_linearize(const CallArgs *a) { return staged_fn(a, "linearize", "f_jvp", lin_fn_call); }

/* ==== jvp ====================================================================== */

/* Checks that [tan] may be the tangent of [pri] (JAX's message). */
static int check_tangent(Value *pri, Value *tan, AVal *pa) {
  AVal ta;
  if (ops_aval(pri, pa) < 0 || ops_aval(tan, &ta) < 0) return -1;
  if (pa->ndim != ta.ndim || memcmp(pa->shape, ta.shape, sizeof(int64_t) * (size_t)pa->ndim)) {
    char s1[128], s2[128];
    aval_str(s1, sizeof s1, pa->dtype, pa->ndim, pa->shape);
    aval_str(s2, sizeof s2, ta.dtype, ta.ndim, ta.shape);
    err_set(ERR_VALUE, "jvp called with different primal and tangent shapes;Got primal shape %s "
                       "and tangent shape as %s", s1, s2);
    return -1;
  }
  if (dt_is_float(pa->dtype) && ta.dtype != pa->dtype) {
    err_set(ERR_TYPE, "primal and tangent arguments to jax.jvp do not match; dtypes must be "
                      "equal. Got primal dtype %s and so tangent dtype should be %s, but got "
                      "tangent dtype %s instead.", dt_name(pa->dtype), dt_name(pa->dtype),
            dt_name(ta.dtype));
    return -1;
  }
  return 0;
}

static Value *tangent_leaf(Value *v, void *id) { return tangent_of(v, *(unsigned *)id); }

/* The primal and tangent trees of result [res] for trace [id]. */
static Value *jvp_results(Value *res, unsigned id) {
  return pair(strip(res, id), map_leaves(res, tangent_leaf, &id));
}

/* jvp(fun, primals, tangents) -> (primals_out, tangents_out) */
static Value *bi_jvp(const CallArgs *a) {
  Value *fun, *prims, *tans, *has_aux = NULL;
  if (args_bind("jvp", a, "fun, primals, tangents, has_aux=", (Value **[]){&fun, &prims, &tans, &has_aux}) < 0)
    return NULL;
  size_t np, nt;
  Value *const *pi, *const *ti;
  if (!val_seq(prims, &np, &pi) || !val_seq(tans, &nt, &ti))
    return err_set(ERR_TYPE, "primal and tangent arguments to jax.jvp must be tuples or lists; "
                             "found %s and %s.", val_type_name(prims), val_type_name(tans));
  if (np != nt)
    return err_set(ERR_TYPE, "primal and tangent arguments to jax.jvp must have the same tree "
                             "structure; got %zu primals and %zu tangents", np, nt);
  PyLeaves pl = {0}, tl = {0};
  Value **wrapped = NULL, *res = NULL, *r = NULL;
  int nw = 0;
  JvpTrace j;
  jvp_push(&j, NULL);
  if (leaves_of(prims, &pl) < 0 || leaves_of(tans, &tl) < 0) goto out;
  if (pl.n != tl.n) {
    err_set(ERR_TYPE, "primal and tangent arguments to jax.jvp must have the same tree "
                      "structure; got %d and %d leaves", pl.n, tl.n);
    goto out;
  }
  if (!(wrapped = shm_calloc((size_t)pl.n + 1, sizeof(Value *)))) goto out;
  for (; nw < pl.n; nw++) {
    AVal pa;
    if (check_tangent(pl.v[nw], tl.v[nw], &pa) < 0) goto out;
    wrapped[nw] = dt_is_float(pa.dtype)
                      ? jvp_tracer(j.id, val_incref(pl.v[nw]), val_incref(tl.v[nw]))
                      : val_incref(pl.v[nw]);
    if (!wrapped[nw]) goto out;
  }
  Value *wt = rebuild(prims, wrapped);
  if (!wt) goto out;
  size_t n;
  Value *const *items;
  val_seq(wt, &n, &items);
  res = val_call_n(fun, (int)n, (Value **)items);
  val_decref(wt);
  jvp_pop(&j);
  if (!res) goto out;
  if (has_aux && val_truth(has_aux) == 1) {
    Value *o, *x;
    if (split_aux(res, true, &o, &x) < 0) goto out;
    Value *pt = jvp_results(o, j.id);
    Value *ax = pt ? strip(x, j.id) : NULL;
    if (ax) r = tuple_pack(3, (Value *[]){tuple_get(pt, 0), tuple_get(pt, 1), ax});
    if (pt) val_decref(pt);
    if (ax) val_decref(ax);
  } else {
    r = jvp_results(res, j.id);
  }
out:
  jvp_pop(&j);
  ad_values_free(wrapped, nw);
  pytree_leaves_free(&pl);
  pytree_leaves_free(&tl);
  if (res) val_decref(res);
  return r;
}

/* ==== stop_gradient, jacfwd, jacrev, hessian, checkpoint ========================== */

/* [v] without its tangents, at every level of differentiation. */
static Value *no_tangent_leaf(Value *v, void *ctx) {
  (void)ctx;
  while (IS_JVP_TRACER(v)) v = ((Tracer *)v)->primal;
  return val_incref(v);
}

/* stop_gradient(x): x, with a zero derivative (lax.stop_gradient) */
static Value *bi_stop_gradient(const CallArgs *a) {
  Value *x;
  if (args_bind("stop_gradient", a, "x", (Value **[]){&x}) < 0) return NULL;
  return map_leaves(x, no_tangent_leaf, NULL);
}

/* checkpoint(fun, ...) / remat: the same function; shmap keeps every
 * residual, so rematerialization changes nothing but memory. */
static Value *bi_checkpoint(const CallArgs *a) {
  if (a->nargs < 1) return err_set(ERR_TYPE, "checkpoint() missing required argument 'fun'");
  return val_incref(a->args[0]);
}

/* Basis vector [i] of aval [a]: zeros with a one at flat index i. */
static Value *basis(const AVal *a, int64_t i) {
  Array *z = arr_zeros(DT_F64, a->ndim, a->shape);
  if (!z) return NULL;
  ((double *)arr_data(z))[i] = 1.0;
  Params p;
  params_init(&p);
  params_add(&p, "new_dtype", dtype_value(a->dtype));
  params_add(&p, "weak_type", val_bool(false));
  Value *zv = &z->hdr;
  Value *r = prim_apply_rule(P_CONVERT_ELEMENT_TYPE, 1, &zv, &p);
  val_decref(zv);
  return r;
}

/* [x] reshaped to [nd] dims [shape]. */
static Value *reshape_to(Value *x, int nd, const int64_t *shape) {
  Params p;
  params_init(&p);
  params_add(&p, "new_sizes", val_int_tuple(nd, shape));
  params_add(&p, "dimensions", val_incref(VAL_NONE));
  return prim_apply_rule(P_RESHAPE, 1, &x, &p);
}

/* The [n] pieces [v] (each of [piece]'s size), stacked and shaped
 * [lead] + [piece] ([lead_first]) or [piece] + [lead]. */
static Value *stack_jacobian(Value **v, int64_t n, const AVal *lead, const AVal *piece,
                             bool lead_first) {
  int64_t m = 1, two[2];
  for (int i = 0; i < piece->ndim; i++) m *= piece->shape[i];
  two[0] = lead_first ? 1 : m;
  two[1] = lead_first ? m : 1;
  Value **cols = shm_calloc((size_t)n + 1, sizeof(Value *)), *r = NULL;
  int64_t k = 0;
  for (; cols && k < n; k++)
    if (!(cols[k] = reshape_to(v[k], 2, two))) break;
  if (cols && k == n) {
    Params p;
    params_init(&p);
    params_add(&p, "dimension", val_int(lead_first ? 0 : 1));
    Value *cat = prim_apply_rule(P_CONCATENATE, (int)n, cols, &p);
    int64_t sh[2 * SHM_MAXDIM];
    int nd = 0;
    const AVal *first = lead_first ? lead : piece, *second = lead_first ? piece : lead;
    for (int i = 0; i < first->ndim; i++) sh[nd++] = first->shape[i];
    for (int i = 0; i < second->ndim; i++) sh[nd++] = second->shape[i];
    r = cat && nd <= SHM_MAXDIM ? reshape_to(cat, nd, sh)
        : cat ? err_set(ERR_VALUE, "jacobian: more than %d dimensions", SHM_MAXDIM) : NULL;
    if (cat) val_decref(cat);
  }
  ad_values_free(cols, (int)k);
  return r;
}

enum { JAC_FUN, JAC_ARGNUM, JAC_REV, JAC_N };

/* The Jacobian of fun's array result with respect to positional argument
 * [k] (an array): result.shape + arg.shape; reverse mode a backward pass
 * per result element, forward mode a JVP per argument element. */
static Value *jac_call(Value *self, const CallArgs *a) {
  Value *fun = tuple_get(self, JAC_FUN);
  bool rev = val_truth(tuple_get(self, JAC_REV)) == 1;
  int64_t k;
  if (arr_to_index(tuple_get(self, JAC_ARGNUM), &k) < 0) return NULL;
  if (k < 0) k += a->nargs;
  if (k < 0 || k >= a->nargs || !ops_is_array(a->args[k]))
    return err_set(ERR_TYPE, "%s: argnums=%lld must name an array positional argument",
                   rev ? "jacrev" : "jacfwd", (long long)k);
  AVal xa, ya;
  if (ops_aval(a->args[k], &xa) < 0 || check_grad_inputs(a->args[k]) < 0) return NULL;
  int64_t nx = 1;
  for (int i = 0; i < xa.ndim; i++) nx *= xa.shape[i];
  Value **pieces = NULL, *r = NULL;
  int64_t n = 0, made = 0;
  if (rev) {
    bool *diff = shm_calloc((size_t)a->nargs + 1, sizeof(bool));
    Lin lin = {0};
    if (!diff) return err_nomem();
    diff[k] = true;
    int rc = linearize(fun, a, diff, false, &lin);
    shm_free(diff);
    if (rc < 0) return NULL;
    if (!ops_is_array(lin.out) || ops_aval(lin.out, &ya) < 0) {
      if (!err_occurred()) err_set(ERR_TYPE, "jacrev: the function must return an array");
      lin_free(&lin);
      return NULL;
    }
    n = 1;
    for (int i = 0; i < ya.ndim; i++) n *= ya.shape[i];
    pieces = shm_calloc((size_t)n + 1, sizeof(Value *));
    for (; pieces && made < n; made++) {
      Value *e = basis(&ya, made), **cts = e ? backward(&lin, &e) : NULL;
      if (e) val_decref(e);
      if (!cts) break;
      pieces[made] = cts[0];
      shm_free(cts);
    }
    if (pieces && made == n) r = stack_jacobian(pieces, n, &ya, &xa, true);
    lin_free(&lin);
  } else {
    n = nx;
    pieces = shm_calloc((size_t)n + 1, sizeof(Value *));
    Value **args = shm_calloc((size_t)a->nargs + 1, sizeof(Value *));
    for (; pieces && args && made < n; made++) {
      JvpTrace j;
      jvp_push(&j, NULL);
      Value *e = basis(&xa, made), *res = NULL;
      memcpy(args, a->args, sizeof(Value *) * (size_t)a->nargs);
      args[k] = e ? jvp_tracer(j.id, val_incref(a->args[k]), e) : NULL;
      if (args[k]) {
        CallArgs c = {a->nargs, args, a->nkw, a->kwnames, a->kwvals};
        res = val_call(fun, &c);
        val_decref(args[k]);
      }
      jvp_pop(&j);
      if (!res) break;
      if (!ops_is_array(res) || ops_aval(res, &ya) < 0) {
        val_decref(res);
        if (!err_occurred()) err_set(ERR_TYPE, "jacfwd: the function must return an array");
        break;
      }
      pieces[made] = tangent_of(res, j.id);
      val_decref(res);
      if (!pieces[made]) break;
    }
    shm_free(args);
    if (pieces && made == n) r = stack_jacobian(pieces, n, &xa, &ya, false);
  }
  ad_values_free(pieces, (int)made);
  return r;
}

static Value *make_jac(const CallArgs *a, const char *who, bool rev) {
  Value *fun, *argnums = NULL;
  if (args_bind(who, a, "fun, argnums=", (Value **[]){&fun, &argnums}) < 0) return NULL;
  Value *zero = val_int(0);
  Value *cfg = tuple_pack(JAC_N, (Value *[]){fun, argnums ? argnums : zero, val_bool(rev)});
  val_decref(zero);
  Value *r = cfg ? bound_new(who, jac_call, cfg) : NULL;
  if (cfg) val_decref(cfg);
  return r;
}

static Value *bi_jacfwd(const CallArgs *a) { return make_jac(a, "jacfwd", false); }
static Value *bi_jacrev(const CallArgs *a) { return make_jac(a, "jacrev", true); }

/* hessian(fun, argnums=0) = jacfwd(jacrev(fun)) */
static Value *bi_hessian(const CallArgs *a) {
  Value *inner = make_jac(a, "jacrev", true);
  if (!inner) return NULL;
  Value *argnums = a->nargs > 1 ? a->args[1] : NULL;
  for (int i = 0; i < a->nkw; i++)
    if (!strcmp(a->kwnames[i], "argnums")) argnums = a->kwvals[i];
  Value *zero = val_int(0);
  Value *cfg = tuple_pack(JAC_N, (Value *[]){inner, argnums ? argnums : zero, val_bool(false)});
  val_decref(zero);
  val_decref(inner);
  Value *r = cfg ? bound_new("hessian", jac_call, cfg) : NULL;
  if (cfg) val_decref(cfg);
  return r;
}

/* ==== queries for control flow ================================================ */

/* Whether tracer [v] is being differentiated ([reverse]: in reverse mode,
 * looking through batch tracers' values and forward JVP tracers'
 * primals, as a batched or forward-differentiated value may carry a
 * reverse-mode one inside it). */
static bool tracer_ad(Value *v, bool reverse) {
  while (IS_TRACER(v)) {
    Tracer *t = (Tracer *)v;
    if (t->kind == TR_JVP) {
      JvpTrace *j = jvp_find(t->trace_id);
      if (!reverse || (j && j->lin)) return true;
      v = t->primal;
    } else if (reverse && t->kind == TR_BATCH) {
      v = t->batched;
    } else {
      return false;
    }
  }
  return false;
}

static bool leaf_pred(Value *tree, bool reverse) {
  PyLeaves l = {0};
  if (leaves_of(tree, &l) < 0) {
    err_clear();
    return false;
  }
  bool found = false;
  for (int i = 0; i < l.n && !found; i++) found = tracer_ad(l.v[i], reverse);
  pytree_leaves_free(&l);
  return found;
}

bool ad_reverse_active(void) {
  for (JvpTrace *j = jvp_top; j; j = j->parent)
    if (j->lin) return true;
  return false;
}

bool ad_reverse_leaf(Value *tree) { return leaf_pred(tree, true); }

/* The leaf of [own] for the leaf [sel] of the selected tree: a reverse-
 * mode JVP tracer with [own]'s primal and [sel]'s tangent, or [own]. */
static Value *keep_primal(Value *sel, Value *own) {
  JvpTrace *j = IS_JVP_TRACER(sel) ? jvp_find(((Tracer *)sel)->trace_id) : NULL;
  if (!j || !j->lin) return val_incref(own);
  return jvp_tracer(j->id, primal_of(own, j->id), val_incref(((Tracer *)sel)->tangent));
}

Value *ad_keep_primals(Value *sel, Value *own) {
  PyLeaves ls = {0}, lo = {0};
  Value **vals = NULL, *r = NULL;
  int k = 0;
  /* [sel] was selected from trees of [own]'s structure: the leaves pair up */
  if (leaves_of(sel, &ls) < 0 || leaves_of(own, &lo) < 0) goto out;
  if (!(vals = shm_calloc((size_t)lo.n + 1, sizeof(Value *)))) {
    err_nomem();
    goto out;
  }
  for (; k < lo.n; k++)
    if (!(vals[k] = k < ls.n ? keep_primal(ls.v[k], lo.v[k]) : val_incref(lo.v[k]))) goto out;
  r = rebuild(own, vals);
out:
  ad_values_free(vals, k);
  pytree_leaves_free(&ls);
  pytree_leaves_free(&lo);
  return r;
}
bool ad_has_jvp_leaf(Value *tree) { return leaf_pred(tree, false); }

/* jax._primitive_table(): per primitive of the table, a dict of its name,
 * kind ('higher' for cond, while, scan, pjit, shard_map, debug_callback),
 * which rules it has (jvp, transpose, batch, sharding) and how often its
 * JVP and transpose rules have run (jvp_runs, transpose_runs) and its
 * sharding rule was kept on split operands (sharding_runs).  For tests. */
static Value *bi_primitive_table(const CallArgs *a) {
  if (a->nargs || a->nkw) return err_set(ERR_TYPE, "_primitive_table() takes no arguments");
  Value *l = list_new(P_COUNT);
  for (int i = 0; l && i < P_COUNT; i++) {
    const PrimInfo *p = &prim_table[i];
    Value *d = dict_new(), *name = str_from(p->name);
    Value *vals[] = {
        name, str_from(p->kind == PK_HIGHER ? "higher" : "first-order"),
        val_incref(val_bool(p->rules.jvp != NULL)), val_incref(val_bool(p->rules.transpose != NULL)),
        val_incref(val_bool(p->rules.batch != NULL)),
        arr_value(arr_scalar_i64(DT_I64, atomic_load(&jvp_runs[i]), true)),
        arr_value(arr_scalar_i64(DT_I64, atomic_load(&transpose_runs[i]), true)),
        val_incref(val_bool(p->rules.sharding != NULL)),
        arr_value(arr_scalar_i64(DT_I64, prim_sharding_runs((PrimId)i), true))};
    static const char *const keys[] = {"name", "kind", "jvp", "transpose", "batch", "jvp_runs",
                                       "transpose_runs", "sharding", "sharding_runs"};
    int rc = d ? 0 : -1;
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
      if (rc == 0) rc = vals[k] ? dict_set_str(d, keys[k], vals[k]) : -1;
      if (vals[k]) val_decref(vals[k]);
    }
    if (rc < 0 || list_append_steal(l, d) < 0) {
      if (rc < 0 && d) val_decref(d);
      val_decref(l);
      return err_occurred() ? NULL : err_nomem();
    }
  }
  return l ? l : err_nomem();
}

/* ==== registration ============================================================= */

static int add_both(Env *b, const char *name, BuiltinFn fn, const char *doc) {
  Value *v = builtin_new(name, fn, doc);
  int rc = v && env_set(b, intern_cstr(name), v) == 0 && builtins_add_to("jax", name, v) == 0 ? 0 : -1;
  if (v) val_decref(v);
  return rc;
}

int ad_register(Env *b) {
  trace_set_kind(TR_JVP, ad_apply, ad_truth);
  shardmap_set_differentiator(ad_shard_map);
  if (add_both(b, "grad", bi_grad, "grad(fun, argnums=0, has_aux=False)") < 0 ||
      add_both(b, "value_and_grad", bi_value_and_grad,
               "value_and_grad(fun, argnums=0, has_aux=False)") < 0 ||
      add_both(b, "vjp", bi_vjp, "vjp(fun, *primals, has_aux=False)") < 0 ||
      add_both(b, "linearize", bi_linearize, "linearize(fun, *primals, has_aux=False)") < 0 ||
      add_both(b, "jvp", bi_jvp, "jvp(fun, primals, tangents, has_aux=False)") < 0 ||
      add_both(b, "jacfwd", bi_jacfwd, "jacfwd(fun, argnums=0)") < 0 ||
      add_both(b, "jacrev", bi_jacrev, "jacrev(fun, argnums=0)") < 0 ||
      add_both(b, "jacobian", bi_jacrev, "jacobian(fun, argnums=0): jacrev") < 0 ||
      add_both(b, "hessian", bi_hessian, "hessian(fun, argnums=0)") < 0 ||
      add_both(b, "checkpoint", bi_checkpoint, "checkpoint(fun, ...): fun") < 0 ||
      add_both(b, "remat", bi_checkpoint, "remat(fun, ...): fun") < 0)
    return -1;
  Value *pt = builtin_new("_primitive_table", bi_primitive_table,
                          "_primitive_table(): the primitives, their rules and rule runs");
  int prc = pt ? builtins_add_to("jax", "_primitive_table", pt) : -1;
  if (pt) val_decref(pt);
  if (prc < 0) return -1;
  Value *sg = builtin_new("stop_gradient", bi_stop_gradient, "stop_gradient(x)");
  int rc = sg && builtins_add_to("lax", "stop_gradient", sg) == 0 ? 0 : -1;
  if (sg) val_decref(sg);
  if (rc < 0) return -1;
  return 0;
}
