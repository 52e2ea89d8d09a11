/*
 * timeline_out.h - writing what the timeline recorded (base/timeline.h):
 * `shmap --trace FILE` and `shmap --comm-stats`.  Main thread, after the
 * device threads stopped.
 */
#ifndef SHMAP_TIMELINE_OUT_H
#define SHMAP_TIMELINE_OUT_H

#include <stdio.h>

/* Writes this process's timeline to [path] in the Trace Event Format that Perfetto
 * and chrome://tracing open: {"traceEvents": [...]}, one track ("thread")
 * per device and one for the main thread, named by "thread_name"
 * metadata events; every statement, primitive, collective and collective
 * wait a complete event ("ph": "X", "ts" and "dur" in microseconds,
 * "cat" statement / primitive / collective / wait, "args" as recorded:
 * a collective's mesh axes and line, a wait's "waited for" device).
 * Events a track could not keep are counted in "otherData".  Every event
 * has "pid" [process] + 1 (the MPI rank; 1 alone), so the files of
 * several processes merge into one timeline.
 * Built with json-c.  0, or -1 with the error set (the file cannot be
 * written, out of memory). */
int timeline_write(const char *path, int process);

/* The file process [process] writes the timeline to for `--trace [path]`:
 * [path] itself for process 0, else [path] with ".<process>" before its
 * extension (t.json -> t.1.json; no extension: t -> t.1), so processes
 * under mpirun never write one file together.  Owned by the caller (free
 * with shm_free); NULL on out of memory. */
char *timeline_path(const char *path, int process);

/* Prints the communication table to [f]: one row per collective, mesh
 * axes and source line, with the calls each device made, the bytes all
 * devices sent (their operands' bytes), the time all of them spent in it
 * (waiting included) and the slowest device's time.  Nothing when no
 * collective ran. */
void timeline_comm_stats(FILE *f);

#endif
