/*
 * collective.c - the collective engine (collective.h).
 *
 * Layout of the engine: this file has the group and its synchronisation
 * (publish, wait, barrier, baton), entering and leaving a collective and
 * the body, the lanes, and the primitive table's rows of the collectives;
 * collective_params.c the parameters, axes and participants;
 * collective_x.c the exchange across processes; collective_reduce.c
 * strided views, the reduction arithmetic and psum, pmax, pmin;
 * collective_move.c all_gather, psum_scatter, ppermute and all_to_all;
 * collective_ragged.c ragged_all_to_all.  What they share:
 * collective_impl.h.
 *
 * Locking.  One mutex per group, CollGroup.lock, guards every field marked
 * "guarded" in collective_impl.h: the slots' descriptor runs, the exits, the
 * baton and the abort state.  It is held only for bookkeeping, never while
 * data moves, and a device takes it only to publish a descriptor that
 * differs from its previous one, to sleep, or when something fails.  The rest
 * is atomics: a slot's published, done and gave_up counters, its in_coll
 * flag and line, its descriptor generation, and the barrier counters.
 * Changes that can fail a waiter (a device leaving the body or giving up, an
 * abort) and the reference mode's baton go through bump(): epoch++, a
 * broadcast of CollGroup.cond and of every slot's condition variable.
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
#include "spmd/collective_impl.h"

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

const char *coll_kind_name(int kind) { return prim_table[kind].rules.coll->api_name; }

/* ---- the group ----------------------------------------------------------- */

/* The online cores, asked once: sysconf reads a file under /sys on every
 * call, which a group made for each eager shard_map call would pay. */
static int ncores(void) {
  static atomic_int n;
  int k = atomic_load_explicit(&n, memory_order_relaxed);
  if (k) return k;
  long c = sysconf(_SC_NPROCESSORS_ONLN);
  k = c > 0 ? (int)c : 1;
  atomic_store_explicit(&n, k, memory_order_relaxed);
  return k;
}

/* The device threads that may run at once on this machine in a group of
 * [mesh]: its devices in this process, times the job's processes here
 * (each holds as many).  Devices on other machines take no core here. */
static int threads_here(const MeshDesc *mesh) {
  int local = 0;
  for (int r = 0; r < mesh->ndevices; r++)
    local += transport_is_local(mesh->device_ids ? mesh->device_ids[r] : r);
  return local * transport_node_procs();
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
  s->xread_peers = shm_calloc((size_t)n, sizeof(int));
  s->xexit = shm_malloc(TRANSPORT_COPY_BYTES);
  return s->lpeers && s->xreqs && s->xread_peers && s->xexit ? 0 : -1;
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
  g->spin = !reference && threads_here(mesh) <= ncores();
  init_lock(&g->lock, g->spin);
  pthread_cond_init(&g->cond, NULL);
  atomic_init(&g->epoch, 0);
  for (int r = 0; r < n; r++) {
    Slot *s = &g->slots[r];
    atomic_init(&s->published, -1);
    s->seq = -1;
    atomic_init(&s->done, -1);
    atomic_init(&s->gave_up, -1);
    atomic_init(&s->xlead_seq, -1);
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
      coll_memo_free(&g->slots[r]);
      shm_free(g->slots[r].own);
      coll_x_tab_free(&g->slots[r]);
      shm_free(g->slots[r].xhdr);
      coll_x_seen_free(&g->slots[r]);
      shm_free(g->slots[r].lpeers);
      shm_free(g->slots[r].xreqs);
      shm_free(g->slots[r].xread_peers);
      shm_free(g->slots[r].xexit);
      val_decref(g->slots[r].xsmall ? &g->slots[r].xsmall->hdr : NULL);
      shm_free(g->slots[r].xmis);
      shm_free(g->slots[r].xruns);
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

bool coll_desc_equal(const CollDesc *a, const CollDesc *b) {
  if (a->kind != b->kind || a->naxes != b->naxes) return false;
  for (int i = 0; i < a->naxes; i++)
    if (a->axes[i] != b->axes[i]) return false;
  return coll_sig_equal(a, b) && strcmp(a->params, b->params) == 0;
}

/* "psum over 'i' of f32[4] at line 7"; with [with_params] (when only the
 * parameters differ) "all_gather[tiled=True ...] over ...". */
static void desc_str(const CollGroup *g, const CollDesc *d, bool with_params,
                     char *buf, size_t cap) {
  char axes[128], line[32] = "", sig[512];
  coll_axes_str(&g->mesh, d, axes, sizeof axes);
  coll_sig_str(d, sig, sizeof sig);
  if (d->line > 0) snprintf(line, sizeof line, " at line %d", d->line);
  snprintf(buf, cap, "%s%s%s%s over %s of %s%s", coll_kind_name(d->kind),
           with_params ? "[" : "", with_params ? d->params : "",
           with_params ? "]" : "", axes, sig, line);
}

const char *coll_coords_of(const CollGroup *g, int rank, char *buf, size_t cap) {
  return dev_mesh_coords_str(&g->mesh, rank, buf, cap);
}

/* Keeps what caller [a] found, that [b] reached [db] where it reached
 * [da] (its current collective), for its exit record (XMismatch); nothing
 * without other processes, or when out of memory. */
static void note_mismatch(CollGroup *g, int a, const CollDesc *da, int b, const CollDesc *db) {
  Slot *s = &g->slots[a];
  if (!transport_active() || (!s->xmis && !(s->xmis = shm_malloc(sizeof *s->xmis)))) return;
  s->xmis->seq = s->seq;
  s->xmis->rank[0] = a, s->xmis->rank[1] = b;
  s->xmis->desc[0] = *da, s->xmis->desc[1] = *db;
}

int coll_mismatch_error(CollGroup *g, int a, const CollDesc *da, int b,
                        const CollDesc *db) {
  note_mismatch(g, a, da, b, db);
  if (b < a) {
    int t = a; a = b; b = t;
    const CollDesc *td = da; da = db; db = td;
  }
  bool params = da->kind == db->kind && da->naxes == db->naxes &&
                memcmp(da->axes, db->axes, sizeof(int) * (size_t)da->naxes) == 0 &&
                coll_sig_equal(da, db);
  char ca[128], cb[128], sa[1024], sb[1024];
  desc_str(g, da, params, sa, sizeof sa);
  desc_str(g, db, params, sb, sizeof sb);
  err_set(ERR_COLLECTIVE, "collective mismatch: device %s reached %s, device "
          "%s reached %s", coll_coords_of(g, a, ca, sizeof ca), sa,
          coll_coords_of(g, b, cb, sizeof cb), sb);
  return -1;
}

int coll_left_error(CollGroup *g, const Call *c, int p, bool gave_up) {
  const Slot *s = &g->slots[p];
  char cp[128], cm[128], what[1024], line[32] = "";
  desc_str(g, &c->desc, false, what, sizeof what);
  coll_coords_of(g, p, cp, sizeof cp);
  coll_coords_of(g, c->rank, cm, sizeof cm);
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

int coll_passed_error(CollGroup *g, const Call *c, int p) {
  char cp[128], cm[128], what[1024];
  desc_str(g, &c->desc, false, what, sizeof what);
  return err_set(ERR_COLLECTIVE, "collective mismatch: device %s reached %s, device %s "
                 "went past its collective number %ld without device %s",
                 coll_coords_of(g, c->rank, cm, sizeof cm), what, coll_coords_of(g, p, cp, sizeof cp),
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
    if (d && !coll_desc_equal(d, &c->desc))
      return coll_mismatch_error(g, c->rank, &c->desc, p, d);
    if (!d && atomic_load(&s->met[c->rank]) != c->seq) return coll_passed_error(g, c, p);
    return pub > c->seq || atomic_load(&s->gave_up) != c->seq ? 1 : -2;
  }
  return s->exited ? coll_left_error(g, c, p, false) : 0;
}

int coll_abort_error(CollGroup *g) {
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
      coll_abort_error(g);  /* replaces the peer's error when aborted */
      return -1;
    }
    if (r == -2 && gave_up < 0) gave_up = c->peers[i];
    if (r != 1) ready = 0;
  }
  if (ready) return 1;
  if (coll_abort_error(g) < 0) return -1;
  return gave_up >= 0 ? coll_left_error(g, c, gave_up, true) : 0;
}

/* ---- entering and leaving a collective -------------------------------------- */

/* Whether the caller's descriptor continues its current run, so that
 * publishing needs no lock (the owner reads its own runs). */
static bool same_run(const Call *c) {
  const Slot *s = &c->g->slots[c->rank];
  return s->nruns > 0 && coll_desc_equal(&s->runs[(s->nruns - 1) % COLL_HIST].d, &c->desc);
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
  s->shareable = c->out && c->out[0] && arr_shareable(c->out[0]);
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

int coll_rendezvous(Call *c) {
  if (!tl_recording() && !tl_counting()) return rendezvous_(c);
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
    if (coll_abort_error(g) < 0) {
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

bool coll_barrier(Call *c) {
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
  coll_axes_str(&c->g->mesh, &c->desc, axes, sizeof axes);
  if (tl_counting()) tl_comm(coll_kind_name(c->desc.kind), axes, c->desc.line, bytes, t1 - c->t0);
  if (!tl_recording()) return;
  snprintf(line, sizeof line, "%d", c->desc.line);
  const char *keys[] = {"axes", "line"}, *vals[] = {axes, line};
  tl_event("collective", coll_kind_name(c->desc.kind), c->t0, t1, 2, keys, vals);
  if (c->waited_for >= 0) coll_coords_of(c->g, c->waited_for, who, sizeof who);
  const char *wkeys[] = {"waited for", "axes"}, *wvals[] = {who, axes};
  tl_event("wait", coll_kind_name(c->desc.kind), c->wait0, c->wait1, 2, wkeys, wvals);
}

void coll_finish(Call *c) {
  if (tl_recording() || tl_counting()) record(c);
  Slot *me = &c->g->slots[c->rank];
  atomic_store_explicit(&me->in_coll, false, memory_order_relaxed);
  atomic_store(&me->done, c->seq);
  wake_slot(c->g, me, false);
}

void coll_leave(Call *c) {
  coll_barrier(c);
  coll_finish(c);
}

int coll_call_init(Call *c, PrimId kind, const Params *p, Array **in,
                   int nin, Array **out) {
  const char *prim = coll_kind_name(kind);
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
  if (tl_recording() || tl_counting()) c->t0 = tl_now();
  coll_sig_of(in, nin, &c->desc);
  c->xin = NULL;
  CallMemo *m = &s->memo;
  if (coll_memo_hit(m, kind, p)) {
    c->desc.naxes = m->naxes;
    memcpy(c->desc.axes, m->axes, sizeof(int) * (size_t)m->naxes);
    c->n = m->n;
    c->pos = m->pos;
    c->axis_size = m->axis_size;
    c->cross = m->cross;
    memcpy(c->desc.params, m->params, strlen(m->params) + 1);
  } else {
    coll_memo_clear(m);  /* coll_find_participants rewrites the peers */
    /* the device's mesh, not the group's: a nested shard_map makes more
     * axes manual for the length of its body (shardmap.c) */
    if (coll_ctx_axes(ctx, prim, p, c->desc.axes, &c->desc.naxes) < 0 ||
        coll_find_participants(c, prim, p) < 0)
      return -1;
    coll_params_canon(p, c->desc.params, sizeof c->desc.params);
    c->cross = false;
    for (int i = 0; i < c->n && !c->cross; i++) c->cross = !coll_x_local(c->g, c->peers[i]);
    coll_memo_fill(m, kind, p, c);
  }
  return 0;
}

/* ---- lanes: small reductions without a final barrier ------------------------- */

bool coll_uses_lane(const Call *c, const Array *x) {
  return !c->g->reference && !c->cross && c->n > 1 &&
         (size_t)x->size * dt_size(x->dtype) <= COLL_LANE_BYTES;
}

char *coll_lane_data(Slot *s, int k, size_t bytes) {
  return bytes <= COLL_INLINE_BYTES ? s->inline_lane[k] : s->lane[k].data;
}

/* A reader of what the caller wrote for collective #seq (participants
 * [peers]) not yet done with it, or -1 when none is.  With [locked] (lock
 * held) a reader that left the body counts as done (it reads nothing
 * more); without, it is only found when the lock is taken. */
static int readers_blocker(Slot *me, const CollGroup *g, long seq, int n, const int *peers,
                           bool locked) {
  for (int i = 0; i < n; i++) {
    int p = peers[i];
    if (me->known_done[p] >= seq) continue;
    me->known_done[p] = atomic_load(&g->slots[p].done);
    if (me->known_done[p] < seq && !(locked && g->slots[p].exited)) return p;
  }
  return -1;
}

typedef struct ReadersArg {
  Slot *me;
  const CollGroup *g;
  long seq;
  int n;
  const int *peers;
} ReadersArg;

static bool readers_done(void *arg) {
  ReadersArg *a = arg;
  return readers_blocker(a->me, a->g, a->seq, a->n, a->peers, false) < 0;
}

void coll_wait_readers(Call *c, long seq, int n, const int *peers) {
  CollGroup *g = c->g;
  Slot *me = &g->slots[c->rank];
  ReadersArg a = {me, g, seq, n, peers};
  if (seq < 0 || readers_done(&a) ||
      spin_until(g, me, readers_done, &a, atomic_load(&g->epoch)))
    return;
  pthread_mutex_lock(&g->lock);
  for (int p; (p = readers_blocker(me, g, seq, n, peers, true)) >= 0;) {
    Slot *s = &g->slots[p];
    atomic_fetch_add(&s->sleepers, 1);
    if (atomic_load(&s->done) < seq && !s->exited) timed_wait(g, &s->wake);
    atomic_fetch_sub(&s->sleepers, 1);
  }
  pthread_mutex_unlock(&g->lock);
}

/* Waits until the caller's lane of parity c->seq % 2 may be written: its
 * readers (the participants of collective #seq - 2) are done with it or
 * left the body.  They are past that collective's arrival, so they finish
 * without running user code, and the wait is bounded. */
static void lane_reusable(Call *c, Lane *lane) {
  coll_wait_readers(c, lane->seq, lane->n, lane->peers);
}

void coll_lane_write(Call *c, const Array *x) {
  Slot *me = &c->g->slots[c->rank];
  int k = (int)(c->seq % 2);
  Lane *lane = &me->lane[k];
  size_t bytes = (size_t)x->size * dt_size(x->dtype);
  char *data = coll_lane_data(me, k, bytes);
  lane_reusable(c, lane);
  if (x->contiguous || x->ndim == 0)
    memcpy(data, arr_data(x), bytes);
  else if (x->size > 0)
    coll_read_flat(data, x, 0, x->size);
  lane->seq = c->seq;
  lane->n = 0;
  for (int i = 0; i < c->n; i++)
    if (c->peers[i] != c->rank) lane->peers[lane->n++] = c->peers[i];
}

/* Sets up [c] on the calling device: group, axes, participants, descriptor.
 * A call with the parameters of the device's previous one takes the
 * axes, participants and parameter text from the memo. */

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
  if (transport_active()) coll_x_send_exit(g, s, rank, line, failed);
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
  int n = coll_flat_size(m, d->axes, d->naxes), shown = 0, more = 0;
  for (int i = 0; i < n; i++) {
    int p = coll_rank_at(m, d->axes, d->naxes, coords, i);
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
    coll_axes_str(&g->mesh, d, axes, sizeof axes);
    if (d->line > 0) snprintf(line, sizeof line, " at line %d", d->line);
    snprintf(buf, cap, "%s over %s%s", coll_kind_name(d->kind), axes, line);
    append_missing(g, rank, d, seq, buf, cap);
  }
  pthread_mutex_unlock(&g->lock);
  return in;
}

bool coll_waits_for_peer(CollGroup *g, int rank) {
  pthread_mutex_lock(&g->lock);
  Slot *s = &g->slots[rank];
  long seq = atomic_load(&s->published);
  CollDesc buf_d;
  const CollDesc *d = atomic_load(&s->in_coll) ? desc_at(s, seq, &buf_d) : NULL;
  /* with axis_index_groups the participants are not the axes' own: any
   * wait counts, as coll_waiting_str's */
  bool waits = d && strstr(d->params, "axis_index_groups") && !strstr(d->params, "axis_index_groups=None");
  int n = d && !waits ? coll_flat_size(&g->mesh, d->axes, d->naxes) : 0;
  for (int i = 0; i < n && !waits; i++) {
    int p = coll_rank_at(&g->mesh, d->axes, d->naxes, s->ctx.coords, i);
    waits = p != rank && atomic_load(&g->slots[p].published) < seq;
  }
  pthread_mutex_unlock(&g->lock);
  return waits;
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
    if (coll_x_local(g, r)) {
      ranks[nl] = r;
      pool[nl++] = transport_pool_index(coll_x_device(g, r));
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
  while (r < d->rank && !coll_x_local(d->group, r)) r++;
  return r == d->rank;
}

/* ---- link-time default ------------------------------------------------------------- */

/* Until eval.c defines it, collectives report no line; eval.c's strong
 * definition replaces this weak one. */
__attribute__((weak)) Loc eval_current_loc(void) {
  Loc none = {NULL, 0, 0};
  return none;
}

/* ---- the primitive table's rows of the collectives --------------------- */

void coll_register_rows(const CollRow *rows, size_t n) {
  for (size_t i = 0; i < n; i++) prim_register(rows[i].id, &rows[i].rules);
}

void coll_register_prims(void) {
  coll_reduce_register();
  coll_move_register();
  coll_ragged_register();
}

int coll_for_reduce(PrimId reduce) {
  for (int id = 0; id < P_COUNT; id++) {
    const CollRules *c = prim_table[id].rules.coll;
    if (c && c->reduces && c->reduce == reduce) return id;
  }
  return -1;
}
