/*
 * stdmod_func.c - functools (beside partial, which builtins.c makes),
 * itertools and operator (stdmod.h).
 *
 * itertools' functions return lists, as map() and zip() do here: every
 * iterable is read whole first (ops_iter_items).  The infinite ones
 * (count, cycle, repeat without times) are lazy iterators (iter.h), and
 * so is islice of one; takewhile of one reads it only up to the first
 * item that fails, into a list.  The orders are
 * Python's documented ones (product: the rightmost element advancing
 * first; permutations and combinations: lexicographic in the positions).
 */
#include <pthread.h>
#include <string.h>

#include "base/intern.h"
#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/builtins_impl.h"
#include "lang/classes.h"
#include "lang/eval.h"
#include "lang/iter.h"
#include "lang/ops.h"
#include "lang/stdmod.h"

/* ==== functools ================================================================== */

/* reduce(function, iterable[, initial]) */
static Value *ft_reduce(const CallArgs *a) {
  Value *f, *it, *init = NULL;
  if (args_bind("reduce", a, "function, iterable, initial=", (Value **[]){&f, &it, &init}) < 0) return NULL;
  Value *items = ops_iter_items(it);
  if (!items) return NULL;
  size_t n = list_len(items), i = 0;
  if (!init && n == 0) {
    val_decref(items);
    return err_set(ERR_TYPE, "reduce() of empty iterable with no initial value");
  }
  Value *acc = val_incref(init ? init : list_get(items, i++));
  for (; acc && i < n; i++) {
    Value *next = val_call_n(f, 2, (Value *[]){acc, list_get(items, i)});
    val_decref(acc);
    acc = next;
  }
  val_decref(items);
  return acc;
}

/* The decorator wraps(wrapped) returns: the function it is given, as it
 * is (shmap's functions have no __name__ or __doc__ to copy). */
static Value *ft_identity(const CallArgs *a) {
  if (a->nargs != 1 || a->nkw) return err_set(ERR_TYPE, "the decorator takes one function");
  return val_incref(a->args[0]);
}

static Value *ft_wraps(const CallArgs *a) {
  if (a->nargs < 1) return err_set(ERR_TYPE, "wraps() missing required argument 'wrapped'");
  return builtin_new("wraps", ft_identity, "wraps(wrapped)(f): f");
}

/* update_wrapper(wrapper, wrapped): wrapper */
static Value *ft_update_wrapper(const CallArgs *a) {
  Value *w, *wd, *x = NULL, *y = NULL;
  if (args_bind("update_wrapper", a, "wrapper, wrapped, assigned=, updated=", (Value **[]){&w, &wd, &x, &y}) < 0)
    return NULL;
  return val_incref(w);
}

/* ---- lru_cache ----------------------------------------------------------------- */

/* A cached function: (func, cache dict, maxsize or None).  The dict's
 * insertion order is the recency order: a hit moves its entry to the end,
 * and past maxsize the first entry goes.  One lock guards every cache's
 * dict (device threads may call one function at once); the function
 * itself runs outside it, so it may call itself. */
enum { LC_FN, LC_CACHE, LC_MAX, LC_N };
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;

/* The key of a call: its positional arguments, then a marker and each
 * keyword's name and value (f(1) and f(x=1) are two entries, as in
 * Python). */
static Value *call_key(const CallArgs *a) {
  Value *k = tuple_new((size_t)(a->nargs + (a->nkw ? 1 + 2 * a->nkw : 0)));
  if (!k) return NULL;
  size_t j = 0;
  for (int i = 0; i < a->nargs; i++) tuple_set_steal(k, j++, val_incref(a->args[i]));
  if (a->nkw) tuple_set_steal(k, j++, str_from("\x01kw"));
  for (int i = 0; i < a->nkw; i++) {
    tuple_set_steal(k, j++, str_from(a->kwnames[i]));
    tuple_set_steal(k, j++, val_incref(a->kwvals[i]));
  }
  return k;
}

/* Looks [key] up; a hit (a new reference) becomes the most recent. */
static Value *cache_get(Value *cache, Value *key) {
  pthread_mutex_lock(&cache_lock);
  Value *v = dict_get(cache, key);
  if (v) {
    val_incref(v);
    if (dict_del(cache, key) < 0 || dict_set(cache, key, v) < 0) err_clear();
  }
  pthread_mutex_unlock(&cache_lock);
  return v;
}

static int cache_put(Value *cache, Value *key, Value *v, int64_t max) {
  pthread_mutex_lock(&cache_lock);
  int rc = dict_set(cache, key, v);
  while (rc == 0 && max >= 0 && (int64_t)((Dict *)cache)->len > max) rc = dict_del(cache, ((Dict *)cache)->keys[0]);
  pthread_mutex_unlock(&cache_lock);
  return rc;
}

static Value *cached_call(Value *self, const CallArgs *a) {
  Value *cache = tuple_get(self, LC_CACHE), *mx = tuple_get(self, LC_MAX);
  int64_t max = -1;
  if (!bi_is_none(mx) && arr_to_index(mx, &max) < 0) return NULL;
  if (max == 0) return val_call(tuple_get(self, LC_FN), a);
  Value *key = call_key(a);
  if (!key) return NULL;
  if (val_hash(key) == -1 && err_occurred()) {
    val_decref(key);
    return NULL;   /* an unhashable argument: TypeError, as in Python */
  }
  Value *r = cache_get(cache, key);
  if (!r && !err_occurred()) {
    r = val_call(tuple_get(self, LC_FN), a);
    if (r && cache_put(cache, key, r, max) < 0) {
      val_decref(r);
      r = NULL;
    }
  }
  val_decref(key);
  return r;
}

static Value *make_cached(Value *fn, Value *maxsize) {
  Value *d = dict_new();
  Value *cfg = d ? tuple_pack(LC_N, (Value *[]){fn, d, maxsize}) : NULL;
  Value *r = cfg ? bound_new("lru_cache", cached_call, cfg) : NULL;
  bi_drop(d, cfg, NULL, NULL);
  return r;
}

/* lru_cache(maxsize)(f): the decorator holds maxsize. */
static Value *cache_decorator(Value *self, const CallArgs *a) {
  if (a->nargs != 1 || a->nkw) return err_set(ERR_TYPE, "lru_cache's decorator takes one function");
  return make_cached(a->args[0], self);
}

/* lru_cache(maxsize=128, typed=False) or lru_cache(user_function) */
static Value *ft_lru_cache(const CallArgs *a) {
  Value *m = NULL, *typed = NULL;
  if (args_bind("lru_cache", a, "maxsize=, typed=", (Value **[]){&m, &typed}) < 0) return NULL;
  bool t;
  if (bi_bool_arg(typed, false, &t) < 0) return NULL;
  if (t) return err_set(ERR_NOT_IMPLEMENTED, "lru_cache(typed=True) is not supported");
  if (m && m->type != V_ARRAY && m != VAL_NONE) {   /* @lru_cache without parentheses */
    Value *dflt = arr_python_int(128), *r = dflt ? make_cached(m, dflt) : NULL;
    val_decref(dflt);
    return r;
  }
  int64_t n;
  if (m && m != VAL_NONE && arr_to_index(m, &n) < 0) return NULL;
  Value *mx = m ? val_incref(m) : arr_python_int(128);
  if (m && m != VAL_NONE && n < 0) {   /* Python treats a negative size as 0 */
    val_decref(mx);
    mx = arr_python_int(0);
  }
  Value *r = mx ? bound_new("lru_cache", cache_decorator, mx) : NULL;
  val_decref(mx);
  return r;
}

/* cache(user_function): lru_cache(maxsize=None) */
static Value *ft_cache(const CallArgs *a) {
  if (a->nargs != 1 || a->nkw) return err_set(ERR_TYPE, "cache() takes one function");
  return make_cached(a->args[0], VAL_NONE);
}

/* ==== itertools ================================================================== */

/* Every argument of [a] read whole: a new array of [a->nargs] lists. */
static Value **all_items(const CallArgs *a) {
  Value **ls = shm_calloc((size_t)a->nargs + 1, sizeof *ls);
  if (!ls) return err_nomem();
  for (int i = 0; i < a->nargs; i++)
    if (!(ls[i] = ops_iter_items(a->args[i]))) {
      for (int j = 0; j < i; j++) val_decref(ls[j]);
      shm_free(ls);
      return NULL;
    }
  return ls;
}

static void free_items(Value **ls, int n) {
  for (int i = 0; i < n; i++) val_decref(ls[i]);
  shm_free(ls);
}

/* The tuple of [pool]'s items at [idx] (r of them). */
static Value *pick(Value *pool, const int64_t *idx, int64_t r) {
  Value *t = tuple_new((size_t)r);
  for (int64_t i = 0; t && i < r; i++) tuple_set_steal(t, (size_t)i, val_incref(list_get(pool, (size_t)idx[i])));
  return t;
}

/* product(*iterables, repeat=1) */
static Value *it_product(const CallArgs *a) {
  int64_t rep = 1;
  for (int i = 0; i < a->nkw; i++) {
    if (strcmp(a->kwnames[i], "repeat")) return err_set(ERR_TYPE, "product() got an unexpected keyword argument '%s'", a->kwnames[i]);
    if (arr_to_index(a->kwvals[i], &rep) < 0) return NULL;
  }
  if (rep < 0) return err_set(ERR_VALUE, "repeat argument cannot be negative");
  CallArgs pos = {a->nargs, a->args, 0, NULL, NULL};
  Value **ls = all_items(&pos);
  if (!ls) return NULL;
  int64_t n = a->nargs * rep;
  Value *flat = list_new((size_t)n), *res = list_new(0);   /* the pools, repeated; their flattening */
  int64_t *idx = shm_calloc((size_t)n + 1, sizeof *idx);
  bool empty = false;
  for (int64_t i = 0; flat && i < n; i++) {
    empty |= list_len(ls[i % a->nargs]) == 0;
    if (list_append_steal(flat, val_incref(ls[i % a->nargs])) < 0) bi_drop(flat, NULL, NULL, NULL), flat = NULL;
  }
  while (flat && res && idx && !empty) {
    Value *t = tuple_new((size_t)n);
    for (int64_t i = 0; t && i < n; i++)
      tuple_set_steal(t, (size_t)i, val_incref(list_get(list_get(flat, (size_t)i), (size_t)idx[i])));
    if (!t || list_append_steal(res, t) < 0) {
      val_decref(res);
      res = NULL;
      break;
    }
    int64_t k = n - 1;   /* the odometer: the rightmost advances first */
    while (k >= 0 && ++idx[k] == (int64_t)list_len(list_get(flat, (size_t)k))) idx[k--] = 0;
    if (k < 0) break;
  }
  free_items(ls, a->nargs);
  val_decref(flat);
  shm_free(idx);
  if (!flat || !idx) {
    val_decref(res);
    return err_occurred() ? NULL : err_nomem();
  }
  return res;
}

/* Appends to [res] each r-tuple of positions of [n] in lexicographic
 * order: all distinct (permutations), increasing (combinations) or
 * non-decreasing (with replacement), by depth-first choice. */
enum { PERM, COMB, COMB_REP };
static int choose(Value *res, Value *pool, int kind, int64_t *idx, bool *used, int64_t depth, int64_t r) {
  if (depth == r) {
    Value *t = pick(pool, idx, r);
    return t ? list_append_steal(res, t) : -1;
  }
  int64_t n = (int64_t)list_len(pool);
  int64_t from = kind == PERM || depth == 0 ? 0 : idx[depth - 1] + (kind == COMB);
  for (int64_t i = from; i < n; i++) {
    if (kind == PERM && used[i]) continue;
    idx[depth] = i;
    used[i] = true;
    int rc = choose(res, pool, kind, idx, used, depth + 1, r);
    used[i] = false;
    if (rc < 0) return -1;
  }
  return 0;
}

static Value *combinatoric(const CallArgs *a, const char *f, int kind) {
  Value *it, *rv = NULL;
  if (args_bind(f, a, kind == PERM ? "iterable, r=" : "iterable, r", (Value **[]){&it, &rv}) < 0) return NULL;
  Value *pool = ops_iter_items(it);
  if (!pool) return NULL;
  int64_t n = (int64_t)list_len(pool), r = n;
  if (!bi_is_none(rv) && arr_to_index(rv, &r) < 0) {
    val_decref(pool);
    return NULL;
  }
  if (r < 0) {
    val_decref(pool);
    return err_set(ERR_VALUE, "r must be non-negative");
  }
  Value *res = list_new(0);
  int64_t *idx = shm_calloc((size_t)r + 1, sizeof *idx);
  bool *used = shm_calloc((size_t)n + 1, sizeof *used);
  bool none = kind != COMB_REP ? r > n : n == 0 && r > 0;
  if (!res || !idx || !used || (!none && choose(res, pool, kind, idx, used, 0, r) < 0)) {
    val_decref(res);
    res = err_occurred() ? NULL : err_nomem();
  }
  shm_free(idx);
  shm_free(used);
  val_decref(pool);
  return res;
}
static Value *it_permutations(const CallArgs *a) { return combinatoric(a, "permutations", PERM); }
static Value *it_combinations(const CallArgs *a) { return combinatoric(a, "combinations", COMB); }
static Value *it_combinations_wr(const CallArgs *a) {
  return combinatoric(a, "combinations_with_replacement", COMB_REP);
}

/* chain(*iterables) */
static Value *it_chain(const CallArgs *a) {
  if (a->nkw) return err_set(ERR_TYPE, "chain() takes no keyword arguments");
  Value *res = list_new(0);
  for (int i = 0; res && i < a->nargs; i++)
    if (ops_list_extend(res, a->args[i]) < 0) {
      val_decref(res);
      res = NULL;
    }
  return res;
}

/* accumulate(iterable, func=operator.add, *, initial=None) */
static Value *it_accumulate(const CallArgs *a) {
  Value *it, *f = NULL, *init = NULL;
  if (args_bind("accumulate", a, "iterable, func=, initial=", (Value **[]){&it, &f, &init}) < 0) return NULL;
  Value *items = ops_iter_items(it), *res = items ? list_new(0) : NULL;
  Value *acc = bi_is_none(init) ? NULL : val_incref(init);
  if (acc && res && list_append_steal(res, val_incref(acc)) < 0) res = NULL;
  for (size_t i = 0; res && i < list_len(items); i++) {
    Value *x = list_get(items, i), *next;
    if (!acc) next = val_incref(x);
    else next = bi_is_none(f) ? ops_binary(OP_ADD, acc, x) : val_call_n(f, 2, (Value *[]){acc, x});
    val_decref(acc);
    acc = next;
    if (!acc || list_append_steal(res, val_incref(acc)) < 0) {
      val_decref(res);
      res = NULL;
    }
  }
  bi_drop(items, acc, NULL, NULL);
  return res;
}

/* count(start=0, step=1): lazy, it never ends. */
static Value *it_count(const CallArgs *a) {
  Value *start = NULL, *step = NULL;
  if (args_bind("count", a, "start=, step=", (Value **[]){&start, &step}) < 0) return NULL;
  Value *zero = start ? NULL : val_int(0), *one = step ? NULL : val_int(1);
  Value *r = (start || zero) && (step || one) ? iter_count(start ? start : zero, step ? step : one) : NULL;
  bi_drop(zero, one, NULL, NULL);
  return r;
}

/* cycle(iterable): lazy, it never ends unless the iterable is empty. */
static Value *it_cycle(const CallArgs *a) {
  if (a->nargs != 1 || a->nkw) return err_set(ERR_TYPE, "cycle expected 1 argument, got %d", a->nargs + a->nkw);
  return iter_cycle(a->args[0]);
}

/* repeat(object[, times]): a list of times items; without times a lazy
 * iterator that never ends. */
static Value *it_repeat(const CallArgs *a) {
  Value *obj, *tv = NULL;
  if (args_bind("repeat", a, "object, times=", (Value **[]){&obj, &tv}) < 0) return NULL;
  if (!tv) return iter_repeat(obj);
  int64_t n;
  if (arr_to_index(tv, &n) < 0) return NULL;
  Value *res = list_new(n > 0 ? (size_t)n : 0);
  for (int64_t i = 0; res && i < n; i++)
    if (list_append_steal(res, val_incref(obj)) < 0) res = NULL;
  return res;
}

/* islice(iterable, stop) or islice(iterable, start, stop[, step]) */
static Value *it_islice(const CallArgs *a) {
  if (a->nkw || a->nargs < 2 || a->nargs > 4) return err_set(ERR_TYPE, "islice() takes 2 to 4 positional arguments");
  int64_t v[3] = {0, -1, 1};   /* start, stop (-1: to the end), step */
  Value *const *ps = a->nargs == 2 ? (Value *[]){NULL, a->args[1], NULL} : (Value *[]){a->args[1], a->args[2], a->nargs > 3 ? a->args[3] : NULL};
  static const char *const bad[3] = {
    "Indices for islice() must be None or an integer: 0 <= x <= sys.maxsize.",
    "Stop argument for islice() must be None or an integer: 0 <= x <= sys.maxsize.",
    "Step for islice() must be a positive integer or None."};
  for (int i = 0; i < 3; i++) {
    if (bi_is_none(ps[i])) continue;
    bool is_int = arr_is_host(ps[i]) && !dt_is_float(AS_ARRAY(ps[i])->dtype);
    if (!is_int || arr_to_index(ps[i], &v[i]) < 0 || v[i] < (i == 2 ? 1 : 0)) {
      err_clear();   /* Python says ValueError whatever was wrong with it */
      return err_set(ERR_VALUE, "%s", bad[i]);
    }
  }
  if (iter_is(a->args[0])) return iter_islice(a->args[0], v[0], v[1], v[2]);
  Value *items = ops_iter_items(a->args[0]);
  if (!items) return NULL;
  int64_t n = (int64_t)list_len(items), stop = v[1] < 0 || v[1] > n ? n : v[1];
  Value *res = list_new(0);
  for (int64_t i = v[0]; res && i < stop; i += v[2])
    if (list_append_steal(res, val_incref(list_get(items, (size_t)i))) < 0) res = NULL;
  val_decref(items);
  return res;
}

/* zip_longest(*iterables, fillvalue=None) */
static Value *it_zip_longest(const CallArgs *a) {
  Value *fill = VAL_NONE;
  for (int i = 0; i < a->nkw; i++) {
    if (strcmp(a->kwnames[i], "fillvalue")) return err_set(ERR_TYPE, "zip_longest() got an unexpected keyword argument '%s'", a->kwnames[i]);
    fill = a->kwvals[i];
  }
  CallArgs pos = {a->nargs, a->args, 0, NULL, NULL};
  Value **ls = all_items(&pos);
  if (!ls) return NULL;
  size_t len = 0;
  for (int i = 0; i < a->nargs; i++) len = list_len(ls[i]) > len ? list_len(ls[i]) : len;
  Value *res = list_new(len);
  for (size_t j = 0; res && j < len; j++) {
    Value *t = tuple_new((size_t)a->nargs);
    for (int i = 0; t && i < a->nargs; i++)
      tuple_set_steal(t, (size_t)i, val_incref(j < list_len(ls[i]) ? list_get(ls[i], j) : fill));
    if (!t || list_append_steal(res, t) < 0) {
      val_decref(res);
      res = NULL;
    }
  }
  free_items(ls, a->nargs);
  return res;
}

/* starmap(function, iterable): function(*item) for each item. */
static Value *it_starmap(const CallArgs *a) {
  Value *f, *it;
  if (args_bind("starmap", a, "function, iterable", (Value **[]){&f, &it}) < 0) return NULL;
  Value *items = ops_iter_items(it), *res = items ? list_new(0) : NULL;
  for (size_t i = 0; res && i < list_len(items); i++) {
    Value *args = ops_iter_items(list_get(items, i));
    Value *r = args ? val_call_n(f, (int)list_len(args), ((List *)args)->items) : NULL;
    val_decref(args);
    if (!r || list_append_steal(res, r) < 0) {
      val_decref(res);
      res = NULL;
    }
  }
  val_decref(items);
  return res;
}

/* pairwise(iterable) and batched(iterable, n): consecutive tuples,
 * overlapping by one or side by side. */
static Value *windows(Value *it, int64_t size, int64_t step) {
  Value *items = ops_iter_items(it), *res = items ? list_new(0) : NULL;
  int64_t n = items ? (int64_t)list_len(items) : 0;
  for (int64_t i = 0; res && i + (step == 1 ? size : 1) <= n; i += step) {
    int64_t k = i + size <= n ? size : n - i;
    Value *t = tuple_pack((size_t)k, ((List *)items)->items + i);
    if (!t || list_append_steal(res, t) < 0) {
      val_decref(res);
      res = NULL;
    }
  }
  val_decref(items);
  return res;
}

static Value *it_pairwise(const CallArgs *a) {
  Value *it;
  return args_bind("pairwise", a, "iterable", (Value **[]){&it}) < 0 ? NULL : windows(it, 2, 1);
}

static Value *it_batched(const CallArgs *a) {
  Value *it, *nv;
  int64_t n;
  if (args_bind("batched", a, "iterable, n", (Value **[]){&it, &nv}) < 0 || arr_to_index(nv, &n) < 0) return NULL;
  if (n < 1) return err_set(ERR_VALUE, "n must be at least one");
  return windows(it, n, n);
}

/* The truth of pred(x) (of x for pred None): 0/1, or -1. */
static int test(Value *pred, Value *x) {
  if (bi_is_none(pred)) return val_truth(x);
  Value *r = val_call_n(pred, 1, &x);
  int t = r ? val_truth(r) : -1;
  val_decref(r);
  return t;
}

/* takewhile(pred, it) of a lazy [it]: its items up to the first that
 * fails, pulled one at a time (polling Ctrl-C: it may never fail). */
static Value *takewhile_lazy(Value *pred, Value *it) {
  Value *res = list_new(0), *x;
  while (res && (x = iter_next(it))) {
    int t = test(pred, x);
    if (t == 1 && shm_interrupt_pending()) {
      err_set(ERR_INTERRUPT, "interrupted");
      t = -1;
    }
    if (t != 1) {
      val_decref(x);
      if (t < 0) bi_drop(res, NULL, NULL, NULL), res = NULL;
      return res;
    }
    if (list_append_steal(res, x) < 0) bi_drop(res, NULL, NULL, NULL), res = NULL;
  }
  if (res && err_occurred()) bi_drop(res, NULL, NULL, NULL), res = NULL;   /* iter_next failed */
  return res;
}

/* takewhile, dropwhile, filterfalse: [mode] 0, 1, 2. */
static Value *filtering(const CallArgs *a, const char *f, int mode) {
  Value *pred, *it;
  if (args_bind(f, a, "predicate, iterable", (Value **[]){&pred, &it}) < 0) return NULL;
  if (mode == 0 && iter_is(it)) return takewhile_lazy(pred, it);
  Value *items = ops_iter_items(it), *res = items ? list_new(0) : NULL;
  bool dropping = mode == 1;
  for (size_t i = 0; res && i < list_len(items); i++) {
    Value *x = list_get(items, i);
    int t = mode == 1 && !dropping ? 0 : test(pred, x);
    if (t < 0) {
      val_decref(res);
      res = NULL;
      break;
    }
    if (mode == 0 && !t) break;
    if (mode == 1 && dropping && t) continue;
    dropping = false;
    if (mode == 2 && t) continue;
    if (list_append_steal(res, val_incref(x)) < 0) res = NULL;
  }
  val_decref(items);
  return res;
}
static Value *it_takewhile(const CallArgs *a) { return filtering(a, "takewhile", 0); }
static Value *it_dropwhile(const CallArgs *a) { return filtering(a, "dropwhile", 1); }
static Value *it_filterfalse(const CallArgs *a) { return filtering(a, "filterfalse", 2); }

/* compress(data, selectors) */
static Value *it_compress(const CallArgs *a) {
  Value *d, *s;
  if (args_bind("compress", a, "data, selectors", (Value **[]){&d, &s}) < 0) return NULL;
  Value *dl = ops_iter_items(d), *sl = dl ? ops_iter_items(s) : NULL, *res = sl ? list_new(0) : NULL;
  for (size_t i = 0; res && i < list_len(dl) && i < list_len(sl); i++) {
    int t = val_truth(list_get(sl, i));
    if (t < 0 || (t && list_append_steal(res, val_incref(list_get(dl, i))) < 0)) {
      val_decref(res);
      res = NULL;
    }
  }
  bi_drop(dl, sl, NULL, NULL);
  return res;
}

/* groupby(iterable, key=None): a list of (key, list of the run's items)
 * for each run of equal keys. */
static Value *it_groupby(const CallArgs *a) {
  Value *it, *kf = NULL;
  if (args_bind("groupby", a, "iterable, key=", (Value **[]){&it, &kf}) < 0) return NULL;
  Value *items = ops_iter_items(it), *res = items ? list_new(0) : NULL, *cur = NULL, *run = NULL;
  for (size_t i = 0; res && i < list_len(items); i++) {
    Value *x = list_get(items, i);
    Value *k = bi_is_none(kf) ? val_incref(x) : val_call_n(kf, 1, &x);
    Value *eq = k && cur ? ops_compare(OP_EQ, k, cur) : NULL;
    int same = eq ? val_truth(eq) : 0;
    val_decref(eq);
    if (!k || same < 0) goto fail;
    if (!same) {
      Value *pair = (run = list_new(0)) ? tuple_pack(2, (Value *[]){k, run}) : NULL;
      val_decref(run);
      if (!pair || list_append_steal(res, pair) < 0) goto fail;
      val_decref(cur);
      cur = val_incref(k);
    }
    val_decref(k);
    if (list_append_steal(run, val_incref(x)) < 0) goto fail;
    continue;
  fail:
    val_decref(k);
    val_decref(res);
    res = NULL;
  }
  bi_drop(items, cur, NULL, NULL);
  return res;
}

/* ==== operator ==================================================================== */

static Value *binop(const CallArgs *a, const char *f, OpKind op) {
  if (a->nargs != 2 || a->nkw) return err_set(ERR_TYPE, "%s expected 2 arguments, got %d", f, a->nargs);
  return op >= OP_EQ ? ops_compare(op, a->args[0], a->args[1]) : ops_binary(op, a->args[0], a->args[1]);
}

static Value *unop(const CallArgs *a, const char *f, OpKind op) {
  if (a->nargs != 1 || a->nkw) return err_set(ERR_TYPE, "%s expected 1 argument, got %d", f, a->nargs);
  return ops_unary(op, a->args[0]);
}

#define BINOP(name, op) static Value *op_##name(const CallArgs *a) { return binop(a, #name, op); }
#define UNOP(name, op) static Value *op_##name(const CallArgs *a) { return unop(a, #name, op); }
BINOP(add, OP_ADD) BINOP(sub, OP_SUB) BINOP(mul, OP_MUL) BINOP(truediv, OP_DIV)
BINOP(floordiv, OP_FLOORDIV) BINOP(mod, OP_MOD) BINOP(pow, OP_POW) BINOP(matmul, OP_MATMUL)
BINOP(lshift, OP_LSHIFT) BINOP(rshift, OP_RSHIFT) BINOP(and_, OP_BITAND) BINOP(or_, OP_BITOR)
BINOP(xor, OP_BITXOR) BINOP(eq, OP_EQ) BINOP(ne, OP_NE) BINOP(lt, OP_LT) BINOP(le, OP_LE)
BINOP(gt, OP_GT) BINOP(ge, OP_GE) BINOP(is_, OP_IS) BINOP(is_not, OP_IS_NOT)
UNOP(neg, OP_NEG) UNOP(pos, OP_POS) UNOP(invert, OP_INVERT) UNOP(not_, OP_NOT)

/* contains(a, b): b in a */
static Value *op_contains(const CallArgs *a) {
  if (a->nargs != 2 || a->nkw) return err_set(ERR_TYPE, "contains expected 2 arguments, got %d", a->nargs);
  return ops_compare(OP_IN, a->args[1], a->args[0]);
}

static Value *op_truth(const CallArgs *a) {
  if (a->nargs != 1 || a->nkw) return err_set(ERR_TYPE, "truth expected 1 argument, got %d", a->nargs);
  int t = val_truth(a->args[0]);
  return t < 0 ? NULL : val_bool(t);
}

static Value *op_getitem(const CallArgs *a) {
  if (a->nargs != 2 || a->nkw) return err_set(ERR_TYPE, "getitem expected 2 arguments, got %d", a->nargs);
  return ops_getitem(a->args[0], a->args[1]);
}

/* itemgetter(*items)(obj) and attrgetter(*names)(obj): one value, or the
 * tuple of several; attrgetter follows dotted names. */
static Value *get_one(Value *obj, Value *what, bool attr) {
  if (!attr) return ops_getitem(obj, what);
  if (what->type != V_STR) return err_set(ERR_TYPE, "attribute name must be a string");
  char buf[256];
  snprintf(buf, sizeof buf, "%s", str_cstr(what));
  Value *cur = val_incref(obj);
  for (char *save = NULL, *part = strtok_r(buf, ".", &save); cur && part; part = strtok_r(NULL, ".", &save)) {
    Value *next = ops_getattr(cur, intern_cstr(part));
    val_decref(cur);
    cur = next;
  }
  return cur;
}

static Value *getter_call(Value *self, const CallArgs *a, bool attr) {
  if (a->nargs != 1 || a->nkw) return err_set(ERR_TYPE, "%sgetter expected 1 argument, got %d", attr ? "attr" : "item", a->nargs);
  size_t n = tuple_len(self);
  if (n == 1) return get_one(a->args[0], tuple_get(self, 0), attr);
  Value *t = tuple_new(n);
  for (size_t i = 0; t && i < n; i++) {
    Value *v = get_one(a->args[0], tuple_get(self, i), attr);
    if (!v) {
      val_decref(t);
      return NULL;
    }
    tuple_set_steal(t, i, v);
  }
  return t;
}
static Value *itemgetter_call(Value *self, const CallArgs *a) { return getter_call(self, a, false); }
static Value *attrgetter_call(Value *self, const CallArgs *a) { return getter_call(self, a, true); }

static Value *make_getter(const CallArgs *a, const char *f, MethodFn call) {
  if (a->nargs < 1 || a->nkw) return err_set(ERR_TYPE, "%s expected 1 argument, got 0", f);
  Value *t = tuple_pack((size_t)a->nargs, a->args);
  Value *r = t ? bound_new(f, call, t) : NULL;
  val_decref(t);
  return r;
}
static Value *op_itemgetter(const CallArgs *a) { return make_getter(a, "itemgetter", itemgetter_call); }
static Value *op_attrgetter(const CallArgs *a) { return make_getter(a, "attrgetter", attrgetter_call); }

/* index(a): a as an int */
static Value *op_index(const CallArgs *a) {
  int64_t v;
  if (a->nargs != 1 || a->nkw) return err_set(ERR_TYPE, "index expected 1 argument, got %d", a->nargs);
  return arr_to_index(a->args[0], &v) < 0 ? NULL : arr_python_int(v);
}

/* ==== registration ================================================================ */

static const StdFn ft_fns[] = {
  {"reduce", ft_reduce, "reduce(function, iterable[, initial])"},
  {"wraps", ft_wraps, "wraps(wrapped): a decorator that returns its function unchanged"},
  {"update_wrapper", ft_update_wrapper, "update_wrapper(wrapper, wrapped): wrapper"},
  {"lru_cache", ft_lru_cache, "lru_cache(maxsize=128) or lru_cache(user_function)"},
  {"cache", ft_cache, "cache(user_function): lru_cache(maxsize=None)"},
  {"cached_property", cls_cached_property, "cached_property(func): computed once per instance"},
  {NULL, NULL, NULL},
};

static const StdFn it_fns[] = {
  {"product", it_product, "product(*iterables, repeat=1): a list of tuples"},
  {"permutations", it_permutations, "permutations(iterable, r=None): a list of tuples"},
  {"combinations", it_combinations, "combinations(iterable, r): a list of tuples"},
  {"combinations_with_replacement", it_combinations_wr, "combinations_with_replacement(iterable, r)"},
  {"chain", it_chain, "chain(*iterables): a list"},
  {"accumulate", it_accumulate, "accumulate(iterable, func=None, *, initial=None): a list"},
  {"count", it_count, "count(start=0, step=1): start, start+step, ... (lazy, endless)"},
  {"cycle", it_cycle, "cycle(iterable): its items again and again (lazy, endless)"},
  {"repeat", it_repeat, "repeat(object[, times]): a list; without times lazy and endless"},
  {"islice", it_islice, "islice(iterable, [start,] stop[, step]): a list; lazy of a lazy iterator"},
  {"zip_longest", it_zip_longest, "zip_longest(*iterables, fillvalue=None): a list of tuples"},
  {"starmap", it_starmap, "starmap(function, iterable): a list"},
  {"pairwise", it_pairwise, "pairwise(iterable): a list of tuples"},
  {"batched", it_batched, "batched(iterable, n): a list of tuples"},
  {"takewhile", it_takewhile, "takewhile(predicate, iterable): a list"},
  {"dropwhile", it_dropwhile, "dropwhile(predicate, iterable): a list"},
  {"filterfalse", it_filterfalse, "filterfalse(predicate, iterable): a list"},
  {"compress", it_compress, "compress(data, selectors): a list"},
  {"groupby", it_groupby, "groupby(iterable, key=None): a list of (key, list)"},
  {NULL, NULL, NULL},
};

static const StdFn op_fns[] = {
  {"add", op_add, "add(a, b): a + b"}, {"sub", op_sub, "sub(a, b): a - b"},
  {"mul", op_mul, "mul(a, b): a * b"}, {"truediv", op_truediv, "truediv(a, b): a / b"},
  {"floordiv", op_floordiv, "floordiv(a, b): a // b"}, {"mod", op_mod, "mod(a, b): a % b"},
  {"pow", op_pow, "pow(a, b): a ** b"}, {"matmul", op_matmul, "matmul(a, b): a @ b"},
  {"lshift", op_lshift, "lshift(a, b): a << b"}, {"rshift", op_rshift, "rshift(a, b): a >> b"},
  {"and_", op_and_, "and_(a, b): a & b"}, {"or_", op_or_, "or_(a, b): a | b"},
  {"xor", op_xor, "xor(a, b): a ^ b"}, {"eq", op_eq, "eq(a, b): a == b"},
  {"ne", op_ne, "ne(a, b): a != b"}, {"lt", op_lt, "lt(a, b): a < b"},
  {"le", op_le, "le(a, b): a <= b"}, {"gt", op_gt, "gt(a, b): a > b"},
  {"ge", op_ge, "ge(a, b): a >= b"}, {"is_", op_is_, "is_(a, b): a is b"},
  {"is_not", op_is_not, "is_not(a, b): a is not b"}, {"neg", op_neg, "neg(a): -a"},
  {"pos", op_pos, "pos(a): +a"}, {"invert", op_invert, "invert(a): ~a"},
  {"inv", op_invert, "inv(a): ~a"}, {"not_", op_not_, "not_(a): not a"},
  {"truth", op_truth, "truth(a): bool(a)"}, {"contains", op_contains, "contains(a, b): b in a"},
  {"concat", op_add, "concat(a, b): a + b for sequences"}, {"getitem", op_getitem, "getitem(a, b): a[b]"},
  {"itemgetter", op_itemgetter, "itemgetter(*items)"}, {"attrgetter", op_attrgetter, "attrgetter(*attrs)"},
  {"index", op_index, "index(a): a as an int"},
  {NULL, NULL, NULL},
};

int stdmod_functools(Value *m) { return stdmod_add_all(m, ft_fns); }
int stdmod_itertools(Value *m) { return stdmod_add_all(m, it_fns); }
int stdmod_operator(Value *m) { return stdmod_add_all(m, op_fns); }
