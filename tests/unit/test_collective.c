/*
 * test_collective.c - the device pool and the collective engine, driven
 * from C: every collective and parameter on 1-D and 2-D meshes against
 * hand-computed values, axis_index_groups, seed 002's ragged example,
 * mismatches and early returns ending in errors, 8 devices on few cores,
 * and the reference mode agreeing with the fast mode bit for bit.
 *
 * Each case runs a C body on every device that builds its operand,
 * applies a collective the way prim_apply does (shape rule, fresh output,
 * kernel) and keeps the result; the main thread checks the results.
 * Device element convention: device r's operand element k is 100*r + k.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "array/array.h"
#include "spmd/collective.h"
#include "spmd/device.h"
#include "base/error.h"
#include "array/prim.h"
#include "base/value.h"

#define MAXDEV 8

/* ---- building values ------------------------------------------------------ */

static Value *ival(int64_t x) { return &arr_scalar_i64(DT_I32, x, true)->hdr; }

static Value *names1(const char *a) {
  Value *t = tuple_new(1);
  tuple_set_steal(t, 0, str_from(a));
  return t;
}

static Value *names2(const char *a, const char *b) {
  Value *t = tuple_new(2);
  tuple_set_steal(t, 0, str_from(a));
  tuple_set_steal(t, 1, str_from(b));
  return t;
}

/* A tuple of [ng] tuples of [len] ints from xs (row-major). */
static Value *int_groups(int ng, int len, const int64_t *xs) {
  Value *t = tuple_new((size_t)ng);
  for (int g = 0; g < ng; g++) {
    Value *u = tuple_new((size_t)len);
    for (int j = 0; j < len; j++) tuple_set_steal(u, (size_t)j, ival(xs[g * len + j]));
    tuple_set_steal(t, (size_t)g, u);
  }
  return t;
}

static void padd(Params *p, const char *name, Value *v) {
  p->p[p->n].name = name;
  p->p[p->n].value = v;
  p->n++;
}

static void pclear(Params *p) {
  for (int i = 0; i < p->n; i++) val_decref(p->p[i].value);
  p->n = 0;
}

/* f32 array of [shape] with element k = base + k. */
static Array *arange_f32(int ndim, const int64_t *shape, float base) {
  Array *a = arr_new(DT_F32, ndim, shape);
  float *d = arr_data(a);
  for (int64_t k = 0; k < a->size; k++) d[k] = base + (float)k;
  return a;
}

static Array *from_f32(int n, const float *xs) {
  int64_t shape[1] = {n};
  Array *a = arr_new(DT_F32, 1, shape);
  memcpy(arr_data(a), xs, sizeof(float) * (size_t)n);
  return a;
}

static Array *from_i32(int n, const int32_t *xs) {
  int64_t shape[1] = {n};
  Array *a = arr_new(DT_I32, 1, shape);
  memcpy(arr_data(a), xs, sizeof(int32_t) * (size_t)n);
  return a;
}

/* ---- meshes ------------------------------------------------------------------ */

static MeshDesc mesh1(const char *a, int n) {
  MeshDesc m = {0};
  m.naxes = 1;
  m.names[0] = a;
  m.sizes[0] = n;
  m.ndevices = n;
  return m;
}

static MeshDesc mesh2(const char *a, int na, const char *b, int nb) {
  MeshDesc m = {0};
  m.naxes = 2;
  m.names[0] = a;
  m.sizes[0] = na;
  m.names[1] = b;
  m.sizes[1] = nb;
  m.ndevices = na * nb;
  return m;
}

/* ---- one collective on every device -------------------------------------------- */

typedef struct Op {
  ShapeRule shape;
  Kernel kernel;
  Params params;                 /* shared, read-only while devices run */
  int nin;
  void (*make)(const struct Op *op, int rank, Array **ins);
  int ndim;                      /* for the default maker */
  int64_t dims[4];
  bool random;                   /* default maker: pseudo-random values */
  Array *out[MAXDEV];            /* results per rank */
  int repeat;                    /* run the collective this many times */
} Op;

/* Default operand: arange from 100*rank, or reproducible noise. */
static void make_default(const Op *op, int rank, Array **ins) {
  Array *a = arange_f32(op->ndim, op->dims, 100.0f * (float)rank);
  if (op->random) {
    float *d = arr_data(a);
    uint32_t s = 12345u + 7919u * (uint32_t)rank;
    for (int64_t k = 0; k < a->size; k++) {
      s = s * 1664525u + 1013904223u;
      d[k] = (float)(s >> 8) / 16777216.0f * 3.0f - 1.5f;
    }
  }
  ins[0] = a;
}

/* What prim_apply does for a collective: shape rule, new output, kernel. */
static Array *apply(const Op *op, Array **ins) {
  AVal in[6], out;
  for (int i = 0; i < op->nin; i++) {
    memset(&in[i], 0, sizeof in[i]);
    in[i].dtype = ins[i]->dtype;
    in[i].ndim = ins[i]->ndim;
    memcpy(in[i].shape, ins[i]->shape, sizeof(int64_t) * (size_t)ins[i]->ndim);
  }
  if (op->shape(in, op->nin, &op->params, &out) < 0) return NULL;
  Array *res = arr_new(out.dtype, out.ndim, out.shape);
  if (!res) return NULL;
  if (op->kernel(ins, op->nin, &op->params, &res) < 0) {
    val_decref(&res->hdr);
    return NULL;
  }
  return res;
}

static void op_body(int rank, void *arg) {
  Op *op = arg;
  Array *ins[6] = {0};
  op->make(op, rank, ins);
  int times = op->repeat ? op->repeat : 1;
  for (int t = 0; t < times; t++) {
    if (op->out[rank]) val_decref(&op->out[rank]->hdr);
    op->out[rank] = apply(op, ins);
    if (!op->out[rank]) break;
  }
  for (int i = 0; i < op->nin; i++) val_decref(&ins[i]->hdr);
}

static int run_body(MeshDesc *m, bool reference, void (*fn)(int, void *), void *arg) {
  CollGroup *g = coll_group_new(m, reference);
  ck_assert_ptr_nonnull(g);
  int rc = coll_run(g, fn, arg);
  coll_group_free(g);
  return rc;
}

static void op_init(Op *op, ShapeRule s, Kernel k, int ndim, const int64_t *dims) {
  memset(op, 0, sizeof *op);
  op->shape = s;
  op->kernel = k;
  op->nin = 1;
  op->make = make_default;
  op->ndim = ndim;
  if (ndim > 0) memcpy(op->dims, dims, sizeof(int64_t) * (size_t)ndim);
}

static void op_free(Op *op) {
  for (int r = 0; r < MAXDEV; r++)
    if (op->out[r]) val_decref(&op->out[r]->hdr);
  memset(op->out, 0, sizeof op->out);
}

/* Runs [op] on [m] and fails the test on an error. */
static void run_ok(MeshDesc *m, Op *op, bool reference) {
  op_free(op);
  if (run_body(m, reference, op_body, op) < 0)
    ck_abort_msg("unexpected error: %s", err_message());
}

/* Checks device [rank]'s result against [want](rank, multi-index). */
typedef float (*Want)(int rank, const int64_t *idx);

static void check_out(const Op *op, int rank, int ndim, const int64_t *shape,
                      Want want) {
  const Array *a = op->out[rank];
  ck_assert_ptr_nonnull(a);
  ck_assert_int_eq(a->ndim, ndim);
  for (int d = 0; d < ndim; d++) ck_assert_int_eq(a->shape[d], shape[d]);
  const float *x = arr_data(a);
  for (int64_t f = 0; f < a->size; f++) {
    int64_t idx[8], g = f;
    for (int d = ndim - 1; d >= 0; d--) idx[d] = g % shape[d], g /= shape[d];
    float w = want(rank, idx);
    if (x[f] != w)
      ck_abort_msg("rank %d element %lld: got %g, want %g", rank, (long long)f,
                   (double)x[f], (double)w);
  }
}

static void check_all(const Op *op, int n, int ndim, const int64_t *shape, Want w) {
  for (int r = 0; r < n; r++) check_out(op, r, ndim, shape, w);
}

/* Runs [op] fast and in reference mode; the results must agree bit for bit. */
static void check_ref_agrees(MeshDesc *m, Op *op) {
  Array *fast[MAXDEV];
  run_ok(m, op, false);
  memcpy(fast, op->out, sizeof fast);
  memset(op->out, 0, sizeof op->out);
  run_ok(m, op, true);
  for (int r = 0; r < m->ndevices; r++) {
    ck_assert_int_eq(fast[r]->size, op->out[r]->size);
    ck_assert(memcmp(arr_data(fast[r]), arr_data(op->out[r]),
                     (size_t)fast[r]->size * dt_size(fast[r]->dtype)) == 0);
    val_decref(&fast[r]->hdr);
  }
}

/* ---- psum, pmax, pmin -------------------------------------------------------------- */

static float w_psum_1d(int r, const int64_t *i) { (void)r; return 600 + 4 * (float)i[0]; }

START_TEST(psum_1d) {
  MeshDesc m = mesh1("i", 4);
  int64_t dims[1] = {6};
  Op op;
  op_init(&op, coll_shape_psum, coll_kernel_psum, 1, dims);
  padd(&op.params, "axes", names1("i"));
  padd(&op.params, "axis_index_groups", VAL_NONE);
  run_ok(&m, &op, false);
  check_all(&op, 4, 1, dims, w_psum_1d);
  run_ok(&m, &op, true);
  check_all(&op, 4, 1, dims, w_psum_1d);
  op_free(&op);
  pclear(&op.params);
}
END_TEST

/* 2-D mesh (i=2, j=4): rank = 4i + j. */
static float w_psum_j(int r, const int64_t *k) { return 100 * (16 * (r / 4) + 6) + 4 * (float)k[0]; }
static float w_psum_i(int r, const int64_t *k) { return 100 * (4 + 2 * (r % 4)) + 2 * (float)k[0]; }
static float w_psum_ij(int r, const int64_t *k) { (void)r; return 2800 + 8 * (float)k[0]; }
static float w_pmax_j(int r, const int64_t *k) { return 100 * (4 * (r / 4) + 3) + (float)k[0]; }
static float w_pmin_j(int r, const int64_t *k) { return 100 * (4 * (r / 4)) + (float)k[0]; }

static void reduce_2d(Kernel k, Value *axes, int64_t n, Want w) {
  MeshDesc m = mesh2("i", 2, "j", 4);
  int64_t dims[1] = {n};
  Op op;
  op_init(&op, coll_shape_psum, k, 1, dims);
  padd(&op.params, "axes", axes);
  run_ok(&m, &op, false);
  check_all(&op, 8, 1, dims, w);
  run_ok(&m, &op, true);
  check_all(&op, 8, 1, dims, w);
  op_free(&op);
  pclear(&op.params);
}

START_TEST(psum_2d) {
  reduce_2d(coll_kernel_psum, names1("j"), 5, w_psum_j);
  reduce_2d(coll_kernel_psum, names1("i"), 3, w_psum_i);
  reduce_2d(coll_kernel_psum, names2("i", "j"), 17, w_psum_ij);
  reduce_2d(coll_kernel_psum, names2("j", "i"), 1, w_psum_ij);
  reduce_2d(coll_kernel_pmax, names1("j"), 4, w_pmax_j);
  reduce_2d(coll_kernel_pmin, names1("j"), 4, w_pmin_j);
}
END_TEST

static float w_grp_adj(int r, const int64_t *k) { return (r < 2 ? 100 : 500) + 2 * (float)k[0]; }
static float w_grp_odd(int r, const int64_t *k) { return (r % 2 ? 400 : 200) + 2 * (float)k[0]; }

START_TEST(psum_groups) {
  MeshDesc m = mesh1("i", 4);
  int64_t dims[1] = {3};
  int64_t adj[4] = {0, 1, 2, 3}, odd[4] = {0, 2, 1, 3};
  Op op;
  op_init(&op, coll_shape_psum, coll_kernel_psum, 1, dims);
  padd(&op.params, "axes", names1("i"));
  padd(&op.params, "axis_index_groups", int_groups(2, 2, adj));
  run_ok(&m, &op, false);
  check_all(&op, 4, 1, dims, w_grp_adj);
  pclear(&op.params);
  padd(&op.params, "axes", names1("i"));
  padd(&op.params, "axis_index_groups", int_groups(2, 2, odd));
  run_ok(&m, &op, true);
  check_all(&op, 4, 1, dims, w_grp_odd);
  run_ok(&m, &op, false);
  check_all(&op, 4, 1, dims, w_grp_odd);
  /* groups that do not cover the axis: an error on every device */
  pclear(&op.params);
  int64_t bad[4] = {0, 1, 1, 2};
  padd(&op.params, "axes", names1("i"));
  padd(&op.params, "axis_index_groups", int_groups(2, 2, bad));
  op_free(&op);
  ck_assert_int_eq(run_body(&m, false, op_body, &op), -1);
  ck_assert_ptr_nonnull(strstr(err_message(), "exactly once"));
  err_clear();
  op_free(&op);
  pclear(&op.params);
}
END_TEST

/* A non-contiguous operand (a transposed view) reduces correctly. */
static void make_transposed(const Op *op, int rank, Array **ins) {
  (void)op;
  int64_t shape[2] = {3, 2}, tshape[2] = {2, 3}, tstrides[2] = {1, 2};
  Array *a = arange_f32(2, shape, 100.0f * (float)rank);
  ins[0] = arr_view(a, 2, tshape, tstrides, 0);
  val_decref(&a->hdr);
}

/* A large transposed operand with noise: reduced by rows, not flat ranges. */
static void make_transposed_big(const Op *op, int rank, Array **ins) {
  int64_t shape[2] = {64, 300}, tshape[2] = {300, 64}, tstrides[2] = {1, 300};
  /* Only the fields make_default reads: the other devices are writing
   * their results into op->out meanwhile. */
  Op flat = {.ndim = 2, .random = op->random};
  memcpy(flat.dims, shape, sizeof shape);
  make_default(&flat, rank, ins);
  Array *a = ins[0];
  ins[0] = arr_view(a, 2, tshape, tstrides, 0);
  val_decref(&a->hdr);
}

/* transposed element [x, y] of device r = 100 r + 2y + x */
static float w_tpsum(int r, const int64_t *i) { (void)r; return 600 + 4 * (float)(2 * i[1] + i[0]); }

START_TEST(psum_strided) {
  MeshDesc m = mesh1("i", 4);
  int64_t dims[2] = {2, 3};
  Op op;
  op_init(&op, coll_shape_psum, coll_kernel_psum, 2, dims);
  op.make = make_transposed;
  padd(&op.params, "axes", names1("i"));
  run_ok(&m, &op, false);
  check_all(&op, 4, 2, dims, w_tpsum);
  run_ok(&m, &op, true);
  check_all(&op, 4, 2, dims, w_tpsum);
  op_free(&op);
  pclear(&op.params);
}
END_TEST

/* ---- all_gather ------------------------------------------------------------------- */

/* Operand (2, 3) on i=4: element [a, b] of device q is 100q + 3a + b. */
static float w_ag0(int r, const int64_t *i) { (void)r; return 100 * (float)i[0] + 3 * (float)i[1] + (float)i[2]; }
static float w_ag1(int r, const int64_t *i) { (void)r; return 100 * (float)i[1] + 3 * (float)i[0] + (float)i[2]; }
static float w_agt0(int r, const int64_t *i) { (void)r; return 100 * (float)(i[0] / 2) + 3 * (float)(i[0] % 2) + (float)i[1]; }
static float w_agt1(int r, const int64_t *i) { (void)r; return 100 * (float)(i[1] / 3) + 3 * (float)i[0] + (float)(i[1] % 3); }

static void gather_case(int dim, bool tiled, int ndim, const int64_t *oshape, Want w) {
  MeshDesc m = mesh1("i", 4);
  int64_t dims[2] = {2, 3};
  Op op;
  op_init(&op, coll_shape_all_gather, coll_kernel_all_gather, 2, dims);
  padd(&op.params, "axis_name", names1("i"));
  padd(&op.params, "all_gather_dimension", ival(dim));
  padd(&op.params, "axis_size", ival(4));
  padd(&op.params, "tiled", val_bool(tiled));
  padd(&op.params, "axis_index_groups", VAL_NONE);
  run_ok(&m, &op, false);
  check_all(&op, 4, ndim, oshape, w);
  run_ok(&m, &op, true);
  check_all(&op, 4, ndim, oshape, w);
  op_free(&op);
  pclear(&op.params);
}

START_TEST(all_gather_1d) {
  int64_t s0[3] = {4, 2, 3}, s1[3] = {2, 4, 3}, t0[2] = {8, 3}, t1[2] = {2, 12};
  gather_case(0, false, 3, s0, w_ag0);
  gather_case(1, false, 3, s1, w_ag1);
  gather_case(0, true, 2, t0, w_agt0);
  gather_case(1, true, 2, t1, w_agt1);
}
END_TEST

/* groups ((0, 2), (1, 3)): member g of the group of device r */
static float w_ag_grp(int r, const int64_t *i) {
  int q = (int)(r % 2) + 2 * (int)i[0];
  return 100 * (float)q + (float)i[1];
}

/* 2-D (i=2, j=4), gather over ('j', 'i'): position f = 2j + i, rank 4i + j. */
static float w_ag_ji(int r, const int64_t *i) {
  (void)r;
  int j = (int)i[0] / 2, ii = (int)i[0] % 2;
  return 100 * (float)(4 * ii + j);
}

START_TEST(all_gather_groups_and_tuples) {
  MeshDesc m = mesh1("i", 4);
  int64_t dims[1] = {3}, odd[4] = {0, 2, 1, 3}, oshape[2] = {2, 3};
  Op op;
  op_init(&op, coll_shape_all_gather, coll_kernel_all_gather, 1, dims);
  padd(&op.params, "axis_name", names1("i"));
  padd(&op.params, "axis_index_groups", int_groups(2, 2, odd));
  run_ok(&m, &op, false);
  check_all(&op, 4, 2, oshape, w_ag_grp);
  run_ok(&m, &op, true);
  check_all(&op, 4, 2, oshape, w_ag_grp);
  op_free(&op);
  pclear(&op.params);

  MeshDesc m2 = mesh2("i", 2, "j", 4);
  int64_t one[1] = {1}, o8[2] = {8, 1};
  op_init(&op, coll_shape_all_gather, coll_kernel_all_gather, 1, one);
  padd(&op.params, "axis_name", names2("j", "i"));
  run_ok(&m2, &op, false);
  check_all(&op, 8, 2, o8, w_ag_ji);
  op_free(&op);
  pclear(&op.params);
}
END_TEST

/* ---- psum_scatter ---------------------------------------------------------------- */

/* (4, 3) untiled over 'i': device r keeps row r summed: 600 + 4 (3r + b). */
static float w_ps0(int r, const int64_t *i) { return 600 + 4 * (float)(3 * r + i[0]); }
/* (2, 8) tiled on dim 1: out[a, c] = 600 + 4 (8a + 2r + c). */
static float w_ps1(int r, const int64_t *i) { return 600 + 4 * (float)(8 * i[0] + 2 * r + i[1]); }

START_TEST(psum_scatter_1d) {
  MeshDesc m = mesh1("i", 4);
  int64_t d0[2] = {4, 3}, o0[1] = {3}, d1[2] = {2, 8}, o1[2] = {2, 2};
  Op op;
  op_init(&op, coll_shape_psum_scatter, coll_kernel_psum_scatter, 2, d0);
  padd(&op.params, "axis_name", names1("i"));
  padd(&op.params, "scatter_dimension", ival(0));
  padd(&op.params, "tiled", val_bool(false));
  run_ok(&m, &op, false);
  check_all(&op, 4, 1, o0, w_ps0);
  run_ok(&m, &op, true);
  check_all(&op, 4, 1, o0, w_ps0);
  op_free(&op);
  pclear(&op.params);

  op_init(&op, coll_shape_psum_scatter, coll_kernel_psum_scatter, 2, d1);
  padd(&op.params, "axis_name", names1("i"));
  padd(&op.params, "scatter_dimension", ival(1));
  padd(&op.params, "axis_size", ival(4));
  padd(&op.params, "tiled", val_bool(true));
  run_ok(&m, &op, false);
  check_all(&op, 4, 2, o1, w_ps1);
  run_ok(&m, &op, true);
  check_all(&op, 4, 2, o1, w_ps1);
  op_free(&op);
  pclear(&op.params);
}
END_TEST

START_TEST(psum_scatter_shape_errors) {
  AVal in = {.dtype = DT_F32, .ndim = 2, .shape = {6, 2}}, out;
  Params p = {0};
  padd(&p, "axis_name", names1("i"));
  padd(&p, "scatter_dimension", ival(0));
  padd(&p, "axis_size", ival(4));
  padd(&p, "tiled", val_bool(true));
  ck_assert_int_eq(coll_shape_psum_scatter(&in, 1, &p, &out), -1);
  ck_assert_ptr_nonnull(strstr(err_message(), "does not divide"));
  err_clear();
  pclear(&p);
  /* no axis_size and no mesh: the shape rule says what it needs */
  padd(&p, "axis_name", names1("i"));
  ck_assert_int_eq(coll_shape_all_gather(&in, 1, &p, &out), -1);
  ck_assert_ptr_nonnull(strstr(err_message(), "axis_size"));
  err_clear();
  pclear(&p);
}
END_TEST

/* ---- ppermute --------------------------------------------------------------------- */

static float w_shift(int r, const int64_t *i) { return 100 * (float)((r + 3) % 4) + (float)i[0]; }
static float w_partial(int r, const int64_t *i) {
  return (r == 1 || r == 2) ? 100 * (float)(r - 1) + (float)i[0] : 0;
}

START_TEST(ppermute_1d) {
  MeshDesc m = mesh1("i", 4);
  int64_t dims[1] = {5}, ring[8] = {0, 1, 1, 2, 2, 3, 3, 0}, part[4] = {0, 1, 1, 2};
  Op op;
  op_init(&op, coll_shape_ppermute, coll_kernel_ppermute, 1, dims);
  padd(&op.params, "axis_name", names1("i"));
  padd(&op.params, "perm", int_groups(4, 2, ring));
  run_ok(&m, &op, false);
  check_all(&op, 4, 1, dims, w_shift);
  run_ok(&m, &op, true);
  check_all(&op, 4, 1, dims, w_shift);
  pclear(&op.params);
  padd(&op.params, "axis_name", names1("i"));
  padd(&op.params, "perm", int_groups(2, 2, part));
  run_ok(&m, &op, false);
  check_all(&op, 4, 1, dims, w_partial);
  run_ok(&m, &op, true);
  check_all(&op, 4, 1, dims, w_partial);
  op_free(&op);
  pclear(&op.params);
}
END_TEST

START_TEST(ppermute_duplicates) {
  MeshDesc m = mesh1("i", 4);
  int64_t dims[1] = {2}, dup_src[4] = {0, 1, 0, 2}, dup_dst[4] = {0, 1, 2, 1};
  Op op;
  op_init(&op, coll_shape_ppermute, coll_kernel_ppermute, 1, dims);
  padd(&op.params, "axis_name", names1("i"));
  padd(&op.params, "perm", int_groups(2, 2, dup_src));
  ck_assert_int_eq(run_body(&m, false, op_body, &op), -1);
  ck_assert_ptr_nonnull(strstr(err_message(), "source 0 appears twice"));
  err_clear();
  op_free(&op);
  pclear(&op.params);
  padd(&op.params, "axis_name", names1("i"));
  padd(&op.params, "perm", int_groups(2, 2, dup_dst));
  ck_assert_int_eq(run_body(&m, false, op_body, &op), -1);
  ck_assert_ptr_nonnull(strstr(err_message(), "destination 1 appears twice"));
  err_clear();
  op_free(&op);
  pclear(&op.params);
}
END_TEST

/* ---- all_to_all ------------------------------------------------------------------- */

/* operand (4, 2) on i=4: x_q[a, c] = 100q + 2a + c */
static float w_a2a_t(int r, const int64_t *i) { return 100 * (float)(i[1] / 2) + 2 * (float)r + (float)(i[1] % 2); }
static float w_a2a_u01(int r, const int64_t *i) { return 100 * (float)i[1] + 2 * (float)r + (float)i[0]; }
static float w_a2a_u00(int r, const int64_t *i) { return 100 * (float)i[0] + 2 * (float)r + (float)i[1]; }
/* operand (2, 4): x_q[a, c] = 100q + 4a + c; split 1, concat 0 */
static float w_a2a_u10(int r, const int64_t *i) { return 100 * (float)i[0] + 4 * (float)i[1] + (float)r; }

static void a2a_case(const int64_t *dims, int split, int concat, bool tiled,
                     const int64_t *oshape, Want w) {
  MeshDesc m = mesh1("i", 4);
  Op op;
  op_init(&op, coll_shape_all_to_all, coll_kernel_all_to_all, 2, dims);
  padd(&op.params, "axis_name", names1("i"));
  padd(&op.params, "split_axis", ival(split));
  padd(&op.params, "concat_axis", ival(concat));
  padd(&op.params, "axis_index_groups", VAL_NONE);
  padd(&op.params, "tiled", val_bool(tiled));
  run_ok(&m, &op, false);
  check_all(&op, 4, 2, oshape, w);
  run_ok(&m, &op, true);
  check_all(&op, 4, 2, oshape, w);
  op_free(&op);
  pclear(&op.params);
}

START_TEST(all_to_all_1d) {
  int64_t d42[2] = {4, 2}, d24[2] = {2, 4};
  int64_t t[2] = {1, 8}, u01[2] = {2, 4}, u00[2] = {4, 2}, u10[2] = {4, 2};
  a2a_case(d42, 0, 1, true, t, w_a2a_t);
  a2a_case(d42, 0, 1, false, u01, w_a2a_u01);
  a2a_case(d42, 0, 0, false, u00, w_a2a_u00);
  a2a_case(d24, 1, 0, false, u10, w_a2a_u10);
}
END_TEST

/* ---- axis_index ------------------------------------------------------------------- */

typedef struct IdxCase {
  Params p[4];
  int32_t got[MAXDEV][4];
} IdxCase;

static void idx_body(int rank, void *arg) {
  IdxCase *c = arg;
  Op op = {.shape = coll_shape_axis_index, .kernel = coll_kernel_axis_index};
  for (int k = 0; k < 4; k++) {
    op.params = c->p[k];
    Array *a = apply(&op, NULL);
    if (!a) return;
    c->got[rank][k] = *(int32_t *)arr_data(a);
    val_decref(&a->hdr);
  }
}

START_TEST(axis_index_2d) {
  MeshDesc m = mesh2("i", 2, "j", 4);
  IdxCase c;
  memset(&c, 0, sizeof c);
  padd(&c.p[0], "axis_name", names1("i"));
  padd(&c.p[1], "axis_name", names1("j"));
  padd(&c.p[2], "axis_name", names2("i", "j"));
  padd(&c.p[3], "axis_name", names2("j", "i"));
  ck_assert_int_eq(run_body(&m, false, idx_body, &c), 0);
  for (int r = 0; r < 8; r++) {
    ck_assert_int_eq(c.got[r][0], r / 4);
    ck_assert_int_eq(c.got[r][1], r % 4);
    ck_assert_int_eq(c.got[r][2], r);
    ck_assert_int_eq(c.got[r][3], (r % 4) * 2 + r / 4);
  }
  for (int k = 0; k < 4; k++) pclear(&c.p[k]);
}
END_TEST

/* ---- ragged_all_to_all ------------------------------------------------------------- */

/* Seed 002's example, verbatim. */
static void make_seed002(const Op *op, int rank, Array **ins) {
  static const float operand[2][3] = {{1, 2, 2}, {3, 4, 0}};
  static const float zeros[4] = {0, 0, 0, 0};
  static const int32_t in_off[2][2] = {{0, 1}, {0, 1}};
  static const int32_t send[2][2] = {{1, 2}, {1, 1}};
  static const int32_t out_off[2][2] = {{0, 0}, {1, 2}};
  static const int32_t recv[2][2] = {{1, 1}, {2, 1}};
  int32_t bad_off[2] = {1, 4};   /* op->random marks the out-of-bounds case */
  ins[0] = from_f32(3, operand[rank]);
  ins[1] = from_f32(4, zeros);
  ins[2] = from_i32(2, in_off[rank]);
  ins[3] = from_i32(2, send[rank]);
  ins[4] = from_i32(2, op->random && rank == 1 ? bad_off : out_off[rank]);
  ins[5] = from_i32(2, recv[rank]);
}

static float w_seed002(int r, const int64_t *i) {
  static const float want[2][4] = {{1, 3, 0, 0}, {2, 2, 4, 0}};
  return want[r][i[0]];
}

START_TEST(ragged_seed_example) {
  MeshDesc m = mesh1("x", 2);
  int64_t oshape[1] = {4};
  Op op;
  op_init(&op, coll_shape_ragged_all_to_all, coll_kernel_ragged_all_to_all, 0, NULL);
  op.nin = 6;
  op.make = make_seed002;
  padd(&op.params, "axis_name", names1("x"));
  padd(&op.params, "axis_index_groups", VAL_NONE);
  run_ok(&m, &op, false);
  check_all(&op, 2, 1, oshape, w_seed002);
  run_ok(&m, &op, true);
  check_all(&op, 2, 1, oshape, w_seed002);
  /* device 1 writes its second slice at output row 4 of device 1: out of bounds */
  op.random = true;
  op_free(&op);
  ck_assert_int_eq(run_body(&m, false, op_body, &op), -1);
  ck_assert_ptr_nonnull(strstr(err_message(), "device (x=1): output_offsets[1] = 4"));
  err_clear();
  op_free(&op);
  pclear(&op.params);
}
END_TEST

/* ---- mismatches and early exits ---------------------------------------------------- */

typedef struct Misfit {
  int odd_rank;                  /* the device that does something else */
  int what;                      /* 0 other collective, 1 other shape, 2 return,
                                    3 fail, 4 other parameters */
} Misfit;

static void misfit_body(int rank, void *arg) {
  Misfit *mf = arg;
  int64_t d4[1] = {4}, d5[1] = {5};
  Op op;
  op_init(&op, coll_shape_psum, coll_kernel_psum, 1, d4);
  padd(&op.params, "axes", names1("i"));
  if (rank == mf->odd_rank && mf->what == 0) {
    pclear(&op.params);
    op_init(&op, coll_shape_all_gather, coll_kernel_all_gather, 1, d4);
    padd(&op.params, "axis_name", names1("i"));
  }
  if (rank == mf->odd_rank && mf->what == 1) op.dims[0] = d5[0];
  if (rank == mf->odd_rank && mf->what == 4) {
    int64_t all[4] = {0, 1, 2, 3};
    padd(&op.params, "axis_index_groups", int_groups(1, 4, all));
  }
  if (rank == mf->odd_rank && mf->what == 2) goto done;
  if (rank == mf->odd_rank && mf->what == 3) {
    err_set(ERR_VALUE, "boom");
    goto done;
  }
  op_body(rank, &op);
done:
  op_free(&op);
  pclear(&op.params);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *misfit(int what, bool reference) {
  static char msg[2048];
  MeshDesc m = mesh1("i", 4);
  Misfit mf = {2, what};
  double t0 = now();
  ck_assert_int_eq(run_body(&m, reference, misfit_body, &mf), -1);
  ck_assert(now() - t0 < 1.0);
  snprintf(msg, sizeof msg, "%s", err_message());
  err_clear();
  return msg;
}

START_TEST(mismatch_collective) {
  for (int ref = 0; ref < 2; ref++) {
    const char *m = misfit(0, ref);
    ck_assert_msg(strstr(m, "collective mismatch: device (i=") != NULL, "%s", m);
    ck_assert_msg(strstr(m, "reached psum over 'i' of f32[4]") != NULL, "%s", m);
    ck_assert_msg(strstr(m, "device (i=2) reached all_gather over 'i' of f32[4]"), "%s", m);
  }
}
END_TEST

START_TEST(mismatch_shape) {
  const char *m = misfit(1, false);
  ck_assert_msg(strstr(m, "reached psum over 'i' of f32[5]") != NULL, "%s", m);
  ck_assert_msg(strstr(m, "of f32[4]") != NULL, "%s", m);
}
END_TEST

START_TEST(mismatch_params) {
  const char *m = misfit(4, false);
  ck_assert_msg(strstr(m, "device (i=2) reached psum[axis_index_groups=((0, 1, 2, "
                       "3),)] over 'i' of f32[4]"), "%s", m);
}
END_TEST

START_TEST(device_returns_while_others_wait) {
  for (int ref = 0; ref < 2; ref++) {
    const char *m = misfit(2, ref);
    ck_assert_msg(strstr(m, "on device (i=0): device (i=2) returned from the body "
                         "while device (i=0) waits in psum over 'i' of f32[4]"), "%s", m);
  }
}
END_TEST

START_TEST(failing_device_error_wins) {
  const char *m = misfit(3, false);
  ck_assert_str_eq(m, "on device (i=2): boom");
}
END_TEST

/* 2-D (i=2, j=2): row i=0 sums over 'j', row i=1 sums over 'i'.  Device
 * (1, 0) needs (0, 0), which went on past its psum over 'j': a mismatch. */
static void one_sided_body(int rank, void *arg) {
  (void)arg;
  int64_t d[1] = {2};
  Op op;
  op_init(&op, coll_shape_psum, coll_kernel_psum, 1, d);
  padd(&op.params, "axes", names1(rank < 2 ? "j" : "i"));
  op_body(rank, &op);
  op_free(&op);
  pclear(&op.params);
}

START_TEST(mismatch_one_sided) {
  MeshDesc m = mesh2("i", 2, "j", 2);
  ck_assert_int_eq(run_body(&m, false, one_sided_body, NULL), -1);
  ck_assert_msg(strstr(err_message(), "collective mismatch: device (i=0, j=0) "
                       "reached psum over 'j' of f32[2], device (i=1, j=0) "
                       "reached psum over 'i' of f32[2]"), "%s", err_message());
  err_clear();
}
END_TEST

/* coll_group_abort from another thread wakes devices waiting for a peer
 * that never comes (device 3 sleeps in user code) and stops later ones. */
typedef struct AbortCase {
  CollGroup *g;
  Op op;
} AbortCase;

static void abort_body(int rank, void *arg) {
  AbortCase *ac = arg;
  if (rank == 3) {
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    coll_group_abort(ac->g, ERR_INTERRUPT, "interrupted");
    return;
  }
  op_body(rank, &ac->op);
}

static void abort_run(int rank, void *arg) {
  AbortCase *ac = arg;
  if (coll_enter(ac->g, rank) == 0) abort_body(rank, ac);
  coll_device_exit(ac->g, rank, err_occurred());
}

START_TEST(abort_wakes_waiters) {
  MeshDesc m = mesh1("i", 4);
  int64_t dims[1] = {3};
  AbortCase ac;
  op_init(&ac.op, coll_shape_psum, coll_kernel_psum, 1, dims);
  padd(&ac.op.params, "axes", names1("i"));
  ac.g = coll_group_new(&m, false);
  double t0 = now();
  ck_assert_int_eq(dev_run(4, NULL, abort_run, &ac), -1);
  ck_assert(now() - t0 < 1.0);
  ck_assert_int_eq(err_kind(), ERR_INTERRUPT);
  ck_assert_str_eq(err_message(), "on device (i=0): interrupted");
  err_clear();
  coll_group_free(ac.g);
  op_free(&ac.op);
  pclear(&ac.op.params);
}
END_TEST

/* ---- many devices, few cores; reference agreement ----------------------------------- */

static float w_psum8(int r, const int64_t *k) { (void)r; return 2800 + 8 * (float)k[0]; }

START_TEST(eight_devices_two_cores) {
  MeshDesc m = mesh1("i", 8);
  int64_t dims[1] = {4000};       /* 8 x 4000 elements: the split path */
  Op op;
  op_init(&op, coll_shape_psum, coll_kernel_psum, 1, dims);
  padd(&op.params, "axes", names1("i"));
  op.repeat = 300;
  double t0 = now();
  run_ok(&m, &op, false);
  ck_assert_msg(now() - t0 < 10.0, "300 psums on 8 devices took %.2fs", now() - t0);
  check_all(&op, 8, 1, dims, w_psum8);
  /* two devices spin rather than sleep */
  MeshDesc m2 = mesh1("i", 2);
  op.repeat = 2000;
  run_ok(&m2, &op, false);
  op_free(&op);
  pclear(&op.params);
}
END_TEST

START_TEST(reference_agrees_bitwise) {
  MeshDesc m = mesh2("i", 2, "j", 4);
  int64_t d1[1] = {37}, d2[2] = {8, 6}, d3[3] = {4, 8, 3};
  int64_t ring[16] = {0, 3, 1, 0, 2, 1, 3, 2};
  Op op;
  op_init(&op, coll_shape_psum, coll_kernel_psum, 1, d1);
  op.random = true;
  padd(&op.params, "axes", names2("j", "i"));
  check_ref_agrees(&m, &op);
  /* every device holds the same bits */
  for (int r = 1; r < 8; r++)
    ck_assert(memcmp(arr_data(op.out[0]), arr_data(op.out[r]), 37 * 4) == 0);
  op_free(&op);
  pclear(&op.params);

  int64_t big[1] = {4099}, tbig[2] = {300, 64};
  op_init(&op, coll_shape_psum, coll_kernel_psum, 1, big);
  op.random = true;
  padd(&op.params, "axes", names2("i", "j"));
  check_ref_agrees(&m, &op);
  op_free(&op);
  pclear(&op.params);
  op_init(&op, coll_shape_psum, coll_kernel_psum, 2, tbig);
  op.make = make_transposed_big;
  op.random = true;
  padd(&op.params, "axes", names1("j"));
  check_ref_agrees(&m, &op);
  op_free(&op);
  pclear(&op.params);

  op_init(&op, coll_shape_psum_scatter, coll_kernel_psum_scatter, 2, d2);
  op.random = true;
  padd(&op.params, "axis_name", names2("i", "j"));
  padd(&op.params, "scatter_dimension", ival(0));
  padd(&op.params, "tiled", val_bool(false));
  check_ref_agrees(&m, &op);
  op_free(&op);
  pclear(&op.params);

  op_init(&op, coll_shape_all_to_all, coll_kernel_all_to_all, 3, d3);
  op.random = true;
  padd(&op.params, "axis_name", names1("j"));
  padd(&op.params, "split_axis", ival(1));
  padd(&op.params, "concat_axis", ival(2));
  padd(&op.params, "tiled", val_bool(true));
  check_ref_agrees(&m, &op);
  op_free(&op);
  pclear(&op.params);

  op_init(&op, coll_shape_ppermute, coll_kernel_ppermute, 2, d2);
  op.random = true;
  padd(&op.params, "axis_name", names1("j"));
  padd(&op.params, "perm", int_groups(4, 2, ring));
  check_ref_agrees(&m, &op);
  op_free(&op);
  pclear(&op.params);

  op_init(&op, coll_shape_all_gather, coll_kernel_all_gather, 2, d2);
  op.random = true;
  padd(&op.params, "axis_name", names1("i"));
  padd(&op.params, "all_gather_dimension", ival(1));
  padd(&op.params, "tiled", val_bool(true));
  check_ref_agrees(&m, &op);
  op_free(&op);
  pclear(&op.params);
}
END_TEST

/* ---- vma rules ------------------------------------------------------------------------ */

static void vma_body(int rank, void *arg) {
  uint32_t *got = arg;
  Params p = {0}, q = {0};
  int64_t g[4] = {0, 1, 2, 3};
  uint32_t in = 0x3;
  padd(&p, "axes", names1("j"));
  padd(&q, "axes", names1("j"));
  padd(&q, "axis_index_groups", int_groups(1, 4, g));
  if (rank == 0) {
    got[0] = coll_vma_psum(&in, 1, &p);
    got[1] = coll_vma_psum(&in, 1, &q);
    got[2] = coll_vma_ppermute(&got[0], 1, &p);
    got[3] = coll_vma_axis_index(NULL, 0, &p);
  }
  pclear(&p);
  pclear(&q);
}

START_TEST(vma_rules) {
  MeshDesc m = mesh2("i", 2, "j", 4);
  uint32_t got[4] = {0};
  ck_assert_int_eq(run_body(&m, false, vma_body, got), 0);
  ck_assert_uint_eq(got[0], 0x1);
  ck_assert_uint_eq(got[1], 0x3);
  ck_assert_uint_eq(got[2], 0x3);
  ck_assert_uint_eq(got[3], 0x2);
}
END_TEST

/* ---- through prim_apply ------------------------------------------------------------- */

/* psum over 'j' of an operand varying over 'i' and 'j' on (i=2, j=4). */
static void prim_body(int rank, void *arg) {
  Value **res = arg;
  int64_t d[1] = {3};
  Array *x = arange_f32(1, d, 100.0f * (float)rank);
  x->vma = 0x3;
  Params p;
  params_init(&p);
  params_add(&p, "axes", names1("j"));
  Value *in[1] = {&x->hdr};
  res[rank] = prim_apply(P_PSUM, 1, in, &p);
  params_clear(&p);
  val_decref(&x->hdr);
}

START_TEST(psum_through_prim_apply) {
  MeshDesc m = mesh2("i", 2, "j", 4);
  Value *res[MAXDEV] = {0};
  ck_assert_int_eq(run_body(&m, false, prim_body, res), 0);
  for (int r = 0; r < 8; r++) {
    Array *a = AS_ARRAY(res[r]);
    ck_assert_uint_eq(a->vma, 0x1);
    for (int k = 0; k < 3; k++) {
      int64_t idx[1] = {k};
      ck_assert(((float *)arr_data(a))[k] == w_psum_j(r, idx));
    }
    val_decref(res[r]);
  }
}
END_TEST

/* ---- the suite ------------------------------------------------------------------------- */

static Suite *collective_suite(void) {
  Suite *s = suite_create("collective");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, psum_1d);
  tcase_add_test(tc, psum_2d);
  tcase_add_test(tc, psum_groups);
  tcase_add_test(tc, psum_strided);
  tcase_add_test(tc, all_gather_1d);
  tcase_add_test(tc, all_gather_groups_and_tuples);
  tcase_add_test(tc, psum_scatter_1d);
  tcase_add_test(tc, psum_scatter_shape_errors);
  tcase_add_test(tc, ppermute_1d);
  tcase_add_test(tc, ppermute_duplicates);
  tcase_add_test(tc, all_to_all_1d);
  tcase_add_test(tc, axis_index_2d);
  tcase_add_test(tc, ragged_seed_example);
  tcase_add_test(tc, mismatch_collective);
  tcase_add_test(tc, mismatch_shape);
  tcase_add_test(tc, mismatch_params);
  tcase_add_test(tc, device_returns_while_others_wait);
  tcase_add_test(tc, failing_device_error_wins);
  tcase_add_test(tc, mismatch_one_sided);
  tcase_add_test(tc, abort_wakes_waiters);
  tcase_add_test(tc, eight_devices_two_cores);
  tcase_add_test(tc, reference_agrees_bitwise);
  tcase_add_test(tc, vma_rules);
  tcase_add_test(tc, psum_through_prim_apply);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  coll_register_prims();
  /* Device threads do not survive fork(), so the tests run in-process. */
  if (dev_start(MAXDEV) < 0) {
    fprintf(stderr, "dev_start: %s\n", err_message());
    return 1;
  }
  SRunner *sr = srunner_create(collective_suite());
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  dev_stop();
  return failed ? 1 : 0;
}
