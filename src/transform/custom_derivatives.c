/*
 * custom_derivatives.c - jax.custom_jvp and jax.custom_vjp
 * (custom_derivatives.h), and the rows of custom_jvp_call,
 * custom_vjp_call and custom_lin side by side: their call on tracers of
 * each transformation (jvp_call, batch_call), their compiled step, their
 * evaluation in an xmap body, and custom_lin's transpose (the bwd rule).
 *
 * Semantics: JAX's jax/_src/custom_derivatives.py (custom_jvp_call_p,
 * custom_vjp_call_p and its custom_lin_p, whose transpose runs bwd).
 */
#include <string.h>

#include "array/print.h"
#include "base/intern.h"
#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/ops.h"
#include "lang/pytree.h"
#include "transform/ad_impl.h"
#include "transform/batch.h"
#include "transform/compile_impl.h"
#include "transform/custom_derivatives.h"
#include "transform/higher.h"
#include "transform/trace.h"
#include "transform/xmap.h"

/* ==== the custom function ============================================================= */

/* A custom_jvp or custom_vjp function.  Its rules are set once, by
 * defjvp/defvjp as the program defines it, before any device calls it. */
typedef struct Custom {
  Opaque base;
  const char *name;   /* interned: fun's */
  Value *fun;         /* the primal function */
  Value *nondiff;     /* nondiff_argnums: a tuple of ints */
  Value *fwd, *bwd;   /* custom_vjp's rules, or NULL */
  Value *jvp;         /* custom_jvp: defjvp's rule, or NULL */
  Value *jvps;        /* custom_jvp: defjvps's tuple (None entries: zero), or NULL */
  const char *rule_names[2];  /* interned: fwd's and bwd's, or jvp's; for the plan */
  bool symbolic_zeros;        /* defvjp's or defjvp's symbolic_zeros=True */
} Custom;

static const OpaqueType vjp_type, jvp_type;

static bool is_vjp(const Custom *c) { return c->base.ot == &vjp_type; }

static bool array_leaf(Value *v) { return ops_is_array(v); }

static const char *fn_name(Value *f) {
  if (f && f->type == V_FUNC) return ((Func *)f)->name;
  if (f && f->type == V_OPAQUE && (((Opaque *)f)->ot == &vjp_type || ((Opaque *)f)->ot == &jvp_type))
    return ((Custom *)f)->name;
  return intern_cstr("<function>");
}

/* Whether positional argument [i] is one of nondiff_argnums. */
static bool is_nondiff(const Custom *c, int i) {
  for (size_t k = 0; k < tuple_len(c->nondiff); k++) {
    int64_t n;
    if (arr_to_index(tuple_get(c->nondiff, k), &n) == 0 && n == i) return true;
  }
  return false;
}

static void custom_free(Value *v) {
  Custom *c = (Custom *)v;
  Value *owned[] = {c->fun, c->nondiff, c->fwd, c->bwd, c->jvp, c->jvps};
  for (size_t i = 0; i < sizeof owned / sizeof owned[0]; i++)
    if (owned[i]) val_decref(owned[i]);
}

static Value *custom_repr(Value *v) {
  return str_printf("<%s function %s>", ((Opaque *)v)->ot->name, ((Custom *)v)->name);
}

static Value *custom_call(Value *self, const CallArgs *a);
static Value *custom_getattr(Value *self, const char *name);

static const OpaqueType vjp_type = {.name = "custom_vjp", .free = custom_free, .repr = custom_repr,
                                    .getattr = custom_getattr};
static const OpaqueType jvp_type = {.name = "custom_jvp", .free = custom_free, .repr = custom_repr,
                                    .getattr = custom_getattr};

/* A new custom function of [fun] with [nondiff] (both borrowed). */
static Custom *custom_new(const OpaqueType *ot, Value *fun, Value *nondiff) {
  Custom *c = shm_calloc(1, sizeof *c);
  if (!c) return err_nomem();
  val_init(&c->base.hdr, V_OPAQUE);
  c->base.ot = ot;
  c->fun = val_incref(fun);
  c->nondiff = val_incref(nondiff);
  c->name = fn_name(fun);
  return c;
}

/* ---- symbolic zeros: SymbolicZero and CustomVJPPrimal ------------------------- */

/* jax.custom_derivatives.SymbolicZero: the zero tangent or cotangent of a
 * value that is not being differentiated, by its aval (JAX forwards the
 * attributes to it: shape, dtype, ndim, size, weak_type). */
typedef struct SymZero {
  Opaque base;
  AVal av;
} SymZero;

/* jax.custom_derivatives.CustomVJPPrimal: what fwd receives for each
 * array leaf under symbolic_zeros=True: the value and whether it is being
 * differentiated. */
typedef struct VjpPrimal {
  Opaque base;
  Value *value;
  bool perturbed;
} VjpPrimal;

static Value *symzero_getattr(Value *self, const char *name);
static Value *symzero_repr(Value *self) { (void)self; return str_from("SymbolicZero"); }
static void vjp_primal_free(Value *v) { val_decref(((VjpPrimal *)v)->value); }
static Value *vjp_primal_getattr(Value *self, const char *name);
static Value *vjp_primal_repr(Value *self);

static const OpaqueType symzero_type = {.name = "SymbolicZero", .repr = symzero_repr,
                                        .getattr = symzero_getattr};
static const OpaqueType vjp_primal_type = {.name = "CustomVJPPrimal", .free = vjp_primal_free,
                                           .repr = vjp_primal_repr, .getattr = vjp_primal_getattr};

static bool is_symzero(Value *v) { return v->type == V_OPAQUE && ((Opaque *)v)->ot == &symzero_type; }
static bool is_vjp_primal(Value *v) { return v->type == V_OPAQUE && ((Opaque *)v)->ot == &vjp_primal_type; }
static bool array_or_symzero(Value *v) { return array_leaf(v) || is_symzero(v); }
static bool any_leaf(Value *v) { (void)v; return true; }

/* A new SymbolicZero of aval [av]. */
static Value *symzero_new(const AVal *av) {
  SymZero *z = shm_calloc(1, sizeof *z);
  if (!z) return err_nomem();
  val_init(&z->base.hdr, V_OPAQUE);
  z->base.ot = &symzero_type;
  aval_copy(&z->av, av);
  return &z->base.hdr;
}

/* The SymbolicZero of array leaf [v]'s aval. */
static Value *symzero_of(Value *v, void *unused) {
  (void)unused;
  AVal av;
  return ops_aval(v, &av) < 0 ? NULL : symzero_new(&av);
}

static Value *symzero_getattr(Value *self, const char *name) {
  const AVal *av = &((SymZero *)self)->av;
  int64_t size = 1;
  for (int d = 0; d < av->ndim; d++) size *= av->shape[d];
  if (!strcmp(name, "shape")) {
    Value *t = tuple_new((size_t)av->ndim);
    for (int d = 0; t && d < av->ndim; d++) tuple_set_steal(t, (size_t)d, val_int(av->shape[d]));
    return t;
  }
  if (!strcmp(name, "dtype")) return dtype_value(av->dtype);
  if (!strcmp(name, "ndim")) return val_int(av->ndim);
  if (!strcmp(name, "size")) return val_int(size);
  if (!strcmp(name, "weak_type")) return val_bool(av->weak);
  return err_set(ERR_ATTRIBUTE, "SymbolicZero has no attribute %s", name);
}

/* A new CustomVJPPrimal of [value] (borrowed). */
static Value *vjp_primal_new(Value *value, bool perturbed) {
  VjpPrimal *p = shm_calloc(1, sizeof *p);
  if (!p) return err_nomem();
  val_init(&p->base.hdr, V_OPAQUE);
  p->base.ot = &vjp_primal_type;
  p->value = val_incref(value);
  p->perturbed = perturbed;
  return &p->base.hdr;
}

static Value *vjp_primal_getattr(Value *self, const char *name) {
  VjpPrimal *p = (VjpPrimal *)self;
  if (!strcmp(name, "value")) return val_incref(p->value);
  if (!strcmp(name, "perturbed")) return val_bool(p->perturbed);
  return err_set(ERR_ATTRIBUTE, "'CustomVJPPrimal' object has no attribute '%s'", name);
}

/* As the dataclass prints: CustomVJPPrimal(value=..., perturbed=True). */
static Value *vjp_primal_repr(Value *self) {
  VjpPrimal *p = (VjpPrimal *)self;
  Value *r = val_repr(p->value), *s = r ? str_printf("CustomVJPPrimal(value=%s, perturbed=%s)",
                                                     str_cstr(r), p->perturbed ? "True" : "False") : NULL;
  val_decref(r);
  return s;
}

/* custom_vjp_primal_tree_values(tree): each CustomVJPPrimal leaf's value;
 * any other leaf is JAX's TypeError. */
static Value *unwrap_primal_leaf(Value *v, void *unused) {
  (void)unused;
  if (is_vjp_primal(v)) return val_incref(((VjpPrimal *)v)->value);
  Value *t = builtins_type_of(v), *r = t ? val_repr(t) : NULL;
  if (r) err_set(ERR_TYPE, "unexpected leaf type %s", str_cstr(r));
  val_decref(t);
  val_decref(r);
  return NULL;
}

static Value *bi_primal_tree_values(const CallArgs *a) {
  Value *tree;
  if (args_bind("custom_vjp_primal_tree_values", a, "tree", (Value **[]){&tree}) < 0) return NULL;
  return pytree_map(tree, any_leaf, unwrap_primal_leaf, NULL);
}

/* zeros of array leaf [v]'s aval, weakly typed as it is (JAX's
 * instantiated zero tangent). */
static Value *zeros_of(Value *v, void *unused) {
  (void)unused;
  AVal av;
  if (ops_aval(v, &av) < 0) return NULL;
  Value *z = prim_zeros(&av);
  if (z && IS_ARRAY(z)) AS_ARRAY(z)->weak = av.weak;
  return z;
}

/* zero_from_primal(val, symbolic_zeros=False): the zero tangent of each
 * array leaf of [val]: a SymbolicZero, or zeros. */
static Value *bi_zero_from_primal(const CallArgs *a) {
  Value *val, *sz = NULL;
  if (args_bind("zero_from_primal", a, "val, symbolic_zeros=", (Value **[]){&val, &sz}) < 0) return NULL;
  int symbolic = sz ? val_truth(sz) : 0;
  if (symbolic < 0) return NULL;
  return pytree_map(val, array_leaf, symbolic ? symzero_of : zeros_of, NULL);
}

/* SymbolicZero leaves of [tree] with [size] put in front of their shape
 * ([size] > 0) or their first dimension dropped ([size] == 0): the rules
 * of a vmapped custom function see one example's avals. */
static Value *symzero_batched(Value *v, void *ctx) {
  int64_t size = *(int64_t *)ctx;
  AVal av;
  aval_copy(&av, &((SymZero *)v)->av);
  if (size > 0 && av.ndim < SHM_MAXDIM) {
    memmove(av.shape + 1, av.shape, sizeof(int64_t) * (size_t)av.ndim);
    av.shape[0] = size;
    av.ndim++;
  } else if (size == 0 && av.ndim > 0) {
    memmove(av.shape, av.shape + 1, sizeof(int64_t) * (size_t)--av.ndim);
  }
  return symzero_new(&av);
}

/* ---- defvjp, defjvp, defjvps ---------------------------------------------------- */

/* symbolic_zeros= of defvjp/defjvp into c: 0, or -1 with the error set. */
static int set_symbolic_zeros(Custom *c, Value *sz) {
  int t = sz ? val_truth(sz) : 0;
  if (t < 0) return -1;
  c->symbolic_zeros = t;
  return 0;
}

static void set_rule(Value **slot, Value *v) {
  if (*slot) val_decref(*slot);
  *slot = v ? val_incref(v) : NULL;
}

/* f.defvjp(fwd, bwd, symbolic_zeros=False, optimize_remat=False) */
static Value *defvjp_m(Value *self, const CallArgs *a) {
  Value *fwd, *bwd, *sz = NULL, *remat = NULL;
  if (args_bind("defvjp", a, "fwd, bwd, symbolic_zeros=, optimize_remat=",
                (Value **[]){&fwd, &bwd, &sz, &remat}) < 0 || set_symbolic_zeros((Custom *)self, sz) < 0)
    return NULL;
  if (((Custom *)self)->symbolic_zeros && remat && val_truth(remat) == 1)
    return err_set(ERR_NOT_IMPLEMENTED, "remat optimization for custom_vjp does not support symbolic zeros");
  set_rule(&((Custom *)self)->fwd, fwd);
  set_rule(&((Custom *)self)->bwd, bwd);
  ((Custom *)self)->rule_names[0] = fn_name(fwd);
  ((Custom *)self)->rule_names[1] = fn_name(bwd);
  return VAL_NONE;
}

/* f.defjvp(jvp, symbolic_zeros=False): the rule, so that it decorates */
static Value *defjvp_m(Value *self, const CallArgs *a) {
  Value *jvp, *sz = NULL;
  if (args_bind("defjvp", a, "jvp, symbolic_zeros=", (Value **[]){&jvp, &sz}) < 0 ||
      set_symbolic_zeros((Custom *)self, sz) < 0)
    return NULL;
  set_rule(&((Custom *)self)->jvp, jvp);
  set_rule(&((Custom *)self)->jvps, NULL);
  ((Custom *)self)->rule_names[0] = fn_name(jvp);
  return val_incref(jvp);
}

/* f.defjvps(*jvps): one rule per argument, jvp_i(g_i, primal_out, *primals) */
static Value *defjvps_m(Value *self, const CallArgs *a) {
  if (a->nkw) return err_set(ERR_TYPE, "defjvps() takes no keyword arguments");
  Value *t = tuple_pack((size_t)a->nargs, a->args);
  if (!t) return NULL;
  set_rule(&((Custom *)self)->jvps, t);
  set_rule(&((Custom *)self)->jvp, NULL);
  ((Custom *)self)->symbolic_zeros = false;
  ((Custom *)self)->rule_names[0] = intern_cstr("defjvps");
  val_decref(t);
  return VAL_NONE;
}

static Value *custom_getattr(Value *self, const char *name) {
  Custom *c = (Custom *)self;
  bool vjp = is_vjp(c);
  if (vjp && !strcmp(name, "defvjp")) return bound_new("defvjp", defvjp_m, self);
  if (!vjp && !strcmp(name, "defjvp")) return bound_new("defjvp", defjvp_m, self);
  if (!vjp && !strcmp(name, "defjvps")) return bound_new("defjvps", defjvps_m, self);
  if (!strcmp(name, "fun") || !strcmp(name, "__wrapped__")) return val_incref(c->fun);
  if (!strcmp(name, "nondiff_argnums")) return val_incref(c->nondiff);
  if (!strcmp(name, "__name__")) return str_from(c->name);
  if (!strcmp(name, "symbolic_zeros")) return val_bool(c->symbolic_zeros);
  Value *rule = !strcmp(name, "fwd") && vjp ? c->fwd : !strcmp(name, "bwd") && vjp ? c->bwd
              : !strcmp(name, "jvp") && !vjp ? c->jvp : self;
  if (rule != self) return val_incref(rule ? rule : VAL_NONE);
  return err_set(ERR_ATTRIBUTE, "'%s' object has no attribute '%s'", c->base.ot->name, name);
}

/* custom_vjp(fun, nondiff_argnums=()) and custom_jvp(...) */
static Value *make_custom(const CallArgs *a, const OpaqueType *ot) {
  Value *fun, *nd = NULL;
  if (args_bind(ot->name, a, "fun, nondiff_argnums=", (Value **[]){&fun, &nd}) < 0) return NULL;
  size_t n = 0;
  Value *const *items = NULL;
  if (nd && !val_seq(nd, &n, &items))
    return err_set(ERR_TYPE, "%s: nondiff_argnums must be a tuple of ints, got %s", ot->name,
                   val_type_name(nd));
  for (size_t i = 0; i < n; i++) {
    int64_t k;
    if (arr_to_index(items[i], &k) < 0) return NULL;
    if (k < 0) return err_set(ERR_VALUE, "%s: nondiff_argnums must be non-negative, got %lld",
                              ot->name, (long long)k);
  }
  Value *t = tuple_pack(n, (Value **)items);
  Custom *c = t ? custom_new(ot, fun, t) : NULL;
  if (t) val_decref(t);
  return c ? &c->base.hdr : NULL;
}

static Value *bi_custom_vjp(const CallArgs *a) { return make_custom(a, &vjp_type); }

static int pair_of(Value *r, Value **x, Value **y, const char *rule, const char *name,
                   const char *what);

/* custom_gradient's primal function: fun(*args)'s first item. */
static Value *gradient_primal(Value *fun, const CallArgs *a) {
  Value *r = val_call(fun, a), *x, *y;
  if (!r) return NULL;
  Value *out = pair_of(r, &x, &y, "gradient", fn_name(fun), "the output and its vjp function") == 0
                   ? val_incref(x) : NULL;
  val_decref(r);
  return out;
}

/* custom_gradient's bwd: the vjp function fwd left as the residual, on
 * the cotangent; one cotangent alone is the tuple of it. */
static Value *gradient_bwd(const CallArgs *a) {
  Value *vjp_fn, *g;
  if (args_bind("custom_gradient bwd", a, "res, g", (Value **[]){&vjp_fn, &g}) < 0) return NULL;
  Value *r = val_call_n(vjp_fn, 1, &g);
  if (!r || r->type == V_TUPLE || r->type == V_LIST) return r;
  Value *t = tuple_pack(1, &r);
  val_decref(r);
  return t;
}

/* custom_gradient(fun): fun(*args) returns (out, vjp_fn), vjp_fn(g) the
 * arguments' cotangents; a custom_vjp whose fwd is fun (vjp_fn the
 * residual) and whose bwd calls vjp_fn. */
static Value *bi_custom_gradient(const CallArgs *a) {
  Value *fun;
  if (args_bind("custom_gradient", a, "fun", (Value **[]){&fun}) < 0) return NULL;
  Value *prim = bound_new(fn_name(fun), gradient_primal, fun);
  Value *bwd = builtin_new("bwd", gradient_bwd, "the vjp function of custom_gradient");
  Value *nd = tuple_new(0);
  Custom *c = prim && bwd && nd ? custom_new(&vjp_type, prim, nd) : NULL;
  if (c) {
    c->name = fn_name(fun);
    set_rule(&c->fwd, fun);
    set_rule(&c->bwd, bwd);
    c->rule_names[0] = c->name;
    c->rule_names[1] = intern_cstr("bwd");
  }
  Value *held[] = {prim, bwd, nd};
  for (size_t i = 0; i < 3; i++)
    if (held[i]) val_decref(held[i]);
  return c ? &c->base.hdr : NULL;
}
static Value *bi_custom_jvp(const CallArgs *a) { return make_custom(a, &jvp_type); }

/* ==== the call: the innermost trace among the arguments picks the rule ============= */

/* The tracer of the innermost trace among the arguments' leaves, or
 * NULL (none is a tracer): a nondiff argument's too, which its rule
 * then refuses.  0 or -1. */
static int top_tracer(const Custom *c, const CallArgs *a, Tracer **top) {
  (void)c;
  *top = NULL;
  for (int i = 0; i < a->nargs; i++) {
    PyLeaves l = {0};
    if (pytree_flatten(a->args[i], array_leaf, &l) < 0) return -1;
    for (int k = 0; k < l.n; k++)
      if (IS_TRACER(l.v[k]) && (!*top || ((Tracer *)l.v[k])->trace_id > (*top)->trace_id))
        *top = (Tracer *)l.v[k];
    pytree_leaves_free(&l);
  }
  return 0;
}

/* JAX's check on custom_vjp's nondiff arguments: no tracer among their
 * leaves (their derivative could be neither taken nor refused later). */
static int check_nondiff(const Custom *c, const CallArgs *a) {
  for (int i = 0; i < a->nargs; i++) {
    PyLeaves l = {0};
    if (!is_nondiff(c, i)) continue;
    if (pytree_flatten(a->args[i], array_leaf, &l) < 0) return -1;
    bool traced = false;
    for (int k = 0; k < l.n; k++) traced |= IS_TRACER(l.v[k]);
    pytree_leaves_free(&l);
    if (traced)
      return err_set(ERR_TYPE, "Found a JAX Tracer object passed as an argument to a custom_vjp "
                               "function in a position indicated by nondiff_argnums as "
                               "non-differentiable. Tracers cannot be passed as non-differentiable "
                               "arguments to custom_vjp functions; instead, nondiff_argnums should "
                               "only be used for arguments that can't be or contain JAX tracers, "
                               "e.g. function-valued arguments. In particular, array-valued "
                               "arguments should typically not be indicated as nondiff_argnums."), -1;
  }
  return 0;
}

static Value *stage_call(Custom *c, const CallArgs *a);

/* The keyword argument [name] of [a], or NULL. */
static Value *kwarg(const CallArgs *a, const char *name) {
  for (int i = 0; i < a->nkw; i++)
    if (!strcmp(a->kwnames[i], name)) return a->kwvals[i];
  return NULL;
}

/* [a]'s arguments bound to positions by fun's signature, defaults
 * applied, as JAX resolves a custom function's arguments: a new
 * array of [*n] borrowed values (shm_free it), or NULL with the error set. */
static Value **resolve_kwargs(Custom *c, const CallArgs *a, int *n) {
  const Func *f = c->fun->type == V_FUNC ? (const Func *)c->fun : NULL;
  if (!f) return err_set(ERR_TYPE, "%s(): keyword arguments could not be resolved to positions", c->name);
  int np = 0, used = 0;
  while (np < f->node->nparams && !f->node->params[np].star && !f->node->params[np].starstar) np++;
  bool star = np < f->node->nparams && f->node->params[np].star;
  int extra = star && a->nargs > np ? a->nargs - np : 0;   /* *args takes the rest */
  Value **v = shm_calloc((size_t)(np + extra) + 1, sizeof(Value *));
  if (!v) return err_nomem();
  for (int i = 0; i < extra; i++) v[np + i] = a->args[np + i];
  for (int i = 0; i < np; i++) {
    Value *kw = kwarg(a, f->node->params[i].name);
    used += kw != NULL;
    v[i] = i < a->nargs ? a->args[i] : kw ? kw : f->defaults ? f->defaults[i] : NULL;
    if (!v[i] || (kw && i < a->nargs)) {
      shm_free(v);
      return err_set(ERR_TYPE, "%s(): keyword arguments could not be resolved to positions", c->name);
    }
  }
  if (used != a->nkw || a->nargs > np + extra) {
    shm_free(v);
    return err_set(ERR_TYPE, "%s(): %s", c->name, used != a->nkw ? "keyword arguments could not be "
                   "resolved to positions" : "too many positional arguments");
  }
  *n = np + extra;
  return v;
}

static Value *custom_call_positional(Value *self, const CallArgs *a);

static Value *custom_call(Value *self, const CallArgs *a) {
  if (!a->nkw && ((Custom *)self)->fun->type != V_FUNC) return custom_call_positional(self, a);
  int n = 0;
  Value **v = resolve_kwargs((Custom *)self, a, &n);
  if (!v) return NULL;
  CallArgs pa = {.nargs = n, .args = v};
  Value *r = custom_call_positional(self, &pa);
  shm_free(v);
  return r;
}

static Value *custom_call_positional(Value *self, const CallArgs *a) {
  Custom *c = (Custom *)self;
  if (is_vjp(c) && !c->fwd)
    return err_set(ERR_ATTRIBUTE, "No VJP defined for custom_vjp function %s using defvjp.", c->name);
  if (!is_vjp(c) && !c->jvp && !c->jvps)
    return err_set(ERR_ATTRIBUTE, "No JVP defined for custom_jvp function %s using defjvp.", c->name);
  for (size_t k = 0; k < tuple_len(c->nondiff); k++) {
    int64_t n;
    if (arr_to_index(tuple_get(c->nondiff, k), &n) < 0) return NULL;
    if (n >= a->nargs)
      return err_set(ERR_TYPE, "%s(): nondiff_argnums=%lld, but it was called with %d positional "
                               "arguments", c->name, (long long)n, a->nargs);
  }
  Tracer *top;
  if ((is_vjp(c) && check_nondiff(c, a) < 0) || top_tracer(c, a, &top) < 0) return NULL;
  PrimId row = is_vjp(c) ? P_CUSTOM_VJP_CALL : P_CUSTOM_JVP_CALL;
  if (top && (top->kind == TR_JVP || top->kind == TR_BATCH)) {
    HigherCallRule rule = top->kind == TR_JVP ? higher_rules(row)->jvp_call : higher_rules(row)->batch_call;
    return rule(self, a);
  }
  if (top || prim_tracing()) return stage_call(c, a);
  return val_call(c->fun, a);
}

/* ==== jit: one custom_jvp_call / custom_vjp_call equation =========================== */

/* Traces fun on the leaves of [args] (a tuple) into a sub-plan: its plan,
 * captures and result tree.  0, or -1 with the error set. */
static int trace_fun(Custom *c, Value *args, PyLeaves *in, Plan **plan, Value ***caps, int *ncap,
                     Value **res) {
  Trace *t = trace_begin(c->name, false);
  if (!t) return -1;
  Value **tr = shm_calloc((size_t)in->n + 1, sizeof(Value *)), *targs = NULL;
  PyLeaves out = {0};
  int made = 0, pos = 0;
  *res = NULL;
  for (; tr && made < in->n; made++) {
    AVal av;
    if (ops_aval(in->v[made], &av) < 0 || !(tr[made] = trace_new_arg(t, &av, NULL))) break;
  }
  if (tr && made == in->n && (targs = pytree_replace(args, array_leaf, tr, &pos)))
    *res = val_call_n(c->fun, (int)tuple_len(targs), ((Tuple *)targs)->items);
  if (*res && pytree_flatten(*res, array_leaf, &out) == 0)
    *plan = trace_end(t, out.n, out.v, caps, ncap);
  else
    trace_abort(t);
  if (!tr) err_nomem();
  ad_values_free(tr, made);
  if (targs) val_decref(targs);
  pytree_leaves_free(&out);
  return *res && *plan ? 0 : -1;
}

/* The equation's parameters, in JAX's order: name, [bwd,] call_jaxpr,
 * fwd or jvp, num_consts, symbolic_zeros. */
static void call_params(Custom *c, Params *p, Plan *plan, int ncap) {
  params_init(p);
  params_add(p, "name", str_from(c->name));
  if (is_vjp(c)) params_add(p, "bwd", str_from(c->rule_names[1]));
  params_add(p, "call_jaxpr", val_incref(&plan->hdr));
  params_add(p, is_vjp(c) ? "fwd" : "jvp", str_from(c->rule_names[0]));
  params_add(p, "num_consts", val_int(ncap));
  params_add(p, "symbolic_zeros", val_bool(c->symbolic_zeros));
}

static Value *stage_call(Custom *c, const CallArgs *a) {
  Value *args = tuple_pack((size_t)a->nargs, a->args), *res = NULL, *r = NULL, *tup = NULL;
  PyLeaves in = {0};
  Plan *plan = NULL;
  Value **caps = NULL, **ops = NULL;
  int ncap = 0;
  AVal *avs = NULL;
  if (!args || pytree_flatten(args, array_leaf, &in) < 0 ||
      trace_fun(c, args, &in, &plan, &caps, &ncap, &res) < 0)
    goto out;
  ops = shm_calloc((size_t)(ncap + in.n) + 1, sizeof(Value *));
  avs = shm_calloc((size_t)plan->nout + 1, sizeof(AVal));
  if (!ops || !avs) {
    err_nomem();
    goto out;
  }
  shm_memcpy(ops, caps, sizeof(Value *) * (size_t)ncap);
  shm_memcpy(ops + ncap, in.v, sizeof(Value *) * (size_t)in.n);
  for (int i = 0; i < plan->nout; i++) plan_atom_aval(plan, &plan->outs[i], &avs[i]);
  Params p;
  call_params(c, &p, plan, ncap);
  PrimId row = is_vjp(c) ? P_CUSTOM_VJP_CALL : P_CUSTOM_JVP_CALL;
  if ((tup = trace_emit(row, &p, ncap + in.n, ops, plan->nout, avs))) {
    int pos = 0;
    r = pytree_replace(res, array_leaf, ((Tuple *)tup)->items, &pos);
  }
out:
  if (args) val_decref(args);
  if (res) val_decref(res);
  if (tup) val_decref(tup);
  if (plan) val_decref(&plan->hdr);
  trace_caps_free(caps, ncap);
  pytree_leaves_free(&in);
  shm_free(ops);
  shm_free(avs);
  return r;
}

/* The compiled step: the sub-plan on the operands, as a nested call. */
static int prepare_call(Exec *e, Step *s, const Plan *p) {
  (void)e, (void)p;
  Plan *sub = cmp_param_plan(s->eqn, "call_jaxpr");
  return sub ? cmp_compile(sub) : (err_set(ERR_VALUE, "%s without a call_jaxpr", prim_table[s->eqn->prim].name), -1);
}

static int run_call(Step *s, Workspace *w) {
  Array **outs = cmp_step_outs(s, w);
  return cmp_run_into(cmp_param_plan(s->eqn, "call_jaxpr"), cmp_step_ins(s, w, 0), outs);
}

/* xmap's interpreter: the sub-plan, equation by equation. */
static Value *eval_call(const PlanEqn *e, Value **in) {
  return xmap_eval_plan(cmp_param_plan(e, "call_jaxpr"), in);
}

static bool lowerable_call(const PlanEqn *e) {
  return xmap_subs_lowerable(params_get(&e->params, "call_jaxpr"));
}

/* ==== differentiation ================================================================ */

/* The innermost differentiation among the arguments (the dispatch found
 * a JVP tracer there), or NULL with the error set. */
static JvpTrace *args_jvp(Custom *c, const CallArgs *a) {
  Tracer *top;
  if (top_tracer(c, a, &top) < 0) return NULL;
  JvpTrace *j = top && top->kind == TR_JVP ? ad_jvp_find(top->trace_id) : NULL;
  if (!j)
    err_set(ERR_VALUE, "%s(): an argument is being differentiated by a differentiation that "
                       "finished, or of another thread", c->name);
  return j;
}

/* The arguments with trace [id]'s tangents stripped: [nondiff] selects
 * the nondiff_argnums ones, else the others (a new tuple). */
static Value *strip_args(Custom *c, const CallArgs *a, unsigned id, bool nondiff) {
  int n = 0;
  for (int i = 0; i < a->nargs; i++) n += is_nondiff(c, i) == nondiff;
  Value *t = tuple_new((size_t)n);
  for (int i = 0, k = 0; t && i < a->nargs; i++) {
    if (is_nondiff(c, i) != nondiff) continue;
    Value *s = ad_strip(a->args[i], id);
    if (!s) {
      for (; k < n; k++) tuple_set_steal(t, (size_t)k, val_incref(VAL_NONE));
      val_decref(t);
      return NULL;
    }
    tuple_set_steal(t, (size_t)k++, s);
  }
  return t;
}

/* rule(*nondiff, *rest): a new reference, or NULL with the error set. */
static Value *call_with(Value *rule, Value *nd, int n, Value **rest) {
  size_t m = tuple_len(nd);
  Value **args = shm_calloc(m + (size_t)n + 1, sizeof(Value *));
  if (!args) return err_nomem();
  shm_memcpy(args, ((Tuple *)nd)->items, sizeof(Value *) * m);
  shm_memcpy(args + m, rest, sizeof(Value *) * (size_t)n);
  Value *r = val_call_n(rule, (int)m + n, args);
  shm_free(args);
  return r;
}

/* [r]'s two items, as JAX requires of fwd and jvp rules; [what] names
 * them in the error. */
static int pair_of(Value *r, Value **x, Value **y, const char *rule, const char *name,
                   const char *what) {
  size_t n;
  Value *const *items;
  if (!val_seq(r, &n, &items) || n != 2) {
    err_set(ERR_TYPE, "Custom %s rule %s must produce a pair (list or tuple of length two) "
                      "representing %s, got %s.", rule, name, what, val_type_name(r));
    return -1;
  }
  *x = items[0];
  *y = items[1];
  return 0;
}

static Value *tangent_leaf(Value *v, void *id) { return ad_tangent_of(v, *(unsigned *)id); }

static bool is_jvp_of(Value *v, unsigned id) {
  return IS_JVP_TRACER(v) && ((Tracer *)v)->trace_id == id;
}

/* symbolic_zeros=True: a differentiated leaf's tangent, else a SymbolicZero. */
static Value *tangent_or_symzero(Value *v, void *id) {
  return is_jvp_of(v, *(unsigned *)id) ? ad_tangent_of(v, *(unsigned *)id) : symzero_of(v, NULL);
}

/* symbolic_zeros=True: CustomVJPPrimal(the primal of leaf [v], whether it is
 * differentiated), what fwd receives. */
static Value *vjp_primal_leaf(Value *v, void *id) {
  Value *p = ad_primal_of(v, *(unsigned *)id), *r = p ? vjp_primal_new(p, is_jvp_of(v, *(unsigned *)id)) : NULL;
  val_decref(p);
  return r;
}

/* The output tree [po] whose float leaves carry the tangents [to] (same
 * structure; a SymbolicZero leaf is zeros, as JAX takes one from any
 * rule) for trace [id]: a new tree, or NULL with the error set. */
static Value *with_tangents(Value *po, Value *to, unsigned id) {
  PyLeaves pl = {0}, tl = {0};
  Value **vals = NULL, *r = NULL;
  int k = 0;
  if (pytree_flatten(po, array_leaf, &pl) < 0 || pytree_flatten(to, array_or_symzero, &tl) < 0) goto out;
  if (pl.n != tl.n) {
    err_set(ERR_TYPE, "Custom JVP rule must produce primal and tangent outputs with equal container "
                      "(pytree) structures, but got %d and %d leaves respectively.", pl.n, tl.n);
    goto out;
  }
  if (!(vals = shm_calloc((size_t)pl.n + 1, sizeof(Value *)))) goto out;
  for (; k < pl.n; k++) {
    AVal pa, ta;
    bool zero = is_symzero(tl.v[k]);   /* a SymbolicZero: zeros, as JAX's Zero */
    if (ops_aval(pl.v[k], &pa) < 0) goto out;
    if (zero) aval_copy(&ta, &((SymZero *)tl.v[k])->av);
    else if (ops_aval(tl.v[k], &ta) < 0) goto out;
    if (pa.ndim != ta.ndim || memcmp(pa.shape, ta.shape, sizeof(int64_t) * (size_t)pa.ndim)) {
      char s1[128], s2[128];
      aval_str(s1, sizeof s1, pa.dtype, pa.ndim, pa.shape);
      aval_str(s2, sizeof s2, ta.dtype, ta.ndim, ta.shape);
      err_set(ERR_TYPE, "Custom JVP rule must produce primal and tangent outputs with corresponding "
                        "shapes and dtypes, but got %s and %s.", s1, s2);
      goto out;
    }
    Value *t = !dt_is_float(pa.dtype) ? NULL : zero ? zeros_of(pl.v[k], NULL) : val_incref(tl.v[k]);
    vals[k] = t ? ad_jvp_tracer(id, val_incref(pl.v[k]), t) : val_incref(pl.v[k]);
    if (!vals[k]) goto out;
  }
  int pos = 0;
  r = pytree_replace(po, array_leaf, vals, &pos);
out:
  if (!vals && pl.n == tl.n && !err_occurred()) err_nomem();
  ad_values_free(vals, k);
  pytree_leaves_free(&pl);
  pytree_leaves_free(&tl);
  return r;
}

/* ---- custom_jvp ---------------------------------------------------------------- */

/* Whether some leaf of [tree] is being differentiated by trace [id]. */
static bool differentiated(Value *tree, unsigned id) {
  PyLeaves l = {0};
  bool any = false;
  if (pytree_flatten(tree, array_leaf, &l) < 0) return err_clear(), false;
  for (int i = 0; i < l.n && !any; i++)
    any = IS_JVP_TRACER(l.v[i]) && ((Tracer *)l.v[i])->trace_id == id;
  pytree_leaves_free(&l);
  return any;
}

/* Adds the leaves of [t] (borrowed) into [acc] (NULL entries: none yet). */
static int add_leaves(Value **acc, int n, Value *t) {
  PyLeaves l = {0};
  if (pytree_flatten(t, array_leaf, &l) < 0) return -1;
  int rc = l.n == n ? 0 : (err_set(ERR_TYPE, "defjvps: a rule's tangent has %d leaves, the "
                                             "output %d", l.n, n), -1);
  for (int k = 0; rc == 0 && k < n; k++) {
    Value *s = acc[k] ? prim_add_any(acc[k], l.v[k]) : val_incref(l.v[k]);
    if (!s) rc = -1;
    else if (acc[k]) val_decref(acc[k]);
    if (s) acc[k] = s;
  }
  pytree_leaves_free(&l);
  return rc;
}

/* defjvps's rule: (fun(*primals), the sum over the differentiated
 * arguments of jvps[i](tangent_i, primal_out, *primals)). */
static Value *jvps_rule(Custom *c, const CallArgs *a, unsigned id, Value *prims, Value *tans) {
  Value *po = val_call_n(c->fun, (int)tuple_len(prims), ((Tuple *)prims)->items), *r = NULL;
  PyLeaves ol = {0};
  Value **acc = NULL;
  if (!po || pytree_flatten(po, array_leaf, &ol) < 0) goto out;
  if (!(acc = shm_calloc((size_t)ol.n + 1, sizeof(Value *)))) goto out;
  for (size_t i = 0; i < tuple_len(prims); i++) {
    Value *rule = i < tuple_len(c->jvps) ? tuple_get(c->jvps, i) : VAL_NONE;
    if (rule == VAL_NONE || !differentiated(a->args[i], id)) continue;
    Value *lead[2] = {tuple_get(tans, i), po};
    Value **args = shm_calloc(tuple_len(prims) + 3, sizeof(Value *));
    if (!args) goto out;
    memcpy(args, lead, sizeof lead);
    shm_memcpy(args + 2, ((Tuple *)prims)->items, sizeof(Value *) * tuple_len(prims));
    Value *t = val_call_n(rule, 2 + (int)tuple_len(prims), args);
    shm_free(args);
    int rc = t ? add_leaves(acc, ol.n, t) : -1;
    if (t) val_decref(t);
    if (rc < 0) goto out;
  }
  for (int k = 0; k < ol.n; k++) {
    AVal av;
    if (!acc[k] && (ops_aval(ol.v[k], &av) < 0 || !(acc[k] = prim_zeros(&av)))) goto out;
  }
  int pos = 0;
  Value *to = pytree_replace(po, array_leaf, acc, &pos);
  if (to) r = tuple_pack(2, (Value *[]){po, to});
  if (to) val_decref(to);
out:
  if (!acc && ol.n >= 0 && po && !err_occurred()) err_nomem();
  ad_values_free(acc, ol.n);
  pytree_leaves_free(&ol);
  if (po) val_decref(po);
  return r;
}

/* custom_jvp_call's jvp_call: the rule on (primals, tangents), forward or
 * reverse mode alike (its tangent operations are recorded as any). */
static Value *jvp_call_jvp(Value *self, const CallArgs *a) {
  Custom *c = (Custom *)self;
  JvpTrace *j = args_jvp(c, a);
  if (!j) return NULL;
  Value *nd = strip_args(c, a, j->id, true), *prims = strip_args(c, a, j->id, false);
  Value *tans = NULL, *r = NULL, *res = NULL, *po, *to;
  if (!nd || !prims || !(tans = tuple_new(tuple_len(prims)))) goto out;
  for (int i = 0, k = 0; i < a->nargs; i++) {
    if (is_nondiff(c, i)) continue;
    Value *t = pytree_map(a->args[i], array_leaf, c->symbolic_zeros ? tangent_or_symzero : tangent_leaf, &j->id);
    tuple_set_steal(tans, (size_t)k++, t ? t : val_incref(VAL_NONE));
    if (!t) goto out;
  }
  res = c->jvp ? call_with(c->jvp, nd, 2, (Value *[]){prims, tans}) : jvps_rule(c, a, j->id, prims, tans);
  if (!res || pair_of(res, &po, &to, "JVP", c->rule_names[0], "primal and tangent outputs") < 0) goto out;
  Value *ps = ad_strip(po, j->id);
  if (ps) r = with_tangents(ps, to, j->id);
  if (ps) val_decref(ps);
out:;
  Value *held[] = {nd, prims, tans, res};
  for (size_t i = 0; i < 4; i++)
    if (held[i]) val_decref(held[i]);
  return r;
}

/* ---- custom_vjp: the fwd rule forward, custom_lin for the backward pass -------- */

/* What custom_lin's transpose needs: the function (its bwd), the nondiff
 * arguments, the differentiable arguments (their structure and avals)
 * with which of their array leaves were differentiated, the residual
 * and output trees (structures; the residuals' values come back as the
 * equation's operands) and the outputs' avals. */
typedef struct CustomLin {
  Opaque base;
  Custom *c;
  Value *nd, *args, *res, *out;
  bool *diff;        /* per array leaf of args: its tangent is an operand */
  int nres;          /* residual leaves: the first operands */
  int nout;          /* output array leaves */
  AVal *out_avals;
  bool *out_float;   /* an output leaf with a tangent: a result of the equation */
} CustomLin;

static void lin_free(Value *v) {
  CustomLin *l = (CustomLin *)v;
  Value *held[] = {l->c ? &l->c->base.hdr : NULL, l->nd, l->args, l->res, l->out};
  for (size_t i = 0; i < 5; i++)
    if (held[i]) val_decref(held[i]);
  shm_free(l->diff);
  shm_free(l->out_avals);
  shm_free(l->out_float);
}

static const OpaqueType lin_type = {.name = "custom_lin", .free = lin_free};

/* The tangents of the differentiated array leaves of the differentiable
 * arguments (a->args) for trace [id], flagged in l->diff: the
 * equation's linear operands, into ops[*n...].  0 or -1. */
static int lin_tangents(CustomLin *l, const CallArgs *a, unsigned id, Value **ops, int *n) {
  PyLeaves al = {0};
  int leaf = 0, rc = 0;
  for (int i = 0; rc == 0 && i < a->nargs; i++) {
    if (is_nondiff(l->c, i)) continue;
    if ((rc = pytree_flatten(a->args[i], array_leaf, &al)) < 0) break;
    bool *d = shm_realloc(l->diff, sizeof(bool) * (size_t)(leaf + al.n + 1));
    if (!d) rc = (err_nomem(), -1);
    else l->diff = d;
    for (int k = 0; rc == 0 && k < al.n; k++, leaf++) {
      Value *v = al.v[k];
      l->diff[leaf] = IS_JVP_TRACER(v) && ((Tracer *)v)->trace_id == id;
      if (l->diff[leaf]) ops[(*n)++] = ((Tracer *)v)->tangent;
    }
    pytree_leaves_free(&al);
  }
  return rc;
}

/* The output leaves' avals, which have tangents (float), into l. */
static int lin_outputs(CustomLin *l, PyLeaves *ol) {
  if (pytree_flatten(l->out, array_leaf, ol) < 0) return -1;
  l->nout = ol->n;
  l->out_avals = shm_calloc((size_t)ol->n + 1, sizeof(AVal));
  l->out_float = shm_calloc((size_t)ol->n + 1, sizeof(bool));
  if (!l->out_avals || !l->out_float) return err_nomem(), -1;
  for (int k = 0; k < ol->n; k++) {
    if (ops_aval(ol->v[k], &l->out_avals[k]) < 0) return -1;
    l->out_float[k] = dt_is_float(l->out_avals[k].dtype);
  }
  return 0;
}

/* Records custom_lin[bwd=l] over (residual leaves, differentiated
 * tangents) and returns l->out whose float leaves carry its results as
 * tangents of trace [id]. */
static Value *lin_emit(CustomLin *l, const CallArgs *a, unsigned id) {
  PyLeaves rl = {0}, ol = {0}, al = {0};
  Value **ops = NULL, **vals = NULL, *tup = NULL, *r = NULL;
  AVal *avs = NULL;
  int n = 0, nf = 0, nleaves = 0;
  if (pytree_flatten(l->res, array_leaf, &rl) < 0 || lin_outputs(l, &ol) < 0 ||
      pytree_flatten(l->args, array_leaf, &al) < 0)
    goto out;
  l->nres = rl.n;
  nleaves = al.n;
  ops = shm_calloc((size_t)(rl.n + nleaves) + 1, sizeof(Value *));
  avs = shm_calloc((size_t)ol.n + 1, sizeof(AVal));
  vals = shm_calloc((size_t)ol.n + 1, sizeof(Value *));
  if (!ops || !avs || !vals) {
    err_nomem();
    goto out;
  }
  shm_memcpy(ops, rl.v, sizeof(Value *) * (size_t)rl.n);
  n = rl.n;
  if (lin_tangents(l, a, id, ops, &n) < 0) goto out;
  for (int k = 0; k < ol.n; k++)
    if (l->out_float[k]) avs[nf++] = l->out_avals[k];
  if (n > rl.n && nf) {
    Params p;
    params_init(&p);
    params_add(&p, "bwd", val_incref(&l->base.hdr));
    if (!(tup = trace_emit(P_CUSTOM_LIN, &p, n, ops, nf, avs))) goto out;
  }
  for (int k = 0, m = 0; k < ol.n; k++) {
    bool t = tup && l->out_float[k];
    vals[k] = t ? ad_jvp_tracer(id, val_incref(ol.v[k]), val_incref(tuple_get(tup, (size_t)m++)))
                : val_incref(ol.v[k]);
    if (!vals[k]) {
      ad_values_free_n(vals, k);
      goto out;
    }
  }
  int pos = 0;
  r = pytree_replace(l->out, array_leaf, vals, &pos);
  ad_values_free_n(vals, ol.n);
out:
  shm_free(vals);
  shm_free(ops);
  shm_free(avs);
  if (tup) val_decref(tup);
  pytree_leaves_free(&rl);
  pytree_leaves_free(&ol);
  pytree_leaves_free(&al);
  return r;
}

/* custom_vjp_call's jvp_call: fwd on the primals, and one custom_lin
 * from the differentiated leaves' tangents to the float outputs'.
 * Forward mode has no transpose to run bwd: JAX's TypeError. */
static Value *jvp_call_vjp(Value *self, const CallArgs *a) {
  Custom *c = (Custom *)self;
  JvpTrace *j = args_jvp(c, a);
  if (!j) return NULL;
  if (!j->lin) return err_set(ERR_TYPE, "can't apply forward-mode autodiff (jvp) to a custom_vjp function.");
  CustomLin *l = shm_calloc(1, sizeof *l);
  Value **prims = shm_calloc((size_t)a->nargs + 1, sizeof(Value *)), *fr = NULL, *out, *res, *r = NULL;
  if (!l || !prims) {
    shm_free(l);
    shm_free(prims);
    return err_nomem();
  }
  val_init(&l->base.hdr, V_OPAQUE);
  l->base.ot = &lin_type;
  l->c = (Custom *)val_incref(self);
  if (!(l->nd = strip_args(c, a, j->id, true)) || !(l->args = strip_args(c, a, j->id, false)))
    goto out;
  for (int i = 0; i < a->nargs; i++) {
    bool wrap = c->symbolic_zeros && !is_nondiff(c, i);
    prims[i] = wrap ? pytree_map(a->args[i], array_leaf, vjp_primal_leaf, &j->id) : ad_strip(a->args[i], j->id);
    if (!prims[i]) goto out;
  }
  fr = val_call_n(c->fwd, a->nargs, prims);
  if (!fr || pair_of(fr, &out, &res, "VJP fwd", c->rule_names[0],
                     "primal outputs and residuals (values stored from the forward pass for use "
                     "on the backward pass)") < 0)
    goto out;
  if (differentiated(out, j->id)) {
    err_set(ERR_TYPE, "Detected differentiation of a custom_vjp function with respect to a "
                      "closed-over value. That isn't supported because the custom VJP rule only "
                      "specifies how to differentiate the custom_vjp function with respect to "
                      "explicit input parameters. Try passing the closed-over value into the "
                      "custom_vjp function as an argument, and adapting the custom_vjp fwd and "
                      "bwd rules.");
    goto out;
  }
  if ((l->out = ad_strip(out, j->id)) && (l->res = ad_strip(res, j->id))) r = lin_emit(l, a, j->id);
out:
  ad_values_free(prims, a->nargs);
  if (fr) val_decref(fr);
  val_decref(&l->base.hdr);
  return r;
}

/* ---- custom_lin's transpose: bwd(*nondiff, residuals, cotangents) ---------------- */

/* The cotangent tree of the outputs: each float output's from [ct]
 * (NULL: zeros), the others zeros; zeros are SymbolicZeros under
 * symbolic_zeros=True. */
static Value *out_cotangents(CustomLin *l, Value **ct) {
  Value **vals = shm_calloc((size_t)l->nout + 1, sizeof(Value *)), *r = NULL;
  int k = 0;
  if (!vals) return err_nomem();
  for (int m = 0; k < l->nout; k++) {
    Value *c = l->out_float[k] ? ct[m++] : NULL;
    AVal av = l->out_avals[k];
    if (!(vals[k] = c ? val_incref(c) : l->c->symbolic_zeros ? symzero_new(&av) : prim_zeros(&av))) break;
  }
  int pos = 0;
  if (k == l->nout) r = pytree_replace(l->out, array_leaf, vals, &pos);
  ad_values_free(vals, k);
  return r;
}

static int bwd_structure_error(Value *got, Value *want) {
  Value *g = pytree_structure_repr(got), *w = g ? pytree_structure_repr(want) : NULL;
  if (w)
    err_set(ERR_TYPE, "Custom VJP bwd rule must produce an output with the same container (pytree) "
                      "structure as the args tuple of the primal function, and in particular must "
                      "produce a tuple of length equal to the number of arguments to the primal "
                      "function, but got bwd output structure %s for primal input structure %s.",
            str_cstr(g), str_cstr(w));
  if (g) val_decref(g);
  if (w) val_decref(w);
  return -1;
}

/* Checks cotangent [g] against primal leaf [x]: the same shape. */
static int check_ct_leaf(Value *g, Value *x, int arg) {
  AVal ga, xa;
  if (ops_aval(g, &ga) < 0 || ops_aval(x, &xa) < 0) return -1;
  if (ga.ndim == xa.ndim && !memcmp(ga.shape, xa.shape, sizeof(int64_t) * (size_t)xa.ndim)) return 0;
  char s1[128], s2[128];
  aval_str(s1, sizeof s1, ga.dtype, ga.ndim, ga.shape);
  aval_str(s2, sizeof s2, xa.dtype, xa.ndim, xa.shape);
  err_set(ERR_VALUE, "Custom VJP bwd rule must produce an output with the same shape/dtypes as the "
                     "args tuple of the primal function, but at output[%d] the bwd rule produced an "
                     "output of shape/dtype %s corresponding to an input of shape/dtype %s", arg, s1, s2);
  return -1;
}

/* Where bwd's output and the primal arguments' structures part. */
#define CT_MISMATCH (-2)

/* The zero cotangents (NULL) of the differentiated leaves of [x]. */
static int ct_zeros(CustomLin *l, Value *x, Value **cts, int *n, int *leaf) {
  PyLeaves xl = {0};
  if (pytree_flatten(x, array_leaf, &xl) < 0) return -1;
  for (int k = 0; k < xl.n; k++, (*leaf)++)
    if (l->diff[*leaf]) cts[(*n)++] = NULL;
  pytree_leaves_free(&xl);
  return 0;
}

/* A SymbolicZero [g] that bwd gave for primal leaf [x]: a zero
 * cotangent, of [x]'s shape, else JAX's ValueError. */
static int symzero_ct(CustomLin *l, Value *x, Value *g, int arg, Value **cts, int *n, int *leaf) {
  AVal xa;
  const AVal *ga = &((SymZero *)g)->av;
  if (ops_aval(x, &xa) < 0) return -1;
  if (ga->ndim != xa.ndim || memcmp(ga->shape, xa.shape, sizeof(int64_t) * (size_t)xa.ndim)) {
    char s1[128], s2[128];
    aval_str(s1, sizeof s1, ga->dtype, ga->ndim, ga->shape);
    aval_str(s2, sizeof s2, xa.dtype, xa.ndim, xa.shape);
    err_set(ERR_VALUE, "Custom VJP bwd rule produced a SymbolicZero with a shape/dtype that does not "
                       "match the corresponding input tangent shape/dtype: at output[%d] the "
                       "SymbolicZero had shape/dtype %s while the corresponding input had "
                       "shape/dtype %s. Consider just returning a None here instead of a "
                       "SymbolicZero object.", arg, s1, s2);
    return -1;
  }
  if (l->diff[(*leaf)++]) cts[(*n)++] = NULL;
  return 0;
}

/* The cotangents of the differentiated leaves of primal [x] from bwd's
 * [g] (its structure; None for any subtree: zeros, as JAX allows) into
 * cts[*n...]; [*leaf] walks l->diff.  0, -1 with the error set, or
 * CT_MISMATCH. */
static int ct_walk(CustomLin *l, Value *x, Value *g, int arg, Value **cts, int *n, int *leaf,
                   int depth) {
  if (depth > 64) return err_set(ERR_VALUE, "custom_vjp: cotangents nested too deeply"), -1;
  if (g == VAL_NONE && x != VAL_NONE) return ct_zeros(l, x, cts, n, leaf);
  if (array_leaf(x) && is_symzero(g)) return symzero_ct(l, x, g, arg, cts, n, leaf);
  if (array_leaf(x)) {
    if (!array_leaf(g)) return CT_MISMATCH;
    bool d = l->diff[(*leaf)++];
    if (d && check_ct_leaf(g, x, arg) < 0) return -1;
    if (d) cts[(*n)++] = val_incref(g);
    return 0;
  }
  size_t nx, ng;
  Value *const *ix, *const *ig;
  if ((x->type == V_TUPLE || x->type == V_LIST) && g->type == x->type && val_seq(x, &nx, &ix) &&
      val_seq(g, &ng, &ig)) {
    if (nx != ng) return CT_MISMATCH;
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < nx; i++) rc = ct_walk(l, ix[i], ig[i], arg, cts, n, leaf, depth + 1);
    return rc;
  }
  if (x->type == V_DICT && g->type == V_DICT) {
    Dict *dx = (Dict *)x, *dg = (Dict *)g;
    if (dx->len != dg->len) return CT_MISMATCH;
    size_t *ox = pytree_key_order(x), *og = ox ? pytree_key_order(g) : NULL;
    int rc = og ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < dx->len; i++)
      rc = !val_equal_key(dx->keys[ox[i]], dg->keys[og[i]]) ? CT_MISMATCH
           : ct_walk(l, dx->vals[ox[i]], dg->vals[og[i]], arg, cts, n, leaf, depth + 1);
    shm_free(ox);
    shm_free(og);
    return rc;
  }
  int same = pytree_same_structure(x, g);   /* a custom node, a static leaf */
  if (same <= 0) return same < 0 ? -1 : CT_MISMATCH;
  PyLeaves gl = {0};
  if (pytree_flatten(g, array_leaf, &gl) < 0) return -1;
  PyLeaves xl = {0};
  int rc = pytree_flatten(x, array_leaf, &xl);
  if (rc == 0 && xl.n != gl.n) rc = CT_MISMATCH;
  for (int k = 0; rc == 0 && k < xl.n; k++) rc = ct_walk(l, xl.v[k], gl.v[k], arg, cts, n, leaf, depth + 1);
  pytree_leaves_free(&xl);
  pytree_leaves_free(&gl);
  return rc;
}

static int transpose_custom_lin(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                                const Params *p, Value **cts) {
  (void)av, (void)lin;
  Value *lv = params_get(p, "bwd");
  if (!lv || lv->type != V_OPAQUE || ((Opaque *)lv)->ot != &lin_type)
    return prim_rule_missing(P_CUSTOM_LIN, "transpose of a staged custom_lin");
  CustomLin *l = (CustomLin *)lv;
  for (int k = 0; k < nin; k++) cts[k] = NULL;
  int pos = 0, n = l->nres, leaf = 0, rc = -1;
  for (int k = 0; k < l->nres; k++)
    if (!in[k]) return err_set(ERR_VALUE, "custom_lin: a residual is being differentiated"), -1;
  Value *res = pytree_replace(l->res, array_leaf, in, &pos);
  Value *g = res ? out_cotangents(l, ct) : NULL;
  Value *r = g ? call_with(l->c->bwd, l->nd, 2, (Value *[]){res, g}) : NULL;
  size_t nr;
  Value *const *items;
  if (r && (!val_seq(r, &nr, &items) || nr != tuple_len(l->args))) bwd_structure_error(r, l->args);
  else if (r) {
    rc = 0;
    for (size_t i = 0; rc == 0 && i < nr; i++)
      rc = ct_walk(l, tuple_get(l->args, i), items[i], (int)i, cts, &n, &leaf, 0);
    if (rc == CT_MISMATCH) rc = bwd_structure_error(r, l->args);
  }
  if (rc < 0) ad_values_free_n(cts, nin);
  if (rc < 0)
    for (int k = 0; k < nin; k++) cts[k] = NULL;
  Value *held[] = {res, g, r};
  for (size_t i = 0; i < 3; i++)
    if (held[i]) val_decref(held[i]);
  return rc;
}

/* ==== vmap: the custom function of the vmapped fun and rules ========================= */

typedef struct Unwrap {
  unsigned id;
  int64_t size;
} Unwrap;

static Value *unwrap_leaf(Value *v, void *vctx) {
  Unwrap *u = vctx;
  return batch_unwrap_front(u->id, v, u->size);
}

static Value *wrap_leaf(Value *v, void *id) { return batch_wrap(*(unsigned *)id, v, 0); }

/* The in_axes of a rule of a call with [n] arguments: 0 for each but a
 * nondiff argument's, which is None unless [batched] says it is batched
 * (a custom_jvp's may be, as JAX lets a nondiff argument vary).  With
 * [extra] >= 0 the rule takes the nondiff arguments first, then [extra]
 * more (bwd: residuals and cotangents; jvp: primals and tangents); with
 * -1 it takes the call's arguments in place (fun, fwd). */
static Value *rule_axes(Custom *c, int n, int extra, const bool *batched) {
  int nnd = 0;
  for (int i = 0; i < n; i++) nnd += is_nondiff(c, i);
  Value *t = tuple_new((size_t)(extra < 0 ? n : nnd + extra));
  for (int i = 0, k = 0; t && i < n; i++) {
    bool nd = is_nondiff(c, i);
    if (extra >= 0 && !nd) continue;
    tuple_set_steal(t, (size_t)(extra < 0 ? i : k++), nd && !batched[i] ? val_incref(VAL_NONE) : val_int(0));
  }
  for (int i = 0; t && i < extra; i++) tuple_set_steal(t, (size_t)(nnd + i), val_int(0));
  return t;
}

/* ---- vmap of the rules under symbolic_zeros ------------------------------------- */

/* The state tuple [st]'s item [i]. */
static Value *st_get(Value *st, size_t i) { return tuple_get(st, i); }

/* What the batched fwd's vmap calls, state (fwd, args): each argument
 * whose leaves in args were CustomVJPPrimals gets them back around the
 * values it receives (one example's), each with its perturbed bit. */
static Value *rewrap_fwd(Value *st, const CallArgs *a) {
  Value *tmpl = st_get(st, 1), **args = shm_calloc((size_t)a->nargs + 1, sizeof(Value *)), *r = NULL;
  int i = 0;
  for (; args && i < a->nargs; i++) {
    PyLeaves pl = {0}, vl = {0};
    Value *t = tuple_get(tmpl, (size_t)i), **wrapped = NULL;
    int rc = pytree_flatten(t, is_vjp_primal, &pl);
    if (rc == 0 && pl.n == 0) args[i] = val_incref(a->args[i]);
    else if (rc == 0 && (rc = pytree_flatten(a->args[i], array_leaf, &vl)) == 0 && vl.n == pl.n &&
             (wrapped = shm_calloc((size_t)pl.n + 1, sizeof(Value *)))) {
      int k = 0, pos = 0;
      for (; k < pl.n; k++)
        if (!(wrapped[k] = vjp_primal_new(vl.v[k], ((VjpPrimal *)pl.v[k])->perturbed))) break;
      if (k == pl.n) args[i] = pytree_replace(t, is_vjp_primal, wrapped, &pos);
      ad_values_free(wrapped, k);
    } else if (rc == 0) {
      err_set(ERR_VALUE, "custom_vjp: the batched fwd's arguments lost their structure");
    }
    pytree_leaves_free(&pl);
    pytree_leaves_free(&vl);
    if (!args[i]) break;
  }
  if (!args) err_nomem();
  else if (i == a->nargs) r = val_call_n(st_get(st, 0), a->nargs, args);
  ad_values_free(args, i);
  return r;
}

/* fwd of a vmapped custom_vjp function with symbolic_zeros, state (fwd,
 * in_axes, batch trace id): the vmap of fwd over the CustomVJPPrimals'
 * values, fwd seeing one example's values in CustomVJPPrimals again. */
static Value *batched_fwd(Value *st, const CallArgs *a) {
  Value *tmpl = tuple_pack((size_t)a->nargs, a->args), **vals = shm_calloc((size_t)a->nargs + 1, sizeof(Value *));
  Value *state = tmpl ? tuple_pack(2, (Value *[]){st_get(st, 0), tmpl}) : NULL, *r = NULL;
  Value *inner = state ? bound_new("fwd", rewrap_fwd, state) : NULL, *vf = NULL;
  int64_t id;
  int i = 0;
  for (; vals && inner && i < a->nargs; i++)
    if (!(vals[i] = pytree_map(a->args[i], is_vjp_primal, unwrap_primal_leaf, NULL))) break;
  if (vals && inner && i == a->nargs && arr_to_index(st_get(st, 2), &id) == 0 &&
      (vf = batch_vmap_of((unsigned)id, inner, st_get(st, 1))))
    r = val_call_n(vf, a->nargs, vals);
  if (!vals) err_nomem();
  ad_values_free(vals, i);
  Value *held[] = {tmpl, state, inner, vf};
  for (size_t k = 0; k < 4; k++) val_decref(held[k]);
  return r;
}

/* bwd or jvp of a vmapped custom function with symbolic_zeros, state
 * (the vmapped rule, the batch size): SymbolicZeros going in lose the
 * batch axis (the rule sees one example's), those coming out get it. */
static Value *batched_zero_rule(Value *st, const CallArgs *a) {
  Value **args = shm_calloc((size_t)a->nargs + 1, sizeof(Value *)), *r = NULL, *out = NULL;
  int64_t size, none = 0;
  int i = 0;
  if (arr_to_index(st_get(st, 1), &size) < 0) size = -1;
  for (; args && size >= 0 && i < a->nargs; i++)
    if (!(args[i] = pytree_map(a->args[i], is_symzero, symzero_batched, &none))) break;
  if (args && i == a->nargs && (r = val_call_n(st_get(st, 0), a->nargs, args)))
    out = pytree_map(r, is_symzero, symzero_batched, &size);
  if (!args) err_nomem();
  ad_values_free(args, i);
  val_decref(r);
  return out;
}

/* [*slot] (a vmapped rule, replaced) wrapped by [fn] with state (rule,
 * [extra]) (stolen).  0 or -1. */
static int wrap_rule(Value **slot, MethodFn fn, Value *extra, const char *name) {
  Value *st = extra && *slot ? tuple_pack(2, (Value *[]){*slot, extra}) : NULL;
  Value *w = st ? bound_new(name, fn, st) : NULL;
  val_decref(extra);
  val_decref(st);
  if (!*slot) return 0;
  val_decref(*slot);
  *slot = w;
  return w ? 0 : -1;
}

/* vmap of [f] over batch trace [id] with [axes] (stolen): into *slot. */
static int vmapped(unsigned id, Value *f, Value *axes, Value **slot) {
  *slot = f && axes ? batch_vmap_of(id, f, axes) : NULL;
  if (axes) val_decref(axes);
  return !f || *slot ? 0 : -1;
}

/* The custom function of vmap(fun) and vmap of its rules, every
 * differentiable argument batched on axis 0, and the nondiff ones that
 * [batched] says. */
static Custom *batched_custom(Custom *c, unsigned id, int nargs, const bool *batched) {
  Custom *b = custom_new(c->base.ot, c->fun, c->nondiff);
  if (!b) return NULL;
  memcpy(b->rule_names, c->rule_names, sizeof b->rule_names);
  int rc;
  val_decref(b->fun);
  b->symbolic_zeros = c->symbolic_zeros;
  rc = vmapped(id, c->fun, rule_axes(c, nargs, -1, batched), &b->fun);
  if (rc == 0 && c->fwd && c->symbolic_zeros) {   /* fwd takes CustomVJPPrimals: vmapped inside */
    Value *axes = rule_axes(c, nargs, -1, batched), *idv = axes ? val_int(id) : NULL;
    Value *st = idv ? tuple_pack(3, (Value *[]){c->fwd, axes, idv}) : NULL;
    if (!(b->fwd = st ? bound_new("fwd", batched_fwd, st) : NULL)) rc = -1;
    val_decref(axes);
    val_decref(idv);
    val_decref(st);
  } else if (rc == 0) {
    rc = vmapped(id, c->fwd, rule_axes(c, nargs, -1, batched), &b->fwd);
  }
  if (rc == 0) rc = vmapped(id, c->bwd, rule_axes(c, nargs, 2, batched), &b->bwd);
  if (rc == 0) rc = vmapped(id, c->jvp, rule_axes(c, nargs, 2, batched), &b->jvp);
  if (rc == 0 && c->symbolic_zeros) {
    int64_t size = batch_trace_size(id);
    rc = wrap_rule(&b->bwd, batched_zero_rule, val_int(size), "bwd");
    if (rc == 0) rc = wrap_rule(&b->jvp, batched_zero_rule, val_int(size), "jvp");
  }
  if (rc == 0 && c->jvps) {
    b->jvps = tuple_new(tuple_len(c->jvps));
    for (size_t i = 0; b->jvps && i < tuple_len(c->jvps); i++) {
      Value *f = tuple_get(c->jvps, i), *v = NULL;
      if (f != VAL_NONE && vmapped(id, f, val_int(0), &v) < 0) rc = -1;
      tuple_set_steal(b->jvps, i, v ? v : val_incref(VAL_NONE));
    }
    if (!b->jvps) rc = -1;
  }
  if (rc == 0) return b;
  val_decref(&b->base.hdr);
  return NULL;
}

/* The batch_call of both rows: the batched custom function on the
 * arguments unbatched to a leading axis; its results batched on it.  A
 * custom_jvp's batched nondiff argument is unbatched too and its rules
 * vmapped over it (JAX closes fun and the rule over it); a custom_vjp's
 * is refused before (check_nondiff), as JAX refuses any tracer there. */
static Value *batch_call_custom(Value *self, const CallArgs *a) {
  Custom *c = (Custom *)self;
  Tracer *top;
  if (top_tracer(c, a, &top) < 0) return NULL;
  Unwrap u = {top->trace_id, batch_trace_size(top->trace_id)};
  Value **args = shm_calloc((size_t)a->nargs + 1, sizeof(Value *)), *r = NULL;
  bool *batched = shm_calloc((size_t)a->nargs + 1, sizeof(bool));
  int i = 0;
  for (; args && batched && i < a->nargs; i++) {
    bool nd = is_nondiff(c, i);
    batched[i] = !nd || batch_carries(a->args[i], u.id);
    if (!(args[i] = !batched[i] ? val_incref(a->args[i]) : pytree_map(a->args[i], array_leaf, unwrap_leaf, &u)))
      break;
  }
  Custom *b = args && batched && i == a->nargs ? batched_custom(c, u.id, a->nargs, batched) : NULL;
  Value *res = b ? val_call_n(&b->base.hdr, a->nargs, args) : NULL;
  if (res) r = pytree_map(res, array_leaf, wrap_leaf, &u.id);
  if (!args || !batched) err_nomem();
  ad_values_free(args, i);
  shm_free(batched);
  if (b) val_decref(&b->base.hdr);
  if (res) val_decref(res);
  return r;
}

/* ==== the rows ======================================================================= */

static const HigherRules jvp_call_rules = {
    .prepare = prepare_call,
    .run = run_call,
    .eval = eval_call,
    .eval_tuple = true,
    .lowerable = lowerable_call,
    .jvp_call = jvp_call_jvp,
    .batch_call = batch_call_custom,
};

static const HigherRules vjp_call_rules = {
    .prepare = prepare_call,
    .run = run_call,
    .eval = eval_call,
    .eval_tuple = true,
    .lowerable = lowerable_call,
    .jvp_call = jvp_call_vjp,
    .batch_call = batch_call_custom,
};

/* custom_lin exists only in the linear plans of reverse mode */
static const HigherRules lin_rules = {0};

void custom_register_rules(void) {
  higher_register(P_CUSTOM_JVP_CALL, &jvp_call_rules);
  higher_register(P_CUSTOM_VJP_CALL, &vjp_call_rules);
  PrimRules lr = {.transpose = transpose_custom_lin, .higher = &lin_rules};
  prim_register(P_CUSTOM_LIN, &lr);
}

/* jax.custom_derivatives' SymbolicZero, CustomVJPPrimal (their classes,
 * for isinstance), zero_from_primal and custom_vjp_primal_tree_values. */
static int custom_register_zeros(void) {
  static const struct { const char *name; BuiltinFn fn; const char *doc; } fns[] = {
      {"zero_from_primal", bi_zero_from_primal,
       "zero_from_primal(val, symbolic_zeros=False): the zero tangent of each leaf"},
      {"custom_vjp_primal_tree_values", bi_primal_tree_values,
       "custom_vjp_primal_tree_values(tree): the values of fwd's CustomVJPPrimal leaves"},
  };
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
    Value *v = builtin_new(fns[i].name, fns[i].fn, fns[i].doc);
    int rc = v ? builtins_add_to("jax.custom_derivatives", fns[i].name, v) : -1;
    val_decref(v);
    if (rc < 0) return -1;
  }
  const char *classes[] = {"SymbolicZero", "CustomVJPPrimal"};
  for (size_t i = 0; i < 2; i++) {
    Value *cls = builtins_opaque_class(classes[i]);
    if (!cls || builtins_add_to("jax.custom_derivatives", classes[i], cls) < 0) return -1;
  }
  return 0;
}

int custom_register(Env *builtins) {
  (void)builtins;
  if (eval_register_opaque_call(&vjp_type, custom_call) < 0 ||
      eval_register_opaque_call(&jvp_type, custom_call) < 0)
    return -1;
  custom_register_rules();
  static const struct { const char *name; BuiltinFn fn; const char *doc; } fns[] = {
      {"custom_vjp", bi_custom_vjp, "custom_vjp(fun, nondiff_argnums=()): f.defvjp(fwd, bwd)"},
      {"custom_jvp", bi_custom_jvp, "custom_jvp(fun, nondiff_argnums=()): f.defjvp(jvp)"},
      {"custom_gradient", bi_custom_gradient, "custom_gradient(fun): fun returns (out, vjp_fn)"},
  };
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
    Value *v = builtin_new(fns[i].name, fns[i].fn, fns[i].doc);
    int rc = v ? builtins_add_to("jax", fns[i].name, v) : -1;
    if (rc == 0) rc = builtins_add_to("jax.custom_derivatives", fns[i].name, v);
    if (v) val_decref(v);
    if (rc < 0) return -1;
  }
  return custom_register_zeros();
}
