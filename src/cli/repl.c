/*
 * repl.c - the read-eval-print loop (behaviour in repl.h).
 *
 * Readline is driven through its callback interface rather than
 * readline(): the loop then owns the wait for input, so a Ctrl-C (which
 * only sets shm_interrupted, see main.c) can abandon the line without a
 * longjmp out of a signal handler.  Lines are grouped into entries here;
 * evaluation is eval_source's.
 */
#include "cli/repl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/stat.h>
#include <unistd.h>

#include <readline/history.h>
#include <readline/readline.h>

#include "cli/config.h"
#include "cli/debug.h"
#include "base/error.h"
#include "base/intern.h"
#include "lang/exceptions.h"
#include "lang/lexer.h"
#include "base/mem.h"
#include "lang/ops.h"
#include "array/print.h"

#define PROMPT ">>> "
#define PROMPT_MORE "... "

/* The state of one session.  Readline's callbacks take no context
 * argument, hence the one static instance below. */
typedef struct Repl {
  Env *globals;        /* borrowed: the module scope entries run in */
  bool tty;            /* stdin is a terminal: readline, history */
  char *history;       /* history file, or NULL */
  char *line;          /* the line readline handed over (malloc'd) */
  bool line_done;      /* the callback ran: [line] is set (NULL: EOF) */
  int exit_status;     /* set by an entry that raised SystemExit; -1 before */
} Repl;

static Repl repl;

/* ---- reading lines ------------------------------------------------------ */

/* Readline's callback for a finished line. */
static void on_line(char *line) {
  repl.line = line;
  repl.line_done = true;
  rl_callback_handler_remove();
}

/* Forgets the half-typed line after a Ctrl-C and moves to a fresh line. */
static void abandon_tty_line(void) {
  rl_replace_line("", 0);
  rl_callback_sigcleanup();
  rl_callback_handler_remove();
  fputs("\n", rl_outstream ? rl_outstream : stdout);
}

/* Reads a line on the terminal.  NULL on EOF; sets *interrupted and
 * returns NULL on Ctrl-C.  The result is malloc'd (readline's). */
static char *tty_read(const char *prompt, bool *interrupted) {
  repl.line = NULL;
  repl.line_done = false;
  rl_callback_handler_install(prompt, on_line);
  while (!repl.line_done) {
    fd_set fds;
    FD_ZERO(&fds);
    FD_SET(fileno(rl_instream), &fds);
    int r = select(fileno(rl_instream) + 1, &fds, NULL, NULL, NULL);
    if (atomic_exchange(&shm_interrupted, 0)) {
      abandon_tty_line();
      *interrupted = true;
      return NULL;
    }
    if (r < 0 && errno != EINTR) break;
    if (r > 0) rl_callback_read_char();
  }
  if (!repl.line_done) rl_callback_handler_remove();
  return repl.line;
}

/* Reads a line from a pipe or file, prompting on stderr.  NULL on EOF;
 * Ctrl-C as in tty_read.  The result is malloc'd (getline's). */
static char *pipe_read(const char *prompt, bool *interrupted) {
  char *line = NULL;
  size_t cap = 0;
  fputs(prompt, stderr);
  fflush(stderr);
  ssize_t n = getline(&line, &cap, stdin);
  if (atomic_exchange(&shm_interrupted, 0)) {
    clearerr(stdin);
    *interrupted = true;
    free(line);
    return NULL;
  }
  if (n < 0) {
    free(line);
    return NULL;
  }
  if (n > 0 && line[n - 1] == '\n') line[n - 1] = '\0';
  return line;
}

static char *read_line(const char *prompt, bool *interrupted) {
  *interrupted = false;
  return repl.tty ? tty_read(prompt, interrupted) : pipe_read(prompt, interrupted);
}

/* ---- grouping lines into entries ---------------------------------------- */

/* A growing text buffer. */
typedef struct Buf {
  char *s;
  size_t len, cap;
} Buf;

static bool buf_add(Buf *b, const char *s) {
  size_t n = strlen(s);
  if (b->len + n + 3 > b->cap) {  /* room for one more '\n' and the NUL */
    size_t cap = (b->len + n + 3) * 2;
    char *p = shm_realloc(b->s, cap);
    if (!p) return false;
    b->s = p;
    b->cap = cap;
  }
  memcpy(b->s + b->len, s, n);
  b->len += n;
  b->s[b->len++] = '\n';
  b->s[b->len] = '\0';
  return true;
}

static bool is_blank(const char *s) {
  return s[strspn(s, " \t\r")] == '\0';
}

static bool is_blank_n(const char *s, int n) {
  for (int i = 0; i < n; i++)
    if (s[i] != ' ' && s[i] != '\t' && s[i] != '\n') return false;
  return true;
}

/* True when [line], without its comment and trailing blanks, ends in ':'
 * (it opens a block).  Strings are skipped so "a:b" literals do not count. */
static bool opens_block(const char *line) {
  char quote = 0, last = 0;
  for (const char *p = line; *p; p++) {
    if (quote) {
      if (*p == '\\' && p[1]) p++;
      else if (*p == quote) quote = 0;
      last = 'x';
    } else if (*p == '#') {
      break;
    } else if (*p == '\'' || *p == '"') {
      quote = *p;
    } else if (*p != ' ' && *p != '\t' && *p != '\r') {
      last = *p;
    }
  }
  return last == ':';
}

/* True when [entry] cannot end here whatever comes next: an open bracket
 * or string, or a trailing backslash.  lex_needs_more also asks for more
 * after an indented line (a block going on); with an empty line appended
 * only the structural reasons remain, and blocks are handled by the
 * caller. */
static bool unfinished(const char *entry) {
  size_t n = strlen(entry);
  char *t = shm_malloc(n + 2);
  if (!t) return false;
  memcpy(t, entry, n);
  t[n] = '\n';
  t[n + 1] = '\0';
  bool more = lex_needs_more(t);
  shm_free(t);
  return more;
}

/* True when [line] starts a compound statement (its first word is if,
 * for, while, try, with, def, class or async, or it is a decorator): as
 * at Python's prompt, `if 0: print(1)` on one line still lets an `else:`
 * line follow, so the entry goes on to a blank line. */
static bool starts_compound(const char *line) {
  static const char *const words[] = {"if", "for", "while", "try", "with", "def", "class", "async"};
  line += strspn(line, " \t");
  if (*line == '@') return true;
  size_t n = strspn(line, "abcdefghijklmnopqrstuvwxyz_");
  for (size_t i = 0; i < sizeof words / sizeof *words; i++)
    if (strlen(words[i]) == n && !strncmp(line, words[i], n)) return true;
  return false;
}

bool repl_entry_goes_on(const char *entry, const char *line, bool *block) {
  if (unfinished(entry)) return true;
  bool first = strlen(entry) == strlen(line) + 1;   /* [line] is the entry's only line */
  *block = *block || opens_block(line) || (first && starts_compound(line));
  return *block && !is_blank(line);
}

static void remember(const char *line) {
  if (repl.tty && repl.history && !is_blank(line)) add_history(line);
}

/* What read_entry found. */
typedef enum { ENTRY_TEXT, ENTRY_EMPTY, ENTRY_EOF } EntryKind;

/*
 * Reads one entry into [b]: a line, or the lines of an open bracket or
 * block.  ENTRY_EMPTY after a Ctrl-C (nothing to run), ENTRY_EOF at the
 * end of input with nothing pending.
 */
static EntryKind read_entry(Buf *b) {
  bool block = false, interrupted;
  const char *prompt = PROMPT;
  for (;;) {
    char *line = read_line(prompt, &interrupted);
    if (interrupted) return ENTRY_EMPTY;
    if (!line) return b->len ? ENTRY_TEXT : ENTRY_EOF;
    remember(line);
    bool ok = buf_add(b, line);
    if (!ok) {
      free(line);
      err_nomem();  /* repl_run reports it */
      return ENTRY_TEXT;
    }
    bool more = b->s[0] != ':' && repl_entry_goes_on(b->s, line, &block);
    free(line);
    if (!more) return ENTRY_TEXT;
    prompt = PROMPT_MORE;
  }
}

/* ---- running entries ---------------------------------------------------- */

/* Prints the pending error and keeps it for pm() (which clears it); the
 * debugger's quit is silent. */
static void report_error(void) {
  fflush(stdout);
  if (err_kind() == ERR_SYSTEM_EXIT) {   /* sys.exit(): ends the session with its status */
    repl.exit_status = exc_exit_status(stderr);
    err_clear();
    return;
  }
  if (err_kind() != ERR_QUIT) err_print(stderr);
  dbg_keep_error();
}

static void run_source_text(const char *text) {
  Source *src = src_new("<stdin>", text);
  if (!src) {
    err_nomem();
    report_error();
    return;
  }
  atomic_store(&shm_interrupted, 0);
  if (eval_source(src, repl.globals, true) < 0) report_error();
  atomic_store(&shm_interrupted, 0);  /* a Ctrl-C that came too late to stop it */
  src_decref(src);
  fflush(stdout);
}

/* Evaluates the expression [text] and prints its str(). */
static void print_expr(const char *text) {
  Value *v = eval_expr_text(text, repl.globals);
  Value *s = v ? val_str(v) : NULL;
  if (s) printf("%s\n", str_cstr(s));
  else report_error();
  val_decref(s);
  val_decref(v);
  fflush(stdout);
}

/* `:plan f(x, y)` becomes `plan(f, x, y)`: the callee is what precedes the
 * first top-level '(', when the text ends with its matching ')'. */
static void cmd_plan(const char *expr) {
  size_t n = strlen(expr);
  while (n && (expr[n - 1] == ' ' || expr[n - 1] == '\n')) n--;
  const char *open = memchr(expr, '(', n);
  char *text = shm_malloc(n + 16);
  if (!text) return;
  if (open && open > expr && expr[n - 1] == ')') {
    const char *args = open + 1;
    int arglen = (int)(expr + n - 1 - args);
    snprintf(text, n + 16, "plan(%.*s%s%.*s)", (int)(open - expr), expr,
             is_blank_n(args, arglen) ? "" : ", ", arglen, args);
  } else {
    snprintf(text, n + 16, "plan(%.*s)", (int)n, expr);
  }
  print_expr(text);
  shm_free(text);
}

static const char HELP[] =
    "Type statements and expressions; an expression's value is echoed.\n"
    "A line ending in ':' opens a block; a blank line ends it.\n"
    "\n"
    "Commands:\n"
    "  :plan F(ARGS)   print the staged plan of calling F with ARGS\n"
    "  :help           this text\n"
    "  :quit           leave (also Ctrl-D on an empty line)\n"
    "\n"
    "Debugging: pm() debugs the last error post mortem, where it was raised\n"
    "(also pdb.pm() after import pdb); breakpoint() stops at the next\n"
    "statement entered.\n"
    "\n"
    "Keys: Tab completes names and attributes; Up/Down walk the history;\n"
    "Ctrl-C abandons the current line or interrupts the running statement.\n"
    "The language is described in shmap(7), the program in shmap(1).\n";

/* Runs a `:command`; false when it asks to leave. */
static bool run_command(const char *text) {
  char name[16] = "";
  sscanf(text, ":%15[a-z]", name);
  const char *rest = text + 1 + strlen(name);
  rest += strspn(rest, " \t");
  if (strcmp(name, "help") == 0) fputs(HELP, stdout);
  else if (strcmp(name, "quit") == 0) return false;
  else if (strcmp(name, "plan") == 0 && !is_blank(rest)) cmd_plan(rest);
  else if (strcmp(name, "plan") == 0) fputs("usage: :plan F(ARGS)\n", stderr);
  else fprintf(stderr, "unknown command ':%s' (try :help)\n", name);
  fflush(stdout);
  return true;
}

/* ---- tab completion ------------------------------------------------------ */

/* Readline frees the strings completion returns with free(), so the
 * candidates below are plain malloc'd C strings, not shm_malloc'd ones. */
typedef struct Candidates {
  char **items;
  size_t len, cap;
  const char *prefix;  /* "x." before attribute names, "" for names */
  const char *stem;    /* only names starting with this are kept */
} Candidates;

static Candidates cands;

static void cand_clear(void) {
  for (size_t i = 0; i < cands.len; i++) free(cands.items[i]);
  cands.len = 0;
}

static void cand_add(const char *name) {
  if (strncmp(name, cands.stem, strlen(cands.stem)) != 0) return;
  if (cands.len == cands.cap) {
    size_t cap = cands.cap ? 2 * cands.cap : 64;
    char **items = realloc(cands.items, cap * sizeof *items);
    if (!items) return;
    cands.items = items;
    cands.cap = cap;
  }
  size_t n = strlen(cands.prefix) + strlen(name) + 1;
  char *s = malloc(n);
  if (!s) return;
  snprintf(s, n, "%s%s", cands.prefix, name);
  cands.items[cands.len++] = s;
}

static void cand_env(const char *name, Value *v, void *ctx) { cand_add(name); }

static const char *const KEYWORDS[] = {
    "def", "lambda", "return", "if", "elif", "else", "for", "in", "while",
    "break", "continue", "pass", "and", "or", "not", "is", "None", "True",
    "False", "assert", "import", "from", "as", "global", "nonlocal", "mesh",
    "shard_map", "jit", "on", "devices", NULL};

/* The value named by the dotted path [path] ("a" or "a.b") in [scope]
 * (then the built-ins), as a new reference, or NULL.  Only names and
 * attributes: completion must not run the user's calls. */
static Value *resolve_dotted(Env *scope, const char *path) {
  char buf[256];
  snprintf(buf, sizeof buf, "%s", path);
  char *save = NULL, *part = strtok_r(buf, ".", &save);
  const char *name = part ? intern_cstr(part) : NULL;
  Value *v = name && scope ? env_lookup(scope, name) : NULL;
  if (!v && name && shm_interp) v = env_lookup(shm_interp->builtins, name);
  if (!v) return NULL;
  val_incref(v);
  while (v && (part = strtok_r(NULL, ".", &save))) {
    Value *next = ops_getattr(v, part);
    val_decref(v);
    v = next;
  }
  if (!v) err_clear();
  return v;
}

void repl_each_attribute(Env *scope, const char *text, void (*add)(const char *, void *),
                         void *ctx) {
  const char *dot = strrchr(text, '.');
  if (!dot) return;
  char base[256], full[512];
  snprintf(base, sizeof base, "%.*s", (int)(dot - text), text);
  Value *obj = resolve_dotted(scope, base);
  Value *names = obj ? ops_dir(obj) : NULL;
  size_t stem = strlen(dot + 1);
  for (size_t i = 0; names && i < list_len(names); i++) {
    const char *name = str_cstr(list_get(names, i));
    if (strncmp(name, dot + 1, stem) != 0) continue;
    snprintf(full, sizeof full, "%s.%s", base, name);
    add(full, ctx);
  }
  if (!names) err_clear();
  val_decref(names);
  val_decref(obj);
}

static void cand_add_full(const char *name, void *ctx) {
  (void)ctx;
  cands.prefix = "";
  cands.stem = "";
  cand_add(name);
}

/* Fills [cands] with the attributes of the object before the last dot. */
static void collect_attributes(const char *text) {
  repl_each_attribute(repl.globals, text, cand_add_full, NULL);
}

static void collect_names(const char *text) {
  cands.prefix = "";
  cands.stem = text;
  env_each(repl.globals, cand_env, NULL);
  if (shm_interp) env_each(shm_interp->builtins, cand_env, NULL);
  for (int i = 0; KEYWORDS[i]; i++) cand_add(KEYWORDS[i]);
}

/* Readline's generator: state 0 starts a new completion. */
static char *generate(const char *text, int state) {
  static size_t next;
  if (state == 0) {
    cand_clear();
    if (strchr(text, '.')) collect_attributes(text);
    else collect_names(text);
    next = 0;
  }
  return next < cands.len ? strdup(cands.items[next++]) : NULL;
}

static char **complete(const char *text, int start, int end) {
  rl_attempted_completion_over = 1;  /* never fall back to file names */
  rl_completion_append_character = '\0';  /* readline resets it per call */
  return rl_completion_matches(text, generate);
}

/* ---- history and set-up -------------------------------------------------- */

/* "dir/name" as a new string. */
static char *path_join(const char *dir, const char *name) {
  size_t n = strlen(dir) + strlen(name) + 2;
  char *p = shm_malloc(n);
  if (p) snprintf(p, n, "%s/%s", dir, name);
  return p;
}

char *repl_history_path(void) {
  if (shm_options.history_size <= 0) return NULL;
  if (shm_options.history_file) return shm_strdup(shm_options.history_file);
  const char *state = getenv("XDG_STATE_HOME");
  if (state && *state) {
    char *dir = path_join(state, "shmap");
    if (!dir) return NULL;
    mkdir(state, 0700);
    mkdir(dir, 0700);
    char *path = path_join(dir, "history");
    shm_free(dir);
    return path;
  }
  const char *home = getenv("HOME");
  return home && *home ? path_join(home, ".shmap_history") : NULL;
}

static void setup_readline(void) {
  rl_readline_name = "shmap";
  rl_catch_signals = 0;  /* main.c's SIGINT handler sets shm_interrupted */
  rl_attempted_completion_function = complete;
  rl_basic_word_break_characters = " \t\n\"'`@$><=;|&{}()[],+-*/%~^!:";
  repl.history = repl_history_path();
  if (!repl.history) return;
  using_history();
  stifle_history(shm_options.history_size);
  read_history(repl.history);
}

static void save_history(void) {
  if (!repl.history) return;
  if (write_history(repl.history) != 0)
    fprintf(stderr, "shmap: warning: cannot save history to '%s'\n", repl.history);
  shm_free(repl.history);
  repl.history = NULL;
}

/* Runs one entry; false when it was :quit. */
static bool run_entry(const char *text) {
  if (text[0] == ':') return run_command(text);
  if (!is_blank(text)) run_source_text(text);
  return true;
}

#ifndef SHMAP_VERSION
#define SHMAP_VERSION "unknown"
#endif

/* The greeting of a session at a terminal, as Python's prompt has one. */
static void print_banner(void) {
  printf("shmap %s (%d devices): Python's syntax, JAX's jit, grad, vmap and shard_map\n"
         "Type help() for help, :help for the prompt's commands, Ctrl-D to leave.\n",
         SHMAP_VERSION, shm_interp->ndevices);
}

int repl_run(Env *globals, bool banner) {
  repl.globals = globals;
  repl.tty = isatty(0);
  if (repl.tty && banner) print_banner();
  if (repl.tty) setup_readline();
  Buf b = {0};
  EntryKind k;
  bool going = true;
  repl.exit_status = -1;
  while (going && repl.exit_status < 0) {
    b.len = 0;
    k = read_entry(&b);
    if (k == ENTRY_EOF) break;
    if (err_occurred()) report_error();
    else if (k == ENTRY_TEXT) going = run_entry(b.s);
  }
  if (k == ENTRY_EOF) fputs("\n", repl.tty ? stdout : stderr);  /* end the prompt's line */
  shm_free(b.s);
  cand_clear();
  free(cands.items);
  save_history();
  return repl.exit_status > 0 ? repl.exit_status : 0;
}
