/*
 * error.h - source locations and the error state.
 *
 * One error mechanism for the interpreter, as in CPython: a function that
 * fails sets the calling thread's error state with err_set() and returns
 * NULL (or -1); its callers release what they own and pass the failure up.
 * Nothing unwinds with longjmp, so reference counts stay exact and device
 * threads never unwind across a thread boundary (each has its own state,
 * it is thread-local).
 *
 * Location: a kernel that fails usually does not know where in the user's
 * source it was called from.  It raises without a location; the innermost
 * evaluator node that sees the failure calls err_locate() with its own
 * location, which only fills the location in if it is still empty.  So the
 * error points at the most specific expression, as LANGUAGE.md §9 asks.
 *
 * The printed form (LANGUAGE.md §9):
 *     file:line:col: error: message
 *        12 |     c = f(x)
 *           |         ^
 */
#ifndef SHMAP_ERROR_H
#define SHMAP_ERROR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>

/* A source text: a script file, a -c string, a REPL line, a module.
 * Sources are reference counted and immutable once made, so device threads
 * may read them concurrently. */
typedef struct Source {
  _Atomic int refcount;  /* atomic: device threads keep locations in errors */
  char *name;            /* file name as the user gave it, or "<stdin>" etc. */
  char *text;            /* whole text, NUL-terminated, owned */
  int nlines;            /* number of lines */
  const char **lines;    /* lines[i] points at the start of line i+1 in text */
  struct Source *next_live; /* the list src_find searches (error.c's lock) */
  bool listed;
} Source;

/* A position in a source: 1-based line and column.  src may be NULL for
 * errors with no place (command line, config file without a line). */
typedef struct Loc {
  Source *src;
  int line, col;
} Loc;

/* Makes a source from [text] (copied) named [name] (copied).  NULL on out
 * of memory.  The result has refcount 1. */
Source *src_new(const char *name, const char *text);

/* Reads a whole file into a new source, without the UTF-8 byte-order
 * mark it may start with (the lexer checks that the rest is UTF-8).  On
 * failure sets the error "cannot open 'NAME': <strerror>" and returns
 * NULL. */
Source *src_from_file(const char *path);

/* The newest live source named [name] (a new reference), or NULL: an
 * error another process raised names its place by file name (shardmap.c
 * under mpirun, where every process has read the same files). */
Source *src_find(const char *name);

void src_incref(Source *s);
void src_decref(Source *s);

/* Kinds of error, to let tests, the debugger and `--pm` tell them apart;
 * the printed message does not show the kind. */
typedef enum {
  ERR_NONE = 0,
  ERR_SYNTAX,     /* malformed source */
  ERR_NAME,       /* undefined name */
  ERR_TYPE,       /* wrong type, wrong number of arguments */
  ERR_VALUE,      /* bad value: shapes, specs, dtypes */
  ERR_INDEX,      /* index out of range */
  ERR_IO,         /* files */
  ERR_MEMORY,     /* out of memory, huge sizes */
  ERR_ASSERT,     /* assert statement */
  ERR_INTERRUPT,  /* Ctrl-C */
  ERR_COLLECTIVE, /* mismatched collectives across devices */
  ERR_QUIT,       /* the debugger's quit: unwinds silently */
  ERR_NOT_IMPLEMENTED, /* a rule a transformation needs is missing */
  ERR_ZERO_DIVISION,   /* Python numbers divided by zero */
  ERR_OVERFLOW,        /* Python ints past 64 bits */
  ERR_ATTRIBUTE,       /* no such attribute (Python's AttributeError) */
  ERR_FLOATING_POINT,  /* a NaN under jax_debug_nans (FloatingPointError) */
  ERR_SYSTEM_EXIT,     /* sys.exit() or raise SystemExit: ends the program (exceptions.h) */
} ErrKind;

/* Ctrl-C: set by the SIGINT handler (cli/main.c), polled between
 * statements, in loops, in collectives' waits and between the chunks of
 * long kernels (shm_interrupt_pending); whoever reports it as an
 * ERR_INTERRUPT error or a debugger stop clears it. */
extern atomic_int shm_interrupted;

/* Ctrl-C for the debugger instead (cli/debug.c sets [shm_interrupt_to_debugger]
 * once it has been entered): the SIGINT handler raises
 * [shm_debugger_interrupted], which only the debugger's statement hook
 * reads, so no kernel, loop or collective fails with "interrupted" while
 * the devices are being stopped where they are. */
extern atomic_int shm_interrupt_to_debugger, shm_debugger_interrupted;

static inline bool shm_interrupt_pending(void) {
  return atomic_load_explicit(&shm_interrupted, memory_order_relaxed) != 0;
}

/* Sets this thread's error to [kind] with a printf-style message and no
 * location, replacing any earlier one.  Always returns NULL so callers can
 * write `return err_set(...)`. */
void *err_set(ErrKind kind, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Like err_set, with the location [loc]. */
void *err_set_at(Loc loc, ErrKind kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The out-of-memory error's message, with its class's name as an uncaught
 * raise prints it (Python's MemoryError); `except MemoryError as e` sees
 * str(e) without the prefix, as for KeyError (exceptions.c). */
#define ERR_NOMEM_MSG "MemoryError: out of memory"

/* Sets the out-of-memory error (ERR_NOMEM_MSG) and returns NULL. */
void *err_nomem(void);

/* Fills in the location of the pending error if it has none yet. */
void err_locate(Loc loc);

/* True when this thread has a pending error. */
bool err_occurred(void);

/* The pending error's kind, message (borrowed, valid until the next
 * err_* call on this thread) and location. */
ErrKind err_kind(void);
const char *err_message(void);
Loc err_loc(void);

/* Clears the pending error. */
void err_clear(void);

/* The name of the class of the pending error, to print before its
 * message as Python prints an uncaught exception ("ZeroDivisionError:
 * division by zero"), or NULL when the message names its class already
 * (a `raise`, KeyError) or the class is not printed (see err_text).  The
 * language fills it (lang/exceptions.c: this layer does not know the
 * classes); while it is NULL messages print bare. */
extern const char *(*err_class_hook)(void);  /* hook */

/* The pending error's message as the user sees it: with its class's name
 * before it when err_class_hook gives one.  Borrowed, valid until the
 * next err_* call on this thread. */
const char *err_text(void);

/* One calling line of the traceback: where a function was called from,
 * and the function that was running there. */
typedef struct ErrFrame {
  Loc loc;              /* src is a counted reference */
  const char *fname;    /* interned or static */
  int depth;            /* the interpreter's call depth of the frame running it */
} ErrFrame;

/* Adds the calling line [loc] in function [fname], running at call depth
 * [depth], to the pending error's traceback, as the error leaves a
 * function called from there (the interpreter calls it as an error
 * unwinds, innermost first).  The same line at the same depth again (a
 * call that failed in a function it called: both add the line) is that
 * one line; at another depth it is a recursion, counted as Python's
 * "[Previous line repeated N more times]".  The traceback is cleared by a
 * new error and by err_clear; past 64 lines the rest are only counted. */
void err_push_frame(Loc loc, const char *fname, int depth);

/*
 * The frames an error left as it unwound, innermost first, each with a
 * counted reference to its scope, so that the debugger's pm() can show
 * them and their variables after the error was reported (Python's
 * sys.last_traceback).  This layer does not know what a scope is: the
 * evaluator sets the two functions below (err_scope_release drops a
 * reference and frees what only the scope itself kept alive); while they
 * are NULL no scope is kept.  Past 64 frames the outer ones are not kept.
 */
typedef struct ErrScope {
  Loc loc;              /* the statement the frame was running; src counted */
  const char *fname;    /* interned or static */
  void *scope;          /* counted, through err_scope_incref */
  int tag;              /* 0, or what err_state_tag_scopes set: rank + 1 of the
                           device whose frame it was */
} ErrScope;
extern void (*err_scope_incref)(void *scope);  /* hook */
extern void (*err_scope_release)(void *scope);  /* hook */

/* Adds the frame running [loc] in function [fname] with scope [scope]
 * (borrowed; a reference is taken) to the pending error, as the error
 * leaves it.  Nothing for the debugger's quit, or without an error. */
void err_push_scope(Loc loc, const char *fname, void *scope);

/* The pending error's kept frames (borrowed, innermost first) and their
 * number. */
int err_scopes(const ErrScope **out);

/* Moves the pending error of this thread, its traceback with it, into
 * [*saved] (clearing it here) and back; used to carry a device thread's
 * error to the main thread.  err_state_free releases a saved one that is
 * not restored. */
typedef struct ErrState {
  ErrKind kind;
  char *msg;        /* owned */
  Loc loc;          /* src is a counted reference */
  ErrFrame *trace;  /* owned: innermost first */
  int ntrace, dropped;
  ErrScope *scopes; /* owned: innermost first (scopes counted) */
  int nscopes;
} ErrState;
void err_save(ErrState *saved);
void err_restore(ErrState *saved);
void err_state_free(ErrState *saved);

/* A copy of [s] (new references): re-raising a handled error. */
ErrState err_state_copy(const ErrState *s);

/* Sets [tag] on the frames of [s] that have none: a device thread's error
 * marks its frames with rank + 1 as it moves to the main thread. */
void err_state_tag_scopes(ErrState *s, int tag);

/* Prints the pending error to [out] in the §9 form: Python's traceback of
 * the calling lines ("Traceback (most recent call last):", each as
 * `  File "f.shm", line N, in fn` and its source line) when it has one,
 * then the located message with the source line and a caret. */
void err_print(FILE *out);

/* Prints the source line of [loc] and a caret under its column, as the two
 * lines below an error message (also used by the debugger's `list`). */
void err_print_caret(FILE *out, Loc loc);

#endif
