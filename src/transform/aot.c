/*
 * aot.c - jax.ShapeDtypeStruct, jax.eval_shape, and the Lowered and
 * Compiled stages of jit(f).lower(*args) (aot.h).
 */
#include <string.h>

#include "array/array.h"
#include "array/print.h"
#include "base/intern.h"
#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/classes.h"
#include "lang/ops.h"
#include "lang/pytree.h"
#include "transform/aot.h"
#include "transform/compile.h"
#include "transform/jit.h"

/* ==== ShapeDtypeStruct =========================================================== */

typedef struct Sds {
  Opaque base;
  AVal aval;
  Value *sharding;   /* owned: None, a NamedSharding, a PartitionSpec, ... */
} Sds;

static void sds_free(Value *v) { val_decref(((Sds *)v)->sharding); }

Value *aot_sds_sharding(const Value *v) { return ((const Sds *)v)->sharding; }

static Value *sds_repr(Value *v) {
  const Sds *s = (const Sds *)v;
  char sh[256];
  shape_str(sh, sizeof sh, s->aval.ndim, s->aval.shape);
  if (s->sharding == VAL_NONE)
    return str_printf("ShapeDtypeStruct(shape=%s, dtype=%s)", sh, dt_name(s->aval.dtype));
  Value *r = val_repr(s->sharding);
  Value *out = r ? str_printf("ShapeDtypeStruct(shape=%s, dtype=%s, sharding=%s)", sh,
                              dt_name(s->aval.dtype), str_cstr(r))
                 : NULL;
  val_decref(r);
  return out;
}

static Value *sds_getattr(Value *v, const char *name) {
  const Sds *s = (const Sds *)v;
  if (!strcmp(name, "shape")) return val_int_tuple(s->aval.ndim, s->aval.shape);
  if (!strcmp(name, "dtype")) return dtype_value(s->aval.dtype);
  if (!strcmp(name, "ndim")) return val_int(s->aval.ndim);
  if (!strcmp(name, "size")) return val_int(shape_size(s->aval.ndim, s->aval.shape));
  if (!strcmp(name, "sharding")) return val_incref(s->sharding);
  if (!strcmp(name, "weak_type")) return val_incref(val_bool(s->aval.weak));
  return err_set(ERR_ATTRIBUTE, "'ShapeDtypeStruct' object has no attribute '%s'", name);
}

static const OpaqueType sds_type = {"ShapeDtypeStruct", sds_free, sds_repr, sds_getattr,
                                    NULL, NULL, NULL};

bool aot_is_sds(const Value *v) {
  return v && v->type == V_OPAQUE && ((const Opaque *)v)->ot == &sds_type;
}

void aot_sds_aval(const Value *v, AVal *out) { *out = ((const Sds *)v)->aval; }

static Value *sds_new(const AVal *a, Value *sharding) {
  Sds *s = shm_calloc(1, sizeof *s);
  if (!s) return err_nomem();
  val_init(&s->base.hdr, V_OPAQUE);
  s->base.ot = &sds_type;
  s->aval = *a;
  s->aval.vma = 0;
  s->sharding = val_incref(sharding ? sharding : VAL_NONE);
  return &s->base.hdr;
}

/* jax.ShapeDtypeStruct(shape, dtype, sharding=None, weak_type=False) */
static Value *bi_sds(const CallArgs *a) {
  Value *shape, *dtype, *sharding = NULL, *weak = NULL;
  if (args_bind("ShapeDtypeStruct", a, "shape, dtype, sharding=, weak_type=",
                (Value **[]){&shape, &dtype, &sharding, &weak}) < 0)
    return NULL;
  AVal av = {0};
  int dt = -1;
  if (ops_shape_arg(shape, &av.ndim, av.shape) < 0 || ops_dtype_arg(dtype, &dt) < 0) return NULL;
  if (dt < 0) return err_set(ERR_TYPE, "ShapeDtypeStruct: dtype must be a dtype, got None");
  for (int i = 0; i < av.ndim; i++)
    if (av.shape[i] < 0)
      return err_set(ERR_VALUE, "ShapeDtypeStruct: negative dimension %lld in shape",
                     (long long)av.shape[i]);
  av.dtype = (DType)dt;
  if (weak) {
    int t = val_truth(weak);
    if (t < 0) return NULL;
    av.weak = t;
  }
  return sds_new(&av, sharding);
}

static bool is_array(Value *v) { return ops_is_array(v); }

/* A ShapeDtypeStruct for each array leaf of the traced result [tree],
 * from [p]'s outputs. */
static Value *out_info(Plan *p, Value *tree) {
  Value **vals = shm_calloc((size_t)p->nout + 1, sizeof(Value *));
  if (!vals) return err_nomem();
  Value *r = NULL;
  int i = 0;
  for (; i < p->nout; i++) {
    AVal av;
    plan_atom_aval(p, &p->outs[i], &av);
    if (!(vals[i] = sds_new(&av, NULL))) break;
  }
  int pos = 0;
  if (i == p->nout) r = pytree_replace(tree, is_array, vals, &pos);
  for (int k = 0; k < i; k++) val_decref(vals[k]);
  shm_free(vals);
  return r;
}

/* ==== Lowered and Compiled ========================================================= */

/* One type for both stages: a Compiled is a Lowered whose plan has been
 * compiled; the analyses are the same functions. */
typedef struct Stage {
  Opaque base;
  Plan *plan;          /* owned */
  JitLowered l;        /* owned */
  bool compiled;
} Stage;

static void stage_free(Value *v) {
  Stage *s = (Stage *)v;
  val_decref(&s->plan->hdr);
  jit_lowered_clear(&s->l);
}

static Value *stage_getattr(Value *v, const char *name);
static Value *compiled_call(Value *v, const CallArgs *a);

static Value *lowered_repr(Value *v) {
  (void)v;
  return str_from("<Lowered>");
}

static Value *compiled_repr(Value *v) {
  (void)v;
  return str_from("<Compiled>");
}

static const OpaqueType lowered_type = {"Lowered", stage_free, lowered_repr, stage_getattr,
                                        NULL, NULL, NULL};
static const OpaqueType compiled_type = {"Compiled", stage_free, compiled_repr, stage_getattr,
                                         NULL, NULL, NULL};

static Value *stage_new(Plan *p, JitLowered *l, bool compiled) {
  Stage *s = shm_calloc(1, sizeof *s);
  if (!s) return err_nomem();
  val_init(&s->base.hdr, V_OPAQUE);
  s->base.ot = compiled ? &compiled_type : &lowered_type;
  s->plan = p;
  s->l = *l;
  s->compiled = compiled;
  return &s->base.hdr;
}

static int no_args(const char *what, const CallArgs *a) {
  if (a->nargs || a->nkw) return err_set(ERR_TYPE, "%s() takes no arguments", what), -1;
  return 0;
}

/* Lowered.as_text(): the plan as traced; Compiled.as_text(): without
 * the equations the compiled form drops as dead code, as XLA's compiled
 * HLO has none. */
static Value *m_as_text(Value *self, const CallArgs *a) {
  Stage *s = (Stage *)self;
  if (no_args("as_text", a) < 0) return NULL;
  if (!s->compiled) return plan_str(s->plan);
  bool *live = cmp_live_eqns(s->plan);
  Value *r = live ? plan_str_live(s->plan, live) : NULL;
  shm_free(live);
  return r;
}

/* Lowered.compile(): the plan through compile.h's passes and buffer
 * planner.  The Compiled shares the plan and the lowering's record. */
static Value *m_compile(Value *self, const CallArgs *a) {
  Stage *s = (Stage *)self;
  if (no_args("compile", a) < 0 || cmp_compile(s->plan) < 0) return NULL;
  JitLowered l = s->l;
  l.part = l.part_fn = NULL;   /* the Compiled's own, made by its first call */
  val_incref(&s->plan->hdr);
  val_incref(l.jit);
  val_incref(l.out_tree);
  if (l.holds) val_incref(l.holds);
  if (l.statics) val_incref(l.statics);
  if (!(l.key = shm_malloc(s->l.keylen + 1))) {
    jit_lowered_clear(&l);
    val_decref(&s->plan->hdr);
    return err_nomem();
  }
  shm_memcpy(l.key, s->l.key, s->l.keylen);
  Value *c = stage_new(s->plan, &l, true);
  if (!c) {
    jit_lowered_clear(&l);
    val_decref(&s->plan->hdr);
    return NULL;
  }
  aot_estimate_note(s->plan->name, s->plan);
  return c;
}

static Value *m_cost_analysis(Value *self, const CallArgs *a) {
  if (no_args("cost_analysis", a) < 0) return NULL;
  AotCost c = {0};
  Value *r = aot_cost(((Stage *)self)->plan, NULL, &c) == 0 ? aot_cost_dict(&c) : NULL;
  aot_cost_free(&c);
  return r;
}

/* Compiled.memory_analysis(): an object with JAX's attributes. */
typedef struct MemStats {
  Opaque base;
  AotMemory m;
} MemStats;

static Value *mem_getattr(Value *v, const char *name) {
  const AotMemory *m = &((MemStats *)v)->m;
  if (!strcmp(name, "argument_size_in_bytes")) return val_int((int64_t)m->argument);
  if (!strcmp(name, "output_size_in_bytes")) return val_int((int64_t)m->output);
  if (!strcmp(name, "temp_size_in_bytes")) return val_int((int64_t)m->temp);
  if (!strcmp(name, "alias_size_in_bytes")) return val_int((int64_t)m->alias);
  if (!strcmp(name, "generated_code_size_in_bytes")) return val_int(0);
  if (!strcmp(name, "constant_size_in_bytes")) return val_int((int64_t)m->constant);
  if (!strcmp(name, "peak_memory_in_bytes"))
    return val_int((int64_t)(m->argument + m->output + m->temp + m->constant - m->alias));
  return err_set(ERR_ATTRIBUTE, "'CompiledMemoryStats' object has no attribute '%s'", name);
}

static Value *mem_repr(Value *v) {
  const AotMemory *m = &((MemStats *)v)->m;
  return str_printf("CompiledMemoryStats(argument_size_in_bytes=%lld, output_size_in_bytes=%lld, "
                    "temp_size_in_bytes=%lld, alias_size_in_bytes=%lld)",
                    (long long)m->argument, (long long)m->output, (long long)m->temp,
                    (long long)m->alias);
}

static void mem_free(Value *v) { (void)v; }

static const OpaqueType mem_type = {"CompiledMemoryStats", mem_free, mem_repr, mem_getattr,
                                    NULL, NULL, NULL};

static Value *m_memory_analysis(Value *self, const CallArgs *a) {
  if (no_args("memory_analysis", a) < 0) return NULL;
  MemStats *s = shm_calloc(1, sizeof *s);
  if (!s) return err_nomem();
  val_init(&s->base.hdr, V_OPAQUE);
  s->base.ot = &mem_type;
  if (aot_memory(((Stage *)self)->plan, &s->m) < 0) {
    val_decref(&s->base.hdr);
    return NULL;
  }
  return &s->base.hdr;
}

/* Compiled.estimate(profile): the predicted step time's report (a str
 * printed as a table), from a hardware profile's YAML file. */
static Value *m_estimate(Value *self, const CallArgs *a) {
  Value *path;
  if (args_bind("estimate", a, "profile", (Value **[]){&path}) < 0) return NULL;
  if (path->type != V_STR)
    return err_set(ERR_TYPE, "estimate: profile must be the path of a YAML file, got %s",
                   val_type_name(path));
  double t;
  return aot_estimate(((Stage *)self)->plan, NULL, str_cstr(path), &t);
}

static Value *m_out_info(Stage *s) { return out_info(s->plan, s->l.out_tree); }

static Value *stage_getattr(Value *v, const char *name) {
  Stage *s = (Stage *)v;
  if (!strcmp(name, "as_text")) return bound_new("as_text", m_as_text, v);
  if (!strcmp(name, "cost_analysis")) return bound_new("cost_analysis", m_cost_analysis, v);
  if (!strcmp(name, "out_info")) return m_out_info(s);
  if (!strcmp(name, "in_avals")) return ops_getattr(&s->plan->hdr, "in_avals");
  if (!s->compiled && !strcmp(name, "compile")) return bound_new("compile", m_compile, v);
  if (s->compiled && !strcmp(name, "memory_analysis"))
    return bound_new("memory_analysis", m_memory_analysis, v);
  if (s->compiled && !strcmp(name, "estimate")) return bound_new("estimate", m_estimate, v);
  return err_set(ERR_ATTRIBUTE, "'%s' object has no attribute '%s'",
                 s->compiled ? "Compiled" : "Lowered", name);
}

/* Calling a Compiled: the arrays must have the lowered signature; a
 * shard_map on an abstract mesh needs a real mesh of its size
 * (mesh_check_runnable says so). */
static Value *compiled_call(Value *v, const CallArgs *a) {
  Stage *s = (Stage *)v;
  return jit_run_lowered(&s->l, s->plan, a);
}

Value *aot_lower_method(Value *self, const CallArgs *a) {
  JitLowered l = {0};
  Plan *p = jit_lower(self, a, &l);
  if (!p) return NULL;
  Value *r = stage_new(p, &l, false);
  if (!r) {
    val_decref(&p->hdr);
    jit_lowered_clear(&l);
  }
  return r;
}

Value *aot_eval_shape_method(Value *self, const CallArgs *a) {
  JitLowered l = {0};
  Plan *p = jit_lower(self, a, &l);
  if (!p) return NULL;
  Value *r = out_info(p, l.out_tree);
  val_decref(&p->hdr);
  jit_lowered_clear(&l);
  return r;
}

/* jax.eval_shape(fun, *args, **kwargs) */
static Value *bi_eval_shape(const CallArgs *a) {
  if (a->nargs < 1) return err_set(ERR_TYPE, "eval_shape() missing required argument 'fun'");
  CallArgs rest = {a->nargs - 1, a->args + 1, a->nkw, a->kwnames, a->kwvals};
  return aot_eval_shape_method(a->args[0], &rest);
}

static int add_jax(Env *b, const char *name, BuiltinFn fn, const char *doc) {
  Value *v = builtin_new(name, fn, doc);
  int rc = v && env_set(b, intern_cstr(name), v) == 0 && builtins_add_to("jax", name, v) == 0 ? 0 : -1;
  val_decref(v);
  return rc;
}

int aot_register(Env *b) {
  cls_register_call(&compiled_type, compiled_call);
  if (add_jax(b, "ShapeDtypeStruct", bi_sds,
              "ShapeDtypeStruct(shape, dtype, sharding=None): an array's shape and dtype") < 0 ||
      add_jax(b, "eval_shape", bi_eval_shape,
              "eval_shape(fun, *args): the result's shapes and dtypes, computing nothing") < 0)
    return -1;
  return 0;
}
