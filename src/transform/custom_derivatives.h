/*
 * custom_derivatives.h - jax.custom_jvp and jax.custom_vjp: functions
 * whose derivative is a rule the program gives (semantics: JAX's
 * jax/_src/custom_derivatives.py and its guide "Custom derivative rules
 * for JAX-transformable Python functions").
 *
 *   f = custom_vjp(fun, nondiff_argnums=())   f.defvjp(fwd, bwd)
 *   f = custom_jvp(fun, nondiff_argnums=())   f.defjvp(jvp) / f.defjvps(*jvps)
 *
 * Called on ordinary values, f is fun.  Its rows in the primitive table
 * (custom_jvp_call, custom_vjp_call, custom_lin; higher.h) hold what the
 * transformations do with a call on their tracers, picked by the
 * innermost trace among the arguments' leaves:
 *   - grad, vjp, jvp (HigherRules.jvp_call): custom_jvp calls jvp(primals,
 *     tangents), whose tangent operations are differentiated as any
 *     others (so reverse mode transposes them); custom_vjp runs
 *     fwd(*args) -> (out, residuals) and records one custom_lin equation
 *     from the arguments' tangents to the outputs', whose transpose is
 *     bwd(residuals, cotangent) (nondiff arguments first).  Forward mode
 *     of a custom_vjp is JAX's TypeError.
 *   - vmap (batch_call): the same custom function of vmap(fun), vmap(fwd),
 *     vmap(bwd), vmap(jvp) on the batched values, all batched on axis 0.
 *   - jit: one equation custom_jvp_call / custom_vjp_call whose call_jaxpr
 *     is fun's plan, run by the compiled executor as a nested call.
 * A wrong bwd result is JAX's error, raised by the backward pass.
 */
#ifndef SHMAP_CUSTOM_DERIVATIVES_H
#define SHMAP_CUSTOM_DERIVATIVES_H

#include "lang/eval.h"

/* Registers jax.custom_jvp and jax.custom_vjp (also at the top level)
 * and the rows of custom_jvp_call, custom_vjp_call and custom_lin.  Call
 * once at start-up, after ad_register and batch_register.  0, or -1
 * with the error set. */
int custom_register(Env *builtins);

/* Registers the rows of custom_jvp_call, custom_vjp_call and custom_lin
 * in the primitive table (higher.h).  Not thread-safe: at start-up. */
void custom_register_rules(void);

#endif
