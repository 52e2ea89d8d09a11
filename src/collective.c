/*
 * collective.c - the collective engine (collective.h).
 *
 * Layout of this file: parameters and participants; the group and its
 * synchronisation (publish, wait, barrier, baton); strided views and the
 * reduction arithmetic; then each collective's shape rule, vma rule and
 * kernel, fast and reference.
 *
 * Locking.  One mutex per group, CollGroup.lock, guards every field marked
 * "guarded" below: the slots' sequence state and descriptors, the barrier
 * counters, the baton and the abort state.  It is held only for
 * bookkeeping, never while data moves.  Every change of guarded state is
 * followed by bump(): epoch++ and a broadcast of CollGroup.cond, so a
 * waiter re-checks its condition after any change.  Waiters spin on epoch
 * (with a pause instruction) before sleeping when the mesh has no more
 * devices than cores; with more devices spinning would steal the cores the
 * awaited devices need, so they sleep at once.
 *
 * Memory ordering of data: operand and output pointers are published under
 * the lock; every read of a peer's buffer happens after a wait that took
 * the lock after the peer's publish or barrier arrival, so the mutex gives
 * the happens-before edges (ThreadSanitizer checks this in the unit test).
 */
#include "collective.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "array.h"
#include "eval.h"
#include "mem.h"

#define COLL_HIST 8            /* descriptors remembered per device */
#define COLL_SIG_CAP 160       /* "f32[4,8], i32[2]" */
#define COLL_PARAMS_CAP 256    /* canonical non-axis parameters */
#define COLL_SMALL_REDUCE 16384 /* elements x participants folded by each */
#define COLL_SPIN_ITERS 256    /* a few µs of pause instructions: longer
                                  spins lost to sleeping when the cores
                                  were shared with other work */

/* The kinds of collective, in messages by their jax.lax function name. */
typedef enum { CK_PSUM, CK_PMAX, CK_PMIN, CK_ALL_GATHER, CK_PSUM_SCATTER,
               CK_PPERMUTE, CK_ALL_TO_ALL, CK_RAGGED } CollKind;

static const char *const kind_names[] = {
    "psum", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute",
    "all_to_all", "ragged_all_to_all"};

typedef enum { RED_SUM, RED_MAX, RED_MIN } RedOp;

/* What one device brings to one collective; equal on all participants. */
typedef struct CollDesc {
  int kind;                       /* CollKind */
  int naxes;
  int axes[DEV_MAX_AXES];         /* mesh axis indices, in the user's order */
  char sig[COLL_SIG_CAP];         /* operand avals */
  char params[COLL_PARAMS_CAP];   /* canonical parameters other than axes */
  int line;                       /* source line of the call; 0 unknown */
} CollDesc;

/* One device's state in the group. */
typedef struct Slot {
  DevCtx ctx;                     /* the device's context (written at creation) */
  /* guarded by CollGroup.lock: */
  long seq;                       /* number of the collective entered last; -1 none */
  bool in_coll;                   /* inside collective #seq */
  bool exited, failed;            /* left the body (with an error) */
  int exit_line;
  CollDesc hist[COLL_HIST];       /* descriptor of collective #s at [s % COLL_HIST] */
  Array **in, **out;              /* published operands and outputs of #seq */
  int bar_count;                  /* barrier of instances this device leads */
  unsigned bar_gen;
} Slot;

struct CollGroup {
  MeshDesc mesh;                  /* copy; names and device_ids borrowed */
  bool reference;                 /* reference mode */
  bool spin;                      /* devices <= cores: spin before sleeping */
  pthread_mutex_t lock;           /* guards the fields marked guarded */
  pthread_cond_t cond;            /* broadcast by bump() */
  atomic_uint epoch;              /* bumped under lock; read by spinners */
  int baton;                      /* guarded: rank allowed to run (reference) */
  bool aborted;                   /* guarded */
  ErrKind abort_kind;             /* guarded */
  char abort_msg[512];            /* guarded */
  Slot *slots;                    /* [mesh.ndevices] */
  int *peer_store;                /* [ndevices * ndevices]: each rank's peers */
};

/* One collective call in progress on one device (on its stack). */
typedef struct Call {
  CollGroup *g;
  int rank;
  long seq;
  CollDesc desc;
  int n, pos;                     /* participants and this device's position */
  int *peers;                     /* [n] ranks in participant order */
  int axis_size;                  /* size of the flattened named axis */
  Array **in, **out;
} Call;

/* ---- parameters ---------------------------------------------------------- */

/* A borrowed parameter value, NULL when absent (own accessor: the rules here
 * need only this much of prim.c). */
static Value *pget(const Params *p, const char *name) {
  for (int i = 0; p && i < p->n; i++)
    if (strcmp(p->p[i].name, name) == 0) return p->p[i].value;
  return NULL;
}

/* Element [flat] (row-major over the logical shape) of an int or bool array. */
static int64_t elem_i64(const Array *a, int64_t flat) {
  int64_t off = 0;
  for (int d = a->ndim - 1; d >= 0; d--) {
    off += (flat % a->shape[d]) * a->strides[d];
    flat /= a->shape[d];
  }
  const char *base = (const char *)a->buf->data;
  int64_t at = a->offset + off;
  switch (a->dtype) {
  case DT_BOOL: return ((const uint8_t *)base)[at];
  case DT_I8: return ((const int8_t *)base)[at];
  case DT_I32: return ((const int32_t *)base)[at];
  case DT_I64: return ((const int64_t *)base)[at];
  default: return 0;
  }
}

static bool is_intlike(const Value *v) {
  if (!IS_ARRAY(v)) return false;
  const Array *a = (const Array *)v;
  return a->size == 1 && (dt_is_int(a->dtype) || a->dtype == DT_BOOL);
}

static int param_int(const char *prim, const Params *p, const char *name,
                     int64_t dflt, int64_t *out) {
  Value *v = pget(p, name);
  if (!v || v == VAL_NONE) return *out = dflt, 0;
  if (!is_intlike(v))
    return err_set(ERR_TYPE, "%s: parameter %s must be an integer", prim, name), -1;
  *out = elem_i64((const Array *)v, 0);
  return 0;
}

static int param_bool(const char *prim, const Params *p, const char *name,
                      bool *out) {
  int64_t x;
  if (param_int(prim, p, name, 0, &x) < 0) return -1;
  *out = x != 0;
  return 0;
}

/* Appends the repr of a parameter value (ints, bools, strings, None and
 * tuples of them) to buf at *len. */
static void repr_value(char *buf, size_t cap, size_t *len, Value *v) {
  if (*len >= cap) return;
  size_t room = cap - *len;
  char *at = buf + *len;
  if (!v || v == VAL_NONE) {
    *len += (size_t)snprintf(at, room, "None");
  } else if (v->type == V_STR) {
    *len += (size_t)snprintf(at, room, "'%s'", str_cstr(v));
  } else if (is_intlike(v) && ((Array *)v)->dtype == DT_BOOL) {
    *len += (size_t)snprintf(at, room, elem_i64((Array *)v, 0) ? "True" : "False");
  } else if (is_intlike(v)) {
    *len += (size_t)snprintf(at, room, "%lld", (long long)elem_i64((Array *)v, 0));
  } else if (v->type == V_TUPLE || v->type == V_LIST) {
    size_t n;
    Value *const *items;
    val_seq(v, &n, &items);
    *len += (size_t)snprintf(at, room, "(");
    for (size_t i = 0; i < n; i++) {
      if (i && *len < cap) *len += (size_t)snprintf(buf + *len, cap - *len, ", ");
      repr_value(buf, cap, len, items[i]);
    }
    if (*len < cap)
      *len += (size_t)snprintf(buf + *len, cap - *len, n == 1 ? ",)" : ")");
  } else {
    *len += (size_t)snprintf(at, room, "<%s>", val_type_name(v));
  }
}

/* The canonical string of every parameter but the axis names. */
static void params_canon(const Params *p, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = 0;
  for (int i = 0; p && i < p->n && len < cap; i++) {
    const char *name = p->p[i].name;
    if (strcmp(name, "axes") == 0 || strcmp(name, "axis_name") == 0) continue;
    len += (size_t)snprintf(buf + len, cap - len, "%s%s=", len ? " " : "", name);
    repr_value(buf, cap, &len, p->p[i].value);
  }
}

/* ---- axes and participants ------------------------------------------------- */

/* The axis-name parameter: `axes` for the reductions, `axis_name` otherwise. */
static Value *axis_param(const Params *p) {
  Value *v = pget(p, "axis_name");
  return v ? v : pget(p, "axes");
}

/* Writes "'i'" or "('i', 'j')" for the axis names of [d]. */
static void axes_str(const MeshDesc *m, const CollDesc *d, char *buf, size_t cap) {
  size_t len = 0;
  if (d->naxes == 1) {
    snprintf(buf, cap, "'%s'", m->names[d->axes[0]]);
    return;
  }
  len += (size_t)snprintf(buf, cap, "(");
  for (int k = 0; k < d->naxes && len < cap; k++)
    len += (size_t)snprintf(buf + len, cap - len, "%s'%s'", k ? ", " : "",
                            m->names[d->axes[k]]);
  if (len < cap) snprintf(buf + len, cap - len, ")");
}

/* The error for an axis name [name] that [m] does not have. */
static int unknown_axis(const char *prim, const MeshDesc *m, const char *name) {
  char have[256] = "";
  size_t len = 0;
  for (int a = 0; a < m->naxes && len < sizeof have; a++)
    len += (size_t)snprintf(have + len, sizeof have - len, "%s'%s'",
                            a ? ", " : "", m->names[a]);
  err_set(ERR_NAME, "%s: unknown axis name '%s' (the mesh's axes are %s)",
          prim, name, m->naxes ? have : "none");
  return -1;
}

/* Resolves the axis names of [p] against [m] into axes[] (user's order). */
static int resolve_axes(const char *prim, const MeshDesc *m, const Params *p,
                        int *axes, int *naxes) {
  Value *v = axis_param(p);
  size_t n = 1;
  Value *const *items = &v;
  if (!v) return err_set(ERR_TYPE, "%s: missing axis name", prim), -1;
  if (v->type != V_STR && !val_seq(v, &n, &items))
    return err_set(ERR_TYPE, "%s: axis_name must be a string or a tuple of "
                   "strings", prim), -1;
  if (n == 0 || n > DEV_MAX_AXES)
    return err_set(ERR_VALUE, "%s: expected 1 to %d axis names, got %zu", prim,
                   DEV_MAX_AXES, n), -1;
  for (size_t k = 0; k < n; k++) {
    if (items[k]->type != V_STR)
      return err_set(ERR_TYPE, "%s: axis names must be strings", prim), -1;
    int a = dev_mesh_axis(m, str_cstr(items[k]));
    if (a < 0) return unknown_axis(prim, m, str_cstr(items[k]));
    for (size_t q = 0; q < k; q++)
      if (axes[q] == a)
        return err_set(ERR_VALUE, "%s: axis '%s' named twice", prim,
                       m->names[a]), -1;
    axes[k] = a;
  }
  *naxes = (int)n;
  return 0;
}

/* Size of the flattened axis made of axes[0..naxes-1]. */
static int flat_size(const MeshDesc *m, const int *axes, int naxes) {
  int n = 1;
  for (int k = 0; k < naxes; k++) n *= m->sizes[axes[k]];
  return n;
}

/* Index of [coords] along the flattened axis (axes[0] major). */
static int flat_index(const MeshDesc *m, const int *axes, int naxes,
                      const int *coords) {
  int idx = 0;
  for (int k = 0; k < naxes; k++) idx = idx * m->sizes[axes[k]] + coords[axes[k]];
  return idx;
}

/* The rank at flattened index [idx] among the devices sharing [coords] on
 * the other axes. */
static int rank_at(const MeshDesc *m, const int *axes, int naxes,
                   const int *coords, int idx) {
  int c[DEV_MAX_AXES];
  memcpy(c, coords, sizeof c);
  for (int k = naxes - 1; k >= 0; k--) {
    c[axes[k]] = idx % m->sizes[axes[k]];
    idx /= m->sizes[axes[k]];
  }
  return dev_mesh_rank(m, c);
}

/* Validates axis_index_groups [v] for an axis of [size]: a tuple of equally
 * long tuples of ints covering 0..size-1 exactly once.  Sets *gsize. */
static int check_groups(const char *prim, Value *v, int size, int *gsize) {
  size_t ng, len0 = 0;
  Value *const *groups;
  if (!val_seq(v, &ng, &groups) || ng == 0)
    return err_set(ERR_TYPE, "%s: axis_index_groups must be a tuple of tuples "
                   "of ints", prim), -1;
  int seen[1024] = {0};
  if (size > 1024)
    return err_set(ERR_VALUE, "%s: axis_index_groups over an axis of size %d "
                   "(at most 1024 supported)", prim, size), -1;
  for (size_t i = 0; i < ng; i++) {
    size_t len;
    Value *const *ids;
    if (!val_seq(groups[i], &len, &ids) || (i && len != len0) || len == 0)
      return err_set(ERR_VALUE, "%s: axis_index_groups must all have the same "
                     "nonzero size", prim), -1;
    len0 = len;
    for (size_t j = 0; j < len; j++) {
      int64_t x = is_intlike(ids[j]) ? elem_i64((Array *)ids[j], 0) : -1;
      if (x < 0 || x >= size || seen[x]++)
        return err_set(ERR_VALUE, "%s: axis_index_groups must cover every "
                       "index of the axis (size %d) exactly once", prim, size), -1;
    }
  }
  if (len0 * ng != (size_t)size)
    return err_set(ERR_VALUE, "%s: axis_index_groups must cover every index "
                   "of the axis (size %d) exactly once", prim, size), -1;
  *gsize = (int)len0;
  return 0;
}

/* The group (tuple of ints) of axis_index_groups [v] holding [idx]. */
static Value *group_of(Value *v, int idx, int *pos) {
  size_t ng, len;
  Value *const *groups, *const *ids;
  val_seq(v, &ng, &groups);
  for (size_t i = 0; i < ng; i++) {
    val_seq(groups[i], &len, &ids);
    for (size_t j = 0; j < len; j++)
      if (elem_i64((Array *)ids[j], 0) == idx) return *pos = (int)j, groups[i];
  }
  return NULL;
}

static Value *groups_param(const Params *p) {
  Value *v = pget(p, "axis_index_groups");
  return v == VAL_NONE ? NULL : v;
}

/* Fills c->peers, c->n, c->pos for the calling device. */
static int find_participants(Call *c, const char *prim, const Params *p) {
  const MeshDesc *m = &c->g->mesh;
  const int *coords = c->g->slots[c->rank].ctx.coords;
  const int *axes = c->desc.axes, na = c->desc.naxes;
  int me = flat_index(m, axes, na, coords);
  c->axis_size = flat_size(m, axes, na);
  Value *groups = groups_param(p);
  if (!groups) {
    c->n = c->axis_size;
    c->pos = me;
    for (int i = 0; i < c->n; i++) c->peers[i] = rank_at(m, axes, na, coords, i);
    return 0;
  }
  if (check_groups(prim, groups, c->axis_size, &c->n) < 0) return -1;
  size_t len;
  Value *const *ids;
  val_seq(group_of(groups, me, &c->pos), &len, &ids);
  for (size_t j = 0; j < len; j++)
    c->peers[j] = rank_at(m, axes, na, coords, (int)elem_i64((Array *)ids[j], 0));
  return 0;
}

/* ---- the group ----------------------------------------------------------- */

static int ncores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

CollGroup *coll_group_new(const MeshDesc *mesh, bool reference) {
  int n = mesh->ndevices;
  if (n < 1 || mesh->naxes > DEV_MAX_AXES)
    return err_set(ERR_VALUE, "bad mesh: %d devices, %d axes", n, mesh->naxes);
  CollGroup *g = shm_calloc(1, sizeof *g);
  if (!g) return err_nomem();
  g->slots = shm_calloc((size_t)n, sizeof(Slot));
  g->peer_store = shm_calloc((size_t)n * (size_t)n, sizeof(int));
  if (!g->slots || !g->peer_store) {
    coll_group_free(g);
    return err_nomem();
  }
  g->mesh = *mesh;
  g->reference = reference;
  g->spin = !reference && n <= ncores();
  pthread_mutex_init(&g->lock, NULL);
  pthread_cond_init(&g->cond, NULL);
  atomic_init(&g->epoch, 0);
  for (int r = 0; r < n; r++) {
    Slot *s = &g->slots[r];
    s->seq = -1;
    s->ctx = (DevCtx){.mesh = &g->mesh, .rank = r, .group = g,
                      .reference = reference};
    dev_mesh_coords(&g->mesh, r, s->ctx.coords);
  }
  return g;
}

void coll_group_free(CollGroup *g) {
  if (!g) return;
  if (g->slots) {
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->cond);
  }
  shm_free(g->slots);
  shm_free(g->peer_store);
  shm_free(g);
}

/* Announces a change of guarded state (lock held). */
static void bump(CollGroup *g) {
  atomic_fetch_add_explicit(&g->epoch, 1, memory_order_release);
  pthread_cond_broadcast(&g->cond);
}

static inline void cpu_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Ctrl-C (eval.h).  A weak reference, so the unit test links without the
 * evaluator; a sleeping waiter looks at it every COLL_POLL_MS. */
extern atomic_int shm_interrupted __attribute__((weak));
#define COLL_POLL_MS 100

static bool interrupted(void) {
  return &shm_interrupted != NULL &&
         atomic_load_explicit(&shm_interrupted, memory_order_relaxed) != 0;
}

/* Sleeps until the guarded state may have changed (lock held on entry and
 * exit): spins on the epoch first when the group spins; wakes every
 * COLL_POLL_MS anyway so a Ctrl-C is noticed. */
static void sleep_once(CollGroup *g) {
  unsigned e = atomic_load_explicit(&g->epoch, memory_order_acquire);
  if (g->spin) {
    pthread_mutex_unlock(&g->lock);
    for (int i = 0; i < COLL_SPIN_ITERS; i++) {
      if (atomic_load_explicit(&g->epoch, memory_order_acquire) != e) break;
      cpu_pause();
    }
    pthread_mutex_lock(&g->lock);
    if (atomic_load_explicit(&g->epoch, memory_order_acquire) != e) return;
  }
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_nsec += COLL_POLL_MS * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_cond_timedwait(&g->cond, &g->lock, &until);
}

/* Reference mode: gives the baton to the next device, in rank order, that
 * has not left the body (lock held). */
static void pass_baton(CollGroup *g, int from) {
  int n = g->mesh.ndevices;
  g->baton = -1;
  for (int i = 1; i <= n; i++) {
    int r = (from + i) % n;
    if (!g->slots[r].exited) {
      g->baton = r;
      break;
    }
  }
  bump(g);
}

/* A wait condition: 1 satisfied, -1 failed (error set), 0 not yet. */
typedef int (*CondFn)(CollGroup *g, int rank, void *arg);

/* Waits (lock held) until cond is decided; in reference mode also until
 * this device holds the baton, passing it on while it cannot go on. */
static int wait_for(CollGroup *g, int rank, CondFn cond, void *arg) {
  for (;;) {
    int r = cond(g, rank, arg);
    if (!g->reference) {
      if (r != 0) return r;
    } else if (g->baton == rank) {
      if (r != 0) return r;
      pass_baton(g, rank);
    }
    sleep_once(g);
  }
}

static int cond_true(CollGroup *g, int rank, void *arg) {
  (void)g, (void)rank, (void)arg;
  return 1;
}

/* ---- descriptors and messages ------------------------------------------------ */

static bool desc_equal(const CollDesc *a, const CollDesc *b) {
  return a->kind == b->kind && a->naxes == b->naxes &&
         memcmp(a->axes, b->axes, sizeof(int) * (size_t)a->naxes) == 0 &&
         strcmp(a->sig, b->sig) == 0 && strcmp(a->params, b->params) == 0;
}

/* "psum over 'i' of f32[4] at line 7"; with [with_params] (when only the
 * parameters differ) "all_gather[tiled=True ...] over ...". */
static void desc_str(const CollGroup *g, const CollDesc *d, bool with_params,
                     char *buf, size_t cap) {
  char axes[128], line[32] = "";
  axes_str(&g->mesh, d, axes, sizeof axes);
  if (d->line > 0) snprintf(line, sizeof line, " at line %d", d->line);
  snprintf(buf, cap, "%s%s%s%s over %s of %s%s", kind_names[d->kind],
           with_params ? "[" : "", with_params ? d->params : "",
           with_params ? "]" : "", axes, d->sig, line);
}

static const char *coords_of(const CollGroup *g, int rank, char *buf, size_t cap) {
  return dev_mesh_coords_str(&g->mesh, rank, buf, cap);
}

/* Sets the mismatch error between rank a's [da] and rank b's [db], the
 * lower rank first so every detector words it the same way. */
static int mismatch_error(CollGroup *g, int a, const CollDesc *da, int b,
                          const CollDesc *db) {
  if (b < a) {
    int t = a; a = b; b = t;
    const CollDesc *td = da; da = db; db = td;
  }
  bool params = da->kind == db->kind && da->naxes == db->naxes &&
                memcmp(da->axes, db->axes, sizeof(int) * (size_t)da->naxes) == 0 &&
                strcmp(da->sig, db->sig) == 0;
  char ca[128], cb[128], sa[1024], sb[1024];
  desc_str(g, da, params, sa, sizeof sa);
  desc_str(g, db, params, sb, sizeof sb);
  err_set(ERR_COLLECTIVE, "collective mismatch: device %s reached %s, device "
          "%s reached %s", coords_of(g, a, ca, sizeof ca), sa,
          coords_of(g, b, cb, sizeof cb), sb);
  return -1;
}

/* The error of a waiter whose participant [p] left the body or gave up. */
static int left_error(CollGroup *g, const Call *c, int p, bool gave_up) {
  const Slot *s = &g->slots[p];
  char cp[128], cm[128], what[1024], line[32] = "";
  desc_str(g, &c->desc, false, what, sizeof what);
  coords_of(g, p, cp, sizeof cp);
  coords_of(g, c->rank, cm, sizeof cm);
  if (gave_up || s->failed) {
    dev_error_secondary();
    return err_set(ERR_COLLECTIVE, "device %s stopped with an error while "
                   "device %s waits in %s", cp, cm, what), -1;
  }
  if (s->exit_line > 0) snprintf(line, sizeof line, " at line %d", s->exit_line);
  return err_set(ERR_COLLECTIVE, "device %s returned from the body%s while "
                 "device %s waits in %s", cp, line, cm, what), -1;
}

/* Checks participant [p] against the caller's collective: 1 arrived and
 * agreeing, 0 not yet, -1 error set, -2 it gave up with an error (an echo:
 * the caller first looks for a cause among the other participants). */
static int check_peer(CollGroup *g, const Call *c, int p) {
  const Slot *s = &g->slots[p];
  if (s->seq >= c->seq) {
    long ahead = s->seq - c->seq;
    const CollDesc *d = &s->hist[c->seq % COLL_HIST];
    if (ahead < COLL_HIST && !desc_equal(d, &c->desc))
      return mismatch_error(g, c->rank, &c->desc, p, d);
    if (ahead > 0) {
      char cp[128];
      return err_set(ERR_COLLECTIVE, "collective mismatch: device %s went on "
                     "past its collective #%ld without this device",
                     coords_of(g, p, cp, sizeof cp), c->seq + 1), -1;
    }
    return s->in_coll ? 1 : -2;
  }
  return s->exited ? left_error(g, c, p, false) : 0;
}

/* The error of an aborted group or of Ctrl-C, if any: 0 none, else -1. */
static int abort_error(CollGroup *g) {
  if (g->aborted) return err_set(g->abort_kind, "%s", g->abort_msg), -1;
  if (interrupted()) return err_set(ERR_INTERRUPT, "interrupted"), -1;
  return 0;
}

/* Arrival condition: every participant published a matching descriptor.
 * Once true it stays true until all have gone through the final barrier,
 * so all participants commit alike; an abort counts only before that, and
 * its error wins over the peers' (which it may have caused). */
static int cond_arrived(CollGroup *g, int rank, void *arg) {
  Call *c = arg;
  int ready = 1, gave_up = -1;
  (void)rank;
  for (int i = 0; i < c->n; i++) {
    if (c->peers[i] == c->rank) continue;
    int r = check_peer(g, c, c->peers[i]);
    if (r == -1) {
      abort_error(g);  /* replaces the peer's error when aborted */
      return -1;
    }
    if (r == -2 && gave_up < 0) gave_up = c->peers[i];
    if (r != 1) ready = 0;
  }
  if (ready) return 1;
  if (abort_error(g) < 0) return -1;
  return gave_up >= 0 ? left_error(g, c, gave_up, true) : 0;
}

/* ---- entering and leaving a collective -------------------------------------- */

/* Publishes the caller's descriptor and buffers (lock held). */
static void publish(Call *c) {
  Slot *s = &c->g->slots[c->rank];
  s->seq = c->seq;
  s->hist[c->seq % COLL_HIST] = c->desc;
  s->in = c->in;
  s->out = c->out;
  s->in_coll = true;
  bump(c->g);
}

/* Waits until all participants arrived; on failure leaves the collective. */
static int rendezvous(Call *c) {
  CollGroup *g = c->g;
  pthread_mutex_lock(&g->lock);
  if (abort_error(g) < 0) {
    pthread_mutex_unlock(&g->lock);
    return -1;
  }
  c->seq = g->slots[c->rank].seq + 1;
  publish(c);
  int r = c->n == 1 ? 1 : wait_for(g, c->rank, cond_arrived, c);
  if (r < 0) {
    g->slots[c->rank].in_coll = false;
    bump(g);
  }
  pthread_mutex_unlock(&g->lock);
  return r < 0 ? -1 : 0;
}

typedef struct BarrierArg {
  Slot *leader;
  unsigned gen;
} BarrierArg;

static int cond_generation(CollGroup *g, int rank, void *arg) {
  BarrierArg *b = arg;
  (void)g, (void)rank;
  return b->leader->bar_gen != b->gen;
}

/*
 * Barrier of the call's participants, counted at the first participant's
 * slot (it leads one instance at a time, and every participant of that
 * instance agrees on who leads).  Returns true to exactly one caller, the
 * last to arrive.  Not interruptible: every participant is past the
 * rendezvous and reaches it without running user code.
 */
static bool barrier(Call *c) {
  CollGroup *g = c->g;
  if (c->n == 1) return true;
  pthread_mutex_lock(&g->lock);
  BarrierArg b = {&g->slots[c->peers[0]], 0};
  b.gen = b.leader->bar_gen;
  bool last = ++b.leader->bar_count == c->n;
  if (last) {
    b.leader->bar_count = 0;
    b.leader->bar_gen++;
    bump(g);
  }
  wait_for(g, c->rank, cond_generation, &b);
  pthread_mutex_unlock(&g->lock);
  return last;
}

/* The final barrier (operands may be released after it) and leaving. */
static void leave(Call *c) {
  barrier(c);
  pthread_mutex_lock(&c->g->lock);
  c->g->slots[c->rank].in_coll = false;
  pthread_mutex_unlock(&c->g->lock);
}

/* Sets up [c] on the calling device: group, axes, participants, descriptor. */
static int call_init(Call *c, CollKind kind, const Params *p, Array **in,
                     int nin, Array **out) {
  const char *prim = kind_names[kind];
  DevCtx *ctx = dev_ctx();
  if (!ctx || !ctx->group)
    return err_set(ERR_VALUE, "%s can only be used inside a shard_map body",
                   prim), -1;
  memset(c, 0, sizeof *c);
  c->g = ctx->group;
  c->rank = ctx->rank;
  c->in = in;
  c->out = out;
  c->peers = c->g->peer_store + (size_t)c->rank * (size_t)c->g->mesh.ndevices;
  c->desc.kind = kind;
  c->desc.line = eval_current_loc().line;
  if (resolve_axes(prim, &c->g->mesh, p, c->desc.axes, &c->desc.naxes) < 0)
    return -1;
  if (find_participants(c, prim, p) < 0) return -1;
  size_t len = 0;
  for (int i = 0; i < nin && len < COLL_SIG_CAP; i++) {
    char av[96];
    aval_str(av, sizeof av, in[i]->dtype, in[i]->ndim, in[i]->shape);
    len += (size_t)snprintf(c->desc.sig + len, COLL_SIG_CAP - len, "%s%s",
                            i ? ", " : "", av);
  }
  params_canon(p, c->desc.params, sizeof c->desc.params);
  return 0;
}

/* ---- entering and leaving the body --------------------------------------------- */

int coll_enter(CollGroup *g, int rank) {
  dev_ctx_set(&g->slots[rank].ctx);
  if (!g->reference) return 0;
  pthread_mutex_lock(&g->lock);
  wait_for(g, rank, cond_true, NULL);
  pthread_mutex_unlock(&g->lock);
  return 0;
}

void coll_device_exit(CollGroup *g, int rank, bool failed) {
  int line = eval_current_loc().line;
  pthread_mutex_lock(&g->lock);
  Slot *s = &g->slots[rank];
  s->exited = true;
  s->failed = failed;
  s->exit_line = line;
  if (g->reference && g->baton == rank) pass_baton(g, rank);
  bump(g);
  pthread_mutex_unlock(&g->lock);
}

void coll_group_abort(CollGroup *g, ErrKind kind, const char *why) {
  pthread_mutex_lock(&g->lock);
  if (!g->aborted) {
    g->aborted = true;
    g->abort_kind = kind;
    snprintf(g->abort_msg, sizeof g->abort_msg, "%s", why);
  }
  bump(g);
  pthread_mutex_unlock(&g->lock);
}

bool coll_waiting_str(CollGroup *g, int rank, char *buf, size_t cap) {
  pthread_mutex_lock(&g->lock);
  Slot *s = &g->slots[rank];
  bool in = s->in_coll;
  buf[0] = 0;
  if (in) {
    CollDesc d = s->hist[s->seq % COLL_HIST];
    char axes[128], line[32] = "";
    axes_str(&g->mesh, &d, axes, sizeof axes);
    if (d.line > 0) snprintf(line, sizeof line, " at line %d", d.line);
    snprintf(buf, cap, "%s over %s%s", kind_names[d.kind], axes, line);
  }
  pthread_mutex_unlock(&g->lock);
  return in;
}

long coll_seq(CollGroup *g, int rank) {
  pthread_mutex_lock(&g->lock);
  long s = g->slots[rank].seq + 1;
  pthread_mutex_unlock(&g->lock);
  return s;
}

typedef struct RunArg {
  CollGroup *g;
  void (*fn)(int rank, void *ctx);
  void *ctx;
} RunArg;

static void run_one(int rank, void *arg) {
  RunArg *ra = arg;
  if (coll_enter(ra->g, rank) == 0) ra->fn(rank, ra->ctx);
  coll_device_exit(ra->g, rank, err_occurred());
}

int coll_run(CollGroup *g, void (*fn)(int rank, void *ctx), void *ctx) {
  RunArg ra = {g, fn, ctx};
  return dev_run(g->mesh.ndevices, g->mesh.device_ids, run_one, &ra);
}

/* ---- strided views ------------------------------------------------------------ */

/* A region of an array: element strides, as array.h counts them. */
typedef struct View {
  char *base;                     /* first element */
  size_t esize;
  int ndim;
  int64_t shape[SHM_MAXDIM];
  int64_t strides[SHM_MAXDIM];
} View;

static void view_of(View *v, const Array *a) {
  v->base = arr_data(a);
  v->esize = dt_size(a->dtype);
  v->ndim = a->ndim;
  memcpy(v->shape, a->shape, sizeof(int64_t) * (size_t)a->ndim);
  memcpy(v->strides, a->strides, sizeof(int64_t) * (size_t)a->ndim);
}

/* Restricts dimension [d] to [start, start + len). */
static void view_slice(View *v, int d, int64_t start, int64_t len) {
  v->base += start * v->strides[d] * (int64_t)v->esize;
  v->shape[d] = len;
}

/* Removes dimension [d], which has size 1. */
static void view_drop(View *v, int d) {
  for (int k = d; k + 1 < v->ndim; k++) {
    v->shape[k] = v->shape[k + 1];
    v->strides[k] = v->strides[k + 1];
  }
  v->ndim--;
}

/* An inner loop over [n] elements with element strides [ds] and [ss]. */
typedef void (*InnerFn)(char *dst, const char *src, int64_t n, int64_t ds,
                        int64_t ss, const void *arg);

/* Calls fn over [dst] and [src] (same shape), one innermost row at a time. */
static void view_each2(const View *dst, const View *src, InnerFn fn,
                       const void *arg) {
  int nd = dst->ndim;
  int64_t idx[SHM_MAXDIM] = {0};
  for (int k = 0; k < nd; k++)
    if (dst->shape[k] == 0) return;
  int64_t inner = nd ? dst->shape[nd - 1] : 1;
  int64_t ds = nd ? dst->strides[nd - 1] : 1, ss = nd ? src->strides[nd - 1] : 1;
  char *d = dst->base;
  const char *s = src->base;
  for (;;) {
    fn(d, s, inner, ds, ss, arg);
    int k = nd - 2;
    for (; k >= 0; k--) {
      d += dst->strides[k] * (int64_t)dst->esize;
      s += src->strides[k] * (int64_t)src->esize;
      if (++idx[k] < dst->shape[k]) break;
      d -= dst->strides[k] * dst->shape[k] * (int64_t)dst->esize;
      s -= src->strides[k] * src->shape[k] * (int64_t)src->esize;
      idx[k] = 0;
    }
    if (k < 0) return;
  }
}

static void inner_copy(char *dst, const char *src, int64_t n, int64_t ds,
                       int64_t ss, const void *arg) {
  size_t es = *(const size_t *)arg;
  if (ds == 1 && ss == 1) {
    memcpy(dst, src, (size_t)n * es);
    return;
  }
  for (int64_t i = 0; i < n; i++)
    memcpy(dst + i * ds * (int64_t)es, src + i * ss * (int64_t)es, es);
}

static void view_copy(const View *dst, const View *src) {
  view_each2(dst, src, inner_copy, &dst->esize);
}

/* ---- reduction arithmetic ------------------------------------------------------ */
/* One scalar rule per dtype, used by the fast and the reference paths
 * alike, so both give the same bits.  Integers wrap; bool sum and max are
 * OR, min is AND; float max/min propagate NaN, as XLA's do; 16-bit floats
 * are combined in f32 and rounded back after every step. */

#define RED_FLOAT(T, a, b, op)                                   \
  ((op) == RED_SUM ? (T)((a) + (b))                              \
   : (a) != (a) ? (a) : (b) != (b) ? (b)                         \
   : (op) == RED_MAX ? ((a) > (b) ? (a) : (b)) : ((a) < (b) ? (a) : (b)))

typedef struct RedArg {
  DType dtype;
  RedOp op;
} RedArg;

static void red_f32(float *a, const float *b, int64_t n, int64_t as, int64_t bs,
                    RedOp op) {
  for (int64_t i = 0; i < n; i++) {
    float x = a[i * as], y = b[i * bs];
    a[i * as] = RED_FLOAT(float, x, y, op);
  }
}

static void red_f64(double *a, const double *b, int64_t n, int64_t as,
                    int64_t bs, RedOp op) {
  for (int64_t i = 0; i < n; i++) {
    double x = a[i * as], y = b[i * bs];
    a[i * as] = RED_FLOAT(double, x, y, op);
  }
}

static void red_half(uint16_t *a, const uint16_t *b, int64_t n, int64_t as,
                     int64_t bs, RedOp op, bool bf16) {
  for (int64_t i = 0; i < n; i++) {
    uint16_t ha = a[i * as], hb = b[i * bs];
    float x = bf16 ? dt_bf16_to_f32(ha) : dt_f16_to_f32(ha);
    float y = bf16 ? dt_bf16_to_f32(hb) : dt_f16_to_f32(hb);
    if (op == RED_SUM)
      a[i * as] = bf16 ? dt_f32_to_bf16(x + y) : dt_f32_to_f16(x + y);
    else if (x != x || y != y)
      a[i * as] = x != x ? ha : hb;
    else
      a[i * as] = (op == RED_MAX ? y > x : y < x) ? hb : ha;
  }
}

static int64_t red_int(int64_t x, int64_t y, RedOp op) {
  if (op == RED_SUM) return (int64_t)((uint64_t)x + (uint64_t)y);
  if (op == RED_MAX) return x > y ? x : y;
  return x < y ? x : y;
}

#define RED_INT_LOOP(T)                                                  \
  for (int64_t i = 0; i < n; i++) {                                      \
    T *pa = (T *)a + i * as;                                             \
    *pa = (T)red_int(*pa, ((const T *)b)[i * bs], op);                   \
  }

static void red_ints(DType t, char *a, const char *b, int64_t n, int64_t as,
                     int64_t bs, RedOp op) {
  if (t == DT_I8) { RED_INT_LOOP(int8_t) }
  else if (t == DT_I32) { RED_INT_LOOP(int32_t) }
  else if (t == DT_I64) { RED_INT_LOOP(int64_t) }
  else {
    for (int64_t i = 0; i < n; i++) {
      uint8_t *pa = (uint8_t *)a + i * as, y = ((const uint8_t *)b)[i * bs];
      *pa = op == RED_MIN ? (*pa && y) : (*pa || y);
    }
  }
}

/* acc[i*as] = acc[i*as] (op) x[i*xs] for i < n. */
static void inner_reduce(char *acc, const char *x, int64_t n, int64_t as,
                         int64_t xs, const void *arg) {
  const RedArg *r = arg;
  switch (r->dtype) {
  case DT_F32: red_f32((float *)acc, (const float *)x, n, as, xs, r->op); break;
  case DT_F64: red_f64((double *)acc, (const double *)x, n, as, xs, r->op); break;
  case DT_F16: case DT_BF16:
    red_half((uint16_t *)acc, (const uint16_t *)x, n, as, xs, r->op,
             r->dtype == DT_BF16);
    break;
  default: red_ints(r->dtype, acc, x, n, as, xs, r->op); break;
  }
}

/* ---- the reference path's gathered global array ------------------------------ */

/* All participants' operand [k] stacked into one contiguous buffer,
 * participant-major: global[q] is participant q's block, row-major. */
typedef struct Global {
  char *data;
  size_t nbytes;
  int64_t block;                  /* elements per participant */
  View blockview;                 /* shape of one block, contiguous strides */
} Global;

static int global_gather(Global *gl, const Call *c, int k) {
  const CollGroup *g = c->g;
  const Array *mine = c->in[k];
  size_t es = dt_size(mine->dtype);
  gl->block = mine->size;
  gl->nbytes = (size_t)gl->block * es * (size_t)c->n;
  gl->data = shm_buf_alloc(gl->nbytes ? gl->nbytes : 1);
  if (!gl->data) return err_nomem(), -1;
  for (int q = 0; q < c->n; q++) {
    View src, dst;
    view_of(&src, g->slots[c->peers[q]].in[k]);
    dst = src;
    dst.base = gl->data + (size_t)q * (size_t)gl->block * es;
    shape_strides(dst.ndim, dst.shape, dst.strides);
    view_copy(&dst, &src);
    if (q == 0) gl->blockview = dst;
  }
  return 0;
}

static void global_free(Global *gl) {
  shm_buf_free(gl->data, gl->nbytes ? gl->nbytes : 1);
}

/* Pointer to element [idx] of participant q's block. */
static char *global_at(const Global *gl, int q, const int64_t *idx) {
  const View *b = &gl->blockview;
  int64_t off = 0;
  for (int d = 0; d < b->ndim; d++) off = off * b->shape[d] + idx[d];
  return gl->data + ((size_t)q * (size_t)gl->block + (size_t)off) * b->esize;
}

/* Row-major multi-index of [flat] in [shape]. */
static void unravel(int64_t flat, int ndim, const int64_t *shape, int64_t *idx) {
  for (int d = ndim - 1; d >= 0; d--) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
}

/* Inserts [x] at position [at] of idx[0..n-1]. */
static void idx_insert(int64_t *idx, int n, int at, int64_t x) {
  for (int d = n; d > at; d--) idx[d] = idx[d - 1];
  idx[at] = x;
}

/* Removes position [at] of idx[0..n-1]. */
static void idx_delete(int64_t *idx, int n, int at) {
  for (int d = at; d + 1 < n; d++) idx[d] = idx[d + 1];
}

/* The reference loop: for every element of [out], map(out index) names a
 * participant and an operand index; the element is copied from there. */
typedef int (*RefMap)(const Call *c, const void *arg, int64_t *idx);

static void ref_fill(const Call *c, const Global *gl, Array *out, RefMap map,
                     const void *arg) {
  size_t es = dt_size(out->dtype);
  char *o = arr_data(out);
  for (int64_t f = 0; f < out->size; f++) {
    int64_t idx[SHM_MAXDIM + 1];
    unravel(f, out->ndim, out->shape, idx);
    int q = map(c, arg, idx);
    if (q < 0)
      memset(o + (size_t)f * es, 0, es);
    else
      memcpy(o + (size_t)f * es, global_at(gl, q, idx), es);
  }
}

/* ---- shape-rule helpers ------------------------------------------------------- */

/* The aval of [a] (the kernels recheck parameters with the shape rules'
 * helpers). */
static void aval_from(const Array *a, AVal *av) {
  memset(av, 0, sizeof *av);
  av->dtype = a->dtype;
  av->weak = a->weak;
  av->ndim = a->ndim;
  memcpy(av->shape, a->shape, sizeof(int64_t) * (size_t)a->ndim);
  av->vma = a->vma;
}

/* The number of participants n for a shape rule: the axis_size parameter,
 * else the current mesh (and axis_index_groups), else an error. */
static int shape_axis_n(const char *prim, const Params *p, int64_t *n) {
  if (pget(p, "axis_size") && pget(p, "axis_size") != VAL_NONE)
    return param_int(prim, p, "axis_size", 1, n);
  DevCtx *ctx = dev_ctx();
  if (!ctx || !ctx->mesh)
    return err_set(ERR_VALUE, "%s needs its axis_size parameter outside a "
                   "shard_map body", prim), -1;
  int axes[DEV_MAX_AXES], na, gsize;
  if (resolve_axes(prim, ctx->mesh, p, axes, &na) < 0) return -1;
  int size = flat_size(ctx->mesh, axes, na);
  Value *groups = groups_param(p);
  if (groups && check_groups(prim, groups, size, &gsize) < 0) return -1;
  *n = groups ? gsize : size;
  return 0;
}

/* A kernel's check that the axis_size its shape rule used (when given) is
 * the real number of participants [n]: the output was sized by it. */
static int check_axis_size(const char *prim, const Params *p, int n) {
  int64_t given;
  if (param_int(prim, p, "axis_size", n, &given) < 0) return -1;
  if (given != n)
    return err_set(ERR_VALUE, "%s: axis_size=%lld, but the axis has %d "
                   "participants", prim, (long long)given, n), -1;
  return 0;
}

/* Normalises dimension parameter [name] (default 0) for a rank [ndim]. */
static int param_dim(const char *prim, const Params *p, const char *name,
                     int ndim, int *out) {
  int64_t d;
  if (param_int(prim, p, name, 0, &d) < 0) return -1;
  if (d < 0) d += ndim;
  if (d < 0 || d >= ndim)
    return err_set(ERR_VALUE, "%s: %s %lld is out of bounds for an operand of "
                   "rank %d", prim, name, (long long)d, ndim), -1;
  *out = (int)d;
  return 0;
}

static void shape_insert(AVal *a, int at, int64_t x) {
  for (int d = a->ndim; d > at; d--) a->shape[d] = a->shape[d - 1];
  a->shape[at] = x;
  a->ndim++;
}

static void shape_delete(AVal *a, int at) {
  for (int d = at; d + 1 < a->ndim; d++) a->shape[d] = a->shape[d + 1];
  a->ndim--;
}

/* ---- vma-rule helpers --------------------------------------------------------- */

/* The mesh-axis bits named by [p]; false when no mesh is current. */
static bool axes_mask(const Params *p, uint32_t *mask) {
  DevCtx *ctx = dev_ctx();
  int axes[DEV_MAX_AXES], na;
  if (!ctx || !ctx->mesh) return false;
  if (resolve_axes("collective", ctx->mesh, p, axes, &na) < 0) {
    err_clear();
    return false;
  }
  *mask = 0;
  for (int k = 0; k < na; k++) *mask |= 1u << axes[k];
  return true;
}

static uint32_t vma_union(const uint32_t *in, int nin) {
  uint32_t u = 0;
  for (int i = 0; i < nin; i++) u |= in[i];
  return u;
}

/* psum, pmax, pmin, all_gather: the axes are removed unless grouped. */
static uint32_t vma_remove(const uint32_t *in, int nin, const Params *p) {
  uint32_t m;
  if (groups_param(p) || !axes_mask(p, &m)) return vma_union(in, nin);
  return vma_union(in, nin) & ~m;
}

/* ppermute, all_to_all, psum_scatter, ragged_all_to_all: the axes are added. */
static uint32_t vma_add(const uint32_t *in, int nin, const Params *p) {
  uint32_t m = 0;
  axes_mask(p, &m);
  return vma_union(in, nin) | m;
}

/* ---- axis_index -------------------------------------------------------------- */

int coll_shape_axis_index(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)in, (void)nin, (void)p;
  memset(out, 0, sizeof *out);
  out->dtype = DT_I32;
  return 0;
}

/* Semantics: jax.lax.axis_index; a tuple of names is one flattened axis. */
int coll_kernel_axis_index(Array **in, int nin, const Params *p, Array **out) {
  (void)in, (void)nin;
  DevCtx *ctx = dev_ctx();
  int axes[DEV_MAX_AXES], na;
  if (!ctx || !ctx->mesh)
    return err_set(ERR_VALUE, "axis_index can only be used inside a shard_map "
                   "body"), -1;
  if (resolve_axes("axis_index", ctx->mesh, p, axes, &na) < 0) return -1;
  *(int32_t *)arr_data(out[0]) = flat_index(ctx->mesh, axes, na, ctx->coords);
  return 0;
}

uint32_t coll_vma_axis_index(const uint32_t *in, int nin, const Params *p) {
  uint32_t m = 0;
  (void)in, (void)nin;
  axes_mask(p, &m);
  return m;
}

/* ---- psum, pmax, pmin ------------------------------------------------------------ */

static int shape_same(const AVal *in, int nin, AVal *out) {
  if (nin != 1) return err_set(ERR_TYPE, "expected one operand"), -1;
  *out = in[0];
  return 0;
}

int coll_shape_psum(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)p;
  return shape_same(in, nin, out);
}
int coll_shape_pmax(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)p;
  return shape_same(in, nin, out);
}
int coll_shape_pmin(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)p;
  return shape_same(in, nin, out);
}

/* The part [q] of [n] of array [a]: a flat range when [flat] (the arrays
 * are contiguous), else a range of rows along dimension 0. */
static void part_view(View *v, const Array *a, bool flat, int q, int n) {
  if (flat) {
    int64_t lo = a->size * q / n, hi = a->size * (q + 1) / n;
    v->base = (char *)arr_data(a) + lo * (int64_t)dt_size(a->dtype);
    v->esize = dt_size(a->dtype);
    v->ndim = 1;
    v->shape[0] = hi - lo;
    v->strides[0] = 1;
    return;
  }
  int64_t lo = a->shape[0] * q / n, hi = a->shape[0] * (q + 1) / n;
  view_of(v, a);
  view_slice(v, 0, lo, hi - lo);
}

static Array *peer_in(const Call *c, int q, int k) {
  return c->g->slots[c->peers[q]].in[k];
}

static Array *peer_out(const Call *c, int q) {
  return c->g->slots[c->peers[q]].out[0];
}

/* Small reductions: every participant folds all operands itself, in
 * participant order (the same bits everywhere), saving the barrier that
 * splitting the work needs; a barrier costs more than the arithmetic. */
static void fold_all(const Call *c, const RedArg *r) {
  View dst, src;
  view_of(&dst, c->out[0]);
  for (int q = 0; q < c->n; q++) {
    view_of(&src, peer_in(c, q, 0));
    if (q == 0)
      view_copy(&dst, &src);
    else
      view_each2(&dst, &src, inner_reduce, r);
  }
}

/* Reduce-scatter then all-gather: participant pos reduces part pos of every
 * operand, in participant order, into its own output; then every
 * participant copies the other parts from their owners' outputs. */
static int fast_reduce(const Call *c, const RedArg *r) {
  if (c->out[0]->size * c->n <= COLL_SMALL_REDUCE) {
    fold_all(c, r);
    return 0;
  }
  bool flat = true;
  for (int q = 0; q < c->n; q++) flat = flat && peer_in(c, q, 0)->contiguous;
  flat = flat || c->out[0]->ndim == 0;
  View dst, src;
  part_view(&dst, c->out[0], flat, c->pos, c->n);
  for (int q = 0; q < c->n; q++) {
    part_view(&src, peer_in(c, q, 0), flat, c->pos, c->n);
    if (q == 0)
      view_copy(&dst, &src);
    else
      view_each2(&dst, &src, inner_reduce, r);
  }
  barrier((Call *)c);
  for (int q = 0; q < c->n; q++) {
    if (q == c->pos) continue;
    part_view(&dst, c->out[0], flat, q, c->n);
    part_view(&src, peer_out(c, q), flat, q, c->n);
    view_copy(&dst, &src);
  }
  return 0;
}

/* Reference: every operand gathered, then one fold in participant order. */
static int ref_reduce(const Call *c, const RedArg *r) {
  Global gl;
  if (global_gather(&gl, c, 0) < 0) return -1;
  View dst, src = gl.blockview;
  view_of(&dst, c->out[0]);
  for (int q = 0; q < c->n; q++) {
    src.base = gl.data + (size_t)q * (size_t)gl.block * src.esize;
    if (q == 0)
      view_copy(&dst, &src);
    else
      view_each2(&dst, &src, inner_reduce, r);
  }
  global_free(&gl);
  return 0;
}

/* Semantics: jax.lax.psum / pmax / pmin with axis_index_groups. */
static int reduce_kernel(CollKind kind, RedOp op, Array **in, const Params *p,
                         Array **out) {
  Call c;
  if (call_init(&c, kind, p, in, 1, out) < 0 || rendezvous(&c) < 0) return -1;
  RedArg r = {in[0]->dtype, op};
  int rc = c.g->reference ? ref_reduce(&c, &r) : fast_reduce(&c, &r);
  leave(&c);
  return rc;
}

int coll_kernel_psum(Array **in, int nin, const Params *p, Array **out) {
  (void)nin;
  return reduce_kernel(CK_PSUM, RED_SUM, in, p, out);
}
int coll_kernel_pmax(Array **in, int nin, const Params *p, Array **out) {
  (void)nin;
  return reduce_kernel(CK_PMAX, RED_MAX, in, p, out);
}
int coll_kernel_pmin(Array **in, int nin, const Params *p, Array **out) {
  (void)nin;
  return reduce_kernel(CK_PMIN, RED_MIN, in, p, out);
}

uint32_t coll_vma_psum(const uint32_t *in, int nin, const Params *p) {
  return vma_remove(in, nin, p);
}
uint32_t coll_vma_pmax(const uint32_t *in, int nin, const Params *p) {
  return vma_remove(in, nin, p);
}
uint32_t coll_vma_pmin(const uint32_t *in, int nin, const Params *p) {
  return vma_remove(in, nin, p);
}

/* ---- all_gather ---------------------------------------------------------------- */

typedef struct GatherArgs {
  int dim;
  bool tiled;
  int64_t n;
} GatherArgs;

static int gather_args(const Params *p, int ndim, GatherArgs *a, bool need_n) {
  const char *prim = "all_gather";
  if (param_bool(prim, p, "tiled", &a->tiled) < 0) return -1;
  if (param_dim(prim, p, "all_gather_dimension", a->tiled ? ndim : ndim + 1,
                &a->dim) < 0)
    return -1;
  a->n = 0;
  return need_n ? shape_axis_n(prim, p, &a->n) : 0;
}

int coll_shape_all_gather(const AVal *in, int nin, const Params *p, AVal *out) {
  GatherArgs a;
  if (shape_same(in, nin, out) < 0 || gather_args(p, in[0].ndim, &a, true) < 0)
    return -1;
  if (a.tiled)
    out->shape[a.dim] *= a.n;
  else if (out->ndim >= SHM_MAXDIM)
    return err_set(ERR_VALUE, "all_gather: result would have more than %d "
                   "dimensions", SHM_MAXDIM), -1;
  else
    shape_insert(out, a.dim, a.n);
  return 0;
}

/* Where participant q's block goes in the output. */
static void gather_dst(View *dst, const Array *out, const GatherArgs *a, int q,
                       int64_t len) {
  view_of(dst, out);
  if (a->tiled) {
    view_slice(dst, a->dim, q * len, len);
  } else {
    view_slice(dst, a->dim, q, 1);
    view_drop(dst, a->dim);
  }
}

static int fast_gather(const Call *c, const GatherArgs *a) {
  for (int q = 0; q < c->n; q++) {
    View src, dst;
    view_of(&src, peer_in(c, q, 0));
    gather_dst(&dst, c->out[0], a, q, a->tiled ? src.shape[a->dim] : 1);
    view_copy(&dst, &src);
  }
  return 0;
}

static int map_gather(const Call *c, const void *arg, int64_t *idx) {
  const GatherArgs *a = arg;
  int q;
  if (a->tiled) {
    int64_t b = c->in[0]->shape[a->dim];
    q = (int)(idx[a->dim] / b);
    idx[a->dim] %= b;
  } else {
    q = (int)idx[a->dim];
    idx_delete(idx, c->out[0]->ndim, a->dim);
  }
  return q;
}

/* Runs the common body of the data-movement collectives: rendezvous, the
 * fast or reference movement, the final barrier. */
static int move_kernel(Call *c, int (*fast)(const Call *, const void *),
                       RefMap map, const void *arg) {
  if (rendezvous(c) < 0) return -1;
  int rc = 0;
  if (!c->g->reference) {
    rc = fast(c, arg);
  } else {
    Global gl;
    rc = global_gather(&gl, c, 0);
    if (rc == 0) {
      ref_fill(c, &gl, c->out[0], map, arg);
      global_free(&gl);
    }
  }
  leave(c);
  return rc;
}

static int fast_gather_v(const Call *c, const void *a) { return fast_gather(c, a); }

/* Semantics: jax.lax.all_gather (axis, tiled, axis_index_groups). */
int coll_kernel_all_gather(Array **in, int nin, const Params *p, Array **out) {
  Call c;
  GatherArgs a;
  (void)nin;
  if (call_init(&c, CK_ALL_GATHER, p, in, 1, out) < 0 ||
      gather_args(p, in[0]->ndim, &a, false) < 0 ||
      check_axis_size("all_gather", p, c.n) < 0)
    return -1;
  a.n = c.n;
  return move_kernel(&c, fast_gather_v, map_gather, &a);
}

uint32_t coll_vma_all_gather(const uint32_t *in, int nin, const Params *p) {
  return vma_remove(in, nin, p);
}

/* ---- psum_scatter (reduce_scatter) ---------------------------------------------- */

static int scatter_args(const Params *p, const AVal *in, GatherArgs *a) {
  const char *prim = "psum_scatter";
  if (param_bool(prim, p, "tiled", &a->tiled) < 0 ||
      param_dim(prim, p, "scatter_dimension", in->ndim, &a->dim) < 0 ||
      shape_axis_n(prim, p, &a->n) < 0)
    return -1;
  int64_t size = in->shape[a->dim];
  if (!a->tiled && size != a->n)
    return err_set(ERR_VALUE, "psum_scatter: scatter_dimension %d has size "
                   "%lld, which must equal the axis size %lld when "
                   "tiled=False", a->dim, (long long)size, (long long)a->n), -1;
  if (a->tiled && size % a->n != 0)
    return err_set(ERR_VALUE, "psum_scatter: scatter_dimension %d has size "
                   "%lld, which the axis size %lld does not divide", a->dim,
                   (long long)size, (long long)a->n), -1;
  return 0;
}

int coll_shape_psum_scatter(const AVal *in, int nin, const Params *p, AVal *out) {
  GatherArgs a;
  if (shape_same(in, nin, out) < 0 || scatter_args(p, &in[0], &a) < 0) return -1;
  if (a.tiled)
    out->shape[a.dim] /= a.n;
  else
    shape_delete(out, a.dim);
  return 0;
}

/* This device's block of participant q's operand. */
static void scatter_src(View *src, const Call *c, int q, const GatherArgs *a) {
  view_of(src, peer_in(c, q, 0));
  if (a->tiled) {
    int64_t b = src->shape[a->dim] / a->n;
    view_slice(src, a->dim, c->pos * b, b);
  } else {
    view_slice(src, a->dim, c->pos, 1);
    view_drop(src, a->dim);
  }
}

static int ref_scatter(const Call *c, const GatherArgs *a, const RedArg *r) {
  Global gl;
  if (global_gather(&gl, c, 0) < 0) return -1;
  Array *out = c->out[0];
  size_t es = dt_size(out->dtype);
  for (int64_t f = 0; f < out->size; f++) {
    int64_t idx[SHM_MAXDIM + 1];
    char *o = (char *)arr_data(out) + (size_t)f * es;
    unravel(f, out->ndim, out->shape, idx);
    if (a->tiled)
      idx[a->dim] += c->pos * (c->in[0]->shape[a->dim] / a->n);
    else
      idx_insert(idx, out->ndim, a->dim, c->pos);
    memcpy(o, global_at(&gl, 0, idx), es);
    for (int q = 1; q < c->n; q++) inner_reduce(o, global_at(&gl, q, idx), 1, 1, 1, r);
  }
  global_free(&gl);
  return 0;
}

static int fast_scatter(const Call *c, const GatherArgs *a, const RedArg *r) {
  View dst, src;
  view_of(&dst, c->out[0]);
  for (int q = 0; q < c->n; q++) {
    scatter_src(&src, c, q, a);
    if (q == 0)
      view_copy(&dst, &src);
    else
      view_each2(&dst, &src, inner_reduce, r);
  }
  return 0;
}

/* Semantics: jax.lax.psum_scatter (scatter_dimension, tiled, groups). */
int coll_kernel_psum_scatter(Array **in, int nin, const Params *p, Array **out) {
  Call c;
  GatherArgs a;
  AVal av;
  (void)nin;
  if (call_init(&c, CK_PSUM_SCATTER, p, in, 1, out) < 0) return -1;
  aval_from(in[0], &av);
  if (param_bool("psum_scatter", p, "tiled", &a.tiled) < 0 ||
      param_dim("psum_scatter", p, "scatter_dimension", av.ndim, &a.dim) < 0 ||
      check_axis_size("psum_scatter", p, c.n) < 0)
    return -1;
  a.n = c.n;
  if (rendezvous(&c) < 0) return -1;
  RedArg r = {in[0]->dtype, RED_SUM};
  int rc = c.g->reference ? ref_scatter(&c, &a, &r) : fast_scatter(&c, &a, &r);
  leave(&c);
  return rc;
}

uint32_t coll_vma_psum_scatter(const uint32_t *in, int nin, const Params *p) {
  return vma_add(in, nin, p);
}

/* ---- ppermute --------------------------------------------------------------------- */

int coll_shape_ppermute(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)p;
  return shape_same(in, nin, out);
}

/* Finds the source of position [me] in perm (pairs (src, dst) over an axis
 * of [size]); *src = -1 when none.  Errors: malformed pairs, indices out of
 * range, a source or a destination named twice. */
static int perm_source(const Params *p, int size, int me, int *src) {
  Value *perm = pget(p, "perm");
  size_t n, two;
  Value *const *pairs, *const *sd;
  if (!perm || !val_seq(perm, &n, &pairs))
    return err_set(ERR_TYPE, "ppermute: perm must be a tuple of (source, "
                   "destination) pairs"), -1;
  *src = -1;
  for (size_t i = 0; i < n; i++) {
    if (!val_seq(pairs[i], &two, &sd) || two != 2 || !is_intlike(sd[0]) ||
        !is_intlike(sd[1]))
      return err_set(ERR_TYPE, "ppermute: perm must be a tuple of (source, "
                     "destination) pairs of ints"), -1;
    int64_t s = elem_i64((Array *)sd[0], 0), d = elem_i64((Array *)sd[1], 0);
    if (s < 0 || s >= size || d < 0 || d >= size)
      return err_set(ERR_VALUE, "ppermute: pair (%lld, %lld) is out of range "
                     "for an axis of size %d", (long long)s, (long long)d,
                     size), -1;
    for (size_t j = 0; j < i; j++) {
      val_seq(pairs[j], &two, &sd);
      if (elem_i64((Array *)sd[0], 0) == s)
        return err_set(ERR_VALUE, "ppermute: source %lld appears twice in "
                       "perm", (long long)s), -1;
      if (elem_i64((Array *)sd[1], 0) == d)
        return err_set(ERR_VALUE, "ppermute: destination %lld appears twice "
                       "in perm", (long long)d), -1;
    }
    if (d == me) *src = (int)s;
  }
  return 0;
}

static int fast_permute(const Call *c, const void *arg) {
  int src = *(const int *)arg;
  Array *out = c->out[0];
  if (src < 0) {
    memset(arr_data(out), 0, (size_t)out->size * dt_size(out->dtype));
    return 0;
  }
  View d, s;
  view_of(&d, out);
  view_of(&s, peer_in(c, src, 0));
  view_copy(&d, &s);
  return 0;
}

static int map_permute(const Call *c, const void *arg, int64_t *idx) {
  (void)c, (void)idx;
  return *(const int *)arg;
}

/* Semantics: jax.lax.ppermute; positions that receive nothing get zeros. */
int coll_kernel_ppermute(Array **in, int nin, const Params *p, Array **out) {
  Call c;
  int src;
  (void)nin;
  if (call_init(&c, CK_PPERMUTE, p, in, 1, out) < 0 ||
      perm_source(p, c.n, c.pos, &src) < 0)
    return -1;
  return move_kernel(&c, fast_permute, map_permute, &src);
}

uint32_t coll_vma_ppermute(const uint32_t *in, int nin, const Params *p) {
  return vma_add(in, nin, p);
}

/* ---- all_to_all --------------------------------------------------------------------- */

typedef struct A2AArgs {
  int split, concat;
  bool tiled;
  int64_t n;
  int64_t b;                      /* tiled: split_axis / n */
  int64_t chunk_c;                /* tiled: a received chunk's size along concat */
} A2AArgs;

static int a2a_args(const Params *p, const AVal *in, int64_t n, A2AArgs *a) {
  const char *prim = "all_to_all";
  if (param_bool(prim, p, "tiled", &a->tiled) < 0 ||
      param_dim(prim, p, "split_axis", in->ndim, &a->split) < 0 ||
      param_dim(prim, p, "concat_axis", in->ndim, &a->concat) < 0)
    return -1;
  int64_t size = in->shape[a->split];
  a->n = n;
  if (!a->tiled && size != n)
    return err_set(ERR_VALUE, "all_to_all: split_axis %d has size %lld, which "
                   "must equal the axis size %lld when tiled=False", a->split,
                   (long long)size, (long long)n), -1;
  if (a->tiled && size % n != 0)
    return err_set(ERR_VALUE, "all_to_all: split_axis %d has size %lld, which "
                   "the axis size %lld does not divide", a->split,
                   (long long)size, (long long)n), -1;
  a->b = size / n;
  a->chunk_c = a->split == a->concat ? a->b : in->shape[a->concat];
  return 0;
}

int coll_shape_all_to_all(const AVal *in, int nin, const Params *p, AVal *out) {
  A2AArgs a;
  int64_t n;
  if (shape_same(in, nin, out) < 0 || shape_axis_n("all_to_all", p, &n) < 0 ||
      a2a_args(p, &in[0], n, &a) < 0)
    return -1;
  if (a.tiled) {
    out->shape[a.split] /= n;
    out->shape[a.concat] *= n;
  } else {
    shape_delete(out, a.split);
    shape_insert(out, a.concat, n);
  }
  return 0;
}

static int fast_a2a(const Call *c, const void *arg) {
  const A2AArgs *a = arg;
  for (int q = 0; q < c->n; q++) {
    View src, dst;
    view_of(&src, peer_in(c, q, 0));
    view_of(&dst, c->out[0]);
    if (a->tiled) {
      view_slice(&src, a->split, c->pos * a->b, a->b);
      view_slice(&dst, a->concat, q * a->chunk_c, a->chunk_c);
    } else {
      view_slice(&src, a->split, c->pos, 1);
      view_drop(&src, a->split);
      view_slice(&dst, a->concat, q, 1);
      view_drop(&dst, a->concat);
    }
    view_copy(&dst, &src);
  }
  return 0;
}

static int map_a2a(const Call *c, const void *arg, int64_t *idx) {
  const A2AArgs *a = arg;
  int q;
  if (a->tiled) {
    q = (int)(idx[a->concat] / a->chunk_c);
    idx[a->concat] %= a->chunk_c;
    idx[a->split] += c->pos * a->b;
  } else {
    q = (int)idx[a->concat];
    idx_delete(idx, c->out[0]->ndim, a->concat);
    idx_insert(idx, c->out[0]->ndim - 1, a->split, c->pos);
  }
  return q;
}

/* Semantics: jax.lax.all_to_all, tiled and not (not tiled: the split axis
 * must be n long; it is removed and a new n-long axis appears at
 * concat_axis, np.insert(np.delete(shape, split), concat, n)). */
int coll_kernel_all_to_all(Array **in, int nin, const Params *p, Array **out) {
  Call c;
  A2AArgs a;
  AVal av;
  (void)nin;
  if (call_init(&c, CK_ALL_TO_ALL, p, in, 1, out) < 0) return -1;
  aval_from(in[0], &av);
  if (a2a_args(p, &av, c.n, &a) < 0 || check_axis_size("all_to_all", p, c.n) < 0)
    return -1;
  return move_kernel(&c, fast_a2a, map_a2a, &a);
}

uint32_t coll_vma_all_to_all(const uint32_t *in, int nin, const Params *p) {
  return vma_add(in, nin, p);
}

/* ---- ragged_all_to_all ------------------------------------------------------------- */

enum { RA_OPERAND, RA_OUTPUT, RA_IN_OFF, RA_SEND, RA_OUT_OFF, RA_RECV };

int coll_shape_ragged_all_to_all(const AVal *in, int nin, const Params *p,
                                 AVal *out) {
  (void)p;
  const char *prim = "ragged_all_to_all";
  if (nin != 6) return err_set(ERR_TYPE, "%s takes 6 operands, got %d", prim, nin), -1;
  const AVal *op = &in[RA_OPERAND], *o = &in[RA_OUTPUT];
  if (op->ndim < 1 || op->ndim != o->ndim || op->dtype != o->dtype)
    return err_set(ERR_VALUE, "%s: operand and output must have the same "
                   "dtype and rank (at least 1)", prim), -1;
  for (int d = 1; d < op->ndim; d++)
    if (op->shape[d] != o->shape[d])
      return err_set(ERR_VALUE, "%s: operand and output must agree in every "
                     "dimension but the first", prim), -1;
  for (int k = RA_IN_OFF; k <= RA_RECV; k++)
    if (in[k].ndim != 1 || !dt_is_int(in[k].dtype) ||
        in[k].shape[0] != in[RA_IN_OFF].shape[0])
      return err_set(ERR_VALUE, "%s: input_offsets, send_sizes, output_offsets "
                     "and recv_sizes must be 1-D integer arrays of one length",
                     prim), -1;
  *out = *o;
  return 0;
}

/* One slice sent from participant qs to participant qd (their j-th). */
typedef struct RaggedSlice {
  int64_t in_off, size, out_off;
} RaggedSlice;

static RaggedSlice ragged_slice(const Call *c, int qs, int qd, int64_t spd,
                                int64_t j) {
  int64_t i = qd * spd + j;
  RaggedSlice s;
  s.in_off = elem_i64(peer_in(c, qs, RA_IN_OFF), i);
  s.size = elem_i64(peer_in(c, qs, RA_SEND), i);
  s.out_off = elem_i64(peer_in(c, qs, RA_OUT_OFF), i);
  return s;
}

/* Checks the slice qs -> qd #j: in bounds on both sides, sizes agreeing. */
static int ragged_check(const Call *c, int qs, int qd, int64_t spd, int64_t j) {
  RaggedSlice s = ragged_slice(c, qs, qd, spd, j);
  int64_t i = qd * spd + j, k = qs * spd + j;
  int64_t rows = peer_in(c, qs, RA_OPERAND)->shape[0];
  int64_t orows = peer_in(c, qd, RA_OUTPUT)->shape[0];
  int64_t recv = elem_i64(peer_in(c, qd, RA_RECV), k);
  char cs[128], cd[128];
  coords_of(c->g, c->peers[qs], cs, sizeof cs);
  coords_of(c->g, c->peers[qd], cd, sizeof cd);
  if (s.size < 0 || s.in_off < 0 || s.in_off > rows - s.size)
    return err_set(ERR_INDEX, "ragged_all_to_all: device %s: input_offsets[%lld] "
                   "= %lld with send_sizes[%lld] = %lld reads outside the "
                   "operand's %lld rows", cs, (long long)i, (long long)s.in_off,
                   (long long)i, (long long)s.size, (long long)rows), -1;
  if (recv != s.size)
    return err_set(ERR_VALUE, "ragged_all_to_all: device %s sends %lld rows to "
                   "device %s (send_sizes[%lld]), which expects recv_sizes[%lld] "
                   "= %lld", cs, (long long)s.size, cd, (long long)i,
                   (long long)k, (long long)recv), -1;
  if (s.out_off < 0 || s.out_off > orows - s.size)
    return err_set(ERR_INDEX, "ragged_all_to_all: device %s: output_offsets[%lld] "
                   "= %lld with send_sizes[%lld] = %lld writes outside the %lld "
                   "output rows of device %s", cs, (long long)i,
                   (long long)s.out_off, (long long)i, (long long)s.size,
                   (long long)orows, cd), -1;
  return 0;
}

/* Every participant checks every slice, in the same order, so all of them
 * reach the same verdict and fail together. */
static int ragged_validate(const Call *c, int64_t spd) {
  for (int qs = 0; qs < c->n; qs++)
    for (int qd = 0; qd < c->n; qd++)
      for (int64_t j = 0; j < spd; j++)
        if (ragged_check(c, qs, qd, spd, j) < 0) return -1;
  return 0;
}

/* Copies rows [s.in_off, +s.size) of [src] to rows [s.out_off, ...) of out. */
static void ragged_copy(Array *out, const Array *src, RaggedSlice s) {
  View d, v;
  view_of(&d, out);
  view_of(&v, src);
  view_slice(&d, 0, s.out_off, s.size);
  view_slice(&v, 0, s.in_off, s.size);
  view_copy(&d, &v);
}

static void fast_ragged(const Call *c, int64_t spd) {
  View d, v;
  view_of(&d, c->out[0]);
  view_of(&v, c->in[RA_OUTPUT]);
  view_copy(&d, &v);
  for (int qs = 0; qs < c->n; qs++)
    for (int64_t j = 0; j < spd; j++)
      ragged_copy(c->out[0], peer_in(c, qs, RA_OPERAND),
                  ragged_slice(c, qs, c->pos, spd, j));
}

/* Reference: the seed's pseudocode, element by element, from the gathered
 * operands: result = output, then result[off:off+size] = RECEIVE(...). */
static int ref_ragged(const Call *c, int64_t spd) {
  Global gl;
  if (global_gather(&gl, c, RA_OPERAND) < 0) return -1;
  Array *out = c->out[0];
  size_t es = dt_size(out->dtype);
  int64_t row = out->shape[0] ? out->size / out->shape[0] : 0;
  View d, v;
  view_of(&d, out);
  view_of(&v, c->in[RA_OUTPUT]);
  view_copy(&d, &v);
  for (int qs = 0; qs < c->n; qs++)
    for (int64_t j = 0; j < spd; j++) {
      RaggedSlice s = ragged_slice(c, qs, c->pos, spd, j);
      for (int64_t e = 0; e < s.size * row; e++) {
        int64_t idx[SHM_MAXDIM];
        unravel(s.in_off * row + e, gl.blockview.ndim, gl.blockview.shape, idx);
        memcpy((char *)arr_data(out) + (size_t)(s.out_off * row + e) * es,
               global_at(&gl, qs, idx), es);
      }
    }
  global_free(&gl);
  return 0;
}

/* Semantics: seed 002, ragged_all_to_all, exactly; with axis_index_groups
 * the slices per peer follow the group's size and order.  Offsets and
 * sizes reading or writing out of bounds, and send_sizes disagreeing with
 * the receiver's recv_sizes, are errors naming the device and index. */
int coll_kernel_ragged_all_to_all(Array **in, int nin, const Params *p,
                                  Array **out) {
  Call c;
  if (call_init(&c, CK_RAGGED, p, in, nin, out) < 0) return -1;
  int64_t k = in[RA_IN_OFF]->shape[0];
  if (k % c.n != 0)
    return err_set(ERR_VALUE, "ragged_all_to_all: the offset and size arrays "
                   "have length %lld, which the axis size %d does not divide",
                   (long long)k, c.n), -1;
  if (rendezvous(&c) < 0) return -1;
  int rc = ragged_validate(&c, k / c.n);
  if (rc == 0 && c.g->reference)
    rc = ref_ragged(&c, k / c.n);
  else if (rc == 0)
    fast_ragged(&c, k / c.n);
  leave(&c);
  return rc;
}

uint32_t coll_vma_ragged_all_to_all(const uint32_t *in, int nin, const Params *p) {
  return vma_add(in, nin, p);
}

/* ---- link-time default ------------------------------------------------------------- */

/* Until eval.c defines it, collectives report no line; eval.c's strong
 * definition replaces this weak one. */
__attribute__((weak)) Loc eval_current_loc(void) {
  Loc none = {NULL, 0, 0};
  return none;
}
