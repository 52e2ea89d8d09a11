/*
 * testrun.c - the --test runner: read a test's expectations from its
 * comments, run it in a child process, compare, report.
 *
 * The syntax is documented in testrun.h and in shmap(1), TESTING.  The
 * child is this executable again, so a crash, a hang or a corrupted heap
 * in one test cannot touch the runner or the next test.  Output goes to
 * unlinked temporary files rather than pipes: the runner then needs no
 * poll loop, and a test that prints a lot can never block on a full pipe.
 */
#include "cli/testrun.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/mem.h"

/* A test may write at most this much to stdout plus stderr; beyond it the
 * kernel stops it with SIGXFSZ instead of filling the disk. */
#define OUTPUT_LIMIT (64L << 20)

#define DEFAULT_TIMEOUT 60

/* How many differing lines a failure report shows at most. */
#define REPORT_LINES 6

/* ---- growable lists of owned strings ----------------------------------- */

typedef struct StrList {
  char **items;
  size_t len, cap;
} StrList;

/* Appends a copy of [n] bytes of [s]; exits on out of memory, since the
 * runner cannot report anything meaningful without memory. */
static void list_push(StrList *l, const char *s, size_t n) {
  if (l->len == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    char **items = shm_realloc(l->items, cap * sizeof *items);
    if (!items) {
      fputs("shmap: error: out of memory\n", stderr);
      exit(1);
    }
    l->items = items;
    l->cap = cap;
  }
  char *copy = shm_malloc(n + 1);
  if (!copy) {
    fputs("shmap: error: out of memory\n", stderr);
    exit(1);
  }
  memcpy(copy, s, n);
  copy[n] = '\0';
  l->items[l->len++] = copy;
}

static void list_push_str(StrList *l, const char *s) { list_push(l, s, strlen(s)); }

static void list_free(StrList *l) {
  for (size_t i = 0; i < l->len; i++) shm_free(l->items[i]);
  shm_free(l->items);
  memset(l, 0, sizeof *l);
}

/* Splits [text] at newlines; a final line without '\n' still counts, and
 * a '\r' before the '\n' is dropped. */
static void split_lines(StrList *l, const char *text, size_t len) {
  size_t start = 0;
  for (size_t i = 0; i <= len; i++) {
    if (i < len && text[i] != '\n') continue;
    if (i == len && start == len) break;
    size_t end = i;
    if (end > start && text[end - 1] == '\r') end--;
    list_push(l, text + start, end - start);
    start = i + 1;
  }
}

/* Splits [s] at blanks, appending the words to [l]. */
static void split_words(StrList *l, const char *s) {
  while (*s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strcspn(s, " \t");
    if (n) list_push(l, s, n);
    s += n;
  }
}

/* ---- a test's expectations ---------------------------------------------- */

typedef struct Expect {
  StrList out;        /* expected stdout lines, all of them */
  StrList err;        /* expected first stderr lines */
  bool has_error;     /* err.items[0] is an expect-error message */
  int exit_status;    /* -1: the default */
  StrList options;    /* before the script path */
  StrList args;       /* after it */
  StrList env;        /* NAME=VALUE */
  StrList in;         /* `# stdin:` lines, the child's standard input */
  StrList in_file;    /* `# stdin-file:` (one path): the standard input */
  char problem[256];  /* a malformed directive; the test fails with it */
} Expect;

static void expect_free(Expect *e) {
  list_free(&e->out);
  list_free(&e->err);
  list_free(&e->options);
  list_free(&e->args);
  list_free(&e->env);
  list_free(&e->in);
  list_free(&e->in_file);
}

/* The start of the comment on [line] (a '#' outside any string literal),
 * or NULL. */
static const char *comment_start(const char *line) {
  char quote = 0;
  for (const char *p = line; *p; p++) {
    if (quote && *p == '\\' && p[1]) p++;
    else if (quote && *p == quote) quote = 0;
    else if (!quote && (*p == '\'' || *p == '"')) quote = *p;
    else if (!quote && *p == '#') return p;
  }
  return NULL;
}

/* If [comment] is "# NAME:" followed by the value, returns the value
 * (after exactly one optional space); otherwise NULL. */
static const char *directive(const char *comment, const char *name) {
  size_t n = strlen(name);
  if (strncmp(comment, "# ", 2) != 0 || strncmp(comment + 2, name, n) != 0) return NULL;
  const char *p = comment + 2 + n;
  if (*p != ':') return NULL;
  p++;
  return *p == ' ' ? p + 1 : p;
}

/* Replaces every "${TESTDIR}" in [s] by [dir], into a new string. */
static char *subst_testdir(const char *s, const char *dir) {
  static const char key[] = "${TESTDIR}";
  size_t cap = strlen(s) + 1, keylen = sizeof key - 1;
  for (const char *p = strstr(s, key); p; p = strstr(p + keylen, key)) cap += strlen(dir);
  char *out = shm_malloc(cap), *w = out;
  if (!out) return NULL;
  while (*s) {
    if (strncmp(s, key, keylen) == 0) {
      w = stpcpy(w, dir);
      s += keylen;
    } else {
      *w++ = *s++;
    }
  }
  *w = '\0';
  return out;
}

/* Adds an argument or environment directive's value to [l]. */
static void add_words(StrList *l, const char *value, const char *dir, bool split) {
  char *v = subst_testdir(value, dir);
  if (!v) return;
  if (split) split_words(l, v);
  else list_push_str(l, v);
  shm_free(v);
}

/* A block line "# TEXT" or "#": its TEXT; NULL if not a comment line. */
static const char *block_text(const char *line) {
  while (*line == ' ' || *line == '\t') line++;
  if (line[0] != '#') return NULL;
  return line[1] == ' ' ? line + 2 : line + 1;
}

/* `# expect-exit: N`: N must be a status, 0 to 255. */
static void set_exit(Expect *e, const char *v) {
  char *end;
  long n = strtol(v, &end, 10);
  if (end == v || *end || n < 0 || n > 255)
    snprintf(e->problem, sizeof e->problem, "expect-exit needs a status from 0 to 255, not '%s'", v);
  else
    e->exit_status = (int)n;
}

/* `# expect-error: MSG` names the first stderr line, so it comes once
 * and before any expect-stderr. */
static void add_error(Expect *e, const char *v) {
  if (e->has_error || e->err.len)
    snprintf(e->problem, sizeof e->problem, "expect-error must come once, before any expect-stderr");
  list_push_str(&e->err, v);
  e->has_error = true;
}

/* `# stdin-file: NAME`: NAME relative to the test's directory [dir]. */
static void set_stdin_file(Expect *e, const char *v, const char *dir) {
  if (e->in_file.len) {
    snprintf(e->problem, sizeof e->problem, "stdin-file must come once");
    return;
  }
  char *path = v[0] == '/' ? NULL : shm_malloc(strlen(dir) + strlen(v) + 2);
  if (path) sprintf(path, "%s/%s", dir, v);
  list_push_str(&e->in_file, path ? path : v);
  shm_free(path);
}

/* Handles one ordinary line: at most one directive in its comment.  A
 * comment that looks like an expectation but is misspelt is an error, so
 * a typo cannot make a test pass vacuously. */
static void parse_line(Expect *e, const char *line, const char *dir, bool *in_block) {
  const char *c = comment_start(line), *v;
  if (!c) return;
  if ((v = directive(c, "expect"))) list_push_str(&e->out, v);
  else if ((v = directive(c, "expect-block"))) *in_block = true;
  else if ((v = directive(c, "expect-stderr"))) list_push_str(&e->err, v);
  else if ((v = directive(c, "options"))) add_words(&e->options, v, dir, true);
  else if ((v = directive(c, "args"))) add_words(&e->args, v, dir, true);
  else if ((v = directive(c, "env"))) add_words(&e->env, v, dir, false);
  else if ((v = directive(c, "stdin"))) list_push_str(&e->in, v);
  else if ((v = directive(c, "stdin-file"))) set_stdin_file(e, v, dir);
  else if ((v = directive(c, "expect-exit"))) set_exit(e, v);
  else if ((v = directive(c, "expect-error"))) add_error(e, v);
  else if (strncmp(c, "# expect", 8) == 0 && strchr(c, ':'))
    snprintf(e->problem, sizeof e->problem, "unknown directive '%.*s'",
             (int)(strchr(c, ':') - c), c);
}

/* Reads every directive of the test text [lines]. */
static void parse_expect(Expect *e, const StrList *lines, const char *dir) {
  bool in_block = false;
  memset(e, 0, sizeof *e);
  e->exit_status = -1;
  for (size_t i = 0; i < lines->len; i++) {
    const char *line = lines->items[i];
    if (!in_block) {
      parse_line(e, line, dir, &in_block);
      continue;
    }
    const char *text = block_text(line);
    if (!text) {
      snprintf(e->problem, sizeof e->problem, "line %zu: expect-block lines must be comments", i + 1);
      return;
    }
    if (strcmp(text, "end") == 0) in_block = false;
    else list_push_str(&e->out, text);
  }
  if (in_block) snprintf(e->problem, sizeof e->problem, "expect-block without '# end'");
}

/* ---- running one test ------------------------------------------------- */

typedef struct Outcome {
  int status;        /* exit status, or -1 when killed */
  int signal;        /* the signal that killed it, or 0 */
  bool timed_out;
  char *out, *err;   /* captured output, NUL-terminated, owned */
  size_t outlen, errlen;
} Outcome;

/* A file for the child's output that disappears when closed. */
static int temp_fd(void) {
  char name[] = "/tmp/shmap-test-XXXXXX";
  int fd = mkstemp(name);
  if (fd >= 0) unlink(name);
  return fd;
}

/* Reads all of [fd] from its start into a new NUL-terminated buffer. */
static char *slurp_fd(int fd, size_t *len) {
  off_t size = lseek(fd, 0, SEEK_END);
  if (size < 0) size = 0;
  char *buf = shm_malloc((size_t)size + 1);
  size_t got = 0;
  if (!buf) return *len = 0, NULL;
  lseek(fd, 0, SEEK_SET);
  while (got < (size_t)size) {
    ssize_t r = read(fd, buf + got, (size_t)size - got);
    if (r <= 0) break;
    got += (size_t)r;
  }
  buf[got] = '\0';
  *len = got;
  return buf;
}

/* SHMAP_TEST_MPI=P: every test runs as `mpirun -np P` processes of this
 * executable (LANGUAGE.md section 12), to show that a program's output is
 * the same over P processes as in one; 0 when unset. */
static int mpi_procs;

/* Why a test cannot run over mpi_procs processes, or NULL: it reads the
 * terminal (the debugger, the REPL, standard input), writes a file from
 * every process (--trace), or its device count does not divide evenly. */
static const char *mpi_skip(const Expect *e) {
  long devices = 8;
  for (size_t i = 0; i < e->options.len; i++) {
    const char *o = e->options.items[i];
    if (!strcmp(o, "--debug") || !strcmp(o, "--pm") || !strcmp(o, "-i") ||
        !strcmp(o, "--interactive"))
      return "reads the terminal";
    if (!strncmp(o, "--trace", 7) || !strcmp(o, "--comm-stats")) return "per-process files";
    if (!strcmp(o, "--devices") && i + 1 < e->options.len)
      devices = strtol(e->options.items[i + 1], NULL, 10);
    else if (!strncmp(o, "--devices=", 10))
      devices = strtol(o + 10, NULL, 10);
  }
  for (size_t i = 0; i < e->env.len; i++)
    if (!strncmp(e->env.items[i], "SHMAP_DEVICES=", 14))
      devices = strtol(e->env.items[i] + 14, NULL, 10);
  if (e->in.len || e->in_file.len) return "reads standard input";
  if (devices % mpi_procs) return "devices not divisible by the processes";
  return NULL;
}

/* The child's environment: no user config, no inherited device count or
 * module path, then the test's own settings. */
static void child_env(const Expect *e) {
  setenv("SHMAP_CONFIG", "", 1);
  unsetenv("SHMAP_DEVICES");
  unsetenv("SHMAP_PATH");
  for (size_t i = 0; i < e->env.len; i++) putenv(e->env.items[i]);
  if (mpi_procs) {   /* CI runs as root, which mpirun refuses unless told */
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
}

/* In the child: wire up the files and exec [exe] on the test. */
static void child_run(const char *exe, const char *path, const Expect *e, int in, int out,
                      int err) {
  if (in < 0) in = open("/dev/null", O_RDONLY);
  if (in >= 0) dup2(in, 0);
  dup2(out, 1);
  dup2(err, 2);
  struct rlimit lim = {OUTPUT_LIMIT, OUTPUT_LIMIT};
  setrlimit(RLIMIT_FSIZE, &lim);
  signal(SIGPIPE, SIG_DFL);
  child_env(e);
  size_t argc = 0, max = e->options.len + e->args.len + 12;
  char **argv = calloc(max, sizeof *argv);
  char np[16];
  if (!argv) _exit(127);
  if (mpi_procs) {
    snprintf(np, sizeof np, "%d", mpi_procs);
    const char *pre[] = {"mpirun", "--oversubscribe", "--bind-to", "none", "-np", np};
    for (size_t i = 0; i < sizeof pre / sizeof *pre; i++) argv[argc++] = (char *)pre[i];
    argv[argc++] = (char *)exe;
  } else {
    argv[argc++] = "shmap";
  }
  for (size_t i = 0; i < e->options.len; i++) argv[argc++] = e->options.items[i];
  argv[argc++] = (char *)path;
  for (size_t i = 0; i < e->args.len; i++) argv[argc++] = e->args.items[i];
  argv[argc] = NULL;
  if (mpi_procs)
    execvp("mpirun", argv);
  else
    execv(exe, argv);
  dprintf(2, "shmap: error: cannot run '%s': %s\n", exe, strerror(errno));
  _exit(127);
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Waits for [pid] for at most [timeout] seconds, then kills it.  Polls
 * with a growing sleep: a test usually ends within milliseconds. */
static void wait_child(pid_t pid, int timeout, Outcome *o) {
  double deadline = now_seconds() + timeout;
  long nap_ns = 200000;
  int wstatus = 0;
  for (;;) {
    pid_t r = waitpid(pid, &wstatus, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) break;
    if (now_seconds() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &wstatus, 0);
      o->timed_out = true;
      break;
    }
    struct timespec ts = {0, nap_ns};
    nanosleep(&ts, NULL);
    if (nap_ns < 20000000) nap_ns *= 2;
  }
  o->status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
  o->signal = WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0;
}

static int timeout_seconds(void) {
  const char *s = getenv("SHMAP_TEST_TIMEOUT");
  int t = s ? atoi(s) : 0;
  return t > 0 ? t : DEFAULT_TIMEOUT;
}

/* The child's standard input: a file of the `# stdin:` lines, the
 * `# stdin-file:` file, or -1 for /dev/null.  -2 (after saying why on
 * [rep]) when it cannot be made. */
static int stdin_fd(FILE *rep, const Expect *e) {
  if (e->in_file.len) {
    int fd = open(e->in_file.items[0], O_RDONLY);
    if (fd < 0) fprintf(rep, "  cannot open stdin-file '%s': %s\n", e->in_file.items[0], strerror(errno));
    return fd < 0 ? -2 : fd;
  }
  if (!e->in.len) return -1;
  int fd = temp_fd();
  for (size_t i = 0; fd >= 0 && i < e->in.len; i++)
    if (dprintf(fd, "%s\n", e->in.items[i]) < 0) break;
  if (fd < 0 || lseek(fd, 0, SEEK_SET) < 0) {
    fprintf(rep, "  cannot make a temporary file: %s\n", strerror(errno));
    if (fd >= 0) close(fd);
    return -2;
  }
  return fd;
}

/* Runs the test; false (with a message on stdout) if it could not start. */
static bool run_child(FILE *rep, const char *exe, const char *path, const Expect *e,
                      Outcome *o) {
  memset(o, 0, sizeof *o);
  int out = temp_fd(), err = temp_fd();
  if (out < 0 || err < 0) {
    if (out >= 0) close(out);
    if (err >= 0) close(err);
    fprintf(rep, "  cannot make a temporary file: %s\n", strerror(errno));
    return false;
  }
  int in = stdin_fd(rep, e);
  if (in == -2) {
    close(out);
    close(err);
    return false;
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) child_run(exe, path, e, in, out, err);
  if (in >= 0) close(in);
  if (pid < 0) fprintf(rep, "  cannot fork: %s\n", strerror(errno));
  else wait_child(pid, timeout_seconds(), o);
  o->out = slurp_fd(out, &o->outlen);
  o->err = slurp_fd(err, &o->errlen);
  close(out);
  close(err);
  return pid > 0;
}

/* ---- comparing -------------------------------------------------------- */

static bool all_digits(const char *s, size_t n) {
  if (n == 0) return false;
  for (size_t i = 0; i < n; i++)
    if (s[i] < '0' || s[i] > '9') return false;
  return true;
}

/* Splits an error line "anything:LINE:COL: error: MSG" into its
 * "LINE:COL" part (copied into [linecol], empty if absent) and MSG, which
 * it returns.  A line without "error: " is all message. */
static const char *split_error(const char *s, char *linecol, size_t size) {
  linecol[0] = '\0';
  if (strncmp(s, "error: ", 7) == 0) return s + 7;
  const char *mark = strstr(s, ": error: ");
  if (!mark) return s;
  const char *col = mark;  /* walk back over ":COL" then ":LINE" */
  while (col > s && col[-1] != ':') col--;
  const char *line = col > s ? col - 1 : s;
  while (line > s && line[-1] != ':') line--;
  size_t n = (size_t)(mark - line);
  if (col > s && all_digits(col, (size_t)(mark - col)) &&
      all_digits(line, (size_t)(col - 1 - line)) && n < size) {
    memcpy(linecol, line, n);
    linecol[n] = '\0';
  }
  return mark + 9;
}

/* True when the actual error line [got] matches the expect-error [want]. */
static bool error_matches(const char *want, const char *got) {
  char want_lc[64], got_lc[64];
  const char *want_msg = split_error(want, want_lc, sizeof want_lc);
  const char *got_msg = split_error(got, got_lc, sizeof got_lc);
  if (strcmp(want_msg, got_msg) != 0) return false;
  return !want_lc[0] || strcmp(want_lc, got_lc) == 0;
}

/* Shows line [i] of [l]; just past its end, says so once. */
static void show_line(FILE *rep, const char *label, const StrList *l, size_t i) {
  if (i < l->len) fprintf(rep, "    %s %s\n", label, l->items[i]);
  else if (i == l->len) fprintf(rep, "    %s (end of output)\n", label);
}

/* Compares [want] with [got] line by line; reports the first differing
 * lines under [what].  [first_is_error]: line 0 compares as an error. */
static bool compare(FILE *rep, const char *what, const StrList *want, const StrList *got,
                    bool prefix_only, bool first_is_error) {
  size_t n = want->len > got->len ? want->len : got->len;
  if (prefix_only) n = want->len;
  for (size_t i = 0; i < n; i++) {
    bool same = i < want->len && i < got->len &&
                (i == 0 && first_is_error ? error_matches(want->items[0], got->items[0])
                                          : strcmp(want->items[i], got->items[i]) == 0);
    if (same) continue;
    fprintf(rep, "  %s differs at line %zu (expected %zu lines, got %zu):\n", what, i + 1,
           want->len, got->len);
    for (size_t j = i; j < n && j < i + REPORT_LINES / 2; j++) {
      show_line(rep, "- expected:", want, j);
      show_line(rep, "+ actual:  ", got, j);
    }
    return false;
  }
  return true;
}

/* Shows the start of stderr, which usually explains a surprise. */
static void show_stderr(FILE *rep, const StrList *err) {
  for (size_t i = 0; i < err->len && i < REPORT_LINES; i++)
    fprintf(rep, "    stderr: %s\n", err->items[i]);
}

/* Drops a leading traceback ("Traceback (most recent call last):" and
 * its indented lines) from stderr [got], unless the expected stderr
 * [want] starts with one: an expect-error names the located message, the
 * line after the calling lines. */
static void drop_traceback(StrList *got, const StrList *want) {
  static const char head[] = "Traceback (most recent call last):";
  if (!got->len || strcmp(got->items[0], head) != 0) return;
  if (want->len && strcmp(want->items[0], head) == 0) return;
  size_t k = 1;
  while (k < got->len && !strncmp(got->items[k], "  ", 2)) k++;
  for (size_t i = 0; i < k; i++) shm_free(got->items[i]);
  memmove(got->items, got->items + k, sizeof(char *) * (got->len - k));
  got->len -= k;
}

/* The first line of a sanitizer's report in [err], or NULL.  A leak
 * report ends the run with status 1, the status an error test expects,
 * after the lines a test compares: without this look a leaking error
 * test would pass. */
static const char *sanitizer_report(const StrList *err) {
  static const char *const heads[] = {"ERROR: LeakSanitizer", "ERROR: AddressSanitizer",
                                      "WARNING: ThreadSanitizer"};
  for (size_t i = 0; i < err->len; i++)
    for (size_t k = 0; k < sizeof heads / sizeof *heads; k++)
      if (strstr(err->items[i], heads[k])) return err->items[i];
  return NULL;
}

/* Judges the outcome against the expectations, reporting what differs. */
static bool judge(FILE *rep, const Expect *e, const Outcome *o, int timeout) {
  StrList out = {0}, err = {0};
  split_lines(&out, o->out ? o->out : "", o->outlen);
  split_lines(&err, o->err ? o->err : "", o->errlen);
  bool ok = true;
  int want_exit = e->exit_status >= 0 ? e->exit_status : e->has_error ? 1 : 0;
  if (o->timed_out) {
    fprintf(rep, "  timed out after %d s and was killed\n", timeout);
    ok = false;
  } else if (o->signal) {
    fprintf(rep, "  killed by signal %d (%s)\n", o->signal, strsignal(o->signal));
    ok = false;
  } else if (o->status != want_exit) {
    fprintf(rep, "  exit status %d, expected %d\n", o->status, want_exit);
    ok = false;
  }
  const char *report = sanitizer_report(&err);
  if (report) {
    fprintf(rep, "  a sanitizer reported: %s\n", report);
    ok = false;
  }
  ok = compare(rep, "stdout", &e->out, &out, false, false) && ok;
  drop_traceback(&err, &e->err);
  bool err_ok = compare(rep, "stderr", &e->err, &err, e->err.len > 0, e->has_error);
  if (!ok && err_ok) show_stderr(rep, &err);
  list_free(&out);
  list_free(&err);
  return ok && err_ok;
}

/* ---- one test, many tests --------------------------------------------- */

/* The directory part of [path], for ${TESTDIR}: "." if it has none. */
static char *dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  if (!slash) return shm_strdup(".");
  if (slash == path) return shm_strdup("/");
  char *d = shm_malloc((size_t)(slash - path) + 1);
  if (d) {
    memcpy(d, path, (size_t)(slash - path));
    d[slash - path] = '\0';
  }
  return d;
}

/* Reads the file's lines; false (with the reason printed) on failure. */
static bool read_lines(const char *path, StrList *lines) {
  int fd = open(path, O_RDONLY);
  if (fd < 0) {
    printf("FAIL %s\n  cannot open: %s\n", path, strerror(errno));
    return false;
  }
  size_t len;
  char *text = slurp_fd(fd, &len);
  close(fd);
  split_lines(lines, text ? text : "", len);
  shm_free(text);
  return true;
}

/* Runs the test described by [e] and judges it, writing the explanation
 * of a failure to [rep]. */
static bool run_and_judge(FILE *rep, const char *exe, const char *path, const Expect *e) {
  if (e->problem[0]) {
    fprintf(rep, "  bad test: %s\n", e->problem);
    return false;
  }
  Outcome o;
  bool ok = run_child(rep, exe, path, e, &o) && judge(rep, e, &o, timeout_seconds());
  shm_free(o.out);
  shm_free(o.err);
  return ok;
}

/* Runs one test file and prints its PASS/FAIL line, then the reasons of a
 * failure: 1 if it passed, 0 if not, -1 when it was skipped (SKIP and why:
 * it cannot run over mpi_procs processes). */
static int run_test(const char *exe, const char *path) {
  StrList lines = {0};
  if (!read_lines(path, &lines)) return false;
  char *dir = dir_of(path);
  Expect e;
  parse_expect(&e, &lines, dir ? dir : ".");
  list_free(&lines);
  shm_free(dir);
  const char *skip = mpi_procs && !e.problem[0] ? mpi_skip(&e) : NULL;
  if (skip) {
    printf("SKIP %s (%s)\n", path, skip);
    expect_free(&e);
    return -1;
  }
  char *report = NULL;
  size_t size = 0;
  FILE *rep = open_memstream(&report, &size);
  bool ok = rep && run_and_judge(rep, exe, path, &e);
  if (rep) fclose(rep);
  printf("%s %s\n%s", ok ? "PASS" : "FAIL", path, report ? report : "");
  free(report);  /* open_memstream's buffer comes from malloc */
  expect_free(&e);
  return ok;
}

static int cmp_names(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool is_test_name(const char *name) {
  size_t n = strlen(name);
  return name[0] != '_' && name[0] != '.' && n > 4 && strcmp(name + n - 4, ".shm") == 0;
}

/* Appends the test files of directory [dir], sorted, to [tests]. */
static bool collect_dir(const char *dir, StrList *tests) {
  DIR *d = opendir(dir);
  if (!d) return false;
  StrList names = {0};
  for (struct dirent *ent; (ent = readdir(d));)
    if (is_test_name(ent->d_name)) list_push_str(&names, ent->d_name);
  closedir(d);
  if (names.len) qsort(names.items, names.len, sizeof *names.items, cmp_names);
  size_t dlen = strlen(dir);
  bool slash = dlen && dir[dlen - 1] == '/';
  for (size_t i = 0; i < names.len; i++) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s%s%s", dir, slash ? "" : "/", names.items[i]);
    list_push_str(tests, buf);
  }
  list_free(&names);
  return true;
}

/* Expands the command-line paths into the list of test files. */
static void collect(int n, char *const paths[], StrList *tests) {
  for (int i = 0; i < n; i++) {
    struct stat st;
    if (stat(paths[i], &st) == 0 && S_ISDIR(st.st_mode) && collect_dir(paths[i], tests))
      continue;
    list_push_str(tests, paths[i]);
  }
}

int testrun_main(int n, char *const paths[], const char *exe) {
  StrList tests = {0};
  int passed = 0, failed = 0;
  if (!exe) exe = "/proc/self/exe";
  const char *procs = getenv("SHMAP_TEST_MPI");
  mpi_procs = procs ? atoi(procs) : 0;
  if (mpi_procs && !strcmp(exe, "/proc/self/exe")) {
    static char self[4096];   /* mpirun runs a path, not this process's link */
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len > 0) self[len] = 0, exe = self;
  }
  collect(n, paths, &tests);
  for (size_t i = 0; i < tests.len; i++) {
    int r = run_test(exe, tests.items[i]);
    if (r > 0) passed++;
    else if (r == 0) failed++;
    fflush(stdout);
  }
  list_free(&tests);
  printf("%d passed, %d failed\n", passed, failed);
  fflush(stdout);
  return failed == 0 ? 0 : 1;
}
