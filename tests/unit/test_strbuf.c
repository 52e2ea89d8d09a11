/*
 * test_strbuf.c - the growable byte buffer: appends of text and of raw
 * bytes, printf output longer than any stack buffer, spaces, and an
 * allocation failure that leaves the buffer marked and quiet.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "base/strbuf.h"

START_TEST(test_appends) {
  StrBuf b = {0};
  ck_assert_str_eq(sbuf_text(&b), "");
  sbuf_puts(&b, "psum");
  sbuf_add(&b, "(x, 'i')xyz", 8);
  sbuf_spaces(&b, 2);
  sbuf_spaces(&b, -1);
  sbuf_printf(&b, "%d:%s", 7, "ok");
  ck_assert_str_eq(sbuf_text(&b), "psum(x, 'i')  7:ok");
  ck_assert_uint_eq(b.len, strlen("psum(x, 'i')  7:ok"));
  ck_assert(!b.failed);
  sbuf_free(&b);
  ck_assert_ptr_null(b.data);
  ck_assert_uint_eq(b.len, 0);
}
END_TEST

/* Raw bytes with NULs in them (a gathered device's message) keep their
 * length; the text stays NUL-terminated after them. */
START_TEST(test_bytes) {
  StrBuf b = {0};
  int64_t x = 0x0102030405060708;
  for (int i = 0; i < 1000; i++) sbuf_add(&b, &x, sizeof x);
  ck_assert_uint_eq(b.len, 8000);
  ck_assert(!memcmp(b.data + 7992, &x, sizeof x));
  ck_assert_int_eq(b.data[8000], 0);
  sbuf_free(&b);
}
END_TEST

/* printf output past the stack buffer (a plan's long parameter) is whole. */
START_TEST(test_long_printf) {
  StrBuf b = {0};
  char big[3000];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = 0;
  sbuf_puts(&b, "<");
  sbuf_printf(&b, "%s|%s", big, big);
  ck_assert_uint_eq(b.len, 1 + 2 * (sizeof big - 1) + 1);
  ck_assert_int_eq(b.data[1 + sizeof big - 1], '|');
  ck_assert_int_eq(b.data[b.len - 1], 'a');
  sbuf_free(&b);
}
END_TEST

/* A failed allocation marks the buffer; later appends do nothing. */
START_TEST(test_failure) {
  StrBuf b = {0};
  sbuf_puts(&b, "first");
  shm_mem_fail_after(1);
  char big[200];
  memset(big, 'b', sizeof big);
  sbuf_add(&b, big, sizeof big);
  shm_mem_fail_after(0);
  ck_assert(b.failed);
  sbuf_puts(&b, "more");
  ck_assert_str_eq(sbuf_text(&b), "first");
  sbuf_free(&b);
  ck_assert(!b.failed);
}
END_TEST

static Suite *strbuf_suite(void) {
  Suite *s = suite_create("strbuf");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_appends);
  tcase_add_test(tc, test_bytes);
  tcase_add_test(tc, test_long_printf);
  tcase_add_test(tc, test_failure);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(strbuf_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
