/*
 * lexer.h - turns source text into tokens, Python's way: INDENT/DEDENT from
 * leading white space, NEWLINE at the end of each logical line, no
 * NEWLINE/INDENT inside (), [] or {} (implicit line joining), `\` at line
 * end joins lines, `#` comments.
 *
 * Errors (ERR_SYNTAX with the location of the offending character):
 *   "unterminated string literal" (and "unterminated triple-quoted string
 *   literal", both at the opening quote), "unindent does not match any
 *   outer indentation level", "unexpected character '$'", "inconsistent
 *   use of tabs and spaces in indentation", "unmatched ')'", "too many
 *   levels of indentation" (more than 100), "too deeply nested" (more than
 *   200 open brackets).  A closing bracket of the wrong kind is not a
 *   lexical error: the parser reports "expected ')' to close '(' at line N".
 *
 * Columns are 1-based byte offsets within the line.  Source text ends at
 * its first NUL byte.
 */
#ifndef SHMAP_LEXER_H
#define SHMAP_LEXER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/error.h"

typedef enum {
  T_EOF, T_NEWLINE, T_INDENT, T_DEDENT,
  T_NAME, T_INT, T_FLOAT, T_STRING,
  T_FSTRING,     /* an f-string: str = its str.format text, ival = its fields;
                    each field's tokens follow, then T_FSTRING_SEP; the last
                    is followed by T_FSTRING_END */
  T_FSTRING_SEP, T_FSTRING_END,
  T_OP,        /* operators and punctuation; text in tok.text */
  T_KEYWORD,   /* def lambda return if elif else for in while break continue
                  pass and or not is None True False assert import from as
                  global nonlocal.  The language's own words mesh,
                  shard_map, jit, on, devices are T_NAME: they are keywords
                  only where the parser sees a statement of theirs, so
                  jit(f) and a variable named devices still work. */
} TokKind;

typedef struct Token {
  const char *start;  /* into the source text (not NUL-terminated) */
  char *str;          /* T_STRING, T_FSTRING: the decoded value, owned by the lexer */
  union {
    int64_t ival;     /* T_INT (INT64_MAX when overflow is set); T_FSTRING: its fields */
    double fval;      /* T_FLOAT */
  };
  int len;
  int line, col;      /* 1-based */
  uint32_t strlen;    /* of str: a source text is under 4 GiB */
  uint8_t kind;       /* TokKind */
  bool overflow;      /* T_INT: the literal does not fit in int64 */
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

/* For the REPL: true when more lines are needed.  [text] is the lines
 * entered so far, each ending with "\n".  True when it ends inside an
 * open bracket or a triple-quoted string, or its last non-blank line ends
 * with a backslash continuation (blank lines after any of these do not
 * finish the entry); also when the last line is non-blank and ends with
 * ':', starts a decorator ('@'), or is indented (a block going on, which
 * a blank line closes).  Never sets an error. */
bool lex_needs_more(const char *text);

#endif
