/*
 * value.c - the object model's common types and operations (value.h).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "base/suggest.h"
#include "base/value.h"
#include "base/utf8.h"

Value val_none_ = {.type = V_NONE, .flags = VAL_IMMORTAL};
Value val_ellipsis_ = {.type = V_ELLIPSIS, .flags = VAL_IMMORTAL};

/* ---- freeing: one hook per type ------------------------------------------ */

static ValFreeFn free_hooks[V_TYPE_COUNT];
static ValTruthFn truth_hooks[V_TYPE_COUNT];
static ValNumberFn number_hooks[V_TYPE_COUNT];

void val_register_free(VType t, ValFreeFn fn) { free_hooks[t] = fn; }
void val_register_truth(VType t, ValTruthFn fn) { truth_hooks[t] = fn; }
void val_register_number(VType t, ValNumberFn fn) { number_hooks[t] = fn; }

static ValKeyHashFn key_hash_hooks[V_TYPE_COUNT];
static ValKeyEqualFn key_equal_hooks[V_TYPE_COUNT];

void val_register_key(VType t, ValKeyHashFn hash, ValKeyEqualFn equal) {
  key_hash_hooks[t] = hash;
  key_equal_hooks[t] = equal;
}

static void free_items(Value **items, size_t n) {
  for (size_t i = 0; i < n; i++) val_decref(items[i]);
}

/* ---- every live list and dict, for val_break_cycles ------------------------ */

static pthread_mutex_t containers_lock = PTHREAD_MUTEX_INITIALIZER;
static ContainerLinks live_containers = {&live_containers, &live_containers, NULL};

static void container_link(ContainerLinks *l, Value *owner) {
  l->owner = owner;
  pthread_mutex_lock(&containers_lock);
  links_insert(&live_containers, l);
  pthread_mutex_unlock(&containers_lock);
}

static void container_unlink(ContainerLinks *l) {
  pthread_mutex_lock(&containers_lock);
  links_remove(l);
  pthread_mutex_unlock(&containers_lock);
}

/* Drops what the list or dict [v] holds; [v] itself stays, empty. */
static void container_empty(Value *v) {
  if (v->type == V_LIST) {
    List *l = (List *)v;
    Value **items = l->items;
    size_t n = l->len;
    l->items = NULL;   /* detached first: freeing an item may reach [v] again */
    l->len = l->cap = 0;
    free_items(items, n);
    shm_free(items);
    return;
  }
  Dict *d = (Dict *)v;
  Value **keys = d->keys, **vals = d->vals;
  size_t n = d->len;
  shm_free(d->index);
  d->keys = d->vals = NULL;
  d->index = NULL;
  d->len = d->cap = d->index_cap = 0;
  free_items(keys, n);
  free_items(vals, n);
  shm_free(keys);
  shm_free(vals);
}

void val_break_cycles(void) {
  ContainerLinks todo = {&todo, &todo, NULL};
  pthread_mutex_lock(&containers_lock);
  links_move_all(&live_containers, &todo);
  for (;;) {
    ContainerLinks *l = todo.next;
    if (l == &todo) break;
    links_remove(l);   /* back among the live, where its free unlinks it */
    links_insert(&live_containers, l);
    Value *v = val_incref(l->owner);
    pthread_mutex_unlock(&containers_lock);
    container_empty(v);
    val_decref(v);
    pthread_mutex_lock(&containers_lock);
  }
  pthread_mutex_unlock(&containers_lock);
}

/* Releases what [v] holds and frees it. */
static void free_one(Value *v) {
  switch ((VType)v->type) {
  case V_TUPLE: free_items(((Tuple *)v)->items, ((Tuple *)v)->len); break;
  case V_LIST:
    container_unlink(&((List *)v)->links);
    free_items(((List *)v)->items, ((List *)v)->len);
    shm_free(((List *)v)->items);
    break;
  case V_DICT: {
    Dict *d = (Dict *)v;
    container_unlink(&d->links);
    free_items(d->keys, d->len);
    free_items(d->vals, d->len);
    shm_free(d->keys);
    shm_free(d->vals);
    shm_free(d->index);
    val_decref(d->missing);
    break;
  }
  case V_SLICE: {
    Slice *s = (Slice *)v;
    val_decref(s->start); val_decref(s->stop); val_decref(s->step);
    break;
  }
  case V_BOUND: val_decref(((BoundMethod *)v)->self); break;
  case V_MODULE:
    shm_free(((Module *)v)->name);
    val_decref(((Module *)v)->globals);
    break;
  case V_OPAQUE:
    if (((Opaque *)v)->ot->free) ((Opaque *)v)->ot->free(v);
    break;
  case V_STR: case V_RANGE: case V_BUILTIN: case V_NONE: case V_ELLIPSIS:
  case V_DTYPE:
    break;
  default:
    if (free_hooks[v->type]) {
      free_hooks[v->type](v);
      return;
    }
    break;
  }
  shm_free(v);
}

/* Freeing a container releases its items, and a list nested a million
 * deep would recurse as deep and overflow the stack.  So while a value is
 * being freed on this thread, the values whose count drops to zero wait
 * in [pending] and the outermost val_free_ frees them one after another:
 * depth never grows.  (Out of memory for the list: freed at once.) */
#define PENDING_INLINE 64
static _Thread_local Value *pending_inline[PENDING_INLINE];
static _Thread_local Value **pending;   /* pending_inline, or a larger heap copy */
static _Thread_local size_t npending, cappending;
static _Thread_local bool freeing;

static bool defer_free(Value *v) {
  if (!pending) {
    pending = pending_inline;
    cappending = PENDING_INLINE;
  }
  if (npending == cappending) {
    Value **p = shm_malloc(cappending * 2 * sizeof *p);
    if (!p) return false;
    memcpy(p, pending, npending * sizeof *p);
    if (pending != pending_inline) shm_free(pending);
    pending = p;
    cappending *= 2;
  }
  pending[npending++] = v;
  return true;
}

void val_free_(Value *v) {
  if (v->type == V_ARRAY) {   /* array.c's hook, the hot one: holds no values */
    free_hooks[V_ARRAY](v);
    return;
  }
  if (freeing) {
    if (!defer_free(v)) free_one(v);
    return;
  }
  freeing = true;
  free_one(v);
  while (npending) free_one(pending[--npending]);
  if (pending != pending_inline) {   /* a deep structure grew it: give it back */
    shm_free(pending);
    pending = NULL;
  }
  freeing = false;
}

/* ---- True and False ------------------------------------------------------- */

static Value *true_v, *false_v;
static Value *(*bool_maker)(bool b);
static pthread_once_t bools_once = PTHREAD_ONCE_INIT;

void val_register_bools(Value *(*make)(bool b)) { bool_maker = make; }

static void make_bools(void) {
  true_v = bool_maker ? bool_maker(true) : NULL;
  false_v = bool_maker ? bool_maker(false) : NULL;
  if (true_v) true_v->flags |= VAL_IMMORTAL;
  if (false_v) false_v->flags |= VAL_IMMORTAL;
}

int val_bools_init(void) {
  pthread_once(&bools_once, make_bools);
  if (true_v && false_v) return 0;
  err_nomem();
  return -1;
}

/* True or False, made on first use where val_bools_init was not called
 * (a unit test): without memory for them there is nothing to return. */
static Value *bool_or_abort(Value **v) {
  pthread_once(&bools_once, make_bools);
  if (!*v) {
    fprintf(stderr, "shmap: out of memory making True and False\n");
    abort();
  }
  return *v;
}

Value *val_true(void) { return bool_or_abort(&true_v); }

Value *val_false(void) { return bool_or_abort(&false_v); }

/* ---- static values: immortal until exit ------------------------------------ */

static pthread_mutex_t statics_lock = PTHREAD_MUTEX_INITIALIZER;
static Value **statics;       /* guarded by statics_lock */
static size_t nstatics, statics_cap;

Value *val_make_static(Value *v) {
  if (!v || (v->flags & VAL_IMMORTAL)) return v;
  pthread_mutex_lock(&statics_lock);
  if (nstatics == statics_cap) {
    size_t cap = statics_cap ? statics_cap * 2 : 256;
    Value **grown = shm_realloc(statics, cap * sizeof *grown);
    if (!grown) {
      /* stays an ordinary counted value: slower on devices, still correct */
      pthread_mutex_unlock(&statics_lock);
      return v;
    }
    statics = grown;
    statics_cap = cap;
  }
  statics[nstatics++] = v;
  v->flags |= VAL_IMMORTAL;
  pthread_mutex_unlock(&statics_lock);
  return v;
}

void val_free_statics(void) {
  pthread_mutex_lock(&statics_lock);
  /* First what the statics hold, while they are all still immortal: a
   * module's globals may hold other statics (built-ins, modules). */
  for (size_t i = 0; i < nstatics; i++)
    if (statics[i]->type == V_MODULE) {
      Module *m = (Module *)statics[i];
      val_decref(m->globals);
      m->globals = NULL;
    }
  for (size_t i = 0; i < nstatics; i++) {
    statics[i]->flags &= (uint8_t)~VAL_IMMORTAL;
    atomic_store(&statics[i]->refcount, 1);
    val_decref(statics[i]);
  }
  shm_free(statics);
  statics = NULL;
  nstatics = statics_cap = 0;
  pthread_mutex_unlock(&statics_lock);
}

/* ---- strings ------------------------------------------------------------------ */

/* FNV-1a of [n] bytes continued from [h]: a hash of a text extended is
 * the old hash continued over the new bytes. */
static uint64_t hash_more(uint64_t h, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static uint64_t hash_bytes(const char *s, size_t n) {
  return hash_more(1469598103934665603ull, s, n);
}

Value *str_new(const char *s, size_t len) {
  Str *v = shm_malloc(sizeof *v + len + 1);
  if (!v) return err_nomem();
  val_init(&v->hdr, V_STR);
  v->len = len;
  memcpy(v->s, s, len);
  v->s[len] = '\0';
  v->hash = hash_bytes(s, len);
  v->nchars = utf8_count(s, len);
  return &v->hdr;
}

size_t str_offset(const Value *v, size_t k) {
  const Str *s = (const Str *)v;
  return s->nchars == s->len ? k : utf8_offset(s->s, s->len, k);
}

Value *str_append_owned(Value *s, const char *t, size_t n) {
  size_t len = ((Str *)s)->len;
  if (n > SIZE_MAX - sizeof(Str) - len - 1) return err_nomem();
  Str *v = shm_realloc(s, sizeof *v + len + n + 1);
  if (!v) return err_nomem();
  memcpy(v->s + len, t, n);
  v->len = len + n;
  v->s[v->len] = '\0';
  v->hash = hash_more(v->hash, t, n);
  v->nchars += utf8_count(t, n);
  return &v->hdr;
}

Value *str_take(StrBuf *b) {
  Value *r = b->failed ? err_nomem() : str_new(sbuf_text(b), b->len);
  sbuf_free(b);
  return r;
}

Value *str_from(const char *s) { return str_new(s, strlen(s)); }

Value *str_printf(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *buf = shm_malloc((size_t)n + 1);
  if (!buf) return err_nomem();
  va_start(ap, fmt);
  vsnprintf(buf, (size_t)n + 1, fmt, ap);
  va_end(ap);
  Value *v = str_new(buf, (size_t)n);
  shm_free(buf);
  return v;
}

/* ---- tuples and lists ----------------------------------------------------------- */

Value *tuple_new(size_t n) {
  Tuple *t = shm_calloc(1, sizeof *t + n * sizeof(Value *));
  if (!t) return err_nomem();
  val_init(&t->hdr, V_TUPLE);
  t->len = n;
  return &t->hdr;
}

Value *tuple_new_named(size_t n, Value *cls) {
  Tuple *t = shm_calloc(1, sizeof *t + (n + 1) * sizeof(Value *));
  if (!t) return err_nomem();
  val_init(&t->hdr, V_TUPLE);
  t->hdr.flags = VAL_NAMED;
  t->len = n;
  t->items[n] = cls;
  return &t->hdr;
}

Value *tuple_new_like(const Value *like, size_t n) {
  Value *cls = tuple_class(like);
  return cls ? tuple_new_named(n, cls) : tuple_new(n);
}

void tuple_set_steal(Value *t, size_t i, Value *item) {
  Tuple *tu = (Tuple *)t;
  val_decref(tu->items[i]);
  tu->items[i] = item;
}

bool tuple_complete(const Value *v) {
  if (v->type != V_TUPLE) return true;
  const Tuple *t = (const Tuple *)v;
  for (size_t i = 0; i < t->len; i++)
    if (!t->items[i] || !tuple_complete(t->items[i])) return false;
  return true;
}

Value *tuple_pack(size_t n, Value *const *items) {
  Value *t = tuple_new(n);
  if (!t) return NULL;
  for (size_t i = 0; i < n; i++) ((Tuple *)t)->items[i] = val_incref(items[i]);
  return t;
}

_Thread_local uint32_t val_writer;

uint32_t val_writer_new(void) {
  static atomic_uint next;
  uint32_t w;
  do w = atomic_fetch_add_explicit(&next, 1, memory_order_relaxed) + 1;
  while (w == 0);
  return w;
}

int val_check_writer(uint32_t writer, const char *what) {
  if (!val_writer || writer == val_writer) return 0;
  err_set(ERR_VALUE, "cannot change %s: every device runs the body at once; return "
                     "per-device values through out_specs",
          what);
  return -1;
}

int val_check_container(const Value *obj) {
  if (obj->type == V_LIST)
    return val_check_writer(((const List *)obj)->writer, "a list made outside this shard_map body");
  if (obj->type == V_DICT)
    return val_check_writer(((const Dict *)obj)->writer, "a dict made outside this shard_map body");
  return 0;
}

Value *list_new(size_t cap) {
  List *l = shm_calloc(1, sizeof *l);
  if (!l) return err_nomem();
  val_init(&l->hdr, V_LIST);
  l->writer = val_writer;
  if (cap) {
    l->items = shm_malloc(cap * sizeof(Value *));
    if (!l->items) {
      shm_free(l);
      return err_nomem();
    }
    l->cap = cap;
  }
  container_link(&l->links, &l->hdr);
  return &l->hdr;
}

int list_splice(Value *lv, size_t start, size_t n, size_t m, Value *const *items_in) {
  List *l = (List *)lv;
  size_t len = l->len - n + m;
  /* the items may be the list's own, which the growth below moves */
  Value **items = m ? shm_malloc(m * sizeof(Value *)) : NULL;
  if (m && !items) return err_nomem(), -1;
  if (m) memcpy(items, items_in, m * sizeof(Value *));
  if (len > l->cap) {
    size_t cap = l->cap ? l->cap : 4;
    while (cap < len) cap *= 2;
    Value **ni = shm_realloc(l->items, cap * sizeof(Value *));
    if (!ni) {
      shm_free(items);
      return err_nomem(), -1;
    }
    l->items = ni;
    l->cap = cap;
  }
  Value **old = n ? shm_malloc(n * sizeof(Value *)) : NULL;
  if (n && !old) {
    shm_free(items);
    return err_nomem(), -1;
  }
  for (size_t i = 0; i < m; i++) val_incref(items[i]);   /* before: items may alias */
  if (n) memcpy(old, l->items + start, n * sizeof(Value *));
  memmove(l->items + start + m, l->items + start + n, (l->len - start - n) * sizeof(Value *));
  for (size_t i = 0; i < m; i++) l->items[start + i] = items[i];
  l->len = len;
  for (size_t i = 0; i < n; i++) val_decref(old[i]);
  shm_free(old);
  shm_free(items);
  return 0;
}


/* For a container's setters: a NULL [v] is the result of a maker that
 * failed (out of memory, its error set), refused so that no container
 * holds a NULL for a later reader to follow. */
static int refuse_null(const Value *v) {
  if (v) return 0;
  if (!err_occurred()) err_nomem();
  return -1;
}

int list_append_steal(Value *lv, Value *item) {
  List *l = (List *)lv;
  if (refuse_null(item) < 0) return -1;
  if (l->len == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 4;
    Value **ni = shm_realloc(l->items, cap * sizeof(Value *));
    if (!ni) {
      val_decref(item);
      err_nomem();
      return -1;
    }
    l->items = ni;
    l->cap = cap;
  }
  l->items[l->len++] = item;
  return 0;
}

int list_append(Value *l, Value *item) {
  return list_append_steal(l, val_incref(item));
}

bool val_seq(const Value *v, size_t *len, Value *const **items) {
  if (v->type == V_TUPLE) {
    *len = ((const Tuple *)v)->len;
    *items = ((const Tuple *)v)->items;
    return true;
  }
  if (v->type == V_LIST) {
    *len = ((const List *)v)->len;
    *items = ((const List *)v)->items;
    return true;
  }
  return false;
}

/* ---- dicts: insertion-ordered arrays, with a hash index once they grow
 * (kwargs and mesh shapes stay small and are scanned; module globals and
 * user tables are looked up through the index) ---------------------------- */

#define DICT_LINEAR_MAX 8

Value *dict_new(void) {
  Dict *d = shm_calloc(1, sizeof *d);
  if (!d) return err_nomem();
  val_init(&d->hdr, V_DICT);
  d->writer = val_writer;
  container_link(&d->links, &d->hdr);
  return &d->hdr;
}

static bool key_hash(Value *v, uint64_t *h);

/* The index's first slot for hash [h]. */
static size_t index_home(const Dict *d, uint64_t h) {
  return (size_t)(h ^ (h >> 29)) & (d->index_cap - 1);
}

static void index_put(Dict *d, size_t pos, uint64_t h) {
  size_t i = index_home(d, h);
  while (d->index[i]) i = (i + 1) & (d->index_cap - 1);
  d->index[i] = (uint32_t)pos + 1;
}

/* (Re)builds the index for the current entries, at most half full; -1 out
 * of memory (the dict is then unchanged and still searched linearly). */
static int index_build(Dict *d) {
  size_t cap = 16;
  while (cap < 2 * (d->len + 1)) cap *= 2;
  uint32_t *t = shm_calloc(cap, sizeof *t);
  if (!t) return -1;
  shm_free(d->index);
  d->index = t;
  d->index_cap = cap;
  for (size_t i = 0; i < d->len; i++) {
    uint64_t h = 0;
    key_hash(d->keys[i], &h);   /* every stored key is hashable */
    index_put(d, i, h);
  }
  return 0;
}

static long dict_find(Dict *d, Value *key) {
  uint64_t h;
  if (!d->index || !key_hash(key, &h)) {
    for (size_t i = 0; i < d->len; i++)
      if (val_equal_key(d->keys[i], key)) return (long)i;
    return -1;
  }
  for (size_t i = index_home(d, h); d->index[i]; i = (i + 1) & (d->index_cap - 1))
    if (val_equal_key(d->keys[d->index[i] - 1], key)) return (long)d->index[i] - 1;
  return -1;
}

int dict_del(Value *dv, Value *key) {
  Dict *d = (Dict *)dv;
  long i = dict_find(d, key);
  if (i < 0) return 0;
  Value *k = d->keys[i], *v = d->vals[i];
  memmove(d->keys + i, d->keys + i + 1, (d->len - (size_t)i - 1) * sizeof(Value *));
  memmove(d->vals + i, d->vals + i + 1, (d->len - (size_t)i - 1) * sizeof(Value *));
  d->len--;
  /* the positions after [i] moved: a new index, or none (scanned) */
  if (d->index && index_build(d) < 0) {
    shm_free(d->index);
    d->index = NULL;
  }
  val_decref(k);
  val_decref(v);
  return 1;
}

Value *dict_get(Value *dv, Value *key) {
  long i = dict_find((Dict *)dv, key);
  return i < 0 ? NULL : ((Dict *)dv)->vals[i];
}

static uint64_t hash_bytes(const char *s, size_t n);

Value *dict_get_str(Value *dv, const char *key) {
  Dict *d = (Dict *)dv;
  if (!d->index) {
    for (size_t i = 0; i < d->len; i++)
      if (d->keys[i]->type == V_STR && strcmp(str_cstr(d->keys[i]), key) == 0)
        return d->vals[i];
    return NULL;
  }
  size_t n = strlen(key);
  uint64_t h = hash_bytes(key, n);
  for (size_t i = index_home(d, h); d->index[i]; i = (i + 1) & (d->index_cap - 1)) {
    const Str *k = (const Str *)d->keys[d->index[i] - 1];
    if (k->hdr.type == V_STR && k->hash == h && k->len == n && memcmp(k->s, key, n) == 0)
      return d->vals[d->index[i] - 1];
  }
  return NULL;
}

static int dict_grow(Dict *d) {
  size_t cap = d->cap ? d->cap * 2 : 8;
  Value **nk = shm_realloc(d->keys, cap * sizeof(Value *));
  if (!nk) return -1;
  d->keys = nk;
  Value **nv = shm_realloc(d->vals, cap * sizeof(Value *));
  if (!nv) return -1;
  d->vals = nv;
  d->cap = cap;
  return 0;
}

int dict_set(Value *dv, Value *key, Value *val) {
  Dict *d = (Dict *)dv;
  uint64_t h;
  if (refuse_null(key) < 0 || refuse_null(val) < 0) return -1;
  if (!key_hash(key, &h)) return (int)val_hash(key);   /* sets the error */
  long i = dict_find(d, key);
  if (i >= 0) {
    val_incref(val);
    val_decref(d->vals[i]);
    d->vals[i] = val;
    return 0;
  }
  if (d->len == d->cap && dict_grow(d) < 0) {
    err_nomem();
    return -1;
  }
  d->keys[d->len] = val_incref(key);
  d->vals[d->len] = val_incref(val);
  d->len++;
  if (d->index && 2 * (d->len + 1) <= d->index_cap)
    index_put(d, d->len - 1, h);
  else if (d->len > DICT_LINEAR_MAX && index_build(d) < 0) {
    shm_free(d->index);   /* scanned until a later set can build it */
    d->index = NULL;
  }
  return 0;
}

int dict_set_str(Value *d, const char *key, Value *val) {
  Value *k = str_from(key);
  if (!k) return -1;
  int r = dict_set(d, k, val);
  val_decref(k);
  return r;
}

/* ---- ranges and slices ----------------------------------------------------------- */

Value *range_new(int64_t start, int64_t stop, int64_t step) {
  if (step == 0) return err_set(ERR_VALUE, "range() arg 3 must not be zero");
  Range *r = shm_malloc(sizeof *r);
  if (!r) return err_nomem();
  val_init(&r->hdr, V_RANGE);
  r->start = start;
  r->stop = stop;
  r->step = step;
  return &r->hdr;
}

int64_t range_len(const Value *v) {
  const Range *r = (const Range *)v;
  if (r->step > 0 && r->start < r->stop)
    return (r->stop - r->start - 1) / r->step + 1;
  if (r->step < 0 && r->start > r->stop)
    return (r->start - r->stop - 1) / (-r->step) + 1;
  return 0;
}

Value *slice_new(Value *start, Value *stop, Value *step) {
  Slice *s = shm_malloc(sizeof *s);
  if (!s) return err_nomem();
  val_init(&s->hdr, V_SLICE);
  s->start = val_incref(start ? start : VAL_NONE);
  s->stop = val_incref(stop ? stop : VAL_NONE);
  s->step = val_incref(step ? step : VAL_NONE);
  return &s->hdr;
}

/* ---- dtypes ---------------------------------------------------------------------- */

static DTypeVal dtype_vals[DT_COUNT] = {
#define X(e, np, sh, sz, ct) \
  [e] = {.hdr = {.type = V_DTYPE, .flags = VAL_IMMORTAL}, .dtype = e},
    DTYPE_LIST(X)
#undef X
};

Value *dtype_value(DType t) { return &dtype_vals[t].hdr; }

/* ---- builtins, bound methods, modules ------------------------------------------- */

Value *builtin_new(const char *name, BuiltinFn fn, const char *doc) {
  Builtin *b = shm_malloc(sizeof *b);
  if (!b) return err_nomem();
  val_init(&b->hdr, V_BUILTIN);
  b->name = name;
  b->fn = fn;
  b->doc = doc;
  b->is_class = false;
  b->python = false;
  return val_make_static(&b->hdr);
}

Value *bound_new(const char *name, MethodFn fn, Value *self) {
  BoundMethod *b = shm_malloc(sizeof *b);
  if (!b) return err_nomem();
  val_init(&b->hdr, V_BOUND);
  b->name = name;
  b->fn = fn;
  b->self = val_incref(self);
  b->is_class = false;
  return &b->hdr;
}

Value *module_new(const char *name, Value *globals) {
  Module *m = shm_malloc(sizeof *m);
  if (!m) return err_nomem();
  val_init(&m->hdr, V_MODULE);
  m->name = shm_strdup(name);
  m->globals = val_incref(globals);
  if (!m->name) {
    val_decref(&m->hdr);
    return err_nomem();
  }
  return val_make_static(&m->hdr);
}

/* ---- generic operations ------------------------------------------------------------ */

Value *set_new(bool frozen) {
  Value *s = dict_new();
  if (s) ((Dict *)s)->kind = frozen ? DICT_FROZENSET : DICT_SET;
  return s;
}

int set_add(Value *s, Value *x) { return dict_set(s, x, VAL_NONE); }

const char *val_type_name(const Value *v) {
  static const char *const names[V_TYPE_COUNT] = {
      [V_NONE] = "NoneType", [V_ARRAY] = "Array",     [V_STR] = "str",
      [V_TUPLE] = "tuple",   [V_LIST] = "list",       [V_DICT] = "dict",
      [V_RANGE] = "range",   [V_SLICE] = "slice",     [V_ELLIPSIS] = "ellipsis",
      [V_DTYPE] = "dtype",   [V_BUILTIN] = "builtin_function",
      [V_BOUND] = "method",  [V_FUNC] = "function",   [V_MODULE] = "module",
      [V_MESH] = "Mesh",     [V_PSPEC] = "PartitionSpec",
      [V_SHARDFN] = "shard_map function", [V_JITFN] = "jit function",
      [V_PLAN] = "plan",     [V_TRACER] = "tracer",   [V_OPAQUE] = "object",
  };
  if (v->type == V_OPAQUE) return ((const Opaque *)v)->ot->name;
  if (v->type == V_LIST && ((const List *)v)->kind == LIST_DEQUE) return "collections.deque";
  if (v->type == V_DICT && ((const Dict *)v)->kind == DICT_ORDERED) return "collections.OrderedDict";
  if (v->type == V_DICT && ((const Dict *)v)->kind == DICT_SET) return "set";
  if (v->type == V_DICT && ((const Dict *)v)->kind == DICT_FROZENSET) return "frozenset";
  return v->type < V_TYPE_COUNT ? names[v->type] : "object";
}

int val_truth(Value *v) {
  switch ((VType)v->type) {
  case V_NONE: return 0;
  case V_STR: return ((Str *)v)->len != 0;
  case V_TUPLE: return ((Tuple *)v)->len != 0;
  case V_LIST: return ((List *)v)->len != 0;
  case V_DICT: return ((Dict *)v)->len != 0;
  case V_RANGE: return range_len(v) != 0;
  default:
    return truth_hooks[v->type] ? truth_hooks[v->type](v) : 1;
  }
}

/* The value of a scalar number (a 0-d array), for keys. */
static bool number_of(Value *v, double *out) {
  return number_hooks[v->type] && number_hooks[v->type](v, out);
}

bool val_equal_key(Value *a, Value *b) {
  if (a == b) return true;
  double da, db;
  if (number_of(a, &da) && number_of(b, &db)) return da == db;
  if (a->type != b->type) return false;
  switch ((VType)a->type) {
  case V_STR:
    return ((Str *)a)->len == ((Str *)b)->len && ((Str *)a)->hash == ((Str *)b)->hash &&
           memcmp(str_cstr(a), str_cstr(b), ((Str *)a)->len) == 0;
  case V_TUPLE: {
    Tuple *x = (Tuple *)a, *y = (Tuple *)b;
    if (x->len != y->len) return false;
    for (size_t i = 0; i < x->len; i++)
      if (!val_equal_key(x->items[i], y->items[i])) return false;
    return true;
  }
  case V_DTYPE: return ((DTypeVal *)a)->dtype == ((DTypeVal *)b)->dtype;
  default: return key_equal_hooks[a->type] && key_equal_hooks[a->type](a, b);
  }
}

/* The hash of key [v] into [h] (equal keys, as val_equal_key says, hash
 * alike: a number by its integer part); false, with no error set, when
 * [v] cannot be a key. */
static bool key_hash(Value *v, uint64_t *h) {
  switch ((VType)v->type) {
  case V_STR: *h = ((Str *)v)->hash; return true;
  case V_NONE: *h = 0; return true;
  case V_DTYPE: *h = 17 + (uint64_t)((DTypeVal *)v)->dtype; return true;
  case V_ARRAY: {
    double d;
    if (!number_of(v, &d)) return false;
    /* in range of int64 (NaN and huge numbers are not: one hash for all) */
    *h = d > -9.2e18 && d < 9.2e18 ? (uint64_t)(int64_t)d : 0x7ff0;
    return true;
  }
  case V_TUPLE: {
    uint64_t acc = 7, hi;
    for (size_t i = 0; i < tuple_len(v); i++) {
      if (!key_hash(tuple_get(v, i), &hi)) return false;
      acc = acc * 31 + (hi & INT64_MAX);
    }
    *h = acc;
    return true;
  }
  default:
    return key_hash_hooks[v->type] && key_hash_hooks[v->type](v, h);
  }
}

int64_t val_hash(Value *v) {
  uint64_t h;
  if (key_hash(v, &h)) return (int64_t)(h & INT64_MAX);
  err_set(ERR_TYPE, "unhashable type: '%s'", val_type_name(v));
  return -1;
}

/* ---- argument binding -------------------------------------------------------------- */

#define MAX_PARAMS 32

typedef struct SpecParam {
  const char *name;  /* in the spec, not terminated */
  size_t len;
  bool optional;
} SpecParam;

/* Splits [spec] ("x, axis=, tiled=") into its parameters, pointing into
 * it: built-ins bind at every call, so nothing is copied. */
static int parse_spec(const char *spec, SpecParam *ps) {
  int n = 0;
  while (*spec && n < MAX_PARAMS) {
    while (*spec == ' ' || *spec == ',') spec++;
    if (!*spec) break;
    const char *end = spec;
    while (*end && *end != '=' && *end != ',' && *end != ' ') end++;
    ps[n].name = spec;
    ps[n].len = (size_t)(end - spec);
    ps[n].optional = *end == '=';
    spec = *end == '=' ? end + 1 : end;
    n++;
  }
  return n;
}

static bool spec_is(const SpecParam *sp, const char *name) {
  return strncmp(sp->name, name, sp->len) == 0 && name[sp->len] == '\0';
}

/* What a call without keywords needs of a spec: the number of parameters
 * and which are required.  Remembered per thread for the last specs seen,
 * by address: specs are string literals, and built-ins bind at every call. */
typedef struct SpecShape {
  const char *spec;
  int np;
  uint64_t required;  /* bit i: parameter i has no default */
} SpecShape;

#define SPEC_CACHE 64  /* a power of two */
static _Thread_local SpecShape spec_cache[SPEC_CACHE];

static const SpecShape *spec_shape(const char *spec) {
  SpecShape *e = &spec_cache[((uintptr_t)spec >> 3) & (SPEC_CACHE - 1)];
  if (e->spec != spec) {
    SpecParam ps[MAX_PARAMS];
    e->np = parse_spec(spec, ps);
    e->required = 0;
    for (int i = 0; i < e->np; i++)
      if (!ps[i].optional) e->required |= (uint64_t)1 << i;
    e->spec = spec;
  }
  return e;
}

int args_bind(const char *fname, const CallArgs *a, const char *spec, Value **slots[]) {
  const SpecShape *sh = spec_shape(spec);
  if (a->nkw == 0 && a->nargs <= sh->np && (sh->required >> a->nargs) == 0) {
    for (int i = 0; i < sh->np; i++) *slots[i] = i < a->nargs ? a->args[i] : NULL;
    return 0;
  }
  SpecParam ps[MAX_PARAMS];
  int np = parse_spec(spec, ps);
  for (int i = 0; i < np; i++) *slots[i] = NULL;
  if (a->nargs > np) {
    err_set(ERR_TYPE, "%s() takes at most %d argument%s (%d given)", fname, np,
            np == 1 ? "" : "s", a->nargs);
    return -1;
  }
  for (int i = 0; i < a->nargs; i++) *slots[i] = a->args[i];
  for (int k = 0; k < a->nkw; k++) {
    int i = 0;
    while (i < np && !spec_is(&ps[i], a->kwnames[k])) i++;
    if (i == np) {
      Suggest sg;
      char pname[64];
      suggest_init(&sg, a->kwnames[k]);
      for (int j = 0; j < np; j++) {
        snprintf(pname, sizeof pname, "%.*s", (int)ps[j].len, ps[j].name);
        suggest_offer(&sg, pname);
      }
      if (suggest_best(&sg))
        err_set(ERR_TYPE, "%s() got an unexpected keyword argument '%s'. Did you mean '%s'?",
                fname, a->kwnames[k], suggest_best(&sg));
      else
        err_set(ERR_TYPE, "%s() got an unexpected keyword argument '%s'", fname,
                a->kwnames[k]);
      return -1;
    }
    if (*slots[i]) {
      err_set(ERR_TYPE, "%s() got multiple values for argument '%s'", fname,
              a->kwnames[k]);
      return -1;
    }
    *slots[i] = a->kwvals[k];
  }
  for (int i = 0; i < np; i++)
    if (!ps[i].optional && !*slots[i]) {
      err_set(ERR_TYPE, "%s() missing required argument '%.*s'", fname, (int)ps[i].len,
              ps[i].name);
      return -1;
    }
  return 0;
}
