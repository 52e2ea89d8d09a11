/* mem.c: not written yet */
