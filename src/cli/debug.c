/*
 * debug.c - the pdb-like debugger (debug.h).
 *
 * Layout: frame views (what a stop shows, and the snapshots --pm keeps);
 * breakpoints; the statement hook and the decision to stop; the all-stop
 * of a shard_map call (dbg_coll_run, parking, release); reading commands;
 * stops; post-mortem; the built-ins; set-up.  The commands themselves are
 * in debug_cmd.c; the types both share, in debug_impl.h.
 *
 * A stop never shows a Frame directly: it copies the frames it needs into
 * Views (source, line, function name, scope; counted references), so a
 * device's frames can be shown from the main thread, and --pm can show
 * frames that have already returned.
 */
#include "cli/debug.h"
#include "cli/debug_impl.h"
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
#include "base/utf8.h"
#include "lang/ops.h"
#include "lang/parser.h"
#include "array/prim.h"
#include "array/print.h"
#include "transform/trace.h"


/* ==== views of frames ======================================================= */


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
int dbg_node_last_line(const Node *n) {
  if (!n) return 0;
  int m = n->loc.line > n->loc2.line ? n->loc.line : n->loc2.line;
  const Node *kids[3] = {n->a, n->b, n->c};
  for (int i = 0; i < 3; i++) {
    int l = dbg_node_last_line(kids[i]);
    if (l > m) m = l;
  }
  for (int i = 0; i < n->items.n; i++) {
    int l = dbg_node_last_line(n->items.items[i]);
    if (l > m) m = l;
  }
  for (int i = 0; n->kind == N_DICT && i < n->items2.n; i++) {   /* a try's is a block */
    int l = dbg_node_last_line(n->items2.items[i]);
    if (l > m) m = l;
  }
  for (int i = 0; n->kind == N_CALL && i < n->nkw; i++) {
    int l = dbg_node_last_line(n->kws[i].value);
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
  *v = (View){src, st->loc.line, dbg_node_last_line(st), depth, f->fname, f->env, NULL};
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

DbgState dbg_state = {.lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER,
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
static _Thread_local const char *tls_raised; /* stopping where this error was raised */
static _Thread_local bool tls_raise_seen;   /* the pending error's stop was made */

/* Recomputes dbg_state.engaged.  Main thread, or with dbg_state.lock held. */
void dbg_update_engaged(void) {
  DbgCall *c = atomic_load(&dbg_state.call);
  bool e = dbg_state.post_mortem || dbg_state.raised || dbg_state.main_resume.mode != RM_CONTINUE ||
           atomic_load(&dbg_state.nbp_enabled) > 0 ||
           (c && (atomic_load(&c->stop) || atomic_load(&c->quit) ||
                  c->cmd.mode != RM_CONTINUE));
  atomic_store_explicit(&dbg_state.engaged, e, memory_order_release);
  atomic_store_explicit(&eval_hook_all, e, memory_order_relaxed);
}

/* Engages the debugger on every thread at once (a Ctrl-C, a stop in a
 * body). */
static void engage(void) {
  atomic_store(&dbg_state.engaged, true);
  atomic_store_explicit(&eval_hook_all, true, memory_order_relaxed);
}

static int quit_error(void) {
  err_set(ERR_QUIT, "quit");
  return -1;
}

/* ==== breakpoints ================================================================ */

/* True when breakpoint file [bp] names source [name]: the same path, or
 * one is the other's tail after a '/'. */
bool dbg_file_matches(const char *bp, const char *name) {
  size_t a = strlen(bp), b = strlen(name);
  if (a == b) return strcmp(bp, name) == 0;
  const char *lng = a > b ? bp : name, *shrt = a > b ? name : bp;
  size_t d = a > b ? a - b : b - a;
  return lng[d - 1] == '/' && strcmp(lng + d, shrt) == 0;
}

Bp *dbg_bp_find(int number) {
  for (int i = 0; i < dbg_state.nbps; i++)
    if (dbg_state.bps[i].number == number) return &dbg_state.bps[i];
  return NULL;
}

/* Removes breakpoint [b] (lock held). */
void dbg_bp_delete(Bp *b) {
  if (b->enabled) atomic_fetch_sub(&dbg_state.nbp_enabled, 1);
  shm_free(b->file);
  shm_free(b->cond);
  shm_free(b->crossed);
  shm_free(b->verdicts);
  shm_free(b->hit_cond);
  shm_free(b->log);
  int i = (int)(b - dbg_state.bps);
  memmove(b, b + 1, sizeof(Bp) * (size_t)(dbg_state.nbps - i - 1));
  dbg_state.nbps--;
}

/* A copy of [s], or NULL when it is NULL or empty. */
static char *dup_or_null(const char *s) { return s && *s ? shm_strdup(s) : NULL; }

int dbg_bp_insert(const char *file, int line, const char *cond, const char *hit_cond,
                  const char *log, bool temporary) {
  int number = 0;
  pthread_mutex_lock(&dbg_state.lock);
  Bp *bps = dbg_state.bps;
  if (dbg_state.nbps == dbg_state.bpcap &&
      (bps = shm_realloc(bps, sizeof(Bp) * (size_t)(dbg_state.bpcap * 2 + 4))))
    dbg_state.bpcap = dbg_state.bpcap * 2 + 4;
  if (bps) {
    dbg_state.bps = bps;
    Bp *b = &bps[dbg_state.nbps++];
    *b = (Bp){.number = ++dbg_state.next_bp, .file = shm_strdup(file), .line = line,
              .cond = dup_or_null(cond), .temporary = temporary, .enabled = true,
              .hit_cond = dup_or_null(hit_cond), .log = dup_or_null(log)};
    number = b->number;
    atomic_fetch_add(&dbg_state.nbp_enabled, 1);
  }
  pthread_mutex_unlock(&dbg_state.lock);
  if (number) engage();   /* what dbg_update_engaged would say, from any thread */
  return number;
}

int dbg_hit_matches(const char *hit, int hits) {
  static const char *const ops[] = {">=", "<=", "==", ">", "<", "%", ""};
  while (*hit == ' ') hit++;
  int k = 0;
  while (strncmp(hit, ops[k], strlen(ops[k])) != 0) k++;
  const char *p = hit + strlen(ops[k]);
  char *end;
  long n = strtol(p, &end, 10);
  bool digits = end != p;
  while (*end == ' ') end++;
  if (!digits || *end || n < 0 || n > INT_MAX || (k == 5 && n == 0)) return -1;
  switch (k) {
  case 0: return hits >= n;
  case 1: return hits <= n;
  case 3: return hits > n;
  case 4: return hits < n;
  case 5: return hits % n == 0;
  default: return hits == n;
  }
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

/* A log point's message with each {expr} replaced by str(expr) evaluated
 * in [env] ("{{" and "}}" are braces), written as a line of print output:
 * on a device, to its buffer, shown with its coordinates.  A failing
 * expression shows as <error: message>. */
static void log_point(const char *msg, Env *env) {
  bool saved = tls_busy;
  DevCtx *ctx = dev_ctx(), alone;
  if (ctx) {   /* as cond_value: no group, so no collective can wait here */
    alone = *ctx;
    alone.group = NULL;
    dev_ctx_set(&alone);
  }
  tls_busy = true;
  for (const char *p = msg; *p;) {
    const char *close = *p == '{' && p[1] != '{' ? strchr(p, '}') : NULL;
    if (!close) {
      bool twice = (*p == '{' || *p == '}') && p[1] == *p;
      eval_write(p, 1);
      p += twice ? 2 : 1;
      continue;
    }
    char expr[DBG_BP_TEXT_MAX];
    snprintf(expr, sizeof expr, "%.*s", (int)(close - p - 1), p + 1);
    Value *v = eval_expr_text(expr, env), *t = v ? val_str(v) : NULL;
    if (t) eval_write(str_cstr(t), ((Str *)t)->len);
    else {
      eval_write("<error: ", 8);
      eval_write(err_message(), strlen(err_message()));
      eval_write(">", 1);
    }
    err_clear();
    val_decref(v);
    val_decref(t);
    p = close + 1;
  }
  eval_write("\n", 1);
  tls_busy = saved;
  dev_ctx_set(ctx);
}

typedef struct Candidate {
  int number;
  char cond[DBG_BP_TEXT_MAX];
  bool has_cond;
  char log[DBG_BP_TEXT_MAX];   /* a log point's message */
  bool has_log;
} Candidate;

/* The enabled breakpoints at [stmt] (lock taken here). */
static int bp_candidates(const Node *stmt, Candidate *out) {
  int n = 0;
  const char *name = stmt->loc.src->name;
  pthread_mutex_lock(&dbg_state.lock);
  for (int i = 0; i < dbg_state.nbps && n < DBG_MAX_CANDIDATES; i++) {
    const Bp *b = &dbg_state.bps[i];
    if (!b->enabled || b->line != stmt->loc.line || !dbg_file_matches(b->file, name)) continue;
    out[n].number = b->number;
    out[n].has_cond = b->cond != NULL;
    snprintf(out[n].cond, sizeof out[n].cond, "%s", b->cond ? b->cond : "");
    out[n].has_log = b->log != NULL;
    snprintf(out[n].log, sizeof out[n].log, "%s", b->log ? b->log : "");
    n++;
  }
  pthread_mutex_unlock(&dbg_state.lock);
  return n;
}

/* The flags of the crossing device [rank] of a call of [n] devices makes
 * of [b] now (lock held), or NULL out of memory. */
static unsigned char *bp_device_crossing(Bp *b, int rank, int n) {
  if (b->ncrossed < n) {
    int *c = shm_realloc(b->crossed, sizeof(int) * (size_t)n);
    if (!c) return NULL;
    memset(c + b->ncrossed, 0, sizeof(int) * (size_t)(n - b->ncrossed));
    b->crossed = c;
    b->ncrossed = n;
  }
  int k = b->crossed[rank]++;
  if (k >= b->nverdicts) {
    int cap = b->nverdicts ? 2 * b->nverdicts : 16;
    while (cap <= k) cap *= 2;
    unsigned char *v = shm_realloc(b->verdicts, (size_t)cap);
    if (!v) return NULL;
    memset(v + b->nverdicts, 0, (size_t)(cap - b->nverdicts));
    b->verdicts = v;
    b->nverdicts = cap;
  }
  return &b->verdicts[k];
}

/* Forgets the devices' crossings as a new call begins (lock held). */
static void bp_new_call(void) {
  for (int i = 0; i < dbg_state.nbps; i++) {
    Bp *b = &dbg_state.bps[i];
    if (b->crossed) memset(b->crossed, 0, sizeof(int) * (size_t)b->ncrossed);
    if (b->verdicts) memset(b->verdicts, 0, (size_t)b->nverdicts);
  }
}

/* Deletes the tbreaks that stopped devices, as the stop's prompt opens
 * (lock held): every device that was to stop at them has. */
static void bp_reap_dying(void) {
  for (int i = dbg_state.nbps - 1; i >= 0; i--)
    if (dbg_state.bps[i].dying) dbg_bp_delete(&dbg_state.bps[i]);
}

/* Counts a crossing of breakpoint [number] (as pdb, whether or not its
 * condition holds) by device [rank] of [n] (-1: the main thread) whose
 * condition gave [cond] (1 true or none, 0 false, -1 failed), and decides
 * whether it stops: a crossing with a true condition is passed over while
 * the ignore count lasts, and uses one up (pdb's bdb.effective).  When it
 * stops, a tbreak is deleted, which [note] reports as pdb does; on a
 * device, once the devices are released, so that every device stops at
 * it.  A device's crossing follows the verdict of the devices' same
 * crossing (Bp.verdicts). */
static bool bp_count_hit(int number, int rank, int n, int cond, char *note, size_t cap) {
  bool stops = false;
  pthread_mutex_lock(&dbg_state.lock);
  Bp *b = dbg_bp_find(number);
  unsigned char one = 0, *v = b && rank >= 0 ? bp_device_crossing(b, rank, n) : &one;
  if (b && v) {
    if (!(*v & BP_COUNTED)) b->hits++;
    *v |= BP_COUNTED;
    if (cond > 0 && !(*v & BP_DECIDED)) {
      *v |= BP_DECIDED;
      if (b->ignore > 0) b->ignore--;
      else if (!b->hit_cond || dbg_hit_matches(b->hit_cond, ++b->cond_hits)) *v |= BP_STOPS;
    }
    stops = cond < 0 || (cond > 0 && (*v & BP_STOPS));
  }
  if (stops && b->temporary) {
    snprintf(note, cap, "Deleted breakpoint %d at %s:%d\n", b->number, b->file, b->line);
    if (rank < 0) dbg_bp_delete(b);
    else b->dying = true;
  }
  pthread_mutex_unlock(&dbg_state.lock);
  return stops;
}

/* The number of the breakpoint that stops [f] at [stmt] on device [rank]
 * of [ndev] (-1: the main thread), or 0 (its condition is evaluated on this
 * thread, in the frame's scope). */
static int bp_hit(const Frame *f, const Node *stmt, int rank, int ndev, char *note, size_t cap) {
  if (atomic_load_explicit(&dbg_state.nbp_enabled, memory_order_relaxed) == 0 || !stmt->loc.src)
    return 0;
  Candidate cand[DBG_MAX_CANDIDATES];
  int n = bp_candidates(stmt, cand);
  for (int i = 0; i < n; i++) {
    int cond = cand[i].has_cond ? cond_value(cand[i].cond, f->env) : 1;
    if (!bp_count_hit(cand[i].number, rank, ndev, cond, note, cap)) continue;
    if (!cand[i].has_log) return cand[i].number;
    log_point(cand[i].log, f->env);
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
static int stop_main_at(Frame *f, int bp, Value *retval, bool at_call);
static int device_park(DbgCall *c, int rank, Frame *f, int depth, ParkWhy why, int bp,
                       const char *note, Value *retval);

static int main_hook(Frame *f, const Node *stmt) {
  if (dbg_state.post_mortem) snap_update(&tls_snap, f, 0);
  char note[160] = "";
  int bp = 0;
  bool stop = tls_break_next ||
              resume_stops(&dbg_state.main_resume, frame_depth(f), stmt->loc.line) ||
              (bp = bp_hit(f, stmt, -1, 0, note, sizeof note)) > 0;
  if (!stop) return 0;
  tls_break_next = false;
  fputs(note, stdout);
  return stop_main(f, bp, NULL);
}

/* A device picks up the command of a release it was not parked for (it
 * was inside a collective): step and next count the statement it was in
 * as done; return and until start from where it is. */
static ParkWhy device_pickup(DbgCall *c, int depth) {
  pthread_mutex_lock(&dbg_state.lock);
  tls_resume = c->cmd;
  tls_cmd_gen = atomic_load(&c->cmd_gen);
  bool relative = c->cmd_relative;
  pthread_mutex_unlock(&dbg_state.lock);
  if (!relative) return PARK_NONE;
  tls_resume.depth = depth;
  return tls_resume.mode == RM_STEP || tls_resume.mode == RM_NEXT ? PARK_TARGET : PARK_NONE;
}

static int device_hook(Frame *f, const Node *stmt) {
  DbgCall *c = atomic_load_explicit(&dbg_state.call, memory_order_acquire);
  DevCtx *ctx = dev_ctx();
  if (!c || !ctx || ctx->rank >= c->n) return 0;
  if (atomic_load(&c->quit)) return quit_error();
  int depth = c->depth0 + frame_depth(f);
  if (dbg_state.post_mortem) snap_update(&c->slots[ctx->rank].snap, f, c->depth0);
  ParkWhy why = PARK_NONE;
  char note[160] = "";
  int bp = 0;
  if (atomic_load(&c->cmd_gen) != tls_cmd_gen) why = device_pickup(c, depth);
  if (tls_break_next || (bp = bp_hit(f, stmt, ctx->rank, c->n, note, sizeof note)) > 0)
    why = PARK_BREAK;
  else if (!why && resume_stops(&tls_resume, depth, stmt->loc.line)) why = PARK_TARGET;
  else if (!why && atomic_load(&c->stop)) why = PARK_FOLLOW;
  if (!why) return 0;
  tls_break_next = false;
  return device_park(c, ctx->rank, f, depth, why, bp, note, NULL);
}

/* The main thread's return event: frame [f] returns [rv].  breakpoint()
 * as a function's last statement stops here, as in pdb. */
static int main_return(Frame *f, Value *rv) {
  if (!tls_break_next && !resume_stops_at_return(&dbg_state.main_resume, frame_depth(f))) return 0;
  tls_break_next = false;
  return stop_main(f, 0, rv);
}

/* A device's return event: it parks there for the same reasons as at a
 * statement, breakpoints aside (they name lines, not returns). */
static int device_return(Frame *f, Value *rv) {
  DbgCall *c = atomic_load_explicit(&dbg_state.call, memory_order_acquire);
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

/* eval_call_hook: pdb's --Call-- stop as a function is entered, made by
 * `step` alone on the main thread (a device stops at the first statement
 * of the function it steps into). */
static int dbg_call_hook(Frame *f, const Node *def) {
  (void)def;
  /* an editor's stepIn lands on the function's first statement, as
   * debugpy's does: the --Call-- stop is the terminal's (pdb's) */
  if (tls_busy || dev_on_device_thread() || tls_break_next || dbg_front ||
      dbg_state.main_resume.mode != RM_STEP)
    return 0;
  return stop_main_at(f, 0, NULL, true);
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
  DbgCall *c = atomic_load_explicit(&dbg_state.call, memory_order_acquire);
  if (c && dev_on_device_thread()) atomic_store(&c->stop, true);
  engage();
  return true;
}

/* dbg_hook past its first checks: something may stop here. */
__attribute__((noinline, cold)) static int dbg_hook_engaged(Frame *f, const Node *stmt) {
  if (take_interrupt() && !dev_on_device_thread()) tls_break_next = true;
  if (tls_busy) return 0;
  if (!tls_break_next && !atomic_load_explicit(&dbg_state.engaged, memory_order_acquire)) return 0;
  if (dev_on_device_thread()) return device_hook(f, stmt);
  return main_hook(f, stmt);
}

/* Runs before every statement: when nothing is to stop (no Ctrl-C
 * pending, no breakpoint() called, the debugger not engaged) a few loads,
 * with no stack frame to set up (the rest is out of line). */
static int dbg_hook(Frame *f, const Node *stmt) {
  if (tls_current) atomic_store_explicit(tls_current, f, memory_order_release);
  tls_raise_seen = false;   /* a statement runs: no error is on its way out */
  eval_hook_here = tls_current || tls_break_next;
  if (!atomic_load_explicit(&shm_debugger_interrupted, memory_order_relaxed) &&
      !tls_break_next && !atomic_load_explicit(&dbg_state.engaged, memory_order_acquire))
    return 0;
  return dbg_hook_engaged(f, stmt);
}

/* eval_return_hook: runs as a user function's frame returns, on every
 * thread; as cheap as dbg_hook when nothing is to stop.  A lambda has no
 * statement of its own to show, and no stop inside it: it runs as a whole,
 * its return included. */
static int dbg_return_hook(Frame *f, const Node *at, Value *ret) {
  if (tls_busy || at->kind == N_LAMBDA || !f->stmt) return 0;
  if (!tls_break_next && !atomic_load_explicit(&dbg_state.engaged, memory_order_acquire)) return 0;
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
  pthread_mutex_unlock(&dbg_state.lock);
  tls_busy = true;
  uint32_t writer = val_writer;
  val_writer = 0;   /* every device is parked: the prompt may change anything */
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
  val_writer = writer;
  tls_busy = false;
  if (tls_current) atomic_store(tls_current, cur);   /* the job's frames are gone */
  pthread_mutex_lock(&dbg_state.lock);
  j->out[rank] = out;
  j->pending--;
  pthread_cond_broadcast(&dbg_state.cond);
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
  pthread_mutex_lock(&dbg_state.lock);
  s->state = DS_PARKED;
  s->frame = f;
  s->depth = depth;
  s->bp = bp;
  s->retval = retval;
  s->raised = tls_raised;
  c->parked++;
  if (why == PARK_BREAK) {
    /* a rendezvous (LANGUAGE.md §7): the other devices are not stopped
     * where they happen to be; each runs on to this stop, or until it can
     * go no further (a collective, its return, an error) */
    if (c->trigger < 0 || rank < c->trigger) c->trigger = rank;
    engage();
  }
  size_t used = strlen(c->notes);
  if (!strstr(c->notes, note))   /* the same breakpoint on several devices: one note */
    snprintf(c->notes + used, sizeof c->notes - used, "%s", note);
  pthread_cond_broadcast(&dbg_state.cond);
  unsigned gen = c->gen;
  while (c->gen == gen) {
    if (c->job && s->job_seen != c->job_gen) {
      s->job_seen = c->job_gen;
      run_job(c, rank);
      continue;
    }
    pthread_cond_wait(&dbg_state.cond, &dbg_state.lock);
  }
  s->retval = NULL;
  s->raised = NULL;
  tls_resume = c->cmd;
  tls_resume.depth = c->cmd_relative ? s->base : c->cmd.depth;
  tls_cmd_gen = atomic_load(&c->cmd_gen);
  const Node *jump = !retval && c->jump_to && f->stmt == c->jump_from ? c->jump_to : NULL;
  pthread_mutex_unlock(&dbg_state.lock);
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
  eval_hook_here = true;   /* its place is kept at every statement */
  c->fn(rank, c->ctx);
  tls_current = NULL;
  eval_hook_here = false;
  bool failed = err_occurred();
  tls_break_next = false;
  pthread_mutex_lock(&dbg_state.lock);
  s->state = DS_DONE;
  s->failed = failed;
  if (c->parked > 0) pthread_cond_broadcast(&dbg_state.cond); /* only a stop waits for this */
  pthread_mutex_unlock(&dbg_state.lock);
}

/* The helper thread: calls coll_run for the main thread, which meanwhile
 * serves the stops.  One thread for the whole run, made at the first call
 * (a thread per call would cost more than a small call itself). */
static void *helper_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&dbg_state.lock);
  for (;;) {
    while (!dbg_state.helper_job && !dbg_state.helper_exit) pthread_cond_wait(&dbg_state.helper_wake, &dbg_state.lock);
    DbgCall *c = dbg_state.helper_job;
    if (!c) break;
    pthread_mutex_unlock(&dbg_state.lock);
    int rc = coll_run(c->g, device_body, c);
    if (rc < 0) err_save(&c->err);
    pthread_mutex_lock(&dbg_state.lock);
    dbg_state.helper_job = NULL;
    c->rc = rc;
    c->done = true;
    pthread_cond_broadcast(&dbg_state.cond);
  }
  pthread_mutex_unlock(&dbg_state.lock);
  return NULL;
}

/* Hands [c] to the helper thread, starting it if needed; -1 if it cannot
 * be started. */
static int helper_start(DbgCall *c) {
  if (!dbg_state.helper_started) {
    if (pthread_create(&dbg_state.helper, NULL, helper_main, NULL) != 0) return -1;
    dbg_state.helper_started = true;
  }
  pthread_mutex_lock(&dbg_state.lock);
  dbg_state.helper_job = c;
  pthread_cond_signal(&dbg_state.helper_wake);
  pthread_mutex_unlock(&dbg_state.lock);
  return 0;
}

/* Stops and joins the helper thread (no call may be running). */
static void helper_stop(void) {
  if (!dbg_state.helper_started) return;
  pthread_mutex_lock(&dbg_state.lock);
  dbg_state.helper_exit = true;
  pthread_cond_signal(&dbg_state.helper_wake);
  pthread_mutex_unlock(&dbg_state.lock);
  pthread_join(dbg_state.helper, NULL);
  dbg_state.helper_started = false;
  dbg_state.helper_exit = false;
}

/* Writes out device [rank]'s buffered print output, each line prefixed by
 * its mesh coordinates (as shard_map does at the end of a call), and
 * empties the buffer.  The device must be parked or done. */
void dbg_flush_device(DbgCall *c, int rank) {
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
 * collective for a device that has not reached it (one whose collective
 * is complete runs on, even if its thread has not woken yet); at least
 * one is parked (lock held).  [sig] sums the collective counters of the
 * waiting ones, so a caller can see that nothing moved between two looks. */
static bool quiescent(DbgCall *c, long *sig) {
  *sig = 0;
  /* Reference mode runs one device at a time: a parked device holds the
   * baton, so every other one waits for its turn. */
  if (shm_interp->reference) return c->parked > 0;
  for (int r = 0; r < c->n; r++) {
    if (c->slots[r].state != DS_RUNNING) continue;
    if (!coll_waits_for_peer(c->g, r)) return false;   /* its collective done: it runs on */
    *sig += coll_seq(c->g, r) * (r + 1);
  }
  return c->parked > 0;
}

void dbg_timed_wait(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += DBG_POLL_NS;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_cond_timedwait(&dbg_state.cond, &dbg_state.lock, &ts);
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
    if (c->parked > 0) dbg_timed_wait();
    else pthread_cond_wait(&dbg_state.cond, &dbg_state.lock);
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
    s->base = i == dbg_state.focus && focus_depth > 0 ? focus_depth : s->depth;
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
  dbg_update_engaged();
  pthread_cond_broadcast(&dbg_state.cond);
}

/* The main thread's part of a call: serve stops until the call ends. */
static void serve_call(DbgCall *c) {
  pthread_mutex_lock(&dbg_state.lock);
  while (wait_for_stop(c)) {
    pthread_mutex_unlock(&dbg_state.lock);
    Resume r = stop_devices(c);
    pthread_mutex_lock(&dbg_state.lock);
    release(c, &r, r.mode == RM_NEXT || r.mode == RM_RETURN || r.mode == RM_UNTIL ? r.depth : 0);
    if (r.mode == RM_QUIT) dbg_state.main_resume = (Resume){RM_CONTINUE, 0, 0};
    else if (r.mode != RM_CONTINUE) dbg_state.main_resume = (Resume){RM_STEP, 0, 0};
    else dbg_state.main_resume = r;
    dbg_update_engaged();
  }
  pthread_mutex_unlock(&dbg_state.lock);
}

static void pm_record_free(void);

/* --pm: keeps the frames of the devices that failed in [c]. */
static void keep_pm_record(DbgCall *c) {
  PmRecord *pm = &dbg_state.pm;
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
  c->cmd = dbg_state.main_resume;
  atomic_init(&c->stop, false);
  atomic_init(&c->quit, false);
  atomic_init(&c->cmd_gen, 1);
  c->slots = shm_calloc((size_t)c->n, sizeof(Slot));
  if (!c->slots) return err_nomem(), -1;
  return 0;
}

int dbg_coll_run(CollGroup *g, const MeshDesc *mesh, void (*fn)(int rank, void *ctx),
                 void *ctx, OutBuf *outs) {
  if (!dbg_state.installed || tls_busy || dev_on_device_thread()) return coll_run(g, fn, ctx);
  DbgCall c;
  if (call_init(&c, g, mesh, fn, ctx, outs) < 0) return -1;
  pthread_mutex_lock(&dbg_state.lock);
  bp_new_call();
  pthread_mutex_unlock(&dbg_state.lock);
  atomic_store_explicit(&dbg_state.call, &c, memory_order_release);
  if (helper_start(&c) < 0) {
    atomic_store(&dbg_state.call, NULL);
    call_free(&c);
    return coll_run(g, fn, ctx);
  }
  serve_call(&c);
  atomic_store_explicit(&dbg_state.call, NULL, memory_order_release);
  pthread_mutex_lock(&dbg_state.lock);
  bp_reap_dying();   /* a call that ended at its stop (quit) */
  pthread_mutex_unlock(&dbg_state.lock);
  dbg_update_engaged();
  if (c.rc < 0) {
    if (dbg_state.post_mortem) keep_pm_record(&c);
    dbg_state.fail_mesh = c.mesh;   /* pm() shows a device's frames with it */
    dbg_state.fail_mesh.device_ids = NULL;
    dbg_state.fail_has_mesh = true;
    err_restore(&c.err);
  }
  call_free(&c);
  return c.rc;
}

/* ==== a stop: what the prompt shows and works on ==================================== */


/* The focused device's frames, or NULL. */
const Stack *dbg_focus_stack(const Stop *st) {
  return st->dev && dbg_state.focus < st->ndev ? &st->dev[dbg_state.focus] : NULL;
}

int dbg_st_nframes(const Stop *st) {
  const Stack *d = dbg_focus_stack(st);
  return st->main.n + (d ? d->n : 0);
}

const View *dbg_st_frame(const Stop *st, int i) {
  if (i < 0 || i >= dbg_st_nframes(st)) return NULL;
  return i < st->main.n ? &st->main.v[i] : &dbg_focus_stack(st)->v[i - st->main.n];
}

const View *dbg_st_cur(const Stop *st) { return dbg_st_frame(st, st->level); }

/* The device whose frame [i] is, or -1 for the main thread's. */
int dbg_st_rank_of(const Stop *st, int i) { return i >= st->main.n ? dbg_state.focus : -1; }

static void st_free(Stop *st) {
  stack_free(&st->main);
  for (int r = 0; st->dev && r < st->ndev; r++) stack_free(&st->dev[r]);
  shm_free(st->dev);
}

/* ---- output ---------------------------------------------------------------------- */

/* Line [line] of [s] without its newline; false when out of range. */
bool dbg_src_line(const Source *s, int line, const char **text, int *len) {
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
  size_t nc = utf8_count(one, len);   /* cut between characters, counted as code points */
  size_t head = (DBG_REPR_MAX - 3) / 2, tail = DBG_REPR_MAX - 3 - head;
  if (nc > DBG_REPR_MAX)
    printf("->%.*s...%s", (int)utf8_offset(one, len, head), one, one + utf8_offset(one, len, nc - tail));
  else printf("->%s", one);
  shm_free(one);
  val_decref(r);
}

/* pdb's frame line: "> file.shm(12)f()" and "-> code"; at a return stop,
 * "> file.shm(12)f()->value". */
void dbg_print_view(const View *v, const char *mark) {
  const char *t = "";
  int n = 0;
  printf("%s%s(%d)%s()", mark, v->src->name, v->line, v->fname);
  if (v->retval) print_return_value(v->retval);
  putchar('\n');
  if (dbg_src_line(v->src, v->line, &t, &n))
    while (n > 0 && (*t == ' ' || *t == '\t')) t++, n--;
  printf("-> %.*s\n", n, t);
}

/* Prints the pending error as pdb does ("*** message") and clears it. */
void dbg_print_error(void) {
  printf("*** %s\n", err_occurred() ? err_text() : "error");
  err_clear();
}

/* The pending error as p prints it ("*** message", owned), cleared. */
static char *error_text(void) {
  const char *m = err_occurred() ? err_text() : "error";
  size_t cap = strlen(m) + 8;
  char *t = shm_malloc(cap);
  if (t) snprintf(t, cap, "*** %s", m);
  err_clear();
  return t;
}

/* Prints [text] with each line prefixed by [prefix]. */
void dbg_print_prefixed(const char *prefix, const char *text) {
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
DevCtx *dbg_enter_device(const Stop *st, int rank, DevCtx *dc) {
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
Value *dbg_eval_in(const Stop *st, const View *v, int rank, const char *expr) {
  DevCtx dc, *saved = dbg_enter_device(st, rank, &dc);
  Value *r = eval_expr_text(expr, v->env);
  dev_ctx_set(saved);
  return r;
}


/* Runs the statements [text] in the current frame, echoing an
 * expression's value as the REPL does; a line calling a collective, in
 * a body, runs on every device (dbg_run_everywhere). */
void dbg_exec_in(const Stop *st, const char *text) {
  const View *v = dbg_st_cur(st);
  if (!v) {
    printf("*** no frame to run in\n");
    return;
  }
  if (dbg_run_everywhere(st, text, false, false, false)) return;
  Source *src = src_new("<stdin>", text);
  if (!src) return dbg_print_error();
  DevCtx dc, *saved = dbg_enter_device(st, dbg_st_rank_of(st, st->level), &dc);
  if (eval_source(src, v->env, true) < 0) dbg_print_error();
  dev_ctx_set(saved);
  src_decref(src);
}

/* pprint's shape for a long tuple, list or dict: the repr broken after
 * each top-level comma, one item per line. */
static Value *pretty_repr(Value *v) {
  Value *r = val_repr(v);
  if (!r || str_nchars(r) <= 79 || (v->type != V_TUPLE && v->type != V_LIST && v->type != V_DICT))
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


/* The repr (pretty: pp's form) of [expr] in view [v] as a new string, or
 * the failure in form [ff]. */
char *dbg_value_text(const Stop *st, const View *v, int rank, const char *expr, bool pretty,
                        FailForm ff) {
  Value *x = dbg_eval_in(st, v, rank, expr);
  Value *r = x ? (pretty ? pretty_repr(x) : val_repr(x)) : NULL;
  char *s;
  if (r) {
    s = shm_strdup(str_cstr(r));
  } else {
    size_t cap = strlen(err_text()) + 32;
    s = shm_malloc(cap);
    if (s && ff == FAIL_P) snprintf(s, cap, "*** %s", err_text());
    else if (s) snprintf(s, cap, "** raised %s **", err_text());
    err_clear();
  }
  val_decref(x);
  val_decref(r);
  return s;
}

/* ---- devices ---------------------------------------------------------------------- */

const char *dbg_coords_of(const Stop *st, int rank, char *buf, size_t cap) {
  return dev_mesh_coords_str(st->mesh, rank, buf, cap);
}

/* What device [r] is doing, for `devices`, `p x @ all` and the stop line. */
void dbg_device_state(const Stop *st, int r, char *buf, size_t cap) {
  char w[256];
  const Stack *s = &st->dev[r];
  if (s->n > 0) {   /* where it is, and the collective it waits in, if any */
    const View *v = &s->v[s->n - 1];
    bool running = false;
    if (st->call) {
      pthread_mutex_lock(&dbg_state.lock);
      running = st->call->slots[r].state == DS_RUNNING;
      pthread_mutex_unlock(&dbg_state.lock);
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
  pthread_mutex_lock(&dbg_state.lock);
  DevState ds = st->call->slots[r].state;
  bool failed = st->call->slots[r].failed;
  pthread_mutex_unlock(&dbg_state.lock);
  if (ds == DS_DONE) snprintf(buf, cap, failed ? "stopped with an error" : "returned");
  else if (coll_waiting_str(st->call->g, r, w, sizeof w)) snprintf(buf, cap, "waits in %s", w);
  else if (shm_interp->reference) snprintf(buf, cap, "waits for its turn (reference mode)");
  else snprintf(buf, cap, "running");
}

/* The rank that [arg] names: "3", "(1, 1)" or "1, 1"; -1 after saying why not. */
/* The mesh axis that the name at [p] (up to '=') names, or -1. */
static int coord_axis(const MeshDesc *m, const char *p, size_t len) {
  for (int a = 0; a < m->naxes; a++)
    if (strlen(m->names[a]) == len && !strncmp(m->names[a], p, len)) return a;
  return -1;
}

/* Reads the coordinates of [arg] into [vals] in the mesh's axis order:
 * "3", "(1, 0)" or, by name in any order, "(i=1, j=0)".  Their number, or
 * -1 after saying what is wrong. */
static int parse_coords(const MeshDesc *m, const char *arg, int *vals) {
  int n = 0, named = 0;
  const char *p = arg;
  while (*p) {
    while (*p == ' ' || *p == '(' || *p == ')' || *p == ',') p++;
    if (!*p) break;
    int axis = n;
    const char *eq = strchr(p, '=');
    size_t len = strcspn(p, "=,) ");
    if (eq && p + len == eq) {
      axis = coord_axis(m, p, len);
      if (axis < 0) return printf("*** the mesh has no axis '%.*s'\n", (int)len, p), -1;
      named++;
      p = eq + 1;
    }
    char *end;
    long x = strtol(p, &end, 10);
    if (end == p || n > DEV_MAX_AXES || axis > DEV_MAX_AXES || x < -1000000 || x > 1000000)
      return printf("*** expected a device number or mesh coordinates, got '%s'\n", arg), -1;
    vals[axis] = (int)x;
    n++;
    p = end;
  }
  if (named && named != n)
    return printf("*** give every coordinate by name or none, got '%s'\n", arg), -1;
  return n;
}

int dbg_parse_rank(const Stop *st, const char *arg) {
  int vals[DEV_MAX_AXES + 2];
  for (int a = 0; a < DEV_MAX_AXES + 2; a++) vals[a] = -1;
  int n = parse_coords(st->mesh, arg, vals);
  if (n < 0) return -1;
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
int dbg_display_index(const Stop *st, const Display *d, const View *v) {
  int rank = dbg_st_rank_of(st, st->level), k = d->dev ? rank : 0;
  if (d->dev != (rank >= 0) || k < 0 || k >= d->n) return -1;
  return d->env[k] == v->env ? k : -1;
}

void dbg_display_free(Display *d) {
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
void dbg_print_location(const Stop *st) {
  const Stack *d = dbg_focus_stack(st);
  if (st->mesh && d && d->n == 0) {
    char c[160], s[320];
    dbg_device_state(st, dbg_state.focus, s, sizeof s);
    printf("device %s %s\n", dbg_coords_of(st, dbg_state.focus, c, sizeof c), s);
    return;
  }
  const View *v = dbg_st_cur(st);
  if (v) dbg_print_view(v, "> ");
}

/* pdb's display: at each stop in a display's frame, show it if its value
 * changed. */
static void run_displays(const Stop *st) {
  const View *v = dbg_st_cur(st);
  for (int i = 0; v && i < dbg_state.ndisplays; i++) {
    Display *d = &dbg_state.displays[i];
    int k = dbg_display_index(st, d, v);
    if (k < 0) continue;
    char *now = dbg_value_text(st, v, dbg_st_rank_of(st, st->level), d->expr, false, FAIL_DISPLAY);
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

void dbg_comp_add(const char *name, Value *v, void *ctx) {
  (void)v, (void)ctx;
  if (comp.n == comp.cap) {
    char **nn = shm_realloc(comp.names, sizeof(char *) * (size_t)(comp.cap * 2 + 64));
    if (!nn) return;
    comp.names = nn;
    comp.cap = comp.cap * 2 + 64;
  }
  if ((comp.names[comp.n] = shm_strdup(name))) comp.n++;
}

static void comp_add_name(const char *name, void *ctx) { dbg_comp_add(name, NULL, ctx); }

static void comp_clear(void) {
  for (int i = 0; i < comp.n; i++) shm_free(comp.names[i]);
  comp.n = 0;
}


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
    dbg_comp_commands();
  } else if (comp.stop && strchr(text, '.')) {   /* an attribute: x.sh, jnp.ar */
    const View *v = dbg_st_cur(comp.stop);
    repl_each_attribute(v ? v->env : NULL, text, comp_add_name, NULL);
  } else if (comp.stop) {
    const View *v = dbg_st_cur(comp.stop);
    if (v) env_each(v->env, dbg_comp_add, NULL);
    if (comp.stop->main.n) env_each(comp.stop->main.v[0].env, dbg_comp_add, NULL);
    env_each(shm_interp->builtins, dbg_comp_add, NULL);
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
char *dbg_read_command(const char *prompt) {
  fflush(stdout);
  return isatty(fileno(stdin)) ? read_tty(prompt) : read_pipe(prompt);
}

/* How many `debug` commands the prompt is inside: pdb wraps its prompt
 * in one more pair of parentheses for each, "((shmap-dbg)) ". */
static int nested;

static void make_prompt(const Stop *st, char *buf, size_t cap) {
  char c[160], open[16] = "", close[16] = "";
  for (int i = 0; i < nested && i < 15; i++) open[i] = '(', close[i] = ')';
  if (st->mesh)
    snprintf(buf, cap, "%s" DBG_PROMPT " %s)%s ", open, dbg_coords_of(st, dbg_state.focus, c, sizeof c), close);
  else snprintf(buf, cap, "%s" DBG_PROMPT ")%s ", open, close);
}

/* pdb's `debug code`: runs [text] in the current frame's scope under a
 * debugger of its own, which stops before its first statement; its quit
 * ends only [text].  Main thread frames only: a device's frame waits in
 * its call, whose devices a second stop would need. */
void dbg_debug_code(Stop *st, const char *text) {
  const View *v = dbg_st_cur(st);
  if (!v) return (void)printf("*** no frame to run in\n");
  if (dbg_st_rank_of(st, st->level) >= 0)
    return (void)printf("*** debug: not in a shard_map body's frame\n");
  Source *src = src_new("<string>", text);
  if (!src) return dbg_print_error();
  printf("ENTERING RECURSIVE DEBUGGER\n");
  Resume saved = dbg_state.main_resume;
  bool here = eval_hook_here;
  nested++;
  tls_busy = false;   /* the statements of [text] are watched */
  tls_break_next = eval_hook_here = true;
  int rc = eval_source(src, v->env, false);   /* pdb runs it, echoing nothing */
  tls_break_next = false;
  tls_busy = true;
  eval_hook_here = here;
  nested--;
  dbg_state.main_resume = saved;
  dbg_update_engaged();
  if (rc < 0 && err_kind() != ERR_QUIT) dbg_print_error();
  err_clear();
  src_decref(src);
  printf("LEAVING RECURSIVE DEBUGGER\n");
}

/* ==== stops ============================================================================ */

/* Reads and runs commands until one resumes the program (*r set) or the
 * input ends (*r left as it is). */
static void prompt_loop(Stop *st, Resume *r) {
  char prompt[256];
  for (;;) {
    make_prompt(st, prompt, sizeof prompt);
    char *line = dbg_read_command(prompt);
    if (!line) {   /* end of input: quit, as pdb does, and say why (its BdbQuit) */
      fflush(stdout);
      fprintf(stderr, "\nshmap: quit: end of input at the debugger's prompt (BdbQuit)\n");
      break;
    }
    if (strspn(line, " \t") == strlen(line) && dbg_state.last_cmd) {
      free(line);
      line = strdup(dbg_state.last_cmd);
      if (!line) continue;
    } else if (line[0]) {
      shm_free(dbg_state.last_cmd);
      dbg_state.last_cmd = shm_strdup(line);
    }
    int go = line[0] ? dbg_dispatch(st, line, r) : 0;
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
  int go = st->bp ? dbg_run_bp_commands(st, &r, &silent) : 0;
  const View *at = dbg_st_cur(st);
  if (!silent && at && at->retval) printf("--Return--\n");
  if (!silent && st->at_call) printf("--Call--\n");
  if (!silent) dbg_print_location(st);
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
Resume (*dbg_front)(Stop *st);

/* A stop served by the other front end (dbg_front), as the prompt is:
 * nothing stops inside it. */
static Resume interact_front(Stop *st) {
  tls_busy = true;
  Resume r = dbg_front(st);
  tls_busy = false;
  tls_break_next = false;
  fflush(stdout);
  return r;
}

static Resume interact(Stop *st) {
  atomic_store(&shm_interrupt_to_debugger, 0);
  atomic_store(&shm_debugger_interrupted, 0);
  Resume r = dbg_front ? interact_front(st) : interact_prompt(st);
  atomic_store(&shm_interrupted, 0);
  atomic_store(&shm_interrupt_to_debugger, r.mode != RM_QUIT);
  return r;
}

/* A stop of the main thread at frame [f], outside any shard_map call, at
 * breakpoint [bp] (0: not at a breakpoint); at [f]'s return event,
 * [retval] is the value it returns (borrowed), else NULL. */
static int stop_main(Frame *f, int bp, Value *retval) {
  return stop_main_at(f, bp, retval, false);
}

/* stop_main, or with [at_call] the stop at [f]'s call event. */
static int stop_main_at(Frame *f, int bp, Value *retval, bool at_call) {
  atomic_store(&dbg_state.entered, true);
  Stop st = {.bp = bp, .frame = f, .at_call = at_call, .error = tls_raised};
  if (stack_from_frames(&st.main, f, 0) < 0) return 0;
  st.level = st.main.n - 1;
  if (st.main.n > 0) st.main.v[st.main.n - 1].retval = retval;
  Resume r = interact(&st);
  st_free(&st);
  if (r.mode == RM_QUIT) {
    dbg_state.main_resume = (Resume){RM_CONTINUE, 0, 0};
    dbg_update_engaged();
    return quit_error();
  }
  dbg_state.main_resume = r;
  dbg_update_engaged();
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
    if (s->state != DS_RUNNING) dbg_flush_device(c, r);
  }
  if (c->trigger >= 0) dbg_state.focus = c->trigger;
  if (dbg_state.focus >= c->n) dbg_state.focus = 0;
  for (int r = 0; c->slots[dbg_state.focus].state == DS_DONE && r < c->n; r++)
    if (c->slots[r].state == DS_PARKED) dbg_state.focus = r; /* a returned device shows nothing */
  st->bp = c->slots[dbg_state.focus].state == DS_PARKED ? c->slots[dbg_state.focus].bp : 0;
  st->error = c->slots[dbg_state.focus].state == DS_PARKED ? c->slots[dbg_state.focus].raised : NULL;
  fputs(c->notes, stdout);
  c->notes[0] = 0;
  bp_reap_dying();
  c->jump_from = c->jump_to = NULL;   /* every device has taken it by now */
}

/* A stop of the devices of call [c] (every one parked, done or waiting
 * in a collective); returns the command that resumes them. */
static Resume stop_devices(DbgCall *c) {
  atomic_store(&dbg_state.entered, true);
  Stop st = {0};
  st.call = c;
  st.mesh = &c->mesh;
  st.ndev = c->n;
  st.dev = shm_calloc((size_t)c->n, sizeof(Stack));
  if (!st.dev || stack_from_frames(&st.main, eval_current_frame(), 0) < 0) {
    st_free(&st);
    return (Resume){RM_CONTINUE, 0, 0};
  }
  pthread_mutex_lock(&dbg_state.lock);
  collect_devices(c, &st);
  pthread_mutex_unlock(&dbg_state.lock);
  st.level = dbg_st_nframes(&st) - 1;
  Resume r = interact(&st);
  if (st.jump && r.mode != RM_QUIT) {   /* cmd_jump saw every device parked there */
    pthread_mutex_lock(&dbg_state.lock);
    c->jump_from = c->slots[dbg_state.focus].frame->stmt;
    c->jump_to = st.jump;
    pthread_mutex_unlock(&dbg_state.lock);
  }
  st_free(&st);
  return r;
}

/* ==== post-mortem ====================================================================== */

/* The device an error message names ("on device (i=1, j=0): ..."), or -1. */
static int pm_rank(const char *msg) {
  const PmRecord *pm = &dbg_state.pm;
  char c[160];
  if (strncmp(msg, "on device ", 10) != 0) return -1;
  for (int r = 0; r < pm->n; r++) {
    size_t k = strlen(dev_mesh_coords_str(&pm->mesh, r, c, sizeof c));
    if (strncmp(msg + 10, c, k) == 0 && msg[10 + k] == ':') return r;
  }
  return -1;
}

static void pm_record_free(void) {
  for (int r = 0; r < dbg_state.pm.n; r++) stack_free(&dbg_state.pm.stacks[r]);
  shm_free(dbg_state.pm.stacks);
  memset(&dbg_state.pm, 0, sizeof dbg_state.pm);
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
  st->mesh = &dbg_state.pm.mesh;
  st->ndev = dbg_state.pm.n;
  if (!(st->dev = shm_calloc((size_t)st->ndev, sizeof(Stack)))) return -1;
  for (int r = 0; r < st->ndev; r++)
    if (stack_append(&st->dev[r], &dbg_state.pm.stacks[r]) < 0) return -1;
  stack_trim_to(&st->dev[rank], loc);
  dbg_state.focus = rank;
  st->level = dbg_st_nframes(st) - 1;
  return 0;
}

void dbg_post_mortem(void) {
  if (!dbg_state.installed || !dbg_state.post_mortem || !err_occurred() || err_kind() == ERR_QUIT) return;
  Loc loc = err_loc();
  Stop st = {0};
  st.pm = st.uncaught = true;
  int rank = pm_rank(err_message());
  if (pm_stop(&st, rank, loc) == 0 && dbg_st_nframes(&st) > 0) {
    fflush(stdout);
    err_print(stderr);
    char *msg = shm_strdup(err_message());
    st.error = msg;
    err_clear();
    printf("Uncaught error. Entering post mortem debugging\n");
    interact(&st);
    shm_free(msg);
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
    dbg_state.focus = rank;
  }
  for (int i = e->nscopes - 1; i >= 0; i--) {
    const ErrScope *sc = &e->scopes[i];
    bool on_dev = rank >= 0 && sc->tag == rank + 1;
    if (stack_push_scope(on_dev ? &st->dev[rank] : &st->main, sc) < 0) return -1;
  }
  st->pm = st->raiser_only = true;
  st->level = dbg_st_nframes(st) - 1;
  return 0;
}

/* Post-mortem on [e] from a built-in (pm(), pdb.post_mortem()): the
 * prompt at the frame where it was raised.  None, or NULL with ERR_QUIT
 * when `restart` ends the program. */
static Value *pm_enter(const ErrState *e, const MeshDesc *mesh, const ErrScope *catcher) {
  Stop st = {0};
  if (pm_stop_from(&st, e, mesh, catcher) < 0 || dbg_st_nframes(&st) == 0) {
    st_free(&st);
    return err_nomem();
  }
  int to_debugger = atomic_load(&shm_interrupt_to_debugger);
  interact(&st);
  atomic_store(&shm_interrupt_to_debugger, to_debugger);   /* as before: pm() does not stop later */
  st_free(&st);
  fflush(stdout);
  if (dbg_state.restart) return err_set(ERR_QUIT, "quit"), NULL;
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
  if (dbg_state.last.kind == ERR_NONE) return no_traceback();
  return pm_enter(&dbg_state.last, dbg_state.last_has_mesh ? &dbg_state.last_mesh : NULL, NULL);
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
  return pm_enter(h, dev && dbg_state.fail_has_mesh ? &dbg_state.fail_mesh : NULL, ok ? &catcher : NULL);
}

void dbg_keep_error(void) {
  if (!err_occurred() || err_kind() == ERR_QUIT) {
    err_clear();
    return;
  }
  ErrState old = dbg_state.last;
  err_save(&dbg_state.last);
  bool dev = false;
  for (int i = 0; i < dbg_state.last.nscopes; i++) dev = dev || dbg_state.last.scopes[i].tag > 0;
  dbg_state.last_has_mesh = dev && dbg_state.fail_has_mesh;
  dbg_state.last_mesh = dbg_state.fail_mesh;
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
  DbgCall *c = atomic_load_explicit(&dbg_state.call, memory_order_acquire);
  DevCtx *ctx = dev_ctx();
  if (!c || !ctx || ctx->rank >= c->n) return 0;
  return device_park(c, ctx->rank, fr, c->depth0 + frame_depth(fr), PARK_BREAK, 0, "", NULL);
}

/* Threads stopped in a staged breakpoint() (the main thread's, or the
 * devices' of a jit shard_map body). */
static atomic_int plan_stops;

bool dbg_at_plan_stop(void) { return atomic_load(&plan_stops) > 0; }
/* eval_raise_hook: with dbg_state.raised, stops where an error is raised,
 * once: at the statement whose own text holds the error's location (an
 * error that left a function it called, or a statement of a block it
 * opens, was raised there), or at the first statement it leaves when it
 * has no location.  The stop sees no error pending; the error goes on
 * unchanged unless the stop quits. */
static int dbg_raise_hook(Frame *f, const Node *stmt) {
  if (!dbg_state.raised || tls_busy || tls_raise_seen || err_kind() == ERR_QUIT) return 0;
  Loc at = err_loc();
  if (at.src && (at.src != stmt->loc.src || at.line < stmt->loc.line ||
                 at.line > dbg_node_last_line(stmt)))
    return 0;
  tls_raise_seen = true;
  ErrState e;
  err_save(&e);
  tls_raised = e.msg;
  int rc = stop_at(f);
  tls_raised = NULL;
  if (rc < 0) {
    err_state_free(&e);
    return -1;
  }
  err_restore(&e);
  return 0;
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
  atomic_fetch_add(&plan_stops, 1);
  int rc = err_occurred() ? -1 : stop_at(&fr);
  atomic_fetch_sub(&plan_stops, 1);
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
  if (!dbg_state.installed) return val_incref(VAL_NONE);
  if (trace_current()) return stage_breakpoint();
  tls_break_next = true;
  eval_hook_here = true;
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
  Value *jax = builtins_namespace("jax");
  Value *had = jax ? dict_get_str(((Module *)jax)->globals, "debug") : NULL;
  if (had && had->type == V_MODULE) {   /* a lower layer's (visualize_array_sharding) */
    Value *g = ((Module *)had)->globals;
    return dict_set_str(g, "print", env_lookup(builtins, intern_cstr("debug_print"))) == 0 &&
                   dict_set_str(g, "breakpoint", env_lookup(builtins, intern_cstr("breakpoint"))) == 0
               ? 0
               : -1;
  }
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
  dbg_state.post_mortem = post_mortem;
  dbg_state.main_resume = (Resume){debug ? RM_STEP : RM_CONTINUE, 0, 0};
  dbg_state.installed = true;
  dbg_update_engaged();
  eval_stmt_hook = dbg_hook;
  eval_return_hook = dbg_return_hook;
  eval_call_hook = dbg_call_hook;
  eval_raise_hook = dbg_raise_hook;
  shardmap_set_runner(dbg_coll_run);
  return 0;
}

void dbg_set_restartable(bool on) { dbg_state.restartable = on; }

bool dbg_take_restart(char **args) {
  *args = NULL;
  if (!dbg_state.restart) return false;
  dbg_state.restart = false;
  *args = dbg_state.restart_args;
  dbg_state.restart_args = NULL;
  dbg_state.main_resume = (Resume){RM_STEP, 0, 0};   /* pdb stops at the first line again */
  dbg_update_engaged();
  return true;
}

void dbg_restarted(Env *old_globals, Env *new_globals) {
  for (int i = 0; i < dbg_state.ndisplays; i++) {
    Display *d = &dbg_state.displays[i];
    if (d->dev || d->env[0] != old_globals) continue;   /* module level: the main thread's */
    env_incref(new_globals);
    env_decref(d->env[0]);
    d->env[0] = new_globals;
    shm_free(d->last[0]);   /* shown again at the first stop */
    d->last[0] = NULL;
  }
}

void dbg_free(void) {
  if (!dbg_state.installed) return;
  eval_stmt_hook = NULL;
  eval_return_hook = NULL;
  eval_call_hook = NULL;
  eval_raise_hook = NULL;
  shardmap_set_runner(NULL);
  dbg_state.installed = false;
  helper_stop();
  pthread_mutex_lock(&dbg_state.lock);
  while (dbg_state.nbps) dbg_bp_delete(&dbg_state.bps[0]);
  shm_free(dbg_state.bps);
  dbg_state.bps = NULL;
  dbg_state.bpcap = 0;
  pthread_mutex_unlock(&dbg_state.lock);
  for (int i = 0; i < dbg_state.ndisplays; i++) dbg_display_free(&dbg_state.displays[i]);
  shm_free(dbg_state.displays);
  dbg_state.displays = NULL;
  dbg_state.ndisplays = 0;
  for (int i = 0; i < dbg_state.nbpcmds; i++) dbg_bpcmds_free_lines(&dbg_state.bpcmds[i]);
  shm_free(dbg_state.bpcmds);
  dbg_state.bpcmds = NULL;
  dbg_state.nbpcmds = 0;
  shm_free(dbg_state.last_cmd);
  dbg_state.last_cmd = NULL;
  dbg_aliases_free();
  shm_free(dbg_state.restart_args);
  dbg_state.restart_args = NULL;
  err_state_free(&dbg_state.last);
  dbg_state.last.kind = ERR_NONE;
  comp_clear();
  shm_free(comp.names);
  comp.names = NULL;
  comp.cap = 0;
  snap_free(&tls_snap);
  pm_record_free();
}
