/*
 * lexer.h - turns source text into tokens, Python's way: INDENT/DEDENT from
 * leading white space, NEWLINE at the end of each logical line, no
 * NEWLINE/INDENT inside (), [] or {} (implicit line joining), `\` at line
 * end joins lines, `#` comments.
 *
 * Errors (ERR_SYNTAX with the location of the offending character):
 *   "unterminated string", "inconsistent dedent", "unexpected character '$'",
 *   "tabs and spaces mixed in indentation", "unmatched ')'".
 */
#ifndef SHMAP_LEXER_H
#define SHMAP_LEXER_H

#include <stdbool.h>
#include <stdint.h>

#include "error.h"

typedef enum {
  T_EOF, T_NEWLINE, T_INDENT, T_DEDENT,
  T_NAME, T_INT, T_FLOAT, T_STRING,
  T_OP,        /* operators and punctuation; text in tok.text */
  T_KEYWORD,   /* def lambda return if elif else for in while break continue
                  pass and or not is None True False assert import from as
                  global nonlocal mesh shard_map jit on devices */
} TokKind;

typedef struct Token {
  TokKind kind;
  const char *start;  /* into the source text (not NUL-terminated) */
  int len;
  int line, col;      /* 1-based */
  char *str;          /* T_STRING: the decoded value, owned by the lexer */
  size_t strlen;
  int64_t ival;       /* T_INT */
  double fval;        /* T_FLOAT */
} Token;

typedef struct Lexer Lexer;

/* Lexes the whole of [src] (borrowed; must outlive the lexer).  Returns
 * NULL with the error set on the first lexical error. */
Lexer *lex_source(Source *src);
void lex_free(Lexer *lx);

/* The [i]th token (0-based); past the end, the T_EOF token. */
const Token *lex_token(const Lexer *lx, int i);
int lex_count(const Lexer *lx);

/* True if the token is the operator/keyword [s]. */
bool tok_is(const Token *t, TokKind k, const char *s);

/* For the REPL: true when [text] ends inside an open bracket or string or
 * after a line ending in ':' — i.e. more lines are needed. */
bool lex_needs_more(const char *text);

#endif
