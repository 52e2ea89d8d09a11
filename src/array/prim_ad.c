/*
 * prim_ad.c - JVP and transpose rules of the array primitives (prim_ad.h).
 *
 * Each rule builds its result from prim_apply calls, so it computes on
 * concrete arrays and stages on tracers alike.  Temporaries live in a
 * Scope released when the rule returns: the rules read as the formulas
 * they implement (JAX's lax.py rules are the reference), and a NULL from
 * any step (an error) flows through the rest to the rule's return.
 */
#include <math.h>
#include <string.h>

#include "array/kernels.h"
#include "array/prim_ad.h"

/* ==== a scope of temporaries ============================================ */

enum { SCOPE_CAP = 96 };

typedef struct Scope {
  Value *v[SCOPE_CAP];
  int n;
} Scope;

/* Keeps [v] until scope_end; NULL stays NULL (the error is set). */
static Value *keep(Scope *s, Value *v) {
  if (!v) return NULL;
  if (s->n == SCOPE_CAP) {
    val_decref(v);
    return err_set(ERR_VALUE, "differentiation rule: too many temporaries");
  }
  return s->v[s->n++] = v;
}

static void scope_end(Scope *s) {
  for (int i = 0; i < s->n; i++) val_decref(s->v[i]);
  s->n = 0;
}

/* A new reference to the scope's result, then the scope released. */
static Value *scope_return(Scope *s, Value *r) {
  if (r) val_incref(r);
  scope_end(s);
  return r;
}

/* ==== building blocks (borrowed in, borrowed out, NULL in: NULL out) ===== */

/* id[*p](in...) kept in [s]: prim_apply_rule (operands held across the
 * call, since a rule's temporaries are still needed after it). */
static Value *ap(Scope *s, PrimId id, int n, Value **in, Params *p) {
  return keep(s, prim_apply_rule(id, n, in, p));
}

static Value *un(Scope *s, PrimId id, Value *x) { return ap(s, id, 1, &x, NULL); }
static Value *bin(Scope *s, PrimId id, Value *a, Value *b) {
  return ap(s, id, 2, (Value *[]){a, b}, NULL);
}
static Value *mul(Scope *s, Value *a, Value *b) { return bin(s, P_MUL, a, b); }
static Value *add(Scope *s, Value *a, Value *b) { return bin(s, P_ADD, a, b); }
static Value *sub(Scope *s, Value *a, Value *b) { return bin(s, P_SUB, a, b); }
static Value *dvd(Scope *s, Value *a, Value *b) { return bin(s, P_DIV, a, b); }
static Value *neg(Scope *s, Value *a) { return un(s, P_NEG, a); }

static bool aval_ok(Value *x, AVal *a) { return x && prim_value_aval(x, a) == 0; }

/* broadcast_in_dim of [x] to [shape] along [bdims]. */
static Value *bcast(Scope *s, Value *x, int nd, const int64_t *shape, int nb, const int64_t *bdims) {
  if (!x) return NULL;
  Params p;
  params_init(&p);
  params_add(&p, "shape", val_int_tuple(nd, shape));
  params_add(&p, "broadcast_dimensions", val_int_tuple(nb, bdims));
  return ap(s, P_BROADCAST_IN_DIM, 1, &x, &p);
}

/* A concrete array of aval [a] (dtype, shape) filled with [c]. */
static Value *full(Scope *s, double c, const AVal *a) {
  Value *x = keep(s, &arr_scalar_f64(a->dtype, c, false)->hdr);
  return a->ndim ? bcast(s, x, a->ndim, a->shape, 0, NULL) : x;
}

/* [c] in the aval of [x]. */
static Value *like(Scope *s, double c, Value *x) {
  AVal a;
  return aval_ok(x, &a) ? full(s, c, &a) : NULL;
}

static Value *zeros_of(Scope *s, const AVal *a) { return full(s, 0.0, a); }

static Value *convert(Scope *s, Value *x, DType t, bool weak) {
  if (!x) return NULL;
  Params p;
  params_init(&p);
  params_add(&p, "new_dtype", dtype_value(t));
  params_add(&p, "weak_type", val_bool(weak));
  return ap(s, P_CONVERT_ELEMENT_TYPE, 1, &x, &p);
}

static Value *reshape(Scope *s, Value *x, int nd, const int64_t *shape) {
  AVal a;
  if (!aval_ok(x, &a)) return NULL;
  if (a.ndim == nd && !memcmp(a.shape, shape, sizeof(int64_t) * (size_t)nd)) return x;
  Params p;
  params_init(&p);
  params_add(&p, "new_sizes", val_int_tuple(nd, shape));
  params_add(&p, "dimensions", val_incref(VAL_NONE));
  return ap(s, P_RESHAPE, 1, &x, &p);
}

static Value *reduce_sum(Scope *s, Value *x, int n, const int64_t *axes) {
  if (!x) return NULL;
  if (n == 0) return x;
  Params p;
  params_init(&p);
  params_add(&p, "axes", val_int_tuple(n, axes));
  return ap(s, P_REDUCE_SUM, 1, &x, &p);
}

/* Every axis of [x] summed: a 0-d value. */
static Value *sum_all(Scope *s, Value *x) {
  AVal a;
  if (!aval_ok(x, &a)) return NULL;
  int64_t axes[SHM_MAXDIM];
  for (int i = 0; i < a.ndim; i++) axes[i] = i;
  return reduce_sum(s, x, a.ndim, axes);
}

/* select(pred, on_true, on_false), as lax.select: select_n(pred, f, t). */
static Value *select(Scope *s, Value *pred, Value *t, Value *f) {
  return ap(s, P_SELECT_N, 3, (Value *[]){pred, f, t}, NULL);
}

/* [name] of [p] as ints. */
static int ints(const Params *p, const char *name, int *n, int64_t *out) {
  return params_ints(p, name, n, out, SHM_MAXDIM);
}

/* A copy of [p] with new references. */
static void params_dup(Params *dst, const Params *p) {
  params_init(dst);
  for (int i = 0; p && i < p->n; i++) params_add(dst, p->p[i].name, val_incref(p->p[i].value));
}

/* The same primitive with the same parameters on other operands. */
static Value *same(Scope *s, PrimId id, int n, Value **in, const Params *p) {
  Params q;
  params_dup(&q, p);
  return ap(s, id, n, in, &q);
}

Value *prim_zeros(const AVal *a) {
  Scope s = {0};
  return scope_return(&s, zeros_of(&s, a));
}

Value *prim_add_any(Value *a, Value *b) {
  if (!a || !b) return a ? val_incref(a) : b ? val_incref(b) : NULL;
  Scope s = {0};
  return scope_return(&s, add(&s, a, b));
}

/* ==== rule frames ======================================================== */

/* The primal result of [id] on [x], into [yo]; 0 or -1. */
static int primal(PrimId id, Value **x, int nin, const Params *p, Value **yo) {
  for (int i = 0; i < nin; i++) val_incref(x[i]);   /* the tangent rule reads them after */
  *yo = prim_apply(id, nin, x, p);
  for (int i = 0; i < nin; i++) val_decref(x[i]);
  return *yo ? 0 : -1;
}

/* Finishes a JVP rule: the tangent [t] (borrowed from [s], NULL: an
 * error unless [zero]) into [to]. */
static int jvp_done(Scope *s, Value *t, bool zero, Value **yo, Value **to) {
  *to = zero ? NULL : scope_return(s, t);
  if (zero) scope_end(s);
  if (zero || *to) return 0;
  val_decref(*yo);
  *yo = NULL;
  return -1;
}

/* Tangent [t] or, where it is a symbolic zero, zeros like [x]. */
static Value *tan_or_zero(Scope *s, Value *t, Value *x) { return t ? t : like(s, 0.0, x); }

/* ==== element-wise ======================================================= */

/* The zero derivative: integer, boolean and piecewise-constant results. */
static int jvp_zero(PrimId id, Value **x, Value **t, int nin, const Params *p, Value **yo,
                    Value **to) {
  (void)t;
  *to = NULL;
  return primal(id, x, nin, p, yo);
}
#define ZERO_JVP(name, ID)                                                                 \
  static int jvp_##name(Value **x, Value **t, int nin, const Params *p, Value **yo,         \
                        Value **to) {                                                      \
    return jvp_zero(P_##ID, x, t, nin, p, yo, to);                                          \
  }
ZERO_JVP(sign, SIGN) ZERO_JVP(floor, FLOOR) ZERO_JVP(ceil, CEIL) ZERO_JVP(round, ROUND)
ZERO_JVP(is_finite, IS_FINITE) ZERO_JVP(not, NOT) ZERO_JVP(and, AND) ZERO_JVP(or, OR)
ZERO_JVP(xor, XOR) ZERO_JVP(eq, EQ) ZERO_JVP(ne, NE) ZERO_JVP(lt, LT) ZERO_JVP(le, LE)
ZERO_JVP(gt, GT) ZERO_JVP(ge, GE) ZERO_JVP(argmax, ARGMAX) ZERO_JVP(argmin, ARGMIN)
ZERO_JVP(reduce_and, REDUCE_AND) ZERO_JVP(reduce_or, REDUCE_OR) ZERO_JVP(iota, IOTA)
ZERO_JVP(argsort, ARGSORT)

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
UNARY_JVP(log1p, LOG1P, dvd(s, t, add(s, x, like(s, 1.0, x))))
UNARY_JVP(expm1, EXPM1, mul(s, t, add(s, y, like(s, 1.0, y))))
UNARY_JVP(tanh, TANH, mul(s, t, sub(s, like(s, 1.0, y), mul(s, y, y))))
UNARY_JVP(logistic, LOGISTIC, mul(s, t, mul(s, y, sub(s, like(s, 1.0, y), y))))
UNARY_JVP(sin, SIN, mul(s, t, un(s, P_COS, x)))
UNARY_JVP(cos, COS, neg(s, mul(s, t, un(s, P_SIN, x))))
UNARY_JVP(tan, TAN, mul(s, t, add(s, like(s, 1.0, y), mul(s, y, y))))
UNARY_JVP(asin, ASIN, mul(s, t, un(s, P_RSQRT, sub(s, like(s, 1.0, x), mul(s, x, x)))))
UNARY_JVP(acos, ACOS, neg(s, mul(s, t, un(s, P_RSQRT, sub(s, like(s, 1.0, x), mul(s, x, x))))))
UNARY_JVP(atan, ATAN, dvd(s, t, add(s, like(s, 1.0, x), mul(s, x, x))))
UNARY_JVP(sinh, SINH, mul(s, t, un(s, P_COSH, x)))
UNARY_JVP(cosh, COSH, mul(s, t, un(s, P_SINH, x)))
UNARY_JVP(sqrt, SQRT, dvd(s, t, mul(s, like(s, 2.0, y), y)))
UNARY_JVP(rsqrt, RSQRT, mul(s, t, mul(s, like(s, -0.5, y), dvd(s, y, x))))
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
  return mul(s, t, mul(s, like(s, (double)n, x), xn1));
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
           lin2(s, ta, ta ? mul(s, b, bin(s, P_POW, a, sub(s, b, like(s, 1.0, b)))) : NULL, tb,
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

/* ==== reductions ========================================================= */

/* The primitive applied to the tangent, same parameters: every primitive
 * linear in its one operand (reduce_sum, cumsum, the layout ones). */
static int jvp_linear1(PrimId id, Value **x, Value **t, const Params *p, Value **yo,
                       Value **to) {
  if (primal(id, x, 1, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0]) return 0;
  Scope s = {0};
  return jvp_done(&s, same(&s, id, 1, t, p), false, yo, to);
}
#define LINEAR1_JVP(name, ID)                                                              \
  static int jvp_##name(Value **x, Value **t, int nin, const Params *p, Value **yo,         \
                        Value **to) {                                                      \
    (void)nin;                                                                             \
    return jvp_linear1(P_##ID, x, t, p, yo, to);                                           \
  }
LINEAR1_JVP(reduce_sum, REDUCE_SUM) LINEAR1_JVP(cumsum, CUMSUM)
LINEAR1_JVP(broadcast_in_dim, BROADCAST_IN_DIM) LINEAR1_JVP(reshape, RESHAPE)
LINEAR1_JVP(transpose, TRANSPOSE) LINEAR1_JVP(squeeze, SQUEEZE)
LINEAR1_JVP(expand_dims, EXPAND_DIMS) LINEAR1_JVP(rev, REV) LINEAR1_JVP(slice, SLICE)

/* The result broadcast back over the reduced [axes] of an operand of
 * aval [a]. */
static Value *unreduce(Scope *s, Value *y, const AVal *a, int n, const int64_t *axes) {
  int64_t kept[SHM_MAXDIM];
  int nk = 0;
  for (int i = 0; i < a->ndim; i++) {
    bool red = false;
    for (int k = 0; k < n; k++) red |= axes[k] == i;
    if (!red) kept[nk++] = i;
  }
  return bcast(s, y, a->ndim, a->shape, nk, kept);
}

/* reduce_max/min: the mean of the tangents at the positions that attain
 * the result (JAX's chooser rule). */
static int jvp_chooser(PrimId id, Value **x, Value **t, const Params *p, Value **yo, Value **to) {
  if (primal(id, x, 1, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0]) return 0;
  Scope s = {0};
  AVal a;
  int n;
  int64_t axes[SHM_MAXDIM];
  if (prim_value_aval(x[0], &a) < 0 || ints(p, "axes", &n, axes) < 0)
    return jvp_done(&s, NULL, false, yo, to);
  Value *at = convert(&s, bin(&s, P_EQ, x[0], unreduce(&s, *yo, &a, n, axes)), a.dtype, a.weak);
  Value *num = reduce_sum(&s, mul(&s, t[0], at), n, axes);
  return jvp_done(&s, dvd(&s, num, reduce_sum(&s, at, n, axes)), false, yo, to);
}
static int jvp_reduce_max(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  return jvp_chooser(P_REDUCE_MAX, x, t, p, yo, to);
}
static int jvp_reduce_min(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  return jvp_chooser(P_REDUCE_MIN, x, t, p, yo, to);
}

/* [x] with the reduced [axes] moved last and flattened into one axis of
 * length *r: (kept..., r). */
static Value *rows_of(Scope *s, Value *x, const AVal *a, int n, const int64_t *axes, int64_t *r) {
  int64_t perm[SHM_MAXDIM], shape[SHM_MAXDIM];
  int k = 0;
  *r = 1;
  for (int i = 0; i < a->ndim; i++) {
    bool red = false;
    for (int j = 0; j < n; j++) red |= axes[j] == i;
    if (!red) shape[k] = a->shape[i], perm[k++] = i;
  }
  int nk = k;
  for (int j = 0; j < n; j++) perm[k++] = axes[j], *r *= a->shape[axes[j]];
  shape[nk] = *r;
  Params q;
  params_init(&q);
  params_add(&q, "permutation", val_int_tuple(a->ndim, perm));
  Value *t = ap(s, P_TRANSPOSE, 1, &x, &q);
  return reshape(s, t, nk + 1, shape);
}

/* [x] (..., r) shifted by one along its last axis, a one coming in: an
 * exclusive product's start. */
static Value *shift_in_one(Scope *s, Value *x, bool from_front) {
  AVal a;
  if (!aval_ok(x, &a)) return NULL;
  int nd = a.ndim;
  int64_t lo[SHM_MAXDIM] = {0}, hi[SHM_MAXDIM] = {0}, it[SHM_MAXDIM] = {0};
  int64_t st[SHM_MAXDIM] = {0}, li[SHM_MAXDIM];
  for (int i = 0; i < nd; i++) li[i] = a.shape[i];
  if (from_front) li[nd - 1] -= 1, lo[nd - 1] = 1;
  else st[nd - 1] = 1, hi[nd - 1] = 1;
  Params q;
  params_init(&q);
  params_add(&q, "start_indices", val_int_tuple(nd, st));
  params_add(&q, "limit_indices", val_int_tuple(nd, li));
  params_add(&q, "strides", val_incref(VAL_NONE));
  Value *cut = ap(s, P_SLICE, 1, &x, &q);
  Value *cfg = tuple_new((size_t)nd);
  for (int i = 0; cfg && i < nd; i++)
    tuple_set_steal(cfg, (size_t)i, val_int_tuple(3, (int64_t[]){lo[i], hi[i], it[i]}));
  params_init(&q);
  params_add(&q, "padding_config", cfg);
  AVal z = a;
  z.ndim = 0;
  return ap(s, P_PAD, 2, (Value *[]){cut, full(s, 1.0, &z)}, &q);
}

/* reduce_prod: the tangent of each factor times the product of the others
 * (exclusive products from both ends, so zeros are exact), summed. */
static int jvp_reduce_prod(Value **x, Value **t, int nin, const Params *p, Value **yo,
                           Value **to) {
  (void)nin;
  if (primal(P_REDUCE_PROD, x, 1, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0]) return 0;
  Scope s = {0};
  AVal a, ya;
  int n;
  int64_t axes[SHM_MAXDIM], r;
  if (prim_value_aval(x[0], &a) < 0 || prim_value_aval(*yo, &ya) < 0 || ints(p, "axes", &n, axes) < 0)
    return jvp_done(&s, NULL, false, yo, to);
  if (n == 0) return jvp_done(&s, t[0], false, yo, to);
  Value *xr = rows_of(&s, x[0], &a, n, axes, &r), *tr = rows_of(&s, t[0], &a, n, axes, &r);
  AVal ra;
  if (!aval_ok(xr, &ra)) return jvp_done(&s, NULL, false, yo, to);
  if (r == 0) return jvp_done(&s, zeros_of(&s, &ya), false, yo, to);
  int last = ra.ndim - 1;
  Params q;
  params_init(&q);
  params_add(&q, "axis", val_int(last));
  params_add(&q, "reverse", val_bool(false));
  Value *fwd = ap(&s, P_CUMPROD, 1, &xr, &q);
  params_init(&q);
  params_add(&q, "axis", val_int(last));
  params_add(&q, "reverse", val_bool(true));
  Value *rev = ap(&s, P_CUMPROD, 1, &xr, &q);
  Value *others = mul(&s, shift_in_one(&s, fwd, true), shift_in_one(&s, rev, false));
  Value *sum = reduce_sum(&s, mul(&s, tr, others), 1, (int64_t[]){last});
  return jvp_done(&s, reshape(&s, sum, ya.ndim, ya.shape), false, yo, to);
}

/* [x] shifted [k] places along [axis] (toward its end; toward its start
 * when [reverse]), the 0-d [fill] coming in. */
static Value *shift_by(Scope *s, Value *x, int axis, int64_t k, bool reverse, Value *fill) {
  AVal a;
  if (!aval_ok(x, &a) || !fill) return NULL;
  int nd = a.ndim;
  int64_t st[SHM_MAXDIM] = {0}, li[SHM_MAXDIM];
  Value *cfg = tuple_new((size_t)nd);
  for (int i = 0; i < nd; i++) li[i] = a.shape[i];
  if (reverse) st[axis] = k;
  else li[axis] -= k;
  for (int i = 0; cfg && i < nd; i++) {
    int64_t lo = i == axis && !reverse ? k : 0, hi = i == axis && reverse ? k : 0;
    tuple_set_steal(cfg, (size_t)i, val_int_tuple(3, (int64_t[]){lo, hi, 0}));
  }
  Params q;
  params_init(&q);
  params_add(&q, "start_indices", val_int_tuple(nd, st));
  params_add(&q, "limit_indices", val_int_tuple(nd, li));
  params_add(&q, "strides", val_incref(VAL_NONE));
  Value *cut = ap(s, P_SLICE, 1, &x, &q);
  params_init(&q);
  params_add(&q, "padding_config", cfg);
  return ap(s, P_PAD, 2, (Value *[]){cut, fill}, &q);
}

/* One step of the scan's tangent: from (y, ty), shifted by [k], the next
 * (y, ty) as new references in [y2], [t2]. */
static int cumscan_step(PrimId id, Value *y, Value *ty, int axis, int64_t k, bool reverse,
                        Value **y2, Value **t2) {
  Scope s = {0};
  AVal a, z;
  if (!aval_ok(y, &a)) return -1;
  z = a;
  z.ndim = 0;
  Value *ident = id == P_CUMPROD ? full(&s, 1.0, &z)
                                 : keep(&s, &arr_scalar_f64(a.dtype, -INFINITY, false)->hdr);
  Value *ys = shift_by(&s, y, axis, k, reverse, ident);
  Value *ts = shift_by(&s, ty, axis, k, reverse, full(&s, 0.0, &z));
  Value *ny, *nt;
  if (id == P_CUMPROD) {   /* (y ys)' = ty ys + y ts */
    ny = mul(&s, y, ys);
    nt = add(&s, mul(&s, ty, ys), mul(&s, y, ts));
  } else {                 /* the tangent of the larger, the later one on ties */
    Value *keep_y = bin(&s, P_GE, y, ys);
    ny = select(&s, keep_y, y, ys);
    nt = select(&s, keep_y, ty, ts);
  }
  *y2 = ny ? val_incref(ny) : NULL;
  *t2 = nt ? val_incref(nt) : NULL;
  scope_end(&s);
  if (*y2 && *t2) return 0;
  if (*y2) val_decref(*y2);
  if (*t2) val_decref(*t2);
  return -1;
}

/* cumprod, cummax: the tangent of the inclusive scan computed as the
 * scan's log2(n) doubling steps (Hillis and Steele), each differentiated
 * exactly, so zeros in a product need no division (JAX differentiates its
 * associative_scan the same way). */
static int jvp_cumscan(PrimId id, Value **x, Value **t, const Params *p, Value **yo,
                       Value **to) {
  if (primal(id, x, 1, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0]) return 0;
  AVal a;
  int64_t axis;
  bool reverse = false;
  if (!aval_ok(x[0], &a) || params_int(p, "axis", &axis) < 0 ||
      (params_get(p, "reverse") && params_bool(p, "reverse", &reverse) < 0)) {
    val_decref(*yo);
    *yo = NULL;
    return -1;
  }
  if (axis < 0) axis += a.ndim;
  Value *y = val_incref(x[0]), *ty = val_incref(t[0]);
  for (int64_t k = 1; y && k < (a.ndim ? a.shape[axis] : 1); k *= 2) {
    Value *y2, *t2;
    int rc = cumscan_step(id, y, ty, (int)axis, k, reverse, &y2, &t2);
    val_decref(y);
    val_decref(ty);
    y = rc == 0 ? y2 : NULL;
    ty = rc == 0 ? t2 : NULL;
  }
  if (y) val_decref(y);
  *to = ty;
  if (ty) return 0;
  val_decref(*yo);
  *yo = NULL;
  return -1;
}
static int jvp_cumprod(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  return jvp_cumscan(P_CUMPROD, x, t, p, yo, to);
}
static int jvp_cummax(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  return jvp_cumscan(P_CUMMAX, x, t, p, yo, to);
}

/* ==== layout and indexing ================================================ */

/* Operands and tangents of a primitive linear in all its operands but
 * the integer [first_index]..: the same primitive on the tangents, zeros
 * for the symbolic ones. */
static int jvp_multilinear(PrimId id, int nlin, Value **x, Value **t, int nin, const Params *p,
                           Value **yo, Value **to) {
  if (primal(id, x, nin, p, yo) < 0) return -1;
  *to = NULL;
  bool any = false;
  for (int i = 0; i < nlin; i++) any |= t[i] != NULL;
  if (!any) return 0;
  Scope s = {0};
  Value *in[SHM_MAXDIM + 34];
  if (nin > (int)(sizeof in / sizeof *in))
    return jvp_done(&s, err_set(ERR_VALUE, "%s: too many operands", prim_table[id].name), false,
                    yo, to);
  for (int i = 0; i < nin; i++) in[i] = i < nlin ? tan_or_zero(&s, t[i], x[i]) : x[i];
  return jvp_done(&s, same(&s, id, nin, in, p), false, yo, to);
}
static int jvp_concatenate(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  return jvp_multilinear(P_CONCATENATE, nin, x, t, nin, p, yo, to);
}
static int jvp_pad(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  return jvp_multilinear(P_PAD, 2, x, t, nin, p, yo, to);
}
static int jvp_dynamic_slice(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  return jvp_multilinear(P_DYNAMIC_SLICE, 1, x, t, nin, p, yo, to);
}
static int jvp_dynamic_update_slice(Value **x, Value **t, int nin, const Params *p, Value **yo,
                                    Value **to) {
  return jvp_multilinear(P_DYNAMIC_UPDATE_SLICE, 2, x, t, nin, p, yo, to);
}
static int jvp_gather(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  Value *xs[2] = {x[0], x[1]}, *ts[2] = {t[0], NULL};
  return jvp_multilinear(P_GATHER, 1, xs, ts, 2, p, yo, to);
}

/* scatter[axis mode=add](zeros like [like], [idx], [u]): [u]'s rows
 * summed into the positions they name. */
static Value *scatter_add_into(Scope *s, Value *like_v, Value *idx, Value *u, int64_t axis) {
  Params q;
  params_init(&q);
  params_add(&q, "axis", val_int(axis));
  params_add(&q, "mode", str_from("add"));
  return ap(s, P_SCATTER, 3, (Value *[]){like(s, 0.0, like_v), idx, u}, &q);
}

/* scatter min/max: each position of the result is the operand or some
 * updates that equal it; its tangent is the mean of the tangents of all
 * of them that tie, as JAX's scatter extremal JVP.  Linear in the
 * tangents (masks, a scatter-add and a division by the tie count), so it
 * transposes. */
static Value *scatter_extremal_tangent(Scope *s, Value **x, Value **t, Value *y, int64_t axis) {
  AVal a;
  if (!aval_ok(x[0], &a)) return NULL;
  Params g;
  params_init(&g);
  params_add(&g, "axis", val_int(axis));
  Value *yg = ap(s, P_GATHER, 2, (Value *[]){y, x[1]}, &g);
  Value *uhit = convert(s, bin(s, P_EQ, x[2], yg), a.dtype, false);
  Value *ohit = convert(s, bin(s, P_EQ, x[0], y), a.dtype, false);
  Value *count = add(s, ohit, scatter_add_into(s, x[0], x[1], uhit, axis));
  Value *num = add(s, mul(s, tan_or_zero(s, t[0], x[0]), ohit),
                   scatter_add_into(s, x[0], x[1], mul(s, tan_or_zero(s, t[2], x[2]), uhit), axis));
  return dvd(s, num, count);
}

/* scatter: linear in (operand, updates) jointly for set and add; min and
 * max average the tangents of ties; multiply is linear in the operand
 * (JAX differentiates its updates only with unique indices, which the
 * language does not declare: an error, as JAX's). */
static int jvp_scatter(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  Value *mode = params_get(p, "mode");
  const char *m = mode && mode->type == V_STR ? str_cstr(mode) : "set";
  bool extremal = !strcmp(m, "min") || !strcmp(m, "max"), mult = !strcmp(m, "multiply");
  if (mult && t[2]) {
    err_set(ERR_NOT_IMPLEMENTED, "scatter_mul gradients are only implemented if "
                                 "`unique_indices=True`");
    return -1;
  }
  if (extremal || mult) {
    int64_t axis;
    if (params_int(p, "axis", &axis) < 0 || primal(P_SCATTER, x, nin, p, yo) < 0) return -1;
    *to = NULL;
    if (!t[0] && !t[2]) return 0;
    Scope s = {0};
    Value *tan = extremal ? scatter_extremal_tangent(&s, x, t, *yo, axis)
                          : same(&s, P_SCATTER, 3, (Value *[]){t[0], x[1], x[2]}, p);
    return jvp_done(&s, tan, false, yo, to);
  }
  if (strcmp(m, "set") && strcmp(m, "add")) return prim_rule_missing(P_SCATTER, "differentiation");
  Value *ts[3] = {t[0], t[2], NULL};
  Value *xs[3] = {x[0], x[2], x[1]};
  (void)ts;
  /* operands are (operand, indices, updates): tangents of 0 and 2 */
  if (primal(P_SCATTER, x, nin, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0] && !t[2]) return 0;
  Scope s = {0};
  Value *in[3] = {tan_or_zero(&s, t[0], xs[0]), x[1], tan_or_zero(&s, t[2], xs[1])};
  return jvp_done(&s, same(&s, P_SCATTER, 3, in, p), false, yo, to);
}

/* ==== sort ============================================================== */

/* [x] permuted so axis [d] comes last, and the inverse permutation. */
static Value *axis_last(Scope *s, Value *x, int nd, int d, int64_t *inv) {
  int64_t perm[SHM_MAXDIM];
  for (int i = 0, k = 0; i < nd; i++)
    if (i != d) perm[k++] = i;
  perm[nd - 1] = d;
  for (int i = 0; i < nd; i++) inv[perm[i]] = i;
  Params q;
  params_init(&q);
  params_add(&q, "permutation", val_int_tuple(nd, perm));
  return ap(s, P_TRANSPOSE, 1, &x, &q);
}

/* take_along_axis(t, idx, d): t's elements at the integer positions
 * [idx] along axis [d] (idx has t's shape, [m] long along d), as one
 * gather of the rows flattened: row r, position i -> r * len + i. */
static Value *take_along(Scope *s, Value *t, Value *idx, const AVal *a, int d, int64_t m) {
  int nd = a->ndim;
  int64_t inv[SHM_MAXDIM], tshape[SHM_MAXDIM], len = a->shape[d], rows = 1;
  for (int i = 0, k = 0; i < nd; i++)
    if (i != d) tshape[k++] = a->shape[i], rows *= a->shape[i];
  tshape[nd - 1] = m;
  Value *tl = reshape(s, axis_last(s, t, nd, d, inv), 1, (int64_t[]){rows * len});
  Value *il = convert(s, reshape(s, axis_last(s, idx, nd, d, inv), 2, (int64_t[]){rows, m}),
                      DT_I32, false);
  Params q;
  params_init(&q);
  params_add(&q, "dtype", dtype_value(DT_I32));
  params_add(&q, "shape", val_int_tuple(2, (int64_t[]){rows, m}));
  params_add(&q, "dimension", val_int(0));
  Value *row = ap(s, P_IOTA, 0, NULL, &q);
  Value *stride = keep(s, &arr_scalar_i64(DT_I32, len, false)->hdr);
  Value *flat = add(s, mul(s, row, stride), il);
  params_init(&q);
  params_add(&q, "axis", val_int(0));
  Value *g = ap(s, P_GATHER, 2, (Value *[]){tl, flat}, &q);
  Value *back = reshape(s, g, nd, tshape);
  if (!back) return NULL;
  params_init(&q);
  params_add(&q, "permutation", val_int_tuple(nd, inv));
  return ap(s, P_TRANSPOSE, 1, &back, &q);
}

Value *prim_take_along(Value *x, Value *idx, int axis) {
  AVal a, ia;
  Scope s = {0};
  if (!aval_ok(x, &a) || !aval_ok(idx, &ia)) return NULL;
  if (ia.ndim != a.ndim || axis < 0 || axis >= a.ndim || !dt_is_int(ia.dtype))
    return err_set(ERR_VALUE, "take_along_axis: indices must be integers of the array's rank "
                              "(%d), got rank %d", a.ndim, ia.ndim);
  int64_t shape[SHM_MAXDIM], dims[SHM_MAXDIM];
  for (int i = 0; i < a.ndim; i++) {
    if (i != axis && ia.shape[i] != a.shape[i] && ia.shape[i] != 1)
      return err_set(ERR_VALUE, "take_along_axis: indices of shape dimension %d (%lld) do not "
                                "match the array's (%lld)", i, (long long)ia.shape[i],
                     (long long)a.shape[i]);
    shape[i] = i == axis ? ia.shape[i] : a.shape[i];
    dims[i] = i;
  }
  Value *full_idx = bcast(&s, idx, a.ndim, shape, a.ndim, dims);
  /* negative positions count from the end, as NumPy's */
  Value *zero = keep(&s, &arr_scalar_i64(ia.dtype, 0, false)->hdr);
  Value *len = keep(&s, &arr_scalar_i64(ia.dtype, a.shape[axis], false)->hdr);
  Value *wrapped = select(&s, bin(&s, P_LT, full_idx, zero), add(&s, full_idx, len), full_idx);
  return scope_return(&s, wrapped ? take_along(&s, x, wrapped, &a, axis, ia.shape[axis]) : NULL);
}

/* sort: the tangent moves with its element, t[argsort(x)] along the
 * dimension (JAX sorts the tangent as a second operand keyed by x). */
static int jvp_sort(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  if (primal(P_SORT, x, 1, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0]) return 0;
  Scope s = {0};
  AVal a;
  int64_t d = -1;
  if (!aval_ok(x[0], &a) || (params_get(p, "dimension") && params_int(p, "dimension", &d) < 0))
    return jvp_done(&s, NULL, false, yo, to);
  if (d < 0) d += a.ndim;
  Params q;
  params_init(&q);
  params_add(&q, "dimension", val_int(d));
  Value *idx = ap(&s, P_ARGSORT, 1, &x[0], &q);
  return jvp_done(&s, idx ? take_along(&s, t[0], idx, &a, (int)d, a.shape[d]) : NULL, false, yo, to);
}

/* ==== dot_general ======================================================== */

static int jvp_dot_general(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  if (primal(P_DOT_GENERAL, x, 2, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0] && !t[1]) return 0;
  Scope s = {0};
  Value *l = t[0] ? same(&s, P_DOT_GENERAL, 2, (Value *[]){t[0], x[1]}, p) : NULL;
  Value *r = t[1] ? same(&s, P_DOT_GENERAL, 2, (Value *[]){x[0], t[1]}, p) : NULL;
  return jvp_done(&s, l && r ? add(&s, l, r) : l ? l : r, false, yo, to);
}

/* The four dimension lists of dot_general's dimension_numbers. */
typedef struct Dims {
  int n[4];               /* lhs contract, rhs contract, lhs batch, rhs batch */
  int64_t d[4][SHM_MAXDIM];
} Dims;

static int dims_read(const Params *p, Dims *d) {
  Value *dn = params_get(p, "dimension_numbers");
  size_t n2, m;
  Value *const *pair, *const *two, *const *xs;
  if (!dn || !val_seq(dn, &n2, &pair) || n2 != 2) goto bad;
  for (int k = 0; k < 2; k++) {
    if (!val_seq(pair[k], &m, &two) || m != 2) goto bad;
    for (int j = 0; j < 2; j++) {
      if (!val_seq(two[j], &m, &xs) || m > SHM_MAXDIM) goto bad;
      d->n[2 * k + j] = (int)m;
      for (size_t i = 0; i < m; i++)
        if (arr_to_index(xs[i], &d->d[2 * k + j][i]) < 0) return -1;
    }
  }
  return 0;
bad:
  err_set(ERR_TYPE, "dot_general: malformed dimension_numbers");
  return -1;
}

static bool in_list(int64_t v, int n, const int64_t *xs) {
  for (int i = 0; i < n; i++)
    if (xs[i] == v) return true;
  return false;
}

/* The cotangent of dot_general's operand [xa] (aval; the linear one) given
 * the other operand [y] and the result's cotangent [g]; [swap]: x is the
 * right-hand operand.  JAX's _dot_general_transpose_lhs: contract g with
 * y over y's kept dimensions, then put x's dimensions back in order. */
static Value *dot_transpose(Scope *s, Value *g, Value *y, const AVal *xa, const AVal *ya,
                            const int64_t *xc, const int64_t *yc, int nc, const int64_t *xb,
                            const int64_t *yb, int nb, bool swap, const Params *p) {
  int64_t x_kept[SHM_MAXDIM] = {0}, y_kept[SHM_MAXDIM] = {0};   /* only the first n are read */
  int nxk = 0, nyk = 0;
  for (int i = 0; i < xa->ndim; i++)
    if (!in_list(i, nc, xc) && !in_list(i, nb, xb)) x_kept[nxk++] = i;
  for (int i = 0; i < ya->ndim; i++)
    if (!in_list(i, nc, yc) && !in_list(i, nb, yb)) y_kept[nyk++] = i;
  /* g's dimensions: batch, then lhs kept, then rhs kept */
  int64_t ans_batch[SHM_MAXDIM] = {0}, ans_y[SHM_MAXDIM] = {0};
  for (int i = 0; i < nb; i++) ans_batch[i] = i;
  int y_at = swap ? nb : nb + nxk;
  for (int i = 0; i < nyk; i++) ans_y[i] = y_at + i;
  Value *dn = val_dot_dimension_numbers(nyk, ans_y, y_kept, nb, ans_batch, yb);
  Params q;
  params_init(&q);
  params_add(&q, "dimension_numbers", dn);
  Value *pet = params_get(p, "preferred_element_type");
  if (pet) params_add(&q, "preferred_element_type", val_incref(pet));
  Value *r = ap(s, P_DOT_GENERAL, 2, (Value *[]){g, y}, &q);
  /* r: x_batch, x_kept, then x's contracting dims in the order of y's */
  int64_t order[SHM_MAXDIM], perm[SHM_MAXDIM];
  int k = 0;
  for (int i = 0; i < nb; i++) order[k++] = xb[i];
  for (int i = 0; i < nxk; i++) order[k++] = x_kept[i];
  /* y's remaining dims come out ascending: sort x_contract by y_contract */
  int64_t ys[SHM_MAXDIM], xs[SHM_MAXDIM];
  for (int i = 0; i < nc; i++) ys[i] = yc[i], xs[i] = xc[i];
  for (int i = 1; i < nc; i++)
    for (int j = i; j > 0 && ys[j - 1] > ys[j]; j--) {
      int64_t t1 = ys[j], t2 = xs[j];
      ys[j] = ys[j - 1], xs[j] = xs[j - 1];
      ys[j - 1] = t1, xs[j - 1] = t2;
    }
  for (int i = 0; i < nc; i++) order[k++] = xs[i];
  for (int i = 0; i < k; i++) perm[order[i]] = i;
  bool ident = true;
  for (int i = 0; i < k; i++) ident &= perm[i] == i;
  if (ident || !r) return r;
  Params tp;
  params_init(&tp);
  params_add(&tp, "permutation", val_int_tuple(k, perm));
  return ap(s, P_TRANSPOSE, 1, &r, &tp);
}

static int tr_dot_general(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                          const Params *p, Value **cts) {
  (void)nin;
  Dims d;
  if (dims_read(p, &d) < 0) return -1;
  if (lin[0] && lin[1]) return prim_rule_missing(P_DOT_GENERAL, "transpose (both operands linear)");
  Scope s = {0};
  Value *r;
  if (lin[0])
    r = dot_transpose(&s, ct[0], in[1], &av[0], &av[1], d.d[0], d.d[1], d.n[0], d.d[2], d.d[3],
                      d.n[2], false, p);
  else
    r = dot_transpose(&s, ct[0], in[0], &av[1], &av[0], d.d[1], d.d[0], d.n[0], d.d[3], d.d[2],
                      d.n[2], true, p);
  AVal ra, xa = lin[0] ? av[0] : av[1];
  if (r && prim_value_aval(r, &ra) == 0 && ra.dtype != xa.dtype) r = convert(&s, r, xa.dtype, xa.weak);
  cts[lin[0] ? 0 : 1] = scope_return(&s, r);
  return cts[lin[0] ? 0 : 1] ? 0 : -1;
}

/* ==== transpose rules ==================================================== */

/* The cotangent [ct] of an operand of aval [a] that an element-wise
 * primitive broadcast: a 0-d operand (a scalar literal) meets arrays of
 * any shape, so its cotangent is the sum. */
static Value *fit(Scope *s, Value *ct, const AVal *a) {
  AVal c;
  if (!aval_ok(ct, &c)) return NULL;
  return a->ndim == 0 && c.ndim > 0 ? sum_all(s, ct) : ct;
}

/* One result from a scope into cts[i]. */
static int ct_set(Scope *s, Value **cts, int i, Value *v) {
  cts[i] = scope_return(s, v);
  return cts[i] ? 0 : -1;
}

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

static int tr_reduce_sum(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                         const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin;
  int n;
  int64_t axes[SHM_MAXDIM];
  if (ints(p, "axes", &n, axes) < 0) return -1;
  Scope s = {0};
  return ct_set(&s, cts, 0, unreduce(&s, ct[0], &av[0], n, axes));
}

static int tr_cumsum(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                     const Params *p, Value **cts) {
  (void)in, (void)av, (void)lin, (void)nin;
  bool rev = false;
  int64_t axis;
  Value *r = params_get(p, "reverse");
  if (r && params_bool(p, "reverse", &rev) < 0) return -1;
  if (params_int(p, "axis", &axis) < 0) return -1;
  Params q;
  params_init(&q);
  params_add(&q, "axis", val_int(axis));
  params_add(&q, "reverse", val_bool(!rev));
  Scope s = {0};
  return ct_set(&s, cts, 0, ap(&s, P_CUMSUM, 1, ct, &q));
}

/* broadcast_in_dim: sum over the dimensions the broadcast made (new ones,
 * and size-1 ones it stretched), then the operand's shape back */
static int tr_broadcast_in_dim(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                               const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin;
  int nb, nd;
  int64_t bd[SHM_MAXDIM], shape[SHM_MAXDIM], axes[SHM_MAXDIM];
  if (ints(p, "broadcast_dimensions", &nb, bd) < 0 || ints(p, "shape", &nd, shape) < 0) return -1;
  int na = 0;
  for (int i = 0; i < nd; i++) {
    int k = -1;
    for (int j = 0; j < nb; j++)
      if (bd[j] == i) k = j;
    if (k < 0 || (av[0].shape[k] == 1 && shape[i] != 1)) axes[na++] = i;
  }
  Scope s = {0};
  return ct_set(&s, cts, 0, reshape(&s, reduce_sum(&s, ct[0], na, axes), av[0].ndim, av[0].shape));
}

/* reshape, squeeze, expand_dims: the operand's shape back */
static int tr_reshape(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                      const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin, (void)p;
  Scope s = {0};
  return ct_set(&s, cts, 0, reshape(&s, ct[0], av[0].ndim, av[0].shape));
}

static int tr_transpose(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                        const Params *p, Value **cts) {
  (void)in, (void)av, (void)lin, (void)nin;
  int n;
  int64_t perm[SHM_MAXDIM], inv[SHM_MAXDIM];
  if (ints(p, "permutation", &n, perm) < 0) return -1;
  for (int i = 0; i < n; i++) inv[perm[i]] = i;
  Params q;
  params_init(&q);
  params_add(&q, "permutation", val_int_tuple(n, inv));
  Scope s = {0};
  return ct_set(&s, cts, 0, ap(&s, P_TRANSPOSE, 1, ct, &q));
}

static int tr_rev(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                  const Params *p, Value **cts) {
  (void)in, (void)av, (void)lin, (void)nin;
  Scope s = {0};
  return ct_set(&s, cts, 0, same(&s, P_REV, 1, ct, p));
}

/* pad [x] with zeros by (lo, hi, interior) per dimension */
static Value *pad_zeros(Scope *s, Value *x, int nd, const int64_t *lo, const int64_t *hi,
                        const int64_t *it) {
  AVal a;
  if (!aval_ok(x, &a)) return NULL;
  Value *cfg = tuple_new((size_t)nd);
  if (!cfg) return NULL;
  for (int i = 0; i < nd; i++)
    tuple_set_steal(cfg, (size_t)i, val_int_tuple(3, (int64_t[]){lo[i], hi[i], it[i]}));
  Params q;
  params_init(&q);
  params_add(&q, "padding_config", cfg);
  AVal z = a;
  z.ndim = 0;
  return ap(s, P_PAD, 2, (Value *[]){x, zeros_of(s, &z)}, &q);
}

/* slice: the cotangent padded back into the operand's shape */
static int tr_slice(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                    const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin;
  int n, m;
  int64_t st[SHM_MAXDIM], li[SHM_MAXDIM], sd[SHM_MAXDIM], lo[SHM_MAXDIM], hi[SHM_MAXDIM],
      it[SHM_MAXDIM];
  if (ints(p, "start_indices", &n, st) < 0 || ints(p, "limit_indices", &m, li) < 0) return -1;
  Value *strides = params_get(p, "strides");
  for (int i = 0; i < n; i++) sd[i] = 1;
  if (strides && strides != VAL_NONE && ints(p, "strides", &m, sd) < 0) return -1;
  AVal ca;
  if (prim_value_aval(ct[0], &ca) < 0) return -1;
  for (int i = 0; i < n; i++) {
    int64_t k = ca.shape[i];
    lo[i] = st[i];
    it[i] = sd[i] - 1;
    hi[i] = av[0].shape[i] - (k > 0 ? st[i] + (k - 1) * sd[i] + 1 : st[i]);
  }
  Scope s = {0};
  return ct_set(&s, cts, 0, pad_zeros(&s, ct[0], n, lo, hi, it));
}

/* pad: the operand's cotangent is the strided slice where it landed; the
 * padding value's is the sum of the rest */
static int tr_pad(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                  const Params *p, Value **cts) {
  (void)in, (void)nin;
  int64_t lo[SHM_MAXDIM], hi[SHM_MAXDIM], it[SHM_MAXDIM];
  int nd = av[0].ndim;
  if (kern_padding_config(params_get(p, "padding_config"), nd, lo, hi, it) < 0) return -1;
  for (int i = 0; i < nd; i++)
    if (lo[i] < 0 || hi[i] < 0) return prim_rule_missing(P_PAD, "transpose with negative padding");
  int64_t st[SHM_MAXDIM], li[SHM_MAXDIM], sd[SHM_MAXDIM];
  for (int i = 0; i < nd; i++) {
    int64_t n = av[0].shape[i];
    st[i] = lo[i];
    sd[i] = it[i] + 1;
    li[i] = n > 0 ? lo[i] + (n - 1) * sd[i] + 1 : lo[i];
  }
  Scope s = {0};
  Params q;
  params_init(&q);
  params_add(&q, "start_indices", val_int_tuple(nd, st));
  params_add(&q, "limit_indices", val_int_tuple(nd, li));
  params_add(&q, "strides", val_int_tuple(nd, sd));
  Value *x = nd ? ap(&s, P_SLICE, 1, ct, &q) : (params_clear(&q), ct[0]);
  if (lin[1]) {
    Value *rest = sub(&s, sum_all(&s, ct[0]), sum_all(&s, x));
    if (!rest || (cts[1] = val_incref(rest), 0)) {
      scope_end(&s);
      return -1;
    }
  }
  if (!lin[0]) {
    scope_end(&s);
    return 0;
  }
  return ct_set(&s, cts, 0, x);
}

/* concatenate: each linear operand's slice of the cotangent */
static int tr_concatenate(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                          const Params *p, Value **cts) {
  (void)in;
  int64_t dim;
  if (params_int(p, "dimension", &dim) < 0) return -1;
  int nd = av[0].ndim;
  int64_t at = 0;
  for (int i = 0; i < nin; i++) {
    int64_t st[SHM_MAXDIM] = {0}, li[SHM_MAXDIM];
    for (int k = 0; k < nd; k++) li[k] = av[i].shape[k];
    st[dim] = at;
    li[dim] = at + av[i].shape[dim];
    at += av[i].shape[dim];
    if (!lin[i]) continue;
    Params q;
    params_init(&q);
    params_add(&q, "start_indices", val_int_tuple(nd, st));
    params_add(&q, "limit_indices", val_int_tuple(nd, li));
    params_add(&q, "strides", val_incref(VAL_NONE));
    Scope s = {0};
    if (ct_set(&s, cts, i, ap(&s, P_SLICE, 1, ct, &q)) < 0) return -1;
  }
  return 0;
}

/* dynamic_slice: the cotangent written into zeros at the same start */
static int tr_dynamic_slice(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                            const Params *p, Value **cts) {
  (void)lin, (void)p;
  Value *ops[SHM_MAXDIM + 2];
  Scope s = {0};
  ops[0] = zeros_of(&s, &av[0]);
  ops[1] = ct[0];
  for (int i = 1; i < nin; i++) ops[i + 1] = in[i];
  return ct_set(&s, cts, 0, ap(&s, P_DYNAMIC_UPDATE_SLICE, nin + 1, ops, NULL));
}

/* dynamic_update_slice: the operand's cotangent with the window zeroed,
 * the update's the window */
static int tr_dynamic_update_slice(Value **ct, Value **in, const AVal *av, const bool *lin,
                                   int nin, const Params *p, Value **cts) {
  (void)p;
  Value *ops[SHM_MAXDIM + 2];
  if (lin[0]) {
    Scope s = {0};
    ops[0] = ct[0];
    ops[1] = zeros_of(&s, &av[1]);
    for (int i = 2; i < nin; i++) ops[i] = in[i];
    if (ct_set(&s, cts, 0, ap(&s, P_DYNAMIC_UPDATE_SLICE, nin, ops, NULL)) < 0) return -1;
  }
  if (lin[1]) {
    Scope s = {0};
    ops[0] = ct[0];
    for (int i = 2; i < nin; i++) ops[i - 1] = in[i];
    Params q;
    params_init(&q);
    params_add(&q, "slice_sizes", val_int_tuple(av[1].ndim, av[1].shape));
    if (ct_set(&s, cts, 1, ap(&s, P_DYNAMIC_SLICE, nin - 1, ops, &q)) < 0) return -1;
  }
  return 0;
}

/* gather: the cotangent added back at the taken rows */
static int tr_gather(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                     const Params *p, Value **cts) {
  (void)lin, (void)nin;
  int64_t axis;
  if (params_int(p, "axis", &axis) < 0) return -1;
  Params q;
  params_init(&q);
  params_add(&q, "axis", val_int(axis));
  params_add(&q, "mode", str_from("add"));
  Scope s = {0};
  return ct_set(&s, cts, 0, ap(&s, P_SCATTER, 3, (Value *[]){zeros_of(&s, &av[0]), in[1], ct[0]}, &q));
}

/* scatter (set, add): the updates' cotangent is gathered at the rows;
 * under set, the operand's is zero at them; multiply, linear in the
 * operand only, scales its cotangent as it scaled the operand */
static int tr_scatter(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                      const Params *p, Value **cts) {
  (void)nin;
  Value *mode = params_get(p, "mode");
  const char *m = mode && mode->type == V_STR ? str_cstr(mode) : "set";
  bool set = !strcmp(m, "set");
  if (!strcmp(m, "multiply") && lin[0] && !lin[2]) {   /* a scaling of each position */
    Scope s = {0};
    return ct_set(&s, cts, 0, same(&s, P_SCATTER, 3, (Value *[]){ct[0], in[1], in[2]}, p));
  }
  if (!set && strcmp(m, "add")) return prim_rule_missing(P_SCATTER, "transpose");
  if (lin[1]) return prim_rule_missing(P_SCATTER, "transpose (linear indices)");
  int64_t axis;
  if (params_int(p, "axis", &axis) < 0) return -1;
  if (lin[0]) {
    Scope s = {0};
    Value *r = ct[0];
    if (set) r = same(&s, P_SCATTER, 3, (Value *[]){ct[0], in[1], zeros_of(&s, &av[2])}, p);
    if (ct_set(&s, cts, 0, r) < 0) return -1;
  }
  if (lin[2]) {
    Params q;
    params_init(&q);
    params_add(&q, "axis", val_int(axis));
    Scope s = {0};
    if (ct_set(&s, cts, 2, ap(&s, P_GATHER, 2, (Value *[]){ct[0], in[1]}, &q)) < 0) return -1;
  }
  return 0;
}

/* ==== installing ========================================================== */

void prim_ad_install(void) {
#define J(ID, name) prim_table[P_##ID].rules.jvp = jvp_##name;
#define T(ID, name) prim_table[P_##ID].rules.transpose = tr_##name;
  J(NEG, neg) J(SIGN, sign) J(FLOOR, floor) J(CEIL, ceil) J(ROUND, round)
  J(IS_FINITE, is_finite) J(EXP, exp) J(LOG, log) J(LOG1P, log1p) J(EXPM1, expm1)
  J(TANH, tanh) J(LOGISTIC, logistic) J(SIN, sin) J(COS, cos) J(TAN, tan) J(ASIN, asin)
  J(ACOS, acos) J(ATAN, atan) J(SINH, sinh) J(COSH, cosh) J(SQRT, sqrt) J(RSQRT, rsqrt)
  J(ABS, abs) J(NOT, not) J(INTEGER_POW, integer_pow)
  J(CONVERT_ELEMENT_TYPE, convert_element_type) J(COPY, copy)
  J(ADD, add) J(SUB, sub) J(MUL, mul) J(DIV, div) J(REM, rem) J(POW, pow) J(MAX, max)
  J(MIN, min) J(ATAN2, atan2) J(AND, and) J(OR, or) J(XOR, xor) J(EQ, eq) J(NE, ne)
  J(LT, lt) J(LE, le) J(GT, gt) J(GE, ge) J(SELECT_N, select_n) J(CLAMP, clamp)
  J(REDUCE_SUM, reduce_sum) J(REDUCE_MAX, reduce_max) J(REDUCE_MIN, reduce_min)
  J(REDUCE_PROD, reduce_prod)
  J(REDUCE_AND, reduce_and) J(REDUCE_OR, reduce_or) J(ARGMAX, argmax) J(ARGMIN, argmin)
  J(CUMSUM, cumsum) J(CUMPROD, cumprod) J(CUMMAX, cummax) J(IOTA, iota) J(BROADCAST_IN_DIM, broadcast_in_dim) J(RESHAPE, reshape)
  J(TRANSPOSE, transpose) J(SQUEEZE, squeeze) J(EXPAND_DIMS, expand_dims) J(REV, rev)
  J(SLICE, slice) J(DYNAMIC_SLICE, dynamic_slice) J(DYNAMIC_UPDATE_SLICE, dynamic_update_slice)
  J(CONCATENATE, concatenate) J(PAD, pad) J(GATHER, gather) J(SCATTER, scatter)
  J(DOT_GENERAL, dot_general) J(SORT, sort) J(ARGSORT, argsort)

  T(NEG, neg) T(COPY, copy) T(CONVERT_ELEMENT_TYPE, convert_element_type) T(ADD, add)
  T(SUB, sub) T(MUL, mul) T(DIV, div) T(SELECT_N, select_n) T(REDUCE_SUM, reduce_sum)
  T(CUMSUM, cumsum) T(BROADCAST_IN_DIM, broadcast_in_dim) T(RESHAPE, reshape)
  T(SQUEEZE, reshape) T(EXPAND_DIMS, reshape) T(TRANSPOSE, transpose) T(REV, rev)
  T(SLICE, slice) T(PAD, pad) T(CONCATENATE, concatenate) T(DYNAMIC_SLICE, dynamic_slice)
  T(DYNAMIC_UPDATE_SLICE, dynamic_update_slice) T(GATHER, gather) T(SCATTER, scatter)
  T(DOT_GENERAL, dot_general)
#undef J
#undef T
}
