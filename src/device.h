/* device.h: not written yet */
#ifndef SHMAP_DEVICE_H
#define SHMAP_DEVICE_H
#endif
