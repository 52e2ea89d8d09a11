/*
 * prim.c - the primitive table, parameters, and the one apply function
 * (prim.h).
 *
 * The table's rows are named by prim.def and filled by the families'
 * files at load (prim_install): prim_elementwise.c, prim_reduce.c,
 * prim_layout.c, prim_index.c, prim_dot.c, prim_random.c; the layers
 * above fill their primitives' rows at start-up (prim_register).  Nothing
 * here knows one primitive from another: it dispatches on the rows.
 */
#include "array/prim.h"
#include "array/prim_rules.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/timeline.h"
#include "array/kernels.h"
#include "base/mem.h"

Value *(*prim_trace_hook)(PrimId id, int nin, Value **in, const Params *p);

/* ---- parameters ----------------------------------------------------------- */

void params_init(Params *p) {
  p->n = 0;
  p->nomem = false;
}

int params_add(Params *p, const char *name, Value *v) {
  if (!v || !tuple_complete(v)) {   /* a tuple of tuples, one of them not made */
    val_decref(v);
    p->nomem = true;
    return -1;
  }
  if (p->n >= PRIM_MAX_PARAMS) {
    val_decref(v);
    err_set(ERR_VALUE, "too many parameters (at most %d)", PRIM_MAX_PARAMS);
    return -1;
  }
  p->p[p->n].name = name;
  p->p[p->n].value = v;
  p->n++;
  return 0;
}

bool param_value_equal(Value *a, Value *b) {
  if (a == b) return true;
  if (a->type != b->type) return false;
  if (a->type == V_ARRAY) {
    Array *x = AS_ARRAY(a), *y = AS_ARRAY(b);
    return x->ndim == 0 && y->ndim == 0 && x->dtype == y->dtype &&
           arr_get_f64(x, 0) == arr_get_f64(y, 0) && arr_get_i64(x, 0) == arr_get_i64(y, 0);
  }
  if (a->type == V_TUPLE) {
    if (tuple_len(a) != tuple_len(b)) return false;
    for (size_t i = 0; i < tuple_len(a); i++)
      if (!param_value_equal(tuple_get(a, i), tuple_get(b, i))) return false;
    return true;
  }
  if (a->type == V_STR) return !strcmp(str_cstr(a), str_cstr(b));
  return false;
}

bool params_equal(const Params *a, const Params *b) {
  if (a->n != b->n) return false;
  for (int i = 0; i < a->n; i++)
    if (strcmp(a->p[i].name, b->p[i].name) || !param_value_equal(a->p[i].value, b->p[i].value))
      return false;
  return true;
}

Value *params_get(const Params *p, const char *name) {
  if (!p)
    return NULL;
  /* names are string literals, and one name is mostly one literal */
  for (int i = 0; i < p->n; i++)
    if (p->p[i].name == name)
      return p->p[i].value;
  for (int i = 0; i < p->n; i++)
    if (!strcmp(p->p[i].name, name))
      return p->p[i].value;
  return NULL;
}

/* The value of a required parameter, or NULL with the error set. */
static Value *params_need(const Params *p, const char *name) {
  Value *v = params_get(p, name);
  if (!v)
    err_set(ERR_VALUE, "missing parameter '%s'", name);
  return v;
}

int params_int(const Params *p, const char *name, int64_t *out) {
  Value *v = params_need(p, name);
  if (!v)
    return -1;
  if (!IS_ARRAY(v) || arr_to_index(v, out) < 0) {
    err_clear();
    err_set(ERR_TYPE, "parameter '%s' must be an integer, got %s", name, val_type_name(v));
    return -1;
  }
  return 0;
}

int params_ints(const Params *p, const char *name, int *n, int64_t *out, int cap) {
  Value *v = params_need(p, name);
  size_t len;
  Value *const *items;
  if (!v)
    return -1;
  if (IS_ARRAY(v) && AS_ARRAY(v)->ndim == 0 && cap >= 1) {
    *n = 1;
    return params_int(p, name, out);
  }
  if (!val_seq(v, &len, &items)) {
    err_set(ERR_TYPE, "parameter '%s' must be a tuple of integers, got %s", name,
            val_type_name(v));
    return -1;
  }
  if (len > (size_t)cap) {
    err_set(ERR_VALUE, "parameter '%s' has %zu entries, at most %d allowed", name, len, cap);
    return -1;
  }
  for (size_t i = 0; i < len; i++) {
    if (arr_to_index(items[i], &out[i]) < 0) {
      err_clear();
      err_set(ERR_TYPE, "parameter '%s' must be a tuple of integers", name);
      return -1;
    }
  }
  *n = (int)len;
  return 0;
}

int params_dtype(const Params *p, const char *name, DType *out) {
  Value *v = params_need(p, name);
  if (!v)
    return -1;
  if (v->type == V_DTYPE) {
    *out = ((DTypeVal *)v)->dtype;
    return 0;
  }
  if (v->type == V_STR && dt_parse(str_cstr(v), out))
    return 0;
  err_set(ERR_TYPE, "parameter '%s' must be a dtype, got %s", name, val_type_name(v));
  return -1;
}

int params_bool(const Params *p, const char *name, bool *out) {
  Value *v = params_need(p, name);
  if (!v)
    return -1;
  if (!IS_ARRAY(v) || AS_ARRAY(v)->size != 1) {
    err_set(ERR_TYPE, "parameter '%s' must be a bool, got %s", name, val_type_name(v));
    return -1;
  }
  *out = arr_get_f64(AS_ARRAY(v), 0) != 0;
  return 0;
}

void params_clear(Params *p) {
  for (int i = 0; i < p->n; i++)
    val_decref(p->p[i].value);
  p->n = 0;
}

Value *val_int(int64_t x) { return arr_python_int(x); }   /* small ones shared */

Value *val_int_tuple(int n, const int64_t *xs) {
  Value *t = tuple_new((size_t)n);
  if (!t)
    return NULL;
  for (int i = 0; i < n; i++) {
    Value *v = val_int(xs[i]);
    if (!v) {
      for (int j = i; j < n; j++)
        tuple_set_steal(t, (size_t)j, val_incref(VAL_NONE));
      val_decref(t);
      return NULL;
    }
    tuple_set_steal(t, (size_t)i, v);
  }
  return t;
}

/* A pair of [a] and [b] (stolen, released on failure). */
static Value *pair_steal(Value *a, Value *b) {
  Value *t = a && b ? tuple_new(2) : NULL;
  if (!t) {
    if (a) val_decref(a);
    if (b) val_decref(b);
    return NULL;
  }
  tuple_set_steal(t, 0, a);
  tuple_set_steal(t, 1, b);
  return t;
}

/* dimension_numbers are made again for every product a transformation
 * traces (its JVP, batching and transpose rules), seven allocations
 * each: the first DN_CACHE distinct small ones are made once and handed
 * out again (their ints are the shared small ones).  The cache holds a
 * reference to each for the life of the process (not immortal statics:
 * val_free_statics frees statics oldest first, and these tuples are
 * younger than the small ints they hold). */
#define DN_CACHE 32
#define DN_DIMS 4
typedef struct DnEntry {
  int nc, nb;
  int64_t d[4][DN_DIMS];
  Value *v;
} DnEntry;
static DnEntry dn_cache[DN_CACHE];
/* Entries are only appended, each filled before dn_used counts it: a
 * reader loads dn_used (acquire) and reads the entries below it without
 * the lock; writers append under dn_lock and publish with a release. */
static int dn_used;
static pthread_mutex_t dn_lock = PTHREAD_MUTEX_INITIALIZER;
/* Each entry's index + 1 at its tuple's address hashed (0: none there),
 * set with the entry and read without the lock: a rule finds the ints of
 * the numbers it was given in one probe. */
#define DN_SLOTS 64
static int dn_slot[DN_SLOTS];

static unsigned dn_hash(const Value *v) {
  return (unsigned)(((uintptr_t)v >> 4) * 0x9E3779B97F4A7C15ull >> 58);
}

/* Fills [e]'s key; false when the numbers are too many or too large. */
static bool dn_key(DnEntry *e, int nc, const int64_t *lc, const int64_t *rc, int nb,
                   const int64_t *lb, const int64_t *rb) {
  if (nc > DN_DIMS || nb > DN_DIMS || nc < 0 || nb < 0) return false;
  memset(e, 0, sizeof *e);
  e->nc = nc;
  e->nb = nb;
  const int64_t *src[4] = {lc, rc, lb, rb};
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < (k < 2 ? nc : nb); i++) {
      if (src[k][i] < 0 || src[k][i] > 255) return false;
      e->d[k][i] = src[k][i];
    }
  return true;
}

static int dn_find(const DnEntry *key, int used) {
  for (int i = 0; i < used; i++)
    if (dn_cache[i].nc == key->nc && dn_cache[i].nb == key->nb &&
        !memcmp(dn_cache[i].d, key->d, sizeof key->d))
      return i;
  return -1;
}

Value *val_dot_dimension_numbers(int nc, const int64_t *lc, const int64_t *rc, int nb,
                                 const int64_t *lb, const int64_t *rb) {
  DnEntry key;
  bool small = dn_key(&key, nc, lc, rc, nb, lb, rb);
  if (small) {
    int i = dn_find(&key, __atomic_load_n(&dn_used, __ATOMIC_ACQUIRE));
    if (i >= 0) return val_incref(dn_cache[i].v);
  }
  Value *v = pair_steal(pair_steal(val_int_tuple(nc, lc), val_int_tuple(nc, rc)),
                        pair_steal(val_int_tuple(nb, lb), val_int_tuple(nb, rb)));
  if (!v || !small) return v;
  pthread_mutex_lock(&dn_lock);
  int used = dn_used;
  if (used < DN_CACHE && dn_find(&key, used) < 0) {
    key.v = val_incref(v);
    dn_cache[used] = key;
    __atomic_store_n(&dn_used, used + 1, __ATOMIC_RELEASE);
    __atomic_store_n(&dn_slot[dn_hash(v)], used + 1, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&dn_lock);
  return v;
}

bool prim_dot_dims_known(const Value *v, int *nc, int *nb, int64_t d[4][SHM_MAXDIM]) {
  int i = __atomic_load_n(&dn_slot[dn_hash(v)], __ATOMIC_ACQUIRE) - 1;
  if (i < 0 || dn_cache[i].v != v) return false;
  *nc = dn_cache[i].nc;
  *nb = dn_cache[i].nb;
  for (int k = 0; k < 4; k++)
    for (int j = 0; j < (k < 2 ? *nc : *nb); j++) d[k][j] = dn_cache[i].d[k][j];
  return true;
}

void aval_of(const Array *a, AVal *out) {
  out->dtype = a->dtype;
  out->weak = a->weak;
  out->ndim = a->ndim;
  for (int i = 0; i < a->ndim; i++)   /* a loop: memcpy of a few words is a slow rep movs */
    out->shape[i] = a->shape[i];
  out->vma = a->vma;
}

PrimInfo prim_table[P_COUNT] = {
#define PRIM(id, nm, ni, no, k, kn) \
  [P_##id] = {.name = #nm, .nin = ni, .nout = no, .kind = k},
#include "array/prim.def"
#undef PRIM
};

/* Binary primitives' row loops by dtype (prim_binary_row). */
static KernRow2 binary_rows[P_COUNT][DT_COUNT];

/* What prim_binary_into needs of a primitive on one operand dtype, all
 * read from one entry on its hot path. */
typedef struct IntoRow {
  KernRow2 row;          /* NULL: not run in place (binary_agree refuses it,
                            it has a replication rule, or the dtype is not one
                            it accepts) */
  DType out;             /* the result's dtype: bool for a comparison */
  bool weak;             /* the result is weak when both operands are */
  uint8_t size;          /* bytes of an operand's element */
  uint8_t out_size;      /* ...and of the result's */
} IntoRow;
static IntoRow into_rows[P_COUNT][DT_COUNT];


/* What the binary fast paths read of a row, resolved when it is
 * registered: the dtypes it accepts, and whether its result is bool (a
 * comparison), asked of its shape rule once. */
static unsigned accepts[P_COUNT];
static bool to_bool[P_COUNT];

static void resolve_result(PrimId id) {
  const PrimRules *r = &prim_table[id].rules;
  accepts[id] = r->dtypes ? r->dtypes : DC_ANY;
  to_bool[id] = false;
  if (prim_table[id].kind != PK_BINARY || !r->shape) return;
  DType t = accepts[id] & (1u << DT_I32) ? DT_I32 : DT_F32;
  AVal in[2] = {{.dtype = t}, {.dtype = t}}, out;
  if (r->shape(in, 2, NULL, &out) == 0)
    to_bool[id] = out.dtype == DT_BOOL;
  else
    err_clear();
}

static void resolve_binary_rows(PrimId id) {
  const PrimInfo *pi = &prim_table[id];
  resolve_result(id);
  bool plain = pi->kind == PK_BINARY && pi->nin == 2 && pi->rules.shape && !pi->rules.vma;
  for (int t = 0; t < DT_COUNT; t++) {
    binary_rows[id][t] = pi->kind == PK_BINARY && pi->rules.kernel
                             ? kern_binary_row(pi->rules.kernel, (DType)t)
                             : NULL;
    bool cmp = to_bool[id];
    into_rows[id][t] = (IntoRow){
        .row = plain && (accepts[id] & (1u << t)) ? binary_rows[id][t] : NULL,
        .out = cmp ? DT_BOOL : (DType)t,
        .weak = !cmp,
        .size = (uint8_t)dt_size((DType)t),
        .out_size = (uint8_t)dt_size(cmp ? DT_BOOL : (DType)t)};
  }
}

/* At load, so every thread, the unit tests and the start-up code read a
 * filled table: the array layer's families fill their rows (the layers
 * above fill theirs with prim_register before any device thread runs). */
__attribute__((constructor)) static void prim_install(void) {
  for (int id = 0; id < P_COUNT; id++) resolve_binary_rows((PrimId)id);
  prim_elementwise_register();
  prim_reduce_register();
  prim_layout_register();
  prim_index_register();
  prim_dot_register();
  prim_linalg_register();
  prim_random_register();
}

void prim_register(PrimId id, const PrimRules *rules) {
  prim_table[id].rules = *rules;
  resolve_binary_rows(id);
}

void prim_register_rows(const PrimRow *rows, size_t n) {
  for (size_t i = 0; i < n; i++) prim_register(rows[i].id, &rows[i].rules);
}

KernRow2 prim_binary_row(PrimId id, DType t) { return binary_rows[id][t]; }

int prim_rule_missing(PrimId id, const char *what) {
  err_set(ERR_NOT_IMPLEMENTED, "%s of '%s' is not implemented", what, prim_table[id].name);
  return -1;
}

bool (*prim_tracing_hook)(void);

Value *prim_apply_rule(PrimId id, int nin, Value **in, Params *p) {
  Params none;
  params_init(&none);
  Params *q = p ? p : &none;
  Value *r = NULL;
  int i = 0;
  while (i < nin && in[i]) i++;
  if (i == nin) {
    for (int k = 0; k < nin; k++) val_incref(in[k]);
    /* a rule's broadcast of a constant (full_like, a cotangent spread
     * over a reduction's axes) is staged while tracing, as JAX stages
     * it: an equation the plan runs as a stride-0 view, not a
     * materialised constvar */
    bool stage = ((id == P_BROADCAST_IN_DIM && IS_ARRAY(in[0]) && !AS_ARRAY(in[0])->sharding) ||
                  prim_table[id].rules.coll) &&
                 prim_tracing();
    /* (and a collective's, on a constant cotangent, is staged: it runs
     * among the devices, which a trace of their body does not have) */
    r = stage ? prim_bind(id, nin, in, q) : prim_apply(id, nin, in, q);
    for (int k = 0; k < nin; k++) val_decref(in[k]);
  }
  params_clear(q);
  return r;
}

int (*prim_aval_hook)(Value *v, AVal *out);

PrimShardingHook prim_sharding_hook;
PrimShardedRunHook prim_sharded_run_hook;
const Value prim_declined;

bool (*prim_staged_hook)(const Value *v);

bool prim_value_is_staged(const Value *v) {
  return v && v->type == V_TRACER && prim_staged_hook && prim_staged_hook(v);
}

int prim_value_aval(Value *v, AVal *out) {
  if (IS_ARRAY(v)) {
    aval_of(AS_ARRAY(v), out);
    return 0;
  }
  if (v && v->type == V_TRACER && prim_aval_hook) return prim_aval_hook(v, out);
  err_set(ERR_TYPE, "expected an array, got '%s'", v ? val_type_name(v) : "NULL");
  return -1;
}

bool prim_tracing(void) { return prim_tracing_hook && prim_tracing_hook(); }

/* prim_trace_hook with the NumPy arrays among [in] replaced by copies:
 * a plan keeps a constant by reference, and NumPy's later writes must
 * not reach it (JAX bakes the value it saw when tracing). */
static Value *trace_snapshot(PrimId id, int nin, Value **in, const Params *p) {
  Value *cp[nin > 0 ? nin : 1];
  bool any = false;
  for (int i = 0; i < nin; i++) {
    cp[i] = in[i];
    if (!arr_is_np(in[i])) continue;
    Array *c = arr_copy(AS_ARRAY(in[i]));
    if (!c) {
      for (int k = 0; k < i; k++)
        if (cp[k] != in[k]) val_decref(cp[k]);
      return NULL;
    }
    cp[i] = &c->hdr;
    any = true;
  }
  if (!any) return prim_trace_hook(id, nin, in, p);
  Value *r = prim_trace_hook(id, nin, cp, p);
  for (int i = 0; i < nin; i++)
    if (cp[i] != in[i]) val_decref(cp[i]);
  return r;
}

/* The tracer's hook, through trace_snapshot once numpy is imported. */
static Value *trace_apply(PrimId id, int nin, Value **in, const Params *p) {
  if (arr_np_is_live()) return trace_snapshot(id, nin, in, p);
  return prim_trace_hook(id, nin, in, p);
}

Value *prim_bind(PrimId id, int nin, Value **in, const Params *p) {
  if (p && p->nomem) return err_nomem();
  if (prim_tracing()) return trace_apply(id, nin, in, p);
  return prim_apply(id, nin, in, p);
}

int prim_interrupted(void) {
  err_set(ERR_INTERRUPT, "interrupted");
  return -1;
}

int prim_run_kernel_timed(PrimId id, Array **in, int nin, const Params *p, Array **out) {
  int64_t t0 = tl_now();
  int rc = prim_table[id].rules.kernel(in, nin, p, out);
  if (prim_table[id].kind == PK_COLLECTIVE || prim_table[id].nout == 0) return rc;
  char av[64];
  const char *key[] = {"result"}, *val[] = {av};
  aval_str(av, sizeof av, out[0]->dtype, out[0]->ndim, out[0]->shape);
  tl_event("primitive", prim_table[id].name, t0, tl_now(), 1, key, val);
  return rc;
}


int prim_lookup(const char *name) {
  for (int i = 0; i < P_COUNT; i++)
    if (!strcmp(prim_table[i].name, name))
      return i;
  return -1;
}

/* ---- inference and apply -------------------------------------------------------------- */

static int prim_check_arity(PrimId id, int nin) {
  const PrimInfo *pi = &prim_table[id];
  if (pi->kind == PK_HIGHER) {
    err_set(ERR_TYPE, "primitive %s takes sub-plans and cannot be applied directly", pi->name);
    return -1;
  }
  if (!pi->rules.shape || !pi->rules.kernel)  /* its layer did not register */
    return prim_rule_missing(id, "evaluation");
  if (pi->nin >= 0 && nin != pi->nin) {
    err_set(ERR_TYPE, "%s takes %d operand%s, got %d", pi->name, pi->nin,
            pi->nin == 1 ? "" : "s", nin);
    return -1;
  }
  return 0;
}

/* The vma set of the outputs: the primitive's rule or the union. */
static uint32_t prim_vma(PrimId id, const AVal *in, int nin, const Params *p) {
  uint32_t v = 0, buf[16];
  if (prim_table[id].rules.vma && nin <= 16) {
    for (int i = 0; i < nin; i++)
      buf[i] = in[i].vma;
    return prim_table[id].rules.vma(buf, nin, p);
  }
  for (int i = 0; i < nin; i++)
    v |= in[i].vma;
  return v;
}

/* [s] with every dimension unsplit and nothing partial. */
static void unsplit(Sharding *s, int ndim) {
  s->ndim = ndim;
  for (int d = 0; d < ndim; d++) s->nsplit[d] = 0;
  s->partial = 0;
  s->partial_coll = NULL;
}

static int64_t sh_blocks(const Sharding *s, int d) {
  int64_t n = 1;
  for (int k = 0; k < s->nsplit[d]; k++) n *= s->axis_sizes[s->split[d][k]];
  return n;
}

/* [a] as each device's block of it laid out as [s]; false when a split
 * dimension does not divide evenly. */
static bool block_aval(const AVal *a, const Sharding *s, AVal *out) {
  aval_copy(out, a);
  for (int d = 0; d < a->ndim; d++) {
    int64_t b = sh_blocks(s, d);
    if (a->shape[d] % b) return false;
    out->shape[d] /= b;
  }
  return true;
}

/* (A dynamic_slice's slice_sizes are the result block's shape, as a
 * reshape's new_sizes are.)  A slice's limit_indices for blocks [res] of
 * [out]: a split dimension
 * is whole (start 0, stride 1: sh_slice), so its limit is the block's. */
static Value *block_limits(const Params *p, const AVal *out, const AVal *res) {
  int n;
  int64_t lim[SHM_MAXDIM];
  if (params_ints(p, "limit_indices", &n, lim, SHM_MAXDIM) < 0 || n != out->ndim) {
    err_clear();
    return NULL;
  }
  for (int d = 0; d < n; d++)
    if (res->shape[d] != out->shape[d]) lim[d] = res->shape[d];
  return val_int_tuple(n, lim);
}

/* prim_sharding's test: whether the blocks compute the result's block. */
static bool blocks_compute(PrimId id, const AVal *in, const Sharding *in_sh, int nin,
                           const Params *p, const AVal *out, int nout, const Sharding *out_sh,
                           Params *local, bool *has_local) {
  enum { MAXOPS = 16 };
  AVal loc[MAXOPS], res[PRIM_MAX_OUTS], got[PRIM_MAX_OUTS];
  if (nin > MAXOPS || nout > PRIM_MAX_OUTS) return false;
  for (int j = 0; j < nout; j++)
    if (!block_aval(&out[j], &out_sh[j], &res[j])) return false;
  for (int i = 0; i < nin; i++)
    if (!block_aval(&in[i], &in_sh[i], &loc[i])) return false;
  bool split = false;
  for (int d = 0; d < out->ndim; d++) split |= res[0].shape[d] != out->shape[d];
  if (split && (params_get(p, "new_sizes") || params_get(p, "shape") || params_get(p, "limit_indices") ||
                params_get(p, "slice_sizes"))) {
    for (int i = 0; i < p->n; i++) {
      const char *n = p->p[i].name;
      Value *v = NULL;
      if (!strcmp(n, "new_sizes") || !strcmp(n, "shape") || !strcmp(n, "slice_sizes"))
        v = val_int_tuple(res[0].ndim, res[0].shape);
      else if (!strcmp(n, "limit_indices")) v = block_limits(p, out, &res[0]);
      params_add(local, n, v ? v : val_incref(p->p[i].value));
    }
    *has_local = true;
  }
  /* a dynamic_update_slice whose whole update is written into a block
   * split where the update covers it in part writes only the block's
   * part of it (partition_run.c, run_masked_update): a window at most
   * the block's size */
  if (id == P_DYNAMIC_UPDATE_SLICE && nin >= 2 && loc[1].ndim == loc[0].ndim)
    for (int d = 0; d < loc[0].ndim; d++)
      if (loc[1].shape[d] > loc[0].shape[d]) loc[1].shape[d] = loc[0].shape[d];
  int rc = prim_infer(id, loc, nin, *has_local ? local : p, got);
  if (rc < 0) err_clear();
  bool same = rc == 0;
  for (int j = 0; same && j < nout; j++)
    same = got[j].dtype == res[j].dtype && got[j].ndim == res[j].ndim &&
           !memcmp(got[j].shape, res[j].shape, sizeof(int64_t) * (size_t)res[j].ndim);
  if (!same && *has_local) {
    params_clear(local);
    params_init(local);
    *has_local = false;
  }
  return same;
}

/* A result computed whole (its operands replicated) and then sliced
 * locally to its type: [s] keeps, of the rule's layout, the splits over
 * Explicit mesh axes (Sharding.explicit_axes: part of the result's type)
 * that divide its dimensions evenly, and nothing partial. */
static void typed_only(Sharding *s, const AVal *out) {
  s->ndim = out->ndim;
  s->partial = 0;
  s->partial_coll = NULL;
  for (int d = 0; d < out->ndim; d++) {
    int k = 0;
    int64_t b = 1;
    for (int j = 0; j < s->nsplit[d]; j++)
      if (s->explicit_axes >> s->split[d][j] & 1) {
        b *= s->axis_sizes[s->split[d][j]];
        s->split[d][k++] = s->split[d][j];
      }
    s->nsplit[d] = out->shape[d] % b ? 0 : (uint8_t)k;
  }
}

/* The primitive whose rule runs, for the rules' messages. */
static _Thread_local const char *sharding_op;

/* How often each primitive's sharding rule was kept with an operand
 * split (its devices computed on blocks): jax._primitive_table's
 * sharding_runs, for the test that every rule ran. */
static _Atomic long split_runs[P_COUNT];

long prim_sharding_runs(PrimId id) { return atomic_load_explicit(&split_runs[id], memory_order_relaxed); }

/* Whether some of [nin] layouts [sh] splits a dimension. */
static bool some_split(const Sharding *sh, int nin) {
  for (int i = 0; i < nin; i++)
    for (int d = 0; d < sh[i].ndim && d < SHM_MAXDIM; d++)
      for (int k = 0; k < sh[i].nsplit[d]; k++)
        if (sh[i].axis_sizes[sh[i].split[d][k]] > 1) return true;
  return false;
}

const char *prim_sharding_op(void) { return sharding_op ? sharding_op : ""; }

int prim_sharding(PrimId id, const AVal *in, Sharding *in_sh, int nin, const Params *p,
                  const AVal *out, int nout, Sharding *out_sh, Params *local, bool *has_local) {
  const PrimInfo *pi = &prim_table[id];
  *has_local = false;
  if (pi->rules.sharding && pi->kind != PK_HIGHER && nin > 0 && nout >= 1 && nout <= PRIM_MAX_OUTS) {
    Sharding keep[16];
    int n = nin < 16 ? nin : 16;
    memcpy(keep, in_sh, sizeof(Sharding) * (size_t)n);
    sharding_op = pi->name;
    int rc = pi->rules.sharding(in, in_sh, nin, p, out_sh);
    sharding_op = NULL;
    if (rc < 0) return -1;
    if (rc == 0 && nin <= 16 && blocks_compute(id, in, in_sh, nin, p, out, nout, out_sh, local, has_local)) {
      if (some_split(in_sh, nin)) atomic_fetch_add_explicit(&split_runs[id], 1, memory_order_relaxed);
      return 1;
    }
    memcpy(in_sh, keep, sizeof(Sharding) * (size_t)n);
    for (int i = 0; i < nin; i++) unsplit(&in_sh[i], in[i].ndim);
    if (nout == 1) typed_only(out_sh, out);
    else for (int j = 0; j < nout; j++) unsplit(&out_sh[j], out[j].ndim);
    return 0;
  }
  for (int i = 0; i < nin; i++) unsplit(&in_sh[i], in[i].ndim);
  for (int j = 0; j < nout; j++) unsplit(&out_sh[j], out[j].ndim);
  return 0;
}

int prim_infer(PrimId id, const AVal *in, int nin, const Params *p, AVal *out) {
  if ((unsigned)id >= P_COUNT) {
    err_set(ERR_VALUE, "unknown primitive %d", (int)id);
    return -1;
  }
  if (prim_check_arity(id, nin) < 0 || prim_table[id].rules.shape(in, nin, p, out) < 0)
    return -1;
  uint32_t v = prim_vma(id, in, nin, p);
  for (int i = 0; i < prim_table[id].nout; i++)
    out[i].vma = v;
  return 0;
}

/* Operands and their avals, on the stack for the usual few. */
#define PRIM_STACK_OPS 4
typedef struct ApplyFrame {
  Array *ops_stack[PRIM_STACK_OPS];
  AVal avals_stack[PRIM_STACK_OPS];
  Array **ops;
  AVal *avals;
} ApplyFrame;

static int prim_frame_init(ApplyFrame *f, int nin) {
  f->ops = f->ops_stack;
  f->avals = f->avals_stack;
  if (nin <= PRIM_STACK_OPS)
    return 0;
  f->ops = shm_malloc(sizeof(Array *) * (size_t)nin);
  f->avals = shm_malloc(sizeof(AVal) * (size_t)nin);
  if (f->ops && f->avals)
    return 0;
  shm_free(f->ops);
  shm_free(f->avals);
  err_nomem();
  return -1;
}

static void prim_frame_free(ApplyFrame *f) {
  if (f->ops != f->ops_stack) {
    shm_free(f->ops);
    shm_free(f->avals);
  }
}

/* True when [a] belongs to one holder and may be overwritten as the
 * output of aval [o] (value.h: refcount 1 means changeable in place). */
static bool prim_reusable(Array *a, const AVal *o) {
  return arr_unshared(a) && a->contiguous && a->dtype == o->dtype && a->ndim == o->ndim &&
         prim_same_dims(o->ndim, a->shape, o->shape);
}

/* Whether operand 0 is also passed as another operand (an update that
 * is the operand itself): then it is read while written, so not reused. */
static bool prim_operand_repeated(Array *const *ops, int nin) {
  for (int j = 1; j < nin; j++)
    if (ops[j] == ops[0] || ops[j]->buf == ops[0]->buf) return true;
  return false;
}

/* Allocates the outputs of [id] from [avals]: layout kernels make their
 * own, elementwise ones reuse a dying operand when they can. */
static int prim_alloc_outs(PrimId id, Array **ops, int nin, const AVal *avals, int nout,
                           Array **out) {
  PrimKind k = prim_table[id].kind;
  for (int i = 0; i < nout; i++)
    out[i] = NULL;
  if (k == PK_SHAPE) {
    if (prim_table[id].rules.updates_operand && nout == 1 && nin > 0 &&
        prim_reusable(ops[0], &avals[0]) && !prim_operand_repeated(ops, nin))
      out[0] = (Array *)val_incref(&ops[0]->hdr);   /* the kernel updates it in place */
    return 0;
  }
  if ((k == PK_UNARY || k == PK_BINARY) && nout == 1) {
    unsigned kept = prim_table[id].rules.kept;
    for (int j = 0; j < nin; j++) {
      if (!(kept & (1u << j)) && prim_reusable(ops[j], &avals[0])) {
        out[0] = (Array *)val_incref(&ops[j]->hdr);
        return 0;
      }
    }
  }
  for (int i = 0; i < nout; i++) {
    out[i] = arr_new(avals[i].dtype, avals[i].ndim, avals[i].shape);
    if (!out[i]) {
      for (int j = 0; j < i; j++)
        val_decref(&out[j]->hdr);
      return -1;
    }
  }
  return 0;
}

/* The result value: the one output, or a tuple of them (stolen). */
static Value *prim_result(Array **out, int nout) {
  if (nout == 1)
    return &out[0]->hdr;
  Value *t = tuple_new((size_t)nout);
  for (int i = 0; i < nout; i++) {
    if (t)
      tuple_set_steal(t, (size_t)i, &out[i]->hdr);
    else
      val_decref(&out[i]->hdr);
  }
  return t;
}

/* Checks operand types; 1 if a tracer is among them. */
static int prim_scan_operands(PrimId id, int nin, Value **in) {
  int tracer = 0;
  for (int i = 0; i < nin; i++) {
    if (in[i] && in[i]->type == V_TRACER) {
      tracer = 1;
      continue;
    }
    if (!IS_ARRAY(in[i])) {
      err_set(ERR_TYPE, "%s: operand %d is %s, expected an array", prim_table[id].name,
              i + 1, in[i] ? val_type_name(in[i]) : "missing");
      return -1;
    }
  }
  return tracer;
}

int (*prim_line_hook)(void);

VmaWhy prim_vma_why(PrimId id, int line, int nin, const VmaWhy *why, uint32_t in_vma,
                    uint32_t out_vma) {
  if (out_vma & ~in_vma) return (VmaWhy){line, (int16_t)(id + 1), 0, out_vma & ~in_vma};
  const VmaWhy *arg = NULL;
  for (int i = 0; i < nin; i++) {
    if (!(why[i].axes & out_vma)) continue;
    if (why[i].prim) return why[i];
    if (why[i].arg && (!arg || __builtin_popcount(why[i].axes & out_vma) >
                                   __builtin_popcount(arg->axes & out_vma)))
      arg = &why[i];
  }
  return arg ? *arg : (VmaWhy){0};
}

/* Records why eager result [out] varies (prim_vma_why). */
static void vma_why(PrimId id, const ApplyFrame *f, int nin, Array *out) {
  VmaWhy stack[8], *why = nin <= 8 ? stack : shm_malloc(sizeof(VmaWhy) * (size_t)nin);
  uint32_t in = 0;
  if (!why) return;   /* out of memory: the message only loses its explanation */
  for (int i = 0; i < nin; i++) {
    in |= f->ops[i]->vma;
    why[i] = f->ops[i]->why;
  }
  VmaWhy w = prim_vma_why(id, prim_line_hook ? prim_line_hook() : 0, nin, why, in, out->vma);
  if (w.axes) out->why = w;   /* else the kernel's (a view keeps its operand's) */
  if (why != stack) shm_free(why);
}

/* Whether an operand is a sharded jax.Array (array.h), whose results the
 * sharding hook lays out. */
static bool prim_sharded(Array *const *ops, int nin) {
  if (!prim_sharding_hook) return false;
  for (int i = 0; i < nin; i++)
    if (ops[i]->sharding) return true;
  return false;
}

/* 1 + the device the unsharded results of [ops] are on, as JAX's
 * computation follows data: the one the committed operands (device_put
 * to a device) share; 0 (device 0) when none is or they differ. */
static int32_t common_device(Array *const *ops, int nin) {
  int32_t d = 0;
  for (int i = 0; i < nin; i++) {
    if (!ops[i]->device1) continue;
    if (d && ops[i]->device1 != d) return 0;
    d = ops[i]->device1;
  }
  return d;
}

/* Runs the kernel and stamps the outputs' avals (and, for sharded
 * operands, the results' shardings). */
static Value *prim_run(PrimId id, ApplyFrame *f, int nin, const Params *p, AVal *outv) {
  int nout = prim_table[id].nout;
  Array *out[8];
  if (prim_sharded_run_hook && prim_sharded(f->ops, nin)) {
    Value *r = prim_sharded_run_hook(id, f->ops, nin, p);
    if (r != PRIM_DECLINED) return r;
  }
  if (nout > 8 || prim_alloc_outs(id, f->ops, nin, outv, nout, out) < 0) {
    if (nout > 8)
      err_set(ERR_VALUE, "%s: too many outputs", prim_table[id].name);
    return NULL;
  }
  Value *sh[8] = {NULL};
  /* the shardings are read before the kernel, which may write over an operand */
  if ((prim_sharded(f->ops, nin) && prim_sharding_hook(id, f->ops, nin, p, outv, nout, sh) < 0) ||
      prim_run_kernel(id, f->ops, nin, p, out) < 0) {
    for (int i = 0; i < nout; i++) {
      if (out[i]) val_decref(&out[i]->hdr);
      if (sh[i]) val_decref(sh[i]);
    }
    return NULL;
  }
  for (int i = 0; i < nout; i++) {
    out[i]->weak = outv[i].weak;
    out[i]->vma = outv[i].vma;
    if (outv[i].vma) vma_why(id, f, nin, out[i]);
    if (out[i]->sharding) val_decref(out[i]->sharding);
    out[i]->sharding = sh[i];
    out[i]->device1 = sh[i] ? 0 : common_device(f->ops, nin);
  }
  return prim_result(out, nout);
}

/* Whether [x] and [y] already agree for binary primitive [id]: what
 * shape_binary would accept with no broadcasting, and no mesh axes for
 * the replication rule to see. */
static bool binary_agree(PrimId id, const Value *x, const Value *y) {
  if ((unsigned)id >= P_COUNT || !IS_ARRAY(x) || !IS_ARRAY(y)) return false;
  const PrimInfo *pi = &prim_table[id];
  if (pi->kind != PK_BINARY || pi->nin != 2 || !pi->rules.shape || !pi->rules.kernel ||
      pi->rules.vma)
    return false;
  const Array *a = (const Array *)x, *b = (const Array *)y;
  if (a->dtype != b->dtype || !(accepts[id] & (1u << a->dtype)) || a->vma || b->vma ||
      a->sharding || b->sharding || a->device1 || b->device1)   /* prim_run's path lays the
                                                                    result out, or puts it on
                                                                    its operands' device */
    return false;
  return a->ndim == 0 || b->ndim == 0 ||
         (a->ndim == b->ndim && prim_same_dims(a->ndim, a->shape, b->shape));
}

/* The result array of binary [id] on agreeing [ops]: an unkept operand
 * that may be overwritten (prim_alloc_outs' rule), else a new one. */
static Array *binary_out(PrimId id, Array **ops, unsigned kept) {
  const Array *s = ops[1]->ndim > ops[0]->ndim ? ops[1] : ops[0];
  DType t = to_bool[id] ? DT_BOOL : ops[0]->dtype;
  for (int j = 0; j < 2; j++) {
    Array *a = ops[j];
    if (!(kept & (1u << j)) && a->ndim == s->ndim && a->dtype == t && a->contiguous &&
        arr_unshared(a))
      return (Array *)val_incref(&a->hdr);
  }
  return arr_new_like(t, s);
}

/* Runs a small binary operation on contiguous operands (or broadcast
 * scalars) straight through its row loop: a tiny eager operation is
 * mostly dispatch.  False when the kernel must run it (a large or
 * strided operation, a timeline being written). */
static bool binary_row(PrimId id, Array **ops, Array *out) {
  KernRow2 row = binary_rows[id][ops[0]->dtype];
  int64_t sa, sb;
  if (!row || out->size >= KERN_PAR_MIN || !prim_row_stride(ops[0], out, &sa) ||
      !prim_row_stride(ops[1], out, &sb) || tl_recording())
    return false;
  row(arr_data(ops[0]), sa, arr_data(ops[1]), sb, arr_data(out), out->size);
  return true;
}

/* prim_apply's way, the kept operands held so none becomes the result. */
static Value *binary_general(PrimId id, Value *x, Value *y, unsigned kept) {
  Value *in[2] = {x, y};
  Params p;
  params_init(&p);
  if (kept & 1u) val_incref(x);
  if (kept & 2u) val_incref(y);
  Value *r = prim_apply(id, 2, in, &p);
  if (kept & 1u) val_decref(x);
  if (kept & 2u) val_decref(y);
  return r;
}

Value *prim_apply_binary(PrimId id, Value *x, Value *y, unsigned kept) {
  if (!binary_agree(id, x, y)) return binary_general(id, x, y, kept);
  Array *ops[2] = {AS_ARRAY(x), AS_ARRAY(y)};
  Array *out = binary_out(id, ops, kept);
  if (!out) return NULL;
  Params p;
  params_init(&p);
  if (!binary_row(id, ops, out) && prim_run_kernel(id, ops, 2, &p, &out) < 0) {
    val_decref(&out->hdr);
    return NULL;
  }
  out->weak = !to_bool[id] && ops[0]->weak && ops[1]->weak;
  out->vma = 0;
  if (arr_np_is_live()) return arr_np_settle(&out->hdr, 2, ops);
  return &out->hdr;
}

/* The stride at which a row loop reads operand [a] of a result shaped
 * as [o], into [*stride]: 0 when 0-d (a broadcast), a 1-d operand's own
 * stride (negative when reversed, 1 when contiguous), 1 for a contiguous
 * one of o's shape.  False for any other operand.  Always inlined: as a
 * call it costs a tiny eager operation 25 instructions of its ~410. */
__attribute__((always_inline)) static inline bool into_stride(const Array *a, const Array *o,
                                                           int64_t *stride) {
  *stride = 0;
  if (a->ndim == 0) return true;
  if (a->ndim == 1) {
    *stride = a->contiguous ? 1 : a->strides[0];
    return o->ndim == 1 && a->shape[0] == o->shape[0];
  }
  *stride = 1;
  return a->contiguous && a->ndim == o->ndim && prim_same_dims(a->ndim, a->shape, o->shape);
}

/* Where [a]'s elements start, each of [size] bytes (arr_data without
 * its dtype switch). */
static inline char *into_data(const Array *a, size_t size) {
  return (char *)a->buf->data + (size_t)a->offset * size;
}

/* Once numpy is imported: whether writing [a] op [b] into [o] leaves o
 * whose it should be (array.h, "Host NumPy arrays"): an operator's
 * result of two NumPy arrays is one, of two jax.Arrays is one; any
 * other case goes through prim_apply, which settles it. */
static bool into_np_agrees(const Array *a, const Array *b, const Array *o) {
  return arr_np_mode == ARR_NP_AUTO && a->buf->np == b->buf->np && b->buf->np == o->buf->np;
}

/* The checks run first and the row loop last: a refusal returns before
 * any register is saved, and nothing but the answer is live across the
 * call. */
bool prim_binary_into(PrimId id, Value *x, Value *y, Value *dst) {
  Array *a = AS_ARRAY(x), *b = AS_ARRAY(y), *o = AS_ARRAY(dst);
  const IntoRow *r = &into_rows[id][a->dtype];
  if (!r->row || b->dtype != a->dtype || (a->vma | b->vma) || o->dtype != r->out ||
      a->sharding || b->sharding || o->sharding || a->device1 || b->device1 ||
      a->buf->part || b->buf->part ||
      !o->contiguous || o->size >= KERN_PAR_MIN || !arr_unshared(o) || tl_recording() ||
      (arr_np_is_live() && !into_np_agrees(a, b, o)))
    return false;
  int64_t sa, sb;
  /* two 0-d operands make a 0-d result, whatever o's shape */
  if (!into_stride(a, o, &sa) || !into_stride(b, o, &sb) || ((a->ndim | b->ndim) == 0 && o->ndim))
    return false;
  o->weak = r->weak & a->weak & b->weak;   /* before the call: see above */
  o->vma = 0;
  o->why = (VmaWhy){0};
  r->row(into_data(a, r->size), sa, into_data(b, r->size), sb, into_data(o, r->out_size), o->size);
  return true;
}

Value *prim_apply(PrimId id, int nin, Value **in, const Params *p) {
  if (p && p->nomem) return err_nomem();
  if ((unsigned)id >= P_COUNT)
    return err_set(ERR_VALUE, "unknown primitive %d", (int)id);
  if (prim_check_arity(id, nin) < 0)
    return NULL;
  int tracer = prim_scan_operands(id, nin, in);
  if (tracer < 0)
    return NULL;
  if (tracer) {
    if (!prim_trace_hook)
      return err_set(ERR_TYPE, "%s: got an abstract value outside of tracing",
                     prim_table[id].name);
    return trace_apply(id, nin, in, p);
  }
  ApplyFrame f;
  AVal outv[8];
  if (prim_frame_init(&f, nin) < 0)
    return NULL;
  for (int i = 0; i < nin; i++) {
    f.ops[i] = AS_ARRAY(in[i]);
    aval_of(f.ops[i], &f.avals[i]);
  }
  Value *r = NULL;
  if (prim_table[id].nout <= 8 && prim_infer(id, f.avals, nin, p, outv) == 0)
    r = prim_run(id, &f, nin, p, outv);
  if (r && arr_np_is_live()) r = arr_np_settle(r, nin, f.ops);
  prim_frame_free(&f);
  return r;
}
