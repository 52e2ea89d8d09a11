/*
 * debug_alias.c - pdb's alias and unalias: names for command lines, with
 * %1..%9 and %* standing for the arguments (semantics: pdb's do_alias,
 * do_unalias and the expansion in Pdb.precmd).  Main thread only: aliases
 * are made and expanded at the prompt.  They are kept by `restart`, as
 * pdb keeps them.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "base/mem.h"
#include "cli/debug_impl.h"

#define ALIAS_DEPTH 10   /* expansions of one line, so an alias of itself ends */

typedef struct Alias {
  char *name, *text;   /* owned */
} Alias;

static Alias *aliases;   /* sorted by name, as pdb lists them */
static int naliases;

static int alias_find(const char *name, size_t len) {
  for (int i = 0; i < naliases; i++)
    if (strlen(aliases[i].name) == len && !strncmp(aliases[i].name, name, len)) return i;
  return -1;
}

static void alias_print(int i) { printf("%s = %s\n", aliases[i].name, aliases[i].text); }

/* Sets alias [name] (of [len] bytes) to [text], in name order. */
static void alias_set(const char *name, size_t len, const char *text) {
  int i = alias_find(name, len);
  char *t = shm_strdup(text);
  if (!t) return;
  if (i >= 0) {
    shm_free(aliases[i].text);
    aliases[i].text = t;
    return;
  }
  Alias *a = shm_realloc(aliases, sizeof(Alias) * (size_t)(naliases + 1));
  char *n = a ? shm_malloc(len + 1) : NULL;
  if (!n) {
    if (a) aliases = a;
    shm_free(t);
    return;
  }
  snprintf(n, len + 1, "%.*s", (int)len, name);
  aliases = a;
  int at = 0;
  while (at < naliases && strcmp(aliases[at].name, n) < 0) at++;
  memmove(&aliases[at + 1], &aliases[at], sizeof(Alias) * (size_t)(naliases - at));
  aliases[at] = (Alias){n, t};
  naliases++;
}

int dbg_cmd_alias(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)r;
  size_t len = strcspn(arg, " \t");
  if (!len) {
    for (int i = 0; i < naliases; i++) alias_print(i);
    return 0;
  }
  const char *text = arg + len + strspn(arg + len, " \t");
  int i = alias_find(arg, len);
  if (*text) alias_set(arg, len, text);
  else if (i >= 0) alias_print(i);
  else printf("*** Unknown alias '%.*s'\n", (int)len, arg);
  return 0;
}

int dbg_cmd_unalias(Stop *st, const char *arg, Resume *r) {
  (void)st, (void)r;
  size_t len = strcspn(arg, " \t");
  if (!len) return printf("*** usage: unalias name\n"), 0;
  int i = alias_find(arg, len);
  if (i < 0) return 0;   /* pdb says nothing */
  shm_free(aliases[i].name);
  shm_free(aliases[i].text);
  memmove(&aliases[i], &aliases[i + 1], sizeof(Alias) * (size_t)(naliases - i - 1));
  naliases--;
  return 0;
}

/* Argument [k] (1-based) of the blank-separated [args], or NULL. */
static const char *nth_arg(const char *args, int k, size_t *len) {
  const char *p = args;
  for (int i = 1;; i++) {
    p += strspn(p, " \t");
    if (!*p) return NULL;
    *len = strcspn(p, " \t");
    if (i == k) return p;
    p += *len;
  }
}

/* [text] with %1..%9 replaced by the arguments [args] and %* by them all
 * (owned), as pdb's precmd does; arguments left over are appended when
 * no %-parameter took any. */
static char *substitute(const char *text, const char *args) {
  size_t cap = strlen(text) + 10 * strlen(args) + 2, n = 0;
  char *out = shm_malloc(cap);
  bool took = false;
  if (!out) return NULL;
  for (const char *p = text; *p; p++) {
    const char *a = NULL;
    size_t len = 0;
    if (p[0] == '%' && p[1] == '*') a = args, len = strlen(args);
    else if (p[0] == '%' && p[1] >= '1' && p[1] <= '9') a = nth_arg(args, p[1] - '0', &len);
    if (p[0] == '%' && (p[1] == '*' || (p[1] >= '1' && p[1] <= '9'))) {
      took = true;
      if (a) memcpy(out + n, a, len), n += len;
      p++;
      continue;
    }
    out[n++] = *p;
  }
  out[n] = '\0';
  if (!took && *args) snprintf(out + n, cap - n, " %s", args);
  return out;
}

char *dbg_alias_expand(const char *line) {
  char *cur = shm_strdup(line);
  for (int depth = 0; cur && depth < ALIAS_DEPTH; depth++) {
    const char *p = cur + strspn(cur, " \t");
    size_t len = 0;
    while (isalnum((unsigned char)p[len]) || p[len] == '_') len++;
    int i = len ? alias_find(p, len) : -1;
    if (i < 0) break;
    const char *args = p + len + strspn(p + len, " \t");
    char *next = substitute(aliases[i].text, args);
    shm_free(cur);
    cur = next;
  }
  return cur;
}

void dbg_aliases_free(void) {
  for (int i = 0; i < naliases; i++) {
    shm_free(aliases[i].name);
    shm_free(aliases[i].text);
  }
  shm_free(aliases);
  aliases = NULL;
  naliases = 0;
}
