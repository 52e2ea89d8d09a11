/*
 * ops_index.c - obj[index]: NumPy indexing of arrays, Python indexing of
 * sequences and dicts, and the functional updates of `x.at[idx]`.
 *
 * Arrays: the basic items (ints, slices, None, ...) become rev, slice,
 * squeeze and expand_dims, views where the kernels allow; integer-array
 * items (with any ints, once an array item is present, as NumPy treats
 * them) are broadcast together, their axes merged into one, and taken
 * with one gather, the result's axes placed where NumPy places them.
 * Boolean masks become integer arrays (eager only: the result's shape
 * depends on the values).  `.at[idx].set/add` scatters into the flattened
 * array at the flat positions the same index selects.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "array/array.h"
#include "lang/builtins.h"
#include "lang/classes.h"
#include "base/error.h"
#include "lang/eval.h"
#include "base/intern.h"
#include "base/mem.h"
#include "base/utf8.h"
#include "lang/ops.h"
#include "lang/ops_impl.h"
#include "lang/stdmod.h"
#include "array/prim.h"
#include "array/print.h"

/* ======================================================================
 * Indexing
 * ====================================================================== */

/* One index item after classification. */
typedef enum { IX_INT, IX_SLICE, IX_NONE, IX_ARRAY } IxKind;

typedef struct IxItem {
  IxKind kind;
  int64_t i;               /* IX_INT */
  int64_t start, step, n;  /* IX_SLICE, normalised as slice.indices */
  Value *arr;              /* IX_ARRAY: an integer array (owned) */
  int dim;                 /* operand dim it consumes (-1 for None) */
} IxItem;

typedef struct Index {
  int n;
  IxItem it[2 * SHM_MAXDIM];
} Index;

static void index_free(Index *ix) {
  for (int i = 0; i < ix->n; i++) val_decref(ix->it[i].arr);
}

/* Reads an optional slice bound as an int. */
static int slice_bound(Value *v, bool *present, int64_t *out) {
  *present = v && v != VAL_NONE;
  if (!*present) return 0;
  if (!IS_ARRAY(v) || !(dt_is_int(AS_ARRAY(v)->dtype) || AS_ARRAY(v)->dtype == DT_BOOL) ||
      arr_to_index(v, out) < 0) {
    err_clear();
    err_set(ERR_TYPE, "slice indices must be integers or None");
    return -1;
  }
  return 0;
}

/* Python's slice.indices: start, step and length for a dim of size [len]. */
int ops_slice_indices(Value *sv, int64_t len, int64_t *start, int64_t *step, int64_t *n) {
  Slice *s = (Slice *)sv;
  bool hs, he, hp;
  int64_t a = 0, b = 0, c = 1;
  if (slice_bound(s->start, &hs, &a) < 0 || slice_bound(s->stop, &he, &b) < 0 ||
      slice_bound(s->step, &hp, &c) < 0)
    return -1;
  if (!hp) c = 1;
  if (c == 0) {
    err_set(ERR_VALUE, "slice step cannot be zero");
    return -1;
  }
  int64_t lo = c < 0 ? -1 : 0, hi = c < 0 ? len - 1 : len;
  if (!hs) a = c < 0 ? hi : lo;
  else if (a < 0) a = a + len < lo ? lo : a + len;
  else if (a > hi) a = hi;
  if (!he) b = c < 0 ? lo : hi;
  else if (b < 0) b = b + len < lo ? lo : b + len;
  else if (b > hi) b = hi;
  int64_t cnt = 0;
  if (c > 0 && b > a) cnt = (b - a + c - 1) / c;
  if (c < 0 && a > b) cnt = (a - b + (-c) - 1) / (-c);
  *start = a;
  *step = c;
  *n = cnt;
  return 0;
}

/* The index [key] of a list of [len], bounds checked ([what] for the
 * message). */
static int list_index(Value *key, int64_t len, const char *what, int64_t *i) {
  if (arr_to_index(key, i) < 0) return -1;
  if (*i < 0) *i += len;
  if (*i < 0 || *i >= len) {
    err_set(ERR_INDEX, "list %s index out of range", what);
    return -1;
  }
  return 0;
}

/* A deque takes only integer indices, and says "deque index out of
 * range" (Python's): -1 with that error, 0 when [l] may take [key]. */
static int deque_key(Value *l, Value *key, int64_t *i) {
  if (key->type == V_SLICE) {
    err_set(ERR_TYPE, "sequence index must be integer, not 'slice'");
    return -1;
  }
  return ops_seq_index(key, (int64_t)list_len(l), "deque", i);
}

int ops_list_setitem(Value *l, Value *key, Value *v) {
  int64_t len = (int64_t)list_len(l), i;
  if (stdmod_is_deque(l)) return deque_key(l, key, &i) < 0 ? -1 : list_splice(l, (size_t)i, 1, 1, &v);
  if (key->type != V_SLICE) {
    if (list_index(key, len, "assignment", &i) < 0) return -1;
    return list_splice(l, (size_t)i, 1, 1, &v);
  }
  int64_t start, step, n;
  size_t m;
  Value *const *items;
  if (ops_slice_indices(key, len, &start, &step, &n) < 0) return -1;
  if (!val_seq(v, &m, &items)) {
    err_set(ERR_TYPE, "can only assign an iterable");
    return -1;
  }
  if (step == 1) return list_splice(l, (size_t)start, (size_t)n, m, items);
  if ((int64_t)m != n) {
    err_set(ERR_VALUE, "attempt to assign sequence of size %zu to extended slice of size %lld", m,
            (long long)n);
    return -1;
  }
  Value *t = tuple_pack(m, items);   /* items may be the list's own */
  for (int64_t k = 0; t && k < n; k++)
    if (list_splice(l, (size_t)(start + k * step), 1, 1, &((Tuple *)t)->items[k]) < 0) break;
  if (t) val_decref(t);
  return t ? 0 : -1;
}

int ops_list_delitem(Value *l, Value *key) {
  int64_t len = (int64_t)list_len(l), i;
  if (stdmod_is_deque(l)) return deque_key(l, key, &i) < 0 ? -1 : list_splice(l, (size_t)i, 1, 0, NULL);
  if (key->type != V_SLICE) {
    if (list_index(key, len, "assignment", &i) < 0) return -1;
    return list_splice(l, (size_t)i, 1, 0, NULL);
  }
  int64_t start, step, n;
  if (ops_slice_indices(key, len, &start, &step, &n) < 0) return -1;
  if (step == 1) return list_splice(l, (size_t)start, (size_t)n, 0, NULL);
  if (step < 0) start += (n - 1) * step, step = -step;   /* delete from the back */
  for (int64_t k = n - 1; k >= 0; k--)
    if (list_splice(l, (size_t)(start + k * step), 1, 0, NULL) < 0) return -1;
  return 0;
}

static void *bad_index(Value *v) {
  (void)v;
  return err_set(ERR_INDEX, "only integers, slices (`:`), ellipsis (`...`), numpy.newaxis "
                 "(`None`) and integer or boolean arrays are valid indices");
}

/* Integer arrays from a boolean mask (eager only): one per mask dim. */
static int mask_to_ints(Value *m, Value **outs, int *nout) {
  if (!IS_ARRAY(m)) {
    err_set(ERR_INDEX, "boolean array indices are not supported under jit: the result's shape "
            "depends on the values (use where(mask, x, 0) instead)");
    return -1;
  }
  Array *a = AS_ARRAY(m);
  int64_t count = 0;
  for (int64_t i = 0; i < a->size; i++) count += arr_get_i64(a, i) != 0;
  int nd = a->ndim;
  Array *cols[SHM_MAXDIM];
  for (int d = 0; d < nd; d++) {
    cols[d] = arr_new(DT_I32, 1, &count);
    if (!cols[d]) {
      for (int e = 0; e < d; e++) val_decref((Value *)cols[e]);
      return -1;
    }
  }
  int64_t k = 0;
  for (int64_t i = 0; i < a->size; i++) {
    if (!arr_get_i64(a, i)) continue;
    int64_t rem = i;
    for (int d = nd - 1; d >= 0; d--) {
      ((int32_t *)arr_data(cols[d]))[k] = (int32_t)(rem % a->shape[d]);
      rem /= a->shape[d];
    }
    k++;
  }
  for (int d = 0; d < nd; d++) outs[d] = (Value *)cols[d];
  *nout = nd;
  return 0;
}

static int index_add(Index *ix, Value *item, const AVal *av, int *dim);

/* A boolean mask item: one integer index array per mask dim. */
static int index_add_mask(Index *ix, Value *mask, const AVal *av, int *dim) {
  AVal ma;
  ops_aval(mask, &ma);
  for (int c = 0; c < ma.ndim; c++)
    if (av->shape[*dim + c] != ma.shape[c]) {
      err_set(ERR_INDEX, "boolean index did not match indexed array along axis %d; size of "
              "axis is %lld but size of corresponding boolean axis is %lld", *dim + c,
              (long long)av->shape[*dim + c], (long long)ma.shape[c]);
      return -1;
    }
  Value *cols[SHM_MAXDIM];
  int nc;
  if (mask_to_ints(mask, cols, &nc) < 0) return -1;
  int rc = 0;
  for (int c = 0; c < nc; c++) {
    if (rc == 0) rc = index_add(ix, cols[c], av, dim);
    val_decref(cols[c]);
  }
  return rc;
}

/* Appends [item] to [ix], consuming operand dims from [*dim] (the caller
 * has checked that enough dims remain). */
static int index_add(Index *ix, Value *item, const AVal *av, int *dim) {
  if (ix->n >= 2 * SHM_MAXDIM) {
    err_set(ERR_INDEX, "too many indices");
    return -1;
  }
  if (item->type == V_LIST || item->type == V_TUPLE) {
    Value *arr = ops_to_array(item, -1);
    if (!arr) return -1;
    int r = index_add(ix, arr, av, dim);
    val_decref(arr);
    return r;
  }
  IxItem *it = &ix->it[ix->n];
  memset(it, 0, sizeof *it);
  it->dim = -1;
  if (item == VAL_NONE) {
    it->kind = IX_NONE;
    ix->n++;
    return 0;
  }
  if (item->type == V_SLICE) {
    it->kind = IX_SLICE;
    if (ops_slice_indices(item, av->shape[*dim], &it->start, &it->step, &it->n) < 0) return -1;
  } else if (ops_is_array(item)) {
    AVal ia;
    ops_aval(item, &ia);
    if (ia.dtype == DT_BOOL && ia.ndim > 0) return index_add_mask(ix, item, av, dim);
    if (!dt_is_int(ia.dtype)) {
      bad_index(item);
      return -1;
    }
    if (ia.ndim == 0 && IS_ARRAY(item)) {
      it->kind = IX_INT;
      it->i = arr_get_i64(AS_ARRAY(item), 0);
    } else {
      it->kind = IX_ARRAY;
      it->arr = val_incref(item);
    }
  } else {
    bad_index(item);
    return -1;
  }
  it->dim = (*dim)++;
  ix->n++;
  return 0;
}

/* Number of operand dims [v] consumes as an index item. */
static int item_dims(Value *v) {
  AVal ia;
  if (v == VAL_NONE || v == VAL_ELLIPSIS) return 0;
  if (ops_is_array(v) && ops_aval(v, &ia) == 0 && ia.dtype == DT_BOOL && ia.ndim > 0)
    return ia.ndim;
  if (v->type == V_LIST) {
    Value *arr = ops_to_array(v, -1);
    int n = arr ? item_dims(arr) : 1;
    err_clear();
    val_decref(arr);
    return n;
  }
  return 1;
}

/* An x.at[...] method's mode= and wrap_negative_indices= (JAX's
 * GatherScatterMode), for the call: [quiet], an explicit mode, handles
 * an index out of range eagerly as under jit (clamped, dropped or
 * filled) instead of raising; [nowrap], negative indices out of range
 * too; [upd], what an update does with one (drop, or clamp for 'clip'). */
typedef enum { OOB_CLAMP, OOB_DROP } OobMode;
static _Thread_local struct OobHow {
  bool quiet, nowrap, fill;
  OobMode upd;
} oob_how = {false, false, false, OOB_DROP};

/* Parses [index] against an operand of aval [av]: expands `...`, pads
 * with full slices, checks counts and the bounds of integer items (one
 * out of range an error, or under a quiet mode= an index array of one
 * element, handled as traced indices are). */
static int index_parse(Value *index, const AVal *av, Index *ix) {
  Value *single[1] = {index};
  size_t n = 1;
  Value *const *items = single;
  if (index->type == V_TUPLE) val_seq(index, &n, &items);
  ix->n = 0;
  int consumed = 0, ell = -1;
  for (size_t i = 0; i < n; i++) {
    if (items[i] == VAL_ELLIPSIS) {
      if (ell >= 0) {
        err_set(ERR_INDEX, "an index can only have a single ellipsis ('...')");
        return -1;
      }
      ell = (int)i;
    }
    consumed += item_dims(items[i]);
  }
  if (consumed > av->ndim) {
    err_set(ERR_INDEX, "too many indices for array: array is %d-dimensional, but %d were indexed",
            av->ndim, consumed);
    return -1;
  }
  Value *full = slice_new(VAL_NONE, VAL_NONE, VAL_NONE);
  if (!full) return -1;
  int dim = 0;
  for (size_t i = 0; i < n; i++) {
    if ((int)i != ell) {
      if (index_add(ix, items[i], av, &dim) < 0) goto fail;
      continue;
    }
    for (int k = 0; k < av->ndim - consumed; k++)
      if (index_add(ix, full, av, &dim) < 0) goto fail;
  }
  while (dim < av->ndim)
    if (index_add(ix, full, av, &dim) < 0) goto fail;
  val_decref(full);
  for (int i = 0; i < ix->n; i++) {
    IxItem *it = &ix->it[i];
    if (it->kind != IX_INT) continue;
    int64_t len = av->shape[it->dim];
    if (it->i < -len || it->i >= len || (oob_how.nowrap && it->i < 0)) {
      if (oob_how.quiet) {
        it->kind = IX_ARRAY;
        if (!(it->arr = (Value *)arr_scalar_i64(DT_I32, it->i, false))) goto fail2;
        continue;
      }
      err_set(ERR_INDEX, "index %lld is out of bounds for axis %d with size %lld",
              (long long)it->i, it->dim, (long long)len);
      goto fail2;
    }
    if (it->i < 0) it->i += len;
  }
  return 0;
fail:
  val_decref(full);
fail2:
  index_free(ix);
  return -1;
}

/* Applies the basic part of [ix] to [x]: ints and slices; array items are
 * kept as full dims.  [keep_ints] treats ints as full dims too (they become
 * advanced indices).  Writes, per array item, the result dim it maps to. */
static Value *apply_basic(Value *x, const AVal *av, Index *ix, int *adv_dim) {
  int nd = av->ndim;
  int64_t starts[SHM_MAXDIM], limits[SHM_MAXDIM], strides[SHM_MAXDIM];
  int64_t revs[SHM_MAXDIM], sq[SHM_MAXDIM], ex[SHM_MAXDIM];
  int nrev = 0, nsq = 0, nex = 0;
  bool need_slice = false, any_stride = false;
  for (int d = 0; d < nd; d++) {
    starts[d] = 0;
    limits[d] = av->shape[d];
    strides[d] = 1;
  }
  for (int i = 0; i < ix->n; i++) {
    IxItem *it = &ix->it[i];
    int d = it->dim;
    if (it->kind == IX_INT) {
      starts[d] = it->i;
      limits[d] = it->i + 1;
      need_slice = need_slice || av->shape[d] != 1;
      sq[nsq++] = d;
    } else if (it->kind == IX_SLICE) {
      int64_t len = av->shape[d], st = it->step, s0 = it->start;
      if (st < 0) {
        revs[nrev++] = d;
        s0 = len - 1 - s0;
        st = -st;
      }
      if (it->n == 0) {
        starts[d] = limits[d] = 0;
      } else {
        starts[d] = s0;
        limits[d] = s0 + (it->n - 1) * st + 1;
      }
      strides[d] = st;
      any_stride = any_stride || st != 1;
      need_slice = need_slice || starts[d] != 0 || limits[d] != len || st != 1;
    }
  }
  Value *y = val_incref(x);
  Params p;
  if (nrev) {
    params_init(&p);
    params_add(&p, "dimensions", val_int_tuple(nrev, revs));
    Value *r = ops_apply1(P_REV, y, &p);
    val_decref(y);
    if (!(y = r)) return NULL;
  }
  if (need_slice) {
    params_init(&p);
    params_add(&p, "start_indices", val_int_tuple(nd, starts));
    params_add(&p, "limit_indices", val_int_tuple(nd, limits));
    params_add(&p, "strides", any_stride ? val_int_tuple(nd, strides) : VAL_NONE);
    Value *r = ops_apply1(P_SLICE, y, &p);
    val_decref(y);
    if (!(y = r)) return NULL;
  }
  if (nsq) {
    Value *r = ops_squeeze(y, nsq, sq);
    val_decref(y);
    if (!(y = r)) return NULL;
  }
  /* None items: new dims at their position in the result. */
  int out = 0, k = 0;
  for (int i = 0; i < ix->n; i++) {
    IxItem *it = &ix->it[i];
    if (it->kind == IX_NONE) ex[nex++] = out++;
    else if (it->kind != IX_INT) {
      if (it->kind == IX_ARRAY) adv_dim[k++] = out;
      out++;
    }
  }
  if (nex) {
    Value *r = ops_expand_dims(y, nex, ex);
    val_decref(y);
    y = r;
  }
  return y;
}

/* OobMode: what an index out of range does under jit, where its value
 * is not known when the plan is made (eagerly it is an error, unless a
 * mode= says otherwise: oob_how): a read clamps it into range (JAX's
 * gather); an update (x.at[i]) drops it (JAX's scatter). */

/* [r] clamped into [0, len): each index of several, before they are
 * combined into one position (a gather of the combined position would
 * clamp the position, not the index: x[0, 5] of a (3, 4) array read
 * x[1, 1]). */
static Value *clamp_index(Value *r, int64_t len) {
  Value *lo = ops_with_const(P_MAX, r, 0);
  Value *c = lo ? ops_with_const(P_MIN, lo, (double)(len - 1)) : NULL;
  val_decref(lo);
  val_decref(r);
  return c;
}

/* Whether each index of [r] (wrapped) is in [0, len): bool, r's shape. */
static Value *index_in_range(Value *r, int64_t len) {
  Value *ge = ops_with_const(P_GE, r, 0);
  Value *lt = ge ? ops_with_const(P_LT, r, (double)len) : NULL;
  Value *v = lt ? ops_binary(OP_BITAND, ge, lt) : NULL;
  val_decref(ge);
  val_decref(lt);
  return v;
}

/* Checks concrete index values against [len] and wraps negatives; for
 * tracers, wraps with where and then, as [oob] says, clamps (when [clamp])
 * or sets [*valid] to where they are in range (OOB_DROP). */
static Value *normalize_indices(Value *idx, int64_t len, int dim, OobMode oob, bool clamp,
                                Value **valid) {
  if (IS_ARRAY(idx) && !oob_how.quiet) {
    Array *a = AS_ARRAY(idx);
    bool neg = false;
    for (int64_t i = 0; i < a->size; i++) {
      int64_t v = arr_get_i64(a, i);
      if (v < -len || v >= len || (oob_how.nowrap && v < 0))
        return err_set(ERR_INDEX, "index %lld is out of bounds for axis %d with size %lld",
                       (long long)v, dim, (long long)len);
      neg = neg || v < 0;
    }
    if (!neg) return ops_convert(idx, DT_I32, false);
  }
  AVal ia;
  if (ops_aval(idx, &ia) < 0) return NULL;
  Value *i32 = ops_convert(idx, DT_I32, ia.dtype == DT_I32 && ia.weak);
  if (!i32) return NULL;
  Value *lt = oob_how.nowrap ? NULL : ops_with_const(P_LT, i32, 0);
  Value *wrapped = lt ? ops_with_const(P_ADD, i32, (double)len) : NULL;
  Value *r = oob_how.nowrap ? val_incref(i32) : lt && wrapped ? ops_select(lt, wrapped, i32) : NULL;
  val_decref(lt);
  val_decref(wrapped);
  val_decref(i32);
  if (r && oob == OOB_DROP && !(*valid = index_in_range(r, len))) {
    val_decref(r);
    return NULL;
  }
  return r && oob == OOB_CLAMP && clamp ? clamp_index(r, len) : r;
}

static Value *gather_axis(Value *y, Value *idx, int axis) {
  Value *in[2] = {y, idx};
  Params p;
  params_init(&p);
  params_add(&p, "axis", val_int(axis));
  ops_add_out_sharding(&p);
  Value *r = ops_apply(P_GATHER, 2, in, &p);
  params_clear(&p);
  return r;
}

/* Advanced indexing on [y] (basic part done): [na] index arrays at dims
 * adv_dim[] of y. */
static Value *drop_invalid(Value *r, Value *valid, int first, int bn, const int64_t *bs);

static Value *apply_advanced(Value *y, Value **idx, const int *adv_dim, int na, Value *valid) {
  AVal ya;
  if (ops_aval(y, &ya) < 0) return NULL;
  /* Broadcast the index arrays together. */
  int bn = 0;
  int64_t bs[SHM_MAXDIM];
  for (int k = 0; k < na; k++) {
    AVal ia;
    if (ops_aval(idx[k], &ia) < 0) return NULL;
    if (k == 0) {
      bn = ia.ndim;
      memcpy(bs, ia.shape, sizeof(int64_t) * (size_t)bn);
    } else if (shape_broadcast(bn, bs, ia.ndim, ia.shape, &bn, bs) < 0) {
      return NULL;
    }
  }
  if (na > 1 && ops_explicit_split_hook) {   /* JAX's one gather: its Explicit rule */
    uint64_t dims = 0;
    char ty[512], ind[256];
    AVal ia;
    if (ops_aval(idx[0], &ia) < 0) return NULL;
    for (int k = 0; k < na; k++) dims |= (uint64_t)1 << adv_dim[k];
    if (ops_explicit_split_hook(y, dims, ty, sizeof ty)) {
      int w = snprintf(ind, sizeof ind, "%s[", dt_name(ia.dtype));
      for (int d = 0; d < bn && w < 200; d++) w += snprintf(ind + w, sizeof ind - (size_t)w, "%lld,", (long long)bs[d]);
      snprintf(ind + w, sizeof ind - (size_t)w, "%d]", na);
      return err_set(ERR_TYPE, "ShardingTypeError: Use `.at[...].get(out_sharding=)` to provide "
                     "output PartitionSpec for the gather indexing as out sharding could not be "
                     "resolved unambiguously (or would require collectives on inputs). Got "
                     "operand=ShapedArray(%s), indices=ShapedArray(%s)", ty, ind);
    }
  }
  bool adjacent = true;
  for (int k = 1; k < na; k++) adjacent = adjacent && adv_dim[k] == adv_dim[k - 1] + 1;
  /* Move the advanced dims together: in place when adjacent, else first. */
  int perm[SHM_MAXDIM], np = 0, first = adjacent ? adv_dim[0] : 0;
  bool is_adv[SHM_MAXDIM] = {false};
  for (int k = 0; k < na; k++) is_adv[adv_dim[k]] = true;
  for (int d = 0; d < ya.ndim; d++) {
    if (np == first) for (int k = 0; k < na; k++) perm[np++] = adv_dim[k];
    if (!is_adv[d]) perm[np++] = d;
  }
  if (np == first) for (int k = 0; k < na; k++) perm[np++] = adv_dim[k];
  Value *t = ops_transpose(y, ya.ndim, perm);
  if (!t) return NULL;
  /* Merge them into one dim and combine the indices row-major. */
  int64_t ms[SHM_MAXDIM], merged = 1;
  int mn = 0;
  for (int k = 0; k < na; k++) merged *= ya.shape[adv_dim[k]];
  for (int j = 0; j < ya.ndim;) {
    if (j == first) {
      ms[mn++] = merged;
      j += na;
    } else {
      ms[mn++] = ya.shape[perm[j]];
      j++;
    }
  }
  Value *m = ops_reshape(t, mn, ms);
  val_decref(t);
  if (!m) return NULL;
  Value *lin = NULL;
  for (int k = 0; k < na && m; k++) {
    Value *b = ops_broadcast_to(idx[k], bn, bs);
    if (!b) break;
    if (!lin) {
      lin = b;
      continue;
    }
    Value *sc = ops_with_const(P_MUL, lin, (double)ya.shape[adv_dim[k]]);
    Value *s2[2] = {sc, b};
    Value *nl = sc ? ops_apply_plain(P_ADD, 2, s2) : NULL;
    val_decref(sc);
    val_decref(b);
    val_decref(lin);
    lin = nl;
    if (!lin) break;
  }
  Value *r = lin ? gather_axis(m, lin, first) : NULL;
  val_decref(lin);
  val_decref(m);
  return r && valid ? drop_invalid(r, valid, first, bn, bs) : r;
}

/* The gathered positions [r] with -1 (dropped by scatter) wherever an
 * index was out of range: [valid] (the indices' broadcast shape [bn],
 * [bs]) lines up with r's dims from [first]. */
static Value *drop_invalid(Value *r, Value *valid, int first, int bn, const int64_t *bs) {
  AVal ra;
  if (ops_aval(r, &ra) < 0) return NULL;
  int64_t vs[SHM_MAXDIM];
  for (int d = 0; d < ra.ndim; d++) vs[d] = d >= first && d < first + bn ? bs[d - first] : 1;
  Value *vb = ops_broadcast_to(valid, bn, bs);
  Value *vr = vb ? ops_reshape(vb, ra.ndim, vs) : NULL;
  Value *vf = vr ? ops_broadcast_to(vr, ra.ndim, ra.shape) : NULL;
  Value *zero = vf ? ops_with_const(P_MUL, r, 0) : NULL;
  Value *neg = zero ? ops_with_const(P_ADD, zero, -1) : NULL;
  Value *out = neg ? ops_select(vf, r, neg) : NULL;
  val_decref(vb); val_decref(vr); val_decref(vf); val_decref(zero); val_decref(neg);
  val_decref(r);
  return out;
}

/* The indices' validity so far and [v] (owned), and-ed; NULL on error. */
static Value *valid_and(Value *acc, Value *v) {
  if (!acc) return v;
  Value *r = ops_binary(OP_BITAND, acc, v);
  val_decref(acc);
  val_decref(v);
  return r;
}

/* NumPy indexing of an array or tracer [x], out-of-range traced indices
 * treated as [oob] says. */
static Value *getitem_oob(Value *x, Value *index, OobMode oob) {
  AVal av;
  if (ops_aval(x, &av) < 0) return NULL;
  Index ix;
  if (index_parse(index, &av, &ix) < 0) return NULL;
  int na = 0;
  for (int i = 0; i < ix.n; i++) na += ix.it[i].kind == IX_ARRAY;
  if (na) {
    /* With any array index, integers are advanced indices too. */
    for (int i = 0; i < ix.n; i++)
      if (ix.it[i].kind == IX_INT) {
        ix.it[i].kind = IX_ARRAY;
        ix.it[i].arr = (Value *)arr_scalar_i64(DT_I32, ix.it[i].i, false);
        na++;
      }
  }
  int adv_dim[2 * SHM_MAXDIM];
  Value *y = apply_basic(x, &av, &ix, adv_dim);
  if (y && na) {
    Value *idx[2 * SHM_MAXDIM], *valid = NULL;
    int k = 0;
    bool failed = false;
    for (int i = 0; i < ix.n && !failed; i++) {
      IxItem *it = &ix.it[i];
      if (it->kind != IX_ARRAY) continue;
      Value *v = NULL;
      idx[k] = normalize_indices(it->arr, av.shape[it->dim], it->dim, oob, na > 1, &v);
      if (!idx[k]) break;
      k++;
      if (v && !(valid = valid_and(valid, v))) failed = true;
    }
    Value *r = k == na && !failed ? apply_advanced(y, idx, adv_dim, na, valid) : NULL;
    val_decref(valid);
    for (int j = 0; j < k; j++) val_decref(idx[j]);
    val_decref(y);
    y = r;
  }
  index_free(&ix);
  return y;
}

/* NumPy indexing of an array or tracer [x]. */
static Value *array_getitem(Value *x, Value *index) { return getitem_oob(x, index, OOB_CLAMP); }

Value *ops_index_array(Value *x, Value *index) { return array_getitem(x, index); }

/* x[index] of a NumPy array [x], a NumPy array: as array_getitem, but a 0-d result
 * viewing x's buffer (integer indexing) is a copy, as NumPy's scalars
 * are: a later write to x does not change it. */
static Value *host_getitem(Value *x, Value *index) {
  ArrNpMode saved = arr_np_mode;
  arr_np_mode = ARR_NP_HOST;   /* index arrays are no jax.Arrays of the result */
  Value *r = array_getitem(x, index);
  arr_np_mode = saved;
  if (!r || !IS_ARRAY(r) || AS_ARRAY(r)->ndim || AS_ARRAY(r)->buf != AS_ARRAY(x)->buf) return r;
  Array *c = arr_copy(AS_ARRAY(r));
  val_decref(r);
  if (c) c->buf->np = true;
  return arr_value(c);
}

/* Index into a Python sequence of length [len]: negatives wrap. */
int ops_seq_index(Value *index, int64_t len, const char *what, int64_t *out) {
  int64_t i;
  if (!IS_ARRAY(index) || AS_ARRAY(index)->ndim != 0 ||
      !(dt_is_int(AS_ARRAY(index)->dtype) || AS_ARRAY(index)->dtype == DT_BOOL) ||
      arr_to_index(index, &i) < 0) {
    err_clear();
    err_set(ERR_TYPE, "%s indices must be integers or slices, not %s", what, val_type_name(index));
    return -1;
  }
  if (i < 0) i += len;
  if (i < 0 || i >= len) {
    err_set(ERR_INDEX, "%s index out of range", what);
    return -1;
  }
  *out = i;
  return 0;
}

/* The [n] code points of str [s] from [start] by [step] (a slice's
 * indices, in range): bytes copied directly for ASCII text, through a
 * table of the code points' byte offsets otherwise. */
static Value *str_slice(Value *s, int64_t start, int64_t step, int64_t n) {
  const char *p = str_cstr(s);
  size_t len = ((Str *)s)->len, nc = str_nchars(s);
  if (step == 1) {
    size_t a = str_offset(s, (size_t)start);
    return str_new(p + a, str_offset(s, (size_t)(start + n)) - a);
  }
  size_t *off = str_is_ascii(s) ? NULL : shm_malloc((nc + 1) * sizeof *off);
  char *buf = shm_malloc(str_is_ascii(s) ? (size_t)n + 1 : len + 1);
  if (!buf || (!str_is_ascii(s) && !off)) {
    shm_free(off);
    shm_free(buf);
    return err_nomem();
  }
  for (size_t i = 0, k = 0; off && i <= len; i++)
    if (i == len || utf8_is_lead((unsigned char)p[i])) off[k++] = i;
  size_t w = 0;
  for (int64_t i = 0; i < n; i++) {
    size_t k = (size_t)(start + i * step);
    size_t a = off ? off[k] : k, b = off ? off[k + 1] : k + 1;
    memcpy(buf + w, p + a, b - a);
    w += b - a;
  }
  Value *r = str_new(buf, w);
  shm_free(off);
  shm_free(buf);
  return r;
}

/* seq[start:stop:step] for tuples, lists and strings. */
static Value *seq_slice(Value *obj, Value *sl) {
  size_t len;
  Value *const *items = NULL;
  if (obj->type == V_STR) len = str_nchars(obj);
  else val_seq(obj, &len, &items);
  int64_t start, step, n;
  if (ops_slice_indices(sl, (int64_t)len, &start, &step, &n) < 0) return NULL;
  if (obj->type == V_STR) return str_slice(obj, start, step, n);
  if (obj->type == V_TUPLE) {
    Value *t = tuple_new((size_t)n);
    for (int64_t i = 0; t && i < n; i++) tuple_set_steal(t, (size_t)i, val_incref(items[start + i * step]));
    return t;
  }
  Value *l = list_new((size_t)n);
  for (int64_t i = 0; l && i < n; i++)
    if (list_append(l, items[start + i * step]) < 0) {
      val_decref(l);
      return err_nomem();
    }
  return l;
}

static Value *at_getitem(Value *helper, Value *index);

/* The opaque types of other files that are subscriptable (typing's
 * forms): registered at start-up, read-only afterwards. */
enum { MAX_OPAQUE_GETITEM = 4 };
static struct {
  const OpaqueType *ot;
  Value *(*fn)(Value *self, Value *index);
} opaque_getitem[MAX_OPAQUE_GETITEM];
static int n_opaque_getitem;

void ops_register_getitem(const OpaqueType *ot, Value *(*fn)(Value *self, Value *index)) {
  if (n_opaque_getitem < MAX_OPAQUE_GETITEM) opaque_getitem[n_opaque_getitem++] = (typeof(opaque_getitem[0])){ot, fn};
}

Value *ops_getitem(Value *obj, Value *index) {
  int64_t i;
  switch (obj->type) {
  case V_ARRAY: case V_TRACER:
    if (arr_np_is_live() && arr_is_np(obj)) return host_getitem(obj, index);
    return array_getitem(obj, index);
  case V_TUPLE: case V_LIST: {
    if (stdmod_is_deque(obj)) return deque_key(obj, index, &i) < 0 ? NULL : val_incref(list_get(obj, (size_t)i));
    if (index->type == V_SLICE) return seq_slice(obj, index);
    size_t len;
    Value *const *items;
    val_seq(obj, &len, &items);
    if (ops_seq_index(index, (int64_t)len, obj->type == V_TUPLE ? "tuple" : "list", &i) < 0) return NULL;
    return val_incref(items[i]);
  }
  case V_STR:
    if (index->type == V_SLICE) return seq_slice(obj, index);
    if (ops_seq_index(index, (int64_t)str_nchars(obj), "string", &i) < 0) return NULL;
    return str_slice(obj, i, 1, 1);
  case V_RANGE: {
    Range *r = (Range *)obj;
    if (index->type == V_SLICE) {
      int64_t start, step, n;
      if (ops_slice_indices(index, range_len(obj), &start, &step, &n) < 0) return NULL;
      int64_t first = r->start + start * r->step, st = r->step * step;
      return range_new(first, first + n * st, st);
    }
    if (ops_seq_index(index, range_len(obj), "range object", &i) < 0) return NULL;
    return val_int(r->start + i * r->step);
  }
  case V_DICT: {
    if (val_is_set(obj)) return err_set(ERR_TYPE, "'%s' object is not subscriptable", val_type_name(obj));
    Value *v = dict_get(obj, index);
    if (v) return val_incref(v);
    if (err_occurred()) return NULL;
    if (((Dict *)obj)->kind != DICT_PLAIN) return stdmod_dict_missing(obj, index);
    Value *rs = val_repr(index);
    if (!rs) return NULL;
    err_set(ERR_INDEX, "KeyError: %s", str_cstr(rs));
    val_decref(rs);
    return NULL;
  }
  case V_OPAQUE:
    if (cls_is_class(obj)) return cls_getitem(obj, index);   /* Color['RED'] */
    for (int k = 0; k < n_opaque_getitem; k++)
      if (opaque_getitem[k].ot == ((Opaque *)obj)->ot) return opaque_getitem[k].fn(obj, index);
    return at_getitem(obj, index);
  default:
    return err_set(ERR_TYPE, "'%s' object is not subscriptable", val_type_name(obj));
  }
}

/* ---- x.at[idx].set(v) / .add(v) / .get() -------------------------------- */

typedef struct AtRef {
  Opaque base;
  Value *array;  /* owned */
  Value *index;  /* owned; NULL for the bare x.at helper */
} AtRef;

static void at_free(Value *self) {
  AtRef *r = (AtRef *)self;
  val_decref(r->array);
  val_decref(r->index);
}

static Value *at_repr(Value *self) {
  return str_from(((AtRef *)self)->index ? "<_IndexUpdateRef>" : "<_IndexUpdateHelper>");
}

static Value *at_getattr(Value *self, const char *name);

static const OpaqueType at_type = {"_IndexUpdateHelper", at_free, at_repr, at_getattr, NULL, NULL, NULL};

Value *ops_at_new(Value *array, Value *index) {
  AtRef *r = shm_malloc(sizeof *r);
  if (!r) return err_nomem();
  val_init(&r->base.hdr, V_OPAQUE);
  r->base.ot = &at_type;
  r->array = val_incref(array);
  r->index = index ? val_incref(index) : NULL;
  return &r->base.hdr;
}

static Value *at_getitem(Value *helper, Value *index) {
  Opaque *o = (Opaque *)helper;
  if (o->ot != &at_type || ((AtRef *)o)->index)
    return err_set(ERR_TYPE, "'%s' object is not subscriptable", o->ot->name);
  return ops_at_new(((AtRef *)o)->array, index);
}

/* An int32 iota shaped like [av]: flat positions, indexed to find targets. */
static Value *positions(const AVal *av) {
  int64_t n = shape_size(av->ndim, av->shape);
  Params p;
  params_init(&p);
  params_add(&p, "dtype", dtype_value(DT_I32));
  params_add(&p, "shape", val_int_tuple(1, &n));
  params_add(&p, "dimension", val_int(0));
  Value *io = ops_apply(P_IOTA, 0, NULL, &p);
  params_clear(&p);
  if (!io) return NULL;
  Value *r = ops_reshape(io, av->ndim, av->shape);
  val_decref(io);
  return r;
}

Value *(*ops_scatter_type_hook)(Value *x, uint64_t touched, const AVal *ind, Value *y,
                                const AVal *upd);
bool (*ops_explicit_split_hook)(Value *x, uint64_t dims, char *ty, size_t cap);
Value *(*ops_sort_type_hook)(Value *const *xs, int n, int ndim, int axis);
Value *(*ops_take_along_type_hook)(Value *x, Value *idx, int axis);

/* The dimensions of which [index] selects a part (bits): those an int or
 * an array indexes, or a slice other than the whole; and the aval of the
 * gather indices JAX's x.at[index] makes ([*ind]: int32, the advanced
 * indices' broadcast shape and a strided slice's length, then one entry
 * per dimension indexed), for its scatter error.  [*nones] (bits): the
 * positions of the dimensions a None adds to x[index] (no array index:
 * then they are in order), which JAX's update drops. */
static int touched_dims(Value *index, const AVal *av, uint64_t *touched, AVal *ind,
                        uint64_t *nones) {
  Index ix;
  if (index_parse(index, av, &ix) < 0) return -1;
  *touched = *nones = 0;
  ind->dtype = DT_I32;
  ind->weak = false;
  ind->ndim = 0;
  ind->vma = 0;
  int nvec = 0, bn = 0, out = 0;
  int64_t bs[SHM_MAXDIM];
  bool arrays = false;
  for (int i = 0; i < ix.n; i++)
    arrays |= ix.it[i].kind == IX_ARRAY;
  for (int i = 0; i < ix.n; i++) {
    const IxItem *it = &ix.it[i];
    bool whole = it->kind == IX_SLICE && it->start == 0 && it->step == 1 && it->n == av->shape[it->dim];
    if (it->kind != IX_NONE && it->dim >= 0 && !whole) *touched |= (uint64_t)1 << it->dim;
    if (it->kind == IX_NONE && !arrays) *nones |= (uint64_t)1 << out;
    out += it->kind == IX_SLICE || it->kind == IX_NONE;
    nvec += it->kind != IX_NONE && !whole;
    if (it->kind == IX_ARRAY) {
      AVal a;
      if (ops_aval(it->arr, &a) < 0 || shape_broadcast(bn, bs, a.ndim, a.shape, &bn, bs) < 0) {
        index_free(&ix);
        return -1;
      }
    } else if (it->kind == IX_SLICE && it->step != 1 && ind->ndim < SHM_MAXDIM - 1) {
      ind->shape[ind->ndim++] = it->n;
    }
  }
  if (bn + ind->ndim < SHM_MAXDIM) {   /* the advanced indices' dimensions first */
    memmove(ind->shape + bn, ind->shape, sizeof(int64_t) * (size_t)ind->ndim);
    memcpy(ind->shape, bs, sizeof(int64_t) * (size_t)bn);
    ind->ndim += bn;
  }
  if (ind->ndim < SHM_MAXDIM) ind->shape[ind->ndim++] = nvec;
  index_free(&ix);
  return 0;
}

static Value *at_update_flat(AtRef *ref, Value *v, const char *mode, const AVal *av, Value *sel);

/* The functional update (mode "set", "add", "multiply", "min" or "max":
 * scatter's modes, kernels.h), in Explicit mode typed as JAX's scatter
 * rule says (ops_scatter_type_hook): computed whatever the layout, the
 * result laid out as x's type. */
static Value *at_update(AtRef *ref, Value *v, const char *mode, Value *given) {
  AVal av;
  uint64_t touched, nones;
  if (ops_aval(ref->array, &av) < 0) return NULL;
  Value *pos = positions(&av);   /* the flat positions the index selects */
  Value *sel = pos ? getitem_oob(pos, ref->index, oob_how.upd) : NULL;
  val_decref(pos);
  if (!sel) return NULL;
  Value *type = NULL;
  if (given && given != VAL_NONE) {   /* out_sharding=: the caller's layout */
    if (!builtins_out_sharding_hook) {
      val_decref(sel);
      return err_set(ERR_NOT_IMPLEMENTED, "out_sharding= needs the sharding module");
    }
    type = val_incref(given);
  } else if (ops_scatter_type_hook && builtins_out_sharding_hook) {
    AVal ind, upd;
    if (touched_dims(ref->index, &av, &touched, &ind, &nones) < 0 || ops_aval(sel, &upd) < 0) {
      val_decref(sel);
      return NULL;
    }
    upd.dtype = av.dtype;   /* JAX's update: x's dtype, the None dimensions dropped */
    upd.weak = false;
    for (int d = upd.ndim - 1; d >= 0; d--)
      if (nones >> d & 1) {
        memmove(upd.shape + d, upd.shape + d + 1, sizeof(int64_t) * (size_t)(upd.ndim - d - 1));
        upd.ndim--;
      }
    type = ops_scatter_type_hook(ref->array, touched, &ind, v, &upd);
    if (!type && err_occurred()) {
      val_decref(sel);
      return NULL;
    }
  }
  if (!type) return at_update_flat(ref, v, mode, &av, sel);
  Value *prev = ops_out_sharding_enter(type);
  Value *r = at_update_flat(ref, v, mode, &av, sel);
  ops_out_sharding_leave(prev);
  Value *o = r ? builtins_out_sharding_hook(r, type) : NULL;
  val_decref(r);
  val_decref(type);
  return o;
}

/* The item of [index] (borrowed, as written: an int, a list, an array)
 * that selects along dimension [k] of an array of [av]; NULL if a slice
 * or nothing does. */
static Value *item_as_written(Value *index, const AVal *av, int k) {
  Value *single[1] = {index};
  size_t n = 1;
  Value *const *items = single;
  if (index->type == V_TUPLE) val_seq(index, &n, &items);
  for (size_t i = 0, dim = 0; i < n; i++) {
    if (items[i] == VAL_ELLIPSIS) {
      dim += (size_t)(av->ndim - (int)n + 1);
      continue;
    }
    if ((int)dim == k) return items[i]->type != V_SLICE ? items[i] : NULL;
    dim++;
  }
  return NULL;
}

/* [x] (of [av]) updated along dimension [k] with [item] (axis_in_box):
 * the positions along k that item selects (an iota of that length
 * indexed by it, so negative, out-of-range and traced indices are
 * treated as the flat path treats them), and one scatter[axis=k] of [v],
 * broadcast to x[index]'s shape, a dimension of one put back at k for an
 * int and at each dimension of [drop] (bits: other dimensions an int
 * indexes, which x[index] drops too). */
static Value *at_update_axis(Value *x, Value *v, const char *mode, const AVal *av, int k,
                             Value *item, uint64_t drop) {
  AVal along = {.dtype = DT_I32, .ndim = 1, .shape = {av->shape[k]}};
  Value *io = positions(&along);
  Value *pos = io ? getitem_oob(io, item, oob_how.upd) : NULL;
  val_decref(io);
  AVal pa, ua;
  if (!pos || ops_aval(pos, &pa) < 0) {
    val_decref(pos);
    return NULL;
  }
  bool scalar = pa.ndim == 0;
  if (scalar) {
    int64_t one = 1;
    Value *p1 = ops_reshape(pos, 1, &one);
    val_decref(pos);
    if (!(pos = p1) || ops_aval(pos, &pa) < 0) return NULL;
  }
  ua = *av;   /* operand[:k] + positions + operand[k+1:] */
  ua.ndim = av->ndim - 1 + pa.ndim;
  if (ua.ndim > SHM_MAXDIM) {
    val_decref(pos);
    return err_set(ERR_INDEX, "too many dimensions in an indexed update");
  }
  memcpy(ua.shape + k, pa.shape, sizeof(int64_t) * (size_t)pa.ndim);
  memcpy(ua.shape + k + pa.ndim, av->shape + k + 1, sizeof(int64_t) * (size_t)(av->ndim - k - 1));
  int64_t vshape[SHM_MAXDIM];   /* x[index]'s shape: an int's dimension dropped */
  int vn = 0;
  for (int d = 0; d < ua.ndim; d++) {
    int od = d < k ? d : d < k + pa.ndim ? k : d + 1 - pa.ndim;   /* x's dimension */
    if (!(scalar && d == k) && !(od != k && drop >> od & 1)) vshape[vn++] = ua.shape[d];
  }
  Value *vv = ops_to_array(v, -1);
  Value *vc = vv ? ops_convert(vv, av->dtype, false) : NULL;
  Value *vb = vc ? ops_broadcast_to(vc, vn, vshape) : NULL;
  Value *vu = vb ? ops_reshape(vb, ua.ndim, ua.shape) : NULL;
  Value *r = NULL;
  if (vu) {
    Value *in[3] = {x, pos, vu};
    Params p;
    params_init(&p);
    params_add(&p, "axis", val_int(k));
    params_add(&p, "mode", str_from(mode));
    r = ops_apply(P_SCATTER, 3, in, &p);
    params_clear(&p);
  }
  val_decref(pos); val_decref(vv); val_decref(vc); val_decref(vb); val_decref(vu);
  return r;
}

/* Whether [index] on an array of [av] is a box: slices of step 1 only,
 * not all whole and none empty ([start] and [len] per dimension). */
static bool box_of(Value *index, const AVal *av, int64_t *start, int64_t *len) {
  Index ix;
  if (index_parse(index, av, &ix) < 0) {
    err_clear();
    return false;
  }
  bool ok = true, part = false;
  for (int i = 0; i < ix.n && ok; i++) {
    const IxItem *it = &ix.it[i];
    ok = it->kind == IX_SLICE && it->step == 1 && it->n > 0;
    if (!ok) break;
    start[it->dim] = it->start;
    len[it->dim] = it->n;
    part |= it->n != av->shape[it->dim];
  }
  index_free(&ix);
  return ok && part;
}

/* [x] (of [av]) with [u] (its box's shape) written at [start]: one
 * dynamic_update_slice, so the dimensions the box covers whole keep
 * their layout. */
static Value *put_box(Value *x, Value *u, const AVal *av, const int64_t *start) {
  Value *in[SHM_MAXDIM + 2] = {x, u};
  int made = 2;
  for (; made < av->ndim + 2; made++)
    if (!(in[made] = (Value *)arr_scalar_i64(DT_I32, start[made - 2], false))) break;
  Value *r = NULL;
  if (made == av->ndim + 2) {
    Params p;
    params_init(&p);
    r = ops_apply(P_DYNAMIC_UPDATE_SLICE, made, in, &p);
    params_clear(&p);
  }
  for (int i = 2; i < made; i++) val_decref(in[i]);
  return r;
}

/* x.at[box].set(v) (and .add(v) of a float or wrapping integer dtype,
 * whose adds are the scatter's bit for bit): [v] broadcast to the box
 * (added to the box's values for add) and put there (put_box). */
static Value *at_update_box(AtRef *ref, Value *v, const char *mode, const AVal *av,
                            const int64_t *start, const int64_t *len) {
  Value *vv = ops_to_array(v, -1);
  Value *vc = vv ? ops_convert(vv, av->dtype, false) : NULL;
  Value *u = vc ? ops_broadcast_to(vc, av->ndim, len) : NULL;
  val_decref(vv);
  val_decref(vc);
  if (u && strcmp(mode, "add") == 0) {
    Value *cur = getitem_oob(ref->array, ref->index, OOB_CLAMP);
    Value *sum = cur ? ops_binary(OP_ADD, cur, u) : NULL;
    val_decref(cur);
    val_decref(u);
    u = sum;
  }
  Value *r = u ? put_box(ref->array, u, av, start) : NULL;
  val_decref(u);
  return r;
}

/* Whether [index] on an array of [av] selects along one dimension [*k]
 * within a box: one integer array at k and step-1 slices elsewhere
 * (x.at[:, ids], x.at[ids, 1:3]), or ints and step-1 slices (x.at[i],
 * x.at[2, 3], x.at[2, 1:3], the first int at k), or one array and ints
 * on adjacent dimensions (x.at[ids, 2]: NumPy's combined advanced index,
 * its dimensions where the first is), the ints' other than k in [*drop]
 * (bits), no None.  [*item] (borrowed) is k's item as written; [start]
 * and [len] the box, whole along k.  Such an update is a scatter along
 * k, as JAX's scatter keeps the other dimensions as windows, so their
 * layouts stay (rows split over devices stay split). */
static bool axis_in_box(Value *index, const AVal *av, int *k, Value **item, int64_t *start,
                        int64_t *len, uint64_t *drop) {
  Index ix;
  if (index_parse(index, av, &ix) < 0) {
    err_clear();
    return false;
  }
  int arrays = 0, ints = 0;
  bool ok = true;
  *k = -1;
  *drop = 0;
  for (int i = 0; i < ix.n && ok; i++) {
    const IxItem *it = &ix.it[i];
    int d = it->dim;
    if (it->kind == IX_SLICE) {
      ok = it->step == 1 && it->n > 0;
      start[d] = it->start;
      len[d] = it->n;
      continue;
    }
    ok = it->kind == IX_INT || it->kind == IX_ARRAY;
    if (!ok) break;
    start[d] = it->kind == IX_INT ? it->i : 0;
    len[d] = it->kind == IX_INT ? 1 : av->shape[d];
    arrays += it->kind == IX_ARRAY;
    ints += it->kind == IX_INT;
    if (it->kind == IX_INT) *drop |= (uint64_t)1 << d;
    if (it->kind == IX_ARRAY || *k < 0) *k = d;
  }
  index_free(&ix);
  /* an array beside ints: NumPy puts the selection's dimensions where
   * the first of them is when they are adjacent, as the scatter does */
  uint64_t adv = *drop | (*k >= 0 ? (uint64_t)1 << *k : 0), run = adv ? adv >> __builtin_ctzll(adv) : 0;
  bool adjacent = (run & (run + 1)) == 0;
  ok = ok && *k >= 0 && arrays <= 1 && (arrays == 0 || ints == 0 || adjacent);
  if (!ok) return false;
  start[*k] = 0;
  len[*k] = av->shape[*k];
  *drop &= ~((uint64_t)1 << *k);
  return (*item = item_as_written(index, av, *k)) != NULL;
}

/* x.at[index] for an index axis_in_box accepts: the box sliced out,
 * updated along k (at_update_axis, so every scatter mode and any
 * duplicate indices are the scatter's), and put back (put_box).  Only
 * the box's part of a dimension is touched, so a dimension it covers
 * whole keeps its layout (x.at[ids, 1:3] on rows split over devices). */
static Value *at_update_axis_box(AtRef *ref, Value *v, const char *mode, const AVal *av, int k,
                                 Value *item, const int64_t *start, const int64_t *len,
                                 uint64_t drop) {
  int64_t limit[SHM_MAXDIM];
  for (int d = 0; d < av->ndim; d++) limit[d] = start[d] + len[d];
  Params p;
  params_init(&p);
  params_add(&p, "start_indices", val_int_tuple(av->ndim, start));
  params_add(&p, "limit_indices", val_int_tuple(av->ndim, limit));
  params_add(&p, "strides", VAL_NONE);
  Value *sub = ops_apply1(P_SLICE, ref->array, &p);
  AVal sa = *av;
  memcpy(sa.shape, len, sizeof(int64_t) * (size_t)av->ndim);
  Value *u = sub ? at_update_axis(sub, v, mode, &sa, k, item, drop) : NULL;
  Value *r = u ? put_box(ref->array, u, av, start) : NULL;
  val_decref(sub);
  val_decref(u);
  return r;
}

/* at_update's computation: along one dimension when the index selects
 * only there (at_update_axis), or there within a box of the others
 * (axis_in_box, at_update_axis_box), a box's dynamic_update_slice for set and add
 * (at_update_box), else [v] scattered into the flattened array at
 * the flat positions [sel] (consumed) the index selects. */
static Value *at_update_flat(AtRef *ref, Value *v, const char *mode, const AVal *pav, Value *sel) {
  int k = 0;
  Value *item = NULL;
  int64_t start[SHM_MAXDIM], len[SHM_MAXDIM];
  uint64_t drop;
  if (axis_in_box(ref->index, pav, &k, &item, start, len, &drop)) {
    val_decref(sel);
    bool whole = !drop;   /* then one scatter of the array itself */
    for (int d = 0; whole && d < pav->ndim; d++) whole = len[d] == pav->shape[d];
    return whole ? at_update_axis(ref->array, v, mode, pav, k, item, 0)
                 : at_update_axis_box(ref, v, mode, pav, k, item, start, len, drop);
  }
  bool adds = pav->dtype == DT_F32 || pav->dtype == DT_F64 || pav->dtype == DT_I32 ||
              pav->dtype == DT_I64 || pav->dtype == DT_I8;
  if ((strcmp(mode, "set") == 0 || (adds && strcmp(mode, "add") == 0)) &&
      box_of(ref->index, pav, start, len)) {
    val_decref(sel);
    return at_update_box(ref, v, mode, pav, start, len);
  }
  AVal av = *pav;
  AVal sa;
  ops_aval(sel, &sa);
  int64_t n = shape_size(av.ndim, av.shape), m = shape_size(sa.ndim, sa.shape);
  Value *vv = ops_to_array(v, -1);
  Value *vc = vv ? ops_convert(vv, av.dtype, false) : NULL;
  Value *vb = vc ? ops_broadcast_to(vc, sa.ndim, sa.shape) : NULL;
  Value *vf = vb ? ops_reshape(vb, 1, &m) : NULL;
  Value *sf = vf ? ops_reshape(sel, 1, &m) : NULL;
  Value *xf = sf ? ops_reshape(ref->array, 1, &n) : NULL;
  Value *r = NULL;
  if (xf) {
    Value *in[3] = {xf, sf, vf};
    Params p;
    params_init(&p);
    params_add(&p, "axis", val_int(0));
    params_add(&p, "mode", str_from(mode));
    Value *s = ops_apply(P_SCATTER, 3, in, &p);
    params_clear(&p);
    r = s ? ops_reshape(s, av.ndim, av.shape) : NULL;
    val_decref(s);
  }
  val_decref(sel); val_decref(vv); val_decref(vc); val_decref(vb);
  val_decref(vf); val_decref(sf); val_decref(xf);
  return r;
}

/* Sets oob_how for an x.at[...] method called with [mode] and
 * [wrap] (borrowed; NULL when not given), [get] for .get(), saving the
 * caller's in [saved].  0, or -1 with JAX's ValueError for an unknown
 * mode. */
static int oob_enter(Value *mode, Value *wrap, bool get, struct OobHow *saved) {
  *saved = oob_how;
  struct OobHow h = {false, false, false, OOB_DROP};
  if (mode && mode != VAL_NONE) {
    const char *m = mode->type == V_STR ? str_cstr(mode) : "";
    h.quiet = true;
    if (!strcmp(m, "clip")) h.upd = OOB_CLAMP;
    else if (!strcmp(m, "fill") || !strcmp(m, "drop")) h.fill = get;
    else if (strcmp(m, "promise_in_bounds")) {
      err_set(ERR_VALUE, "Unknown gather mode \"%s\"", m);
      return -1;
    }
  }
  if (wrap && wrap != VAL_NONE) {
    int t = val_truth(wrap);
    if (t < 0) return -1;
    h.nowrap = !t;
  }
  oob_how = h;
  return 0;
}

/* The value .get(mode='fill') gives an index out of range: [fill] as x's
 * dtype, or JAX's default (NaN, the most negative integer, True). */
static Value *fill_scalar(Value *fill, DType t) {
  if (fill && fill != VAL_NONE) {
    Value *a = ops_to_array(fill, -1);
    Value *c = a ? ops_convert(a, t, false) : NULL;
    val_decref(a);
    return c;
  }
  if (dt_is_float(t)) return (Value *)arr_scalar_f64(t, NAN, false);
  if (t == DT_BOOL) return (Value *)arr_scalar_i64(t, 1, false);
  int64_t lo = t == DT_I8 ? INT8_MIN : t == DT_I64 ? INT64_MIN : INT32_MIN;
  return (Value *)arr_scalar_i64(t, lo, false);
}

/* x.at[index].get(mode='fill'): x[index] with its indices clamped, and
 * [fill] where an index was out of range (the flat positions the index
 * selects, dropped ones marked -1, say where). */
static Value *get_filled(AtRef *r, Value *fill) {
  AVal av, ga;
  if (ops_aval(r->array, &av) < 0) return NULL;
  Value *g = getitem_oob(r->array, r->index, OOB_CLAMP);
  Value *pos = g ? positions(&av) : NULL;
  Value *sel = pos ? getitem_oob(pos, r->index, OOB_DROP) : NULL;
  Value *ok = sel ? ops_with_const(P_GE, sel, 0) : NULL;
  Value *f = ok && ops_aval(g, &ga) == 0 ? fill_scalar(fill, av.dtype) : NULL;
  Value *fb = f ? ops_broadcast_to(f, ga.ndim, ga.shape) : NULL;
  Value *res = fb ? ops_select(ok, g, fb) : NULL;
  val_decref(g); val_decref(pos); val_decref(sel); val_decref(ok); val_decref(f); val_decref(fb);
  return res;
}

/* x.at[index].<name>(values, ...) for [name] "set", "add", "multiply",
 * "min", "max", "subtract", "divide", "power", with JAX's keywords:
 * mode= (oob_enter), out_sharding=, wrap_negative_indices=, and
 * indices_are_sorted= and unique_indices=, promises that change nothing
 * here.  subtract adds the negated values; divide and power apply x's
 * operation to a multiply-scatter of them into ones, as JAX's do. */
static Value *at_method(Value *self, const CallArgs *a, const char *name) {
  Value *v, *mode, *sh, *sorted, *uniq, *wrap;
  Value **slots[] = {&v, &mode, &sh, &sorted, &uniq, &wrap};
  if (args_bind(name, a, "values, mode=, out_sharding=, indices_are_sorted=, unique_indices=, "
                "wrap_negative_indices=", slots) < 0)
    return NULL;
  struct OobHow saved;
  if (oob_enter(mode, wrap, false, &saved) < 0) return NULL;
  AtRef *ref = (AtRef *)self;
  Value *r = NULL;
  if (!strcmp(name, "subtract")) {
    Value *av = ops_to_array(v, -1), *nv = av ? ops_unary(OP_NEG, av) : NULL;
    r = nv ? at_update(ref, nv, "add", sh) : NULL;
    val_decref(av);
    val_decref(nv);
  } else if (!strcmp(name, "divide") || !strcmp(name, "power")) {
    AVal xa;
    Value *one = ops_aval(ref->array, &xa) == 0 ? (Value *)arr_scalar_i64(xa.dtype, 1, false) : NULL;
    Value *ones = one ? ops_broadcast_to(one, xa.ndim, xa.shape) : NULL;
    AtRef o = *ref;
    o.array = ones;
    Value *m = ones ? at_update(&o, v, "multiply", sh) : NULL;
    r = m ? ops_binary(name[0] == 'd' ? OP_DIV : OP_POW, ref->array, m) : NULL;
    val_decref(one);
    val_decref(ones);
    val_decref(m);
  } else {
    r = at_update(ref, v, name, sh);
  }
  oob_how = saved;
  return r;
}

static Value *at_set(Value *self, const CallArgs *a) { return at_method(self, a, "set"); }
static Value *at_add(Value *self, const CallArgs *a) { return at_method(self, a, "add"); }
static Value *at_multiply(Value *self, const CallArgs *a) { return at_method(self, a, "multiply"); }
static Value *at_min(Value *self, const CallArgs *a) { return at_method(self, a, "min"); }
static Value *at_max(Value *self, const CallArgs *a) { return at_method(self, a, "max"); }
static Value *at_subtract(Value *self, const CallArgs *a) { return at_method(self, a, "subtract"); }
static Value *at_divide(Value *self, const CallArgs *a) { return at_method(self, a, "divide"); }
static Value *at_power(Value *self, const CallArgs *a) { return at_method(self, a, "power"); }

/* x.at[index].apply(func): func applied once to each element the index
 * selects (JAX's scatter_apply: duplicates count once), x elsewhere;
 * func is element-wise, so it is applied to x and the selection taken. */
static Value *at_apply(Value *self, const CallArgs *a) {
  Value *fn, *mode, *sorted, *uniq, *wrap;
  Value **slots[] = {&fn, &mode, &sorted, &uniq, &wrap};
  if (args_bind("apply", a, "func, mode=, indices_are_sorted=, unique_indices=, wrap_negative_indices=",
                slots) < 0)
    return NULL;
  struct OobHow saved;
  if (oob_enter(mode, wrap, false, &saved) < 0) return NULL;
  AtRef *ref = (AtRef *)self;
  AVal xa;
  Value *no = ops_aval(ref->array, &xa) == 0 ? (Value *)arr_scalar_i64(DT_BOOL, 0, false) : NULL;
  Value *mask0 = no ? ops_broadcast_to(no, xa.ndim, xa.shape) : NULL;
  AtRef o = *ref;
  o.array = mask0;
  Value *yes = mask0 ? (Value *)arr_scalar_i64(DT_BOOL, 1, false) : NULL;
  Value *mask = yes ? at_update(&o, yes, "set", NULL) : NULL;
  oob_how = saved;
  Value *fx = mask ? val_call_n(fn, 1, &ref->array) : NULL;
  Value *fa = fx ? ops_to_array(fx, -1) : NULL;
  Value *fc = fa ? ops_convert(fa, xa.dtype, false) : NULL;
  Value *r = fc ? ops_select(mask, fc, ref->array) : NULL;
  val_decref(no); val_decref(mask0); val_decref(yes); val_decref(mask);
  val_decref(fx); val_decref(fa); val_decref(fc);
  return r;
}

Value *ops_getitem_mode(Value *x, Value *index, Value *mode, Value *fill_value) {
  struct OobHow saved;
  if (oob_enter(mode, NULL, true, &saved) < 0) return NULL;
  AtRef r = {.array = x, .index = index};
  Value *o = oob_how.fill ? get_filled(&r, fill_value) : array_getitem(x, index);
  oob_how = saved;
  return o;
}

static Value *at_get(Value *self, const CallArgs *a) {
  Value *mode, *sh, *fill, *sorted, *uniq, *wrap;
  Value **slots[] = {&mode, &sh, &fill, &sorted, &uniq, &wrap};
  if (args_bind("get", a, "mode=, out_sharding=, fill_value=, indices_are_sorted=, "
                "unique_indices=, wrap_negative_indices=", slots) < 0)
    return NULL;
  struct OobHow saved;
  if (oob_enter(mode, wrap, true, &saved) < 0) return NULL;
  AtRef *r = (AtRef *)self;
  bool filled = oob_how.fill;
  Value *o = NULL;
  if (!sh || sh == VAL_NONE) {
    o = filled ? get_filled(r, fill) : array_getitem(r->array, r->index);
  } else if (!builtins_out_sharding_hook) {
    err_set(ERR_NOT_IMPLEMENTED, "out_sharding= needs the sharding module");
  } else {
    Value *prev = ops_out_sharding_enter(sh);   /* the gather's layout is the caller's */
    Value *g = filled ? get_filled(r, fill) : array_getitem(r->array, r->index);
    ops_out_sharding_leave(prev);
    o = g ? builtins_out_sharding_hook(g, sh) : NULL;
    val_decref(g);
  }
  oob_how = saved;
  return o;
}

static Value *at_getattr(Value *self, const char *name) {
  AtRef *r = (AtRef *)self;
  if (r->index) {
    if (!strcmp(name, "set")) return bound_new("set", at_set, self);
    if (!strcmp(name, "add")) return bound_new("add", at_add, self);
    if (!strcmp(name, "get")) return bound_new("get", at_get, self);
    if (!strcmp(name, "multiply")) return bound_new("multiply", at_multiply, self);
    if (!strcmp(name, "min")) return bound_new("min", at_min, self);
    if (!strcmp(name, "max")) return bound_new("max", at_max, self);
    if (!strcmp(name, "mul")) return bound_new("mul", at_multiply, self);
    if (!strcmp(name, "subtract")) return bound_new("subtract", at_subtract, self);
    if (!strcmp(name, "divide")) return bound_new("divide", at_divide, self);
    if (!strcmp(name, "power")) return bound_new("power", at_power, self);
    if (!strcmp(name, "apply")) return bound_new("apply", at_apply, self);
  }
  return err_set(ERR_ATTRIBUTE, "'%s' object has no attribute '%s'",
                 r->index ? "_IndexUpdateRef" : "_IndexUpdateHelper", name);
}
