/*
 * plan.c - the plan data structure and its printer (plan.h).
 *
 * The printer mirrors jax._src.core's pretty printer as of JAX 0.4.3x:
 * one naming context for the whole printed plan, so a sub-plan's binders
 * continue the letters of its parent; literals with their type.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "array/array.h"
#include "base/mem.h"
#include "base/strbuf.h"
#include "spmd/mesh.h"
#include "lang/ops.h"
#include "transform/plan.h"
#include "array/print.h"

void (*plan_exec_free)(void *exec);

/* ==== building ============================================================ */

Plan *plan_new(const char *name) {
  Plan *p = shm_calloc(1, sizeof *p);
  if (!p) return err_nomem();
  val_init(&p->hdr, V_PLAN);
  p->name = name;
  return p;
}

/* Grows [*arr] of [*cap] elements of [size] bytes to hold [need]. */
static int grow(void **arr, int *cap, int need, size_t size) {
  if (need <= *cap) return 0;
  int n = *cap ? *cap * 2 : 8;
  while (n < need) n *= 2;
  void *q = shm_realloc(*arr, (size_t)n * size);
  if (!q) {
    err_nomem();
    return -1;
  }
  *arr = q;
  *cap = n;
  return 0;
}

int plan_add_var(Plan *p, const AVal *a) {
  int old = p->capvars;
  if (grow((void **)&p->vars, &p->capvars, p->nvars + 1, sizeof(AVal)) < 0) return -1;
  if (p->named && p->capvars != old) {
    NamedShape **n = shm_realloc(p->named, sizeof(NamedShape *) * ((size_t)p->capvars + 1));
    if (!n) return err_nomem(), -1;
    memset(n + old, 0, sizeof(NamedShape *) * ((size_t)(p->capvars - old) + 1));
    p->named = n;
  }
  p->vars[p->nvars] = *a;
  return p->nvars++;
}

int plan_set_named(Plan *p, int var, const NamedShape *ns) {
  if (!ns || ns->n == 0) {
    if (p->named && var < p->capvars && p->named[var]) {
      shm_free(p->named[var]);
      p->named[var] = NULL;
    }
    return 0;
  }
  if (!p->named) {   /* sized like vars; grown with it in plan_add_var */
    p->named = shm_calloc((size_t)p->capvars + 1, sizeof(NamedShape *));
    if (!p->named) return err_nomem(), -1;
  }
  NamedShape *c = p->named[var] ? p->named[var] : shm_malloc(sizeof *c);
  if (!c) return err_nomem(), -1;
  *c = *ns;
  p->named[var] = c;
  return 0;
}

const NamedShape *plan_var_named(const Plan *p, int var) {
  return p->named && var >= 0 && var < p->nvars ? p->named[var] : NULL;
}

int plan_named_find(const NamedShape *ns, const char *name) {
  for (int i = 0; i < ns->n; i++)
    if (ns->name[i] == name) return i;
  return -1;
}

int plan_named_add(NamedShape *ns, const char *name, int64_t size) {
  if (plan_named_find(ns, name) >= 0) return 0;
  if (ns->n == PLAN_MAXNAMES) return err_set(ERR_VALUE, "xmap: more than %d named axes", PLAN_MAXNAMES), -1;
  ns->name[ns->n] = name;
  ns->size[ns->n++] = size;
  return 0;
}

void plan_named_remove(NamedShape *ns, const char *name) {
  int i = plan_named_find(ns, name);
  if (i < 0) return;
  for (; i + 1 < ns->n; i++) ns->name[i] = ns->name[i + 1], ns->size[i] = ns->size[i + 1];
  ns->n--;
}

int plan_insert_invar(Plan *p, int at, int var) {
  int *q = shm_realloc(p->invars, sizeof(int) * (size_t)(p->nin + 1));
  if (!q) {
    err_nomem();
    return -1;
  }
  memmove(q + at + 1, q + at, sizeof(int) * (size_t)(p->nin - at));
  q[at] = var;
  p->invars = q;
  p->nin++;
  return 0;
}

int plan_add_invar(Plan *p, int var) { return plan_insert_invar(p, p->nin, var); }

int plan_add_const(Plan *p, Value *value) {
  AVal a;
  if (ops_aval(value, &a) < 0) return -1;
  a.vma = 0;
  int v = plan_add_var(p, &a);
  if (v < 0) return -1;
  int *cv = shm_realloc(p->constvars, sizeof(int) * (size_t)(p->nconst + 1));
  if (cv) p->constvars = cv;
  Value **cs = cv ? shm_realloc(p->consts, sizeof(Value *) * (size_t)(p->nconst + 1)) : NULL;
  if (!cs) {
    err_nomem();
    return -1;
  }
  /* a host NumPy array is copied: the plan keeps the value it saw, as
   * JAX bakes it, whatever the program writes later (array.h) */
  Value *c = arr_is_np(value) ? arr_value(arr_np_as((Array *)val_incref(value), false)) : val_incref(value);
  if (!c) return -1;
  p->consts = cs;
  p->constvars[p->nconst] = v;
  p->consts[p->nconst++] = c;
  return v;
}

/* Copies [n] atoms, taking references to literals.  NULL on nomem. */
static PlanAtom *atoms_copy(int n, const PlanAtom *in) {
  PlanAtom *a = shm_calloc((size_t)n + 1, sizeof *a);
  if (!a) return err_nomem();
  for (int i = 0; i < n; i++) {
    a[i] = in[i];
    val_incref(a[i].lit);
  }
  return a;
}

static void atoms_free(int n, PlanAtom *a) {
  for (int i = 0; a && i < n; i++) val_decref(a[i].lit);
  shm_free(a);
}

int plan_add_eqn(Plan *p, PrimId prim, Params *params, int nin, const PlanAtom *in,
                 int nout, const int *out, Loc loc) {
  PlanEqn e = {.prim = prim, .params = *params, .nin = nin, .nout = nout, .loc = loc};
  params_init(params);
  e.in = atoms_copy(nin, in);
  e.out = e.in ? shm_calloc((size_t)nout + 1, sizeof(int)) : NULL;
  if (!e.out || grow((void **)&p->eqns, &p->capeqn, p->neqn + 1, sizeof(PlanEqn)) < 0) {
    if (e.in && !e.out) err_nomem();
    e.loc.src = NULL;
    plan_eqn_clear(&e);
    return -1;
  }
  shm_memcpy(e.out, out, sizeof(int) * (size_t)nout);
  if (e.loc.src) src_incref(e.loc.src);
  p->eqns[p->neqn] = e;
  return p->neqn++;
}

int plan_set_outs(Plan *p, int nout, const PlanAtom *outs) {
  PlanAtom *a = atoms_copy(nout, outs);
  if (!a) return -1;
  atoms_free(p->nout, p->outs);
  p->outs = a;
  p->nout = nout;
  return 0;
}

void plan_atom_aval(const Plan *p, const PlanAtom *a, AVal *out) {
  if (a->var >= 0) *out = p->vars[a->var];
  else aval_of(AS_ARRAY(a->lit), out);
}

static void vma_whys(const Plan *p, VmaWhy *why, bool args);

/* A primitive inside [sub] (a plan, or a tuple of them: a cond's
 * branches) that makes one of its results vary over axes of [added]:
 * the reason of an equation with a body that adds them.  {0}: none. */
static VmaWhy sub_why(const Value *sub, uint32_t added) {
  if (sub->type == V_TUPLE) {
    for (size_t i = 0; i < tuple_len(sub); i++) {
      VmaWhy w = sub_why(tuple_get(sub, i), added);
      if (w.prim) return w;
    }
    return (VmaWhy){0};
  }
  if (!IS_PLAN(sub)) return (VmaWhy){0};
  const Plan *b = AS_PLAN((Value *)sub);
  VmaWhy *why = shm_calloc((size_t)b->nvars + 1, sizeof(VmaWhy)), w = {0};
  if (!why) return w;
  vma_whys(b, why, false);
  for (int k = 0; k < b->nout && !w.prim; k++)
    if (b->outs[k].var >= 0 && why[b->outs[k].var].prim && (why[b->outs[k].var].axes & added))
      w = why[b->outs[k].var];
  shm_free(why);
  return w;
}

/* The reason result [o] (its vma) of [e] varies, its operands' reasons
 * [in] (their union [vma]). */
static VmaWhy eqn_why(const PlanEqn *e, const VmaWhy *in, uint32_t vma, uint32_t o) {
  bool body = false;
  for (int i = 0; (o & ~vma) && i < e->params.n; i++) {
    const Value *v = e->params.p[i].value;
    body |= IS_PLAN(v) || (v->type == V_TUPLE && tuple_len(v) && IS_PLAN(tuple_get(v, 0)));
    VmaWhy w = sub_why(v, o & ~vma);
    if (w.prim) return w;
  }
  /* a body that adds axes no primitive of it explains: the operands'
   * reasons for the rest (the equation is not itself a collective) */
  return prim_vma_why(e->prim, e->loc.line, e->nin, in, vma, body ? o & vma : o);
}

/* plan_vma_whys; [args]: the inputs are explained by their in_specs (a
 * body inside an equation's: unexplained, as only a primitive in it can
 * add axes its operands lack). */
static void vma_whys(const Plan *p, VmaWhy *why, bool args) {
  memset(why, 0, sizeof(VmaWhy) * (size_t)p->nvars);
  for (int i = 0; args && i < p->nin; i++) {
    uint32_t v = p->vars[p->invars[i]].vma;
    if (v) why[p->invars[i]] = (VmaWhy){0, 0, (int16_t)(i + 1), v};
  }
  VmaWhy stack[8], *in = stack;
  int cap = 8;
  for (int k = 0; k < p->neqn; k++) {
    const PlanEqn *e = &p->eqns[k];
    if (e->nin > cap) {
      VmaWhy *grown = shm_malloc(sizeof(VmaWhy) * (size_t)e->nin);
      if (!grown) break;   /* out of memory: later reasons stay unknown */
      if (in != stack) shm_free(in);
      in = grown;
      cap = e->nin;
    }
    uint32_t vma = 0;
    for (int i = 0; i < e->nin; i++) {
      int v = e->in[i].var;
      in[i] = v >= 0 ? why[v] : (VmaWhy){0};
      vma |= v >= 0 ? p->vars[v].vma : 0;
    }
    for (int j = 0; j < e->nout; j++) {
      uint32_t o = p->vars[e->out[j]].vma;
      if (o) why[e->out[j]] = eqn_why(e, in, vma, o);
    }
  }
  if (in != stack) shm_free(in);
}

void plan_vma_whys(const Plan *p, VmaWhy *why) { vma_whys(p, why, true); }

void plan_eqn_clear(PlanEqn *e) {
  params_clear(&e->params);
  atoms_free(e->nin, e->in);
  shm_free(e->out);
  if (e->loc.src) src_decref(e->loc.src);
  memset(e, 0, sizeof *e);
}

static void plan_free(Value *v) {
  Plan *p = AS_PLAN(v);
  for (int i = 0; i < p->nnotes; i++) shm_free(p->notes[i]);
  shm_free(p->notes);
  if (p->in_labels) val_decref(p->in_labels);
  if (p->ret.src) src_decref(p->ret.src);
  if (p->exec && plan_exec_free) plan_exec_free(p->exec);
  for (int i = 0; i < p->neqn; i++) plan_eqn_clear(&p->eqns[i]);
  for (int i = 0; i < p->nconst; i++) val_decref(p->consts[i]);
  atoms_free(p->nout, p->outs);
  shm_free(p->eqns);
  for (int i = 0; p->named && i < p->nvars; i++) shm_free(p->named[i]);
  shm_free(p->named);
  shm_free(p->vars);
  shm_free(p->constvars);
  shm_free(p->consts);
  shm_free(p->invars);
  shm_free(p);
}

/* ==== printing ============================================================= */

/* The naming context: the next letter number, shared by nested plans. */
typedef struct Names {
  int next;
} Names;

/* JAX's alphabetic names: 0 -> a, 25 -> z, 26 -> ba, 27 -> bb, ... */
static void var_name(int n, char *buf) {
  char tmp[16];
  int k = 0;
  do {
    tmp[k++] = (char)('a' + n % 26);
    n /= 26;
  } while (n && k < 15);
  for (int i = 0; i < k; i++) buf[i] = tmp[k - 1 - i];
  buf[k] = 0;
}

/* Per plan being printed: the letter number of each variable (-1: none
 * yet) and whether it is used. */
typedef struct PrintCtx {
  StrBuf *t;
  Names *names;
  int *name_of;
  bool *used;
  const Plan *p;
} PrintCtx;

static void print_plan_at(StrBuf *t, Names *names, const Plan *p, int indent, const bool *live);

static void put_aval(StrBuf *t, const AVal *a) {
  char buf[256];
  aval_str(buf, sizeof buf, a->dtype, a->ndim, a->shape);
  sbuf_puts(t, buf);
}

/* A 0-d concrete array as the Python number it holds. */
static void put_scalar(StrBuf *t, Array *a) {
  char buf[64];
  if (a->dtype == DT_BOOL) sbuf_puts(t, arr_get_i64(a, 0) ? "True" : "False");
  else if (dt_is_float(a->dtype)) {
    print_float_scalar(buf, sizeof buf, arr_get_f64(a, 0), a->dtype);
    sbuf_puts(t, buf);
  } else {
    sbuf_printf(t, "%lld", (long long)arr_get_i64(a, 0));
  }
}

/* `{batch=20, hidden=8}` after a named variable's aval (LANGUAGE.md §10). */
static void put_named(StrBuf *t, const NamedShape *ns) {
  if (!ns || !ns->n) return;
  sbuf_puts(t, "{");
  for (int i = 0; i < ns->n; i++)
    sbuf_printf(t, "%s%s=%lld", i ? ", " : "", ns->name[i], (long long)ns->size[i]);
  sbuf_puts(t, "}");
}

static void bind_var(PrintCtx *c, int v) {
  char buf[16];
  c->name_of[v] = c->names->next++;
  var_name(c->name_of[v], buf);
  sbuf_puts(c->t, buf);
  sbuf_puts(c->t, ":");
  put_aval(c->t, &c->p->vars[v]);
  put_named(c->t, plan_var_named(c->p, v));
}

static void put_atom(PrintCtx *c, const PlanAtom *a) {
  if (a->var < 0) {
    put_scalar(c->t, AS_ARRAY(a->lit));
    sbuf_puts(c->t, ":");
    AVal av;
    aval_of(AS_ARRAY(a->lit), &av);
    put_aval(c->t, &av);
    return;
  }
  char buf[16];
  if (c->name_of[a->var] < 0) {
    sbuf_puts(c->t, "?");
    return;
  }
  var_name(c->name_of[a->var], buf);
  sbuf_puts(c->t, buf);
}

static bool holds_plan(Value *v) {
  if (IS_PLAN(v)) return true;
  if (v->type != V_TUPLE) return false;
  for (size_t i = 0; i < tuple_len(v); i++)
    if (holds_plan(tuple_get(v, i))) return true;
  return false;
}

/* A parameter value without sub-plans, as JAX prints it. */
static void put_value(StrBuf *t, Value *v) {
  char buf[512];
  switch ((VType)v->type) {
  case V_NONE: sbuf_puts(t, "None"); return;
  case V_STR: sbuf_printf(t, "'%s'", str_cstr(v)); return;
  case V_DTYPE: sbuf_puts(t, dt_name(((DTypeVal *)v)->dtype)); return;
  case V_PSPEC: pspec_str((PSpec *)v, buf, sizeof buf); sbuf_puts(t, buf); return;
  case V_MESH: {
    const Mesh *m = (const Mesh *)v;
    if (m->name) {
      sbuf_puts(t, m->name);
      return;
    }
    sbuf_puts(t, m->abstract ? "AbstractMesh(" : "Mesh(");
    for (int i = 0; i < m->naxes; i++) sbuf_printf(t, "%s%s=%d", i ? ", " : "", m->axis_names[i], m->axis_sizes[i]);
    sbuf_puts(t, ")");
    return;
  }
  case V_TUPLE:
    sbuf_puts(t, "(");
    for (size_t i = 0; i < tuple_len(v); i++) {
      if (i) sbuf_puts(t, ", ");
      put_value(t, tuple_get(v, i));
    }
    sbuf_puts(t, tuple_len(v) == 1 ? ",)" : ")");
    return;
  case V_ARRAY:
    if (AS_ARRAY(v)->ndim == 0) {
      put_scalar(t, AS_ARRAY(v));
      return;
    }
    break;
  default: break;
  }
  Value *r = val_repr(v);
  if (!r) {
    err_clear();
    sbuf_puts(t, "?");
    return;
  }
  sbuf_puts(t, str_cstr(r));
  val_decref(r);
}

/* A parameter holding sub-plans, on lines of its own at [indent]. */
static void put_plan_param(PrintCtx *c, Value *v, int indent) {
  if (IS_PLAN(v)) {
    print_plan_at(c->t, c->names, AS_PLAN(v), indent, NULL);
    return;
  }
  sbuf_puts(c->t, "(\n");
  for (size_t i = 0; i < tuple_len(v); i++) {
    sbuf_spaces(c->t, indent + 2);
    put_plan_param(c, tuple_get(v, i), indent + 2);
    sbuf_puts(c->t, "\n");
  }
  sbuf_spaces(c->t, indent);
  sbuf_puts(c->t, ")");
}

static bool eqn_has_plans(const PlanEqn *e) {
  for (int i = 0; i < e->params.n; i++)
    if (holds_plan(e->params.p[i].value)) return true;
  return false;
}

static void put_params(PrintCtx *c, const PlanEqn *e, int indent) {
  const Params *ps = &e->params;
  if (!ps->n) return;
  if (!eqn_has_plans(e)) {
    sbuf_puts(c->t, "[");
    for (int i = 0; i < ps->n; i++) {
      sbuf_printf(c->t, "%s%s=", i ? " " : "", ps->p[i].name);
      put_value(c->t, ps->p[i].value);
    }
    sbuf_puts(c->t, "]");
    return;
  }
  sbuf_puts(c->t, "[\n");
  for (int i = 0; i < ps->n; i++) {
    sbuf_spaces(c->t, indent + 2);
    sbuf_printf(c->t, "%s=", ps->p[i].name);
    if (holds_plan(ps->p[i].value)) put_plan_param(c, ps->p[i].value, indent + 2);
    else put_value(c->t, ps->p[i].value);
    sbuf_puts(c->t, "\n");
  }
  sbuf_spaces(c->t, indent);
  sbuf_puts(c->t, "]");
}

static void put_eqn(PrintCtx *c, const PlanEqn *e, int indent) {
  sbuf_spaces(c->t, indent);
  for (int i = 0; i < e->nout; i++) {
    if (i) sbuf_puts(c->t, " ");
    if (c->used[e->out[i]]) {
      bind_var(c, e->out[i]);
    } else {
      sbuf_puts(c->t, "_:");
      put_aval(c->t, &c->p->vars[e->out[i]]);
      put_named(c->t, plan_var_named(c->p, e->out[i]));
    }
  }
  /* an equation without results (debug_callback) prints as JAX's: no `=` */
  sbuf_printf(c->t, e->nout ? " = %s" : "%s", prim_table[e->prim].name);
  put_params(c, e, indent);
  for (int i = 0; i < e->nin; i++) {
    sbuf_puts(c->t, " ");
    put_atom(c, &e->in[i]);
  }
  sbuf_puts(c->t, "\n");
}

static void mark_used(const Plan *p, const bool *live, bool *used) {
  for (int i = 0; i < p->neqn; i++)
    for (int j = 0; j < p->eqns[i].nin; j++)
      if ((!live || live[i]) && p->eqns[i].in[j].var >= 0) used[p->eqns[i].in[j].var] = true;
  for (int i = 0; i < p->nout; i++)
    if (p->outs[i].var >= 0) used[p->outs[i].var] = true;
}

static void put_outs(PrintCtx *c) {
  sbuf_puts(c->t, "(");
  for (int i = 0; i < c->p->nout; i++) {
    if (i) sbuf_puts(c->t, ", ");
    put_atom(c, &c->p->outs[i]);
  }
  sbuf_puts(c->t, c->p->nout == 1 ? ",)" : ")");
}

/* Prints [p] whose `{` is at column [indent]: equations at indent + 4,
 * `in` at indent + 2. */
/* The partitioner's comments after equation [i], each line indented as
 * the equations. */
int plan_note_add(Plan *p, int i, const char *text) {
  if (i >= p->nnotes) {
    int n = i + 1 > 2 * p->nnotes ? i + 1 : 2 * p->nnotes;
    char **g = shm_realloc(p->notes, sizeof(char *) * (size_t)n);
    if (!g) return err_nomem(), -1;
    memset(g + p->nnotes, 0, sizeof(char *) * (size_t)(n - p->nnotes));
    p->notes = g;
    p->nnotes = n;
  }
  size_t old = p->notes[i] ? strlen(p->notes[i]) : 0, add = strlen(text);
  char *s = shm_realloc(p->notes[i], old + add + 1);
  if (!s) return err_nomem(), -1;
  memcpy(s + old, text, add + 1);
  p->notes[i] = s;
  return 0;
}

static void put_notes(StrBuf *t, const Plan *p, int i, int indent) {
  const char *s = i < p->nnotes ? p->notes[i] : NULL;
  while (s && *s) {
    const char *nl = strchr(s, '\n');
    size_t n = nl ? (size_t)(nl - s) : strlen(s);
    sbuf_spaces(t, indent);
    sbuf_printf(t, "%.*s\n", (int)n, s);
    s += n + (nl != NULL);
  }
}

/* [live] (NULL: every equation): the equations printed. */
static void print_plan_at(StrBuf *t, Names *names, const Plan *p, int indent, const bool *live) {
  int n = p->nvars ? p->nvars : 1;
  PrintCtx c = {t, names, shm_malloc(sizeof(int) * (size_t)n), shm_calloc((size_t)n, 1), p};
  if (!c.name_of || !c.used) {
    t->failed = true;
    shm_free(c.name_of);
    shm_free(c.used);
    return;
  }
  for (int i = 0; i < n; i++) c.name_of[i] = -1;
  mark_used(p, live, c.used);
  sbuf_puts(t, "{ lambda ");
  for (int i = 0; i < p->nconst; i++) {
    bind_var(&c, p->constvars[i]);
    sbuf_puts(t, " ");
  }
  sbuf_puts(t, ";");
  for (int i = 0; i < p->nin; i++) {
    sbuf_puts(t, " ");
    bind_var(&c, p->invars[i]);
  }
  if (p->neqn == 0) {
    sbuf_puts(t, ". let  in ");
  } else {
    sbuf_puts(t, ". let\n");
    for (int i = 0; i < p->neqn; i++) {
      if (live && !live[i]) continue;
      put_eqn(&c, &p->eqns[i], indent + 4);
      put_notes(t, p, i, indent + 4);
    }
    sbuf_spaces(t, indent + 2);
    sbuf_puts(t, "in ");
  }
  put_outs(&c);
  sbuf_puts(t, " }");
  shm_free(c.name_of);
  shm_free(c.used);
}

Value *plan_str(Plan *p) {
  StrBuf t = {0};
  Names names = {0};
  print_plan_at(&t, &names, p, 0, NULL);
  return str_take(&t);
}

Value *plan_str_live(Plan *p, const bool *live) {
  StrBuf t = {0};
  Names names = {0};
  print_plan_at(&t, &names, p, 0, live);
  return str_take(&t);
}

static Value *plan_repr(Value *v) { return plan_str(AS_PLAN(v)); }

/* ==== attributes ============================================================ */

static Value *avals_str(const Plan *p, bool outs) {
  StrBuf t = {0};
  int n = outs ? p->nout : p->nin;
  sbuf_puts(&t, "(");
  for (int i = 0; i < n; i++) {
    AVal a;
    if (outs) plan_atom_aval(p, &p->outs[i], &a);
    else a = p->vars[p->invars[i]];
    if (i) sbuf_puts(&t, ", ");
    put_aval(&t, &a);
  }
  sbuf_puts(&t, n == 1 ? ",)" : ")");
  return str_take(&t);
}

static Value *plan_getattr(Value *self, const char *name) {
  Plan *p = AS_PLAN(self);
  if (!strcmp(name, "eqns")) return val_int(p->neqn);
  if (!strcmp(name, "nconsts")) return val_int(p->nconst);
  if (!strcmp(name, "in_avals")) return avals_str(p, false);
  if (!strcmp(name, "out_avals")) return avals_str(p, true);
  return err_set(ERR_ATTRIBUTE, "'plan' object has no attribute '%s'", name);
}

void plan_register(void) {
  val_register_free(V_PLAN, plan_free);
  print_register(V_PLAN, plan_repr, plan_repr);
  ops_register_getattr(V_PLAN, plan_getattr);
}
