/*
 * value.h - the object model: every value the language handles.
 *
 * OWNERSHIP, the one rule followed in every file:
 *   - A function that returns a Value* returns a NEW reference (the caller
 *     owns it and must val_decref it), or NULL with the error set.
 *   - Value* arguments are BORROWED: the callee takes its own reference
 *     (val_incref) if it keeps one.  Exceptions say "steals" in their
 *     header comment (list_append_steal, tuple_set_steal, ...).
 *   - A value whose refcount is 1 is owned by exactly one holder, which
 *     may change it in place (prim.c reuses such array buffers as outputs).
 *   - Values are immutable once shared, except lists and dicts, which only
 *     the thread that made them changes (the language has no way to hand a
 *     list to a device thread except through closures, where device code
 *     reads it; writes from device code to a shared list are a user race,
 *     documented in shmap(7)).
 *
 * Reference counts are atomic, because device threads share values (a
 * replicated shard_map input is one array seen by every device).  None,
 * True, False, Ellipsis, the dtype values and the static values below
 * (built-ins, namespaces, modules) are immortal: incref/decref on them do
 * nothing, so hot shared objects cause no cache-line traffic.  Source
 * constants are shared too; device threads use private copies of them
 * (eval.c's constant cache).
 *
 * Numbers are arrays: an integer literal is a weakly typed 0-d i32 array,
 * a float literal a weakly typed 0-d f32 array (LANGUAGE.md §2).
 */
#ifndef SHMAP_VALUE_H
#define SHMAP_VALUE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/strbuf.h"

typedef enum {
  V_NONE,
  V_ARRAY,    /* array.h: Array */
  V_STR,      /* Str */
  V_TUPLE,    /* Tuple */
  V_LIST,     /* List */
  V_DICT,     /* Dict */
  V_RANGE,    /* Range */
  V_SLICE,    /* Slice, made by a[i:j:k] */
  V_ELLIPSIS, /* ... */
  V_DTYPE,    /* DTypeVal: f32, int32, ... */
  V_BUILTIN,  /* Builtin: a C function */
  V_BOUND,    /* BoundMethod: a C method bound to its receiver */
  V_FUNC,     /* eval.h: Func, a closure of user code */
  V_MODULE,   /* Module: an imported .shm file or a namespace (jnp, lax) */
  V_MESH,     /* mesh.h: Mesh */
  V_PSPEC,    /* mesh.h: PSpec, PartitionSpec */
  V_SHARDFN,  /* shardmap.h: a shard_map-wrapped function */
  V_JITFN,    /* jit.h: a jit-wrapped function */
  V_PLAN,     /* plan.h: a staged plan */
  V_TRACER,   /* trace.h: an abstract value while tracing */
  V_OPAQUE,   /* Opaque: any other C object with a type descriptor */
  V_TYPE_COUNT
} VType;

#define VAL_IMMORTAL 0x1
/* A tuple of a named-tuple class (collections.namedtuple, typing.NamedTuple):
 * a tuple in every way, with its class in the slot after its items
 * (tuple_class).  Classes are immortal, so the slot holds no reference. */
#define VAL_NAMED 0x2

typedef struct Value {
  atomic_int refcount;
  uint8_t type;   /* VType */
  uint8_t flags;  /* VAL_IMMORTAL */
} Value;

/* ---- reference counting ------------------------------------------------ */

static inline Value *val_incref(Value *v) {
  if (v && !(v->flags & VAL_IMMORTAL))
    atomic_fetch_add_explicit(&v->refcount, 1, memory_order_relaxed);
  return v;
}

void val_free_(Value *v); /* called when the count reaches zero */

/* A count of 1 read by its holder is the last reference: nobody else can
 * take one without holding one, so the value is freed without the atomic
 * read-modify-write (the acquire load sees the writes of the holders that
 * dropped theirs before, as the decrement would). */
static inline void val_decref(Value *v) {
  if (!v || (v->flags & VAL_IMMORTAL)) return;
  if (atomic_load_explicit(&v->refcount, memory_order_acquire) == 1 ||
      atomic_fetch_sub_explicit(&v->refcount, 1, memory_order_acq_rel) == 1)
    val_free_(v);
}

/* Initialises the header of a freshly allocated value: refcount 1. */
static inline void val_init(Value *v, VType t) {
  atomic_init(&v->refcount, 1);
  v->type = (uint8_t)t;
  v->flags = 0;
}

static inline int val_refcount(const Value *v) {
  return atomic_load_explicit(&((Value *)v)->refcount, memory_order_acquire);
}

/* Makes [v] static: immortal (incref and decref do nothing) until
 * val_free_statics.  For the built-in functions and modules (namespaces,
 * imported files), made once at start-up or import, that every device
 * thread touches:
 * counting their references from several cores would bounce one cache
 * line between them on every use.  The registry takes over the caller's
 * reference; the caller may go on using [v] (and decref it, a no-op).
 * Returns [v]; on out of memory [v] simply stays counted.  Thread-safe. */
Value *val_make_static(Value *v);

/* Frees every static value (at exit, after the device threads stopped
 * and nothing else runs).  References still held elsewhere dangle. */
void val_free_statics(void);

/* Empties every list and dict still alive (at exit, after the program's
 * scopes were released and before val_free_statics, with no device thread
 * running): what only a reference cycle kept alive (a list that holds
 * itself, a dict of functions whose scope holds the dict) is freed.
 * Counting references never frees a cycle and the language has no
 * collector; a list or dict is the link every such cycle of values runs
 * through, as in CPython, whose collector tracks the containers too.  A
 * cycle through a function's scope alone (a nested function that refers
 * to itself) is not one of these and is not freed. */
void val_break_cycles(void);

/* ---- singletons --------------------------------------------------------- */

extern Value val_none_, val_ellipsis_;
#define VAL_NONE (&val_none_)
#define VAL_ELLIPSIS (&val_ellipsis_)

/* True and False (borrowed, immortal): 0-d bool arrays, made by
 * array/array.c, which registers their maker with val_register_bools. */
Value *val_true(void);
Value *val_false(void);
static inline Value *val_bool(bool b) { return b ? val_true() : val_false(); }

/* Installs the maker of True and False: [make](b) returns a new value
 * for b that val_true/val_false then keep, immortal; NULL on out of
 * memory.  Called once, before the first val_true. */
void val_register_bools(Value *(*make)(bool b));  /* hook */

/* Makes True and False now, after val_register_bools: 0, or -1 with the
 * out-of-memory error.  The interpreter calls it at start-up, where a
 * failure is reported; made on first use instead, mid-program and on any
 * thread, val_true could only abort. */
int val_bools_init(void);

/* ---- strings ------------------------------------------------------------ */

/* A str: a sequence of code points, as in Python 3, kept as UTF-8.  [len]
 * counts bytes, [nchars] code points (what len() says); nchars == len
 * when the text is ASCII, which keeps indexing O(1) there. */
typedef struct Str {
  Value hdr;
  size_t len;
  size_t nchars;  /* code points, computed at creation (utf8_count) */
  uint64_t hash;  /* computed at creation */
  char s[];       /* NUL-terminated */
} Str;

Value *str_new(const char *s, size_t len);
/* A new Str of [b]'s bytes, [b] released (strbuf.h): NULL with the
 * out-of-memory error when an append to it had failed. */
Value *str_take(StrBuf *b);
Value *str_from(const char *s);                    /* NUL-terminated */
/* Appends [n] bytes at [t] to string [s] in place, which its caller holds
 * alone (refcount 1, not immortal): CPython's way of making a loop of
 * `s += t` linear, the string's block grown by realloc ([t] must not
 * point into [s]).  Returns the
 * string, perhaps moved (the old pointer is then invalid), its hash that
 * of the new text; NULL with the out-of-memory error and [s] unchanged. */
Value *str_append_owned(Value *s, const char *t, size_t n);
Value *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline const char *str_cstr(const Value *v) { return ((const Str *)v)->s; }
/* The number of code points of str [v]: Python's len(). */
static inline size_t str_nchars(const Value *v) { return ((const Str *)v)->nchars; }
/* Whether str [v] is all ASCII (one byte per code point). */
static inline bool str_is_ascii(const Value *v) {
  return ((const Str *)v)->nchars == ((const Str *)v)->len;
}
/* The byte offset in str [v] of its code point [k] (0 <= k <= its
 * length): O(1) for ASCII text, a scan otherwise. */
size_t str_offset(const Value *v, size_t k);

/* ---- tuples and lists --------------------------------------------------- */

typedef struct Tuple {
  Value hdr;
  size_t len;
  Value *items[];  /* owned references */
} Tuple;

/* A tuple of [n] slots, all NULL; fill them with tuple_set_steal before the
 * tuple is shared. */
Value *tuple_new(size_t n);
void tuple_set_steal(Value *t, size_t i, Value *item);
/* False when [v] is a tuple with a NULL item, at any depth of tuples in
 * tuples: one filled by tuple_set_steal with the result of a maker that
 * ran out of memory.  Any other value is complete. */
bool tuple_complete(const Value *v);
/* A tuple of the [n] given values (borrowed). */
Value *tuple_pack(size_t n, Value *const *items);
/* tuple_new for a named tuple of class [cls] (an immortal value, kept
 * unreferenced in the slot after the items): VAL_NAMED is set. */
Value *tuple_new_named(size_t n, Value *cls);
/* tuple_new(n), or tuple_new_named(n, its class) when tuple [like] is a
 * named one: what rebuilds a tuple of a pytree with new items. */
Value *tuple_new_like(const Value *like, size_t n);
/* The class of a named tuple (borrowed), or NULL for any other value. */
static inline Value *tuple_class(const Value *t) {
  if (t->type != V_TUPLE || !(t->flags & VAL_NAMED)) return NULL;
  return ((const Tuple *)t)->items[((const Tuple *)t)->len];
}
static inline size_t tuple_len(const Value *t) { return ((const Tuple *)t)->len; }
static inline Value *tuple_get(const Value *t, size_t i) { return ((const Tuple *)t)->items[i]; }

/* The links of a list or dict in the list of every live one, which
 * val_break_cycles walks at exit (value.c); eval.c's kept scopes use them
 * too.  Circular lists through a sentinel, so an entry unlinks itself
 * without knowing which list holds it; the callers hold their lock. */
typedef struct ContainerLinks {
  struct ContainerLinks *prev, *next;
  void *owner;
} ContainerLinks;

/* Puts [l] after [head]. */
static inline void links_insert(ContainerLinks *head, ContainerLinks *l) {
  l->next = head->next;
  l->prev = head;
  head->next->prev = l;
  head->next = l;
}

/* Takes [l] out of its list. */
static inline void links_remove(ContainerLinks *l) {
  l->prev->next = l->next;
  l->next->prev = l->prev;
}

/* Moves every entry of the list at [from] to the empty list at [to]. */
static inline void links_move_all(ContainerLinks *from, ContainerLinks *to) {
  if (from->next == from) return;
  to->next = from->next;
  to->prev = from->prev;
  to->next->prev = to;
  to->prev->next = to;
  from->next = from->prev = from;
}

typedef struct List {
  Value hdr;
  ContainerLinks links;
  uint32_t writer;   /* val_writer of the thread that made it */
  size_t len, cap;
  Value **items;   /* owned references */
  /* collections.deque is a list of a kind (lang/stdmod_coll.c), as
   * defaultdict is a dict of one: it holds at most [maxlen] items (-1:
   * unbounded), its methods are a deque's, and it prints, compares and
   * is typed as Python's deque.  Items are kept in order from index 0, so
   * appendleft and popleft move them: O(n), as a list's insert(0, x). */
  uint8_t kind;      /* LIST_PLAIN, LIST_DEQUE */
  int64_t maxlen;
} List;
enum { LIST_PLAIN, LIST_DEQUE };

/* ---- who may change a container ----------------------------------------
 * A shard_map body runs on all its devices at once, so lists, dicts and
 * scopes made outside the body are shared by them: a body may read them
 * but not change them (a JAX body is traced once and cannot usefully
 * change Python state either; its results leave through out_specs).
 * Each records the token of the thread run that made it ([val_writer]:
 * 0 outside bodies, a fresh one for each device's run of a body), and a
 * change under another nonzero token is refused: a located error instead
 * of a data race.  Outside bodies (token 0) anything may be changed: no
 * body runs meanwhile. */
extern _Thread_local uint32_t val_writer;

/* A token no run has had yet (never 0).  Thread-safe. */
uint32_t val_writer_new(void);

/* 0 when this thread may change a container recorded with token
 * [writer]; else -1 with the error set: "cannot change [what]: ...",
 * [what] saying which ("a list made outside this shard_map body"). */
int val_check_writer(uint32_t writer, const char *what);

/* val_check_writer for a list or dict [obj] ("cannot change a list made
 * outside this shard_map body: ..."); 0 for any other value. */
int val_check_container(const Value *obj);

Value *list_new(size_t cap);
int list_append(Value *l, Value *item);          /* borrows; -1 on nomem */
int list_append_steal(Value *l, Value *item);    /* steals, even on failure */
/* Replaces the [n] items at [start] with the [m] [items] (borrowed; they
 * may be the list's own): Python's l[start:start + n] = items.  0, or -1
 * on out of memory. */
int list_splice(Value *l, size_t start, size_t n, size_t m, Value *const *items);
static inline size_t list_len(const Value *l) { return ((const List *)l)->len; }
static inline Value *list_get(const Value *l, size_t i) { return ((const List *)l)->items[i]; }

/* For tuples and lists alike: length and borrowed items; false if [v] is
 * neither. */
bool val_seq(const Value *v, size_t *len, Value *const **items);

/* ---- dicts: insertion ordered, keys hashable (str, numbers, tuples) ------ */

typedef struct Dict {
  Value hdr;
  ContainerLinks links;
  uint32_t writer;   /* val_writer of the thread that made it */
  size_t len, cap;
  Value **keys, **vals;  /* owned, in insertion order */
  /* Past DICT_LINEAR_MAX entries, an open-addressing table of positions + 1
   * (0: empty) keyed by the keys' hashes (a string's own hash, so
   * dict_get_str needs no Str), of index_cap (a power of two) slots; made
   * and changed only by dict_set and dict_del, so readers on other threads
   * never write it.  A module's globals are hundreds of names. */
  uint32_t *index;
  size_t index_cap;
  /* collections' dict kinds (lang/stdmod_coll.c): a missing key of a
   * defaultdict calls [missing] (its default_factory, owned; NULL for
   * None), of a Counter is 0; both print as their class does. */
  uint8_t kind;      /* DICT_PLAIN, DICT_DEFAULT, DICT_COUNTER, DICT_ORDERED,
                        DICT_SET, DICT_FROZENSET */
  Value *missing;
} Dict;
/* A set or frozenset (lang/stdmod_set.c) is a dict of a kind whose keys
 * are its elements and whose values are all None: no dict method,
 * subscript or ** reaches it, only the set's own. */
enum { DICT_PLAIN, DICT_DEFAULT, DICT_COUNTER, DICT_ORDERED, DICT_SET, DICT_FROZENSET };
static inline bool val_is_set(const Value *v) {
  return v && v->type == V_DICT && ((const Dict *)v)->kind >= DICT_SET;
}
/* An empty set (frozenset when [frozen]); NULL out of memory. */
Value *set_new(bool frozen);
/* Adds [x] (borrowed) to set [s]: 0, or -1 with the error set
 * (unhashable x). */
int set_add(Value *s, Value *x);

Value *dict_new(void);
/* Borrowed value for [key], or NULL (no error set) when absent. */
Value *dict_get(Value *d, Value *key);
Value *dict_get_str(Value *d, const char *key);
/* Sets key -> val (both borrowed).  -1 with the error set on an unhashable
 * key or out of memory. */
int dict_set(Value *d, Value *key, Value *val);
int dict_set_str(Value *d, const char *key, Value *val);
/* Removes [key] (borrowed) and its value: 1, or 0 when absent. */
int dict_del(Value *d, Value *key);

/* ---- ranges, slices ------------------------------------------------------ */

typedef struct Range {
  Value hdr;
  int64_t start, stop, step;
} Range;
Value *range_new(int64_t start, int64_t stop, int64_t step);
int64_t range_len(const Value *r);

typedef struct Slice {
  Value hdr;
  Value *start, *stop, *step;  /* owned; None when omitted */
} Slice;
Value *slice_new(Value *start, Value *stop, Value *step);  /* borrows */

/* ---- dtypes as values ----------------------------------------------------- */

typedef struct DTypeVal {
  Value hdr;
  DType dtype;
} DTypeVal;
/* The immortal value for [t] (borrowed). */
Value *dtype_value(DType t);

/* ---- built-in functions and methods --------------------------------------- */

/* A call's arguments: positional [args], then keyword [kwnames]/[kwvals].
 * All borrowed. */
typedef struct CallArgs {
  int nargs;
  Value **args;
  int nkw;
  const char **kwnames;
  Value **kwvals;
} CallArgs;

typedef Value *(*BuiltinFn)(const CallArgs *a);
typedef Value *(*MethodFn)(Value *self, const CallArgs *a);

typedef struct Builtin {
  Value hdr;
  const char *name;   /* static */
  BuiltinFn fn;
  const char *doc;    /* static, one line, for help() and completion */
  bool is_class;      /* a type (int, list, jax.Array): prints <class 'name'> */
  bool python;        /* one of Python's (len, list, max, getattr): returns what
                         it is given as it is, where jax's functions make
                         jax.Arrays of host NumPy arrays (lang/hostnp.h) */
} Builtin;
/* A built-in function; static (val_make_static): made at start-up only. */
Value *builtin_new(const char *name, BuiltinFn fn, const char *doc);

typedef struct BoundMethod {
  Value hdr;
  const char *name;   /* static */
  MethodFn fn;
  Value *self;        /* owned */
  bool is_class;      /* a class (an exception class): prints <class 'name'> */
} BoundMethod;
Value *bound_new(const char *name, MethodFn fn, Value *self);

/*
 * Binds a call's arguments to parameters described by [spec], a string
 * literal (its address identifies it in a per-thread cache), a comma
 * separated list such as "x, axis=, keepdims=": names without '=' are
 * required, names with '=' optional (their slot is left NULL when absent);
 * a leading '*' name ("*args") collects the rest as a borrowed view is not
 * supported: use CallArgs directly for varargs.  Slots receive BORROWED
 * values.  Errors (TypeError style, as Python words them):
 *   "sum() missing required argument 'x'"
 *   "sum() takes at most 3 arguments (4 given)"
 *   "sum() got an unexpected keyword argument 'axes'"
 *   "sum() got multiple values for argument 'axis'"
 * Returns 0, or -1 with the error set.
 */
int args_bind(const char *fname, const CallArgs *a, const char *spec, Value **slots[]);

/* ---- modules and opaque objects ------------------------------------------- */

typedef struct Module {
  Value hdr;
  char *name;      /* owned */
  Value *globals;  /* Dict, owned */
} Module;
/* A module over [globals]; static (val_make_static): namespaces and
 * imported files live until exit. */
Value *module_new(const char *name, Value *globals /* borrowed */);

/* A C object of some other subsystem, with its own destructor and printer. */
typedef struct OpaqueType {
  const char *name;                       /* type name for messages */
  void (*free)(Value *self);              /* releases what self owns; not self */
  Value *(*repr)(Value *self);            /* new Str */
  Value *(*getattr)(Value *self, const char *name);  /* NULL + error if none */
  Value *(*str)(Value *self);             /* str(); NULL: the repr */
  /* A context manager (`with self [as name]:`): enter's result is bound to
   * the name; exit runs however the block ends.  NULL: not one. */
  Value *(*enter)(Value *self);
  int (*exit)(Value *self);
} OpaqueType;
typedef struct Opaque {
  Value hdr;
  const OpaqueType *ot;
} Opaque;

/* ---- generic operations ---------------------------------------------------- */

/* The type's name as the user sees it: "array", "str", "tuple", "function". */
const char *val_type_name(const Value *v);

/* Python truthiness.  Arrays: only size-1 arrays have a truth value; other
 * sizes raise "the truth value of an array with more than one element is
 * ambiguous".  Tracers raise the jit error.  Returns 0/1, or -1 on error. */
int val_truth(Value *v);

/* Structural equality for dict keys and `==` of non-arrays: strings by
 * content, 0-d arrays by numeric value, tuples elementwise. */
bool val_equal_key(Value *a, Value *b);

/* Hash for dict keys; -1 with the error set for an unhashable value. */
int64_t val_hash(Value *v);

/* Type-registration hooks.  The types defined above base/ (V_ARRAY by
 * array/array.c, V_FUNC, V_MESH, V_TRACER, ...) give the generic
 * operations here their behaviour, so this layer needs none of theirs:
 *   free:   val_free_ calls it to release the object, its memory included;
 *   truth:  val_truth's answer, 0/1, or -1 with the error set (NULL: true);
 *   number: a scalar number's value, for dict keys and hashing (val_equal_key,
 *           val_hash): true with *out set, or false when [v] is none.
 * Register before the first value of the type exists; not thread-safe. */
typedef void (*ValFreeFn)(Value *v);
typedef int (*ValTruthFn)(Value *v);
typedef bool (*ValNumberFn)(Value *v, double *out);
void val_register_free(VType t, ValFreeFn fn);  /* hook */
void val_register_truth(VType t, ValTruthFn fn);  /* hook */
void val_register_number(VType t, ValNumberFn fn);  /* hook */

/* Makes values of type [t] dict keys (lang/classes.c: instances of user
 * classes, enum members): [hash] sets *out and returns true, or false
 * when [v] is unhashable (no error set); [equal] says whether [a] and [b]
 * (both of type [t]) are equal keys.  Not thread-safe; at start-up. */
typedef bool (*ValKeyHashFn)(Value *v, uint64_t *out);
typedef bool (*ValKeyEqualFn)(Value *a, Value *b);
void val_register_key(VType t, ValKeyHashFn hash, ValKeyEqualFn equal);  /* hook */

#endif
