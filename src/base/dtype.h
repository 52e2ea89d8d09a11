/*
 * dtype.h - element types, JAX's type promotion lattice, and the 16-bit
 * float conversions.
 *
 * Semantics: JAX's type promotion (jax.numpy.promote_types and the "weak
 * type" rules of jax._src.dtypes), restricted to shmap's dtypes:
 *
 *     bool -> i8 -> i32 -> i64 -> (weak int) ...
 *     i* -> bf16, f16 -> f32 -> f64
 *
 * A weakly typed value (a Python-style number literal) takes the dtype of
 * the other operand when that operand is of the same or a higher kind
 * (x_f16 * 2.0 is f16; x_i8 + 1 is i8), and its own default (i32 or f32)
 * when it meets a lower kind (x_i32 * 2.0 is a weakly typed f32, as in JAX).
 * bf16 + f16 promotes to f32, as in JAX.
 */
#ifndef SHMAP_DTYPE_H
#define SHMAP_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* X-macro: enum name, NumPy name, short name, size in bytes, C type. */
#define DTYPE_LIST(X)                          \
  X(DT_BOOL, "bool", "bool", 1, uint8_t)       \
  X(DT_I8, "int8", "i8", 1, int8_t)            \
  X(DT_I32, "int32", "i32", 4, int32_t)        \
  X(DT_I64, "int64", "i64", 8, int64_t)        \
  X(DT_BF16, "bfloat16", "bf16", 2, uint16_t)  \
  X(DT_F16, "float16", "f16", 2, uint16_t)     \
  X(DT_F32, "float32", "f32", 4, float)        \
  X(DT_F64, "float64", "f64", 8, double)

typedef enum {
#define X(e, np, sh, sz, ct) e,
  DTYPE_LIST(X)
#undef X
  DT_COUNT
} DType;

/* Size of one element in bytes; 0 for a value outside the enum.  Inline:
 * every kernel call and array allocation asks it. */
static inline size_t dt_size(DType t) {
  switch (t) {
#define X(e, np, sh, sz, ct) case e: return sz;
    DTYPE_LIST(X)
#undef X
  default: return 0;
  }
}

/* NumPy's name ("float32"), used by print(x.dtype) and reprs. */
const char *dt_name(DType t);

/* The short name used in plans and shapes ("f32"). */
const char *dt_short(DType t);

/* Parses "float32", "f32", "int32", "i32", "bool", ... into [*out].
 * Returns false for an unknown name (the caller raises the error). */
bool dt_parse(const char *name, DType *out);

bool dt_is_float(DType t);   /* bf16 f16 f32 f64 */
bool dt_is_int(DType t);     /* i8 i32 i64 (not bool) */

/* Whether integer dtype [t] represents [x] exactly (a Python int meeting
 * an array of type t: JAX's OverflowError when it does not). */
bool dt_holds(DType t, int64_t x);

/* Promotes the pair (a, weak_a), (b, weak_b) per the lattice above; the
 * result's weakness goes to [*weak_out] (may be NULL). */
DType dt_promote(DType a, bool weak_a, DType b, bool weak_b, bool *weak_out);

/* The dtype of a float result for an operation such as sin or mean on [t]:
 * floats stay, bool and ints become f32. */
DType dt_float_of(DType t);

/* bfloat16 and IEEE half conversions, round-to-nearest-even; NaN stays
 * NaN, overflow gives infinity. */
float dt_bf16_to_f32(uint16_t h);
uint16_t dt_f32_to_bf16(float f);
float dt_f16_to_f32(uint16_t h);
uint16_t dt_f32_to_f16(float f);

#endif
