/* kern_shape.c: not written yet */
