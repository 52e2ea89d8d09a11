/* intern.c: not written yet */
