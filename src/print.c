/* print.c: not written yet */
