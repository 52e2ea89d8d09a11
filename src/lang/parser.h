/*
 * parser.h - recursive descent over the lexer's tokens into ast.h trees.
 *
 * The grammar is Python's expression and statement grammar (LANGUAGE.md
 * §1) plus the language's statements `mesh`, `[jit] shard_map` and
 * `jit def`, whose words are keywords only at the start of a statement of
 * theirs (`mesh NAME (`, `shard_map NAME (`, `jit def`, `jit shard_map`),
 * so `jit(f)`, `shard_map(f, mesh=m, ...)` and a variable named `devices`
 * stay ordinary names.  The grammar rules are written above each function
 * in parser.c.
 *
 * Errors are ERR_SYNTAX located at the first character of the token that
 * went wrong (for "cannot assign to ...", at the start of the target), in
 * Python's words where Python has them:
 *   "invalid syntax", "expected ':'", "expected ')' to close '(' at line 3",
 *   "expected an indented block after 'if' statement on line 4" (also
 *   'elif', 'else', 'for', 'while', 'shard_map' statement, and "function
 *   definition"), "unexpected indent", "cannot assign to function call",
 *   "positional argument follows keyword argument", "'return' outside
 *   function", "'break' outside loop", "too deeply nested", and the
 *   lexer's messages (lexer.h) such as "unterminated string literal".
 * 'return', 'break' and 'continue' in the wrong place are rejected here,
 * so the evaluator never sees them.
 *
 * Number literals: an integer literal is a weakly typed i32 constant and
 * one that does not fit in int32 is a syntax error ("integer literal
 * 3000000000 does not fit in int32, ..."), as JAX raises OverflowError for
 * such a Python int; a minus sign directly before a literal is folded into
 * it, so -2147483648 is accepted.  A float literal is a weakly typed f32
 * constant (1e400 is inf).
 *
 * Limits: the tree is at most about 1000 levels deep (nested brackets,
 * unary operators, chains such as a + b + ... or elif ...), 200 open
 * brackets, 100 levels of indentation; beyond that the parse fails with an
 * error, never a crash.
 */
#ifndef SHMAP_PARSER_H
#define SHMAP_PARSER_H

#include "lang/ast.h"

/* Parses a whole source (a file or a REPL entry; [src] is borrowed and
 * the module takes its own reference).  Returns a new module (free it with
 * ast_free), or NULL with the error set.  May be called from any thread. */
AstModule *parse_source(Source *src);

#endif
