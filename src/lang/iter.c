/*
 * iter.c - lazy iterators (iter.h): count, cycle, repeat, islice, zip,
 * map, enumerate, filter, reversed and iter()'s, as opaque values of one
 * struct whose kind picks how the next item is made; their types carry
 * Python's names (zip, list_iterator, generator, itertools.count, ...).
 */
#include <string.h>

#include "array/array.h"
#include "array/print.h"
#include "base/mem.h"
#include "lang/eval.h"
#include "lang/iter.h"
#include "lang/ops.h"

enum { K_COUNT, K_CYCLE, K_REPEAT, K_ISLICE, K_ZIP, K_MAP, K_ENUMERATE, K_SEQ, K_GEN, K_FILTER, K_KINDS };

/* The names Python gives iter(x) and reversed(x) by the kind of x (all
 * of kind K_SEQ here: the items read at once). */
enum { SEQ_ANY, SEQ_LIST, SEQ_TUPLE, SEQ_RANGE, SEQ_STR, SEQ_DICT, SEQ_LIST_REV, SEQ_REVERSED, SEQ_NAMES };

typedef struct Iter {
  Opaque base;
  int kind;
  uint32_t writer;   /* val_writer of the run that made it: only it advances it */
  bool done;         /* exhausted: every later next is too, as Python's */
  /* What each kind keeps (owned; NULL where unused):
   *   count: a = the next value, b = the step;   repeat: a = the object;
   *   cycle: a = the saved items (a List), b = an infinite source passed
   *          through instead, pos = the next saved item;
   *   islice: a = the source, pos/next/stop/step as CPython's islice;
   *   zip, map, enumerate: a = a List of the sources (lazy iterators),
   *          b = map's function;
   *   seq (iter(), reversed()): a = the items (a List), pos = the next one;
   *   filter: a = the source (a lazy iterator), b = the predicate or None;
   *   gen: a = the source, b = the values made but not handed out (a
   *          List), gen_step/gen_release/gen_ctx from eval.c. */
  Value *a, *b;
  int64_t pos, next, stop, step;
  IterStep gen_step;
  void (*gen_release)(void *ctx);
  void *gen_ctx;
} Iter;

static void iter_free(Value *v) {
  Iter *it = (Iter *)v;
  val_decref(it->a);
  val_decref(it->b);
  if (it->gen_release) it->gen_release(it->gen_ctx);
}

static Value *iter_repr(Value *v);

static Value *iter_getattr(Value *v, const char *name) {
  return err_set(ERR_ATTRIBUTE, "'%s' object has no attribute '%s'", val_type_name(v), name);
}

/* One type a kind, named as Python names it (the index is the kind). */
#define ITER_TYPE(type_name) {.name = type_name, .free = iter_free, .repr = iter_repr, .getattr = iter_getattr}
static const OpaqueType iter_types[K_KINDS] = {
  ITER_TYPE("itertools.count"), ITER_TYPE("itertools.cycle"), ITER_TYPE("itertools.repeat"),
  ITER_TYPE("itertools.islice"), ITER_TYPE("zip"), ITER_TYPE("map"), ITER_TYPE("enumerate"),
  ITER_TYPE("iterator"), ITER_TYPE("generator"), ITER_TYPE("filter")};
static const OpaqueType seq_types[SEQ_NAMES] = {
  ITER_TYPE("iterator"), ITER_TYPE("list_iterator"), ITER_TYPE("tuple_iterator"),
  ITER_TYPE("range_iterator"), ITER_TYPE("str_ascii_iterator"), ITER_TYPE("dict_keyiterator"),
  ITER_TYPE("list_reverseiterator"), ITER_TYPE("reversed")};

bool iter_is(const Value *v) {
  if (v->type != V_OPAQUE) return false;
  const OpaqueType *ot = ((const Opaque *)v)->ot;
  return (ot >= iter_types && ot < iter_types + K_KINDS) || (ot >= seq_types && ot < seq_types + SEQ_NAMES);
}

/* A new iterator of [kind] holding [a] and [b] (stolen, even on failure). */
static Value *iter_new(int kind, Value *a, Value *b) {
  Iter *it = shm_calloc(1, sizeof *it);
  if (!it) {
    val_decref(a);
    val_decref(b);
    return err_nomem();
  }
  val_init(&it->base.hdr, V_OPAQUE);
  it->base.ot = &iter_types[kind];
  it->kind = kind;
  it->writer = val_writer;
  it->a = a;
  it->b = b;
  return &it->base.hdr;
}

/* Whether [v] is the Python int 1 (count's default step). */
static bool is_int_one(Value *v) {
  int64_t x;
  return arr_is_host(v) && dt_is_int(AS_ARRAY(v)->dtype) && arr_to_index(v, &x) == 0 && x == 1;
}

/* count(5) and count(0, 2) as Python prints them: the step only when it
 * is not the int 1; repeat(x); the others by their type's name. */
static Value *iter_repr(Value *v) {
  Iter *it = (Iter *)v;
  if (it->kind != K_COUNT && it->kind != K_REPEAT) return str_printf("<%s object>", it->base.ot->name);
  bool unit = it->kind == K_REPEAT || is_int_one(it->b);
  Value *x = val_repr(it->a), *s = x && !unit ? val_repr(it->b) : NULL;
  Value *r = NULL;
  if (x && (unit || s))
    r = str_printf("%s(%s%s%s)", it->kind == K_COUNT ? "count" : "repeat", str_cstr(x), s ? ", " : "",
                   s ? str_cstr(s) : "");
  val_decref(x);
  val_decref(s);
  return r;
}

/* Releases the list being built at [*l] on an error. */
static void drop(Value **l) {
  val_decref(*l);
  *l = NULL;
}

/* ==== the next item =============================================================== */

/* Whether Ctrl-C came, as an error: for the loops here that pull items
 * without handing any out, which may never end. */
static bool interrupted(void) {
  if (!shm_interrupt_pending()) return false;
  err_set(ERR_INTERRUPT, "interrupted");
  return true;
}

static Value *next_count(Iter *it) {
  Value *n = ops_binary(OP_ADD, it->a, it->b);
  if (!n) return NULL;
  Value *cur = it->a;   /* the iterator's reference becomes the caller's */
  it->a = n;
  return cur;
}

static Value *next_cycle(Iter *it) {
  if (it->b) return iter_next(it->b);
  if (!list_len(it->a)) return NULL;
  if (it->pos >= (int64_t)list_len(it->a)) it->pos = 0;
  return val_incref(list_get(it->a, (size_t)it->pos++));
}

/* Python's islice: skips to the next wanted position, stops at stop. */
static Value *next_islice(Iter *it) {
  while (it->pos < it->next) {
    if (interrupted()) return NULL;   /* a start of 10**18 is a long skip */
    Value *x = iter_next(it->a);
    if (!x) return NULL;
    val_decref(x);
    it->pos++;
  }
  if (it->stop >= 0 && it->pos >= it->stop) return NULL;
  Value *x = iter_next(it->a);
  if (!x) return NULL;
  it->pos++;
  it->next += it->step;
  if (it->stop >= 0 && it->next > it->stop) it->next = it->stop;
  return x;
}

/* A tuple of the next item of each source, or NULL when one ends. */
static Value *next_row(Iter *it) {
  size_t n = list_len(it->a);
  Value *t = tuple_new(n);
  for (size_t i = 0; t && i < n; i++) {
    Value *x = iter_next(list_get(it->a, i));
    if (!x) {
      val_decref(t);
      return NULL;
    }
    tuple_set_steal(t, i, x);
  }
  return t;
}

static Value *next_map(Iter *it) {
  Value *row = next_row(it);
  if (!row) return NULL;
  Value *r = val_call_n(it->b, (int)tuple_len(row), ((Tuple *)row)->items);
  val_decref(row);
  return r;
}

static Value *next_seq(Iter *it) {
  if (it->pos >= (int64_t)list_len(it->a)) return NULL;
  return val_incref(list_get(it->a, (size_t)it->pos++));
}

/* The next value of a generator expression: from those made of one
 * source item, making more as they run out. */
static Value *next_gen(Iter *it) {
  while (!list_len(it->b)) {
    if (interrupted()) return NULL;   /* its `if` may drop every item */
    Value *x = iter_next(it->a);
    if (!x) return NULL;
    int rc = it->gen_step(it->gen_ctx, x, it->b);
    val_decref(x);
    if (rc < 0) return NULL;
  }
  Value *v = val_incref(list_get(it->b, 0));
  list_splice(it->b, 0, 1, 0, NULL);   /* shrinking: cannot fail */
  return v;
}

/* The next item of the source that passes the predicate (its truth;
 * with None the item's own), as Python's filter. */
static Value *next_filter(Iter *it) {
  for (;;) {
    if (interrupted()) return NULL;   /* the predicate may drop every item */
    Value *x = iter_next(it->a);
    if (!x) return NULL;
    Value *p = it->b == VAL_NONE ? val_incref(x) : val_call_n(it->b, 1, &x);
    int t = p ? val_truth(p) : -1;
    if (p) val_decref(p);
    if (t == 1) return x;
    val_decref(x);
    if (t < 0) return NULL;
  }
}

/* The next item by kind (iter_next's contract). */
static Value *next_of(Iter *it) {
  switch (it->kind) {
  case K_COUNT: return next_count(it);
  case K_CYCLE: return next_cycle(it);
  case K_REPEAT: return val_incref(it->a);
  case K_ISLICE: return next_islice(it);
  case K_ZIP: case K_ENUMERATE: return next_row(it);
  case K_MAP: return next_map(it);
  case K_GEN: return next_gen(it);
  case K_FILTER: return next_filter(it);
  default: return next_seq(it);
  }
}

Value *iter_next(Value *v) {
  Iter *it = (Iter *)v;
  if (it->done) return NULL;
  if (val_check_writer(it->writer, "an iterator made outside this shard_map body") < 0) return NULL;
  Value *x = next_of(it);
  if (!x && !err_occurred()) it->done = true;
  return x;
}

bool iter_infinite(const Value *v) {
  const Iter *it = (const Iter *)v;
  if (it->done) return false;
  switch (it->kind) {
  case K_COUNT: case K_REPEAT: return true;
  case K_CYCLE: return it->b || list_len(it->a) > 0;
  case K_ISLICE: return it->stop < 0 && iter_infinite(it->a);
  case K_GEN: case K_FILTER: return iter_infinite(it->a);   /* its `if` may drop them all: then it never ends either */
  case K_ZIP: case K_MAP: case K_ENUMERATE:
    for (size_t i = 0; i < list_len(it->a); i++)
      if (!iter_infinite(list_get(it->a, i))) return false;
    return list_len(it->a) > 0;
  default: return false;
  }
}

Value *iter_drain(Value *v) {
  if (iter_infinite(v))
    return err_set(ERR_VALUE, "cannot make a list of the infinite iterator '%s': it never ends "
                              "(bound it with itertools.islice or zip)", val_type_name(v));
  Value *l = list_new(0), *x;
  while (l && (x = iter_next(v))) {
    if (list_append_steal(l, x) < 0 || interrupted()) drop(&l);
  }
  if (l && err_occurred()) drop(&l);
  return l;
}

Value *iter_take(Value *v, size_t max) {
  Value *l = list_new(0), *x;
  while (l && list_len(l) < max && (x = iter_next(v)))
    if (list_append_steal(l, x) < 0) drop(&l);
  if (l && err_occurred()) drop(&l);
  return l;
}

/* ==== makers ====================================================================== */

/* Python's name for an iterator over [x] (reversed: a reversed one). */
static const OpaqueType *seq_type(const Value *x, bool reversed) {
  int n = x->type == V_LIST ? (reversed ? SEQ_LIST_REV : SEQ_LIST) : x->type == V_RANGE ? SEQ_RANGE
        : reversed ? SEQ_REVERSED : x->type == V_TUPLE ? SEQ_TUPLE : x->type == V_STR ? SEQ_STR
        : x->type == V_DICT ? SEQ_DICT : SEQ_ANY;
  return &seq_types[n];
}

Value *iter_over(Value *x) {
  if (iter_is(x)) return val_incref(x);
  Value *items = ops_iter_items(x), *v = items ? iter_new(K_SEQ, items, NULL) : NULL;
  if (v) ((Iter *)v)->base.ot = seq_type(x, false);
  return v;
}

Value *iter_reversed(Value *x) {
  if (iter_is(x)) return err_set(ERR_TYPE, "'%s' object is not reversible", val_type_name(x));
  Value *items = ops_iter_items(x), *v = items ? iter_new(K_SEQ, items, NULL) : NULL;
  if (!v) return NULL;
  ops_list_reverse(items);
  ((Iter *)v)->base.ot = seq_type(x, true);
  return v;
}

Value *iter_filter(Value *pred, Value *src) {
  Value *s = iter_over(src);
  return s ? iter_new(K_FILTER, s, val_incref(pred)) : NULL;
}

/* A number for count(): a Python number or an array (what `+` takes). */
static bool is_number(const Value *v) { return v->type == V_ARRAY || v->type == V_TRACER; }

Value *iter_count(Value *start, Value *step) {
  if (!is_number(start) || !is_number(step)) return err_set(ERR_TYPE, "a number is required");
  return iter_new(K_COUNT, val_incref(start), val_incref(step));
}

Value *iter_cycle(Value *iterable) {
  if (iter_is(iterable) && iter_infinite(iterable)) {
    Value *none = list_new(0);
    return none ? iter_new(K_CYCLE, none, val_incref(iterable)) : NULL;
  }
  Value *items = ops_iter_items(iterable);
  return items ? iter_new(K_CYCLE, items, NULL) : NULL;
}

Value *iter_repeat(Value *obj) { return iter_new(K_REPEAT, val_incref(obj), NULL); }

Value *iter_islice(Value *src, int64_t start, int64_t stop, int64_t step) {
  Value *v = iter_new(K_ISLICE, val_incref(src), NULL);
  if (!v) return NULL;
  Iter *it = (Iter *)v;
  it->next = stop >= 0 && start > stop ? stop : start;
  it->stop = stop;
  it->step = step;
  return v;
}

/* A List of iter_over of each of [srcs]. */
static Value *sources(int n, Value *const *srcs) {
  Value *l = list_new((size_t)n);
  for (int i = 0; l && i < n; i++) {
    Value *s = iter_over(srcs[i]);
    if (!s || list_append_steal(l, s) < 0) drop(&l);
  }
  return l;
}

Value *iter_zip(int n, Value *const *srcs, Value *fn) {
  Value *l = sources(n, srcs);
  if (!l) return NULL;
  return iter_new(fn ? K_MAP : K_ZIP, l, fn ? val_incref(fn) : NULL);
}

Value *iter_enumerate(Value *src, int64_t start) {
  Value *s = val_int(start), *one = s ? val_int(1) : NULL, *c = one ? iter_count(s, one) : NULL;
  val_decref(s);
  val_decref(one);
  if (!c) return NULL;
  Value *l = sources(2, (Value *[]){c, src});
  val_decref(c);
  return l ? iter_new(K_ENUMERATE, l, NULL) : NULL;
}

Value *iter_gen(Value *src, IterStep step, void (*release)(void *ctx), void *ctx) {
  Value *buf = list_new(0), *v = buf ? iter_new(K_GEN, val_incref(src), buf) : NULL;
  if (!v) {
    release(ctx);
    return NULL;
  }
  Iter *it = (Iter *)v;
  it->gen_step = step;
  it->gen_release = release;
  it->gen_ctx = ctx;
  return v;
}
