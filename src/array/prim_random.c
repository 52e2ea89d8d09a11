/*
 * prim_random.c - the PRNG primitives and erf_inv (prim_random.h).
 *
 * JAX's threefry2x32 (jax/_src/prng.py, with jax_threefry_partitionable,
 * the default): a key is two 32-bit words; the bits of an array of shape
 * S are, at flat position i, the xor of the two words threefry2x32 makes
 * of the 64-bit counter i split (high, low); split makes key j of the
 * words of counter j; fold_in hashes the counter pair (0, data).  uniform
 * keeps 23 (or 52) random mantissa bits under the exponent of 1.0 and
 * subtracts 1, as JAX does; erf_inv is XLA's (Giles's approximation in
 * float32, its float64 one in float64), so normal's values are JAX's.
 *
 * Keys are int64 arrays of shape (..., 2) holding the two uint32 words.
 */
#include <math.h>
#include <string.h>

#include "array/prim_random.h"
#include "array/prim_rules.h"

/* ---- threefry2x32 ---------------------------------------------------------- */

static inline uint32_t rotl(uint32_t v, int r) { return (v << r) | (v >> (32 - r)); }

void prim_threefry2x32(uint32_t k0, uint32_t k1, uint32_t *x0, uint32_t *x1) {
  static const int rot[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
  const uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
  uint32_t a = *x0 + ks[0], b = *x1 + ks[1];
  for (int r = 0; r < 5; r++) {
    for (int j = 0; j < 4; j++) {
      a += b;
      b = rotl(b, rot[r & 1][j]);
      b ^= a;
    }
    a += ks[(r + 1) % 3];
    b += ks[(r + 2) % 3] + (uint32_t)(r + 1);
  }
  *x0 = a;
  *x1 = b;
}

/* The two words of key [k] (an int64 pair). */
static int key_words(const Array *k, int64_t at, uint32_t *w0, uint32_t *w1) {
  if (k->ndim < 1 || k->shape[k->ndim - 1] != 2 || !dt_is_int(k->dtype))
    return err_set(ERR_TYPE, "a PRNG key is an integer array whose last axis has 2 words"), -1;
  *w0 = (uint32_t)arr_get_i64(k, 2 * at);
  *w1 = (uint32_t)arr_get_i64(k, 2 * at + 1);
  return 0;
}

/* ---- shape rules ------------------------------------------------------------- */

static int key_aval(const AVal *k, const char *prim) {
  if (k->ndim < 1 || k->shape[k->ndim - 1] != 2 || !dt_is_int(k->dtype)) {
    err_set(ERR_TYPE, "%s: a key is an integer array of shape (..., 2), got %s[%d dims]", prim,
            dt_name(k->dtype), k->ndim);
    return -1;
  }
  if (k->ndim != 1) {
    err_set(ERR_VALUE, "%s takes a single key (shape (2,)); vmap over arrays of keys", prim);
    return -1;
  }
  return 0;
}

static int shape_param(const Params *p, int *n, int64_t *shape) {
  return params_ints(p, "shape", n, shape, SHM_MAXDIM);
}

/* random_split[shape](key) -> keys of shape + (2,) */
static int shape_split(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)nin;
  int n;
  int64_t shape[SHM_MAXDIM];
  if (key_aval(&in[0], "random_split") < 0 || shape_param(p, &n, shape) < 0) return -1;
  if (n + 1 > SHM_MAXDIM) return err_set(ERR_VALUE, "random_split: too many dimensions"), -1;
  memset(out, 0, sizeof *out);
  out->dtype = in[0].dtype;
  out->ndim = n + 1;
  memcpy(out->shape, shape, sizeof(int64_t) * (size_t)n);
  out->shape[n] = 2;
  return 0;
}

/* random_fold_in(key, data) -> key */
static int shape_fold_in(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)nin, (void)p;
  if (key_aval(&in[0], "random_fold_in") < 0) return -1;
  if (in[1].ndim != 0 || !dt_is_int(in[1].dtype))
    return err_set(ERR_TYPE, "random_fold_in: data must be an integer scalar"), -1;
  aval_copy(out, &in[0]);
  out->weak = false;
  return 0;
}

/* random_bits[shape](key) -> int64 of shape, the 32-bit values;
 * random_uniform[shape dtype](key) -> floats in [0, 1) of shape */
static int shape_bits(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)nin;
  int n;
  int64_t shape[SHM_MAXDIM];
  if (key_aval(&in[0], "random_bits") < 0 || shape_param(p, &n, shape) < 0) return -1;
  memset(out, 0, sizeof *out);
  out->dtype = DT_I64;
  out->ndim = n;
  memcpy(out->shape, shape, sizeof(int64_t) * (size_t)n);
  return 0;
}

static int shape_uniform(const AVal *in, int nin, const Params *p, AVal *out) {
  DType t;
  if (shape_bits(in, nin, p, out) < 0 || params_dtype(p, "dtype", &t) < 0) return -1;
  if (!dt_is_float(t))
    return err_set(ERR_TYPE, "random_uniform: dtype must be a float dtype, got %s",
                   dt_name(t)), -1;
  out->dtype = t;
  return 0;
}

/* ---- kernels ------------------------------------------------------------------ */

static Array *fresh(Array **out, DType t, int ndim, const int64_t *shape) {
  if (!*out) *out = arr_new(t, ndim, shape);
  return *out;
}

static int kern_split(Array **in, int nin, const Params *p, Array **out) {
  (void)nin;
  uint32_t k0, k1;
  int n;
  int64_t shape[SHM_MAXDIM + 1];
  if (key_words(in[0], 0, &k0, &k1) < 0 || shape_param(p, &n, shape) < 0) return -1;
  shape[n] = 2;
  Array *o = fresh(out, in[0]->dtype, n + 1, shape);
  if (!o) return -1;
  int64_t cnt = o->size / 2;
  for (int64_t i = 0; i < cnt; i++) {
    uint32_t a = (uint32_t)((uint64_t)i >> 32), b = (uint32_t)i;
    prim_threefry2x32(k0, k1, &a, &b);
    int64_t w[2] = {a, b};
    kern_convert((char *)arr_data(o) + 2 * i * dt_size(o->dtype), o->dtype, w, DT_I64, 2);
  }
  return 0;
}

static int kern_fold_in(Array **in, int nin, const Params *p, Array **out) {
  (void)nin, (void)p;
  uint32_t k0, k1, a = 0, b = (uint32_t)arr_get_i64(in[1], 0);
  if (key_words(in[0], 0, &k0, &k1) < 0) return -1;
  prim_threefry2x32(k0, k1, &a, &b);
  Array *o = fresh(out, in[0]->dtype, 1, (int64_t[]){2});
  if (!o) return -1;
  int64_t w[2] = {a, b};
  kern_convert(arr_data(o), o->dtype, w, DT_I64, 2);
  return 0;
}

/* The 32 random bits at flat position [i], and the 64 for float64. */
static inline uint32_t bits32(uint32_t k0, uint32_t k1, int64_t i) {
  uint32_t a = (uint32_t)((uint64_t)i >> 32), b = (uint32_t)i;
  prim_threefry2x32(k0, k1, &a, &b);
  return a ^ b;
}

static inline uint64_t bits64(uint32_t k0, uint32_t k1, int64_t i) {
  uint32_t a = (uint32_t)((uint64_t)i >> 32), b = (uint32_t)i;
  prim_threefry2x32(k0, k1, &a, &b);
  return (uint64_t)a << 32 | b;
}

static int kern_bits(Array **in, int nin, const Params *p, Array **out) {
  (void)nin;
  uint32_t k0, k1;
  int n;
  int64_t shape[SHM_MAXDIM];
  if (key_words(in[0], 0, &k0, &k1) < 0 || shape_param(p, &n, shape) < 0) return -1;
  Array *o = fresh(out, DT_I64, n, shape);
  if (!o) return -1;
  int64_t *d = arr_data(o);
  KERN_FOR_POLLED(i, 0, o->size, KERN_CHUNK_SLOW) d[i] = bits32(k0, k1, i);
  return 0;
}

/* A sampling kernel's key words, result shape and dtype. */
static int sample_args(Array **in, const Params *p, uint32_t *k0, uint32_t *k1, int *n,
                       int64_t *shape, DType *t) {
  if (key_words(in[0], 0, k0, k1) < 0 || shape_param(p, n, shape) < 0 ||
      params_dtype(p, "dtype", t) < 0)
    return -1;
  return 0;
}

/* A 16-bit float in [0, 1) as JAX's _uniform draws it: the dtype's
 * mantissa bits from the top of random bits of the dtype's width (8 for
 * bfloat16, whose 7 mantissa bits are fewer than 8: the low byte of the
 * 32-bit value; 16 for float16: its low half, as convert_element_type
 * truncates), under the exponent of 1.0, minus 1 (exact). */
static uint16_t uniform16(uint32_t bits, DType t) {
  if (t == DT_BF16)
    return dt_f32_to_bf16(dt_bf16_to_f32((uint16_t)(((bits & 0xFFu) >> 1) | 0x3F80u)) - 1.0f);
  return dt_f32_to_f16(dt_f16_to_f32((uint16_t)(((bits & 0xFFFFu) >> 6) | 0x3C00u)) - 1.0f);
}

static int kern_uniform(Array **in, int nin, const Params *p, Array **out) {
  (void)nin;
  uint32_t k0, k1;
  int n;
  int64_t shape[SHM_MAXDIM];
  DType t;
  if (sample_args(in, p, &k0, &k1, &n, shape, &t) < 0) return -1;
  Array *o = fresh(out, t, n, shape);
  if (!o) return -1;
  if (t == DT_BF16 || t == DT_F16) {
    uint16_t *d = arr_data(o);
    KERN_FOR_POLLED(i, 0, o->size, KERN_CHUNK_SLOW) d[i] = uniform16(bits32(k0, k1, i), t);
  } else if (t == DT_F32) {
    float *d = arr_data(o);
    KERN_FOR_POLLED(i, 0, o->size, KERN_CHUNK_SLOW) {
      uint32_t u = (bits32(k0, k1, i) >> 9) | 0x3F800000u;
      float f;
      memcpy(&f, &u, 4);
      d[i] = f - 1.0f;
    }
  } else {
    double *d = arr_data(o);
    KERN_FOR_POLLED(i, 0, o->size, KERN_CHUNK_SLOW) {
      uint64_t u = (bits64(k0, k1, i) >> 12) | 0x3FF0000000000000ull;
      double f;
      memcpy(&f, &u, 8);
      d[i] = f - 1.0;
    }
  }
  return 0;
}

/* ---- randint, permutation ------------------------------------------------------------ */

/* The two keys split(key) makes. */
static void split2(uint32_t k0, uint32_t k1, uint32_t out[2][2]) {
  for (int j = 0; j < 2; j++) {
    uint32_t a = 0, b = (uint32_t)j;
    prim_threefry2x32(k0, k1, &a, &b);
    out[j][0] = a, out[j][1] = b;
  }
}

static int shape_randint(const AVal *in, int nin, const Params *p, AVal *out) {
  DType t;
  if (shape_bits(in, nin, p, out) < 0 || params_dtype(p, "dtype", &t) < 0) return -1;
  if (!dt_is_int(t)) return err_set(ERR_TYPE, "randint only accepts integer dtypes, got %s", dt_name(t)), -1;
  if (in[1].ndim || in[2].ndim)
    return err_set(ERR_NOT_IMPLEMENTED, "randint: minval and maxval must be scalars"), -1;
  out->dtype = t;
  return 0;
}

/* JAX's randint: two draws of 32 bits, combined modulo the span in 32-bit
 * unsigned arithmetic (wrapping as lax's does), added to minval. */
static int kern_randint(Array **in, int nin, const Params *p, Array **out) {
  (void)nin;
  uint32_t k0, k1, ks[2][2];
  int n;
  int64_t shape[SHM_MAXDIM];
  DType t;
  if (sample_args(in, p, &k0, &k1, &n, shape, &t) < 0) return -1;
  int64_t lo = arr_get_i64(in[1], 0), hi = arr_get_i64(in[2], 0);
  int64_t tmin = t == DT_I8 ? INT8_MIN : t == DT_I32 ? INT32_MIN : INT64_MIN;
  int64_t tmax = t == DT_I8 ? INT8_MAX : t == DT_I32 ? INT32_MAX : INT64_MAX;
  bool hi_out = hi > tmax;
  lo = lo < tmin ? tmin : lo > tmax ? tmax : lo;
  hi = hi < tmin ? tmin : hi > tmax ? tmax : hi;
  uint32_t span = (uint32_t)(hi - lo);
  if (hi <= lo) span = 1;
  if (hi_out && hi > lo) span += 1;
  split2(k0, k1, ks);
  uint32_t mult = span ? (uint32_t)(65536u % span) : 0;
  mult = span ? (uint32_t)((mult * mult) % span) : 0;
  Array *o = fresh(out, t, n, shape);
  if (!o) return -1;
  int64_t *v = shm_malloc(sizeof(int64_t) * (size_t)(o->size ? o->size : 1));
  if (!v) return err_nomem(), -1;
  KERN_FOR_POLLED(i, 0, o->size, KERN_CHUNK_SLOW) {
    uint32_t h = bits32(ks[0][0], ks[0][1], i), l = bits32(ks[1][0], ks[1][1], i);
    uint32_t off = span ? (uint32_t)((h % span) * mult + (l % span)) % span : h * mult + l;
    v[i] = lo + (int64_t)off;
  }
  kern_convert(arr_data(o), t, v, DT_I64, o->size);
  shm_free(v);
  return 0;
}

static int shape_permutation(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)nin;
  int64_t n;
  if (key_aval(&in[0], "random_permutation") < 0 || params_int(p, "n", &n) < 0) return -1;
  memset(out, 0, sizeof *out);
  out->dtype = DT_I32;
  out->ndim = 1;
  out->shape[0] = n;
  return 0;
}

typedef struct SortItem {
  uint32_t key;
  int32_t val;
} SortItem;

static int by_key(const void *x, const void *y) {
  const SortItem *a = x, *b = y;
  return a->key < b->key ? -1 : a->key > b->key ? 1 : 0;
}

/* A stable sort: merge sort over (key, position) pairs. */
static void stable_sort(SortItem *v, SortItem *tmp, int64_t n) {
  if (n < 2) return;
  int64_t h = n / 2;
  stable_sort(v, tmp, h);
  stable_sort(v + h, tmp, n - h);
  int64_t i = 0, j = h, k = 0;
  while (i < h && j < n) tmp[k++] = by_key(&v[j], &v[i]) < 0 ? v[j++] : v[i++];
  while (i < h) tmp[k++] = v[i++];
  while (j < n) tmp[k++] = v[j++];
  memcpy(v, tmp, sizeof *v * (size_t)n);
}

/* JAX's _shuffle of arange(n): rounds of a stable sort by fresh 32-bit
 * keys, each round's from the second key of a split. */
static int kern_permutation(Array **in, int nin, const Params *p, Array **out) {
  (void)nin;
  uint32_t k0, k1, ks[2][2];
  int64_t n;
  if (key_words(in[0], 0, &k0, &k1) < 0 || params_int(p, "n", &n) < 0) return -1;
  Array *o = fresh(out, DT_I32, 1, &n);
  SortItem *v = shm_malloc(sizeof *v * (size_t)(n ? n : 1)), *tmp = shm_malloc(sizeof *v * (size_t)(n ? n : 1));
  if (!o || !v || !tmp) {
    shm_free(v);
    shm_free(tmp);
    return o ? (err_nomem(), -1) : -1;
  }
  for (int64_t i = 0; i < n; i++) v[i].val = (int32_t)i;
  int rounds = (int)ceil(3.0 * log((double)(n > 1 ? n : 1)) / log(4294967295.0));
  for (int r = 0; r < rounds; r++) {
    split2(k0, k1, ks);
    k0 = ks[0][0], k1 = ks[0][1];
    for (int64_t i = 0; i < n; i++) v[i].key = bits32(ks[1][0], ks[1][1], i);
    stable_sort(v, tmp, n);
  }
  int32_t *d = arr_data(o);
  for (int64_t i = 0; i < n; i++) d[i] = v[i].val;
  shm_free(v);
  shm_free(tmp);
  return 0;
}

/* ---- erf_inv ----------------------------------------------------------------------- */

static float erfinv_f32(float x) {
  static const float lt5[9] = {2.81022636e-08f,  3.43273939e-07f, -3.5233877e-06f,
                               -4.39150654e-06f, 0.00021858087f,  -0.00125372503f,
                               -0.00417768164f,  0.246640727f,    1.50140941f};
  static const float ge5[9] = {-0.000200214257f, 0.000100950558f, 0.00134934322f,
                               -0.00367342844f,  0.00573950773f,  -0.0076224613f,
                               0.00943887047f,   1.00167406f,     2.83297682f};
  if (fabsf(x) == 1.0f) return x * INFINITY;
  float w = -log1pf(-x * x);
  bool lt = w < 5.0f;
  const float *c = lt ? lt5 : ge5;
  w = lt ? w - 2.5f : sqrtf(w) - 3.0f;
  float p = c[0];
  for (int i = 1; i < 9; i++) p = c[i] + p * w;
  return p * x;
}

static double erfinv_f64(double x) {
  static const double a[23] = {
      -3.6444120640178196996e-21, -1.685059138182016589e-19,  1.2858480715256400167e-18,
      1.115787767802518096e-17,   -1.333171662854620906e-16,  2.0972767875968561637e-17,
      6.6376381343583238325e-15,  -4.0545662729752068639e-14, -8.1519341976054721522e-14,
      2.6335093153082322977e-12,  -1.2975133253453532498e-11, -5.4154120542946279317e-11,
      1.051212273321532285e-09,   -4.1126339803469836976e-09, -2.9070369957882005086e-08,
      4.2347877827932403518e-07,  -1.3654692000834678645e-06, -1.3882523362786468719e-05,
      0.0001867342080340571352,   -0.00074070253416626697512, -0.0060336708714301490533,
      0.24015818242558961693,     1.6536545626831027356};
  static const double b[19] = {
      2.2137376921775787049e-09,  9.0756561938885390979e-08, -2.7517406297064545428e-07,
      1.8239629214389227755e-08,  1.5027403968909827627e-06, -4.013867526981545969e-06,
      2.9234449089955446044e-06,  1.2475304481671778723e-05, -4.7318229009055733981e-05,
      6.8284851459573175448e-05,  2.4031110387097893999e-05, -0.0003550375203628474796,
      0.00095328937973738049703,  -0.0016882755560235047313, 0.0024914420961078508066,
      -0.0037512085075692412107,  0.005370914553590063617,   1.0052589676941592334,
      3.0838856104922207635};
  static const double c[17] = {
      -2.7109920616438573243e-11, -2.5556418169965252055e-10, 1.5076572693500548083e-09,
      -3.7894654401267369937e-09, 7.6157012080783393804e-09,  -1.4960026627149240478e-08,
      2.9147953450901080826e-08,  -6.7711997758452339498e-08, 2.2900482228026654717e-07,
      -9.9298272942317002539e-07, 4.5260625972231537039e-06,  -1.9681778105531670567e-05,
      7.5995277030017761139e-05,  -0.00021503011930044477347, -0.00013871931833623122026,
      1.0103004648645343977,      4.8499064014085844221};
  if (fabs(x) == 1.0) return x * INFINITY;
  double w = -log1p(-x * x), p;
  if (w < 6.25) {
    w -= 3.125;
    p = a[0];
    for (int i = 1; i < 23; i++) p = a[i] + p * w;
  } else if (w < 16) {
    w = sqrt(w) - 3.25;
    p = b[0];
    for (int i = 1; i < 19; i++) p = b[i] + p * w;
  } else {
    w = sqrt(w) - 5.0;
    p = c[0];
    for (int i = 1; i < 17; i++) p = c[i] + p * w;
  }
  return p * x;
}

static int shape_erf_inv(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)nin, (void)p;
  if (!dt_is_float(in[0].dtype))
    return err_set(ERR_TYPE, "erf_inv requires a float operand, got %s", dt_name(in[0].dtype)), -1;
  aval_copy(out, &in[0]);
  return 0;
}

static int kern_erf_inv(Array **in, int nin, const Params *p, Array **out) {
  (void)nin, (void)p;
  Array *x = arr_contiguous(in[0]);
  if (!x) return -1;
  Array *o = fresh(out, x->dtype, x->ndim, x->shape);
  if (!o) {
    val_decref(&x->hdr);
    return -1;
  }
  if (x->dtype == DT_F64) {
    const double *s = arr_data(x);
    double *d = arr_data(o);
    KERN_FOR_POLLED(i, 0, x->size, KERN_CHUNK_SLOW) d[i] = erfinv_f64(s[i]);
  } else {
    Array *f = x->dtype == DT_F32 ? (Array *)val_incref(&x->hdr) : arr_astype(x, DT_F32, false);
    Array *r = f && x->dtype != DT_F32 ? arr_new(DT_F32, x->ndim, x->shape) : NULL;
    float *d = x->dtype == DT_F32 ? arr_data(o) : r ? arr_data(r) : NULL;
    if (f && d) {
      const float *s = arr_data(f);
      KERN_FOR_POLLED(i, 0, x->size, KERN_CHUNK_SLOW) d[i] = erfinv_f32(s[i]);
      if (r) kern_convert(arr_data(o), o->dtype, d, DT_F32, x->size);
    }
    if (f) val_decref(&f->hdr);
    if (r) val_decref(&r->hdr);
  }
  val_decref(&x->hdr);
  return 0;
}

/* d erf_inv(x) = sqrt(pi)/2 * exp(erf_inv(x)^2) */
static int jvp_erf_inv(Value **x, Value **t, int nin, const Params *p, Value **yo, Value **to) {
  (void)nin;
  *to = NULL;
  if (!(*yo = prim_apply_rule(P_ERF_INV, 1, x, NULL))) return -1;
  if (!t[0]) return 0;
  (void)p;
  AVal a;
  prim_value_aval(*yo, &a);
  Value *sq = prim_apply_rule(P_MUL, 2, (Value *[]){*yo, *yo}, NULL);
  Value *e = sq ? prim_apply_rule(P_EXP, 1, &sq, NULL) : NULL;
  Array *c = arr_scalar_f64(a.dtype, 0.88622692545275801365, false);   /* sqrt(pi)/2 */
  Value *cv = c ? &c->hdr : NULL;
  Value *f = e && cv ? prim_apply_rule(P_MUL, 2, (Value *[]){e, cv}, NULL) : NULL;
  *to = f ? prim_apply_rule(P_MUL, 2, (Value *[]){t[0], f}, NULL) : NULL;
  Value *tmp[] = {sq, e, cv, f};
  for (int i = 0; i < 4; i++)
    if (tmp[i]) val_decref(tmp[i]);
  if (*to) return 0;
  val_decref(*yo);
  *yo = NULL;
  return -1;
}

ELEMENTWISE(b_erf_inv, ERF_INV)

/* ==== the rows ============================================================= */

/* Each primitive's rules, side by side (prim.h, PrimRules): the key
 * primitives have no derivative (JAX's keys are integers) and are batched
 * example by example. */
static const PrimRow rows[] = {
    {P_RANDOM_SPLIT, {.shape = shape_split, .kernel = kern_split}},
    {P_RANDOM_FOLD_IN, {.shape = shape_fold_in, .kernel = kern_fold_in}},
    {P_RANDOM_BITS, {.shape = shape_bits, .kernel = kern_bits}},
    {P_RANDOM_UNIFORM, {.shape = shape_uniform, .kernel = kern_uniform}},
    {P_RANDOM_RANDINT, {.shape = shape_randint, .kernel = kern_randint}},
    {P_RANDOM_PERMUTATION, {.shape = shape_permutation, .kernel = kern_permutation}},
    {P_ERF_INV, {.shape = shape_erf_inv, .kernel = kern_erf_inv, .batch = b_erf_inv, .jvp = jvp_erf_inv, .sharding = prim_sharding_elementwise, .cost = prim_cost_transcendental}},
};

void prim_random_register(void) { prim_register_rows(rows, sizeof rows / sizeof rows[0]); }
