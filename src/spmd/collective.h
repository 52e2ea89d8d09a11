/*
 * collective.h - named-axis collectives over device threads.
 *
 * For each collective primitive X of prim.def (axis_index psum pmax pmin
 * all_gather psum_scatter ppermute all_to_all ragged_all_to_all) this
 * module defines its shape rule, kernel and replication (vma) rule with the
 * signatures of prim.h (coll_shape_X, coll_kernel_X, coll_vma_X).
 * Semantics are jax.lax's; ragged_all_to_all is exactly seed 002.
 *
 * THE FAMILY FILES.  Each collective's whole row of the primitive table
 * sits in one file, side by side with its kernel: shape, kernel, vma,
 * batching, JVP and transpose rules, and its named-axis rules (CollRules:
 * the engine's name for it, its effect on xmap's named shapes, the
 * positional reduction it is over a named axis, its batching over a
 * vmap or xmap axis); the sharding slot stays empty.  axis_index, psum,
 * pmax, pmin and pvary: collective_reduce.c; all_gather, psum_scatter,
 * ppermute and all_to_all: collective_move.c; ragged_all_to_all:
 * collective_ragged.c.  Each registers its rows (coll_register_prims), as
 * JAX's parallel.py attaches every rule of a collective where it defines
 * it; the machinery of transform/ (the tracer, the batching interpreter,
 * xmap's evaluator) dispatches on the slots and names no collective.
 *
 * THE GROUP.  One CollGroup per shard_map call is the rendezvous of every
 * collective the call's devices make.  The shard_map layer uses it so:
 *
 *     MeshDesc m = {...};                       // device.h
 *     CollGroup *g = coll_group_new(&m, reference);
 *     int rc = coll_run(g, body, ctx);          // body(rank, ctx) per device
 *     coll_group_free(g);
 *
 * coll_run is dev_run on m.device_ids with, around body, coll_enter (sets
 * the device's DevCtx; in reference mode waits for the baton) and
 * coll_device_exit (tells waiting peers this device left).  A caller that
 * wants its own wrapper may call dev_run itself and call coll_enter /
 * coll_device_exit from its fn.
 *
 * MATCHING.  Collectives are matched by sequence number: every device
 * counts the collectives it makes (axis_index is not one: it needs no
 * peer), and the k-th collective of a device meets the k-th collective of
 * each of its participants.  The participants are the devices whose mesh
 * coordinates agree with the caller's on every axis NOT named (with
 * axis_index_groups: those of the caller's group along the named,
 * flattened axis).  Each device publishes a descriptor (primitive, axes in
 * order, operand avals, parameters, source line); a participant whose k-th
 * descriptor differs, a participant that already went past its k-th
 * collective elsewhere, or one that left the body, is an ERR_COLLECTIVE
 * error naming both devices by mesh coordinates, both collectives and
 * their lines.  Eager device code may branch on axis_index, so devices
 * outside the participants are free to do other things meanwhile.
 *
 * NEVER A HANG.  Waiting for participants to arrive is interruptible: by
 * a mismatch, by a participant leaving (coll_device_exit), by
 * coll_group_abort (the debugger's quit) and by Ctrl-C (eval.h's
 * shm_interrupted, looked at at least every 100 ms).  Once all participants
 * have arrived and agree, the data movement runs to its end without user
 * code, so the barriers inside it are bounded and not interruptible (an
 * abort there could free a buffer a peer is still reading).
 *
 * DATA MOVEMENT.  Over shared memory: each participant publishes its
 * operand and output Arrays; after the arrival every participant reads
 * its peers' blocks directly; a final barrier keeps operands alive until
 * every peer has read them, and outputs unread until every peer has
 * written them.  psum/pmax/pmin are one pass of reduce-scatter and
 * all-gather: participant j folds the j-th 1/n of the elements (cut at
 * cache lines) from all peers, in participant order, a cache-sized chunk
 * at a time, into the first participant's output, and every participant's
 * result then shares that one buffer (arr_share_buffer: a shared buffer
 * is never changed in place), so each element is written once.  The
 * ownership rule: outputs share a buffer only when every participant's
 * output is shareable (arr_shareable, decided as each publishes): a fresh
 * array, immutable once written.  A compiled plan's workspace slots and
 * loop carries are pinned (arr_pin): the plan writes them again in later
 * steps and runs without looking at counts, so they never share, and
 * each such output gets its own copy; a
 * non-contiguous operand (a broadcast, a transpose) is read into a
 * contiguous chunk, so the fold loops are always contiguous and
 * vectorised.  Every device gets the same bits.  Small reductions, up to
 * COLL_SMALL_REDUCE elements times participants, are folded whole by every
 * participant in the same order: a barrier costs more than the
 * arithmetic.  Tiny ones (COLL_LANE_BYTES) go through LANES: each device
 * copies its operand into its slot's lane (one per parity of the sequence
 * number) before it publishes, folds from its peers' lanes, and leaves
 * without a final barrier; it rewrites a lane two collectives later, once
 * that lane's readers have marked themselves done.  So a device may be
 * one collective ahead of a peer, and a peer found further on has been
 * through the caller's collective (it checked the caller then).  (Outputs that are not contiguous, which prim_apply never
 * makes, take the older strided path: fold into the own output, a
 * barrier, copy the other parts from the peers' outputs.)
 * psum_scatter reduces only its own block, in the same order.
 *
 * WAITING.  With no more device threads on the machine than cores (a
 * group's devices in this process times the MPI job's processes on this
 * machine; the mesh's devices without MPI) a waiter spins briefly
 * (a pause instruction per turn, COLL_PAUSE_NS) before sleeping: a
 * spinning hand-off costs ~0.04 µs, waking a sleeper ~20 µs.  With more
 * devices than cores it yields its core at every turn (COLL_YIELD_NS),
 * so 8 devices on 2 cores hand the cores to the devices that have work
 * instead of spinning each other out, then sleeps.  Sleepers wait on the
 * condition variable of the device they wait for, so an arrival wakes
 * only them.  One mutex per group guards the descriptors, exits, baton
 * and abort state (collective.c says which fields; the arrival and done
 * counters and barriers are atomics); data moves outside it, and a loop
 * repeating one collective does not take it at all: a descriptor equal
 * to the device's previous one is published with atomics alone.
 *
 * ARITHMETIC.  Reductions fold in participant order on every path, so the
 * result is bitwise equal on every device and in both modes.  Integers
 * wrap; for bool, psum and pmax are OR, pmin is AND; float pmax/pmin
 * propagate NaN; f16/bf16 are combined in f32 and rounded every step.
 *
 * REFERENCE MODE.  coll_group_new(m, true): devices run one at a time (a
 * baton passed in rank order; a device waiting in a collective passes it
 * on), and every collective computes its result by gathering the
 * participants' operands into one array and running plain loops.  Tests
 * compare it with the threaded fast path bit for bit.
 *
 * ACROSS PROCESSES.  Under mpirun (transport.h) a call's devices live in
 * several processes.  A collective whose participants are all in this
 * process runs as above; one with participants elsewhere meets its local
 * participants as above, then their first sends a header (number,
 * descriptor, the devices it speaks for) and their operands to every other
 * process holding participants and receives theirs, checking the
 * descriptors as above; every local participant then computes its own
 * output from all operands, folding in participant order (the bits of one
 * process).  While waiting it reads the other processes' headers, exit
 * records and BYEs, so a mismatch, a device that left or failed, or a
 * process that ended is the error one process gives, never a hang.
 * collective_x.c has the details.
 *
 * Kernels need prim_apply not to alias a collective's output with its
 * operand (outputs are written while peers still read operands).
 */
#ifndef SHMAP_COLLECTIVE_H
#define SHMAP_COLLECTIVE_H

#include <stddef.h>

#include "spmd/device.h"
#include "base/error.h"
#include "array/prim.h"

#define COLLECTIVE_LIST(X) \
  X(axis_index) X(psum) X(pmax) X(pmin) X(all_gather) X(psum_scatter) \
  X(ppermute) X(all_to_all) X(ragged_all_to_all)

/*
 * Rules per primitive (parameters as in prim.def; axis names are always a
 * tuple of Str, ints are 0-d int arrays, `tiled` a bool, `perm` a tuple of
 * (src, dst) int pairs, `axis_index_groups` None or a tuple of int tuples):
 *
 *   axis_index[axis_name]            () -> i32[]
 *   psum/pmax/pmin[axes axis_index_groups]   x -> x's aval
 *   all_gather[axis_name all_gather_dimension axis_size tiled axis_index_groups]
 *       not tiled: a new axis of size n at all_gather_dimension;
 *       tiled: dimension all_gather_dimension multiplied by n
 *   reduce_scatter (psum_scatter)[axis_name scatter_dimension axis_size tiled
 *                                 axis_index_groups]
 *       not tiled: scatter_dimension must equal n and is removed;
 *       tiled: it must be divisible by n and is divided
 *   ppermute[axis_name perm]         x -> x's aval; no source gives zeros
 *   all_to_all[axis_name split_axis concat_axis axis_index_groups tiled]
 *       tiled: split_axis divided by n, concat_axis multiplied by n;
 *       not tiled: x.shape[split_axis] must be n, and the result's shape
 *       is np.insert(np.delete(x.shape, split_axis), concat_axis, n)
 *   ragged_all_to_all[axis_name axis_index_groups]
 *       (operand, output, input_offsets, send_sizes, output_offsets,
 *        recv_sizes) -> output's aval; seed 002
 *
 * n is the (group) size of the named axis: shape rules take it from the
 * axis_size parameter, else from dev_ctx()'s mesh, else fail.  Kernels
 * fail outside a shard_map body.  vma rules: see LANGUAGE.md §4.
 */
#define X(n)                                                              \
  int coll_shape_##n(const AVal *in, int nin, const Params *p, AVal *out); \
  int coll_kernel_##n(Array **in, int nin, const Params *p, Array **out);  \
  uint32_t coll_vma_##n(const uint32_t *in, int nin, const Params *p);
COLLECTIVE_LIST(X)
#undef X

/* ---- the collectives' own slots of the primitive table ------------------- */

/* How an equation changes the named shape (xmap's named axes, seed 001)
 * its results get from the union of its operands': the axes its `axes`
 * (else `axis_name`) parameter names are kept, removed (a reduction or
 * gather over them: psum, all_gather, pdot) or added (axis_index). */
typedef enum { COLL_NAMED_KEEPS, COLL_NAMED_REMOVES, COLL_NAMED_ADDS } CollNamed;

/* A vmap or xmap axis a collective names, as the batching interpreter
 * sees it: its [name] (interned), its [size] on this device (the block,
 * when xmap's axis_resources split it over mesh axes), and those mesh
 * axes [resources] (a tuple of Str, borrowed; NULL: not split) with the
 * product of their sizes [res_size]. */
typedef struct CollNamedAxis {
  const char *name;
  int64_t size;
  Value *resources;
  int64_t res_size;
} CollNamedAxis;

/* What a named-axis batching rule returns for a case it does not cover;
 * the batching interpreter then says "<prim> over the vmap axis 'i' ...
 * is not implemented". */
#define COLL_NAMED_MISSING 1

/* Batching rule of collective [id] over a named axis [ax] (vmap's
 * axis_name, xmap's named axes): [x] (borrowed) holds the examples along
 * its axis [d] (-1: the same value for every example), [rest] (borrowed;
 * NULL: none) the other axes [p] names, mesh axes.  Writes the result (a
 * new reference) to [out] and its batch axis to [od] (-1: the same for
 * every example).  0, -1 with the error set, or COLL_NAMED_MISSING.
 * Semantics: JAX's collective batching rules over a vmapped axis name
 * (parallel.py: psum over the axis becomes a positional reduction). */
typedef int (*CollNamedBatchRule)(PrimId id, Value *x, int d, const CollNamedAxis *ax, Value *rest,
                                  const Params *p, Value **out, int *od);

/* What one device of a group of [n] sends and receives in a collective
 * whose operand there is [in_bytes] bytes, by the algorithm the cost model
 * assumes for it (Compiled.cost_analysis, estimate; semantics: the
 * scaling book's ring and all-to-all costs): bytes sent and received,
 * and the rounds of messages one after another (each costs a link's
 * latency). */
typedef struct CollTraffic {
  const char *algorithm;       /* "ring all-reduce", "all-to-all", ... */
  double sent, received;       /* bytes per device */
  int steps;                   /* sequential rounds of messages */
} CollTraffic;
typedef void (*CollTrafficRule)(double in_bytes, int n, CollTraffic *t);

/* A primitive's named-axis rules: PrimRules.coll, filled by the family
 * file that registers its row (collective_reduce.c, collective_move.c,
 * collective_ragged.c). */
typedef struct CollRules {
  const char *api_name;        /* the jax.lax function, in the engine's
                                  messages and --comm-stats (psum_scatter
                                  for reduce_scatter); NULL: the engine
                                  never runs it (axis_index, pvary) */
  CollNamed named;             /* its effect on named shapes (trace.c) */
  bool reduces;                /* a reduction over the axes it names: */
  PrimId reduce;               /* the positional reduction it is over a
                                  named axis (reduce_sum for psum) */
  CollNamedBatchRule named_batch;  /* over a vmap/xmap axis; NULL: none */
  CollTrafficRule traffic;     /* its bytes on the links; NULL: none move */
} CollRules;

/* The collective that reduces over named axes as positional reduction
 * [reduce] does over positions (psum for reduce_sum: its row's `reduce`),
 * or -1 when none does. */
int coll_for_reduce(PrimId reduce);

/* [x] reduced as [reduce] (a positional reduction, e.g. reduce_prod)
 * over the named axis [nm] (a Str) of [size] for which no collective
 * reduces so: all_gather over it (when [carried]: x varies along it;
 * else x repeated [size] times), then [reduce] over the gathered axis.
 * A new reference, or NULL with the error set. */
Value *coll_named_gathered(PrimId reduce, Value *x, Value *nm, int64_t size, bool carried);

/* Registers the collectives' complete rows (shape, kernel, replication,
 * batching, JVP, transpose and CollRules) in the primitive table
 * (prim_register), each from its family's file.  Called once at
 * start-up, before any device thread runs; idempotent. */
void coll_register_prims(void);

/* The error (ERR_NAME, -1) for an axis name [name] that [m] does not
 * have, from collective [prim]: "psum: unknown axis name 'k' (the mesh's
 * axes are 'i', 'j')", every axis listed. */
int coll_unknown_axis(const char *prim, const MeshDesc *m, const char *name);

/* The error (ERR_NAME, -1) for a collective [prim] (or axis_index) naming
 * axis [a] of [m] that the body's partial-manual shard_map leaves
 * automatic (m->auto_axes): JAX binds only the manual axes in such a
 * body, so the name is unbound there.  The message lists the manual axes. */
int coll_auto_axis(const char *prim, const MeshDesc *m, int a);

/* The mesh-axis bits of the axes a collective's parameters [p] name
 * (`axes` or `axis_name`), on a device thread; false when no mesh is
 * current or a name is not one of its axes (no error kept). */
bool coll_axes_mask(const Params *p, uint32_t *mask);

/* The names of the current device's mesh axes in [mask], as a tuple of
 * Str (a collective's `axes` parameter); NULL with the error set off a
 * device thread. */
Value *coll_axis_names(uint32_t mask);

typedef struct CollGroup CollGroup;

/* Makes the rendezvous for one shard_map call over [mesh] (copied; its
 * names and device_ids stay borrowed).  [reference] selects reference
 * mode.  NULL with the error set on out of memory or a bad mesh. */
CollGroup *coll_group_new(const MeshDesc *mesh, bool reference);

/* Frees [g]; no device may still be inside it. */
void coll_group_free(CollGroup *g);

/* Runs fn(rank, ctx) on every device of g's mesh (dev_run on its
 * device_ids), each inside coll_enter / coll_device_exit.  Returns dev_run's
 * result: 0, or -1 with the first failing device's error on this thread. */
int coll_run(CollGroup *g, void (*fn)(int rank, void *ctx), void *ctx);

/* Called on the device thread of [rank] before the body: sets its DevCtx
 * and, in reference mode, waits for the baton (rank 0 holds it first).
 * Returns 0 (an abort is noticed at the device's first collective). */
int coll_enter(CollGroup *g, int rank);

/* Called on the device thread of [rank] when its body ends ([failed]: with
 * an error).  Peers waiting for it in a collective fail with "device (i=1)
 * returned from the body at line 12 while device (i=0) waits in psum at
 * line 7" (the line is eval_current_loc()'s at this call, omitted when 0).
 * In reference mode passes the baton on.  The DevCtx stays set, so
 * dev_run can prefix an error with the device's coordinates; the pool
 * clears it when fn returns. */
void coll_device_exit(CollGroup *g, int rank, bool failed);

/* Wakes every device waiting in a collective of [g]; they fail with
 * [kind] and [why].  Devices not waiting fail at their next collective.
 * Callable from any thread (signal handlers excepted). */
void coll_group_abort(CollGroup *g, ErrKind kind, const char *why);

/* Describes where [rank] waits, for the debugger's `devices`: writes
 * "psum over 'i' at line 7, for (i=0)" (the participants not there yet) into
 * [buf] and returns true, or returns false
 * (buf = "") when it is not in a collective. */
bool coll_waiting_str(CollGroup *g, int rank, char *buf, size_t cap);

/* Whether [rank] is inside a collective that some participant has not
 * reached yet: it cannot go on by itself.  A device whose collective is
 * complete is inside it until its thread runs again, however long that
 * takes on a busy machine, but it is not waiting for anyone.  The
 * debugger's rendezvous (LANGUAGE.md §7) counts only such a device as
 * stopped.  Any thread. */
bool coll_waits_for_peer(CollGroup *g, int rank);

/* The parity of [g]'s call number (every process numbers its shard_map
 * calls alike): the tags of the call's messages between processes carry
 * it (transport.h), so a call's leftovers never meet the next call's. */
int coll_group_parity(const CollGroup *g);

/* Whether [d] is the first device of its call's mesh that this process
 * holds (device 0 with one process): the one that records what every
 * device would, once per process. */
bool coll_first_local(const DevCtx *d);

/* Number of collectives [rank] has entered so far in [g]. */
long coll_seq(CollGroup *g, int rank);

#endif
