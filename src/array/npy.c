/*
 * npy.c - NumPy's .npy format (layout in npy.h; semantics from the format
 * description in numpy.lib.format).
 *
 * The header is parsed by a small reader for the one Python literal it
 * holds (a dict of strings, booleans and a tuple of ints); nothing in it
 * is evaluated.  Every size is checked against the file's length before
 * anything is allocated, so a corrupt header gives an error, not a huge
 * allocation or a read past the end.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/error.h"
#include "base/mem.h"
#include "array/npy.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c assumes a little-endian host"
#endif

static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

/* What the header says. */
typedef struct NpyHeader {
  DType dtype;
  bool big_endian;
  bool fortran;
  int ndim;
  int64_t shape[SHM_MAXDIM];
  bool has_descr, has_order, has_shape;
} NpyHeader;

/* ---- the header dict ------------------------------------------------------------- */

/* A cursor over the header text; [path] is for messages. */
typedef struct Cur {
  const char *s, *end;
  const char *path;
} Cur;

static void *bad_header(const Cur *c, const char *what) {
  return err_set(ERR_IO, "'%s': bad .npy header: %s", c->path, what);
}

static void skip_ws(Cur *c) {
  while (c->s < c->end && (*c->s == ' ' || *c->s == '\t' || *c->s == '\n' || *c->s == '\r'))
    c->s++;
}

/* Consumes [ch] after blanks; false if it is not next. */
static bool eat(Cur *c, char ch) {
  skip_ws(c);
  if (c->s < c->end && *c->s == ch) {
    c->s++;
    return true;
  }
  return false;
}

/* A quoted string (no escapes: descr and key names have none) into [out]. */
static bool read_string(Cur *c, char *out, size_t cap) {
  skip_ws(c);
  if (c->s >= c->end || (*c->s != '\'' && *c->s != '"'))
    return false;
  char q = *c->s++;
  size_t n = 0;
  while (c->s < c->end && *c->s != q) {
    if (n + 1 < cap)
      out[n++] = *c->s;
    c->s++;
  }
  out[n] = '\0';
  if (c->s >= c->end)
    return false;
  c->s++;
  return true;
}

static bool read_word(Cur *c, const char *w) {
  skip_ws(c);
  size_t n = strlen(w);
  if ((size_t)(c->end - c->s) >= n && memcmp(c->s, w, n) == 0) {
    c->s += n;
    return true;
  }
  return false;
}

/* A non-negative integer, with an optional Python 2 'L' suffix. */
static bool read_dim(Cur *c, int64_t *out) {
  skip_ws(c);
  int64_t v = 0;
  const char *start = c->s;
  while (c->s < c->end && *c->s >= '0' && *c->s <= '9') {
    if (v > (INT64_MAX - 9) / 10)
      return false;
    v = v * 10 + (*c->s++ - '0');
  }
  if (c->s == start)
    return false;
  if (c->s < c->end && *c->s == 'L')
    c->s++;
  *out = v;
  return true;
}

/* A shape tuple: "()", "(3,)", "(3, 4)". */
static int read_shape(Cur *c, NpyHeader *h) {
  if (!eat(c, '('))
    return bad_header(c, "'shape' is not a tuple"), -1;
  h->ndim = 0;
  while (!eat(c, ')')) {
    if (h->ndim == SHM_MAXDIM)
      return err_set(ERR_IO, "'%s': shape has more than %d dimensions", c->path,
                     SHM_MAXDIM), -1;
    if (!read_dim(c, &h->shape[h->ndim++]))
      return bad_header(c, "'shape' must hold non-negative integers"), -1;
    if (!eat(c, ',') && (skip_ws(c), c->s >= c->end || *c->s != ')'))
      return bad_header(c, "malformed 'shape' tuple"), -1;
  }
  h->has_shape = true;
  return 0;
}

/* Maps a descr such as '<f4' to a dtype and byte order. */
static int parse_descr(const Cur *c, const char *d, NpyHeader *h) {
  static const struct { const char *code; DType t; } codes[] = {
      {"b1", DT_BOOL}, {"i1", DT_I8}, {"i4", DT_I32}, {"i8", DT_I64},
      {"f2", DT_F16}, {"f4", DT_F32}, {"f8", DT_F64}, {"?", DT_BOOL}};
  char order = d[0];
  const char *code = d;
  if (order == '<' || order == '>' || order == '|' || order == '=')
    code = d + 1;
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
    if (strcmp(code, codes[i].code) == 0) {
      h->dtype = codes[i].t;
      h->big_endian = order == '>' && dt_size(codes[i].t) > 1;
      h->has_descr = true;
      return 0;
    }
  err_set(ERR_IO, "'%s': unsupported dtype '%s' (shmap reads bool, int8, int32, "
          "int64, float16, float32 and float64)", c->path, d);
  return -1;
}

/* One "key: value" entry of the dict. */
static int read_entry(Cur *c, NpyHeader *h) {
  char key[32], val[64];
  if (!read_string(c, key, sizeof key) || !eat(c, ':'))
    return bad_header(c, "expected 'key': value"), -1;
  if (strcmp(key, "descr") == 0) {
    skip_ws(c);
    if (c->s < c->end && *c->s == '[')
      return err_set(ERR_IO, "'%s': structured (record) dtypes are not supported",
                     c->path), -1;
    if (!read_string(c, val, sizeof val))
      return bad_header(c, "'descr' is not a string"), -1;
    return parse_descr(c, val, h);
  }
  if (strcmp(key, "fortran_order") == 0) {
    if (read_word(c, "True"))
      h->fortran = true;
    else if (read_word(c, "False"))
      h->fortran = false;
    else
      return bad_header(c, "'fortran_order' is not True or False"), -1;
    h->has_order = true;
    return 0;
  }
  if (strcmp(key, "shape") == 0)
    return read_shape(c, h);
  return bad_header(c, "unexpected key"), -1;
}

static int parse_header(const char *path, const char *text, size_t len,
                        NpyHeader *h) {
  Cur c = {text, text + len, path};
  memset(h, 0, sizeof *h);
  if (!eat(&c, '{'))
    return bad_header(&c, "not a dict"), -1;
  while (!eat(&c, '}')) {
    if (read_entry(&c, h) < 0)
      return -1;
    if (!eat(&c, ',') && (skip_ws(&c), c.s >= c.end || *c.s != '}'))
      return bad_header(&c, "expected ',' or '}'"), -1;
  }
  if (!h->has_descr || !h->has_order || !h->has_shape)
    return bad_header(&c, "needs the keys 'descr', 'fortran_order' and 'shape'"), -1;
  return 0;
}

/* ---- loading ------------------------------------------------------------------------ */

/* Reads exactly [n] bytes or reports the file as truncated. */
static int read_exact(FILE *f, void *buf, size_t n, const char *path,
                      const char *what) {
  if (n && fread(buf, 1, n, f) != n) {
    err_set(ERR_IO, "'%s': truncated file (%s)", path, what);
    return -1;
  }
  return 0;
}

/* Magic, version and header text; [*data_start] is the data's offset. */
static int read_preamble(FILE *f, const char *path, NpyHeader *h, long *data_start) {
  unsigned char pre[10];
  if (fread(pre, 1, 8, f) != 8 || memcmp(pre, npy_magic, 6) != 0)
    return err_set(ERR_IO, "'%s' is not a .npy file (bad magic)", path), -1;
  int major = pre[6];
  if (major < 1 || major > 3)
    return err_set(ERR_IO, "'%s': unsupported .npy version %d.%d", path, major,
                   pre[7]), -1;
  size_t lenbytes = major == 1 ? 2 : 4;
  if (read_exact(f, pre + 8, 2, path, "header length") < 0)
    return -1;
  uint32_t hlen = pre[8] | (uint32_t)pre[9] << 8;
  if (lenbytes == 4) {
    unsigned char hi[2];
    if (read_exact(f, hi, 2, path, "header length") < 0)
      return -1;
    hlen |= (uint32_t)hi[0] << 16 | (uint32_t)hi[1] << 24;
  }
  if (hlen > (1u << 24))
    return err_set(ERR_IO, "'%s': bad .npy header: length %u is implausible", path,
                   hlen), -1;
  char *text = shm_malloc(hlen + 1);
  if (!text)
    return err_nomem(), -1;
  int rc = read_exact(f, text, hlen, path, "header");
  if (rc == 0)
    rc = parse_header(path, text, hlen, h);
  shm_free(text);
  *data_start = (long)(8 + lenbytes + hlen);
  return rc;
}

/* The data must fill the rest of the file exactly. */
static int check_size(const char *path, const NpyHeader *h, long file_size,
                      long data_start) {
  int64_t n = shape_size(h->ndim, h->shape);
  int64_t need = n < 0 || n > INT64_MAX / 8 ? -1 : n * (int64_t)dt_size(h->dtype);
  int64_t have = file_size - data_start;
  char shp[256];
  shape_str(shp, sizeof shp, h->ndim, h->shape);
  if (need < 0)
    return err_set(ERR_IO, "'%s': shape %s is too large", path, shp), -1;
  if (need != have)
    return err_set(ERR_IO, "'%s': the header's shape %s of %s needs %lld bytes "
                   "of data, the file has %lld", path, shp, dt_name(h->dtype),
                   (long long)need, (long long)(have < 0 ? 0 : have)), -1;
  return 0;
}

static void byteswap(void *data, size_t isz, int64_t n) {
  unsigned char *p = data;
  for (int64_t i = 0; i < n; i++, p += isz)
    for (size_t j = 0; j < isz / 2; j++) {
      unsigned char t = p[j];
      p[j] = p[isz - 1 - j];
      p[isz - 1 - j] = t;
    }
}

/* A C-order copy of column-major data [src] of [h]'s shape. */
static Array *from_fortran(const NpyHeader *h, const Array *src) {
  Array *out = arr_new(h->dtype, h->ndim, h->shape);
  if (!out)
    return NULL;
  int64_t fst[SHM_MAXDIM], idx[SHM_MAXDIM] = {0}, st = 1;
  for (int i = 0; i < h->ndim; i++) {
    fst[i] = st;
    st *= h->shape[i];
  }
  size_t isz = dt_size(h->dtype);
  const char *s = arr_data(src);
  char *d = arr_data(out);
  for (int64_t f = 0; f < out->size; f++) {
    int64_t off = 0;
    for (int i = 0; i < h->ndim; i++)
      off += idx[i] * fst[i];
    memcpy(d + (size_t)f * isz, s + (size_t)off * isz, isz);
    for (int i = h->ndim - 1; i >= 0 && ++idx[i] == h->shape[i]; i--)
      idx[i] = 0;
  }
  return out;
}

static Array *load_data(FILE *f, const char *path, const NpyHeader *h) {
  Array *a = arr_new(h->dtype, h->ndim, h->shape);
  if (!a)
    return NULL;
  size_t isz = dt_size(h->dtype);
  if (read_exact(f, arr_data(a), (size_t)a->size * isz, path, "data") < 0) {
    val_decref(&a->hdr);
    return NULL;
  }
  if (h->big_endian)
    byteswap(arr_data(a), isz, a->size);
  if (h->dtype == DT_BOOL) {   /* any nonzero byte is True */
    unsigned char *p = arr_data(a);
    for (int64_t i = 0; i < a->size; i++)
      p[i] = p[i] != 0;
  }
  if (h->fortran && h->ndim > 1) {
    Array *c = from_fortran(h, a);
    val_decref(&a->hdr);
    a = c;
  }
  return a;
}

Value *npy_load(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return err_set(ERR_IO, "cannot open '%s': %s", path, strerror(errno));
  struct stat st;
  NpyHeader h;
  long data_start = 0;
  Array *a = NULL;
  if (fstat(fileno(f), &st) != 0)
    err_set(ERR_IO, "cannot read '%s': %s", path, strerror(errno));
  else if (read_preamble(f, path, &h, &data_start) == 0 &&
           check_size(path, &h, (long)st.st_size, data_start) == 0)
    a = load_data(f, path, &h);
  fclose(f);
  return a ? &a->hdr : NULL;
}

/* ---- saving --------------------------------------------------------------------------- */

static const char *save_descr(DType t) {
  switch (t) {
  case DT_BOOL: return "|b1";
  case DT_I8: return "|i1";
  case DT_I32: return "<i4";
  case DT_I64: return "<i8";
  case DT_F16: return "<f2";
  case DT_F64: return "<f8";
  default: return "<f4";   /* f32, and bf16 widened (npy.h) */
  }
}

/* The dict np.save writes, with its spare room: NumPy pads the dict so
 * the first dim can grow to 21 digits in place. */
static int header_dict(const Array *a, DType t, char *out, size_t cap) {
  char shp[SHM_MAXDIM * 24 + 8];
  shape_str(shp, sizeof shp, a->ndim, a->shape);
  int n = snprintf(out, cap, "{'descr': '%s', 'fortran_order': False, "
                   "'shape': %s, }", save_descr(t), shp);
  if (a->ndim > 0) {
    int digits = snprintf(NULL, 0, "%lld", (long long)a->shape[0]);
    for (int i = digits; i < 21 && (size_t)n + 1 < cap; i++)
      out[n++] = ' ';
    out[n] = '\0';
  }
  return n;
}

/* Magic, version, length and the header padded with spaces and a '\n' to
 * a multiple of 64 bytes (always at least one space, as NumPy does), into
 * [*out] (owned). */
static int build_header(const Array *a, DType t, char **out, size_t *len) {
  char dict[SHM_MAXDIM * 24 + 128];
  size_t n = (size_t)header_dict(a, t, dict, sizeof dict);
  size_t pre = 10, hlen = n + 1;
  size_t pad = 64 - (pre + hlen) % 64;
  if (hlen + pad > 65535) {   /* version 2.0: a 4-byte length */
    pre = 12;
    pad = 64 - (pre + hlen) % 64;
  }
  size_t total = pre + hlen + pad;
  char *h = shm_malloc(total);
  if (!h)
    return err_nomem(), -1;
  memcpy(h, npy_magic, 6);
  h[6] = pre == 12 ? 2 : 1;
  h[7] = 0;
  for (size_t i = 0; i < pre - 8; i++)
    h[8 + i] = (char)(((hlen + pad) >> (8 * i)) & 0xff);
  memcpy(h + pre, dict, n);
  memset(h + pre + n, ' ', pad);
  h[total - 1] = '\n';
  *out = h;
  *len = total;
  return 0;
}

/* The elements to write: [a] itself if contiguous, else a copy; bf16 as
 * f32. */
static Array *save_payload(Array *a) {
  if (a->dtype == DT_BF16)
    return arr_astype(a, DT_F32, false);
  return arr_contiguous(a);
}

int npy_save(const char *path, Array *a) {
  Array *c = save_payload(a);
  if (!c)
    return -1;
  char *hdr;
  size_t hlen;
  if (build_header(c, c->dtype, &hdr, &hlen) < 0) {
    val_decref(&c->hdr);
    return -1;
  }
  int rc = 0;
  FILE *f = fopen(path, "wb");
  size_t nbytes = (size_t)c->size * dt_size(c->dtype);
  if (!f) {
    err_set(ERR_IO, "cannot create '%s': %s", path, strerror(errno));
    rc = -1;
  } else {
    bool ok = fwrite(hdr, 1, hlen, f) == hlen &&
              (nbytes == 0 || fwrite(arr_data(c), 1, nbytes, f) == nbytes);
    if (fclose(f) != 0)
      ok = false;
    if (!ok) {
      err_set(ERR_IO, "cannot write '%s': %s", path, strerror(errno));
      rc = -1;
    }
  }
  shm_free(hdr);
  val_decref(&c->hdr);
  return rc;
}
