/* parser.c: not written yet */
