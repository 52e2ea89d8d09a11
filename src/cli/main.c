/*
 * main.c - the command line: parse it into a CmdLine, merge the options
 * (config.h), then dispatch to a script, -c code, the REPL or the --test
 * runner.  Everything the flags mean is in man/shmap.1.
 *
 * Exit status: 0 success, 1 an error in the program (or its config),
 * 2 bad command-line usage.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/config.h"
#include "cli/dap.h"
#include "cli/debug.h"
#include "base/error.h"
#include "lang/eval.h"
#include "lang/exceptions.h"
#include "base/intern.h"
#include "array/linalg.h"
#include "base/mem.h"
#include "array/print.h"
#include "cli/repl.h"
#include "cli/testrun.h"
#include "cli/timeline_out.h"
#include "base/timeline.h"
#include "spmd/device.h"
#include "spmd/mesh.h"
#include "spmd/sharding.h"
#include "spmd/shardmap.h"
#include "spmd/transport.h"
#include "transform/control.h"
#include "transform/ad.h"
#include "transform/batch.h"
#include "transform/custom_derivatives.h"
#include "transform/xmap.h"
#include "transform/jit.h"
#include "transform/aot.h"
#include "cli/calibrate.h"

#ifndef SHMAP_VERSION
#define SHMAP_VERSION "unknown"
#endif

enum { EXIT_USAGE = 2 };

/* What the command line asks for. */
typedef enum {
  RUN_REPL,     /* no script: interactive */
  RUN_SCRIPT,   /* a script file, or "-" for stdin */
  RUN_CODE,     /* -c CODE */
  RUN_TEST,     /* --test FILE... */
  RUN_DAP,      /* --dap: the script comes from the debug adapter's launch */
  RUN_HELP,
  RUN_VERSION,
} RunMode;

/* The parsed command line; strings borrow argv. */
typedef struct CmdLine {
  RunMode mode;
  const char *target;   /* script path, "-", or the -c code */
  int nrest;            /* script arguments, or --test paths */
  char **rest;
  int devices;          /* --devices, 0 when not given */
  bool interactive;     /* -i */
  bool debug, post_mortem, dump_plans, verbose;
  const char *trace;    /* --trace FILE: the timeline's file */
  bool comm_stats;      /* --comm-stats */
  const char *estimate; /* --estimate PROFILE: predicted time of each jit plan */
  bool dap;             /* run under the debug adapter (dap.h) */
} CmdLine;

static const char USAGE[] = "usage: shmap [options] [script.shm | -] [args...]\n";

static const char HELP[] =
    "Run a shmap program, or start the interactive interpreter.\n"
    "\n"
    "  script.shm           run this file; the arguments after it are argv[1:]\n"
    "  -                    read the program from standard input\n"
    "  -c CODE              run CODE\n"
    "  -i                   start the REPL after the script or -c CODE\n"
    "      --devices N      run N device threads (default 8; SHMAP_DEVICES)\n"
    "      --debug          stop in the debugger before the first statement\n"
    "      --pm             enter the debugger when an error is not caught\n"
    "      --dump-plans     print each jit plan when it is staged\n"
    "      --verbose        say what the interpreter is doing, on stderr\n"
    "      --trace FILE     write a timeline of statements, primitives and\n"
    "                       collectives per device (Perfetto, chrome://tracing)\n"
    "      --comm-stats     print bytes and time per collective, mesh axes and\n"
    "                       line at exit, on stderr\n"
    "      --estimate PROFILE\n"
    "                       predict each compiled plan's step time on the\n"
    "                       hardware of PROFILE (YAML), on stderr at exit\n"
    "      --calibrate      measure this machine: print its hardware profile\n"
    "      --dap            be a debug adapter (Debug Adapter Protocol) on\n"
    "                       standard input and output, for an editor\n"
    "      --test FILE...   run test scripts (or directories of them) and\n"
    "                       compare with the output written in them\n"
    "  -h, --help           show this help and exit\n"
    "      --version        show the version and the BLIS architecture\n"
    "\n"
    "Environment: SHMAP_DEVICES, SHMAP_PATH, SHMAP_CONFIG.  See shmap(1) for\n"
    "the program and shmap(7) for the language.\n";

/* Reports bad usage on stderr, with the usage line; returns -1. */
static int usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("shmap: error: ", stderr);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fprintf(stderr, "\n%sTry 'shmap --help' for more information.\n", USAGE);
  return -1;
}

/* ---- parsing the command line -------------------------------------------- */

/* The value of an option given as "--name=value" or "--name value"; NULL
 * when missing.  Advances *i past a separate value. */
static const char *option_value(int argc, char **argv, int *i, const char *name) {
  size_t n = strlen(name);
  if (argv[*i][n] == '=') return argv[*i] + n + 1;
  return *i + 1 < argc ? argv[++*i] : NULL;
}

/* True when argv[i] is the long option [name], alone or as "name=...". */
static bool is_option(const char *arg, const char *name) {
  size_t n = strlen(name);
  return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

/* Handles the flags that take no value; false if [arg] is not one. */
static bool parse_flag(CmdLine *cl, const char *arg) {
  if (strcmp(arg, "-i") == 0) cl->interactive = true;
  else if (strcmp(arg, "--debug") == 0) cl->debug = true;
  else if (strcmp(arg, "--pm") == 0) cl->post_mortem = true;
  else if (strcmp(arg, "--dump-plans") == 0) cl->dump_plans = true;
  else if (strcmp(arg, "--verbose") == 0) cl->verbose = true;
  else if (strcmp(arg, "--comm-stats") == 0) cl->comm_stats = true;
  else if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) cl->mode = RUN_HELP;
  else if (strcmp(arg, "--version") == 0) cl->mode = RUN_VERSION;
  else if (strcmp(arg, "--dap") == 0) cl->mode = RUN_DAP;
  else return false;
  return true;
}

/* Handles the option at argv[*i]; -1 after reporting bad usage, 1 when
 * the options end here (a script, -c, --test), 0 to go on. */
static int parse_option(CmdLine *cl, int argc, char **argv, int *i) {
  const char *arg = argv[*i];
  if (parse_flag(cl, arg)) return 0;
  if (is_option(arg, "--trace")) {
    if (!(cl->trace = option_value(argc, argv, i, "--trace")) || !*cl->trace)
      return usage_error("--trace needs a file name");
    return 0;
  }
  if (is_option(arg, "--estimate")) {
    if (!(cl->estimate = option_value(argc, argv, i, "--estimate")) || !*cl->estimate)
      return usage_error("--estimate needs a hardware profile (a YAML file)");
    return 0;
  }
  if (strcmp(arg, "--calibrate") == 0) {
    cl->mode = RUN_CODE;
    cl->target = calibrate_program;
    return 1;
  }
  if (is_option(arg, "--devices")) {
    const char *v = option_value(argc, argv, i, "--devices");
    if (!v) return usage_error("--devices needs a number");
    cl->devices = cfg_parse_devices(v);
    if (cl->devices < 0)
      return usage_error("--devices must be an integer from 1 to %d, not '%s'",
                         CFG_MAX_DEVICES, v);
    return 0;
  }
  if (strcmp(arg, "-c") == 0) {
    if (*i + 1 >= argc) return usage_error("-c needs the code to run");
    cl->mode = RUN_CODE;
    cl->target = argv[++*i];
    return 1;
  }
  if (strcmp(arg, "--test") == 0) {
    cl->mode = RUN_TEST;
    return 1;
  }
  return usage_error("unknown option '%s'", arg);
}

/* Fills [cl] from argv.  0, or EXIT_USAGE after reporting the problem. */
static int parse_cmdline(int argc, char **argv, CmdLine *cl) {
  memset(cl, 0, sizeof *cl);
  cl->mode = RUN_REPL;
  int i = 1;
  for (; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--") == 0) {
      i++;
      break;
    }
    if (arg[0] != '-' || strcmp(arg, "-") == 0) break;
    int r = parse_option(cl, argc, argv, &i);
    if (r < 0) return EXIT_USAGE;
    if (r > 0) {
      i++;
      break;
    }
    if (cl->mode == RUN_HELP || cl->mode == RUN_VERSION) return 0;
  }
  if (cl->mode == RUN_REPL && i < argc) {
    cl->mode = RUN_SCRIPT;
    cl->target = argv[i++];
  }
  cl->nrest = argc - i;
  cl->rest = argv + i;
  if (cl->mode == RUN_TEST && cl->nrest == 0) {
    usage_error("--test needs at least one file or directory");
    return EXIT_USAGE;
  }
  return 0;
}

/* ---- options, environment, config --------------------------------------- */

/* The name errors of the program's source carry ("<string>" for -c), or
 * NULL for the REPL: set once the command line is read. */
static const char *program_name;

/* Prints the pending error (unless it is the debugger's silent quit).
 * Memory that runs out outside any line of the program (starting the
 * interpreter, reading the source) is still the program's failure: the
 * message names the program, the place a failed run is looked for. */
static void print_error(void) {
  if (err_kind() == ERR_MEMORY && !err_loc().src && program_name)
    fprintf(stderr, "%s: error: %s\n", program_name, err_message());
  else
    err_print(stderr);
}

/* Prints the pending error and clears it; returns 1, the exit status of
 * a failed program. */
static int report_error(void) {
  fflush(stdout);
  print_error();
  err_clear();
  return 1;
}

/* Merges defaults < config file < environment < command line into
 * shm_options.  0, or an exit status after reporting the problem. */
static int merge_options(const CmdLine *cl) {
  cfg_defaults(&shm_options);
  if (cfg_load_default(&shm_options) < 0) return report_error();
  const char *env = getenv("SHMAP_DEVICES");
  if (env && *env) {
    int n = cfg_parse_devices(env);
    if (n < 0) {
      fprintf(stderr, "shmap: error: SHMAP_DEVICES must be an integer from 1 to %d, not '%s'\n",
              CFG_MAX_DEVICES, env);
      return EXIT_USAGE;   /* the same mistake as --devices abc, the same status */
    }
    shm_options.devices = n;
  }
  if (cl->devices > 0) shm_options.devices = cl->devices;
  shm_options.debug = cl->debug;
  shm_options.post_mortem = cl->post_mortem;
  shm_options.dump_plans = cl->dump_plans;
  shm_options.verbose = cl->verbose;
  shm_options.interactive = cl->mode == RUN_REPL || cl->interactive;
  print_options = shm_options.print;
  shm_buf_cache_limit((size_t)shm_options.buffer_cache_mib << 20);
  jit_set_cache_size(shm_options.jit_cache_size);
  return 0;
}

/* ---- signals ------------------------------------------------------------- */

/* Ctrl-C asks the evaluator (and the REPL's line reader) to stop by
 * setting shm_interrupted.  In a script, a second Ctrl-C that arrives
 * before the first was noticed (a long kernel) ends the process the
 * default way, so a run can always be stopped. */
static void on_sigint(int sig) {
  if (atomic_load(&shm_interrupt_to_debugger)) {   /* the debugger stops the program */
    atomic_store(&shm_debugger_interrupted, 1);
    return;
  }
  if (atomic_exchange(&shm_interrupted, 1) && !shm_options.interactive) {
    signal(sig, SIG_DFL);
    raise(sig);
  }
}

/* Under mpirun, Ctrl-C reaches mpirun, which ends the job by sending
 * every process SIGTERM and, a second later, SIGKILL (Open MPI's
 * odls_base_sigkill_timeout): SIGTERM is then Ctrl-C, so the program
 * stops with the error a one-process run gives (process 0 writes it)
 * before the SIGKILL.  It only sets the flag, never ends the process the
 * default way: a terminal's SIGINT to the processes themselves may have
 * come first, and the SIGKILL bounds the wait anyway. */
static void on_sigterm(int sig) {
  (void)sig;
  atomic_store(&shm_interrupted, 1);
}

/* Installed without SA_RESTART: a blocking read returns EINTR, so the
 * REPL sees the flag at once.  Under mpirun also SIGTERM (on_sigterm),
 * and before MPI starts: mpirun may end the job while this process is
 * still starting, after another one has begun the program, and this
 * one must then stop as the others do, with an exit status of its own
 * rather than by the signal. */
static void install_sigint(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  if (transport_launched(NULL) <= 1) return;
  sa.sa_handler = on_sigterm;
  sigaction(SIGTERM, &sa, NULL);
}

/* ---- running programs ---------------------------------------------------- */

/* Fills shm_interp->argv (the script name, then its arguments, like
 * sys.argv) and binds it as `argv` in [globals]. */
static int set_argv(const CmdLine *cl, Env *globals) {
  const char *name = cl->mode == RUN_CODE ? "-c" : cl->mode == RUN_SCRIPT ? cl->target : "";
  Value *s = str_from(name);
  if (!s || list_append_steal(shm_interp->argv, s) < 0) return -1;
  for (int i = 0; i < cl->nrest; i++) {
    if (!(s = str_from(cl->rest[i])) || list_append_steal(shm_interp->argv, s) < 0) return -1;
  }
  return env_set(globals, intern_cstr("argv"), shm_interp->argv);
}

/* Reads all of standard input into a source named "<stdin>". */
static Source *source_from_stdin(void) {
  size_t len = 0, cap = 4096;
  char *text = shm_malloc(cap);
  while (text) {
    size_t n = fread(text + len, 1, cap - len - 1, stdin);
    if (n == 0) break;
    len += n;
    if (len + 1 < cap) continue;
    char *bigger = shm_realloc(text, cap * 2);
    if (!bigger) shm_free(text);
    text = bigger;
    cap *= 2;
  }
  if (!text) return err_nomem();
  text[len] = '\0';
  Source *src = src_new("<stdin>", text);
  shm_free(text);
  return src;
}

/* The source the command line names, or NULL with the error set. */
static Source *program_source(const CmdLine *cl) {
  if (cl->mode == RUN_CODE) return src_new("<string>", cl->target);
  if (strcmp(cl->target, "-") == 0) return source_from_stdin();
  return src_from_file(cl->target);
}

/* Drops the top-level scope; clearing it first frees the functions
 * defined there, which hold the scope as their closure. */
static void release_globals(Env *globals) {
  if (!globals) return;
  env_clear(globals);
  env_decref(globals);
}

/* Runs [src] once in [globals]; 0 or an exit status: sys.exit()'s
 * (SystemExit is not an error to report, but for -i's REPL to come),
 * else 1 after an error. */
static int run_once(Source *src, Env *globals) {
  if (shm_options.verbose) fprintf(stderr, "shmap: running %s\n", src->name);
  int rc = 0;
  if (eval_source(src, globals, false) < 0) {
    fflush(stdout);
    if (err_kind() == ERR_SYSTEM_EXIT && !shm_options.interactive) {   /* -i reports it, as python -i */
      rc = exc_exit_status(stderr);
    } else {
      dbg_post_mortem();  /* with --pm: the debugger, where the error was raised */
      fflush(stdout);
      print_error();
      if (shm_options.interactive) dbg_keep_error();   /* for pm() at -i's REPL */
      rc = 1;
    }
    err_clear();
  }
  fflush(stdout);
  return rc;
}

/* Replaces argv[1:] with the blank-separated words of [args]. */
static int reset_argv(const char *args) {
  Value *argv = shm_interp->argv;
  if (list_splice(argv, 1, list_len(argv) - 1, 0, NULL) < 0) return -1;
  char *copy = shm_strdup(args), *save = NULL;
  if (!copy) return err_nomem(), -1;
  int rc = 0;
  for (char *w = strtok_r(copy, " \t", &save); w && rc == 0; w = strtok_r(NULL, " \t", &save)) {
    Value *v = str_from(w);
    rc = v ? list_append_steal(argv, v) : -1;
  }
  shm_free(copy);
  return rc;
}

/* The debugger's restart: pdb's message, then [*globals] is replaced by a
 * fresh module scope binding argv (new arguments when [args] gives
 * some); the old scope is released as at exit. */
static int restart_globals(const char *name, Env **globals, const char *args) {
  if (args && reset_argv(args) < 0) return -1;
  printf("Restarting %s with arguments:\n\t", name);
  Value *argv = shm_interp->argv;
  for (size_t i = 1; i < list_len(argv); i++) {
    Value *a = list_get(argv, i);
    printf("%s%s", i > 1 ? " " : "", a->type == V_STR ? str_cstr(a) : "?");
  }
  printf("\n");
  fflush(stdout);
  Env *g = env_new(NULL);
  if (!g || env_set(g, intern_cstr("argv"), argv) < 0) {
    if (g) env_decref(g);
    return -1;
  }
  dbg_restarted(*globals, g);
  release_globals(*globals);
  *globals = g;
  return 0;
}

/* Runs the script or -c code in [*globals], again from the start each
 * time the debugger's `restart` ends it (a script file is read again, as
 * pdb does; -c code and standard input are run again as first read);
 * 0 or an exit status. */
static int run_program(const CmdLine *cl, Env **globals) {
  Source *src = program_source(cl);
  if (!src) return report_error();
  dbg_set_restartable(true);
  int rc;
  char *args;
  while ((rc = run_once(src, *globals)) != 0 && dbg_take_restart(&args)) {
    bool reread = cl->mode == RUN_SCRIPT && strcmp(cl->target, "-") != 0;
    Source *next = reread ? program_source(cl) : src;
    if (next && reread) src_decref(src);
    int ok = next ? restart_globals(next->name, globals, args) : -1;
    shm_free(args);
    if (ok < 0) {
      rc = report_error();
      break;
    }
    src = next;
  }
  dbg_set_restartable(false);
  src_decref(src);
  return rc;
}

static void say_verbose(void) {
  if (!shm_options.verbose) return;
  fprintf(stderr, "shmap: %d devices; config file: %s\n", shm_options.devices,
          shm_options.config_file ? shm_options.config_file : "(none)");
}


/* Registers the layers above lang/ with the evaluator and the primitive
 * table, bottom to top (src/README.md): spmd's meshes, shard_map and
 * collectives, then transform's control flow and jit; then starts the
 * device threads. */
static int register_layers(int ndevices) {
  Env *b = shm_interp->builtins;
  if (mesh_register(b) < 0 || sharding_register(b) < 0 || shardmap_register(b) < 0 || ctl_register(b) < 0 ||
      jit_register(b) < 0 || ad_register(b) < 0 ||
      batch_register(b) < 0 || custom_register(b) < 0 || xmap_register(b) < 0)
    return -1;
  return dev_start(ndevices);
}

/* --trace FILE: each process writes its own file (timeline_path). */
static int write_trace(const char *file) {
  char *path = timeline_path(file, transport_rank());
  int rc = path ? timeline_write(path, transport_rank()) : (err_nomem(), -1);
  shm_free(path);
  return rc;
}

/* A process other than 0 of an MPI job writes nothing the user sees (the
 * processes run one program: process 0 speaks for all), but its standard
 * error goes to an unnamed temporary file, from which departed_why reads
 * its error line for the others.  False when /dev/null cannot be opened. */
static bool quiet_process(void) {
  if (!freopen("/dev/null", "w", stdout)) return false;
  FILE *t = tmpfile();
  bool kept = t && dup2(fileno(t), STDERR_FILENO) >= 0;
  if (t) fclose(t);
  return kept || freopen("/dev/null", "w", stderr);
}

/* The last line of this process's error messages (quiet_process's file),
 * into [buf] of [cap] bytes ("" when none): why it ended, which its BYE
 * tells the processes that may still wait for it. */
static const char *departed_why(char *buf, size_t cap) {
  buf[0] = '\0';
  fflush(stderr);
  off_t end = lseek(STDERR_FILENO, 0, SEEK_END);
  if (end <= 0) return buf;
  char tail[4096];
  off_t from = end > (off_t)sizeof tail - 1 ? end - (off_t)sizeof tail + 1 : 0;
  ssize_t n = pread(STDERR_FILENO, tail, sizeof tail - 1, from);
  if (n <= 0) return buf;
  tail[n] = '\0';
  for (char *line = strtok(tail, "\n"); line; line = strtok(NULL, "\n"))
    if (strstr(line, "error: ")) snprintf(buf, cap, "%s", line);
  return buf;
}

/* Under mpirun (LANGUAGE.md section 12): starts the transport, which gives
 * this process its share of the devices, and keeps the standard output
 * and error of process 0 only, since every process runs the whole
 * program.  The REPL and the debugger read the terminal, and a program
 * read from standard input would be read by process 0 alone (mpirun gives
 * the others none, so they would run an empty program): refused.  Returns
 * the number of device threads to start, or -1 after reporting. */
static int start_processes(const CmdLine *cl) {
  int local = transport_init(shm_options.devices);
  if (local < 0) return report_error(), -1;
  if (!transport_active()) return local;
  const char *why = NULL;
  if (shm_options.interactive || shm_options.debug || shm_options.post_mortem || cl->dap)
    why = "the REPL, -i, --debug, --pm and --dap need one process: under mpirun only process 0 "
          "has the terminal";
  else if (cl->mode == RUN_SCRIPT && strcmp(cl->target, "-") == 0)
    why = "a program read from standard input needs one process: under mpirun only "
          "process 0 reads it (give the script's path, or -c)";
  if (why) {
    if (transport_rank() == 0) fprintf(stderr, "shmap: error: %s\n", why);
    return -1;
  }
  if (transport_rank() != 0 && !quiet_process()) return -1;
  return local;
}

/* A program started with its standard output closed: /dev/null takes
 * descriptor 1, so that no file the program opens gets it (and the
 * program's output), and the first print fails ("[Errno 9] Bad file
 * descriptor") instead of the output being lost unseen. */
static void guard_closed_stdout(void) {
  if (fcntl(STDOUT_FILENO, F_GETFD) >= 0 || errno != EBADF) return;
  int fd = open("/dev/null", O_WRONLY);
  if (fd >= 0 && fd != STDOUT_FILENO) {
    dup2(fd, STDOUT_FILENO);
    close(fd);
  }
  eval_output_closed();
}

/* The last flush of the standard output: output lost there (a full disk,
 * /dev/full) or before makes a program that otherwise succeeded fail,
 * "shmap: error: cannot write the standard output: [Errno 28] No space
 * left on device", status 1, as Python reports it.  Returns the exit
 * status. */
static int finish_output(int rc) {
  eval_flush();
  if (eval_output_check() == 0) return rc;
  if (rc) {   /* the program's own error was reported already */
    err_clear();
    return rc;
  }
  return report_error();
}

/* Whether this is the binary the build made, run where it was built (not
 * a copy `make install` put under the prefix): its executable's folder is
 * the build folder. */
static bool uninstalled(void) {
  char exe[PATH_MAX], *dir = realpath("/proc/self/exe", NULL), *build = realpath(SHMAP_BUILD_DIR, NULL);
  bool same = false;
  if (dir && build && strlen(dir) < sizeof exe) {
    strcpy(exe, dir);
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    same = strcmp(exe, build) == 0;
  }
  free(dir);
  free(build);
  return same;
}

/* The module search path's last folder: an uninstalled build also
 * searches its source tree's stdlib/, after the installed one (shmap(1),
 * FILES); an installed binary does not, so it never reads the modules of
 * a build tree that may have changed since.  --verbose shows the path. */
static int finish_module_path(void) {
  if (uninstalled() && interp_add_path(SHMAP_SRC_STDLIB_DIR) < 0) return -1;
  if (!shm_options.verbose) return 0;
  fputs("shmap: module search path:", stderr);
  for (int i = 0; i < shm_interp->npath; i++) fprintf(stderr, " %s", shm_interp->path[i]);
  fputc('\n', stderr);
  return 0;
}

/* With SHMAP_FAIL_ALLOC=N (shmap(1), ENVIRONMENT) set and fewer than N
 * allocations made, says so and how many were made: a walk over N
 * (tests/cli/alloc_failure.sh) learns from one run where to stop. */
static void say_alloc_count(void) {
  const char *s = getenv("SHMAP_FAIL_ALLOC");
  long left = shm_mem_fail_pending();
  if (s && left > 0)
    fprintf(stderr, "shmap: SHMAP_FAIL_ALLOC=%s: no allocation failed (%ld made)\n", s,
            strtol(s, NULL, 10) - left);
}

/* Starts the interpreter and runs what the command line asks for. */
static int run_interpreter(const CmdLine *cl) {
  guard_closed_stdout();
  if (cl->mode == RUN_CODE) program_name = "<string>";
  else if (cl->mode == RUN_SCRIPT) program_name = strcmp(cl->target, "-") ? cl->target : "<stdin>";
  int rc = merge_options(cl);
  if (rc) return rc;
  install_sigint();
  int local = start_processes(cl);
  if (local < 0) {
    transport_finalize();
    return 1;
  }
  say_verbose();
  tl_start(cl->trace != NULL, cl->comm_stats);
  if (cl->trace || cl->comm_stats) tl_thread(0, "main");
  Env *globals = NULL;
  if (interp_init(shm_options.devices) < 0 || finish_module_path() < 0 ||
      register_layers(local) < 0 || interp_extend_namespaces() < 0 ||
      (cl->dap && dap_configure(&shm_options.post_mortem) < 0) ||
      dbg_init(shm_interp->builtins, shm_options.debug, shm_options.post_mortem) < 0 ||
      !(globals = env_new(NULL)) || set_argv(cl, globals) < 0) {
    rc = report_error();
  } else {
    shm_interp->verbose = shm_options.verbose;
    shm_interp->dump_plans = shm_options.dump_plans;
    if (cl->estimate) aot_estimate_on(cl->estimate);
    if (cl->mode != RUN_REPL) rc = run_program(cl, &globals);
    if (shm_options.interactive) rc = repl_run(globals, cl->mode == RUN_REPL);
  }
  rc = finish_output(rc);
  if (cl->dap) dap_end(rc);
  release_globals(globals);
  dbg_free();
  dev_stop();   /* the devices' timelines are complete from here on */
  if (cl->trace && write_trace(cl->trace) < 0 && rc == 0) rc = report_error();
  if (cl->comm_stats) timeline_comm_stats(stderr);
  if (cl->estimate && aot_estimate_report(stderr) < 0 && rc == 0) rc = 1;
  tl_free();
  interp_free();
  cfg_free(&shm_options);
  char why[TRANSPORT_WHY_MAX + 1];
  transport_bye(rc, rc && transport_rank() != 0 ? departed_why(why, sizeof why) : NULL);
  transport_finalize();
  say_alloc_count();
  return rc;
}

/* shmap --test starts every test as a process of its own, which under
 * mpirun would start as one more MPI process of the job (and fail, or
 * crash in MPI): refused, with how to run the tests over P processes
 * instead.  True when refused. */
static bool under_mpirun_test(void) {
  int rank;
  long procs = transport_launched(&rank);
  if (procs <= 1) return false;
  if (rank == 0)
    fprintf(stderr, "shmap: error: --test runs each test as a process of its own and cannot "
            "run under mpirun; to run the tests over %ld processes: SHMAP_TEST_MPI=%ld shmap "
            "--test FILE...\n", procs, procs);
  return true;
}

/* shmap --dap: the adapter takes standard input and output, and its
 * launch request says what to run, which then runs as a script does. */
static int run_dap(CmdLine *cl) {
  if (cl->nrest > 0) {
    usage_error("--dap takes no script: the client's launch request names it");
    return EXIT_USAGE;
  }
  if (dap_open() < 0) return 1;
  DapLaunch l;
  int rc = dap_launch(&l);
  if (rc == 0) {
    cl->mode = RUN_SCRIPT;
    cl->target = l.program;
    cl->nrest = l.nargs;
    cl->rest = l.args;
    if (l.devices > 0) cl->devices = l.devices;
    cl->debug = l.stop_on_entry;
    cl->dap = true;
    rc = run_interpreter(cl);
  }
  dap_close();
  return rc;
}

static void print_help(void) {
  fputs(USAGE, stdout);
  fputs(HELP, stdout);
}

static void print_version(void) {
  la_init(); /* the kernel choice is made there, before BLIS starts */
  printf("shmap %s\n", SHMAP_VERSION);
  printf("BLIS architecture: %s\n", la_blis_arch());
  printf("MPI: %s\n", transport_library());
}

int main(int argc, char **argv) {
  CmdLine cl;
  if (parse_cmdline(argc, argv, &cl) != 0) return EXIT_USAGE;
  switch (cl.mode) {
  case RUN_HELP:
    print_help();
    return 0;
  case RUN_VERSION:
    print_version();
    return 0;
  case RUN_TEST:
    return under_mpirun_test() ? 1 : testrun_main(cl.nrest, cl.rest, NULL);
  case RUN_DAP:
    return run_dap(&cl);
  default:
    return run_interpreter(&cl);
  }
}
