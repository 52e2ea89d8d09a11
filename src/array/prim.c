/*
 * prim.c - the primitive table, the shape rules, parameters, and the one
 * apply function (prim.h).
 *
 * A shape rule checks what jax.lax checks and words its errors the way
 * JAX does, naming the primitive and the offending shapes or dtypes; the
 * kernels then trust their inputs.  The table itself is generated from
 * prim.def: each PRIM row picks up its rules from the RULES_<ID> macro
 * below, so a primitive added to prim.def without rules does not compile.
 */
#include "array/prim.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/timeline.h"
#include "array/kernels.h"
#include "base/mem.h"

Value *(*prim_trace_hook)(PrimId id, int nin, Value **in, const Params *p);

/* ---- parameters ----------------------------------------------------------- */

void params_init(Params *p) {
  p->n = 0;
  p->nomem = false;
}

int params_add(Params *p, const char *name, Value *v) {
  if (!v || !tuple_complete(v)) {   /* a tuple of tuples, one of them not made */
    val_decref(v);
    p->nomem = true;
    return -1;
  }
  if (p->n >= PRIM_MAX_PARAMS) {
    val_decref(v);
    err_set(ERR_VALUE, "too many parameters (at most %d)", PRIM_MAX_PARAMS);
    return -1;
  }
  p->p[p->n].name = name;
  p->p[p->n].value = v;
  p->n++;
  return 0;
}

Value *params_get(const Params *p, const char *name) {
  if (!p)
    return NULL;
  /* names are string literals, and one name is mostly one literal */
  for (int i = 0; i < p->n; i++)
    if (p->p[i].name == name)
      return p->p[i].value;
  for (int i = 0; i < p->n; i++)
    if (!strcmp(p->p[i].name, name))
      return p->p[i].value;
  return NULL;
}

/* The value of a required parameter, or NULL with the error set. */
static Value *params_need(const Params *p, const char *name) {
  Value *v = params_get(p, name);
  if (!v)
    err_set(ERR_VALUE, "missing parameter '%s'", name);
  return v;
}

int params_int(const Params *p, const char *name, int64_t *out) {
  Value *v = params_need(p, name);
  if (!v)
    return -1;
  if (!IS_ARRAY(v) || arr_to_index(v, out) < 0) {
    err_clear();
    err_set(ERR_TYPE, "parameter '%s' must be an integer, got %s", name, val_type_name(v));
    return -1;
  }
  return 0;
}

int params_ints(const Params *p, const char *name, int *n, int64_t *out, int cap) {
  Value *v = params_need(p, name);
  size_t len;
  Value *const *items;
  if (!v)
    return -1;
  if (IS_ARRAY(v) && AS_ARRAY(v)->ndim == 0 && cap >= 1) {
    *n = 1;
    return params_int(p, name, out);
  }
  if (!val_seq(v, &len, &items)) {
    err_set(ERR_TYPE, "parameter '%s' must be a tuple of integers, got %s", name,
            val_type_name(v));
    return -1;
  }
  if (len > (size_t)cap) {
    err_set(ERR_VALUE, "parameter '%s' has %zu entries, at most %d allowed", name, len, cap);
    return -1;
  }
  for (size_t i = 0; i < len; i++) {
    if (arr_to_index(items[i], &out[i]) < 0) {
      err_clear();
      err_set(ERR_TYPE, "parameter '%s' must be a tuple of integers", name);
      return -1;
    }
  }
  *n = (int)len;
  return 0;
}

int params_dtype(const Params *p, const char *name, DType *out) {
  Value *v = params_need(p, name);
  if (!v)
    return -1;
  if (v->type == V_DTYPE) {
    *out = ((DTypeVal *)v)->dtype;
    return 0;
  }
  if (v->type == V_STR && dt_parse(str_cstr(v), out))
    return 0;
  err_set(ERR_TYPE, "parameter '%s' must be a dtype, got %s", name, val_type_name(v));
  return -1;
}

int params_bool(const Params *p, const char *name, bool *out) {
  Value *v = params_need(p, name);
  if (!v)
    return -1;
  if (!IS_ARRAY(v) || AS_ARRAY(v)->size != 1) {
    err_set(ERR_TYPE, "parameter '%s' must be a bool, got %s", name, val_type_name(v));
    return -1;
  }
  *out = arr_get_f64(AS_ARRAY(v), 0) != 0;
  return 0;
}

void params_clear(Params *p) {
  for (int i = 0; i < p->n; i++)
    val_decref(p->p[i].value);
  p->n = 0;
}

Value *val_int(int64_t x) {
  DType t = (x >= INT32_MIN && x <= INT32_MAX) ? DT_I32 : DT_I64;
  Array *a = arr_scalar_i64(t, x, true);
  if (a) a->host = true;
  return (Value *)a;
}

Value *val_int_tuple(int n, const int64_t *xs) {
  Value *t = tuple_new((size_t)n);
  if (!t)
    return NULL;
  for (int i = 0; i < n; i++) {
    Value *v = val_int(xs[i]);
    if (!v) {
      for (int j = i; j < n; j++)
        tuple_set_steal(t, (size_t)j, val_incref(VAL_NONE));
      val_decref(t);
      return NULL;
    }
    tuple_set_steal(t, (size_t)i, v);
  }
  return t;
}

/* A pair of [a] and [b] (stolen, released on failure). */
static Value *pair_steal(Value *a, Value *b) {
  Value *t = a && b ? tuple_new(2) : NULL;
  if (!t) {
    if (a) val_decref(a);
    if (b) val_decref(b);
    return NULL;
  }
  tuple_set_steal(t, 0, a);
  tuple_set_steal(t, 1, b);
  return t;
}

Value *val_dot_dimension_numbers(int nc, const int64_t *lc, const int64_t *rc, int nb,
                                 const int64_t *lb, const int64_t *rb) {
  return pair_steal(pair_steal(val_int_tuple(nc, lc), val_int_tuple(nc, rc)),
                    pair_steal(val_int_tuple(nb, lb), val_int_tuple(nb, rb)));
}

void aval_of(const Array *a, AVal *out) {
  out->dtype = a->dtype;
  out->weak = a->weak;
  out->ndim = a->ndim;
  for (int i = 0; i < a->ndim; i++)   /* a loop: memcpy of a few words is a slow rep movs */
    out->shape[i] = a->shape[i];
  out->vma = a->vma;
}

/* ---- dtype classes -------------------------------------------------------------- */

/* Which dtypes a primitive accepts, as bit sets over DType. */
#define DC_BOOL (1u << DT_BOOL)
#define DC_INT (1u << DT_I8 | 1u << DT_I32 | 1u << DT_I64)
#define DC_FLOAT (1u << DT_BF16 | 1u << DT_F16 | 1u << DT_F32 | 1u << DT_F64)
#define DC_NUM (DC_INT | DC_FLOAT)
#define DC_ANY (DC_BOOL | DC_NUM)

static unsigned prim_accepts(PrimId id) {
  switch (id) {
    case P_FLOOR: case P_CEIL: case P_ROUND: case P_IS_FINITE: case P_EXP:
    case P_LOG: case P_LOG1P: case P_EXPM1: case P_TANH: case P_LOGISTIC:
    case P_SIN: case P_COS: case P_TAN: case P_ASIN: case P_ACOS: case P_ATAN:
    case P_SINH: case P_COSH: case P_SQRT: case P_RSQRT: case P_ATAN2:
      return DC_FLOAT;
    case P_NEG: case P_SIGN: case P_ABS: case P_INTEGER_POW: case P_SUB:
    case P_DIV: case P_REM: case P_POW:
      return DC_NUM;
    case P_NOT: case P_AND: case P_OR: case P_XOR: case P_REDUCE_AND:
    case P_REDUCE_OR:
      return DC_BOOL | DC_INT;
    default:
      return DC_ANY;
  }
}

static const char *prim_class_name(unsigned cls) {
  if (cls == DC_FLOAT)
    return "floating";
  if (cls == DC_NUM)
    return "number";
  return "integer or bool";
}

/* Checks that primitive [id] accepts [t]. */
static int prim_check_dtype(PrimId id, DType t) {
  unsigned cls = prim_accepts(id);
  if (cls & (1u << t))
    return 0;
  err_set(ERR_TYPE, "%s does not accept dtype %s. Accepted dtypes are subtypes of %s.",
          prim_table[id].name, dt_name(t), prim_class_name(cls));
  return -1;
}

/* ---- helpers for the rules ---------------------------------------------------------- */

static void prim_set(AVal *out, DType t, bool weak, int ndim, const int64_t *shape) {
  out->dtype = t;
  out->weak = weak;
  out->ndim = ndim;
  for (int i = 0; i < ndim; i++)
    out->shape[i] = shape[i];
  out->vma = 0;
}

/* "(3, 4)" for error messages, in a caller's buffer. */
static const char *prim_shape(char *buf, const AVal *a) {
  shape_str(buf, 128, a->ndim, a->shape);
  return buf;
}

static const char *prim_ints(char *buf, int n, const int64_t *xs) {
  shape_str(buf, 128, n, xs);
  return buf;
}

static bool prim_same_dims(int n, const int64_t *a, const int64_t *b) {
  for (int i = 0; i < n; i++)
    if (a[i] != b[i])
      return false;
  return true;
}

static bool prim_same_shape(const AVal *a, const AVal *b) {
  return a->ndim == b->ndim && prim_same_dims(a->ndim, a->shape, b->shape);
}

/* Reads dims param [name] and checks each is a distinct axis of rank
 * [ndim]; negative dims are normalised.  [*mask] gets the set. */
static int prim_dims(PrimId id, const Params *p, const char *name, int ndim,
                     int *n, int64_t *dims, bool *mask) {
  if (params_ints(p, name, n, dims, SHM_MAXDIM) < 0)
    return -1;
  memset(mask, 0, sizeof(bool) * SHM_MAXDIM);
  for (int i = 0; i < *n; i++) {
    int d;
    if (axis_normalize(dims[i], ndim, &d) < 0)
      return -1;
    if (mask[d]) {
      err_set(ERR_VALUE, "%s: %s contains the axis %d twice", prim_table[id].name, name, d);
      return -1;
    }
    mask[d] = true;
    dims[i] = d;
  }
  return 0;
}

/* ---- elementwise rules -------------------------------------------------------------- */

static int shape_unary(PrimId id, const AVal *in, const Params *p, AVal *out) {
  if (prim_check_dtype(id, in[0].dtype) < 0)
    return -1;
  prim_set(out, in[0].dtype, in[0].weak, in[0].ndim, in[0].shape);
  if (id == P_IS_FINITE) {
    out->dtype = DT_BOOL;
    out->weak = false;
  }
  return 0;
}

#define UNARY_RULE(NAME, ID)                                                   \
  static int NAME(const AVal *in, int nin, const Params *p, AVal *out) {     \
    return shape_unary(ID, in, p, out);                                      \
  }

static int shape_convert_element_type(const AVal *in, int nin, const Params *p, AVal *out) {
  DType t;
  bool weak = false;
  if (params_dtype(p, "new_dtype", &t) < 0)
    return -1;
  if (params_get(p, "weak_type") && params_bool(p, "weak_type", &weak) < 0)
    return -1;
  aval_copy(out, &in[0]);
  out->dtype = t;
  out->weak = weak;
  return 0;
}

static int shape_integer_pow(const AVal *in, int nin, const Params *p, AVal *out) {
  int64_t y;
  if (params_int(p, "y", &y) < 0 || shape_unary(P_INTEGER_POW, in, p, out) < 0)
    return -1;
  if (y < 0 && !dt_is_float(in[0].dtype)) {
    err_set(ERR_VALUE, "integer_pow: integers to negative powers are not allowed (y=%" PRId64 ")", y);
    return -1;
  }
  return 0;
}

/* The common shape of operands that are all the same shape or rank 0. */
static int prim_common_shape(PrimId id, const AVal *in, int nin, const AVal **shape_of) {
  const AVal *s = &in[0];
  for (int i = 1; i < nin; i++)
    if (in[i].ndim > s->ndim)
      s = &in[i];
  for (int i = 0; i < nin; i++) {
    if (in[i].ndim != 0 && !prim_same_shape(&in[i], s)) {
      char a[128], b[128];
      err_set(ERR_VALUE, "%s got incompatible shapes for broadcasting: %s, %s",
              prim_table[id].name, prim_shape(a, &in[i]), prim_shape(b, s));
      return -1;
    }
  }
  *shape_of = s;
  return 0;
}

/* Every operand from [first] has the dtype of in[first]. */
static int prim_same_dtypes(PrimId id, const AVal *in, int first, int nin) {
  for (int i = first + 1; i < nin; i++) {
    if (in[i].dtype != in[first].dtype) {
      err_set(ERR_TYPE, "%s requires arguments to have the same dtypes, got %s, %s",
              prim_table[id].name, dt_name(in[first].dtype), dt_name(in[i].dtype));
      return -1;
    }
  }
  return 0;
}

static bool prim_all_weak(const AVal *in, int first, int nin) {
  bool w = true;
  for (int i = first; i < nin; i++)
    w = w && in[i].weak;
  return w;
}

static bool prim_is_compare(PrimId id) {
  return id == P_EQ || id == P_NE || id == P_LT || id == P_LE || id == P_GT || id == P_GE;
}

static int shape_binary(PrimId id, const AVal *in, int nin, AVal *out) {
  const AVal *s;
  if (prim_same_dtypes(id, in, 0, nin) < 0 || prim_check_dtype(id, in[0].dtype) < 0 ||
      prim_common_shape(id, in, nin, &s) < 0)
    return -1;
  bool cmp = prim_is_compare(id);
  prim_set(out, cmp ? DT_BOOL : in[0].dtype, cmp ? false : prim_all_weak(in, 0, nin),
           s->ndim, s->shape);
  return 0;
}

#define BINARY_RULE(NAME, ID)                                                  \
  static int NAME(const AVal *in, int nin, const Params *p, AVal *out) {     \
    return shape_binary(ID, in, nin, out);                                   \
  }

static int shape_select_n(const AVal *in, int nin, const Params *p, AVal *out) {
  const AVal *s;
  if (nin < 2) {
    err_set(ERR_TYPE, "select_n requires at least one case");
    return -1;
  }
  if (in[0].dtype != DT_BOOL && in[0].dtype != DT_I32) {
    err_set(ERR_TYPE, "select_n which must be boolean or int32, got %s", dt_name(in[0].dtype));
    return -1;
  }
  if (in[0].dtype == DT_BOOL && nin > 3) {
    err_set(ERR_TYPE, "select_n with a boolean predicate takes at most 2 cases, got %d", nin - 1);
    return -1;
  }
  if (prim_same_dtypes(P_SELECT_N, in, 1, nin) < 0 ||
      prim_common_shape(P_SELECT_N, in, nin, &s) < 0)
    return -1;
  prim_set(out, in[1].dtype, prim_all_weak(in, 1, nin), s->ndim, s->shape);
  return 0;
}

/* ---- reductions ------------------------------------------------------------------- */

static int shape_reduce(PrimId id, const AVal *in, const Params *p, AVal *out) {
  int n;
  int64_t axes[SHM_MAXDIM], shape[SHM_MAXDIM];
  bool mask[SHM_MAXDIM];
  if (prim_check_dtype(id, in[0].dtype) < 0 ||
      prim_dims(id, p, "axes", in[0].ndim, &n, axes, mask) < 0)
    return -1;
  int k = 0;
  for (int i = 0; i < in[0].ndim; i++)
    if (!mask[i])
      shape[k++] = in[0].shape[i];
  prim_set(out, in[0].dtype, in[0].weak, k, shape);
  return 0;
}

#define REDUCE_RULE(NAME, ID)                                                  \
  static int NAME(const AVal *in, int nin, const Params *p, AVal *out) {     \
    return shape_reduce(ID, in, p, out);                                     \
  }

static int shape_argreduce(PrimId id, const AVal *in, const Params *p, AVal *out) {
  int n;
  int64_t axes[SHM_MAXDIM];
  bool mask[SHM_MAXDIM];
  DType t;
  if (prim_dims(id, p, "axes", in[0].ndim, &n, axes, mask) < 0 ||
      params_dtype(p, "index_dtype", &t) < 0)
    return -1;
  if (n != 1 || !dt_is_int(t)) {
    err_set(ERR_VALUE, "%s requires one axis and an integer index_dtype", prim_table[id].name);
    return -1;
  }
  if (in[0].shape[axes[0]] == 0) {
    err_set(ERR_VALUE, "attempt to get %s of an empty sequence", prim_table[id].name);
    return -1;
  }
  if (shape_reduce(P_REDUCE_MAX, in, p, out) < 0)
    return -1;
  out->dtype = t;
  out->weak = false;
  return 0;
}

static int shape_scan(PrimId id, const AVal *in, const Params *p, AVal *out) {
  int64_t axis;
  int ax;
  bool rev;
  if (prim_check_dtype(id, in[0].dtype) < 0 || params_int(p, "axis", &axis) < 0 ||
      axis_normalize(axis, in[0].ndim, &ax) < 0)
    return -1;
  if (params_get(p, "reverse") && params_bool(p, "reverse", &rev) < 0)
    return -1;
  aval_copy(out, &in[0]);
  return 0;
}

static int shape_argmax(const AVal *in, int nin, const Params *p, AVal *out) {
  return shape_argreduce(P_ARGMAX, in, p, out);
}
static int shape_argmin(const AVal *in, int nin, const Params *p, AVal *out) {
  return shape_argreduce(P_ARGMIN, in, p, out);
}
#define SCAN_RULE(NAME, ID)                                                    \
  static int NAME(const AVal *in, int nin, const Params *p, AVal *out) {     \
    return shape_scan(ID, in, p, out);                                       \
  }

/* ---- layout rules ------------------------------------------------------------------- */

/* Checks a shape parameter: ndim in range, dims non-negative. */
static int prim_check_shape(PrimId id, int n, const int64_t *shape) {
  for (int i = 0; i < n; i++) {
    if (shape[i] < 0) {
      char b[128];
      err_set(ERR_VALUE, "%s: shape %s has a negative dimension", prim_table[id].name,
              prim_ints(b, n, shape));
      return -1;
    }
  }
  if (shape_size(n, shape) < 0) {
    err_set(ERR_MEMORY, "%s: shape is too large", prim_table[id].name);
    return -1;
  }
  return 0;
}

static int shape_iota(const AVal *in, int nin, const Params *p, AVal *out) {
  DType t;
  int n;
  int64_t shape[SHM_MAXDIM], dim = 0;
  if (params_dtype(p, "dtype", &t) < 0 || params_ints(p, "shape", &n, shape, SHM_MAXDIM) < 0 ||
      prim_check_shape(P_IOTA, n, shape) < 0)
    return -1;
  if (params_get(p, "dimension") && params_int(p, "dimension", &dim) < 0)
    return -1;
  if (n > 0 && (dim < 0 || dim >= n)) {
    err_set(ERR_VALUE, "iota dimension must be between 0 and %d, got %" PRId64, n - 1, dim);
    return -1;
  }
  prim_set(out, t, false, n, shape);
  return 0;
}

static int shape_broadcast_in_dim(const AVal *in, int nin, const Params *p, AVal *out) {
  int n, nb;
  int64_t shape[SHM_MAXDIM], bd[SHM_MAXDIM];
  char a[128], b[128], c[128];
  if (params_ints(p, "shape", &n, shape, SHM_MAXDIM) < 0 ||
      params_ints(p, "broadcast_dimensions", &nb, bd, SHM_MAXDIM) < 0 ||
      prim_check_shape(P_BROADCAST_IN_DIM, n, shape) < 0)
    return -1;
  if (nb != in[0].ndim) {
    err_set(ERR_VALUE, "broadcast_in_dim broadcast_dimensions must have length equal to "
            "operand ndim; got broadcast_dimensions %s for operand ndim %d.",
            prim_ints(a, nb, bd), in[0].ndim);
    return -1;
  }
  for (int i = 0; i < nb; i++) {
    if (bd[i] < 0 || bd[i] >= n || (i > 0 && bd[i] <= bd[i - 1])) {
      err_set(ERR_VALUE, "broadcast_in_dim broadcast_dimensions must be strictly increasing "
              "and within the target rank %d; got broadcast_dimensions %s", n,
              prim_ints(a, nb, bd));
      return -1;
    }
    if (in[0].shape[i] != 1 && in[0].shape[i] != shape[bd[i]]) {
      err_set(ERR_VALUE, "broadcast_in_dim operand dimension sizes must either be 1, or be "
              "equal to their corresponding dimensions in the target broadcast shape; got "
              "operand of shape %s, target broadcast shape %s, broadcast_dimensions %s",
              prim_shape(a, &in[0]), prim_ints(b, n, shape), prim_ints(c, nb, bd));
      return -1;
    }
  }
  prim_set(out, in[0].dtype, in[0].weak, n, shape);
  return 0;
}

/* Checks [perm] is a permutation of 0..ndim-1. */
static int prim_check_perm(PrimId id, const char *what, int n, const int64_t *perm, int ndim) {
  bool seen[SHM_MAXDIM] = {false};
  bool ok = n == ndim;
  for (int i = 0; ok && i < n; i++) {
    ok = perm[i] >= 0 && perm[i] < ndim && !seen[perm[i]];
    if (ok)
      seen[perm[i]] = true;
  }
  if (!ok) {
    char b[128];
    err_set(ERR_VALUE, "%s %s must be a permutation of the operand dimensions (ndim %d), got %s",
            prim_table[id].name, what, ndim, prim_ints(b, n, perm));
    return -1;
  }
  return 0;
}

static int shape_reshape(const AVal *in, int nin, const Params *p, AVal *out) {
  int n, nd;
  int64_t shape[SHM_MAXDIM], dims[SHM_MAXDIM];
  char a[128], b[128];
  if (params_ints(p, "new_sizes", &n, shape, SHM_MAXDIM) < 0 ||
      prim_check_shape(P_RESHAPE, n, shape) < 0)
    return -1;
  Value *dv = params_get(p, "dimensions");
  if (dv && dv != VAL_NONE &&
      (params_ints(p, "dimensions", &nd, dims, SHM_MAXDIM) < 0 ||
       prim_check_perm(P_RESHAPE, "dimensions", nd, dims, in[0].ndim) < 0))
    return -1;
  int64_t have = shape_size(in[0].ndim, in[0].shape), want = shape_size(n, shape);
  if (have != want) {
    err_set(ERR_VALUE, "reshape total size must be unchanged, got new_sizes %s (of total size "
            "%" PRId64 ") for shape %s (of total size %" PRId64 ").",
            prim_ints(a, n, shape), want, prim_shape(b, &in[0]), have);
    return -1;
  }
  prim_set(out, in[0].dtype, in[0].weak, n, shape);
  return 0;
}

static int shape_transpose(const AVal *in, int nin, const Params *p, AVal *out) {
  int n;
  int64_t perm[SHM_MAXDIM];
  if (params_ints(p, "permutation", &n, perm, SHM_MAXDIM) < 0 ||
      prim_check_perm(P_TRANSPOSE, "permutation", n, perm, in[0].ndim) < 0)
    return -1;
  aval_copy(out, &in[0]);
  for (int i = 0; i < n; i++)
    out->shape[i] = in[0].shape[perm[i]];
  return 0;
}

static int shape_squeeze(const AVal *in, int nin, const Params *p, AVal *out) {
  int n, k = 0;
  int64_t dims[SHM_MAXDIM], shape[SHM_MAXDIM];
  bool mask[SHM_MAXDIM];
  if (prim_dims(P_SQUEEZE, p, "dimensions", in[0].ndim, &n, dims, mask) < 0)
    return -1;
  for (int i = 0; i < in[0].ndim; i++) {
    if (mask[i] && in[0].shape[i] != 1) {
      char a[128];
      err_set(ERR_VALUE, "cannot select an axis to squeeze out which has size not equal to "
              "one, got shape=%s and dimensions=(%d,)", prim_shape(a, &in[0]), i);
      return -1;
    }
    if (!mask[i])
      shape[k++] = in[0].shape[i];
  }
  prim_set(out, in[0].dtype, in[0].weak, k, shape);
  return 0;
}

static int shape_expand_dims(const AVal *in, int nin, const Params *p, AVal *out) {
  int n;
  int64_t dims[SHM_MAXDIM], shape[SHM_MAXDIM];
  bool mask[SHM_MAXDIM];
  if (params_ints(p, "dimensions", &n, dims, SHM_MAXDIM) < 0)
    return -1;
  int nout = in[0].ndim + n;
  if (nout > SHM_MAXDIM) {
    err_set(ERR_VALUE, "expand_dims: result rank %d exceeds %d", nout, SHM_MAXDIM);
    return -1;
  }
  if (prim_dims(P_EXPAND_DIMS, p, "dimensions", nout, &n, dims, mask) < 0)
    return -1;
  for (int i = 0, k = 0; i < nout; i++)
    shape[i] = mask[i] ? 1 : in[0].shape[k++];
  prim_set(out, in[0].dtype, in[0].weak, nout, shape);
  return 0;
}

static int shape_rev(const AVal *in, int nin, const Params *p, AVal *out) {
  int n;
  int64_t dims[SHM_MAXDIM];
  bool mask[SHM_MAXDIM];
  if (prim_dims(P_REV, p, "dimensions", in[0].ndim, &n, dims, mask) < 0)
    return -1;
  aval_copy(out, &in[0]);
  return 0;
}

static int shape_slice(const AVal *in, int nin, const Params *p, AVal *out) {
  int n, nl, ns = 0;
  int64_t st[SHM_MAXDIM], li[SHM_MAXDIM], sd[SHM_MAXDIM];
  char a[128], b[128], c[128];
  if (params_ints(p, "start_indices", &n, st, SHM_MAXDIM) < 0 ||
      params_ints(p, "limit_indices", &nl, li, SHM_MAXDIM) < 0)
    return -1;
  Value *sv = params_get(p, "strides");
  if (sv && sv != VAL_NONE && params_ints(p, "strides", &ns, sd, SHM_MAXDIM) < 0)
    return -1;
  if (n != in[0].ndim || nl != n || (ns && ns != n)) {
    err_set(ERR_VALUE, "slice start_indices, limit_indices and strides must have length equal "
            "to the operand rank %d", in[0].ndim);
    return -1;
  }
  aval_copy(out, &in[0]);
  for (int i = 0; i < n; i++) {
    int64_t s = ns ? sd[i] : 1;
    if (st[i] < 0 || li[i] < st[i] || li[i] > in[0].shape[i] || s < 1) {
      err_set(ERR_VALUE, "slice start_indices %s, limit_indices %s and strides must satisfy "
              "0 <= start <= limit <= shape %s with strides >= 1",
              prim_ints(a, n, st), prim_ints(b, n, li), prim_shape(c, &in[0]));
      return -1;
    }
    out->shape[i] = (li[i] - st[i] + s - 1) / s;
  }
  return 0;
}

/* Checks that in[first..first+ndim) are 0-d integer start indices. */
static int prim_check_starts(PrimId id, const AVal *in, int nin, int first, int ndim) {
  if (nin != first + ndim) {
    err_set(ERR_TYPE, "%s takes %d start indices for an operand of rank %d, got %d",
            prim_table[id].name, ndim, ndim, nin - first);
    return -1;
  }
  for (int i = first; i < nin; i++) {
    if (in[i].ndim != 0 || !dt_is_int(in[i].dtype)) {
      err_set(ERR_TYPE, "%s start indices must be scalar integers, got %s with %d dimensions",
              prim_table[id].name, dt_name(in[i].dtype), in[i].ndim);
      return -1;
    }
  }
  return 0;
}

static int shape_dynamic_slice(const AVal *in, int nin, const Params *p, AVal *out) {
  int n;
  int64_t sizes[SHM_MAXDIM];
  char a[128], b[128];
  if (params_ints(p, "slice_sizes", &n, sizes, SHM_MAXDIM) < 0 ||
      prim_check_starts(P_DYNAMIC_SLICE, in, nin, 1, in[0].ndim) < 0)
    return -1;
  bool ok = n == in[0].ndim;
  for (int i = 0; ok && i < n; i++)
    ok = sizes[i] >= 0 && sizes[i] <= in[0].shape[i];
  if (!ok) {
    err_set(ERR_VALUE, "slice_sizes must be less than or equal to operand shape, got "
            "slice_sizes %s for operand shape %s", prim_ints(a, n, sizes), prim_shape(b, &in[0]));
    return -1;
  }
  prim_set(out, in[0].dtype, in[0].weak, n, sizes);
  return 0;
}

static int shape_dynamic_update_slice(const AVal *in, int nin, const Params *p, AVal *out) {
  char a[128], b[128];
  if (nin < 2 || prim_check_starts(P_DYNAMIC_UPDATE_SLICE, in, nin, 2, in[0].ndim) < 0 ||
      prim_same_dtypes(P_DYNAMIC_UPDATE_SLICE, in, 0, 2) < 0)
    return -1;
  bool ok = in[1].ndim == in[0].ndim;
  for (int i = 0; ok && i < in[0].ndim; i++)
    ok = in[1].shape[i] <= in[0].shape[i];
  if (!ok) {
    err_set(ERR_VALUE, "dynamic_update_slice update shape must be smaller than operand shape, "
            "got update shape %s for operand shape %s", prim_shape(a, &in[1]),
            prim_shape(b, &in[0]));
    return -1;
  }
  aval_copy(out, &in[0]);
  return 0;
}

static int shape_concatenate(const AVal *in, int nin, const Params *p, AVal *out) {
  int64_t dim;
  int d;
  char a[128], b[128];
  if (nin < 1) {
    err_set(ERR_VALUE, "concatenate requires at least one operand");
    return -1;
  }
  if (params_int(p, "dimension", &dim) < 0 || axis_normalize(dim, in[0].ndim, &d) < 0 ||
      prim_same_dtypes(P_CONCATENATE, in, 0, nin) < 0)
    return -1;
  aval_copy(out, &in[0]);
  out->weak = prim_all_weak(in, 0, nin);
  for (int k = 1; k < nin; k++) {
    bool ok = in[k].ndim == in[0].ndim;
    for (int i = 0; ok && i < in[0].ndim; i++)
      ok = i == d || in[k].shape[i] == in[0].shape[i];
    if (!ok) {
      err_set(ERR_VALUE, "concatenate operands must have the same shape except on dimension "
              "%d, got shapes %s and %s", d, prim_shape(a, &in[0]), prim_shape(b, &in[k]));
      return -1;
    }
    out->shape[d] += in[k].shape[d];
  }
  return 0;
}

static int shape_pad(const AVal *in, int nin, const Params *p, AVal *out) {
  int64_t lo[SHM_MAXDIM], hi[SHM_MAXDIM], it[SHM_MAXDIM];
  if (prim_same_dtypes(P_PAD, in, 0, 2) < 0)
    return -1;
  if (in[1].ndim != 0) {
    err_set(ERR_TYPE, "pad padding_value must be a scalar, got %d dimensions", in[1].ndim);
    return -1;
  }
  if (kern_padding_config(params_get(p, "padding_config"), in[0].ndim, lo, hi, it) < 0)
    return -1;
  aval_copy(out, &in[0]);
  for (int i = 0; i < in[0].ndim; i++) {
    int64_t n = in[0].shape[i];
    int64_t d = lo[i] + hi[i] + n + (n > 0 ? (n - 1) * it[i] : 0);
    if (it[i] < 0 || d < 0) {
      err_set(ERR_VALUE, "pad: interior padding must be non-negative and the padded dimension "
              "%d non-negative, got (%" PRId64 ", %" PRId64 ", %" PRId64 ")", i, lo[i], hi[i], it[i]);
      return -1;
    }
    out->shape[i] = d;
  }
  return 0;
}

/* operand.shape[:axis] + indices.shape + operand.shape[axis+1:] */
static int prim_take_shape(PrimId id, const AVal *x, const AVal *idx, int axis,
                           int *n, int64_t *shape) {
  if (!dt_is_int(idx->dtype)) {
    err_set(ERR_TYPE, "%s indices must be integers, got %s", prim_table[id].name,
            dt_name(idx->dtype));
    return -1;
  }
  if (x->ndim - 1 + idx->ndim > SHM_MAXDIM) {
    err_set(ERR_VALUE, "%s: result rank exceeds %d", prim_table[id].name, SHM_MAXDIM);
    return -1;
  }
  int k = 0;
  for (int i = 0; i < axis; i++)
    shape[k++] = x->shape[i];
  for (int i = 0; i < idx->ndim; i++)
    shape[k++] = idx->shape[i];
  for (int i = axis + 1; i < x->ndim; i++)
    shape[k++] = x->shape[i];
  *n = k;
  return 0;
}

static int shape_gather(const AVal *in, int nin, const Params *p, AVal *out) {
  int64_t ax, shape[SHM_MAXDIM];
  int axis, n;
  if (params_int(p, "axis", &ax) < 0 || axis_normalize(ax, in[0].ndim, &axis) < 0 ||
      prim_take_shape(P_GATHER, &in[0], &in[1], axis, &n, shape) < 0)
    return -1;
  prim_set(out, in[0].dtype, in[0].weak, n, shape);
  return 0;
}

static int shape_scatter(const AVal *in, int nin, const Params *p, AVal *out) {
  int64_t ax, shape[SHM_MAXDIM];
  int axis, n;
  char a[128], b[128];
  if (params_int(p, "axis", &ax) < 0 || axis_normalize(ax, in[0].ndim, &axis) < 0 ||
      prim_take_shape(P_SCATTER, &in[0], &in[1], axis, &n, shape) < 0)
    return -1;
  Value *mode = params_get(p, "mode");
  if (mode && (mode->type != V_STR || kern_scatter_mode(str_cstr(mode)) < 0)) {
    err_set(ERR_VALUE, "scatter mode must be 'set', 'add', 'multiply', 'min' or 'max'");
    return -1;
  }
  if (in[2].dtype != in[0].dtype) {
    err_set(ERR_TYPE, "scatter requires updates of the operand's dtype %s, got %s",
            dt_name(in[0].dtype), dt_name(in[2].dtype));
    return -1;
  }
  if (in[2].ndim != n || memcmp(in[2].shape, shape, sizeof(int64_t) * n)) {
    err_set(ERR_VALUE, "scatter updates must have shape %s, got %s",
            prim_ints(a, n, shape), prim_shape(b, &in[2]));
    return -1;
  }
  aval_copy(out, &in[0]);
  return 0;
}

static int shape_sort(const AVal *in, int nin, const Params *p, AVal *out) {
  int64_t dim = in[0].ndim - 1;
  int d;
  if (in[0].ndim == 0) {
    err_set(ERR_VALUE, "sort requires an operand of rank >= 1");
    return -1;
  }
  if (params_get(p, "dimension") && params_int(p, "dimension", &dim) < 0)
    return -1;
  if (axis_normalize(dim, in[0].ndim, &d) < 0)
    return -1;
  aval_copy(out, &in[0]);
  return 0;
}

static int shape_argsort(const AVal *in, int nin, const Params *p, AVal *out) {
  if (shape_sort(in, nin, p, out) < 0)
    return -1;
  out->dtype = DT_I32;
  out->weak = false;
  return 0;
}

/* ---- rule instances --------------------------------------------------------------- */

UNARY_RULE(shape_neg, P_NEG) UNARY_RULE(shape_sign, P_SIGN) UNARY_RULE(shape_floor, P_FLOOR)
UNARY_RULE(shape_ceil, P_CEIL) UNARY_RULE(shape_round, P_ROUND)
UNARY_RULE(shape_is_finite, P_IS_FINITE) UNARY_RULE(shape_exp, P_EXP)
UNARY_RULE(shape_log, P_LOG) UNARY_RULE(shape_log1p, P_LOG1P) UNARY_RULE(shape_expm1, P_EXPM1)
UNARY_RULE(shape_tanh, P_TANH) UNARY_RULE(shape_logistic, P_LOGISTIC)
UNARY_RULE(shape_sin, P_SIN) UNARY_RULE(shape_cos, P_COS) UNARY_RULE(shape_tan, P_TAN)
UNARY_RULE(shape_asin, P_ASIN) UNARY_RULE(shape_acos, P_ACOS) UNARY_RULE(shape_atan, P_ATAN)
UNARY_RULE(shape_sinh, P_SINH) UNARY_RULE(shape_cosh, P_COSH) UNARY_RULE(shape_sqrt, P_SQRT)
UNARY_RULE(shape_rsqrt, P_RSQRT) UNARY_RULE(shape_abs, P_ABS) UNARY_RULE(shape_not, P_NOT)
UNARY_RULE(shape_copy, P_COPY)
BINARY_RULE(shape_add, P_ADD) BINARY_RULE(shape_sub, P_SUB) BINARY_RULE(shape_mul, P_MUL)
BINARY_RULE(shape_div, P_DIV) BINARY_RULE(shape_rem, P_REM) BINARY_RULE(shape_pow, P_POW)
BINARY_RULE(shape_max, P_MAX) BINARY_RULE(shape_min, P_MIN) BINARY_RULE(shape_atan2, P_ATAN2)
BINARY_RULE(shape_and, P_AND) BINARY_RULE(shape_or, P_OR) BINARY_RULE(shape_xor, P_XOR)
BINARY_RULE(shape_eq, P_EQ) BINARY_RULE(shape_ne, P_NE) BINARY_RULE(shape_lt, P_LT)
BINARY_RULE(shape_le, P_LE) BINARY_RULE(shape_gt, P_GT) BINARY_RULE(shape_ge, P_GE)
BINARY_RULE(shape_clamp, P_CLAMP)
REDUCE_RULE(shape_reduce_sum, P_REDUCE_SUM) REDUCE_RULE(shape_reduce_max, P_REDUCE_MAX)
REDUCE_RULE(shape_reduce_min, P_REDUCE_MIN) REDUCE_RULE(shape_reduce_prod, P_REDUCE_PROD)
REDUCE_RULE(shape_reduce_and, P_REDUCE_AND) REDUCE_RULE(shape_reduce_or, P_REDUCE_OR)
SCAN_RULE(shape_cumsum, P_CUMSUM) SCAN_RULE(shape_cumprod, P_CUMPROD)
SCAN_RULE(shape_cummax, P_CUMMAX)

/* ---- the table ------------------------------------------------------------------------ */

/* RULES_<ID>: the shape rule, kernel and replication rule of each row. */
#define R(name) .shape = shape_##name, .kernel = kern_##name
#define RULES_NEG R(neg)
#define RULES_SIGN R(sign)
#define RULES_FLOOR R(floor)
#define RULES_CEIL R(ceil)
#define RULES_ROUND R(round)
#define RULES_IS_FINITE R(is_finite)
#define RULES_EXP R(exp)
#define RULES_LOG R(log)
#define RULES_LOG1P R(log1p)
#define RULES_EXPM1 R(expm1)
#define RULES_TANH R(tanh)
#define RULES_LOGISTIC R(logistic)
#define RULES_SIN R(sin)
#define RULES_COS R(cos)
#define RULES_TAN R(tan)
#define RULES_ASIN R(asin)
#define RULES_ACOS R(acos)
#define RULES_ATAN R(atan)
#define RULES_SINH R(sinh)
#define RULES_COSH R(cosh)
#define RULES_SQRT R(sqrt)
#define RULES_RSQRT R(rsqrt)
#define RULES_ABS R(abs)
#define RULES_NOT R(not)
#define RULES_INTEGER_POW R(integer_pow)
#define RULES_CONVERT_ELEMENT_TYPE R(convert_element_type)
#define RULES_COPY R(copy)
#define RULES_ADD R(add)
#define RULES_SUB R(sub)
#define RULES_MUL R(mul)
#define RULES_DIV R(div)
#define RULES_REM R(rem)
#define RULES_POW R(pow)
#define RULES_MAX R(max)
#define RULES_MIN R(min)
#define RULES_ATAN2 R(atan2)
#define RULES_AND R(and)
#define RULES_OR R(or)
#define RULES_XOR R(xor)
#define RULES_EQ R(eq)
#define RULES_NE R(ne)
#define RULES_LT R(lt)
#define RULES_LE R(le)
#define RULES_GT R(gt)
#define RULES_GE R(ge)
#define RULES_SELECT_N R(select_n)
#define RULES_CLAMP R(clamp)
#define RULES_REDUCE_SUM R(reduce_sum)
#define RULES_REDUCE_MAX R(reduce_max)
#define RULES_REDUCE_MIN R(reduce_min)
#define RULES_REDUCE_PROD R(reduce_prod)
#define RULES_REDUCE_AND R(reduce_and)
#define RULES_REDUCE_OR R(reduce_or)
#define RULES_ARGMAX R(argmax)
#define RULES_ARGMIN R(argmin)
#define RULES_CUMSUM R(cumsum)
#define RULES_CUMPROD R(cumprod)
#define RULES_CUMMAX R(cummax)
#define RULES_IOTA R(iota)
#define RULES_BROADCAST_IN_DIM R(broadcast_in_dim)
#define RULES_RESHAPE R(reshape)
#define RULES_TRANSPOSE R(transpose)
#define RULES_SQUEEZE R(squeeze)
#define RULES_EXPAND_DIMS R(expand_dims)
#define RULES_REV R(rev)
#define RULES_SLICE R(slice)
#define RULES_DYNAMIC_SLICE R(dynamic_slice)
#define RULES_DYNAMIC_UPDATE_SLICE R(dynamic_update_slice)
#define RULES_CONCATENATE R(concatenate)
#define RULES_PAD R(pad)
#define RULES_GATHER R(gather)
#define RULES_SCATTER R(scatter)
#define RULES_SORT R(sort)
#define RULES_ARGSORT R(argsort)
#define RULES_DOT_GENERAL .shape = la_shape_dot_general, .kernel = la_kernel_dot_general
/* The collectives' rules live with the collective engine (spmd/), which
 * registers them at start-up; the higher-order primitives' with the
 * transform layer that stages and runs their sub-plans. */
#define RULES_AXIS_INDEX
#define RULES_PSUM
#define RULES_PMAX
#define RULES_PMIN
#define RULES_ALL_GATHER
#define RULES_PSUM_SCATTER
#define RULES_PPERMUTE
#define RULES_ALL_TO_ALL
#define RULES_RAGGED_ALL_TO_ALL
#define RULES_PVARY
#define RULES_RANDOM_SPLIT
#define RULES_RANDOM_FOLD_IN
#define RULES_RANDOM_BITS
#define RULES_RANDOM_UNIFORM
#define RULES_ERF_INV
#define RULES_RANDOM_RANDINT
#define RULES_RANDOM_PERMUTATION
#define RULES_COND
#define RULES_WHILE
#define RULES_SCAN
#define RULES_PJIT
#define RULES_SHARD_MAP
#define RULES_DEBUG_CALLBACK
#define RULES_XMAP
#define RULES_PDOT

PrimInfo prim_table[P_COUNT] = {
#define PRIM(id, nm, ni, no, k, kn) \
  [P_##id] = {.name = #nm, .nin = ni, .nout = no, .kind = k, .rules = {RULES_##id}},
#include "array/prim.def"
#undef PRIM
};

/* Binary primitives' row loops by dtype (prim_binary_row). */
static KernRow2 binary_rows[P_COUNT][DT_COUNT];

/* What prim_binary_into needs of a primitive on one operand dtype, all
 * read from one entry on its hot path. */
typedef struct IntoRow {
  KernRow2 row;          /* NULL: not run in place (binary_agree refuses it,
                            it has a replication rule, or the dtype is not one
                            it accepts) */
  DType out;             /* the result's dtype: bool for a comparison */
  bool weak;             /* the result is weak when both operands are */
  uint8_t size;          /* bytes of an operand's element */
  uint8_t out_size;      /* ...and of the result's */
} IntoRow;
static IntoRow into_rows[P_COUNT][DT_COUNT];


static void resolve_binary_rows(PrimId id) {
  const PrimInfo *pi = &prim_table[id];
  bool plain = pi->kind == PK_BINARY && pi->nin == 2 && pi->rules.shape && !pi->rules.vma;
  for (int t = 0; t < DT_COUNT; t++) {
    binary_rows[id][t] = pi->kind == PK_BINARY && pi->rules.kernel
                             ? kern_binary_row(pi->rules.kernel, (DType)t)
                             : NULL;
    bool cmp = prim_is_compare(id);
    into_rows[id][t] = (IntoRow){
        .row = plain && (prim_accepts(id) & (1u << t)) ? binary_rows[id][t] : NULL,
        .out = cmp ? DT_BOOL : (DType)t,
        .weak = !cmp,
        .size = (uint8_t)dt_size((DType)t),
        .out_size = (uint8_t)dt_size(cmp ? DT_BOOL : (DType)t)};
  }
}

/* At load time, so the eager hot path reads a filled table: the kernels
 * are constants of prim_table and kern_binary_row reads only constant
 * tables. */
__attribute__((constructor)) static void resolve_all_rows(void) {
  for (int id = 0; id < P_COUNT; id++) resolve_binary_rows((PrimId)id);
}

void prim_register(PrimId id, const PrimRules *rules) {
  prim_table[id].rules = *rules;
  resolve_binary_rows(id);
}

KernRow2 prim_binary_row(PrimId id, DType t) { return binary_rows[id][t]; }

int prim_rule_missing(PrimId id, const char *what) {
  err_set(ERR_NOT_IMPLEMENTED, "%s of '%s' is not implemented", what, prim_table[id].name);
  return -1;
}

bool (*prim_tracing_hook)(void);

Value *prim_apply_rule(PrimId id, int nin, Value **in, Params *p) {
  Params none;
  params_init(&none);
  Params *q = p ? p : &none;
  Value *r = NULL;
  int i = 0;
  while (i < nin && in[i]) i++;
  if (i == nin) {
    for (int k = 0; k < nin; k++) val_incref(in[k]);
    r = prim_apply(id, nin, in, q);
    for (int k = 0; k < nin; k++) val_decref(in[k]);
  }
  params_clear(q);
  return r;
}

int (*prim_aval_hook)(Value *v, AVal *out);

bool (*prim_staged_hook)(const Value *v);

bool prim_value_is_staged(const Value *v) {
  return v && v->type == V_TRACER && prim_staged_hook && prim_staged_hook(v);
}

int prim_value_aval(Value *v, AVal *out) {
  if (IS_ARRAY(v)) {
    aval_of(AS_ARRAY(v), out);
    return 0;
  }
  if (v && v->type == V_TRACER && prim_aval_hook) return prim_aval_hook(v, out);
  err_set(ERR_TYPE, "expected an array, got '%s'", v ? val_type_name(v) : "NULL");
  return -1;
}

bool prim_tracing(void) { return prim_tracing_hook && prim_tracing_hook(); }

Value *prim_bind(PrimId id, int nin, Value **in, const Params *p) {
  if (p && p->nomem) return err_nomem();
  if (prim_tracing()) return prim_trace_hook(id, nin, in, p);
  return prim_apply(id, nin, in, p);
}

int prim_interrupted(void) {
  err_set(ERR_INTERRUPT, "interrupted");
  return -1;
}

int prim_run_kernel_timed(PrimId id, Array **in, int nin, const Params *p, Array **out) {
  int64_t t0 = tl_now();
  int rc = prim_table[id].rules.kernel(in, nin, p, out);
  if (prim_table[id].kind == PK_COLLECTIVE || prim_table[id].nout == 0) return rc;
  char av[64];
  const char *key[] = {"result"}, *val[] = {av};
  aval_str(av, sizeof av, out[0]->dtype, out[0]->ndim, out[0]->shape);
  tl_event("primitive", prim_table[id].name, t0, tl_now(), 1, key, val);
  return rc;
}


int prim_lookup(const char *name) {
  for (int i = 0; i < P_COUNT; i++)
    if (!strcmp(prim_table[i].name, name))
      return i;
  return -1;
}

/* ---- inference and apply -------------------------------------------------------------- */

static int prim_check_arity(PrimId id, int nin) {
  const PrimInfo *pi = &prim_table[id];
  if (pi->kind == PK_HIGHER) {
    err_set(ERR_TYPE, "primitive %s takes sub-plans and cannot be applied directly", pi->name);
    return -1;
  }
  if (!pi->rules.shape || !pi->rules.kernel)  /* its layer did not register */
    return prim_rule_missing(id, "evaluation");
  if (pi->nin >= 0 && nin != pi->nin) {
    err_set(ERR_TYPE, "%s takes %d operand%s, got %d", pi->name, pi->nin,
            pi->nin == 1 ? "" : "s", nin);
    return -1;
  }
  return 0;
}

/* The vma set of the outputs: the primitive's rule or the union. */
static uint32_t prim_vma(PrimId id, const AVal *in, int nin, const Params *p) {
  uint32_t v = 0, buf[16];
  if (prim_table[id].rules.vma && nin <= 16) {
    for (int i = 0; i < nin; i++)
      buf[i] = in[i].vma;
    return prim_table[id].rules.vma(buf, nin, p);
  }
  for (int i = 0; i < nin; i++)
    v |= in[i].vma;
  return v;
}

int prim_infer(PrimId id, const AVal *in, int nin, const Params *p, AVal *out) {
  if ((unsigned)id >= P_COUNT) {
    err_set(ERR_VALUE, "unknown primitive %d", (int)id);
    return -1;
  }
  if (prim_check_arity(id, nin) < 0 || prim_table[id].rules.shape(in, nin, p, out) < 0)
    return -1;
  uint32_t v = prim_vma(id, in, nin, p);
  for (int i = 0; i < prim_table[id].nout; i++)
    out[i].vma = v;
  return 0;
}

/* Operands and their avals, on the stack for the usual few. */
#define PRIM_STACK_OPS 4
typedef struct ApplyFrame {
  Array *ops_stack[PRIM_STACK_OPS];
  AVal avals_stack[PRIM_STACK_OPS];
  Array **ops;
  AVal *avals;
} ApplyFrame;

static int prim_frame_init(ApplyFrame *f, int nin) {
  f->ops = f->ops_stack;
  f->avals = f->avals_stack;
  if (nin <= PRIM_STACK_OPS)
    return 0;
  f->ops = shm_malloc(sizeof(Array *) * (size_t)nin);
  f->avals = shm_malloc(sizeof(AVal) * (size_t)nin);
  if (f->ops && f->avals)
    return 0;
  shm_free(f->ops);
  shm_free(f->avals);
  err_nomem();
  return -1;
}

static void prim_frame_free(ApplyFrame *f) {
  if (f->ops != f->ops_stack) {
    shm_free(f->ops);
    shm_free(f->avals);
  }
}

/* True when [a] belongs to one holder and may be overwritten as the
 * output of aval [o] (value.h: refcount 1 means changeable in place). */
static bool prim_reusable(Array *a, const AVal *o) {
  return arr_unshared(a) && a->contiguous && a->dtype == o->dtype && a->ndim == o->ndim &&
         prim_same_dims(o->ndim, a->shape, o->shape);
}

/* Allocates the outputs of [id] from [avals]: layout kernels make their
 * own, elementwise ones reuse a dying operand when they can. */
static int prim_alloc_outs(PrimId id, Array **ops, int nin, const AVal *avals, int nout,
                           Array **out) {
  PrimKind k = prim_table[id].kind;
  for (int i = 0; i < nout; i++)
    out[i] = NULL;
  if (k == PK_SHAPE)
    return 0;
  if ((k == PK_UNARY || k == PK_BINARY) && nout == 1) {
    /* clamp's kernel runs max then min, so only x may be overwritten */
    int first = id == P_CLAMP ? 1 : 0, last = id == P_CLAMP ? 2 : nin;
    for (int j = first; j < last; j++) {
      if (prim_reusable(ops[j], &avals[0])) {
        out[0] = (Array *)val_incref(&ops[j]->hdr);
        return 0;
      }
    }
  }
  for (int i = 0; i < nout; i++) {
    out[i] = arr_new(avals[i].dtype, avals[i].ndim, avals[i].shape);
    if (!out[i]) {
      for (int j = 0; j < i; j++)
        val_decref(&out[j]->hdr);
      return -1;
    }
  }
  return 0;
}

/* The result value: the one output, or a tuple of them (stolen). */
static Value *prim_result(Array **out, int nout) {
  if (nout == 1)
    return &out[0]->hdr;
  Value *t = tuple_new((size_t)nout);
  for (int i = 0; i < nout; i++) {
    if (t)
      tuple_set_steal(t, (size_t)i, &out[i]->hdr);
    else
      val_decref(&out[i]->hdr);
  }
  return t;
}

/* Checks operand types; 1 if a tracer is among them. */
static int prim_scan_operands(PrimId id, int nin, Value **in) {
  int tracer = 0;
  for (int i = 0; i < nin; i++) {
    if (in[i] && in[i]->type == V_TRACER) {
      tracer = 1;
      continue;
    }
    if (!IS_ARRAY(in[i])) {
      err_set(ERR_TYPE, "%s: operand %d is %s, expected an array", prim_table[id].name,
              i + 1, in[i] ? val_type_name(in[i]) : "missing");
      return -1;
    }
  }
  return tracer;
}

int (*prim_line_hook)(void);

/* Records why [out] varies: this primitive when it adds mesh axes none of
 * its operands varies over, else an operand's reason for the axes it
 * shares with [out]: a primitive's (axis_index, a collective) before an
 * argument's, whose axes in_specs and out_specs usually both name. */
static void vma_why(PrimId id, const ApplyFrame *f, int nin, Array *out) {
  uint32_t in = 0;
  for (int i = 0; i < nin; i++) in |= f->ops[i]->vma;
  if (out->vma & ~in) {
    out->why = (VmaWhy){prim_line_hook ? prim_line_hook() : 0, (int16_t)(id + 1), 0,
                        out->vma & ~in};
    return;
  }
  const VmaWhy *arg = NULL;
  for (int i = 0; i < nin; i++) {
    const VmaWhy *w = &f->ops[i]->why;
    if (!(w->axes & out->vma)) continue;
    if (w->prim) {
      out->why = *w;
      return;
    }
    if (w->arg && !arg) arg = w;
  }
  if (arg) out->why = *arg;
}

/* Runs the kernel and stamps the outputs' avals. */
static Value *prim_run(PrimId id, ApplyFrame *f, int nin, const Params *p, AVal *outv) {
  int nout = prim_table[id].nout;
  Array *out[8];
  if (nout > 8 || prim_alloc_outs(id, f->ops, nin, outv, nout, out) < 0) {
    if (nout > 8)
      err_set(ERR_VALUE, "%s: too many outputs", prim_table[id].name);
    return NULL;
  }
  if (prim_run_kernel(id, f->ops, nin, p, out) < 0) {
    for (int i = 0; i < nout; i++)
      if (out[i])
        val_decref(&out[i]->hdr);
    return NULL;
  }
  for (int i = 0; i < nout; i++) {
    out[i]->weak = outv[i].weak;
    out[i]->vma = outv[i].vma;
    if (outv[i].vma) vma_why(id, f, nin, out[i]);
  }
  return prim_result(out, nout);
}

/* Whether [x] and [y] already agree for binary primitive [id]: what
 * shape_binary would accept with no broadcasting, and no mesh axes for
 * the replication rule to see. */
static bool binary_agree(PrimId id, const Value *x, const Value *y) {
  if ((unsigned)id >= P_COUNT || !IS_ARRAY(x) || !IS_ARRAY(y)) return false;
  const PrimInfo *pi = &prim_table[id];
  if (pi->kind != PK_BINARY || pi->nin != 2 || !pi->rules.shape || !pi->rules.kernel ||
      pi->rules.vma)
    return false;
  const Array *a = (const Array *)x, *b = (const Array *)y;
  if (a->dtype != b->dtype || !(prim_accepts(id) & (1u << a->dtype)) || a->vma || b->vma)
    return false;
  return a->ndim == 0 || b->ndim == 0 ||
         (a->ndim == b->ndim && prim_same_dims(a->ndim, a->shape, b->shape));
}

/* The result array of binary [id] on agreeing [ops]: an unkept operand
 * that may be overwritten (prim_alloc_outs' rule), else a new one. */
static Array *binary_out(PrimId id, Array **ops, unsigned kept) {
  const Array *s = ops[1]->ndim > ops[0]->ndim ? ops[1] : ops[0];
  DType t = prim_is_compare(id) ? DT_BOOL : ops[0]->dtype;
  for (int j = 0; j < 2; j++) {
    Array *a = ops[j];
    if (!(kept & (1u << j)) && a->ndim == s->ndim && a->dtype == t && a->contiguous &&
        arr_unshared(a))
      return (Array *)val_incref(&a->hdr);
  }
  return arr_new_like(t, s);
}

/* Runs a small binary operation on contiguous operands (or broadcast
 * scalars) straight through its row loop: a tiny eager operation is
 * mostly dispatch.  False when the kernel must run it (a large or
 * strided operation, a timeline being written). */
static bool binary_row(PrimId id, Array **ops, Array *out) {
  KernRow2 row = binary_rows[id][ops[0]->dtype];
  int64_t sa, sb;
  if (!row || out->size >= KERN_PAR_MIN || !prim_row_stride(ops[0], out, &sa) ||
      !prim_row_stride(ops[1], out, &sb) || tl_tracing())
    return false;
  row(arr_data(ops[0]), sa, arr_data(ops[1]), sb, arr_data(out), out->size);
  return true;
}

/* prim_apply's way, the kept operands held so none becomes the result. */
static Value *binary_general(PrimId id, Value *x, Value *y, unsigned kept) {
  Value *in[2] = {x, y};
  Params p;
  params_init(&p);
  if (kept & 1u) val_incref(x);
  if (kept & 2u) val_incref(y);
  Value *r = prim_apply(id, 2, in, &p);
  if (kept & 1u) val_decref(x);
  if (kept & 2u) val_decref(y);
  return r;
}

Value *prim_apply_binary(PrimId id, Value *x, Value *y, unsigned kept) {
  if (!binary_agree(id, x, y)) return binary_general(id, x, y, kept);
  Array *ops[2] = {AS_ARRAY(x), AS_ARRAY(y)};
  Array *out = binary_out(id, ops, kept);
  if (!out) return NULL;
  Params p;
  params_init(&p);
  if (!binary_row(id, ops, out) && prim_run_kernel(id, ops, 2, &p, &out) < 0) {
    val_decref(&out->hdr);
    return NULL;
  }
  out->weak = !prim_is_compare(id) && ops[0]->weak && ops[1]->weak;
  out->vma = 0;
  return &out->hdr;
}

/* The stride at which a row loop reads operand [a] of a result shaped
 * as [o], into [*stride]: 0 when 0-d (a broadcast), a 1-d operand's own
 * stride (negative when reversed, 1 when contiguous), 1 for a contiguous
 * one of o's shape.  False for any other operand. */
static inline bool into_stride(const Array *a, const Array *o, int64_t *stride) {
  *stride = 0;
  if (a->ndim == 0) return true;
  if (a->ndim == 1) {
    *stride = a->contiguous ? 1 : a->strides[0];
    return o->ndim == 1 && a->shape[0] == o->shape[0];
  }
  *stride = 1;
  return a->contiguous && a->ndim == o->ndim && prim_same_dims(a->ndim, a->shape, o->shape);
}

/* Where [a]'s elements start, each of [size] bytes (arr_data without
 * its dtype switch). */
static inline char *into_data(const Array *a, size_t size) {
  return (char *)a->buf->data + (size_t)a->offset * size;
}

/* The checks run first and the row loop last: a refusal returns before
 * any register is saved, and nothing but the answer is live across the
 * call. */
bool prim_binary_into(PrimId id, Value *x, Value *y, Value *dst) {
  Array *a = AS_ARRAY(x), *b = AS_ARRAY(y), *o = AS_ARRAY(dst);
  const IntoRow *r = &into_rows[id][a->dtype];
  if (!r->row || b->dtype != a->dtype || (a->vma | b->vma) || o->dtype != r->out ||
      !o->contiguous || o->size >= KERN_PAR_MIN || !arr_unshared(o) || tl_tracing())
    return false;
  int64_t sa, sb;
  /* two 0-d operands make a 0-d result, whatever o's shape */
  if (!into_stride(a, o, &sa) || !into_stride(b, o, &sb) || ((a->ndim | b->ndim) == 0 && o->ndim))
    return false;
  o->weak = r->weak & a->weak & b->weak;   /* before the call: see above */
  o->vma = 0;
  o->why = (VmaWhy){0};
  r->row(into_data(a, r->size), sa, into_data(b, r->size), sb, into_data(o, r->out_size), o->size);
  return true;
}

Value *prim_apply(PrimId id, int nin, Value **in, const Params *p) {
  if (p && p->nomem) return err_nomem();
  if ((unsigned)id >= P_COUNT)
    return err_set(ERR_VALUE, "unknown primitive %d", (int)id);
  if (prim_check_arity(id, nin) < 0)
    return NULL;
  int tracer = prim_scan_operands(id, nin, in);
  if (tracer < 0)
    return NULL;
  if (tracer) {
    if (!prim_trace_hook)
      return err_set(ERR_TYPE, "%s: got an abstract value outside of tracing",
                     prim_table[id].name);
    return prim_trace_hook(id, nin, in, p);
  }
  ApplyFrame f;
  AVal outv[8];
  if (prim_frame_init(&f, nin) < 0)
    return NULL;
  for (int i = 0; i < nin; i++) {
    f.ops[i] = AS_ARRAY(in[i]);
    aval_of(f.ops[i], &f.avals[i]);
  }
  Value *r = NULL;
  if (prim_table[id].nout <= 8 && prim_infer(id, f.avals, nin, p, outv) == 0)
    r = prim_run(id, &f, nin, p, outv);
  prim_frame_free(&f);
  return r;
}
