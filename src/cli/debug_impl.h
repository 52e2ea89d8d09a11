/*
 * debug_impl.h - what the debugger's own files share (debug.h is its
 * interface): the types of its state and of a stop, the one state
 * (debug.c), and the functions debug.c and debug_cmd.c call in each
 * other.  debug.c: frame views, breakpoints, the statement and return
 * hooks, the all-stop of a shard_map call, a stop and its output,
 * reading lines, stops, post-mortem, the built-ins, set-up.
 * debug_cmd.c: the commands typed at the prompt.
 *
 * Not for use outside src/cli/debug*.c and the debugger's other front end,
 * src/cli/dap.c.
 */
#ifndef SHMAP_DEBUG_IMPL_H
#define SHMAP_DEBUG_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "cli/debug.h"
#include "array/array.h"
#include "base/error.h"
#include "lang/eval.h"
#include "spmd/collective.h"
#include "spmd/device.h"

#define DBG_PROMPT "(shmap-dbg"
#define DBG_LIST_LINES 11        /* pdb's `list` window */
#define DBG_POLL_NS 10000000L    /* 10 ms: how often a stop re-checks collectives */
#define DBG_MAX_CANDIDATES 16    /* breakpoints looked at per statement */
#define DBG_BP_TEXT_MAX 256      /* a breakpoint's condition or log message, its 0 included */

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
  /* In a shard_map body every device crosses the line: the devices' k-th
   * crossings are one crossing, counted once and decided once (stop, or
   * pass over for the ignore count), so what stops does not depend on
   * which device got there first (LANGUAGE.md section 7's rendezvous). */
  int *crossed;     /* [ncrossed]: each device's crossings in the running call */
  int ncrossed;
  unsigned char *verdicts; /* [nverdicts]: crossing k+1's BP_* flags */
  int nverdicts;
  bool dying;       /* a tbreak that stopped devices: deleted as the stop's prompt opens */
  char *hit_cond;   /* owned; NULL: none.  A hit condition (dbg_hit_matches) on
                       cond_hits: which crossings with a true condition stop */
  char *log;        /* owned; NULL: none.  A log point: instead of stopping,
                       writes this message, {expr} replaced by str(expr) */
  int cond_hits;    /* the crossings with a true condition, which hit_cond counts
                       (as debugpy's; hits counts them all, as pdb's) */
} Bp;

/* A crossing's flags in Bp.verdicts. */
enum { BP_COUNTED = 1, BP_DECIDED = 2, BP_STOPS = 4 };

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
  const char *raised;     /* (L) parked where it raised this error (its message,
                             the device's while it is parked); else NULL */
  Snap snap;              /* --pm: written by the device thread only; read
                             by the main thread once the call is over */
} Slot;

/* A line typed at a stop in a body that calls a collective: every device
 * thread runs it at once, in its own scope and with its own group, since
 * the collective needs them all (LANGUAGE.md §7; see dbg_run_everywhere). */
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

/* The debugger's state: one, in debug.c. */
typedef struct DbgState {
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
  bool raised;            /* stop where an error is raised, caught or not (the
                             debug adapter's "raised" filter); set while the
                             program is stopped or before it runs, read by
                             every thread.  Not beside the atomics above: a
                             load of two neighbouring bools may be one wide
                             load, which would overlap them */
} DbgState;
extern DbgState dbg_state;

typedef struct Stop {
  Stack main;              /* the main thread's frames */
  DbgCall *call;           /* devices parked in a live call, or NULL */
  const MeshDesc *mesh;    /* the devices' mesh, or NULL outside shard_map */
  int ndev;
  Stack *dev;              /* [ndev]: each device's frames (n == 0: none) */
  int level;               /* selected frame of the focused stack */
  bool pm;                 /* post-mortem */
  bool uncaught;           /* --pm's stop at an error nothing handled: q restarts, as pdb's */
  bool at_call;            /* at a function's call event: shown as pdb's --Call-- */
  bool raiser_only;        /* pm(): only the raising device's frames were kept */
  int list_next;           /* `list` goes on here; 0: around the current line */
  int bp;                  /* the breakpoint stopped at, whose commands run; 0: none */
  const Frame *frame;      /* a main thread's stop: its bottom frame (for jump) */
  const Node *jump;        /* jump's target, taken as the program resumes; NULL: none */
  const char *error;       /* post-mortem on an uncaught error, or a stop where an
                              error was raised (dbg_state.raised): its message;
                              else NULL */
} Stop;

/* How value_text words a failure: p's "*** MESSAGE" or display's
 * "** raised MESSAGE **" (pdb's forms). */
typedef enum { FAIL_P, FAIL_DISPLAY } FailForm;

/* A command: 1 when it resumes the program (with *r set), 0 to stay. */
typedef int (*CmdFn)(Stop *st, const char *arg, Resume *r);

typedef struct Cmd {
  const char *names;   /* the accepted spellings, blank separated */
  CmdFn fn;
  const char *usage;
  const char *help;
} Cmd;

/* ---- debug.c, for debug_cmd.c ---- */

/* Removes breakpoint [b] (lock held). */
void dbg_bp_delete(Bp *b);

/* Breakpoint [number], or NULL (lock held). */
Bp *dbg_bp_find(int number);

/* Adds a breakpoint at [file]:[line] (every string copied; [cond],
 * [hit_cond] and [log] may be NULL or empty for none; [cond] and [log]
 * shorter than DBG_BP_TEXT_MAX) and returns its number, or 0 on out of
 * memory.  Takes the lock. */
int dbg_bp_insert(const char *file, int line, const char *cond, const char *hit_cond,
                  const char *log, bool temporary);

/* Whether the [hits]-th crossing (counted from 1) passes hit condition
 * [hit]: "N" or "== N" that crossing only, ">= N", "> N", "<= N", "< N",
 * "% N" every N-th (the forms of VS Code's hit counts, as debugpy reads
 * them).  1 yes, 0 no, -1 when [hit] is none of these forms. */
int dbg_hit_matches(const char *hit, int hits);

/* A front end other than the prompt (the debug adapter, dap.c): when set,
 * every stop is served by it instead of the prompt; it returns the
 * command that resumes the program.  Main thread. */
extern Resume (*dbg_front)(Stop *st);

/* Adds [name] to the completion candidates (env_each callback). */
void dbg_comp_add(const char *name, Value *v, void *ctx);

/* Device [rank]'s mesh coordinates as text, "(i=0, j=1)", in [buf]. */
const char *dbg_coords_of(const Stop *st, int rank, char *buf, size_t cap);

/* What device [r] is doing, for `devices`, `p x @ all` and the stop line. */
void dbg_device_state(const Stop *st, int r, char *buf, size_t cap);

/* Releases what display [d] holds. */
void dbg_display_free(Display *d);

/* Which entry of display [d] belongs to view [v] of the stop: the
 * focused device's, or the main thread's; -1 when [d] is another frame's. */
int dbg_display_index(const Stop *st, const Display *d, const View *v);

/* Makes [dc] the context of device [rank] for evaluation on the main
 * thread: the mesh and coordinates (axis_index works) but no group, so a
 * collective typed at the prompt fails instead of waiting for peers that
 * are parked. */
DevCtx *dbg_enter_device(const Stop *st, int rank, DevCtx *dc);

/* Evaluates [expr] in view [v] of device [rank] (-1: main thread). */
Value *dbg_eval_in(const Stop *st, const View *v, int rank, const char *expr);

/* Runs the statements [text] in the current frame, echoing an
 * expression's value as the REPL does; a line calling a collective, in
 * a body, runs on every device (dbg_run_everywhere). */
void dbg_exec_in(const Stop *st, const char *text);

/* True when breakpoint file [bp] names source [name]: the same path, or
 * one is the other's tail after a '/'. */
bool dbg_file_matches(const char *bp, const char *name);

/* Writes out device [rank]'s buffered print output, each line prefixed by
 * its mesh coordinates (as shard_map does at the end of a call), and
 * empties the buffer.  The device must be parked or done. */
void dbg_flush_device(DbgCall *c, int rank);

/* The focused device's frames, or NULL. */
const Stack *dbg_focus_stack(const Stop *st);

/* The last source line of statement [n]'s own text: its expressions, not
 * the blocks it opens. */
int dbg_node_last_line(const Node *n);

/* The rank that [arg] names: "3", "(1, 1)" or "1, 1"; -1 after saying why not. */
int dbg_parse_rank(const Stop *st, const char *arg);

/* Prints the pending error as pdb does ("*** message") and clears it. */
void dbg_print_error(void);

/* Shows where the stop is: the current frame, or what the focused device
 * does when it has no frame to show. */
void dbg_print_location(const Stop *st);

/* Prints [text] with each line prefixed by [prefix]. */
void dbg_print_prefixed(const char *prefix, const char *text);

/* pdb's frame line: "> file.shm(12)f()" and "-> code"; at a return stop,
 * "> file.shm(12)f()->value". */
void dbg_print_view(const View *v, const char *mark);

/* The next command line (malloc'd), or NULL at end of input. */
char *dbg_read_command(const char *prompt);

/* Line [line] of [s] without its newline; false when out of range. */
bool dbg_src_line(const Source *s, int line, const char **text, int *len);

/* The selected frame of the stop (the focused stack's), or NULL. */
const View *dbg_st_cur(const Stop *st);

/* Frame [i] of the stop, outermost first: the main thread's, then the
 * focused device's; NULL when out of range. */
const View *dbg_st_frame(const Stop *st, int i);

/* The number of frames of the stop (the main thread's and the focused
 * device's). */
int dbg_st_nframes(const Stop *st);

/* The device whose frame [i] is, or -1 for the main thread's. */
int dbg_st_rank_of(const Stop *st, int i);

/* Waits on dbg_state.cond for at most 10 ms (lock held). */
void dbg_timed_wait(void);

/* Recomputes dbg_state.engaged.  Main thread, or with dbg_state.lock held. */
void dbg_update_engaged(void);

/* The repr (pretty: pp's form) of [expr] in view [v] as a new string, or
 * the failure in form [ff]. */
char *dbg_value_text(const Stop *st, const View *v, int rank, const char *expr, bool pretty,
                        FailForm ff);

/* pdb's `debug code`: [text] runs in the current frame's scope under a
 * nested debugger ("((shmap-dbg)) ") that stops before its first
 * statement; its quit ends [text] alone. */
void dbg_debug_code(Stop *st, const char *text);

/* Whether the stop is at a breakpoint() staged in a jit plan, where the
 * plan's statements run as one (no statement to step to). */
bool dbg_at_plan_stop(void);

/* ---- debug_cmd.c ---- */

/* Frees [bc]'s lines, leaving it empty. */
void dbg_bpcmds_free_lines(BpCmds *bc);

void dbg_comp_commands(void);

/* Runs one command line; 1 when the program resumes (*r set). */
int dbg_dispatch(Stop *st, const char *line, Resume *r);

/* Runs the command list of the breakpoint the stop is at, as if typed
 * (pdb's bp_commands); 1 when one of them resumed the program (*r set).
 * A list that ends with a resuming command never prompts: when that
 * command does not resume by itself (jump, or it failed) the program
 * continues. */
int dbg_run_bp_commands(Stop *st, Resume *r, bool *silent);

/* Runs [text] (an expression when [expr]) on every device of the stop's
 * call, each in its selected frame, when it calls a collective: such a
 * line needs every device, as in the body itself (LANGUAGE.md §7).  False,
 * doing nothing, when the line calls none or the focused frame is not a
 * device's.  Every device must be parked at a statement; else the line is
 * refused, naming the device that is not, so it can never hang. */
bool dbg_run_everywhere(const Stop *st, const char *text, bool expr, bool pretty, bool all);

/* ---- debug_alias.c ---- */

/* pdb's `alias [name [command]]`: lists the aliases, shows one, or sets
 * it; and `unalias name`.  Commands (CmdFn). */
int dbg_cmd_alias(Stop *st, const char *arg, Resume *r);
int dbg_cmd_unalias(Stop *st, const char *arg, Resume *r);

/* [line] with the alias its first word names expanded, again while the
 * result starts with one (ten times at most): %1..%9 are the arguments,
 * %* all of them.  Owned; NULL out of memory. */
char *dbg_alias_expand(const char *line);

/* Forgets every alias (dbg_free). */
void dbg_aliases_free(void);
/* Whether the line [text] calls a collective (names looked up in [env]).
 * A line that does not parse is not one: it fails when it runs. */
bool dbg_text_calls_collective(const char *text, Env *env);

#endif
