/*
 * test_config.c - the YAML configuration file (config.h): every key,
 * defaults, precedence of a later file, and each kind of bad file ending
 * in an error at the right line and column, never silently ignored.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* "src/" because the build directory's autoconf header is also named
 * config.h, and comes first in the include path outside src/. */
#include "cli/config.h"
#include "base/error.h"
#include "base/mem.h"

/* Writes [text] to a fresh temporary file; returns its path (static). */
static const char *write_config(const char *text) {
  static char path[64];
  snprintf(path, sizeof path, "/tmp/shmap-cfg-XXXXXX");
  int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  return path;
}

/* Loads [text]; returns cfg_load's result with [o] filled. */
static int load(const char *text, ShmOptions *o) {
  cfg_defaults(o);
  const char *path = write_config(text);
  int rc = cfg_load(o, path, true);
  unlink(path);
  return rc;
}

/* Loads [text], expecting an error at [line]:[col] with [msg]. */
static void expect_error(const char *text, int line, int col, const char *msg) {
  ShmOptions o;
  ck_assert_int_eq(load(text, &o), -1);
  ck_assert(err_occurred());
  ck_assert_str_eq(err_message(), msg);
  ck_assert_int_eq(err_loc().line, line);
  ck_assert_int_eq(err_loc().col, col);
  err_clear();
  cfg_free(&o);
}

START_TEST(test_defaults) {
  ShmOptions o;
  cfg_defaults(&o);
  ck_assert_int_eq(o.devices, 8);
  ck_assert_int_eq(o.history_size, 1000);
  ck_assert_int_eq(o.buffer_cache_mib, 256);
  ck_assert_int_eq(o.jit_cache_size, 64);
  ck_assert_ptr_null(o.history_file);
  ck_assert_int_eq(o.print.precision, print_options.precision);
}
END_TEST

START_TEST(test_every_key) {
  ShmOptions o;
  setenv("HOME", "/home/u", 1);
  ck_assert_int_eq(load("print:\n  precision: 4\n  threshold: 10\n  edgeitems: 2\n"
                        "  linewidth: 40\n  suppress: true\n"
                        "history:\n  size: 5\n  file: ~/h.txt\ndevices: 16\n"
                        "memory:\n  buffer_cache_mib: 0\njit:\n  cache_size: 3\n", &o), 0);
  ck_assert_int_eq(o.buffer_cache_mib, 0);
  ck_assert_int_eq(o.jit_cache_size, 3);
  ck_assert_int_eq(o.print.precision, 4);
  ck_assert_int_eq(o.print.threshold, 10);
  ck_assert_int_eq(o.print.edgeitems, 2);
  ck_assert_int_eq(o.print.linewidth, 40);
  ck_assert(o.print.suppress);
  ck_assert_int_eq(o.history_size, 5);
  ck_assert_str_eq(o.history_file, "/home/u/h.txt");
  ck_assert_int_eq(o.devices, 16);
  ck_assert_ptr_nonnull(o.config_file);
  cfg_free(&o);
}
END_TEST

START_TEST(test_empty_and_partial) {
  ShmOptions o;
  ck_assert_int_eq(load("", &o), 0);
  ck_assert_int_eq(o.devices, 8);
  cfg_free(&o);
  ck_assert_int_eq(load("# nothing\nprint:\n", &o), 0);
  cfg_free(&o);
  ck_assert_int_eq(load("devices: 3\n", &o), 0);
  ck_assert_int_eq(o.devices, 3);
  ck_assert_int_eq(o.print.linewidth, print_options.linewidth);
  cfg_free(&o);
}
END_TEST

START_TEST(test_bad_values) {
  expect_error("devices: 0\n", 1, 10, "devices must be a positive integer");
  expect_error("devices: four\n", 1, 10, "devices must be a positive integer");
  expect_error("devices: '4'\n", 1, 10, "devices must be a positive integer");
  expect_error("devices: 99999\n", 1, 10, "devices must be at most 1024");
  expect_error("print:\n  precision: -1\n", 2, 14,
               "print.precision must be a non-negative integer");
  expect_error("print:\n  suppress: 1\n", 2, 13, "print.suppress must be true or false");
  expect_error("print: [1, 2]\n", 1, 8, "print must be a mapping of keys to values");
  expect_error("memory:\n  buffer_cache_mib: -5\n", 2, 21,
               "memory.buffer_cache_mib must be a non-negative integer");
  expect_error("- 1\n", 1, 1, "the file must be a mapping of keys to values");
}
END_TEST

/* Nothing is ignored: a key given twice, a second document, and a file
 * too large to be a configuration are errors (the last before parsing). */
START_TEST(test_nothing_ignored) {
  expect_error("devices: 2\ndevices: 4\n", 2, 1, "duplicate key 'devices' (first given at line 1)");
  expect_error("print:\n  precision: 3\n  precision: 4\n", 3, 3,
               "duplicate key 'print.precision' (first given at line 2)");
  expect_error("devices: 2\n---\ndevices: 4\n", 2, 1,
               "the file must hold one YAML document; a second one starts here");
  size_t n = CFG_MAX_BYTES + 1;
  char *big = malloc(n + 1);
  ck_assert_ptr_nonnull(big);
  memset(big, '[', n);
  big[n] = '\0';
  ShmOptions o;
  ck_assert_int_eq(load(big, &o), -1);
  ck_assert(strstr(err_message(), "bytes; a configuration is at most 65536") != NULL);
  err_clear();
  cfg_free(&o);
  free(big);
}
END_TEST

START_TEST(test_unknown_keys) {
  expect_error("colour: red\n", 1, 1,
               "unknown key 'colour' (expected one of: print, history, memory, jit, devices)");
  expect_error("history:\n  length: 3\n", 2, 3,
               "unknown key 'history.length' (expected one of: size, file)");
}
END_TEST

START_TEST(test_yaml_syntax) {
  ShmOptions o;
  ck_assert_int_eq(load("print:\n  precision: 3\n linewidth: 4\n", &o), -1);
  ck_assert(strncmp(err_message(), "invalid YAML: ", 14) == 0);
  ck_assert_int_eq(err_loc().line, 3);
  err_clear();
  cfg_free(&o);
}
END_TEST

START_TEST(test_missing_file) {
  ShmOptions o;
  cfg_defaults(&o);
  ck_assert_int_eq(cfg_load(&o, "/nonexistent/shmap.yaml", false), 0);
  ck_assert(!err_occurred());
  ck_assert_int_eq(cfg_load(&o, "/nonexistent/shmap.yaml", true), -1);
  ck_assert(strstr(err_message(), "cannot open config file") != NULL);
  err_clear();
}
END_TEST

START_TEST(test_default_path) {
  setenv("SHMAP_CONFIG", "", 1);
  ck_assert_ptr_null(cfg_default_path());
  unsetenv("SHMAP_CONFIG");
  setenv("XDG_CONFIG_HOME", "/x", 1);
  char *p = cfg_default_path();
  ck_assert_str_eq(p, "/x/shmap/config.yaml");
  shm_free(p);
  unsetenv("XDG_CONFIG_HOME");
  setenv("HOME", "/h", 1);
  p = cfg_default_path();
  ck_assert_str_eq(p, "/h/.config/shmap/config.yaml");
  shm_free(p);
}
END_TEST

START_TEST(test_parse_devices) {
  ck_assert_int_eq(cfg_parse_devices("8"), 8);
  ck_assert_int_eq(cfg_parse_devices("1024"), 1024);
  ck_assert_int_eq(cfg_parse_devices("0"), -1);
  ck_assert_int_eq(cfg_parse_devices("1025"), -1);
  ck_assert_int_eq(cfg_parse_devices("-2"), -1);
  ck_assert_int_eq(cfg_parse_devices("4x"), -1);
  ck_assert_int_eq(cfg_parse_devices(""), -1);
  ck_assert_int_eq(cfg_parse_devices("99999999999999999999"), -1);
}
END_TEST

static Suite *config_suite(void) {
  Suite *s = suite_create("config");
  TCase *tc = tcase_create("core");
  tcase_add_test(tc, test_defaults);
  tcase_add_test(tc, test_every_key);
  tcase_add_test(tc, test_empty_and_partial);
  tcase_add_test(tc, test_bad_values);
  tcase_add_test(tc, test_unknown_keys);
  tcase_add_test(tc, test_nothing_ignored);
  tcase_add_test(tc, test_yaml_syntax);
  tcase_add_test(tc, test_missing_file);
  tcase_add_test(tc, test_default_path);
  tcase_add_test(tc, test_parse_devices);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(config_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
