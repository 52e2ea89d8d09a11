/*
 * partition.c - sharding propagation over a plan (partition.h).
 */
#include <string.h>

#include "base/mem.h"
#include "base/strbuf.h"
#include "transform/partition.h"

/* The pass's state: each variable's layout and each equation's notes. */
typedef struct Part {
  Plan *p;
  Mesh *mesh;
  Sharding *vars;   /* owned, p->nvars */
  StrBuf *notes;    /* owned, p->neqn + 1 */
} Part;

/* [s] replicated at rank [ndim] over the mesh. */
static void replicated(const Part *pt, int ndim, Sharding *s) {
  memset(s, 0, sizeof *s);
  s->ndim = ndim;
  s->naxes = pt->mesh->naxes;
  for (int i = 0; i < s->naxes; i++) s->axis_sizes[i] = pt->mesh->axis_sizes[i];
}

static void atom_sharding(const Part *pt, const PlanAtom *a, Sharding *s) {
  AVal av;
  plan_atom_aval(pt->p, a, &av);
  if (a->var >= 0) *s = pt->vars[a->var];
  else replicated(pt, av.ndim, s);
}

/* Writes the mesh axes of [bits] as "'x', 'y'". */
static void put_axes(StrBuf *b, const Mesh *m, uint32_t bits) {
  bool first = true;
  for (int i = 0; i < m->naxes; i++)
    if (bits >> i & 1) {
      sbuf_printf(b, "%s'%s'", first ? "" : ", ", m->axis_names[i]);
      first = false;
    }
}

static uint32_t dim_axes(const Sharding *s, int d) {
  uint32_t u = 0;
  for (int k = 0; k < s->nsplit[d]; k++) u |= 1u << s->split[d][k];
  return u;
}

/* Notes the resharding of a value laid out as [have] to [want]: an
 * all_gather of the mesh axes it stops being split by, a local slice
 * (no communication) for those it starts being split by, all_to_all
 * when one dimension's axes move to another. */
static void note_reshard(Part *pt, StrBuf *b, const char *where, const Sharding *have,
                         const Sharding *want, const char *what) {
  uint32_t gone = 0, come = 0;
  for (int d = 0; d < have->ndim; d++) {
    uint32_t h = dim_axes(have, d), w = dim_axes(want, d);
    if (h == w) continue;
    gone |= h & ~w;
    come |= w & ~h;
  }
  if (!gone && !come) return;
  const char *coll = gone && come ? (gone & come ? "all_to_all" : "all_gather, then a local slice")
                                  : gone ? "all_gather" : "local slice";
  sbuf_printf(b, "# %s: %s over ", where, coll);
  put_axes(b, pt->mesh, gone | come);
  sbuf_printf(b, ": %s\n", what);
}

/* One equation: its operands resharded as its rule asks, its results'
 * layouts, its partial results completed. */
static int part_eqn(Part *pt, int k) {
  PlanEqn *e = &pt->p->eqns[k];
  const PrimInfo *pi = &prim_table[e->prim];
  int nin = e->nin;
  Sharding *have = shm_calloc((size_t)nin * 2 + 2, sizeof(Sharding));
  AVal *av = shm_calloc((size_t)nin + 1, sizeof(AVal));
  if (!have || !av) {
    shm_free(have);
    shm_free(av);
    err_nomem();
    return -1;
  }
  Sharding *want = have + nin, out;
  for (int i = 0; i < nin; i++) {
    plan_atom_aval(pt->p, &e->in[i], &av[i]);
    atom_sharding(pt, &e->in[i], &have[i]);
    want[i] = have[i];
  }
  bool ruled = pi->rules.sharding && e->nout == 1 && pi->kind != PK_HIGHER;
  int rc = 0;
  if (ruled) rc = pi->rules.sharding(av, want, nin, &e->params, &out);
  for (int i = 0; !ruled && i < nin; i++) replicated(pt, av[i].ndim, &want[i]);
  char what[160], where[32];
  snprintf(where, sizeof where, "line %d", e->loc.line);
  for (int i = 0; rc == 0 && i < nin; i++) {
    if (ruled) snprintf(what, sizeof what, "%s's operand %d laid out as its rule needs", pi->name, i);
    else snprintf(what, sizeof what, "%s has no sharding rule: its operands are replicated", pi->name);
    note_reshard(pt, &pt->notes[k], where, &have[i], &want[i], what);
  }
  if (rc == 0 && ruled && out.partial) {
    sbuf_printf(&pt->notes[k], "# line %d: %s over ", e->loc.line, out.partial_coll);
    put_axes(&pt->notes[k], pt->mesh, out.partial);
    sbuf_printf(&pt->notes[k], ": %s %s a dimension split by ", pi->name,
                strcmp(out.partial_coll, "psum") ? "reduces over" : "sums over");
    put_axes(&pt->notes[k], pt->mesh, out.partial);
    sbuf_puts(&pt->notes[k], "\n");
    out.partial = 0;
  }
  for (int j = 0; rc == 0 && j < e->nout; j++) {
    AVal oa = pt->p->vars[e->out[j]];
    if (ruled) pt->vars[e->out[j]] = out;
    else replicated(pt, oa.ndim, &pt->vars[e->out[j]]);
  }
  shm_free(have);
  shm_free(av);
  return rc;
}

/* Output [i]'s NamedSharding, resharded to [want] when given. */
static Value *part_out(Part *pt, int i, Value *want) {
  Sharding s;
  atom_sharding(pt, &pt->p->outs[i], &s);
  if (!want) return sharding_from_rule(pt->mesh, &s);
  NamedSharding *w = (NamedSharding *)want;
  Sharding ws;
  char where[32];
  snprintf(where, sizeof where, "output %d", i);
  sharding_to_rule(w, s.ndim, &ws);
  if (!w->mesh) replicated(pt, s.ndim, &ws);
  note_reshard(pt, &pt->notes[pt->p->neqn], where, &s, &ws, "out_shardings asks for it");
  return val_incref(want);
}

/* Moves the notes into the plan, where plan_str prints them. */
static int part_annotate(Part *pt) {
  Plan *p = pt->p;
  char **notes = shm_calloc((size_t)p->neqn + 1, sizeof(char *));
  if (!notes) return err_nomem(), -1;
  for (int i = 0; i <= p->neqn; i++) {
    if (!pt->notes[i].len) continue;
    size_t n = pt->notes[i].len;
    if (!(notes[i] = shm_malloc(n + 1))) continue;
    memcpy(notes[i], sbuf_text(&pt->notes[i]), n + 1);
  }
  for (int i = 0; p->notes && i <= p->neqn; i++) shm_free(p->notes[i]);
  shm_free(p->notes);
  p->notes = notes;
  return 0;
}

int part_propagate(Plan *p, Mesh *mesh, Value *const *in, Value *const *want, Value **out,
                   bool annotate) {
  Part pt = {p, mesh, shm_calloc((size_t)p->nvars + 1, sizeof(Sharding)),
             shm_calloc((size_t)p->neqn + 1, sizeof(StrBuf))};
  int rc = pt.vars && pt.notes ? 0 : (err_nomem(), -1);
  for (int v = 0; rc == 0 && v < p->nvars; v++) replicated(&pt, p->vars[v].ndim, &pt.vars[v]);
  for (int i = 0; rc == 0 && i < p->nin; i++)
    if (in[i] && ((NamedSharding *)in[i])->mesh)
      sharding_to_rule((NamedSharding *)in[i], p->vars[p->invars[i]].ndim, &pt.vars[p->invars[i]]);
  for (int k = 0; rc == 0 && k < p->neqn; k++) rc = part_eqn(&pt, k);
  for (int i = 0; i < p->nout; i++) out[i] = NULL;
  for (int i = 0; rc == 0 && i < p->nout; i++)
    if (!(out[i] = part_out(&pt, i, want ? want[i] : NULL))) rc = -1;
  if (rc == 0 && annotate) rc = part_annotate(&pt);
  for (int i = 0; pt.notes && i <= p->neqn; i++) sbuf_free(&pt.notes[i]);
  shm_free(pt.notes);
  shm_free(pt.vars);
  return rc;
}

/* The NamedSharding of leaf [v] (borrowed), or NULL when unsharded. */
static Value *leaf_sharding(Value *v) {
  if (!IS_ARRAY(v) || !AS_ARRAY(v)->sharding) return NULL;
  return ((NamedSharding *)AS_ARRAY(v)->sharding)->mesh ? AS_ARRAY(v)->sharding : NULL;
}

/* The [i]th of out_shardings [o]: itself when one sharding, else its
 * [i]th entry (NULL past its end or for a non-sharding). */
static Value *want_at(Value *o, int i) {
  size_t n;
  Value *const *items;
  if (!o) return NULL;
  if (sharding_is(o)) return o;
  if (val_seq(o, &n, &items) && (size_t)i < n && sharding_is(items[i])) return items[i];
  return NULL;
}

Mesh *part_mesh(Value *const *leaves, int n, Value *out_shardings) {
  for (int i = 0; i < n; i++) {
    Value *s = leaf_sharding(leaves[i]);
    if (s) return ((NamedSharding *)s)->mesh;
  }
  Value *w = want_at(out_shardings, 0);
  return w ? ((NamedSharding *)w)->mesh : NULL;
}

/* Propagation from the leaves' shardings; [out] gets p->nout references. */
static int from_leaves(Plan *p, Mesh *m, Value *const *leaves, Value *want_tree, Value **out,
                       bool annotate) {
  Value **in = shm_calloc((size_t)p->nin + 1, sizeof(Value *));
  Value **want = shm_calloc((size_t)p->nout + 1, sizeof(Value *));
  int rc = in && want ? 0 : (err_nomem(), -1);
  for (int i = 0; rc == 0 && i < p->nin; i++) in[i] = leaf_sharding(leaves[i]);
  for (int i = 0; rc == 0 && i < p->nout; i++) want[i] = want_at(want_tree, i);
  if (rc == 0) rc = part_propagate(p, m, in, want_tree ? want : NULL, out, annotate);
  shm_free(in);
  shm_free(want);
  return rc;
}

int part_lay_out(Plan *p, Value *const *leaves, Value **outs) {
  Mesh *m = part_mesh(leaves, p->nin, NULL);
  if (!m) return 0;
  Value **sh = shm_calloc((size_t)p->nout + 1, sizeof(Value *));
  int rc = sh ? from_leaves(p, m, leaves, NULL, sh, false) : (err_nomem(), -1);
  for (int i = 0; rc == 0 && i < p->nout; i++) {
    Value *v = sharding_put(outs[i], (NamedSharding *)sh[i]);
    if (!v) rc = -1;
    else {
      val_decref(outs[i]);
      outs[i] = v;
    }
  }
  for (int i = 0; sh && i < p->nout; i++)
    if (sh[i]) val_decref(sh[i]);
  shm_free(sh);
  return rc;
}

int part_annotate_plan(Plan *p, Value *const *leaves, Value *out_shardings) {
  Mesh *m = part_mesh(leaves, p->nin, out_shardings);
  if (!m) return 0;
  Value **sh = shm_calloc((size_t)p->nout + 1, sizeof(Value *));
  int rc = sh ? from_leaves(p, m, leaves, out_shardings, sh, true) : (err_nomem(), -1);
  for (int i = 0; sh && i < p->nout; i++)
    if (sh[i]) val_decref(sh[i]);
  shm_free(sh);
  return rc;
}
