/*
 * builtins.c - the built-in functions: a handful of Python built-ins, the
 * argument and array helpers the other builtins_*.c files share
 * (builtins_impl.h), and the registration of every built-in into the
 * global scope and the namespaces that name them (`jnp`, `lax`, `jax`,
 * `jax.numpy`, `jax.lax`, `jax.nn`).
 *
 * Each built-in binds its arguments with args_bind under NumPy's (or
 * jax.lax's) parameter names, converts array arguments with ops_to_array,
 * and builds its result from primitives through the helpers of ops.h, in
 * the order jax.numpy would, so a traced call records JAX's plan.
 * Defaults are JAX's 32-bit ones (LANGUAGE.md §2).
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "array/array.h"
#include "lang/builtins.h"
#include "lang/classes.h"
#include "lang/exceptions.h"
#include "lang/hostnp.h"
#include "lang/iter.h"
#include "lang/stdmod.h"
#include "lang/pytree.h"
#include "lang/builtins_impl.h"
#include "base/error.h"
#include "lang/eval.h"
#include "base/intern.h"
#include "base/mem.h"
#include "base/utf8.h"
#include "array/npy.h"
#include "lang/ops.h"
#include "array/prim.h"
#include "array/print.h"

/* ======================================================================
 * Small helpers
 * ====================================================================== */

/* Releases up to four references (NULLs allowed). */
void bi_drop(Value *a, Value *b, Value *c, Value *d) {
  val_decref(a);
  val_decref(b);
  val_decref(c);
  val_decref(d);
}

bool bi_is_seq(const Value *v) { return v->type == V_TUPLE || v->type == V_LIST; }

bool bi_is_none(const Value *v) { return !v || v == VAL_NONE; }

/* Reads an optional Python int argument; [dflt] when absent or None. */
int bi_int_arg(const char *fname, const char *pname, Value *v, int64_t dflt, int64_t *out) {
  if (bi_is_none(v)) {
    *out = dflt;
    return 0;
  }
  if (!IS_ARRAY(v) || !(dt_is_int(AS_ARRAY(v)->dtype) || AS_ARRAY(v)->dtype == DT_BOOL) ||
      AS_ARRAY(v)->size != 1) {
    err_set(ERR_TYPE, "%s() argument '%s' must be an integer, not %s", fname, pname,
            val_type_name(v));
    return -1;
  }
  return arr_to_index(v, out);
}

/* Reads an optional Python float argument; [dflt] when absent. */
int bi_float_arg(const char *fname, const char *pname, Value *v, double dflt, double *out) {
  if (bi_is_none(v)) {
    *out = dflt;
    return 0;
  }
  if (!IS_ARRAY(v) || AS_ARRAY(v)->size != 1) {
    err_set(ERR_TYPE, "%s() argument '%s' must be a number, not %s", fname, pname,
            val_type_name(v));
    return -1;
  }
  return arr_to_double(v, out);
}

/* Reads an optional bool argument. */
int bi_bool_arg(Value *v, bool dflt, bool *out) {
  if (bi_is_none(v)) {
    *out = dflt;
    return 0;
  }
  int t = val_truth(v);
  if (t < 0) return -1;
  *out = t;
  return 0;
}

void bi_sorted_axes(int n, const int *ax, int64_t *out) {
  for (int i = 0; i < n; i++) out[i] = ax[i];
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && out[j - 1] > out[j]; j--) {
      int64_t t = out[j];
      out[j] = out[j - 1];
      out[j - 1] = t;
    }
}

/* The aval of [x]; shorthand. */
AVal bi_aval(Value *x) {
  AVal av;
  memset(&av, 0, sizeof av);
  ops_aval(x, &av);
  return av;
}

/* A 0-d constant of dtype [t] holding [v], not weak. */
Value *bi_scalar(DType t, double v) {
  if (dt_is_float(t)) return (Value *)arr_scalar_f64(t, v, false);
  return (Value *)arr_scalar_i64(t, (int64_t)v, false);
}

/* lax.full: the constant [v] broadcast to [shape]. */
Value *bi_fill(DType t, double v, int ndim, const int64_t *shape) {
  if (arr_check_size(t, ndim, shape) < 0) return NULL;
  Value *c = bi_scalar(t, v);
  if (!c) return NULL;
  Value *r = ops_broadcast_to(c, ndim, shape);
  val_decref(c);
  return r;
}

/* lax.iota of dtype [t] over [shape] along [dim] (broadcasted_iota). */
Value *bi_iota(DType t, int ndim, const int64_t *shape, int dim) {
  Params p;
  params_init(&p);
  params_add(&p, "dtype", dtype_value(t));
  params_add(&p, "shape", val_int_tuple(ndim, shape));
  params_add(&p, "dimension", val_int(dim));
  Value *r = ops_apply(P_IOTA, 0, NULL, &p);
  params_clear(&p);
  return r;
}

/* Binary primitive with promotion; shorthand. */
Value *bi_bin(PrimId id, Value *a, Value *b) {
  Value *in[2] = {a, b};
  return ops_elementwise(id, 2, in);
}

/* [x] op the constant [v] in [x]'s dtype. */
Value *bi_bin_const(PrimId id, Value *x, double v) {
  AVal av = bi_aval(x);
  Value *c = bi_scalar(av.dtype, v);
  Value *r = c ? bi_bin(id, x, c) : NULL;
  val_decref(c);
  return r;
}

/* Converts a positional argument to an array, or NULL with the error.  A
 * Python number becomes a weakly typed array (a copy without the host
 * mark): an array function computes on it in f32 or i32, as under jit,
 * not with Python's arithmetic on doubles. */
Value *bi_arr(Value *v) { return bi_arr_dtype(v, -1); }

Value *bi_arr_dtype(Value *v, int dtype) {
  Value *a = ops_to_array(v, dtype);
  if (!arr_is_host(a)) return a;
  Value *c = (Value *)arr_copy(AS_ARRAY(a));
  val_decref(a);
  return c;
}

int bi_arr2(Value *x, Value *y, Value **xa, Value **ya) {
  Value *a = ops_to_array(x, -1), *b = a ? ops_to_array(y, -1) : NULL;
  if (!b) {
    val_decref(a);
    return -1;
  }
  if (!arr_is_host(a) || !arr_is_host(b)) {   /* a number meets the array as in an operator */
    *xa = a, *ya = b;
    return 0;
  }
  *xa = bi_arr(a);   /* two Python numbers: weak arrays */
  *ya = *xa ? bi_arr(b) : NULL;
  val_decref(a), val_decref(b);
  if (*ya) return 0;
  val_decref(*xa);
  return -1;
}

/* Converts [x] to its float dtype (jnp's promote_args_inexact). */
Value *bi_inexact(Value *x) {
  AVal av = bi_aval(x);
  return ops_convert(x, dt_float_of(av.dtype), av.weak);
}

/* Flattens [x] to 1-D. */
Value *bi_ravel_of(Value *x) {
  AVal av = bi_aval(x);
  int64_t n = shape_size(av.ndim, av.shape);
  return ops_reshape(x, 1, &n);
}

/* ======================================================================
 * Python built-ins
 * ====================================================================== */

static Value *bi_len(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("len", a, "obj", slots) < 0) return NULL;
  int64_t n;
  return ops_len(x, &n) < 0 ? NULL : val_int(n);
}

/* ascii(obj): repr with non-ASCII characters escaped, as Python's. */
static Value *bi_ascii(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("ascii", a, "obj", slots) < 0) return NULL;
  return val_ascii(x);
}

/* ord(c): the code point of the one-character str [c], as Python's. */
static Value *bi_ord(const CallArgs *a) {
  Value *c;
  Value **slots[] = {&c};
  if (args_bind("ord", a, "c", slots) < 0) return NULL;
  if (c->type != V_STR)
    return err_set(ERR_TYPE, "ord() expected string of length 1, but %s found", val_type_name(c));
  if (str_nchars(c) != 1)
    return err_set(ERR_TYPE, "ord() expected a character, but string of length %zu found",
                   str_nchars(c));
  size_t i = 0;
  return val_int(utf8_decode(str_cstr(c), ((Str *)c)->len, &i));
}

/* chr(i): the one-character str of code point [i], 0 <= i <= 0x10ffff. */
static Value *bi_chr(const CallArgs *a) {
  Value *i;
  Value **slots[] = {&i};
  int64_t cp;
  if (args_bind("chr", a, "i", slots) < 0) return NULL;
  if (!IS_ARRAY(i) || !dt_is_int(AS_ARRAY(i)->dtype))
    return err_set(ERR_TYPE, "'%s' object cannot be interpreted as an integer",
                   IS_ARRAY(i) ? "float" : val_type_name(i));
  if (arr_to_index(i, &cp) < 0) return NULL;
  if (cp < 0 || cp > UTF8_MAX_CP) return err_set(ERR_VALUE, "chr() arg not in range(0x110000)");
  char u[4];
  return str_new(u, (size_t)utf8_encode((uint32_t)cp, u));
}

/* perf_counter(): seconds of a monotonic clock as a float64 scalar, as
 * Python's time.perf_counter; only differences are meaningful. */
/* functools.partial: (func, args tuple, keyword names tuple, keyword
 * values tuple); a call puts the given arguments after the stored ones
 * and its keywords over the stored ones. */
enum { PA_FN, PA_ARGS, PA_KWN, PA_KWV, PA_N };

static Value *partial_call(Value *self, const CallArgs *a) {
  Value *args = tuple_get(self, PA_ARGS), *kwn = tuple_get(self, PA_KWN),
        *kwv = tuple_get(self, PA_KWV);
  int np = (int)tuple_len(args), nk = (int)tuple_len(kwn);
  if (np + a->nargs > 256 || nk + a->nkw > 64)
    return err_set(ERR_TYPE, "partial: too many arguments");
  Value *pos[256], *vals[64];
  const char *names[64];
  for (int i = 0; i < np; i++) pos[i] = tuple_get(args, (size_t)i);
  for (int i = 0; i < a->nargs; i++) pos[np + i] = a->args[i];
  int k = 0;
  for (int i = 0; i < nk; i++) {
    const char *n = intern_cstr(str_cstr(tuple_get(kwn, (size_t)i)));
    bool over = false;
    for (int j = 0; j < a->nkw; j++) over |= a->kwnames[j] == n;
    if (!over) names[k] = n, vals[k++] = tuple_get(kwv, (size_t)i);
  }
  for (int j = 0; j < a->nkw; j++) names[k] = a->kwnames[j], vals[k++] = a->kwvals[j];
  CallArgs c = {np + a->nargs, pos, k, names, vals};
  return val_call(tuple_get(self, PA_FN), &c);
}

/* partial(func, /, *args, **keywords) */
static Value *bi_partial(const CallArgs *a) {
  if (a->nargs < 1) return err_set(ERR_TYPE, "partial() missing required argument 'func'");
  Value *args = tuple_pack((size_t)a->nargs - 1, a->args + 1);
  Value *kwv = tuple_pack((size_t)a->nkw, a->kwvals), *kwn = tuple_new((size_t)a->nkw);
  for (int i = 0; kwn && i < a->nkw; i++) tuple_set_steal(kwn, (size_t)i, str_from(a->kwnames[i]));
  Value *cfg = args && kwv && kwn ? tuple_pack(PA_N, (Value *[]){a->args[0], args, kwn, kwv}) : NULL;
  Value *r = cfg ? bound_new("partial", partial_call, cfg) : NULL;
  Value *tmp[] = {args, kwv, kwn, cfg};
  for (size_t i = 0; i < 4; i++)
    if (tmp[i]) val_decref(tmp[i]);
  return r;
}

static Value *bi_perf_counter(const CallArgs *a) {
  if (a->nargs || a->nkw) return err_set(ERR_TYPE, "perf_counter() takes no arguments");
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (Value *)arr_scalar_f64(DT_F64, (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9, false);
}

static Value *bi_range(const CallArgs *a) {
  if (a->nkw) return err_set(ERR_TYPE, "range() takes no keyword arguments");
  if (a->nargs < 1 || a->nargs > 3)
    return err_set(ERR_TYPE, "range expected at least 1 argument, got %d", a->nargs);
  int64_t v[3] = {0, 0, 1};
  for (int i = 0; i < a->nargs; i++) {
    Value *x = a->args[i];
    if (!IS_ARRAY(x) || !(dt_is_int(AS_ARRAY(x)->dtype) || AS_ARRAY(x)->dtype == DT_BOOL) ||
        AS_ARRAY(x)->size != 1)
      return err_set(ERR_TYPE, "'%s' object cannot be interpreted as an integer",
                     IS_ARRAY(x) ? "float" : val_type_name(x));
    if (arr_to_index(x, &v[a->nargs == 1 ? 1 : i]) < 0) return NULL;
  }
  if (v[2] == 0) return err_set(ERR_VALUE, "range() arg 3 must not be zero");
  return range_new(v[0], v[1], v[2]);
}

static Value *bi_print(const CallArgs *a) {
  Value *sep = NULL, *end = NULL, *flush = NULL;
  for (int k = 0; k < a->nkw; k++) {
    if (!strcmp(a->kwnames[k], "sep")) sep = a->kwvals[k];
    else if (!strcmp(a->kwnames[k], "end")) end = a->kwvals[k];
    else if (!strcmp(a->kwnames[k], "flush")) flush = a->kwvals[k];
    else if (strcmp(a->kwnames[k], "file"))
      return err_set(ERR_TYPE, "print() got an unexpected keyword argument '%s'", a->kwnames[k]);
  }
  if ((sep && sep != VAL_NONE && sep->type != V_STR) || (end && end != VAL_NONE && end->type != V_STR))
    return err_set(ERR_TYPE, "print(): sep and end must be None or a string");
  const char *s = sep && sep != VAL_NONE ? str_cstr(sep) : " ";
  const char *e = end && end != VAL_NONE ? str_cstr(end) : "\n";
  /* Format everything first so an error prints nothing. */
  Value *parts = list_new((size_t)a->nargs);
  if (!parts) return NULL;
  for (int i = 0; i < a->nargs; i++) {
    Value *str = val_str(a->args[i]);
    if (!str || list_append_steal(parts, str) < 0) {
      val_decref(parts);
      return NULL;
    }
  }
  for (int i = 0; i < a->nargs; i++) {
    if (i) eval_write(s, strlen(s));
    Value *str = list_get(parts, (size_t)i);
    eval_write(str_cstr(str), ((Str *)str)->len);
  }
  eval_write(e, strlen(e));
  val_decref(parts);
  int f = flush ? val_truth(flush) : 0;
  if (f < 0) return NULL;
  if (f) eval_flush();
  return eval_output_check() < 0 ? NULL : VAL_NONE;
}

static Value *bi_str(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (a->nargs == 0 && a->nkw == 0) return str_from("");
  if (args_bind("str", a, "object", slots) < 0) return NULL;
  return val_str(x);
}

static Value *bi_repr(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("repr", a, "obj", slots) < 0) return NULL;
  return val_repr(x);
}

/* Parses a Python int or float literal from a string. */
static Value *parse_number(const char *s, bool want_int) {
  char *end;
  while (isspace((unsigned char)*s)) s++;
  errno = 0;
  if (want_int) {
    long long v = strtoll(s, &end, 10);
    while (isspace((unsigned char)*end)) end++;
    if (end == s || *end || errno)
      return err_set(ERR_VALUE, "invalid literal for int() with base 10: '%s'", s);
    return val_int(v);
  }
  double d = strtod(s, &end);
  while (isspace((unsigned char)*end)) end++;
  if (end == s || *end) return err_set(ERR_VALUE, "could not convert string to float: '%s'", s);
  return arr_python_float(d);
}

Value *bi_parse_str(Value *s, bool want_int) {
  Value *t = ops_str_strip(s);
  Value *r = t ? parse_number(str_cstr(t), want_int) : NULL;
  val_decref(t);
  return r;
}

/* A concrete size-1 array for int()/float(); tracers are an error. */
static Array *scalar_arg(const char *fname, Value *x) {
  if (x->type == V_TRACER) {
    err_set(ERR_TYPE, "%s() needs a concrete value, but its argument is traced under jit", fname);
    return NULL;
  }
  if (!IS_ARRAY(x) || AS_ARRAY(x)->size != 1) {
    if (IS_ARRAY(x))
      err_set(ERR_TYPE, "only length-1 arrays can be converted to Python scalars");
    else
      err_set(ERR_TYPE, "%s() argument must be a string or a number, not '%s'", fname, val_type_name(x));
    return NULL;
  }
  return AS_ARRAY(x);
}

/* The digits of [s] (white space stripped) in [base] (2 to 36, or 0:
 * the prefix's, else 10), Python's int(s, base): a sign, a 0x/0o/0b
 * prefix where it names the base, single underscores between digits.
 * The ValueError quotes [orig] as Python does. */
static Value *parse_int_base(const char *s, int base, Value *orig) {
  const char *p = s;
  int given = base;
  bool neg = *p == '-';
  if (*p == '+' || *p == '-') p++;
  int pb = p[0] == '0' && p[1] ? (strchr("xX", p[1]) ? 16 : strchr("oO", p[1]) ? 8
                                  : strchr("bB", p[1]) ? 2 : 0) : 0;
  bool prefixed = pb && (base == 0 || base == pb);
  if (prefixed) {
    base = pb;
    p += 2;
    if (*p == '_') p++;
  }
  bool zero_lead = base == 0 && p[0] == '0';   /* base 0: "010" is no literal, "000" is */
  if (base == 0) base = 10;
  uint64_t u = 0;
  bool any = false, bad = false, big = false;
  for (; *p && !bad; p++) {
    if (*p == '_' && any && p[1] && p[1] != '_') continue;
    int d = *p >= '0' && *p <= '9' ? *p - '0' : *p >= 'a' && *p <= 'z' ? *p - 'a' + 10
            : *p >= 'A' && *p <= 'Z' ? *p - 'A' + 10 : 99;
    if (d >= base) {
      bad = true;
      break;
    }
    big |= u > (UINT64_MAX - (uint64_t)d) / (uint64_t)base;
    u = u * (uint64_t)base + (uint64_t)d;
    any = true;
  }
  if (!any || bad || (zero_lead && u != 0)) {
    Value *r = val_repr(orig);
    err_set(ERR_VALUE, "invalid literal for int() with base %d: %s", given, r ? str_cstr(r) : "?");
    if (r) val_decref(r);
    return NULL;
  }
  if (big || u > (neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX))
    return err_set(ERR_OVERFLOW, "int too large: Python ints here have 64 bits");
  return val_int(neg ? (int64_t)(0 - u) : (int64_t)u);
}

static Value *bi_int(const CallArgs *a) {
  Value *x, *base = NULL;
  Value **slots[] = {&x, &base};
  if (a->nargs == 0 && a->nkw == 0) return val_int(0);
  if (args_bind("int", a, "x, base=", slots) < 0) return NULL;
  if (base) {
    int64_t b;
    if (arr_to_index(base, &b) < 0) return NULL;
    if (b != 0 && (b < 2 || b > 36)) return err_set(ERR_VALUE, "int() base must be >= 2 and <= 36, or 0");
    if (x->type != V_STR) return err_set(ERR_TYPE, "int() can't convert non-string with explicit base");
    Value *t = ops_str_strip(x);
    Value *r = t ? parse_int_base(str_cstr(t), (int)b, x) : NULL;
    if (t) val_decref(t);
    return r;
  }
  if (x->type == V_STR) return bi_parse_str(x, true);
  Array *xa = scalar_arg("int", x);
  if (!xa) return NULL;
  if (!dt_is_float(xa->dtype)) return val_int(arr_get_i64(xa, 0));
  int64_t n;
  return ops_float_to_int(xa->ndim == 0 ? arr_host_f64(xa) : arr_get_f64(xa, 0), &n) < 0
             ? NULL : val_int(n);
}

static Value *bi_float(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (a->nargs == 0 && a->nkw == 0) return arr_python_float(0);
  if (args_bind("float", a, "x", slots) < 0) return NULL;
  if (x->type == V_STR) return bi_parse_str(x, false);
  Array *xa = scalar_arg("float", x);
  if (!xa) return NULL;
  /* A Python float whatever the dtype, as in JAX: a float64 array's
   * value exactly, a host float's double. */
  return arr_python_float(xa->ndim == 0 ? arr_host_f64(xa) : arr_get_f64(xa, 0));
}

static Value *bi_bool(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (a->nargs == 0 && a->nkw == 0) return val_bool(false);
  if (args_bind("bool", a, "x", slots) < 0) return NULL;
  int t = val_truth(x);
  return t < 0 ? NULL : val_bool(t);
}

static Value *bi_list(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("list", a, "iterable=", slots) < 0) return NULL;
  return x ? ops_iter_items(x) : list_new(0);
}

static Value *bi_tuple(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("tuple", a, "iterable=", slots) < 0) return NULL;
  if (!x) return tuple_new(0);
  if (x->type == V_TUPLE) return val_incref(x);
  Value *l = ops_iter_items(x);
  if (!l) return NULL;
  Value *t = tuple_pack(list_len(l), ((List *)l)->items);
  val_decref(l);
  return t;
}

static Value *bi_dict(const CallArgs *a) {
  if (a->nargs > 1) return err_set(ERR_TYPE, "dict expected at most 1 argument, got %d", a->nargs);
  Value *d = dict_new();
  if (!d) return NULL;
  if (a->nargs == 1) {
    Value *src = a->args[0];
    Value *items = src->type == V_DICT ? NULL : ops_iter_items(src);
    if (src->type == V_DICT) {
      Dict *sd = (Dict *)src;
      for (size_t i = 0; i < sd->len; i++)
        if (dict_set(d, sd->keys[i], sd->vals[i]) < 0) goto fail;
    } else {
      if (!items) goto fail;
      for (size_t i = 0; i < list_len(items); i++) {
        Value *kv = list_get(items, i);
        size_t n;
        Value *const *p;
        if (!val_seq(kv, &n, &p) || n != 2) {
          val_decref(items);
          err_set(ERR_VALUE, "dictionary update sequence element #%zu has the wrong length", i);
          goto fail;
        }
        if (dict_set(d, p[0], p[1]) < 0) {
          val_decref(items);
          goto fail;
        }
      }
      val_decref(items);
    }
  }
  for (int k = 0; k < a->nkw; k++)
    if (dict_set_str(d, a->kwnames[k], a->kwvals[k]) < 0) goto fail;
  return d;
fail:
  val_decref(d);
  return NULL;
}

static Value *bi_enumerate(const CallArgs *a) {
  Value *x, *start;
  Value **slots[] = {&x, &start};
  if (args_bind("enumerate", a, "iterable, start=", slots) < 0) return NULL;
  int64_t s;
  if (bi_int_arg("enumerate", "start", start, 0, &s) < 0) return NULL;
  return iter_enumerate(x, s);
}

/* map(function, *iterables): an iterator (iter.h) of function applied to
 * the items side by side, to the shortest, as Python's. */

static Value *bi_map(const CallArgs *a) {
  if (a->nargs < 2 || a->nkw) return err_set(ERR_TYPE, "map() must have at least two arguments.");
  return iter_zip(a->nargs - 1, a->args + 1, a->args[0]);
}

/* zip(*iterables): an iterator of tuples of their items side by side. */
static Value *bi_zip(const CallArgs *a) {
  if (a->nkw) return err_set(ERR_TYPE, "zip() takes no keyword arguments");
  return iter_zip(a->nargs, a->args, NULL);
}

/* filter(function, iterable): an iterator of the items function passes. */
static Value *bi_filter(const CallArgs *a) {
  if (a->nargs != 2 || a->nkw) return err_set(ERR_TYPE, "filter expected 2 arguments, got %d", a->nargs + a->nkw);
  return iter_filter(a->args[0], a->args[1]);
}

/* Python's sum over a list or tuple (start + each item), jnp.sum on an
 * array. */
static Value *bi_sum(const CallArgs *a) {
  if (a->nargs >= 1 && (bi_is_seq(a->args[0]) || a->args[0]->type == V_RANGE || iter_is(a->args[0]))) {
    Value *it, *start;
    Value **slots[] = {&it, &start};
    if (args_bind("sum", a, "iterable, start=", slots) < 0) return NULL;
    Value *items = ops_iter_items(it);
    if (!items) return NULL;
    Value *acc = start ? val_incref(start) : val_int(0);
    for (size_t i = 0; acc && i < list_len(items); i++) {
      Value *n = ops_binary(OP_ADD, acc, list_get(items, i));
      val_decref(acc);
      acc = n;
    }
    val_decref(items);
    return acc;
  }
  return bi_jnp_sum(a);
}

/* Python's max/min of several arguments or of one sequence; jnp.max/min
 * of one array. */
static Value *py_minmax(const char *fname, const CallArgs *a, bool is_max) {
  Value *const *items;
  size_t n;
  Value *list = NULL;
  if (a->nargs == 1) {
    list = ops_iter_items(a->args[0]);
    if (!list) return NULL;
    items = ((List *)list)->items;
    n = list_len(list);
  } else {
    items = a->args;
    n = (size_t)a->nargs;
  }
  Value *dflt = NULL, *key = NULL;
  for (int k = 0; k < a->nkw; k++) {
    if (!strcmp(a->kwnames[k], "default")) dflt = a->kwvals[k];
    else if (!strcmp(a->kwnames[k], "key")) key = a->kwvals[k];
    else {
      val_decref(list);
      return err_set(ERR_TYPE, "%s() got an unexpected keyword argument '%s'", fname, a->kwnames[k]);
    }
  }
  if (n == 0) {
    val_decref(list);
    if (dflt) return val_incref(dflt);
    return err_set(ERR_VALUE, "%s() arg is an empty sequence", fname);
  }
  Value *best = items[0], *bestk = key ? val_call_n(key, 1, &best) : val_incref(best);
  for (size_t i = 1; bestk && i < n; i++) {
    Value *ki = key ? val_call_n(key, 1, (Value **)&items[i]) : val_incref(items[i]);
    Value *c = ki ? ops_compare(is_max ? OP_GT : OP_LT, ki, bestk) : NULL;
    int t = c ? val_truth(c) : -1;
    val_decref(c);
    if (t < 0) {
      val_decref(ki);
      val_decref(bestk);
      bestk = NULL;
      break;
    }
    if (t) {
      val_decref(bestk);
      bestk = ki;
      best = items[i];
    } else {
      val_decref(ki);
    }
  }
  Value *r = bestk ? val_incref(best) : NULL;
  val_decref(bestk);
  val_decref(list);
  return r;
}

/* One non-scalar array (or any array with axis/keepdims keywords) goes to
 * jnp; otherwise Python's semantics. */
static bool jnp_reduction_call(const CallArgs *a) {
  if (a->nargs == 0) return a->nkw > 0;
  if (!ops_is_array(a->args[0])) return false;
  if (a->nargs >= 2) {
    /* max(x, 1) is jnp's axis only for non-scalar x. */
    return bi_aval(a->args[0]).ndim > 0;
  }
  for (int k = 0; k < a->nkw; k++)
    if (strcmp(a->kwnames[k], "default") && strcmp(a->kwnames[k], "key")) return true;
  return true;
}

static Value *bi_max(const CallArgs *a) {
  return jnp_reduction_call(a) ? bi_jnp_max(a) : py_minmax("max", a, true);
}

static Value *bi_min(const CallArgs *a) {
  return jnp_reduction_call(a) ? bi_jnp_min(a) : py_minmax("min", a, false);
}

/* A Python int argument of pow's three-argument form (a bool is an int). */
static bool py_int(Value *v) { return arr_is_host(v) && !dt_is_float(AS_ARRAY(v)->dtype); }

/* x**e mod m for 0 <= x < m, in 128-bit products. */
static int64_t pow_mod(int64_t x, uint64_t e, int64_t m) {
  __int128 r = 1 % m, b = x;
  for (; e; e >>= 1, b = b * b % m)
    if (e & 1) r = r * b % m;
  return (int64_t)r;
}

/* The inverse of [x] modulo [m] (m > 0) by Euclid's extended algorithm;
 * -1 when gcd(x, m) is not 1. */
static int64_t inverse_mod(int64_t x, int64_t m) {
  __int128 r0 = m, r1 = x, s0 = 0, s1 = 1;
  while (r1) {
    __int128 q = r0 / r1, t = r0 - q * r1;
    r0 = r1, r1 = t;
    t = s0 - q * s1;
    s0 = s1, s1 = t;
  }
  return r0 == 1 ? (int64_t)((s0 % m + m) % m) : -1;
}

/* pow(base, exp, mod): Python's, on ints: a negative exponent takes the
 * inverse of base first; the result has mod's sign. */
static Value *int_pow_mod(Value *bv, Value *ev, Value *mv) {
  if (!py_int(bv) || !py_int(ev) || !py_int(mv))
    return err_set(ERR_TYPE, "pow() 3rd argument not allowed unless all arguments are integers");
  int64_t b = arr_get_i64(AS_ARRAY(bv), 0), e = arr_get_i64(AS_ARRAY(ev), 0), m = arr_get_i64(AS_ARRAY(mv), 0);
  if (m == 0) return err_set(ERR_VALUE, "pow() 3rd argument cannot be 0");
  if (m == INT64_MIN) return err_set(ERR_OVERFLOW, "pow(): a modulus of -2**63 exceeds shmap's 64-bit ints");
  int64_t am = m < 0 ? -m : m, x = (int64_t)(((__int128)b % am + am) % am);
  if (e < 0 && (x = inverse_mod(x, am)) < 0)
    return err_set(ERR_VALUE, "base is not invertible for the given modulus");
  int64_t r = pow_mod(x, e < 0 ? -(uint64_t)e : (uint64_t)e, am);
  return arr_python_int(m < 0 && r ? r - am : r);
}

/* pow(base, exp, mod=None): base ** exp (Python's numbers, or arrays as
 * the operator computes them), or Python's modular power of ints. */
static Value *bi_pow(const CallArgs *a) {
  Value *b, *e, *m = NULL;
  if (args_bind("pow", a, "base, exp, mod=", (Value **[]){&b, &e, &m}) < 0) return NULL;
  return bi_is_none(m) ? ops_binary(OP_POW, b, e) : int_pow_mod(b, e, m);
}

/* Python's sorted(iterable, /, *, key=None, reverse=False): a new list,
 * stable (ops_list_sort). */
static Value *bi_sorted(const CallArgs *a) {
  Value *it, *key, *reverse;
  Value **slots[] = {&it, &key, &reverse};
  if (args_bind("sorted", a, "iterable, key=, reverse=", slots) < 0) return NULL;
  bool rev;
  if (bi_bool_arg(reverse, false, &rev) < 0) return NULL;
  Value *l = ops_iter_items(it);
  if (l && ops_list_sort(l, key, rev) < 0) {
    val_decref(l);
    return NULL;
  }
  return l;
}

static Value *bi_reversed(const CallArgs *a) {
  Value *it;
  Value **slots[] = {&it};
  if (args_bind("reversed", a, "sequence", slots) < 0) return NULL;
  return iter_reversed(it);
}

static int by_name(const void *x, const void *y) {
  return strcmp(str_cstr(*(Value *const *)x), str_cstr(*(Value *const *)y));
}

static void collect_name(const char *name, Value *v, void *ctx) {
  (void)v;
  Value *l = ctx, *s = str_from(name);
  if (s) list_append_steal(l, s);
}

/* dir([obj]): the names of the current scope, or [obj]'s attributes,
 * sorted. */
static Value *bi_dir(const CallArgs *a) {
  if (a->nargs > 1 || a->nkw) return err_set(ERR_TYPE, "dir expected at most 1 argument");
  Value *l;
  if (a->nargs) {
    l = ops_dir(a->args[0]);
  } else {
    Frame *f = eval_current_frame();
    l = list_new(16);
    if (l && f && f->env) env_each(f->env, collect_name, l);
  }
  if (!l) return NULL;
  List *li = (List *)l;
  qsort(li->items, li->len, sizeof(Value *), by_name);
  return l;
}

/* [text] (consumed) with [more] after it; NULL (error set) on failure. */
static Value *str_append(Value *text, const char *more) {
  Value *t = text ? str_printf("%s%s", str_cstr(text), more) : NULL;
  val_decref(text);
  return t;
}

/* Parameter [i] of user function [f] as its signature shows it:
 * "x", "y=2", "*args", "**kw". */
static Value *param_text(const Func *f, int i) {
  const Param *p = &f->node->params[i];
  if (p->star || p->starstar)   /* a bare '*' has no name */
    return str_printf("%s%s", p->starstar ? "**" : "*", p->name ? p->name : "");
  if (!f->defaults || !f->defaults[i]) return str_from(p->name);
  Value *r = val_repr(f->defaults[i]);
  Value *t = r ? str_printf("%s=%s", p->name, str_cstr(r)) : NULL;
  val_decref(r);
  return t;
}

/* The docstring of user function [f] (borrowed), or NULL: its body's
 * first statement when that is a string, as Python's __doc__. */
static const char *func_doc(const Func *f) {
  if (f->node->kind != N_DEF || f->node->body.n == 0) return NULL;
  const Node *s = f->node->body.items[0];
  if (s->kind != N_EXPR_STMT || s->a->kind != N_CONST || s->a->value->type != V_STR) return NULL;
  return str_cstr(s->a->value);
}

/* The indentation that the lines of [doc] after its first share. */
static size_t doc_indent(const char *doc) {
  size_t least = (size_t)-1;
  for (const char *p = strchr(doc, '\n'); p; p = strchr(p, '\n')) {
    p++;
    size_t k = strspn(p, " ");
    if (p[k] && p[k] != '\n' && k < least) least = k;
  }
  return least == (size_t)-1 ? 0 : least;
}

/* [text] (consumed) with docstring [doc] after it as pydoc shows it
 * (Python's inspect.cleandoc, each line indented by 4): the first line
 * without its blanks, the others without their common indentation, no
 * blank lines at either end. */
static Value *doc_append(Value *text, const char *doc) {
  size_t indent = doc_indent(doc);
  int blanks = 0;
  bool started = false;
  for (const char *p = doc; text && *p;) {
    size_t n = strcspn(p, "\n");
    size_t k = p == doc ? strspn(p, " ") : n < indent ? n : indent;
    bool blank = strspn(p, " ") >= n;
    if (blank) {
      blanks += started;
    } else {
      for (; text && blanks > 0; blanks--) text = str_append(text, "\n");
      Value *line = text ? str_printf("    %.*s\n", (int)(n - k), p + k) : NULL;
      text = line ? str_append(text, str_cstr(line)) : (val_decref(text), NULL);
      val_decref(line);
      started = true;
    }
    p += n + (p[n] == '\n');
  }
  return text;
}

/* help(f) of a user function: Python's "Help on function", the signature
 * and the docstring indented under it. */
static Value *func_help(const Func *f) {
  Value *text = str_printf("Help on function %s:\n\n%s(", f->name, f->name);
  for (int i = 0; text && i < f->node->nparams; i++) {
    Value *p = param_text(f, i);
    text = p ? str_append(str_append(text, i ? ", " : ""), str_cstr(p)) : (val_decref(text), NULL);
    val_decref(p);
  }
  text = str_append(text, ")\n");
  const char *doc = func_doc(f);
  return doc ? doc_append(text, doc) : text;
}

/* help(): what the interactive help of Python's help() would start with,
 * pointing to the manual instead. */
static const char HELP_INTRO[] =
    "Welcome to shmap's help.  help(obj) shows a function's signature and\n"
    "docstring, a built-in's summary or a module's names; dir(obj) lists\n"
    "names.  The language is described in shmap(7), the command line, the\n"
    "REPL and the debugger in shmap(1).\n";

/* help(obj): a built-in's signature and summary, a function's signature
 * and docstring, a module's names; help() an introduction. */
static Value *bi_help(const CallArgs *a) {
  if (a->nargs == 0 && !a->nkw) {
    eval_write(HELP_INTRO, strlen(HELP_INTRO));
    return val_incref(VAL_NONE);
  }
  if (a->nargs != 1 || a->nkw) return err_set(ERR_TYPE, "help() takes at most 1 argument");
  Value *x = a->args[0], *text = NULL;
  if (x->type == V_FUNC) {
    text = func_help((const Func *)x);
  } else if (x->type == V_BUILTIN) {
    const Builtin *b = (const Builtin *)x;
    text = str_printf("Help on built-in function %s:\n\n%s\n", b->name, b->doc ? b->doc : b->name);
  } else if (x->type == V_BOUND) {
    text = str_printf("Help on %s:\n\n%s(...)\n", ((BoundMethod *)x)->name, ((BoundMethod *)x)->name);
  } else if (x->type == V_MODULE) {
    Value *names = ops_dir(x);
    if (names) {
      List *li = (List *)names;
      qsort(li->items, li->len, sizeof(Value *), by_name);
      text = str_printf("Help on module %s:\n\n", ((Module *)x)->name);
      for (size_t i = 0; text && i < li->len; i++) {
        Value *t = str_printf("%s%s%s", str_cstr(text), str_cstr(li->items[i]),
                              i + 1 < li->len ? ", " : "\n");
        val_decref(text);
        text = t;
      }
      val_decref(names);
    }
  } else {
    Value *r = val_repr(x);
    text = r ? str_printf("Help on %s %s\n", val_type_name(x), str_cstr(r)) : NULL;
    val_decref(r);
  }
  if (!text) return NULL;
  eval_write(str_cstr(text), strlen(str_cstr(text)));
  val_decref(text);
  return val_incref(VAL_NONE);
}

static Value *bi_getattr(const CallArgs *a) {
  Value *obj, *name, *dflt;
  Value **slots[] = {&obj, &name, &dflt};
  if (args_bind("getattr", a, "object, name, default=", slots) < 0) return NULL;
  if (name->type != V_STR) return err_set(ERR_TYPE, "attribute name must be string");
  Value *r = ops_getattr(obj, str_cstr(name));
  if (r || !dflt || err_kind() == ERR_MEMORY) return r;
  err_clear();
  return val_incref(dflt);
}

static Value *bi_hasattr(const CallArgs *a) {
  Value *obj, *name;
  Value **slots[] = {&obj, &name};
  if (args_bind("hasattr", a, "obj, name", slots) < 0) return NULL;
  if (name->type != V_STR) return err_set(ERR_TYPE, "attribute name must be string");
  Value *r = ops_getattr(obj, str_cstr(name));
  if (!r && err_kind() == ERR_MEMORY) return NULL;
  err_clear();
  val_decref(r);
  return val_bool(r != NULL);
}

/* iter(object): a lazy iterator over it (iter.h); an iterator itself. */
static Value *bi_iter(const CallArgs *a) {
  if (a->nargs != 1 || a->nkw) return err_set(ERR_TYPE, "iter expected 1 argument, got %d", a->nargs + a->nkw);
  return iter_over(a->args[0]);
}

/* next(iterator[, default]): its next item; at its end the default, or
 * StopIteration (exceptions.c) when there is none. */
static Value *bi_next(const CallArgs *a) {
  if (a->nargs < 1 || a->nargs > 2 || a->nkw)
    return err_set(ERR_TYPE, "next expected at most 2 arguments, got %d", a->nargs + a->nkw);
  if (!iter_is(a->args[0])) return err_set(ERR_TYPE, "'%s' object is not an iterator", val_type_name(a->args[0]));
  Value *x = iter_next(a->args[0]);
  if (x || err_occurred()) return x;
  return a->nargs == 2 ? val_incref(a->args[1]) : err_set(ERR_VALUE, "StopIteration");
}

/* callable(obj): whether obj can be called (eval.h's val_callable). */
static Value *bi_callable(const CallArgs *a) {
  if (a->nargs != 1 || a->nkw)
    return err_set(ERR_TYPE, "callable() takes exactly one argument (%d given)", a->nargs + a->nkw);
  return val_bool(val_callable(a->args[0]));
}

/* The built-in types type() gives (Python's classes, which these
 * built-ins also construct), made at start-up; `type` is type(int)'s. */
enum { TY_INT, TY_FLOAT, TY_BOOL, TY_STR, TY_LIST, TY_TUPLE, TY_DICT, TY_ARRAY, TY_RANGE,
       TY_SLICE, TY_TYPE, TY_SET, TY_FROZENSET, TY_COUNT };
static const char *const type_names[TY_COUNT] = {"int",   "float", "bool",  "str",
                                                 "list",  "tuple", "dict",  "Array",
                                                 "range", "slice", "type",  "set",
                                                 "frozenset"};
static Value *types[TY_COUNT];

/* The classes of the other kinds of values (Python's or JAX's names),
 * made at start-up (kind_classes_make) or given by the layer that defines
 * the kind (builtins_set_class: jax.sharding.Mesh, PartitionSpec).  A
 * user function and a shard_map-wrapped one are both Python functions. */
static const char *const kind_names[V_TYPE_COUNT] = {
    [V_NONE] = "NoneType", [V_ELLIPSIS] = "ellipsis",
    [V_DTYPE] = "dtype",   [V_BUILTIN] = "builtin_function_or_method",
    [V_BOUND] = "method",  [V_FUNC] = "function",    [V_MODULE] = "module",
    [V_MESH] = "Mesh",     [V_PSPEC] = "PartitionSpec", [V_JITFN] = "PjitFunction",
    [V_PLAN] = "Plan",     [V_OPAQUE] = "object"};
static Value *kind_classes[V_TYPE_COUNT];
/* Opaque values a program sees, by their type's name. */
static const char *const opaque_names[] = {
    "PyTreeDef", "_IndexUpdateHelper", "ShapedArray", "itertools.count", "itertools.cycle",
    "itertools.repeat", "itertools.islice", "generator", "iterator", "list_iterator",
    "tuple_iterator", "range_iterator", "str_ascii_iterator", "dict_keyiterator",
    "list_reverseiterator", "SymbolicZero", "CustomVJPPrimal", "DictKey", "SequenceKey",
    "GetAttrKey", "FlattenedIndexKey"};
#define N_OPAQUE_CLASSES (sizeof opaque_names / sizeof *opaque_names)
static Value *opaque_classes[N_OPAQUE_CLASSES];

/* slice(stop) or slice(start, stop, step=None): what a[start:stop:step]
 * indexes with, as Python's. */
static Value *bi_slice(const CallArgs *a) {
  Value *x, *y = NULL, *z = NULL;
  if (args_bind("slice", a, "start, stop=, step=", (Value **[]){&x, &y, &z}) < 0) return NULL;
  if (a->nargs + a->nkw == 1) return slice_new(VAL_NONE, x, VAL_NONE);
  return slice_new(x, y ? y : VAL_NONE, z ? z : VAL_NONE);
}

/* Calling a class of kind_classes: NoneType() is None; the others cannot
 * make a value, as in Python. */
static Value *bi_none_type(const CallArgs *a) {
  if (a->nargs || a->nkw) return err_set(ERR_TYPE, "NoneType takes no arguments");
  return VAL_NONE;
}

static Value *bi_no_instances(const CallArgs *a) {
  (void)a;
  return err_set(ERR_TYPE, "cannot create instances of this type by calling it");
}

/* A class named [name] for type(). */
static Value *class_new(const char *name) {
  Value *c = builtin_new(name, strcmp(name, "NoneType") ? bi_no_instances : bi_none_type,
                         "a type: what type() gives");
  if (c) ((Builtin *)c)->is_class = true;
  return c;
}

static int kind_classes_make(void) {
  for (int k = 0; k < V_TYPE_COUNT; k++)
    if (kind_names[k] && !kind_classes[k] && !(kind_classes[k] = class_new(kind_names[k])))
      return -1;
  kind_classes[V_SHARDFN] = val_incref(kind_classes[V_FUNC]);
  for (size_t i = 0; i < N_OPAQUE_CLASSES; i++)
    if (!(opaque_classes[i] = class_new(opaque_names[i]))) return -1;
  return 0;
}

Value *(*builtins_out_sharding_hook)(Value *x, Value *sharding);

Value *builtins_opaque_class(const char *name) {
  for (size_t i = 0; i < N_OPAQUE_CLASSES; i++)
    if (!strcmp(name, opaque_names[i]) && opaque_classes[i]) return opaque_classes[i];
  return err_set(ERR_VALUE, "no class of opaque values named '%s'", name);
}

void builtins_set_class(int kind, Value *cls) {
  ((Builtin *)cls)->is_class = true;
  val_decref(kind_classes[kind]);
  kind_classes[kind] = val_incref(cls);
}

/* The built-ins that are the classes of the iterators they make (iter.h),
 * as in Python: type(zip(a, b)) is zip. */
static const char *const iter_class_names[] = {"zip", "map", "enumerate", "filter", "reversed"};
#define N_ITER_CLASSES (sizeof iter_class_names / sizeof *iter_class_names)
static Value *iter_classes[N_ITER_CLASSES];

/* Marks [v] (a new built-in) a type when it is one of type_names or
 * iter_class_names. */
static void note_type(Value *v) {
  for (size_t i = 0; i < N_ITER_CLASSES; i++)
    if (!strcmp(((Builtin *)v)->name, iter_class_names[i])) {
      ((Builtin *)v)->is_class = true;
      iter_classes[i] = v;
    }
  for (int t = 0; t < TY_COUNT; t++)
    if (!strcmp(((Builtin *)v)->name, type_names[t])) {
      ((Builtin *)v)->is_class = true;
      types[t] = v;
    }
}

/* type(x): x's class (builtins_type_of). */
static Value *bi_type(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("type", a, "object", slots) < 0) return NULL;
  return builtins_type_of(x);
}

/* Which of types[] is x's, or -1. */
static int type_index(Value *x) {
  if (arr_is_host(x)) {   /* a Python number: Python's type, not an array's */
    DType d = AS_ARRAY(x)->dtype;
    return d == DT_BOOL ? TY_BOOL : dt_is_float(d) ? TY_FLOAT : TY_INT;
  }
  if (ops_is_array(x)) return TY_ARRAY;
  switch (x->type) {
  case V_STR: return TY_STR;
  case V_LIST: return TY_LIST;
  case V_TUPLE: return TY_TUPLE;
  case V_DICT:
    return ((Dict *)x)->kind == DICT_SET         ? TY_SET
           : ((Dict *)x)->kind == DICT_FROZENSET ? TY_FROZENSET
                                                 : TY_DICT;
  case V_RANGE: return TY_RANGE;
  case V_SLICE: return TY_SLICE;
  case V_BUILTIN: return ((Builtin *)x)->is_class ? TY_TYPE : -1;
  case V_BOUND: return ((BoundMethod *)x)->is_class ? TY_TYPE : -1;   /* ValueError */
  default: return -1;
  }
}

/* The class of a value none of types[] is for. */
static Value *kind_class(Value *x) {
  if (x->type != V_OPAQUE) return x->type < V_TYPE_COUNT ? kind_classes[x->type] : NULL;
  const char *name = val_type_name(x);
  for (size_t i = 0; i < N_ITER_CLASSES; i++)
    if (iter_classes[i] && !strcmp(name, iter_class_names[i])) return iter_classes[i];
  for (size_t i = 0; i < N_OPAQUE_CLASSES; i++)
    if (!strcmp(name, opaque_names[i])) return opaque_classes[i];
  return kind_classes[V_OPAQUE];
}

Value *builtins_type_of(Value *x) {
  Value *user = cls_class_of(x);   /* an instance of a class statement's class */
  if (user) return val_incref(user);
  if (cls_is_class(x)) return val_incref(types[TY_TYPE]);
  Value *coll = stdmod_class_of(x);   /* a deque, an OrderedDict */
  if (coll) return val_incref(coll);
  int t = type_index(x);
  if (t >= 0 && types[t]) return val_incref(types[t]);
  Value *exc = exc_type_of(x);
  if (exc) return exc;
  Value *c = kind_class(x);
  return val_incref(c ? c : kind_classes[V_OPAQUE]);
}

/* isinstance(obj, class_or_tuple): whether type(obj) is the class (or
 * one of them), or a subclass of it: bool of int, an exception class of
 * its bases.  Arg 2 must be a class, as in Python. */
static Value *bi_isinstance(const CallArgs *a) {
  Value *x, *cls;
  Value **slots[] = {&x, &cls};
  if (args_bind("isinstance", a, "obj, class_or_tuple", slots) < 0) return NULL;
  size_t n = 1;
  Value *const *cs = &cls;
  if (cls->type == V_TUPLE) val_seq(cls, &n, &cs);
  Value *tx = builtins_type_of(x);
  if (!tx) return NULL;
  val_decref(tx);   /* a class: the tables hold it */
  for (size_t i = 0; i < n; i++) {
    Value *c = cs[i];
    int e = exc_isinstance(x, c);
    if (e > 0) return val_bool(true);
    if (e == 0) continue;
    if ((e = cls_isinstance(x, c)) >= 0) {
      if (e) return val_bool(true);
      continue;
    }
    if (c == types[TY_TUPLE] && x->type == V_TUPLE) return val_bool(true);   /* a named tuple */
    if (c == types[TY_DICT] && x->type == V_DICT && !val_is_set(x))
      return val_bool(true);   /* an OrderedDict */
    if (c->type != V_BUILTIN || !((Builtin *)c)->is_class)
      return err_set(ERR_TYPE, "isinstance() arg 2 must be a type or tuple of types");
    if (c == tx || (c == types[TY_INT] && tx == types[TY_BOOL])) return val_bool(true);
  }
  return val_bool(false);
}

/* ======================================================================
 * Files and print options
 * ====================================================================== */

static Value *bi_load(const CallArgs *a) {
  Value *path;
  Value **slots[] = {&path};
  if (args_bind("load", a, "file", slots) < 0) return NULL;
  if (path->type != V_STR) return err_set(ERR_TYPE, "load(): file must be a path string");
  return npy_load(str_cstr(path));
}

static Value *bi_save(const CallArgs *a) {
  Value *path, *x;
  Value **slots[] = {&path, &x};
  if (args_bind("save", a, "file, arr", slots) < 0) return NULL;
  if (path->type != V_STR) return err_set(ERR_TYPE, "save(): file must be a path string");
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  if (!IS_ARRAY(xa)) {
    val_decref(xa);
    return err_set(ERR_TYPE, "save() needs a concrete array, not a traced one");
  }
  int rc = npy_save(str_cstr(path), AS_ARRAY(xa));
  val_decref(xa);
  return rc < 0 ? NULL : VAL_NONE;
}

static Value *bi_set_printoptions(const CallArgs *a) {
  Value *prec, *thr, *edge, *lw, *sup;
  Value **slots[] = {&prec, &thr, &edge, &lw, &sup};
  if (args_bind("set_printoptions", a, "precision=, threshold=, edgeitems=, linewidth=, suppress=", slots) < 0)
    return NULL;
  PrintOptions o = print_options;
  int64_t v;
  if (bi_int_arg("set_printoptions", "precision", prec, o.precision, &v) < 0) return NULL;
  o.precision = (int)v;
  if (bi_int_arg("set_printoptions", "threshold", thr, o.threshold, &v) < 0) return NULL;
  o.threshold = v > 0x7fffffff ? 0x7fffffff : (int)v;
  if (bi_int_arg("set_printoptions", "edgeitems", edge, o.edgeitems, &v) < 0) return NULL;
  o.edgeitems = (int)v;
  if (bi_int_arg("set_printoptions", "linewidth", lw, o.linewidth, &v) < 0) return NULL;
  o.linewidth = (int)v;
  if (bi_bool_arg(sup, o.suppress, &o.suppress) < 0) return NULL;
  return print_set_options(&o) < 0 ? NULL : VAL_NONE;
}

/* ======================================================================
 * Registration
 * ====================================================================== */

/* The namespaces, made once by builtins_register (main thread, before any
 * device thread runs); read-only afterwards except through
 * builtins_add_to. */
static Value *ns_jnp, *ns_lax, *ns_nn, *ns_jax, *ns_tree_util, *ns_tree, *ns_functools,
    *ns_special, *ns_scipy, *ns_maps, *ns_random, *ns_sharding, *ns_experimental, *ns_exp_shard_map, *ns_exp_pjit,
    *ns_linalg, *ns_lax_linalg, *ns_scipy_linalg, *ns_custom_derivatives;
/* Python's modules whose names lang/classes_lib.c fills (dataclasses,
 * enum.Enum, typing.NamedTuple, collections.namedtuple); the other names
 * of typing and collections go in beside them with builtins_add_to. */
static Value *ns_dataclasses, *ns_enum, *ns_typing, *ns_collections;

Value *builtins_namespace(const char *name) {
  if (!strcmp(name, "jnp") || !strcmp(name, "jax.numpy")) return ns_jnp;
  if (!strcmp(name, "lax") || !strcmp(name, "jax.lax")) return ns_lax;
  if (!strcmp(name, "jax.nn")) return ns_nn;
  if (!strcmp(name, "jax")) return ns_jax;
  if (!strcmp(name, "jax.tree_util")) return ns_tree_util;
  if (!strcmp(name, "jax.tree")) return ns_tree;
  if (!strcmp(name, "functools")) {   /* stdmod's: partial and the rest */
    Value *ft = stdmod_namespace(name);
    return ft ? ft : ns_functools;
  }
  if (!strcmp(name, "jax.scipy.special")) return ns_special;
  if (!strcmp(name, "jax.scipy")) return ns_scipy;
  if (!strcmp(name, "jax.experimental.maps")) return ns_maps;
  if (!strcmp(name, "jax.experimental")) return ns_experimental;
  if (!strcmp(name, "jax.experimental.shard_map")) return ns_exp_shard_map;   /* JAX's old homes */
  if (!strcmp(name, "jax.experimental.pjit")) return ns_exp_pjit;
  if (!strcmp(name, "jax.random")) return ns_random;
  if (!strcmp(name, "jax.sharding")) return ns_sharding;
  if (!strcmp(name, "jax.custom_derivatives")) return ns_custom_derivatives;
  if (!strcmp(name, "dataclasses")) return ns_dataclasses;
  if (!strcmp(name, "enum")) return ns_enum;
  if (!strcmp(name, "typing") || !strcmp(name, "collections")) {
    Value *m = stdmod_namespace(name);   /* after start-up: with the classes' names */
    return m ? m : builtins_classes_namespace(name);
  }
  if (!strcmp(name, "jax.numpy.linalg")) return ns_linalg;
  if (!strcmp(name, "jax.lax.linalg")) return ns_lax_linalg;
  if (!strcmp(name, "jax.scipy.linalg")) return ns_scipy_linalg;
  Value *np = hostnp_namespace(name);   /* numpy: host NumPy, not jax.numpy */
  return np ? np : stdmod_namespace(name);
}

int builtins_add(Env *e, const char *name, BuiltinFn fn, const char *doc) {
  Value *b = builtin_new(name, fn, doc);
  if (!b) return -1;
  int rc = env_set(e, intern_cstr(name), b);
  val_decref(b);
  return rc;
}

Value *builtins_classes_namespace(const char *name) {
  if (!strcmp(name, "typing")) return ns_typing;
  if (!strcmp(name, "collections")) return ns_collections;
  return NULL;
}

int builtins_add_to(const char *ns, const char *name, Value *v) {
  Value *m = builtins_namespace(ns);
  if (!m) {
    err_set(ERR_NAME, "no namespace '%s'", ns);
    return -1;
  }
  return dict_set_str(((Module *)m)->globals, name, v);
}

/* Binds [v] as [name] in the scopes of [where]. */
static int bind(Env *e, const char *name, Value *v, unsigned where) {
  if ((where & IN_TOP) && env_set(e, intern_cstr(name), v) < 0) return -1;
  if ((where & IN_JNP) && dict_set_str(((Module *)ns_jnp)->globals, name, v) < 0) return -1;
  if ((where & IN_LAX) && dict_set_str(((Module *)ns_lax)->globals, name, v) < 0) return -1;
  if ((where & IN_NN) && dict_set_str(((Module *)ns_nn)->globals, name, v) < 0) return -1;
  if ((where & IN_LINALG) && dict_set_str(((Module *)ns_linalg)->globals, name, v) < 0) return -1;
  if ((where & IN_LAX_LINALG) && dict_set_str(((Module *)ns_lax_linalg)->globals, name, v) < 0)
    return -1;
  return 0;
}

/* A namespace module with an empty globals dict. */
static Value *new_namespace(const char *name) {
  Value *g = dict_new();
  Value *m = g ? module_new(name, g) : NULL;
  val_decref(g);
  return m;
}

/* dtype values: NumPy's names and the short ones; `bool` stays Python's
 * built-in at the top level (jnp.bool and bool_ are the dtype). */
static int bind_dtypes(Env *e) {
  static const char *const extra[][2] = {
    {"bool_", "bool"}, {"int_", "int32"}, {"float_", "float32"}, {NULL, NULL}};
  for (int t = 0; t < DT_COUNT; t++) {
    Value *d = dtype_value((DType)t);
    unsigned top = t == DT_BOOL ? IN_JNP : NP;
    if (bind(e, dt_name((DType)t), d, top) < 0 || bind(e, dt_short((DType)t), d, top) < 0) return -1;
  }
  for (int i = 0; extra[i][0]; i++) {
    DType t;
    dt_parse(extra[i][1], &t);
    if (bind(e, extra[i][0], dtype_value(t), NP) < 0) return -1;
  }
  return 0;
}

/* jnp.pi, jnp.e, jnp.inf, jnp.nan: Python floats, as in JAX; and
 * jnp.newaxis. */
static int bind_constants(Env *e) {
  static const struct { const char *name; double v; } cs[] = {
    {"pi", 3.141592653589793}, {"e", 2.718281828459045}, {"inf", INFINITY}, {"nan", NAN}};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) {
    Value *v = arr_python_float(cs[i].v);
    int rc = v ? bind(e, cs[i].name, v, IN_JNP) : -1;
    val_decref(v);
    if (rc < 0) return -1;
  }
  return bind(e, "newaxis", VAL_NONE, IN_JNP);
}

int builtins_register(Env *e) {
  if (!ns_jnp) {
    ns_jnp = new_namespace("jax.numpy");
    ns_lax = new_namespace("jax.lax");
    ns_nn = new_namespace("jax.nn");
    ns_jax = new_namespace("jax");
    ns_tree_util = new_namespace("jax.tree_util");
    ns_tree = new_namespace("jax.tree");
    ns_functools = new_namespace("functools");
    ns_special = new_namespace("jax.scipy.special");
    ns_scipy = new_namespace("jax.scipy");
    ns_maps = new_namespace("jax.experimental.maps");
    ns_random = new_namespace("jax.random");
    ns_sharding = new_namespace("jax.sharding");
    ns_experimental = new_namespace("jax.experimental");
    ns_exp_shard_map = new_namespace("jax.experimental.shard_map");
    ns_exp_pjit = new_namespace("jax.experimental.pjit");
    ns_linalg = new_namespace("jax.numpy.linalg");
    ns_lax_linalg = new_namespace("jax.lax.linalg");
    ns_scipy_linalg = new_namespace("jax.scipy.linalg");
    ns_custom_derivatives = new_namespace("jax.custom_derivatives");
    ns_dataclasses = new_namespace("dataclasses");
    ns_enum = new_namespace("enum");
    ns_typing = new_namespace("typing");
    ns_collections = new_namespace("collections");
    if (!ns_jnp || !ns_lax || !ns_nn || !ns_jax || !ns_tree_util || !ns_tree || !ns_functools ||
        !ns_special || !ns_scipy || !ns_maps || !ns_random || !ns_sharding || !ns_experimental ||
        !ns_exp_shard_map || !ns_exp_pjit || !ns_linalg || !ns_lax_linalg || !ns_scipy_linalg || !ns_dataclasses || !ns_enum ||
        !ns_typing || !ns_collections || !ns_custom_derivatives ||
        dict_set_str(((Module *)ns_jnp)->globals, "linalg", ns_linalg) < 0 ||
        dict_set_str(((Module *)ns_lax)->globals, "linalg", ns_lax_linalg) < 0 ||
        dict_set_str(((Module *)ns_scipy)->globals, "linalg", ns_scipy_linalg) < 0)
      return -1;
  }
  static const BiEntry *const tables[] = {bi_array_table, bi_math_table, bi_reduce_table,
                                           bi_lax_table, bi_linalg_table, bi_python_table, bi_set_table};
  for (size_t t = 0; t < sizeof tables / sizeof tables[0]; t++)
    for (const BiEntry *b = tables[t]; b->name; b++) {
      Value *v = builtin_new(b->name, b->fn, b->doc);
      if (v && b->where & IN_TOP) note_type(v);
      if (v && (tables[t] == bi_python_table || tables[t] == bi_set_table))
        ((Builtin *)v)->python = true;
      int rc = v ? bind(e, b->name, v, b->where) : -1;
      val_decref(v);
      if (rc < 0) return -1;
    }
  if (bind_dtypes(e) < 0 || bind_constants(e) < 0 || kind_classes_make() < 0) return -1;
  Value *pf = builtin_new("partial", bi_partial, "partial(func, *args, **keywords)");
  int prc = pf ? builtins_add_to("functools", "partial", pf) : -1;
  if (pf) val_decref(pf);
  if (prc < 0) return -1;
  Value *lse = dict_get_str(((Module *)ns_nn)->globals, "logsumexp");
  if (lse && dict_set_str(((Module *)ns_special)->globals, "logsumexp", lse) < 0) return -1;
  Value *erf = dict_get_str(((Module *)ns_lax)->globals, "erf");
  if (erf && dict_set_str(((Module *)ns_special)->globals, "erf", erf) < 0) return -1;
  Value *ei = dict_get_str(((Module *)ns_lax)->globals, "erf_inv");
  if (ei && dict_set_str(((Module *)ns_special)->globals, "erfinv", ei) < 0) return -1;
  /* jax.Array and jnp.ndarray, the array type of type(), isinstance and
   * annotations ("an array, not a Python number"); called, it makes an
   * array as jnp.array does */
  Value *arr = dict_get_str(((Module *)ns_jnp)->globals, "array");
  Value *at = arr ? builtin_new("Array", ((Builtin *)arr)->fn, "jax.Array: the array type") : NULL;
  if (at) note_type(at);
  int arc = at && dict_set_str(((Module *)ns_jax)->globals, "Array", at) == 0 &&
                    dict_set_str(((Module *)ns_jnp)->globals, "ndarray", at) == 0 ? 0 : -1;
  val_decref(at);
  if (arc < 0) return -1;
  Value *jg = ((Module *)ns_jax)->globals;
  if (dict_set_str(jg, "numpy", ns_jnp) < 0 || dict_set_str(jg, "lax", ns_lax) < 0 ||
      dict_set_str(jg, "nn", ns_nn) < 0 || dict_set_str(jg, "tree_util", ns_tree_util) < 0 ||
      dict_set_str(jg, "tree", ns_tree) < 0 || dict_set_str(jg, "random", ns_random) < 0 ||
      dict_set_str(jg, "custom_derivatives", ns_custom_derivatives) < 0 ||
      dict_set_str(jg, "sharding", ns_sharding) < 0 || dict_set_str(jg, "experimental", ns_experimental) < 0 ||
      dict_set_str(jg, "scipy", ns_scipy) < 0 ||
      dict_set_str(((Module *)ns_scipy)->globals, "special", ns_special) < 0 ||
      dict_set_str(((Module *)ns_experimental)->globals, "maps", ns_maps) < 0 ||
      dict_set_str(((Module *)ns_experimental)->globals, "shard_map", ns_exp_shard_map) < 0 ||
      dict_set_str(((Module *)ns_experimental)->globals, "pjit", ns_exp_pjit) < 0 ||
      pytree_register() < 0 || builtins_random_register(e) < 0 ||
      stdmod_register(dict_get_str(((Module *)ns_functools)->globals, "partial")) < 0)
    return -1;
  if (env_set(e, intern_cstr("jnp"), ns_jnp) < 0 || env_set(e, intern_cstr("lax"), ns_lax) < 0 ||
      env_set(e, intern_cstr("jax"), ns_jax) < 0)
    return -1;
  /* the script's __name__ (an imported module binds its own name) */
  Value *main_name = str_from("__main__");
  int nrc = main_name ? env_set(e, intern_cstr("__name__"), main_name) : -1;
  val_decref(main_name);
  return nrc;
}

/* The names this file binds, and where (builtins_impl.h). */
const BiEntry bi_python_table[] = {
  {"len", bi_len, IN_TOP, "len(obj)"},
  {"ord", bi_ord, IN_TOP, "ord(c): the code point of a one-character string"},
  {"chr", bi_chr, IN_TOP, "chr(i): the one-character string of code point i"},
  {"perf_counter", bi_perf_counter, IN_TOP, "perf_counter(): seconds of a monotonic clock (float64)"},
  {"range", bi_range, IN_TOP, "range(stop) or range(start, stop, step=1)"},
  {"slice", bi_slice, IN_TOP, "slice(stop) or slice(start, stop, step=None)"},
  {"print", bi_print, IN_TOP, "print(*args, sep=' ', end='\\n')"},
  {"str", bi_str, IN_TOP, "str(object)"},
  {"repr", bi_repr, IN_TOP, "repr(obj)"},
  {"ascii", bi_ascii, IN_TOP, "ascii(obj): repr with non-ASCII characters escaped"},
  {"int", bi_int, IN_TOP, "int(x, base=10)"},
  {"float", bi_float, IN_TOP, "float(x)"},
  {"bool", bi_bool, IN_TOP, "bool(x): truth value"},
  {"list", bi_list, IN_TOP, "list(iterable)"},
  {"tuple", bi_tuple, IN_TOP, "tuple(iterable)"},
  {"dict", bi_dict, IN_TOP, "dict(pairs or **kwargs)"},
  {"enumerate", bi_enumerate, IN_TOP, "enumerate(iterable, start=0)"},
  {"zip", bi_zip, IN_TOP, "zip(*iterables)"},
  {"map", bi_map, IN_TOP, "map(function, *iterables): an iterator"},
  {"filter", bi_filter, IN_TOP, "filter(function, iterable): an iterator"},
  {"sum", bi_sum, IN_TOP, "sum(a, axis=None, ...) on arrays; Python's sum on lists"},
  {"max", bi_max, IN_TOP, "max(a, axis=None) on an array; Python's max of several values"},
  {"min", bi_min, IN_TOP, "min(a, axis=None) on an array; Python's min of several values"},
  {"pow", bi_pow, IN_TOP, "pow(base, exp, mod=None): base ** exp, or (base ** exp) % mod of ints"},
  {"sorted", bi_sorted, IN_TOP, "sorted(iterable, key=None, reverse=False)"},
  {"reversed", bi_reversed, IN_TOP, "reversed(sequence): an iterator"},
  {"isinstance", bi_isinstance, IN_TOP, "isinstance(obj, class_or_tuple): int, float, str, jax.Array, type(v), ..."},
  {"dir", bi_dir, IN_TOP, "dir([obj]): the names in scope, or obj's attributes, sorted"},
  {"help", bi_help, IN_TOP, "help(obj): a built-in's signature and summary"},
  {"type", bi_type, IN_TOP, "type(object): its class (int, float, str, list, jax.Array, NoneType, function, ...)"},
  {"getattr", bi_getattr, IN_TOP, "getattr(object, name, default=None)"},
  {"hasattr", bi_hasattr, IN_TOP, "hasattr(obj, name)"},
  {"callable", bi_callable, IN_TOP, "callable(obj): whether obj can be called"},
  {"iter", bi_iter, IN_TOP, "iter(object): an iterator over its items"},
  {"next", bi_next, IN_TOP, "next(iterator[, default]): its next item"},
  {"load", bi_load, NP, "load(file): reads a .npy file"},
  {"save", bi_save, NP, "save(file, arr): writes a .npy file"},
  {"set_printoptions", bi_set_printoptions, NP, "set_printoptions(precision=, threshold=, edgeitems=, linewidth=, suppress=)"},
  {NULL, NULL, 0, NULL},
};
