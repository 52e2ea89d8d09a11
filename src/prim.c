/* prim.c: not written yet */
