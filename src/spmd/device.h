/*
 * device.h - the pool of device threads and the per-device context.
 *
 * A "device" is a persistent pthread.  dev_start() makes N of them once, at
 * start-up; every shard_map call borrows some of them through dev_run()
 * (or coll_run(), collective.h, which adds the collective machinery) and
 * they go back to sleep when the call ends.  The main thread only waits
 * while devices run, so the evaluator state it owns (module globals) is
 * read-only for the duration of a call.
 *
 * Meshes.  A MeshDesc is the plain C description of a mesh: up to
 * DEV_MAX_AXES named axes with sizes, and the device order.  Ranks number
 * the mesh positions row-major over the axes as given (the last axis
 * varies fastest), exactly as `mesh m(i=4, j=2)` numbers device (i, j) as
 * i*2 + j; device_ids[rank] says which pool thread runs that position (the
 * `devices [...]` clause of LANGUAGE.md §3).
 *
 * Per-device context.  While a shard_map body runs, dev_ctx() on a device
 * thread returns that device's DevCtx: the mesh, its rank and coordinates,
 * the CollGroup of the call (the rendezvous of its collectives) and whether
 * the call runs in reference mode.  Outside a body it returns NULL; the
 * collectives use that to say "psum can only be used inside a shard_map
 * body".
 *
 * Errors.  error.h's state is thread-local, so each device fails on its own.
 * dev_run moves the error of the first failing rank (in rank order) to the
 * calling thread, prefixed with the device's mesh coordinates ("on device
 * (i=1, j=0): ...").  Errors a device raised only because a peer failed or
 * left (dev_error_secondary) lose to a peer's own error, so the user sees
 * the cause, not its echo.
 *
 * Locking (device.c): one mutex, pool.lock, guards the pool's job fields
 * and every Device's job fields; each Device sleeps on its own condition
 * variable, and the caller of dev_run sleeps on pool.done.  No other lock
 * is taken while pool.lock is held.
 */
#ifndef SHMAP_DEVICE_H
#define SHMAP_DEVICE_H

#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

#define DEV_MAX_AXES 8     /* mesh axes; vma sets are bit masks over them */

/* A mesh as the device layer sees it.  Filled in by the caller (the
 * shard_map layer, from a Mesh value); the strings are interned names and
 * device_ids is borrowed: both must outlive every use of the descriptor. */
typedef struct MeshDesc {
  int naxes;                            /* 0..DEV_MAX_AXES */
  const char *names[DEV_MAX_AXES];      /* interned axis names, in mesh order */
  int sizes[DEV_MAX_AXES];              /* axis sizes, each >= 1 */
  int ndevices;                         /* product of sizes */
  const int *device_ids;                /* rank -> pool device; NULL: identity */
  uint32_t auto_axes;                   /* axes a partial-manual shard_map leaves
                                           automatic (its axis_names= omits them):
                                           no collective may name one */
} MeshDesc;

struct CollGroup;

/* The context of one device inside one shard_map call (thread-local
 * pointer; the storage belongs to the call's CollGroup). */
typedef struct DevCtx {
  const MeshDesc *mesh;                 /* the call's mesh (borrowed) */
  int rank;                             /* row-major position in the mesh */
  int coords[DEV_MAX_AXES];             /* this device's index along each axis */
  struct CollGroup *group;              /* rendezvous of the call's collectives */
  bool reference;                       /* reference mode: one device at a time,
                                           collectives by the simple algorithm */
  bool unchecked;                       /* the call's check_rep=False: values keep
                                           their vma sets, but no rule checks them
                                           (JAX's check_vma=False) */
} DevCtx;

/* ---- the pool ------------------------------------------------------------- */

/* Starts [n] device threads (n >= 1).  Called once; a second call with the
 * pool running is an error.  Returns 0, or -1 with the error set when a
 * thread cannot be created (the ones made are stopped again). */
int dev_start(int n);

/* Stops and joins every device thread.  Must not be called from a device
 * thread or while a dev_run is in progress.  Safe when never started. */
void dev_stop(void);

/* Number of device threads in the pool (0 before dev_start). */
int dev_count(void);

/* True on a pool thread. */
bool dev_on_device_thread(void);

/*
 * Runs fn(rank, ctx) for rank = 0..n-1, rank r on pool device
 * device_ids[r] (NULL: device r), and waits until every rank returned.
 * The calling thread only waits.  fn reports failure by returning with this
 * thread's error set.  Returns 0 when no rank failed; otherwise -1 with the
 * calling thread's error set to the first failing rank's error (primary
 * errors before secondary ones, see above), its message prefixed with
 * "on device (i=1, j=0): " when fn had set a DevCtx (dev_ctx_set), else
 * "on device 3: ".  Errors of its own: n out of range, a device id out of
 * range or listed twice, a call from a device thread (nested shard_map),
 * out of memory.
 */
int dev_run(int n, const int *device_ids, void (*fn)(int rank, void *ctx),
            void *ctx);

/* ---- the device context ----------------------------------------------------- */

/* This thread's device context, or NULL outside a shard_map body. */
DevCtx *dev_ctx(void);

/* Sets this thread's device context to [c] (borrowed; NULL clears).  The
 * pool clears it after fn returns; collective.c's coll_enter sets it. */
void dev_ctx_set(DevCtx *c);

/* Marks this thread's pending error as secondary: raised only because a
 * peer failed or left (dev_run prefers a primary error).  Cleared when the
 * next fn starts. */
void dev_error_secondary(void);

/* Whether this thread's pending error is marked secondary. */
bool dev_error_is_secondary(void);

/* Whether the error the last failed dev_run moved to its caller was
 * secondary (every failing device's was): under mpirun the processes
 * prefer another process's primary error to it (xcall.c). */
bool dev_run_error_secondary(void);

/* ---- mesh arithmetic ------------------------------------------------------- */

/* The mesh coordinates of [rank] into coords[0..naxes-1]. */
void dev_mesh_coords(const MeshDesc *m, int rank, int *coords);

/* The rank of the position [coords] (row-major). */
int dev_mesh_rank(const MeshDesc *m, const int *coords);

/* The index of the axis named [name] (interned or not), or -1. */
int dev_mesh_axis(const MeshDesc *m, const char *name);

/* Writes the mesh coordinates of [rank] of c->mesh as "(i=0, j=1)" into
 * [buf] (truncated to [cap]); "(3)" when [c] or its mesh is NULL.
 * Returns [buf]. */
char *dev_coords_str(const DevCtx *c, int rank, char *buf, size_t cap);

/* Same, from a mesh descriptor. */
char *dev_mesh_coords_str(const MeshDesc *m, int rank, char *buf, size_t cap);

/* Writes the mesh axes of [vma] (bit k: axis k of this thread's mesh) as
 * jax.typeof shows them after a type, "{V:i,j}", into [buf] (truncated
 * to [cap]); "" when [vma] is empty or no mesh is installed.  Returns
 * [buf]. */
char *dev_vma_str(uint32_t vma, char *buf, size_t cap);

/* Whether replication types are checked on this thread: inside a
 * shard_map body (eager or traced) whose call has check_rep=True. */
bool dev_checks_vma(void);

#endif
