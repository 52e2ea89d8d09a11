/*
 * test_breakpoints.c - the debugger's breakpoint table as the debug
 * adapter fills it (debug_impl.h): hit conditions in every form
 * (dbg_hit_matches), malformed ones refused, and dbg_bp_insert keeping
 * condition, hit condition and log message.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "cli/debug_impl.h"

START_TEST(test_hit_forms) {
  /* "N" and "== N": that crossing only */
  ck_assert_int_eq(dbg_hit_matches("3", 2), 0);
  ck_assert_int_eq(dbg_hit_matches("3", 3), 1);
  ck_assert_int_eq(dbg_hit_matches("3", 4), 0);
  ck_assert_int_eq(dbg_hit_matches("== 3", 3), 1);
  ck_assert_int_eq(dbg_hit_matches(" ==3 ", 4), 0);
  ck_assert_int_eq(dbg_hit_matches(">= 3", 2), 0);
  ck_assert_int_eq(dbg_hit_matches(">= 3", 3), 1);
  ck_assert_int_eq(dbg_hit_matches("> 3", 3), 0);
  ck_assert_int_eq(dbg_hit_matches("> 3", 4), 1);
  ck_assert_int_eq(dbg_hit_matches("<= 3", 3), 1);
  ck_assert_int_eq(dbg_hit_matches("<= 3", 4), 0);
  ck_assert_int_eq(dbg_hit_matches("< 3", 2), 1);
  ck_assert_int_eq(dbg_hit_matches("< 3", 3), 0);
  /* "% N": every N-th */
  ck_assert_int_eq(dbg_hit_matches("% 4", 4), 1);
  ck_assert_int_eq(dbg_hit_matches("%4", 8), 1);
  ck_assert_int_eq(dbg_hit_matches("% 4", 6), 0);
}
END_TEST

START_TEST(test_hit_malformed) {
  const char *bad[] = {"", "x", "== ", "3 4", "=3", "% 0", "-1", ">= 2x", "99999999999", "!= 3"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
    ck_assert_msg(dbg_hit_matches(bad[i], 1) == -1, "'%s' was accepted", bad[i]);
}
END_TEST

START_TEST(test_insert_keeps_options) {
  int a = dbg_bp_insert("prog.shm", 4, "x > 1", "% 2", "x is {x}", false);
  int b = dbg_bp_insert("dir/prog.shm", 9, "", NULL, "", false);
  ck_assert_int_gt(a, 0);
  ck_assert_int_eq(b, a + 1);
  pthread_mutex_lock(&dbg_state.lock);
  const Bp *p = dbg_bp_find(a), *q = dbg_bp_find(b);
  ck_assert_str_eq(p->file, "prog.shm");
  ck_assert_int_eq(p->line, 4);
  ck_assert_str_eq(p->cond, "x > 1");
  ck_assert_str_eq(p->hit_cond, "% 2");
  ck_assert_str_eq(p->log, "x is {x}");
  ck_assert(p->enabled && !p->temporary);
  ck_assert(!q->cond && !q->hit_cond && !q->log);   /* empty means none */
  dbg_bp_delete(dbg_bp_find(a));
  dbg_bp_delete(dbg_bp_find(b));
  ck_assert_ptr_null(dbg_bp_find(a));
  pthread_mutex_unlock(&dbg_state.lock);
  ck_assert_int_eq(atomic_load(&dbg_state.nbp_enabled), 0);
}
END_TEST

static Suite *breakpoints_suite(void) {
  Suite *s = suite_create("breakpoints");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_hit_forms);
  tcase_add_test(tc, test_hit_malformed);
  tcase_add_test(tc, test_insert_keeps_options);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(breakpoints_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
