/*
 * hostnp_random.c - numpy.random on the host: NumPy's bit generators and
 * distributions, so that a seed gives NumPy's numbers bit for bit.
 *
 *   - the legacy API (np.random.seed, rand, randn, ..., RandomState):
 *     MT19937, seeded as RandomState._legacy_seeding does (an int by
 *     Matsumoto and Nishimura's init_genrand, a sequence of ints by their
 *     init_by_array), Gaussians by the polar method with its spare value
 *     (NumPy's legacy_gauss), bounded integers by masked rejection;
 *   - np.random.default_rng: a Generator over PCG64 (O'Neill's 128-bit
 *     LCG with the XSL-RR output), seeded through SeedSequence's hash
 *     (numpy/random/bit_generator.pyx), bounded integers by Lemire's
 *     multiply-and-reject, Gaussians by NumPy's 256-level ziggurat
 *     (random_standard_normal in numpy/random/src/distributions), its
 *     tables computed here as NumPy's generator script computes them.
 *
 * The algorithms are the published ones (the references above and NumPy's
 * documentation of numpy.random); every number is checked against NumPy
 * by tests/cli/numpy_random.sh.  Each generator holds a lock, as NumPy's
 * do, so device threads drawing from one stay consistent.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/builtins_impl.h"
#include "lang/eval.h"
#include "lang/hostnp.h"
#include "lang/ops.h"

/* ==== MT19937 ================================================================ */

enum { MT_N = 624, MT_M = 397 };

typedef struct Mt19937 {
  uint32_t key[MT_N];
  int pos;
} Mt19937;

static void mt_seed(Mt19937 *s, uint32_t seed) {
  for (int i = 0; i < MT_N; i++) {
    s->key[i] = seed;
    seed = 1812433253u * (seed ^ (seed >> 30)) + (uint32_t)i + 1;
  }
  s->pos = MT_N;
}

/* init_by_array: a seed of several words. */
static void mt_seed_array(Mt19937 *s, const uint32_t *key, int n) {
  mt_seed(s, 19650218u);
  uint32_t *mt = s->key;
  int i = 1, j = 0;
  for (int k = MT_N > n ? MT_N : n; k; k--) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525u)) + key[j] + (uint32_t)j;
    i++;
    j++;
    if (i >= MT_N) {
      mt[0] = mt[MT_N - 1];
      i = 1;
    }
    if (j >= n) j = 0;
  }
  for (int k = MT_N - 1; k; k--) {
    mt[i] = (mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941u)) - (uint32_t)i;
    i++;
    if (i >= MT_N) {
      mt[0] = mt[MT_N - 1];
      i = 1;
    }
  }
  mt[0] = 0x80000000u;
  s->pos = MT_N;
}

static uint32_t mt_twist(uint32_t a, uint32_t b, uint32_t m) {
  uint32_t y = (a & 0x80000000u) | (b & 0x7fffffffu);
  return m ^ (y >> 1) ^ (-(y & 1u) & 0x9908b0dfu);
}

static uint32_t mt_next32(Mt19937 *s) {
  if (s->pos == MT_N) {
    for (int i = 0; i < MT_N; i++)
      s->key[i] = mt_twist(s->key[i], s->key[(i + 1) % MT_N], s->key[(i + MT_M) % MT_N]);
    s->pos = 0;
  }
  uint32_t y = s->key[s->pos++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  return y ^ (y >> 18);
}

/* ==== PCG64 and SeedSequence ==================================================== */

typedef unsigned __int128 u128;

typedef struct Pcg64 {
  u128 state, inc;
  bool has_u32;   /* the upper half of the last 64-bit draw, kept for next32 */
  uint32_t u32;
} Pcg64;

static u128 pcg_mult(void) {
  return (u128)2549297995355413924ull << 64 | 4865540595714422341ull;
}

static uint64_t pcg_next64(Pcg64 *s) {
  s->state = s->state * pcg_mult() + s->inc;
  uint64_t x = (uint64_t)(s->state >> 64) ^ (uint64_t)s->state;
  unsigned rot = (unsigned)(s->state >> 122);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

static uint32_t pcg_next32(Pcg64 *s) {
  if (s->has_u32) {
    s->has_u32 = false;
    return s->u32;
  }
  uint64_t x = pcg_next64(s);
  s->has_u32 = true;
  s->u32 = (uint32_t)(x >> 32);
  return (uint32_t)x;
}

/* SeedSequence(entropy).generate_state(4, uint64) for a PCG64: the pool of
 * four words mixed from [entropy], then hashed out.  The constants are
 * SeedSequence's. */
enum { POOL = 4 };

static uint32_t ss_hashmix(uint32_t v, uint32_t *h) {
  v ^= *h;
  *h *= 0x931e8875u;
  v *= *h;
  return v ^ (v >> 16);
}

static uint32_t ss_mix(uint32_t x, uint32_t y) {
  uint32_t r = 0xca01f9ddu * x - 0x4973f715u * y;
  return r ^ (r >> 16);
}

static void ss_pool(const uint32_t *ent, int n, uint32_t pool[POOL]) {
  uint32_t h = 0x43b0d7e5u;
  for (int i = 0; i < POOL; i++) pool[i] = ss_hashmix(i < n ? ent[i] : 0, &h);
  for (int s = 0; s < POOL; s++)
    for (int d = 0; d < POOL; d++)
      if (s != d) pool[d] = ss_mix(pool[d], ss_hashmix(pool[s], &h));
  for (int s = POOL; s < n; s++)
    for (int d = 0; d < POOL; d++) pool[d] = ss_mix(pool[d], ss_hashmix(ent[s], &h));
}

static void pcg_seed(Pcg64 *s, const uint32_t *ent, int n) {
  uint32_t pool[POOL], w[8];
  ss_pool(ent, n, pool);
  uint32_t h = 0x8b51f9ddu;
  for (int i = 0; i < 8; i++) {
    uint32_t v = pool[i % POOL] ^ h;
    h *= 0x58f38dedu;
    v *= h;
    w[i] = v ^ (v >> 16);
  }
  uint64_t st[4];
  for (int i = 0; i < 4; i++) st[i] = (uint64_t)w[2 * i + 1] << 32 | w[2 * i];
  u128 seed = (u128)st[0] << 64 | st[1], seq = (u128)st[2] << 64 | st[3];
  s->state = 0;
  s->inc = seq << 1 | 1;
  s->state = s->state * pcg_mult() + s->inc;
  s->state += seed;
  s->state = s->state * pcg_mult() + s->inc;
  s->has_u32 = false;
}

/* ==== the generator objects ====================================================== */

typedef struct NpRng {
  Opaque base;
  bool pcg;            /* a Generator over PCG64; else a RandomState (MT19937) */
  Mt19937 mt;
  Pcg64 pg;
  bool has_gauss;      /* legacy_gauss's second value, kept for the next call */
  double gauss;
  uint32_t writer;     /* val_writer of the run that made it (value.h) */
  pthread_mutex_t lock;
} NpRng;

/* Takes [r]'s lock for a draw or a seed: 0, or -1 with the error set when
 * [r] was made outside the shard_map body this device runs.  Every device
 * runs the body at once, so they would take turns on one state in no set
 * order (where JAX traces the body once and draws once). */
static int rng_acquire(NpRng *r) {
  if (val_check_writer(r->writer, "a numpy.random generator made outside this shard_map body") < 0)
    return -1;
  pthread_mutex_lock(&r->lock);
  return 0;
}

static uint32_t next32(NpRng *r) { return r->pcg ? pcg_next32(&r->pg) : mt_next32(&r->mt); }

static uint64_t next64(NpRng *r) {
  if (r->pcg) return pcg_next64(&r->pg);
  uint64_t hi = mt_next32(&r->mt);
  return hi << 32 | mt_next32(&r->mt);
}

/* A double in [0, 1): 53 random bits, as each of NumPy's generators
 * makes it (MT19937 from two words, PCG64 from one draw). */
static double next_double(NpRng *r) {
  if (r->pcg) return (double)(pcg_next64(&r->pg) >> 11) * (1.0 / 9007199254740992.0);
  int32_t a = (int32_t)(mt_next32(&r->mt) >> 5), b = (int32_t)(mt_next32(&r->mt) >> 6);
  return (a * 67108864.0 + b) / 9007199254740992.0;
}

/* The polar method with its spare (legacy_gauss). */
static double legacy_gauss(NpRng *r) {
  if (r->has_gauss) {
    r->has_gauss = false;
    return r->gauss;
  }
  double x1, x2, r2;
  do {
    x1 = 2.0 * next_double(r) - 1.0;
    x2 = 2.0 * next_double(r) - 1.0;
    r2 = x1 * x1 + x2 * x2;
  } while (r2 >= 1.0 || r2 == 0.0);
  double f = sqrt(-2.0 * log(r2) / r2);
  r->gauss = f * x1;
  r->has_gauss = true;
  return f * x2;
}

/* ---- the ziggurat of Generator.standard_normal ------------------------------------- */

/* Marsaglia and Tsang's ziggurat over 256 levels of equal area: the
 * base's right edge R and the area V of each level.  NumPy's tables
 * (ziggurat_constants.h) were made by a script that runs the recursion
 * x[i] = sqrt(-2 log(f(x[i-1]) + V / x[i-1])), f(x) = exp(-x*x/2), from
 * x = R in doubles and scales it by 2**52; the same steps here give the
 * same bits, except at one step: the exp NumPy's tables were computed
 * with rounded f at step ZIG_UP_STEP up where the correctly rounded
 * value (0.498 ulp below it) rounds down.  That step is reproduced; every
 * entry of the three tables is then NumPy's (checked against
 * python3-numpy's draws by tests/cli/numpy_random.sh). */
#define ZIG_R 3.6541528853610087963519472518
#define ZIG_INV_R 0.27366123732975827203338247596
#define ZIG_V 0.0049286732339746519
enum { ZIG_N = 256, ZIG_UP_STEP = 218 };

static uint64_t zig_k[ZIG_N];        /* ki_double: acceptance bounds of the 52-bit draw */
static double zig_w[ZIG_N], zig_f[ZIG_N];   /* wi_double (x / 2**52) and fi_double (f(x)) */
static pthread_once_t zig_once = PTHREAD_ONCE_INIT;

static double zig_pdf(double x) { return exp(-0.5 * x * x); }

/* Fills the tables, level 255 (the base, x = R) down to level 0 (the
 * tip, x = 0). */
static void zig_tables(void) {
  double x[ZIG_N];   /* the levels' right edges, in the recursion's order */
  x[0] = ZIG_R;
  for (int i = 1; i < ZIG_N - 1; i++) {
    double f = zig_pdf(x[i - 1]);
    if (i == ZIG_UP_STEP) f = nextafter(f, 2.0);
    x[i] = sqrt(-2 * log(f + ZIG_V / x[i - 1]));
  }
  x[ZIG_N - 1] = 0;
  for (int j = 0; j < ZIG_N; j++) {
    double xj = x[ZIG_N - 1 - j];
    zig_w[j] = xj / 4503599627370496.0;
    zig_f[j] = j == ZIG_N - 1 - (ZIG_UP_STEP - 1) ? nextafter(zig_pdf(xj), 2.0) : zig_pdf(xj);
    if (j > 0) zig_k[j] = (uint64_t)nearbyint(x[ZIG_N - j] / xj * 4503599627370496.0);
  }
  zig_k[0] = (uint64_t)nearbyint(ZIG_R * zig_pdf(ZIG_R) / ZIG_V * 4503599627370496.0);
  zig_w[0] = ZIG_V / zig_pdf(ZIG_R) / 4503599627370496.0;
}

/* One standard normal: a 64-bit draw gives the level (8 bits), the sign
 * (1 bit) and a 52-bit position; inside the level's rectangle it is
 * accepted at once, in the base's tail by Marsaglia's exponential
 * method (on 1 - U, so the log never sees 0), in a wedge by comparing
 * with f. */
static double zig_gauss(NpRng *r) {
  for (;;) {
    uint64_t b = pcg_next64(&r->pg);
    int idx = (int)(b & 0xff);
    b >>= 8;
    bool neg = b & 1;
    uint64_t pos = (b >> 1) & 0xfffffffffffffull;
    double x = (double)pos * zig_w[idx];
    if (neg) x = -x;
    if (pos < zig_k[idx]) return x;
    if (idx == 0) {
      for (;;) {
        double xx = -ZIG_INV_R * log1p(-next_double(r)), yy = -log1p(-next_double(r));
        if (yy + yy > xx * xx) return (pos >> 8) & 1 ? -(ZIG_R + xx) : ZIG_R + xx;
      }
    }
    if ((zig_f[idx - 1] - zig_f[idx]) * next_double(r) + zig_f[idx] < exp(-0.5 * x * x)) return x;
  }
}

/* The smallest 2**k - 1 at least [max]. */
static uint64_t mask_of(uint64_t max) {
  uint64_t m = max;
  for (int s = 1; s < 64; s *= 2) m |= m >> s;
  return m;
}

/* An integer in [0, rng] by masked rejection (RandomState: random_interval
 * and the masked bounded integers). */
static uint64_t bounded_masked(NpRng *r, uint64_t rng) {
  if (rng == 0) return 0;
  uint64_t mask = mask_of(rng), v;
  if (rng <= 0xffffffffu) {
    while ((v = next32(r) & mask) > rng) {}
  } else {
    while ((v = next64(r) & mask) > rng) {}
  }
  return v;
}

/* An integer in [0, rng] by Lemire's method (Generator). */
static uint64_t bounded_lemire(NpRng *r, uint64_t rng) {
  if (rng == 0) return 0;
  if (rng == 0xffffffffu) return next32(r);
  if (rng < 0xffffffffu) {
    uint32_t excl = (uint32_t)rng + 1;
    uint64_t m = (uint64_t)next32(r) * excl;
    if ((uint32_t)m < excl) {
      uint32_t threshold = (uint32_t)(UINT32_MAX - rng) % excl;
      while ((uint32_t)m < threshold) m = (uint64_t)next32(r) * excl;
    }
    return m >> 32;
  }
  if (rng == UINT64_MAX) return next64(r);
  uint64_t excl = rng + 1;
  u128 m = (u128)next64(r) * excl;
  if ((uint64_t)m < excl) {
    uint64_t threshold = (UINT64_MAX - rng) % excl;
    while ((uint64_t)m < threshold) m = (u128)next64(r) * excl;
  }
  return (uint64_t)(m >> 64);
}

static uint64_t bounded(NpRng *r, uint64_t rng) {
  return r->pcg ? bounded_lemire(r, rng) : bounded_masked(r, rng);
}

static Value *rng_repr(Value *self) {
  return str_printf(((NpRng *)self)->pcg ? "Generator(PCG64)" : "RandomState(MT19937)");
}

static void rng_free(Value *self) { pthread_mutex_destroy(&((NpRng *)self)->lock); }

static Value *rng_getattr(Value *self, const char *name);

static const OpaqueType rng_type = {.name = "numpy.random.Generator", .free = rng_free,
                                    .repr = rng_repr, .getattr = rng_getattr};

/* ---- seeds ---------------------------------------------------------------------- */

/* The 32-bit words of a seed: an int's words, least significant first
 * (0 is one word 0), or those of each int of a sequence; OS entropy for
 * None.  At most [cap] words. */
static int seed_words(Value *seed, uint32_t *w, int cap, int *n, bool legacy) {
  *n = 0;
  if (bi_is_none(seed)) {
    if (getrandom(w, 4 * sizeof *w, 0) != (ssize_t)(4 * sizeof *w)) {
      err_set(ERR_IO, "numpy.random: no entropy from the operating system");
      return -1;
    }
    *n = 4;
    return 0;
  }
  Value *items = seed->type == V_ARRAY && AS_ARRAY(seed)->ndim == 0 ? NULL : ops_iter_items(seed);
  if (!items) err_clear();
  size_t count = items ? list_len(items) : 1;
  for (size_t i = 0; i < count; i++) {
    Value *v = items ? list_get(items, i) : seed;
    int64_t x;
    if (arr_to_index(v, &x) < 0) {
      val_decref(items);
      return -1;
    }
    bool big = legacy ? x > 0xffffffffll : false;
    if (x < 0 || big) {
      val_decref(items);
      err_set(ERR_VALUE, legacy ? "Seed must be between 0 and 2**32 - 1"
                                : "expected non-negative integer");
      return -1;
    }
    do {
      if (*n == cap) {
        val_decref(items);
        err_set(ERR_VALUE, "numpy.random: a seed of more than %d words", cap);
        return -1;
      }
      w[(*n)++] = (uint32_t)x;
      x = (int64_t)((uint64_t)x >> 32);
    } while (x && !legacy);
  }
  val_decref(items);
  if (*n == 0) {
    err_set(ERR_VALUE, "Seed must be non-empty");
    return -1;
  }
  return 0;
}

/* Seeds [r] from [seed] (borrowed): a RandomState as np.random.seed
 * does, a Generator as SeedSequence(seed) does. */
static int rng_seed(NpRng *r, Value *seed) {
  uint32_t w[MT_N];
  int n;
  if (seed_words(seed, w, MT_N, &n, !r->pcg) < 0) return -1;
  if (r->pcg) {
    pcg_seed(&r->pg, w, n);
  } else {
    bool one_int = seed && seed->type == V_ARRAY && AS_ARRAY(seed)->ndim == 0;
    if (one_int) mt_seed(&r->mt, w[0]);
    else mt_seed_array(&r->mt, w, n);
    r->has_gauss = false;
  }
  return 0;
}

static Value *rng_new(bool pcg, Value *seed) {
  NpRng *r = shm_calloc(1, sizeof *r);
  if (!r) return err_nomem();
  val_init(&r->base.hdr, V_OPAQUE);
  r->base.ot = &rng_type;
  r->pcg = pcg;
  if (pcg) pthread_once(&zig_once, zig_tables);
  r->writer = val_writer;
  pthread_mutex_init(&r->lock, NULL);
  if (rng_seed(r, seed) < 0) {
    val_decref(&r->base.hdr);
    return NULL;
  }
  return &r->base.hdr;
}

/* ---- filling results ------------------------------------------------------------ */

/* The shape of a `size=` argument: None is a scalar (*scalar set). */
static int size_arg(Value *size, int *nd, int64_t *shape, bool *scalar) {
  *scalar = bi_is_none(size);
  *nd = 0;
  return *scalar ? 0 : ops_shape_arg(size, nd, shape);
}

typedef double (*DrawF)(NpRng *r, double a, double b);

/* [size] doubles drawn by [f] under [r]'s lock: a Python float for
 * size None, else a float64 array. */
static Value *fill_f64(NpRng *r, Value *size, DrawF f, double a, double b) {
  int nd;
  int64_t shape[SHM_MAXDIM];
  bool scalar;
  if (size_arg(size, &nd, shape, &scalar) < 0) return NULL;
  Array *out = scalar ? NULL : arr_new(DT_F64, nd, shape);
  if (!scalar && !out) return NULL;
  if (rng_acquire(r) < 0) {
    val_decref(out ? &out->hdr : NULL);
    return NULL;
  }
  double one = 0, *d = out ? arr_data(out) : &one;
  for (int64_t i = 0, n = out ? out->size : 1; i < n; i++) d[i] = f(r, a, b);
  pthread_mutex_unlock(&r->lock);
  return out ? &out->hdr : arr_python_float(one);
}

static double draw_uniform(NpRng *r, double low, double range) { return low + range * next_double(r); }
static double draw_normal(NpRng *r, double loc, double scale) {
  return loc + scale * (r->pcg ? zig_gauss(r) : legacy_gauss(r));
}

/* A Python number argument [v] of [fname] as a double, [dflt] when absent;
 * arrays of several elements are refused (NumPy would broadcast them). */
static int scalar_param(const char *fname, const char *pname, Value *v, double dflt, double *out) {
  if (v && v->type == V_ARRAY && AS_ARRAY(v)->size != 1) {
    err_set(ERR_NOT_IMPLEMENTED, "%s(): an array %s is not supported (only a number)", fname, pname);
    return -1;
  }
  return bi_float_arg(fname, pname, v, dflt, out);
}

/* ---- the methods ---------------------------------------------------------------- */

static NpRng *self_rng(Value *self) { return (NpRng *)self; }

/* random(size=None) / random_sample(size=None) */
static Value *m_random(Value *self, const CallArgs *a) {
  Value *size = NULL, *dtype = NULL;
  if (args_bind("random", a, "size=, dtype=", (Value **[]){&size, &dtype}) < 0) return NULL;
  int t = DT_F64;
  if (!bi_is_none(dtype) && (hostnp_dtype_arg(dtype, &t) < 0 || t != DT_F64))
    return err_set(ERR_NOT_IMPLEMENTED, "random(): only dtype float64 is supported");
  return fill_f64(self_rng(self), size, draw_uniform, 0.0, 1.0);
}

/* uniform(low=0.0, high=1.0, size=None) */
static Value *m_uniform(Value *self, const CallArgs *a) {
  Value *lo = NULL, *hi = NULL, *size = NULL;
  if (args_bind("uniform", a, "low=, high=, size=", (Value **[]){&lo, &hi, &size}) < 0) return NULL;
  double l, h;
  if (scalar_param("uniform", "low", lo, 0.0, &l) < 0 || scalar_param("uniform", "high", hi, 1.0, &h) < 0)
    return NULL;
  return fill_f64(self_rng(self), size, draw_uniform, l, h - l);
}

/* normal(loc=0.0, scale=1.0, size=None): loc + scale * a standard normal */
static Value *m_normal(Value *self, const CallArgs *a) {
  Value *loc = NULL, *scale = NULL, *size = NULL;
  if (args_bind("normal", a, "loc=, scale=, size=", (Value **[]){&loc, &scale, &size}) < 0) return NULL;
  double l, s;
  if (scalar_param("normal", "loc", loc, 0.0, &l) < 0 || scalar_param("normal", "scale", scale, 1.0, &s) < 0)
    return NULL;
  if (s < 0) return err_set(ERR_VALUE, "scale < 0");
  return fill_f64(self_rng(self), size, draw_normal, l, s);
}

/* standard_normal(size=None) */
static Value *m_standard_normal(Value *self, const CallArgs *a) {
  Value *size = NULL, *dtype = NULL;
  bool gen = self_rng(self)->pcg;
  if (args_bind("standard_normal", a, gen ? "size=, dtype=" : "size=", (Value **[]){&size, &dtype}) < 0)
    return NULL;
  int t = DT_F64;
  if (!bi_is_none(dtype) && (hostnp_dtype_arg(dtype, &t) < 0 || t != DT_F64))
    return err_occurred() ? NULL : err_set(ERR_NOT_IMPLEMENTED, "standard_normal(): only dtype float64 is supported");
  return fill_f64(self_rng(self), size, draw_normal, 0.0, 1.0);
}

/* The dimensions d0, d1, ... of rand and randn as a shape tuple; None
 * for none. */
static Value *dims_size(const char *fname, const CallArgs *a) {
  if (a->nkw) return err_set(ERR_TYPE, "%s() takes no keyword arguments", fname);
  if (a->nargs == 0) return VAL_NONE;
  int64_t shape[SHM_MAXDIM];
  if (a->nargs > SHM_MAXDIM) return err_set(ERR_VALUE, "%s(): more than %d dimensions", fname, SHM_MAXDIM);
  for (int i = 0; i < a->nargs; i++)
    if (arr_to_index(a->args[i], &shape[i]) < 0) return NULL;
  return val_int_tuple(a->nargs, shape);
}

/* rand(d0, d1, ...) */
static Value *m_rand(Value *self, const CallArgs *a) {
  Value *size = dims_size("rand", a);
  Value *r = size ? fill_f64(self_rng(self), size, draw_uniform, 0.0, 1.0) : NULL;
  val_decref(size);
  return r;
}

/* randn(d0, d1, ...) */
static Value *m_randn(Value *self, const CallArgs *a) {
  Value *size = dims_size("randn", a);
  Value *r = size ? fill_f64(self_rng(self), size, draw_normal, 0.0, 1.0) : NULL;
  val_decref(size);
  return r;
}

/* Integers in [low, high) (or [low, high] with [endpoint]): a Python int
 * for size None, else an int64 (or int32) array.  RandomState.randint and
 * Generator.integers. */
static Value *draw_ints(NpRng *r, const char *fname, Value *lo, Value *hi, Value *size, Value *dtype,
                        bool endpoint) {
  int64_t l, h;
  if (arr_to_index(lo, &l) < 0 || (!bi_is_none(hi) && arr_to_index(hi, &h) < 0)) return NULL;
  if (bi_is_none(hi)) {
    h = l;
    l = 0;
  }
  if (!endpoint && h <= l) return err_set(ERR_VALUE, bi_is_none(hi) ? "high <= 0" : "low >= high");
  if (endpoint && h < l) return err_set(ERR_VALUE, "low > high");
  int t = DT_I64;
  if (!bi_is_none(dtype) && hostnp_dtype_arg(dtype, &t) < 0) return NULL;
  if (t != DT_I64 && t != DT_I32)
    return err_set(ERR_NOT_IMPLEMENTED, "%s(): only dtype int64 or int32 is supported", fname);
  if (t == DT_I32 && (l < INT32_MIN || h - !endpoint > INT32_MAX))
    return err_set(ERR_VALUE, "%s is out of bounds for int32", l < INT32_MIN ? "low" : "high");
  uint64_t rng = (uint64_t)h - (uint64_t)l - (endpoint ? 0 : 1);
  int nd;
  int64_t shape[SHM_MAXDIM];
  bool scalar;
  if (size_arg(size, &nd, shape, &scalar) < 0) return NULL;
  Array *out = scalar ? NULL : arr_new((DType)t, nd, shape);
  if (!scalar && !out) return NULL;
  int64_t one = 0;
  if (rng_acquire(r) < 0) {
    val_decref(out ? &out->hdr : NULL);
    return NULL;
  }
  for (int64_t i = 0, n = out ? out->size : 1; i < n; i++) {
    int64_t v = (int64_t)((uint64_t)l + bounded(r, rng));
    if (!out) one = v;
    else if (t == DT_I64) ((int64_t *)arr_data(out))[i] = v;
    else ((int32_t *)arr_data(out))[i] = (int32_t)v;
  }
  pthread_mutex_unlock(&r->lock);
  return out ? &out->hdr : arr_python_int(one);
}

/* randint(low, high=None, size=None, dtype=int) */
static Value *m_randint(Value *self, const CallArgs *a) {
  Value *lo, *hi = NULL, *size = NULL, *dtype = NULL;
  if (args_bind("randint", a, "low, high=, size=, dtype=", (Value **[]){&lo, &hi, &size, &dtype}) < 0)
    return NULL;
  return draw_ints(self_rng(self), "randint", lo, hi, size, dtype, false);
}

/* integers(low, high=None, size=None, dtype=int64, endpoint=False) */
static Value *m_integers(Value *self, const CallArgs *a) {
  Value *lo, *hi = NULL, *size = NULL, *dtype = NULL, *ep = NULL;
  if (args_bind("integers", a, "low, high=, size=, dtype=, endpoint=", (Value **[]){&lo, &hi, &size, &dtype, &ep}) < 0)
    return NULL;
  bool endpoint;
  if (bi_bool_arg(ep, false, &endpoint) < 0) return NULL;
  return draw_ints(self_rng(self), "integers", lo, hi, size, dtype, endpoint);
}

/* permutation(x): a shuffled arange(x) for an int, else x's rows in a
 * shuffled order.  Both APIs shuffle from the last element down, each
 * swapping with an index drawn in [0, i]. */
static Value *m_permutation(Value *self, const CallArgs *a) {
  Value *x;
  if (args_bind("permutation", a, "x", (Value **[]){&x}) < 0) return NULL;
  int64_t n;
  bool is_int = x->type == V_ARRAY && AS_ARRAY(x)->ndim == 0;
  if (is_int) {
    if (arr_to_index(x, &n) < 0) return NULL;
    if (n < 0) return err_set(ERR_VALUE, "negative dimensions are not allowed");
  } else if (x->type == V_ARRAY) {
    n = AS_ARRAY(x)->shape[0];
  } else {
    return err_set(ERR_TYPE, "permutation(): x must be an integer or an array");
  }
  Array *idx = arr_new(DT_I64, 1, &n);
  if (!idx) return NULL;
  int64_t *d = arr_data(idx);
  for (int64_t i = 0; i < n; i++) d[i] = i;
  NpRng *r = self_rng(self);
  if (rng_acquire(r) < 0) {
    val_decref(&idx->hdr);
    return NULL;
  }
  for (int64_t i = n - 1; i > 0; i--) {
    int64_t j = (int64_t)bounded_masked(r, (uint64_t)i), t = d[i];
    d[i] = d[j];
    d[j] = t;
  }
  pthread_mutex_unlock(&r->lock);
  if (is_int) return &idx->hdr;
  Value *res = ops_getitem(x, &idx->hdr);
  val_decref(&idx->hdr);
  return res;
}

/* The probabilities [p] of choice over [n] (NULL for None) as a
 * normalised cumulative sum in [cdf] (n doubles, a new array), summed in
 * order and divided by the total as NumPy does; NumPy's checks. */
static int choice_cdf(Value *p, int64_t n, double **cdf) {
  *cdf = NULL;
  if (bi_is_none(p)) return 0;
  Value *pa = hostnp_operand(p);
  if (!pa) return -1;
  int rc = -1;
  if (pa->type != V_ARRAY || AS_ARRAY(pa)->ndim != 1) {
    err_set(ERR_VALUE, "p must be 1-dimensional");
  } else if (AS_ARRAY(pa)->size != n) {
    err_set(ERR_VALUE, "a and p must have same size");
  } else if (!(*cdf = shm_calloc((size_t)n + 1, sizeof **cdf))) {
    err_nomem();
  } else {
    double acc = 0, comp = 0;   /* the check's Kahan sum, as NumPy's */
    rc = 0;
    for (int64_t i = 0; i < n; i++) {
      double v = arr_get_f64(AS_ARRAY(pa), i), y = v - comp, t = acc + y;
      comp = (t - acc) - y;
      acc = t;
      if (!(v >= 0)) rc = -1;
      (*cdf)[i] = (i ? (*cdf)[i - 1] : 0) + v;
    }
    if (rc < 0) err_set(ERR_VALUE, "probabilities are not non-negative");
    else if (fabs(acc - 1.0) > 1.4901161193847656e-08) rc = -1, err_set(ERR_VALUE, "probabilities do not sum to 1");
    for (int64_t i = 0; rc == 0 && i < n; i++) (*cdf)[i] /= (*cdf)[n - 1];
  }
  val_decref(pa);
  if (rc < 0) {
    shm_free(*cdf);
    *cdf = NULL;
  }
  return rc;
}

/* The indices of choice, [n] of them into [d], drawn from [r] (locked):
 * by the cumulative probabilities (the count of cdf values <= a uniform,
 * NumPy's searchsorted right), else uniform integers below [pop], or,
 * given the scratch [perm], without replacement: the first n of a
 * permutation. */
static void choice_draw(NpRng *r, int64_t *d, int64_t n, int64_t pop, const double *cdf, int64_t *perm) {
  if (perm) {   /* without replacement: [perm] has room for pop */
    for (int64_t i = 0; i < pop; i++) perm[i] = i;
    for (int64_t i = pop - 1; i > 0; i--) {
      int64_t j = (int64_t)bounded_masked(r, (uint64_t)i), t = perm[i];
      perm[i] = perm[j];
      perm[j] = t;
    }
    memcpy(d, perm, (size_t)n * sizeof *d);
    return;
  }
  for (int64_t i = 0; i < n; i++) {
    if (!cdf) {
      d[i] = (int64_t)bounded(r, (uint64_t)pop - 1);
      continue;
    }
    double u = next_double(r);
    int64_t lo = 0, hi = pop;
    while (lo < hi) {
      int64_t mid = lo + (hi - lo) / 2;
      if (cdf[mid] <= u) lo = mid + 1;
      else hi = mid;
    }
    d[i] = lo;
  }
}

/* choice(a, size=None, replace=True, p=None): elements of a 1-D [a] (or
 * of arange(a) for an int).  Without replacement, only the legacy API
 * without p (NumPy's Generator uses another method there). */
static Value *m_choice(Value *self, const CallArgs *a) {
  Value *av, *size = NULL, *rep = NULL, *p = NULL;
  if (args_bind("choice", a, "a, size=, replace=, p=", (Value **[]){&av, &size, &rep, &p}) < 0) return NULL;
  NpRng *r = self_rng(self);
  bool replace, is_int = av->type == V_ARRAY && AS_ARRAY(av)->ndim == 0;
  if (bi_bool_arg(rep, true, &replace) < 0) return NULL;
  if (!replace && (r->pcg || !bi_is_none(p)))
    return err_set(ERR_NOT_IMPLEMENTED, "choice(replace=False) is implemented for the legacy API without p only");
  Value *arr = is_int ? NULL : hostnp_operand(av);
  int64_t pop;
  if (is_int ? arr_to_index(av, &pop) < 0 : !arr) return NULL;
  if (!is_int && (arr->type != V_ARRAY || AS_ARRAY(arr)->ndim != 1)) {
    val_decref(arr);
    return err_set(ERR_VALUE, "a must be 1-dimensional or an integer");
  }
  if (!is_int) pop = AS_ARRAY(arr)->shape[0];
  int nd;
  int64_t shape[SHM_MAXDIM];
  bool scalar;
  double *cdf = NULL;
  int64_t *perm = NULL;
  Array *idx = NULL;
  Value *res = NULL;
  if (size_arg(size, &nd, shape, &scalar) < 0 || choice_cdf(p, pop, &cdf) < 0) goto done;
  int64_t n = shape_size(nd, shape);
  if (pop <= 0 && n > 0) {
    err_set(ERR_VALUE, pop < 0 ? "a must be greater than 0 unless no samples are taken"
                               : "a cannot be empty unless no samples are taken");
    goto done;
  }
  if (!replace && n > pop) {
    err_set(ERR_VALUE, "Cannot take a larger sample than population when 'replace=False'");
    goto done;
  }
  if (!replace && !(perm = shm_calloc((size_t)pop + 1, sizeof *perm))) goto done;
  if (!(idx = arr_new(DT_I64, nd, shape)) || rng_acquire(r) < 0) goto done;
  choice_draw(r, arr_data(idx), idx->size, pop, cdf, perm);
  pthread_mutex_unlock(&r->lock);
  res = is_int ? (scalar ? arr_python_int(*(int64_t *)arr_data(idx)) : val_incref(&idx->hdr))
               : ops_getitem(arr, &idx->hdr);
done:
  shm_free(cdf);
  shm_free(perm);
  val_decref(idx ? &idx->hdr : NULL);
  val_decref(arr);
  return res;
}

/* seed(seed=None): RandomState only */
static Value *m_seed(Value *self, const CallArgs *a) {
  Value *seed = NULL;
  if (args_bind("seed", a, "seed=", (Value **[]){&seed}) < 0) return NULL;
  NpRng *r = self_rng(self);
  if (rng_acquire(r) < 0) return NULL;
  int rc = rng_seed(r, seed);
  pthread_mutex_unlock(&r->lock);
  return rc < 0 ? NULL : VAL_NONE;
}

typedef struct RngMethod {
  const char *name;
  MethodFn fn;
  unsigned api;   /* LEGACY, GEN or both */
} RngMethod;
enum { LEGACY = 1, GEN = 2 };

static const RngMethod rng_methods[] = {
  {"random", m_random, GEN | LEGACY},   {"random_sample", m_random, LEGACY},
  {"uniform", m_uniform, GEN | LEGACY}, {"normal", m_normal, GEN | LEGACY},
  {"standard_normal", m_standard_normal, GEN | LEGACY},
  {"rand", m_rand, LEGACY},             {"randn", m_randn, LEGACY},
  {"randint", m_randint, LEGACY},       {"integers", m_integers, GEN},
  {"permutation", m_permutation, GEN | LEGACY}, {"seed", m_seed, LEGACY},
  {"choice", m_choice, GEN | LEGACY},
  {NULL, NULL, 0},
};

static Value *rng_getattr(Value *self, const char *name) {
  unsigned api = self_rng(self)->pcg ? GEN : LEGACY;
  for (const RngMethod *m = rng_methods; m->name; m++)
    if (!strcmp(m->name, name) && (m->api & api)) return hostnp_wrap(bound_new(m->name, m->fn, self));
  return err_set(ERR_ATTRIBUTE, "'%s' object has no attribute '%s'",
                 api == GEN ? "numpy.random.Generator" : "numpy.random.RandomState", name);
}

/* ==== the module =================================================================== */

/* np.random's own RandomState, which the module's functions draw from
 * (seeded from the operating system until np.random.seed). */
static Value *global_rs;

#define LEGACY_FN(name)                                                   \
  static Value *fn_##name(const CallArgs *a) { return m_##name(global_rs, a); }
LEGACY_FN(random)
LEGACY_FN(uniform)
LEGACY_FN(normal)
LEGACY_FN(standard_normal)
LEGACY_FN(rand)
LEGACY_FN(randn)
LEGACY_FN(randint)
LEGACY_FN(permutation)
LEGACY_FN(choice)
LEGACY_FN(seed)

/* default_rng(seed=None) */
static Value *fn_default_rng(const CallArgs *a) {
  Value *seed = NULL;
  if (args_bind("default_rng", a, "seed=", (Value **[]){&seed}) < 0) return NULL;
  if (seed && seed->type == V_OPAQUE && ((Opaque *)seed)->ot == &rng_type && self_rng(seed)->pcg)
    return val_incref(seed);   /* a Generator is passed through, as NumPy does */
  return rng_new(true, seed);
}

/* RandomState(seed=None) */
static Value *fn_random_state(const CallArgs *a) {
  Value *seed = NULL;
  if (args_bind("RandomState", a, "seed=", (Value **[]){&seed}) < 0) return NULL;
  return rng_new(false, seed);
}

int hostnp_random_register(Value *globals) {
  static const struct { const char *name; BuiltinFn fn; const char *doc; } fns[] = {
    {"random", fn_random, "random(size=None): floats in [0, 1) (MT19937, NumPy's bits)"},
    {"random_sample", fn_random, "random_sample(size=None): floats in [0, 1)"},
    {"uniform", fn_uniform, "uniform(low=0.0, high=1.0, size=None)"},
    {"normal", fn_normal, "normal(loc=0.0, scale=1.0, size=None)"},
    {"standard_normal", fn_standard_normal, "standard_normal(size=None)"},
    {"rand", fn_rand, "rand(d0, d1, ...): floats in [0, 1)"},
    {"randn", fn_randn, "randn(d0, d1, ...): standard normal floats"},
    {"randint", fn_randint, "randint(low, high=None, size=None, dtype=int)"},
    {"permutation", fn_permutation, "permutation(x): a shuffled arange(x) or copy of x"},
    {"choice", fn_choice, "choice(a, size=None, replace=True, p=None)"},
    {"seed", fn_seed, "seed(seed=None): reseeds np.random's RandomState"},
    {"default_rng", fn_default_rng, "default_rng(seed=None): a Generator over PCG64"},
    {"RandomState", fn_random_state, "RandomState(seed=None): a legacy MT19937 generator"},
  };
  if (!global_rs && !(global_rs = rng_new(false, NULL))) return -1;
  ((NpRng *)global_rs)->writer = 0;   /* the program's, even when a body imports numpy first */
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) {
    Value *b = hostnp_wrap(builtin_new(fns[i].name, fns[i].fn, fns[i].doc));   /* NumPy's arrays */
    int rc = b ? dict_set_str(globals, fns[i].name, b) : -1;
    val_decref(b);
    if (rc < 0) return -1;
  }
  return 0;
}
