/*
 * parser.h - recursive descent over the lexer's tokens into ast.h trees.
 *
 * Errors are ERR_SYNTAX with the location of the token that went wrong, in
 * the forms "expected ')' to close '(' at line 3", "invalid syntax",
 * "expected an indented block after 'if' at line 4", "cannot assign to
 * function call".
 */
#ifndef SHMAP_PARSER_H
#define SHMAP_PARSER_H

#include "ast.h"

/* Parses a whole source (a file or a REPL entry).  Returns a new module, or
 * NULL with the error set. */
AstModule *parse_source(Source *src);

#endif
