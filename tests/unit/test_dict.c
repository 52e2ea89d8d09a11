/*
 * test_dict.c - dicts (base/value.c): insertion order, lookup by key and
 * by C string on both sides of the size where the hash index starts,
 * numbers that are equal as keys (1, 1.0, True) being one key, tuple
 * keys, deletion keeping order and the index, and an unhashable key;
 * and a scope (lang/eval.c) refusing a name whose interning failed.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "array/array.h"
#include "base/error.h"
#include "base/intern.h"
#include "base/value.h"
#include "lang/eval.h"

static Value *num_i(int64_t x) { return (Value *)arr_scalar_i64(DT_I32, x, true); }
static Value *num_f(double x) { return (Value *)arr_scalar_f64(DT_F32, x, true); }

static Value *key_str(int i) {
  char b[32];
  snprintf(b, sizeof b, "name%d", i);
  return str_from(b);
}

/* A dict of n string keys name0.. with values i, looked up every way. */
static void check_strings(int n) {
  Value *d = dict_new();
  for (int i = 0; i < n; i++) {
    Value *k = key_str(i), *v = num_i(i);
    ck_assert_int_eq(dict_set(d, k, v), 0);
    val_decref(k);
    val_decref(v);
  }
  ck_assert_uint_eq(((Dict *)d)->len, (size_t)n);
  for (int i = 0; i < n; i++) {
    char b[32];
    snprintf(b, sizeof b, "name%d", i);
    Value *k = str_from(b), *v = dict_get(d, k), *w = dict_get_str(d, b);
    ck_assert_ptr_nonnull(v);
    ck_assert_ptr_eq(v, w);
    double x;
    ck_assert(arr_to_double(v, &x) == 0 && x == i);
    ck_assert(val_equal_key(((Dict *)d)->keys[i], k));   /* insertion order */
    val_decref(k);
  }
  ck_assert_ptr_null(dict_get_str(d, "name"));
  ck_assert_ptr_null(dict_get_str(d, "absent"));
  Value *other = str_from("name-1");
  ck_assert_ptr_null(dict_get(d, other));
  val_decref(other);
  val_decref(d);
}

START_TEST(test_sizes) {
  for (int n = 0; n < 40; n++) check_strings(n);
  check_strings(5000);
}
END_TEST

/* Setting an existing key replaces its value in place: no new entry. */
START_TEST(test_replace) {
  Value *d = dict_new();
  for (int round = 0; round < 3; round++)
    for (int i = 0; i < 20; i++) {
      Value *k = key_str(i), *v = num_i(100 * round + i);
      ck_assert_int_eq(dict_set(d, k, v), 0);
      val_decref(k);
      val_decref(v);
    }
  ck_assert_uint_eq(((Dict *)d)->len, 20);
  double x;
  ck_assert(arr_to_double(dict_get_str(d, "name7"), &x) == 0 && x == 207);
  val_decref(d);
}
END_TEST

/* Python's rule: keys equal as numbers are one key (hash(1) == hash(1.0)). */
START_TEST(test_number_keys) {
  for (int n = 0; n <= 30; n += 30) {
    Value *d = dict_new();
    for (int i = 0; i < n; i++) {   /* filler, so the index is used past 8 */
      Value *k = key_str(i);
      dict_set(d, k, k);
      val_decref(k);
    }
    Value *one = num_i(1), *onef = num_f(1.0), *t = val_true(), *half = num_f(0.5),
          *neg = num_i(-3);
    ck_assert_int_eq(dict_set(d, one, one), 0);
    ck_assert_ptr_eq(dict_get(d, onef), one);
    ck_assert_ptr_eq(dict_get(d, t), one);
    ck_assert_int_eq(dict_set(d, onef, half), 0);
    ck_assert_uint_eq(((Dict *)d)->len, (size_t)n + 1);
    ck_assert_ptr_eq(dict_get(d, one), half);
    ck_assert_ptr_null(dict_get(d, half));
    ck_assert_int_eq(dict_set(d, neg, neg), 0);
    Value *neg2 = num_f(-3.0);
    ck_assert_ptr_eq(dict_get(d, neg2), neg);
    val_decref(neg2);
    /* tuple keys by their items */
    Value *a = tuple_pack(2, (Value *[]){one, half}), *b = tuple_pack(2, (Value *[]){onef, half});
    ck_assert_int_eq(dict_set(d, a, a), 0);
    ck_assert_ptr_eq(dict_get(d, b), a);
    val_decref(a);
    val_decref(b);
    val_decref(one); val_decref(onef); val_decref(half); val_decref(neg);
    val_decref(d);
  }
}
END_TEST

/* Deleting keeps the others' order and keeps them findable. */
START_TEST(test_delete) {
  Value *d = dict_new();
  for (int i = 0; i < 50; i++) {
    Value *k = key_str(i), *v = num_i(i);
    dict_set(d, k, v);
    val_decref(k);
    val_decref(v);
  }
  for (int i = 0; i < 50; i += 3) {
    Value *k = key_str(i);
    ck_assert_int_eq(dict_del(d, k), 1);
    ck_assert_int_eq(dict_del(d, k), 0);
    val_decref(k);
  }
  Dict *dd = (Dict *)d;
  int prev = -1;
  for (size_t j = 0; j < dd->len; j++) {
    double x;
    ck_assert(arr_to_double(dd->vals[j], &x) == 0);
    ck_assert_int_gt((int)x, prev);
    ck_assert_int_ne((int)x % 3, 0);
    prev = (int)x;
    char b[32];
    snprintf(b, sizeof b, "name%d", (int)x);
    ck_assert_ptr_eq(dict_get_str(d, b), dd->vals[j]);
  }
  ck_assert_ptr_null(dict_get_str(d, "name3"));
  Value *k = key_str(3), *v = num_i(-1);   /* back, at the end */
  dict_set(d, k, v);
  ck_assert_ptr_eq(dd->vals[dd->len - 1], v);
  ck_assert_ptr_eq(dict_get(d, k), v);
  val_decref(k);
  val_decref(v);
  val_decref(d);
}
END_TEST

/* An unhashable key: dict_set's TypeError; a lookup finds nothing and
 * leaves no error behind. */
START_TEST(test_unhashable) {
  for (int n = 0; n <= 20; n += 20) {
    Value *d = dict_new();
    for (int i = 0; i < n; i++) {
      Value *k = key_str(i);
      dict_set(d, k, k);
      val_decref(k);
    }
    Value *l = list_new(0);
    err_clear();
    ck_assert_int_eq(dict_set(d, l, l), -1);
    ck_assert(err_occurred());
    err_clear();
    ck_assert_ptr_null(dict_get(d, l));
    ck_assert(!err_occurred());
    val_decref(l);
    val_decref(d);
  }
}
END_TEST

/* A name whose interning failed (NULL) is a MemoryError, not a binding
 * no lookup finds: start-up's built-ins were silently missing so. */
START_TEST(test_scope_unnamed) {
  Env *e = env_new(NULL);
  Value *v = num_i(7);
  err_clear();
  ck_assert_int_eq(env_set(e, NULL, v), -1);
  ck_assert(err_occurred());
  err_clear();
  const char *x = intern_cstr("x");
  ck_assert_int_eq(env_set(e, x, v), 0);
  ck_assert_ptr_eq(env_lookup(e, x), v);
  val_decref(v);
  env_decref(e);
}
END_TEST

static Suite *dict_suite(void) {
  Suite *s = suite_create("dict");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_sizes);
  tcase_add_test(tc, test_replace);
  tcase_add_test(tc, test_number_keys);
  tcase_add_test(tc, test_delete);
  tcase_add_test(tc, test_unhashable);
  tcase_add_test(tc, test_scope_unnamed);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(dict_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
