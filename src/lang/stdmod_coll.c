/*
 * stdmod_coll.c - collections.defaultdict, collections.Counter and
 * collections.OrderedDict (stdmod.h), with Python's semantics (the
 * collections module's documentation); deque is stdmod_deque.c.
 *
 * All three are dicts (V_DICT, so isinstance(x, dict), iteration, len,
 * `in`, item assignment and the dict methods are a dict's) of a kind
 * (Dict.kind): a defaultdict's missing key calls its default_factory and
 * stores the result; a Counter's missing key reads as 0 without being
 * stored.  Counts are Python numbers added with `+`.  Every dict keeps
 * its order; an OrderedDict adds moving a key to either end, popping
 * from either end, and == that minds the order against another one.
 */
#include <string.h>

#include "array/array.h"
#include "array/print.h"
#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/builtins_impl.h"
#include "lang/eval.h"
#include "lang/ops.h"
#include "lang/stdmod.h"

static Value *dict_class;   /* the built-in dict, which builds a defaultdict's items */
static Value *ordered_class;   /* collections.OrderedDict */

/* ==== the missing key ============================================================= */

Value *stdmod_dict_missing(Value *d, Value *key) {
  Dict *dd = (Dict *)d;
  if (dd->kind == DICT_COUNTER) return arr_python_int(0);
  if (dd->kind != DICT_DEFAULT || !dd->missing) {
    Value *rs = val_repr(key);
    if (rs) err_set(ERR_INDEX, "KeyError: %s", str_cstr(rs));
    val_decref(rs);
    return NULL;
  }
  if (val_check_container(d) < 0) return NULL;
  Value *v = val_call_n(dd->missing, 0, NULL);
  if (v && dict_set(d, key, v) < 0) {
    val_decref(v);
    return NULL;
  }
  return v;
}

/* ==== defaultdict ================================================================= */

/* defaultdict(default_factory=None, /, *args, **kwargs): the rest as dict()
 * takes them. */
static Value *coll_defaultdict(const CallArgs *a) {
  Value *f = a->nargs ? a->args[0] : VAL_NONE;
  if (f != VAL_NONE && (f->type == V_ARRAY || f->type == V_STR || f->type == V_LIST ||
                        f->type == V_TUPLE || f->type == V_DICT))
    return err_set(ERR_TYPE, "first argument must be callable or None");
  CallArgs rest = {a->nargs ? a->nargs - 1 : 0, a->args + (a->nargs ? 1 : 0), a->nkw, a->kwnames,
                   a->kwvals};
  Value *d = val_call(dict_class, &rest);
  if (!d) return NULL;
  ((Dict *)d)->kind = DICT_DEFAULT;
  ((Dict *)d)->missing = f == VAL_NONE ? NULL : val_incref(f);
  return d;
}

/* ==== Counter ===================================================================== */

/* d[key] += by (from 0 when missing); [sign] -1 subtracts. */
static int count_add(Value *d, Value *key, Value *by, int sign) {
  Value *old = dict_get(d, key);
  if (!old && err_occurred()) return -1;
  Value *zero = old ? NULL : arr_python_int(0);
  Value *n = old || zero ? ops_binary(sign > 0 ? OP_ADD : OP_SUB, old ? old : zero, by) : NULL;
  int rc = n ? dict_set(d, key, n) : -1;
  bi_drop(zero, n, NULL, NULL);
  return rc;
}

/* Counts [src] into [d]: a mapping's values, or one for each element of
 * an iterable; [sign] -1 subtracts (Counter.update, subtract). */
static int count_from(Value *d, Value *src, int sign) {
  if (bi_is_none(src)) return 0;
  if (val_check_container(d) < 0) return -1;
  if (src->type == V_DICT) {
    Dict *s = (Dict *)src;
    for (size_t i = 0; i < s->len; i++)
      if (count_add(d, s->keys[i], s->vals[i], sign) < 0) return -1;
    return 0;
  }
  Value *items = ops_iter_items(src), *one = items ? arr_python_int(1) : NULL;
  int rc = one ? 0 : -1;
  for (size_t i = 0; rc == 0 && i < list_len(items); i++) rc = count_add(d, list_get(items, i), one, sign);
  bi_drop(items, one, NULL, NULL);
  return rc;
}

/* The keyword arguments of update/subtract/Counter() as counts. */
static int count_kwargs(Value *d, const CallArgs *a, int sign) {
  for (int i = 0; i < a->nkw; i++) {
    Value *k = str_from(a->kwnames[i]);
    int rc = k ? count_add(d, k, a->kwvals[i], sign) : -1;
    val_decref(k);
    if (rc < 0) return -1;
  }
  return 0;
}

static Value *counter_new(void) {
  Value *d = dict_new();
  if (d) ((Dict *)d)->kind = DICT_COUNTER;
  return d;
}

/* Counter(iterable_or_mapping=None, /, **kwargs) */
static Value *coll_counter(const CallArgs *a) {
  if (a->nargs > 1) return err_set(ERR_TYPE, "Counter expected at most 1 argument, got %d", a->nargs);
  Value *d = counter_new();
  if (d && (count_from(d, a->nargs ? a->args[0] : NULL, 1) < 0 || count_kwargs(d, a, 1) < 0)) {
    val_decref(d);
    return NULL;
  }
  return d;
}

static Value *c_update(Value *self, const CallArgs *a, int sign, const char *f) {
  if (a->nargs > 1) return err_set(ERR_TYPE, "%s expected at most 1 argument, got %d", f, a->nargs);
  if (count_from(self, a->nargs ? a->args[0] : NULL, sign) < 0 || count_kwargs(self, a, sign) < 0) return NULL;
  return VAL_NONE;
}
static Value *c_update_add(Value *self, const CallArgs *a) { return c_update(self, a, 1, "update"); }
static Value *c_subtract(Value *self, const CallArgs *a) { return c_update(self, a, -1, "subtract"); }

/* The count of a (key, count) pair: most_common's sort key. */
static Value *pair_count(const CallArgs *a) {
  return val_incref(tuple_get(a->args[0], 1));
}

/* most_common(n=None): (element, count) pairs, the largest counts first,
 * equal counts in the order first met (a stable sort). */
static Value *c_most_common(Value *self, const CallArgs *a) {
  Value *nv = NULL;
  if (args_bind("most_common", a, "n=", (Value **[]){&nv}) < 0) return NULL;
  Dict *d = (Dict *)self;
  int64_t n = (int64_t)d->len;
  if (!bi_is_none(nv) && arr_to_index(nv, &n) < 0) return NULL;
  Value *l = list_new(d->len), *key = l ? builtin_new("count", pair_count, "a pair's count") : NULL;
  for (size_t i = 0; key && i < d->len; i++) {
    Value *t = tuple_pack(2, (Value *[]){d->keys[i], d->vals[i]});
    if (!t || list_append_steal(l, t) < 0) bi_drop(key, NULL, NULL, NULL), key = NULL;
  }
  int rc = key ? ops_list_sort(l, key, true) : -1;
  val_decref(key);
  if (rc < 0) {
    val_decref(l);
    return NULL;
  }
  if (n < 0) n = 0;
  if ((size_t)n < list_len(l) && list_splice(l, (size_t)n, list_len(l) - (size_t)n, 0, NULL) < 0) {
    val_decref(l);
    return NULL;
  }
  return l;
}

/* elements(): each element as many times as its count (those above 0), as
 * a list. */
static Value *c_elements(Value *self, const CallArgs *a) {
  if (args_bind("elements", a, "", (Value **[]){NULL}) < 0) return NULL;
  Dict *d = (Dict *)self;
  Value *l = list_new(0);
  for (size_t i = 0; l && i < d->len; i++) {
    int64_t k;
    if (arr_to_index(d->vals[i], &k) < 0) {
      val_decref(l);
      return NULL;
    }
    for (int64_t j = 0; j < k; j++)
      if (list_append(l, d->keys[i]) < 0) {
        val_decref(l);
        return err_nomem();
      }
  }
  return l;
}

/* total(): the sum of the counts. */
static Value *c_total(Value *self, const CallArgs *a) {
  if (args_bind("total", a, "", (Value **[]){NULL}) < 0) return NULL;
  Dict *d = (Dict *)self;
  Value *s = arr_python_int(0);
  for (size_t i = 0; s && i < d->len; i++) {
    Value *n = ops_binary(OP_ADD, s, d->vals[i]);
    val_decref(s);
    s = n;
  }
  return s;
}

/* Whether count [v] is above 0: -1 on error. */
static int positive(Value *v) {
  Value *zero = arr_python_int(0), *c = zero ? ops_compare(OP_GT, v, zero) : NULL;
  int t = c ? val_truth(c) : -1;
  bi_drop(zero, c, NULL, NULL);
  return t;
}

/* Keeps in [r] the pairs of [from] whose count is positive. */
static int keep_positive(Value *r, Value *from) {
  Dict *f = (Dict *)from;
  for (size_t i = 0; i < f->len; i++) {
    int t = positive(f->vals[i]);
    if (t < 0 || (t && dict_set(r, f->keys[i], f->vals[i]) < 0)) return -1;
  }
  return 0;
}

Value *stdmod_counter_binary(OpKind op, Value *a, Value *b) {
  if (op != OP_ADD && op != OP_SUB) return err_set(ERR_TYPE, "unsupported operand type(s) for this operator: 'Counter' and 'Counter'");
  Value *sum = counter_new(), *r = sum ? counter_new() : NULL;
  int rc = r ? count_from(sum, a, 1) : -1;
  if (rc == 0) rc = count_from(sum, b, op == OP_ADD ? 1 : -1);
  if (rc == 0) rc = keep_positive(r, sum);
  val_decref(sum);
  if (rc < 0) {
    val_decref(r);
    return NULL;
  }
  return r;
}

/* ==== OrderedDict ================================================================= */

/* OrderedDict(*args, **kwargs): as dict() takes them. */
static Value *coll_ordered(const CallArgs *a) {
  Value *d = val_call(dict_class, a);
  if (d) ((Dict *)d)->kind = DICT_ORDERED;
  return d;
}

/* Moves every key of [d] but [key] (which it holds) behind it: [key]
 * becomes the first.  The others are taken out and put back in order. */
static int move_others_behind(Value *d, Value *key) {
  Dict *dd = (Dict *)d;
  Value *rest = list_new(2 * dd->len);
  for (size_t i = 0; rest && i < dd->len; i++)
    if (dd->keys[i] != key && !val_equal_key(dd->keys[i], key) &&
        (list_append(rest, dd->keys[i]) < 0 || list_append(rest, dd->vals[i]) < 0))
      bi_drop(rest, NULL, NULL, NULL), rest = NULL;
  if (!rest) return -1;
  int rc = 0;
  for (size_t i = 0; i < list_len(rest); i += 2) dict_del(d, list_get(rest, i));
  for (size_t i = 0; rc == 0 && i < list_len(rest); i += 2) rc = dict_set(d, list_get(rest, i), list_get(rest, i + 1));
  val_decref(rest);
  return rc;
}

/* move_to_end(key, last=True) */
static Value *od_move_to_end(Value *self, const CallArgs *a) {
  Value *key, *lv = NULL;
  if (args_bind("move_to_end", a, "key, last=", (Value **[]){&key, &lv}) < 0 || val_check_container(self) < 0)
    return NULL;
  int last = lv ? val_truth(lv) : 1;
  Value *v = last < 0 ? NULL : dict_get(self, key);
  if (!v) return err_occurred() ? NULL : stdmod_dict_missing(self, key);
  v = val_incref(v);
  int rc;
  if (last) {
    dict_del(self, key);   /* set again, it comes last */
    rc = dict_set(self, key, v);
  } else {
    rc = move_others_behind(self, key);
  }
  val_decref(v);
  return rc < 0 ? NULL : VAL_NONE;
}

/* popitem(last=True): the last pair, or the first. */
static Value *od_popitem(Value *self, const CallArgs *a) {
  Value *lv = NULL;
  if (args_bind("popitem", a, "last=", (Value **[]){&lv}) < 0 || val_check_container(self) < 0) return NULL;
  int last = lv ? val_truth(lv) : 1;
  Dict *d = (Dict *)self;
  if (last < 0) return NULL;
  if (!d->len) return err_set(ERR_INDEX, "KeyError: 'dictionary is empty'");
  size_t at = last ? d->len - 1 : 0;
  Value *k = val_incref(d->keys[at]), *t = tuple_pack(2, (Value *[]){k, d->vals[at]});
  if (t) dict_del(self, k);
  val_decref(k);
  return t;
}

/* copy(): an OrderedDict, as Python's. */
static Value *od_copy(Value *self, const CallArgs *a) {
  if (args_bind("copy", a, "", (Value **[]){NULL}) < 0) return NULL;
  CallArgs one = {1, &self, 0, NULL, NULL};
  return coll_ordered(&one);
}

Value *stdmod_class_of(const Value *v) {
  if (v->type == V_DICT && ((const Dict *)v)->kind == DICT_ORDERED) return ordered_class;
  return stdmod_is_deque(v) ? stdmod_deque_class() : NULL;
}

/* ==== attributes ================================================================== */

static const struct {
  const char *name;
  MethodFn fn;
} counter_methods[] = {
  {"most_common", c_most_common}, {"update", c_update_add}, {"subtract", c_subtract},
  {"elements", c_elements}, {"total", c_total},
};

static const struct {
  const char *name;
  MethodFn fn;
} ordered_methods[] = {{"move_to_end", od_move_to_end}, {"popitem", od_popitem}, {"copy", od_copy}};

Value *stdmod_dict_attr(Value *d, const char *name) {
  Dict *dd = (Dict *)d;
  if (dd->kind == DICT_ORDERED)
    for (size_t i = 0; i < sizeof ordered_methods / sizeof *ordered_methods; i++)
      if (!strcmp(name, ordered_methods[i].name)) return bound_new(name, ordered_methods[i].fn, d);
  if (dd->kind == DICT_DEFAULT && !strcmp(name, "default_factory"))
    return val_incref(dd->missing ? dd->missing : VAL_NONE);
  if (dd->kind == DICT_COUNTER)
    for (size_t i = 0; i < sizeof counter_methods / sizeof *counter_methods; i++)
      if (!strcmp(name, counter_methods[i].name)) return bound_new(name, counter_methods[i].fn, d);
  return NULL;
}

static const StdFn coll_fns[] = {
  {"defaultdict", coll_defaultdict, "defaultdict(default_factory=None, ...): a dict whose missing keys are made"},
  {"Counter", coll_counter, "Counter(iterable_or_mapping=None, **kwargs): counts of elements"},
  {NULL, NULL, NULL},
};

int stdmod_collections(Value *m, Value *dict) {
  dict_class = dict;
  Value *od = builtin_new("collections.OrderedDict", coll_ordered,
                          "OrderedDict(pairs or **kwargs): a dict with move_to_end and popitem(last=)");
  if (!od) return -1;
  ((Builtin *)od)->is_class = true;   /* prints <class 'collections.OrderedDict'>; type() of one */
  ordered_class = od;
  if (dict_set_str(((Module *)m)->globals, "OrderedDict", od) < 0 || stdmod_deque_register(m) < 0) return -1;
  return stdmod_add_all(m, coll_fns);
}
