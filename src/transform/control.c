/*
 * control.c - cond, switch, while_loop, fori_loop, scan (control.h).
 */
#include <stdatomic.h>
#include <string.h>

#include "array/array.h"
#include "lang/builtins.h"
#include "transform/ad.h"
#include "transform/batch.h"
#include "transform/control.h"
#include "transform/higher.h"
#include "transform/jit.h"
#include "transform/partition.h"
#include "base/intern.h"
#include "base/mem.h"
#include "spmd/collective.h"
#include "spmd/device.h"
#include "spmd/sharding.h"
#include "lang/ops.h"
#include "lang/pytree.h"
#include "transform/trace.h"

/* ==== pytrees (lang/pytree.h): array leaves are traced, the rest static ==== */

typedef PyLeaves Leaves;

static bool array_leaf(Value *v) { return ops_is_array(v); }

static int leaves_push(Leaves *l, Value *v) { return pytree_push(l, v); }

/* The array leaves of [t]; its other leaves are static. */
static int flatten(Value *t, Leaves *l) { return pytree_flatten(t, array_leaf, l); }

/* [t] with its array leaves replaced by [vals] from [*pos]. */
static Value *replace(Value *t, Value **vals, int *pos) {
  return pytree_replace(t, array_leaf, vals, pos);
}

static int eager_carry_check(const char *what, Value *init, Value *next);
static void values_free(Value **v, int n);

/* [t] (stolen) with its Python-number leaves made arrays (copies without
 * the host mark, array.h): what a control-flow primitive returns is
 * arrays, as in JAX, even when it ran eagerly on Python numbers.  NULL
 * in, NULL out; NULL with the error set on out of memory. */
static Value *array_results(Value *t) {
  Leaves l = {0};
  if (!t) return NULL;
  if (flatten(t, &l) < 0) {
    val_decref(t);
    return NULL;
  }
  bool any = false;
  for (int i = 0; i < l.n; i++) any |= arr_is_host(l.v[i]);
  if (!any) {
    pytree_leaves_free(&l);
    return t;
  }
  Value **vals = shm_calloc((size_t)l.n + 1, sizeof(Value *));
  Value *r = NULL;
  bool ok = vals != NULL;
  for (int i = 0; ok && i < l.n; i++)
    ok = (vals[i] = arr_is_host(l.v[i]) ? (Value *)arr_copy(AS_ARRAY(l.v[i]))
                                        : val_incref(l.v[i])) != NULL;
  if (ok) {
    int pos = 0;
    r = replace(t, vals, &pos);
  } else if (!vals) {
    err_nomem();
  }
  values_free(vals, l.n);
  val_decref(t);
  pytree_leaves_free(&l);
  return r;
}

static int avals_of(Leaves *l, AVal **out) {
  *out = shm_calloc((size_t)l->n + 1, sizeof(AVal));
  if (!*out) return err_nomem(), -1;
  for (int i = 0; i < l->n; i++)
    if (ops_aval(l->v[i], &(*out)[i]) < 0) return -1;
  return 0;
}

static void values_free(Value **v, int n) {
  for (int i = 0; v && i < n; i++) val_decref(v[i]);
  shm_free(v);
}

/* ==== tracing a sub-plan ========================================================= */

/* What a traced function gave: its plan, result structure and captures. */
typedef struct Sub {
  Plan *plan;
  Value *out_tree;
  Value **caps;
  int ncap;
} Sub;

static void sub_free(Sub *s) {
  val_decref(s->plan ? &s->plan->hdr : NULL);
  val_decref(s->out_tree);
  trace_caps_free(s->caps, s->ncap);
  memset(s, 0, sizeof *s);
}

/* Builds the traced function's result from its input tracers. */
typedef Value *(*BodyFn)(void *ctx, Value **tracers);

/* Traces [body] in a nested trace with [n] inputs of avals [avals], each
 * with the named shape of [src]'s value (in a staged xmap body; trace.h),
 * or none when [src] is NULL. */
static int sub_trace(const char *name, BodyFn body, void *ctx, int n, const AVal *avals,
                     Value *const *src, Sub *s) {
  memset(s, 0, sizeof *s);
  Trace *t = trace_begin(name, false);
  if (!t) return -1;
  Value **tr = shm_calloc((size_t)n + 1, sizeof(Value *));
  Value *r = NULL;
  Leaves out = {0};
  for (int i = 0; tr && i < n; i++)
    if (!(tr[i] = trace_new_arg_named(t, &avals[i], src ? trace_named(src[i]) : NULL, NULL))) goto fail;
  if (!tr || !(r = body(ctx, tr)) || flatten(r, &out) < 0) goto fail;
  s->plan = trace_end(t, out.n, out.v, &s->caps, &s->ncap);
  s->out_tree = r;
  values_free(tr, n);
  pytree_leaves_free(&out);
  if (s->plan) return 0;
  sub_free(s);
  return -1;
fail:
  if (!tr) err_nomem();
  values_free(tr, n);
  pytree_leaves_free(&out);
  val_decref(r);
  trace_abort(t);
  return -1;
}

/* Explicit mode's check of [s], traced on the [n] values [v]
 * (part_check_sub): its sharding rules' errors raised, as JAX's tracing
 * of a branch or loop body raises them whether or not it runs.  0, or
 * -1 with the error. */
static int sub_check(const Sub *s, int n, Value *const *v) {
  if (s->plan->nin != s->ncap + n) return 0;
  Value **in = shm_calloc((size_t)(s->ncap + n) + 1, sizeof(Value *));
  if (!in) return err_nomem(), -1;
  shm_memcpy(in, s->caps, sizeof(Value *) * (size_t)s->ncap);
  shm_memcpy(in + s->ncap, v, sizeof(Value *) * (size_t)n);
  int rc = part_check_sub(s->plan, in);
  shm_free(in);
  return rc;
}

/* The common case: [fn] called on [nargs] trees whose leaves become tracers. */
typedef struct CallCtx {
  Value *fn;
  int nargs;
  Value **trees;
} CallCtx;

static Value *call_body(void *vctx, Value **tracers) {
  CallCtx *c = vctx;
  Value *args[16];
  int pos = 0, i;
  if (c->nargs > 16) return err_set(ERR_TYPE, "too many arguments");
  for (i = 0; i < c->nargs; i++)
    if (!(args[i] = replace(c->trees[i], tracers, &pos))) break;
  Value *r = i == c->nargs ? val_call_n(c->fn, c->nargs, args) : NULL;
  for (int k = 0; k < i; k++) val_decref(args[k]);
  return r;
}

static const char *fn_name(Value *fn) {
  return fn->type == V_FUNC ? ((Func *)fn)->name : intern_cstr("<fn>");
}

static int trace_fn(Value *fn, int nargs, Value **trees, int n, const AVal *avals, Value *const *src,
                    Sub *s) {
  CallCtx c = {fn, nargs, trees};
  return sub_trace(fn_name(fn), call_body, &c, n, avals, src, s);
}

static void out_aval(const Sub *s, int i, AVal *a) { plan_atom_aval(s->plan, &s->plan->outs[i], a); }

static void aval_text(const AVal *a, char *buf, size_t cap) { aval_str(buf, cap, a->dtype, a->ndim, a->shape); }

static bool same_type(const AVal *a, const AVal *b) {
  return a->dtype == b->dtype && a->ndim == b->ndim &&
         !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim);
}

/* The named shapes of [prim]'s results in a staged xmap body: its row's
 * rule (higher.h).  NULL with the error set. */
static NamedShape *results_named(PrimId prim, const Params *p, int nops, Value **ops, int nout) {
  NamedShape *ns = shm_calloc((size_t)nout + 1, sizeof(NamedShape));
  if (!ns) return err_nomem();
  if (higher_rules(prim)->named(p, nops, ops, nout, ns) < 0) {
    shm_free(ns);
    return NULL;
  }
  return ns;
}

/* Records [prim] with [p] over [ops], giving the results the structure
 * of [tree]. */
static Value *emit_tree(PrimId prim, Params *p, int nops, Value **ops, int nout, const AVal *avs,
                        Value *tree) {
  NamedShape *named = results_named(prim, p, nops, ops, nout);
  if (!named) {
    params_clear(p);
    return NULL;
  }
  Value *res = trace_emit_named(prim, p, nops, ops, nout, avs, named);
  shm_free(named);
  if (!res) return NULL;
  int pos = 0;
  Value *r = replace(tree, ((Tuple *)res)->items, &pos);
  val_decref(res);
  return r;
}

/* ==== cond and switch ============================================================== */

/* The captures of every branch, in order, each once. */
static int union_caps(Sub *br, int nb, Leaves *all) {
  for (int b = 0; b < nb; b++)
    for (int i = 0; i < br[b].ncap; i++) {
      int k = 0;
      while (k < all->n && all->v[k] != br[b].caps[i]) k++;
      if (k == all->n && leaves_push(all, br[b].caps[i]) < 0) return -1;
    }
  return 0;
}

/* Gives branch [s] the invars (all captures..., operands...). */
static int align_branch(Sub *s, Leaves *all) {
  Plan *p = s->plan;
  int *vars = shm_calloc((size_t)(all->n + p->nin) + 1, sizeof(int));
  if (!vars) return err_nomem(), -1;
  for (int k = 0; k < all->n; k++) {
    int i = 0;
    while (i < s->ncap && s->caps[i] != all->v[k]) i++;
    if (i < s->ncap) {
      vars[k] = p->invars[i];
      continue;
    }
    AVal a;
    if (ops_aval(all->v[k], &a) < 0 || (vars[k] = plan_add_var(p, &a)) < 0) {
      shm_free(vars);
      return -1;
    }
  }
  if (p->nin > s->ncap)   /* a branch of no operands may have no invars array */
    shm_memcpy(vars + all->n, p->invars + s->ncap, sizeof(int) * (size_t)(p->nin - s->ncap));
  shm_free(p->invars);
  p->invars = vars;
  p->nin = all->n + p->nin - s->ncap;
  return 0;
}

/* Checks that every branch returns the types of the first; the out avals,
 * each varying over the axes any branch's varies over.  The index's axes
 * do not join them: current JAX types a cond's results by its branches
 * alone (jax/_src/lax/control_flow/conditionals.py), and eagerly each
 * device's result is its branch's. */
static int branch_types(Sub *br, int nb, AVal **out) {
  int n = br[0].plan->nout;
  *out = shm_calloc((size_t)n + 1, sizeof(AVal));
  if (!*out) return err_nomem(), -1;
  for (int i = 0; i < n; i++) out_aval(&br[0], i, &(*out)[i]);
  for (int b = 1; b < nb; b++) {
    /* a list is not a tuple, as JAX's trees tell them apart */
    int same = pytree_same_structure(br[0].out_tree, br[b].out_tree);
    if (same < 0) return -1;
    if (!same) {
      err_set(ERR_TYPE, "cond branches must return the same tree structure: branch 0 returns "
                        "a %s, branch %d a %s", val_type_name(br[0].out_tree), b,
              val_type_name(br[b].out_tree));
      return -1;
    }
    bool ok = br[b].plan->nout == n;
    for (int i = 0; ok && i < n; i++) {
      AVal a;
      out_aval(&br[b], i, &a);
      ok = same_type(&a, &(*out)[i]);
      (*out)[i].weak &= a.weak;
      (*out)[i].vma |= a.vma;
    }
    if (!ok) {
      char x[256] = "", y[256] = "";
      AVal a;
      if (n) out_aval(&br[0], 0, &a), aval_text(&a, x, sizeof x);
      if (br[b].plan->nout) out_aval(&br[b], 0, &a), aval_text(&a, y, sizeof y);
      err_set(ERR_TYPE, "cond branches must return the same types: branch 0 returns %d value%s (%s...), "
                        "branch %d returns %d (%s...)", n, n == 1 ? "" : "s", x, b, br[b].plan->nout, y);
      return -1;
    }
  }
  return 0;
}

/* Whether the pending error is Explicit mode's ShardingTypeError (a
 * rule's verdict on the operands' types, which tracing a branch or a
 * loop body JAX's way reports whether or not that code then runs). */
static bool sharding_type_error(void) {
  return err_occurred() && err_kind() == ERR_TYPE &&
         !strncmp(err_message(), "ShardingTypeError: ", 19);
}

/* The [i]th branch traced of [nb]: a cond's ([is_bool]; fns[1] its
 * true_fun) true branch first, as JAX's cond traces (true_fun,
 * false_fun); a switch's in order. */
static int trace_order(bool is_bool, int nb, int i) { return is_bool ? nb - 1 - i : i; }

/* Stages a cond over [nb] branches with index [idx] (an i32 scalar);
 * [is_bool]: lax.cond's two (trace_order). */
static Value *staged_cond(Value *idx, bool is_bool, int nb, Value **fns, int nops, Value **opv) {
  Value *ops_tree = tuple_pack((size_t)nops, opv);
  Leaves leaves = {0}, all = {0};
  AVal *avs = NULL, *outs = NULL;
  Sub *br = shm_calloc((size_t)nb, sizeof(Sub));
  Value *r = NULL, *plans = NULL, **opsall = NULL;
  int b = 0;
  if (!ops_tree || !br || flatten(ops_tree, &leaves) < 0 || avals_of(&leaves, &avs) < 0) goto out;
  for (; b < nb; b++) {
    int k = trace_order(is_bool, nb, b);
    if (trace_fn(fns[k], nops, ((Tuple *)ops_tree)->items, leaves.n, avs, leaves.v, &br[k]) < 0 ||
        sub_check(&br[k], leaves.n, leaves.v) < 0)
      goto out;
  }
  if (union_caps(br, nb, &all) < 0 || branch_types(br, nb, &outs) < 0)
    goto out;
  if (!(plans = tuple_new((size_t)nb))) goto out;
  for (int k = 0; k < nb; k++) tuple_set_steal(plans, (size_t)k, val_incref(&br[k].plan->hdr));
  for (int k = 0; k < nb; k++)
    if (align_branch(&br[k], &all) < 0) goto out;
  if (!(opsall = shm_calloc((size_t)(1 + all.n + leaves.n), sizeof(Value *)))) goto out;
  opsall[0] = idx;
  shm_memcpy(opsall + 1, all.v, sizeof(Value *) * (size_t)all.n);
  shm_memcpy(opsall + 1 + all.n, leaves.v, sizeof(Value *) * (size_t)leaves.n);
  Params p;
  params_init(&p);
  params_add(&p, "branches", val_incref(plans));
  trace_set_true_first(is_bool);
  r = emit_tree(P_COND, &p, 1 + all.n + leaves.n, opsall, br[0].plan->nout, outs, br[0].out_tree);
  trace_set_true_first(false);
out:
  for (int k = 0; br && k < nb; k++) sub_free(&br[k]);
  shm_free(br);
  val_decref(ops_tree);
  val_decref(plans);
  pytree_leaves_free(&leaves);
  pytree_leaves_free(&all);
  shm_free(avs);
  shm_free(outs);
  shm_free(opsall);
  return r;
}

static bool all_concrete(const Leaves *l);

/* Why result [k] of the traced branches [br] ([nb]) varies over the
 * axes [added]: a primitive of a branch that makes it (plan_vma_whys),
 * as jit's check names it; {0}: none found. */
static VmaWhy branch_why(const Sub *br, int nb, int k, uint32_t added) {
  VmaWhy w = {0};
  for (int b = 0; b < nb && !w.prim; b++) {
    const Plan *p = br[b].plan;
    VmaWhy *why = k < p->nout && p->outs[k].var >= 0
                  ? shm_calloc((size_t)p->nvars + 1, sizeof(VmaWhy)) : NULL;
    if (!why) continue;
    plan_vma_whys(p, why);
    VmaWhy o = why[p->outs[k].var];
    if (o.prim && (o.axes & added)) w = o;
    shm_free(why);
  }
  return w;
}

/* [x] (borrowed) typed as varying over the axes [vma] too (a view), its
 * reason [why] when it explains them: the staged cond's type, which an
 * untaken branch that varies makes vary, as JAX types it.  New ref. */
static Value *also_varying(Value *x, uint32_t vma, VmaWhy why) {
  if (!IS_ARRAY(x) || !(vma & ~AS_ARRAY(x)->vma)) return val_incref(x);
  Array *a = AS_ARRAY(x), *v = arr_view(a, a->ndim, a->shape, a->strides, a->offset);
  if (!v) return NULL;
  if (why.axes & vma & ~a->vma) v->why = why;
  v->vma |= vma;
  return &v->hdr;
}

/* The leaves of an eager branch's results [r] (stolen) given the types
 * [outs] of the staged cond, traced as [br] ([nb]): dtype and weak type
 * joined over branches, and the mesh axes any branch's varies over. */
static Value *retype_results(Value *r, const AVal *outs, int nout, const Sub *br, int nb) {
  Leaves l = {0};
  if (flatten(r, &l) < 0 || l.n != nout) {
    pytree_leaves_free(&l);
    return r;
  }
  Value **vals = shm_calloc((size_t)nout + 1, sizeof(Value *));
  int k = 0;
  for (; vals && k < nout; k++) {
    AVal a;
    if (ops_aval(l.v[k], &a) < 0) break;
    bool same = a.dtype == outs[k].dtype && a.weak == outs[k].weak;
    Value *c = same ? val_incref(l.v[k]) : ops_convert(l.v[k], outs[k].dtype, outs[k].weak);
    uint32_t added = outs[k].vma & ~a.vma;
    vals[k] = c && added ? also_varying(c, outs[k].vma, branch_why(br, nb, k, added)) : c;
    if (c && added) val_decref(c);
    if (!vals[k]) break;
  }
  Value *res = NULL;
  if (k == nout) {
    int pos = 0;
    res = replace(r, vals, &pos);
  } else if (!vals) {
    err_nomem();
  }
  values_free(vals, k);
  pytree_leaves_free(&l);
  val_decref(r);
  return res;
}

/* The jit of an eager cond on sharded operands: self is (is_bool, the
 * branches' tuple); called on (the branch index, *operands). */
static Value *cond_jit_body(Value *self, const CallArgs *a) {
  bool is_bool = val_truth(tuple_get(self, 0)) > 0;
  Value *fns = tuple_get(self, 1);
  if (a->nargs < 1 || a->nkw) return err_set(ERR_TYPE, "cond: the jit of an eager cond takes (index, *operands)");
  trace_transformed_operand();
  Value *r = staged_cond(a->args[0], is_bool, (int)tuple_len(fns), ((Tuple *)fns)->items, a->nargs - 1,
                         a->args + 1);
  return array_results(r);
}

/* An eager cond or switch on concrete operands laid out over Auto mesh
 * axes, running branch [taken] of [fns] ([nb]) on [opv] ([nops]) as the
 * jit of the primitive, as JAX's eager dispatch runs it: its results laid
 * out as a partitioned jit lays out a cond's (the first branch's layouts,
 * shmap(7), Propagation) whichever branch runs, so eager and jit agree
 * on layouts.  (Over Explicit axes every branch gives the same types;
 * under grad the taken branch runs inline, as jit does then.) */
static Value *cond_as_jit(bool is_bool, int nb, Value *const *fns, int taken, int nops, Value **opv) {
  Value *bt = tuple_pack((size_t)nb, (Value **)fns), *self = bt ? tuple_new(2) : NULL;
  if (!self) {
    val_decref(bt);
    return NULL;
  }
  tuple_set_steal(self, 0, val_bool(is_bool));
  tuple_set_steal(self, 1, bt);
  Value *body = bound_new("cond", cond_jit_body, self);
  val_decref(self);
  Value *j = body ? jit_new(body, 0, NULL, 0, NULL) : NULL;
  val_decref(body);
  Array *idx = j ? arr_scalar_i64(DT_I32, taken, false) : NULL;
  Value **args = idx ? shm_calloc((size_t)nops + 1, sizeof(Value *)) : NULL, *r = NULL;
  if (args) {
    args[0] = &idx->hdr;
    shm_memcpy(args + 1, opv, sizeof(Value *) * (size_t)nops);
    CallArgs c = {.nargs = nops + 1, .args = args};
    r = jit_call(j, &c);
  } else if (idx) {
    err_nomem();
  }
  shm_free(args);
  val_decref(idx ? &idx->hdr : NULL);
  val_decref(j);
  return r;
}

/* An eager cond or switch running branch [taken] of [fns], as JAX's: every
 * branch is traced first on the operands' types (in trace_order), so
 * branches returning different types, or a ShardingTypeError in a branch
 * not taken, are the error jit gives, and the taken branch's results get
 * the staged cond's types (weak only where every branch's is).  When a
 * branch cannot be traced for another reason (Python control flow on an
 * operand's values, a transformed operand), only the taken branch runs,
 * as written. */
static Value *eager_branches(bool is_bool, int nb, Value *const *fns, int taken, int nops,
                             Value **opv) {
  Value *ops_tree = tuple_pack((size_t)nops, opv), *r = NULL;
  Leaves leaves = {0};
  AVal *avs = NULL, *outs = NULL;
  Sub *br = shm_calloc((size_t)nb, sizeof(Sub));
  int b = 0, nout = 0;
  if (!ops_tree || !br || flatten(ops_tree, &leaves) < 0) goto out;
  /* values being differentiated are traced as their primals, whose types
   * they have (JAX's JVPTracer avals): grad's cond checks as jit's */
  bool concrete = all_concrete(&leaves);
  for (int i = 0; i < leaves.n; i++)
    while (IS_JVP_TRACER(leaves.v[i])) leaves.v[i] = ((Tracer *)leaves.v[i])->primal;
  if (all_concrete(&leaves) && avals_of(&leaves, &avs) == 0) {
    for (; b < nb; b++) {
      int k = trace_order(is_bool, nb, b);
      if (trace_fn(fns[k], nops, ((Tuple *)ops_tree)->items, leaves.n, avs, leaves.v, &br[k]) < 0 ||
          sub_check(&br[k], leaves.n, leaves.v) < 0)
        break;
    }
    if (b < nb && sharding_type_error()) {
      goto out;
    } else if (b < nb) {
      err_clear();
    } else if (branch_types(br, nb, &outs) < 0) {
      goto out;
    } else {
      nout = br[0].plan->nout;
    }
  } else if (err_occurred()) {
    goto out;
  }
  if (outs && concrete && !dev_ctx() && !part_traced_explicit() && part_mesh(leaves.v, leaves.n, NULL)) {
    r = cond_as_jit(is_bool, nb, fns, taken, nops, opv);
  } else {
    r = val_call_n(fns[taken], nops, opv);
    if (r && outs) r = retype_results(r, outs, nout, br, nb);
  }
out:
  for (int k = 0; br && k < nb; k++) sub_free(&br[k]);
  shm_free(br);
  val_decref(ops_tree);
  pytree_leaves_free(&leaves);
  shm_free(avs);
  shm_free(outs);
  return r;
}

/* A scalar predicate's truth, or an error naming its shape. */
static int check_scalar(Value *v, const char *what) {
  AVal a;
  if (ops_aval(v, &a) < 0) return -1;
  if (a.ndim == 0) return 0;
  char buf[256];
  aval_text(&a, buf, sizeof buf);
  err_set(ERR_TYPE, "%s must be a scalar, got %s", what, buf);
  return -1;
}

/* ==== a batched predicate (vmap): every branch, then a selection ============ */

/* Whether staging failed only because a value being transformed (by
 * grad, jvp or vmap) reached the sub-plans: then the control flow runs
 * unstaged inside the enclosing jit instead, its operations recorded one
 * by one (a loop with static bounds unrolled, both branches of a cond
 * computed and selected), which the transformations see through.  The
 * staging error is cleared. */
static bool unstage(void) {
  if (!trace_transformed_operand()) return false;
  err_clear();
  return true;
}

/* Each leaf of [on_true] where [pred] holds, of [on_false] elsewhere (the
 * trees alike): jnp.where leaf by leaf. */
static Value *select_trees(Value *pred, Value *on_true, Value *on_false) {
  Leaves lt = {0}, lf = {0};
  Value **vals = NULL, *r = NULL;
  int k = 0;
  if (flatten(on_true, &lt) < 0 || flatten(on_false, &lf) < 0) goto out;
  if (lt.n != lf.n) {
    err_set(ERR_TYPE, "the branches returned different structures (%d and %d leaves)", lt.n, lf.n);
    goto out;
  }
  if (!(vals = shm_calloc((size_t)lt.n + 1, sizeof(Value *)))) goto out;
  for (; k < lt.n; k++)
    if (!(vals[k] = ops_select(pred, lt.v[k], lf.v[k]))) goto out;
  int pos = 0;
  r = replace(on_true, vals, &pos);
out:
  values_free(vals, k);
  pytree_leaves_free(&lt);
  pytree_leaves_free(&lf);
  return r;
}

/* Every branch of [fns] run on [ops] in trace_order: a new array of
 * [nb] results, or NULL with the error set. */
static Value **all_branches(bool is_bool, int nb, Value *const *fns, int nops, Value **ops) {
  Value **res = shm_calloc((size_t)nb + 1, sizeof(Value *));
  if (!res) return err_nomem();
  for (int i = 0; i < nb; i++) {
    int k = trace_order(is_bool, nb, i);
    if (!(res[k] = val_call_n(fns[k], nops, ops))) {
      for (int j = 0; j < nb; j++) val_decref(res[j]);
      shm_free(res);
      return NULL;
    }
  }
  return res;
}

/* Each result leaf of the branches' results [res] selected by [index]
 * (a predicate when [is_bool], else an i32 index in range). */
static Value *select_branches(Value *index, bool is_bool, int nb, Value **res) {
  if (is_bool) return select_trees(index, res[1], res[0]);
  Value *r = val_incref(res[nb - 1]);
  for (int i = nb - 2; r && i >= 0; i--) {
    Value *iv = val_int(i), *eq = iv ? ops_compare(OP_EQ, index, iv) : NULL;
    Value *s = eq ? select_trees(eq, res[i], r) : NULL;
    val_decref(iv);
    val_decref(eq);
    val_decref(r);
    r = s;
  }
  return r;
}

/* A cond or switch whose index differs between the examples of a vmap:
 * every branch runs, and each result leaf is selected by the index, as
 * JAX's batching rule of cond does. */
static Value *batched_branches(Value *index, bool is_bool, int nb, Value *const *fns, int nops,
                               Value **ops) {
  Value **res = all_branches(is_bool, nb, fns, nops, ops);
  Value *r = res ? select_branches(index, is_bool, nb, res) : NULL;
  if (res) values_free(res, nb);
  return r;
}

/* An eager cond or switch running branch [taken]; [index] is the
 * predicate when [is_bool], else an i32 index in range.  Under
 * reverse-mode differentiation, when the index varies over mesh axes,
 * the devices along them run different branches: each device would
 * record only its own branch's linear map, and the backward pass would
 * sum cotangents over those axes before transposing each device's branch
 * (wrong numbers, or different psums on different devices).  So every
 * branch runs, the tangents are selected by the index (varying over its
 * axes, one linear map on every device, as under jit), and the primal
 * results are still the taken branch's, typed by the branches alone. */
/* [leaf] typed as varying over the mesh axes of *[ctx] (bits) too: pvary,
 * the same values.  A new reference, or NULL with the error set. */
static Value *vary_leaf(Value *leaf, void *ctx) {
  uint32_t want = *(const uint32_t *)ctx;
  AVal a;
  if (ops_aval(leaf, &a) < 0) return NULL;
  if (!(want & ~a.vma)) return val_incref(leaf);
  Params q;
  params_init(&q);
  params_add(&q, "axes", coll_axis_names(want & ~a.vma));
  Value *r = prim_apply(P_PVARY, 1, &leaf, &q);
  params_clear(&q);
  return r;
}

/* Whether an operand among [opv] ([nops] trees) being differentiated
 * (or not) is laid out over a mesh (part_mesh of its primal). */
static bool laid_out(int nops, Value **opv) {
  Value *t = tuple_pack((size_t)nops, opv);
  Leaves l = {0};
  bool laid = false;
  if (t && flatten(t, &l) == 0) {
    for (int i = 0; i < l.n; i++)
      while (IS_JVP_TRACER(l.v[i])) l.v[i] = ((Tracer *)l.v[i])->primal;
    laid = all_concrete(&l) && part_mesh(l.v, l.n, NULL);
  }
  err_clear();
  pytree_leaves_free(&l);
  val_decref(t);
  return laid;
}

static Value *eager_indexed(Value *index, bool is_bool, int nb, Value *const *fns, int taken,
                            int nops, Value **opv) {
  AVal ia;
  if (ops_aval(index, &ia) < 0) return NULL;
  /* differentiated in reverse mode on operands laid out over a mesh:
   * every branch runs and the results are selected, as jit's unstaged
   * cond computes them, so the cotangents' layouts (which combine the
   * branches' transposes) are jit's too */
  bool laid = !ia.vma && ad_reverse_active() && laid_out(nops, opv);
  if (!laid && (!ia.vma || !ad_reverse_active())) return eager_branches(is_bool, nb, fns, taken, nops, opv);
  Value **res = all_branches(is_bool, nb, fns, nops, opv);
  Value *sel = res ? select_branches(index, is_bool, nb, res) : NULL;
  if (laid) {
    if (res) values_free(res, nb);
    return sel;
  }
  /* the primals typed as the selection is, varying over the index's axes
   * too, as the differentiated cond is under jit: each device's result
   * is its own branch's, so a cotangent arriving laid out over those axes
   * is not summed over them on its way in */
  Value *own = sel ? pytree_map(res[taken], array_leaf, vary_leaf, &ia.vma) : NULL;
  Value *r = own ? ad_keep_primals(sel, own) : NULL;
  val_decref(own);
  val_decref(sel);
  if (res) values_free(res, nb);
  return r;
}

/* A staged cond's branch index: pred != 0 as an i32, as JAX's cond makes
 * a number predicate a bool first (a float 0.5 is true, not index 0). */
static Value *pred_index(Value *pred) {
  AVal a;
  if (ops_aval(pred, &a) < 0) return NULL;
  if (a.dtype == DT_BOOL) return ops_convert(pred, DT_I32, false);
  Value *zero = val_int(0), *ne = zero ? ops_compare(OP_NE, pred, zero) : NULL;
  Value *r = ne ? ops_convert(ne, DT_I32, false) : NULL;
  val_decref(zero);
  val_decref(ne);
  return r;
}

/* cond(pred, true_fun, false_fun, *operands) */
static Value *bi_cond(const CallArgs *a) {
  if (a->nargs < 3 || a->nkw)
    return err_set(ERR_TYPE, "cond() takes (pred, true_fun, false_fun, *operands)");
  Value *pred = ops_to_array(a->args[0], -1);
  if (!pred || check_scalar(pred, "cond predicate") < 0) {
    val_decref(pred);
    return NULL;
  }
  Value *r = NULL;
  if (IS_BATCH_TRACER(pred)) {
    Value *fns[2] = {a->args[2], a->args[1]};
    r = batched_branches(pred, true, 2, fns, a->nargs - 3, a->args + 3);
  } else if (!trace_current()) {
    int t = val_truth(pred);
    Value *fns[2] = {a->args[2], a->args[1]};
    if (t >= 0) r = eager_indexed(pred, true, 2, fns, t ? 1 : 0, a->nargs - 3, a->args + 3);
  } else {
    Value *idx = pred_index(pred);
    Value *fns[2] = {a->args[2], a->args[1]};
    trace_transformed_operand();
    r = idx ? staged_cond(idx, true, 2, fns, a->nargs - 3, a->args + 3) : NULL;
    if (!r && unstage()) r = batched_branches(pred, true, 2, fns, a->nargs - 3, a->args + 3);
    val_decref(idx);
  }
  val_decref(pred);
  return array_results(r);
}

/* clamp(0, index, n - 1) as an i32, recorded. */
static Value *clamp_index(Value *index, int64_t n) {
  Value *i32 = ops_convert(index, DT_I32, false);
  Array *lo = arr_scalar_i64(DT_I32, 0, true), *hi = arr_scalar_i64(DT_I32, n - 1, true);
  Value *r = NULL;
  if (i32 && lo && hi) {
    Value *in[3] = {&lo->hdr, i32, &hi->hdr};
    Params p;
    params_init(&p);
    r = prim_apply(P_CLAMP, 3, in, &p);
  }
  val_decref(i32);
  val_decref(lo ? &lo->hdr : NULL);
  val_decref(hi ? &hi->hdr : NULL);
  return r;
}

/* switch(index, branches, *operands) */
static Value *bi_switch(const CallArgs *a) {
  size_t nb;
  Value *const *fns;
  if (a->nargs < 2 || a->nkw || !val_seq(a->args[1], &nb, &fns) || nb == 0)
    return err_set(ERR_TYPE, "switch() takes (index, branches, *operands) with a non-empty "
                             "sequence of branches");
  Value *index = ops_to_array(a->args[0], -1);
  if (!index || check_scalar(index, "switch index") < 0) {
    val_decref(index);
    return NULL;
  }
  Value *r = NULL;
  if (IS_BATCH_TRACER(index)) {
    Value *idx = clamp_index(index, (int64_t)nb);
    r = idx ? batched_branches(idx, false, (int)nb, fns, a->nargs - 2, a->args + 2) : NULL;
    val_decref(idx);
  } else if (!trace_current()) {
    int64_t i;
    Value *i32 = ops_convert(index, DT_I32, false);  /* as staged: a float index truncates */
    if (i32 && arr_to_index(i32, &i) == 0) {
      i = i < 0 ? 0 : i >= (int64_t)nb ? (int64_t)nb - 1 : i;
      Value *idx = clamp_index(index, (int64_t)nb);
      r = idx ? eager_indexed(idx, false, (int)nb, fns, (int)i, a->nargs - 2, a->args + 2) : NULL;
      val_decref(idx);
    }
    val_decref(i32);
  } else {
    Value *idx = clamp_index(index, (int64_t)nb);
    trace_transformed_operand();
    r = idx ? staged_cond(idx, false, (int)nb, (Value **)fns, a->nargs - 2, a->args + 2) : NULL;
    if (!r && idx && unstage()) r = batched_branches(idx, false, (int)nb, fns, a->nargs - 2, a->args + 2);
    val_decref(idx);
  }
  val_decref(index);
  return array_results(r);
}

/* ==== while_loop ================================================================== */

static int check_interrupt(void) {
  if (!atomic_load_explicit(&shm_interrupted, memory_order_relaxed)) return 0;
  err_set(ERR_INTERRUPT, "interrupted");
  return -1;
}

/* JAX's error for a while loop in reverse-mode differentiation: its trip
 * count is not known to the backward pass. */
static Value *while_reverse_error(void) {
  return err_set(ERR_VALUE, "Reverse-mode differentiation does not work for lax.while_loop or "
                            "lax.fori_loop with dynamic start/stop values. Try using lax.scan, "
                            "or using fori_loop with static start/stop.");
}

/* Whether any example of the batched predicate [c] holds: 0/1, or -1.
 * Under nested vmaps the batched value is itself batched by the outer
 * traces: the loop goes on while any example of any of them holds (the
 * select in batched_step keeps the finished ones), so every level is
 * unwrapped down to the array that holds them all. */
static int any_example(Value *c) {
  Value *b = c;
  while (IS_BATCH_TRACER(b)) b = ((Tracer *)b)->batched;
  AVal a;
  if (ops_aval(b, &a) < 0) return -1;
  int64_t axes[SHM_MAXDIM];
  for (int i = 0; i < a.ndim; i++) axes[i] = i;
  Params p;
  params_init(&p);
  params_add(&p, "axes", val_int_tuple(a.ndim, axes));
  Value *any = prim_apply(P_REDUCE_OR, 1, &b, &p);
  params_clear(&p);
  int t = any ? val_truth(any) : -1;
  val_decref(any);
  return t;
}

/* One step of a while loop whose predicate [c] is batched (vmap): the
 * body runs for every example, and the examples whose predicate is false
 * keep their carry, as JAX's batching rule of while does. */
static Value *batched_step(Value *c, Value *body_fun, Value *val) {
  Value *next = val_call_n(body_fun, 1, &val);
  Value *r = next ? select_trees(c, next, val) : NULL;
  val_decref(next);
  return r;
}

/* An eager while_loop's cond_fun result must be a bool scalar, as the
 * staged loop's is (check_pred): a number is not taken for its truth. */
static int eager_pred_check(Value *c) {
  AVal a;
  if (ops_aval(c, &a) < 0) return -1;
  if (a.ndim == 0 && a.dtype == DT_BOOL) return 0;
  char buf[256];
  aval_text(&a, buf, sizeof buf);
  err_set(ERR_TYPE, "while_loop cond_fun must return a boolean scalar, got %s", buf);
  return -1;
}

static Value *eager_while_run(Value *cond_fun, Value *body_fun, Value *init, bool *ran) {
  Value *val = val_incref(init);
  for (;;) {
    Value *c = val_call_n(cond_fun, 1, &val);
    if (c && IS_BATCH_TRACER(c)) {
      int any = eager_pred_check(c) < 0 ? -1 : any_example(c);
      *ran = *ran || any == 1;
      Value *next = any == 1 && check_interrupt() == 0 ? batched_step(c, body_fun, val) : NULL;
      val_decref(c);
      if (any == 0) return val;
      val_decref(val);
      if (!next) return NULL;
      if (eager_carry_check("while_loop body_fun", init, next) < 0) {
        val_decref(next);
        return NULL;
      }
      val = next;
      continue;
    }
    int t = c ? (eager_pred_check(c) < 0 ? -1 : val_truth(c)) : -1;
    val_decref(c);
    if (t <= 0 || check_interrupt() < 0) {
      if (t < 0 || err_occurred()) {
        val_decref(val);
        return NULL;
      }
      return val;
    }
    *ran = true;
    Value *next = val_call_n(body_fun, 1, &val);
    val_decref(val);
    if (next && (eager_carry_check("while_loop body_fun", init, next) < 0 ||
                 (ad_reverse_leaf(next) && !while_reverse_error()))) {
      val_decref(next);
      return NULL;
    }
    if (!(val = next)) return NULL;
  }
}

/* Checks a loop body's carry results against the carry avals [want];
 * weakens nothing, but strengthens [want] where the body made a weak
 * carry strong (1: retrace needed). */
/* The error of a body that changed carry leaf [i] from [want] to [got]:
 * one message, eagerly and under jit (the user's leaf numbers). */
static int carry_type_error(const char *what, int i, const AVal *want, const AVal *got) {
  char x[256], y[256];
  aval_text(want, x, sizeof x);
  aval_text(got, y, sizeof y);
  err_set(ERR_TYPE, "%s must return the carry's types: carry %d is %s, the body returns %s",
          what, i, x, y);
  return -1;
}

/* Whether a body's carry [got] keeps the mesh axes the carry [want]
 * varies over: JAX's loops type the carry's varying manual axes as part
 * of its type (jax/_src/lax/control_flow/loops.py, _check_carry_type),
 * so a body that psums a varying carry, or mixes a varying value into an
 * invariant one, changes the type.  Unchecked under check_rep=False. */
static bool same_vma(const AVal *want, const AVal *got) {
  return want->vma == got->vma || !dev_checks_vma();
}

/* The error of a body that changed carry leaf [i]'s varying axes, with
 * the fix that fits: pvary the init, or reduce inside the body. */
static int carry_vma_error(const char *what, int i, const AVal *want, const AVal *got) {
  char x[256], y[256], vx[128], vy[128];
  aval_text(want, x, sizeof x);
  aval_text(got, y, sizeof y);
  dev_vma_str(want->vma, vx, sizeof vx);
  dev_vma_str(got->vma, vy, sizeof vy);
  bool more = (got->vma & ~want->vma) != 0;
  err_set(ERR_TYPE, "%s must return the carry's types: carry %d is %s%s, the body returns %s%s, "
          "so the varying manual axes do not match (%s)", what, i, x, vx, y, vy,
          more ? "make the initial carry vary with lax.pvary" : "reduce outside the loop instead");
  return -1;
}

static int carry_count_error(const char *what, int n, int got) {
  err_set(ERR_TYPE, "%s must return the loop carry (%d value%s), got %d", what, n,
          n == 1 ? "" : "s", got);
  return -1;
}

static bool weak_promotes(const AVal *want, const AVal *got);

/* Eager loops check each new carry as jit checks the traced body's: the
 * same array leaves, each of the init's dtype and shape (a weak type may
 * become strong, or the dtype weak_promotes allows).  0, or -1 with
 * carry_types' message. */
static int eager_carry_check(const char *what, Value *init, Value *next) {
  Leaves a = {0}, b = {0};
  int rc = flatten(init, &a) < 0 || flatten(next, &b) < 0 ? -1 : 0;
  if (rc == 0 && a.n != b.n) rc = carry_count_error(what, a.n, b.n);
  for (int i = 0; rc == 0 && i < a.n; i++) {
    AVal x, y;
    if (ops_aval(a.v[i], &x) < 0 || ops_aval(b.v[i], &y) < 0) rc = -1;
    else if (!same_type(&x, &y) && !weak_promotes(&x, &y)) rc = carry_type_error(what, i, &x, &y);
    else if (!same_vma(&x, &y)) rc = carry_vma_error(what, i, &x, &y);
  }
  pytree_leaves_free(&a);
  pytree_leaves_free(&b);
  return rc;
}

/* Whether a weakly typed carry [want] takes the body's result [got]'s
 * dtype: same shape, another dtype, and the promotion of the two is
 * got's (a Python float carry that the body makes float64), as JAX
 * promotes weakly typed loop inputs before it checks the carry. */
static bool weak_promotes(const AVal *want, const AVal *got) {
  if (!want->weak || want->dtype == got->dtype || want->ndim != got->ndim ||
      memcmp(want->shape, got->shape, sizeof(int64_t) * (size_t)want->ndim))
    return false;
  bool weak;
  return dt_promote(want->dtype, true, got->dtype, got->weak, &weak) == got->dtype;
}

/* Checks the body's carry outputs [first, first + n) against [want]; the
 * first [skip] are the loop's own (fori_loop's index and bound) and are
 * not counted in messages.  1 when a weak type became strong (trace
 * again with it), 0 when they agree, -1 with the error set. */
static int carry_types(const char *what, const Sub *s, int first, int n, int skip, AVal *want) {
  if (s->plan->nout < first + n) return carry_count_error(what, n - skip, s->plan->nout - first - skip);
  int retrace = 0;
  for (int i = 0; i < n; i++) {
    AVal a;
    out_aval(s, first + i, &a);
    if (weak_promotes(&want[i], &a)) {   /* JAX converts the init, to a strong type */
      want[i].dtype = a.dtype;
      want[i].weak = false;
      retrace = 1;
      continue;
    }
    if (!same_type(&a, &want[i])) return carry_type_error(what, i - skip, &want[i], &a);
    if (!same_vma(&want[i], &a)) return carry_vma_error(what, i - skip, &want[i], &a);
    if (want[i].weak && !a.weak) {
      want[i].weak = false;
      retrace = 1;
    }
  }
  return retrace;
}

/* The leaves converted to the carry's avals (weak ones made strong). */
static Value **carry_values(Leaves *l, const AVal *want) {
  Value **v = shm_calloc((size_t)l->n + 1, sizeof(Value *));
  if (!v) return err_nomem();
  for (int i = 0; i < l->n; i++)
    if (!(v[i] = ops_convert(l->v[i], want[i].dtype, want[i].weak))) {
      values_free(v, i);
      return NULL;
    }
  return v;
}

/* Records while[body_jaxpr body_nconsts cond_jaxpr cond_nconsts]. */
static Value *emit_while(Sub *c, Sub *b, Value **init, int n, const AVal *avs, Value *tree) {
  int nops = c->ncap + b->ncap + n;
  Value **ops = shm_calloc((size_t)nops + 1, sizeof(Value *));
  if (!ops) return err_nomem();
  shm_memcpy(ops, c->caps, sizeof(Value *) * (size_t)c->ncap);
  shm_memcpy(ops + c->ncap, b->caps, sizeof(Value *) * (size_t)b->ncap);
  shm_memcpy(ops + c->ncap + b->ncap, init, sizeof(Value *) * (size_t)n);
  Params p;
  params_init(&p);
  params_add(&p, "body_jaxpr", val_incref(&b->plan->hdr));
  params_add(&p, "body_nconsts", val_int(b->ncap));
  params_add(&p, "cond_jaxpr", val_incref(&c->plan->hdr));
  params_add(&p, "cond_nconsts", val_int(c->ncap));
  Value *r = emit_tree(P_WHILE, &p, nops, ops, n, avs, tree);
  shm_free(ops);
  return r;
}

/* The two functions of a loop, as sub-trace bodies. */
typedef struct Loop {
  const char *what;   /* "while_loop body_fun", "fori_loop body_fun": for messages */
  int skip;           /* carries of the loop's own before the user's (fori: 2) */
  const char *cname, *bname;
  BodyFn cond, body;
  void *cctx, *bctx;
} Loop;

static int check_pred(const Sub *c) {
  AVal a;
  if (c->plan->nout == 1) out_aval(c, 0, &a);
  if (c->plan->nout == 1 && a.ndim == 0 && a.dtype == DT_BOOL) return 0;
  char buf[256] = "several values";
  if (c->plan->nout == 1) aval_text(&a, buf, sizeof buf);
  err_set(ERR_TYPE, "while_loop cond_fun must return a boolean scalar, got %s", buf);
  return -1;
}

/* Traces cond and body on the carry avals [avs], retracing once when the
 * body strengthens a weak carry.  *traced (when not NULL) tells a failure
 * of the types (both traced) from one of tracing itself. */
static int trace_loop_(const Loop *lp, int n, AVal *avs, Value *const *src, Sub *c, Sub *b,
                       bool *traced) {
  for (int attempt = 0; attempt < 2; attempt++) {
    if (sub_trace(lp->cname, lp->cond, lp->cctx, n, avs, src, c) < 0) return -1;
    if (check_pred(c) < 0) {   /* a type error of a traced cond_fun */
      if (traced) *traced = true;
      sub_free(c);
      return -1;
    }
    if (sub_trace(lp->bname, lp->body, lp->bctx, n, avs, src, b) < 0) {
      sub_free(c);
      return -1;
    }
    if (traced) *traced = true;
    /* the sharding rules' errors first, cond_fun's then body_fun's, as
     * JAX's tracing of them on the carry's types raises them (Explicit
     * mode), before the carry's types are compared */
    if (src && (sub_check(c, n, src) < 0 || (b->plan->nout == n && sub_check(b, n, src) < 0))) {
      sub_free(c);
      sub_free(b);
      return -1;
    }
    /* a loop body returns the carry and nothing more (scan's also ys) */
    int rt = b->plan->nout != n ? carry_count_error(lp->what, n - lp->skip, b->plan->nout - lp->skip)
                                : carry_types(lp->what, b, 0, n, lp->skip, avs);
    if (rt == 0) return 0;
    sub_free(c);
    sub_free(b);
    if (rt < 0) return -1;
  }
  err_set(ERR_TYPE, "while_loop: the carry's types do not settle");
  return -1;
}

static int trace_loop(const Loop *lp, int n, AVal *avs, Value *const *src, Sub *c, Sub *b) {
  return trace_loop_(lp, n, avs, src, c, b, NULL);
}

/* Whether every leaf of [l] is a concrete array (no tracer). */
static bool all_concrete(const Leaves *l) {
  for (int i = 0; i < l->n; i++)
    if (!IS_ARRAY(l->v[i])) return false;
  return true;
}

/* Whether a leaf of [l] (all arrays) from [from] on is a weak Python number. */
static bool any_weak(const Leaves *l, int from) {
  for (int i = from; i < l->n; i++)
    if (AS_ARRAY(l->v[i])->weak) return true;
  return false;
}

/* An eager loop's carry leaves [l] (of tree [tree]) made what the staged
 * loop's would be: when one is a weak Python number, or with [zero_trips]
 * (the body will not run), cond and body are traced once, as JAX's loops
 * always are, and the leaves converted to the settled types (a number the
 * body makes strong is strong from the start, so zero iterations give
 * what jit gives); a type error found so is raised (NULL), as jit raises
 * it however many times the loop runs.  Else, and when the body cannot
 * be traced (Python control flow on the carry's values), a new reference
 * to [tree]; a ShardingTypeError met tracing them is raised. */
static Value *settle_carry(const Loop *lp, Leaves *l, Value *tree, bool zero_trips) {
  /* the loop's own leaves (fori's bounds) do not count */
  if (!all_concrete(l) || (!zero_trips && !any_weak(l, lp->skip))) return val_incref(tree);
  AVal *avs = NULL;
  Sub c = {0}, b = {0};
  Value **cv = NULL, *r = NULL;
  bool traced = false;
  if (avals_of(l, &avs) == 0 && trace_loop_(lp, l->n, avs, l->v, &c, &b, &traced) == 0 &&
      (!zero_trips || (sub_check(&c, l->n, l->v) == 0 && sub_check(&b, l->n, l->v) == 0)) &&
      (cv = carry_values(l, avs))) {
    int pos = 0;
    r = replace(tree, cv, &pos);
  } else if (!traced && !sharding_type_error()) {
    err_clear();
    r = val_incref(tree);
  }
  values_free(cv, l->n);
  sub_free(&c);
  sub_free(&b);
  shm_free(avs);
  return r;
}

/* Stages a loop whose carry leaves are [l]; the result has [tree]'s shape. */
static Value *staged_loop(const Loop *lp, Leaves *l, Value *tree) {
  AVal *avs = NULL;
  Sub c = {0}, b = {0};
  Value *r = NULL, **init = NULL;
  if (avals_of(l, &avs) == 0 && trace_loop(lp, l->n, avs, l->v, &c, &b) == 0 &&
      (init = carry_values(l, avs))) {
    /* the carry's types are the body's, not joined with the predicate's
     * axes: JAX's while_loop abstract eval is the body's out avals */
    r = emit_while(&c, &b, init, l->n, avs, tree);
  }
  values_free(init, l->n);
  sub_free(&c);
  sub_free(&b);
  shm_free(avs);
  return r;
}

/* while_loop eagerly, its carry settled first as the staged loop's
 * (settle_carry). */
static Value *eager_while(Value *cond_fun, Value *body_fun, Value *init0) {
  if (ad_reverse_leaf(init0)) return while_reverse_error();
  /* Python numbers in the carry become arrays first, as JAX's loops make
   * them: the body computes in f32 or i32 as staged, not on doubles or
   * unbounded ints */
  Value *init = array_results(val_incref(init0));
  Leaves l = {0};
  if (!init || flatten(init, &l) < 0) {
    val_decref(init);
    return NULL;
  }
  CallCtx cc = {cond_fun, 1, &init}, bc = {body_fun, 1, &init};
  Loop lp = {"while_loop body_fun", 0, fn_name(cond_fun), fn_name(body_fun), call_body, call_body,
             &cc, &bc};
  Value *settled = settle_carry(&lp, &l, init, false);
  pytree_leaves_free(&l);
  bool ran = false;
  Value *r = settled ? eager_while_run(cond_fun, body_fun, settled, &ran) : NULL;
  if (r && !ran) {   /* the body never ran: its types are still checked */
    Leaves z = {0};
    Value *checked = flatten(settled, &z) == 0 ? settle_carry(&lp, &z, settled, true) : NULL;
    pytree_leaves_free(&z);
    if (!checked) {
      val_decref(r);
      r = NULL;
    }
    val_decref(checked);
  }
  val_decref(settled);
  val_decref(init);
  return r;
}

static Value *while_loop(Value *cf, Value *bf, Value *init);

/* The while row's rule (higher.h) of transformation [kind] (TR_JVP:
 * forward mode, TR_BATCH: vmap) for the staged loop of [cf], [bf] on
 * [init], for trace [id] (0: the innermost). */
static Value *while_rule(TracerKind kind, Value *cf, Value *bf, Value *init, unsigned id) {
  const HigherRules *h = higher_rules(P_WHILE);
  HigherLoopRule rule = !h ? NULL : kind == TR_JVP ? h->jvp_loop : h->batch_loop;
  if (!rule) {
    prim_rule_missing(P_WHILE, kind == TR_JVP ? "jvp" : "vmap");
    return NULL;
  }
  return rule(cf, bf, init, id, while_loop);
}

/* How deep this thread's while_loops run as a transformation's rule for a
 * value their bodies close over (staged_while): past WHILE_LIFT_MAX the
 * value is not taken in again.  Every level takes in one more value (a
 * jvp of a jvp, a loop in a loop's body); a value that reaches staged
 * code other than the body's own operations (an operand of a shard_map
 * the body calls, say) would be taken in again at every level. */
#define WHILE_LIFT_MAX 8
static _Thread_local int while_lifts;

/* The staged while_loop of [cf], [bf] on [init] under the current trace.
 * A body (or condition) that closes over a value being transformed, met
 * while staging it, runs as that transformation's while rule does, the
 * value among the rule's consts (the while row's jvp_loop and
 * batch_loop, higher.h: the value is differentiated or batched with the
 * carry). */
static Value *staged_while(Value *cf, Value *bf, Value *init) {
  Leaves l = {0};
  if (flatten(init, &l) < 0) return NULL;
  CallCtx cc = {cf, 1, &init}, bc = {bf, 1, &init};
  Loop lp = {"while_loop body_fun", 0, fn_name(cf), fn_name(bf), call_body, call_body, &cc, &bc};
  trace_transformed_operand();
  Value *r = staged_loop(&lp, &l, init);
  pytree_leaves_free(&l);
  TracerKind met = trace_transformed_kind();
  unsigned id = trace_transformed_id();
  if (!r && unstage()) {   /* no trip count to unroll by */
    if (ad_reverse_active()) return while_reverse_error();   /* JAX's, as eagerly */
    if (while_lifts < WHILE_LIFT_MAX && (met == TR_JVP || met == TR_BATCH)) {
      while_lifts++;
      r = while_rule(met, cf, bf, init, id);
      while_lifts--;
      return r;
    }
    if (met == TR_JVP)
      return err_set(ERR_NOT_IMPLEMENTED, "while_loop under jit whose body passes a value "
                     "being differentiated (jvp) to staged code other than its own operations "
                     "is not implemented yet: pass that value in the loop's carry, or use "
                     "fori_loop or scan");
    err_set(ERR_NOT_IMPLEMENTED, "while_loop under jit whose body passes a value being "
                                 "batched to staged code other than its own operations is "
                                 "not implemented yet; use fori_loop or scan, or transform "
                                 "outside jit");
  }
  return r;
}

/* while_loop(cond_fun, body_fun, init_val).  Under jit, a carry being
 * differentiated (forward mode) runs as one staged loop over its primals
 * and tangents (the while row's jvp_loop), a batched one over the whole
 * batch (its batch_loop), and so does a loop whose body closes over such
 * a value (staged_while); reverse mode is JAX's error. */
static Value *while_loop(Value *cf, Value *bf, Value *init) {
  if (!trace_current()) return eager_while(cf, bf, init);
  if (ad_reverse_leaf(init)) return while_reverse_error();
  if (ad_has_jvp_leaf(init)) return while_rule(TR_JVP, cf, bf, init, 0);
  if (batch_has_leaf(init)) return while_rule(TR_BATCH, cf, bf, init, 0);
  return staged_while(cf, bf, init);
}

static Value *bi_while_loop(const CallArgs *a) {
  Value *cf, *bf, *init;
  if (args_bind("while_loop", a, "cond_fun, body_fun, init_val", (Value **[]){&cf, &bf, &init}) < 0)
    return NULL;
  return array_results(while_loop(cf, bf, init));
}

/* ==== fori_loop ==================================================================== */

static Value *eager_fori_run(Value *lo, Value *hi, Value *body, Value *init);
static Value *fori_cond(void *ctx, Value **tr);
static Value *fori_body(void *vctx, Value **tr);

typedef struct ForiCtx {
  Value *body, *tree;
} ForiCtx;

/* Whether concrete bounds [lo], [hi] make a loop of no iterations (false
 * when they are not concrete integers: the loop reports that). */
static bool fori_zero_trips(Value *lo, Value *hi) {
  int64_t a, b;
  if (!IS_ARRAY(lo) || !IS_ARRAY(hi) || arr_to_index(lo, &a) < 0 || arr_to_index(hi, &b) < 0) {
    err_clear();
    return false;
  }
  return a >= b;
}

/* fori_loop eagerly, its carry settled first as the staged loop's
 * (settle_carry). */
static Value *eager_fori(Value *lo, Value *hi, Value *body, Value *init0) {
  Leaves l = {0};
  Value *tree = NULL, *settled = NULL, *r = NULL;
  Value *init = array_results(val_incref(init0));   /* as eager_while's */
  if (init && leaves_push(&l, lo) == 0 && leaves_push(&l, hi) == 0 && flatten(init, &l) == 0 &&
      (tree = tuple_pack(3, (Value *[]){lo, hi, init}))) {
    ForiCtx fc = {body, init};
    Loop lp = {"fori_loop body_fun", 2, intern_cstr("fori_cond"), fn_name(body), fori_cond,
               fori_body, NULL, &fc};
    settled = settle_carry(&lp, &l, tree, fori_zero_trips(lo, hi));
  }
  if (settled) r = eager_fori_run(lo, hi, body, tuple_get(settled, 2));
  val_decref(settled);
  val_decref(tree);
  val_decref(init);
  pytree_leaves_free(&l);
  return r;
}

static Value *eager_fori_run(Value *lo, Value *hi, Value *body, Value *init) {
  int64_t a, b;
  if (arr_to_index(lo, &a) < 0 || arr_to_index(hi, &b) < 0) return NULL;
  AVal la;
  if (ops_aval(lo, &la) < 0) return NULL;
  Value *val = val_incref(init);
  for (int64_t i = a; i < b && val; i++) {
    Array *iv = arr_scalar_i64(la.dtype, i, la.weak);
    Value *args[2] = {iv ? &iv->hdr : NULL, val};
    Value *next = iv && check_interrupt() == 0 ? val_call_n(body, 2, args) : NULL;
    val_decref(iv ? &iv->hdr : NULL);
    val_decref(val);
    if (next && eager_carry_check("fori_loop body_fun", init, next) < 0) {
      val_decref(next);
      next = NULL;
    }
    val = next;
  }
  return val;
}

/* cond of the fori while: i < upper. */
static Value *fori_cond(void *ctx, Value **tr) {
  (void)ctx;
  return ops_compare(OP_LT, tr[0], tr[1]);
}

/* One step of the fori while: (i + 1, upper, body(i, x)); [x] borrowed,
 * a new tuple or NULL. */
static Value *fori_step(Value *body, Value *i, Value *upper, Value *x) {
  Value *args[2] = {i, x};
  Value *nx = val_call_n(body, 2, args);
  Value *one = nx ? val_int(1) : NULL;
  Value *i1 = one ? ops_binary(OP_ADD, i, one) : NULL;
  val_decref(one);
  Value *r = i1 ? tuple_new(3) : NULL;
  if (!r) {
    val_decref(nx);
    val_decref(i1);
    return NULL;
  }
  tuple_set_steal(r, 0, i1);
  tuple_set_steal(r, 1, val_incref(upper));
  tuple_set_steal(r, 2, nx);
  return r;
}

/* body of the fori while over the carry's leaves [tr]. */
static Value *fori_body(void *vctx, Value **tr) {
  ForiCtx *c = vctx;
  int pos = 0;
  Value *x = replace(c->tree, tr + 2, &pos);
  Value *r = x ? fori_step(c->body, tr[0], tr[1], x) : NULL;
  val_decref(x);
  return r;
}

/* Index bounds as arrays of one integer dtype. */
static int fori_bounds(Value *lo, Value *hi, Value **lo_a, Value **hi_a) {
  *lo_a = ops_to_array(lo, -1);
  *hi_a = *lo_a ? ops_to_array(hi, -1) : NULL;
  AVal a, b;
  if (!*hi_a || ops_aval(*lo_a, &a) < 0 || ops_aval(*hi_a, &b) < 0) return -1;
  if (a.ndim || b.ndim || dt_is_float(a.dtype) || dt_is_float(b.dtype) || a.dtype == DT_BOOL ||
      b.dtype == DT_BOOL) {
    err_set(ERR_TYPE, "fori_loop bounds must be integer scalars");
    return -1;
  }
  bool weak;
  DType t = dt_promote(a.dtype, a.weak, b.dtype, b.weak, &weak);
  Value *x = ops_convert(*lo_a, t, weak), *y = x ? ops_convert(*hi_a, t, weak) : NULL;
  val_decref(*lo_a);
  val_decref(*hi_a);
  *lo_a = x;
  *hi_a = y;
  return y ? 0 : -1;
}

static Value *staged_fori(Value *lo, Value *hi, Value *body, Value *init) {
  Leaves l = {0};
  Value *r = NULL;
  if (leaves_push(&l, lo) < 0 || leaves_push(&l, hi) < 0 || flatten(init, &l) < 0) goto out;
  ForiCtx fc = {body, init};
  Loop lp = {"fori_loop body_fun", 2, intern_cstr("fori_cond"), fn_name(body), fori_cond,
             fori_body, NULL, &fc};
  Value *tree = tuple_pack(3, (Value *[]){lo, hi, init});
  Value *res = tree ? staged_loop(&lp, &l, tree) : NULL;
  if (res) r = val_incref(tuple_get(res, 2));
  val_decref(res);
  val_decref(tree);
out:
  pytree_leaves_free(&l);
  return r;
}

/* The while loop of a fori_loop whose bounds are batched (vmap): its
 * carry is (i, upper, x); cond_fun is i < upper, body_fun [self] steps i
 * and x.  As JAX does, such a fori_loop is this while_loop, so each
 * example runs its own trip count. */
static Value *fori_while_cond(Value *self, const CallArgs *a) {
  (void)self;
  Value *c = a->nargs == 1 ? a->args[0] : NULL;
  if (!c || c->type != V_TUPLE || tuple_len(c) != 3)
    return err_set(ERR_TYPE, "fori_loop: the loop's carry lost its structure");
  return ops_compare(OP_LT, tuple_get(c, 0), tuple_get(c, 1));
}

static Value *fori_while_body(Value *self, const CallArgs *a) {
  Value *c = a->nargs == 1 ? a->args[0] : NULL;
  if (!c || c->type != V_TUPLE || tuple_len(c) != 3)
    return err_set(ERR_TYPE, "fori_loop: the loop's carry lost its structure");
  return fori_step(self, tuple_get(c, 0), tuple_get(c, 1), tuple_get(c, 2));
}

/* fori_loop as the while_loop over (i, upper, carry) JAX makes of one
 * whose bounds are not static: for batched bounds, and for a body that
 * closes over a value being transformed when the bounds are traced (the
 * while_loop takes the value in; unrolling needs concrete bounds). */
static Value *fori_as_while(Value *lo, Value *hi, Value *body, Value *init) {
  Value *carry = tuple_pack(3, (Value *[]){lo, hi, init});
  Value *cf = carry ? bound_new("fori_cond", fori_while_cond, body) : NULL;
  Value *bf = cf ? bound_new("fori_body", fori_while_body, body) : NULL;
  Value *res = bf ? while_loop(cf, bf, carry) : NULL, *r = NULL;
  if (res && res->type == V_TUPLE && tuple_len(res) == 3) r = val_incref(tuple_get(res, 2));
  Value *tmp[] = {carry, cf, bf, res};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  return r;
}

/* JAX's unroll= of scan and fori_loop: an int >= 1, or a bool (True:
 * the whole [length], False: 1); None (or absent) is 1.  Into *out: 0,
 * or -1 with JAX's ValueError (TypeError for anything else). */
static int unroll_arg(Value *u, int64_t length, int64_t *out) {
  *out = 1;
  if (!u || u == VAL_NONE) return 0;
  if (!IS_ARRAY(u) || AS_ARRAY(u)->ndim != 0 || dt_is_float(AS_ARRAY(u)->dtype))
    return err_set(ERR_TYPE, "`unroll` must be a `bool` or a positive `int`, not %s",
                   val_type_name(u)), -1;
  int64_t k = arr_get_i64(AS_ARRAY(u), 0);
  if (AS_ARRAY(u)->dtype == DT_BOOL) k = k ? (length > 1 ? length : 1) : 1;
  if (k < 1) return err_set(ERR_VALUE, "`unroll` must be a `bool` or a positive `int`."), -1;
  *out = k;
  return 0;
}

/* fori_loop's unroll=: an int other than 1 needs bounds known while
 * tracing (JAX's rule: such a loop lowers to a scan). */
static int fori_unroll(Value *u, Value *lo, Value *hi) {
  int64_t l = 0, h = 0, k;
  bool known = IS_ARRAY(lo) && IS_ARRAY(hi);
  if (known && (arr_to_index(lo, &l) < 0 || arr_to_index(hi, &h) < 0)) return -1;
  if (unroll_arg(u, h - l, &k) < 0) return -1;
  /* as JAX tests it, `unroll is not False and unroll != 1`: True == 1 */
  bool plain = !u || u == VAL_NONE || AS_ARRAY(u)->dtype == DT_BOOL || k == 1;
  if (!known && !plain)
    return err_set(ERR_VALUE, "Can only use `unroll` in `fori_loop` if the loop bounds are "
                              "statically known."), -1;
  return 0;
}

/* fori_loop(lower, upper, body_fun, init_val, *, unroll=None): unroll
 * is JAX's, checked as JAX checks it (static bounds only), and changes
 * no value; the staged loop is a while either way. */
static Value *bi_fori_loop(const CallArgs *a) {
  Value *lo, *hi, *body, *init, *unr, *lo_a, *hi_a;
  if (args_bind("fori_loop", a, "lower, upper, body_fun, init_val, unroll=",
                (Value **[]){&lo, &hi, &body, &init, &unr}) < 0)
    return NULL;
  Value *r = NULL;
  if (fori_bounds(lo, hi, &lo_a, &hi_a) == 0 && fori_unroll(unr, lo_a, hi_a) == 0) {
    trace_transformed_operand();
    if (IS_BATCH_TRACER(lo_a) || IS_BATCH_TRACER(hi_a))
      r = fori_as_while(lo_a, hi_a, body, init);
    else
      r = trace_current() ? staged_fori(lo_a, hi_a, body, init) : eager_fori(lo_a, hi_a, body, init);
    if (!r && trace_current() && unstage())
      r = IS_ARRAY(lo_a) && IS_ARRAY(hi_a) ? eager_fori(lo_a, hi_a, body, init)
                                           : fori_as_while(lo_a, hi_a, body, init);
  }
  val_decref(lo_a);
  val_decref(hi_a);
  return array_results(r);
}

/* ==== scan ======================================================================== */

/* The common leading length of the xs leaves ([length] may preset it). */
static int scan_length(Leaves *xs, Value *length, int64_t *n) {
  *n = -1;
  if (length && length != VAL_NONE && arr_to_index(length, n) < 0) return -1;
  for (int i = 0; i < xs->n; i++) {
    AVal a;
    if (ops_aval(xs->v[i], &a) < 0) return -1;
    if (a.ndim == 0) return err_set(ERR_TYPE, "scan: xs leaves must have a leading axis, got a scalar"), -1;
    if (*n >= 0 && a.shape[0] != *n)
      return err_set(ERR_VALUE, "scan: xs leaves have different lengths (%lld and %lld)",
                     (long long)*n, (long long)a.shape[0]), -1;
    *n = a.shape[0];
  }
  if (*n < 0) return err_set(ERR_VALUE, "scan: length must be given when xs is None"), -1;
  return 0;
}

/* The (carry, y) pair a scan body returns. */
static int scan_pair(Value *r, Value **carry, Value **y) {
  if (r->type != V_TUPLE || tuple_len(r) != 2) {
    err_set(ERR_TYPE, "scan body must return a pair (carry, y), got %s",
            ops_is_array(r) ? "an array" : val_type_name(r));
    return -1;
  }
  *carry = tuple_get(r, 0);
  *y = tuple_get(r, 1);
  return 0;
}

/* Stacks rows that are not all concrete (values being differentiated):
 * through the primitives, so their rules apply. */
static Value *stack_traced(Value **rows, int64_t n, const AVal *row) {
  int64_t shape[SHM_MAXDIM];
  shape[0] = 1;
  shm_memcpy(shape + 1, row->shape, sizeof(int64_t) * (size_t)row->ndim);
  Value **ones = shm_calloc((size_t)n + 1, sizeof(Value *)), *r = NULL;
  int64_t k = 0;
  if (!ones) return err_nomem();
  for (; k < n; k++)
    if (!(ones[k] = ops_reshape(rows[k], row->ndim + 1, shape))) goto out;
  Params p;
  params_init(&p);
  params_add(&p, "dimension", val_int(0));
  r = ops_apply(P_CONCATENATE, (int)n, ones, &p);
  params_clear(&p);
out:
  values_free(ones, (int)k);
  return r;
}

/* [out] (consumed), the stack of rows laid out as [row] is: sharded
 * rows stack into an array laid out alike with the new axis unsplit, as
 * a partitioned scan stacks its ys (transform/partition.h). */
static Value *stacked_layout(Array *out, const Array *row) {
  const NamedSharding *s = row->sharding ? (const NamedSharding *)row->sharding : NULL;
  if (!s || !s->mesh) return &out->hdr;
  Value *spec = pspec_prepend_none(s->spec);
  Value *ns = spec ? sharding_new(s->mesh, (PSpec *)spec) : NULL;
  Value *r = ns ? sharding_put(&out->hdr, (NamedSharding *)ns) : NULL;
  if (spec) val_decref(spec);
  if (ns) val_decref(ns);
  val_decref(&out->hdr);
  return r;
}

/* Stacks [n] equally shaped arrays along a new leading axis; rows of
 * another dtype or shape than the first (Python control flow choosing
 * them per iteration) are an error, never reinterpreted bytes. */
static Value *stack_rows(Value **rows, int64_t n, const AVal *row) {
  for (int64_t i = 0; i < n; i++)
    if (!IS_ARRAY(rows[i])) return stack_traced(rows, n, row);
  for (int64_t i = 1; i < n; i++) {
    const Array *a = AS_ARRAY(rows[i]);
    if (a->dtype != row->dtype || a->ndim != row->ndim ||
        memcmp(a->shape, row->shape, sizeof(int64_t) * (size_t)a->ndim)) {
      char want[96], got[96];
      aval_text(row, want, sizeof want);
      aval_str(got, sizeof got, a->dtype, a->ndim, a->shape);
      return err_set(ERR_TYPE, "scan: the body returned a y of type %s at iteration %lld, "
                     "%s before", got, (long long)i, want);
    }
  }
  int64_t shape[SHM_MAXDIM];
  shape[0] = n;
  shm_memcpy(shape + 1, row->shape, sizeof(int64_t) * (size_t)row->ndim);
  Array *out = arr_new(row->dtype, row->ndim + 1, shape);
  if (!out) return NULL;
  out->weak = row->weak;
  size_t bytes = (size_t)shape_size(row->ndim, row->shape) * dt_size(row->dtype);
  for (int64_t i = 0; i < n; i++) {
    Array *c = arr_contiguous(AS_ARRAY(rows[i]));
    if (!c) {
      val_decref(&out->hdr);
      return NULL;
    }
    shm_memcpy((char *)arr_data(out) + (size_t)i * bytes, arr_data(c), bytes);
    val_decref(&c->hdr);
  }
  return stacked_layout(out, AS_ARRAY(rows[0]));
}

/* Row [i] of each xs leaf, as the tree of [xs]. */
static Value *x_slice(Value *xs, Leaves *l, int64_t i) {
  Value **rows = shm_calloc((size_t)l->n + 1, sizeof(Value *));
  if (!rows) return err_nomem();
  Value *idx = val_int(i), *r = NULL;
  int k = 0;
  for (; idx && k < l->n; k++)
    if (!(rows[k] = ops_getitem(l->v[k], idx))) break;
  if (idx && k == l->n) {
    int pos = 0;
    r = replace(xs, rows, &pos);
  }
  values_free(rows, k);
  val_decref(idx);
  return r;
}

/* The ys of an eager scan: each y leaf stacked over the iterations. */
static Value *eager_ys(Value **ys, int64_t n, Value *tree) {
  Leaves first = {0};
  if (n == 0 || flatten(ys[0], &first) < 0) return n == 0 ? val_incref(VAL_NONE) : NULL;
  int m = first.n;
  Value **cols = shm_calloc((size_t)m + 1, sizeof(Value *)), **rows = shm_calloc((size_t)n + 1, sizeof(Value *));
  Value *r = NULL;
  int k = 0;
  for (; cols && rows && k < m; k++) {
    AVal a;
    for (int64_t i = 0; i < n; i++) {
      Leaves li = {0};
      if (flatten(ys[i], &li) < 0 || li.n != m) {
        pytree_leaves_free(&li);
        if (!err_occurred()) err_set(ERR_TYPE, "scan: the body returned ys of different structures");
        goto out;
      }
      rows[i] = li.v[k];
      pytree_leaves_free(&li);
    }
    if (ops_aval(rows[0], &a) < 0 || !(cols[k] = stack_rows(rows, n, &a))) goto out;
  }
  int pos = 0;
  r = replace(tree, cols, &pos);
out:
  values_free(cols, k);
  shm_free(rows);
  pytree_leaves_free(&first);
  return r;
}

static Value *pair_of(Value *a, Value *b) {
  Value *t = a && b ? tuple_pack(2, (Value *[]){a, b}) : NULL;
  val_decref(a);
  val_decref(b);
  return t;
}

static Value *eager_scan(Value *f, Value *init, Value *xs, Leaves *l, int64_t n, bool reverse) {
  Value **ys = shm_calloc((size_t)n + 1, sizeof(Value *)), *carry = init ? val_incref(init) : NULL;
  int64_t done = 0;
  for (; ys && carry && done < n; done++) {
    int64_t i = reverse ? n - 1 - done : done;
    Value *x = xs == VAL_NONE ? val_incref(VAL_NONE) : x_slice(xs, l, i), *c, *y;
    Value *args[2] = {carry, x};
    Value *r = x && check_interrupt() == 0 ? val_call_n(f, 2, args) : NULL;
    val_decref(x);
    val_decref(carry);
    carry = NULL;
    if (!r || scan_pair(r, &c, &y) < 0 || eager_carry_check("scan body", init, c) < 0) {
      val_decref(r);
      break;
    }
    carry = val_incref(c);
    ys[i] = val_incref(y);
    val_decref(r);
  }
  Value *res = NULL;
  if (carry && done == n) res = pair_of(carry, eager_ys(ys, n, n ? ys[0] : VAL_NONE));
  else val_decref(carry);
  values_free(ys, (int)n);
  return res;
}

typedef struct ScanCtx {
  Value *f, *init, *xs;   /* trees */
} ScanCtx;

static Value *scan_body(void *vctx, Value **tr);
static int scan_in_avals(Leaves *carry, Leaves *xs, AVal **out);

/* Traces a scan's body until its carry's types settle (a weak init leaf
 * made strong when the body makes it so, as JAX's scan does), into [s]
 * and the carry's avals [*avs] (owned by the caller).  [cl]: the init's
 * leaves. */
static int scan_settle(Value *f, Value *init, Value *xs, Leaves *xl, Leaves *cl, Sub *s,
                       AVal **avs, bool *traced) {
  ScanCtx sc = {f, init, xs};
  Value **src = shm_calloc((size_t)(cl->n + xl->n) + 1, sizeof(Value *));
  int rc = -1;
  if (!src) return err_nomem(), -1;
  /* the carry's and each x slice's named shapes: the init's and xs' */
  shm_memcpy(src, cl->v, sizeof(Value *) * (size_t)cl->n);
  shm_memcpy(src + cl->n, xl->v, sizeof(Value *) * (size_t)xl->n);
  if (scan_in_avals(cl, xl, avs) == 0)
    for (int attempt = 0; attempt < 2 && rc < 0; attempt++) {
      if (sub_trace(fn_name(f), scan_body, &sc, cl->n + xl->n, *avs, src, s) < 0) break;
      *traced = true;
      int rt = carry_types("scan body", s, 0, cl->n, 0, *avs);
      if (rt == 0) rc = 0;
      else sub_free(s);
      if (rt < 0) break;
    }
  if (rc < 0 && !err_occurred()) err_set(ERR_TYPE, "scan: the carry's types do not settle");
  shm_free(src);
  return rc;
}

/* The ys of a scan of no iterations: empty stacks of the traced body's
 * y avals, in the structure it returned. */
static Value *empty_ys(const Sub *s, int nc) {
  int ny = s->plan->nout - nc;
  Value **cols = shm_calloc((size_t)ny + 1, sizeof(Value *)), *r = NULL;
  int k = 0;
  if (!cols) return err_nomem();
  for (; k < ny; k++) {
    AVal a;
    out_aval(s, nc + k, &a);
    int64_t shape[SHM_MAXDIM];
    shape[0] = 0;
    shm_memcpy(shape + 1, a.shape, sizeof(int64_t) * (size_t)a.ndim);
    Array *z = arr_new(a.dtype, a.ndim + 1, shape);
    if (!z) break;
    z->weak = a.weak;
    cols[k] = &z->hdr;
  }
  if (k == ny) {
    int pos = 0;
    r = replace(tuple_get(s->out_tree, 1), cols, &pos);
  }
  values_free(cols, k);
  return r;
}

/* sub_check of a scan's body [s] traced on the carry leaves [cl] and
 * slices of the xs leaves [xl]: each slice laid out as its xs without
 * the scanned dimension (a scan of no iterations has no slice to run). */
static int scan_check(const Sub *s, const Leaves *cl, const Leaves *xl) {
  int n = cl->n + xl->n, rc = -1, k = 0;
  Value **v = shm_calloc((size_t)n + 1, sizeof(Value *));
  if (!v) return err_nomem(), -1;
  for (; k < n; k++) {
    Value *x = k < cl->n ? cl->v[k] : xl->v[k - cl->n];
    Value *sh = k >= cl->n && IS_ARRAY(x) ? AS_ARRAY(x)->sharding : NULL;
    if (k < cl->n || !IS_ARRAY(x)) {
      v[k] = val_incref(x);
    } else if (!sh || !sharding_is(sh) || !((NamedSharding *)sh)->mesh) {
      v[k] = val_incref(VAL_NONE);
    } else {
      Sharding r, d;
      sharding_to_rule((NamedSharding *)sh, AS_ARRAY(x)->ndim, &r);
      d = r;
      d.ndim = r.ndim - 1;
      for (int j = 0; j < d.ndim; j++) {
        d.nsplit[j] = r.nsplit[j + 1];
        memcpy(d.split[j], r.split[j + 1], sizeof r.split[0]);
      }
      if (!(v[k] = sharding_from_rule(((NamedSharding *)sh)->mesh, &d))) goto out;
    }
  }
  rc = sub_check(s, n, v);
out:
  values_free(v, k);
  return rc;
}

/* An eager scan as JAX's: the init converted to the carry's settled types
 * first, so a Python number carry comes out as jit gives it, and the ys
 * of no iterations are empty arrays of the body's y types.  Only then
 * does the body need a trace (which runs it once on tracers). */
static Value *eager_scan_arrays(Value *f, Value *init, Value *xs, Leaves *xl, int64_t n,
                                bool reverse) {
  Leaves cl = {0};
  if (flatten(init, &cl) < 0) return NULL;
  if (!all_concrete(&cl) || (n > 0 && !any_weak(&cl, 0))) {
    pytree_leaves_free(&cl);
    return eager_scan(f, init, xs, xl, n, reverse);
  }
  Sub s = {0};
  AVal *avs = NULL;
  Value **cv = NULL, *r = NULL, *init2 = NULL;
  bool traced = false;
  if (scan_settle(f, init, xs, xl, &cl, &s, &avs, &traced) == 0 && (cv = carry_values(&cl, avs))) {
    int pos = 0;
    init2 = replace(init, cv, &pos);
    r = n > 0 ? eager_scan(f, init2, xs, xl, n, reverse)
        : scan_check(&s, &cl, xl) < 0 ? NULL
        : pair_of(val_incref(init2), empty_ys(&s, cl.n));
  } else if (!traced && !sharding_type_error()) {
    /* a body that cannot be traced (Python control flow on the carry's
     * values) runs eagerly as it is: whatever it raises, it raises there */
    err_clear();
    r = n > 0 ? eager_scan(f, init, xs, xl, n, reverse) : pair_of(val_incref(init), val_incref(VAL_NONE));
  }
  val_decref(init2);
  values_free(cv, cl.n);
  sub_free(&s);
  pytree_leaves_free(&cl);
  shm_free(avs);
  return r;
}

/* An eager scan as JAX's: Python numbers in the init become arrays (as
 * eager_while's), then eager_scan_arrays. */
static Value *eager_scan_settled(Value *f, Value *init0, Value *xs, Leaves *xl, int64_t n,
                                 bool reverse) {
  Value *init = array_results(val_incref(init0));   /* as eager_while's */
  Value *res = init ? eager_scan_arrays(f, init, xs, xl, n, reverse) : NULL;
  val_decref(init);
  return res;
}

static Value *scan_body(void *vctx, Value **tr) {
  ScanCtx *c = vctx;
  int pos = 0;
  Value *carry = replace(c->init, tr, &pos);
  Value *x = carry ? replace(c->xs, tr, &pos) : NULL;
  Value *args[2] = {carry, x};
  Value *r = x ? val_call_n(c->f, 2, args) : NULL;
  val_decref(carry);
  val_decref(x);
  Value *cv, *y;
  if (r && scan_pair(r, &cv, &y) < 0) {
    val_decref(r);
    return NULL;
  }
  return r;
}

/* Avals of the body inputs: carry leaves, then xs leaves without their
 * leading axis. */
static int scan_in_avals(Leaves *carry, Leaves *xs, AVal **out) {
  *out = shm_calloc((size_t)(carry->n + xs->n) + 1, sizeof(AVal));
  if (!*out) return err_nomem(), -1;
  for (int i = 0; i < carry->n; i++)
    if (ops_aval(carry->v[i], &(*out)[i]) < 0) return -1;
  for (int i = 0; i < xs->n; i++) {
    AVal a;
    if (ops_aval(xs->v[i], &a) < 0) return -1;
    a.ndim--;
    memmove(a.shape, a.shape + 1, sizeof(int64_t) * (size_t)a.ndim);
    (*out)[carry->n + i] = a;
  }
  return 0;
}

static Value *emit_scan(Sub *s, Leaves *carry, Value **cv, Leaves *xs, int64_t n, bool reverse,
                        int64_t unroll, const AVal *cav) {
  int nc = carry->n, ny = s->plan->nout - nc, nops = s->ncap + nc + xs->n;
  Value **ops = shm_calloc((size_t)nops + 1, sizeof(Value *));
  AVal *outs = shm_calloc((size_t)s->plan->nout + 1, sizeof(AVal));
  Value *lin = tuple_new((size_t)nops), *r = NULL;
  if (!ops || !outs || !lin) goto out;
  shm_memcpy(ops, s->caps, sizeof(Value *) * (size_t)s->ncap);
  shm_memcpy(ops + s->ncap, cv, sizeof(Value *) * (size_t)nc);
  shm_memcpy(ops + s->ncap + nc, xs->v, sizeof(Value *) * (size_t)xs->n);
  for (int i = 0; i < nops; i++) tuple_set_steal(lin, (size_t)i, val_incref(val_false()));
  shm_memcpy(outs, cav, sizeof(AVal) * (size_t)nc);
  for (int i = 0; i < ny; i++) {
    AVal a;
    out_aval(s, nc + i, &a);
    memmove(a.shape + 1, a.shape, sizeof(int64_t) * (size_t)a.ndim);
    a.shape[0] = n;
    a.ndim++;
    outs[nc + i] = a;
  }
  Params p;
  params_init(&p);
  params_add(&p, "jaxpr", val_incref(&s->plan->hdr));
  params_add(&p, "length", val_int(n));
  params_add(&p, "linear", val_incref(lin));
  params_add(&p, "num_carry", val_int(nc));
  params_add(&p, "num_consts", val_int(s->ncap));
  params_add(&p, "reverse", val_incref(val_bool(reverse)));
  params_add(&p, "unroll", val_int(unroll));
  r = emit_tree(P_SCAN, &p, nops, ops, s->plan->nout, outs, s->out_tree);
out:
  if (!ops || !outs || !lin) err_nomem();
  shm_free(ops);
  shm_free(outs);
  val_decref(lin);
  return r;
}

static Value *staged_scan(Value *f, Value *init, Value *xs, Leaves *xl, int64_t n, bool reverse,
                          int64_t unroll) {
  Leaves cl = {0};
  AVal *avs = NULL;
  Sub s = {0};
  Value *r = NULL, **cv = NULL;
  bool traced = false;
  if (flatten(init, &cl) == 0 && scan_settle(f, init, xs, xl, &cl, &s, &avs, &traced) == 0 &&
      (cv = carry_values(&cl, avs)))
    r = emit_scan(&s, &cl, cv, xl, n, reverse, unroll, avs);
  values_free(cv, cl.n);
  sub_free(&s);
  pytree_leaves_free(&cl);
  shm_free(avs);
  return r;
}

/* scan(f, init, xs=None, length=None, reverse=False, unroll=1) */
static Value *bi_scan(const CallArgs *a) {
  Value *f, *init, *xs, *length, *rev, *unr;
  if (args_bind("scan", a, "f, init, xs=, length=, reverse=, unroll=",
                (Value **[]){&f, &init, &xs, &length, &rev, &unr}) < 0)
    return NULL;
  if (!xs) xs = VAL_NONE;
  int reverse = rev ? val_truth(rev) : 0;
  Leaves xl = {0};
  int64_t n, unroll;
  Value *r = NULL;
  if (reverse >= 0 && flatten(xs, &xl) == 0 && scan_length(&xl, length, &n) == 0 &&
      unroll_arg(unr, n, &unroll) == 0) {
    /* unroll changes no value: the plan records it, as JAX's jaxpr does,
     * and runs the body once per iteration either way */
    trace_transformed_operand();
    r = trace_current() ? staged_scan(f, init, xs, &xl, n, reverse, unroll)
                        : eager_scan_settled(f, init, xs, &xl, n, reverse);
    if (!r && trace_current() && unstage()) r = eager_scan_settled(f, init, xs, &xl, n, reverse);
  }
  pytree_leaves_free(&xl);
  return array_results(r);
}

/* ==== the built-ins for xmap's lowering ============================================= */

Value *ctl_switch(const CallArgs *a) { return bi_switch(a); }
Value *ctl_while_loop(const CallArgs *a) { return bi_while_loop(a); }
Value *ctl_scan(const CallArgs *a) { return bi_scan(a); }

/* ==== registration ================================================================= */

int ctl_register(Env *b) {
  ctl_register_rules();
  static const struct {
    const char *name;
    BuiltinFn fn;
    const char *doc;
  } fns[] = {
    {"cond", bi_cond, "cond(pred, true_fun, false_fun, *operands)"},
    {"switch", bi_switch, "switch(index, branches, *operands): index clamped"},
    {"while_loop", bi_while_loop, "while_loop(cond_fun, body_fun, init_val)"},
    {"fori_loop", bi_fori_loop, "fori_loop(lower, upper, body_fun, init_val, *, unroll=None)"},
    {"scan", bi_scan, "scan(f, init, xs, length=None, reverse=False, unroll=1) -> (carry, ys)"},
  };
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
    Value *v = builtin_new(fns[i].name, fns[i].fn, fns[i].doc);
    int rc = v && env_set(b, intern_cstr(fns[i].name), v) == 0 &&
             builtins_add_to("lax", fns[i].name, v) == 0 ? 0 : -1;
    val_decref(v);
    if (rc < 0) return -1;
  }
  return 0;
}
