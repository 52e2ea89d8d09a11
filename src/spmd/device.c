/*
 * device.c - the pool of persistent device threads (device.h).
 *
 * A job is one dev_run call: the function, its context and one result slot
 * per rank.  dev_run hands each chosen Device its rank and wakes it; the
 * device runs fn, saves its error (if any) into the job, and the last one
 * to finish wakes the caller.
 */
#include "spmd/device.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "array/linalg.h"
#include "base/error.h"
#include "lang/eval.h"
#include "lang/exceptions.h"
#include "base/mem.h"
#include "base/timeline.h"
#include "spmd/transport.h"

/* Stack for a device thread: the evaluator recurses on it. */
#define DEV_STACK_BYTES (16u << 20)

typedef struct Job {
  void (*fn)(int rank, void *ctx);
  void *ctx;
  int n;
  int pending;          /* ranks not finished yet; guarded by pool.lock */
  ErrState *errs;       /* [n]; errs[r] written by rank r before it finishes */
  bool *failed;         /* [n] */
  bool *secondary;      /* [n] */
} Job;

typedef struct Device {
  pthread_t thread;
  int id;
  pthread_cond_t wake;  /* signalled when job is set or the pool stops */
  Job *job;             /* guarded by pool.lock: the job to run, NULL if idle */
  int rank;             /* guarded by pool.lock: the rank within job */
} Device;

static struct {
  pthread_mutex_t lock; /* guards: stopping, busy, every Device's job/rank,
                           every Job's pending */
  pthread_cond_t done;  /* signalled when a job's pending count reaches 0 */
  Device *devs;         /* [n]; set by dev_start before any thread runs */
  int n;
  bool stopping;
  bool busy;            /* a dev_run is in progress */
} pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, NULL, 0,
          false, false};

static _Thread_local DevCtx *tls_ctx;        /* device.h: dev_ctx */
static _Thread_local bool tls_on_device;     /* a pool thread */
static _Thread_local bool tls_secondary;     /* dev_error_secondary */

DevCtx *dev_ctx(void) { return tls_ctx; }
void dev_ctx_set(DevCtx *c) {
  tls_ctx = c;
  eval_on_device = c != NULL;
}
void dev_error_secondary(void) { tls_secondary = true; }
bool dev_error_is_secondary(void) { return tls_secondary; }

/* dev_run_error_secondary: one dev_run runs at a time (pool.busy), and the
 * debugger's runner calls it from a helper thread, so not thread-local. */
static atomic_bool run_secondary;

bool dev_run_error_secondary(void) { return atomic_load(&run_secondary); }
bool dev_on_device_thread(void) { return tls_on_device; }
int dev_count(void) { return pool.n; }

/* ---- mesh arithmetic ------------------------------------------------------- */

void dev_mesh_coords(const MeshDesc *m, int rank, int *coords) {
  for (int a = m->naxes - 1; a >= 0; a--) {
    coords[a] = rank % m->sizes[a];
    rank /= m->sizes[a];
  }
}

int dev_mesh_rank(const MeshDesc *m, const int *coords) {
  int rank = 0;
  for (int a = 0; a < m->naxes; a++) rank = rank * m->sizes[a] + coords[a];
  return rank;
}

int dev_mesh_axis(const MeshDesc *m, const char *name) {
  for (int a = 0; a < m->naxes; a++)
    if (m->names[a] == name || strcmp(m->names[a], name) == 0) return a;
  return -1;
}

char *dev_mesh_coords_str(const MeshDesc *m, int rank, char *buf, size_t cap) {
  if (!m) {
    snprintf(buf, cap, "(%d)", rank);
    return buf;
  }
  int coords[DEV_MAX_AXES];
  dev_mesh_coords(m, rank, coords);
  size_t len = 0;
  len += (size_t)snprintf(buf, cap, "(");
  for (int a = 0; a < m->naxes && len < cap; a++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%s=%d", a ? ", " : "",
                            m->names[a], coords[a]);
  if (len < cap) snprintf(buf + len, cap - len, ")");
  return buf;
}

char *dev_coords_str(const DevCtx *c, int rank, char *buf, size_t cap) {
  return dev_mesh_coords_str(c ? c->mesh : NULL, rank, buf, cap);
}

char *dev_vma_str(uint32_t vma, char *buf, size_t cap) {
  const MeshDesc *m = tls_ctx ? tls_ctx->mesh : NULL;
  size_t len = 0;
  if (cap) buf[0] = '\0';
  if (!vma || !m) return buf;
  len += (size_t)snprintf(buf, cap, "{V:");
  for (int k = 0, first = 1; k < m->naxes && len < cap; k++)
    if (vma & (1u << k)) {
      len += (size_t)snprintf(buf + len, cap - len, "%s%s", first ? "" : ",", m->names[k]);
      first = 0;
    }
  if (len < cap) snprintf(buf + len, cap - len, "}");
  return buf;
}

bool dev_checks_vma(void) { return tls_ctx && tls_ctx->mesh && !tls_ctx->unchecked; }

/* ---- running a job on one device ------------------------------------------- */

/* Moves this thread's error into the job, prefixed by where it happened. */
static void save_error(Job *job, int rank) {
  char where[256];
  DevCtx *c = tls_ctx;
  if (c && c->mesh)
    dev_coords_str(c, c->rank, where, sizeof where);   /* the mesh rank: under mpirun
                                                          the job runs only some */
  else
    snprintf(where, sizeof where, "%d", rank);
  ErrState *e = &job->errs[rank];
  err_save(e);
  err_state_tag_scopes(e, rank + 1);   /* pm() shows these frames on this device */
  const char *msg = e->msg ? e->msg : ERR_NOMEM_MSG;
  size_t cap = strlen(where) + strlen(msg) + 16;
  char *full = shm_malloc(cap);
  if (full) {
    snprintf(full, cap, "on device %s: %s", where, msg);
    shm_free(e->msg);
    e->msg = full;
  }
  job->failed[rank] = true;
  job->secondary[rank] = tls_secondary;
}

static void run_job(Job *job, int rank) {
  tls_ctx = NULL;
  tls_secondary = false;
  err_clear();
  job->fn(rank, job->ctx);
  if (err_occurred()) save_error(job, rank);
  exc_forget();   /* the thread may end before its next raise replaces it */
  tls_ctx = NULL;
}

static void *device_main(void *arg) {
  Device *d = arg;
  tls_on_device = true;
  shm_mem_set_device(d->id);   /* the payloads it makes are this device's */
  if (tl_recording() || tl_counting()) {   /* its own track on the timeline */
    /* the mesh's device number: across processes, this one's first is
     * its rank times its device count */
    int id = d->id + transport_rank() * pool.n;
    char name[32];
    snprintf(name, sizeof name, "device %d", id);
    tl_thread(1 + id, name);
  }
  pthread_mutex_lock(&pool.lock);
  for (;;) {
    while (!d->job && !pool.stopping) pthread_cond_wait(&d->wake, &pool.lock);
    if (!d->job) break;  /* stopping, and nothing left to run */
    Job *job = d->job;
    int rank = d->rank;
    pthread_mutex_unlock(&pool.lock);
    run_job(job, rank);
    pthread_mutex_lock(&pool.lock);
    d->job = NULL;
    if (--job->pending == 0) pthread_cond_signal(&pool.done);
  }
  pthread_mutex_unlock(&pool.lock);
  return NULL;
}

/* ---- start and stop ------------------------------------------------------------ */

static void stop_threads(int made) {
  pthread_mutex_lock(&pool.lock);
  pool.stopping = true;
  for (int i = 0; i < made; i++) pthread_cond_signal(&pool.devs[i].wake);
  pthread_mutex_unlock(&pool.lock);
  for (int i = 0; i < made; i++) {
    pthread_join(pool.devs[i].thread, NULL);
    pthread_cond_destroy(&pool.devs[i].wake);
  }
  shm_free(pool.devs);
  pool.devs = NULL;
  pool.n = 0;
  pool.stopping = false;
}

int dev_start(int n) {
  if (pool.n) return err_set(ERR_VALUE, "device pool already started"), -1;
  if (n < 1) return err_set(ERR_VALUE, "need at least 1 device, got %d", n), -1;
  if (shm_mem_track_devices(n) < 0) return err_nomem(), -1;
  pool.devs = shm_calloc((size_t)n, sizeof(Device));
  if (!pool.devs) return err_nomem(), -1;
  pool.n = n;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, DEV_STACK_BYTES);
  for (int i = 0; i < n; i++) {
    Device *d = &pool.devs[i];
    d->id = i;
    pthread_cond_init(&d->wake, NULL);
    if (pthread_create(&d->thread, &attr, device_main, d) != 0) {
      pthread_cond_destroy(&d->wake);
      pthread_attr_destroy(&attr);
      stop_threads(i);
      return err_set(ERR_MEMORY, "cannot start device thread %d of %d", i, n), -1;
    }
  }
  pthread_attr_destroy(&attr);
  return 0;
}

void dev_stop(void) {
  if (pool.n) stop_threads(pool.n);
}

/* ---- dev_run ------------------------------------------------------------------ */

static int check_ids(int n, const int *ids) {
  if (n < 1 || n > pool.n)
    return err_set(ERR_VALUE, "%d devices needed, but only %d exist "
                   "(use --devices %d or SHMAP_DEVICES=%d)", n, pool.n, n, n), -1;
  if (!ids) return 0;
  for (int r = 0; r < n; r++) {
    if (ids[r] < 0 || ids[r] >= pool.n)
      return err_set(ERR_VALUE, "device %d does not exist (there are %d)",
                     ids[r], pool.n), -1;
    for (int q = 0; q < r; q++)
      if (ids[q] == ids[r])
        return err_set(ERR_VALUE, "device %d is listed twice", ids[r]), -1;
  }
  return 0;
}

static void job_free(Job *job) {
  shm_free(job->errs);
  shm_free(job->failed);
  shm_free(job->secondary);
}

static int job_init(Job *job, int n, void (*fn)(int, void *), void *ctx) {
  *job = (Job){fn, ctx, n, n, NULL, NULL, NULL};
  job->errs = shm_calloc((size_t)n, sizeof(ErrState));
  job->failed = shm_calloc((size_t)n, sizeof(bool));
  job->secondary = shm_calloc((size_t)n, sizeof(bool));
  if (job->errs && job->failed && job->secondary) return 0;
  job_free(job);
  return err_nomem(), -1;
}

/* Restores the chosen rank's error on this thread and drops the others. */
static int collect_errors(Job *job) {
  int pick = -1;
  for (int r = 0; r < job->n && pick < 0; r++)
    if (job->failed[r] && !job->secondary[r]) pick = r;
  for (int r = 0; r < job->n && pick < 0; r++)
    if (job->failed[r]) pick = r;
  for (int r = 0; r < job->n; r++) {
    if (!job->failed[r] || r == pick) continue;
    err_state_free(&job->errs[r]);
  }
  if (pick < 0) return 0;
  atomic_store(&run_secondary, job->secondary[pick]);
  err_restore(&job->errs[pick]);
  return -1;
}

int dev_run(int n, const int *device_ids, void (*fn)(int rank, void *ctx),
            void *ctx) {
  if (tls_on_device)
    return err_set(ERR_VALUE, "shard_map cannot be called inside a shard_map "
                   "body"), -1;
  if (check_ids(n, device_ids) < 0) return -1;
  Job job;
  if (job_init(&job, n, fn, ctx) < 0) return -1;
  pthread_mutex_lock(&pool.lock);
  if (pool.busy) {
    pthread_mutex_unlock(&pool.lock);
    job_free(&job);
    return err_set(ERR_VALUE, "the devices are busy with another shard_map"), -1;
  }
  pool.busy = true;
  la_set_busy_devices(n);   /* their contractions share the cores */
  for (int r = 0; r < n; r++) {
    Device *d = &pool.devs[device_ids ? device_ids[r] : r];
    d->job = &job;
    d->rank = r;
    pthread_cond_signal(&d->wake);
  }
  while (job.pending > 0) pthread_cond_wait(&pool.done, &pool.lock);
  pool.busy = false;
  la_set_busy_devices(0);
  pthread_mutex_unlock(&pool.lock);
  int rc = collect_errors(&job);
  job_free(&job);
  return rc;
}
