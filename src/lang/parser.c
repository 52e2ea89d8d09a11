/*
 * parser.c - recursive descent from the lexer's tokens to ast.h trees
 * (parser.h).
 *
 * The grammar is Python's (The Python Language Reference, "Full Grammar
 * specification", restricted to what LANGUAGE.md needs), written above
 * each function in the style of Lua's lparser.c, plus three statements of
 * the language's own:
 *     mesh_stmt     -> 'mesh' NAME '(' axes ')' ['devices' test]
 *     shardmap_stmt -> ['jit'] 'shard_map' NAME '(' params ')' '->' test
 *                      'on' test {',' NAME '=' test} ':' block
 *     funcdef       -> ['jit'] 'def' NAME '(' params ')' ['->' test] ':' block
 * Their words (mesh, shard_map, jit, on, devices) are ordinary names to the
 * lexer.  A statement is one of these only when its first tokens say so:
 * `mesh NAME (`, `shard_map NAME (`, `jit def`, `jit shard_map NAME (`;
 * none of those sequences is valid Python, so `jit(f)`, `shard_map(f,
 * mesh=m, ...)` and a variable named `devices` keep their usual meaning.
 *
 * Binary operators are parsed by precedence climbing over one table;
 * everything else has a function per rule.  The recursion depth is bounded
 * (MAX_DEPTH) so that hostile input fails with "too deeply nested" rather
 * than overflowing a device thread's stack.
 *
 * Decisions:
 *   - An integer literal must fit in int32, the language's default integer
 *     type: a larger one is a syntax error, as JAX raises OverflowError when
 *     such a Python int meets a 32-bit array.  `-2147483648` is accepted:
 *     a minus sign directly before a number literal is folded into it
 *     (except before `**`, which binds tighter: -2**2 is -(2**2)).
 *   - 'return' outside a def or shard_map body, 'break' and 'continue'
 *     outside a loop, and 'nonlocal' at module level are rejected here, at
 *     parse time, not left to the evaluator.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array/array.h"
#include "base/intern.h"
#include "lang/lexer.h"
#include "base/mem.h"
#include "lang/parser.h"

/* Bound on the height of the tree being built: each level of recursion
 * (brackets, unary operators, `**`, blocks, conditional expressions) and
 * each link of a left-nested chain (`a + b + c`, `x.f(1)[0]`, elif) counts
 * one.  It keeps the parser's and the evaluator's recursion within a
 * thread's stack.  Open brackets alone are limited to 200 by the lexer,
 * as in CPython. */
#define MAX_DEPTH 1000

typedef struct Parser {
  Lexer *lx;
  AstModule *m;
  Source *src;
  int pos;         /* index of the next token */
  int depth;       /* current nesting, <= MAX_DEPTH */
  int func_depth;  /* > 0 inside a def or shard_map body */
  int loop_depth;  /* > 0 inside a loop of the innermost function */
} Parser;

static Node *parse_test(Parser *p);
static Node *parse_or_test(Parser *p);
static Node *parse_binary(Parser *p, int minprec);
static Node *parse_factor(Parser *p);
static Node *parse_testlist_star(Parser *p);
static int parse_statement(Parser *p, NodeList *out);
static int parse_simple_stmts(Parser *p, NodeList *out);

/* ---- tokens ---------------------------------------------------------------- */

static const Token *peek(const Parser *p) { return lex_token(p->lx, p->pos); }

static const Token *peek_at(const Parser *p, int k) {
  return lex_token(p->lx, p->pos + k);
}

static const Token *advance(Parser *p) {
  const Token *t = peek(p);
  if (t->kind != T_EOF) p->pos++;
  return t;
}

static bool is_op(const Token *t, const char *s) { return tok_is(t, T_OP, s); }
static bool is_kw(const Token *t, const char *s) {
  return tok_is(t, T_KEYWORD, s);
}
static bool is_word(const Token *t, const char *s) {
  return tok_is(t, T_NAME, s);
}

static bool accept_op(Parser *p, const char *s) {
  if (!is_op(peek(p), s)) return false;
  p->pos++;
  return true;
}

static bool accept_kw(Parser *p, const char *s) {
  if (!is_kw(peek(p), s)) return false;
  p->pos++;
  return true;
}

static Loc tok_loc(const Parser *p, const Token *t) {
  Loc loc = {p->src, t->line, t->col};
  return loc;
}

/* Sets the syntax error at token [t]; returns NULL. */
static void *syntax_error(Parser *p, const Token *t, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void *syntax_error(Parser *p, const Token *t, const char *fmt, ...) {
  char msg[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return err_set_at(tok_loc(p, t), ERR_SYNTAX, "%s", msg);
}

/* The error for a token that cannot start or continue what is parsed. */
static void *invalid_syntax(Parser *p, const Token *t) {
  if (t->kind == T_INDENT) return syntax_error(p, t, "unexpected indent");
  return syntax_error(p, t, "invalid syntax");
}

/* Consumes the operator [s] or fails with "expected 's'". */
static const Token *expect_op(Parser *p, const char *s) {
  if (is_op(peek(p), s)) return advance(p);
  return syntax_error(p, peek(p), "expected '%s'", s);
}

/* Consumes the bracket [close] matching [open] or fails with "expected ')'
 * to close '(' at line N". */
static const Token *expect_close(Parser *p, const Token *open,
                                 const char *close) {
  if (is_op(peek(p), close)) return advance(p);
  return syntax_error(p, peek(p), "expected '%s' to close '%.1s' at line %d",
                      close, open->start, open->line);
}

/* The interned text of a name token. */
static const char *tok_name(const Parser *p, const Token *t) {
  const char *s = intern(t->start, (size_t)t->len);
  return s ? s : err_nomem();
}

/* Consumes a NAME token and returns it interned, or fails. */
static const char *expect_name(Parser *p) {
  const Token *t = peek(p);
  if (t->kind != T_NAME) return syntax_error(p, t, "expected a name");
  advance(p);
  return tok_name(p, t);
}

/* True if [t] may begin an expression (or a starred one). */
static bool starts_expr(const Token *t) {
  static const char *const ops[] = {"(", "[", "{", "-", "+", "~", "...", "*",
                                    NULL};
  static const char *const kws[] = {"None", "True", "False", "not", "lambda",
                                    NULL};
  if (t->kind == T_NAME || t->kind == T_INT || t->kind == T_FLOAT ||
      t->kind == T_STRING || t->kind == T_FSTRING)
    return true;
  for (int i = 0; ops[i]; i++)
    if (is_op(t, ops[i])) return true;
  for (int i = 0; kws[i]; i++)
    if (is_kw(t, kws[i])) return true;
  return false;
}

/* ---- nodes --------------------------------------------------------------------- */

static Node *new_node(Parser *p, NodeKind kind, const Token *t) {
  Node *n = ast_alloc(p->m, sizeof *n);
  if (!n) return NULL;
  n->kind = kind;
  n->loc = n->loc2 = tok_loc(p, t);
  return n;
}

/* Where the source text of [n] starts (binary forms keep it in loc2). */
static Loc node_start(const Node *n) {
  if (n->kind == N_BINOP || n->kind == N_BOOLOP || n->kind == N_COMPARE)
    return n->loc2;
  return n->loc;
}

/* An array of [n] elements of [size] bytes in the arena, with room made
 * for one more (the capacity rule of nodelist_push); NULL on nomem. */
static void *grow(Parser *p, void *arr, int n, size_t size) {
  if (n != 0 && (n < 4 || (n & (n - 1)))) return arr;
  int cap = n == 0 ? 4 : n * 2;
  void *na = ast_alloc(p->m, size * (size_t)cap);
  if (na && n) memcpy(na, arr, size * (size_t)n);
  return na;
}

static int push(Parser *p, NodeList *l, Node *n) {
  return nodelist_push(p->m, l, n);
}

static int enter(Parser *p) {
  if (++p->depth <= MAX_DEPTH) return 0;
  syntax_error(p, peek(p), "too deeply nested");
  return -1;
}

static void leave(Parser *p) { p->depth--; }

/* Counts one more link of a left-nested chain (see MAX_DEPTH); the caller
 * gives the links back with p->depth -= links when the chain ends. */
static int chain_link(Parser *p, int *links) {
  (*links)++;
  return enter(p);
}

/* ---- constants --------------------------------------------------------------- */

/* An N_CONST at [t] holding [v] (a new reference, stolen; NULL allowed,
 * meaning its creation failed with the error set). */
static Node *const_node(Parser *p, const Token *t, Value *v) {
  if (!v || !ast_keep_const(p->m, v)) return NULL;
  Node *n = new_node(p, N_CONST, t);
  if (n) n->value = v;
  return n;
}

/* An integer literal, negated if [neg]; [at] locates the node. */
static Node *int_const(Parser *p, const Token *at, const Token *t, bool neg) {
  int64_t v = neg ? -t->ival : t->ival;
  if (t->overflow || v > INT32_MAX || v < INT32_MIN)
    return syntax_error(p, at,
                        "integer literal %s%.*s does not fit in int32, the "
                        "default integer type (JAX raises OverflowError)",
                        neg ? "-" : "", t->len > 40 ? 40 : t->len, t->start);
  return const_node(p, at, arr_python_int(v));
}

static Node *float_const(Parser *p, const Token *at, const Token *t,
                         bool neg) {
  double v = neg ? -t->fval : t->fval;
  return const_node(p, at, arr_python_float(v));
}

/* Appends [n] bytes to the growing buffer [*buf] of [*len] bytes, braces
 * doubled when [escape] (plain text inside a str.format string). */
static int buf_add(char **buf, size_t *len, size_t *cap, const char *s, size_t n, bool escape) {
  for (size_t i = 0; i < n; i++) {
    bool twice = escape && (s[i] == '{' || s[i] == '}');
    if (*len + 3 > *cap) {
      size_t ncap = *cap ? *cap * 2 : 64;
      char *nb = shm_realloc(*buf, ncap);
      if (!nb) return err_nomem(), -1;
      *buf = nb;
      *cap = ncap;
    }
    (*buf)[(*len)++] = s[i];
    if (twice) (*buf)[(*len)++] = s[i];
  }
  return 0;
}

/* The fields of one f-string, after its T_FSTRING: each an expression and
 * T_FSTRING_SEP, then T_FSTRING_END. */
static int parse_fstring_fields(Parser *p, const Token *f, NodeList *args) {
  for (int64_t i = 0; i < f->ival; i++) {
    Node *e = parse_test(p);
    if (!e || push(p, args, e) < 0) return -1;
    if (peek(p)->kind != T_FSTRING_SEP) {
      syntax_error(p, peek(p), "f-string: expecting '}'");
      return -1;
    }
    advance(p);
  }
  if (peek(p)->kind != T_FSTRING_END) {
    syntax_error(p, peek(p), "f-string: expecting '}'");
    return -1;
  }
  advance(p);
  return 0;
}

/* strings -> (STRING | FSTRING)+: adjacent literals are concatenated; with
 * an f-string among them the whole is fmt.format(fields...), as Python
 * evaluates f-strings. */
static Node *parse_strings(Parser *p) {
  const Token *first = peek(p);
  bool fmt = false;
  for (int i = 0; peek_at(p, i)->kind == T_STRING || peek_at(p, i)->kind == T_FSTRING;) {
    const Token *t = peek_at(p, i);
    if (t->kind == T_STRING) {
      i++;
      continue;
    }
    fmt = true;   /* skip to past its T_FSTRING_END */
    while (peek_at(p, i)->kind != T_FSTRING_END && peek_at(p, i)->kind != T_EOF) i++;
    i++;
  }
  char *buf = NULL;
  size_t len = 0, cap = 0;
  Node *call = fmt ? new_node(p, N_CALL, first) : NULL;
  if (fmt && !call) return NULL;
  while (peek(p)->kind == T_STRING || peek(p)->kind == T_FSTRING) {
    const Token *t = advance(p);
    if (buf_add(&buf, &len, &cap, t->str, t->strlen, fmt && t->kind == T_STRING) < 0 ||
        (t->kind == T_FSTRING && parse_fstring_fields(p, t, &call->items) < 0)) {
      shm_free(buf);
      return NULL;
    }
  }
  Value *v = str_new(buf ? buf : "", len);
  shm_free(buf);
  Node *c = const_node(p, first, v);
  if (!fmt || !c) return c;
  Node *attr = new_node(p, N_ATTR, first);
  if (!attr) return NULL;
  attr->a = c;
  attr->name = intern_cstr("format");
  call->a = attr;
  return call;
}

/* The constant keywords None, True, False. */
static Node *keyword_const(Parser *p) {
  const Token *t = advance(p);
  Value *v = is_kw(t, "None") ? VAL_NONE : val_bool(is_kw(t, "True"));
  return const_node(p, t, val_incref(v));
}

/* ---- displays and comprehensions -------------------------------------------------- */

static int check_target(Parser *p, Node *n, bool in_seq);

/* star_expr -> '*' expr */
static Node *parse_star_expr(Parser *p) {
  const Token *t = advance(p);
  Node *n = new_node(p, N_STARRED, t);
  if (n && !(n->a = parse_binary(p, 1))) return NULL;
  return n;
}

/* An item of a display or target list: star_expr | test, or star_expr |
 * expr when [targets] (a for-loop target stops before 'in'). */
static Node *parse_item(Parser *p, bool targets) {
  if (is_op(peek(p), "*")) return parse_star_expr(p);
  return targets ? parse_binary(p, 1) : parse_test(p);
}

/* Parses `, item` pairs after [first] while an item follows, into a tuple
 * at [first]'s start; [first] alone when no comma follows. */
static Node *parse_tuple_rest(Parser *p, Node *first, bool targets) {
  if (!is_op(peek(p), ",")) return first;
  Node *t = new_node(p, N_TUPLE, peek(p));
  if (!t || push(p, &t->items, first) < 0) return NULL;
  t->loc = t->loc2 = node_start(first);
  while (accept_op(p, ",") && starts_expr(peek(p))) {
    Node *item = parse_item(p, targets);
    if (!item || push(p, &t->items, item) < 0) return NULL;
  }
  return t;
}

/* exprlist -> (expr|star_expr) {',' (expr|star_expr)} [','] */
static Node *parse_exprlist(Parser *p) {
  Node *first = parse_item(p, true);
  return first ? parse_tuple_rest(p, first, true) : NULL;
}

/* comp_for -> 'for' exprlist 'in' or_test {'if' or_test} [comp_for] */
static int parse_comp_clauses(Parser *p, Node *n) {
  while (accept_kw(p, "for")) {
    CompClause *cl = grow(p, n->clauses, n->nclauses, sizeof *cl);
    if (!cl) return -1;
    n->clauses = cl;
    cl = &n->clauses[n->nclauses++];
    if (!(cl->target = parse_exprlist(p))) return -1;
    if (check_target(p, cl->target, false) < 0) return -1;
    if (!accept_kw(p, "in")) {
      syntax_error(p, peek(p), "expected 'in'");
      return -1;
    }
    if (!(cl->iter = parse_or_test(p))) return -1;
    while (accept_kw(p, "if")) {
      Node *c = parse_or_test(p);
      if (!c || push(p, &cl->conds, c) < 0) return -1;
    }
  }
  return 0;
}

/* A list comprehension over the element [elt] at [open]. */
static Node *parse_listcomp(Parser *p, const Token *open, Node *elt) {
  Node *n = new_node(p, N_LISTCOMP, open);
  if (!n) return NULL;
  n->a = elt;
  return parse_comp_clauses(p, n) < 0 ? NULL : n;
}

/* Items up to the closing bracket [close] into [n]->items. */
static int parse_items(Parser *p, Node *n, const Token *open,
                       const char *close) {
  while (!is_op(peek(p), close)) {
    Node *item = parse_item(p, false);
    if (!item || push(p, &n->items, item) < 0) return -1;
    if (!accept_op(p, ",")) break;
  }
  return expect_close(p, open, close) ? 0 : -1;
}

/* atom_paren -> '(' [(test|star_expr) (comp_for | {',' (test|star_expr)}
 *               [','])] ')' */
static Node *parse_paren(Parser *p) {
  const Token *open = advance(p);
  if (accept_op(p, ")")) return new_node(p, N_TUPLE, open);
  Node *first = parse_item(p, false);
  if (!first) return NULL;
  if (is_kw(peek(p), "for")) {
    Node *n = parse_listcomp(p, open, first);
    if (n) n->is_gen = true;
    return n && expect_close(p, open, ")") ? n : NULL;
  }
  if (!is_op(peek(p), ",")) return expect_close(p, open, ")") ? first : NULL;
  Node *t = new_node(p, N_TUPLE, open);
  if (!t || push(p, &t->items, first) < 0) return NULL;
  advance(p);
  return parse_items(p, t, open, ")") < 0 ? NULL : t;
}

/* atom_list -> '[' [(test|star_expr) (comp_for | {',' (test|star_expr)}
 *              [','])] ']' */
static Node *parse_list(Parser *p) {
  const Token *open = advance(p);
  Node *n = new_node(p, N_LIST, open);
  if (!n) return NULL;
  if (accept_op(p, "]")) return n;
  Node *first = parse_item(p, false);
  if (!first) return NULL;
  if (is_kw(peek(p), "for")) {
    Node *c = parse_listcomp(p, open, first);
    return c && expect_close(p, open, "]") ? c : NULL;
  }
  if (push(p, &n->items, first) < 0) return NULL;
  if (!accept_op(p, ",")) return expect_close(p, open, "]") ? n : NULL;
  return parse_items(p, n, open, "]") < 0 ? NULL : n;
}

/* The rest of a set display or comprehension after its first element. */
static Node *parse_set(Parser *p, const Token *open, Node *first) {
  if (is_kw(peek(p), "for")) {
    Node *c = parse_listcomp(p, open, first);
    if (c) c->is_set = true;
    return c && expect_close(p, open, "}") ? c : NULL;
  }
  Node *n = new_node(p, N_SET, open);
  if (!n || push(p, &n->items, first) < 0) return NULL;
  if (!accept_op(p, ",")) return expect_close(p, open, "}") ? n : NULL;
  return parse_items(p, n, open, "}") < 0 ? NULL : n;
}

/* atom_dict -> '{' [test ':' test (comp_for | {',' test ':' test} [','])] '}'
 *            | '{' (test|star_expr) (comp_for | {',' (test|star_expr)} [',']) '}'
 * A dict comprehension is an N_LISTCOMP whose b is the value, a set
 * comprehension one marked is_set. */
static Node *parse_dict(Parser *p) {
  const Token *open = advance(p);
  Node *n = new_node(p, N_DICT, open);
  if (!n) return NULL;
  while (!is_op(peek(p), "}")) {
    Node *k = n->items.n ? parse_test(p) : parse_item(p, false);
    if (k && n->items.n == 0 && !is_op(peek(p), ":")) return parse_set(p, open, k);
    if (!k || !expect_op(p, ":")) return NULL;
    Node *v = parse_test(p);
    if (!v) return NULL;
    if (is_kw(peek(p), "for") && n->items.n == 0) {
      Node *c = parse_listcomp(p, open, k);
      if (c) c->b = v;
      return c && expect_close(p, open, "}") ? c : NULL;
    }
    if (push(p, &n->items, k) < 0 || push(p, &n->items2, v) < 0) return NULL;
    if (!accept_op(p, ",")) break;
  }
  return expect_close(p, open, "}") ? n : NULL;
}

/* ---- atoms and trailers ---------------------------------------------------------- */

/* atom -> '(' ... ')' | '[' ... ']' | '{' ... '}' | NAME | NUMBER |
 *         STRING+ | '...' | 'None' | 'True' | 'False' */
static Node *parse_atom(Parser *p) {
  const Token *t = peek(p);
  switch (t->kind) {
  case T_NAME: {
    Node *n = new_node(p, N_NAME, advance(p));
    if (n && !(n->name = tok_name(p, t))) return NULL;
    return n;
  }
  case T_INT: return int_const(p, advance(p), t, false);
  case T_FLOAT: return float_const(p, advance(p), t, false);
  case T_STRING:
  case T_FSTRING: return parse_strings(p);
  case T_KEYWORD:
    if (is_kw(t, "None") || is_kw(t, "True") || is_kw(t, "False"))
      return keyword_const(p);
    return invalid_syntax(p, t);
  case T_OP:
    if (is_op(t, "(")) return parse_paren(p);
    if (is_op(t, "[")) return parse_list(p);
    if (is_op(t, "{")) return parse_dict(p);
    if (is_op(t, "..."))
      return const_node(p, advance(p), val_incref(VAL_ELLIPSIS));
    return invalid_syntax(p, t);
  default: return invalid_syntax(p, t);
  }
}

/* Adds the keyword argument [name]=[value] (name NULL for **value). */
static int add_keyword(Parser *p, Node *call, const Token *t,
                       const char *name, Node *value) {
  for (int i = 0; name && i < call->nkw; i++)
    if (call->kws[i].name == name) {
      syntax_error(p, t, "keyword argument repeated: %s", name);
      return -1;
    }
  Keyword *kw = grow(p, call->kws, call->nkw, sizeof *kw);
  if (!kw) return -1;
  call->kws = kw;
  kw = &call->kws[call->nkw++];
  kw->name = name;
  kw->value = value;
  kw->loc = tok_loc(p, t);
  return 0;
}

/* argument -> NAME '=' test | '**' test */
static int parse_keyword_arg(Parser *p, Node *call) {
  const Token *t = advance(p);
  const char *name = NULL;
  if (t->kind == T_NAME) {
    if (!(name = tok_name(p, t))) return -1;
    advance(p); /* '=' */
  }
  Node *v = parse_test(p);
  return v ? add_keyword(p, call, t, name, v) : -1;
}

/* argument -> test [comp_for] | '*' test: positional ones. */
static int parse_positional_arg(Parser *p, Node *call, bool *genexp) {
  const Token *t = peek(p);
  if (call->nkw > 0 && !is_op(t, "*")) {
    bool unpack = call->kws[call->nkw - 1].name == NULL;
    syntax_error(p, t, "positional argument follows keyword argument%s",
                 unpack ? " unpacking" : "");
    return -1;
  }
  Node *a = is_op(t, "*") ? parse_star_expr(p) : parse_test(p);
  if (!a) return -1;
  if (is_op(peek(p), "=")) {
    syntax_error(p, peek(p), "expression cannot contain assignment, perhaps "
                             "you meant \"==\"?");
    return -1;
  }
  if (is_kw(peek(p), "for")) {
    *genexp = true;
    if (!(a = parse_listcomp(p, t, a))) return -1;
    a->is_gen = true;
  }
  return push(p, &call->items, a);
}

/* arglist -> argument {',' argument} [','] */
static int parse_arglist(Parser *p, Node *call, const Token *open) {
  while (!is_op(peek(p), ")")) {
    const Token *t = peek(p);
    bool genexp = false;
    int rc = (t->kind == T_NAME && is_op(peek_at(p, 1), "=")) || is_op(t, "**")
                 ? parse_keyword_arg(p, call)
                 : parse_positional_arg(p, call, &genexp);
    if (rc < 0) return -1;
    if (genexp && (call->items.n + call->nkw > 1 || is_op(peek(p), ","))) {
      syntax_error(p, t, "Generator expression must be parenthesized");
      return -1;
    }
    if (!accept_op(p, ",")) break;
  }
  return expect_close(p, open, ")") ? 0 : -1;
}

/* trailer -> '(' [arglist] ')' */
static Node *parse_call(Parser *p, Node *func) {
  const Token *open = advance(p);
  Node *n = new_node(p, N_CALL, open);
  if (!n) return NULL;
  n->loc = node_start(func);
  n->a = func;
  return parse_arglist(p, n, open) < 0 ? NULL : n;
}

/* subscript -> test | [test] ':' [test] [':' [test]] */
static Node *parse_subscript(Parser *p) {
  Node *lo = NULL;
  const Token *t = peek(p);
  if (!is_op(t, ":")) {
    if (!(lo = parse_test(p))) return NULL;
    if (!is_op(peek(p), ":")) return lo;
  }
  Node *s = new_node(p, N_SLICE, t);
  if (!s) return NULL;
  s->a = lo;
  advance(p); /* ':' */
  if (!is_op(peek(p), ":") && !is_op(peek(p), ",") && !is_op(peek(p), "]"))
    if (!(s->b = parse_test(p))) return NULL;
  if (accept_op(p, ":") && !is_op(peek(p), ",") && !is_op(peek(p), "]"))
    if (!(s->c = parse_test(p))) return NULL;
  return s;
}

/* trailer -> '[' subscript {',' subscript} [','] ']' */
static Node *parse_index(Parser *p, Node *obj) {
  const Token *open = advance(p);
  Node *n = new_node(p, N_SUBSCRIPT, open);
  Node *first = n ? parse_subscript(p) : NULL;
  if (!first) return NULL;
  n->loc = node_start(obj);
  n->a = obj;
  n->b = first;
  if (is_op(peek(p), ",")) {
    Node *t = new_node(p, N_TUPLE, open);
    if (!t || push(p, &t->items, first) < 0) return NULL;
    t->loc = t->loc2 = node_start(first);
    while (accept_op(p, ",") && !is_op(peek(p), "]")) {
      Node *item = parse_subscript(p);
      if (!item || push(p, &t->items, item) < 0) return NULL;
    }
    n->b = t;
  }
  return expect_close(p, open, "]") ? n : NULL;
}

/* trailer -> '.' NAME */
static Node *parse_attr(Parser *p, Node *obj) {
  advance(p);
  const Token *t = peek(p);
  Node *n = new_node(p, N_ATTR, t);
  if (!n || !(n->name = expect_name(p))) return NULL;
  n->loc = node_start(obj);
  n->a = obj;
  return n;
}

/* primary -> atom {trailer} */
static Node *parse_primary(Parser *p) {
  Node *n = parse_atom(p);
  int links = 0;
  while (n) {
    const Token *t = peek(p);
    bool trailer = is_op(t, "(") || is_op(t, "[") || is_op(t, ".");
    if (!trailer) break;
    if (chain_link(p, &links) < 0) return NULL;
    if (is_op(t, "(")) n = parse_call(p, n);
    else if (is_op(t, "[")) n = parse_index(p, n);
    else n = parse_attr(p, n);
  }
  p->depth -= links;
  return n;
}

/* ---- operators ------------------------------------------------------------------- */

/* power -> primary ['**' factor] */
static Node *parse_power(Parser *p) {
  Node *base = parse_primary(p);
  if (!base || !is_op(peek(p), "**")) return base;
  if (enter(p) < 0) return NULL;
  Node *n = new_node(p, N_BINOP, advance(p));
  if (!n || !(n->b = parse_factor(p))) return NULL;
  leave(p);
  n->op = OP_POW;
  n->a = base;
  n->loc2 = node_start(base);
  return n;
}

/* A number literal right after a unary minus, folded into one constant
 * unless something binding tighter follows it. */
static bool foldable_number(const Parser *p) {
  const Token *t = peek_at(p, 1), *after = peek_at(p, 2);
  if (t->kind != T_INT && t->kind != T_FLOAT) return false;
  return !is_op(after, "**") && !is_op(after, "(") && !is_op(after, "[") &&
         !is_op(after, ".");
}

/* factor -> ('+'|'-'|'~') factor | power */
static Node *parse_factor(Parser *p) {
  const Token *t = peek(p);
  OpKind op = OP_POS;
  if (is_op(t, "-")) op = OP_NEG;
  else if (is_op(t, "~")) op = OP_INVERT;
  else if (!is_op(t, "+")) return parse_power(p);
  if (op == OP_NEG && foldable_number(p)) {
    const Token *num = peek_at(p, 1);
    p->pos += 2;
    return num->kind == T_INT ? int_const(p, t, num, true)
                              : float_const(p, t, num, true);
  }
  if (enter(p) < 0) return NULL;
  Node *n = new_node(p, N_UNARY, advance(p));
  if (n && !(n->a = parse_factor(p))) n = NULL;
  if (n) n->op = op;
  leave(p);
  return n;
}

/* The binary operators from '|' to '*', loosest first. */
static const struct BinOp {
  const char *sym;
  OpKind op;
  int prec;
} binops[] = {
    {"|", OP_BITOR, 1},     {"^", OP_BITXOR, 2},    {"&", OP_BITAND, 3},
    {"<<", OP_LSHIFT, 4},   {">>", OP_RSHIFT, 4},   {"+", OP_ADD, 5},
    {"-", OP_SUB, 5},       {"*", OP_MUL, 6},       {"/", OP_DIV, 6},
    {"//", OP_FLOORDIV, 6}, {"%", OP_MOD, 6},       {"@", OP_MATMUL, 6},
};

static const struct BinOp *binop_of(const Token *t) {
  if (t->kind != T_OP) return NULL;
  for (size_t i = 0; i < sizeof binops / sizeof binops[0]; i++)
    if (is_op(t, binops[i].sym)) return &binops[i];
  return NULL;
}

/* expr -> xor_expr {'|' xor_expr}; ... ; term -> factor {('*'|'@'|'/'|'%'|
 * '//') factor}: every level at once, by precedence climbing.  Operators
 * of one level associate to the left. */
static Node *parse_binary(Parser *p, int minprec) {
  Node *left = parse_factor(p);
  const struct BinOp *b;
  int links = 0;
  while (left && (b = binop_of(peek(p))) && b->prec >= minprec) {
    if (chain_link(p, &links) < 0) return NULL;
    Node *n = new_node(p, N_BINOP, advance(p));
    if (!n || !(n->b = parse_binary(p, b->prec + 1))) return NULL;
    n->op = b->op;
    n->a = left;
    n->loc2 = node_start(left);
    left = n;
  }
  p->depth -= links;
  return left;
}

/* comp_op -> '<'|'>'|'=='|'>='|'<='|'!='|'in'|'not' 'in'|'is'|'is' 'not';
 * consumes it and stores it in [*op], or returns false. */
static bool accept_comp_op(Parser *p, OpKind *op) {
  static const struct { const char *sym; OpKind op; } ops[] = {
      {"<", OP_LT}, {">", OP_GT}, {"==", OP_EQ},
      {">=", OP_GE}, {"<=", OP_LE}, {"!=", OP_NE}};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
    if (accept_op(p, ops[i].sym)) {
      *op = ops[i].op;
      return true;
    }
  if (is_kw(peek(p), "not") && is_kw(peek_at(p, 1), "in")) {
    p->pos += 2;
    *op = OP_NOT_IN;
  } else if (accept_kw(p, "in")) {
    *op = OP_IN;
  } else if (accept_kw(p, "is")) {
    *op = accept_kw(p, "not") ? OP_IS_NOT : OP_IS;
  } else {
    return false;
  }
  return true;
}

/* comparison -> expr {comp_op expr} */
static Node *parse_comparison(Parser *p) {
  Node *first = parse_binary(p, 1);
  if (!first) return NULL;
  const Token *t = peek(p);
  OpKind op;
  if (!accept_comp_op(p, &op)) return first;
  Node *n = new_node(p, N_COMPARE, t);
  if (!n || push(p, &n->items, first) < 0) return NULL;
  n->loc2 = node_start(first);
  n->op = op;
  do {
    OpKind *ops = grow(p, n->ops, n->items.n - 1, sizeof *ops);
    Node *rhs = ops ? parse_binary(p, 1) : NULL;
    if (!rhs || push(p, &n->items, rhs) < 0) return NULL;
    n->ops = ops;
    n->ops[n->items.n - 2] = op;
  } while (accept_comp_op(p, &op));
  return n;
}

/* not_test -> 'not' not_test | comparison */
static Node *parse_not_test(Parser *p) {
  if (!is_kw(peek(p), "not")) return parse_comparison(p);
  if (enter(p) < 0) return NULL;
  Node *n = new_node(p, N_UNARY, advance(p));
  if (n && !(n->a = parse_not_test(p))) n = NULL;
  if (n) n->op = OP_NOT;
  leave(p);
  return n;
}

/* and_test -> not_test {'and' not_test};
 * or_test -> and_test {'or' and_test}  (as [op]) */
static Node *parse_boolop(Parser *p, OpKind op) {
  Node *left = op == OP_OR ? parse_boolop(p, OP_AND) : parse_not_test(p);
  const char *word = op == OP_OR ? "or" : "and";
  int links = 0;
  while (left && is_kw(peek(p), word)) {
    if (chain_link(p, &links) < 0) return NULL;
    Node *n = new_node(p, N_BOOLOP, advance(p));
    Node *right = !n ? NULL
                  : op == OP_OR ? parse_boolop(p, OP_AND)
                                : parse_not_test(p);
    if (!right) return NULL;
    n->op = op;
    n->a = left;
    n->b = right;
    n->loc2 = node_start(left);
    left = n;
  }
  p->depth -= links;
  return left;
}

static Node *parse_or_test(Parser *p) { return parse_boolop(p, OP_OR); }

/* ---- parameters, lambda, test ------------------------------------------------------ */

/* The checks on a new parameter [q] against the earlier ones of [fn]. */
static int check_param(Parser *p, const Node *fn, const Param *q,
                       const Token *t) {
  bool seen_default = false, seen_star = false;
  for (int i = 0; i < fn->nparams; i++) {
    const Param *o = &fn->params[i];
    const char *msg = NULL;
    if (o->name && o->name == q->name) {
      syntax_error(p, t, "duplicate argument '%s' in function definition",
                   q->name);
      return -1;
    }
    if (o->starstar) msg = "arguments cannot follow var-keyword argument";
    else if (o->star && q->star) msg = "* argument may appear only once";
    if (msg) {
      syntax_error(p, t, "%s", msg);
      return -1;
    }
    seen_default |= o->deflt != NULL;
    seen_star |= o->star;
  }
  if (seen_default && !seen_star && !q->deflt && !q->star && !q->starstar) {
    syntax_error(p, t, "parameter without a default follows parameter with "
                       "a default");
    return -1;
  }
  return 0;
}

/* param -> NAME [':' test] ['=' test] | '*' [NAME [':' test]] |
 *          '**' NAME [':' test]   (annotations only if [annotated]); a
 * bare '*' (name NULL) makes the parameters after it keyword-only */
static int parse_param(Parser *p, Node *fn, bool annotated) {
  Param q = {0};
  q.star = accept_op(p, "*");
  q.starstar = !q.star && accept_op(p, "**");
  const Token *t = peek(p);
  q.loc = tok_loc(p, t);
  bool bare = q.star && t->kind != T_NAME;
  if (!bare && !(q.name = expect_name(p))) return -1;
  if (!bare && annotated && accept_op(p, ":") && !(q.annotation = parse_test(p)))
    return -1;
  if (!q.star && !q.starstar && accept_op(p, "=") &&
      !(q.deflt = parse_test(p)))
    return -1;
  if (check_param(p, fn, &q, t) < 0) return -1;
  Param *ps = grow(p, fn->params, fn->nparams, sizeof *ps);
  if (!ps) return -1;
  fn->params = ps;
  fn->params[fn->nparams++] = q;
  return 0;
}

/* params -> [param {',' param} [',']], up to (not including) [end] */
static int parse_params(Parser *p, Node *fn, const char *end,
                        bool annotated) {
  while (!is_op(peek(p), end)) {
    if (parse_param(p, fn, annotated) < 0) return -1;
    if (!accept_op(p, ",")) break;
  }
  const Param *last = fn->nparams ? &fn->params[fn->nparams - 1] : NULL;
  if (last && last->star && !last->name)   /* Python's words */
    return syntax_error(p, peek(p), "named arguments must follow bare *"), -1;
  return 0;
}

/* lambdef -> 'lambda' [params] ':' test */
static Node *parse_lambda(Parser *p) {
  Node *n = new_node(p, N_LAMBDA, advance(p));
  if (!n || parse_params(p, n, ":", false) < 0) return NULL;
  if (!expect_op(p, ":")) return NULL;
  return (n->a = parse_test(p)) ? n : NULL;
}

/* test -> or_test ['if' or_test 'else' test] | lambdef */
static Node *parse_test_inner(Parser *p) {
  if (is_kw(peek(p), "lambda")) return parse_lambda(p);
  Node *body = parse_or_test(p);
  if (!body || !is_kw(peek(p), "if")) return body;
  Node *n = new_node(p, N_IFEXP, advance(p));
  if (!n || !(n->a = parse_or_test(p))) return NULL;
  if (!accept_kw(p, "else"))
    return syntax_error(p, peek(p), "expected 'else' after 'if' expression");
  if (!(n->c = parse_test(p))) return NULL;
  n->b = body;
  n->loc = n->loc2 = node_start(body);
  return n;
}

static Node *parse_test(Parser *p) {
  if (enter(p) < 0) return NULL;
  Node *n = parse_test_inner(p);
  leave(p);
  return n;
}

/* testlist_star_expr -> (test|star_expr) {',' (test|star_expr)} [','] */
static Node *parse_testlist_star(Parser *p) {
  Node *first = parse_item(p, false);
  return first ? parse_tuple_rest(p, first, false) : NULL;
}

/* ---- assignment targets -------------------------------------------------------- */

/* What a non-target expression is called in "cannot assign to ...". */
static const char *target_noun(const Node *n) {
  switch (n->kind) {
  case N_CALL: return "function call";
  case N_CONST:
    if (n->value == VAL_NONE) return "None";
    if (n->value == val_true()) return "True";
    if (n->value == val_false()) return "False";
    if (n->value == VAL_ELLIPSIS) return "ellipsis";
    return "literal";
  case N_COMPARE: return "comparison";
  case N_IFEXP: return "conditional expression";
  case N_LAMBDA: return "lambda";
  case N_LISTCOMP: return n->b ? "dict comprehension" : n->is_set ? "set comprehension" : "list comprehension";
  case N_SET: return "set display";
  case N_DICT: return "dict literal";
  case N_TUPLE: return "tuple";
  case N_LIST: return "list";
  case N_STARRED: return "starred";
  default: return "expression";
  }
}

/* Sets the syntax error at the start of [n]; returns -1. */
static int target_error(const Node *n, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int target_error(const Node *n, const char *fmt, ...) {
  char msg[160];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  err_set_at(node_start(n), ERR_SYNTAX, "%s", msg);
  return -1;
}

/* Checks that [n] may be assigned to (Python's rules; [in_seq] when [n] is
 * an element of a tuple or list target). */
static int check_target(Parser *p, Node *n, bool in_seq) {
  switch (n->kind) {
  case N_NAME:
  case N_ATTR:
  case N_SUBSCRIPT: return 0;
  case N_STARRED:
    if (!in_seq)
      return target_error(n, "starred assignment target must be in a list "
                             "or tuple");
    return check_target(p, n->a, false);
  case N_TUPLE:
  case N_LIST: {
    int stars = 0;
    for (int i = 0; i < n->items.n; i++) {
      stars += n->items.items[i]->kind == N_STARRED;
      if (stars > 1)
        return target_error(n->items.items[i],
                            "multiple starred expressions in assignment");
      if (check_target(p, n->items.items[i], true) < 0) return -1;
    }
    return 0;
  }
  default: return target_error(n, "cannot assign to %s", target_noun(n));
  }
}

static int check_aug_target(Parser *p, Node *n) {
  if (n->kind == N_NAME || n->kind == N_ATTR || n->kind == N_SUBSCRIPT)
    return 0;
  return target_error(n, "'%s' is an illegal expression for augmented "
                         "assignment", target_noun(n));
}

/* ---- simple statements ------------------------------------------------------------ */

static OpKind aug_op(const Token *t, bool *found) {
  static const struct { const char *sym; OpKind op; } ops[] = {
      {"+=", OP_ADD},     {"-=", OP_SUB},    {"*=", OP_MUL},
      {"/=", OP_DIV},     {"//=", OP_FLOORDIV}, {"%=", OP_MOD},
      {"**=", OP_POW},    {"@=", OP_MATMUL}, {"<<=", OP_LSHIFT},
      {">>=", OP_RSHIFT}, {"&=", OP_BITAND}, {"|=", OP_BITOR},
      {"^=", OP_BITXOR}};
  *found = true;
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
    if (is_op(t, ops[i].sym)) return ops[i].op;
  *found = false;
  return OP_ADD;
}

/* expr_stmt -> testlist_star_expr augassign testlist, after the target */
static Node *parse_augassign(Parser *p, const Token *first, Node *target,
                             OpKind op) {
  if (check_aug_target(p, target) < 0) return NULL;
  advance(p);
  Node *n = new_node(p, N_AUGASSIGN, first);
  if (!n || !(n->b = parse_testlist_star(p))) return NULL;
  n->op = op;
  n->a = target;
  return n;
}

/* expr_stmt -> testlist_star_expr {'=' testlist_star_expr}, after the
 * first one, [lhs], when an '=' follows */
static Node *parse_assign(Parser *p, const Token *first, Node *lhs) {
  Node *n = new_node(p, N_ASSIGN, first);
  if (!n) return NULL;
  Node *value = lhs;
  while (accept_op(p, "=")) {
    if (check_target(p, value, false) < 0 || push(p, &n->items, value) < 0)
      return NULL;
    if (!(value = parse_testlist_star(p))) return NULL;
  }
  n->a = value;
  return n;
}

/* annassign -> target ':' test ['=' testlist_star_expr], after the
 * target [target] (a name, attribute or subscript, as Python allows) */
static Node *parse_annassign(Parser *p, const Token *first, Node *target) {
  if (target->kind != N_NAME && target->kind != N_ATTR && target->kind != N_SUBSCRIPT)
    return syntax_error(p, first, "only single target (not %s) can be annotated",
                        target->kind == N_TUPLE ? "tuple" : "this expression");
  advance(p);   /* ':' */
  Node *n = new_node(p, N_ANNASSIGN, first);
  if (!n || !(n->b = parse_test(p))) return NULL;
  n->a = target;
  if (accept_op(p, "=") && !(n->c = parse_testlist_star(p))) return NULL;
  return n;
}

/* expr_stmt -> testlist_star_expr (augassign testlist |
 *                                  {'=' testlist_star_expr}) */
static Node *parse_expr_stmt(Parser *p) {
  const Token *first = peek(p);
  Node *e = parse_testlist_star(p);
  if (!e) return NULL;
  bool aug;
  OpKind op = aug_op(peek(p), &aug);
  if (aug) return parse_augassign(p, first, e, op);
  if (is_op(peek(p), "=")) return parse_assign(p, first, e);
  if (is_op(peek(p), ":")) return parse_annassign(p, first, e);
  if (e->kind == N_STARRED)
    return syntax_error(p, first, "can't use starred expression here");
  Node *n = new_node(p, N_EXPR_STMT, first);
  if (n) n->a = e;
  return n;
}

/* return_stmt -> 'return' [testlist_star_expr] */
static Node *parse_return(Parser *p) {
  const Token *t = advance(p);
  if (p->func_depth == 0)
    return syntax_error(p, t, "'return' outside function");
  Node *n = new_node(p, N_RETURN, t);
  if (n && starts_expr(peek(p)) && !(n->a = parse_testlist_star(p)))
    return NULL;
  return n;
}

/* del_stmt -> 'del' target {',' target} [','], each a name or a subscript */
static Node *parse_del(Parser *p) {
  const Token *t = advance(p);
  Node *n = new_node(p, N_DEL, t);
  if (!n) return NULL;
  do {
    if (!starts_expr(peek(p))) break;
    const Token *at = peek(p);
    Node *e = parse_or_test(p);
    if (!e) return NULL;
    if (e->kind != N_NAME && e->kind != N_SUBSCRIPT)
      return syntax_error(p, at, "cannot delete %s", e->kind == N_ATTR ? "an attribute" : "expression");
    if (push(p, &n->items, e) < 0) return NULL;
  } while (accept_op(p, ","));
  if (n->items.n == 0) return syntax_error(p, peek(p), "invalid syntax");
  return n;
}

/* raise_stmt -> 'raise' [test] */
static Node *parse_raise(Parser *p) {
  const Token *t = advance(p);
  Node *n = new_node(p, N_RAISE, t);
  if (n && starts_expr(peek(p)) && !(n->a = parse_test(p))) return NULL;
  return n;
}

/* pass_stmt -> 'pass'; break_stmt -> 'break'; continue_stmt -> 'continue' */
static Node *parse_keyword_stmt(Parser *p, NodeKind kind) {
  const Token *t = advance(p);
  if (kind == N_BREAK && p->loop_depth == 0)
    return syntax_error(p, t, "'break' outside loop");
  if (kind == N_CONTINUE && p->loop_depth == 0)
    return syntax_error(p, t, "'continue' not properly in loop");
  return new_node(p, kind, t);
}

/* assert_stmt -> 'assert' test [',' test] */
static Node *parse_assert(Parser *p) {
  Node *n = new_node(p, N_ASSERT, advance(p));
  if (!n || !(n->a = parse_test(p))) return NULL;
  if (accept_op(p, ",") && !(n->b = parse_test(p))) return NULL;
  return n;
}

/* Appends [name] (and [alias]) to the name lists of [n]. */
static int add_name(Parser *p, Node *n, const char *name, const char *alias) {
  const char **names = grow(p, n->names, n->nnames, sizeof *names);
  const char **aliases = grow(p, n->aliases, n->nnames, sizeof *aliases);
  if (!names || !aliases) return -1;
  n->names = names;
  n->aliases = aliases;
  n->names[n->nnames] = name;
  n->aliases[n->nnames++] = alias;
  return 0;
}

/* global_stmt -> 'global' NAME {',' NAME};
 * nonlocal_stmt -> 'nonlocal' NAME {',' NAME} */
static Node *parse_names_stmt(Parser *p, NodeKind kind) {
  const Token *t = advance(p);
  if (kind == N_NONLOCAL && p->func_depth == 0)
    return syntax_error(p, t, "nonlocal declaration not allowed at module "
                              "level");
  Node *n = new_node(p, kind, t);
  if (!n) return NULL;
  do {
    const char *name = expect_name(p);
    if (!name || add_name(p, n, name, NULL) < 0) return NULL;
  } while (accept_op(p, ","));
  return n;
}

/* dotted_name -> NAME {'.' NAME}, interned whole ("a.b") */
static const char *parse_dotted_name(Parser *p) {
  int from = p->pos;
  size_t len = 0;
  do {
    len += (size_t)peek(p)->len + 1;
    if (!expect_name(p)) return NULL;
  } while (accept_op(p, "."));
  char *buf = shm_malloc(len);
  if (!buf) return err_nomem();
  size_t at = 0;
  for (int i = from; i < p->pos; i += 2) {  /* NAME '.' NAME ... */
    const Token *t = lex_token(p->lx, i);
    memcpy(buf + at, t->start, (size_t)t->len);
    at += (size_t)t->len;
    buf[at++] = '.';
  }
  const char *s = intern(buf, at - 1);
  shm_free(buf);
  return s ? s : err_nomem();
}

/* ['as' NAME] */
static int parse_as(Parser *p, const char **alias) {
  *alias = NULL;
  if (!accept_kw(p, "as")) return 0;
  return (*alias = expect_name(p)) ? 0 : -1;
}

/* import_name -> 'import' dotted_name ['as' NAME] {',' dotted_name
 *                ['as' NAME]}: one N_IMPORT per module, into [out] */
static int parse_import(Parser *p, NodeList *out) {
  const Token *t = advance(p);
  do {
    Node *n = new_node(p, N_IMPORT, t);
    if (!n || !(n->name = parse_dotted_name(p))) return -1;
    if (parse_as(p, &n->alias) < 0 || push(p, out, n) < 0) return -1;
  } while (accept_op(p, ","));
  return 0;
}

/* import_from -> 'from' dotted_name 'import' ('*' | '(' import_as_names
 *                [','] ')' | import_as_names);
 * import_as_names -> NAME ['as' NAME] {',' NAME ['as' NAME]} */
static Node *parse_from(Parser *p) {
  Node *n = new_node(p, N_FROM_IMPORT, advance(p));
  if (!n || !(n->name = parse_dotted_name(p))) return NULL;
  if (!accept_kw(p, "import"))
    return syntax_error(p, peek(p), "expected 'import'");
  if (accept_op(p, "*"))
    return add_name(p, n, intern_cstr("*"), NULL) < 0 ? NULL : n;
  const Token *open = is_op(peek(p), "(") ? advance(p) : NULL;
  do {
    if (open && is_op(peek(p), ")")) break;
    const char *name = expect_name(p), *alias;
    if (!name || parse_as(p, &alias) < 0 || add_name(p, n, name, alias) < 0)
      return NULL;
  } while (accept_op(p, ","));
  if (open && !expect_close(p, open, ")")) return NULL;
  return n;
}

/* axis -> NAME '=' test, into the names and items of [n] */
static int parse_mesh_axis(Parser *p, Node *n) {
  const Token *t = peek(p);
  if (t->kind != T_NAME || !is_op(peek_at(p, 1), "=")) {
    syntax_error(p, t, "expected a mesh axis as NAME=SIZE");
    return -1;
  }
  const char *name = tok_name(p, t);
  if (!name) return -1;
  for (int i = 0; i < n->nnames; i++)
    if (n->names[i] == name) {
      syntax_error(p, t, "duplicate mesh axis name '%s'", name);
      return -1;
    }
  p->pos += 2;
  Node *size = parse_test(p);
  if (!size || add_name(p, n, name, NULL) < 0) return -1;
  return push(p, &n->items, size);
}

/* mesh_stmt -> 'mesh' NAME '(' [axis {',' axis} [',']] ')' ['devices' test] */
static Node *parse_mesh(Parser *p) {
  Node *n = new_node(p, N_MESH, advance(p));
  if (!n || !(n->name = expect_name(p))) return NULL;
  const Token *open = advance(p); /* '(' , checked by the caller */
  while (!is_op(peek(p), ")")) {
    if (parse_mesh_axis(p, n) < 0) return NULL;
    if (!accept_op(p, ",")) break;
  }
  if (!expect_close(p, open, ")")) return NULL;
  if (is_word(peek(p), "devices")) {
    advance(p);
    if (!(n->a = parse_test(p))) return NULL;
  }
  return n;
}

/* True at `WORD NAME (`: the start of a mesh or shard_map statement. */
static bool at_word_stmt(const Parser *p, int k, const char *word) {
  return is_word(peek_at(p, k), word) && peek_at(p, k + 1)->kind == T_NAME &&
         is_op(peek_at(p, k + 2), "(");
}

/* small_stmt -> expr_stmt | pass_stmt | break_stmt | continue_stmt |
 *   return_stmt | assert_stmt | import_name | import_from | global_stmt |
 *   nonlocal_stmt | mesh_stmt   (appended to [out]) */
static int parse_small_stmt(Parser *p, NodeList *out) {
  const Token *t = peek(p);
  Node *n;
  if (is_kw(t, "import")) return parse_import(p, out);
  if (is_kw(t, "pass")) n = parse_keyword_stmt(p, N_PASS);
  else if (is_kw(t, "break")) n = parse_keyword_stmt(p, N_BREAK);
  else if (is_kw(t, "continue")) n = parse_keyword_stmt(p, N_CONTINUE);
  else if (is_kw(t, "return")) n = parse_return(p);
  else if (is_kw(t, "assert")) n = parse_assert(p);
  else if (is_kw(t, "from")) n = parse_from(p);
  else if (is_kw(t, "global")) n = parse_names_stmt(p, N_GLOBAL);
  else if (is_kw(t, "nonlocal")) n = parse_names_stmt(p, N_NONLOCAL);
  else if (is_word(t, "del") && peek_at(p, 1)->kind == T_NAME) n = parse_del(p);
  else if (is_word(t, "raise") && (peek_at(p, 1)->kind == T_NAME || peek_at(p, 1)->kind == T_NEWLINE))
    n = parse_raise(p);
  else if (at_word_stmt(p, 0, "mesh")) n = parse_mesh(p);
  else n = parse_expr_stmt(p);
  return n ? push(p, out, n) : -1;
}

/* simple_stmts -> small_stmt {';' small_stmt} [';'] NEWLINE */
static int parse_simple_stmts(Parser *p, NodeList *out) {
  do {
    if (peek(p)->kind == T_NEWLINE) break;
    if (parse_small_stmt(p, out) < 0) return -1;
  } while (accept_op(p, ";"));
  if (peek(p)->kind != T_NEWLINE) {
    invalid_syntax(p, peek(p));
    return -1;
  }
  advance(p);
  return 0;
}

/* ---- compound statements ------------------------------------------------------------ */

/* block -> simple_stmts | NEWLINE INDENT stmt {stmt} DEDENT
 * [what] and [line] name the statement that opened it, for the error
 * "expected an indented block after 'if' statement on line 4". */
static int parse_block(Parser *p, NodeList *body, const char *what,
                       int line) {
  if (peek(p)->kind != T_NEWLINE) return parse_simple_stmts(p, body);
  advance(p);
  if (peek(p)->kind != T_INDENT) {
    syntax_error(p, peek(p), "expected an indented block after %s on line %d",
                 what, line);
    return -1;
  }
  if (enter(p) < 0) return -1;
  advance(p);
  int rc = 0;
  while (rc == 0 && peek(p)->kind != T_DEDENT && peek(p)->kind != T_EOF)
    rc = parse_statement(p, body);
  if (rc == 0) advance(p); /* DEDENT */
  leave(p);
  return rc;
}

/* ':' block, after the header of the statement started by [t] */
static int parse_suite(Parser *p, NodeList *body, const char *what,
                       const Token *t) {
  if (is_op(peek(p), "="))   /* `if x = 3:`, as Python 3.12 answers it */
    return syntax_error(p, peek(p), "invalid syntax. Maybe you meant '==' or ':=' instead of "
                                    "'='?"), -1;
  if (!expect_op(p, ":")) return -1;
  return parse_block(p, body, what, t->line);
}

/* ['else' ':' block] into [n]->orelse */
static int parse_else(Parser *p, Node *n) {
  if (!is_kw(peek(p), "else")) return 0;
  return parse_suite(p, &n->orelse, "'else' statement", advance(p));
}

/* if_stmt -> 'if' test ':' block {'elif' test ':' block}
 *            ['else' ':' block]   (each elif nests in the orelse before) */
static Node *parse_if(Parser *p) {
  Node *top = NULL, *cur = NULL;
  int links = 0;
  do {
    if (chain_link(p, &links) < 0) return NULL;
    const Token *t = advance(p);
    Node *n = new_node(p, N_IF, t);
    if (!n || !(n->a = parse_test(p))) return NULL;
    const char *what = is_kw(t, "if") ? "'if' statement" : "'elif' statement";
    if (parse_suite(p, &n->body, what, t) < 0) return NULL;
    if (cur && push(p, &cur->orelse, n) < 0) return NULL;
    if (!top) top = n;
    cur = n;
  } while (is_kw(peek(p), "elif"));
  int rc = parse_else(p, cur);
  p->depth -= links;
  return rc < 0 ? NULL : top;
}

/* The body of a loop: loop_depth is raised while it is parsed. */
static int parse_loop_body(Parser *p, Node *n, const char *what,
                           const Token *t) {
  p->loop_depth++;
  int rc = parse_suite(p, &n->body, what, t);
  p->loop_depth--;
  return rc < 0 ? -1 : parse_else(p, n);
}

/* while_stmt -> 'while' test ':' block ['else' ':' block] */
static Node *parse_while(Parser *p) {
  const Token *t = advance(p);
  Node *n = new_node(p, N_WHILE, t);
  if (!n || !(n->a = parse_test(p))) return NULL;
  return parse_loop_body(p, n, "'while' statement", t) < 0 ? NULL : n;
}

/* for_stmt -> 'for' exprlist 'in' testlist ':' block ['else' ':' block] */
static Node *parse_for(Parser *p) {
  const Token *t = advance(p);
  Node *n = new_node(p, N_FOR, t);
  if (!n || !(n->a = parse_exprlist(p))) return NULL;
  if (check_target(p, n->a, false) < 0) return NULL;
  if (!accept_kw(p, "in")) return syntax_error(p, peek(p), "expected 'in'");
  if (!(n->b = parse_testlist_star(p))) return NULL;
  return parse_loop_body(p, n, "'for' statement", t) < 0 ? NULL : n;
}

/* A function body: return allowed, loops of the enclosing code not. */
static int parse_func_body(Parser *p, Node *n, const char *what,
                           const Token *t) {
  int saved_loops = p->loop_depth;
  p->loop_depth = 0;
  p->func_depth++;
  int rc = parse_suite(p, &n->body, what, t);
  p->func_depth--;
  p->loop_depth = saved_loops;
  return rc;
}

/* '(' params ')' after the name of a def or shard_map */
static int parse_param_list(Parser *p, Node *n) {
  const Token *open = expect_op(p, "(");
  if (!open || parse_params(p, n, ")", true) < 0) return -1;
  return expect_close(p, open, ")") ? 0 : -1;
}

/* funcdef -> ['jit'] 'def' NAME '(' params ')' ['->' test] ':' block;
 * [first] is the statement's first token */
static Node *parse_def(Parser *p, const Token *first) {
  Node *n = new_node(p, N_DEF, first);
  if (!n) return NULL;
  n->is_jit = is_word(peek(p), "jit");
  if (n->is_jit) advance(p);
  const Token *t = advance(p); /* 'def' */
  if (!(n->name = expect_name(p)) || parse_param_list(p, n) < 0) return NULL;
  if (accept_op(p, "->") && !(n->a = parse_test(p))) return NULL;
  return parse_func_body(p, n, "function definition", t) < 0 ? NULL : n;
}

/* Every shard_map parameter is an array with its in_spec. */
static int check_shard_params(Parser *p, const Node *n) {
  for (int i = 0; i < n->nparams; i++) {
    const Param *q = &n->params[i];
    const char *msg = NULL;
    if (q->star || q->starstar)
      msg = "shard_map parameters cannot be *args or **kwargs";
    else if (!q->annotation)
      msg = "shard_map parameter needs its in_spec, as in x: P('i')";
    if (msg) {
      err_set_at(q->loc, ERR_SYNTAX, "%s", msg);
      return -1;
    }
  }
  return 0;
}

/* [',' NAME '=' test {',' NAME '=' test}] after the mesh of a shard_map */
static int parse_shard_options(Parser *p, Node *n) {
  while (accept_op(p, ",")) {
    const Token *t = peek(p);
    if (t->kind != T_NAME || !is_op(peek_at(p, 1), "=")) {
      syntax_error(p, t, "expected an option as NAME=VALUE");
      return -1;
    }
    if (parse_keyword_arg(p, n) < 0) return -1;
  }
  return 0;
}

/* shardmap_stmt -> ['jit'] 'shard_map' NAME '(' params ')' '->' test
 *                  'on' test {',' NAME '=' test} ':' block */
static Node *parse_shard_map(Parser *p, const Token *first) {
  Node *n = new_node(p, N_SHARD_MAP, first);
  if (!n) return NULL;
  n->is_jit = is_word(peek(p), "jit");
  if (n->is_jit) advance(p);
  const Token *t = advance(p); /* 'shard_map' */
  if (!(n->name = expect_name(p)) || parse_param_list(p, n) < 0) return NULL;
  if (check_shard_params(p, n) < 0) return NULL;
  if (!accept_op(p, "->"))
    return syntax_error(p, peek(p), "expected '->' and the out_specs");
  if (!(n->a = parse_test(p))) return NULL;
  if (!is_word(peek(p), "on"))
    return syntax_error(p, peek(p), "expected 'on' and a mesh");
  advance(p);
  if (!(n->b = parse_test(p)) || parse_shard_options(p, n) < 0) return NULL;
  return parse_func_body(p, n, "'shard_map' statement", t) < 0 ? NULL : n;
}

/* True at `jit def` or `jit shard_map NAME (`. */
static bool at_jit_stmt(const Parser *p) {
  return is_word(peek(p), "jit") &&
         (is_kw(peek_at(p, 1), "def") || at_word_stmt(p, 1, "shard_map"));
}

/* A def or shard_map statement (with or without jit) at the cursor. */
static Node *parse_function_stmt(Parser *p, const Token *first) {
  bool jit = is_word(peek(p), "jit");
  if (is_kw(peek_at(p, jit ? 1 : 0), "def")) return parse_def(p, first);
  return parse_shard_map(p, first);
}

/* True at `class NAME`. */
static bool at_class_stmt(const Parser *p) {
  return is_word(peek(p), "class") && peek_at(p, 1)->kind == T_NAME;
}

/* classdef -> 'class' NAME ['(' [test {',' test} [',']] ')'] ':' block;
 * the body is not a function's: `return` there is outside one. */
static Node *parse_class(Parser *p, const Token *first) {
  Node *n = new_node(p, N_CLASS, first);
  if (!n) return NULL;
  const Token *t = advance(p);   /* 'class' */
  if (!(n->name = expect_name(p))) return NULL;
  const Token *open = peek(p);
  if (accept_op(p, "(")) {
    while (!is_op(peek(p), ")")) {
      Node *b = parse_test(p);
      if (!b || push(p, &n->items, b) < 0) return NULL;
      if (!accept_op(p, ",")) break;
    }
    if (!expect_close(p, open, ")")) return NULL;
  }
  int saved_loops = p->loop_depth, saved_funcs = p->func_depth;
  p->loop_depth = p->func_depth = 0;
  int rc = parse_suite(p, &n->body, "class definition", t);
  p->loop_depth = saved_loops;
  p->func_depth = saved_funcs;
  return rc < 0 ? NULL : n;
}

/* decorated -> decorator {decorator} (funcdef | shardmap_stmt | classdef);
 * decorator -> '@' test NEWLINE */
static Node *parse_decorated(Parser *p) {
  const Token *first = peek(p);
  NodeList decos = {0};
  while (accept_op(p, "@")) {
    Node *d = parse_test(p);
    if (!d || push(p, &decos, d) < 0) return NULL;
    if (peek(p)->kind != T_NEWLINE) return invalid_syntax(p, peek(p));
    advance(p);
  }
  if (!is_kw(peek(p), "def") && !at_jit_stmt(p) &&
      !at_word_stmt(p, 0, "shard_map") && !at_class_stmt(p))
    return syntax_error(p, peek(p), "expected a def, class or shard_map after a "
                                    "decorator");
  Node *n = at_class_stmt(p) ? parse_class(p, first) : parse_function_stmt(p, first);
  if (n) n->decorators = decos;
  return n;
}

/* try_stmt -> 'try' ':' block ('except' [test ['as' NAME]] ':' block)+
 *             ['else' ':' block] ['finally' ':' block]
 *           | 'try' ':' block 'finally' ':' block */
static Node *parse_try(Parser *p) {
  const Token *t = advance(p);
  Node *n = new_node(p, N_TRY, t);
  if (!n || parse_suite(p, &n->body, "'try' statement", t) < 0) return NULL;
  while (is_word(peek(p), "except")) {
    const Token *e = advance(p);
    Node *h = new_node(p, N_EXCEPT, e);
    if (!h) return NULL;
    if (!is_op(peek(p), ":")) {
      if (!(h->a = parse_test(p)) || parse_as(p, &h->name) < 0) return NULL;
    }
    if (parse_suite(p, &h->body, "'except' statement", e) < 0 || push(p, &n->items, h) < 0)
      return NULL;
  }
  if (n->items.n && parse_else(p, n) < 0) return NULL;
  if (is_word(peek(p), "finally")) {
    const Token *f = advance(p);
    if (parse_suite(p, &n->items2, "'finally' statement", f) < 0) return NULL;
  } else if (!n->items.n) {
    return syntax_error(p, peek(p), "expected 'except' or 'finally' block");
  }
  return n;
}

/* with_stmt -> 'with' test ['as' NAME] {',' test ['as' NAME]} ':' block:
 * several items nest, as Python runs them. */
static Node *parse_with_items(Parser *p, const Token *t);

/* Whether the logical line from here ends with ':' at bracket depth 0:
 * `with (a, b):` is a statement, `with(x)` a call of a function named with. */
static bool with_has_colon(Parser *p) {
  int depth = 0;
  for (int i = 1;; i++) {
    const Token *u = peek_at(p, i);
    if (u->kind == T_NEWLINE || u->kind == T_EOF) return false;
    if (is_op(u, "(") || is_op(u, "[") || is_op(u, "{")) depth++;
    else if (is_op(u, ")") || is_op(u, "]") || is_op(u, "}")) depth--;
    else if (depth == 0 && is_op(u, ":")) return true;
  }
}

static Node *parse_with(Parser *p) {
  const Token *t = advance(p);
  return parse_with_items(p, t);
}

/* A with statement's items from here, each an N_WITH, the later ones in
 * the body of the earlier ([t]: the 'with', for messages). */
static Node *parse_with_items(Parser *p, const Token *t) {
  Node *n = new_node(p, N_WITH, peek(p));
  if (!n || !(n->a = parse_test(p)) || parse_as(p, &n->name) < 0) return NULL;
  if (accept_op(p, ",")) {
    Node *inner = parse_with_items(p, t);
    if (!inner || push(p, &n->body, inner) < 0) return NULL;
    return n;
  }
  return parse_suite(p, &n->body, "'with' statement", t) < 0 ? NULL : n;
}

/* compound_stmt -> if_stmt | while_stmt | for_stmt | funcdef |
 *                  shardmap_stmt | classdef | decorated; NULL with no error set when
 * the statement is not a compound one. */
static Node *parse_compound(Parser *p, bool *is_compound) {
  const Token *t = peek(p);
  *is_compound = true;
  if (is_kw(t, "if")) return parse_if(p);
  if (is_kw(t, "while")) return parse_while(p);
  if (is_kw(t, "for")) return parse_for(p);
  if (is_word(t, "try") && is_op(peek_at(p, 1), ":")) return parse_try(p);
  if (is_word(t, "with") && starts_expr(peek_at(p, 1)) && !is_op(peek_at(p, 1), "(") &&
      !is_op(peek_at(p, 1), "["))
    return parse_with(p);
  if (is_word(t, "with") && (is_op(peek_at(p, 1), "(") || is_op(peek_at(p, 1), "[")) &&
      with_has_colon(p))
    return parse_with(p);
  if (is_op(t, "@")) return parse_decorated(p);
  if (is_kw(t, "def") || at_jit_stmt(p) || at_word_stmt(p, 0, "shard_map"))
    return parse_function_stmt(p, t);
  if (at_class_stmt(p)) return parse_class(p, t);
  *is_compound = false;
  return NULL;
}

/* Python statements the language does not have: when a statement that
 * starts with one of these words fails to parse, the error says so. */
static void explain_unsupported(Parser *p, const Token *t) {
  static const char *const words[] = {"except", "finally", "yield",
                                      "async", "await", "match", NULL};
  if (t->kind != T_NAME || strcmp(err_message(), "invalid syntax")) return;
  for (int i = 0; words[i]; i++)
    if (is_word(t, words[i])) {
      syntax_error(p, t, "'%s' is not supported in shmap", words[i]);
      return;
    }
}

/* stmt -> compound_stmt | simple_stmts   (appended to [out]) */
static int parse_statement(Parser *p, NodeList *out) {
  const Token *t = peek(p);
  if (t->kind == T_INDENT || t->kind == T_DEDENT ||
      is_kw(t, "elif") || is_kw(t, "else")) {
    invalid_syntax(p, t);
    return -1;
  }
  bool compound;
  Node *n = parse_compound(p, &compound);
  if (compound) return n ? push(p, out, n) : -1;
  int rc = parse_simple_stmts(p, out);
  if (rc < 0) explain_unsupported(p, t);
  return rc;
}

/* file_input -> {NEWLINE | stmt} ENDMARKER */
static int parse_file(Parser *p) {
  while (peek(p)->kind != T_EOF) {
    if (peek(p)->kind == T_NEWLINE) {
      advance(p);
      continue;
    }
    if (parse_statement(p, &p->m->body) < 0) return -1;
  }
  return 0;
}

AstModule *parse_source(Source *src) {
  Lexer *lx = lex_source(src);
  if (!lx) return NULL;
  AstModule *m = ast_module_new(src);
  if (!m) {
    lex_free(lx);
    return NULL;
  }
  Parser p = {.lx = lx, .m = m, .src = src};
  int rc = parse_file(&p);
  lex_free(lx);
  if (rc < 0) {
    ast_free(m);
    return NULL;
  }
  return m;
}
