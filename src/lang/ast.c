/*
 * ast.c - the syntax tree's memory (an arena per module) and its
 * S-expression dump (ast.h).
 *
 * The arena is a chain of chunks; nothing in it is freed before the whole
 * module is, which suits a tree that is built once and then only read.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array/array.h"
#include "lang/ast.h"
#include "base/mem.h"

#define CHUNK_SIZE 65536

typedef struct Chunk {
  struct Chunk *next;
  size_t used, size;
  _Alignas(16) unsigned char data[];
} Chunk;

struct Arena {
  Chunk *head;  /* the chunk being filled; older ones follow */
};

/* ---- memory ------------------------------------------------------------------ */

AstModule *ast_module_new(Source *src) {
  AstModule *m = shm_calloc(1, sizeof *m);
  if (!m) return err_nomem();
  m->arena = shm_calloc(1, sizeof *m->arena);
  m->consts = list_new(16);
  if (!m->arena || !m->consts) {
    ast_free(m);
    return err_nomem();
  }
  m->src = src;
  src_incref(src);
  return m;
}

/* Adds a chunk with room for at least [n] bytes in front of the chain. */
static Chunk *arena_grow(struct Arena *a, size_t n) {
  size_t size = n > CHUNK_SIZE ? n : CHUNK_SIZE;
  Chunk *c = shm_malloc(sizeof *c + size);
  if (!c) return NULL;
  c->next = a->head;
  c->used = 0;
  c->size = size;
  a->head = c;
  return c;
}

void *ast_alloc(AstModule *m, size_t n) {
  n = (n + 15) & ~(size_t)15;
  Chunk *c = m->arena->head;
  if (!c || c->size - c->used < n) c = arena_grow(m->arena, n);
  if (!c) return err_nomem();
  void *p = c->data + c->used;
  c->used += n;
  memset(p, 0, n);
  return p;
}

char *ast_strdup(AstModule *m, const char *s, size_t len) {
  char *d = ast_alloc(m, len + 1);
  if (!d) return NULL;
  memcpy(d, s, len);
  d[len] = '\0';
  return d;
}

/* The capacity of a list of [n] items is the next power of two (at least
 * 4), so growing needs no extra field: it happens when n reaches it. */
int nodelist_push(AstModule *m, NodeList *l, Node *n) {
  if (l->n == 0 || (l->n >= 4 && (l->n & (l->n - 1)) == 0)) {
    int cap = l->n == 0 ? 4 : l->n * 2;
    Node **items = ast_alloc(m, sizeof(Node *) * (size_t)cap);
    if (!items) return -1;
    if (l->n) memcpy(items, l->items, sizeof(Node *) * (size_t)l->n);
    l->items = items;
  }
  l->items[l->n++] = n;
  return 0;
}

Value *ast_keep_const(AstModule *m, Value *v) {
  if (list_append_steal(m->consts, v) < 0) return err_nomem();
  return v;
}

atomic_uint ast_generation;

void ast_free(AstModule *m) {
  if (!m) return;
  atomic_fetch_add_explicit(&ast_generation, 1, memory_order_relaxed);
  if (m->arena) {
    Chunk *c = m->arena->head;
    while (c) {
      Chunk *next = c->next;
      shm_free(c);
      c = next;
    }
    shm_free(m->arena);
  }
  val_decref(m->consts);
  if (m->src) src_decref(m->src);
  shm_free(m);
}

const char *op_symbol(OpKind op) {
  static const char *const names[] = {
      "+",  "-",  "*",  "/",  "//", "%",  "**", "@",  "<<",     ">>",
      "&",  "|",  "^",  "-",  "+",  "not", "~", "and", "or",    "==",
      "!=", "<",  "<=", ">",  ">=", "in", "not in", "is", "is not"};
  if ((unsigned)op >= sizeof names / sizeof names[0]) return "?";
  return names[op];
}

/* ---- dump: constants ------------------------------------------------------------- */

/* The shortest decimal form that reads back as the same float, written as
 * Python's repr writes floats: positional for exponents -4..15. */
static void dump_float(FILE *out, double x, bool is_f32) {
  char buf[64];
  if (!isfinite(x)) {
    fputs(isnan(x) ? "nan" : x > 0 ? "inf" : "-inf", out);
    return;
  }
  int prec = 1;
  for (; prec < 17; prec++) {
    snprintf(buf, sizeof buf, "%.*e", prec - 1, x);
    double back = strtod(buf, NULL);
    if (is_f32 ? (float)back == (float)x : back == x) break;
  }
  int exp = atoi(strchr(buf, 'e') + 1);
  if (exp < -4 || exp >= 16) {
    fputs(buf, out);
    return;
  }
  int decimals = prec - 1 - exp;
  if (decimals < 1) decimals = 1;
  fprintf(out, "%.*f", decimals, x);
}

static void dump_array(FILE *out, Value *v) {
  Array *a = AS_ARRAY(v);
  void *d = arr_data(a);
  switch (a->dtype) {
  case DT_BOOL: fputs(*(uint8_t *)d ? "True" : "False", out); break;
  case DT_I32: fprintf(out, "%d", (int)*(int32_t *)d); break;
  case DT_I64: fprintf(out, "%lld", (long long)*(int64_t *)d); break;
  case DT_F32: dump_float(out, *(float *)d, true); break;
  case DT_F64: dump_float(out, *(double *)d, false); break;
  default: fputs("<array>", out); break;
  }
}

/* A string constant in single quotes with C-style escapes. */
static void dump_str(FILE *out, const Value *v) {
  const Str *s = (const Str *)v;
  fputc('\'', out);
  for (size_t i = 0; i < s->len; i++) {
    unsigned char c = (unsigned char)s->s[i];
    if (c == '\\' || c == '\'') fprintf(out, "\\%c", c);
    else if (c == '\n') fputs("\\n", out);
    else if (c == '\t') fputs("\\t", out);
    else if (c < 0x20 || c == 0x7F) fprintf(out, "\\x%02x", c);
    else fputc(c, out);
  }
  fputc('\'', out);
}

static void dump_const(FILE *out, Value *v) {
  if (v->type == V_NONE) fputs("None", out);
  else if (v->type == V_ELLIPSIS) fputs("...", out);
  else if (v->type == V_STR) dump_str(out, v);
  else if (v->type == V_ARRAY) dump_array(out, v);
  else fputs("<const>", out);
}

/* ---- dump: expressions ------------------------------------------------------------ */

static void dump(FILE *out, const Node *n, int indent);

static void dump_opt(FILE *out, const Node *n) {
  if (n) dump(out, n, -1);
  else fputc('_', out);
}

/* Each item of [l], each preceded by a space. */
static void dump_list(FILE *out, const NodeList *l) {
  for (int i = 0; i < l->n; i++) {
    fputc(' ', out);
    dump(out, l->items[i], -1);
  }
}

static void dump_param(FILE *out, const Param *p) {
  const char *star = p->star ? "*" : p->starstar ? "**" : "";
  if (!p->name) {   /* a bare '*' */
    fputs("*", out);
    return;
  }
  if (!p->annotation && !p->deflt) {
    fprintf(out, "%s%s", star, p->name);
    return;
  }
  fprintf(out, "(%s%s", star, p->name);
  if (p->annotation) {
    fputs(" : ", out);
    dump(out, p->annotation, -1);
  }
  if (p->deflt) {
    fputs(" = ", out);
    dump(out, p->deflt, -1);
  }
  fputc(')', out);
}

static void dump_params(FILE *out, const Node *n) {
  fputs("(params", out);
  for (int i = 0; i < n->nparams; i++) {
    fputc(' ', out);
    dump_param(out, &n->params[i]);
  }
  fputc(')', out);
}

static void dump_keywords(FILE *out, const Node *n) {
  for (int i = 0; i < n->nkw; i++) {
    if (n->kws[i].name) fprintf(out, " (kw %s ", n->kws[i].name);
    else fputs(" (** ", out);
    dump(out, n->kws[i].value, -1);
    fputc(')', out);
  }
}

static void dump_compare(FILE *out, const Node *n) {
  fputs("(compare ", out);
  dump(out, n->items.items[0], -1);
  for (int i = 1; i < n->items.n; i++) {
    fprintf(out, " %s ", op_symbol(n->ops[i - 1]));
    dump(out, n->items.items[i], -1);
  }
  fputc(')', out);
}

static void dump_dict(FILE *out, const Node *n) {
  fputs("(dict", out);
  for (int i = 0; i < n->items.n; i++) {
    fputs(" (", out);
    dump(out, n->items.items[i], -1);
    fputc(' ', out);
    dump(out, n->items2.items[i], -1);
    fputc(')', out);
  }
  fputc(')', out);
}

static void dump_listcomp(FILE *out, const Node *n) {
  fputs(n->b ? "(dictcomp " : n->is_set ? "(setcomp " : "(listcomp ", out);
  dump(out, n->a, -1);
  if (n->b) {
    fputc(' ', out);
    dump(out, n->b, -1);
  }
  for (int i = 0; i < n->nclauses; i++) {
    const CompClause *c = &n->clauses[i];
    fputs(" (for ", out);
    dump(out, c->target, -1);
    fputc(' ', out);
    dump(out, c->iter, -1);
    for (int j = 0; j < c->conds.n; j++) {
      fputs(" (if ", out);
      dump(out, c->conds.items[j], -1);
      fputc(')', out);
    }
    fputc(')', out);
  }
  fputc(')', out);
}

/* "(head a b c)" for the non-NULL ones of up to three operands. */
static void dump_form(FILE *out, const char *head, const Node *a,
                      const Node *b, const Node *c) {
  fprintf(out, "(%s", head);
  const Node *ops[3] = {a, b, c};
  for (int i = 0; i < 3; i++) {
    if (!ops[i]) continue;
    fputc(' ', out);
    dump(out, ops[i], -1);
  }
  fputc(')', out);
}

static void dump_seq(FILE *out, const char *head, const NodeList *l) {
  fprintf(out, "(%s", head);
  dump_list(out, l);
  fputc(')', out);
}

static void dump_call(FILE *out, const Node *n) {
  fputs("(call ", out);
  dump(out, n->a, -1);
  dump_list(out, &n->items);
  dump_keywords(out, n);
  fputc(')', out);
}

static void dump_slice(FILE *out, const Node *n) {
  fputs("(slice ", out);
  dump_opt(out, n->a);
  fputc(' ', out);
  dump_opt(out, n->b);
  fputc(' ', out);
  dump_opt(out, n->c);
  fputc(')', out);
}

static void dump_lambda(FILE *out, const Node *n) {
  fputs("(lambda ", out);
  dump_params(out, n);
  fputc(' ', out);
  dump(out, n->a, -1);
  fputc(')', out);
}

static void dump_attr(FILE *out, const Node *n) {
  fputs("(. ", out);
  dump(out, n->a, -1);
  fprintf(out, " %s)", n->name);
}

/* Expressions; returns false for a statement kind. */
static bool dump_expr(FILE *out, const Node *n) {
  switch (n->kind) {
  case N_NAME: fputs(n->name, out); break;
  case N_CONST: dump_const(out, n->value); break;
  case N_BINOP:
  case N_BOOLOP:
  case N_UNARY: dump_form(out, op_symbol(n->op), n->a, n->b, NULL); break;
  case N_COMPARE: dump_compare(out, n); break;
  case N_IFEXP: dump_form(out, "ifexp", n->a, n->b, n->c); break;
  case N_CALL: dump_call(out, n); break;
  case N_ATTR: dump_attr(out, n); break;
  case N_SUBSCRIPT: dump_form(out, "sub", n->a, n->b, NULL); break;
  case N_SLICE: dump_slice(out, n); break;
  case N_TUPLE: dump_seq(out, "tuple", &n->items); break;
  case N_LIST: dump_seq(out, "list", &n->items); break;
  case N_SET: dump_seq(out, "set", &n->items); break;
  case N_DICT: dump_dict(out, n); break;
  case N_LISTCOMP: dump_listcomp(out, n); break;
  case N_LAMBDA: dump_lambda(out, n); break;
  case N_STARRED: dump_form(out, "*", n->a, NULL, NULL); break;
  default: return false;
  }
  return true;
}

/* ---- dump: statements ------------------------------------------------------------- */

/* A new line indented by [indent] (one-line mode: a space). */
static void newline(FILE *out, int indent) {
  if (indent < 0) {
    fputc(' ', out);
    return;
  }
  fputc('\n', out);
  for (int i = 0; i < indent; i++) fputc(' ', out);
}

/* " (head stmt stmt ...)" with the statements one level deeper. */
static void dump_block(FILE *out, const char *head, const NodeList *body,
                       int indent) {
  int inner = indent < 0 ? -1 : indent + 2;
  newline(out, inner);
  fprintf(out, "(%s", head);
  for (int i = 0; i < body->n; i++) {
    newline(out, inner < 0 ? -1 : inner + 2);
    dump(out, body->items[i], inner < 0 ? -1 : inner + 2);
  }
  fputc(')', out);
}

static void dump_else(FILE *out, const Node *n, int indent) {
  if (n->orelse.n) dump_block(out, "else", &n->orelse, indent);
}

static void dump_if_like(FILE *out, const char *head, const Node *n,
                         int indent) {
  fprintf(out, "(%s ", head);
  dump(out, n->a, -1);
  if (n->kind == N_FOR) {
    fputc(' ', out);
    dump(out, n->b, -1);
  }
  dump_block(out, "body", &n->body, indent);
  dump_else(out, n, indent);
  fputc(')', out);
}

static void dump_decorators(FILE *out, const Node *n) {
  if (!n->decorators.n) return;
  fputs(" (decorators", out);
  dump_list(out, &n->decorators);
  fputc(')', out);
}

static void dump_def(FILE *out, const Node *n, int indent) {
  fprintf(out, "(def %s%s", n->is_jit ? "jit " : "", n->name);
  dump_decorators(out, n);
  fputc(' ', out);
  dump_params(out, n);
  if (n->a) {
    fputs(" -> ", out);
    dump(out, n->a, -1);
  }
  dump_block(out, "body", &n->body, indent);
  fputc(')', out);
}

static void dump_class(FILE *out, const Node *n, int indent) {
  fprintf(out, "(class %s", n->name);
  dump_decorators(out, n);
  fputs(" (bases", out);
  dump_list(out, &n->items);
  fputc(')', out);
  dump_block(out, "body", &n->body, indent);
  fputc(')', out);
}

static void dump_shard_map(FILE *out, const Node *n, int indent) {
  fprintf(out, "(shard_map %s%s", n->is_jit ? "jit " : "", n->name);
  dump_decorators(out, n);
  fputc(' ', out);
  dump_params(out, n);
  fputs(" -> ", out);
  dump(out, n->a, -1);
  fputs(" on ", out);
  dump(out, n->b, -1);
  dump_keywords(out, n);
  dump_block(out, "body", &n->body, indent);
  fputc(')', out);
}

static void dump_mesh(FILE *out, const Node *n) {
  fprintf(out, "(mesh %s", n->name);
  for (int i = 0; i < n->nnames; i++) {
    fprintf(out, " (%s ", n->names[i]);
    dump(out, n->items.items[i], -1);
    fputc(')', out);
  }
  if (n->a) {
    fputs(" (devices ", out);
    dump(out, n->a, -1);
    fputc(')', out);
  }
  fputc(')', out);
}

static void dump_import(FILE *out, const Node *n) {
  if (n->kind == N_IMPORT) {
    fprintf(out, "(import %s", n->name);
    if (n->alias) fprintf(out, " as %s", n->alias);
  } else {
    fprintf(out, "(from %s import", n->name);
    for (int i = 0; i < n->nnames; i++) {
      fprintf(out, " %s", n->names[i]);
      if (n->aliases[i]) fprintf(out, " as %s", n->aliases[i]);
    }
  }
  fputc(')', out);
}

static void dump_names(FILE *out, const char *head, const Node *n) {
  fprintf(out, "(%s", head);
  for (int i = 0; i < n->nnames; i++) fprintf(out, " %s", n->names[i]);
  fputc(')', out);
}

static void dump_assign(FILE *out, const Node *n) {
  fputs("(=", out);
  dump_list(out, &n->items);
  fputc(' ', out);
  dump(out, n->a, -1);
  fputc(')', out);
}

static void dump_augassign(FILE *out, const Node *n) {
  char head[8];
  snprintf(head, sizeof head, "%s=", op_symbol(n->op));
  dump_form(out, head, n->a, n->b, NULL);
}

static void dump_stmt(FILE *out, const Node *n, int indent) {
  switch (n->kind) {
  case N_EXPR_STMT: dump_form(out, "expr", n->a, NULL, NULL); break;
  case N_ASSIGN: dump_assign(out, n); break;
  case N_AUGASSIGN: dump_augassign(out, n); break;
  case N_IF: dump_if_like(out, "if", n, indent); break;
  case N_FOR: dump_if_like(out, "for", n, indent); break;
  case N_WHILE: dump_if_like(out, "while", n, indent); break;
  case N_BREAK: fputs("(break)", out); break;
  case N_CONTINUE: fputs("(continue)", out); break;
  case N_PASS: fputs("(pass)", out); break;
  case N_RETURN: dump_form(out, "return", n->a, NULL, NULL); break;
  case N_DEF: dump_def(out, n, indent); break;
  case N_CLASS: dump_class(out, n, indent); break;
  case N_ANNASSIGN: dump_form(out, ":", n->a, n->b, n->c); break;
  case N_ASSERT: dump_form(out, "assert", n->a, n->b, NULL); break;
  case N_IMPORT:
  case N_FROM_IMPORT: dump_import(out, n); break;
  case N_MESH: dump_mesh(out, n); break;
  case N_SHARD_MAP: dump_shard_map(out, n, indent); break;
  case N_GLOBAL: dump_names(out, "global", n); break;
  case N_NONLOCAL: dump_names(out, "nonlocal", n); break;
  case N_WITH:
    fputs("(with ", out);
    dump(out, n->a, -1);
    if (n->name) fprintf(out, " as %s", n->name);
    fputc(')', out);
    break;
  case N_TRY:
    fputs("(try", out);
    for (int i = 0; i < n->items.n; i++) {
      fputc(' ', out);
      dump(out, n->items.items[i], -1);
    }
    if (n->items2.n) fputs(" finally", out);
    fputc(')', out);
    break;
  case N_EXCEPT:
    fputs("(except", out);
    if (n->a) {
      fputc(' ', out);
      dump(out, n->a, -1);
    }
    if (n->name) fprintf(out, " as %s", n->name);
    fputc(')', out);
    break;
  case N_RAISE:
    fputs("(raise", out);
    if (n->a) {
      fputc(' ', out);
      dump(out, n->a, -1);
    }
    fputc(')', out);
    break;
  case N_DEL:
    fputs("(del", out);
    for (int i = 0; i < n->items.n; i++) {
      fputc(' ', out);
      dump(out, n->items.items[i], -1);
    }
    fputc(')', out);
    break;
  default: fputs("(?)", out); break;
  }
}

static void dump(FILE *out, const Node *n, int indent) {
  if (!dump_expr(out, n)) dump_stmt(out, n, indent);
}

void ast_dump(FILE *out, const Node *n, int indent) {
  if (n) dump(out, n, indent);
  else fputc('_', out);
}

void ast_dump_module(FILE *out, const AstModule *m, int indent) {
  for (int i = 0; i < m->body.n; i++) {
    dump(out, m->body.items[i], indent);
    fputc('\n', out);
  }
}
