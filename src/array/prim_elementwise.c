/*
 * prim_elementwise.c - the element-wise primitives, unary and binary
 * (neg ... copy, add ... ge, select_n, clamp): for each, side by side in
 * its row at the end of the file, the shape and dtype rule, the kernel
 * (kern_elementwise.c), the batching rule, the JVP and transpose rules and
 * its loop in fused plans.  Semantics: jax.lax's element-wise primitives
 * (jax/_src/lax/lax.py): their dtype classes, their JVPs and transposes;
 * operands already broadcast and promoted by the caller.
 */
#include "array/prim_rules.h"

/* ==== shape and dtype rules ================================================ */


/* ---- elementwise rules -------------------------------------------------------------- */

static int shape_unary(PrimId id, const AVal *in, const Params *p, AVal *out) {
  if (prim_check_dtype(id, in[0].dtype) < 0)
    return -1;
  prim_set(out, in[0].dtype, in[0].weak, in[0].ndim, in[0].shape);
  if (id == P_IS_FINITE) {
    out->dtype = DT_BOOL;
    out->weak = false;
  }
  return 0;
}

#define UNARY_RULE(NAME, ID)                                                   \
  static int NAME(const AVal *in, int nin, const Params *p, AVal *out) {     \
    return shape_unary(ID, in, p, out);                                      \
  }

static int shape_convert_element_type(const AVal *in, int nin, const Params *p, AVal *out) {
  DType t;
  bool weak = false;
  if (params_dtype(p, "new_dtype", &t) < 0)
    return -1;
  if (params_get(p, "weak_type") && params_bool(p, "weak_type", &weak) < 0)
    return -1;
  aval_copy(out, &in[0]);
  out->dtype = t;
  out->weak = weak;
  return 0;
}

static int shape_integer_pow(const AVal *in, int nin, const Params *p, AVal *out) {
  int64_t y;
  if (params_int(p, "y", &y) < 0 || shape_unary(P_INTEGER_POW, in, p, out) < 0)
    return -1;
  if (y < 0 && !dt_is_float(in[0].dtype)) {
    err_set(ERR_VALUE, "integer_pow: integers to negative powers are not allowed (y=%" PRId64 ")", y);
    return -1;
  }
  return 0;
}

static bool prim_is_compare(PrimId id) {
  return id == P_EQ || id == P_NE || id == P_LT || id == P_LE || id == P_GT || id == P_GE;
}

static int shape_binary(PrimId id, const AVal *in, int nin, AVal *out) {
  const AVal *s;
  if (prim_same_dtypes(id, in, 0, nin) < 0 || prim_check_dtype(id, in[0].dtype) < 0 ||
      prim_common_shape(id, in, nin, &s) < 0)
    return -1;
  bool cmp = prim_is_compare(id);
  prim_set(out, cmp ? DT_BOOL : in[0].dtype, cmp ? false : prim_all_weak(in, 0, nin),
           s->ndim, s->shape);
  return 0;
}

#define BINARY_RULE(NAME, ID)                                                  \
  static int NAME(const AVal *in, int nin, const Params *p, AVal *out) {     \
    return shape_binary(ID, in, nin, out);                                   \
  }

static int shape_select_n(const AVal *in, int nin, const Params *p, AVal *out) {
  const AVal *s;
  if (nin < 2) {
    err_set(ERR_TYPE, "select_n requires at least one case");
    return -1;
  }
  if (in[0].dtype != DT_BOOL && in[0].dtype != DT_I32) {
    err_set(ERR_TYPE, "select_n which must be boolean or int32, got %s", dt_name(in[0].dtype));
    return -1;
  }
  if (in[0].dtype == DT_BOOL && nin > 3) {
    err_set(ERR_TYPE, "select_n with a boolean predicate takes at most 2 cases, got %d", nin - 1);
    return -1;
  }
  if (prim_same_dtypes(P_SELECT_N, in, 1, nin) < 0 ||
      prim_common_shape(P_SELECT_N, in, nin, &s) < 0)
    return -1;
  prim_set(out, in[1].dtype, prim_all_weak(in, 1, nin), s->ndim, s->shape);
  return 0;
}

/* ==== JVP rules ============================================================ */

/* A unary rule: the tangent from the operand x, the result y, the
 * operand's tangent t (never zero here) and the parameters. */
typedef Value *(*Deriv)(Scope *s, Value *x, Value *y, Value *t, const Params *p);

static int jvp_unary(PrimId id, Deriv d, Value **x, Value **t, const Params *p, Value **yo,
                     Value **to) {
  if (primal(id, x, 1, p, yo) < 0) return -1;
  if (!t[0]) {
    *to = NULL;
    return 0;
  }
  Scope s = {0};
  return jvp_done(&s, d(&s, x[0], *yo, t[0], p), false, yo, to);
}

#define UNARY_JVP(name, ID, expr)                                                           \
  static Value *d_##name(Scope *s, Value *x, Value *y, Value *t, const Params *p) {          \
    (void)x, (void)y, (void)p;                                                               \
    return expr;                                                                             \
  }                                                                                          \
  static int jvp_##name(Value **x, Value **t, int nin, const Params *p, Value **yo,          \
                        Value **to) {                                                        \
    (void)nin;                                                                               \
    return jvp_unary(P_##ID, d_##name, x, t, p, yo, to);                                     \
  }

/* the linear ones first: their tangent is the primitive itself */
UNARY_JVP(neg, NEG, neg(s, t))
UNARY_JVP(copy, COPY, un(s, P_COPY, t))
UNARY_JVP(exp, EXP, mul(s, t, y))
UNARY_JVP(log, LOG, dvd(s, t, x))
UNARY_JVP(log1p, LOG1P, dvd(s, t, add(s, x, scal(s, 1.0, x))))
UNARY_JVP(expm1, EXPM1, mul(s, t, add(s, y, scal(s, 1.0, y))))
/* d erf(x) = 2/sqrt(pi) exp(-x^2) */
UNARY_JVP(erf, ERF, mul(s, t, mul(s, scal(s, 1.1283791670955126, x), un(s, P_EXP, neg(s, mul(s, x, x))))))
UNARY_JVP(tanh, TANH, mul(s, t, sub(s, scal(s, 1.0, y), mul(s, y, y))))
UNARY_JVP(logistic, LOGISTIC, mul(s, t, mul(s, y, sub(s, scal(s, 1.0, y), y))))
UNARY_JVP(sin, SIN, mul(s, t, un(s, P_COS, x)))
UNARY_JVP(cos, COS, neg(s, mul(s, t, un(s, P_SIN, x))))
UNARY_JVP(tan, TAN, mul(s, t, add(s, scal(s, 1.0, y), mul(s, y, y))))
UNARY_JVP(asin, ASIN, mul(s, t, un(s, P_RSQRT, sub(s, scal(s, 1.0, x), mul(s, x, x)))))
UNARY_JVP(acos, ACOS, neg(s, mul(s, t, un(s, P_RSQRT, sub(s, scal(s, 1.0, x), mul(s, x, x))))))
UNARY_JVP(atan, ATAN, dvd(s, t, add(s, scal(s, 1.0, x), mul(s, x, x))))
UNARY_JVP(sinh, SINH, mul(s, t, un(s, P_COSH, x)))
UNARY_JVP(cosh, COSH, mul(s, t, un(s, P_SINH, x)))
UNARY_JVP(sqrt, SQRT, dvd(s, t, mul(s, scal(s, 2.0, y), y)))
UNARY_JVP(rsqrt, RSQRT, mul(s, t, mul(s, scal(s, -0.5, y), dvd(s, y, x))))
/* d|x| = sign(x): 0 at 0, as JAX's (g * x / |x| with the 0 replaced) */
UNARY_JVP(abs, ABS, mul(s, t, un(s, P_SIGN, x)))

/* d x**n = n x**(n-1) */
static Value *d_integer_pow(Scope *s, Value *x, Value *y, Value *t, const Params *p) {
  (void)y;
  int64_t n;
  if (params_int(p, "y", &n) < 0) return NULL;
  if (n == 0) return like(s, 0.0, x);
  Value *xn1 = x;
  if (n - 1 != 1) {
    Params q;
    params_init(&q);
    params_add(&q, "y", val_int(n - 1));
    xn1 = n - 1 == 0 ? like(s, 1.0, x) : ap(s, P_INTEGER_POW, 1, &x, &q);
  }
  return mul(s, t, mul(s, scal(s, (double)n, x), xn1));
}
static int jvp_integer_pow(Value **x, Value **t, int nin, const Params *p, Value **yo,
                           Value **to) {
  (void)nin;
  return jvp_unary(P_INTEGER_POW, d_integer_pow, x, t, p, yo, to);
}

/* A float-to-float conversion carries the tangent; any other has none. */
static int jvp_convert_element_type(Value **x, Value **t, int nin, const Params *p, Value **yo,
                                    Value **to) {
  (void)nin;
  AVal a;
  DType nt;
  if (primal(P_CONVERT_ELEMENT_TYPE, x, 1, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0] || prim_value_aval(x[0], &a) < 0 || params_dtype(p, "new_dtype", &nt) < 0)
    return t[0] ? (err_clear(), 0) : 0;
  if (!dt_is_float(a.dtype) || !dt_is_float(nt)) return 0;
  Scope s = {0};
  return jvp_done(&s, same(&s, P_CONVERT_ELEMENT_TYPE, 1, t, p), false, yo, to);
}

/* A binary rule: the tangent from both operands, the result and the
 * operands' tangents (either may be NULL, not both). */
typedef Value *(*Deriv2)(Scope *s, Value *a, Value *b, Value *y, Value *ta, Value *tb);

static int jvp_binary(PrimId id, Deriv2 d, Value **x, Value **t, const Params *p, Value **yo,
                      Value **to) {
  if (primal(id, x, 2, p, yo) < 0) return -1;
  if (!t[0] && !t[1]) {
    *to = NULL;
    return 0;
  }
  Scope s = {0};
  return jvp_done(&s, d(&s, x[0], x[1], *yo, t[0], t[1]), false, yo, to);
}

#define BINARY_JVP(name, ID, expr)                                                          \
  static Value *d_##name(Scope *s, Value *a, Value *b, Value *y, Value *ta, Value *tb) {     \
    (void)a, (void)b, (void)y;                                                               \
    return expr;                                                                             \
  }                                                                                          \
  static int jvp_##name(Value **x, Value **t, int nin, const Params *p, Value **yo,          \
                        Value **to) {                                                        \
    (void)nin;                                                                               \
    return jvp_binary(P_##ID, d_##name, x, t, p, yo, to);                                    \
  }

/* ta·f_a + tb·f_b, skipping a zero tangent */
static Value *lin2(Scope *s, Value *ta, Value *fa, Value *tb, Value *fb) {
  Value *l = ta ? (fa ? mul(s, ta, fa) : ta) : NULL;
  Value *r = tb ? (fb ? mul(s, tb, fb) : tb) : NULL;
  return l && r ? add(s, l, r) : l ? l : r;
}

BINARY_JVP(add, ADD, lin2(s, ta, NULL, tb, NULL))
BINARY_JVP(sub, SUB, ta && tb ? sub(s, ta, tb) : ta ? ta : neg(s, tb))
BINARY_JVP(mul, MUL, lin2(s, ta, b, tb, a))
/* d(a/b) = ta/b - tb·y/b */
BINARY_JVP(div, DIV, ta && tb ? sub(s, dvd(s, ta, b), mul(s, tb, dvd(s, y, b)))
                     : ta ? dvd(s, ta, b) : neg(s, mul(s, tb, dvd(s, y, b))))
/* d rem(a, b) = ta - tb·trunc(a/b) */
static Value *trunc_div(Scope *s, Value *a, Value *b) {
  Value *q = dvd(s, a, b);
  return mul(s, un(s, P_SIGN, q), un(s, P_FLOOR, un(s, P_ABS, q)));
}
BINARY_JVP(rem, REM, lin2(s, ta, NULL, tb, tb ? neg(s, trunc_div(s, a, b)) : NULL))
/* d a**b = ta·b·a**(b-1) + tb·log(a)·y, log(a) taken as 0 where a == 0 */
static Value *pow_db(Scope *s, Value *a, Value *y) {
  Value *z = like(s, 0.0, a);
  Value *safe = select(s, bin(s, P_EQ, a, z), like(s, 1.0, a), a);
  return select(s, bin(s, P_EQ, a, z), z, mul(s, un(s, P_LOG, safe), y));
}
BINARY_JVP(pow, POW,
           lin2(s, ta, ta ? mul(s, b, bin(s, P_POW, a, sub(s, b, scal(s, 1.0, b)))) : NULL, tb,
                tb ? pow_db(s, a, y) : NULL))
/* max/min: the tangent of the operand chosen, halved on ties (JAX's
 * balanced rule) */
static Value *chosen(Scope *s, Value *x, Value *other, Value *y) {
  Value *one = like(s, 1.0, x), *zero = like(s, 0.0, x);
  Value *tie = select(s, bin(s, P_EQ, other, y), like(s, 0.5, x), one);
  return select(s, bin(s, P_EQ, x, y), tie, zero);
}
BINARY_JVP(max, MAX, lin2(s, ta, ta ? chosen(s, a, b, y) : NULL, tb, tb ? chosen(s, b, a, y) : NULL))
BINARY_JVP(min, MIN, lin2(s, ta, ta ? chosen(s, a, b, y) : NULL, tb, tb ? chosen(s, b, a, y) : NULL))
/* atan2(a, b): (ta·b - tb·a) / (a² + b²) */
static Value *atan2_den(Scope *s, Value *a, Value *b) { return add(s, mul(s, a, a), mul(s, b, b)); }
BINARY_JVP(atan2, ATAN2,
           lin2(s, ta, ta ? dvd(s, b, atan2_den(s, a, b)) : NULL, tb,
                tb ? neg(s, dvd(s, a, atan2_den(s, a, b))) : NULL))

/* select_n(which, *cases): the same selection of the cases' tangents */
static int jvp_select_n(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  if (primal(P_SELECT_N, x, nin, p, yo) < 0) return -1;
  bool any = false;
  for (int i = 1; i < nin; i++) any |= t[i] != NULL;
  *to = NULL;
  if (!any) return 0;
  Scope s = {0};
  Value *in[16];
  if (nin > 16) return jvp_done(&s, err_set(ERR_VALUE, "select_n: too many cases"), false, yo, to);
  in[0] = x[0];
  for (int i = 1; i < nin; i++) in[i] = tan_or_zero(&s, t[i], x[i]);
  return jvp_done(&s, ap(&s, P_SELECT_N, nin, in, NULL), false, yo, to);
}

/* clamp(lo, x, hi): x's tangent where lo < x < hi, lo's where x < lo, hi's
 * where x > hi (JAX's clamp rules) */
static int jvp_clamp(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  if (primal(P_CLAMP, x, nin, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0] && !t[1] && !t[2]) return 0;
  Scope s = {0};
  AVal lo, xa;
  if (prim_value_aval(x[0], &lo) < 0 || prim_value_aval(x[1], &xa) < 0)
    return jvp_done(&s, NULL, false, yo, to);
  if ((t[0] || t[2]) && lo.ndim != xa.ndim)
    return jvp_done(&s, err_set(ERR_NOT_IMPLEMENTED, "differentiation of 'clamp' with respect "
                                "to scalar bounds is not implemented"), false, yo, to);
  Value *zero = like(&s, 0.0, x[1]);
  Value *r = t[1] ? select(&s, bin(&s, P_AND, bin(&s, P_GT, x[1], x[0]), bin(&s, P_LT, x[1], x[2])),
                           t[1], zero) : NULL;
  if (t[0]) {
    Value *l = select(&s, bin(&s, P_LT, x[1], x[0]), t[0], zero);
    r = r ? add(&s, r, l) : l;
  }
  if (t[2]) {
    Value *h = select(&s, bin(&s, P_GT, x[1], x[2]), t[2], zero);
    r = r ? add(&s, r, h) : h;
  }
  return jvp_done(&s, r, false, yo, to);
}

/* ==== transpose rules ====================================================== */

static int tr_neg(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                  const Params *p, Value **cts) {
  (void)in, (void)av, (void)lin, (void)nin, (void)p;
  Scope s = {0};
  return ct_set(&s, cts, 0, neg(&s, ct[0]));
}

static int tr_copy(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                   const Params *p, Value **cts) {
  (void)in, (void)av, (void)lin, (void)nin, (void)p;
  cts[0] = val_incref(ct[0]);
  return 0;
}

static int tr_convert_element_type(Value **ct, Value **in, const AVal *av, const bool *lin,
                                   int nin, const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin, (void)p;
  Scope s = {0};
  return ct_set(&s, cts, 0, convert(&s, ct[0], av[0].dtype, av[0].weak));
}

static int tr_add(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                  const Params *p, Value **cts) {
  (void)in, (void)nin, (void)p;
  for (int i = 0; i < 2; i++) {
    Scope s = {0};
    cts[i] = NULL;
    if (lin[i] && ct_set(&s, cts, i, fit(&s, ct[0], &av[i])) < 0) return -1;
  }
  return 0;
}

static int tr_sub(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                  const Params *p, Value **cts) {
  (void)in, (void)nin, (void)p;
  Scope s = {0};
  if (lin[0] && ct_set(&s, cts, 0, fit(&s, ct[0], &av[0])) < 0) return -1;
  if (!lin[1]) return 0;
  return ct_set(&s, cts, 1, neg(&s, fit(&s, ct[0], &av[1])));
}

static int tr_mul(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                  const Params *p, Value **cts) {
  (void)nin, (void)p;
  if (lin[0] && lin[1]) return prim_rule_missing(P_MUL, "transpose (both operands linear)");
  int i = lin[0] ? 0 : 1;
  Scope s = {0};
  return ct_set(&s, cts, i, fit(&s, mul(&s, ct[0], in[1 - i]), &av[i]));
}

static int tr_div(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                  const Params *p, Value **cts) {
  (void)nin, (void)p;
  if (lin[1]) return prim_rule_missing(P_DIV, "transpose (linear denominator)");
  Scope s = {0};
  return ct_set(&s, cts, 0, fit(&s, dvd(&s, ct[0], in[1]), &av[0]));
}

/* select_n(which, *cases): each linear case gets the cotangent where it
 * was chosen, zeros elsewhere */
static int tr_select_n(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                       const Params *p, Value **cts) {
  (void)p;
  if (lin[0]) return prim_rule_missing(P_SELECT_N, "transpose (linear predicate)");
  Value *ops[16];
  if (nin > 16) return prim_rule_missing(P_SELECT_N, "transpose of more than 15 cases");
  for (int i = 1; i < nin; i++) {
    if (!lin[i]) continue;
    Scope s = {0};
    Value *z = like(&s, 0.0, ct[0]);
    ops[0] = in[0];
    for (int k = 1; k < nin; k++) ops[k] = k == i ? ct[0] : z;
    if (ct_set(&s, cts, i, fit(&s, ap(&s, P_SELECT_N, nin, ops, NULL), &av[i])) < 0) return -1;
  }
  return 0;
}

/* ==== loops in fused plans ================================================= */

/* The loops are compiled for AVX-512, AVX2 and baseline x86-64, picked at
 * load time as kern_elementwise.c's are (not under sanitizers, whose
 * runtimes are not ready when ifunc resolvers run). */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define FUSE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FUSE_CLONES
#endif

/* Vectorised as the eager kernels are (kern_elementwise.c, with the same
 * options, so both compute the same bits): at the file's -O2, GCC 12
 * leaves these loops scalar (a fused division ran at a quarter of the
 * eager kernel's speed).  Neither option changes an IEEE result. */
#pragma GCC push_options
#pragma GCC optimize("O3", "no-math-errno", "no-trapping-math")

#define FBIN(NAME, EXPR)                                                         \
  FUSE_CLONES static void NAME(float *restrict d, const float *restrict a,      \
                               bool va, const float *restrict b, bool vb,       \
                               int64_t n) {                                     \
    if (va && vb) {                                                             \
      _Pragma("GCC unroll 4")                                                   \
      for (int64_t i = 0; i < n; i++) {                                         \
        float x = a[i], y = b[i];                                               \
        d[i] = (EXPR);                                                          \
      }                                                                         \
    } else if (vb) {                                                            \
      float x = a[0];                                                           \
      _Pragma("GCC unroll 4")                                                   \
      for (int64_t i = 0; i < n; i++) {                                         \
        float y = b[i];                                                         \
        d[i] = (EXPR);                                                          \
      }                                                                         \
    } else if (va) {                                                            \
      float y = b[0];                                                           \
      _Pragma("GCC unroll 4")                                                   \
      for (int64_t i = 0; i < n; i++) {                                         \
        float x = a[i];                                                         \
        d[i] = (EXPR);                                                          \
      }                                                                         \
    } else {                                                                    \
      float x = a[0], y = b[0];                                                 \
      for (int64_t i = 0; i < n; i++) d[i] = (EXPR);                            \
    }                                                                           \
  }

FBIN(f_add, x + y)
FBIN(f_sub, x - y)
FBIN(f_mul, x * y)
FBIN(f_div, x / y)
FBIN(f_max, (x != x || x > y) ? x : y)
FBIN(f_min, (x != x || x < y) ? x : y)

#define FUN(NAME, EXPR)                                                          \
  FUSE_CLONES static void NAME(float *restrict d, const float *restrict a,      \
                               bool va, const float *b, bool vb, int64_t n) {   \
    (void)b, (void)vb;                                                          \
    if (va) {                                                                   \
      for (int64_t i = 0; i < n; i++) {                                         \
        float x = a[i];                                                         \
        d[i] = (EXPR);                                                          \
      }                                                                         \
    } else {                                                                    \
      float x = a[0];                                                           \
      for (int64_t i = 0; i < n; i++) d[i] = (EXPR);                            \
    }                                                                           \
  }

FUN(f_neg, -x)
FUN(f_abs, fabsf(x))
FUN(f_sqrt, sqrtf(x))
#pragma GCC pop_options

/* The vectorised transcendental routines (kern_elementwise.c) over a
 * possibly broadcast operand. */
#define FVEC(NAME, FN)                                                          \
  static void NAME(float *d, const float *a, bool va, const float *b, bool vb, \
                   int64_t n) {                                                 \
    (void)b, (void)vb;                                                          \
    if (va) {                                                                   \
      FN(a, d, n);                                                              \
      return;                                                                   \
    }                                                                           \
    float y;                                                                    \
    FN(a, &y, 1);                                                               \
    for (int64_t i = 0; i < n; i++) d[i] = y;                                   \
  }
FVEC(f_sin, kern_sin_f32)
FVEC(f_cos, kern_cos_f32)
FVEC(f_exp, kern_exp_f32)
FVEC(f_log, kern_log_f32)

/* The operators of the four arithmetic loops let fused plans join two of
 * them in one pass (transform/fused_loop.c, pair_up). */
static const FuseRule fuse_add = {.loop = f_add, .op = '+'};
static const FuseRule fuse_sub = {.loop = f_sub, .op = '-'};
static const FuseRule fuse_mul = {.loop = f_mul, .op = '*'};
static const FuseRule fuse_div = {.loop = f_div, .op = '/'};
static const FuseRule fuse_max = {.loop = f_max};
static const FuseRule fuse_min = {.loop = f_min};
static const FuseRule fuse_neg = {.loop = f_neg};
static const FuseRule fuse_abs = {.loop = f_abs};
static const FuseRule fuse_sqrt = {.loop = f_sqrt};
static const FuseRule fuse_sin = {.loop = f_sin};
static const FuseRule fuse_cos = {.loop = f_cos};
static const FuseRule fuse_exp = {.loop = f_exp};
static const FuseRule fuse_log = {.loop = f_log};

/* ==== shape rule and zero-derivative instances ============================ */

UNARY_RULE(shape_neg, P_NEG) UNARY_RULE(shape_sign, P_SIGN) UNARY_RULE(shape_floor, P_FLOOR)
UNARY_RULE(shape_ceil, P_CEIL) UNARY_RULE(shape_round, P_ROUND)
UNARY_RULE(shape_is_finite, P_IS_FINITE) UNARY_RULE(shape_exp, P_EXP)
UNARY_RULE(shape_log, P_LOG) UNARY_RULE(shape_log1p, P_LOG1P) UNARY_RULE(shape_expm1, P_EXPM1)
UNARY_RULE(shape_erf, P_ERF)
UNARY_RULE(shape_tanh, P_TANH) UNARY_RULE(shape_logistic, P_LOGISTIC)
UNARY_RULE(shape_sin, P_SIN) UNARY_RULE(shape_cos, P_COS) UNARY_RULE(shape_tan, P_TAN)
UNARY_RULE(shape_asin, P_ASIN) UNARY_RULE(shape_acos, P_ACOS) UNARY_RULE(shape_atan, P_ATAN)
UNARY_RULE(shape_sinh, P_SINH) UNARY_RULE(shape_cosh, P_COSH) UNARY_RULE(shape_sqrt, P_SQRT)
UNARY_RULE(shape_rsqrt, P_RSQRT) UNARY_RULE(shape_abs, P_ABS) UNARY_RULE(shape_not, P_NOT)
UNARY_RULE(shape_copy, P_COPY) BINARY_RULE(shape_add, P_ADD) BINARY_RULE(shape_sub, P_SUB)
BINARY_RULE(shape_mul, P_MUL) BINARY_RULE(shape_div, P_DIV) BINARY_RULE(shape_rem, P_REM)
BINARY_RULE(shape_pow, P_POW) BINARY_RULE(shape_max, P_MAX) BINARY_RULE(shape_min, P_MIN)
BINARY_RULE(shape_atan2, P_ATAN2) BINARY_RULE(shape_and, P_AND) BINARY_RULE(shape_or, P_OR)
BINARY_RULE(shape_xor, P_XOR) BINARY_RULE(shape_eq, P_EQ) BINARY_RULE(shape_ne, P_NE)
BINARY_RULE(shape_lt, P_LT) BINARY_RULE(shape_le, P_LE) BINARY_RULE(shape_gt, P_GT)
BINARY_RULE(shape_ge, P_GE) BINARY_RULE(shape_clamp, P_CLAMP)
ZERO_JVP(sign, SIGN) ZERO_JVP(floor, FLOOR) ZERO_JVP(ceil, CEIL) ZERO_JVP(round, ROUND)
ZERO_JVP(is_finite, IS_FINITE) ZERO_JVP(not, NOT) ZERO_JVP(and, AND) ZERO_JVP(or, OR)
ZERO_JVP(xor, XOR) ZERO_JVP(eq, EQ) ZERO_JVP(ne, NE) ZERO_JVP(lt, LT) ZERO_JVP(le, LE)
ZERO_JVP(gt, GT) ZERO_JVP(ge, GE)

/* The batching rule of each element-wise primitive (batch_elementwise). */
#define PRIM(id, nm, ni, no, k, kn) ELEMENTWISE(b_ew_##id, id)
#include "array/prim.def"
#undef PRIM

/* ==== the rows ============================================================= */

/* Each primitive's rules, side by side (prim.h, PrimRules). */
static const PrimRow rows[] = {
    {P_NEG, {.shape = shape_neg, .kernel = kern_neg, .dtypes = DC_NUM, .batch = b_ew_NEG, .jvp = jvp_neg, .transpose = tr_neg, .fuse = &fuse_neg, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_SIGN, {.shape = shape_sign, .kernel = kern_sign, .dtypes = DC_NUM, .batch = b_ew_SIGN, .jvp = jvp_sign, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_FLOOR, {.shape = shape_floor, .kernel = kern_floor, .dtypes = DC_FLOAT, .batch = b_ew_FLOOR, .jvp = jvp_floor, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_CEIL, {.shape = shape_ceil, .kernel = kern_ceil, .dtypes = DC_FLOAT, .batch = b_ew_CEIL, .jvp = jvp_ceil, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_ROUND, {.shape = shape_round, .kernel = kern_round, .dtypes = DC_FLOAT, .batch = b_ew_ROUND, .jvp = jvp_round, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_IS_FINITE, {.shape = shape_is_finite, .kernel = kern_is_finite, .dtypes = DC_FLOAT, .batch = b_ew_IS_FINITE, .jvp = jvp_is_finite, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_EXP, {.shape = shape_exp, .kernel = kern_exp, .dtypes = DC_FLOAT, .batch = b_ew_EXP, .jvp = jvp_exp, .fuse = &fuse_exp, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_LOG, {.shape = shape_log, .kernel = kern_log, .dtypes = DC_FLOAT, .batch = b_ew_LOG, .jvp = jvp_log, .fuse = &fuse_log, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_LOG1P, {.shape = shape_log1p, .kernel = kern_log1p, .dtypes = DC_FLOAT, .batch = b_ew_LOG1P, .jvp = jvp_log1p, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_EXPM1, {.shape = shape_expm1, .kernel = kern_expm1, .dtypes = DC_FLOAT, .batch = b_ew_EXPM1, .jvp = jvp_expm1, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_ERF, {.shape = shape_erf, .kernel = kern_erf, .dtypes = DC_FLOAT, .batch = b_ew_ERF, .jvp = jvp_erf, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_TANH, {.shape = shape_tanh, .kernel = kern_tanh, .dtypes = DC_FLOAT, .batch = b_ew_TANH, .jvp = jvp_tanh, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_LOGISTIC, {.shape = shape_logistic, .kernel = kern_logistic, .dtypes = DC_FLOAT, .batch = b_ew_LOGISTIC, .jvp = jvp_logistic, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_SIN, {.shape = shape_sin, .kernel = kern_sin, .dtypes = DC_FLOAT, .batch = b_ew_SIN, .jvp = jvp_sin, .fuse = &fuse_sin, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_COS, {.shape = shape_cos, .kernel = kern_cos, .dtypes = DC_FLOAT, .batch = b_ew_COS, .jvp = jvp_cos, .fuse = &fuse_cos, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_TAN, {.shape = shape_tan, .kernel = kern_tan, .dtypes = DC_FLOAT, .batch = b_ew_TAN, .jvp = jvp_tan, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_ASIN, {.shape = shape_asin, .kernel = kern_asin, .dtypes = DC_FLOAT, .batch = b_ew_ASIN, .jvp = jvp_asin, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_ACOS, {.shape = shape_acos, .kernel = kern_acos, .dtypes = DC_FLOAT, .batch = b_ew_ACOS, .jvp = jvp_acos, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_ATAN, {.shape = shape_atan, .kernel = kern_atan, .dtypes = DC_FLOAT, .batch = b_ew_ATAN, .jvp = jvp_atan, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_SINH, {.shape = shape_sinh, .kernel = kern_sinh, .dtypes = DC_FLOAT, .batch = b_ew_SINH, .jvp = jvp_sinh, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_COSH, {.shape = shape_cosh, .kernel = kern_cosh, .dtypes = DC_FLOAT, .batch = b_ew_COSH, .jvp = jvp_cosh, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_SQRT, {.shape = shape_sqrt, .kernel = kern_sqrt, .dtypes = DC_FLOAT, .batch = b_ew_SQRT, .jvp = jvp_sqrt, .fuse = &fuse_sqrt, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_RSQRT, {.shape = shape_rsqrt, .kernel = kern_rsqrt, .dtypes = DC_FLOAT, .batch = b_ew_RSQRT, .jvp = jvp_rsqrt, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_ABS, {.shape = shape_abs, .kernel = kern_abs, .dtypes = DC_NUM, .batch = b_ew_ABS, .jvp = jvp_abs, .fuse = &fuse_abs, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_NOT, {.shape = shape_not, .kernel = kern_not, .dtypes = DC_BOOL | DC_INT, .batch = b_ew_NOT, .jvp = jvp_not, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_INTEGER_POW, {.shape = shape_integer_pow, .kernel = kern_integer_pow, .dtypes = DC_NUM, .batch = b_ew_INTEGER_POW, .jvp = jvp_integer_pow, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_CONVERT_ELEMENT_TYPE, {.shape = shape_convert_element_type, .kernel = kern_convert_element_type, .batch = b_ew_CONVERT_ELEMENT_TYPE, .jvp = jvp_convert_element_type, .transpose = tr_convert_element_type, .sharding = prim_sharding_elementwise}},
    {P_COPY, {.shape = shape_copy, .kernel = kern_copy, .batch = b_ew_COPY, .jvp = jvp_copy, .transpose = tr_copy, .sharding = prim_sharding_elementwise}},
    {P_ADD, {.shape = shape_add, .kernel = kern_add, .batch = b_ew_ADD, .jvp = jvp_add, .transpose = tr_add, .fuse = &fuse_add, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_SUB, {.shape = shape_sub, .kernel = kern_sub, .dtypes = DC_NUM, .batch = b_ew_SUB, .jvp = jvp_sub, .transpose = tr_sub, .fuse = &fuse_sub, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_MUL, {.shape = shape_mul, .kernel = kern_mul, .batch = b_ew_MUL, .jvp = jvp_mul, .transpose = tr_mul, .fuse = &fuse_mul, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_DIV, {.shape = shape_div, .kernel = kern_div, .dtypes = DC_NUM, .batch = b_ew_DIV, .jvp = jvp_div, .transpose = tr_div, .fuse = &fuse_div, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_REM, {.shape = shape_rem, .kernel = kern_rem, .dtypes = DC_NUM, .batch = b_ew_REM, .jvp = jvp_rem, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_POW, {.shape = shape_pow, .kernel = kern_pow, .dtypes = DC_NUM, .batch = b_ew_POW, .jvp = jvp_pow, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_MAX, {.shape = shape_max, .kernel = kern_max, .batch = b_ew_MAX, .jvp = jvp_max, .fuse = &fuse_max, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_MIN, {.shape = shape_min, .kernel = kern_min, .batch = b_ew_MIN, .jvp = jvp_min, .fuse = &fuse_min, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_ATAN2, {.shape = shape_atan2, .kernel = kern_atan2, .dtypes = DC_FLOAT, .batch = b_ew_ATAN2, .jvp = jvp_atan2, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
    {P_AND, {.shape = shape_and, .kernel = kern_and, .dtypes = DC_BOOL | DC_INT, .batch = b_ew_AND, .jvp = jvp_and, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_OR, {.shape = shape_or, .kernel = kern_or, .dtypes = DC_BOOL | DC_INT, .batch = b_ew_OR, .jvp = jvp_or, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_XOR, {.shape = shape_xor, .kernel = kern_xor, .dtypes = DC_BOOL | DC_INT, .batch = b_ew_XOR, .jvp = jvp_xor, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_EQ, {.shape = shape_eq, .kernel = kern_eq, .batch = b_ew_EQ, .jvp = jvp_eq, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_NE, {.shape = shape_ne, .kernel = kern_ne, .batch = b_ew_NE, .jvp = jvp_ne, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_LT, {.shape = shape_lt, .kernel = kern_lt, .batch = b_ew_LT, .jvp = jvp_lt, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_LE, {.shape = shape_le, .kernel = kern_le, .batch = b_ew_LE, .jvp = jvp_le, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_GT, {.shape = shape_gt, .kernel = kern_gt, .batch = b_ew_GT, .jvp = jvp_gt, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_GE, {.shape = shape_ge, .kernel = kern_ge, .batch = b_ew_GE, .jvp = jvp_ge, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_SELECT_N, {.shape = shape_select_n, .kernel = kern_select_n, .batch = b_ew_SELECT_N, .jvp = jvp_select_n, .transpose = tr_select_n, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
    {P_CLAMP, {.shape = shape_clamp, .kernel = kern_clamp, .kept = 1u << 0 | 1u << 2, .batch = b_ew_CLAMP, .jvp = jvp_clamp, .sharding = prim_sharding_elementwise, .cost = prim_cost_per_element}},
};

void prim_elementwise_register(void) { prim_register_rows(rows, sizeof rows / sizeof rows[0]); }
