/*
 * classes.c - classes, instances, methods and descriptors (classes.h).
 * The library built on them (dataclasses, enum, named tuples, pytree
 * registration) is in classes_lib.c.
 */
#include "lang/classes.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "array/array.h"
#include "array/print.h"
#include "base/intern.h"
#include "base/mem.h"
#include "base/suggest.h"
#include "lang/builtins.h"
#include "lang/classes_impl.h"
#include "lang/exceptions.h"
#include "lang/ops.h"

/* ---- the opaque kinds ------------------------------------------------------ */

static void class_free(Value *v) {
  Class *c = (Class *)v;
  shm_free(c->name);
  Value *owned[] = {c->dict, c->fields, c->defaults, c->factories, c->metadata, c->options, c->members,
                    c->flatten, c->unflatten, c->data_fields, c->meta_fields};
  for (size_t i = 0; i < sizeof owned / sizeof *owned; i++) val_decref(owned[i]);
}

static void instance_free(Value *v) { val_decref(((Instance *)v)->dict); }

static void wrap_free(Value *v) {
  Wrap *w = (Wrap *)v;
  val_decref(w->a);
  val_decref(w->b);
  val_decref(w->c);
  val_decref(w->d);
}

static Value *class_repr(Value *v) { return str_printf("<class '%s'>", ((Class *)v)->name); }
static Value *class_getattr(Value *v, const char *name);
static Value *instance_repr(Value *v);
static Value *instance_str(Value *v);
static Value *instance_getattr(Value *v, const char *name);
static Value *method_repr(Value *v);
static Value *property_getattr(Value *v, const char *name);
static Value *super_getattr(Value *v, const char *name);
static Value *field_repr(Value *v);
static Value *field_getattr(Value *v, const char *name);

const OpaqueType cls_class_type = {"type", class_free, class_repr, class_getattr, NULL, NULL, NULL};
static const OpaqueType instance_type = {"object", instance_free, instance_repr, instance_getattr,
                                      instance_str, NULL, NULL};
const OpaqueType cls_method_type = {"method", wrap_free, method_repr, NULL, NULL, NULL, NULL};
const OpaqueType cls_property_type = {"property", wrap_free, NULL, property_getattr, NULL, NULL,
                                      NULL};
const OpaqueType cls_staticmethod_type = {"staticmethod", wrap_free, NULL, NULL, NULL, NULL, NULL};
const OpaqueType cls_classmethod_type = {"classmethod", wrap_free, NULL, NULL, NULL, NULL, NULL};
const OpaqueType cls_super_type = {"super", wrap_free, NULL, super_getattr, NULL, NULL, NULL};
const OpaqueType cls_field_type = {"Field", wrap_free, field_repr, field_getattr, NULL, NULL,
                                   NULL};
static const OpaqueType cached_property_type = {"cached_property", wrap_free, NULL, NULL, NULL,
                                                NULL, NULL};

bool cls_is(const Value *v, const OpaqueType *ot) {
  return v->type == V_OPAQUE && ((const Opaque *)v)->ot == ot;
}

bool cls_is_class(const Value *v) { return cls_is(v, &cls_class_type); }

bool cls_is_instance(const Value *v) {
  return v->type == V_OPAQUE && ((const Opaque *)v)->ot->free == instance_free;
}

Value *cls_wrap_new(const OpaqueType *ot, Value *a, Value *b, Value *c) {
  Wrap *w = shm_calloc(1, sizeof *w);
  if (!w) return err_nomem();
  val_init(&w->base.hdr, V_OPAQUE);
  w->base.ot = ot;
  w->a = val_incref(a);
  w->b = val_incref(b);
  w->c = val_incref(c);
  return &w->base.hdr;
}

Value *cls_instance_new(Class *c) {
  Instance *o = shm_calloc(1, sizeof *o);
  if (!o) return err_nomem();
  val_init(&o->base.hdr, V_OPAQUE);
  o->base.ot = &c->instance_type;
  o->cls = c;
  if (!(o->dict = dict_new())) {
    shm_free(o);
    return NULL;
  }
  return &o->base.hdr;
}

Value *cls_class_of(Value *x) {
  if (cls_is_instance(x)) return &((Instance *)x)->cls->base.hdr;
  return tuple_class(x);
}

const char *cls_name(const Value *cls) { return ((const Class *)cls)->name; }

/* ---- lookup -------------------------------------------------------------- */

Value *cls_find(Class *c, const char *name, Class **where) {
  for (; c; c = c->parent) {
    Value *v = dict_get_str(c->dict, name);
    if (v) {
      if (where) *where = c;
      return v;
    }
  }
  return NULL;
}

int cls_isinstance(Value *x, Value *cls) {
  if (!cls_is_class(cls)) return -1;
  if (cls == cls_object) return 1;   /* every value is an object */
  Value *k = cls_class_of(x);
  for (Class *c = k ? (Class *)k : NULL; c; c = c->parent)
    if (&c->base.hdr == cls) return 1;
  return 0;
}

/* Whether a class attribute [v] becomes a method when read through an
 * instance: Python functions, and jit and shard_map wrappers, which JAX
 * makes descriptors too. */
static bool binds(const Value *v) {
  return v->type == V_FUNC || v->type == V_JITFN || v->type == V_SHARDFN;
}

Value *cls_bind(Value *attr, Value *self, Value *cls) {
  if (binds(attr)) return self ? cls_wrap_new(&cls_method_type, attr, self, NULL) : val_incref(attr);
  if (cls_is(attr, &cls_staticmethod_type)) return val_incref(((Wrap *)attr)->a);
  if (cls_is(attr, &cls_classmethod_type))
    return cls_wrap_new(&cls_method_type, ((Wrap *)attr)->a, cls, NULL);
  if (cls_is(attr, &cls_property_type)) {
    if (!self) return val_incref(attr);
    if (!((Wrap *)attr)->a) return err_set(ERR_ATTRIBUTE, "property has no getter");
    return val_call_n(((Wrap *)attr)->a, 1, &self);
  }
  return val_incref(attr);
}

Value *cls_no_attribute(Value *obj, Class *c, Value *dict, const char *name) {
  Suggest s;
  suggest_init(&s, name);
  for (size_t i = 0; dict && i < ((Dict *)dict)->len; i++)
    suggest_offer(&s, str_cstr(((Dict *)dict)->keys[i]));
  for (Class *k = c; k; k = k->parent)
    for (size_t i = 0; i < ((Dict *)k->dict)->len; i++)
      suggest_offer(&s, str_cstr(((Dict *)k->dict)->keys[i]));
  const char *best = suggest_best(&s);
  char hint[160] = "";
  if (best) snprintf(hint, sizeof hint, ". Did you mean: '%s'?", best);
  if (cls_is_class(obj))
    return err_set(ERR_ATTRIBUTE, "type object '%s' has no attribute '%s'%s", c->name, name, hint);
  return err_set(ERR_ATTRIBUTE, "'%s' object has no attribute '%s'%s", c->name, name, hint);
}

/* The cached_property [attr] read as [name] through [self]: computed
 * and kept in self's dict (the instance dict is read first next time). */
static Value *cached_value(Value *self, Class *c, Value *attr, const char *name) {
  if (!cls_is_instance(self))
    return err_set(ERR_TYPE, "No '__dict__' attribute on '%s' instance to cache '%s' property.", c->name, name);
  Value *dict = ((Instance *)self)->dict;
  if (val_check_container(dict) < 0) return NULL;
  Value *v = val_call_n(((Wrap *)attr)->a, 1, &self);
  if (v && dict_set_str(dict, name, v) < 0) {
    val_decref(v);
    return NULL;
  }
  return v;
}

Value *cls_cached_property(const CallArgs *a) {
  if (a->nargs != 1 || a->nkw) return err_set(ERR_TYPE, "cached_property() takes one function");
  return cls_wrap_new(&cached_property_type, a->args[0], NULL, NULL);
}

/* An attribute of an instance or a named tuple [self] of class [c] that
 * its own storage did not have: the class's, then __getattr__. */
Value *cls_class_attr(Value *self, Class *c, Value *dict, const char *name) {
  Value *attr = cls_find(c, name, NULL);
  if (attr && cls_is(attr, &cached_property_type)) return cached_value(self, c, attr, name);
  if (attr) return cls_bind(attr, self, &c->base.hdr);
  Value *ga = cls_find(c, "__getattr__", NULL);
  if (ga && binds(ga)) {
    Value *n = str_from(name);
    Value *r = n ? val_call_n(ga, 2, (Value *[]){self, n}) : NULL;
    val_decref(n);
    return r;
  }
  return cls_no_attribute(self, c, dict, name);
}

static Value *instance_getattr(Value *v, const char *name) {
  Instance *o = (Instance *)v;
  if (!strcmp(name, "__class__")) return val_incref(&o->cls->base.hdr);
  if (!strcmp(name, "__dict__")) return val_incref(o->dict);
  Value *attr = cls_find(o->cls, name, NULL);
  if (attr && cls_is(attr, &cls_property_type)) return cls_bind(attr, v, NULL);
  Value *own = dict_get_str(o->dict, name);
  if (own) return val_incref(own);
  return cls_class_attr(v, o->cls, o->dict, name);
}

static Value *class_getattr(Value *v, const char *name) {
  Class *c = (Class *)v;
  if (!strcmp(name, "__name__") || !strcmp(name, "__qualname__")) return str_from(c->name);
  if (!strcmp(name, "__dict__")) return val_incref(c->dict);
  if (!strcmp(name, "__base__")) return val_incref(c->parent ? &c->parent->base.hdr : cls_object);
  Value *lib = cls_lib_class_attr(c, name);
  if (lib != CLS_DECLINED) return lib;
  Value *attr = cls_find(c, name, NULL);
  if (!attr) return cls_no_attribute(v, c, NULL, name);
  if (cls_is(attr, &cls_property_type)) return val_incref(attr);
  if (binds(attr)) return val_incref(attr);   /* a function, unbound */
  return cls_bind(attr, NULL, v);
}

int cls_setattr(Value *obj, const char *name, Value *v) {
  if (cls_is_instance(obj)) {
    Instance *o = (Instance *)obj;
    Value *attr = cls_find(o->cls, name, NULL);
    if (attr && cls_is(attr, &cls_property_type)) {
      Wrap *p = (Wrap *)attr;
      if (!p->b)
        return err_set(ERR_ATTRIBUTE, "property '%s' of '%s' object has no setter", name,
                       o->cls->name), -1;
      Value *r = val_call_n(p->b, 2, (Value *[]){obj, v});
      val_decref(r);
      return r ? 0 : -1;
    }
    if (cls_lib_frozen(o->cls))
      return err_set(ERR_ATTRIBUTE, "dataclasses.FrozenInstanceError: cannot assign to field "
                     "'%s'", name), -1;
    if (val_check_container(o->dict) < 0) return -1;
    return dict_set_str(o->dict, name, v);
  }
  if (cls_is_class(obj)) {
    if (val_check_container(((Class *)obj)->dict) < 0) return -1;
    return dict_set_str(((Class *)obj)->dict, name, v);
  }
  if (tuple_class(obj))
    return err_set(ERR_ATTRIBUTE, "can't set attribute '%s' of a named tuple", name), -1;
  return err_set(ERR_ATTRIBUTE, "'%s' object has no attribute '%s' (and none can be set)",
                 val_type_name(obj), name), -1;
}

/* ---- the class statement ------------------------------------------------- */

/* `__class__`, interned once (cls_register): the name the methods' scope
 * binds to their class, for super(). */
static const char *name_class;

/* The error for a base that is not a class statement's class. */
static int bad_base(Value *b) {
  Value *r = val_repr(b);
  if (r) err_set(ERR_TYPE, "a class's base must be a class, got %s", str_cstr(r));
  val_decref(r);
  return -1;
}

/* The one class among [bases] (object aside), into *[parent], or the
 * built-in exception class into *[exc]. */
static int pick_parent(int n, Value **bases, Class **parent, int *exc) {
  *parent = NULL;
  *exc = -1;
  for (int i = 0; i < n; i++) {
    if (bases[i] == cls_object) continue;
    int e = exc_class_index(bases[i]);
    if (e < 0 && !cls_is_class(bases[i])) return bad_base(bases[i]);
    if (*parent || *exc >= 0)
      return err_set(ERR_TYPE, "multiple inheritance is not supported in shmap (a second base, "
                     "'%s')", e >= 0 ? ((BoundMethod *)bases[i])->name
                                     : ((Class *)bases[i])->name), -1;
    if (e >= 0) *exc = e;
    else *parent = (Class *)bases[i];
  }
  return 0;
}

int cls_exc_base(Value *v) {
  if (cls_is_class(v)) return ((Class *)v)->exc;
  return cls_is_instance(v) ? ((Instance *)v)->cls->exc : -1;
}

/* The name a statement of a class body binds, or NULL. */
static const char *stmt_binds(const Node *s) {
  switch (s->kind) {
  case N_DEF: case N_CLASS: case N_SHARD_MAP: return s->name;
  case N_ANNASSIGN: return s->a->kind == N_NAME ? s->a->name : NULL;
  case N_ASSIGN:
    for (int i = 0; i < s->items.n; i++)
      if (s->items.items[i]->kind == N_NAME) return s->items.items[i]->name;
    return NULL;
  default: return NULL;
  }
}

typedef struct Collect {
  Value *dict;
  int rc;
} Collect;

static void collect_rest(const char *name, Value *v, void *ctx) {
  Collect *c = ctx;
  if (c->rc == 0 && !dict_get_str(c->dict, name)) c->rc = dict_set_str(c->dict, name, v);
}

/* The body's bindings as a dict, in the order the statements made them
 * (an enum's members and a dataclass's defaults keep it), then the rest. */
static Value *body_dict(Env *body, const NodeList *stmts) {
  Collect c = {dict_new(), 0};
  if (!c.dict) return NULL;
  for (int i = 0; c.rc == 0 && i < stmts->n; i++) {
    const char *name = stmt_binds(stmts->items[i]);
    Value *v = name ? env_lookup(body, name) : NULL;
    if (v && !dict_get_str(c.dict, name)) c.rc = dict_set_str(c.dict, name, v);
  }
  if (c.rc == 0) env_each(body, collect_rest, &c);
  if (c.rc < 0) {
    val_decref(c.dict);
    return NULL;
  }
  return c.dict;
}

/* Every class, by number (cls_id); classes are immortal, so the table
 * holds no references.  Any thread may define a class. */
static Class **registry;
static int nregistry, registry_cap;
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;

static int registry_add(Class *c) {
  pthread_mutex_lock(&registry_lock);
  int rc = 0;
  if (nregistry == registry_cap) {
    int cap = registry_cap ? registry_cap * 2 : 32;
    Class **grown = shm_realloc(registry, sizeof *grown * (size_t)cap);
    if (grown) {
      registry = grown;
      registry_cap = cap;
    } else {
      rc = -1;
    }
  }
  if (rc == 0) {
    c->id = nregistry;
    registry[nregistry++] = c;
  }
  pthread_mutex_unlock(&registry_lock);
  return rc < 0 ? (err_nomem(), -1) : 0;
}

int cls_id(const Value *cls) { return ((const Class *)cls)->id; }

Value *cls_from_id(int id) {
  pthread_mutex_lock(&registry_lock);
  Value *c = id >= 0 && id < nregistry ? &registry[id]->base.hdr : NULL;
  pthread_mutex_unlock(&registry_lock);
  return c;
}

Class *cls_alloc(const char *name, Class *parent, Value *dict) {
  Class *c = shm_calloc(1, sizeof *c);
  if (!c) return err_nomem();
  val_init(&c->base.hdr, V_OPAQUE);
  c->base.ot = &cls_class_type;
  c->parent = parent;
  c->name = shm_malloc(strlen(name) + 1);
  if (!c->name) {
    shm_free(c);
    return err_nomem();
  }
  strcpy(c->name, name);
  c->dict = val_incref(dict);
  c->instance_type = instance_type;
  c->instance_type.name = c->name;
  c->exc = parent ? parent->exc : -1;
  if (parent) c->flags = parent->flags & CLS_INHERITED;
  /* immortal: named tuples point at their class without a reference */
  val_make_static(&c->base.hdr);
  if (!(c->base.hdr.flags & VAL_IMMORTAL)) {
    val_decref(&c->base.hdr);
    return err_nomem();
  }
  return registry_add(c) < 0 ? NULL : c;
}

Value *cls_new(const char *name, int nbases, Value **bases, Env *body, Env *cell,
               const NodeList *stmts) {
  Class *parent;
  int exc;
  if (pick_parent(nbases, bases, &parent, &exc) < 0) return NULL;
  Value *dict = body_dict(body, stmts);
  Class *c = dict ? cls_alloc(name, parent, dict) : NULL;
  if (c && exc >= 0) c->exc = exc;
  val_decref(dict);
  env_clear(body);   /* the methods' closure: they see no class attribute, as in Python */
  if (!c) return NULL;
  if (env_set(cell, name_class, &c->base.hdr) < 0) return NULL;
  if (cls_lib_init_class(c) < 0) return NULL;
  return &c->base.hdr;
}

/* ---- calls --------------------------------------------------------------- */

/* Calls [fn] with [self] before the arguments [a]. */
Value *cls_call_with_self(Value *fn, Value *self, const CallArgs *a) {
  Value *inl[8], **args = a->nargs + 1 <= 8 ? inl : shm_malloc(sizeof(Value *) * (size_t)(a->nargs + 1));
  if (!args) return err_nomem();
  args[0] = self;
  for (int i = 0; i < a->nargs; i++) args[i + 1] = a->args[i];
  CallArgs b = *a;
  b.nargs = a->nargs + 1;
  b.args = args;
  Value *r = val_call(fn, &b);
  if (args != inl) shm_free(args);
  return r;
}

/* An exception's args: the constructor's arguments, as BaseException
 * keeps them (str(e) shows them); also super().__init__(msg). */
static int set_exc_args(Value *o, const CallArgs *a) {
  if (a->nkw) return err_set(ERR_TYPE, "%s() takes no keyword arguments", val_type_name(o)), -1;
  Value *args = tuple_pack((size_t)a->nargs, a->args);
  int rc = args ? dict_set_str(((Instance *)o)->dict, "args", args) : -1;
  val_decref(args);
  return rc;
}

static Value *exc_base_init(Value *self, const CallArgs *a) {
  return set_exc_args(self, a) < 0 ? NULL : VAL_NONE;
}

/* Runs [c]'s __init__ on the new instance [o]: the user's (a method of
 * [c] or a base), or the generated one of a dataclass. */
static int run_init(Class *c, Value *o, const CallArgs *a) {
  if (c->exc >= 0 && set_exc_args(o, a) < 0) return -1;
  for (Class *k = c; k; k = k->parent) {
    Value *init = dict_get_str(k->dict, "__init__");
    if (init) {
      Value *r = cls_call_with_self(init, o, a);
      if (r && r != VAL_NONE) {
        val_decref(r);
        return err_set(ERR_TYPE, "__init__() should return None"), -1;
      }
      return r ? 0 : -1;
    }
    if (cls_lib_has_init(k)) return cls_lib_init(k, o, a);
  }
  if (c->exc < 0 && (a->nargs || a->nkw))
    return err_set(ERR_TYPE, "%s() takes no arguments", c->name), -1;
  return 0;
}

static Value *class_call(Class *c, const CallArgs *a) {
  Value *lib = cls_lib_construct(c, a);
  if (lib != CLS_DECLINED) return lib;
  Value *o = cls_instance_new(c);
  if (o && run_init(c, o, a) < 0) {
    val_decref(o);
    return NULL;
  }
  return o;
}

/* The opaque types of higher layers that are callable (cls_register_call). */
enum { MAX_CALLABLES = 8 };
static struct {
  const OpaqueType *ot;
  Value *(*call)(Value *self, const CallArgs *a);
} callables[MAX_CALLABLES];
static int ncallables;

void cls_register_call(const OpaqueType *ot, Value *(*call)(Value *self, const CallArgs *a)) {
  if (ncallables < MAX_CALLABLES) callables[ncallables++] = (typeof(callables[0])){ot, call};
}

static Value *cls_call(Value *f, const CallArgs *a) {
  const OpaqueType *ot = ((Opaque *)f)->ot;
  Wrap *w = (Wrap *)f;
  if (ot == &cls_class_type) return class_call((Class *)f, a);
  if (ot == &cls_method_type) return cls_call_with_self(w->a, w->b, a);
  if (ot == &cls_staticmethod_type) return val_call(w->a, a);
  if (cls_is_instance(f)) {
    Value *c = cls_find(((Instance *)f)->cls, "__call__", NULL);
    if (c && binds(c)) return cls_call_with_self(c, f, a);
    return err_set(ERR_TYPE, "'%s' object is not callable", ((Instance *)f)->cls->name);
  }
  for (int i = 0; i < ncallables; i++)
    if (callables[i].ot == ot) return callables[i].call(f, a);
  return err_set(ERR_TYPE, "'%s' object is not callable", ot->name);
}

bool cls_callable(const Value *f) {
  const OpaqueType *ot = ((const Opaque *)f)->ot;
  if (ot == &cls_class_type || ot == &cls_method_type || ot == &cls_staticmethod_type) return true;
  if (cls_is_instance(f)) return cls_find(((const Instance *)f)->cls, "__call__", NULL) != NULL;
  for (int i = 0; i < ncallables; i++)
    if (callables[i].ot == ot) return true;
  return false;
}

/* ---- printing, equality, hashing ---------------------------------------- */

/* Calls the dunder [name] of [self] (an instance or a named tuple) when its
 * class, or a base, defines it: *[found] says whether it did. */
Value *cls_call_dunder(Value *self, const char *name, int n, Value **args, bool *found) {
  Class *c = (Class *)cls_class_of(self);
  Value *m = c ? cls_find(c, name, NULL) : NULL;
  *found = m && binds(m);
  if (!*found) return NULL;
  CallArgs a = {.nargs = n, .args = args};
  return cls_call_with_self(m, self, &a);
}

/* A dunder's result that must be a str. */
static Value *str_result(Value *r, const char *name) {
  if (r && r->type != V_STR) {
    val_decref(r);
    return err_set(ERR_TYPE, "%s returned non-string (type %s)", name, val_type_name(r));
  }
  return r;
}

/* An exception's str: its one argument's, none's '', else the tuple's. */
static Value *exc_str(Value *v) {
  Value *args = dict_get_str(((Instance *)v)->dict, "args");
  if (!args || args->type != V_TUPLE || tuple_len(args) == 0) return str_from("");
  return tuple_len(args) == 1 ? val_str(tuple_get(args, 0)) : val_repr(args);
}

static Value *instance_repr(Value *v) {
  bool found;
  Value *r = cls_call_dunder(v, "__repr__", 0, NULL, &found);
  if (found) return str_result(r, "__repr__");
  Value *lib = cls_lib_repr(v);
  if (lib != CLS_DECLINED) return lib;
  Instance *o = (Instance *)v;
  Value *args = o->cls->exc >= 0 ? dict_get_str(o->dict, "args") : NULL;
  if (args && args->type == V_TUPLE) {   /* MyError('msg'), as BaseException's repr */
    Value *ar = tuple_len(args) == 1 ? val_repr(tuple_get(args, 0)) : val_repr(args);
    Value *s = ar ? str_printf(tuple_len(args) == 1 ? "%s(%s)" : "%s%s", o->cls->name, str_cstr(ar))
                  : NULL;
    val_decref(ar);
    return s;
  }
  return str_printf("<%s object>", o->cls->name);
}

static Value *instance_str(Value *v) {
  bool found;
  Value *r = cls_call_dunder(v, "__str__", 0, NULL, &found);
  if (found) return str_result(r, "__str__");
  Value *lib = cls_lib_str(v);
  if (lib != CLS_DECLINED) return lib;
  return ((Instance *)v)->cls->exc >= 0 ? exc_str(v) : instance_repr(v);
}

static Value *named_repr(Value *v) {
  bool found;
  Value *r = cls_call_dunder(v, "__repr__", 0, NULL, &found);
  return found ? str_result(r, "__repr__") : cls_lib_repr(v);
}

/* ==, for an instance of a user class on either side: the user's __eq__,
 * a dataclass's fields, else identity.  1, 0, -1 with the error set, or
 * CLS_NOT_MINE when neither value is an instance. */
int cls_equal(Value *a, Value *b) {
  if (!cls_is_instance(a) && !cls_is_instance(b)) return CLS_NOT_MINE;
  Value *self = cls_is_instance(a) ? a : b, *other = self == a ? b : a;
  bool found;
  Value *r = cls_call_dunder(self, "__eq__", 1, &other, &found);
  if (found) {
    int t = r ? val_truth(r) : -1;
    val_decref(r);
    return t;
  }
  int lib = cls_lib_equal(a, b);
  return lib != CLS_NOT_MINE ? lib : a == b;
}

static bool key_equal(Value *a, Value *b) {
  if (a == b) return true;   /* Python's default: identity */
  int eq = cls_equal(a, b);
  if (eq < 0) err_clear();   /* a key that cannot be compared: not this one */
  return eq == 1;
}

static bool key_hash(Value *v, uint64_t *h) {
  if (cls_is_class(v)) {
    *h = (uint64_t)(uintptr_t)v >> 4;
    return true;
  }
  if (!cls_is_instance(v)) {   /* another C type's object: by identity, as object.__hash__ */
    *h = (uint64_t)(uintptr_t)v >> 4;
    return true;
  }
  bool found;
  Value *r = cls_call_dunder(v, "__hash__", 0, NULL, &found);
  if (found) {
    int64_t x = 0;
    bool ok = r && IS_ARRAY(r) && arr_to_index(r, &x) == 0;
    val_decref(r);
    if (!ok) err_clear();
    *h = (uint64_t)x;
    return ok;
  }
  if (cls_find(((Instance *)v)->cls, "__eq__", NULL)) return false;   /* Python: __hash__ = None */
  int lib = cls_lib_hash(v, h);
  if (lib != CLS_NOT_MINE) return lib == 1;
  *h = (uint64_t)(uintptr_t)v >> 4;
  return true;
}

/* ---- methods and descriptors --------------------------------------------- */

static Value *method_repr(Value *v) {
  Wrap *w = (Wrap *)v;
  Value *fr = val_repr(w->a), *sr = fr ? val_repr(w->b) : NULL;
  Value *r = sr ? str_printf("<bound method %s of %s>", str_cstr(fr), str_cstr(sr)) : NULL;
  val_decref(fr);
  val_decref(sr);
  return r;
}

/* prop.setter(f), prop.getter(f): a new property with that function. */
static Value *property_with(Value *self, const CallArgs *a, bool setter) {
  if (a->nargs != 1 || a->nkw) return err_set(ERR_TYPE, "property.%s() takes one function",
                                              setter ? "setter" : "getter");
  Wrap *p = (Wrap *)self;
  return cls_wrap_new(&cls_property_type, setter ? p->a : a->args[0],
                      setter ? a->args[0] : p->b, NULL);
}
static Value *property_setter(Value *self, const CallArgs *a) { return property_with(self, a, true); }
static Value *property_getter(Value *self, const CallArgs *a) { return property_with(self, a, false); }

static Value *property_getattr(Value *v, const char *name) {
  Wrap *p = (Wrap *)v;
  if (!strcmp(name, "setter")) return bound_new("setter", property_setter, v);
  if (!strcmp(name, "getter")) return bound_new("getter", property_getter, v);
  if (!strcmp(name, "fget")) return val_incref(p->a ? p->a : VAL_NONE);
  if (!strcmp(name, "fset")) return val_incref(p->b ? p->b : VAL_NONE);
  return err_set(ERR_ATTRIBUTE, "'property' object has no attribute '%s'", name);
}

/* super(): the attributes of the bases of the class that defines the
 * running method, bound to its first argument. */
static Value *super_getattr(Value *v, const char *name) {
  Wrap *s = (Wrap *)v;
  Class *start = ((Class *)s->a)->parent;
  Value *attr = cls_find(start, name, NULL);
  bool of_class = cls_is_class(s->b);   /* super() in a classmethod */
  if (attr) return cls_bind(attr, of_class ? NULL : s->b, of_class ? s->b : cls_class_of(s->b));
  if (!strcmp(name, "__init__") && ((Class *)s->a)->exc >= 0)
    return bound_new("__init__", exc_base_init, s->b);
  if (!strcmp(name, "__init__")) return val_incref(cls_object_init);
  return err_set(ERR_ATTRIBUTE, "'super' object has no attribute '%s'", name);
}

/* super(cls, obj): obj must be an instance of cls or a class derived
 * from it, as Python checks. */
static Value *super_new(Value *cls, Value *obj) {
  Value *k = cls_is_class(obj) ? obj : cls_class_of(obj);
  Class *c = k ? (Class *)k : NULL;
  while (c && &c->base.hdr != cls) c = c->parent;
  if (!c) return err_set(ERR_TYPE, "super(type, obj): obj must be an instance or subtype of type");
  return cls_wrap_new(&cls_super_type, cls, obj, NULL);
}

static Value *bi_super(const CallArgs *a) {
  if (a->nargs == 2 && !a->nkw) {
    if (!cls_is_class(a->args[0])) return err_set(ERR_TYPE, "super() argument 1 must be a class");
    return super_new(a->args[0], a->args[1]);
  }
  if (a->nargs || a->nkw) return err_set(ERR_TYPE, "super() takes no arguments or two");
  Frame *f = eval_current_frame();
  Value *cls = f ? env_lookup(f->env, name_class) : NULL;
  const Node *d = f ? f->def : NULL;
  if (!cls || !cls_is_class(cls) || !d || d->nparams < 1 || d->params[0].star ||
      d->params[0].starstar)
    return err_set(ERR_VALUE, "RuntimeError: super(): no arguments, outside a method of a "
                   "class");
  Value *self = env_lookup(f->env, d->params[0].name);
  if (!self) return err_set(ERR_VALUE, "RuntimeError: super(): its first argument is unbound");
  return super_new(cls, self);
}

/* object.__init__ as super().__init__() reaches it: takes nothing. */
static Value *bi_object_init(const CallArgs *a) {
  if (a->nargs || a->nkw) return err_set(ERR_TYPE, "object.__init__() takes no arguments");
  return VAL_NONE;
}

/* hash(obj): Python's, for dict keys: __hash__, a frozen dataclass's
 * fields, identity for other instances. */
static Value *bi_hash(const CallArgs *a) {
  Value *x;
  if (args_bind("hash", a, "obj", (Value **[]){&x}) < 0) return NULL;
  int64_t h = val_hash(x);
  return h < 0 ? NULL : val_int(h);
}

/* setattr(obj, name, value): obj.name = value. */
static Value *bi_setattr(const CallArgs *a) {
  Value *obj, *name, *v;
  if (args_bind("setattr", a, "obj, name, value", (Value **[]){&obj, &name, &v}) < 0) return NULL;
  if (name->type != V_STR) return err_set(ERR_TYPE, "attribute name must be string");
  return cls_setattr(obj, str_cstr(name), v) < 0 ? NULL : VAL_NONE;
}

static Value *wrapper_of(const char *what, const OpaqueType *ot, const CallArgs *a) {
  if (a->nargs != 1 || a->nkw) return err_set(ERR_TYPE, "%s() takes one argument", what);
  return cls_wrap_new(ot, a->args[0], NULL, NULL);
}
static Value *bi_staticmethod(const CallArgs *a) {
  return wrapper_of("staticmethod", &cls_staticmethod_type, a);
}
static Value *bi_classmethod(const CallArgs *a) {
  return wrapper_of("classmethod", &cls_classmethod_type, a);
}
static Value *bi_property(const CallArgs *a) {
  Value *fget = NULL, *fset = NULL;
  if (args_bind("property", a, "fget=, fset=", (Value **[]){&fget, &fset}) < 0) return NULL;
  return cls_wrap_new(&cls_property_type, fget, fset, NULL);
}

static Value *field_repr(Value *v) {
  Wrap *w = (Wrap *)v;
  return str_printf("Field(name=%s)", w->c && w->c->type == V_STR ? str_cstr(w->c) : "None");
}

static Value *field_getattr(Value *v, const char *name) {
  Wrap *w = (Wrap *)v;
  Value *x = !strcmp(name, "name") ? w->c : !strcmp(name, "default") ? w->a
           : !strcmp(name, "default_factory") ? w->b : !strcmp(name, "metadata") ? w->d
           : CLS_DECLINED;
  if (x == CLS_DECLINED) return err_set(ERR_ATTRIBUTE, "'Field' object has no attribute '%s'", name);
  return val_incref(x ? x : VAL_NONE);
}

/* ---- registration -------------------------------------------------------- */

Value *cls_object, *cls_object_init;

int cls_register(Env *b) {
  eval_register_call(V_OPAQUE, cls_call);
  val_register_key(V_OPAQUE, key_hash, key_equal);
  print_register(V_TUPLE, NULL, named_repr);
  Value *empty = dict_new();
  Class *obj = empty ? cls_alloc("object", NULL, empty) : NULL;
  val_decref(empty);
  if (!obj) return -1;
  cls_object = &obj->base.hdr;
  if (!(cls_object_init = builtin_new("__init__", bi_object_init, "object.__init__()")))
    return -1;
  static const struct {
    const char *name, *doc;
    BuiltinFn fn;
  } fns[] = {
      {"super", "super(): the bases' attributes, bound to the method's self", bi_super},
      {"property", "property(fget, fset=None): a computed attribute", bi_property},
      {"staticmethod", "staticmethod(f): a function in a class, not bound", bi_staticmethod},
      {"classmethod", "classmethod(f): a method bound to the class", bi_classmethod},
      {"hash", "hash(obj): the hash of a dict key", bi_hash},
      {"setattr", "setattr(obj, name, value): obj.name = value", bi_setattr},
  };
  const char *object = intern_cstr("object");
  if (!(name_class = intern_cstr("__class__")) || !object) return err_nomem(), -1;
  if (env_set(b, object, cls_object) < 0) return -1;
  for (size_t i = 0; i < sizeof fns / sizeof *fns; i++)
    if (builtins_add(b, fns[i].name, fns[i].fn, fns[i].doc) < 0) return -1;
  return cls_lib_register(b);
}
