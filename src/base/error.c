/*
 * error.c - sources, locations and the thread-local error state.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/mem.h"

atomic_int shm_interrupted;

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
  Source *s = src_new(path, buf);
  shm_free(buf);
  return s;
}

void src_incref(Source *s) {
  if (s) atomic_fetch_add(&s->refcount, 1);
}

void src_decref(Source *s) {
  if (!s || atomic_fetch_sub(&s->refcount, 1) != 1) return;
  shm_free(s->name);
  shm_free(s->text);
  shm_free((void *)s->lines);
  shm_free(s);
}

/* ---- the error state: one per thread ------------------------------------ */

static _Thread_local ErrKind cur_kind;
static _Thread_local char cur_msg[2048];
static _Thread_local Loc cur_loc;

static void set_loc(Loc loc) {
  if (loc.src) src_incref(loc.src);
  if (cur_loc.src) src_decref(cur_loc.src);
  cur_loc = loc;
}

static void vset(ErrKind kind, const char *fmt, va_list ap) {
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
  return err_set(ERR_MEMORY, "out of memory");
}

void err_locate(Loc loc) {
  if (cur_kind != ERR_NONE && !cur_loc.src && loc.src) set_loc(loc);
}

bool err_occurred(void) { return cur_kind != ERR_NONE; }
ErrKind err_kind(void) { return cur_kind; }
const char *err_message(void) { return cur_msg; }
Loc err_loc(void) { return cur_loc; }

void err_clear(void) {
  cur_kind = ERR_NONE;
  cur_msg[0] = '\0';
  set_loc((Loc){0});
}

void err_save(ErrState *saved) {
  saved->kind = cur_kind;
  saved->msg = shm_strdup(cur_msg);
  saved->loc = cur_loc;
  if (saved->loc.src) src_incref(saved->loc.src);
  err_clear();
}

void err_restore(ErrState *saved) {
  cur_kind = saved->kind;
  snprintf(cur_msg, sizeof cur_msg, "%s", saved->msg ? saved->msg : "out of memory");
  set_loc(saved->loc);
  if (saved->loc.src) src_decref(saved->loc.src);
  shm_free(saved->msg);
  saved->msg = NULL;
  saved->loc.src = NULL;
}

/* ---- printing -------------------------------------------------------------- */

/* Length of line [i] (1-based) of [s], without its newline. */
static int line_len(const Source *s, int i) {
  const char *p = s->lines[i - 1];
  const char *e = strchr(p, '\n');
  return e ? (int)(e - p) : (int)strlen(p);
}

void err_print_caret(FILE *out, Loc loc) {
  const Source *s = loc.src;
  if (!s || loc.line < 1 || loc.line > s->nlines) return;
  int len = line_len(s, loc.line);
  fprintf(out, "%5d | %.*s\n", loc.line, len, s->lines[loc.line - 1]);
  int col = loc.col < 1 ? 1 : loc.col;
  fprintf(out, "      | %*s^\n", col - 1, "");
}

void err_print(FILE *out) {
  if (cur_kind == ERR_QUIT) return;
  if (cur_loc.src)
    fprintf(out, "%s:%d:%d: error: %s\n", cur_loc.src->name, cur_loc.line,
            cur_loc.col, cur_msg);
  else
    fprintf(out, "shmap: error: %s\n", cur_msg);
  err_print_caret(out, cur_loc);
}
