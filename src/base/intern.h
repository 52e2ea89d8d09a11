/*
 * intern.h - the table of interned names.
 *
 * Identifiers are interned once, at parse time, so scopes compare names by
 * pointer.  The table is guarded by one mutex (intern.c: intern_lock); the
 * returned strings live until exit and are never changed, so any thread
 * may read them without a lock.
 */
#ifndef SHMAP_INTERN_H
#define SHMAP_INTERN_H

#include <stddef.h>

/* The unique copy of [s] ([len] bytes).  NULL on out of memory. */
const char *intern(const char *s, size_t len);
const char *intern_cstr(const char *s);

#endif
