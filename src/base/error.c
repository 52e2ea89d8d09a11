/*
 * error.c - sources, locations and the thread-local error state.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"

#include <pthread.h>
#include "base/mem.h"
#include "base/utf8.h"

atomic_int shm_interrupted;
atomic_int shm_interrupt_to_debugger, shm_debugger_interrupted;

/* ---- sources ---------------------------------------------------------- */

static int index_lines(Source *s) {
  int n = 1;
  for (const char *p = s->text; *p; p++)
    if (*p == '\n' && p[1]) n++;
  s->lines = shm_malloc(sizeof(char *) * (size_t)n);
  if (!s->lines) return -1;
  s->nlines = 0;
  const char *p = s->text;
  s->lines[s->nlines++] = p;
  for (; *p; p++)
    if (*p == '\n' && p[1]) s->lines[s->nlines++] = p + 1;
  return 0;
}

/* Every live source, newest first, for src_find (guarded by sources_lock). */
static pthread_mutex_t sources_lock = PTHREAD_MUTEX_INITIALIZER;
static Source *sources;

Source *src_new(const char *name, const char *text) {
  Source *s = shm_calloc(1, sizeof *s);
  if (!s) return err_nomem();
  atomic_init(&s->refcount, 1);
  s->name = shm_strdup(name);
  s->text = shm_strdup(text);
  if (!s->name || !s->text || index_lines(s) < 0) {
    src_decref(s);
    return err_nomem();
  }
  pthread_mutex_lock(&sources_lock);
  s->next_live = sources;
  sources = s;
  s->listed = true;
  pthread_mutex_unlock(&sources_lock);
  return s;
}

Source *src_find(const char *name) {
  pthread_mutex_lock(&sources_lock);
  Source *s = sources;
  while (s && strcmp(s->name, name) != 0) s = s->next_live;
  if (s) src_incref(s);
  pthread_mutex_unlock(&sources_lock);
  return s;
}

Source *src_from_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return err_set(ERR_IO, "cannot open '%s': %s", path, strerror(errno));
  size_t cap = 4096, len = 0;
  char *buf = shm_malloc(cap);
  size_t got;
  while (buf && (got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
    len += got;
    if (len + 1 == cap) {
      char *nb = shm_realloc(buf, cap *= 2);
      if (!nb) { shm_free(buf); buf = NULL; }
      buf = nb;
    }
  }
  int failed = ferror(f);
  fclose(f);
  if (!buf) return err_nomem();
  if (failed) {
    shm_free(buf);
    return err_set(ERR_IO, "cannot read '%s'", path);
  }
  buf[len] = '\0';
  if (strlen(buf) != len) {
    shm_free(buf);
    return err_set(ERR_SYNTAX, "'%s' contains a NUL byte: not a source file", path);
  }
  /* A UTF-8 byte-order mark says only "UTF-8": Python skips it too. */
  bool bom = len >= 3 && !memcmp(buf, "\xEF\xBB\xBF", 3);
  Source *s = src_new(path, buf + (bom ? 3 : 0));
  shm_free(buf);
  return s;
}

void src_incref(Source *s) {
  if (s) atomic_fetch_add(&s->refcount, 1);
}

void src_decref(Source *s) {
  if (!s || atomic_fetch_sub(&s->refcount, 1) != 1) return;
  if (s->listed) {
    pthread_mutex_lock(&sources_lock);
    Source **pp = &sources;
    while (*pp != s) pp = &(*pp)->next_live;
    *pp = s->next_live;
    pthread_mutex_unlock(&sources_lock);
  }
  shm_free(s->name);
  shm_free(s->text);
  shm_free((void *)s->lines);
  shm_free(s);
}

/* ---- the error state: one per thread ------------------------------------ */

static _Thread_local ErrKind cur_kind;
static _Thread_local char cur_msg[2048];
static _Thread_local Loc cur_loc;

#define TRACE_MAX 64
static _Thread_local ErrFrame cur_trace[TRACE_MAX];   /* innermost first */
static _Thread_local int cur_ntrace, cur_dropped, cur_over;   /* repeats; past TRACE_MAX */

static _Thread_local ErrScope cur_scopes[TRACE_MAX];  /* innermost first */
static _Thread_local int cur_nscopes;

void (*err_scope_incref)(void *scope);
void (*err_scope_release)(void *scope);

/* Drops [n] kept frames' references. */
static void scopes_release(ErrScope *sc, int n) {
  for (int i = 0; i < n; i++) {
    src_decref(sc[i].loc.src);
    if (sc[i].scope && err_scope_release) err_scope_release(sc[i].scope);
  }
}

static void trace_clear(void) {
  for (int i = 0; i < cur_ntrace; i++)
    if (cur_trace[i].loc.src) src_decref(cur_trace[i].loc.src);
  cur_ntrace = cur_dropped = cur_over = 0;
  /* the count goes first: releasing a scope may free values whose
   * destructors look at this thread's error state */
  int n = cur_nscopes;
  cur_nscopes = 0;
  scopes_release(cur_scopes, n);
}

void err_push_scope(Loc loc, const char *fname, void *scope) {
  if (cur_kind == ERR_NONE || cur_kind == ERR_QUIT || !loc.src || !scope ||
      !err_scope_incref || cur_nscopes == TRACE_MAX)
    return;
  src_incref(loc.src);
  err_scope_incref(scope);
  cur_scopes[cur_nscopes++] = (ErrScope){loc, fname ? fname : "?", scope, 0};
}

int err_scopes(const ErrScope **out) {
  *out = cur_scopes;
  return cur_nscopes;
}

void err_push_frame(Loc loc, const char *fname, int depth) {
  if (cur_kind == ERR_NONE || cur_kind == ERR_QUIT || !loc.src) return;
  /* the error's own line is the located message; a repeat is one calling
   * line: seen twice from one frame, or a recursion on one line (counted) */
  if (!cur_ntrace && cur_loc.src == loc.src && cur_loc.line == loc.line) return;
  const ErrFrame *last = cur_ntrace ? &cur_trace[cur_ntrace - 1] : NULL;
  if (last && last->loc.src == loc.src && last->loc.line == loc.line) {
    if (last->depth != depth) cur_dropped++;
    return;
  }
  if (cur_ntrace == TRACE_MAX) {
    cur_over++;
    return;
  }
  src_incref(loc.src);
  cur_trace[cur_ntrace++] = (ErrFrame){loc, fname ? fname : "?", depth};
}

static void set_loc(Loc loc) {
  if (loc.src) src_incref(loc.src);
  if (cur_loc.src) src_decref(cur_loc.src);
  cur_loc = loc;
}

static void vset(ErrKind kind, const char *fmt, va_list ap) {
  trace_clear();
  cur_kind = kind;
  vsnprintf(cur_msg, sizeof cur_msg, fmt, ap);
  set_loc((Loc){0});
}

void *err_set(ErrKind kind, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vset(kind, fmt, ap);
  va_end(ap);
  return NULL;
}

void *err_set_at(Loc loc, ErrKind kind, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vset(kind, fmt, ap);
  va_end(ap);
  set_loc(loc);
  return NULL;
}

void *err_nomem(void) {
  return err_set(ERR_MEMORY, "%s", ERR_NOMEM_MSG);
}

void err_locate(Loc loc) {
  if (cur_kind != ERR_NONE && !cur_loc.src && loc.src) set_loc(loc);
}

bool err_occurred(void) { return cur_kind != ERR_NONE; }
ErrKind err_kind(void) { return cur_kind; }
const char *err_message(void) { return cur_msg; }

const char *(*err_class_hook)(void);

/* err_text's result: the class, ": " and the message. */
static _Thread_local char cur_text[sizeof cur_msg + 64];

const char *err_text(void) {
  const char *cls = err_class_hook && cur_kind != ERR_NONE ? err_class_hook() : NULL;
  if (!cls) return cur_msg;
  snprintf(cur_text, sizeof cur_text, "%s: %s", cls, cur_msg);
  return cur_text;
}
Loc err_loc(void) { return cur_loc; }

void err_clear(void) {
  trace_clear();
  cur_kind = ERR_NONE;
  cur_msg[0] = '\0';
  set_loc((Loc){0});
}

void err_save(ErrState *saved) {
  saved->kind = cur_kind;
  saved->msg = shm_strdup(cur_msg);
  saved->loc = cur_loc;
  if (saved->loc.src) src_incref(saved->loc.src);
  saved->trace = cur_ntrace ? shm_malloc(sizeof(ErrFrame) * (size_t)cur_ntrace) : NULL;
  saved->ntrace = saved->trace ? cur_ntrace : 0;
  saved->dropped = cur_dropped + cur_over;
  for (int i = 0; i < saved->ntrace; i++) {   /* the references move with them */
    saved->trace[i] = cur_trace[i];
    cur_trace[i].loc.src = NULL;
  }
  saved->scopes = cur_nscopes ? shm_malloc(sizeof(ErrScope) * (size_t)cur_nscopes) : NULL;
  saved->nscopes = saved->scopes ? cur_nscopes : 0;
  if (saved->scopes) {   /* moved too; without memory they are released below */
    memcpy(saved->scopes, cur_scopes, sizeof(ErrScope) * (size_t)cur_nscopes);
    cur_nscopes = 0;
  }
  err_clear();
}

void err_restore(ErrState *saved) {
  trace_clear();
  cur_kind = saved->kind;
  snprintf(cur_msg, sizeof cur_msg, "%s", saved->msg ? saved->msg : ERR_NOMEM_MSG);
  set_loc(saved->loc);
  if (saved->loc.src) src_decref(saved->loc.src);
  shm_free(saved->msg);
  saved->msg = NULL;
  saved->loc.src = NULL;
  for (int i = 0; i < saved->ntrace; i++) {
    if (cur_ntrace < TRACE_MAX) cur_trace[cur_ntrace++] = saved->trace[i];
    else if (saved->trace[i].loc.src) src_decref(saved->trace[i].loc.src), cur_dropped++;
  }
  cur_dropped += saved->dropped;
  shm_free(saved->trace);
  saved->trace = NULL;
  saved->ntrace = saved->dropped = 0;
  if (saved->nscopes) memcpy(cur_scopes, saved->scopes, sizeof(ErrScope) * (size_t)saved->nscopes);
  cur_nscopes = saved->nscopes;   /* trace_clear above emptied them; at most TRACE_MAX */
  shm_free(saved->scopes);
  saved->scopes = NULL;
  saved->nscopes = 0;
}

void err_state_free(ErrState *saved) {
  shm_free(saved->msg);
  saved->msg = NULL;
  if (saved->loc.src) src_decref(saved->loc.src);
  saved->loc.src = NULL;
  for (int i = 0; i < saved->ntrace; i++)
    if (saved->trace[i].loc.src) src_decref(saved->trace[i].loc.src);
  shm_free(saved->trace);
  saved->trace = NULL;
  saved->ntrace = saved->dropped = 0;
  scopes_release(saved->scopes, saved->nscopes);
  shm_free(saved->scopes);
  saved->scopes = NULL;
  saved->nscopes = 0;
}

ErrState err_state_copy(const ErrState *s) {
  ErrState c = *s;
  c.msg = shm_strdup(s->msg ? s->msg : "");
  if (c.loc.src) src_incref(c.loc.src);
  c.trace = s->ntrace ? shm_malloc(sizeof(ErrFrame) * (size_t)s->ntrace) : NULL;
  c.ntrace = c.trace ? s->ntrace : 0;
  for (int i = 0; i < c.ntrace; i++) {
    c.trace[i] = s->trace[i];
    if (c.trace[i].loc.src) src_incref(c.trace[i].loc.src);
  }
  c.scopes = s->nscopes ? shm_malloc(sizeof(ErrScope) * (size_t)s->nscopes) : NULL;
  c.nscopes = c.scopes ? s->nscopes : 0;
  for (int i = 0; i < c.nscopes; i++) {
    c.scopes[i] = s->scopes[i];
    src_incref(c.scopes[i].loc.src);
    err_scope_incref(c.scopes[i].scope);
  }
  return c;
}

void err_state_tag_scopes(ErrState *s, int tag) {
  for (int i = 0; i < s->nscopes; i++)
    if (!s->scopes[i].tag) s->scopes[i].tag = tag;
}

/* ---- printing -------------------------------------------------------------- */

/* Length of line [i] (1-based) of [s], without its newline. */
static int line_len(const Source *s, int i) {
  const char *p = s->lines[i - 1];
  const char *e = strchr(p, '\n');
  return e ? (int)(e - p) : (int)strlen(p);
}

/* Writes the [n] bytes at [p], each run that is not UTF-8 (a lead byte
 * and its continuation bytes) as one U+FFFD, which keeps the caret under
 * its column, as the lexer counts columns. */
static void put_text(FILE *out, const char *p, size_t n) {
  const char *why;
  size_t ok;
  while ((ok = utf8_check(p, n, &why)) < n) {
    fwrite(p, 1, ok, out);
    fputs("\xEF\xBF\xBD", out);
    do ok++;
    while (ok < n && !utf8_is_lead((unsigned char)p[ok]));
    p += ok;
    n -= ok;
  }
  fwrite(p, 1, n, out);
}

void err_print_caret(FILE *out, Loc loc) {
  const Source *s = loc.src;
  if (!s || loc.line < 1 || loc.line > s->nlines) return;
  int len = line_len(s, loc.line);
  fprintf(out, "%5d | ", loc.line);
  put_text(out, s->lines[loc.line - 1], (size_t)len);
  fputc('\n', out);
  int col = loc.col < 1 ? 1 : loc.col;
  fprintf(out, "      | %*s^\n", col - 1, "");
}

/* Source line [line] of [s] without its leading white space, Python's way. */
static void print_stripped_line(FILE *out, const Source *s, int line) {
  if (line < 1 || line > s->nlines) return;
  const char *p = s->lines[line - 1];
  int n = line_len(s, line);
  while (n > 0 && (*p == ' ' || *p == '\t')) p++, n--;
  fprintf(out, "    %.*s\n", n, p);
}

void err_print(FILE *out) {
  if (cur_kind == ERR_QUIT) return;
  if (cur_ntrace) {
    fputs("Traceback (most recent call last):\n", out);
    if (cur_over) fprintf(out, "  [%d calling lines further out]\n", cur_over);
    for (int i = cur_ntrace - 1; i >= 0; i--) {
      const ErrFrame *f = &cur_trace[i];
      fprintf(out, "  File \"%s\", line %d, in %s\n", f->loc.src->name, f->loc.line, f->fname);
      print_stripped_line(out, f->loc.src, f->loc.line);
    }
    if (cur_dropped)   /* Python's words for a recursion */
      fprintf(out, "  [Previous line repeated %d more times]\n", cur_dropped);
  }
  if (cur_loc.src)
    fprintf(out, "%s:%d:%d: error: %s\n", cur_loc.src->name, cur_loc.line,
            cur_loc.col, err_text());
  else
    fprintf(out, "shmap: error: %s\n", cur_msg);   /* the command line's, not an exception */
  err_print_caret(out, cur_loc);
}
