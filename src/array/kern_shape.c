/*
 * kern_shape.c - layout, creation and indexing kernels (kernels.h).
 *
 * broadcast_in_dim, reshape (of contiguous data), transpose, squeeze,
 * expand_dims, rev, slice and dynamic_slice return views sharing the
 * operand's buffer, as NumPy's equivalents do; the others write a new
 * contiguous array.  Parameters were checked by the shape rules (prim.c);
 * the kernels re-read them but do not re-validate.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/error.h"
#include "array/kernels.h"
#include "base/mem.h"

/* ---- helpers ------------------------------------------------------------------ */

/* Copies [src] (any layout) into [dst] (any layout, same shape and dtype),
 * leaving the rest undone at Ctrl-C (looked at every KERN_CHUNK
 * elements): only kernels call it, and prim_run_kernel fails an
 * interrupted one. */
static void kern_assign(Array *dst, const Array *src) {
  size_t isz = dt_size(dst->dtype);
  const int64_t *st[2] = {dst->strides, src->strides};
  int64_t offs[2] = {dst->offset, src->offset};
  KernIter it;
  kern_iter_init(&it, dst->ndim, dst->shape, 2, st, offs);
  arr_check_held(src);
  char *d = dst->buf->data;
  const char *s = src->buf->data;
  for (bool more = !it.done; more; more = kern_iter_next(&it)) {
    char *dp = d + it.off[0] * (int64_t)isz;
    const char *sp = s + it.off[1] * (int64_t)isz;
    int64_t ds = it.inner_stride[0] * (int64_t)isz, ss = it.inner_stride[1] * (int64_t)isz;
    if (ds == (int64_t)isz && ss == (int64_t)isz) {
      kern_move_polled(dp, sp, (size_t)it.inner * isz);
      continue;
    }
    KERN_FOR_POLLED(i, 0, it.inner, KERN_CHUNK)
      memcpy(dp + i * ds, sp + i * ss, isz);
  }
}

/* Hands [res] (stolen) to the caller: stored in *out when prim_apply left
 * it empty, else copied into the preallocated *out. */
static int kern_emit(Array *res, Array **out) {
  if (!res)
    return -1;
  if (!*out) {
    *out = res;
    return 0;
  }
  kern_assign(*out, res);
  val_decref(&res->hdr);
  return 0;
}

/* A fresh contiguous output for [like]'s dtype and the given shape, unless
 * prim_apply preallocated one. */
static Array *kern_fresh(Array **out, DType t, int ndim, const int64_t *shape) {
  if (*out)
    return (Array *)val_incref(&(*out)->hdr);
  return arr_new(t, ndim, shape);
}

/* ---- views ---------------------------------------------------------------------- */

int kern_broadcast_in_dim(Array **in, int nin, const Params *p, Array **out) {
  Array *x = in[0];
  int64_t shape[SHM_MAXDIM], bd[SHM_MAXDIM], strides[SHM_MAXDIM] = {0};
  int n, nb;
  if (params_ints(p, "shape", &n, shape, SHM_MAXDIM) < 0 ||
      params_ints(p, "broadcast_dimensions", &nb, bd, SHM_MAXDIM) < 0)
    return -1;
  for (int i = 0; i < nb; i++)
    strides[bd[i]] = x->shape[i] == shape[bd[i]] ? x->strides[i] : 0;
  return kern_emit(arr_view(x, n, shape, strides, x->offset), out);
}

/* A row-major view of contiguous [x] with [shape]. */
static Array *kern_reshape_view(Array *x, int n, const int64_t *shape) {
  int64_t strides[SHM_MAXDIM];
  shape_strides(n, shape, strides);
  return arr_view(x, n, shape, strides, x->offset);
}

/* transpose as a view: output dim i is operand dim perm[i]. */
static Array *kern_permute(Array *x, const int64_t *perm) {
  int64_t shape[SHM_MAXDIM], strides[SHM_MAXDIM];
  for (int i = 0; i < x->ndim; i++) {
    shape[i] = x->shape[perm[i]];
    strides[i] = x->strides[perm[i]];
  }
  return arr_view(x, x->ndim, shape, strides, x->offset);
}

int kern_reshape(Array **in, int nin, const Params *p, Array **out) {
  int64_t shape[SHM_MAXDIM], dims[SHM_MAXDIM];
  int n, nd = 0;
  if (params_ints(p, "new_sizes", &n, shape, SHM_MAXDIM) < 0)
    return -1;
  Value *dv = params_get(p, "dimensions");
  if (dv && dv != VAL_NONE && params_ints(p, "dimensions", &nd, dims, SHM_MAXDIM) < 0)
    return -1;
  Array *x = nd ? kern_permute(in[0], dims) : (Array *)val_incref(&in[0]->hdr);
  Array *c = x ? arr_contiguous(x) : NULL;
  if (x)
    val_decref(&x->hdr);
  if (!c)
    return -1;
  Array *v = kern_reshape_view(c, n, shape);
  val_decref(&c->hdr);
  return kern_emit(v, out);
}

int kern_transpose(Array **in, int nin, const Params *p, Array **out) {
  int64_t perm[SHM_MAXDIM];
  int n;
  if (params_ints(p, "permutation", &n, perm, SHM_MAXDIM) < 0)
    return -1;
  return kern_emit(kern_permute(in[0], perm), out);
}

int kern_squeeze(Array **in, int nin, const Params *p, Array **out) {
  Array *x = in[0];
  int64_t dims[SHM_MAXDIM], shape[SHM_MAXDIM], strides[SHM_MAXDIM];
  bool drop[SHM_MAXDIM] = {false};
  int n, k = 0;
  if (params_ints(p, "dimensions", &n, dims, SHM_MAXDIM) < 0)
    return -1;
  for (int i = 0; i < n; i++)
    drop[dims[i] < 0 ? dims[i] + x->ndim : dims[i]] = true;
  for (int i = 0; i < x->ndim; i++) {
    if (drop[i])
      continue;
    shape[k] = x->shape[i];
    strides[k++] = x->strides[i];
  }
  return kern_emit(arr_view(x, k, shape, strides, x->offset), out);
}

int kern_expand_dims(Array **in, int nin, const Params *p, Array **out) {
  Array *x = in[0];
  int64_t dims[SHM_MAXDIM], shape[SHM_MAXDIM], strides[SHM_MAXDIM];
  bool add[SHM_MAXDIM] = {false};
  int n;
  if (params_ints(p, "dimensions", &n, dims, SHM_MAXDIM) < 0)
    return -1;
  int nout = x->ndim + n;
  for (int i = 0; i < n; i++)
    add[dims[i] < 0 ? dims[i] + nout : dims[i]] = true;
  for (int i = 0, k = 0; i < nout; i++) {
    shape[i] = add[i] ? 1 : x->shape[k];
    strides[i] = add[i] ? 0 : x->strides[k];
    k += !add[i];
  }
  return kern_emit(arr_view(x, nout, shape, strides, x->offset), out);
}

int kern_rev(Array **in, int nin, const Params *p, Array **out) {
  Array *x = in[0];
  int64_t dims[SHM_MAXDIM], strides[SHM_MAXDIM];
  int n;
  if (params_ints(p, "dimensions", &n, dims, SHM_MAXDIM) < 0)
    return -1;
  int64_t off = x->offset;
  memcpy(strides, x->strides, sizeof(int64_t) * x->ndim);
  for (int i = 0; i < n; i++) {
    int d = (int)(dims[i] < 0 ? dims[i] + x->ndim : dims[i]);
    if (x->shape[d] > 0)
      off += (x->shape[d] - 1) * strides[d];
    strides[d] = -strides[d];
  }
  return kern_emit(arr_view(x, x->ndim, x->shape, strides, off), out);
}

int kern_slice(Array **in, int nin, const Params *p, Array **out) {
  Array *x = in[0];
  int64_t start[SHM_MAXDIM], limit[SHM_MAXDIM], step[SHM_MAXDIM];
  int64_t shape[SHM_MAXDIM], strides[SHM_MAXDIM];
  int n, nl, ns = 0;
  if (params_ints(p, "start_indices", &n, start, SHM_MAXDIM) < 0 ||
      params_ints(p, "limit_indices", &nl, limit, SHM_MAXDIM) < 0)
    return -1;
  Value *sv = params_get(p, "strides");
  if (sv && sv != VAL_NONE && params_ints(p, "strides", &ns, step, SHM_MAXDIM) < 0)
    return -1;
  int64_t off = x->offset;
  for (int i = 0; i < x->ndim; i++) {
    int64_t s = ns ? step[i] : 1;
    int64_t len = limit[i] - start[i];
    shape[i] = len <= 0 ? 0 : (len + s - 1) / s;
    strides[i] = x->strides[i] * s;
    if (shape[i] > 0)
      off += start[i] * x->strides[i];
  }
  return kern_emit(arr_view(x, x->ndim, shape, strides, off), out);
}

/* Reads the start operands in[first..] and clamps them so a window of
 * [sizes] fits in [x], as lax.dynamic_slice does. */
static int kern_starts(Array **in, int first, const Array *x, const int64_t *sizes,
                       int64_t *starts) {
  for (int i = 0; i < x->ndim; i++) {
    int64_t s;
    if (arr_to_index(&in[first + i]->hdr, &s) < 0)
      return -1;
    int64_t hi = x->shape[i] - sizes[i];
    starts[i] = s < 0 ? 0 : s > hi ? hi : s;
  }
  return 0;
}

int kern_dynamic_slice(Array **in, int nin, const Params *p, Array **out) {
  Array *x = in[0];
  int64_t sizes[SHM_MAXDIM], starts[SHM_MAXDIM];
  int n;
  if (params_ints(p, "slice_sizes", &n, sizes, SHM_MAXDIM) < 0 ||
      kern_starts(in, 1, x, sizes, starts) < 0)
    return -1;
  int64_t off = x->offset;
  for (int i = 0; i < x->ndim; i++)
    off += starts[i] * x->strides[i];
  return kern_emit(arr_view(x, x->ndim, sizes, x->strides, off), out);
}

/* ---- copies into fresh arrays ------------------------------------------------------ */

/* A view of [dst] at [starts] with [shape] and step [steps] (NULL: 1). */
static Array *kern_window(Array *dst, const int64_t *starts, const int64_t *shape,
                          const int64_t *steps) {
  int64_t strides[SHM_MAXDIM], off = dst->offset;
  for (int i = 0; i < dst->ndim; i++) {
    off += starts[i] * dst->strides[i];
    strides[i] = dst->strides[i] * (steps ? steps[i] : 1);
  }
  return arr_view(dst, dst->ndim, shape, strides, off);
}

int kern_dynamic_update_slice(Array **in, int nin, const Params *p, Array **out) {
  Array *x = in[0], *u = in[1];
  int64_t starts[SHM_MAXDIM];
  if (kern_starts(in, 2, x, u->shape, starts) < 0)
    return -1;
  Array *o = kern_fresh(out, x->dtype, x->ndim, x->shape);
  if (!o)
    return -1;
  if (o != x)   /* else updated in place (PrimRules.updates_operand) */
    kern_assign(o, x);
  Array *w = kern_window(o, starts, u->shape, NULL);
  if (w) {
    kern_assign(w, u);
    val_decref(&w->hdr);
  }
  if (!w) {
    val_decref(&o->hdr);
    return -1;
  }
  if (*out) {
    val_decref(&o->hdr);
    return 0;
  }
  *out = o;
  return 0;
}

int kern_concatenate(Array **in, int nin, const Params *p, Array **out) {
  int64_t dim64, shape[SHM_MAXDIM], starts[SHM_MAXDIM] = {0};
  if (params_int(p, "dimension", &dim64) < 0)
    return -1;
  int d = (int)(dim64 < 0 ? dim64 + in[0]->ndim : dim64);
  memcpy(shape, in[0]->shape, sizeof(int64_t) * in[0]->ndim);
  shape[d] = 0;
  for (int k = 0; k < nin; k++)
    shape[d] += in[k]->shape[d];
  Array *o = kern_fresh(out, in[0]->dtype, in[0]->ndim, shape);
  if (!o)
    return -1;
  for (int k = 0; k < nin; k++) {
    Array *w = kern_window(o, starts, in[k]->shape, NULL);
    if (!w) {
      val_decref(&o->hdr);
      return -1;
    }
    kern_assign(w, in[k]);
    val_decref(&w->hdr);
    starts[d] += in[k]->shape[d];
  }
  if (*out)
    val_decref(&o->hdr);
  else
    *out = o;
  return 0;
}

/* Fills [n] elements of [isz] bytes at [dst] with the element at [val]. */
static void kern_fill(char *dst, const void *val, size_t isz, int64_t n) {
  if (n <= 0)
    return;
  memcpy(dst, val, isz);
  int64_t done = 1;
  while (done < n) {
    int64_t k = done < n - done ? done : n - done;
    memcpy(dst + done * (int64_t)isz, dst, (size_t)k * isz);
    done += k;
  }
}

/* Copies the elements of [x] that land inside [o] to their padded places:
 * element j of a dim goes to lo + j*(interior+1), and those falling
 * outside (negative lo or hi crop) are skipped. */
static int kern_pad_copy(Array *x, Array *o, const int64_t *lo, const int64_t *it) {
  int64_t xs[SHM_MAXDIM], xn[SHM_MAXDIM], os[SHM_MAXDIM], step[SHM_MAXDIM], one[SHM_MAXDIM];
  for (int i = 0; i < x->ndim; i++) {
    int64_t g = it[i] + 1, last = o->shape[i] - 1 - lo[i];
    int64_t jmin = lo[i] >= 0 ? 0 : (-lo[i] + g - 1) / g;
    int64_t jmax = last < 0 ? -1 : last / g;
    if (jmax > x->shape[i] - 1)
      jmax = x->shape[i] - 1;
    if (jmax < jmin)
      return 0;   /* nothing of x survives the cropping */
    xs[i] = jmin;
    xn[i] = jmax - jmin + 1;
    os[i] = lo[i] + jmin * g;
    step[i] = g;
    one[i] = 1;
  }
  Array *src = kern_window(x, xs, xn, one);
  Array *dst = src ? kern_window(o, os, xn, step) : NULL;
  if (dst)
    kern_assign(dst, src);
  if (src)
    val_decref(&src->hdr);
  if (!dst)
    return -1;
  val_decref(&dst->hdr);
  return 0;
}

/* pad[padding_config]: per dim (lo, hi, interior); lo/hi may be negative
 * (cropping), as in lax.pad. */
int kern_pad(Array **in, int nin, const Params *p, Array **out) {
  Array *x = in[0];
  int64_t lo[SHM_MAXDIM], hi[SHM_MAXDIM], it[SHM_MAXDIM], shape[SHM_MAXDIM];
  if (kern_padding_config(params_get(p, "padding_config"), x->ndim, lo, hi, it) < 0)
    return -1;
  for (int i = 0; i < x->ndim; i++)
    shape[i] = lo[i] + hi[i] + x->shape[i] + (x->shape[i] > 0 ? (x->shape[i] - 1) * it[i] : 0);
  Array *o = kern_fresh(out, x->dtype, x->ndim, shape);
  if (!o)
    return -1;
  kern_fill(arr_data(o), arr_data(in[1]), dt_size(x->dtype), o->size);
  int rc = o->size ? kern_pad_copy(x, o, lo, it) : 0;
  if (*out || rc < 0)
    val_decref(&o->hdr);
  else
    *out = o;
  return rc;
}

/* Reads a padding_config tuple of (lo, hi, interior) triples. */
int kern_padding_config(Value *cfg, int ndim, int64_t *lo, int64_t *hi, int64_t *it) {
  size_t n;
  Value *const *items;
  if (!cfg || !val_seq(cfg, &n, &items) || n != (size_t)ndim) {
    err_set(ERR_VALUE, "pad: padding_config must have one (lo, hi, interior) per dimension (%d)",
            ndim);
    return -1;
  }
  for (int i = 0; i < ndim; i++) {
    size_t m;
    Value *const *tr;
    if (!val_seq(items[i], &m, &tr) || m != 3 || arr_to_index(tr[0], &lo[i]) < 0 ||
        arr_to_index(tr[1], &hi[i]) < 0 || arr_to_index(tr[2], &it[i]) < 0) {
      err_clear();
      err_set(ERR_VALUE, "pad: padding_config entries must be (lo, hi, interior) integer triples");
      return -1;
    }
  }
  return 0;
}

/* ---- gather and scatter along one axis ------------------------------------------------ */

/* Splits [x] around [axis]: P before, N along, Q after. */
static void kern_pnq(const Array *x, int axis, int64_t *pp, int64_t *n, int64_t *q) {
  *pp = 1;
  *q = 1;
  for (int i = 0; i < axis; i++)
    *pp *= x->shape[i];
  *n = x->shape[axis];
  for (int i = axis + 1; i < x->ndim; i++)
    *q *= x->shape[i];
}

/* Operand contiguous and indices as contiguous int64. */
static int kern_take_args(Array *x, Array *idx, Array **cx, Array **ci) {
  *cx = arr_contiguous(x);
  *ci = *cx ? arr_astype(idx, DT_I64, false) : NULL;
  if (*ci)
    return 0;
  if (*cx)
    val_decref(&(*cx)->hdr);
  return -1;
}

/* out[a, m, :] = x[a, clamp(idx[m]), :] over the (P, N, Q) split of x. */
static void kern_take_rows(const Array *x, const Array *ix, int64_t pp, int64_t n, int64_t q,
                           Array *o) {
  size_t row = (size_t)q * dt_size(x->dtype);
  const int64_t *id = arr_data(ix);
  const char *xd = arr_data(x);
  char *od = arr_data(o);
  for (int64_t a = 0; a < pp; a++)
    for (int64_t m = 0; m < ix->size; m++) {
      int64_t j = id[m] < 0 ? 0 : id[m] >= n ? n - 1 : id[m];
      memcpy(od + (size_t)(a * ix->size + m) * row, xd + (size_t)(a * n + j) * row, row);
    }
}

int kern_gather(Array **in, int nin, const Params *p, Array **out) {
  int64_t ax64;
  int axis;
  if (params_int(p, "axis", &ax64) < 0 || axis_normalize(ax64, in[0]->ndim, &axis) < 0)
    return -1;
  Array *x, *ix;
  if (kern_take_args(in[0], in[1], &x, &ix) < 0)
    return -1;
  int64_t pp, n, q, shape[SHM_MAXDIM];
  kern_pnq(x, axis, &pp, &n, &q);
  int nd = 0;
  for (int i = 0; i < axis; i++)
    shape[nd++] = x->shape[i];
  for (int i = 0; i < ix->ndim; i++)
    shape[nd++] = ix->shape[i];
  for (int i = axis + 1; i < x->ndim; i++)
    shape[nd++] = x->shape[i];
  Array *o = kern_fresh(out, x->dtype, nd, shape);
  if (o && n == 0)   /* nothing to take from: zeros rather than garbage */
    memset(arr_data(o), 0, (size_t)o->size * dt_size(o->dtype));
  if (o && n > 0)
    kern_take_rows(x, ix, pp, n, q, o);
  val_decref(&x->hdr);
  val_decref(&ix->hdr);
  if (!o)
    return -1;
  if (*out)
    val_decref(&o->hdr);
  else
    *out = o;
  return 0;
}

/* dst[i] += src[i] for [q] elements of dtype [t]. */
#define ADD_ROW(NAME, T, U)                                                   \
  static void NAME(void *pd, const void *ps, int64_t q) {                    \
    T *d = pd;                                                               \
    const T *s = ps;                                                         \
    for (int64_t i = 0; i < q; i++)                                          \
      d[i] = (T)((U)d[i] + (U)s[i]);                                         \
  }
ADD_ROW(add_row_i8, int8_t, uint8_t)
ADD_ROW(add_row_i32, int32_t, uint32_t)
ADD_ROW(add_row_i64, int64_t, uint64_t)
ADD_ROW(add_row_f32, float, float)
ADD_ROW(add_row_f64, double, double)

static void kern_add_row(DType t, void *d, const void *s, int64_t q) {
  switch (t) {
    case DT_BOOL:
      for (int64_t i = 0; i < q; i++)
        ((uint8_t *)d)[i] |= ((const uint8_t *)s)[i];
      break;
    case DT_I8: add_row_i8(d, s, q); break;
    case DT_I32: add_row_i32(d, s, q); break;
    case DT_I64: add_row_i64(d, s, q); break;
    case DT_F32: add_row_f32(d, s, q); break;
    case DT_F64: add_row_f64(d, s, q); break;
    default:
      for (int64_t i = 0; i < q; i++) {
        float a, b;
        kern_convert(&a, DT_F32, (const uint16_t *)d + i, t, 1);
        kern_convert(&b, DT_F32, (const uint16_t *)s + i, t, 1);
        a += b;
        kern_convert((uint16_t *)d + i, t, &a, DT_F32, 1);
      }
  }
}

int kern_scatter_mode(const char *mode) {
  static const char *const names[] = {"set", "add", "multiply", "min", "max"};
  for (int i = 0; i < 5; i++)
    if (!strcmp(mode, names[i])) return i;
  return -1;
}

/* d[i] = d[i] op s[i] for the modes past add, through int64 for integers
 * and bool and through float64 for floats; min and max propagate NaN, as
 * lax.min and lax.max do. */
static void kern_combine_row(DType t, char *d, const char *s, int64_t q, int mode) {
  size_t isz = dt_size(t);
  bool flt = dt_is_float(t);
  for (int64_t i = 0; i < q; i++) {
    char *dp = d + (size_t)i * isz;
    const char *sp = s + (size_t)i * isz;
    if (flt) {
      double a, b, r;
      kern_convert(&a, DT_F64, dp, t, 1);
      kern_convert(&b, DT_F64, sp, t, 1);
      if (mode == SCATTER_MUL) r = a * b;
      else if (a != a || b != b) r = a != a ? a : b;
      else r = mode == SCATTER_MIN ? (b < a ? b : a) : (b > a ? b : a);
      kern_convert(dp, t, &r, DT_F64, 1);
    } else {
      int64_t a, b, r;
      kern_convert(&a, DT_I64, dp, t, 1);
      kern_convert(&b, DT_I64, sp, t, 1);
      r = mode == SCATTER_MUL ? (int64_t)((uint64_t)a * (uint64_t)b)
          : mode == SCATTER_MIN ? (b < a ? b : a) : (b > a ? b : a);
      kern_convert(dp, t, &r, DT_I64, 1);
    }
  }
}

/* o[a, idx[m], :] = (or combined with) u[a, m, :]; out-of-range indices
 * dropped. */
static void kern_put_rows(Array *o, int axis, const Array *ix, const Array *u, int mode) {
  int64_t pp, n, q;
  kern_pnq(o, axis, &pp, &n, &q);
  size_t row = (size_t)q * dt_size(o->dtype);
  const int64_t *id = arr_data(ix);
  const char *ud = arr_data(u);
  char *od = arr_data(o);
  for (int64_t a = 0; a < pp; a++)
    for (int64_t m = 0; m < ix->size; m++) {
      if (id[m] < 0 || id[m] >= n)
        continue;
      char *dst = od + (size_t)(a * n + id[m]) * row;
      const char *src = ud + (size_t)(a * ix->size + m) * row;
      if (mode == SCATTER_ADD)
        kern_add_row(o->dtype, dst, src, q);
      else if (mode == SCATTER_SET)
        memcpy(dst, src, row);
      else
        kern_combine_row(o->dtype, dst, src, q, mode);
    }
}

/* scatter[axis mode](operand, indices, updates): the inverse of gather;
 * updates at out-of-range indices are dropped (JAX's default for .at[]);
 * mode set, add, multiply, min or max (lax's scatter, scatter_add,
 * scatter_mul, scatter_min, scatter_max). */
int kern_scatter(Array **in, int nin, const Params *p, Array **out) {
  int64_t ax64;
  int axis;
  int how = SCATTER_SET;
  if (params_int(p, "axis", &ax64) < 0 || axis_normalize(ax64, in[0]->ndim, &axis) < 0)
    return -1;
  Value *mode = params_get(p, "mode");
  if (mode && mode->type == V_STR && kern_scatter_mode(str_cstr(mode)) >= 0)
    how = kern_scatter_mode(str_cstr(mode));
  Array *ix, *u, *o = kern_fresh(out, in[0]->dtype, in[0]->ndim, in[0]->shape);
  if (!o)
    return -1;
  if (o != in[0])   /* else updated in place (PrimRules.updates_operand) */
    kern_assign(o, in[0]);
  if (kern_take_args(in[2], in[1], &u, &ix) < 0) {
    val_decref(&o->hdr);
    return -1;
  }
  kern_put_rows(o, axis, ix, u, how);
  val_decref(&ix->hdr);
  val_decref(&u->hdr);
  if (*out)
    val_decref(&o->hdr);
  else
    *out = o;
  return 0;
}

/* ---- iota ------------------------------------------------------------------------------ */

/* [rows] rows of 0, 1, ..., len - 1 in dtype [t], one after another at
 * [od]: converted from int64 a block at a time, looking at Ctrl-C between
 * blocks (an arange of 2**31 is seconds of work). */
static void iota_rows(char *od, DType t, int64_t rows, int64_t len) {
  enum { BLOCK = 4096 };
  int64_t idx[BLOCK];
  size_t isz = dt_size(t);
  for (int64_t r = 0; r < rows; r++)
    for (int64_t s = 0; s < len; s += BLOCK) {
      if ((s & ((1 << 22) - 1)) == 0 && shm_interrupt_pending()) return;   /* prim_apply fails it */
      int64_t n = len - s < BLOCK ? len - s : BLOCK;
      for (int64_t k = 0; k < n; k++) idx[k] = s + k;
      kern_convert(od + (size_t)(r * len + s) * isz, t, idx, DT_I64, n);
    }
}

int kern_iota(Array **in, int nin, const Params *p, Array **out) {
  DType t;
  int64_t shape[SHM_MAXDIM], dim = 0;
  int n;
  if (params_dtype(p, "dtype", &t) < 0 || params_ints(p, "shape", &n, shape, SHM_MAXDIM) < 0)
    return -1;
  if (params_get(p, "dimension") && params_int(p, "dimension", &dim) < 0)
    return -1;
  Array *o = kern_fresh(out, t, n, shape);
  if (!o)
    return -1;
  int64_t pp = 1, len = n ? shape[dim] : 1, q = 1;
  for (int i = 0; i < dim; i++)
    pp *= shape[i];
  for (int i = (int)dim + 1; i < n; i++)
    q *= shape[i];
  size_t isz = dt_size(t);
  char *od = arr_data(o);
  if (q == 1 && o->size) {   /* the iota runs along the last axis: whole runs */
    iota_rows(od, t, pp, len);
    goto done;
  }
  for (int64_t j = 0; j < len && o->size; j++) {
    if ((j & 0xFFFFF) == 0 && shm_interrupt_pending()) break;   /* prim_apply fails it */
    char one[8];
    kern_convert(one, t, &j, DT_I64, 1);
    for (int64_t a = 0; a < pp; a++)
      kern_fill(od + (size_t)((a * len + j) * q) * isz, one, isz, q);
  }
done:
  if (*out)
    val_decref(&o->hdr);
  else
    *out = o;
  return 0;
}

/* ---- sort ------------------------------------------------------------------------------- */

/* Stable merge sort of [n] values with NaN last (lax.sort's order). */
#define MSORT(NAME, T)                                                        \
  static bool NAME##_lt(T a, T b) { return a < b || (b != b && a == a); }    \
  static void NAME(T *x, T *tmp, int64_t n) {                                \
    if (n < 2)                                                               \
      return;                                                                \
    if (n <= 16) {                                                           \
      for (int64_t i = 1; i < n; i++) {                                      \
        T v = x[i];                                                          \
        int64_t j = i;                                                       \
        for (; j > 0 && NAME##_lt(v, x[j - 1]); j--)                         \
          x[j] = x[j - 1];                                                   \
        x[j] = v;                                                            \
      }                                                                      \
      return;                                                                \
    }                                                                        \
    int64_t m = n / 2, i = 0, j = m, k = 0;                                  \
    NAME(x, tmp, m);                                                         \
    NAME(x + m, tmp, n - m);                                                 \
    memcpy(tmp, x, sizeof(T) * (size_t)m);                                   \
    while (i < m && j < n)                                                   \
      x[k++] = NAME##_lt(x[j], tmp[i]) ? x[j++] : tmp[i++];                  \
    while (i < m)                                                            \
      x[k++] = tmp[i++];                                                     \
  }
MSORT(msort_u8, uint8_t)
MSORT(msort_i8, int8_t)
MSORT(msort_i32, int32_t)
MSORT(msort_i64, int64_t)
MSORT(msort_f32, float)
MSORT(msort_f64, double)

/* Sorts each of [rows] contiguous rows of [len] elements of [t]. */
static void kern_sort_rows(DType t, char *d, int64_t rows, int64_t len, void *tmp) {
  size_t isz = dt_size(t);
  for (int64_t r = 0; r < rows; r++) {
    void *x = d + (size_t)(r * len) * isz;
    switch (t) {
      case DT_BOOL: msort_u8(x, tmp, len); break;
      case DT_I8: msort_i8(x, tmp, len); break;
      case DT_I32: msort_i32(x, tmp, len); break;
      case DT_I64: msort_i64(x, tmp, len); break;
      case DT_F64: msort_f64(x, tmp, len); break;
      default: msort_f32(x, tmp, len); break;
    }
  }
}

/* The layout of a sort along "dimension" of [p] (default last) of [x]:
 * the axis [d], the permutation moving it last and its inverse, and the
 * permuted keys as a contiguous array (float32 for the half types, a copy
 * when [copy]).  NULL with the error set. */
static Array *sort_keys(Array *x, const Params *p, bool copy, int *d, int64_t *perm,
                        int64_t *inv) {
  int64_t d64 = x->ndim - 1;
  if (params_get(p, "dimension") && params_int(p, "dimension", &d64) < 0)
    return NULL;
  if (axis_normalize(d64, x->ndim, d) < 0)
    return NULL;
  for (int i = 0, k = 0; i < x->ndim; i++)
    if (i != *d)
      perm[k++] = i;
  perm[x->ndim - 1] = *d;
  for (int i = 0; i < x->ndim; i++)
    inv[perm[i]] = i;
  bool half = x->dtype == DT_BF16 || x->dtype == DT_F16;
  Array *v = kern_permute(x, perm);
  Array *c = v ? (half ? arr_astype(v, DT_F32, false) : copy ? arr_copy(v) : arr_contiguous(v))
               : NULL;
  if (v)
    val_decref(&v->hdr);
  return c;
}

int kern_sort(Array **in, int nin, const Params *p, Array **out) {
  Array *x = in[0];
  int64_t perm[SHM_MAXDIM], inv[SHM_MAXDIM];
  int d;
  bool half = x->dtype == DT_BF16 || x->dtype == DT_F16;
  Array *c = sort_keys(x, p, true, &d, perm, inv);
  if (!c)
    return -1;
  int64_t len = x->ndim ? x->shape[d] : 1;
  void *tmp = shm_malloc((size_t)(len / 2 + 1) * 8);
  if (!tmp) {
    val_decref(&c->hdr);
    err_nomem();
    return -1;
  }
  kern_sort_rows(c->dtype, arr_data(c), len ? c->size / len : 0, len, tmp);
  shm_free(tmp);
  Array *back = c;
  if (half) {
    back = arr_astype(c, x->dtype, false);
    val_decref(&c->hdr);
    if (!back)
      return -1;
  }
  Array *res = kern_permute(back, inv);
  val_decref(&back->hdr);
  return kern_emit(res, out);
}

/* ---- argsort ---------------------------------------------------------------------------- */

/* Stable merge sort of the int32 indices [ix] ([n] of them) by the keys
 * [k] they index, NaN last: the order lax.sort gives. */
#define ISORT(NAME, T)                                                              \
  static void NAME(const T *k, int32_t *ix, int32_t *tmp, int64_t n) {              \
    if (n < 2)                                                                     \
      return;                                                                      \
    int64_t m = n / 2, i = 0, j = m, o = 0;                                         \
    NAME(k, ix, tmp, m);                                                           \
    NAME(k, ix + m, tmp, n - m);                                                   \
    memcpy(tmp, ix, sizeof(int32_t) * (size_t)m);                                  \
    while (i < m && j < n)                                                         \
      ix[o++] = msort_##T##_key_lt(k[ix[j]], k[tmp[i]]) ? ix[j++] : tmp[i++];       \
    while (i < m)                                                                  \
      ix[o++] = tmp[i++];                                                          \
  }
#define KEY_LT(T) \
  static bool msort_##T##_key_lt(T a, T b) { return a < b || (b != b && a == a); }
typedef float f32_t;
typedef double f64_t;
KEY_LT(uint8_t) KEY_LT(int8_t) KEY_LT(int32_t) KEY_LT(int64_t) KEY_LT(f32_t) KEY_LT(f64_t)
ISORT(isort_u8, uint8_t)
ISORT(isort_i8, int8_t)
ISORT(isort_i32, int32_t)
ISORT(isort_i64, int64_t)
ISORT(isort_f32, f32_t)
ISORT(isort_f64, f64_t)

/* The stable order of each contiguous row of [len] keys of [t] in [d],
 * as int32 positions into [o]. */
static void kern_argsort_rows(DType t, const char *d, int32_t *o, int64_t rows, int64_t len,
                              int32_t *tmp) {
  size_t isz = dt_size(t);
  for (int64_t r = 0; r < rows; r++) {
    const void *x = d + (size_t)(r * len) * isz;
    int32_t *ix = o + r * len;
    for (int64_t i = 0; i < len; i++)
      ix[i] = (int32_t)i;
    switch (t) {
      case DT_BOOL: isort_u8(x, ix, tmp, len); break;
      case DT_I8: isort_i8(x, ix, tmp, len); break;
      case DT_I32: isort_i32(x, ix, tmp, len); break;
      case DT_I64: isort_i64(x, ix, tmp, len); break;
      case DT_F64: isort_f64(x, ix, tmp, len); break;
      default: isort_f32(x, ix, tmp, len); break;
    }
  }
}

int kern_argsort(Array **in, int nin, const Params *p, Array **out) {
  (void)nin;
  Array *x = in[0];
  int64_t perm[SHM_MAXDIM], inv[SHM_MAXDIM];
  int d;
  Array *c = sort_keys(x, p, false, &d, perm, inv);
  int64_t len = c && x->ndim ? x->shape[d] : 1;
  if (c && len > INT32_MAX) {
    val_decref(&c->hdr);
    err_set(ERR_VALUE, "argsort: a dimension of %lld elements exceeds int32 indices",
            (long long)len);
    return -1;
  }
  Array *ix = c ? arr_new(DT_I32, c->ndim, c->shape) : NULL;
  int32_t *tmp = shm_malloc((size_t)(len / 2 + 1) * sizeof(int32_t));
  if (!c || !ix || !tmp) {
    if (c)
      val_decref(&c->hdr);
    if (ix)
      val_decref(&ix->hdr);
    shm_free(tmp);
    if (!err_occurred())
      err_nomem();
    return -1;
  }
  kern_argsort_rows(c->dtype, arr_data(c), arr_data(ix), len ? c->size / len : 0, len, tmp);
  shm_free(tmp);
  val_decref(&c->hdr);
  Array *res = kern_permute(ix, inv);
  val_decref(&ix->hdr);
  return kern_emit(res, out);
}
