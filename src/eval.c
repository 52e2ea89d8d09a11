/* eval.c: not written yet */
