/*
 * collective_impl.h - what the files of the collective engine share:
 * the group, its slots and a call in progress (collective.c), the
 * parameters and participants (collective_params.c), the exchange across
 * processes (collective_x.c), strided views, the reduction arithmetic
 * and the reference path (collective_reduce.c).
 * Private to src/spmd/collective*.c; the engine's users include
 * collective.h.  Locking and memory ordering: collective.c.
 */
#ifndef SHMAP_COLLECTIVE_IMPL_H
#define SHMAP_COLLECTIVE_IMPL_H

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

typedef enum { RED_SUM, RED_MAX, RED_MIN } RedOp;

/* What one device brings to one collective; equal on all participants. */
typedef struct CollDesc {
  int kind;                       /* the PrimId of a collective the engine runs */
  int naxes;
  int axes[DEV_MAX_AXES];         /* mesh axis indices, in the user's order */
  int line;                       /* source line of the call; 0 unknown */
  char params[COLL_PARAMS_CAP];   /* canonical parameters other than axes */
  /* the operands' avals, compared as numbers and formatted only for
   * messages (coll_sig_str): */
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
  int kind, np;                   /* PrimId; parameters */
  const char *names[PRIM_MAX_PARAMS];
  Value *vals[PRIM_MAX_PARAMS];   /* references */
  int naxes, axes[DEV_MAX_AXES];  /* the resolved axis names */
  int n, pos, axis_size;          /* participants (their ranks: Slot.peers) */
  bool cross;                     /* some of them on other processes */
  char params[COLL_PARAMS_CAP];   /* coll_params_canon's text */
} CallMemo;

/* A device's exit record, sent to the other processes as it leaves the
 * body (coll_device_exit): peers waiting for it there fail instead of
 * waiting forever. */
typedef struct XExit {
  int rank, line, failed;
  int nevid;                      /* evidence that follows: headers (as
                                     coll_x_header_pack writes them, each
                                     after its length as an int64_t, padded
                                     to 8 bytes) of what devices reached at
                                     the collective whose number they carry:
                                     two devices' at a mismatch (XMismatch),
                                     or with [runs] its own */
  int runs;                       /* the evidence is the device's runs of
                                     descriptors, newest first, each header
                                     numbered with its run's first, the
                                     first one its last collective alone */
  long count;                     /* collectives it entered */
} XExit;

/* The runs of a device's descriptors its exit record carries at most:
 * its history and its last collective alone (its line). */
#define XRUNS_MAX (COLL_HIST + 1)

/* A collective mismatch a device found (coll_mismatch_error): the two
 * participants and what each reached at collective #seq.  When the device
 * fails, its exit record carries this to the other processes, where a
 * device waiting for one of the two reports the mismatch itself, as it
 * would within one process (x_check), rather than the failure's echo. */
typedef struct XMismatch {
  long seq;
  int rank[2];
  CollDesc desc[2];
} XMismatch;

/* One device's state in the group. */
typedef struct Slot {
  DevCtx ctx;                     /* the device's context (written at creation) */
  int xproc;                      /* the process holding the device, and */
  bool xlocal;                    /* whether it is this one (written at
                                     creation: coll_x_proc, coll_x_local) */
  /* guarded by CollGroup.lock (the owner, their only writer, also reads
   * them without it): */
  bool exited, failed;            /* left the body (with an error) */
  int exit_line;
  DescRun runs[COLL_HIST];        /* the latest runs, run k at [k % COLL_HIST] */
  long nruns;                     /* runs started */
  /* written by the owner before its release of published; read by the
   * participants of that collective after acquiring it: */
  Array **in, **out;              /* operands and outputs of #published */
  bool shareable;                 /* arr_shareable(out[0]) when it published:
                                     peers read this, never out[0]->buf, which
                                     the owner changes once it shares */
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
   * participant's) exchange, run by whichever local participant left the
   * rendezvous first (x_elect), read by the call's other local
   * participants after the barrier that follows it: */
  atomic_long xlead_seq;          /* the last call led for this slot */
  Array **xin;                    /* [n * nin]: every participant's operands
                                     (local ones borrowed, remote ones owned) */
  int xn, xnin;                   /* its participants and operands */
  Array **xtab;                   /* [2 * xtab_cap], the leader's, kept from
                                     call to call (a small collective's time
                                     is mostly such overheads): the table xin
                                     points at (coll_x_tab), then the proxies of
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
  bool xconflict;                 /* the exchange failed on another process's
                                     header of another collective, whose */
  int xconflict_key;              /* key it has (x_check): that process's data
                                     of it is dropped too (coll_x_wait_sends) */
  int xrc;                        /* -1: the exchange failed with xkind, xmsg */
  ErrKind xkind;
  bool xsecondary;                /* raised because a peer failed or left */
  char xmsg[768];
  int *lpeers;                    /* [ndevices]: the current call's local participants */
  /* a call whose leader computed the result alone (coll_x_run's [lead])
   * ends without a final barrier; the local participants other than the
   * one that ran it may still be copying it when the slot's next call
   * begins: */
  Array *xsmall;                  /* the leader's result, kept from call to call */
  long xread_seq;                 /* that call, */
  int xread_n;                    /* its other local participants, */
  int *xread_peers;               /* [ndevices] their ranks */
  char *xexit;                    /* [TRANSPORT_COPY_BYTES] its exit record
                                     (XExit and evidence), sent as it leaves
                                     the body: alive until the sends end */
  void **xreqs;                   /* [processes]: those sends */
  XMismatch *xmis;                /* the last mismatch it found; NULL: none */
  /* a remote device, from its exit record (guarded by the lock, like exited): */
  long xcount;                    /* collectives it entered */
  DescRun *xruns;                 /* [XRUNS_MAX] what it reached up to
                                     #xlast, as exit records' evidence says:
                                     runs newest first (its own record's), or
                                     one collective (a mismatch another found);
                                     or NULL */
  int nxruns;
  long xlast;
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

/* This process's participants of a cross-process call: their number,
 * the caller's position among them and their ranks (the slot's lpeers). */
typedef struct XLocal {
  int n, pos;
  int *peers;
} XLocal;

/* A collective's header as read (coll_x_header_read): the sender's
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

/* A header leader [me] accepted from one process, up to its operands,
 * under its descriptor generation [gen]. */
typedef struct XSeen {
  char *bytes;                    /* x_header_cap bytes; NULL: none yet */
  size_t len;
  unsigned long gen;
} XSeen;

/* The leader's part of step 2: the exchange between processes (of the
 * local participants' operands [lc], with the kernel's [arg]); 0, or -1
 * with the error set. */
typedef int (*XExchange)(const Call *c, const XLocal *lc, const void *arg);

/* A region of an array: element strides, as array.h counts them. */
typedef struct View {
  char *base;                     /* first element */
  size_t esize;
  int ndim;
  int64_t shape[SHM_MAXDIM];
  int64_t strides[SHM_MAXDIM];
} View;

/* An inner loop over [n] elements with element strides [ds] and [ss]. */
typedef void (*InnerFn)(char *dst, const char *src, int64_t n, int64_t ds,
                        int64_t ss, const void *arg);

typedef struct RedArg {
  DType dtype;
  RedOp op;
} RedArg;

typedef struct Global {
  char *data;
  size_t nbytes;
  int64_t block;                  /* elements per participant */
  View blockview;                 /* shape of one block, contiguous strides */
} Global;

/* The reference loop: for every element of [out], map(out index) names a
 * participant and an operand index; the element is copied from there. */
typedef int (*RefMap)(const Call *c, const void *arg, int64_t *idx);

typedef struct GatherArgs {
  int dim;
  bool tiled;
  int64_t n;
} GatherArgs;

/* ---- collective.c ------------------------------------------------------------ */

bool coll_desc_equal(const CollDesc *a, const CollDesc *b);

const char *coll_coords_of(const CollGroup *g, int rank, char *buf, size_t cap);

/* Sets the mismatch error between rank a's [da] and rank b's [db], the
 * lower rank first so every detector words it the same way. */
int coll_mismatch_error(CollGroup *g, int a, const CollDesc *da, int b,
                        const CollDesc *db);

/* The error of a waiter whose participant [p] left the body or gave up. */
int coll_left_error(CollGroup *g, const Call *c, int p, bool gave_up);

/* The error of a caller whose participant [p] went past its collective
 * #seq without the caller, and whose descriptor of it is no longer kept. */
int coll_passed_error(CollGroup *g, const Call *c, int p);

/* The error of an aborted group or of Ctrl-C, if any: 0 none, else -1. */
int coll_abort_error(CollGroup *g);

/* The rendezvous, timed for the timeline: how long this device waited,
 * and for whom (the first participant that had not arrived yet). */
int coll_rendezvous(Call *c);

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
bool coll_barrier(Call *c);

void coll_finish(Call *c);

/* The final barrier (operands may be released after it) and leaving. */
void coll_leave(Call *c);

/* Sets up call [c] of collective [kind] (a PrimId whose row has a
 * CollRules.api_name, the name its errors give) on this device thread:
 * its participants, descriptor and sequence number.  0, or -1 with the
 * error set (outside a shard_map body, an unknown axis, ...). */
int coll_call_init(Call *c, PrimId kind, const Params *p, Array **in,
                   int nin, Array **out);

/* The jax.lax function name of collective [kind] (a PrimId, as in
 * CollDesc.kind): its row's CollRules.api_name. */
const char *coll_kind_name(int kind);

/* Whether collective [c] moves its data through the lanes: a reduction of
 * at most COLL_LANE_BYTES in fast mode.  The same answer on every
 * participant whose descriptor agrees (it depends on the operand's aval
 * only), and a disagreement fails the arrival before data moves. */
bool coll_uses_lane(const Call *c, const Array *x);

/* The data of slot [s]'s lane [k] for an operand of [bytes]. */
char *coll_lane_data(Slot *s, int k, size_t bytes);

/* Copies the caller's operand [x] into its lane for collective #seq,
 * before the arrival is published. */
void coll_lane_write(Call *c, const Array *x);

/* Waits (fast mode) until the [n] devices [peers], which read what the
 * caller wrote for collective #seq, are done with it or left the body.
 * They are past that collective's arrival, so they finish without
 * running user code, and the wait is bounded; nothing when seq < 0. */
void coll_wait_readers(Call *c, long seq, int n, const int *peers);

/* ---- collective_params.c ----------------------------------------------------- */

/* Element [flat] (row-major over the logical shape) of an int or bool array. */
int64_t coll_elem_i64(const Array *a, int64_t flat);

bool coll_is_intlike(const Value *v);

int coll_param_int(const char *prim, const Params *p, const char *name,
                   int64_t dflt, int64_t *out);

int coll_param_bool(const char *prim, const Params *p, const char *name,
                    bool *out);

/* The canonical string of every parameter but the axis names. */
void coll_params_canon(const Params *p, char *buf, size_t cap);

/* Records the avals of operands [in] (nin <= COLL_MAX_IN) in [d]. */
void coll_sig_of(Array **in, int nin, CollDesc *d);

/* Element by element, not memcmp: the arrays are a few entries long and
 * every collective compares descriptors twice across processes (its run,
 * the peers' headers), where a call to memcmp costs more than the loop. */
bool coll_sig_equal(const CollDesc *a, const CollDesc *b);

/* The operand avals of [d], "f32[4,8], i32[2]" (array.h's aval_str form). */
void coll_sig_str(const CollDesc *d, char *buf, size_t cap);

/* The axis-name parameter: `axes` for the reductions, `axis_name` otherwise.
 * One look for either literal's address first, as params_get does for one. */
Value *coll_axis_param(const Params *p);

/* Writes "'i'" or "('i', 'j')" for the axis names of [d]. */
void coll_axes_str(const MeshDesc *m, const CollDesc *d, char *buf, size_t cap);

/* Size of the flattened axis made of axes[0..naxes-1]. */
int coll_flat_size(const MeshDesc *m, const int *axes, int naxes);

/* Index of [coords] along the flattened axis (axes[0] major). */
int coll_flat_index(const MeshDesc *m, const int *axes, int naxes,
                    const int *coords);

/* The rank at flattened index [idx] among the devices sharing [coords] on
 * the other axes. */
int coll_rank_at(const MeshDesc *m, const int *axes, int naxes,
                 const int *coords, int idx);

/* Validates axis_index_groups [v] for an axis of [size]: a tuple of equally
 * long tuples of ints covering 0..size-1 exactly once.  Sets *gsize. */
int coll_check_groups(const char *prim, Value *v, int size, int *gsize);

Value *coll_groups_param(const Params *p);

/* Fills c->peers, c->n, c->pos for the calling device. */
int coll_find_participants(Call *c, const char *prim, const Params *p);

/* Whether axis names [v] are those memo [am] resolved last.  Another
 * value of the same names (another statement's) replaces the memo's, so
 * the next call of that statement compares one pointer. */
bool coll_axes_memo_hit(AxesMemo *am, Value *v);

/* resolve_axes, remembered in the owner's slot [s] for the last value. */
int coll_memo_axes(Slot *s, const char *prim, const MeshDesc *m, const Params *p,
                   int *axes, int *naxes);

/* resolve_axes against the current mesh [ctx], through the device's memo
 * when that mesh is its group's. */
int coll_ctx_axes(const DevCtx *ctx, const char *prim, const Params *p,
                  int *axes, int *naxes);

void coll_memo_clear(CallMemo *m);

/* Whether the set-up of a call of [kind] with [p] is the memo's.  Values
 * equal to the memo's but not the same (another statement's) replace
 * them, so the next call of that statement compares pointers. */
bool coll_memo_hit(CallMemo *m, int kind, const Params *p);

/* Remembers [c]'s set-up (its participants are in the slot's peers). */
void coll_memo_fill(CallMemo *m, int kind, const Params *p, const Call *c);

/* Drops slot [s]'s memos and their references. */
void coll_memo_free(Slot *s);

/* ---- collective_x.c ---------------------------------------------------------- */

/* The pool device of mesh rank [r]. */
int coll_x_device(const CollGroup *g, int r);

/* Whether mesh rank [r] lives in this process, and which process holds
 * it (from its slot: a collective asks several times per participant). */
bool coll_x_local(const CollGroup *g, int r);

int coll_x_proc(const CollGroup *g, int r);

/* Frees slot [s]'s table and the proxies kept in it. */
void coll_x_tab_free(Slot *s);

/* Leader [s]'s table of [n] operands, zeroed: the one of its last call
 * when large enough (NULL when out of memory). */
Array **coll_x_tab(Slot *s, int n);

/* The proxy at place [i] of leader [s]'s table for a remote participant's
 * operand shaped as [mine]: the one its last call left there when nothing
 * else holds it and it has that shape, else a new one; its data is all
 * received again.  NULL when out of memory. */
Array *coll_x_proxy(Slot *s, int i, const Array *mine);

/* The longest header of a sender of [nloc] participants. */
size_t coll_x_wire_cap(int nloc);

/* Writes the header of collective [c] for this process's participants
 * [lc], with [inline_bytes] of operands to follow, into [buf]
 * (coll_x_wire_cap(lc->n) bytes).  Returns where the operands go: the
 * header's length without them. */
size_t coll_x_header_pack(char *buf, const Call *c, const XLocal *lc, int inline_bytes);

/* Reads header message [m] into [h] (pointing into m, which must outlive
 * it): 0, or -1 with the error set when its lengths do not add up. */
int coll_x_header_read(const TransportMsg *m, XHeader *h);

/* The position in [c]'s participants of device [rank], which another
 * process's header names: -1 with a collective mismatch error set when it
 * is not one of them. */
int coll_x_position(const Call *c, int rank);

/* The tag key of collective #seq of the group whose first participant is
 * [first]: one call's parity, 16 bits of the number, 11 of the rank. */
int coll_x_key(const CollGroup *g, long seq, int first);

/* Waits for process [proc]'s header of collective [c], through a receive
 * posted for it (transport_expect): a turn of the wait is an MPI_Test,
 * not a probe. */
TransportMsg *coll_x_wait_header(const Call *c, int proc, int tag);

/* Receives process [proc]'s data message [tag] into [iov] (niov pieces)
 * when the sender may fail before sending it (it is sent in answer to
 * other processes' messages): 0, or -1 with the error set. */
int coll_x_wait_data(const Call *c, int proc, int tag, const TransportIov *iov, int niov);

/* The processes other than this one that hold participants of [c], in
 * increasing order, into [procs]; their number. */
int coll_x_procs(const Call *c, int *procs);

/* Frees leader [s]'s copies of accepted headers. */
void coll_x_seen_free(Slot *s);

/* Completes the leader's sends [reqs] of collective [c]; after a failure
 * ([rc] < 0) meanwhile drops what the other processes sent for [c], and
 * for the collective of another process's conflicting header (a group
 * with another first participant has another key): a peer that failed
 * too may be waiting for its own large sends to this process to complete
 * (a send of more than MPI's eager limit completes only once received). */
void coll_x_wait_sends(const Call *c, void **reqs, int n, int rc);

/* The leader's exchange (step 2): fills the leader slot's xin.  Operands
 * that are not contiguous are sent from contiguous copies. */
int coll_x_exchange(const Call *c, const XLocal *lc, const void *arg);

/* A step of a collective across processes: 0, or -1 with the error set. */
typedef int (*XStep)(const Call *c, const void *arg);

/* Runs collective [c], which has participants on other processes: the
 * leader runs [exchange] (coll_x_exchange: every operand to every process),
 * then every local participant [body], which computes its output (from
 * every operand, coll_peer_in, after coll_x_exchange), and a final
 * barrier lets the leader free what they read.  With [lead] (small
 * reductions) the leader alone computes the result after its exchange,
 * into its slot's xres, which is its own (xsmall) unless the leader is
 * the process's only participant, and [body] copies it:
 * the local participants then read nothing the leader frees or that
 * belongs to another device (a compiled plan reuses its buffers as soon
 * as the collective returns), and leave without the barrier, as a lane
 * reduction does; the leader waits before its next exchange until they
 * are done (under mpirun the devices share the cores with other
 * processes, and a barrier costs a turn of the scheduler).  The reference
 * mode keeps the barrier. */
int coll_x_run(Call *c, XExchange exchange, XStep body, const void *arg, XExchange lead);

/* Sends device [rank]'s exit record to every other process. */
void coll_x_send_exit(CollGroup *g, Slot *s, int rank, int line, bool failed);

/* ---- collective_reduce.c ----------------------------------------------------- */

void coll_view_of(View *v, const Array *a);

/* Restricts dimension [d] to [start, start + len). */
void coll_view_slice(View *v, int d, int64_t start, int64_t len);

/* Removes dimension [d], which has size 1. */
void coll_view_drop(View *v, int d);

/* Calls fn over [dst] and [src] (same shape), one innermost row at a time. */
void coll_view_each2(const View *dst, const View *src, InnerFn fn,
                     const void *arg);

void coll_view_copy(const View *dst, const View *src);

/* acc[i*as] = acc[i*as] (op) x[i*xs] for i < n. */
void coll_inner_reduce(char *acc, const char *x, int64_t n, int64_t as,
                       int64_t xs, const void *arg);

/* All participants' operand [k] stacked into one contiguous buffer,
 * participant-major: global[q] is participant q's block, row-major. */
/* Operand [k] of participant [q] (its position) of collective [c]. */
Array *coll_peer_in(const Call *c, int q, int k);

int coll_global_gather(Global *gl, const Call *c, int k);

void coll_global_free(Global *gl);

/* Pointer to element [idx] of participant q's block. */
char *coll_global_at(const Global *gl, int q, const int64_t *idx);

/* Row-major multi-index of [flat] in [shape]. */
void coll_unravel(int64_t flat, int ndim, const int64_t *shape, int64_t *idx);

/* Inserts [x] at position [at] of idx[0..n-1]. */
void coll_idx_insert(int64_t *idx, int n, int at, int64_t x);

/* Removes position [at] of idx[0..n-1]. */
void coll_idx_delete(int64_t *idx, int n, int at);

void coll_ref_fill(const Call *c, const Global *gl, Array *out, RefMap map,
                   const void *arg);

/* The aval of [a] (the kernels recheck parameters with the shape rules'
 * helpers). */
void coll_aval_from(const Array *a, AVal *av);

/* The number of participants n for a shape rule: the axis_size parameter,
 * else the current mesh (and axis_index_groups), else an error. */
int coll_shape_axis_n(const char *prim, const Params *p, int64_t *n);

/* A kernel's check that the axis_size its shape rule used (when given) is
 * the real number of participants [n]: the output was sized by it. */
int coll_check_axis_size(const char *prim, const Params *p, int n);

/* Normalises dimension parameter [name] (default 0) for a rank [ndim]. */
int coll_param_dim(const char *prim, const Params *p, const char *name,
                   int ndim, int *out);

void coll_shape_insert(AVal *a, int at, int64_t x);

void coll_shape_delete(AVal *a, int at);

/* psum, pmax, pmin, all_gather: the axes are removed unless grouped. */
uint32_t coll_vma_remove(const uint32_t *in, int nin, const Params *p);

/* ppermute, all_to_all, psum_scatter, ragged_all_to_all: the axes are added. */
uint32_t coll_vma_add(const uint32_t *in, int nin, const Params *p);

int coll_shape_same(const AVal *in, int nin, AVal *out);

Array *coll_peer_out(const Call *c, int q);

/* Elements [lo, lo + len) (row-major) of [a], contiguous or not, into
 * [dst]: a non-contiguous operand (a broadcast, a transpose) is read into
 * a contiguous chunk first, so the fold loops stay contiguous. */
void coll_read_flat(char *dst, const Array *a, int64_t lo, int64_t len);

/* Whether a split reduction or a gather leaves one buffer shared by all
 * participants: when every participant's output was shareable when it
 * published (Slot.shareable: not inline, not a compiled plan's pinned
 * workspace, arr_pin).  Every participant gets the same answer, as each
 * must: one that shares writes only its part into the first output. */
bool coll_can_share(const Call *c);

/* After a split reduction into the first participant's output: every
 * other participant's output becomes a view of that buffer, taking its
 * reference before the final barrier, so the first participant never
 * sees its result unshared and overwrites it in place. */
void coll_share_output(const Call *c);

/* ---- the families' rows ------------------------------------------------------ */

/* One row of the primitive table, as a family file lists it. */
typedef struct CollRow {
  PrimId id;
  PrimRules rules;
} CollRow;

/* prim_register of each of the [n] rows [rows]. */
void coll_register_rows(const CollRow *rows, size_t n);

/* The rows of each family file: axis_index, psum, pmax, pmin and pvary
 * (collective_reduce.c); all_gather, psum_scatter, ppermute and
 * all_to_all (collective_move.c); ragged_all_to_all (collective_ragged.c). */
void coll_reduce_register(void);
void coll_move_register(void);
void coll_ragged_register(void);

/* ---- what the rules share (collective_ad.c) ----------------------------------- */

/* [id][*p](x...), the operands held across the call (prim_apply_rule);
 * [p] consumed when [own], else copied.  A new reference, or NULL. */
Value *coll_rule_apply(PrimId id, int n, Value **x, Params *p, bool own);

/* [dst] made a copy of [p] without parameter [skip] (NULL: none). */
void coll_params_except(Params *dst, const Params *p, const char *skip);

/* psum of [x] over the mesh axes of [mask] (none: a new reference to x). */
Value *coll_psum_over(Value *x, uint32_t mask);

/* Whether a collective's parameters [p] give axis_index_groups. */
bool coll_grouped(const Params *p);

/* The axes [p] names over which operand aval [a] is invariant, into
 * [extra]: its cotangent sums over them (none for grouped collectives,
 * whose results keep their axes).  0. */
int coll_invariant_axes(const Params *p, const AVal *a, uint32_t *extra);

/* JVP of a collective [id] linear in its one operand: the same
 * collective on the tangent (JvpRule's contract). */
int coll_jvp_linear(PrimId id, Value **x, Value **t, const Params *p, Value **yo, Value **to);

/* Batching over mesh axes of a collective [id] element-wise across
 * devices (psum, pmax, pmin, ppermute, pvary): the batch axis stays where
 * it is (BatchRule's contract). */
int coll_batch_same(PrimId id, Value **in, const int *dims, const Params *p, Value **out,
                    int *od);

/* The JvpRule and BatchRule of collective P_<ID>, named jvp_<name> and
 * batch_<name>, made from the two above. */
#define COLL_JVP_LINEAR(name, ID)                                                       \
  static int jvp_##name(Value **x, Value **t, int nin, const Params *p, Value **yo,      \
                        Value **to) {                                                   \
    (void)nin;                                                                          \
    return coll_jvp_linear(P_##ID, x, t, p, yo, to);                                    \
  }
#define COLL_BATCH_SAME(name, ID)                                                       \
  static int batch_##name(Value **in, const int *dims, int nin, const Params *p,         \
                          Value **out, int *od) {                                       \
    (void)nin;                                                                          \
    return coll_batch_same(P_##ID, in, dims, p, out, od);                               \
  }

/* ---- collective_move.c ------------------------------------------------------- */

/* Where participant [q]'s block of the leader's all_gather goes in its
 * result (x_gather: a run of memory). */
char *coll_x_gather_at(const Call *c, int q);

#endif
