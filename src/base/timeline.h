/*
 * timeline.h - where the time goes: a recorder of timed events per thread,
 * for `shmap --trace FILE` (a timeline that Perfetto and chrome://tracing
 * open) and `shmap --comm-stats` (bytes and time per collective, mesh axes
 * and source line, as PyTorch's CommDebugMode reports them).
 *
 * Off by default; the layers that do the work record into it only when
 * tl_recording() or tl_counting() says so, so the cost when off is one load
 * and a branch per statement, primitive or collective.  Each thread
 * records into its own buffer (no lock on the recording path); buffers
 * are registered once per thread under a mutex and read only after every
 * device thread has stopped (tl_each_event, tl_each_comm), by the writer
 * in cli/timeline_out.c.
 *
 * Times are nanoseconds of CLOCK_MONOTONIC (tl_now).  Category strings and
 * argument keys must outlive the recorder (string literals); event names
 * and argument values are copied.
 */
#ifndef SHMAP_TIMELINE_H
#define SHMAP_TIMELINE_H

#include <stdbool.h>
#include <stdint.h>

/* Recording starts when tl_start asks for it; at most TL_MAX_EVENTS events
 * are kept per thread (later ones are counted as dropped, and the trace
 * says so), so a long run cannot exhaust memory. */
#define TL_MAX_EVENTS (1 << 18)
#define TL_MAX_ARGS 2

/* Turns on the timeline ([trace]) and the communication counters
 * ([comm]).  Call on the main thread before any device thread runs. */
void tl_start(bool trace, bool comm);

/* Whether events / communication counts are being recorded. */
extern bool tl_record_on, tl_comm_on;
static inline bool tl_recording(void) { return tl_record_on; }
static inline bool tl_counting(void) { return tl_comm_on; }

/* Nanoseconds since an arbitrary start, monotonic. */
int64_t tl_now(void);

/* Names this thread's track, e.g. "main" or "device 3" (copied).  [tid]
 * orders the tracks: 0 the main thread, 1 + d device thread d. */
void tl_thread(int tid, const char *name);

/* One complete event on this thread's track: [cat] ("statement",
 * "primitive", "collective", "wait"), [name] (copied, at most 63 bytes:
 * "12: y = x * 2 + 1", "dot_general"), from [t0] to [t1] (tl_now),
 * with up to TL_MAX_ARGS string arguments keys[i] = vals[i] (vals copied,
 * at most 63 bytes each). */
void tl_event(const char *cat, const char *name, int64_t t0, int64_t t1, int nargs,
              const char *const *keys, const char *const *vals);

/* Adds one collective to this thread's communication counts, keyed by
 * ([name], [axes], [line]): [bytes] this device sent, [ns] it spent in
 * the collective, waiting included.  [axes] is copied (at most 63 bytes). */
void tl_comm(const char *name, const char *axes, int line, int64_t bytes, int64_t ns);

/* A recorded event, as tl_each_event hands it out (borrowed). */
typedef struct TlEvent {
  const char *cat;
  char name[64];
  int64_t t0, t1;
  int nargs;
  const char *keys[TL_MAX_ARGS];
  char vals[TL_MAX_ARGS][64];
} TlEvent;

/* A communication count, as tl_each_comm hands it out (borrowed). */
typedef struct TlComm {
  const char *name;
  char axes[64];
  int line;
  long calls;
  int64_t bytes, ns;
} TlComm;

/* Calls fn once per thread track, in tid order, with its name, its
 * events and how many were dropped.  Only when no thread records. */
void tl_each_track(void (*fn)(int tid, const char *name, const TlEvent *ev, long n,
                              long dropped, void *ctx),
                   void *ctx);

/* Calls fn once per thread with its communication counts. */
void tl_each_comm(void (*fn)(int tid, const char *name, const TlComm *c, long n, void *ctx),
                  void *ctx);

/* Frees every buffer (at exit). */
void tl_free(void);

#endif
