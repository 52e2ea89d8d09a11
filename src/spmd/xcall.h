/*
 * xcall.h - the end of a shard_map call across processes (LANGUAGE.md
 * §12; semantics: JAX's multi-controller runtime, where every process
 * holds the same global result).
 *
 * Under mpirun each process runs a call's body on its own devices only.
 * When they are done, every process sends every other one an END message:
 * whether its devices failed (and the error: kind, message, place and the
 * calling lines inside the body, by file name, line and column), each of
 * its devices' printed output, and each device's result (arrays, tuples
 * and lists of them, None).  Every process then holds every device's
 * result and output, assembles the global result exactly as with one
 * process, and prints the devices' lines in device order (only process
 * 0's standard output is kept, main.c).  An error anywhere is one error
 * everywhere: the first process's primary error (a device's own, not an
 * echo of a peer's), else its first error, so `try`/`except` and the exit
 * status agree on every process.
 */
#ifndef SHMAP_XCALL_H
#define SHMAP_XCALL_H

#include "lang/eval.h"
#include "spmd/collective.h"

/* Exchanges the END messages of the call of [g] over [mesh] whose local
 * devices left results[r] (owned, NULL for a failed or remote device) and
 * outs[r]; [rc] is the local devices' outcome (-1: this thread holds their
 * error, dev_run's).  On return every rank's results[r] and outs[r] are
 * filled in (new references, buffers) and 0 is returned, or -1 with the
 * error every process agreed on set on this thread.  Main thread, after
 * coll_run; not under one process.  shared[0..nshared) are slots of
 * values a device sets as it runs (shardmap_shared_slots): a slot still
 * empty here gets the first other process's value (a new reference).
 * [withheld]: the results (bits of a result tuple) each process keeps its
 * own blocks of (shardmap.c, Call.withheld), sent as None instead. */
int xcall_end(CollGroup *g, const MeshDesc *mesh, Value **results, OutBuf *outs, int rc,
              Value ***shared, int nshared, uint32_t withheld);

#endif
