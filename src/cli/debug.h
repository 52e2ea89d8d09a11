/*
 * debug.h - the pdb-like debugger (LANGUAGE.md §7), and debug_print.
 *
 * ENTERING.  `breakpoint()` stops at the next statement of the thread that
 * called it; `shmap --debug` stops before the first statement of the
 * script; `shmap --pm` opens the debugger after an uncaught error, in the
 * frame (and on the device) where the error was raised; pm() (pdb.pm())
 * does so for the REPL's last uncaught error, from the frames and scopes
 * the error kept as it unwound (ErrScope, base/error.h), so nothing is
 * recorded per statement.  `restart` ends the program as quit does and
 * main.c runs it again (dbg_take_restart).  The commands are
 * pdb's, with pdb's meanings and output shapes; see dbg_help_text in
 * debug.c and shmap(1), DEBUGGER.  Any line at the `(shmap-dbg) ` prompt
 * whose first word is not a command runs as statements in the current
 * frame (`!` forces that, as in pdb).
 *
 * WHERE THINGS RUN.  The debugger sees the program only through
 * eval_stmt_hook, called before every statement on every thread, and
 * eval_return_hook, called as a user function returns (pdb's --Return--
 * stop, where `retval` prints the value; a device parks there as at a
 * statement).  The prompt (GNU readline on a terminal) runs on the main
 * thread only, and so does every evaluation the user asks for: `p x` in a
 * device's frame reads that device's scope from the main thread while the
 * device is parked, except a line that calls a collective, which every
 * parked device runs on its own thread at once (it needs them all).  The
 * one change the debugger makes to how the program runs is pdb's `jump`:
 * the hook returns EVAL_HOOK_JUMP (eval.h) and the block goes on at the
 * target; inside a body every device parked at the statement returns it
 * from its own hook as it is released.
 *
 * ALL-STOP.  A shard_map call made while the debugger is installed runs
 * through dbg_coll_run: coll_run moves to a helper thread, and the main
 * thread waits for either the end of the call or a stop.  A device stops
 * ("parks") in the hook when its own command says so (step, next, ...), at
 * a breakpoint, or because another device hit a breakpoint (all-stop: a
 * breakpoint parks every device at its next statement).  The main thread
 * shows the prompt once every device is parked, has returned from the
 * body, or waits inside a collective; such a device counts as stopped at
 * its collective (coll_waiting_str) and moves on once the peers it waits
 * for are released and arrive.  `quit` releases the parked devices with
 * ERR_QUIT and aborts the group (coll_group_abort), so no device waits for
 * ever.  Device print output is written out, in device order, every time
 * the devices stop (LANGUAGE.md §4).
 *
 * Locking (debug.c): one mutex, dbg_state.lock, guards the breakpoint table and
 * the state of the running call (each device's park state, the stop and
 * quit flags, the release generation); one condition variable, dbg_state.cond,
 * is broadcast whenever that state changes.  No other lock is taken while
 * dbg_state.lock is held, except CollGroup.lock inside coll_waiting_str and
 * coll_group_abort (which take no lock of ours).
 */
#ifndef SHMAP_DEBUG_H
#define SHMAP_DEBUG_H

#include <stdbool.h>

#include "spmd/collective.h"
#include "lang/eval.h"

/*
 * Installs the debugger: binds `breakpoint` and `debug_print` in
 * [builtins] and sets eval_stmt_hook and eval_return_hook.  [debug]
 * stops before the next statement the main thread runs (the script's
 * first, for --debug); [post_mortem] (--pm) keeps, on every thread, the
 * views of its frames that dbg_post_mortem needs.  Main thread, at
 * start-up, after interp_init.  Returns 0, or -1 with the error set.
 */
int dbg_init(Env *builtins, bool debug, bool post_mortem);

/*
 * Post-mortem (--pm): with an uncaught error pending, prints it (to
 * stderr, in the LANGUAGE.md §9 form) and opens the debugger in the frame
 * where it was raised: on the device named by the error's "on device
 * (...)" prefix when a shard_map body raised it, else on the main thread.
 * When the user continues or quits, the error is replaced by the
 * debugger's silent ERR_QUIT, so the caller's usual report prints nothing
 * twice (and the exit status stays 1).  Does nothing when --pm was not
 * given to dbg_init, for the debugger's own quit, or when no frame was
 * kept (an error before the first statement, such as a syntax error).
 */
void dbg_post_mortem(void);

/*
 * shard_map's hook: runs fn(rank, ctx) on every device of [g] (whose mesh
 * is [mesh], borrowed for the call) as coll_run(g, fn, ctx) would, and
 * returns what it returns (0, or -1 with the first failing device's error
 * set on this thread), while letting the debugger stop all devices
 * together.  [outs] are the devices' print
 * buffers (one per rank, as set by fn with eval_set_output): the
 * debugger writes out and empties those of stopped devices, each line
 * prefixed with the device's mesh coordinates, as the end of the call
 * would.  Without dbg_init this is plain coll_run.  Main thread only.
 */
int dbg_coll_run(CollGroup *g, const MeshDesc *mesh, void (*fn)(int rank, void *ctx),
                 void *ctx, OutBuf *outs);

/*
 * Keeps the pending error, which nothing handled and which has just been
 * reported, as the session's last error for pm() and pdb.pm() (Python's
 * sys.last_traceback): with it the scopes of the frames it left, which
 * stay alive (and keep their values' memory) until the next kept error
 * replaces it or dbg_free.  Clears the error; the debugger's quit is not
 * kept.  Main thread (the REPL, and main.c before -i's REPL).
 */
void dbg_keep_error(void);

/* Whether the debugger's `restart` (pdb's, alias `run`) may re-run the
 * program: main.c turns it on while a script or -c code runs; at the
 * REPL it is off and `restart` says it is not available.  Main thread. */
void dbg_set_restartable(bool on);

/*
 * After the program ended with the debugger's silent ERR_QUIT: true when
 * that quit was `restart`, the request being taken then (a second call
 * returns false).  [*args] is set to the command's arguments, which are
 * to become argv[1:] (shm_malloc'd, the caller frees it), or NULL to keep
 * argv.  The next run stops before its first statement, as pdb's restart
 * does.  Main thread.
 */
bool dbg_take_restart(char **args);

/* A restart made [new_globals] the module scope instead of [old_globals]:
 * the displays set at module level move to it (and show at the next
 * stop).  Main thread; raises nothing. */
void dbg_restarted(Env *old_globals, Env *new_globals);

/* Releases the breakpoints, displays and kept frame views.  Main thread,
 * at exit; the hook is removed. */
void dbg_free(void);

/*
 * THE JIT CONTRACT.  debug_print(fmt, *args) is print(fmt.format(*args)):
 * inside a shard_map body one line per device, prefixed by its mesh
 * coordinates.  While jit traces it (an argument is a tracer), it stages
 * the primitive debug_callback (prim.def) instead, with trace_emit:
 *
 *     debug_callback[callback=C] x1 ... xn     (no results)
 *
 * whose operands are the traced arguments and whose parameter `callback`
 * is a callable: when the plan runs, the executor calls C(x1, ..., xn)
 * with the concrete arrays (borrowed) on the thread running the plan; C
 * formats and writes the line, and returns None (or NULL with the error
 * set).  breakpoint() called while tracing stages the same primitive, its
 * operands the traced locals of the frame; C then stops in a frame that
 * binds the frame's locals to their concrete values, as
 * jax.debug.breakpoint does (all devices stop together in a jit
 * shard_map body).  The plan executor (compile.c) makes the call.
 */

#endif
