/*
 * stdmod.c - the standard modules math, time, os, sys, typing,
 * __future__ and collections (stdmod.h); functools, itertools and
 * operator are in stdmod_func.c.
 *
 * Numbers in and out are Python's: math takes an int, a float or a
 * concrete size-1 array (as Python's math does through __float__) and
 * returns a Python float or int, with Python's ValueError "math domain
 * error" and OverflowError "math range error"; ints are 64-bit here, so
 * an int result past 64 bits (factorial(21)) is an OverflowError rather
 * than Python's big int.  typing's names are placeholders: annotations
 * are not evaluated (as under `from __future__ import annotations`), and
 * a subscripted form (Optional[int]) is the form itself.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "array/array.h"
#include "array/print.h"
#include "base/intern.h"
#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/builtins_impl.h"
#include "lang/eval.h"
#include "lang/exceptions.h"
#include "lang/ops.h"
#include "lang/stdmod.h"

extern char **environ;

enum { M_MATH, M_TIME, M_OS, M_OS_PATH, M_SYS, M_TYPING, M_FUTURE, M_COLLECTIONS, M_FUNCTOOLS,
       M_ITERTOOLS, M_OPERATOR, M_COUNT };
static const char *const mod_names[M_COUNT] = {
  "math", "time", "os", "os.path", "sys", "typing", "__future__", "collections", "functools",
  "itertools", "operator"};
static Value *mods[M_COUNT];

static int make_module(int i);
static Value *partial_fn;   /* functools.partial, made by builtins.c */

/* Each module is made at its first import, so a script that imports none
 * pays nothing for them; the lock makes that once. */
static pthread_mutex_t make_lock = PTHREAD_MUTEX_INITIALIZER;

Value *stdmod_namespace(const char *name) {
  int i = 0;
  while (i < M_COUNT && strcmp(name, mod_names[i])) i++;
  if (i == M_COUNT || !partial_fn) return NULL;   /* before start-up ends: builtins.c's own */
  pthread_mutex_lock(&make_lock);
  Value *m = mods[i] || make_module(i) == 0 ? mods[i] : NULL;
  pthread_mutex_unlock(&make_lock);
  return m;
}

int stdmod_add(Value *m, const char *name, BuiltinFn fn, const char *doc) {
  Value *b = builtin_new(name, fn, doc);
  int rc = b ? dict_set_str(((Module *)m)->globals, name, b) : -1;
  val_decref(b);
  return rc;
}

static int set_steal(Value *m, const char *name, Value *v) {
  int rc = v ? dict_set_str(((Module *)m)->globals, name, v) : -1;
  val_decref(v);
  return rc;
}

int stdmod_add_all(Value *m, const StdFn *fns) {
  for (; fns->name; fns++)
    if (stdmod_add(m, fns->name, fns->fn, fns->doc) < 0) return -1;
  return 0;
}

/* ==== math ==================================================================== */

/* A number argument of math.[f] as a double: a Python number or a
 * concrete size-1 array; a traced value is an error naming jnp. */
static int real(const char *f, Value *v, double *out) {
  if (v->type == V_TRACER) {
    err_set(ERR_TYPE, "math.%s() needs a concrete number, not a traced value (use jnp.%s)", f, f);
    return -1;
  }
  if (v->type != V_ARRAY) {
    err_set(ERR_TYPE, "must be real number, not %s", val_type_name(v));
    return -1;
  }
  return arr_to_double(v, out);
}

/* The float result [r] of math.[f] on finite [x]: NaN from numbers is a
 * domain error, an infinity a range error, or a domain error where the
 * function has a pole there ([pole]: log(0), atanh(1), gamma(0)). */
static Value *float_result(double r, double x, double y, bool pole) {
  bool finite_in = isfinite(x) && isfinite(y);
  if (isnan(r) && !isnan(x) && !isnan(y)) return err_set(ERR_VALUE, "math domain error");
  if (isinf(r) && finite_in) return pole ? err_set(ERR_VALUE, "math domain error")
                                         : err_set(ERR_OVERFLOW, "math range error");
  return arr_python_float(r);
}

typedef struct Fn1 {
  const char *name;
  double (*f)(double);
  bool pole;
} Fn1;

static const Fn1 fn1s[] = {
  {"sqrt", sqrt, false},   {"exp", exp, false},     {"exp2", exp2, false},   {"expm1", expm1, false},
  {"log2", log2, true},    {"log10", log10, true},  {"log1p", log1p, true},  {"sin", sin, false},
  {"cos", cos, false},     {"tan", tan, false},     {"asin", asin, false},   {"acos", acos, false},
  {"atan", atan, false},   {"sinh", sinh, false},   {"cosh", cosh, false},   {"tanh", tanh, false},
  {"asinh", asinh, false}, {"acosh", acosh, false}, {"atanh", atanh, true},  {"erf", erf, false},
  {"erfc", erfc, false},   {"gamma", tgamma, true}, {"lgamma", lgamma, true}, {"fabs", fabs, false},
  {"cbrt", cbrt, false},
};

static Value *math1(int k, const CallArgs *a) {
  Value *x;
  if (args_bind(fn1s[k].name, a, "x", (Value **[]){&x}) < 0) return NULL;
  double v;
  if (real(fn1s[k].name, x, &v) < 0) return NULL;
  if (!strcmp(fn1s[k].name, "gamma") && v <= 0 && v == floor(v)) return err_set(ERR_VALUE, "math domain error");
  return float_result(fn1s[k].f(v), v, 0, fn1s[k].pole);
}

#define MATH1(i) static Value *math1_##i(const CallArgs *a) { return math1(i, a); }
MATH1(0) MATH1(1) MATH1(2) MATH1(3) MATH1(4) MATH1(5) MATH1(6) MATH1(7) MATH1(8) MATH1(9)
MATH1(10) MATH1(11) MATH1(12) MATH1(13) MATH1(14) MATH1(15) MATH1(16) MATH1(17) MATH1(18)
MATH1(19) MATH1(20) MATH1(21) MATH1(22) MATH1(23) MATH1(24)
static const BuiltinFn math1_fns[] = {
  math1_0, math1_1, math1_2, math1_3, math1_4, math1_5, math1_6, math1_7, math1_8, math1_9,
  math1_10, math1_11, math1_12, math1_13, math1_14, math1_15, math1_16, math1_17, math1_18,
  math1_19, math1_20, math1_21, math1_22, math1_23, math1_24};
_Static_assert(sizeof math1_fns / sizeof math1_fns[0] == sizeof fn1s / sizeof fn1s[0],
               "one function per fn1s entry");

/* Two numbers of math.[f]. */
static int reals2(const char *f, const char *spec, const CallArgs *a, double *x, double *y) {
  Value *u, *v;
  if (args_bind(f, a, spec, (Value **[]){&u, &v}) < 0) return -1;
  return real(f, u, x) < 0 || real(f, v, y) < 0 ? -1 : 0;
}

static Value *m_pow(const CallArgs *a) {
  double x, y;
  if (reals2("pow", "x, y", a, &x, &y) < 0) return NULL;
  if (x == 0 && y < 0) return err_set(ERR_VALUE, "math domain error");
  return float_result(pow(x, y), x, y, false);
}

static Value *m_atan2(const CallArgs *a) {
  double y, x;
  return reals2("atan2", "y, x", a, &y, &x) < 0 ? NULL : arr_python_float(atan2(y, x));
}

static Value *m_hypot(const CallArgs *a) {
  double x, y;
  return reals2("hypot", "x, y", a, &x, &y) < 0 ? NULL : float_result(hypot(x, y), x, y, false);
}

static Value *m_copysign(const CallArgs *a) {
  double x, y;
  return reals2("copysign", "x, y", a, &x, &y) < 0 ? NULL : arr_python_float(copysign(x, y));
}

static Value *m_fmod(const CallArgs *a) {
  double x, y;
  if (reals2("fmod", "x, y", a, &x, &y) < 0) return NULL;
  return float_result(fmod(x, y), x, y, false);
}

/* log(x[, base]) */
static Value *m_log(const CallArgs *a) {
  Value *x, *b = NULL;
  if (args_bind("log", a, "x, base=", (Value **[]){&x, &b}) < 0) return NULL;
  double v, base;
  if (real("log", x, &v) < 0 || (b && real("log", b, &base) < 0)) return NULL;
  if (v <= 0 || (b && (base <= 0 || base == 1))) return err_set(ERR_VALUE, "math domain error");
  return arr_python_float(b ? log(v) / log(base) : log(v));
}

static Value *deg_rad(const CallArgs *a, const char *f, double k) {
  Value *x;
  double v;
  if (args_bind(f, a, "x", (Value **[]){&x}) < 0 || real(f, x, &v) < 0) return NULL;
  return arr_python_float(v * k);
}
static Value *m_degrees(const CallArgs *a) { return deg_rad(a, "degrees", 180.0 / M_PI); }
static Value *m_radians(const CallArgs *a) { return deg_rad(a, "radians", M_PI / 180.0); }

/* A Python int of math.[f]: an int or a bool; an integral float is a
 * TypeError as in Python 3.10 and later. */
static int int_arg(const char *f, Value *v, int64_t *out) {
  if (!arr_is_host(v) || dt_is_float(AS_ARRAY(v)->dtype)) {
    err_set(ERR_TYPE, "math.%s() argument must be an integer, not %s", f,
            arr_is_host(v) ? "float" : val_type_name(v));
    return -1;
  }
  return arr_to_index(v, out);
}

/* floor, ceil, trunc: Python ints (an int is itself). */
static Value *rounding(const CallArgs *a, const char *f, double (*g)(double)) {
  Value *x;
  if (args_bind(f, a, "x", (Value **[]){&x}) < 0) return NULL;
  if (arr_is_host(x) && !dt_is_float(AS_ARRAY(x)->dtype)) return val_incref(x);
  double v;
  if (real(f, x, &v) < 0) return NULL;
  if (isnan(v)) return err_set(ERR_VALUE, "cannot convert float NaN to integer");
  double r = g(v);
  if (!(r >= -9223372036854775808.0 && r < 9223372036854775808.0))
    return err_set(ERR_OVERFLOW, isinf(v) ? "cannot convert float infinity to integer"
                                          : "math.%s(): the int exceeds 64 bits", f);
  return arr_python_int((int64_t)r);
}
static Value *m_floor(const CallArgs *a) { return rounding(a, "floor", floor); }
static Value *m_ceil(const CallArgs *a) { return rounding(a, "ceil", ceil); }
static Value *m_trunc(const CallArgs *a) { return rounding(a, "trunc", trunc); }

static Value *int_overflow(const char *f) {
  return err_set(ERR_OVERFLOW, "math.%s(): the result exceeds 64 bits (shmap's ints are 64-bit)", f);
}

/* n! */
static Value *m_factorial(const CallArgs *a) {
  Value *x;
  int64_t n, r = 1;
  if (args_bind("factorial", a, "n", (Value **[]){&x}) < 0 || int_arg("factorial", x, &n) < 0) return NULL;
  if (n < 0) return err_set(ERR_VALUE, "factorial() not defined for negative values");
  for (int64_t i = 2; i <= n; i++)
    if (__builtin_mul_overflow(r, i, &r)) return int_overflow("factorial");
  return arr_python_int(r);
}

/* perm(n, k) and comb(n, k): products of k factors, exact while they fit. */
static Value *perm_comb(const CallArgs *a, const char *f, bool comb) {
  Value *x, *y = NULL;
  int64_t n, k, r = 1;
  if (args_bind(f, a, comb ? "n, k" : "n, k=", (Value **[]){&x, &y}) < 0 || int_arg(f, x, &n) < 0)
    return NULL;
  k = n;
  if (y && !bi_is_none(y) && int_arg(f, y, &k) < 0) return NULL;
  if (n < 0 || k < 0) return err_set(ERR_VALUE, "%s must be a non-negative integer", n < 0 ? "n" : "k");
  if (k > n) return arr_python_int(0);
  if (comb && k > n - k) k = n - k;
  for (int64_t i = 0; i < k; i++) {
    if (__builtin_mul_overflow(r, n - i, &r)) return int_overflow(f);
    if (comb) r /= i + 1;   /* exact: a product of i+1 consecutive ints over (i+1)! */
  }
  return arr_python_int(r);
}
static Value *m_perm(const CallArgs *a) { return perm_comb(a, "perm", false); }
static Value *m_comb(const CallArgs *a) { return perm_comb(a, "comb", true); }

/* isqrt(n): the floor of the exact square root */
static Value *m_isqrt(const CallArgs *a) {
  Value *x;
  int64_t n;
  if (args_bind("isqrt", a, "n", (Value **[]){&x}) < 0 || int_arg("isqrt", x, &n) < 0) return NULL;
  if (n < 0) return err_set(ERR_VALUE, "isqrt() argument must be nonnegative");
  int64_t r = (int64_t)sqrt((double)n);   /* within one of the answer; corrected exactly */
  while (r > 0 && (r > 3037000499 || r * r > n)) r--;
  while (r < 3037000499 && (r + 1) * (r + 1) <= n) r++;
  return arr_python_int(r);
}

static int64_t gcd64(int64_t x, int64_t y) {
  x = x < 0 ? -x : x;
  y = y < 0 ? -y : y;
  while (y) {
    int64_t t = x % y;
    x = y;
    y = t;
  }
  return x;
}

/* gcd(*integers) and lcm(*integers) */
static Value *gcd_lcm(const CallArgs *a, const char *f, bool lcm) {
  if (a->nkw) return err_set(ERR_TYPE, "%s() takes no keyword arguments", f);
  int64_t r = lcm ? 1 : 0, v;
  for (int i = 0; i < a->nargs; i++) {
    if (int_arg(f, a->args[i], &v) < 0) return NULL;
    if (!lcm) r = gcd64(r, v);
    else if (v == 0 || r == 0) r = 0;
    else if (__builtin_mul_overflow(r / gcd64(r, v), v < 0 ? -v : v, &r)) return int_overflow(f);
  }
  return arr_python_int(r);
}
static Value *m_gcd(const CallArgs *a) { return gcd_lcm(a, "gcd", false); }
static Value *m_lcm(const CallArgs *a) { return gcd_lcm(a, "lcm", true); }

/* isnan, isinf, isfinite */
static Value *classify(const CallArgs *a, const char *f, int which) {
  Value *x;
  double v;
  if (args_bind(f, a, "x", (Value **[]){&x}) < 0 || real(f, x, &v) < 0) return NULL;
  return val_bool(which == 0 ? isnan(v) : which == 1 ? isinf(v) : isfinite(v));
}
static Value *m_isnan(const CallArgs *a) { return classify(a, "isnan", 0); }
static Value *m_isinf(const CallArgs *a) { return classify(a, "isinf", 1); }
static Value *m_isfinite(const CallArgs *a) { return classify(a, "isfinite", 2); }

/* isclose(a, b, *, rel_tol=1e-09, abs_tol=0.0) */
static Value *m_isclose(const CallArgs *a) {
  Value *x, *y, *rt = NULL, *at = NULL;
  if (args_bind("isclose", a, "a, b, rel_tol=, abs_tol=", (Value **[]){&x, &y, &rt, &at}) < 0) return NULL;
  double u, v, rel, abs_;
  if (real("isclose", x, &u) < 0 || real("isclose", y, &v) < 0 ||
      bi_float_arg("isclose", "rel_tol", rt, 1e-9, &rel) < 0 ||
      bi_float_arg("isclose", "abs_tol", at, 0.0, &abs_) < 0)
    return NULL;
  if (rel < 0 || abs_ < 0) return err_set(ERR_VALUE, "tolerances must be non-negative");
  if (u == v) return val_bool(true);
  if (isinf(u) || isinf(v)) return val_bool(false);
  double d = fabs(u - v);
  return val_bool(d <= fabs(rel * v) || d <= fabs(rel * u) || d <= abs_);
}

/* fsum(iterable): the correctly rounded sum, by Shewchuk's exact
 * partial sums (the algorithm Python's fsum documents). */
static Value *m_fsum(const CallArgs *a) {
  Value *it;
  if (args_bind("fsum", a, "iterable", (Value **[]){&it}) < 0) return NULL;
  Value *items = ops_iter_items(it);
  if (!items) return NULL;
  size_t n = list_len(items), np = 0;
  double *p = shm_calloc(n + 1, sizeof *p), special = 0;
  Value *res = NULL;
  if (!p) goto done;
  for (size_t i = 0; i < n; i++) {
    double x;
    if (real("fsum", list_get(items, i), &x) < 0) goto done;
    if (!isfinite(x)) {
      special += x;
      continue;
    }
    size_t k = 0;
    for (size_t j = 0; j < np; j++) {
      double y = p[j];
      if (fabs(x) < fabs(y)) { double t = x; x = y; y = t; }
      double hi = x + y, lo = y - (hi - x);
      if (lo != 0) p[k++] = lo;
      x = hi;
    }
    p[k++] = x;
    np = k;
  }
  double s = 0;
  while (np) s += p[--np];   /* the partials do not overlap: their sum rounds once */
  res = special != 0 || isnan(special) ? arr_python_float(special) : arr_python_float(s);
done:
  shm_free(p);
  val_decref(items);
  return p ? res : err_nomem();
}

/* prod(iterable, *, start=1): Python's multiplication, left to right. */
static Value *m_prod(const CallArgs *a) {
  Value *it, *start = NULL;
  if (args_bind("prod", a, "iterable, start=", (Value **[]){&it, &start}) < 0) return NULL;
  Value *items = ops_iter_items(it);
  if (!items) return NULL;
  Value *acc = start ? val_incref(start) : arr_python_int(1);
  for (size_t i = 0; acc && i < list_len(items); i++) {
    Value *next = ops_binary(OP_MUL, acc, list_get(items, i));
    val_decref(acc);
    acc = next;
  }
  val_decref(items);
  return acc;
}

static const StdFn math_fns[] = {
  {"pow", m_pow, "pow(x, y): x**y as floats"},
  {"atan2", m_atan2, "atan2(y, x)"},
  {"hypot", m_hypot, "hypot(x, y)"},
  {"copysign", m_copysign, "copysign(x, y)"},
  {"fmod", m_fmod, "fmod(x, y): C's remainder"},
  {"log", m_log, "log(x[, base])"},
  {"degrees", m_degrees, "degrees(x)"},
  {"radians", m_radians, "radians(x)"},
  {"floor", m_floor, "floor(x): an int"},
  {"ceil", m_ceil, "ceil(x): an int"},
  {"trunc", m_trunc, "trunc(x): an int"},
  {"factorial", m_factorial, "factorial(n)"},
  {"isqrt", m_isqrt, "isqrt(n): the integer square root"},
  {"perm", m_perm, "perm(n, k=None)"},
  {"comb", m_comb, "comb(n, k)"},
  {"gcd", m_gcd, "gcd(*integers)"},
  {"lcm", m_lcm, "lcm(*integers)"},
  {"isnan", m_isnan, "isnan(x)"},
  {"isinf", m_isinf, "isinf(x)"},
  {"isfinite", m_isfinite, "isfinite(x)"},
  {"isclose", m_isclose, "isclose(a, b, *, rel_tol=1e-09, abs_tol=0.0)"},
  {"fsum", m_fsum, "fsum(iterable): the correctly rounded sum"},
  {"prod", m_prod, "prod(iterable, *, start=1)"},
  {NULL, NULL, NULL},
};

static int make_math(Value *m) {
  for (size_t i = 0; i < sizeof fn1s / sizeof fn1s[0]; i++)
    if (stdmod_add(m, fn1s[i].name, math1_fns[i], "math function of one float") < 0) return -1;
  static const struct { const char *name; double v; } cs[] = {
    {"pi", M_PI}, {"e", M_E}, {"tau", 2 * M_PI}, {"inf", INFINITY}, {"nan", NAN}};
  for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
    if (set_steal(m, cs[i].name, arr_python_float(cs[i].v)) < 0) return -1;
  return stdmod_add_all(m, math_fns);
}

/* ==== time ======================================================================= */

static double clock_s(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int64_t clock_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static Value *no_args(const CallArgs *a, const char *f) {
  return a->nargs || a->nkw ? err_set(ERR_TYPE, "%s() takes no arguments", f) : VAL_NONE;
}

#define CLOCK_FN(fname, clk)                                                            \
  static Value *t_##fname(const CallArgs *a) {                                          \
    return no_args(a, #fname) ? arr_python_float(clock_s(clk)) : NULL;                  \
  }                                                                                     \
  static Value *t_##fname##_ns(const CallArgs *a) {                                     \
    return no_args(a, #fname "_ns") ? arr_python_int(clock_ns(clk)) : NULL;             \
  }
CLOCK_FN(time, CLOCK_REALTIME)
CLOCK_FN(perf_counter, CLOCK_MONOTONIC)
CLOCK_FN(monotonic, CLOCK_MONOTONIC)
CLOCK_FN(process_time, CLOCK_PROCESS_CPUTIME_ID)

/* sleep(secs): in slices of at most 50 ms, so Ctrl-C ends it soon. */
static Value *t_sleep(const CallArgs *a) {
  Value *x;
  double s;
  if (args_bind("sleep", a, "secs", (Value **[]){&x}) < 0 || real("sleep", x, &s) < 0) return NULL;
  if (!(s >= 0)) return err_set(ERR_VALUE, "sleep length must be non-negative");
  for (double left = s; left > 0; left -= 0.05) {
    if (shm_interrupt_pending()) return err_set(ERR_INTERRUPT, "KeyboardInterrupt");
    double d = left < 0.05 ? left : 0.05;
    struct timespec ts = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
    nanosleep(&ts, NULL);
  }
  return VAL_NONE;
}

static const StdFn time_fns[] = {
  {"time", t_time, "time(): seconds since the epoch"},
  {"time_ns", t_time_ns, "time_ns(): nanoseconds since the epoch"},
  {"perf_counter", t_perf_counter, "perf_counter(): seconds of a monotonic clock"},
  {"perf_counter_ns", t_perf_counter_ns, "perf_counter_ns()"},
  {"monotonic", t_monotonic, "monotonic(): seconds of a monotonic clock"},
  {"monotonic_ns", t_monotonic_ns, "monotonic_ns()"},
  {"process_time", t_process_time, "process_time(): CPU seconds of this process"},
  {"process_time_ns", t_process_time_ns, "process_time_ns()"},
  {"sleep", t_sleep, "sleep(secs)"},
  {NULL, NULL, NULL},
};

/* ==== os and os.path =============================================================== */

static Value *str_arg(const char *f, Value *v) {
  if (v->type != V_STR) return err_set(ERR_TYPE, "%s(): expected str, not %s", f, val_type_name(v));
  return v;
}

/* getenv(key, default=None) */
static Value *os_getenv(const CallArgs *a) {
  Value *k, *d = NULL;
  if (args_bind("getenv", a, "key, default=", (Value **[]){&k, &d}) < 0 || !str_arg("getenv", k)) return NULL;
  const char *v = getenv(str_cstr(k));
  return v ? str_from(v) : val_incref(d ? d : VAL_NONE);
}

static Value *os_getcwd(const CallArgs *a) {
  if (!no_args(a, "getcwd")) return NULL;
  char buf[4096];
  return getcwd(buf, sizeof buf) ? str_from(buf) : err_set(ERR_IO, "getcwd: %s", strerror(errno));
}

static Value *os_cpu_count(const CallArgs *a) {
  if (!no_args(a, "cpu_count")) return NULL;
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? arr_python_int(n) : val_incref(VAL_NONE);
}

/* join(a, *p): an absolute part starts over, as posixpath.join. */
static Value *path_join(const CallArgs *a) {
  if (a->nargs < 1 || a->nkw) return err_set(ERR_TYPE, "join() takes at least one positional argument");
  StrBuf b = {0};
  for (int i = 0; i < a->nargs; i++) {
    if (!str_arg("join", a->args[i])) {
      sbuf_free(&b);
      return NULL;
    }
    const char *s = str_cstr(a->args[i]);
    if (s[0] == '/') b.len = 0;
    else if (b.len && b.data[b.len - 1] != '/') sbuf_puts(&b, "/");
    sbuf_puts(&b, s);
  }
  Value *r = b.failed ? err_nomem() : str_new(sbuf_text(&b), b.len);
  sbuf_free(&b);
  return r;
}

/* The path argument of os.path.[f]. */
static const char *path_arg(const char *f, const CallArgs *a) {
  Value *p;
  if (args_bind(f, a, "path", (Value **[]){&p}) < 0 || !str_arg(f, p)) return NULL;
  return str_cstr(p);
}

static Value *path_stat(const CallArgs *a, const char *f, int kind) {
  const char *p = path_arg(f, a);
  struct stat st;
  if (!p) return NULL;
  bool ok = stat(p, &st) == 0;
  return val_bool(ok && (kind == 0 || (kind == 1 ? S_ISREG(st.st_mode) : S_ISDIR(st.st_mode))));
}
static Value *path_exists(const CallArgs *a) { return path_stat(a, "exists", 0); }
static Value *path_isfile(const CallArgs *a) { return path_stat(a, "isfile", 1); }
static Value *path_isdir(const CallArgs *a) { return path_stat(a, "isdir", 2); }

/* dirname and basename: around the last '/', as posixpath splits. */
static Value *path_part(const CallArgs *a, const char *f, bool head) {
  const char *p = path_arg(f, a);
  if (!p) return NULL;
  const char *slash = strrchr(p, '/');
  size_t cut = slash ? (size_t)(slash - p) + 1 : 0;
  if (!head) return str_from(p + cut);
  while (cut > 1 && p[cut - 1] == '/') cut--;   /* "a//b" -> "a", "/b" -> "/" */
  if (cut == 1 && p[0] == '/') return str_from("/");
  return str_new(p, cut && p[cut - 1] == '/' ? cut - 1 : cut);
}
static Value *path_dirname(const CallArgs *a) { return path_part(a, "dirname", true); }
static Value *path_basename(const CallArgs *a) { return path_part(a, "basename", false); }

/* splitext(path): (root, ext), the ext from the last dot of the last
 * component that is not its leading dots. */
static Value *path_splitext(const CallArgs *a) {
  const char *p = path_arg("splitext", a);
  if (!p) return NULL;
  const char *base = strrchr(p, '/');
  base = base ? base + 1 : p;
  const char *lead = base;
  while (*lead == '.') lead++;
  const char *dot = strrchr(lead, '.');
  size_t cut = dot ? (size_t)(dot - p) : strlen(p);
  Value *t = tuple_new(2);
  if (!t) return NULL;
  tuple_set_steal(t, 0, str_new(p, cut));
  tuple_set_steal(t, 1, str_from(p + cut));
  return t;
}

static const StdFn os_fns[] = {
  {"getenv", os_getenv, "getenv(key, default=None)"},
  {"getcwd", os_getcwd, "getcwd()"},
  {"cpu_count", os_cpu_count, "cpu_count()"},
  {NULL, NULL, NULL},
};
static const StdFn os_path_fns[] = {
  {"join", path_join, "join(a, *p)"},
  {"exists", path_exists, "exists(path)"},
  {"isfile", path_isfile, "isfile(path)"},
  {"isdir", path_isdir, "isdir(path)"},
  {"dirname", path_dirname, "dirname(path)"},
  {"basename", path_basename, "basename(path)"},
  {"splitext", path_splitext, "splitext(path): (root, ext)"},
  {NULL, NULL, NULL},
};

/* os.environ: the environment at start-up as a dict (shmap starts no
 * processes, so writing to it changes only the dict). */
static int make_os(Value *os, Value *path) {
  Value *env = dict_new();
  if (!env) return -1;
  for (char **e = environ; *e; e++) {
    const char *eq = strchr(*e, '=');
    if (!eq) continue;
    Value *k = str_new(*e, (size_t)(eq - *e)), *v = k ? str_from(eq + 1) : NULL;
    int rc = v ? dict_set(env, k, v) : -1;
    bi_drop(k, v, NULL, NULL);
    if (rc < 0) {
      val_decref(env);
      return -1;
    }
  }
  if (set_steal(os, "environ", env) < 0 || set_steal(os, "sep", str_from("/")) < 0 ||
      set_steal(os, "name", str_from("posix")) < 0 || stdmod_add_all(os, os_fns) < 0 ||
      stdmod_add_all(path, os_path_fns) < 0)
    return -1;
  return dict_set_str(((Module *)os)->globals, "path", path);
}

/* ==== sys ======================================================================== */

/* sys.stdout and sys.stderr: write(s) and flush(); stdout's text goes
 * where print's does. */
typedef struct Stream {
  Opaque base;
  bool err;
} Stream;

static Value *stream_write(Value *self, const CallArgs *a) {
  Value *s;
  if (args_bind("write", a, "s", (Value **[]){&s}) < 0 || !str_arg("write", s)) return NULL;
  size_t n = ((Str *)s)->len;
  if (((Stream *)self)->err) fwrite(str_cstr(s), 1, n, stderr);
  else eval_write(str_cstr(s), n);
  return arr_python_int((int64_t)str_nchars(s));
}

static Value *stream_flush(Value *self, const CallArgs *a) {
  if (!no_args(a, "flush")) return NULL;
  fflush(((Stream *)self)->err ? stderr : stdout);
  return VAL_NONE;
}

static Value *stream_getattr(Value *self, const char *name) {
  if (!strcmp(name, "write")) return bound_new("write", stream_write, self);
  if (!strcmp(name, "flush")) return bound_new("flush", stream_flush, self);
  return err_set(ERR_ATTRIBUTE, "'TextIOWrapper' object has no attribute '%s'", name);
}

static Value *stream_repr(Value *self) {
  return str_printf("<_io.TextIOWrapper name='<%s>'>", ((Stream *)self)->err ? "stderr" : "stdout");
}

static const OpaqueType stream_type = {.name = "TextIOWrapper", .repr = stream_repr, .getattr = stream_getattr};

static Value *stream_new(bool err) {
  Stream *s = shm_calloc(1, sizeof *s);
  if (!s) return err_nomem();
  val_init(&s->base.hdr, V_OPAQUE);
  s->base.ot = &stream_type;
  s->err = err;
  return &s->base.hdr;
}

/* setrecursionlimit(n): accepted; shmap's own depth limit stays. */
static Value *sys_setrecursionlimit(const CallArgs *a) {
  Value *n;
  int64_t v;
  if (args_bind("setrecursionlimit", a, "limit", (Value **[]){&n}) < 0 || arr_to_index(n, &v) < 0) return NULL;
  return v < 1 ? err_set(ERR_VALUE, "recursion limit must be greater or equal than 1") : VAL_NONE;
}

/* exit(status=None): raises SystemExit(status) (exceptions.h) */
static Value *sys_exit(const CallArgs *a) {
  Value *code = NULL;
  if (args_bind("exit", a, "status=", (Value **[]){&code}) < 0) return NULL;
  return exc_system_exit(code);
}

static int make_sys(Value *m) {
  Value *vi = tuple_new(3);
  if (!vi) return -1;
  tuple_set_steal(vi, 0, arr_python_int(3));
  tuple_set_steal(vi, 1, arr_python_int(12));
  tuple_set_steal(vi, 2, arr_python_int(0));
  if (set_steal(m, "version_info", vi) < 0 || set_steal(m, "platform", str_from("linux")) < 0 ||
      set_steal(m, "byteorder", str_from("little")) < 0 ||
      set_steal(m, "maxsize", arr_python_int(INT64_MAX)) < 0 ||
      set_steal(m, "stdout", stream_new(false)) < 0 || set_steal(m, "stderr", stream_new(true)) < 0 ||
      stdmod_add(m, "setrecursionlimit", sys_setrecursionlimit, "setrecursionlimit(limit): accepted") < 0 ||
      stdmod_add(m, "exit", sys_exit, "exit(status=None): raise SystemExit(status)") < 0)
    return -1;
  return dict_set_str(((Module *)m)->globals, "argv", shm_interp->argv);
}

/* ==== typing and __future__ ========================================================== */

/* A typing form (Any, Optional, a TypeVar): prints as Python's, and
 * subscripted is itself, since annotations are never checked. */
typedef struct Form {
  Opaque base;
  char name[48];
} Form;

static Value *form_repr(Value *self) {
  const char *n = ((Form *)self)->name;
  return strchr(n, '~') ? str_from(n) : str_printf("typing.%s", n);
}

static Value *form_getitem(Value *self, Value *index) {
  (void)index;
  return val_incref(self);
}

static Value *form_getattr(Value *self, const char *name) {
  return err_set(ERR_ATTRIBUTE, "'%s' has no attribute '%s'", ((Form *)self)->name, name);
}

static const OpaqueType form_type = {.name = "typing form", .repr = form_repr, .getattr = form_getattr};

static Value *form_new(const char *name) {
  Form *f = shm_calloc(1, sizeof *f);
  if (!f) return err_nomem();
  val_init(&f->base.hdr, V_OPAQUE);
  f->base.ot = &form_type;
  snprintf(f->name, sizeof f->name, "%s", name);
  return &f->base.hdr;
}

/* TypeVar(name, *constraints, bound=None, ...) and ParamSpec(name) */
static Value *ty_typevar(const CallArgs *a) {
  if (a->nargs < 1 || a->args[0]->type != V_STR) return err_set(ERR_TYPE, "TypeVar() needs a name string");
  char n[48];
  snprintf(n, sizeof n, "~%s", str_cstr(a->args[0]));
  return form_new(n);
}

/* cast(typ, val): val */
static Value *ty_cast(const CallArgs *a) {
  Value *t, *v;
  if (args_bind("cast", a, "typ, val", (Value **[]){&t, &v}) < 0) return NULL;
  return val_incref(v);
}

/* The decorators that change nothing at run time: overload, final,
 * no_type_check, runtime_checkable; and NewType(name, tp)'s result,
 * which returns its argument. */
static Value *ty_identity(const CallArgs *a) {
  if (a->nargs != 1 || a->nkw) return err_set(ERR_TYPE, "expected one argument");
  return val_incref(a->args[0]);
}

static Value *ty_newtype(const CallArgs *a) {
  Value *n, *t;
  if (args_bind("NewType", a, "name, tp", (Value **[]){&n, &t}) < 0) return NULL;
  return builtin_new("NewType", ty_identity, "NewType(name, tp)(x): x");
}

static const StdFn typing_fns[] = {
  {"TypeVar", ty_typevar, "TypeVar(name, *constraints, bound=None)"},
  {"ParamSpec", ty_typevar, "ParamSpec(name)"},
  {"TypeVarTuple", ty_typevar, "TypeVarTuple(name)"},
  {"cast", ty_cast, "cast(typ, val): val"},
  {"NewType", ty_newtype, "NewType(name, tp)"},
  {"overload", ty_identity, "overload(func): func"},
  {"final", ty_identity, "final(f): f"},
  {"no_type_check", ty_identity, "no_type_check(f): f"},
  {"runtime_checkable", ty_identity, "runtime_checkable(cls): cls"},
  {"override", ty_identity, "override(f): f"},
  {NULL, NULL, NULL},
};

static int make_typing(Value *m) {
  static const char forms[] =
    "Any Callable Optional Union Tuple List Dict Set FrozenSet Sequence Mapping MutableMapping "
    "MutableSequence MutableSet AbstractSet Iterable Iterator Generator Collection Container "
    "Hashable Sized Reversible Type Generic Protocol Literal Final ClassVar Annotated TypeAlias "
    "NoReturn Never Self LiteralString Concatenate TypeGuard Unpack Required NotRequired "
    "Awaitable Coroutine AsyncIterable AsyncIterator AsyncGenerator ContextManager "
    "AsyncContextManager SupportsInt SupportsFloat SupportsIndex SupportsAbs SupportsRound "
    "SupportsComplex SupportsBytes IO TextIO BinaryIO Pattern Match Deque DefaultDict "
    "OrderedDict Counter ChainMap ByteString AnyStr Text";
  char name[32];
  for (const char *p = forms; *p;) {
    size_t n = strcspn(p, " ");
    snprintf(name, sizeof name, "%.*s", (int)n, p);
    p += n + (p[n] == ' ');
    if (set_steal(m, name, form_new(name)) < 0) return -1;
  }
  return set_steal(m, "TYPE_CHECKING", val_bool(false)) < 0 ? -1 : stdmod_add_all(m, typing_fns);
}

static int make_future(Value *m) {
  static const char *const features[] = {"annotations", "division", "absolute_import", "print_function",
                                         "generators", "with_statement", "nested_scopes",
                                         "unicode_literals", "generator_stop", NULL};
  for (int i = 0; features[i]; i++)
    if (set_steal(m, features[i], str_from(features[i])) < 0) return -1;
  return 0;
}

/* ==== collections ================================================================ */

/* defaultdict, Counter, OrderedDict (stdmod_coll.c) and deque
 * (stdmod_deque.c), given the built-in dict that builds the dicts. */
static int make_collections(Value *m) {
  Value *d = env_lookup(shm_interp->builtins, intern_cstr("dict"));
  if (!d) return err_set(ERR_NAME, "the built-in dict is not made yet"), -1;
  return stdmod_collections(m, d);
}

/* ==== registration ================================================================ */

static Value *new_module(int i) {
  Value *g = dict_new();
  Value *m = g ? module_new(mod_names[i], g) : NULL;
  val_decref(g);
  return m;
}

/* Makes module [i] (os and os.path together) and publishes it once it is
 * whole (modules are static: a failure leaves garbage, not half a module). */
static int make_module(int i) {
  if (i == M_OS || i == M_OS_PATH) {
    Value *os = new_module(M_OS), *path = new_module(M_OS_PATH);
    if (!os || !path || make_os(os, path) < 0) return -1;
    mods[M_OS_PATH] = path;
    mods[M_OS] = os;
    return 0;
  }
  Value *m = new_module(i);
  if (!m) return -1;
  int rc = -1;
  switch (i) {
  case M_MATH: rc = make_math(m); break;
  case M_TIME: rc = stdmod_add_all(m, time_fns); break;
  case M_SYS: rc = make_sys(m); break;
  case M_TYPING: rc = make_typing(m); break;
  case M_FUTURE: rc = make_future(m); break;
  case M_COLLECTIONS: rc = make_collections(m); break;
  case M_FUNCTOOLS:
    rc = dict_set_str(((Module *)m)->globals, "partial", partial_fn) == 0 ? stdmod_functools(m) : -1;
    break;
  case M_ITERTOOLS: rc = stdmod_itertools(m); break;
  case M_OPERATOR: rc = stdmod_operator(m); break;
  }
  Value *extra = rc == 0 ? builtins_classes_namespace(mod_names[i]) : NULL;
  const Dict *d = extra ? (const Dict *)((Module *)extra)->globals : NULL;
  for (size_t k = 0; d && rc == 0 && k < d->len; k++)   /* typing.NamedTuple and the like */
    rc = dict_set(((Module *)m)->globals, d->keys[k], d->vals[k]);
  if (rc == 0) mods[i] = m;
  return rc;
}

int stdmod_register(Value *partial) {
  partial_fn = partial;
  if (!partial) return err_set(ERR_NAME, "functools.partial is not made yet"), -1;
  ops_register_getitem(&form_type, form_getitem);
  return 0;
}
