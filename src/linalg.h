/* linalg.h: not written yet */
#ifndef SHMAP_LINALG_H
#define SHMAP_LINALG_H
#endif
