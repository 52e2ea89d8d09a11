/*
 * test_lexer.c - the lexer (lexer.c) against Python's tokenisation rules,
 * its error messages with their line:col, lex_needs_more for the REPL,
 * and the interned-name table (intern.c), which the lexer's users lean on.
 *
 * Token streams are compared as strings: names and operators as written,
 * keywords as k:word, numbers as i:123 / f:1.5, strings as s:"decoded",
 * and NL IN DE EOF for NEWLINE, INDENT, DEDENT and the end.
 */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "base/intern.h"
#include "base/mem.h"
#include "lang/lexer.h"

/* ---- helpers ------------------------------------------------------------------ */

static void put_token(FILE *out, const Token *t) {
  switch (t->kind) {
  case T_EOF: fputs("EOF", out); break;
  case T_NEWLINE: fputs("NL", out); break;
  case T_INDENT: fputs("IN", out); break;
  case T_DEDENT: fputs("DE", out); break;
  case T_KEYWORD: fprintf(out, "k:%.*s", t->len, t->start); break;
  case T_INT:
    if (t->overflow) fputs("i:big", out);
    else fprintf(out, "i:%lld", (long long)t->ival);
    break;
  case T_FLOAT: fprintf(out, "f:%g", t->fval); break;
  case T_STRING:
    fputs("s:\"", out);
    for (size_t i = 0; i < t->strlen; i++) {
      unsigned char c = (unsigned char)t->str[i];
      if (c == '\n') fputs("\\n", out);
      else if (c == '\t') fputs("\\t", out);
      else if (c == '\\' || c == '"') fprintf(out, "\\%c", c);
      else if (c < 0x20 || c >= 0x7F) fprintf(out, "\\x%02x", c);
      else fputc(c, out);
    }
    fputc('"', out);
    break;
  case T_FSTRING: fprintf(out, "F%lld:\"%.*s\"", (long long)t->ival, (int)t->strlen, t->str); break;
  case T_FSTRING_SEP: fputs("SEP", out); break;
  case T_FSTRING_END: fputs("FEND", out); break;
  default: fprintf(out, "%.*s", t->len, t->start); break;
  }
}

/* The token stream of [text] as a string, or "ERROR L:C: message". */
static char *lex_text(const char *text) {
  char *buf = NULL;
  size_t len = 0;
  FILE *out = open_memstream(&buf, &len);
  Source *src = src_new("t.shm", text);
  ck_assert_ptr_nonnull(src);
  Lexer *lx = lex_source(src);
  if (!lx) {
    ck_assert_int_eq(err_kind(), ERR_SYNTAX);
    Loc l = err_loc();
    fprintf(out, "ERROR %d:%d: %s", l.line, l.col, err_message());
    err_clear();
  }
  for (int i = 0; lx && i < lex_count(lx); i++) {
    if (i) fputc(' ', out);
    put_token(out, lex_token(lx, i));
  }
  lex_free(lx);
  src_decref(src);
  fclose(out);
  return buf;
}

typedef struct Case {
  const char *src;
  const char *want;
} Case;

static void check_cases(const Case *cases, size_t n) {
  for (size_t i = 0; i < n; i++) {
    char *got = lex_text(cases[i].src);
    ck_assert_msg(!strcmp(got, cases[i].want), "source: %s\n got: %s\nwant: %s",
                  cases[i].src, got, cases[i].want);
    free(got);
  }
}

#define CHECK_CASES(c) check_cases(c, sizeof c / sizeof c[0])

/* ---- lines and indentation ---------------------------------------------------- */

static const Case line_cases[] = {
    {"", "EOF"},
    {"\n\n", "EOF"},
    {"x = 1", "x = i:1 NL EOF"},
    {"x = 1\n", "x = i:1 NL EOF"},
    {"x # comment", "x NL EOF"},
    {"# only\n# comments\n", "EOF"},
    {"if x:\n    y\nz\n", "k:if x : NL IN y NL DE z NL EOF"},
    {"if a:\n  if b:\n    c\nd", "k:if a : NL IN k:if b : NL IN c NL DE DE d NL EOF"},
    {"if a:\n  if b:\n    c\n", "k:if a : NL IN k:if b : NL IN c NL DE DE EOF"},
    {"if a:\n\n  # c\n       # deeper comment\n  b\n   \n  c\n",
     "k:if a : NL IN b NL c NL DE EOF"},
    {"if a:\n\tb\n\tc\n", "k:if a : NL IN b NL c NL DE EOF"},
    {"f(1,\n  2\n)\n", "f ( i:1 , i:2 ) NL EOF"},
    {"x = [1,\n# comment\n\n      2]\n", "x = [ i:1 , i:2 ] NL EOF"},
    {"if a:\n    x = (1,\n2)\n    y\n", "k:if a : NL IN x = ( i:1 , i:2 ) NL y NL DE EOF"},
    {"x = 1 + \\\n 2\n", "x = i:1 + i:2 NL EOF"},
    {"if a:\n    x = \\\n1\n    y\n", "k:if a : NL IN x = i:1 NL y NL DE EOF"},
    {"a\r\nb\r\n", "a NL b NL EOF"},
    {"a\rb", "a NL b NL EOF"},
    {"a; b", "a ; b NL EOF"},
    {"\xe4\xbd\xa0 = 1", "\xe4\xbd\xa0 = i:1 NL EOF"},
};

START_TEST(test_lines) { CHECK_CASES(line_cases); }
END_TEST

/* ---- numbers -------------------------------------------------------------------- */

static const Case number_cases[] = {
    {"0 00 7 1_000 2147483648", "i:0 i:0 i:7 i:1000 i:2147483648 NL EOF"},
    {"0x1F 0XfF 0x_ff_ff 0o17 0O7 0b101 0B1_0", "i:31 i:255 i:65535 i:15 i:7 i:5 i:2 NL EOF"},
    {"9223372036854775807 9223372036854775808 99999999999999999999999",
     "i:9223372036854775807 i:big i:big NL EOF"},
    {"0xffffffffffffffff 0x7fffffffffffffff", "i:big i:9223372036854775807 NL EOF"},
    {"1. .5 1.5 1e-3 1E+3 1.5e2 1_0.2_5 0.0 00.5 1e400",
     "f:1 f:0.5 f:1.5 f:0.001 f:1000 f:150 f:10.25 f:0 f:0.5 f:inf NL EOF"},
    {"8*16.", "i:8 * f:16 NL EOF"},
    {"a.b 1 .b", "a . b i:1 . b NL EOF"},
    {"x[1:2]", "x [ i:1 : i:2 ] NL EOF"},
    {"...", "... NL EOF"},
};

START_TEST(test_numbers) { CHECK_CASES(number_cases); }
END_TEST

/* Lexing allocates in proportion to the source, not to its square: each
 * number literal once took a buffer the size of the rest of the file (a
 * 10 MB script took minutes).  200,000 literals in 1.4 MB must allocate
 * less than 64 bytes of scratch per source byte beyond the tokens. */
START_TEST(test_linear_allocation) {
  int n = 200000;
  char *text = malloc((size_t)n * 8 + 16);
  ck_assert_ptr_nonnull(text);
  size_t len = 0;
  len += (size_t)sprintf(text, "x = [");
  for (int i = 0; i < n; i++) len += (size_t)sprintf(text + len, "%d.5, ", i % 1000);
  sprintf(text + len, "0]\n");
  Source *src = src_new("big.shm", text);
  ck_assert_ptr_nonnull(src);
  long long before = shm_mem_bytes();
  Lexer *lx = lex_source(src);
  ck_assert_ptr_nonnull(lx);
  long long used = shm_mem_bytes() - before;
  ck_assert_msg(used < (long long)strlen(text) * 64, "lexing %zu bytes allocated %lld",
                strlen(text), used);
  lex_free(lx);
  src_decref(src);
  free(text);
}
END_TEST

START_TEST(test_int_overflow_flag) {
  Source *src = src_new("t", "12 99999999999999999999");
  Lexer *lx = lex_source(src);
  ck_assert(!lex_token(lx, 0)->overflow);
  ck_assert_int_eq(lex_token(lx, 0)->ival, 12);
  ck_assert(lex_token(lx, 1)->overflow);
  ck_assert_int_eq(lex_token(lx, 1)->ival, INT64_MAX);
  lex_free(lx);
  src_decref(src);
}
END_TEST

/* ---- strings -------------------------------------------------------------------- */

static const Case string_cases[] = {
    {"'a' \"b\" ''", "s:\"a\" s:\"b\" s:\"\" NL EOF"},
    {"'\\n\\t\\\\\\'\\\"\\a\\x41\\101\\0'", "s:\"\\n\\t\\\\'\\\"\\x07AA\\x00\" NL EOF"},
    {"'\\u00e9\\U0001F600'", "s:\"\\xc3\\xa9\\xf0\\x9f\\x98\\x80\" NL EOF"},
    {"'\\xff'", "s:\"\\xc3\\xbf\" NL EOF"},
    {"'\\q\\d'", "s:\"\\\\q\\\\d\" NL EOF"},
    {"r'\\n\\'' R\"\\d\"", "s:\"\\\\n\\\\'\" s:\"\\\\d\" NL EOF"},
    {"u'x'", "s:\"x\" NL EOF"},
    {"'''a\nb''' \"\"\"c'\"d\"\"\"", "s:\"a\\nb\" s:\"c'\\\"d\" NL EOF"},
    {"'''a''b'''", "s:\"a''b\" NL EOF"},
    {"'a\\\nb'", "s:\"ab\" NL EOF"},
    {"'\xc3\xa9\xe6\x97\xa5'", "s:\"\\xc3\\xa9\\xe6\\x97\\xa5\" NL EOF"},
    {"'\xff\xfe\xe4'", "ERROR 1:2: (unicode error) 'utf-8' codec can't decode byte 0xff in position 1: "
     "invalid start byte"},
    {"r + u", "r + u NL EOF"},
    {"'#' # real", "s:\"#\" NL EOF"},
};

START_TEST(test_strings) { CHECK_CASES(string_cases); }
END_TEST

/* f-strings: the str.format text (literal braces doubled), then each
 * field's own tokens and SEP, then FEND. */
static const Case fstring_cases[] = {
    {"f'a{x}b'", "F1:\"a{}b\" x SEP FEND NL EOF"},
    {"f'{x!r:>4} {y:.2f}'", "F2:\"{!r:>4} {:.2f}\" x SEP y SEP FEND NL EOF"},
    {"f'{{lit}} {d[\"k\"]}'", "F1:\"{{lit}} {}\" d [ s:\"k\" ] SEP FEND NL EOF"},
    {"f'{x = }'", "F1:\"x = {!r}\" x SEP FEND NL EOF"},
    {"f'{a!=b}{c==d}'", "F2:\"{}{}\" a != b SEP c == d SEP FEND NL EOF"},
    {"F'a' rf'\\n{x}'", "F0:\"a\" FEND F1:\"\\n{}\" x SEP FEND NL EOF"},
    {"f'{ {1: 2}[1] }'", "F1:\"{}\" { i:1 : i:2 } [ i:1 ] SEP FEND NL EOF"},
    {"f'''a\n{x}'''", "F1:\"a\n{}\" x SEP FEND NL EOF"},
    {"f'\\t{x}'", "F1:\"\t{}\" x SEP FEND NL EOF"},
};

START_TEST(test_fstrings) { CHECK_CASES(fstring_cases); }
END_TEST

/* ---- operators and words ---------------------------------------------------------- */

static const Case op_cases[] = {
    {"+ - * / // % ** @ << >> & | ^ ~ < > <= >= == != -> ... =",
     "+ - * / // % ** @ << >> & | ^ ~ < > <= >= == != -> ... = NL EOF"},
    {"+= -= *= /= //= %= **= @= <<= >>= &= |= ^=",
     "+= -= *= /= //= %= **= @= <<= >>= &= |= ^= NL EOF"},
    {"( ) [ ] { } , : . ;", "( ) [ ] { } , : . ; NL EOF"},
    {"a**-b", "a ** - b NL EOF"},
    {"x>>=1<=2", "x >>= i:1 <= i:2 NL EOF"},
    {"mesh shard_map jit on devices static",
     "mesh shard_map jit on devices static NL EOF"},
    {"def lambda return if elif else for in while break continue pass and or not",
     "k:def k:lambda k:return k:if k:elif k:else k:for k:in k:while k:break "
     "k:continue k:pass k:and k:or k:not NL EOF"},
    {"is None True False assert import from as global nonlocal",
     "k:is k:None k:True k:False k:assert k:import k:from k:as k:global "
     "k:nonlocal NL EOF"},
    {"define inx _if if_ Nonez", "define inx _if if_ Nonez NL EOF"},
};

START_TEST(test_operators_and_words) { CHECK_CASES(op_cases); }
END_TEST

/* ---- locations ------------------------------------------------------------------ */

START_TEST(test_locations) {
  Source *src = src_new("t", "ab = cd\nif x:\n    'q' + '''a\nb''' + y\n");
  Lexer *lx = lex_source(src);
  static const int want[][2] = {
      {1, 1}, {1, 4}, {1, 6}, {1, 8},          /* ab = cd NL */
      {2, 1}, {2, 4}, {2, 5}, {2, 6},          /* if x : NL */
      {3, 5}, {3, 5}, {3, 9}, {3, 11},         /* IN 'q' + '''a..b''' */
      {4, 6}, {4, 8}, {4, 9},                  /* + y NL */
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    const Token *t = lex_token(lx, (int)i);
    ck_assert_msg(t->line == want[i][0] && t->col == want[i][1],
                  "token %zu at %d:%d, want %d:%d", i, t->line, t->col,
                  want[i][0], want[i][1]);
  }
  ck_assert_int_eq(lex_token(lx, 1000)->kind, T_EOF);
  ck_assert_int_eq(lex_token(lx, lex_count(lx) - 1)->kind, T_EOF);
  ck_assert(tok_is(lex_token(lx, 1), T_OP, "="));
  ck_assert(!tok_is(lex_token(lx, 1), T_OP, "=="));
  ck_assert(tok_is(lex_token(lx, 4), T_KEYWORD, "if"));
  ck_assert(!tok_is(lex_token(lx, 4), T_NAME, "if"));
  lex_free(lx);
  src_decref(src);
}
END_TEST

/* ---- errors ------------------------------------------------------------------- */

static const Case error_cases[] = {
    {"'abc", "ERROR 1:1: unterminated string literal"},
    {"x = 1\ny = \"abc\n", "ERROR 2:5: unterminated string literal"},
    {"'a\nb'", "ERROR 1:1: unterminated string literal"},
    {"x = '''abc\n\n", "ERROR 1:5: unterminated triple-quoted string literal"},
    {"x = r'abc\\'", "ERROR 1:5: unterminated string literal"},
    {"if x:\n    a\n  b\n",
     "ERROR 3:3: unindent does not match any outer indentation level"},
    {"if x:\n\ty\n        z\n",
     "ERROR 3:9: inconsistent use of tabs and spaces in indentation"},
    {"a $ b", "ERROR 1:3: unexpected character '$'"},
    {"a ? b", "ERROR 1:3: unexpected character '?'"},
    {"a ! b", "ERROR 1:3: unexpected character '!'"},
    {"a `b`", "ERROR 1:3: unexpected character '`'"},
    {"a \x01", "ERROR 1:3: unexpected character '\\x01'"},
    {"a)", "ERROR 1:2: unmatched ')'"},
    {"(a))", "ERROR 1:4: unmatched ')'"},
    {"x = ]", "ERROR 1:5: unmatched ']'"},
    {"1__0", "ERROR 1:1: invalid decimal literal"},
    {"1_", "ERROR 1:1: invalid decimal literal"},
    {"1e", "ERROR 1:1: invalid decimal literal"},
    {"1.e+", "ERROR 1:1: invalid decimal literal"},
    {"1abc", "ERROR 1:1: invalid decimal literal"},
    {"x = 1j", "ERROR 1:5: complex literals are not supported"},
    {"012", "ERROR 1:1: leading zeros in decimal integer literals are not "
            "permitted; use an 0o prefix for octal integers"},
    {"0x", "ERROR 1:1: invalid hexadecimal literal"},
    {"0xg", "ERROR 1:1: invalid hexadecimal literal"},
    {"0o8", "ERROR 1:1: invalid octal literal"},
    {"0b2", "ERROR 1:1: invalid binary literal"},
    {"0b1__0", "ERROR 1:1: invalid binary literal"},
    {"x = 1 \\ y", "ERROR 1:7: unexpected character after line continuation "
                   "character"},
    {"x = \\", "ERROR 1:5: unexpected end of file after '\\'"},
    {"'\\x4'", "ERROR 1:2: truncated \\xXX escape in string literal"},
    {"'ab\\u12'", "ERROR 1:4: truncated \\uXX escape in string literal"},
    {"'\\U11111111'", "ERROR 1:2: illegal Unicode character in string literal"},
    {"f'{x'", "ERROR 1:1: f-string: expecting '}'"},
    {"f'{}'", "ERROR 1:4: f-string: valid expression required before '}'"},
    {"f'a}b'", "ERROR 1:4: f-string: single '}' is not allowed"},
    {"f'{x!z}'", "ERROR 1:6: f-string: invalid conversion character: expected 's', 'r', or 'a'"},
    {"f'{x:{y}}'", "ERROR 1:6: f-string: nested replacement fields in a format spec are not "
                   "supported"},
    {"f'{a#b}'", "ERROR 1:5: f-string expression part cannot include '#'"},
    {"f'abc", "ERROR 1:1: unterminated f-string literal"},
};

START_TEST(test_errors) { CHECK_CASES(error_cases); }
END_TEST

START_TEST(test_limits) {
  char *text = malloc(40000), *p = text;
  for (int level = 0; level <= 101; level++) {  /* 101 nested blocks */
    memset(p, ' ', (size_t)level);
    p += level;
    p += sprintf(p, "if x:\n");
  }
  *p = '\0';
  char *got = lex_text(text);
  ck_assert_str_eq(got, "ERROR 102:102: too many levels of indentation");
  free(got);
  p = text + sprintf(text, "x = ");
  memset(p, '(', 201);
  p[201] = '\0';
  got = lex_text(text);
  ck_assert_str_eq(got, "ERROR 1:205: too deeply nested");
  free(got);
  free(text);
}
END_TEST

/* ---- lex_needs_more ----------------------------------------------------------- */

static const struct {
  const char *text;
  bool more;
} more_cases[] = {
    {"", false},
    {"\n", false},
    {"# c\n", false},
    {"x = 1\n", false},
    {"x = 1", false},
    {"if x:\n", true},
    {"if x:", true},
    {"if x:  # a comment\n", true},
    {"if x:\n    y = 1\n", true},
    {"if x:\n    y = 1\n\n", false},
    {"if x:\n    y = 1\n    \n", false},
    {"def f():\n    return 1\n", true},
    {"def f():\n    return 1\n\n", false},
    {"f(1,\n", true},
    {"f(1,\n2)\n", false},
    {"x = (\n", true},
    {"x = )\n", false},
    {"x = [1, {2: (3,\n", true},
    {"x = ')'\n", false},
    {"x = '('\n", false},
    {"s = 'a:'\n", false},
    {"d = {'a': 1}\n", false},
    {"x = '''abc\n", true},
    {"x = '''abc\n'''\n", false},
    {"x = \"\"\"a(\n", true},
    {"x = 1 + \\\n", true},
    {"x = 1 + \\", true},
    {"x = 1 + \\\n2\n", false},
    {"x = 1 + \\\n\n", true}, /* the REPL appends a blank line */
    {"x = 1 + \\\n2\n\n", false},
    {"# a comment \\\n", false},
    {"x = 'a\\\nb'\n", false},
    {"f(1,\n\n", true},
    {"x = '''abc\n\n", true},
    {"if x:\n\n", false},
    {"@jit\n", true},
    {"@jit\ndef f(x):\n", true},
    {"shard_map f(x: P('i')) -> P('i') on m:\n", true},
    {"mesh m(i=2)\n", false},
};

START_TEST(test_needs_more) {
  for (size_t i = 0; i < sizeof more_cases / sizeof more_cases[0]; i++)
    ck_assert_msg(lex_needs_more(more_cases[i].text) == more_cases[i].more,
                  "lex_needs_more(\"%s\") should be %d", more_cases[i].text,
                  more_cases[i].more);
}
END_TEST

/* ---- interned names ------------------------------------------------------------- */

START_TEST(test_intern_basic) {
  const char *a = intern_cstr("alpha");
  ck_assert_ptr_nonnull(a);
  ck_assert_str_eq(a, "alpha");
  ck_assert_ptr_eq(a, intern_cstr("alpha"));
  ck_assert_ptr_eq(a, intern("alphabet", 5));
  ck_assert_ptr_ne(a, intern_cstr("alphabet"));
  ck_assert_ptr_ne(a, intern_cstr("Alpha"));
  ck_assert_str_eq(intern("", 0), "");
  ck_assert_ptr_eq(intern("", 0), intern_cstr(""));
}
END_TEST

START_TEST(test_intern_growth) {
  enum { N = 20000 };
  static const char *first[N];
  char name[32];
  for (int i = 0; i < N; i++) {
    snprintf(name, sizeof name, "grow_%d", i);
    first[i] = intern_cstr(name);
  }
  for (int i = 0; i < N; i++) {
    snprintf(name, sizeof name, "grow_%d", i);
    ck_assert_ptr_eq(intern_cstr(name), first[i]);
    ck_assert_str_eq(first[i], name);
  }
}
END_TEST

enum { THREADS = 4, NAMES = 3000 };
static const char *seen[THREADS][NAMES];

/* Interns the same names as every other thread, in its own order. */
static void *intern_worker(void *arg) {
  int id = (int)(intptr_t)arg;
  char name[32];
  for (int k = 0; k < NAMES; k++) {
    int i = (k * 7 + id * 1001) % NAMES;
    snprintf(name, sizeof name, "shared_%d", i);
    seen[id][i] = intern_cstr(name);
  }
  return NULL;
}

START_TEST(test_intern_threads) {
  pthread_t th[THREADS];
  for (int t = 0; t < THREADS; t++)
    pthread_create(&th[t], NULL, intern_worker, (void *)(intptr_t)t);
  for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
  for (int i = 0; i < NAMES; i++)
    for (int t = 1; t < THREADS; t++) ck_assert_ptr_eq(seen[t][i], seen[0][i]);
}
END_TEST

/* ---- the suite ---------------------------------------------------------------- */

static Suite *lexer_suite(void) {
  Suite *s = suite_create("lexer");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 60);   /* test_linear_allocation lexes 1.4 MB: slow under TSan */
  tcase_add_test(tc, test_lines);
  tcase_add_test(tc, test_numbers);
  tcase_add_test(tc, test_int_overflow_flag);
  tcase_add_test(tc, test_linear_allocation);
  tcase_add_test(tc, test_strings);
  tcase_add_test(tc, test_fstrings);
  tcase_add_test(tc, test_operators_and_words);
  tcase_add_test(tc, test_locations);
  tcase_add_test(tc, test_errors);
  tcase_add_test(tc, test_limits);
  tcase_add_test(tc, test_needs_more);
  suite_add_tcase(s, tc);
  TCase *ti = tcase_create("intern");
  tcase_add_test(ti, test_intern_basic);
  tcase_add_test(ti, test_intern_growth);
  tcase_add_test(ti, test_intern_threads);
  suite_add_tcase(s, ti);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(lexer_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
