/*
 * utf8.c - UTF-8 encoding, decoding and validation (see utf8.h).
 *
 * Validation follows RFC 3629, the rules of Python's 'utf-8' codec:
 * no overlong forms, no surrogates, nothing above U+10FFFF.
 */
#include <locale.h>
#include <pthread.h>
#include <string.h>
#include <wctype.h>

#include "base/utf8.h"

int utf8_encode(uint32_t cp, char out[4]) {
  if (cp < 0x80) {
    out[0] = (char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (char)(0xE0 | (cp >> 12));
    out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[2] = (char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (char)(0xF0 | (cp >> 18));
  out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
  out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
  out[3] = (char)(0x80 | (cp & 0x3F));
  return 4;
}

/* The number of bytes a sequence led by [c] has (1 for a stray byte). */
static int seq_len(unsigned char c) {
  return c >= 0xF0 && c <= 0xF7 ? 4 : c >= 0xE0 ? (c <= 0xEF ? 3 : 1) : c >= 0xC0 ? 2 : 1;
}

uint32_t utf8_decode(const char *s, size_t n, size_t *i) {
  const unsigned char *u = (const unsigned char *)s + *i;
  int k = seq_len(u[0]);
  if (k == 1 || *i + (size_t)k > n) {
    (*i)++;
    return u[0];
  }
  uint32_t cp = u[0] & (0x7F >> k);
  for (int j = 1; j < k; j++) {
    if (utf8_is_lead(u[j])) {   /* cut short: the lead byte alone */
      (*i)++;
      return u[0];
    }
    cp = cp << 6 | (u[j] & 0x3F);
  }
  *i += (size_t)k;
  return cp;
}

/* Eight bytes at a time: a continuation byte is one whose top bit is set
 * and the next clear, which (w & ~(w << 1)) leaves in each byte's top
 * bit; every string is counted when made (str_new), so ASCII stays cheap. */
size_t utf8_count(const char *s, size_t n) {
  size_t cont = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, s + i, 8);
    uint64_t top = w & ~(w << 1) & 0x8080808080808080ull;
    if (top) cont += (size_t)__builtin_popcountll(top);
  }
  for (; i < n; i++) cont += !utf8_is_lead((unsigned char)s[i]);
  return n - cont;
}

size_t utf8_offset(const char *s, size_t n, size_t k) {
  size_t i = 0;
  for (; i < n; i++)
    if (utf8_is_lead((unsigned char)s[i]) && k-- == 0) return i;
  return n;
}

/* Whether the second byte [c] may follow lead byte [lead]: the ranges
 * of RFC 3629 that exclude overlong forms, surrogates and > U+10FFFF. */
static bool second_ok(unsigned char lead, unsigned char c) {
  unsigned char lo = lead == 0xE0 ? 0xA0 : lead == 0xF0 ? 0x90 : 0x80;
  unsigned char hi = lead == 0xED ? 0x9F : lead == 0xF4 ? 0x8F : 0xBF;
  return c >= lo && c <= hi;
}

size_t utf8_check(const char *s, size_t n, const char **why) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    unsigned char c = u[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    int k = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!k) {
      *why = "invalid start byte";
      return i;
    }
    for (int j = 1; j < k; j++) {
      if (i + (size_t)j >= n) {
        *why = "unexpected end of data";
        return i;
      }
      unsigned char d = u[i + (size_t)j];
      if (j == 1 ? !second_ok(c, d) : (d & 0xC0) != 0x80) {
        *why = "invalid continuation byte";
        return i;
      }
    }
    i += (size_t)k;
  }
  return n;
}

/* ---- character classes and case ------------------------------------------ */

typedef struct Range {
  uint32_t lo, hi;
} Range;

/* Whether [cp] lies in one of the [n] sorted ranges [r]. */
static bool in_ranges(const Range *r, size_t n, uint32_t cp) {
  size_t a = 0, b = n;
  while (a < b) {
    size_t m = (a + b) / 2;
    if (cp > r[m].hi) a = m + 1;
    else if (cp < r[m].lo) b = m;
    else return true;
  }
  return false;
}

#define NRANGES(r) (sizeof(r) / sizeof(r)[0])

/* Unicode 14's code points with Numeric_Type Decimal or Digit. */
static const Range digits[] = {
    {0x30, 0x39}, {0xB2, 0xB3}, {0xB9, 0xB9}, {0x660, 0x669}, {0x6F0, 0x6F9},
    {0x7C0, 0x7C9}, {0x966, 0x96F}, {0x9E6, 0x9EF}, {0xA66, 0xA6F}, {0xAE6, 0xAEF},
    {0xB66, 0xB6F}, {0xBE6, 0xBEF}, {0xC66, 0xC6F}, {0xCE6, 0xCEF}, {0xD66, 0xD6F},
    {0xDE6, 0xDEF}, {0xE50, 0xE59}, {0xED0, 0xED9}, {0xF20, 0xF29}, {0x1040, 0x1049},
    {0x1090, 0x1099}, {0x1369, 0x1371}, {0x17E0, 0x17E9}, {0x1810, 0x1819},
    {0x1946, 0x194F}, {0x19D0, 0x19DA}, {0x1A80, 0x1A89}, {0x1A90, 0x1A99},
    {0x1B50, 0x1B59}, {0x1BB0, 0x1BB9}, {0x1C40, 0x1C49}, {0x1C50, 0x1C59},
    {0x2070, 0x2070}, {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2460, 0x2468},
    {0x2474, 0x247C}, {0x2488, 0x2490}, {0x24EA, 0x24EA}, {0x24F5, 0x24FD},
    {0x24FF, 0x24FF}, {0x2776, 0x277E}, {0x2780, 0x2788}, {0x278A, 0x2792},
    {0xA620, 0xA629}, {0xA8D0, 0xA8D9}, {0xA900, 0xA909}, {0xA9D0, 0xA9D9},
    {0xA9F0, 0xA9F9}, {0xAA50, 0xAA59}, {0xABF0, 0xABF9}, {0xFF10, 0xFF19},
    {0x104A0, 0x104A9}, {0x10A40, 0x10A43}, {0x10D30, 0x10D39}, {0x10E60, 0x10E68},
    {0x11052, 0x1105A}, {0x11066, 0x1106F}, {0x110F0, 0x110F9}, {0x11136, 0x1113F},
    {0x111D0, 0x111D9}, {0x112F0, 0x112F9}, {0x11450, 0x11459}, {0x114D0, 0x114D9},
    {0x11650, 0x11659}, {0x116C0, 0x116C9}, {0x11730, 0x11739}, {0x118E0, 0x118E9},
    {0x11950, 0x11959}, {0x11C50, 0x11C59}, {0x11D50, 0x11D59}, {0x11DA0, 0x11DA9},
    {0x16A60, 0x16A69}, {0x16AC0, 0x16AC9}, {0x16B50, 0x16B59}, {0x1D7CE, 0x1D7FF},
    {0x1E140, 0x1E149}, {0x1E2F0, 0x1E2F9}, {0x1E950, 0x1E959}, {0x1F100, 0x1F10A},
    {0x1FBF0, 0x1FBF9},

};

/* Unicode's White_Space with Python's additions (U+001C..U+001F). */
static const Range spaces[] = {
    {0x9, 0xD}, {0x1C, 0x20}, {0x85, 0x85}, {0xA0, 0xA0}, {0x1680, 0x1680},
    {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
    {0x3000, 0x3000},
};

/* Format characters (Unicode category Cf), which the C library counts as
 * printable and Python does not. */
static const Range formats[] = {
    {0xAD, 0xAD}, {0x600, 0x605}, {0x61C, 0x61C}, {0x6DD, 0x6DD}, {0x70F, 0x70F},
    {0x890, 0x891}, {0x8E2, 0x8E2}, {0x180E, 0x180E}, {0x200B, 0x200F},
    {0x202A, 0x202E}, {0x2060, 0x2064}, {0x2066, 0x206F}, {0xFEFF, 0xFEFF},
    {0xFFF9, 0xFFFB}, {0x110BD, 0x110BD}, {0x110CD, 0x110CD}, {0x13430, 0x1343F},
    {0x1BCA0, 0x1BCA3}, {0x1D173, 0x1D17A}, {0xE0001, 0xE0001}, {0xE0020, 0xE007F},
};

bool utf8_isdigit(uint32_t cp) { return in_ranges(digits, NRANGES(digits), cp); }
bool utf8_isspace(uint32_t cp) {
  if (cp < 0x80) return (cp >= 0x9 && cp <= 0xD) || (cp >= 0x1C && cp <= 0x20);
  return in_ranges(spaces, NRANGES(spaces), cp);
}

/* The C.UTF-8 locale, made once; (locale_t)0 when the system lacks it.
 * A locale object, not setlocale, so nothing global changes. */
static locale_t ctype_locale;
static pthread_once_t ctype_once = PTHREAD_ONCE_INIT;

static void make_locale(void) {
  ctype_locale = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
  if (!ctype_locale) ctype_locale = newlocale(LC_CTYPE_MASK, "en_US.UTF-8", (locale_t)0);
}

static locale_t wide(void) {
  pthread_once(&ctype_once, make_locale);
  return ctype_locale;
}

bool utf8_have_case(void) { return wide() != (locale_t)0; }

bool utf8_isalpha(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return wide() && iswalpha_l((wint_t)cp, wide()) && !utf8_isdigit(cp);
}

bool utf8_isprintable(uint32_t cp) {
  if (cp < 0x80) return cp >= 0x20 && cp < 0x7F;
  if ((cp >= 0xD800 && cp <= 0xDFFF) || (cp >= 0xE000 && cp <= 0xF8FF) || cp >= 0xF0000)
    return false;   /* surrogates and private use */
  if (utf8_isspace(cp) || in_ranges(formats, NRANGES(formats), cp)) return false;
  return wide() ? iswprint_l((wint_t)cp, wide()) != 0 : true;
}

uint32_t utf8_upper(uint32_t cp) {
  if (cp < 0x80) return cp >= 'a' && cp <= 'z' ? cp - 32 : cp;
  return wide() ? (uint32_t)towupper_l((wint_t)cp, wide()) : cp;
}

uint32_t utf8_lower(uint32_t cp) {
  if (cp < 0x80) return cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
  return wide() ? (uint32_t)towlower_l((wint_t)cp, wide()) : cp;
}

bool utf8_isupper(uint32_t cp) {
  if (cp < 0x80) return cp >= 'A' && cp <= 'Z';
  return wide() && iswupper_l((wint_t)cp, wide());
}

bool utf8_islower(uint32_t cp) {
  if (cp < 0x80) return cp >= 'a' && cp <= 'z';
  return wide() && iswlower_l((wint_t)cp, wide());
}
