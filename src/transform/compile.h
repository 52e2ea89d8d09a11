/*
 * compile.h - turning a plan into something that runs, and running it.
 *
 * A plan is compiled once (cmp_compile) into an Exec: a list of steps over
 * numbered slots, then run any number of times, from any thread.  The
 * passes, in order (LANGUAGE.md §6):
 *
 *   0. transposes read through: an operand made by a transpose is read
 *      from the transpose's input when the reader's row has a
 *      through_transpose rule (dot_general: its kernel takes strides, as
 *      eagerly, where a transpose is a view); the transpose then dies
 *      unless something else reads it;
 *   1. constant folding: an equation whose operands are all literals or
 *      constvars is evaluated now, through prim_apply, and its result
 *      becomes a constant;
 *   2. common subexpressions: an equation equal to an earlier one
 *      (primitive, parameters, operands) reuses its outputs;
 *   3. dead code: equations whose outputs nothing needs are dropped
 *      (collectives, debug callbacks and sub-plans holding them stay, so
 *      every device still meets every collective);
 *   4. fusion: a run of float32 (and bool) elementwise equations of one
 *      shape larger than one block, with 0-d operands broadcast, becomes
 *      one loop over blocks of
 *      CMP_BLOCK elements with register-like temporaries, so intermediate
 *      arrays never reach memory; a full reduce_sum consuming the run
 *      joins it, summed blockwise then pairwise;
 *   5. buffer planning: every intermediate gets a slot; slots of equal
 *      aval are shared once their last reader ran (never with an
 *      equation's own operands), and the arrays behind them are made once
 *      per workspace, so a steady-state call allocates only its outputs.
 *
 * Unfused equations call prim_table[id].kernel directly on the slots'
 * arrays, so results equal eager evaluation bit for bit; fused loops call
 * the same vectorised f32 routines (kern_sin_f32, ...) or the kernels on
 * block-sized views, and differ from eager only in the order of a fused
 * sum (allclose).  cond, while, scan, pjit and shard_map run their
 * compiled sub-plans; shard_map runs one compiled plan on every device
 * thread through shardmap.c's call machinery.  A higher-order equation
 * is prepared and run by its row's rules (higher.h), which the family
 * files write over the executor's internals (compile_impl.h).
 *
 * Threads: an Exec is immutable once made; each run takes a workspace:
 * first the one its thread's slot keeps (an atomic exchange, no lock),
 * else one from the Exec's pool (guarded by Exec.lock, held only to pop
 * or push one).  A while or scan step takes the workspaces of its
 * sub-plans once for all its iterations and gives them back after the
 * last, so an iteration takes nothing.
 */
#ifndef SHMAP_COMPILE_H
#define SHMAP_COMPILE_H

#include "array/array.h"
#include "transform/plan.h"

/* Elements per block of a fused loop: 8 KiB per register, so a dozen
 * registers stay in L2.  A closing sum leaves one partial per block, so
 * the block fixes a fused sum's order of additions (fused_loop.c runs a block
 * in shorter lines and keeps that order). */
#define CMP_BLOCK 2048

/* Compiles [p] if it is not yet (sets p->exec; sub-plans compiled too).
 * Must be called before [p] is shared between threads.  0, or -1 with the
 * error set (out of memory, an unsupported equation). */
int cmp_compile(Plan *p);

/* Which equations of [p] (borrowed) the compiled form keeps as live
 * code: those whose results the plan's outputs need, directly or not,
 * and those with effects (callbacks, collectives), as the dead-code pass
 * (step 3 above) decides on the plan as written, before folding and CSE.
 * A new array of p->neqn flags (owned by the caller), or NULL on nomem. */
bool *cmp_live_eqns(const Plan *p);

/* Runs compiled [p] on [in] (p->nin arrays, borrowed, avals matching the
 * invars) and stores p->nout new references in [out].  0, or -1 with the
 * error set (kernel failures such as collective mismatches). */
int cmp_run(Plan *p, Array **in, Array **out);

/* Like cmp_run, but writes the results into the caller's arrays [out]
 * (contiguous, of the plan's out avals), so loops reuse their buffers. */
int cmp_run_into(Plan *p, Array **in, Array **out);

/* Number of steps of compiled [p] after the passes (a fused loop is one
 * step), or -1 when [p] is not compiled; for tests of the passes. */
int cmp_nsteps(const Plan *p);

/* 1 when every step of compiled [p] has its row loop, so a while_loop or
 * scan with [p] as its body runs it from a tape (compile.c), 0 when not,
 * -1 when [p] is not compiled; for tests. */
int cmp_tapeable(const Plan *p);

/* Registers plan_exec_free and makes plans callable (a V_PLAN called with
 * arrays runs it; shard_map uses that to run a compiled body per device). */
void cmp_register(void);

#endif
