/*
 * aot.h - ahead-of-time lowering: jax.ShapeDtypeStruct, jax.eval_shape,
 * jit(f).lower(*args) -> Lowered, .compile() -> Compiled, and their
 * analyses: cost_analysis, memory_analysis and the predicted step time
 * of a hardware profile (semantics: JAX's "Ahead-of-time lowering and
 * compilation" guide and jax/_src/stages.py; the cost model is the
 * scaling book's roofline and alpha-beta collectives; LANGUAGE.md §6).
 *
 * Lowering traces the function once, as jit does on a cache miss, with
 * ShapeDtypeStructs standing for arrays: nothing of the arguments' size is
 * allocated and no device thread runs.  A shard_map on an
 * jax.sharding.AbstractMesh (spmd/mesh.h) is traced once (one per-device
 * program), its collectives' group sizes taken from the mesh, so a
 * 65,536-device mesh lowers as fast as an 8-device one.  Compiling runs
 * the plan passes and the buffer planner (compile.h) on the plan; calling
 * a Compiled runs it on arrays of the lowered signature.
 *
 * Costs are per device, as XLA's cost_analysis reports them on one
 * device: the equations of a shard_map body count once (each device runs
 * them), equations outside it count as the one device running them; a
 * scan body counts `length` times, a while body once (its trip count is
 * data) unless the while is a fori_loop over literal bounds (then as many
 * times as it iterates, as JAX's scan of it), a cond the costliest
 * branch, a compiled xmap the positional plan it runs (its named axes
 * batched, its resources a shard_map).  Each primitive's flops and
 * transcendentals come from its row's cost rule (PrimRules.cost), each
 * collective's traffic from its row's CollRules.traffic.
 */
#ifndef SHMAP_AOT_H
#define SHMAP_AOT_H

#include <stdio.h>

#include "array/prim.h"
#include "lang/eval.h"
#include "spmd/mesh.h"
#include "transform/plan.h"

/* Whether [v] is a jax.ShapeDtypeStruct. */
bool aot_is_sds(const Value *v);

/* The aval a ShapeDtypeStruct [v] stands for (not weak, varying over no
 * mesh axis). */
void aot_sds_aval(const Value *v, AVal *out);

/* A ShapeDtypeStruct's sharding= (borrowed): None, a NamedSharding, ... */
Value *aot_sds_sharding(const Value *v);

/* jit(f).lower(*args): a Lowered (bound method of a JitFn [self]). */
Value *aot_lower_method(Value *self, const CallArgs *a);

/* jit(f).eval_shape(*args): the result's structure with a
 * ShapeDtypeStruct for each array, as jax.eval_shape. */
Value *aot_eval_shape_method(Value *self, const CallArgs *a);

/* Registers jax.ShapeDtypeStruct and jax.eval_shape.  0, or -1. */
int aot_register(Env *builtins);

/* ---- cost analysis (aot_cost.c) ---- */

#define AOT_MAX_AXES 8

/* One equation's cost per device, per call of the plan. */
typedef struct AotItem {
  int line;
  PrimId prim;
  DType dtype;               /* its first result's: which peak FLOP/s applies */
  double count;              /* how many times it runs per call */
  double flops, transcendentals, bytes;   /* totals over [count] runs */
  int fusion;                /* a compiled fused loop it is part of (its items
                                share the number: one kernel), or 0 */
  /* a collective (kind != NULL): */
  const char *kind;          /* the jax.lax name, as --comm-stats prints it */
  const char *algorithm;     /* CollTraffic's */
  int naxes;
  const char *axes[AOT_MAX_AXES];  /* interned mesh axis names */
  int64_t group;             /* devices in one group */
  double operand_bytes;      /* per run: the bytes --comm-stats counts */
  double sent, received;     /* per run, bytes per device */
  int steps;                 /* per run, message rounds */
  bool call;                 /* a shard_map call itself (no flops, no bytes): the
                                profile's call_overhead, [count] times */
  int64_t running;           /* devices running it at once: the mesh of the
                                shard_map around it; 0 outside any */
} AotItem;

typedef struct AotCost {
  AotItem *items;
  int n, cap;
  int64_t devices;           /* the largest mesh a shard_map ran on (1: none) */
  int nfusions;              /* fused loops numbered so far */
} AotCost;

/* Fills [c] (zeroed by the caller) with the costs of [p]'s equations,
 * sub-plans included.  [within]: the mesh of the shard_map body [p] runs
 * in (a jit called inside a body: its collectives' groups are that
 * mesh's, all its devices run it at once), or NULL.  0, or -1 with the
 * error set (nomem). */
int aot_cost(const Plan *p, const Mesh *within, AotCost *c);
void aot_cost_free(AotCost *c);

/* The dict Lowered/Compiled.cost_analysis() returns: 'flops', 'bytes
 * accessed', 'transcendentals' (JAX's keys, per device), 'collectives'
 * (a list of dicts: kind, axes, group_size, algorithm, bytes_sent,
 * bytes_received, operand_bytes, count, line) and 'lines' (line -> dict
 * of the same sums for that source line).  A new reference or NULL. */
Value *aot_cost_dict(const AotCost *c);

/* Per-device memory from the compiled plan's buffer planner (compile.h):
 * what Compiled.memory_analysis() reports, in bytes.  argument: the
 * blocks of one device; output: the results a run writes (not one that
 * passes an argument or a constant through: that buffer is the
 * argument's); temp: the planner's TEMP slots and scratch arrays, the
 * sub-plans' workspaces, and the contiguous copies of strided argument
 * blocks that fused loops and scans read in place; alias: 0 (nothing is
 * donated); constant: the plan's constants.  argument + output + temp is
 * what each device's bytes in use peak at during a run
 * (base/mem.h's per-device accounting, Device.memory_stats()). */
typedef struct AotMemory {
  double argument, output, temp, alias, constant;
} AotMemory;

/* Compiles [p] if it is not yet and fills [m] with its arguments,
 * outputs and planned temporaries per device (the body's when every step
 * is a shard_map call: the largest body workspace, since the calls run
 * one after another).  0, or -1 with the error set (compiling failed). */
int aot_memory(Plan *p, AotMemory *m);

/* ---- predicted time (aot_estimate.c) ---- */

/* Reads the hardware profile at [path] (YAML, man/shmap.7 "Planning at
 * scale") and predicts [p]'s step time in seconds (compiling [p] if it
 * is not yet), [within] the mesh of the shard_map body it runs in or NULL
 * (aot_cost's): a new Str holding the report (per line, total, the
 * bound, a warning when memory exceeds capacity), and into *[seconds] the
 * total.  NULL with the error set (the profile unreadable or invalid, a
 * mesh axis with no link, out of memory). */
Value *aot_estimate(Plan *p, const Mesh *within, const char *path, double *seconds);

/* `shmap --estimate PROFILE`: from now on every plan jit compiles and
 * every Compiled is noted, and aot_estimate_report prints each one's
 * prediction at exit.  [path] borrowed for the run. */
void aot_estimate_on(const char *path);

/* Notes plan [p] (a reference taken) named [name] for the report, when
 * --estimate is on; a no-op otherwise.  Noted on a device thread inside
 * a shard_map body, the plan is estimated within that body's mesh
 * (aot_cost's [within]).  Thread-safe. */
void aot_estimate_note(const char *name, Plan *p);

/* Prints the prediction of every plan noted, to [f]; 0 or -1 (the first
 * error is printed). */
int aot_estimate_report(FILE *f);

#endif
