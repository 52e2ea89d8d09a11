/*
 * transport.c - messages between the processes of an MPI job (transport.h).
 */
#include "spmd/transport.h"

#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>
#include <stdatomic.h>

#include "array/linalg.h"
#include "base/error.h"
#include "base/mem.h"

#ifdef HAVE_MPI
#include <mpi.h>

#include "spmd/transport_node.h"
#endif

static int nprocs = 1, myrank = 0, per_proc = 0;
static int node_procs = 1;   /* the job's processes on this machine */
static bool crowded;         /* they outnumber its cores */

/* Whether the launcher started more than one process: Open MPI's variable,
 * or the PMI ones of other launchers. */
static long launched_procs(void) {
  const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
  for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
    const char *v = getenv(vars[i]);
    long n = v && *v ? strtol(v, NULL, 10) : 0;
    if (n > 0) return n;
  }
  return 1;
}

long transport_launched(int *rank) {
  const char *vars[] = {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"};
  if (rank) {
    *rank = 0;
    for (size_t i = 0; i < sizeof vars / sizeof *vars; i++) {
      const char *v = getenv(vars[i]);
      if (v && *v) {
        *rank = (int)strtol(v, NULL, 10);
        break;
      }
    }
  }
  return launched_procs();
}

bool transport_active(void) { return nprocs > 1; }
int transport_rank(void) { return myrank; }
int transport_procs(void) { return nprocs; }
int transport_node_procs(void) { return node_procs; }
int transport_process_of(int d) { return nprocs > 1 ? d / per_proc : 0; }
bool transport_is_local(int d) { return transport_process_of(d) == myrank; }
int transport_pool_index(int d) { return nprocs > 1 ? d - myrank * per_proc : d; }

void transport_idle(unsigned turn) {
  if (crowded || turn >= 256) {
    sched_yield();
    return;
  }
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

#ifndef HAVE_MPI

int transport_init(int ndevices) {
  long procs = launched_procs();
  if (procs > 1)
    return err_set(ERR_VALUE, "started as one of %ld MPI processes, but this shmap was "
                   "built without MPI (--without-mpi, or ./configure found no Open MPI): rebuild it with "
                   "libopenmpi-dev installed, or run it without mpirun", procs), -1;
  per_proc = ndevices;
  return ndevices;
}

void transport_finalize(void) {}
void transport_bye(int status, const char *why) { (void)status, (void)why; }
int transport_departed(int p, int tag, const char *what) {
  (void)p, (void)tag, (void)what;
  return 0;
}
const char *transport_library(void) { return "none"; }
_Noreturn void transport_abort(int status) { exit(status); }
void *transport_isend(int proc, int tag, const TransportIov *iov, int niov) {
  (void)proc, (void)tag, (void)iov, (void)niov;
  return NULL;
}
void transport_wait_sends(void **reqs, int n) { (void)reqs, (void)n; }
void transport_wait_sends_dropping(void **reqs, int n, const int *tags, int ntags) {
  (void)reqs, (void)n, (void)tags, (void)ntags;
}
void transport_drop_data(int mask, int value) { (void)mask, (void)value; }
void transport_poll(void) {}
TransportMsg *transport_take(int source, int tag) { (void)source, (void)tag; return NULL; }
TransportExpect *transport_expect(int source, int tag, size_t cap) {
  (void)source, (void)tag, (void)cap;
  return NULL;
}
TransportMsg *transport_expect_take(TransportExpect *e) { (void)e; return NULL; }
void transport_expect_cancel(TransportExpect *e) { (void)e; }
bool transport_has(int source, int tag) { (void)source, (void)tag; return false; }
bool transport_has_data(int source, int tag) { (void)source, (void)tag; return false; }
void transport_scan(int cls, bool (*fn)(TransportMsg *m, void *arg), void *arg) {
  (void)cls, (void)fn, (void)arg;
}
void transport_msg_free(TransportMsg *m) { shm_free(m); }
int transport_recv_data(int source, int tag, const TransportIov *iov, int niov) {
  (void)source, (void)tag, (void)iov, (void)niov;
  return err_set(ERR_VALUE, "no other processes"), -1;
}
void transport_clear(int mask, int value) { (void)mask, (void)value; }

#else

static int check_split(int ndevices, int procs) {
  if (ndevices < procs)
    return err_set(ERR_VALUE, "%d devices over %d processes: every process needs at "
                   "least one device (--devices N with N a multiple of the process count)",
                   ndevices, procs), -1;
  if (ndevices % procs)
    return err_set(ERR_VALUE, "%d devices cannot be split evenly over %d processes "
                   "(--devices N needs N divisible by mpirun's -np)", ndevices, procs), -1;
  return 0;
}

static MPI_Comm comm = MPI_COMM_NULL;   /* all traffic; a duplicate of WORLD */

/* A matched data message not yet received. */
typedef struct Pending {
  struct Pending *next;
  int source, tag;
  MPI_Message msg;
  MPI_Count len;
} Pending;

/* The mailbox: guards small (received messages, arrival order) and data
 * (matched ones); every MPI_Improbe/MPI_Mrecv of the poll runs under it, so
 * messages of one sender enter in the order sent. */
static pthread_mutex_t box_lock = PTHREAD_MUTEX_INITIALIZER;
static TransportMsg *small_head, **small_tail = &small_head;
static Pending *data_head, **data_tail = &data_head;

/* A posted receive of one small message (transport_expect).  Those not
 * yet complete are on the list [expects] (under box_lock), in the order
 * posted; handles given back wait on [spare_expects] for the next
 * wait, with their buffers (no allocation of a few KiB at each one).
 * The buffer is a message of its own, so that the waiter whose test
 * completes the receive takes it as it is (transport_expect_take): no
 * copy, no allocation, until transport_msg_free gives it back. */
struct TransportExpect {
  TransportExpect *next;
  int source, tag;
  bool posted;                  /* on [expects], its receive pending */
  MPI_Request req;
  size_t cap;
  TransportMsg *msg;            /* its data (cap bytes): what the receive gets */
};
static TransportExpect *expects, *spare_expects;
/* One more spare handle, given back without box_lock (the header a
 * waiter took, freed after it was read: transport_msg_free) and taken
 * by the next expect_alloc. */
static _Atomic(TransportExpect *) quick_expect;

/* A small message sent from the transport's copy (send_copy), until its
 * send completes.  The pending ones are on the list [copies], oldest
 * first; copy_lock guards the list, ncopies and the spares (not box_lock,
 * which is held while large messages are received).  Never taken with
 * box_lock.  Every copy has room for COPY_CAP bytes (a small message, or a
 * record a ring's queue sends by MPI: node_send_mpi), so one whose
 * send completed serves any next one: up to COPY_SPARES of them wait on
 * [spare_copies] (a collective across processes sends one or two small
 * messages; without the spares each was an allocation and a free). */
typedef struct CopySend {
  struct CopySend *next;
  MPI_Request req;
  char data[];   /* COPY_CAP bytes */
} CopySend;
#define COPY_CAP (NODE_MSG_MAX > TRANSPORT_COPY_BYTES ? NODE_MSG_MAX : TRANSPORT_COPY_BYTES)
#define COPY_SPARES 16
static pthread_mutex_t copy_lock = PTHREAD_MUTEX_INITIALIZER;
static CopySend *copies, **copies_tail = &copies, *spare_copies;
static int ncopies, nspare_copies;
/* One more spare, taken and given back without copy_lock: Open MPI
 * completes the send of a message up to its inline size inside
 * MPI_Isend (it goes straight into the receiver's queue), so the copy of
 * a collective's header is free again at once and serves the next one;
 * the lock and the list cost a one-float psum ~170 instructions before
 * its send. */
static _Atomic(CopySend *) quick_copy;

/* Whether this machine has more of the job's processes than cores, as
 * Open MPI's mpirun decided it from its slots (and told its processes, whose
 * idle waits yield then), else as the count of online cores says.  The
 * devices of one process wait for one another in the engine, not here. */
static bool oversubscribed(void) {
  const char *v = getenv("OMPI_MCA_mpi_oversubscribe");
  if (v && *v) return strtol(v, NULL, 10) != 0;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return node_procs > (cores > 0 ? cores : 1);
}

int transport_init(int ndevices) {
  long procs = launched_procs();
  if (procs <= 1) {
    per_proc = ndevices;
    return ndevices;
  }
  int provided = 0;
  if (MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
    return err_set(ERR_VALUE, "MPI_Init_thread failed"), -1;
  MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
  MPI_Comm_rank(MPI_COMM_WORLD, &myrank);
  if (provided < MPI_THREAD_MULTIPLE)
    return err_set(ERR_VALUE, "this MPI does not support MPI_THREAD_MULTIPLE, which "
                   "shmap's device threads need"), -1;
  if (check_split(ndevices, nprocs) < 0) return -1;
  MPI_Comm node;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, myrank, MPI_INFO_NULL,
                          &node) == MPI_SUCCESS) {
    MPI_Comm_size(node, &node_procs);
    la_set_node_processes(node_procs);   /* they share this node's cores */
    /* the same answer on every process: the variable comes from mpirun */
    const char *off = getenv("SHMAP_MPI_NO_SHARED");
    if (off && *off) MPI_Comm_free(&node);
    else node_open(node, nprocs);   /* owns [node] from here */
  }
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  per_proc = ndevices / nprocs;
  crowded = oversubscribed();
  return per_proc;
}

#define STR_(x) #x
#define STR(x) STR_(x)
const char *transport_library(void) {
#ifdef OMPI_MAJOR_VERSION
  return "Open MPI " STR(OMPI_MAJOR_VERSION) "." STR(OMPI_MINOR_VERSION) "." STR(OMPI_RELEASE_VERSION);
#else
  return "MPI " STR(MPI_VERSION) "." STR(MPI_SUBVERSION);
#endif
}

/* A BYE's tag: the exit class with key bit 26, which no call's tag has
 * and transport_clear's callers never drop. */
#define BYE_TAG transport_tag(TRANSPORT_EXIT, 1 << 26)

void transport_bye(int status, const char *why) {
  if (comm == MPI_COMM_NULL) return;
  int s = status;
  size_t wl = why ? strnlen(why, TRANSPORT_WHY_MAX) : 0;
  TransportIov v[2] = {{&s, sizeof s}, {(void *)why, wl}};
  void *reqs[nprocs];
  for (int p = 0; p < nprocs; p++)
    reqs[p] = p == myrank ? NULL : transport_isend(p, BYE_TAG, v, wl ? 2 : 1);
  transport_wait_sends(reqs, nprocs);
}

int transport_departed(int p, int tag, const char *what) {
  if (comm == MPI_COMM_NULL) return 0;
  transport_poll();
  pthread_mutex_lock(&box_lock);
  const TransportMsg *m = small_head;
  while (m && !(m->source == p && (m->tag == BYE_TAG || m->tag == tag))) m = m->next;
  if (m && m->tag == tag) m = NULL;   /* what it waits for came first */
  int status = m ? *(const int *)m->data : 0;
  char why[TRANSPORT_WHY_MAX + 1] = "";
  if (m && m->len > sizeof status)
    snprintf(why, sizeof why, "%.*s", (int)(m->len - sizeof status), m->data + sizeof status);
  pthread_mutex_unlock(&box_lock);
  if (!m) return 0;
  err_set(ERR_COLLECTIVE, "process %d ended the program (exit status %d%s%s) while process %d "
          "waits for it in %s: the processes no longer run the same program", p, status,
          *why ? "; its error: " : "", why, myrank, what);
  return -1;
}

static void reap_copies(bool wait);
static void expect_free(TransportExpect *e);

static void drop_small(int source, int tag, const char *data, size_t len, void *arg) {
  (void)source, (void)tag, (void)data, (void)len, (void)arg;
}

void transport_finalize(void) {
  if (comm == MPI_COMM_NULL) return;
  transport_clear(0, 0);
  pthread_mutex_lock(&box_lock);
  node_close(drop_small, NULL);
  pthread_mutex_unlock(&box_lock);
  pthread_mutex_lock(&copy_lock);
  reap_copies(true);   /* the last small sends (a BYE) complete before the end */
  shm_free(atomic_exchange(&quick_copy, NULL));
  for (CopySend *c; (c = spare_copies);) {
    spare_copies = c->next;
    shm_free(c);
  }
  nspare_copies = 0;
  pthread_mutex_unlock(&copy_lock);
  TransportExpect *q = atomic_exchange(&quick_expect, NULL);
  if (q) expect_free(q);
  for (TransportExpect *e; (e = spare_expects);) {
    spare_expects = e->next;
    shm_free(e->msg);
    shm_free(e);
  }
  MPI_Comm_free(&comm);
  MPI_Finalize();
}

_Noreturn void transport_abort(int status) {
  fflush(stdout);
  fflush(stderr);
  if (comm != MPI_COMM_NULL) MPI_Abort(MPI_COMM_WORLD, status);
  exit(status);
}

/* One committed datatype for the pieces [iov] (absolute addresses: used
 * with MPI_BOTTOM), so a message needs no packing copy. */
static MPI_Datatype pieces_type(const TransportIov *iov, int niov) {
  int lens[niov > 0 ? niov : 1];
  MPI_Aint disp[niov > 0 ? niov : 1];
  for (int i = 0; i < niov; i++) {
    lens[i] = (int)iov[i].len;
    MPI_Get_address(iov[i].base, &disp[i]);
  }
  MPI_Datatype t;
  MPI_Type_create_hindexed(niov, lens, disp, MPI_BYTE, &t);
  MPI_Type_commit(&t);
  return t;
}

/* Beyond this many sends pending from copies a sender waits for the oldest
 * (a peer that stopped receiving must not make this process's memory grow). */
#define COPY_SENDS_MAX 256

/* Frees the copies whose sends have completed, oldest first, stopping at
 * the first pending one; with [wait] also waits for that one (copy_lock
 * held). */
static void reap_copies(bool wait) {
  while (copies) {
    int done = 1;
    if (wait)
      MPI_Wait(&copies->req, MPI_STATUS_IGNORE);
    else
      MPI_Test(&copies->req, &done, MPI_STATUS_IGNORE);
    if (!done) return;
    CopySend *c = copies;
    if (!(copies = c->next)) copies_tail = &copies;
    ncopies--;
    if (nspare_copies < COPY_SPARES) {
      c->next = spare_copies;
      spare_copies = c;
      nspare_copies++;
    } else {
      shm_free(c);
    }
  }
}

/* A copy for a small message: a spare, or a new one (copy_lock held;
 * NULL when out of memory). */
static CopySend *copy_alloc(void) {
  CopySend *c = spare_copies;
  if (!c) return shm_malloc(sizeof *c + COPY_CAP);
  spare_copies = c->next;
  nspare_copies--;
  return c;
}

/* A copy for a small message: the quick spare, else one under the lock
 * (NULL when out of memory). */
static CopySend *copy_take(void) {
  CopySend *c = atomic_exchange_explicit(&quick_copy, NULL, memory_order_acquire);
  if (c) return c;
  pthread_mutex_lock(&copy_lock);
  reap_copies(false);
  c = copy_alloc();
  pthread_mutex_unlock(&copy_lock);
  return c;
}

/* Gives back copy [c], whose send has completed: the quick spare when it
 * is free, else a spare under the lock. */
static void copy_give_back(CopySend *c) {
  CopySend *none = NULL;
  if (atomic_compare_exchange_strong_explicit(&quick_copy, &none, c, memory_order_release,
                                              memory_order_relaxed))
    return;
  pthread_mutex_lock(&copy_lock);
  if (nspare_copies < COPY_SPARES) {
    c->next = spare_copies;
    spare_copies = c;
    nspare_copies++;
    c = NULL;
  }
  pthread_mutex_unlock(&copy_lock);
  shm_free(c);
}

/* Sends [total] bytes of [iov] from a copy (a small message): false when
 * out of memory.  A send MPI has not completed at once joins the pending
 * list, which later sends and transport_finalize complete. */
static bool send_copy(int proc, int tag, const TransportIov *iov, int niov, size_t total) {
  CopySend *c = copy_take();
  if (!c) return false;
  char *p = c->data;
  for (int i = 0; i < niov; p += iov[i].len, i++) memcpy(p, iov[i].base, iov[i].len);
  c->next = NULL;
  int done = 0;
  MPI_Isend(c->data, (int)total, MPI_BYTE, proc, tag, comm, &c->req);
  MPI_Test(&c->req, &done, MPI_STATUS_IGNORE);
  if (done) {
    copy_give_back(c);
    return true;
  }
  pthread_mutex_lock(&copy_lock);
  reap_copies(false);
  if (ncopies >= COPY_SENDS_MAX) {   /* complete the oldest: its peer polls */
    MPI_Wait(&copies->req, MPI_STATUS_IGNORE);
    reap_copies(false);
  }
  *copies_tail = c;
  copies_tail = &c->next;
  ncopies++;
  pthread_mutex_unlock(&copy_lock);
  return true;
}

/* Ends the job when there is no memory to send a small message to
 * process [proc]: a message lost would leave a peer waiting. */
static _Noreturn void unsent(int proc) {
  fprintf(stderr, "shmap: error: out of memory sending a message to process %d\n", proc);
  transport_abort(1);
}

/* A small message to a process of this machine, through its ring:
 * false when it goes by MPI (data, or too long for a ring). */
static bool send_node(int proc, int tag, const TransportIov *iov, int niov, size_t total) {
  if ((tag & 3) == TRANSPORT_DATA || !node_reaches(proc) || total > node_msg_max()) return false;
  if (!node_send(proc, tag, iov, niov, total)) unsent(proc);
  return true;
}

static void *isend_mpi(int proc, int tag, const TransportIov *iov, int niov, size_t total);

/* A record of a ring's queue sent by MPI instead (node_send_mpi): from a
 * copy, which never fails but when memory is short. */
static void spill_record(int proc, int tag, const char *data, size_t len) {
  if (!send_copy(proc, tag, &(TransportIov){(void *)data, len}, 1, len)) unsent(proc);
}

/* The arguments of an isend_mpi that node_send_mpi runs. */
typedef struct MpiSend {
  int proc, tag;
  const TransportIov *iov;
  int niov;
  size_t total;
} MpiSend;

static void *isend_mpi_args(void *arg) {
  const MpiSend *m = arg;
  return isend_mpi(m->proc, m->tag, m->iov, m->niov, m->total);
}

void *transport_isend(int proc, int tag, const TransportIov *iov, int niov) {
  size_t total = 0;
  for (int i = 0; i < niov; i++) total += iov[i].len;
  if (send_node(proc, tag, iov, niov, total)) return NULL;
  if (!node_reaches(proc)) return isend_mpi(proc, tag, iov, niov, total);
  /* behind the records queued for [proc], which must not come after it */
  MpiSend m = {proc, tag, iov, niov, total};
  return node_send_mpi(proc, spill_record, isend_mpi_args, &m);
}

/* transport_isend by MPI. */
static void *isend_mpi(int proc, int tag, const TransportIov *iov, int niov, size_t total) {
  if (total <= TRANSPORT_COPY_BYTES && send_copy(proc, tag, iov, niov, total)) return NULL;
  MPI_Request *r = shm_malloc(sizeof *r);
  if (niov == 1) {   /* one piece: no datatype to make (a small message's latency) */
    if (r) MPI_Isend(iov[0].base, (int)iov[0].len, MPI_BYTE, proc, tag, comm, r);
    else MPI_Send(iov[0].base, (int)iov[0].len, MPI_BYTE, proc, tag, comm);
    return r;
  }
  MPI_Datatype t = pieces_type(iov, niov);
  if (!r) {   /* no memory for a handle: a blocking send, which the peer's poll completes */
    MPI_Send(MPI_BOTTOM, 1, t, proc, tag, comm);
    MPI_Type_free(&t);
    return NULL;
  }
  MPI_Isend(MPI_BOTTOM, 1, t, proc, tag, comm, r);
  MPI_Type_free(&t);   /* freed once the send no longer needs it */
  return r;
}

/* Completes [reqs], dropping meanwhile the data messages with one of the
 * [ntags] [tags] (none: polling only). */
static void wait_sends(void **reqs, int n, const int *tags, int ntags) {
  for (int i = 0; i < n; i++) {
    if (!reqs[i]) continue;
    for (int done = 0;;) {
      MPI_Test(reqs[i], &done, MPI_STATUS_IGNORE);
      if (done) break;
      if (!ntags) transport_poll();   /* (each drop polls) */
      for (int t = 0; t < ntags; t++) transport_drop_data(-1, tags[t]);
      sched_yield();
    }
    shm_free(reqs[i]);
    reqs[i] = NULL;
  }
}

void transport_wait_sends(void **reqs, int n) { wait_sends(reqs, n, NULL, 0); }

void transport_wait_sends_dropping(void **reqs, int n, const int *tags, int ntags) {
  wait_sends(reqs, n, tags, ntags);
}

/* Ends the job when there is no memory to receive process [source]'s
 * message: a message lost would leave a peer waiting. */
static _Noreturn void lost(int source) {
  fprintf(stderr, "shmap: error: out of memory receiving a message from process %d\n", source);
  transport_abort(1);
}

/* A small message of [len] bytes from [source] with [tag], appended to the
 * mailbox for the caller to fill (lock held). */
static TransportMsg *new_small(int source, int tag, size_t len) {
  TransportMsg *msg = shm_malloc(sizeof *msg + len + 16);
  if (!msg) lost(source);
  *msg = (TransportMsg){NULL, NULL, source, tag, len};
  *small_tail = msg;
  small_tail = &msg->next;
  return msg;
}

/* Receives matched small message [m] of [len] bytes into the mailbox (lock held). */
static void keep_small(MPI_Message *m, const MPI_Status *st, MPI_Count len) {
  TransportMsg *msg = new_small(st->MPI_SOURCE, st->MPI_TAG, (size_t)len);
  MPI_Mrecv(msg->data, (int)len, MPI_BYTE, m, MPI_STATUS_IGNORE);
}

static void keep_data(MPI_Message *m, const MPI_Status *st, MPI_Count len) {
  Pending *p = shm_malloc(sizeof *p);
  if (!p) lost(st->MPI_SOURCE);
  *p = (Pending){NULL, st->MPI_SOURCE, st->MPI_TAG, *m, len};
  *data_tail = p;
  data_tail = &p->next;
}

/* Takes [e] off the list of pending receives (lock held). */
static void unlist(TransportExpect *e) {
  TransportExpect **pp = &expects;
  while (*pp != e) pp = &(*pp)->next;
  *pp = e->next;
  e->posted = false;
}

/* Moves what [e]'s completed receive got (status [st]) into the mailbox,
 * copied (its buffer serves the next wait), and takes [e] off the list of
 * pending receives (lock held). */
static void keep_expected(TransportExpect *e, const MPI_Status *st) {
  int len = 0;
  MPI_Get_count(st, MPI_BYTE, &len);
  memcpy(new_small(st->MPI_SOURCE, st->MPI_TAG, (size_t)len)->data, e->msg->data, (size_t)len);
  unlist(e);
}

/* Tests [e]'s receive; when complete, moves its message into the mailbox
 * (lock held). */
static void test_expect(TransportExpect *e) {
  int done = 0;
  MPI_Status st;
  MPI_Test(&e->req, &done, &st);
  if (done) keep_expected(e, &st);
}

/* Moves the messages the posted receives got into the mailbox (lock
 * held): before any message probed after them, so one sender's messages
 * stay in the order sent there. */
static void harvest(void) {
  for (TransportExpect *e = expects, *next; e; e = next) {
    next = e->next;
    test_expect(e);
  }
}

/* Appends a small message a ring gave to the mailbox (lock held). */
static void keep_node(int source, int tag, const char *data, size_t len, void *arg) {
  (void)arg;
  memcpy(new_small(source, tag, len)->data, data, len);
}

static void poll_locked(void) {
  node_drain(-1, keep_node, NULL);
  harvest();
  for (;;) {
    int flag = 0;
    MPI_Message m;
    MPI_Status st;
    MPI_Improbe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm, &flag, &m, &st);
    if (!flag) return;
    /* a message sent before this one may have completed a posted receive
     * during the probe, or be in its sender's ring */
    harvest();
    bool near = node_reaches(st.MPI_SOURCE);
    if (near) node_drain(st.MPI_SOURCE, keep_node, NULL);
    MPI_Count len;
    MPI_Get_elements_x(&st, MPI_BYTE, &len);
    if ((st.MPI_TAG & 3) == TRANSPORT_DATA)
      keep_data(&m, &st, len);
    else
      keep_small(&m, &st, len);
    if (near) {   /* the records its sender wrote after it may go now */
      node_mpi_matched(st.MPI_SOURCE);
      node_drain(st.MPI_SOURCE, keep_node, NULL);
    }
  }
}

void transport_poll(void) {
  if (comm == MPI_COMM_NULL) return;
  pthread_mutex_lock(&box_lock);
  poll_locked();
  pthread_mutex_unlock(&box_lock);
}

/* Takes the first small message from [source] (-1: any) with [tag] out
 * of the mailbox (lock held), or NULL. */
static TransportMsg *take_locked(int source, int tag) {
  TransportMsg **pp = &small_head, *m = NULL;
  for (; *pp; pp = &(*pp)->next)
    if ((source < 0 || (*pp)->source == source) && (*pp)->tag == tag) break;
  if (*pp) {
    m = *pp;
    *pp = m->next;
    if (!*pp) small_tail = pp;
  }
  return m;
}

TransportMsg *transport_take(int source, int tag) {
  pthread_mutex_lock(&box_lock);
  TransportMsg *m = take_locked(source, tag);
  pthread_mutex_unlock(&box_lock);
  return m;
}

/* Whether the mailbox holds a small message from [source] with [tag] (lock held). */
static bool has_locked(int source, int tag) {
  const TransportMsg *m = small_head;
  while (m && !(m->source == source && m->tag == tag)) m = m->next;
  return m != NULL;
}

/* Gives handle [e] back (lock held). */
static void expect_free(TransportExpect *e) {
  e->next = spare_expects;
  spare_expects = e;
}

/* A handle for a receive of at most [cap] bytes: a spare one, or a new
 * one (lock held; NULL when out of memory). */
static TransportExpect *expect_alloc(size_t cap) {
  TransportExpect *q = atomic_exchange_explicit(&quick_expect, NULL, memory_order_acquire);
  if (q && q->cap >= cap) return q;
  if (q) expect_free(q);
  TransportExpect **pp = &spare_expects;
  while (*pp && (*pp)->cap < cap) pp = &(*pp)->next;
  TransportExpect *e = *pp;
  if (e) {
    *pp = e->next;
    return e;
  }
  if (!(e = shm_malloc(sizeof *e))) return NULL;
  if (!(e->msg = shm_malloc(sizeof *e->msg + cap))) {
    shm_free(e);
    return NULL;
  }
  e->cap = cap;
  return e;
}


TransportExpect *transport_expect(int source, int tag, size_t cap) {
  if (comm == MPI_COMM_NULL || cap > (size_t)INT_MAX) return NULL;
  pthread_mutex_lock(&box_lock);
  TransportExpect *e = expect_alloc(cap);
  if (e) {
    e->source = source;
    e->tag = tag;
    e->posted = false;
    e->req = MPI_REQUEST_NULL;
  }
  /* a process of this machine sends small messages through its ring,
   * which the waiter reads (transport_expect_take) */
  if (e && !has_locked(source, tag) && !node_reaches(source)) {
    /* not probed yet: the receive matches it, whether it is in MPI's queue
     * of unexpected messages now or comes later */
    MPI_Irecv(e->msg->data, (int)cap, MPI_BYTE, source, tag, comm, &e->req);
    e->posted = true;
    TransportExpect **pp = &expects;
    while (*pp) pp = &(*pp)->next;
    *pp = e;
    e->next = NULL;
  }
  pthread_mutex_unlock(&box_lock);
  return e;
}

/* Tests [e]'s receive for its waiter; when complete, its buffer is the
 * message, taken (lock held).  Nothing can be before it in the mailbox:
 * it was posted when no message of its tag was there, and one sender's
 * next message of that tag comes only after a later call. */
static TransportMsg *test_own(TransportExpect *e) {
  int done = 0;
  MPI_Status st;
  MPI_Test(&e->req, &done, &st);
  if (!done) return NULL;
  unlist(e);
  TransportMsg *m = e->msg;
  int len = 0;
  MPI_Get_count(&st, MPI_BYTE, &len);
  *m = (TransportMsg){NULL, e, st.MPI_SOURCE, st.MPI_TAG, (size_t)len};
  return m;
}

TransportMsg *transport_expect_take(TransportExpect *e) {
  pthread_mutex_lock(&box_lock);
  if (!e->posted && node_reaches(e->source)) node_drain(e->source, keep_node, NULL);
  TransportMsg *m = e->posted ? test_own(e) : take_locked(e->source, e->tag);
  if (m && !m->home) expect_free(e);
  pthread_mutex_unlock(&box_lock);
  return m;
}

void transport_expect_cancel(TransportExpect *e) {
  if (!e) return;
  pthread_mutex_lock(&box_lock);
  if (e->posted) {
    MPI_Status st;
    int cancelled = 0;
    MPI_Cancel(&e->req);
    MPI_Wait(&e->req, &st);
    MPI_Test_cancelled(&st, &cancelled);
    if (cancelled) unlist(e);
    else keep_expected(e, &st);   /* it came meanwhile: it joins the mailbox */
  }
  expect_free(e);
  pthread_mutex_unlock(&box_lock);
}

bool transport_has(int source, int tag) {
  pthread_mutex_lock(&box_lock);
  bool has = has_locked(source, tag);
  pthread_mutex_unlock(&box_lock);
  return has;
}

bool transport_has_data(int source, int tag) {
  pthread_mutex_lock(&box_lock);
  const Pending *p = data_head;
  while (p && !(p->source == source && p->tag == tag)) p = p->next;
  pthread_mutex_unlock(&box_lock);
  return p != NULL;
}

void transport_scan(int cls, bool (*fn)(TransportMsg *m, void *arg), void *arg) {
  pthread_mutex_lock(&box_lock);
  for (TransportMsg **pp = &small_head; *pp;) {
    TransportMsg *m = *pp, *next = m->next;   /* fn may free m */
    if ((m->tag & 3) != cls || !fn(m, arg)) {
      pp = &m->next;
      continue;
    }
    *pp = next;
    if (!*pp) small_tail = pp;
  }
  pthread_mutex_unlock(&box_lock);
}

void transport_msg_free(TransportMsg *m) {
  if (!m || !m->home) {
    shm_free(m);
    return;
  }
  TransportExpect *none = NULL;
  if (atomic_compare_exchange_strong_explicit(&quick_expect, &none, m->home,
                                              memory_order_release, memory_order_relaxed))
    return;
  pthread_mutex_lock(&box_lock);
  expect_free(m->home);
  pthread_mutex_unlock(&box_lock);
}

/* Takes the matched data message from [source] with [tag] (lock held), or NULL. */
static Pending *take_data(int source, int tag) {
  for (Pending **pp = &data_head; *pp; pp = &(*pp)->next) {
    Pending *p = *pp;
    if (p->source != source || p->tag != tag) continue;
    *pp = p->next;
    if (!*pp) data_tail = pp;
    return p;
  }
  return NULL;
}

static void discard(MPI_Message *m, MPI_Count len) {
  char *scratch = shm_malloc((size_t)len + 1);
  MPI_Mrecv(scratch, (int)len, MPI_BYTE, m, MPI_STATUS_IGNORE);
  shm_free(scratch);
}

int transport_recv_data(int source, int tag, const TransportIov *iov, int niov) {
  Pending *p;
  for (;;) {
    pthread_mutex_lock(&box_lock);
    poll_locked();
    p = take_data(source, tag);
    pthread_mutex_unlock(&box_lock);
    if (p) break;
    sched_yield();
  }
  size_t total = 0;
  for (int i = 0; i < niov; i++) total += iov[i].len;
  if ((size_t)p->len != total) {
    discard(&p->msg, p->len);
    size_t got = (size_t)p->len;
    shm_free(p);
    return err_set(ERR_VALUE, "a message of %zu bytes where %zu were expected", got, total),
           -1;
  }
  if (niov == 1) {
    MPI_Mrecv(iov[0].base, (int)iov[0].len, MPI_BYTE, &p->msg, MPI_STATUS_IGNORE);
  } else {
    MPI_Datatype t = pieces_type(iov, niov);
    MPI_Mrecv(MPI_BOTTOM, 1, t, &p->msg, MPI_STATUS_IGNORE);
    MPI_Type_free(&t);
  }
  shm_free(p);
  return 0;
}

/* Drops the matched data messages of tag & mask == value (lock held). */
static void drop_data_locked(int mask, int value) {
  Pending **pp = &data_head;
  data_tail = &data_head;
  while (*pp) {
    Pending *p = *pp;
    if ((p->tag & mask) == value) {
      *pp = p->next;
      discard(&p->msg, p->len);
      shm_free(p);
    } else {
      pp = &p->next;
      data_tail = pp;
    }
  }
}

void transport_drop_data(int mask, int value) {
  if (comm == MPI_COMM_NULL) return;
  pthread_mutex_lock(&box_lock);
  poll_locked();
  drop_data_locked(mask, value);
  pthread_mutex_unlock(&box_lock);
}

void transport_clear(int mask, int value) {
  if (comm == MPI_COMM_NULL) return;
  pthread_mutex_lock(&box_lock);
  poll_locked();
  TransportMsg **pm = &small_head;
  small_tail = &small_head;
  while (*pm) {
    TransportMsg *m = *pm;
    if ((m->tag & mask) == value) {
      *pm = m->next;
      shm_free(m);
    } else {
      pm = &m->next;
      small_tail = pm;
    }
  }
  drop_data_locked(mask, value);
  pthread_mutex_unlock(&box_lock);
}

#endif
