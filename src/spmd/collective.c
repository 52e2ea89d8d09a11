/*
 * collective.c - the collective engine (collective.h).
 *
 * Layout of this file: parameters and participants; the group and its
 * synchronisation (publish, wait, barrier, baton); strided views and the
 * reduction arithmetic; then each collective's shape rule, vma rule and
 * kernel, fast and reference.
 *
 * Locking.  One mutex per group, CollGroup.lock, guards every field marked
 * "guarded" below: the slots' descriptor runs, the exits, the baton and
 * the abort state.  It is held only for bookkeeping, never while data
 * moves, and a device takes it only to publish a descriptor that differs
 * from its previous one, to sleep, or when something fails.  The rest is
 * atomics: a slot's published, done and gave_up counters, its in_coll
 * flag and line, its descriptor generation, and the barrier counters.
 * Changes that can fail a waiter (a device leaving the body or giving up,
 * an abort) and the reference mode's baton go through bump(): epoch++,
 * a broadcast of CollGroup.cond and of every slot's condition variable.
 *
 * Waiting (fast mode).  A device polls atomics without the lock
 * (spin_until: pause instructions when devices <= cores, sched_yield
 * otherwise), then sleeps on a slot's condition variable with the lock: an
 * arriving device wakes only the sleepers of its own slot (those waiting
 * for it), the last device into a barrier only those of the leader's.
 * Every sleep is at most COLL_POLL_MS, so Ctrl-C is noticed.
 *
 * Cache lines.  What peers poll (a slot's published counter, with the
 * data of tiny lanes) shares a line with nothing the owner writes more
 * often, and what only the owner writes (its done counter, its arrays)
 * with nothing another device touches: a line moving between cores costs
 * more than the rest of a small collective.  They are kept a pair of
 * lines apart (SHM_LINE_PAIR): the prefetcher that fetches a polled line
 * brings its neighbour in the pair too, which the owner would then have
 * to take back before writing it (measured: ~70 ns per collective).
 *
 * Matching without the lock.  The arrival check with its exact messages
 * (cond_arrived) runs under the lock; once it has accepted a participant's
 * descriptor, the pair's descriptor generations are remembered
 * (Verified), and as long as neither device's descriptor changes, the
 * next arrivals are accepted from the atomics alone (arrived_verified):
 * a loop repeating one psum takes no lock.
 *
 * Memory ordering of data: operand and output pointers and lane contents
 * are written before a release store of the slot's published counter; a
 * peer reads them after loading that counter.  A lane reader finishes
 * the collective before it publishes the next one, so its published or
 * done counter, loaded by the lane's owner before rewriting the lane,
 * orders the reads before the rewrite.  Writes into peers' outputs and
 * reads of their operands happen before the writer's acq_rel add on the
 * final barrier's count;
 * the last arrival's release of the generation, acquired by the others,
 * orders them before anyone leaves (ThreadSanitizer checks this in the
 * unit test).
 */
#define _GNU_SOURCE  /* PTHREAD_MUTEX_ADAPTIVE_NP */
#include "spmd/collective.h"

#include "base/timeline.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "array/array.h"
#include "lang/eval.h"
#include "array/kernels.h"
#include "base/mem.h"
#include "spmd/transport.h"

#define COLL_HIST 8            /* runs of descriptors remembered per device */
#define COLL_MAX_IN 6          /* operands of a collective (ragged_all_to_all) */
#define COLL_PARAMS_CAP 256    /* canonical non-axis parameters */
#define COLL_SMALL_REDUCE 16384 /* elements x participants folded by each */
#define COLL_CHUNK_BYTES 16384 /* fold unit of the fast path: stays in L1
                                  while it is copied to every output */
#define COLL_PAUSE_NS 10000    /* devices <= cores: longest busy spin
                                  before sleeping, several times the
                                  interpreter's work between collectives */
#define COLL_PAUSE_MIN_NS 1000 /* shortest, when spins keep failing */
#define COLL_YIELD_NS 50000    /* devices > cores: yielding, before sleeping */
#define COLL_LANE_BYTES 512    /* reductions up to this size go through the
                                  slots' lanes, without a final barrier */
#define COLL_INLINE_BYTES 16   /* lanes up to this size live on the line
                                  peers poll: one transfer brings both */

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
  int line;                       /* source line of the call; 0 unknown */
  char params[COLL_PARAMS_CAP];   /* canonical parameters other than axes */
  /* the operands' avals, compared as numbers and formatted only for
   * messages (sig_str): */
  int nin, ndims;                 /* operands; entries of dims in use */
  signed char dtype[COLL_MAX_IN], ndim[COLL_MAX_IN];
  int64_t dims[COLL_MAX_IN * SHM_MAXDIM]; /* their shapes, one after another */
} CollDesc;

/* A run of equal descriptors: collectives #from, #from + 1, ... of a
 * device, up to the next run, all had descriptor d (its line: the first's). */
typedef struct DescRun {
  long from;
  CollDesc d;
} DescRun;

/* A slot's copy of a small reduction's operand (the lane of collectives
 * of one parity): peers fold from it after the arrival, so the owner may
 * leave without a final barrier.  It is written again two collectives
 * later, once every reader of #seq is done with it (lane_reusable). */
typedef struct Lane {
  long seq;                       /* collective it holds; -1 none */
  int n;                          /* its participants, */
  int *peers;                     /* [ndevices] their ranks */
  _Alignas(64) char data[COLL_LANE_BYTES];
} Lane;

/* What rank r last verified, under the lock, about participant p: p's
 * descriptor equalled r's while p's desc_gen was peer_gen and r's own
 * was own_gen.  While both generations stay, the descriptors still agree
 * and an arrival can be accepted without the lock (arrived_verified). */
typedef struct Verified {
  unsigned long peer_gen, own_gen;  /* 0: nothing verified (gens start at 1) */
} Verified;

/* A device's memo of its last collective's set-up: while a call's
 * parameters are the same values (param_same), its axes, participants
 * and canonical parameters are the ones worked out then, and a loop
 * repeating one collective skips the name lookups and text.  The memo
 * holds references to the values it compares with. */
typedef struct AxesMemo {
  Value *v;                       /* the axis-name value; NULL: empty */
  int naxes, axes[DEV_MAX_AXES];  /* what resolve_axes made of it */
  uint32_t mask;                  /* those axes' bits (coll_axes_mask) */
} AxesMemo;

typedef struct CallMemo {
  bool valid;
  int kind, np;                   /* CollKind; parameters */
  const char *names[PRIM_MAX_PARAMS];
  Value *vals[PRIM_MAX_PARAMS];   /* references */
  int naxes, axes[DEV_MAX_AXES];  /* the resolved axis names */
  int n, pos, axis_size;          /* participants (their ranks: Slot.peers) */
  bool cross;                     /* some of them on other processes */
  char params[COLL_PARAMS_CAP];   /* params_canon's text */
} CallMemo;

/* A device's exit record, sent to the other processes as it leaves the
 * body (coll_device_exit): peers waiting for it there fail instead of
 * waiting forever. */
typedef struct XExit {
  int rank, line, failed;
  long count;                     /* collectives it entered */
} XExit;

/* One device's state in the group. */
typedef struct Slot {
  DevCtx ctx;                     /* the device's context (written at creation) */
  int xproc;                      /* the process holding the device, and */
  bool xlocal;                    /* whether it is this one (written at
                                     creation: x_proc, x_local) */
  /* guarded by CollGroup.lock (the owner, their only writer, also reads
   * them without it): */
  bool exited, failed;            /* left the body (with an error) */
  int exit_line;
  DescRun runs[COLL_HIST];        /* the latest runs, run k at [k % COLL_HIST] */
  long nruns;                     /* runs started */
  /* written by the owner before its release of published; read by the
   * participants of that collective after acquiring it: */
  Array **in, **out;              /* operands and outputs of #published */
  Lane lane[2];                   /* lane of collective #s at [s % 2] */
  pthread_cond_t wake;            /* fast mode: peers waiting for this device's
                                     arrival, its done counter, or a barrier it
                                     leads, sleep here */
  /* atomics, read without the lock.  The line peers poll, written by
   * the owner once per collective (when it publishes) and not read by it
   * on the steady path: a peer's read may take the line away, and the
   * owner's next read would wait for it to come back. */
  _Alignas(SHM_LINE_PAIR) atomic_long published; /* number of the collective
                                     entered last (-1 none); stored (release)
                                     by the owner after everything above */
  atomic_long gave_up;            /* collective it left with an error, after
                                     publishing it (-1 none) */
  atomic_int line;                /* source line of #published */
  atomic_ulong desc_gen;          /* runs started, changed under the lock */
  _Alignas(16) char inline_lane[2][COLL_INLINE_BYTES]; /* data of the lanes
                                     of at most COLL_INLINE_BYTES */
  /* the owner's line, which peers read only off the steady path (a lane
   * writer that has not seen them arrive since, a check under the lock,
   * the debugger), so finishing a collective moves no line between cores: */
  _Alignas(SHM_LINE_PAIR) atomic_long done;  /* the last collective it completed */
  atomic_bool in_coll;            /* inside collective #published */
  atomic_int sleepers;            /* threads asleep on wake (changed under the
                                     lock; seq_cst: see barrier_release) */
  _Alignas(SHM_LINE_PAIR) atomic_uint bar_count; /* barrier of instances this device leads: */
  atomic_uint bar_gen;            /* arrivals, and instances completed */
  /* only the owner's thread touches these, and the arrays, in a block of
   * whole pairs of cache lines of its own (written at every collective,
   * they must not share a pair with another device's data): */
  _Alignas(SHM_LINE_PAIR) int64_t spin_ns;   /* its current spin (spin_until) */
  long seq;                       /* = published, the owner's copy */
  unsigned long gen;              /* = desc_gen, the owner's copy */
  void *own;                      /* the block (shm_pair_alloc) */
  Verified *verified;             /* [ndevices]: what it verified of each peer */
  long *known_done;               /* [ndevices]: lower bounds of the peers'
                                     done counters, as last seen */
  atomic_long *met;               /* [ndevices]: met[q], the number of the
                                     last collective it went through with q
                                     among the participants (q's proof that
                                     this device took part in q's collective
                                     #met[q] after the descriptor of it is
                                     no longer kept: check_peer) */
  int *peers;                     /* [ndevices]: its current call's participants */
  AxesMemo axes_memo;
  CallMemo memo;
  /* across processes (transport.h).  The local leader's (its first local
   * participant's) exchange, read by the call's other local participants
   * after the barrier that follows it: */
  Array **xin;                    /* [n * nin]: every participant's operands
                                     (local ones borrowed, remote ones owned) */
  int xn, xnin;                   /* its participants and operands */
  Array **xtab;                   /* [2 * xtab_cap], the leader's, kept from
                                     call to call (a small collective's time
                                     is mostly such overheads): the table xin
                                     points at (x_tab), then the proxies of
                                     its last call at the same places, which
                                     the next call reuses (x_proxy) */
  int xtab_cap;
  char *xhdr;                     /* the leader's last header (x_header), and */
  size_t xhdr_len;                /* its length, */
  unsigned long xhdr_gen;         /* the descriptor generation (gen) and */
  int xhdr_first, xhdr_nloc;      /* participants it was written for */
  struct XSeen *xseen;            /* [processes]: the headers it last accepted
                                     from each (x_header_known) */
  Array *xres;                    /* or the result every local participant
                                     takes (x_reduce, x_gather), owned when
                                     it is not the leader's output */
  const struct GatherArgs *xgather; /* x_gather: remote blocks go straight
                                     into xres, without proxies */
  int xrc;                        /* -1: the exchange failed with xkind, xmsg */
  ErrKind xkind;
  char xmsg[768];
  int *lpeers;                    /* [ndevices]: the current call's local participants */
  XExit xexit;                    /* its exit record, sent as it leaves the body */
  void **xreqs;                   /* [processes]: those sends */
  /* a remote device, from its exit record (guarded by the lock, like exited): */
  long xcount;                    /* collectives it entered */
} Slot;

_Static_assert(offsetof(Slot, inline_lane) + sizeof(((Slot *)0)->inline_lane) -
                   offsetof(Slot, published) <= 64,
               "a slot's polled line holds its small lanes");

struct CollGroup {
  MeshDesc mesh;                  /* copy; names and device_ids borrowed */
  bool reference;                 /* reference mode */
  bool spin;                      /* devices <= cores: spin before sleeping */
  pthread_mutex_t lock;           /* guards the fields marked guarded */
  pthread_cond_t cond;            /* broadcast by bump() */
  atomic_uint epoch;              /* bumped under lock; read by spinners */
  int baton;                      /* guarded: rank allowed to run (reference) */
  bool aborted;                   /* guarded */
  atomic_bool stopped;            /* = aborted, for the lock-free path */
  ErrKind abort_kind;             /* guarded */
  char abort_msg[512];            /* guarded */
  Slot *slots;                    /* [mesh.ndevices] */
  int parity;                     /* the call's number mod 2, in every tag of its
                                     messages between processes */
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
  bool cross;                     /* participants on other processes */
  Array **xin;                    /* then: every participant's operands */
  /* when the timeline or the communication counts record (timeline.h): */
  int64_t t0, wait0, wait1;       /* entry; the wait for the peers (tl_now) */
  int waited_for;                 /* first peer missing when it began, or -1 */
} Call;

/* ---- parameters ---------------------------------------------------------- */

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
  Value *v = params_get(p, name);
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

/* A bounded text under construction.  Appends truncate as snprintf
 * would (the text stays NUL-terminated within cap) but parse no format:
 * every collective call builds its descriptor, and printf was most of a
 * small psum's cost. */
typedef struct Text {
  char *s;
  size_t cap, len;                /* len < cap once begun */
} Text;

static Text text_begin(char *buf, size_t cap) {
  buf[0] = 0;
  return (Text){buf, cap, 0};
}

static void text_puts(Text *t, const char *str) {
  size_t n = strlen(str), room = t->cap - 1 - t->len;
  if (n > room) n = room;
  memcpy(t->s + t->len, str, n);
  t->len += n;
  t->s[t->len] = 0;
}

static void text_int(Text *t, int64_t x) {
  char digits[24], *d = digits + sizeof digits;
  uint64_t u = x < 0 ? -(uint64_t)x : (uint64_t)x;
  *--d = 0;
  do *--d = (char)('0' + u % 10); while (u /= 10);
  if (x < 0) *--d = '-';
  text_puts(t, d);
}

static bool text_full(const Text *t) { return t->len + 1 >= t->cap; }

/* Appends the repr of a parameter value (ints, bools, strings, None and
 * tuples of them). */
static void repr_value(Text *t, Value *v) {
  if (!v || v == VAL_NONE) {
    text_puts(t, "None");
  } else if (v->type == V_STR) {
    text_puts(t, "'");
    text_puts(t, str_cstr(v));
    text_puts(t, "'");
  } else if (is_intlike(v) && ((Array *)v)->dtype == DT_BOOL) {
    text_puts(t, elem_i64((Array *)v, 0) ? "True" : "False");
  } else if (is_intlike(v)) {
    text_int(t, elem_i64((Array *)v, 0));
  } else if (v->type == V_TUPLE || v->type == V_LIST) {
    size_t n;
    Value *const *items;
    val_seq(v, &n, &items);
    text_puts(t, "(");
    for (size_t i = 0; i < n && !text_full(t); i++) {
      if (i) text_puts(t, ", ");
      repr_value(t, items[i]);
    }
    text_puts(t, n == 1 ? ",)" : ")");
  } else {
    text_puts(t, "<");
    text_puts(t, val_type_name(v));
    text_puts(t, ">");
  }
}

/* The canonical string of every parameter but the axis names. */
static void params_canon(const Params *p, char *buf, size_t cap) {
  Text t = text_begin(buf, cap);
  for (int i = 0; p && i < p->n && !text_full(&t); i++) {
    const char *name = p->p[i].name;
    if (strcmp(name, "axes") == 0 || strcmp(name, "axis_name") == 0) continue;
    if (t.len) text_puts(&t, " ");
    text_puts(&t, name);
    text_puts(&t, "=");
    repr_value(&t, p->p[i].value);
  }
}

/* Records the avals of operands [in] (nin <= COLL_MAX_IN) in [d]. */
static void sig_of(Array **in, int nin, CollDesc *d) {
  d->nin = nin;
  d->ndims = 0;
  for (int i = 0; i < nin; i++) {
    d->dtype[i] = (signed char)in[i]->dtype;
    d->ndim[i] = (signed char)in[i]->ndim;
    memcpy(d->dims + d->ndims, in[i]->shape, sizeof(int64_t) * (size_t)in[i]->ndim);
    d->ndims += in[i]->ndim;
  }
}

/* Element by element, not memcmp: the arrays are a few entries long and
 * every collective compares descriptors twice across processes (its run,
 * the peers' headers), where a call to memcmp costs more than the loop. */
static bool sig_equal(const CollDesc *a, const CollDesc *b) {
  if (a->nin != b->nin || a->ndims != b->ndims) return false;
  for (int i = 0; i < a->nin; i++)
    if (a->dtype[i] != b->dtype[i] || a->ndim[i] != b->ndim[i]) return false;
  for (int i = 0; i < a->ndims; i++)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

/* The operand avals of [d], "f32[4,8], i32[2]" (array.h's aval_str form). */
static void sig_str(const CollDesc *d, char *buf, size_t cap) {
  Text t = text_begin(buf, cap);
  const int64_t *dim = d->dims;
  for (int i = 0; i < d->nin && !text_full(&t); i++) {
    if (i) text_puts(&t, ", ");
    text_puts(&t, dt_short((DType)d->dtype[i]));
    text_puts(&t, "[");
    for (int k = 0; k < d->ndim[i]; k++) {
      if (k) text_puts(&t, ",");
      text_int(&t, *dim++);
    }
    text_puts(&t, "]");
  }
}

/* ---- axes and participants ------------------------------------------------- */

/* The axis-name parameter: `axes` for the reductions, `axis_name` otherwise.
 * One look for either literal's address first, as params_get does for one. */
static Value *axis_param(const Params *p) {
  static const char *const axis_name = "axis_name", *const axes = "axes";
  for (int i = 0; i < p->n; i++)
    if (p->p[i].name == axis_name || p->p[i].name == axes) return p->p[i].value;
  Value *v = params_get(p, axis_name);
  return v ? v : params_get(p, axes);
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
  Value *v = params_get(p, "axis_index_groups");
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

/* ---- the memo of the last set-up ------------------------------------------- */

/* Whether parameter values [a] and [b] are the same for a collective: one
 * value, or equal strings, equal tuples of such, or numbers of one dtype
 * and value (not 1 and True: their canonical texts differ). */
static bool param_same(const Value *a, const Value *b) {
  if (a == b) return true;
  if (a->type != b->type) return false;
  switch ((VType)a->type) {
  case V_STR:
    return ((const Str *)a)->len == ((const Str *)b)->len &&
           memcmp(str_cstr(a), str_cstr(b), ((const Str *)a)->len) == 0;
  case V_TUPLE:
    if (tuple_len(a) != tuple_len(b)) return false;
    for (size_t i = 0; i < tuple_len(a); i++)
      if (!param_same(tuple_get(a, i), tuple_get(b, i))) return false;
    return true;
  case V_ARRAY: {
    const Array *x = (const Array *)a, *y = (const Array *)b;
    return x->ndim == 0 && y->ndim == 0 && x->dtype == y->dtype &&
           memcmp(arr_data(x), arr_data(y), dt_size(x->dtype)) == 0;
  }
  default:
    return false;
  }
}

/* Whether axis names [v] are those memo [am] resolved last.  Another
 * value of the same names (another statement's) replaces the memo's, so
 * the next call of that statement compares one pointer. */
static bool axes_memo_hit(AxesMemo *am, Value *v) {
  if (!v || !am->v) return false;
  if (v == am->v) return true;
  if (!param_same(v, am->v)) return false;
  val_decref(am->v);
  am->v = val_incref(v);
  return true;
}

/* resolve_axes, remembered in the owner's slot [s] for the last value. */
static int memo_axes(Slot *s, const char *prim, const MeshDesc *m, const Params *p,
                     int *axes, int *naxes) {
  AxesMemo *am = &s->axes_memo;
  Value *v = axis_param(p);
  if (axes_memo_hit(am, v)) {
    memcpy(axes, am->axes, sizeof(int) * (size_t)am->naxes);
    *naxes = am->naxes;
    return 0;
  }
  if (resolve_axes(prim, m, p, axes, naxes) < 0) return -1;
  val_decref(am->v);
  am->v = val_incref(v);
  am->naxes = *naxes;
  memcpy(am->axes, axes, sizeof(int) * (size_t)*naxes);
  am->mask = 0;
  for (int k = 0; k < *naxes; k++) am->mask |= 1u << axes[k];
  return 0;
}

/* resolve_axes against the current mesh [ctx], through the device's memo
 * when that mesh is its group's. */
static int ctx_axes(const DevCtx *ctx, const char *prim, const Params *p,
                    int *axes, int *naxes) {
  if (ctx->group && ctx->mesh == &ctx->group->mesh)
    return memo_axes(&ctx->group->slots[ctx->rank], prim, ctx->mesh, p, axes, naxes);
  return resolve_axes(prim, ctx->mesh, p, axes, naxes);
}

static void memo_clear(CallMemo *m) {
  for (int i = 0; m->valid && i < m->np; i++) val_decref(m->vals[i]);
  m->valid = false;
}

/* Whether the set-up of a call of [kind] with [p] is the memo's.  Values
 * equal to the memo's but not the same (another statement's) replace
 * them, so the next call of that statement compares pointers. */
static bool memo_hit(CallMemo *m, int kind, const Params *p) {
  if (!m->valid || m->kind != kind || m->np != p->n) return false;
  for (int i = 0; i < p->n; i++)
    if ((m->names[i] != p->p[i].name && strcmp(m->names[i], p->p[i].name) != 0) ||
        !param_same(m->vals[i], p->p[i].value))
      return false;
  for (int i = 0; i < p->n; i++)
    if (m->vals[i] != p->p[i].value) {
      val_decref(m->vals[i]);
      m->vals[i] = val_incref(p->p[i].value);
    }
  return true;
}

/* Remembers [c]'s set-up (its participants are in the slot's peers). */
static void memo_fill(CallMemo *m, int kind, const Params *p, const Call *c) {
  m->kind = kind;
  m->np = p->n;
  for (int i = 0; i < p->n; i++) {
    m->names[i] = p->p[i].name;
    m->vals[i] = val_incref(p->p[i].value);
  }
  m->naxes = c->desc.naxes;
  memcpy(m->axes, c->desc.axes, sizeof m->axes);
  m->n = c->n;
  m->pos = c->pos;
  m->axis_size = c->axis_size;
  m->cross = c->cross;
  memcpy(m->params, c->desc.params, sizeof m->params);
  m->valid = true;
}

/* Drops slot [s]'s memos and their references. */
static void memo_free(Slot *s) {
  memo_clear(&s->memo);
  val_decref(s->axes_memo.v);
  s->axes_memo.v = NULL;
}

/* ---- the group ----------------------------------------------------------- */

static int ncores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

/* The group's mutex.  When devices have cores of their own, it spins a
 * little before sleeping (glibc's adaptive mutex): it is held for a few
 * hundred nanoseconds at a time, far less than a futex sleep and wake. */
static void init_lock(pthread_mutex_t *m, bool spin) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
  if (spin) pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
#else
  (void)spin;
#endif
  pthread_mutex_init(m, &a);
  pthread_mutexattr_destroy(&a);
}

/* Allocates slot [s]'s arrays for calls across processes: 0, or -1. */
static int x_alloc(Slot *s, int n) {
  if (!transport_active()) return 0;
  s->lpeers = shm_calloc((size_t)n, sizeof(int));
  s->xreqs = shm_calloc((size_t)transport_procs(), sizeof(void *));
  return s->lpeers && s->xreqs ? 0 : -1;
}

/* Zeroed slots for [n] devices, on boundaries of a pair of cache lines,
 * as the alignment of their members requires (calloc gives only 16). */
static Slot *slots_alloc(int n) { return shm_pair_alloc((size_t)n * sizeof(Slot)); }

/* Allocates slot [s]'s own arrays for [n] devices, zeroed: 0, or -1. */
static int own_alloc(Slot *s, int n) {
  size_t un = (size_t)n;
  char *b = s->own = shm_pair_alloc(un * (sizeof(Verified) + 2 * sizeof(long) + sizeof(int) * 3));
  if (!b) return -1;
  s->verified = (Verified *)b;
  s->known_done = (long *)(b + un * sizeof(Verified));
  s->met = (atomic_long *)(b + un * (sizeof(Verified) + sizeof(long)));
  s->peers = (int *)(b + un * (sizeof(Verified) + 2 * sizeof(long)));
  for (int k = 0; k < 2; k++) s->lane[k].peers = s->peers + un * (size_t)(k + 1);
  return 0;
}

CollGroup *coll_group_new(const MeshDesc *mesh, bool reference) {
  int n = mesh->ndevices;
  if (n < 1 || mesh->naxes > DEV_MAX_AXES)
    return err_set(ERR_VALUE, "bad mesh: %d devices, %d axes", n, mesh->naxes);
  CollGroup *g = shm_calloc(1, sizeof *g);
  if (!g) return err_nomem();
  g->mesh = *mesh;
  g->slots = slots_alloc(n);
  bool ok = g->slots != NULL;
  for (int r = 0; ok && r < n; r++) ok = own_alloc(&g->slots[r], n) == 0 && x_alloc(&g->slots[r], n) == 0;
  if (!ok) {
    coll_group_free(g);
    return err_nomem();
  }
  static int calls;   /* every process makes the same calls, so counts alike */
  g->parity = calls++ & 1;
  g->reference = reference;
  g->spin = !reference && n <= ncores();
  init_lock(&g->lock, g->spin);
  pthread_cond_init(&g->cond, NULL);
  atomic_init(&g->epoch, 0);
  for (int r = 0; r < n; r++) {
    Slot *s = &g->slots[r];
    atomic_init(&s->published, -1);
    s->seq = -1;
    atomic_init(&s->done, -1);
    atomic_init(&s->gave_up, -1);
    for (int p = 0; p < n; p++) {
      s->known_done[p] = -1;
      atomic_init(&s->met[p], -1);
    }
    for (int k = 0; k < 2; k++) s->lane[k].seq = -1;
    s->spin_ns = COLL_PAUSE_NS;
    pthread_cond_init(&s->wake, NULL);
    s->ctx = (DevCtx){.mesh = &g->mesh, .rank = r, .group = g,
                      .reference = reference};
    s->xproc = transport_process_of(mesh->device_ids ? mesh->device_ids[r] : r);
    s->xlocal = s->xproc == transport_rank();
    dev_mesh_coords(&g->mesh, r, s->ctx.coords);
  }
  return g;
}

static void x_tab_free(Slot *s);
static void x_seen_free(Slot *s);

void coll_group_free(CollGroup *g) {
  if (!g) return;
  if (g->slots) {
    pthread_mutex_destroy(&g->lock);
    pthread_cond_destroy(&g->cond);
    for (int r = 0; r < g->mesh.ndevices; r++)
      pthread_cond_destroy(&g->slots[r].wake);
  }
  if (g->slots) {
    for (int r = 0; r < g->mesh.ndevices; r++) {
      memo_free(&g->slots[r]);
      shm_free(g->slots[r].own);
      x_tab_free(&g->slots[r]);
      shm_free(g->slots[r].xhdr);
      x_seen_free(&g->slots[r]);
      shm_free(g->slots[r].lpeers);
      shm_free(g->slots[r].xreqs);
    }
    shm_free(g->slots);
  }
  shm_free(g);
}

/* Wakes the fast-mode sleepers on slot [s], taking the lock unless
 * [locked] says the caller holds it.  The caller has just changed what
 * they wait for, with a seq_cst store or a store and a seq_cst fence (or
 * under the lock); the sleepers load is seq_cst too, as are a sleeper's
 * increment and its re-check under the lock, so either the sleeper sees
 * the change or this sees the sleeper and broadcasts after it waits. */
static void wake_slot(CollGroup *g, Slot *s, bool locked) {
  if (atomic_load(&s->sleepers) == 0) return;
  if (!locked) pthread_mutex_lock(&g->lock);
  pthread_cond_broadcast(&s->wake);
  if (!locked) pthread_mutex_unlock(&g->lock);
}

/* Announces a change of guarded state (lock held): spinners see the
 * epoch move, every sleeper wakes and re-checks.  Publishing an arrival
 * wakes only the waiters of its own slot (publish); everything else
 * (leaving the body, giving up, an abort, the baton) comes here. */
static void bump(CollGroup *g) {
  atomic_fetch_add_explicit(&g->epoch, 1, memory_order_release);
  pthread_cond_broadcast(&g->cond);
  if (!g->reference)
    for (int r = 0; r < g->mesh.ndevices; r++) wake_slot(g, &g->slots[r], true);
}

static inline void cpu_pause(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Ctrl-C (base/error.h); a sleeping waiter looks at it every COLL_POLL_MS. */
#define COLL_POLL_MS 100

static bool interrupted(void) { return shm_interrupt_pending(); }

/* Whether the group is stopping (an abort or Ctrl-C): a device that sees
 * it takes the locked path, where giving up is decided. */
static bool halting(CollGroup *g) {
  return atomic_load(&g->stopped) || interrupted();
}

/* Waits on [cv] with the group's lock, for at most COLL_POLL_MS, so a
 * Ctrl-C is noticed even when nobody signals. */
static void timed_wait(CollGroup *g, pthread_cond_t *cv) {
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_nsec += COLL_POLL_MS * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  pthread_cond_timedwait(cv, &g->lock, &until);
}

/* Reference mode's sleep (lock held on entry and exit): until a bump()
 * or COLL_POLL_MS.  One device runs at a time there, so nothing spins. */
static void sleep_once(CollGroup *g) {
  timed_wait(g, &g->cond);
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
  if (a->kind != b->kind || a->naxes != b->naxes) return false;
  for (int i = 0; i < a->naxes; i++)
    if (a->axes[i] != b->axes[i]) return false;
  return sig_equal(a, b) && strcmp(a->params, b->params) == 0;
}

/* "psum over 'i' of f32[4] at line 7"; with [with_params] (when only the
 * parameters differ) "all_gather[tiled=True ...] over ...". */
static void desc_str(const CollGroup *g, const CollDesc *d, bool with_params,
                     char *buf, size_t cap) {
  char axes[128], line[32] = "", sig[512];
  axes_str(&g->mesh, d, axes, sizeof axes);
  sig_str(d, sig, sizeof sig);
  if (d->line > 0) snprintf(line, sizeof line, " at line %d", d->line);
  snprintf(buf, cap, "%s%s%s%s over %s of %s%s", kind_names[d->kind],
           with_params ? "[" : "", with_params ? d->params : "",
           with_params ? "]" : "", axes, sig, line);
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
                sig_equal(da, db);
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

/* The descriptor of collective #seq of slot [s] (lock held), or NULL when
 * it is older than the runs kept.  The line is the call's own when #seq
 * is the slot's current collective. */
static const CollDesc *desc_at(const Slot *s, long seq, CollDesc *buf) {
  for (long k = s->nruns - 1; k >= 0 && k >= s->nruns - COLL_HIST; k--) {
    const DescRun *run = &s->runs[k % COLL_HIST];
    if (run->from > seq) continue;
    *buf = run->d;
    if (seq == atomic_load(&s->published)) buf->line = atomic_load(&s->line);
    return buf;
  }
  return NULL;
}

/* The error of a caller whose participant [p] went past its collective
 * #seq without the caller, and whose descriptor of it is no longer kept. */
static int passed_error(CollGroup *g, const Call *c, int p) {
  char cp[128], cm[128], what[1024];
  desc_str(g, &c->desc, false, what, sizeof what);
  return err_set(ERR_COLLECTIVE, "collective mismatch: device %s reached %s, device %s "
                 "went past its collective number %ld without device %s",
                 coords_of(g, c->rank, cm, sizeof cm), what, coords_of(g, p, cp, sizeof cp),
                 c->seq, cm), -1;
}

/* Checks participant [p] against the caller's collective: 1 arrived and
 * agreeing (or already through it with the caller among its participants,
 * so it checked the caller then), 0 not yet, -1 error set, -2 it gave up
 * with an error (an echo: the caller first looks for a cause among the
 * other participants).  Missing evidence is never agreement: when p's
 * descriptor of #seq is no longer kept, only p's record that it went
 * through #seq with the caller (met) says they agreed. */
static int check_peer(CollGroup *g, const Call *c, int p) {
  const Slot *s = &g->slots[p];
  long pub = atomic_load(&s->published);
  if (pub >= c->seq) {
    CollDesc buf;
    const CollDesc *d = desc_at(s, c->seq, &buf);
    if (d && !desc_equal(d, &c->desc))
      return mismatch_error(g, c->rank, &c->desc, p, d);
    if (!d && atomic_load(&s->met[c->rank]) != c->seq) return passed_error(g, c, p);
    return pub > c->seq || atomic_load(&s->gave_up) != c->seq ? 1 : -2;
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

/* Whether the caller's descriptor continues its current run, so that
 * publishing needs no lock (the owner reads its own runs). */
static bool same_run(const Call *c) {
  const Slot *s = &c->g->slots[c->rank];
  return s->nruns > 0 && desc_equal(&s->runs[(s->nruns - 1) % COLL_HIST].d, &c->desc);
}

/* Publishes the caller's buffers and arrival; with [locked] (lock held)
 * also a descriptor that starts a new run, and wakes the waiters of this
 * device's slot: they are the ones an arrival can satisfy (a peer waits
 * on the first participant still missing).  The release store of
 * published orders everything before it for peers that acquire it.
 * Without the lock, the caller wakes them with announce(), later. */
static void publish(Call *c, bool locked) {
  Slot *s = &c->g->slots[c->rank];
  if (locked && !same_run(c)) {
    s->runs[s->nruns % COLL_HIST] = (DescRun){c->seq, c->desc};
    s->nruns++;
    atomic_store_explicit(&s->desc_gen, ++s->gen, memory_order_relaxed);
  }
  s->in = c->in;
  s->out = c->out;
  atomic_store_explicit(&s->line, c->desc.line, memory_order_relaxed);
  atomic_store_explicit(&s->in_coll, true, memory_order_relaxed);
  s->seq = c->seq;
  atomic_store_explicit(&s->published, c->seq, memory_order_release);
  if (c->g->reference)
    bump(c->g);
  else if (locked)
    wake_slot(c->g, s, true);
}

/* After a publish without the lock: the seq_cst fence orders the store of
 * published before the loads that follow (the sleepers count here, the
 * stop flags in rendezvous), as wake_slot and rendezvous require, then
 * wakes the slot's waiters.  Deferred until the caller has looked at its
 * peers: the fence waits for the published line to come back from the
 * peers polling it, and meanwhile the peers' lines can be on their way. */
static void announce(Call *c) {
  atomic_thread_fence(memory_order_seq_cst);
  wake_slot(c->g, &c->g->slots[c->rank], false);
}

/* Nanoseconds of a monotonic clock. */
static int64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Polls (lock not held) until done(arg) or the epoch moves from [e];
 * true when done, false after the poll's time limit.  With a core per
 * device it spins with a pause instruction: a hand-off costs ~0.04 µs
 * there.  The spin's length adapts per device between COLL_PAUSE_MIN_NS
 * and COLL_PAUSE_NS: doubled after a spin that succeeded, halved after one
 * that ran out, so when other programs take the cores (the awaited device
 * is not running) a device soon sleeps at once instead of burning the
 * time slice the scheduler would otherwise give it on wake-up.  With more
 * devices than cores it yields the core at every turn for COLL_YIELD_NS
 * instead, so an awaited device that is runnable gets it (a yield costs
 * ~1 µs, waking a sleeper ~20 µs) and waiters do not spin each other
 * out.  Then the caller sleeps.  [self] is the caller's slot. */
static bool spin_until(CollGroup *g, Slot *self, bool (*done)(void *),
                       void *arg, unsigned e) {
  int64_t start = 0, limit = g->spin ? self->spin_ns : COLL_YIELD_NS;
  for (unsigned i = 0;; i++) {
    if (done(arg)) {
      if (g->spin && self->spin_ns < COLL_PAUSE_NS) self->spin_ns *= 2;
      return true;
    }
    if (i == 0) start = now_ns();  /* after the first look: often it is done */
    if (atomic_load_explicit(&g->epoch, memory_order_acquire) != e) return false;
    if ((!g->spin || i % 64 == 0) && now_ns() - start > limit) {
      if (g->spin && self->spin_ns > COLL_PAUSE_MIN_NS) self->spin_ns /= 2;
      return false;
    }
    if (g->spin)
      cpu_pause();
    else
      sched_yield();
  }
}

/* Whether every participant of [arg] (a Call) has published its
 * collective #seq or gone further (the check under the lock decides). */
static bool all_published(void *arg) {
  const Call *c = arg;
  for (int i = 0; i < c->n; i++)
    if (i != c->pos && atomic_load_explicit(&c->g->slots[c->peers[i]].published,
                                            memory_order_acquire) < c->seq)
      return false;
  return true;
}

/* Records, after cond_arrived said yes (lock held), that every
 * participant's descriptor equals the caller's at the current generations. */
static void record_verified(const Call *c) {
  const CollGroup *g = c->g;
  Verified *row = g->slots[c->rank].verified;
  unsigned long own = g->slots[c->rank].gen;
  for (int i = 0; i < c->n; i++) {
    int p = c->peers[i];
    row[p].peer_gen = atomic_load_explicit(&g->slots[p].desc_gen,
                                           memory_order_relaxed);
    row[p].own_gen = own;
  }
}

/* Whether every participant has published collective #seq (is in it or
 * through it) and has a descriptor generation verified against the
 * caller's current one: then cond_arrived would say yes (descriptors
 * equal, nobody gone), and the lock is not needed.  The acquire load of
 * published orders the reads of the peer's generation and buffers after
 * its publish; a peer cannot publish again before this device is through
 * #seq (the final barrier, or for a lane the peer's wait in
 * lane_reusable), so what is read stays that of #seq.  A peer already
 * further on has a later generation and is left to check_peer. */
static bool arrived_verified(void *arg) {
  const Call *c = arg;
  const CollGroup *g = c->g;
  const Verified *row = g->slots[c->rank].verified;
  unsigned long own = g->slots[c->rank].gen;
  for (int i = 0; i < c->n; i++) {
    if (i == c->pos) continue;  /* the caller: published, verified */
    const Slot *s = &g->slots[c->peers[i]];
    const Verified *v = &row[c->peers[i]];
    if (atomic_load_explicit(&s->published, memory_order_acquire) != c->seq ||
        v->own_gen != own ||
        atomic_load_explicit(&s->desc_gen, memory_order_relaxed) != v->peer_gen)
      return false;
    if (atomic_load_explicit(&s->gave_up, memory_order_relaxed) == c->seq)
      return false;
  }
  return true;
}

/* The first participant that has not published collective #seq (lock
 * held); the caller itself when none (never, while cond_arrived is 0). */
static int first_missing(const Call *c) {
  for (int i = 0; i < c->n; i++)
    if (atomic_load(&c->g->slots[c->peers[i]].published) < c->seq) return c->peers[i];
  return c->rank;
}

/* Fast mode's arrival wait (lock held on entry and exit): cond_arrived
 * decides, under the lock, with the exact checks and messages; between
 * checks the device spins on the peers' published counters (lock not
 * held) or sleeps on the slot of the first participant still missing, so
 * an arrival wakes only the devices it can let go.  Everything that can
 * fail a waiter other than an arrival (a peer leaving or giving up, an
 * abort) goes through bump(), which wakes every slot. */
static int wait_arrived(Call *c, bool spun) {
  CollGroup *g = c->g;
  for (;;) {
    int r = cond_arrived(g, c->rank, c);
    if (r == 1) record_verified(c);
    if (r != 0) return r;
    unsigned e = atomic_load_explicit(&g->epoch, memory_order_acquire);
    if (!spun) {
      pthread_mutex_unlock(&g->lock);
      spin_until(g, &g->slots[c->rank], all_published, c, e);
      pthread_mutex_lock(&g->lock);
      spun = true;
      continue;
    }
    Slot *s = &g->slots[first_missing(c)];
    atomic_fetch_add(&s->sleepers, 1);
    if (atomic_load(&g->epoch) == e && atomic_load(&s->published) < c->seq)
      timed_wait(g, &s->wake);
    atomic_fetch_sub(&s->sleepers, 1);
    spun = false;
  }
}

/* Remembers, once every participant has published collective #seq, that
 * each is done with #seq - 1 (a device finishes a collective before it
 * enters the next): the lane written next then need not load their done
 * counters, a cache line the peer has just written. */
static void note_arrivals(const Call *c) {
  Slot *me = &c->g->slots[c->rank];
  for (int i = 0; i < c->n; i++) {
    int q = c->peers[i];
    if (me->known_done[q] < c->seq - 1) me->known_done[q] = c->seq - 1;
    /* before this device publishes again: a peer reading a later
     * published (acquire) then sees it (check_peer) */
    atomic_store_explicit(&me->met[q], c->seq, memory_order_relaxed);
  }
}

/* Waits until all participants arrived; on failure leaves the collective.
 * A device whose descriptor continues its run publishes without the lock
 * (unless the group is stopping: the locked path reports that), so a loop
 * repeating one collective meets on the atomics alone.  It looks at the
 * stop flags again after publishing (and announce's fence): a peer gives
 * up (under the lock)
 * only when stopping and after not seeing this device's arrival, so this
 * device either sees the stop or is seen; otherwise it could see the
 * peer arrived but not yet given up, and wait for it at a barrier. */
static int rendezvous_(Call *c);

/* The rendezvous, timed for the timeline: how long this device waited,
 * and for whom (the first participant that had not arrived yet). */
static int rendezvous(Call *c) {
  if (!tl_tracing() && !tl_counting()) return rendezvous_(c);
  c->wait0 = tl_now();
  c->waited_for = -1;
  for (int i = 0; i < c->n && c->waited_for < 0; i++) {
    int q = c->peers[i];
    if (q != c->rank && atomic_load(&c->g->slots[q].published) < c->seq) c->waited_for = q;
  }
  int r = rendezvous_(c);
  c->wait1 = tl_now();
  return r;
}

static int rendezvous_(Call *c) {
  CollGroup *g = c->g;
  Slot *me = &g->slots[c->rank];
  bool unlocked = !g->reference && !halting(g) && same_run(c);
  if (unlocked) {
    publish(c, false);
  } else {
    pthread_mutex_lock(&g->lock);
    if (abort_error(g) < 0) {
      pthread_mutex_unlock(&g->lock);
      return -1;
    }
    publish(c, true);
    pthread_mutex_unlock(&g->lock);
  }
  if (c->n == 1) {
    if (unlocked) announce(c);
    return 0;
  }
  int r;
  if (g->reference) {
    pthread_mutex_lock(&g->lock);
    r = wait_for(g, c->rank, cond_arrived, c);
  } else {
    unsigned e = atomic_load_explicit(&g->epoch, memory_order_acquire);
    bool all = spin_until(g, me, all_published, c, e);
    if (unlocked) announce(c);
    if (all && !halting(g) && arrived_verified(c)) {
      note_arrivals(c);
      return 0;
    }
    pthread_mutex_lock(&g->lock);
    r = wait_arrived(c, true);
  }
  if (r == 1) note_arrivals(c);
  if (r < 0) {
    atomic_store(&me->gave_up, c->seq);
    atomic_store(&me->in_coll, false);
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
  return atomic_load_explicit(&b->leader->bar_gen, memory_order_acquire) != b->gen;
}

static bool generation_moved(void *arg) {
  return cond_generation(NULL, 0, arg) != 0;
}

/* Reference mode's barrier: counted under the lock, the baton passed on
 * while waiting. */
static bool barrier_locked(Call *c, BarrierArg *b) {
  CollGroup *g = c->g;
  pthread_mutex_lock(&g->lock);
  b->gen = atomic_load(&b->leader->bar_gen);
  bool last = atomic_fetch_add(&b->leader->bar_count, 1) + 1 == (unsigned)c->n;
  if (last) {
    atomic_store(&b->leader->bar_count, 0);
    atomic_fetch_add(&b->leader->bar_gen, 1);
    bump(g);
  }
  wait_for(g, c->rank, cond_generation, b);
  pthread_mutex_unlock(&g->lock);
  return last;
}

/* The last arrival of a fast barrier: opens the next generation (a
 * seq_cst add, see wake_slot), then wakes sleepers. */
static void barrier_release(CollGroup *g, Slot *leader) {
  atomic_store(&leader->bar_count, 0);
  atomic_fetch_add(&leader->bar_gen, 1);
  wake_slot(g, leader, false);
}

/*
 * Barrier of the call's participants, counted at the first participant's
 * slot (it leads one instance at a time, and every participant of that
 * instance agrees on who leads).  Returns true to exactly one caller, the
 * last to arrive.  Not interruptible: every participant is past the
 * rendezvous and reaches it without running user code.  Fast mode counts
 * with an atomic add (acq_rel: the last arrival sees every participant's
 * writes, and the generation it stores publishes them to the others) and
 * takes the lock only to sleep.
 */
static bool barrier(Call *c) {
  CollGroup *g = c->g;
  if (c->n == 1) return true;
  BarrierArg b = {&g->slots[c->peers[0]], 0};
  if (g->reference) return barrier_locked(c, &b);
  b.gen = atomic_load_explicit(&b.leader->bar_gen, memory_order_acquire);
  if (atomic_fetch_add_explicit(&b.leader->bar_count, 1, memory_order_acq_rel) + 1 ==
      (unsigned)c->n) {
    barrier_release(g, b.leader);
    return true;
  }
  if (spin_until(g, &g->slots[c->rank], generation_moved, &b,
                 atomic_load(&g->epoch)))
    return false;
  pthread_mutex_lock(&g->lock);
  while (atomic_load(&b.leader->bar_gen) == b.gen) {
    atomic_fetch_add(&b.leader->sleepers, 1);
    if (atomic_load(&b.leader->bar_gen) == b.gen) timed_wait(g, &b.leader->wake);
    atomic_fetch_sub(&b.leader->sleepers, 1);
  }
  pthread_mutex_unlock(&g->lock);
  return false;
}

/* Marks the caller through collective #seq: peers that look at it later
 * see it done, not gone, and a lane writer waiting for it wakes. */
/* Records the finished collective [c] in the timeline (an event for it and
 * one for its wait) and in the communication counts: the bytes of this
 * device's operands, the time from entry to now. */
static void record(const Call *c) {
  int64_t t1 = tl_now(), bytes = 0;
  char axes[64], line[16], who[64] = "nobody";
  for (int i = 0; i < c->desc.nin; i++)
    bytes += c->in[i]->size * (int64_t)dt_size(c->in[i]->dtype);
  axes_str(&c->g->mesh, &c->desc, axes, sizeof axes);
  if (tl_counting()) tl_comm(kind_names[c->desc.kind], axes, c->desc.line, bytes, t1 - c->t0);
  if (!tl_tracing()) return;
  snprintf(line, sizeof line, "%d", c->desc.line);
  const char *keys[] = {"axes", "line"}, *vals[] = {axes, line};
  tl_event("collective", kind_names[c->desc.kind], c->t0, t1, 2, keys, vals);
  if (c->waited_for >= 0) coords_of(c->g, c->waited_for, who, sizeof who);
  const char *wkeys[] = {"waited for", "axes"}, *wvals[] = {who, axes};
  tl_event("wait", kind_names[c->desc.kind], c->wait0, c->wait1, 2, wkeys, wvals);
}

static void finish(Call *c) {
  if (tl_tracing() || tl_counting()) record(c);
  Slot *me = &c->g->slots[c->rank];
  atomic_store_explicit(&me->in_coll, false, memory_order_relaxed);
  atomic_store(&me->done, c->seq);
  wake_slot(c->g, me, false);
}

/* The final barrier (operands may be released after it) and leaving. */
static void leave(Call *c) {
  barrier(c);
  finish(c);
}

/* ---- lanes: small reductions without a final barrier ------------------------- */

static void read_flat(char *dst, const Array *a, int64_t lo, int64_t len);

/* Whether collective [c] moves its data through the lanes: a reduction of
 * at most COLL_LANE_BYTES in fast mode.  The same answer on every
 * participant whose descriptor agrees (it depends on the operand's aval
 * only), and a disagreement fails the arrival before data moves. */
static bool uses_lane(const Call *c, const Array *x) {
  return !c->g->reference && !c->cross && c->n > 1 &&
         (size_t)x->size * dt_size(x->dtype) <= COLL_LANE_BYTES;
}

/* The data of slot [s]'s lane [k] for an operand of [bytes]. */
static char *lane_data(Slot *s, int k, size_t bytes) {
  return bytes <= COLL_INLINE_BYTES ? s->inline_lane[k] : s->lane[k].data;
}

/* A reader of [lane] not yet done with it, or -1 when none is.  With
 * [locked] (lock held) a reader that left the body counts as done (it
 * reads nothing more); without, it is only found when the lock is taken. */
static int lane_blocker(Slot *me, const CollGroup *g, const Lane *lane, bool locked) {
  for (int i = 0; i < lane->n; i++) {
    int p = lane->peers[i];
    if (me->known_done[p] >= lane->seq) continue;
    me->known_done[p] = atomic_load(&g->slots[p].done);
    if (me->known_done[p] < lane->seq && !(locked && g->slots[p].exited)) return p;
  }
  return -1;
}

typedef struct LaneArg {
  Slot *me;
  const CollGroup *g;
  const Lane *lane;
} LaneArg;

static bool lane_free(void *arg) {
  LaneArg *a = arg;
  return lane_blocker(a->me, a->g, a->lane, false) < 0;
}

/* Waits until the caller's lane of parity c->seq % 2 may be written: its
 * readers (the participants of collective #seq - 2) are done with it or
 * left the body.  They are past that collective's arrival, so they finish
 * without running user code, and the wait is bounded. */
static void lane_reusable(Call *c, Lane *lane) {
  CollGroup *g = c->g;
  Slot *me = &g->slots[c->rank];
  LaneArg a = {me, g, lane};
  if (lane->seq < 0 || lane_free(&a) ||
      spin_until(g, me, lane_free, &a, atomic_load(&g->epoch)))
    return;
  pthread_mutex_lock(&g->lock);
  for (int p; (p = lane_blocker(me, g, lane, true)) >= 0;) {
    Slot *s = &g->slots[p];
    atomic_fetch_add(&s->sleepers, 1);
    if (atomic_load(&s->done) < lane->seq && !s->exited) timed_wait(g, &s->wake);
    atomic_fetch_sub(&s->sleepers, 1);
  }
  pthread_mutex_unlock(&g->lock);
}

/* Copies the caller's operand [x] into its lane for collective #seq,
 * before the arrival is published. */
static void lane_write(Call *c, const Array *x) {
  Slot *me = &c->g->slots[c->rank];
  int k = (int)(c->seq % 2);
  Lane *lane = &me->lane[k];
  size_t bytes = (size_t)x->size * dt_size(x->dtype);
  char *data = lane_data(me, k, bytes);
  lane_reusable(c, lane);
  if (x->contiguous || x->ndim == 0)
    memcpy(data, arr_data(x), bytes);
  else if (x->size > 0)
    read_flat(data, x, 0, x->size);
  lane->seq = c->seq;
  lane->n = 0;
  for (int i = 0; i < c->n; i++)
    if (c->peers[i] != c->rank) lane->peers[lane->n++] = c->peers[i];
}

/* Sets up [c] on the calling device: group, axes, participants, descriptor.
 * A call with the parameters of the device's previous one takes the
 * axes, participants and parameter text from the memo. */
/* ---- across processes ------------------------------------------------------------
 *
 * Under mpirun a call's devices live in several processes (transport.h);
 * each process runs the body on its own devices only.  A collective whose
 * participants are all local runs as above.  One with participants
 * elsewhere (c->cross) runs in three steps:
 *   1. the local participants meet as usual (rendezvous over them alone);
 *   2. the first of them, the local leader, sends a header (the
 *      collective's number and descriptor, and which participants it
 *      speaks for) and their operands to every other process holding
 *      participants, and receives theirs into arrays of its own (proxies);
 *      the descriptors must agree, as within a process.  Operands of up
 *      to COLL_XINLINE_BYTES ride in the header.  Three kernels exchange
 *      less than whole operands (the XExchange given to x_run): large
 *      reductions reduce-scatter and all-gather between the processes
 *      (x_reduce), all_to_all sends only the slices each process takes
 *      (x_a2a), and both it and all_gather (x_gather) receive straight
 *      into the outputs;
 *   3. after a barrier every local participant computes its own output
 *      from all the operands with the algorithms that read peers' operands
 *      and write only their own output (the same folds, in the same
 *      participant order: the bits equal a one-process run's), and a
 *      final barrier lets the leader free the proxies.
 * While it waits for a header the leader reads what the other processes
 * said: a header of the same number listing one of its participants under
 * another descriptor is a mismatch, a later one a participant that went
 * past it, an exit record one that returned from the body; each is the
 * error a one-process run gives, never a hang.
 */

/* The pool device of mesh rank [r]. */
static int x_device(const CollGroup *g, int r) {
  return g->mesh.device_ids ? g->mesh.device_ids[r] : r;
}

/* Whether mesh rank [r] lives in this process, and which process holds
 * it (from its slot: a collective asks several times per participant). */
static bool x_local(const CollGroup *g, int r) { return g->slots[r].xlocal; }

static int x_proc(const CollGroup *g, int r) { return g->slots[r].xproc; }

/* This process's participants of a cross-process call: their number,
 * the caller's position among them and their ranks (the slot's lpeers). */
typedef struct XLocal {
  int n, pos;
  int *peers;
} XLocal;

/* Frees slot [s]'s table and the proxies kept in it. */
static void x_tab_free(Slot *s) {
  for (int i = 0; i < s->xtab_cap; i++) {
    Array *a = s->xtab[s->xtab_cap + i];
    val_decref(a ? &a->hdr : NULL);
  }
  shm_free(s->xtab);
  s->xtab = NULL;
  s->xtab_cap = 0;
}

/* Leader [s]'s table of [n] operands, zeroed: the one of its last call
 * when large enough (NULL when out of memory). */
static Array **x_tab(Slot *s, int n) {
  if (n > s->xtab_cap) {
    x_tab_free(s);
    if (!(s->xtab = shm_calloc(2 * (size_t)n, sizeof(Array *)))) return NULL;
    s->xtab_cap = n;
  }
  memset(s->xtab, 0, sizeof(Array *) * (size_t)n);
  return s->xtab;
}

/* The proxy at place [i] of leader [s]'s table, shaped as [mine]: the
 * one of the last call there when nothing else holds it and it has that
 * shape, else a new one (NULL when out of memory).  Its data is all
 * received again. */
static Array *x_proxy(Slot *s, int i, const Array *mine) {
  Array **kept = s->xtab + s->xtab_cap, *a = kept[i];
  kept[i] = NULL;
  if (a && a->dtype == mine->dtype && a->ndim == mine->ndim && a->contiguous &&
      a->offset == 0 && memcmp(a->shape, mine->shape, sizeof(int64_t) * a->ndim) == 0 &&
      arr_sole_holder(a))
    return a;
  val_decref(a ? &a->hdr : NULL);
  return arr_new(mine->dtype, mine->ndim, mine->shape);
}

/* A collective's header as read (x_header_read): the sender's
 * participants and operands point into the message. */
typedef struct XHeader {
  long seq;
  int first, nloc;                /* the group's first participant; the sender's count */
  int inline_bytes;               /* bytes of operands at payload, or 0:
                                     they come as a data message */
  const int *ranks;               /* [nloc] the sender's participants, in participant order */
  const char *payload;
  CollDesc desc;                  /* dims past desc.ndims not set */
} XHeader;

/* A header on the wire: XWire, the descriptor's dims in use (int64_t
 * each), the sender's participants (int each), the descriptor's
 * parameters with their NUL, zeros to a multiple of 8 bytes (so every
 * field is aligned in the mailbox's copy), then (x_exchange) the
 * operands when these total at most COLL_XINLINE_BYTES: a small
 * collective is one message each way.  Only what is in use travels (a
 * CollDesc is ~1.9 KB): a psum of one float is ~150 bytes, which Open
 * MPI sends inline (up to 256), with no request to complete. */
typedef struct XWire {
  int64_t seq;
  int32_t first, nloc, inline_bytes;
  int32_t kind, naxes, line, nin, ndims, params_len;
  int32_t axes[DEV_MAX_AXES];
  signed char dtype[COLL_MAX_IN], ndim[COLL_MAX_IN];
} XWire;

#define COLL_XINLINE_BYTES 1024

/* The longest header of a sender of [nloc] participants. */
static size_t x_wire_cap(int nloc) {
  return sizeof(XWire) + sizeof(int64_t) * COLL_MAX_IN * SHM_MAXDIM + COLL_PARAMS_CAP +
         sizeof(int) * (size_t)nloc + 8 + COLL_XINLINE_BYTES;
}

/* Writes the header of collective [c] for this process's participants
 * [lc], with [inline_bytes] of operands to follow, into [buf]
 * (x_wire_cap(lc->n) bytes).  Returns where the operands go: the
 * header's length without them. */
static size_t x_header_pack(char *buf, const Call *c, const XLocal *lc, int inline_bytes) {
  const CollDesc *d = &c->desc;
  XWire w = {c->seq, c->peers[0], lc->n, inline_bytes, d->kind, d->naxes, d->line, d->nin,
             d->ndims, (int32_t)strlen(d->params) + 1, {0}, {0}, {0}};
  memcpy(w.axes, d->axes, sizeof(int) * (size_t)d->naxes);
  memcpy(w.dtype, d->dtype, (size_t)d->nin);
  memcpy(w.ndim, d->ndim, (size_t)d->nin);
  char *p = buf;
  memcpy(p, &w, sizeof w);
  p += sizeof w;
  memcpy(p, d->dims, sizeof(int64_t) * (size_t)d->ndims);
  p += sizeof(int64_t) * (size_t)d->ndims;
  memcpy(p, lc->peers, sizeof(int) * (size_t)lc->n);
  p += sizeof(int) * (size_t)lc->n;
  memcpy(p, d->params, (size_t)w.params_len);
  p += w.params_len;
  size_t len = ((size_t)(p - buf) + 7) & ~(size_t)7;
  memset(p, 0, len - (size_t)(p - buf));
  return len;
}

/* The header of collective [c] from leader [me] for its local
 * participants [lc], with [inline_bytes] of operands to follow, in
 * me->xhdr (NULL when out of memory); its length into [len].  A call
 * repeating the descriptor of the leader's last one (its generation
 * unchanged: equal up to the line) for the same participants takes the
 * last header with its number, line and inline size written over:
 * packing it anew cost a one-float psum ~200 instructions before its
 * send. */
static char *x_header(Slot *me, const Call *c, const XLocal *lc, int inline_bytes, size_t *len) {
  if (me->xhdr && me->xhdr_gen == me->gen && me->xhdr_first == c->peers[0] &&
      me->xhdr_nloc == lc->n) {
    int64_t seq = c->seq;
    int32_t line = c->desc.line, inl = inline_bytes;
    memcpy(me->xhdr + offsetof(XWire, seq), &seq, sizeof seq);
    memcpy(me->xhdr + offsetof(XWire, line), &line, sizeof line);
    memcpy(me->xhdr + offsetof(XWire, inline_bytes), &inl, sizeof inl);
    *len = me->xhdr_len;
    return me->xhdr;
  }
  if (!me->xhdr && !(me->xhdr = shm_malloc(x_wire_cap(dev_count())))) return err_nomem();
  me->xhdr_len = *len = x_header_pack(me->xhdr, c, lc, inline_bytes);
  me->xhdr_gen = me->gen;
  me->xhdr_first = c->peers[0];
  me->xhdr_nloc = lc->n;
  return me->xhdr;
}

/* Reads header message [m] into [h] (pointing into m, which must outlive
 * it): 0, or -1 with the error set when its lengths do not add up. */
static int x_header_read(const TransportMsg *m, XHeader *h) {
  XWire w;
  if (m->len < sizeof w) goto bad;
  memcpy(&w, m->data, sizeof w);
  if (w.naxes < 0 || w.naxes > DEV_MAX_AXES || w.nin < 0 || w.nin > COLL_MAX_IN ||
      w.ndims < 0 || w.ndims > COLL_MAX_IN * SHM_MAXDIM || w.params_len < 1 ||
      w.params_len > COLL_PARAMS_CAP || w.nloc < 1 || w.inline_bytes < 0)
    goto bad;
  size_t ranks = sizeof w + sizeof(int64_t) * (size_t)w.ndims;
  size_t params = ranks + sizeof(int) * (size_t)w.nloc, end = params + (size_t)w.params_len;
  size_t payload = (end + 7) & ~(size_t)7;
  if (payload + (size_t)w.inline_bytes > m->len || m->data[end - 1] != 0) goto bad;
  /* field by field: a compound literal would clear all of desc (~1.9 KB) */
  h->seq = w.seq;
  h->first = w.first;
  h->nloc = w.nloc;
  h->inline_bytes = w.inline_bytes;
  h->ranks = (const int *)(m->data + ranks);
  h->payload = m->data + payload;
  CollDesc *d = &h->desc;
  d->kind = w.kind;
  d->naxes = w.naxes;
  memcpy(d->axes, w.axes, sizeof d->axes);
  d->line = w.line;
  d->nin = w.nin;
  d->ndims = w.ndims;
  memcpy(d->dtype, w.dtype, sizeof d->dtype);
  memcpy(d->ndim, w.ndim, sizeof d->ndim);
  memcpy(d->dims, m->data + sizeof w, sizeof(int64_t) * (size_t)w.ndims);
  memcpy(d->params, m->data + params, (size_t)w.params_len);
  return 0;
bad:
  return err_set(ERR_COLLECTIVE, "a malformed collective header from process %d", m->source),
         -1;
}

/* The tag key of collective #seq of the group whose first participant is
 * [first]: one call's parity, 16 bits of the number, 11 of the rank. */
static int x_key(const CollGroup *g, long seq, int first) {
  return (g->parity << 27) | (int)((seq & 0xFFFF) << 11) | (first & 0x7FF);
}

/* Applies exit records of this call to the remote slots (lock held). */
static bool x_apply_exit(TransportMsg *m, void *arg) {
  CollGroup *g = arg;
  if (m->tag != transport_tag(TRANSPORT_EXIT, g->parity << 27)) return false;
  const XExit *e = (const XExit *)m->data;
  Slot *s = &g->slots[e->rank];
  s->exited = true;
  s->failed = e->failed;
  s->exit_line = e->line;
  s->xcount = e->count;
  transport_msg_free(m);
  return true;
}

/* What a conflicting header says, for x_check. */
typedef struct XConflict {
  const Call *c;
  int proc;
  int rank;                       /* the participant it concerns, or -1 */
  CollDesc desc;
  bool later;                     /* a later collective (went past) */
} XConflict;

static bool x_find_conflict(TransportMsg *m, void *arg) {
  XConflict *x = arg;
  const Call *c = x->c;
  if (x->rank >= 0 || m->source != x->proc || ((m->tag >> 29) & 1) != c->g->parity) return false;
  XHeader h;
  if (x_header_read(m, &h) < 0) {
    err_clear();   /* not a conflict found; its waiter reports it */
    return false;
  }
  if (h.seq < c->seq || (h.seq == c->seq && h.first == c->peers[0])) return false;
  for (int i = 0; i < h.nloc; i++)
    for (int q = 0; q < c->n; q++)
      if (c->peers[q] == h.ranks[i]) {
        x->rank = h.ranks[i];
        x->desc = h.desc;
        x->later = h.seq > c->seq;
        return false;
      }
  return false;
}

/* Whether process [proc]'s message [tag] is there: a small message, or
 * with [data] a matched data message. */
static bool x_arrived(int proc, int tag, bool data) {
  return data ? transport_has_data(proc, tag) : transport_has(proc, tag);
}

/* Checks, while waiting for process [proc]'s message [tag] (a header, or
 * with [data] a data message sent after its header), whether it can still
 * come: 0 yes, -1 with the error set.  What it reads may have come in
 * (another thread polls) after the caller looked for the message, and the
 * message before it (one sender's messages arrive in the order sent): so
 * no error while the message is there. */
static int x_check(const Call *c, int proc, int tag, bool data) {
  if (x_arrived(proc, tag, data)) return 0;
  CollGroup *g = c->g;
  pthread_mutex_lock(&g->lock);
  transport_scan(TRANSPORT_EXIT, x_apply_exit, g);
  if (x_arrived(proc, tag, data)) {   /* it came with the records */
    pthread_mutex_unlock(&g->lock);
    return 0;
  }
  int rc = abort_error(g);
  /* a participant that returned is the cause; one that failed may be its echo */
  for (int pass = 0; pass < 2; pass++)
    for (int q = 0; rc == 0 && q < c->n; q++) {
      int p = c->peers[q];
      if (x_proc(g, p) == proc && g->slots[p].exited && g->slots[p].failed == (pass == 1))
        rc = left_error(g, c, p, g->slots[p].failed);
    }
  pthread_mutex_unlock(&g->lock);
  if (rc < 0) return -1;
  XConflict x = {.c = c, .proc = proc, .rank = -1};
  transport_scan(TRANSPORT_HEADER, x_find_conflict, &x);
  if (x_arrived(proc, tag, data)) return 0;
  if (x.rank < 0) {
    /* a BYE: transport_departed polls, and knows only small messages */
    if (transport_departed(proc, tag, "a collective") == 0) return 0;
    if (!x_arrived(proc, tag, data)) return -1;
    err_clear();
    return 0;
  }
  if (x.later) return passed_error(g, c, x.rank);
  return mismatch_error(g, c->rank, &c->desc, x.rank, &x.desc);
}

/* The longest header any process sends in group [g], which a receive
 * posted for one must hold: a sender lists at most its own devices (as
 * many as this process's pool), or the mesh's. */
static size_t x_header_cap(const CollGroup *g) {
  int n = dev_count();
  return x_wire_cap(n > g->mesh.ndevices ? n : g->mesh.ndevices);
}

/* Waits for process [proc]'s header of collective [c], through a receive
 * posted for it (transport_expect): a turn of the wait is an MPI_Test,
 * not a probe. */
static TransportMsg *x_wait_header(const Call *c, int proc, int tag) {
  TransportExpect *e = transport_expect(proc, tag, x_header_cap(c->g));
  for (unsigned i = 0;; i++) {
    TransportMsg *m;
    if (e) {
      m = transport_expect_take(e);
    } else {
      transport_poll();
      m = transport_take(proc, tag);
    }
    if (m) return m;
    /* the checks lock the group and scan the mailbox: not at every turn of
     * a wait that usually ends within microseconds */
    if (i % 64 == 63 && x_check(c, proc, tag, false) < 0) {
      transport_expect_cancel(e);
      return NULL;
    }
    if (i >= 256) sched_yield();
  }
}

/* Receives process [proc]'s data message [tag] into [iov] (niov pieces)
 * when the sender may fail before sending it (it is sent in answer to
 * other processes' messages): 0, or -1 with the error set. */
static int x_wait_data(const Call *c, int proc, int tag, const TransportIov *iov, int niov) {
  for (unsigned i = 0; !transport_has_data(proc, tag); i++) {
    transport_poll();
    if (i % 64 == 63 && x_check(c, proc, tag, true) < 0) return -1;
    if (i >= 256) sched_yield();
  }
  return transport_recv_data(proc, tag, iov, niov);
}

/* The processes other than this one that hold participants of [c], in
 * increasing order, into [procs]; their number. */
static int x_procs(const Call *c, int *procs) {
  int np = 0, me = transport_rank();
  for (int q = 0; q < c->n; q++) {
    int p = x_proc(c->g, c->peers[q]), i = 0;
    if (p == me) continue;
    while (i < np && procs[i] != p) i++;
    if (i == np) procs[np++] = p;
  }
  for (int i = 1; i < np; i++)
    for (int j = i; j > 0 && procs[j - 1] > procs[j]; j--) {
      int t = procs[j]; procs[j] = procs[j - 1]; procs[j - 1] = t;
    }
  return np;
}

/* The proxies of process [proc]'s participants, allocated as this
 * device's operands are shaped (the descriptors agreed), and the pieces to
 * receive their data into.  0, or -1 with the error set. */
static char *x_gather_at(const Call *c, int q);

static int x_proxies(const Call *c, const XHeader *h, Array **tab, TransportIov *iov) {
  int nin = c->desc.nin, k = 0;
  Slot *me = &c->g->slots[c->rank];
  for (int i = 0; i < h->nloc; i++) {
    int q = 0;
    while (q < c->n && c->peers[q] != h->ranks[i]) q++;
    if (q == c->n) return err_set(ERR_COLLECTIVE, "collective mismatch: another process "
                                  "sent operands for devices outside this group"), -1;
    if (me->xgather) {   /* x_gather: into the result (one operand) */
      iov[k++] = (TransportIov){x_gather_at(c, q),
                                (size_t)c->in[0]->size * dt_size(c->in[0]->dtype)};
      continue;
    }
    for (int j = 0; j < nin; j++) {
      Array *a = tab[q * nin + j] = x_proxy(me, q * nin + j, c->in[j]);
      if (!a) return -1;
      iov[k++] = (TransportIov){arr_data(a), (size_t)a->size * dt_size(a->dtype)};
    }
  }
  return k;
}

/* Copies the operands inline in header [h] into the pieces [iov]: their
 * number, or -1 with the error set when the lengths differ. */
static int x_unpack(const XHeader *h, const TransportIov *iov, int k) {
  size_t total = 0;
  for (int i = 0; i < k; i++) total += iov[i].len;
  if (total != (size_t)h->inline_bytes)
    return err_set(ERR_VALUE, "a message of %d bytes where %zu were expected",
                   h->inline_bytes, total), -1;
  const char *p = h->payload;
  for (int i = 0; i < k; p += iov[i].len, i++) memcpy(iov[i].base, p, iov[i].len);
  return k;
}

/* A header leader [me] accepted from one process, up to its operands,
 * under its descriptor generation [gen]. */
typedef struct XSeen {
  char *bytes;                    /* x_header_cap bytes; NULL: none yet */
  size_t len;
  unsigned long gen;
} XSeen;

/* Whether header message [m] from process [proc] repeats the last one
 * leader [me] accepted from it, while the leader's descriptor is the
 * same (equal up to the line): every byte but the number, line and
 * inline size.  Then it matches as that one did, and [h] gets what
 * x_receive reads besides the descriptor: reading and comparing it
 * anew cost a one-float psum ~230 instructions after its wait. */
static bool x_header_known(const Slot *me, int proc, const TransportMsg *m, XHeader *h) {
  const XSeen *v = me->xseen ? &me->xseen[proc] : NULL;
  if (!v || !v->bytes || v->gen != me->gen || m->len < v->len) return false;
  const char *a = m->data, *b = v->bytes;
  size_t first = offsetof(XWire, first), kind = offsetof(XWire, kind), nin = offsetof(XWire, nin);
  if (memcmp(a + first, b + first, offsetof(XWire, inline_bytes) - first) != 0 ||
      memcmp(a + kind, b + kind, offsetof(XWire, line) - kind) != 0 ||
      memcmp(a + nin, b + nin, v->len - nin) != 0)
    return false;
  int32_t inl, ndims;
  int64_t seq;
  memcpy(&inl, a + offsetof(XWire, inline_bytes), sizeof inl);
  memcpy(&ndims, a + offsetof(XWire, ndims), sizeof ndims);
  memcpy(&seq, a + offsetof(XWire, seq), sizeof seq);
  if (inl < 0 || v->len + (size_t)inl > m->len) return false;
  memcpy(&h->first, a + first, sizeof h->first);
  memcpy(&h->nloc, a + offsetof(XWire, nloc), sizeof h->nloc);
  h->seq = seq;
  h->inline_bytes = inl;
  h->ranks = (const int *)(a + sizeof(XWire) + sizeof(int64_t) * (size_t)ndims);
  h->payload = a + v->len;
  return true;
}

/* Remembers header message [m] (read into [h]) from process [proc] as
 * accepted by leader [me]; nothing when out of memory. */
static void x_header_accepted(Slot *me, const CollGroup *g, int proc, const TransportMsg *m,
                              const XHeader *h) {
  if (!me->xseen && !(me->xseen = shm_calloc((size_t)transport_procs(), sizeof(XSeen))))
    return;
  XSeen *v = &me->xseen[proc];
  if (!v->bytes && !(v->bytes = shm_malloc(x_header_cap(g)))) return;
  v->len = (size_t)(h->payload - m->data);
  memcpy(v->bytes, m->data, v->len);
  v->gen = me->gen;
}

/* Frees leader [s]'s copies of accepted headers. */
static void x_seen_free(Slot *s) {
  for (int p = 0; s->xseen && p < transport_procs(); p++) shm_free(s->xseen[p].bytes);
  shm_free(s->xseen);
  s->xseen = NULL;
}

/* Reads header message [m] from process [proc] into [h] and checks its
 * descriptor against [c]'s; then the pieces to receive the operands
 * into (x_proxies): their number, or -1 with the error set. */
static int x_header_accept(const Call *c, int proc, const TransportMsg *m, XHeader *h,
                           Array **tab, TransportIov *iov) {
  Slot *me = &c->g->slots[c->rank];
  if (x_header_known(me, proc, m, h)) return x_proxies(c, h, tab, iov);
  if (x_header_read(m, h) < 0) return -1;
  if (!desc_equal(&h->desc, &c->desc))
    return mismatch_error(c->g, c->rank, &c->desc, h->ranks[0], &h->desc);
  x_header_accepted(me, c->g, proc, m, h);
  return x_proxies(c, h, tab, iov);
}

/* Receives every other process's header and operands into [tab]. */
static int x_receive(const Call *c, const int *procs, int np, Array **tab, TransportIov *iov) {
  int tag = transport_tag(TRANSPORT_HEADER, x_key(c->g, c->seq, c->peers[0]));
  for (int i = 0; i < np; i++) {
    TransportMsg *m = x_wait_header(c, procs[i], tag);
    if (!m) return -1;
    XHeader h;
    int k = x_header_accept(c, procs[i], m, &h, tab, iov);
    if (k >= 0 && h.inline_bytes) {
      k = x_unpack(&h, iov, k);
      transport_msg_free(m);
      if (k < 0) return -1;
      continue;
    }
    transport_msg_free(m);
    if (k < 0 || transport_recv_data(procs[i], tag & ~3, iov, k) < 0) return -1;
  }
  return 0;
}

/* Completes the leader's sends [reqs] of collective [c]; after a failure
 * ([rc] < 0) meanwhile drops what the other processes sent for [c]: a
 * peer that failed too may be waiting for its own large sends to this
 * process to complete (a send of more than MPI's eager limit completes
 * only once received). */
static void x_wait_sends(const Call *c, void **reqs, int n, int rc) {
  int tag = transport_tag(TRANSPORT_DATA, x_key(c->g, c->seq, c->peers[0]));
  if (rc == 0)
    transport_wait_sends(reqs, n);
  else
    transport_wait_sends_dropping(reqs, n, -1, tag);
}

/* The leader's exchange (step 2): fills the leader slot's xin.  Operands
 * that are not contiguous are sent from contiguous copies. */
static int x_exchange(const Call *c, const XLocal *lc, const void *arg) {
  (void)arg;
  CollGroup *g = c->g;
  Slot *me = &g->slots[c->rank];
  int nin = c->desc.nin, n = c->n, procs[c->n], np = x_procs(c, procs);
  Array **tab = x_tab(me, n * nin);
  /* the rest on the stack (16 MiB, DEV_STACK_BYTES): a small collective's
   * time is mostly such overheads */
  Array *copies[lc->n * nin + 1];
  /* iov[0] the header, then this process's operands, then (x_receive)
   * the pieces to receive the others' into */
  TransportIov iov[n * nin + 2];
  void *reqs[2 * np + 1];
  memset(copies, 0, sizeof copies);
  me->xin = tab;
  me->xn = n;
  me->xnin = nin;
  if (!tab) return err_nomem(), -1;
  int k = 0;
  for (int q = 0; q < n && k % nin == 0; q++) {
    if (!x_local(g, c->peers[q])) continue;
    for (int j = 0; j < nin; j++, k++) {
      Array *a = g->slots[c->peers[q]].in[j];
      tab[q * nin + j] = a;
      if (!a->contiguous && a->ndim > 0 && !(a = copies[k] = arr_contiguous(a))) break;
      iov[1 + k] = (TransportIov){arr_data(a), (size_t)a->size * dt_size(a->dtype)};
    }
  }
  int ncopies = lc->n * nin;
  if (k != ncopies) {   /* a contiguous copy failed: nothing was sent */
    for (int i = 0; i < ncopies; i++) val_decref(copies[i] ? &copies[i]->hdr : NULL);
    return -1;
  }
  int key = x_key(g, c->seq, c->peers[0]);
  size_t total = 0;
  for (int i = 1; i <= k; i++) total += iov[i].len;
  /* the operands ride in the header (one message, gathered by the
   * transport) when small; none (empty arrays) still come as a data
   * message, as the header's inline_bytes 0 says */
  bool inl = total > 0 && total <= COLL_XINLINE_BYTES;
  size_t hlen = 0;
  char *h = x_header(me, c, lc, inl ? (int)total : 0, &hlen);
  if (!h) {
    for (int i = 0; i < ncopies; i++) val_decref(copies[i] ? &copies[i]->hdr : NULL);
    return -1;
  }
  iov[0] = (TransportIov){h, hlen};
  for (int i = 0; i < np; i++) {
    reqs[2 * i] = transport_isend(procs[i], transport_tag(TRANSPORT_HEADER, key), iov,
                                  inl ? 1 + k : 1);
    reqs[2 * i + 1] = inl ? NULL
                          : transport_isend(procs[i], transport_tag(TRANSPORT_DATA, key), iov + 1, k);
  }
  /* the pieces of this process's operands are in iov[1..k]; receive after them */
  int rc = x_receive(c, procs, np, tab, iov + 1 + k);
  x_wait_sends(c, reqs, 2 * np, rc);
  for (int i = 0; i < lc->n * nin; i++) val_decref(copies[i] ? &copies[i]->hdr : NULL);
  return rc;
}

/* Lets the leader's proxies (the remote participants' operands) go, kept
 * for the next call at their places in the table, and frees its result
 * (x_reduce) when it is not its output. */
static void x_free(CollGroup *g, Slot *lead) {
  if (lead->xres && lead->xres != lead->out[0]) val_decref(&lead->xres->hdr);
  lead->xres = NULL;
  if (!lead->xin) return;
  Array **kept = lead->xtab + lead->xtab_cap;
  for (int q = 0; q < lead->xn; q++)
    if (!x_local(g, lead->peers[q]))
      for (int j = 0; j < lead->xnin; j++) {
        int i = q * lead->xnin + j;
        if (!lead->xin[i]) continue;
        val_decref(kept[i] ? &kept[i]->hdr : NULL);
        kept[i] = lead->xin[i];
      }
  lead->xin = NULL;
}

/* The leader's part of step 2: the exchange between processes (of the
 * local participants' operands [lc], with the kernel's [arg]); 0, or -1
 * with the error set. */
typedef int (*XExchange)(const Call *c, const XLocal *lc, const void *arg);

/* Swaps call [c]'s participants with [l]'s.  x_run's local steps
 * (rendezvous, barriers, finish) take a Call over the local participants
 * alone: the call itself with them swapped in, not a copy of it (with its
 * descriptor ~1.9 KB, a copy cost a one-float psum ~250 instructions). */
static void x_swap(Call *c, XLocal *l) {
  XLocal t = {c->n, c->pos, c->peers};
  c->n = l->n, c->pos = l->pos, c->peers = l->peers;
  *l = t;
}

/* The leader's exchange, its error copied into the leader slot for the
 * other local participants (who read it after the barrier that follows). */
static void x_lead(Call *c, const XLocal *lc, XExchange exchange, const void *arg) {
  Slot *lead = &c->g->slots[c->rank];
  lead->xrc = exchange(c, lc, arg);
  if (lead->xrc < 0) {
    lead->xkind = err_kind();
    snprintf(lead->xmsg, sizeof lead->xmsg, "%s", err_message());
  }
}

/* Runs collective [c], which has participants on other processes: the
 * leader runs [exchange] (x_exchange: every operand to every process),
 * then every local participant [body], which computes its output (from
 * every operand, peer_in, after x_exchange). */
static int x_run(Call *c, XExchange exchange, int (*body)(const Call *c, const void *arg),
                 const void *arg) {
  CollGroup *g = c->g;
  XLocal l = {0, 0, g->slots[c->rank].lpeers};
  for (int q = 0; q < c->n; q++)
    if (x_local(g, c->peers[q])) {
      if (c->peers[q] == c->rank) l.pos = l.n;
      l.peers[l.n++] = c->peers[q];
    }
  Slot *lead = &g->slots[l.peers[0]];
  bool leader = l.pos == 0;
  x_swap(c, &l);   /* c: the local participants; l: all of them */
  int rc = rendezvous(c);
  x_swap(c, &l);
  if (rc < 0) return -1;
  if (leader) x_lead(c, &l, exchange, arg);
  x_swap(c, &l);
  barrier(c);
  x_swap(c, &l);
  rc = lead->xrc;
  if (rc < 0 && !leader) {
    err_set(lead->xkind, "%s", lead->xmsg);
    dev_error_secondary();
  } else if (rc == 0) {
    c->xin = lead->xin;
    rc = body(c, arg);
  }
  x_swap(c, &l);
  barrier(c);
  if (leader) x_free(g, lead);
  finish(c);
  x_swap(c, &l);
  return rc;
}

/* Sends device [rank]'s exit record to every other process. */
static void x_send_exit(CollGroup *g, Slot *s, int rank, int line, bool failed) {
  s->xexit = (XExit){rank, line, failed, atomic_load(&s->published) + 1};
  TransportIov v = {&s->xexit, sizeof s->xexit};
  for (int p = 0; p < transport_procs(); p++)
    if (p != transport_rank())
      s->xreqs[p] = transport_isend(p, transport_tag(TRANSPORT_EXIT, g->parity << 27), &v, 1);
}

static int call_init(Call *c, CollKind kind, const Params *p, Array **in,
                     int nin, Array **out) {
  const char *prim = kind_names[kind];
  DevCtx *ctx = dev_ctx();
  if (ctx && !ctx->group)   /* the debugger: its prompt, or a breakpoint's condition */
    return err_set(ERR_VALUE, "%s needs every device of the shard_map body: at the "
                   "debugger's prompt a line runs on every device only when it calls "
                   "the collective itself", prim), -1;
  if (!ctx)
    return err_set(ERR_VALUE, "%s can only be used inside a shard_map body",
                   prim), -1;
  if (nin > COLL_MAX_IN)
    return err_set(ERR_VALUE, "%s: %d operands, at most %d", prim, nin, COLL_MAX_IN), -1;
  /* no memset: the descriptor is large, and every field is set below */
  c->g = ctx->group;
  c->rank = ctx->rank;
  c->in = in;
  c->out = out;
  Slot *s = &c->g->slots[c->rank];
  c->peers = s->peers;
  c->seq = s->seq + 1;
  c->desc.kind = kind;
  c->desc.line = eval_current_loc().line;
  if (tl_tracing() || tl_counting()) c->t0 = tl_now();
  sig_of(in, nin, &c->desc);
  c->xin = NULL;
  CallMemo *m = &s->memo;
  if (memo_hit(m, kind, p)) {
    c->desc.naxes = m->naxes;
    memcpy(c->desc.axes, m->axes, sizeof(int) * (size_t)m->naxes);
    c->n = m->n;
    c->pos = m->pos;
    c->axis_size = m->axis_size;
    c->cross = m->cross;
    memcpy(c->desc.params, m->params, strlen(m->params) + 1);
  } else {
    memo_clear(m);  /* find_participants rewrites the peers */
    if (memo_axes(s, prim, &c->g->mesh, p, c->desc.axes, &c->desc.naxes) < 0 ||
        find_participants(c, prim, p) < 0)
      return -1;
    params_canon(p, c->desc.params, sizeof c->desc.params);
    c->cross = false;
    for (int i = 0; i < c->n && !c->cross; i++) c->cross = !x_local(c->g, c->peers[i]);
    memo_fill(m, kind, p, c);
  }
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
  if (transport_active()) x_send_exit(g, s, rank, line, failed);
  if (g->reference && g->baton == rank) pass_baton(g, rank);
  bump(g);
  pthread_mutex_unlock(&g->lock);
}

void coll_group_abort(CollGroup *g, ErrKind kind, const char *why) {
  pthread_mutex_lock(&g->lock);
  if (!g->aborted) {
    g->aborted = true;
    atomic_store(&g->stopped, true);
    g->abort_kind = kind;
    snprintf(g->abort_msg, sizeof g->abort_msg, "%s", why);
  }
  bump(g);
  pthread_mutex_unlock(&g->lock);
}

/* Appends to [buf] the participants of device [rank]'s collective [d],
 * number [seq], that have not reached it yet: ", for (i=0), (i=2)" (who
 * waits for whom, for the debugger).  Nothing when axis_index_groups
 * chose the participants: they are the device's own to read. */
static void append_missing(CollGroup *g, int rank, const CollDesc *d, long seq, char *buf,
                           size_t cap) {
  if (strstr(d->params, "axis_index_groups") && !strstr(d->params, "axis_index_groups=None"))
    return;
  const MeshDesc *m = &g->mesh;
  const int *coords = g->slots[rank].ctx.coords;
  int n = flat_size(m, d->axes, d->naxes), shown = 0, more = 0;
  for (int i = 0; i < n; i++) {
    int p = rank_at(m, d->axes, d->naxes, coords, i);
    if (p == rank || atomic_load(&g->slots[p].published) >= seq) continue;
    if (shown == 4) {
      more++;
      continue;
    }
    char c[96];
    size_t used = strlen(buf);
    dev_mesh_coords_str(m, p, c, sizeof c);
    snprintf(buf + used, cap - used, "%s%s", shown++ ? ", " : ", for ", c);
  }
  size_t used = strlen(buf);
  if (more) snprintf(buf + used, cap - used, " and %d more", more);
}

bool coll_waiting_str(CollGroup *g, int rank, char *buf, size_t cap) {
  pthread_mutex_lock(&g->lock);
  Slot *s = &g->slots[rank];
  bool in = atomic_load(&s->in_coll);
  long seq = atomic_load(&s->published);
  CollDesc buf_d;
  const CollDesc *d = in ? desc_at(s, seq, &buf_d) : NULL;
  buf[0] = 0;
  if (d) {
    char axes[128], line[32] = "";
    axes_str(&g->mesh, d, axes, sizeof axes);
    if (d->line > 0) snprintf(line, sizeof line, " at line %d", d->line);
    snprintf(buf, cap, "%s over %s%s", kind_names[d->kind], axes, line);
    append_missing(g, rank, d, seq, buf, cap);
  }
  pthread_mutex_unlock(&g->lock);
  return in;
}

long coll_seq(CollGroup *g, int rank) {
  pthread_mutex_lock(&g->lock);
  long s = atomic_load(&g->slots[rank].published) + 1;
  pthread_mutex_unlock(&g->lock);
  return s;
}

typedef struct RunArg {
  CollGroup *g;
  void (*fn)(int rank, void *ctx);
  void *ctx;
} RunArg;

/* Runs device [rank]'s part of the call, with a writer token of its own:
 * what it makes it may change, what the others share it may only read
 * (value.h: who may change a container). */
static void run_one(int rank, void *arg) {
  RunArg *ra = arg;
  uint32_t outer = val_writer;
  val_writer = val_writer_new();
  if (coll_enter(ra->g, rank) == 0) ra->fn(rank, ra->ctx);
  coll_device_exit(ra->g, rank, err_occurred());
  val_writer = outer;
}

typedef struct XRunArg {
  RunArg ra;
  const int *ranks;               /* local index -> mesh rank */
} XRunArg;

static void x_run_one(int i, void *arg) {
  XRunArg *x = arg;
  run_one(x->ranks[i], &x->ra);
}

/* coll_run over the devices of this process (the others run elsewhere):
 * then waits for the exit records' sends. */
static int x_coll_run(CollGroup *g, void (*fn)(int rank, void *ctx), void *ctx) {
  int n = g->mesh.ndevices, nl = 0;
  int *ranks = shm_malloc(sizeof(int) * (size_t)n), *pool = shm_malloc(sizeof(int) * (size_t)n);
  if (!ranks || !pool) {
    shm_free(ranks), shm_free(pool);
    return err_nomem(), -1;
  }
  for (int r = 0; r < n; r++)
    if (x_local(g, r)) {
      ranks[nl] = r;
      pool[nl++] = transport_pool_index(x_device(g, r));
    }
  XRunArg x = {{g, fn, ctx}, ranks};
  int rc = nl ? dev_run(nl, pool, x_run_one, &x) : 0;
  for (int i = 0; i < nl; i++) transport_wait_sends(g->slots[ranks[i]].xreqs, transport_procs());
  shm_free(ranks), shm_free(pool);
  return rc;
}

int coll_run(CollGroup *g, void (*fn)(int rank, void *ctx), void *ctx) {
  if (transport_active()) return x_coll_run(g, fn, ctx);
  RunArg ra = {g, fn, ctx};
  return dev_run(g->mesh.ndevices, g->mesh.device_ids, run_one, &ra);
}

int coll_group_parity(const CollGroup *g) { return g->parity; }

bool coll_first_local(const DevCtx *d) {
  int r = 0;
  while (r < d->rank && !x_local(d->group, r)) r++;
  return r == d->rank;
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

/* ---- contiguous folds ---------------------------------------------------------- */
/* The fast path's loops: the scalar rules above on contiguous rows, with
 * restrict pointers and no strides, so gcc vectorises them (the same
 * expressions per element, so the same bits as inner_reduce: no FMA
 * under -ffp-contract=off, and maxps/minps select exactly as `?:` does).
 * red_first is o = a (op) b, red_next is o = o (op) b. */

#pragma GCC push_options
#pragma GCC optimize("O3")

#define FLOAT_FOLDS(T, NAME)                                                  \
  KERN_CLONES static void NAME##_first(T *restrict o, const T *restrict a,    \
                                       const T *restrict b, int64_t n,        \
                                       RedOp op) {                            \
    for (int64_t i = 0; i < n; i++) {                                         \
      T x = a[i], y = b[i];                                                   \
      o[i] = RED_FLOAT(T, x, y, op);                                          \
    }                                                                         \
  }                                                                           \
  KERN_CLONES static void NAME##_next(T *restrict o, const T *restrict b,     \
                                      int64_t n, RedOp op) {                  \
    for (int64_t i = 0; i < n; i++) {                                         \
      T x = o[i], y = b[i];                                                   \
      o[i] = RED_FLOAT(T, x, y, op);                                          \
    }                                                                         \
  }

FLOAT_FOLDS(float, fold_f32)
FLOAT_FOLDS(double, fold_f64)

/* Integers: sums wrap (computed unsigned, the same bits as red_int). */
#define INT_FOLDS(T, U, NAME)                                                 \
  KERN_CLONES static void NAME##_first(T *restrict o, const T *restrict a,    \
                                       const T *restrict b, int64_t n,        \
                                       RedOp op) {                            \
    for (int64_t i = 0; i < n; i++) {                                         \
      T x = a[i], y = b[i];                                                   \
      o[i] = op == RED_SUM ? (T)((U)x + (U)y)                                 \
             : op == RED_MAX ? (x > y ? x : y) : (x < y ? x : y);             \
    }                                                                         \
  }                                                                           \
  KERN_CLONES static void NAME##_next(T *restrict o, const T *restrict b,     \
                                      int64_t n, RedOp op) {                  \
    for (int64_t i = 0; i < n; i++) {                                         \
      T x = o[i], y = b[i];                                                   \
      o[i] = op == RED_SUM ? (T)((U)x + (U)y)                                 \
             : op == RED_MAX ? (x > y ? x : y) : (x < y ? x : y);             \
    }                                                                         \
  }

INT_FOLDS(int8_t, uint8_t, fold_i8)
INT_FOLDS(int32_t, uint32_t, fold_i32)
INT_FOLDS(int64_t, uint64_t, fold_i64)

#pragma GCC pop_options

/* o = a (op) b over [n] contiguous elements; o, a, b do not overlap. */
static void red_first(const RedArg *r, char *o, const char *a, const char *b,
                      int64_t n) {
  switch (r->dtype) {
  case DT_F32: fold_f32_first((float *)o, (const float *)a, (const float *)b, n, r->op); break;
  case DT_F64: fold_f64_first((double *)o, (const double *)a, (const double *)b, n, r->op); break;
  case DT_I8: fold_i8_first((int8_t *)o, (const int8_t *)a, (const int8_t *)b, n, r->op); break;
  case DT_I32: fold_i32_first((int32_t *)o, (const int32_t *)a, (const int32_t *)b, n, r->op); break;
  case DT_I64: fold_i64_first((int64_t *)o, (const int64_t *)a, (const int64_t *)b, n, r->op); break;
  default:  /* bool, f16, bf16: the scalar rules */
    memcpy(o, a, (size_t)n * dt_size(r->dtype));
    inner_reduce(o, b, n, 1, 1, r);
    break;
  }
}

/* o = o (op) b over [n] contiguous elements; o and b do not overlap. */
static void red_next(const RedArg *r, char *o, const char *b, int64_t n) {
  switch (r->dtype) {
  case DT_F32: fold_f32_next((float *)o, (const float *)b, n, r->op); break;
  case DT_F64: fold_f64_next((double *)o, (const double *)b, n, r->op); break;
  case DT_I8: fold_i8_next((int8_t *)o, (const int8_t *)b, n, r->op); break;
  case DT_I32: fold_i32_next((int32_t *)o, (const int32_t *)b, n, r->op); break;
  case DT_I64: fold_i64_next((int64_t *)o, (const int64_t *)b, n, r->op); break;
  default: inner_reduce(o, b, n, 1, 1, r); break;
  }
}

/* ---- the reference path's gathered global array ------------------------------ */

/* All participants' operand [k] stacked into one contiguous buffer,
 * participant-major: global[q] is participant q's block, row-major. */
/* Operand [k] of participant [q] (its position) of collective [c]. */
static Array *peer_in(const Call *c, int q, int k) {
  if (c->xin) return c->xin[q * c->desc.nin + k];
  return c->g->slots[c->peers[q]].in[k];
}

typedef struct Global {
  char *data;
  size_t nbytes;
  int64_t block;                  /* elements per participant */
  View blockview;                 /* shape of one block, contiguous strides */
} Global;

static int global_gather(Global *gl, const Call *c, int k) {
  const Array *mine = c->in[k];
  size_t es = dt_size(mine->dtype);
  gl->block = mine->size;
  gl->nbytes = (size_t)gl->block * es * (size_t)c->n;
  gl->data = shm_buf_alloc(gl->nbytes ? gl->nbytes : 1);
  if (!gl->data) return err_nomem(), -1;
  for (int q = 0; q < c->n; q++) {
    View src, dst;
    view_of(&src, peer_in(c, q, k));
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
  if (params_get(p, "axis_size") && params_get(p, "axis_size") != VAL_NONE)
    return param_int(prim, p, "axis_size", 1, n);
  DevCtx *ctx = dev_ctx();
  if (!ctx || !ctx->mesh)
    return err_set(ERR_VALUE, "%s needs its axis_size parameter outside a "
                   "shard_map body", prim), -1;
  int axes[DEV_MAX_AXES], na, gsize;
  if (ctx_axes(ctx, prim, p, axes, &na) < 0) return -1;
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
bool coll_axes_mask(const Params *p, uint32_t *mask) {
  DevCtx *ctx = dev_ctx();
  int axes[DEV_MAX_AXES], na;
  if (!ctx || !ctx->mesh) return false;
  /* the vma rule runs before every collective's kernel, and a loop
   * repeating one passes the names the device's memo resolved last */
  if (ctx->group && ctx->mesh == &ctx->group->mesh) {
    AxesMemo *am = &ctx->group->slots[ctx->rank].axes_memo;
    if (axes_memo_hit(am, axis_param(p))) {
      *mask = am->mask;
      return true;
    }
  }
  if (ctx_axes(ctx, "collective", p, axes, &na) < 0) {
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
  uint32_t m, u = vma_union(in, nin);
  if (!u || groups_param(p) || !coll_axes_mask(p, &m)) return u;
  return u & ~m;
}

/* ppermute, all_to_all, psum_scatter, ragged_all_to_all: the axes are added. */
static uint32_t vma_add(const uint32_t *in, int nin, const Params *p) {
  uint32_t m = 0;
  coll_axes_mask(p, &m);
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
  if (ctx_axes(ctx, "axis_index", p, axes, &na) < 0) return -1;
  *(int32_t *)arr_data(out[0]) = flat_index(ctx->mesh, axes, na, ctx->coords);
  return 0;
}

uint32_t coll_vma_axis_index(const uint32_t *in, int nin, const Params *p) {
  uint32_t m = 0;
  (void)in, (void)nin;
  coll_axes_mask(p, &m);
  return m;
}

/* ---- psum, pmax, pmin ------------------------------------------------------------ */

static int shape_same(const AVal *in, int nin, AVal *out) {
  if (nin != 1) return err_set(ERR_TYPE, "expected one operand"), -1;
  aval_copy(out, &in[0]);
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

static Array *peer_out(const Call *c, int q) {
  return c->g->slots[c->peers[q]].out[0];
}

/* Small reductions: every participant folds all operands itself, in
 * participant order (the same bits everywhere), saving the barrier that
 * splitting the work needs; a barrier costs more than the arithmetic.
 * Strided fallback for outputs that are not contiguous. */
static bool fold_flat(const Call *c, const RedArg *r);

static void fold_all(const Call *c, const RedArg *r) {
  if (fold_flat(c, r)) return;
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

/* Whether [a] is a run of memory apart from the [bytes] at [o]. */
static bool flat_apart(const Array *a, const char *o, size_t bytes) {
  const char *p = arr_data(a);
  return (a->contiguous || a->ndim == 0) &&
         (p + (size_t)a->size * dt_size(a->dtype) <= o || o + bytes <= p);
}

/* fold_all when the output and every operand are runs of memory apart
 * from each other: the contiguous folds (red_first, red_next: the same
 * bits as the views' inner_reduce) without setting up views, which is
 * most of a small collective's fold.  False when it does nothing. */
static bool fold_flat(const Call *c, const RedArg *r) {
  Array *out = c->out[0];
  char *o = arr_data(out);
  int64_t n = out->size;
  size_t bytes = (size_t)n * dt_size(out->dtype);
  if (c->n < 2 || !(out->contiguous || out->ndim == 0)) return false;
  for (int q = 0; q < c->n; q++)
    if (!flat_apart(peer_in(c, q, 0), o, bytes) || peer_in(c, q, 0)->size != n) return false;
  red_first(r, o, arr_data(peer_in(c, 0, 0)), arr_data(peer_in(c, 1, 0)), n);
  for (int q = 2; q < c->n; q++) red_next(r, o, arr_data(peer_in(c, q, 0)), n);
  return true;
}

/* Strided fallback of fast_reduce: reduce-scatter into the own output,
 * a barrier, then an all-gather copy from the peers' outputs. */
static void reduce_strided(const Call *c, const RedArg *r) {
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
}

/* [n] elements of size [es] at element stride [st] from [src] into [dst]. */
static void read_run(char *dst, const char *src, int64_t n, int64_t st,
                     size_t es) {
  if (st == 1) {
    memcpy(dst, src, (size_t)n * es);
  } else if (st == 0 && n > 0) {
    /* a broadcast (ones(), full()): fill by doubling copies */
    size_t have = es, want = (size_t)n * es;
    memcpy(dst, src, es);
    for (; have < want; have *= 2)
      memcpy(dst + have, dst, have < want - have ? have : want - have);
  } else if (es == 4) {
    for (int64_t i = 0; i < n; i++)
      memcpy(dst + i * 4, src + i * st * 4, 4);
  } else if (es == 8) {
    for (int64_t i = 0; i < n; i++)
      memcpy(dst + i * 8, src + i * st * 8, 8);
  } else {
    for (int64_t i = 0; i < n; i++)
      memcpy(dst + i * (int64_t)es, src + i * st * (int64_t)es, es);
  }
}

/* Elements [lo, lo + len) (row-major) of [a], contiguous or not, into
 * [dst]: a non-contiguous operand (a broadcast, a transpose) is read into
 * a contiguous chunk first, so the fold loops stay contiguous. */
static void read_flat(char *dst, const Array *a, int64_t lo, int64_t len) {
  size_t es = dt_size(a->dtype);
  int nd = a->ndim;
  int64_t idx[SHM_MAXDIM];
  unravel(lo, nd, a->shape, idx);
  const char *base = arr_data(a);
  int64_t inner = a->shape[nd - 1], st = a->strides[nd - 1];
  while (len > 0) {
    int64_t off = 0;
    for (int d = 0; d < nd; d++) off += idx[d] * a->strides[d];
    int64_t run = inner - idx[nd - 1];
    if (run > len) run = len;
    read_run(dst, base + off * (int64_t)es, run, st, es);
    dst += run * (int64_t)es;
    len -= run;
    idx[nd - 1] += run;
    for (int d = nd - 1; d > 0 && idx[d] == a->shape[d]; d--) {
      idx[d] = 0;
      idx[d - 1]++;
    }
  }
}

/* Contiguous operand of chunk [lo, lo + len) of [a]: a pointer into a
 * contiguous array, else the chunk read into [scratch]. */
static const char *chunk_of(const Array *a, int64_t lo, int64_t len,
                            char *scratch) {
  if (a->contiguous || a->ndim == 0)
    return (const char *)arr_data(a) + lo * (int64_t)dt_size(a->dtype);
  read_flat(scratch, a, lo, len);
  return scratch;
}

/* Fold of chunk [lo, lo + len) of every participant's operand, in
 * participant order, into [acc] (len elements). */
static void fold_chunk(const Call *c, const RedArg *r, char *acc, int64_t lo,
                       int64_t len, char *scratch) {
  size_t es = dt_size(r->dtype);
  const char *a = chunk_of(peer_in(c, 0, 0), lo, len, scratch);
  int q = 1;
  if (c->n == 1 || a == scratch) {
    memcpy(acc, a, (size_t)len * es);  /* the scratch is needed again */
  } else {
    red_first(r, acc, a, chunk_of(peer_in(c, 1, 0), lo, len, scratch), len);
    q = 2;
  }
  for (; q < c->n; q++)
    red_next(r, acc, chunk_of(peer_in(c, q, 0), lo, len, scratch), len);
}

/* Elements [lo, hi), a chunk at a time, folded into a buffer that stays
 * in L1 and copied from there into [dst]: the own output for a small
 * reduction that each participant folds whole, the first participant's
 * output (which every participant then shares, share_output) for a split
 * one, or with [dst] NULL every participant's output.  The all-gather is
 * thus one write per output and needs no barrier of its own (the final
 * barrier publishes the writes).  Copying out of a hot buffer, rather
 * than folding into the output, lets memcpy's string stores skip reading
 * the output lines. */
static void fold_range(const Call *c, const RedArg *r, int64_t lo, int64_t hi,
                       Array *dst) {
  _Alignas(64) char scratch[COLL_CHUNK_BYTES], acc[COLL_CHUNK_BYTES];
  size_t es = dt_size(r->dtype);
  int64_t chunk = COLL_CHUNK_BYTES / (int64_t)es;
  for (int64_t i = lo; i < hi; i += chunk) {
    int64_t len = hi - i < chunk ? hi - i : chunk;
    fold_chunk(c, r, acc, i, len, scratch);
    for (int q = 0; q < (dst ? 1 : c->n); q++)
      memcpy((char *)arr_data(dst ? dst : peer_out(c, q)) + i * (int64_t)es, acc,
             (size_t)len * es);
  }
}

/* Whether a split reduction leaves one buffer shared by all participants:
 * when their payloads are not inline (the same answer on every
 * participant: the outputs have one shape and dtype). */
static bool can_share(const Call *c) { return !c->xin && c->out[0]->buf->owned; }

/* After a split reduction into the first participant's output: every
 * other participant's output becomes a view of that buffer, taking its
 * reference before the final barrier, so the first participant never
 * sees its result unshared and overwrites it in place. */
static void share_output(const Call *c) {
  if (c->pos != 0) arr_share_buffer(c->out[0], peer_out(c, 0));
}

/* Start of participant q's part of [size] elements: cache-line aligned,
 * so no two participants write one line of an output. */
static int64_t part_start(int64_t size, size_t es, int q, int n) {
  if (q == n) return size;
  int64_t line = 64 / (int64_t)es;
  int64_t lo = size * q / n;
  return lo - lo % line;
}

/* Participant pos folds its part of every operand, in participant order,
 * and writes it into every participant's output (reduce-scatter and
 * all-gather in one pass); small reductions are folded whole by each. */
static int fast_reduce(const Call *c, const RedArg *r) {
  bool contiguous = true;
  for (int q = 0; q < c->n; q++)
    contiguous = contiguous && (peer_out(c, q)->contiguous ||
                                peer_out(c, q)->ndim == 0);
  int64_t size = c->out[0]->size;
  bool small = size * c->n <= COLL_SMALL_REDUCE;
  if (!contiguous && small)
    fold_all(c, r);
  else if (!contiguous)
    reduce_strided(c, r);
  else if (small)
    fold_range(c, r, 0, size, c->out[0]);
  else {
    bool share = can_share(c);
    fold_range(c, r, part_start(size, dt_size(r->dtype), c->pos, c->n),
               part_start(size, dt_size(r->dtype), c->pos + 1, c->n),
               share ? peer_out(c, 0) : NULL);
    if (share) share_output(c);
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

/* Participant q's operand in a lane reduction: the caller's own from its
 * operand when contiguous (the same bytes as its lane, which may live on
 * the line peers poll: reading it could wait for that line to come back),
 * else the lane. */
static const char *lane_src(const Call *c, int q, size_t bytes) {
  const Array *x = c->in[0];
  if (q == c->pos && (x->contiguous || x->ndim == 0)) return arr_data(x);
  return lane_data(&c->g->slots[c->peers[q]], (int)(c->seq % 2), bytes);
}

/* A lane reduction: every participant folds the operands copied into the
 * participants' lanes, in participant order, into its own output. */
static void lane_reduce(const Call *c, const RedArg *r) {
  _Alignas(64) char acc[COLL_LANE_BYTES];
  Array *o = c->out[0];
  int64_t n = o->size;
  size_t bytes = (size_t)n * dt_size(o->dtype);
  red_first(r, acc, lane_src(c, 0, bytes), lane_src(c, 1, bytes), n);
  for (int q = 2; q < c->n; q++) red_next(r, acc, lane_src(c, q, bytes), n);
  if (o->contiguous || o->ndim == 0) {
    memcpy(arr_data(o), acc, (size_t)n * dt_size(o->dtype));
    return;
  }
  View dst, from;
  view_of(&dst, o);
  from = dst;
  from.base = acc;
  for (int d = dst.ndim - 1, st = 1; d >= 0; st *= (int)dst.shape[d], d--)
    from.strides[d] = st;
  view_copy(&dst, &from);
}

static int x_fold_all(const Call *c, const void *r) {
  fold_all(c, r);
  return 0;
}

/* ---- reductions across processes: reduce-scatter, then all-gather ------------ */

/* Reductions across processes of at least this many bytes go by
 * reduce-scatter and all-gather between the processes (x_reduce): each
 * process receives a 1/P chunk of the operands and sends a 1/P chunk of
 * the result, as MPI_Allreduce's ring does.  Smaller ones send every
 * operand to every process (x_exchange): one round of messages. */
#define COLL_XRS_BYTES 32768

/* Which reduction takes the reduce-scatter path: the same answer on
 * every process, as it depends on the descriptor (dtype, shape) alone. */
static bool x_reduce_split(const Call *c) {
  return (size_t)c->in[0]->size * dt_size(c->in[0]->dtype) >= COLL_XRS_BYTES;
}

/* The reduce-scatter plan of collective [c], the same on every process.
 * Process procs[k] owns elements [lo[k], lo[k + 1]) of the result.  The
 * first plen participants live on one process (the first participant's),
 * which folds them before sending: the fold stays in participant order,
 * ((d0 + d1) + d2) + d3, so the bits are a one-process run's. */
typedef struct XPlan {
  int np, me;                     /* processes holding participants; this one's index */
  int *procs;                     /* [np] increasing */
  int64_t *lo;                    /* [np + 1] element bounds, cut at cache lines */
  int plen;                       /* participants folded before sending */
  size_t es;                      /* element size */
} XPlan;

/* Fills [x] (its arrays from [procs] [n + 1] and [lo] [n + 2]). */
static void x_plan(const Call *c, XPlan *x, int *procs, int64_t *lo) {
  CollGroup *g = c->g;
  int me = transport_rank();
  x->procs = procs;
  x->np = x_procs(c, procs + 1) + 1;
  procs[0] = me;
  for (int j = 1; j < x->np && procs[j - 1] > procs[j]; j++) {   /* me into order */
    int t = procs[j]; procs[j] = procs[j - 1]; procs[j - 1] = t;
  }
  for (x->me = 0; procs[x->me] != me; x->me++) {}
  x->es = dt_size(c->in[0]->dtype);
  x->lo = lo;
  for (int k = 0; k <= x->np; k++) lo[k] = part_start(c->in[0]->size, x->es, k, x->np);
  int p0 = x_proc(g, c->peers[0]);
  for (x->plen = 1; x->plen < c->n && x_proc(g, c->peers[x->plen]) == p0; x->plen++) {}
}

/* The participants whose pieces process [proc] sends to each owner, in
 * participant order, into [qs]; their number.  Position 0 stands for the
 * folded prefix (participants 0 .. plen - 1). */
static int x_pieces(const Call *c, const XPlan *x, int proc, int *qs) {
  int m = 0;
  for (int q = 0; q < c->n; q++)
    if ((q == 0 || q >= x->plen) && x_proc(c->g, c->peers[q]) == proc) qs[m++] = q;
  return m;
}

/* dst[0 .. len) = src[0] (op) src[1] (op) ... src[m - 1], left to right,
 * a cache-sized chunk at a time (dst stays in L1 across the operands).
 * src[0] may be dst itself; no other source overlaps dst. */
static void x_fold_pieces(const RedArg *r, char *dst, const char *const *src, int m,
                          int64_t len) {
  size_t es = dt_size(r->dtype);
  int64_t step = COLL_CHUNK_BYTES / (int64_t)es;
  for (int64_t i = 0; i < len; i += step) {
    int64_t k = len - i < step ? len - i : step;
    size_t off = (size_t)i * es;
    int q = 1;
    if (src[0] != dst && m == 1)
      memcpy(dst + off, src[0] + off, (size_t)k * es);
    else if (src[0] != dst) {
      red_first(r, dst + off, src[0] + off, src[1] + off, k);
      q = 2;
    }
    for (; q < m; q++) red_next(r, dst + off, src[q] + off, k);
  }
}

/* State of one leader's x_reduce. */
typedef struct XReduce {
  const Call *c;
  const RedArg *r;
  XPlan x;
  char *res;                      /* the result, contiguous (the leader slot's xres) */
  const char **op;                /* [n]: local participants' contiguous data */
  Array **copies;                 /* [n]: contiguous copies made for op */
  const char **from;              /* [n]: piece of each participant for this
                                     process's chunk */
  char *scratch;                  /* received pieces */
  size_t scratch_bytes;
  char *h;                        /* the header sent (x_wire_cap) */
  void **reqs;                    /* [2 * np]: pieces sent, then the chunk sent */
  int nreqs;
} XReduce;

/* This process's piece of participant [q] (0: the prefix) at element [lo]. */
static const char *x_own_piece(const XReduce *s, int q, int64_t lo) {
  const char *base = q == 0 && s->x.plen > 1 ? s->res : s->op[q];
  return base + (size_t)lo * s->x.es;
}

/* Sends the header, then to every other process its chunk of this
 * process's pieces. */
static void x_reduce_send(XReduce *s, const XLocal *lc) {
  const Call *c = s->c;
  int qs[c->n], m = x_pieces(c, &s->x, transport_rank(), qs);
  int key = x_key(c->g, c->seq, c->peers[0]);
  TransportIov hv = {s->h, x_header_pack(s->h, c, lc, 0)}, iov[c->n];
  for (int k = 0; k < s->x.np; k++) {
    if (k == s->x.me) continue;
    int64_t lo = s->x.lo[k], len = s->x.lo[k + 1] - lo;
    for (int i = 0; i < m; i++)
      iov[i] = (TransportIov){(void *)x_own_piece(s, qs[i], lo), (size_t)len * s->x.es};
    int p = s->x.procs[k];
    s->reqs[s->nreqs++] = transport_isend(p, transport_tag(TRANSPORT_HEADER, key), &hv, 1);
    s->reqs[s->nreqs++] = transport_isend(p, transport_tag(TRANSPORT_DATA, key), iov, m);
  }
}

/* Receives every other process's header and its pieces of this process's
 * chunk (the prefix straight into the result), filling s->from. */
static int x_reduce_gather(XReduce *s) {
  const Call *c = s->c;
  int key = x_key(c->g, c->seq, c->peers[0]), qs[c->n];
  int64_t lo = s->x.lo[s->x.me];
  size_t bytes = (size_t)(s->x.lo[s->x.me + 1] - lo) * s->x.es;
  char *next = s->scratch;
  for (int k = 0; k < s->x.np; k++) {
    int p = s->x.procs[k], m = x_pieces(c, &s->x, p, qs);
    if (k == s->x.me) {
      for (int i = 0; i < m; i++) s->from[qs[i]] = x_own_piece(s, qs[i], lo);
      continue;
    }
    TransportMsg *hm = x_wait_header(c, p, transport_tag(TRANSPORT_HEADER, key));
    if (!hm) return -1;
    XHeader h;
    int rc = x_header_read(hm, &h) < 0 ? -1
             : desc_equal(&h.desc, &c->desc)
                 ? 0 : mismatch_error(c->g, c->rank, &c->desc, h.ranks[0], &h.desc);
    transport_msg_free(hm);
    if (rc < 0) return -1;
    TransportIov iov[c->n];
    for (int i = 0; i < m; i++) {
      char *at = qs[i] == 0 ? s->res + (size_t)lo * s->x.es : (next += bytes) - bytes;
      s->from[qs[i]] = at;
      iov[i] = (TransportIov){at, bytes};
    }
    if (transport_recv_data(p, transport_tag(TRANSPORT_DATA, key), iov, m) < 0) return -1;
  }
  return 0;
}

/* Folds this process's chunk from every piece, in participant order,
 * sends it to every other process and receives theirs into the result. */
static int x_reduce_fold(XReduce *s) {
  const Call *c = s->c;
  const XPlan *x = &s->x;
  int m = 0, key = x_key(c->g, c->seq, c->peers[0]), tag = transport_tag(TRANSPORT_DATA, key);
  const char *src[c->n];
  for (int q = 0; q < c->n; q++)
    if (q == 0 || q >= x->plen) src[m++] = s->from[q];
  int64_t lo = x->lo[x->me], len = x->lo[x->me + 1] - lo;
  char *mine = s->res + (size_t)lo * x->es;
  x_fold_pieces(s->r, mine, src, m, len);
  TransportIov v = {mine, (size_t)len * x->es};
  int sent = s->nreqs;
  for (int k = 0; k < x->np; k++)
    if (k != x->me) s->reqs[s->nreqs++] = transport_isend(x->procs[k], tag, &v, 1);
  /* the pieces sent came from the result's other chunks: done before
   * those are overwritten */
  transport_wait_sends(s->reqs, sent);
  for (int k = 0; k < x->np; k++) {
    if (k == x->me) continue;
    TransportIov in = {s->res + (size_t)x->lo[k] * x->es,
                       (size_t)(x->lo[k + 1] - x->lo[k]) * x->es};
    if (x_wait_data(c, x->procs[k], tag, &in, 1) < 0) return -1;
  }
  return 0;
}

/* The result's buffer: the leader's output when contiguous, else an
 * array of its own; NULL when out of memory. */
static Array *x_result(const Call *c) {
  Array *o = c->out[0];
  if (o->contiguous || o->ndim == 0) return o;
  return arr_new(o->dtype, o->ndim, o->shape);
}

/* The leader's exchange of a large reduction (an XExchange; arg: the
 * RedArg): the operands' chunks to their owners, the owners' folded
 * chunks back, into the leader slot's xres. */
static int x_reduce(const Call *c, const XLocal *lc, const void *arg) {
  Slot *me = &c->g->slots[c->rank];
  int n = c->n, procs[n + 1];
  int64_t lo[n + 2];
  XReduce s = {.c = c, .r = arg};
  x_plan(c, &s.x, procs, lo);
  size_t chunk = (size_t)(lo[s.x.me + 1] - lo[s.x.me]) * s.x.es;
  me->xres = x_result(c);
  s.op = shm_calloc((size_t)n, sizeof(char *));
  s.copies = shm_calloc((size_t)n, sizeof(Array *));
  s.from = shm_calloc((size_t)n, sizeof(char *));
  s.reqs = shm_calloc((size_t)(3 * s.x.np), sizeof(void *));
  s.scratch_bytes = chunk * (size_t)n + 1;
  s.scratch = shm_buf_alloc(s.scratch_bytes);
  s.h = shm_malloc(x_wire_cap(lc->n));
  int rc = me->xres && s.op && s.copies && s.from && s.reqs && s.scratch && s.h
               ? 0 : (err_nomem(), -1);
  for (int q = 0; rc == 0 && q < n; q++) {
    if (!x_local(c->g, c->peers[q])) continue;
    Array *a = c->g->slots[c->peers[q]].in[0];
    if (!a->contiguous && a->ndim > 0 && !(a = s.copies[q] = arr_contiguous(a))) rc = -1;
    else s.op[q] = arr_data(a);
  }
  if (rc == 0) {
    s.res = arr_data(me->xres);
    if (x_proc(c->g, c->peers[0]) == transport_rank() && s.x.plen > 1)
      x_fold_pieces(s.r, s.res, s.op, s.x.plen, c->in[0]->size);   /* the prefix */
    x_reduce_send(&s, lc);
    rc = x_reduce_gather(&s);
    if (rc == 0) rc = x_reduce_fold(&s);
  }
  x_wait_sends(c, s.reqs, s.nreqs, rc);
  for (int q = 0; s.copies && q < n; q++) val_decref(s.copies[q] ? &s.copies[q]->hdr : NULL);
  shm_free(s.op), shm_free(s.copies), shm_free(s.from), shm_free(s.reqs), shm_free(s.h);
  if (s.scratch) shm_buf_free(s.scratch, s.scratch_bytes);
  return rc;
}

/* Every local participant's output from the leader's result: shared, or
 * copied when either payload is inline or the output is not contiguous. */
static int x_take_result(const Call *c, const void *arg) {
  (void)arg;
  int lead = 0;
  while (!x_local(c->g, c->peers[lead])) lead++;
  Array *res = c->g->slots[c->peers[lead]].xres, *o = c->out[0];
  if (o == res || ((o->contiguous || o->ndim == 0) && arr_share_buffer(o, res))) return 0;
  View dst, src;
  view_of(&dst, o);
  view_of(&src, res);
  view_copy(&dst, &src);
  return 0;
}

/* Semantics: jax.lax.psum / pmax / pmin with axis_index_groups. */
static int reduce_kernel(CollKind kind, RedOp op, Array **in, const Params *p,
                         Array **out) {
  Call c;
  if (call_init(&c, kind, p, in, 1, out) < 0) return -1;
  if (c.cross) {
    RedArg r = {in[0]->dtype, op};
    if (x_reduce_split(&c)) return x_run(&c, x_reduce, x_take_result, &r);
    return x_run(&c, x_exchange, x_fold_all, &r);
  }
  bool lane = uses_lane(&c, in[0]);
  if (lane) lane_write(&c, in[0]);
  if (rendezvous(&c) < 0) return -1;
  RedArg r = {in[0]->dtype, op};
  if (lane) {
    lane_reduce(&c, &r);
    finish(&c);
    return 0;
  }
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

/* The length along the gathered dimension of a block of operand [in]. */
static int64_t gather_len(const Array *in, const GatherArgs *a) {
  return a->tiled ? in->shape[a->dim] : 1;
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

/* Each participant copies its own block into the first participant's
 * output, which all of them then share (share_output; the final barrier
 * publishes the writes): the output is written once in all, where a copy
 * of every block into every output writes it n times (n^2 blocks, 1 GiB
 * for 16 MiB blocks on 8 devices).  Inline (small) outputs cannot be
 * shared: each participant then copies every block into its own. */
static int fast_gather(const Call *c, const GatherArgs *a) {
  bool shared = can_share(c) && peer_out(c, 0)->contiguous;
  Array *out = shared ? peer_out(c, 0) : c->out[0];
  int from = shared ? c->pos : 0, to = shared ? c->pos + 1 : c->n;
  for (int q = from; q < to; q++) {
    View src, dst;
    view_of(&src, peer_in(c, q, 0));
    gather_dst(&dst, out, a, q, a->tiled ? src.shape[a->dim] : 1);
    view_copy(&dst, &src);
  }
  if (shared) share_output(c);
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
  if (c->cross) return x_run(c, x_exchange, fast, arg);
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

/* Where participant [q]'s block of the leader's all_gather goes in its
 * result (x_gather: a run of memory). */
static char *x_gather_at(const Call *c, int q) {
  const Slot *me = &c->g->slots[c->rank];
  View dst;
  gather_dst(&dst, me->xres, me->xgather, q, gather_len(c->in[0], me->xgather));
  return dst.base;
}

/* The leader's exchange of an all_gather (an XExchange; arg: the
 * GatherArgs): x_exchange's messages (each block once to each process),
 * received straight into the leader's output when it is contiguous, its
 * blocks are runs of memory, and every local output can share it (else
 * into proxies, as for other collectives). */
static int x_gather(const Call *c, const XLocal *lc, const void *arg) {
  const GatherArgs *a = arg;
  Slot *me = &c->g->slots[c->rank];
  Array *o = c->out[0];
  int64_t outer = 1;
  for (int d = 0; d < a->dim; d++) outer *= o->shape[d];
  bool direct = o->contiguous && o->ndim > 0 && outer == 1;
  for (int l = 0; direct && l < lc->n; l++) direct = c->g->slots[lc->peers[l]].out[0]->buf->owned;
  if (direct) me->xres = o, me->xgather = a;
  int rc = x_exchange(c, lc, arg);
  me->xgather = NULL;
  return rc;
}

/* Every local participant's part after x_gather: its own block into the
 * leader's output, which its output then shares (the final barrier
 * publishes the writes); fast_gather from the proxies otherwise. */
static int x_gather_local(const Call *c, const void *arg) {
  const GatherArgs *a = arg;
  int lead = 0;
  while (!x_local(c->g, c->peers[lead])) lead++;
  Array *res = c->g->slots[c->peers[lead]].xres;
  if (!res) return fast_gather(c, a);
  View src, dst;
  view_of(&src, c->in[0]);
  gather_dst(&dst, res, a, c->pos, gather_len(c->in[0], a));
  view_copy(&dst, &src);
  if (c->out[0] != res) arr_share_buffer(c->out[0], res);
  return 0;
}

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
  if (c.cross) return x_run(&c, x_gather, x_gather_local, &a);
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

typedef struct XScatter {
  const GatherArgs *a;
  const RedArg *r;
} XScatter;

static int x_scatter(const Call *c, const void *arg) {
  const XScatter *xs = arg;
  return fast_scatter(c, xs->a, xs->r);
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
  RedArg r = {in[0]->dtype, RED_SUM};
  if (c.cross) {
    XScatter xs = {&a, &r};
    return x_run(&c, x_exchange, x_scatter, &xs);
  }
  if (rendezvous(&c) < 0) return -1;
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
  Value *perm = params_get(p, "perm");
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

/* Where output [o] takes participant q's slice: along the concat axis,
 * [q * chunk_c, (q + 1) * chunk_c), or q when not tiled (that axis kept,
 * of size 1: row-major, the same elements in the same order as the
 * slice x_a2a_slice takes). */
static void a2a_dst(View *dst, const Array *o, const A2AArgs *a, int q) {
  view_of(dst, o);
  if (a->tiled)
    view_slice(dst, a->concat, q * a->chunk_c, a->chunk_c);
  else
    view_slice(dst, a->concat, q, 1);
}

/* This device's output's block from participant [q]. */
static void a2a_copy(const Call *c, const A2AArgs *a, int q) {
  View src, dst;
  view_of(&src, peer_in(c, q, 0));
  a2a_dst(&dst, c->out[0], a, q);
  if (a->tiled) {
    view_slice(&src, a->split, c->pos * a->b, a->b);
  } else {
    view_slice(&src, a->split, c->pos, 1);
    view_drop(&src, a->split);
    view_drop(&dst, a->concat);
  }
  view_copy(&dst, &src);
}

static int fast_a2a(const Call *c, const void *arg) {
  for (int q = 0; q < c->n; q++) a2a_copy(c, arg, q);
  return 0;
}

/* Across processes (x_a2a): the blocks from the local participants; the
 * leader received the others' into the outputs. */
static int x_a2a_local(const Call *c, const void *arg) {
  for (int q = 0; q < c->n; q++)
    if (x_local(c->g, c->peers[q])) a2a_copy(c, arg, q);
  return 0;
}

/* ---- all_to_all across processes: each process gets only its slices ---------- */

/* Slice [p] of operand [a] (what participant p takes of it): along the
 * split axis, [p * b, (p + 1) * b) with b = 1 when not tiled. */
static void x_a2a_slice(View *v, const Array *a, const A2AArgs *g, int p) {
  int64_t b = g->tiled ? g->b : 1;
  view_of(v, a);
  view_slice(v, g->split, p * b, b);
}

/* Whether slices of a contiguous array of [a]'s shape are contiguous
 * runs of memory (nothing before the split axis): they are then sent
 * from, and received into, the arrays themselves. */
static bool x_a2a_runs(const Array *a, const A2AArgs *g) {
  int64_t outer = 1;
  for (int d = 0; d < g->split; d++) outer *= a->shape[d];
  return outer == 1;
}

/* Whether [a]'s own slices are such runs. */
static bool x_a2a_flat(const Array *a, const A2AArgs *g) {
  return (a->contiguous || a->ndim == 0) && x_a2a_runs(a, g);
}

/* [v] made a row-major view of its own shape over [buf]. */
static void x_packed(View *v, char *buf) {
  v->base = buf;
  for (int d = v->ndim - 1, st = 1; d >= 0; st *= (int)v->shape[d], d--) v->strides[d] = st;
}

/* The positions of process [proc]'s participants, in order, into [pos]; their number. */
static int x_positions(const Call *c, int proc, int *pos) {
  int m = 0;
  for (int q = 0; q < c->n; q++)
    if (x_proc(c->g, c->peers[q]) == proc) pos[m++] = q;
  return m;
}

/* State of one leader's x_a2a. */
typedef struct XA2A {
  const Call *c;
  const A2AArgs *a;
  size_t slice;                   /* bytes of one slice */
  Array **tab;                    /* the leader slot's xin */
  char **packs;                   /* [np]: packed slices sent, or received */
  size_t *pack_bytes;
  void **reqs;                    /* [2 * np] */
  int nreqs;
} XA2A;

/* Sends the header, then to each other process procs[i] the slices its
 * participants take of this process's operands (local participant-major). */
static int x_a2a_send(XA2A *s, const XLocal *lc, char *h, const int *procs, int np) {
  const Call *c = s->c;
  int key = x_key(c->g, c->seq, c->peers[0]), pos[c->n];
  TransportIov hv = {h, x_header_pack(h, c, lc, 0)};
  for (int i = 0; i < np; i++) {
    int m = x_positions(c, procs[i], pos), k = 0;
    TransportIov iov[lc->n * m + 1];
    char *pack = NULL;
    for (int l = 0; l < lc->n; l++) {
      const Array *op = c->g->slots[lc->peers[l]].in[0];
      bool flat = x_a2a_flat(op, s->a);
      if (!flat && !pack) {
        s->pack_bytes[i] = s->slice * (size_t)(lc->n * m) + 1;
        if (!(pack = s->packs[i] = shm_buf_alloc(s->pack_bytes[i]))) return err_nomem(), -1;
      }
      for (int j = 0; j < m; j++, k++) {
        View v;
        x_a2a_slice(&v, op, s->a, pos[j]);
        char *at = flat ? v.base : pack + s->slice * (size_t)k;
        if (!flat) {
          View dst = v;
          x_packed(&dst, at);
          view_copy(&dst, &v);
        }
        iov[k] = (TransportIov){at, s->slice};
      }
    }
    s->reqs[s->nreqs++] = transport_isend(procs[i], transport_tag(TRANSPORT_HEADER, key), &hv, 1);
    s->reqs[s->nreqs++] = transport_isend(procs[i], transport_tag(TRANSPORT_DATA, key), iov, k);
  }
  return 0;
}

/* Receives process [proc]'s header and the slices of its participants'
 * operands that this process's participants [lc] take, straight into
 * their outputs where the block is a run of memory, else through a
 * buffer. */
static int x_a2a_recv(XA2A *s, const XLocal *lc, int proc, int i) {
  const Call *c = s->c;
  int key = x_key(c->g, c->seq, c->peers[0]);
  TransportMsg *m = x_wait_header(c, proc, transport_tag(TRANSPORT_HEADER, key));
  if (!m) return -1;
  XHeader h;
  if (x_header_read(m, &h) < 0) {
    transport_msg_free(m);
    return -1;
  }
  int nr = h.nloc, rs[nr], k = 0;
  memcpy(rs, h.ranks, sizeof(int) * (size_t)nr);
  int rc = desc_equal(&h.desc, &c->desc)
               ? 0 : mismatch_error(c->g, c->rank, &c->desc, rs[0], &h.desc);
  transport_msg_free(m);
  if (rc < 0) return -1;
  TransportIov iov[nr * lc->n + 1];
  bool flat[lc->n];
  for (int l = 0; l < lc->n; l++) {
    const Array *o = c->g->slots[lc->peers[l]].out[0];
    int64_t outer = 1;
    for (int d = 0; d < s->a->concat; d++) outer *= o->shape[d];
    flat[l] = (o->contiguous || o->ndim == 0) && outer == 1;
    if (!flat[l] && !s->packs[i]) {
      s->pack_bytes[i] = s->slice * (size_t)(nr * lc->n) + 1;
      if (!(s->packs[i] = shm_buf_alloc(s->pack_bytes[i]))) return err_nomem(), -1;
    }
  }
  int qs[nr > 0 ? nr : 1];
  for (int r = 0; r < nr; r++) {
    int q = 0;
    while (q < c->n && c->peers[q] != rs[r]) q++;
    if (q == c->n) return err_set(ERR_COLLECTIVE, "collective mismatch: another process "
                                  "sent operands for devices outside this group"), -1;
    qs[r] = q;
    for (int l = 0; l < lc->n; l++, k++) {
      View dst;
      a2a_dst(&dst, c->g->slots[lc->peers[l]].out[0], s->a, q);
      iov[k] = (TransportIov){flat[l] ? dst.base : s->packs[i] + s->slice * (size_t)k, s->slice};
    }
  }
  if (transport_recv_data(proc, transport_tag(TRANSPORT_DATA, key), iov, k) < 0) return -1;
  for (int r = 0, k2 = 0; r < nr; r++)
    for (int l = 0; l < lc->n; l++, k2++) {
      if (flat[l]) continue;
      View dst, src;
      a2a_dst(&dst, c->g->slots[lc->peers[l]].out[0], s->a, qs[r]);
      src = dst;
      x_packed(&src, s->packs[i] + s->slice * (size_t)k2);
      view_copy(&dst, &src);
    }
  return 0;
}

/* The leader's exchange of an all_to_all (an XExchange; arg: the
 * A2AArgs): every process sends each other one only the slices its
 * participants take, received into their outputs; x_a2a_local then
 * copies the local participants' blocks. */
static int x_a2a(const Call *c, const XLocal *lc, const void *arg) {
  Slot *me = &c->g->slots[c->rank];
  int n = c->n, procs[n], np = x_procs(c, procs);
  XA2A s = {.c = c, .a = arg};
  s.slice = (size_t)c->in[0]->size / (size_t)n * dt_size(c->in[0]->dtype);
  s.tab = x_tab(me, n);
  s.packs = shm_calloc((size_t)(2 * np) + 1, sizeof(char *));
  s.pack_bytes = shm_calloc((size_t)(2 * np) + 1, sizeof(size_t));
  s.reqs = shm_calloc((size_t)(2 * np) + 1, sizeof(void *));
  char *h = shm_malloc(x_wire_cap(lc->n));
  me->xin = s.tab;
  me->xn = n;
  me->xnin = 1;
  int rc = s.tab && s.packs && s.pack_bytes && s.reqs && h ? 0 : (err_nomem(), -1);
  for (int q = 0; rc == 0 && q < n; q++)
    if (x_local(c->g, c->peers[q])) s.tab[q] = c->g->slots[c->peers[q]].in[0];
  if (rc == 0) rc = x_a2a_send(&s, lc, h, procs, np);
  for (int i = 0; rc == 0 && i < np; i++) rc = x_a2a_recv(&s, lc, procs[i], np + i);
  x_wait_sends(c, s.reqs, s.nreqs, rc);
  for (int i = 0; s.packs && i < 2 * np; i++)
    if (s.packs[i]) shm_buf_free(s.packs[i], s.pack_bytes[i]);
  shm_free(s.packs), shm_free(s.pack_bytes), shm_free(s.reqs), shm_free(h);
  return rc;
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
  if (c.cross) return x_run(&c, x_a2a, x_a2a_local, &a);
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

static int x_ragged(const Call *c, const void *arg) {
  int64_t spd = *(const int64_t *)arg;
  if (ragged_validate(c, spd) < 0) return -1;
  fast_ragged(c, spd);
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
  if (c.cross) {
    int64_t spd = k / c.n;
    return x_run(&c, x_exchange, x_ragged, &spd);
  }
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

/* ---- the primitive table's entries for the collectives ------------------ */

#define COLL_RULES(n) \
  {.shape = coll_shape_##n, .kernel = coll_kernel_##n, .vma = coll_vma_##n}

/* The shape, kernel and replication rules of every collective, one row
 * each; their JVP and transpose rules are collective_ad.c's. */
static const struct { PrimId id; PrimRules rules; } coll_rules[] = {
    {P_AXIS_INDEX, COLL_RULES(axis_index)},
    {P_PSUM, COLL_RULES(psum)},
    {P_PMAX, COLL_RULES(pmax)},
    {P_PMIN, COLL_RULES(pmin)},
    {P_ALL_GATHER, COLL_RULES(all_gather)},
    {P_PSUM_SCATTER, COLL_RULES(psum_scatter)},
    {P_PPERMUTE, COLL_RULES(ppermute)},
    {P_ALL_TO_ALL, COLL_RULES(all_to_all)},
    {P_RAGGED_ALL_TO_ALL, COLL_RULES(ragged_all_to_all)},
};

void coll_register_prims(void) {
  for (size_t i = 0; i < sizeof coll_rules / sizeof coll_rules[0]; i++)
    prim_register(coll_rules[i].id, &coll_rules[i].rules);
  coll_ad_install();
}
