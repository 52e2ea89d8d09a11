/*
 * dap.h - `shmap --dap`: the debugger (debug.h) behind the Debug Adapter
 * Protocol, so that an editor (VS Code, nvim-dap, ...) drives it over
 * standard input and output.  The protocol is Microsoft's
 * (microsoft.github.io/debug-adapter-protocol): messages framed by a
 * `Content-Length` header, JSON bodies (json-c).
 *
 * The adapter is another front end to the terminal debugger's engine: the
 * same hooks, the same all-stop of a shard_map call (LANGUAGE.md §7, a
 * stop is a rendezvous), the same evaluation in a frame.  Devices are the
 * protocol's threads (device rank r is thread 1000 + r, named by its mesh
 * coordinates "(i=0, j=1)"); outside a shard_map call the one thread is
 * the main thread, 1.  Every stop stops all threads.  What the program
 * and the debugger write to standard output and error reaches the editor
 * as `output` events, a line each (a device's lines prefixed by its
 * coordinates, as shard_map prints them).  shmap(1), DEBUG ADAPTER, lists
 * the requests and what each does.
 *
 * Use, from main.c: dap_open, dap_launch (the program to run), then the
 * interpreter's start-up with dap_configure before dbg_init, the program,
 * dap_end with its exit status, and dap_close.  Main thread only.
 */
#ifndef SHMAP_DAP_H
#define SHMAP_DAP_H

#include <stdbool.h>

/* What the client's `launch` request asks for; strings owned by the
 * adapter until dap_close. */
typedef struct DapLaunch {
  const char *program;   /* the script's path */
  int nargs;             /* its arguments (argv[1:]) */
  char **args;
  int devices;           /* `devices`, 0 when not given */
  bool stop_on_entry;    /* `stopOnEntry`: stop before the first statement */
} DapLaunch;

/* Takes over standard input and output for the protocol: standard input
 * becomes /dev/null for the program, standard output and error become one
 * pipe whose lines go out as `output` events, in the order written.
 * Starts the threads that read requests and output.  0, or -1 after
 * saying why on stderr. */
int dap_open(void);

/* Serves `initialize` and waits for `launch`, whose arguments fill [*l]
 * (`env` is set in this process's environment, `cwd` becomes the current
 * folder).  0; 1 when the client left or asked for something else first
 * (the exit status). */
int dap_launch(DapLaunch *l);

/* Sends `initialized` and serves the configuration requests
 * (setBreakpoints, setExceptionBreakpoints, ...) until
 * `configurationDone`; makes the adapter the debugger's front end.
 * [*post_mortem] is set when the uncaught-errors filter is on (--pm's
 * post-mortem stop).  Before dbg_init.  0, or -1 with the error set when
 * the client left. */
int dap_configure(bool *post_mortem);

/* The program ended with exit status [rc]: sends its last output,
 * `exited` and `terminated`, and serves requests until `disconnect` or the
 * end of input. */
void dap_end(int rc);

/* Gives standard output and error back (to /dev/null), stops the
 * adapter's threads and frees what it holds. */
void dap_close(void);

#endif
