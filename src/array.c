/* array.c: not written yet */
