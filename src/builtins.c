/* builtins.c: not written yet */
