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

#include "value.h"

typedef struct PrintOptions {
  int precision;   /* 8 */
  int threshold;   /* 1000 */
  int edgeitems;   /* 3 */
  int linewidth;   /* 75 */
  bool suppress;   /* false */
} PrintOptions;

/* Process-wide options (from the config file or set_printoptions). */
extern PrintOptions print_options;

/* str(v): a new Str, or NULL with the error set. */
Value *val_str(Value *v);

/* repr(v): a new Str. */
Value *val_repr(Value *v);

#endif
