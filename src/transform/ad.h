/*
 * ad.h - automatic differentiation: jvp, vjp, grad, value_and_grad
 * (LANGUAGE.md §11; semantics: JAX's jax.jvp / jax.vjp / jax.grad, and the
 * design of docs/autodidax.py: JVP, partial evaluation, transposition).
 *
 * Forward mode is an interpreter over the primitive table: jvp(f, ...)
 * runs f on JVP tracers (trace.h, TR_JVP), each a primal carried with its
 * tangent.  prim_apply hands every operation with a tracer operand to
 * ad_apply, which picks the innermost trace among the operands (trace ids
 * grow with nesting, so grad of grad works): a JVP trace applies the
 * primitive's JVP rule (its row's, array/prim.h) to the unwrapped primals and
 * tangents, anything else is staged as before.  A result whose tangent is
 * a symbolic zero (a comparison, argmax, an integer) is the bare primal,
 * so Python control flow on it, and `if x > 0:` on a concrete primal,
 * work as in JAX.
 *
 * Reverse mode linearises and transposes.  vjp/grad run f with tangents
 * that are tracers of a LINEAR trace (trace_begin_linear): the JVP rules'
 * tangent operations are recorded into a linear plan, while the primal
 * computation runs as it would without grad (eagerly, or staged into an
 * enclosing jit: JAX's partial evaluation falls out of the dispatch).
 * The backward pass evaluates that plan's non-linear equations (on
 * residuals) forward, then walks its linear equations in reverse with the
 * primitives' transpose rules, accumulating cotangents.
 *
 * Eager: grad of an ordinary function evaluates it eagerly, line by line,
 * with its Python control flow.  Under jit, the forward and backward
 * passes are staged into the jit's one plan.  A jit function called on a
 * value being differentiated is evaluated inline (the same result as its
 * plan).  A while_loop under jit differentiates as one staged loop over
 * primals and tangents (the while row's rule, control_rules.c); reverse
 * mode through while_loop is JAX's error.  Under jit, cond and scan on
 * differentiated values are recorded operation by operation (the same
 * values as staged ones).
 */
#ifndef SHMAP_AD_H
#define SHMAP_AD_H

#include "lang/eval.h"
#include "array/prim.h"

/* Registers jvp, vjp, grad, value_and_grad (also under jax.) and installs
 * ad_apply as the tracer hook.
 * Call once at start-up, after jit_register.  0 or -1. */
int ad_register(Env *builtins);

/* Whether some array leaf of [tree] is being differentiated in reverse
 * mode on this thread (a JVP tracer whose trace linearises, also inside a
 * batch tracer or a forward JVP tracer): control flow that cannot be
 * transposed refuses it. */
bool ad_reverse_leaf(Value *tree);

/* Whether reverse-mode differentiation is under way on this thread (some
 * grad, vjp or value_and_grad is tracing). */
bool ad_reverse_active(void);

/* Whether some leaf of [tree] is a JVP tracer (being differentiated). */
bool ad_has_jvp_leaf(Value *tree);

/* The tree [own] (borrowed) with the tangent of each leaf that [sel]
 * (borrowed, the same structure) holds differentiated in reverse mode
 * replaced by [sel]'s: the primal is [own]'s.  A new reference, or NULL
 * with the error set.  An eager cond whose index varies over mesh axes
 * takes its primal results from the taken branch but, under reverse
 * mode, its tangents from a selection among every branch's, so that all
 * devices record the same linear map and the backward pass sums a
 * cotangent over those axes only after the branches' transposes (as the
 * cond under jit does). */
Value *ad_keep_primals(Value *sel, Value *own);

/* For the rules of other primitives built on forward mode (the while
 * row's, control_rules.c; shard_map's, shardmap_rules.c, which also takes
 * ad_impl.h).  A JVP tracer of trace [id] for [primal] and
 * [tangent] (both stolen): a new reference, or NULL with the error set. */
Value *ad_jvp_tracer(unsigned id, Value *primal, Value *tangent);
/* The primal of [v] for trace [id]: a JVP tracer of another trace, and
 * anything else, is its own.  A new reference. */
Value *ad_primal_of(Value *v, unsigned id);
/* The tangent of [v] for trace [id]: its own, or zeros of its aval,
 * weakly typed when [v] is (JAX's instantiated symbolic zero).  A new
 * reference, or NULL with the error set. */
Value *ad_tangent_of(Value *v, unsigned id);

#endif
