/* config.h: not written yet */
#ifndef SHMAP_CONFIG_H
#define SHMAP_CONFIG_H
#endif
