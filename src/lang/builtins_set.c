/*
 * builtins_set.c - Python's set and frozenset: the built-ins set() and
 * frozenset(), their methods, and the operators | & - ^ and the subset
 * comparisons (semantics: Python's "Set Types" in the library reference).
 *
 * A set is a dict of kind DICT_SET (frozenset: DICT_FROZENSET) whose keys
 * are its elements and whose values are None (value.h, val_is_set), so
 * len, iteration (in insertion order, where Python's order is the
 * hash's), `in` and == are a dict's keys'; everything a dict has beyond
 * that (its methods, subscripts, **) is kept from it.  JAX code meets
 * sets as shard_map's axis_names={'x'}; they are pytree leaves, as JAX
 * registers none.  A frozenset is not hashable here (a dict key or a
 * set's element): the error says so.
 */
#include <string.h>

#include "array/print.h"
#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/builtins_impl.h"
#include "lang/ops.h"

/* ==== building ================================================================== */

/* A new set (frozenset when [frozen]) of the items of iterable [it]
 * (NULL: empty). */
static Value *set_of(Value *it, bool frozen) {
  Value *s = set_new(frozen);
  if (!s || !it) return s;
  Value *items = ops_iter_items(it);
  for (size_t i = 0; items && i < list_len(items); i++)
    if (set_add(s, list_get(items, i)) < 0) break;
  if (!items || err_occurred()) {
    val_decref(s);
    s = NULL;
  }
  val_decref(items);
  return s;
}

/* set(iterable=()) */
static Value *bi_set(const CallArgs *a) {
  Value *it = NULL;
  if (args_bind("set", a, "iterable=", (Value **[]){&it}) < 0) return NULL;
  return set_of(it, false);
}

/* frozenset(iterable=()) */
static Value *bi_frozenset(const CallArgs *a) {
  Value *it = NULL;
  if (args_bind("frozenset", a, "iterable=", (Value **[]){&it}) < 0) return NULL;
  return set_of(it, true);
}

/* ==== the algebra ================================================================= */

static bool has(Value *s, Value *x) {
  return dict_get(s, x) != NULL;
}

/* [a] op [b] as a new set of [a]'s kind: '|' union, '&' intersection,
 * '-' difference, '^' symmetric difference; [b] any iterable. */
static Value *combine(Value *a, Value *b, char op) {
  Value *other = val_is_set(b) ? val_incref(b) : set_of(b, false);
  Value *r = other ? set_new(((Dict *)a)->kind == DICT_FROZENSET) : NULL;
  Dict *da = (Dict *)a, *db = (Dict *)other;
  int rc = r ? 0 : -1;
  for (size_t i = 0; rc == 0 && i < da->len; i++) {
    bool in_b = has(other, da->keys[i]);
    if (op == '|' || (op == '&' && in_b) || ((op == '-' || op == '^') && !in_b))
      rc = set_add(r, da->keys[i]);
  }
  for (size_t i = 0; rc == 0 && (op == '|' || op == '^') && i < db->len; i++)
    if (!has(a, db->keys[i])) rc = set_add(r, db->keys[i]);
  val_decref(other);
  if (rc < 0) {
    val_decref(r);
    return NULL;
  }
  return r;
}

/* Whether every element of [a] is in [b]. */
static bool subset(Value *a, Value *b) {
  Dict *da = (Dict *)a;
  for (size_t i = 0; i < da->len; i++)
    if (!has(b, da->keys[i])) return false;
  return true;
}

Value *builtins_set_binary(OpKind op, Value *a, Value *b) {
  if (!val_is_set(a) || !val_is_set(b)) return NULL;
  switch (op) {
  case OP_BITOR: return combine(a, b, '|');
  case OP_BITAND: return combine(a, b, '&');
  case OP_SUB: return combine(a, b, '-');
  case OP_BITXOR: return combine(a, b, '^');
  case OP_LE: return val_bool(subset(a, b));
  case OP_GE: return val_bool(subset(b, a));
  case OP_LT: return val_bool(((Dict *)a)->len < ((Dict *)b)->len && subset(a, b));
  case OP_GT: return val_bool(((Dict *)b)->len < ((Dict *)a)->len && subset(b, a));
  default: return NULL;
  }
}

/* ==== methods ===================================================================== */

/* The mutating methods refuse a frozenset, as Python has none of them. */
static int mutable(Value *self, const char *name) {
  if (((Dict *)self)->kind == DICT_FROZENSET)
    return err_set(ERR_ATTRIBUTE, "'frozenset' object has no attribute '%s'", name), -1;
  return val_check_container(self);
}

static Value *m_add(Value *self, const CallArgs *a) {
  Value *x;
  if (args_bind("add", a, "elem", (Value **[]){&x}) < 0 || mutable(self, "add") < 0) return NULL;
  return set_add(self, x) < 0 ? NULL : VAL_NONE;
}

/* discard(elem), or remove(elem): a KeyError when it is missing. */
static Value *take(Value *self, const CallArgs *a, const char *name, bool must) {
  Value *x;
  if (args_bind(name, a, "elem", (Value **[]){&x}) < 0 || mutable(self, name) < 0) return NULL;
  if (has(self, x)) return dict_del(self, x) < 0 ? NULL : VAL_NONE;
  if (err_occurred()) return NULL;   /* unhashable */
  if (!must) return VAL_NONE;
  Value *r = val_repr(x);
  if (r) err_set(ERR_INDEX, "KeyError: %s", str_cstr(r));
  val_decref(r);
  return NULL;
}
static Value *m_discard(Value *self, const CallArgs *a) { return take(self, a, "discard", false); }
static Value *m_remove(Value *self, const CallArgs *a) { return take(self, a, "remove", true); }

static Value *m_pop(Value *self, const CallArgs *a) {
  if (args_bind("pop", a, "", (Value **[]){NULL}) < 0 || mutable(self, "pop") < 0) return NULL;
  Dict *d = (Dict *)self;
  if (!d->len) return err_set(ERR_INDEX, "KeyError: 'pop from an empty set'");
  Value *x = val_incref(d->keys[0]);
  if (dict_del(self, x) < 0) {
    val_decref(x);
    return NULL;
  }
  return x;
}

static Value *m_clear(Value *self, const CallArgs *a) {
  if (args_bind("clear", a, "", (Value **[]){NULL}) < 0 || mutable(self, "clear") < 0) return NULL;
  while (((Dict *)self)->len)
    if (dict_del(self, ((Dict *)self)->keys[0]) < 0) return NULL;
  return VAL_NONE;
}

static Value *m_copy(Value *self, const CallArgs *a) {
  if (args_bind("copy", a, "", (Value **[]){NULL}) < 0) return NULL;
  return set_of(self, ((Dict *)self)->kind == DICT_FROZENSET);
}

/* union/intersection/difference(*others): a new set; symmetric_difference
 * takes one other. */
static Value *fold(Value *self, const CallArgs *a, const char *name, char op) {
  if (a->nkw) return err_set(ERR_TYPE, "set.%s() takes no keyword arguments", name);
  if (op == '^' && a->nargs != 1)
    return err_set(ERR_TYPE, "set.%s() takes exactly one argument (%d given)", name, a->nargs);
  Value *r = val_incref(self);
  for (int i = 0; r && i < a->nargs; i++) {
    Value *n = combine(r, a->args[i], op);
    val_decref(r);
    r = n;
  }
  if (r == self) {   /* no others: a copy */
    val_decref(r);
    r = set_of(self, ((Dict *)self)->kind == DICT_FROZENSET);
  }
  return r;
}
static Value *m_union(Value *self, const CallArgs *a) { return fold(self, a, "union", '|'); }
static Value *m_intersection(Value *self, const CallArgs *a) { return fold(self, a, "intersection", '&'); }
static Value *m_difference(Value *self, const CallArgs *a) { return fold(self, a, "difference", '-'); }
static Value *m_symmetric_difference(Value *self, const CallArgs *a) {
  return fold(self, a, "symmetric_difference", '^');
}

/* update(*others) and the other in-place forms: self becomes the fold. */
static Value *in_place(Value *self, const CallArgs *a, const char *name, char op) {
  if (mutable(self, name) < 0) return NULL;
  Value *r = fold(self, a, name, op);
  if (!r) return NULL;
  Value *none = m_clear(self, &(CallArgs){0});
  Dict *dr = (Dict *)r;
  for (size_t i = 0; none && i < dr->len; i++)
    if (set_add(self, dr->keys[i]) < 0) none = NULL;
  val_decref(r);
  return none;
}
static Value *m_update(Value *self, const CallArgs *a) { return in_place(self, a, "update", '|'); }
static Value *m_intersection_update(Value *self, const CallArgs *a) {
  return in_place(self, a, "intersection_update", '&');
}
static Value *m_difference_update(Value *self, const CallArgs *a) {
  return in_place(self, a, "difference_update", '-');
}
static Value *m_symmetric_difference_update(Value *self, const CallArgs *a) {
  return in_place(self, a, "symmetric_difference_update", '^');
}

/* issubset/issuperset/isdisjoint(other): [other] any iterable. */
static Value *relation(Value *self, const CallArgs *a, const char *name, char rel) {
  Value *x;
  if (args_bind(name, a, "other", (Value **[]){&x}) < 0) return NULL;
  Value *other = val_is_set(x) ? val_incref(x) : set_of(x, false);
  if (!other) return NULL;
  bool r = rel == '<' ? subset(self, other) : rel == '>' ? subset(other, self) : true;
  for (size_t i = 0; rel == '!' && i < ((Dict *)self)->len; i++)
    if (has(other, ((Dict *)self)->keys[i])) r = false;
  val_decref(other);
  return val_bool(r);
}
static Value *m_issubset(Value *self, const CallArgs *a) { return relation(self, a, "issubset", '<'); }
static Value *m_issuperset(Value *self, const CallArgs *a) { return relation(self, a, "issuperset", '>'); }
static Value *m_isdisjoint(Value *self, const CallArgs *a) { return relation(self, a, "isdisjoint", '!'); }

static const struct {
  const char *name;
  MethodFn fn;
} set_methods[] = {
  {"add", m_add},
  {"discard", m_discard},
  {"remove", m_remove},
  {"pop", m_pop},
  {"clear", m_clear},
  {"copy", m_copy},
  {"union", m_union},
  {"intersection", m_intersection},
  {"difference", m_difference},
  {"symmetric_difference", m_symmetric_difference},
  {"update", m_update},
  {"intersection_update", m_intersection_update},
  {"difference_update", m_difference_update},
  {"symmetric_difference_update", m_symmetric_difference_update},
  {"issubset", m_issubset},
  {"issuperset", m_issuperset},
  {"isdisjoint", m_isdisjoint},
};

Value *builtins_set_attr(Value *s, const char *name) {
  for (size_t i = 0; i < sizeof set_methods / sizeof *set_methods; i++)
    if (!strcmp(name, set_methods[i].name)) {
      if (((Dict *)s)->kind == DICT_FROZENSET && mutable(s, name) < 0) return NULL;
      return bound_new(name, set_methods[i].fn, s);
    }
  return err_set(ERR_ATTRIBUTE, "'%s' object has no attribute '%s'", val_type_name(s), name);
}

Value *builtins_set_dir(Value *s) {
  Value *l = list_new(0);
  bool frozen = ((Dict *)s)->kind == DICT_FROZENSET;
  for (size_t i = 0; l && i < sizeof set_methods / sizeof *set_methods; i++) {
    const char *n = set_methods[i].name;
    bool mutates = !strcmp(n, "add") || !strcmp(n, "discard") || !strcmp(n, "remove") ||
                   !strcmp(n, "pop") || !strcmp(n, "clear") || strstr(n, "update");
    if ((!frozen || !mutates) && list_append_steal(l, str_from(n)) < 0) {
      val_decref(l);
      l = NULL;
    }
  }
  return l;
}

/* ==== registration ================================================================ */

const BiEntry bi_set_table[] = {
  {"set", bi_set, IN_TOP, "set(iterable=()): a new set of the iterable's elements"},
  {"frozenset", bi_frozenset, IN_TOP, "frozenset(iterable=()): an immutable set"},
  {NULL, NULL, 0, NULL},
};
