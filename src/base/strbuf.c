/*
 * strbuf.c - the growable byte buffer (strbuf.h).
 */
#include "base/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/mem.h"

/* Room for [need] more bytes and the closing NUL: the capacity doubles,
 * so appending byte by byte costs amortised constant time. */
static bool reserve(StrBuf *b, size_t need) {
  if (b->failed) return false;
  if (b->len + need + 1 <= b->cap) return true;
  size_t cap = b->cap ? b->cap * 2 : 64;
  while (cap < b->len + need + 1) cap *= 2;
  char *d = shm_realloc(b->data, cap);
  if (!d) {
    b->failed = true;
    return false;
  }
  b->data = d;
  b->cap = cap;
  return true;
}

void sbuf_add(StrBuf *b, const void *p, size_t n) {
  if (!reserve(b, n)) return;
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = '\0';
}

void sbuf_puts(StrBuf *b, const char *s) { sbuf_add(b, s, strlen(s)); }

void sbuf_printf(StrBuf *b, const char *fmt, ...) {
  va_list ap, again;
  va_start(ap, fmt);
  va_copy(again, ap);
  char small[256];
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n >= 0 && (size_t)n < sizeof small) sbuf_add(b, small, (size_t)n);
  else if (n >= 0 && reserve(b, (size_t)n)) {
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, again);
    b->len += (size_t)n;
  }
  va_end(again);
}

void sbuf_spaces(StrBuf *b, int n) {
  if (n <= 0 || !reserve(b, (size_t)n)) return;
  memset(b->data + b->len, ' ', (size_t)n);
  b->len += (size_t)n;
  b->data[b->len] = '\0';
}

const char *sbuf_text(const StrBuf *b) { return b->data ? b->data : ""; }

void sbuf_free(StrBuf *b) {
  shm_free(b->data);
  *b = (StrBuf){0};
}
