/*
 * plan.h - a staged plan: the typed, first-order program jit records, and
 * its printed form (LANGUAGE.md §6; semantics: seed 004, the jaxpr).
 *
 * A Plan is a list of equations over typed variables:
 *
 *     { lambda CONSTVARS ; INVARS. let
 *         OUTVARS = PRIMITIVE[PARAMS] OPERANDS
 *         ...
 *       in (OUTS) }
 *
 * Variables are numbered 0..nvars-1 inside one plan and carry an AVal
 * (dtype, weak flag, shape, vma).  An operand or an output is an Atom: a
 * variable, or an inline literal (a 0-d concrete array, printed
 * `3.0:f32[]`).  Constvars stand for concrete arrays hoisted out of
 * the traced code (closures, constant folding); the plan owns those arrays
 * in [consts], one per constvar.
 *
 * Higher-order primitives (cond, while, scan, pjit, shard_map) carry their
 * sub-plans as parameters: a Params value of type V_PLAN, or a Tuple of
 * them (cond's branches).  A sub-plan has no constvars of its own: what it
 * captures becomes leading invars, fed by operands of its equation, as in
 * the seed's cond/while/scan examples.
 *
 * Ownership.  A Plan is a Value (V_PLAN), reference counted, immutable once
 * built (plan_* builders are for the tracer and the passes, before the
 * plan is shared).  [exec] is the compiled form (compile.h), made lazily
 * and freed with the plan through the hook plan_exec_free.
 *
 * Printing follows current JAX (jax._src.core's pretty printer): binders
 * typed `a:f32[8]`, names a..z, ba, bb, ... given in order of appearance
 * and continued through sub-plans, parameters in stored order, a sub-plan
 * parameter on lines of its own, indented.
 */
#ifndef SHMAP_PLAN_H
#define SHMAP_PLAN_H

#include "base/error.h"
#include "array/prim.h"
#include "base/value.h"

/* An operand or output: variable [var] (>= 0), or the literal [lit]
 * (var == -1; an owned 0-d concrete Array). */
typedef struct PlanAtom {
  int var;
  Value *lit;
} PlanAtom;

/* The named shape of a value inside an xmap body (LANGUAGE.md §10;
 * semantics: seed 001, JAX's named_shape): named axes and their sizes, in
 * the order the enclosing xmaps introduced them.  Positional shapes stay
 * in the AVal; a variable's named shape is printed after it,
 * `f32[5]{batch=20}`. */
enum { PLAN_MAXNAMES = 16 };
typedef struct NamedShape {
  int n;
  const char *name[PLAN_MAXNAMES];   /* interned */
  int64_t size[PLAN_MAXNAMES];
} NamedShape;

/* One equation: outs = prim[params] in. */
typedef struct PlanEqn {
  PrimId prim;
  Params params;     /* owned; sub-plans are V_PLAN values in it */
  int nin, nout;
  PlanAtom *in;      /* owned array of nin atoms */
  int *out;          /* owned array of nout variable ids */
  Loc loc;           /* user source location that made it (src counted) */
  uint32_t auto_axes; /* mesh axes staged as Auto though Explicit in the mesh
                         (inside jax.sharding.auto_axes): the partitioner's
                         rules treat them so */
  bool true_first;   /* a lax.cond's (bool predicate): JAX traced its branches
                        (true_fun, false_fun), the reverse of `branches`, so
                        the partitioner checks the true branch first */
} PlanEqn;

typedef struct Plan {
  Value hdr;         /* V_PLAN */
  const char *name;  /* interned function name, or NULL */
  int nvars, capvars;
  AVal *vars;        /* aval of each variable */
  NamedShape **named;/* owned: named shape of each variable (NULL: none); NULL when no
                        variable has one (every plan outside an xmap body) */
  int nconst;
  int *constvars;    /* variable ids of the constvars */
  Value **consts;    /* owned concrete Arrays, one per constvar */
  int nin;
  int *invars;       /* variable ids of the inputs */
  int neqn, capeqn;
  PlanEqn *eqns;
  int nout;
  PlanAtom *outs;    /* owned */
  void *exec;        /* compile.h's Exec, or NULL until compiled */
  char **notes;      /* owned, or NULL: per equation, the partitioner's comment
                        lines printed after it (NULL: none; transform/partition.h) */
  int nnotes;        /* entries of [notes]: equations past them have none */
  Value *in_labels;  /* owned Tuple of Str, one per input, naming it in messages (a
                        shard_map body's: "argument 0 ('c')"), or NULL: "argument i" */
  Loc ret;           /* a traced shard_map body's return (its last statement run;
                        owns a reference to its source), where the replication error
                        points as the eager call's does; {0}: unknown */
} Plan;

static inline Plan *AS_PLAN(Value *v) { return (Plan *)v; }
static inline bool IS_PLAN(const Value *v) { return v && v->type == V_PLAN; }

/* A new empty plan named [name] (interned or NULL).  NULL on nomem. */
Plan *plan_new(const char *name);

/* Adds a variable of aval [a]; returns its id, or -1 on nomem (error set). */
int plan_add_var(Plan *p, const AVal *a);

/* Sets variable [var]'s named shape to [ns] (copied; n == 0 clears it).
 * 0, or -1 on nomem. */
int plan_set_named(Plan *p, int var, const NamedShape *ns);

/* Variable [var]'s named shape (borrowed), or NULL when it has none. */
const NamedShape *plan_var_named(const Plan *p, int var);

/* Index of [name] in [ns], or -1. */
int plan_named_find(const NamedShape *ns, const char *name);

/* Adds [name] of [size] to [ns] unless there; 0, or -1 (too many names,
 * error set). */
int plan_named_add(NamedShape *ns, const char *name, int64_t size);

/* Removes [name] from [ns] if there. */
void plan_named_remove(NamedShape *ns, const char *name);

/* Appends [var] to the invars; 0 or -1 on nomem. */
int plan_add_invar(Plan *p, int var);

/* Inserts [var] as an invar at position [at] (captures go first). */
int plan_insert_invar(Plan *p, int at, int var);

/* Adds a constvar standing for the concrete array [value] (borrowed);
 * returns its variable id or -1. */
int plan_add_const(Plan *p, Value *value);

/*
 * Appends an equation: [nin] atoms (literals borrowed, copied with a new
 * reference), [nout] output variable ids, params [params] (moved: the
 * caller's Params is left empty), location [loc].  Returns the equation's
 * index or -1 (params released on failure).
 */
int plan_add_eqn(Plan *p, PrimId prim, Params *params, int nin, const PlanAtom *in,
                 int nout, const int *out, Loc loc);

/* Sets the outputs (atoms copied as above).  0 or -1. */
int plan_set_outs(Plan *p, int nout, const PlanAtom *outs);

/* The aval of atom [a] of [p]. */
void plan_atom_aval(const Plan *p, const PlanAtom *a, AVal *out);

/* Why each variable of [p] varies over the mesh axes its aval's vma
 * names, as an eager body's arrays record it (array.h, VmaWhy): input i
 * varies by its in_spec (VmaWhy.arg = i + 1, captures counted), an
 * equation's results by prim_vma_why of its operands' reasons and its
 * source line; an equation with a body (cond, while, a nested jit) that
 * adds axes, by the primitive in it that adds them (an axis_index in a
 * branch).  Fills [why] (nvars entries). */
void plan_vma_whys(const Plan *p, VmaWhy *why);

/* Appends the comment line(s) [text] (ending in a newline) to those
 * printed after equation [i] of [p] (plan_str).  0, or -1 on out of
 * memory (the error set). */
int plan_note_add(Plan *p, int i, const char *text);

/* Releases what an equation owns (used by the passes when they drop one). */
void plan_eqn_clear(PlanEqn *e);

/*
 * The printed form, exactly the jaxpr grammar of seed 004 with current
 * JAX's typed binders and inline literals (LANGUAGE.md §6).  A new Str, or
 * NULL on nomem.  Example:
 *   { lambda ; a:f32[8] b:f32[8]. let
 *       c:f32[8] = sin b
 *       d:f32[8] = mul c 3.0:f32[]
 *     in (d,) }
 */
Value *plan_str(Plan *p);

/* plan_str printing only the equations [live] marks (one flag per
 * equation of [p], borrowed); nested plans are printed whole.  The
 * compiled text (Compiled.as_text) without dead code.  A new Str, or
 * NULL on nomem. */
Value *plan_str_live(Plan *p, const bool *live);

/* Frees what a compiled form owns; set by compile.c. */
extern void (*plan_exec_free)(void *exec);

/* Registers V_PLAN's destructor, printer and attributes (`.eqns` count,
 * `.nconsts`, `.in_avals`, `.out_avals` as strings).  Call once at start-up. */
void plan_register(void);

#endif
