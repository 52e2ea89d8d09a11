/*
 * print.h - printing values: NumPy's str for print(), JAX's repr for the
 * REPL's echo, Python's forms for everything else.
 *
 * Arrays (semantics: numpy.array2string / numpy.array_str, NumPy 1.2x):
 * precision 8, suppress small values as NumPy does (scientific notation
 * when the ratio max/min >= 1e3 or max >= 1e8 unless suppressed), floats in
 * "unique" (shortest round-trip) mode trimmed as NumPy trims ('.' kept:
 * `[0. 1. 2.]`), summarisation with `...` above 1000 elements showing 3
 * edge items, line width 75, nested brackets with NumPy's line breaks.
 * Repr: `Array([0., 1., 2.], dtype=float32)`, `Array(3, dtype=int32,
 * weak_type=True)` as jax.Array's repr.
 */
#ifndef SHMAP_PRINT_H
#define SHMAP_PRINT_H

#include "base/value.h"

typedef struct PrintOptions {
  int precision;   /* 8 */
  int threshold;   /* 1000 */
  int edgeitems;   /* 3 */
  int linewidth;   /* 75 */
  bool suppress;   /* false */
} PrintOptions;

/* Process-wide options (from the config file or set_printoptions).  Read
 * by every thread while printing; written only by the main thread while no
 * device code runs (config loading, the set_printoptions built-in). */
extern PrintOptions print_options;

/* Replaces the options with [*o] after checking them: precision 0..17,
 * threshold >= 0, edgeitems >= 0, linewidth >= 1.  Returns 0, or -1 with
 * an ERR_VALUE error naming the bad field (options unchanged). */
int print_set_options(const PrintOptions *o);

/* str(v), what print() shows: a new Str, or NULL with the error set (out
 * of memory only).  Arrays as numpy.array_str (0-d arrays as NumPy's
 * scalar str: `3`, `3.0`, `True`); strings unquoted; everything else as
 * val_repr. */
Value *val_str(Value *v);

/* repr(v), the REPL's echo: a new Str, or NULL with the error set.
 * Arrays as jax.Array.__repr__ (`Array([0., 1.], dtype=float32)`); strings
 * quoted as Python quotes them; containers with their items' reprs, except
 * that a 0-d weakly typed array (a number literal) or True/False inside a
 * container prints as the Python number, so shapes print `(8, 32)`. */
Value *val_repr(Value *v);

/* ascii(v), Python's: val_repr with every non-ASCII code point escaped
 * as \xhh, \uhhhh or \Uhhhhhhhh (f-strings' !a).  A new Str, or NULL
 * with the error set. */
Value *val_ascii(Value *v);

/* Registers the str and repr of a value type defined by a later subsystem
 * (V_MESH, V_PSPEC, V_SHARDFN, V_JITFN, V_PLAN, V_TRACER, ...).  Either
 * function may be NULL: str falls back to repr, repr to `<typename>`
 * (val_type_name).  Call at start-up, before any device thread runs; the
 * table is read-only afterwards.  Each function returns a new Str or NULL
 * with the error set.  For V_TUPLE, [repr] is the repr of named tuples
 * (VAL_NAMED: lang/classes.c) only; other tuples print as tuples. */
void print_register(VType t, Value *(*str)(Value *), Value *(*repr)(Value *));  /* hook */

/* Formats a float as NumPy prints a float scalar of dtype [t] (bf16, f16,
 * f32 or f64): shortest round-trip digits for that dtype, positional for
 * 1e-4 <= |x| < 1e16 (`3.0`, `0.1`), else scientific (`1e-05`).  Writes
 * at most [cap] bytes (NUL included) into [buf]; used by debug_print and
 * the plan printer for literals. */
void print_float_scalar(char *buf, size_t cap, double x, DType t);

#endif
