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

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "base/error.h"
#include "base/value.h"

typedef enum {
  /* expressions */
  N_NAME,       /* name (interned) */
  N_CONST,      /* value: number (0-d weak i32/f32 array), str, None, True,
                   False, Ellipsis */
  N_BINOP,      /* op, a=lhs, b=rhs; loc = the operator, loc2 = lhs start */
  N_UNARY,      /* op (OP_NEG OP_POS OP_NOT OP_INVERT), a=operand.  `-INT`
                   and `-FLOAT` literals are folded into one N_CONST */
  N_BOOLOP,     /* op (OP_AND/OP_OR), a=lhs, b=rhs (short-circuit; a chain
                   `x or y or z` nests to the left); loc = the operator */
  N_COMPARE,    /* chain a < b <= c: items = operands (n >= 2), ops[0..n-2]
                   the operators, op = ops[0]; loc = first operator */
  N_IFEXP,      /* body if test else orelse: a=test, b=body, c=orelse */
  N_CALL,       /* a=func, items=positional args (N_STARRED for *x), kws
                   (name NULL for **x); loc = callee start, loc2 = '(' */
  N_ATTR,       /* a=obj, name; loc2 = the name */
  N_SUBSCRIPT,  /* a=obj, b=index: an expr, N_SLICE, or N_TUPLE of them;
                   loc2 = '[' */
  N_SLICE,      /* a:b:c = a, b, c, each may be NULL */
  N_TUPLE,      /* items */
  N_LIST,       /* items */
  N_DICT,       /* items = keys, items2 = values */
  N_SET,        /* items: a set display {a, b} */
  N_LISTCOMP,   /* a=elt, clauses (target, iter, conds), left to right;
                   also made for a generator expression (x for x in y),
                   for a dict comprehension with a=key, b=value, and
                   for a set comprehension (is_set) */
  N_LAMBDA,     /* params (no annotations), a=body expression */
  N_STARRED,    /* *a in calls, displays and unpacking targets */

  /* statements (loc = first token) */
  N_EXPR_STMT,  /* a=expression */
  N_ASSIGN,     /* items = targets, left to right (a = b = value), a=value.
                   Targets are N_NAME, N_ATTR, N_SUBSCRIPT, or N_TUPLE /
                   N_LIST of targets with at most one N_STARRED each */
  N_AUGASSIGN,  /* a=target (name, attr or subscript) op= b=value */
  N_IF,         /* a=test, body, orelse (elif: one N_IF in orelse) */
  N_FOR,        /* a=target, b=iter, body, orelse */
  N_WHILE,      /* a=test, body, orelse */
  N_BREAK,
  N_CONTINUE,
  N_PASS,
  N_RETURN,     /* a=value, may be NULL; the parser rejects it outside a
                   def or shard_map body */
  N_DEF,        /* name, params, a=return annotation or NULL, body, is_jit,
                   decorators (applied last to first, as in Python) */
  N_ASSERT,     /* a=test, b=msg, may be NULL */
  N_IMPORT,     /* name = dotted module name, alias (NULL if none); one
                   node per module of `import a, b` */
  N_FROM_IMPORT,/* name = module, names/aliases (nnames; "*" for import *) */
  N_MESH,       /* name, names = axis names (nnames), items = the axes'
                   size expressions, a = devices expr or NULL */
  N_SHARD_MAP,  /* name, params (annotation = in_spec), a = out_spec,
                   b = mesh expr, kws (check_rep=...), body, is_jit,
                   decorators */
  N_GLOBAL,     /* names (nnames) */
  N_NONLOCAL,   /* names (nnames) */
  N_DEL,        /* items: the targets (names, subscripts) */
  N_TRY,        /* body, items: the N_EXCEPT handlers, orelse, items2: finally */
  N_EXCEPT,     /* a=the exception type (NULL: any), name: `as` name, body */
  N_WITH,       /* a=the context manager, name: `as` name (or NULL), body; several
                   items nest, one N_WITH in the body of the one before */
  N_RAISE,      /* a=the exception (NULL: re-raise the one being handled) */
  N_CLASS,      /* name, items = the bases, body, decorators (applied last
                   to first, as in Python) */
  N_ANNASSIGN,  /* a=target: annotation b [= value c (NULL: none)]; the
                   annotation is recorded, not evaluated, as under PEP
                   563's `from __future__ import annotations` */
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
  const char *name;   /* interned (intern.h) */
  Node *annotation;   /* NULL if none; in shard_map, the in_spec; `n: static`
                         is an N_NAME annotation `static` */
  Node *deflt;        /* NULL if required */
  bool star;          /* *args (later parameters are keyword-only) */
  bool starstar;      /* **kwargs (always last) */
  Loc loc;            /* the name */
} Param;

/* A keyword argument or option: `name=value`; name NULL for `**expr`. */
typedef struct Keyword {
  const char *name;   /* interned; unique within one call */
  Node *value;
  Loc loc;            /* the name, or the `**` */
} Keyword;

/* One `for target in iter if cond...` clause of a comprehension. */
typedef struct CompClause {
  Node *target;
  Node *iter;
  NodeList conds;
} CompClause;

struct Node {
  NodeKind kind;
  OpKind op;
  bool is_jit;         /* N_DEF, N_SHARD_MAP */
  bool is_gen;         /* N_LISTCOMP: written as a generator expression,
                          lazy when its first iterable is (eval.c) */
  bool is_set;         /* N_LISTCOMP: a set comprehension {x for ...} */
  uint8_t fuse;        /* N_BINOP, N_UNARY, N_CALL: whether it roots an
                          element-wise tree (eval_fusable.c's memo) */
  Loc loc;             /* first token of the construct; for N_BINOP,
                          N_BOOLOP and N_COMPARE, the operator */
  Loc loc2;            /* N_BINOP/N_BOOLOP/N_COMPARE: the left operand's
                          start; N_CALL: '('; N_SUBSCRIPT: '['; N_ATTR: the
                          attribute name; else == loc */
  const char *name;    /* N_NAME, N_ATTR, N_DEF, N_CLASS, N_MESH, N_SHARD_MAP, N_IMPORT
                          and N_FROM_IMPORT (dotted module name "a.b");
                          every identifier in the tree is interned, so
                          names compare by pointer */
  Value *value;        /* N_CONST, owned by the module */
  Node *a, *b, *c;     /* operands as described per kind */
  NodeList items;      /* per kind, see NodeKind */
  NodeList body;       /* statement blocks */
  /* Fields only some kinds have share storage (a trivial statement's three
   * nodes are most of a script's memory); each group's kinds are disjoint,
   * so code reads a field only for the kinds listed beside it. */
  union {
    struct {
      int nparams;
      Param *params;       /* N_DEF, N_LAMBDA, N_SHARD_MAP */
    };
    struct {
      int nclauses;
      CompClause *clauses; /* N_LISTCOMP */
    };
    struct {
      int nnames;
      const char **names;  /* N_MESH axis names (distinct), N_FROM_IMPORT
                              names, N_GLOBAL and N_NONLOCAL names */
      const char **aliases;/* N_FROM_IMPORT aliases (NULL entries: none) */
    };
    OpKind *ops;           /* N_COMPARE: items.n - 1 operators */
    atomic_int slot_hint;  /* N_NAME: the index of the scope's table where
                              the evaluator last found the name, tried
                              before hashing (eval.c, env_slot_hinted) */
  };
  union {
    struct {
      int nkw;
      Keyword *kws;        /* N_CALL keywords, N_SHARD_MAP options */
    };
    NodeList items2;       /* N_DICT values; N_TRY: the finally block */
  };
  union {
    NodeList decorators;   /* N_DEF, N_SHARD_MAP, N_CLASS */
    NodeList orelse;       /* else block of N_IF, N_WHILE, N_FOR, N_TRY */
    const char *alias;     /* N_IMPORT ... as alias */
  };
};

/* A parsed source: its statements and the arena that owns the tree. */
typedef struct AstModule {
  Source *src;         /* counted reference */
  NodeList body;
  struct Arena *arena; /* private to ast.c */
  Value *consts;       /* a List holding every N_CONST value */
} AstModule;

/* A new empty module for [src] (takes its own reference), with an empty
 * arena and constant list.  NULL on out of memory. */
AstModule *ast_module_new(Source *src);

/* Keeps the constant [v] (steals the reference) in [m]->consts so that
 * ast_free releases it.  Returns [v] (borrowed from then on), or NULL on
 * out of memory ([v] released). */
Value *ast_keep_const(AstModule *m, Value *v);

/* Frees the module, its tree and its constants (NULL is allowed). */
void ast_free(AstModule *m);

/* Counts ast_free calls: a cache keyed by node addresses (eval_fuse's
 * staged trees) is void once it changes, as a freed node's address may
 * be a new node's. */
extern atomic_uint ast_generation;

/* Arena allocation for the parser: [n] bytes of zeroed memory, 16-byte
 * aligned, living as long as [m].  NULL on out of memory (error set). */
void *ast_alloc(AstModule *m, size_t n);

/* A NUL-terminated arena copy of the [len] bytes at [s]; NULL on nomem. */
char *ast_strdup(AstModule *m, const char *s, size_t len);

/* Appends [n] to [l], growing its arena array (capacity is implicit: the
 * next power of two >= 4, so a NodeList needs no capacity field and may
 * be copied by value).  Returns 0, or -1 on out of memory (error set). */
int nodelist_push(AstModule *m, NodeList *l, Node *n);

/* Writes an S-expression form of [n] into [out] (for parser tests and
 * `--dump-ast`).  With [indent] >= 0, statements of blocks go on lines of
 * their own, indented by [indent] + 2 per level; with [indent] < 0 the
 * whole tree is on one line.  Forms (one line):
 *   x  1  2.5  'str'  None  True  ...         names and constants
 *   (+ a b)  (- a)  (not a)  (and a b)  (compare a < b <= c)
 *   (ifexp test body orelse)  (lambda (params x (y = 1)) body)
 *   (call f a (* b) (kw k v) (** d))  (. obj name)  (sub obj index)
 *   (slice a _ c)  (tuple ...)  (list ...)  (dict (k v) ...)  (* x)
 *   (listcomp elt (for target iter (if cond) ...) ...)
 *   (expr e)  (= t1 t2 value)  (+= t v)  (if test (body ...) (else ...))
 *   (for t iter (body ...) [(else ...)])  (while test (body ...) [(else ..)])
 *   (return [v])  (break)  (continue)  (pass)  (assert t [msg])
 *   (def [jit] f (decorators ...) (params ...) [-> ann] (body ...))
 *   params: x  (x : ann)  (x = d)  (x : ann = d)  *args  **kw
 *   (import a.b [as c])  (from a import b [as c] ...)  (global a b)
 *   (class C (decorators ...) (bases ...) (body ...))  (: t ann [v])
 *   (mesh m (i 4) (j 2) [(devices e)])
 *   (shard_map [jit] f (decorators ...) (params ...) -> spec on m (kw k v)
 *     (body ...))
 * A module's statements are dumped one per line. */
void ast_dump(FILE *out, const Node *n, int indent);

/* ast_dump for each statement of [m], one per line. */
void ast_dump_module(FILE *out, const AstModule *m, int indent);

#endif
