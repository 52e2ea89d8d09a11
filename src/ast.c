/* ast.c: not written yet */
