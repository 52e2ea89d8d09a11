/* kern_reduce.c: not written yet */
