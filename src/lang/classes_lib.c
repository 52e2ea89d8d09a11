/*
 * classes_lib.c - what Python's library builds on classes (classes.h):
 * dataclasses (semantics: the dataclasses module: fields from the class's
 * annotations, defaults, default_factory, frozen, replace, asdict),
 * enum.Enum (members from the class body, in order; auto()),
 * typing.NamedTuple and collections.namedtuple (instances are tuples,
 * value.h's VAL_NAMED), and jax.tree_util's registration of classes as
 * pytree nodes (register_pytree_node, register_pytree_node_class,
 * register_dataclass: JAX's semantics).
 */
#include <string.h>

#include "array/array.h"
#include "array/print.h"
#include "base/intern.h"
#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/classes_impl.h"
#include "lang/ops.h"

Value cls_declined = {.flags = VAL_IMMORTAL};

/* The markers a class derives from to be an enum or a named tuple. */
static Value *enum_base, *namedtuple_base;

/* The class that makes [c] a dataclass: [c] or its nearest base so made. */
static const Class *dataclass_of(const Class *c) {
  for (; c; c = c->parent)
    if (c->flags & CLS_DATACLASS) return c;
  return NULL;
}

bool cls_lib_frozen(const Class *c) {
  const Class *d = dataclass_of(c);
  return d && (d->flags & CLS_FROZEN);
}

/* ---- binding a call's arguments to fields ------------------------------- */

static int field_index(const Class *c, const char *name) {
  for (size_t i = 0; c->fields && i < tuple_len(c->fields); i++)
    if (!strcmp(str_cstr(tuple_get(c->fields, i)), name)) return (int)i;
  return -1;
}

/* A missing field's value: its default, or what its factory makes. */
static Value *field_default(const Class *c, Value *name) {
  Value *d = c->defaults ? dict_get(c->defaults, name) : NULL;
  if (d) return val_incref(d);
  Value *f = c->factories ? dict_get(c->factories, name) : NULL;
  if (f) return val_call_n(f, 0, NULL);
  return err_set(ERR_TYPE, "%s() missing required argument '%s'", c->name, str_cstr(name));
}

/* Field [i]'s FIELD_* options. */
static int field_options(const Class *c, size_t i) {
  Value *o = c->options ? dict_get(c->options, tuple_get(c->fields, i)) : NULL;
  return o ? (int)arr_get_i64(AS_ARRAY(o), 0) : 0;
}

static bool field_init(const Class *c, size_t i) { return !(field_options(c, i) & FIELD_NO_INIT); }

/* Binds [a] to [c]'s fields, as the generated __init__ (or a named
 * tuple's constructor) does: vals[i] gets a new reference for field i;
 * a field(init=False) takes no argument, its default or nothing (NULL).
 * 0, or -1 with the error set (and vals released). */
static int bind_fields(const Class *c, const CallArgs *a, Value **vals) {
  int n = (int)tuple_len(c->fields), ninit = 0, next = 0;
  memset(vals, 0, sizeof(Value *) * (size_t)n);
  for (int i = 0; i < n; i++) ninit += field_init(c, (size_t)i);
  if (a->nargs > ninit) {
    err_set(ERR_TYPE, "%s() takes %d positional argument%s but %d %s given", c->name, ninit,
            ninit == 1 ? "" : "s", a->nargs, a->nargs == 1 ? "was" : "were");
    return -1;
  }
  for (int k = 0; k < a->nargs; k++, next++) {
    while (!field_init(c, (size_t)next)) next++;
    vals[next] = val_incref(a->args[k]);
  }
  for (int k = 0; k < a->nkw; k++) {
    int i = field_index(c, a->kwnames[k]);
    if (i >= 0 && !field_init(c, (size_t)i)) i = -1;
    if (i < 0 || vals[i]) {
      err_set(ERR_TYPE, i < 0 ? "%s() got an unexpected keyword argument '%s'"
                              : "%s() got multiple values for argument '%s'",
              c->name, a->kwnames[k]);
      goto fail;
    }
    vals[i] = val_incref(a->kwvals[k]);
  }
  for (int i = 0; i < n; i++) {
    Value *name = tuple_get(c->fields, i);
    bool has = (c->defaults && dict_get(c->defaults, name)) || (c->factories && dict_get(c->factories, name));
    if (!vals[i] && (has || field_init(c, (size_t)i)) && !(vals[i] = field_default(c, name)))
      goto fail;
  }
  return 0;
fail:
  for (int i = 0; i < n; i++) val_decref(vals[i]);
  return -1;
}

/* ---- dataclasses --------------------------------------------------------- */

bool cls_lib_has_init(const Class *c) {
  return (c->flags & CLS_DATACLASS) && !(c->flags & CLS_NO_INIT);
}

int cls_lib_init(Class *c, Value *self, const CallArgs *a) {
  int n = (int)tuple_len(c->fields);
  Value **vals = shm_calloc((size_t)n + 1, sizeof *vals);
  if (!vals) return err_nomem(), -1;
  int rc = bind_fields(c, a, vals);
  for (int i = 0; i < n && rc == 0; i++)
    if (vals[i]) rc = dict_set(((Instance *)self)->dict, tuple_get(c->fields, i), vals[i]);
  for (int i = 0; rc == 0 && i < n; i++) val_decref(vals[i]);
  shm_free(vals);
  bool found;
  Value *r = rc == 0 ? cls_call_dunder(self, "__post_init__", 0, NULL, &found) : NULL;
  val_decref(r);
  return rc < 0 || (found && !r) ? -1 : 0;
}

/* Adds field [name] (a str) of default [dflt] or factory [fac] (either
 * NULL), [meta] and FIELD_* [opts] to the dataclass [c]'s tables. */
static int add_field(Class *c, Value *name, Value *dflt, Value *fac, Value *meta, int opts) {
  Value **tables[] = {&c->defaults, &c->factories, &c->metadata, &c->options};
  for (size_t i = 0; i < sizeof tables / sizeof *tables; i++) {
    if (!*tables[i] && !(*tables[i] = dict_new())) return -1;
    dict_del(*tables[i], name);
  }
  Value *o = opts ? val_int(opts) : NULL;
  int rc = opts && (!o || dict_set(c->options, name, o) < 0) ? -1 : 0;
  val_decref(o);
  if (rc < 0) return -1;
  if (dflt && dict_set(c->defaults, name, dflt) < 0) return -1;
  if (fac && dict_set(c->factories, name, fac) < 0) return -1;
  if (meta && dict_set(c->metadata, name, meta) < 0) return -1;
  if (field_index(c, str_cstr(name)) >= 0) return 0;
  size_t n = c->fields ? tuple_len(c->fields) : 0;
  Value *t = tuple_new(n + 1);
  if (!t) return -1;
  for (size_t i = 0; i < n; i++) tuple_set_steal(t, i, val_incref(tuple_get(c->fields, i)));
  tuple_set_steal(t, n, val_incref(name));
  val_decref(c->fields);
  c->fields = t;
  return 0;
}

/* Copies the fields of [from] (a dataclass base) into [c]. */
static int inherit_fields(Class *c, const Class *from) {
  for (size_t i = 0; from && from->fields && i < tuple_len(from->fields); i++) {
    Value *n = tuple_get(from->fields, i);
    if (add_field(c, n, from->defaults ? dict_get(from->defaults, n) : NULL,
                  from->factories ? dict_get(from->factories, n) : NULL,
                  from->metadata ? dict_get(from->metadata, n) : NULL, field_options(from, i)) < 0)
      return -1;
  }
  return 0;
}

/* One annotated name of the class body as a field: its class attribute
 * is its default, or a dataclasses.field() that says more. */
static int own_field(Class *c, Value *name) {
  Value *v = dict_get(c->dict, name), *dflt = v, *fac = NULL, *meta = NULL;
  int opts = 0;
  if (v && cls_is(v, &cls_field_type)) {
    Wrap *f = (Wrap *)v;
    dflt = f->a;
    fac = f->b;
    meta = f->d;
    opts = f->flags;
    val_decref(f->c);
    f->c = val_incref(name);
  }
  if (dflt && (dflt->type == V_LIST || dflt->type == V_DICT))
    return err_set(ERR_VALUE, "mutable default %s for field %s is not allowed: use "
                   "default_factory", val_type_name(dflt), str_cstr(name)), -1;
  int rc = add_field(c, name, dflt, fac, meta, opts);
  if (rc == 0 && v && cls_is(v, &cls_field_type)) {
    if (dflt) rc = dict_set(c->dict, name, dflt);   /* the class attribute is the default */
    else dict_del(c->dict, name);
  }
  return rc;
}

/* The annotated names of [c]'s own body, in order (a dict), or NULL. */
static Value *annotations(const Class *c) {
  Value *a = dict_get_str(c->dict, "__annotations__");
  return a && a->type == V_DICT ? a : NULL;
}

/* Whether annotated name [i] of [ann] is a field: not a ClassVar. */
static bool annotated_field(Dict *ann, size_t i) {
  Value *v = ann->vals[i];
  return !(v->type == V_STR && !strcmp(str_cstr(v), "ClassVar"));
}

/* A field without a default after one with: Python's TypeError. */
static int check_default_order(const Class *c) {
  bool seen = false;
  for (size_t i = 0; c->fields && i < tuple_len(c->fields); i++) {
    Value *n = tuple_get(c->fields, i);
    if (!field_init(c, i)) continue;
    bool has = (c->defaults && dict_get(c->defaults, n)) || (c->factories && dict_get(c->factories, n));
    if (seen && !has)
      return err_set(ERR_TYPE, "non-default argument '%s' follows default argument",
                     str_cstr(n)), -1;
    seen = seen || has;
  }
  return 0;
}

/* Collects [c]'s fields: its bases', then its own annotated names. */
static int collect_fields(Class *c, const Class *base) {
  if (inherit_fields(c, base) < 0) return -1;
  Dict *ann = (Dict *)annotations(c);
  for (size_t i = 0; ann && i < ann->len; i++)
    if (annotated_field(ann, i) && own_field(c, ann->keys[i]) < 0) return -1;
  if (!c->fields && !(c->fields = tuple_new(0))) return -1;
  return check_default_order(c);
}

static Value *make_dataclass(Value *cls, unsigned flags) {
  if (!cls_is_class(cls))
    return err_set(ERR_TYPE, "dataclass() should be applied to a class, not %s",
                   val_type_name(cls));
  Class *c = (Class *)cls;
  if (c->flags & (CLS_ENUM | CLS_NAMEDTUPLE))
    return err_set(ERR_TYPE, "dataclass() of an enum or a named tuple is not supported");
  c->flags |= CLS_DATACLASS | flags;
  if (collect_fields(c, dataclass_of(c->parent)) < 0) return NULL;
  return val_incref(cls);
}

/* dataclass(cls) or dataclass(*, init, repr, eq, frozen)(cls). */
static Value *dataclass_with(Value *self, const CallArgs *a) {
  if (a->nargs != 1 || a->nkw) return err_set(ERR_TYPE, "dataclass() takes the class");
  return make_dataclass(a->args[0], (unsigned)arr_get_i64(AS_ARRAY(self), 0));
}

static int flag_of(Value *v, bool dflt, unsigned bit, unsigned *flags) {
  int t = v ? val_truth(v) : dflt;
  if (t < 0) return -1;
  if (t != dflt) *flags |= bit;
  return 0;
}

static Value *bi_dataclass(const CallArgs *a) {
  Value *cls = NULL, *init = NULL, *repr = NULL, *eq = NULL, *frozen = NULL;
  if (args_bind("dataclass", a, "cls=, init=, repr=, eq=, frozen=",
                (Value **[]){&cls, &init, &repr, &eq, &frozen}) < 0)
    return NULL;
  unsigned flags = 0;
  if (flag_of(init, true, CLS_NO_INIT, &flags) < 0 || flag_of(repr, true, CLS_NO_REPR, &flags) < 0 ||
      flag_of(eq, true, CLS_NO_EQ, &flags) < 0 || flag_of(frozen, false, CLS_FROZEN, &flags) < 0)
    return NULL;
  if (cls && cls != VAL_NONE) return make_dataclass(cls, flags);
  Value *f = val_int(flags);
  Value *d = f ? bound_new("dataclass", dataclass_with, f) : NULL;
  val_decref(f);
  return d;
}

static Value *bi_field(const CallArgs *a) {
  Value *dflt = NULL, *fac = NULL, *meta = NULL, *init = NULL, *repr = NULL;
  if (args_bind("field", a, "default=, default_factory=, metadata=, init=, repr=",
                (Value **[]){&dflt, &fac, &meta, &init, &repr}) < 0)
    return NULL;
  if (a->nargs) return err_set(ERR_TYPE, "field() takes keyword arguments only");
  if (dflt && fac) return err_set(ERR_VALUE, "cannot specify both default and default_factory");
  int in_init = init ? val_truth(init) : 1, in_repr = repr ? val_truth(repr) : 1;
  if (in_init < 0 || in_repr < 0) return NULL;
  Value *f = cls_wrap_new(&cls_field_type, dflt, fac, NULL);
  if (f && meta && meta != VAL_NONE) ((Wrap *)f)->d = val_incref(meta);
  if (f) ((Wrap *)f)->flags = (in_init ? 0 : FIELD_NO_INIT) | (in_repr ? 0 : FIELD_NO_REPR);
  return f;
}

/* The dataclass [x] is an instance of, or [x] itself when a class. */
static const Class *dataclass_arg(Value *x, const char *fn) {
  Value *k = cls_is_class(x) ? x : cls_class_of(x);
  const Class *d = k && !tuple_class(x) ? dataclass_of((Class *)k) : NULL;
  if (!d) err_set(ERR_TYPE, "%s() should be called on dataclass instances", fn);
  return d;
}

static Value *bi_fields(const CallArgs *a) {
  Value *x;
  if (args_bind("fields", a, "class_or_instance", (Value **[]){&x}) < 0) return NULL;
  const Class *d = dataclass_arg(x, "fields");
  size_t n = d ? tuple_len(d->fields) : 0;
  Value *t = d ? tuple_new(n) : NULL;
  for (size_t i = 0; t && i < n; i++) {
    Value *name = tuple_get(d->fields, i);
    Value *f = cls_wrap_new(&cls_field_type, d->defaults ? dict_get(d->defaults, name) : NULL,
                            d->factories ? dict_get(d->factories, name) : NULL, name);
    Value *meta = f && d->metadata ? dict_get(d->metadata, name) : NULL;
    if (meta) ((Wrap *)f)->d = val_incref(meta);
    tuple_set_steal(t, i, f);
  }
  if (t && !tuple_complete(t)) {
    val_decref(t);
    return NULL;
  }
  return t;
}

static Value *asdict_of(Value *x, int depth);

/* The items of a list or tuple [x], each through asdict_of. */
static Value *asdict_seq(Value *x, int depth) {
  size_t n;
  Value *const *items;
  val_seq(x, &n, &items);
  Value *r = x->type == V_TUPLE ? tuple_new_like(x, n) : list_new(n);
  for (size_t i = 0; r && i < n; i++) {
    Value *v = asdict_of(items[i], depth + 1);
    if (x->type == V_TUPLE) tuple_set_steal(r, i, v);
    else if (v && list_append_steal(r, v) < 0) v = NULL;
    if (!v) {
      val_decref(r);
      return NULL;
    }
  }
  return r;
}

/* asdict's copy of [x]: dataclass instances become dicts, at any depth
 * of lists, tuples and dicts. */
static Value *asdict_of(Value *x, int depth) {
  if (depth > 1000) return err_set(ERR_VALUE, "maximum recursion depth exceeded in asdict()");
  if (x->type == V_LIST || x->type == V_TUPLE) return asdict_seq(x, depth);
  bool dict = x->type == V_DICT;
  const Class *d = cls_is_instance(x) ? dataclass_of(((Instance *)x)->cls) : NULL;
  if (!dict && !d) return val_incref(x);
  Dict *src = dict ? (Dict *)x : (Dict *)((Instance *)x)->dict;
  Value *r = dict_new();
  size_t n = dict ? src->len : tuple_len(d->fields);
  for (size_t i = 0; r && i < n; i++) {
    Value *k = dict ? src->keys[i] : tuple_get(d->fields, i);
    Value *item = dict ? src->vals[i] : dict_get(&src->hdr, k);
    Value *v = item ? asdict_of(item, depth + 1) : val_incref(VAL_NONE);
    if (!v || dict_set(r, k, v) < 0) {
      val_decref(v);
      val_decref(r);
      return NULL;
    }
    val_decref(v);
  }
  return r;
}

static Value *bi_asdict(const CallArgs *a) {
  Value *x;
  if (args_bind("asdict", a, "obj", (Value **[]){&x}) < 0) return NULL;
  if (!cls_is_instance(x) || !dataclass_arg(x, "asdict")) {
    if (!err_occurred()) err_set(ERR_TYPE, "asdict() should be called on dataclass instances");
    return NULL;
  }
  return asdict_of(x, 0);
}

/* A new instance of [x]'s class, its fields [x]'s but for the keyword
 * arguments of [a]: dataclasses.replace, a named tuple's _replace. */
static Value *replace_fields(Value *x, const Class *c, const CallArgs *a) {
  size_t n = tuple_len(c->fields);
  Value **vals = shm_calloc(n + 1, sizeof *vals);
  const char **names = shm_calloc(n + 1, sizeof *names);
  Value *r = NULL;
  if (!vals || !names) goto out;
  for (int k = 0; k < a->nkw; k++)
    if (field_index(c, a->kwnames[k]) < 0) {
      err_set(ERR_TYPE, "%s.__init__() got an unexpected keyword argument '%s'", c->name,
              a->kwnames[k]);
      goto out;
    }
  size_t m = 0;   /* the init fields, by name */
  for (size_t i = 0; i < n; i++) {
    if (!field_init(c, i)) continue;
    if (!(names[m] = intern_cstr(str_cstr(tuple_get(c->fields, i))))) {
      err_nomem();
      goto out;
    }
    vals[m] = tuple_class(x) ? tuple_get(x, i) : dict_get(((Instance *)x)->dict, tuple_get(c->fields, i));
    for (int k = 0; k < a->nkw; k++)
      if (!strcmp(a->kwnames[k], names[m])) vals[m] = a->kwvals[k];
    if (!vals[m]) {
      err_set(ERR_ATTRIBUTE, "'%s' object has no attribute '%s'", c->name, names[m]);
      goto out;
    }
    m++;
  }
  CallArgs b = {.nkw = (int)m, .kwnames = names, .kwvals = vals};
  r = val_call((Value *)&c->base.hdr, &b);
out:
  if (!vals || !names) err_nomem();
  shm_free(vals);
  shm_free(names);
  return r;
}

static Value *bi_replace(const CallArgs *a) {
  if (a->nargs != 1) return err_set(ERR_TYPE, "replace() takes the instance, then keywords");
  const Class *d = cls_is_instance(a->args[0]) ? dataclass_arg(a->args[0], "replace")
                                                          : NULL;
  if (!d) {
    if (!err_occurred()) err_set(ERR_TYPE, "replace() should be called on dataclass instances");
    return NULL;
  }
  CallArgs kw = {.nkw = a->nkw, .kwnames = a->kwnames, .kwvals = a->kwvals};
  Value *r = replace_fields(a->args[0], d, &kw);
  return r;
}

static Value *bi_is_dataclass(const CallArgs *a) {
  Value *x;
  if (args_bind("is_dataclass", a, "obj", (Value **[]){&x}) < 0) return NULL;
  Value *k = cls_is_class(x) ? x : cls_class_of(x);
  return val_bool(k && !tuple_class(x) && dataclass_of((Class *)k));
}

/* A dataclass's or named tuple's repr: Name(field=repr, ...), [name]
 * the instance's class's, the fields [c]'s but field(repr=False) ones. */
static Value *fields_repr(const char *name, const Class *c, Value *const *vals) {
  StrBuf b = {0};
  sbuf_printf(&b, "%s(", name);
  bool first = true;
  for (size_t i = 0; i < tuple_len(c->fields); i++) {
    if (field_options(c, i) & FIELD_NO_REPR) continue;
    Value *r = vals[i] ? val_repr(vals[i]) : str_from("<unset>");
    if (!r) {
      sbuf_free(&b);
      return NULL;
    }
    sbuf_printf(&b, "%s%s=%s", first ? "" : ", ", str_cstr(tuple_get(c->fields, i)), str_cstr(r));
    first = false;
    val_decref(r);
  }
  sbuf_printf(&b, ")");
  return str_take(&b);
}

/* The field values of dataclass instance [x] (borrowed; NULL: unset). */
static Value **instance_fields(Value *x, const Class *d) {
  size_t n = tuple_len(d->fields);
  Value **vals = shm_calloc(n + 1, sizeof *vals);
  if (!vals) return err_nomem();
  for (size_t i = 0; i < n; i++) vals[i] = dict_get(((Instance *)x)->dict, tuple_get(d->fields, i));
  return vals;
}

/* ---- enum ----------------------------------------------------------------- */

/* enum.auto(): the next member's value, one more than the last int. */
static const OpaqueType auto_type = {"auto", NULL, NULL, NULL, NULL, NULL, NULL};

static Value *bi_auto(const CallArgs *a) {
  if (a->nargs || a->nkw) return err_set(ERR_TYPE, "auto() takes no arguments");
  Opaque *o = shm_calloc(1, sizeof *o);
  if (!o) return err_nomem();
  val_init(&o->hdr, V_OPAQUE);
  o->ot = &auto_type;
  return &o->hdr;
}

/* Whether class attribute [v] named [name] is a member, not a method or
 * a private name. */
static bool is_member(const char *name, Value *v) {
  if (name[0] == '_') return false;
  if (v->type == V_FUNC || v->type == V_JITFN || v->type == V_BUILTIN) return false;
  return !cls_is(v, &cls_property_type) && !cls_is(v, &cls_staticmethod_type) &&
         !cls_is(v, &cls_classmethod_type);
}

/* The member of [c] whose value equals [v] (borrowed), or NULL. */
static Value *member_by_value(const Class *c, Value *v) {
  for (size_t i = 0; c->members && i < list_len(c->members); i++) {
    Value *m = list_get(c->members, i);
    Value *eq = ops_compare(OP_EQ, dict_get_str(((Instance *)m)->dict, "value"), v);
    int t = eq ? val_truth(eq) : -1;
    val_decref(eq);
    if (t < 0) err_clear();
    if (t == 1) return m;
  }
  return NULL;
}

/* One member [name] = [v] of enum [c]: a new instance, or the member of
 * the same value (an alias, as Python makes it). */
static int add_member(Class *c, Value *name, Value *v, int64_t *last) {
  Value *val = cls_is(v, &auto_type) ? val_int(*last + 1) : val_incref(v);
  if (!val) return -1;
  int64_t iv;
  if (IS_ARRAY(val) && dt_is_int(AS_ARRAY(val)->dtype) && AS_ARRAY(val)->ndim == 0 &&
      arr_to_index(val, &iv) == 0)
    *last = iv;
  err_clear();
  Value *alias = member_by_value(c, val);
  Value *m = alias ? val_incref(alias) : cls_instance_new(c);
  int rc = m ? 0 : -1;
  if (rc == 0 && !alias)
    rc = dict_set_str(((Instance *)m)->dict, "name", name) < 0 ||
         dict_set_str(((Instance *)m)->dict, "value", val) < 0 || list_append(c->members, m) < 0
             ? -1 : 0;
  if (rc == 0) rc = dict_set(c->dict, name, m);
  val_decref(val);
  val_decref(m);
  return rc;
}

static int make_members(Class *c) {
  if (!(c->members = list_new(4))) return -1;
  Dict *d = (Dict *)c->dict;
  int64_t last = 0;
  size_t n = d->len;   /* add_member replaces values, never adds keys */
  for (size_t i = 0; i < n; i++)
    if (is_member(str_cstr(d->keys[i]), d->vals[i]) &&
        add_member(c, d->keys[i], d->vals[i], &last) < 0)
      return -1;
  return 0;
}

Value *cls_iter_items(Value *v) {
  if (!((Class *)v)->members) return err_set(ERR_TYPE, "'type' object is not iterable");
  Value *m = ((Class *)v)->members;
  Value *l = list_new(list_len(m));
  for (size_t i = 0; l && i < list_len(m); i++)
    if (list_append(l, list_get(m, i)) < 0) {
      val_decref(l);
      return NULL;
    }
  return l;
}

Value *cls_getitem(Value *obj, Value *key) {
  Class *c = (Class *)obj;
  if (!c->members) return err_set(ERR_TYPE, "type '%s' is not subscriptable", c->name);
  Value *m = key->type == V_STR ? dict_get(c->dict, key) : NULL;
  if (m && cls_is_instance(m) && ((Instance *)m)->cls == c) return val_incref(m);
  Value *r = val_repr(key);
  if (r) err_set(ERR_INDEX, "KeyError: %s", str_cstr(r));
  val_decref(r);
  return NULL;
}

static Value *enum_lookup(const Class *c, const CallArgs *a) {
  if (a->nargs != 1 || a->nkw) return err_set(ERR_TYPE, "%s() takes one value", c->name);
  Value *m = member_by_value(c, a->args[0]);
  if (m) return val_incref(m);
  Value *r = val_repr(a->args[0]);
  if (r) err_set(ERR_VALUE, "%s is not a valid %s", str_cstr(r), c->name);
  val_decref(r);
  return NULL;
}

/* ---- named tuples ----------------------------------------------------------- */

/* The fields of a typing.NamedTuple class body: its annotated names, the
 * class attributes of the same names their defaults. */
static int namedtuple_fields(Class *c) {
  Dict *ann = (Dict *)annotations(c);
  for (size_t i = 0; ann && i < ann->len; i++) {
    if (!annotated_field(ann, i)) continue;
    Value *name = ann->keys[i], *dflt = dict_get(c->dict, name);
    if (add_field(c, name, dflt, NULL, NULL, 0) < 0) return -1;
    if (dflt) dict_del(c->dict, name);   /* the field, not the default, is the attribute */
  }
  if (!c->fields && !(c->fields = tuple_new(0))) return -1;
  return check_default_order(c);
}

static Value *namedtuple_make(Class *c, const CallArgs *a) {
  size_t n = tuple_len(c->fields);
  Value **vals = shm_calloc(n + 1, sizeof *vals);
  if (!vals) return err_nomem();
  Value *t = bind_fields(c, a, vals) == 0 ? tuple_new_named(n, &c->base.hdr) : NULL;
  for (size_t i = 0; i < n; i++)
    if (t) tuple_set_steal(t, i, vals[i]);
    else val_decref(vals[i]);
  shm_free(vals);
  return t;
}

static Value *nt_replace(Value *self, const CallArgs *a) {
  if (a->nargs) return err_set(ERR_TYPE, "_replace() takes keyword arguments only");
  Class *c = (Class *)tuple_class(self);
  for (int k = 0; k < a->nkw; k++)
    if (field_index(c, a->kwnames[k]) < 0)
      return err_set(ERR_VALUE, "Got unexpected field names: ['%s']", a->kwnames[k]);
  return replace_fields(self, c, a);
}

static Value *nt_asdict(Value *self, const CallArgs *a) {
  if (a->nargs || a->nkw) return err_set(ERR_TYPE, "_asdict() takes no arguments");
  Class *c = (Class *)tuple_class(self);
  Value *d = dict_new();
  for (size_t i = 0; d && i < tuple_len(self); i++)
    if (dict_set(d, tuple_get(c->fields, i), tuple_get(self, i)) < 0) {
      val_decref(d);
      return NULL;
    }
  return d;
}

Value *cls_getattr(Value *obj, const char *name) {
  Class *c = (Class *)tuple_class(obj);
  int i = field_index(c, name);
  if (i >= 0) return val_incref(tuple_get(obj, (size_t)i));
  if (!strcmp(name, "_replace")) return bound_new("_replace", nt_replace, obj);
  if (!strcmp(name, "_asdict")) return bound_new("_asdict", nt_asdict, obj);
  if (!strcmp(name, "__class__")) return val_incref(&c->base.hdr);
  Value *lib = cls_lib_class_attr(c, name);
  if (lib != CLS_DECLINED) return lib;
  return cls_class_attr(obj, c, NULL, name);
}

/* collections.namedtuple(typename, field_names, *, defaults=None): the
 * names a list of str or one str split at commas and spaces. */
static int split_names(Value *spec, Value **out) {
  if (spec->type != V_STR) {
    size_t n;
    Value *const *items;
    if (!val_seq(spec, &n, &items))
      return err_set(ERR_TYPE, "namedtuple() field_names must be a str or a list of str"), -1;
    for (size_t i = 0; i < n; i++)
      if (items[i]->type != V_STR)
        return err_set(ERR_TYPE, "namedtuple() field names must be str"), -1;
    *out = tuple_pack(n, items);
    return *out ? 0 : -1;
  }
  Value *l = list_new(4);
  const char *s = str_cstr(spec);
  while (l && *s) {
    size_t k = strcspn(s, ", ");
    if (k && list_append_steal(l, str_new(s, k)) < 0) break;
    s += k;
    s += strspn(s, ", ");
  }
  *out = l && !*s ? tuple_pack(list_len(l), ((List *)l)->items) : NULL;
  val_decref(l);
  return *out ? 0 : -1;
}

static Value *bi_namedtuple(const CallArgs *a) {
  Value *tname, *spec, *defaults = NULL;
  if (args_bind("namedtuple", a, "typename, field_names, defaults=",
                (Value **[]){&tname, &spec, &defaults}) < 0)
    return NULL;
  if (tname->type != V_STR) return err_set(ERR_TYPE, "namedtuple() typename must be a str");
  Value *names, *dict = dict_new();
  Class *c = dict && split_names(spec, &names) == 0 ? cls_alloc(str_cstr(tname), NULL, dict) : NULL;
  val_decref(dict);
  if (!c) return NULL;
  c->flags |= CLS_NAMEDTUPLE;
  size_t nd = 0, nf = tuple_len(names);
  Value *const *ds = NULL;
  if (defaults && defaults != VAL_NONE && !val_seq(defaults, &nd, &ds))
    return err_set(ERR_TYPE, "namedtuple() defaults must be a list or tuple");
  if (nd > nf) return err_set(ERR_TYPE, "Got more default values than field names");
  int rc = 0;
  for (size_t i = 0; rc == 0 && i < nf; i++)
    rc = add_field(c, tuple_get(names, i), i >= nf - nd ? ds[i - (nf - nd)] : NULL, NULL, NULL, 0);
  val_decref(names);
  if (rc == 0 && !c->fields) rc = (c->fields = tuple_new(0)) ? 0 : -1;
  return rc < 0 ? NULL : &c->base.hdr;
}

/* ---- what classes.c asks ---------------------------------------------------- */

int cls_lib_init_class(Class *c) {
  Class *p = c->parent;
  if ((c->flags & CLS_NAMEDTUPLE) && p && &p->base.hdr == namedtuple_base) return namedtuple_fields(c);
  if (c->flags & CLS_NAMEDTUPLE) return inherit_fields(c, p);
  if ((c->flags & CLS_ENUM) && p && p->members && list_len(p->members))
    return err_set(ERR_TYPE, "%s: cannot extend enumeration '%s'", c->name, p->name), -1;
  if (c->flags & CLS_ENUM) return make_members(c);
  return 0;
}

Value *cls_lib_class_attr(Class *c, const char *name) {
  if ((c->flags & CLS_NAMEDTUPLE) && !strcmp(name, "_fields") && c->fields)
    return val_incref(c->fields);
  if ((c->flags & CLS_NAMEDTUPLE) && !strcmp(name, "_field_defaults") && c->fields)
    return c->defaults ? val_incref(c->defaults) : dict_new();
  if ((c->flags & CLS_ENUM) && !strcmp(name, "__members__") && c->members) {
    Value *d = dict_new();
    for (size_t i = 0; d && i < list_len(c->members); i++) {
      Value *m = list_get(c->members, i);
      if (dict_set(d, dict_get_str(((Instance *)m)->dict, "name"), m) < 0) {
        val_decref(d);
        return NULL;
      }
    }
    return d;
  }
  return CLS_DECLINED;
}

Value *cls_lib_construct(Class *c, const CallArgs *a) {
  if ((c->flags & CLS_NAMEDTUPLE) && c->fields) return namedtuple_make(c, a);
  if (c->members) return enum_lookup(c, a);
  if (&c->base.hdr == enum_base || &c->base.hdr == namedtuple_base)
    return err_set(ERR_TYPE, "%s() cannot be called: derive a class from it", c->name);
  return CLS_DECLINED;
}

Value *cls_lib_repr(Value *v) {
  if (tuple_class(v)) {
    Class *c = (Class *)tuple_class(v);
    return fields_repr(c->name, c, ((Tuple *)v)->items);
  }
  Instance *o = (Instance *)v;
  if (o->cls->members) {
    Value *r = val_repr(dict_get_str(o->dict, "value"));
    Value *s = r ? str_printf("<%s.%s: %s>", o->cls->name,
                              str_cstr(dict_get_str(o->dict, "name")), str_cstr(r)) : NULL;
    val_decref(r);
    return s;
  }
  const Class *d = dataclass_of(o->cls);
  if (!d || (d->flags & CLS_NO_REPR)) return CLS_DECLINED;
  Value **vals = instance_fields(v, d);
  Value *r = vals ? fields_repr(o->cls->name, d, vals) : NULL;
  shm_free(vals);
  return r;
}

Value *cls_lib_str(Value *v) {
  Instance *o = (Instance *)v;
  if (!o->cls->members) return CLS_DECLINED;
  return str_printf("%s.%s", o->cls->name, str_cstr(dict_get_str(o->dict, "name")));
}

int cls_lib_equal(Value *a, Value *b) {
  if (!cls_is_instance(a) || !cls_is_instance(b)) return CLS_NOT_MINE;
  Instance *x = (Instance *)a, *y = (Instance *)b;
  const Class *d = dataclass_of(x->cls);
  if (!d || (d->flags & CLS_NO_EQ)) return CLS_NOT_MINE;
  if (x->cls != y->cls) return 0;
  for (size_t i = 0; i < tuple_len(d->fields); i++) {
    Value *k = tuple_get(d->fields, i), *u = dict_get(x->dict, k), *w = dict_get(y->dict, k);
    if (!u || !w) return u == w;
    Value *eq = u == w ? val_bool(true) : ops_compare(OP_EQ, u, w);
    int t = eq ? val_truth(eq) : -1;
    val_decref(eq);
    if (t != 1) return t;
  }
  return 1;
}

int cls_lib_hash(Value *v, uint64_t *h) {
  const Class *d = dataclass_of(((Instance *)v)->cls);
  if (!d || (d->flags & CLS_NO_EQ)) return CLS_NOT_MINE;
  if (!(d->flags & CLS_FROZEN)) return 0;   /* eq without frozen: unhashable, as Python */
  Value **vals = instance_fields(v, d);
  size_t n = tuple_len(d->fields);
  for (size_t i = 0; vals && i < n; i++)
    if (!vals[i]) vals[i] = VAL_NONE;
  Value *t = vals ? tuple_pack(n, vals) : NULL;
  shm_free(vals);
  int64_t x = t ? val_hash(t) : -1;
  val_decref(t);
  if (x < 0) {
    err_clear();
    return 0;
  }
  *h = (uint64_t)x;
  return 1;
}

/* ---- pytree registration ------------------------------------------------------ */

bool cls_is_tree_node(const Value *v) {
  return cls_is_instance(v) && ((const Instance *)v)->cls->tree != TREE_NONE;
}

/* The (children, aux) pair a flatten function returned, split: children
 * as a tuple. */
static Value *split_pair(Value *r, Value **aux) {
  size_t n, m;
  Value *const *items, *const *kids;
  if (!r) return NULL;
  Value *t = NULL;
  if (!val_seq(r, &n, &items) || n != 2 || !val_seq(items[0], &m, &kids))
    err_set(ERR_TYPE, "a pytree flatten function must return (children, aux_data), with the "
                      "children a tuple or list, got %s", val_type_name(r));
  else if ((t = tuple_pack(m, kids)))
    *aux = val_incref(items[1]);
  val_decref(r);
  return t;
}

/* The values of fields [names] of instance [v], as a tuple. */
static Value *field_values(Value *v, Value *names) {
  size_t n = tuple_len(names);
  Value *t = tuple_new(n);
  for (size_t i = 0; t && i < n; i++) tuple_set_steal(t, i, ops_getattr(v, str_cstr(tuple_get(names, i))));
  if (t && !tuple_complete(t)) {
    val_decref(t);
    return NULL;
  }
  return t;
}

Value *cls_tree_children(Value *v, Value **aux) {
  Class *c = ((Instance *)v)->cls;
  *aux = NULL;
  switch (c->tree) {
  case TREE_FIELDS: {
    Value *kids = field_values(v, c->data_fields);
    if (kids && !(*aux = field_values(v, c->meta_fields))) {
      val_decref(kids);
      return NULL;
    }
    return kids;
  }
  case TREE_FUNCS: return split_pair(val_call_n(c->flatten, 1, &v), aux);
  default: {
    Value *m = ops_getattr(v, "tree_flatten");
    Value *r = m ? val_call_n(m, 0, NULL) : NULL;
    val_decref(m);
    return split_pair(r, aux);
  }
  }
}

/* A registered dataclass rebuilt: its constructor with the fields as
 * keywords, as JAX's register_dataclass unflattens. */
static Value *rebuild_fields(Class *c, Value *aux, Value *children) {
  size_t nd = tuple_len(c->data_fields), nm = tuple_len(c->meta_fields);
  if (tuple_len(children) != nd || aux->type != V_TUPLE || tuple_len(aux) != nm)
    return err_set(ERR_VALUE, "%s: %zu children for %zu data fields", c->name,
                   tuple_len(children), nd);
  const char **names = shm_calloc(nd + nm + 1, sizeof *names);
  Value **vals = shm_calloc(nd + nm + 1, sizeof *vals);
  Value *r = NULL;
  if (names && vals) {
    for (size_t i = 0; i < nd + nm; i++) {
      Value *src = i < nd ? c->data_fields : c->meta_fields;
      size_t j = i < nd ? i : i - nd;
      if (!(names[i] = intern_cstr(str_cstr(tuple_get(src, j))))) break;
      vals[i] = tuple_get(i < nd ? children : aux, j);
    }
    CallArgs a = {.nkw = (int)(nd + nm), .kwnames = names, .kwvals = vals};
    bool named = true;
    for (size_t i = 0; i < nd + nm; i++) named = named && names[i];
    r = named ? val_call(&c->base.hdr, &a) : err_nomem();
  } else {
    err_nomem();
  }
  shm_free(names);
  shm_free(vals);
  return r;
}

Value *cls_tree_unflatten(Value *cls, Value *aux, Value *children) {
  Class *c = (Class *)cls;
  switch (c->tree) {
  case TREE_FIELDS: return rebuild_fields(c, aux, children);
  case TREE_FUNCS: return val_call_n(c->unflatten, 2, (Value *[]){aux, children});
  default: {
    Value *m = ops_getattr(&c->base.hdr, "tree_unflatten");
    Value *r = m ? val_call_n(m, 2, (Value *[]){aux, children}) : NULL;
    val_decref(m);
    return r;
  }
  }
}

static Class *registrable(Value *cls, const char *fn) {
  if (!cls_is_class(cls))
    return err_set(ERR_TYPE, "%s: nodetype must be a class, got %s", fn, val_type_name(cls));
  Class *c = (Class *)cls;
  if (c->flags & CLS_NAMEDTUPLE)
    return err_set(ERR_VALUE, "%s: '%s' is a named tuple, already a pytree node", fn, c->name);
  if (c->tree != TREE_NONE)
    return err_set(ERR_VALUE, "Duplicate custom PyTreeDef type registration for %s", c->name);
  return c;
}

static Value *bi_register_pytree_node(const CallArgs *a) {
  Value *cls, *fl, *unfl;
  if (args_bind("register_pytree_node", a, "nodetype, flatten_func, unflatten_func",
                (Value **[]){&cls, &fl, &unfl}) < 0)
    return NULL;
  Class *c = registrable(cls, "register_pytree_node");
  if (!c) return NULL;
  c->flatten = val_incref(fl);
  c->unflatten = val_incref(unfl);
  c->tree = TREE_FUNCS;
  return val_incref(VAL_NONE);
}

static Value *bi_register_pytree_node_class(const CallArgs *a) {
  Value *cls;
  if (args_bind("register_pytree_node_class", a, "cls", (Value **[]){&cls}) < 0) return NULL;
  Class *c = registrable(cls, "register_pytree_node_class");
  if (!c) return NULL;
  if (!cls_find(c, "tree_flatten", NULL) || !cls_find(c, "tree_unflatten", NULL))
    return err_set(ERR_ATTRIBUTE, "register_pytree_node_class: '%s' needs the methods "
                   "tree_flatten and tree_unflatten", c->name);
  c->tree = TREE_METHODS;
  return val_incref(cls);
}

/* Whether field [name]'s metadata marks it static (meta). */
static bool field_static(const Class *d, Value *name) {
  Value *m = d->metadata ? dict_get(d->metadata, name) : NULL;
  Value *s = m && m->type == V_DICT ? dict_get_str(m, "static") : NULL;
  return s && val_truth(s) == 1;
}

/* The data or meta fields register_dataclass infers: the dataclass's
 * fields, static by their metadata or not. */
static Value *infer_fields(const Class *d, bool meta) {
  Value *l = list_new(4), *t = NULL;
  for (size_t i = 0; l && i < tuple_len(d->fields); i++)
    if (field_init(d, i) && field_static(d, tuple_get(d->fields, i)) == meta &&
        list_append(l, tuple_get(d->fields, i)) < 0)
      break;
  if (l) t = tuple_pack(list_len(l), ((List *)l)->items);
  val_decref(l);
  return t;
}

/* A sequence of field names as a tuple of str. */
static Value *names_tuple(Value *v, const char *what) {
  size_t n;
  Value *const *items;
  if (!val_seq(v, &n, &items)) return err_set(ERR_TYPE, "register_dataclass: %s must be a list "
                                              "of field names", what);
  for (size_t i = 0; i < n; i++)
    if (items[i]->type != V_STR) return err_set(ERR_TYPE, "register_dataclass: %s must be str", what);
  return tuple_pack(n, items);
}

static Value *bi_register_dataclass(const CallArgs *a) {
  Value *cls, *data = NULL, *meta = NULL, *drop = NULL;
  if (args_bind("register_dataclass", a, "nodetype, data_fields=, meta_fields=, drop_fields=",
                (Value **[]){&cls, &data, &meta, &drop}) < 0)
    return NULL;
  Class *c = registrable(cls, "register_dataclass");
  if (!c) return NULL;
  const Class *d = dataclass_of(c);
  bool infer = !data || data == VAL_NONE;
  if (infer && !d)
    return err_set(ERR_TYPE, "register_dataclass: data_fields and meta_fields are required "
                   "when '%s' is not a dataclass", c->name);
  Value *df = infer ? infer_fields(d, false) : names_tuple(data, "data_fields");
  Value *mf = !df ? NULL : infer || !meta || meta == VAL_NONE ? (infer ? infer_fields(d, true) : tuple_new(0))
                                                          : names_tuple(meta, "meta_fields");
  if (!df || !mf) {
    val_decref(df);
    return NULL;
  }
  c->data_fields = df;
  c->meta_fields = mf;
  c->tree = TREE_FIELDS;
  return val_incref(cls);
}

/* ---- registration ------------------------------------------------------------- */

/* A marker class [name] of [flags]: enum.Enum, typing.NamedTuple. */
static Value *marker(const char *name, unsigned flags) {
  Value *d = dict_new();
  Class *c = d ? cls_alloc(name, NULL, d) : NULL;
  val_decref(d);
  if (c) c->flags = flags;
  return c ? &c->base.hdr : NULL;
}

int cls_lib_register(Env *b) {
  (void)b;
  if (!(enum_base = marker("Enum", CLS_ENUM)) || !(namedtuple_base = marker("NamedTuple", CLS_NAMEDTUPLE)))
    return -1;
  static const struct {
    const char *ns, *name, *doc;
    BuiltinFn fn;
  } fns[] = {
      {"dataclasses", "dataclass", "@dataclass or @dataclass(frozen=True): fields from annotations",
       bi_dataclass},
      {"dataclasses", "field", "field(default=, default_factory=, metadata=): a field's options",
       bi_field},
      {"dataclasses", "fields", "fields(obj): the dataclass's fields", bi_fields},
      {"dataclasses", "asdict", "asdict(obj): the fields as a dict, recursively", bi_asdict},
      {"dataclasses", "replace", "replace(obj, **changes): a copy with some fields changed",
       bi_replace},
      {"dataclasses", "is_dataclass", "is_dataclass(obj)", bi_is_dataclass},
      {"enum", "auto", "auto(): the next member's value", bi_auto},
      {"collections", "namedtuple", "namedtuple(typename, field_names, defaults=None)",
       bi_namedtuple},
      {"jax.tree_util", "register_pytree_node",
       "register_pytree_node(nodetype, flatten_func, unflatten_func)", bi_register_pytree_node},
      {"jax.tree_util", "register_pytree_node_class",
       "@register_pytree_node_class: tree_flatten and tree_unflatten", bi_register_pytree_node_class},
      {"jax.tree_util", "register_dataclass",
       "register_dataclass(nodetype, data_fields=None, meta_fields=None)", bi_register_dataclass},
  };
  for (size_t i = 0; i < sizeof fns / sizeof *fns; i++) {
    Value *f = builtin_new(fns[i].name, fns[i].fn, fns[i].doc);
    if (!f || builtins_add_to(fns[i].ns, fns[i].name, f) < 0) return -1;
  }
  /* typing.ClassVar only marks an annotation, which is never evaluated */
  Value *classvar = marker("ClassVar", 0);
  return !classvar || builtins_add_to("enum", "Enum", enum_base) < 0 ||
                 builtins_add_to("typing", "NamedTuple", namedtuple_base) < 0 ||
                 builtins_add_to("typing", "ClassVar", classvar) < 0
             ? -1 : 0;
}
