/*
 * compile.c - the passes and the compiled executor (compile.h).
 *
 * Compilation works on references: a variable id (>= 0), or a constant
 * slot (encoded -1 - slot).  Steps are first built over references, then
 * the buffer planner turns every variable into a slot.
 *
 * Updates in place.  A kernel step whose primitive changes some elements
 * of its operand 0 (PrimRules.updates_operand: dynamic_update_slice,
 * scatter) is given that operand's slot as its result's, so the kernel
 * writes only the update, when the operand's buffer is dead and the
 * plan's: its last use is this step, the step reads it once, and its slot
 * is a TEMP (never an INPUT, whose array the caller holds and may read
 * again, nor a CONST, which every run starts from).  A chain of such
 * steps that ends in an output is given the OUTPUT slot back to its
 * first temporary; one that starts at an input is noted, so a loop may
 * pass its own carry as both input and output (cmp_out_in_place).
 *
 * Results that are not copied.  A reshape, squeeze or expand_dims is a
 * view of its operand's buffer, as it is eagerly, and a shard_map's
 * results are the arrays its call assembles: their variables get SL_VIEW
 * slots, which hold what the step made until the run ends, instead of a
 * workspace buffer the result would be copied into.  A view keeps its
 * operand's slot from being reused while the view is read (its operand's
 * last use is the view's).  Such a result that the plan returns is
 * copied into the caller's array (a run into given outputs) or handed
 * out as a new header over its buffer, unless that buffer is workspace
 * memory (a view of a temporary), then copied; a view of a temporary
 * that the plan returns is instead written into the output's own buffer
 * as before.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "transform/compile.h"
#include "lang/eval.h"
#include "transform/compile_impl.h"
#include "transform/fused_loop.h"
#include "transform/higher.h"
#include "array/kernels.h"
#include "base/mem.h"
#include "base/timeline.h"

/* ==== slots and scratch ========================================================= */

static int add_slot(Exec *e, SlotKind k, const AVal *a, int index, Value *value) {
  if (e->nslots == e->capslots) {
    int n = e->capslots ? e->capslots * 2 : 16;
    Slot *s = shm_realloc(e->slots, sizeof(Slot) * (size_t)n);
    if (!s) return err_nomem(), -1;
    e->slots = s;
    e->capslots = n;
  }
  /* steps read constants in place: views (a broadcast `ones(16)`) are
   * made contiguous once here */
  Array *x = value && IS_ARRAY(value) ? AS_ARRAY(value) : NULL;
  bool splat = x && x->size > 1;
  for (int d = 0; splat && d < x->ndim; d++) splat = x->shape[d] == 1 || x->strides[d] == 0;
  Value *v = x ? arr_value(arr_contiguous(x)) : val_incref(value);
  if (value && !v) return -1;
  e->slots[e->nslots] = (Slot){k, *a, index, v, splat};
  return e->nslots++;
}

int cmp_add_scratch(Exec *e, const AVal *a) {
  if (e->nscratch == e->capscratch) {
    int n = e->capscratch ? e->capscratch * 2 : 8;
    AVal *s = shm_realloc(e->scratch, sizeof(AVal) * (size_t)n);
    if (!s) return err_nomem(), -1;
    e->scratch = s;
    e->capscratch = n;
  }
  e->scratch[e->nscratch] = *a;
  return e->nscratch++;
}

/* A fresh contiguous array of aval [a], flags set. */
static Array *array_of(const AVal *a) {
  Array *x = arr_new(a->dtype, a->ndim, a->shape);
  if (x) {
    x->weak = a->weak;
    x->vma = a->vma;
  }
  return x;
}

/* A workspace array of aval [a]: later steps and runs write it again
 * whatever its counts, so no collective may share its buffer with another
 * device's output (arr_pin). */
static Array *pinned_of(const AVal *a) {
  Array *x = array_of(a);
  if (x) arr_pin(x);
  return x;
}

/* ==== the passes ================================================================== */

/* Per-variable knowledge while compiling one plan. */
typedef struct Pre {
  const Plan *p;
  Exec *e;
  int *ren;          /* CSE: the variable standing for this one */
  int *cslot;        /* constant slot of a known variable, or -1 */
  bool *live;        /* per equation */
  const PlanEqn **eq; /* per equation: the plan's, or its rewrite in folded */
  PlanEqn **folded;  /* per equation: a rewrite (fold_transposes), owned, or NULL */
} Pre;

static int ref_of(Pre *pr, const PlanAtom *a) {
  if (a->var < 0) {
    AVal av;
    aval_of(AS_ARRAY(a->lit), &av);
    int s = add_slot(pr->e, SL_CONST, &av, 0, a->lit);
    return s < 0 ? INT32_MIN : -1 - s;
  }
  int v = pr->ren[a->var];
  return pr->cslot[v] >= 0 ? -1 - pr->cslot[v] : v;
}

static bool first_order(PrimId id) {
  PrimKind k = prim_table[id].kind;
  return k != PK_HIGHER && k != PK_COLLECTIVE;
}

/* Evaluates [e] now when every operand is known; 1 if folded. */
static int fold_eqn(Pre *pr, const PlanEqn *q) {
  if (!first_order(q->prim) || q->nin > 8 || q->nout != 1) return 0;
  Value *args[8];
  for (int i = 0; i < q->nin; i++) {
    int r = ref_of(pr, &q->in[i]);
    if (r == INT32_MIN) return -1;
    if (r >= 0) return 0;
    args[i] = pr->e->slots[-1 - r].value;
  }
  /* an extra reference each, so prim_apply cannot reuse a constant's
   * buffer as the result (prim.h) */
  for (int i = 0; i < q->nin; i++) val_incref(args[i]);
  Value *res = prim_apply(q->prim, q->nin, args, &q->params);
  for (int i = 0; i < q->nin; i++) val_decref(args[i]);
  if (!res) {
    err_clear();   /* left for run time, where it fails with its location */
    return 0;
  }
  AVal av = pr->p->vars[q->out[0]];
  int s = add_slot(pr->e, SL_CONST, &av, 0, res);
  val_decref(res);
  if (s < 0) return -1;
  pr->cslot[q->out[0]] = s;
  return 1;
}

static bool atoms_equal(Pre *pr, const PlanAtom *a, const PlanAtom *b) {
  if (a->var >= 0 || b->var >= 0)
    return a->var >= 0 && b->var >= 0 && pr->ren[a->var] == pr->ren[b->var];
  return param_value_equal(a->lit, b->lit) && AS_ARRAY(a->lit)->weak == AS_ARRAY(b->lit)->weak;
}

/* CSE: makes [i]'s outputs stand for an equal earlier equation's. */
static void cse_eqn(Pre *pr, int i) {
  const PlanEqn *q = pr->eq[i];
  if (!first_order(q->prim)) return;
  for (int j = i - 1; j >= 0 && j >= i - 256; j--) {
    const PlanEqn *o = pr->eq[j];
    if (!pr->live[j] || o->prim != q->prim || o->nin != q->nin || o->nout != q->nout) continue;
    int k = 0;
    while (k < q->nin && atoms_equal(pr, &q->in[k], &o->in[k])) k++;
    if (k < q->nin || !params_equal(&q->params, &o->params)) continue;
    for (k = 0; k < q->nout; k++) pr->ren[q->out[k]] = pr->ren[o->out[k]];
    pr->live[i] = false;
    return;
  }
}

static bool plan_has_effects(const Plan *p);

static bool value_has_effects(Value *v) {
  if (IS_PLAN(v)) return plan_has_effects(AS_PLAN(v));
  if (v->type != V_TUPLE) return false;
  for (size_t i = 0; i < tuple_len(v); i++)
    if (value_has_effects(tuple_get(v, i))) return true;
  return false;
}

static bool eqn_has_effects(const PlanEqn *q) {
  PrimKind k = prim_table[q->prim].kind;
  const HigherRules *h = higher_rules(q->prim);
  if (k == PK_COLLECTIVE || (h && h->effectful)) return true;
  for (int i = 0; k == PK_HIGHER && i < q->params.n; i++)
    if (value_has_effects(q->params.p[i].value)) return true;
  return false;
}

static bool plan_has_effects(const Plan *p) {
  for (int i = 0; i < p->neqn; i++)
    if (eqn_has_effects(&p->eqns[i])) return true;
  return false;
}

/* Backward liveness over [p]'s equations (eq[i], or p->eqns[i] when [eq]
 * is NULL; an operand variable v stands for ren[v], v itself when [ren]
 * is NULL): clears live[i] of an equation already dead, or whose outputs
 * nothing needs and that has no effects.  0, or -1 when out of memory. */
static int mark_live(const Plan *p, const PlanEqn *const *eq, const int *ren, bool *live) {
  bool *need = shm_calloc((size_t)p->nvars + 1, 1);
  if (!need) return err_nomem(), -1;
  for (int i = 0; i < p->nout; i++)
    if (p->outs[i].var >= 0) need[ren ? ren[p->outs[i].var] : p->outs[i].var] = true;
  for (int i = p->neqn - 1; i >= 0; i--) {
    const PlanEqn *q = eq ? eq[i] : &p->eqns[i];
    if (!live[i]) continue;
    bool want = eqn_has_effects(q);
    for (int k = 0; k < q->nout && !want; k++) want = need[q->out[k]];
    live[i] = want;
    for (int k = 0; want && k < q->nin; k++)
      if (q->in[k].var >= 0) need[ren ? ren[q->in[k].var] : q->in[k].var] = true;
  }
  shm_free(need);
  return 0;
}

/* Dead code: keeps equations whose outputs are needed or that have effects. */
static int dce(Pre *pr) { return mark_live(pr->p, pr->eq, pr->ren, pr->live); }

bool *cmp_live_eqns(const Plan *p) {
  bool *live = shm_malloc((size_t)p->neqn + 1);
  if (!live) return err_nomem();
  memset(live, 1, (size_t)p->neqn + 1);
  if (mark_live(p, NULL, NULL, live) < 0) {
    shm_free(live);
    return NULL;
  }
  return live;
}

/* A copy of [q] to rewrite: its own operand list and parameters, its
 * outputs the plan's. */
static PlanEqn *eqn_copy(const PlanEqn *q) {
  PlanEqn *c = shm_calloc(1, sizeof *c);
  if (c && !(c->in = shm_malloc(sizeof(PlanAtom) * (size_t)q->nin + 1))) {
    shm_free(c);
    c = NULL;
  }
  if (!c) return err_nomem();
  *c = (PlanEqn){q->prim, {0}, q->nin, q->nout, c->in, q->out, q->loc, q->auto_axes, q->true_first};
  shm_memcpy(c->in, q->in, sizeof(PlanAtom) * (size_t)q->nin);
  params_init(&c->params);
  return c;
}

static void eqn_copy_free(PlanEqn *c) {
  if (!c) return;
  params_clear(&c->params);
  shm_free(c->in);
  shm_free(c);
}

/* Folds transpose(a) read by a primitive whose row can read through it
 * (its through_transpose rule: dot_general, which reads a through its
 * strides as it does eagerly, where a transpose is a view), so jit gives
 * eager's bits without the copy; the transpose then dies unless
 * something else reads it. */
static int fold_transposes(Pre *pr, const int *def) {
  const Plan *p = pr->p;
  for (int i = 0; i < p->neqn; i++) {
    ThroughTransposeRule rule = prim_table[p->eqns[i].prim].rules.through_transpose;
    for (int k = 0; rule && k < p->eqns[i].nin; k++) {
      const PlanEqn *q = pr->eq[i];
      int v = q->in[k].var, n;
      int64_t perm[SHM_MAXDIM];
      if (v < 0 || def[v] < 0 || p->eqns[def[v]].prim != P_TRANSPOSE) continue;
      const PlanEqn *t = &p->eqns[def[v]];
      if (params_ints(&t->params, "permutation", &n, perm, SHM_MAXDIM) < 0) {
        err_clear();
        continue;
      }
      Params np;
      int r = rule(&q->params, k, n, perm, &np);
      if (r < 0) return -1;
      if (r == 0) continue;
      PlanEqn *c = pr->folded[i] ? pr->folded[i] : eqn_copy(q);
      if (!c) return params_clear(&np), -1;
      params_clear(&c->params);
      c->params = np;
      c->in[k] = t->in[0];
      pr->eq[i] = pr->folded[i] = c;
    }
  }
  return 0;
}

/* The equation defining each variable (-1: an input or constant), for
 * fold_transposes. */
static int fold_all(Pre *pr) {
  const Plan *p = pr->p;
  int *def = shm_malloc(sizeof(int) * ((size_t)p->nvars + 1));
  if (!def) return err_nomem(), -1;
  for (int v = 0; v <= p->nvars; v++) def[v] = -1;
  for (int i = 0; i < p->neqn; i++)
    for (int k = 0; k < p->eqns[i].nout; k++) def[p->eqns[i].out[k]] = i;
  int rc = fold_transposes(pr, def);
  shm_free(def);
  return rc;
}

static int run_passes(Pre *pr) {
  const Plan *p = pr->p;
  if (fold_all(pr) < 0) return -1;
  for (int i = 0; i < p->neqn; i++) {
    pr->live[i] = true;
    int f = fold_eqn(pr, pr->eq[i]);
    if (f < 0) return -1;
    if (f) pr->live[i] = false;
    else cse_eqn(pr, i);
  }
  return dce(pr);
}

/* ==== steps ======================================================================= */

/* A higher-order primitive whose row has a run rule is a step of its
 * own; any other primitive runs its kernel. */
static StepKind step_kind(PrimId id) {
  const HigherRules *h = higher_rules(id);
  return h && h->run ? ST_HIGHER : ST_KERNEL;
}

/* Compiles the sub-plans of a higher-order step and reserves its scratch
 * (its row's prepare rule). */
static int prepare_higher(Exec *e, Step *s, const Plan *p) {
  const HigherRules *h = higher_rules(s->eqn->prim);
  s->scratch = e->nscratch;
  return h->prepare ? h->prepare(e, s, p) : 0;
}

/* Builds the steps of the live equations over references. */
static int build_steps(Pre *pr) {
  const Plan *p = pr->p;
  Exec *e = pr->e;
  e->steps = shm_calloc((size_t)p->neqn + 1, sizeof(Step));
  if (!e->steps) return err_nomem(), -1;
  for (int i = 0; i < p->neqn; i++) {
    if (!pr->live[i]) continue;
    const PlanEqn *q = pr->eq[i];
    Step *s = &e->steps[e->nsteps++];
    s->kind = step_kind(q->prim);
    s->eqn = q;
    s->folded = pr->folded[i];   /* the step owns it from here */
    pr->folded[i] = NULL;
    s->nin = q->nin;
    s->nout = q->nout;
    s->in = shm_calloc((size_t)q->nin + 1, sizeof(int));
    s->out = shm_calloc((size_t)q->nout + 1, sizeof(int));
    if (!s->in || !s->out) return err_nomem(), -1;
    for (int k = 0; k < q->nin; k++)
      if ((s->in[k] = ref_of(pr, &q->in[k])) == INT32_MIN) return -1;
    shm_memcpy(s->out, q->out, sizeof(int) * (size_t)q->nout);
    if (s->kind == ST_KERNEL && !prim_table[q->prim].rules.kernel)
      return err_set(ERR_VALUE, "jit: %s cannot be compiled", prim_table[q->prim].name), -1;
    if (s->kind != ST_KERNEL && prepare_higher(e, s, p) < 0) return -1;
  }
  return 0;
}

/* ==== buffer planning ================================================================ */

static bool aval_equal(const AVal *a, const AVal *b) {
  return a->dtype == b->dtype && a->weak == b->weak && a->ndim == b->ndim && a->vma == b->vma &&
         !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim);
}

typedef struct Planner {
  int *var_slot;   /* slot of each variable, -1 none yet */
  int *last_use;   /* last step reading each variable; INT32_MAX for outputs */
  bool *free_slot; /* TEMP slots free for reuse */
} Planner;

/* A TEMP slot for [a]: a free one of the same aval, or a new one. */
static int temp_slot(Exec *e, Planner *pl, const AVal *a) {
  for (int s = 0; s < e->nslots; s++)
    if (pl->free_slot[s] && e->slots[s].kind == SL_TEMP && aval_equal(&e->slots[s].aval, a)) {
      pl->free_slot[s] = false;
      return s;
    }
  return add_slot(e, SL_TEMP, a, 0, NULL);
}

/* A view is read where its operand's buffer is: the operand lives as long
 * as its views (from the last step back, so a view of a view extends the
 * first operand too). */
static void mark_last_uses(Exec *e, const Plan *p, Planner *pl) {
  for (int i = 0; i < e->nsteps; i++)
    for (int k = 0; k < e->steps[i].nin; k++)
      if (e->steps[i].in[k] >= 0) pl->last_use[e->steps[i].in[k]] = i;
  for (int i = 0; i < p->nout; i++)
    if (p->outs[i].var >= 0) pl->last_use[p->outs[i].var] = INT32_MAX;
  for (int i = e->nsteps - 1; i >= 0; i--) {
    const Step *s = &e->steps[i];
    int r = s->view ? s->in[0] : -1;
    if (r >= 0 && pl->last_use[s->out[0]] > pl->last_use[r]) pl->last_use[r] = pl->last_use[s->out[0]];
  }
}

/* Whether step [s] makes its results itself (SL_VIEW slots): a reshape,
 * squeeze or expand_dims (a view of its operand), or a higher-order step
 * whose rule adopts its results (HigherRules.adopts_results). */
static bool makes_own_results(const Step *s) {
  if (s->kind == ST_KERNEL) return s->view;
  const HigherRules *h = s->kind == ST_HIGHER ? higher_rules(s->eqn->prim) : NULL;
  return h && h->adopts_results;
}

static bool is_view_prim(PrimId id) {
  return id == P_RESHAPE || id == P_SQUEEZE || id == P_EXPAND_DIMS;
}

/* Per variable: the step defining it, -1 for an input or constant. */
static int *defining_steps(const Exec *e, const Plan *p) {
  int *def = shm_malloc(sizeof(int) * ((size_t)p->nvars + 1));
  if (!def) return err_nomem();
  for (int v = 0; v <= p->nvars; v++) def[v] = -1;
  for (int i = 0; i < e->nsteps; i++)
    for (int k = 0; k < e->steps[i].nout; k++) def[e->steps[i].out[k]] = i;
  return def;
}

/* Whether output variable [r] is returned as what its step made (an
 * SL_VIEW slot, copy_results) rather than written into the output's
 * buffer: a shard_map's result, or a view whose buffer is an input's or
 * a constant's (a view of a temporary would be copied at every run; the
 * output's buffer is kept across runs instead: fresh_output). */
static bool shares_output(const Exec *e, const int *def, int r) {
  while (r >= 0 && def[r] >= 0) {
    const Step *s = &e->steps[def[r]];
    if (!makes_own_results(s)) return false;
    if (!s->view) return true;
    r = s->in[0];
  }
  return true;
}

/* Binds the plan outputs: the first output naming a variable an equation
 * defines gets an SL_OUTPUT slot; the others, and those shares_output
 * returns as made, are copied at the end. */
static int bind_outputs(Pre *pr, Planner *pl, bool *defined, const int *def) {
  const Plan *p = pr->p;
  Exec *e = pr->e;
  for (int i = 0; i < p->nout; i++) {
    int r = ref_of(pr, &p->outs[i]);
    if (r == INT32_MIN) return -1;
    if (r >= 0 && defined[r] && pl->var_slot[r] < 0 && !shares_output(e, def, r)) {
      int s = add_slot(e, SL_OUTPUT, &p->vars[r], i, NULL);
      if (s < 0) return -1;
      pl->var_slot[r] = s;
      e->out_slot[i] = s;
      continue;
    }
    e->out_copy[i] = true;
    e->out_slot[i] = r;   /* a reference; resolved after planning */
  }
  return 0;
}

/* The variable step [i] may write its result over (PrimRules.updates_operand:
 * dynamic_update_slice, scatter), or -1: its operand 0 when that is a
 * variable no later step reads and the plan does not return (its last use
 * is this step), this step reads it nowhere else, and it has the result's
 * aval.  Whether its buffer is the plan's to write is the caller's test:
 * an input's belongs to the caller and a constant's to the plan's every
 * run, so only a TEMP slot's or the output slot's is. */
/* Whether variable [r] is made by a step of [e] before step [i] that
 * writes a buffer of the run's own: a fused loop, an element-wise,
 * reduction or contraction kernel, or another update.  Not a collective
 * (an all_gather's output is shared by the devices of a process), a
 * layout kernel (its result may be a view of its operand's buffer) or a
 * higher-order step: writing over those would write where another
 * device, or the caller, reads. */
static bool made_fresh(const Exec *e, int i, int r) {
  for (int j = i - 1; j >= 0; j--) {
    const Step *s = &e->steps[j];
    for (int k = 0; k < s->nout; k++) {
      if (s->out[k] != r) continue;
      if (s->kind == ST_FUSED) return true;
      if (s->kind != ST_KERNEL) return false;
      const PrimRules *pr = &prim_table[s->eqn->prim].rules;
      PrimKind kind = prim_table[s->eqn->prim].kind;
      return pr->updates_operand || kind == PK_UNARY || kind == PK_BINARY || kind == PK_REDUCE ||
             kind == PK_CONTRACT;
    }
  }
  return false;
}

static int in_place_operand(const Exec *e, const Plan *p, const Planner *pl, int i) {
  const Step *s = &e->steps[i];
  if (s->kind != ST_KERNEL || s->nout != 1 || s->nin < 1 ||
      !prim_table[s->eqn->prim].rules.updates_operand)
    return -1;
  int r = s->in[0];
  if (r < 0 || pl->last_use[r] != i || !aval_equal(&p->vars[r], &p->vars[s->out[0]])) return -1;
  for (int k = 1; k < s->nin; k++)
    if (s->in[k] == r) return -1;
  return r;
}

/* Gives a chain of in-place updates ending in a plan output the output's
 * slot, from the last step back: each operand of the chain is then
 * written where the caller's result lives, and no step copies the whole
 * array (the seed's accumulator of a collective matmul).  A chain that
 * starts at an input is noted in out_in_place: a caller that passes one
 * array as both (a loop's carry, cmp_out_in_place) has it updated in
 * place, since nothing reads the input after the chain's first step. */
static void chain_output_slots(Exec *e, const Plan *p, Planner *pl, const bool *defined) {
  for (int i = e->nsteps - 1; i >= 0; i--) {
    int r = in_place_operand(e, p, pl, i);
    int sl = r < 0 ? -1 : pl->var_slot[e->steps[i].out[0]];
    if (sl < 0 || e->slots[sl].kind != SL_OUTPUT) continue;
    int rs = pl->var_slot[r];
    if (rs >= 0 && e->slots[rs].kind == SL_INPUT)   /* the chain starts at an input */
      e->out_in_place[e->slots[sl].index] = e->slots[rs].index;
    else if (rs < 0 && defined[r] && made_fresh(e, i, r))
      pl->var_slot[r] = sl;
  }
}

/* Step [i]'s result takes its operand's TEMP slot when it may be written
 * in place (in_place_operand): that slot's number, else -1. */
static int in_place_slot(Exec *e, const Plan *p, Planner *pl, int i) {
  int r = in_place_operand(e, p, pl, i), v = e->steps[i].out[0];
  if (r < 0 || pl->var_slot[v] >= 0 || pl->var_slot[r] < 0) return -1;
  int sl = pl->var_slot[r];
  if (e->slots[sl].kind != SL_TEMP || !made_fresh(e, i, r)) return -1;
  pl->var_slot[v] = sl;
  return sl;
}

/* An SL_VIEW slot for [a], listed in e->views. */
static int view_slot(Exec *e, const AVal *a) {
  int *v = shm_realloc(e->views, sizeof(int) * ((size_t)e->nviews + 1));
  if (!v) return err_nomem(), -1;
  e->views = v;
  int s = add_slot(e, SL_VIEW, a, 0, NULL);
  if (s >= 0) e->views[e->nviews++] = s;
  return s;
}

static int plan_step_slots(Exec *e, const Plan *p, Planner *pl, int i) {
  Step *s = &e->steps[i];
  int kept = in_place_slot(e, p, pl, i);
  bool own = makes_own_results(s);
  for (int k = 0; k < s->nout; k++) {
    int v = s->out[k];
    if (pl->var_slot[v] < 0 &&
        (pl->var_slot[v] = own ? view_slot(e, &p->vars[v]) : temp_slot(e, pl, &p->vars[v])) < 0)
      return -1;
  }
  for (int k = 0; k < s->nin; k++) {
    int r = s->in[k];
    if (r < 0) continue;
    if (pl->var_slot[r] < 0)
      return err_set(ERR_VALUE, "jit: variable %d used before it is defined", r), -1;
    int sl = pl->var_slot[r];
    if (pl->last_use[r] == i && e->slots[sl].kind == SL_TEMP && sl != kept) pl->free_slot[sl] = true;
  }
  return 0;
}

/* Replaces references by slots in the steps. */
static void resolve_refs(Exec *e, Planner *pl) {
  for (int i = 0; i < e->nsteps; i++) {
    Step *s = &e->steps[i];
    for (int k = 0; k < s->nin; k++) s->in[k] = s->in[k] < 0 ? -1 - s->in[k] : pl->var_slot[s->in[k]];
    for (int k = 0; k < s->nout; k++) s->out[k] = pl->var_slot[s->out[k]];
    if (s->fused) fuse_resolve(s->fused, pl->var_slot);
  }
  for (int i = 0; i < e->nout; i++)
    if (e->out_copy[i]) e->out_slot[i] = e->out_slot[i] < 0 ? -1 - e->out_slot[i] : pl->var_slot[e->out_slot[i]];
}

static int plan_buffers(Pre *pr) {
  const Plan *p = pr->p;
  Exec *e = pr->e;
  int nv = p->nvars + 1;
  Planner pl = {shm_malloc(sizeof(int) * (size_t)nv), shm_malloc(sizeof(int) * (size_t)nv), NULL};
  bool *defined = shm_calloc((size_t)nv, 1);
  int *def = NULL, rc = -1;
  if (!pl.var_slot || !pl.last_use || !defined) goto nomem;
  for (int i = 0; i < e->nsteps; i++) {
    Step *s = &e->steps[i];
    s->view = s->kind == ST_KERNEL && s->nin == 1 && s->nout == 1 && is_view_prim(s->eqn->prim);
  }
  if (!(def = defining_steps(e, p))) goto out;
  for (int v = 0; v < nv; v++) pl.var_slot[v] = -1, pl.last_use[v] = -1;
  for (int i = 0; i < p->nin; i++) {
    int s = add_slot(e, SL_INPUT, &p->vars[p->invars[i]], i, NULL);
    if (s < 0) goto out;
    pl.var_slot[p->invars[i]] = e->in_slot[i] = s;
  }
  for (int i = 0; i < e->nsteps; i++)
    for (int k = 0; k < e->steps[i].nout; k++) defined[e->steps[i].out[k]] = true;
  if (bind_outputs(pr, &pl, defined, def) < 0) goto out;
  mark_last_uses(e, p, &pl);
  chain_output_slots(e, p, &pl, defined);
  if (!(pl.free_slot = shm_calloc((size_t)e->nslots + (size_t)p->nvars + 16, 1))) goto nomem;
  for (int i = 0; i < e->nsteps; i++)
    if (plan_step_slots(e, p, &pl, i) < 0) goto out;
  resolve_refs(e, &pl);
  rc = 0;
  goto out;
nomem:
  err_nomem();
out:
  shm_free(pl.var_slot);
  shm_free(pl.last_use);
  shm_free(pl.free_slot);
  shm_free(defined);
  shm_free(def);
  return rc;
}

/* ==== fusion ========================================================================= */

/* Counts, per variable, the readers among the steps and plan outputs. */
static int *count_uses(Exec *e, const Plan *p, Pre *pr) {
  int *uses = shm_calloc((size_t)p->nvars + 1, sizeof(int));
  if (!uses) return err_nomem();
  for (int i = 0; i < e->nsteps; i++)
    for (int k = 0; k < e->steps[i].nin; k++)
      if (e->steps[i].in[k] >= 0) uses[e->steps[i].in[k]]++;
  for (int i = 0; i < p->nout; i++)
    if (p->outs[i].var >= 0) uses[pr->ren[p->outs[i].var]] += 2;
  return uses;
}

/* True when step [k] reads a result of one of the steps [j, k). */
static bool depends_on_range(const Exec *e, int k, int j) {
  const Step *s = &e->steps[k];
  for (int m = j; m < k; m++)
    for (int o = 0; o < e->steps[m].nout; o++)
      for (int q = 0; q < s->nin; q++)
        if (s->in[q] == e->steps[m].out[o]) return true;
  return false;
}

/* Moves step (and item) [k] to position [j], shifting [j, k) down. */
static void hoist(Exec *e, FuseItem *items, int j, int k) {
  Step st = e->steps[k];
  FuseItem it = items[k];
  memmove(&e->steps[j + 1], &e->steps[j], sizeof(Step) * (size_t)(k - j));
  memmove(&items[j + 1], &items[j], sizeof(FuseItem) * (size_t)(k - j));
  e->steps[j] = st;
  items[j] = it;
}

/* Scheduling for fusion: steps within a short window after the run [i,
 * i+n) that could join it, and depend on nothing in between, are moved
 * up to its end, or before the sum closing it (pure elementwise steps
 * commute with what they skip): a gradient's scaled residual joins the
 * loop summing the squared one, its operand never written. */
static int extend_run(Exec *e, FuseItem *items, const FuseEnv *fe, int i, int n) {
  for (;;) {
    int j = i + n, k = j, at = -1;
    for (; k < e->nsteps && k < j + 16; k++)
      if ((at = fuse_join_at(fe, items, i, j, k)) >= 0 && !depends_on_range(e, k, at)) break;
    if (k >= e->nsteps || k >= j + 16) return n;
    if (k > at) hoist(e, items, at, k);
    int grown = fuse_run_length(fe, items, i, e->nsteps);
    if (grown <= n) return n;
    n = grown;
  }
}

/* Moves step (and item) [k] to position [c - 1], shifting (k, c) up. */
static void sink(Exec *e, FuseItem *items, int k, int c) {
  Step st = e->steps[k];
  FuseItem it = items[k];
  memmove(&e->steps[k], &e->steps[k + 1], sizeof(Step) * (size_t)(c - 1 - k));
  memmove(&items[k], &items[k + 1], sizeof(FuseItem) * (size_t)(c - 1 - k));
  e->steps[c - 1] = st;
  items[c - 1] = it;
}

/* The one later step reading variable [v] (uses 1), from step [from] on. */
static int reader_of(const Exec *e, int from, int v) {
  for (int c = from; c < e->nsteps; c++)
    for (int q = 0; q < e->steps[c].nin; q++)
      if (e->steps[c].in[q] == v) return c;
  return -1;
}

/* Whether step [k] is in the list [g] of [ng] steps. */
static bool listed(const int *g, int ng, int k) {
  for (int m = 0; m < ng; m++)
    if (g[m] == k) return true;
  return false;
}

/* Whether the steps [g] of the run [i, i+n), once moved out of it, read
 * one array at most from outside themselves, and one that is in memory
 * anyway: an input, a constant, an earlier result, or a value of the run
 * that is used after it (a value only the run's remaining steps read
 * lives in a register, and would have to be written for them). */
static bool sinks_cheaply(const Exec *e, const FuseEnv *fe, int i, int n, const int *g, int ng) {
  int a = INT32_MIN;
  for (int m = 0; m < ng; m++) {
    const Step *s = &e->steps[g[m]];
    for (int q = 0; q < s->nin; q++) {
      int r = s->in[q];
      bool mine = false;
      for (int o = 0; o < ng && r >= 0; o++) mine |= e->steps[g[o]].out[0] == r;
      if (fuse_reads_scalar(fe, r) || mine || r == a) continue;
      if (a != INT32_MIN) return false;   /* two arrays read instead of one */
      a = r;
      int def = -1, reads = 0;   /* by the run's steps, [g] among them */
      for (int k = i; r >= 0 && k < i + n; k++) {
        if (e->steps[k].out[0] == r) def = k;
        for (int p = 0; p < e->steps[k].nin; p++) reads += e->steps[k].in[p] == r;
      }
      if (def >= 0 && fe->uses[r] == reads) return false;   /* else it stays a register */
    }
  }
  return true;
}

/* Moves out of the run [i, i+n) the steps better computed in the loop of
 * a later elementwise step: a step whose one reader comes after the run
 * (a matrix product in between) and the steps of the run whose one
 * reader is such a step, when together they read one array that is in
 * memory anyway (sinks_cheaply).  In the later loop their values live in
 * registers instead of being written by the run and read back: the
 * backward pass's 1 - y*y of y = tanh(x), read only by its product with
 * the cotangent a matrix product computes later.  They go just before
 * that reader, in their order; the new length of the run. */
static int sink_run(Exec *e, FuseItem *items, const FuseEnv *fe, int i, int n) {
  for (int x = i + n - 1; x > i; x--) {
    const Step *s = &e->steps[x];
    if (s->nout != 1 || fe->uses[s->out[0]] != 1) continue;
    int c = reader_of(e, i + n, s->out[0]);
    if (c < 0 || !fuse_feeds(fe, &items[x], &items[c])) continue;
    int g[FUSE_RUN_MAX], ng = 0;
    g[ng++] = x;
    for (int y = x - 1; y > i; y--) {
      int v = e->steps[y].out[0], r = e->steps[y].nout == 1 && fe->uses[v] == 1 ? reader_of(e, y + 1, v) : -1;
      if (r >= 0 && listed(g, ng, r) && fuse_feeds(fe, &items[y], &items[r])) g[ng++] = y;
    }
    if (!sinks_cheaply(e, fe, i, n, g, ng)) continue;
    for (int m = 0; m < ng; m++) sink(e, items, g[m], c - m);   /* g descends */
    n -= ng;
    x = i + n;
  }
  return n;
}

/* The aval of constant slot [slot] of the Exec [ctx]. */
static const AVal *const_aval(void *ctx, int slot) { return &((Exec *)ctx)->slots[slot].aval; }

/* Whether constant slot [slot] of the Exec [ctx] is one value repeated. */
static bool const_splat(void *ctx, int slot) { return ((Exec *)ctx)->slots[slot].splat; }

/* Replaces runs of fusible steps by fused ones (fused_loop.h decides). */
static int fuse_steps(Pre *pr) {
  Exec *e = pr->e;
  int *uses = count_uses(e, pr->p, pr);
  if (!uses) return -1;
  FuseItem *items = shm_calloc((size_t)e->nsteps + 1, sizeof *items);
  if (!items) {
    shm_free(uses);
    return err_nomem(), -1;
  }
  for (int i = 0; i < e->nsteps; i++)
    if (e->steps[i].kind == ST_KERNEL)
      items[i] = (FuseItem){e->steps[i].eqn, e->steps[i].in, e->steps[i].out};
  FuseEnv fe = {pr->p, uses, const_aval, const_splat, e};
  int w = 0;
  for (int i = 0; i < e->nsteps;) {
    int n = fuse_run_length(&fe, items, i, e->nsteps);
    if (n >= 1) n = extend_run(e, items, &fe, i, n);
    if (n >= 2) n = sink_run(e, items, &fe, i, n);
    if (n < 2) {
      e->steps[w++] = e->steps[i++];
      continue;
    }
    Step f = {.kind = ST_FUSED, .eqn = e->steps[i].eqn};
    f.fused = fuse_build(&fe, items, i, n, &f.nin, &f.in, &f.nout, &f.out);
    if (!f.fused) {
      shm_free(uses);
      shm_free(items);
      return -1;
    }
    if (f.fused->nregs > e->nregs) e->nregs = f.fused->nregs;
    if (f.fused->npartials > e->npartials) e->npartials = f.fused->npartials;
    e->split |= f.fused->split;
    for (int k = i; k < i + n; k++) {
      shm_free(e->steps[k].in);
      shm_free(e->steps[k].out);
    }
    e->steps[w++] = f;
    i += n;
  }
  e->nsteps = w;
  shm_free(uses);
  shm_free(items);
  return 0;
}

/* ==== compile ======================================================================== */

static void exec_free(void *ve);

static Exec *exec_new(const Plan *p) {
  Exec *e = shm_calloc(1, sizeof *e);
  if (!e) return err_nomem();
  pthread_mutex_init(&e->lock, NULL);
  e->nin = p->nin;
  e->nout = p->nout;
  e->in_slot = shm_calloc((size_t)p->nin + 1, sizeof(int));
  e->out_slot = shm_calloc((size_t)p->nout + 1, sizeof(int));
  e->out_copy = shm_calloc((size_t)p->nout + 1, sizeof(bool));
  e->in_contig = shm_calloc((size_t)p->nin + 1, sizeof(bool));
  e->bound = shm_calloc((size_t)p->nout + 1, sizeof(int));
  e->copied = shm_calloc((size_t)p->nout + 1, sizeof(int));
  e->out_in_place = shm_malloc(sizeof(int) * ((size_t)p->nout + 1));
  if (!e->in_slot || !e->out_slot || !e->out_copy || !e->in_contig || !e->bound || !e->copied ||
      !e->out_in_place) {
    exec_free(e);
    return err_nomem();
  }
  for (int i = 0; i < p->nout; i++) e->out_in_place[i] = -1;
  return e;
}

static int pre_init(Pre *pr, const Plan *p, Exec *e) {
  int nv = p->nvars + 1;
  pr->p = p;
  pr->e = e;
  pr->ren = shm_malloc(sizeof(int) * (size_t)nv);
  pr->cslot = shm_malloc(sizeof(int) * (size_t)nv);
  pr->live = shm_calloc((size_t)p->neqn + 1, 1);
  pr->eq = shm_calloc((size_t)p->neqn + 1, sizeof *pr->eq);
  pr->folded = shm_calloc((size_t)p->neqn + 1, sizeof *pr->folded);
  if (!pr->ren || !pr->cslot || !pr->live || !pr->eq || !pr->folded) return err_nomem(), -1;
  for (int i = 0; i < p->neqn; i++) pr->eq[i] = &p->eqns[i];
  for (int v = 0; v < nv; v++) pr->ren[v] = v, pr->cslot[v] = -1;
  for (int i = 0; i < p->nconst; i++) {
    int s = add_slot(e, SL_CONST, &p->vars[p->constvars[i]], 0, p->consts[i]);
    if (s < 0) return -1;
    pr->cslot[p->constvars[i]] = s;
  }
  return 0;
}

static void pre_free(Pre *pr) {
  for (int i = 0; pr->folded && i < pr->p->neqn; i++) eqn_copy_free(pr->folded[i]);
  shm_free(pr->ren);
  shm_free(pr->cslot);
  shm_free(pr->live);
  shm_free(pr->eq);
  shm_free(pr->folded);
}

/* Marks the inputs that fused loops and scans read in place. */
static void mark_contiguous_inputs(Exec *e) {
  for (int i = 0; i < e->nsteps; i++) {
    Step *s = &e->steps[i];
    bool in_place = s->kind == ST_FUSED ||
                    (s->kind == ST_HIGHER && higher_rules(s->eqn->prim)->reads_in_place);
    if (!in_place) continue;
    for (int k = 0; k < s->nin; k++)
      if (e->slots[s->in[k]].kind == SL_INPUT) e->in_contig[e->slots[s->in[k]].index] = true;
  }
  for (int i = 0; i < e->nin; i++) e->ncontig += e->in_contig[i];
}

/* Lists the outputs bound in place and the ones copied. */
static void list_outputs(Exec *e) {
  for (int i = 0; i < e->nout; i++) {
    if (e->out_copy[i]) e->copied[e->ncopied++] = i;
    else e->bound[e->nbound++] = i;
  }
}

/* Gives small elementwise steps (binary, plain unary, convert) their row
 * loop: a loop's body of a few scalars and short vectors is mostly
 * dispatch, which is the same every time (the plan's dtypes are fixed).
 * Large steps keep the kernel, which splits them over two cores and looks
 * at Ctrl-C.  A plan whose steps all have one can run from a tape. */
static void resolve_rows(Exec *e) {
  e->tapeable = e->nsteps + e->ncopied <= TAPE_MAX;
  for (int i = 0; i < e->nsteps; i++) {
    Step *s = &e->steps[i];
    const PrimInfo *r = &prim_table[s->eqn->prim];
    const AVal *o = &e->slots[s->out[0]].aval;
    DType t = e->slots[s->in[0]].aval.dtype;
    bool small = s->kind == ST_KERNEL && s->nout == 1 && shape_size(o->ndim, o->shape) < KERN_PAR_MIN;
    if (small && r->kind == PK_BINARY && s->nin == 2) s->row2 = prim_binary_row(s->eqn->prim, t);
    if (small && r->kind == PK_UNARY && s->nin == 1)
      s->row1 = kern_unary_row(r->rules.kernel, t, o->dtype);
    if (!s->row1 && !s->row2) e->tapeable = false;
  }
}

int cmp_compile(Plan *p) {
  if (!p) return err_set(ERR_VALUE, "jit: missing sub-plan"), -1;
  if (p->exec) return 0;
  Exec *e = exec_new(p);
  if (!e) return -1;
  Pre pr = {0};
  int rc = -1;
  if (pre_init(&pr, p, e) == 0 && run_passes(&pr) == 0 && build_steps(&pr) == 0 &&
      fuse_steps(&pr) == 0 && plan_buffers(&pr) == 0) {
    mark_contiguous_inputs(e);
    list_outputs(e);
    resolve_rows(e);
    rc = 0;
  }
  pre_free(&pr);
  if (rc < 0) {
    exec_free(e);
    return -1;
  }
  p->exec = e;
  return 0;
}

/* ==== workspaces ===================================================================== */

static void ws_free(Exec *e, Workspace *w) {
  if (!w) return;
  for (int s = 0; w->slot && s < e->nslots; s++)
    if ((e->slots[s].kind == SL_TEMP || e->slots[s].kind == SL_VIEW) && w->slot[s])
      val_decref(&w->slot[s]->hdr);
  for (int i = 0; w->scratch && i < e->nscratch; i++)
    if (w->scratch[i]) val_decref(&w->scratch[i]->hdr);
  for (int i = 0; w->kept && i < e->nout; i++)
    if (w->kept[i]) val_decref(&w->kept[i]->hdr);
  fuse_mem_free(&w->fm);
  shm_free(w->kept);
  shm_free(w->slot);
  shm_free(w->scratch);
  shm_free(w->ops);
  shm_free(w->vargs);
  shm_free(w);
}

/* Room for any step's operand lists: its inputs, its outputs, a loop
 * body's inputs (at most the step's inputs and outputs together) and a
 * scan body's outputs. */
static size_t ws_ops_len(const Exec *e, size_t *maxin) {
  size_t n = 8;
  *maxin = 8;
  for (int i = 0; i < e->nsteps; i++) {
    size_t in = (size_t)e->steps[i].nin, out = (size_t)e->steps[i].nout;
    if (2 * in + 3 * out > n) n = 2 * in + 3 * out;
    if (in > *maxin) *maxin = in;
  }
  return n;
}

static Workspace *ws_new(Exec *e) {
  Workspace *w = shm_calloc(1, sizeof *w);
  if (!w) return err_nomem();
  w->slot = shm_calloc((size_t)e->nslots + 1, sizeof(Array *));
  w->scratch = shm_calloc((size_t)e->nscratch + 1, sizeof(Array *));
  size_t maxin, nops = ws_ops_len(e, &maxin);
  w->ops = shm_calloc(nops, sizeof(Array *));
  w->vargs = shm_calloc(maxin, sizeof(Value *));
  w->kept = shm_calloc((size_t)e->nout + 1, sizeof(Array *));
  if (!w->slot || !w->scratch || !w->ops || !w->vargs || !w->kept || fuse_mem_init(&w->fm, e->nregs, e->npartials, e->split) < 0) goto fail;
  for (int s = 0; s < e->nslots; s++) {
    if (e->slots[s].kind == SL_CONST) w->slot[s] = AS_ARRAY(e->slots[s].value);
    else if (e->slots[s].kind == SL_TEMP && !(w->slot[s] = pinned_of(&e->slots[s].aval))) goto fail;
  }
  for (int i = 0; i < e->nscratch; i++)
    if (!(w->scratch[i] = pinned_of(&e->scratch[i]))) goto fail;
  return w;
fail:
  if (!err_occurred()) err_nomem();
  ws_free(e, w);
  return NULL;
}

/* This thread's slot in every plan's [mine]. */
static int ws_ordinal(void) {
  static atomic_int next;
  static _Thread_local int ord = -1;
  if (ord < 0) ord = atomic_fetch_add_explicit(&next, 1, memory_order_relaxed) % WS_SLOTS;
  return ord;
}

static Workspace *ws_take(Exec *e) {
  Workspace *w = atomic_exchange_explicit(&e->mine[ws_ordinal()].w, NULL, memory_order_acquire);
  if (w) return w;
  pthread_mutex_lock(&e->lock);
  w = e->pool;
  if (w) e->pool = w->next;
  pthread_mutex_unlock(&e->lock);
  return w ? w : ws_new(e);
}

static void ws_give(Exec *e, Workspace *w) {
  Workspace *none = NULL;
  if (atomic_compare_exchange_strong_explicit(&e->mine[ws_ordinal()].w, &none, w,
                                              memory_order_release, memory_order_relaxed))
    return;
  pthread_mutex_lock(&e->lock);
  w->next = e->pool;
  e->pool = w;
  pthread_mutex_unlock(&e->lock);
}

static void exec_free(void *ve) {
  Exec *e = ve;
  if (!e) return;
  while (e->pool) {
    Workspace *w = e->pool;
    e->pool = w->next;
    ws_free(e, w);
  }
  for (int i = 0; i < WS_SLOTS; i++) ws_free(e, atomic_load(&e->mine[i].w));
  for (int i = 0; i < e->nsteps; i++) {
    shm_free(e->steps[i].in);
    shm_free(e->steps[i].out);
    fuse_free(e->steps[i].fused);
    if (e->steps[i].own) val_decref(e->steps[i].own);
    eqn_copy_free(e->steps[i].folded);
  }
  for (int s = 0; s < e->nslots; s++) val_decref(e->slots[s].value);
  shm_free(e->steps);
  shm_free(e->slots);
  shm_free(e->scratch);
  shm_free(e->in_slot);
  shm_free(e->out_slot);
  shm_free(e->out_copy);
  shm_free(e->in_contig);
  shm_free(e->out_in_place);
  shm_free(e->views);
  shm_free(e->bound);
  shm_free(e->copied);
  pthread_mutex_destroy(&e->lock);
  shm_free(e);
}

/* ==== running ======================================================================== */

static int run_steps(Exec *e, Workspace *w);

/* A fused elementwise loop; on the timeline as one "fused" primitive. */
static int run_fused(Step *s, Workspace *w) {
  if (!tl_recording()) return fuse_run(s->fused, w->slot, &w->fm);
  int64_t t0 = tl_now();
  int rc = fuse_run(s->fused, w->slot, &w->fm);
  tl_event("primitive", "fused loop", t0, tl_now(), 0, NULL, NULL);
  return rc;
}

/* ==== tapes ==================================================================== */

/* Step [s]'s row loop over its operands bound in [w], as the kernel
 * would run it: operands contiguous, of one element, or 1-d at a stride
 * (prim_row_stride; a unary operand contiguous).  False for any other
 * layout (an input bound as a 2-d view), which the kernel handles. */
static bool tape_op_of(Step *s, Workspace *w, TapeOp *op) {
  Array *a = w->slot[s->in[0]], *o = w->slot[s->out[0]];
  *op = (TapeOp){s->row2, s->row1, arr_data(a), NULL, arr_data(o), 0, 0, o->size};
  if (s->row1) return a->contiguous;
  Array *b = w->slot[s->in[1]];
  op->b = arr_data(b);
  return prim_row_stride(a, o, &op->sa) && prim_row_stride(b, o, &op->sb);
}

/* A step with a row loop (resolve_rows) in one call of it, when its
 * operands are laid out for it (tape_op_of); false leaves the step to the
 * kernel, as does a timeline being written (it records each primitive). */
static bool run_row(Step *s, Workspace *w) {
  TapeOp op;
  if (tl_recording() || !tape_op_of(s, w, &op)) return false;
  cmp_tape_op_run(&op);
  return true;
}

/* A reshape, squeeze or expand_dims into its SL_VIEW slot: the kernel's
 * view of the operand's buffer, or a contiguous copy when that view is
 * not contiguous (an input passed as a view), since the plan's steps read
 * their temporaries as contiguous arrays. */
static int run_view(Step *s, Workspace *w) {
  Array **o = cmp_step_outs(s, w), *x;
  o[0] = NULL;
  if (prim_run_kernel(s->eqn->prim, cmp_step_ins(s, w, 0), s->nin, &s->eqn->params, o) < 0)
    return -1;
  if (!o[0]->contiguous) {
    x = arr_contiguous(o[0]);
    val_decref(&o[0]->hdr);
    if (!x) return -1;
    o[0] = x;
  }
  Array **slot = &w->slot[s->out[0]];
  if (*slot) val_decref(&(*slot)->hdr);
  *slot = o[0];
  return 0;
}

int cmp_adopt(Step *s, Workspace *w, int k, Array *x) {
  Array *a;
  if (x->buf->pinned || x->buf->part || !x->contiguous) a = arr_copy(x);
  else a = arr_view(x, x->ndim, x->shape, x->strides, x->offset);
  if (!a) return -1;
  a->weak = x->weak;
  a->vma = x->vma;
  Array **slot = &w->slot[s->out[k]];
  if (*slot) val_decref(&(*slot)->hdr);
  *slot = a;
  return 0;
}

static int run_kernel(Step *s, Workspace *w) {
  if (s->view && !w->slot[s->out[0]]) return run_view(s, w);   /* an SL_VIEW slot */
  if ((s->row1 || s->row2) && run_row(s, w)) return 0;
  /* a collective takes its source line (--comm-stats, --trace, mismatch
   * messages) from the thread's current location: the equation's */
  bool coll = prim_table[s->eqn->prim].kind == PK_COLLECTIVE && s->eqn->loc.src;
  Loc was = coll ? eval_set_current_loc(s->eqn->loc) : (Loc){0};
  int rc = prim_run_kernel(s->eqn->prim, cmp_step_ins(s, w, 0), s->nin, &s->eqn->params,
                           cmp_step_outs(s, w));
  if (coll) eval_set_current_loc(was);
  return rc;
}

int cmp_held_take(Plan *p, Held *h) {
  h->e = p->exec;
  h->w = NULL;
  if (!h->e) return err_set(ERR_VALUE, "jit: plan was not compiled"), -1;
  h->w = ws_take(h->e);
  return h->w ? 0 : -1;
}

void cmp_held_give(Held *h) {
  if (h->w) ws_give(h->e, h->w);
  h->w = NULL;
}

/* How a run gets its outputs: written into the caller's arrays, as
 * fresh arrays, or as fresh arrays over the buffers of the workspace's
 * last run when no one holds those any more (a device body's results,
 * which the compiled shard_map copies out and lets go: fresh_output). */
typedef enum { OUT_INTO, OUT_FRESH, OUT_REUSE } OutMode;

static int run_ws(Exec *e, Workspace *w, Array **in, Array **out, OutMode m);

int cmp_run_body(Held *body, Array **consts, int nconsts, Array **carry, int ncarry,
                 Array **extra, int nextra, Array **outs, Array **ins) {
  shm_memcpy(ins, consts, sizeof(Array *) * (size_t)nconsts);
  shm_memcpy(ins + nconsts, carry, sizeof(Array *) * (size_t)ncarry);
  shm_memcpy(ins + nconsts + ncarry, extra, sizeof(Array *) * (size_t)nextra);
  return run_ws(body->e, body->w, ins, outs, OUT_INTO);
}

bool cmp_tape_build(Exec *e, Workspace *w, Array **in, Array **out, Tape *t) {
  t->n = 0;
  for (int k = 0; k < e->nbound; k++) w->slot[e->out_slot[e->bound[k]]] = out[e->bound[k]];
  for (int i = 0; i < e->nin; i++) w->slot[e->in_slot[i]] = in[i];
  for (int i = 0; i < e->nsteps; i++)
    if (!tape_op_of(&e->steps[i], w, &t->op[t->n++])) return false;
  for (int k = 0; k < e->ncopied; k++) {
    Array *src = w->slot[e->out_slot[e->copied[k]]], *dst = out[e->copied[k]];
    if (!src->contiguous) return false;
    size_t n = (size_t)dst->size * dt_size(dst->dtype);
    if (src != dst) t->op[t->n++] = (TapeOp){.a = arr_data(src), .o = arr_data(dst), .n = (int64_t)n};
  }
  return true;
}

/* A kernel, a fused loop, or the step's higher-order rule (higher.h). */
static int run_step(Step *s, Workspace *w) {
  switch (s->kind) {
  case ST_KERNEL: return run_kernel(s, w);
  case ST_FUSED: return run_fused(s, w);
  case ST_HIGHER: return higher_rules(s->eqn->prim)->run(s, w);
  }
  return -1;
}

static int run_steps(Exec *e, Workspace *w) {
  for (int i = 0; i < e->nsteps; i++) {
    if (run_step(&e->steps[i], w) < 0) {
      /* a step whose errors belong to the call (shard_map's specs,
       * replication) is not located at its equation */
      const Step *s = &e->steps[i];
      if (s->eqn->loc.src && !(s->kind == ST_HIGHER && higher_rules(s->eqn->prim)->own_errors))
        err_locate(e->steps[i].eqn->loc);
      return -1;
    }
  }
  return 0;
}

/* Binds inputs: as they are, or a contiguous copy of a view that a step
 * reads in place, listed in [tmp] (*ntmp of them, held). */
static int bind_args(Exec *e, Workspace *w, Array **in, Array **tmp, int *ntmp) {
  if (!e->ncontig) {   /* the usual case: a plain copy of pointers */
    for (int i = 0; i < e->nin; i++) w->slot[e->in_slot[i]] = in[i];
    return 0;
  }
  for (int i = 0; i < e->nin; i++) {
    Array *x = in[i];
    if (!x->contiguous && e->in_contig[i]) {
      if (!(x = arr_contiguous(x))) return -1;
      tmp[(*ntmp)++] = x;
    }
    w->slot[e->in_slot[i]] = x;
  }
  return 0;
}

/* Payloads from this size on come from shm_buf_alloc's cache of mapped
 * buffers (mem.h), which already spares them fresh pages. */
#define KEEP_MAX ((int64_t)2 << 20)

/* A fresh array for bound output [i] under OUT_REUSE.  A device body run
 * over and over (a compiled shard_map's) returns arrays of the same
 * avals every call; new heap ones under 2 MiB land on pages never
 * touched before for the first several calls of every device (each a
 * page fault: ~460 a call for 8 devices' 256 KiB results, most of those
 * calls' time on a loaded VM).  So the workspace keeps a private view of
 * the buffer it returned; when that view is again the buffer's only
 * holder (the caller and anything it shared the buffer with have let
 * go: the reference counts say so, arr_sole_holder), the buffer is
 * handed out again under a new array header, else a new buffer is made.
 * Every element of a bound output is written by the steps, so what the
 * buffer held before is never read. */
static Array *fresh_output(Exec *e, Workspace *w, int i) {
  const AVal *a = &e->slots[e->out_slot[i]].aval;
  Array *k = w->kept[i], *x;
  if (k && arr_sole_holder(k)) x = arr_view(k, k->ndim, k->shape, k->strides, k->offset);
  else {
    if (k) val_decref(&k->hdr);
    w->kept[i] = NULL;
    if (!(x = array_of(a))) return NULL;
    if (x->size * (int64_t)dt_size(x->dtype) < KEEP_MAX &&
        !(w->kept[i] = arr_view(x, x->ndim, x->shape, x->strides, x->offset)))
      err_clear();   /* not kept: the next call makes a new one */
    return x;
  }
  if (x) {
    x->weak = a->weak;
    x->vma = a->vma;
    x->why = (VmaWhy){0};
  }
  return x;
}

/* Binds the outputs the steps write in place: the caller's [out] (OUT_INTO),
 * else fresh arrays written to [out]. */
static int bind_results(Exec *e, Workspace *w, Array **out, OutMode m) {
  for (int k = 0; k < e->nbound; k++) {
    int i = e->bound[k];
    if (m == OUT_FRESH && !(out[i] = array_of(&e->slots[e->out_slot[i]].aval))) return -1;
    if (m == OUT_REUSE && !(out[i] = fresh_output(e, w, i))) return -1;
    w->slot[e->out_slot[i]] = out[i];
  }
  return 0;
}

/* A plan result of aval [a] from an SL_VIEW slot's [src]: a new header
 * over its buffer, or a copy when the buffer is workspace memory or a
 * process's part only. */
static Array *shared_result(Array *src, const AVal *a) {
  Array *x = src->buf->pinned || src->buf->part
                 ? arr_copy(src)
                 : arr_view(src, src->ndim, src->shape, src->strides, src->offset);
  if (x) {
    x->weak = a->weak;
    x->vma = a->vma;
    x->why = (VmaWhy){0};
  }
  return x;
}

/* The outputs that are copies of other slots (an input passed through, a
 * view or a shard_map's result returned as made). */
static int copy_results(Exec *e, Workspace *w, Array **out, bool fresh) {
  int rc = 0;
  for (int k = 0; k < e->ncopied; k++) {
    int i = e->copied[k];
    Array *src = w->slot[e->out_slot[i]];
    const Slot *sl = &e->slots[e->out_slot[i]];
    if (!fresh) cmp_copy_into(out[i], src);
    else if (sl->kind == SL_VIEW) out[i] = shared_result(src, &sl->aval);
    /* A Python number passed through comes out an array, as from JAX's
     * jit: a copy without the host mark. */
    else if (sl->kind == SL_TEMP || src->host) out[i] = arr_copy(src);
    else out[i] = (Array *)val_incref(&src->hdr);
    if (fresh && !out[i]) rc = -1;
  }
  return rc;
}

/* Runs [e] in workspace [w]: into the caller's [out], or into fresh
 * arrays written to [out] when [fresh]. */
static int run_ws(Exec *e, Workspace *w, Array **in, Array **out, OutMode m) {
  bool fresh = m != OUT_INTO;
  Array *tmp_stack[8];   /* room for the copies of the inputs read in place */
  Array **tmp = e->ncontig <= 8 ? tmp_stack : shm_calloc((size_t)e->ncontig, sizeof(Array *));
  if (!tmp) return err_nomem(), -1;
  int ntmp = 0, rc = -1;
  if (bind_results(e, w, out, m) == 0 && bind_args(e, w, in, tmp, &ntmp) == 0 &&
      run_steps(e, w) == 0)
    rc = copy_results(e, w, out, fresh);
  for (int i = 0; i < e->nviews; i++) {   /* no buffer held past the run */
    Array **v = &w->slot[e->views[i]];
    if (*v) val_decref(&(*v)->hdr);
    *v = NULL;
  }
  for (int i = 0; i < ntmp; i++) val_decref(&tmp[i]->hdr);
  if (tmp != tmp_stack) shm_free(tmp);
  return rc;
}

static int run_common(Plan *p, Array **in, Array **out, OutMode m) {
  Held h;
  int rc = cmp_held_take(p, &h) < 0 ? -1 : run_ws(h.e, h.w, in, out, m);
  cmp_held_give(&h);
  if (rc < 0 && m != OUT_INTO)
    for (int i = 0; i < p->nout; i++) {
      if (out[i]) val_decref(&out[i]->hdr);
      out[i] = NULL;
    }
  return rc;
}

int cmp_nsteps(const Plan *p) { return p->exec ? ((const Exec *)p->exec)->nsteps : -1; }

int cmp_tapeable(const Plan *p) { return p->exec ? ((const Exec *)p->exec)->tapeable : -1; }

int cmp_run(Plan *p, Array **in, Array **out) {
  for (int i = 0; i < p->nout; i++) out[i] = NULL;
  return run_common(p, in, out, OUT_FRESH);
}

int cmp_run_into(Plan *p, Array **in, Array **out) { return run_common(p, in, out, OUT_INTO); }

/* A plan called with arrays runs it: the per-device body of a compiled
 * shard_map.  One result: the array; several: a tuple. */
static Value *plan_call(Value *f, const CallArgs *a) {
  Plan *p = AS_PLAN(f);
  if (a->nkw || a->nargs != p->nin)
    return err_set(ERR_TYPE, "plan takes %d positional arguments, got %d", p->nin, a->nargs);
  Array **in = shm_calloc((size_t)(p->nin + p->nout) + 1, sizeof(Array *)), **out = in + p->nin;
  if (!in) return err_nomem();
  Value *r = NULL;
  for (int i = 0; i < a->nargs; i++) {
    if (!IS_ARRAY(a->args[i])) {
      err_set(ERR_TYPE, "plan arguments must be arrays");
      goto done;
    }
    in[i] = AS_ARRAY(a->args[i]);
  }
  /* the caller copies the results out and lets them go: their buffers
   * serve the next call (fresh_output) */
  if (cmp_compile(p) < 0 || run_common(p, in, out, OUT_REUSE) < 0) goto done;
  if (p->nout == 1) {
    r = &out[0]->hdr;
    goto done;
  }
  r = tuple_new((size_t)p->nout);
  for (int i = 0; i < p->nout; i++) {
    if (r) tuple_set_steal(r, (size_t)i, &out[i]->hdr);
    else val_decref(&out[i]->hdr);
  }
done:
  shm_free(in);
  return r;
}

void cmp_register(void) {
  plan_exec_free = exec_free;
  eval_register_call(V_PLAN, plan_call);
}
