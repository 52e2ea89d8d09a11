/* repl.c: not written yet */
