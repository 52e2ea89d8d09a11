/*
 * prim_ad.h - the differentiation rules of the array layer's primitives:
 * a JVP rule for every primitive with a derivative, and a transpose rule
 * for the ones linear in some operands (PrimRules.jvp / .transpose, the
 * contracts in prim.h).
 *
 * Rules are written with prim_apply, as JAX's are written with bind: on
 * concrete operands they compute, on tracers they stage, so one rule
 * serves eager jvp/grad, the linear plan that reverse mode transposes, and
 * grad under jit.  Semantics: JAX's ad.primitive_jvps and
 * ad.primitive_transposes (jax/_src/lax/lax.py, slicing.py), rewritten
 * here; where a primitive has no rule yet its slot is NULL and the
 * transformation says so (prim_rule_missing), never a wrong derivative.
 */
#ifndef SHMAP_PRIM_AD_H
#define SHMAP_PRIM_AD_H

#include "array/prim.h"

/* Installs the rules into prim_table.  Called once by the table's owner
 * before any thread runs. */
void prim_ad_install(void);

/* Zeros of aval [a] (a concrete Array, new reference), the cotangent of an
 * operand no path reaches.  NULL on nomem. */
Value *prim_zeros(const AVal *a);

/* a + b for two cotangents of one aval (new reference); NULL operands are
 * zeros: returns the other (new reference), or NULL when both are. */
Value *prim_add_any(Value *a, Value *b);

/* take_along_axis: [x]'s elements at the int positions [idx] along axis
 * [axis] (idx of x's shape but along that axis; every other axis of
 * idx's length 1 or x's), as one gather of the rows flattened, so it
 * differentiates and stages (semantics: NumPy's take_along_axis, JAX's
 * default clamping of out-of-range positions).  A new reference, or NULL
 * with the error set. */
Value *prim_take_along(Value *x, Value *idx, int axis);

#endif
