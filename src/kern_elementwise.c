/* kern_elementwise.c: not written yet */
