/*
 * test_prim_ad.c - the transformation rules of the primitive table
 * (the families' files in array/, spmd/ and transform/): every
 * primitive has a batching rule and a JVP rule or is listed here as
 * lacking one (so a primitive added without rules fails this test), every
 * linear one has a transpose rule, every collective its named-axis slots
 * (CollRules), every higher-order one its row of transform/higher.h's
 * rules, and each transpose rule is the adjoint of its
 * primitive: <ct, f(x)> = <f^T(ct), x> for random float64 x and ct.  The
 * derivatives themselves are checked against finite differences, every
 * primitive of the table, by tests/lang/grad_every_primitive.shm (which
 * also fails when a rule of the table never ran there), the batching
 * rules against loops by tests/lang/vmap_*.shm.
 */
#include <check.h>
#include <math.h>
#include <string.h>

#include "array/array.h"
#include "array/prim.h"
#include "array/prim.h"
#include "array/prim.h"
#include "array/prim_random.h"
#include "base/error.h"
#include "spmd/sharding.h"
#include "spmd/collective.h"
#include "transform/control.h"
#include "transform/custom_derivatives.h"
#include "transform/higher.h"
#include "transform/jit.h"
#include "transform/xmap.h"

/* Primitives with no JVP rule yet: the transformations say so by name. */
static const char *const no_jvp_yet[] = {NULL};

/* Primitives vmap applies example by example (no batching rule). */
static const char *const batch_by_loop[] = {"ragged_all_to_all", "random_split", "random_fold_in",
                                            "random_bits", "random_uniform", "random_randint",
                                            "random_permutation", NULL};

/* Primitives without a derivative to have: no float operand. */
static const char *const no_operand[] = {"axis_index", "iota", NULL};

/* Primitives of integer operands (PRNG keys): no derivative to have. */
static const char *const integer_only[] = {"random_split", "random_fold_in", "random_bits",
                                           "random_uniform", "random_randint",
                                           "random_permutation", NULL};

/* Linear primitives (in some operands) that must have a transpose rule. */
static const char *const linear[] = {
    "neg", "copy", "convert_element_type", "add", "sub", "mul", "div", "select_n",
    "reduce_sum", "cumsum", "broadcast_in_dim", "reshape", "squeeze", "expand_dims",
    "transpose", "rev", "slice", "pad", "concatenate", "dynamic_slice",
    "dynamic_update_slice", "gather", "scatter", "dot_general", "psum", "all_gather",
    "reduce_scatter", "ppermute", "all_to_all", "ragged_all_to_all", "pvary", NULL};

/* Element-wise primitives with a float32 loop in fused plans, and the
 * reduction that may close a fused run. */
static const char *const fused[] = {"add", "sub", "mul", "div", "max", "min", "neg", "abs",
                                    "sqrt", "sin", "cos", "exp", "log", NULL};
static const char *const closes_fused[] = {"reduce_sum", NULL};
/* The array primitives without a sharding rule: a partitioner replicates
 * their operands (an all_gather) and says so. */
static const char *const sharding_replicates[] = {
    "iota", "random_split", "random_fold_in", "random_bits", "random_uniform", "random_randint",
    "random_permutation", NULL};

static bool listed(const char *const *l, const char *name) {
  for (; *l; l++)
    if (!strcmp(*l, name)) return true;
  return false;
}

/* The collectives' own slots (spmd/collective.h, CollRules): every
 * collective has them; exactly those the collective engine runs have a
 * jax.lax name for its messages; a reduction over named axes names the
 * positional reduction it is, batches over a named axis, and is what
 * coll_for_reduce finds for that reduction; all_gather removes named
 * axes and axis_index adds one. */
static const char *const engine_runs[] = {"psum", "pmax", "pmin", "all_gather", "reduce_scatter",
                                          "ppermute", "all_to_all", "ragged_all_to_all", NULL};
static const char *const reduces_as[][2] = {{"psum", "reduce_sum"}, {"pmax", "reduce_max"},
                                            {"pmin", "reduce_min"}};

static void check_named_rules(void) {
  for (int i = 0; i < P_COUNT; i++) {
    const PrimInfo *p = &prim_table[i];
    const CollRules *c = p->rules.coll;
    if (p->kind != PK_COLLECTIVE) continue;
    ck_assert_msg(c != NULL, "%s: no CollRules", p->name);
    ck_assert_msg((c->api_name != NULL) == listed(engine_runs, p->name),
                  "%s: the engine's name and engine_runs disagree", p->name);
    ck_assert_msg(!c->reduces || prim_table[c->reduce].kind == PK_REDUCE,
                  "%s: reduces as a primitive that is no reduction", p->name);
    ck_assert_msg(!c->reduces || c->named_batch, "%s: a reduction with no named batching", p->name);
    ck_assert_msg((c->traffic != NULL) == (c->api_name != NULL),
                  "%s: what the engine runs moves bytes: a traffic rule (cost_analysis)", p->name);
  }
  for (size_t k = 0; k < sizeof reduces_as / sizeof *reduces_as; k++) {
    int coll = prim_lookup(reduces_as[k][0]), red = prim_lookup(reduces_as[k][1]);
    ck_assert_int_eq(coll_for_reduce((PrimId)red), coll);
  }
  ck_assert_int_eq(coll_for_reduce((PrimId)prim_lookup("reduce_prod")), -1);
  ck_assert_int_eq(prim_table[prim_lookup("all_gather")].rules.coll->named, COLL_NAMED_REMOVES);
  ck_assert_int_eq(prim_table[prim_lookup("axis_index")].rules.coll->named, COLL_NAMED_ADDS);
  ck_assert_str_eq(prim_table[prim_lookup("reduce_scatter")].rules.coll->api_name, "psum_scatter");
}

/* The primitives with no cost rule: they move data, or change only its
 * type (cost_analysis counts their bytes, no flops). */
static const char *const moves_only[] = {"convert_element_type", "copy", NULL};

/* Every element-wise and reduction row says its flops or
 * transcendentals, and so does dot_general. */
static void check_cost(const PrimInfo *p) {
  bool counts = p->kind == PK_UNARY || p->kind == PK_BINARY || p->kind == PK_REDUCE ||
                p->kind == PK_CONTRACT;
  if (!counts || listed(moves_only, p->name)) return;
  ck_assert_msg(p->rules.cost != NULL, "%s: no cost rule (flops for cost_analysis)", p->name);
}

/* Higher-order primitives the compiled executor does not run by
 * themselves ("jit: pdot cannot be compiled": only an xmap body holds
 * one), and those an xmap body cannot hold where it is lowered (its body
 * then takes the batching path). */
static const char *const not_compiled[] = {"pdot", "custom_lin", NULL};
static const char *const not_in_lowered_xmap[] = {"shard_map", "debug_callback", "custom_lin", NULL};

/* A higher-order primitive's row (transform/higher.h): its family file
 * registered it, with the executor's rules unless listed, and with the
 * xmap interpreter's unless listed; the control-flow ones say what
 * their results carry in an xmap body, while has grad's and vmap's loop
 * rules, shard_map its transpose and grad's and vmap's call rules, as
 * custom_jvp_call and custom_vjp_call have, and custom_lin its transpose. */
static void check_higher(PrimId id) {
  const PrimInfo *p = &prim_table[id];
  const HigherRules *h = p->rules.higher;
  ck_assert_msg(h != NULL, "%s: higher-order, but no higher-order rules", p->name);
  ck_assert_msg((h->run != NULL) != listed(not_compiled, p->name), "%s: %s", p->name,
                h->run ? "compiled now: take it off not_compiled" : "has no executor rule");
  bool lowered = !listed(not_in_lowered_xmap, p->name);
  ck_assert_msg((h->eval && h->lowerable) == lowered, "%s: %s", p->name,
                lowered ? "has no xmap interpreter rule" : "lowerable now: take it off the list");
  if (id == P_COND || id == P_WHILE || id == P_SCAN)
    ck_assert_msg(h->named != NULL, "%s: no named shapes rule for an xmap body", p->name);
  if (id == P_WHILE) ck_assert(h->jvp_loop && h->batch_loop);
  if (id == P_SHARD_MAP) ck_assert(p->rules.transpose && h->jvp_call && h->batch_call);
  if (id == P_CUSTOM_JVP_CALL || id == P_CUSTOM_VJP_CALL) ck_assert(h->jvp_call && h->batch_call);
  if (id == P_CUSTOM_LIN) ck_assert(p->rules.transpose != NULL);
}

START_TEST(tc_every_primitive_has_rules) {
  coll_register_prims();
  ctl_register_rules();
  jit_register_rules();
  jit_register_shard_map_rules();
  xmap_register_rules();
  custom_register_rules();
  sharding_register_rules();
  for (int i = 0; i < P_COUNT; i++) {
    const PrimInfo *p = &prim_table[i];
    /* an array primitive partitions by its rule, or is listed as one
     * whose operands are replicated first (shmap(7), THE THREE MODES) */
    if (p->kind != PK_HIGHER && p->kind != PK_COLLECTIVE)
      ck_assert_msg((p->rules.sharding != NULL) != listed(sharding_replicates, p->name),
                    "%s: sharding rule %s", p->name,
                    p->rules.sharding ? "present but listed in sharding_replicates" : "missing");
    const FuseRule *f = p->rules.fuse;
    ck_assert_msg((f && f->loop) == listed(fused, p->name), "%s: fused loop %s", p->name,
                  f && f->loop ? "not listed in fused" : "missing");
    ck_assert_msg((f && f->sum) == listed(closes_fused, p->name), "%s: closing sum", p->name);
    if (p->kind != PK_HIGHER && p->kind != PK_COLLECTIVE)
      ck_assert_msg(p->rules.shape && p->rules.kernel, "%s lacks a shape rule or kernel", p->name);
    if (p->kind == PK_HIGHER) check_higher((PrimId)i);
    check_cost(p);
    if (p->kind == PK_HIGHER || listed(no_operand, p->name)) continue;
    bool loop = listed(batch_by_loop, p->name);
    ck_assert_msg((p->rules.batch != NULL) != loop, "%s: %s", p->name,
                  loop ? "has a batching rule now: take it off batch_by_loop"
                       : "has no batching rule and is not listed as batched by loop");
    if (listed(integer_only, p->name)) continue;
    bool missing = listed(no_jvp_yet, p->name);
    ck_assert_msg((p->rules.jvp != NULL) != missing,
                  "%s: %s", p->name, missing ? "has a JVP rule now: take it off no_jvp_yet"
                                             : "has no JVP rule and is not listed as such");
    if (listed(linear, p->name))
      ck_assert_msg(p->rules.transpose != NULL, "%s: linear, but no transpose rule", p->name);
  }
  check_named_rules();
}
END_TEST

/* ---- the adjoint identity ------------------------------------------------ */

static unsigned seed = 12345;

static Array *rnd(int nd, const int64_t *shape) {
  Array *a = arr_new(DT_F64, nd, shape);
  double *d = arr_data(a);
  for (int64_t i = 0; i < a->size; i++) {
    seed = seed * 1103515245u + 12345u;
    d[i] = (double)((seed >> 8) % 2001) / 1000.0 - 1.0;
  }
  return a;
}

static double vdot(Value *x, Value *y) {
  Array *a = arr_contiguous(AS_ARRAY(x)), *b = arr_contiguous(AS_ARRAY(y));
  ck_assert_int_eq(a->size, b->size);
  const double *p = arr_data(a), *q = arr_data(b);
  double s = 0;
  for (int64_t i = 0; i < a->size; i++) s += p[i] * q[i];
  val_decref(&a->hdr);
  val_decref(&b->hdr);
  return s;
}

/* Checks <ct, f(x)> == <f^T(ct), x> for operand [k] of primitive [id]
 * (the other operands [in] fixed). */
static void adjoint(PrimId id, int nin, Value **in, int k, Params *p) {
  for (int i = 0; i < nin; i++) val_incref(in[i]);   /* not reusable as the output */
  Value *y = prim_apply(id, nin, in, p);
  for (int i = 0; i < nin; i++) val_decref(in[i]);
  ck_assert_msg(y != NULL, "%s: %s", prim_table[id].name, err_message());
  AVal ya, av[8];
  aval_of(AS_ARRAY(y), &ya);
  Value *ct = &rnd(ya.ndim, ya.shape)->hdr;
  Value *ops[8] = {0}, *cts[8] = {0};
  bool lin[8] = {0};
  for (int i = 0; i < nin; i++) {
    aval_of(AS_ARRAY(in[i]), &av[i]);
    ops[i] = i == k ? NULL : in[i];
  }
  lin[k] = true;
  ck_assert_int_eq(prim_table[id].rules.transpose(&ct, ops, av, lin, nin, p, cts), 0);
  ck_assert_msg(cts[k] != NULL, "%s: no cotangent", prim_table[id].name);
  double lhs = vdot(ct, y), rhs = vdot(cts[k], in[k]);
  ck_assert_msg(fabs(lhs - rhs) <= 1e-9 * (1 + fabs(lhs)), "%s: <ct, f(x)> = %g but <f^T ct, x> = %g",
                prim_table[id].name, lhs, rhs);
  for (int i = 0; i < nin; i++)
    if (cts[i]) val_decref(cts[i]);
  val_decref(ct);
  val_decref(y);
  params_clear(p);
}

/* As adjoint, for a primitive jointly linear in its float operands: the
 * others are zeros, so f is linear in operand [k] alone. */
static void adjoint_z(PrimId id, int nin, Value **in, int k, Params *p) {
  Value *ops[8];
  for (int i = 0; i < nin; i++) {
    Array *a = AS_ARRAY(in[i]);
    ops[i] = i != k && a->dtype == DT_F64 ? &arr_zeros(DT_F64, a->ndim, a->shape)->hdr
                                          : val_incref(in[i]);
  }
  adjoint(id, nin, ops, k, p);
  for (int i = 0; i < nin; i++) val_decref(ops[i]);
}

static Value *A(int nd, int64_t a, int64_t b, int64_t c) {
  int64_t s[3] = {a, b, c};
  return &rnd(nd, s)->hdr;
}

static Value *ints1(int n, const int64_t *xs) { return val_int_tuple(n, xs); }

START_TEST(tc_transposes_are_adjoints) {
  Params p;
  Value *x = A(2, 3, 4, 0), *y = A(2, 3, 4, 0), *s = A(0, 0, 0, 0), *m = A(2, 3, 5, 0);
  params_init(&p);
  adjoint(P_NEG, 1, &x, 0, &p);
  adjoint_z(P_ADD, 2, (Value *[]){x, y}, 1, &p);
  adjoint_z(P_SUB, 2, (Value *[]){x, y}, 1, &p);
  adjoint(P_MUL, 2, (Value *[]){x, y}, 0, &p);
  adjoint(P_MUL, 2, (Value *[]){s, y}, 0, &p);   /* a scalar broadcast: summed */
  adjoint(P_DIV, 2, (Value *[]){x, y}, 0, &p);
  params_add(&p, "axes", ints1(1, (int64_t[]){1}));
  adjoint(P_REDUCE_SUM, 1, &x, 0, &p);
  params_add(&p, "axis", val_int(1));
  params_add(&p, "reverse", val_bool(false));
  adjoint(P_CUMSUM, 1, &x, 0, &p);
  params_add(&p, "shape", ints1(3, (int64_t[]){2, 3, 4}));
  params_add(&p, "broadcast_dimensions", ints1(2, (int64_t[]){1, 2}));
  adjoint(P_BROADCAST_IN_DIM, 1, &x, 0, &p);
  params_add(&p, "new_sizes", ints1(2, (int64_t[]){6, 2}));
  params_add(&p, "dimensions", val_incref(VAL_NONE));
  adjoint(P_RESHAPE, 1, &x, 0, &p);
  params_add(&p, "permutation", ints1(2, (int64_t[]){1, 0}));
  adjoint(P_TRANSPOSE, 1, &x, 0, &p);
  params_add(&p, "dimensions", ints1(1, (int64_t[]){0}));
  adjoint(P_REV, 1, &x, 0, &p);
  params_add(&p, "start_indices", ints1(2, (int64_t[]){1, 0}));
  params_add(&p, "limit_indices", ints1(2, (int64_t[]){3, 4}));
  params_add(&p, "strides", ints1(2, (int64_t[]){1, 2}));
  adjoint(P_SLICE, 1, &x, 0, &p);
  Value *cfg = tuple_new(2);
  tuple_set_steal(cfg, 0, ints1(3, (int64_t[]){1, 2, 1}));
  tuple_set_steal(cfg, 1, ints1(3, (int64_t[]){0, 1, 0}));
  params_add(&p, "padding_config", cfg);
  adjoint_z(P_PAD, 2, (Value *[]){x, s}, 0, &p);
  params_add(&p, "dimension", val_int(1));
  adjoint_z(P_CONCATENATE, 3, (Value *[]){x, m, y}, 1, &p);
  Value *i0 = val_int(1), *i1 = val_int(2);
  params_add(&p, "slice_sizes", ints1(2, (int64_t[]){2, 2}));
  adjoint(P_DYNAMIC_SLICE, 3, (Value *[]){x, i0, i1}, 0, &p);
  Value *u = A(2, 2, 2, 0);
  adjoint_z(P_DYNAMIC_UPDATE_SLICE, 4, (Value *[]){x, u, i0, i1}, 0, &p);
  adjoint_z(P_DYNAMIC_UPDATE_SLICE, 4, (Value *[]){x, u, i0, i1}, 1, &p);
  int64_t ni = 5;
  Array *idx = arr_new(DT_I32, 1, &ni);
  int32_t *id = arr_data(idx);
  for (int i = 0; i < 5; i++) id[i] = (i * 3) % 4;   /* repeats: the cotangent adds */
  params_add(&p, "axis", val_int(1));
  adjoint(P_GATHER, 2, (Value *[]){x, &idx->hdr}, 0, &p);
  Value *upd = A(2, 3, 5, 0);
  params_add(&p, "axis", val_int(1));
  params_add(&p, "mode", str_from("add"));
  adjoint_z(P_SCATTER, 3, (Value *[]){x, &idx->hdr, upd}, 2, &p);
  params_add(&p, "axis", val_int(1));
  params_add(&p, "mode", str_from("add"));
  adjoint_z(P_SCATTER, 3, (Value *[]){x, &idx->hdr, upd}, 0, &p);
  /* dot_general: a matmul, and batch + contracting dims out of order */
  Value *b1 = A(3, 2, 3, 4), *b2 = A(3, 4, 2, 5);
  for (int k = 0; k < 2; k++) {
    Value *dn = tuple_new(2), *c = tuple_new(2), *bb = tuple_new(2);
    tuple_set_steal(c, 0, ints1(1, (int64_t[]){2}));
    tuple_set_steal(c, 1, ints1(1, (int64_t[]){0}));
    tuple_set_steal(bb, 0, ints1(1, (int64_t[]){0}));
    tuple_set_steal(bb, 1, ints1(1, (int64_t[]){1}));
    tuple_set_steal(dn, 0, c);
    tuple_set_steal(dn, 1, bb);
    params_add(&p, "dimension_numbers", dn);
    adjoint(P_DOT_GENERAL, 2, (Value *[]){b1, b2}, k, &p);
  }
  Value *w = A(2, 4, 6, 0);
  for (int k = 0; k < 2; k++) {
    Value *dn = tuple_new(2), *c = tuple_new(2), *bb = tuple_new(2);
    tuple_set_steal(c, 0, ints1(1, (int64_t[]){1}));
    tuple_set_steal(c, 1, ints1(1, (int64_t[]){0}));
    tuple_set_steal(bb, 0, ints1(0, NULL));
    tuple_set_steal(bb, 1, ints1(0, NULL));
    tuple_set_steal(dn, 0, c);
    tuple_set_steal(dn, 1, bb);
    params_add(&p, "dimension_numbers", dn);
    adjoint(P_DOT_GENERAL, 2, (Value *[]){x, w}, k, &p);
  }
  Value *vals[] = {x, y, s, m, i0, i1, u, &idx->hdr, upd, b1, b2, w};
  for (size_t i = 0; i < sizeof vals / sizeof *vals; i++) val_decref(vals[i]);
}
END_TEST

/* Random123's known answers for Threefry-2x32 with 20 rounds. */
START_TEST(tc_threefry_known_answers) {
  static const uint32_t kat[3][6] = {
      {0, 0, 0, 0, 0x6b200159u, 0x99ba4efeu},
      {0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0x1cb996fcu, 0xbb002be7u},
      {0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xc4923a9cu, 0x483df7a0u}};
  for (int i = 0; i < 3; i++) {
    uint32_t a = kat[i][0], b = kat[i][1];
    prim_threefry2x32(kat[i][2], kat[i][3], &a, &b);
    ck_assert_uint_eq(a, kat[i][4]);
    ck_assert_uint_eq(b, kat[i][5]);
  }
}
END_TEST

int main(void) {
  Suite *s = suite_create("prim_ad");
  TCase *tc = tcase_create("rules");
  tcase_add_test(tc, tc_every_primitive_has_rules);
  tcase_add_test(tc, tc_transposes_are_adjoints);
  tcase_add_test(tc, tc_threefry_known_answers);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
