/*
 * hostnp.c - the `numpy` module: host NumPy beside jax.numpy (hostnp.h).
 *
 * Most of its functions are jax.numpy's, called after NumPy's defaults
 * are applied to the arguments: a Python number or a list of them
 * becomes an array as np.asarray makes it (float64, int64, bool), an
 * integer array given to a function whose result is inexact (sqrt, mean)
 * is first float64 (NumPy's, where jax.numpy would make float32), and a
 * `dtype=float` or `dtype=int` means float64 or int64.  Arrays of
 * NumPy's dtypes then compute as shmap's 64-bit arrays do, which are
 * NumPy's results for these functions.  Constructors default to float64
 * (zeros, ones, eye, linspace) or to the dtype of their numbers (array,
 * arange, full).  The names follow numpy's own; numpy.random is in
 * hostnp_random.c, the in-place writes in hostnp_write.c.  Each function
 * runs its jax.numpy function under NumPy's mode (array.h, "Host NumPy
 * arrays"), so its results are host arrays that the program may write.
 */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/builtins_impl.h"
#include "lang/eval.h"
#include "lang/hostnp.h"
#include "lang/ops.h"

static Value *ns_np, *ns_random, *ns_testing;

static int make_modules(void);

/* The modules are made at the first import of one of them, so a script
 * that imports none pays nothing for them; the lock makes that once. */
static pthread_mutex_t make_lock = PTHREAD_MUTEX_INITIALIZER;

Value *hostnp_namespace(const char *name) {
  Value *const *which = !strcmp(name, "numpy") ? &ns_np : !strcmp(name, "numpy.random") ? &ns_random
                      : !strcmp(name, "numpy.testing") ? &ns_testing : NULL;
  if (!which) return NULL;
  pthread_mutex_lock(&make_lock);
  Value *m = ns_np || make_modules() == 0 ? *which : NULL;
  pthread_mutex_unlock(&make_lock);
  return m;
}

int hostnp_dtype_arg(Value *v, int *out) {
  if (v && v->type == V_BUILTIN) {
    const char *n = ((Builtin *)v)->name;
    if (!strcmp(n, "int")) return *out = DT_I64, 0;
    if (!strcmp(n, "float")) return *out = DT_F64, 0;
  }
  return ops_dtype_arg(v, out);
}

/* ---- NumPy's dtypes of Python values --------------------------------------------- */

/* The dtype np.asarray gives the Python numbers of [x] (nested lists and
 * tuples): float64 if any is a float, else int64 if any is an int, else
 * bool; -1 when [x] holds anything else (arrays: jax.numpy's promotion
 * among arrays is NumPy's). */
static int python_dtype(Value *x) {
  if (arr_is_host(x)) {
    DType t = AS_ARRAY(x)->dtype;
    return t == DT_BOOL ? DT_BOOL : dt_is_float(t) ? DT_F64 : DT_I64;
  }
  if (x->type != V_LIST && x->type != V_TUPLE) return -1;
  size_t n;
  Value *const *items;
  val_seq(x, &n, &items);
  int t = DT_BOOL;
  for (size_t i = 0; i < n; i++) {
    int e = python_dtype(items[i]);
    if (e < 0) return -1;
    if (e == DT_F64 || (e == DT_I64 && t == DT_BOOL)) t = e;
  }
  return t;
}

static Value *jnp_fn(const char *name) {
  return dict_get_str(((Module *)builtins_namespace("jnp"))->globals, name);
}

/* [x] (borrowed) converted with jnp.asarray to dtype [t]. */
static Value *convert(Value *x, int t) {
  Value *kv = dtype_value((DType)t);
  const char *kn = "dtype";
  CallArgs c = {1, &x, 1, &kn, &kv};
  return val_call(jnp_fn("asarray"), &c);
}

/* An argument as NumPy's functions take it: None and non-numbers as they
 * are, Python numbers and their lists as np.asarray makes them, jax
 * Arrays unsharded; with
 * [inexact], integer and bool arrays as float64. */
static Value *np_operand(Value *x, bool inexact) {
  if (IS_ARRAY(x) && (AS_ARRAY(x)->sharding || AS_ARRAY(x)->device1)) {
    /* a jax Array is read as np.asarray reads it: its global value on
     * the host, whatever its layout or device (mixed layouts, Explicit
     * types, are then no error) */
    Array *a = AS_ARRAY(x);
    if (a->buf->part && arr_make_whole(a) < 0) return NULL;
    Array *v = arr_view(a, a->ndim, a->shape, a->strides, a->offset);
    if (!v) return NULL;
    v->device1 = 0;
    Value *r = np_operand(&v->hdr, inexact);
    val_decref(&v->hdr);
    return r;
  }
  int t = python_dtype(x);
  if (t >= 0) return convert(x, inexact ? DT_F64 : t);
  if (inexact && (x->type == V_ARRAY || x->type == V_TRACER) && !dt_is_float(bi_aval(x).dtype))
    return convert(x, DT_F64);
  return val_incref(x);
}

Value *hostnp_operand(Value *x) { return np_operand(x, false); }

/* ---- delegation to jax.numpy ------------------------------------------------------- */

/* The jax.numpy function [f] called under NumPy's mode (array.h, "Host
 * NumPy arrays"): its views of NumPy arrays stay views, its other
 * results are NumPy arrays with buffers of their own. */
static Value *host_call_fn(Value *f, const CallArgs *c) {
  ArrNpMode saved = arr_np_mode;
  arr_np_mode = ARR_NP_HOST;
  Value *r = f->type == V_BUILTIN ? ((Builtin *)f)->fn(c) : val_call(f, c);
  arr_np_mode = saved;
  return hostnp_mark(r);
}

/* Calls the jax.numpy function [f] with [a]'s arguments, the first [nconv]
 * positional ones made NumPy operands, a builtin int or float anywhere
 * made int64 or float64, and `dtype=[dflt]` added when no dtype is given
 * (dflt -1: none added). */
static Value *delegate(Value *f, const CallArgs *a, int nconv, bool inexact, int dflt) {
  int n = a->nargs, nk = a->nkw;
  Value **args = shm_calloc((size_t)(n + nk + 1), sizeof *args);
  const char **kn = shm_calloc((size_t)nk + 1, sizeof *kn);
  Value *res = NULL;
  if (!args || !kn) {
    shm_free(args);
    shm_free(kn);
    return err_nomem();
  }
  bool has_dtype = false;
  int made = 0;
  for (; made < n + nk; made++) {
    Value *v = made < n ? a->args[made] : a->kwvals[made - n];
    int t;
    if (made >= n) kn[made - n] = a->kwnames[made - n];
    bool type_arg = v->type == V_BUILTIN && ((Builtin *)v)->is_class;   /* int, float, bool */
    if (v->type == V_DTYPE || type_arg || (made >= n && !strcmp(kn[made - n], "dtype"))) has_dtype = true;
    if (v->type == V_BUILTIN && (!strcmp(((Builtin *)v)->name, "int") || !strcmp(((Builtin *)v)->name, "float"))) {
      if (hostnp_dtype_arg(v, &t) < 0) goto done;
      args[made] = val_incref(dtype_value((DType)t));
      has_dtype = true;
    } else {
      args[made] = made < nconv ? np_operand(v, inexact) : val_incref(v);
    }
    if (!args[made]) goto done;
  }
  if (!has_dtype && dflt >= 0) {
    kn[nk] = "dtype";
    args[made++] = val_incref(dtype_value((DType)dflt));
    nk++;
  }
  CallArgs c = {n, args, nk, kn, args + n};
  res = host_call_fn(f, &c);
done:
  for (int i = 0; i < made; i++) val_decref(args[i]);
  shm_free(args);
  shm_free(kn);
  return res;
}

/* NumPy's dtype for the numbers among the first [n] positional arguments
 * of a constructor (arange, full): float64 if any is a float, else int64;
 * -1 when an array decides it. */
static int numbers_dtype(const CallArgs *a, int first, int n) {
  int t = DT_I64;
  for (int i = first; i < a->nargs && i < first + n; i++) {
    Value *v = a->args[i];
    if (bi_is_none(v)) continue;
    int e = python_dtype(v);
    if (e < 0) return -1;
    if (e == DT_F64) t = DT_F64;
  }
  return t;
}

#define DELEGATE(fname, nconv, inexact)                                     \
  static Value *fname(Value *self, const CallArgs *a) { return delegate(self, a, nconv, inexact, -1); }
DELEGATE(conv0, 0, false)
DELEGATE(conv1, 1, false)
DELEGATE(conv2, 2, false)
DELEGATE(conv3, 3, false)
DELEGATE(inexact1, 1, true)
DELEGATE(inexact2, 2, true)

/* ---- 0-d arrays and read-only results ---------------------------------------------- */

/* [r] (stolen: a function's result) as a NumPy array whose buffer no
 * other value holds (a copy when one might: an argument's buffer, or
 * jax's shared zeros), so a mark set on the buffer reaches r and its
 * later views only.  Other values are returned as they are. */
static Value *own_buffer(Value *r) {
  if (!r || !arr_is_np(r) || arr_unshared(AS_ARRAY(r))) return r;
  Array *c = arr_copy(AS_ARRAY(r));
  val_decref(r);
  if (c) c->buf->np = true;
  return arr_value(c);
}

/* [r] (stolen) marked a 0-d NumPy array when it is 0-d: what NumPy's
 * constructors make (np.array(5.0), np.zeros(())), which `a += 1`
 * writes in place, where the 0-d results of indexing and reductions
 * are NumPy's immutable scalars (array.h, Buffer's np_0d).  One already
 * marked is kept (np.asarray of a 0-d array is that array). */
static Value *array0(Value *r) {
  if (!r || !arr_is_np(r) || AS_ARRAY(r)->ndim || AS_ARRAY(r)->buf->np_0d) return r;
  r = own_buffer(r);
  if (r) AS_ARRAY(r)->buf->np_0d = true;
  return r;
}

/* zeros, ones, empty, eye, identity, linspace, *_like without dtype:
 * float64 (the *_like ones keep their array's: no default there). */
static Value *ctor_f64(Value *self, const CallArgs *a) { return array0(delegate(self, a, 0, false, DT_F64)); }

/* zeros_like, ones_like, full_like, empty_like, copy: a Python number is
 * NumPy's (np.zeros_like(2.0) is float64); 0-d results are arrays. */
static Value *ctor_like(Value *self, const CallArgs *a) { return array0(delegate(self, a, 1, false, -1)); }

/* arange(start, stop, step), full(shape, fill_value): the numbers' dtype. */
static Value *ctor_arange(Value *self, const CallArgs *a) {
  return delegate(self, a, 0, false, numbers_dtype(a, 0, 3));
}
static Value *ctor_full(Value *self, const CallArgs *a) {
  return array0(delegate(self, a, 0, false, numbers_dtype(a, 1, 1)));
}

/* broadcast_to(array, shape): read-only, as NumPy's (its view repeats
 * elements): writes raise "assignment destination is read-only".  It is
 * a copy here (a NumPy array never repeats its buffer's elements:
 * array.h), so a later write to the source is not seen through it. */
static Value *ctor_readonly(Value *self, const CallArgs *a) {
  Value *r = own_buffer(delegate(self, a, 1, false, -1));
  if (r && arr_is_np(r)) AS_ARRAY(r)->buf->np_ro = AS_ARRAY(r)->buf->np_0d = true;
  return r;
}

/* array(object, dtype=None), asarray: NumPy's dtype of Python numbers.
 * np.array of an array is a copy (copy=True is NumPy's default), never
 * the array itself or a view of it; np.asarray may be either. */
static Value *ctor_array(Value *self, const CallArgs *a) {
  int t = a->nargs ? python_dtype(a->args[0]) : -1;
  Value *r = delegate(self, a, 0, false, t);
  bool copy = !strcmp(((Builtin *)self)->name, "array") && a->nargs && IS_ARRAY(a->args[0]);
  if (!r || !copy || !IS_ARRAY(r) || AS_ARRAY(r)->buf != AS_ARRAY(a->args[0])->buf) return array0(r);
  Array *c = arr_copy(AS_ARRAY(r));
  val_decref(r);
  if (c) c->buf->np = true;
  return array0(arr_value(c));
}

/* The functions and how each takes NumPy's arguments. */
static const struct { MethodFn fn; const char *names; } delegated[] = {
  {ctor_array, "array asarray"},
  {ctor_f64, "zeros ones empty eye identity linspace"},
  {ctor_arange, "arange"},
  {ctor_full, "full"},
  {ctor_like, "zeros_like ones_like full_like empty_like copy"},
  {ctor_readonly, "broadcast_to"},
  {conv0, "concatenate stack vstack hstack einsum meshgrid"},
  {conv1, "sum prod max min amax amin argmax argmin cumsum cumprod abs absolute sign square negative "
          "sort argsort ravel flip transpose reshape squeeze expand_dims shape ndim size any all "
          "diag trace tril triu count_nonzero tile repeat split roll moveaxis swapaxes "
          "isnan isinf isfinite"},
  {conv2, "maximum minimum add subtract multiply dot matmul outer inner allclose isclose "
          "array_equal equal not_equal less greater less_equal greater_equal logical_and "
          "logical_or mod remainder floor_divide power"},
  {conv3, "where clip"},
  {inexact1, "sqrt exp exp2 log log2 log10 log1p expm1 sin cos tan arcsin arccos arctan sinh "
             "cosh tanh arcsinh arccosh arctanh floor ceil rint round mean std var median"},
  {inexact2, "divide true_divide arctan2 hypot"},
};

/* Binds each name of [names] that jax.numpy has, wrapped by [fn]. */
static int bind_delegated(Dict *g, MethodFn fn, const char *names) {
  char name[32];
  for (const char *p = names; *p;) {
    size_t n = strcspn(p, " ");
    snprintf(name, sizeof name, "%.*s", (int)n, p);
    p += n + (p[n] == ' ');
    Value *f = jnp_fn(name);
    if (!f) continue;
    Value *b = bound_new(((Builtin *)f)->name, fn, f);
    int rc = b ? dict_set_str(&g->hdr, name, b) : -1;
    val_decref(b);
    if (rc < 0) return -1;
  }
  return 0;
}

/* ---- numpy.testing ---------------------------------------------------------------- */

/* The two arrays of an assertion, NumPy operands of one shape (a 0-d one
 * stands for any shape, as NumPy broadcasts a scalar).  0, or -1 with
 * the error set (an AssertionError for shapes that differ). */
static int assert_pair(Value *x, Value *y, Array **xa, Array **ya) {
  Value *xv = np_operand(x, false), *yv = xv ? np_operand(y, false) : NULL;
  *xa = *ya = NULL;
  if (!yv) {
    val_decref(xv);
    return -1;
  }
  if (xv->type != V_ARRAY || yv->type != V_ARRAY) {
    bi_drop(xv, yv, NULL, NULL);
    err_set(ERR_TYPE, "numpy.testing needs concrete arrays or numbers, not %s", val_type_name(xv->type != V_ARRAY ? xv : yv));
    return -1;
  }
  Array *p = AS_ARRAY(xv), *q = AS_ARRAY(yv);
  bool same = p->ndim == q->ndim && !memcmp(p->shape, q->shape, (size_t)p->ndim * sizeof(int64_t));
  if (!same && p->ndim && q->ndim) {
    char s1[128], s2[128];
    shape_str(s1, sizeof s1, p->ndim, p->shape);
    shape_str(s2, sizeof s2, q->ndim, q->shape);
    bi_drop(xv, yv, NULL, NULL);
    err_set(ERR_ASSERT, "Arrays are not equal (shapes %s, %s mismatch)", s1, s2);
    return -1;
  }
  *xa = p;
  *ya = q;
  return 0;
}

/* Element [i] of [a] as the [n] elements of the pair index it (0-d: its one). */
static double elem(const Array *a, int64_t i) { return arr_get_f64(a, a->ndim ? i : 0); }

/* Compares [x] and [y] element by element: within atol + rtol * |y|
 * (exact when both are 0), NaNs equal when [equal_nan]; an
 * AssertionError with NumPy's summary (the count of mismatches, the
 * largest absolute and relative differences) otherwise. */
static Value *compare(const char *what, Value *x, Value *y, double rtol, double atol, bool equal_nan,
                      Value *msg) {
  Array *p, *q;
  if (assert_pair(x, y, &p, &q) < 0) return NULL;
  int64_t n = p->ndim ? p->size : q->size, bad = 0;
  double maxabs = 0, maxrel = 0;
  for (int64_t i = 0; i < n; i++) {
    double u = elem(p, i), v = elem(q, i), d = fabs(u - v);
    bool nan_u = isnan(u), nan_v = isnan(v);
    bool ok = (nan_u || nan_v) ? (equal_nan && nan_u && nan_v)
            : u == v || d <= atol + rtol * fabs(v);
    if (ok) continue;
    bad++;
    if (d > maxabs || isnan(d)) maxabs = d;
    if (v != 0 && d / fabs(v) > maxrel) maxrel = d / fabs(v);
  }
  bi_drop(&p->hdr, &q->hdr, NULL, NULL);
  if (!bad) return VAL_NONE;
  return err_set(ERR_ASSERT, "%s%s%s; mismatched elements: %lld / %lld (%.3g%%); max absolute "
                 "difference: %.8g; max relative difference: %.8g",
                 msg && msg->type == V_STR && str_nchars(msg) ? str_cstr(msg) : "",
                 msg && msg->type == V_STR && str_nchars(msg) ? ": " : "", what,
                 (long long)bad, (long long)n, 100.0 * (double)bad / (double)n, maxabs, maxrel);
}

/* assert_allclose(actual, desired, rtol=1e-07, atol=0, equal_nan=True, err_msg='') */
static Value *np_assert_allclose(const CallArgs *a) {
  Value *x, *y, *rt = NULL, *at = NULL, *en = NULL, *msg = NULL, *verbose = NULL;
  if (args_bind("assert_allclose", a, "actual, desired, rtol=, atol=, equal_nan=, err_msg=, verbose=",
                (Value **[]){&x, &y, &rt, &at, &en, &msg, &verbose}) < 0)
    return NULL;
  double rtol, atol;
  bool equal_nan;
  if (bi_float_arg("assert_allclose", "rtol", rt, 1e-7, &rtol) < 0 ||
      bi_float_arg("assert_allclose", "atol", at, 0.0, &atol) < 0 || bi_bool_arg(en, true, &equal_nan) < 0)
    return NULL;
  char what[96];
  snprintf(what, sizeof what, "Not equal to tolerance rtol=%g, atol=%g", rtol, atol);
  return compare(what, x, y, rtol, atol, equal_nan, msg);
}

/* assert_array_equal(x, y, err_msg='') and assert_equal(actual, desired) */
static Value *np_assert_array_equal(const CallArgs *a) {
  Value *x, *y, *msg = NULL, *verbose = NULL;
  if (args_bind("assert_array_equal", a, "x, y, err_msg=, verbose=", (Value **[]){&x, &y, &msg, &verbose}) < 0)
    return NULL;
  return compare("Arrays are not equal", x, y, 0.0, 0.0, true, msg);
}

/* assert_array_almost_equal(x, y, decimal=6): |x - y| < 1.5 * 10**-decimal */
static Value *np_assert_array_almost_equal(const CallArgs *a) {
  Value *x, *y, *dec = NULL, *msg = NULL, *verbose = NULL;
  if (args_bind("assert_array_almost_equal", a, "x, y, decimal=, err_msg=, verbose=",
                (Value **[]){&x, &y, &dec, &msg, &verbose}) < 0)
    return NULL;
  int64_t d;
  if (bi_int_arg("assert_array_almost_equal", "decimal", dec, 6, &d) < 0) return NULL;
  char what[64];
  snprintf(what, sizeof what, "Arrays are not almost equal to %lld decimals", (long long)d);
  return compare(what, x, y, 0.0, 1.5 * pow(10.0, (double)-d), true, msg);
}

/* ---- registration ------------------------------------------------------------------ */

static Value *new_module(const char *name) {
  Value *g = dict_new();
  Value *m = g ? module_new(name, g) : NULL;
  val_decref(g);
  return m;
}

static int set_builtin(Value *m, const char *name, BuiltinFn fn, const char *doc) {
  Value *b = builtin_new(name, fn, doc);
  int rc = b ? dict_set_str(((Module *)m)->globals, name, b) : -1;
  val_decref(b);
  return rc;
}

/* NumPy's dtype names (float_ and int_ are NumPy's float64 and int64),
 * constants, and ndarray: the array type, which host arrays share with
 * jax.Array. */
static int bind_names(Value *g) {
  for (int t = 0; t < DT_COUNT; t++)
    if (t != DT_BF16 && dict_set_str(g, dt_name((DType)t), dtype_value((DType)t)) < 0) return -1;
  static const struct { const char *name; double v; } cs[] = {
    {"pi", 3.141592653589793}, {"e", 2.718281828459045}, {"inf", INFINITY}, {"nan", NAN}};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    Value *v = arr_python_float(cs[i].v);
    int rc = v ? dict_set_str(g, cs[i].name, v) : -1;
    val_decref(v);
    if (rc < 0) return -1;
  }
  Value *nd = jnp_fn("ndarray");
  if (dict_set_str(g, "bool_", dtype_value(DT_BOOL)) < 0 || dict_set_str(g, "float_", dtype_value(DT_F64)) < 0 ||
      dict_set_str(g, "int_", dtype_value(DT_I64)) < 0 || dict_set_str(g, "newaxis", VAL_NONE) < 0 ||
      (nd && dict_set_str(g, "ndarray", nd) < 0))
    return -1;
  return 0;
}

/* Makes numpy, numpy.random and numpy.testing; published together, and
 * only when all are made (modules are static: a failure leaves garbage,
 * not a half module). */
static int make_modules(void) {
  Value *np = new_module("numpy"), *random = new_module("numpy.random"), *testing = new_module("numpy.testing");
  if (!np || !random || !testing) return -1;
  Value *g = ((Module *)np)->globals;
  for (size_t i = 0; i < sizeof delegated / sizeof delegated[0]; i++)
    if (bind_delegated((Dict *)g, delegated[i].fn, delegated[i].names) < 0) return -1;
  if (bind_names(g) < 0 || hostnp_random_register(((Module *)random)->globals) < 0 ||
      set_builtin(testing, "assert_allclose", np_assert_allclose,
                  "assert_allclose(actual, desired, rtol=1e-07, atol=0, equal_nan=True, err_msg='')") < 0 ||
      set_builtin(testing, "assert_array_equal", np_assert_array_equal,
                  "assert_array_equal(x, y, err_msg='')") < 0 ||
      set_builtin(testing, "assert_equal", np_assert_array_equal, "assert_equal(actual, desired)") < 0 ||
      set_builtin(testing, "assert_array_almost_equal", np_assert_array_almost_equal,
                  "assert_array_almost_equal(x, y, decimal=6)") < 0 ||
      dict_set_str(g, "random", random) < 0 || dict_set_str(g, "testing", testing) < 0)
    return -1;
  ns_testing = testing;
  ns_random = random;
  ns_np = np;
  atomic_store(&arr_np_live, true);   /* from now on results are settled: array.h */
  return 0;
}
