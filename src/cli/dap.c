/*
 * dap.c - `shmap --dap`, the Debug Adapter Protocol front end of the
 * debugger (dap.h).
 *
 * Layout: the wire (framing, sending); the output pump (standard output
 * and error as `output` events); the requests (a reader thread, a queue
 * for the main thread); threads and frames; variables; a stop (the
 * requests served while the program is stopped); breakpoints; the
 * session's phases (launch, configuration, end).
 *
 * Threads.  The main thread runs the program and serves every request
 * that looks at or changes the program: at a stop (dbg_front, called by
 * the engine where the terminal debugger shows its prompt), during the
 * configuration, and after the end.  The reader thread reads requests and
 * queues them for it, except those that must be answered while the
 * program runs: `threads`, `pause`, `setBreakpoints` and
 * `setFunctionBreakpoints` (the breakpoint table has its own lock); a
 * `terminate`, `disconnect` or `restart` while it runs also interrupts it
 * (as Ctrl-C does the terminal debugger) so that the stop serves them.
 * The pump thread turns the program's output into events; before the
 * main thread sends an event it drains the pipe (pump_sync), so the
 * output written before a stop comes before its `stopped`, every run.
 *
 * Locks.  wire.lock: one message at a time on the wire, and its sequence
 * numbers.  pump.lock: the pump's stream and capture; taken before
 * wire.lock (a line read goes out as an event).  rq.lock: the queue, who
 * serves requests, the announced threads, the function breakpoints'
 * numbers and the program's path; nothing else is taken while it is held.
 * The engine's dbg_state.lock is taken only around the breakpoint table,
 * with none of these held.
 */
#include "cli/dap.h"
#include "cli/config.h"
#include "cli/debug_impl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <json-c/json.h>

#include "array/print.h"
#include "base/intern.h"
#include "base/mem.h"
#include "base/utf8.h"
#include "lang/ops.h"
#include "lang/parser.h"

#define DAP_MAIN_THREAD 1       /* the main thread's id */
#define DAP_DEVICE_THREAD0 1000 /* device rank r is thread 1000 + r */
#define DAP_FRAME_STRIDE 65536  /* frame id: (rank + 2) * stride + level + 1 */
#define DAP_STR_(x) #x
#define DAP_STR(x) DAP_STR_(x)
#define DAP_VALUE_MAX 400       /* a variable's value: its repr, cut to this many characters */

/* ==== the wire ============================================================ */

static struct {
  int in, out;                /* the protocol's descriptors */
  pthread_mutex_t lock;       /* one message at a time on [out], and seq */
  int seq;
} wire = {-1, -1, PTHREAD_MUTEX_INITIALIZER, 0};

static void write_all(int fd, const char *p, size_t n) {
  while (fd >= 0 && n > 0) {
    ssize_t k = write(fd, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return;   /* the client is gone: the reader sees the end */
    p += k;
    n -= (size_t)k;
  }
}

/* Sends message [o] (taking it) with the next sequence number. */
static void send_msg(json_object *o) {
  pthread_mutex_lock(&wire.lock);
  json_object_object_add(o, "seq", json_object_new_int(++wire.seq));
  const char *t = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
                                                        JSON_C_TO_STRING_NOSLASHESCAPE);
  char head[64];
  int hn = snprintf(head, sizeof head, "Content-Length: %zu\r\n\r\n", strlen(t));
  write_all(wire.out, head, (size_t)hn);
  write_all(wire.out, t, strlen(t));
  pthread_mutex_unlock(&wire.lock);
  json_object_put(o);
}

/* Sends event [name] with [body] (taken; NULL: none). */
static void send_event(const char *name, json_object *body) {
  json_object *o = json_object_new_object();
  json_object_object_add(o, "type", json_object_new_string("event"));
  json_object_object_add(o, "event", json_object_new_string(name));
  if (body) json_object_object_add(o, "body", body);
  send_msg(o);
}

/* A string field of [o], or NULL. */
static const char *get_str(json_object *o, const char *key) {
  json_object *v;
  return o && json_object_object_get_ex(o, key, &v) && json_object_is_type(v, json_type_string)
             ? json_object_get_string(v)
             : NULL;
}

static json_object *get_obj(json_object *o, const char *key) {
  json_object *v;
  return o && json_object_object_get_ex(o, key, &v) ? v : NULL;
}

static int get_int(json_object *o, const char *key, int deflt) {
  json_object *v = get_obj(o, key);
  return v && json_object_is_type(v, json_type_int) ? json_object_get_int(v) : deflt;
}

static bool get_bool(json_object *o, const char *key) {
  json_object *v = get_obj(o, key);
  return v && json_object_get_boolean(v);
}

static json_object *args_of(json_object *req) { return get_obj(req, "arguments"); }

/* Answers request [req]: success with [body] (taken; NULL: none), or a
 * failure saying [message]. */
static void respond(json_object *req, const char *message, json_object *body) {
  json_object *o = json_object_new_object();
  json_object_object_add(o, "type", json_object_new_string("response"));
  json_object_object_add(o, "request_seq", json_object_new_int(get_int(req, "seq", 0)));
  json_object_object_add(o, "success", json_object_new_boolean(message == NULL));
  json_object_object_add(o, "command", json_object_new_string(get_str(req, "command")));
  if (message) json_object_object_add(o, "message", json_object_new_string(message));
  if (body) json_object_object_add(o, "body", body);
  send_msg(o);
}

static void respond_ok(json_object *req) { respond(req, NULL, NULL); }

/* ==== the output pump ====================================================== */

/* Standard output and error are one pipe, so that what the program writes
 * to both keeps its order (as on a terminal), and so every run's events
 * are the same: two pipes read by one thread would interleave by chance. */
typedef struct Stream {
  int fd;                     /* read end of the pipe */
  char *line;                 /* the partial line read so far */
  size_t len, cap;
  bool eof;
} Stream;

static struct {
  pthread_mutex_t lock;       /* guards everything below */
  Stream s;
  bool capture;               /* the output goes to [cap], not to events */
  char *cap;
  size_t caplen, capcap;
  pthread_t thread;
  bool started;
} pump = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void grow_append(char **buf, size_t *len, size_t *cap, const char *p, size_t n) {
  if (*len + n + 1 > *cap) {
    size_t c = (*len + n + 1) * 2;
    char *b = shm_realloc(*buf, c);
    if (!b) return;
    *buf = b;
    *cap = c;
  }
  memcpy(*buf + *len, p, n);
  *len += n;
  (*buf)[*len] = 0;
}

/* Sends [s]'s partial line as an `output` event (lock held). */
static void stream_emit(Stream *s) {
  if (s->len == 0) return;
  json_object *b = json_object_new_object();
  json_object_object_add(b, "category", json_object_new_string("stdout"));
  json_object_object_add(b, "output", json_object_new_string_len(s->line, (int)s->len));
  send_event("output", b);
  s->len = 0;
}

/* Takes what can be read from [s] now (lock held): whole lines go out as
 * events, or into the capture while capturing. */
static void stream_read(Stream *s) {
  char buf[4096];
  for (;;) {
    ssize_t n = read(s->fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) s->eof = true;
    if (n <= 0) return;
    if (pump.capture) {
      grow_append(&pump.cap, &pump.caplen, &pump.capcap, buf, (size_t)n);
      continue;
    }
    for (ssize_t i = 0; i < n; i++) {
      grow_append(&s->line, &s->len, &s->cap, buf + i, 1);
      if (buf[i] == '\n') stream_emit(s);
    }
  }
}

static void *pump_main(void *arg) {
  (void)arg;
  while (!pump.s.eof) {
    struct pollfd p = {pump.s.fd, POLLIN, 0};
    if (poll(&p, 1, -1) < 0 && errno != EINTR) break;
    pthread_mutex_lock(&pump.lock);
    if (p.revents) stream_read(&pump.s);
    pthread_mutex_unlock(&pump.lock);
  }
  return NULL;
}

/* Sends everything written to standard output and error so far, partial
 * lines included (main thread: before each event it sends). */
static void pump_sync(void) {
  fflush(stdout);
  fflush(stderr);
  pthread_mutex_lock(&pump.lock);
  stream_read(&pump.s);
  stream_emit(&pump.s);
  pthread_mutex_unlock(&pump.lock);
}

static void pump_capture_begin(void) {
  pump_sync();
  pthread_mutex_lock(&pump.lock);
  pump.capture = true;
  pump.caplen = 0;
  pthread_mutex_unlock(&pump.lock);
}

/* What standard output received since pump_capture_begin, without its
 * last newline (owned by the pump: valid until the next capture). */
static const char *pump_capture_end(void) {
  fflush(stdout);
  pthread_mutex_lock(&pump.lock);
  stream_read(&pump.s);
  pump.capture = false;
  if (!pump.cap) grow_append(&pump.cap, &pump.caplen, &pump.capcap, "", 0);
  if (pump.cap && pump.caplen && pump.cap[pump.caplen - 1] == '\n') pump.cap[--pump.caplen] = 0;
  pthread_mutex_unlock(&pump.lock);
  return pump.cap ? pump.cap : "";
}

/* Makes [fd] the write end of a new pipe read by stream [s]. */
static int pump_redirect(int fd, Stream *s) {
  int p[2];
  if (pipe(p) < 0 || dup2(p[1], fd) < 0) return -1;
  close(p[1]);
  fcntl(p[0], F_SETFL, fcntl(p[0], F_GETFL) | O_NONBLOCK);
  fcntl(p[0], F_SETFD, FD_CLOEXEC);
  *s = (Stream){.fd = p[0]};
  return 0;
}

/* ==== requests ============================================================= */

typedef struct Queued {
  json_object *req;
  struct Queued *next;
} Queued;

static struct {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  Queued *head, *tail;
  bool eof;                   /* the client is gone */
  bool serving;               /* the main thread serves requests (not running the program) */
  pthread_t thread;
  bool started;
} rq = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER};

/* The session's state, main thread's unless said. */
static struct {
  DapLaunch launch;
  char *program_abs;          /* the program's absolute path (rq.lock: the reader
                                 thread reads it for function breakpoints) */
  bool uncaught;              /* the "uncaught" exception filter */
  bool configured;            /* configurationDone was received */
  bool stepped;               /* the program resumed with a step */
  bool restarting;            /* a restart: its entry stop is not shown unless stopOnEntry */
  bool disconnected;
  atomic_bool pause;          /* a pause is under way (reader thread sets it) */
  atomic_bool quit;           /* the client is gone, or left before the program ran */
  atomic_bool ending;         /* a terminate, disconnect or restart interrupted the
                                 running program: its stop serves them unseen */
  int *fbps;                  /* (rq.lock) the function breakpoints' numbers */
  int nfbps;
  /* the threads as last announced (rq.lock): their ids and names */
  int nthreads;
  int *tids;
  char **tnames;
} dap;

/* Reads one message; NULL at the end of input. */
static json_object *read_message(FILE *in) {
  for (;;) {
    char line[256];
    long len = -1;
    while (fgets(line, sizeof line, in)) {
      if (strncasecmp(line, "Content-Length:", 15) == 0) len = strtol(line + 15, NULL, 10);
      else if ((line[0] == '\r' || line[0] == '\n') && len >= 0) break;
    }
    if (len < 0 || len > (1L << 26)) return NULL;
    char *body = shm_malloc((size_t)len + 1);
    if (!body || fread(body, 1, (size_t)len, in) != (size_t)len) {
      shm_free(body);
      return NULL;
    }
    body[len] = 0;
    json_object *o = json_tokener_parse(body);
    shm_free(body);
    if (o && json_object_is_type(o, json_type_object)) return o;
    json_object_put(o);   /* not a message: skipped */
  }
}

static void queue_push(json_object *req) {
  Queued *q = shm_calloc(1, sizeof *q);
  if (!q) return json_object_put(req), (void)0;
  q->req = req;
  pthread_mutex_lock(&rq.lock);
  if (rq.tail) rq.tail->next = q;
  else rq.head = q;
  rq.tail = q;
  pthread_cond_broadcast(&rq.cond);
  pthread_mutex_unlock(&rq.lock);
}

/* The next request for the main thread (taken), or NULL once the client
 * is gone. */
static json_object *next_request(void) {
  pthread_mutex_lock(&rq.lock);
  while (!rq.head && !rq.eof) pthread_cond_wait(&rq.cond, &rq.lock);
  Queued *q = rq.head;
  if (q && !(rq.head = q->next)) rq.tail = NULL;
  pthread_mutex_unlock(&rq.lock);
  if (!q) return NULL;
  json_object *req = q->req;
  shm_free(q);
  return req;
}

/* Stops the running program at its next statement, as Ctrl-C does the
 * terminal debugger (its "Program interrupted" line is output). */
static void interrupt_program(void) { atomic_store(&shm_debugger_interrupted, 1); }

static void serve_threads(json_object *req);
static void serve_set_breakpoints(json_object *req);
static void serve_set_function_breakpoints(json_object *req);

/* Handles [req] on the reader thread when it is one that must be answered
 * while the program runs; false to queue it for the main thread. */
static bool serve_here(json_object *req) {
  const char *cmd = get_str(req, "command");
  if (strcmp(cmd, "threads") == 0) serve_threads(req);
  else if (strcmp(cmd, "setBreakpoints") == 0) serve_set_breakpoints(req);
  else if (strcmp(cmd, "setFunctionBreakpoints") == 0) serve_set_function_breakpoints(req);
  else if (strcmp(cmd, "pause") == 0) {
    pthread_mutex_lock(&rq.lock);
    bool running = !rq.serving;
    pthread_mutex_unlock(&rq.lock);
    if (running) {
      atomic_store(&dap.pause, true);
      interrupt_program();
    }
    respond_ok(req);
  } else {
    return false;
  }
  json_object_put(req);
  return true;
}

/* Whether request [req] ends or restarts the program. */
static bool ends_program(json_object *req) {
  const char *cmd = get_str(req, "command");
  return strcmp(cmd, "terminate") == 0 || strcmp(cmd, "disconnect") == 0 ||
         strcmp(cmd, "restart") == 0;
}

/* The main thread starts ([on]) or stops serving requests.  Before the
 * program goes on it says so (before answering the request that resumes
 * it, so that a pause or terminate sent after the answer finds it
 * running); a request that ends the program and came in the meantime
 * interrupts it at once. */
static void set_serving(bool on) {
  pthread_mutex_lock(&rq.lock);
  rq.serving = on;
  bool ends = false;
  for (Queued *q = rq.head; !on && q; q = q->next) ends = ends || ends_program(q->req);
  pthread_mutex_unlock(&rq.lock);
  if (ends) {
    atomic_store(&dap.ending, true);
    interrupt_program();
  }
}

static void *reader_main(void *arg) {
  FILE *in = arg;
  json_object *req;
  while ((req = read_message(in))) {
    const char *type = get_str(req, "type"), *cmd = get_str(req, "command");
    if (!type || strcmp(type, "request") != 0 || !cmd) {
      json_object_put(req);
      continue;
    }
    if (serve_here(req)) continue;
    bool ends = ends_program(req);
    pthread_mutex_lock(&rq.lock);
    bool running = !rq.serving;
    pthread_mutex_unlock(&rq.lock);
    if (ends && running) {
      atomic_store(&dap.ending, true);
      interrupt_program();
    }
    queue_push(req);
  }
  pthread_mutex_lock(&rq.lock);
  rq.eof = true;
  bool running = !rq.serving;
  pthread_cond_broadcast(&rq.cond);
  pthread_mutex_unlock(&rq.lock);
  atomic_store(&dap.quit, true);   /* no client: the program ends at its next statement */
  if (running) interrupt_program();
  fclose(in);
  return NULL;
}

/* ==== threads and frames ==================================================== */

/* The thread of device [rank], or the main thread's for -1. */
static int tid_of(int rank) { return rank < 0 ? DAP_MAIN_THREAD : DAP_DEVICE_THREAD0 + rank; }

/* The thread a stop is shown on: the focused device's, or the main one. */
static int stop_thread(const Stop *st) { return st->mesh ? tid_of(dbg_state.focus) : DAP_MAIN_THREAD; }

/* The rank thread [tid] is at stop [st]: -1 for the main thread, -2 when
 * there is no such thread. */
static int rank_of_tid(const Stop *st, int tid) {
  if (!st->mesh) return tid == DAP_MAIN_THREAD ? -1 : -2;
  int r = tid - DAP_DEVICE_THREAD0;
  return r >= 0 && r < st->ndev ? r : -2;
}

static void threads_free(int n, int *tids, char **names) {
  for (int i = 0; i < n; i++) shm_free(names[i]);
  shm_free(tids);
  shm_free(names);
}

/* Whether [x] is one of the [n] ints of [a]. */
static bool has_int(const int *a, int n, int x) {
  for (int i = 0; i < n; i++)
    if (a[i] == x) return true;
  return false;
}

static void thread_event(const char *reason, int tid) {
  json_object *b = json_object_new_object();
  json_object_object_add(b, "reason", json_object_new_string(reason));
  json_object_object_add(b, "threadId", json_object_new_int(tid));
  send_event("thread", b);
}

/* Makes the threads of stop [st] (NULL: the main thread alone; [none]:
 * no thread, the program ended) the announced ones, sending a `thread`
 * event for each that ended or started. */
static void threads_announce(const Stop *st, bool none) {
  int n = none ? 0 : st && st->mesh ? st->ndev : 1;
  int *tids = shm_calloc((size_t)n + 1, sizeof *tids);
  char **names = shm_calloc((size_t)n + 1, sizeof *names);
  if (!tids || !names) return shm_free(tids), shm_free(names), (void)0;
  char c[160];
  for (int i = 0; i < n; i++) {
    bool dev = st && st->mesh;
    tids[i] = tid_of(dev ? i : -1);
    names[i] = shm_strdup(dev ? dbg_coords_of(st, i, c, sizeof c) : "main");
  }
  pthread_mutex_lock(&rq.lock);
  int on = dap.nthreads, *otids = dap.tids;
  char **onames = dap.tnames;
  dap.nthreads = n;
  dap.tids = tids;
  dap.tnames = names;
  pthread_mutex_unlock(&rq.lock);
  for (int i = 0; i < on; i++)
    if (!has_int(tids, n, otids[i])) thread_event("exited", otids[i]);
  for (int i = 0; i < n; i++)
    if (!has_int(otids, on, tids[i])) thread_event("started", tids[i]);
  threads_free(on, otids, onames);
}

/* `threads`: the announced ones (reader thread). */
static void serve_threads(json_object *req) {
  json_object *a = json_object_new_array();
  pthread_mutex_lock(&rq.lock);
  for (int i = 0; i < dap.nthreads; i++) {
    json_object *t = json_object_new_object();
    json_object_object_add(t, "id", json_object_new_int(dap.tids[i]));
    json_object_object_add(t, "name", json_object_new_string(dap.tnames[i] ? dap.tnames[i] : "?"));
    json_object_array_add(a, t);
  }
  pthread_mutex_unlock(&rq.lock);
  json_object *b = json_object_new_object();
  json_object_object_add(b, "threads", a);
  respond(req, NULL, b);
}

/* Selects frame [level] of device [rank] (-1: the main thread) as the
 * current one of [st], as `dev` and `up`/`down` would; false when there
 * is no such frame. */
static bool select_frame(Stop *st, int rank, int level) {
  if (rank >= 0) dbg_state.focus = rank;
  if (level < 0 || level >= dbg_st_nframes(st) || (rank < 0 && level >= st->main.n)) return false;
  st->level = level;
  return true;
}

static int frame_id(int rank, int level) { return (rank + 2) * DAP_FRAME_STRIDE + level + 1; }

/* Selects the frame [id] names; false when it names none. */
static bool select_frame_id(Stop *st, int id) {
  int rank = id / DAP_FRAME_STRIDE - 2, level = id % DAP_FRAME_STRIDE - 1;
  if (rank < -1 || (rank >= 0 && rank >= st->ndev)) return false;
  return select_frame(st, rank, level);
}

/* A source object for [s]: its name, and its path when it is a file. */
static json_object *source_json(const Source *s) {
  json_object *o = json_object_new_object();
  const char *slash = strrchr(s->name, '/');
  json_object_object_add(o, "name", json_object_new_string(slash ? slash + 1 : s->name));
  char *abs = s->name[0] != '<' ? realpath(s->name, NULL) : NULL;
  if (abs) json_object_object_add(o, "path", json_object_new_string(abs));
  free(abs);
  return o;
}

/* `stackTrace`: the thread's frames, innermost first: a device's own,
 * then the main thread's below its shard_map call. */
static void serve_stack_trace(Stop *st, json_object *req) {
  json_object *args = args_of(req);
  int rank = rank_of_tid(st, get_int(args, "threadId", 0));
  if (rank < -1) return respond(req, "no such thread", NULL);
  if (rank >= 0) dbg_state.focus = rank;
  int n = rank < 0 ? st->main.n : dbg_st_nframes(st);
  int start = get_int(args, "startFrame", 0), levels = get_int(args, "levels", 0);
  json_object *a = json_object_new_array();
  for (int k = start; k < n && (levels <= 0 || k < start + levels); k++) {
    int level = n - 1 - k;
    const View *v = dbg_st_frame(st, level);
    json_object *f = json_object_new_object();
    json_object_object_add(f, "id", json_object_new_int(frame_id(rank, level)));
    json_object_object_add(f, "name", json_object_new_string(v->fname));
    json_object_object_add(f, "source", source_json(v->src));
    json_object_object_add(f, "line", json_object_new_int(v->line));
    json_object_object_add(f, "column", json_object_new_int(1));
    json_object_array_add(a, f);
  }
  json_object *b = json_object_new_object();
  json_object_object_add(b, "stackFrames", a);
  json_object_object_add(b, "totalFrames", json_object_new_int(n));
  respond(req, NULL, b);
}

/* ==== variables ============================================================= */

typedef enum { H_SCOPE, H_DEVICE, H_VALUE } HKind;

/* What a variablesReference names, for the current stop only. */
typedef struct Handle {
  HKind kind;
  Env *env;                   /* H_SCOPE: counted */
  Value *v;                   /* H_VALUE: counted */
  int frame;                  /* the frame id it was made in */
  const Value *retval;        /* H_SCOPE of a frame at its return: shown as __return__ */
} Handle;

static struct {
  Handle *h;
  int n, cap;
} handles;

static int handle_new(Handle h) {
  if (handles.n == handles.cap) {
    int cap = handles.cap * 2 + 16;
    Handle *nh = shm_realloc(handles.h, sizeof(Handle) * (size_t)cap);
    if (!nh) return 0;
    handles.h = nh;
    handles.cap = cap;
  }
  if (h.env) env_incref(h.env);
  if (h.v) val_incref(h.v);
  handles.h[handles.n++] = h;
  return handles.n;
}

static void handles_clear(void) {
  for (int i = 0; i < handles.n; i++) {
    if (handles.h[i].env) env_decref(handles.h[i].env);
    val_decref(handles.h[i].v);
  }
  handles.n = 0;
}

static Handle *handle_get(int ref) { return ref >= 1 && ref <= handles.n ? &handles.h[ref - 1] : NULL; }

/* [v]'s repr on one line (line breaks and their indentation become one
 * blank), cut to DAP_VALUE_MAX characters; a new json string. */
static json_object *value_json(Value *v) {
  Value *r = val_repr(v);
  if (!r) {
    json_object *e = json_object_new_string(err_message());
    err_clear();
    return e;
  }
  const char *t = str_cstr(r);
  size_t n = ((Str *)r)->len, len = 0;
  char *one = shm_malloc(n + 4);
  for (size_t i = 0; one && i < n; i++) {
    one[len++] = t[i] == '\n' ? ' ' : t[i];
    while (t[i] == '\n' && i + 1 < n && t[i + 1] == ' ') i++;
  }
  if (one && utf8_count(one, len) > DAP_VALUE_MAX) {   /* cut between characters */
    len = utf8_offset(one, len, DAP_VALUE_MAX - 3);
    memcpy(one + len, "...", 3);
    len += 3;
  }
  json_object *o = json_object_new_string_len(one ? one : "", (int)len);
  shm_free(one);
  val_decref(r);
  return o;
}

/* The type shown for [v]: an array's dtype and shape ("float32[2,4]"),
 * else its type's name. */
static json_object *type_json(const Value *v) {
  if (v->type != V_ARRAY || ((const Array *)v)->host) return json_object_new_string(val_type_name(v));
  const Array *a = (const Array *)v;
  char buf[256];
  int k = snprintf(buf, sizeof buf, "%s[", dt_name(a->dtype));
  for (int i = 0; i < a->ndim && k < (int)sizeof buf - 24; i++)
    k += snprintf(buf + k, sizeof buf - (size_t)k, "%s%lld", i ? "," : "", (long long)a->shape[i]);
  snprintf(buf + k, sizeof buf - (size_t)k, "]");
  return json_object_new_string(buf);
}

/* How many indexed and named children [v] shows; false for a leaf. */
static bool children_of(const Value *v, int64_t *indexed, int *named) {
  *indexed = 0;
  *named = 0;
  if (v->type == V_ARRAY && !((const Array *)v)->host && ((const Array *)v)->ndim > 0) {
    *indexed = ((const Array *)v)->shape[0];
    *named = 3;
  } else if (v->type == V_TUPLE) {
    *indexed = (int64_t)tuple_len(v);
  } else if (v->type == V_LIST) {
    *indexed = (int64_t)list_len(v);
  } else if (v->type == V_DICT) {
    *named = (int)((const Dict *)v)->len;
  } else {
    return false;
  }
  return *indexed > 0 || *named > 0;
}

/* A Variable [name] = [v] (borrowed), expandable through a new handle
 * made in frame [frame]. */
static json_object *variable_json(const char *name, Value *v, int frame) {
  json_object *o = json_object_new_object();
  json_object_object_add(o, "name", json_object_new_string(name));
  json_object_object_add(o, "value", value_json(v));
  json_object_object_add(o, "type", type_json(v));
  int64_t indexed;
  int named, ref = 0;
  if (children_of(v, &indexed, &named)) ref = handle_new((Handle){H_VALUE, NULL, v, frame, NULL});
  json_object_object_add(o, "variablesReference", json_object_new_int(ref));
  if (ref && indexed) json_object_object_add(o, "indexedVariables", json_object_new_int64(indexed));
  if (ref && named) json_object_object_add(o, "namedVariables", json_object_new_int(named));
  return o;
}

/* A Variable whose value is the text [text]. */
static json_object *text_variable(const char *name, const char *text) {
  json_object *o = json_object_new_object();
  json_object_object_add(o, "name", json_object_new_string(name));
  json_object_object_add(o, "value", json_object_new_string(text));
  json_object_object_add(o, "variablesReference", json_object_new_int(0));
  return o;
}

typedef struct Names {
  const char **name;
  Value **v;
  int n, cap;
} Names;

static void collect_name(const char *name, Value *v, void *ctx) {
  Names *ns = ctx;
  if (ns->n == ns->cap) {
    int cap = ns->cap * 2 + 32;
    const char **nn = shm_realloc(ns->name, sizeof(char *) * (size_t)cap);
    if (nn) ns->name = nn;
    Value **nv = shm_realloc(ns->v, sizeof(Value *) * (size_t)cap);
    if (nv) ns->v = nv;
    if (!nn || !nv) return;
    ns->cap = cap;
  }
  ns->name[ns->n] = name;
  ns->v[ns->n++] = v;
}

/* A scope's variables, sorted by name (a scope's own order is its hash
 * table's, which need not be the same from run to run). */
static void scope_variables(json_object *a, const Handle *h) {
  Names ns = {0};
  env_each(h->env, collect_name, &ns);
  for (int i = 1; i < ns.n; i++)
    for (int j = i; j > 0 && strcmp(ns.name[j - 1], ns.name[j]) > 0; j--) {
      const char *t = ns.name[j];
      ns.name[j] = ns.name[j - 1];
      ns.name[j - 1] = t;
      Value *tv = ns.v[j];
      ns.v[j] = ns.v[j - 1];
      ns.v[j - 1] = tv;
    }
  if (h->retval) json_object_array_add(a, variable_json("__return__", (Value *)h->retval, h->frame));
  for (int i = 0; i < ns.n; i++) json_object_array_add(a, variable_json(ns.name[i], ns.v[i], h->frame));
  shm_free(ns.name);
  shm_free(ns.v);
}

/* A device's collective state: where it is in the mesh and what it does. */
static void device_variables(Stop *st, json_object *a, int rank) {
  char buf[320];
  json_object_array_add(a, text_variable("device", dbg_coords_of(st, rank, buf, sizeof buf)));
  snprintf(buf, sizeof buf, "%d", rank);
  json_object_array_add(a, text_variable("rank", buf));
  int coords[DEV_MAX_AXES];
  dev_mesh_coords(st->mesh, rank, coords);
  for (int k = 0; k < st->mesh->naxes; k++) {
    char name[96];
    snprintf(name, sizeof name, "axis_index('%s')", st->mesh->names[k]);
    snprintf(buf, sizeof buf, "%d of %d", coords[k], st->mesh->sizes[k]);
    json_object_array_add(a, text_variable(name, buf));
  }
  dbg_device_state(st, rank, buf, sizeof buf);
  json_object_array_add(a, text_variable("state", buf));
}

/* How array [v] lies on the devices, in [buf]: its NamedSharding when it
 * is a sharded global array; in device [rank]'s frame, that device's
 * block and the mesh axes it may vary over (its vma: bit k is the mesh's
 * axis k); else the whole array.  (Every array answers .sharding, an
 * unsharded one with its SingleDeviceSharding, which says nothing of a
 * device's block.) */
static void sharding_text(const Stop *st, int rank, Value *v, char *buf, size_t cap) {
  const Array *x = (const Array *)v;
  Value *r = x->sharding ? val_repr(x->sharding) : NULL;
  err_clear();
  if (r) {
    snprintf(buf, cap, "%s", str_cstr(r));
    val_decref(r);
    return;
  }
  if (rank < 0 || !st->mesh) {
    snprintf(buf, cap, "the whole array, on no device of a mesh");
    return;
  }
  char c[160];
  int k = snprintf(buf, cap, "block of %s, ", dbg_coords_of(st, rank, c, sizeof c));
  if (!x->vma) {
    snprintf(buf + k, cap - (size_t)k, "the same on every device");
    return;
  }
  k += snprintf(buf + k, cap - (size_t)k, "varying over {");
  for (int a = 0, n = 0; a < st->mesh->naxes && k < (int)cap - 40; a++)
    if (x->vma & (1u << a))
      k += snprintf(buf + k, cap - (size_t)k, "%s'%s'", n++ ? ", " : "", st->mesh->names[a]);
  snprintf(buf + k, cap - (size_t)k, "}");
}

/* An array's children: dtype, shape and sharding (named), its rows x[i]
 * (indexed, [start, start + count) of them). */
static void array_variables(const Stop *st, json_object *a, Value *v, const char *filter,
                            int start, int count, int frame) {
  const Array *x = (const Array *)v;
  if (!filter || strcmp(filter, "indexed") != 0) {
    json_object_array_add(a, text_variable("dtype", dt_name(x->dtype)));
    char shape[256];
    int k = snprintf(shape, sizeof shape, "(");
    for (int i = 0; i < x->ndim && k < (int)sizeof shape - 24; i++)
      k += snprintf(shape + k, sizeof shape - (size_t)k, "%lld%s", (long long)x->shape[i],
                    x->ndim == 1 ? "," : i + 1 < x->ndim ? ", " : "");
    snprintf(shape + k, sizeof shape - (size_t)k, ")");
    json_object_array_add(a, text_variable("shape", shape));
    char where[512];
    sharding_text(st, frame / DAP_FRAME_STRIDE - 2, v, where, sizeof where);
    json_object_array_add(a, text_variable("sharding", where));
  }
  if (filter && strcmp(filter, "named") == 0) return;
  int64_t end = count > 0 && start + (int64_t)count < x->shape[0] ? start + (int64_t)count : x->shape[0];
  for (int64_t i = start; i < end; i++) {
    Value *idx = arr_python_int(i), *row = idx ? ops_getitem(v, idx) : NULL;
    char name[32];
    snprintf(name, sizeof name, "[%lld]", (long long)i);
    if (row) json_object_array_add(a, variable_json(name, row, frame));
    else err_clear();
    val_decref(idx);
    val_decref(row);
  }
}

/* A pytree node's children: a tuple's or list's items, a dict's entries. */
static void value_variables(const Stop *st, json_object *a, Value *v, const char *filter,
                            int start, int count, int frame) {
  if (v->type == V_ARRAY) return array_variables(st, a, v, filter, start, count, frame);
  size_t n;
  Value *const *items;
  if (val_seq(v, &n, &items)) {
    size_t end = count > 0 && (size_t)start + (size_t)count < n ? (size_t)start + (size_t)count : n;
    for (size_t i = (size_t)start; i < end; i++) {
      char name[32];
      snprintf(name, sizeof name, "[%zu]", i);
      json_object_array_add(a, variable_json(name, items[i], frame));
    }
    return;
  }
  if (v->type != V_DICT) return;
  const Dict *d = (const Dict *)v;
  for (size_t i = 0; i < d->len; i++) {
    Value *k = val_repr(d->keys[i]);
    json_object_array_add(a, variable_json(k ? str_cstr(k) : "?", d->vals[i], frame));
    if (!k) err_clear();
    val_decref(k);
  }
}

static void serve_variables(Stop *st, json_object *req) {
  json_object *args = args_of(req);
  Handle *h = handle_get(get_int(args, "variablesReference", 0));
  if (!h) return respond(req, "no such variables reference (the program has moved on)", NULL);
  json_object *a = json_object_new_array();
  int start = get_int(args, "start", 0), count = get_int(args, "count", 0);
  if (start < 0) start = 0;
  if (h->kind == H_SCOPE) scope_variables(a, h);
  else if (h->kind == H_DEVICE) device_variables(st, a, h->frame / DAP_FRAME_STRIDE - 2);
  else value_variables(st, a, h->v, get_str(args, "filter"), start, count, h->frame);
  json_object *b = json_object_new_object();
  json_object_object_add(b, "variables", a);
  respond(req, NULL, b);
}

static json_object *scope_json(const char *name, const char *hint, int ref, bool expensive) {
  json_object *o = json_object_new_object();
  json_object_object_add(o, "name", json_object_new_string(name));
  if (hint) json_object_object_add(o, "presentationHint", json_object_new_string(hint));
  json_object_object_add(o, "variablesReference", json_object_new_int(ref));
  json_object_object_add(o, "expensive", json_object_new_boolean(expensive));
  return o;
}

/* `scopes`: a function's locals, the module's globals, and on a device
 * its collective state. */
static void serve_scopes(Stop *st, json_object *req) {
  int id = get_int(args_of(req), "frameId", 0);
  if (!select_frame_id(st, id)) return respond(req, "no such frame", NULL);
  const View *v = dbg_st_cur(st), *top = dbg_st_frame(st, 0);
  int rank = id / DAP_FRAME_STRIDE - 2;
  json_object *a = json_object_new_array();
  if (v->env != top->env || v->retval)
    json_object_array_add(a, scope_json("Locals", "locals",
                                        handle_new((Handle){H_SCOPE, v->env, NULL, id, v->retval}),
                                        false));
  json_object_array_add(a, scope_json("Globals", NULL,
                                      handle_new((Handle){H_SCOPE, top->env, NULL, id, NULL}), false));
  if (rank >= 0 && st->mesh) {
    char c[160], name[200];
    snprintf(name, sizeof name, "Device %s", dbg_coords_of(st, rank, c, sizeof c));
    json_object_array_add(a, scope_json(name, NULL, handle_new((Handle){H_DEVICE, NULL, NULL, id, NULL}),
                                        false));
  }
  json_object *b = json_object_new_object();
  json_object_object_add(b, "scopes", a);
  respond(req, NULL, b);
}

/* `setVariable` in a scope: the value is an expression evaluated in the
 * scope's frame (on its device). */
static void serve_set_variable(Stop *st, json_object *req) {
  json_object *args = args_of(req);
  Handle *h = handle_get(get_int(args, "variablesReference", 0));
  const char *name = get_str(args, "name"), *text = get_str(args, "value");
  if (!h || h->kind != H_SCOPE || !name || !text)
    return respond(req, "only a variable of a scope (Locals, Globals) can be set", NULL);
  if (!select_frame_id(st, h->frame)) return respond(req, "no such frame", NULL);
  int rank = dbg_st_rank_of(st, st->level);
  const View *v = dbg_st_cur(st);
  Value *x = dbg_eval_in(st, v, rank, text);
  if (!x || env_set(h->env, intern_cstr(name), x) < 0) {
    val_decref(x);
    respond(req, err_message(), NULL);
    err_clear();
    return;
  }
  json_object *b = variable_json(name, x, h->frame);
  json_object_object_del(b, "name");
  val_decref(x);
  respond(req, NULL, b);
}

/* ==== evaluating ============================================================== */

/* Whether [text] ends with "@ all" (`p x @ all`: every device's value). */
static bool at_all(const char *text) {
  size_t n = strlen(text);
  while (n && text[n - 1] == ' ') n--;
  if (n < 4 || strncmp(text + n - 3, "all", 3) != 0) return false;
  n -= 3;
  while (n && text[n - 1] == ' ') n--;
  return n > 1 && text[n - 1] == '@';
}

/* Runs the debugger command [line] as if typed at the prompt, its output
 * captured as the result; 1 when it resumes the program (*r set). */
static int run_command(Stop *st, const char *line, Resume *r, json_object **body) {
  pump_capture_begin();
  int go = dbg_dispatch(st, line, r);
  const char *out = pump_capture_end();
  *body = json_object_new_object();
  json_object_object_add(*body, "result", json_object_new_string(out));
  json_object_object_add(*body, "variablesReference", json_object_new_int(0));
  return go;
}

/* `evaluate`: in the debug console ("repl") a line as typed at the
 * terminal debugger's prompt (a command, or statements); elsewhere (watch,
 * hover) an expression, whose value can be expanded.  `x @ all` and an
 * expression calling a collective in a device's frame run as `p` runs
 * them: on every device. */
/* The debug console's line: run as typed at the prompt; 1 when it
 * resumes the program (*r), which `continued` then says, since no request
 * of the client's did. */
static int evaluate_console(Stop *st, json_object *req, const char *text, Resume *r) {
  json_object *body;
  int go = run_command(st, text, r, &body);
  if (go) set_serving(false);
  respond(req, NULL, body);
  if (!go) return 0;
  json_object *b = json_object_new_object();
  json_object_object_add(b, "threadId", json_object_new_int(stop_thread(st)));
  json_object_object_add(b, "allThreadsContinued", json_object_new_boolean(true));
  send_event("continued", b);
  dap.stepped = r->mode != RM_CONTINUE;
  dap.restarting = dbg_state.restart;   /* `restart` typed: as the request */
  return 1;
}

/* An expression `p` runs on every device: `x @ all`, or one calling a
 * collective; a failure ("*** ...") fails the request. */
static void evaluate_everywhere(Stop *st, json_object *req, const char *text) {
  char *line = shm_malloc(strlen(text) + 3);
  if (!line) return respond(req, "out of memory", NULL);
  sprintf(line, "p %s", text);
  Resume ignored;
  json_object *body;
  run_command(st, line, &ignored, &body);
  shm_free(line);
  const char *res = get_str(body, "result");
  if (res && strncmp(res, "*** ", 4) == 0) {
    respond(req, res + 4, NULL);
    json_object_put(body);
  } else {
    respond(req, NULL, body);
  }
}

static int serve_evaluate(Stop *st, json_object *req, Resume *r) {
  json_object *args = args_of(req);
  const char *text = get_str(args, "expression"), *ctx = get_str(args, "context");
  int id = get_int(args, "frameId", 0);
  if (!text) return respond(req, "no expression", NULL), 0;
  if (id && !select_frame_id(st, id)) return respond(req, "no such frame", NULL), 0;
  if (!id) id = frame_id(dbg_st_rank_of(st, st->level), st->level);
  const View *v = dbg_st_cur(st);
  int rank = dbg_st_rank_of(st, st->level);
  if (ctx && strcmp(ctx, "repl") == 0) return evaluate_console(st, req, text, r);
  if (!v) return respond(req, "no frame to evaluate in", NULL), 0;
  if (at_all(text) || (rank >= 0 && dbg_text_calls_collective(text, v->env)))
    return evaluate_everywhere(st, req, text), 0;
  Value *x = dbg_eval_in(st, v, rank, text);
  if (!x) {
    respond(req, err_message(), NULL);
    err_clear();
    return 0;
  }
  json_object *body = variable_json("", x, id), *value = NULL;
  json_object_object_get_ex(body, "value", &value);
  json_object_object_add(body, "result", json_object_get(value));
  json_object_object_del(body, "value");
  json_object_object_del(body, "name");
  val_decref(x);
  respond(req, NULL, body);
  return 0;
}

/* ==== breakpoints ============================================================== */

/* The breakpoints the client set per source (reader thread only): a
 * setBreakpoints replaces those of its source. */
typedef struct SrcBps {
  char *path;                 /* owned; "" for the function breakpoints */
  int *numbers;               /* owned: the engine's breakpoint numbers */
  int n;
} SrcBps;

static struct {
  SrcBps *s;
  int n;
} sbps;

static SrcBps *src_bps(const char *path) {
  for (int i = 0; i < sbps.n; i++)
    if (strcmp(sbps.s[i].path, path) == 0) return &sbps.s[i];
  SrcBps *s = shm_realloc(sbps.s, sizeof(SrcBps) * (size_t)(sbps.n + 1));
  if (!s) return NULL;
  sbps.s = s;
  s[sbps.n] = (SrcBps){shm_strdup(path), NULL, 0};
  return &s[sbps.n++];
}

/* Deletes the breakpoints of [s] that still exist. */
static void src_bps_clear(SrcBps *s) {
  pthread_mutex_lock(&dbg_state.lock);
  for (int i = 0; i < s->n; i++) {
    Bp *b = dbg_bp_find(s->numbers[i]);
    if (b) dbg_bp_delete(b);
  }
  pthread_mutex_unlock(&dbg_state.lock);
  shm_free(s->numbers);
  s->numbers = NULL;
  s->n = 0;
}

/* Collects in [lines] (a bitmap of [n] lines) the lines where a statement
 * of [l], or of a block inside one, starts. */
static void statement_lines(const NodeList *l, unsigned char *lines, int n) {
  for (int i = 0; i < l->n; i++) {
    const Node *s = l->items[i];
    if (s->loc.line >= 1 && s->loc.line <= n) lines[s->loc.line - 1] = 1;
    statement_lines(&s->body, lines, n);
    if (s->kind == N_IF || s->kind == N_FOR || s->kind == N_WHILE || s->kind == N_TRY)
      statement_lines(&s->orelse, lines, n);
    if (s->kind == N_TRY) {
      statement_lines(&s->items, lines, n);
      statement_lines(&s->items2, lines, n);
    }
  }
}

/* The parsed file [path], or NULL with a message in [why]. */
static AstModule *parse_file(const char *path, char *why, size_t cap) {
  Source *src = src_from_file(path);
  AstModule *m = src ? parse_source(src) : NULL;
  if (!m) snprintf(why, cap, "%s", err_occurred() ? err_message() : "cannot read it");
  err_clear();
  src_decref(src);
  return m;
}

/* Checks a breakpoint's condition (one expression), hit condition and
 * log message; true, or false with why not in [why]. */
static bool bp_options_ok(const char *cond, const char *hit, const char *log, char *why,
                          size_t cap) {
  if ((cond && strlen(cond) >= DBG_BP_TEXT_MAX) || (log && strlen(log) >= DBG_BP_TEXT_MAX)) {
    snprintf(why, cap, "a condition or log message has at most %d bytes", DBG_BP_TEXT_MAX - 1);
    return false;
  }
  if (hit && *hit && dbg_hit_matches(hit, 1) < 0) {
    snprintf(why, cap, "hit condition '%s': expected N, == N, >= N, > N, <= N, < N or %% N", hit);
    return false;
  }
  if (!cond || !*cond) return true;
  Source *src = src_new("<condition>", cond);
  AstModule *m = src ? parse_source(src) : NULL;
  bool ok = m && m->body.n == 1 && m->body.items[0]->kind == N_EXPR_STMT;
  if (!ok) snprintf(why, cap, "condition '%s': %s", cond, err_occurred() ? err_message() : "not an expression");
  err_clear();
  ast_free(m);
  src_decref(src);
  return ok;
}

/* Adds one requested breakpoint at [file]:[line] (moved to the next line
 * where a statement starts, [lines] being the file's); its Breakpoint
 * object. */
static json_object *bp_add_one(SrcBps *s, json_object *want, const char *file, int line,
                               const unsigned char *lines, int nlines, const char *why) {
  json_object *o = json_object_new_object();
  const char *cond = get_str(want, "condition"), *hit = get_str(want, "hitCondition"),
             *log = get_str(want, "logMessage");
  char msg[512] = "";
  while (lines && line >= 1 && line <= nlines && !lines[line - 1]) line++;
  if (why) snprintf(msg, sizeof msg, "%s", why);
  else if (line < 1 || line > nlines) snprintf(msg, sizeof msg, "no statement at or after this line");
  else bp_options_ok(cond, hit, log, msg, sizeof msg);
  int number = msg[0] ? 0 : dbg_bp_insert(file, line, cond, hit, log, false);
  int *nums = number ? shm_realloc(s->numbers, sizeof(int) * (size_t)(s->n + 1)) : NULL;
  if (nums) {
    s->numbers = nums;
    s->numbers[s->n++] = number;
  }
  json_object_object_add(o, "verified", json_object_new_boolean(number > 0));
  if (number) json_object_object_add(o, "id", json_object_new_int(number));
  if (number) json_object_object_add(o, "line", json_object_new_int(line));
  if (msg[0]) json_object_object_add(o, "message", json_object_new_string(msg));
  return o;
}

/* `setBreakpoints`: the source's breakpoints become the ones given (reader
 * thread). */
static void serve_set_breakpoints(json_object *req) {
  json_object *args = args_of(req), *want = get_obj(args, "breakpoints");
  const char *path = get_str(get_obj(args, "source"), "path");
  SrcBps *s = path ? src_bps(path) : NULL;
  if (!s) return respond(req, "the source has no path", NULL);
  src_bps_clear(s);
  char why[512];
  AstModule *m = parse_file(path, why, sizeof why);
  int nlines = m ? m->src->nlines : 0;
  unsigned char *lines = m ? shm_calloc((size_t)nlines + 1, 1) : NULL;
  if (lines) statement_lines(&m->body, lines, nlines);
  json_object *a = json_object_new_array();
  size_t n = want && json_object_is_type(want, json_type_array) ? json_object_array_length(want) : 0;
  for (size_t i = 0; i < n; i++) {
    json_object *w = json_object_array_get_idx(want, i);
    json_object_array_add(a, bp_add_one(s, w, path, get_int(w, "line", 0), lines, nlines,
                                        m ? NULL : why));
  }
  shm_free(lines);
  ast_free(m);
  json_object *b = json_object_new_object();
  json_object_object_add(b, "breakpoints", a);
  respond(req, NULL, b);
}

/* The first statement of the function [name] defined anywhere in [l]
 * (a def, or a shard_map def), or NULL. */
static const Node *find_function(const NodeList *l, const char *name) {
  for (int i = 0; i < l->n; i++) {
    const Node *s = l->items[i];
    if ((s->kind == N_DEF || s->kind == N_SHARD_MAP) && s->name == name && s->body.n > 0)
      return s->body.items[0];
    const Node *in = find_function(&s->body, name);
    if (!in && (s->kind == N_IF || s->kind == N_FOR || s->kind == N_WHILE || s->kind == N_TRY))
      in = find_function(&s->orelse, name);
    if (!in && s->kind == N_TRY) in = find_function(&s->items, name);
    if (in) return in;
  }
  return NULL;
}

/* `setFunctionBreakpoints`: a breakpoint at the first statement of each
 * function named, looked for in the program (reader thread). */
static void serve_set_function_breakpoints(json_object *req) {
  json_object *want = get_obj(args_of(req), "breakpoints");
  SrcBps *s = src_bps("");
  if (!s) return respond(req, "out of memory", NULL);
  src_bps_clear(s);
  char why[512], program[PATH_MAX] = "";
  pthread_mutex_lock(&rq.lock);
  if (dap.program_abs) snprintf(program, sizeof program, "%s", dap.program_abs);
  pthread_mutex_unlock(&rq.lock);
  AstModule *m = program[0] ? parse_file(program, why, sizeof why) : NULL;
  json_object *a = json_object_new_array();
  size_t n = want && json_object_is_type(want, json_type_array) ? json_object_array_length(want) : 0;
  for (size_t i = 0; i < n; i++) {
    json_object *w = json_object_array_get_idx(want, i);
    const char *name = get_str(w, "name");
    const Node *at = m && name ? find_function(&m->body, intern_cstr(name)) : NULL;
    char msg[300];
    snprintf(msg, sizeof msg, "no function '%s' in %s", name ? name : "", program);
    json_object *o = bp_add_one(s, w, program, at ? at->loc.line : 0, NULL,
                                m ? m->src->nlines : 0, at ? NULL : msg);
    json_object_array_add(a, o);
  }
  ast_free(m);
  int *numbers = shm_malloc(sizeof(int) * (size_t)(s->n + 1));
  if (numbers && s->n) memcpy(numbers, s->numbers, sizeof(int) * (size_t)s->n);
  pthread_mutex_lock(&rq.lock);
  shm_free(dap.fbps);
  dap.fbps = numbers;
  dap.nfbps = numbers ? s->n : 0;
  pthread_mutex_unlock(&rq.lock);
  json_object *b = json_object_new_object();
  json_object_object_add(b, "breakpoints", a);
  respond(req, NULL, b);
}

/* `setExceptionBreakpoints`: the "uncaught" filter is --pm's post-mortem
 * stop; "raised" stops where any error is raised, caught or not (main
 * thread, the program stopped or not started). */
static void serve_set_exception_breakpoints(json_object *req) {
  json_object *f = get_obj(args_of(req), "filters");
  dap.uncaught = dbg_state.raised = false;
  for (size_t i = 0; f && json_object_is_type(f, json_type_array) && i < json_object_array_length(f); i++) {
    const char *name = json_object_get_string(json_object_array_get_idx(f, i));
    if (strcmp(name, "uncaught") == 0) dap.uncaught = true;
    if (strcmp(name, "raised") == 0) dbg_state.raised = true;
  }
  if (dap.configured) dbg_state.post_mortem = dap.uncaught;   /* from now on: its snapshots */
  dbg_update_engaged();
  respond_ok(req);
}

/* ==== a stop =================================================================== */

/* Why the program stopped, for the `stopped` event. */
static const char *stop_reason(const Stop *st, json_object *body) {
  if (st->error) {
    json_object_object_add(body, "text", json_object_new_string(st->error));
    json_object_object_add(body, "description",
                           json_object_new_string(st->pm ? "Uncaught error" : "Error raised"));
    return "exception";
  }
  if (st->bp > 0) {
    json_object *ids = json_object_new_array();
    json_object_array_add(ids, json_object_new_int(st->bp));
    json_object_object_add(body, "hitBreakpointIds", ids);
    pthread_mutex_lock(&rq.lock);
    bool function = has_int(dap.fbps, dap.nfbps, st->bp);
    pthread_mutex_unlock(&rq.lock);
    return function ? "function breakpoint" : "breakpoint";
  }
  if (atomic_exchange(&dap.pause, false)) return "pause";
  if (!dap.stepped && dap.launch.stop_on_entry && st->main.n == 1 && !st->mesh) return "entry";
  if (dap.stepped) return "step";
  json_object_object_add(body, "description", json_object_new_string("breakpoint()"));
  return "breakpoint";
}


/* A step of thread [tid]: its innermost frame is the one the command is
 * about, as at the prompt after `dev N`. */
static bool step(Stop *st, json_object *req, RMode mode, Resume *r) {
  int rank = rank_of_tid(st, get_int(args_of(req), "threadId", 0));
  if (rank < -1) return respond(req, "no such thread", NULL), false;
  if (rank >= 0) dbg_state.focus = rank;
  st->level = rank >= 0 ? dbg_st_nframes(st) - 1 : st->main.n - 1;
  const View *v = dbg_st_cur(st);
  if (!v) return respond(req, "the thread has no frame to step in", NULL), false;
  *r = (Resume){mode, mode == RM_STEP ? 0 : v->depth, 0};
  dap.stepped = true;
  set_serving(false);
  respond_ok(req);
  return true;
}

/* Ends the program as the debugger's quit does; for `restart`, main.c
 * runs it again (as pdb's restart). */
static bool quit(Stop *st, json_object *req, Resume *r, bool restart) {
  if (restart) {
    json_object *ignored;
    if (!run_command(st, "restart", r, &ignored)) {
      respond(req, get_str(ignored, "result"), NULL);
      json_object_put(ignored);
      return false;
    }
    json_object_put(ignored);
    dap.restarting = true;
  } else {
    *r = (Resume){RM_QUIT, 0, 0};
  }
  if (strcmp(get_str(req, "command"), "disconnect") == 0) dap.disconnected = true;
  set_serving(false);
  respond_ok(req);
  return true;
}

/* Serves one request at a stop; true when it resumes the program (*r). */
static bool serve_stopped(Stop *st, json_object *req, Resume *r) {
  const char *cmd = get_str(req, "command");
  if (strcmp(cmd, "continue") == 0) {
    json_object *b = json_object_new_object();
    json_object_object_add(b, "allThreadsContinued", json_object_new_boolean(true));
    set_serving(false);
    respond(req, NULL, b);
    *r = (Resume){RM_CONTINUE, 0, 0};
    dap.stepped = false;
    return true;
  }
  if (strcmp(cmd, "next") == 0) return step(st, req, RM_NEXT, r);
  if (strcmp(cmd, "stepIn") == 0) return step(st, req, RM_STEP, r);
  if (strcmp(cmd, "stepOut") == 0) return step(st, req, RM_RETURN, r);
  if (strcmp(cmd, "terminate") == 0 || strcmp(cmd, "disconnect") == 0) return quit(st, req, r, false);
  if (strcmp(cmd, "restart") == 0) return quit(st, req, r, true);
  if (strcmp(cmd, "stackTrace") == 0) serve_stack_trace(st, req);
  else if (strcmp(cmd, "scopes") == 0) serve_scopes(st, req);
  else if (strcmp(cmd, "variables") == 0) serve_variables(st, req);
  else if (strcmp(cmd, "setVariable") == 0) serve_set_variable(st, req);
  else if (strcmp(cmd, "evaluate") == 0) return serve_evaluate(st, req, r) != 0;
  else if (strcmp(cmd, "setExceptionBreakpoints") == 0) serve_set_exception_breakpoints(req);
  else {
    char msg[128];
    snprintf(msg, sizeof msg, "'%.64s' is not supported (initialize lists what is)", cmd);
    respond(req, msg, NULL);
  }
  return false;
}

/* dbg_front: a stop.  Announces the threads and `stopped` (every thread),
 * then serves requests until one resumes the program. */
static Resume dap_stop(Stop *st) {
  Resume r = {RM_CONTINUE, 0, 0};
  bool hidden = (st->pm && !dap.uncaught) ||
                (dap.restarting && !dap.launch.stop_on_entry);   /* a restart's entry stop */
  bool ending = atomic_exchange(&dap.ending, false);
  dap.restarting = false;
  if (atomic_load(&dap.quit)) return (Resume){RM_QUIT, 0, 0};
  if (hidden && !ending) return r;
  set_serving(true);
  pump_sync();
  if (ending) {
    atomic_store(&dap.pause, false);
  } else {
    threads_announce(st, false);
    json_object *b = json_object_new_object();
    const char *reason = stop_reason(st, b);
    json_object_object_add(b, "reason", json_object_new_string(reason));
    json_object_object_add(b, "threadId", json_object_new_int(stop_thread(st)));
    json_object_object_add(b, "allThreadsStopped", json_object_new_boolean(true));
    send_event("stopped", b);
  }
  json_object *req;
  bool go = false;
  while (!go && (req = next_request())) {
    go = serve_stopped(st, req, &r);
    json_object_put(req);
  }
  if (!go) r = (Resume){RM_QUIT, 0, 0};   /* the client is gone */
  handles_clear();
  set_serving(false);
  pump_sync();
  return r;
}

/* ==== the session ================================================================== */

static json_object *filter_json(const char *filter, const char *label, const char *desc) {
  json_object *o = json_object_new_object();
  json_object_object_add(o, "filter", json_object_new_string(filter));
  json_object_object_add(o, "label", json_object_new_string(label));
  json_object_object_add(o, "description", json_object_new_string(desc));
  json_object_object_add(o, "default", json_object_new_boolean(false));
  return o;
}

/* `initialize`: what this adapter supports, and nothing else. */
static void serve_initialize(json_object *req) {
  static const char *const yes[] = {
      "supportsConfigurationDoneRequest", "supportsFunctionBreakpoints",
      "supportsConditionalBreakpoints",   "supportsHitConditionalBreakpoints",
      "supportsLogPoints",                "supportsEvaluateForHovers",
      "supportsSetVariable",              "supportsRestartRequest",
      "supportsTerminateRequest",         "supportsDelayedStackTraceLoading",
  };
  json_object *b = json_object_new_object();
  for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
    json_object_object_add(b, yes[i], json_object_new_boolean(true));
  json_object *f = json_object_new_array();
  json_object_array_add(f, filter_json("uncaught", "Uncaught Errors",
                                       "stop where an error nothing catches was raised (--pm)"));
  json_object_array_add(f, filter_json("raised", "Raised Errors",
                                       "stop where any error is raised, caught or not"));
  json_object_object_add(b, "exceptionBreakpointFilters", f);
  respond(req, NULL, b);
}

/* Reads the `launch` request's arguments into dap.launch. */
static const char *take_launch(json_object *args) {
  const char *program = get_str(args, "program"), *cwd = get_str(args, "cwd");
  if (!program) return "launch needs 'program', the script to run";
  json_object *d = get_obj(args, "devices");
  int devices = get_int(args, "devices", 0);
  if (d && (!json_object_is_type(d, json_type_int) || devices < 1 || devices > CFG_MAX_DEVICES))
    return "launch: 'devices' must be an integer from 1 to " DAP_STR(CFG_MAX_DEVICES);
  if (cwd && chdir(cwd) < 0) return "launch: cannot change to 'cwd'";
  json_object *env = get_obj(args, "env");
  if (env && json_object_is_type(env, json_type_object)) {
    json_object_object_foreach(env, key, val) {
      if (json_object_is_type(val, json_type_null)) unsetenv(key);
      else setenv(key, json_object_get_string(val), 1);
    }
  }
  char *abs = realpath(program, NULL);
  if (!abs) return "launch: the program is not found";
  pthread_mutex_lock(&rq.lock);
  dap.program_abs = abs;
  pthread_mutex_unlock(&rq.lock);
  DapLaunch *l = &dap.launch;
  l->program = shm_strdup(program);
  json_object *a = get_obj(args, "args");
  int n = a && json_object_is_type(a, json_type_array) ? (int)json_object_array_length(a) : 0;
  l->args = shm_calloc((size_t)n + 1, sizeof(char *));
  for (int i = 0; l->args && i < n; i++)
    l->args[l->nargs++] = shm_strdup(json_object_get_string(json_object_array_get_idx(a, (size_t)i)));
  l->devices = devices;
  l->stop_on_entry = get_bool(args, "stopOnEntry");
  return NULL;
}

int dap_open(void) {
  signal(SIGPIPE, SIG_IGN);   /* a client that left: writes fail, the reader ends */
  wire.in = dup(STDIN_FILENO);
  wire.out = dup(STDOUT_FILENO);
  int null = open("/dev/null", O_RDONLY);
  if (wire.in < 0 || wire.out < 0 || null < 0 || dup2(null, STDIN_FILENO) < 0 ||
      pump_redirect(STDOUT_FILENO, &pump.s) < 0 ||
      dup2(STDOUT_FILENO, STDERR_FILENO) < 0) {
    perror("shmap: --dap");
    return -1;
  }
  close(null);
  fcntl(wire.in, F_SETFD, FD_CLOEXEC);
  fcntl(wire.out, F_SETFD, FD_CLOEXEC);
  FILE *in = fdopen(wire.in, "r");
  if (!in || pthread_create(&pump.thread, NULL, pump_main, NULL) != 0) return -1;
  pump.started = true;
  if (pthread_create(&rq.thread, NULL, reader_main, in) != 0) return -1;
  rq.started = true;
  return 0;
}

int dap_launch(DapLaunch *l) {
  set_serving(true);
  json_object *req;
  while ((req = next_request())) {
    const char *cmd = get_str(req, "command");
    if (strcmp(cmd, "initialize") == 0) {
      serve_initialize(req);
    } else if (strcmp(cmd, "launch") == 0) {
      const char *why = take_launch(args_of(req));
      respond(req, why, NULL);
      if (!why) {
        json_object_put(req);
        *l = dap.launch;
        return 0;
      }
    } else if (strcmp(cmd, "disconnect") == 0 || strcmp(cmd, "terminate") == 0) {
      respond_ok(req);
      json_object_put(req);
      return 1;
    } else {
      respond(req, "launch first: this adapter launches the program (no attach)", NULL);
    }
    json_object_put(req);
  }
  return 1;
}

int dap_configure(bool *post_mortem) {
  send_event("initialized", NULL);
  json_object *req;
  while ((req = next_request())) {
    const char *cmd = get_str(req, "command");
    bool done = strcmp(cmd, "configurationDone") == 0;
    if (done) respond_ok(req);
    else if (strcmp(cmd, "setExceptionBreakpoints") == 0) serve_set_exception_breakpoints(req);
    else if (strcmp(cmd, "disconnect") == 0 || strcmp(cmd, "terminate") == 0) {
      respond_ok(req);
      atomic_store(&dap.quit, true);
      dap.disconnected = strcmp(cmd, "disconnect") == 0;
    } else respond(req, "the program has not started: configurationDone first", NULL);
    json_object_put(req);
    if (done || atomic_load(&dap.quit)) break;
  }
  if (!req || atomic_load(&dap.quit)) {
    err_set(ERR_QUIT, "quit");
    return -1;
  }
  dap.configured = true;
  *post_mortem = dap.uncaught;
  dbg_front = dap_stop;
  set_serving(false);
  threads_announce(NULL, false);
  return 0;
}

void dap_end(int rc) {
  set_serving(true);
  pump_sync();
  threads_announce(NULL, true);
  json_object *b = json_object_new_object();
  json_object_object_add(b, "exitCode", json_object_new_int(rc));
  send_event("exited", b);
  send_event("terminated", NULL);
  json_object *req;
  while (!dap.disconnected && (req = next_request())) {
    const char *cmd = get_str(req, "command");
    if (strcmp(cmd, "disconnect") == 0) dap.disconnected = true;
    if (dap.disconnected || strcmp(cmd, "terminate") == 0) respond_ok(req);
    else if (strcmp(cmd, "setExceptionBreakpoints") == 0) respond_ok(req);
    else respond(req, "the program has ended", NULL);
    json_object_put(req);
  }
}

void dap_close(void) {
  dbg_front = NULL;
  pump_sync();
  int null = open("/dev/null", O_WRONLY);
  if (null >= 0) {   /* the pipe's last writers: the pump sees its end */
    dup2(null, STDOUT_FILENO);
    dup2(null, STDERR_FILENO);
    close(null);
  }
  if (pump.started) pthread_join(pump.thread, NULL);
  /* The reader thread is left to the exit (it may wait for input that
   * never comes), with what it uses: the breakpoints per source, and
   * the wire, where a late answer is dropped. */
  pthread_mutex_lock(&wire.lock);
  int out = wire.out;
  wire.out = -1;
  pthread_mutex_unlock(&wire.lock);
  close(out);
  handles_clear();
  shm_free(handles.h);
  close(pump.s.fd);
  shm_free(pump.s.line);
  shm_free(pump.cap);
  pthread_mutex_lock(&rq.lock);
  threads_free(dap.nthreads, dap.tids, dap.tnames);
  dap.nthreads = 0;
  shm_free(dap.fbps);
  dap.fbps = NULL;
  dap.nfbps = 0;
  free(dap.program_abs);
  dap.program_abs = NULL;
  pthread_mutex_unlock(&rq.lock);
  for (int i = 0; i < dap.launch.nargs; i++) shm_free(dap.launch.args[i]);
  shm_free(dap.launch.args);
  shm_free((char *)dap.launch.program);
}
