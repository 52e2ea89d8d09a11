/*
 * suggest.c - the nearest candidate to a misspelt name (suggest.h).
 */
#include "base/suggest.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#define SUGGEST_MAX_LEN 40   /* longer names are not compared (cost grows as n*m) */

/* The cost of turning [a] into [b]: 2 per insertion, deletion or
 * substitution, 1 for a substitution that only changes case. */
static int edit_cost(const char *a, const char *b) {
  int n = (int)strlen(a), m = (int)strlen(b);
  int row[SUGGEST_MAX_LEN + 1];
  for (int j = 0; j <= m; j++) row[j] = 2 * j;
  for (int i = 1; i <= n; i++) {
    int diag = row[0];
    row[0] = 2 * i;
    for (int j = 1; j <= m; j++) {
      int sub = a[i - 1] == b[j - 1] ? 0 : tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 1]) ? 1 : 2;
      int best = diag + sub;
      if (row[j] + 2 < best) best = row[j] + 2;
      if (row[j - 1] + 2 < best) best = row[j - 1] + 2;
      diag = row[j];
      row[j] = best;
    }
  }
  return row[m];
}

void suggest_init(Suggest *s, const char *name) {
  s->name = name;
  s->best[0] = '\0';
  s->cost = -1;
}

void suggest_offer(Suggest *s, const char *cand) {
  size_t n = strlen(s->name), m = strlen(cand);
  if (n > SUGGEST_MAX_LEN || m > SUGGEST_MAX_LEN || m >= sizeof s->best || !strcmp(cand, s->name))
    return;
  int cost = edit_cost(s->name, cand);
  int limit = (int)(n + m + 3) * 2 / 6;
  if (cost > limit || (s->cost >= 0 && cost >= s->cost)) return;
  s->cost = cost;
  snprintf(s->best, sizeof s->best, "%s", cand);
}

const char *suggest_best(const Suggest *s) { return s->best[0] ? s->best : NULL; }
