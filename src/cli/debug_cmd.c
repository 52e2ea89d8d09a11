/*
 * debug_cmd.c - the debugger's commands (pdb's, with pdb's meanings and
 * output shapes), their table for `help` and completion, and dispatching a
 * line typed at the prompt; a line in a shard_map body that calls a
 * collective runs on every device (dbg_run_everywhere).  The state and the
 * stop they work on: debug_impl.h.
 */
#include "cli/debug_impl.h"
#include "cli/repl.h"

#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lang/builtins.h"
#include "spmd/shardmap.h"
#include "base/intern.h"
#include "base/mem.h"
#include "lang/ops.h"
#include "lang/parser.h"
#include "array/prim.h"
#include "array/print.h"
#include "transform/trace.h"

/* ==== the commands ==================================================================== */


static const Cmd *cmd_lookup(const char *word);
static int dispatch_command(Stop *st, const char *line, Resume *r);

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
  const View *v = dbg_st_cur(st);
  return v ? v->depth : 0;
}

/* At a breakpoint() staged in a jit plan, step, next, return and until
 * say that the rest of the plan runs at once (its statements were traced:
 * there is none to stop at, as with jax.debug.breakpoint), not silently. */
static void plan_note(const char *cmd) {
  if (dbg_at_plan_stop())
    printf("*** %s: a jit plan has no statements to stop at: the rest of it runs at once, "
           "up to the statement after the jit call\n", cmd);
}

static int cmd_step(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)arg;
  plan_note("step");
  *r = (Resume){RM_STEP, 0, 0};
  return 1;
}

static int cmd_next(Stop *st, const char *arg, Resume *r) {
  (void)arg;
  plan_note("next");
  *r = (Resume){RM_NEXT, cur_depth(st), 0};
  return 1;
}

static int cmd_return(Stop *st, const char *arg, Resume *r) {
  (void)arg;
  plan_note("return");
  *r = (Resume){RM_RETURN, cur_depth(st), 0};
  return 1;
}

static int cmd_until(Stop *st, const char *arg, Resume *r) {
  const View *v = dbg_st_cur(st);
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
  plan_note("until");
  *r = (Resume){RM_UNTIL, cur_depth(st), line};
  return 1;
}

static int cmd_continue(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)arg;
  *r = (Resume){RM_CONTINUE, 0, 0};
  return 1;
}

static int cmd_restart(Stop *st, const char *arg, Resume *r);

/* quit; in --pm's post-mortem of a script, the program runs again from
 * its start, as `python -m pdb` does after an uncaught exception (the end
 * of input still ends it). */
static int cmd_quit(Stop *st, const char *arg, Resume *r) {
  (void)arg;
  if (st->uncaught && dbg_state.restartable && st->main.n > 0) {
    printf("Post mortem debugger finished. The %s will be restarted\n", st->main.v[0].src->name);
    return cmd_restart(st, "", r);
  }
  *r = (Resume){RM_QUIT, 0, 0};
  return 1;
}

/* pdb's restart (and run): ends the program as quit does, through the
 * same unwinding (a shard_map call in progress is aborted first), and
 * main.c runs it again from the start (dbg_take_restart). */
static int cmd_restart(Stop *st, const char *arg, Resume *r) {
  (void)st;
  if (!dbg_state.restartable) {
    printf("*** restart is not available here: there is no script to run again\n");
    return 0;
  }
  shm_free(dbg_state.restart_args);
  dbg_state.restart_args = *arg ? shm_strdup(arg) : NULL;
  dbg_state.restart = true;
  *r = (Resume){RM_QUIT, 0, 0};
  return 1;
}

/* ---- the stack ---- */

static int cmd_where(Stop *st, const char *arg, Resume *r) {
  (void)arg, (void)r;
  for (int i = 0; i < dbg_st_nframes(st); i++) dbg_print_view(dbg_st_frame(st, i), i == st->level ? "> " : "  ");
  return 0;
}

static int move_frame(Stop *st, int by) {
  int n = dbg_st_nframes(st), to = st->level + by;
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
  dbg_print_view(dbg_st_cur(st), "> ");
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
  pthread_mutex_lock(&dbg_state.lock);
  for (int i = 0; i < dbg_state.nbps && !found; i++)
    found = dbg_state.bps[i].line == line && dbg_file_matches(dbg_state.bps[i].file, file);
  pthread_mutex_unlock(&dbg_state.lock);
  return found;
}

/* Lists lines [first, last] of [src] in pdb's shape: number, 'B' at a
 * breakpoint, '->' at line [cur]. */
static void list_lines(const Source *src, int first, int last, int cur) {
  if (first < 1) first = 1;
  for (int l = first; l <= last; l++) {
    const char *t;
    int n;
    if (!dbg_src_line(src, l, &t, &n)) {
      printf("[EOF]\n");
      break;
    }
    char num[16];
    int w = snprintf(num, sizeof num, "%3d", l);
    printf("%s%s%c%s\t%.*s\n", num, w < 4 ? " " : "", has_bp_at(src->name, l) ? 'B' : ' ',
           l == cur ? "->" : "", n, t);
  }
}

/* Lists lines [first, last] of the current frame's source; `list` goes on
 * after them. */
static void list_range(Stop *st, int first, int last) {
  const View *v = dbg_st_cur(st);
  list_lines(v->src, first, last, v->line);
  st->list_next = last + 1;
}

/* A line number argument, kept where arithmetic on it cannot overflow. */
static int line_arg(long n) { return n < -(1L << 24) ? -(1 << 24) : n > (1L << 24) ? 1 << 24 : (int)n; }

static int cmd_list(Stop *st, const char *arg, Resume *r) {
  (void)r;
  const View *v = dbg_st_cur(st);
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
  if (dbg_src_line(v->src, v->line, &t, &n)) cur_indent = indent_of(t, n);
  int def = 0, def_indent = 0;
  for (int l = v->line; l >= 1 && !def; l--) {
    if (!dbg_src_line(v->src, l, &t, &n)) continue;
    int in = indent_of(t, n);
    if (in < cur_indent && opens_function(t + in, n - in, v->fname)) def = l, def_indent = in;
  }
  if (!def) return false;
  int end = def;
  for (int l = def + 1; dbg_src_line(v->src, l, &t, &n); l++) {
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
  const View *v = dbg_st_cur(st);
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
  for (; dbg_src_line(v->src, l, &t, &n); l++) {
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
  const View *v = dbg_st_cur(st);
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
  pthread_mutex_lock(&dbg_state.lock);
  if (dbg_state.nbps) printf("Num Type         Disp Enb   Where\n");
  for (int i = 0; i < dbg_state.nbps; i++) {
    const Bp *b = &dbg_state.bps[i];
    printf("%-4dbreakpoint   %s %s at %s:%d\n", b->number, b->temporary ? "del " : "keep",
           b->enabled ? "yes  " : "no   ", b->file, b->line);
    if (b->cond) printf("\tstop only if %s\n", b->cond);
    if (b->ignore) printf("\tignore next %d hits\n", b->ignore);
    if (b->hits) printf("\tbreakpoint already hit %d time%s\n", b->hits, b->hits == 1 ? "" : "s");
  }
  pthread_mutex_unlock(&dbg_state.lock);
}

/* The source a breakpoint names: the current frame's when [file] is NULL
 * or names it, else the file read afresh.  A new reference, or NULL after
 * saying why. */
static Source *bp_source(const Stop *st, const char *file) {
  const View *v = dbg_st_cur(st);
  if (v && (!file || dbg_file_matches(file, v->src->name))) {
    src_incref(v->src);
    return v->src;
  }
  for (int i = 0; file && i < dbg_st_nframes(st); i++)
    if (dbg_file_matches(file, dbg_st_frame(st, i)->src->name)) {
      src_incref(dbg_st_frame(st, i)->src);
      return dbg_st_frame(st, i)->src;
    }
  if (!file) return printf("*** no current file: give file:line\n"), NULL;
  Source *s = src_from_file(file);
  if (!s) printf("*** '%s' not found\n", file), err_clear();
  return s;
}

/* A function name as a breakpoint location: its first statement; a
 * shard_map or jit function's is its wrapped function's (__wrapped__). */
static bool bp_function(const Stop *st, const char *name, char *file, size_t cap, int *line) {
  const View *v = dbg_st_cur(st);
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
  if (!dbg_src_line(src, line, &t, &n)) {
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
  if (!ok) printf("*** Invalid condition %s: %s\n", cond, err_occurred() ? err_text() : "not an expression");
  err_clear();
  ast_free(mod);
  src_decref(src);
  return ok;
}

static void bp_add(const char *file, int line, const char *cond, bool temporary) {
  int number = dbg_bp_insert(file, line, cond, NULL, NULL, temporary);
  if (number) printf("Breakpoint %d at %s:%d\n", number, file, line);
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
  pthread_mutex_lock(&dbg_state.lock);
  Bp *b = dbg_bp_find(number);
  if (b) {
    printf("Deleted breakpoint %d at %s:%d\n", b->number, b->file, b->line);
    dbg_bp_delete(b);
  }
  pthread_mutex_unlock(&dbg_state.lock);
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
  pthread_mutex_lock(&dbg_state.lock);
  for (int i = 0; i < dbg_state.nbps && n < cap; i++)
    if (!file || (dbg_state.bps[i].line == line && dbg_file_matches(file, dbg_state.bps[i].file)))
      out[n++] = dbg_state.bps[i].number;
  pthread_mutex_unlock(&dbg_state.lock);
  return n;
}

static void clear_all(void) {
  int nums[256];
  char *reply = dbg_read_command("Clear all breaks? ");
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
  dbg_update_engaged();
  return 0;
}

static void set_enabled(int number, bool on) {
  pthread_mutex_lock(&dbg_state.lock);
  Bp *b = dbg_bp_find(number);
  if (!b) {
    printf("*** No breakpoint numbered %d\n", number);
  } else {
    if (b->enabled != on) atomic_fetch_add(&dbg_state.nbp_enabled, on ? 1 : -1);
    b->enabled = on;
    printf("%s breakpoint %d at %s:%d\n", on ? "Enabled" : "Disabled", b->number, b->file, b->line);
  }
  pthread_mutex_unlock(&dbg_state.lock);
}

static void enable_one(int number) { set_enabled(number, true); }
static void disable_one(int number) { set_enabled(number, false); }

static int cmd_disable(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)r;
  each_number(arg, disable_one);
  dbg_update_engaged();
  return 0;
}

static int cmd_enable(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)r;
  each_number(arg, enable_one);
  dbg_update_engaged();
  return 0;
}

/* Sets breakpoint [number]'s ignore count to [count] and says so in
 * pdb's words (a count below 1 clears it, as pdb treats it). */
static void set_ignore(int number, int count) {
  pthread_mutex_lock(&dbg_state.lock);
  Bp *b = dbg_bp_find(number);
  if (!b) {
    printf("*** No breakpoint numbered %d\n", number);
  } else {
    b->ignore = count > 0 ? count : 0;
    if (count > 1) printf("Will ignore next %d crossings of breakpoint %d.\n", count, number);
    else if (count == 1) printf("Will ignore next 1 crossing of breakpoint %d.\n", number);
    else printf("Will stop next time breakpoint %d is reached.\n", number);
  }
  pthread_mutex_unlock(&dbg_state.lock);
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
  for (int i = 0; i < dbg_state.nbpcmds; i++)
    if (dbg_state.bpcmds[i].number == number) return &dbg_state.bpcmds[i];
  return NULL;
}

/* Frees [bc]'s lines, leaving it empty. */
void dbg_bpcmds_free_lines(BpCmds *bc) {
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
  if (bc) dbg_bpcmds_free_lines(bc);
  if (!n && !silent) {
    if (bc) *bc = dbg_state.bpcmds[--dbg_state.nbpcmds];
    shm_free(lines);
    return;
  }
  if (!bc) {
    BpCmds *t = shm_realloc(dbg_state.bpcmds, sizeof(BpCmds) * (size_t)(dbg_state.nbpcmds + 1));
    if (!t) {
      dbg_bpcmds_free_lines(&(BpCmds){.n = n, .lines = lines});
      return;
    }
    dbg_state.bpcmds = t;
    bc = &dbg_state.bpcmds[dbg_state.nbpcmds++];
  }
  *bc = (BpCmds){number, silent, n, lines};
}

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
  for (char *line; (line = dbg_read_command("(com) "));) {
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
  pthread_mutex_lock(&dbg_state.lock);
  if (!*arg) n = dbg_state.next_bp;
  bool found = n >= INT_MIN && n <= INT_MAX && dbg_bp_find((int)n);
  pthread_mutex_unlock(&dbg_state.lock);
  if (!found) return printf("*** No breakpoint numbered %ld\n", n), 0;
  read_command_list((int)n);
  return 0;
}

/* Runs the command list of the breakpoint the stop is at, as if typed
 * (pdb's bp_commands); 1 when one of them resumed the program (*r set).
 * A list that ends with a resuming command never prompts: when that
 * command does not resume by itself (jump, or it failed) the program
 * continues. */
int dbg_run_bp_commands(Stop *st, Resume *r, bool *silent) {
  const BpCmds *bc = bpcmds_find(st->bp);
  int n = bc ? bc->n : 0;
  bool last_resumes = n > 0 && line_resumes(bc->lines[n - 1]);
  *silent = bc && bc->silent;
  for (int i = 0; i < n; i++) {
    bc = bpcmds_find(st->bp);   /* a command of the list may have replaced it */
    char *line = bc && i < bc->n ? shm_strdup(bc->lines[i]) : NULL;
    if (!line) break;
    int go = dbg_dispatch(st, line, r);
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
  int m = dbg_node_last_line(n);
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
  if (st->level != dbg_st_nframes(st) - 1) {
    printf("*** You can only jump within the bottom frame\n");
    return NULL;
  }
  if (st->pm) {
    printf("*** Jump failed: the program has ended (post-mortem)\n");
    return NULL;
  }
  if (dbg_st_cur(st) && dbg_st_cur(st)->retval) {   /* pdb: only from a 'line' event */
    printf("*** Jump failed: the frame is returning (--Return--); jump from a line\n");
    return NULL;
  }
  if (!st->call) return st->frame;
  const Frame *f = NULL;
  pthread_mutex_lock(&dbg_state.lock);
  if (st->call->slots[dbg_state.focus].state == DS_PARKED) f = st->call->slots[dbg_state.focus].frame;
  pthread_mutex_unlock(&dbg_state.lock);
  if (f) return f;
  dbg_device_state(st, dbg_state.focus, state, sizeof state);
  printf("*** Jump failed: device %s is not stopped at a statement (%s)\n",
         dbg_coords_of(st, dbg_state.focus, c, sizeof c), state);
  return NULL;
}

/* True when every device of the call is parked at [f]'s statement and
 * depth, so that all of them jump together and none is left behind; else
 * says which device is elsewhere. */
static bool devices_together(const Stop *st, const Frame *f) {
  DbgCall *c = st->call;
  char cbuf[160], state[320];
  int bad = -1;
  pthread_mutex_lock(&dbg_state.lock);
  int depth = c->slots[dbg_state.focus].depth;
  for (int r = 0; r < c->n && bad < 0; r++) {
    const Slot *s = &c->slots[r];
    if (s->state != DS_PARKED || s->retval || s->frame->stmt != f->stmt || s->depth != depth)
      bad = r;
  }
  pthread_mutex_unlock(&dbg_state.lock);
  if (bad < 0) return true;
  dbg_device_state(st, bad, state, sizeof state);
  printf("*** Jump failed: all devices must be stopped at this statement to jump together; "
         "device %s: %s\n", dbg_coords_of(st, bad, cbuf, sizeof cbuf), state);
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
    v->last_line = dbg_node_last_line(to) > v->line ? dbg_node_last_line(to) : v->line;
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
  dbg_print_view(dbg_st_cur(st), "> ");
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

/* Splits "EXPR @ dev SPEC" into EXPR and SPEC (a device number or mesh
 * coordinates, as `dev` takes them): NULL when there is no such suffix.
 * "@ dev" followed by more cannot be a Python expression, so it never
 * takes a matrix product ("y @ 2") for a device. */
static char *split_at_dev(char *expr) {
  for (char *at = expr + strlen(expr); at-- > expr;) {
    if (*at != '@') continue;
    char *p = at + 1;
    while (*p == ' ') p++;
    if (strncmp(p, "dev", 3) != 0 || (p[3] != ' ' && p[3] != '(')) continue;
    *at = 0;
    trim(expr);
    p += 3;
    while (*p == ' ') p++;
    return p;
  }
  return NULL;
}

/* Device [r]'s frame in which `p x @ all` and a line run on every device
 * evaluate: as many levels up as the focused device's selected frame
 * (`up` and `down` select it for all of them); NULL when it has none. */
static const View *dev_view(const Stop *st, int r) {
  const Stack *fs = dbg_focus_stack(st), *s = &st->dev[r];
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

bool dbg_text_calls_collective(const char *text, Env *env) {
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
 * running it waits in a collective for a device that has not reached it
 * (coll_waits_for_peer: one whose collective is complete but whose thread
 * has not woken yet on a busy machine goes on), and some device is done
 * with it, so will never join (the line failed there only).  [sig] sums
 * the waiting ones' collective counters, for the caller to see that
 * nothing moved. */
static bool job_stuck(DbgCall *c, const Job *j, long *sig) {
  *sig = 0;
  if (j->pending == c->n) return false;
  for (int r = 0; r < c->n; r++) {
    if (j->out[r]) continue;
    if (!coll_waits_for_peer(c->g, r)) return false;   /* not for a peer: it goes on */
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
    dbg_timed_wait();
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
  for (int r = 0; r < st->ndev; r++) dbg_flush_device(st->call, r);
  bool alike = true;
  for (int r = 1; r < st->ndev; r++) alike = alike && strcmp(j->out[r], j->out[0]) == 0;
  if (j->expr && !all) {
    printf("%s\n", j->out[dbg_state.focus]);
    return;
  }
  if (!j->expr && alike) {
    if (j->out[0][0]) printf("%s\n", j->out[0]);
    return;
  }
  for (int r = 0; r < st->ndev; r++) {
    if (!j->expr && !j->out[r][0]) continue;
    snprintf(prefix, sizeof prefix, "%s: ", dbg_coords_of(st, r, c, sizeof c));
    dbg_print_prefixed(prefix, j->out[r]);
  }
}

/* Runs [text] (an expression when [expr]) on every device of the stop's
 * call, each in its selected frame, when it calls a collective: such a
 * line needs every device, as in the body itself (LANGUAGE.md §7).  False,
 * doing nothing, when the line calls none or the focused frame is not a
 * device's.  Every device must be parked at a statement; else the line is
 * refused, naming the device that is not, so it can never hang. */
bool dbg_run_everywhere(const Stop *st, const char *text, bool expr, bool pretty, bool all) {
  DbgCall *c = st->call;
  const View *fv = dbg_st_cur(st);
  if (!c || !fv || st->level < st->main.n || !dbg_text_calls_collective(text, fv->env)) return false;
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
  pthread_mutex_lock(&dbg_state.lock);
  int missing = env && out ? first_unparked(c) : -1;
  if (env && out && missing < 0) {
    c->job = &j;
    c->job_gen++;
    pthread_cond_broadcast(&dbg_state.cond);
    wait_job(c, &j);
    c->job = NULL;
  }
  pthread_mutex_unlock(&dbg_state.lock);
  if (!env || !out) {
    printf("*** out of memory\n");
  } else if (missing >= 0) {
    dbg_device_state(st, missing, state, sizeof state);
    printf("*** the line calls a collective, which runs on every device, but device %s is "
           "not stopped at a statement (%s)\n",
           dbg_coords_of(st, missing, coords, sizeof coords), state);
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
    snprintf(prefix, sizeof prefix, "%s: ", dbg_coords_of(st, r, c, sizeof c));
    const View *v = dev_view(st, r);
    if (!v) {
      dbg_device_state(st, r, state, sizeof state);
      printf("%s(%s)\n", prefix, state);
      continue;
    }
    char *t = dbg_value_text(st, v, r, expr, pretty, FAIL_P);
    if (t) dbg_print_prefixed(prefix, t);
    shm_free(t);
  }
}

/* `p x @ dev SPEC`: the value on device SPEC, in its frame as many levels
 * up as the focused device's selected one (a line that calls a
 * collective runs on every device and shows that device's). */
static void print_on_device(Stop *st, const char *expr, const char *spec, bool pretty) {
  if (!st->mesh) {
    printf("*** not stopped inside a shard_map body\n");
    return;
  }
  int r = dbg_parse_rank(st, spec);
  if (r < 0) return;
  const View *v = dev_view(st, r);
  int focus = dbg_state.focus;
  dbg_state.focus = r;
  bool ran = dbg_st_cur(st) && dbg_run_everywhere(st, expr, true, pretty, false);
  dbg_state.focus = focus;
  if (ran) return;
  char state[320];
  if (!v) {
    dbg_device_state(st, r, state, sizeof state);
    printf("*** device %d has no frame (%s)\n", r, state);
    return;
  }
  char *t = dbg_value_text(st, v, r, expr, pretty, FAIL_P);
  if (t) printf("%s\n", t);
  shm_free(t);
}

static int print_value(Stop *st, const char *arg, bool pretty) {
  char *expr = shm_strdup(arg);
  const View *v = dbg_st_cur(st);
  if (!expr) return 0;
  trim(expr);
  char *dev = *expr ? split_at_dev(expr) : NULL;
  if (!*expr) {
    printf("*** usage: p expression [@ all | @ dev device]\n");
  } else if (dev) {
    print_on_device(st, expr, dev, pretty);
  } else if (split_at_all(expr)) {
    if (!dbg_run_everywhere(st, expr, true, pretty, true)) print_all(st, expr, pretty);
  } else if (!v) {
    printf("*** no frame\n");
  } else if (!dbg_run_everywhere(st, expr, true, pretty, false)) {
    char *t = dbg_value_text(st, v, dbg_st_rank_of(st, st->level), expr, pretty, FAIL_P);
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
  if (r) dbg_print_prefixed(prefix, str_cstr(r));
  else dbg_print_error();
  val_decref(r);
}

/* retval [@ all]: the value the current frame is returning, at a return
 * stop (pdb's); with '@ all', each device's, in its innermost frame. */
static int cmd_retval(Stop *st, const char *arg, Resume *r) {
  (void)r;
  char c[160], prefix[176], state[320];
  bool all = strcmp(arg, "@ all") == 0 || strcmp(arg, "@all") == 0;
  if (*arg && !all) return printf("*** usage: retval [@ all]\n"), 0;
  if (!all) return print_retval(dbg_st_cur(st), ""), 0;
  if (!st->mesh) return printf("*** not stopped inside a shard_map body\n"), 0;
  for (int i = 0; i < st->ndev; i++) {
    const Stack *s = &st->dev[i];
    snprintf(prefix, sizeof prefix, "%s: ", dbg_coords_of(st, i, c, sizeof c));
    if (s->n > 0) {
      print_retval(&s->v[s->n - 1], prefix);
      continue;
    }
    dbg_device_state(st, i, state, sizeof state);
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
  pthread_mutex_lock(&dbg_state.lock);
  Bp *b = dbg_bp_find((int)n);
  if (!b) {
    printf("*** No breakpoint numbered %ld\n", n);
  } else {
    shm_free(b->cond);
    b->cond = *end ? shm_strdup(end) : NULL;
    if (b->cond) printf("New condition set for breakpoint %ld.\n", n);
    else printf("Breakpoint %ld is now unconditional.\n", n);
  }
  pthread_mutex_unlock(&dbg_state.lock);
  return 0;
}

/* whatis expr: the type of its value (pdb). */
static int cmd_whatis(Stop *st, const char *arg, Resume *r) {
  (void)r;
  const View *v = dbg_st_cur(st);
  if (!v || !*arg) return printf("*** usage: whatis expression\n"), 0;
  Value *x = dbg_eval_in(st, v, dbg_st_rank_of(st, st->level), arg);
  if (!x) return dbg_print_error(), 0;
  Value *t = builtins_type_of(x);   /* type(x): <class 'int'> for a Python number */
  val_decref(x);
  Value *rep = val_repr(t);
  val_decref(t);
  if (!rep) return dbg_print_error(), 0;
  printf("%s\n", str_cstr(rep));
  val_decref(rep);
  return 0;
}

static int stmt_end_line(const Node *n);

static int cmd_debug(Stop *st, const char *arg, Resume *r) {
  (void)r;
  if (!*arg) return printf("*** usage: debug code\n"), 0;
  dbg_debug_code(st, arg);
  return 0;
}

/* source expression: the lines of the function the expression names, its
 * decorators included (pdb's, through inspect.getsourcelines). */
static int cmd_source(Stop *st, const char *arg, Resume *r) {
  (void)r;
  const View *v = dbg_st_cur(st);
  if (!v || !*arg) return printf("*** usage: source expression\n"), 0;
  Value *x = dbg_eval_in(st, v, dbg_st_rank_of(st, st->level), arg);
  if (!x) return dbg_print_error(), 0;
  if (x->type != V_FUNC) {
    Value *rep = val_repr(x);
    printf("*** source code not available for %s\n", rep ? str_cstr(rep) : "this value");
    err_clear();
    val_decref(rep);
    val_decref(x);
    return 0;
  }
  const Func *f = (const Func *)x;
  int first = f->node->loc.line;
  for (int i = 0; f->node->kind == N_DEF && i < f->node->decorators.n; i++)
    if (f->node->decorators.items[i]->loc.line < first) first = f->node->decorators.items[i]->loc.line;
  list_lines(f->mod->src, first, stmt_end_line(f->node), f->mod->src == v->src ? v->line : 0);
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
  const View *v = dbg_st_cur(st);
  if (!*arg) {   /* pdb lists the current frame's */
    printf("Currently displaying:\n");
    for (int i = 0; v && i < dbg_state.ndisplays; i++) {
      const Display *d = &dbg_state.displays[i];
      int k = dbg_display_index(st, d, v);
      if (k >= 0) printf("%s: %s\n", d->expr, d->last[k] ? d->last[k] : "");
    }
    return 0;
  }
  if (!v) return 0;
  int rank = dbg_st_rank_of(st, st->level), n = rank >= 0 ? st->ndev : 1;
  Display d = {shm_strdup(arg), n, rank >= 0, shm_calloc((size_t)n, sizeof(Env *)),
               shm_calloc((size_t)n, sizeof(char *))};
  Display *all = shm_realloc(dbg_state.displays, sizeof(Display) * (size_t)(dbg_state.ndisplays + 1));
  if (!d.expr || !d.env || !d.last || !all) {
    d.n = 0;
    dbg_display_free(&d);
    if (all) dbg_state.displays = all;
    return printf("*** out of memory\n"), 0;
  }
  dbg_state.displays = all;
  for (int k = 0; k < n; k++) {   /* the same frame on every device */
    const View *dv = rank >= 0 ? dev_view(st, k) : v;
    if ((d.env[k] = dv ? dv->env : NULL)) env_incref(d.env[k]);
  }
  int k = rank >= 0 ? rank : 0;
  d.last[k] = dbg_value_text(st, v, rank, arg, false, FAIL_DISPLAY);
  dbg_state.displays[dbg_state.ndisplays++] = d;
  printf("display %s: %s\n", arg, d.last[k] ? d.last[k] : "");
  return 0;
}

static int cmd_undisplay(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)r;
  int kept = 0;
  bool found = false;
  for (int i = 0; i < dbg_state.ndisplays; i++) {
    Display *d = &dbg_state.displays[i];
    if (!*arg || strcmp(d->expr, arg) == 0) {
      found = true;
      dbg_display_free(d);
    } else {
      dbg_state.displays[kept++] = *d;
    }
  }
  dbg_state.ndisplays = kept;
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
    char *line = dbg_read_command(prompt);
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
    DevCtx dc, *saved = dbg_enter_device(st, dbg_st_rank_of(st, st->level), &dc);
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
  const View *v = dbg_st_cur(st);
  if (!v) return printf("*** no frame to run in\n"), 0;
  Env *ns = env_new(v->env);
  if (!ns || builtins_add(ns, "exit", bi_interact_exit, "exit(): leave interact") < 0 ||
      builtins_add(ns, "quit", bi_interact_exit, "quit(): leave interact") < 0) {
    if (ns) env_decref(ns);
    return dbg_print_error(), 0;
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
    dbg_device_state(st, i, s, sizeof s);
    printf("%c %d %s  %s\n", i == dbg_state.focus ? '*' : ' ', i, dbg_coords_of(st, i, c, sizeof c), s);
  }
  return 0;
}

static int cmd_dev(Stop *st, const char *arg, Resume *r) {
  (void)r;
  char c[160];
  if (!st->mesh) return printf("*** not stopped inside a shard_map body\n"), 0;
  if (!*arg) return printf("device %d %s\n", dbg_state.focus, dbg_coords_of(st, dbg_state.focus, c, sizeof c)), 0;
  int rank = dbg_parse_rank(st, arg);
  if (rank < 0) return 0;
  dbg_state.focus = rank;
  st->level = dbg_st_nframes(st) - 1;
  st->list_next = 0;
  dbg_print_location(st);
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
    {"debug", cmd_debug, "debug code",
     "Run code (statements) in the current frame under a nested debugger, which stops\n"
     "before its first statement; its quit ends the code alone."},
    {"source", cmd_source, "source expression",
     "List the source of the function the expression names."},
    {"alias", dbg_cmd_alias, "alias [name [command]]",
     "Make name stand for command, in which %1..%9 are its arguments and %* all of them;\n"
     "with a name only, show its command; with none, list the aliases."},
    {"unalias", dbg_cmd_unalias, "unalias name", "Delete the alias name."},
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
    {"p", cmd_p, "p expression [@ all | @ dev device]",
     "Print the value of expression in the current frame; with '@ all', on every device\n"
     "of the shard_map body, each line prefixed by the device's mesh coordinates; with\n"
     "'@ dev 3' or '@ dev (i=1, j=0)', on that device.  An expression that calls a\n"
     "collective runs on every device at once."},
    {"pp", cmd_pp, "pp expression [@ all | @ dev device]",
     "Like p, a long tuple or list one item per line."},
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

void dbg_comp_commands(void) {
  for (size_t i = 0; i < sizeof commands / sizeof *commands; i++) {
    const char *p = commands[i].names;
    while (*p) {
      size_t k = strcspn(p, " ");
      char w[32];
      snprintf(w, sizeof w, "%.*s", (int)k, p);
      dbg_comp_add(w, NULL, NULL);
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

/* Runs one command line, its alias expanded; 1 when the program resumes
 * (*r set). */
int dbg_dispatch(Stop *st, const char *line, Resume *r) {
  while (*line == ' ' || *line == '\t') line++;
  if (*line == '!') {
    dbg_exec_in(st, line + 1);
    return 0;
  }
  char *expanded = dbg_alias_expand(line);
  if (!expanded) return printf("*** out of memory\n"), 0;
  int go = dispatch_command(st, expanded, r);
  shm_free(expanded);
  return go;
}

/* dbg_dispatch past the aliases. */
static int dispatch_command(Stop *st, const char *line, Resume *r) {
  while (*line == ' ' || *line == '\t') line++;
  char word[32];
  size_t n = first_word(line, word, sizeof word);
  const Cmd *c = n ? cmd_lookup(word) : NULL;
  if (!c) {
    dbg_exec_in(st, line);
    return 0;
  }
  char *arg = shm_strdup(line + n);
  if (!arg) return 0;
  trim(arg);
  int go = c->fn(st, arg, r);
  shm_free(arg);
  return go;
}

