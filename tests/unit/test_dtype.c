/*
 * test_dtype.c - dtype names, JAX's promotion lattice with weak types, and
 * the bf16/f16 conversions.  Expected values are JAX's
 * (jnp.promote_types and jax.numpy's weak-type rules).
 */
#include <check.h>
#include <math.h>
#include <stdlib.h>

#include "base/dtype.h"

/* One promotion case: (a, weak a) + (b, weak b) -> (result, weak). */
typedef struct {
  DType a;
  bool wa;
  DType b;
  bool wb;
  DType r;
  bool wr;
} Promo;

static const Promo promos[] = {
    {DT_F32, false, DT_F32, false, DT_F32, false},
    {DT_I32, false, DT_F32, false, DT_F32, false},  /* i32 + f32 is f32 */
    {DT_F32, false, DT_F64, false, DT_F64, false},
    {DT_F16, false, DT_F32, true, DT_F16, false},   /* x_f16 * 2.0 stays f16 */
    {DT_I8, false, DT_I32, true, DT_I8, false},     /* x_i8 + 1 is i8 */
    {DT_I32, false, DT_F32, true, DT_F32, true},    /* i32 * 2.0: weak f32 */
    {DT_BF16, false, DT_F16, false, DT_F32, false}, /* bf16 + f16 is f32 */
    {DT_I64, false, DT_F16, false, DT_F16, false},
    {DT_I8, false, DT_BF16, false, DT_BF16, false},
    {DT_BOOL, false, DT_I32, true, DT_I32, true},
    {DT_BOOL, false, DT_I8, false, DT_I8, false},
    {DT_BOOL, false, DT_F32, true, DT_F32, true},
    {DT_I32, true, DT_F32, true, DT_F32, true},     /* 1 + 2.0 */
    {DT_I32, true, DT_I32, true, DT_I32, true},
    {DT_I32, true, DT_I64, false, DT_I64, false},
    {DT_I8, false, DT_I64, false, DT_I64, false},
    {DT_F64, false, DT_I32, true, DT_F64, false},
    {DT_I32, false, DT_I32, true, DT_I32, false},
};

START_TEST(test_promote_table) {
  const Promo *c = &promos[_i];
  bool w, w2;
  ck_assert_int_eq(dt_promote(c->a, c->wa, c->b, c->wb, &w), c->r);
  ck_assert_int_eq(w, c->wr);
  /* promotion is symmetric */
  ck_assert_int_eq(dt_promote(c->b, c->wb, c->a, c->wa, &w2), c->r);
  ck_assert_int_eq(w2, c->wr);
}
END_TEST

START_TEST(test_names) {
  DType t;
  ck_assert_str_eq(dt_name(DT_F32), "float32");
  ck_assert_str_eq(dt_short(DT_BF16), "bf16");
  ck_assert(dt_parse("float16", &t) && t == DT_F16);
  ck_assert(dt_parse("i64", &t) && t == DT_I64);
  ck_assert(dt_parse("bool", &t) && t == DT_BOOL);
  ck_assert(!dt_parse("float128", &t));
  ck_assert_uint_eq(dt_size(DT_BF16), 2);
  ck_assert(dt_is_float(DT_BF16) && !dt_is_float(DT_I8));
  ck_assert(dt_is_int(DT_I8) && !dt_is_int(DT_BOOL));
  ck_assert_int_eq(dt_float_of(DT_I32), DT_F32);
  ck_assert_int_eq(dt_float_of(DT_F16), DT_F16);
}
END_TEST

START_TEST(test_bf16) {
  ck_assert_uint_eq(dt_f32_to_bf16(1.0f), 0x3f80);
  ck_assert(dt_bf16_to_f32(0x3f80) == 1.0f);
  /* 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even (1) */
  ck_assert_uint_eq(dt_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
  /* 1 + 3*2^-8 ties up to the even 1 + 2^-6 */
  ck_assert_uint_eq(dt_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
  ck_assert(isnan(dt_bf16_to_f32(dt_f32_to_bf16(NAN))));
  ck_assert(isinf(dt_bf16_to_f32(dt_f32_to_bf16(INFINITY))));
  ck_assert(isinf(dt_bf16_to_f32(dt_f32_to_bf16(3.4e38f))));  /* rounds up to inf */
}
END_TEST

START_TEST(test_f16) {
  ck_assert_uint_eq(dt_f32_to_f16(1.0f), 0x3c00);
  ck_assert_uint_eq(dt_f32_to_f16(-2.0f), 0xc000);
  ck_assert_uint_eq(dt_f32_to_f16(65504.0f), 0x7bff);
  ck_assert_uint_eq(dt_f32_to_f16(65520.0f), 0x7c00);          /* overflow -> inf */
  ck_assert_uint_eq(dt_f32_to_f16(0x1p-24f), 0x0001);          /* smallest subnormal */
  ck_assert_uint_eq(dt_f32_to_f16(0x1p-25f), 0x0000);          /* tie to even: 0 */
  ck_assert_uint_eq(dt_f32_to_f16(0x1.8p-24f), 0x0002);        /* tie to even: 2 */
  ck_assert_uint_eq(dt_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);   /* tie to even */
  ck_assert(dt_f16_to_f32(0x0001) == 0x1p-24f);
  ck_assert(dt_f16_to_f32(0x7bff) == 65504.0f);
  ck_assert(isnan(dt_f16_to_f32(dt_f32_to_f16(NAN))));
  ck_assert(dt_f16_to_f32(0x8000) == 0.0f && signbit(dt_f16_to_f32(0x8000)));
}
END_TEST

START_TEST(test_f16_roundtrip) {
  /* every finite f16 survives f16 -> f32 -> f16 */
  for (uint32_t h = 0; h < 0x10000; h++) {
    if ((h & 0x7c00) == 0x7c00)
      continue;
    ck_assert_uint_eq(dt_f32_to_f16(dt_f16_to_f32((uint16_t)h)), h);
  }
}
END_TEST

static Suite *dtype_suite(void) {
  Suite *s = suite_create("dtype");
  TCase *tc = tcase_create("core");
  tcase_add_loop_test(tc, test_promote_table, 0, (int)(sizeof promos / sizeof promos[0]));
  tcase_add_test(tc, test_names);
  tcase_add_test(tc, test_bf16);
  tcase_add_test(tc, test_f16);
  tcase_add_test(tc, test_f16_roundtrip);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(dtype_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
