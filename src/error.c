/* error.c: not written yet */
