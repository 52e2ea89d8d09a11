/*
 * partition.h - Auto mode: jit on sharded arrays as a per-device program
 * (shmap(7), THE THREE MODES; semantics: GSPMD's propagation as JAX's jit
 * applies it to sharded arguments, in_shardings and out_shardings, and
 * the shard_map design (seed 000) for the per-device program it lowers
 * to).
 *
 * Propagation (partition.c): from the shardings of a plan's inputs, each
 * equation's sharding rule (prim.h, PrimRules.sharding) gives the layout
 * its operands are resharded to and its results' layout, with partial
 * results a psum, pmax or pmin completes.  An equation is kept split only
 * when its blocks compute its result's blocks: every split dimension
 * divides evenly and the primitive's shape rule, on the blocks' avals
 * (with a "shape" or "new_sizes" parameter made the block's), gives the
 * result block's aval.  Otherwise, and for primitives without a rule
 * (gathers, sorts, iota, random bits, control flow), its operands are
 * replicated first and it computes the whole result on every device.
 * A shard_map equation runs its body in place on the blocks its in_specs
 * give; one manual over some axes only (manual_axes) has its body
 * partitioned in turn along its automatic axes, from the layouts its
 * operands have there (shmap(7), "shard_map").
 * The pass records the communication per equation with the source line
 * and the reason, as comments plan() prints.
 *
 * Execution (partition_run.c): the plan becomes the body of a shard_map
 * over the mesh, in_specs the arguments' shardings, out_specs the
 * results': each device interprets the plan on its blocks, resharding
 * operands with all_gather (tiled) and local dynamic slices by
 * axis_index, and completing partial results with psum, pmax or pmin
 * where they are next used: a psum's partial sum passes through linear
 * equations first (a contraction then a sum: one psum of the smaller
 * result, as GSPMD orders it).
 * jit stages and compiles that shard_map like any other, so the inserted
 * collectives run on the device threads, the collective engine and the
 * MPI transport, and --comm-stats counts them by source line.
 */
#ifndef SHMAP_PARTITION_H
#define SHMAP_PARTITION_H

#include "spmd/sharding.h"
#include "transform/plan.h"
#include "transform/trace.h"

/* One equation's decision. */
typedef struct PartEqn {
  Sharding *want;    /* owned, nin: the layout each operand is resharded to (a
                        partial operand whose want is not partial is completed) */
  Sharding out;      /* every result's layout; out.partial: the axes over which it
                        is a partial sum (completed where it is next used) */
  bool manual;       /* a shard_map over the plan's mesh: its body runs on the
                        blocks its in_specs give (Manual inside Auto) */
  bool sliced;       /* its blocks do not compute the result: computed whole on
                        replicated operands, each device keeps its block of the
                        result's type [out] (Explicit mode, prim.h ShardingRule) */
  bool local;        /* [params] replace the equation's for blocks */
  Params params;     /* owned when [local] */
  struct PartPlan **subs; /* owned: cond's branches, while's cond and body, scan's
                        body, partitioned; a partial-manual shard_map's body
                        partitioned along its automatic axes (NULL: none) */
  int nsubs;
} PartEqn;

/* A plan with its layouts: an Opaque value, so a shard_map body can own
 * it.  Immutable once made; device threads read it freely. */
typedef struct PartPlan {
  Opaque base;
  Plan *p;           /* owned reference: the global plan */
  Mesh *mesh;        /* owned reference */
  Sharding *vars;    /* owned, p->nvars: each variable's layout, partial or not */
  int *origin;       /* owned, p->nvars: the equation that made a partial sum */
  PartEqn *eqns;     /* owned, p->neqn */
  Sharding *outs;    /* owned, p->nout: each result's layout as returned */
  char **notes;      /* owned, p->neqn + 1 (NULL entries: none): the comments on
                        each equation's operand reshards and completions, then on
                        the outputs' */
  bool annotate;     /* staging the body writes the comments into its plan (plan()) */
} PartPlan;

/* Propagates shardings through [p] over [mesh] (both borrowed; a
 * reference is kept) from [in] (p->nin NamedSharding values or NULL for
 * an unsharded input; borrowed).  [want] (p->nout values or NULL;
 * borrowed, or NULL for none) are out_shardings asked for: an output is
 * resharded to it.  New reference, or NULL with the error set. */
PartPlan *part_plan(Plan *p, Mesh *mesh, Value *const *in, Value *const *want);

/* Makes staging [pp]'s body (and its sub-plans') write the comments
 * into the staged plan (plan()). */
void part_plan_set_annotate(PartPlan *pp);

/* The mesh of the first array among [leaves] (borrowed) split over its
 * mesh, else of the first laid out over one, else that of
 * [out_shardings] (a sharding or a tuple of them, or NULL), else NULL:
 * the mesh a jit call partitions over (as the eager rules pick it:
 * sharding_operands_ref). */
Mesh *part_mesh(Value *const *leaves, int n, Value *out_shardings);

/* The mesh a jit of [p] partitions over whatever its arguments
 * (borrowed): the first sharding_constraint's among p's equations (those
 * in a partial-manual shard_map's body included), else that of the
 * shard_maps among them and their nested jits' when one real mesh
 * (their results are laid out by their out_specs, eagerly as in the jit:
 * shmap(7), MANUAL INSIDE), else NULL.  Shard_maps over different meshes
 * are no one partitioned program's (part_meshes_differ). */
Mesh *part_constraint_mesh(const Plan *p);

/* Whether the shard_maps among [p]'s equations and its nested jits' run
 * over meshes that differ from one another or from the mesh a jit of p
 * on [leaves] ([n] arguments, borrowed) with [out_shardings] partitions
 * over (part_mesh, else a sharding constraint's): no per-device program
 * over one mesh runs them, so the jit runs its plan as eager code would
 * (jit.c). */
bool part_meshes_differ(const Plan *p, Value *const *leaves, int n, Value *out_shardings);

/* The sharding jit's [out_shardings] asks of output [i] (borrowed), or
 * NULL when none. */
Value *part_want_at(Value *out_shardings, int i);

/* part_plan for a call of [p] on [leaves] (p->nin arrays, borrowed) with
 * jit's [out_shardings] (one sharding for every output, a tuple of one
 * per output, or NULL), over the mesh of the leaves, else of
 * out_shardings, else of a sharding_constraint.  NULL with no error set
 * when nothing is sharded (no mesh), else as part_plan. */
PartPlan *part_plan_call(Plan *p, Value *const *leaves, Value *out_shardings);

/* How dimension [d] goes from [have] to [want]: whether it is first
 * all_gathered (tiled) over all of have's axes ([*gather]; not when
 * have's axes begin want's), then sliced locally over want's axes from
 * position [*from] on (none when [*from] is want's count). */
void part_dim_steps(const Sharding *have, const Sharding *want, int d, bool *gather, int *from);

/* Whether dimension [d1]'s mesh axes move to another dimension from
 * [have] to [want]: the dimension [d2] whose split becomes its own
 * followed by d1's (d1 ending unsplit), which one tiled all_to_all
 * reshards (split along d2, concatenated along d1); -1 when none. */
int part_moves(const Sharding *have, const Sharding *want, int d1);

/* Output [i]'s NamedSharding: a new reference, or NULL. */
Value *part_out_sharding(const PartPlan *pp, int i);

/* ---- layouts of traced values (jax.typeof under jit) ---- */

/* The top-level trace of a jit call on [leaves] (borrowed, p->nin of
 * them, for as long as the scope is entered), so that a traced value's
 * layout can be asked while the function runs.  Scopes nest per thread;
 * leave each one entered. */
typedef struct PartTraced {
  Trace *t;
  Value *const *leaves;
  int n;
  struct PartTraced *prev;
  /* over a mesh with Explicit axes, the propagation so far (partition.c):
   * owned, the first [done] equations and [nvars] variables laid out */
  PartPlan *pp;
  StrBuf *notes;
  int done, nvars, capeqn, capvars;
  bool off;          /* no Explicit axis: nothing to check while tracing */
} PartTraced;
void part_trace_enter(PartTraced *scope, Trace *t, Value *const *leaves, int n);
void part_trace_leave(PartTraced *scope);

/* Explicit mode's errors while tracing, as JAX's sharding rules raise
 * them when a primitive is bound: lays out the equations [t] (the
 * innermost entered scope's trace; any other trace: nothing) recorded
 * since the last call, over the mesh of the call's sharded arguments
 * when it has Explicit axes.  0, or -1 with the rule's error (located at
 * the equation); the equation that raised it is then dropped from the
 * plan, as JAX binds no primitive whose rule raised. */
int part_traced_check(Trace *t);

/* Explicit mode's check of sub-plan [p] (a cond branch or a loop body,
 * traced on its own) on [in] (p->nin values, its captures first:
 * concrete arrays, values of the innermost entered trace, or an input's
 * NamedSharding itself, None for an unsharded one; borrowed),
 * as JAX's sharding rules check every branch and loop body while
 * tracing it, whether or not it then runs: -1 with the ShardingTypeError
 * (located at the equation) its propagation raises.  0 otherwise, with
 * nothing done (no cost) unless some input is laid out over a mesh with
 * an Explicit axis and every input's layout is known; other errors of
 * the propagation are left to the partitioning that follows, cleared. */
int part_check_sub(Plan *p, Value *const *in);

/* Whether the innermost entered trace is the current one and lays out
 * its values over a mesh with Explicit axes: a jit called there is
 * traced inline (its equations join the caller's), so that its results'
 * types and its sharding rules' errors are those of its body, as JAX's
 * pjit propagates the inner jaxpr's shardings. */
bool part_traced_explicit(void);

/* The NamedSharding (a new reference) propagation gives [x], a value
 * traced by the innermost entered trace, from the plan recorded so far
 * and the call's arguments' shardings; NULL, with no error set, for any
 * other value or when no argument is sharded.  Semantics: JAX's sharding
 * in types (Explicit mode). */
Value *part_traced_sharding(Value *x);

/* The replication error (a ValueError; returns -1) of shard_map equation
 * [e] over [m], checked from its traced [body]: result [k], laid out by
 * [spec], varies over mesh axis number [a].  Explained as the eager call
 * explains it (plan_vma_whys, shardmap_vma_error), at the body's return
 * when the trace recorded it. */
int part_vma_error(const Mesh *m, const PlanEqn *e, const Plan *body, const PSpec *spec, int k,
                   int a);

/* [ct] (borrowed), the cotangent of [primal] (borrowed; rank [ndim]),
 * laid out as primal's type when primal is laid out over a mesh with
 * Explicit axes and ct is laid out otherwise (eagerly a reshard, under
 * jit a sharding constraint), else ct itself: a new reference, or NULL
 * with the reshard's error.  Semantics: JAX's autodiff, where a
 * cotangent's aval is its primal's, sharding included (Explicit mode). */
Value *part_typed_like(Value *ct, Value *primal, int ndim);

/* ---- execution (partition_run.c) ---- */

/* The shard_map that runs [pp] (borrowed; the body keeps a reference):
 * in_specs and out_specs from its layouts, its body the plan interpreted
 * on each device's blocks.  Called with the leaves (the global arrays),
 * it returns a tuple of the results (global arrays); over an
 * AbstractMesh it lowers (jit(f).lower), and a call says it needs real
 * devices.  New reference, or NULL with the error set. */
Value *part_shard_fn(PartPlan *pp);

/* ---- eager primitives (partition_eager.c) ---- */

/* Sets prim_sharded_run_hook: an eager primitive on a split sharded
 * operand runs as the partitioned jit of that one primitive.  Once, at
 * start-up (jit_register). */
void partition_eager_register(void);

#endif
