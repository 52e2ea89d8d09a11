/*
 * prim_rules.h - what the array layer's family files share to write a
 * primitive's rules (private to src/array/: prim_elementwise.c,
 * prim_reduce.c, prim_layout.c, prim_index.c, prim_dot.c, prim_random.c).
 *
 * Shape rules check what jax.lax checks and word their errors the way
 * JAX does, naming the primitive and the offending shapes or dtypes; the
 * kernels then trust their inputs.  JVP, transpose and batching rules
 * build their results from prim_apply calls, so they compute on concrete
 * arrays and stage on tracers alike.  Temporaries live in a Scope
 * released when the rule returns: the rules read as the formulas they
 * implement (JAX's lax.py, slicing.py and their batching rules are the
 * reference), and a NULL from any step (an error) flows through the rest
 * to the rule's return.  A batching rule gets each operand with the
 * position of its batch axis (-1: the same for every example) and
 * computes every example at once, usually by moving the batch axis to the
 * front and shifting the primitive's axis parameters by one; a case it
 * does not cover returns BATCH_BY_LOOP and the interpreter
 * (transform/batch.c) applies the primitive example by example.
 *
 * The helpers are static inline: each family file keeps what it uses.
 */
#ifndef SHMAP_PRIM_RULES_H
#define SHMAP_PRIM_RULES_H

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "array/kernels.h"
#include "array/prim.h"
#include "base/mem.h"

/* The families' rows, registered at load by prim.c (prim_install). */
void prim_elementwise_register(void);
void prim_reduce_register(void);
void prim_layout_register(void);
void prim_index_register(void);
void prim_dot_register(void);
void prim_linalg_register(void);
void prim_random_register(void);

/* ==== dtypes and shapes ==================================================== */


/* ---- dtype classes -------------------------------------------------------------- */

/* Which dtypes a primitive accepts, as bit sets over DType. */
#define DC_BOOL (1u << DT_BOOL)
#define DC_INT (1u << DT_I8 | 1u << DT_I32 | 1u << DT_I64)
#define DC_FLOAT (1u << DT_BF16 | 1u << DT_F16 | 1u << DT_F32 | 1u << DT_F64)
#define DC_NUM (DC_INT | DC_FLOAT)
#define DC_ANY (DC_BOOL | DC_NUM)

static inline const char *prim_class_name(unsigned cls) {
  if (cls == DC_FLOAT)
    return "floating";
  if (cls == DC_NUM)
    return "number";
  return "integer or bool";
}

/* Checks that primitive [id] accepts [t]. */
static inline int prim_check_dtype(PrimId id, DType t) {
  unsigned cls = prim_table[id].rules.dtypes ? prim_table[id].rules.dtypes : DC_ANY;
  if (cls & (1u << t))
    return 0;
  err_set(ERR_TYPE, "%s does not accept dtype %s. Accepted dtypes are subtypes of %s.",
          prim_table[id].name, dt_name(t), prim_class_name(cls));
  return -1;
}

/* ---- helpers for the rules ---------------------------------------------------------- */

static inline void prim_set(AVal *out, DType t, bool weak, int ndim, const int64_t *shape) {
  out->dtype = t;
  out->weak = weak;
  out->ndim = ndim;
  for (int i = 0; i < ndim; i++)
    out->shape[i] = shape[i];
  out->vma = 0;
}

/* "(3, 4)" for error messages, in a caller's buffer. */
static inline const char *prim_shape(char *buf, const AVal *a) {
  shape_str(buf, 128, a->ndim, a->shape);
  return buf;
}

static inline const char *prim_ints(char *buf, int n, const int64_t *xs) {
  shape_str(buf, 128, n, xs);
  return buf;
}

static inline bool prim_same_dims(int n, const int64_t *a, const int64_t *b) {
  for (int i = 0; i < n; i++)
    if (a[i] != b[i])
      return false;
  return true;
}

static inline bool prim_same_shape(const AVal *a, const AVal *b) {
  return a->ndim == b->ndim && prim_same_dims(a->ndim, a->shape, b->shape);
}

/* Reads dims param [name] and checks each is a distinct axis of rank
 * [ndim]; negative dims are normalised.  [*mask] gets the set. */
static inline int prim_dims(PrimId id, const Params *p, const char *name, int ndim,
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

/* The common shape of operands that are all the same shape or rank 0. */
static inline int prim_common_shape(PrimId id, const AVal *in, int nin, const AVal **shape_of) {
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
static inline int prim_same_dtypes(PrimId id, const AVal *in, int first, int nin) {
  for (int i = first + 1; i < nin; i++) {
    if (in[i].dtype != in[first].dtype) {
      err_set(ERR_TYPE, "%s requires arguments to have the same dtypes, got %s, %s",
              prim_table[id].name, dt_name(in[first].dtype), dt_name(in[i].dtype));
      return -1;
    }
  }
  return 0;
}

static inline bool prim_all_weak(const AVal *in, int first, int nin) {
  bool w = true;
  for (int i = first; i < nin; i++)
    w = w && in[i].weak;
  return w;
}

/* ---- layout rules ------------------------------------------------------------------- */

/* Checks a shape parameter: ndim in range, dims non-negative. */
static inline int prim_check_shape(PrimId id, int n, const int64_t *shape) {
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

/* Checks [perm] is a permutation of 0..ndim-1. */
static inline int prim_check_perm(PrimId id, const char *what, int n, const int64_t *perm, int ndim) {
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

/* Checks that in[first..first+ndim) are 0-d integer start indices. */
static inline int prim_check_starts(PrimId id, const AVal *in, int nin, int first, int ndim) {
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

/* ==== a scope of temporaries and the builders ============================= */

/* ==== a scope of temporaries ============================================ */

enum { SCOPE_CAP = 96 };

typedef struct Scope {
  Value *v[SCOPE_CAP];
  int n;
} Scope;

/* Keeps [v] until scope_end; NULL stays NULL (the error is set). */
static inline Value *keep(Scope *s, Value *v) {
  if (!v) return NULL;
  if (s->n == SCOPE_CAP) {
    val_decref(v);
    return err_set(ERR_VALUE, "differentiation rule: too many temporaries");
  }
  return s->v[s->n++] = v;
}

static inline void scope_end(Scope *s) {
  for (int i = 0; i < s->n; i++) val_decref(s->v[i]);
  s->n = 0;
}

/* A new reference to the scope's result, then the scope released. */
static inline Value *scope_return(Scope *s, Value *r) {
  if (r) val_incref(r);
  scope_end(s);
  return r;
}

/* ==== building blocks (borrowed in, borrowed out, NULL in: NULL out) ===== */

/* id[*p](in...) kept in [s]: prim_apply_rule (operands held across the
 * call, since a rule's temporaries are still needed after it). */
static inline Value *ap(Scope *s, PrimId id, int n, Value **in, Params *p) {
  return keep(s, prim_apply_rule(id, n, in, p));
}

static inline Value *un(Scope *s, PrimId id, Value *x) { return ap(s, id, 1, &x, NULL); }
static inline Value *bin(Scope *s, PrimId id, Value *a, Value *b) {
  return ap(s, id, 2, (Value *[]){a, b}, NULL);
}
static inline Value *mul(Scope *s, Value *a, Value *b) { return bin(s, P_MUL, a, b); }
static inline Value *add(Scope *s, Value *a, Value *b) { return bin(s, P_ADD, a, b); }
static inline Value *sub(Scope *s, Value *a, Value *b) { return bin(s, P_SUB, a, b); }
static inline Value *dvd(Scope *s, Value *a, Value *b) { return bin(s, P_DIV, a, b); }
static inline Value *neg(Scope *s, Value *a) { return un(s, P_NEG, a); }

static inline bool aval_ok(Value *x, AVal *a) { return x && prim_value_aval(x, a) == 0; }

/* broadcast_in_dim of [x] to [shape] along [bdims]. */
static inline Value *bcast(Scope *s, Value *x, int nd, const int64_t *shape, int nb, const int64_t *bdims) {
  if (!x) return NULL;
  Params p;
  params_init(&p);
  params_add(&p, "shape", val_int_tuple(nd, shape));
  params_add(&p, "broadcast_dimensions", val_int_tuple(nb, bdims));
  return ap(s, P_BROADCAST_IN_DIM, 1, &x, &p);
}

/* A concrete array of aval [a] (dtype, shape) filled with [c]. */
static inline Value *full(Scope *s, double c, const AVal *a) {
  Value *x = keep(s, arr_value(arr_scalar_f64(a->dtype, c, false)));
  return a->ndim ? bcast(s, x, a->ndim, a->shape, 0, NULL) : x;
}

/* [c] in the aval of [x]. */
static inline Value *like(Scope *s, double c, Value *x) {
  AVal a;
  return aval_ok(x, &a) ? full(s, c, &a) : NULL;
}

static inline Value *zeros_of(Scope *s, const AVal *a) { return full(s, 0.0, a); }

/* [c] as a 0-d array of [x]'s dtype (not weak): the constant operand of
 * an element-wise binary operation on [x], which broadcasts it (JAX's
 * _const and _one), so no array of [x]'s shape is made or read. */
static inline Value *scal(Scope *s, double c, Value *x) {
  AVal a;
  return aval_ok(x, &a) ? keep(s, arr_value(arr_scalar_f64(a.dtype, c, false))) : NULL;
}

static inline Value *convert(Scope *s, Value *x, DType t, bool weak) {
  if (!x) return NULL;
  Params p;
  params_init(&p);
  params_add(&p, "new_dtype", dtype_value(t));
  params_add(&p, "weak_type", val_bool(weak));
  return ap(s, P_CONVERT_ELEMENT_TYPE, 1, &x, &p);
}

static inline Value *reshape(Scope *s, Value *x, int nd, const int64_t *shape) {
  AVal a;
  if (!aval_ok(x, &a)) return NULL;
  if (a.ndim == nd && !memcmp(a.shape, shape, sizeof(int64_t) * (size_t)nd)) return x;
  Params p;
  params_init(&p);
  params_add(&p, "new_sizes", val_int_tuple(nd, shape));
  params_add(&p, "dimensions", val_incref(VAL_NONE));
  return ap(s, P_RESHAPE, 1, &x, &p);
}

static inline Value *reduce_sum(Scope *s, Value *x, int n, const int64_t *axes) {
  if (!x) return NULL;
  if (n == 0) return x;
  Params p;
  params_init(&p);
  params_add(&p, "axes", val_int_tuple(n, axes));
  return ap(s, P_REDUCE_SUM, 1, &x, &p);
}

/* Every axis of [x] summed: a 0-d value. */
static inline Value *sum_all(Scope *s, Value *x) {
  AVal a;
  if (!aval_ok(x, &a)) return NULL;
  int64_t axes[SHM_MAXDIM];
  for (int i = 0; i < a.ndim; i++) axes[i] = i;
  return reduce_sum(s, x, a.ndim, axes);
}

/* [x] padded with zeros by (lo, hi, interior) per dimension ([nd] of
 * them). */
static inline Value *pad_zeros(Scope *s, Value *x, int nd, const int64_t *lo, const int64_t *hi,
                        const int64_t *it) {
  AVal a;
  if (!aval_ok(x, &a)) return NULL;
  Value *cfg = tuple_new((size_t)nd);
  if (!cfg) return NULL;
  for (int i = 0; i < nd; i++)
    tuple_set_steal(cfg, (size_t)i, val_int_tuple(3, (int64_t[]){lo[i], hi[i], it[i]}));
  Params q;
  params_init(&q);
  params_add(&q, "padding_config", cfg);
  AVal z = a;
  z.ndim = 0;
  return ap(s, P_PAD, 2, (Value *[]){x, zeros_of(s, &z)}, &q);
}

/* select(pred, on_true, on_false), as lax.select: select_n(pred, f, t). */
static inline Value *select(Scope *s, Value *pred, Value *t, Value *f) {
  return ap(s, P_SELECT_N, 3, (Value *[]){pred, f, t}, NULL);
}

/* [name] of [p] as ints. */
static inline int ints(const Params *p, const char *name, int *n, int64_t *out) {
  return params_ints(p, name, n, out, SHM_MAXDIM);
}

/* A copy of [p] with new references. */
static inline void params_dup(Params *dst, const Params *p) {
  params_init(dst);
  for (int i = 0; p && i < p->n; i++) params_add(dst, p->p[i].name, val_incref(p->p[i].value));
}

/* The same primitive with the same parameters on other operands. */
static inline Value *same(Scope *s, PrimId id, int n, Value **in, const Params *p) {
  Params q;
  params_dup(&q, p);
  return ap(s, id, n, in, &q);
}

/* ==== JVP and transpose helpers =========================================== */

/* ==== rule frames ======================================================== */

/* The primal result of [id] on [x], into [yo]; 0 or -1. */
static inline int primal(PrimId id, Value **x, int nin, const Params *p, Value **yo) {
  for (int i = 0; i < nin; i++) val_incref(x[i]);   /* the tangent rule reads them after */
  *yo = prim_apply(id, nin, x, p);
  for (int i = 0; i < nin; i++) val_decref(x[i]);
  return *yo ? 0 : -1;
}

/* Finishes a JVP rule: the tangent [t] (borrowed from [s], NULL: an
 * error unless [zero]) into [to]. */
static inline int jvp_done(Scope *s, Value *t, bool zero, Value **yo, Value **to) {
  *to = zero ? NULL : scope_return(s, t);
  if (zero) scope_end(s);
  if (zero || *to) return 0;
  val_decref(*yo);
  *yo = NULL;
  return -1;
}

/* Tangent [t] or, where it is a symbolic zero, zeros like [x]. */
static inline Value *tan_or_zero(Scope *s, Value *t, Value *x) { return t ? t : like(s, 0.0, x); }

/* ==== element-wise ======================================================= */

/* The zero derivative: integer, boolean and piecewise-constant results. */
static inline int jvp_zero(PrimId id, Value **x, Value **t, int nin, const Params *p, Value **yo,
                    Value **to) {
  (void)t;
  *to = NULL;
  return primal(id, x, nin, p, yo);
}
#define ZERO_JVP(name, ID)                                                                 \
  static int jvp_##name(Value **x, Value **t, int nin, const Params *p, Value **yo,         \
                        Value **to) {                                                      \
    return jvp_zero(P_##ID, x, t, nin, p, yo, to);                                          \
  }

/* ==== reductions ========================================================= */

/* The primitive applied to the tangent, same parameters: every primitive
 * linear in its one operand (reduce_sum, cumsum, the layout ones). */
static inline int jvp_linear1(PrimId id, Value **x, Value **t, const Params *p, Value **yo,
                       Value **to) {
  if (primal(id, x, 1, p, yo) < 0) return -1;
  *to = NULL;
  if (!t[0]) return 0;
  Scope s = {0};
  return jvp_done(&s, same(&s, id, 1, t, p), false, yo, to);
}
#define LINEAR1_JVP(name, ID)                                                              \
  static int jvp_##name(Value **x, Value **t, int nin, const Params *p, Value **yo,         \
                        Value **to) {                                                      \
    (void)nin;                                                                             \
    return jvp_linear1(P_##ID, x, t, p, yo, to);                                           \
  }

/* ==== layout and indexing ================================================ */

/* Operands and tangents of a primitive linear in all its operands but
 * the integer [first_index]..: the same primitive on the tangents, zeros
 * for the symbolic ones. */
static inline int jvp_multilinear(PrimId id, int nlin, Value **x, Value **t, int nin, const Params *p,
                           Value **yo, Value **to) {
  if (primal(id, x, nin, p, yo) < 0) return -1;
  *to = NULL;
  bool any = false;
  for (int i = 0; i < nlin; i++) any |= t[i] != NULL;
  if (!any) return 0;
  /* any number of operands (a concatenate stacks every iteration of an
   * eager scan); the symbolic zeros of operands of one aval share one
   * array, so the scope holds two values per distinct aval */
  Scope s = {0};
  Value *few[64], **in = nin <= 64 ? few : shm_malloc(sizeof(Value *) * (size_t)nin), *zero = NULL;
  if (!in) return jvp_done(&s, err_nomem(), false, yo, to);
  AVal za = {0};
  bool ok = true;
  for (int i = 0; ok && i < nin; i++) {
    if (i >= nlin || t[i]) {
      in[i] = i < nlin ? t[i] : x[i];
      continue;
    }
    AVal a;
    if (!(ok = aval_ok(x[i], &a))) break;
    if (!zero || a.dtype != za.dtype || a.ndim != za.ndim ||
        memcmp(a.shape, za.shape, sizeof(int64_t) * (size_t)a.ndim)) {
      zero = full(&s, 0.0, &a);
      aval_copy(&za, &a);
    }
    ok = (in[i] = zero) != NULL;
  }
  Value *r = ok ? same(&s, id, nin, in, p) : NULL;
  if (in != few) shm_free(in);
  return jvp_done(&s, r, false, yo, to);
}

/* ==== transpose rules ==================================================== */

/* The cotangent [ct] of an operand of aval [a] that an element-wise
 * primitive broadcast: a 0-d operand (a scalar literal) meets arrays of
 * any shape, so its cotangent is the sum. */
static inline Value *fit(Scope *s, Value *ct, const AVal *a) {
  AVal c;
  if (!aval_ok(ct, &c)) return NULL;
  return a->ndim == 0 && c.ndim > 0 ? sum_all(s, ct) : ct;
}

/* One result from a scope into cts[i]. */
static inline int ct_set(Scope *s, Value **cts, int i, Value *v) {
  cts[i] = scope_return(s, v);
  return cts[i] ? 0 : -1;
}

/* ==== batching helpers ===================================================== */

/* ---- building blocks (borrowed in, new references out) ------------------ */

/* id[*p](in...): prim_apply_rule. */
static inline Value *app(PrimId id, int n, Value **in, Params *p) { return prim_apply_rule(id, n, in, p); }

static inline int rank_of(Value *x) {
  AVal a;
  return prim_value_aval(x, &a) == 0 ? a.ndim : -1;
}

/* [x] with its axis [from] moved to [to]. */
static inline Value *moveaxis(Value *x, int from, int to) {
  AVal a;
  if (prim_value_aval(x, &a) < 0) return NULL;
  if (from == to) return val_incref(x);
  int64_t perm[SHM_MAXDIM];
  int k = 0;
  for (int i = 0; i < a.ndim; i++) {
    if (k == to) perm[k++] = from;
    if (i != from) perm[k++] = i;
  }
  if (k == to) perm[k++] = from;
  Params p;
  params_init(&p);
  params_add(&p, "permutation", val_int_tuple(a.ndim, perm));
  return app(P_TRANSPOSE, 1, &x, &p);
}

/* An unbatched [x] repeated [b] times along a new leading axis, its own
 * axes after it (or, with [shape], broadcast to (b,) + shape from its
 * axes [dims]). */
static inline Value *repeat_front(Value *x, int64_t b) {
  AVal a;
  if (prim_value_aval(x, &a) < 0) return NULL;
  int64_t shape[SHM_MAXDIM], dims[SHM_MAXDIM];
  shape[0] = b;
  for (int i = 0; i < a.ndim; i++) shape[i + 1] = a.shape[i], dims[i] = i + 1;
  Params p;
  params_init(&p);
  params_add(&p, "shape", val_int_tuple(a.ndim + 1, shape));
  params_add(&p, "broadcast_dimensions", val_int_tuple(a.ndim, dims));
  return app(P_BROADCAST_IN_DIM, 1, &x, &p);
}

/* Operand [i] with its batch axis first, or repeated along one. */
static inline Value *front(Value **in, const int *dims, int i, int64_t b) {
  return dims[i] >= 0 ? moveaxis(in[i], dims[i], 0) : repeat_front(in[i], b);
}

/* A copy of [p] without [skip1], [skip2] (NULL: none). */
static inline void params_but(Params *dst, const Params *p, const char *skip1, const char *skip2) {
  params_init(dst);
  for (int i = 0; p && i < p->n; i++) {
    const char *n = p->p[i].name;
    if ((skip1 && !strcmp(n, skip1)) || (skip2 && !strcmp(n, skip2))) continue;
    params_add(dst, n, val_incref(p->p[i].value));
  }
}

/* Parameter [name] (ints) with [lead] put first and every entry plus
 * [shift]: axes after a batch axis put at the front. */
static inline Value *ints_shifted(const Params *p, const char *name, int64_t shift, int nlead,
                           int64_t lead) {
  int n;
  int64_t xs[SHM_MAXDIM + 1];
  if (params_ints(p, name, &n, xs + nlead, SHM_MAXDIM) < 0) return NULL;
  for (int i = nlead; i < n + nlead; i++) xs[i] += shift;
  if (nlead) xs[0] = lead;
  return val_int_tuple(n + nlead, xs);
}

/* The primitive on [x] (batch axis first) with [name] remapped. */
static inline int on_front(PrimId id, Value *x, const Params *p, const char *name, int nlead,
                    int64_t lead, int64_t shift, Value **out, int *od) {
  Params q;
  params_but(&q, p, name, NULL);
  Value *v = ints_shifted(p, name, shift, nlead, lead);
  if (!v) {
    params_clear(&q);
    val_decref(x);
    return -1;
  }
  params_add(&q, name, v);
  *out = app(id, 1, &x, &q);
  val_decref(x);
  *od = 0;
  return *out ? 0 : -1;
}

/* ---- reductions and axis-parameter primitives ------------------------------ */

static inline int batch_axes(PrimId id, const char *name, Value **in, const int *dims, const Params *p,
                      Value **out, int *od) {
  Value *x = moveaxis(in[0], dims[0], 0);
  return x ? on_front(id, x, p, name, 0, 0, 1, out, od) : -1;
}

/* An int parameter plus one, the batch axis first. */
static inline int batch_axis1(PrimId id, const char *name, Value **in, const int *dims, const Params *p,
                       Value **out, int *od) {
  int64_t ax;
  if (params_int(p, name, &ax) < 0) return -1;
  int r = rank_of(in[0]);
  if (ax < 0) ax += r - 1;
  Value *x = moveaxis(in[0], dims[0], 0);
  if (!x) return -1;
  Params q;
  params_but(&q, p, name, NULL);
  params_add(&q, name, val_int(ax + 1));
  *out = app(id, 1, &x, &q);
  val_decref(x);
  *od = 0;
  return *out ? 0 : -1;
}

#define AXES_RULE(fn, ID, NAME)                                                             \
  static int fn(Value **in, const int *dims, int nin, const Params *p, Value **out, int *od) { \
    (void)nin;                                                                              \
    return batch_axes(P_##ID, NAME, in, dims, p, out, od);                                  \
  }

#define AXIS1_RULE(fn, ID, NAME)                                                            \
  static int fn(Value **in, const int *dims, int nin, const Params *p, Value **out, int *od) { \
    (void)nin;                                                                              \
    return batch_axis1(P_##ID, NAME, in, dims, p, out, od);                                 \
  }

/* ---- element-wise -------------------------------------------------------- */

static inline int batch_elementwise(PrimId id, Value **in, const int *dims, int nin, const Params *p,
                             Value **out, int *od) {
  int64_t b = prim_batch_size(in, dims, nin);
  int d = -1, rank = -1, ex = 0;   /* the examples' rank: the largest */
  bool same = true;
  for (int i = 0; i < nin; i++) {
    int r = rank_of(in[i]);
    if (r < 0) return -1;
    int er = r - (dims[i] >= 0);
    if (er > ex) ex = er;
    if (dims[i] >= 0) {
      same &= (d < 0 || d == dims[i]) && (rank < 0 || rank == r);
      d = dims[i], rank = r;
    } else {
      same &= r == 0;
    }
  }
  bool scalars_ok = id != P_SELECT_N && id != P_CLAMP;
  if (same && (scalars_ok || nin == 1) && rank == ex + 1) {
    Params q;
    params_but(&q, p, NULL, NULL);
    *out = app(id, nin, in, &q);
    *od = d;
    return *out ? 0 : -1;
  }
  /* the batch axis first everywhere; per-example scalars broadcast */
  AVal big;
  int bigi = -1;
  for (int i = 0; i < nin; i++)
    if (rank_of(in[i]) - (dims[i] >= 0) == ex) bigi = i;
  if (prim_value_aval(in[bigi], &big) < 0) return -1;
  int64_t shape[SHM_MAXDIM];
  shape[0] = b;
  for (int k = 0, j = 0; k < big.ndim; k++)
    if (k != dims[bigi]) shape[1 + j++] = big.shape[k];
  Value *ops[16];
  if (nin > 16) return BATCH_BY_LOOP;
  int made = 0, rc = -1;
  for (; made < nin; made++) {
    int r = rank_of(in[made]);
    Value *x;
    if (dims[made] < 0 && r == 0 && scalars_ok) {
      x = val_incref(in[made]);
    } else if (r - (dims[made] >= 0) == ex) {
      x = front(in, dims, made, b);
    } else {   /* a per-example scalar among arrays */
      Value *f = dims[made] >= 0 ? val_incref(in[made]) : NULL;
      Params q;
      params_init(&q);
      params_add(&q, "shape", val_int_tuple(ex + 1, shape));
      params_add(&q, "broadcast_dimensions", dims[made] >= 0 ? val_int_tuple(1, (int64_t[]){0})
                                                              : val_int_tuple(0, NULL));
      x = app(P_BROADCAST_IN_DIM, 1, f ? &f : &in[made], &q);
      if (f) val_decref(f);
    }
    if (!(ops[made] = x)) goto out;
  }
  Params q;
  params_but(&q, p, NULL, NULL);
  *out = app(id, nin, ops, &q);
  *od = 0;
  rc = *out ? 0 : -1;
out:
  for (int i = 0; i < made; i++) val_decref(ops[i]);
  return rc;
}


/* ==== sharding rules (prim.h, Sharding) =================================== */

/* [s] laid out as nothing over [like]'s mesh: rank [ndim], no split. */
static inline void sh_replicated(Sharding *s, int ndim, const Sharding *like) {
  s->ndim = ndim;
  s->naxes = like->naxes;
  s->explicit_axes = like->explicit_axes;
  s->axis_names = like->axis_names;
  for (int i = 0; i < like->naxes; i++) s->axis_sizes[i] = like->axis_sizes[i];
  for (int d = 0; d < ndim; d++) s->nsplit[d] = 0;
  s->partial = 0;
  s->partial_coll = NULL;
}

/* Copies the split of dimension [sd] of [src] to dimension [dd] of [dst]. */
static inline void sh_copy_dim(Sharding *dst, int dd, const Sharding *src, int sd) {
  dst->nsplit[dd] = src->nsplit[sd];
  for (int k = 0; k < src->nsplit[sd]; k++) dst->split[dd][k] = src->split[sd][k];
}

/* The mesh axes (bits) splitting any dimension of [s]. */
static inline uint32_t sh_used(const Sharding *s) {
  uint32_t u = 0;
  for (int d = 0; d < s->ndim; d++)
    for (int k = 0; k < s->nsplit[d]; k++) u |= 1u << s->split[d][k];
  return u;
}

/* The mesh axes (bits) splitting dimension [d] of [s]. */
static inline uint32_t sh_dim_axes(const Sharding *s, int d) {
  uint32_t u = 0;
  for (int k = 0; k < s->nsplit[d]; k++) u |= 1u << s->split[d][k];
  return u;
}

/* How many blocks dimension [d] of [s] is split into. */
static inline int64_t sh_dim_blocks(const Sharding *s, int d) {
  int64_t n = 1;
  for (int k = 0; k < s->nsplit[d]; k++) n *= s->axis_sizes[s->split[d][k]];
  return n;
}

/* ---- Explicit mode's errors (prim_rules.c; shmap(7), THE THREE MODES) ---- */

/* Whether a split over mesh axes [axes] (bits) of a value laid out as [s]
 * is part of its type: some of those axes are Explicit. */
static inline bool sh_typed(const Sharding *s, uint32_t axes) {
  return (axes & s->explicit_axes) != 0;
}

/* Whether dimension [d] of [a] and dimension [e] of [b] are split by the
 * same mesh axes in the same order (both unsplit included). */
static inline bool sh_same_dim(const Sharding *a, int d, const Sharding *b, int e) {
  if (a->nsplit[d] != b->nsplit[e]) return false;
  for (int k = 0; k < a->nsplit[d]; k++)
    if (a->split[d][k] != b->split[e][k]) return false;
  return true;
}

/* Sets JAX's ShardingTypeError (ERR_TYPE, message "ShardingTypeError:
 * <op> <text>", <op> the primitive whose rule runs: prim_sharding_op)
 * and returns -1. */
int sh_type_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* As sh_type_error, the text whole (JAX's message names no primitive). */
int sh_type_error_text(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* [s]'s type: its splits over Explicit axes only (JAX's spec in an
 * aval's sharding), nothing partial. */
void sh_type_of(const Sharding *s, Sharding *type);

/* Whether [a] and [b] have the same type (sh_type_of). */
bool sh_same_type(const Sharding *a, const Sharding *b);

/* A rule's result typed [type] (JAX's rule): 0 when [out_sh], the
 * layout the blocks compute, has that type; else [out_sh] becomes the
 * type and 1 (prim.h, ShardingRule: computed whole, then sliced). */
int sh_retype(Sharding *out_sh, const Sharding *type);

/* Explicit mode's type of a result of aval [out] whose sizes differ from
 * its operand's [in] laid out as [s] (JAX's
 * _get_sharding_for_varying_out_shape, for slice, pad, dynamic_slice):
 * replicated when every size is 1, else the operand's type, where a
 * dimension whose size changes must stay a multiple of the blocks its
 * Explicit axes split it into, or JAX's ShardingTypeError ("[name] on
 * sharded dims where out dim (1) is not divisible by mesh axes (2) ...").
 * [type] gets the type; 0, or -1. */
int sh_varying_out(const AVal *in, const Sharding *s, const AVal *out, const char *name,
                   Sharding *type);

/* Explicit mode: operands [from, nin) must have one type (JAX's
 * concatenate and dynamic_update_slice rules), else ShardingTypeError
 * "<op> [what]. Got <their types>; reshard ...".  0, or -1. */
int sh_check_same_types(const AVal *in, const Sharding *in_sh, int from, int nin, const char *what);

/* Writes dimensions [dims] ([n] of them; NULL: dimensions 0..n-1) of
 * [s] into [buf] ([cap] bytes) as JAX prints a spec's entries in its
 * errors, a Python tuple: "('X', None)", "(('X', 'Y'),)". */
void sh_spec_tuple(const Sharding *s, int n, const int64_t *dims, char *buf, size_t cap);

/* Writes [s]'s type (sh_type_of) into [buf] ([cap] bytes) as shmap
 * prints a NamedSharding: "NamedSharding(mesh=Mesh('X': 2, 'Y': 4),
 * spec=P('X', None))" (JAX's str of an aval's sharding in its errors). */
void sh_named_str(const Sharding *s, char *buf, size_t cap);

/* Writes [a] laid out as [s] as jax.typeof prints it, the Explicit axes
 * after each dimension's size: "f32[8@X,4]". */
void sh_type_str(const AVal *a, const Sharding *s, char *buf, size_t cap);

/* Writes [a] laid out as [s] as JAX's errors print an aval: its str
 * "float32[8@X,4]" (sh_aval_str, JAX's f"{aval}"), its repr
 * "ShapedArray(float32[8@X,4])" (sh_aval_repr, JAX's f"{aval=}"). */
void sh_aval_str(const AVal *a, const Sharding *s, char *buf, size_t cap);
void sh_aval_repr(const AVal *a, const Sharding *s, char *buf, size_t cap);

/* Explicit mode's check of a result whose [n] dimensions would be split
 * as [res]: an Explicit mesh axis may split one dimension only (JAX's
 * DuplicateSpecError; raised as its ShardingTypeError naming the [nin]
 * operands' types, avals [in] laid out as [in_sh]).  0, or -1. */
int sh_check_unique(const AVal *in, const Sharding *in_sh, int nin, const Sharding *res, int n);

/* Explicit mode's broadcasting rule (JAX's): operands of rank [nd] that
 * split a dimension of size > 1 over Explicit axes must split it alike
 * (an unsplit one takes the other's split); else JAX's ShardingTypeError
 * naming every operand's spec and telling to reshard.  0, or -1. */
int sh_check_broadcast(const AVal *in, const Sharding *in_sh, int nin, int nd);

/* Element-wise (and select_n, clamp): the result is laid out as the
 * operands of its rank; where they disagree on a dimension the first
 * operand that splits it wins (GSPMD's heuristic, shmap(7)) unless its
 * mesh axes already split another dimension, and every operand is
 * resharded to the result's layout.  Rank-0 operands broadcast and stay
 * replicated. */
static inline int prim_sharding_elementwise(const AVal *in, Sharding *in_sh, int nin,
                                            const Params *p, Sharding *out_sh) {
  (void)p;
  int nd = 0;
  for (int i = 0; i < nin; i++) nd = in[i].ndim > nd ? in[i].ndim : nd;
  if (in_sh[0].explicit_axes && sh_check_broadcast(in, in_sh, nin, nd) < 0) return -1;
  sh_replicated(out_sh, nd, &in_sh[0]);
  uint32_t used = 0;
  for (int d = 0; d < nd; d++)
    for (int i = 0; i < nin; i++) {
      if (in[i].ndim != nd || !in_sh[i].nsplit[d] || (sh_dim_axes(&in_sh[i], d) & used)) continue;
      sh_copy_dim(out_sh, d, &in_sh[i], d);
      used |= sh_dim_axes(&in_sh[i], d);
      break;
    }
  for (int i = 0; i < nin; i++)
    if (in[i].ndim == nd) {
      for (int d = 0; d < nd; d++) sh_copy_dim(&in_sh[i], d, out_sh, d);
      in_sh[i].partial = 0;
    }
  return 0;
}


/* Dimension [d] of every operand of rank [nd] unsplit: the dimensions a
 * primitive moves data along (slice, pad, rev, concatenate, a cumulative
 * reduction), which GSPMD reshards rather than compute across blocks. */
static inline void sh_unsplit(Sharding *in_sh, const AVal *in, int nin, int nd, int d) {
  for (int i = 0; i < nin; i++)
    if (in[i].ndim == nd && d < nd) in_sh[i].nsplit[d] = 0;
}

/* Operand 0's layout with [in]'s dimensions [mask] (bits) unsplit first,
 * then the element-wise rule over the operands: what a primitive that
 * keeps its operands' shape but moves data along [mask] does. */
static inline int sh_keep_but(const AVal *in, Sharding *in_sh, int nin, uint64_t mask,
                              Sharding *out_sh) {
  for (int d = 0; d < in[0].ndim; d++)
    if (mask >> d & 1) sh_unsplit(in_sh, in, nin, in[0].ndim, d);
  return prim_sharding_elementwise(in, in_sh, nin, NULL, out_sh);
}

/* sh_keep_but of the one dimension the int param [name] names
 * (concatenate's "dimension", a cumulative reduction's "axis"). */
static inline int sh_keep_but_param(const AVal *in, Sharding *in_sh, int nin, const Params *p,
                                    const char *name, Sharding *out_sh) {
  int64_t dim;
  if (params_int(p, name, &dim) < 0) return -1;
  int d = dim < 0 ? (int)dim + in[0].ndim : (int)dim;
  return sh_keep_but(in, in_sh, nin, (uint64_t)1 << d, out_sh);
}

/* Explicit mode's type of primitive [id]'s result whose sizes differ
 * from operand 0's, laid out as [was] before the rule ran (JAX's
 * _get_sharding_for_varying_out_shape, [name] "slicing", "padding",
 * "dynamic_slice"): sh_retype of [out_sh] to it, or -1. */
static inline int sh_explicit_varying(PrimId id, const AVal *in, int nin, const Sharding *was,
                                      const Params *p, const char *name, Sharding *out_sh) {
  AVal out;
  Sharding type;
  if (!was->explicit_axes) return 0;
  if (prim_table[id].rules.shape(in, nin, p, &out) < 0 ||
      sh_varying_out(&in[0], was, &out, name, &type) < 0)
    return -1;
  return sh_retype(out_sh, &type);
}

/* A reduction over the dimensions [mask] of operand 0: the result drops
 * them.  With [coll] ("psum", "pmax", "pmin") a split reduced dimension
 * leaves a partial result over its mesh axes; without, it is unsplit
 * first (an all_gather: a product, a logical or an arg-reduction). */
static inline int sh_reduce(const AVal *in, Sharding *in_sh, uint64_t mask, const char *coll,
                            Sharding *out_sh) {
  int nd = in[0].ndim, o = 0;
  uint32_t partial = 0;
  for (int d = 0; d < nd; d++)
    if (mask >> d & 1) {
      if (coll) partial |= sh_dim_axes(&in_sh[0], d);
      else in_sh[0].nsplit[d] = 0;
    }
  sh_replicated(out_sh, 0, &in_sh[0]);
  for (int d = 0; d < nd; d++)
    if (!(mask >> d & 1)) sh_copy_dim(out_sh, o++, &in_sh[0], d);
  out_sh->ndim = o;
  out_sh->partial = partial;
  out_sh->partial_coll = partial ? coll : NULL;
  return 0;
}

/* ---- installing -------------------------------------------------------------------- */

#define ELEMENTWISE(fn, ID)                                                                 \
  __attribute__((unused)) static int fn(Value **in, const int *dims, int nin, const Params *p, Value **out, int *od) { \
    return batch_elementwise(P_##ID, in, dims, nin, p, out, od);                            \
  }

#endif
