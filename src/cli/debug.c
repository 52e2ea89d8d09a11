/*
 * debug.c - the pdb-like debugger (debug.h).
 *
 * Layout: frame views (what a stop shows, and the snapshots --pm keeps);
 * breakpoints; the statement hook and the decision to stop; the all-stop
 * of a shard_map call (dbg_coll_run, parking, release); reading commands;
 * the commands; post-mortem; the built-ins; set-up.
 *
 * A stop never shows a Frame directly: it copies the frames it needs into
 * Views (source, line, function name, scope; counted references), so a
 * device's frames can be shown from the main thread, and --pm can show
 * frames that have already returned.
 */
#include "cli/debug.h"
#include "cli/repl.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

#include <readline/history.h>
#include <readline/readline.h>

#include "lang/builtins.h"
#include "spmd/device.h"
#include "spmd/shardmap.h"
#include "base/error.h"
#include "base/intern.h"
#include "base/mem.h"
#include "lang/ops.h"
#include "lang/parser.h"
#include "array/prim.h"
#include "array/print.h"
#include "transform/trace.h"

#define DBG_PROMPT "(shmap-dbg"
#define DBG_LIST_LINES 11        /* pdb's `list` window */
#define DBG_POLL_NS 10000000L    /* 10 ms: how often a stop re-checks collectives */
#define DBG_MAX_CANDIDATES 16    /* breakpoints looked at per statement */

/* ==== views of frames ======================================================= */

/* One frame as a stop shows it. */
typedef struct View {
  Source *src;         /* counted */
  int line;            /* the statement being run */
  int last_line;       /* its last line (a statement may span lines) */
  int depth;           /* frames from the outermost, main thread's first */
  const char *fname;   /* interned or static: lives for the whole run */
  Env *env;            /* counted */
  Value *retval;       /* at a return stop, the innermost view's: the value
                          being returned, borrowed from the stopped thread
                          (a stop ends before that thread goes on); else NULL */
} View;

/* Frames outermost first. */
typedef struct Stack {
  View *v;
  int n, cap;
} Stack;

static void view_release(View *v) {
  src_decref(v->src);
  env_decref(v->env);
}

static void stack_clear(Stack *s) {
  for (int i = 0; i < s->n; i++) view_release(&s->v[i]);
  s->n = 0;
}

static void stack_free(Stack *s) {
  stack_clear(s);
  shm_free(s->v);
  memset(s, 0, sizeof *s);
}

static int stack_reserve(Stack *s, int n) {
  if (n <= s->cap) return 0;
  int cap = s->cap ? s->cap : 8;
  while (cap < n) cap *= 2;
  View *v = shm_realloc(s->v, sizeof(View) * (size_t)cap);
  if (!v) return -1;
  s->v = v;
  s->cap = cap;
  return 0;
}

/* The last source line of statement [n]'s own text: its expressions, not
 * the blocks it opens. */
static int node_last_line(const Node *n) {
  if (!n) return 0;
  int m = n->loc.line > n->loc2.line ? n->loc.line : n->loc2.line;
  const Node *kids[3] = {n->a, n->b, n->c};
  for (int i = 0; i < 3; i++) {
    int l = node_last_line(kids[i]);
    if (l > m) m = l;
  }
  for (int i = 0; i < n->items.n; i++) {
    int l = node_last_line(n->items.items[i]);
    if (l > m) m = l;
  }
  for (int i = 0; n->kind == N_DICT && i < n->items2.n; i++) {   /* a try's is a block */
    int l = node_last_line(n->items2.items[i]);
    if (l > m) m = l;
  }
  for (int i = 0; n->kind == N_CALL && i < n->nkw; i++) {
    int l = node_last_line(n->kws[i].value);
    if (l > m) m = l;
  }
  return m;
}

/* Appends a view of [f] at depth [depth]; 0, or -1 on out of memory. */
static int stack_push(Stack *s, const Frame *f, int depth) {
  const Node *st = f->stmt;
  Source *src = st ? st->loc.src : NULL;
  if (!src) return 0; /* a lambda's frame: no statement to show */
  if (stack_reserve(s, s->n + 1) < 0) return -1;
  View *v = &s->v[s->n++];
  src_incref(src);
  env_incref(f->env);
  *v = (View){src, st->loc.line, node_last_line(st), depth, f->fname, f->env, NULL};
  if (v->last_line < v->line) v->last_line = v->line;
  return 0;
}

/* Number of frames from [f] out. */
static int frame_depth(const Frame *f) {
  int d = 0;
  for (; f; f = f->back) d++;
  return d;
}

/* Fills [s] with the frames from [inner] out, outermost first; their
 * depths count from [depth0]. */
static int stack_from_frames(Stack *s, const Frame *inner, int depth0) {
  int n = frame_depth(inner);
  const Frame **chain = shm_malloc(sizeof(Frame *) * (size_t)(n + 1));
  if (!chain) return -1;
  int i = n;
  for (const Frame *f = inner; f; f = f->back) chain[--i] = f;
  int rc = 0;
  for (i = 0; i < n && rc == 0; i++) rc = stack_push(s, chain[i], depth0 + i + 1);
  shm_free(chain);
  return rc;
}

/* Appends counted copies of [from]'s views to [to]. */
static int stack_append(Stack *to, const Stack *from) {
  if (stack_reserve(to, to->n + from->n) < 0) return -1;
  for (int i = 0; i < from->n; i++) {
    View v = from->v[i];
    src_incref(v.src);
    env_incref(v.env);
    to->v[to->n++] = v;
  }
  return 0;
}

/* Drops the views above the innermost one whose statement holds [loc]:
 * after a call returned, --pm's snapshot still shows the callee, but an
 * error raised later in the caller's statement belongs to the caller. */
static void stack_trim_to(Stack *s, Loc loc) {
  for (int i = s->n - 1; i >= 0; i--) {
    const View *v = &s->v[i];
    if (v->src != loc.src || loc.line < v->line || loc.line > v->last_line) continue;
    while (s->n > i + 1) view_release(&s->v[--s->n]);
    return;
  }
}

/*
 * A snapshot (--pm): the views of a thread's frames as of its latest
 * statement, kept up to date by the hook.  An entry is reused while its
 * frame, scope and statement stay the same, so a statement usually costs
 * one new view.  Frames are compared by address only against entries made
 * from live frames; nothing in a Frame is read after it returned.
 */
typedef struct Snap {
  Stack views;
  const Frame **fp;       /* [views.cap]: the frame each view was made from */
  const Node **stmt;      /* [views.cap]: its statement then */
  const Frame **scratch;  /* the current chain, outermost first */
  int scratch_cap;
} Snap;

static void snap_free(Snap *s) {
  stack_free(&s->views);
  shm_free(s->fp);
  shm_free(s->stmt);
  shm_free(s->scratch);
  memset(s, 0, sizeof *s);
}

/* Collects the frames from [inner] out into s->scratch; their number or -1. */
static int snap_chain(Snap *s, const Frame *inner) {
  int n = frame_depth(inner);
  if (n > s->scratch_cap) {
    const Frame **c = shm_realloc(s->scratch, sizeof(Frame *) * (size_t)n * 2);
    if (!c) return -1;
    s->scratch = c;
    s->scratch_cap = n * 2;
  }
  int i = n;
  for (const Frame *f = inner; f; f = f->back) s->scratch[--i] = f;
  return n;
}

static int snap_grow(Snap *s, int n) {
  int old = s->views.cap;
  if (stack_reserve(&s->views, n) < 0) return -1;
  if (s->views.cap == old && s->fp) return 0;
  const Frame **fp = shm_realloc(s->fp, sizeof(Frame *) * (size_t)s->views.cap);
  if (fp) s->fp = fp;
  const Node **st = shm_realloc(s->stmt, sizeof(Node *) * (size_t)s->views.cap);
  if (st) s->stmt = st;
  return fp && st ? 0 : -1;
}

/* Brings [s] up to the frames from [inner] out (depths from [depth0]).
 * Out of memory only makes the snapshot shorter. */
static void snap_update(Snap *s, const Frame *inner, int depth0) {
  int n = snap_chain(s, inner);
  if (n < 0 || snap_grow(s, n) < 0) return;
  int k = 0, kept = 0;
  for (; k < n; k++) {
    const Frame *f = s->scratch[k];
    if (!f->stmt) continue;
    if (kept >= s->views.n || s->fp[kept] != f || s->stmt[kept] != f->stmt ||
        s->views.v[kept].env != f->env)
      break;
    kept++;
  }
  while (s->views.n > kept) view_release(&s->views.v[--s->views.n]);
  for (; k < n; k++) {
    const Frame *f = s->scratch[k];
    int before = s->views.n;
    if (stack_push(&s->views, f, depth0 + k + 1) < 0) return;
    if (s->views.n == before) continue;
    s->fp[before] = f;
    s->stmt[before] = f->stmt;
  }
}

/* ==== the debugger's state ====================================================== */

/* What a thread does until its next stop (pdb's step/next/return/until). */
typedef enum { RM_CONTINUE, RM_STEP, RM_NEXT, RM_RETURN, RM_UNTIL, RM_QUIT } RMode;

typedef struct Resume {
  RMode mode;
  int depth;   /* NEXT/RETURN/UNTIL: the depth of the frame they are about */
  int line;    /* UNTIL: stop at this line or later */
} Resume;

typedef struct Bp {
  int number;
  char *file;       /* owned: the source name it applies to */
  int line;
  char *cond;       /* owned; NULL: unconditional */
  bool temporary;   /* tbreak: deleted when hit */
  bool enabled;
  int hits;
  int ignore;       /* pdb's ignore count: crossings still to pass over */
} Bp;

/* pdb's `commands`: the command list of a breakpoint.  Kept by number
 * apart from the Bp (main thread only: lists are made and run at the
 * prompt), so that a tbreak deleted as it stops still runs its list, as
 * in pdb. */
typedef struct BpCmds {
  int number;
  bool silent;            /* `silent`: no location shown at the stop */
  int n;
  char **lines;           /* [n], owned: the commands as typed */
} BpCmds;

/* Why a device parks. */
typedef enum { PARK_NONE, PARK_TARGET, PARK_BREAK, PARK_FOLLOW } ParkWhy;

typedef enum { DS_RUNNING, DS_PARKED, DS_DONE } DevState;

/* One device of the running call. */
typedef struct Slot {
  DevState state;         /* (L) */
  const Frame *frame;     /* (L) innermost frame while parked */
  _Atomic(const Frame *) current;   /* its innermost frame at its latest statement:
                                       a device waiting in a collective is shown there */
  int depth;              /* (L) its depth while parked */
  int base;               /* (L) set by a release: NEXT/RETURN/UNTIL depth */
  int bp;                 /* (L) the breakpoint it parked at; 0: none */
  Value *retval;          /* (L) parked at its frame's return: the value,
                             borrowed (the device holds it while parked) */
  bool failed;            /* (L) returned from the body with an error */
  unsigned job_seen;      /* (L) the job_gen of the last job it ran */
  Snap snap;              /* --pm: written by the device thread only; read
                             by the main thread once the call is over */
} Slot;

/* A line typed at a stop in a body that calls a collective: every device
 * thread runs it at once, in its own scope and with its own group, since
 * the collective needs them all (LANGUAGE.md §7; see run_everywhere). */
typedef struct Job {
  const char *text;       /* statements, or an expression when [expr] */
  bool expr, pretty;      /* an expression: out[r] is its repr (pp's when pretty) */
  Env **env;              /* [n] borrowed: each device's selected scope */
  char **out;             /* [n] owned: the repr, or "*** message" on failure */
  int pending;            /* (L) devices still running it */
  bool aborted;           /* (L) it could not finish: the group was aborted */
} Job;

/* The shard_map call running under the debugger (on the main thread's
 * stack, inside dbg_coll_run). */
typedef struct DbgCall {
  CollGroup *g;
  MeshDesc mesh;          /* copy, for coordinates */
  int n;
  OutBuf *outs;           /* [n], the devices' print buffers */
  Slot *slots;            /* [n] */
  void (*fn)(int rank, void *ctx);
  void *ctx;
  int depth0;             /* the main thread's depth at the call */
  atomic_bool stop;       /* all-stop: park at the next statement */
  atomic_bool quit;       /* quit: fail at the next statement */
  atomic_uint cmd_gen;    /* bumped by each release */
  Resume cmd;             /* (L) the command of the latest release */
  bool cmd_relative;      /* (L) cmd's depths are each device's own */
  unsigned gen;           /* (L) release generation parked devices wait on */
  int parked;             /* (L) devices parked */
  int trigger;            /* (L) lowest device parked at a breakpoint */
  char notes[512];        /* (L) messages for the next stop */
  Job *job;               /* (L) the line the parked devices are to run, or NULL */
  unsigned job_gen;       /* (L) bumped for each job */
  const Node *jump_from;  /* (L) a jump of the latest release: the devices parked */
  const Node *jump_to;    /*     at jump_from go on at jump_to; cleared at a stop */
  bool done;              /* (L) coll_run returned */
  int rc;                 /* coll_run's result; read after done */
  ErrState err;           /* its error, moved from the helper thread */
} DbgCall;

/* Devices' frames kept by --pm after a failed shard_map call. */
typedef struct PmRecord {
  int n;                  /* 0: none */
  MeshDesc mesh;          /* names interned; device_ids dropped */
  Stack *stacks;          /* [n] */
} PmRecord;

/* pdb's display: an expression shown at each stop in its frame.  One set
 * at a stop in a body belongs to that frame on every device: each device
 * has its scope there and its own last value, so moving the focus shows
 * the focused device's changes (LANGUAGE.md §7). */
typedef struct Display {
  char *expr;             /* owned */
  int n;                  /* 1 (the main thread's frame), or the devices */
  bool dev;               /* set at a device's frame: index the arrays by rank */
  Env **env;              /* [n] counted (NULL entries: no frame there) */
  char **last;            /* [n] owned: the value at the last stop, or NULL */
} Display;

static struct {
  pthread_mutex_t lock;   /* guards the (L) fields here and in DbgCall/Slot */
  pthread_cond_t cond;    /* broadcast on every change of (L) state */
  pthread_cond_t helper_wake; /* signalled when helper_job or helper_exit is set */
  pthread_t helper;       /* main thread only: the helper thread */
  bool helper_started;    /* main thread only */
  DbgCall *helper_job;    /* (L) the call the helper is to run */
  bool helper_exit;       /* (L) the helper is to end */
  bool installed;         /* dbg_init ran (main thread, before any device) */
  atomic_bool entered;    /* a prompt has been shown: Ctrl-C now stops, as in pdb */
  bool post_mortem;       /* --pm (read-only after init) */
  atomic_bool engaged;    /* the hook has work beyond breakpoint() */
  _Atomic(DbgCall *) call;/* the call running through dbg_coll_run */
  Bp *bps;                /* (L) */
  int nbps, bpcap, next_bp;
  atomic_int nbp_enabled; /* fast test for "any breakpoint to check" */
  /* main thread only: */
  Resume main_resume;
  int focus;              /* focused device (rank) */
  Display *displays;
  int ndisplays;
  BpCmds *bpcmds;         /* breakpoints' command lists */
  int nbpcmds;
  char *last_cmd;         /* repeated by an empty line */
  PmRecord pm;
  ErrState last;          /* the last uncaught error (dbg_keep_error), for pm() */
  MeshDesc last_mesh;     /* the mesh of the last shard_map call that failed */
  bool last_has_mesh;     /* ...when the kept error came from a device */
  MeshDesc fail_mesh;     /* the mesh of the latest failed call (names interned) */
  bool fail_has_mesh;
  bool restartable;       /* a script or -c code runs: `restart` can re-run it */
  bool restart;           /* `restart` was given: main.c runs the program again */
  char *restart_args;     /* its arguments (owned), or NULL to keep argv */
} dbg = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER,
         .helper_wake = PTHREAD_COND_INITIALIZER};

/* This device thread's Slot.current under a debugged call (else NULL):
 * the statement hook keeps it, engaged or not, so a device that waits in
 * a collective can be shown where it waits. */
static _Thread_local _Atomic(const Frame *) *tls_current;
static _Thread_local bool tls_busy;         /* inside the debugger: no stops */
static _Thread_local bool tls_break_next;   /* breakpoint() was called */
static _Thread_local Snap tls_snap;         /* --pm, main thread */
static _Thread_local Resume tls_resume;     /* a device's current command */
static _Thread_local unsigned tls_cmd_gen;  /* ...taken from this release */

/* Recomputes dbg.engaged.  Main thread, or with dbg.lock held. */
static void update_engaged(void) {
  DbgCall *c = atomic_load(&dbg.call);
  bool e = dbg.post_mortem || dbg.main_resume.mode != RM_CONTINUE ||
           atomic_load(&dbg.nbp_enabled) > 0 ||
           (c && (atomic_load(&c->stop) || atomic_load(&c->quit) ||
                  c->cmd.mode != RM_CONTINUE));
  atomic_store_explicit(&dbg.engaged, e, memory_order_release);
}

static int quit_error(void) {
  err_set(ERR_QUIT, "quit");
  return -1;
}

/* ==== breakpoints ================================================================ */

/* True when breakpoint file [bp] names source [name]: the same path, or
 * one is the other's tail after a '/'. */
static bool file_matches(const char *bp, const char *name) {
  size_t a = strlen(bp), b = strlen(name);
  if (a == b) return strcmp(bp, name) == 0;
  const char *lng = a > b ? bp : name, *shrt = a > b ? name : bp;
  size_t d = a > b ? a - b : b - a;
  return lng[d - 1] == '/' && strcmp(lng + d, shrt) == 0;
}

static Bp *bp_find(int number) {
  for (int i = 0; i < dbg.nbps; i++)
    if (dbg.bps[i].number == number) return &dbg.bps[i];
  return NULL;
}

/* Removes breakpoint [b] (lock held). */
static void bp_delete(Bp *b) {
  if (b->enabled) atomic_fetch_sub(&dbg.nbp_enabled, 1);
  shm_free(b->file);
  shm_free(b->cond);
  int i = (int)(b - dbg.bps);
  memmove(b, b + 1, sizeof(Bp) * (size_t)(dbg.nbps - i - 1));
  dbg.nbps--;
}

/* Evaluates a breakpoint condition in [env] on this thread: 1 true, 0
 * false, -1 when it fails (pdb then stops whatever the ignore count
 * says, so the user sees the failing condition).  On a device the condition sees the device's
 * mesh position but no group: a collective in it fails (and so stops)
 * instead of entering a rendezvous the other devices never join. */
static int cond_value(const char *cond, Env *env) {
  bool saved = tls_busy;
  DevCtx *ctx = dev_ctx(), alone;
  if (ctx) {
    alone = *ctx;
    alone.group = NULL;
    dev_ctx_set(&alone);
  }
  tls_busy = true;
  Value *v = eval_expr_text(cond, env);
  int t = v ? val_truth(v) : -1;
  val_decref(v);
  err_clear();
  tls_busy = saved;
  dev_ctx_set(ctx);
  return t < 0 ? -1 : t != 0;
}

typedef struct Candidate {
  int number;
  char cond[256];
  bool has_cond;
} Candidate;

/* The enabled breakpoints at [stmt] (lock taken here). */
static int bp_candidates(const Node *stmt, Candidate *out) {
  int n = 0;
  const char *name = stmt->loc.src->name;
  pthread_mutex_lock(&dbg.lock);
  for (int i = 0; i < dbg.nbps && n < DBG_MAX_CANDIDATES; i++) {
    const Bp *b = &dbg.bps[i];
    if (!b->enabled || b->line != stmt->loc.line || !file_matches(b->file, name)) continue;
    out[n].number = b->number;
    out[n].has_cond = b->cond != NULL;
    snprintf(out[n].cond, sizeof out[n].cond, "%s", b->cond ? b->cond : "");
    n++;
  }
  pthread_mutex_unlock(&dbg.lock);
  return n;
}

/* Counts a crossing of breakpoint [number] (as pdb, whether or not its
 * condition holds) whose condition gave [cond] (1 true or none, 0 false,
 * -1 failed), and decides whether it stops: a crossing with a true
 * condition is passed over while the ignore count lasts, and uses one up
 * (pdb's bdb.effective).  When it stops, a tbreak is deleted, which
 * [note] reports as pdb does.  Under the lock, since devices cross the
 * same breakpoint at once: each device's crossing counts. */
static bool bp_count_hit(int number, int cond, char *note, size_t cap) {
  bool stops = false;
  pthread_mutex_lock(&dbg.lock);
  Bp *b = bp_find(number);
  if (b) {
    b->hits++;
    if (cond > 0 && b->ignore > 0) b->ignore--;
    else stops = cond != 0;
    if (stops && b->temporary) {
      snprintf(note, cap, "Deleted breakpoint %d at %s:%d\n", b->number, b->file, b->line);
      bp_delete(b);
    }
  }
  pthread_mutex_unlock(&dbg.lock);
  return stops;
}

/* The number of the breakpoint that stops [f] at [stmt], or 0 (its
 * condition is evaluated on this thread, in the frame's scope). */
static int bp_hit(const Frame *f, const Node *stmt, char *note, size_t cap) {
  if (atomic_load_explicit(&dbg.nbp_enabled, memory_order_relaxed) == 0 || !stmt->loc.src)
    return 0;
  Candidate cand[DBG_MAX_CANDIDATES];
  int n = bp_candidates(stmt, cand);
  for (int i = 0; i < n; i++) {
    int cond = cand[i].has_cond ? cond_value(cand[i].cond, f->env) : 1;
    if (bp_count_hit(cand[i].number, cond, note, cap)) return cand[i].number;
  }
  return 0;
}

/* ==== deciding to stop ========================================================== */

static bool resume_stops(const Resume *r, int depth, int line) {
  switch (r->mode) {
  case RM_STEP: return true;
  case RM_NEXT: return depth <= r->depth;
  case RM_RETURN: return depth < r->depth;
  case RM_UNTIL: return depth < r->depth || (depth == r->depth && line >= r->line);
  default: return false;
  }
}

/* Whether command [r] stops at the return event of a frame at [depth], as
 * pdb's: step at any; next, return and until at that of the frame they
 * were given in (or of an outer one, reached when an error unwound it). */
static bool resume_stops_at_return(const Resume *r, int depth) {
  switch (r->mode) {
  case RM_STEP: return true;
  case RM_NEXT:
  case RM_RETURN:
  case RM_UNTIL: return depth <= r->depth;
  default: return false;
  }
}

static int stop_main(Frame *f, int bp, Value *retval);
static int device_park(DbgCall *c, int rank, Frame *f, int depth, ParkWhy why, int bp,
                       const char *note, Value *retval);

static int main_hook(Frame *f, const Node *stmt) {
  if (dbg.post_mortem) snap_update(&tls_snap, f, 0);
  char note[160] = "";
  int bp = 0;
  bool stop = tls_break_next ||
              resume_stops(&dbg.main_resume, frame_depth(f), stmt->loc.line) ||
              (bp = bp_hit(f, stmt, note, sizeof note)) > 0;
  if (!stop) return 0;
  tls_break_next = false;
  fputs(note, stdout);
  return stop_main(f, bp, NULL);
}

/* A device picks up the command of a release it was not parked for (it
 * was inside a collective): step and next count the statement it was in
 * as done; return and until start from where it is. */
static ParkWhy device_pickup(DbgCall *c, int depth) {
  pthread_mutex_lock(&dbg.lock);
  tls_resume = c->cmd;
  tls_cmd_gen = atomic_load(&c->cmd_gen);
  bool relative = c->cmd_relative;
  pthread_mutex_unlock(&dbg.lock);
  if (!relative) return PARK_NONE;
  tls_resume.depth = depth;
  return tls_resume.mode == RM_STEP || tls_resume.mode == RM_NEXT ? PARK_TARGET : PARK_NONE;
}

static int device_hook(Frame *f, const Node *stmt) {
  DbgCall *c = atomic_load_explicit(&dbg.call, memory_order_acquire);
  DevCtx *ctx = dev_ctx();
  if (!c || !ctx || ctx->rank >= c->n) return 0;
  if (atomic_load(&c->quit)) return quit_error();
  int depth = c->depth0 + frame_depth(f);
  if (dbg.post_mortem) snap_update(&c->slots[ctx->rank].snap, f, c->depth0);
  ParkWhy why = PARK_NONE;
  char note[160] = "";
  int bp = 0;
  if (atomic_load(&c->cmd_gen) != tls_cmd_gen) why = device_pickup(c, depth);
  if (tls_break_next || (bp = bp_hit(f, stmt, note, sizeof note)) > 0) why = PARK_BREAK;
  else if (!why && resume_stops(&tls_resume, depth, stmt->loc.line)) why = PARK_TARGET;
  else if (!why && atomic_load(&c->stop)) why = PARK_FOLLOW;
  if (!why) return 0;
  tls_break_next = false;
  return device_park(c, ctx->rank, f, depth, why, bp, note, NULL);
}

/* The main thread's return event: frame [f] returns [rv].  breakpoint()
 * as a function's last statement stops here, as in pdb. */
static int main_return(Frame *f, Value *rv) {
  if (!tls_break_next && !resume_stops_at_return(&dbg.main_resume, frame_depth(f))) return 0;
  tls_break_next = false;
  return stop_main(f, 0, rv);
}

/* A device's return event: it parks there for the same reasons as at a
 * statement, breakpoints aside (they name lines, not returns). */
static int device_return(Frame *f, Value *rv) {
  DbgCall *c = atomic_load_explicit(&dbg.call, memory_order_acquire);
  DevCtx *ctx = dev_ctx();
  if (!c || !ctx || ctx->rank >= c->n) return 0;
  if (atomic_load(&c->quit)) return quit_error();
  int depth = c->depth0 + frame_depth(f);
  ParkWhy why = PARK_NONE;
  if (atomic_load(&c->cmd_gen) != tls_cmd_gen) why = device_pickup(c, depth);
  if (tls_break_next) why = PARK_BREAK;
  else if (!why && resume_stops_at_return(&tls_resume, depth)) why = PARK_TARGET;
  else if (!why && atomic_load(&c->stop)) why = PARK_FOLLOW;
  if (!why) return 0;
  tls_break_next = false;
  return device_park(c, ctx->rank, f, depth, why, 0, "", rv);
}

/* eval_stmt_hook: runs before every statement on every thread. */
/* Ctrl-C once the debugger has been entered (after `c`, in a long loop):
 * pdb's "Program interrupted", then a stop at the current line of the
 * main thread or, inside a body, of every device (the first thread to see
 * it takes it). */
static bool take_interrupt(void) {
  if (!atomic_load_explicit(&shm_debugger_interrupted, memory_order_relaxed) || tls_busy)
    return false;
  if (!atomic_exchange(&shm_debugger_interrupted, 0)) return false;
  printf("\nProgram interrupted. (Use 'cont' to resume).\n");
  fflush(stdout);
  DbgCall *c = atomic_load_explicit(&dbg.call, memory_order_acquire);
  if (c && dev_on_device_thread()) atomic_store(&c->stop, true);
  atomic_store(&dbg.engaged, true);
  return true;
}

static int dbg_hook(Frame *f, const Node *stmt) {
  if (tls_current) atomic_store_explicit(tls_current, f, memory_order_release);
  if (take_interrupt() && !dev_on_device_thread()) tls_break_next = true;
  if (tls_busy) return 0;
  if (!tls_break_next && !atomic_load_explicit(&dbg.engaged, memory_order_acquire)) return 0;
  if (dev_on_device_thread()) return device_hook(f, stmt);
  return main_hook(f, stmt);
}

/* eval_return_hook: runs as a user function's frame returns, on every
 * thread; as cheap as dbg_hook when nothing is to stop.  A lambda has no
 * statement of its own to show, and no stop inside it: it runs as a whole,
 * its return included. */
static int dbg_return_hook(Frame *f, const Node *at, Value *ret) {
  if (tls_busy || at->kind == N_LAMBDA || !f->stmt) return 0;
  if (!tls_break_next && !atomic_load_explicit(&dbg.engaged, memory_order_acquire)) return 0;
  if (dev_on_device_thread()) return device_return(f, ret);
  return main_return(f, ret);
}

/* ==== the all-stop of a shard_map call ============================================ *
 *
 * A device is RUNNING, PARKED (blocked in device_park until the next
 * release) or DONE (returned from the body).  It parks for a reason of its
 * own (PARK_TARGET: its step/next/... is done; PARK_BREAK: a breakpoint,
 * which also raises the call's stop flag) or because the stop flag is up
 * (PARK_FOLLOW).  The main thread shows the prompt once no device runs
 * user code: each one parked, done, or seen twice, 10 ms apart, waiting in
 * the same collective (quiescent), and at least one parked.
 *
 * A release (the command typed) sets the call's command and bumps two
 * counters: [gen], which the parked devices wait on, and [cmd_gen], which
 * a device that was not parked (it waited in a collective) compares at
 * its next statement to pick the command up (device_pickup).  Depths are
 * absolute (the main thread's frames count too), so a command given on
 * the main thread (a step into the call) means the same on the devices.
 */

static Value *pretty_repr(Value *v);
static char *error_text(void);

/* Runs the call's job on device [rank], which is parked (lock held; it
 * is dropped while the line runs).  No stop happens inside it. */
static void run_job(DbgCall *c, int rank) {
  Job *j = c->job;
  const Frame *cur = tls_current ? atomic_load(tls_current) : NULL;
  pthread_mutex_unlock(&dbg.lock);
  tls_busy = true;
  char *out = NULL;
  if (j->expr) {
    Value *v = eval_expr_text(j->text, j->env[rank]);
    Value *r = v ? (j->pretty ? pretty_repr(v) : val_repr(v)) : NULL;
    if (r) out = shm_strdup(str_cstr(r));
    val_decref(v);
    val_decref(r);
  } else {
    Source *src = src_new("<stdin>", j->text);
    if (src && eval_source(src, j->env[rank], true) == 0) out = shm_strdup("");
    src_decref(src);
  }
  if (!out) out = error_text();
  tls_busy = false;
  if (tls_current) atomic_store(tls_current, cur);   /* the job's frames are gone */
  pthread_mutex_lock(&dbg.lock);
  j->out[rank] = out;
  j->pending--;
  pthread_cond_broadcast(&dbg.cond);
}

/* Parks device [rank] until the main thread releases it, meanwhile
 * running the jobs the prompt gives it; [bp] is the breakpoint it stopped
 * at (0: none), whose commands the stop runs if it is the focused device;
 * at frame [f]'s return event, [retval] is the value it returns
 * (borrowed), else NULL.  Returns EVAL_HOOK_JUMP when the release jumps
 * from [f]'s statement (every device parked there jumps; never at a
 * return event). */
static int device_park(DbgCall *c, int rank, Frame *f, int depth, ParkWhy why, int bp,
                       const char *note, Value *retval) {
  Slot *s = &c->slots[rank];
  pthread_mutex_lock(&dbg.lock);
  s->state = DS_PARKED;
  s->frame = f;
  s->depth = depth;
  s->bp = bp;
  s->retval = retval;
  c->parked++;
  if (why == PARK_BREAK) {
    /* a rendezvous (LANGUAGE.md §7): the other devices are not stopped
     * where they happen to be; each runs on to this stop, or until it can
     * go no further (a collective, its return, an error) */
    if (c->trigger < 0 || rank < c->trigger) c->trigger = rank;
    atomic_store(&dbg.engaged, true);
  }
  size_t used = strlen(c->notes);
  if (!strstr(c->notes, note))   /* the same breakpoint on several devices: one note */
    snprintf(c->notes + used, sizeof c->notes - used, "%s", note);
  pthread_cond_broadcast(&dbg.cond);
  unsigned gen = c->gen;
  while (c->gen == gen) {
    if (c->job && s->job_seen != c->job_gen) {
      s->job_seen = c->job_gen;
      run_job(c, rank);
      continue;
    }
    pthread_cond_wait(&dbg.cond, &dbg.lock);
  }
  s->retval = NULL;
  tls_resume = c->cmd;
  tls_resume.depth = c->cmd_relative ? s->base : c->cmd.depth;
  tls_cmd_gen = atomic_load(&c->cmd_gen);
  const Node *jump = !retval && c->jump_to && f->stmt == c->jump_from ? c->jump_to : NULL;
  pthread_mutex_unlock(&dbg.lock);
  if (atomic_load(&c->quit)) return quit_error();
  f->jump = jump;
  return jump ? EVAL_HOOK_JUMP : 0;
}

/* The body of every device under the debugger: the caller's fn, then the
 * bookkeeping of leaving (and --pm's snapshot of a failed device). */
static void device_body(int rank, void *arg) {
  DbgCall *c = arg;
  Slot *s = &c->slots[rank];
  tls_break_next = false;
  tls_cmd_gen = 0;
  tls_resume = (Resume){RM_CONTINUE, 0, 0};
  tls_current = &s->current;
  c->fn(rank, c->ctx);
  tls_current = NULL;
  bool failed = err_occurred();
  tls_break_next = false;
  pthread_mutex_lock(&dbg.lock);
  s->state = DS_DONE;
  s->failed = failed;
  if (c->parked > 0) pthread_cond_broadcast(&dbg.cond); /* only a stop waits for this */
  pthread_mutex_unlock(&dbg.lock);
}

/* The helper thread: calls coll_run for the main thread, which meanwhile
 * serves the stops.  One thread for the whole run, made at the first call
 * (a thread per call would cost more than a small call itself). */
static void *helper_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&dbg.lock);
  for (;;) {
    while (!dbg.helper_job && !dbg.helper_exit) pthread_cond_wait(&dbg.helper_wake, &dbg.lock);
    DbgCall *c = dbg.helper_job;
    if (!c) break;
    pthread_mutex_unlock(&dbg.lock);
    int rc = coll_run(c->g, device_body, c);
    if (rc < 0) err_save(&c->err);
    pthread_mutex_lock(&dbg.lock);
    dbg.helper_job = NULL;
    c->rc = rc;
    c->done = true;
    pthread_cond_broadcast(&dbg.cond);
  }
  pthread_mutex_unlock(&dbg.lock);
  return NULL;
}

/* Hands [c] to the helper thread, starting it if needed; -1 if it cannot
 * be started. */
static int helper_start(DbgCall *c) {
  if (!dbg.helper_started) {
    if (pthread_create(&dbg.helper, NULL, helper_main, NULL) != 0) return -1;
    dbg.helper_started = true;
  }
  pthread_mutex_lock(&dbg.lock);
  dbg.helper_job = c;
  pthread_cond_signal(&dbg.helper_wake);
  pthread_mutex_unlock(&dbg.lock);
  return 0;
}

/* Stops and joins the helper thread (no call may be running). */
static void helper_stop(void) {
  if (!dbg.helper_started) return;
  pthread_mutex_lock(&dbg.lock);
  dbg.helper_exit = true;
  pthread_cond_signal(&dbg.helper_wake);
  pthread_mutex_unlock(&dbg.lock);
  pthread_join(dbg.helper, NULL);
  dbg.helper_started = false;
  dbg.helper_exit = false;
}

/* Writes out device [rank]'s buffered print output, each line prefixed by
 * its mesh coordinates (as shard_map does at the end of a call), and
 * empties the buffer.  The device must be parked or done. */
static void flush_device(DbgCall *c, int rank) {
  OutBuf *b = &c->outs[rank];
  char coords[160];
  dev_mesh_coords_str(&c->mesh, rank, coords, sizeof coords);
  size_t start = 0;
  while (start < b->len) {
    const char *nl = memchr(b->data + start, '\n', b->len - start);
    size_t end = nl ? (size_t)(nl - b->data) : b->len;
    printf("%s: ", coords);
    fwrite(b->data + start, 1, end - start, stdout);
    putchar('\n');
    start = end + 1;
  }
  b->len = 0;
}

/* True when no device runs user code: each is parked, done, or waits in a
 * collective; at least one is parked (lock held).  [sig] sums the
 * collective counters of the waiting ones, so a caller can see that
 * nothing moved between two looks. */
static bool quiescent(DbgCall *c, long *sig) {
  char buf[256];
  *sig = 0;
  /* Reference mode runs one device at a time: a parked device holds the
   * baton, so every other one waits for its turn. */
  if (shm_interp->reference) return c->parked > 0;
  for (int r = 0; r < c->n; r++) {
    if (c->slots[r].state != DS_RUNNING) continue;
    if (!coll_waiting_str(c->g, r, buf, sizeof buf)) return false;
    *sig += coll_seq(c->g, r) * (r + 1);
  }
  return c->parked > 0;
}

static void timed_wait(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += DBG_POLL_NS;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_cond_timedwait(&dbg.cond, &dbg.lock, &ts);
}

/* Waits (lock held) until the call ends or its devices have stopped;
 * true for a stop.  A device inside a collective must be seen waiting
 * twice, 10 ms apart, with nothing moved, before it counts as stopped. */
static bool wait_for_stop(DbgCall *c) {
  long sig, prev = -1;
  while (!c->done) {
    if (c->parked > 0 && quiescent(c, &sig)) {
      if (sig == 0 || sig == prev) return true;
      prev = sig;
    } else {
      prev = -1;
    }
    if (c->parked > 0) timed_wait();
    else pthread_cond_wait(&dbg.cond, &dbg.lock);
  }
  return false;
}

static Resume stop_devices(DbgCall *c);

/* Releases the parked devices with [r] (lock held). */
static void release(DbgCall *c, const Resume *r, int focus_depth) {
  c->cmd = *r;
  c->cmd_relative = true;
  for (int i = 0; i < c->n; i++) {
    Slot *s = &c->slots[i];
    if (s->state != DS_PARKED) continue;
    s->state = DS_RUNNING;
    s->base = i == dbg.focus && focus_depth > 0 ? focus_depth : s->depth;
  }
  c->parked = 0;
  c->trigger = -1;
  c->notes[0] = 0;
  atomic_store(&c->stop, false);
  if (r->mode == RM_QUIT) {
    atomic_store(&c->quit, true);
    coll_group_abort(c->g, ERR_QUIT, "quit");
  }
  atomic_fetch_add(&c->cmd_gen, 1);
  c->gen++;
  update_engaged();
  pthread_cond_broadcast(&dbg.cond);
}

/* The main thread's part of a call: serve stops until the call ends. */
static void serve_call(DbgCall *c) {
  pthread_mutex_lock(&dbg.lock);
  while (wait_for_stop(c)) {
    pthread_mutex_unlock(&dbg.lock);
    Resume r = stop_devices(c);
    pthread_mutex_lock(&dbg.lock);
    release(c, &r, r.mode == RM_NEXT || r.mode == RM_RETURN || r.mode == RM_UNTIL ? r.depth : 0);
    if (r.mode == RM_QUIT) dbg.main_resume = (Resume){RM_CONTINUE, 0, 0};
    else if (r.mode != RM_CONTINUE) dbg.main_resume = (Resume){RM_STEP, 0, 0};
    else dbg.main_resume = r;
    update_engaged();
  }
  pthread_mutex_unlock(&dbg.lock);
}

static void pm_record_free(void);

/* --pm: keeps the frames of the devices that failed in [c]. */
static void keep_pm_record(DbgCall *c) {
  PmRecord *pm = &dbg.pm;
  pm_record_free();
  if (!(pm->stacks = shm_calloc((size_t)c->n, sizeof(Stack)))) return;
  pm->n = c->n;
  pm->mesh = c->mesh;
  pm->mesh.device_ids = NULL;
  for (int r = 0; r < c->n; r++)
    if (c->slots[r].failed) {
      pm->stacks[r] = c->slots[r].snap.views;
      memset(&c->slots[r].snap.views, 0, sizeof(Stack));
    }
}

static void call_free(DbgCall *c) {
  for (int r = 0; r < c->n; r++) snap_free(&c->slots[r].snap);
  shm_free(c->slots);
}

static int call_init(DbgCall *c, CollGroup *g, const MeshDesc *mesh,
                     void (*fn)(int, void *), void *ctx, OutBuf *outs) {
  memset(c, 0, sizeof *c);
  c->g = g;
  c->mesh = *mesh;
  c->n = mesh->ndevices;
  c->fn = fn;
  c->ctx = ctx;
  c->outs = outs;
  c->trigger = -1;
  c->depth0 = frame_depth(eval_current_frame());
  c->cmd = dbg.main_resume;
  atomic_init(&c->stop, false);
  atomic_init(&c->quit, false);
  atomic_init(&c->cmd_gen, 1);
  c->slots = shm_calloc((size_t)c->n, sizeof(Slot));
  if (!c->slots) return err_nomem(), -1;
  return 0;
}

int dbg_coll_run(CollGroup *g, const MeshDesc *mesh, void (*fn)(int rank, void *ctx),
                 void *ctx, OutBuf *outs) {
  if (!dbg.installed || tls_busy || dev_on_device_thread()) return coll_run(g, fn, ctx);
  DbgCall c;
  if (call_init(&c, g, mesh, fn, ctx, outs) < 0) return -1;
  atomic_store_explicit(&dbg.call, &c, memory_order_release);
  if (helper_start(&c) < 0) {
    atomic_store(&dbg.call, NULL);
    call_free(&c);
    return coll_run(g, fn, ctx);
  }
  serve_call(&c);
  atomic_store_explicit(&dbg.call, NULL, memory_order_release);
  update_engaged();
  if (c.rc < 0) {
    if (dbg.post_mortem) keep_pm_record(&c);
    dbg.fail_mesh = c.mesh;   /* pm() shows a device's frames with it */
    dbg.fail_mesh.device_ids = NULL;
    dbg.fail_has_mesh = true;
    err_restore(&c.err);
  }
  call_free(&c);
  return c.rc;
}

/* ==== a stop: what the prompt shows and works on ==================================== */

typedef struct Stop {
  Stack main;              /* the main thread's frames */
  DbgCall *call;           /* devices parked in a live call, or NULL */
  const MeshDesc *mesh;    /* the devices' mesh, or NULL outside shard_map */
  int ndev;
  Stack *dev;              /* [ndev]: each device's frames (n == 0: none) */
  int level;               /* selected frame of the focused stack */
  bool pm;                 /* post-mortem */
  bool raiser_only;        /* pm(): only the raising device's frames were kept */
  int list_next;           /* `list` goes on here; 0: around the current line */
  int bp;                  /* the breakpoint stopped at, whose commands run; 0: none */
  const Frame *frame;      /* a main thread's stop: its bottom frame (for jump) */
  const Node *jump;        /* jump's target, taken as the program resumes; NULL: none */
} Stop;

/* The focused device's frames, or NULL. */
static const Stack *focus_stack(const Stop *st) {
  return st->dev && dbg.focus < st->ndev ? &st->dev[dbg.focus] : NULL;
}

static int st_nframes(const Stop *st) {
  const Stack *d = focus_stack(st);
  return st->main.n + (d ? d->n : 0);
}

static const View *st_frame(const Stop *st, int i) {
  if (i < 0 || i >= st_nframes(st)) return NULL;
  return i < st->main.n ? &st->main.v[i] : &focus_stack(st)->v[i - st->main.n];
}

static const View *st_cur(const Stop *st) { return st_frame(st, st->level); }

/* The device whose frame [i] is, or -1 for the main thread's. */
static int st_rank_of(const Stop *st, int i) { return i >= st->main.n ? dbg.focus : -1; }

static void st_free(Stop *st) {
  stack_free(&st->main);
  for (int r = 0; st->dev && r < st->ndev; r++) stack_free(&st->dev[r]);
  shm_free(st->dev);
}

/* ---- output ---------------------------------------------------------------------- */

/* Line [line] of [s] without its newline; false when out of range. */
static bool src_line(const Source *s, int line, const char **text, int *len) {
  if (!s || line < 1 || line > s->nlines) return false;
  const char *p = s->lines[line - 1];
  const char *e = strchr(p, '\n');
  int n = e ? (int)(e - p) : (int)strlen(p);
  if (n > 0 && p[n - 1] == '\r') n--;
  *text = p;
  *len = n;
  return true;
}

#define DBG_REPR_MAX 30   /* reprlib's maxother: a return value's width in a frame line */

/* Prints "->" and [v]'s repr as pdb's frame line shows a return value
 * (reprlib.repr): on one line, and when longer than DBG_REPR_MAX its first
 * and last characters around "...".  `retval` prints it whole. */
static void print_return_value(Value *v) {
  Value *r = val_repr(v);
  if (!r) {
    err_clear();
    printf("-><%s object>", val_type_name(v));
    return;
  }
  const char *t = str_cstr(r);
  size_t n = ((Str *)r)->len, len = 0;
  char *one = shm_malloc(n + 1);
  if (!one) {
    val_decref(r);
    return;
  }
  for (size_t i = 0; i < n; i++) {   /* a line break and its indentation: one blank */
    one[len++] = t[i] == '\n' ? ' ' : t[i];
    while (t[i] == '\n' && i + 1 < n && t[i + 1] == ' ') i++;
  }
  one[len] = 0;
  int head = (DBG_REPR_MAX - 3) / 2, tail = DBG_REPR_MAX - 3 - head;
  if (len > DBG_REPR_MAX) printf("->%.*s...%s", head, one, one + len - (size_t)tail);
  else printf("->%s", one);
  shm_free(one);
  val_decref(r);
}

/* pdb's frame line: "> file.shm(12)f()" and "-> code"; at a return stop,
 * "> file.shm(12)f()->value". */
static void print_view(const View *v, const char *mark) {
  const char *t = "";
  int n = 0;
  printf("%s%s(%d)%s()", mark, v->src->name, v->line, v->fname);
  if (v->retval) print_return_value(v->retval);
  putchar('\n');
  if (src_line(v->src, v->line, &t, &n))
    while (n > 0 && (*t == ' ' || *t == '\t')) t++, n--;
  printf("-> %.*s\n", n, t);
}

/* Prints the pending error as pdb does ("*** message") and clears it. */
static void print_error(void) {
  printf("*** %s\n", err_occurred() ? err_message() : "error");
  err_clear();
}

/* The pending error as p prints it ("*** message", owned), cleared. */
static char *error_text(void) {
  const char *m = err_occurred() ? err_message() : "error";
  size_t cap = strlen(m) + 8;
  char *t = shm_malloc(cap);
  if (t) snprintf(t, cap, "*** %s", m);
  err_clear();
  return t;
}

/* Prints [text] with each line prefixed by [prefix]. */
static void print_prefixed(const char *prefix, const char *text) {
  for (;;) {
    const char *nl = strchr(text, '\n');
    int n = nl ? (int)(nl - text) : (int)strlen(text);
    printf("%s%.*s\n", prefix, n, text);
    if (!nl) return;
    text = nl + 1;
  }
}

/* ---- evaluating in a frame ------------------------------------------------------ */

/* Makes [dc] the context of device [rank] for evaluation on the main
 * thread: the mesh and coordinates (axis_index works) but no group, so a
 * collective typed at the prompt fails instead of waiting for peers that
 * are parked. */
static DevCtx *enter_device(const Stop *st, int rank, DevCtx *dc) {
  DevCtx *saved = dev_ctx();
  if (rank < 0 || !st->mesh) return saved;
  memset(dc, 0, sizeof *dc);
  dc->mesh = st->mesh;
  dc->rank = rank;
  dev_mesh_coords(st->mesh, rank, dc->coords);
  dev_ctx_set(dc);
  return saved;
}

/* Evaluates [expr] in view [v] of device [rank] (-1: main thread). */
static Value *eval_in(const Stop *st, const View *v, int rank, const char *expr) {
  DevCtx dc, *saved = enter_device(st, rank, &dc);
  Value *r = eval_expr_text(expr, v->env);
  dev_ctx_set(saved);
  return r;
}

static bool run_everywhere(const Stop *st, const char *text, bool expr, bool pretty, bool all);

/* Runs the statements [text] in the current frame, echoing an
 * expression's value as the REPL does; a line calling a collective, in
 * a body, runs on every device (run_everywhere). */
static void exec_in(const Stop *st, const char *text) {
  const View *v = st_cur(st);
  if (!v) {
    printf("*** no frame to run in\n");
    return;
  }
  if (run_everywhere(st, text, false, false, false)) return;
  Source *src = src_new("<stdin>", text);
  if (!src) return print_error();
  DevCtx dc, *saved = enter_device(st, st_rank_of(st, st->level), &dc);
  if (eval_source(src, v->env, true) < 0) print_error();
  dev_ctx_set(saved);
  src_decref(src);
}

/* pprint's shape for a long tuple, list or dict: the repr broken after
 * each top-level comma, one item per line. */
static Value *pretty_repr(Value *v) {
  Value *r = val_repr(v);
  if (!r || ((Str *)r)->len <= 79 || (v->type != V_TUPLE && v->type != V_LIST && v->type != V_DICT))
    return r;
  const char *t = str_cstr(r);
  size_t n = ((Str *)r)->len, len = 0;
  char *buf = shm_malloc(n * 2 + 1), quote = 0;
  int depth = 0;
  for (size_t i = 0; buf && i < n; i++) {
    char ch = t[i];
    buf[len++] = ch;
    if (quote) {
      if (ch == '\\' && i + 1 < n) buf[len++] = t[++i];
      else if (ch == quote) quote = 0;
    } else if (ch == '\'' || ch == '"') {
      quote = ch;
    } else if (ch == '(' || ch == '[' || ch == '{') {
      depth++;
    } else if (ch == ')' || ch == ']' || ch == '}') {
      depth--;
    } else if (ch == ',' && depth == 1 && i + 1 < n && t[i + 1] == ' ') {
      buf[len++] = '\n';
    }
  }
  if (!buf) return r;
  Value *out = str_new(buf, len);
  shm_free(buf);
  if (!out) return r;
  val_decref(r);
  return out;
}

/* How value_text words a failure: p's "*** MESSAGE" or display's
 * "** raised MESSAGE **" (pdb's forms). */
typedef enum { FAIL_P, FAIL_DISPLAY } FailForm;

/* The repr (pretty: pp's form) of [expr] in view [v] as a new string, or
 * the failure in form [ff]. */
static char *value_text(const Stop *st, const View *v, int rank, const char *expr, bool pretty,
                        FailForm ff) {
  Value *x = eval_in(st, v, rank, expr);
  Value *r = x ? (pretty ? pretty_repr(x) : val_repr(x)) : NULL;
  char *s;
  if (r) {
    s = shm_strdup(str_cstr(r));
  } else {
    size_t cap = strlen(err_message()) + 32;
    s = shm_malloc(cap);
    if (s && ff == FAIL_P) snprintf(s, cap, "*** %s", err_message());
    else if (s) snprintf(s, cap, "** raised %s **", err_message());
    err_clear();
  }
  val_decref(x);
  val_decref(r);
  return s;
}

/* ---- devices ---------------------------------------------------------------------- */

static const char *coords_of(const Stop *st, int rank, char *buf, size_t cap) {
  return dev_mesh_coords_str(st->mesh, rank, buf, cap);
}

/* What device [r] is doing, for `devices`, `p x @ all` and the stop line. */
static void device_state(const Stop *st, int r, char *buf, size_t cap) {
  char w[256];
  const Stack *s = &st->dev[r];
  if (s->n > 0) {   /* where it is, and the collective it waits in, if any */
    const View *v = &s->v[s->n - 1];
    bool running = false;
    if (st->call) {
      pthread_mutex_lock(&dbg.lock);
      running = st->call->slots[r].state == DS_RUNNING;
      pthread_mutex_unlock(&dbg.lock);
    }
    bool waits = running && coll_waiting_str(st->call->g, r, w, sizeof w);
    snprintf(buf, cap, "%s:%d in %s%s%s", v->src->name, v->line, v->fname,
             waits ? ", waits in " : "", waits ? w : "");
    return;
  }
  if (!st->call) {
    snprintf(buf, cap, st->raiser_only ? "frames not kept" : "returned");
    return;
  }
  pthread_mutex_lock(&dbg.lock);
  DevState ds = st->call->slots[r].state;
  bool failed = st->call->slots[r].failed;
  pthread_mutex_unlock(&dbg.lock);
  if (ds == DS_DONE) snprintf(buf, cap, failed ? "stopped with an error" : "returned");
  else if (coll_waiting_str(st->call->g, r, w, sizeof w)) snprintf(buf, cap, "waits in %s", w);
  else if (shm_interp->reference) snprintf(buf, cap, "waits for its turn (reference mode)");
  else snprintf(buf, cap, "running");
}

/* The rank that [arg] names: "3", "(1, 1)" or "1, 1"; -1 after saying why not. */
static int parse_rank(const Stop *st, const char *arg) {
  int vals[DEV_MAX_AXES + 1], n = 0;
  const char *p = arg;
  while (*p) {
    while (*p == ' ' || *p == '(' || *p == ')' || *p == ',') p++;
    if (!*p) break;
    char *end;
    long x = strtol(p, &end, 10);
    if (end == p || n > DEV_MAX_AXES || x < -1000000 || x > 1000000) {
      printf("*** expected a device number or mesh coordinates, got '%s'\n", arg);
      return -1;
    }
    vals[n++] = (int)x;
    p = end;
  }
  if (n == 1 && strchr(arg, '(') == NULL) {
    if (vals[0] >= 0 && vals[0] < st->ndev) return vals[0];
    printf("*** no device %d (there are %d)\n", vals[0], st->ndev);
    return -1;
  }
  if (n != st->mesh->naxes) {
    printf("*** the mesh has %d axes, got %d coordinates\n", st->mesh->naxes, n);
    return -1;
  }
  for (int a = 0; a < n; a++)
    if (vals[a] < 0 || vals[a] >= st->mesh->sizes[a]) {
      printf("*** coordinate %s=%d is out of range (size %d)\n", st->mesh->names[a], vals[a],
             st->mesh->sizes[a]);
      return -1;
    }
  return dev_mesh_rank(st->mesh, vals);
}

/* ---- location and displays ----------------------------------------------------- */

/* Which entry of display [d] belongs to view [v] of the stop: the
 * focused device's, or the main thread's; -1 when [d] is another frame's. */
static int display_index(const Stop *st, const Display *d, const View *v) {
  int rank = st_rank_of(st, st->level), k = d->dev ? rank : 0;
  if (d->dev != (rank >= 0) || k < 0 || k >= d->n) return -1;
  return d->env[k] == v->env ? k : -1;
}

static void display_free(Display *d) {
  for (int k = 0; k < d->n; k++) {
    env_decref(d->env[k]);
    shm_free(d->last[k]);
  }
  shm_free(d->env);
  shm_free(d->last);
  shm_free(d->expr);
}

/* Shows where the stop is: the current frame, or what the focused device
 * does when it has no frame to show. */
static void print_location(const Stop *st) {
  const Stack *d = focus_stack(st);
  if (st->mesh && d && d->n == 0) {
    char c[160], s[320];
    device_state(st, dbg.focus, s, sizeof s);
    printf("device %s %s\n", coords_of(st, dbg.focus, c, sizeof c), s);
    return;
  }
  const View *v = st_cur(st);
  if (v) print_view(v, "> ");
}

/* pdb's display: at each stop in a display's frame, show it if its value
 * changed. */
static void run_displays(const Stop *st) {
  const View *v = st_cur(st);
  for (int i = 0; v && i < dbg.ndisplays; i++) {
    Display *d = &dbg.displays[i];
    int k = display_index(st, d, v);
    if (k < 0) continue;
    char *now = value_text(st, v, st_rank_of(st, st->level), d->expr, false, FAIL_DISPLAY);
    if (!now) continue;
    if (d->last[k] && strcmp(now, d->last[k]) == 0) {
      shm_free(now);
      continue;
    }
    if (d->last[k]) printf("display %s: %s  [old: %s]\n", d->expr, now, d->last[k]);
    else printf("display %s: %s\n", d->expr, now);
    shm_free(d->last[k]);
    d->last[k] = now;
  }
}

/* ==== reading commands ============================================================== */

static struct {
  char *line;   /* what readline handed over (malloc'd), NULL at EOF */
  bool done;
} rl_in;        /* main thread only */

static void rl_on_line(char *line) {
  rl_in.line = line;
  rl_in.done = true;
  rl_callback_handler_remove();
}

/* Tab completion: command names for the first word, else the names of the
 * current frame, the module and the built-ins.  Main thread only. */
static struct {
  const Stop *stop;       /* the stop being served */
  char **names;           /* candidates (malloc'd) */
  int n, cap, next;
} comp;

static void comp_add(const char *name, Value *v, void *ctx) {
  (void)v, (void)ctx;
  if (comp.n == comp.cap) {
    char **nn = shm_realloc(comp.names, sizeof(char *) * (size_t)(comp.cap * 2 + 64));
    if (!nn) return;
    comp.names = nn;
    comp.cap = comp.cap * 2 + 64;
  }
  if ((comp.names[comp.n] = shm_strdup(name))) comp.n++;
}

static void comp_clear(void) {
  for (int i = 0; i < comp.n; i++) shm_free(comp.names[i]);
  comp.n = 0;
}

static void comp_commands(void);

/* readline's generator: the next candidate starting with [text]. */
static char *comp_next(const char *text, int state) {
  size_t n = strlen(text);
  if (!state) comp.next = 0;
  while (comp.next < comp.n) {
    const char *c = comp.names[comp.next++];
    if (strncmp(c, text, n) == 0) return strdup(c); /* readline frees it */
  }
  return NULL;
}

static char **dbg_complete(const char *text, int start, int end) {
  (void)end;
  rl_attempted_completion_over = 1;
  comp_clear();
  if (start == 0) {
    comp_commands();
  } else if (comp.stop) {
    const View *v = st_cur(comp.stop);
    if (v) env_each(v->env, comp_add, NULL);
    if (comp.stop->main.n) env_each(comp.stop->main.v[0].env, comp_add, NULL);
    env_each(shm_interp->builtins, comp_add, NULL);
  }
  return rl_completion_matches(text, comp_next);
}

/* Reads a line with readline's callback interface, so that a Ctrl-C
 * (main.c's handler sets shm_interrupted; select returns EINTR) abandons
 * the line being typed instead of being held until Return. */
static char *read_tty(const char *prompt) {
  FILE *in = rl_instream ? rl_instream : stdin;
  rl_completion_func_t *saved = rl_attempted_completion_function;
  rl_attempted_completion_function = dbg_complete;
  rl_in.done = false;
  rl_in.line = NULL;
  rl_callback_handler_install(prompt, rl_on_line);
  while (!rl_in.done) {
    fd_set fds;
    FD_ZERO(&fds);
    FD_SET(fileno(in), &fds);
    int r = select(fileno(in) + 1, &fds, NULL, NULL, NULL);
    if (r < 0 && errno == EINTR && atomic_exchange(&shm_interrupted, 0)) {
      rl_replace_line("", 0);
      rl_callback_sigcleanup();
      rl_callback_handler_remove();
      fputs("\n", stdout);
      rl_callback_handler_install(prompt, rl_on_line);
    } else if (r > 0) {
      rl_callback_read_char();
    } else if (r < 0 && errno != EINTR) {
      rl_callback_handler_remove();
      break;
    }
  }
  rl_attempted_completion_function = saved;
  comp_clear();
  if (rl_in.line && rl_in.line[0] && strspn(rl_in.line, " \t") < strlen(rl_in.line)) {
    HIST_ENTRY *last = history_length > 0 ? history_get(history_base + history_length - 1) : NULL;
    if (!last || strcmp(last->line, rl_in.line) != 0) add_history(rl_in.line);
  }
  return rl_in.line;
}

/* Reads a line from a stdin that is not a terminal, echoing it after the
 * prompt so that a scripted session reads as a transcript. */
static char *read_pipe(const char *prompt) {
  fputs(prompt, stdout);
  fflush(stdout);
  char *line = NULL;
  size_t cap = 0;
  ssize_t n;
  while ((n = getline(&line, &cap, stdin)) < 0 && errno == EINTR && ferror(stdin)) {
    clearerr(stdin); /* Ctrl-C: abandon the line, as on a terminal */
    atomic_store(&shm_interrupted, 0);
    fputs("\n", stdout);
    fputs(prompt, stdout);
    fflush(stdout);
  }
  if (n < 0) {
    free(line);
    fputs("\n", stdout);
    return NULL;
  }
  while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
  printf("%s\n", line);
  return line;
}

/* The next command line (malloc'd), or NULL at end of input. */
static char *read_command(const char *prompt) {
  fflush(stdout);
  return isatty(fileno(stdin)) ? read_tty(prompt) : read_pipe(prompt);
}

static void make_prompt(const Stop *st, char *buf, size_t cap) {
  char c[160];
  if (st->mesh) snprintf(buf, cap, DBG_PROMPT " %s) ", coords_of(st, dbg.focus, c, sizeof c));
  else snprintf(buf, cap, DBG_PROMPT ") ");
}

/* ==== the commands ==================================================================== */

/* A command: 1 when it resumes the program (with *r set), 0 to stay. */
typedef int (*CmdFn)(Stop *st, const char *arg, Resume *r);

typedef struct Cmd {
  const char *names;   /* the accepted spellings, blank separated */
  CmdFn fn;
  const char *usage;
  const char *help;
} Cmd;

static const Cmd *cmd_lookup(const char *word);

/* Copies the command word that [line] starts with (letters, digits, '_')
 * into [word]; its length. */
static size_t first_word(const char *line, char *word, size_t cap) {
  size_t n = 0;
  while ((isalnum((unsigned char)line[n]) || line[n] == '_') && n < cap - 1) n++;
  memcpy(word, line, n);
  word[n] = 0;
  return n;
}

/* Reads a non-negative count argument (default [deflt]); -1 if malformed. */
static int count_arg(const char *arg, int deflt) {
  if (!*arg) return deflt;
  char *end;
  long n = strtol(arg, &end, 10);
  if (*end || n < 0 || n > 1000000) {
    printf("*** expected a number, got '%s'\n", arg);
    return -1;
  }
  return (int)n;
}

/* The selected frame's depth, for next/return/until. */
static int cur_depth(const Stop *st) {
  const View *v = st_cur(st);
  return v ? v->depth : 0;
}

static int cmd_step(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)arg;
  *r = (Resume){RM_STEP, 0, 0};
  return 1;
}

static int cmd_next(Stop *st, const char *arg, Resume *r) {
  (void)arg;
  *r = (Resume){RM_NEXT, cur_depth(st), 0};
  return 1;
}

static int cmd_return(Stop *st, const char *arg, Resume *r) {
  (void)arg;
  *r = (Resume){RM_RETURN, cur_depth(st), 0};
  return 1;
}

static int cmd_until(Stop *st, const char *arg, Resume *r) {
  const View *v = st_cur(st);
  int line = v ? v->line + 1 : 0;
  if (*arg) {
    int n = count_arg(arg, 0);
    if (n < 0) return 0;
    if (v && n <= v->line) {
      printf("*** \"until\" line number is smaller than current line number\n");
      return 0;
    }
    line = n;
  }
  *r = (Resume){RM_UNTIL, cur_depth(st), line};
  return 1;
}

static int cmd_continue(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)arg;
  *r = (Resume){RM_CONTINUE, 0, 0};
  return 1;
}

static int cmd_quit(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)arg;
  *r = (Resume){RM_QUIT, 0, 0};
  return 1;
}

/* pdb's restart (and run): ends the program as quit does, through the
 * same unwinding (a shard_map call in progress is aborted first), and
 * main.c runs it again from the start (dbg_take_restart). */
static int cmd_restart(Stop *st, const char *arg, Resume *r) {
  (void)st;
  if (!dbg.restartable) {
    printf("*** restart is not available here: there is no script to run again\n");
    return 0;
  }
  shm_free(dbg.restart_args);
  dbg.restart_args = *arg ? shm_strdup(arg) : NULL;
  dbg.restart = true;
  *r = (Resume){RM_QUIT, 0, 0};
  return 1;
}

/* ---- the stack ---- */

static int cmd_where(Stop *st, const char *arg, Resume *r) {
  (void)arg, (void)r;
  for (int i = 0; i < st_nframes(st); i++) print_view(st_frame(st, i), i == st->level ? "> " : "  ");
  return 0;
}

static int move_frame(Stop *st, int by) {
  int n = st_nframes(st), to = st->level + by;
  if (by < 0 && st->level == 0) {
    printf("*** Oldest frame\n");
    return 0;
  }
  if (by > 0 && st->level >= n - 1) {
    printf("*** Newest frame\n");
    return 0;
  }
  st->level = to < 0 ? 0 : to >= n ? n - 1 : to;
  st->list_next = 0;
  print_view(st_cur(st), "> ");
  return 0;
}

static int cmd_up(Stop *st, const char *arg, Resume *r) {
  (void)r;
  int n = count_arg(arg, 1);
  return n < 0 ? 0 : move_frame(st, -n);
}

static int cmd_down(Stop *st, const char *arg, Resume *r) {
  (void)r;
  int n = count_arg(arg, 1);
  return n < 0 ? 0 : move_frame(st, n);
}

/* ---- source listings ---- */

static bool has_bp_at(const char *file, int line) {
  bool found = false;
  pthread_mutex_lock(&dbg.lock);
  for (int i = 0; i < dbg.nbps && !found; i++)
    found = dbg.bps[i].line == line && file_matches(dbg.bps[i].file, file);
  pthread_mutex_unlock(&dbg.lock);
  return found;
}

/* Lists lines [first, last] of the current frame's source in pdb's shape:
 * number, 'B' at a breakpoint, '->' at the current line. */
static void list_range(Stop *st, int first, int last) {
  const View *v = st_cur(st);
  if (first < 1) first = 1;
  for (int l = first; l <= last; l++) {
    const char *t;
    int n;
    if (!src_line(v->src, l, &t, &n)) {
      printf("[EOF]\n");
      break;
    }
    char num[16];
    int w = snprintf(num, sizeof num, "%3d", l);
    printf("%s%s%c%s\t%.*s\n", num, w < 4 ? " " : "", has_bp_at(v->src->name, l) ? 'B' : ' ',
           l == v->line ? "->" : "", n, t);
  }
  st->list_next = last + 1;
}

/* A line number argument, kept where arithmetic on it cannot overflow. */
static int line_arg(long n) { return n < -(1L << 24) ? -(1 << 24) : n > (1L << 24) ? 1 << 24 : (int)n; }

static int cmd_list(Stop *st, const char *arg, Resume *r) {
  (void)r;
  const View *v = st_cur(st);
  if (!v) return printf("*** no source to list\n"), 0;
  int first, last;
  if (!*arg || strcmp(arg, ".") == 0) {
    first = !*arg && st->list_next > 0 ? st->list_next : v->line - DBG_LIST_LINES / 2;
    if (first < 1) first = 1;
    last = first + DBG_LIST_LINES - 1;
  } else {
    char *end;
    first = line_arg(strtol(arg, &end, 10));
    while (*end == ' ') end++;
    if (end == arg || (*end && *end != ',')) return printf("*** expected line numbers, got '%s'\n", arg), 0;
    if (*end == ',') {
      last = line_arg(strtol(end + 1, NULL, 10));
      if (last < first) last = first + last;
    } else {
      first -= DBG_LIST_LINES / 2;
      if (first < 1) first = 1;
      last = first + DBG_LIST_LINES - 1;
    }
  }
  list_range(st, first, last);
  return 0;
}

/* Indentation of a line (tabs count as one). */
static int indent_of(const char *t, int n) {
  int i = 0;
  while (i < n && (t[i] == ' ' || t[i] == '\t')) i++;
  return i;
}

/* True when line text [t] (indentation skipped) opens function [name]:
 * `def name(`, `jit def name(`, `shard_map name(`, `jit shard_map name(`. */
static bool opens_function(const char *t, int n, const char *name) {
  char buf[512];
  snprintf(buf, sizeof buf, "%.*s", n, t);
  char *p = buf;
  if (strncmp(p, "jit ", 4) == 0) p += 4;
  while (*p == ' ') p++;
  if (strncmp(p, "def ", 4) == 0) p += 4;
  else if (strncmp(p, "shard_map ", 10) == 0) p += 10;
  else return false;
  while (*p == ' ') p++;
  size_t k = strlen(name);
  return strncmp(p, name, k) == 0 && (p[k] == '(' || p[k] == ' ');
}

/* The lines of the current frame's function, found in the source text:
 * the nearest `def NAME` above the current line and the indented block
 * under it; the whole file at module level.  False if not found. */
static bool function_lines(const View *v, int *first, int *last) {
  const char *t;
  int n, cur_indent = 1 << 20;
  *first = 1;
  *last = v->src->nlines;
  if (strcmp(v->fname, "<module>") == 0) return true;
  if (src_line(v->src, v->line, &t, &n)) cur_indent = indent_of(t, n);
  int def = 0, def_indent = 0;
  for (int l = v->line; l >= 1 && !def; l--) {
    if (!src_line(v->src, l, &t, &n)) continue;
    int in = indent_of(t, n);
    if (in < cur_indent && opens_function(t + in, n - in, v->fname)) def = l, def_indent = in;
  }
  if (!def) return false;
  int end = def;
  for (int l = def + 1; src_line(v->src, l, &t, &n); l++) {
    int in = indent_of(t, n);
    if (in == n || t[in] == '#') continue; /* blank or comment */
    if (in <= def_indent) break;
    end = l;
  }
  *first = def;
  *last = end;
  return true;
}

static int cmd_longlist(Stop *st, const char *arg, Resume *r) {
  (void)arg, (void)r;
  const View *v = st_cur(st);
  int first, last;
  if (!v) return printf("*** no source to list\n"), 0;
  if (!function_lines(v, &first, &last)) return printf("*** could not find the source of %s\n", v->fname), 0;
  list_range(st, first, last);
  return 0;
}

/* Appends to [names] the parameter names in the text after the '(' of a
 * def header starting at line [l]; their number. */
static int param_names(const View *v, int l, char names[][64], int cap) {
  const char *t;
  int n, depth = 0, count = 0, k = 0;
  bool in_name = true, started = false;
  char cur[64] = "";
  for (; src_line(v->src, l, &t, &n); l++) {
    for (int i = 0; i < n; i++) {
      char ch = t[i];
      if (!started) {
        started = ch == '(';
        continue;
      }
      if (depth == 0 && (ch == ',' || ch == ')')) {
        if (k > 0 && count < cap) snprintf(names[count++], 64, "%s", cur);
        k = 0, cur[0] = 0, in_name = true;
        if (ch == ')') return count;
        continue;
      }
      if (ch == '(' || ch == '[' || ch == '{') depth++;
      else if (ch == ')' || ch == ']' || ch == '}') depth--;
      bool ident = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' ||
                   (k > 0 && ch >= '0' && ch <= '9');
      if (in_name && depth == 0 && ident && k < 63) {
        cur[k++] = ch;
        cur[k] = 0;
      } else if (k > 0 || (ch != '*' && ch != ' ')) {
        in_name = false;
      }
    }
  }
  return count;
}

static int cmd_args(Stop *st, const char *arg, Resume *r) {
  (void)arg, (void)r;
  const View *v = st_cur(st);
  int first, last;
  char names[32][64];
  if (!v || strcmp(v->fname, "<module>") == 0 || !function_lines(v, &first, &last)) return 0;
  int n = param_names(v, first, names, 32);
  for (int i = 0; i < n; i++) {
    Value *x = env_lookup(v->env, intern_cstr(names[i]));
    Value *s = x ? val_repr(x) : NULL;
    if (s) printf("%s = %s\n", names[i], str_cstr(s));
    else err_clear();
    val_decref(s);
  }
  return 0;
}

/* ---- breakpoints ---- */

static void print_breakpoints(void) {
  pthread_mutex_lock(&dbg.lock);
  if (dbg.nbps) printf("Num Type         Disp Enb   Where\n");
  for (int i = 0; i < dbg.nbps; i++) {
    const Bp *b = &dbg.bps[i];
    printf("%-4dbreakpoint   %s %s at %s:%d\n", b->number, b->temporary ? "del " : "keep",
           b->enabled ? "yes  " : "no   ", b->file, b->line);
    if (b->cond) printf("\tstop only if %s\n", b->cond);
    if (b->ignore) printf("\tignore next %d hits\n", b->ignore);
    if (b->hits) printf("\tbreakpoint already hit %d time%s\n", b->hits, b->hits == 1 ? "" : "s");
  }
  pthread_mutex_unlock(&dbg.lock);
}

/* The source a breakpoint names: the current frame's when [file] is NULL
 * or names it, else the file read afresh.  A new reference, or NULL after
 * saying why. */
static Source *bp_source(const Stop *st, const char *file) {
  const View *v = st_cur(st);
  if (v && (!file || file_matches(file, v->src->name))) {
    src_incref(v->src);
    return v->src;
  }
  for (int i = 0; file && i < st_nframes(st); i++)
    if (file_matches(file, st_frame(st, i)->src->name)) {
      src_incref(st_frame(st, i)->src);
      return st_frame(st, i)->src;
    }
  if (!file) return printf("*** no current file: give file:line\n"), NULL;
  Source *s = src_from_file(file);
  if (!s) printf("*** '%s' not found\n", file), err_clear();
  return s;
}

/* A function name as a breakpoint location: its first statement; a
 * shard_map or jit function's is its wrapped function's (__wrapped__). */
static bool bp_function(const Stop *st, const char *name, char *file, size_t cap, int *line) {
  const View *v = st_cur(st);
  Value *f = v ? env_lookup(v->env, intern_cstr(name)) : NULL;
  if (!f) return false;
  /* a shard_map or jit function breaks in the function it wraps */
  val_incref(f);
  for (int i = 0; i < 16 && f->type != V_FUNC; i++) {
    Value *inner = ops_getattr(f, "__wrapped__");
    val_decref(f);
    if (!(f = inner)) {
      err_clear();
      return false;
    }
  }
  const Node *d = f->type == V_FUNC ? ((Func *)f)->node : NULL;
  bool ok = d && d->kind != N_LAMBDA && d->body.n > 0;
  if (ok) {
    snprintf(file, cap, "%s", d->body.items[0]->loc.src->name);
    *line = d->body.items[0]->loc.line;
  }
  val_decref(f);
  return ok;
}

/* Parses "[file:]line" or a function name into [file] and [line]. */
static bool bp_location(const Stop *st, char *loc, char *file, size_t cap, int *line) {
  char *colon = strrchr(loc, ':');
  char *num = colon ? colon + 1 : loc;
  char *end;
  long n = strtol(num, &end, 10);
  if (end != num && *end == 0) {
    if (colon) *colon = 0;
    snprintf(file, cap, "%s", colon ? loc : "");
    *line = n < 0 || n > INT_MAX ? 0 : (int)n; /* 0: "End of file" */
    return true;
  }
  if (bp_function(st, loc, file, cap, line)) return true;
  printf("*** '%s' is not a line number or a function\n", loc);
  return false;
}

/* Checks that [line] of [src] can hold a breakpoint, as pdb does. */
static bool bp_line_ok(const Source *src, int line) {
  const char *t;
  int n;
  if (!src_line(src, line, &t, &n)) {
    printf("*** End of file\n");
    return false;
  }
  int in = indent_of(t, n);
  if (in == n || t[in] == '#') {
    printf("*** Blank or comment\n");
    return false;
  }
  return true;
}

static void trim(char *s) {
  size_t n = strlen(s);
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = 0;
  size_t k = strspn(s, " \t");
  memmove(s, s + k, n - k + 1);
}

/* A breakpoint condition must be one expression (checked by parsing it,
 * without running anything). */
static bool cond_parses(const char *cond) {
  if (!cond || !*cond) return true;
  Source *src = src_new("<condition>", cond);
  AstModule *mod = src ? parse_source(src) : NULL;
  bool ok = mod && mod->body.n == 1 && mod->body.items[0]->kind == N_EXPR_STMT;
  if (!ok) printf("*** Invalid condition %s: %s\n", cond, err_occurred() ? err_message() : "not an expression");
  err_clear();
  ast_free(mod);
  src_decref(src);
  return ok;
}

static void bp_add(const char *file, int line, const char *cond, bool temporary) {
  pthread_mutex_lock(&dbg.lock);
  Bp *bps = dbg.nbps == dbg.bpcap ? shm_realloc(dbg.bps, sizeof(Bp) * (size_t)(dbg.bpcap * 2 + 4)) : dbg.bps;
  if (bps) {
    if (bps != dbg.bps) dbg.bpcap = dbg.bpcap * 2 + 4;
    dbg.bps = bps;
    Bp *b = &bps[dbg.nbps++];
    *b = (Bp){++dbg.next_bp, shm_strdup(file), line, cond && *cond ? shm_strdup(cond) : NULL,
              temporary, true, 0, 0};
    atomic_fetch_add(&dbg.nbp_enabled, 1);
    printf("Breakpoint %d at %s:%d\n", b->number, b->file, b->line);
  }
  pthread_mutex_unlock(&dbg.lock);
  update_engaged();
}

static int set_break(Stop *st, const char *arg, bool temporary) {
  if (!*arg) {
    print_breakpoints();
    return 0;
  }
  char file[512], *buf = shm_strdup(arg);
  if (!buf) return 0;
  char *comma = strchr(buf, ',');
  if (comma) *comma = 0;
  trim(buf);
  int line;
  Source *src = NULL;
  if (bp_location(st, buf, file, sizeof file, &line)) src = bp_source(st, file[0] ? file : NULL);
  char *cond = comma ? comma + 1 : NULL;
  if (cond) trim(cond);
  if (src && bp_line_ok(src, line) && cond_parses(cond)) bp_add(src->name, line, cond, temporary);
  if (src) src_decref(src);
  shm_free(buf);
  return 0;
}

static int cmd_break(Stop *st, const char *arg, Resume *r) {
  (void)r;
  return set_break(st, arg, false);
}

static int cmd_tbreak(Stop *st, const char *arg, Resume *r) {
  (void)r;
  return set_break(st, arg, true);
}

/* Deletes breakpoint [number], saying so; false if there is none. */
static bool delete_numbered(int number) {
  pthread_mutex_lock(&dbg.lock);
  Bp *b = bp_find(number);
  if (b) {
    printf("Deleted breakpoint %d at %s:%d\n", b->number, b->file, b->line);
    bp_delete(b);
  }
  pthread_mutex_unlock(&dbg.lock);
  return b != NULL;
}

/* Runs [fn] on each breakpoint number in [arg], as pdb's clear, disable
 * and enable take them. */
static void each_number(const char *arg, void (*fn)(int number)) {
  char *buf = shm_strdup(arg), *save = NULL;
  for (char *w = buf ? strtok_r(buf, " \t", &save) : NULL; w; w = strtok_r(NULL, " \t", &save)) {
    char *end;
    long n = strtol(w, &end, 10);
    if (*end || n < INT_MIN || n > INT_MAX) printf("*** Non-numeric breakpoint number %s\n", w);
    else fn((int)n);
  }
  shm_free(buf);
}

static void clear_one(int number) {
  if (!delete_numbered(number)) printf("*** No breakpoint numbered %d\n", number);
}

/* The numbers of the breakpoints at [file]:[line], or of all when [file]
 * is NULL (lock taken here: devices delete tbreaks they hit). */
static int bp_numbers(const char *file, int line, int *out, int cap) {
  int n = 0;
  pthread_mutex_lock(&dbg.lock);
  for (int i = 0; i < dbg.nbps && n < cap; i++)
    if (!file || (dbg.bps[i].line == line && file_matches(file, dbg.bps[i].file)))
      out[n++] = dbg.bps[i].number;
  pthread_mutex_unlock(&dbg.lock);
  return n;
}

static void clear_all(void) {
  int nums[256];
  char *reply = read_command("Clear all breaks? ");
  bool yes = reply && (strcmp(reply, "y") == 0 || strcmp(reply, "yes") == 0);
  free(reply);
  int n = yes ? bp_numbers(NULL, 0, nums, 256) : 0;
  for (int i = 0; i < n; i++) delete_numbered(nums[i]);
}

static void clear_at(Stop *st, char *loc) {
  char file[512];
  int line, nums[256];
  if (!bp_location(st, loc, file, sizeof file, &line)) return;
  int n = bp_numbers(file, line, nums, 256);
  for (int i = 0; i < n; i++) delete_numbered(nums[i]);
  if (!n) printf("*** There is no breakpoint at %s:%d\n", file, line);
}

static int cmd_clear(Stop *st, const char *arg, Resume *r) {
  (void)r;
  char *buf = shm_strdup(arg);
  if (!*arg) clear_all();
  else if (buf && strchr(arg, ':')) clear_at(st, buf);
  else each_number(arg, clear_one);
  shm_free(buf);
  update_engaged();
  return 0;
}

static void set_enabled(int number, bool on) {
  pthread_mutex_lock(&dbg.lock);
  Bp *b = bp_find(number);
  if (!b) {
    printf("*** No breakpoint numbered %d\n", number);
  } else {
    if (b->enabled != on) atomic_fetch_add(&dbg.nbp_enabled, on ? 1 : -1);
    b->enabled = on;
    printf("%s breakpoint %d at %s:%d\n", on ? "Enabled" : "Disabled", b->number, b->file, b->line);
  }
  pthread_mutex_unlock(&dbg.lock);
}

static void enable_one(int number) { set_enabled(number, true); }
static void disable_one(int number) { set_enabled(number, false); }

static int cmd_disable(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)r;
  each_number(arg, disable_one);
  update_engaged();
  return 0;
}

static int cmd_enable(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)r;
  each_number(arg, enable_one);
  update_engaged();
  return 0;
}

/* Sets breakpoint [number]'s ignore count to [count] and says so in
 * pdb's words (a count below 1 clears it, as pdb treats it). */
static void set_ignore(int number, int count) {
  pthread_mutex_lock(&dbg.lock);
  Bp *b = bp_find(number);
  if (!b) {
    printf("*** No breakpoint numbered %d\n", number);
  } else {
    b->ignore = count > 0 ? count : 0;
    if (count > 1) printf("Will ignore next %d crossings of breakpoint %d.\n", count, number);
    else if (count == 1) printf("Will ignore next 1 crossing of breakpoint %d.\n", number);
    else printf("Will stop next time breakpoint %d is reached.\n", number);
  }
  pthread_mutex_unlock(&dbg.lock);
}

/* ignore bpnumber [count]: pass over the breakpoint's next count
 * crossings where its condition holds (pdb). */
static int cmd_ignore(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)r;
  char *end, *cend;
  if (!*arg) return printf("*** Breakpoint number expected\n"), 0;
  long n = strtol(arg, &end, 10);
  if (end == arg || (*end && *end != ' ' && *end != '\t')) {
    int k = (int)strcspn(arg, " \t");
    return printf("*** Non-numeric breakpoint number %.*s\n", k, arg), 0;
  }
  while (*end == ' ' || *end == '\t') end++;
  long count = *end ? strtol(end, &cend, 10) : 0;
  if (*end && (cend == end || *cend)) return printf("*** Invalid argument: %s\n", arg), 0;
  if (n < INT_MIN || n > INT_MAX) n = INT_MIN;   /* no such breakpoint */
  set_ignore((int)n, count > 1000000000L ? 1000000000 : count < 0 ? 0 : (int)count);
  return 0;
}

/* ---- breakpoint command lists ---- */

/* Breakpoint [number]'s command list, or NULL. */
static BpCmds *bpcmds_find(int number) {
  for (int i = 0; i < dbg.nbpcmds; i++)
    if (dbg.bpcmds[i].number == number) return &dbg.bpcmds[i];
  return NULL;
}

/* Frees [bc]'s lines, leaving it empty. */
static void bpcmds_free_lines(BpCmds *bc) {
  for (int i = 0; i < bc->n; i++) shm_free(bc->lines[i]);
  shm_free(bc->lines);
  bc->lines = NULL;
  bc->n = 0;
}

/* Gives breakpoint [number] the list [lines] (taken over) and [silent],
 * replacing its old list; an empty list removes it, as `commands` then
 * `end` does in pdb. */
static void bpcmds_set(int number, bool silent, char **lines, int n) {
  BpCmds *bc = bpcmds_find(number);
  if (bc) bpcmds_free_lines(bc);
  if (!n && !silent) {
    if (bc) *bc = dbg.bpcmds[--dbg.nbpcmds];
    shm_free(lines);
    return;
  }
  if (!bc) {
    BpCmds *t = shm_realloc(dbg.bpcmds, sizeof(BpCmds) * (size_t)(dbg.nbpcmds + 1));
    if (!t) {
      bpcmds_free_lines(&(BpCmds){.n = n, .lines = lines});
      return;
    }
    dbg.bpcmds = t;
    bc = &dbg.bpcmds[dbg.nbpcmds++];
  }
  *bc = (BpCmds){number, silent, n, lines};
}

static int dispatch(Stop *st, const char *line, Resume *r);
static int cmd_jump(Stop *st, const char *arg, Resume *r);

/* True when command line [line] resumes the program (c, s, n, r, unt, q,
 * and jump; pdb's commands_resuming): pdb ends a command list there. */
static bool line_resumes(const char *line) {
  static const CmdFn resuming[] = {cmd_step, cmd_next, cmd_until, cmd_return, cmd_continue,
                                   cmd_quit, cmd_jump};
  char word[32];
  while (*line == ' ' || *line == '\t') line++;
  const Cmd *c = first_word(line, word, sizeof word) ? cmd_lookup(word) : NULL;
  for (size_t i = 0; c && i < sizeof resuming / sizeof *resuming; i++)
    if (c->fn == resuming[i]) return true;
  return false;
}

/* Reads a command list at the `(com) ` prompt (echoed as any prompt is
 * when input is a pipe) up to `end`, a resuming command (kept: it ends
 * the list, as in pdb) or the end of input; `silent` is a flag, not a
 * command.  Gives it to breakpoint [number]. */
static void read_command_list(int number) {
  char **lines = NULL, word[32];
  int n = 0;
  bool silent = false;
  for (char *line; (line = read_command("(com) "));) {
    trim(line);
    size_t k = first_word(line, word, sizeof word);
    bool end = k && line[k] == 0 && strcmp(word, "end") == 0;
    bool flag = k && line[k] == 0 && strcmp(word, "silent") == 0;
    silent |= flag;
    char *keep = line[0] && !end && !flag ? shm_strdup(line) : NULL;
    char **t = keep ? shm_realloc(lines, sizeof(char *) * (size_t)(n + 1)) : NULL;
    if (t) {
      lines = t;
      lines[n++] = keep;
    } else {
      shm_free(keep);
    }
    free(line);
    if (end || (t && line_resumes(keep))) break;
  }
  bpcmds_set(number, silent, lines, n);
}

/* commands [bpnumber]: reads the commands to run when the breakpoint (by
 * default the last one set) stops, as pdb does. */
static int cmd_commands(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)r;
  char *end;
  long n = strtol(arg, &end, 10);
  if (*arg && (end == arg || *end)) return printf("*** Non-numeric breakpoint number %s\n", arg), 0;
  pthread_mutex_lock(&dbg.lock);
  if (!*arg) n = dbg.next_bp;
  bool found = n >= INT_MIN && n <= INT_MAX && bp_find((int)n);
  pthread_mutex_unlock(&dbg.lock);
  if (!found) return printf("*** No breakpoint numbered %ld\n", n), 0;
  read_command_list((int)n);
  return 0;
}

/* Runs the command list of the breakpoint the stop is at, as if typed
 * (pdb's bp_commands); 1 when one of them resumed the program (*r set).
 * A list that ends with a resuming command never prompts: when that
 * command does not resume by itself (jump, or it failed) the program
 * continues. */
static int run_bp_commands(Stop *st, Resume *r, bool *silent) {
  const BpCmds *bc = bpcmds_find(st->bp);
  int n = bc ? bc->n : 0;
  bool last_resumes = n > 0 && line_resumes(bc->lines[n - 1]);
  *silent = bc && bc->silent;
  for (int i = 0; i < n; i++) {
    bc = bpcmds_find(st->bp);   /* a command of the list may have replaced it */
    char *line = bc && i < bc->n ? shm_strdup(bc->lines[i]) : NULL;
    if (!line) break;
    int go = dispatch(st, line, r);
    shm_free(line);
    fflush(stdout);
    if (go) return 1;
  }
  if (!last_resumes) return 0;
  *r = (Resume){RM_CONTINUE, 0, 0};
  return 1;
}

/* ---- jump ---- */

/* The [k]-th statement list directly under statement [n] (the bodies of
 * if/else, loops and their else, try's body, handlers, else and finally,
 * with, def and shard_map), or NULL past the last. */
static const NodeList *sub_block(const Node *n, int k) {
  switch (n->kind) {
  case N_IF:
  case N_WHILE:
  case N_FOR: return k == 0 ? &n->body : k == 1 ? &n->orelse : NULL;
  case N_DEF:
  case N_SHARD_MAP:
  case N_WITH: return k == 0 ? &n->body : NULL;
  case N_TRY:
    if (k == 0) return &n->body;
    if (k - 1 < n->items.n) return &n->items.items[k - 1]->body;
    k -= 1 + n->items.n;
    return k == 0 ? &n->orelse : k == 1 ? &n->items2 : NULL;
  default: return NULL;
  }
}

/* The statement list, [l] or one nested in it, that holds [stmt]; NULL
 * when none does (a made-up frame: breakpoint() under jit). */
static const NodeList *block_holding(const NodeList *l, const Node *stmt) {
  for (int i = 0; i < l->n; i++) {
    if (l->items[i] == stmt) return l;
    const NodeList *b, *found;
    for (int k = 0; (b = sub_block(l->items[i], k)); k++)
      if ((found = block_holding(b, stmt))) return found;
  }
  return NULL;
}

/* The last source line of statement [n], the blocks it opens included. */
static int stmt_end_line(const Node *n) {
  int m = node_last_line(n);
  const NodeList *b;
  for (int k = 0; (b = sub_block(n, k)); k++)
    if (b->n > 0) {
      int l = stmt_end_line(b->items[b->n - 1]);
      if (l > m) m = l;
    }
  return m;
}

/* The keyword that opens statement [n]'s block, for jump's messages. */
static const char *block_kind(const Node *n) {
  switch (n->kind) {
  case N_IF: return "if";
  case N_WHILE: return "while";
  case N_FOR: return "for";
  case N_TRY: return "try";
  case N_WITH: return "with";
  case N_SHARD_MAP: return "shard_map";
  default: return "def";
  }
}

/* The statement of [block] that starts at [line], or NULL after saying
 * why a jump cannot go there (pdb's "Jump failed"): only a statement of
 * the current statement's own block is a target, so a jump never enters
 * the middle of a block nor leaves one (a loop, a finally). */
static const Node *jump_target(const NodeList *block, int line) {
  int first = block->items[0]->loc.line, last = stmt_end_line(block->items[block->n - 1]);
  if (line < first || line > last) {
    printf("*** Jump failed: line %d is outside the block of the current statement "
           "(lines %d-%d)\n", line, first, last);
    return NULL;
  }
  for (int i = 0; i < block->n; i++) {
    const Node *s = block->items[i];
    if (s->loc.line == line) return s;
    if (line < s->loc.line || line > stmt_end_line(s)) continue;
    if (sub_block(s, 0))
      printf("*** Jump failed: can't jump into the middle of the '%s' block at line %d\n",
             block_kind(s), s->loc.line);
    else
      printf("*** Jump failed: line %d is not the first line of a statement\n", line);
    return NULL;
  }
  printf("*** Jump failed: line %d holds no statement\n", line);
  return NULL;
}

/* The frame a jump applies to, or NULL after saying why there is none:
 * the bottom frame, the main thread's or the parked focused device's. */
static const Frame *jump_frame(const Stop *st) {
  char c[160], state[320];
  if (st->level != st_nframes(st) - 1) {
    printf("*** You can only jump within the bottom frame\n");
    return NULL;
  }
  if (st->pm) {
    printf("*** Jump failed: the program has ended (post-mortem)\n");
    return NULL;
  }
  if (st_cur(st) && st_cur(st)->retval) {   /* pdb: only from a 'line' event */
    printf("*** Jump failed: the frame is returning (--Return--); jump from a line\n");
    return NULL;
  }
  if (!st->call) return st->frame;
  const Frame *f = NULL;
  pthread_mutex_lock(&dbg.lock);
  if (st->call->slots[dbg.focus].state == DS_PARKED) f = st->call->slots[dbg.focus].frame;
  pthread_mutex_unlock(&dbg.lock);
  if (f) return f;
  device_state(st, dbg.focus, state, sizeof state);
  printf("*** Jump failed: device %s is not stopped at a statement (%s)\n",
         coords_of(st, dbg.focus, c, sizeof c), state);
  return NULL;
}

/* True when every device of the call is parked at [f]'s statement and
 * depth, so that all of them jump together and none is left behind; else
 * says which device is elsewhere. */
static bool devices_together(const Stop *st, const Frame *f) {
  DbgCall *c = st->call;
  char cbuf[160], state[320];
  int bad = -1;
  pthread_mutex_lock(&dbg.lock);
  int depth = c->slots[dbg.focus].depth;
  for (int r = 0; r < c->n && bad < 0; r++) {
    const Slot *s = &c->slots[r];
    if (s->state != DS_PARKED || s->retval || s->frame->stmt != f->stmt || s->depth != depth)
      bad = r;
  }
  pthread_mutex_unlock(&dbg.lock);
  if (bad < 0) return true;
  device_state(st, bad, state, sizeof state);
  printf("*** Jump failed: all devices must be stopped at this statement to jump together; "
         "device %s: %s\n", coords_of(st, bad, cbuf, sizeof cbuf), state);
  return false;
}

/* Moves the bottom frame's view (each device's innermost one, as they all
 * jump) to statement [to]. */
static void jump_views(Stop *st, const Node *to) {
  int n = st->call ? st->ndev : 1;
  for (int i = 0; i < n; i++) {
    Stack *s = st->call ? &st->dev[i] : &st->main;
    if (s->n == 0) continue;
    View *v = &s->v[s->n - 1];
    v->line = to->loc.line;
    v->last_line = node_last_line(to) > v->line ? node_last_line(to) : v->line;
  }
}

/* j(ump) lineno: the statement at lineno, of the current statement's
 * block, is the next to run in the bottom frame (pdb's jump); the stop
 * shows the new location and goes on when a command resumes. */
static int cmd_jump(Stop *st, const char *arg, Resume *r) {
  (void)r;
  const Frame *f = jump_frame(st);
  if (!f) return 0;
  char *end;
  long line = strtol(arg, &end, 10);
  if (!*arg || *end) return printf("*** The 'jump' command requires a line number\n"), 0;
  const NodeList *block = f->mod && f->stmt ? block_holding(&f->mod->body, f->stmt) : NULL;
  if (!block) return printf("*** Jump failed: the frame runs no statement of its source\n"), 0;
  const Node *to = jump_target(block, line_arg(line));
  if (!to || (st->call && !devices_together(st, f))) return 0;
  st->jump = to;
  jump_views(st, to);
  st->list_next = 0;
  print_view(st_cur(st), "> ");
  return 0;
}

/* ---- values ---- */

/* Splits "EXPR @ all" into EXPR; true when the suffix was there. */
static bool split_at_all(char *expr) {
  size_t n = strlen(expr);
  while (n && expr[n - 1] == ' ') n--;
  if (n < 3 || strncmp(expr + n - 3, "all", 3) != 0) return false;
  size_t k = n - 3;
  while (k && expr[k - 1] == ' ') k--;
  if (!k || expr[k - 1] != '@') return false;
  if (n - 3 > k && expr[k] != ' ') return false;
  expr[k - 1] = 0;
  trim(expr);
  return true;
}

/* Device [r]'s frame in which `p x @ all` and a line run on every device
 * evaluate: as many levels up as the focused device's selected frame
 * (`up` and `down` select it for all of them); NULL when it has none. */
static const View *dev_view(const Stop *st, int r) {
  const Stack *fs = focus_stack(st), *s = &st->dev[r];
  int up = fs && st->level >= st->main.n ? fs->n - 1 - (st->level - st->main.n) : 0;
  int k = s->n - 1 - up;
  return s->n ? &s->v[k < 0 ? 0 : k] : NULL;
}

/* ---- lines that call a collective: run on every device --------------------------- */

/* The value that callee [n] names, found without running anything: a
 * name, or a module's attribute (lax.psum, jax.lax.psum).  A new
 * reference, or NULL. */
static Value *callee_value(const Node *n, Env *env) {
  if (n->kind == N_NAME) {
    Value *v = env_lookup(env, n->name);
    if (!v) v = env_lookup(shm_interp->builtins, n->name);
    return v ? val_incref(v) : NULL;
  }
  if (n->kind != N_ATTR) return NULL;
  Value *base = callee_value(n->a, env), *v = NULL;
  if (base && base->type == V_MODULE && !(v = ops_getattr(base, n->name))) err_clear();
  val_decref(base);
  return v;
}

static bool calls_collective(const Node *n, Env *env);

static bool list_calls_collective(const NodeList *l, Env *env) {
  for (int i = 0; i < l->n; i++)
    if (calls_collective(l->items[i], env)) return true;
  return false;
}

/* Whether [n], an expression or a statement, calls anywhere inside it a
 * collective that needs every device (shardmap_is_collective).  A call
 * through a function of the user's is not seen: it fails on the one
 * device, saying so, as any collective outside a body does. */
static bool calls_collective(const Node *n, Env *env) {
  if (!n) return false;
  if (n->kind == N_CALL) {
    Value *f = callee_value(n->a, env);
    bool yes = shardmap_is_collective(f);
    val_decref(f);
    for (int i = 0; !yes && i < n->nkw; i++) yes = calls_collective(n->kws[i].value, env);
    if (yes) return true;
  }
  if (calls_collective(n->a, env) || calls_collective(n->b, env) ||
      calls_collective(n->c, env) || list_calls_collective(&n->items, env) ||
      list_calls_collective(&n->body, env))
    return true;
  if ((n->kind == N_DICT || n->kind == N_TRY) && list_calls_collective(&n->items2, env))
    return true;
  if ((n->kind == N_IF || n->kind == N_WHILE || n->kind == N_FOR || n->kind == N_TRY) &&
      list_calls_collective(&n->orelse, env))
    return true;
  for (int i = 0; n->kind == N_LISTCOMP && i < n->nclauses; i++) {
    const CompClause *k = &n->clauses[i];
    if (calls_collective(k->iter, env) || list_calls_collective(&k->conds, env)) return true;
  }
  return false;
}

/* Whether the line [text] calls a collective (names looked up in [env]).
 * A line that does not parse is not one: it fails when it runs. */
static bool text_calls_collective(const char *text, Env *env) {
  Source *src = src_new("<stdin>", text);
  AstModule *m = src ? parse_source(src) : NULL;
  bool yes = m && list_calls_collective(&m->body, env);
  err_clear();
  ast_free(m);
  src_decref(src);
  return yes;
}

/* The first device of [c] that is not parked at a statement (it returned,
 * failed, or waits in a collective), or -1 (lock held). */
static int first_unparked(const DbgCall *c) {
  for (int r = 0; r < c->n; r++)
    if (c->slots[r].state != DS_PARKED) return r;
  return -1;
}

/* Whether job [j] can no longer finish (lock held): every device still
 * running it waits in a collective, and some device is done with it, so
 * will never join (the line failed there only).  [sig] sums the waiting
 * ones' collective counters, for the caller to see that nothing moved. */
static bool job_stuck(DbgCall *c, const Job *j, long *sig) {
  char buf[256];
  *sig = 0;
  if (j->pending == c->n) return false;
  for (int r = 0; r < c->n; r++) {
    if (j->out[r]) continue;
    if (!coll_waiting_str(c->g, r, buf, sizeof buf)) return false;
    *sig += coll_seq(c->g, r) * (r + 1);
  }
  return true;
}

/* Waits (lock held) until every device of [c] has run job [j].  A job
 * that cannot finish (job_stuck, seen three times 10 ms apart with
 * nothing moved) aborts the call's group, as a device leaving a body
 * early does: the waiting devices fail, so does the call when resumed. */
static void wait_job(DbgCall *c, Job *j) {
  long sig, prev = -1;
  int same = 0;
  while (j->pending > 0) {
    timed_wait();
    if (!job_stuck(c, j, &sig)) {
      prev = -1, same = 0;
      continue;
    }
    same = sig == prev ? same + 1 : 0;
    prev = sig;
    if (same == 2 && !j->aborted) {
      j->aborted = true;
      coll_group_abort(c->g, ERR_VALUE,
                       "a line typed at the debugger's prompt failed on some devices "
                       "while the others waited in its collective");
    }
  }
}

/* Prints the results of job [j]: each device's printed lines (prefixed
 * by its coordinates); then, for an expression, the focused device's
 * value or, with [all], every device's; for statements, the failures,
 * once when every device failed alike. */
static void print_job(const Stop *st, const Job *j, bool all) {
  char c[160], prefix[176];
  for (int r = 0; r < st->ndev; r++) flush_device(st->call, r);
  bool alike = true;
  for (int r = 1; r < st->ndev; r++) alike = alike && strcmp(j->out[r], j->out[0]) == 0;
  if (j->expr && !all) {
    printf("%s\n", j->out[dbg.focus]);
    return;
  }
  if (!j->expr && alike) {
    if (j->out[0][0]) printf("%s\n", j->out[0]);
    return;
  }
  for (int r = 0; r < st->ndev; r++) {
    if (!j->expr && !j->out[r][0]) continue;
    snprintf(prefix, sizeof prefix, "%s: ", coords_of(st, r, c, sizeof c));
    print_prefixed(prefix, j->out[r]);
  }
}

/* Runs [text] (an expression when [expr]) on every device of the stop's
 * call, each in its selected frame, when it calls a collective: such a
 * line needs every device, as in the body itself (LANGUAGE.md §7).  False,
 * doing nothing, when the line calls none or the focused frame is not a
 * device's.  Every device must be parked at a statement; else the line is
 * refused, naming the device that is not, so it can never hang. */
static bool run_everywhere(const Stop *st, const char *text, bool expr, bool pretty, bool all) {
  DbgCall *c = st->call;
  const View *fv = st_cur(st);
  if (!c || !fv || st->level < st->main.n || !text_calls_collective(text, fv->env)) return false;
  char coords[160], state[320];
  if (shm_interp->reference) {
    printf("*** a collective typed at the prompt runs on every device: not in reference mode\n");
    return true;
  }
  Env **env = shm_calloc((size_t)c->n, sizeof *env);
  char **out = shm_calloc((size_t)c->n, sizeof *out);
  Job j = {.text = text, .expr = expr, .pretty = pretty, .env = env, .out = out, .pending = c->n};
  for (int r = 0; env && out && r < c->n; r++) {
    const View *v = dev_view(st, r);
    env[r] = v ? v->env : NULL;
  }
  pthread_mutex_lock(&dbg.lock);
  int missing = env && out ? first_unparked(c) : -1;
  if (env && out && missing < 0) {
    c->job = &j;
    c->job_gen++;
    pthread_cond_broadcast(&dbg.cond);
    wait_job(c, &j);
    c->job = NULL;
  }
  pthread_mutex_unlock(&dbg.lock);
  if (!env || !out) {
    printf("*** out of memory\n");
  } else if (missing >= 0) {
    device_state(st, missing, state, sizeof state);
    printf("*** the line calls a collective, which runs on every device, but device %s is "
           "not stopped at a statement (%s)\n",
           coords_of(st, missing, coords, sizeof coords), state);
  } else {
    print_job(st, &j, all);
    if (j.aborted)
      printf("*** the line failed on some devices while the others waited in its collective: "
             "the shard_map call ends with an error at its next collective\n");
  }
  for (int r = 0; out && r < c->n; r++) shm_free(out[r]);
  shm_free(out);
  shm_free(env);
  return true;
}

/* `p x @ all`: each device's value in its selected frame, every line
 * prefixed by the device's mesh coordinates. */
static void print_all(const Stop *st, const char *expr, bool pretty) {
  char c[160], prefix[176], state[320];
  if (!st->mesh) {
    printf("*** not stopped inside a shard_map body\n");
    return;
  }
  for (int r = 0; r < st->ndev; r++) {
    snprintf(prefix, sizeof prefix, "%s: ", coords_of(st, r, c, sizeof c));
    const View *v = dev_view(st, r);
    if (!v) {
      device_state(st, r, state, sizeof state);
      printf("%s(%s)\n", prefix, state);
      continue;
    }
    char *t = value_text(st, v, r, expr, pretty, FAIL_P);
    if (t) print_prefixed(prefix, t);
    shm_free(t);
  }
}

static int print_value(Stop *st, const char *arg, bool pretty) {
  char *expr = shm_strdup(arg);
  const View *v = st_cur(st);
  if (!expr) return 0;
  trim(expr);
  if (!*expr) {
    printf("*** usage: p expression [@ all]\n");
  } else if (split_at_all(expr)) {
    if (!run_everywhere(st, expr, true, pretty, true)) print_all(st, expr, pretty);
  } else if (!v) {
    printf("*** no frame\n");
  } else if (!run_everywhere(st, expr, true, pretty, false)) {
    char *t = value_text(st, v, st_rank_of(st, st->level), expr, pretty, FAIL_P);
    if (t) printf("%s\n", t);
    shm_free(t);
  }
  shm_free(expr);
  return 0;
}

/* Prints the value view [v] returns, each line after [prefix], as
 * `retval` does: its whole repr, or pdb's "Not yet returned!" when [v] is
 * not at a return stop. */
static void print_retval(const View *v, const char *prefix) {
  if (!v || !v->retval) {
    printf("%s*** Not yet returned!\n", prefix);
    return;
  }
  Value *r = val_repr(v->retval);
  if (r) print_prefixed(prefix, str_cstr(r));
  else print_error();
  val_decref(r);
}

/* retval [@ all]: the value the current frame is returning, at a return
 * stop (pdb's); with '@ all', each device's, in its innermost frame. */
static int cmd_retval(Stop *st, const char *arg, Resume *r) {
  (void)r;
  char c[160], prefix[176], state[320];
  bool all = strcmp(arg, "@ all") == 0 || strcmp(arg, "@all") == 0;
  if (*arg && !all) return printf("*** usage: retval [@ all]\n"), 0;
  if (!all) return print_retval(st_cur(st), ""), 0;
  if (!st->mesh) return printf("*** not stopped inside a shard_map body\n"), 0;
  for (int i = 0; i < st->ndev; i++) {
    const Stack *s = &st->dev[i];
    snprintf(prefix, sizeof prefix, "%s: ", coords_of(st, i, c, sizeof c));
    if (s->n > 0) {
      print_retval(&s->v[s->n - 1], prefix);
      continue;
    }
    device_state(st, i, state, sizeof state);
    printf("%s(%s)\n", prefix, state);
  }
  return 0;
}

/* condition N [cond]: sets breakpoint N's condition, or removes it (pdb). */
static int cmd_condition(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)r;
  char *end;
  long n = strtol(arg, &end, 10);
  if (end == arg) return printf("*** usage: condition bpnumber [condition]\n"), 0;
  while (*end == ' ') end++;
  pthread_mutex_lock(&dbg.lock);
  Bp *b = bp_find((int)n);
  if (!b) {
    printf("*** No breakpoint numbered %ld\n", n);
  } else {
    shm_free(b->cond);
    b->cond = *end ? shm_strdup(end) : NULL;
    if (b->cond) printf("New condition set for breakpoint %ld.\n", n);
    else printf("Breakpoint %ld is now unconditional.\n", n);
  }
  pthread_mutex_unlock(&dbg.lock);
  return 0;
}

/* whatis expr: the type of its value (pdb). */
static int cmd_whatis(Stop *st, const char *arg, Resume *r) {
  (void)r;
  const View *v = st_cur(st);
  if (!v || !*arg) return printf("*** usage: whatis expression\n"), 0;
  Value *x = eval_in(st, v, st_rank_of(st, st->level), arg);
  if (!x) return print_error(), 0;
  printf("<class '%s'>\n", val_type_name(x));
  val_decref(x);
  return 0;
}

static int cmd_p(Stop *st, const char *arg, Resume *r) {
  (void)r;
  return print_value(st, arg, false);
}

static int cmd_pp(Stop *st, const char *arg, Resume *r) {
  (void)r;
  return print_value(st, arg, true);
}

static int cmd_display(Stop *st, const char *arg, Resume *r) {
  (void)r;
  const View *v = st_cur(st);
  if (!*arg) {   /* pdb lists the current frame's */
    printf("Currently displaying:\n");
    for (int i = 0; v && i < dbg.ndisplays; i++) {
      const Display *d = &dbg.displays[i];
      int k = display_index(st, d, v);
      if (k >= 0) printf("%s: %s\n", d->expr, d->last[k] ? d->last[k] : "");
    }
    return 0;
  }
  if (!v) return 0;
  int rank = st_rank_of(st, st->level), n = rank >= 0 ? st->ndev : 1;
  Display d = {shm_strdup(arg), n, rank >= 0, shm_calloc((size_t)n, sizeof(Env *)),
               shm_calloc((size_t)n, sizeof(char *))};
  Display *all = shm_realloc(dbg.displays, sizeof(Display) * (size_t)(dbg.ndisplays + 1));
  if (!d.expr || !d.env || !d.last || !all) {
    d.n = 0;
    display_free(&d);
    if (all) dbg.displays = all;
    return printf("*** out of memory\n"), 0;
  }
  dbg.displays = all;
  for (int k = 0; k < n; k++) {   /* the same frame on every device */
    const View *dv = rank >= 0 ? dev_view(st, k) : v;
    if ((d.env[k] = dv ? dv->env : NULL)) env_incref(d.env[k]);
  }
  int k = rank >= 0 ? rank : 0;
  d.last[k] = value_text(st, v, rank, arg, false, FAIL_DISPLAY);
  dbg.displays[dbg.ndisplays++] = d;
  printf("display %s: %s\n", arg, d.last[k] ? d.last[k] : "");
  return 0;
}

static int cmd_undisplay(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)r;
  int kept = 0;
  bool found = false;
  for (int i = 0; i < dbg.ndisplays; i++) {
    Display *d = &dbg.displays[i];
    if (!*arg || strcmp(d->expr, arg) == 0) {
      found = true;
      display_free(d);
    } else {
      dbg.displays[kept++] = *d;
    }
  }
  dbg.ndisplays = kept;
  if (*arg && !found) printf("** %s not in the display list **\n", arg);
  return 0;
}

/* ---- interact ---- */

static bool interact_exit;   /* main thread: exit() or quit() ended `interact` */

/* exit() and quit() in `interact`'s namespace: end it (a silent ERR_QUIT
 * that interact_loop catches), so a piped session can leave it and go on
 * at the debugger's prompt; at a terminal Ctrl-D does the same. */
static Value *bi_interact_exit(const CallArgs *a) {
  (void)a;
  interact_exit = true;
  return err_set(ERR_QUIT, "quit");
}

/* Reads one entry at `interact`'s prompts (">>> ", then "... "), lines
 * grouped as the REPL groups them; shm_malloc'd, or NULL at end of input
 * with nothing typed. */
static char *interact_entry(void) {
  char *text = NULL;
  size_t len = 0;
  bool block = false;
  const char *prompt = ">>> ";
  for (;;) {
    char *line = read_command(prompt);
    if (!line) return text;
    size_t n = strlen(line);
    char *t = shm_realloc(text, len + n + 2);
    if (!t) {
      free(line);
      return text;
    }
    text = t;
    memcpy(text + len, line, n);
    len += n;
    text[len++] = '\n';
    text[len] = '\0';
    bool more = repl_entry_goes_on(text, line, &block);
    free(line);
    if (!more) return text;
    prompt = "... ";
  }
}

/* Runs entries in [ns] until end of input or exit(); an error is printed
 * as the REPL prints it, on stdout with the rest of the session (as
 * pdb's interact writes its tracebacks through the debugger's output). */
static void interact_loop(const Stop *st, Env *ns) {
  interact_exit = false;
  char *text;
  while (!interact_exit && (text = interact_entry())) {
    Source *src = src_new("<stdin>", text);
    shm_free(text);
    DevCtx dc, *saved = enter_device(st, st_rank_of(st, st->level), &dc);
    int rc = src ? eval_source(src, ns, true) : -1;
    dev_ctx_set(saved);
    src_decref(src);
    if (rc < 0 && !(interact_exit && err_kind() == ERR_QUIT)) {
      fflush(stdout);
      err_print(stdout);
    }
    err_clear();
    fflush(stdout);
  }
}

/* pdb's interact: an interactive interpreter whose namespace is a new
 * scope inside the current frame's, so it reads the frame's locals and
 * globals while its assignments stay its own (pdb works on a copy). */
static int cmd_interact(Stop *st, const char *arg, Resume *r) {
  (void)arg, (void)r;
  const View *v = st_cur(st);
  if (!v) return printf("*** no frame to run in\n"), 0;
  Env *ns = env_new(v->env);
  if (!ns || builtins_add(ns, "exit", bi_interact_exit, "exit(): leave interact") < 0 ||
      builtins_add(ns, "quit", bi_interact_exit, "quit(): leave interact") < 0) {
    if (ns) env_decref(ns);
    return print_error(), 0;
  }
  printf("*pdb interact start*\n");
  interact_loop(st, ns);
  printf("*exit from pdb interact command*\n");
  env_release_scope(ns);
  return 0;
}

/* ---- devices ---- */

static int cmd_devices(Stop *st, const char *arg, Resume *r) {
  (void)arg, (void)r;
  char c[160], s[320];
  if (!st->mesh) return printf("*** not stopped inside a shard_map body\n"), 0;
  for (int i = 0; i < st->ndev; i++) {
    device_state(st, i, s, sizeof s);
    printf("%c %d %s  %s\n", i == dbg.focus ? '*' : ' ', i, coords_of(st, i, c, sizeof c), s);
  }
  return 0;
}

static int cmd_dev(Stop *st, const char *arg, Resume *r) {
  (void)r;
  char c[160];
  if (!st->mesh) return printf("*** not stopped inside a shard_map body\n"), 0;
  if (!*arg) return printf("device %d %s\n", dbg.focus, coords_of(st, dbg.focus, c, sizeof c)), 0;
  int rank = parse_rank(st, arg);
  if (rank < 0) return 0;
  dbg.focus = rank;
  st->level = st_nframes(st) - 1;
  st->list_next = 0;
  print_location(st);
  return 0;
}

/* ---- help ---- */

static int cmd_help(Stop *st, const char *arg, Resume *r);

static const Cmd commands[] = {
    {"h help", cmd_help, "h(elp) [command]", "List the commands, or say what one does."},
    {"w where bt", cmd_where, "w(here)",
     "Print the stack, oldest frame first; '>' marks the current frame."},
    {"d down", cmd_down, "d(own) [count]", "Move the current frame count levels down (newer)."},
    {"u up", cmd_up, "u(p) [count]", "Move the current frame count levels up (older)."},
    {"b break", cmd_break, "b(reak) [([file:]line | function) [, condition]]",
     "Set a breakpoint; without argument, list the breakpoints.  In a shard_map body the\n"
     "condition is evaluated on each device; the first device meeting it stops all."},
    {"tbreak", cmd_tbreak, "tbreak [([file:]line | function) [, condition]]",
     "Set a temporary breakpoint, deleted when first hit."},
    {"condition", cmd_condition, "condition bpnumber [condition]",
     "Set a new condition for the breakpoint, or without one make it unconditional."},
    {"whatis", cmd_whatis, "whatis expression", "Print the type of the expression's value."},
    {"cl clear", cmd_clear, "cl(ear) [number ... | file:line]",
     "Delete breakpoints; without argument, all of them (after asking)."},
    {"disable", cmd_disable, "disable number ...", "Disable breakpoints."},
    {"enable", cmd_enable, "enable number ...", "Enable breakpoints."},
    {"ignore", cmd_ignore, "ignore bpnumber [count]",
     "Pass over the breakpoint's next count crossings (those where its condition\n"
     "holds); without count, or 0, stop at it again.  In a shard_map body each\n"
     "device's crossing counts."},
    {"commands", cmd_commands, "commands [bpnumber]",
     "Read commands, one a line up to 'end', to run as if typed when the breakpoint (by\n"
     "default the last one set) stops; 'silent' first hides the stop's location.  A\n"
     "resuming command (c, s, n, r, unt, q, j) ends the list, and the program goes on\n"
     "after it.  An empty list removes the breakpoint's commands.  In a shard_map body\n"
     "they run once per stop, on the focused device."},
    {"j jump", cmd_jump, "j(ump) lineno",
     "Make the statement at lineno the next one to run in the bottom frame.  It must\n"
     "be a statement of the current statement's block: a jump neither enters nor\n"
     "leaves a block.  In a shard_map body every device jumps; all must be stopped\n"
     "at the focused device's statement."},
    {"s step", cmd_step, "s(tep)",
     "Run the current statement and stop at the next one, inside a called function if\n"
     "any, or where a function is about to return (--Return--).  In a shard_map body\n"
     "every device moves one statement."},
    {"n next", cmd_next, "n(ext)",
     "Run until the next statement of the current function, or until it is about to\n"
     "return (--Return--)."},
    {"unt until", cmd_until, "unt(il) [line]",
     "Run until a line greater than the current one (or at least line) is reached in\n"
     "the current frame, or until it is about to return (--Return--)."},
    {"r return", cmd_return, "r(eturn)",
     "Run until the current function is about to return, and stop there (--Return--)."},
    {"retval rv", cmd_retval, "retval [@ all]",
     "At a --Return-- stop, print the value the function returns; with '@ all', each\n"
     "device's.  Elsewhere: '*** Not yet returned!'."},
    {"c cont continue", cmd_continue, "c(ont(inue))", "Run until a breakpoint is hit."},
    {"l list", cmd_list, "l(ist) [first[, last] | .]",
     "List 11 lines around the current line, or go on listing; with arguments, the\n"
     "lines given (a last smaller than first is a count)."},
    {"ll longlist", cmd_longlist, "ll | longlist", "List the whole current function."},
    {"a args", cmd_args, "a(rgs)", "Print the arguments of the current function."},
    {"p", cmd_p, "p expression [@ all]",
     "Print the value of expression in the current frame; with '@ all', on every device\n"
     "of the shard_map body, each line prefixed by the device's mesh coordinates.  An\n"
     "expression that calls a collective runs on every device at once."},
    {"pp", cmd_pp, "pp expression [@ all]", "Like p, a long tuple or list one item per line."},
    {"display", cmd_display, "display [expression]",
     "Show the value of expression now and at each stop where it changed; without\n"
     "argument, list the displayed expressions."},
    {"undisplay", cmd_undisplay, "undisplay [expression]",
     "Stop displaying expression; without argument, all of them."},
    {"dev", cmd_dev, "dev [number | (coordinates)]",
     "Focus on another device of the shard_map body: a device number (row-major) or\n"
     "mesh coordinates such as (1, 0)."},
    {"devices", cmd_devices, "devices",
     "List the devices: where each stopped, or the collective it waits in; '*' marks\n"
     "the focused one."},
    {"restart run", cmd_restart, "restart [args ...]",
     "Restart the program from its beginning, stopping before its first statement;\n"
     "breakpoints and displays are kept.  With args, they become argv[1:] (split at\n"
     "blanks).  Not available at the interactive prompt.  \"run\" is an alias."},
    {"interact", cmd_interact, "interact",
     "Start an interactive interpreter (prompts '>>> ' and '... ') whose names are the\n"
     "current frame's locals and globals; its assignments do not change the frame.\n"
     "End it with end of input (Ctrl-D) or exit().  In a shard_map body it runs on\n"
     "the focused device."},
    {"q quit exit", cmd_quit, "q(uit)", "Quit: the program stops."},
};

static int cmd_help(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)r;
  if (*arg) {
    const Cmd *c = cmd_lookup(arg);
    if (!c) return printf("*** No help for '%s'\n", arg), 0;
    printf("%s\n%s\n", c->usage, c->help);
    return 0;
  }
  printf("Commands (type help <command>):\n");
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
    printf("  %s\n", commands[i].usage);
  printf("Anything else runs as statements in the current frame ('!' forces that); in a\n"
         "shard_map body, a line that calls a collective runs on every device.\n"
         "An empty line repeats the last command.\n");
  return 0;
}

static void comp_commands(void) {
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
    const char *p = commands[i].names;
    while (*p) {
      size_t k = strcspn(p, " ");
      char w[32];
      snprintf(w, sizeof w, "%.*s", (int)k, p);
      comp_add(w, NULL, NULL);
      p += k;
      while (*p == ' ') p++;
    }
  }
}

static const Cmd *cmd_lookup(const char *word) {
  size_t n = strlen(word);
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
    const char *p = commands[i].names;
    while (*p) {
      size_t k = strcspn(p, " ");
      if (k == n && strncmp(p, word, n) == 0) return &commands[i];
      p += k;
      while (*p == ' ') p++;
    }
  }
  return NULL;
}

/* Runs one command line; 1 when the program resumes (*r set). */
static int dispatch(Stop *st, const char *line, Resume *r) {
  while (*line == ' ' || *line == '\t') line++;
  if (*line == '!') {
    exec_in(st, line + 1);
    return 0;
  }
  char word[32];
  size_t n = first_word(line, word, sizeof word);
  const Cmd *c = n ? cmd_lookup(word) : NULL;
  if (!c) {
    exec_in(st, line);
    return 0;
  }
  char *arg = shm_strdup(line + n);
  if (!arg) return 0;
  trim(arg);
  int go = c->fn(st, arg, r);
  shm_free(arg);
  return go;
}

/* ==== stops ============================================================================ */

/* Reads and runs commands until one resumes the program (*r set) or the
 * input ends (*r left as it is). */
static void prompt_loop(Stop *st, Resume *r) {
  char prompt[256];
  for (;;) {
    make_prompt(st, prompt, sizeof prompt);
    char *line = read_command(prompt);
    if (!line) {   /* end of input: quit, as pdb does, and say why (its BdbQuit) */
      fflush(stdout);
      fprintf(stderr, "\nshmap: quit: end of input at the debugger's prompt (BdbQuit)\n");
      break;
    }
    if (strspn(line, " \t") == strlen(line) && dbg.last_cmd) {
      free(line);
      line = strdup(dbg.last_cmd);
      if (!line) continue;
    } else if (line[0]) {
      shm_free(dbg.last_cmd);
      dbg.last_cmd = shm_strdup(line);
    }
    int go = line[0] ? dispatch(st, line, r) : 0;
    free(line);
    fflush(stdout);
    if (go) break;
  }
}

/* One stop: the breakpoint's commands if it has any (pdb's order: they
 * run, then the location shows unless `silent`), then the prompt unless
 * they resumed; returns the command that resumes. */
static Resume interact_prompt(Stop *st) {
  Resume r = {RM_QUIT, 0, 0};
  const Stop *outer = comp.stop;
  bool silent = false;
  tls_busy = true;
  comp.stop = st;
  int go = st->bp ? run_bp_commands(st, &r, &silent) : 0;
  const View *at = st_cur(st);
  if (!silent && at && at->retval) printf("--Return--\n");
  if (!silent) print_location(st);
  if (!go) {
    run_displays(st);
    prompt_loop(st, &r);
  }
  comp.stop = outer;
  tls_busy = false;
  tls_break_next = false;
  fflush(stdout);
  return r;
}

/* The prompt: Ctrl-C there is readline's (it abandons the line); once a
 * command resumes the program, Ctrl-C stops it again (take_interrupt). */
static Resume interact(Stop *st) {
  atomic_store(&shm_interrupt_to_debugger, 0);
  atomic_store(&shm_debugger_interrupted, 0);
  Resume r = interact_prompt(st);
  atomic_store(&shm_interrupted, 0);
  atomic_store(&shm_interrupt_to_debugger, r.mode != RM_QUIT);
  return r;
}

/* A stop of the main thread at frame [f], outside any shard_map call, at
 * breakpoint [bp] (0: not at a breakpoint); at [f]'s return event,
 * [retval] is the value it returns (borrowed), else NULL. */
static int stop_main(Frame *f, int bp, Value *retval) {
  atomic_store(&dbg.entered, true);
  Stop st = {.bp = bp, .frame = f};
  if (stack_from_frames(&st.main, f, 0) < 0) return 0;
  st.level = st.main.n - 1;
  if (st.main.n > 0) st.main.v[st.main.n - 1].retval = retval;
  Resume r = interact(&st);
  st_free(&st);
  if (r.mode == RM_QUIT) {
    dbg.main_resume = (Resume){RM_CONTINUE, 0, 0};
    update_engaged();
    return quit_error();
  }
  dbg.main_resume = r;
  update_engaged();
  f->jump = st.jump;
  return st.jump ? EVAL_HOOK_JUMP : 0;
}

/* Gathers the parked devices' frames, and those of the devices waiting in
 * a collective (their frames cannot unwind while they wait: every peer
 * that could release them is parked or waiting too), and writes out their
 * output (lock held: parked devices cannot move, done ones write nothing
 * more). */
static void collect_devices(DbgCall *c, Stop *st) {
  char buf[256];
  for (int r = 0; r < c->n; r++) {
    Slot *s = &c->slots[r];
    const Frame *cur = atomic_load_explicit(&s->current, memory_order_acquire);
    if (s->state == DS_PARKED) {
      stack_from_frames(&st->dev[r], s->frame, c->depth0);
      if (st->dev[r].n > 0) st->dev[r].v[st->dev[r].n - 1].retval = s->retval;
    } else if (s->state == DS_RUNNING && cur && coll_waiting_str(c->g, r, buf, sizeof buf))
      stack_from_frames(&st->dev[r], cur, c->depth0);
    if (s->state != DS_RUNNING) flush_device(c, r);
  }
  if (c->trigger >= 0) dbg.focus = c->trigger;
  if (dbg.focus >= c->n) dbg.focus = 0;
  for (int r = 0; c->slots[dbg.focus].state == DS_DONE && r < c->n; r++)
    if (c->slots[r].state == DS_PARKED) dbg.focus = r; /* a returned device shows nothing */
  st->bp = c->slots[dbg.focus].state == DS_PARKED ? c->slots[dbg.focus].bp : 0;
  fputs(c->notes, stdout);
  c->notes[0] = 0;
  c->jump_from = c->jump_to = NULL;   /* every device has taken it by now */
}

/* A stop of the devices of call [c] (every one parked, done or waiting
 * in a collective); returns the command that resumes them. */
static Resume stop_devices(DbgCall *c) {
  atomic_store(&dbg.entered, true);
  Stop st = {0};
  st.call = c;
  st.mesh = &c->mesh;
  st.ndev = c->n;
  st.dev = shm_calloc((size_t)c->n, sizeof(Stack));
  if (!st.dev || stack_from_frames(&st.main, eval_current_frame(), 0) < 0) {
    st_free(&st);
    return (Resume){RM_CONTINUE, 0, 0};
  }
  pthread_mutex_lock(&dbg.lock);
  collect_devices(c, &st);
  pthread_mutex_unlock(&dbg.lock);
  st.level = st_nframes(&st) - 1;
  Resume r = interact(&st);
  if (st.jump && r.mode != RM_QUIT) {   /* cmd_jump saw every device parked there */
    pthread_mutex_lock(&dbg.lock);
    c->jump_from = c->slots[dbg.focus].frame->stmt;
    c->jump_to = st.jump;
    pthread_mutex_unlock(&dbg.lock);
  }
  st_free(&st);
  return r;
}

/* ==== post-mortem ====================================================================== */

/* The device an error message names ("on device (i=1, j=0): ..."), or -1. */
static int pm_rank(const char *msg) {
  const PmRecord *pm = &dbg.pm;
  char c[160];
  if (strncmp(msg, "on device ", 10) != 0) return -1;
  for (int r = 0; r < pm->n; r++) {
    size_t k = strlen(dev_mesh_coords_str(&pm->mesh, r, c, sizeof c));
    if (strncmp(msg + 10, c, k) == 0 && msg[10 + k] == ':') return r;
  }
  return -1;
}

static void pm_record_free(void) {
  for (int r = 0; r < dbg.pm.n; r++) stack_free(&dbg.pm.stacks[r]);
  shm_free(dbg.pm.stacks);
  memset(&dbg.pm, 0, sizeof dbg.pm);
}

/* Fills [st] with the kept frames: the main thread's, and the devices'
 * when device [rank] raised the error. */
static int pm_stop(Stop *st, int rank, Loc loc) {
  if (stack_append(&st->main, &tls_snap.views) < 0) return -1;
  if (rank < 0) {
    stack_trim_to(&st->main, loc);
    st->level = st->main.n - 1;
    return 0;
  }
  st->mesh = &dbg.pm.mesh;
  st->ndev = dbg.pm.n;
  if (!(st->dev = shm_calloc((size_t)st->ndev, sizeof(Stack)))) return -1;
  for (int r = 0; r < st->ndev; r++)
    if (stack_append(&st->dev[r], &dbg.pm.stacks[r]) < 0) return -1;
  stack_trim_to(&st->dev[rank], loc);
  dbg.focus = rank;
  st->level = st_nframes(st) - 1;
  return 0;
}

void dbg_post_mortem(void) {
  if (!dbg.installed || !dbg.post_mortem || !err_occurred() || err_kind() == ERR_QUIT) return;
  Loc loc = err_loc();
  Stop st = {0};
  st.pm = true;
  int rank = pm_rank(err_message());
  if (pm_stop(&st, rank, loc) == 0 && st_nframes(&st) > 0) {
    fflush(stdout);
    err_print(stderr);
    err_clear();
    printf("Uncaught error. Entering post mortem debugging\n");
    interact(&st);
    err_set(ERR_QUIT, "quit"); /* printed already: the caller's report is silent */
  }
  st_free(&st);
  fflush(stdout);
}

/* ---- pm(): the last uncaught error ---- */

/* Appends a view of kept frame [sc] to [s]. */
static int stack_push_scope(Stack *s, const ErrScope *sc) {
  if (stack_reserve(s, s->n + 1) < 0) return -1;
  src_incref(sc->loc.src);
  env_incref(sc->scope);
  s->v[s->n] = (View){sc->loc.src, sc->loc.line, sc->loc.line, s->n + 1, sc->fname, sc->scope,
                      NULL};
  s->n++;
  return 0;
}

/* Fills [st] with the frames [e] kept, outermost first: [catcher] (the
 * frame of an `except` handling it, or NULL), the main thread's, then
 * those of the device that raised it when [mesh] says where that device
 * is (else they count as the main thread's). */
static int pm_stop_from(Stop *st, const ErrState *e, const MeshDesc *mesh,
                        const ErrScope *catcher) {
  int rank = -1;
  if (catcher && stack_push_scope(&st->main, catcher) < 0) return -1;
  for (int i = 0; i < e->nscopes; i++)
    if (mesh && e->scopes[i].tag > 0 && e->scopes[i].tag <= mesh->ndevices) rank = e->scopes[i].tag - 1;
  if (rank >= 0) {
    st->mesh = mesh;
    st->ndev = mesh->ndevices;
    if (!(st->dev = shm_calloc((size_t)st->ndev, sizeof(Stack)))) return -1;
    dbg.focus = rank;
  }
  for (int i = e->nscopes - 1; i >= 0; i--) {
    const ErrScope *sc = &e->scopes[i];
    bool on_dev = rank >= 0 && sc->tag == rank + 1;
    if (stack_push_scope(on_dev ? &st->dev[rank] : &st->main, sc) < 0) return -1;
  }
  st->pm = st->raiser_only = true;
  st->level = st_nframes(st) - 1;
  return 0;
}

/* Post-mortem on [e] from a built-in (pm(), pdb.post_mortem()): the
 * prompt at the frame where it was raised.  None, or NULL with ERR_QUIT
 * when `restart` ends the program. */
static Value *pm_enter(const ErrState *e, const MeshDesc *mesh, const ErrScope *catcher) {
  Stop st = {0};
  if (pm_stop_from(&st, e, mesh, catcher) < 0 || st_nframes(&st) == 0) {
    st_free(&st);
    return err_nomem();
  }
  int to_debugger = atomic_load(&shm_interrupt_to_debugger);
  interact(&st);
  atomic_store(&shm_interrupt_to_debugger, to_debugger);   /* as before: pm() does not stop later */
  st_free(&st);
  fflush(stdout);
  if (dbg.restart) return err_set(ERR_QUIT, "quit"), NULL;
  return val_incref(VAL_NONE);
}

/* True, with the error set, when pm() or post_mortem() cannot run here. */
static bool pm_refused(const char *name, const CallArgs *a) {
  if (a->nargs || a->nkw) err_set(ERR_TYPE, "%s() takes no arguments", name);
  else if (dev_on_device_thread()) err_set(ERR_VALUE, "%s() cannot run inside a shard_map body", name);
  else if (tls_busy) err_set(ERR_VALUE, "%s() cannot run inside the debugger", name);
  return err_occurred();
}

/* pdb's error when there is no error to debug. */
static void *no_traceback(void) {
  return err_set(ERR_VALUE, "ValueError: A valid traceback must be passed if no exception is "
                            "being handled");
}

/* pm(), pdb.pm(): post-mortem on the last uncaught error of the session
 * (Python's sys.last_traceback). */
static Value *bi_pm(const CallArgs *a) {
  if (pm_refused("pm", a)) return NULL;
  if (dbg.last.kind == ERR_NONE) return no_traceback();
  return pm_enter(&dbg.last, dbg.last_has_mesh ? &dbg.last_mesh : NULL, NULL);
}

/* pdb.post_mortem(): inside an `except` block the error it handles, as
 * pdb's, from the frame that catches it (at the line the error passed
 * through: the outermost calling line of its traceback, else where it
 * was raised) down; elsewhere the last uncaught one, as pm(). */
static Value *bi_post_mortem(const CallArgs *a) {
  if (pm_refused("post_mortem", a)) return NULL;
  const ErrState *h = eval_handled_error();
  if (!h) return bi_pm(a);
  bool dev = false;
  for (int i = 0; i < h->nscopes; i++) dev = dev || h->scopes[i].tag > 0;
  const Frame *f = eval_current_frame();
  ErrScope catcher = {h->ntrace ? h->trace[h->ntrace - 1].loc : h->loc, f ? f->fname : "?",
                      f ? f->env : NULL, 0};
  bool ok = f && catcher.loc.src && catcher.scope;
  return pm_enter(h, dev && dbg.fail_has_mesh ? &dbg.fail_mesh : NULL, ok ? &catcher : NULL);
}

void dbg_keep_error(void) {
  if (!err_occurred() || err_kind() == ERR_QUIT) {
    err_clear();
    return;
  }
  ErrState old = dbg.last;
  err_save(&dbg.last);
  bool dev = false;
  for (int i = 0; i < dbg.last.nscopes; i++) dev = dev || dbg.last.scopes[i].tag > 0;
  dbg.last_has_mesh = dev && dbg.fail_has_mesh;
  dbg.last_mesh = dbg.fail_mesh;
  err_state_free(&old);   /* after: its scopes may hold what the new one shows */
}

/* ==== the built-ins ====================================================================== */

/*
 * breakpoint() under jit, as jax.debug.breakpoint: tracing stages a
 * debug_callback whose operands are the traced locals of the frame; when
 * the plan runs, the callback stops with their concrete values in a frame
 * made for the purpose (a Site: where breakpoint() was called).
 */
typedef struct Site {
  Opaque base;
  Node node;            /* an N_PASS at the call's location (src counted) */
  const char *fname;    /* interned or static */
} Site;

static void site_free(Value *v) { src_decref(((Site *)v)->node.loc.src); }
static const OpaqueType site_type = {"breakpoint site", site_free, NULL, NULL, NULL, NULL, NULL};

static Value *site_new(const Frame *f) {
  Site *s = shm_calloc(1, sizeof *s);
  if (!s) return err_nomem();
  val_init(&s->base.hdr, V_OPAQUE);
  s->base.ot = &site_type;
  s->node.kind = N_PASS;
  s->node.loc = s->node.loc2 = f->stmt->loc;
  src_incref(f->stmt->loc.src);
  s->fname = f->fname;
  return &s->base.hdr;
}

/* Stops this thread at the made-up frame [fr], as the hook would stop at
 * a breakpoint there. */
static int stop_at(Frame *fr) {
  if (!dev_on_device_thread()) return tls_busy ? 0 : stop_main(fr, 0, NULL);
  DbgCall *c = atomic_load_explicit(&dbg.call, memory_order_acquire);
  DevCtx *ctx = dev_ctx();
  if (!c || !ctx || ctx->rank >= c->n) return 0;
  return device_park(c, ctx->rank, fr, c->depth0 + frame_depth(fr), PARK_BREAK, 0, "", NULL);
}

/* The staged callback of breakpoint(): self is (site, names, template,
 * traced); binds each name to its concrete value and stops. */
static Value *breakpoint_callback(Value *self, const CallArgs *a) {
  Site *site = (Site *)tuple_get(self, 0);
  Value *names = tuple_get(self, 1), *tmpl = tuple_get(self, 2), *traced = tuple_get(self, 3);
  Env *e = env_new(NULL);
  if (!e) return NULL;
  int k = 0;
  for (size_t i = 0; i < tuple_len(names); i++) {
    bool t = tuple_get(traced, i) == val_true();
    Value *v = t && k < a->nargs ? a->args[k++] : tuple_get(tmpl, i);
    if (env_set(e, intern_cstr(str_cstr(tuple_get(names, i))), v) < 0) break;
  }
  Frame fr = {.back = eval_current_frame(), .fname = site->fname, .env = e, .stmt = &site->node};
  int rc = err_occurred() ? -1 : stop_at(&fr);
  env_decref(e);
  return rc < 0 ? NULL : val_incref(VAL_NONE);
}

typedef struct Locals {
  Value *names, *tmpl, *traced;   /* lists */
  Value **ops;                     /* the traced values (borrowed) */
  int nops, cap;
  bool failed;
} Locals;

static void collect_local(const char *name, Value *v, void *ctx) {
  Locals *l = ctx;
  bool t = v->type == V_TRACER;
  Value *s = str_from(name);
  if (!s || list_append_steal(l->names, s) < 0 ||
      list_append(l->tmpl, t ? VAL_NONE : v) < 0 || list_append(l->traced, val_bool(t)) < 0)
    l->failed = true;
  if (!t || l->failed) return;
  if (l->nops == l->cap) {
    Value **ops = shm_realloc(l->ops, sizeof(Value *) * (size_t)(l->cap = l->cap * 2 + 8));
    if (!ops) return (void)(l->failed = true);
    l->ops = ops;
  }
  l->ops[l->nops++] = v;
}

/* The callback value for a breakpoint() staged in frame [f]. */
static Value *breakpoint_cb(const Frame *f, Locals *l) {
  Value *site = site_new(f);
  Value *items[4] = {site, NULL, NULL, NULL};
  Value *self = NULL;
  if (site && (items[1] = tuple_pack(list_len(l->names), ((List *)l->names)->items)) &&
      (items[2] = tuple_pack(list_len(l->tmpl), ((List *)l->tmpl)->items)) &&
      (items[3] = tuple_pack(list_len(l->traced), ((List *)l->traced)->items)))
    self = tuple_pack(4, items);
  for (int i = 0; i < 4; i++) val_decref(items[i]);
  Value *cb = self ? bound_new("breakpoint", breakpoint_callback, self) : NULL;
  val_decref(self);
  return cb;
}

static Value *stage_breakpoint(void) {
  const Frame *f = eval_current_frame();
  if (!f || !f->stmt || !f->stmt->loc.src) return val_incref(VAL_NONE);
  Locals l = {list_new(0), list_new(0), list_new(0), NULL, 0, 0, false};
  Value *r = NULL;
  if (l.names && l.tmpl && l.traced) env_each(f->env, collect_local, &l);
  Value *cb = l.failed || !l.traced ? err_nomem() : breakpoint_cb(f, &l);
  Params p;
  params_init(&p);
  if (cb && params_add(&p, "callback", cb) == 0)
    r = trace_emit(P_DEBUG_CALLBACK, &p, l.nops, l.ops, 0, NULL);
  params_clear(&p);
  val_decref(r);
  val_decref(l.names);
  val_decref(l.tmpl);
  val_decref(l.traced);
  shm_free(l.ops);
  return r ? val_incref(VAL_NONE) : NULL;
}

/* breakpoint(): stop at the next statement of this thread (all devices
 * stop with it inside a shard_map body); under jit, when the plan runs. */
static Value *bi_breakpoint(const CallArgs *a) {
  if (a->nargs || a->nkw) return err_set(ERR_TYPE, "breakpoint() takes no arguments");
  if (!dbg.installed) return val_incref(VAL_NONE);
  if (trace_current()) return stage_breakpoint();
  tls_break_next = true;
  return val_incref(VAL_NONE);
}

/* Formats and writes one debug_print line: print(fmt.format(*args, **kw)). */
static Value *print_formatted(Value *fmt, const CallArgs *rest) {
  Value *method = ops_getattr(fmt, "format");
  Value *s = method ? val_call(method, rest) : NULL;
  val_decref(method);
  if (!s) return NULL;
  if (s->type == V_STR) {
    eval_write(str_cstr(s), ((Str *)s)->len);
    eval_write("\n", 1);
  }
  val_decref(s);
  return val_incref(VAL_NONE);
}

/* The staged callback: self is (fmt, template, traced, kwnames); the
 * template holds the positional values then the keyword ones, and the
 * concrete values of the traced ones (the callback's operands, in order)
 * replace their places. */
static Value *debug_print_callback(Value *self, const CallArgs *a) {
  Value *fmt = tuple_get(self, 0), *tmpl = tuple_get(self, 1), *traced = tuple_get(self, 2);
  Value *kwn = tuple_get(self, 3);
  size_t n = tuple_len(tmpl), nk = tuple_len(kwn);
  Value **vals = shm_calloc(n + 1, sizeof(Value *));
  const char **names = shm_calloc(nk + 1, sizeof(char *));
  if (!vals || !names) {
    shm_free(vals);
    shm_free(names);
    return err_nomem();
  }
  int k = 0;
  for (size_t i = 0; i < n; i++) {
    bool t = tuple_get(traced, i) == val_true();
    vals[i] = t && k < a->nargs ? a->args[k++] : tuple_get(tmpl, i);
  }
  for (size_t i = 0; i < nk; i++) names[i] = str_cstr(tuple_get(kwn, i));
  CallArgs rest = {.nargs = (int)(n - nk), .args = vals, .nkw = (int)nk, .kwnames = names,
                   .kwvals = vals + (n - nk)};
  Value *r = print_formatted(fmt, &rest);
  shm_free(vals);
  shm_free(names);
  return r;
}

/* Appends value [v] of a debug_print call to the template: a traced one as
 * an operand of the callback (its place None), any other as it is. */
static void template_put(Value *tmpl, Value *traced, size_t i, Value *v, Value **ops, int *nops) {
  bool t = v->type == V_TRACER;
  tuple_set_steal(tmpl, i, val_incref(t ? VAL_NONE : v));
  tuple_set_steal(traced, i, val_incref(val_bool(t)));
  if (t) ops[(*nops)++] = v;
}

/* debug_print under jit: stages debug_callback with the traced arguments,
 * positional and keyword, as operands (debug.h), through trace_emit as its
 * outputs (none) need no shape rule; the values print when the plan runs,
 * one line per device inside shard_map. */
static Value *stage_debug_print(const CallArgs *a) {
  if (!trace_current())
    return err_set(ERR_VALUE, "debug_print: a traced value escaped from the jit function "
                              "that made it");
  int n = a->nargs - 1 + a->nkw, nops = 0;
  Value *tmpl = tuple_new((size_t)n), *traced = tuple_new((size_t)n);
  Value *kwn = tuple_new((size_t)a->nkw);
  Value **ops = shm_calloc((size_t)n + 1, sizeof(Value *));
  Value *r = NULL;
  if (!tmpl || !traced || !kwn || !ops) goto out;
  for (int i = 0; i < a->nargs - 1; i++)
    template_put(tmpl, traced, (size_t)i, a->args[i + 1], ops, &nops);
  for (int k = 0; k < a->nkw; k++) {
    template_put(tmpl, traced, (size_t)(a->nargs - 1 + k), a->kwvals[k], ops, &nops);
    tuple_set_steal(kwn, (size_t)k, str_from(a->kwnames[k]));
  }
  Value *items[4] = {a->args[0], tmpl, traced, kwn};
  Value *self = tuple_pack(4, items);
  Value *cb = self ? bound_new("debug_print", debug_print_callback, self) : NULL;
  val_decref(self);
  Params p;
  params_init(&p);
  if (cb && params_add(&p, "callback", cb) == 0)
    r = trace_emit(P_DEBUG_CALLBACK, &p, nops, ops, 0, NULL);
  params_clear(&p);
  if (r) {
    val_decref(r);
    r = val_incref(VAL_NONE);
  }
out:
  val_decref(tmpl);
  val_decref(traced);
  val_decref(kwn);
  shm_free(ops);
  return r;
}

/* debug_print(fmt, *args, **kwargs): print(fmt.format(*args, **kwargs)),
 * one line per device inside shard_map; staged under jit when any value,
 * positional or keyword, is traced. */
static Value *bi_debug_print(const CallArgs *a) {
  if (a->nargs < 1 || a->args[0]->type != V_STR)
    return err_set(ERR_TYPE, "debug_print() needs a format string as its first argument");
  for (int i = 1; i < a->nargs; i++)
    if (a->args[i]->type == V_TRACER) return stage_debug_print(a);
  for (int k = 0; k < a->nkw; k++)
    if (a->kwvals[k]->type == V_TRACER) return stage_debug_print(a);
  CallArgs rest = {a->nargs - 1, a->args + 1, a->nkw, a->kwnames, a->kwvals};
  return print_formatted(a->args[0], &rest);
}

/* ==== set-up ================================================================================ */

#define PM_DOC "pm(): post-mortem debugging of the last uncaught error"

/* `jax.debug.print` and `jax.debug.breakpoint`, so JAX code ports line for
 * line (LANGUAGE.md §2's prefixes). */
static int add_jax_debug(Env *builtins) {
  Value *d = dict_new(), *m = NULL;
  int rc = -1;
  if (d && dict_set_str(d, "print", env_lookup(builtins, intern_cstr("debug_print"))) == 0 &&
      dict_set_str(d, "breakpoint", env_lookup(builtins, intern_cstr("breakpoint"))) == 0 &&
      (m = module_new("jax.debug", d)))
    rc = builtins_add_to("jax", "debug", m);
  val_decref(m);
  val_decref(d);
  return rc;
}

/* `import pdb`: pm, post_mortem and set_trace (breakpoint), registered as
 * an already loaded module so import finds it before any file. */
static int add_pdb(Env *builtins) {
  Value *d = dict_new(), *m = NULL, *pm = builtin_new("pm", bi_pm, PM_DOC);
  Value *post = builtin_new("post_mortem", bi_post_mortem,
                            "post_mortem(): post-mortem debugging of the error being handled, "
                            "else of the last uncaught one");
  int rc = -1;
  if (d && pm && post && dict_set_str(d, "pm", pm) == 0 && dict_set_str(d, "post_mortem", post) == 0 &&
      dict_set_str(d, "set_trace", env_lookup(builtins, intern_cstr("breakpoint"))) == 0 &&
      (m = module_new("pdb", d)))
    rc = dict_set_str(shm_interp->modules, "pdb", m);
  val_decref(m);
  val_decref(d);
  val_decref(pm);
  val_decref(post);
  return rc;
}

int dbg_init(Env *builtins, bool debug, bool post_mortem) {
  if (builtins_add(builtins, "breakpoint", bi_breakpoint,
                   "breakpoint(): enter the debugger at the next statement") < 0 ||
      builtins_add(builtins, "pm", bi_pm, PM_DOC) < 0 || add_pdb(builtins) < 0 ||
      builtins_add(builtins, "debug_print", bi_debug_print,
                   "debug_print(fmt, *args): print(fmt.format(*args)), per device, also under jit") < 0 ||
      add_jax_debug(builtins) < 0)
    return -1;
  dbg.post_mortem = post_mortem;
  dbg.main_resume = (Resume){debug ? RM_STEP : RM_CONTINUE, 0, 0};
  dbg.installed = true;
  update_engaged();
  eval_stmt_hook = dbg_hook;
  eval_return_hook = dbg_return_hook;
  shardmap_set_runner(dbg_coll_run);
  return 0;
}

void dbg_set_restartable(bool on) { dbg.restartable = on; }

bool dbg_take_restart(char **args) {
  *args = NULL;
  if (!dbg.restart) return false;
  dbg.restart = false;
  *args = dbg.restart_args;
  dbg.restart_args = NULL;
  dbg.main_resume = (Resume){RM_STEP, 0, 0};   /* pdb stops at the first line again */
  update_engaged();
  return true;
}

void dbg_restarted(Env *old_globals, Env *new_globals) {
  for (int i = 0; i < dbg.ndisplays; i++) {
    Display *d = &dbg.displays[i];
    if (d->dev || d->env[0] != old_globals) continue;   /* module level: the main thread's */
    env_incref(new_globals);
    env_decref(d->env[0]);
    d->env[0] = new_globals;
    shm_free(d->last[0]);   /* shown again at the first stop */
    d->last[0] = NULL;
  }
}

void dbg_free(void) {
  if (!dbg.installed) return;
  eval_stmt_hook = NULL;
  eval_return_hook = NULL;
  shardmap_set_runner(NULL);
  dbg.installed = false;
  helper_stop();
  pthread_mutex_lock(&dbg.lock);
  while (dbg.nbps) bp_delete(&dbg.bps[0]);
  shm_free(dbg.bps);
  dbg.bps = NULL;
  dbg.bpcap = 0;
  pthread_mutex_unlock(&dbg.lock);
  for (int i = 0; i < dbg.ndisplays; i++) display_free(&dbg.displays[i]);
  shm_free(dbg.displays);
  dbg.displays = NULL;
  dbg.ndisplays = 0;
  for (int i = 0; i < dbg.nbpcmds; i++) bpcmds_free_lines(&dbg.bpcmds[i]);
  shm_free(dbg.bpcmds);
  dbg.bpcmds = NULL;
  dbg.nbpcmds = 0;
  shm_free(dbg.last_cmd);
  dbg.last_cmd = NULL;
  shm_free(dbg.restart_args);
  dbg.restart_args = NULL;
  err_state_free(&dbg.last);
  dbg.last.kind = ERR_NONE;
  comp_clear();
  shm_free(comp.names);
  comp.names = NULL;
  comp.cap = 0;
  snap_free(&tls_snap);
  pm_record_free();
}
