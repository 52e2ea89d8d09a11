/*
 * jit.h - jit wrappers: the signature cache, static arguments, `plan(f,
 * *args)` and `--dump-plans` (LANGUAGE.md §6; semantics: jax.jit and
 * seed 004's make_jaxpr).
 *
 * A JitFn wraps a callable (a Func, a ShardFn, or anything val_call takes).
 * Calling it:
 *   1. splits the arguments into traced ones and static ones.  Arrays and
 *      numbers are traced (numbers as weakly typed 0-d arrays); tuples and
 *      lists are pytrees whose array leaves are traced, except a tuple of
 *      Python ints, which is static (a shape); strings, None, functions,
 *      meshes, dtypes are static; so is a parameter annotated `static`
 *      (`jit def f(x, n: static)`) or named by static_argnums /
 *      static_argnames;
 *   2. builds the signature: the avals (dtype, weak flag, shape) of the
 *      traced leaves and the values of the static ones (strings and
 *      numbers by value, other objects by identity);
 *   3. on a miss, traces the function with tracers for the traced leaves
 *      (trace.h), compiles the plan (compile.h), prints it when
 *      --dump-plans is on, and caches it under the signature;
 *   4. runs the compiled plan on the leaves and rebuilds the result's
 *      structure (tuples and lists of arrays).
 * Called while another trace is active (a jit function called from a jit
 * function, a cond branch, ...), it records a `pjit[jaxpr=... name=f]`
 * equation instead.
 *
 * A jit shard_map traces the body once per signature of its blocks (the
 * avals each device sees, tagged with the mesh axes they vary over), with
 * the mesh's context installed so collectives are recorded as plan
 * operations; the top-level plan is one `shard_map[mesh= in_specs=
 * out_specs= jaxpr= check_rep=]` equation, run by compiling the body once
 * and calling it on every device thread through shardmap.c.
 *
 * Threads: the cache of a JitFn is guarded by its mutex (JitFn.lock),
 * held only to look up or insert an entry, never while tracing or
 * running; two threads missing at once both trace and the second insert
 * is dropped.
 */
#ifndef SHMAP_JIT_H
#define SHMAP_JIT_H

#include "lang/eval.h"
#include "transform/plan.h"

/* Wraps [fn] (borrowed) into a new JitFn.  [static_nums] (n_nums ints)
 * and [static_names] (n_names interned names) mark static parameters, in
 * addition to `static` annotations of a Func's parameters.  NULL + error
 * when [fn] is not callable. */
Value *jit_new(Value *fn, int n_nums, const int64_t *static_nums, int n_names,
               const char **static_names);

/* Calls a JitFn (eval_register_call hook): the steps above. */
Value *jit_call(Value *f, const CallArgs *a);

/* Traces [fn] (a JitFn or any callable) on [a] and returns the plan (new
 * reference), without running it: with [per_device], the per-device
 * plan of a call that partitions (partition.h), as `plan(f, *args)`
 * shows it; else the global one, as jax.make_jaxpr prints it. */
Value *jit_plan_of(Value *fn, const CallArgs *a, bool per_device);

/* A shard_map function [sf] called while tracing (from inside a jit
 * function): records its shard_map equation in the current trace and
 * returns the traced result.  shardmap_call hands such calls here.
 * Called inside a shard_map body being traced (a device context with a
 * mesh: a nested call), its body is traced with the enclosing body's
 * manual axes manual too, its blocks and results keep varying over them,
 * and the equation goes into the enclosing body's plan. */
Value *jit_trace_shard_map(Value *sf, const CallArgs *a);

/* What lowering a call keeps to run it later (aot.h's Lowered and
 * Compiled): the jit function, the call's signature bytes, the result's
 * structure (its leaves the tracers of the trace) and the objects the
 * signature holds by identity.  All owned. */
typedef struct JitLowered {
  Value *jit;
  char *key;
  size_t keylen;
  Value *out_tree;
  Value *holds;
  Value *statics;   /* a tuple of (position or keyword, value): the static
                       arguments, constants of the plan, which a call of the
                       Compiled leaves out (JAX's) */
  Value *part, *part_fn;   /* a partitioned plan's layouts (PartPlan) and the jit
                              running it per device, made by the first call and
                              kept, so later calls reuse its workspace; or NULL */
} JitLowered;

/* jit(f).lower(*args): traces [fn] (a JitFn or any callable) at top level
 * on [a], whose array leaves may be arrays or ShapeDtypeStructs (aot.h),
 * without running it.  The plan (a new reference), [out] filled; NULL with
 * the error set (as tracing's; TypeError while another trace is open). */
Plan *jit_lower(Value *fn, const CallArgs *a, JitLowered *out);

/* Runs [p] (compiled, from jit_lower into [l]) on the arrays of [a], the
 * lowered call's arguments less its static ones: the result in the traced
 * structure.  A call whose signature is not the
 * lowered one is JAX's TypeError: "Argument types differ from the types
 * for which this computation was compiled. The mismatches are: Argument
 * 'x' compiled with float32[8] and called with float32[4]".  A
 * partitioned plan's per-device function is kept in [l] from the first
 * call on. */
Value *jit_run_lowered(JitLowered *l, Plan *p, const CallArgs *a);

/* Releases what [l] owns; [l] is zeroed. */
void jit_lowered_clear(JitLowered *l);

/* Registers jit (also jax.jit), plan, jax.make_jaxpr, the V_JITFN type,
 * eval_make_jit, and the staging subsystems under it (trace.h, plan.h,
 * compile.h; control.h registers itself, ctl_register), and the rows of
 * pjit, debug_callback (jit_register_rules) and shard_map
 * (jit_register_shard_map_rules).  Also binds
 * perf_counter() when nothing else has.  0, or -1 with the error set. */
int jit_register(Env *builtins);

/* Registers the rows of pjit and debug_callback in the primitive table
 * (jit_rules.c, higher.h): their compiled steps, their evaluation in an
 * xmap body.  Not thread-safe: at start-up. */
void jit_register_rules(void);

/* Registers shard_map's row in the primitive table (shardmap_rules.c,
 * higher.h): its compiled step, its grad (jvp_call, transpose) and vmap
 * (batch_call) rules, and what the devices of a differentiated or batched
 * call record (shardmap_add_shared).  Not thread-safe: at start-up. */
void jit_register_shard_map_rules(void);

/* Traced signatures a jit function keeps, the least recently used
 * dropped past it (each holds a compiled plan, tens of KiB): the
 * configuration's jit.cache_size.  Call before device threads run. */
#define JIT_CACHE_DEFAULT 64
void jit_set_cache_size(int n);

#endif
