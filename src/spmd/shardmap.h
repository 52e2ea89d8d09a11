/*
 * shardmap.h - shard_map: per-device code over a mesh, run eagerly on the
 * device threads (LANGUAGE.md §4; semantics: seed 000, shard_map).
 *
 * A ShardFn wraps a body function with its mesh, in_specs, out_specs and
 * check_rep flag.  Calling it:
 *   1. checks each argument against its in_spec (rank, known axes, no axis
 *      named twice, even division) — errors located at the call;
 *   2. hands device d, for each argument, the block of d's mesh
 *      coordinates: a view of the argument (never a copy; a replicated
 *      argument is one buffer read by every device), tagged with the mesh
 *      axes it varies over;
 *   3. runs the body on every device thread at once (collective.h's
 *      coll_run), each device's print output kept apart;
 *   4. writes the output in device order, each line prefixed by the
 *      device's mesh coordinates, then assembles each result from the
 *      blocks per its out_spec: named axes concatenated in the order
 *      named, unnamed mesh axes untiled.  With check_rep, a result that
 *      varies over a mesh axis its out_spec leaves out is an error, and
 *      so are untiled blocks that differ (naming two devices and the first
 *      differing index).
 * A call on a device thread, inside another shard_map's body (or inside
 * one being traced), is a nested call (shmap(7)): it makes manual some
 * axes the enclosing body left automatic and runs on that same thread,
 * on its block along them; values being differentiated or batched go to
 * shard_map's rules, and under jit it is one equation in the enclosing
 * body's plan, both coming back here as nested calls.
 * A shard_map manual over some axes only (axis_names=) is instead called
 * as jit calls it, its body partitioned along the automatic axes
 * (shardmap_set_auto_runner); one whose body cannot be traced takes the
 * steps above, replicated along those axes.
 */
#ifndef SHMAP_SHARDMAP_H
#define SHMAP_SHARDMAP_H

#include "lang/eval.h"
#include "spmd/collective.h"
#include "spmd/mesh.h"

/* The most arguments (and results) a shard_map call, and the equations
 * differentiating one, take: a pytree's leaves each count, and so does
 * every residual a staged gradient passes from the forward pass to the
 * backward one. */
#define SHARDMAP_MAX_ARGS 1024

typedef struct ShardFn {
  Value hdr;           /* V_SHARDFN */
  const char *name;    /* interned, for messages and plans */
  Value *body;         /* owned: the per-device callable */
  Mesh *mesh;          /* owned */
  Value *in_specs;     /* owned: a Tuple of PSpec, or one PSpec for all */
  Value *out_specs;    /* owned: a PSpec, or a Tuple of PSpec */
  bool check_rep;
  uint32_t auto_axes;  /* mesh axes left automatic (axis_names= names the others); 0: all manual */
  bool internal;       /* made by a call or a transformation rule whose body keeps
                          per-device state: runs replicated along auto_axes, never
                          through shardmap_set_auto_runner's partitioned jit */
  bool traceable;      /* internal, made for a call of a user's shard_map (its pytree
                          leaves, its closed-over values): its body traces as the
                          user's does, so a transformation rule's eager call of it
                          may run through shardmap_run_auto */
  bool jit_run;        /* internal, made by a differentiation rule for an eager call
                          staged as under jit (grad of grad: its residuals pass as
                          results, one trace for every device): its calls, and the
                          calls transforming it, run through shardmap_run_auto's jit
                          even when no mesh axis is automatic */
  Value *in_tree;      /* owned: nested specs (pytree prefixes, None: static), or NULL */
  Value *out_tree;     /* owned: likewise for the results, or NULL */
  Value *arg_labels;   /* owned: a Tuple of Str naming each argument in messages, or NULL */
  VmaWhy *out_why;     /* owned, or NULL: a compiled body's reason each result varies
                          (its plan's, plan_vma_whys), for the replication error */
  Loc ret;             /* a compiled body's return (owns its source), or {0} */
  bool local_results;  /* under mpirun, a result whose blocks are not all on each process
                          holds only each process's (array.h, "Process-local shards"): a partitioned
                          jit's, whose out_specs are the results' layouts */
} ShardFn;

/* The replication error (a ValueError; returns -1): result [k] of a
 * shard_map over [m] varies over mesh axis number [a], which its out_spec
 * [s] does not name.  [why] explains it (array.h, VmaWhy): a primitive
 * at a line, or argument why.arg - 1, named [label] ("argument 0 ('c')")
 * with in_spec [arg_spec] (NULL, NULL when why names none); set at [at]
 * (the body's return) when at.src is set.  The message of every check,
 * eager, staged and partitioned.  Semantics: JAX's _check_reps. */
int shardmap_vma_error(const Mesh *m, const PSpec *s, int k, int a, VmaWhy why,
                       const char *label, const PSpec *arg_spec, Loc at);

/* Makes a ShardFn (all arguments borrowed).  Errors: a spec that is not a
 * P(...) (or tuple of them), a mesh that is not a Mesh. */
Value *shardmap_new(const char *name, Value *body, Value *mesh, Value *in_specs,
                    Value *out_specs, bool check_rep);

/* Makes shard_map [f] (a ShardFn, borrowed) manual only over the mesh
 * axes [axis_names] names (jax.shard_map's axis_names=; NULL, None or
 * empty: every axis) less those [auto] names (the older
 * jax.experimental.shard_map's auto=; NULL or None: none): each a str or
 * a tuple/list of str.  The other axes are automatic: the body sees the
 * arguments whole along them (a call runs it partitioned along them, as
 * jit's partitioner lays it out from the arguments' layouts there:
 * shardmap_set_auto_runner; shmap(7) "shard_map"), its collectives and
 * axis_index may not name them, and in_specs and out_specs may not refer
 * to them.  0, or -1 + ERR_TYPE (not axis names) / ERR_VALUE (a
 * name not of the mesh, an axis in both, a spec naming an automatic
 * axis). */
int shardmap_set_manual(Value *f, Value *axis_names, Value *auto_);

/* Calls [f] on [a]: the steps above.  New reference or NULL + error. */
Value *shardmap_call(Value *f, const CallArgs *a);

/* Runs [f] on the devices now, on arrays [a] (no pytrees, no tracers),
 * even while this thread traces: the last of shardmap_call's steps, for
 * the runtime's own calls (materialising a sharded array).  Main thread.
 * Same contract as shardmap_call. */
Value *shardmap_run(Value *f, const CallArgs *a);

/* Calls [f] on [a] as a call with pytree arguments runs: a shard_map over
 * the leaves whose wrapper body returns the leaves of the body's results,
 * the results' tree rebuilt after (its out_specs a prefix of it).  A
 * differentiation rule that takes each result as an array calls it on a
 * call whose body may return nested tuples.  Same contract as
 * shardmap_call. */
Value *shardmap_call_leaves(Value *f, const CallArgs *a);

/* Whether [f] is such a shard_map over leaves (its body's results are a
 * flat tuple of arrays). */
bool shardmap_returns_leaves(const ShardFn *f);

/* The out_specs of each leaf of a body's [result] (a pytree), as the
 * out_specs prefix gives them: a tuple of PSpec, or NULL with the error
 * set (a prefix that does not fit the result). */
Value *shardmap_out_leaf_specs(const ShardFn *f, Value *result);

/* Checks that argument [i] of [nargs], of rank [ndim] and [shape], fits
 * its in_spec: the spec's rank and axes, and even division by the mesh
 * axes it names.  0, or -1 + ERR_VALUE/ERR_TYPE in LANGUAGE.md §9's words
 * (the same message eagerly and under jit). */
int shardmap_check_shape(const ShardFn *f, int i, int nargs, int ndim, const int64_t *shape);

/* How messages name argument [i] of [f] (its label for a pytree leaf,
 * "argument 0 ('c')" for a parameter of a user function, else "argument
 * 0"): a new Str, or NULL on nomem.  A staged body keeps these
 * (Plan.in_labels), so a check_vma error names the argument as the
 * eager call does. */
Value *shardmap_arg_label(const ShardFn *f, int i);

/* The labels in messages of a call's arguments ([f]'s ShardFn.arg_labels,
 * or a traced body's Plan.in_labels): [lead] captured values, then f's
 * [n] arguments as shardmap_arg_label names them, then [trail] captured
 * values ("captured value i", counted from 0 in each group).  A new
 * Tuple of Str, or NULL with the out-of-memory error set. */
Value *shardmap_arg_labels(const ShardFn *f, int lead, int n, int trail);

/* Whether a call of [f] on [a] has pytree arguments or specs: it then runs
 * as a shard_map over the leaves (shardmap_call does it). */
bool shardmap_needs_tree(const ShardFn *f, const CallArgs *a);

/* Checks argument [i] of a call of [f]: 0, or -1 with the error set.  A
 * tuple, list or dict is a pytree whose leaves JAX would split one by
 * one; converting it would stack them into one array and split that, a
 * silent wrong answer, so it is an error that says to pass the leaves as
 * separate arguments.  Eager calls and jit's staging both check with it. */
int shardmap_check_arg(const ShardFn *f, const CallArgs *a, int i);

/* Argument [i] checked and converted to an array (a new reference), or
 * NULL with the error set. */
Value *shardmap_arg(const ShardFn *f, const CallArgs *a, int i);

/* How a shard_map call runs its body on the devices of [mesh]: fn(rank,
 * ctx) on each through coll_run, each device printing into outs[rank].
 * The debugger (cli/debug.c) installs its all-stop runner in its place
 * with shardmap_set_runner; NULL restores plain coll_run.  Main thread,
 * before or between calls. */
typedef int (*ShardmapRunner)(CollGroup *g, const MeshDesc *mesh,
                              void (*fn)(int rank, void *ctx), void *ctx,
                              OutBuf *outs);
void shardmap_set_runner(ShardmapRunner run);  /* hook */

/* How a shard_map call made while this thread traces (jit) is staged as
 * one shard_map equation: set by the transform layer (transform/jit.c)
 * at start-up.  Same contract as shardmap_call. */
typedef Value *(*ShardmapStager)(Value *f, const CallArgs *a);
void shardmap_set_stager(ShardmapStager stage);  /* hook */

/* Under mpirun a process none of whose devices is in a call's mesh runs
 * no body, so what a body records on its call objects (the pytree of a
 * tree call's result, the result count of a differentiated one) reaches
 * it from another process (xcall.h).  [find] appends to slots[0..cap) the
 * slots of such values for a body (a callable) it knows and returns how
 * many; a layer above registers it at start-up (at most 4).
 * shardmap_shared_slots collects every registered finder's slots, and a
 * tree call's, for [body] (a finder whose body wraps another callable
 * calls it on that one).
 *
 * What a body's first result decides beyond those values (the out_specs
 * of a call whose prefix covers subtrees, one spec per leaf: (P(), P())
 * for ((a, b), c)) is derived from them again on such a process: after
 * the slots are filled, [settle] (may be NULL) does for [body] what its
 * devices would have done with the first result, inner bodies first
 * (shardmap_settle on the callable it wraps); 0, or -1 with the error.
 * shardmap_settle runs a tree call's and every registered one on [body].
 * Main thread, after a call's devices are done. */
typedef int (*ShardmapSharedFn)(Value *body, Value ***slots, int cap);
typedef int (*ShardmapSettleFn)(Value *body);
void shardmap_add_shared(ShardmapSharedFn find, ShardmapSettleFn settle);  /* hook */
int shardmap_shared_slots(Value *body, Value ***slots, int cap);
int shardmap_settle(Value *body);

/* A body that closes over values a transformation of the calling thread
 * traces (being differentiated or batched, not staged by jit): the call
 * passes them as inputs after its arguments, replicated (P()), as JAX
 * passes a body's constants, so the transformation's rules see them as
 * arguments and the cotangent of one is summed over the devices
 * (shardmap_lift.c).  shardmap_lift_call finds them in the scopes the
 * body closes over (functions' closures and default values,
 * functools.partial, tuples, lists and dicts in them; not the arguments'
 * own tracers) and makes that call: its result (a new reference), NULL
 * with the error set, or LIFT_NONE when the body closes over none (or
 * over more than it lifts) and the call runs as it is.  shardmap_call
 * calls it first. */
#define LIFT_NONE ((Value *)&shardmap_lift_none)
extern const Value shardmap_lift_none;
Value *shardmap_lift_call(ShardFn *f, const CallArgs *a);
/* Materialises the process-local shards (array.h) [f]'s body reaches
 * through the scopes it closes over, module scopes included (its devices
 * would read them whole): 0, or -1 with the error set.  Costs one load
 * while no such array lives.  Main thread, before the body runs. */
int shardmap_whole_closures(const ShardFn *f);

/* While such a body runs on this thread: the block of this device that
 * stands for closed-over value [v] (borrowed), or NULL when [v] is not
 * one.  The trace's dispatch (transform/trace.c) puts them in place of
 * the values an operation meets. */
Value *shardmap_lifted(const Value *v);

/* How an eager call of a partial-manual shard_map (axis_names=) runs:
 * with its body partitioned along the automatic axes, as jit runs it
 * (shmap(7), "shard_map"); set by the transform layer (transform/jit.c)
 * at start-up.  Same contract as shardmap_call, except that NULL with no
 * error set (a body that cannot be traced: Python control flow on
 * values, a shard_map nested in it) makes the call run its body on the
 * device threads, replicated along the automatic axes. */
void shardmap_set_auto_runner(ShardmapStager run);  /* hook */

/* Runs a call of partial-manual shard_map [fv] (borrowed, internal or
 * not) through shardmap_set_auto_runner's partitioned jit, for the
 * transformation rules (transform/shardmap_rules.c) whose body's state
 * lives in its trace: the result (new), or NULL with an error, or NULL
 * with no error when that jit cannot run it (no automatic axes and not
 * jit_run, inside a device's body or a trace, an argument being
 * transformed, a body that cannot be traced, jax.disable_jit); the caller
 * then runs it otherwise. */
Value *shardmap_run_auto(Value *fv, const CallArgs *a);

/* How a shard_map call whose arguments are being differentiated (JVP
 * tracers, outside any staging) runs: set by the transform layer
 * (transform/ad.c) at start-up; it calls shard_map functions of its own
 * making over the same mesh.  Same contract as shardmap_call. */
void shardmap_set_differentiator(ShardmapStager d);  /* hook */

/* Named axes that are not mesh axes: vmap's (transform/batch.c sets
 * them).  [size]: whether [name] is such an axis in scope on this thread,
 * and its size; [index]: axis_index over it (a new reference), or NULL
 * when it is not one.  The collectives' built-ins ask them before the
 * mesh: axis_size, axis_index, psum of a value that is the same on every
 * example. */
typedef struct NamedAxisHooks {
  bool (*size)(const char *name, int64_t *size);
  Value *(*index)(const char *name);
  bool (*carries)(Value *x, const char *name);   /* x varies along it */
} NamedAxisHooks;
void shardmap_set_named_axes(const NamedAxisHooks *hooks);  /* hook */

/* The in_spec of argument [i] of [f] (borrowed). */
PSpec *shardmap_in_spec(const ShardFn *f, int i);

/* The out_spec of result [k] of [f] (borrowed); [f]'s out_specs is one
 * P(...) for every result or a tuple with one per result. */
PSpec *shardmap_out_spec(const ShardFn *f, int k);

/* The layout jax.typeof shows for a traced value [x] under jit (its
 * Explicit axes): a NamedSharding (new reference), or NULL with no error
 * set when unknown.  Set by transform/jit.c to the partitioner's
 * propagation over the plan traced so far (partition.h). */
extern Value *(*shardmap_typeof_sharding_hook)(Value *x);  /* hook */

/* Registers shard_map (function form, also jax.shard_map), the block-form
 * statement executor, and the collective built-ins of LANGUAGE.md §5:
 * axis_index axis_size psum pmean pmax pmin all_gather psum_scatter
 * ppermute pshuffle all_to_all ragged_all_to_all. */
int shardmap_register(Env *builtins);

/* Whether [fn] is one of the collective built-ins registered above that
 * needs every device of the body to take part (psum ... pswapaxes; not
 * axis_index, axis_size, pvary or pcast, which a device answers alone).
 * The debugger runs a line typed at its prompt that calls one on every
 * device.  [fn] is borrowed; any value may be passed. */
bool shardmap_is_collective(const Value *fn);

#endif
