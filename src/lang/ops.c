/*
 * ops.c - the operators of the language as layers over the primitives,
 * and the helpers the jax.numpy layer (builtins_*.c) builds on.
 *
 * Everything here mirrors jax.numpy's own layering: an operator promotes
 * its operands' dtypes (dt_promote, with weak types) through
 * convert_element_type, broadcasts them with broadcast_in_dim, and applies
 * one jax.lax primitive, so a tracer sees the same plan JAX would record.
 * A weakly typed 0-d constant is not converted by a primitive: the
 * constant is simply made in the target dtype (JAX inlines it as a
 * literal, `mul x 3.0:f32[]`).  Indexing is in ops_index.c, attributes
 * in ops_attr.c (ops_impl.h).
 */
#define _GNU_SOURCE   /* memmem */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array/array.h"
#include "lang/builtins.h"
#include "lang/classes.h"
#include "base/error.h"
#include "lang/eval.h"
#include "base/intern.h"
#include "base/mem.h"
#include "base/utf8.h"
#include "lang/hostnp.h"
#include "lang/ops.h"
#include "lang/ops_impl.h"
#include "lang/iter.h"
#include "lang/stdmod.h"
#include "array/prim.h"
#include "array/print.h"


/* ======================================================================
 * Operand helpers
 * ====================================================================== */

bool ops_is_array(const Value *v) {
  return v && (v->type == V_ARRAY || v->type == V_TRACER);
}

int ops_aval(Value *v, AVal *out) { return prim_value_aval(v, out); }

/* prim_apply may overwrite an operand whose refcount is 1 with its result
 * (prim.h); helpers here often use an operand again, so every internal
 * application holds one more reference to each operand for the call. */
Value *ops_apply(PrimId id, int n, Value **in, const Params *p) {
  for (int i = 0; i < n; i++) val_incref(in[i]);
  Value *r = prim_apply(id, n, in, p);
  for (int i = 0; i < n; i++) val_decref(in[i]);
  return r;
}


/* Applies [id] with no parameters. */
Value *ops_apply_plain(PrimId id, int n, Value **in) {
  Params p;
  params_init(&p);
  return ops_apply(id, n, in, &p);
}

/* Applies [id] to one operand with [p], then releases [p]'s values. */
Value *ops_apply1(PrimId id, Value *x, Params *p) {
  Value *r = ops_apply(id, 1, &x, p);
  params_clear(p);
  return r;
}

Value *ops_convert(Value *x, DType t, bool weak) {
  AVal av;
  if (ops_aval(x, &av) < 0) return NULL;
  if (av.dtype == t && av.weak == weak) return val_incref(x);
  if (IS_ARRAY(x) && av.ndim == 0 && av.weak) {
    if (dt_is_int(av.dtype) && dt_is_int(t) && t != DT_BOOL && !dt_holds(t, arr_get_i64(AS_ARRAY(x), 0)))
      return ops_int_overflow(arr_get_i64(AS_ARRAY(x), 0), t);
    Array *a = AS_ARRAY(x);
    if (a->host && dt_is_float(av.dtype) && dt_is_float(t))   /* from its double, not its float32 */
      return (Value *)arr_scalar_f64(t, arr_host_f64(a), weak);
    return (Value *)arr_astype(a, t, weak);
  }
  Params p;
  params_init(&p);
  params_add(&p, "new_dtype", dtype_value(t));
  params_add(&p, "weak_type", val_bool(weak));
  return ops_apply1(P_CONVERT_ELEMENT_TYPE, x, &p);
}

static bool same_shape(int na, const int64_t *a, int nb, const int64_t *b) {
  if (na != nb) return false;
  for (int i = 0; i < na; i++)
    if (a[i] != b[i]) return false;
  return true;
}

Value *ops_broadcast_to(Value *x, int ndim, const int64_t *shape) {
  AVal av;
  if (ops_aval(x, &av) < 0) return NULL;
  if (same_shape(av.ndim, av.shape, ndim, shape)) return val_incref(x);
  if (shape_size(ndim, shape) < 0) {
    char s[256];
    shape_str(s, sizeof s, ndim, shape);
    return err_set(ERR_MEMORY, "array of shape %s has too many elements", s);
  }
  int lead = ndim - av.ndim;
  bool ok = lead >= 0;
  for (int i = 0; ok && i < av.ndim; i++)
    ok = av.shape[i] == 1 || av.shape[i] == shape[lead + i];
  if (!ok) {
    char s1[256], s2[256];
    shape_str(s1, sizeof s1, av.ndim, av.shape);
    shape_str(s2, sizeof s2, ndim, shape);
    return err_set(ERR_VALUE, "Incompatible shapes for broadcasting: %s and requested shape %s", s1, s2);
  }
  int64_t dims[SHM_MAXDIM];
  for (int i = 0; i < av.ndim; i++) dims[i] = lead + i;
  Params p;
  params_init(&p);
  params_add(&p, "shape", val_int_tuple(ndim, shape));
  params_add(&p, "broadcast_dimensions", val_int_tuple(av.ndim, dims));
  return ops_apply1(P_BROADCAST_IN_DIM, x, &p);
}

/*
 * Promotes and broadcasts [n] (<= 8) operands: out[] receives new
 * references.  [force] >= 0 converts every operand to that dtype instead
 * of their promoted one (weak only when all operands are weak).  Rank-0
 * operands keep rank 0, as jax.numpy leaves scalars to lax.  Returns the
 * dtype through [*dt] (may be NULL).
 */
static int promote_n(int n, Value **args, Value **out, int force, DType *dt) {
  AVal av[8];
  DType t = DT_BOOL;
  bool weak = true;
  int ndim = 0;
  int64_t shape[SHM_MAXDIM], tmp[SHM_MAXDIM];
  for (int i = 0; i < n; i++) {
    if (ops_aval(args[i], &av[i]) < 0) return -1;
    if (i == 0) {
      t = av[0].dtype;
      weak = av[0].weak;
      ndim = av[0].ndim;
      memcpy(shape, av[0].shape, sizeof(int64_t) * (size_t)ndim);
      continue;
    }
    t = dt_promote(t, weak, av[i].dtype, av[i].weak, &weak);
    memcpy(tmp, shape, sizeof(int64_t) * (size_t)ndim);
    if (shape_broadcast(ndim, tmp, av[i].ndim, av[i].shape, &ndim, shape) < 0) return -1;
  }
  if (force >= 0) t = (DType)force;
  for (int i = 0; i < n; i++) {
    Value *c = ops_convert(args[i], t, weak);
    Value *b = c && av[i].ndim > 0 ? ops_broadcast_to(c, ndim, shape) : val_incref(c);
    val_decref(c);
    if (!b) {
      for (int j = 0; j < i; j++) val_decref(out[j]);
      return -1;
    }
    out[i] = b;
  }
  if (dt) *dt = t;
  return 0;
}

Value *ops_elementwise(PrimId id, int n, Value **args) {
  Value *in[8];
  if (n < 1 || n > 8) return err_set(ERR_VALUE, "%s: at most 8 operands", prim_table[id].name);
  if (promote_n(n, args, in, -1, NULL) < 0) return NULL;
  Value *r = ops_apply_plain(id, n, in);
  for (int i = 0; i < n; i++) val_decref(in[i]);
  return r;
}

/* The promoted dtype and weakness of two operands. */
static int result_type(Value *a, Value *b, DType *t, bool *weak) {
  AVal x, y;
  if (ops_aval(a, &x) < 0 || ops_aval(b, &y) < 0) return -1;
  *t = dt_promote(x.dtype, x.weak, y.dtype, y.weak, weak);
  return 0;
}

Value *ops_unary_prim(PrimId id, Value *x) {
  return ops_apply_plain(id, 1, &x);
}

/* A 0-d constant of [x]'s dtype and weakness (jnp's _constant_like). */
static Value *const_like(Value *x, double v) {
  AVal av;
  if (ops_aval(x, &av) < 0) return NULL;
  if (dt_is_float(av.dtype)) return (Value *)arr_scalar_f64(av.dtype, v, av.weak);
  return (Value *)arr_scalar_i64(av.dtype, (int64_t)v, av.weak);
}

/* Binary primitive [id] of [a] and the constant [v] (shaped like a). */
Value *ops_with_const(PrimId id, Value *a, double v) {
  Value *c = const_like(a, v);
  if (!c) return NULL;
  Value *in[2] = {a, c};
  Value *r = ops_apply_plain(id, 2, in);
  val_decref(c);
  return r;
}

Value *ops_select(Value *pred, Value *on_true, Value *on_false) {
  AVal pa;
  if (ops_aval(pred, &pa) < 0) return NULL;
  Value *args[2] = {on_false, on_true}, *in[2];
  if (promote_n(2, args, in, -1, NULL) < 0) return NULL;
  AVal xa;
  ops_aval(in[0], &xa);
  AVal ya;
  ops_aval(in[1], &ya);
  int ndim = pa.ndim;
  int64_t shape[SHM_MAXDIM];
  memcpy(shape, pa.shape, sizeof(int64_t) * (size_t)ndim);
  Value *r = NULL, *p = NULL;
  if (shape_broadcast(ndim, shape, xa.ndim, xa.shape, &ndim, shape) < 0 ||
      shape_broadcast(ndim, shape, ya.ndim, ya.shape, &ndim, shape) < 0)
    goto done;
  Value *pb = pa.dtype == DT_BOOL ? val_incref(pred) : NULL;
  if (!pb) {
    Value *zero = const_like(pred, 0);
    Value *in2[2] = {pred, zero};
    pb = zero ? ops_apply_plain(P_NE, 2, in2) : NULL;
    val_decref(zero);
  }
  p = pb ? ops_broadcast_to(pb, ndim, shape) : NULL;
  val_decref(pb);
  if (!p) goto done;
  Value *ops3[3] = {p, NULL, NULL};
  ops3[1] = ops_broadcast_to(in[0], ndim, shape);
  ops3[2] = ops3[1] ? ops_broadcast_to(in[1], ndim, shape) : NULL;
  if (ops3[2]) r = ops_apply_plain(P_SELECT_N, 3, ops3);
  val_decref(ops3[1]);
  val_decref(ops3[2]);
done:
  val_decref(p);
  val_decref(in[0]);
  val_decref(in[1]);
  return r;
}

/* ======================================================================
 * Binary operators
 * ====================================================================== */

/* An operand's type as operator errors name it: a jit tracer stands for
 * an array, so the message is the eager one. */
static const char *operand_type_name(Value *v) {
  return v->type == V_TRACER ? "Array" : val_type_name(v);
}

static void *unsupported(OpKind op, Value *a, Value *b) {
  return err_set(ERR_TYPE, "unsupported operand type(s) for %s: '%s' and '%s'",
                 op_symbol(op), operand_type_name(a), operand_type_name(b));
}

/* jnp.true_divide: integer and bool operands become the default float. */
static Value *true_divide(Value *a, Value *b) {
  DType t;
  bool weak;
  if (result_type(a, b, &t, &weak) < 0) return NULL;
  Value *args[2] = {a, b}, *in[2];
  if (promote_n(2, args, in, (int)dt_float_of(t), NULL) < 0) return NULL;
  Value *r = ops_apply_plain(P_DIV, 2, in);
  val_decref(in[0]);
  val_decref(in[1]);
  return r;
}

/* Operands promoted for an arithmetic op; bools are an error for some. */
static int promote_pair(Value *a, Value *b, Value **in, DType *t) {
  Value *args[2] = {a, b};
  return promote_n(2, args, in, -1, t);
}

/* jnp.floor_divide: lax.div corrected toward minus infinity. */
static Value *floor_divide(Value *a, Value *b) {
  Value *in[2];
  DType t;
  if (promote_pair(a, b, in, &t) < 0) return NULL;
  Value *r = NULL, *q = NULL, *rem = NULL, *fix = NULL, *alt = NULL;
  if (t == DT_BOOL) {
    r = ops_apply_plain(P_AND, 2, in);
    goto done;
  }
  rem = ops_apply_plain(P_REM, 2, in);
  if (!rem) goto done;
  if (dt_is_int(t) && (q = ops_apply_plain(P_DIV, 2, in))) {
    /* (sign(a) != sign(b)) & (rem != 0): the quotient was rounded up. */
    Value *sa = ops_unary_prim(P_SIGN, in[0]), *sb = ops_unary_prim(P_SIGN, in[1]);
    Value *sab[2] = {sa, sb};
    Value *ne1 = sa && sb ? ops_elementwise(P_NE, 2, sab) : NULL;
    Value *ne2 = ops_with_const(P_NE, rem, 0);
    Value *both[2] = {ne1, ne2};
    fix = ne1 && ne2 ? ops_elementwise(P_AND, 2, both) : NULL;
    val_decref(sa); val_decref(sb); val_decref(ne1); val_decref(ne2);
    alt = fix ? ops_with_const(P_SUB, q, 1) : NULL;
    if (alt) r = ops_select(fix, alt, q);
  } else if (!dt_is_int(t)) {
    /* Python's float floor division: (a - mod) / b, rounded. */
    Value *mod = NULL, *d = NULL;
    Value *am[2] = {in[0], rem};
    Value *diff = ops_apply_plain(P_SUB, 2, am);
    Value *db[2] = {diff, in[1]};
    d = diff ? ops_apply_plain(P_DIV, 2, db) : NULL;
    val_decref(diff);
    Value *rn = ops_with_const(P_NE, rem, 0);
    Value *zb = ops_with_const(P_LT, in[1], 0), *zr = ops_with_const(P_LT, rem, 0);
    Value *zz[2] = {zb, zr};
    Value *sgn = zb && zr ? ops_apply_plain(P_NE, 2, zz) : NULL;
    Value *cc[2] = {rn, sgn};
    fix = rn && sgn ? ops_apply_plain(P_AND, 2, cc) : NULL;
    val_decref(rn); val_decref(zb); val_decref(zr); val_decref(sgn);
    alt = d && fix ? ops_with_const(P_SUB, d, 1) : NULL;
    mod = alt ? ops_select(fix, alt, d) : NULL;
    if (mod) {
      Params p;
      params_init(&p);
      params_add(&p, "rounding_method", val_int(0));
      r = ops_apply1(P_ROUND, mod, &p);
    }
    val_decref(mod);
    val_decref(d);
  }
done:
  val_decref(q); val_decref(rem); val_decref(fix); val_decref(alt);
  val_decref(in[0]); val_decref(in[1]);
  return r;
}

/* jnp.remainder: the result has the sign of the divisor. */
static Value *py_remainder(Value *a, Value *b) {
  Value *in[2];
  DType t;
  if (promote_pair(a, b, in, &t) < 0) return NULL;
  Value *r = NULL;
  Value *m = ops_apply_plain(P_REM, 2, in);
  Value *nz = m ? ops_with_const(P_NE, m, 0) : NULL;
  Value *lm = m ? ops_with_const(P_LT, m, 0) : NULL;
  Value *lb = ops_with_const(P_LT, in[1], 0);
  Value *l2[2] = {lm, lb};
  Value *diff = lm && lb ? ops_apply_plain(P_NE, 2, l2) : NULL;
  Value *c2[2] = {diff, nz};
  Value *fix = diff && nz ? ops_apply_plain(P_AND, 2, c2) : NULL;
  Value *mb[2] = {m, in[1]};
  Value *alt = fix ? ops_apply_plain(P_ADD, 2, mb) : NULL;
  if (alt) r = ops_select(fix, alt, m);
  val_decref(m); val_decref(nz); val_decref(lm); val_decref(lb);
  val_decref(diff); val_decref(fix); val_decref(alt);
  val_decref(in[0]); val_decref(in[1]);
  return r;
}

/* A Python int literal: a weakly typed 0-d integer array. */
static bool is_int_literal(Value *v, int64_t *out) {
  if (!IS_ARRAY(v)) return false;
  Array *a = AS_ARRAY(v);
  if (a->ndim != 0 || !a->weak || !dt_is_int(a->dtype)) return false;
  *out = arr_get_i64(a, 0);
  return true;
}

/* jnp.power: integer_pow for a literal integer exponent, else pow. */
static Value *power(Value *a, Value *b) {
  int64_t y;
  if (is_int_literal(b, &y) && y >= -(1 << 20) && y <= (1 << 20)) {
    AVal av;
    if (ops_aval(a, &av) < 0) return NULL;
    if (!dt_is_float(av.dtype) && y < 0)
      return err_set(ERR_VALUE, "Integers to negative integer powers are not allowed.");
    /* bools become what promotion with the weak int exponent gives (a weak
     * i32), as x ** y with a traced y does under jit */
    Value *x = av.dtype == DT_BOOL ? ops_convert(a, DT_I32, true) : val_incref(a);
    if (!x) return NULL;
    Params p;
    params_init(&p);
    params_add(&p, "y", val_int(y));
    Value *r = ops_apply1(P_INTEGER_POW, x, &p);
    val_decref(x);
    return r;
  }
  return ops_elementwise(P_POW, 2, (Value *[]){a, b});
}

/* The error for an operator whose operands promote to a dtype its
 * primitive does not take. It names the primitive and the dtype, never the
 * operands' kinds, so an array and a jit tracer give the same message. */
static void *bad_operand_dtype(const char *prim, DType t, const char *accepted) {
  return err_set(ERR_TYPE, "%s does not accept dtype %s. Accepted dtypes are subtypes of %s.",
                 prim, dt_name(t), accepted);
}

/* &, |, ^: the primitive checks the promoted dtype (integer or bool). */
static Value *bitwise(PrimId id, Value *a, Value *b) {
  return ops_elementwise(id, 2, (Value *[]){a, b});
}

/* 2 ** [e] (f32 exponents) as i64: exact for e in [0, 62]. */
static Value *pow2_i64(Value *e) {
  Value *two = (Value *)arr_scalar_f64(DT_F32, 2.0, false);
  Value *pf = two ? ops_elementwise(P_POW, 2, (Value *[]){two, e}) : NULL;
  Value *p = pf ? ops_convert(pf, DT_I64, false) : NULL;
  val_decref(two);
  val_decref(pf);
  return p;
}

/* x << y as x * 2**y, x >> y as floor(x / 2**y), computed in int64 and
 * wrapped back to the operands' dtype: prim.def has no shift primitives.
 * Shift counts outside [0, bits) give 0, or -1 for >> of a negative x, as
 * XLA's shifts do. */
static Value *shift(OpKind op, Value *a, Value *b) {
  DType t;
  bool weak;
  if (result_type(a, b, &t, &weak) < 0) return NULL;
  if (t == DT_BOOL) t = DT_I32;   /* jnp's shifts promote bools to numbers (to_numeric_dtype) */
  if (!dt_is_int(t))
    return bad_operand_dtype(op == OP_LSHIFT ? "shift_left" : "shift_right_arithmetic", t,
                             "integer");
  int bits = (int)dt_size(t) * 8;
  Value *x = ops_convert(a, DT_I64, false), *y = x ? ops_convert(b, DT_I64, false) : NULL;
  /* in two steps of 2**(y/2) and 2**(y - y/2): 2**63 is no int64 (it
   * saturated, so an i64 << 63 was x * (2**63 - 1)) */
  Value *yf = y ? ops_convert(b, DT_F32, false) : NULL;
  Value *half = yf ? ops_with_const(P_MUL, yf, 0.5) : NULL;
  Value *ya = half ? ops_unary_prim(P_FLOOR, half) : NULL;
  Value *yb = ya ? ops_elementwise(P_SUB, 2, (Value *[]){yf, ya}) : NULL;
  Value *pa = yb ? pow2_i64(ya) : NULL, *pb = pa ? pow2_i64(yb) : NULL, *r1 = NULL;
  if (pb) r1 = op == OP_LSHIFT ? ops_elementwise(P_MUL, 2, (Value *[]){x, pa}) : floor_divide(x, pa);
  Value *r64 = NULL, *lo = NULL, *hi = NULL, *bad = NULL, *fill = NULL, *sel = NULL, *r = NULL;
  if (r1) r64 = op == OP_LSHIFT ? ops_elementwise(P_MUL, 2, (Value *[]){r1, pb}) : floor_divide(r1, pb);
  val_decref(half); val_decref(ya); val_decref(yb); val_decref(pa); val_decref(pb); val_decref(r1);
  if (r64) lo = ops_with_const(P_LT, y, 0);
  if (lo) hi = ops_with_const(P_GE, y, bits);
  if (hi) bad = ops_elementwise(P_OR, 2, (Value *[]){lo, hi});
  if (bad) {
    Value *zero = (Value *)arr_scalar_i64(DT_I64, 0, false);
    Value *neg = zero && op == OP_RSHIFT ? ops_with_const(P_LT, x, 0) : NULL;
    Value *m1 = neg ? (Value *)arr_scalar_i64(DT_I64, -1, false) : NULL;
    fill = op == OP_RSHIFT ? (m1 ? ops_select(neg, m1, zero) : NULL) : val_incref(zero);
    val_decref(zero);
    val_decref(neg);
    val_decref(m1);
  }
  if (fill) sel = ops_select(bad, fill, r64);
  if (sel) r = ops_convert(sel, t, weak);
  val_decref(x); val_decref(y); val_decref(yf); val_decref(r64); val_decref(lo); val_decref(hi); val_decref(bad);
  val_decref(fill); val_decref(sel);
  return r;
}

/* Concatenation of two tuples or lists (same type). */
static Value *seq_concat(Value *a, Value *b) {
  size_t na, nb;
  Value *const *ia, *const *ib;
  val_seq(a, &na, &ia);
  val_seq(b, &nb, &ib);
  if (a->type == V_TUPLE) {
    Value *t = tuple_new(na + nb);
    if (!t) return NULL;
    for (size_t i = 0; i < na; i++) tuple_set_steal(t, i, val_incref(ia[i]));
    for (size_t i = 0; i < nb; i++) tuple_set_steal(t, na + i, val_incref(ib[i]));
    return t;
  }
  Value *l = list_new(na + nb);
  for (size_t i = 0; l && i < na + nb; i++)
    if (list_append(l, i < na ? ia[i] : ib[i - na]) < 0) {
      val_decref(l);
      return err_nomem();
    }
  return l;
}

/* str/tuple/list repeated [n] times. */
static Value *seq_repeat(Value *s, int64_t n) {
  if (n < 0) n = 0;
  if (s->type == V_STR) {
    size_t len = ((Str *)s)->len;
    if (len && (size_t)n > ((size_t)1 << 30) / len) return err_set(ERR_MEMORY, "repeated string is too long");
    char *buf = shm_malloc(len * (size_t)n + 1);
    if (!buf) return err_nomem();
    /* by doubling: a gigabyte of "ab" is thirty copies, not 5*10^8 */
    size_t total = len * (size_t)n, done = total ? len : 0;
    if (total) memcpy(buf, str_cstr(s), len);
    for (; done < total; done *= 2) memcpy(buf + done, buf, done < total - done ? done : total - done);
    Value *r = str_new(buf, len * (size_t)n);
    shm_free(buf);
    return r;
  }
  size_t len;
  Value *const *items;
  val_seq(s, &len, &items);
  if (len && (size_t)n > ((size_t)1 << 28) / len) return err_set(ERR_MEMORY, "repeated sequence is too long");
  size_t total = len * (size_t)n;
  if (s->type == V_TUPLE) {
    Value *t = tuple_new(total);
    for (size_t i = 0; t && i < total; i++) tuple_set_steal(t, i, val_incref(items[i % len]));
    return t;
  }
  Value *l = list_new(total);
  for (size_t i = 0; l && i < total; i++)
    if (list_append(l, items[i % len]) < 0) {
      val_decref(l);
      return err_nomem();
    }
  return l;
}

bool ops_is_seq(const Value *v) { return v->type == V_TUPLE || v->type == V_LIST; }

/* Operators on non-array values: str/tuple/list + and *. */
static Value *binary_python(OpKind op, Value *a, Value *b) {
  int64_t n;
  if (op == OP_ADD && a->type == V_STR && b->type == V_STR) {
    size_t la = ((Str *)a)->len, lb = ((Str *)b)->len;
    char *buf = shm_malloc(la + lb + 1);
    if (!buf) return err_nomem();
    memcpy(buf, str_cstr(a), la);
    memcpy(buf + la, str_cstr(b), lb);
    Value *r = str_new(buf, la + lb);
    shm_free(buf);
    return r;
  }
  if (stdmod_is_deque(a) || stdmod_is_deque(b)) return stdmod_deque_binary(op, a, b);
  if (val_is_set(a) && val_is_set(b) && op != OP_ADD) {
    Value *r = builtins_set_binary(op, a, b);
    if (r || err_occurred()) return r;
  }
  if (op == OP_ADD && ops_is_seq(a) && a->type == b->type) return seq_concat(a, b);
  if (a->type == V_DICT && b->type == V_DICT && ((Dict *)a)->kind == DICT_COUNTER &&
      ((Dict *)b)->kind == DICT_COUNTER)
    return stdmod_counter_binary(op, a, b);
  if (op == OP_MUL && (a->type == V_STR || ops_is_seq(a)) && is_int_literal(b, &n))
    return seq_repeat(a, n);
  if (op == OP_MUL && (b->type == V_STR || ops_is_seq(b)) && is_int_literal(a, &n))
    return seq_repeat(b, n);
  if (op == OP_MOD && a->type == V_STR) return ops_percent_format(a, b);
  return unsupported(op, a, b);
}

/*
 * The last step of an operator: like ops_elementwise, but an operand the
 * caller passed unconverted reaches prim_apply with the caller's own
 * reference count, so a temporary the evaluator is about to drop can be
 * reused as the result (`x * y + z` writes into the buffer of `x * y`).
 */
/* True when [a] and [b] need neither promotion nor broadcasting: the hot
 * path of eager code (`a + b` on like arrays, `x * 2.` on a weak scalar of
 * the same dtype). */
static bool already_alike(Value *a, Value *b) {
  if (a->type != V_ARRAY || b->type != V_ARRAY) return false;
  Array *x = AS_ARRAY(a), *y = AS_ARRAY(b);
  if (x->dtype != y->dtype || x->weak != y->weak) return false;
  if (x->ndim == 0 || y->ndim == 0) return true;
  if (x->ndim != y->ndim) return false;
  for (int i = 0; i < x->ndim; i++)   /* a loop: memcmp's call costs more on a few dims */
    if (x->shape[i] != y->shape[i]) return false;
  return true;
}

static Value *elementwise_last(PrimId id, Value *a, Value *b) {
  if (already_alike(a, b)) return prim_apply_binary(id, a, b, 0);
  Value *args[2] = {a, b}, *in[2];
  if (promote_n(2, args, in, -1, NULL) < 0) return NULL;
  bool own[2];
  for (int i = 0; i < 2; i++) {
    own[i] = in[i] != args[i];
    if (!own[i]) val_decref(in[i]);  /* the caller still holds it */
  }
  Params p;
  params_init(&p);
  Value *r = prim_apply(id, 2, in, &p);
  for (int i = 0; i < 2; i++)
    if (own[i]) val_decref(in[i]);
  return r;
}

/* ==== Python numbers ===================================================== */

/* A Python int, float or bool: a 0-d array marked host (array.h), as
 * literals, len() and range() make them.  Arithmetic between two of them
 * follows Python, as it does in JAX before the numbers meet an array:
 * ints are exact (64 bits here; past that an OverflowError, never a
 * wrapped value), floats are doubles, division by zero is a
 * ZeroDivisionError, never inf or 0, and comparisons give a Python bool.
 * Semantics: Python's numeric types; JAX leaves Python scalars to Python. */
/* A Python int, or a bool as 0 or 1 (Python's bool is an int). */
static bool py_int(Value *v, int64_t *x) {
  if (!arr_is_host(v)) return false;
  Array *a = AS_ARRAY(v);
  if (a->ndim != 0 || !(dt_is_int(a->dtype) || a->dtype == DT_BOOL)) return false;
  *x = arr_get_i64(a, 0);
  return true;
}

/* A Python float, or an int or bool converted to one. */
static bool py_number(Value *v, double *x) {
  if (!arr_is_host(v)) return false;
  Array *a = AS_ARRAY(v);
  if (a->ndim != 0) return false;
  *x = arr_host_f64(a);
  return true;
}

static Value *int_overflow(OpKind op) {
  return err_set(ERR_OVERFLOW, "Python int too large: the result of %s exceeds 64 bits",
                 op_symbol(op));
}

/* x ** y for ints, y >= 0, exactly or an overflow. */
static bool int_pow(int64_t x, int64_t y, int64_t *out) {
  int64_t r = 1;
  while (y > 0) {
    if ((y & 1) && __builtin_mul_overflow(r, x, &r)) return false;
    y >>= 1;
    if (y && __builtin_mul_overflow(x, x, &x)) return false;
  }
  *out = r;
  return true;
}

/* Python's // and % of ints (b != 0): rounded toward minus infinity. */
static int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

/* [op] of Python ints [x] and [y]: a new int, a float for / and negative
 * powers, or NULL with the error set.  *handled is false for operators
 * that are not arithmetic (comparisons), left to the caller. */
static Value *int_op(OpKind op, int64_t x, int64_t y, bool *handled) {
  int64_t r;
  bool ok = true;
  *handled = true;
  switch (op) {
  case OP_ADD: ok = !__builtin_add_overflow(x, y, &r); break;
  case OP_SUB: ok = !__builtin_sub_overflow(x, y, &r); break;
  case OP_MUL: ok = !__builtin_mul_overflow(x, y, &r); break;
  case OP_FLOORDIV:
  case OP_MOD:
    if (y == 0) return err_set(ERR_ZERO_DIVISION, "integer division or modulo by zero");
    if (x == INT64_MIN && y == -1) return op == OP_MOD ? val_int(0) : int_overflow(op);
    r = floor_div(x, y);
    if (op == OP_MOD) r = x - r * y;
    break;
  case OP_DIV:
    if (y == 0) return err_set(ERR_ZERO_DIVISION, "division by zero");
    return arr_python_float((double)x / (double)y);
  case OP_POW:
    if (y < 0) {
      if (x == 0) return err_set(ERR_ZERO_DIVISION, "0.0 cannot be raised to a negative power");
      return arr_python_float(pow((double)x, (double)y));
    }
    ok = int_pow(x, y, &r);
    break;
  case OP_LSHIFT:
    if (y < 0) return err_set(ERR_VALUE, "negative shift count");
    ok = y < 63 && x == ((x << y) >> y);
    r = ok ? x << y : 0;
    break;
  case OP_RSHIFT:
    if (y < 0) return err_set(ERR_VALUE, "negative shift count");
    r = y >= 63 ? (x < 0 ? -1 : 0) : x >> y;
    break;
  case OP_BITAND: r = x & y; break;
  case OP_BITOR: r = x | y; break;
  case OP_BITXOR: r = x ^ y; break;
  default:
    *handled = false;
    return NULL;
  }
  return ok ? val_int(r) : int_overflow(op);
}

/* The ZeroDivisionError of Python float division by zero, or 0. */
static int float_zero_division(OpKind op, double y) {
  if (y != 0.0) return 0;
  if (op == OP_DIV) return err_set(ERR_ZERO_DIVISION, "float division by zero"), -1;
  if (op == OP_FLOORDIV) return err_set(ERR_ZERO_DIVISION, "float floor division by zero"), -1;
  if (op == OP_MOD) return err_set(ERR_ZERO_DIVISION, "float modulo"), -1;
  return 0;
}

/* Python's divmod of floats (y != 0), as CPython's float_divmod computes
 * it: the remainder takes the divisor's sign, the quotient is exact when
 * it can be. */
static void float_divmod(double x, double y, double *q, double *m) {
  double mod = fmod(x, y);
  double div = (x - mod) / y;
  if (mod != 0) {
    if ((y < 0) != (mod < 0)) {
      mod += y;
      div -= 1.0;
    }
  } else {
    mod = copysign(0.0, y);
  }
  double fl;
  if (div != 0) {
    fl = floor(div);
    if (div - fl > 0.5) fl += 1.0;
  } else {
    fl = copysign(0.0, x / y);
  }
  *q = fl;
  *m = mod;
}

/* Python's float ** float: an error where Python's answer is not a float. */
static Value *float_pow(double x, double y) {
  if (x == 0 && y < 0) return err_set(ERR_ZERO_DIVISION, "0.0 cannot be raised to a negative power");
  if (x < 0 && isfinite(x) && isfinite(y) && y != floor(y))
    return err_set(ERR_VALUE, "a negative number raised to a fractional power is complex, "
                   "which Python numbers here cannot be");
  double r = pow(x, y);
  if (isinf(r) && isfinite(x) && isfinite(y))
    return err_set(ERR_OVERFLOW, "(34, 'Numerical result out of range')");
  return arr_python_float(r);
}

/* [op] of Python floats (either of them maybe an int) in double
 * precision; *handled false for operators that are not arithmetic. */
static Value *float_op(OpKind op, double x, double y, bool *handled) {
  double q, m;
  *handled = true;
  if (float_zero_division(op, y) < 0) return NULL;
  switch (op) {
  case OP_ADD: return arr_python_float(x + y);
  case OP_SUB: return arr_python_float(x - y);
  case OP_MUL: return arr_python_float(x * y);
  case OP_DIV: return arr_python_float(x / y);
  case OP_FLOORDIV: float_divmod(x, y, &q, &m); return arr_python_float(q);
  case OP_MOD: float_divmod(x, y, &q, &m); return arr_python_float(m);
  case OP_POW: return float_pow(x, y);
  default:
    *handled = false;
    return NULL;
  }
}

/* Python's comparison of two numbers (bools as 0 and 1): a Python bool;
 * *handled false for operators that are not comparisons. */
static Value *number_compare(OpKind op, Value *a, Value *b, bool *handled) {
  Array *x = AS_ARRAY(a), *y = AS_ARRAY(b);
  int c;
  *handled = true;
  if (!dt_is_float(x->dtype) && !dt_is_float(y->dtype)) {
    int64_t i = arr_get_i64(x, 0), j = arr_get_i64(y, 0);
    c = i < j ? -1 : i > j;
  } else {
    double u = arr_host_f64(x), v = arr_host_f64(y);
    if (isnan(u) || isnan(v)) return val_bool(op == OP_NE);
    c = u < v ? -1 : u > v;
  }
  switch (op) {
  case OP_EQ: return val_bool(c == 0);
  case OP_NE: return val_bool(c != 0);
  case OP_LT: return val_bool(c < 0);
  case OP_LE: return val_bool(c <= 0);
  case OP_GT: return val_bool(c > 0);
  case OP_GE: return val_bool(c >= 0);
  default:
    *handled = false;
    return NULL;
  }
}

/* Arithmetic [op] of two Python numbers, done as Python does it (bools
 * are the ints 0 and 1, and & | ^ of two bools a bool); *handled false
 * when either is not one or the operator is left to the caller
 * (comparisons: ops_compare; matmul: the array path). */
static Value *python_number_op(OpKind op, Value *a, Value *b, bool *handled) {
  int64_t x, y;
  double fx, fy;
  *handled = false;
  if (!arr_is_host(a) || !arr_is_host(b)) return NULL;
  bool bools = AS_ARRAY(a)->dtype == DT_BOOL && AS_ARRAY(b)->dtype == DT_BOOL;
  if (bools && (op == OP_BITAND || op == OP_BITOR || op == OP_BITXOR)) {
    *handled = true;
    bool p = val_truth(a) > 0, q = val_truth(b) > 0;
    return val_bool(op == OP_BITAND ? p && q : op == OP_BITOR ? p || q : p != q);
  }
  if (py_int(a, &x) && py_int(b, &y)) return int_op(op, x, y, handled);
  if (py_number(a, &fx) && py_number(b, &fy)) return float_op(op, fx, fy, handled);
  return NULL;
}

/* -x and ~x of a Python int or bool (as 0 or 1), -x of a Python float,
 * as Python; *handled false otherwise (arrays take the array path). */
static Value *python_unary(OpKind op, Value *v, bool *handled) {
  int64_t x;
  double f;
  *handled = false;
  if (op != OP_NEG && op != OP_INVERT) return NULL;
  if (py_int(v, &x)) {
    *handled = true;
    if (op == OP_INVERT) return val_int(~x);
    return x == INT64_MIN ? int_overflow(op) : val_int(-x);
  }
  if (op == OP_NEG && py_number(v, &f)) {
    *handled = true;
    return arr_python_float(-f);
  }
  return NULL;
}

/* a op b with a NumPy array among two arrays: the operands promoted as
 * NumPy does (hostnp_promote), then the operator as for any arrays.
 * NULL when nothing changes: the caller goes on. */
static Value *np_binary(OpKind op, Value *a, Value *b, bool *done) {
  Value *x = a, *y = b;
  *done = true;
  if (hostnp_promote(op, &x, &y) < 0) return NULL;
  Value *r = NULL;
  if (x != a || y != b) r = ops_binary(op, x, y);
  else *done = false;
  val_decref(x);
  val_decref(y);
  return r;
}

/* a op b of a NumPy array and a Python number (or two NumPy arrays):
 * NumPy's result, a NumPy array (`t * 2`, `t > 0`, `x[0] + 1`), though
 * the number becomes an array on the way, which ARR_NP_AUTO would take
 * for a jax.Array's. */
static Value *np_numbers_binary(OpKind op, Value *a, Value *b) {
  arr_np_mode = ARR_NP_HOST;
  Value *r = ops_binary(op, a, b);
  arr_np_mode = ARR_NP_AUTO;
  return r;
}

Value *ops_binary(OpKind op, Value *a, Value *b) {
  if (!ops_is_array(a) || !ops_is_array(b)) return binary_python(op, a, b);
  if (arr_np_is_live() && (arr_is_np(a) || arr_is_np(b)) && a->type == V_ARRAY && b->type == V_ARRAY) {
    bool done;
    Value *r = np_binary(op, a, b, &done);
    if (done) return r;
    if (arr_np_mode == ARR_NP_AUTO && (arr_is_np(a) || arr_is_host(a)) && (arr_is_np(b) || arr_is_host(b)))
      return np_numbers_binary(op, a, b);
  }
  if (arr_is_host(a) && arr_is_host(b)) {
    bool handled;
    Value *r = python_number_op(op, a, b, &handled);
    if (handled) return r;
  }
  switch (op) {
  case OP_ADD: return elementwise_last(P_ADD, a, b);
  case OP_SUB: return elementwise_last(P_SUB, a, b);
  case OP_MUL: return elementwise_last(P_MUL, a, b);
  case OP_DIV: return true_divide(a, b);
  case OP_FLOORDIV: return floor_divide(a, b);
  case OP_MOD: return py_remainder(a, b);
  case OP_POW: return power(a, b);
  case OP_MATMUL: return ops_matmul(a, b);
  case OP_BITAND: return bitwise(P_AND, a, b);
  case OP_BITOR: return bitwise(P_OR, a, b);
  case OP_BITXOR: return bitwise(P_XOR, a, b);
  case OP_LSHIFT: case OP_RSHIFT: return shift(op, a, b);
  default:
    return ops_compare(op, a, b);
  }
}

/* The primitive of an operator that elementwise_last applies; -1 if none. */
static int last_prim(OpKind op) {
  switch (op) {
  case OP_ADD: return P_ADD;
  case OP_SUB: return P_SUB;
  case OP_MUL: return P_MUL;
  default: return -1;
  }
}

Value *ops_binary_kept(OpKind op, Value *a, Value *b, unsigned kept) {
  int id = last_prim(op);
  if (id >= 0 && already_alike(a, b) && !(arr_is_host(a) && arr_is_host(b)))
    return prim_apply_binary((PrimId)id, a, b, kept);
  if (kept & 1u) val_incref(a);
  if (kept & 2u) val_incref(b);
  Value *r = ops_binary(op, a, b);
  if (kept & 1u) val_decref(a);
  if (kept & 2u) val_decref(b);
  return r;
}

static PrimId compare_prim(OpKind op);

/* The primitive that [op] applies to two arrays of dtype [t] that agree
 * (nothing promoted, not two Python numbers), for ops_binary_into; -1
 * if none: + - * (elementwise_last), / of floats (true_divide's; ints
 * give a float quotient), the comparisons (ops_compare's). */
static int into_prim(OpKind op, DType t) {
  int id = last_prim(op);   /* first: a loop's arithmetic takes one test */
  if (id >= 0) return id;
  if (op == OP_DIV) return dt_is_float(t) ? P_DIV : -1;
  bool cmp = op == OP_EQ || op == OP_NE || op == OP_LT || op == OP_LE || op == OP_GT ||
             op == OP_GE;
  return cmp ? (int)compare_prim(op) : -1;
}

bool ops_binary_into(OpKind op, Value *a, Value *b, Value *dst) {
  if (a->type != V_ARRAY || b->type != V_ARRAY) return false;
  const Array *x = AS_ARRAY(a), *y = AS_ARRAY(b);   /* already_alike's dtype, shape: prim's */
  int id = into_prim(op, x->dtype);
  return id >= 0 && x->weak == y->weak && !(x->host && y->host) &&
         prim_binary_into((PrimId)id, a, b, dst);
}

Value *ops_unary(OpKind op, Value *a) {
  if (op == OP_NOT) {
    int t = val_truth(a);
    return t < 0 ? NULL : val_bool(!t);
  }
  if (!ops_is_array(a))
    return err_set(ERR_TYPE, "bad operand type for unary %s: '%s'", op_symbol(op), val_type_name(a));
  bool handled;
  Value *r = python_unary(op, a, &handled);
  if (handled) return r;
  AVal av;
  if (ops_aval(a, &av) < 0) return NULL;
  switch (op) {
  case OP_POS: return val_incref(a);
  case OP_NEG:
    if (av.dtype == DT_BOOL)
      return err_set(ERR_TYPE, "The numpy boolean negative, the `-` operator, is not supported, use the `~` operator or the logical_not function instead.");
    return ops_unary_prim(P_NEG, a);
  case OP_INVERT:
    if (dt_is_float(av.dtype))
      return err_set(ERR_TYPE, "ufunc 'invert' not supported for the input types");
    return ops_unary_prim(P_NOT, a);
  default:
    return err_set(ERR_TYPE, "bad unary operator");
  }
}

/* ======================================================================
 * Comparisons
 * ====================================================================== */

static PrimId compare_prim(OpKind op) {
  switch (op) {
  case OP_EQ: return P_EQ;
  case OP_NE: return P_NE;
  case OP_LT: return P_LT;
  case OP_LE: return P_LE;
  case OP_GT: return P_GT;
  default: return P_GE;
  }
}

/* Python ordering of strings and sequences: <0, 0, >0 in [*cmp]. */
static int python_order(Value *a, Value *b, int *cmp);

static int seq_order(Value *a, Value *b, int *cmp) {
  size_t na, nb;
  Value *const *ia, *const *ib;
  val_seq(a, &na, &ia);
  val_seq(b, &nb, &ib);
  for (size_t i = 0; i < na && i < nb; i++) {
    if (val_equal_key(ia[i], ib[i])) continue;
    return python_order(ia[i], ib[i], cmp);
  }
  *cmp = na < nb ? -1 : na > nb;
  return 0;
}

static int python_order(Value *a, Value *b, int *cmp) {
  if (a->type == V_STR && b->type == V_STR) {
    /* UTF-8's byte order is its code points' order, Python's order of
     * strings; lengths break ties, so an embedded NUL compares too. */
    size_t na = ((Str *)a)->len, nb = ((Str *)b)->len;
    int c = memcmp(str_cstr(a), str_cstr(b), na < nb ? na : nb);
    *cmp = c ? (c < 0 ? -1 : 1) : na < nb ? -1 : na > nb;
    return 0;
  }
  if (ops_is_seq(a) && a->type == b->type) return seq_order(a, b, cmp);
  if (IS_ARRAY(a) && IS_ARRAY(b) && AS_ARRAY(a)->size == 1 && AS_ARRAY(b)->size == 1) {
    double x, y;
    arr_to_double(a, &x);
    arr_to_double(b, &y);
    *cmp = x < y ? -1 : x > y;
    return 0;
  }
  err_set(ERR_TYPE, "'<' not supported between instances of '%s' and '%s'", val_type_name(a), val_type_name(b));
  return -1;
}

static int py_equal(Value *a, Value *b, int depth);

/* `x in it` for a lazy iterator: pulls items until one equals x (they
 * are consumed, as in Python), polling Ctrl-C, since it may never end. */
static Value *contains_lazy(Value *item, Value *it) {
  Value *x;
  while ((x = iter_next(it))) {
    int eq = x == item ? 1 : py_equal(x, item, 0);
    val_decref(x);
    if (eq) return eq < 0 ? NULL : val_bool(true);
    if (shm_interrupt_pending()) return err_set(ERR_INTERRUPT, "interrupted");
  }
  return err_occurred() ? NULL : val_bool(false);
}

/* `x in container`. */
static Value *contains(Value *item, Value *c) {
  if (iter_is(c)) return contains_lazy(item, c);
  if (c->type == V_DICT) return val_bool(dict_get(c, item) != NULL);
  if (c->type == V_STR) {
    if (item->type != V_STR)
      return err_set(ERR_TYPE, "'in <string>' requires string as left operand, not %s", val_type_name(item));
    /* memmem, not strstr: a string may hold '\0' */
    size_t m = ((Str *)item)->len;
    return val_bool(!m || memmem(str_cstr(c), ((Str *)c)->len, str_cstr(item), m) != NULL);
  }
  if (c->type == V_RANGE) {
    int64_t x;
    if (!IS_ARRAY(item) || !dt_is_int(AS_ARRAY(item)->dtype) || arr_to_index(item, &x) < 0) {
      err_clear();
      return val_bool(false);
    }
    Range *r = (Range *)c;
    int64_t n = range_len(c);
    bool in = r->step > 0 ? x >= r->start && x < r->stop : x <= r->start && x > r->stop;
    return val_bool(n > 0 && in && (x - r->start) % r->step == 0);
  }
  if (ops_is_seq(c)) {
    size_t n;
    Value *const *items;
    val_seq(c, &n, &items);
    for (size_t i = 0; i < n; i++) {
      if (items[i] == item) return val_bool(true);
      if (ops_is_array(items[i]) && ops_is_array(item)) {
        Value *eq = ops_compare(OP_EQ, items[i], item);
        int t = eq ? val_truth(eq) : -1;
        val_decref(eq);
        if (t < 0) return NULL;
        if (t) return val_bool(true);
      } else {
        int eq = py_equal(items[i], item, 0);
        if (eq < 0) return NULL;
        if (eq) return val_bool(true);
      }
    }
    return val_bool(false);
  }
  if (ops_is_array(c)) {
    Value *eq = ops_compare(OP_EQ, c, item);
    if (!eq) return NULL;
    AVal av;
    ops_aval(eq, &av);
    Params p;
    params_init(&p);
    int64_t axes[SHM_MAXDIM];
    for (int i = 0; i < av.ndim; i++) axes[i] = i;
    params_add(&p, "axes", val_int_tuple(av.ndim, axes));
    Value *r = ops_apply1(P_REDUCE_OR, eq, &p);
    val_decref(eq);
    return r;
  }
  return err_set(ERR_TYPE, "argument of type '%s' is not iterable", val_type_name(c));
}

/* Nesting deeper than this is an error in ==, as Python's RecursionError
 * (a list nested a million deep must not overflow the stack). */
#define EQUAL_MAX_DEPTH 1000

/* Python's == for non-arrays: lists and tuples item by item, dicts by
 * keys and values, everything else as dict keys compare.  1 equal, 0 not,
 * -1 with the error set (nested deeper than EQUAL_MAX_DEPTH). */
static int py_equal(Value *a, Value *b, int depth) {
  if (a == b) return 1;
  if (depth > EQUAL_MAX_DEPTH)
    return err_set(ERR_VALUE, "maximum recursion depth exceeded in comparison"), -1;
  if ((a->type == V_DTYPE && b->type == V_STR) || (a->type == V_STR && b->type == V_DTYPE)) {
    /* NumPy: x.dtype == 'float32' */
    Value *d = a->type == V_DTYPE ? a : b, *s = a->type == V_STR ? a : b;
    DType t;
    return dt_parse(str_cstr(s), &t) && t == ((DTypeVal *)d)->dtype;
  }
  if (ops_is_seq(a) || ops_is_seq(b)) {
    size_t na, nb;
    Value *const *ia, *const *ib;
    if (a->type != b->type || stdmod_is_deque(a) != stdmod_is_deque(b)) return 0;   /* deque([1]) != [1] */
    val_seq(a, &na, &ia);
    val_seq(b, &nb, &ib);
    if (na != nb) return 0;
    for (size_t i = 0; i < na; i++) {
      int eq = py_equal(ia[i], ib[i], depth + 1);
      if (eq != 1) return eq;
    }
    return 1;
  }
  if (a->type == V_SLICE && b->type == V_SLICE) {   /* Python: (start, stop, step) compared */
    Slice *sa = (Slice *)a, *sb = (Slice *)b;
    int eq = py_equal(sa->start, sb->start, depth + 1);
    if (eq == 1) eq = py_equal(sa->stop, sb->stop, depth + 1);
    return eq == 1 ? py_equal(sa->step, sb->step, depth + 1) : eq;
  }
  if (a->type == V_DICT && b->type == V_DICT) {
    Dict *da = (Dict *)a;
    if (da->len != ((Dict *)b)->len || val_is_set(a) != val_is_set(b)) return 0;   /* {} != set() */
    if (da->kind == DICT_ORDERED && ((Dict *)b)->kind == DICT_ORDERED)   /* two of them mind the order */
      for (size_t i = 0; i < da->len; i++) {
        int eq = py_equal(da->keys[i], ((Dict *)b)->keys[i], depth + 1);
        if (eq != 1) return eq;
      }
    for (size_t i = 0; i < da->len; i++) {
      Value *v = dict_get(b, da->keys[i]);
      int eq = v ? py_equal(da->vals[i], v, depth + 1) : 0;
      if (eq != 1) return eq;
    }
    return 1;
  }
  if (a->type == V_OPAQUE || b->type == V_OPAQUE) {   /* instances of classes: __eq__ */
    int eq = cls_equal(a, b);
    if (eq != CLS_NOT_MINE) return eq;
  }
  int hooked = ops_equal_hook(a, b);
  return hooked >= 0 ? hooked : val_equal_key(a, b);
}

Value *ops_compare(OpKind op, Value *a, Value *b) {
  switch (op) {
  case OP_IS: return val_bool(a == b);
  case OP_IS_NOT: return val_bool(a != b);
  case OP_IN: return contains(a, b);
  case OP_NOT_IN: {
    Value *r = contains(a, b);
    if (!r) return NULL;
    int t = val_truth(r);
    val_decref(r);
    return t < 0 ? NULL : val_bool(!t);
  }
  default: break;
  }
  if (arr_is_host(a) && arr_is_host(b)) {
    bool handled;
    Value *r = number_compare(op, a, b, &handled);
    if (handled) return r;
  }
  if (arr_np_is_live() && arr_np_mode == ARR_NP_AUTO && a->type == V_ARRAY && b->type == V_ARRAY &&
      (arr_is_np(a) || arr_is_np(b)) && (arr_is_np(a) || arr_is_host(a)) && (arr_is_np(b) || arr_is_host(b)))
    return np_numbers_binary(op, a, b);
  if (ops_is_array(a) && ops_is_array(b)) return elementwise_last(compare_prim(op), a, b);
  if (op == OP_EQ || op == OP_NE) {
    int eq = py_equal(a, b, 0);
    return eq < 0 ? NULL : val_bool(op == OP_EQ ? eq : !eq);
  }
  if (val_is_set(a) && val_is_set(b)) return builtins_set_binary(op, a, b);   /* subsets */
  int cmp;
  if (python_order(a, b, &cmp) < 0) {
    err_clear();
    return err_set(ERR_TYPE, "'%s' not supported between instances of '%s' and '%s'",
                   op_symbol(op), val_type_name(a), val_type_name(b));
  }
  bool r = op == OP_LT ? cmp < 0 : op == OP_LE ? cmp <= 0 : op == OP_GT ? cmp > 0 : cmp >= 0;
  return val_bool(r);
}

/* ======================================================================
 * Matmul, reshape, transpose, reductions
 * ====================================================================== */

/* Builds dot_general's dimension_numbers (((lc,), (rc,)), ((lb...), (rb...))). */
static Value *dimension_numbers(int nc, const int64_t *lc, const int64_t *rc,
                                int nb, const int64_t *lb, const int64_t *rb) {
  return val_dot_dimension_numbers(nc, lc, rc, nb, lb, rb);
}

/* The out_sharding= of the jnp or lax call this thread is computing
 * (NULL: none), which the dot_general and reshape it makes carry. */
static _Thread_local Value *out_sharding_given;

Value *ops_out_sharding_enter(Value *sh) {
  Value *prev = out_sharding_given;
  out_sharding_given = sh && sh != VAL_NONE ? sh : NULL;
  return prev;
}

void ops_out_sharding_leave(Value *prev) { out_sharding_given = prev; }

/* Explicit mode's rules read it (prim.h, Sharding): the result's layout
 * is the caller's, so an ambiguous one is not an error. */
void ops_add_out_sharding(Params *p) {
  if (out_sharding_given) params_add(p, "out_sharding", val_incref(out_sharding_given));
}

Value *ops_dot_general(Value *a, Value *b, int nc, const int64_t *lc, const int64_t *rc,
                       int nb, const int64_t *lb, const int64_t *rb, int preferred) {
  Value *in[2] = {NULL, NULL};
  DType t;
  bool weak;
  if (result_type(a, b, &t, &weak) < 0) return NULL;
  in[0] = ops_convert(a, t, weak);
  in[1] = in[0] ? ops_convert(b, t, weak) : NULL;
  if (!in[1]) {
    val_decref(in[0]);
    return NULL;
  }
  Params p;
  params_init(&p);
  params_add(&p, "dimension_numbers", dimension_numbers(nc, lc, rc, nb, lb, rb));
  params_add(&p, "preferred_element_type",
             val_incref(dtype_value(preferred >= 0 ? (DType)preferred : t)));
  ops_add_out_sharding(&p);
  Value *r = ops_apply(P_DOT_GENERAL, 2, in, &p);
  params_clear(&p);
  val_decref(in[0]);
  val_decref(in[1]);
  return r;
}

Value *ops_matmul(Value *a, Value *b) {
  AVal x, y;
  if (ops_aval(a, &x) < 0 || ops_aval(b, &y) < 0) return NULL;
  if (x.ndim == 0 || y.ndim == 0)
    return err_set(ERR_VALUE, "matmul input operand %d must have ndim at least 1, but it has ndim 0",
                   x.ndim == 0 ? 0 : 1);
  int64_t kx = x.shape[x.ndim - 1], ky = y.shape[y.ndim == 1 ? 0 : y.ndim - 2];
  if (kx != ky) {
    char s1[256], s2[256];
    shape_str(s1, sizeof s1, x.ndim, x.shape);
    shape_str(s2, sizeof s2, y.ndim, y.shape);
    return err_set(ERR_VALUE, "matmul: Input operand 1 has a mismatch in its core dimension 0 "
                   "(size %lld is different from %lld); shapes %s and %s",
                   (long long)ky, (long long)kx, s1, s2);
  }
  int64_t lc = x.ndim - 1, rc = y.ndim == 1 ? 0 : y.ndim - 2;
  if (x.ndim <= 2 && y.ndim <= 2)
    return ops_dot_general(a, b, 1, &lc, &rc, 0, NULL, NULL, -1);
  if (x.ndim == 1 || y.ndim == 1)
    return ops_dot_general(a, b, 1, &lc, &rc, 0, NULL, NULL, -1);
  /* Batched: broadcast the leading dims of both, then batch over them. */
  int nbx = x.ndim - 2, nby = y.ndim - 2, nb;
  int64_t batch[SHM_MAXDIM], sx[SHM_MAXDIM], sy[SHM_MAXDIM];
  if (shape_broadcast(nbx, x.shape, nby, y.shape, &nb, batch) < 0) return NULL;
  memcpy(sx, batch, sizeof(int64_t) * (size_t)nb);
  memcpy(sy, batch, sizeof(int64_t) * (size_t)nb);
  sx[nb] = x.shape[x.ndim - 2];
  sx[nb + 1] = x.shape[x.ndim - 1];
  sy[nb] = y.shape[y.ndim - 2];
  sy[nb + 1] = y.shape[y.ndim - 1];
  Value *ba = ops_broadcast_to(a, nb + 2, sx);
  Value *bb = ba ? ops_broadcast_to(b, nb + 2, sy) : NULL;
  Value *r = NULL;
  if (bb) {
    int64_t bd[SHM_MAXDIM];
    for (int i = 0; i < nb; i++) bd[i] = i;
    lc = nb + 1;
    rc = nb;
    r = ops_dot_general(ba, bb, 1, &lc, &rc, nb, bd, bd, -1);
  }
  val_decref(ba);
  val_decref(bb);
  return r;
}

Value *ops_reshape(Value *x, int ndim, const int64_t *shape) {
  AVal av;
  if (ops_aval(x, &av) < 0) return NULL;
  int64_t out[SHM_MAXDIM];
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < ndim; i++) {
    out[i] = shape[i];
    if (shape[i] == -1) {
      if (infer >= 0) return err_set(ERR_VALUE, "can only specify one unknown dimension");
      infer = i;
    } else if (shape[i] < 0) {
      return err_set(ERR_VALUE, "negative dimensions not allowed");
    } else if (__builtin_mul_overflow(known, shape[i], &known)) {
      return err_set(ERR_VALUE, "reshape: the new shape has too many elements");
    }
  }
  int64_t size = shape_size(av.ndim, av.shape);
  if (infer >= 0) {
    if (known == 0 || size % known != 0) goto bad;
    out[infer] = size / known;
    known = size;
  }
  if (known != size) goto bad;
  if (same_shape(av.ndim, av.shape, ndim, out)) return val_incref(x);
  Params p;
  params_init(&p);
  params_add(&p, "new_sizes", val_int_tuple(ndim, out));
  params_add(&p, "dimensions", VAL_NONE);
  ops_add_out_sharding(&p);
  return ops_apply1(P_RESHAPE, x, &p);
bad: {
  char s[256];
  shape_str(s, sizeof s, ndim, shape);
  return err_set(ERR_VALUE, "cannot reshape array of size %lld into shape %s", (long long)size, s);
}
}

Value *ops_transpose(Value *x, int ndim, const int *perm) {
  int64_t p64[SHM_MAXDIM];
  bool ident = true;
  for (int i = 0; i < ndim; i++) {
    p64[i] = perm[i];
    ident = ident && perm[i] == i;
  }
  if (ident) return val_incref(x);
  Params p;
  params_init(&p);
  params_add(&p, "permutation", val_int_tuple(ndim, p64));
  return ops_apply1(P_TRANSPOSE, x, &p);
}

Value *ops_expand_dims(Value *x, int n, const int64_t *dims) {
  if (n == 0) return val_incref(x);
  Params p;
  params_init(&p);
  params_add(&p, "dimensions", val_int_tuple(n, dims));
  return ops_apply1(P_EXPAND_DIMS, x, &p);
}

Value *ops_squeeze(Value *x, int n, const int64_t *dims) {
  if (n == 0) return val_incref(x);
  Params p;
  params_init(&p);
  params_add(&p, "dimensions", val_int_tuple(n, dims));
  return ops_apply1(P_SQUEEZE, x, &p);
}

Value *(*ops_named_reduce_hook)(PrimId kind, Value *x, Value *names, int64_t *size);
Value *(*ops_named_shape_hook)(Value *x);

Value *(*ops_array_attr_hook)(Value *x, const char *name);

bool (*ops_index_hook)(const Value *v, int64_t *out);

Value *ops_named_reduce(PrimId kind, Value *x, Value *names, int64_t *size) {
  if (!ops_named_reduce_hook)
    return err_set(ERR_NAME, "unbound axis name: %s", str_cstr(tuple_get(names, 0)));
  return ops_named_reduce_hook(kind, x, names, size);
}

int ops_split_named_axes(Value *axis, Value **pos, Value **names) {
  *names = NULL;
  *pos = axis;
  if (!axis) return 0;
  size_t n = 1;
  Value *const *items = &axis;
  if (axis->type != V_STR && !(ops_is_seq(axis) && val_seq(axis, &n, &items))) return 0;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (items[i]->type != V_STR) continue;
    k++;
    for (size_t j = 0; j < i; j++)   /* a name twice would reduce twice */
      if (items[j]->type == V_STR && !strcmp(str_cstr(items[i]), str_cstr(items[j])))
        return err_set(ERR_VALUE, "repeated axis name: %s", str_cstr(items[i])), -1;
  }
  if (k == 0) return 0;
  Value *nm = tuple_new(k), *ps = tuple_new(n - k);
  if (!nm || !ps) {
    if (nm) val_decref(nm);
    if (ps) val_decref(ps);
    return -1;
  }
  for (size_t i = 0, a = 0, b = 0; i < n; i++)
    tuple_set_steal(items[i]->type == V_STR ? nm : ps, items[i]->type == V_STR ? a++ : b++,
                    val_incref(items[i]));
  *names = nm;
  *pos = ps;
  return 0;
}

int ops_axes_arg(Value *axis, int ndim, int *naxes, int *axes) {
  if (!axis || axis == VAL_NONE) {
    *naxes = ndim;
    for (int i = 0; i < ndim; i++) axes[i] = i;
    return 0;
  }
  size_t n = 1;
  Value *const *items = &axis;
  if (ops_is_seq(axis)) val_seq(axis, &n, &items);
  if (n > SHM_MAXDIM) {
    err_set(ERR_VALUE, "too many axes");
    return -1;
  }
  bool seen[SHM_MAXDIM] = {false};
  for (size_t i = 0; i < n; i++) {
    int64_t v;
    if (!IS_ARRAY(items[i]) || !dt_is_int(AS_ARRAY(items[i])->dtype) ||
        arr_to_index(items[i], &v) < 0) {
      err_clear();
      err_set(ERR_TYPE, "'%s' object cannot be interpreted as an integer axis", val_type_name(items[i]));
      return -1;
    }
    if (axis_normalize(v, ndim, &axes[i]) < 0) return -1;
    if (seen[axes[i]]) {
      err_set(ERR_VALUE, "repeated axis");
      return -1;
    }
    seen[axes[i]] = true;
  }
  *naxes = (int)n;
  return 0;
}

Value *ops_reduce(PrimId id, Value *x, int naxes, const int *axes, bool keepdims) {
  int64_t a64[SHM_MAXDIM];
  int sorted[SHM_MAXDIM];
  memcpy(sorted, axes, sizeof(int) * (size_t)naxes);
  for (int i = 1; i < naxes; i++)
    for (int j = i; j > 0 && sorted[j - 1] > sorted[j]; j--) {
      int t = sorted[j];
      sorted[j] = sorted[j - 1];
      sorted[j - 1] = t;
    }
  for (int i = 0; i < naxes; i++) a64[i] = sorted[i];
  Params p;
  params_init(&p);
  params_add(&p, "axes", val_int_tuple(naxes, a64));
  if (id == P_ARGMAX || id == P_ARGMIN) params_add(&p, "index_dtype", dtype_value(DT_I32));
  Value *r = ops_apply1(id, x, &p);
  if (!r || !keepdims) return r;
  Value *k = ops_expand_dims(r, naxes, a64);
  val_decref(r);
  return k;
}

/* ======================================================================
 * Conversion to arrays (jnp.asarray)
 * ====================================================================== */

/* Shape and dtype of a nested list: fills shape[] the first time a depth is
 * reached and checks later elements against it. */
typedef struct NestInfo {
  int ndim;            /* -1 until the first leaf fixes it */
  int64_t shape[SHM_MAXDIM];
  DType dtype;
  bool weak, any, tracer;
  const Array *wide;   /* a Python int past int32 among the leaves */
} NestInfo;

/* Whether [v] is a Python int that int32 cannot hold (a weak int64,
 * arr_python_int). */
static bool wide_python_int(const Value *v) {
  if (!arr_is_host(v)) return false;
  const Array *h = (const Array *)v;
  return dt_is_int(h->dtype) && !dt_holds(DT_I32, arr_get_i64(h, 0));
}

Value *ops_int_overflow(int64_t x, DType t) {
  return err_set(ERR_OVERFLOW, "Python int %lld too large to convert to %s", (long long)x,
                 dt_name(t));
}

int ops_check_python_int(const Value *v) {
  if (!wide_python_int(v)) return 0;
  ops_int_overflow(arr_get_i64((const Array *)v, 0), DT_I32);
  return -1;
}

int ops_float_to_int(double d, int64_t *out) {
  if (!isfinite(d))
    return err_set(isnan(d) ? ERR_VALUE : ERR_OVERFLOW, "cannot convert float %s to integer",
                   isnan(d) ? "NaN" : "infinity"), -1;
  if (fabs(d) >= 9.2e18) return err_set(ERR_OVERFLOW, "integer too large"), -1;
  *out = (int64_t)d;
  return 0;
}

static int nest_scan(Value *v, int depth, NestInfo *ni);

static int nest_leaf(Value *v, int depth, NestInfo *ni) {
  AVal av;
  int64_t id;
  if (!ops_is_array(v) && ops_index_hook && ops_index_hook(v, &id)) {
    Value *n = val_int(id);   /* as the int it stands for */
    int rc = n ? nest_leaf(n, depth, ni) : -1;
    if (n) val_decref(n);
    return rc;
  }
  if (!ops_is_array(v)) {
    err_set(ERR_TYPE, "cannot convert '%s' to an array", val_type_name(v));
    return -1;
  }
  if (ops_aval(v, &av) < 0) return -1;
  if (v->type == V_TRACER) ni->tracer = true;
  if (wide_python_int(v)) ni->wide = (const Array *)v;
  int nd = depth + av.ndim;
  if (nd > SHM_MAXDIM) {
    err_set(ERR_VALUE, "array nested too deeply");
    return -1;
  }
  if (ni->ndim < 0) {
    ni->ndim = nd;
    memcpy(ni->shape + depth, av.shape, sizeof(int64_t) * (size_t)av.ndim);
  } else if (nd != ni->ndim || memcmp(ni->shape + depth, av.shape, sizeof(int64_t) * (size_t)av.ndim)) {
    goto ragged;
  }
  if (!ni->any) {
    ni->dtype = av.dtype;
    ni->weak = av.weak;
    ni->any = true;
  } else {
    bool w;
    ni->dtype = dt_promote(ni->dtype, ni->weak, av.dtype, av.weak, &w);
    ni->weak = w;
  }
  return 0;
ragged:
  err_set(ERR_VALUE, "setting an array element with a sequence. The requested array has an "
          "inhomogeneous shape after %d dimensions.", depth);
  return -1;
}

static int nest_scan(Value *v, int depth, NestInfo *ni) {
  if (!ops_is_seq(v)) return nest_leaf(v, depth, ni);
  size_t n;
  Value *const *items;
  val_seq(v, &n, &items);
  if (depth >= SHM_MAXDIM) {
    err_set(ERR_VALUE, "array nested too deeply");
    return -1;
  }
  if (ni->ndim >= 0 && (depth >= ni->ndim || ni->shape[depth] != (int64_t)n)) {
    err_set(ERR_VALUE, "setting an array element with a sequence. The requested array has an "
            "inhomogeneous shape after %d dimensions.", depth);
    return -1;
  }
  if (n == 0 && ni->ndim < 0) {
    ni->ndim = depth + 1;
    ni->shape[depth] = 0;
  }
  for (size_t i = 0; i < n; i++) {
    if (ni->ndim < 0 || depth < ni->ndim) {
      /* the first element fixes this depth's size */
      if (ni->ndim < 0) ni->shape[depth] = (int64_t)n;
    }
    if (nest_scan(items[i], depth + 1, ni) < 0) return -1;
    if (ni->shape[depth] != (int64_t)n) {
      err_set(ERR_VALUE, "setting an array element with a sequence. The requested array has an "
              "inhomogeneous shape after %d dimensions.", depth);
      return -1;
    }
  }
  return 0;
}

/* Writes the leaves of [v] into [out] (f64 or i64 by [ints]) at [*pos]. */
static void nest_fill(Value *v, bool ints, void *out, int64_t *pos) {
  if (ops_is_seq(v)) {
    size_t n;
    Value *const *items;
    val_seq(v, &n, &items);
    for (size_t i = 0; i < n; i++) nest_fill(items[i], ints, out, pos);
    return;
  }
  int64_t id;
  if (!ops_is_array(v) && ops_index_hook && ops_index_hook(v, &id)) {
    if (ints) ((int64_t *)out)[(*pos)++] = id;
    else ((double *)out)[(*pos)++] = (double)id;
    return;
  }
  Array *a = AS_ARRAY(v);
  bool exact = a->host && dt_is_float(a->dtype);   /* a Python float: its double */
  for (int64_t i = 0; i < a->size; i++) {
    if (ints) ((int64_t *)out)[(*pos)++] = arr_get_i64(a, i);
    else ((double *)out)[(*pos)++] = exact ? arr_host_f64(a) : arr_get_f64(a, i);
  }
}

/* Stacks the elements of a nested sequence with primitives (tracers). */
static Value *nest_stack(Value *v, DType t) {
  if (!ops_is_seq(v)) return ops_convert(v, t, false);
  size_t n;
  Value *const *items;
  val_seq(v, &n, &items);
  Value **parts = shm_calloc(n ? n : 1, sizeof(Value *));
  if (!parts) return err_nomem();
  Value *r = NULL;
  int64_t zero = 0;
  size_t i;
  for (i = 0; i < n; i++) {
    Value *e = nest_stack(items[i], t);
    parts[i] = e ? ops_expand_dims(e, 1, &zero) : NULL;
    val_decref(e);
    if (!parts[i]) break;
  }
  if (i == n) {
    Params p;
    params_init(&p);
    params_add(&p, "dimension", val_int(0));
    r = ops_apply(P_CONCATENATE, (int)n, parts, &p);
    params_clear(&p);
  }
  for (size_t j = 0; j < i; j++) val_decref(parts[j]);
  shm_free(parts);
  return r;
}

Value *ops_to_array(Value *v, int dtype) {
  if (!v) return err_set(ERR_TYPE, "cannot convert a missing value to an array");
  if (ops_is_array(v)) {
    if (dtype >= 0) return ops_convert(v, (DType)dtype, false);
    return ops_check_python_int(v) < 0 ? NULL : val_incref(v);
  }
  if (!ops_is_seq(v)) return err_set(ERR_TYPE, "cannot convert '%s' to an array", val_type_name(v));
  NestInfo ni = {.ndim = -1, .dtype = DT_F32};
  if (nest_scan(v, 0, &ni) < 0) return NULL;
  DType t = dtype >= 0 ? (DType)dtype : ni.any ? ni.dtype : DT_F32;
  /* [1, 2**40] has no int32 type; [1., 2**40] is float32, [x_i64, 2**40] int64 */
  if (dtype < 0 && ni.wide && ni.weak && dt_is_int(t))
    return ops_int_overflow(arr_get_i64(ni.wide, 0), DT_I32);
  if (ni.tracer) return nest_stack(v, t);
  bool ints = !dt_is_float(t) && (!ni.any || !dt_is_float(ni.dtype));
  Array *tmp = arr_new(ints ? DT_I64 : DT_F64, ni.ndim, ni.shape);
  if (!tmp) return NULL;
  int64_t pos = 0;
  nest_fill(v, ints, arr_data(tmp), &pos);
  Array *r = arr_astype(tmp, t, false);
  val_decref((Value *)tmp);
  return (Value *)r;
}

int ops_dtype_arg(Value *v, int *out) {
  if (!v || v == VAL_NONE) {
    *out = -1;
    return 0;
  }
  DType t;
  if (v->type == V_DTYPE) {
    *out = (int)((DTypeVal *)v)->dtype;
    return 0;
  }
  if (v->type == V_STR && dt_parse(str_cstr(v), &t)) {
    *out = (int)t;
    return 0;
  }
  if (v->type == V_BUILTIN) {
    const char *n = ((Builtin *)v)->name;
    if (!strcmp(n, "int")) { *out = DT_I32; return 0; }
    if (!strcmp(n, "float")) { *out = DT_F32; return 0; }
    if (!strcmp(n, "bool")) { *out = DT_BOOL; return 0; }
  }
  if (v->type == V_STR) err_set(ERR_TYPE, "data type '%s' not understood", str_cstr(v));
  else err_set(ERR_TYPE, "Cannot interpret '%s' as a data type", val_type_name(v));
  return -1;
}

int ops_shape_arg(Value *v, int *ndim, int64_t *shape) {
  size_t n = 1;
  Value *const *items = &v;
  if (ops_is_seq(v)) val_seq(v, &n, &items);
  if (n > SHM_MAXDIM) {
    err_set(ERR_VALUE, "maximum supported dimension for an array is %d, found %zu", SHM_MAXDIM, n);
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    if (!IS_ARRAY(items[i]) || !dt_is_int(AS_ARRAY(items[i])->dtype) ||
        arr_to_index(items[i], &shape[i]) < 0) {
      err_clear();
      err_set(ERR_TYPE, "'%s' object cannot be interpreted as an integer", val_type_name(items[i]));
      return -1;
    }
  }
  *ndim = (int)n;
  return 0;
}

/* ======================================================================
 * len and iteration
 * ====================================================================== */

int ops_len(Value *obj, int64_t *out) {
  switch (obj->type) {
  case V_STR: *out = (int64_t)str_nchars(obj); return 0;
  case V_TUPLE: *out = (int64_t)tuple_len(obj); return 0;
  case V_LIST: *out = (int64_t)list_len(obj); return 0;
  case V_DICT: *out = (int64_t)((Dict *)obj)->len; return 0;
  case V_RANGE: *out = range_len(obj); return 0;
  case V_ARRAY: case V_TRACER: {
    AVal av;
    if (ops_aval(obj, &av) < 0) return -1;
    if (av.ndim == 0) {
      err_set(ERR_TYPE, "len() of unsized object");
      return -1;
    }
    *out = av.shape[0];
    return 0;
  }
  default:
    err_set(ERR_TYPE, "object of type '%s' has no len()", val_type_name(obj));
    return -1;
  }
}

/* The characters of str [s] as a list of one-code-point strs, in one
 * pass (indexing each would scan non-ASCII text from its start). */
static Value *str_chars(Value *s) {
  const char *p = str_cstr(s);
  size_t n = ((Str *)s)->len;
  Value *l = list_new(str_nchars(s));
  for (size_t i = 0; l && i < n;) {
    size_t j = i + 1;   /* to the next lead byte, as str_nchars counts */
    while (j < n && !utf8_is_lead((unsigned char)p[j])) j++;
    Value *c = str_new(p + i, j - i);
    if (!c || list_append_steal(l, c) < 0) {
      val_decref(l);
      return NULL;
    }
    i = j;
  }
  return l;
}

Value *ops_iter_items(Value *obj) {
  int64_t n;
  if (iter_is(obj)) return iter_drain(obj);   /* what is left of a lazy iterator */
  if (obj->type == V_TUPLE || obj->type == V_LIST || obj->type == V_DICT) {
    size_t len;
    Value *const *items;
    if (obj->type == V_DICT) {
      len = ((Dict *)obj)->len;
      items = ((Dict *)obj)->keys;
    } else {
      val_seq(obj, &len, &items);
    }
    Value *l = list_new(len);
    for (size_t i = 0; l && i < len; i++)
      if (list_append(l, items[i]) < 0) {
        val_decref(l);
        return err_nomem();
      }
    return l;
  }
  if (cls_is_class(obj)) return cls_iter_items(obj);   /* an enum's members */
  if (obj->type != V_STR && obj->type != V_RANGE && !ops_is_array(obj))
    return err_set(ERR_TYPE, "'%s' object is not iterable", val_type_name(obj));
  if (arr_is_host(obj)) {   /* a Python number: Python's words, not an array's */
    DType t = AS_ARRAY(obj)->dtype;
    return err_set(ERR_TYPE, "'%s' object is not iterable", t == DT_BOOL ? "bool" : dt_is_float(t) ? "float" : "int");
  }
  if (ops_is_array(obj)) {
    AVal av;
    if (ops_aval(obj, &av) < 0) return NULL;
    if (av.ndim == 0) return err_set(ERR_TYPE, "iteration over a 0-d array");
  }
  if (obj->type == V_STR) return str_chars(obj);
  if (ops_len(obj, &n) < 0) return NULL;
  Value *l = list_new((size_t)n);
  for (int64_t i = 0; l && i < n; i++) {
    Value *iv = val_int(i);
    Value *e = iv ? ops_getitem(obj, iv) : NULL;
    val_decref(iv);
    if (!e || list_append_steal(l, e) < 0) {
      val_decref(l);
      return NULL;
    }
  }
  return l;
}
