/*
 * builtins_reduce.c - reductions (sum, mean, var, argmax, cumsum, sort),
 * the jax.nn helpers (logsumexp, softmax, one_hot), isclose/allclose,
 * dynamic_slice and dynamic_update_slice, take and the dtype functions.
 * jnp's dtype rules: sums of bool and int8 accumulate in int32, means and
 * variances are float.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array/array.h"
#include "array/prim.h"
#include "lang/builtins.h"
#include "lang/builtins_impl.h"
#include "base/error.h"
#include "lang/eval.h"
#include "lang/iter.h"
#include "base/intern.h"
#include "base/mem.h"
#include "array/npy.h"
#include "lang/ops.h"
#include "array/prim.h"
#include "array/print.h"

/* ======================================================================
 * Reductions
 * ====================================================================== */

/* Binds (a, axis, dtype, keepdims) and converts [a]; *x new reference. */
typedef struct RedArgs {
  Value *x;
  Value *names;      /* named axes to reduce over too (a tuple), or NULL */
  int naxes, axes[SHM_MAXDIM];
  bool keepdims, all;
  int dtype;
  int64_t ddof;
} RedArgs;

static int red_bind(const char *fname, const CallArgs *a, RedArgs *r, bool with_dtype) {
  Value *x, *axis, *dtype = NULL, *out = NULL, *keepdims, *ddof = NULL, *where = NULL;
  Value **s1[] = {&x, &axis, &dtype, &out, &keepdims, &ddof, &where};
  Value **s2[] = {&x, &axis, &out, &keepdims};
  int rc = with_dtype ? args_bind(fname, a, "a, axis=, dtype=, out=, keepdims=, ddof=, where=", s1)
                      : args_bind(fname, a, "a, axis=, out=, keepdims=", s2);
  if (rc < 0) return -1;
  if (!bi_is_none(out) || !bi_is_none(where)) {
    err_set(ERR_VALUE, "%s: the 'out' and 'where' arguments are not supported", fname);
    return -1;
  }
  if (ops_dtype_arg(dtype, &r->dtype) < 0 || bi_bool_arg(keepdims, false, &r->keepdims) < 0 ||
      bi_int_arg(fname, "ddof", ddof, 0, &r->ddof) < 0)
    return -1;
  Value *pos;
  if (ops_split_named_axes(axis, &pos, &r->names) < 0) return -1;
  r->x = bi_arr(x);
  if (!r->x) {
    if (r->names) val_decref(r->names), val_decref(pos);
    return -1;
  }
  AVal av = bi_aval(r->x);
  r->all = bi_is_none(axis);
  rc = ops_axes_arg(pos, av.ndim, &r->naxes, r->axes);
  if (r->names) val_decref(pos);
  if (rc < 0) {
    val_decref(r->x);
    if (r->names) val_decref(r->names);
    return -1;
  }
  return 0;
}

/* [x] reduced as [id] over [r]'s positions; [x] itself when [r] names
 * axes and gives no position (red_named reduces the names). */
static Value *red_pos(PrimId id, Value *x, RedArgs *r, bool keepdims) {
  if (r->names && r->naxes == 0) return val_incref(x);
  return ops_reduce(id, x, r->naxes, r->axes, keepdims);
}

/* [res] (stolen) reduced over [r]'s named axes too, as [kind]; *size
 * (when not NULL) gets the names' total size (1 without names). */
static Value *red_named(RedArgs *r, Value *res, PrimId kind, int64_t *size) {
  if (size) *size = 1;
  if (!r->names) return res;
  Value *out = res ? ops_named_reduce(kind, res, r->names, size) : NULL;
  if (res) val_decref(res);
  val_decref(r->names);
  r->names = NULL;
  return out;
}

/* [x] reduced as [id] over positions [ax] ([kd]: keepdims), then over
 * the named axes [names] (NULL: none) by their collective. */
static Value *reduce_pos_names(PrimId id, Value *x, int n, const int *ax, bool kd, Value *names) {
  Value *r = n ? ops_reduce(id, x, n, ax, kd) : val_incref(x);
  if (!r || !names) return r;
  Value *t = ops_named_reduce(id, r, names, NULL);
  val_decref(r);
  return t;
}

/* Elements reduced over by [r]. */
static int64_t red_count(RedArgs *r) {
  AVal av = bi_aval(r->x);
  int64_t n = 1;
  for (int i = 0; i < r->naxes; i++) n *= av.shape[r->axes[i]];
  return n;
}

/* sum and prod: bools and small ints accumulate in i32 (jnp's upcast). */
static Value *sum_like(const char *fname, const CallArgs *a, PrimId id) {
  RedArgs r;
  if (red_bind(fname, a, &r, true) < 0) return NULL;
  AVal av = bi_aval(r.x);
  DType t = r.dtype >= 0 ? (DType)r.dtype
            : (av.dtype == DT_BOOL || av.dtype == DT_I8) ? DT_I32 : av.dtype;
  Value *c = ops_convert(r.x, t, av.weak);
  Value *res = c ? red_pos(id, c, &r, r.keepdims) : NULL;
  bi_drop(c, r.x, NULL, NULL);
  return red_named(&r, res, id, NULL);
}

Value *bi_jnp_sum(const CallArgs *a) { return sum_like("sum", a, P_REDUCE_SUM); }
static Value *bi_prod(const CallArgs *a) { return sum_like("prod", a, P_REDUCE_PROD); }

/* max and min: an error on empty reductions, as NumPy. */
static Value *max_like(const char *fname, const CallArgs *a, PrimId id) {
  RedArgs r;
  if (red_bind(fname, a, &r, false) < 0) return NULL;
  AVal av = bi_aval(r.x);
  Value *res = NULL;
  if (shape_size(av.ndim, av.shape) == 0 || red_count(&r) == 0)
    err_set(ERR_VALUE, "zero-size array to reduction operation %s which has no identity",
            id == P_REDUCE_MAX ? "maximum" : "minimum");
  else
    res = red_pos(id, r.x, &r, r.keepdims);
  val_decref(r.x);
  return red_named(&r, res, id, NULL);
}

Value *bi_jnp_max(const CallArgs *a) { return max_like("max", a, P_REDUCE_MAX); }
Value *bi_jnp_min(const CallArgs *a) { return max_like("min", a, P_REDUCE_MIN); }

/* Python's any or all ([want] true: any) of a lazy iterator: its items
 * pulled until one decides, polling Ctrl-C (it may never end). */
static Value *all_lazy(Value *it, bool want) {
  Value *x;
  while ((x = iter_next(it))) {
    int t = val_truth(x);
    val_decref(x);
    if (t < 0) return NULL;
    if (t == want) return val_bool(want);
    if (shm_interrupt_pending()) return err_set(ERR_INTERRUPT, "interrupted");
  }
  return err_occurred() ? NULL : val_bool(!want);
}

/* all and any: reduce_and / reduce_or of the bools; over named axes the
 * minimum / maximum of the bools, which they are. */
static Value *all_like(const char *fname, const CallArgs *a, PrimId id) {
  if (a->nargs == 1 && !a->nkw && iter_is(a->args[0])) return all_lazy(a->args[0], id == P_REDUCE_OR);
  RedArgs r;
  if (red_bind(fname, a, &r, false) < 0) return NULL;
  Value *b = ops_convert(r.x, DT_BOOL, false);
  Value *res = b ? red_pos(id, b, &r, r.keepdims) : NULL;
  bi_drop(b, r.x, NULL, NULL);
  return red_named(&r, res, id == P_REDUCE_AND ? P_REDUCE_MIN : P_REDUCE_MAX, NULL);
}

static Value *bi_all(const CallArgs *a) { return all_like("all", a, P_REDUCE_AND); }
static Value *bi_any(const CallArgs *a) { return all_like("any", a, P_REDUCE_OR); }

/* [r]'s operand in the float dtype mean, var and std compute in. */
static Value *mean_float(RedArgs *r) {
  AVal av = bi_aval(r->x);
  DType t = r->dtype >= 0 ? (DType)r->dtype : dt_float_of(av.dtype);
  return ops_convert(r->x, t, av.weak);
}

/* The sum of [x] over [r]'s positions ([kd]: keepdims) and named axes
 * (which [r] keeps); *count gets the elements summed per result. */
static Value *sum_pos_names(Value *x, RedArgs *r, bool kd, int64_t *count) {
  int64_t nsize = 1;
  Value *s = red_pos(P_REDUCE_SUM, x, r, kd), *t = s;
  if (s && r->names) {
    t = ops_named_reduce(P_REDUCE_SUM, s, r->names, &nsize);
    val_decref(s);
  }
  *count = red_count(r) * nsize;
  return t;
}

/* mean over positions and names: the sum over all of them divided once by
 * their total count, as jnp.mean (its normalizer counts named axes). */
static Value *bi_mean(const CallArgs *a) {
  RedArgs r;
  if (red_bind("mean", a, &r, true) < 0) return NULL;
  int64_t n;
  Value *f = mean_float(&r), *s = f ? sum_pos_names(f, &r, r.keepdims, &n) : NULL;
  Value *m = s ? bi_bin_const(P_DIV, s, (double)n) : NULL;
  bi_drop(f, s, r.x, r.names);
  return m;
}

/* var: mean of squared deviations, divided by N - ddof; over positions
 * and named axes (the mean broadcasts back by name, as jnp.var in xmap). */
static Value *var_of(RedArgs *r) {
  int64_t n;
  Value *f = mean_float(r);
  Value *ms = f ? sum_pos_names(f, r, true, &n) : NULL;
  Value *m = ms ? bi_bin_const(P_DIV, ms, (double)n) : NULL;
  Value *c = m ? bi_bin(P_SUB, f, m) : NULL;
  Value *sq = c ? bi_bin(P_MUL, c, c) : NULL;
  Value *s = sq ? sum_pos_names(sq, r, r->keepdims, &n) : NULL;
  Value *v = s ? bi_bin_const(P_DIV, s, (double)(n - r->ddof)) : NULL;
  bi_drop(f, ms, m, c);
  bi_drop(sq, s, NULL, NULL);
  return v;
}

static Value *bi_var(const CallArgs *a) {
  RedArgs r;
  if (red_bind("var", a, &r, true) < 0) return NULL;
  Value *v = var_of(&r);
  bi_drop(r.x, r.names, NULL, NULL);
  return v;
}

static Value *bi_std(const CallArgs *a) {
  RedArgs r;
  if (red_bind("std", a, &r, true) < 0) return NULL;
  Value *v = var_of(&r);
  Value *s = v ? ops_unary_prim(P_SQRT, v) : NULL;
  bi_drop(v, r.x, r.names, NULL);
  return s;
}

/* lax.[fn]([name]), fn axis_index or axis_size, for a named axis of the
 * enclosing xmap or vmap (or a mesh axis of a shard_map body): a new
 * reference, or NULL with the error set. */
static Value *lax_axis_call(const char *fn, Value *name) {
  Value *ns = builtins_namespace("lax");
  Value *f = ns ? dict_get_str(((Module *)ns)->globals, fn) : NULL;
  if (!f) return err_set(ERR_NAME, "unbound axis name: %s", str_cstr(name));
  return val_call_n(f, 1, &name);
}

/* The size of named axis [name] into *size.  0 or -1. */
static int named_axis_size(Value *name, int64_t *size) {
  Value *v = lax_axis_call("axis_size", name);
  int rc = v ? arr_to_index(v, size) : -1;
  if (v) val_decref(v);
  return rc;
}

/* Each element's index into the axes [items] of [x] (positions, already
 * checked, and names), flattened row-major in the order given (the first
 * varying slowest): int32, broadcastable against [x].  *total gets the
 * product of their sizes.  A new reference, or NULL with the error set. */
static Value *flat_index(Value *x, Value *const *items, size_t n, int64_t *total) {
  AVal av = bi_aval(x);
  Value *idx = NULL;
  *total = 1;
  for (size_t i = 0; i < n && (idx || i == 0); i++) {
    int64_t size = 0, p = 0, ones[SHM_MAXDIM];
    Value *k = NULL;
    int d;
    if (items[i]->type == V_STR) {
      if (named_axis_size(items[i], &size) == 0) k = lax_axis_call("axis_index", items[i]);
    } else if (arr_to_index(items[i], &p) == 0 && axis_normalize(p, av.ndim, &d) == 0) {
      for (int j = 0; j < av.ndim; j++) ones[j] = j == d ? av.shape[d] : 1;
      size = av.shape[d];
      k = bi_iota(DT_I32, av.ndim, ones, d);
    }
    if (!idx) {   /* the first axis */
      idx = k;
    } else {
      Value *sc = k ? bi_bin_const(P_MUL, idx, (double)size) : NULL;
      Value *next = sc ? bi_bin(P_ADD, sc, k) : NULL;
      bi_drop(k, sc, idx, NULL);
      idx = next;
    }
    *total *= size;
  }
  return idx;
}

/* argmax/argmin over axes that name named axes (LANGUAGE.md §10): for one
 * name, the index along it; for a tuple of positions and names, the index
 * into them flattened row-major in the order given (an extension: NumPy
 * takes one position).  The extreme over all of them (max then pmax), then
 * the least index where [x] reaches it (min then pmin), so ties go to the
 * first, and a NaN, which the extreme then is, gives the first NaN, as
 * jnp.argmax.  int32; keepdims keeps the positions as size 1. */
static Value *arg_named(const char *fname, Value *x, Value *axis, PrimId id, bool kd) {
  size_t n = 1;
  Value *const *items = &axis;
  if (axis->type != V_STR) val_seq(axis, &n, &items);
  Value *pos, *names;
  if (ops_split_named_axes(axis, &pos, &names) < 0) return NULL;
  AVal av = bi_aval(x);
  PrimId red = id == P_ARGMAX ? P_REDUCE_MAX : P_REDUCE_MIN;
  int np, ax[SHM_MAXDIM];
  int64_t total;
  Value *r = NULL;
  if (ops_axes_arg(pos, av.ndim, &np, ax) < 0) goto out;
  if (shape_size(av.ndim, av.shape) == 0) {
    err_set(ERR_VALUE, "attempt to get %s of an empty sequence", fname);
    goto out;
  }
  Value *m = reduce_pos_names(red, x, np, ax, true, names);
  Value *eq = m ? bi_bin(P_EQ, x, m) : NULL;
  Value *nan = eq ? bi_bin(P_NE, x, x) : NULL;
  Value *hit = nan ? bi_bin(P_OR, eq, nan) : NULL;
  bi_drop(m, eq, nan, NULL);
  Value *idx = hit ? flat_index(x, items, n, &total) : NULL;
  Value *past = idx ? bi_scalar(DT_I32, (double)total) : NULL;   /* no index reaches it */
  Value *cand = past ? ops_select(hit, idx, past) : NULL;
  bi_drop(hit, idx, past, NULL);
  r = cand ? reduce_pos_names(P_REDUCE_MIN, cand, np, ax, kd, names) : NULL;
  if (cand) val_decref(cand);
out:
  bi_drop(pos, names, NULL, NULL);
  return r;
}

/* Whether an `axis=` argument names a named axis (a str, or one in a
 * tuple or list). */
static bool names_an_axis(Value *axis) {
  size_t n = 1;
  Value *const *items = &axis;
  if (!axis || (axis->type != V_STR && !(bi_is_seq(axis) && val_seq(axis, &n, &items)))) return false;
  for (size_t i = 0; i < n; i++)
    if (items[i]->type == V_STR) return true;
  return false;
}

/* argmax/argmin(a, axis=None, keepdims=False): axis None flattens. */
static Value *arg_like(const char *fname, const CallArgs *a, PrimId id) {
  Value *x, *axis, *out, *keepdims;
  Value **slots[] = {&x, &axis, &out, &keepdims};
  if (args_bind(fname, a, "a, axis=, out=, keepdims=", slots) < 0) return NULL;
  bool kd;
  if (bi_bool_arg(keepdims, false, &kd) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  Value *res = NULL;
  if (names_an_axis(axis)) {
    res = arg_named(fname, xa, axis, id, kd);
  } else if (shape_size(av.ndim, av.shape) == 0) {
    err_set(ERR_VALUE, "attempt to get %s of an empty sequence", fname);
  } else if (bi_is_none(axis)) {
    Value *f = bi_ravel_of(xa);
    int zero = 0;
    Value *r = f ? ops_reduce(id, f, 1, &zero, false) : NULL;
    if (r && kd) {
      int64_t ones[SHM_MAXDIM];
      for (int i = 0; i < av.ndim; i++) ones[i] = 1;
      res = ops_reshape(r, av.ndim, ones);
    } else {
      res = val_incref(r);
    }
    bi_drop(f, r, NULL, NULL);
  } else {
    int n, ax[SHM_MAXDIM];
    if (ops_axes_arg(axis, av.ndim, &n, ax) == 0) {
      if (n != 1) err_set(ERR_TYPE, "%s: axis must be an integer", fname);
      else res = ops_reduce(id, xa, 1, ax, kd);
    }
  }
  val_decref(xa);
  return res;
}

static Value *bi_argmax(const CallArgs *a) { return arg_like("argmax", a, P_ARGMAX); }
static Value *bi_argmin(const CallArgs *a) { return arg_like("argmin", a, P_ARGMIN); }

/* cumsum/cumprod(a, axis=None, dtype=None): axis None flattens. */
static Value *cum_like(const char *fname, const CallArgs *a, PrimId id) {
  Value *x, *axis, *dtype;
  Value **slots[] = {&x, &axis, &dtype};
  if (args_bind(fname, a, "a, axis=, dtype=", slots) < 0) return NULL;
  int t;
  if (ops_dtype_arg(dtype, &t) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  Value *src = bi_is_none(axis) ? bi_ravel_of(xa) : val_incref(xa);
  val_decref(xa);
  if (!src) return NULL;
  AVal av = bi_aval(src);
  if (t < 0) t = (av.dtype == DT_BOOL || av.dtype == DT_I8) ? DT_I32 : (int)av.dtype;
  int64_t ax = 0;
  int axn = 0;
  Value *res = NULL, *c = NULL;
  if (bi_int_arg(fname, "axis", axis, 0, &ax) < 0 || axis_normalize(ax, av.ndim ? av.ndim : 1, &axn) < 0)
    goto done;
  c = ops_convert(src, (DType)t, av.weak);
  if (c) {
    Params p;
    params_init(&p);
    params_add(&p, "axis", val_int(axn));
    params_add(&p, "reverse", val_bool(false));
    res = ops_apply(id, 1, &c, &p);
    params_clear(&p);
  }
done:
  bi_drop(src, c, NULL, NULL);
  return res;
}

static Value *bi_cumsum(const CallArgs *a) { return cum_like("cumsum", a, P_CUMSUM); }
static Value *bi_cumprod(const CallArgs *a) { return cum_like("cumprod", a, P_CUMPROD); }

/* lax.cumsum/cumprod/cummax/cummin(operand, axis=0, reverse=False): the
 * primitive itself, in the operand's dtype; cummin is -cummax(-x). */
static Value *lax_cum(const char *fname, const CallArgs *a, PrimId id, bool negate) {
  Value *x, *axis, *reverse;
  Value **slots[] = {&x, &axis, &reverse};
  if (args_bind(fname, a, "operand, axis=, reverse=", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  int64_t ax;
  int axn;
  bool rev = false;
  Value *r = NULL;
  if (bi_int_arg(fname, "axis", axis, 0, &ax) == 0 && axis_normalize(ax, av.ndim ? av.ndim : 1, &axn) == 0 &&
      bi_bool_arg(reverse, false, &rev) == 0) {
    Value *src = negate ? ops_unary(OP_NEG, xa) : val_incref(xa);
    Params p;
    params_init(&p);
    params_add(&p, "axis", val_int(axn));
    params_add(&p, "reverse", val_bool(rev));
    Value *c = src ? ops_apply(id, 1, &src, &p) : NULL;
    params_clear(&p);
    r = c && negate ? ops_unary(OP_NEG, c) : c ? val_incref(c) : NULL;
    if (c) val_decref(c);
    if (src) val_decref(src);
  }
  val_decref(xa);
  return r;
}
static Value *lax_cumsum(const CallArgs *a) { return lax_cum("cumsum", a, P_CUMSUM, false); }
static Value *lax_cumprod(const CallArgs *a) { return lax_cum("cumprod", a, P_CUMPROD, false); }
static Value *lax_cummax(const CallArgs *a) { return lax_cum("cummax", a, P_CUMMAX, false); }
static Value *lax_cummin(const CallArgs *a) { return lax_cum("cummin", a, P_CUMMAX, true); }

/* The array a sort of [x] reads: raveled for axis=None. */
static Value *sort_operand(Value *x, Value *axis) {
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  Value *src = axis && axis == VAL_NONE ? bi_ravel_of(xa) : val_incref(xa);
  val_decref(xa);
  return src;
}

static Value *bi_sort(const CallArgs *a) {
  Value *x, *axis;
  Value **slots[] = {&x, &axis};
  if (args_bind("sort", a, "a, axis=", slots) < 0) return NULL;
  Value *src = sort_operand(x, axis);
  if (!src) return NULL;
  AVal av = bi_aval(src);
  int64_t ax;
  int axn;
  Value *r = NULL;
  if (av.ndim == 0) {
    r = val_incref(src);
  } else if (bi_int_arg("sort", "axis", axis && axis != VAL_NONE ? axis : NULL, -1, &ax) == 0 &&
             axis_normalize(ax, av.ndim, &axn) == 0) {
    Params p;
    params_init(&p);
    params_add(&p, "dimension", val_int(axn));
    r = ops_apply(P_SORT, 1, &src, &p);
    params_clear(&p);
  }
  val_decref(src);
  return r;
}

/* [x] reversed along axis [d] (lax.rev). */
static Value *rev_axis(Value *x, int d) {
  Params p;
  params_init(&p);
  params_add(&p, "dimensions", val_int_tuple(1, (int64_t[]){d}));
  Value *r = ops_apply(P_REV, 1, &x, &p);
  params_clear(&p);
  return r;
}

/* The stable argsort of [x] (borrowed) along axis [axis] (normalised): the
 * argsort primitive.  A new int32 array, or NULL with the error set. */
static Value *argsort_along(Value *x, int64_t axis) {
  Params p;
  params_init(&p);
  params_add(&p, "dimension", val_int(axis));
  Value *r = ops_apply(P_ARGSORT, 1, &x, &p);
  params_clear(&p);
  return r;
}

/* The stable argsort of [src] (borrowed) along axis [axn] (normalised),
 * descending when [desc]: the ascending order of the reversed array,
 * reversed and mapped back, which keeps equal elements in their original
 * order (NaN first).  int32, or NULL with the error set. */
static Value *argsort_dir(Value *src, int axn, bool desc) {
  Value *keys = desc ? rev_axis(src, axn) : val_incref(src);
  Value *i = keys ? argsort_along(keys, axn) : NULL, *r = i;
  if (keys) val_decref(keys);
  if (i && desc) {   /* position k of the reversed array is n-1-k of the original */
    Value *ri = rev_axis(i, axn);
    Value *last = ri ? arr_value(arr_scalar_i64(DT_I32, bi_aval(src).shape[axn] - 1, false)) : NULL;
    r = last ? ops_binary(OP_SUB, last, ri) : NULL;
    if (last) val_decref(last);
    if (ri) val_decref(ri);
    val_decref(i);
  }
  return r;
}

/* argsort(a, axis=-1, kind=None, order=None, stable=True, descending=False):
 * the stable order, NaN last (first when descending); int32, as JAX's.
 * Descending is the ascending order of the reversed array, reversed and
 * mapped back, which keeps equal elements in their original order. */
static Value *bi_argsort(const CallArgs *a) {
  Value *x, *axis, *kind, *order, *stable, *descending;
  Value **slots[] = {&x, &axis, &kind, &order, &stable, &descending};
  if (args_bind("argsort", a, "a, axis=, kind=, order=, stable=, descending=", slots) < 0)
    return NULL;
  if (!bi_is_none(order)) return err_set(ERR_VALUE, "argsort: 'order' is not supported");
  bool desc = false;
  if (bi_bool_arg(descending, false, &desc) < 0) return NULL;
  Value *src = sort_operand(x, axis);
  if (!src) return NULL;
  AVal av = bi_aval(src);
  if (av.ndim == 0) {   /* NumPy: a 0-d array sorts as one element */
    Value *one = bi_ravel_of(src);
    val_decref(src);
    if (!(src = one)) return NULL;
    av = bi_aval(src);
  }
  int64_t ax;
  int axn;
  Value *r = NULL;
  if (bi_int_arg("argsort", "axis", axis && axis != VAL_NONE ? axis : NULL, -1, &ax) == 0 &&
      axis_normalize(ax, av.ndim, &axn) == 0)
    r = argsort_dir(src, axn, desc);
  val_decref(src);
  return r;
}

/* prim_take_along([x], [idx], [axis]) typed [type] (a new reference,
 * consumed; NULL: untyped): computed with that out_sharding, whatever
 * the layouts its steps take, and the result laid out as the type says. */
static Value *typed_as(Value *type, Value *x, Value *idx, int axis) {
  if (!type || !builtins_out_sharding_hook) {
    val_decref(type);
    return prim_take_along(x, idx, axis);
  }
  Value *r = prim_take_along_sh(x, idx, axis, type);
  Value *o = r ? builtins_out_sharding_hook(r, type) : NULL;
  val_decref(r);
  val_decref(type);
  return o;
}

/* take_along along [axn] in Explicit mode (ops_take_along_type_hook):
 * the batch dimensions keep their split, as JAX's gather rule says. */
static Value *take_along_typed(Value *x, Value *idx, int axn) {
  Value *type = ops_take_along_type_hook ? ops_take_along_type_hook(x, idx, axn) : NULL;
  if (!type && err_occurred()) return NULL;
  return typed_as(type, x, idx, axn);
}

/* jnp.take_along_axis(arr, indices, axis): NumPy's, through
 * prim_take_along (negative positions count from the end). */
static Value *bi_take_along_axis(const CallArgs *a) {
  Value *x, *idx, *axis, *mode, *fill;
  Value **slots[] = {&x, &idx, &axis, &mode, &fill};
  if (args_bind("take_along_axis", a, "arr, indices, axis, mode=, fill_value=", slots) < 0)
    return NULL;
  Value *xa = bi_arr(x), *ia = xa ? bi_arr(idx) : NULL, *r = NULL;
  if (bi_is_none(axis)) {   /* axis=None: both flattened */
    Value *xf = ia ? bi_ravel_of(xa) : NULL, *jf = xf ? bi_ravel_of(ia) : NULL;
    r = jf ? prim_take_along(xf, jf, 0) : NULL;
    if (xf) val_decref(xf);
    if (jf) val_decref(jf);
  } else if (ia) {
    int64_t ax;
    int axn;
    if (bi_int_arg("take_along_axis", "axis", axis, 0, &ax) == 0 &&
        axis_normalize(ax, bi_aval(xa).ndim, &axn) == 0)
      r = take_along_typed(xa, ia, axn);
  }
  if (xa) val_decref(xa);
  if (ia) val_decref(ia);
  return r;
}

/* The [k] largest ([largest]) or smallest elements of [x] (borrowed)
 * along axis [axn], in order, equal ones by lower index first (NaN as the
 * largest): (values, int32 indices), the values gathered by the indices,
 * so their derivative gathers the tangents (JAX's top_k and its CPU
 * approx_max_k / approx_min_k, which are exact).  [who] names the caller
 * in JAX's errors. */
static Value *top_k_along(const char *who, Value *x, int64_t k, int axn, bool largest) {
  AVal av = bi_aval(x);
  if (k < 0) return err_set(ERR_VALUE, "k argument to %s must be nonnegative, got %lld", who, (long long)k);
  if (av.shape[axn] < k)
    return err_set(ERR_VALUE, "k argument to %s must be no larger than the size of its "
                              "dimension %d; %lld vs %lld", who, axn, (long long)k,
                   (long long)av.shape[axn]);
  Value *order = argsort_dir(x, axn, largest);
  Value *idx = order ? bi_slice_axis(order, axn, 0, k) : NULL;
  char ty[512];
  uint64_t others = (((uint64_t)1 << av.ndim) - 1) & ~((uint64_t)1 << axn);
  Value *vals = NULL;
  if (idx && ops_explicit_split_hook && ops_explicit_split_hook(x, others, ty, sizeof ty)) {
    /* split over Explicit axes along other dimensions: the values sorted
     * by the sort primitive, which keeps their type (the gather of the
     * flattened array could not) */
    Params p;
    params_init(&p);
    params_add(&p, "dimension", val_int(axn));
    Value *srt = ops_apply(P_SORT, 1, &x, &p);
    params_clear(&p);
    Value *dir = srt && largest ? rev_axis(srt, axn) : srt ? val_incref(srt) : NULL;
    vals = dir ? bi_slice_axis(dir, axn, 0, k) : NULL;
    if (srt) val_decref(srt);
    if (dir) val_decref(dir);
  } else if (idx) {
    vals = prim_take_along(x, idx, axn);
  }
  Value *r = vals ? tuple_pack(2, (Value *[]){vals, idx}) : NULL;
  Value *tmp[] = {order, idx, vals};
  for (int i = 0; i < 3; i++)
    if (tmp[i]) val_decref(tmp[i]);
  return r;
}

/* Explicit mode (JAX's _top_k_abstract_eval): [x] split over an
 * Explicit axis along [axis] is JAX's ShardingTypeError (true, the error
 * set). */
static bool top_k_split(Value *x, int axis) {
  char ty[512];
  if (!ops_explicit_split_hook || !ops_explicit_split_hook(x, (uint64_t)1 << axis, ty, sizeof ty))
    return false;
  err_set(ERR_TYPE, "ShardingTypeError: The input should be unsharded over the axis along which "
                    "to compute the top_k values. Got input type=%s and axis=%d", ty, axis);
  return true;
}

/* lax.top_k(operand, k): the k largest along the last axis. */
static Value *lax_top_k(const CallArgs *a) {
  Value *x, *kv;
  if (args_bind("top_k", a, "operand, k", (Value **[]){&x, &kv}) < 0) return NULL;
  Value *xa = bi_arr(x), *r = NULL;
  int64_t k;
  if (!xa) return NULL;
  if (bi_aval(xa).ndim == 0)
    err_set(ERR_TYPE, "top_k operand must have >= 1 dimension, got ()");
  else if (bi_int_arg("top_k", "k", kv, 0, &k) == 0)
    r = top_k_split(xa, bi_aval(xa).ndim - 1) ? NULL
        : top_k_along("top_k", xa, k, bi_aval(xa).ndim - 1, true);
  val_decref(xa);
  return r;
}

/* lax.approx_max_k / approx_min_k(operand, k, reduction_dimension=-1,
 * recall_target=0.95, reduction_input_size_override=-1,
 * aggregate_to_topk=True): exact, as JAX's on CPU (recall 1 meets any
 * target).  In Explicit mode top_k's rule: the reduced dimension split
 * over an Explicit axis is its ShardingTypeError. */
static Value *approx_k(const CallArgs *a, const char *who, bool largest) {
  Value *x, *kv, *dim, *recall, *over, *agg;   /* the last two change nothing on CPU */
  Value **slots[] = {&x, &kv, &dim, &recall, &over, &agg};
  if (args_bind(who, a, "operand, k, reduction_dimension=, recall_target=, "
                        "reduction_input_size_override=, aggregate_to_topk=", slots) < 0)
    return NULL;
  double rt;
  if (bi_float_arg(who, "recall_target", recall, 0.95, &rt) < 0) return NULL;
  if (!(rt > 0.0 && rt <= 1.0))
    return err_set(ERR_VALUE, "recall_target should be in (0, 1], got %g", rt);
  Value *xa = bi_arr(x), *r = NULL;
  int64_t k, d;
  int axn;
  if (!xa) return NULL;
  if (bi_int_arg(who, "k", kv, 0, &k) == 0 &&
      bi_int_arg(who, "reduction_dimension", dim, -1, &d) == 0 &&
      axis_normalize(d, bi_aval(xa).ndim, &axn) == 0 && !top_k_split(xa, axn))
    r = top_k_along(who, xa, k, axn, largest);
  val_decref(xa);
  return r;
}

static Value *lax_approx_max_k(const CallArgs *a) { return approx_k(a, "approx_max_k", true); }
static Value *lax_approx_min_k(const CallArgs *a) { return approx_k(a, "approx_min_k", false); }

/* lax.sort(operand, dimension=-1, is_stable=True, num_keys=1): an array,
 * or a tuple or list of arrays of one shape sorted together by their
 * first num_keys (lexicographically), each carried along; stable; a
 * sequence gives a tuple. */
static Value *lax_sort(const CallArgs *a) {
  Value *ops, *dim, *stable, *nkeys;
  Value **slots[] = {&ops, &dim, &stable, &nkeys};
  if (args_bind("sort", a, "operand, dimension=, is_stable=, num_keys=", slots) < 0) return NULL;
  size_t n;
  Value *const *items;
  bool seq = ops->type == V_TUPLE || ops->type == V_LIST;
  if (!seq) {
    n = 1;
    items = &ops;
  } else if (!val_seq(ops, &n, &items) || n == 0) {
    return err_set(ERR_TYPE, "sort: operand must be an array or a non-empty sequence of arrays");
  }
  int64_t k, d;
  if (bi_int_arg("sort", "num_keys", nkeys, 1, &k) < 0 || bi_int_arg("sort", "dimension", dim, -1, &d) < 0)
    return NULL;
  if (k < 1 || (size_t)k > n)
    return err_set(ERR_VALUE, "sort: num_keys must be between 1 and the number of operands (%zu)", n);
  Value **arr = shm_calloc(n + 1, sizeof(Value *)), *perm = NULL, *r = NULL;
  size_t made = 0;
  int axn = 0;
  AVal av = {0};
  for (; arr && made < n; made++) {
    if (!(arr[made] = bi_arr(items[made]))) goto done;
    AVal ai = bi_aval(arr[made]);
    if (made == 0) av = ai;
    else if (ai.ndim != av.ndim || memcmp(ai.shape, av.shape, sizeof(int64_t) * (size_t)ai.ndim)) {
      made++;
      err_set(ERR_VALUE, "sort: the operands must have one shape");
      goto done;
    }
  }
  if (!arr || av.ndim == 0 || axis_normalize(d, av.ndim, &axn) < 0) {
    if (!arr) err_nomem();
    else if (av.ndim == 0) err_set(ERR_VALUE, "sort requires an operand of rank >= 1");
    goto done;
  }
  if (n == 1) {   /* one operand: the sort primitive (its type, its Explicit rule) */
    Params p;
    params_init(&p);
    params_add(&p, "dimension", val_int(axn));
    Value *v = ops_apply(P_SORT, 1, &arr[0], &p);
    params_clear(&p);
    r = v && seq ? tuple_pack(1, &v) : v;
    if (v && seq) val_decref(v);
    goto done;
  }
  /* Explicit mode: JAX's sort rule types the results (or raises); the
   * take_along steps carry that type as their out_sharding */
  Value *type = ops_sort_type_hook ? ops_sort_type_hook(arr, (int)n, av.ndim, axn) : NULL;
  if (!type && err_occurred()) goto done;
  /* the order: stable argsorts from the least significant key up */
  for (int64_t key = k - 1; key >= 0; key--) {
    Value *kv = perm ? prim_take_along_sh(arr[key], perm, axn, type) : val_incref(arr[key]);
    Value *order = kv ? argsort_along(kv, axn) : NULL;
    if (kv) val_decref(kv);
    Value *next = order && perm ? prim_take_along_sh(perm, order, axn, type)
                  : order ? val_incref(order) : NULL;
    if (order) val_decref(order);
    if (perm) val_decref(perm);
    if (!(perm = next)) break;
  }
  Value *res = perm ? tuple_new(n) : NULL;
  for (size_t i = 0; res && i < n; i++) {
    Value *v = prim_take_along_sh(arr[i], perm, axn, type);
    if (v && type && builtins_out_sharding_hook) {
      Value *o = builtins_out_sharding_hook(v, type);
      val_decref(v);
      v = o;
    }
    if (!v) {
      for (size_t j = i; j < n; j++) tuple_set_steal(res, j, val_incref(VAL_NONE));
      val_decref(res);
      res = NULL;
      break;
    }
    tuple_set_steal(res, i, v);
  }
  if (type) val_decref(type);
  if (res && !seq) {
    r = val_incref(tuple_get(res, 0));
    val_decref(res);
  } else {   /* a tuple for a tuple or a list, as JAX's */
    r = res;
  }
done:
  for (size_t i = 0; i < made; i++) val_decref(arr[i]);
  shm_free(arr);
  if (perm) val_decref(perm);
  return r;
}

/* [shift] (reduced positions [ax] kept as size 1) without them. */
static Value *squeeze_axes(Value *shift, int n, const int *ax) {
  int64_t d64[SHM_MAXDIM];
  bi_sorted_axes(n, ax, d64);
  return ops_squeeze(shift, n, d64);
}

/* jax.nn.logsumexp over positions and names (seed 001: logsumexp(logits,
 * 'classes')), as JAX's: shifted by the max over all of them (max then
 * pmax; 0 where that is not finite), exp summed over all (sum then psum),
 * logged, and the shift added back. */
static Value *bi_logsumexp(const CallArgs *a) {
  Value *x, *axis, *b, *keepdims, *return_sign;
  Value **slots[] = {&x, &axis, &b, &keepdims, &return_sign};
  if (args_bind("logsumexp", a, "a, axis=, b=, keepdims=, return_sign=", slots) < 0) return NULL;
  if (!bi_is_none(b)) return err_set(ERR_VALUE, "logsumexp: the 'b' argument is not supported");
  bool kd;
  if (bi_bool_arg(keepdims, false, &kd) < 0) return NULL;
  Value *pos, *names;
  if (ops_split_named_axes(axis, &pos, &names) < 0) return NULL;
  Value *xa = bi_arr(x), *f = xa ? bi_inexact(xa) : NULL;
  if (xa) val_decref(xa);
  int n, ax[SHM_MAXDIM];
  Value *res = NULL;
  if (!f || ops_axes_arg(pos, bi_aval(f).ndim, &n, ax) < 0) goto out;
  Value *mx = reduce_pos_names(P_REDUCE_MAX, f, n, ax, true, names);
  Value *fin = mx ? ops_unary_prim(P_IS_FINITE, mx) : NULL;
  Value *z = fin ? bi_scalar(bi_aval(f).dtype, 0) : NULL;
  Value *shift = z ? ops_select(fin, mx, z) : NULL;
  bi_drop(mx, fin, z, NULL);
  Value *d = shift ? bi_bin(P_SUB, f, shift) : NULL;
  Value *e = d ? ops_unary_prim(P_EXP, d) : NULL;
  Value *s = e ? reduce_pos_names(P_REDUCE_SUM, e, n, ax, kd, names) : NULL;
  Value *l = s ? ops_unary_prim(P_LOG, s) : NULL;
  bi_drop(d, e, s, NULL);
  Value *sh = !l ? NULL : kd ? val_incref(shift) : squeeze_axes(shift, n, ax);
  res = sh ? bi_bin(P_ADD, l, sh) : NULL;
  bi_drop(l, sh, shift, NULL);
out:
  if (f) val_decref(f);
  if (names) bi_drop(names, pos, NULL, NULL);
  return res;
}

/* jax.nn.softmax and log_softmax along [axis] (default -1), positions and
 * names: the max and the sum over all of them, names by pmax and psum. */
static Value *softmax_like(const char *fname, const CallArgs *a, bool log_form) {
  Value *x, *axis, *where, *initial;
  Value **slots[] = {&x, &axis, &where, &initial};
  if (args_bind(fname, a, "x, axis=, where=, initial=", slots) < 0) return NULL;
  Value *pos, *names;
  if (ops_split_named_axes(axis, &pos, &names) < 0) return NULL;
  Value *xa = bi_arr(x), *f = xa ? bi_inexact(xa) : NULL;
  if (xa) val_decref(xa);
  if (!f) {
    if (names) bi_drop(names, pos, NULL, NULL);
    return NULL;
  }
  AVal av = bi_aval(f);
  int n, ax[SHM_MAXDIM];
  Value *res = NULL, *m1 = NULL;
  if (bi_is_none(pos)) {
    m1 = val_int(-1);
    pos = av.ndim ? m1 : VAL_NONE;
  }
  if (ops_axes_arg(pos, av.ndim, &n, ax) == 0) {
    Value *mx = reduce_pos_names(P_REDUCE_MAX, f, n, ax, true, names);
    Value *d = mx ? bi_bin(P_SUB, f, mx) : NULL;
    Value *e = d ? ops_unary_prim(P_EXP, d) : NULL;
    Value *s = e ? reduce_pos_names(P_REDUCE_SUM, e, n, ax, true, names) : NULL;
    if (s && log_form) {
      Value *l = ops_unary_prim(P_LOG, s);
      res = l ? bi_bin(P_SUB, d, l) : NULL;
      if (l) val_decref(l);
    } else if (s) {
      res = bi_bin(P_DIV, e, s);
    }
    bi_drop(mx, d, e, s);
  }
  bi_drop(f, m1, NULL, NULL);
  if (names) bi_drop(names, pos, NULL, NULL);
  return res;
}

static Value *bi_softmax(const CallArgs *a) { return softmax_like("softmax", a, false); }
static Value *bi_log_softmax(const CallArgs *a) { return softmax_like("log_softmax", a, true); }

/* jax.nn.one_hot: expand_dims(x, axis) == iota along axis, converted. */
static Value *bi_one_hot(const CallArgs *a) {
  Value *x, *num, *dtype, *axis;
  Value **slots[] = {&x, &num, &dtype, &axis};
  if (args_bind("one_hot", a, "x, num_classes, dtype=, axis=", slots) < 0) return NULL;
  int64_t nc, ax;
  int t;
  if (axis && axis->type == V_STR) {
    /* a named axis of the enclosing xmap (seed 001): x == the position
     * along it, so under axis_resources each device makes its block */
    int64_t want, have;
    if (named_axis_size(axis, &have) < 0 || bi_int_arg("one_hot", "num_classes", num, 0, &want) < 0)
      return NULL;
    if (want != have)
      return err_set(ERR_VALUE, "the size of axis %s is %lld, but one_hot was asked for %lld "
                                "classes", str_cstr(axis), (long long)have, (long long)want);
    if (ops_dtype_arg(dtype, &t) < 0) return NULL;
    Value *pos = lax_axis_call("axis_index", axis);
    Value *eq = pos ? ops_compare(OP_EQ, x, pos) : NULL;
    Value *r = eq ? ops_convert(eq, t < 0 ? DT_F32 : (DType)t, false) : NULL;
    if (pos) val_decref(pos);
    if (eq) val_decref(eq);
    return r;
  }
  if (bi_int_arg("one_hot", "num_classes", num, 0, &nc) < 0 ||
      bi_int_arg("one_hot", "axis", axis, -1, &ax) < 0 || ops_dtype_arg(dtype, &t) < 0)
    return NULL;
  if (nc < 0) return err_set(ERR_VALUE, "num_classes must be non-negative, got %lld", (long long)nc);
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  int axn;
  Value *res = NULL;
  if (axis_normalize(ax, av.ndim + 1, &axn) == 0) {
    int64_t d = axn, sh[SHM_MAXDIM];
    for (int i = 0; i <= av.ndim; i++) sh[i] = 1;
    sh[axn] = nc;
    Value *lhs = ops_expand_dims(xa, 1, &d);
    Value *rhs = lhs ? bi_iota(av.dtype == DT_BOOL ? DT_I32 : av.dtype, av.ndim + 1, sh, axn) : NULL;
    Value *eq = rhs ? bi_bin(P_EQ, lhs, rhs) : NULL;
    res = eq ? ops_convert(eq, t < 0 ? DT_F32 : (DType)t, false) : NULL;
    bi_drop(lhs, rhs, eq, NULL);
  }
  val_decref(xa);
  return res;
}

/* jnp.isclose: |a - b| <= atol + rtol * |b|, infinities equal only to
 * themselves, NaNs equal when equal_nan. */
static Value *isclose(Value *x, Value *y, double rtol, double atol, bool equal_nan) {
  Value *in[2] = {x, y};
  AVal xa = bi_aval(x), ya = bi_aval(y);
  DType t = dt_promote(xa.dtype, xa.weak, ya.dtype, ya.weak, NULL);
  if (!dt_is_float(t)) return bi_bin(P_EQ, x, y);
  Value *xf = ops_convert(in[0], t, false), *yf = xf ? ops_convert(in[1], t, false) : NULL;
  Value *d = yf ? bi_bin(P_SUB, xf, yf) : NULL;
  Value *ad = d ? ops_unary_prim(P_ABS, d) : NULL;
  Value *ay = ad ? ops_unary_prim(P_ABS, yf) : NULL;
  Value *tol1 = ay ? bi_bin_const(P_MUL, ay, rtol) : NULL;
  Value *tol = tol1 ? bi_bin_const(P_ADD, tol1, atol) : NULL;
  Value *close = tol ? bi_bin(P_LE, ad, tol) : NULL;
  bi_drop(d, ad, ay, tol1);
  val_decref(tol);
  Value *fx = close ? ops_unary_prim(P_IS_FINITE, xf) : NULL;
  Value *fy = fx ? ops_unary_prim(P_IS_FINITE, yf) : NULL;
  Value *fin = fy ? bi_bin(P_AND, fx, fy) : NULL;
  Value *eq = fin ? bi_bin(P_EQ, xf, yf) : NULL;
  Value *r = eq ? ops_select(fin, close, eq) : NULL;
  bi_drop(close, fx, fy, fin);
  val_decref(eq);
  if (r && equal_nan) {
    Value *nx = bi_bin(P_NE, xf, xf), *ny = nx ? bi_bin(P_NE, yf, yf) : NULL;
    Value *both = ny ? bi_bin(P_AND, nx, ny) : NULL;
    Value *r2 = both ? bi_bin(P_OR, r, both) : NULL;
    bi_drop(nx, ny, both, r);
    r = r2;
  }
  bi_drop(xf, yf, NULL, NULL);
  return r;
}

static Value *close_bind(const char *fname, const CallArgs *a, bool all) {
  Value *x, *y, *rtol, *atol, *equal_nan;
  Value **slots[] = {&x, &y, &rtol, &atol, &equal_nan};
  if (args_bind(fname, a, "a, b, rtol=, atol=, equal_nan=", slots) < 0) return NULL;
  double rt, at;
  bool en;
  if (bi_float_arg(fname, "rtol", rtol, 1e-05, &rt) < 0 || bi_float_arg(fname, "atol", atol, 1e-08, &at) < 0 ||
      bi_bool_arg(equal_nan, false, &en) < 0)
    return NULL;
  Value *xa = bi_arr(x), *ya = xa ? bi_arr(y) : NULL;
  Value *c = ya ? isclose(xa, ya, rt, at, en) : NULL;
  bi_drop(xa, ya, NULL, NULL);
  if (!c || !all) return c;
  AVal av = bi_aval(c);
  int ax[SHM_MAXDIM];
  for (int i = 0; i < av.ndim; i++) ax[i] = i;
  Value *r = ops_reduce(P_REDUCE_AND, c, av.ndim, ax, false);
  val_decref(c);
  if (!r || !IS_ARRAY(r)) return r;
  return r;
}

static Value *bi_allclose(const CallArgs *a) { return close_bind("allclose", a, true); }
static Value *bi_isclose(const CallArgs *a) { return close_bind("isclose", a, false); }

static Value *bi_array_equal(const CallArgs *a) {
  Value *x, *y;
  Value **slots[] = {&x, &y};
  if (args_bind("array_equal", a, "a1, a2", slots) < 0) return NULL;
  Value *xa = bi_arr(x), *ya = xa ? bi_arr(y) : NULL;
  Value *r = NULL;
  if (ya) {
    AVal av = bi_aval(xa), bv = bi_aval(ya);
    if (av.ndim != bv.ndim || memcmp(av.shape, bv.shape, sizeof(int64_t) * (size_t)av.ndim)) {
      r = (Value *)arr_scalar_i64(DT_BOOL, 0, false);  /* an array, as JAX's */
    } else {
      Value *eq = bi_bin(P_EQ, xa, ya);
      int ax[SHM_MAXDIM];
      for (int i = 0; i < av.ndim; i++) ax[i] = i;
      r = eq ? ops_reduce(P_REDUCE_AND, eq, av.ndim, ax, false) : NULL;
      val_decref(eq);
    }
  }
  bi_drop(xa, ya, NULL, NULL);
  return r;
}

/* ======================================================================
 * dynamic_slice, dynamic_update_slice, take
 * ====================================================================== */

/* The start indices as i32 0-d arrays (or tracers); *n set. */
static int starts_arg(const char *fname, Value *v, int ndim, Value **out) {
  size_t n;
  Value *const *items;
  Value *list = NULL;
  if (!val_seq(v, &n, &items)) {
    if (!ops_is_array(v) || bi_aval(v).ndim != 1) {
      err_set(ERR_TYPE, "%s: start_indices must be a sequence of integers", fname);
      return -1;
    }
    list = ops_iter_items(v);
    if (!list) return -1;
    val_seq(list, &n, &items);
  }
  if ((int)n != ndim) {
    val_decref(list);
    err_set(ERR_TYPE, "%s: length of start_indices (%zu) must match the operand's rank (%d)",
            fname, n, ndim);
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    Value *x = bi_arr(items[i]);
    AVal av = x ? bi_aval(x) : (AVal){0};
    if (x && (av.ndim != 0 || !(dt_is_int(av.dtype) || av.dtype == DT_BOOL))) {
      err_set(ERR_TYPE, "%s: start indices must be integer scalars", fname);
      val_decref(x);
      x = NULL;
    }
    out[i] = x ? ops_convert(x, DT_I32, false) : NULL;
    val_decref(x);
    if (!out[i]) {
      for (size_t j = 0; j < i; j++) val_decref(out[j]);
      val_decref(list);
      return -1;
    }
  }
  val_decref(list);
  return 0;
}

static Value *bi_dynamic_slice(const CallArgs *a) {
  Value *x, *starts, *sizes;
  Value **slots[] = {&x, &starts, &sizes};
  if (args_bind("dynamic_slice", a, "operand, start_indices, slice_sizes", slots) < 0) return NULL;
  Value *in[SHM_MAXDIM + 1];
  in[0] = bi_arr(x);
  if (!in[0]) return NULL;
  AVal av = bi_aval(in[0]);
  int nd;
  int64_t sz[SHM_MAXDIM];
  Value *r = NULL;
  if (ops_shape_arg(sizes, &nd, sz) < 0) goto fail;
  if (nd != av.ndim) {
    err_set(ERR_TYPE, "dynamic_slice: slice_sizes must have the same length as the operand's rank");
    goto fail;
  }
  if (starts_arg("dynamic_slice", starts, av.ndim, in + 1) < 0) goto fail;
  Params p;
  params_init(&p);
  params_add(&p, "slice_sizes", val_int_tuple(nd, sz));
  r = ops_apply(P_DYNAMIC_SLICE, av.ndim + 1, in, &p);
  params_clear(&p);
  for (int i = 1; i <= av.ndim; i++) val_decref(in[i]);
fail:
  val_decref(in[0]);
  return r;
}

static Value *bi_dynamic_update_slice(const CallArgs *a) {
  Value *x, *upd, *starts;
  Value **slots[] = {&x, &upd, &starts};
  if (args_bind("dynamic_update_slice", a, "operand, update, start_indices", slots) < 0) return NULL;
  Value *in[SHM_MAXDIM + 2];
  in[0] = bi_arr(x);
  Value *u = in[0] ? bi_arr(upd) : NULL;
  if (!u) {
    val_decref(in[0]);
    return NULL;
  }
  AVal av = bi_aval(in[0]);
  in[1] = ops_convert(u, av.dtype, false);
  val_decref(u);
  Value *r = NULL;
  if (in[1] && starts_arg("dynamic_update_slice", starts, av.ndim, in + 2) == 0) {
    Params p;
    params_init(&p);
    r = ops_apply(P_DYNAMIC_UPDATE_SLICE, av.ndim + 2, in, &p);
    for (int i = 2; i < av.ndim + 2; i++) val_decref(in[i]);
  }
  bi_drop(in[0], in[1], NULL, NULL);
  return r;
}

/* ---- lax's *_in_dim forms: one axis given, the others whole ---- */

/* The starts tuple: zeros, [start] at [axis] (borrowed). */
static Value *starts_at(int ndim, int axis, Value *start) {
  Value *t = tuple_new((size_t)ndim);
  for (int i = 0; t && i < ndim; i++)
    tuple_set_steal(t, (size_t)i, i == axis ? val_incref(start) : val_int(0));
  return t;
}

/* [x]'s rank and [axis] normalised against it; -1 with the error set. */
static int in_dim_axis(Value *x, Value *axis_v, int *ndim, int *axis) {
  int64_t ax;
  AVal av = bi_aval(x);
  *ndim = av.ndim;
  if (bi_int_arg("dynamic_slice_in_dim", "axis", axis_v, 0, &ax) < 0) return -1;
  return axis_normalize(ax, av.ndim, axis);
}

/* lax.dynamic_slice_in_dim(operand, start_index, slice_size, axis=0) */
static Value *bi_dynamic_slice_in_dim(const CallArgs *a) {
  Value *x, *start, *size, *axis_v;
  if (args_bind("dynamic_slice_in_dim", a, "operand, start_index, slice_size, axis=",
                (Value **[]){&x, &start, &size, &axis_v}) < 0)
    return NULL;
  Value *xa = bi_arr(x);
  int nd, ax;
  int64_t n;
  if (!xa) return NULL;
  Value *r = NULL;
  if (in_dim_axis(xa, axis_v, &nd, &ax) == 0 && bi_int_arg("dynamic_slice_in_dim", "slice_size",
                                                            size, 0, &n) == 0) {
    AVal av = bi_aval(xa);
    av.shape[ax] = n;
    Value *st = starts_at(nd, ax, start), *sz = val_int_tuple(nd, av.shape);
    CallArgs c = {3, (Value *[]){xa, st, sz}, 0, NULL, NULL};
    r = st && sz ? bi_dynamic_slice(&c) : NULL;
    val_decref(st);
    val_decref(sz);
  }
  val_decref(xa);
  return r;
}

/* lax.dynamic_index_in_dim(operand, index, axis=0, keepdims=True) */
static Value *bi_dynamic_index_in_dim(const CallArgs *a) {
  Value *x, *idx, *axis_v, *keep;
  if (args_bind("dynamic_index_in_dim", a, "operand, index, axis=, keepdims=",
                (Value **[]){&x, &idx, &axis_v, &keep}) < 0)
    return NULL;
  bool kd;
  if (bi_bool_arg(keep, true, &kd) < 0) return NULL;
  Value *one = val_int(1);
  Value *args[4] = {x, idx, one, axis_v ? axis_v : VAL_NONE};
  CallArgs c = {axis_v ? 4 : 3, args, 0, NULL, NULL};
  Value *s = bi_dynamic_slice_in_dim(&c);
  val_decref(one);
  if (!s || kd) return s;
  AVal av = bi_aval(s);
  int nd, ax;
  Value *r = NULL;
  if (in_dim_axis(s, axis_v, &nd, &ax) == 0) {
    int64_t d = ax;
    r = ops_squeeze(s, 1, &d);
  }
  (void)av;
  val_decref(s);
  return r;
}

/* lax.dynamic_update_slice_in_dim(operand, update, start_index, axis) */
static Value *bi_dynamic_update_slice_in_dim(const CallArgs *a) {
  Value *x, *upd, *start, *axis_v;
  if (args_bind("dynamic_update_slice_in_dim", a, "operand, update, start_index, axis",
                (Value **[]){&x, &upd, &start, &axis_v}) < 0)
    return NULL;
  Value *xa = bi_arr(x);
  int nd, ax;
  if (!xa) return NULL;
  Value *r = NULL;
  if (in_dim_axis(xa, axis_v, &nd, &ax) == 0) {
    Value *st = starts_at(nd, ax, start);
    CallArgs c = {3, (Value *[]){xa, upd, st}, 0, NULL, NULL};
    r = st ? bi_dynamic_update_slice(&c) : NULL;
    val_decref(st);
  }
  val_decref(xa);
  return r;
}

/* jnp.take(a, indices, axis=None, mode=None, fill_value=None) as
 * indexing, out-of-range indices as JAX's mode says: "fill" (the
 * default: NaN for floats) or "clip" (ops_getitem_mode). */
static Value *bi_take(const CallArgs *a) {
  Value *x, *idx, *axis, *out, *mode, *uniq, *sorted, *fill;
  Value **slots[] = {&x, &idx, &axis, &out, &mode, &uniq, &sorted, &fill};
  if (args_bind("take", a, "a, indices, axis=, out=, mode=, unique_indices=, indices_are_sorted=, "
                "fill_value=", slots) < 0)
    return NULL;
  if (!bi_is_none(out))
    return err_set(ERR_NOT_IMPLEMENTED, "The 'out' argument to jnp.take is not supported.");
  Value *fill_mode = bi_is_none(mode) ? str_from("fill") : val_incref(mode);
  if (!fill_mode) return NULL;
  Value *xa = bi_arr(x);
  Value *src = !xa ? NULL : bi_is_none(axis) ? bi_ravel_of(xa) : val_incref(xa);
  val_decref(xa);
  Value *ia = src ? ops_to_array(idx, -1) : NULL;
  Value *r = NULL;
  if (ia) {
    AVal av = bi_aval(src);
    int64_t ax;
    int axn;
    if (bi_int_arg("take", "axis", axis, 0, &ax) == 0 && axis_normalize(ax, av.ndim, &axn) == 0) {
      Value *t = tuple_new((size_t)axn + 1);
      for (int i = 0; t && i < axn; i++) tuple_set_steal(t, (size_t)i, slice_new(VAL_NONE, VAL_NONE, VAL_NONE));
      if (t) tuple_set_steal(t, (size_t)axn, val_incref(ia));
      r = t ? ops_getitem_mode(src, t, fill_mode, bi_is_none(fill) ? NULL : fill) : NULL;
      val_decref(t);
    }
  }
  val_decref(ia);
  val_decref(src);
  val_decref(fill_mode);
  return r;
}

/* ======================================================================
 * Dtypes
 * ====================================================================== */

static Value *bi_astype(const CallArgs *a) {
  Value *x, *dtype, *copy;
  Value **slots[] = {&x, &dtype, &copy};
  if (args_bind("astype", a, "x, dtype, copy=", slots) < 0) return NULL;
  int t;
  if (ops_dtype_arg(dtype, &t) < 0) return NULL;
  if (t < 0) return err_set(ERR_TYPE, "astype: dtype must not be None");
  Value *xa = bi_arr(x);
  Value *r = xa ? ops_convert(xa, (DType)t, false) : NULL;
  val_decref(xa);
  return r;
}

static Value *bi_result_type(const CallArgs *a) {
  DType t = DT_BOOL;
  bool weak = true;
  for (int i = 0; i < a->nargs; i++) {
    int dt;
    DType d;
    bool w = false;
    if (a->args[i]->type == V_DTYPE || a->args[i]->type == V_STR) {
      if (ops_dtype_arg(a->args[i], &dt) < 0) return NULL;
      d = (DType)dt;
    } else {
      Value *x = bi_arr(a->args[i]);
      if (!x) return NULL;
      AVal av = bi_aval(x);
      val_decref(x);
      d = av.dtype;
      w = av.weak;
    }
    t = i == 0 ? d : dt_promote(t, weak, d, w, &weak);
    if (i == 0) weak = w;
  }
  return dtype_value(t);
}

/* ======================================================================
 * jnp.linalg.norm
 * ====================================================================== */

/* The 2-norm of [x] over axes [ax] ([kd]: keepdims): the square root of
 * the sum of squares, through a safe where so that its derivative at 0 is
 * 0, as JAX's (sqrt's infinite slope there times a zero tangent would be
 * nan): where(s > 0, sqrt(where(s > 0, s, 1)), 0). */
static Value *norm_two(Value *x, int n, const int *ax, bool kd) {
  Value *sq = bi_bin(P_MUL, x, x);
  Value *s = sq ? ops_reduce(P_REDUCE_SUM, sq, n, ax, kd) : NULL;
  Value *zero = s ? bi_bin_const(P_MUL, s, 0.) : NULL;
  Value *one = zero ? bi_bin_const(P_ADD, zero, 1.) : NULL;
  Value *pos = one ? bi_bin(P_GT, s, zero) : NULL;
  Value *safe = pos ? ops_select(pos, s, one) : NULL;
  Value *root = safe ? ops_unary_prim(P_SQRT, safe) : NULL;
  Value *r = root ? ops_select(pos, root, zero) : NULL;
  bi_drop(sq, s, zero, one);
  bi_drop(pos, safe, root, NULL);
  return r;
}

/* A vector norm of [x] over one axis (or all of a 1-d [x]) for [ord]: 2
 * (or None), 1, inf, -inf. */
static Value *norm_vector(Value *x, double ord, int n, const int *ax, bool kd) {
  if (ord == 2) return norm_two(x, n, ax, kd);
  if (ord != 1 && !isinf(ord))
    return err_set(ERR_NOT_IMPLEMENTED, "jnp.linalg.norm: ord=%g is not implemented "
                   "(2, 1, inf and -inf are)", ord);
  Value *m = ops_unary_prim(P_ABS, x);
  PrimId id = ord == 1 ? P_REDUCE_SUM : ord > 0 ? P_REDUCE_MAX : P_REDUCE_MIN;
  Value *r = m ? ops_reduce(id, m, n, ax, kd) : NULL;
  val_decref(m);
  return r;
}

/* The norm's ord: *fro for None or 'fro', else *ord its number; -1 with
 * the error set for anything else. */
static int norm_ord(Value *v, double *ord, bool *fro) {
  *ord = 2;
  *fro = bi_is_none(v) || (v->type == V_STR && !strcmp(str_cstr(v), "fro"));
  if (*fro || (v->type == V_ARRAY && AS_ARRAY(v)->size == 1 && AS_ARRAY(v)->ndim == 0)) {
    if (!*fro) *ord = arr_get_f64(AS_ARRAY(v), 0);
    return 0;
  }
  err_set(ERR_VALUE, "jnp.linalg.norm: invalid ord");
  return -1;
}

/* jnp.linalg.norm(x, ord=None, axis=None, keepdims=False), NumPy's rules:
 * without axis, a vector's norm of a 1-d x, a matrix's of a 2-d one, the
 * 2-norm of the whole of x when ord is None; one axis, vector norms; two,
 * matrix norms, of which the Frobenius norm (None, 'fro'). */
static Value *bi_norm(const CallArgs *a) {
  Value *x, *ord, *axis, *keepdims;
  Value **slots[] = {&x, &ord, &axis, &keepdims};
  if (args_bind("norm", a, "x, ord=, axis=, keepdims=", slots) < 0) return NULL;
  bool kd, fro;
  double o;
  if (bi_bool_arg(keepdims, false, &kd) < 0 || norm_ord(ord, &o, &fro) < 0) return NULL;
  Value *f = bi_inexact(x);
  if (!f) return NULL;
  AVal av = bi_aval(f);
  int n, ax[SHM_MAXDIM];
  if (ops_axes_arg(axis, av.ndim, &n, ax) < 0) return val_decref(f), NULL;
  int dims = bi_is_none(axis) ? (bi_is_none(ord) ? 1 : av.ndim) : n;   /* 1: vector, 2: matrix */
  Value *r;
  if (bi_is_none(axis) && bi_is_none(ord))
    r = norm_two(f, n, ax, kd);
  else if (dims == 1)
    r = fro && !bi_is_none(ord) ? err_set(ERR_VALUE, "jnp.linalg.norm: invalid norm order 'fro' for vectors")
                                : norm_vector(f, o, n, ax, kd);
  else if (dims == 2 && fro)
    r = norm_two(f, n, ax, kd);
  else if (dims == 2)
    r = err_set(ERR_NOT_IMPLEMENTED, "jnp.linalg.norm: ord=%g of a matrix is not implemented "
                "(the Frobenius norm is)", o);
  else
    r = err_set(ERR_VALUE, "jnp.linalg.norm: improper number of dimensions to norm");
  val_decref(f);
  return r;
}

/* The names this file binds, and where (builtins_impl.h). */
const BiEntry bi_reduce_table[] = {
  {"norm", bi_norm, IN_LINALG, "norm(x, ord=None, axis=None, keepdims=False)"},
  {"sum", bi_jnp_sum, IN_JNP, "sum(a, axis=None, dtype=None, keepdims=False)"},
  {"prod", bi_prod, NP, "prod(a, axis=None, dtype=None, keepdims=False)"},
  {"max", bi_jnp_max, IN_JNP, "max(a, axis=None, keepdims=False)"},
  {"min", bi_jnp_min, IN_JNP, "min(a, axis=None, keepdims=False)"},
  {"amax", bi_jnp_max, IN_JNP, "amax(a, axis=None, keepdims=False)"},
  {"amin", bi_jnp_min, IN_JNP, "amin(a, axis=None, keepdims=False)"},
  {"mean", bi_mean, NP, "mean(a, axis=None, dtype=None, keepdims=False)"},
  {"var", bi_var, NP, "var(a, axis=None, dtype=None, ddof=0, keepdims=False)"},
  {"std", bi_std, NP, "std(a, axis=None, dtype=None, ddof=0, keepdims=False)"},
  {"all", bi_all, NP, "all(a, axis=None, keepdims=False)"},
  {"any", bi_any, NP, "any(a, axis=None, keepdims=False)"},
  {"argmax", bi_argmax, NP, "argmax(a, axis=None, keepdims=False)"},
  {"argmin", bi_argmin, NP, "argmin(a, axis=None, keepdims=False)"},
  {"cumsum", bi_cumsum, NP, "cumsum(a, axis=None, dtype=None)"},
  {"cumprod", bi_cumprod, NP, "cumprod(a, axis=None, dtype=None)"},
  {"argsort", bi_argsort, NP, "argsort(a, axis=-1, stable=True, descending=False)"},
  {"take_along_axis", bi_take_along_axis, NP, "take_along_axis(arr, indices, axis)"},
  {"sort", lax_sort, IN_LAX, "lax.sort(operand, dimension=-1, is_stable=True, num_keys=1)"},
  {"top_k", lax_top_k, IN_LAX, "lax.top_k(operand, k): (values, indices) of the k largest, last axis"},
  {"approx_max_k", lax_approx_max_k, IN_LAX, "lax.approx_max_k(operand, k, reduction_dimension=-1, recall_target=0.95, ...): exact"},
  {"approx_min_k", lax_approx_min_k, IN_LAX, "lax.approx_min_k(operand, k, reduction_dimension=-1, recall_target=0.95, ...): exact"},
  {"cumsum", lax_cumsum, IN_LAX, "lax.cumsum(operand, axis=0, reverse=False)"},
  {"cumprod", lax_cumprod, IN_LAX, "lax.cumprod(operand, axis=0, reverse=False)"},
  {"cummax", lax_cummax, IN_LAX, "lax.cummax(operand, axis=0, reverse=False)"},
  {"cummin", lax_cummin, IN_LAX, "lax.cummin(operand, axis=0, reverse=False)"},
  {"sort", bi_sort, NP, "sort(a, axis=-1)"},
  {"logsumexp", bi_logsumexp, IN_TOP | IN_JNP | IN_NN, "logsumexp(a, axis=None, keepdims=False)"},
  {"softmax", bi_softmax, IN_TOP | IN_JNP | IN_NN, "softmax(x, axis=-1)"},
  {"log_softmax", bi_log_softmax, IN_TOP | IN_JNP | IN_NN, "log_softmax(x, axis=-1)"},
  {"one_hot", bi_one_hot, IN_TOP | IN_JNP | IN_NN, "one_hot(x, num_classes, dtype=float32, axis=-1)"},
  {"allclose", bi_allclose, NP, "allclose(a, b, rtol=1e-05, atol=1e-08): True or False"},
  {"isclose", bi_isclose, NP, "isclose(a, b, rtol=1e-05, atol=1e-08)"},
  {"array_equal", bi_array_equal, NP, "array_equal(a1, a2)"},
  {"take", bi_take, NP, "take(a, indices, axis=None, out=None, mode=None, unique_indices=False, indices_are_sorted=False, fill_value=None)"},
  {"dynamic_slice", bi_dynamic_slice, IN_TOP | IN_LAX, "dynamic_slice(operand, start_indices, slice_sizes): starts clamped"},
  {"dynamic_slice_in_dim", bi_dynamic_slice_in_dim, IN_LAX, "dynamic_slice_in_dim(operand, start_index, slice_size, axis=0)"},
  {"dynamic_index_in_dim", bi_dynamic_index_in_dim, IN_LAX, "dynamic_index_in_dim(operand, index, axis=0, keepdims=True)"},
  {"dynamic_update_slice_in_dim", bi_dynamic_update_slice_in_dim, IN_LAX, "dynamic_update_slice_in_dim(operand, update, start_index, axis)"},
  {"dynamic_update_slice", bi_dynamic_update_slice, IN_TOP | IN_LAX, "dynamic_update_slice(operand, update, start_indices)"},
  {"astype", bi_astype, NP, "astype(x, dtype)"},
  {"result_type", bi_result_type, IN_JNP, "result_type(*arrays_and_dtypes)"},
  {NULL, NULL, 0, NULL},
};
