/* linalg.c: not written yet */
