/*
 * strbuf.h - a growable byte buffer: the text of printed arrays and plans,
 * format() results, and the messages a device's output is gathered in.
 *
 * Ownership: [data] belongs to the buffer (NULL until the first append,
 * NUL-terminated after it, so text may be read in place); sbuf_free
 * releases it, or the caller takes it and frees it with shm_free.
 * Errors: an allocation that fails sets [failed] and drops that append
 * and every later one, so a caller checks once, at the end (and reports
 * err_nomem there).  No function here sets the thread's error.
 */
#ifndef SHMAP_STRBUF_H
#define SHMAP_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct StrBuf {
  char *data;
  size_t len, cap;
  bool failed;
} StrBuf;

/* Appends [n] bytes at [p] (any bytes, NULs included). */
void sbuf_add(StrBuf *b, const void *p, size_t n);
/* Appends the C string [s]. */
void sbuf_puts(StrBuf *b, const char *s);
/* Appends printf's output, whatever its length. */
void sbuf_printf(StrBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Appends [n] spaces (none when n <= 0). */
void sbuf_spaces(StrBuf *b, int n);
/* The text so far: [data], or "" before the first append. */
const char *sbuf_text(const StrBuf *b);
/* Releases the buffer's memory; [b] is empty again. */
void sbuf_free(StrBuf *b);

#endif
