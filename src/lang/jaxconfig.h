/*
 * jaxconfig.h - jax.config: the two settings JAX users reach for when
 * debugging, and jax.disable_jit() (semantics: JAX's jax_debug_nans and
 * jax_disable_jit options, jax._src.config).
 *
 * `jax.config.update('jax_debug_nans', True)` makes every operation whose
 * result holds a NaN fail with FloatingPointError "invalid value (nan)
 * encountered in div" at that operation: the evaluator checks each
 * operator's and each built-in's result (jaxcfg_check_nans), and a jit
 * function's results are checked after its plan ran, the function then
 * run again op by op without jit to find the operation (transform/jit.c),
 * as JAX does.  `jax.config.update('jax_disable_jit', True)`, or the
 * block of `with jax.disable_jit():`, makes a jit function run its Python
 * function eagerly.  `jax.config.jax_debug_nans` reads a setting.
 *
 * The settings are process-wide: atomics, since device threads read them
 * while the main thread may change them at a debugger's prompt.
 */
#ifndef SHMAP_JAXCONFIG_H
#define SHMAP_JAXCONFIG_H

#include <stdatomic.h>
#include <stdbool.h>

#include "lang/eval.h"

extern atomic_bool jaxcfg_debug_nans;   /* jax_debug_nans */
extern atomic_bool jaxcfg_disable_jit;  /* jax_disable_jit */

/* Binds jax.config and jax.disable_jit.  0, or -1 with the error set. */
int jaxcfg_register(void);

/* Whether [v], an array or a pytree of them (lists, tuples, dicts), holds
 * a NaN in an array of floats.  Raises nothing. */
bool jaxcfg_has_nan(const Value *v);

/* jaxcfg_check_nans past its test of the setting. */
Value *jaxcfg_nan_check(Value *v, const char *what);

/* With jax_debug_nans, the result [v] (consumed) of operation [what]
 * ("div", "log", "jit(f)"): NULL with FloatingPointError "invalid value
 * (nan) encountered in WHAT" when it holds a NaN, else [v].  Without the
 * setting, [v] untouched, at the cost of one load (every operator of the
 * evaluator calls it). */
static inline Value *jaxcfg_check_nans(Value *v, const char *what) {
  if (!atomic_load_explicit(&jaxcfg_debug_nans, memory_order_relaxed)) return v;
  return jaxcfg_nan_check(v, what);
}

#endif
