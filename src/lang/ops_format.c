/*
 * ops_format.c - Python's string formatting: str.format's replacement
 * fields and format-spec mini-language (also an f-string's, whose text the
 * lexer turns into a str.format call).
 */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array/array.h"
#include "array/print.h"
#include "base/error.h"
#include "base/mem.h"
#include "base/strbuf.h"
#include "base/utf8.h"
#include "lang/ops.h"

/* The spec is the user's, translated to a printf format built here from
 * checked characters, so the non-literal formats below are intended. */
#pragma GCC diagnostic ignored "-Wformat-nonliteral"

/* Appends text [s] formatted by [spec]: Python's [[fill]align][width]
 * [.precision] of str, widths and precision in code points; [deflt] is
 * the alignment without one ('<' for text, '>' for numbers).  The
 * precision cuts only a str [v] ([s] is its text, or another value's). */
static int format_text(StrBuf *b, Value *v, Value *s, const char *spec, char deflt) {
  const char *w = spec, *fill = " ";
  size_t fl = 1, k = 1;
  while (w[0] && w[k] && !utf8_is_lead((unsigned char)w[k])) k++;
  if (w[0] && w[k] && strchr("<>^", w[k])) {   /* a fill character before the align */
    fill = w;
    fl = k;
    w += k;
  }
  char align = *w && strchr("<>^", *w) ? *w++ : deflt;
  char *end;
  long width = strtol(w, &end, 10), prec = -1;
  if (*end == '.') prec = strtol(end + 1, &end, 10);
  if (width > 100000) {
    err_set(ERR_VALUE, "format width %ld is too large", width);
    return -1;
  }
  size_t len = str_nchars(s), shown = ((Str *)s)->len;   /* widths count code points */
  if (v->type == V_STR && prec >= 0 && (size_t)prec < len) {
    shown = str_offset(s, (size_t)prec);
    len = (size_t)prec;
  }
  size_t pad = width > 0 && (size_t)width > len ? (size_t)width - len : 0;
  size_t left = align == '<' ? 0 : align == '^' ? pad / 2 : pad;
  for (size_t i = 0; i < left; i++) sbuf_add(b, fill, fl);
  sbuf_add(b, str_cstr(s), shown);
  for (size_t i = left; i < pad; i++) sbuf_add(b, fill, fl);
  return 0;
}

/* A numeric format spec, Python's mini-language:
 * [[fill]align][sign][z][#][0][width][grouping][.precision][type]. */
typedef struct NumSpec {
  char fill[8];        /* one code point */
  char align;          /* '<' '>' '^' '=', or 0 */
  char sign;           /* '+' '-' ' ' */
  bool alt, zero, negzero;
  long width, prec;    /* -1: none */
  char group;          /* ',' '_' or 0 */
  char type;           /* 0 or one of "bcdeEfFgGnosxX%" */
} NumSpec;

static int parse_numspec(const char *w, NumSpec *ns) {
  *ns = (NumSpec){.fill = " ", .sign = '-', .width = -1, .prec = -1};
  size_t k = 1;
  while (w[0] && w[k] && !utf8_is_lead((unsigned char)w[k])) k++;
  if (w[0] && w[k] && strchr("<>=^", w[k]) && k < sizeof ns->fill) {
    memcpy(ns->fill, w, k);
    ns->fill[k] = 0;
    ns->align = w[k];
    w += k + 1;
  } else if (*w && strchr("<>=^", *w)) {
    ns->align = *w++;
  }
  if (*w && strchr("+- ", *w)) ns->sign = *w++;
  if (*w == 'z') ns->negzero = true, w++;
  if (*w == '#') ns->alt = true, w++;
  if (*w == '0') ns->zero = true, w++;
  char *end;
  if (*w >= '0' && *w <= '9') ns->width = strtol(w, &end, 10), w = end;
  if (*w == ',' || *w == '_') ns->group = *w++;
  if (*w == '.') {
    if (w[1] < '0' || w[1] > '9') return -1;
    ns->prec = strtol(w + 1, &end, 10);
    w = end;
  }
  if (*w && strchr("bcdeEfFgGnosxX%", *w)) ns->type = *w++;
  if (*w || ns->width > 100000 || ns->prec > 1000) return -1;
  if (ns->zero && !ns->align) {   /* '0': zero padding after the sign */
    strcpy(ns->fill, "0");
    ns->align = '=';
  }
  return 0;
}

/* Digits [d] (n of them) with [sep] every [every] from the right. */
static void add_grouped(StrBuf *b, const char *d, size_t n, char sep, int every) {
  for (size_t i = 0; i < n; i++) {
    sbuf_add(b, d + i, 1);
    size_t left = n - 1 - i;
    if (sep && left && left % (size_t)every == 0) sbuf_add(b, &sep, 1);
  }
}

/* Python's 'g' (and the empty type, [repr_like]) of |x| with precision
 * [p]: significant digits, trailing zeros dropped (not with '#'); the
 * empty type keeps one digit after a fixed point's '.'.  Into [out]. */
static void format_general(char *out, size_t cap, double x, long p, bool alt, bool upper, bool repr_like) {
  long q = p == 0 ? 1 : p;
  char tmp[512];
  snprintf(tmp, sizeof tmp, "%.*e", (int)(q - 1), x);   /* the exponent after rounding */
  int exp = atoi(strchr(tmp, 'e') + 1);
  bool sci = exp < -4 || exp >= (repr_like && p == 0 ? 0 : q);
  if (sci) snprintf(out, cap, "%.*e", (int)(q - 1), x);
  else snprintf(out, cap, "%.*f", (int)(q - 1 - exp), x);
  if (!alt) {   /* drop trailing zeros of the fraction */
    char *e = strchr(out, 'e'), mant[512], rest[64] = "";
    if (e) {
      snprintf(rest, sizeof rest, "%s", e);
      *e = 0;
    }
    snprintf(mant, sizeof mant, "%s", out);
    if (strchr(mant, '.')) {
      size_t n = strlen(mant);
      while (n && mant[n - 1] == '0') mant[--n] = 0;
      if (n && mant[n - 1] == '.') mant[--n] = 0;
    }
    if (repr_like && !sci && !strchr(mant, '.')) strcat(mant, ".0");
    snprintf(out, cap, "%s%s", mant, rest);
  }
  if (upper)
    for (char *c = out; *c; c++) *c = (char)(*c == 'e' ? 'E' : *c);
}

/* Formats the number [v] (one element) by [ns] into [b]: the digits by
 * type, then the sign, grouping and padding, as Python's format(). */
static int format_number(StrBuf *b, Value *v, const NumSpec *ns) {
  Array *a = AS_ARRAY(v);
  bool is_int = !dt_is_float(a->dtype) && a->dtype != DT_BOOL;
  char type = ns->type ? ns->type : is_int || a->dtype == DT_BOOL ? 'd' : 0;
  if (type == 'n') type = is_int ? 'd' : 'g';
  double x = a->ndim == 0 ? arr_host_f64(a) : arr_get_f64(a, 0);   /* a Python float's double */
  bool int_type = type && strchr("bcdoxX", type) != NULL;
  if (int_type && !is_int && a->dtype != DT_BOOL) {
    err_set(ERR_VALUE, "Unknown format code '%c' for object of type 'float'", type);
    return -1;
  }
  if (int_type && ns->prec >= 0) {
    err_set(ERR_VALUE, "Precision not allowed in integer format specifier");
    return -1;
  }
  char body[600];
  bool neg;
  if (int_type) {
    long long n = (long long)arr_get_i64(a, 0);
    neg = n < 0;
    unsigned long long u = neg ? 0ull - (unsigned long long)n : (unsigned long long)n;
    if (type == 'c') {
      snprintf(body, sizeof body, "%c", (int)u);
    } else if (type == 'b') {
      char rev[70];
      size_t k = 0;
      do rev[k++] = (char)('0' + (u & 1)); while (u >>= 1);
      for (size_t i = 0; i < k; i++) body[i] = rev[k - 1 - i];
      body[k] = 0;
    } else {
      snprintf(body, sizeof body, type == 'o' ? "%llo" : type == 'x' ? "%llx" : type == 'X' ? "%llX" : "%llu", u);
    }
  } else {
    neg = signbit(x) && !(ns->negzero && x == 0);
    double ax = fabs(x);
    long p = ns->prec;
    if (isnan(x) || isinf(x)) {
      snprintf(body, sizeof body, "%s", isnan(x) ? "nan" : "inf");
      for (int i = 0; type && strchr("EFG", type) && i < 3; i++) body[i] = (char)toupper(body[i]);
      if (type == '%') strcat(body, "%");
    } else if (type == 'f' || type == 'F' || type == '%') {
      snprintf(body, sizeof body, ns->alt ? "%#.*f" : "%.*f", (int)(p < 0 ? 6 : p), type == '%' ? ax * 100 : ax);
      if (type == '%') strcat(body, "%");
    } else if (type == 'e' || type == 'E') {
      const char *f = type == 'E' ? (ns->alt ? "%#.*E" : "%.*E") : (ns->alt ? "%#.*e" : "%.*e");
      snprintf(body, sizeof body, f, (int)(p < 0 ? 6 : p), ax);
    } else if (type == 'g' || type == 'G') {
      format_general(body, sizeof body, ax, p < 0 ? 6 : p, ns->alt, type == 'G', false);
    } else if (p >= 0) {   /* no type, a precision: 'g' keeping a digit after '.' */
      format_general(body, sizeof body, ax, p, ns->alt, false, true);
    } else {   /* no type, no precision: str() */
      Value *s = val_str(v);
      if (!s) return -1;
      snprintf(body, sizeof body, "%s", str_cstr(s) + (str_cstr(s)[0] == '-'));
      val_decref(s);
    }
  }
  /* the integer part's digits: grouped; a prefix for '#' */
  const char *prefix = !ns->alt || !int_type ? ""
                       : type == 'b' ? "0b" : type == 'o' ? "0o" : type == 'x' ? "0x" : type == 'X' ? "0X" : "";
  StrBuf num = {0};
  sbuf_puts(&num, prefix);
  size_t ndig = strspn(body, "0123456789abcdefABCDEF");
  if (!int_type) ndig = strspn(body, "0123456789");
  add_grouped(&num, body, ndig, ns->group, int_type && type != 'd' ? 4 : 3);
  sbuf_puts(&num, body + ndig);
  const char *sign = neg ? "-" : ns->sign == '+' ? "+" : ns->sign == ' ' ? " " : "";
  size_t len = strlen(sign) + num.len;   /* ASCII: bytes are code points */
  size_t pad = ns->width > 0 && (size_t)ns->width > len ? (size_t)ns->width - len : 0;
  char align = ns->align ? ns->align : '>';
  size_t left = align == '<' || align == '=' ? 0 : align == '^' ? pad / 2 : pad;
  size_t fl = strlen(ns->fill);
  for (size_t i = 0; i < left; i++) sbuf_add(b, ns->fill, fl);
  sbuf_puts(b, sign);
  for (size_t i = 0; align == '=' && i < pad; i++) sbuf_add(b, ns->fill, fl);
  sbuf_add(b, num.data ? num.data : "", num.len);
  for (size_t i = left; align != '=' && i < pad; i++) sbuf_add(b, ns->fill, fl);
  sbuf_free(&num);
  return 0;
}

/* Formats [v] with the format spec [spec] ("", ".3f", ">8", "d", "e"). */
static int format_one(StrBuf *b, Value *v, const char *spec) {
  if (strlen(spec) > 40) {
    err_set(ERR_VALUE, "Invalid format specifier '%s' (too long)", spec);
    return -1;
  }
  if (!*spec || !ops_is_array(v) || !IS_ARRAY(v) || AS_ARRAY(v)->size != 1) {
    Value *s = val_str(v);
    int rc = s ? format_text(b, v, s, spec, ops_is_array(v) ? '>' : '<') : -1;
    if (s) val_decref(s);
    return rc;
  }
  NumSpec ns;
  if (parse_numspec(spec, &ns) < 0 || ns.type == 's') {
    err_set(ERR_VALUE, "Invalid format specifier '%s'", spec);
    return -1;
  }
  return format_number(b, v, &ns);
}

/* The value a replacement field names: "" the next positional argument,
 * digits an explicit index, anything else a keyword argument. */
static Value *format_field(const char *field, const CallArgs *a, int *next) {
  if (!field[0] || (field[0] >= '0' && field[0] <= '9')) {
    int idx = field[0] ? atoi(field) : (*next)++;
    if (idx < 0 || idx >= a->nargs)
      return err_set(ERR_INDEX, "Replacement index %d out of range for positional args tuple", idx);
    return a->args[idx];
  }
  for (int k = 0; k < a->nkw; k++)
    if (strcmp(a->kwnames[k], field) == 0) return a->kwvals[k];
  return err_set(ERR_NAME, "format: no keyword argument '%s'", field);
}

Value *ops_format(const char *f, const CallArgs *a) {
  StrBuf b = {0};
  int next = 0;
  for (const char *p = f; *p; p++) {
    if ((*p == '{' && p[1] == '{') || (*p == '}' && p[1] == '}')) {
      sbuf_add(&b, p, 1);
      p++;
      continue;
    }
    if (*p != '{') {
      sbuf_add(&b, p, 1);
      continue;
    }
    const char *end = strchr(p, '}');
    if (!end) {
      sbuf_free(&b);
      return err_set(ERR_VALUE, "Single '{' encountered in format string");
    }
    char field[128];
    snprintf(field, sizeof field, "%.*s", (int)(end - p - 1), p + 1);
    char *colon = strchr(field, ':');
    const char *spec = "";
    if (colon) {
      *colon = 0;
      spec = colon + 1;
    }
    char *bang = strchr(field, '!');   /* a conversion: !r repr, !s str, !a ascii */
    char conv = bang ? bang[1] : 0;
    if (bang) *bang = 0;
    if (bang && (!strchr("rsa", conv) || !conv || bang[2])) {
      sbuf_free(&b);
      return err_set(ERR_VALUE, "Unknown conversion specifier %s", bang + 1);
    }
    Value *v = format_field(field, a, &next);
    Value *cv = v && conv ? (conv == 'r' ? val_repr(v) : conv == 'a' ? val_ascii(v) : val_str(v)) : NULL;
    int rc = v && (!conv || cv) ? format_one(&b, cv ? cv : v, spec) : -1;
    if (cv) val_decref(cv);
    if (rc < 0) {
      sbuf_free(&b);
      return NULL;
    }
    p = end;
  }
  return str_take(&b);
}

/* ==== printf-style formatting: fmt % values ================================ */

/* One conversion specification: %[(key)][flags][width][.precision]type. */
typedef struct PctSpec {
  bool left, plus, space, alt, zero;
  long width, prec;   /* -1: none */
  char type;
} PctSpec;

/* [sign], [prefix] and [digits] laid out in the spec's width: '-' pads
 * on the right, '0' with zeros after the sign and prefix, else spaces on
 * the left.  Widths count code points ([n] of them in the three). */
static void pct_lay_out(StrBuf *b, const PctSpec *ps, const char *sign, const char *prefix,
                        const char *digits, size_t nbytes, size_t n) {
  size_t pad = ps->width > 0 && (size_t)ps->width > n ? (size_t)ps->width - n : 0;
  for (size_t i = 0; !ps->left && !ps->zero && i < pad; i++) sbuf_add(b, " ", 1);
  sbuf_puts(b, sign);
  sbuf_puts(b, prefix);
  for (size_t i = 0; !ps->left && ps->zero && i < pad; i++) sbuf_add(b, "0", 1);
  sbuf_add(b, digits, nbytes);
  for (size_t i = 0; ps->left && i < pad; i++) sbuf_add(b, " ", 1);
}

static const char *pct_sign(const PctSpec *ps, bool neg) {
  return neg ? "-" : ps->plus ? "+" : ps->space ? " " : "";
}

/* The one number [v] is, for a conversion of [type]: its array, or NULL
 * with Python's TypeError (a traced value has no number yet). */
static Array *pct_number(Value *v, char type, bool integral) {
  if (v->type == V_TRACER)
    return err_set(ERR_TYPE, "%%%c format needs a concrete value, but its argument is traced "
                   "under jit", type);
  if (!IS_ARRAY(v)) {
    if (integral && type != 'd' && type != 'i' && type != 'u')
      return err_set(ERR_TYPE, "%%%c format: an integer is required, not %s", type, val_type_name(v));
    if (integral)
      return err_set(ERR_TYPE, "%%%c format: a real number is required, not %s", type, val_type_name(v));
    return err_set(ERR_TYPE, "must be real number, not %s", val_type_name(v));
  }
  if (AS_ARRAY(v)->size != 1)
    return err_set(ERR_TYPE, "only length-1 arrays can be converted to Python scalars");
  return AS_ARRAY(v);
}

/* %d %i %u %o %x %X: a float is truncated for the decimal ones, as
 * int() does; the precision is a least number of digits (one at least,
 * where C's "%.0d" of 0 has none). */
static int pct_int(StrBuf *b, const PctSpec *ps, Value *v) {
  bool decimal = strchr("diu", ps->type) != NULL;
  Array *a = pct_number(v, ps->type, true);
  if (!a) return -1;
  long long n;
  if (dt_is_float(a->dtype)) {
    if (!decimal) {
      err_set(ERR_TYPE, "%%%c format: an integer is required, not float", ps->type);
      return -1;
    }
    int64_t t;
    if (ops_float_to_int(a->ndim == 0 ? arr_host_f64(a) : arr_get_f64(a, 0), &t) < 0) return -1;
    n = t;
  } else {
    n = (long long)arr_get_i64(a, 0);
  }
  unsigned long long u = n < 0 ? 0ull - (unsigned long long)n : (unsigned long long)n;
  char digits[96];
  int len = snprintf(digits, sizeof digits, decimal ? "%.*llu" : ps->type == 'o' ? "%.*llo"
                     : ps->type == 'x' ? "%.*llx" : "%.*llX", (int)(ps->prec < 1 ? 1 : ps->prec), u);
  if (len < 0 || (size_t)len >= sizeof digits) {
    err_set(ERR_VALUE, "precision too large in format");
    return -1;
  }
  const char *prefix = !ps->alt || decimal ? "" : ps->type == 'o' ? "0o" : ps->type == 'x' ? "0x" : "0X";
  const char *sign = pct_sign(ps, n < 0);
  pct_lay_out(b, ps, sign, prefix, digits, (size_t)len, strlen(sign) + strlen(prefix) + (size_t)len);
  return 0;
}

/* %e %E %f %F %g %G: C's digits for |x| (Python's are the same), the
 * sign and padding as Python lays them out (zeros pad inf and nan too;
 * a NaN has no sign). */
static int pct_float(StrBuf *b, const PctSpec *ps, Value *v) {
  Array *a = pct_number(v, ps->type, false);
  if (!a) return -1;
  double x = a->ndim == 0 ? arr_host_f64(a) : arr_get_f64(a, 0);
  char f[16];
  snprintf(f, sizeof f, "%%%s.*%c", ps->alt ? "#" : "", ps->type);
  int prec = (int)(ps->prec < 0 ? 6 : ps->prec);
  int len = snprintf(NULL, 0, f, prec, fabs(x));
  char *digits = len >= 0 ? shm_malloc((size_t)len + 1) : NULL;
  if (!digits) {
    err_nomem();
    return -1;
  }
  snprintf(digits, (size_t)len + 1, f, prec, fabs(x));
  const char *sign = pct_sign(ps, signbit(x) && !isnan(x));
  pct_lay_out(b, ps, sign, "", digits, (size_t)len, strlen(sign) + (size_t)len);
  shm_free(digits);
  return 0;
}

/* %s %r %a: str(), repr(), ascii(), cut to the precision; %c: one code
 * point from an int or a one-character str (no precision). */
static int pct_text(StrBuf *b, const PctSpec *ps, Value *v) {
  Value *s;
  if (ps->type == 'c') {
    if (v->type == V_STR) {
      if (str_nchars(v) != 1) return err_set(ERR_TYPE, "%%c requires int or char"), -1;
      s = val_incref(v);
    } else {
      if (!IS_ARRAY(v) || AS_ARRAY(v)->size != 1 || dt_is_float(AS_ARRAY(v)->dtype))
        return err_set(ERR_TYPE, "%%c requires int or char"), -1;
      int64_t cp = arr_get_i64(AS_ARRAY(v), 0);
      if (cp < 0 || cp > 0x10ffff) return err_set(ERR_OVERFLOW, "%%c arg not in range(0x110000)"), -1;
      char u[4];
      s = str_new(u, (size_t)utf8_encode((uint32_t)cp, u));
    }
  } else {
    s = ps->type == 'r' ? val_repr(v) : ps->type == 'a' ? val_ascii(v) : val_str(v);
  }
  if (!s) return -1;
  size_t n = str_nchars(s), nbytes = ((Str *)s)->len;
  if (ps->type != 'c' && ps->prec >= 0 && (size_t)ps->prec < n) {
    nbytes = str_offset(s, (size_t)ps->prec);
    n = (size_t)ps->prec;
  }
  PctSpec spaces = *ps;
  spaces.zero = false;   /* '0' pads numbers only */
  pct_lay_out(b, &spaces, "", "", str_cstr(s), nbytes, n);
  val_decref(s);
  return 0;
}

/* The arguments: a tuple's items, else the one value (a dict is also
 * the mapping %(key) reads; a dict or a list never leaves arguments
 * unconverted, as in CPython, where both are mappings). */
typedef struct PctArgs {
  Value *const *items;
  size_t n, next;
  Value *mapping;
  bool any_mapping;
} PctArgs;

static Value *pct_next(PctArgs *pa) {
  if (pa->next >= pa->n) return err_set(ERR_TYPE, "not enough arguments for format string");
  return pa->items[pa->next++];
}

/* A '*' width or precision: the next argument, an int. */
static int pct_star(PctArgs *pa, long *out) {
  Value *v = pct_next(pa);
  if (!v) return -1;
  if (!IS_ARRAY(v) || AS_ARRAY(v)->size != 1 || AS_ARRAY(v)->ndim != 0 ||
      dt_is_float(AS_ARRAY(v)->dtype))
    return err_set(ERR_TYPE, "* wants int"), -1;
  *out = (long)arr_get_i64(AS_ARRAY(v), 0);
  return 0;
}

/* %(key): the mapping's value for the key that ends at the matching ')'. */
static Value *pct_keyed(PctArgs *pa, const char **p) {
  const char *k = *p + 1, *e = k;
  for (int depth = 1; *e && (depth > 1 || *e != ')'); e++) depth += *e == '(' ? 1 : *e == ')' ? -1 : 0;
  if (!*e) return err_set(ERR_VALUE, "incomplete format key");
  if (!pa->mapping) return err_set(ERR_TYPE, "format requires a mapping");
  Value *key = str_new(k, (size_t)(e - k));
  Value *v = key ? dict_get(pa->mapping, key) : NULL;
  if (key && !v) {
    Value *r = val_repr(key);
    err_set(ERR_INDEX, "KeyError: %s", r ? str_cstr(r) : "?");
    if (r) val_decref(r);
  }
  if (key) val_decref(key);
  *p = e + 1;
  return v;
}

/* Parses the specification after a '%' at [*p] (moved past it) and
 * formats its argument into [b]. */
static int pct_one(StrBuf *b, const char *fmt, const char **p, PctArgs *pa) {
  PctSpec ps = {.width = -1, .prec = -1};
  if (**p == '%') {   /* only "%%" is a '%': after flags it is a conversion */
    (*p)++;
    return sbuf_add(b, "%", 1), 0;
  }
  Value *keyed = NULL;
  if (**p == '(' && !(keyed = pct_keyed(pa, p))) return -1;
  for (;; (*p)++) {
    if (**p == '-') ps.left = true;
    else if (**p == '+') ps.plus = true;
    else if (**p == ' ') ps.space = true;
    else if (**p == '#') ps.alt = true;
    else if (**p == '0') ps.zero = true;
    else break;
  }
  char *end;
  if (**p == '*') {
    if (pct_star(pa, &ps.width) < 0) return -1;
    if (ps.width < 0) ps.left = true, ps.width = -ps.width;
    (*p)++;
  } else if (**p >= '0' && **p <= '9') {
    ps.width = strtol(*p, &end, 10);
    *p = end;
  }
  if (**p == '.') {
    (*p)++;
    ps.prec = 0;
    if (**p == '*') {
      if (pct_star(pa, &ps.prec) < 0) return -1;
      ps.prec = ps.prec < 0 ? 0 : ps.prec;
      (*p)++;
    } else if (**p >= '0' && **p <= '9') {
      ps.prec = strtol(*p, &end, 10);
      *p = end;
    }
  }
  if (ps.width > 100000 || ps.prec > 100000) return err_set(ERR_VALUE, "width or precision too large in format"), -1;
  while (**p && strchr("hlL", **p)) (*p)++;   /* C's length modifiers, ignored */
  if (!**p) return err_set(ERR_VALUE, "incomplete format"), -1;
  ps.type = *(*p)++;
  /* the argument is taken first, so a missing one is the error even
   * where the type is unknown (CPython's order) */
  Value *v = keyed ? keyed : pct_next(pa);
  if (!v) return -1;
  if (!strchr("diuoxXeEfFgGcrsa", ps.type)) {
    /* Python names the code point and its index in code points */
    const char *at = *p - 1;
    size_t i = 0, rest = strlen(at);
    uint32_t cp = utf8_decode(at, rest, &i);
    err_set(ERR_VALUE, "unsupported format character '%c' (0x%x) at index %zu",
            cp > 32 && cp < 127 ? (char)cp : '?', (unsigned)cp, utf8_count(fmt, (size_t)(at - fmt)));
    return -1;
  }
  if (strchr("diuoxX", ps.type)) return pct_int(b, &ps, v);
  if (strchr("eEfFgG", ps.type)) return pct_float(b, &ps, v);
  return pct_text(b, &ps, v);
}

Value *ops_percent_format(Value *fmt, Value *values) {
  PctArgs pa = {0};
  bool is_dict = values->type == V_DICT && !val_is_set(values);
  if (values->type == V_TUPLE) {
    pa.items = ((Tuple *)values)->items;
    pa.n = tuple_len(values);
  } else {
    pa.items = &values;
    pa.n = 1;
    pa.mapping = is_dict ? values : NULL;
    pa.any_mapping = is_dict || values->type == V_LIST;
  }
  const char *f = str_cstr(fmt);
  StrBuf b = {0};
  for (const char *p = f; *p;) {
    const char *pct = strchr(p, '%');
    if (!pct) {
      sbuf_puts(&b, p);
      break;
    }
    sbuf_add(&b, p, (size_t)(pct - p));
    p = pct + 1;
    if (pct_one(&b, f, &p, &pa) < 0) {
      sbuf_free(&b);
      return NULL;
    }
  }
  if (pa.next < pa.n && !pa.any_mapping) {
    sbuf_free(&b);
    return err_set(ERR_TYPE, "not all arguments converted during string formatting");
  }
  return str_take(&b);
}
