/*
 * xmap.h - xmap: named axes (LANGUAGE.md §10; semantics: seed
 * 001_71b408bfe3872e8c.txt, JAX's xmap tutorial).
 *
 * xmap(f, in_axes, out_axes)(*args) names axes of its arguments: each
 * array leaf's axis mapping ({position: name}, or [name, ..., ...] for
 * the leading positions) removes those positional axes and makes them
 * named axes of the value f sees.  Every named axis is a batch trace of
 * transform/batch.h carrying its name, opened in order of first
 * appearance, so every operation acts per named index (the batching
 * rules), operands broadcast by name (a value lacking a name is the same
 * along it), and the collectives, the reductions (sum(z, axis=(0, 'x')),
 * max min mean prod logsumexp softmax argmax argmin: batch.c's
 * ops_named_reduce_hook), one_hot(..., axis='classes') and lax.pdot take
 * names.  On
 * the way out, out_axes puts each named axis of a result at its position
 * (broadcasting a result that does not vary along a placed name); a named
 * axis the result carries and out_axes does not place is an error naming
 * it.  One name has one size within a call: an argument that disagrees is
 * the seed's error.
 *
 * With axis_resources (mesh axes of the context mesh, `with m:`), the
 * call is a shard_map over that mesh whose body is this xmap on each
 * device's blocks, each named axis marked as split over its mesh axes.
 *
 * Under jit, a call stages as one `xmap` equation (name, in_axes and
 * out_axes as one {position: name} mapping per operand and result,
 * axis_resources, the mesh when there are resources, and call_jaxpr, the
 * body traced once per named index with named shapes: f32[5]{batch=20});
 * pdot in it is one `pdot` equation; cond, while and scan in it stage
 * with named sub-plans.  A body holding shard_map or a callback, or a
 * loop whose carry gains a name, is staged through the batching path
 * instead (the body then traced twice).
 */
#ifndef SHMAP_XMAP_H
#define SHMAP_XMAP_H

#include "lang/eval.h"
#include "transform/plan.h"

/* The positional plan that runs xmap equation [e] of operand avals [in]
 * and result avals [out] (the compiled executor's xmap step): the staged
 * body evaluated equation by equation through the primitive table inside
 * the eager call's batching and resource machinery, which records it.  A
 * new reference, or NULL with the error set (the eager call's errors, or
 * a lowered result that is not the staged aval). */
Plan *xmap_lower(const PlanEqn *e, const AVal *in, const AVal *out);

/* ---- xmap's plan interpreter, for the higher-order rules (higher.h) ---- */

/* Runs plan [p] on [args] (p->nin values, borrowed) equation by equation
 * through the primitive table (a higher-order equation by its row's eval
 * rule): JAX's eval_jaxpr, here under the batch traces of an xmap.  A
 * tuple of p->nout new references, or NULL with the error set. */
Value *xmap_eval_plan(Plan *p, Value **args);

/* A sub-plan [plan] as the function a control-flow built-in calls, named
 * [name], closing over its first [nconsts] inputs [consts] (borrowed);
 * [k] is scan's number of carries.  [fn] is one of the three below.  A
 * new reference, or NULL with the error set. */
Value *xmap_sub_fn(const char *name, MethodFn fn, Value *plan, int nconsts, Value **consts,
                   int64_t k);
/* cond's branch and while's body_fun: the sub-plan on the array leaves
 * of the arguments, its results as a tuple. */
Value *xmap_branch_call(Value *self, const CallArgs *a);
/* while's cond_fun on the carry: the predicate, its one result. */
Value *xmap_pred_call(Value *self, const CallArgs *a);
/* scan's f(carry, x): (carry, y), each a tuple. */
Value *xmap_scan_call(Value *self, const CallArgs *a);

/* Whether the sub-plans in [v] (a plan or a tuple of them; NULL: false)
 * hold only equations xmap's lowering can evaluate. */
bool xmap_subs_lowerable(Value *v);

/* Whether loop body [body]'s carries (its inputs from [first], its
 * outputs from 0, [n] of them) keep their named shapes, and none lacks a
 * name of [pred] (a while's predicate, or NULL): then what the staged
 * body says a value carries, the lowered loop's value carries. */
bool xmap_carries_settle(const Plan *body, int first, int n, const NamedShape *pred);

/* Registers the rows of xmap and pdot in the primitive table (higher.h):
 * the xmap equation's compiled step (xmap_lower), and both primitives'
 * evaluation in an xmap body.  Called by xmap_register; not thread-safe. */
void xmap_register_rules(void);

/* Registers xmap (also jax.xmap) and lax.pdot, and their rows
 * (xmap_register_rules).  0 or -1. */
int xmap_register(Env *builtins);

#endif
