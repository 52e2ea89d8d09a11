/*
 * ops_attr.c - obj.name: the attributes and methods of arrays (the jnp
 * functions as methods, .shape, .T, .at, .tolist, ...), dicts, lists,
 * strings (str.format itself is ops_format.c), modules and dtypes, and
 * the hooks through which later subsystems give their own types
 * attributes.
 */
#define _GNU_SOURCE   /* memmem */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array/array.h"
#include "lang/builtins.h"
#include "lang/classes.h"
#include "base/error.h"
#include "base/suggest.h"
#include "lang/eval.h"
#include "base/intern.h"
#include "base/mem.h"
#include "base/strbuf.h"
#include "base/utf8.h"
#include "lang/hostnp.h"
#include "lang/ops.h"
#include "lang/ops_impl.h"
#include "lang/stdmod.h"
#include "array/prim.h"
#include "array/print.h"

/* ======================================================================
 * Attributes and methods
 * ====================================================================== */

static Value *(*getattr_hooks[V_TYPE_COUNT])(Value *self, const char *name);

void ops_register_getattr(VType t, Value *(*fn)(Value *self, const char *name)) {
  getattr_hooks[t] = fn;
}

static bool (*equal_hooks[V_TYPE_COUNT])(Value *a, Value *b);

void ops_register_equal(VType t, bool (*fn)(Value *a, Value *b)) { equal_hooks[t] = fn; }

int ops_equal_hook(Value *a, Value *b) {
  if (a->type != b->type || !equal_hooks[a->type]) return -1;
  return equal_hooks[a->type](a, b);
}

/* Calls the jnp built-in [name] with [self] prepended to [a]. */
static Value *forward(const char *name, Value *self, const CallArgs *a) {
  Value *ns = builtins_namespace("jnp");
  Value *fn = ns ? dict_get_str(((Module *)ns)->globals, name) : NULL;
  if (!fn) return err_set(ERR_ATTRIBUTE, "'array' object has no attribute '%s'", name);
  Value *args[40];
  if (a->nargs >= 39) return err_set(ERR_TYPE, "%s() got too many arguments", name);
  args[0] = self;
  for (int i = 0; i < a->nargs; i++) args[i + 1] = a->args[i];
  CallArgs b = {a->nargs + 1, args, a->nkw, a->kwnames, a->kwvals};
  return val_call(fn, &b);
}

#define FORWARD(NAME)                                              \
  static Value *m_##NAME(Value *self, const CallArgs *a) {         \
    return forward(#NAME, self, a);                                \
  }
FORWARD(sum) FORWARD(mean) FORWARD(max) FORWARD(min) FORWARD(prod)
FORWARD(argmax) FORWARD(argmin) FORWARD(astype) FORWARD(std) FORWARD(var)
FORWARD(cumsum) FORWARD(clip) FORWARD(round) FORWARD(all) FORWARD(any)
FORWARD(squeeze) FORWARD(dot) FORWARD(sort) FORWARD(flatten)
FORWARD(ravel) FORWARD(swapaxes) FORWARD(conj) FORWARD(conjugate)
#undef FORWARD

/* Shape from varargs (`x.reshape(2, 3)`) or one tuple (`x.reshape((2, 3))`). */
static int varargs_shape(const CallArgs *a, const char *fname, int *nd, int64_t *shape) {
  if (a->nargs == 1 && (ops_is_seq(a->args[0]) || ops_is_array(a->args[0])))
    return ops_shape_arg(a->args[0], nd, shape);
  if (a->nargs > SHM_MAXDIM) {
    err_set(ERR_VALUE, "%s: too many dimensions", fname);
    return -1;
  }
  for (int i = 0; i < a->nargs; i++) {
    int one;
    if (ops_shape_arg(a->args[i], &one, &shape[i]) < 0 || one != 1) return -1;
  }
  *nd = a->nargs;
  return 0;
}

static Value *m_reshape(Value *self, const CallArgs *a) {
  for (int k = 0; k < a->nkw; k++)
    if (strcmp(a->kwnames[k], "order") && strcmp(a->kwnames[k], "shape"))
      return err_set(ERR_TYPE, "reshape() got an unexpected keyword argument '%s'", a->kwnames[k]);
  int nd;
  int64_t shape[SHM_MAXDIM];
  for (int k = 0; k < a->nkw; k++)
    if (!strcmp(a->kwnames[k], "shape")) {
      if (ops_shape_arg(a->kwvals[k], &nd, shape) < 0) return NULL;
      return ops_reshape(self, nd, shape);
    }
  if (varargs_shape(a, "reshape", &nd, shape) < 0) return NULL;
  return ops_reshape(self, nd, shape);
}

static Value *m_transpose(Value *self, const CallArgs *a) {
  AVal av;
  if (ops_aval(self, &av) < 0) return NULL;
  int perm[SHM_MAXDIM];
  if (a->nargs == 0 || (a->nargs == 1 && a->args[0] == VAL_NONE)) {
    for (int i = 0; i < av.ndim; i++) perm[i] = av.ndim - 1 - i;
    return ops_transpose(self, av.ndim, perm);
  }
  int nd;
  int64_t axes[SHM_MAXDIM];
  if (varargs_shape(a, "transpose", &nd, axes) < 0) return NULL;
  if (nd != av.ndim) return err_set(ERR_VALUE, "axes don't match array");
  bool seen[SHM_MAXDIM] = {false};
  for (int i = 0; i < nd; i++) {
    if (axis_normalize(axes[i], av.ndim, &perm[i]) < 0) return NULL;
    if (seen[perm[i]]) return err_set(ERR_VALUE, "repeated axis in transpose");
    seen[perm[i]] = true;
  }
  return ops_transpose(self, nd, perm);
}

/* Element [i] of [a] as a Python number (a bool, int or float). */
static Value *py_scalar(Array *a, int64_t i) {
  if (a->dtype == DT_BOOL) return val_bool(arr_get_i64(a, i) != 0);
  if (dt_is_int(a->dtype)) return val_int(arr_get_i64(a, i));
  return arr_python_float(arr_get_f64(a, i));  /* a double, as NumPy's item() */
}

static Value *tolist_rec(Array *a, int depth, int64_t *pos) {
  if (depth == a->ndim) {
    Value *s = py_scalar(a, *pos);
    (*pos)++;
    return s;
  }
  Value *l = list_new((size_t)a->shape[depth]);
  for (int64_t i = 0; l && i < a->shape[depth]; i++) {
    Value *e = tolist_rec(a, depth + 1, pos);
    if (!e || list_append_steal(l, e) < 0) {
      val_decref(l);
      return NULL;
    }
  }
  return l;
}

/* Concrete array behind [self], or an error naming the method. */
static Array *concrete(Value *self, const char *what) {
  if (IS_ARRAY(self)) return AS_ARRAY(self);
  err_set(ERR_TYPE, "%s() needs a concrete value, but was called on a traced array under jit", what);
  return NULL;
}

static Value *m_tolist(Value *self, const CallArgs *a) {
  Value **slots[] = {NULL};
  if (args_bind("tolist", a, "", slots) < 0) return NULL;
  Array *x = concrete(self, "tolist");
  int64_t pos = 0;
  return x ? tolist_rec(x, 0, &pos) : NULL;
}

static Value *m_item(Value *self, const CallArgs *a) {
  Array *x = concrete(self, "item");
  if (!x) return NULL;
  if (a->nargs == 0) {
    if (x->size != 1)
      return err_set(ERR_VALUE, "can only convert an array of size 1 to a Python scalar");
    return py_scalar(x, 0);
  }
  int64_t i;
  if (arr_to_index(a->args[0], &i) < 0) return NULL;
  if (i < 0) i += x->size;
  if (i < 0 || i >= x->size) return err_set(ERR_INDEX, "index %lld is out of bounds for size %lld", (long long)i, (long long)x->size);
  return py_scalar(x, i);
}

static Value *m_copy(Value *self, const CallArgs *a) {
  Value **slots[] = {NULL};
  if (args_bind("copy", a, "", slots) < 0) return NULL;
  return ops_unary_prim(P_COPY, self);
}

static Value *m_block_until_ready(Value *self, const CallArgs *a) {
  return val_incref(self);
}

/* The AttributeError of [obj] lacking [s]'s name, with Python 3.12's
 * "Did you mean" over [ms] and what [s] was offered already. */
static Value *no_attribute(Value *obj, const Method *ms, Suggest *s) {
  for (const Method *m = ms; m && m->name; m++) suggest_offer(s, m->name);
  const char *best = suggest_best(s);
  if (best)
    return err_set(ERR_ATTRIBUTE, "'%s' object has no attribute '%s'. Did you mean: '%s'?",
                   val_type_name(obj), s->name, best);
  return err_set(ERR_ATTRIBUTE, "'%s' object has no attribute '%s'", val_type_name(obj), s->name);
}

static const Method array_methods[] = {
  {"reshape", m_reshape}, {"astype", m_astype}, {"sum", m_sum}, {"mean", m_mean},
  {"max", m_max}, {"min", m_min}, {"prod", m_prod}, {"argmax", m_argmax},
  {"argmin", m_argmin}, {"tolist", m_tolist}, {"transpose", m_transpose},
  {"flatten", m_flatten}, {"ravel", m_ravel}, {"squeeze", m_squeeze}, {"item", m_item},
  {"copy", m_copy}, {"std", m_std}, {"var", m_var}, {"cumsum", m_cumsum},
  {"clip", m_clip}, {"round", m_round}, {"all", m_all}, {"any", m_any}, {"dot", m_dot},
  {"sort", m_sort}, {"swapaxes", m_swapaxes}, {"conj", m_conj}, {"conjugate", m_conjugate},
  {"block_until_ready", m_block_until_ready},
  {NULL, NULL},
};

/* ---- the methods of Python numbers ------------------------------------- */

/* int.bit_length(): the bits of |n|, without the sign and leading zeros. */
static Value *pn_bit_length(Value *self, const CallArgs *a) {
  Value **slots[] = {NULL};
  if (args_bind("bit_length", a, "", slots) < 0) return NULL;
  int64_t n = arr_get_i64(AS_ARRAY(self), 0);
  uint64_t u = n < 0 ? 0 - (uint64_t)n : (uint64_t)n;
  return val_int(u ? 64 - __builtin_clzll(u) : 0);
}

/* int.bit_count(): the ones in the binary digits of |n|. */
static Value *pn_bit_count(Value *self, const CallArgs *a) {
  Value **slots[] = {NULL};
  if (args_bind("bit_count", a, "", slots) < 0) return NULL;
  int64_t n = arr_get_i64(AS_ARRAY(self), 0);
  return val_int(__builtin_popcountll(n < 0 ? 0 - (uint64_t)n : (uint64_t)n));
}

/* float.is_integer() (and int's, as Python 3.12's): finite and whole. */
static Value *pn_is_integer(Value *self, const CallArgs *a) {
  Value **slots[] = {NULL};
  if (args_bind("is_integer", a, "", slots) < 0) return NULL;
  Array *x = AS_ARRAY(self);
  if (!dt_is_float(x->dtype)) return val_bool(true);
  double d = arr_host_f64(x);
  return val_bool(isfinite(d) && d == floor(d));
}

/* as_integer_ratio(): the fraction in lowest terms, positive denominator;
 * a float's is exact (its mantissa over a power of two). */
static Value *pn_as_integer_ratio(Value *self, const CallArgs *a) {
  Value **slots[] = {NULL};
  if (args_bind("as_integer_ratio", a, "", slots) < 0) return NULL;
  Array *x = AS_ARRAY(self);
  int64_t num, den = 1;
  if (!dt_is_float(x->dtype)) {
    num = arr_get_i64(x, 0);
  } else {
    double d = arr_host_f64(x);
    if (isnan(d)) return err_set(ERR_VALUE, "cannot convert NaN to integer ratio");
    if (isinf(d)) return err_set(ERR_OVERFLOW, "cannot convert Infinity to integer ratio");
    int e;
    double m = frexp(d, &e);   /* d = m 2^e, 0.5 <= |m| < 1 */
    for (int i = 0; i < 300 && m != floor(m); i++) m *= 2, e--;
    while (e < 0 && fmod(m, 2) == 0) m /= 2, e++;
    if (fabs(m) >= 9.2e18 || e >= 63 || e < -62 || (e > 0 && fabs(ldexp(m, e)) >= 9.2e18))
      return err_set(ERR_OVERFLOW, "the ratio of %.17g does not fit 64-bit Python ints", d);
    num = e > 0 ? (int64_t)ldexp(m, e) : (int64_t)m;
    den = e < 0 ? (int64_t)1 << -e : 1;
  }
  Value *p = val_int(num), *q = val_int(den);
  Value *r = p && q ? tuple_pack(2, (Value *[]){p, q}) : NULL;
  if (p) val_decref(p);
  if (q) val_decref(q);
  return r;
}

/* A Python number as itself, a bool as its int (True.real is 1). */
static Value *as_number(Value *x) {
  Array *a = AS_ARRAY(x);
  return a->dtype == DT_BOOL ? val_int(arr_get_i64(a, 0)) : val_incref(x);
}

/* conjugate(): a real number is its own. */
static Value *pn_conjugate(Value *self, const CallArgs *a) {
  Value **slots[] = {NULL};
  if (args_bind("conjugate", a, "", slots) < 0) return NULL;
  return as_number(self);
}

static const Method int_methods[] = {
  {"bit_length", pn_bit_length}, {"bit_count", pn_bit_count}, {"is_integer", pn_is_integer},
  {"as_integer_ratio", pn_as_integer_ratio}, {"conjugate", pn_conjugate}, {NULL, NULL}};
static const Method float_methods[] = {
  {"is_integer", pn_is_integer}, {"as_integer_ratio", pn_as_integer_ratio},
  {"conjugate", pn_conjugate}, {NULL, NULL}};

/* An attribute of a Python int, bool or float (a host number, array.h):
 * Python's methods and real, imag, numerator, denominator; NULL without
 * an error for any other name (the array's attributes follow, as a
 * Python number used as an array in JAX has them). */
static Value *python_number_attr(Value *x, const char *name) {
  Array *a = AS_ARRAY(x);
  bool fl = dt_is_float(a->dtype);
  if (!strcmp(name, "real")) return as_number(x);
  if (!strcmp(name, "imag")) return fl ? arr_python_float(0) : val_int(0);
  if (!fl && !strcmp(name, "numerator")) return as_number(x);
  if (!fl && !strcmp(name, "denominator")) return val_int(1);
  for (const Method *m = fl ? float_methods : int_methods; m->name; m++)
    if (!strcmp(m->name, name)) return bound_new(m->name, m->fn, x);
  return NULL;
}

static Value *array_getattr(Value *x, const char *name) {
  if (arr_is_host(x) && AS_ARRAY(x)->ndim == 0) {
    Value *r = python_number_attr(x, name);
    if (r || err_occurred()) return r;
  }
  AVal av;
  if (ops_aval(x, &av) < 0) return NULL;
  if (!strcmp(name, "real") || !strcmp(name, "imag")) {   /* properties, as jax.Array's */
    CallArgs none = {0};
    return forward(name, x, &none);
  }
  if (!strcmp(name, "shape")) return val_int_tuple(av.ndim, av.shape);
  if (!strcmp(name, "dtype")) return dtype_value(av.dtype);
  if (!strcmp(name, "ndim")) return val_int(av.ndim);
  if (!strcmp(name, "size")) return val_int(shape_size(av.ndim, av.shape));
  if (!strcmp(name, "itemsize")) return val_int((int64_t)dt_size(av.dtype));
  if (!strcmp(name, "nbytes")) return val_int((int64_t)dt_size(av.dtype) * shape_size(av.ndim, av.shape));
  if (!strcmp(name, "weak_type")) return val_bool(av.weak);
  if (!strcmp(name, "named_shape")) return ops_named_shape_hook ? ops_named_shape_hook(x) : dict_new();
  if (!strcmp(name, "at")) return ops_at_new(x, NULL);
  if (ops_array_attr_hook) {
    Value *r = ops_array_attr_hook(x, name);
    if (r || err_occurred()) return r;
  }
  if (!strcmp(name, "T") || !strcmp(name, "mT")) {
    int perm[SHM_MAXDIM];
    for (int i = 0; i < av.ndim; i++) perm[i] = av.ndim - 1 - i;
    if (name[0] == 'm') {
      if (av.ndim < 2) return err_set(ERR_VALUE, "matrix transpose with ndim < 2 is undefined");
      for (int i = 0; i < av.ndim; i++) perm[i] = i;
      perm[av.ndim - 2] = av.ndim - 1;
      perm[av.ndim - 1] = av.ndim - 2;
    }
    return ops_transpose(x, av.ndim, perm);
  }
  for (const Method *m = array_methods; m->name; m++)
    if (!strcmp(m->name, name)) return bound_new(m->name, m->fn, x);
  static const char *const props[] = {"shape", "dtype", "ndim", "size", "itemsize", "nbytes",
                                      "weak_type", "at", "T", "mT", "named_shape", "real", "imag",
                                      NULL};
  Suggest s;
  suggest_init(&s, name);
  for (int i = 0; props[i]; i++) suggest_offer(&s, props[i]);
  return no_attribute(x, array_methods, &s);
}

/* ---- dict, list and str methods ----------------------------------------- */

static Value *dict_view(Value *d, int which) {
  Dict *dd = (Dict *)d;
  Value *l = list_new(dd->len);
  for (size_t i = 0; l && i < dd->len; i++) {
    Value *e;
    if (which == 0) e = val_incref(dd->keys[i]);
    else if (which == 1) e = val_incref(dd->vals[i]);
    else e = tuple_pack(2, (Value *[]){dd->keys[i], dd->vals[i]});
    if (!e || list_append_steal(l, e) < 0) {
      val_decref(l);
      return NULL;
    }
  }
  return l;
}

static Value *d_keys(Value *self, const CallArgs *a) {
  Value **slots[] = {NULL};
  return args_bind("keys", a, "", slots) < 0 ? NULL : dict_view(self, 0);
}
static Value *d_values(Value *self, const CallArgs *a) {
  Value **slots[] = {NULL};
  return args_bind("values", a, "", slots) < 0 ? NULL : dict_view(self, 1);
}
static Value *d_items(Value *self, const CallArgs *a) {
  Value **slots[] = {NULL};
  return args_bind("items", a, "", slots) < 0 ? NULL : dict_view(self, 2);
}
static Value *d_get(Value *self, const CallArgs *a) {
  Value *k, *dflt;
  Value **slots[] = {&k, &dflt};
  if (args_bind("get", a, "key, default=", slots) < 0) return NULL;
  Value *v = dict_get(self, k);
  if (!v && err_occurred()) return NULL;
  return val_incref(v ? v : dflt ? dflt : VAL_NONE);
}

/* KeyError: the key's repr, as d[key] says it (ops_index.c). */
static Value *key_error(Value *k) {
  Value *rs = val_repr(k);
  if (rs) {
    err_set(ERR_INDEX, "KeyError: %s", str_cstr(rs));
    val_decref(rs);
  }
  return NULL;
}

/* Sets each (key, value) of [src]: a dict, or an iterable of pairs
 * (Python's dict.update); then the keyword arguments of [a]. */
static int dict_update_from(Value *d, Value *src, const CallArgs *a) {
  if (src && src->type == V_DICT) {
    Dict *s = (Dict *)src;
    for (size_t i = 0; i < s->len; i++)
      if (dict_set(d, s->keys[i], s->vals[i]) < 0) return -1;
  } else if (src) {
    Value *items = ops_iter_items(src);
    if (!items) return -1;
    for (size_t i = 0; i < list_len(items); i++) {
      size_t n;
      Value *const *kv;
      bool seq = val_seq(list_get(items, i), &n, &kv);
      if (!seq || n != 2) {
        val_decref(items);
        if (!seq)
          return err_set(ERR_TYPE, "cannot convert dictionary update sequence element #%zu to a "
                                   "sequence", i), -1;
        return err_set(ERR_VALUE, "dictionary update sequence element #%zu has length %zu; 2 is "
                                  "required", i, n), -1;
      }
      if (dict_set(d, kv[0], kv[1]) < 0) return val_decref(items), -1;
    }
    val_decref(items);
  }
  for (int i = 0; i < a->nkw; i++) {
    Value *k = str_from(a->kwnames[i]);
    int rc = k ? dict_set(d, k, a->kwvals[i]) : -1;
    if (k) val_decref(k);
    if (rc < 0) return -1;
  }
  return 0;
}

/* d.update([other], **kw) */
static Value *d_update(Value *self, const CallArgs *a) {
  if (a->nargs > 1)
    return err_set(ERR_TYPE, "update expected at most 1 argument, got %d", a->nargs);
  if (val_check_container(self) < 0) return NULL;
  return dict_update_from(self, a->nargs ? a->args[0] : NULL, a) < 0 ? NULL : VAL_NONE;
}

/* d.pop(key[, default]): KeyError without a default. */
static Value *d_pop(Value *self, const CallArgs *a) {
  Value *k, *dflt;
  Value **slots[] = {&k, &dflt};
  if (args_bind("pop", a, "key, default=", slots) < 0 || val_check_container(self) < 0)
    return NULL;
  Value *v = dict_get(self, k);
  if (!v) return err_occurred() ? NULL : dflt ? val_incref(dflt) : key_error(k);
  val_incref(v);
  dict_del(self, k);
  return v;
}

/* d.popitem(): the last pair inserted (LIFO, as Python 3.7+). */
static Value *d_popitem(Value *self, const CallArgs *a) {
  Value **slots[] = {NULL};
  if (args_bind("popitem", a, "", slots) < 0 || val_check_container(self) < 0) return NULL;
  Dict *d = (Dict *)self;
  if (!d->len) return err_set(ERR_INDEX, "KeyError: 'popitem(): dictionary is empty'");
  Value *k = val_incref(d->keys[d->len - 1]);
  Value *t = tuple_pack(2, (Value *[]){k, d->vals[d->len - 1]});
  if (t) dict_del(self, k);
  val_decref(k);
  return t;
}

/* d.setdefault(key, default=None) */
static Value *d_setdefault(Value *self, const CallArgs *a) {
  Value *k, *dflt;
  Value **slots[] = {&k, &dflt};
  if (args_bind("setdefault", a, "key, default=", slots) < 0 || val_check_container(self) < 0)
    return NULL;
  Value *v = dict_get(self, k);
  if (v) return val_incref(v);
  if (err_occurred()) return NULL;
  if (!dflt) dflt = VAL_NONE;
  return dict_set(self, k, dflt) < 0 ? NULL : val_incref(dflt);
}

/* d.copy(): a shallow copy (a plain dict, as dict(d) is). */
static Value *d_copy(Value *self, const CallArgs *a) {
  Value **slots[] = {NULL};
  if (args_bind("copy", a, "", slots) < 0) return NULL;
  Value *d = dict_new();
  CallArgs none = {0};
  if (d && dict_update_from(d, self, &none) < 0) {
    val_decref(d);
    return NULL;
  }
  return d;
}

/* d.clear() */
static Value *d_clear(Value *self, const CallArgs *a) {
  Value **slots[] = {NULL};
  if (args_bind("clear", a, "", slots) < 0 || val_check_container(self) < 0) return NULL;
  Dict *d = (Dict *)self;
  while (d->len) {
    Value *k = val_incref(d->keys[d->len - 1]);
    dict_del(self, k);
    val_decref(k);
  }
  return VAL_NONE;
}

static Value *l_append(Value *self, const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("append", a, "object", slots) < 0) return NULL;
  if (val_check_container(self) < 0) return NULL;
  return list_append(self, x) < 0 ? err_nomem() : VAL_NONE;
}

int ops_list_extend(Value *l, Value *x) {
  if (stdmod_is_deque(l)) return stdmod_deque_extend(l, x);   /* its bound */
  if (val_check_container(l) < 0) return -1;
  Value *items = ops_iter_items(x);
  if (!items) return -1;
  for (size_t i = 0; i < list_len(items); i++)
    if (list_append(l, list_get(items, i)) < 0) {
      val_decref(items);
      return err_nomem(), -1;
    }
  val_decref(items);
  return 0;
}

static Value *l_extend(Value *self, const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("extend", a, "iterable", slots) < 0) return NULL;
  return ops_list_extend(self, x) < 0 ? NULL : VAL_NONE;
}

/* Merges the sorted runs [lo, mid) and [mid, hi) of the positions [v]
 * (into [keys]) through [tmp]; -1 when a comparison fails. */
static int merge_runs(Value **keys, size_t *v, size_t *tmp, size_t lo, size_t mid, size_t hi, bool rev) {
  size_t i = lo, j = mid, k = lo;
  while (i < mid && j < hi) {
    /* Take from the right run only when strictly before: stable. */
    Value *c = ops_compare(rev ? OP_GT : OP_LT, keys[v[j]], keys[v[i]]);
    int t = c ? val_truth(c) : -1;
    val_decref(c);
    if (t < 0) return -1;
    tmp[k++] = t ? v[j++] : v[i++];
  }
  while (i < mid) tmp[k++] = v[i++];
  while (j < hi) tmp[k++] = v[j++];
  memcpy(v + lo, tmp + lo, sizeof *v * (hi - lo));
  return 0;
}

/* The order of [keys] (n of them) in [pos]: bottom-up merge sort. */
static int sort_positions(Value **keys, size_t n, size_t *pos, bool rev) {
  size_t *tmp = shm_calloc(n + 1, sizeof *tmp);
  if (!tmp) return err_nomem(), -1;
  for (size_t i = 0; i < n; i++) pos[i] = i;
  int rc = 0;
  for (size_t w = 1; rc == 0 && w < n; w *= 2)
    for (size_t lo = 0; rc == 0 && lo + w < n; lo += 2 * w)
      rc = merge_runs(keys, pos, tmp, lo, lo + w, lo + 2 * w < n ? lo + 2 * w : n, rev);
  shm_free(tmp);
  return rc;
}

int ops_list_sort(Value *l, Value *key, bool reverse) {
  List *L = (List *)l;
  size_t n = L->len;
  Value **keys = shm_calloc(n + 1, sizeof *keys), **items = shm_calloc(n + 1, sizeof *items);
  size_t *pos = shm_calloc(n + 1, sizeof *pos);
  int rc = keys && items && pos ? 0 : (err_nomem(), -1);
  size_t made = 0;
  for (; rc == 0 && made < n; made++) {
    keys[made] = !key || key == VAL_NONE ? val_incref(L->items[made]) : val_call_n(key, 1, &L->items[made]);
    if (!keys[made]) rc = -1;
  }
  if (rc == 0) rc = sort_positions(keys, n, pos, reverse);
  if (rc == 0 && L->len != n) rc = (err_set(ERR_VALUE, "list modified during sort"), -1);
  if (rc == 0) {
    memcpy(items, L->items, sizeof *items * n);
    for (size_t i = 0; i < n; i++) L->items[i] = items[pos[i]];
  }
  for (size_t i = 0; keys && i < made; i++) val_decref(keys[i]);
  shm_free(keys);
  shm_free(items);
  shm_free(pos);
  return rc;
}

/* list.sort(*, key=None, reverse=False) */
static Value *l_sort(Value *self, const CallArgs *a) {
  Value *key = NULL, *rev = NULL;
  if (a->nargs) return err_set(ERR_TYPE, "sort() takes no positional arguments");
  if (args_bind("sort", a, "key=, reverse=", (Value **[]){&key, &rev}) < 0) return NULL;
  int r = rev ? val_truth(rev) : 0;
  if (val_check_container(self) < 0 || r < 0) return NULL;
  return ops_list_sort(self, key, r) < 0 ? NULL : VAL_NONE;
}

void ops_list_reverse(Value *l) {
  List *L = (List *)l;
  for (size_t i = 0; i < L->len / 2; i++) {
    Value *t = L->items[i];
    L->items[i] = L->items[L->len - 1 - i];
    L->items[L->len - 1 - i] = t;
  }
}

/* list.reverse() */
static Value *l_reverse(Value *self, const CallArgs *a) {
  if (args_bind("reverse", a, "", (Value **[]){NULL}) < 0 || val_check_container(self) < 0) return NULL;
  ops_list_reverse(self);
  return VAL_NONE;
}

static Value *l_pop(Value *self, const CallArgs *a) {
  Value *iv;
  Value **slots[] = {&iv};
  if (args_bind("pop", a, "index=", slots) < 0) return NULL;
  if (val_check_container(self) < 0) return NULL;
  List *l = (List *)self;
  if (l->len == 0) return err_set(ERR_INDEX, "pop from empty list");
  int64_t i = (int64_t)l->len - 1;
  if (iv && ops_seq_index(iv, (int64_t)l->len, "pop", &i) < 0) return NULL;
  Value *r = l->items[i];
  memmove(&l->items[i], &l->items[i + 1], sizeof(Value *) * (l->len - (size_t)i - 1));
  l->len--;
  return r;
}

static Value *l_insert(Value *self, const CallArgs *a) {
  Value *iv, *x;
  Value **slots[] = {&iv, &x};
  if (args_bind("insert", a, "index, object", slots) < 0) return NULL;
  if (val_check_container(self) < 0) return NULL;
  int64_t i;
  if (arr_to_index(iv, &i) < 0) return NULL;
  List *l = (List *)self;
  if (i < 0) i += (int64_t)l->len;
  if (i < 0) i = 0;
  if (i > (int64_t)l->len) i = (int64_t)l->len;
  if (list_append(self, x) < 0) return err_nomem();
  memmove(&l->items[i + 1], &l->items[i], sizeof(Value *) * (l->len - (size_t)i - 1));
  l->items[i] = val_incref(x);
  val_decref(x);
  return VAL_NONE;
}

static Value *l_index(Value *self, const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("index", a, "value", slots) < 0) return NULL;
  size_t n;
  Value *const *items;
  val_seq(self, &n, &items);
  for (size_t i = 0; i < n; i++)
    if (items[i] == x || val_equal_key(items[i], x)) return val_int((int64_t)i);
  return self->type == V_TUPLE ? err_set(ERR_VALUE, "tuple.index(x): x not in tuple")
                               : err_set(ERR_VALUE, "value is not in list");
}

/* list.count(value), tuple.count(value) */
static Value *l_count(Value *self, const CallArgs *a) {
  Value *x;
  if (args_bind("count", a, "value", (Value **[]){&x}) < 0) return NULL;
  size_t n;
  Value *const *items;
  val_seq(self, &n, &items);
  int64_t k = 0;
  for (size_t i = 0; i < n; i++) k += items[i] == x || val_equal_key(items[i], x);
  return val_int(k);
}

static const Method dict_methods[] = {
  {"keys", d_keys}, {"values", d_values}, {"items", d_items}, {"get", d_get},
  {"update", d_update}, {"pop", d_pop}, {"popitem", d_popitem}, {"setdefault", d_setdefault},
  {"copy", d_copy}, {"clear", d_clear}, {NULL, NULL}};
static const Method list_methods[] = {
  {"append", l_append}, {"extend", l_extend}, {"pop", l_pop}, {"insert", l_insert},
  {"index", l_index}, {"count", l_count}, {"sort", l_sort}, {"reverse", l_reverse}, {NULL, NULL}};
static const Method tuple_methods[] = {{"index", l_index}, {"count", l_count}, {NULL, NULL}};

static Value *method_of(Value *obj, const Method *ms, const char *name) {
  for (const Method *m = ms; m->name; m++)
    if (!strcmp(m->name, name)) return bound_new(m->name, m->fn, obj);
  Suggest s;
  suggest_init(&s, name);
  return no_attribute(obj, ms, &s);
}

Value *ops_getattr(Value *obj, const char *name) {
  switch (obj->type) {
  case V_ARRAY: case V_TRACER:
    if (arr_np_is_live() && arr_is_np(obj)) return hostnp_method(array_getattr(obj, name));
    return array_getattr(obj, name);
  case V_DICT: {
    if (val_is_set(obj)) return builtins_set_attr(obj, name);
    Value *m = ((Dict *)obj)->kind != DICT_PLAIN ? stdmod_dict_attr(obj, name) : NULL;
    return m || err_occurred() ? m : method_of(obj, dict_methods, name);
  }
  case V_TUPLE:
    if (tuple_class(obj)) return cls_getattr(obj, name);   /* a named tuple's field */
    return method_of(obj, tuple_methods, name);
  case V_LIST:
    if (stdmod_is_deque(obj)) return stdmod_deque_attr(obj, name);
    return method_of(obj, list_methods, name);
  case V_STR: return method_of(obj, ops_str_methods, name);
  case V_MODULE: {
    Module *m = (Module *)obj;
    Value *v = dict_get_str(m->globals, name);
    if (v) return val_incref(v);
    if (eval_module_loading(obj))
      return err_set(ERR_ATTRIBUTE, "partially initialized module '%s' has no attribute '%s' "
                     "(most likely due to a circular import)", m->name, name);
    Suggest s;
    suggest_init(&s, name);
    Dict *g = (Dict *)m->globals;
    for (size_t i = 0; i < g->len; i++)
      if (g->keys[i]->type == V_STR) suggest_offer(&s, str_cstr(g->keys[i]));
    if (suggest_best(&s))
      return err_set(ERR_ATTRIBUTE, "module '%s' has no attribute '%s'. Did you mean: '%s'?",
                     m->name, name, suggest_best(&s));
    return err_set(ERR_ATTRIBUTE, "module '%s' has no attribute '%s'", m->name, name);
  }
  case V_DTYPE: {
    DType t = ((DTypeVal *)obj)->dtype;
    if (!strcmp(name, "name")) return str_from(dt_name(t));
    if (!strcmp(name, "itemsize")) return val_int((int64_t)dt_size(t));
    if (!strcmp(name, "dtype")) return val_incref(obj);
    if (!strcmp(name, "kind"))   /* NumPy's; bfloat16 (ml_dtypes) is 'V' */
      return str_from(t == DT_BOOL ? "b" : t == DT_BF16 ? "V" : dt_is_float(t) ? "f" : "i");
    break;
  }
  case V_SLICE: {
    Slice *s = (Slice *)obj;
    if (!strcmp(name, "start")) return val_incref(s->start);
    if (!strcmp(name, "stop")) return val_incref(s->stop);
    if (!strcmp(name, "step")) return val_incref(s->step);
    break;
  }
  case V_OPAQUE: {
    const OpaqueType *ot = ((Opaque *)obj)->ot;
    if (ot->getattr) return ot->getattr(obj, name);
    break;
  }
  case V_BUILTIN:
    if (!strcmp(name, "__name__")) return str_from(((Builtin *)obj)->name);
    break;
  case V_BOUND:
    if (!strcmp(name, "__name__")) return str_from(((BoundMethod *)obj)->name);
    break;
  default:
    if (getattr_hooks[obj->type]) return getattr_hooks[obj->type](obj, name);
    break;
  }
  return err_set(ERR_ATTRIBUTE, "'%s' object has no attribute '%s'", val_type_name(obj), name);
}

static int add_names(Value *l, const Method *ms) {
  for (const Method *m = ms; m->name; m++)
    if (list_append_steal(l, str_from(m->name)) < 0) return -1;
  return 0;
}

Value *ops_dir(Value *obj) {
  Value *l = list_new(16);
  if (!l) return NULL;
  static const char *const attrs[] = {"shape", "dtype", "ndim", "size", "T", "at", NULL};
  int rc = 0;
  switch (obj->type) {
  case V_ARRAY: case V_TRACER:
    for (int i = 0; attrs[i] && rc == 0; i++) rc = list_append_steal(l, str_from(attrs[i]));
    if (rc == 0) rc = add_names(l, array_methods);
    break;
  case V_DICT:
    if (val_is_set(obj)) {
      val_decref(l);
      return builtins_set_dir(obj);
    }
    rc = add_names(l, dict_methods);
    break;
  case V_LIST: rc = add_names(l, list_methods); break;
  case V_STR: rc = add_names(l, ops_str_methods); break;
  case V_MODULE: {
    Dict *g = (Dict *)((Module *)obj)->globals;
    for (size_t i = 0; i < g->len && rc == 0; i++) rc = list_append(l, g->keys[i]);
    break;
  }
  default: break;
  }
  if (rc < 0) {
    val_decref(l);
    return err_nomem();
  }
  return l;
}
