/* kernels.h: not written yet */
#ifndef SHMAP_KERNELS_H
#define SHMAP_KERNELS_H
#endif
