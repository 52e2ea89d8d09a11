/*
 * eager_fusion.c - staging and running the element-wise expressions eager
 * evaluation hands over (eager_fusion.h; lang/eval.h, eval_fuse_hook).
 *
 * A tree is traced with one input per distinct leaf value (a name read
 * twice, as x in `x + sin(y) * 3. - x * y`, is read from memory once),
 * compiled by the jit compiler, whose fusion pass makes it one blocked
 * loop (fused_loop.h), and kept in a small per-thread cache keyed by the tree
 * and the kinds of its leaves (shapes, dtypes, which leaves are the same
 * value).  Per thread: device threads evaluate their bodies at once, and a
 * compiled plan runs on one thread at a time.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "lang/ast.h"
#include "lang/eval.h"
#include "transform/compile.h"
#include "transform/eager_fusion.h"
#include "transform/trace.h"

#define FE_SLOTS 8

/* One staged tree. */
typedef struct FeEntry {
  const Node *root;
  int nleaf, nin;
  int input[EVAL_FUSE_MAX_LEAVES];   /* leaf -> input (equal values share
                                        one), or -1: a Python number */
  AVal aval[EVAL_FUSE_MAX_LEAVES];   /* per input */
  Value *lit[EVAL_FUSE_MAX_LEAVES];  /* per Python number leaf: its value
                                        (owned in the cache, borrowed in a key) */
  Plan *plan;                        /* compiled; owned */
} FeEntry;

typedef struct FeCache {
  FeEntry e[FE_SLOTS];
  int next;                          /* slot replaced next */
  unsigned generation;               /* ast_generation the entries are of */
} FeCache;

static pthread_key_t fe_key;
static pthread_once_t fe_once = PTHREAD_ONCE_INIT;
static _Thread_local FeCache *fe_cache;

static void entry_clear(FeEntry *e) {
  if (e->plan) val_decref(&e->plan->hdr);
  for (int i = 0; e->plan && i < e->nleaf; i++)
    if (e->lit[i]) val_decref(e->lit[i]);
  memset(e, 0, sizeof *e);
}

static void cache_free(void *p) {
  FeCache *c = p;
  for (int i = 0; i < FE_SLOTS; i++) entry_clear(&c->e[i]);
  shm_free(c);
}

static void fe_key_init(void) { (void)pthread_key_create(&fe_key, cache_free); }

static FeCache *cache_get(void) {
  if (!fe_cache) {
    pthread_once(&fe_once, fe_key_init);
    if (!(fe_cache = shm_calloc(1, sizeof *fe_cache))) return NULL;
    pthread_setspecific(fe_key, fe_cache);
  }
  return fe_cache;
}

/* The key of [leaves]: which input each array leaf is, and each input's
 * aval; a Python number is not an input but a literal of the plan, as jit
 * inlines it (so the plan is the one jit would stage), and part of the key. */
static void entry_key(FeEntry *k, const Node *root, int nleaf, Value **leaves) {
  k->root = root;
  k->nleaf = nleaf;
  k->nin = 0;
  for (int i = 0; i < nleaf; i++) {
    k->lit[i] = NULL;
    if (arr_is_host(leaves[i])) {
      k->input[i] = -1;
      k->lit[i] = leaves[i];
      continue;
    }
    int j = 0;
    while (j < i && leaves[j] != leaves[i]) j++;
    if (j < i) {
      k->input[i] = k->input[j];
      continue;
    }
    k->input[i] = k->nin;
    aval_of(AS_ARRAY(leaves[i]), &k->aval[k->nin++]);
  }
}

/* The same Python number: dtype and the bits array functions read. */
static bool lit_eq(Value *a, Value *b) {
  if (!a || !b) return a == b;
  const Array *x = AS_ARRAY(a), *y = AS_ARRAY(b);
  return x->dtype == y->dtype && !memcmp(arr_data(x), arr_data(y), dt_size(x->dtype));
}

static bool aval_eq(const AVal *a, const AVal *b) {
  return a->dtype == b->dtype && a->weak == b->weak && a->ndim == b->ndim &&
         !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim);
}

static bool entry_eq(const FeEntry *a, const FeEntry *b) {
  if (a->root != b->root || a->nleaf != b->nleaf || a->nin != b->nin) return false;
  if (memcmp(a->input, b->input, sizeof(int) * (size_t)a->nleaf)) return false;
  for (int i = 0; i < a->nleaf; i++)
    if (!lit_eq(a->lit[i], b->lit[i])) return false;
  for (int i = 0; i < a->nin; i++)
    if (!aval_eq(&a->aval[i], &b->aval[i])) return false;
  return true;
}

/* Traces and compiles the tree of [k]; the plan, or NULL with the error
 * set. */
static Plan *stage(const FeEntry *k) {
  Trace *t = trace_begin("<expression>", true);
  if (!t) return NULL;
  Value *in[EVAL_FUSE_MAX_LEAVES] = {0}, *vals[EVAL_FUSE_MAX_LEAVES];
  Value *out = NULL;
  for (int i = 0; i < k->nin; i++)
    if (!(in[i] = trace_new_arg(t, &k->aval[i], NULL))) goto fail;
  for (int i = 0; i < k->nleaf; i++) vals[i] = k->input[i] < 0 ? k->lit[i] : in[k->input[i]];
  if (!(out = eval_fuse_apply(k->root, vals))) goto fail;
  Value **caps = NULL;
  int ncap = 0;
  Plan *p = trace_end(t, 1, &out, &caps, &ncap);
  val_decref(out);
  for (int i = 0; i < k->nin; i++) val_decref(in[i]);
  trace_caps_free(caps, ncap);
  if (p && (ncap || cmp_compile(p) < 0)) {
    val_decref(&p->hdr);
    return NULL;
  }
  return p;
fail:
  trace_abort(t);
  for (int i = 0; i < k->nin; i++)
    if (in[i]) val_decref(in[i]);
  return NULL;
}

/* The cache's entry for [k], staged now if it is new; NULL with the error
 * set. */
static FeEntry *lookup(FeCache *c, const FeEntry *k) {
  unsigned g = atomic_load_explicit(&ast_generation, memory_order_relaxed);
  if (g != c->generation) {
    for (int i = 0; i < FE_SLOTS; i++) entry_clear(&c->e[i]);
    c->generation = g;
  }
  for (int i = 0; i < FE_SLOTS; i++)
    if (c->e[i].plan && entry_eq(&c->e[i], k)) return &c->e[i];
  Plan *p = stage(k);
  if (!p) return NULL;
  FeEntry *e = &c->e[c->next];
  c->next = (c->next + 1) % FE_SLOTS;
  entry_clear(e);
  *e = *k;
  e->plan = p;
  for (int i = 0; i < e->nleaf; i++)
    if (e->lit[i]) val_incref(e->lit[i]);
  return e;
}

/* eval_fuse_hook. */
static Value *eager_fusion_run(const Node *root, int nleaf, Value **leaves) {
  if (prim_tracing()) return EVAL_DECLINED;
  /* a sharded operand's results are laid out operation by operation (prim_run) */
  for (int i = 0; i < nleaf; i++)
    if (IS_ARRAY(leaves[i]) && AS_ARRAY(leaves[i])->sharding) return EVAL_DECLINED;
  FeCache *c = cache_get();
  if (!c) return err_nomem(), NULL;
  FeEntry k;
  entry_key(&k, root, nleaf, leaves);
  FeEntry *e = lookup(c, &k);
  if (!e) {
    /* the leaves were checked, so staging fails only for want of memory
     * or an operation the compiler lacks: the usual way then decides */
    if (err_kind() == ERR_MEMORY) return NULL;
    err_clear();
    return EVAL_DECLINED;
  }
  Array *in[EVAL_FUSE_MAX_LEAVES], *out = NULL;
  for (int i = 0; i < nleaf; i++)
    if (k.input[i] >= 0) in[k.input[i]] = AS_ARRAY(leaves[i]);
  return cmp_run(e->plan, in, &out) == 0 ? &out->hdr : NULL;
}

void eager_fusion_register(void) {
  if (!getenv("SHMAP_NO_EAGER_FUSION")) eval_fuse_hook = eager_fusion_run;
}
