/*
 * transport.h - the processes of an MPI job, under the collective engine
 * (LANGUAGE.md §12; semantics: JAX's multi-controller runtime, every
 * process running the whole program).
 *
 * `mpirun -np P shmap --devices N` gives each process N / P of the N
 * devices: device d lives on process d / (N / P), as pool thread
 * d % (N / P).  Without mpirun (or in a build without MPI) there is one
 * process holding every device and every function here is trivial.
 *
 * This layer only moves bytes between processes: point-to-point messages
 * on one communicator (a duplicate of MPI_COMM_WORLD), of two kinds
 * told apart by the tag's low 2 bits (the class: data, or a header, exit, end
 * or BYE, all small):
 *   - SMALL messages (a collective's header, a device's exit record, the
 *     end of a call): received as soon as any thread polls, into a copy
 *     the mailbox keeps until someone takes it, or, when a thread posted
 *     a receive for it (transport_expect: a collective's header, the
 *     message a waiter needs), straight into that receive's buffer;
 *   - DATA messages (a collective's operands): matched when polled but
 *     received only by the thread that asks for them, straight into the
 *     caller's buffers (MPI_Improbe / MPI_Mrecv), so 16 MiB is copied
 *     once, by MPI;
 * (A BYE, transport_bye, is a small message: a process has ended the program.)
 * Small messages between processes of one machine go instead through
 * rings in memory the two share (an MPI-3 shared window, transport_node.h),
 * in the order sent, also relative to the MPI messages between them; with
 * SHMAP_MPI_NO_SHARED set (for every process: mpirun passes it on) every
 * message goes by MPI, as between processes of different machines.
 * A tag's key carries the shard_map call's parity (collective.h), so what
 * is left of one call is dropped without touching the next one's.
 * What the messages mean (descriptors, matching, errors) is the collective
 * engine's (collective.c, collective_x.c) and shard_map's (shardmap.c).
 *
 * Why point-to-point and not MPI_Allreduce and its kin: an MPI collective
 * cannot be interrupted and needs every process to call the same one on
 * the same communicator; a program whose processes disagree (a mismatch,
 * a device that returned early) would hang inside it.  Messages let a
 * waiting process keep reading what its peers say (their headers, their
 * exits) and fail with a located error instead.
 *
 * Small messages are sent from copies (transport_isend), so a sender
 * never waits for a small send to complete.
 *
 * Threads: MPI is initialised with MPI_THREAD_MULTIPLE; every function
 * may be called from any thread; one mutex guards the mailbox (with the
 * posted receives), another the sends from copies (but for one spare
 * copy, an atomic pointer); neither is taken while holding the other.
 */
#ifndef SHMAP_TRANSPORT_H
#define SHMAP_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>

/* Message classes (the tag's low 2 bits). */
enum { TRANSPORT_DATA = 0, TRANSPORT_HEADER = 1, TRANSPORT_EXIT = 2, TRANSPORT_END = 3 };

/* The tag of a message of [cls] with [key] (key < 2^28). */
static inline int transport_tag(int cls, int key) { return (key << 2) | cls; }

/* One piece of a message: [len] bytes at [base] (a gather or scatter list). */
typedef struct TransportIov {
  void *base;
  size_t len;
} TransportIov;

/* A small message taken from the mailbox: owned by the taker, freed with
 * transport_msg_free. */
typedef struct TransportMsg {
  struct TransportMsg *next;
  struct TransportExpect *home; /* the posted receive it landed in, which
                                   transport_msg_free gives back; or NULL */
  int source, tag;              /* sending process, tag */
  size_t len;
  _Alignas(16) char data[];     /* len bytes, 16-byte aligned */
} TransportMsg;

/* Starts the transport for a run of [ndevices] devices.  Under mpirun
 * (the launcher's environment says more than one process) initialises MPI
 * with MPI_THREAD_MULTIPLE; otherwise does nothing.  Returns the number of
 * devices this process holds (ndevices, or ndevices / P), or -1 with the
 * error set: ndevices not divisible by P, fewer devices than processes, a
 * build without MPI started under mpirun, MPI without thread support.
 * Main thread, once, before the device threads start. */
int transport_init(int ndevices);

/* How many processes the launcher started this one among (1 when not
 * under mpirun), and into [rank] (may be NULL) this one's place, read
 * from the launcher's environment without starting MPI: for the
 * command-line modes that must not start it (shmap --test). */
long transport_launched(int *rank);

/* The MPI library this build uses ("Open MPI 4.1.4"), or "none". */
const char *transport_library(void);

/* Tells every other process that this one has ended the program with
 * exit status [status] (a BYE message) and, unless NULL, [why] (the line
 * of its error, up to TRANSPORT_WHY_MAX bytes of it: a process other than
 * 0 writes nothing the user sees): a process still waiting for it in a
 * shard_map call then fails with transport_departed's error, which quotes
 * it, instead of waiting forever (the processes no longer run the same
 * program).  Main thread, before transport_finalize. */
enum { TRANSPORT_WHY_MAX = 480 };
void transport_bye(int status, const char *why);

/* Whether process [p] has said BYE without sending the awaited small
 * message [tag] first (it comes before a BYE): then -1 with an
 * ERR_COLLECTIVE error set saying that [what] (e.g. "the end of a
 * shard_map call") waits for a process that has ended; else 0.  Polls the
 * mailbox. */
int transport_departed(int p, int tag, const char *what);

/* What a thread waiting for a message does at its [turn]-th look (0, 1,
 * ...): when the job's processes on this machine outnumber its cores
 * (as mpirun judged from its slots: OMPI_MCA_mpi_oversubscribe; else the
 * online cores), gives the core away at once (sched_yield), since the
 * message may only come once a process sharing the core runs, as MPI's
 * own waits do then; else spins briefly (a pause instruction), yielding
 * from the 256th turn on.  A look at a ring costs a few loads, not MPI's
 * progress engine, so without this a waiter would spin its time slice
 * away while its peer waits for the core. */
void transport_idle(unsigned turn);

/* Ends MPI (MPI_Finalize) after a run that initialised it. */
void transport_finalize(void);

/* Ends every process of the job at once with [status] (MPI_Abort), or
 * exits with it when there is one process.  For errors that leave no
 * other way out (the processes no longer agree on what runs). */
_Noreturn void transport_abort(int status);

/* True when more than one process holds the devices. */
bool transport_active(void);

/* This process's number (0..P-1) and the number of processes (1 without
 * mpirun). */
int transport_rank(void);
int transport_procs(void);
/* The job's processes on this machine, this one among them (1 without
 * mpirun): what shares its cores (MPI_COMM_TYPE_SHARED). */
int transport_node_procs(void);

/* The process holding device [d], and whether it is this one. */
int transport_process_of(int d);
bool transport_is_local(int d);

/* Device [d]'s thread in this process's pool (d minus the first device
 * this process holds); only for local devices. */
int transport_pool_index(int d);

/* Sends a message of [niov] pieces to process [proc] with [tag] (MPI_Isend
 * of one hindexed datatype: no packing copy; each piece below 2 GiB).  The
 * pieces must stay alive and unchanged until transport_wait_sends returns.
 * Returns the handle transport_wait_sends completes and frees.  A message
 * of at most TRANSPORT_COPY_BYTES (a small one) is instead sent from a
 * copy the transport keeps until MPI is done with it, and frees itself
 * (MPI may complete such a send only once the receiver's MPI has taken
 * it in, which a sender should not wait for): then NULL, and the pieces
 * may change at once; transport_finalize completes what is left.  MPI's
 * own failures end the job (MPI_ERRORS_ARE_FATAL, its default). */
#define TRANSPORT_COPY_BYTES 4096
void *transport_isend(int proc, int tag, const TransportIov *iov, int niov);

/* Completes the sends [reqs] (handles of transport_isend; NULL entries are
 * skipped), polling the mailbox meanwhile, so two processes sending each
 * other large messages both make progress. */
void transport_wait_sends(void **reqs, int n);

/* transport_wait_sends for a collective that failed on this process:
 * meanwhile receives and drops the data messages with one of the [ntags]
 * [tags] (what its peers sent it for that collective, which nobody will
 * receive now), since a peer may in turn wait for its large sends to this
 * process to complete before it can go on. */
void transport_wait_sends_dropping(void **reqs, int n, const int *tags, int ntags);

/* Polls, then receives and drops the matched data messages whose tag has
 * (tag & mask) == value: those of a call every device of this process
 * has left, whose senders may wait for them to complete. */
void transport_drop_data(int mask, int value);

/* Moves every message that has arrived into the mailbox: small ones are
 * received, data messages only matched.  Cheap when nothing arrived. */
void transport_poll(void);

/* Takes the first small message from [source] (-1: any) with [tag] out of
 * the mailbox, or NULL.  Does not poll. */
TransportMsg *transport_take(int source, int tag);

/* A receive posted ahead for one small message (transport_expect). */
typedef struct TransportExpect TransportExpect;

/* Posts a receive for the small message [tag] from [source], of at most
 * [cap] bytes (a longer one ends the job: MPI's truncation error), so
 * that the message lands in its buffer on arrival and waiting for it
 * costs an MPI_Test at each turn instead of a probe.  When the message is
 * already in the mailbox, or comes from a process of this machine (whose
 * small messages come through its ring, which transport_expect_take reads
 * then), nothing is posted.  Until it is taken the
 * message counts as in the mailbox for every other function here: a poll
 * that completes the receive moves it there, in arrival order.  Returns
 * the handle, owned by the caller until transport_expect_take returns the
 * message or transport_expect_cancel; NULL when out of memory (then poll
 * and take).  At most one handle per (source, tag). */
TransportExpect *transport_expect(int source, int tag, size_t cap);

/* The message [e] awaits, taken (owned by the caller; [e] is freed), or
 * NULL when it has not arrived yet.  Tests the posted receive, or reads
 * the sender's ring; does not probe for other messages.  A message this test completes is the
 * receive's own buffer, not a copy: freeing it gives the buffer back for
 * the next transport_expect. */
TransportMsg *transport_expect_take(TransportExpect *e);

/* Stops waiting with [e] (NULL: nothing) and frees it: its receive is
 * cancelled, or, when the message came meanwhile, the message stays in
 * the mailbox (transport_clear drops it with the rest of its call). */
void transport_expect_cancel(TransportExpect *e);

/* Whether a small message from [source] with [tag] is in the mailbox
 * (not taken).  Does not poll. */
bool transport_has(int source, int tag);

/* Whether the data message from [source] with [tag] has been matched
 * (transport_poll) and not yet received.  Does not poll. */
bool transport_has_data(int source, int tag);

/* Calls fn(msg, arg) on every small message in the mailbox of class
 * [cls], in arrival order, under the mailbox lock; messages for which it
 * returns true are taken out (and passed to fn's ownership). */
void transport_scan(int cls, bool (*fn)(TransportMsg *m, void *arg), void *arg);

void transport_msg_free(TransportMsg *m);

/* Receives the data message from [source] with [tag] into the pieces
 * [iov] (which must total its length), waiting for it to arrive.  0, or
 * -1 with the error set when its length differs (then it is discarded). */
int transport_recv_data(int source, int tag, const TransportIov *iov, int niov);

/* Drops the messages in the mailbox whose tag has (tag & mask) == value
 * (data messages are received into a scratch buffer): at the end of a
 * shard_map call, once every process has said it ended, what is left of
 * that call belongs to nobody (a process already in the next call sends
 * with the other parity).  mask 0 drops everything. */
void transport_clear(int mask, int value);

#endif
