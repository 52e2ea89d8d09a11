/* device.c: not written yet */
