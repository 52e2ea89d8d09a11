/*
 * test_npy.c - .npy files (npy.c): round trips of every dtype, files
 * written by NumPy 1.24 (versions 1.0, 2.0 and 3.0, big-endian, Fortran
 * order, 0-d; the bytes below were made with np.save and
 * numpy.lib.format.write_array), byte-identical saving, and clean errors
 * for bad files.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "array/array.h"
#include "base/error.h"
#include "array/npy.h"

/* ---- fixtures made by NumPy 1.24 ---------------------------------------- */

/* fx i32 v1 */
static const char fx_i32_v1[] =
    "\x93\x4e\x55\x4d\x50\x59\x01\x00\x76\x00\x7b\x27\x64\x65\x73\x63"
    "\x72\x27\x3a\x20\x27\x3c\x69\x34\x27\x2c\x20\x27\x66\x6f\x72\x74"
    "\x72\x61\x6e\x5f\x6f\x72\x64\x65\x72\x27\x3a\x20\x46\x61\x6c\x73"
    "\x65\x2c\x20\x27\x73\x68\x61\x70\x65\x27\x3a\x20\x28\x32\x2c\x20"
    "\x33\x29\x2c\x20\x7d\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x0a"
    "\x00\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00"
    "\x04\x00\x00\x00\x05\x00\x00\x00";
static const size_t fx_i32_v1_len = 152;

/* fx f32 v2 */
static const char fx_f32_v2[] =
    "\x93\x4e\x55\x4d\x50\x59\x02\x00\x74\x00\x00\x00\x7b\x27\x64\x65"
    "\x73\x63\x72\x27\x3a\x20\x27\x3c\x66\x34\x27\x2c\x20\x27\x66\x6f"
    "\x72\x74\x72\x61\x6e\x5f\x6f\x72\x64\x65\x72\x27\x3a\x20\x46\x61"
    "\x6c\x73\x65\x2c\x20\x27\x73\x68\x61\x70\x65\x27\x3a\x20\x28\x33"
    "\x2c\x29\x2c\x20\x7d\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x0a"
    "\x00\x00\x00\x00\x00\x00\x80\x3e\x00\x00\x00\x3f";
static const size_t fx_f32_v2_len = 140;

/* fx f64 v3 */
static const char fx_f64_v3[] =
    "\x93\x4e\x55\x4d\x50\x59\x03\x00\x74\x00\x00\x00\x7b\x27\x64\x65"
    "\x73\x63\x72\x27\x3a\x20\x27\x3c\x66\x38\x27\x2c\x20\x27\x66\x6f"
    "\x72\x74\x72\x61\x6e\x5f\x6f\x72\x64\x65\x72\x27\x3a\x20\x46\x61"
    "\x6c\x73\x65\x2c\x20\x27\x73\x68\x61\x70\x65\x27\x3a\x20\x28\x33"
    "\x2c\x29\x2c\x20\x7d\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x0a"
    "\x00\x00\x00\x00\x00\x00\xf8\x3f\x00\x00\x00\x00\x00\x00\x02\xc0"
    "\x9c\x75\x00\x88\x3c\xe4\x37\x7e";
static const size_t fx_f64_v3_len = 152;

/* fx f8 big */
static const char fx_f8_big[] =
    "\x93\x4e\x55\x4d\x50\x59\x01\x00\x76\x00\x7b\x27\x64\x65\x73\x63"
    "\x72\x27\x3a\x20\x27\x3e\x66\x38\x27\x2c\x20\x27\x66\x6f\x72\x74"
    "\x72\x61\x6e\x5f\x6f\x72\x64\x65\x72\x27\x3a\x20\x46\x61\x6c\x73"
    "\x65\x2c\x20\x27\x73\x68\x61\x70\x65\x27\x3a\x20\x28\x33\x2c\x20"
    "\x32\x29\x2c\x20\x7d\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x0a"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x3f\xf0\x00\x00\x00\x00\x00\x00"
    "\x40\x00\x00\x00\x00\x00\x00\x00\x40\x08\x00\x00\x00\x00\x00\x00"
    "\x40\x10\x00\x00\x00\x00\x00\x00\x40\x14\x00\x00\x00\x00\x00\x00";
static const size_t fx_f8_big_len = 176;

/* fx i4 big */
static const char fx_i4_big[] =
    "\x93\x4e\x55\x4d\x50\x59\x01\x00\x76\x00\x7b\x27\x64\x65\x73\x63"
    "\x72\x27\x3a\x20\x27\x3e\x69\x34\x27\x2c\x20\x27\x66\x6f\x72\x74"
    "\x72\x61\x6e\x5f\x6f\x72\x64\x65\x72\x27\x3a\x20\x46\x61\x6c\x73"
    "\x65\x2c\x20\x27\x73\x68\x61\x70\x65\x27\x3a\x20\x28\x33\x2c\x29"
    "\x2c\x20\x7d\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x0a"
    "\x00\x00\x00\x01\xff\xff\xff\xfe\x00\x01\x11\x70";
static const size_t fx_i4_big_len = 140;

/* fx i8 fortran */
static const char fx_i8_fortran[] =
    "\x93\x4e\x55\x4d\x50\x59\x01\x00\x76\x00\x7b\x27\x64\x65\x73\x63"
    "\x72\x27\x3a\x20\x27\x3c\x69\x38\x27\x2c\x20\x27\x66\x6f\x72\x74"
    "\x72\x61\x6e\x5f\x6f\x72\x64\x65\x72\x27\x3a\x20\x54\x72\x75\x65"
    "\x2c\x20\x27\x73\x68\x61\x70\x65\x27\x3a\x20\x28\x32\x2c\x20\x33"
    "\x29\x2c\x20\x7d\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x0a"
    "\x00\x00\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x00\x00\x00\x00"
    "\x01\x00\x00\x00\x00\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00"
    "\x02\x00\x00\x00\x00\x00\x00\x00\x05\x00\x00\x00\x00\x00\x00\x00";
static const size_t fx_i8_fortran_len = 176;

/* fx f2 */
static const char fx_f2[] =
    "\x93\x4e\x55\x4d\x50\x59\x01\x00\x76\x00\x7b\x27\x64\x65\x73\x63"
    "\x72\x27\x3a\x20\x27\x3c\x66\x32\x27\x2c\x20\x27\x66\x6f\x72\x74"
    "\x72\x61\x6e\x5f\x6f\x72\x64\x65\x72\x27\x3a\x20\x46\x61\x6c\x73"
    "\x65\x2c\x20\x27\x73\x68\x61\x70\x65\x27\x3a\x20\x28\x33\x2c\x29"
    "\x2c\x20\x7d\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x0a"
    "\x00\x38\x00\xbc\xff\x7b";
static const size_t fx_f2_len = 134;

/* fx b1 */
static const char fx_b1[] =
    "\x93\x4e\x55\x4d\x50\x59\x01\x00\x76\x00\x7b\x27\x64\x65\x73\x63"
    "\x72\x27\x3a\x20\x27\x7c\x62\x31\x27\x2c\x20\x27\x66\x6f\x72\x74"
    "\x72\x61\x6e\x5f\x6f\x72\x64\x65\x72\x27\x3a\x20\x46\x61\x6c\x73"
    "\x65\x2c\x20\x27\x73\x68\x61\x70\x65\x27\x3a\x20\x28\x33\x2c\x29"
    "\x2c\x20\x7d\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x0a"
    "\x01\x00\x01";
static const size_t fx_b1_len = 131;

/* fx i1 0d */
static const char fx_i1_0d[] =
    "\x93\x4e\x55\x4d\x50\x59\x01\x00\x76\x00\x7b\x27\x64\x65\x73\x63"
    "\x72\x27\x3a\x20\x27\x7c\x69\x31\x27\x2c\x20\x27\x66\x6f\x72\x74"
    "\x72\x61\x6e\x5f\x6f\x72\x64\x65\x72\x27\x3a\x20\x46\x61\x6c\x73"
    "\x65\x2c\x20\x27\x73\x68\x61\x70\x65\x27\x3a\x20\x28\x29\x2c\x20"
    "\x7d\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x0a"
    "\xf9";
static const size_t fx_i1_0d_len = 129;

/* fx c8 */
static const char fx_c8[] =
    "\x93\x4e\x55\x4d\x50\x59\x01\x00\x76\x00\x7b\x27\x64\x65\x73\x63"
    "\x72\x27\x3a\x20\x27\x3c\x63\x38\x27\x2c\x20\x27\x66\x6f\x72\x74"
    "\x72\x61\x6e\x5f\x6f\x72\x64\x65\x72\x27\x3a\x20\x46\x61\x6c\x73"
    "\x65\x2c\x20\x27\x73\x68\x61\x70\x65\x27\x3a\x20\x28\x31\x2c\x29"
    "\x2c\x20\x7d\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20"
    "\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x20\x0a"
    "\x00\x00\x80\x3f\x00\x00\x00\x40";
static const size_t fx_c8_len = 136;


/* ---- helpers ----------------------------------------------------------- */

static char tmpdir[256];

static const char *tmp_path(const char *name) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", tmpdir, name);
  return path;
}

static const char *write_file(const char *name, const void *data, size_t n) {
  const char *path = tmp_path(name);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(data, 1, n, f), n);
  fclose(f);
  return path;
}

/* Loads the bytes [data] as a file; NULL on error. */
static Array *load_bytes(const void *data, size_t n) {
  err_clear();
  Value *v = npy_load(write_file("in.npy", data, n));
  return v ? AS_ARRAY(v) : NULL;
}

/* Loading [data] fails with a message containing [what] and the path. */
static void expect_error(const void *data, size_t n, const char *what) {
  Array *a = load_bytes(data, n);
  ck_assert_msg(a == NULL, "loaded a bad file (expected '%s')", what);
  ck_assert_msg(strstr(err_message(), what) != NULL, "message '%s' lacks '%s'",
                err_message(), what);
  ck_assert_msg(strstr(err_message(), "in.npy") != NULL,
                "message '%s' does not name the file", err_message());
  ck_assert_int_eq(err_kind(), ERR_IO);
}

static void expect_shape(const Array *a, DType t, int ndim, const int64_t *shape) {
  ck_assert_int_eq(a->dtype, t);
  ck_assert_int_eq(a->ndim, ndim);
  for (int i = 0; i < ndim; i++)
    ck_assert_int_eq(a->shape[i], shape[i]);
}

static void expect_values(const Array *a, const double *want) {
  for (int64_t i = 0; i < a->size; i++)
    ck_assert_msg(arr_get_f64(a, i) == want[i], "element %lld: %g != %g",
                  (long long)i, arr_get_f64(a, i), want[i]);
}

/* The whole contents of [path] into [buf]; the length. */
static size_t slurp(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  size_t n = fread(buf, 1, cap, f);
  fclose(f);
  return n;
}

/* ---- NumPy's files ------------------------------------------------------- */

START_TEST(test_load_v1_int32) {
  Array *a = load_bytes(fx_i32_v1, fx_i32_v1_len);
  ck_assert_msg(a != NULL, "%s", err_message());
  int64_t s[] = {2, 3};
  double w[] = {0, 1, 2, 3, 4, 5};
  expect_shape(a, DT_I32, 2, s);
  expect_values(a, w);
  ck_assert(!a->weak);
  val_decref(&a->hdr);
}
END_TEST

START_TEST(test_load_v2_v3) {
  Array *a = load_bytes(fx_f32_v2, fx_f32_v2_len);
  ck_assert_msg(a != NULL, "%s", err_message());
  int64_t s3[] = {3};
  double w[] = {0, 0.25, 0.5};
  expect_shape(a, DT_F32, 1, s3);
  expect_values(a, w);
  val_decref(&a->hdr);
  a = load_bytes(fx_f64_v3, fx_f64_v3_len);
  ck_assert_msg(a != NULL, "%s", err_message());
  double w3[] = {1.5, -2.25, 1e300};
  expect_shape(a, DT_F64, 1, s3);
  expect_values(a, w3);
  val_decref(&a->hdr);
}
END_TEST

START_TEST(test_load_big_endian) {
  Array *a = load_bytes(fx_f8_big, fx_f8_big_len);
  ck_assert_msg(a != NULL, "%s", err_message());
  int64_t s[] = {3, 2};
  double w[] = {0, 1, 2, 3, 4, 5};
  expect_shape(a, DT_F64, 2, s);
  expect_values(a, w);
  val_decref(&a->hdr);
  a = load_bytes(fx_i4_big, fx_i4_big_len);
  ck_assert_msg(a != NULL, "%s", err_message());
  int64_t s3[] = {3};
  double w3[] = {1, -2, 70000};
  expect_shape(a, DT_I32, 1, s3);
  expect_values(a, w3);
  val_decref(&a->hdr);
}
END_TEST

START_TEST(test_load_fortran_order) {
  Array *a = load_bytes(fx_i8_fortran, fx_i8_fortran_len);
  ck_assert_msg(a != NULL, "%s", err_message());
  int64_t s[] = {2, 3};
  double w[] = {0, 1, 2, 3, 4, 5};
  expect_shape(a, DT_I64, 2, s);
  expect_values(a, w);
  ck_assert(a->contiguous);
  val_decref(&a->hdr);
}
END_TEST

START_TEST(test_load_f16_bool_0d) {
  Array *a = load_bytes(fx_f2, fx_f2_len);
  ck_assert_msg(a != NULL, "%s", err_message());
  int64_t s[] = {3};
  double w[] = {0.5, -1.0, 65504.0};
  expect_shape(a, DT_F16, 1, s);
  expect_values(a, w);
  val_decref(&a->hdr);
  a = load_bytes(fx_b1, fx_b1_len);
  ck_assert_msg(a != NULL, "%s", err_message());
  double wb[] = {1, 0, 1};
  expect_shape(a, DT_BOOL, 1, s);
  expect_values(a, wb);
  val_decref(&a->hdr);
  a = load_bytes(fx_i1_0d, fx_i1_0d_len);
  ck_assert_msg(a != NULL, "%s", err_message());
  double w0[] = {-7};
  expect_shape(a, DT_I8, 0, NULL);
  expect_values(a, w0);
  val_decref(&a->hdr);
}
END_TEST

/* ---- saving ------------------------------------------------------------ */

START_TEST(test_save_is_byte_identical_to_numpy) {
  Array *a = load_bytes(fx_i32_v1, fx_i32_v1_len);
  ck_assert_ptr_nonnull(a);
  const char *path = tmp_path("out.npy");
  ck_assert_int_eq(npy_save(path, a), 0);
  char buf[1024];
  size_t n = slurp(path, buf, sizeof buf);
  ck_assert_uint_eq(n, fx_i32_v1_len);
  ck_assert(memcmp(buf, fx_i32_v1, n) == 0);
  val_decref(&a->hdr);
  /* Fortran and big-endian inputs are saved as NumPy saves C-order LE */
  a = load_bytes(fx_f2, fx_f2_len);
  ck_assert_int_eq(npy_save(path, a), 0);
  n = slurp(path, buf, sizeof buf);
  ck_assert_uint_eq(n, fx_f2_len);
  ck_assert(memcmp(buf, fx_f2, n) == 0);
  val_decref(&a->hdr);
}
END_TEST

/* Saves an array of every dtype and loads it back. */
START_TEST(test_round_trip_every_dtype) {
  static const DType ts[] = {DT_BOOL, DT_I8, DT_I32, DT_I64, DT_BF16, DT_F16,
                             DT_F32, DT_F64};
  int64_t shape[] = {2, 3, 4};
  for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) {
    Array *src = arr_new(DT_F64, 3, shape);
    double *d = arr_data(src);
    for (int64_t i = 0; i < src->size; i++)
      d[i] = ts[k] == DT_BOOL ? (double)(i % 3 == 0) : (double)(i - 11) * 0.5;
    if (!dt_is_float(ts[k]) && ts[k] != DT_BOOL)
      for (int64_t i = 0; i < src->size; i++)
        d[i] = (double)(i * 5 - 60);
    Array *a = arr_astype(src, ts[k], false);
    const char *path = tmp_path("rt.npy");
    ck_assert_int_eq(npy_save(path, a), 0);
    Value *v = npy_load(path);
    ck_assert_msg(v != NULL, "%s", err_message());
    Array *b = AS_ARRAY(v);
    expect_shape(b, ts[k] == DT_BF16 ? DT_F32 : ts[k], 3, shape);
    for (int64_t i = 0; i < a->size; i++)
      ck_assert(arr_get_f64(a, i) == arr_get_f64(b, i));
    val_decref(v);
    val_decref(&a->hdr);
    val_decref(&src->hdr);
  }
}
END_TEST

START_TEST(test_round_trip_view_and_empty) {
  int64_t shape[] = {3, 4}, tshape[] = {4, 3}, tstr[] = {1, 4};
  Array *a = arr_new(DT_F32, 2, shape);
  float *d = arr_data(a);
  for (int i = 0; i < 12; i++)
    d[i] = (float)i;
  Array *t = arr_view(a, 2, tshape, tstr, 0);   /* a.T, not contiguous */
  const char *path = tmp_path("view.npy");
  ck_assert_int_eq(npy_save(path, t), 0);
  Array *b = AS_ARRAY(npy_load(path));
  ck_assert_ptr_nonnull(b);
  expect_shape(b, DT_F32, 2, tshape);
  for (int64_t i = 0; i < 12; i++)
    ck_assert(arr_get_f64(b, i) == arr_get_f64(t, i));
  val_decref(&b->hdr);
  int64_t eshape[] = {0, 5};
  Array *e = arr_new(DT_I32, 2, eshape);
  ck_assert_int_eq(npy_save(path, e), 0);
  b = AS_ARRAY(npy_load(path));
  ck_assert_ptr_nonnull(b);
  expect_shape(b, DT_I32, 2, eshape);
  val_decref(&b->hdr);
  val_decref(&e->hdr);
  val_decref(&t->hdr);
  val_decref(&a->hdr);
}
END_TEST

START_TEST(test_save_to_bad_path) {
  int64_t shape[] = {2};
  Array *a = arr_zeros(DT_F32, 1, shape);
  err_clear();
  ck_assert_int_eq(npy_save("/nonexistent-dir/x.npy", a), -1);
  ck_assert_ptr_nonnull(strstr(err_message(), "/nonexistent-dir/x.npy"));
  val_decref(&a->hdr);
}
END_TEST

/* ---- bad files ----------------------------------------------------------- */

/* A v1.0 file with header text [dict] and [ndata] zero bytes of data. */
static size_t make_file(char *buf, const char *dict, size_t ndata) {
  size_t n = strlen(dict);
  memcpy(buf, "\x93NUMPY\x01\x00", 8);
  buf[8] = (char)((n + 1) & 0xff);
  buf[9] = (char)((n + 1) >> 8);
  memcpy(buf + 10, dict, n);
  buf[10 + n] = '\n';
  memset(buf + 11 + n, 0, ndata);
  return 11 + n + ndata;
}

START_TEST(test_unsupported_dtypes) {
  expect_error(fx_c8, fx_c8_len, "unsupported dtype '<c8'");
  char buf[512];
  size_t n = make_file(buf, "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", 8);
  expect_error(buf, n, "unsupported dtype '|O'");
  n = make_file(buf, "{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (1,), }", 4);
  expect_error(buf, n, "structured");
  n = make_file(buf, "{'descr': '<u2', 'fortran_order': False, 'shape': (1,), }", 2);
  expect_error(buf, n, "unsupported dtype '<u2'");
}
END_TEST

START_TEST(test_bad_magic_and_version) {
  expect_error("GIF89a not numpy at all", 23, "bad magic");
  expect_error("\x93NUM", 4, "bad magic");
  char buf[256];
  size_t n = make_file(buf, "{'descr': '<i4', 'fortran_order': False, 'shape': (1,), }", 4);
  buf[6] = 9;
  expect_error(buf, n, "version 9.0");
}
END_TEST

START_TEST(test_truncated) {
  expect_error(fx_i32_v1, 9, "truncated");                 /* in the length */
  expect_error(fx_i32_v1, 40, "truncated");                /* in the header */
  expect_error(fx_i32_v1, fx_i32_v1_len - 1, "needs 24 bytes of data, the file has 23");
  char big[256];
  memcpy(big, fx_i32_v1, fx_i32_v1_len);
  big[fx_i32_v1_len] = 0;
  expect_error(big, fx_i32_v1_len + 1, "the file has 25");
}
END_TEST

START_TEST(test_bad_header_dicts) {
  char buf[512];
  size_t n = make_file(buf, "['descr', '<i4']", 4);
  expect_error(buf, n, "bad .npy header");
  n = make_file(buf, "{'descr': '<i4', 'shape': (1,), }", 4);
  expect_error(buf, n, "needs the keys");
  n = make_file(buf, "{'descr': '<i4', 'fortran_order': Maybe, 'shape': (1,), }", 4);
  expect_error(buf, n, "fortran_order");
  n = make_file(buf, "{'descr': '<i4', 'fortran_order': False, 'shape': (-1,), }", 4);
  expect_error(buf, n, "shape");
  n = make_file(buf, "{'descr': '<i4', 'fortran_order': False, 'shape': (1, }", 4);
  expect_error(buf, n, "bad .npy header");
  n = make_file(buf, "{'descr': '<i4', 'fortran_order': False, 'shape': (99999999999, 99999999999), }", 4);
  expect_error(buf, n, "in.npy");
  n = make_file(buf, "{'descr': '<i4', 'fortran_order': False, 'shape': (1,), 'extra': 1}", 4);
  expect_error(buf, n, "unexpected key");
}
END_TEST

START_TEST(test_missing_file) {
  err_clear();
  ck_assert_ptr_null(npy_load("/nonexistent-dir/in.npy"));
  ck_assert_ptr_nonnull(strstr(err_message(), "cannot open '/nonexistent-dir/in.npy'"));
}
END_TEST

static Suite *npy_suite(void) {
  Suite *s = suite_create("npy");
  TCase *tc = tcase_create("npy");
  tcase_add_test(tc, test_load_v1_int32);
  tcase_add_test(tc, test_load_v2_v3);
  tcase_add_test(tc, test_load_big_endian);
  tcase_add_test(tc, test_load_fortran_order);
  tcase_add_test(tc, test_load_f16_bool_0d);
  tcase_add_test(tc, test_save_is_byte_identical_to_numpy);
  tcase_add_test(tc, test_round_trip_every_dtype);
  tcase_add_test(tc, test_round_trip_view_and_empty);
  tcase_add_test(tc, test_save_to_bad_path);
  tcase_add_test(tc, test_unsupported_dtypes);
  tcase_add_test(tc, test_bad_magic_and_version);
  tcase_add_test(tc, test_truncated);
  tcase_add_test(tc, test_bad_header_dicts);
  tcase_add_test(tc, test_missing_file);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/shmap-test-npy-XXXXXX");
  if (!mkdtemp(tmpdir))
    return 2;
  SRunner *sr = srunner_create(npy_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  remove(tmp_path("in.npy"));
  remove(tmp_path("out.npy"));
  remove(tmp_path("rt.npy"));
  remove(tmp_path("view.npy"));
  rmdir(tmpdir);
  return failed ? 1 : 0;
}
