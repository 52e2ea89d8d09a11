/*
 * dtype.c - element types, JAX's promotion lattice, 16-bit floats (dtype.h).
 *
 * Promotion is the least upper bound in JAX's lattice
 * (jax._src.dtypes._type_promotion_lattice), restricted to our dtypes.
 * Weakly typed values are the lattice's Python-scalar nodes: a weak int
 * sits just above bool, a weak float just above the widest int, so
 *     i8 + weak int -> i8        f16 + weak float -> f16
 *     i32 + weak float -> weak float (f32, weakly typed, as in JAX)
 * and when every operand is weak the result is the bound of their strong
 * dtypes, made weak (JAX's _lattice_result_type).
 */
#include "base/dtype.h"

#include <math.h>
#include <string.h>

static const char *const dt_names[DT_COUNT] = {
#define X(e, np, sh, sz, ct) [e] = np,
    DTYPE_LIST(X)
#undef X
};
static const char *const dt_shorts[DT_COUNT] = {
#define X(e, np, sh, sz, ct) [e] = sh,
    DTYPE_LIST(X)
#undef X
};

const char *dt_name(DType t) {
  return (unsigned)t < DT_COUNT ? dt_names[t] : "invalid";
}

const char *dt_short(DType t) {
  return (unsigned)t < DT_COUNT ? dt_shorts[t] : "invalid";
}

bool dt_parse(const char *name, DType *out) {
  static const struct { const char *alias; DType t; } extra[] = {
      {"bool_", DT_BOOL}, {"float", DT_F32}, {"int", DT_I32},
      {"double", DT_F64}, {"half", DT_F16},
  };
  for (int t = 0; t < DT_COUNT; t++) {
    if (!strcmp(name, dt_names[t]) || !strcmp(name, dt_shorts[t])) {
      *out = (DType)t;
      return true;
    }
  }
  for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++) {
    if (!strcmp(name, extra[i].alias)) {
      *out = extra[i].t;
      return true;
    }
  }
  return false;
}

bool dt_is_float(DType t) {
  return t == DT_BF16 || t == DT_F16 || t == DT_F32 || t == DT_F64;
}

bool dt_is_int(DType t) { return t == DT_I8 || t == DT_I32 || t == DT_I64; }

bool dt_holds(DType t, int64_t x) {
  switch (t) {
  case DT_I8: return x >= INT8_MIN && x <= INT8_MAX;
  case DT_I32: return x >= INT32_MIN && x <= INT32_MAX;
  default: return true;
  }
}

/* ---- the lattice -------------------------------------------------------- */

/* Lattice nodes: the dtypes plus the two weak (Python scalar) nodes. */
enum { N_BOOL, N_WINT, N_I8, N_I32, N_I64, N_WFLOAT, N_BF16, N_F16, N_F32,
       N_F64, N_COUNT };

/* up[n]: the set of nodes >= n (bit per node), the reflexive-transitive
 * closure of the edges b1->i*, i*->i8->i32->i64->f*, f*->{bf16,f16}->f32->f64. */
static const unsigned lat_up[N_COUNT] = {
    [N_F64] = 1u << N_F64,
    [N_F32] = 1u << N_F32 | 1u << N_F64,
    [N_F16] = 1u << N_F16 | 1u << N_F32 | 1u << N_F64,
    [N_BF16] = 1u << N_BF16 | 1u << N_F32 | 1u << N_F64,
    [N_WFLOAT] = 1u << N_WFLOAT | 1u << N_BF16 | 1u << N_F16 | 1u << N_F32 |
                 1u << N_F64,
    [N_I64] = 1u << N_I64 | 0x3e0u,
    [N_I32] = 1u << N_I32 | 1u << N_I64 | 0x3e0u,
    [N_I8] = 1u << N_I8 | 1u << N_I32 | 1u << N_I64 | 0x3e0u,
    [N_WINT] = 1u << N_WINT | 1u << N_I8 | 1u << N_I32 | 1u << N_I64 | 0x3e0u,
    [N_BOOL] = 0x3ffu,
};

static int dt_node(DType t, bool weak) {
  static const int node[DT_COUNT] = {
      [DT_BOOL] = N_BOOL, [DT_I8] = N_I8,     [DT_I32] = N_I32,
      [DT_I64] = N_I64,   [DT_BF16] = N_BF16, [DT_F16] = N_F16,
      [DT_F32] = N_F32,   [DT_F64] = N_F64,
  };
  if (weak && dt_is_int(t))
    return N_WINT;
  if (weak && dt_is_float(t))
    return N_WFLOAT;
  return node[t];
}

/* The least upper bound: the node of the common upper set whose own upper
 * set is that whole set. */
static int dt_join(int a, int b) {
  unsigned common = lat_up[a] & lat_up[b];
  for (int n = 0; n < N_COUNT; n++)
    if ((common >> n & 1) && lat_up[n] == common)
      return n;
  return N_F64;  /* unreachable: the lattice has a top */
}

static DType dt_of_node(int n, bool *weak) {
  static const DType t[N_COUNT] = {
      [N_BOOL] = DT_BOOL, [N_WINT] = DT_I32,   [N_I8] = DT_I8,
      [N_I32] = DT_I32,   [N_I64] = DT_I64,    [N_WFLOAT] = DT_F32,
      [N_BF16] = DT_BF16, [N_F16] = DT_F16,    [N_F32] = DT_F32,
      [N_F64] = DT_F64,
  };
  *weak = n == N_WINT || n == N_WFLOAT;
  return t[n];
}

DType dt_promote(DType a, bool weak_a, DType b, bool weak_b, bool *weak_out) {
  bool weak;
  DType r;
  if (a == b) {
    r = a;
    weak = weak_a && weak_b;
  } else if (weak_a && weak_b) {
    r = dt_of_node(dt_join(dt_node(a, false), dt_node(b, false)), &weak);
    weak = true;
  } else {
    r = dt_of_node(dt_join(dt_node(a, weak_a), dt_node(b, weak_b)), &weak);
  }
  if (weak_out)
    *weak_out = weak;
  return r;
}

DType dt_float_of(DType t) { return dt_is_float(t) ? t : DT_F32; }

/* ---- 16-bit floats ------------------------------------------------------ */

static uint32_t dt_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float dt_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

float dt_bf16_to_f32(uint16_t h) { return dt_bits_f32((uint32_t)h << 16); }

uint16_t dt_f32_to_bf16(float f) {
  uint32_t u = dt_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)(u >> 16 | 0x40);  /* quiet NaN, sign kept */
  u += 0x7fffu + (u >> 16 & 1);         /* round to nearest even */
  return (uint16_t)(u >> 16);
}

float dt_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t exp = h >> 10 & 0x1f, man = h & 0x3ff;
  if (exp == 0x1f)
    return dt_bits_f32(sign | 0x7f800000u | man << 13);
  if (exp == 0) {
    /* zero or subnormal: man * 2^-24, exact in f32 */
    float v = (float)man * 0x1p-24f;
    return sign ? -v : v;
  }
  return dt_bits_f32(sign | (exp + 112) << 23 | man << 13);
}

/* Rounds |x| (finite, below the f16 overflow threshold) to f16 bits. */
static uint16_t dt_f16_round(float a) {
  uint32_t u = dt_f32_bits(a);
  if (a < 0x1p-14f) {
    /* subnormal range: adding 0.5 makes the FPU round the low bits to
     * nearest even at f16's subnormal spacing 2^-24 */
    float s = a + 0.5f;
    return (uint16_t)(dt_f32_bits(s) - dt_f32_bits(0.5f));
  }
  uint32_t mant_odd = u >> 13 & 1;
  u += 0xfffu + mant_odd;         /* round to nearest even at bit 13 */
  u -= (uint32_t)(127 - 15) << 23;
  return (uint16_t)(u >> 13);
}

uint16_t dt_f32_to_f16(float f) {
  uint32_t u = dt_f32_bits(f);
  uint16_t sign = (uint16_t)(u >> 16 & 0x8000);
  float a = fabsf(f);
  if (a != a)
    return sign | 0x7e00 | (uint16_t)(u >> 13 & 0x3ff);
  if (a >= 65520.0f)  /* rounds to infinity */
    return sign | 0x7c00;
  return sign | dt_f16_round(a);
}
