/*
 * builtins_math.c - elementwise functions (exp, sin, maximum, where,
 * clip, ...) and contractions (matmul, dot, einsum), as jax.numpy builds
 * them from primitives: float functions promote integers to float32
 * first; einsum contracts its operands pairwise, left to right, with
 * dot_general.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array/array.h"
#include "lang/builtins.h"
#include "lang/builtins_impl.h"
#include "base/error.h"
#include "lang/eval.h"
#include "base/intern.h"
#include "base/mem.h"
#include "array/npy.h"
#include "lang/ops.h"
#include "array/prim.h"
#include "array/print.h"

/* ======================================================================
 * Elementwise functions
 * ====================================================================== */

/* Unary float functions: ints and bools become f32 first. */
static Value *unary_float(const char *fname, const CallArgs *a, PrimId id) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind(fname, a, "x", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  Value *f = xa ? bi_inexact(xa) : NULL;
  Value *r = f ? ops_unary_prim(id, f) : NULL;
  bi_drop(xa, f, NULL, NULL);
  return r;
}

#define UNARY_FLOAT(NAME, PRIM) \
  static Value *bi_##NAME(const CallArgs *a) { return unary_float(#NAME, a, PRIM); }
UNARY_FLOAT(exp, P_EXP)
UNARY_FLOAT(log, P_LOG)
UNARY_FLOAT(log1p, P_LOG1P)
UNARY_FLOAT(expm1, P_EXPM1)
UNARY_FLOAT(erf, P_ERF)
UNARY_FLOAT(tanh, P_TANH)
UNARY_FLOAT(sin, P_SIN)
UNARY_FLOAT(cos, P_COS)
UNARY_FLOAT(tan, P_TAN)
UNARY_FLOAT(arcsin, P_ASIN)
UNARY_FLOAT(arccos, P_ACOS)
UNARY_FLOAT(arctan, P_ATAN)
UNARY_FLOAT(sinh, P_SINH)
UNARY_FLOAT(cosh, P_COSH)
UNARY_FLOAT(sqrt, P_SQRT)
UNARY_FLOAT(rsqrt, P_RSQRT)
UNARY_FLOAT(sigmoid, P_LOGISTIC)
#undef UNARY_FLOAT

/* Unary functions that keep integer dtypes ([int_identity]: the identity
 * on integers, as jnp.floor/ceil/round are). */
static Value *unary_same(const char *fname, const CallArgs *a, PrimId id, bool int_identity) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind(fname, a, "x", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  if (int_identity && !dt_is_float(av.dtype)) return xa;
  if (av.dtype == DT_BOOL && (id == P_NEG || id == P_SIGN)) {
    val_decref(xa);
    return err_set(ERR_TYPE, "%s does not accept dtype bool.", fname);
  }
  Value *r = ops_unary_prim(id, xa);
  val_decref(xa);
  return r;
}

static Value *bi_abs(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("abs", a, "x", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  if (bi_aval(xa).dtype == DT_BOOL) return xa;
  Value *r = ops_unary_prim(P_ABS, xa);
  val_decref(xa);
  return r;
}

/* Python's abs(): of a Python int, bool or float, a Python number (an
 * int too large to negate is an OverflowError); else jnp.abs. */
static Value *bi_py_abs(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("abs", a, "x", slots) < 0) return NULL;
  if (!arr_is_host(x)) return bi_abs(a);
  Array *xa = AS_ARRAY(x);
  if (dt_is_float(xa->dtype)) return arr_python_float(fabs(arr_host_f64(xa)));
  int64_t i = arr_get_i64(xa, 0);
  if (i == INT64_MIN) return err_set(ERR_OVERFLOW, "Python int too large: abs() exceeds 64 bits");
  return val_int(i < 0 ? -i : i);
}

static Value *bi_sign(const CallArgs *a) { return unary_same("sign", a, P_SIGN, false); }
static Value *bi_negative(const CallArgs *a) { return unary_same("negative", a, P_NEG, false); }
static Value *bi_floor(const CallArgs *a) { return unary_same("floor", a, P_FLOOR, true); }
static Value *bi_ceil(const CallArgs *a) { return unary_same("ceil", a, P_CEIL, true); }

static Value *bi_isfinite(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("isfinite", a, "x", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  Value *r;
  if (!dt_is_float(av.dtype)) {
    r = bi_fill(DT_BOOL, 1, av.ndim, av.shape);
  } else {
    r = ops_unary_prim(P_IS_FINITE, xa);
  }
  val_decref(xa);
  return r;
}

/* log2 and log10 as jnp computes them: log(x) / log(base). */
static Value *log_base(const char *fname, const CallArgs *a, double base) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind(fname, a, "x", slots) < 0) return NULL;
  Value *xa = bi_arr(x), *f = xa ? bi_inexact(xa) : NULL;
  Value *l = f ? ops_unary_prim(P_LOG, f) : NULL;
  Value *r = l ? bi_bin_const(P_DIV, l, log(base)) : NULL;
  bi_drop(xa, f, l, NULL);
  return r;
}

static Value *bi_log2(const CallArgs *a) { return log_base("log2", a, 2); }
static Value *bi_log10(const CallArgs *a) { return log_base("log10", a, 10); }

/* exp2(x) = exp(x * log(2)). */
static Value *bi_exp2(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("exp2", a, "x", slots) < 0) return NULL;
  Value *xa = bi_arr(x), *f = xa ? bi_inexact(xa) : NULL;
  Value *m = f ? bi_bin_const(P_MUL, f, log(2.0)) : NULL;
  Value *r = m ? ops_unary_prim(P_EXP, m) : NULL;
  bi_drop(xa, f, m, NULL);
  return r;
}

/* isinf: not finite and not NaN. */
static Value *bi_isinf(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("isinf", a, "x", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  Value *r = NULL;
  if (!dt_is_float(av.dtype)) {
    r = bi_fill(DT_BOOL, 0, av.ndim, av.shape);
  } else {
    Value *fin = ops_unary_prim(P_IS_FINITE, xa);
    Value *nf = fin ? ops_unary_prim(P_NOT, fin) : NULL;
    Value *num = nf ? bi_bin(P_EQ, xa, xa) : NULL;
    r = num ? bi_bin(P_AND, nf, num) : NULL;
    bi_drop(fin, nf, num, NULL);
  }
  val_decref(xa);
  return r;
}

static Value *bi_isnan(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("isnan", a, "x", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  Value *r = xa ? bi_bin(P_NE, xa, xa) : NULL;
  val_decref(xa);
  return r;
}

/* divmod(x, y) and jnp.divmod: (x // y, x % y), Python's floor
 * division and the remainder with the divisor's sign. */
static Value *bi_divmod(const CallArgs *a) {
  Value *x, *y;
  Value **slots[] = {&x, &y};
  if (args_bind("divmod", a, "x1, x2", slots) < 0) return NULL;
  Value *q = ops_binary(OP_FLOORDIV, x, y), *r = q ? ops_binary(OP_MOD, x, y) : NULL;
  Value *t = r ? tuple_pack(2, (Value *[]){q, r}) : NULL;
  if (q) val_decref(q);
  if (r) val_decref(r);
  return t;
}

/* jnp.round(a, decimals=0): half to even, as NumPy. */
static Value *bi_round(const CallArgs *a) {
  Value *x, *decimals;
  Value **slots[] = {&x, &decimals};
  if (args_bind("round", a, "a, decimals=", slots) < 0) return NULL;
  int64_t dec;
  if (bi_int_arg("round", "decimals", decimals, 0, &dec) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  if (!dt_is_float(av.dtype) && dec >= 0) return xa;
  Value *f = bi_inexact(xa), *scaled = NULL, *r = NULL, *rounded = NULL;
  double factor = pow(10.0, (double)dec);
  if (!f) goto done;
  scaled = dec ? bi_bin_const(P_MUL, f, factor) : val_incref(f);
  if (scaled) {
    Params p;
    params_init(&p);
    params_add(&p, "rounding_method", val_int(1));
    rounded = ops_apply(P_ROUND, 1, &scaled, &p);
    params_clear(&p);
  }
  if (rounded) r = dec ? bi_bin_const(P_DIV, rounded, factor) : val_incref(rounded);
done:
  bi_drop(xa, f, scaled, rounded);
  return r;
}

/* Whether [v] is a Python int, read into *n. */
static bool py_int_arg(Value *v, int64_t *n) {
  if (!arr_is_host(v) || !dt_is_int(AS_ARRAY(v)->dtype)) return false;
  *n = arr_get_i64(AS_ARRAY(v), 0);
  return true;
}

/* Python's round(x, n) of a double: the decimal nearest [x] with [n]
 * digits after the point (before it for n < 0), ties to even, as CPython
 * rounds (correctly, on x's exact binary value: printf's %f and %e do
 * that).  Past float's range of digits, x itself or a signed zero. */
static double python_round_digits(double x, int64_t n) {
  char buf[720];
  if (!isfinite(x) || x == 0 || n > 323) return x;
  if (n < -308) return 0.0 * x;
  if (n >= 0) {
    snprintf(buf, sizeof buf, "%.*f", (int)n, x);
    return strtod(buf, NULL);
  }
  /* Keep the digits down to 10^-n: as many significant ones as x has
   * above that place. */
  snprintf(buf, sizeof buf, "%.16e", x);
  int exp10 = atoi(strchr(buf, 'e') + 1);
  int64_t sig = exp10 + 1 + n;
  double unit = pow(10.0, (double)-n);
  if (sig <= 0) {
    /* Below half a unit (or exactly half, to the even 0): 0. */
    bool up = sig == 0 && fabs(x) > 0.5 * unit;
    return copysign(up ? unit : 0.0, x);
  }
  snprintf(buf, sizeof buf, "%.*e", (int)sig - 1, x);
  return strtod(buf, NULL);
}

/* round at the top level: Python's round for a Python number (an int
 * without ndigits, a float with them), jnp.round otherwise. */
static Value *bi_py_round(const CallArgs *a) {
  if (a->nkw == 0 && (a->nargs == 1 || a->nargs == 2) && arr_is_host(a->args[0])) {
    Array *x = AS_ARRAY(a->args[0]);
    int64_t n;
    if (a->nargs == 2 && dt_is_float(x->dtype) && py_int_arg(a->args[1], &n))
      return arr_python_float(python_round_digits(arr_host_f64(x), n));
    if (a->nargs == 1 && dt_is_float(x->dtype)) {
      double d = arr_host_f64(x);
      if (!isfinite(d) || fabs(d) >= 9.2e18)
        return err_set(ERR_VALUE, "cannot convert float %s to integer", isnan(d) ? "NaN" : "infinity");
      return val_int((int64_t)nearbyint(d));
    }
  }
  return bi_round(a);
}

/* Binary functions with promotion. */
static Value *binary_fn(const char *fname, const CallArgs *a, PrimId id) {
  Value *x, *y;
  Value **slots[] = {&x, &y};
  if (args_bind(fname, a, "x1, x2", slots) < 0) return NULL;
  Value *xa, *ya;
  if (bi_arr2(x, y, &xa, &ya) < 0) return NULL;
  Value *r = ya ? bi_bin(id, xa, ya) : NULL;
  bi_drop(xa, ya, NULL, NULL);
  return r;
}

static Value *bi_maximum(const CallArgs *a) { return binary_fn("maximum", a, P_MAX); }
static Value *bi_minimum(const CallArgs *a) { return binary_fn("minimum", a, P_MIN); }

/* Binary functions that are the language's operators. */
static Value *binary_op(const char *fname, const CallArgs *a, OpKind op) {
  Value *x, *y;
  Value **slots[] = {&x, &y};
  if (args_bind(fname, a, "x1, x2", slots) < 0) return NULL;
  Value *xa, *ya;
  if (bi_arr2(x, y, &xa, &ya) < 0) return NULL;
  Value *r = NULL;
  if (ya) {
    if (op >= OP_EQ) r = ops_compare(op, xa, ya);
    else r = ops_binary(op, xa, ya);
  }
  bi_drop(xa, ya, NULL, NULL);
  return r;
}

#define BINARY_OP(NAME, OP) \
  static Value *bi_##NAME(const CallArgs *a) { return binary_op(#NAME, a, OP); }
BINARY_OP(add, OP_ADD)
BINARY_OP(subtract, OP_SUB)
BINARY_OP(multiply, OP_MUL)
BINARY_OP(divide, OP_DIV)
BINARY_OP(floor_divide, OP_FLOORDIV)
BINARY_OP(remainder, OP_MOD)
BINARY_OP(power, OP_POW)
BINARY_OP(equal, OP_EQ)
BINARY_OP(not_equal, OP_NE)
BINARY_OP(less, OP_LT)
BINARY_OP(less_equal, OP_LE)
BINARY_OP(greater, OP_GT)
BINARY_OP(greater_equal, OP_GE)
BINARY_OP(bitwise_and, OP_BITAND)
BINARY_OP(bitwise_or, OP_BITOR)
BINARY_OP(bitwise_xor, OP_BITXOR)
BINARY_OP(left_shift, OP_LSHIFT)
BINARY_OP(right_shift, OP_RSHIFT)
#undef BINARY_OP

static Value *bi_arctan2(const CallArgs *a) {
  Value *x, *y;
  Value **slots[] = {&x, &y};
  if (args_bind("arctan2", a, "x1, x2", slots) < 0) return NULL;
  Value *xa, *ya;
  if (bi_arr2(x, y, &xa, &ya) < 0) return NULL;
  Value *xf = ya ? bi_inexact(xa) : NULL, *yf = xf ? bi_inexact(ya) : NULL;
  Value *r = yf ? bi_bin(P_ATAN2, xf, yf) : NULL;
  bi_drop(xa, ya, xf, yf);
  return r;
}

/* logical_and/or/xor: both operands as bools. */
static Value *logical(const char *fname, const CallArgs *a, PrimId id) {
  Value *x, *y;
  Value **slots[] = {&x, &y};
  if (args_bind(fname, a, "x1, x2", slots) < 0) return NULL;
  Value *xa = bi_arr(x), *ya = xa ? bi_arr(y) : NULL;
  Value *xb = ya ? ops_convert(xa, DT_BOOL, false) : NULL;
  Value *yb = xb ? ops_convert(ya, DT_BOOL, false) : NULL;
  Value *r = yb ? bi_bin(id, xb, yb) : NULL;
  bi_drop(xa, ya, xb, yb);
  return r;
}

static Value *bi_logical_and(const CallArgs *a) { return logical("logical_and", a, P_AND); }
static Value *bi_logical_or(const CallArgs *a) { return logical("logical_or", a, P_OR); }
static Value *bi_logical_xor(const CallArgs *a) { return logical("logical_xor", a, P_XOR); }

static Value *bi_logical_not(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("logical_not", a, "x", slots) < 0) return NULL;
  Value *xa = bi_arr(x), *xb = xa ? ops_convert(xa, DT_BOOL, false) : NULL;
  Value *r = xb ? ops_unary_prim(P_NOT, xb) : NULL;
  bi_drop(xa, xb, NULL, NULL);
  return r;
}

static Value *bi_square(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("square", a, "x", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  Value *two = val_int(2);
  Value *r = two ? ops_binary(OP_POW, xa, two) : NULL;
  bi_drop(xa, two, NULL, NULL);
  return r;
}

static Value *bi_reciprocal(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("reciprocal", a, "x", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  Value *one = bi_scalar(bi_aval(xa).dtype, 1);
  Value *r = one ? ops_binary(OP_DIV, one, xa) : NULL;
  bi_drop(xa, one, NULL, NULL);
  return r;
}

static Value *bi_relu(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("relu", a, "x", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  Value *r = xa ? bi_bin_const(P_MAX, xa, 0) : NULL;
  val_decref(xa);
  return r;
}

/* One bound of clip: [r] (consumed) [id] (max or min) [bound], the two
 * converted as a binary function's operands (bi_arr2). */
static Value *clip_side(Value *r, Value *bound, PrimId id) {
  Value *ra, *ba;
  int rc = bi_arr2(r, bound, &ra, &ba);
  val_decref(r);
  if (rc < 0) return NULL;
  Value *m = bi_bin(id, ra, ba);
  bi_drop(ra, ba, NULL, NULL);
  return m;
}

/* jnp.clip(a, min, max) via maximum and minimum. */
static Value *bi_clip(const CallArgs *a) {
  Value *x, *lo, *hi, *lo2, *hi2;
  Value **slots[] = {&x, &lo, &hi, &lo2, &hi2};
  if (args_bind("clip", a, "a, a_min=, a_max=, min=, max=", slots) < 0) return NULL;
  if (bi_is_none(lo)) lo = lo2;
  if (bi_is_none(hi)) hi = hi2;
  Value *r = val_incref(x);
  if (!bi_is_none(lo)) r = clip_side(r, lo, P_MAX);
  if (r && !bi_is_none(hi)) r = clip_side(r, hi, P_MIN);
  if (r && arr_is_host(r)) {   /* clip(0.5) of a Python number alone */
    Value *c = bi_arr(r);
    val_decref(r);
    r = c;
  }
  return r;
}

/* jnp.where(condition, x, y); the one-argument form is nonzero (eager). */
static Value *bi_nonzero(const CallArgs *a);

static Value *nonzero_sized(Value *x, Value *size, Value *fill);

static Value *bi_where(const CallArgs *a) {
  Value *c, *x, *y, *size, *fill;
  Value **slots[] = {&c, &x, &y, &size, &fill};
  if (args_bind("where", a, "condition, x=, y=, size=, fill_value=", slots) < 0) return NULL;
  if (!x && !y) {
    if (size && size != VAL_NONE) return nonzero_sized(c, size, fill);
    CallArgs one = {1, &c, 0, NULL, NULL};
    return bi_nonzero(&one);
  }
  if (size && size != VAL_NONE)
    return err_set(ERR_VALUE, "size argument cannot be used with three-argument where function");
  if (!x || !y) return err_set(ERR_VALUE, "Either both or neither of the x and y arguments should be provided to jax.numpy.where, got %s and %s.", x ? "an array" : "None", y ? "an array" : "None");
  Value *xa, *ya;
  if (bi_arr2(x, y, &xa, &ya) < 0) return NULL;
  Value *ca = bi_arr(c), *cb = ca ? ops_convert(ca, DT_BOOL, false) : NULL;
  Value *r = cb ? ops_select(cb, xa, ya) : NULL;
  bi_drop(ca, xa, ya, cb);
  return r;
}

/* jnp.nonzero(x, size=, fill_value=): the columns of jnp.argwhere's
 * (the standard library's) padded result, which works on traced values
 * too (semantics: JAX's nonzero with size=, padded with fill_value, 0 by
 * default, or truncated).  With [size] None on a traced [x], argwhere's
 * ConcretizationTypeError. */
static Value *nonzero_sized(Value *x, Value *size, Value *fill) {
  Value *ns = builtins_namespace("jnp");
  Value *aw = ns ? dict_get_str(((Module *)ns)->globals, "argwhere") : NULL;
  if (!aw) return err_set(ERR_NOT_IMPLEMENTED, "nonzero(size=) needs the standard library's argwhere");
  Value *kv[2] = {size, fill ? fill : VAL_NONE};
  const char *kn[2] = {intern_cstr("size"), intern_cstr("fill_value")};   /* names are interned */
  CallArgs c = {1, &x, 2, kn, kv};
  Value *r = val_call(aw, &c);
  AVal ra;
  if (!r || ops_aval(r, &ra) < 0) {
    val_decref(r);
    return NULL;
  }
  Value *t = tuple_new((size_t)ra.shape[1]);
  for (int64_t d = 0; t && d < ra.shape[1]; d++) {
    Value *ix = tuple_new(2), *col = NULL;
    if (ix) {
      tuple_set_steal(ix, 0, slice_new(VAL_NONE, VAL_NONE, VAL_NONE));
      tuple_set_steal(ix, 1, val_int(d));
      col = ops_getitem(r, ix);
      val_decref(ix);
    }
    if (!col) {
      val_decref(t);
      t = NULL;
    } else {
      tuple_set_steal(t, (size_t)d, col);
    }
  }
  val_decref(r);
  return t;
}

static Value *bi_nonzero(const CallArgs *a) {
  Value *x, *size, *fill;
  Value **slots[] = {&x, &size, &fill};
  if (args_bind("nonzero", a, "a, size=, fill_value=", slots) < 0) return NULL;
  if (size && size != VAL_NONE) return nonzero_sized(x, size, fill);
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  if (!IS_ARRAY(xa)) {
    val_decref(xa);
    /* traced: argwhere raises JAX's ConcretizationTypeError, naming size= */
    return nonzero_sized(x, VAL_NONE, fill);
  }
  Array *m = AS_ARRAY(xa);
  int nd = m->ndim ? m->ndim : 1;
  int64_t count = 0;
  for (int64_t i = 0; i < m->size; i++) count += arr_get_f64(m, i) != 0;
  Value *t = tuple_new((size_t)nd);
  Array *cols[SHM_MAXDIM];
  for (int d = 0; t && d < nd; d++) {
    cols[d] = arr_new(DT_I32, 1, &count);
    if (!cols[d]) {
      val_decref(t);
      t = NULL;
      break;
    }
    tuple_set_steal(t, (size_t)d, (Value *)cols[d]);
  }
  int64_t k = 0;
  for (int64_t i = 0; t && i < m->size; i++) {
    if (arr_get_f64(m, i) == 0) continue;
    int64_t rem = i;
    for (int d = nd - 1; d >= 0; d--) {
      int64_t dim = m->ndim ? m->shape[d] : 1;
      ((int32_t *)arr_data(cols[d]))[k] = (int32_t)(rem % dim);
      rem /= dim;
    }
    k++;
  }
  val_decref(xa);
  return t;
}

/* ======================================================================
 * Contractions
 * ====================================================================== */

static Value *matmul_of(const CallArgs *a) {
  Value *x, *y, *pref, *sh = NULL;
  Value **slots[] = {&x, &y, &pref, &sh};
  if (args_bind("matmul", a, "a, b, preferred_element_type=, out_sharding=", slots) < 0) return NULL;
  Value *xa = bi_arr(x), *ya = xa ? bi_arr(y) : NULL;
  Value *r = ya ? ops_matmul(xa, ya) : NULL;
  bi_drop(xa, ya, NULL, NULL);
  return r;
}

/* jnp.matmul(a, b, out_sharding=): the product laid out so. */
static Value *bi_matmul(const CallArgs *a) {
  Value *x, *y, *pref, *sh = NULL;
  Value **slots[] = {&x, &y, &pref, &sh};
  if (args_bind("matmul", a, "a, b, preferred_element_type=, out_sharding=", slots) < 0) return NULL;
  return bi_with_out_sharding(matmul_of, a, sh);
}

/* numpy.dot: a product for scalars; otherwise contracts a's last axis with
 * b's second-to-last (its only one if 1-D). */
static Value *dot_of(const CallArgs *a) {
  Value *x, *y, *pref, *sh = NULL;
  Value **slots[] = {&x, &y, &pref, &sh};
  if (args_bind("dot", a, "a, b, preferred_element_type=, out_sharding=", slots) < 0) return NULL;
  Value *xa = bi_arr(x), *ya = xa ? bi_arr(y) : NULL;
  Value *r = NULL;
  if (ya) {
    AVal xv = bi_aval(xa), yv = bi_aval(ya);
    if (xv.ndim == 0 || yv.ndim == 0) {
      r = bi_bin(P_MUL, xa, ya);
    } else {
      int64_t lc = xv.ndim - 1, rc = yv.ndim == 1 ? 0 : yv.ndim - 2;
      if (xv.shape[lc] != yv.shape[rc]) {
        char s1[256], s2[256];
        shape_str(s1, sizeof s1, xv.ndim, xv.shape);
        shape_str(s2, sizeof s2, yv.ndim, yv.shape);
        err_set(ERR_VALUE, "shapes %s and %s not aligned: %lld (dim %lld) != %lld (dim %lld)",
                s1, s2, (long long)xv.shape[lc], (long long)lc, (long long)yv.shape[rc],
                (long long)rc);
      } else {
        r = ops_dot_general(xa, ya, 1, &lc, &rc, 0, NULL, NULL, -1);
      }
    }
  }
  bi_drop(xa, ya, NULL, NULL);
  return r;
}

/* jnp.dot(a, b, out_sharding=): the product laid out so. */
static Value *bi_dot(const CallArgs *a) {
  Value *x, *y, *pref, *sh = NULL;
  Value **slots[] = {&x, &y, &pref, &sh};
  if (args_bind("dot", a, "a, b, preferred_element_type=, out_sharding=", slots) < 0) return NULL;
  return bi_with_out_sharding(dot_of, a, sh);
}

static Value *bi_vdot(const CallArgs *a) {
  Value *x, *y;
  Value **slots[] = {&x, &y};
  if (args_bind("vdot", a, "a, b", slots) < 0) return NULL;
  Value *xa = bi_arr(x), *ya = xa ? bi_arr(y) : NULL;
  Value *xf = ya ? bi_ravel_of(xa) : NULL, *yf = xf ? bi_ravel_of(ya) : NULL;
  int64_t c = 0;
  Value *r = yf ? ops_dot_general(xf, yf, 1, &c, &c, 0, NULL, NULL, -1) : NULL;
  bi_drop(xa, ya, xf, yf);
  return r;
}

static Value *bi_outer(const CallArgs *a) {
  Value *x, *y;
  Value **slots[] = {&x, &y};
  if (args_bind("outer", a, "a, b", slots) < 0) return NULL;
  Value *xa = bi_arr(x), *ya = xa ? bi_arr(y) : NULL;
  Value *xf = ya ? bi_ravel_of(xa) : NULL, *yf = xf ? bi_ravel_of(ya) : NULL;
  Value *r = NULL;
  if (yf) {
    int64_t one = 1;
    Value *xe = ops_expand_dims(xf, 1, &one);
    r = xe ? bi_bin(P_MUL, xe, yf) : NULL;
    val_decref(xe);
  }
  bi_drop(xa, ya, xf, yf);
  return r;
}

/* ---- einsum ---------------------------------------------------------------- */

static Value *bi_einsum(const CallArgs *a);
static Value *einsum_of(const CallArgs *a);

/* One operand during einsum: its array and the letter of each axis. */
typedef struct EinOp {
  Value *x;
  char labels[SHM_MAXDIM + 1];
} EinOp;

/* Sums out the axes of [op] whose labels no one else needs. */
static int ein_sum_out(EinOp *op, const char *keep) {
  int ax[SHM_MAXDIM], n = 0, k = 0;
  char left[SHM_MAXDIM + 1];
  for (int i = 0; op->labels[i]; i++) {
    if (strchr(keep, op->labels[i])) left[k++] = op->labels[i];
    else ax[n++] = i;
  }
  left[k] = 0;
  if (!n) return 0;
  Value *r = ops_reduce(P_REDUCE_SUM, op->x, n, ax, false);
  if (!r) return -1;
  val_decref(op->x);
  op->x = r;
  strcpy(op->labels, left);
  return 0;
}

/* Contracts [b] into [a]: shared labels needed later are batch dims, other
 * shared labels are contracted. */
static int ein_pair(EinOp *a, EinOp *b, const char *later) {
  int64_t lc[SHM_MAXDIM], rc[SHM_MAXDIM], lb[SHM_MAXDIM], rb[SHM_MAXDIM];
  int nc = 0, nb = 0;
  char out[SHM_MAXDIM + 1];
  int k = 0;
  for (int i = 0; a->labels[i]; i++) {
    const char *p = strchr(b->labels, a->labels[i]);
    if (!p) continue;
    if (strchr(later, a->labels[i])) {
      lb[nb] = i;
      rb[nb++] = p - b->labels;
      out[k++] = a->labels[i];
    } else {
      lc[nc] = i;
      rc[nc++] = p - b->labels;
    }
  }
  for (int i = 0; a->labels[i]; i++)
    if (!strchr(b->labels, a->labels[i])) out[k++] = a->labels[i];
  for (int i = 0; b->labels[i]; i++)
    if (!strchr(a->labels, b->labels[i])) out[k++] = b->labels[i];
  out[k] = 0;
  if (k > SHM_MAXDIM) {
    err_set(ERR_VALUE, "einsum: too many dimensions");
    return -1;
  }
  AVal av = bi_aval(a->x), bv = bi_aval(b->x);
  for (int i = 0; i < nc; i++)
    if (av.shape[lc[i]] != bv.shape[rc[i]]) {
      err_set(ERR_VALUE, "Size of label '%c' for operand %d (%lld) does not match previous terms (%lld).",
              a->labels[lc[i]], 1, (long long)bv.shape[rc[i]], (long long)av.shape[lc[i]]);
      return -1;
    }
  Value *r = ops_dot_general(a->x, b->x, nc, lc, rc, nb, lb, rb, -1);
  if (!r) return -1;
  val_decref(a->x);
  a->x = r;
  strcpy(a->labels, out);
  return 0;
}

/* [op]'s diagonal along its axes [p] < [q] (a label repeated within one
 * operand, "ii"): the entries off it set to zero (a select, so an inf or
 * NaN there does not leak) and axis q summed away. */
static int ein_diagonal(EinOp *op, int p, int q) {
  AVal av = bi_aval(op->x);
  int64_t n = av.shape[p];
  if (av.shape[q] != n) {
    err_set(ERR_VALUE, "einsum(): dimensions of the repeated subscript '%c' differ (%lld and %lld)",
            op->labels[p], (long long)n, (long long)av.shape[q]);
    return -1;
  }
  Value *ax[2] = {NULL, NULL};
  for (int d = 0; d < 2; d++) {
    Params pi;
    params_init(&pi);
    params_add(&pi, "dtype", dtype_value(DT_I32));
    params_add(&pi, "shape", val_int_tuple(2, (int64_t[]){n, n}));
    params_add(&pi, "dimension", val_int(d));
    ax[d] = ops_apply(P_IOTA, 0, NULL, &pi);
    params_clear(&pi);
  }
  Value *eye = ax[0] && ax[1] ? ops_compare(OP_EQ, ax[0], ax[1]) : NULL, *mask = NULL;
  if (eye) {
    Params pb;
    params_init(&pb);
    params_add(&pb, "shape", val_int_tuple(av.ndim, av.shape));
    params_add(&pb, "broadcast_dimensions", val_int_tuple(2, (int64_t[]){p, q}));
    mask = ops_apply(P_BROADCAST_IN_DIM, 1, &eye, &pb);
    params_clear(&pb);
  }
  Value *zero = mask ? bi_scalar(av.dtype, 0) : NULL;
  Value *kept = zero ? ops_select(mask, op->x, zero) : NULL;
  int axq = q;
  Value *r = kept ? ops_reduce(P_REDUCE_SUM, kept, 1, &axq, false) : NULL;
  Value *tmp[] = {ax[0], ax[1], eye, mask, zero, kept};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  if (!r) return -1;
  val_decref(op->x);
  op->x = r;
  memmove(op->labels + q, op->labels + q + 1, strlen(op->labels + q));
  return 0;
}

/* Parses one operand's subscripts [s] ([len] bytes, with any "..."
 * already replaced by the letters in [ell]) into [op], then takes the
 * diagonal of each label it repeats. */
static int ein_labels(const char *s, size_t len, EinOp *op, int ndim) {
  if ((int)len != ndim) {
    err_set(ERR_VALUE, "einsum(): the number of subscripts in the equation (%d) does not match "
            "the number of dimensions (%d) for operand", (int)len, ndim);
    return -1;
  }
  for (size_t i = 0; i < len; i++)
    if (!isalpha((unsigned char)s[i])) {
      err_set(ERR_VALUE, "einsum(): invalid subscript '%c' in the equation", s[i]);
      return -1;
    }
  memcpy(op->labels, s, len);
  op->labels[len] = 0;
  for (int q = 1; op->labels[q]; q++) {
    const char *first = memchr(op->labels, op->labels[q], (size_t)q);
    if (first && ein_diagonal(op, (int)(first - op->labels), q) < 0) return -1;
    if (first) q--;   /* the labels moved down by one */
  }
  return 0;
}

/* Replaces "..." in the subscripts [eq] (in place, room for [cap]) by
 * letters the equation does not use: the ellipsis of operand k stands for
 * its leading ndim - (letters) axes, right-aligned across the operands as
 * NumPy broadcasts them; the output's "..." (or, without "->", the front
 * of the implicit output) gets all of them.  [nd] gives each operand's
 * rank.  0, or -1 with the error set. */
static int ein_ellipsis(char *eq, size_t cap, int n, const int *nd) {
  if (!strstr(eq, "...")) return 0;
  char free_[64];
  int nf = 0;
  for (int c = 'A'; c <= 'z' && nf < 63; c++)
    if (isalpha(c) && !strchr(eq, c)) free_[nf++] = (char)c;
  int most = 0, ell[32] = {0};
  const char *p = eq;
  for (int k = 0; k < n && p; k++) {
    const char *end = strpbrk(p, ",-");
    size_t len = end ? (size_t)(end - p) : strlen(p);
    const char *dots = strstr(p, "...");
    if (dots && dots < p + len) {
      ell[k] = nd[k] - (int)(len - 3);
      if (ell[k] < 0) {
        err_set(ERR_VALUE, "einsum(): operand %d has more subscripts than dimensions", k);
        return -1;
      }
      if (ell[k] > most) most = ell[k];
    }
    p = end && *end == ',' ? end + 1 : NULL;
  }
  if (most > nf) return err_set(ERR_VALUE, "einsum: too many dimensions"), -1;
  char out[1024];
  size_t o = 0;
  bool arrow = strstr(eq, "->") != NULL, in_out = false;
  int k = 0;
  for (const char *c = eq; *c && o + 64 < sizeof out; c++) {
    if (c[0] == '-' && c[1] == '>') in_out = true;
    if (c[0] == ',') k++;
    if (!strncmp(c, "...", 3)) {
      int e = in_out ? most : ell[k];
      for (int i = most - e; i < most; i++) out[o++] = free_[i];
      c += 2;
      continue;
    }
    out[o++] = *c;
  }
  if (!arrow) {   /* implicit output: the ellipsis axes, then the letters seen once */
    out[o++] = '-';
    out[o++] = '>';
    for (int i = 0; i < most; i++) out[o++] = free_[i];
    for (int c = 'A'; c <= 'z'; c++) {
      if (!isalpha(c) || memchr(free_, c, (size_t)most)) continue;
      int seen = 0;
      for (const char *q = eq; *q; q++) seen += *q == c;
      if (seen == 1) out[o++] = (char)c;
    }
  }
  out[o] = 0;
  if (o + 1 > cap) return err_set(ERR_VALUE, "einsum: equation too long"), -1;
  memcpy(eq, out, o + 1);
  return 0;
}

/* Removes spaces from the subscripts into [buf]. */
static void strip_spaces(const char *s, char *buf, size_t cap) {
  size_t k = 0;
  for (; *s && k + 1 < cap; s++)
    if (*s != ' ') buf[k++] = *s;
  buf[k] = 0;
}

/* einsum with curly-brace named axes inside an xmap (LANGUAGE.md §10,
 * 'n{b,k},{k,m}->n{b,m}'): the positional einsum of the letters outside
 * the braces, acting per named index as everything does, then a sum over
 * the names the inputs carry and the output does not (contracted). */
static Value *ein_named(const char *eq, const CallArgs *a) {
  char pos[512], names_in[64][32], names_out[64][32];
  int nin = 0, nout = 0;
  size_t k = 0;
  bool in_out = false;
  for (const char *p = eq; *p && k + 2 < sizeof pos; p++) {
    if (p[0] == '-' && p[1] == '>') in_out = true;
    if (*p != '{') {
      pos[k++] = *p;
      continue;
    }
    const char *end = strchr(p, '}');
    if (!end) return err_set(ERR_VALUE, "einsum(): unclosed '{' in the equation");
    for (const char *q = p + 1; q < end;) {
      while (q < end && (*q == ',' || *q == ' ')) q++;
      const char *w = q;
      while (q < end && *q != ',' && *q != ' ') q++;
      if (q == w) continue;
      char (*into)[32] = in_out ? names_out : names_in;
      int *n = in_out ? &nout : &nin;
      if (*n == 64 || q - w >= 32) return err_set(ERR_VALUE, "einsum(): too many or too long axis names");
      snprintf(into[*n], 32, "%.*s", (int)(q - w), w);
      (*n)++;
    }
    p = end;
  }
  pos[k] = 0;
  for (int i = 0; i < nout; i++) {
    bool found = false;
    for (int j = 0; j < nin; j++) found |= !strcmp(names_out[i], names_in[j]);
    if (!found)
      return err_set(ERR_VALUE, "einsum(): output axis name '%s' does not appear in an input",
                     names_out[i]);
  }
  Value *ps = str_from(pos);
  if (!ps) return NULL;
  Value **args = shm_calloc((size_t)a->nargs, sizeof(Value *));
  if (!args) {
    val_decref(ps);
    return err_nomem();
  }
  args[0] = ps;
  for (int i = 1; i < a->nargs; i++) args[i] = a->args[i];
  CallArgs c = {a->nargs, args, 0, NULL, NULL};
  Value *r = bi_einsum(&c);
  shm_free(args);
  val_decref(ps);
  /* the contracted names: in an input, not in the output (each once) */
  Value *sum = list_new(4);
  for (int i = 0; r && sum && i < nin; i++) {
    bool kept = false, seen = false;
    for (int j = 0; j < nout; j++) kept |= !strcmp(names_in[i], names_out[j]);
    for (int j = 0; j < i; j++) seen |= !strcmp(names_in[i], names_in[j]);
    if (kept || seen) continue;
    Value *nm = str_from(names_in[i]);
    if (!nm || list_append_steal(sum, nm) < 0) {
      val_decref(r);
      r = NULL;
    }
  }
  Value *t = sum && r && list_len(sum) ? tuple_pack(list_len(sum), ((List *)sum)->items) : NULL;
  Value *out = t ? ops_named_reduce(P_REDUCE_SUM, r, t, NULL) : r ? val_incref(r) : NULL;
  if (t) val_decref(t);
  if (sum) val_decref(sum);
  if (r) val_decref(r);
  return out;
}

/* jnp.einsum(subscripts, *operands, out_sharding=): the result laid out
 * so; the other keywords (optimize=, preferred_element_type=) change
 * nothing here. */
static Value *bi_einsum(const CallArgs *a) {
  Value *sh = NULL;
  for (int k = 0; k < a->nkw; k++)
    if (!strcmp(a->kwnames[k], "out_sharding")) sh = a->kwvals[k];
  return bi_with_out_sharding(einsum_of, a, sh);
}

static Value *einsum_of(const CallArgs *a) {
  if (a->nargs < 2 || a->args[0]->type != V_STR)
    return err_set(ERR_TYPE, "einsum() takes a subscripts string and at least one operand");
  if (strchr(str_cstr(a->args[0]), '{')) return ein_named(str_cstr(a->args[0]), a);
  int n = a->nargs - 1;
  if (n > 32) return err_set(ERR_VALUE, "einsum: too many operands");
  char eq[1024];
  strip_spaces(str_cstr(a->args[0]), eq, 512);
  int nds[32];
  for (int i = 0; i < n; i++) {
    Value *xa = bi_arr(a->args[i + 1]);
    if (!xa) return NULL;
    nds[i] = bi_aval(xa).ndim;
    val_decref(xa);
  }
  if (ein_ellipsis(eq, sizeof eq, n, nds) < 0) return NULL;
  char *arrow = strstr(eq, "->");
  char out[SHM_MAXDIM + 2] = "";
  if (arrow) {
    *arrow = 0;
    if (strlen(arrow + 2) > SHM_MAXDIM) return err_set(ERR_VALUE, "einsum: too many output subscripts");
    strcpy(out, arrow + 2);
  }
  EinOp ops[32];
  memset(ops, 0, sizeof ops);
  Value *r = NULL;
  int k = 0;
  const char *p = eq;
  for (; k < n; k++) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (!comma && k + 1 < n) {
      err_set(ERR_VALUE, "einsum(): more operands were provided than specified in the equation");
      goto done;
    }
    if (comma && k + 1 == n) {
      err_set(ERR_VALUE, "einsum(): fewer operands were provided than specified in the equation");
      goto done;
    }
    ops[k].x = bi_arr(a->args[k + 1]);
    if (!ops[k].x || ein_labels(p, len, &ops[k], bi_aval(ops[k].x).ndim) < 0) {
      k++;
      goto done;
    }
    p += len + 1;
  }
  if (!arrow) {
    /* Implicit output: labels seen once, in alphabetical order. */
    int m = 0;
    for (int c = 'A'; c <= 'z'; c++) {   /* counted in the equation: "ii" sums */
      int seen = 0;
      for (const char *q = eq; *q; q++) seen += *q == c;
      if (isalpha(c) && seen == 1 && m < SHM_MAXDIM) out[m++] = (char)c;
    }
    out[m] = 0;
  }
  for (int i = 0; out[i]; i++) {
    bool found = false;
    for (int j = 0; j < n; j++) found = found || strchr(ops[j].labels, out[i]);
    if (!found) {
      err_set(ERR_VALUE, "einsum(): output subscript '%c' does not appear in an input", out[i]);
      goto done;
    }
  }
  for (int i = 0; i < n; i++) {
    /* Labels needed after step i: the output's and later operands'. */
    char later[(SHM_MAXDIM + 1) * 34];
    strcpy(later, out);
    for (int j = i + 1; j < n; j++) strcat(later, ops[j].labels);
    char keep[(SHM_MAXDIM + 1) * 36];
    snprintf(keep, sizeof keep, "%s%s", later, i > 0 ? ops[0].labels : "");
    if (ein_sum_out(&ops[i], keep) < 0) goto done;
    if (i > 0 && ein_pair(&ops[0], &ops[i], later) < 0) goto done;
  }
  if (ein_sum_out(&ops[0], out) < 0) goto done;
  int perm[SHM_MAXDIM], nd = (int)strlen(out);
  for (int i = 0; i < nd; i++) perm[i] = (int)(strchr(ops[0].labels, out[i]) - ops[0].labels);
  r = ops_transpose(ops[0].x, nd, perm);
done:
  for (int i = 0; i < k; i++) val_decref(ops[i].x);
  return r;
}

/* The names this file binds, and where (builtins_impl.h). */
const BiEntry bi_math_table[] = {
  {"exp", bi_exp, NP | IN_LAX, "exp(x)"},
  {"log", bi_log, NP | IN_LAX, "log(x)"},
  {"log1p", bi_log1p, NP | IN_LAX, "log1p(x)"},
  {"erf", bi_erf, IN_LAX, "erf(x): the error function"},
  {"expm1", bi_expm1, NP | IN_LAX, "expm1(x)"},
  {"tanh", bi_tanh, NP | IN_LAX, "tanh(x)"},
  {"sin", bi_sin, NP | IN_LAX, "sin(x)"},
  {"cos", bi_cos, NP | IN_LAX, "cos(x)"},
  {"tan", bi_tan, NP | IN_LAX, "tan(x)"},
  {"arcsin", bi_arcsin, NP, "arcsin(x)"},
  {"arccos", bi_arccos, NP, "arccos(x)"},
  {"arctan", bi_arctan, NP, "arctan(x)"},
  {"sinh", bi_sinh, NP | IN_LAX, "sinh(x)"},
  {"cosh", bi_cosh, NP | IN_LAX, "cosh(x)"},
  {"sqrt", bi_sqrt, NP | IN_LAX, "sqrt(x)"},
  {"rsqrt", bi_rsqrt, IN_LAX, "rsqrt(x): 1 / sqrt(x)"},
  {"abs", bi_py_abs, IN_TOP, "abs(x): a Python number's abs, else jnp.abs"},
  {"abs", bi_abs, IN_JNP | IN_LAX, "abs(x)"},
  {"divmod", bi_divmod, NP, "divmod(x1, x2): (x1 // x2, x1 % x2)"},
  {"absolute", bi_abs, IN_JNP, "absolute(x)"},
  {"sign", bi_sign, NP | IN_LAX, "sign(x)"},
  {"negative", bi_negative, IN_JNP, "negative(x)"},
  {"floor", bi_floor, NP | IN_LAX, "floor(x)"},
  {"ceil", bi_ceil, NP | IN_LAX, "ceil(x)"},
  {"round", bi_round, IN_JNP | IN_LAX, "round(a, decimals=0): half to even"},
  {"round", bi_py_round, IN_TOP, "round(x, decimals=0): Python's round for a number, else jnp.round"},
  {"isfinite", bi_isfinite, NP, "isfinite(x)"},
  {"isnan", bi_isnan, NP, "isnan(x)"},
  {"isinf", bi_isinf, NP, "isinf(x)"},
  {"log2", bi_log2, NP, "log2(x)"},
  {"log10", bi_log10, NP, "log10(x)"},
  {"exp2", bi_exp2, NP, "exp2(x)"},
  {"square", bi_square, NP | IN_LAX, "square(x)"},
  {"reciprocal", bi_reciprocal, NP, "reciprocal(x)"},
  {"maximum", bi_maximum, NP, "maximum(x1, x2): elementwise"},
  {"minimum", bi_minimum, NP, "minimum(x1, x2): elementwise"},
  {"add", bi_add, NP, "add(x1, x2)"},
  {"subtract", bi_subtract, NP, "subtract(x1, x2)"},
  {"multiply", bi_multiply, NP, "multiply(x1, x2)"},
  {"divide", bi_divide, NP, "divide(x1, x2): true division"},
  {"true_divide", bi_divide, IN_JNP, "true_divide(x1, x2)"},
  {"floor_divide", bi_floor_divide, NP, "floor_divide(x1, x2)"},
  {"remainder", bi_remainder, NP, "remainder(x1, x2): sign of the divisor"},
  {"mod", bi_remainder, IN_JNP, "mod(x1, x2)"},
  {"power", bi_power, NP, "power(x1, x2)"},
  {"arctan2", bi_arctan2, NP, "arctan2(x1, x2)"},
  {"equal", bi_equal, NP, "equal(x1, x2)"},
  {"not_equal", bi_not_equal, NP, "not_equal(x1, x2)"},
  {"less", bi_less, NP, "less(x1, x2)"},
  {"less_equal", bi_less_equal, NP, "less_equal(x1, x2)"},
  {"greater", bi_greater, NP, "greater(x1, x2)"},
  {"greater_equal", bi_greater_equal, NP, "greater_equal(x1, x2)"},
  {"bitwise_and", bi_bitwise_and, NP, "bitwise_and(x1, x2)"},
  {"bitwise_or", bi_bitwise_or, NP, "bitwise_or(x1, x2)"},
  {"bitwise_xor", bi_bitwise_xor, NP, "bitwise_xor(x1, x2)"},
  {"left_shift", bi_left_shift, NP, "left_shift(x1, x2): x1 << x2"},
  {"right_shift", bi_right_shift, NP, "right_shift(x1, x2): x1 >> x2, arithmetic"},
  {"logical_and", bi_logical_and, NP, "logical_and(x1, x2)"},
  {"logical_or", bi_logical_or, NP, "logical_or(x1, x2)"},
  {"logical_xor", bi_logical_xor, NP, "logical_xor(x1, x2)"},
  {"logical_not", bi_logical_not, NP, "logical_not(x)"},
  {"clip", bi_clip, NP, "clip(a, a_min=None, a_max=None)"},
  {"where", bi_where, NP, "where(condition, x, y)"},
  {"nonzero", bi_nonzero, NP, "nonzero(a): a tuple of index arrays (eager only)"},
  {"relu", bi_relu, IN_TOP | IN_JNP | IN_NN, "relu(x): max(x, 0)"},
  {"sigmoid", bi_sigmoid, IN_TOP | IN_JNP | IN_NN, "sigmoid(x): logistic"},
  {"logistic", bi_sigmoid, IN_LAX, "logistic(x)"},
  {"matmul", bi_matmul, NP, "matmul(a, b)"},
  {"dot", bi_dot, NP, "dot(a, b)"},
  {"vdot", bi_vdot, NP, "vdot(a, b)"},
  {"outer", bi_outer, NP, "outer(a, b)"},
  {"einsum", bi_einsum, NP, "einsum(subscripts, *operands)"},
  {NULL, NULL, 0, NULL},
};
