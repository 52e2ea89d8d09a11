/*
 * utf8.h - UTF-8, the one encoding of strings and source text.
 *
 * A str is a sequence of code points, as in Python 3, kept as UTF-8
 * bytes (value.h's Str).  These helpers convert between byte offsets and
 * code-point positions, encode and decode one code point, and check that
 * bytes are valid UTF-8 with the reasons Python's 'utf-8' codec gives.
 * Pure functions over borrowed bytes; none allocates or sets the error.
 */
#ifndef SHMAP_UTF8_H
#define SHMAP_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define UTF8_MAX_CP 0x10FFFFu   /* the last code point (sys.maxunicode) */

/* Whether byte [c] starts a code point (is not a continuation byte). */
static inline bool utf8_is_lead(unsigned char c) { return (c & 0xC0) != 0x80; }

/* Writes code point [cp] (<= UTF8_MAX_CP) as UTF-8 into [out]; returns
 * the number of bytes, 1 to 4.  Surrogates are encoded like any code
 * point (Python's 'surrogatepass'), so '\ud800' keeps its length 1. */
int utf8_encode(uint32_t cp, char out[4]);

/* The code point at byte [*i] of [s] ([n] bytes), [*i] moved past it.
 * Bytes that are not valid UTF-8 decode one at a time, as their byte
 * value: the scan never stops and never reads past [n]. */
uint32_t utf8_decode(const char *s, size_t n, size_t *i);

/* The number of code points of the [n] bytes at [s]. */
size_t utf8_count(const char *s, size_t n);

/* The byte offset of code point [k] (0 <= k <= its count) of [s]. */
size_t utf8_offset(const char *s, size_t n, size_t k);

/* Checks the [n] bytes at [s]: the byte offset of the first byte that
 * does not decode, or [n] when all are valid UTF-8.  For a bad byte,
 * [*why] is Python's reason ("invalid start byte", "invalid
 * continuation byte", "unexpected end of data"). */
size_t utf8_check(const char *s, size_t n, const char **why);

/* ---- character classes and case, as Python's str methods ------------ */

/* Python's str.isdigit of one code point: Unicode's decimal and digit
 * characters ('7', '٣', '²'), from a table of the Unicode Character
 * Database's ranges (the C library's iswdigit knows only '0'-'9'). */
bool utf8_isdigit(uint32_t cp);

/* Python's str.isspace of one code point (its table of white space:
 * '\t'-'\r', '\x1c'-'\x1f', ' ', U+0085, U+00A0, U+3000 ...). */
bool utf8_isspace(uint32_t cp);

/* Python's str.isalpha of one code point: the C library's letters of its
 * C.UTF-8 locale (iswalpha), digits excepted. */
bool utf8_isalpha(uint32_t cp);

/* Whether repr() shows [cp] as itself (Python's str.isprintable): not a
 * control, format, private-use, surrogate or unassigned code point, nor
 * white space other than ' '. */
bool utf8_isprintable(uint32_t cp);

/* Case of one code point, from the C library's C.UTF-8 locale (towupper,
 * towlower, iswupper, iswlower; en_US.UTF-8 when C.UTF-8 is missing);
 * ASCII only if neither is there (utf8_have_case says so, for callers
 * to refuse non-ASCII text rather than answer wrongly).  One code point
 * maps to one: the callers handle 'ß' (upper 'SS'). */
bool utf8_have_case(void);   /* whether that locale is there */
uint32_t utf8_upper(uint32_t cp);
uint32_t utf8_lower(uint32_t cp);
bool utf8_isupper(uint32_t cp);
bool utf8_islower(uint32_t cp);

#endif
