/* value.c: not written yet */
