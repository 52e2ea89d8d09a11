/*
 * hostnp_write.c - NumPy's in-place writes to host arrays (hostnp.h):
 * `a[idx] = v`, `a op= v`, and the marks that keep NumPy's buffers
 * apart from jax.Arrays (array.h, "Host NumPy arrays").
 *
 * A write finds its target with the indexing of ops_index.c run under
 * NumPy's mode: a basic index gives a view of the array's own buffer,
 * written through its strides; any other index (integer arrays, masks)
 * is applied to an array of the buffer offsets of the elements, which
 * then says where each value goes.  The value is converted as NumPy's
 * setitem does (unsafe casting: a float into an int array truncates),
 * after NumPy's broadcasting of its shape to the target's; it is
 * always a fresh contiguous copy first, so `a[1:] = a[:-1]` reads the
 * old values, as NumPy's overlap handling gives.
 */
#include <stdio.h>
#include <string.h>

#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/builtins_impl.h"
#include "lang/eval.h"
#include "lang/hostnp.h"
#include "lang/ops.h"
#include "lang/pytree.h"

/* ---- who may write -------------------------------------------------------------- */

/* 0 when this thread may write a NumPy array (the host thread, or any
 * thread outside a shard_map body); -1 with the error set otherwise, and
 * for a traced value or index (NumPy needs concrete values). */
static int write_allowed(Value *key, Value *v) {
  if (eval_on_device) {
    err_set(ERR_VALUE, "a NumPy array cannot be written inside a shard_map body: device threads "
            "read host arrays without a lock (write it outside the call, or use x.at[idx].set(v))");
    return -1;
  }
  size_t n = 1;
  Value *const *items = &key;
  if (key && key->type == V_TUPLE) val_seq(key, &n, &items);
  bool traced = v && v->type == V_TRACER;
  for (size_t i = 0; key && i < n; i++) traced = traced || items[i]->type == V_TRACER;
  if (!traced) return 0;
  err_set(ERR_TYPE, "The numpy.ndarray conversion method __array__() was called on a traced "
          "array: a NumPy array takes concrete values only (use a jax.Array and "
          "x.at[idx].set(v) under jit)");
  return -1;
}

/* ---- the element loop ------------------------------------------------------------- */

/* Copies [n] elements of [es] bytes over the row-major positions of
 * [shape] ([nd] dims): to [base] at [offs][k] when offs is given, else
 * at [off0] plus the position times [dstr]; from [src] at the position
 * times [sstr] (0 on a broadcast dim). */
static void write_elems(char *base, size_t es, int nd, const int64_t *shape, int64_t off0,
                        const int64_t *dstr, const int64_t *offs, const char *src,
                        const int64_t *sstr) {
  int64_t n = shape_size(nd, shape), idx[SHM_MAXDIM] = {0}, d_off = off0, s_off = 0;
  for (int64_t k = 0; k < n; k++) {
    memcpy(base + (size_t)(offs ? offs[k] : d_off) * es, src + (size_t)s_off * es, es);
    for (int d = nd - 1; d >= 0; d--) {   /* the next position, carrying */
      if (++idx[d] < shape[d]) {
        d_off += dstr ? dstr[d] : 0;
        s_off += sstr[d];
        break;
      }
      d_off -= dstr ? dstr[d] * (shape[d] - 1) : 0;
      s_off -= sstr[d] * (shape[d] - 1);
      idx[d] = 0;
    }
  }
}

/* [v]'s strides (contiguous [src] of [sn] dims, [ss] its shape) read
 * over a target of [tn] dims [ts] as NumPy broadcasts a value into it
 * (leading 1s of v beyond the target's dims dropped), into [out]; -1
 * with NumPy's ValueError when the shapes do not fit. */
static int value_strides(int sn, const int64_t *ss, int tn, const int64_t *ts, int64_t *out) {
  int skip = 0;
  while (sn - skip > tn && ss[skip] == 1) skip++;
  bool ok = sn - skip <= tn;
  int64_t st[SHM_MAXDIM];
  shape_strides(sn, ss, st);
  for (int d = 0; d < tn; d++) {
    int j = d - (tn - (sn - skip)) + skip;   /* v's dim facing target dim d, if any */
    if (j < skip) out[d] = 0;
    else if (ss[j] == ts[d]) out[d] = st[j];
    else if (ss[j] == 1) out[d] = 0;
    else ok = false;
  }
  if (ok) return 0;
  char s1[128], s2[128];
  shape_str(s1, sizeof s1, sn, ss);
  shape_str(s2, sizeof s2, tn, ts);
  err_set(ERR_VALUE, "could not broadcast input array from shape %s into shape %s", s1, s2);
  return -1;
}

/* A str written into an array of dtype [t], as NumPy converts it (by
 * Python's float(), int() or bool() of the string): a 0-d array of t,
 * or NULL with Python's ValueError ("could not convert string to float:
 * 'abc'", "invalid literal for int() with base 10: '1.5'"). */
static Array *str_as(Value *s, DType t) {
  if (t == DT_BOOL) return arr_scalar_i64(t, str_nchars(s) > 0, false);
  Value *n = bi_parse_str(s, !dt_is_float(t));
  if (!n) return NULL;
  Array *c = dt_is_float(t) ? arr_scalar_f64(t, arr_host_f64(AS_ARRAY(n)), false)
                            : arr_scalar_i64(t, arr_get_i64(AS_ARRAY(n), 0), false);
  val_decref(n);
  return c;
}

/* A fresh contiguous copy of [v] (any value NumPy takes as an array) as
 * dtype [t] (unsafe casting), or NULL with the error set. */
static Array *value_as(Value *v, DType t) {
  if (v->type == V_STR) return str_as(v, t);
  Value *x = hostnp_operand(v);
  if (x && (x->type == V_LIST || x->type == V_TUPLE)) {   /* a list of arrays */
    Value *y = ops_to_array(x, -1);
    val_decref(x);
    x = y;
  }
  if (!x) return NULL;
  if (x->type != V_ARRAY) {
    err_set(ERR_TYPE, "cannot assign a '%s' to a NumPy array element", val_type_name(x));
    val_decref(x);
    return NULL;
  }
  Array *c = arr_astype(AS_ARRAY(x), t, false);
  val_decref(x);
  return c;
}

/* Writes [v] into the elements of [a] that [tgt] (a's indexed part)
 * holds: through tgt's strides when it views a's buffer, else at the
 * offsets [offs] (an int64 array of tgt's shape). */
static int write_target(Array *a, Array *tgt, Array *offs, Value *v) {
  Array *src = value_as(v, a->dtype);
  if (!src) return -1;
  int64_t sstr[SHM_MAXDIM];
  int rc = value_strides(src->ndim, src->shape, tgt->ndim, tgt->shape, sstr);
  if (rc == 0)
    write_elems(a->buf->data, dt_size(a->dtype), tgt->ndim, tgt->shape, tgt->offset,
                offs ? NULL : tgt->strides, offs ? arr_data(offs) : NULL, arr_data(src), sstr);
  val_decref(&src->hdr);
  return rc;
}

/* The buffer offsets of [a]'s elements: int64, a's shape. */
static Array *offsets_of(Array *a) {
  Array *o = arr_new(DT_I64, a->ndim, a->shape);
  if (!o) return NULL;
  int64_t *p = arr_data(o), idx[SHM_MAXDIM] = {0}, off = a->offset;
  for (int64_t k = 0; k < a->size; k++) {
    p[k] = off;
    for (int d = a->ndim - 1; d >= 0; d--) {
      if (++idx[d] < a->shape[d]) {
        off += a->strides[d];
        break;
      }
      off -= a->strides[d] * (a->shape[d] - 1);
      idx[d] = 0;
    }
  }
  return o;
}

/* Whether [t] repeats elements of its buffer (a broadcast view). */
static bool read_only(const Array *t) {
  for (int d = 0; d < t->ndim; d++)
    if (t->strides[d] == 0 && t->shape[d] > 1) return true;
  return false;
}

/* a[key] = v with [a] a NumPy array, under NumPy's mode. */
static int setitem_host(Array *a, Value *key, Value *v) {
  if (a->buf->np_ro) {   /* np.broadcast_to's result and its views */
    err_set(ERR_VALUE, "assignment destination is read-only");
    return -1;
  }
  Value *t = ops_index_array(&a->hdr, key);
  if (!t) return -1;
  Array *tgt = AS_ARRAY(t), *offs = NULL;
  int rc = -1;
  if (tgt->buf == a->buf) {   /* a basic index: a view of a's own elements */
    if (read_only(tgt)) {
      err_set(ERR_VALUE, "assignment destination is read-only");
      goto out;
    }
  } else {   /* integer arrays or masks: where each element of the result came from */
    Array *all = offsets_of(a);
    Value *sel = all ? ops_index_array(&all->hdr, key) : NULL;
    if (all) val_decref(&all->hdr);
    if (!sel) goto out;
    offs = arr_contiguous(AS_ARRAY(sel));
    val_decref(sel);
    if (!offs) goto out;
  }
  rc = write_target(a, tgt, offs, v);
out:
  if (offs) val_decref(&offs->hdr);
  val_decref(t);
  return rc;
}

int hostnp_setitem(Value *obj, Value *key, Value *v) {
  if (write_allowed(key, v) < 0) return -1;
  ArrNpMode saved = arr_np_mode;
  arr_np_mode = ARR_NP_HOST;   /* the index's views stay views of a's buffer */
  int rc = setitem_host(AS_ARRAY(obj), key, v);
  arr_np_mode = saved;
  return rc;
}

/* ---- a op= b ------------------------------------------------------------------------ */

/* NumPy's name of the ufunc behind [op], for the casting error. */
static const char *ufunc_name(OpKind op) {
  switch (op) {
  case OP_ADD: return "add";
  case OP_SUB: return "subtract";
  case OP_MUL: return "multiply";
  case OP_DIV: return "divide";
  case OP_FLOORDIV: return "floor_divide";
  case OP_MOD: return "remainder";
  case OP_POW: return "power";
  case OP_MATMUL: return "matmul";
  case OP_LSHIFT: return "left_shift";
  case OP_RSHIFT: return "right_shift";
  case OP_BITAND: return "bitwise_and";
  case OP_BITOR: return "bitwise_or";
  case OP_BITXOR: return "bitwise_xor";
  default: return "?";
  }
}

/* [a]'s shape as NumPy writes a broadcast shape in that message: "(2,5)". */
static void tight_shape(char *buf, size_t cap, const Array *a) {
  size_t n = (size_t)snprintf(buf, cap, "(");
  for (int d = 0; d < a->ndim && n < cap; d++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? "," : "", (long long)a->shape[d]);
  if (n < cap) snprintf(buf + n, cap - n, a->ndim == 1 ? ",)" : ")");
}

/* NumPy's kinds in the order same_kind casting may go up: bool, int, float. */
static int kind_rank(DType t) { return t == DT_BOOL ? 0 : dt_is_int(t) ? 1 : 2; }

Value *hostnp_inplace(OpKind op, Value *cur, Value *rhs) {
  if (write_allowed(NULL, rhs) < 0) return NULL;
  if (AS_ARRAY(cur)->buf->np_ro) return err_set(ERR_VALUE, "output array is read-only");
  Value *r = ops_binary(op, cur, rhs);
  if (!r) return NULL;
  Array *a = AS_ARRAY(cur);
  int rc = -1;
  if (r->type != V_ARRAY) {
    err_set(ERR_TYPE, "unsupported operand for a NumPy array's in-place %s", ufunc_name(op));
  } else if (kind_rank(AS_ARRAY(r)->dtype) > kind_rank(a->dtype)) {
    err_set(ERR_TYPE, "Cannot cast ufunc '%s' output from dtype('%s') to dtype('%s') with "
            "casting rule 'same_kind'", ufunc_name(op), dt_name(AS_ARRAY(r)->dtype), dt_name(a->dtype));
  } else if (AS_ARRAY(r)->ndim != a->ndim ||
             memcmp(AS_ARRAY(r)->shape, a->shape, (size_t)a->ndim * sizeof(int64_t))) {
    char s1[128], s2[128];
    shape_str(s1, sizeof s1, a->ndim, a->shape);
    tight_shape(s2, sizeof s2, AS_ARRAY(r));
    err_set(ERR_VALUE, "non-broadcastable output operand with shape %s doesn't match the "
            "broadcast shape %s", s1, s2);
  } else if (read_only(a)) {
    err_set(ERR_VALUE, "output array is read-only");
  } else {
    rc = write_target(a, a, NULL, r);
  }
  val_decref(r);
  return rc < 0 ? NULL : val_incref(cur);
}

/* ---- operators: NumPy's promotion ---------------------------------------------------- */

/* [v] (borrowed) as a NumPy array of dtype [t]: a Python number by its
 * exact value, an array converted.  A new reference, or NULL. */
static Value *as_np(Value *v, DType t) {
  Array *a = AS_ARRAY(v), *c = a->host && a->ndim == 0
      ? (dt_is_float(t) ? arr_scalar_f64(t, arr_host_f64(a), false)
                        : arr_scalar_i64(t, arr_get_i64(a, 0), false))
      : arr_astype(a, t, false);
  if (c) c->buf->np = true;   /* fresh: an operand of NumPy's, not a jax.Array */
  return arr_value(c);
}

/* The dtype NumPy gives Python number [p] beside array [o], or -1 when
 * JAX's weak typing already agrees: a float beside an int or bool array
 * is float64, an int beside a bool array int64. */
static int number_dtype(const Array *p, const Array *o) {
  if (!p->host || o->host) return -1;
  if (dt_is_float(p->dtype) && !dt_is_float(o->dtype)) return DT_F64;
  if (dt_is_int(p->dtype) && o->dtype == DT_BOOL) return DT_I64;
  return -1;
}

int hostnp_promote(OpKind op, Value **a, Value **b) {
  Value *in[2] = {*a, *b}, *out[2] = {val_incref(*a), val_incref(*b)};
  for (int i = 0; i < 2; i++) {
    int t = number_dtype(AS_ARRAY(in[i]), AS_ARRAY(in[1 - i]));
    if (t < 0) continue;
    val_decref(out[i]);
    out[i] = as_np(in[i], (DType)t);
  }
  /* true division of ints and bools is float64's (JAX's default float otherwise) */
  bool inexact = out[0] && out[1] && (dt_is_float(AS_ARRAY(out[0])->dtype) || dt_is_float(AS_ARRAY(out[1])->dtype));
  for (int i = 0; op == OP_DIV && !inexact && i < 2 && out[i]; i++) {
    Value *c = as_np(out[i], DT_F64);
    val_decref(out[i]);
    out[i] = c;
  }
  if (!out[0] || !out[1]) {
    val_decref(out[0]);
    val_decref(out[1]);
    return -1;
  }
  *a = out[0];
  *b = out[1];
  return 0;
}

/* ---- the marks at the boundaries ---------------------------------------------------- */

static Value *remark(Value *v, bool np);

static Value *detach_leaf(Value *leaf, void *ctx) {
  (void)ctx;
  return remark(val_incref(leaf), false);
}

/* [v] (stolen: a pytree node: tuple, list, dict, registered class) with its NumPy arrays, at any depth, copied to jax.Arrays:
 * rebuilt (pytree_map: a dict's keys in JAX's order) only when it has
 * one, so a jit or shard_map never reads a buffer the host writes. */
static Value *detach_tree(Value *v) {
  PyLeaves l = {0};
  if (pytree_flatten(v, NULL, &l) < 0) {
    val_decref(v);
    return NULL;
  }
  bool any = false;
  for (int i = 0; i < l.n && !any; i++) any = arr_is_np(l.v[i]);
  pytree_leaves_free(&l);
  if (!any) return v;
  Value *r = pytree_map(v, NULL, detach_leaf, NULL);
  val_decref(v);
  return r;
}

/* [v] (stolen) with each array of it made NumPy's ([np]: itself, or the
 * items of a fresh tuple or list a call returned) or JAX's (the leaves
 * of any pytree). */
static Value *remark(Value *v, bool np) {
  if (!v) return NULL;
  if (v->type == V_ARRAY) {
    Array *a = AS_ARRAY(v);
    if (a->host || (a->buf->np == np && !np)) return v;   /* Python numbers stay Python's */
    return arr_value(arr_np_as(a, np));
  }
  if (!np && pytree_is_node(v)) return detach_tree(v);
  if (v->type != V_TUPLE && v->type != V_LIST) return v;
  size_t n;
  Value *const *items;
  val_seq(v, &n, &items);
  bool change = false;
  for (size_t i = 0; i < n; i++)
    change = change || (IS_ARRAY(items[i]) && !AS_ARRAY(items[i])->host && AS_ARRAY(items[i])->buf->np != np);
  if (!change) return v;
  Value **fresh = shm_calloc(n, sizeof *fresh);
  bool ok = fresh != NULL;
  for (size_t i = 0; ok && i < n; i++) ok = (fresh[i] = remark(val_incref(items[i]), np)) != NULL;
  Value *r = NULL;
  if (ok && v->type == V_TUPLE) {
    r = tuple_pack(n, fresh);
  } else if (ok) {
    r = list_new(n);
    for (size_t i = 0; r && i < n; i++)
      if (list_append(r, fresh[i]) < 0) {
        val_decref(r);
        r = NULL;
      }
  }
  for (size_t i = 0; fresh && i < n; i++) val_decref(fresh[i]);
  shm_free(fresh);
  val_decref(v);
  return ok && !r ? err_nomem() : r;
}

Value *hostnp_mark(Value *v) { return remark(v, true); }

Value *hostnp_detach(Value *v) { return remark(v, false); }

/* A numpy.random function or RandomState method [self] (a builtin or a
 * bound method) called under NumPy's mode, its arrays NumPy's. */
static Value *host_call(Value *self, const CallArgs *a) {
  ArrNpMode saved = arr_np_mode;
  arr_np_mode = ARR_NP_HOST;
  Value *r = self->type == V_BUILTIN ? ((Builtin *)self)->fn(a)
           : ((BoundMethod *)self)->fn(((BoundMethod *)self)->self, a);
  arr_np_mode = saved;
  return hostnp_mark(r);
}

Value *hostnp_wrap(Value *f) {
  if (!f) return NULL;
  const char *name = f->type == V_BUILTIN ? ((Builtin *)f)->name : ((BoundMethod *)f)->name;
  Value *b = bound_new(name, host_call, f);
  val_decref(f);
  return b;
}

/* A method of a NumPy array: its arrays are NumPy's (a method that
 * calls a jax function would otherwise return jax.Arrays). */
static Value *host_method(Value *self, const CallArgs *a) {
  BoundMethod *m = (BoundMethod *)self;
  ArrNpMode saved = arr_np_mode;
  arr_np_mode = ARR_NP_HOST;   /* views of a stay views (ravel, squeeze) */
  Value *r = m->fn(m->self, a);
  arr_np_mode = saved;
  return hostnp_mark(r);
}

/* a.copy(), a.flatten(), a.astype(t): NumPy's copies, never a view of a
 * (jax.Array's methods may return a itself). */
static Value *copying_method(Value *self, const CallArgs *a) {
  BoundMethod *m = (BoundMethod *)self;
  ArrNpMode saved = arr_np_mode;
  arr_np_mode = ARR_NP_HOST;
  Value *r = m->fn(m->self, a);
  arr_np_mode = saved;
  if (!r || !IS_ARRAY(r) || AS_ARRAY(r)->buf != AS_ARRAY(m->self)->buf) return hostnp_mark(r);
  Array *c = arr_copy(AS_ARRAY(r));
  val_decref(r);
  if (c) c->buf->np = true;
  return arr_value(c);
}

Value *hostnp_method(Value *bound) {
  if (!bound || bound->type != V_BOUND) return bound;
  const char *n = ((BoundMethod *)bound)->name;
  bool copies = !strcmp(n, "copy") || !strcmp(n, "flatten") || !strcmp(n, "astype");
  Value *b = bound_new(n, copies ? copying_method : host_method, bound);
  val_decref(bound);
  return b;
}
