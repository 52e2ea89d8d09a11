/*
 * ast.h - the syntax tree of a parsed .shm source.
 *
 * One Node type for expressions and statements, tagged by [kind].  A tree
 * is built by the parser into an arena owned by its AstModule and is never
 * changed afterwards, so device threads may walk it concurrently (they
 * share the parsed program read-only).  Constants are prebuilt values
 * (immortal to the tree: released only when the AstModule is freed).
 *
 * Grammar: LANGUAGE.md §1 (Python's expression and statement forms, with
 * Python's precedence and `@`), plus the three words of the language:
 *     mesh NAME(AXIS=INT, ...) [devices EXPR]
 *     [jit] shard_map NAME(PARAM: SPEC, ...) -> SPEC on EXPR[, KW=EXPR ...]: BLOCK
 *     jit def NAME(PARAMS): BLOCK
 */
#ifndef SHMAP_AST_H
#define SHMAP_AST_H

#include <stdbool.h>

#include "error.h"
#include "value.h"

typedef enum {
  /* expressions */
  N_NAME,       /* name */
  N_CONST,      /* value: number, string, None, True, False, Ellipsis */
  N_BINOP,      /* op, lhs, rhs */
  N_UNARY,      /* op, operand */
  N_BOOLOP,     /* op (OP_AND/OP_OR), lhs, rhs (short-circuit) */
  N_COMPARE,    /* chain: a < b <= c: items[0..n], ops[0..n-1] */
  N_IFEXP,      /* body if test else orelse: a=test, b=body, c=orelse */
  N_CALL,       /* func, args (N_STARRED allowed), keywords */
  N_ATTR,       /* obj . name */
  N_SUBSCRIPT,  /* obj [ index ]; index is an expr, N_SLICE, or N_TUPLE of them */
  N_SLICE,      /* a:b:c, each may be NULL */
  N_TUPLE,      /* items */
  N_LIST,       /* items */
  N_DICT,       /* keys, values */
  N_LISTCOMP,   /* elt, comprehension clauses (targets, iters, conditions) */
  N_LAMBDA,     /* params, body expression */
  N_STARRED,    /* *expr in calls and unpacking targets */

  /* statements */
  N_EXPR_STMT,  /* expression statement */
  N_ASSIGN,     /* targets (a = b = value), value */
  N_AUGASSIGN,  /* target op= value */
  N_IF,         /* test, body, orelse (elif nests an N_IF in orelse) */
  N_FOR,        /* target, iter, body */
  N_WHILE,      /* test, body */
  N_BREAK,
  N_CONTINUE,
  N_PASS,
  N_RETURN,     /* value may be NULL */
  N_DEF,        /* name, params, body, is_jit, decorators */
  N_ASSERT,     /* test, msg may be NULL */
  N_IMPORT,     /* module dotted name, alias (import a.b as c) */
  N_FROM_IMPORT,/* module, names/aliases */
  N_MESH,       /* name, axes (names, size exprs), devices expr or NULL */
  N_SHARD_MAP,  /* name, params (annotation = in_spec), out_spec, mesh expr,
                   keywords (check_rep=...), body, is_jit */
  N_GLOBAL,     /* names */
  N_NONLOCAL,   /* names */
} NodeKind;

typedef enum {
  OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_MATMUL,
  OP_LSHIFT, OP_RSHIFT, OP_BITAND, OP_BITOR, OP_BITXOR,        /* binary */
  OP_NEG, OP_POS, OP_NOT, OP_INVERT,                           /* unary */
  OP_AND, OP_OR,                                               /* boolean */
  OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOT_IN,
  OP_IS, OP_IS_NOT                                             /* compare */
} OpKind;

/* The Python spelling of an operator ("+", "@", "not in"). */
const char *op_symbol(OpKind op);

typedef struct Node Node;

/* A growable array of node pointers (arena-owned). */
typedef struct NodeList {
  int n;
  Node **items;
} NodeList;

/* A function parameter: `name`, `name=default`, `name: annot`, `*name`,
 * `**name`. */
typedef struct Param {
  const char *name;   /* arena-owned */
  Node *annotation;   /* NULL if none; in shard_map, the in_spec */
  Node *deflt;        /* NULL if required */
  bool star;          /* *args */
  bool starstar;      /* **kwargs */
  Loc loc;
} Param;

/* A keyword argument or option: `name=value`; name NULL for `**expr`. */
typedef struct Keyword {
  const char *name;
  Node *value;
  Loc loc;
} Keyword;

/* One `for target in iter if cond...` clause of a comprehension. */
typedef struct CompClause {
  Node *target;
  Node *iter;
  NodeList conds;
} CompClause;

struct Node {
  NodeKind kind;
  Loc loc;             /* first character of the construct; for N_BINOP,
                          the operator; for N_CALL, the '(' is in loc2 */
  Loc loc2;            /* secondary location (see above), else == loc */
  OpKind op;
  const char *name;    /* N_NAME, N_ATTR, N_DEF, N_MESH, N_SHARD_MAP, N_IMPORT
                          (dotted module name) */
  const char *alias;   /* N_IMPORT ... as alias */
  Value *value;        /* N_CONST, owned by the module */
  Node *a, *b, *c;     /* operands as described per kind */
  NodeList items;      /* tuple/list/dict keys/call args/compare items/
                          assign targets/mesh axis size exprs */
  NodeList items2;     /* dict values / else-block of if & for? (see body) */
  NodeList body;       /* statement blocks */
  NodeList orelse;     /* else block of if/while/for */
  int nparams;
  Param *params;       /* N_DEF, N_LAMBDA, N_SHARD_MAP */
  int nkw;
  Keyword *kws;        /* N_CALL keywords, N_SHARD_MAP options */
  int nclauses;
  CompClause *clauses; /* N_LISTCOMP */
  int nnames;
  const char **names;  /* N_MESH axis names, N_FROM_IMPORT names, N_GLOBAL */
  const char **aliases;/* N_FROM_IMPORT aliases (NULL entries: none) */
  NodeList decorators; /* N_DEF */
  bool is_jit;         /* N_DEF, N_SHARD_MAP */
};

/* A parsed source: its statements and the arena that owns the tree. */
typedef struct AstModule {
  Source *src;         /* counted reference */
  NodeList body;
  struct Arena *arena; /* private to ast.c */
  Value *consts;       /* a List holding every N_CONST value */
} AstModule;

/* Frees the module, its tree and its constants. */
void ast_free(AstModule *m);

/* Arena allocation for the parser: zeroed memory living as long as [m].
 * NULL on out of memory. */
void *ast_alloc(AstModule *m, size_t n);
char *ast_strdup(AstModule *m, const char *s, size_t len);
int nodelist_push(AstModule *m, NodeList *l, Node *n);

/* Writes an S-expression form of [n] into [out] (for parser tests and
 * `--dump-ast`). */
void ast_dump(FILE *out, const Node *n, int indent);

#endif
