/*
 * lexer.c - source text to tokens (lexer.h), following Python's lexical
 * rules (The Python Language Reference, chapter 2 "Lexical analysis").
 *
 * The whole source is lexed up front into an array, so the parser may look
 * ahead freely (it needs two or three tokens to tell `mesh m(...)` from a
 * call).  Indentation is measured twice, with tabs to the next multiple of
 * 8 and with tabs as 1, as CPython does: when the two measures disagree on
 * the order of two lines the indentation is ambiguous and rejected.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lang/lexer.h"
#include "base/mem.h"
#include "base/utf8.h"

#define MAX_INDENT 100  /* CPython's limit on indentation levels */
#define MAX_NEST 200    /* CPython's limit on nested open brackets */

struct Lexer {
  Source *src;
  const char *p;          /* cursor */
  const char *line_start; /* start of the current physical line */
  int line;               /* 1-based number of the current physical line */
  Token *toks;
  int ntoks, cap;
  bool line_has_tokens;   /* the logical line so far has a token */
  int nindent;            /* levels above column 0 */
  int indent8[MAX_INDENT + 1], indent1[MAX_INDENT + 1];
  int nbr;                /* open brackets */
  char brackets[MAX_NEST];
  int br_line[MAX_NEST], br_col[MAX_NEST];  /* where each was opened */
  const char *col_at;     /* col_of's last place, at column col_n */
  int col_n;
};

static const char *const keywords[] = {
    "def",   "lambda", "return",   "if",     "elif",   "else",  "for",
    "in",    "while",  "break",    "continue", "pass", "and",   "or",
    "not",   "is",     "None",     "True",   "False",  "assert", "import",
    "from",  "as",     "global",   "nonlocal", NULL};

/* Longest first, so the first match is the longest. */
static const char *const operators[] = {
    "**=", "//=", ">>=", "<<=", "...", "->", "**", "//", "<<", ">>", "<=",
    ">=",  "==",  "!=",  "+=",  "-=",  "*=", "/=", "%=", "@=", "&=", "|=",
    "^=",  "+",   "-",   "*",   "/",   "%",  "@",  "&",  "|",  "^",  "~",
    "<",   ">",   "(",   ")",   "[",   "]",  "{",  "}",  ",",  ":",  ".",
    ";",   "=",   NULL};

/* ---- token array ---------------------------------------------------------- */

/* The 1-based column of [at] in code points, as Python counts them, so a
 * caret under the source line stands under its character.  Counted on
 * from the last answer when [at] is past it on the same line: tokens come
 * in order, and a long line is not counted again for each. */
static int col_of(Lexer *lx, const char *at) {
  if (lx->col_at < lx->line_start || lx->col_at > at) {
    lx->col_at = lx->line_start;
    lx->col_n = 1;
  }
  lx->col_n += (int)utf8_count(lx->col_at, (size_t)(at - lx->col_at));
  lx->col_at = at;
  return lx->col_n;
}

/* Sets the syntax error at [line]:[col]; returns NULL. */
static void *lex_error(Lexer *lx, int line, int col, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void *lex_error(Lexer *lx, int line, int col, const char *fmt, ...) {
  char msg[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  Loc loc = {lx->src, line, col};
  return err_set_at(loc, ERR_SYNTAX, "%s", msg);
}

/* Appends a token of [kind] spanning [start, start+len) on the current line;
 * NULL on out of memory. */
static Token *push_token(Lexer *lx, TokKind kind, const char *start, int len) {
  if (lx->ntoks == lx->cap) {
    int ncap = lx->cap ? lx->cap * 2 : 256;
    Token *nt = shm_realloc(lx->toks, sizeof(Token) * (size_t)ncap);
    if (!nt) return err_nomem();
    lx->toks = nt;
    lx->cap = ncap;
  }
  Token *t = &lx->toks[lx->ntoks++];
  memset(t, 0, sizeof *t);
  t->kind = kind;
  t->start = start;
  t->len = len;
  t->line = lx->line;
  t->col = col_of(lx, start);
  if (kind != T_NEWLINE && kind != T_INDENT && kind != T_DEDENT)
    lx->line_has_tokens = true;
  return t;
}

/* ---- indentation -------------------------------------------------------------- */

static bool at_line_end(const char *p) {
  return *p == '\n' || *p == '\r' || *p == '\0' || *p == '#';
}

/* Emits the INDENT or DEDENT tokens for a line indented by ([c8], [c1]). */
static int emit_indent(Lexer *lx, int c8, int c1) {
  int top8 = lx->indent8[lx->nindent], top1 = lx->indent1[lx->nindent];
  if ((c8 > top8) != (c1 > top1) || (c8 == top8) != (c1 == top1))
    goto mixed;
  if (c8 > top8) {
    if (lx->nindent == MAX_INDENT)
      return lex_error(lx, lx->line, col_of(lx, lx->p),
                       "too many levels of indentation"), -1;
    lx->nindent++;
    lx->indent8[lx->nindent] = c8;
    lx->indent1[lx->nindent] = c1;
    return push_token(lx, T_INDENT, lx->p, 0) ? 0 : -1;
  }
  while (c8 < lx->indent8[lx->nindent]) {
    lx->nindent--;
    if (!push_token(lx, T_DEDENT, lx->p, 0)) return -1;
  }
  if (c8 != lx->indent8[lx->nindent])
    return lex_error(lx, lx->line, col_of(lx, lx->p),
                     "unindent does not match any outer indentation level"),
           -1;
  if (c1 != lx->indent1[lx->nindent]) goto mixed;
  return 0;
mixed:
  lex_error(lx, lx->line, col_of(lx, lx->p),
            "inconsistent use of tabs and spaces in indentation");
  return -1;
}

/* At the start of a physical line outside brackets: measures the
 * indentation and, unless the line is blank or a comment, emits INDENT or
 * DEDENT tokens. */
static int lex_indentation(Lexer *lx) {
  int c8 = 0, c1 = 0;
  for (;; lx->p++) {
    if (*lx->p == ' ') {
      c8++;
      c1++;
    } else if (*lx->p == '\t') {
      c8 = (c8 / 8 + 1) * 8;
      c1++;
    } else if (*lx->p == '\f') {
      c8 = c1 = 0;
    } else {
      break;
    }
  }
  if (at_line_end(lx->p)) return 0;
  return emit_indent(lx, c8, c1);
}

/* ---- numbers ------------------------------------------------------------------ */

static bool is_digit_in(int c, int base) {
  if (base == 16) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') ||
                         (c >= 'A' && c <= 'F');
  return c >= '0' && c < '0' + base;
}

static int digit_value(int c) {
  if (c <= '9') return c - '0';
  return (c | 0x20) - 'a' + 10;
}

static bool is_name_char(int c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
         (c >= '0' && c <= '9') || (unsigned char)c >= 0x80;
}

/* The byte length of the name character at [p], 0 if none: ASCII letters,
 * digits and '_', and non-ASCII letters and digits (Python's identifiers
 * are Unicode's; a stray '´', '€' or no-break space is an error, not part
 * of a name). */
static size_t name_char_at(const char *p) {
  unsigned char c = (unsigned char)*p;
  if (c < 0x80) return is_name_char(c);
  size_t i = 0;   /* the source is valid UTF-8: the sequence is whole */
  uint32_t cp = utf8_decode(p, strnlen(p, 4), &i);
  return utf8_isalpha(cp) || utf8_isdigit(cp) ? i : 0;
}

/* Scans digits of [base] with single underscores between them from [*pp];
 * appends them to [buf] (if not NULL, [*n] bytes used, room for all).
 * Returns the number of digits, or -1 when an underscore is misplaced. */
static int scan_digits(const char **pp, int base, char *buf, size_t *n) {
  const char *p = *pp;
  int count = 0;
  while (is_digit_in(*p, base) || (*p == '_' && count > 0)) {
    if (*p == '_') {
      if (!is_digit_in(p[1], base)) return -1;
      p++;
      continue;
    }
    if (buf) buf[(*n)++] = *p;
    p++;
    count++;
  }
  *pp = p;
  return count;
}

/* Accumulates the digits in [d, d+n) of [base] into t->ival, saturating
 * and setting t->overflow when the value exceeds INT64_MAX. */
static void set_int_value(Token *t, const char *d, size_t n, int base) {
  uint64_t v = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t dv = (uint64_t)digit_value(d[i]);
    if (v > (UINT64_MAX - dv) / (uint64_t)base) {
      t->overflow = true;
      break;
    }
    v = v * (uint64_t)base + dv;
  }
  if (v > (uint64_t)INT64_MAX) t->overflow = true;
  t->ival = t->overflow ? INT64_MAX : (int64_t)v;
}

/* 0x.., 0o.., 0b.. integers. */
static int lex_prefixed_int(Lexer *lx, const char *start, char *buf) {
  static const char *const names[] = {"hexadecimal", "octal", "binary"};
  int c = lx->p[1] | 0x20;
  int base = c == 'x' ? 16 : c == 'o' ? 8 : 2;
  const char *name = names[base == 16 ? 0 : base == 8 ? 1 : 2];
  const char *p = lx->p + 2;
  size_t n = 0;
  if (*p == '_') p++;
  int nd = scan_digits(&p, base, buf, &n);
  if (nd <= 0 || name_char_at(p)) {
    lex_error(lx, lx->line, col_of(lx, start), "invalid %s literal", name);
    return -1;
  }
  lx->p = p;
  Token *t = push_token(lx, T_INT, start, (int)(p - start));
  if (!t) return -1;
  set_int_value(t, buf, n, base);
  return 0;
}

/* The exponent part e[+-]digits, if present; -1 if malformed. */
static int scan_exponent(const char **pp, char *buf, size_t *n) {
  const char *p = *pp;
  if ((*p | 0x20) != 'e') return 0;
  buf[(*n)++] = *p++;
  if (*p == '+' || *p == '-') buf[(*n)++] = *p++;
  if (scan_digits(&p, 10, buf, n) <= 0) return -1;
  *pp = p;
  return 1;
}

/* Decimal integers and floats: 12, 1_000, 1., .5, 1e-3, 2.5E+4. */
static int lex_decimal(Lexer *lx, const char *start, char *buf) {
  const char *p = lx->p;
  size_t n = 0;
  bool is_float = false;
  int nint = scan_digits(&p, 10, buf, &n);
  if (nint >= 0 && *p == '.') {
    is_float = true;
    buf[n++] = *p++;
    if (scan_digits(&p, 10, buf, &n) < 0) nint = -1;
  }
  int e = nint < 0 ? -1 : scan_exponent(&p, buf, &n);
  if (e > 0) is_float = true;
  if (nint < 0 || e < 0 || name_char_at(p)) {
    const char *msg = (*p | 0x20) == 'j' ? "complex literals are not supported"
                                         : "invalid decimal literal";
    return lex_error(lx, lx->line, col_of(lx, start), "%s", msg), -1;
  }
  buf[n] = '\0';
  if (!is_float && n > 1 && buf[0] == '0' && strspn(buf, "0") != n)
    return lex_error(lx, lx->line, col_of(lx, start), "%s",
                     "leading zeros in decimal integer literals are not "
                     "permitted; use an 0o prefix for octal integers"), -1;
  lx->p = p;
  Token *t = push_token(lx, is_float ? T_FLOAT : T_INT, start,
                        (int)(p - start));
  if (!t) return -1;
  if (is_float)
    t->fval = strtod(buf, NULL);
  else
    set_int_value(t, buf, n, 10);
  return 0;
}

/* A number literal starting at the cursor. */
static int lex_number(Lexer *lx) {
  const char *start = lx->p;
  /* The buffer holds at most the literal's own characters: measure their
   * run (name characters, dots, an exponent's sign) rather than the rest
   * of the file, so lexing stays linear in the source's size. */
  size_t maxlen = 0;
  for (const char *q = start;; q++, maxlen++) {
    bool sign = (*q == '+' || *q == '-') && q > start && (q[-1] | 0x20) == 'e';
    if (!is_name_char(*q) && *q != '.' && !sign) break;
  }
  char *buf = shm_malloc(maxlen + 2);
  if (!buf) return err_nomem(), -1;
  int c = lx->p[1] | 0x20;
  int rc = (lx->p[0] == '0' && (c == 'x' || c == 'o' || c == 'b'))
               ? lex_prefixed_int(lx, start, buf)
               : lex_decimal(lx, start, buf);
  shm_free(buf);
  return rc;
}

/* ---- strings --------------------------------------------------------------- */

/* A growable byte buffer for decoded string contents. */
typedef struct StrBuf {
  char *data;
  size_t len, cap;
} StrBuf;

static int sb_put(StrBuf *b, char c) {
  if (b->len + 1 >= b->cap) {
    size_t ncap = b->cap ? b->cap * 2 : 64;
    char *nd = shm_realloc(b->data, ncap);
    if (!nd) return err_nomem(), -1;
    b->data = nd;
    b->cap = ncap;
  }
  b->data[b->len++] = c;
  b->data[b->len] = '\0';
  return 0;
}

/* Appends code point [cp] as UTF-8, as Python encodes str to bytes. */
static int sb_put_utf8(StrBuf *b, uint32_t cp) {
  char u[4];
  int n = utf8_encode(cp, u);
  for (int i = 0; i < n; i++)
    if (sb_put(b, u[i]) < 0) return -1;
  return 0;
}

/* Moves past a newline at [p] ("\n", "\r\n" or "\r") and starts a new
 * physical line; returns the character after it. */
static const char *next_line(Lexer *lx, const char *p) {
  if (p[0] == '\r' && p[1] == '\n') p++;
  p++;
  lx->line++;
  lx->line_start = p;
  return p;
}

/* \xhh, \uhhhh, \Uhhhhhhhh: reads [ndig] hex digits after the letter. */
static int decode_hex_escape(Lexer *lx, const char **pp, int ndig,
                             StrBuf *b) {
  const char *p = *pp + 1;
  uint32_t cp = 0;
  for (int i = 0; i < ndig; i++, p++) {
    if (!is_digit_in(*p, 16))
      return lex_error(lx, lx->line, col_of(lx, *pp - 1),
                       "truncated \\%cXX escape in string literal", **pp),
             -1;
    cp = cp * 16 + (uint32_t)digit_value(*p);
  }
  if (cp > 0x10FFFF)
    return lex_error(lx, lx->line, col_of(lx, *pp - 1), "%s",
                     "illegal Unicode character in string literal"), -1;
  *pp = p;
  return sb_put_utf8(b, cp);
}

/* Decodes the escape after a backslash at [*pp - 1]; advances [*pp]. */
static int decode_escape(Lexer *lx, const char **pp, StrBuf *b) {
  static const char from[] = "\\'\"abfnrtv", to[] = "\\'\"\a\b\f\n\r\t\v";
  const char *p = *pp;
  const char *hit = *p ? strchr(from, *p) : NULL;
  if (hit) {
    *pp = p + 1;
    return sb_put(b, to[hit - from]);
  }
  if (*p == 'x') return decode_hex_escape(lx, pp, 2, b);
  if (*p == 'u') return decode_hex_escape(lx, pp, 4, b);
  if (*p == 'U') return decode_hex_escape(lx, pp, 8, b);
  if (*p == 'N')   /* names need the Unicode database, which shmap lacks */
    return lex_error(lx, lx->line, col_of(lx, p - 1), "%s", "\\N{...} escapes are not "
                     "supported: write the character or its \\u/\\U code"), -1;
  if (*p >= '0' && *p <= '7') {
    uint32_t cp = 0;
    for (int i = 0; i < 3 && *p >= '0' && *p <= '7'; i++, p++)
      cp = cp * 8 + (uint32_t)(*p - '0');
    *pp = p;
    return sb_put_utf8(b, cp);
  }
  /* An unknown escape stays as written, as in Python. */
  return sb_put(b, '\\');
}

/* Reads the body of a string whose opening quote (tripled if [triple]) ends
 * just before the cursor; the string starts at [qline]:[qcol], for errors. */
static int scan_string_body(Lexer *lx, char q, bool triple, bool raw,
                            int qline, int qcol, StrBuf *b) {
  const char *p = lx->p;
  for (;;) {
    if (*p == '\0' || (!triple && (*p == '\n' || *p == '\r'))) {
      const char *m = triple ? "unterminated triple-quoted string literal"
                             : "unterminated string literal";
      lex_error(lx, qline, qcol, "%s", m);
      return -1;
    }
    if (*p == q && (!triple || (p[1] == q && p[2] == q))) {
      lx->p = p + (triple ? 3 : 1);
      return 0;
    }
    if (*p == '\n' || *p == '\r') {
      if (sb_put(b, '\n') < 0) return -1;
      p = next_line(lx, p);
      continue;
    }
    if (*p == '\\' && (p[1] == '\n' || p[1] == '\r')) {
      if (raw && (sb_put(b, '\\') < 0 || sb_put(b, '\n') < 0)) return -1;
      p = next_line(lx, p + 1);
      continue;
    }
    if (*p == '\\' && !raw) {
      p++;
      if (decode_escape(lx, &p, b) < 0) return -1;
      continue;
    }
    if (*p == '\\' && p[1] != '\0') {  /* raw: the quote does not close */
      if (sb_put(b, *p++) < 0) return -1;
    }
    if (sb_put(b, *p++) < 0) return -1;
  }
}

static bool starts_string(const char *p);

/* ---- f-strings ------------------------------------------------------------ */

/*
 * An f-string becomes T_FSTRING (its text as a str.format string: literal
 * braces doubled, each field "{!conv:spec}"), then each field's expression
 * as ordinary tokens at their own columns, each followed by T_FSTRING_SEP,
 * then T_FSTRING_END; the parser turns that into fmt.format(e1, e2, ...).
 * Fields: {expr}, {expr!r}, {expr:spec}, and {expr=} (the expression's
 * text, then its repr), as Python's.  Expressions may not hold a
 * backslash, a comment, or the f-string's own quote (Python before 3.12).
 */

static int sb_puts(StrBuf *b, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (sb_put(b, s[i]) < 0) return -1;
  return 0;
}

/* Appends [n] bytes of literal text to a format string, braces doubled. */
static int sb_put_literal(StrBuf *b, const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (sb_put(b, s[i]) < 0 || ((s[i] == '{' || s[i] == '}') && sb_put(b, s[i]) < 0)) return -1;
  return 0;
}

static Token *push_marker(Lexer *lx, TokKind kind, const char *at) {
  return push_token(lx, kind, at, 0);
}

static int lex_string(Lexer *lx);
static int lex_number(Lexer *lx);
static int lex_name(Lexer *lx);
static int lex_operator(Lexer *lx);

/* True at a bare '=' ending an expression: "{x=}", "{x = :>8}". */
static bool at_debug_equals(const char *p) {
  if (*p != '=' || p[1] == '=') return false;
  p++;
  while (*p == ' ' || *p == '\t') p++;
  return *p == '}' || *p == ':' || (*p == '!' && p[1] != '=');
}

/* Lexes one field's expression, from just after its '{' to its end at
 * depth 0 ('}', ':', '!' or a debugging '='). */
static int lex_field_expr(Lexer *lx, char q, bool triple, int qline, int qcol) {
  int nbr0 = lx->nbr, ntok0 = lx->ntoks;
  for (;;) {
    while (*lx->p == ' ' || *lx->p == '\t') lx->p++;
    char c = *lx->p;
    if (c == '\0' || c == q || ((c == '\n' || c == '\r') && !triple))
      return lex_error(lx, qline, qcol, "f-string: expecting '}'"), -1;
    if (c == '\n' || c == '\r') {
      lx->p = next_line(lx, lx->p);
      continue;
    }
    if (lx->nbr == nbr0 && (c == '}' || c == ':' || (c == '!' && lx->p[1] != '=') ||
                            at_debug_equals(lx->p)))
      break;
    if (c == '\\' || c == '#')
      return lex_error(lx, lx->line, col_of(lx, lx->p), "f-string expression part cannot "
                       "include %s", c == '#' ? "'#'" : "a backslash"), -1;
    int rc = starts_string(lx->p) ? lex_string(lx)
             : (c >= '0' && c <= '9') || (c == '.' && lx->p[1] >= '0' && lx->p[1] <= '9')
                 ? lex_number(lx)
             : name_char_at(lx->p) ? lex_name(lx)
                               : lex_operator(lx);
    if (rc < 0) return -1;
  }
  if (lx->ntoks == ntok0)
    return lex_error(lx, lx->line, col_of(lx, lx->p),
                     "f-string: valid expression required before '%c'", *lx->p), -1;
  return 0;
}

/* One replacement field, the cursor just after its '{': the expression's
 * tokens, T_FSTRING_SEP, and "{!conv:spec}" appended to [fmt]. */
static int lex_field(Lexer *lx, char q, bool triple, int qline, int qcol, StrBuf *fmt) {
  const char *expr = lx->p;
  if (lex_field_expr(lx, q, triple, qline, qcol) < 0) return -1;
  char conv = 0;
  if (*lx->p == '=') {   /* {x=}: the text "x=" (with its spaces), then repr */
    lx->p++;
    while (*lx->p == ' ' || *lx->p == '\t') lx->p++;
    if (sb_put_literal(fmt, expr, (size_t)(lx->p - expr)) < 0) return -1;
    conv = *lx->p == ':' ? 0 : 'r';
  }
  if (*lx->p == '!') {
    conv = lx->p[1];
    if (conv != 'r' && conv != 's' && conv != 'a')
      return lex_error(lx, lx->line, col_of(lx, lx->p + 1),
                       "f-string: invalid conversion character: expected 's', 'r', or 'a'"), -1;
    lx->p += 2;
  }
  if (sb_put(fmt, '{') < 0 || (conv && (sb_put(fmt, '!') < 0 || sb_put(fmt, conv) < 0)))
    return -1;
  if (*lx->p == ':') {
    const char *spec = lx->p;
    while (*lx->p && *lx->p != '}' && *lx->p != q && *lx->p != '\n') {
      if (*lx->p == '{')
        return lex_error(lx, lx->line, col_of(lx, lx->p),
                         "f-string: nested replacement fields in a format spec are not "
                         "supported"), -1;
      lx->p++;
    }
    if (sb_puts(fmt, spec, (size_t)(lx->p - spec)) < 0) return -1;
  }
  if (*lx->p != '}') return lex_error(lx, qline, qcol, "f-string: expecting '}'"), -1;
  lx->p++;
  return sb_put(fmt, '}') < 0 || !push_marker(lx, T_FSTRING_SEP, lx->p - 1) ? -1 : 0;
}

/* An f-string whose prefix ([raw] or not) ends at the cursor. */
static int lex_fstring(Lexer *lx, const char *start, bool raw) {
  int at = lx->ntoks;
  Token *t = push_token(lx, T_FSTRING, start, 0);
  if (!t) return -1;
  int qline = t->line, qcol = t->col, nfields = 0;
  char q = *lx->p;
  bool triple = lx->p[1] == q && lx->p[2] == q;
  lx->p += triple ? 3 : 1;
  StrBuf fmt = {0};
  int rc = 0;
  for (;;) {
    const char *p = lx->p;
    if (*p == '\0' || (!triple && (*p == '\n' || *p == '\r'))) {
      rc = -1;
      lex_error(lx, qline, qcol, "%s", triple ? "unterminated triple-quoted f-string literal"
                                              : "unterminated f-string literal");
      break;
    }
    if (*p == q && (!triple || (p[1] == q && p[2] == q))) {
      lx->p = p + (triple ? 3 : 1);
      break;
    }
    if ((*p == '{' && p[1] == '{') || (*p == '}' && p[1] == '}')) {
      rc = sb_puts(&fmt, p, 2);
      lx->p = p + 2;
    } else if (*p == '}') {
      rc = -1;
      lex_error(lx, lx->line, col_of(lx, p), "f-string: single '}' is not allowed");
    } else if (*p == '{') {
      lx->p = p + 1;
      rc = lex_field(lx, q, triple, qline, qcol, &fmt);
      nfields++;
    } else if (*p == '\n' || *p == '\r') {
      rc = sb_put(&fmt, '\n');
      lx->p = next_line(lx, p);
    } else if (*p == '\\' && !raw && p[1] != '\n') {
      StrBuf lit = {0};
      const char *e = p + 1;
      rc = decode_escape(lx, &e, &lit);
      if (rc == 0) rc = sb_put_literal(&fmt, lit.data ? lit.data : "", lit.len);
      shm_free(lit.data);
      lx->p = e;
    } else {
      rc = sb_put(&fmt, *p);
      lx->p = p + 1;
    }
    if (rc < 0) break;
  }
  t = &lx->toks[at];   /* the array may have moved */
  if (rc == 0 && !fmt.data) rc = sb_put(&fmt, '\0'), fmt.len = 0;
  t->str = fmt.data;   /* freed by lex_free, even after an error */
  t->strlen = fmt.len;
  t->ival = nfields;
  t->len = (int)(lx->p - start);
  if (rc < 0) return -1;
  return push_marker(lx, T_FSTRING_END, lx->p) ? 0 : -1;
}

/* A string literal, with an optional r/R/u/U/f/F prefix (or rf, fr), at
 * the cursor.  The token is pushed first, so it keeps the line and column
 * it starts at. */
static int lex_string(Lexer *lx) {
  const char *start = lx->p;
  bool raw = false, f = false;
  while (*lx->p != '\'' && *lx->p != '"') {
    raw |= (*lx->p | 0x20) == 'r';
    f |= (*lx->p | 0x20) == 'f';
    lx->p++;
  }
  if (f) return lex_fstring(lx, start, raw);
  lx->p = start;
  Token *t = push_token(lx, T_STRING, lx->p, 0);
  if (!t) return -1;
  while (*lx->p != '\'' && *lx->p != '"') lx->p++;
  char q = *lx->p;
  bool triple = lx->p[1] == q && lx->p[2] == q;
  lx->p += triple ? 3 : 1;
  StrBuf b = {0};
  int rc = scan_string_body(lx, q, triple, raw, t->line, t->col, &b);
  if (rc == 0 && !b.data) {  /* the empty string */
    rc = sb_put(&b, '\0');
    b.len = 0;
  }
  t->str = b.data;  /* freed by lex_free, even after an error */
  t->strlen = b.len;
  t->len = (int)(lx->p - t->start);
  return rc;
}

/* ---- names, operators ----------------------------------------------------------- */

/* A string prefix (r, u, f, or rf/fr in either case) and a quote. */
static bool starts_string(const char *p) {
  if (*p == '\'' || *p == '"') return true;
  int c = *p | 0x20, d = p[1] | 0x20;
  if ((c == 'r' || c == 'u' || c == 'f') && (p[1] == '\'' || p[1] == '"')) return true;
  return ((c == 'r' && d == 'f') || (c == 'f' && d == 'r')) && (p[2] == '\'' || p[2] == '"');
}

static int lex_name(Lexer *lx) {
  const char *start = lx->p;
  for (size_t k; (k = name_char_at(lx->p)) > 0;) lx->p += k;
  int len = (int)(lx->p - start);
  TokKind kind = T_NAME;
  for (int i = 0; keywords[i]; i++)
    if ((int)strlen(keywords[i]) == len && !memcmp(keywords[i], start, len))
      kind = T_KEYWORD;
  return push_token(lx, kind, start, len) ? 0 : -1;
}

/* " on line N" when [line] is not the current one, as Python words it. */
static const char *on_line(const Lexer *lx, int line) {
  static _Thread_local char buf[32];
  if (line == lx->line) return "";
  snprintf(buf, sizeof buf, " on line %d", line);
  return buf;
}

/* Tracks bracket nesting for implicit line joining. */
static int track_bracket(Lexer *lx, char c, int col) {
  if (c == '(' || c == '[' || c == '{') {
    if (lx->nbr == MAX_NEST)
      return lex_error(lx, lx->line, col, "too deeply nested"), -1;
    lx->br_line[lx->nbr] = lx->line;
    lx->br_col[lx->nbr] = col;
    lx->brackets[lx->nbr++] = c;
  } else if (c == ')' || c == ']' || c == '}') {
    if (lx->nbr == 0)
      return lex_error(lx, lx->line, col, "unmatched '%c'", c), -1;
    char open = lx->brackets[lx->nbr - 1];
    if ((open == '(') != (c == ')') || (open == '[') != (c == ']'))
      return lex_error(lx, lx->line, col, "closing parenthesis '%c' does not match opening "
                       "parenthesis '%c'%s", c, open, on_line(lx, lx->br_line[lx->nbr - 1])), -1;
    lx->nbr--;
  }
  return 0;
}

static int lex_operator(Lexer *lx) {
  for (int i = 0; operators[i]; i++) {
    size_t n = strlen(operators[i]);
    if (strncmp(lx->p, operators[i], n)) continue;
    int col = col_of(lx, lx->p);
    if (n == 1 && track_bracket(lx, *lx->p, col) < 0) return -1;
    if (!push_token(lx, T_OP, lx->p, (int)n)) return -1;
    lx->p += n;
    return 0;
  }
  unsigned char c = (unsigned char)*lx->p;
  char shown[8];
  snprintf(shown, sizeof shown, c >= 0x20 && c < 0x7F ? "%c" : "\\x%02x", c);
  if (c >= 0x80) {   /* Python's words for a character outside the grammar */
    size_t i = 0;
    uint32_t cp = utf8_decode(lx->p, strlen(lx->p), &i);
    if (!utf8_isprintable(cp))
      return lex_error(lx, lx->line, col_of(lx, lx->p), "invalid non-printable character U+%04X",
                       cp), -1;
    return lex_error(lx, lx->line, col_of(lx, lx->p), "invalid character '%.*s' (U+%04X)",
                     (int)i, lx->p, cp), -1;
  }
  return lex_error(lx, lx->line, col_of(lx, lx->p),
                   "unexpected character '%s'", shown), -1;
}

/* ---- the main loop ----------------------------------------------------------- */

/* Ends the logical line (if it has tokens) at a newline or end of text. */
static int end_logical_line(Lexer *lx) {
  if (!lx->line_has_tokens) return 0;
  lx->line_has_tokens = false;
  return push_token(lx, T_NEWLINE, lx->p, 0) ? 0 : -1;
}

/* `\` followed by a newline joins the next physical line to this one. */
static int lex_backslash(Lexer *lx) {
  const char *p = lx->p + 1;
  if (*p == '\n' || *p == '\r') {
    lx->p = next_line(lx, p);
    return 0;
  }
  const char *m = *p == '\0' ? "unexpected end of file after '\\'"
                             : "unexpected character after line "
                               "continuation character";
  return lex_error(lx, lx->line, col_of(lx, lx->p), "%s", m), -1;
}

/* Lexes one item at the cursor (after white space): a newline, a comment,
 * a continuation or a token.  Returns 1 at the end of the text. */
static int lex_step(Lexer *lx) {
  char c = *lx->p;
  if (c == '\0') return 1;
  if (c == '#') {
    while (*lx->p && *lx->p != '\n' && *lx->p != '\r') lx->p++;
    return 0;
  }
  if (c == '\n' || c == '\r') {
    if (lx->nbr == 0 && end_logical_line(lx) < 0) return -1;
    lx->p = next_line(lx, lx->p);
    return lx->nbr == 0 ? lex_indentation(lx) : 0;
  }
  if (c == '\\') return lex_backslash(lx);
  if (starts_string(lx->p)) return lex_string(lx);
  if ((c >= '0' && c <= '9') || (c == '.' && lx->p[1] >= '0' && lx->p[1] <= '9'))
    return lex_number(lx);
  if (name_char_at(lx->p)) return lex_name(lx);
  return lex_operator(lx);
}

/* NEWLINE, the DEDENTs back to column 0, and EOF. */
static int lex_finish(Lexer *lx) {
  if (lx->nbr > 0) {   /* reported at the bracket, as Python does, not past the end */
    int k = lx->nbr - 1;
    return lex_error(lx, lx->br_line[k], lx->br_col[k], "'%c' was never closed",
                     lx->brackets[k]), -1;
  }
  if (end_logical_line(lx) < 0) return -1;
  for (; lx->nindent > 0; lx->nindent--)
    if (!push_token(lx, T_DEDENT, lx->p, 0)) return -1;
  return push_token(lx, T_EOF, lx->p, 0) ? 0 : -1;
}

/* Source is UTF-8: the first byte that does not decode is a syntax error
 * at its place, in the words of Python's codec. */
static int check_utf8(Lexer *lx) {
  const char *t = lx->src->text, *why = NULL;
  size_t n = strlen(t), bad = utf8_check(t, n, &why);
  if (bad == n) return 0;
  int line = 1;
  for (size_t i = 0; i < bad; i++)
    if (t[i] == '\n') {
      line++;
      lx->line_start = t + i + 1;
    }
  lex_error(lx, line, col_of(lx, t + bad), "(unicode error) 'utf-8' codec can't decode "
            "byte 0x%02x in position %zu: %s", (unsigned char)t[bad], bad, why);
  return -1;
}

Lexer *lex_source(Source *src) {
  Lexer *lx = shm_calloc(1, sizeof *lx);
  if (!lx) return err_nomem();
  lx->src = src;
  lx->p = lx->line_start = lx->col_at = src->text;
  lx->line = 1;
  lx->col_n = 1;
  if (check_utf8(lx) < 0) {
    lex_free(lx);
    return NULL;
  }
  int rc = lex_indentation(lx);
  while (rc == 0) {
    while (*lx->p == ' ' || *lx->p == '\t' || *lx->p == '\f') lx->p++;
    rc = lex_step(lx);
  }
  if (rc < 0 || lex_finish(lx) < 0) {
    lex_free(lx);
    return NULL;
  }
  return lx;
}

void lex_free(Lexer *lx) {
  if (!lx) return;
  for (int i = 0; i < lx->ntoks; i++) shm_free(lx->toks[i].str);
  shm_free(lx->toks);
  shm_free(lx);
}

const Token *lex_token(const Lexer *lx, int i) {
  if (i < 0) i = 0;
  if (i >= lx->ntoks) i = lx->ntoks - 1;
  return &lx->toks[i];
}

int lex_count(const Lexer *lx) { return lx->ntoks; }

bool tok_is(const Token *t, TokKind k, const char *s) {
  if (t->kind != k) return false;
  size_t n = strlen(s);
  return (size_t)t->len == n && !memcmp(t->start, s, n);
}

/* ---- lex_needs_more --------------------------------------------------------- */

/* What lex_needs_more learns from one pass over the text. */
typedef struct Scan {
  int depth;               /* open brackets */
  bool open_string;        /* inside a triple-quoted string at the end */
  bool trailing_backslash; /* the last significant character is a `\`
                              joining the next line */
  const char *last_line;   /* start of the last physical line */
  char last_sig;           /* last significant character of the last
                              non-blank line, outside comments */
  char first_sig;          /* first character of that line */
  bool last_indented;      /* that line starts with white space */
} Scan;

/* Skips a string starting at [p]; returns the character after it, or NULL
 * when a triple-quoted string is still open at the end. */
static const char *skip_string(const char *p) {
  while (*p != '\'' && *p != '"') p++;   /* the prefix */
  char q = *p;
  bool triple = p[1] == q && p[2] == q;
  p += triple ? 3 : 1;
  for (; *p; p++) {
    if (*p == '\\' && p[1]) {
      p++;
    } else if (*p == q && (!triple || (p[1] == q && p[2] == q))) {
      return p + (triple ? 3 : 1);
    } else if (!triple && *p == '\n') {
      return p;  /* unterminated: the parser will say so */
    }
  }
  return triple ? NULL : p;
}

/* Notes a significant character of the current line. */
static void scan_sig(Scan *s, const char *line, char c) {
  s->trailing_backslash = false;
  if (s->last_line != line || !s->first_sig) {
    s->first_sig = c;
    s->last_indented = *line == ' ' || *line == '\t';
    s->last_line = line;
  }
  s->last_sig = c;
}

static void scan_text(const char *p, Scan *s) {
  const char *line = p;
  while (*p) {
    if (*p == '\n') {
      line = ++p;
      continue;
    }
    if (*p == '#') {
      while (*p && *p != '\n') p++;
    } else if (starts_string(p)) {
      scan_sig(s, line, *p);
      p = skip_string(p);
      if (!p) {
        s->open_string = true;
        return;
      }
    } else if (*p == '\\' && (p[1] == '\n' || p[1] == '\0')) {
      s->trailing_backslash = true;
      p += p[1] ? 2 : 1;  /* the logical line goes on: [line] stays */
    } else {
      if (strchr("([{", *p)) s->depth++;
      if (strchr(")]}", *p) && s->depth > 0) s->depth--;
      if (*p != ' ' && *p != '\t' && *p != '\r') scan_sig(s, line, *p);
      p++;
    }
  }
}

/* True when the physical line starting at [p] (up to '\n' or the end) is
 * empty or white space. */
static bool line_blank(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\f') p++;
  return *p == '\0' || *p == '\n';
}

/* The REPL's convention: [text] is the lines entered so far, each ending
 * with "\n"; a blank line closes an indented block, but not an open
 * bracket, string or backslash continuation. */
bool lex_needs_more(const char *text) {
  Scan s = {0};
  scan_text(text, &s);
  if (s.open_string || s.depth > 0 || s.trailing_backslash) return true;
  if (!s.last_line) return false;
  /* the last line entered: after the last "\n" but one */
  size_t n = strlen(text);
  const char *last = text + n;
  if (last > text && last[-1] == '\n') last--;
  while (last > text && last[-1] != '\n') last--;
  if (line_blank(last)) return false;
  return s.last_sig == ':' || s.first_sig == '@' || s.last_indented;
}
