/*
 * test_kernels.c - the primitives through prim_apply: shape rules and their
 * error messages, elementwise arithmetic (integer corner cases, NaN, 16-bit
 * floats), the vectorised float32 transcendental functions, reductions,
 * scans and the layout kernels (views, clamping, padding, gather/scatter,
 * sort).  Expected values are lax's semantics.
 */
#include <check.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "array/kernels.h"
#include "array/prim.h"
#include "array/prim_random.h"

/* ---- helpers --------------------------------------------------------------- */

/* A new array of dtype [t] and [shape] holding [vals] (converted). */
static Value *mk(DType t, int ndim, const int64_t *shape, const double *vals) {
  Array *a = arr_new(t, ndim, shape);
  ck_assert_ptr_nonnull(a);
  kern_convert(arr_data(a), t, vals, DT_F64, a->size);
  return &a->hdr;
}

static Value *vec(DType t, int64_t n, const double *vals) { return mk(t, 1, &n, vals); }

static Value *scalar(DType t, double x, bool weak) {
  return &arr_scalar_f64(t, x, weak)->hdr;
}

/* Asserts [v] is an array of [n] elements equal to [want] (NaN matches NaN). */
static void expect(Value *v, int64_t n, const double *want) {
  ck_assert_msg(v != NULL, "error: %s", err_occurred() ? err_message() : "?");
  Array *a = AS_ARRAY(v);
  ck_assert_int_eq(a->size, n);
  for (int64_t i = 0; i < n; i++) {
    double g = arr_get_f64(a, i);
    ck_assert_msg((isnan(g) && isnan(want[i])) || g == want[i],
                  "element %ld: got %.9g, want %.9g", (long)i, g, want[i]);
  }
}

static Value *apply1(PrimId id, Value *a, Params *p) {
  Value *in[1] = {a};
  Value *r = prim_apply(id, 1, in, p);
  params_clear(p);
  return r;
}

static Value *apply2(PrimId id, Value *a, Value *b) {
  Params p;
  params_init(&p);
  Value *in[2] = {a, b};
  return prim_apply(id, 2, in, &p);
}

static Params one(const char *name, Value *v) {
  Params p;
  params_init(&p);
  params_add(&p, name, v);
  return p;
}

static Value *ints(int n, const int64_t *xs) { return val_int_tuple(n, xs); }

/* ---- elementwise ------------------------------------------------------------------ */

START_TEST(test_add_scalar_broadcast) {
  Value *x = vec(DT_F32, 3, (double[]){1, 2, 3});
  Value *c = scalar(DT_F32, 0.5, true);
  val_incref(x);   /* held elsewhere, like a variable: must not be reused */
  Value *r = apply2(P_ADD, x, c);
  expect(r, 3, (double[]){1.5, 2.5, 3.5});
  ck_assert(r != x);
  ck_assert(!AS_ARRAY(r)->weak);   /* weak only if all operands are */
  expect(x, 3, (double[]){1, 2, 3});
  Value *w = apply2(P_MUL, c, c);
  ck_assert(AS_ARRAY(w)->weak);
  val_decref(w);
  val_decref(r);
  val_decref(x);
  val_decref(x);
  val_decref(c);
}
END_TEST

START_TEST(test_inplace_reuse) {
  Value *x = vec(DT_F32, 4, (double[]){1, 2, 3, 4});
  Value *y = vec(DT_F32, 4, (double[]){1, 1, 1, 1});
  val_incref(x);
  val_incref(y);
  Value *t = apply2(P_MUL, x, y);        /* a temporary, refcount 1 */
  Value *r = apply2(P_ADD, t, y);        /* reuses t's buffer */
  ck_assert_ptr_eq(r, t);
  expect(r, 4, (double[]){2, 3, 4, 5});
  val_decref(t);
  val_decref(r);
  expect(x, 4, (double[]){1, 2, 3, 4});
  val_decref(x);
  val_decref(x);
  val_decref(y);
  val_decref(y);
}
END_TEST

/* prim_binary_into writes into the destination only when a new array
 * would be the same: held by nothing else, of the result's dtype and
 * shape, contiguous; the destination may be an operand. */
START_TEST(test_binary_into) {
  Value *x = vec(DT_F32, 4, (double[]){1, 2, 3, 4});
  Value *y = vec(DT_F32, 4, (double[]){10, 20, 30, 40});
  Value *d = vec(DT_F32, 4, (double[]){0, 0, 0, 0});
  ck_assert(prim_binary_into(P_ADD, x, y, d));
  expect(d, 4, (double[]){11, 22, 33, 44});
  ck_assert(prim_binary_into(P_MUL, d, x, d));           /* d = d * x */
  expect(d, 4, (double[]){11, 44, 99, 176});
  Value *h = scalar(DT_F32, 2, false);
  ck_assert(prim_binary_into(P_SUB, d, h, d));           /* a 0-d operand */
  expect(d, 4, (double[]){9, 42, 97, 174});
  val_incref(d);                                         /* held twice: left alone */
  ck_assert(!prim_binary_into(P_ADD, x, y, d));
  expect(d, 4, (double[]){9, 42, 97, 174});
  val_decref(d);
  Value *i = vec(DT_I32, 4, (double[]){1, 2, 3, 4});
  ck_assert(!prim_binary_into(P_ADD, i, i, d));          /* another dtype */
  ck_assert(!prim_binary_into(P_LT, x, y, d));           /* the result is bool */
  Value *m = vec(DT_BOOL, 4, (double[]){0, 0, 0, 0});
  ck_assert(prim_binary_into(P_LT, x, y, m));            /* ...into a bool array */
  expect(m, 4, (double[]){1, 1, 1, 1});
  ck_assert(!AS_ARRAY(m)->weak);
  ck_assert(!prim_binary_into(P_ADD, x, y, m));
  ck_assert(prim_binary_into(P_DIV, y, x, d));
  expect(d, 4, (double[]){10, 10, 10, 10});
  val_decref(m);
  Value *s = vec(DT_F32, 3, (double[]){1, 2, 3});
  ck_assert(!prim_binary_into(P_ADD, s, s, d));          /* another shape */
  ck_assert(!prim_binary_into(P_ADD, h, h, d));          /* a 0-d result */
  ck_assert(!prim_binary_into(P_ADD, x, i, d));          /* operands disagree */
  Value *w = scalar(DT_F32, 1, true), *wd = scalar(DT_F32, 0, false);
  ck_assert(prim_binary_into(P_ADD, w, w, wd));          /* weak only if all are */
  ck_assert(AS_ARRAY(wd)->weak);
  ck_assert(prim_binary_into(P_ADD, w, h, wd));
  ck_assert(!AS_ARRAY(wd)->weak);
  expect(wd, 1, (double[]){3});
  Value *vals[] = {x, y, d, h, i, s, w, wd};
  for (int k = 0; k < 8; k++) val_decref(vals[k]);
}
END_TEST

START_TEST(test_binary_into_2d) {
  int64_t sh[2] = {2, 3}, tsh[2] = {3, 2};
  Value *m = mk(DT_F32, 2, sh, (double[]){0, 1, 2, 3, 4, 5});
  Value *d = mk(DT_F32, 2, sh, (double[]){0, 0, 0, 0, 0, 0});
  ck_assert(prim_binary_into(P_ADD, m, m, d));          /* contiguous, d's shape */
  expect(d, 6, (double[]){0, 2, 4, 6, 8, 10});
  Value *row = vec(DT_F32, 3, (double[]){1, 1, 1});
  Value *flat = vec(DT_F32, 6, (double[]){1, 1, 1, 1, 1, 1});
  Value *mt = mk(DT_F32, 2, tsh, (double[]){0, 1, 2, 3, 4, 5});
  Params p = one("permutation", ints(2, (int64_t[]){1, 0}));
  Value *t = apply1(P_TRANSPOSE, mt, &p);              /* a (2, 3) view, not contiguous */
  ck_assert(!prim_binary_into(P_ADD, m, row, d));       /* a row broadcast over d */
  ck_assert(!prim_binary_into(P_ADD, flat, flat, d));   /* as many elements, other rank */
  ck_assert(!prim_binary_into(P_ADD, t, m, d));         /* rows of another layout */
  ck_assert(!prim_binary_into(P_ADD, m, m, flat));      /* a 1-d result of 2-d operands */
  expect(d, 6, (double[]){0, 2, 4, 6, 8, 10});
  expect(flat, 6, (double[]){1, 1, 1, 1, 1, 1});
  Value *vals[] = {m, d, row, flat, mt, t};
  for (int k = 0; k < 6; k++) val_decref(vals[k]);
}
END_TEST

START_TEST(test_int_division) {
  Value *a = vec(DT_I32, 5, (double[]){7, -7, 7, 5, -2147483648.0});
  Value *b = vec(DT_I32, 5, (double[]){-2, 2, 0, 0, -1});
  val_incref(a);
  val_incref(b);
  Value *q = apply2(P_DIV, a, b);
  expect(q, 5, (double[]){-3, -3, 0, 0, -2147483648.0});   /* truncates; /0 gives 0 */
  Value *r = apply2(P_REM, a, b);
  expect(r, 5, (double[]){1, -1, 0, 0, 0});                /* sign of the dividend */
  val_decref(q);
  val_decref(r);
  val_decref(a);
  val_decref(b);
  val_decref(a);
  val_decref(b);
}
END_TEST

START_TEST(test_int_wraps) {
  Value *a = vec(DT_I8, 2, (double[]){127, -128});
  Value *b = vec(DT_I8, 2, (double[]){1, -1});
  val_incref(a);
  Value *s = apply2(P_ADD, a, b);
  expect(s, 2, (double[]){-128, 127});
  Params p;
  params_init(&p);
  Value *n = apply1(P_NEG, a, &p);
  expect(n, 2, (double[]){-127, -128});
  val_decref(n);
  val_decref(s);
  val_decref(a);
  val_decref(a);
  val_decref(b);
}
END_TEST

START_TEST(test_compare_and_nan) {
  Value *a = vec(DT_F32, 3, (double[]){1, NAN, 3});
  Value *b = vec(DT_F32, 3, (double[]){2, 1, NAN});
  val_incref(a);
  val_incref(b);
  Value *lt = apply2(P_LT, a, b);
  ck_assert_int_eq(AS_ARRAY(lt)->dtype, DT_BOOL);
  expect(lt, 3, (double[]){1, 0, 0});
  Value *ne = apply2(P_NE, a, b);
  expect(ne, 3, (double[]){1, 1, 1});
  Value *mx = apply2(P_MAX, a, b);
  expect(mx, 3, (double[]){2, NAN, NAN});   /* lax.max propagates NaN */
  Value *mn = apply2(P_MIN, a, b);
  expect(mn, 3, (double[]){1, NAN, NAN});
  val_decref(lt);
  val_decref(ne);
  val_decref(mx);
  val_decref(mn);
  val_decref(a);
  val_decref(b);
  val_decref(a);
  val_decref(b);
}
END_TEST

START_TEST(test_binary_errors) {
  Value *a = vec(DT_F32, 3, (double[]){1, 2, 3});
  Value *b = vec(DT_F32, 4, (double[]){1, 2, 3, 4});
  Value *c = vec(DT_I32, 3, (double[]){1, 2, 3});
  ck_assert_ptr_null(apply2(P_ADD, a, b));
  ck_assert_str_eq(err_message(), "add got incompatible shapes for broadcasting: (4,), (3,)");
  err_clear();
  ck_assert_ptr_null(apply2(P_MUL, a, c));
  ck_assert_str_eq(err_message(),
                   "mul requires arguments to have the same dtypes, got float32, int32");
  err_clear();
  Params p;
  params_init(&p);
  ck_assert_ptr_null(apply1(P_SIN, c, &p));
  ck_assert_int_eq(err_kind(), ERR_TYPE);
  ck_assert(strstr(err_message(), "sin does not accept dtype int32") != NULL);
  err_clear();
  Value *s = str_from("x");
  ck_assert_ptr_null(apply2(P_ADD, a, s));
  ck_assert_int_eq(err_kind(), ERR_TYPE);
  err_clear();
  Value *in[1] = {a};
  ck_assert_ptr_null(prim_apply(P_ADD, 1, in, &p));
  err_clear();
  val_decref(s);
  val_decref(a);
  val_decref(b);
  val_decref(c);
}
END_TEST

START_TEST(test_strided_operands) {
  int64_t shape[2] = {2, 3};
  Value *a = mk(DT_F32, 2, shape, (double[]){0, 1, 2, 3, 4, 5});
  Params p = one("permutation", ints(2, (int64_t[]){1, 0}));
  Value *t = apply1(P_TRANSPOSE, a, &p);            /* a view, shape (3, 2) */
  ck_assert(!AS_ARRAY(t)->contiguous);
  ck_assert_ptr_eq(AS_ARRAY(t)->buf, AS_ARRAY(a)->buf);
  Value *r = apply2(P_ADD, t, t);
  expect(r, 6, (double[]){0, 6, 2, 8, 4, 10});
  val_decref(r);
  Value *row = vec(DT_F32, 3, (double[]){10, 20, 30});
  p = one("shape", ints(2, (int64_t[]){2, 3}));
  params_add(&p, "broadcast_dimensions", ints(1, (int64_t[]){1}));
  Value *rb = apply1(P_BROADCAST_IN_DIM, row, &p);   /* zero row stride */
  r = apply2(P_SUB, a, rb);
  expect(r, 6, (double[]){-10, -19, -28, -7, -16, -25});
  val_decref(r);
  val_decref(rb);
  val_decref(row);
  val_decref(t);
  val_decref(a);
}
END_TEST

START_TEST(test_large_split) {
  /* big enough to be split across two threads: every element checked */
  int64_t n = 3000001;
  Array *x = arr_new(DT_F32, 1, &n), *y = arr_new(DT_F32, 1, &n);
  float *xd = arr_data(x), *yd = arr_data(y);
  for (int64_t i = 0; i < n; i++) {
    xd[i] = (float)(i % 1000) * 0.001f;
    yd[i] = 2.0f;
  }
  val_incref(&x->hdr);
  val_incref(&y->hdr);
  Value *m = apply2(P_MUL, &x->hdr, &y->hdr);
  Params p;
  params_init(&p);
  Value *s = apply1(P_SIN, &x->hdr, &p);
  const float *md = arr_data(AS_ARRAY(m)), *sd = arr_data(AS_ARRAY(s));
  for (int64_t i = 0; i < n; i++) {
    ck_assert(md[i] == xd[i] * 2.0f);
    ck_assert(fabsf(sd[i] - sinf(xd[i])) <= 2e-7f);
  }
  val_decref(m);
  val_decref(s);
  for (int k = 0; k < 2; k++) {
    val_decref(&x->hdr);
    val_decref(&y->hdr);
  }
}
END_TEST

/* kern_parallel hands out every index once, in ranges starting at
 * multiples of align, whatever the length and whichever thread is
 * faster. */
typedef struct Cover {
  _Atomic unsigned char *seen;
  int64_t align;
  atomic_int misaligned;
} Cover;

static void cover_range(const void *ctx, int64_t lo, int64_t hi) {
  const Cover *c = ctx;
  if (lo % c->align)
    atomic_fetch_add((atomic_int *)&c->misaligned, 1);
  for (int64_t i = lo; i < hi; i++)
    atomic_fetch_add(&c->seen[i], 1);
}

START_TEST(test_parallel_cover) {
  static const int64_t lengths[] = {1000, 4097, 64 * 1024 + 7, 100003};
  static const int64_t aligns[] = {1024, 1, 7};
  for (size_t a = 0; a < 3; a++)
    for (size_t k = 0; k < 4; k++) {
      int64_t n = lengths[k];
      Cover c = {calloc((size_t)n, 1), aligns[a], 0};
      ck_assert(c.seen != NULL);
      kern_parallel(cover_range, &c, n, 1000, c.align);
      for (int64_t i = 0; i < n; i++)
        ck_assert_msg(c.seen[i] == 1, "n=%ld: index %ld taken %d times", (long)n, (long)i,
                      c.seen[i]);
      ck_assert_int_eq(atomic_load(&c.misaligned), 0);
      free((void *)c.seen);
    }
}
END_TEST

START_TEST(test_half_arithmetic) {
  Value *a = vec(DT_BF16, 3, (double[]){1, 2, 3});
  Value *b = vec(DT_BF16, 3, (double[]){0.5, 0.25, 256});
  Value *r = apply2(P_ADD, a, b);
  ck_assert_int_eq(AS_ARRAY(r)->dtype, DT_BF16);
  expect(r, 3, (double[]){1.5, 2.25, 260});   /* 259 ties to the even 260 in bf16 */
  Value *h = vec(DT_F16, 2, (double[]){60000, 1});
  Value *hh = apply2(P_ADD, h, h);
  expect(hh, 2, (double[]){INFINITY, 2});
  ck_assert_ptr_eq(hh, h);   /* h's one holder passed it: reused in place */
  val_decref(r);
  val_decref(hh);
  val_decref(h);
  val_decref(a);
  val_decref(b);
}
END_TEST

/* Largest error of [f] against [ref] in units of the float32 result's ulp. */
static double max_ulp(void (*f)(const float *, float *, int64_t), double (*ref)(double),
                      float lo, float hi, int n) {
  float *x = malloc(sizeof(float) * (size_t)n), *y = malloc(sizeof(float) * (size_t)n);
  for (int i = 0; i < n; i++)
    x[i] = lo + (hi - lo) * (float)i / (float)n;
  f(x, y, n);
  double worst = 0;
  for (int i = 0; i < n; i++) {
    double r = ref((double)x[i]);
    float rf = (float)r;
    double ulp = nextafterf(fabsf(rf), INFINITY) - fabsf(rf);
    double e = fabs(y[i] - r) / ulp;
    if (e > worst)
      worst = e;
  }
  free(x);
  free(y);
  return worst;
}

/* tanh and logistic through prim_apply, in max_ulp's shape. */
static void via_prim(PrimId id, const float *x, float *y, int64_t n) {
  Array *a = arr_new(DT_F32, 1, &n);
  memcpy(arr_data(a), x, sizeof(float) * (size_t)n);
  Params p;
  params_init(&p);
  Value *r = apply1(id, &a->hdr, &p);
  memcpy(y, arr_data(AS_ARRAY(r)), sizeof(float) * (size_t)n);
  val_decref(r);
  val_decref(&a->hdr);
}
static void tanh_f32(const float *x, float *y, int64_t n) { via_prim(P_TANH, x, y, n); }
static void logistic_f32(const float *x, float *y, int64_t n) { via_prim(P_LOGISTIC, x, y, n); }
static double logistic_ref(double x) { return 1.0 / (1.0 + exp(-x)); }

START_TEST(test_transcendental_accuracy) {
  ck_assert_double_le(max_ulp(tanh_f32, tanh, -12.f, 12.f, 1000003), 3.0);
  ck_assert_double_le(max_ulp(tanh_f32, tanh, -1.f, 1.f, 1000003), 3.0);
  ck_assert_double_le(max_ulp(logistic_f32, logistic_ref, -20.f, 20.f, 1000003), 3.0);
  ck_assert_double_le(max_ulp(kern_sin_f32, sin, -20000.f, 20000.f, 1000003), 2.0);
  ck_assert_double_le(max_ulp(kern_cos_f32, cos, -20000.f, 20000.f, 1000003), 2.0);
  /* blocks within [-6, 6] take the all-float path */
  ck_assert_double_le(max_ulp(kern_sin_f32, sin, -6.f, 6.f, 1000003), 2.0);
  ck_assert_double_le(max_ulp(kern_cos_f32, cos, -6.f, 6.f, 1000003), 2.0);
  ck_assert_double_le(max_ulp(kern_exp_f32, exp, -87.f, 88.f, 1000003), 2.0);
  ck_assert_double_le(max_ulp(kern_log_f32, log, 1e-30f, 1e30f, 1000003), 2.0);
  ck_assert_double_le(max_ulp(kern_log_f32, log, 0.5f, 2.f, 1000003), 2.0);
}
END_TEST

/* Every lane of the vectorised loops computes what the one-element call
 * (the loop's scalar remainder) does, bit for bit, over the same inputs:
 * the kernels must vectorise without changing a result (they are compiled
 * with no-trapping-math so the selections become blends). */
typedef void (*VecFn)(const float *, float *, int64_t);
static void check_lanes_match_scalar(VecFn fn, float lo, float hi) {
  enum { N = 30011 };
  float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
  ck_assert(x && y);
  for (int i = 0; i < N; i++)
    x[i] = lo + (hi - lo) * (float)i / (float)(N - 1);
  x[17] = NAN;
  x[18] = INFINITY;
  x[19] = -0.0f;
  fn(x, y, N);
  for (int i = 0; i < N; i++) {
    float s;
    fn(x + i, &s, 1);
    ck_assert_msg(memcmp(&s, y + i, sizeof s) == 0, "x=%a: lane %a, scalar %a", x[i], y[i], s);
  }
  free(x);
  free(y);
}

START_TEST(test_transcendental_lanes_match_scalar) {
  check_lanes_match_scalar(kern_sin_f32, -6.f, 6.f);
  check_lanes_match_scalar(kern_sin_f32, -2e5f, 2e5f);
  check_lanes_match_scalar(kern_cos_f32, -6.f, 6.f);
  check_lanes_match_scalar(kern_cos_f32, -2e5f, 2e5f);
  check_lanes_match_scalar(kern_exp_f32, -100.f, 100.f);
  check_lanes_match_scalar(kern_log_f32, -1.f, 1e6f);
  check_lanes_match_scalar(tanh_f32, -12.f, 12.f);
  check_lanes_match_scalar(logistic_f32, -100.f, 100.f);
}
END_TEST

/* sin and cos of an element do not depend on its neighbours: arguments
 * of every range side by side in one block (small, reduced in double,
 * past libm's threshold) give what each gives alone, out of place and in
 * place. */
static void check_mixed_ranges(VecFn fn) {
  enum { N = 3001 };
  static const float big[] = {7.5f, -123.25f, 4321.5f, 2.5e5f, -1e30f};
  float x[N], y[N], z[N];
  for (int i = 0; i < N; i++)
    x[i] = i % 4 == 3 ? big[i / 4 % 5] : (float)(i % 97) * 0.061f - 2.9f;
  x[5] = NAN;
  x[9] = -INFINITY;
  fn(x, y, N);
  memcpy(z, x, sizeof z);
  fn(z, z, N);
  for (int i = 0; i < N; i++) {
    float s;
    fn(x + i, &s, 1);
    ck_assert_msg(memcmp(&s, y + i, sizeof s) == 0, "x=%a: in a block %a, alone %a", x[i], y[i], s);
    ck_assert(memcmp(z + i, y + i, sizeof s) == 0);
  }
}

START_TEST(test_trig_elementwise_pure) {
  check_mixed_ranges(kern_sin_f32);
  check_mixed_ranges(kern_cos_f32);
}
END_TEST

START_TEST(test_transcendental_specials) {
  float x[8] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-45f, -1.0f, 1e30f};
  float y[8];
  kern_log_f32(x, y, 8);
  ck_assert(isinf(y[0]) && y[0] < 0);
  ck_assert(isinf(y[2]) && y[2] > 0);
  ck_assert(isnan(y[3]) && isnan(y[4]) && isnan(y[6]));
  ck_assert(fabsf(y[5] - logf(1e-45f)) < 1e-4f);   /* subnormal input */
  kern_exp_f32(x, y, 8);
  ck_assert(y[0] == 1.0f && y[2] == INFINITY && y[3] == 0.0f && isnan(y[4]));
  ck_assert(y[7] == INFINITY);
  kern_sin_f32(x, y, 8);
  ck_assert(y[0] == 0.0f && isnan(y[2]) && isnan(y[4]));
  ck_assert(fabsf(y[7] - sinf(1e30f)) <= 1e-7f);   /* huge: through libm */
  /* in place */
  float z[3] = {0.5f, 1.0f, 2.0f};
  kern_exp_f32(z, z, 3);
  ck_assert(fabsf(z[2] - expf(2.0f)) < 1e-6f);
}
END_TEST

START_TEST(test_unary_prims) {
  Params p;
  Value *x = vec(DT_F32, 4, (double[]){-1.5, -0.5, 0.5, 2.5});
  val_incref(x);
  params_init(&p);
  Value *f = apply1(P_FLOOR, x, &p);
  expect(f, 4, (double[]){-2, -1, 0, 2});
  val_decref(f);
  p = one("rounding_method", val_int(1));
  Value *r = apply1(P_ROUND, x, &p);
  expect(r, 4, (double[]){-2, -0.0, 0, 2});
  val_decref(r);
  p = one("rounding_method", val_int(0));
  r = apply1(P_ROUND, x, &p);
  expect(r, 4, (double[]){-2, -1, 1, 3});
  val_decref(r);
  params_init(&p);
  r = apply1(P_SIGN, x, &p);
  expect(r, 4, (double[]){-1, -1, 1, 1});
  val_decref(r);
  p = one("y", val_int(3));
  r = apply1(P_INTEGER_POW, x, &p);
  expect(r, 4, (double[]){-3.375, -0.125, 0.125, 15.625});
  val_decref(r);
  p = one("y", val_int(-2));
  r = apply1(P_INTEGER_POW, x, &p);
  expect(r, 4, (double[]){1.0f / 2.25f, 4, 4, 1.0f / 6.25f});
  val_decref(r);
  params_init(&p);
  params_add(&p, "new_dtype", dtype_value(DT_I32));
  params_add(&p, "weak_type", val_bool(true));
  r = apply1(P_CONVERT_ELEMENT_TYPE, x, &p);
  ck_assert_int_eq(AS_ARRAY(r)->dtype, DT_I32);
  ck_assert(AS_ARRAY(r)->weak);
  expect(r, 4, (double[]){-1, 0, 0, 2});
  val_decref(r);
  params_init(&p);
  r = apply1(P_IS_FINITE, x, &p);
  ck_assert_int_eq(AS_ARRAY(r)->dtype, DT_BOOL);
  val_decref(r);
  val_decref(x);
  val_decref(x);
}
END_TEST

START_TEST(test_select_and_clamp) {
  Value *w = vec(DT_BOOL, 3, (double[]){0, 1, 0});
  Value *a = vec(DT_F32, 3, (double[]){1, 2, 3});
  Value *b = vec(DT_F32, 3, (double[]){10, 20, 30});
  val_incref(a);   /* held: select_n must not write into it */
  val_incref(b);
  Params p;
  params_init(&p);
  Value *in[3] = {w, a, b};
  Value *r = prim_apply(P_SELECT_N, 3, in, &p);
  expect(r, 3, (double[]){1, 20, 3});   /* case 0 where false */
  val_decref(r);
  Value *lo = scalar(DT_F32, 1.5, false), *hi = scalar(DT_F32, 2.5, false);
  Value *cin[3] = {lo, a, hi};
  r = prim_apply(P_CLAMP, 3, cin, &p);
  expect(r, 3, (double[]){1.5, 2, 2.5});
  val_decref(r);
  val_decref(a);
  val_decref(lo);
  val_decref(hi);
  val_decref(w);
  val_decref(a);
  val_decref(b);
  val_decref(b);
}
END_TEST

/* ---- reductions ------------------------------------------------------------------------ */

static Value *reduce(PrimId id, Value *x, int n, const int64_t *axes) {
  Params p = one("axes", ints(n, axes));
  return apply1(id, x, &p);
}

START_TEST(test_reduce_axes) {
  int64_t shape[3] = {2, 3, 2};
  double v[12];
  for (int i = 0; i < 12; i++)
    v[i] = i;
  Value *x = mk(DT_I32, 3, shape, v);
  Value *r = reduce(P_REDUCE_SUM, x, 1, (int64_t[]){1});
  expect(r, 4, (double[]){6, 9, 24, 27});
  val_decref(r);
  r = reduce(P_REDUCE_SUM, x, 2, (int64_t[]){0, 2});
  expect(r, 3, (double[]){14, 22, 30});
  val_decref(r);
  r = reduce(P_REDUCE_MAX, x, 1, (int64_t[]){0});
  expect(r, 6, (double[]){6, 7, 8, 9, 10, 11});
  val_decref(r);
  r = reduce(P_REDUCE_SUM, x, 3, (int64_t[]){0, 1, 2});
  ck_assert_int_eq(AS_ARRAY(r)->ndim, 0);
  expect(r, 1, (double[]){66});
  val_decref(r);
  ck_assert_ptr_null(reduce(P_REDUCE_SUM, x, 1, (int64_t[]){3}));
  ck_assert_str_eq(err_message(), "axis 3 is out of bounds for array of dimension 3");
  err_clear();
  val_decref(x);
}
END_TEST

START_TEST(test_sum_accuracy) {
  int64_t n = 10000000;
  Array *x = arr_new(DT_F32, 1, &n);
  float *d = arr_data(x);
  for (int64_t i = 0; i < n; i++)
    d[i] = 0.1f;
  Value *r = reduce(P_REDUCE_SUM, &x->hdr, 1, (int64_t[]){0});
  double want = 0.1f * (double)n;
  ck_assert_double_le(fabs(arr_get_f64(AS_ARRAY(r), 0) - want) / want, 1e-6);
  val_decref(r);
  val_decref(&x->hdr);
}
END_TEST

/* The pairwise sum as kern_reduce.c documents it, one add at a time: a
 * run of up to 256 folds its halves (an odd element joins the first),
 * a longer one splits at half rounded down to 16 and sums both parts. */
static float ref_fold(const float *x, int64_t n) {
  float t[128];
  if (n < 2)
    return n ? x[0] : 0;
  int64_t h = n / 2;
  for (int64_t i = 0; i < h; i++)
    t[i] = x[i] + x[i + h];
  if (n & 1)
    t[0] += x[n - 1];
  for (; h > 1; h /= 2) {
    for (int64_t i = 0; i < h / 2; i++)
      t[i] += t[i + h / 2];
    if (h & 1)
      t[0] += t[h - 1];
  }
  return t[0];
}
static float ref_pairwise(const float *x, int64_t n) {
  if (n <= 256)
    return ref_fold(x, n);
  int64_t m = n / 2 / 16 * 16;
  return ref_pairwise(x, m) + ref_pairwise(x + m, n - m);
}

/* kern_sum_f32's whole-block fast path adds in the documented order, bit
 * for bit, as the runs of other lengths do (fused sums rely on it). */
START_TEST(test_sum_pairwise_order) {
  enum { N = 5000 };
  float x[N];
  for (int i = 0; i < N; i++)
    x[i] = cosf((float)i * 0.37f) * 1000.0f + (float)i * 1e-3f;
  static const int64_t sizes[] = {0, 1, 2, 3, 17, 255, 256, 257, 512, 1000, 2048, 4999};
  for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
    float got = kern_sum_f32(x + 1, sizes[k]), want = ref_pairwise(x + 1, sizes[k]);
    ck_assert_msg(memcmp(&got, &want, sizeof got) == 0, "n=%ld: %a, want %a", (long)sizes[k],
                  got, want);
  }
}
END_TEST

START_TEST(test_reduce_nan_and_empty) {
  Value *x = vec(DT_F32, 4, (double[]){1, NAN, 5, 2});
  Value *r = reduce(P_REDUCE_MAX, x, 1, (int64_t[]){0});
  expect(r, 1, (double[]){NAN});
  val_decref(r);
  int64_t shape[2] = {0, 3};
  Value *e = mk(DT_F32, 2, shape, NULL);
  r = reduce(P_REDUCE_SUM, e, 1, (int64_t[]){0});
  expect(r, 3, (double[]){0, 0, 0});
  val_decref(r);
  r = reduce(P_REDUCE_MAX, e, 1, (int64_t[]){0});
  expect(r, 3, (double[]){-INFINITY, -INFINITY, -INFINITY});
  val_decref(r);
  val_decref(e);
  val_decref(x);
}
END_TEST

START_TEST(test_argmax) {
  Value *x = vec(DT_F32, 5, (double[]){1, 5, 2, 5, 0});
  Params p;
  params_init(&p);
  params_add(&p, "axes", ints(1, (int64_t[]){0}));
  params_add(&p, "index_dtype", dtype_value(DT_I32));
  Value *r = apply1(P_ARGMAX, x, &p);
  ck_assert_int_eq(AS_ARRAY(r)->dtype, DT_I32);
  expect(r, 1, (double[]){1});   /* the first maximum */
  val_decref(r);
  Value *y = vec(DT_F32, 3, (double[]){1, NAN, 3});
  params_add(&p, "axes", ints(1, (int64_t[]){0}));
  params_add(&p, "index_dtype", dtype_value(DT_I32));
  r = apply1(P_ARGMIN, y, &p);
  expect(r, 1, (double[]){1});   /* NaN wins */
  val_decref(r);
  int64_t shape[2] = {2, 3};
  Value *m = mk(DT_I32, 2, shape, (double[]){3, 1, 2, 0, 4, 4});
  params_add(&p, "axes", ints(1, (int64_t[]){1}));
  params_add(&p, "index_dtype", dtype_value(DT_I64));
  r = apply1(P_ARGMAX, m, &p);
  expect(r, 2, (double[]){0, 1});
  val_decref(r);
  val_decref(m);
  val_decref(x);
  val_decref(y);
}
END_TEST

START_TEST(test_long_extremes) {
  /* long enough for the vector lanes: first maximum, NaN anywhere wins */
  double v[1000];
  for (int i = 0; i < 1000; i++)
    v[i] = (i * 37) % 101;
  v[500] = 1000;
  v[800] = 1000;
  Value *x = vec(DT_F32, 1000, v);
  Params p;
  params_init(&p);
  params_add(&p, "axes", ints(1, (int64_t[]){0}));
  params_add(&p, "index_dtype", dtype_value(DT_I32));
  Value *r = apply1(P_ARGMAX, x, &p);
  expect(r, 1, (double[]){500});
  val_decref(r);
  r = reduce(P_REDUCE_MAX, x, 1, (int64_t[]){0});
  expect(r, 1, (double[]){1000});
  val_decref(r);
  val_decref(x);
  v[700] = NAN;
  x = vec(DT_F64, 1000, v);
  r = reduce(P_REDUCE_MIN, x, 1, (int64_t[]){0});
  expect(r, 1, (double[]){NAN});
  val_decref(r);
  params_add(&p, "axes", ints(1, (int64_t[]){0}));
  params_add(&p, "index_dtype", dtype_value(DT_I32));
  r = apply1(P_ARGMAX, x, &p);
  expect(r, 1, (double[]){700});
  val_decref(r);
  val_decref(x);
}
END_TEST

START_TEST(test_cumulative) {
  int64_t shape[2] = {2, 3};
  Value *x = mk(DT_F32, 2, shape, (double[]){1, 2, 3, 4, 5, 6});
  Params p;
  params_init(&p);
  params_add(&p, "axis", val_int(1));
  params_add(&p, "reverse", val_bool(false));
  Value *r = apply1(P_CUMSUM, x, &p);
  expect(r, 6, (double[]){1, 3, 6, 4, 9, 15});
  val_decref(r);
  params_add(&p, "axis", val_int(0));
  params_add(&p, "reverse", val_bool(true));
  r = apply1(P_CUMPROD, x, &p);
  expect(r, 6, (double[]){4, 10, 18, 4, 5, 6});
  val_decref(r);
  params_add(&p, "axis", val_int(1));
  r = apply1(P_CUMMAX, x, &p);
  expect(r, 6, (double[]){1, 2, 3, 4, 5, 6});
  val_decref(r);
  val_decref(x);
}
END_TEST

/* ---- layout -------------------------------------------------------------------------------- */

START_TEST(test_iota_and_broadcast) {
  Params p;
  params_init(&p);
  params_add(&p, "dtype", dtype_value(DT_I32));
  params_add(&p, "shape", ints(2, (int64_t[]){2, 3}));
  params_add(&p, "dimension", val_int(1));
  Value *r = prim_apply(P_IOTA, 0, NULL, &p);
  params_clear(&p);
  expect(r, 6, (double[]){0, 1, 2, 0, 1, 2});
  Value *v = vec(DT_F32, 3, (double[]){1, 2, 3});
  params_add(&p, "shape", ints(2, (int64_t[]){2, 3}));
  params_add(&p, "broadcast_dimensions", ints(1, (int64_t[]){1}));
  Value *b = apply1(P_BROADCAST_IN_DIM, v, &p);
  ck_assert_ptr_eq(AS_ARRAY(b)->buf, AS_ARRAY(v)->buf);   /* a view */
  expect(b, 6, (double[]){1, 2, 3, 1, 2, 3});
  params_add(&p, "shape", ints(2, (int64_t[]){2, 4}));
  params_add(&p, "broadcast_dimensions", ints(1, (int64_t[]){1}));
  ck_assert_ptr_null(apply1(P_BROADCAST_IN_DIM, v, &p));
  ck_assert(strstr(err_message(), "target broadcast shape (2, 4)") != NULL);
  err_clear();
  val_decref(b);
  val_decref(v);
  val_decref(r);
}
END_TEST

START_TEST(test_reshape_slice_rev) {
  double v[12];
  for (int i = 0; i < 12; i++)
    v[i] = i;
  Value *x = vec(DT_F32, 12, v);
  Params p = one("new_sizes", ints(2, (int64_t[]){3, 4}));
  params_add(&p, "dimensions", VAL_NONE);
  Value *m = apply1(P_RESHAPE, x, &p);
  ck_assert_ptr_eq(AS_ARRAY(m)->buf, AS_ARRAY(x)->buf);
  p = one("new_sizes", ints(2, (int64_t[]){5, 2}));
  ck_assert_ptr_null(apply1(P_RESHAPE, x, &p));
  ck_assert(strstr(err_message(), "reshape total size must be unchanged") != NULL);
  err_clear();
  params_add(&p, "start_indices", ints(2, (int64_t[]){0, 1}));
  params_add(&p, "limit_indices", ints(2, (int64_t[]){3, 4}));
  params_add(&p, "strides", ints(2, (int64_t[]){2, 2}));
  Value *s = apply1(P_SLICE, m, &p);
  ck_assert_ptr_eq(AS_ARRAY(s)->buf, AS_ARRAY(x)->buf);
  expect(s, 4, (double[]){1, 3, 9, 11});
  p = one("dimensions", ints(1, (int64_t[]){1}));
  Value *r = apply1(P_REV, m, &p);
  expect(r, 12, (double[]){3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8});
  Value *rr = apply2(P_ADD, r, r);   /* strided with a negative stride */
  expect(rr, 12, (double[]){6, 4, 2, 0, 14, 12, 10, 8, 22, 20, 18, 16});
  p = one("dimensions", ints(2, (int64_t[]){0, 2}));
  Value *e = apply1(P_EXPAND_DIMS, s, &p);
  ck_assert_int_eq(AS_ARRAY(e)->ndim, 4);
  ck_assert_int_eq(AS_ARRAY(e)->shape[2], 1);
  p = one("dimensions", ints(1, (int64_t[]){2}));
  Value *q = apply1(P_SQUEEZE, e, &p);
  ck_assert_int_eq(AS_ARRAY(q)->ndim, 3);
  p = one("dimensions", ints(1, (int64_t[]){1}));
  ck_assert_ptr_null(apply1(P_SQUEEZE, q, &p));
  err_clear();
  val_decref(q);
  val_decref(e);
  val_decref(rr);
  val_decref(r);
  val_decref(s);
  val_decref(m);
  val_decref(x);
}
END_TEST

START_TEST(test_dynamic_slices_clamp) {
  Value *x = vec(DT_I32, 5, (double[]){0, 1, 2, 3, 4});
  Value *start = scalar(DT_I32, 4, false);
  Params p = one("slice_sizes", ints(1, (int64_t[]){2}));
  Value *in[2] = {x, start};
  Value *r = prim_apply(P_DYNAMIC_SLICE, 2, in, &p);
  params_clear(&p);
  expect(r, 2, (double[]){3, 4});   /* start 4 clamped to 3 */
  Value *u = vec(DT_I32, 2, (double[]){9, 9});
  Value *neg = scalar(DT_I32, -3, false);
  Value *uin[3] = {x, u, neg};
  Value *d = prim_apply(P_DYNAMIC_UPDATE_SLICE, 3, uin, &p);
  expect(d, 5, (double[]){9, 9, 2, 3, 4});   /* start -3 clamped to 0 */
  expect(x, 5, (double[]){0, 1, 2, 3, 4});
  val_decref(d);
  val_decref(u);
  val_decref(neg);
  val_decref(r);
  val_decref(start);
  val_decref(x);
}
END_TEST

START_TEST(test_concatenate_pad) {
  int64_t s1[2] = {1, 2}, s2[2] = {2, 2};
  Value *a = mk(DT_F32, 2, s1, (double[]){1, 2});
  Value *b = mk(DT_F32, 2, s2, (double[]){3, 4, 5, 6});
  Params p = one("dimension", val_int(0));
  Value *in[2] = {a, b};
  Value *c = prim_apply(P_CONCATENATE, 2, in, &p);
  params_clear(&p);
  ck_assert_int_eq(AS_ARRAY(c)->shape[0], 3);
  expect(c, 6, (double[]){1, 2, 3, 4, 5, 6});
  Value *x = vec(DT_F32, 3, (double[]){1, 2, 3});
  Value *zero = scalar(DT_F32, 0, false);
  Value *cfg = tuple_new(1);
  tuple_set_steal(cfg, 0, ints(3, (int64_t[]){-1, 2, 1}));
  p = one("padding_config", cfg);
  Value *pin[2] = {x, zero};
  Value *pd = prim_apply(P_PAD, 2, pin, &p);
  params_clear(&p);
  /* interior: 1 0 2 0 3; crop one on the left, two zeros on the right */
  expect(pd, 6, (double[]){0, 2, 0, 3, 0, 0});
  val_decref(pd);
  val_decref(x);
  val_decref(zero);
  val_decref(c);
  val_decref(a);
  val_decref(b);
}
END_TEST

START_TEST(test_gather_scatter) {
  int64_t shape[2] = {2, 3};
  Value *x = mk(DT_F32, 2, shape, (double[]){0, 1, 2, 10, 11, 12});
  Value *idx = vec(DT_I32, 4, (double[]){2, 0, 7, -1});
  Params p = one("axis", val_int(1));
  Value *in[2] = {x, idx};
  Value *g = prim_apply(P_GATHER, 2, in, &p);
  params_clear(&p);
  ck_assert_int_eq(AS_ARRAY(g)->shape[1], 4);
  expect(g, 8, (double[]){2, 0, 2, 0, 12, 10, 12, 10});   /* clamped */
  Value *upd = mk(DT_F32, 2, (int64_t[]){2, 4}, (double[]){1, 1, 1, 1, 2, 2, 2, 2});
  Value *sidx = vec(DT_I32, 4, (double[]){0, 0, 5, 2});
  params_add(&p, "axis", val_int(1));
  params_add(&p, "mode", str_from("add"));
  Value *sin[3] = {x, sidx, upd};
  Value *s = prim_apply(P_SCATTER, 3, sin, &p);
  params_clear(&p);
  expect(s, 6, (double[]){2, 1, 3, 14, 11, 14});   /* index 5 dropped */
  val_decref(s);
  val_decref(sidx);
  val_decref(upd);
  val_decref(g);
  val_decref(idx);
  val_decref(x);
}
END_TEST

START_TEST(test_sort) {
  Value *x = vec(DT_F32, 6, (double[]){3, NAN, -1, 2, -INFINITY, 2});
  Params p = one("dimension", val_int(0));
  Value *r = apply1(P_SORT, x, &p);
  expect(r, 6, (double[]){-INFINITY, -1, 2, 2, 3, NAN});
  int64_t shape[2] = {2, 2};
  Value *m = mk(DT_I32, 2, shape, (double[]){4, 1, 3, 2});
  p = one("dimension", val_int(0));
  Value *s = apply1(P_SORT, m, &p);
  expect(s, 4, (double[]){3, 1, 4, 2});
  val_decref(s);
  val_decref(m);
  val_decref(r);
  val_decref(x);
}
END_TEST

/* Every primitive of the array layer has its shape rule and kernel in the
 * table (the PRNG's once prim_random_install ran); the collectives' and
 * sharding_constraint's come from spmd/ at start-up, so before that
 * applying one is a clear error, not a crash. */
START_TEST(test_table_rules) {
  for (int id = 0; id < P_COUNT; id++) {
    PrimKind k = prim_table[id].kind;
    if (k == PK_HIGHER || k == PK_COLLECTIVE || id == P_SHARDING_CONSTRAINT) continue;
    ck_assert_msg(prim_table[id].rules.shape && prim_table[id].rules.kernel,
                  "%s lacks a rule", prim_table[id].name);
  }
  Array *x = arr_new(DT_F32, 0, NULL);
  Value *in[1] = {&x->hdr};
  Params p;
  params_init(&p);
  ck_assert_ptr_null(prim_apply(P_PSUM, 1, in, &p));
  ck_assert_str_eq(err_message(), "evaluation of 'psum' is not implemented");
  err_clear();
  ck_assert_int_eq(prim_rule_missing(P_CUMSUM, "grad"), -1);
  ck_assert_str_eq(err_message(), "grad of 'cumsum' is not implemented");
  err_clear();
  val_decref(&x->hdr);
}
END_TEST

START_TEST(test_table_and_infer) {
  ck_assert_int_eq(prim_lookup("reduce_sum"), P_REDUCE_SUM);
  ck_assert_int_eq(prim_lookup("no_such_prim"), -1);
  ck_assert_str_eq(prim_table[P_DOT_GENERAL].name, "dot_general");
  ck_assert_ptr_null(prim_table[P_COND].rules.kernel);
  AVal in[2] = {{.dtype = DT_F32, .ndim = 1, .shape = {8}, .vma = 1},
                {.dtype = DT_F32, .ndim = 0, .weak = true, .vma = 2}};
  AVal out;
  Params p;
  params_init(&p);
  ck_assert_int_eq(prim_infer(P_MUL, in, 2, &p, &out), 0);
  ck_assert_int_eq(out.ndim, 1);
  ck_assert_int_eq(out.shape[0], 8);
  ck_assert_int_eq(out.vma, 3);   /* the union */
  ck_assert(!out.weak);
}
END_TEST

static Suite *kernels_suite(void) {
  Suite *s = suite_create("kernels");
  TCase *el = tcase_create("elementwise");
  tcase_set_timeout(el, 60);
  tcase_add_test(el, test_add_scalar_broadcast);
  tcase_add_test(el, test_inplace_reuse);
  tcase_add_test(el, test_binary_into);
  tcase_add_test(el, test_binary_into_2d);
  tcase_add_test(el, test_int_division);
  tcase_add_test(el, test_int_wraps);
  tcase_add_test(el, test_compare_and_nan);
  tcase_add_test(el, test_binary_errors);
  tcase_add_test(el, test_strided_operands);
  tcase_add_test(el, test_half_arithmetic);
  tcase_add_test(el, test_large_split);
  tcase_add_test(el, test_parallel_cover);
  tcase_add_test(el, test_transcendental_accuracy);
  tcase_add_test(el, test_transcendental_specials);
  tcase_add_test(el, test_trig_elementwise_pure);
  tcase_add_test(el, test_transcendental_lanes_match_scalar);
  tcase_add_test(el, test_unary_prims);
  tcase_add_test(el, test_select_and_clamp);
  suite_add_tcase(s, el);
  TCase *rd = tcase_create("reduce");
  tcase_set_timeout(rd, 60);
  tcase_add_test(rd, test_reduce_axes);
  tcase_add_test(rd, test_sum_accuracy);
  tcase_add_test(rd, test_sum_pairwise_order);
  tcase_add_test(rd, test_reduce_nan_and_empty);
  tcase_add_test(rd, test_argmax);
  tcase_add_test(rd, test_long_extremes);
  tcase_add_test(rd, test_cumulative);
  suite_add_tcase(s, rd);
  TCase *sh = tcase_create("shape");
  tcase_add_test(sh, test_iota_and_broadcast);
  tcase_add_test(sh, test_reshape_slice_rev);
  tcase_add_test(sh, test_dynamic_slices_clamp);
  tcase_add_test(sh, test_concatenate_pad);
  tcase_add_test(sh, test_gather_scatter);
  tcase_add_test(sh, test_sort);
  tcase_add_test(sh, test_table_and_infer);
  tcase_add_test(sh, test_table_rules);
  suite_add_tcase(s, sh);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(kernels_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
