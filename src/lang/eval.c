/*
 * eval.c - the tree-walking evaluator (eval.h).
 *
 * Statements return an Outcome (normal, error, return, break, continue);
 * expressions return a new reference or NULL with the error set.  The
 * first node that sees an error without a location gives it its own
 * (err_locate), so errors point at the innermost expression.
 */
#define _GNU_SOURCE   /* pthread_getattr_np: the stack's bounds */
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "array/array.h"
#include "lang/builtins.h"
#include "lang/classes.h"
#include "base/error.h"
#include "base/suggest.h"
#include "base/timeline.h"
#include "lang/eval.h"
#include "lang/hostnp.h"
#include "lang/exceptions.h"
#include "lang/iter.h"
#include "lang/jaxconfig.h"
#include "base/intern.h"
#include "array/linalg.h"
#include "base/mem.h"
#include "lang/ops.h"
#include "lang/parser.h"
#include "array/prim.h"
#include "array/print.h"

Interp *shm_interp;
int (*eval_stmt_hook)(Frame *f, const Node *stmt);
atomic_bool eval_hook_all;
_Thread_local bool eval_hook_here;
int (*eval_return_hook)(Frame *f, const Node *at, Value *ret);
int (*eval_call_hook)(Frame *f, const Node *def);
int (*eval_raise_hook)(Frame *f, const Node *stmt);
StmtExec eval_exec_mesh, eval_exec_shard_map;
Value *(*eval_make_jit)(Value *fn);

/* Deep recursion is an error, not a stack overflow.  Device threads get
 * stacks large enough for this depth (device.c). */
#define MAX_DEPTH 600

_Thread_local bool eval_on_device;
static _Thread_local Frame *cur_frame;
static _Thread_local int cur_depth;
static _Thread_local Loc cur_loc;
static _Thread_local OutBuf *cur_out;

Frame *eval_current_frame(void) { return cur_frame; }
Loc eval_current_loc(void) { return cur_loc; }

Loc eval_set_current_loc(Loc loc) {
  Loc was = cur_loc;
  cur_loc = loc;
  return was;
}
void eval_set_output(OutBuf *b) { cur_out = b; }

/* errno of the first failed write to the standard output, 0 while none
 * failed (written by the main thread only: devices write to OutBufs). */
static int out_errno;
static bool out_closed;   /* descriptor 1 was closed at the start */

static void output_failed(int errnum) {
  if (!out_errno) out_errno = errnum ? errnum : EIO;
}

void eval_output_closed(void) { out_closed = true; }

int eval_output_check(void) {
  if (cur_out || !out_errno) return 0;   /* a device's print: its buffer took it */
  err_set(ERR_IO, "cannot write the standard output: [Errno %d] %s", out_errno,
          strerror(out_errno));
  return -1;
}

void eval_flush(void) {
  if (!cur_out && !out_errno && fflush(stdout) != 0) output_failed(errno);
}

void eval_write(const char *s, size_t n) {
  OutBuf *b = cur_out;
  if (!b) {
    if (out_closed) output_failed(EBADF);
    else if (!out_errno && fwrite(s, 1, n, stdout) < n) output_failed(errno);
    return;
  }
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n) cap *= 2;
    char *nd = shm_realloc(b->data, cap);
    if (!nd) return; /* output dropped rather than crash; the run goes on */
    b->data = nd;
    b->cap = cap;
  }
  memcpy(b->data + b->len, s, n);
  b->len += n;
}

/* ==== scopes =============================================================== */

struct Env {
  atomic_int refcount;
  uint32_t writer;     /* val_writer of the run that made it (value.h) */
  Env *parent;         /* owned */
  int n, cap;          /* open addressing over interned-pointer keys */
  const char **keys;
  Value **vals;        /* owned */
  const char *declared[16];  /* names declared `global` / `nonlocal` here */
  bool declared_global[16];
  int ndeclared;
  atomic_bool encloses;      /* some scope has had it for parent (env_new) */
  /* In kept_scopes: a call's scope that outlived the call (scope_keep). */
  bool kept;
  ContainerLinks kept_links;   /* owner: the Env */
};

/* The scopes of calls that outlived their call, held by a closure that
 * escaped or by a cycle (a function's scope holding a shard_map or other
 * wrapper of a function defined there, which env_release_scope cannot
 * see through).  Reference counting never frees the cycles;
 * env_break_cycles clears what is left at exit.  A circular list
 * through this sentinel, guarded by kept_lock; a scope that dies
 * normally never enters it. */
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static ContainerLinks kept_scopes = {&kept_scopes, &kept_scopes, NULL};

/* Records that the call's scope [e] outlives its call. */
static void scope_keep(Env *e) {
  pthread_mutex_lock(&kept_lock);
  if (!e->kept) {
    e->kept = true;
    e->kept_links.owner = e;
    links_insert(&kept_scopes, &e->kept_links);
  }
  pthread_mutex_unlock(&kept_lock);
}

/* Clears every kept scope still alive (at exit, with no device thread
 * running), so the cycles through them are freed; the way
 * val_break_cycles empties lists and dicts. */
static void env_break_cycles(void) {
  ContainerLinks todo = {&todo, &todo, NULL};
  pthread_mutex_lock(&kept_lock);
  links_move_all(&kept_scopes, &todo);
  while (todo.next != &todo) {
    ContainerLinks *l = todo.next;
    Env *e = l->owner;
    links_remove(l);   /* back among the kept, where its free unlinks it */
    links_insert(&kept_scopes, l);
    env_incref(e);
    pthread_mutex_unlock(&kept_lock);
    env_clear(e);
    env_decref(e);
    pthread_mutex_lock(&kept_lock);
  }
  pthread_mutex_unlock(&kept_lock);
}

/* Outer names.  A name not bound in the innermost scope is looked up
 * through the enclosing scopes, then the built-ins: in a shard_map body
 * `psum` is three tables out, each a hash probe.  Each thread remembers,
 * per name node and enclosing scope (the innermost one's parent), the
 * table and index where that lookup found it (OuterHit).  An entry holds
 * while outer_version is unchanged: it changes whenever a name is added
 * to a scope that encloses another, to a module's or to the built-ins'
 * (any of those may now shadow an entry's binding, and a scope can
 * enclose the innermost one only once it has a child), and whenever such
 * a scope is freed (a new scope at its address may enclose other names).
 * Scopes that enclose none, the innermost ones, change without touching
 * it, so a loop's assignments keep every entry.  The home table's key at
 * the index is checked at every use, so a name unbound there or moved
 * (`del`, the table grown) goes by the full lookup again. */
static atomic_ulong outer_version;

typedef struct OuterHit {
  const Node *n;                 /* the N_NAME node; NULL: empty */
  const Env *parent;             /* the innermost scope's parent then */
  unsigned long version;         /* outer_version then */
  Env *home;                     /* where the name was found, */
  int idx;                       /* and at which index of its table */
} OuterHit;

#define OUTER_HITS 64            /* entries per thread, by node address */
static _Thread_local OuterHit outer_hits[OUTER_HITS];

/* A change to [e] that may shadow or drop what outer_hits hold. */
static inline void env_outer_changed(const Env *e) {
  if (!e->parent || atomic_load_explicit(&e->encloses, memory_order_relaxed))
    atomic_fetch_add_explicit(&outer_version, 1, memory_order_release);
}

static size_t ptr_hash(const char *p) {
  uintptr_t x = (uintptr_t)p;
  x ^= x >> 17;
  x *= 0xed5ad4bbu;
  return (size_t)(x ^ (x >> 11));
}

Env *env_new(Env *parent) {
  Env *e = shm_calloc(1, sizeof *e);
  if (!e) return err_nomem();
  atomic_init(&e->refcount, 1);
  e->parent = parent;
  e->writer = val_writer;
  if (parent) env_incref(parent);
  /* set once: a scope many threads call functions of is read, not written */
  if (parent && !atomic_load_explicit(&parent->encloses, memory_order_relaxed))
    atomic_store_explicit(&parent->encloses, true, memory_order_relaxed);
  return e;
}

void env_incref(Env *e) {
  if (e) atomic_fetch_add_explicit(&e->refcount, 1, memory_order_relaxed);
}

void env_clear(Env *e) {
  for (int i = 0; i < e->cap; i++)
    if (e->keys[i]) {
      Value *v = e->vals[i];
      e->keys[i] = NULL;
      e->vals[i] = NULL;
      val_decref(v);
    }
  e->n = 0;
}

void env_decref(Env *e) {
  if (!e || atomic_fetch_sub_explicit(&e->refcount, 1, memory_order_acq_rel) != 1)
    return;
  env_outer_changed(e);
  if (e->kept) {   /* set before the releasing thread's decrement, which we saw */
    pthread_mutex_lock(&kept_lock);
    links_remove(&e->kept_links);
    pthread_mutex_unlock(&kept_lock);
  }
  env_clear(e);
  shm_free(e->keys);
  shm_free(e->vals);
  env_decref(e->parent);
  shm_free(e);
}

static Value **env_slot(Env *e, const char *name) {
  if (!e->cap) return NULL;
  size_t mask = (size_t)e->cap - 1;
  for (size_t i = ptr_hash(name) & mask;; i = (i + 1) & mask) {
    if (e->keys[i] == name) return &e->vals[i];
    if (!e->keys[i]) return NULL;
  }
}

/* env_slot_hinted past a stale hint: the lookup, and the hint renewed. */
static __attribute__((noinline)) Value **env_slot_rehint(Env *e, const Node *n) {
  Value **s = env_slot(e, n->name);
  if (s) atomic_store_explicit(&((Node *)n)->slot_hint, (int)(s - e->vals), memory_order_relaxed);
  return s;
}

/* The slot of N_NAME [n] in [e], trying first the index where the
 * lookup of [n] found it last: an inline cache, right whenever the key
 * there is still the name (a name is in a table once; entries move only
 * when the table grows or loses a key).  The hint is shared by every
 * thread running the tree, hence relaxed atomics; a stale one costs only
 * the hashing it would have saved. */
static inline Value **env_slot_hinted(Env *e, const Node *n) {
  Node *m = (Node *)n;   /* the hint is a cache, not the tree's meaning */
  int h = atomic_load_explicit(&m->slot_hint, memory_order_relaxed);
  if (h < e->cap && e->keys[h] == n->name) return &e->vals[h];
  return env_slot_rehint(e, n);
}

/* The lookup of N_NAME [n] past the innermost scope [e]: the enclosing
 * scopes, then the built-ins, through the thread's OuterHit for [n] when
 * it holds, else in full, remembered.  NULL when unbound. */
static __attribute__((noinline)) Value *env_lookup_far(Env *e, const Node *n) {
  unsigned long ver = atomic_load_explicit(&outer_version, memory_order_acquire);
  OuterHit *h = &outer_hits[((uintptr_t)n >> 4) % OUTER_HITS];
  if (h->n == n && h->parent == e->parent && h->version == ver && h->idx < h->home->cap &&
      h->home->keys[h->idx] == n->name)
    return h->home->vals[h->idx];
  Value **s = NULL;
  Env *home = e->parent;
  for (; home && !(s = env_slot_hinted(home, n)); home = home->parent) {}
  if (!s && (home = shm_interp->builtins)) s = env_slot(home, n->name);
  if (!s) return NULL;
  *h = (OuterHit){n, e->parent, ver, home, (int)(s - home->vals)};
  return *s;
}

/* The value N_NAME [n] names from scope [e] (the built-ins last),
 * borrowed, or NULL: through its hint, inline for a name of the
 * innermost scope. */
static inline Value *env_lookup_name(Env *e, const Node *n) {
  Value **s = env_slot_hinted(e, n);
  return s ? *s : env_lookup_far(e, n);
}

Value *env_lookup(Env *e, const char *name) {
  for (; e; e = e->parent) {
    Value **s = env_slot(e, name);
    if (s) return *s;
  }
  return NULL;
}

static int env_grow(Env *e) {
  int cap = e->cap ? e->cap * 2 : 8;
  const char **keys = shm_calloc((size_t)cap, sizeof *keys);
  Value **vals = shm_calloc((size_t)cap, sizeof *vals);
  if (!keys || !vals) {
    shm_free(keys);
    shm_free(vals);
    err_nomem();
    return -1;
  }
  for (int i = 0; i < e->cap; i++)
    if (e->keys[i]) {
      size_t j = ptr_hash(e->keys[i]) & (size_t)(cap - 1);
      while (keys[j]) j = (j + 1) & (size_t)(cap - 1);
      keys[j] = e->keys[i];
      vals[j] = e->vals[i];
    }
  shm_free(e->keys);
  shm_free(e->vals);
  e->keys = keys;
  e->vals = vals;
  e->cap = cap;
  return 0;
}

int env_set_steal(Env *e, const char *name, Value *v) {
  if (!v) {   /* its maker failed, the error set: no scope holds a NULL */
    if (!err_occurred()) err_nomem();
    return -1;
  }
  if (!name) {   /* interning the name failed: out of memory */
    val_decref(v);
    return err_nomem(), -1;
  }
  Value **s = env_slot(e, name);
  if (s) {
    Value *old = *s;
    *s = v;
    val_decref(old);
    return 0;
  }
  if ((e->n + 1) * 4 > e->cap * 3 && env_grow(e) < 0) {
    val_decref(v);
    return -1;
  }
  size_t mask = (size_t)e->cap - 1, i = ptr_hash(name) & mask;
  while (e->keys[i]) i = (i + 1) & mask;
  e->keys[i] = name;
  e->vals[i] = v;
  e->n++;
  env_outer_changed(e);
  return 0;
}

int env_set(Env *e, const char *name, Value *v) {
  return env_set_steal(e, name, val_incref(v));
}

Env *env_parent(const Env *e) { return e->parent; }

void env_each(Env *e, void (*fn)(const char *name, Value *v, void *ctx), void *ctx) {
  for (int i = 0; i < e->cap; i++)
    if (e->keys[i]) fn(e->keys[i], e->vals[i], ctx);
}

typedef struct Binding {
  const char *name;
  Value *v;
} Binding;

static int by_binding_name(const void *x, const void *y) {
  return strcmp(((const Binding *)x)->name, ((const Binding *)y)->name);
}

int env_each_sorted(Env *e, void (*fn)(const char *name, Value *v, void *ctx), void *ctx) {
  Binding *b = shm_malloc(sizeof *b * ((size_t)e->n + 1));
  if (!b) return err_nomem(), -1;
  int n = 0;
  for (int i = 0; i < e->cap && n < e->n; i++)
    if (e->keys[i]) b[n++] = (Binding){e->keys[i], e->vals[i]};
  qsort(b, (size_t)n, sizeof *b, by_binding_name);
  for (int i = 0; i < n; i++) fn(b[i].name, b[i].v, ctx);
  shm_free(b);
  return 0;
}

/* The module scope: the outermost ancestor. */
static Env *env_module(Env *e) {
  while (e->parent) e = e->parent;
  return e;
}

/* env_target of a name of [e] declared global or nonlocal there: the
 * module's scope, or the nearest enclosing function scope binding it. */
static Env *env_declared_target(Env *e, const char *name) {
  for (int i = 0; i < e->ndeclared; i++) {
    if (e->declared[i] != name) continue;
    if (e->declared_global[i]) return env_module(e);
    for (Env *p = e->parent; p && p->parent; p = p->parent)
      if (env_slot(p, name)) return p;
    return env_module(e);
  }
  return e;
}

/* Where an assignment to [name] in [e] goes: itself, or the scope named by
 * a `global` / `nonlocal` declaration. */
static inline Env *env_target(Env *e, const char *name) {
  return e->ndeclared ? env_declared_target(e, name) : e;
}

/* env_target for a binding about to change: NULL, with the error set,
 * when [name] is declared global or nonlocal and that scope is outside
 * the shard_map body this thread runs (value.h: who may change a
 * container). */
static Env *env_target_w(Env *e, const char *name) {
  Env *t = env_target(e, name);
  if (t == e || !val_writer || t->writer == val_writer) return t;   /* no message to build */
  char what[160];
  snprintf(what, sizeof what, "'%s', a name of a scope outside this shard_map body", name);
  return val_check_writer(t->writer, what) < 0 ? NULL : t;
}

/* Unbinds [name] from [e] (not its parents): 0, or -1 when it is not
 * bound there.  Linear probing's deletion: the entries after it that
 * probed past its slot move back. */
static int env_del(Env *e, const char *name) {
  if (!e->cap) return -1;
  size_t mask = (size_t)e->cap - 1, i = ptr_hash(name) & mask;
  while (e->keys[i] != name) {
    if (!e->keys[i]) return -1;
    i = (i + 1) & mask;
  }
  Value *v = e->vals[i];
  e->keys[i] = NULL;
  e->vals[i] = NULL;
  e->n--;
  for (size_t j = (i + 1) & mask; e->keys[j]; j = (j + 1) & mask) {
    size_t home = ptr_hash(e->keys[j]) & mask;
    bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays) continue;
    e->keys[i] = e->keys[j];
    e->vals[i] = e->vals[j];
    e->keys[j] = NULL;
    e->vals[j] = NULL;
    i = j;
  }
  val_decref(v);
  return 0;
}

/* ==== the parsed tree as a value, so functions keep their code alive ==== */

typedef struct TreeRef {
  Opaque base;
  AstModule *mod;
} TreeRef;

static void tree_free(Value *v) { ast_free(((TreeRef *)v)->mod); }
static const OpaqueType tree_type = {"code", tree_free, NULL, NULL, NULL, NULL, NULL};

static Value *tree_ref_new(AstModule *mod) {
  TreeRef *t = shm_malloc(sizeof *t);
  if (!t) {
    ast_free(mod);
    return err_nomem();
  }
  val_init(&t->base.hdr, V_OPAQUE);
  t->base.ot = &tree_type;
  t->mod = mod;
  return &t->base.hdr;
}

/* Finds the TreeRef of [mod]: kept in a per-thread cache set by whoever
 * runs code of that module (eval_source, calls of Funcs). */
static _Thread_local Value *cur_tree;

/* ==== functions ============================================================= */

static void func_free(Value *v) {
  Func *f = (Func *)v;
  for (int i = 0; f->defaults && i < f->node->nparams; i++) val_decref(f->defaults[i]);
  shm_free(f->defaults);
  env_decref(f->closure);
  val_decref(f->mod_ref);
  shm_free(f);
}

/* How a statement ended.  OUT_JUMP: the statement hook asked to go on at
 * cur_frame->jump instead (eval.h); the block holding that statement
 * takes it (exec_block). */
typedef enum { OUT_OK, OUT_ERR, OUT_RETURN, OUT_BREAK, OUT_CONTINUE, OUT_JUMP } Outcome;

static Value *eval(const Node *n, Env *env);
static Outcome exec_block(const NodeList *body, Env *env, Value **ret);

Value *eval_make_func(const Node *node, Env *env, AstModule *mod) {
  Func *f = shm_calloc(1, sizeof *f);
  if (!f) return err_nomem();
  val_init(&f->hdr, V_FUNC);
  f->name = node->kind == N_LAMBDA ? intern_cstr("<lambda>") : node->name;
  f->mod = mod;
  f->mod_ref = val_incref(cur_tree);
  f->node = node;
  f->closure = env;
  env_incref(env);
  f->defaults = shm_calloc((size_t)node->nparams + 1, sizeof(Value *));
  if (!f->defaults) {
    val_decref(&f->hdr);
    return err_nomem();
  }
  for (int i = 0; i < node->nparams; i++) {
    if (!node->params[i].deflt) continue;
    f->defaults[i] = eval(node->params[i].deflt, env);
    if (!f->defaults[i]) {
      val_decref(&f->hdr);
      return NULL;
    }
  }
  return &f->hdr;
}

/* Binds a call's arguments to [f]'s parameters in the fresh scope [e],
 * with Python's rules and messages. */
static int bind_params(Func *f, Env *e, const CallArgs *a) {
  const Node *d = f->node;
  int np = d->nparams, npos = 0;
  int star = -1, starstar = -1;
  for (int i = 0; i < np; i++) {
    if (d->params[i].star) star = i;
    else if (d->params[i].starstar) starstar = i;
    else if (star < 0) npos++;
  }
  bool *set = shm_calloc((size_t)np + 1, sizeof *set);
  if (!set) {
    err_nomem();
    return -1;
  }
  int rc = -1;
  Value *extra = NULL, *kwextra = NULL;
  bool bare = star >= 0 && !d->params[star].name;   /* def f(x, *, k): no *args */
  if (a->nargs > npos && (star < 0 || bare)) {
    err_set(ERR_TYPE, "%s() takes %d positional argument%s but %d %s given", f->name,
            npos, npos == 1 ? "" : "s", a->nargs, a->nargs == 1 ? "was" : "were");
    goto out;
  }
  for (int i = 0; i < a->nargs && i < npos; i++) {
    if (env_set(e, d->params[i].name, a->args[i]) < 0) goto out;
    set[i] = true;
  }
  if (star >= 0 && bare) set[star] = true;
  if (star >= 0 && !bare) {
    extra = tuple_new(a->nargs > npos ? (size_t)(a->nargs - npos) : 0);
    if (!extra) goto out;
    for (int i = npos; i < a->nargs; i++)
      tuple_set_steal(extra, (size_t)(i - npos), val_incref(a->args[i]));
    if (env_set(e, d->params[star].name, extra) < 0) goto out;
    set[star] = true;
  }
  if (starstar >= 0) {
    if (!(kwextra = dict_new())) goto out;
    if (env_set(e, d->params[starstar].name, kwextra) < 0) goto out;
    set[starstar] = true;
  }
  for (int k = 0; k < a->nkw; k++) {
    int i = 0;
    while (i < np && (d->params[i].name != a->kwnames[k] || d->params[i].star ||
                      d->params[i].starstar))
      i++;
    if (i == np) {
      if (kwextra) {
        if (dict_set_str(kwextra, a->kwnames[k], a->kwvals[k]) < 0) goto out;
        continue;
      }
      Suggest sg;
      suggest_init(&sg, a->kwnames[k]);
      for (int j = 0; j < np; j++)
        if (!d->params[j].star && !d->params[j].starstar) suggest_offer(&sg, d->params[j].name);
      if (suggest_best(&sg))
        err_set(ERR_TYPE, "%s() got an unexpected keyword argument '%s'. Did you mean '%s'?",
                f->name, a->kwnames[k], suggest_best(&sg));
      else
        err_set(ERR_TYPE, "%s() got an unexpected keyword argument '%s'", f->name,
                a->kwnames[k]);
      goto out;
    }
    if (set[i]) {
      err_set(ERR_TYPE, "%s() got multiple values for argument '%s'", f->name,
              a->kwnames[k]);
      goto out;
    }
    if (env_set(e, d->params[i].name, a->kwvals[k]) < 0) goto out;
    set[i] = true;
  }
  for (int i = 0; i < np; i++) {
    if (set[i]) continue;
    if (!f->defaults[i]) {
      err_set(ERR_TYPE, "%s() missing required argument '%s'", f->name,
              d->params[i].name);
      goto out;
    }
    if (env_set(e, d->params[i].name, f->defaults[i]) < 0) goto out;
  }
  rc = 0;
out:
  val_decref(extra);
  val_decref(kwextra);
  shm_free(set);
  return rc;
}

/* After a call returns, its scope may be held only by closures bound in
 * the scope itself (a nested def): a reference cycle.  When every extra
 * reference comes from such a closure and nothing else holds the closures,
 * clear the scope so the cycle is freed. */
void env_release_scope(Env *e) {
  int refs = atomic_load(&e->refcount), inner = 0;
  if (refs == 1) {
    env_decref(e);
    return;
  }
  for (int i = 0; i < e->cap; i++) {
    Value *v = e->keys[i] ? e->vals[i] : NULL;
    if (v && v->type == V_FUNC && ((Func *)v)->closure == e && val_refcount(v) == 1)
      inner++;
  }
  if (refs - 1 == inner) env_clear(e);
  else scope_keep(e);
  env_decref(e);
}

/* The depth limit counts calls, but calls differ in the stack they take
 * (a jit function's trace nests a dozen frames more, sanitizers grow every
 * frame): a call is also refused when less than STACK_MARGIN bytes of
 * this thread's stack are left, so deep recursion is an error, never a
 * stack overflow.  The stack's end is measured once per thread. */
#define STACK_MARGIN (512 * 1024)
static _Thread_local uintptr_t stack_floor;   /* 0: not measured yet */

static bool stack_low(void) {
  if (!stack_floor) {
    pthread_attr_t at;
    void *base;
    size_t size;
    stack_floor = 1;   /* unknown: never low */
    if (pthread_getattr_np(pthread_self(), &at) == 0) {
      if (pthread_attr_getstack(&at, &base, &size) == 0 && size > 2 * STACK_MARGIN)
        stack_floor = (uintptr_t)base + STACK_MARGIN;
      pthread_attr_destroy(&at);
    }
  }
  return (uintptr_t)__builtin_frame_address(0) < stack_floor;
}

/* The error of a call past the depth limit or the stack's margin, or 0. */
static int too_deep(void) {
  if (cur_depth >= MAX_DEPTH)
    return err_set(ERR_VALUE, "maximum recursion depth exceeded (%d calls)", MAX_DEPTH), -1;
  if (stack_low())
    return err_set(ERR_VALUE, "maximum recursion depth exceeded (%d calls, and the stack "
                   "is nearly full)", cur_depth), -1;
  return 0;
}

/* Runs the return hook as frame [f] returns *[ret] (NULL: None) from
 * [at]; true when it aborts the call, with *[ret] released and the error
 * set.  Called with [f] still current, so the debugger sees the returning
 * frame on top of the stack. */
static bool return_hook_aborts(Frame *f, const Node *at, Value **ret) {
  if (eval_return_hook(f, at, *ret ? *ret : VAL_NONE) == 0) return false;
  val_decref(*ret);
  *ret = NULL;
  return true;
}

static inline bool hook_due(void);

/* The call hook for frame [f] of [def] (eval.h): OUT_OK, or OUT_ERR when
 * it aborts the call. */
static Outcome run_call_hook(Frame *f, const Node *def) {
  if (!eval_call_hook || !hook_due()) return OUT_OK;
  f->stmt = def;   /* where the stop shows the frame: its def line */
  int h = eval_call_hook(f, def);
  f->stmt = NULL;
  return h ? OUT_ERR : OUT_OK;
}

/* Runs the statements [body] in [env] as the body of a call of def [def]
 * (block-form shard_map bodies are defs too): the returned value (None
 * when it falls off the end), or NULL with the error set. */
static Value *eval_run_body(const NodeList *body, Env *env, AstModule *mod, const char *fname,
                            const Node *def) {
  Frame fr = {.back = cur_frame, .fname = fname, .env = env, .mod = mod, .def = def};
  if (too_deep() < 0) return NULL;
  cur_frame = &fr;
  cur_depth++;
  Value *ret = NULL;
  Outcome o = def ? run_call_hook(&fr, def) : OUT_OK;   /* a class body has no def */
  if (o == OUT_OK) o = exec_block(body, env, &ret);
  if (eval_return_hook && fr.stmt && (o == OUT_OK || o == OUT_RETURN) &&
      return_hook_aborts(&fr, fr.stmt, &ret))
    o = OUT_ERR;
  cur_depth--;
  cur_frame = fr.back;
  if (o == OUT_ERR) {
    /* the frame and its scope join the error, for the debugger's pm() */
    if (fr.stmt) err_push_scope(fr.stmt->loc, fname, env);
    return NULL;
  }
  if (o == OUT_BREAK || o == OUT_CONTINUE) {
    val_decref(ret);
    return err_set(ERR_SYNTAX, "'%s' outside loop", o == OUT_BREAK ? "break" : "continue");
  }
  if (o == OUT_JUMP) return err_set(ERR_VALUE, "jump: the statement to go on at is not in "
                                    "the function's blocks");
  return ret ? ret : VAL_NONE;
}

static Value *call_func(Func *f, const CallArgs *a) {
  Env *e = env_new(f->closure);
  if (!e) return NULL;
  Value *ret = NULL;
  Value *saved_tree = cur_tree;
  cur_tree = f->mod_ref;
  if (bind_params(f, e, a) == 0) {
    if (f->node->kind == N_LAMBDA && too_deep() < 0) {
      /* counted as eval_run_body counts */
    } else if (f->node->kind == N_LAMBDA) {
      Frame fr = {.back = cur_frame, .fname = f->name, .env = e, .mod = f->mod, .def = f->node};
      cur_frame = &fr;
      cur_depth++;
      Loc at_call = cur_loc;   /* a lambda has no statement: it leaves where it was called */
      ret = eval(f->node->a, e);
      cur_loc = at_call;
      if (ret && eval_return_hook && return_hook_aborts(&fr, f->node, &ret)) ret = NULL;
      cur_depth--;
      cur_frame = fr.back;
    } else {
      ret = eval_run_body(&f->node->body, e, f->mod, f->name, f->node);
    }
  }
  cur_tree = saved_tree;
  env_release_scope(e);
  /* the calling line joins the error's traceback as it leaves f */
  if (!ret && cur_frame && cur_frame->stmt)
    err_push_frame(cur_frame->stmt->loc, cur_frame->fname, cur_depth);
  return ret;
}

/* ==== calls ================================================================= */

static Value *(*call_hooks[V_TYPE_COUNT])(Value *f, const CallArgs *a);

void eval_register_call(VType t, Value *(*call)(Value *f, const CallArgs *a)) {
  call_hooks[t] = call;
}

/* The opaque types of higher layers that are callable (few: a table). */
static struct {
  const OpaqueType *ot;
  Value *(*call)(Value *f, const CallArgs *a);
} opaque_calls[8];
static int n_opaque_calls;

int eval_register_opaque_call(const OpaqueType *ot, Value *(*call)(Value *f, const CallArgs *a)) {
  if (n_opaque_calls == (int)(sizeof opaque_calls / sizeof opaque_calls[0]))
    return err_set(ERR_VALUE, "too many callable opaque types"), -1;
  opaque_calls[n_opaque_calls].ot = ot;
  opaque_calls[n_opaque_calls++].call = call;
  return 0;
}

static Value *call_dtype(Value *f, const CallArgs *a) {
  if (a->nargs != 1 || a->nkw)
    return err_set(ERR_TYPE, "%s() takes exactly one argument", dt_name(((DTypeVal *)f)->dtype));
  /* an array, as jnp.bool_(True) is, not the Python number itself */
  return bi_arr_dtype(a->args[0], ((DTypeVal *)f)->dtype);
}

/* val_call's dispatch, with no NumPy bookkeeping. */
static Value *call_plain(Value *f, const CallArgs *a) {
  switch ((VType)f->type) {
  case V_FUNC: return call_func((Func *)f, a);
  case V_BUILTIN: return ((Builtin *)f)->fn(a);
  case V_BOUND: return ((BoundMethod *)f)->fn(((BoundMethod *)f)->self, a);
  case V_DTYPE: return call_dtype(f, a);
  case V_OPAQUE:
    for (int i = 0; i < n_opaque_calls; i++)
      if (opaque_calls[i].ot == ((Opaque *)f)->ot) return opaque_calls[i].call(f, a);
    break;
  default: break;
  }
  if (call_hooks[f->type]) return call_hooks[f->type](f, a);
  return err_set(ERR_TYPE, "'%s' object is not callable", val_type_name(f));
}

/* A jit or shard_map call, under JAX's mode, given copies of its NumPy
 * arguments (top level and in tuples and lists: hostnp.h's ownership
 * rule), its results never NumPy arrays. */
static Value *call_jax_fn(Value *f, const CallArgs *a) {
  int n = a->nargs + a->nkw;
  Value **args = shm_calloc((size_t)n + 1, sizeof *args);
  if (!args) return err_nomem();
  int made = 0;
  for (; made < n; made++) {
    Value *v = made < a->nargs ? a->args[made] : a->kwvals[made - a->nargs];
    if (!(args[made] = hostnp_detach(val_incref(v)))) break;
  }
  Value *r = NULL;
  if (made == n) {
    CallArgs c = {a->nargs, args, a->nkw, a->kwnames, args + a->nargs};
    r = hostnp_detach(call_plain(f, &c));
  }
  for (int i = 0; i < made; i++) val_decref(args[i]);
  shm_free(args);
  return r;
}

/* val_call once numpy is imported: a Python function runs its operators
 * under ARR_NP_AUTO; a built-in function (jax's) under ARR_NP_JAX, never
 * returning a NumPy array, unless numpy's function or method calls it
 * (ARR_NP_HOST) or it is one of Python's (len, max: they keep the
 * caller's mode and return what they are given); jit and shard_map
 * calls as call_jax_fn; methods (numpy's own included, which set their
 * mode) keep the caller's.  array.h, "Host NumPy arrays". */
static __attribute__((noinline)) Value *call_np(Value *f, const CallArgs *a) {
  ArrNpMode saved = arr_np_mode;
  Value *r;
  switch ((VType)f->type) {
  case V_FUNC:
    arr_np_mode = ARR_NP_AUTO;
    r = call_plain(f, a);
    break;
  case V_BUILTIN:   /* Python's, or under numpy's own functions and methods: as they are */
    if (saved == ARR_NP_HOST || ((Builtin *)f)->python) return call_plain(f, a);
    arr_np_mode = ARR_NP_JAX;
    r = hostnp_detach(call_plain(f, a));
    break;
  case V_JITFN: case V_SHARDFN: case V_PLAN:
    arr_np_mode = ARR_NP_JAX;
    r = call_jax_fn(f, a);
    break;
  default:
    r = call_plain(f, a);
    break;
  }
  arr_np_mode = saved;
  return r;
}

Value *val_call(Value *f, const CallArgs *a) {
  if (arr_np_is_live()) return call_np(f, a);
  return call_plain(f, a);
}

bool val_callable(Value *f) {
  switch ((VType)f->type) {
  case V_FUNC: case V_BUILTIN: case V_BOUND: case V_DTYPE: return true;
  case V_OPAQUE:
    for (int i = 0; i < n_opaque_calls; i++)
      if (opaque_calls[i].ot == ((Opaque *)f)->ot) return true;
    return cls_callable(f);
  default: return call_hooks[f->type] != NULL;
  }
}

Value *val_call_n(Value *f, int n, Value **args) {
  CallArgs a = {.nargs = n, .args = args};
  return val_call(f, &a);
}

/* ==== expressions =========================================================== */

static void offer_name(const char *name, Value *v, void *ctx) {
  (void)v;
  suggest_offer(ctx, name);
}

/* NameError for [name] in [env], with Python 3.12's "Did you mean" over
 * the names of the scopes in reach and the built-ins. */
static Value *name_error(const Node *n, Env *env) {
  Suggest s;
  suggest_init(&s, n->name);
  for (Env *e = env; e; e = e->parent) env_each(e, offer_name, &s);
  env_each(shm_interp->builtins, offer_name, &s);
  if (suggest_best(&s))
    return err_set_at(n->loc, ERR_NAME, "name '%s' is not defined. Did you mean: '%s'?",
                      n->name, suggest_best(&s));
  return err_set_at(n->loc, ERR_NAME, "name '%s' is not defined", n->name);
}

Value *eval_lookup_name(const Node *n, Env *env) {
  return env_lookup_name(env, n);
}

Value eval_declined;

static Value *eval_name(const Node *n, Env *env) {
  Value *v = env_lookup_name(env, n);
  if (!v) return name_error(n, env);
  return val_incref(v);
}

/* Whether evaluating [n] can run no user code, so nothing can rebind a
 * name read before it. */
static bool eval_is_leaf(const Node *n) { return n->kind == N_NAME || n->kind == N_CONST; }

/* [n]'s value for an operator: a bound name's value borrowed, with [bit]
 * set in [*kept] (no reference taken: two atomic operations a name
 * saved), else a new reference.  [borrow] false: always a reference. */
static Value *eval_operand(const Node *n, Env *env, bool borrow, unsigned *kept,
                           unsigned bit) {
  if (borrow && n->kind == N_NAME) {
    Value *v = env_lookup_name(env, n);
    if (v) {
      *kept |= bit;
      return v;
    }
  }
  return eval(n, env);
}

/* The primitive an arithmetic operator applies, as jax_debug_nans names
 * it ("invalid value (nan) encountered in div"). */
static const char *op_prim_name(OpKind op) {
  switch (op) {
  case OP_ADD: return "add";
  case OP_SUB: return "sub";
  case OP_MUL: return "mul";
  case OP_DIV: return "div";
  case OP_FLOORDIV: return "floor_divide";
  case OP_MOD: return "rem";
  case OP_POW: return "pow";
  case OP_MATMUL: return "dot_general";
  case OP_NEG: return "neg";
  default: return "an operator";
  }
}

/* a <op> b.  A name on the left is borrowed only when the right side is a
 * name or a constant: any other right side may run code that rebinds it. */
static Value *eval_binop_plain(const Node *n, Env *env) {
  unsigned kept = 0;
  Value *a = eval_operand(n->a, env, eval_is_leaf(n->b), &kept, 1u);
  if (!a) return NULL;
  Value *b = eval_operand(n->b, env, true, &kept, 2u);
  if (!b) {
    if (!(kept & 1u)) val_decref(a);
    return NULL;
  }
  cur_loc = n->loc;   /* the equation a jit traces here is located as this error is */
  Value *r = ops_binary_kept(n->op, a, b, kept);
  if (!(kept & 1u)) val_decref(a);
  if (!(kept & 2u)) val_decref(b);
  return jaxcfg_check_nans(r, op_prim_name(n->op));
}

static Value *eval_unary_plain(const Node *n, Env *env) {
  Value *a = eval(n->a, env);
  if (!a) return NULL;
  Value *r;
  cur_loc = n->loc;
  if (n->op == OP_NOT) {
    int t = val_truth(a);
    r = t < 0 ? NULL : val_incref(val_bool(!t));
  } else {
    r = jaxcfg_check_nans(ops_unary(n->op, a), op_prim_name(n->op));
  }
  val_decref(a);
  return r;
}

/* `a and b`, `a or b`: Python's short circuit, yielding an operand. */
static Value *eval_boolop(const Node *n, Env *env) {
  Value *a = eval(n->a, env);
  if (!a) return NULL;
  int t = val_truth(a);
  if (t < 0 || (n->op == OP_AND ? !t : t)) {
    if (t < 0) {
      val_decref(a);
      return NULL;
    }
    return a;
  }
  val_decref(a);
  return eval(n->b, env);
}

/* a < b <= c: each comparison on adjacent items, stopping at the first
 * false one, as Python does.  Array comparisons give arrays; a chain of
 * more than one then needs their truth value. */
static Value *eval_compare(const Node *n, Env *env) {
  Value *left = eval(n->items.items[0], env);
  if (!left) return NULL;
  Value *res = NULL;
  for (int i = 1; i < n->items.n; i++) {
    Value *right = eval(n->items.items[i], env);
    if (!right) goto fail;
    val_decref(res);
    cur_loc = n->loc;
    res = ops_compare(n->ops[i - 1], left, right);
    val_decref(left);
    left = right;
    if (!res) goto fail;
    if (i + 1 < n->items.n) {
      int t = val_truth(res);
      if (t < 0) goto fail;
      if (!t) break;
    }
  }
  val_decref(left);
  return res;
fail:
  val_decref(left);
  val_decref(res);
  return NULL;
}

static Value *eval_ifexp(const Node *n, Env *env) {
  Value *c = eval(n->a, env);
  if (!c) return NULL;
  int t = val_truth(c);
  val_decref(c);
  if (t < 0) return NULL;
  return eval(t ? n->b : n->c, env);
}

/* Evaluates a call's arguments into [a], expanding *seq and **dict.  The
 * usual few arguments live in the buffer itself: a call allocates
 * nothing for them. */
#define ARGBUF_INLINE 6

typedef struct ArgBuf {
  CallArgs a;
  int cap, kwcap, nheld, heldcap;
  Value **held;  /* every evaluated value, owned (items of *seq borrowed) */
  Value *args_inl[ARGBUF_INLINE], *held_inl[ARGBUF_INLINE], *kwvals_inl[ARGBUF_INLINE];
  const char *kwnames_inl[ARGBUF_INLINE];
} ArgBuf;

static void argbuf_init(ArgBuf *b) {
  b->a = (CallArgs){0, b->args_inl, 0, b->kwnames_inl, b->kwvals_inl};
  b->cap = b->kwcap = b->heldcap = ARGBUF_INLINE;
  b->nheld = 0;
  b->held = b->held_inl;
}

static void argbuf_free(ArgBuf *b) {
  for (int i = 0; i < b->nheld; i++) val_decref(b->held[i]);
  if (b->a.args != b->args_inl) shm_free(b->a.args);
  if (b->a.kwnames != b->kwnames_inl) shm_free((void *)b->a.kwnames);
  if (b->a.kwvals != b->kwvals_inl) shm_free(b->a.kwvals);
  if (b->held != b->held_inl) shm_free(b->held);
}

/* Makes room for one more element in [*arr] of [n] of [*cap], moving it
 * off the inline array [inl] when it grows. */
static int argbuf_grow(void **arr, void *inl, int n, int *cap, size_t elem) {
  if (n < *cap) return 0;
  int ncap = *cap * 2;
  void *na = shm_malloc((size_t)ncap * elem);
  if (!na) return err_nomem(), -1;
  memcpy(na, *arr, (size_t)n * elem);
  if (*arr != inl) shm_free(*arr);
  *arr = na;
  *cap = ncap;
  return 0;
}

/* Keeps [v] (stolen) until the call is over; on failure releases it. */
static int argbuf_hold(ArgBuf *b, Value *v) {
  if (argbuf_grow((void **)&b->held, b->held_inl, b->nheld, &b->heldcap, sizeof(Value *)) < 0) {
    val_decref(v);
    return -1;
  }
  b->held[b->nheld++] = v;
  return 0;
}

static int argbuf_push(ArgBuf *b, Value *v) {
  if (argbuf_grow((void **)&b->a.args, b->args_inl, b->a.nargs, &b->cap, sizeof(Value *)) < 0)
    return -1;
  b->a.args[b->a.nargs++] = v;
  return 0;
}

static int argbuf_kw(ArgBuf *b, const char *name, Value *v) {
  for (int k = 0; k < b->a.nkw; k++)
    if (b->a.kwnames[k] == name) {
      err_set(ERR_TYPE, "keyword argument repeated: '%s'", name);
      return -1;
    }
  int cap = b->kwcap;
  if (argbuf_grow((void **)&b->a.kwnames, b->kwnames_inl, b->a.nkw, &cap, sizeof(char *)) < 0 ||
      argbuf_grow((void **)&b->a.kwvals, b->kwvals_inl, b->a.nkw, &b->kwcap, sizeof(Value *)) < 0)
    return -1;
  b->a.kwnames[b->a.nkw] = name;
  b->a.kwvals[b->a.nkw++] = v;
  return 0;
}

static int eval_star_arg(ArgBuf *b, Value *v) {
  Value *items = v->type == V_LIST || v->type == V_TUPLE ? val_incref(v) : ops_iter_items(v);
  if (!items) return -1;
  size_t n;
  Value *const *it;
  val_seq(items, &n, &it);
  int rc = argbuf_hold(b, items);
  for (size_t i = 0; rc == 0 && i < n; i++) rc = argbuf_push(b, it[i]);
  return rc;
}

static int eval_starstar_arg(ArgBuf *b, Value *v) {
  if (v->type != V_DICT || val_is_set(v)) {
    err_set(ERR_TYPE, "argument after ** must be a dict, not %s", val_type_name(v));
    return -1;
  }
  Dict *d = (Dict *)v;
  for (size_t i = 0; i < d->len; i++) {
    if (d->keys[i]->type != V_STR) {
      err_set(ERR_TYPE, "keywords must be strings");
      return -1;
    }
    if (argbuf_kw(b, intern_cstr(str_cstr(d->keys[i])), d->vals[i]) < 0) return -1;
  }
  return 0;
}

static Value *const_value(const Node *n);

static int eval_args(const Node *n, Env *env, ArgBuf *b) {
  argbuf_init(b);
  for (int i = 0; i < n->items.n; i++) {
    const Node *arg = n->items.items[i];
    if (arg->kind == N_CONST && arg->value->type == V_STR) {
      /* borrowed: constants are held while the code runs (by the code, or
       * the device's cache until its body ends), and strings are never
       * changed in place (arrays may be, when held once) */
      if (argbuf_push(b, const_value(arg)) < 0) return -1;
      continue;
    }
    Value *v = eval(arg->kind == N_STARRED ? arg->a : arg, env);
    if (!v || argbuf_hold(b, v) < 0) return -1;
    int rc = arg->kind == N_STARRED ? eval_star_arg(b, v) : argbuf_push(b, v);
    if (rc < 0) return -1;
  }
  for (int k = 0; k < n->nkw; k++) {
    Value *v = eval(n->kws[k].value, env);
    if (!v || argbuf_hold(b, v) < 0) return -1;
    int rc = n->kws[k].name ? argbuf_kw(b, n->kws[k].name, v) : eval_starstar_arg(b, v);
    if (rc < 0) return -1;
  }
  return 0;
}

static Value *eval_call_plain(const Node *n, Env *env) {
  Value *f = eval(n->a, env);
  if (!f) return NULL;
  ArgBuf b;
  Value *r = NULL;
  if (eval_args(n, env, &b) == 0) {
    cur_loc = n->loc;
    r = val_call(f, &b.a);
    if (f->type == V_BUILTIN || f->type == V_BOUND)   /* a user function's operations check themselves */
      r = jaxcfg_check_nans(r, f->type == V_BUILTIN ? ((Builtin *)f)->name : ((BoundMethod *)f)->name);
    if (!r) err_locate(n->loc);
    /* a call that failed deeper (a shard_map body, a function a built-in
     * called) adds this calling line (err_push_frame skips the line the
     * error itself is on, and a repeat of the last calling line) */
    if (!r && f->type != V_FUNC && cur_frame && cur_frame->stmt)
      err_push_frame(cur_frame->stmt->loc, cur_frame->fname, cur_depth);
  }
  argbuf_free(&b);
  val_decref(f);
  return r;
}

static Value *eval_seq(const Node *n, Env *env, bool tuple) {
  Value *l = list_new((size_t)n->items.n);
  if (!l) return NULL;
  for (int i = 0; i < n->items.n; i++) {
    const Node *it = n->items.items[i];
    Value *v = eval(it->kind == N_STARRED ? it->a : it, env);
    if (!v) goto fail;
    if (it->kind != N_STARRED) {
      if (list_append_steal(l, v) < 0) goto fail;
      continue;
    }
    Value *items = v->type == V_LIST || v->type == V_TUPLE ? val_incref(v) : ops_iter_items(v);
    val_decref(v);
    if (!items) goto fail;
    size_t k;
    Value *const *xs;
    val_seq(items, &k, &xs);
    for (size_t j = 0; j < k; j++)
      if (list_append(l, xs[j]) < 0) {
        val_decref(items);
        goto fail;
      }
    val_decref(items);
  }
  if (!tuple) return l;
  Value *t = tuple_pack(list_len(l), ((List *)l)->items);
  val_decref(l);
  return t;
fail:
  val_decref(l);
  return NULL;
}

static Value *eval_dict(const Node *n, Env *env) {
  Value *d = dict_new();
  if (!d) return NULL;
  for (int i = 0; i < n->items.n; i++) {
    Value *k = eval(n->items.items[i], env);
    Value *v = k ? eval(n->items2.items[i], env) : NULL;
    int rc = v ? dict_set(d, k, v) : -1;
    val_decref(k);
    val_decref(v);
    if (rc < 0) {
      val_decref(d);
      return NULL;
    }
  }
  return d;
}

/* {a, b, *c}: a set of the items, starred ones spread. */
static Value *eval_set(const Node *n, Env *env) {
  Value *items = eval_seq(n, env, false), *s = items ? set_new(false) : NULL;
  for (size_t i = 0; s && i < list_len(items); i++)
    if (set_add(s, list_get(items, i)) < 0) {
      val_decref(s);
      s = NULL;
    }
  val_decref(items);
  return s;
}

static Value *eval_slice(const Node *n, Env *env) {
  Value *p[3] = {NULL, NULL, NULL};
  const Node *parts[3] = {n->a, n->b, n->c};
  for (int i = 0; i < 3; i++)
    if (parts[i] && !(p[i] = eval(parts[i], env))) {
      for (int j = 0; j < i; j++) val_decref(p[j]);
      return NULL;
    }
  Value *s = slice_new(p[0], p[1], p[2]);
  for (int i = 0; i < 3; i++) val_decref(p[i]);
  return s;
}

static Value *eval_subscript(const Node *n, Env *env) {
  Value *obj = eval(n->a, env);
  if (!obj) return NULL;
  Value *idx = eval(n->b, env);
  cur_loc = n->loc;
  Value *r = idx ? ops_getitem(obj, idx) : NULL;
  val_decref(obj);
  val_decref(idx);
  return r;
}

static Value *eval_attr(const Node *n, Env *env) {
  Value *obj = eval(n->a, env);
  if (!obj) return NULL;
  cur_loc = n->loc2;
  Value *r = ops_getattr(obj, n->name);
  if (!r) err_locate(n->loc2);
  val_decref(obj);
  return r;
}

static int assign(const Node *target, Value *v, Env *env);
static inline Outcome for_each(const Node *target, Value *iter, Env *env,
                               Outcome (*body)(Env *env, void *ctx), void *ctx);

typedef struct CompCtx {
  const Node *n;
  int clause;
  Value *out;
} CompCtx;

static Outcome comp_step(Env *env, void *vctx);

/* Runs clause [c->clause] of a comprehension: its conditions, then either
 * the next clause or the element. */
static Outcome comp_body(Env *env, void *vctx) {
  CompCtx *c = vctx;
  const CompClause *cl = &c->n->clauses[c->clause];
  for (int i = 0; i < cl->conds.n; i++) {
    Value *t = eval(cl->conds.items[i], env);
    int ok = t ? val_truth(t) : -1;
    val_decref(t);
    if (ok < 0) return OUT_ERR;
    if (!ok) return OUT_OK;
  }
  if (c->clause + 1 < c->n->nclauses) {
    c->clause++;
    Outcome o = comp_step(env, c);
    c->clause--;
    return o;
  }
  Value *v = eval(c->n->a, env);
  if (v && c->n->b) {   /* a dict comprehension: the key, then the value, as Python */
    Value *val = eval(c->n->b, env);
    int rc = val ? dict_set(c->out, v, val) : -1;
    val_decref(v);
    val_decref(val);
    return rc < 0 ? OUT_ERR : OUT_OK;
  }
  if (v && c->n->is_set) {
    int rc = set_add(c->out, v);
    val_decref(v);
    return rc < 0 ? OUT_ERR : OUT_OK;
  }
  if (!v || list_append_steal(c->out, v) < 0) return OUT_ERR;
  return OUT_OK;
}

static Outcome comp_step(Env *env, void *vctx) {
  CompCtx *c = vctx;
  const CompClause *cl = &c->n->clauses[c->clause];
  Value *it = eval(cl->iter, env);
  if (!it) return OUT_ERR;
  Outcome o = for_each(cl->target, it, env, comp_body, c);
  val_decref(it);
  return o;
}

/* A lazy generator expression's state (iter.h's iter_gen): its node, its
 * own scope, and the tree the node lives in, kept alive as a Func keeps
 * its own. */
typedef struct GenCtx {
  const Node *n;
  Env *scope;
  Value *mod_ref;
} GenCtx;

/* The values the generator expression makes of one item of its first
 * iterable: its first target bound, then the rest of it as a
 * comprehension's body runs. */
static int gen_step(void *vctx, Value *item, Value *out) {
  GenCtx *g = vctx;
  if (assign(g->n->clauses[0].target, item, g->scope) < 0) return -1;
  CompCtx c = {.n = g->n, .clause = 0, .out = out};
  Value *saved_tree = cur_tree;
  cur_tree = g->mod_ref;   /* a lambda made here belongs to the expression's tree */
  Outcome o = comp_body(g->scope, &c);
  cur_tree = saved_tree;
  return o == OUT_ERR ? -1 : 0;
}

static void gen_release(void *vctx) {
  GenCtx *g = vctx;
  env_decref(g->scope);
  val_decref(g->mod_ref);
  shm_free(g);
}

/* A generator expression over the lazy iterator [src] in [scope]: lazy
 * too, so `next(i for i in count() if p(i))` ends (iter.h). */
static Value *make_gen(const Node *n, Env *scope, Value *src) {
  GenCtx *g = shm_malloc(sizeof *g);
  if (!g) return err_nomem();
  env_incref(scope);
  *g = (GenCtx){.n = n, .scope = scope, .mod_ref = val_incref(cur_tree)};
  return iter_gen(src, gen_step, gen_release, g);
}

/* A list comprehension, or a generator expression (a lazy iterator),
 * whose first iterable is evaluated first (in Python too, where the
 * expression is written). */
static Value *eval_listcomp(const Node *n, Env *env) {
  Env *scope = env_new(env);
  if (!scope) return NULL;
  CompCtx c = {.n = n, .clause = 0, .out = NULL};
  Value *it = eval(n->clauses[0].iter, scope);
  if (it && n->is_gen) {   /* a generator, as Python's: lazy over any iterable */
    Value *src = iter_over(it), *g = src ? make_gen(n, scope, src) : NULL;
    val_decref(src);
    val_decref(it);
    env_decref(scope);
    return g;
  }
  c.out = !it ? NULL : n->b ? dict_new() : n->is_set ? set_new(false) : list_new(0);
  Outcome o = c.out ? for_each(n->clauses[0].target, it, scope, comp_body, &c) : OUT_ERR;
  val_decref(it);
  env_decref(scope);
  if (o == OUT_ERR) {
    val_decref(c.out);
    return NULL;
  }
  return c.out;
}

/* ==== source constants on device threads ===================================== */

/* A literal is one Value shared by every thread that runs its code; on
 * device threads counting its references would bounce its cache line
 * between cores on every use (`x * 2.0` in a loop).  So each device
 * thread evaluates a constant to a private copy, made at first use and
 * kept until its shard_map body ends (eval_const_cache_clear).  The
 * cache also holds the original, so its address is not reused while the
 * entry lives.  Copies are never changed in place: the cache's reference
 * keeps their count above 1. */
#define CONST_CACHE_SIZE 256  /* a power of two; when full, constants are shared */

typedef struct ConstEntry {
  Value *orig, *copy;
} ConstEntry;

static _Thread_local ConstEntry const_cache[CONST_CACHE_SIZE];
static _Thread_local int const_cache_used;

/* A private copy of [v] (a new reference), or NULL for types that are
 * not copied (immortal values; anything but strings and arrays). */
static Value *const_copy(Value *v) {
  if (v->flags & VAL_IMMORTAL) return NULL;
  if (v->type == V_STR) return str_new(str_cstr(v), ((Str *)v)->len);
  if (v->type == V_ARRAY && AS_ARRAY(v)->host) return arr_host_copy(AS_ARRAY(v));
  if (v->type == V_ARRAY) return (Value *)arr_copy(AS_ARRAY(v));
  return NULL;
}

/* The value of constant [n], borrowed: on a device, its private copy. */
static Value *const_value(const Node *n) {
  Value *v = n->value;
  if (!eval_on_device || (v->flags & VAL_IMMORTAL)) return v;
  size_t h = ((uintptr_t)v >> 4) & (CONST_CACHE_SIZE - 1);
  for (int probe = 0; probe < CONST_CACHE_SIZE; probe++) {
    ConstEntry *e = &const_cache[(h + (size_t)probe) & (CONST_CACHE_SIZE - 1)];
    if (e->orig == v) return e->copy;
    if (e->orig) continue;
    if (const_cache_used >= CONST_CACHE_SIZE / 2) break;  /* keep probes short */
    Value *c = const_copy(v);
    if (!c) {
      err_clear();  /* a failed copy just falls back to sharing */
      break;
    }
    e->orig = val_incref(v);
    e->copy = c;
    const_cache_used++;
    return c;
  }
  return v;
}

static Value *eval_const(const Node *n) { return val_incref(const_value(n)); }

void eval_const_cache_clear(void) {
  for (int i = 0; const_cache_used && i < CONST_CACHE_SIZE; i++) {
    ConstEntry *e = &const_cache[i];
    if (!e->orig) continue;
    val_decref(e->copy);
    val_decref(e->orig);
    e->orig = e->copy = NULL;
    const_cache_used--;
  }
}

/* eval_fuse_try, unless [n] is known not to root an element-wise tree
 * (most operators: one load of its memo). */
static inline Value *eval_fusing(const Node *n, Env *env,
                                 Value *(*plain)(const Node *, Env *)) {
  if (__atomic_load_n(&n->fuse, __ATOMIC_RELAXED) == EVAL_FUSE_NO ||
      atomic_load_explicit(&jaxcfg_debug_nans, memory_order_relaxed))   /* op by op, each checked */
    return plain(n, env);
  return eval_fuse_try(n, env, plain);
}

static Value *eval_inner(const Node *n, Env *env) {
  switch (n->kind) {
  case N_NAME: return eval_name(n, env);
  case N_CONST: return eval_const(n);
  case N_BINOP: return eval_fusing(n, env, eval_binop_plain);
  case N_UNARY:
    return n->op == OP_NEG ? eval_fusing(n, env, eval_unary_plain) : eval_unary_plain(n, env);
  case N_BOOLOP: return eval_boolop(n, env);
  case N_COMPARE: return eval_compare(n, env);
  case N_IFEXP: return eval_ifexp(n, env);
  case N_CALL: return eval_fusing(n, env, eval_call_plain);
  case N_ATTR: return eval_attr(n, env);
  case N_SUBSCRIPT: return eval_subscript(n, env);
  case N_SLICE: return eval_slice(n, env);
  case N_TUPLE: return eval_seq(n, env, true);
  case N_LIST: return eval_seq(n, env, false);
  case N_DICT: return eval_dict(n, env);
  case N_SET: return eval_set(n, env);
  case N_LISTCOMP: return eval_listcomp(n, env);
  case N_LAMBDA: return eval_make_func(n, env, cur_frame ? cur_frame->mod : NULL);
  case N_STARRED:
    return err_set_at(n->loc, ERR_SYNTAX, "can't use starred expression here");
  default:
    return err_set_at(n->loc, ERR_SYNTAX, "not an expression");
  }
}

static Value *eval(const Node *n, Env *env) {
  Value *v = eval_inner(n, env);
  if (!v) err_locate(n->loc);
  return v;
}

Value *eval_node(const Node *n, Env *env) { return eval(n, env); }

/* ==== assignment ============================================================ */

static int assign_unpack(const Node *target, Value *v, Env *env) {
  int nt = target->items.n, star = -1, rc = -1;
  for (int i = 0; i < nt; i++)
    if (target->items.items[i]->kind == N_STARRED) star = i;
  /* of a lazy iterator, one item more than the targets: "too many values"
   * of an endless one, as Python says, instead of reading it all */
  Value *items = v->type == V_LIST || v->type == V_TUPLE ? val_incref(v)
               : iter_is(v) && star < 0 ? iter_take(v, (size_t)nt + 1)
                                        : ops_iter_items(v);
  if (!items) return -1;
  size_t n;
  Value *const *xs;
  val_seq(items, &n, &xs);
  size_t need = (size_t)(star >= 0 ? nt - 1 : nt);
  if (star < 0 ? n != need : n < need) {
    err_set(ERR_VALUE, n > need ? "too many values to unpack (expected %zu)"
                                : "not enough values to unpack (expected %zu, got %zu)",
            need, n);
    goto out;
  }
  size_t j = 0;
  for (int i = 0; i < nt; i++) {
    const Node *t = target->items.items[i];
    if (i == star) {
      size_t k = n - need;
      Value *rest = list_new(k);
      if (!rest) goto out;
      for (size_t q = 0; q < k; q++) list_append(rest, xs[j + q]);
      j += k;
      int r = assign(t->a, rest, env);
      val_decref(rest);
      if (r < 0) goto out;
    } else if (assign(t, xs[j++], env) < 0) {
      goto out;
    }
  }
  rc = 0;
out:
  val_decref(items);
  return rc;
}

static int assign_item(const Node *target, Value *v, Env *env) {
  Value *obj = eval(target->a, env);
  Value *key = obj ? eval(target->b, env) : NULL;
  int rc = -1;
  if (!key || val_check_container(obj) < 0) goto out;
  if (obj->type == V_DICT && !val_is_set(obj)) {
    rc = dict_set(obj, key, v);
  } else if (obj->type == V_LIST) {
    rc = ops_list_setitem(obj, key, v);
  } else if (arr_is_np(obj)) {   /* host NumPy: written in place */
    rc = hostnp_setitem(obj, key, v);
  } else if (obj->type == V_ARRAY || obj->type == V_TRACER) {   /* JAX's message, eager and traced */
    err_set(ERR_TYPE, "'Array' object does not support item assignment. JAX arrays are immutable. "
                      "Instead of x[idx] = y, use x = x.at[idx].set(y) or another .at[] method");
  } else {
    err_set(ERR_TYPE, "'%s' object does not support item assignment", val_type_name(obj));
  }
out:
  val_decref(obj);
  val_decref(key);
  return rc;
}

/* assign, taking [v]'s reference: a name then binds it without the pair
 * of reference-count changes (atomic, so not free) a borrowed value costs. */
static int assign_steal(const Node *target, Value *v, Env *env) {
  if (target->kind == N_NAME) {
    Env *e = env_target_w(env, target->name);
    if (!e) {
      val_decref(v);
      err_locate(target->loc);
      return -1;
    }
    Value **s = env_slot_hinted(e, target);
    if (!s) return env_set_steal(e, target->name, v);
    Value *old = *s;
    *s = v;
    val_decref(old);
    return 0;
  }
  int rc = assign(target, v, env);
  val_decref(v);
  return rc;
}

/* obj.name = v: the attributes of instances and classes (classes.h). */
static int assign_attr(const Node *target, Value *v, Env *env) {
  Value *obj = eval(target->a, env);
  if (!obj) return -1;
  int rc = cls_setattr(obj, target->name, v);
  val_decref(obj);
  return rc;
}

static int assign(const Node *target, Value *v, Env *env) {
  int rc;
  switch (target->kind) {
  case N_NAME: {
    Env *e = env_target_w(env, target->name);
    rc = e ? env_set(e, target->name, v) : -1;
    break;
  }
  case N_TUPLE:
  case N_LIST: rc = assign_unpack(target, v, env); break;
  case N_SUBSCRIPT: rc = assign_item(target, v, env); break;
  case N_ATTR: rc = assign_attr(target, v, env); break;
  default:
    err_set(ERR_SYNTAX, "cannot assign to this expression");
    rc = -1;
  }
  if (rc < 0) err_locate(target->loc);
  return rc;
}

/* ==== statements ============================================================ */

static Outcome exec_stmt(const Node *s, Env *env, Value **ret);

/* The statement a jump lands on, on this thread: exec_stmt runs it
 * without the hook, which has just stopped there (pdb's jump: the line
 * jumped to runs when the program resumes, with no second stop). */
static _Thread_local const Node *jump_landing;

/* The index in [body] of the current frame's jump target, or -1 when it
 * is not one of [body]'s statements (then the jump goes on outwards: from
 * a loop's header to the block holding the loop).  Found, the jump is
 * taken: the target is cleared and marked to run without the hook. */
static int jump_index(const NodeList *body) {
  const Node *to = cur_frame ? cur_frame->jump : NULL;
  for (int i = 0; to && i < body->n; i++)
    if (body->items[i] == to) {
      cur_frame->jump = NULL;
      jump_landing = to;
      return i;
    }
  return -1;
}

/* Runs the statements of [body] in order; a debugger's jump to one of
 * them (OUT_JUMP) goes on from there.  Inline where a loop runs its
 * body, whose frame then serves it; exec_block elsewhere. */
static inline __attribute__((always_inline)) Outcome exec_block_inline(const NodeList *body,
                                                                       Env *env, Value **ret) {
  for (int i = 0; i < body->n; i++) {
    Outcome o = exec_stmt(body->items[i], env, ret);
    if (__builtin_expect(o == OUT_OK, 1)) continue;
    if (o == OUT_ERR) err_locate(body->items[i]->loc);   /* one no expression claimed */
    int to = o == OUT_JUMP ? jump_index(body) : -1;
    if (to < 0) return o;
    i = to - 1;
  }
  return OUT_OK;
}

static Outcome exec_block(const NodeList *body, Env *env, Value **ret) {
  return exec_block_inline(body, env, ret);
}

/* Whether the statement hook is to run now (eval.h). */
static inline bool hook_due(void) {
  return eval_stmt_hook &&
         (eval_hook_here || atomic_load_explicit(&eval_hook_all, memory_order_relaxed) ||
          atomic_load_explicit(&shm_debugger_interrupted, memory_order_relaxed));
}

/* Runs the statement hook for [s] in frame [f]: OUT_OK to run [s],
 * OUT_ERR (the debugger's quit) or OUT_JUMP (eval.h). */
static Outcome run_hook(Frame *f, const Node *s) {
  int h = eval_stmt_hook(f, s);
  return h == 0 ? OUT_OK : h == EVAL_HOOK_JUMP ? OUT_JUMP : OUT_ERR;
}

static int check_interrupt(Loc loc) {
  if (!atomic_load_explicit(&shm_interrupted, memory_order_relaxed)) return 0;
  err_set_at(loc, ERR_INTERRUPT, "interrupted");
  return -1;
}

/* Whether [v] is an int as val_int(x) makes it that only its binding
 * holds (value.h: a count of 1 means changeable in place). */
static bool int_reusable(const Value *v, int64_t x) {
  if (v->type != V_ARRAY) return false;
  const Array *a = (const Array *)v;
  DType t = (x >= INT32_MIN && x <= INT32_MAX) ? DT_I32 : DT_I64;
  return a->ndim == 0 && a->dtype == t && a->host && a->vma == 0 && arr_sole_holder(a);
}

/* Writes [x] into the host int [a] of dtype int32 or int64. */
static inline void int_overwrite(Array *a, int64_t x) {
  if (a->dtype == DT_I32)
    ((int32_t *)a->buf->data)[a->offset] = (int32_t)x;
  else
    ((int64_t *)a->buf->data)[a->offset] = x;
}

/* Whether [v], the int a range loop holds (*held below), is still held
 * only by the loop and its binding, unviewed, and of [x]'s dtype: of
 * what int_reusable checked when the loop took it, the fields another
 * holder could have changed since (the two counts, the immortal mark
 * val_static sets, the mesh axes); its type, shape, host mark and
 * payload stay as they were. */
static inline bool held_reusable(const Value *v, int64_t x) {
  const Array *a = (const Array *)v;
  DType t = (x >= INT32_MIN && x <= INT32_MAX) ? DT_I32 : DT_I64;
  return val_refcount(v) == 2 &&
         atomic_load_explicit(&((Buffer *)a->buf)->refcount, memory_order_acquire) == 1 &&
         !(v->flags & VAL_IMMORTAL) && a->vma == 0 && a->dtype == t;
}

/* assign_range_item past its first test: the int the name holds is
 * overwritten when int_reusable says so, and then becomes [*held]; else
 * a new int is bound. */
static __attribute__((noinline)) int assign_range_slow(const Node *target, Env *env, int64_t x,
                                                       Value **held) {
  if (target->kind == N_NAME && env_target(env, target->name) == env) {
    Value **s = env_slot_hinted(env, target);
    if (s && *s && int_reusable(*s, x)) {
      int_overwrite(AS_ARRAY(*s), x);
      val_decref(*held);
      *held = val_incref(*s);
      return 0;
    }
  }
  Value *v = val_int(x);
  return v ? assign_steal(target, v, env) : -1;
}

/* Binds a range loop's variable [target] to [x]: its current int is
 * overwritten when nothing else holds it, which saves an allocation and
 * a free per iteration; else a new int.  [*held] is a reference the loop
 * keeps to the int it last overwrote (NULL at first; the caller drops
 * it when the loop ends): while the binding still holds that int and
 * nothing else does, its count is 2, and the next item goes into it
 * after the few tests of held_reusable, inline in the loop. */
static inline __attribute__((always_inline)) int assign_range_item(const Node *target, Env *env,
                                                                  int64_t x, Value **held) {
  if (*held && env_target(env, target->name) == env) {   /* held: target is a name */
    Value **s = env_slot_hinted(env, target);
    if (s && *s == *held && held_reusable(*s, x)) {
      int_overwrite(AS_ARRAY(*s), x);
      return 0;
    }
  }
  return assign_range_slow(target, env, x, held);
}

/* for_each over a lazy iterator (iter.h): one item pulled per step, so a
 * loop over one that never ends runs until its body breaks out. */
static Outcome for_each_lazy(const Node *target, Value *iter, Env *env,
                             Outcome (*body)(Env *env, void *ctx), void *ctx) {
  Outcome res = OUT_OK;
  while (res == OUT_OK) {
    Value *x = iter_next(iter);
    if (!x) return err_occurred() ? OUT_ERR : OUT_OK;
    int rc = assign(target, x, env);
    val_decref(x);
    res = rc < 0 || check_interrupt(target->loc) < 0 ? OUT_ERR : body(env, ctx);
  }
  return res == OUT_BREAK ? OUT_OK : res;
}

/* Iterates [iter], assigning each item to [target] and running [body].
 * Inlined into each caller, so [body], a constant there, is a direct
 * call (a loop's per-iteration cost is mostly such calls). */
static inline __attribute__((always_inline)) Outcome
for_each(const Node *target, Value *iter, Env *env, Outcome (*body)(Env *env, void *ctx),
         void *ctx) {
  if (iter->type == V_RANGE) {
    Range *r = (Range *)iter;
    int64_t n = range_len(iter);
    Value *held = NULL;
    Outcome res = OUT_OK;
    for (int64_t i = 0; i < n && res == OUT_OK; i++) {
      int rc = assign_range_item(target, env, r->start + i * r->step, &held);
      res = rc < 0 || check_interrupt(target->loc) < 0 ? OUT_ERR : body(env, ctx);
    }
    val_decref(held);
    return res == OUT_BREAK ? OUT_OK : res;
  }
  if (iter_is(iter)) return for_each_lazy(target, iter, env, body, ctx);
  Value *items = iter->type == V_LIST || iter->type == V_TUPLE ? val_incref(iter)
                                                               : ops_iter_items(iter);
  if (!items) return OUT_ERR;
  size_t n;
  Value *const *xs;
  val_seq(items, &n, &xs);
  Outcome res = OUT_OK;
  for (size_t i = 0; i < n; i++) {
    if (assign(target, xs[i], env) < 0 || check_interrupt(target->loc) < 0) {
      res = OUT_ERR;
      break;
    }
    Outcome o = body(env, ctx);
    if (o == OUT_BREAK) break;
    if (o != OUT_OK) {
      res = o;
      break;
    }
  }
  val_decref(items);
  return res;
}

typedef struct LoopCtx {
  const Node *s;
  Value **ret;
  bool broke;
} LoopCtx;

/* del target, ...: unbinds names, removes list items and slices and dict
 * keys, with Python's errors. */
static int del_one(const Node *t, Env *env) {
  if (t->kind == N_NAME) {
    Env *e = env_target_w(env, t->name);
    if (!e) {
      err_locate(t->loc);
      return -1;
    }
    if (env_del(e, t->name) == 0) return 0;
    err_set_at(t->loc, ERR_NAME, "name '%s' is not defined", t->name);
    return -1;
  }
  Value *obj = eval(t->a, env);
  Value *key = obj ? eval(t->b, env) : NULL;
  int rc = -1;
  if (!key || val_check_container(obj) < 0) goto out;
  if (obj->type == V_LIST) {
    rc = ops_list_delitem(obj, key);
  } else if (obj->type == V_DICT && !val_is_set(obj)) {
    rc = dict_del(obj, key) ? 0 : -1;
    if (rc < 0) {
      Value *r = val_repr(key);
      err_set(ERR_INDEX, "KeyError: %s", r ? str_cstr(r) : "?");
      val_decref(r);
    }
  } else if (ops_is_array(obj)) {
    err_set(ERR_TYPE, "arrays are immutable: use x = x.at[idx].set(...) instead of del x[idx]");
  } else {
    err_set(ERR_TYPE, "'%s' object doesn't support item deletion", val_type_name(obj));
  }
out:
  val_decref(obj);
  val_decref(key);
  if (rc < 0) err_locate(t->loc);
  return rc;
}

static Outcome exec_del(const Node *s, Env *env) {
  for (int i = 0; i < s->items.n; i++)
    if (del_one(s->items.items[i], env) < 0) return OUT_ERR;
  return OUT_OK;
}

/* The exception an `except` block is handling on this thread (for a bare
 * `raise`), innermost first. */
typedef struct Handling {
  ErrState err;
  struct Handling *outer;
} Handling;
static _Thread_local Handling *handling;

/* Runs [h]'s block for the pending error: binds its `as` name to the
 * exception (unbound after, as in Python) and makes the error the one a
 * bare `raise` re-raises. */
static Outcome run_handler(const Node *h, Env *env, Value **ret) {
  Value *e = h->name ? exc_current() : NULL;
  if (h->name && !e) return OUT_ERR;
  Handling hd = {.outer = handling};
  err_save(&hd.err);
  Env *scope = h->name ? env_target_w(env, h->name) : env;
  if (e && (!scope || env_set(scope, h->name, e) < 0)) {
    /* the name cannot be bound (a global of a shard_map body): that error
     * replaces the one being handled, as any error raised in a handler */
    val_decref(e);
    err_state_free(&hd.err);
    err_locate(h->loc);
    return OUT_ERR;
  }
  val_decref(e);
  handling = &hd;
  Outcome o = exec_block(&h->body, env, ret);
  handling = hd.outer;
  if (h->name) env_del(env_target(env, h->name), h->name);
  err_state_free(&hd.err);
  return o;
}

/* try/except/else/finally, Python's. */
static Outcome exec_try(const Node *s, Env *env, Value **ret) {
  Outcome o = exec_block(&s->body, env, ret);
  if (o == OUT_ERR) {
    for (int i = 0; i < s->items.n; i++) {
      const Node *h = s->items.items[i];
      Value *type = NULL;
      ErrState pending;
      if (h->a) {   /* the handler's type is evaluated with the error set aside */
        err_save(&pending);
        type = eval(h->a, env);
        if (!type) {
          err_state_free(&pending);
          return OUT_ERR;
        }
        err_restore(&pending);
      }
      int m = exc_matches(type);
      val_decref(type);
      if (m < 0) return OUT_ERR;
      if (m) {
        o = run_handler(h, env, ret);
        break;
      }
    }
  } else if (o == OUT_OK && s->orelse.n) {
    o = exec_block(&s->orelse, env, ret);
  }
  if (!s->items2.n) return o;
  /* finally: runs whatever happened; its own error, return or break wins */
  ErrState saved = {0};
  bool had = o == OUT_ERR;
  if (had) err_save(&saved);
  Value *kept = o == OUT_RETURN ? *ret : NULL;
  if (kept) *ret = NULL;
  Outcome f = exec_block(&s->items2, env, ret);
  if (f != OUT_OK) {
    if (had) err_state_free(&saved);
    val_decref(kept);
    return f;
  }
  if (had) err_restore(&saved);
  if (kept) *ret = kept;
  return o;
}

/* ---- with ---------------------------------------------------------------- */

static Value *(*context_enter[V_TYPE_COUNT])(Value *self);
static int (*context_exit[V_TYPE_COUNT])(Value *self);

void eval_register_context(VType t, Value *(*enter)(Value *self), int (*exit)(Value *self)) {
  context_enter[t] = enter;
  context_exit[t] = exit;
}

/* with CM [as NAME]: BODY -- CM's exit runs however the body ends (an
 * error stays the error unless exit fails too; exit never swallows it). */
static Outcome exec_with(const Node *s, Env *env, Value **ret) {
  Value *cm = eval(s->a, env);
  if (!cm) return OUT_ERR;
  const OpaqueType *ot = cm->type == V_OPAQUE ? ((Opaque *)cm)->ot : NULL;
  Value *(*enter)(Value *) = ot ? ot->enter : context_enter[cm->type];
  int (*exit_)(Value *) = ot ? ot->exit : context_exit[cm->type];
  if (!enter || !exit_) {
    err_set_at(s->a->loc, ERR_TYPE, "'%s' object does not support the context manager protocol",
               val_type_name(cm));
    val_decref(cm);
    return OUT_ERR;
  }
  Value *v = enter(cm);
  Outcome o = OUT_ERR;
  if (!v) {
    err_locate(s->a->loc);
  } else {
    int rc = s->name ? env_set(env, s->name, v) : 0;
    val_decref(v);
    o = rc < 0 ? OUT_ERR : exec_block(&s->body, env, ret);
  }
  if (v) {
    ErrState saved = {0};
    bool had = o == OUT_ERR;
    if (had) err_save(&saved);
    if (exit_(cm) < 0) {
      err_locate(s->a->loc);
      if (had) err_state_free(&saved);
      if (o == OUT_RETURN && *ret) {
        val_decref(*ret);
        *ret = NULL;
      }
      o = OUT_ERR;
    } else if (had) {
      err_restore(&saved);
    }
  }
  val_decref(cm);
  return o;
}

/* raise [X]: X a class or an instance; bare, the exception being handled. */
static Outcome exec_raise(const Node *s, Env *env) {
  if (!s->a) {
    if (!handling) {
      err_set_at(s->loc, ERR_VALUE, "RuntimeError: No active exception to reraise");
      return OUT_ERR;
    }
    ErrState copy = err_state_copy(&handling->err);
    err_restore(&copy);
    return OUT_ERR;
  }
  Value *v = eval(s->a, env);
  if (!v) return OUT_ERR;
  exc_raise(v, s->loc);
  val_decref(v);
  return OUT_ERR;
}

/* Runs the debugger's hook on a loop header again, before the next item
 * or test: as in Python, a breakpoint or a step lands on the `for` or
 * `while` line once per iteration, not only when the loop starts. */
static inline Outcome loop_header_again(const Node *s) {
  Frame *f = cur_frame;
  if (!eval_stmt_hook || !f) return OUT_OK;
  f->stmt = s;
  cur_loc = s->loc;
  return hook_due() ? run_hook(f, s) : OUT_OK;
}

/* One iteration of a for loop: the body, then the header's hook.
 * Inline in exec_for's copy of for_each, which saves a call a turn. */
static inline __attribute__((always_inline)) Outcome loop_body(Env *env, void *vctx) {
  LoopCtx *c = vctx;
  Outcome o = exec_block_inline(&c->s->body, env, c->ret);
  if (o == OUT_CONTINUE) o = OUT_OK;
  if (o == OUT_BREAK) c->broke = true;
  if (o == OUT_OK) o = loop_header_again(c->s);
  return o;
}

static Outcome exec_for(const Node *s, Env *env, Value **ret) {
  Value *it = eval(s->b, env);
  if (!it) return OUT_ERR;
  LoopCtx c = {.s = s, .ret = ret};
  Outcome o = for_each(s->a, it, env, loop_body, &c);
  if (o == OUT_ERR) err_locate(s->b->loc);   /* making the next item; the body's are located */
  val_decref(it);
  if (o == OUT_OK && !c.broke) return exec_block(&s->orelse, env, ret);
  return o;
}

static Outcome exec_while(const Node *s, Env *env, Value **ret) {
  for (;;) {
    if (check_interrupt(s->loc) < 0) return OUT_ERR;
    Value *c = eval(s->a, env);
    int t = c ? val_truth(c) : -1;
    val_decref(c);
    if (t < 0) {
      err_locate(s->a->loc);
      return OUT_ERR;
    }
    if (!t) return exec_block(&s->orelse, env, ret);
    Outcome o = exec_block(&s->body, env, ret);
    if (o == OUT_BREAK) return OUT_OK;
    if (o != OUT_OK && o != OUT_CONTINUE) return o;
    if ((o = loop_header_again(s)) != OUT_OK) return o;
  }
}

static Outcome exec_if(const Node *s, Env *env, Value **ret) {
  Value *c = eval(s->a, env);
  int t = c ? val_truth(c) : -1;
  val_decref(c);
  if (t < 0) {
    err_locate(s->a->loc);
    return OUT_ERR;
  }
  return exec_block(t ? &s->body : &s->orelse, env, ret);
}

/* A leaf's value, borrowed: a bound name's or a constant's; NULL (no
 * error) for an unbound name. */
static inline Value *leaf_peek(const Node *n, Env *env) {
  if (n->kind == N_CONST) return const_value(n);
  return env_lookup_name(env, n);
}

/* name = a <op> b, or one comparison a <cmp> b, with names or constants
 * for a and b, written into the array the name holds when nothing else
 * holds it (ops_binary_into): a loop's small operation then allocates
 * and frees nothing.  Leaves only: evaluating them runs no code that
 * could take or drop the old value.  False when the statement must run
 * the usual way. */
static bool assign_binop_in_place(const Node *s, Env *env) {
  const Node *t = s->items.items[0], *n = s->a, *l, *r;
  if (s->items.n != 1 || t->kind != N_NAME) return false;
  if (n->kind == N_BINOP) {
    l = n->a;
    r = n->b;
  } else if (n->kind == N_COMPARE && n->items.n == 2) {   /* its op is its one operator */
    l = n->items.items[0];
    r = n->items.items[1];
  } else {
    return false;
  }
  if (!eval_is_leaf(l) || !eval_is_leaf(r)) return false;
  if (env_target(env, t->name) != env) return false;   /* declared: env_target_w's checks */
  Value **slot = env_slot_hinted(env, t);
  if (!slot || !*slot || (*slot)->type != V_ARRAY) return false;
  Value *a = leaf_peek(l, env), *b = a ? leaf_peek(r, env) : NULL;
  return b && ops_binary_into(n->op, a, b, *slot);
}

/* targets = value, the value made anew and bound to each target. */
static __attribute__((noinline)) Outcome exec_assign_new(const Node *s, Env *env) {
  Value *v = eval(s->a, env);
  if (!v) return OUT_ERR;
  for (int i = 0; i + 1 < s->items.n; i++)
    if (assign(s->items.items[i], v, env) < 0) {
      val_decref(v);
      return OUT_ERR;
    }
  return assign_steal(s->items.items[s->items.n - 1], v, env) < 0 ? OUT_ERR : OUT_OK;
}

/* An assignment: in place when it can be (assign_binop_in_place), else
 * exec_assign_new, kept out of line so this path saves few registers. */
static __attribute__((noinline)) Outcome exec_assign(const Node *s, Env *env) {
  if (assign_binop_in_place(s, env)) return OUT_OK;
  return exec_assign_new(s, env);
}

/* name += str where [cur] (one reference of it ours) is the string the
 * name still holds and nothing else holds: the text is appended in place
 * (str_append_owned), as CPython does for a string with one holder, so a
 * loop of `s += 'ab'` is linear, not quadratic.  False when the statement
 * must make a new string (another holder would see the change); true with
 * [*rc] the outcome otherwise. */
static bool augassign_str_in_place(const Node *s, Env *env, Value *cur, Value *rhs,
                                   Outcome *rc) {
  const Node *t = s->a;
  if (s->op != OP_ADD || t->kind != N_NAME || cur->type != V_STR || rhs->type != V_STR ||
      (cur->flags & VAL_IMMORTAL) || env_target(env, t->name) != env)
    return false;
  Value **slot = env_slot_hinted(env, t);   /* again: evaluating rhs may have moved it */
  if (!slot || *slot != cur || atomic_load(&cur->refcount) != 2) return false;
  val_decref(cur);   /* the binding's reference is the only one left */
  Value *v = str_append_owned(cur, str_cstr(rhs), ((Str *)rhs)->len);
  if (v) *slot = v;
  else err_locate(s->loc);
  *rc = v ? OUT_OK : OUT_ERR;
  return true;
}

/* target op= value.  A list extended (+=) in place, as Python's
 * list.__iadd__ (so other names for it see the change), and bound again
 * to the target; a NumPy array (a 0-d one too, but not NumPy's scalars,
 * which are bound anew) written in place, as ndarray.__iadd__; a string with one holder
 * appended to in place; anything else target = target op value. */
static Outcome exec_augassign(const Node *s, Env *env) {
  Value *cur = eval(s->a, env);
  if (!cur) return OUT_ERR;
  Value *rhs = eval(s->b, env), *v = NULL;
  Outcome rc;
  if (rhs && augassign_str_in_place(s, env, cur, rhs, &rc)) {
    val_decref(rhs);
    return rc;
  }
  if (rhs && s->op == OP_ADD && cur->type == V_LIST)
    v = ops_list_extend(cur, rhs) < 0 ? NULL : val_incref(cur);
  else if (rhs && arr_is_np(cur) && (AS_ARRAY(cur)->ndim || AS_ARRAY(cur)->buf->np_0d))   /* NumPy's a += b */
    v = hostnp_inplace(s->op, cur, rhs);
  else if (rhs) {
    cur_loc = s->loc;   /* a jit's equation is located as this statement's error */
    v = ops_binary(s->op, cur, rhs);
  }
  val_decref(cur);
  val_decref(rhs);
  if (!v) {
    err_locate(s->loc);
    return OUT_ERR;
  }
  return assign_steal(s->a, v, env) < 0 ? OUT_ERR : OUT_OK;
}

/* [f] (stolen) through the decorators of def or class [s], the last
 * first, as Python applies them: a new reference, or NULL with the error
 * set at the failing decorator. */
static Value *decorate(const Node *s, Value *f, Env *env) {
  for (int i = s->decorators.n - 1; f && i >= 0; i--) {
    Value *d = eval(s->decorators.items[i], env);
    Value *g = d ? val_call_n(d, 1, &f) : NULL;
    val_decref(d);
    val_decref(f);
    if (!g) err_locate(s->decorators.items[i]->loc);
    f = g;
  }
  return f;
}

static Outcome exec_def(const Node *s, Env *env) {
  Value *f = eval_make_func(s, env, cur_frame ? cur_frame->mod : NULL);
  if (!f || !(f = decorate(s, f, env))) return OUT_ERR;
  if (s->is_jit) {
    if (!eval_make_jit) {
      val_decref(f);
      err_set_at(s->loc, ERR_VALUE, "jit is not available in this build");
      return OUT_ERR;
    }
    if (!(f = eval_make_jit(f))) {
      err_locate(s->loc);
      return OUT_ERR;
    }
  }
  int rc = env_set(env, s->name, f);
  val_decref(f);
  return rc < 0 ? OUT_ERR : OUT_OK;
}

/* class NAME(bases): body.  The body runs in a scope of its own whose
 * parent holds only `__class__` (CPython's cell, for super()); the
 * methods close over the body's scope, which cls_new empties once its
 * bindings are the class's attributes, so methods see the enclosing
 * scope and not the class's names, as in Python. */
static Outcome exec_class(const Node *s, Env *env) {
  Value *inl[4], **bases = s->items.n <= 4 ? inl : shm_calloc((size_t)s->items.n, sizeof *bases);
  int nb = 0;
  Value *cls = NULL, *ann = NULL;
  Env *cell = NULL, *body = NULL;
  if (!bases) {
    err_nomem();
    goto out;
  }
  for (; nb < s->items.n; nb++)
    if (!(bases[nb] = eval(s->items.items[nb], env))) goto out;
  const char *annotations = intern_cstr("__annotations__");
  if (!annotations) {
    err_nomem();
    goto out;
  }
  if (!(cell = env_new(env)) || !(body = env_new(cell)) || !(ann = dict_new()) ||
      env_set(body, annotations, ann) < 0)
    goto out;
  Value *r = eval_run_body(&s->body, body, cur_frame ? cur_frame->mod : NULL, s->name, NULL);
  if (!r) goto out;
  val_decref(r);
  cls = cls_new(s->name, nb, bases, body, cell, &s->body);
  if (cls) cls = decorate(s, cls, env);
out:
  for (int i = 0; i < nb; i++) val_decref(bases[i]);
  if (bases != inl) shm_free(bases);
  val_decref(ann);
  if (body) env_decref(body);
  if (cell) env_decref(cell);
  if (!cls) {
    err_locate(s->loc);
    return OUT_ERR;
  }
  int rc = env_set(env, s->name, cls);
  val_decref(cls);
  return rc < 0 ? OUT_ERR : OUT_OK;
}

/* Whether annotation [n] is typing.ClassVar (bare or subscripted): a
 * dataclass's field it is not. */
static bool is_classvar(const Node *n) {
  if (n->kind == N_SUBSCRIPT) n = n->a;
  return (n->kind == N_NAME || n->kind == N_ATTR) && !strcmp(n->name, "ClassVar");
}

/* target: annotation [= value]: an assignment when there is a value; a
 * class body records the name in __annotations__ (the annotation itself
 * is not evaluated, as with `from __future__ import annotations`: the
 * record is None, or the string 'ClassVar' for a ClassVar). */
static Outcome exec_annassign(const Node *s, Env *env) {
  if (s->a->kind == N_NAME) {
    const char *annotations = intern_cstr("__annotations__");
    if (!annotations) return err_nomem(), OUT_ERR;
    Value **ann = env_slot(env, annotations);
    Value *mark = is_classvar(s->b) ? str_from("ClassVar") : VAL_NONE;
    int rc = mark && ann && *ann && (*ann)->type == V_DICT ? dict_set_str(*ann, s->a->name, mark) : 0;
    val_decref(mark);
    if (!mark || rc < 0) return OUT_ERR;
  }
  if (!s->c) return OUT_OK;
  Value *v = eval(s->c, env);
  if (!v) return OUT_ERR;
  return assign_steal(s->a, v, env) < 0 ? OUT_ERR : OUT_OK;
}

static Outcome exec_assert(const Node *s, Env *env) {
  Value *c = eval(s->a, env);
  int t = c ? val_truth(c) : -1;
  val_decref(c);
  if (t < 0) return OUT_ERR;
  if (t) return OUT_OK;
  if (!s->b) {
    err_set_at(s->loc, ERR_ASSERT, "AssertionError");   /* Python's line, the bare class */
    return OUT_ERR;
  }
  Value *m = eval(s->b, env);
  Value *ms = m ? val_str(m) : NULL;
  if (ms) err_set_at(s->loc, ERR_ASSERT, "%s", str_cstr(ms));
  val_decref(m);
  val_decref(ms);
  return OUT_ERR;
}

static const char *source_dir(const Node *s, char *buf, size_t cap) {
  const char *name = s->loc.src ? s->loc.src->name : ".";
  const char *slash = strrchr(name, '/');
  if (!slash || name[0] == '<') return ".";
  snprintf(buf, cap, "%.*s", (int)(slash - name), name);
  return buf;
}

/* `from pkg import name` where pkg has no attribute name: the submodule
 * pkg.name, as Python imports it (jax.experimental.multihost_utils from
 * the standard library's file of that name), made an attribute of
 * [pkg] (borrowed).  A new reference, or NULL with the error set (the
 * attribute error when there is no such submodule). */
static Value *import_submodule(const Node *s, Value *pkg, const char *from, const char *name) {
  char full[512];
  if (pkg->type != V_MODULE || snprintf(full, sizeof full, "%s.%s", s->name, name) >= (int)sizeof full)
    return NULL;
  ErrState attr;
  err_save(&attr);
  Value *m = eval_import(full, from);
  if (!m && err_kind() != ERR_IO) {   /* the submodule's own error */
    err_state_free(&attr);
    return NULL;
  }
  if (!m) {
    err_clear();
    err_restore(&attr);
    return NULL;
  }
  err_state_free(&attr);
  if (dict_set_str(((Module *)pkg)->globals, name, m) < 0) {
    val_decref(m);
    return NULL;
  }
  return m;
}

static Outcome exec_import(const Node *s, Env *env) {
  char dir[PATH_MAX];
  const char *from = source_dir(s, dir, sizeof dir);
  Value *m = eval_import(s->name, from);
  if (!m) {
    err_locate(s->loc);
    return OUT_ERR;
  }
  int rc = -1;
  if (s->kind == N_IMPORT && !s->alias && strchr(s->name, '.')) {
    /* `import jax.numpy` binds `jax`, as Python binds the top package */
    char top[256];
    snprintf(top, sizeof top, "%.*s", (int)strcspn(s->name, "."), s->name);
    Value *t = eval_import(top, from);
    rc = t ? env_set(env, intern_cstr(top), t) : -1;
    if (!t) err_locate(s->loc);
    /* and the submodule becomes an attribute of its parent (jax.test_util) */
    const char *last = strrchr(s->name, '.') + 1;
    size_t plen = (size_t)(last - 1 - s->name);
    char parent[256];
    snprintf(parent, sizeof parent, "%.*s", (int)plen, s->name);
    Value *pm = rc == 0 ? eval_import(parent, from) : NULL;
    if (pm && pm->type == V_MODULE && !dict_get_str(((Module *)pm)->globals, last))
      rc = dict_set_str(((Module *)pm)->globals, last, m);
    if (pm) val_decref(pm);
    else if (rc == 0) err_clear();   /* a parent that is no module: nothing to attach to */
    val_decref(t);
  } else if (s->kind == N_IMPORT) {
    const char *bind = s->alias ? s->alias : intern_cstr(s->name);
    rc = env_set(env, bind, m);
  } else if (s->nnames == 1 && strcmp(s->names[0], "*") == 0) {
    Dict *g = (Dict *)((Module *)m)->globals;
    rc = 0;
    for (size_t i = 0; rc == 0 && i < g->len; i++)
      if (g->keys[i]->type == V_STR && str_cstr(g->keys[i])[0] != '_')
        rc = env_set(env, intern_cstr(str_cstr(g->keys[i])), g->vals[i]);
  } else {
    rc = 0;
    for (int i = 0; rc == 0 && i < s->nnames; i++) {
      Value *v = ops_getattr(m, s->names[i]);
      if (!v && err_kind() == ERR_ATTRIBUTE) v = import_submodule(s, m, from, s->names[i]);
      if (!v) {
        err_set_at(s->loc, ERR_IO, "cannot import name '%s' from '%s'", s->names[i],
                   s->name);
        rc = -1;
        break;
      }
      const char *as = s->aliases && s->aliases[i] ? s->aliases[i] : s->names[i];
      rc = env_set(env, as, v);
      val_decref(v);
    }
  }
  val_decref(m);
  return rc < 0 ? OUT_ERR : OUT_OK;
}

static Outcome exec_declare(const Node *s, Env *env) {
  for (int i = 0; i < s->nnames; i++) {
    if (env->ndeclared == (int)(sizeof env->declared / sizeof *env->declared)) {
      err_set_at(s->loc, ERR_SYNTAX, "too many global/nonlocal declarations in one scope");
      return OUT_ERR;
    }
    env->declared_global[env->ndeclared] = s->kind == N_GLOBAL;
    env->declared[env->ndeclared++] = s->names[i];
  }
  return OUT_OK;
}

static Outcome exec_lang_stmt(StmtExec fn, const Node *s, Env *env, const char *what) {
  if (!fn) {
    err_set_at(s->loc, ERR_VALUE, "%s is not available in this build", what);
    return OUT_ERR;
  }
  if (fn(s, env, cur_frame ? cur_frame->mod : NULL) < 0) {
    err_locate(s->loc);
    return OUT_ERR;
  }
  return OUT_OK;
}

static Outcome exec_return(const Node *s, Env *env, Value **ret) {
  if (!cur_frame || strcmp(cur_frame->fname, "<module>") == 0) {
    err_set_at(s->loc, ERR_SYNTAX, "'return' outside function");
    return OUT_ERR;
  }
  Value *v = s->a ? eval(s->a, env) : val_incref(VAL_NONE);
  if (!v) return OUT_ERR;
  cur_loc = s->loc;   /* a function leaves at its return (a shard_map body's, for its errors) */
  val_decref(*ret);
  *ret = v;
  return OUT_RETURN;
}

/* Set while interp_extend_namespaces loads its modules (main thread):
 * their statements stay off the timeline. */
static bool extending;

/* Puts statement [s], run from [t0] to now, on this thread's timeline,
 * named by its line: "12: y = x * 2 + 1". */
static void timeline_stmt(const Node *s, int64_t t0) {
  if (extending) return;
  int64_t t1 = tl_now();
  char name[64] = "?";
  const Source *src = s->loc.src;
  if (src && s->loc.line >= 1 && s->loc.line <= src->nlines) {
    const char *p = src->lines[s->loc.line - 1];
    while (*p == ' ' || *p == '\t') p++;
    int n = (int)strcspn(p, "\n");
    snprintf(name, sizeof name, "%d: %.*s", s->loc.line, n, p);
  }
  tl_event("statement", name, t0, t1, 0, NULL, NULL);
}

/* The statement exec_stmt_timed is timing on this thread: exec_stmt runs
 * it untimed when it comes back in, and times every other. */
static _Thread_local const Node *timing_stmt;

/* exec_stmt while the timeline records. */
static __attribute__((noinline)) Outcome exec_stmt_timed(const Node *s, Env *env, Value **ret) {
  const Node *outer = timing_stmt;
  timing_stmt = s;
  int64_t t0 = tl_now();
  Outcome o = exec_stmt(s, env, ret);
  timing_stmt = outer;
  timeline_stmt(s, t0);
  return o;
}

static Outcome exec_kind(const Node *s, Env *env, Value **ret);

/* exec_stmt when the debugger's hook is due: the hook, then [s] unless
 * it says otherwise. */
static __attribute__((noinline)) Outcome exec_hooked(const Node *s, Env *env, Value **ret) {
  Outcome h = run_hook(cur_frame, s);
  if (h != OUT_OK) return h;
  if (check_interrupt(s->loc) < 0) return OUT_ERR;
  Outcome o = exec_kind(s, env, ret);
  if (o == OUT_ERR && eval_raise_hook) eval_raise_hook(cur_frame, s);
  return o;
}

/* Runs [s] by its kind, after exec_stmt's checks.  Out of line, with
 * each kind's code inlined in it: the frame it needs is not paid by an
 * assignment, which exec_stmt runs directly. */
static __attribute__((noinline)) Outcome exec_kind(const Node *s, Env *env, Value **ret) {
  switch (s->kind) {
  case N_EXPR_STMT: {
    Value *v = eval(s->a, env);
    if (!v) return OUT_ERR;
    val_decref(v);
    return OUT_OK;
  }
  case N_ASSIGN: return exec_assign(s, env);
  case N_AUGASSIGN: return exec_augassign(s, env);
  case N_IF: return exec_if(s, env, ret);
  case N_FOR: return exec_for(s, env, ret);
  case N_WHILE: return exec_while(s, env, ret);
  case N_BREAK: return OUT_BREAK;
  case N_CONTINUE: return OUT_CONTINUE;
  case N_PASS: return OUT_OK;
  case N_RETURN: return exec_return(s, env, ret);
  case N_DEF: return exec_def(s, env);
  case N_CLASS: return exec_class(s, env);
  case N_ANNASSIGN: return exec_annassign(s, env);
  case N_ASSERT: return exec_assert(s, env);
  case N_IMPORT:
  case N_FROM_IMPORT: return exec_import(s, env);
  case N_GLOBAL:
  case N_NONLOCAL: return exec_declare(s, env);
  case N_DEL: return exec_del(s, env);
  case N_TRY: return exec_try(s, env, ret);
  case N_WITH: return exec_with(s, env, ret);
  case N_RAISE: return exec_raise(s, env);
  case N_MESH: return exec_lang_stmt(eval_exec_mesh, s, env, "mesh");
  case N_SHARD_MAP: return exec_lang_stmt(eval_exec_shard_map, s, env, "shard_map");
  default:
    err_set_at(s->loc, ERR_SYNTAX, "invalid statement");
    return OUT_ERR;
  }
}

/* The checks before every statement (the timeline, the debugger's jump
 * and hook, Ctrl-C), then the statement: calls only in tail position, so
 * no registers are saved for the checks. */
static Outcome exec_stmt(const Node *s, Env *env, Value **ret) {
  if (__builtin_expect(tl_recording(), 0) && timing_stmt != s) return exec_stmt_timed(s, env, ret);
  cur_loc = s->loc;
  if (cur_frame) cur_frame->stmt = s;
  bool landing = false;
  if (__builtin_expect(jump_landing != NULL, 0)) {   /* the next statement run is the target */
    landing = s == jump_landing;
    jump_landing = NULL;
  }
  if (cur_frame && !landing && hook_due()) return exec_hooked(s, env, ret);
  if (check_interrupt(s->loc) < 0) return OUT_ERR;
  if (s->kind == N_ASSIGN) return exec_assign(s, env);
  return exec_kind(s, env, ret);
}

/* ==== running sources ======================================================== */

/* Runs the REPL's expression statement [s] in frame [fr], echoing its
 * value. */
static Outcome echo_stmt(const Node *s, Frame *fr, Env *globals) {
  cur_loc = s->loc;
  fr->stmt = s;
  bool landing = s == jump_landing;
  jump_landing = NULL;
  Outcome h = eval_stmt_hook && !landing ? run_hook(fr, s) : OUT_OK;
  if (h != OUT_OK) return h;
  Value *v = eval(s->a, globals);
  if (!v) return OUT_ERR;
  Outcome o = OUT_OK;
  if (v != VAL_NONE) {
    Value *r = val_repr(v);
    if (r) {
      eval_write(str_cstr(r), ((Str *)r)->len);
      eval_write("\n", 1);
    }
    val_decref(r);
    if (!r || eval_output_check() < 0) o = OUT_ERR;
  }
  val_decref(v);
  return o;
}

/* Runs a module's top level; echoes expression statements' values when
 * [echo] is set (the REPL).  A debugger's jump goes on at its target. */
static int run_module(AstModule *mod, Env *globals, bool echo) {
  Frame fr = {.back = cur_frame, .fname = "<module>", .env = globals, .mod = mod};
  cur_frame = &fr;
  int rc = 0;
  for (int i = 0; i < mod->body.n && rc == 0; i++) {
    const Node *s = mod->body.items[i];
    Value *ret = NULL;
    Outcome o = echo && s->kind == N_EXPR_STMT ? echo_stmt(s, &fr, globals)
                                                : exec_stmt(s, globals, &ret);
    val_decref(ret);
    int to = o == OUT_JUMP ? jump_index(&mod->body) : -1;
    if (to >= 0) {
      i = to - 1;
    } else if (o == OUT_ERR) {
      err_locate(s->loc);   /* one no expression claimed: the next item of a for, ... */
      rc = -1;
    } else if (o == OUT_BREAK || o == OUT_CONTINUE) {
      err_set_at(s->loc, ERR_SYNTAX, "'%s' outside loop", o == OUT_BREAK ? "break" : "continue");
      rc = -1;
    } else if (o == OUT_JUMP) {
      err_set_at(s->loc, ERR_VALUE, "jump: the statement to go on at is not in the module");
      rc = -1;
    }
  }
  if (rc < 0 && fr.stmt) err_push_scope(fr.stmt->loc, fr.fname, globals);
  cur_frame = fr.back;
  return rc;
}

int eval_source(Source *src, Env *globals, bool echo) {
  AstModule *mod = parse_source(src);
  if (!mod) return -1;
  Value *tree = tree_ref_new(mod);
  if (!tree) return -1;
  Value *saved = cur_tree;
  cur_tree = tree;
  int rc = run_module(mod, globals, echo);
  cur_tree = saved;
  val_decref(tree);
  eval_flush();
  return rc;
}

Value *eval_expr_text(const char *text, Env *scope) {
  Source *src = src_new("<expr>", text);
  if (!src) return NULL;
  AstModule *mod = parse_source(src);
  src_decref(src);
  if (!mod) return NULL;
  Value *tree = tree_ref_new(mod);
  if (!tree) return NULL;
  Value *r = NULL;
  if (mod->body.n != 1 || mod->body.items[0]->kind != N_EXPR_STMT) {
    err_set(ERR_SYNTAX, "expected an expression");
  } else {
    Value *saved = cur_tree;
    cur_tree = tree;
    r = eval(mod->body.items[0]->a, scope);
    cur_tree = saved;
  }
  val_decref(tree);
  return r;
}

/* ==== modules ================================================================== */

static bool file_exists(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* Every global of a module is an attribute of it, as in Python (m._helper,
 * and a module a imports is a._b); `from m import *` leaves out the names
 * that start with '_' on its own. */
/* A module's binding copied into its dict ([ctx], a CopyInto); the first
 * failure (out of memory) is kept, the dict then incomplete. */
typedef struct CopyInto {
  Value *dict;
  int rc;
} CopyInto;

static void copy_binding(const char *name, Value *v, void *ctx) {
  CopyInto *c = ctx;
  if (c->rc == 0) c->rc = dict_set_str(c->dict, name, v);
}

/* The modules being loaded on this thread, innermost last: an import of
 * one of them while it runs (a module that imports itself, or a imports
 * b imports a) gets the module as it is so far, as Python hands out a
 * partially initialised module, instead of loading it again forever. */
#define MAX_LOADING 64
static _Thread_local struct { const char *name; Value *module; } loading[MAX_LOADING];
static _Thread_local int nloading;

bool eval_module_loading(Value *m) {
  for (int i = 0; i < nloading; i++)
    if (loading[i].module == m) return true;
  return false;
}

static Value *loading_module(const char *name) {
  for (int i = 0; i < nloading; i++)
    if (!strcmp(loading[i].name, name)) return val_incref(loading[i].module);
  return NULL;
}

/* Runs the module file [path] and wraps its globals as a Module: its
 * names appear in the module when the file has run to the end. */
static Value *load_module(const char *name, const char *path) {
  if (nloading == MAX_LOADING)
    return err_set(ERR_VALUE, "imports nested more than %d deep", MAX_LOADING);
  Source *src = src_from_file(path);
  if (!src) return NULL;
  Env *g = env_new(NULL);
  Value *d = dict_new(), *m = d ? module_new(name, d) : NULL;
  Value *own = g && m ? str_from(name) : NULL;   /* the module's __name__ */
  if (!own || env_set(g, intern_cstr("__name__"), own) < 0) m = NULL;
  val_decref(own);
  if (g && m) {
    loading[nloading].name = name;
    loading[nloading++].module = m;
    int rc = eval_source(src, g, false);
    nloading--;
    /* a static value when it fails: it stays until exit, unreachable */
    CopyInto into = {d, 0};
    if (rc < 0 || env_each_sorted(g, copy_binding, &into) < 0 || into.rc < 0) m = NULL;
  }
  val_decref(d);
  src_decref(src);
  env_decref(g);
  return m;
}

int interp_add_path(const char *dir) {
  char **np = shm_realloc(shm_interp->path, sizeof(char *) * (size_t)(shm_interp->npath + 1));
  if (!np) return err_nomem(), -1;
  shm_interp->path = np;
  if (!(np[shm_interp->npath] = shm_strdup(dir))) return err_nomem(), -1;
  shm_interp->npath++;
  return 0;
}

/* Python's import lock: the devices of a shard_map body that import the
 * same module at once share shm_interp->modules; the first loads it, the
 * others wait and take it from the table (they changed the table together
 * before).  Recursive: a module's own imports run under it. */
static pthread_mutex_t import_lock;
static pthread_once_t import_lock_once = PTHREAD_ONCE_INIT;

static void import_lock_init(void) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_settype(&a, PTHREAD_MUTEX_RECURSIVE);
  pthread_mutex_init(&import_lock, &a);
  pthread_mutexattr_destroy(&a);
}

static Value *import_locked(const char *name, const char *from_dir);

Value *eval_import(const char *name, const char *from_dir) {
  pthread_once(&import_lock_once, import_lock_init);
  pthread_mutex_lock(&import_lock);
  Value *m = import_locked(name, from_dir);
  pthread_mutex_unlock(&import_lock);
  return m;
}

/* Module [name] loaded from the first of the [nd] folders [dirs] that has
 * it, and cached; NULL with no error when none has it. */
static Value *load_first(const char *name, const char *const *dirs, int nd) {
  char path[PATH_MAX];
  for (int i = 0; i < nd; i++) {
    snprintf(path, sizeof path, "%s/%s.shm", dirs[i], name);
    if (!file_exists(path)) continue;
    Value *m = load_module(name, path);
    if (m && dict_set_str(shm_interp->modules, name, m) < 0) {
      val_decref(m);
      return NULL;
    }
    return m;
  }
  return NULL;
}

static Value *import_locked(const char *name, const char *from_dir) {
  Value *cached = dict_get_str(shm_interp->modules, name);
  if (cached) return val_incref(cached);
  Value *ns = builtins_namespace(name);   /* jax, jax.numpy, jax.lax, ... */
  if (ns) return val_incref(ns);
  if (err_occurred() && err_kind() == ERR_MEMORY) return NULL;   /* a standard module not made */
  Value *partial = loading_module(name);
  if (partial) return partial;
  const char *dirs[64];
  int nd = 0;
  dirs[nd++] = from_dir ? from_dir : ".";
  for (int i = 0; i < shm_interp->npath && nd < 64; i++) dirs[nd++] = shm_interp->path[i];
  Value *m = load_first(name, dirs, nd);
  if (m || err_occurred()) return m;
  return err_set(ERR_IO, "no module named '%s' (searched the script's folder, SHMAP_PATH "
                         "and the standard library; see shmap(1), FILES)", name);
}

static int extend_namespaces(void);

static const struct {
  const char *ns, *module;
} extensions[] = {{"jax.numpy", "_jax_numpy"}, {"jax.random", "_jax_random"}, {"jax.nn", "_jax_nn"},
                  {"jax", "_jax"}, {"jax.lax", "_jax_lax"},
                  {"jax.numpy.linalg", "_jax_numpy_linalg"}, {"jax.scipy.linalg", "_jax_scipy_linalg"}};

/* [module] from the module path's folders (not the script's), loaded
 * once; NULL with no error when no folder has it (a binary run away from
 * its installation starts, without the functions it defines). */
static Value *import_stdlib(const char *module) {
  Value *cached = dict_get_str(shm_interp->modules, module);
  if (cached) return val_incref(cached);
  return load_first(module, (const char *const *)shm_interp->path, shm_interp->npath);
}

int interp_extend_namespaces(void) {
  /* the modules' statements are the interpreter's start, not the
   * program's: --trace leaves them out */
  extending = true;
  int rc = extend_namespaces();
  extending = false;
  return rc;
}

static int extend_namespaces(void) {
  for (size_t i = 0; i < sizeof extensions / sizeof *extensions; i++) {
    Value *m = import_stdlib(extensions[i].module), *ns = builtins_namespace(extensions[i].ns);
    if (!m && !err_occurred()) continue;
    Value *g = m ? ((Module *)m)->globals : NULL, *all = g ? dict_get_str(g, "__all__") : NULL;
    size_t n = 0;
    Value *const *names = NULL;
    int rc = m && ns && all && val_seq(all, &n, &names) ? 0 : -1;
    for (size_t k = 0; rc == 0 && k < n; k++) {
      const char *name = names[k]->type == V_STR ? str_cstr(names[k]) : NULL;
      Value *v = name ? dict_get_str(g, name) : NULL;
      Value *ng = ((Module *)ns)->globals;
      if (!v) {
        err_set(ERR_NAME, "%s: __all__ names '%s', which it does not define",
                extensions[i].module, name ? name : "?");
        rc = -1;
      } else if (!dict_get_str(ng, name)) {
        rc = dict_set_str(ng, name, v);
      }
    }
    if (m && rc < 0 && !err_occurred())
      err_set(ERR_VALUE, "%s: its __all__ must be a list of names", extensions[i].module);
    val_decref(m);
    if (rc < 0 && err_kind() == ERR_MEMORY) {   /* the program's start failed, not the module */
      err_clear();
      err_nomem();
    }
    if (rc < 0) return -1;
  }
  return 0;
}

/* ==== the interpreter ============================================================ */

/* repr of a user function, as Python's without the address. */
static Value *func_repr(Value *v) { return str_printf("<function %s>", ((Func *)v)->name); }

/* A function's attributes: __name__ (a lambda's is <lambda>), as Python's. */
static Value *func_getattr(Value *v, const char *name) {
  if (!strcmp(name, "__name__")) return str_from(((Func *)v)->name);
  return err_set(ERR_ATTRIBUTE, "'function' object has no attribute '%s'", name);
}

static int current_line(void) { return cur_loc.line; }

static void scope_incref(void *e) { env_incref(e); }
static void scope_release(void *e) { env_release_scope(e); }

const ErrState *eval_handled_error(void) { return handling ? &handling->err : NULL; }

int interp_init(int ndevices) {
  prim_line_hook = current_line;
  err_scope_incref = scope_incref;
  err_scope_release = scope_release;
  shm_interp = shm_calloc(1, sizeof *shm_interp);
  if (!shm_interp) return err_nomem(), -1;
  shm_interp->ndevices = ndevices;
  la_init(); /* picks BLIS's kernels before any device thread calls it */
  if (val_bools_init() < 0) return -1;
  const char *ref = getenv("SHMAP_REFERENCE");
  shm_interp->reference = ref && *ref && strcmp(ref, "0") != 0;
  val_register_free(V_FUNC, func_free);
  print_register(V_FUNC, func_repr, func_repr);
  ops_register_getattr(V_FUNC, func_getattr);
  if (!(shm_interp->builtins = env_new(NULL))) return -1;
  if (!(shm_interp->modules = dict_new())) return -1;
  if (!(shm_interp->argv = list_new(0))) return -1;
  Env *b = shm_interp->builtins;
  if (builtins_register(b) < 0 || exc_register(b) < 0 || jaxcfg_register() < 0 ||
      cls_register(b) < 0)
    return -1;
  const char *sp = getenv("SHMAP_PATH");
  if (sp && *sp) {
    char *copy = shm_strdup(sp), *save = NULL;
    if (!copy) return err_nomem(), -1;
    for (char *d = strtok_r(copy, ":", &save); d; d = strtok_r(NULL, ":", &save))
      if (interp_add_path(d) < 0) {
        shm_free(copy);
        return -1;
      }
    shm_free(copy);
  }
  return interp_add_path(SHMAP_STDLIB_DIR);
}

void interp_free(void) {
  exc_forget();
  if (!shm_interp) return;
  Dict *mods = (Dict *)shm_interp->modules;
  for (size_t i = 0; mods && i < mods->len; i++) {
    /* Module globals hold functions whose closures hold the module scope:
     * clear each so the cycles are freed.  A module whose loading ran out
     * of memory may lack its globals, or a name its value. */
    Value *g = mods->vals[i] ? ((Module *)mods->vals[i])->globals : NULL;
    Dict *gd = (Dict *)g;
    for (size_t k = 0; gd && k < gd->len; k++)
      if (gd->vals[k] && gd->vals[k]->type == V_FUNC) {
        Env *e = ((Func *)gd->vals[k])->closure;
        if (e && !e->parent) env_clear(e);
      }
  }
  if (shm_interp->builtins) env_clear(shm_interp->builtins);   /* NULL: interp_init failed */
  env_decref(shm_interp->builtins);
  val_decref(shm_interp->modules);
  val_decref(shm_interp->argv);
  env_break_cycles();   /* the program's scopes are gone: what is left is cycles */
  val_break_cycles();
  for (int i = 0; i < shm_interp->npath; i++) shm_free(shm_interp->path[i]);
  shm_free(shm_interp->path);
  shm_free(shm_interp);
  shm_interp = NULL;
  val_free_statics();
}
