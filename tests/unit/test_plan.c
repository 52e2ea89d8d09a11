/*
 * test_plan.c - the staging core without the evaluator: plans built by
 * hand and printed (plan.c), primitives traced through prim_apply with
 * tracer operands (trace.c), and compiled plans run against eager
 * prim_apply (compile.c, fused_loop.c).  Expected texts follow the jaxpr
 * grammar of seed 004 with current JAX's typed binders.
 */
#include <check.h>
#include <math.h>
#include <string.h>

#include "array/array.h"
#include "transform/compile.h"
#include "base/error.h"
#include "transform/plan.h"
#include "array/prim.h"
#include "transform/trace.h"

static void setup(void) {
  static bool done;
  if (!done) {
    trace_register();
    plan_register();
    cmp_register();
    done = true;
  }
}

static AVal f32v(int64_t n) {
  AVal a = {.dtype = DT_F32, .ndim = 1};
  a.shape[0] = n;
  return a;
}

static Array *filled(int64_t n, double base, double step) {
  Array *a = arr_new(DT_F32, 1, &n);
  for (int64_t i = 0; i < n; i++) ((float *)arr_data(a))[i] = (float)(base + step * (double)i);
  return a;
}

static void expect_text(Plan *p, const char *want) {
  Value *s = plan_str(p);
  ck_assert_ptr_nonnull(s);
  ck_assert_str_eq(str_cstr(s), want);
  val_decref(s);
}

/* Records `prim x` / `prim x y` through prim_apply, as the evaluator would
 * (holding an extra reference, so no operand is reused as the output). */
static Value *ap(PrimId id, Value *x, Value *y) {
  Params p;
  params_init(&p);
  Value *in[2] = {val_incref(x), val_incref(y)};
  Value *r = prim_apply(id, y ? 2 : 1, in, &p);
  val_decref(x);
  val_decref(y);
  ck_assert_msg(r != NULL, "%s", err_occurred() ? err_message() : "?");
  return r;
}

static Value *reduce_all(Value *x) {
  Params p;
  params_init(&p);
  int64_t zero = 0;
  params_add(&p, "axes", val_int_tuple(1, &zero));
  Value *r = prim_apply(P_REDUCE_SUM, 1, &x, &p);
  params_clear(&p);
  return r;
}

/* Traces seed 004's func1 body, sum(first + sin(second) * 3.), over [n]
 * elements. */
static Plan *trace_func1_n(int64_t n) {
  AVal a = f32v(n);
  Trace *t = trace_begin(NULL, true);
  Value *x = trace_new_arg(t, &a, "first"), *y = trace_new_arg(t, &a, "second");
  Value *three = (Value *)arr_scalar_f64(DT_F32, 3.0, false);
  Value *c = ap(P_SIN, y, NULL), *d = ap(P_MUL, c, three), *e = ap(P_ADD, x, d);
  Value *f = reduce_all(e);
  Value **caps;
  int ncap;
  Plan *p = trace_end(t, 1, &f, &caps, &ncap);
  ck_assert_int_eq(ncap, 0);
  trace_caps_free(caps, ncap);
  Value *all[] = {x, y, three, c, d, e, f};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) val_decref(all[i]);
  return p;
}

static Plan *trace_func1(void) { return trace_func1_n(8); }

START_TEST(prints_func1) {
  Plan *p = trace_func1();
  expect_text(p, "{ lambda ; a:f32[8] b:f32[8]. let\n"
                 "    c:f32[8] = sin b\n"
                 "    d:f32[8] = mul c 3.0:f32[]\n"
                 "    e:f32[8] = add a d\n"
                 "    f:f32[] = reduce_sum[axes=(0,)] e\n"
                 "  in (f,) }");
  val_decref(&p->hdr);
}
END_TEST

START_TEST(hoists_constants) {
  AVal a = f32v(8);
  Trace *t = trace_begin(NULL, true);
  Value *x = trace_new_arg(t, &a, "x");
  Value *ones = (Value *)filled(8, 1, 0);
  Value *s1 = ap(P_ADD, x, ones), *s2 = ap(P_SUB, s1, ones);
  Value **caps;
  int ncap;
  Plan *p = trace_end(t, 1, &s2, &caps, &ncap);
  trace_caps_free(caps, ncap);
  /* one constvar for the one array used twice, as func6's */
  ck_assert_int_eq(p->nconst, 1);
  expect_text(p, "{ lambda a:f32[8] ; b:f32[8]. let\n"
                 "    c:f32[8] = add b a\n"
                 "    d:f32[8] = sub c a\n"
                 "  in (d,) }");
  val_decref(&p->hdr);
  val_decref(x);
  val_decref(ones);
  val_decref(s1);
  val_decref(s2);
}
END_TEST

START_TEST(shape_errors_while_tracing) {
  AVal a = f32v(8), b = f32v(3);
  Trace *t = trace_begin(NULL, true);
  Value *x = trace_new_arg(t, &a, "x"), *y = trace_new_arg(t, &b, "y");
  Params p;
  params_init(&p);
  Value *in[2] = {x, y};
  ck_assert_ptr_null(prim_apply(P_ADD, 2, in, &p));
  ck_assert(err_occurred());
  err_clear();
  trace_abort(t);
  val_decref(x);
  val_decref(y);
}
END_TEST

START_TEST(leaked_tracer_is_an_error) {
  AVal a = f32v(4);
  Trace *t = trace_begin(NULL, true);
  Value *x = trace_new_arg(t, &a, "x");
  trace_abort(t);
  Params p;
  params_init(&p);
  ck_assert_ptr_null(prim_apply(P_SIN, 1, &x, &p));
  ck_assert(strstr(err_message(), "escaped") != NULL);
  err_clear();
  ck_assert_int_eq(trace_truth_error(x), -1);
  ck_assert(strstr(err_message(), "'x'") != NULL);
  ck_assert(strstr(err_message(), "while_loop") != NULL);
  err_clear();
  val_decref(x);
}
END_TEST

START_TEST(names_past_z) {
  AVal a = {.dtype = DT_F32};
  Plan *p = plan_new(NULL);
  for (int i = 0; i < 28; i++) plan_add_invar(p, plan_add_var(p, &a));
  PlanAtom out = {27, NULL};
  plan_set_outs(p, 1, &out);
  Value *s = plan_str(p);
  ck_assert(strstr(str_cstr(s), " z:f32[] ba:f32[] bb:f32[]. let  in (bb,) }") != NULL);
  val_decref(s);
  val_decref(&p->hdr);
}
END_TEST

/* The compiled plan (fused: sin, mul, add, reduce_sum) against eager. */
START_TEST(compiled_equals_eager) {
  Plan *p = trace_func1();
  ck_assert_int_eq(cmp_compile(p), 0);
  int64_t n = 10000;
  AVal a = f32v(n);
  (void)a;
  /* the plan was traced for 8 elements; run it on 8 */
  Array *x = filled(8, 0.5, 0.25), *y = filled(8, -1, 0.5), *out[1];
  Array *in[2] = {x, y};
  ck_assert_int_eq(cmp_run(p, in, out), 0);
  Value *three = (Value *)arr_scalar_f64(DT_F32, 3.0, false);
  Value *c = ap(P_SIN, &y->hdr, NULL), *d = ap(P_MUL, c, three), *e = ap(P_ADD, &x->hdr, d);
  Value *f = reduce_all(e);
  ck_assert(fabs(arr_get_f64(out[0], 0) - arr_get_f64(AS_ARRAY(f), 0)) < 1e-5);
  Value *all[] = {three, c, d, e, f, &x->hdr, &y->hdr, &out[0]->hdr};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) val_decref(all[i]);
  val_decref(&p->hdr);
}
END_TEST

/* A long fused chain without a reduction, bit for bit, across blocks. */
START_TEST(fused_chain_bitwise) {
  int64_t n = 3 * CMP_BLOCK + 17;
  AVal a = f32v(n);
  Trace *t = trace_begin(NULL, true);
  Value *x = trace_new_arg(t, &a, "x"), *y = trace_new_arg(t, &a, "y");
  Value *s = ap(P_SIN, y, NULL), *m = ap(P_MUL, x, y), *d = ap(P_SUB, s, m), *e = ap(P_EXP, d, NULL);
  Value *outs[2] = {e, m};
  Value **caps;
  int ncap;
  Plan *p = trace_end(t, 2, outs, &caps, &ncap);
  trace_caps_free(caps, ncap);
  ck_assert_int_eq(cmp_compile(p), 0);
  Array *xa = filled(n, -3, 0.001), *ya = filled(n, 2, -0.0007), *res[2];
  Array *in[2] = {xa, ya};
  ck_assert_int_eq(cmp_run(p, in, res), 0);
  Value *es = ap(P_SIN, &ya->hdr, NULL), *em = ap(P_MUL, &xa->hdr, &ya->hdr);
  Value *ed = ap(P_SUB, es, em), *ee = ap(P_EXP, ed, NULL);
  ck_assert(!memcmp(arr_data(res[0]), arr_data(AS_ARRAY(ee)), (size_t)n * 4));
  ck_assert(!memcmp(arr_data(res[1]), arr_data(AS_ARRAY(em)), (size_t)n * 4));
  Value *all[] = {x, y, s, m, d, e, es, em, ed, ee, &xa->hdr, &ya->hdr, &res[0]->hdr, &res[1]->hdr};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) val_decref(all[i]);
  val_decref(&p->hdr);
}
END_TEST

/* A plan over i32[4] (not fused) built by hand: a input, k a constvar. */
static Plan *int_plan(Value *k, int *a, int *kv) {
  AVal av = {.dtype = DT_I32, .ndim = 1};
  av.shape[0] = 4;
  Plan *p = plan_new(NULL);
  *a = plan_add_var(p, &av);
  plan_add_invar(p, *a);
  *kv = plan_add_const(p, k);
  return p;
}

static int eqn(Plan *p, PrimId id, int x, int y) {
  AVal av = p->vars[x];
  int out = plan_add_var(p, &av);
  PlanAtom in[2] = {{x, NULL}, {y, NULL}};
  Params ps;
  params_init(&ps);
  plan_add_eqn(p, id, &ps, y >= 0 ? 2 : 1, in, 1, &out, (Loc){0});
  return out;
}

static Array *ints4(int a, int b, int c, int d) {
  int64_t n = 4;
  Array *x = arr_new(DT_I32, 1, &n);
  int32_t *v = arr_data(x);
  v[0] = a, v[1] = b, v[2] = c, v[3] = d;
  return x;
}

/* Folding, CSE and DCE, seen in the step count, results unchanged. */
START_TEST(passes_fold_cse_dce) {
  Array *k = ints4(1, 2, 3, 4), *x = ints4(10, 20, 30, 40), *out[1];
  int a, kv;
  Plan *p = int_plan(&k->hdr, &a, &kv);
  int nk = eqn(p, P_NEG, kv, -1);            /* folded: constants only */
  int b = eqn(p, P_NEG, a, -1);
  int c = eqn(p, P_NEG, a, -1);              /* same as b: CSE */
  eqn(p, P_ABS, a, -1);                      /* unused: DCE */
  int d = eqn(p, P_ADD, b, c);
  int e = eqn(p, P_ADD, d, nk);
  PlanAtom o = {e, NULL};
  plan_set_outs(p, 1, &o);
  ck_assert_int_eq(cmp_compile(p), 0);
  ck_assert_int_eq(cmp_nsteps(p), 3);        /* neg, add, add */
  ck_assert_int_eq(cmp_tapeable(p), 1);      /* each a row loop */
  Array *in[1] = {x};
  ck_assert_int_eq(cmp_run(p, in, out), 0);
  int32_t *r = arr_data(out[0]);
  ck_assert(r[0] == -21 && r[1] == -42 && r[2] == -63 && r[3] == -84);
  val_decref(&out[0]->hdr);
  /* a second run reuses the workspace */
  ck_assert_int_eq(cmp_run(p, in, out), 0);
  ck_assert_int_eq(((int32_t *)arr_data(out[0]))[3], -84);
  val_decref(&out[0]->hdr);
  val_decref(&p->hdr);
  val_decref(&k->hdr);
  val_decref(&x->hdr);
}
END_TEST

/* An f32 [rows, cols] matrix filled with sin(i). */
static Array *sin_matrix(int64_t rows, int64_t cols) {
  int64_t shape[2] = {rows, cols};
  Array *a = arr_new(DT_F32, 2, shape);
  for (int64_t i = 0; i < rows * cols; i++) ((float *)arr_data(a))[i] = sinf((float)i);
  return a;
}

/* transpose(a) @ b: the product reads a through its strides and the
 * transpose's copy is gone (one step), unless the transpose is an output
 * too (two steps); the bits are eager's, where the transpose is a view. */
START_TEST(transpose_folds_into_product) {
  for (int keep = 0; keep < 2; keep++) {
    Array *a = sin_matrix(6, 4), *b = sin_matrix(6, 5);
    AVal av, bv, tv, dv;
    aval_of(a, &av);
    aval_of(b, &bv);
    tv = av, tv.shape[0] = 4, tv.shape[1] = 6;
    dv = av, dv.shape[0] = 4, dv.shape[1] = 5;
    Plan *p = plan_new(NULL);
    int x = plan_add_var(p, &av), y = plan_add_var(p, &bv), t = plan_add_var(p, &tv);
    int d = plan_add_var(p, &dv);
    plan_add_invar(p, x);
    plan_add_invar(p, y);
    Params tp, dp;
    params_init(&tp);
    params_add(&tp, "permutation", val_int_tuple(2, (int64_t[]){1, 0}));
    plan_add_eqn(p, P_TRANSPOSE, &tp, 1, (PlanAtom[]){{x, NULL}}, 1, &t, (Loc){0});
    params_init(&dp);
    params_add(&dp, "dimension_numbers",
               val_dot_dimension_numbers(1, (int64_t[]){1}, (int64_t[]){0}, 0, NULL, NULL));
    Params eager;
    params_init(&eager);
    params_add(&eager, "dimension_numbers", val_incref(params_get(&dp, "dimension_numbers")));
    plan_add_eqn(p, P_DOT_GENERAL, &dp, 2, (PlanAtom[]){{t, NULL}, {y, NULL}}, 1, &d, (Loc){0});
    PlanAtom o[2] = {{d, NULL}, {t, NULL}};
    plan_set_outs(p, 1 + keep, o);
    ck_assert_int_eq(cmp_compile(p), 0);
    ck_assert_int_eq(cmp_nsteps(p), 1 + keep);
    Array *in[2] = {a, b}, *out[2] = {NULL, NULL};
    ck_assert_int_eq(cmp_run(p, in, out), 0);
    Params tp2;
    params_init(&tp2);
    params_add(&tp2, "permutation", val_int_tuple(2, (int64_t[]){1, 0}));
    /* prim_apply borrows its operands; a and b stay owned here (refcount
     * 1 would let the kernel write over them) */
    Value *at = prim_apply(P_TRANSPOSE, 1, (Value *[]){&a->hdr}, &tp2);
    params_clear(&tp2);
    ck_assert_ptr_nonnull(at);
    Value *want = prim_apply(P_DOT_GENERAL, 2, (Value *[]){at, &b->hdr}, &eager);
    val_decref(at);
    ck_assert_ptr_nonnull(want);
    ck_assert(!memcmp(arr_data(out[0]), arr_data(AS_ARRAY(want)), 20 * sizeof(float)));
    for (int i = 0; i <= keep; i++) val_decref(&out[i]->hdr);
    val_decref(want);
    params_clear(&eager);
    val_decref(&p->hdr);
    val_decref(&a->hdr);
    val_decref(&b->hdr);
  }
}
END_TEST

/* func1's four equations become one fused loop past one block; within
 * one they stay four steps, each its row loop, equal to eager bit for
 * bit (the sum included: no blockwise order). */
START_TEST(func1_is_one_loop) {
  Plan *p = trace_func1_n(2 * CMP_BLOCK + 1);
  ck_assert_int_eq(cmp_compile(p), 0);
  ck_assert_int_eq(cmp_nsteps(p), 1);
  val_decref(&p->hdr);
  p = trace_func1_n(CMP_BLOCK);
  ck_assert_int_eq(cmp_compile(p), 0);
  ck_assert_int_eq(cmp_nsteps(p), 4);
  ck_assert_int_eq(cmp_tapeable(p), 0);      /* the reduce_sum has no row loop */
  Array *x = filled(CMP_BLOCK, 0.5, 0.25), *y = filled(CMP_BLOCK, -1, 0.5), *out[1];
  Array *in[2] = {x, y};
  ck_assert_int_eq(cmp_run(p, in, out), 0);
  Value *three = (Value *)arr_scalar_f64(DT_F32, 3.0, false);
  Value *c = ap(P_SIN, &y->hdr, NULL), *d = ap(P_MUL, c, three), *e = ap(P_ADD, &x->hdr, d);
  Value *f = reduce_all(e);
  ck_assert(!memcmp(arr_data(out[0]), arr_data(AS_ARRAY(f)), 4));
  Value *all[] = {three, c, d, e, f, &x->hdr, &y->hdr, &out[0]->hdr, &p->hdr};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) val_decref(all[i]);
}
END_TEST

/* A step between two fusible ones that they do not depend on does not
 * split the loop: it is scheduled after it. */
START_TEST(fusion_skips_independent_steps) {
  int64_t n = 2 * CMP_BLOCK + 8;
  AVal a = f32v(n);
  Trace *t = trace_begin(NULL, true);
  Value *x = trace_new_arg(t, &a, "x"), *y = trace_new_arg(t, &a, "y");
  Params p;
  params_init(&p);
  params_add(&p, "new_dtype", val_incref(dtype_value(DT_I32)));
  params_add(&p, "weak_type", val_incref(val_false()));
  Value *s = ap(P_SIN, x, NULL), *r = prim_apply(P_CONVERT_ELEMENT_TYPE, 1, &y, &p);
  Value *b = ap(P_ADD, s, x), *c = reduce_all(b);
  params_clear(&p);
  Value *outs[2] = {c, r}, **caps;
  int ncap;
  Plan *pl = trace_end(t, 2, outs, &caps, &ncap);
  trace_caps_free(caps, ncap);
  ck_assert_int_eq(cmp_compile(pl), 0);
  ck_assert_int_eq(cmp_nsteps(pl), 2);
  Array *xa = filled(n, 0, 0.001), *ya = filled(n, 0.5, 1), *res[2], *in[2] = {xa, ya};
  ck_assert_int_eq(cmp_run(pl, in, res), 0);
  ck_assert_int_eq(arr_get_i64(res[1], 7), 7);
  Value *es = ap(P_SIN, &xa->hdr, NULL), *eb = ap(P_ADD, es, &xa->hdr), *ec = reduce_all(eb);
  double want = arr_get_f64(AS_ARRAY(ec), 0);
  ck_assert(fabs(arr_get_f64(res[0], 0) - want) < 1e-5 * fabs(want));
  Value *all[] = {x, y, s, r, b, c, es, eb, ec, &xa->hdr, &ya->hdr, &res[0]->hdr, &res[1]->hdr,
                  &pl->hdr};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) val_decref(all[i]);
}
END_TEST

static Suite *plan_suite(void) {
  Suite *s = suite_create("plan");
  TCase *tc = tcase_create("core");
  tcase_add_checked_fixture(tc, setup, NULL);
  tcase_add_test(tc, prints_func1);
  tcase_add_test(tc, hoists_constants);
  tcase_add_test(tc, shape_errors_while_tracing);
  tcase_add_test(tc, leaked_tracer_is_an_error);
  tcase_add_test(tc, names_past_z);
  tcase_add_test(tc, compiled_equals_eager);
  tcase_add_test(tc, fused_chain_bitwise);
  tcase_add_test(tc, passes_fold_cse_dce);
  tcase_add_test(tc, transpose_folds_into_product);
  tcase_add_test(tc, func1_is_one_loop);
  tcase_add_test(tc, fusion_skips_independent_steps);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(plan_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
