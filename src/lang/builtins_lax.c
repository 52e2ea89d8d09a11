/*
 * builtins_lax.c - the jax.lax functions bound in the `lax` namespace
 * that take primitive parameters (convert_element_type, broadcast_in_dim,
 * reshape, slice, iota, dot_general, ...) and lax's plain elementwise
 * functions (add, mul, max, ...), each one primitive with jax.lax's
 * argument names.
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
 * lax functions with parameters
 * ====================================================================== */

/* A tuple of ints parameter from a sequence or an int. */
static Value *ints_param(Value *v) {
  int n;
  int64_t xs[SHM_MAXDIM];
  if (ops_shape_arg(v, &n, xs) < 0) return NULL;
  return val_int_tuple(n, xs);
}

/* Applies [id] to [x] with parameters built by the caller. */
static Value *lax1(PrimId id, Value *x, Params *p) {
  Value *xa = bi_arr(x);
  Value *r = xa ? ops_apply(id, 1, &xa, p) : NULL;
  params_clear(p);
  val_decref(xa);
  return r;
}

static Value *lax_convert_element_type(const CallArgs *a) {
  Value *x, *nd;
  Value **slots[] = {&x, &nd};
  if (args_bind("convert_element_type", a, "operand, new_dtype", slots) < 0) return NULL;
  int t;
  if (ops_dtype_arg(nd, &t) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  Value *r = t < 0 ? val_incref(xa) : ops_convert(xa, (DType)t, false);
  val_decref(xa);
  return r;
}

static Value *lax_broadcast_in_dim(const CallArgs *a) {
  Value *x, *shape, *bd;
  Value **slots[] = {&x, &shape, &bd};
  if (args_bind("broadcast_in_dim", a, "operand, shape, broadcast_dimensions", slots) < 0) return NULL;
  Params p;
  params_init(&p);
  if (params_add(&p, "shape", ints_param(shape)) < 0 ||
      params_add(&p, "broadcast_dimensions", bi_is_seq(bd) && !(bd->type == V_TUPLE ? tuple_len(bd) : list_len(bd))
                                                 ? val_int_tuple(0, NULL) : ints_param(bd)) < 0) {
    params_clear(&p);
    return NULL;
  }
  return lax1(P_BROADCAST_IN_DIM, x, &p);
}

static Value *reshape_of(const CallArgs *a) {
  Value *x, *ns, *dims, *out = NULL;
  Value **slots[] = {&x, &ns, &dims, &out};
  if (args_bind("reshape", a, "operand, new_sizes, dimensions=, out_sharding=", slots) < 0) return NULL;
  if (!bi_is_none(dims)) return err_set(ERR_VALUE, "lax.reshape: dimensions= is not supported");
  int nd;
  int64_t sh[SHM_MAXDIM];
  if (ops_shape_arg(ns, &nd, sh) < 0) return NULL;
  Value *xa = bi_arr(x);
  Value *r = xa ? ops_reshape(xa, nd, sh) : NULL;
  val_decref(xa);
  return r;
}

/* lax.reshape(operand, new_sizes, dimensions=None, out_sharding=None). */
static Value *lax_reshape(const CallArgs *a) {
  Value *x, *ns, *dims, *out = NULL;
  Value **slots[] = {&x, &ns, &dims, &out};
  if (args_bind("reshape", a, "operand, new_sizes, dimensions=, out_sharding=", slots) < 0) return NULL;
  return bi_with_out_sharding(reshape_of, a, out);
}

static Value *lax_transpose(const CallArgs *a) {
  Value *x, *perm;
  Value **slots[] = {&x, &perm};
  if (args_bind("transpose", a, "operand, permutation", slots) < 0) return NULL;
  Params p;
  params_init(&p);
  if (params_add(&p, "permutation", ints_param(perm)) < 0) return NULL;
  return lax1(P_TRANSPOSE, x, &p);
}

static Value *lax_dims_fn(const char *fname, const CallArgs *a, PrimId id) {
  Value *x, *dims;
  Value **slots[] = {&x, &dims};
  if (args_bind(fname, a, "operand, dimensions", slots) < 0) return NULL;
  Params p;
  params_init(&p);
  if (params_add(&p, "dimensions", bi_is_seq(dims) && !(dims->type == V_TUPLE ? tuple_len(dims) : list_len(dims))
                                       ? val_int_tuple(0, NULL) : ints_param(dims)) < 0)
    return NULL;
  return lax1(id, x, &p);
}

static Value *lax_rev(const CallArgs *a) { return lax_dims_fn("rev", a, P_REV); }
static Value *lax_squeeze(const CallArgs *a) { return lax_dims_fn("squeeze", a, P_SQUEEZE); }
static Value *lax_expand_dims(const CallArgs *a) { return lax_dims_fn("expand_dims", a, P_EXPAND_DIMS); }

static Value *lax_slice(const CallArgs *a) {
  Value *x, *st, *li, *strides;
  Value **slots[] = {&x, &st, &li, &strides};
  if (args_bind("slice", a, "operand, start_indices, limit_indices, strides=", slots) < 0) return NULL;
  Params p;
  params_init(&p);
  if (params_add(&p, "start_indices", ints_param(st)) < 0 ||
      params_add(&p, "limit_indices", ints_param(li)) < 0 ||
      params_add(&p, "strides", bi_is_none(strides) ? VAL_NONE : ints_param(strides)) < 0) {
    params_clear(&p);
    return NULL;
  }
  return lax1(P_SLICE, x, &p);
}

/* pad's padding_config parameter: a tuple of (lo, hi, interior) int
 * tuples from any sequence of triples (new), or NULL with a TypeError. */
static Value *padding_config(Value *cfg) {
  size_t n;
  Value *const *items;
  if (!val_seq(cfg, &n, &items)) {
    err_set(ERR_TYPE, "pad: padding_config must be a sequence of (low, high, interior) triples");
    return NULL;
  }
  Value *t = tuple_new(n);
  for (size_t i = 0; t && i < n; i++) {
    int k = 0;
    int64_t xs[SHM_MAXDIM];
    if (ops_shape_arg(items[i], &k, xs) < 0 || k != 3) {
      if (!err_occurred())
        err_set(ERR_TYPE, "pad: padding_config must be a sequence of (low, high, interior) triples");
      val_decref(t);
      return NULL;
    }
    tuple_set_steal(t, i, val_int_tuple(3, xs));
  }
  return t;
}

/* lax.pad(operand, padding_value, padding_config): low, high and interior
 * padding per dimension ((lo, hi, interior) triples; lo and hi may be
 * negative and cut).  padding_value is a 0-d array of operand's dtype; a
 * Python number of the same kind (weakly typed) takes operand's dtype.
 * Raises pad's TypeError/ValueError (shape_pad).  semantics: jax.lax.pad. */
static Value *lax_pad(const CallArgs *a) {
  Value *x, *pv, *cfg;
  Value **slots[] = {&x, &pv, &cfg};
  if (args_bind("pad", a, "operand, padding_value, padding_config", slots) < 0) return NULL;
  Value *xa = bi_arr(x), *va = xa ? bi_arr(pv) : NULL;
  if (!va) {
    bi_drop(xa, NULL, NULL, NULL);
    return NULL;
  }
  DType t = AS_ARRAY(xa)->dtype, vt = AS_ARRAY(va)->dtype;
  if (AS_ARRAY(va)->weak && vt != t && AS_ARRAY(va)->ndim == 0 &&
      (dt_is_float(vt) ? dt_is_float(t) : vt == DT_BOOL ? t == DT_BOOL : !dt_is_float(t) && t != DT_BOOL)) {
    Value *c = ops_convert(va, t, false);
    val_decref(va);
    if (!(va = c)) {
      val_decref(xa);
      return NULL;
    }
  }
  Params p;
  params_init(&p);
  Value *r = NULL, *c = padding_config(cfg);
  if (c && params_add(&p, "padding_config", c) == 0) {
    Value *in[2] = {xa, va};
    r = ops_apply(P_PAD, 2, in, &p);
  }
  params_clear(&p);
  bi_drop(xa, va, NULL, NULL);
  return r;
}

static Value *lax_iota(const CallArgs *a) {
  Value *dtype, *size;
  Value **slots[] = {&dtype, &size};
  if (args_bind("iota", a, "dtype, size", slots) < 0) return NULL;
  int t;
  int64_t n;
  if (ops_dtype_arg(dtype, &t) < 0 || bi_int_arg("iota", "size", size, 0, &n) < 0) return NULL;
  if (t < 0) return err_set(ERR_TYPE, "iota: dtype must not be None");
  return bi_iota((DType)t, 1, &n, 0);
}

static Value *lax_broadcasted_iota(const CallArgs *a) {
  Value *dtype, *shape, *dim;
  Value **slots[] = {&dtype, &shape, &dim};
  if (args_bind("broadcasted_iota", a, "dtype, shape, dimension", slots) < 0) return NULL;
  int t, nd, d;
  int64_t sh[SHM_MAXDIM], dd;
  if (ops_dtype_arg(dtype, &t) < 0 || ops_shape_arg(shape, &nd, sh) < 0 ||
      bi_int_arg("broadcasted_iota", "dimension", dim, 0, &dd) < 0 || axis_normalize(dd, nd, &d) < 0)
    return NULL;
  return bi_iota(t < 0 ? DT_I32 : (DType)t, nd, sh, d);
}

static Value *lax_concatenate(const CallArgs *a) {
  Value *ops, *dim;
  Value **slots[] = {&ops, &dim};
  if (args_bind("concatenate", a, "operands, dimension", slots) < 0) return NULL;
  int n;
  int64_t d;
  if (bi_int_arg("concatenate", "dimension", dim, 0, &d) < 0) return NULL;
  Value **xs = bi_arrays_arg("concatenate", ops, &n);
  if (!xs) return NULL;
  Value *r = bi_concat(xs, n, (int)d);
  bi_free_arrays(xs, n);
  return r;
}

/* Reads ((lc, rc), (lb, rb)) dimension numbers. */
static int dimnums_arg(Value *v, int *nc, int64_t *lc, int64_t *rc, int *nb, int64_t *lb, int64_t *rb) {
  size_t n;
  Value *const *top, *const *pair;
  if (!val_seq(v, &n, &top) || n != 2) goto bad;
  for (int k = 0; k < 2; k++) {
    if (!val_seq(top[k], &n, &pair) || n != 2) goto bad;
    int n0, n1;
    if (ops_shape_arg(pair[0], &n0, k ? lb : lc) < 0 || ops_shape_arg(pair[1], &n1, k ? rb : rc) < 0)
      return -1;
    if (n0 != n1) goto bad;
    *(k ? nb : nc) = n0;
  }
  return 0;
bad:
  err_set(ERR_TYPE, "dot_general requires dimension_numbers of the form "
          "(((lhs_contracting,), (rhs_contracting,)), ((lhs_batch,), (rhs_batch,)))");
  return -1;
}

static Value *dot_general_of(const CallArgs *a) {
  Value *l, *r, *dn, *precision, *pref, *out = NULL;
  Value **slots[] = {&l, &r, &dn, &precision, &pref, &out};
  if (args_bind("dot_general", a, "lhs, rhs, dimension_numbers, precision=, preferred_element_type=, out_sharding=", slots) < 0)
    return NULL;
  int nc = 0, nb = 0, t;
  int64_t lc[SHM_MAXDIM], rc[SHM_MAXDIM], lb[SHM_MAXDIM], rb[SHM_MAXDIM];
  if (dimnums_arg(dn, &nc, lc, rc, &nb, lb, rb) < 0 || ops_dtype_arg(pref, &t) < 0) return NULL;
  Value *la = bi_arr(l), *ra = la ? bi_arr(r) : NULL;
  Value *res = ra ? ops_dot_general(la, ra, nc, lc, rc, nb, lb, rb, t) : NULL;
  bi_drop(la, ra, NULL, NULL);
  return res;
}

/* lax.dot_general(lhs, rhs, dimension_numbers, precision=None,
 * preferred_element_type=None, out_sharding=None). */
static Value *lax_dot_general(const CallArgs *a) {
  Value *l, *r, *dn, *precision, *pref, *out = NULL;
  Value **slots[] = {&l, &r, &dn, &precision, &pref, &out};
  if (args_bind("dot_general", a, "lhs, rhs, dimension_numbers, precision=, preferred_element_type=, out_sharding=", slots) < 0)
    return NULL;
  return bi_with_out_sharding(dot_general_of, a, out);
}

static Value *lax_integer_pow(const CallArgs *a) {
  Value *x, *y;
  Value **slots[] = {&x, &y};
  if (args_bind("integer_pow", a, "x, y", slots) < 0) return NULL;
  int64_t yy;
  if (bi_int_arg("integer_pow", "y", y, 0, &yy) < 0) return NULL;
  Params p;
  params_init(&p);
  params_add(&p, "y", val_int(yy));
  return lax1(P_INTEGER_POW, x, &p);
}

static Value *lax_select(const CallArgs *a) {
  Value *c, *x, *y;
  Value **slots[] = {&c, &x, &y};
  if (args_bind("select", a, "pred, on_true, on_false", slots) < 0) return NULL;
  Value *ca = bi_arr(c), *xa = ca ? bi_arr(x) : NULL, *ya = xa ? bi_arr(y) : NULL;
  Value *r = ya ? ops_select(ca, xa, ya) : NULL;
  bi_drop(ca, xa, ya, NULL);
  return r;
}

static Value *lax_clamp(const CallArgs *a) {
  Value *lo, *x, *hi;
  Value **slots[] = {&lo, &x, &hi};
  if (args_bind("clamp", a, "min, x, max", slots) < 0) return NULL;
  Value *la = bi_arr(lo), *xa = la ? bi_arr(x) : NULL, *ha = xa ? bi_arr(hi) : NULL;
  Value *r = NULL;
  if (ha) {
    Value *in[3] = {la, xa, ha};
    r = ops_elementwise(P_CLAMP, 3, in);
  }
  bi_drop(la, xa, ha, NULL);
  return r;
}

/* lax's plain elementwise functions: same as the jnp ones with promotion. */
static Value *lax_bin(const char *fname, const CallArgs *a, PrimId id) {
  Value *x, *y;
  Value **slots[] = {&x, &y};
  if (args_bind(fname, a, "x, y", slots) < 0) return NULL;
  Value *xa = bi_arr(x), *ya = xa ? bi_arr(y) : NULL;
  Value *r = ya ? bi_bin(id, xa, ya) : NULL;
  bi_drop(xa, ya, NULL, NULL);
  return r;
}

#define LAX_BIN(NAME, PRIM) \
  static Value *lax_##NAME(const CallArgs *a) { return lax_bin(#NAME, a, PRIM); }
LAX_BIN(add, P_ADD)
LAX_BIN(sub, P_SUB)
LAX_BIN(mul, P_MUL)
LAX_BIN(div, P_DIV)
LAX_BIN(rem, P_REM)
LAX_BIN(pow, P_POW)
LAX_BIN(max, P_MAX)
LAX_BIN(min, P_MIN)
LAX_BIN(eq, P_EQ)
LAX_BIN(ne, P_NE)
LAX_BIN(lt, P_LT)
LAX_BIN(le, P_LE)
LAX_BIN(gt, P_GT)
LAX_BIN(ge, P_GE)
#undef LAX_BIN

static Value *lax_un(const char *fname, const CallArgs *a, PrimId id) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind(fname, a, "x", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  Value *r = xa ? ops_unary_prim(id, xa) : NULL;
  val_decref(xa);
  return r;
}

static Value *lax_neg(const CallArgs *a) { return lax_un("neg", a, P_NEG); }
static Value *lax_asin(const CallArgs *a) { return lax_un("asin", a, P_ASIN); }
static Value *lax_acos(const CallArgs *a) { return lax_un("acos", a, P_ACOS); }
static Value *lax_atan(const CallArgs *a) { return lax_un("atan", a, P_ATAN); }
static Value *lax_is_finite(const CallArgs *a) { return lax_un("is_finite", a, P_IS_FINITE); }
static Value *lax_erf_inv(const CallArgs *a) { return lax_un("erf_inv", a, P_ERF_INV); }

/* The names this file binds, and where (builtins_impl.h). */
const BiEntry bi_lax_table[] = {
  {"add", lax_add, IN_LAX, "add(x, y)"},
  {"sub", lax_sub, IN_LAX, "sub(x, y)"},
  {"mul", lax_mul, IN_LAX, "mul(x, y)"},
  {"div", lax_div, IN_LAX, "div(x, y): rounds toward zero on integers"},
  {"rem", lax_rem, IN_LAX, "rem(x, y): sign of the dividend"},
  {"pow", lax_pow, IN_LAX, "pow(x, y)"},
  {"max", lax_max, IN_LAX, "max(x, y): elementwise"},
  {"min", lax_min, IN_LAX, "min(x, y): elementwise"},
  {"eq", lax_eq, IN_LAX, "eq(x, y)"},
  {"ne", lax_ne, IN_LAX, "ne(x, y)"},
  {"lt", lax_lt, IN_LAX, "lt(x, y)"},
  {"le", lax_le, IN_LAX, "le(x, y)"},
  {"gt", lax_gt, IN_LAX, "gt(x, y)"},
  {"ge", lax_ge, IN_LAX, "ge(x, y)"},
  {"neg", lax_neg, IN_LAX, "neg(x)"},
  {"erf_inv", lax_erf_inv, IN_LAX, "erf_inv(x): the inverse error function"},
  {"asin", lax_asin, IN_LAX, "asin(x)"},
  {"acos", lax_acos, IN_LAX, "acos(x)"},
  {"atan", lax_atan, IN_LAX, "atan(x)"},
  {"is_finite", lax_is_finite, IN_LAX, "is_finite(x)"},
  {"convert_element_type", lax_convert_element_type, IN_LAX, "convert_element_type(operand, new_dtype)"},
  {"broadcast_in_dim", lax_broadcast_in_dim, IN_LAX, "broadcast_in_dim(operand, shape, broadcast_dimensions)"},
  {"reshape", lax_reshape, IN_LAX, "reshape(operand, new_sizes)"},
  {"transpose", lax_transpose, IN_LAX, "transpose(operand, permutation)"},
  {"rev", lax_rev, IN_LAX, "rev(operand, dimensions)"},
  {"squeeze", lax_squeeze, IN_LAX, "squeeze(array, dimensions)"},
  {"expand_dims", lax_expand_dims, IN_LAX, "expand_dims(array, dimensions)"},
  {"pad", lax_pad, IN_LAX, "pad(operand, padding_value, padding_config)"},
  {"slice", lax_slice, IN_LAX, "slice(operand, start_indices, limit_indices, strides=None)"},
  {"iota", lax_iota, IN_LAX, "bi_iota(dtype, size)"},
  {"broadcasted_iota", lax_broadcasted_iota, IN_LAX, "broadcasted_iota(dtype, shape, dimension)"},
  {"concatenate", lax_concatenate, IN_LAX, "concatenate(operands, dimension)"},
  {"dot_general", lax_dot_general, IN_LAX, "dot_general(lhs, rhs, dimension_numbers, preferred_element_type=None)"},
  {"integer_pow", lax_integer_pow, IN_LAX, "integer_pow(x, y)"},
  {"select", lax_select, IN_LAX, "select(pred, on_true, on_false)"},
  {"clamp", lax_clamp, IN_LAX, "clamp(min, x, max)"},
  {NULL, NULL, 0, NULL},
};
