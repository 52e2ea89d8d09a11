/*
 * test_linalg.c - dot_general (linalg.c) against a naive loop: every
 * layout of batch, free and contracting dims, strided and reversed views,
 * every dtype, preferred_element_type, and JAX's shape errors.
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "array/array.h"
#include "base/error.h"
#include "array/linalg.h"
#include "array/prim.h"

/* ---- helpers ----------------------------------------------------------- */

static Value *int_tuple(int n, const int *xs) {
  Value *t = tuple_new((size_t)n);
  for (int i = 0; i < n; i++)
    tuple_set_steal(t, (size_t)i, &arr_scalar_i64(DT_I32, xs[i], true)->hdr);
  return t;
}

static Value *pair(Value *a, Value *b) {
  Value *t = tuple_new(2);
  tuple_set_steal(t, 0, a);
  tuple_set_steal(t, 1, b);
  return t;
}

/* Params for dimension_numbers ((lc, rc), (lb, rb)); [pref] < 0: none. */
static void make_params(Params *p, int nc, const int *lc, const int *rc, int nb,
                        const int *lb, const int *rb, int pref) {
  memset(p, 0, sizeof *p);
  Value *dn = pair(pair(int_tuple(nc, lc), int_tuple(nc, rc)),
                   pair(int_tuple(nb, lb), int_tuple(nb, rb)));
  p->p[0].name = "dimension_numbers";
  p->p[0].value = dn;
  p->n = 1;
  if (pref >= 0) {
    p->p[1].name = "preferred_element_type";
    p->p[1].value = dtype_value((DType)pref);
    p->n = 2;
  }
}

static void free_params(Params *p) {
  for (int i = 0; i < p->n; i++)
    val_decref(p->p[i].value);
  p->n = 0;
}

/* An array of [t] with small pseudo-random integer values (exact in every
 * dtype, so float results can be compared exactly too). */
static Array *rand_array(DType t, int ndim, const int64_t *shape, unsigned seed) {
  Array *a = arr_new(DT_F64, ndim, shape);
  double *d = arr_data(a);
  for (int64_t i = 0; i < a->size; i++) {
    seed = seed * 1103515245u + 12345u;
    d[i] = t == DT_BOOL ? (double)((seed >> 16) & 1) : (double)((int)((seed >> 16) % 7) - 3);
  }
  Array *r = arr_astype(a, t, false);
  val_decref(&a->hdr);
  return r;
}

/* Element [idx] (multi-index) of any view. */
static double at(const Array *a, const int64_t *idx) {
  int64_t flat = 0;
  for (int i = 0; i < a->ndim; i++)
    flat = flat * a->shape[i] + idx[i];
  return arr_get_f64(a, flat);
}

/* Reference dot_general by the definition, in double. */
static double naive_at(const Array *l, const Array *r, int nc, const int *lc,
                       const int *rc, int nb, const int *lb, const int *rb,
                       const int64_t *oidx) {
  int lf[SHM_MAXDIM], rf[SHM_MAXDIM], nlf = 0, nrf = 0;
  for (int d = 0; d < l->ndim; d++) {
    bool used = false;
    for (int i = 0; i < nc; i++) used |= lc[i] == d;
    for (int i = 0; i < nb; i++) used |= lb[i] == d;
    if (!used) lf[nlf++] = d;
  }
  for (int d = 0; d < r->ndim; d++) {
    bool used = false;
    for (int i = 0; i < nc; i++) used |= rc[i] == d;
    for (int i = 0; i < nb; i++) used |= rb[i] == d;
    if (!used) rf[nrf++] = d;
  }
  int64_t li[SHM_MAXDIM] = {0}, ri[SHM_MAXDIM] = {0}, k = 1, kidx[SHM_MAXDIM] = {0};
  for (int i = 0; i < nb; i++) li[lb[i]] = ri[rb[i]] = oidx[i];
  for (int i = 0; i < nlf; i++) li[lf[i]] = oidx[nb + i];
  for (int i = 0; i < nrf; i++) ri[rf[i]] = oidx[nb + nlf + i];
  for (int i = 0; i < nc; i++) k *= l->shape[lc[i]];
  double s = 0;
  for (int64_t t = 0; t < k; t++) {
    for (int i = 0; i < nc; i++) li[lc[i]] = ri[rc[i]] = kidx[i];
    s += at(l, li) * at(r, ri);
    for (int i = nc - 1; i >= 0 && ++kidx[i] == l->shape[lc[i]]; i--)
      kidx[i] = 0;
  }
  return s;
}

/* Runs dot_general and compares every element with the naive loop. */
static void check_dot(Array *l, Array *r, int nc, const int *lc, const int *rc,
                      int nb, const int *lb, const int *rb, int pref) {
  Params p;
  make_params(&p, nc, lc, rc, nb, lb, rb, pref);
  AVal in[2], out;
  aval_of(l, &in[0]);
  aval_of(r, &in[1]);
  ck_assert_msg(la_shape_dot_general(in, 2, &p, &out) == 0, "%s", err_message());
  Array *o = arr_new(out.dtype, out.ndim, out.shape);
  Array *ins[2] = {l, r};
  ck_assert_msg(la_kernel_dot_general(ins, 2, &p, &o) == 0, "%s", err_message());
  int64_t idx[SHM_MAXDIM] = {0};
  for (int64_t f = 0; f < o->size; f++) {
    double want = naive_at(l, r, nc, lc, rc, nb, lb, rb, idx);
    if (o->dtype == DT_BOOL)
      want = want != 0;
    double got = arr_get_f64(o, f);
    ck_assert_msg(fabs(got - want) <= 1e-9 * (1 + fabs(want)),
                  "element %lld: got %g, want %g", (long long)f, got, want);
    for (int i = o->ndim - 1; i >= 0 && ++idx[i] == o->shape[i]; i--)
      idx[i] = 0;
  }
  val_decref(&o->hdr);
  free_params(&p);
}

/* ---- tests ------------------------------------------------------------- */

START_TEST(test_matmul_every_dtype) {
  static const DType ts[] = {DT_F32, DT_F64, DT_BF16, DT_F16, DT_I32, DT_I8, DT_I64};
  int64_t ls[] = {5, 7}, rs[] = {7, 3};
  int lc[] = {1}, rc[] = {0};
  for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
    Array *l = rand_array(ts[i], 2, ls, 1), *r = rand_array(ts[i], 2, rs, 2);
    check_dot(l, r, 1, lc, rc, 0, NULL, NULL, -1);
    val_decref(&l->hdr);
    val_decref(&r->hdr);
  }
}
END_TEST

START_TEST(test_large_f32) {
  int64_t ls[] = {70, 130}, rs[] = {130, 90};
  int lc[] = {1}, rc[] = {0};
  Array *l = rand_array(DT_F32, 2, ls, 3), *r = rand_array(DT_F32, 2, rs, 4);
  check_dot(l, r, 1, lc, rc, 0, NULL, NULL, -1);
  val_decref(&l->hdr);
  val_decref(&r->hdr);
}
END_TEST

/* Float products deeper than two of BLIS's packed panels (512 each) and
 * taller than one block of rows, in place and transposed: exact, since
 * the values are small integers. */
START_TEST(test_f32_deep_panels) {
  int64_t ls[] = {150, 1100}, rs[] = {1100, 40}, ts[] = {40, 1100};
  int lc[] = {1}, rc[] = {0}, tc[] = {1};
  Array *l = rand_array(DT_F32, 2, ls, 5), *r = rand_array(DT_F32, 2, rs, 6);
  Array *t = rand_array(DT_F32, 2, ts, 7);
  check_dot(l, r, 1, lc, rc, 0, NULL, NULL, -1);
  check_dot(l, t, 1, lc, tc, 0, NULL, NULL, -1);
  val_decref(&l->hdr);
  val_decref(&r->hdr);
  val_decref(&t->hdr);
}
END_TEST

START_TEST(test_bool) {
  int64_t ls[] = {4, 6}, rs[] = {6, 5};
  int lc[] = {1}, rc[] = {0};
  Array *l = rand_array(DT_BOOL, 2, ls, 5), *r = rand_array(DT_BOOL, 2, rs, 6);
  check_dot(l, r, 1, lc, rc, 0, NULL, NULL, -1);
  val_decref(&l->hdr);
  val_decref(&r->hdr);
}
END_TEST

START_TEST(test_batched_leading) {
  int64_t ls[] = {3, 4, 5}, rs[] = {3, 5, 2};
  int lc[] = {2}, rc[] = {1}, lb[] = {0}, rb[] = {0};
  Array *l = rand_array(DT_F32, 3, ls, 7), *r = rand_array(DT_F32, 3, rs, 8);
  check_dot(l, r, 1, lc, rc, 1, lb, rb, -1);
  val_decref(&l->hdr);
  val_decref(&r->hdr);
}
END_TEST

START_TEST(test_batch_anywhere_two_contracting) {
  /* lhs (k1=2, b=3, m=4, k2=5), rhs (k2=5, n=6, b=3, k1=2) */
  int64_t ls[] = {2, 3, 4, 5}, rs[] = {5, 6, 3, 2};
  int lc[] = {0, 3}, rc[] = {3, 0}, lb[] = {1}, rb[] = {2};
  for (int t = 0; t < 2; t++) {
    DType dt = t ? DT_F64 : DT_I32;
    Array *l = rand_array(dt, 4, ls, 9), *r = rand_array(dt, 4, rs, 10);
    check_dot(l, r, 2, lc, rc, 1, lb, rb, -1);
    val_decref(&l->hdr);
    val_decref(&r->hdr);
  }
}
END_TEST

START_TEST(test_outer_and_inner) {
  int64_t ls[] = {4}, rs[] = {3}, vs[] = {6};
  Array *l = rand_array(DT_F32, 1, ls, 11), *r = rand_array(DT_F32, 1, rs, 12);
  check_dot(l, r, 0, NULL, NULL, 0, NULL, NULL, -1);   /* outer: (4, 3) */
  Array *v = rand_array(DT_F32, 1, vs, 13), *w = rand_array(DT_F32, 1, vs, 14);
  int c[] = {0};
  check_dot(v, w, 1, c, c, 0, NULL, NULL, -1);          /* inner: () */
  val_decref(&l->hdr);
  val_decref(&r->hdr);
  val_decref(&v->hdr);
  val_decref(&w->hdr);
}
END_TEST

START_TEST(test_transposed_and_reversed_views) {
  int64_t s[] = {6, 5}, ts[] = {5, 6}, tst[] = {1, 5};
  Array *a = rand_array(DT_F32, 2, s, 15), *b = rand_array(DT_F32, 2, s, 16);
  Array *at_ = arr_view(a, 2, ts, tst, a->offset);   /* a.T: (5, 6) */
  int64_t rst[] = {-5, 1};                           /* b[::-1] */
  Array *brev = arr_view(b, 2, s, rst, b->offset + 25);
  int lc[] = {1}, rc[] = {0};
  check_dot(at_, brev, 1, lc, rc, 0, NULL, NULL, -1);
  int64_t bst[] = {0, 1};                            /* broadcast row */
  Array *bc = arr_view(b, 2, s, bst, b->offset);
  check_dot(at_, bc, 1, lc, rc, 0, NULL, NULL, -1);
  val_decref(&a->hdr);
  val_decref(&b->hdr);
  val_decref(&at_->hdr);
  val_decref(&brev->hdr);
  val_decref(&bc->hdr);
}
END_TEST

START_TEST(test_preferred_element_type) {
  int64_t ls[] = {3, 4}, rs[] = {4, 2};
  int lc[] = {1}, rc[] = {0};
  Array *l = rand_array(DT_BF16, 2, ls, 17), *r = rand_array(DT_BF16, 2, rs, 18);
  Params p;
  make_params(&p, 1, lc, rc, 0, NULL, NULL, DT_F32);
  AVal in[2], out;
  aval_of(l, &in[0]);
  aval_of(r, &in[1]);
  ck_assert_int_eq(la_shape_dot_general(in, 2, &p, &out), 0);
  ck_assert_int_eq(out.dtype, DT_F32);
  ck_assert_int_eq(out.ndim, 2);
  free_params(&p);
  check_dot(l, r, 1, lc, rc, 0, NULL, NULL, DT_F32);
  val_decref(&l->hdr);
  val_decref(&r->hdr);
}
END_TEST

START_TEST(test_empty_contraction_gives_zeros) {
  int64_t ls[] = {3, 0}, rs[] = {0, 2};
  int lc[] = {1}, rc[] = {0};
  Array *l = arr_new(DT_F32, 2, ls), *r = arr_new(DT_F32, 2, rs);
  check_dot(l, r, 1, lc, rc, 0, NULL, NULL, -1);
  val_decref(&l->hdr);
  val_decref(&r->hdr);
}
END_TEST

START_TEST(test_kernel_allocates_output) {
  int64_t ls[] = {2, 3}, rs[] = {3, 2};
  int lc[] = {1}, rc[] = {0};
  Array *l = rand_array(DT_F32, 2, ls, 19), *r = rand_array(DT_F32, 2, rs, 20);
  Params p;
  make_params(&p, 1, lc, rc, 0, NULL, NULL, -1);
  Array *ins[2] = {l, r}, *o = NULL;
  ck_assert_int_eq(la_kernel_dot_general(ins, 2, &p, &o), 0);
  ck_assert_ptr_nonnull(o);
  ck_assert_int_eq(o->shape[0], 2);
  ck_assert_int_eq(o->shape[1], 2);
  val_decref(&o->hdr);
  free_params(&p);
  val_decref(&l->hdr);
  val_decref(&r->hdr);
}
END_TEST

/* The shape rule's error message for the given operands and numbers. */
static const char *rule_error(int nl, const int64_t *ls, int nr, const int64_t *rs,
                              int nc, const int *lc, const int *rc, int nb,
                              const int *lb, const int *rb) {
  static char msg[512];
  Params p;
  make_params(&p, nc, lc, rc, nb, lb, rb, -1);
  AVal in[2], out;
  memset(in, 0, sizeof in);
  in[0].dtype = in[1].dtype = DT_F32;
  in[0].ndim = nl;
  in[1].ndim = nr;
  memcpy(in[0].shape, ls, sizeof(int64_t) * (size_t)nl);
  memcpy(in[1].shape, rs, sizeof(int64_t) * (size_t)nr);
  err_clear();
  int rc_ = la_shape_dot_general(in, 2, &p, &out);
  free_params(&p);
  ck_assert_int_eq(rc_, -1);
  snprintf(msg, sizeof msg, "%s", err_message());
  return msg;
}

START_TEST(test_shape_errors) {
  int64_t a[] = {2, 3}, b[] = {4, 5}, c[] = {2, 4, 3}, d[] = {3, 3, 5};
  int one[] = {1}, zero[] = {0}, five[] = {5}, two[] = {2};
  ck_assert_str_eq(rule_error(2, a, 2, b, 1, one, zero, 0, NULL, NULL),
                   "dot_general requires contracting dimensions to have the "
                   "same shape, got (3,) and (4,)");
  ck_assert_str_eq(rule_error(3, c, 3, d, 1, two, one, 1, zero, zero),
                   "dot_general requires lhs batch dimensions and rhs batch "
                   "dimensions to have the same shape, got (2,) and (3,)");
  ck_assert_str_eq(rule_error(2, a, 2, b, 1, five, zero, 0, NULL, NULL),
                   "dot_general requires lhs dimension numbers to be nonnegative "
                   "and less than the number of axes of the lhs value, got "
                   "lhs_batch of () and lhs_contracting of (5,) for lhs of rank 2");
  ck_assert_str_eq(rule_error(2, a, 2, b, 1, one, zero, 1, one, zero),
                   "dot_general requires lhs batch dimensions to be disjoint from "
                   "contracting dimensions, got lhs_batch (1,) and "
                   "lhs_contracting (1,)");
}
END_TEST

START_TEST(test_contracting_counts_differ) {
  int lc[] = {0, 1}, rc[] = {0};
  Params p;
  memset(&p, 0, sizeof p);
  p.p[0].name = "dimension_numbers";
  p.p[0].value = pair(pair(int_tuple(2, lc), int_tuple(1, rc)),
                      pair(int_tuple(0, NULL), int_tuple(0, NULL)));
  p.n = 1;
  AVal in[2], out;
  memset(in, 0, sizeof in);
  in[0].ndim = in[1].ndim = 2;
  in[0].shape[0] = in[0].shape[1] = in[1].shape[0] = in[1].shape[1] = 2;
  err_clear();
  ck_assert_int_eq(la_shape_dot_general(in, 2, &p, &out), -1);
  ck_assert_str_eq(err_message(),
                   "dot_general requires equal numbers of lhs_contracting and "
                   "rhs_contracting dimensions, got lhs_contracting (0, 1) and "
                   "rhs_contracting (0,)");
  free_params(&p);
}
END_TEST

START_TEST(test_malformed_params) {
  Params p;
  memset(&p, 0, sizeof p);
  AVal in[2], out;
  memset(in, 0, sizeof in);
  err_clear();
  ck_assert_int_eq(la_shape_dot_general(in, 2, &p, &out), -1);
  ck_assert_ptr_nonnull(strstr(err_message(), "dimension_numbers"));
}
END_TEST

START_TEST(test_blis_arch_named) {
  const char *name = la_blis_arch();
  ck_assert_ptr_nonnull(name);
  ck_assert_int_gt((int)strlen(name), 0);
}
END_TEST

static Suite *linalg_suite(void) {
  Suite *s = suite_create("linalg");
  TCase *tc = tcase_create("dot_general");
  tcase_add_test(tc, test_matmul_every_dtype);
  tcase_add_test(tc, test_large_f32);
  tcase_add_test(tc, test_f32_deep_panels);
  tcase_add_test(tc, test_bool);
  tcase_add_test(tc, test_batched_leading);
  tcase_add_test(tc, test_batch_anywhere_two_contracting);
  tcase_add_test(tc, test_outer_and_inner);
  tcase_add_test(tc, test_transposed_and_reversed_views);
  tcase_add_test(tc, test_preferred_element_type);
  tcase_add_test(tc, test_empty_contraction_gives_zeros);
  tcase_add_test(tc, test_kernel_allocates_output);
  tcase_add_test(tc, test_shape_errors);
  tcase_add_test(tc, test_contracting_counts_differ);
  tcase_add_test(tc, test_malformed_params);
  tcase_add_test(tc, test_blis_arch_named);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  la_init();
  SRunner *sr = srunner_create(linalg_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
