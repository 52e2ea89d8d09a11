/*
 * ops_str.c - the methods of str, as Python 3's: a str is a sequence of
 * code points (kept as UTF-8, value.h), so every position, width and
 * count below is in code points, and case and character classes cover
 * non-ASCII text (base/utf8.h).  ASCII text keeps its byte-at-a-time
 * paths.
 *
 * Conventions as in ops.h: receiver and arguments borrowed, results new
 * references or NULL with the error set, errors in Python's words.
 */
#define _GNU_SOURCE   /* memmem */
#include <string.h>

#include "array/array.h"
#include "base/error.h"
#include "base/mem.h"
#include "base/strbuf.h"
#include "base/utf8.h"
#include "lang/ops.h"
#include "lang/ops_impl.h"

#define SLEN(v) (((Str *)(v))->len)

/* ---- arguments -------------------------------------------------------------- */

/* An optional integer argument [v] (absent or None: [dflt]) into [*out]. */
static int int_arg(Value *v, int64_t dflt, int64_t *out) {
  if (!v || v == VAL_NONE) {
    *out = dflt;
    return 0;
  }
  if (!IS_ARRAY(v)) {
    err_set(ERR_TYPE, "'%s' object cannot be interpreted as an integer", val_type_name(v));
    return -1;
  }
  return arr_to_index(v, out);
}

/* A str argument [v] of method [fn], or the TypeError Python gives. */
static int str_arg(const char *fn, Value *v) {
  if (v->type == V_STR) return 0;
  err_set(ERR_TYPE, "%s() argument must be str, not %s", fn, val_type_name(v));
  return -1;
}

/* The optional start and end of find, count, startswith ... (slice
 * positions in code points, negative from the end, clamped) as byte
 * offsets [*a] <= [*b] into [self].  -1 without an error when start lies
 * past the end, where Python finds nothing, not even ''. */
static int span_arg(Value *self, Value *start, Value *end, size_t *a, size_t *b) {
  int64_t n = (int64_t)str_nchars(self), s, e;
  if (int_arg(start, 0, &s) < 0 || int_arg(end, n, &e) < 0) return -2;
  if (s < 0) s = s + n < 0 ? 0 : s + n;
  if (e < 0) e = e + n < 0 ? 0 : e + n;
  if (e > n) e = n;
  if (s > n || s > e) return -1;
  *a = str_offset(self, (size_t)s);
  *b = str_offset(self, (size_t)e);
  return 0;
}

/* ---- searching ------------------------------------------------------------ */

/* The code-point position of byte offset [at] of [self]: O(1) for ASCII. */
static int64_t position(Value *self, size_t at) {
  return (int64_t)(str_is_ascii(self) ? at : utf8_count(str_cstr(self), at));
}

/* The byte offset of the first (or, if [last], the last) [m] bytes [nd]
 * within [h, h + n), or -1. */
static int64_t search(const char *h, size_t n, const char *nd, size_t m, bool last) {
  if (m > n) return -1;
  if (!last) {
    const char *p = m ? memmem(h, n, nd, m) : h;
    return p ? p - h : -1;
  }
  for (size_t i = n - m + 1; i-- > 0;)
    if (!memcmp(h + i, nd, m)) return (int64_t)i;
  return -1;
}

/* find, rfind, index, rindex: the code-point position of [sub] in
 * self[start:end], or -1 (find) / ValueError (index). */
static Value *find_impl(const char *fn, Value *self, const CallArgs *a, bool last, bool raise) {
  Value *sub, *start, *end;
  Value **slots[] = {&sub, &start, &end};
  if (args_bind(fn, a, "sub, start=, end=", slots) < 0 || str_arg(fn, sub) < 0) return NULL;
  size_t lo, hi;
  int rc = span_arg(self, start, end, &lo, &hi);
  if (rc == -2) return NULL;
  int64_t at = rc < 0 ? -1 : search(str_cstr(self) + lo, hi - lo, str_cstr(sub), SLEN(sub), last);
  if (at < 0 && raise) return err_set(ERR_VALUE, "substring not found");
  if (at < 0) return val_int(-1);
  return val_int(position(self, lo + (size_t)at));
}

static Value *s_find(Value *self, const CallArgs *a) { return find_impl("find", self, a, false, false); }
static Value *s_rfind(Value *self, const CallArgs *a) { return find_impl("rfind", self, a, true, false); }
static Value *s_index(Value *self, const CallArgs *a) { return find_impl("index", self, a, false, true); }
static Value *s_rindex(Value *self, const CallArgs *a) { return find_impl("rindex", self, a, true, true); }

static Value *s_count(Value *self, const CallArgs *a) {
  Value *sub, *start, *end;
  Value **slots[] = {&sub, &start, &end};
  if (args_bind("count", a, "sub, start=, end=", slots) < 0 || str_arg("count", sub) < 0) return NULL;
  size_t lo, hi, m = SLEN(sub);
  int rc = span_arg(self, start, end, &lo, &hi);
  if (rc == -2) return NULL;
  if (rc < 0) return val_int(0);
  const char *s = str_cstr(self);
  if (!m) return val_int((int64_t)utf8_count(s + lo, hi - lo) + 1);   /* '' between all */
  int64_t k = 0, at;
  while ((at = search(s + lo, hi - lo, str_cstr(sub), m, false)) >= 0) {
    k++;
    lo += (size_t)at + m;
  }
  return val_int(k);
}

/* startswith/endswith: [p] (a str or a tuple of them) at the start or end
 * of self[start:end]. */
static Value *affix_impl(const char *fn, Value *self, const CallArgs *a, bool at_end) {
  Value *p, *start, *end;
  Value **slots[] = {&p, &start, &end};
  if (args_bind(fn, a, "prefix, start=, end=", slots) < 0) return NULL;
  size_t n = 1, lo, hi;
  Value *const *items = &p;
  if (p->type == V_TUPLE) val_seq(p, &n, &items);
  for (size_t i = 0; i < n; i++)
    if (items[i]->type != V_STR)
      return err_set(ERR_TYPE, "%s first arg must be str or a tuple of str, not %s", fn,
                     val_type_name(items[i]));
  int rc = span_arg(self, start, end, &lo, &hi);
  if (rc == -2) return NULL;
  for (size_t i = 0; rc == 0 && i < n; i++) {
    size_t m = SLEN(items[i]);
    if (m <= hi - lo && !memcmp(str_cstr(self) + (at_end ? hi - m : lo), str_cstr(items[i]), m))
      return val_bool(true);
  }
  return val_bool(false);
}

static Value *s_startswith(Value *self, const CallArgs *a) { return affix_impl("startswith", self, a, false); }
static Value *s_endswith(Value *self, const CallArgs *a) { return affix_impl("endswith", self, a, true); }

/* ---- splitting and joining ------------------------------------------------------ */

/* The byte length of the white space (Python's, utf8_isspace) at [s]. */
static inline size_t space_at(const char *s, size_t n) {
  unsigned char c = n ? (unsigned char)*s : 0;
  if (c < 0x80)   /* ASCII, inline: Python's '\t'-'\r', '\x1c'-'\x1f' and ' ' */
    return n && ((c >= 0x9 && c <= 0xD) || (c >= 0x1C && c <= 0x20));
  size_t j = 0;
  return utf8_isspace(utf8_decode(s, n, &j)) ? j : 0;
}

/* The byte length of the code point at [s]. */
static size_t char_len(const char *s, size_t n) {
  size_t j = 1;
  while (j < n && !utf8_is_lead((unsigned char)s[j])) j++;
  return j;
}

/* Appends [s, s + n) to list [l] as a new str: 0, or -1 with the error. */
static int append_str(Value *l, const char *s, size_t n) {
  Value *v = str_new(s, n);
  return v ? list_append_steal(l, v) : -1;
}

/* split() without sep: runs of white space separate, none at either end. */
static int split_ws(Value *l, const char *s, size_t n, int64_t maxsplit) {
  size_t i = 0, k;
  for (;;) {
    while (i < n && (k = space_at(s + i, n - i))) i += k;
    if (i == n) return 0;
    size_t j = i;
    if (maxsplit-- == 0) return append_str(l, s + i, n - i);
    while (j < n && !space_at(s + j, n - j)) j += char_len(s + j, n - j);
    if (append_str(l, s + i, j - i) < 0) return -1;
    i = j;
  }
}

static Value *s_split(Value *self, const CallArgs *a) {
  Value *sep, *maxsplit;
  Value **slots[] = {&sep, &maxsplit};
  int64_t max;
  if (args_bind("split", a, "sep=, maxsplit=", slots) < 0 || int_arg(maxsplit, -1, &max) < 0)
    return NULL;
  bool ws = !sep || sep == VAL_NONE;
  if (!ws && str_arg("split", sep) < 0) return NULL;
  if (!ws && SLEN(sep) == 0) return err_set(ERR_VALUE, "empty separator");
  Value *l = list_new(4);
  const char *s = str_cstr(self);
  size_t n = SLEN(self), i = 0;
  int rc = !l ? -1 : ws ? split_ws(l, s, n, max) : 0;
  while (l && !ws && rc == 0) {
    int64_t at = max-- == 0 ? -1 : search(s + i, n - i, str_cstr(sep), SLEN(sep), false);
    rc = append_str(l, s + i, at < 0 ? n - i : (size_t)at);
    if (at < 0) break;
    i += (size_t)at + SLEN(sep);
  }
  if (rc < 0 && l) val_decref(l);
  return rc < 0 ? NULL : l;
}

/* str.splitlines(keepends=False): split at Python's ASCII line
 * boundaries (\n, \r, \r\n, \v, \f, \x1c-\x1e); no empty last line. */
static Value *s_splitlines(Value *self, const CallArgs *a) {
  Value *keep;
  Value **slots[] = {&keep};
  if (args_bind("splitlines", a, "keepends=", slots) < 0) return NULL;
  int keepends = keep && keep != VAL_NONE ? val_truth(keep) : 0;
  if (keepends < 0) return NULL;
  Value *l = list_new(4);
  const char *s = str_cstr(self);
  size_t n = SLEN(self), i = 0;
  int rc = l ? 0 : -1;
  while (rc == 0 && i < n) {
    size_t j = i;
    while (j < n && (!s[j] || !strchr("\n\r\v\f\x1c\x1d\x1e", s[j]))) j++;
    size_t end = j < n ? j + 1 + (s[j] == '\r' && j + 1 < n && s[j + 1] == '\n') : n;
    rc = append_str(l, s + i, keepends ? end - i : j - i);
    i = end;
  }
  if (rc < 0 && l) val_decref(l);
  return rc < 0 ? NULL : l;
}

static Value *s_join(Value *self, const CallArgs *a) {
  Value *it;
  Value **slots[] = {&it};
  if (args_bind("join", a, "iterable", slots) < 0) return NULL;
  Value *items = ops_iter_items(it);
  if (!items) return NULL;
  StrBuf b = {0};
  for (size_t i = 0; i < list_len(items); i++) {
    Value *s = list_get(items, i);
    if (s->type != V_STR) {
      err_set(ERR_TYPE, "sequence item %zu: expected str instance, %s found", i, val_type_name(s));
      val_decref(items);
      sbuf_free(&b);
      return NULL;
    }
    if (i) sbuf_add(&b, str_cstr(self), SLEN(self));
    sbuf_add(&b, str_cstr(s), SLEN(s));
  }
  val_decref(items);
  return str_take(&b);
}

/* partition/rpartition: (before, sep, after) around the first or last
 * [sep]; not found: (self, '', '') or ('', '', self). */
static Value *partition_impl(const char *fn, Value *self, const CallArgs *a, bool last) {
  Value *sep;
  Value **slots[] = {&sep};
  if (args_bind(fn, a, "sep", slots) < 0 || str_arg(fn, sep) < 0) return NULL;
  if (!SLEN(sep)) return err_set(ERR_VALUE, "empty separator");
  const char *s = str_cstr(self);
  size_t n = SLEN(self), m = SLEN(sep);
  int64_t at = search(s, n, str_cstr(sep), m, last);
  size_t cut = at >= 0 ? (size_t)at : last ? 0 : n;
  Value *t = tuple_new(3);
  if (!t) return NULL;
  tuple_set_steal(t, 0, str_new(s, cut));
  tuple_set_steal(t, 1, str_new(str_cstr(sep), at >= 0 ? m : 0));
  tuple_set_steal(t, 2, at >= 0 ? str_new(s + cut + m, n - cut - m) : str_new(s + cut, n - cut));
  for (int i = 0; i < 3; i++)
    if (!tuple_get(t, (size_t)i)) {
      val_decref(t);
      return NULL;
    }
  return t;
}

static Value *s_partition(Value *self, const CallArgs *a) { return partition_impl("partition", self, a, false); }
static Value *s_rpartition(Value *self, const CallArgs *a) { return partition_impl("rpartition", self, a, true); }

/* Bytes str.replace searches between two looks at Ctrl-C: replacing in a
 * gigabyte string is seconds of work. */
#define REPLACE_WINDOW ((size_t)1 << 20)

/* Where the [ol] > 0 bytes [o] next occur in the [n] bytes [h], searched
 * a window at a time (each long enough to find any match that starts in
 * its first REPLACE_WINDOW bytes) with a look at Ctrl-C before each;
 * -1 none, -2 interrupted (the error set). */
static int64_t search_windows(const char *h, size_t n, const char *o, size_t ol) {
  for (size_t i = 0;; i += REPLACE_WINDOW) {
    if (shm_interrupt_pending()) return err_set(ERR_INTERRUPT, "interrupted"), -2;
    size_t w = n - i < REPLACE_WINDOW + ol ? n - i : REPLACE_WINDOW + ol - 1;
    int64_t at = search(h + i, w, o, ol, false);
    if (at >= 0) return (int64_t)i + at;
    if (w == n - i) return -1;
  }
}

static Value *s_replace(Value *self, const CallArgs *a) {
  Value *old, *new_, *count;
  Value **slots[] = {&old, &new_, &count};
  int64_t max;
  if (args_bind("replace", a, "old, new, count=", slots) < 0 || int_arg(count, -1, &max) < 0)
    return NULL;
  if (old->type != V_STR || new_->type != V_STR) return err_set(ERR_TYPE, "replace() arguments must be str");
  size_t ol = SLEN(old), n = SLEN(self), i = 0;
  const char *s = str_cstr(self);
  StrBuf b = {0};
  for (; max != 0; max--) {
    int64_t at = ol ? search_windows(s + i, n - i, str_cstr(old), ol) : 0;
    if (at == -2) {
      sbuf_free(&b);
      return NULL;
    }
    if (at < 0 || (!ol && i > n)) break;
    sbuf_add(&b, s + i, (size_t)at);
    sbuf_add(&b, str_cstr(new_), SLEN(new_));
    i += (size_t)at + ol;
    if (!ol && i < n) {   /* '' matches between characters: copy one */
      size_t j = i;
      utf8_decode(s, n, &j);
      sbuf_add(&b, s + i, j - i);
      i = j;
    } else if (!ol) {
      i = n + 1;
    }
  }
  if (i < n) sbuf_add(&b, s + i, n - i);
  return str_take(&b);
}

/* ---- stripping and padding ------------------------------------------------------ */

/* Whether the code point at [s] (of [n] bytes) is one to strip: white
 * space when [chars] is NULL, else one of [chars]'s code points.  Its
 * byte length into [*k]. */
static bool strippable(const char *s, size_t n, Value *chars, size_t *k) {
  size_t j = 0;
  uint32_t cp = utf8_decode(s, n, &j);
  *k = j;
  if (!chars) return utf8_isspace(cp);
  return memmem(str_cstr(chars), SLEN(chars), s, j) != NULL;
}

/* [self] without the code points of [chars] (NULL: white space) at its
 * left ([ends] 1), right (2) or both ends (3). */
static Value *strip_ends(Value *self, Value *chars, int ends) {
  const char *s = str_cstr(self);
  size_t lo = 0, hi = SLEN(self), k;
  while ((ends & 1) && lo < hi && strippable(s + lo, hi - lo, chars, &k)) lo += k;
  while ((ends & 2) && hi > lo) {
    size_t c = hi - 1;
    while (c > lo && !utf8_is_lead((unsigned char)s[c])) c--;
    if (!strippable(s + c, hi - c, chars, &k)) break;
    hi = c;
  }
  return str_new(s + lo, hi - lo);
}

Value *ops_str_strip(Value *s) { return strip_ends(s, NULL, 3); }

/* strip/lstrip/rstrip: [ends] as strip_ends's. */
static Value *strip_impl(const char *fn, Value *self, const CallArgs *a, int ends) {
  Value *chars;
  Value **slots[] = {&chars};
  if (args_bind(fn, a, "chars=", slots) < 0) return NULL;
  if (chars == VAL_NONE) chars = NULL;
  if (chars && chars->type != V_STR) return err_set(ERR_TYPE, "%s arg must be None or str", fn);
  return strip_ends(self, chars, ends);
}

static Value *s_strip(Value *self, const CallArgs *a) { return strip_impl("strip", self, a, 3); }
static Value *s_lstrip(Value *self, const CallArgs *a) { return strip_impl("lstrip", self, a, 1); }
static Value *s_rstrip(Value *self, const CallArgs *a) { return strip_impl("rstrip", self, a, 2); }

/* Appends [n] copies of the [k] bytes at [fill]. */
static void add_fill(StrBuf *b, const char *fill, size_t k, int64_t n) {
  for (int64_t i = 0; i < n; i++) sbuf_add(b, fill, k);
}

/* center/ljust/rjust: [self] padded to [width] code points with one
 * fill character, [align] '^', '<' or '>' as Python places the odd one. */
static Value *pad_impl(const char *fn, Value *self, const CallArgs *a, char align) {
  Value *width, *fillchar;
  Value **slots[] = {&width, &fillchar};
  int64_t w;
  if (args_bind(fn, a, "width, fillchar=", slots) < 0 || int_arg(width, 0, &w) < 0) return NULL;
  if (fillchar && (fillchar->type != V_STR || str_nchars(fillchar) != 1))
    return err_set(ERR_TYPE, "The fill character must be exactly one character long");
  const char *fill = fillchar ? str_cstr(fillchar) : " ";
  size_t k = fillchar ? SLEN(fillchar) : 1;
  int64_t n = (int64_t)str_nchars(self), pad = w > n ? w - n : 0;
  if (pad > (1 << 24)) return err_set(ERR_MEMORY, "padded string is too long");
  int64_t left = align == '<' ? 0 : align == '>' ? pad : pad / 2 + (pad & w & 1);
  StrBuf b = {0};
  add_fill(&b, fill, k, left);
  sbuf_add(&b, str_cstr(self), SLEN(self));
  add_fill(&b, fill, k, pad - left);
  return str_take(&b);
}

static Value *s_center(Value *self, const CallArgs *a) { return pad_impl("center", self, a, '^'); }
static Value *s_ljust(Value *self, const CallArgs *a) { return pad_impl("ljust", self, a, '<'); }
static Value *s_rjust(Value *self, const CallArgs *a) { return pad_impl("rjust", self, a, '>'); }

static Value *s_zfill(Value *self, const CallArgs *a) {
  Value *width;
  Value **slots[] = {&width};
  int64_t w;
  if (args_bind("zfill", a, "width", slots) < 0 || int_arg(width, 0, &w) < 0) return NULL;
  int64_t n = (int64_t)str_nchars(self), pad = w > n ? w - n : 0;
  if (pad > (1 << 24)) return err_set(ERR_MEMORY, "padded string is too long");
  const char *s = str_cstr(self);
  size_t sign = SLEN(self) && (s[0] == '+' || s[0] == '-');
  StrBuf b = {0};
  sbuf_add(&b, s, sign);
  add_fill(&b, "0", 1, pad);
  sbuf_add(&b, s + sign, SLEN(self) - sign);
  return str_take(&b);
}

/* ---- case ---------------------------------------------------------------------- */

/* 0 when the case and letters of [self] are known: ASCII text, or the C
 * library's UTF-8 locale is there (utf8_have_case); else -1 with an
 * error, rather than an answer that takes 'é' for a non-letter. */
static int case_known(Value *self) {
  if (str_is_ascii(self) || utf8_have_case()) return 0;
  err_set(ERR_VALUE, "the case and letters of non-ASCII text need the C library's C.UTF-8 "
          "locale, which this system lacks");
  return -1;
}

typedef enum { TO_UPPER, TO_LOWER, TO_TITLE, TO_SWAP } CaseOp;

/* Appends [cp] under [op]: 'ß' has no one-character upper case, and
 * becomes "SS" (upper) or "Ss" (title) as in Python. */
static void add_case(StrBuf *b, uint32_t cp, CaseOp op) {
  if (op == TO_SWAP) op = utf8_isupper(cp) ? TO_LOWER : utf8_islower(cp) ? TO_UPPER : op;
  char u[4];
  if (cp == 0xDF && (op == TO_UPPER || op == TO_TITLE)) {
    sbuf_add(b, op == TO_UPPER ? "SS" : "Ss", 2);
    return;
  }
  uint32_t r = op == TO_UPPER || op == TO_TITLE ? utf8_upper(cp) : op == TO_LOWER ? utf8_lower(cp) : cp;
  sbuf_add(b, u, (size_t)utf8_encode(r, u));
}

/* Whether [cp] has case (Python's "cased" characters). */
static bool is_cased(uint32_t cp) { return utf8_isupper(cp) || utf8_islower(cp); }

/* upper, lower, swapcase, title ([word] the per-word rule) and
 * capitalize ([first] only the first character up, the rest down). */
static Value *case_impl(Value *self, CaseOp op, bool first) {
  if (case_known(self) < 0) return NULL;
  const char *s = str_cstr(self);
  size_t n = SLEN(self);
  StrBuf b = {0};
  if (str_is_ascii(self) && (op == TO_UPPER || op == TO_LOWER)) {
    /* The common case, a byte at a time, into a buffer: a Str's hash is
     * made with it, so a Str is never changed after (the old in-place
     * upper() left the hash of its input: 'ABC' == 'abc'.upper() was False). */
    char *buf = shm_malloc(n + 1);
    if (!buf) return err_nomem();
    char lo = op == TO_UPPER ? 'a' : 'A';
    for (size_t i = 0; i < n; i++)
      buf[i] = (char)(s[i] >= lo && s[i] <= lo + 25 ? s[i] ^ 0x20 : s[i]);
    Value *r = str_new(buf, n);
    shm_free(buf);
    return r;
  }
  bool prev_cased = false, start = true;
  for (size_t i = 0; i < n; start = false) {
    uint32_t cp = utf8_decode(s, n, &i);
    CaseOp o = first ? (start ? TO_TITLE : TO_LOWER) : op == TO_TITLE && prev_cased ? TO_LOWER : op;
    prev_cased = is_cased(cp);
    add_case(&b, cp, o);
  }
  return str_take(&b);
}

static Value *s_upper(Value *self, const CallArgs *a) { return case_impl(self, TO_UPPER, false); }
static Value *s_lower(Value *self, const CallArgs *a) { return case_impl(self, TO_LOWER, false); }
static Value *s_swapcase(Value *self, const CallArgs *a) { return case_impl(self, TO_SWAP, false); }
static Value *s_title(Value *self, const CallArgs *a) { return case_impl(self, TO_TITLE, false); }
static Value *s_capitalize(Value *self, const CallArgs *a) { return case_impl(self, TO_TITLE, true); }

/* ---- character classes ------------------------------------------------------------ */

/* Whether [self] is non-empty and [is] holds for each of its code points. */
static Value *all_chars(Value *self, bool (*is)(uint32_t)) {
  if (is != utf8_isdigit && is != utf8_isspace && case_known(self) < 0) return NULL;
  const char *s = str_cstr(self);
  size_t n = SLEN(self);
  for (size_t i = 0; i < n;)
    if (!is(utf8_decode(s, n, &i))) return val_bool(false);
  return val_bool(n > 0);
}

static bool is_alnum(uint32_t cp) { return utf8_isalpha(cp) || utf8_isdigit(cp); }

static Value *s_isalpha(Value *self, const CallArgs *a) { return all_chars(self, utf8_isalpha); }
static Value *s_isdigit(Value *self, const CallArgs *a) { return all_chars(self, utf8_isdigit); }
static Value *s_isspace(Value *self, const CallArgs *a) { return all_chars(self, utf8_isspace); }
static Value *s_isalnum(Value *self, const CallArgs *a) { return all_chars(self, is_alnum); }

/* isupper/islower: some cased code point, and none of the other case. */
static Value *case_test(Value *self, bool (*is)(uint32_t), bool (*other)(uint32_t)) {
  if (case_known(self) < 0) return NULL;
  const char *s = str_cstr(self);
  size_t n = SLEN(self);
  bool cased = false;
  for (size_t i = 0; i < n;) {
    uint32_t cp = utf8_decode(s, n, &i);
    if (other(cp) && !is(cp)) return val_bool(false);
    cased |= is(cp);
  }
  return val_bool(cased);
}

static Value *s_isupper(Value *self, const CallArgs *a) { return case_test(self, utf8_isupper, utf8_islower); }
static Value *s_islower(Value *self, const CallArgs *a) { return case_test(self, utf8_islower, utf8_isupper); }

static Value *s_format(Value *self, const CallArgs *a) { return ops_format(str_cstr(self), a); }

const Method ops_str_methods[] = {
  {"format", s_format}, {"join", s_join}, {"split", s_split}, {"splitlines", s_splitlines},
  {"partition", s_partition},
  {"rpartition", s_rpartition}, {"replace", s_replace}, {"find", s_find}, {"rfind", s_rfind},
  {"index", s_index}, {"rindex", s_rindex}, {"count", s_count}, {"startswith", s_startswith},
  {"endswith", s_endswith}, {"strip", s_strip}, {"lstrip", s_lstrip}, {"rstrip", s_rstrip},
  {"center", s_center}, {"ljust", s_ljust}, {"rjust", s_rjust}, {"zfill", s_zfill},
  {"upper", s_upper}, {"lower", s_lower}, {"swapcase", s_swapcase}, {"title", s_title},
  {"capitalize", s_capitalize}, {"isalpha", s_isalpha}, {"isdigit", s_isdigit},
  {"isspace", s_isspace}, {"isalnum", s_isalnum}, {"isupper", s_isupper},
  {"islower", s_islower}, {NULL, NULL}};
