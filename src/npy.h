/* npy.h: not written yet */
#ifndef SHMAP_NPY_H
#define SHMAP_NPY_H
#endif
