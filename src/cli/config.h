/*
 * config.h - the process-wide options and the YAML configuration file.
 *
 * Options come from four places; a later one overrides an earlier one:
 *
 *     built-in defaults  <  config file  <  environment  <  command line
 *
 * The config file is $SHMAP_CONFIG if that is set (the empty string means
 * "read no file at all", which the --test runner uses so a user's file
 * cannot change test results), else $XDG_CONFIG_HOME/shmap/config.yaml,
 * else ~/.config/shmap/config.yaml.  A missing default file is fine; a
 * missing file named by $SHMAP_CONFIG is an error, since the user asked
 * for it.  The file is one YAML mapping; every key is optional:
 *
 *     print:
 *       precision: 8        # digits after the point, >= 0
 *       threshold: 1000     # summarise arrays with more elements, >= 0
 *       edgeitems: 3        # items kept at each end when summarised, >= 0
 *       linewidth: 75       # characters per line, >= 1
 *       suppress: false     # print tiny floats as 0. (true/false)
 *     history:
 *       size: 1000          # REPL history entries kept, >= 0 (0: no file)
 *       file: ~/.shmap_history
 *     memory:
 *       buffer_cache_mib: 256  # released large buffers kept for reuse, MiB
 *     jit:
 *       cache_size: 64      # traced signatures kept per jit function
 *     devices: 8            # device threads, 1..CFG_MAX_DEVICES
 *
 * A bad file (YAML syntax error, unknown key, wrong type, value out of
 * range) is an error that names the file, line and column:
 *     config.yaml:3:5: error: devices must be a positive integer
 * It is never ignored silently: the interpreter refuses to start.  So is
 * a key given twice, a second YAML document, and a file larger than
 * CFG_MAX_BYTES (refused before parsing).
 */
#ifndef SHMAP_CONFIG_H
#define SHMAP_CONFIG_H

#include <stdbool.h>

#include "array/print.h"

/* Upper bound on --devices: each device is a thread living for the whole
 * run, and a typo such as 80000 should be an error, not a hang. */
#define CFG_MAX_DEVICES 1024

/* Default device count (LANGUAGE.md §3). */
#define CFG_DEFAULT_DEVICES 8

/* The largest configuration file read (bytes); a larger one is refused
 * before it is parsed. */
#define CFG_MAX_BYTES (64 * 1024)

/* Default jit.cache_size (transform/jit.h's JIT_CACHE_DEFAULT; cli/main.c
 * passes the option on). */
#define CFG_DEFAULT_JIT_CACHE 64

/* Default number of REPL history entries kept. */
#define CFG_DEFAULT_HISTORY 1000

/*
 * The options of this run, after every source has been merged.  Set up by
 * main() before the interpreter starts and read-only afterwards, so any
 * thread may read it.  The debugger reads [debug] and [post_mortem].
 */
typedef struct ShmOptions {
  int devices;          /* number of device threads */
  bool debug;           /* --debug: enter the debugger before line 1 */
  bool post_mortem;     /* --pm: enter the debugger on an uncaught error */
  bool dump_plans;      /* --dump-plans: print each plan when it is staged */
  bool verbose;         /* --verbose: say what the interpreter is doing */
  bool interactive;     /* the REPL runs (no script, or -i) */
  PrintOptions print;   /* print: section; copied into print_options */
  int history_size;     /* history.size */
  int buffer_cache_mib; /* memory.buffer_cache_mib: released array buffers
                           kept for reuse, in MiB (mem.h) */
  int jit_cache_size;   /* jit.cache_size: signatures kept per jit function */
  char *history_file;   /* history.file, ~ expanded; NULL: the default */
  char *config_file;    /* the config file that was read, or NULL */
} ShmOptions;

/* This run's options (config.c).  Zero until cfg_defaults() is called. */
extern ShmOptions shm_options;

/* Fills [o] with the built-in defaults; print options are taken from
 * print.h's print_options, whose initial value is the NumPy default. */
void cfg_defaults(ShmOptions *o);

/* The config file to read, as a new shm_malloc'd string, or NULL when
 * there is none to read (SHMAP_CONFIG is empty, or HOME is unset). */
char *cfg_default_path(void);

/*
 * Reads the YAML file [path] into [o], overriding only the keys it sets.
 * When [must_exist] is false a missing file is not an error.  Returns 0,
 * or -1 with the error set (ERR_VALUE or ERR_IO): its location is the
 * offending node's line and column in the file, so err_print() shows
 * "path:line:col: error: message" with the line and a caret.
 */
int cfg_load(ShmOptions *o, const char *path, bool must_exist);

/*
 * Reads the config file that applies to this process (cfg_default_path;
 * must exist only if named by $SHMAP_CONFIG) into [o].  0 or -1 with the
 * error set.
 */
int cfg_load_default(ShmOptions *o);

/*
 * Parses a device count given as text (the --devices argument, or the
 * environment variable SHMAP_DEVICES): a decimal integer in
 * 1..CFG_MAX_DEVICES.  Returns it, or -1 (no error set) if [s] is not one.
 */
int cfg_parse_devices(const char *s);

/* Releases the strings [o] owns and resets them to NULL. */
void cfg_free(ShmOptions *o);

#endif
