/*
 * jaxconfig.c - jax.config, jax.disable_jit, jax.named_scope and
 * jax.named_call (jaxconfig.h).
 */
#include <math.h>
#include <string.h>

#include "array/array.h"
#include "base/error.h"
#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/jaxconfig.h"

atomic_bool jaxcfg_debug_nans, jaxcfg_disable_jit;

/* The options update() knows, by JAX's names. */
static const struct {
  const char *name;
  atomic_bool *flag;
} options[] = {{"jax_debug_nans", &jaxcfg_debug_nans}, {"jax_disable_jit", &jaxcfg_disable_jit}};

static atomic_bool *option(const char *name) {
  for (size_t i = 0; i < sizeof options / sizeof *options; i++)
    if (!strcmp(options[i].name, name)) return options[i].flag;
  return NULL;
}

/* ---- the NaN check ---- */

/* A Python float is Python's, as in JAX: 0. * inf is nan without error. */
static bool array_has_nan(const Array *a) {
  if (!dt_is_float(a->dtype) || a->host) return false;
  for (int64_t i = 0; i < a->size; i++)
    if (isnan(arr_get_f64(a, i))) return true;
  return false;
}

bool jaxcfg_has_nan(const Value *v) {
  if (v->type == V_ARRAY) return array_has_nan(AS_ARRAY((Value *)v));
  size_t n = 0;
  Value *const *xs = NULL;
  if (v->type == V_LIST || v->type == V_TUPLE) val_seq((Value *)v, &n, &xs);
  else if (v->type == V_DICT) n = ((const Dict *)v)->len, xs = ((const Dict *)v)->vals;
  for (size_t i = 0; i < n; i++)
    if (jaxcfg_has_nan(xs[i])) return true;
  return false;
}

/* Whether [what] only moves values onto the device (JAX's device_put,
 * which jax_debug_nans does not check): an array made from a NaN the
 * program wrote is not an operation that made one. */
static bool is_conversion(const char *what) {
  return !strcmp(what, "array") || !strcmp(what, "asarray") || !strcmp(what, "device_put");
}

Value *jaxcfg_nan_check(Value *v, const char *what) {
  if (!v || v->type != V_ARRAY || is_conversion(what) || !array_has_nan(AS_ARRAY(v))) return v;
  val_decref(v);
  return err_set(ERR_FLOATING_POINT, "invalid value (nan) encountered in %s", what);
}

/* ---- jax.config ---- */

static Value *config_update(Value *self, const CallArgs *a) {
  (void)self;
  Value *name, *val;
  Value **slots[] = {&name, &val};
  if (args_bind("update", a, "name, val", slots) < 0) return NULL;
  if (name->type != V_STR) return err_set(ERR_TYPE, "update(): the option's name must be a str");
  atomic_bool *flag = option(str_cstr(name));
  if (!flag)
    return err_set(ERR_ATTRIBUTE, "Unrecognized config option: %s (shmap has jax_debug_nans "
                   "and jax_disable_jit)", str_cstr(name));
  int t = val_truth(val);
  if (t < 0) return NULL;
  atomic_store(flag, t != 0);
  return val_incref(VAL_NONE);
}

static Value *config_getattr(Value *self, const char *name) {
  if (!strcmp(name, "update")) return bound_new("update", config_update, self);
  atomic_bool *flag = option(name);
  if (flag) return val_bool(atomic_load(flag));
  return err_set(ERR_ATTRIBUTE, "'Config' object has no attribute '%s'", name);
}

static Value *config_repr(Value *self) {
  (void)self;
  return str_from("<jax.config>");
}

static const OpaqueType config_type = {"Config", NULL, config_repr, config_getattr, NULL, NULL, NULL};

/* ---- jax.disable_jit() ---- */

/* The context manager: the setting to restore as its block ends. */
typedef struct DisableJit {
  Opaque base;
  bool disable, saved;
} DisableJit;

static Value *disable_jit_enter(Value *self) {
  DisableJit *d = (DisableJit *)self;
  d->saved = atomic_exchange(&jaxcfg_disable_jit, d->disable);
  return val_incref(VAL_NONE);
}

static int disable_jit_exit(Value *self) {
  atomic_store(&jaxcfg_disable_jit, ((DisableJit *)self)->saved);
  return 0;
}

static Value *disable_jit_repr(Value *self) {
  (void)self;
  return str_from("<jax.disable_jit>");
}

static const OpaqueType disable_jit_type = {"disable_jit", NULL, disable_jit_repr, NULL, NULL,
                                            disable_jit_enter, disable_jit_exit};

static Value *opaque_new(const OpaqueType *ot, size_t size) {
  Opaque *o = shm_calloc(1, size);
  if (!o) return err_nomem();
  val_init(&o->hdr, V_OPAQUE);
  o->ot = ot;
  return &o->hdr;
}

/* jax.disable_jit(disable=True): a context manager. */
static Value *bi_disable_jit(const CallArgs *a) {
  Value *disable = NULL;
  Value **slots[] = {&disable};
  if (args_bind("disable_jit", a, "disable=", slots) < 0) return NULL;
  int t = disable ? val_truth(disable) : 1;
  if (t < 0) return NULL;
  Value *v = opaque_new(&disable_jit_type, sizeof(DisableJit));
  if (v) ((DisableJit *)v)->disable = t != 0;
  return v;
}

/* ---- jax.named_scope(name) and jax.named_call(fun, name=) ---- */

/* JAX puts the scope's name in its staged programs' metadata, for
 * profiles; shmap's plans carry source lines instead, so the scope
 * changes nothing: a context manager whose block runs as written. */
static Value *named_scope_enter(Value *self) {
  (void)self;
  return val_incref(VAL_NONE);
}

static int named_scope_exit(Value *self) {
  (void)self;
  return 0;
}

static Value *named_scope_repr(Value *self) {
  (void)self;
  return str_from("<jax.named_scope>");
}

static const OpaqueType named_scope_type = {"named_scope", NULL, named_scope_repr, NULL, NULL,
                                            named_scope_enter, named_scope_exit};

static Value *bi_named_scope(const CallArgs *a) {
  Value *name;
  if (args_bind("named_scope", a, "name", (Value **[]){&name}) < 0) return NULL;
  if (name->type != V_STR) return err_set(ERR_VALUE, "named_scope name argument must be a string.");
  return opaque_new(&named_scope_type, sizeof(Opaque));
}

/* named_call(fun, *, name=None): fun itself, its calls named in JAX's
 * metadata only. */
static Value *bi_named_call(const CallArgs *a) {
  Value *fun, *name = NULL;
  if (args_bind("named_call", a, "fun, name=", (Value **[]){&fun, &name}) < 0) return NULL;
  if (!val_callable(fun)) return err_set(ERR_TYPE, "named_call: fun must be callable, got %s", val_type_name(fun));
  return val_incref(fun);
}

int jaxcfg_register(void) {
  Value *cfg = opaque_new(&config_type, sizeof(Opaque));
  int rc = cfg ? builtins_add_to("jax", "config", cfg) : -1;
  val_decref(cfg);
  Value *dj = rc == 0 ? builtin_new("disable_jit", bi_disable_jit, "disable_jit(disable=True)") : NULL;
  rc = dj ? builtins_add_to("jax", "disable_jit", dj) : -1;
  val_decref(dj);
  Value *ns = rc == 0 ? builtin_new("named_scope", bi_named_scope, "named_scope(name): a context manager") : NULL;
  rc = ns ? builtins_add_to("jax", "named_scope", ns) : -1;
  val_decref(ns);
  Value *nc = rc == 0 ? builtin_new("named_call", bi_named_call, "named_call(fun, *, name=None)") : NULL;
  rc = nc ? builtins_add_to("jax", "named_call", nc) : -1;
  val_decref(nc);
  return rc;
}
