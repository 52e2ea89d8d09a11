/*
 * stdmod_deque.c - collections.deque (stdmod.h), with Python's semantics
 * and messages (the collections module's documentation).
 *
 * A deque is a list of a kind (List.kind == LIST_DEQUE), as a Counter is
 * a dict of one: len, iteration, `in`, truth, x[i] and x[i] = v are a
 * list's, so every place that walks a list walks a deque.  What differs
 * is here: its methods, its bound (maxlen: items pushed past it drop off
 * the other end), its + and *, and its class.  Items sit in a plain
 * array from index 0, so the left end costs a move of the others; the
 * deques of array programs (a window of recent values) are short.
 */
#include <string.h>

#include "array/array.h"
#include "array/print.h"
#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/builtins_impl.h"
#include "lang/eval.h"
#include "lang/ops.h"
#include "lang/ops_impl.h"
#include "lang/stdmod.h"

static Value *deque_class;   /* collections.deque, the constructor and type() of a deque */

bool stdmod_is_deque(const Value *v) {
  return v->type == V_LIST && ((const List *)v)->kind == LIST_DEQUE;
}

/* ==== the bound =================================================================== */

/* Drops items from the left ([left]) or the right until [d] fits its
 * maxlen: what a push at the other end does to a full deque. */
static void trim(Value *d, bool left) {
  List *l = (List *)d;
  if (l->maxlen < 0) return;
  while ((int64_t)l->len > l->maxlen) {
    size_t at = left ? 0 : l->len - 1;
    Value *x = l->items[at];
    memmove(&l->items[at], &l->items[at + 1], sizeof(Value *) * (l->len - at - 1));
    l->len--;
    val_decref(x);
  }
}

/* Pushes [x] (borrowed) at the right or, [left], the left end. */
static int push(Value *d, Value *x, bool left) {
  if (list_splice(d, left ? 0 : list_len(d), 0, 1, &x) < 0) return -1;
  trim(d, !left);
  return 0;
}

/* An empty deque of [maxlen] (-1: unbounded). */
static Value *deque_new(int64_t maxlen) {
  Value *d = list_new(0);
  if (!d) return NULL;
  ((List *)d)->kind = LIST_DEQUE;
  ((List *)d)->maxlen = maxlen;
  return d;
}

/* Pushes each item of [it] at one end, in order (extendleft reverses). */
static int push_all(Value *d, Value *it, bool left) {
  if (val_check_container(d) < 0) return -1;
  Value *items = ops_iter_items(it);   /* a copy first: d.extend(d) reads the old items */
  if (!items) return -1;
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < list_len(items); i++) rc = push(d, list_get(items, i), left);
  val_decref(items);
  return rc;
}

int stdmod_deque_extend(Value *d, Value *it) { return push_all(d, it, false); }

/* deque(iterable=(), maxlen=None) */
static Value *coll_deque(const CallArgs *a) {
  Value *it = NULL, *mv = NULL;
  if (args_bind("deque", a, "iterable=, maxlen=", (Value **[]){&it, &mv}) < 0) return NULL;
  int64_t maxlen = -1;
  if (!bi_is_none(mv)) {
    if (!arr_is_host(mv) || dt_is_float(AS_ARRAY(mv)->dtype) || AS_ARRAY(mv)->ndim != 0)
      return err_set(ERR_TYPE, "an integer is required");
    if (arr_to_index(mv, &maxlen) < 0) return NULL;
    if (maxlen < 0) return err_set(ERR_VALUE, "maxlen must be non-negative");
  }
  Value *d = deque_new(maxlen);
  if (d && it && push_all(d, it, false) < 0) {
    val_decref(d);
    return NULL;
  }
  return d;
}

/* ==== methods ===================================================================== */

static Value *dq_append(Value *self, const CallArgs *a) {
  Value *x;
  if (args_bind("append", a, "x", (Value **[]){&x}) < 0 || val_check_container(self) < 0) return NULL;
  return push(self, x, false) < 0 ? NULL : VAL_NONE;
}

static Value *dq_appendleft(Value *self, const CallArgs *a) {
  Value *x;
  if (args_bind("appendleft", a, "x", (Value **[]){&x}) < 0 || val_check_container(self) < 0) return NULL;
  return push(self, x, true) < 0 ? NULL : VAL_NONE;
}

static Value *dq_extend(Value *self, const CallArgs *a) {
  Value *it;
  if (args_bind("extend", a, "iterable", (Value **[]){&it}) < 0) return NULL;
  return push_all(self, it, false) < 0 ? NULL : VAL_NONE;
}

static Value *dq_extendleft(Value *self, const CallArgs *a) {
  Value *it;
  if (args_bind("extendleft", a, "iterable", (Value **[]){&it}) < 0) return NULL;
  return push_all(self, it, true) < 0 ? NULL : VAL_NONE;
}

/* Takes the item at [at] out of the deque: the caller's reference. */
static Value *take(Value *self, size_t at) {
  List *l = (List *)self;
  Value *x = l->items[at];
  memmove(&l->items[at], &l->items[at + 1], sizeof(Value *) * (l->len - at - 1));
  l->len--;
  return x;
}

/* pop() and popleft(): no arguments, as Python's. */
static Value *pop_end(Value *self, const CallArgs *a, const char *f, bool left) {
  if (a->nargs || a->nkw)
    return err_set(ERR_TYPE, "deque.%s() takes no arguments (%d given)", f, a->nargs + a->nkw);
  if (val_check_container(self) < 0) return NULL;
  if (!list_len(self)) return err_set(ERR_INDEX, "pop from an empty deque");
  return take(self, left ? 0 : list_len(self) - 1);
}
static Value *dq_pop(Value *self, const CallArgs *a) { return pop_end(self, a, "pop", false); }
static Value *dq_popleft(Value *self, const CallArgs *a) { return pop_end(self, a, "popleft", true); }

/* rotate(n=1): n steps to the right (negative: to the left). */
static Value *dq_rotate(Value *self, const CallArgs *a) {
  Value *nv = NULL;
  if (args_bind("rotate", a, "n=", (Value **[]){&nv}) < 0 || val_check_container(self) < 0) return NULL;
  int64_t n = 1, len = (int64_t)list_len(self);
  if (nv && (!arr_is_host(nv) || dt_is_float(AS_ARRAY(nv)->dtype)))
    return err_set(ERR_TYPE, "'%s' object cannot be interpreted as an integer",
                   arr_is_host(nv) ? "float" : val_type_name(nv));
  if (nv && arr_to_index(nv, &n) < 0) return NULL;
  if (len < 2) return VAL_NONE;
  n = ((n % len) + len) % len;
  if (n == 0) return VAL_NONE;
  List *l = (List *)self;
  Value **tmp = shm_malloc(sizeof(Value *) * (size_t)n);
  if (!tmp) return err_nomem();
  memcpy(tmp, &l->items[len - n], sizeof(Value *) * (size_t)n);
  memmove(&l->items[n], &l->items[0], sizeof(Value *) * (size_t)(len - n));
  memcpy(&l->items[0], tmp, sizeof(Value *) * (size_t)n);
  shm_free(tmp);
  return VAL_NONE;
}

static Value *dq_clear(Value *self, const CallArgs *a) {
  if (args_bind("clear", a, "", (Value **[]){NULL}) < 0 || val_check_container(self) < 0) return NULL;
  return list_splice(self, 0, list_len(self), 0, NULL) < 0 ? NULL : VAL_NONE;
}

static Value *dq_copy(Value *self, const CallArgs *a) {
  if (args_bind("copy", a, "", (Value **[]){NULL}) < 0) return NULL;
  Value *d = deque_new(((List *)self)->maxlen);
  if (d && list_splice(d, 0, 0, list_len(self), ((List *)self)->items) < 0) {
    val_decref(d);
    return NULL;
  }
  return d;
}

/* The position of the first item equal to [x] in [lo, hi), or -1. */
static int64_t find(Value *self, Value *x, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi && i < (int64_t)list_len(self); i++) {
    Value *y = list_get(self, (size_t)i);
    if (y == x || val_equal_key(y, x)) return i;
  }
  return -1;
}

/* "x is not in deque", x as repr shows it. */
static Value *not_in(Value *x) {
  Value *r = val_repr(x);
  if (r) err_set(ERR_VALUE, "%s is not in deque", str_cstr(r));
  val_decref(r);
  return NULL;
}

static Value *dq_count(Value *self, const CallArgs *a) {
  Value *x;
  if (args_bind("count", a, "x", (Value **[]){&x}) < 0) return NULL;
  int64_t k = 0;
  for (int64_t i = find(self, x, 0, INT64_MAX); i >= 0; i = find(self, x, i + 1, INT64_MAX)) k++;
  return val_int(k);
}

/* A start or stop of index(), clipped to [0, len] as Python clips it. */
static int bound_arg(Value *v, int64_t len, int64_t *out) {
  if (!v) return 0;
  if (arr_to_index(v, out) < 0) return -1;
  if (*out < 0) *out += len;
  if (*out < 0) *out = 0;
  if (*out > len) *out = len;
  return 0;
}

/* index(x[, start[, stop]]) */
static Value *dq_index(Value *self, const CallArgs *a) {
  Value *x, *sv = NULL, *ev = NULL;
  if (args_bind("index", a, "x, start=, stop=", (Value **[]){&x, &sv, &ev}) < 0) return NULL;
  int64_t len = (int64_t)list_len(self), lo = 0, hi = len;
  if (bound_arg(sv, len, &lo) < 0 || bound_arg(ev, len, &hi) < 0) return NULL;
  int64_t i = find(self, x, lo, hi);
  return i >= 0 ? val_int(i) : not_in(x);
}

static Value *dq_remove(Value *self, const CallArgs *a) {
  Value *x;
  if (args_bind("remove", a, "value", (Value **[]){&x}) < 0 || val_check_container(self) < 0) return NULL;
  int64_t i = find(self, x, 0, INT64_MAX);
  if (i < 0) return not_in(x);
  val_decref(take(self, (size_t)i));
  return VAL_NONE;
}

/* insert(i, x): a full deque refuses, as Python's (nothing may drop off). */
static Value *dq_insert(Value *self, const CallArgs *a) {
  Value *iv, *x;
  if (args_bind("insert", a, "index, object", (Value **[]){&iv, &x}) < 0 || val_check_container(self) < 0)
    return NULL;
  int64_t i, len = (int64_t)list_len(self), maxlen = ((List *)self)->maxlen;
  if (arr_to_index(iv, &i) < 0) return NULL;
  if (maxlen >= 0 && len >= maxlen) return err_set(ERR_INDEX, "deque already at its maximum size");
  if (i < 0) i += len;
  i = i < 0 ? 0 : i > len ? len : i;
  return list_splice(self, (size_t)i, 0, 1, &x) < 0 ? NULL : VAL_NONE;
}

static Value *dq_reverse(Value *self, const CallArgs *a) {
  if (args_bind("reverse", a, "", (Value **[]){NULL}) < 0 || val_check_container(self) < 0) return NULL;
  ops_list_reverse(self);
  return VAL_NONE;
}

static const struct {
  const char *name;
  MethodFn fn;
} deque_methods[] = {
  {"append", dq_append},   {"appendleft", dq_appendleft}, {"pop", dq_pop},       {"popleft", dq_popleft},
  {"extend", dq_extend},   {"extendleft", dq_extendleft}, {"rotate", dq_rotate}, {"clear", dq_clear},
  {"copy", dq_copy},       {"count", dq_count},           {"index", dq_index},   {"remove", dq_remove},
  {"insert", dq_insert},   {"reverse", dq_reverse},
};

Value *stdmod_deque_attr(Value *d, const char *name) {
  if (!strcmp(name, "maxlen")) {
    int64_t m = ((List *)d)->maxlen;
    return m < 0 ? val_incref(VAL_NONE) : val_int(m);
  }
  for (size_t i = 0; i < sizeof deque_methods / sizeof *deque_methods; i++)
    if (!strcmp(name, deque_methods[i].name)) return bound_new(name, deque_methods[i].fn, d);
  return err_set(ERR_ATTRIBUTE, "'collections.deque' object has no attribute '%s'", name);
}

/* ==== operators =================================================================== */

/* deque + deque (the left one's maxlen) and deque * n, n * deque. */
Value *stdmod_deque_binary(OpKind op, Value *a, Value *b) {
  bool da = stdmod_is_deque(a);
  Value *d = da ? a : b, *other = da ? b : a;
  if (op == OP_ADD && !(da && stdmod_is_deque(b)))
    return da ? err_set(ERR_TYPE, "can only concatenate deque (not \"%s\") to deque", val_type_name(other))
              : err_set(ERR_TYPE, "can only concatenate %s (not \"%s\") to %s", val_type_name(other),
                        val_type_name(d), val_type_name(other));
  int64_t n = 1;
  if (op == OP_MUL && (!arr_is_host(other) || dt_is_float(AS_ARRAY(other)->dtype) ||
                       arr_to_index(other, &n) < 0))
    return err_set(ERR_TYPE, "can't multiply sequence by non-int of type '%s'",
                   arr_is_host(other) ? "float" : val_type_name(other));
  if (op != OP_ADD && op != OP_MUL)
    return err_set(ERR_TYPE, "unsupported operand type(s) for this operator: '%s' and '%s'",
                   val_type_name(a), val_type_name(b));
  Value *r = deque_new(((List *)d)->maxlen);
  size_t len = list_len(d);
  for (int64_t k = 0; r && k < (op == OP_ADD ? 1 : n); k++)
    if (list_splice(r, list_len(r), 0, len, ((List *)d)->items) < 0) bi_drop(r, NULL, NULL, NULL), r = NULL;
  if (r && op == OP_ADD && push_all(r, b, false) < 0) bi_drop(r, NULL, NULL, NULL), r = NULL;
  if (r) trim(r, true);
  return r;
}

/* ==== the class =================================================================== */

Value *stdmod_deque_class(void) { return deque_class; }

int stdmod_deque_register(Value *m) {
  Value *c = builtin_new("collections.deque", coll_deque,
                         "deque(iterable=(), maxlen=None): a list-like sequence with fast ends");
  if (!c) return -1;
  ((Builtin *)c)->is_class = true;   /* prints <class 'collections.deque'>; type() of a deque */
  deque_class = c;
  return dict_set_str(((Module *)m)->globals, "deque", c);
}
