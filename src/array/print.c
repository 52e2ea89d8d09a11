/*
 * print.c - NumPy's str and JAX's repr for arrays, Python's forms for the
 * rest.
 *
 * The array layout follows numpy/core/arrayprint.py (NumPy 1.2x, legacy
 * mode off): a format is chosen once from the elements that will be shown
 * (FloatingFormat / IntegerFormat / BoolFormat), then a recursion over the
 * axes lays the words out with NumPy's wrapping rule.  Floats use NumPy's
 * "unique" mode: the shortest digits that read back as the same value of
 * the element's dtype, cut at `precision` fractional digits.  We get the
 * shortest digits from printf's correctly rounded %.*e by trying more and
 * more digits, and the cut-off digits from %.*f, which rounds the exact
 * binary value just as Dragon4 does at its cut-off.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array/array.h"
#include "base/error.h"
#include "base/mem.h"
#include "base/strbuf.h"
#include "base/utf8.h"
#include "array/print.h"

PrintOptions print_options = {8, 1000, 3, 75, false};

/* Appends the Str [v] (stolen) to [b]; false when v is NULL. */
static bool sb_put_value(StrBuf *b, Value *v) {
  if (!v)
    return false;
  sbuf_add(b, str_cstr(v), ((Str *)v)->len);
  val_decref(v);
  return true;
}

/* ---- float digits ------------------------------------------------------------ */

/* A decimal number: sign, digits d0.d1d2... and the exponent of d0. */
typedef struct Dec {
  bool neg;
  char dig[40];
  int n;     /* number of digits, >= 1, no trailing zeros unless "0" */
  int e10;
} Dec;

/* Parses printf's "%.*e" output of a non-negative number into [d]. */
static void dec_parse_e(const char *s, Dec *d) {
  d->n = 0;
  for (; *s && *s != 'e'; s++)
    if (*s >= '0' && *s <= '9' && d->n < (int)sizeof d->dig - 1)
      d->dig[d->n++] = *s;
  d->e10 = *s == 'e' ? atoi(s + 1) : 0;
  while (d->n > 1 && d->dig[d->n - 1] == '0')
    d->n--;
  d->dig[d->n] = '\0';
}

/* True when the decimal text [s] reads back as [x] in dtype [t]. */
static bool roundtrips(const char *s, double x, DType t) {
  switch (t) {
  case DT_F64:
    return strtod(s, NULL) == x;
  case DT_F16:
    return dt_f16_to_f32(dt_f32_to_f16(strtof(s, NULL))) == (float)x;
  case DT_BF16:
    return dt_bf16_to_f32(dt_f32_to_bf16(strtof(s, NULL))) == (float)x;
  default:
    return strtof(s, NULL) == (float)x;
  }
}

/* The shortest digits of finite [x] that round-trip in dtype [t]. */
static void dec_shortest(double x, DType t, Dec *d) {
  char tmp[64];
  double ax = fabs(x);
  d->neg = signbit(x) != 0;
  for (int p = 0; p <= 17; p++) {
    snprintf(tmp, sizeof tmp, "%.*e", p, ax);
    if (roundtrips(tmp, ax, t) || p == 17)
      break;
  }
  dec_parse_e(tmp, d);
  if (ax == 0)
    d->e10 = 0;
}

/* The value of finite [x] rounded to [frac] fractional digits. */
static void dec_fixed(double x, int frac, Dec *d) {
  char tmp[400];
  snprintf(tmp, sizeof tmp, "%.*f", frac, fabs(x));
  char *dot = strchr(tmp, '.');
  int nint = dot ? (int)(dot - tmp) : (int)strlen(tmp);
  d->neg = signbit(x) != 0;
  d->n = 0;
  d->e10 = nint - 1;
  for (const char *s = tmp; *s; s++) {
    if (*s == '.')
      continue;
    if (d->n == 0 && *s == '0' && s[1] != '\0') {
      d->e10--;   /* a leading zero: the first digit sits lower */
      continue;
    }
    if (d->n < (int)sizeof d->dig - 1)
      d->dig[d->n++] = *s;
  }
  if (d->n == 0 || d->dig[0] == '0') {
    d->n = 1;
    d->dig[0] = '0';
    d->e10 = 0;
  }
  while (d->n > 1 && d->dig[d->n - 1] == '0')
    d->n--;
  d->dig[d->n] = '\0';
}

/* Splits [d] into positional integer and fraction digit strings. */
static void dec_positional(const Dec *d, char *ip, char *fp) {
  char *o = ip;
  if (d->neg)
    *o++ = '-';
  if (d->e10 < 0) {
    *o++ = '0';
    for (int i = 0; i < -d->e10 - 1; i++)
      *fp++ = '0';
    memcpy(fp, d->dig, (size_t)d->n);
    fp += d->n;
  } else {
    for (int i = 0; i <= d->e10; i++)
      *o++ = i < d->n ? d->dig[i] : '0';
    for (int i = d->e10 + 1; i < d->n; i++)
      *fp++ = d->dig[i];
  }
  *o = '\0';
  *fp = '\0';
}

/* NumPy's dragon4 modes, reduced to what array printing uses. */
typedef struct DragonSpec {
  bool sci;        /* scientific rather than positional */
  int precision;   /* cut-off: fractional digits (of the mantissa if sci) */
  int min_digits;  /* at least this many exact fraction digits; -1: none */
  char trim;       /* 'k' keep, '.' keep the dot, '0' keep ".0", '-' drop dot */
  int pad_left;    /* width of the integer part (sign included) */
  int pad_right;   /* width of the fraction part */
  int exp_digits;  /* minimum exponent digits (at least 2) */
} DragonSpec;

/* Integer part, fraction and exponent text of finite [x] under [sp]. */
static void dragon_parts(double x, DType t, const DragonSpec *sp, char *ip,
                         char *fp, char *ep) {
  Dec d;
  dec_shortest(x, t, &d);
  ep[0] = '\0';
  if (sp->sci) {
    int want = d.n - 1 > sp->precision && sp->precision >= 0 ? sp->precision
               : d.n - 1 < sp->min_digits ? sp->min_digits : -1;
    if (want >= 0) {
      /* cut off, or more digits than unique asked for: exact rounding */
      char tmp[64];
      snprintf(tmp, sizeof tmp, "%.*e", want, fabs(x));
      dec_parse_e(tmp, &d);
    }
    snprintf(ip, 4, "%s%c", d.neg ? "-" : "", d.dig[0]);
    memcpy(fp, d.dig + 1, (size_t)d.n);   /* includes the NUL */
    int ed = sp->exp_digits >= 3 ? 3 : 2;   /* doubles need at most 3 */
    snprintf(ep, 16, "e%c%0*d", d.e10 < 0 ? '-' : '+', ed, abs(d.e10) % 1000);
    return;
  }
  /* With min_digits >= 0, Dragon4 generates digits at least down to the
   * units, so integer digits are exact (f16 34688 stays 34688). */
  int frac = d.n - 1 - d.e10;
  if (sp->precision >= 0 && frac > sp->precision)
    dec_fixed(x, sp->precision, &d);
  else if (sp->min_digits >= 0 && frac < sp->min_digits)
    dec_fixed(x, sp->min_digits, &d);
  dec_positional(&d, ip, fp);
}

/* Formats finite [x] as dragon4_positional / dragon4_scientific would. */
static void dragon_format(StrBuf *b, double x, DType t, const DragonSpec *sp) {
  char ip[400], fp[400], ep[16];
  dragon_parts(x, t, sp, ip, fp, ep);
  size_t nf = strlen(fp);
  while ((int)nf < sp->min_digits && nf < sizeof fp - 1)
    fp[nf++] = '0';
  fp[nf] = '\0';
  sbuf_spaces(b, sp->pad_left - (int)strlen(ip));
  sbuf_puts(b, ip);
  if (nf > 0 || sp->trim == '.' || sp->trim == 'k')
    sbuf_puts(b, ".");
  else if (sp->trim == '0')
    sbuf_puts(b, ".0");
  sbuf_puts(b, fp);
  sbuf_puts(b, ep);
  if (!sp->sci)
    sbuf_spaces(b, sp->pad_right - (int)nf);
}

void print_float_scalar(char *buf, size_t cap, double x, DType t) {
  StrBuf b = {0};
  if (isnan(x)) {
    snprintf(buf, cap, "nan");
    return;
  }
  if (isinf(x)) {
    snprintf(buf, cap, "%s", x < 0 ? "-inf" : "inf");
    return;
  }
  double ax = fabs(x);
  DragonSpec sp = {false, -1, -1, '0', 0, 0, 2};
  if (ax != 0 && (ax < 1e-4 || ax >= 1e16)) {
    sp.sci = true;
    sp.trim = '-';
  }
  dragon_format(&b, x, t, &sp);
  snprintf(buf, cap, "%s", b.failed || !b.data ? "?" : b.data);
  sbuf_free(&b);
}

/* ---- choosing an array's element format -------------------------------------- */

typedef enum { EK_BOOL, EK_INT, EK_FLOAT } ElemKind;

typedef struct ElemFmt {
  ElemKind kind;
  DType dtype;
  int int_width;      /* ints: common width */
  bool any_true;      /* bools: some shown element is True */
  bool zero_d;        /* formatting a 0-d array: no bool padding */
  bool exp;           /* floats: scientific */
  DragonSpec sp;      /* floats: the common spec */
  /* statistics gathered over the shown elements */
  bool have_nonzero, have_finite, have_nonfinite, neg_inf;
  double max_abs, min_abs;
  int64_t imax, imin;
} ElemFmt;

typedef void (*ElemFn)(void *ctx, const Array *a, int64_t flat);

/* Calls [fn] on each element print would show, in row-major order: all of
 * them, or only [edge] items at each end of each axis when summarising. */
static void visit_shown(const Array *a, int axis, int64_t flat, bool summ,
                        int edge, ElemFn fn, void *ctx) {
  if (axis == a->ndim) {
    fn(ctx, a, flat);
    return;
  }
  int64_t n = a->shape[axis], step = 1;
  for (int k = axis + 1; k < a->ndim; k++)
    step *= a->shape[k];
  bool cut = summ && 2 * (int64_t)edge < n;
  for (int64_t i = 0; i < n; i++) {
    if (cut && i == edge)
      i = n - edge;
    visit_shown(a, axis + 1, flat + i * step, summ, edge, fn, ctx);
  }
}

static void gather_stats(void *ctx, const Array *a, int64_t flat) {
  ElemFmt *f = ctx;
  if (f->kind == EK_INT) {
    int64_t v = arr_get_i64(a, flat);
    if (v > f->imax) f->imax = v;
    if (v < f->imin) f->imin = v;
    return;
  }
  if (f->kind == EK_BOOL) {
    f->any_true |= arr_get_i64(a, flat) != 0;
    return;
  }
  double x = arr_get_f64(a, flat);
  if (!isfinite(x)) {
    f->have_nonfinite = true;
    f->neg_inf |= isinf(x) && x < 0;
    return;
  }
  f->have_finite = true;
  double ax = fabs(x);
  if (ax == 0)
    return;
  if (!f->have_nonzero || ax > f->max_abs) f->max_abs = ax;
  if (!f->have_nonzero || ax < f->min_abs) f->min_abs = ax;
  f->have_nonzero = true;
}

/* The first pass of FloatingFormat.fillFormat: widest parts. */
static void gather_widths(void *ctx, const Array *a, int64_t flat) {
  ElemFmt *f = ctx;
  double x = arr_get_f64(a, flat);
  if (!isfinite(x))
    return;
  char ip[400], fp[400], ep[16];
  dragon_parts(x, f->dtype, &f->sp, ip, fp, ep);
  int li = (int)strlen(ip), lf = (int)strlen(fp), le = (int)strlen(ep) - 2;
  if (li > f->sp.pad_left) f->sp.pad_left = li;
  if (lf > f->sp.pad_right) f->sp.pad_right = lf;
  if (le > f->sp.exp_digits) f->sp.exp_digits = le;
}

static void float_fill(ElemFmt *f, const Array *a, bool summ) {
  const PrintOptions *o = &print_options;
  if (f->have_nonzero &&
      (f->max_abs >= 1e8 ||
       (!o->suppress && (f->min_abs < 1e-4 || f->max_abs / f->min_abs > 1e3))))
    f->exp = true;
  f->sp = (DragonSpec){f->exp, o->precision, 0, '.', 0, 0, 0};
  if (f->have_finite)
    visit_shown(a, 0, 0, summ, o->edgeitems, gather_widths, f);
  if (f->exp && f->have_finite) {
    /* all mantissas get the widest fraction; pad_right only sizes nan */
    f->sp.precision = f->sp.min_digits = f->sp.pad_right;
    f->sp.trim = 'k';
    f->sp.pad_right = f->sp.exp_digits + 2 + f->sp.precision;
  }
  if (f->have_nonfinite) {
    int offset = f->sp.pad_right + 1;
    int inflen = 3 + (f->neg_inf ? 1 : 0);
    if (3 - offset > f->sp.pad_left) f->sp.pad_left = 3 - offset;
    if (inflen - offset > f->sp.pad_left) f->sp.pad_left = inflen - offset;
  }
}

/* Chooses the format of [a]'s shown elements. */
static void fmt_choose(ElemFmt *f, const Array *a, bool summ) {
  memset(f, 0, sizeof *f);
  f->dtype = a->dtype;
  f->zero_d = a->ndim == 0;
  f->kind = a->dtype == DT_BOOL ? EK_BOOL : dt_is_float(a->dtype) ? EK_FLOAT : EK_INT;
  f->imax = INT64_MIN;
  f->imin = INT64_MAX;
  visit_shown(a, 0, 0, summ, print_options.edgeitems, gather_stats, f);
  if (f->kind == EK_INT) {
    char t1[32], t2[32];
    int l1 = snprintf(t1, sizeof t1, "%lld", (long long)f->imax);
    int l2 = snprintf(t2, sizeof t2, "%lld", (long long)f->imin);
    f->int_width = l1 > l2 ? l1 : l2;
  } else if (f->kind == EK_FLOAT) {
    float_fill(f, a, summ);
  }
}

/* One element as NumPy's format function for the array would write it. */
static void fmt_elem(StrBuf *b, const ElemFmt *f, const Array *a, int64_t flat) {
  if (f->kind == EK_BOOL) {
    bool v = arr_get_i64(a, flat) != 0;
    sbuf_puts(b, v ? (f->zero_d ? "True" : " True") : "False");
    return;
  }
  if (f->kind == EK_INT) {
    sbuf_printf(b, "%*lld", f->int_width, (long long)arr_get_i64(a, flat));
    return;
  }
  double x = arr_get_f64(a, flat);
  if (isfinite(x)) {
    dragon_format(b, x, f->dtype, &f->sp);
    return;
  }
  const char *w = isnan(x) ? "nan" : x < 0 ? "-inf" : "inf";
  sbuf_spaces(b, f->sp.pad_left + f->sp.pad_right + 1 - (int)strlen(w));
  sbuf_puts(b, w);
}

/* ---- laying out the nested brackets (arrayprint._formatArray) ----------------- */

typedef struct Layout {
  const Array *a;
  const ElemFmt *f;
  const char *sep;   /* " " for str, ", " for repr */
  bool summ;
  int edge;
} Layout;

/* _extendLine: starts a new line when [word] would pass [width], unless
 * the line holds nothing but the hanging indent. */
static void extend_line(StrBuf *s, StrBuf *line, bool *first, const char *word,
                        int width, int hang) {
  bool wrap = (int)(line->len + strlen(word)) > width && (int)line->len > hang;
  if (wrap) {
    size_t n = line->len;
    while (n > 0 && line->data[n - 1] == ' ')
      n--;
    size_t skip = *first ? (size_t)hang : 0;
    if (n > skip)
      sbuf_add(s, line->data + skip, n - skip);
    sbuf_puts(s, "\n");
    *first = false;
    line->len = 0;
    sbuf_spaces(line, hang);
  }
  sbuf_puts(line, word);
}

static void layout_rec(const Layout *L, StrBuf *out, int axis, int64_t flat,
                       int hang, int width);

/* The word for element [i] of the last axis. */
static void layout_word(const Layout *L, StrBuf *w, int64_t flat) {
  w->len = 0;
  if (w->data)
    w->data[0] = '\0';
  fmt_elem(w, L->f, L->a, flat);
}

static void layout_1d(const Layout *L, StrBuf *out, int64_t flat, int hang,
                      int width) {
  int64_t n = L->a->shape[L->a->ndim - 1];
  bool cut = L->summ && 2 * (int64_t)L->edge < n;
  int elem_width = width - 1;   /* max(len(sep.rstrip()), len(']')) */
  StrBuf line = {0}, word = {0};
  bool first = true;
  sbuf_spaces(&line, hang);
  for (int64_t i = 0; i < n; i++) {
    if (cut && i == L->edge) {
      extend_line(out, &line, &first, "...", elem_width, hang);
      sbuf_puts(&line, L->sep);
      i = n - L->edge;
    }
    layout_word(L, &word, flat + i);
    extend_line(out, &line, &first, sbuf_text(&word), elem_width, hang);
    if (i < n - 1)
      sbuf_puts(&line, L->sep);
  }
  size_t skip = first ? (size_t)hang : 0;
  if (line.len > skip)
    sbuf_add(out, line.data + skip, line.len - skip);
  out->failed |= line.failed || word.failed;
  sbuf_free(&line);
  sbuf_free(&word);
}

static void layout_rec(const Layout *L, StrBuf *out, int axis, int64_t flat,
                       int hang, int width) {
  const Array *a = L->a;
  if (axis == a->ndim) {
    fmt_elem(out, L->f, a, flat);
    return;
  }
  sbuf_puts(out, "[");
  if (axis == a->ndim - 1) {
    layout_1d(L, out, flat, hang, width);
    sbuf_puts(out, "]");
    return;
  }
  int64_t n = a->shape[axis], step = 1;
  for (int k = axis + 1; k < a->ndim; k++)
    step *= a->shape[k];
  bool cut = L->summ && 2 * (int64_t)L->edge < n;
  int blank = a->ndim - axis - 1;   /* newlines between sub-blocks */
  for (int64_t i = 0; i < n; i++) {
    if (cut && i == L->edge) {
      sbuf_spaces(out, hang);
      sbuf_puts(out, "...");
      sbuf_puts(out, L->sep[0] == ',' ? "," : "");
      for (int k = 0; k < blank; k++)
        sbuf_puts(out, "\n");
      i = n - L->edge;
    }
    if (i > 0)
      sbuf_spaces(out, hang);
    layout_rec(L, out, axis + 1, flat + i * step, hang + 1, width - 1);
    if (i < n - 1) {
      sbuf_puts(out, L->sep[0] == ',' ? "," : "");
      for (int k = 0; k < blank; k++)
        sbuf_puts(out, "\n");
    }
  }
  sbuf_puts(out, "]");
}

/* array2string with [sep], a hanging indent of [hang] columns and a line
 * width of [width]; "[]" for an empty array. */
static void array2string(StrBuf *out, const Array *a, const char *sep, int hang,
                         int width) {
  if (a->size == 0) {
    sbuf_puts(out, "[]");
    return;
  }
  ElemFmt f;
  bool summ = a->size > (int64_t)print_options.threshold;
  fmt_choose(&f, a, summ);
  Layout L = {a, &f, sep, summ, print_options.edgeitems};
  layout_rec(&L, out, 0, 0, hang, width);
}

/* NumPy's str of a 0-d array: the scalar's str. */
static void scalar_str(StrBuf *b, const Array *a) {
  if (a->dtype == DT_BOOL) {
    sbuf_puts(b, arr_get_i64(a, 0) ? "True" : "False");
  } else if (dt_is_float(a->dtype)) {
    char tmp[64];
    print_float_scalar(tmp, sizeof tmp, arr_get_f64(a, 0), a->dtype);
    sbuf_puts(b, tmp);
  } else {
    sbuf_printf(b, "%lld", (long long)arr_get_i64(a, 0));
  }
}

static void array_str(StrBuf *b, const Array *a) {
  if (a->ndim == 0)
    scalar_str(b, a);
  else
    array2string(b, a, " ", 1, print_options.linewidth);
}

/* Python's repr (and str) of a Python number: an int's digits, True or
 * False, a float's shortest round-tripping digits (NumPy's float64 scalar
 * form is Python's: "0.1", "2.0", "1e+16", "1e-05", "inf", "-0.0"). */
static void python_number_str(StrBuf *b, const Array *a) {
  if (dt_is_float(a->dtype)) {
    char tmp[64];
    print_float_scalar(tmp, sizeof tmp, arr_host_f64(a), DT_F64);
    sbuf_puts(b, tmp);
  } else {
    scalar_str(b, a);
  }
}

/* jax.Array.__repr__, including its measure of the last line (which counts
 * two more columns than the line has) and its habit of putting the dtype
 * after six spaces, not on a new line, when the line is too long. */
static void array_repr(StrBuf *b, const Array *a) {
  static const char prefix[] = "Array(";
  int plen = (int)sizeof prefix - 1;
  StrBuf s = {0};
  if (a->size == 0) {
    char shp[400];
    shape_str(shp, sizeof shp, a->ndim, a->shape);
    sbuf_printf(&s, "[], shape=%s", shp);
  } else {
    array2string(&s, a, ", ", 1 + plen, print_options.linewidth - 1);
  }
  char dtype_str[64];
  snprintf(dtype_str, sizeof dtype_str, "dtype=%s%s)", dt_name(a->dtype),
           a->weak ? ", weak_type=True" : "");
  const char *text = sbuf_text(&s);
  const char *nl = strrchr(text, '\n');
  int last = (int)s.len - (nl ? (int)(nl - text) : -1) + 1;
  bool long_line = last + (int)strlen(dtype_str) + 1 > print_options.linewidth;
  sbuf_puts(b, prefix);
  sbuf_puts(b, text);
  sbuf_puts(b, ",");
  sbuf_spaces(b, long_line ? plen : 1);
  sbuf_puts(b, dtype_str);
  b->failed |= s.failed;
  sbuf_free(&s);
}

/* NumPy's repr (1.24) of a host NumPy array (array.h): a scalar (a 0-d
 * result of indexing or a reduction) as its str, "-99.0"; an array as
 * "array([1., 2.])", with ", dtype=float32)" unless the dtype is one
 * NumPy implies (float64, int64, bool) and there are elements, the
 * dtype on a line of its own when it would pass the line width. */
static void numpy_repr(StrBuf *b, const Array *a) {
  if (a->ndim == 0 && !a->buf->np_0d) {
    scalar_str(b, a);
    return;
  }
  static const char prefix[] = "array(";
  int plen = (int)sizeof prefix - 1;
  bool implied = a->dtype == DT_F64 || a->dtype == DT_I64 || a->dtype == DT_BOOL;
  bool skip_dtype = implied && a->size > 0;
  StrBuf s = {0};
  sbuf_puts(&s, prefix);
  if (a->size == 0 && !(a->ndim == 1 && a->shape[0] == 0)) {
    char shp[400];
    shape_str(shp, sizeof shp, a->ndim, a->shape);
    sbuf_printf(&s, "[], shape=%s", shp);
  } else {
    array2string(&s, a, ", ", 1 + plen, print_options.linewidth - 1);
  }
  sbuf_puts(&s, skip_dtype ? ")" : ",");
  const char *text = sbuf_text(&s);
  sbuf_puts(b, text);
  if (!skip_dtype) {
    char dtype_str[64];
    snprintf(dtype_str, sizeof dtype_str, "dtype=%s)", dt_name(a->dtype));
    const char *nl = strrchr(text, '\n');
    int last = (int)s.len - (nl ? (int)(nl - text) + 1 : 0);
    if (last + (int)strlen(dtype_str) + 1 > print_options.linewidth) {
      sbuf_puts(b, "\n");
      sbuf_spaces(b, plen);
    } else {
      sbuf_puts(b, " ");
    }
    sbuf_puts(b, dtype_str);
  }
  b->failed |= s.failed;
  sbuf_free(&s);
}

/* ---- Python's forms --------------------------------------------------------- */

/* Python's repr of a str: single quotes unless the text has a ' and no ". */
/* The non-ASCII code point at byte [*i] of [s], as Python's repr shows
 * it: itself when printable (and not [ascii]), else \\xhh, \\uhhhh or
 * \\Uhhhhhhhh; [*i] is left on its last byte. */
static void quote_code_point(StrBuf *b, const char *s, size_t n, size_t *i, bool ascii) {
  size_t j = *i;
  uint32_t cp = utf8_decode(s, n, &j);
  if (!ascii && utf8_isprintable(cp)) sbuf_add(b, s + *i, j - *i);
  else if (cp <= 0xFF) sbuf_printf(b, "\\x%02x", (unsigned)cp);
  else if (cp <= 0xFFFF) sbuf_printf(b, "\\u%04x", (unsigned)cp);
  else sbuf_printf(b, "\\U%08x", (unsigned)cp);
  *i = j - 1;
}

static void quote_str(StrBuf *b, const char *s, size_t n) {
  bool sq = memchr(s, '\'', n) != NULL, dq = memchr(s, '"', n) != NULL;
  char q = sq && !dq ? '"' : '\'';
  sbuf_add(b, &q, 1);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\\' || c == (unsigned char)q) {
      char e[2] = {'\\', (char)c};
      sbuf_add(b, e, 2);
    } else if (c == '\n') {
      sbuf_puts(b, "\\n");
    } else if (c == '\r') {
      sbuf_puts(b, "\\r");
    } else if (c == '\t') {
      sbuf_puts(b, "\\t");
    } else if (c < 0x20 || c == 0x7f) {
      sbuf_printf(b, "\\x%02x", c);
    } else if (c < 0x80) {
      sbuf_add(b, (const char *)&c, 1);
    } else {
      quote_code_point(b, s, n, &i, false);
    }
  }
  sbuf_add(b, &q, 1);
}

static Value *(*str_hooks[V_TYPE_COUNT])(Value *);
static Value *(*repr_hooks[V_TYPE_COUNT])(Value *);

void print_register(VType t, Value *(*str)(Value *), Value *(*repr)(Value *)) {
  if ((int)t < 0 || t >= V_TYPE_COUNT)
    return;
  str_hooks[t] = str;
  repr_hooks[t] = repr;
}

static bool repr_into(StrBuf *b, Value *v, bool nested);

/* Only a Python number prints as one inside a container; a weakly typed
 * 0-d array (a loop's carry, jnp.abs(-2)) shows its array form there, as
 * JAX's repr does. */
static bool is_python_scalar(Value *v) {
  return arr_is_host(v);
}

static bool repr_seq(StrBuf *b, Value *v, const char *open, const char *close) {
  size_t n;
  Value *const *items;
  val_seq(v, &n, &items);
  sbuf_puts(b, open);
  for (size_t i = 0; i < n; i++) {
    if (i > 0)
      sbuf_puts(b, ", ");
    if (!repr_into(b, items[i], true))
      return false;
  }
  if (n == 1 && v->type == V_TUPLE)
    sbuf_puts(b, ",");
  sbuf_puts(b, close);
  return true;
}

/* A Counter's count as a number to order by (0 for another value). */
static double count_of(Value *v) {
  return IS_ARRAY(v) && AS_ARRAY(v)->size == 1 ? arr_host_f64(AS_ARRAY(v)) : 0;
}

/* The order a dict's pairs print in: insertion order, or for a Counter
 * its most_common order (counts descending, ties as inserted). */
static void dict_order(const Dict *d, size_t *pos) {
  for (size_t i = 0; i < d->len; i++) {
    size_t j = i;
    while (d->kind == DICT_COUNTER && j > 0 && count_of(d->vals[pos[j - 1]]) < count_of(d->vals[i])) {
      pos[j] = pos[j - 1];
      j--;
    }
    pos[j] = i;
  }
}

/* {k: v, ...}; a defaultdict as defaultdict(factory, {...}), a Counter as
 * Counter({...}) (Counter() when empty), an OrderedDict as
 * OrderedDict({...}) (OrderedDict() when empty), as Python 3.12 prints
 * them. */
/* {1, 2} (set() when empty); frozenset({1, 2}) (frozenset()), as Python. */
static bool repr_set(StrBuf *b, Value *v) {
  Dict *d = (Dict *)v;
  bool frozen = d->kind == DICT_FROZENSET;
  if (d->len == 0) {
    sbuf_puts(b, frozen ? "frozenset()" : "set()");
    return true;
  }
  size_t *pos = shm_calloc(d->len + 1, sizeof *pos);
  if (!pos) return err_nomem(), false;
  dict_order(d, pos);
  bool ok = true;
  sbuf_puts(b, frozen ? "frozenset({" : "{");
  for (size_t i = 0; ok && i < d->len; i++) {
    if (i > 0) sbuf_puts(b, ", ");
    ok = repr_into(b, d->keys[pos[i]], true);
  }
  sbuf_puts(b, frozen ? "})" : "}");
  shm_free(pos);
  return ok;
}

static bool repr_dict(StrBuf *b, Value *v) {
  Dict *d = (Dict *)v;
  if (val_is_set(v)) return repr_set(b, v);
  if ((d->kind == DICT_COUNTER || d->kind == DICT_ORDERED) && d->len == 0) {
    sbuf_puts(b, d->kind == DICT_COUNTER ? "Counter()" : "OrderedDict()");
    return true;
  }
  size_t *pos = shm_calloc(d->len + 1, sizeof *pos);
  if (!pos) return err_nomem(), false;
  dict_order(d, pos);
  bool ok = true;
  if (d->kind == DICT_COUNTER) sbuf_puts(b, "Counter(");
  if (d->kind == DICT_ORDERED) sbuf_puts(b, "OrderedDict(");   /* Python 3.12's form */
  if (d->kind == DICT_DEFAULT) {
    sbuf_puts(b, "defaultdict(");
    ok = d->missing ? repr_into(b, d->missing, true) : (sbuf_puts(b, "None"), true);
    sbuf_puts(b, ", ");
  }
  sbuf_puts(b, "{");
  for (size_t i = 0; ok && i < d->len; i++) {
    if (i > 0)
      sbuf_puts(b, ", ");
    ok = repr_into(b, d->keys[pos[i]], true);
    sbuf_puts(b, ": ");
    ok = ok && repr_into(b, d->vals[pos[i]], true);
  }
  sbuf_puts(b, d->kind != DICT_PLAIN ? "})" : "}");
  shm_free(pos);
  return ok;
}

static bool repr_slice(StrBuf *b, Value *v) {
  Slice *s = (Slice *)v;
  sbuf_puts(b, "slice(");
  if (!repr_into(b, s->start, true))
    return false;
  sbuf_puts(b, ", ");
  if (!repr_into(b, s->stop, true))
    return false;
  sbuf_puts(b, ", ");
  if (!repr_into(b, s->step, true))
    return false;
  sbuf_puts(b, ")");
  return true;
}

static void repr_range(StrBuf *b, Value *v) {
  Range *r = (Range *)v;
  sbuf_printf(b, "range(%lld, %lld", (long long)r->start, (long long)r->stop);
  if (r->step != 1)
    sbuf_printf(b, ", %lld", (long long)r->step);
  sbuf_puts(b, ")");
}

/* The forms of values that print the same in str and repr and need no
 * recursion; false if [v] is not one of them. */
static bool repr_simple(StrBuf *b, Value *v) {
  switch ((VType)v->type) {
  case V_NONE:
    sbuf_puts(b, "None");
    return true;
  case V_ELLIPSIS:
    sbuf_puts(b, "Ellipsis");
    return true;
  case V_RANGE:
    repr_range(b, v);
    return true;
  case V_BUILTIN:
    sbuf_printf(b, ((Builtin *)v)->is_class ? "<class '%s'>" : "<built-in function %s>",
                ((Builtin *)v)->name);
    return true;
  case V_BOUND: {
    BoundMethod *m = (BoundMethod *)v;
    if (m->is_class)
      sbuf_printf(b, "<class '%s'>", m->name);
    else
      sbuf_printf(b, "<built-in method %s of %s object>", m->name, val_type_name(m->self));
    return true;
  }
  case V_MODULE:
    sbuf_printf(b, "<module '%s'>", ((Module *)v)->name);
    return true;
  default:
    return false;
  }
}

/* The containers whose repr is being written on this thread, outermost
 * first: one met again is written as Python writes it, [...] or {...};
 * nesting deeper than REPR_MAX_DEPTH is Python's RecursionError. */
#define REPR_MAX_DEPTH 1000
static _Thread_local Value *repr_stack[REPR_MAX_DEPTH];
static _Thread_local int repr_depth;

/* deque([1, 2]) or deque([1, 2], maxlen=3), as Python prints a deque. */
static bool repr_deque(StrBuf *b, Value *v) {
  sbuf_puts(b, "deque(");
  if (!repr_seq(b, v, "[", "]")) return false;
  if (((List *)v)->maxlen >= 0) sbuf_printf(b, ", maxlen=%lld", (long long)((List *)v)->maxlen);
  sbuf_puts(b, ")");
  return true;
}

/* Appends the repr of container [v] (a tuple, list, deque or dict). */
static bool repr_container(StrBuf *b, Value *v) {
  for (int i = 0; i < repr_depth; i++)
    if (repr_stack[i] == v) {
      sbuf_puts(b, v->type == V_DICT ? "{...}" : v->type == V_LIST ? "[...]" : "(...)");
      return true;
    }
  if (repr_depth == REPR_MAX_DEPTH) {
    err_set(ERR_VALUE, "maximum recursion depth exceeded while getting the repr of an object");
    return false;
  }
  repr_stack[repr_depth++] = v;
  bool deque = v->type == V_LIST && ((List *)v)->kind == LIST_DEQUE;
  bool ok = v->type == V_DICT ? repr_dict(b, v)
          : deque             ? repr_deque(b, v)
                              : repr_seq(b, v, v->type == V_LIST ? "[" : "(",
                                         v->type == V_LIST ? "]" : ")");
  repr_depth--;
  return ok;
}

/* Appends repr(v); [nested] when inside a container.  False on error. */
static bool repr_into(StrBuf *b, Value *v, bool nested) {
  if (repr_simple(b, v))
    return true;
  switch ((VType)v->type) {
  case V_ARRAY:
    if (AS_ARRAY(v)->host)
      python_number_str(b, AS_ARRAY(v));
    else if (nested && is_python_scalar(v))
      array_str(b, AS_ARRAY(v));
    else if (arr_is_np(v))
      numpy_repr(b, AS_ARRAY(v));
    else
      array_repr(b, AS_ARRAY(v));
    return true;
  case V_STR:
    quote_str(b, str_cstr(v), ((Str *)v)->len);
    return true;
  case V_TUPLE:
    if ((v->flags & VAL_NAMED) && repr_hooks[V_TUPLE])   /* Point(x=1, y=2) */
      return sb_put_value(b, repr_hooks[V_TUPLE](v));
    return repr_container(b, v);
  case V_LIST:
  case V_DICT:
    return repr_container(b, v);
  case V_SLICE:
    return repr_slice(b, v);
  case V_DTYPE:
    /* NumPy's dtype repr, as x.dtype shows in JAX; not jnp.float32's
     * "<class 'jax.numpy.float32'>", which says less to the user. */
    sbuf_printf(b, "dtype('%s')", dt_name(((DTypeVal *)v)->dtype));
    return true;
  case V_OPAQUE: {
    Opaque *o = (Opaque *)v;
    if (o->ot->repr)
      return sb_put_value(b, o->ot->repr(v));
    sbuf_printf(b, "<%s>", o->ot->name);
    return true;
  }
  default:
    if (repr_hooks[v->type])
      return sb_put_value(b, repr_hooks[v->type](v));
    sbuf_printf(b, "<%s>", val_type_name(v));
    return true;
  }
}

Value *val_repr(Value *v) {
  StrBuf b = {0};
  if (!repr_into(&b, v, false)) {
    sbuf_free(&b);
    return NULL;
  }
  return str_take(&b);
}

Value *val_ascii(Value *v) {
  Value *r = val_repr(v);
  if (!r || str_is_ascii(r)) return r;
  StrBuf b = {0};
  const char *s = str_cstr(r);
  size_t n = ((Str *)r)->len;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x80) sbuf_add(&b, s + i, 1);
    else quote_code_point(&b, s, n, &i, true);
  val_decref(r);
  return str_take(&b);
}

Value *val_str(Value *v) {
  if (v->type == V_STR)
    return val_incref(v);
  if (v->type < V_TYPE_COUNT && str_hooks[v->type])
    return str_hooks[v->type](v);
  if (v->type == V_OPAQUE && ((Opaque *)v)->ot->str) return ((Opaque *)v)->ot->str(v);
  StrBuf b = {0};
  if (v->type == V_ARRAY && AS_ARRAY(v)->host)
    python_number_str(&b, AS_ARRAY(v));
  else if (v->type == V_ARRAY)
    array_str(&b, AS_ARRAY(v));
  else if (v->type == V_DTYPE)
    sbuf_puts(&b, dt_name(((DTypeVal *)v)->dtype));
  else
    return val_repr(v);
  return str_take(&b);
}

int print_set_options(const PrintOptions *o) {
  if (o->precision < 0 || o->precision > 17)
    return err_set(ERR_VALUE, "precision must be between 0 and 17, got %d",
                   o->precision), -1;
  if (o->threshold < 0)
    return err_set(ERR_VALUE, "threshold must be non-negative, got %d",
                   o->threshold), -1;
  if (o->edgeitems < 0)
    return err_set(ERR_VALUE, "edgeitems must be non-negative, got %d",
                   o->edgeitems), -1;
  if (o->linewidth < 1)
    return err_set(ERR_VALUE, "linewidth must be positive, got %d",
                   o->linewidth), -1;
  print_options = *o;
  return 0;
}
