/*
 * timeline_out.c - the timeline's file and the communication table
 * (timeline_out.h).
 *
 * Format: the Trace Event Format (the JSON object form), as Perfetto and
 * chrome://tracing read it; times there are microseconds, ours are
 * nanoseconds from tl_now, shifted so the first event starts at 0.
 */
#include "cli/timeline_out.h"

#include <json-c/json.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"
#include "base/timeline.h"

/* What the track walk carries: the events array and the first time. */
typedef struct Out {
  int pid;             /* the process's "pid" in the trace: its MPI rank + 1 */
  json_object *events;
  int64_t origin;
  long dropped;
  bool nomem;
} Out;

/* Adds [o] to the events array; a NULL [o] is out of memory. */
static void push(Out *out, json_object *o) {
  if (!o || json_object_array_add(out->events, o) != 0) {
    json_object_put(o);
    out->nomem = true;
  }
}

static json_object *thread_name(int pid, int tid, const char *name) {
  json_object *o = json_object_new_object(), *args = json_object_new_object();
  if (!o || !args) {
    json_object_put(o);
    json_object_put(args);
    return NULL;
  }
  json_object_object_add(args, "name", json_object_new_string(name));
  json_object_object_add(o, "name", json_object_new_string("thread_name"));
  json_object_object_add(o, "ph", json_object_new_string("M"));
  json_object_object_add(o, "pid", json_object_new_int(pid));
  json_object_object_add(o, "tid", json_object_new_int(tid));
  json_object_object_add(o, "args", args);
  return o;
}

static json_object *complete(int pid, int tid, const TlEvent *e, int64_t origin) {
  json_object *o = json_object_new_object(), *args = json_object_new_object();
  if (!o || !args) {
    json_object_put(o);
    json_object_put(args);
    return NULL;
  }
  for (int i = 0; i < e->nargs; i++)
    json_object_object_add(args, e->keys[i], json_object_new_string(e->vals[i]));
  json_object_object_add(o, "name", json_object_new_string(e->name));
  json_object_object_add(o, "cat", json_object_new_string(e->cat));
  json_object_object_add(o, "ph", json_object_new_string("X"));
  json_object_object_add(o, "ts", json_object_new_double((double)(e->t0 - origin) / 1e3));
  json_object_object_add(o, "dur", json_object_new_double((double)(e->t1 - e->t0) / 1e3));
  json_object_object_add(o, "pid", json_object_new_int(pid));
  json_object_object_add(o, "tid", json_object_new_int(tid));
  json_object_object_add(o, "args", args);
  return o;
}

static void find_origin(int tid, const char *name, const TlEvent *ev, long n, long dropped,
                        void *ctx) {
  Out *out = ctx;
  (void)tid, (void)name, (void)dropped;
  for (long i = 0; i < n; i++)
    if (ev[i].t0 < out->origin) out->origin = ev[i].t0;
}

static void add_track(int tid, const char *name, const TlEvent *ev, long n, long dropped,
                      void *ctx) {
  Out *out = ctx;
  push(out, thread_name(out->pid, tid, name));
  for (long i = 0; i < n && !out->nomem; i++) push(out, complete(out->pid, tid, &ev[i], out->origin));
  out->dropped += dropped;
}

int timeline_write(const char *path, int process) {
  Out out = {.pid = process + 1, .events = json_object_new_array(), .origin = INT64_MAX};
  json_object *root = json_object_new_object(), *other = json_object_new_object();
  int rc = -1;
  if (!out.events || !root || !other) goto done;
  tl_each_track(find_origin, &out);
  tl_each_track(add_track, &out);
  if (out.nomem) goto done;
  json_object_object_add(other, "dropped_events", json_object_new_int64(out.dropped));
  json_object_object_add(root, "traceEvents", out.events);
  json_object_object_add(root, "displayTimeUnit", json_object_new_string("ns"));
  json_object_object_add(root, "otherData", other);
  out.events = other = NULL;   /* root owns them now */
  if (json_object_to_file_ext(path, root, JSON_C_TO_STRING_PLAIN) != 0) {
    err_set(ERR_IO, "--trace: cannot write '%s': %s", path, json_util_get_last_err());
    goto done;
  }
  rc = 0;
done:
  if (rc < 0 && !err_occurred()) err_nomem();
  json_object_put(out.events);
  json_object_put(other);
  json_object_put(root);
  return rc;
}

char *timeline_path(const char *path, int process) {
  if (process == 0) return shm_strdup(path);
  const char *slash = strrchr(path, '/'), *dot = strrchr(path, '.');
  size_t stem = dot && dot > (slash ? slash + 1 : path) ? (size_t)(dot - path) : strlen(path);
  size_t cap = strlen(path) + 16;
  char *p = shm_malloc(cap);
  if (p) snprintf(p, cap, "%.*s.%d%s", (int)stem, path, process, path + stem);
  return p;
}

/* ---- the communication table --------------------------------------------- */

/* One row: a (collective, axes, line) summed over the devices. */
typedef struct Row {
  const char *name;
  char axes[64];
  int line;
  long calls;          /* the most any device made */
  int64_t bytes, ns, max_ns;
} Row;

typedef struct Table {
  Row *rows;
  int n, cap;
  bool nomem;
} Table;

static Row *row_for(Table *t, const TlComm *c) {
  for (int i = 0; i < t->n; i++)
    if (t->rows[i].line == c->line && t->rows[i].name == c->name && !strcmp(t->rows[i].axes, c->axes))
      return &t->rows[i];
  if (t->n == t->cap) {
    int cap = t->cap ? t->cap * 2 : 16;
    Row *r = shm_realloc(t->rows, sizeof *r * (size_t)cap);
    if (!r) return NULL;
    t->rows = r;
    t->cap = cap;
  }
  Row *r = &t->rows[t->n++];
  *r = (Row){.name = c->name, .line = c->line};
  memcpy(r->axes, c->axes, sizeof r->axes);
  return r;
}

static void add_counts(int tid, const char *name, const TlComm *c, long n, void *ctx) {
  Table *t = ctx;
  (void)tid, (void)name;
  for (long i = 0; i < n; i++) {
    Row *r = row_for(t, &c[i]);
    if (!r) {
      t->nomem = true;
      return;
    }
    if (c[i].calls > r->calls) r->calls = c[i].calls;
    r->bytes += c[i].bytes;
    r->ns += c[i].ns;
    if (c[i].ns > r->max_ns) r->max_ns = c[i].ns;
  }
}

static int by_line(const void *a, const void *b) {
  const Row *x = a, *y = b;
  if (x->line != y->line) return x->line < y->line ? -1 : 1;
  int c = strcmp(x->name, y->name);
  return c ? c : strcmp(x->axes, y->axes);
}

/* [bytes] as "512 B", "4.0 KiB", "16.0 MiB". */
static void fmt_bytes(char *buf, size_t cap, int64_t bytes) {
  if (bytes < 1024) snprintf(buf, cap, "%lld B", (long long)bytes);
  else if (bytes < 1024 * 1024) snprintf(buf, cap, "%.1f KiB", (double)bytes / 1024);
  else if (bytes < (int64_t)1 << 30) snprintf(buf, cap, "%.1f MiB", (double)bytes / (1 << 20));
  else snprintf(buf, cap, "%.2f GiB", (double)bytes / (1 << 30));
}

void timeline_comm_stats(FILE *f) {
  Table t = {0};
  tl_each_comm(add_counts, &t);
  if (t.nomem) fprintf(f, "shmap: --comm-stats: out of memory\n");
  if (t.n > 0) {
    qsort(t.rows, (size_t)t.n, sizeof *t.rows, by_line);
    fprintf(f, "communication (bytes sent and time in the collective, all devices):\n");
    fprintf(f, "%6s  %-18s %-12s %8s %12s %12s %12s\n", "line", "collective", "axes",
            "calls", "bytes", "time ms", "slowest ms");
    for (int i = 0; i < t.n; i++) {
      const Row *r = &t.rows[i];
      char b[32];
      fmt_bytes(b, sizeof b, r->bytes);
      fprintf(f, "%6d  %-18s %-12s %8ld %12s %12.3f %12.3f\n", r->line, r->name, r->axes,
              r->calls, b, (double)r->ns / 1e6, (double)r->max_ns / 1e6);
    }
  }
  shm_free(t.rows);
}
