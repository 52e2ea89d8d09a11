/*
 * builtins_random.c - jax.random over the PRNG primitives
 * (array/prim_random.h): key, PRNGKey, split, fold_in, bits, uniform,
 * normal, bernoulli, randint, permutation, choice; each JAX's algorithm,
 * so a seed gives JAX's numbers (jax/_src/random.py, default threefry2x32
 * with partitionable bits).
 *
 * A key is an int64 array of shape (2,) holding the two uint32 words of
 * JAX's key data (JAX's typed keys print differently; the words and every
 * number drawn from them are JAX's).
 */
#include <math.h>
#include <string.h>

#include "array/prim_random.h"
#include "lang/builtins.h"
#include "lang/builtins_impl.h"
#include "lang/ops.h"

/* A key from an integer seed: (seed >> 32, seed & 0xffffffff), as
 * threefry_seed makes it. */
static Value *bi_key(const CallArgs *a) {
  Value *seed, *impl = NULL;
  if (args_bind("key", a, "seed, impl=", (Value **[]){&seed, &impl}) < 0) return NULL;
  int64_t s;
  if (arr_to_index(seed, &s) < 0) return NULL;
  int64_t two = 2;
  Array *k = arr_new(DT_I64, 1, &two);
  if (!k) return NULL;
  int64_t *d = arr_data(k);
  d[0] = (int64_t)(((uint64_t)s >> 32) & 0xffffffffu);
  d[1] = (int64_t)((uint64_t)s & 0xffffffffu);
  return &k->hdr;
}

static Value *with_shape(PrimId id, Value *key, int n, const int64_t *shape, DType t, bool dtype) {
  Params p;
  params_init(&p);
  params_add(&p, "shape", val_int_tuple(n, shape));
  if (dtype) params_add(&p, "dtype", dtype_value(t));
  Value *r = ops_apply(id, 1, &key, &p);
  params_clear(&p);
  return r;
}

/* split(key, num=2) */
static Value *bi_split(const CallArgs *a) {
  Value *key, *num = NULL;
  if (args_bind("split", a, "key, num=", (Value **[]){&key, &num}) < 0) return NULL;
  int64_t n = 2;
  if (num && arr_to_index(num, &n) < 0) return NULL;
  return with_shape(P_RANDOM_SPLIT, key, 1, &n, DT_I64, false);
}

/* fold_in(key, data) */
static Value *bi_fold_in(const CallArgs *a) {
  Value *key, *data;
  if (args_bind("fold_in", a, "key, data", (Value **[]){&key, &data}) < 0) return NULL;
  Value *d = ops_convert(data, DT_I64, false);
  Value *r = d ? ops_apply(P_RANDOM_FOLD_IN, 2, (Value *[]){key, d}, NULL) : NULL;
  val_decref(d);
  return r;
}

static int shape_of(Value *v, int *n, int64_t *shape) {
  if (!v || v == VAL_NONE) {
    *n = 0;
    return 0;
  }
  return ops_shape_arg(v, n, shape);
}

/* The mantissa bits of float dtype [t] (finfo.nmant). */
static int mantissa_bits(DType t) {
  return t == DT_BF16 ? 7 : t == DT_F16 ? 10 : t == DT_F32 ? 23 : 52;
}

static int float_dtype(Value *v, DType *t) {
  int d;
  if (ops_dtype_arg(v, &d) < 0) return -1;
  *t = d < 0 ? DT_F32 : (DType)d;
  if (!dt_is_float(*t)) {
    err_set(ERR_VALUE, "dtype argument to `uniform` must be a float dtype, got %s", dt_name(*t));
    return -1;
  }
  return 0;
}

/* bits(key, shape=(), dtype=uint32): the raw 32-bit values (as int64) */
static Value *bi_bits(const CallArgs *a) {
  Value *key, *shape = NULL, *dtype = NULL;
  if (args_bind("bits", a, "key, shape=, dtype=", (Value **[]){&key, &shape, &dtype}) < 0)
    return NULL;
  int n;
  int64_t sh[SHM_MAXDIM];
  if (shape_of(shape, &n, sh) < 0) return NULL;
  return with_shape(P_RANDOM_BITS, key, n, sh, DT_I64, false);
}

/* floats*(maxval - minval) + minval, then max(minval, .): JAX's uniform */
static Value *scale(Value *u, Value *lo, Value *hi, DType t) {
  Value *l = ops_convert(lo, t, false), *h = l ? ops_convert(hi, t, false) : NULL;
  Value *w = h ? ops_binary(OP_SUB, h, l) : NULL;
  Value *m = w ? ops_binary(OP_MUL, u, w) : NULL;
  Value *s = m ? ops_binary(OP_ADD, m, l) : NULL;
  Value *r = s ? ops_apply(P_MAX, 2, (Value *[]){l, s}, NULL) : NULL;
  Value *tmp[] = {l, h, w, m, s};
  for (int i = 0; i < 5; i++) val_decref(tmp[i]);
  return r;
}

static Value *uniform_of(Value *key, int n, const int64_t *sh, DType t, Value *lo, Value *hi) {
  Value *u = with_shape(P_RANDOM_UNIFORM, key, n, sh, t, true);
  Value *r = u ? scale(u, lo, hi, t) : NULL;
  val_decref(u);
  return r;
}

/* uniform(key, shape=(), dtype=float32, minval=0., maxval=1.) */
static Value *bi_uniform(const CallArgs *a) {
  Value *key, *shape = NULL, *dtype = NULL, *lo = NULL, *hi = NULL;
  if (args_bind("uniform", a, "key, shape=, dtype=, minval=, maxval=",
                (Value **[]){&key, &shape, &dtype, &lo, &hi}) < 0)
    return NULL;
  int n;
  int64_t sh[SHM_MAXDIM];
  DType t;
  if (shape_of(shape, &n, sh) < 0 || float_dtype(dtype, &t) < 0) return NULL;
  Array *z = lo ? NULL : arr_scalar_f64(t, 0.0, true), *o = hi ? NULL : arr_scalar_f64(t, 1.0, true);
  Value *r = uniform_of(key, n, sh, t, lo ? lo : &z->hdr, hi ? hi : &o->hdr);
  if (z) val_decref(&z->hdr);
  if (o) val_decref(&o->hdr);
  return r;
}

/* normal(key, shape=(), dtype=float32): sqrt(2) erf_inv(u), u uniform in
 * (-1, 1) from the float of t after -1, each step in t (JAX's
 * _normal_real) */
static Value *bi_normal(const CallArgs *a) {
  Value *key, *shape = NULL, *dtype = NULL;
  if (args_bind("normal", a, "key, shape=, dtype=", (Value **[]){&key, &shape, &dtype}) < 0)
    return NULL;
  int n;
  int64_t sh[SHM_MAXDIM];
  DType t;
  if (shape_of(shape, &n, sh) < 0 || float_dtype(dtype, &t) < 0) return NULL;
  double lo = -1.0 + ldexp(1.0, -mantissa_bits(t) - 1);   /* nextafter(-1, 0) in t */
  Array *l = arr_scalar_f64(t, lo, false), *h = arr_scalar_f64(t, 1.0, false);
  Array *s2 = arr_scalar_f64(t, t == DT_F32 ? (double)(float)M_SQRT2 : M_SQRT2, false);
  Value *u = l && h ? uniform_of(key, n, sh, t, &l->hdr, &h->hdr) : NULL;
  Value *e = u ? ops_unary_prim(P_ERF_INV, u) : NULL;
  Value *r = e && s2 ? ops_binary(OP_MUL, &s2->hdr, e) : NULL;
  Value *tmp[] = {u, e, l ? &l->hdr : NULL, h ? &h->hdr : NULL, s2 ? &s2->hdr : NULL};
  for (int i = 0; i < 5; i++) val_decref(tmp[i]);
  return r;
}

/* bernoulli(key, p=0.5, shape=None): uniform < p */
static Value *bi_bernoulli(const CallArgs *a) {
  Value *key, *p = NULL, *shape = NULL;
  if (args_bind("bernoulli", a, "key, p=, shape=", (Value **[]){&key, &p, &shape}) < 0)
    return NULL;
  Array *half = p ? NULL : arr_scalar_f64(DT_F32, 0.5, true);
  Value *pv = p ? p : &half->hdr;
  AVal pa;
  int n;
  int64_t sh[SHM_MAXDIM];
  Value *r = NULL;
  if (ops_aval(pv, &pa) == 0) {
    if (shape && shape != VAL_NONE) {
      if (shape_of(shape, &n, sh) < 0) goto out;
    } else {
      n = pa.ndim;
      memcpy(sh, pa.shape, sizeof(int64_t) * (size_t)n);
    }
    DType t = dt_is_float(pa.dtype) && pa.dtype != DT_BF16 && pa.dtype != DT_F16 ? pa.dtype : DT_F32;
    Array *z = arr_scalar_f64(t, 0.0, true), *o = arr_scalar_f64(t, 1.0, true);
    Value *u = z && o ? uniform_of(key, n, sh, t, &z->hdr, &o->hdr) : NULL;
    r = u ? ops_compare(OP_LT, u, pv) : NULL;
    val_decref(u);
    if (z) val_decref(&z->hdr);
    if (o) val_decref(&o->hdr);
  }
out:
  if (half) val_decref(&half->hdr);
  return r;
}

/* randint(key, shape, minval, maxval, dtype=int32) */
static Value *bi_randint(const CallArgs *a) {
  Value *key, *shape, *lo, *hi, *dtype = NULL;
  if (args_bind("randint", a, "key, shape, minval, maxval, dtype=",
                (Value **[]){&key, &shape, &lo, &hi, &dtype}) < 0)
    return NULL;
  int n, d;
  int64_t sh[SHM_MAXDIM];
  if (shape_of(shape, &n, sh) < 0 || ops_dtype_arg(dtype, &d) < 0) return NULL;
  DType t = d < 0 ? DT_I32 : (DType)d;
  Value *l = ops_convert(lo, DT_I64, false), *h = l ? ops_convert(hi, DT_I64, false) : NULL;
  Value *r = NULL;
  if (h) {
    Params p;
    params_init(&p);
    params_add(&p, "shape", val_int_tuple(n, sh));
    params_add(&p, "dtype", dtype_value(t));
    r = ops_apply(P_RANDOM_RANDINT, 3, (Value *[]){key, l, h}, &p);
    params_clear(&p);
  }
  val_decref(l);
  val_decref(h);
  return r;
}

/* permutation(key, x, axis=0): a shuffled arange(x), or x's rows shuffled */
static Value *bi_permutation(const CallArgs *a) {
  Value *key, *x, *axis = NULL, *indep = NULL;
  if (args_bind("permutation", a, "key, x, axis=, independent=",
                (Value **[]){&key, &x, &axis, &indep}) < 0)
    return NULL;
  AVal xa;
  if (ops_aval(x, &xa) < 0) return NULL;
  int64_t ax = 0, n;
  if (axis && arr_to_index(axis, &ax) < 0) return NULL;
  if (xa.ndim == 0) {
    if (arr_to_index(x, &n) < 0) return NULL;
  } else {
    if (ax < 0) ax += xa.ndim;
    if (ax < 0 || ax >= xa.ndim) return err_set(ERR_VALUE, "permutation: axis out of range");
    n = xa.shape[ax];
  }
  Params p;
  params_init(&p);
  params_add(&p, "n", val_int(n));
  Value *ind = ops_apply(P_RANDOM_PERMUTATION, 1, &key, &p);
  params_clear(&p);
  if (!ind || xa.ndim == 0) return ind;
  Value *av = val_int(ax);
  CallArgs c = {2, (Value *[]){x, ind}, 1, (const char *[]){"axis"}, &av};
  Value *ns = builtins_namespace("jnp");
  Value *take = ns ? dict_get_str(((Module *)ns)->globals, "take") : NULL;
  Value *r = take ? val_call(take, &c) : err_set(ERR_NAME, "jnp.take missing");
  val_decref(av);
  val_decref(ind);
  return r;
}

int builtins_random_register(Env *b) {
  (void)b;
  static const struct {
    const char *name;
    BuiltinFn fn;
    const char *doc;
  } fns[] = {
      {"key", bi_key, "key(seed): a PRNG key (two uint32 words, held as int64)"},
      {"PRNGKey", bi_key, "PRNGKey(seed): a PRNG key"},
      {"split", bi_split, "split(key, num=2): num new keys"},
      {"fold_in", bi_fold_in, "fold_in(key, data): a key for data"},
      {"bits", bi_bits, "bits(key, shape=()): random 32-bit values"},
      {"uniform", bi_uniform, "uniform(key, shape=(), dtype=float32, minval=0., maxval=1.)"},
      {"normal", bi_normal, "normal(key, shape=(), dtype=float32)"},
      {"bernoulli", bi_bernoulli, "bernoulli(key, p=0.5, shape=None)"},
      {"randint", bi_randint, "randint(key, shape, minval, maxval, dtype=int32)"},
      {"permutation", bi_permutation, "permutation(key, x, axis=0)"},
  };
  for (size_t i = 0; i < sizeof fns / sizeof *fns; i++) {
    Value *v = builtin_new(fns[i].name, fns[i].fn, fns[i].doc);
    int rc = v ? builtins_add_to("jax.random", fns[i].name, v) : -1;
    val_decref(v);
    if (rc < 0) return -1;
  }
  return 0;
}
