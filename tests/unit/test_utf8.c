/*
 * test_utf8.c - UTF-8 as strings and sources use it: every code point
 * survives encode then decode, counts and offsets are in code points,
 * validation finds the first bad byte with the reason Python's codec
 * gives, and a stray byte decodes alone without reading past the end.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"

/* [cp] encodes to its length of bytes and decodes back. */
static void round_trip(uint32_t cp) {
  char u[4];
  int n = utf8_encode(cp, u);
  ck_assert_int_eq(n, cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4);
  size_t i = 0;
  ck_assert_uint_eq(utf8_decode(u, (size_t)n, &i), cp);
  ck_assert_uint_eq(i, (size_t)n);
  ck_assert_uint_eq(utf8_count(u, (size_t)n), 1);
}

/* Every code point below U+0800, each length's first and last, and a
 * stride through the rest. */
START_TEST(test_round_trip) {
  for (uint32_t cp = 0; cp < 0x800; cp++) round_trip(cp);
  const uint32_t ends[] = {0x800, 0xFFFF, 0x10000, UTF8_MAX_CP};
  for (size_t k = 0; k < 4; k++) round_trip(ends[k]);
  for (uint32_t cp = 0x800; cp <= UTF8_MAX_CP; cp += 0x3FF) round_trip(cp);
}
END_TEST

START_TEST(test_count_offset) {
  const char *s = "h\xc3\xa9\xe6\x97\xa5\xf0\x9f\x98\x80!";   /* hé日😀! */
  size_t n = strlen(s);
  ck_assert_uint_eq(utf8_count(s, n), 5);
  size_t want[] = {0, 1, 3, 6, 10, 11};
  for (size_t k = 0; k <= 5; k++) ck_assert_uint_eq(utf8_offset(s, n, k), want[k]);
}
END_TEST

/* [s] is bad at byte [at] for [why]. */
static void bad(const char *s, size_t at, const char *why) {
  const char *got = NULL;
  ck_assert_uint_eq(utf8_check(s, strlen(s), &got), at);
  ck_assert_str_eq(got, why);
}

START_TEST(test_check) {
  const char *why = NULL;
  const char *ok = "plain \xc3\xa9 \xe6\x97\xa5 \xf4\x8f\xbf\xbf";
  ck_assert_uint_eq(utf8_check(ok, strlen(ok), &why), strlen(ok));
  bad("ab\xff", 2, "invalid start byte");
  bad("a\x80", 1, "invalid start byte");
  bad("\xc0\xaf", 0, "invalid start byte");            /* overlong '/' */
  bad("\xe0\x80\xaf", 0, "invalid continuation byte"); /* overlong */
  bad("\xed\xa0\x80", 0, "invalid continuation byte"); /* a surrogate */
  bad("\xf4\x90\x80\x80", 0, "invalid continuation byte"); /* > U+10FFFF */
  bad("x\xe6\x97", 1, "unexpected end of data");
  bad("\xe6(", 0, "invalid continuation byte");
}
END_TEST

START_TEST(test_stray_bytes) {
  const char s[] = "\xe6\x97";   /* cut short: each byte alone */
  size_t i = 0;
  ck_assert_uint_eq(utf8_decode(s, 2, &i), 0xe6);
  ck_assert_uint_eq(i, 1);
  ck_assert_uint_eq(utf8_decode(s, 2, &i), 0x97);
  ck_assert_uint_eq(i, 2);
}
END_TEST

START_TEST(test_classes) {
  ck_assert(utf8_isdigit('7') && utf8_isdigit(0x663) && utf8_isdigit(0xB2) && !utf8_isdigit('a'));
  ck_assert(utf8_isspace(0x3000) && utf8_isspace(0x1C) && !utf8_isspace(0x200B));
  ck_assert(utf8_isprintable(0xE9) && !utf8_isprintable(0xA0) && !utf8_isprintable(0x200B));
  ck_assert(utf8_isalpha(0x65E5) && !utf8_isalpha(0x663));
  ck_assert_uint_eq(utf8_upper(0xE9), 0xC9);
  ck_assert_uint_eq(utf8_lower(0x3A3), 0x3C3);
  ck_assert(utf8_isupper(0xC9) && utf8_islower(0xE9) && !utf8_isupper(0x65E5));
}
END_TEST

static Suite *utf8_suite(void) {
  Suite *s = suite_create("utf8");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_round_trip);
  tcase_add_test(tc, test_count_offset);
  tcase_add_test(tc, test_check);
  tcase_add_test(tc, test_stray_bytes);
  tcase_add_test(tc, test_classes);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(utf8_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
