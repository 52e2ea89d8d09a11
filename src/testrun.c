/* testrun.c: not written yet */
