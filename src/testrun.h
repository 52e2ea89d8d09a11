/* testrun.h: not written yet */
#ifndef SHMAP_TESTRUN_H
#define SHMAP_TESTRUN_H
#endif
