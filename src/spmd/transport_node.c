/*
 * transport_node.c - small messages between the processes of one machine
 * through an MPI-3 shared window (transport_node.h).
 */
#ifdef HAVE_MPI
#include "spmd/transport_node.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"

/* A ring's bytes: 8 of the longest messages, so a burst of a collective's
 * headers and exit records never waits in a queue.  SHMAP_TEST_RING_BYTES
 * makes them fewer (at least 128), for tests of full rings, the queues and
 * records that wrap around; a message then rides in a ring only if it
 * fits in half of one (node_msg_max). */
#define NODE_RING (8 * (NODE_MSG_MAX + 64))
#define NODE_RING_MIN 128

/* One ring, in its consumer's part of the window.  The producer writes
 * records at [tail] and then stores it (release); the consumer reads them
 * up to it and then stores [head] (release), which gives their bytes back.
 * Both only grow (64-bit: they never wrap). */
typedef struct Ring {
  _Alignas(64) _Atomic uint64_t tail;
  _Alignas(64) _Atomic uint64_t head;
  _Alignas(64) char buf[];     /* ring_bytes */
} Ring;

/* A record's head in a ring; its bytes follow, then zeros to a multiple
 * of 16.  A [wrap] record says the rest of the ring is unused and the next
 * record starts at its beginning. */
typedef struct Rec {
  uint32_t len;
  int32_t tag;
  uint32_t after;   /* MPI messages its sender had sent to its receiver */
  uint32_t wrap;
} Rec;

/* A record waiting for room in a ring, in its sender's memory. */
typedef struct Queued {
  struct Queued *next;
  int tag;
  uint32_t after;
  size_t len;
  char data[];
} Queued;

/* This process's side of the rings to one other process of the node. */
typedef struct Dest {
  pthread_mutex_t lock;           /* guards the ring's producer side and the queue */
  Ring *ring;                     /* this process's ring in that process's window */
  Queued *queue, **queue_tail;    /* records waiting for room, oldest first */
  atomic_uint mpi_sent;           /* MPI messages sent to it */
  unsigned mpi_matched;           /* MPI messages matched from it (mailbox lock) */
} Dest;

static MPI_Comm node = MPI_COMM_NULL;
static MPI_Win win = MPI_WIN_NULL;
static int node_n, node_me;
static int *node_rank_of;   /* world rank -> rank on the node, or -1 */
static int *world_of;       /* rank on the node -> world rank */
static char *rings;         /* this process's part: a ring per producer */
static size_t ring_bytes;   /* a ring's buffer: NODE_RING, a multiple of 64 */
static size_t msg_max;      /* node_msg_max */
static Dest *dests;
static atomic_int queued;   /* records in every queue */

static size_t rec_bytes(size_t len) { return sizeof(Rec) + ((len + 15) & ~(size_t)15); }

/* Maps world and node ranks; false when out of memory. */
static bool map_ranks(int nprocs) {
  node_rank_of = shm_malloc(sizeof(int) * (size_t)nprocs);
  world_of = shm_malloc(sizeof(int) * (size_t)node_n);
  dests = shm_calloc((size_t)node_n, sizeof(Dest));
  if (!node_rank_of || !world_of || !dests) return false;
  MPI_Group wg, ng;
  MPI_Comm_group(MPI_COMM_WORLD, &wg);
  MPI_Comm_group(node, &ng);
  int all[node_n];
  for (int i = 0; i < node_n; i++) all[i] = i;
  MPI_Group_translate_ranks(ng, node_n, all, wg, world_of);
  MPI_Group_free(&wg);
  MPI_Group_free(&ng);
  for (int p = 0; p < nprocs; p++) node_rank_of[p] = -1;
  for (int i = 0; i < node_n; i++) node_rank_of[world_of[i]] = i;
  return true;
}

/* Whether every process of the node has [ok] (an MPI_Allreduce over it). */
static bool all_agree(bool ok) {
  int mine = ok, all = 0;
  MPI_Allreduce(&mine, &all, 1, MPI_INT, MPI_MIN, node);
  return all != 0;
}

static void forget(void) {
  shm_free(node_rank_of);
  shm_free(world_of);
  shm_free(dests);
  node_rank_of = world_of = NULL;
  dests = NULL;
  if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
}

/* Producer [i]'s ring in the part of the window at [base]: from its
 * first 64-byte boundary, which a Ring's members need (MPI aligns a
 * shared window less).  Every process maps the window's pages alike, so
 * each finds the same boundary. */
static Ring *ring_at(char *base, int i) {
  char *b = (char *)(((uintptr_t)base + 63) & ~(uintptr_t)63);
  return (Ring *)(b + (sizeof(Ring) + ring_bytes) * (size_t)i);
}

/* The size of a ring's buffer (the same on every process: the variable
 * comes from mpirun). */
static size_t ring_size(void) {
  const char *v = getenv("SHMAP_TEST_RING_BYTES");
  long n = v && *v ? strtol(v, NULL, 10) : 0;
  if (n <= 0 || n >= NODE_RING) return NODE_RING;
  return n < NODE_RING_MIN ? NODE_RING_MIN : (size_t)n & ~(size_t)63;
}

bool node_open(MPI_Comm comm, int nprocs) {
  node = comm;
  ring_bytes = ring_size();
  msg_max = ring_bytes / 2 - sizeof(Rec) < NODE_MSG_MAX ? ring_bytes / 2 - sizeof(Rec)
                                                        : NODE_MSG_MAX;
  MPI_Comm_size(node, &node_n);
  MPI_Comm_rank(node, &node_me);
  bool ok = node_n > 1 && map_ranks(nprocs);
  /* a window no component can give (MPI's errors are otherwise fatal) */
  MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN);
  if (!all_agree(ok) ||   /* every process uses the rings, or none */
      MPI_Win_allocate_shared((MPI_Aint)(sizeof(Ring) + ring_bytes) * node_n + 64, 1,
                              MPI_INFO_NULL, node, &rings, &win) != MPI_SUCCESS) {
    forget();
    node_n = 0;
    win = MPI_WIN_NULL;
    return false;
  }
  memset(rings, 0, (sizeof(Ring) + ring_bytes) * (size_t)node_n + 64);
  for (int i = 0; i < node_n; i++) {
    MPI_Aint size;
    int unit;
    char *base = NULL;
    if (i != node_me) MPI_Win_shared_query(win, i, &size, &unit, &base);
    dests[i].ring = base ? ring_at(base, node_me) : NULL;
    dests[i].queue_tail = &dests[i].queue;
    pthread_mutex_init(&dests[i].lock, NULL);
  }
  /* every ring is zeroed before anyone writes into one */
  MPI_Barrier(node);
  return true;
}

size_t node_msg_max(void) { return msg_max; }

bool node_reaches(int proc) {
  return node_rank_of && proc >= 0 && node_rank_of[proc] >= 0 && node_rank_of[proc] != node_me;
}


void node_mpi_matched(int source) { dests[node_rank_of[source]].mpi_matched++; }

/* Writes a record into [d]'s ring when it has room (d's lock held). */
static bool ring_put(Dest *d, int tag, uint32_t after, const TransportIov *iov, int niov,
                     size_t len) {
  Ring *r = d->ring;
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
  uint64_t head = atomic_load_explicit(&r->head, memory_order_acquire);
  size_t need = rec_bytes(len), at = tail % ring_bytes;
  size_t gap = at + need > ring_bytes ? ring_bytes - at : 0;
  if (tail + gap + need - head > ring_bytes) return false;
  if (gap) {
    memcpy(r->buf + at, &(Rec){0, 0, 0, 1}, sizeof(Rec));
    at = 0;
  }
  memcpy(r->buf + at, &(Rec){(uint32_t)len, tag, after, 0}, sizeof(Rec));
  char *p = r->buf + at + sizeof(Rec);
  for (int i = 0; i < niov; p += iov[i].len, i++) memcpy(p, iov[i].base, iov[i].len);
  atomic_store_explicit(&r->tail, tail + gap + need, memory_order_release);
  return true;
}

/* Takes [d]'s oldest queued record off its queue and frees it (d's lock held). */
static void dequeue(Dest *d) {
  Queued *q = d->queue;
  if (!(d->queue = q->next)) d->queue_tail = &d->queue;
  atomic_fetch_sub_explicit(&queued, 1, memory_order_relaxed);
  shm_free(q);
}

/* Moves [d]'s queued records into its ring while it has room (d's lock held). */
static void flush(Dest *d) {
  for (Queued *q; (q = d->queue); dequeue(d)) {
    TransportIov v = {q->data, q->len};
    if (!ring_put(d, q->tag, q->after, &v, 1, q->len)) return;
  }
}

/* Queues a record behind [d]'s others (d's lock held). */
static bool enqueue(Dest *d, int tag, uint32_t after, const TransportIov *iov, int niov,
                    size_t len) {
  Queued *q = shm_malloc(sizeof *q + len);
  if (!q) return false;
  *q = (Queued){NULL, tag, after, len};
  char *p = q->data;
  for (int i = 0; i < niov; p += iov[i].len, i++) memcpy(p, iov[i].base, iov[i].len);
  *d->queue_tail = q;
  d->queue_tail = &q->next;
  atomic_fetch_add_explicit(&queued, 1, memory_order_relaxed);
  return true;
}

void *node_send_mpi(int proc, void (*spill)(int, int, const char *, size_t),
                    void *(*send)(void *), void *arg) {
  Dest *d = &dests[node_rank_of[proc]];
  pthread_mutex_lock(&d->lock);
  flush(d);
  for (Queued *q; (q = d->queue); dequeue(d)) {
    spill(proc, q->tag, q->data, q->len);
    atomic_fetch_add_explicit(&d->mpi_sent, 1, memory_order_relaxed);
  }
  void *r = send(arg);
  atomic_fetch_add_explicit(&d->mpi_sent, 1, memory_order_relaxed);
  pthread_mutex_unlock(&d->lock);
  return r;
}

bool node_send(int proc, int tag, const TransportIov *iov, int niov, size_t total) {
  Dest *d = &dests[node_rank_of[proc]];
  pthread_mutex_lock(&d->lock);
  uint32_t after = atomic_load_explicit(&d->mpi_sent, memory_order_relaxed);
  flush(d);
  bool ok = (!d->queue && ring_put(d, tag, after, iov, niov, total)) ||
            enqueue(d, tag, after, iov, niov, total);
  pthread_mutex_unlock(&d->lock);
  return ok;
}

/* Gives what producer [i]'s ring holds to [deliver], up to a record
 * waiting for an MPI message (all of them when [closing]). */
static void drain_one(int i, bool closing, void (*deliver)(int, int, const char *, size_t, void *),
                      void *arg) {
  Ring *r = ring_at(rings, i);
  uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed), start = head;
  uint64_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
  while (head < tail) {
    size_t at = head % ring_bytes;
    Rec h;
    memcpy(&h, r->buf + at, sizeof h);
    if (h.wrap) {
      head += ring_bytes - at;
      continue;
    }
    /* (a difference, so the counts may wrap around) */
    if (!closing && (int32_t)(h.after - dests[i].mpi_matched) > 0) break;
    deliver(world_of[i], h.tag, r->buf + at + sizeof h, h.len, arg);
    head += rec_bytes(h.len);
  }
  if (head != start) atomic_store_explicit(&r->head, head, memory_order_release);
}

static void drain(int source, bool closing,
                  void (*deliver)(int, int, const char *, size_t, void *), void *arg) {
  if (win == MPI_WIN_NULL) return;
  if (source >= 0) {
    drain_one(node_rank_of[source], closing, deliver, arg);
  } else {
    for (int i = 0; i < node_n; i++)
      if (i != node_me) drain_one(i, closing, deliver, arg);
  }
  if (!atomic_load_explicit(&queued, memory_order_relaxed)) return;
  for (int i = 0; i < node_n; i++) {
    if (i == node_me) continue;
    pthread_mutex_lock(&dests[i].lock);
    flush(&dests[i]);
    pthread_mutex_unlock(&dests[i].lock);
  }
}

void node_drain(int source, void (*deliver)(int, int, const char *, size_t, void *), void *arg) {
  drain(source, false, deliver, arg);
}

bool node_queued(void) { return atomic_load_explicit(&queued, memory_order_relaxed) > 0; }

void node_close(void (*deliver)(int, int, const char *, size_t, void *), void *arg) {
  if (win == MPI_WIN_NULL) return;
  /* a peer may still move its queue into this process's rings: read them
   * until every process of the node is past its own (the barrier) */
  while (node_queued()) {
    drain(-1, true, deliver, arg);
    sched_yield();
  }
  MPI_Request req;
  MPI_Ibarrier(node, &req);
  for (int done = 0;;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (done) break;
    drain(-1, true, deliver, arg);
    sched_yield();
  }
  MPI_Win_free(&win);
  for (int i = 0; i < node_n; i++) pthread_mutex_destroy(&dests[i].lock);
  forget();
}

#endif
