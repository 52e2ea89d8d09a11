/* lexer.c: not written yet */
