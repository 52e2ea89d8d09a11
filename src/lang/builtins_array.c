/*
 * builtins_array.c - creating arrays and changing their layout: array,
 * zeros, arange, linspace, eye, reshape, transpose, tile, concatenate,
 * stack, split, squeeze, flip, tril/triu, with NumPy's argument names and
 * JAX's 32-bit dtype defaults (arange(5) is int32, arange(5.) and
 * zeros(3) float32).
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array/array.h"
#include "lang/builtins.h"
#include "lang/builtins_impl.h"
#include "base/error.h"
#include "lang/eval.h"
#include "base/intern.h"
#include "base/mem.h"
#include "array/npy.h"
#include "lang/ops.h"
#include "array/prim.h"
#include "array/print.h"

/* ======================================================================
 * Creation
 * ====================================================================== */

/* ops_to_array for array() and asarray(): a Python number becomes a fresh
 * 0-d array, weakly typed as in JAX (jnp.array(2.5) is a weak f32), so
 * what follows computes in f32 as under jit, not on the number's double. */
static Value *to_new_array(Value *obj, int t) {
  Value *v = ops_to_array(obj, t);
  if (!arr_is_host(v)) return v;
  Array *h = (Array *)v, *r;
  if (dt_is_float(h->dtype))
    r = arr_scalar_f64(h->dtype, arr_get_f64(h, 0), h->weak);
  else
    r = arr_scalar_i64(h->dtype, arr_get_i64(h, 0), h->weak);
  val_decref(v);
  return (Value *)r;
}

static Value *bi_array(const CallArgs *a) {
  Value *obj, *dtype, *copy, *ndmin;
  Value **slots[] = {&obj, &dtype, &copy, &ndmin};
  if (args_bind("array", a, "object, dtype=, copy=, ndmin=", slots) < 0) return NULL;
  int t;
  if (ops_dtype_arg(dtype, &t) < 0) return NULL;
  if (!bi_is_none(ndmin)) return err_set(ERR_VALUE, "array(): ndmin is not supported");
  return to_new_array(obj, t);
}

static Value *bi_asarray(const CallArgs *a) {
  Value *obj, *dtype;
  Value **slots[] = {&obj, &dtype};
  if (args_bind("asarray", a, "a, dtype=", slots) < 0) return NULL;
  int t;
  if (ops_dtype_arg(dtype, &t) < 0) return NULL;
  return to_new_array(obj, t);
}

/* zeros/ones/empty/full share this: [fill] NULL means the constant [v]. */
static Value *make_full(const char *fname, Value *shape, Value *fill, double v, Value *dtype) {
  int nd, t;
  int64_t sh[SHM_MAXDIM];
  if (ops_shape_arg(shape, &nd, sh) < 0 || ops_dtype_arg(dtype, &t) < 0) return NULL;
  for (int i = 0; i < nd; i++)
    if (sh[i] < 0) return err_set(ERR_VALUE, "negative dimensions are not allowed");
  if (!fill) return bi_fill(t < 0 ? DT_F32 : (DType)t, v, nd, sh);
  Value *f = bi_arr_dtype(fill, t);   /* 2**40 or a Python float's double, for dtype t */
  if (!f) return NULL;
  AVal fa = bi_aval(f);
  DType ct = t < 0 ? fa.dtype : (DType)t;
  Value *c = arr_check_size(ct, nd, sh) < 0 ? NULL : ops_convert(f, ct, t < 0 && fa.weak);
  val_decref(f);
  if (!c) return NULL;
  Value *r = ops_broadcast_to(c, nd, sh);
  val_decref(c);
  return r;
}

static Value *bi_zeros(const CallArgs *a) {
  Value *shape, *dtype, *sh = NULL;
  Value **slots[] = {&shape, &dtype, &sh};
  if (args_bind("zeros", a, "shape, dtype=, out_sharding=", slots) < 0) return NULL;
  return bi_out_sharding(make_full("zeros", shape, NULL, 0, dtype), sh);
}

static Value *bi_ones(const CallArgs *a) {
  Value *shape, *dtype, *sh = NULL;
  Value **slots[] = {&shape, &dtype, &sh};
  if (args_bind("ones", a, "shape, dtype=, out_sharding=", slots) < 0) return NULL;
  return bi_out_sharding(make_full("ones", shape, NULL, 1, dtype), sh);
}

static Value *bi_full(const CallArgs *a) {
  Value *shape, *fill, *dtype, *sh = NULL;
  Value **slots[] = {&shape, &fill, &dtype, &sh};
  if (args_bind("full", a, "shape, fill_value, dtype=, out_sharding=", slots) < 0) return NULL;
  return bi_out_sharding(make_full("full", shape, fill, 0, dtype), sh);
}

/* zeros_like/ones_like/full_like: shape and dtype from [x] unless given. */
static Value *make_like(const char *fname, Value *x, Value *fill, double v, Value *dtype,
                        Value *shape) {
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  val_decref(xa);
  int t;
  if (ops_dtype_arg(dtype, &t) < 0) return NULL;
  if (t < 0) t = (int)av.dtype;
  int nd = av.ndim;
  int64_t sh[SHM_MAXDIM];
  memcpy(sh, av.shape, sizeof(int64_t) * (size_t)nd);
  if (!bi_is_none(shape) && ops_shape_arg(shape, &nd, sh) < 0) return NULL;
  if (!fill) return bi_fill((DType)t, v, nd, sh);
  Value *f = bi_arr_dtype(fill, t);   /* a Python float from its double */
  Value *c = f ? ops_convert(f, (DType)t, false) : NULL;
  Value *r = c ? ops_broadcast_to(c, nd, sh) : NULL;
  bi_drop(f, c, NULL, NULL);
  return r;
}

static Value *bi_zeros_like(const CallArgs *a) {
  Value *x, *dtype, *shape;
  Value **slots[] = {&x, &dtype, &shape};
  if (args_bind("zeros_like", a, "a, dtype=, shape=", slots) < 0) return NULL;
  return make_like("zeros_like", x, NULL, 0, dtype, shape);
}

static Value *bi_ones_like(const CallArgs *a) {
  Value *x, *dtype, *shape;
  Value **slots[] = {&x, &dtype, &shape};
  if (args_bind("ones_like", a, "a, dtype=, shape=", slots) < 0) return NULL;
  return make_like("ones_like", x, NULL, 1, dtype, shape);
}

static Value *bi_full_like(const CallArgs *a) {
  Value *x, *fill, *dtype, *shape;
  Value **slots[] = {&x, &fill, &dtype, &shape};
  if (args_bind("full_like", a, "a, fill_value, dtype=, shape=", slots) < 0) return NULL;
  return make_like("full_like", x, fill, 0, dtype, shape);
}

/* True when [v] is a float-typed number or array. */
static bool is_float_val(Value *v) {
  return !bi_is_none(v) && ops_is_array(v) && dt_is_float(bi_aval(v).dtype);
}

/* Reads arange's integer bound [v] ([dflt] when None) and checks that
 * dtype [t] holds it: a bound past it is JAX's OverflowError, where
 * computing through the dtype would wrap every element. */
static int arange_int(const char *pname, Value *v, int64_t dflt, DType t, int64_t *out) {
  if (bi_int_arg("arange", pname, v, dflt, out) < 0) return -1;
  if (dt_holds(t, *out)) return 0;
  ops_int_overflow(*out, t);
  return -1;
}

/* [r] (consumed) [id] the exact integer [x] of dtype [t]: a new
 * reference, or NULL with the error set. */
static Value *arange_step(Value *r, PrimId id, int64_t x, DType t) {
  Value *c = (Value *)arr_scalar_i64(t, x, false);
  Value *m = c ? bi_bin(id, r, c) : NULL;
  val_decref(c);
  val_decref(r);
  return m;
}

/* jnp.arange of integer bounds into integer dtype [t]: exact, with no
 * double between (int64 bounds past 2**53 stay exact). */
static Value *arange_ints(Value *start, Value *stop, Value *step, DType t) {
  int64_t s0 = 0, s1, st;
  if (bi_is_none(stop) ? arange_int("start", start, 0, t, &s1) < 0
                       : arange_int("start", start, 0, t, &s0) < 0 ||
                             arange_int("stop", stop, 0, t, &s1) < 0)
    return NULL;
  if (arange_int("step", step, 1, t, &st) < 0) return NULL;
  if (st == 0) return err_set(ERR_VALUE, "arange: step cannot be zero");
  __int128 span = (__int128)s1 - s0, len = st > 0 ? (span + st - 1) / st : (span + st + 1) / st;
  int64_t n = len > 0 ? (int64_t)len : 0;
  Value *r = bi_iota(t, 1, &n, 0);
  if (r && st != 1) r = arange_step(r, P_MUL, st, t);
  if (r && s0 != 0) r = arange_step(r, P_ADD, s0, t);
  return r;
}

/* jnp.arange: iota * step + start, in i32 for int arguments, else f32. */
static Value *arange_of(Value *start, Value *stop, Value *step, Value *dtype) {
  int t;
  if (ops_dtype_arg(dtype, &t) < 0) return NULL;
  bool floats = is_float_val(start) || is_float_val(stop) || is_float_val(step);
  if (t < 0) t = floats ? DT_F32 : DT_I32;
  if (!floats && dt_is_int((DType)t)) return arange_ints(start, stop, step, (DType)t);
  double s0, s1, st;
  if (bi_is_none(stop)) {
    if (bi_float_arg("arange", "start", start, 0, &s1) < 0) return NULL;
    s0 = 0;
  } else if (bi_float_arg("arange", "start", start, 0, &s0) < 0 ||
             bi_float_arg("arange", "stop", stop, 0, &s1) < 0) {
    return NULL;
  }
  if (bi_float_arg("arange", "step", step, 1, &st) < 0) return NULL;
  if (st == 0) return err_set(ERR_VALUE, "arange: step cannot be zero");
  double len = ceil((s1 - s0) / st);
  if (!(len > 0)) len = 0;
  if (len > 1e15) return err_set(ERR_MEMORY, "arange: %g elements are too many", len);
  int64_t n = (int64_t)len;
  Value *r = bi_iota((DType)t, 1, &n, 0);
  if (r && st != 1) {
    Value *m = bi_bin_const(P_MUL, r, st);
    val_decref(r);
    r = m;
  }
  if (r && s0 != 0) {
    Value *m = bi_bin_const(P_ADD, r, s0);
    val_decref(r);
    r = m;
  }
  return r;
}

static Value *bi_arange(const CallArgs *a) {
  Value *start, *stop, *step, *dtype, *sh = NULL;
  Value **slots[] = {&start, &stop, &step, &dtype, &sh};
  if (args_bind("arange", a, "start, stop=, step=, dtype=, out_sharding=", slots) < 0) return NULL;
  return bi_out_sharding(arange_of(start, stop, step, dtype), sh);
}

/* numpy.linspace, computed in float64 as NumPy does, then converted. */
static Value *bi_linspace(const CallArgs *a) {
  Value *start, *stop, *num, *endpoint, *retstep, *dtype;
  Value **slots[] = {&start, &stop, &num, &endpoint, &retstep, &dtype};
  if (args_bind("linspace", a, "start, stop, num=, endpoint=, retstep=, dtype=", slots) < 0)
    return NULL;
  double s0, s1;
  int64_t n;
  bool ep;
  int t;
  if (bi_float_arg("linspace", "start", start, 0, &s0) < 0 ||
      bi_float_arg("linspace", "stop", stop, 0, &s1) < 0 ||
      bi_int_arg("linspace", "num", num, 50, &n) < 0 || bi_bool_arg(endpoint, true, &ep) < 0 ||
      ops_dtype_arg(dtype, &t) < 0)
    return NULL;
  if (n < 0) return err_set(ERR_VALUE, "Number of samples, %lld, must be non-negative.", (long long)n);
  Array *buf = arr_new(DT_F64, 1, &n);
  if (!buf) return NULL;
  double div = ep ? (double)(n - 1) : (double)n;
  double step = div > 0 ? (s1 - s0) / div : 0;
  double *d = arr_data(buf);
  for (int64_t i = 0; i < n; i++) d[i] = s0 + (double)i * step;
  if (ep && n > 1) d[n - 1] = s1;
  Array *r = arr_astype(buf, t < 0 ? DT_F32 : (DType)t, false);
  val_decref((Value *)buf);
  return (Value *)r;
}

/* jnp.eye: bi_iota(0) + k == bi_iota(1), converted to the dtype. */
static Value *bi_eye(const CallArgs *a) {
  Value *N, *M, *k, *dtype;
  Value **slots[] = {&N, &M, &k, &dtype};
  if (args_bind("eye", a, "N, M=, k=, dtype=", slots) < 0) return NULL;
  int64_t sh[2], kk;
  int t;
  if (bi_int_arg("eye", "N", N, 0, &sh[0]) < 0 || bi_int_arg("eye", "M", M, sh[0], &sh[1]) < 0 ||
      bi_int_arg("eye", "k", k, 0, &kk) < 0 || ops_dtype_arg(dtype, &t) < 0)
    return NULL;
  if (sh[0] < 0 || sh[1] < 0) return err_set(ERR_VALUE, "negative dimensions are not allowed");
  Value *r0 = bi_iota(DT_I32, 2, sh, 0), *r1 = r0 ? bi_iota(DT_I32, 2, sh, 1) : NULL;
  Value *rk = r1 && kk ? bi_bin_const(P_ADD, r0, (double)kk) : val_incref(r0);
  Value *eq = rk ? bi_bin(P_EQ, rk, r1) : NULL;
  Value *r = eq ? ops_convert(eq, t < 0 ? DT_F32 : (DType)t, false) : NULL;
  bi_drop(r0, r1, rk, eq);
  return r;
}

static Value *bi_identity(const CallArgs *a) {
  Value *n, *dtype;
  Value **slots[] = {&n, &dtype};
  if (args_bind("identity", a, "n, dtype=", slots) < 0) return NULL;
  Value *args[1] = {n};
  CallArgs b = {1, args, dtype ? 1 : 0, (const char *[]){"dtype"}, &dtype};
  return bi_eye(&b);
}

/* ======================================================================
 * Shapes and layout
 * ====================================================================== */

static Value *reshape_of(const CallArgs *a) {
  Value *x, *shape, *order, *newshape, *out_sh = NULL;
  Value **slots[] = {&x, &shape, &order, &newshape, &out_sh};
  if (args_bind("reshape", a, "a, shape=, order=, newshape=, out_sharding=", slots) < 0) return NULL;
  if (bi_is_none(shape)) shape = newshape;
  if (bi_is_none(shape)) return err_set(ERR_TYPE, "reshape() missing required argument 'shape'");
  if (order && order->type == V_STR && strcmp(str_cstr(order), "C"))
    return err_set(ERR_VALUE, "reshape: only order='C' is supported");
  int nd;
  int64_t sh[SHM_MAXDIM];
  if (ops_shape_arg(shape, &nd, sh) < 0) return NULL;
  Value *xa = bi_arr(x);
  Value *r = xa ? ops_reshape(xa, nd, sh) : NULL;
  val_decref(xa);
  return r;
}

/* jnp.reshape(a, shape, out_sharding=): the result laid out so. */
static Value *bi_reshape(const CallArgs *a) {
  Value *x, *shape, *order, *newshape, *sh = NULL;
  Value **slots[] = {&x, &shape, &order, &newshape, &sh};
  if (args_bind("reshape", a, "a, shape=, order=, newshape=, out_sharding=", slots) < 0) return NULL;
  return bi_with_out_sharding(reshape_of, a, sh);
}

/* A permutation from an `axes` argument for rank [nd]; reversed if None. */
static int perm_arg(Value *axes, int nd, int *perm) {
  if (bi_is_none(axes)) {
    for (int i = 0; i < nd; i++) perm[i] = nd - 1 - i;
    return 0;
  }
  int n;
  if (ops_axes_arg(axes, nd, &n, perm) < 0) return -1;
  if (n != nd) {
    err_set(ERR_VALUE, "axes don't match array");
    return -1;
  }
  return 0;
}

static Value *bi_transpose(const CallArgs *a) {
  Value *x, *axes;
  Value **slots[] = {&x, &axes};
  if (args_bind("transpose", a, "a, axes=", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  int perm[SHM_MAXDIM];
  Value *r = perm_arg(axes, av.ndim, perm) < 0 ? NULL : ops_transpose(xa, av.ndim, perm);
  val_decref(xa);
  return r;
}

static Value *bi_swapaxes(const CallArgs *a) {
  Value *x, *a1, *a2;
  Value **slots[] = {&x, &a1, &a2};
  if (args_bind("swapaxes", a, "a, axis1, axis2", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  int perm[SHM_MAXDIM], i1, i2;
  int64_t x1, x2;
  for (int i = 0; i < av.ndim; i++) perm[i] = i;
  Value *r = NULL;
  if (bi_is_none(a1) || bi_is_none(a2))
    err_set(ERR_TYPE, "swapaxes() axis1 and axis2 must be integers");
  else if (bi_int_arg("swapaxes", "axis1", a1, 0, &x1) == 0 &&
      bi_int_arg("swapaxes", "axis2", a2, 0, &x2) == 0 && axis_normalize(x1, av.ndim, &i1) == 0 &&
      axis_normalize(x2, av.ndim, &i2) == 0) {
    perm[i1] = i2;
    perm[i2] = i1;
    r = ops_transpose(xa, av.ndim, perm);
  }
  val_decref(xa);
  return r;
}

static Value *bi_ravel(const CallArgs *a) {
  Value *x, *order;
  Value **slots[] = {&x, &order};
  if (args_bind("ravel", a, "a, order=", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  Value *r = xa ? bi_ravel_of(xa) : NULL;
  val_decref(xa);
  return r;
}

static Value *bi_broadcast_to(const CallArgs *a) {
  Value *x, *shape;
  Value **slots[] = {&x, &shape};
  if (args_bind("broadcast_to", a, "array, shape", slots) < 0) return NULL;
  int nd;
  int64_t sh[SHM_MAXDIM];
  if (ops_shape_arg(shape, &nd, sh) < 0) return NULL;
  Value *xa = bi_arr(x);
  Value *r = xa ? ops_broadcast_to(xa, nd, sh) : NULL;
  val_decref(xa);
  return r;
}

static Value *bi_squeeze(const CallArgs *a) {
  Value *x, *axis;
  Value **slots[] = {&x, &axis};
  if (args_bind("squeeze", a, "a, axis=", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  int64_t dims[SHM_MAXDIM];
  int n = 0, ax[SHM_MAXDIM], na;
  Value *r = NULL;
  if (bi_is_none(axis)) {
    for (int i = 0; i < av.ndim; i++)
      if (av.shape[i] == 1) dims[n++] = i;
  } else if (ops_axes_arg(axis, av.ndim, &na, ax) == 0) {
    for (int i = 0; i < na; i++) {
      if (av.shape[ax[i]] != 1) {
        err_set(ERR_VALUE, "cannot select an axis to squeeze out which has size not equal to one");
        goto done;
      }
      dims[n++] = ax[i];
    }
  } else {
    goto done;
  }
  r = ops_squeeze(xa, n, dims);
done:
  val_decref(xa);
  return r;
}

static Value *bi_expand_dims(const CallArgs *a) {
  Value *x, *axis;
  Value **slots[] = {&x, &axis};
  if (args_bind("expand_dims", a, "a, axis", slots) < 0) return NULL;
  if (bi_is_none(axis)) return err_set(ERR_TYPE, "expand_dims: axis must be an int or a tuple of ints");
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  int n = 1;
  if (bi_is_seq(axis)) n = (int)(axis->type == V_TUPLE ? tuple_len(axis) : list_len(axis));
  int ax[SHM_MAXDIM];
  int64_t dims[SHM_MAXDIM];
  Value *r = NULL;
  if (av.ndim + n <= SHM_MAXDIM && ops_axes_arg(axis, av.ndim + n, &n, ax) == 0) {
    bi_sorted_axes(n, ax, dims);
    r = ops_expand_dims(xa, n, dims);
  }
  val_decref(xa);
  return r;
}

static Value *bi_flip(const CallArgs *a) {
  Value *x, *axis;
  Value **slots[] = {&x, &axis};
  if (args_bind("flip", a, "m, axis=", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  int n, ax[SHM_MAXDIM];
  Value *r = NULL;
  if (ops_axes_arg(axis, av.ndim, &n, ax) == 0) {
    int64_t dims[SHM_MAXDIM];
    for (int i = 0; i < n; i++) dims[i] = ax[i];
    Params p;
    params_init(&p);
    params_add(&p, "dimensions", val_int_tuple(n, dims));
    r = n ? ops_apply(P_REV, 1, &xa, &p) : val_incref(xa);
    params_clear(&p);
  }
  val_decref(xa);
  return r;
}

/* jnp.tile: reshape to (1, d0, 1, d1, ...), broadcast to (r0, d0, r1,
 * d1, ...), reshape to (r0*d0, r1*d1, ...). */
static Value *bi_tile(const CallArgs *a) {
  Value *x, *reps;
  Value **slots[] = {&x, &reps};
  if (args_bind("tile", a, "A, reps", slots) < 0) return NULL;
  int nr;
  int64_t r[SHM_MAXDIM];
  if (ops_shape_arg(reps, &nr, r) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  int nd = av.ndim > nr ? av.ndim : nr;
  int64_t d[SHM_MAXDIM], rr[SHM_MAXDIM], s1[2 * SHM_MAXDIM], s2[2 * SHM_MAXDIM], fin[SHM_MAXDIM];
  if (2 * nd > SHM_MAXDIM) {
    val_decref(xa);
    return err_set(ERR_VALUE, "tile: too many dimensions");
  }
  for (int i = 0; i < nd; i++) {
    int di = i - (nd - av.ndim), ri = i - (nd - nr);
    d[i] = di >= 0 ? av.shape[di] : 1;
    rr[i] = ri >= 0 ? r[ri] : 1;
    if (rr[i] < 0) {
      val_decref(xa);
      return err_set(ERR_VALUE, "negative dimensions are not allowed");
    }
    s1[2 * i] = 1;
    s1[2 * i + 1] = d[i];
    s2[2 * i] = rr[i];
    s2[2 * i + 1] = d[i];
    fin[i] = rr[i] * d[i];
  }
  Value *t1 = ops_reshape(xa, 2 * nd, s1);
  Value *t2 = t1 ? ops_broadcast_to(t1, 2 * nd, s2) : NULL;
  Value *res = t2 ? ops_reshape(t2, nd, fin) : NULL;
  bi_drop(xa, t1, t2, NULL);
  return res;
}

/* The arrays of a sequence argument, converted; n set. */
Value **bi_arrays_arg(const char *fname, Value *seq, int *n) {
  size_t len;
  Value *const *items;
  if (!val_seq(seq, &len, &items)) {
    if (ops_is_array(seq)) {
      Value *l = ops_iter_items(seq);
      if (!l) return NULL;
      Value **r = bi_arrays_arg(fname, l, n);
      val_decref(l);
      return r;
    }
    err_set(ERR_TYPE, "%s() expects a sequence of arrays, got '%s'", fname, val_type_name(seq));
    return NULL;
  }
  if (len == 0) {
    err_set(ERR_VALUE, "need at least one array to %s", strcmp(fname, "stack") ? "concatenate" : "stack");
    return NULL;
  }
  Value **out = shm_calloc(len, sizeof(Value *));
  if (!out) {
    err_nomem();
    return NULL;
  }
  for (size_t i = 0; i < len; i++)
    if (!(out[i] = bi_arr(items[i]))) {
      for (size_t j = 0; j < i; j++) val_decref(out[j]);
      shm_free(out);
      return NULL;
    }
  *n = (int)len;
  return out;
}

void bi_free_arrays(Value **xs, int n) {
  for (int i = 0; i < n; i++) val_decref(xs[i]);
  shm_free(xs);
}

/* lax.concatenate of [n] arrays promoted to one dtype along [axis]. */
Value *bi_concat(Value **xs, int n, int axis) {
  DType t = DT_BOOL;
  bool weak = true;
  for (int i = 0; i < n; i++) {
    AVal av = bi_aval(xs[i]);
    if (av.ndim == 0) return err_set(ERR_VALUE, "zero-dimensional arrays cannot be concatenated");
    t = i == 0 ? av.dtype : dt_promote(t, weak, av.dtype, av.weak, &weak);
    if (i == 0) weak = av.weak;
  }
  Value **cs = shm_calloc((size_t)n, sizeof(Value *));
  if (!cs) return err_nomem();
  int k = 0;
  Value *r = NULL;
  for (; k < n; k++)
    if (!(cs[k] = ops_convert(xs[k], t, weak))) break;
  if (k == n) {
    if (n == 1) {
      r = val_incref(cs[0]);
    } else {
      Params p;
      params_init(&p);
      params_add(&p, "dimension", val_int(axis));
      r = ops_apply(P_CONCATENATE, n, cs, &p);
      params_clear(&p);
    }
  }
  bi_free_arrays(cs, k);
  return r;
}

static Value *slice_axis(Value *x, int axis, int64_t lo, int64_t hi);

/* [x] rolled by [shift] along axis [ax]: the last shift elements first. */
static Value *roll_axis(Value *x, int64_t shift, int ax) {
  AVal av = bi_aval(x);
  int64_t n = av.shape[ax], s = n ? ((shift % n) + n) % n : 0;
  if (s == 0) return val_incref(x);
  Value *parts[2] = {slice_axis(x, ax, n - s, n), slice_axis(x, ax, 0, n - s)};
  Value *r = parts[0] && parts[1] ? bi_concat(parts, 2, ax) : NULL;
  val_decref(parts[0]);
  val_decref(parts[1]);
  return r;
}

/* jnp.roll(a, shift, axis=None): elements shifted along [axis] (each of a
 * tuple of axes by the matching shift), those past the end coming back at
 * the start; with no axis, over the flattened array, shape kept.  Shifts
 * are Python ints (JAX also takes traced ones). */
static Value *bi_roll(const CallArgs *a) {
  Value *x, *shift, *axis;
  Value **slots[] = {&x, &shift, &axis};
  if (args_bind("roll", a, "a, shift, axis=", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  size_t ns = 1, na = 1;
  Value *const *ss = &shift, *const *as = &axis;
  if (val_seq(shift, &ns, &ss) && (bi_is_none(axis) || !val_seq(axis, &na, &as) || na != ns)) {
    val_decref(xa);
    return err_set(ERR_VALUE, "roll: shift and axis must be sequences of the same length");
  }
  if (bi_is_none(axis)) {   /* over the flattened array */
    int64_t s;
    Value *flat = bi_int_arg("roll", "shift", shift, 0, &s) < 0 ? NULL : bi_ravel_of(xa);
    Value *rolled = flat ? roll_axis(flat, s, 0) : NULL;
    Value *r = rolled ? ops_reshape(rolled, av.ndim, av.shape) : NULL;
    val_decref(flat);
    val_decref(rolled);
    val_decref(xa);
    return r;
  }
  if (!val_seq(axis, &na, &as)) as = &axis, na = 1;
  Value *r = xa;
  for (size_t k = 0; r && k < na; k++) {
    int64_t s, ax;
    int axn;
    Value *next = NULL;
    if (bi_int_arg("roll", "shift", ss[k], 0, &s) == 0 && bi_int_arg("roll", "axis", as[k], 0, &ax) == 0 &&
        axis_normalize(ax, av.ndim, &axn) == 0)
      next = roll_axis(r, s, axn);
    val_decref(r);
    r = next;
  }
  return r;
}

static Value *bi_concatenate(const CallArgs *a) {
  Value *arrays, *axis, *dtype;
  Value **slots[] = {&arrays, &axis, &dtype};
  if (args_bind("concatenate", a, "arrays, axis=, dtype=", slots) < 0) return NULL;
  int n;
  Value **xs = bi_arrays_arg("concatenate", arrays, &n);
  if (!xs) return NULL;
  Value *r = NULL;
  AVal av = bi_aval(xs[0]);
  if (bi_is_none(axis) && axis) {
    for (int i = 0; i < n; i++) {
      Value *f = bi_ravel_of(xs[i]);
      val_decref(xs[i]);
      xs[i] = f;
      if (!f) {
        bi_free_arrays(xs, i);
        return NULL;
      }
    }
    r = bi_concat(xs, n, 0);
  } else {
    int64_t ax;
    int axn;
    if (bi_int_arg("concatenate", "axis", axis, 0, &ax) == 0 &&
        (av.ndim == 0 ? (err_set(ERR_VALUE, "zero-dimensional arrays cannot be concatenated"), -1)
                      : axis_normalize(ax, av.ndim, &axn)) == 0)
      r = bi_concat(xs, n, axn);
  }
  bi_free_arrays(xs, n);
  if (r && !bi_is_none(dtype)) {
    int t;
    Value *c = ops_dtype_arg(dtype, &t) == 0 ? ops_convert(r, (DType)t, false) : NULL;
    val_decref(r);
    r = c;
  }
  return r;
}

static Value *bi_stack(const CallArgs *a) {
  Value *arrays, *axis;
  Value **slots[] = {&arrays, &axis};
  if (args_bind("stack", a, "arrays, axis=", slots) < 0) return NULL;
  int n;
  Value **xs = bi_arrays_arg("stack", arrays, &n);
  if (!xs) return NULL;
  AVal a0 = bi_aval(xs[0]);
  int64_t ax;
  int axn;
  Value *r = NULL;
  if (bi_int_arg("stack", "axis", axis, 0, &ax) < 0 || axis_normalize(ax, a0.ndim + 1, &axn) < 0)
    goto done;
  for (int i = 0; i < n; i++) {
    AVal ai = bi_aval(xs[i]);
    if (ai.ndim != a0.ndim || memcmp(ai.shape, a0.shape, sizeof(int64_t) * (size_t)a0.ndim)) {
      err_set(ERR_VALUE, "all input arrays must have the same shape");
      goto done;
    }
    int64_t d = axn;
    Value *e = ops_expand_dims(xs[i], 1, &d);
    if (!e) goto done;
    val_decref(xs[i]);
    xs[i] = e;
  }
  r = bi_concat(xs, n, axn);
done:
  bi_free_arrays(xs, n);
  return r;
}

/* lax.slice of [x] along [axis] from [lo] to [hi]. */
static Value *slice_axis(Value *x, int axis, int64_t lo, int64_t hi) {
  AVal av = bi_aval(x);
  int64_t st[SHM_MAXDIM], li[SHM_MAXDIM];
  for (int i = 0; i < av.ndim; i++) {
    st[i] = 0;
    li[i] = av.shape[i];
  }
  st[axis] = lo;
  li[axis] = hi;
  Params p;
  params_init(&p);
  params_add(&p, "start_indices", val_int_tuple(av.ndim, st));
  params_add(&p, "limit_indices", val_int_tuple(av.ndim, li));
  params_add(&p, "strides", VAL_NONE);
  Value *r = ops_apply(P_SLICE, 1, &x, &p);
  params_clear(&p);
  return r;
}

Value *bi_slice_axis(Value *x, int axis, int64_t lo, int64_t hi) {
  return slice_axis(x, axis, lo, hi);
}

/* jnp.split / array_split: a list of slices along [axis]. */
static Value *split_impl(const char *fname, const CallArgs *a, bool equal) {
  Value *x, *ios, *axis;
  Value **slots[] = {&x, &ios, &axis};
  if (args_bind(fname, a, "ary, indices_or_sections, axis=", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  int64_t ax;
  int axn;
  Value *res = NULL;
  int64_t cuts[1026];
  int nc = 0;
  if (bi_int_arg(fname, "axis", axis, 0, &ax) < 0 || axis_normalize(ax, av.ndim, &axn) < 0) goto done;
  int64_t len = av.shape[axn];
  cuts[nc++] = 0;
  if (bi_is_seq(ios) || (ops_is_array(ios) && bi_aval(ios).ndim == 1)) {
    int ni;
    int64_t idx[SHM_MAXDIM];
    if (ops_shape_arg(ios, &ni, idx) < 0) goto done;
    for (int i = 0; i < ni; i++) {
      int64_t c = idx[i] < 0 ? idx[i] + len : idx[i];
      cuts[nc++] = c < 0 ? 0 : c > len ? len : c;
    }
  } else {
    int64_t ns;
    if (bi_int_arg(fname, "indices_or_sections", ios, 1, &ns) < 0) goto done;
    if (ns <= 0 || ns > 1024) {
      err_set(ERR_VALUE, "number sections must be larger than 0.");
      goto done;
    }
    if (equal && len % ns) {
      err_set(ERR_VALUE, "array split does not result in an equal division");
      goto done;
    }
    int64_t base = len / ns, extra = len % ns, pos = 0;
    for (int64_t i = 1; i < ns; i++) {
      pos += base + (i <= extra ? 1 : 0);
      cuts[nc++] = pos;
    }
  }
  cuts[nc++] = len;
  res = list_new((size_t)nc);
  for (int i = 0; res && i + 1 < nc; i++) {
    int64_t lo = cuts[i], hi = cuts[i + 1] < lo ? lo : cuts[i + 1];
    Value *s = slice_axis(xa, axn, lo, hi);
    if (!s || list_append_steal(res, s) < 0) {
      val_decref(res);
      res = NULL;
    }
  }
done:
  val_decref(xa);
  return res;
}

static Value *bi_split(const CallArgs *a) { return split_impl("split", a, true); }
static Value *bi_array_split(const CallArgs *a) { return split_impl("array_split", a, false); }

/* Triangles: keep where col - row <= k (tril) or >= k (triu). */
static Value *tri_impl(const char *fname, const CallArgs *a, bool lower) {
  Value *m, *k;
  Value **slots[] = {&m, &k};
  if (args_bind(fname, a, "m, k=", slots) < 0) return NULL;
  int64_t kk;
  if (bi_int_arg(fname, "k", k, 0, &kk) < 0) return NULL;
  Value *x = bi_arr(m);
  if (!x) return NULL;
  AVal av = bi_aval(x);
  if (av.ndim < 2) {
    val_decref(x);
    return err_set(ERR_VALUE, "%s: input array must be at least 2-d", fname);
  }
  int64_t sh[2] = {av.shape[av.ndim - 2], av.shape[av.ndim - 1]};
  Value *r0 = bi_iota(DT_I32, 2, sh, 0), *r1 = r0 ? bi_iota(DT_I32, 2, sh, 1) : NULL;
  Value *rk = r1 ? bi_bin_const(P_ADD, r0, (double)kk) : NULL;
  Value *mask = rk ? bi_bin(lower ? P_LE : P_GE, r1, rk) : NULL;
  Value *z = mask ? bi_scalar(av.dtype, 0) : NULL;
  Value *r = z ? ops_select(mask, x, z) : NULL;
  bi_drop(r0, r1, rk, mask);
  bi_drop(z, x, NULL, NULL);
  return r;
}

static Value *bi_tril(const CallArgs *a) { return tri_impl("tril", a, true); }
static Value *bi_triu(const CallArgs *a) { return tri_impl("triu", a, false); }

/* ---- shape queries and a few compositions ----------------------------------- */

static Value *bi_shape(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("shape", a, "a", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  val_decref(xa);
  return val_int_tuple(av.ndim, av.shape);
}

static Value *bi_ndim(const CallArgs *a) {
  Value *x;
  Value **slots[] = {&x};
  if (args_bind("ndim", a, "a", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  val_decref(xa);
  return val_int(av.ndim);
}

static Value *bi_size(const CallArgs *a) {
  Value *x, *axis;
  Value **slots[] = {&x, &axis};
  if (args_bind("size", a, "a, axis=", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  val_decref(xa);
  if (bi_is_none(axis)) return val_int(shape_size(av.ndim, av.shape));
  int n, ax[SHM_MAXDIM];
  if (ops_axes_arg(axis, av.ndim, &n, ax) < 0) return NULL;
  int64_t s = 1;
  for (int i = 0; i < n; i++) s *= av.shape[ax[i]];
  return val_int(s);
}

/* jnp.repeat with an integer count: each element [repeats] times along
 * [axis] (flattened when None), by expand_dims, broadcast and reshape. */
/* repeat with per-element counts [reps] (concrete) along axis [axn] of
 * [src]: a gather of each position as many times as its count, cut or
 * extended by its last position to [total] when total >= 0 (JAX's
 * total_repeat_length). */
static Value *repeat_counts(Value *src, const AVal *av, int axn, Value *reps, int64_t total) {
  Value *ra = ops_to_array(reps, -1);
  if (!ra) return NULL;
  if (!IS_ARRAY(ra)) {
    val_decref(ra);
    return err_set(ERR_VALUE, "repeat: per-element repeats must be concrete values, not traced");
  }
  Array *c = arr_astype(AS_ARRAY(ra), DT_I64, false);
  val_decref(ra);
  if (!c) return NULL;
  int64_t n = av->shape[axn], sum = 0;
  const int64_t *cnt = arr_data(c);
  Value *r = NULL;
  if (c->ndim != 1 || c->size != n) {
    err_set(ERR_VALUE, "repeat: repeats has %lld elements, the axis has %lld",
            (long long)c->size, (long long)n);
    goto done;
  }
  for (int64_t i = 0; i < n; i++) {
    if (cnt[i] < 0) {
      err_set(ERR_VALUE, "repeats may not contain negative values");
      goto done;
    }
    sum += cnt[i];
  }
  int64_t len = total >= 0 ? total : sum;
  Array *idx = arr_new(DT_I32, 1, &len);
  if (!idx) goto done;
  int32_t *d = arr_data(idx);
  int64_t k = 0;
  for (int64_t i = 0; i < n && k < len; i++)
    for (int64_t j = 0; j < cnt[i] && k < len; j++) d[k++] = (int32_t)i;
  for (; k < len; k++) d[k] = k ? d[k - 1] : 0;   /* the last value goes on */
  Params p;
  params_init(&p);
  params_add(&p, "axis", val_int(axn));
  Value *in[2] = {src, &idx->hdr};
  r = ops_apply(P_GATHER, 2, in, &p);
  params_clear(&p);
  val_decref(&idx->hdr);
done:
  val_decref(&c->hdr);
  return r;
}

/* jnp.repeat(a, repeats, axis=None, total_repeat_length=None): an int
 * repeats every element that often; an array gives each its count. */
static Value *bi_repeat(const CallArgs *a) {
  Value *x, *reps, *axis, *total;
  Value **slots[] = {&x, &reps, &axis, &total};
  if (args_bind("repeat", a, "a, repeats, axis=, total_repeat_length=", slots) < 0) return NULL;
  int64_t r = 1, ax, tot = -1;
  AVal rv;
  bool counts = ops_is_array(reps) && ops_aval(reps, &rv) == 0 && rv.ndim > 0;
  if (!counts && bi_int_arg("repeat", "repeats", reps, 1, &r) < 0) return NULL;
  if (r < 0) return err_set(ERR_VALUE, "repeats may not contain negative values");
  if (!bi_is_none(total) && bi_int_arg("repeat", "total_repeat_length", total, -1, &tot) < 0)
    return NULL;
  Value *xa = bi_arr(x);
  Value *src = !xa ? NULL : bi_is_none(axis) ? bi_ravel_of(xa) : val_incref(xa);
  val_decref(xa);
  if (!src) return NULL;
  AVal av = bi_aval(src);
  int axn;
  Value *res = NULL;
  if (bi_int_arg("repeat", "axis", axis, 0, &ax) == 0 && axis_normalize(ax, av.ndim, &axn) == 0) {
    if (counts || tot >= 0) {
      Value *cv = counts ? val_incref(reps) : NULL;
      if (!counts) {   /* an int count with a total: the same count for each */
        int64_t n = av.shape[axn];
        Array *ca = arr_new(DT_I64, 1, &n);
        for (int64_t i = 0; ca && i < n; i++) ((int64_t *)arr_data(ca))[i] = r;
        cv = ca ? &ca->hdr : NULL;
      }
      res = cv ? repeat_counts(src, &av, axn, cv, tot) : NULL;
      if (cv) val_decref(cv);
      val_decref(src);
      return res;
    }
    int64_t d = axn + 1, sh[SHM_MAXDIM], fin[SHM_MAXDIM];
    for (int i = 0, k = 0; i < av.ndim; i++) {
      sh[k++] = av.shape[i];
      if (i == axn) sh[k++] = r;
      fin[i] = i == axn ? av.shape[i] * r : av.shape[i];
    }
    Value *e = av.ndim < SHM_MAXDIM ? ops_expand_dims(src, 1, &d) : NULL;
    if (!e && av.ndim >= SHM_MAXDIM) err_set(ERR_VALUE, "repeat: too many dimensions");
    Value *b = e ? ops_broadcast_to(e, av.ndim + 1, sh) : NULL;
    res = b ? ops_reshape(b, av.ndim, fin) : NULL;
    bi_drop(e, b, NULL, NULL);
  }
  val_decref(src);
  return res;
}

/* The source position of output position [j] of an axis of [n] padded
 * by [lo] in front, under NumPy's pad [mode]. */
static int64_t pad_source(int64_t j, int64_t n, int64_t lo, const char *mode) {
  int64_t k = j - lo;
  if (!strcmp(mode, "edge")) return k < 0 ? 0 : k >= n ? n - 1 : k;
  if (!strcmp(mode, "wrap")) return ((k % n) + n) % n;
  if (!strcmp(mode, "reflect")) {   /* the edge not repeated: period 2n - 2 */
    if (n == 1) return 0;
    int64_t m = ((k % (2 * n - 2)) + 2 * n - 2) % (2 * n - 2);
    return m < n ? m : 2 * n - 2 - m;
  }
  int64_t m = ((k % (2 * n)) + 2 * n) % (2 * n);   /* symmetric: the edge repeated */
  return m < n ? m : 2 * n - 1 - m;
}

/* pad in a mode other than constant: along each axis, a gather of the
 * source positions NumPy's mode gives (so it differentiates and stages
 * like any gather). */
static Value *pad_by_index(Value *x, const AVal *av, const int64_t *lo, const int64_t *hi,
                           const char *mode) {
  Value *cur = val_incref(x);
  for (int i = 0; cur && i < av->ndim; i++) {
    if (!lo[i] && !hi[i]) continue;
    int64_t n = av->shape[i], len = lo[i] + n + hi[i];
    if (n == 0) {
      val_decref(cur);
      return err_set(ERR_VALUE, "can't extend empty axis %d using modes other than 'constant' "
                                "or 'empty'", i);
    }
    Array *idx = arr_new(DT_I32, 1, &len);
    if (!idx) {
      val_decref(cur);
      return NULL;
    }
    int32_t *d = arr_data(idx);
    for (int64_t j = 0; j < len; j++) d[j] = (int32_t)pad_source(j, n, lo[i], mode);
    Params p;
    params_init(&p);
    params_add(&p, "axis", val_int(i));
    Value *in[2] = {cur, &idx->hdr};
    Value *next = ops_apply(P_GATHER, 2, in, &p);
    params_clear(&p);
    val_decref(&idx->hdr);
    val_decref(cur);
    cur = next;
  }
  return cur;
}

/* jnp.pad(array, pad_width, mode='constant', constant_values=0). */
static Value *bi_pad(const CallArgs *a) {
  Value *x, *pw, *mode, *cv;
  Value **slots[] = {&x, &pw, &mode, &cv};
  if (args_bind("pad", a, "array, pad_width, mode=, constant_values=", slots) < 0) return NULL;
  const char *md = mode && mode->type == V_STR ? str_cstr(mode) : "constant";
  bool constant = !strcmp(md, "constant");
  if (!constant && strcmp(md, "edge") && strcmp(md, "wrap") && strcmp(md, "reflect") &&
      strcmp(md, "symmetric"))
    return err_set(ERR_VALUE, "pad: mode '%s' is not supported (constant, edge, wrap, reflect, "
                              "symmetric are)", md);
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  /* pad_width: n, (before, after), or one (before, after) per axis. */
  int64_t lo[SHM_MAXDIM], hi[SHM_MAXDIM];
  size_t n;
  Value *const *items;
  Value *res = NULL;
  for (int i = 0; i < av.ndim; i++) {
    Value *p = pw;
    if (val_seq(pw, &n, &items) && n == (size_t)av.ndim && n > 0 && bi_is_seq(items[0])) p = items[i];
    int np;
    int64_t two[SHM_MAXDIM];
    if (ops_shape_arg(p, &np, two) < 0) goto done;
    if (np != 1 && np != 2) {
      err_set(ERR_VALUE, "pad: pad_width must be an int, a pair, or one pair per axis");
      goto done;
    }
    lo[i] = two[0];
    hi[i] = np == 2 ? two[1] : two[0];
    if (lo[i] < 0 || hi[i] < 0) {
      err_set(ERR_VALUE, "index can't contain negative values");
      goto done;
    }
  }
  if (!constant) {
    res = pad_by_index(xa, &av, lo, hi, md);
    goto done;
  }
  Value *cfg = tuple_new((size_t)av.ndim);
  for (int i = 0; cfg && i < av.ndim; i++) {
    int64_t t3[3] = {lo[i], hi[i], 0};
    tuple_set_steal(cfg, (size_t)i, val_int_tuple(3, t3));
  }
  Value *c = bi_is_none(cv) ? bi_scalar(av.dtype, 0) : bi_arr(cv);
  if (!c) {
    val_decref(cfg);
    goto done;
  }
  Value *cc = c ? ops_convert(c, av.dtype, false) : NULL;
  val_decref(c);
  if (cfg && cc) {
    Params p;
    params_init(&p);
    params_add(&p, "padding_config", cfg);
    cfg = NULL;
    Value *in[2] = {xa, cc};
    res = ops_apply(P_PAD, 2, in, &p);
    params_clear(&p);
  }
  val_decref(cfg);
  val_decref(cc);
done:
  val_decref(xa);
  return res;
}

static Value *bi_moveaxis(const CallArgs *a) {
  Value *x, *src, *dst;
  Value **slots[] = {&x, &src, &dst};
  if (args_bind("moveaxis", a, "a, source, destination", slots) < 0) return NULL;
  Value *xa = bi_arr(x);
  if (!xa) return NULL;
  AVal av = bi_aval(xa);
  int ns, nd, s[SHM_MAXDIM], d[SHM_MAXDIM], perm[SHM_MAXDIM];
  Value *r = NULL;
  if (ops_axes_arg(src, av.ndim, &ns, s) == 0 && ops_axes_arg(dst, av.ndim, &nd, d) == 0) {
    if (ns != nd) {
      err_set(ERR_VALUE, "`source` and `destination` arguments must have the same number of elements");
    } else {
      bool taken[SHM_MAXDIM] = {false}, placed[SHM_MAXDIM] = {false};
      for (int i = 0; i < ns; i++) {
        perm[d[i]] = s[i];
        taken[s[i]] = placed[d[i]] = true;
      }
      for (int i = 0, k = 0; i < av.ndim; i++) {
        if (placed[i]) continue;
        while (taken[k]) k++;
        perm[i] = k++;
      }
      r = ops_transpose(xa, av.ndim, perm);
    }
  }
  val_decref(xa);
  return r;
}

/* hstack and vstack: concatenate along 1 (0 for 1-D) or 0, after making
 * 1-D operands (1, n) for vstack. */
static Value *stack_like(const char *fname, const CallArgs *a, bool vertical) {
  Value *tup;
  Value **slots[] = {&tup};
  if (args_bind(fname, a, "tup", slots) < 0) return NULL;
  int n;
  Value **xs = bi_arrays_arg(fname, tup, &n);
  if (!xs) return NULL;
  for (int i = 0; i < n; i++) {
    AVal av = bi_aval(xs[i]);
    int64_t zero = 0;
    Value *e = av.ndim == 0 || (vertical && av.ndim == 1) ? ops_expand_dims(xs[i], 1, &zero)
                                                          : val_incref(xs[i]);
    val_decref(xs[i]);
    xs[i] = e;
    if (!e) {
      for (int j = i + 1; j < n; j++) val_decref(xs[j]);
      bi_free_arrays(xs, i);
      return NULL;
    }
  }
  int axis = vertical || bi_aval(xs[0]).ndim == 1 ? 0 : 1;
  Value *r = bi_concat(xs, n, axis);
  bi_free_arrays(xs, n);
  return r;
}

static Value *bi_hstack(const CallArgs *a) { return stack_like("hstack", a, false); }
static Value *bi_vstack(const CallArgs *a) { return stack_like("vstack", a, true); }

/* The names this file binds, and where (builtins_impl.h). */
const BiEntry bi_array_table[] = {
  {"array", bi_array, NP, "array(object, dtype=None): a new array from numbers or nested lists"},
  {"asarray", bi_asarray, NP, "asarray(a, dtype=None): a as an array"},
  {"zeros", bi_zeros, NP, "zeros(shape, dtype=float32)"},
  {"ones", bi_ones, NP, "ones(shape, dtype=float32)"},
  {"empty", bi_zeros, NP, "empty(shape, dtype=float32): zeros, as in JAX"},
  {"full", bi_full, NP, "full(shape, fill_value, dtype=None)"},
  {"zeros_like", bi_zeros_like, NP, "zeros_like(a, dtype=None, shape=None)"},
  {"ones_like", bi_ones_like, NP, "ones_like(a, dtype=None, shape=None)"},
  {"full_like", bi_full_like, NP, "full_like(a, fill_value, dtype=None, shape=None)"},
  {"arange", bi_arange, NP, "arange(start, stop=None, step=None, dtype=None)"},
  {"linspace", bi_linspace, NP, "linspace(start, stop, num=50, endpoint=True, dtype=None)"},
  {"eye", bi_eye, NP, "eye(N, M=None, k=0, dtype=float32)"},
  {"identity", bi_identity, NP, "identity(n, dtype=float32)"},
  {"reshape", bi_reshape, NP, "reshape(a, shape): -1 infers one dimension"},
  {"transpose", bi_transpose, NP, "transpose(a, axes=None)"},
  {"swapaxes", bi_swapaxes, NP, "swapaxes(a, axis1, axis2)"},
  {"ravel", bi_ravel, NP, "bi_ravel_of(a): flattened to 1-D"},
  {"flatten", bi_ravel, IN_JNP, "flatten(a): flattened to 1-D"},
  {"broadcast_to", bi_broadcast_to, NP, "broadcast_to(array, shape)"},
  {"squeeze", bi_squeeze, NP, "squeeze(a, axis=None)"},
  {"expand_dims", bi_expand_dims, NP, "expand_dims(a, axis)"},
  {"flip", bi_flip, NP, "flip(m, axis=None)"},
  {"tile", bi_tile, NP, "tile(A, reps)"},
  {"concatenate", bi_concatenate, NP, "concatenate(arrays, axis=0)"},
  {"roll", bi_roll, NP, "roll(a, shift, axis=None): shift elements along axis, wrapping around"},
  {"stack", bi_stack, NP, "stack(arrays, axis=0)"},
  {"split", bi_split, NP, "split(ary, indices_or_sections, axis=0): a list of arrays"},
  {"array_split", bi_array_split, NP, "array_split(ary, indices_or_sections, axis=0)"},
  {"tril", bi_tril, NP, "tril(m, k=0)"},
  {"shape", bi_shape, IN_JNP, "shape(a): a tuple of ints"},
  {"ndim", bi_ndim, IN_JNP, "ndim(a)"},
  {"size", bi_size, IN_JNP, "size(a, axis=None)"},
  {"repeat", bi_repeat, NP, "repeat(a, repeats, axis=None): an integer count"},
  {"pad", bi_pad, NP, "pad(array, pad_width, constant_values=0): mode 'constant'"},
  {"moveaxis", bi_moveaxis, NP, "moveaxis(a, source, destination)"},
  {"hstack", bi_hstack, NP, "hstack(tup)"},
  {"vstack", bi_vstack, NP, "vstack(tup)"},
  {"triu", bi_triu, NP, "triu(m, k=0)"},
  {NULL, NULL, 0, NULL},
};
