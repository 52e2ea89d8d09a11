/*
 * classes_impl.h - what classes.c (classes, instances, descriptors) and
 * classes_lib.c (dataclasses, enum, named tuples, pytree registration)
 * share; private to the two.
 */
#ifndef SHMAP_CLASSES_IMPL_H
#define SHMAP_CLASSES_IMPL_H

#include "lang/classes.h"

/* What a class is, beyond its attributes.  The inherited flags pass from
 * a base to the classes derived from it. */
enum {
  CLS_DATACLASS = 1 << 0,  /* @dataclass made it: fields, a generated __init__ */
  CLS_FROZEN = 1 << 1,     /* dataclass(frozen=True): no attribute may be set */
  CLS_NAMEDTUPLE = 1 << 2, /* typing.NamedTuple, collections.namedtuple: instances are tuples */
  CLS_ENUM = 1 << 3,       /* enum.Enum: the attributes are the members */
  CLS_NO_INIT = 1 << 4,    /* dataclass(init=False) */
  CLS_NO_REPR = 1 << 5,    /* dataclass(repr=False) */
  CLS_NO_EQ = 1 << 6,      /* dataclass(eq=False) */
  CLS_INHERITED = CLS_NAMEDTUPLE | CLS_ENUM,
};

/* A dataclass field's options: field(init=False), field(repr=False). */
enum { FIELD_NO_INIT = 1, FIELD_NO_REPR = 2 };

/* How instances flatten as pytrees (classes.h). */
enum { TREE_NONE, TREE_FUNCS, TREE_METHODS, TREE_FIELDS };

typedef struct Class {
  Opaque base;
  char *name;              /* owned */
  struct Class *parent;    /* the base class, immortal; NULL: object */
  Value *dict;             /* Dict: the attributes, in the body's order */
  unsigned flags;
  /* dataclass and named-tuple fields: a tuple of str in order (the bases'
   * first), their defaults and default factories (dicts by name), the
   * metadata dicts field(metadata=...) gave; NULL when none */
  Value *fields, *defaults, *factories, *metadata;
  Value *options;          /* Dict: field name -> FIELD_* bits, when not 0 */
  Value *members;          /* enum: the list of members, in order */
  int tree;                /* TREE_*: set by jax.tree_util's registration */
  Value *flatten, *unflatten;          /* TREE_FUNCS */
  Value *data_fields, *meta_fields;    /* TREE_FIELDS: tuples of str */
  int id;                  /* its number (cls_id) */
  int exc;                 /* the built-in exception class it derives from
                              (exceptions.c's index), or -1 */
  OpaqueType instance_type;/* its instances': the class's name is their
                              type's name (val_type_name), in every message */
} Class;

typedef struct Instance {
  Opaque base;
  Class *cls;              /* immortal */
  Value *dict;             /* Dict: the instance's attributes */
} Instance;

/* The small objects of the class machinery: a bound method (a = function,
 * b = self), property (a = fget, b = fset), staticmethod and classmethod
 * (a = function), super (a = the class, b = self), a dataclass Field
 * (a = default, b = default_factory, c = its name once the class is made,
 * d = metadata).  Each reference owned, NULL when absent. */
typedef struct Wrap {
  Opaque base;
  Value *a, *b, *c, *d;
  int flags;               /* a Field's FIELD_* options */
} Wrap;

extern const OpaqueType cls_class_type, cls_method_type, cls_property_type,
    cls_staticmethod_type, cls_classmethod_type, cls_super_type, cls_field_type;

/* The built-in `object` (a class with no base) and object.__init__. */
extern Value *cls_object, *cls_object_init;

/* What a lib function returns when the class is none of its kinds: the
 * caller goes on with the plain class behaviour. */
extern Value cls_declined;
#define CLS_DECLINED (&cls_declined)

bool cls_is(const Value *v, const OpaqueType *ot);
Value *cls_wrap_new(const OpaqueType *ot, Value *a, Value *b, Value *c);
/* A new class [name] with base [parent] and attributes [dict] (borrowed),
 * immortal; NULL with the error set. */
Class *cls_alloc(const char *name, Class *parent, Value *dict);
/* A new instance of [c] with an empty dict. */
Value *cls_instance_new(Class *c);
/* Class attribute [name] of [c] or its bases (borrowed), and the class
 * that has it in *[where] (may be NULL); NULL when none does. */
Value *cls_find(Class *c, const char *name, Class **where);
/* A class attribute as read through [self] (NULL: through class [cls]):
 * a function bound as a method, a staticmethod's function, a classmethod
 * bound to [cls], a property's value. */
Value *cls_bind(Value *attr, Value *self, Value *cls);
/* [self]'s attribute [name] from its class [c] or __getattr__; else the
 * AttributeError, with a suggestion from [dict] (may be NULL) and the
 * class's names. */
Value *cls_class_attr(Value *self, Class *c, Value *dict, const char *name);
Value *cls_no_attribute(Value *obj, Class *c, Value *dict, const char *name);
/* [fn] called with [self] before [a]'s arguments. */
Value *cls_call_with_self(Value *fn, Value *self, const CallArgs *a);
/* The user-defined dunder [name] of [self]'s class, called with [args]. */
Value *cls_call_dunder(Value *self, const char *name, int n, Value **args, bool *found);

/* ---- classes_lib.c ---- */
int cls_lib_register(Env *builtins);
int cls_lib_init_class(Class *c);
Value *cls_lib_class_attr(Class *c, const char *name);   /* CLS_DECLINED: none */
bool cls_lib_frozen(const Class *c);
bool cls_lib_has_init(const Class *c);
int cls_lib_init(Class *c, Value *self, const CallArgs *a);
Value *cls_lib_construct(Class *c, const CallArgs *a);
Value *cls_lib_repr(Value *v);
Value *cls_lib_str(Value *v);
int cls_lib_equal(Value *a, Value *b);
int cls_lib_hash(Value *v, uint64_t *h);

#endif
