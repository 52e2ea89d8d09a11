/*
 * test_array.c - array creation, views, copies, conversions, element
 * access and the shape helpers, including the error paths (bad shapes,
 * huge sizes, failed allocations) which must fail cleanly, never crash.
 */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "array/array.h"
#include "base/error.h"
#include "base/mem.h"

/* A contiguous f32 array of [n] elements 0, 1, 2, ... shaped [ndim, shape]. */
static Array *iota_f32(int ndim, const int64_t *shape) {
  Array *a = arr_new(DT_F32, ndim, shape);
  float *d = arr_data(a);
  for (int64_t i = 0; i < a->size; i++)
    d[i] = (float)i;
  return a;
}

START_TEST(test_new_layout) {
  int64_t shape[3] = {2, 3, 4};
  Array *a = arr_new(DT_F32, 3, shape);
  ck_assert_ptr_nonnull(a);
  ck_assert_int_eq(a->size, 24);
  ck_assert_int_eq(a->strides[0], 12);
  ck_assert_int_eq(a->strides[2], 1);
  ck_assert(a->contiguous);
  ck_assert_int_eq(((uintptr_t)arr_data(a)) % 64, 0);
  ck_assert_int_eq(val_refcount(&a->hdr), 1);
  val_decref(&a->hdr);
}
END_TEST

START_TEST(test_large_buffer_aligned) {
  int64_t n = 1 << 20;  /* 4 MiB of f32: from the huge-page cache */
  Array *a = arr_zeros(DT_F32, 1, &n);
  ck_assert_ptr_nonnull(a);
  ck_assert_int_eq(((uintptr_t)arr_data(a)) % 64, 0);
  ck_assert(arr_get_f64(a, n - 1) == 0.0);
  void *p = arr_data(a);
  val_decref(&a->hdr);
  Array *b = arr_new(DT_F32, 1, &n);  /* same size: the cached buffer again */
  ck_assert_ptr_eq(arr_data(b), p);
  val_decref(&b->hdr);
  ck_assert_uint_eq(shm_buf_cached(), (size_t)4 << 20);
  /* another size misses: what the cache held goes back to the system */
  int64_t m = 2 << 20;
  Array *c = arr_new(DT_F32, 1, &m);
  ck_assert_uint_eq(shm_buf_cached(), 0);
  val_decref(&c->hdr);
  ck_assert_uint_eq(shm_buf_cached(), (size_t)8 << 20);
  shm_buf_trim();
  ck_assert_uint_eq(shm_buf_cached(), 0);
}
END_TEST

START_TEST(test_zero_size_and_scalar) {
  int64_t z[2] = {0, 5};
  Array *a = arr_new(DT_I32, 2, z);
  ck_assert_ptr_nonnull(a);
  ck_assert_int_eq(a->size, 0);
  val_decref(&a->hdr);
  Array *s = arr_new(DT_F64, 0, NULL);
  ck_assert_int_eq(s->size, 1);
  val_decref(&s->hdr);
}
END_TEST

START_TEST(test_bad_shapes) {
  int64_t neg[2] = {3, -1};
  ck_assert_ptr_null(arr_new(DT_F32, 2, neg));
  ck_assert_int_eq(err_kind(), ERR_VALUE);
  ck_assert_str_eq(err_message(), "negative dimensions are not allowed");
  err_clear();

  int64_t huge[2] = {INT64_MAX / 2, 4};  /* element count overflows */
  ck_assert_ptr_null(arr_new(DT_F32, 2, huge));
  ck_assert_int_eq(err_kind(), ERR_MEMORY);
  err_clear();

  int64_t big[2] = {1000000, 1000000};  /* 4 TB: more than any machine here */
  ck_assert_ptr_null(arr_new(DT_F32, 2, big));
  ck_assert_int_eq(err_kind(), ERR_MEMORY);
  ck_assert(strstr(err_message(), "(1000000, 1000000)") != NULL);
  err_clear();

  int64_t many[40] = {0};
  ck_assert_ptr_null(arr_new(DT_F32, 40, many));
  ck_assert_int_eq(err_kind(), ERR_VALUE);
  err_clear();
}
END_TEST

START_TEST(test_failed_allocation) {
  int64_t n = 1000;
  shm_mem_fail_after(1);
  ck_assert_ptr_null(arr_new(DT_F32, 1, &n));
  ck_assert_int_eq(err_kind(), ERR_MEMORY);
  err_clear();
  Array *a = arr_new(DT_F32, 1, &n);   /* injection is one-shot */
  ck_assert_ptr_nonnull(a);
  val_decref(&a->hdr);
}
END_TEST

/* Memory that threads write concurrently: whole 128-byte pairs, zeroed. */
START_TEST(test_pair_alloc) {
  for (size_t n = 0; n < 300; n += 37) {
    unsigned char *p = shm_pair_alloc(n);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_eq((uintptr_t)p % SHM_LINE_PAIR, 0);
    size_t padded = n ? (n + SHM_LINE_PAIR - 1) / SHM_LINE_PAIR * SHM_LINE_PAIR : SHM_LINE_PAIR;
    for (size_t i = 0; i < padded; i++) ck_assert_uint_eq(p[i], 0);
    shm_free(p);
  }
  shm_mem_fail_after(1);
  ck_assert_ptr_null(shm_pair_alloc(64));
  void *p = shm_pair_alloc(64);   /* injection is one-shot */
  ck_assert_ptr_nonnull(p);
  shm_free(p);
}
END_TEST

START_TEST(test_scalars) {
  Array *a = arr_scalar_f64(DT_I32, -2.7, false);
  ck_assert_int_eq(arr_get_i64(a, 0), -2);   /* truncates toward zero */
  val_decref(&a->hdr);
  a = arr_scalar_f64(DT_I8, 1000.0, true);   /* saturates */
  ck_assert_int_eq(arr_get_i64(a, 0), 127);
  ck_assert(a->weak);
  val_decref(&a->hdr);
  a = arr_scalar_f64(DT_I32, NAN, false);
  ck_assert_int_eq(arr_get_i64(a, 0), 0);
  val_decref(&a->hdr);
  a = arr_scalar_i64(DT_BOOL, 5, false);
  ck_assert_int_eq(arr_get_i64(a, 0), 1);
  val_decref(&a->hdr);
  a = arr_scalar_f64(DT_BF16, 1.0 / 3.0, false);
  ck_assert(fabs(arr_get_f64(a, 0) - 1.0 / 3.0) < 2e-3);
  val_decref(&a->hdr);
  a = arr_scalar_i64(DT_I8, 300, false);     /* integers wrap, as NumPy */
  ck_assert_int_eq(arr_get_i64(a, 0), 44);
  val_decref(&a->hdr);
}
END_TEST

START_TEST(test_views_and_copies) {
  int64_t shape[2] = {2, 3};
  Array *a = iota_f32(2, shape);
  int64_t tshape[2] = {3, 2}, tstr[2] = {1, 3};
  Array *t = arr_view(a, 2, tshape, tstr, 0);   /* the transpose */
  ck_assert(!t->contiguous);
  ck_assert_int_eq(atomic_load(&a->buf->refcount), 2);
  ck_assert(arr_get_f64(t, 1) == 3.0);          /* t[0, 1] = a[1, 0] */
  val_decref(&a->hdr);                          /* the view keeps the buffer */
  Array *c = arr_contiguous(t);
  ck_assert(c != t && c->contiguous);
  const float *d = arr_data(c);
  float want[6] = {0, 3, 1, 4, 2, 5};
  for (int i = 0; i < 6; i++)
    ck_assert(d[i] == want[i]);
  Array *same = arr_contiguous(c);
  ck_assert_ptr_eq(same, c);
  val_decref(&same->hdr);
  val_decref(&c->hdr);
  val_decref(&t->hdr);
}
END_TEST

START_TEST(test_astype) {
  int64_t n = 5;
  Array *a = arr_new(DT_F32, 1, &n);
  float *d = arr_data(a);
  float v[5] = {1.5f, -1.5f, NAN, 3e9f, -0.0f};
  memcpy(d, v, sizeof v);
  Array *i = arr_astype(a, DT_I32, false);
  ck_assert_int_eq(arr_get_i64(i, 0), 1);
  ck_assert_int_eq(arr_get_i64(i, 1), -1);
  ck_assert_int_eq(arr_get_i64(i, 2), 0);
  ck_assert_int_eq(arr_get_i64(i, 3), INT32_MAX);
  Array *b = arr_astype(a, DT_BOOL, false);
  ck_assert_int_eq(arr_get_i64(b, 2), 1);   /* NaN is truthy */
  ck_assert_int_eq(arr_get_i64(b, 4), 0);
  Array *h = arr_astype(a, DT_F16, true);
  ck_assert(h->weak);
  ck_assert(arr_get_f64(h, 0) == 1.5);
  ck_assert(isinf(arr_get_f64(h, 3)));
  val_decref(&a->hdr);
  val_decref(&i->hdr);
  val_decref(&b->hdr);
  val_decref(&h->hdr);
}
END_TEST

START_TEST(test_to_index) {
  int64_t x;
  Array *i = arr_scalar_i64(DT_I64, 42, false);
  ck_assert_int_eq(arr_to_index(&i->hdr, &x), 0);
  ck_assert_int_eq(x, 42);
  Array *f = arr_scalar_f64(DT_F32, 1.0, false);
  ck_assert_int_eq(arr_to_index(&f->hdr, &x), -1);
  ck_assert_str_eq(err_message(), "expected an integer, got float32 array");
  err_clear();
  double y;
  ck_assert_int_eq(arr_to_double(&f->hdr, &y), 0);
  ck_assert(y == 1.0);
  val_decref(&i->hdr);
  val_decref(&f->hdr);
}
END_TEST

START_TEST(test_shape_strings) {
  char buf[64];
  int64_t s[2] = {8, 32};
  shape_str(buf, sizeof buf, 2, s);
  ck_assert_str_eq(buf, "(8, 32)");
  shape_str(buf, sizeof buf, 1, s);
  ck_assert_str_eq(buf, "(8,)");
  shape_str(buf, sizeof buf, 0, s);
  ck_assert_str_eq(buf, "()");
  aval_str(buf, sizeof buf, DT_F32, 2, s);
  ck_assert_str_eq(buf, "f32[8,32]");
  aval_str(buf, sizeof buf, DT_I32, 0, s);
  ck_assert_str_eq(buf, "i32[]");
  shape_str(buf, 4, 2, s);   /* truncated, still terminated */
  ck_assert_int_eq(strlen(buf), 3);
}
END_TEST

START_TEST(test_broadcast_shapes) {
  int64_t a[2] = {2, 1}, b[1] = {3}, out[SHM_MAXDIM];
  int n;
  ck_assert_int_eq(shape_broadcast(2, a, 1, b, &n, out), 0);
  ck_assert_int_eq(n, 2);
  ck_assert_int_eq(out[0], 2);
  ck_assert_int_eq(out[1], 3);
  int64_t c[2] = {2, 3}, d[1] = {4};
  ck_assert_int_eq(shape_broadcast(2, c, 1, d, &n, out), -1);
  ck_assert_str_eq(err_message(),
                   "operands could not be broadcast together with shapes (2, 3) (4,)");
  err_clear();
}
END_TEST

START_TEST(test_axis_normalize) {
  int ax;
  ck_assert_int_eq(axis_normalize(-1, 3, &ax), 0);
  ck_assert_int_eq(ax, 2);
  ck_assert_int_eq(axis_normalize(3, 2, &ax), -1);
  ck_assert_str_eq(err_message(), "axis 3 is out of bounds for array of dimension 2");
  err_clear();
  ck_assert_int_eq(shape_size(2, (int64_t[]){INT64_MAX, 2}), -1);
  ck_assert_int_eq(shape_size(2, (int64_t[]){INT64_MAX, 0}), 0);
}
END_TEST

/* Process-local shards: arr_partial_holds against every element of
 * random views (blocks, slices, transposes, broadcasts, reshapes and
 * arbitrary strides) of random grids of held blocks, and the runs
 * arr_partial_runs gives against the blocks, over ranks 1 to 3. */
static int64_t runs_seen[1728];   /* the largest grid: 12 x 12 x 12 */

static void mark_run(int64_t lo, int64_t hi, void *ctx) {
  int64_t *last = ctx;
  ck_assert(lo > *last);   /* increasing and maximal */
  *last = hi;
  for (int64_t i = lo; i < hi; i++) runs_seen[i]++;
}

START_TEST(test_partial_holds_exact) {
  srand(7);
  int checked = 0;
  for (int it = 0; it < 5000; it++) {
    int nd = 1 + rand() % 3;
    int64_t shape[3], nblk[3], G[3], total = 1, ncells = 1;
    for (int k = 0; k < nd; k++) {
      nblk[k] = 1 << (rand() % 3);
      shape[k] = nblk[k] * (1 + rand() % 3);
      total *= shape[k];
      ncells *= nblk[k];
    }
    if (ncells == 1) continue;
    for (int k = nd - 1, g = 1; k >= 0; k--) G[k] = g, g *= (int)shape[k];
    uint8_t held[64];
    for (int c = 0; c < ncells; c++) held[c] = (uint8_t)(rand() % 2);
    held[rand() % ncells] = 0;
    Array *a = arr_new(DT_F32, nd, shape);
    ck_assert_int_eq(arr_set_partial(a, VAL_NONE, nblk, held), 0);
    /* the held flag of row-major element [e] */
    uint8_t want[1728];
    for (int64_t e = 0; e < total; e++) {
      int64_t rem = e, cell = 0, idx[3];
      for (int k = nd - 1; k >= 0; k--) idx[k] = rem % shape[k], rem /= shape[k];
      for (int k = 0; k < nd; k++) cell = cell * nblk[k] + idx[k] / (shape[k] / nblk[k]);
      want[e] = held[cell];
    }
    memset(runs_seen, 0, sizeof runs_seen);
    int64_t last = -1;
    arr_partial_runs(a->buf->part, mark_run, &last);
    for (int64_t e = 0; e < total; e++) ck_assert_int_eq(runs_seen[e], want[e]);
    for (int v = 0; v < 8; v++) {
      int vnd = 1 + rand() % 3;
      int64_t vs[3], st[3], off = rand() % total, lo = off, hi = off;
      for (int d = 0; d < vnd; d++) {
        vs[d] = 1 + rand() % 4;
        int kind = rand() % 4;
        st[d] = kind == 0 ? 0 : kind == 1 ? (rand() % 3 - 1) * G[rand() % nd] * (1 + rand() % 2)
                                          : rand() % 7 - 3;
        if (st[d] < 0) lo += (vs[d] - 1) * st[d];
        else hi += (vs[d] - 1) * st[d];
      }
      if (lo < 0 || hi >= total) continue;
      Array *w = arr_view(a, vnd, vs, st, off);
      bool all = true;
      for (int64_t i = 0; i < w->size; i++) {
        int64_t o = off, r = i;
        for (int d = vnd - 1; d >= 0; d--) o += r % vs[d] * st[d], r /= vs[d];
        all &= want[o] != 0;
      }
      ck_assert_int_eq(arr_partial_holds(w), all);
      checked++;
      val_decref(&w->hdr);
    }
    val_decref(&a->hdr);
  }
  ck_assert_int_gt(checked, 2500);
}
END_TEST

static Suite *array_suite(void) {
  Suite *s = suite_create("array");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_new_layout);
  tcase_add_test(tc, test_large_buffer_aligned);
  tcase_add_test(tc, test_zero_size_and_scalar);
  tcase_add_test(tc, test_bad_shapes);
  tcase_add_test(tc, test_failed_allocation);
  tcase_add_test(tc, test_pair_alloc);
  tcase_add_test(tc, test_scalars);
  tcase_add_test(tc, test_views_and_copies);
  tcase_add_test(tc, test_astype);
  tcase_add_test(tc, test_to_index);
  tcase_add_test(tc, test_shape_strings);
  tcase_add_test(tc, test_broadcast_shapes);
  tcase_add_test(tc, test_axis_normalize);
  tcase_add_test(tc, test_partial_holds_exact);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(array_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
