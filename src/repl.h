/* repl.h: not written yet */
#ifndef SHMAP_REPL_H
#define SHMAP_REPL_H
#endif
