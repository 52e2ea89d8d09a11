/*
 * timeline.c - the per-thread event recorder (timeline.h).
 *
 * Each thread owns one Track, found through a thread-local pointer and
 * registered in a list under [tracks_lock] the first time the thread
 * records; only that thread appends to it.  The readers (tl_each_*) run
 * after the device threads stopped, so they need no lock for the
 * contents.
 */
#include "base/timeline.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "base/mem.h"

bool tl_record_on, tl_comm_on;

typedef struct Track {
  struct Track *next;  /* registration list, guarded by tracks_lock */
  int tid;
  char name[32];
  TlEvent *ev;
  long n, cap, dropped;
  TlComm *comm;
  long ncomm, capcomm;
} Track;

static pthread_mutex_t tracks_lock = PTHREAD_MUTEX_INITIALIZER;  /* guards tracks */
static Track *tracks;
static int anon_tid = 1000;                                       /* guarded too */
static _Thread_local Track *self;

void tl_start(bool trace, bool comm) {
  tl_record_on = trace;
  tl_comm_on = comm;
}

int64_t tl_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* This thread's track, registered on first use; NULL on out of memory. */
static Track *track(void) {
  if (self) return self;
  Track *t = shm_calloc(1, sizeof *t);
  if (!t) return NULL;
  pthread_mutex_lock(&tracks_lock);
  t->tid = anon_tid++;
  snprintf(t->name, sizeof t->name, "thread %d", t->tid - 1000);
  t->next = tracks;
  tracks = t;
  pthread_mutex_unlock(&tracks_lock);
  return self = t;
}

void tl_thread(int tid, const char *name) {
  Track *t = track();
  if (!t) return;
  t->tid = tid;
  snprintf(t->name, sizeof t->name, "%s", name);
}

/* Room for one more element of [*items] (each [size] bytes), doubling
 * up to [max]; false when full or out of memory. */
static bool grow(void **items, long n, long *cap, size_t size, long max) {
  if (n < *cap) return true;
  long ncap = *cap ? *cap * 2 : 256;
  if (ncap > max) ncap = max;
  if (ncap <= n) return false;
  void *p = shm_realloc(*items, (size_t)ncap * size);
  if (!p) return false;
  *items = p;
  *cap = ncap;
  return true;
}

void tl_event(const char *cat, const char *name, int64_t t0, int64_t t1, int nargs,
              const char *const *keys, const char *const *vals) {
  Track *t = track();
  if (!t) return;
  if (!grow((void **)&t->ev, t->n, &t->cap, sizeof *t->ev, TL_MAX_EVENTS)) {
    t->dropped++;
    return;
  }
  TlEvent *e = &t->ev[t->n++];
  *e = (TlEvent){.cat = cat, .t0 = t0, .t1 = t1};
  snprintf(e->name, sizeof e->name, "%s", name);
  e->nargs = nargs < TL_MAX_ARGS ? nargs : TL_MAX_ARGS;
  for (int i = 0; i < e->nargs; i++) {
    e->keys[i] = keys[i];
    snprintf(e->vals[i], sizeof e->vals[i], "%s", vals[i]);
  }
}

/* The count for (name, axes, line) on track [t], made when new. */
static TlComm *comm_slot(Track *t, const char *name, const char *axes, int line) {
  for (long i = t->ncomm - 1; i >= 0; i--) {
    TlComm *c = &t->comm[i];
    if (c->line == line && c->name == name && !strcmp(c->axes, axes)) return c;
  }
  if (!grow((void **)&t->comm, t->ncomm, &t->capcomm, sizeof *t->comm, 1 << 16)) return NULL;
  TlComm *c = &t->comm[t->ncomm++];
  *c = (TlComm){.name = name, .line = line};
  snprintf(c->axes, sizeof c->axes, "%s", axes);
  return c;
}

void tl_comm(const char *name, const char *axes, int line, int64_t bytes, int64_t ns) {
  Track *t = track();
  TlComm *c = t ? comm_slot(t, name, axes, line) : NULL;
  if (!c) return;
  c->calls++;
  c->bytes += bytes;
  c->ns += ns;
}

/* The tracks in tid order (an array the caller frees), count in [*n]. */
static Track **sorted_tracks(int *n) {
  int count = 0;
  for (Track *t = tracks; t; t = t->next) count++;
  Track **v = shm_calloc((size_t)count + 1, sizeof *v);
  if (!v) return NULL;
  int k = 0;
  for (Track *t = tracks; t; t = t->next) {
    int i = k++;
    while (i > 0 && v[i - 1]->tid > t->tid) {   /* insertion: a few tracks */
      v[i] = v[i - 1];
      i--;
    }
    v[i] = t;
  }
  *n = count;
  return v;
}

void tl_each_track(void (*fn)(int tid, const char *name, const TlEvent *ev, long n,
                              long dropped, void *ctx),
                   void *ctx) {
  int n;
  Track **v = sorted_tracks(&n);
  for (int i = 0; v && i < n; i++) fn(v[i]->tid, v[i]->name, v[i]->ev, v[i]->n, v[i]->dropped, ctx);
  shm_free(v);
}

void tl_each_comm(void (*fn)(int tid, const char *name, const TlComm *c, long n, void *ctx),
                  void *ctx) {
  int n;
  Track **v = sorted_tracks(&n);
  for (int i = 0; v && i < n; i++)
    if (v[i]->ncomm) fn(v[i]->tid, v[i]->name, v[i]->comm, v[i]->ncomm, ctx);
  shm_free(v);
}

void tl_free(void) {
  pthread_mutex_lock(&tracks_lock);
  while (tracks) {
    Track *t = tracks;
    tracks = t->next;
    shm_free(t->ev);
    shm_free(t->comm);
    shm_free(t);
  }
  pthread_mutex_unlock(&tracks_lock);
  self = NULL;
  tl_record_on = tl_comm_on = false;
}
