/*
 * suggest.h - "Did you mean" for misspelt names, as Python 3.12 words it:
 * the candidate nearest to the unknown name by edit distance, when it is
 * near enough to be the likely intent.
 *
 * A Suggest collects candidates one at a time (names of a scope, keys of a
 * module, parameters of a built-in) and keeps the best; its text is then
 * appended to the error.  Semantics: CPython's suggestions
 * (Python/suggestions.c): an edit costs 2, a change of case alone 1, and
 * a candidate is kept when its cost is at most (len(name) + len(cand) + 3)
 * / 3 (in CPython's units), and below the best so far.
 */
#ifndef SHMAP_SUGGEST_H
#define SHMAP_SUGGEST_H

#include <stdbool.h>

typedef struct Suggest {
  const char *name;   /* the unknown name (borrowed) */
  char best[64];      /* the best candidate so far, "" when none */
  int cost;
} Suggest;

/* Starts collecting candidates for [name] (borrowed, must outlive [s]). */
void suggest_init(Suggest *s, const char *name);

/* Offers [cand]; kept (copied) when nearer than the best so far. */
void suggest_offer(Suggest *s, const char *cand);

/* The best candidate, or NULL when none is near enough. */
const char *suggest_best(const Suggest *s);

#endif
