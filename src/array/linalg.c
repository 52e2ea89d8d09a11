/*
 * linalg.c - dot_general over BLIS (semantics: jax.lax.dot_general).
 *
 * Each operand is seen as a stack of matrices: lhs as [batch..., M, K],
 * rhs as [batch..., K, N], where M is the product of the lhs free dims, N
 * of the rhs free dims and K of the contracting dims.  The output, being
 * [batch..., lhs free..., rhs free...] in row-major order, is exactly a
 * stack of row-major M x N matrices, so BLIS writes it directly.
 */
#define _GNU_SOURCE   /* sched_getaffinity */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* blis.h trips the project's warnings (-Wundef, unused static helpers);
 * they are BLIS's, not ours. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#pragma GCC diagnostic ignored "-Wunused-function"
#pragma GCC diagnostic ignored "-Wtype-limits"
#include <blis.h>
#pragma GCC diagnostic pop

#include "array/array.h"
#include "base/error.h"
#include "array/kernels.h"
#include "array/linalg.h"
#include "base/mem.h"

/* ---- reading the parameters ------------------------------------------------ */

/* The four dimension lists of dimension_numbers. */
typedef struct DimNums {
  int nc, nb;                   /* contracting and batch counts */
  int lc[SHM_MAXDIM], rc[SHM_MAXDIM];
  int lb[SHM_MAXDIM], rb[SHM_MAXDIM];
  int nlc, nrc, nlb, nrb;       /* as given, before the count checks */
} DimNums;

static bool is_tuple(const Value *v) { return v && v->type == V_TUPLE; }

/* Reads a tuple of ints into [out]; -1 with the error set. */
static int read_dims(Value *t, int *out, int *n) {
  if (!is_tuple(t) || tuple_len(t) > SHM_MAXDIM) {
    err_set(ERR_TYPE, "dot_general dimension_numbers must be "
                      "((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch)) "
                      "with tuples of ints");
    return -1;
  }
  *n = (int)tuple_len(t);
  for (int i = 0; i < *n; i++) {
    int64_t d;
    if (arr_to_index(tuple_get(t, i), &d) < 0)
      return -1;
    out[i] = d < -1000 || d > 1000 ? 1000 : (int)d;   /* range checked later */
  }
  return 0;
}

/* Reads the pair [t] = (lhs_dims, rhs_dims). */
static int read_pair(Value *t, int *l, int *nl, int *r, int *nr) {
  if (!is_tuple(t) || tuple_len(t) != 2) {
    err_set(ERR_TYPE, "dot_general dimension_numbers must be "
                      "((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))");
    return -1;
  }
  if (read_dims(tuple_get(t, 0), l, nl) < 0)
    return -1;
  return read_dims(tuple_get(t, 1), r, nr);
}

/* [dn] from the ints val_dot_dimension_numbers' cache keeps for [v]. */
static bool known_dimnums(const Value *v, DimNums *dn) {
  int64_t d[4][SHM_MAXDIM];
  if (!prim_dot_dims_known(v, &dn->nc, &dn->nb, d)) return false;
  dn->nlc = dn->nrc = dn->nc;
  dn->nlb = dn->nrb = dn->nb;
  int *out[4] = {dn->lc, dn->rc, dn->lb, dn->rb};
  for (int k = 0; k < 4; k++)
    for (int i = 0; i < (k < 2 ? dn->nc : dn->nb); i++) out[k][i] = (int)d[k][i];
  return true;
}

static int read_dimnums(const Params *p, DimNums *dn) {
  Value *v = params_get(p, "dimension_numbers");
  if (known_dimnums(v, dn)) return 0;
  if (!is_tuple(v) || tuple_len(v) != 2) {
    err_set(ERR_TYPE, "dot_general requires dimension_numbers "
                      "((lhs_contracting, rhs_contracting), (lhs_batch, rhs_batch))");
    return -1;
  }
  if (read_pair(tuple_get(v, 0), dn->lc, &dn->nlc, dn->rc, &dn->nrc) < 0 ||
      read_pair(tuple_get(v, 1), dn->lb, &dn->nlb, dn->rb, &dn->nrb) < 0)
    return -1;
  dn->nc = dn->nlc;
  dn->nb = dn->nlb;
  return 0;
}

/* preferred_element_type: [*has] false when absent or None. */
static int read_preferred(const Params *p, bool *has, DType *t) {
  Value *v = params_get(p, "preferred_element_type");
  *has = false;
  if (!v || v == VAL_NONE)
    return 0;
  if (v->type != V_DTYPE) {
    err_set(ERR_TYPE, "dot_general preferred_element_type must be a dtype, got %s",
            val_type_name(v));
    return -1;
  }
  *has = true;
  *t = ((DTypeVal *)v)->dtype;
  return 0;
}

/* ---- the shape rule ----------------------------------------------------------- */

/* "(1, 2)" for a list of ints. */
static void ints_str(char *buf, size_t cap, const int *xs, int n) {
  int64_t tmp[SHM_MAXDIM] = {0};
  for (int i = 0; i < n; i++)
    tmp[i] = xs[i];
  shape_str(buf, cap, n, tmp);
}

/* The sizes of [dims] of [shape], written "(3, 4)". */
static void sizes_str(char *buf, size_t cap, const int64_t *shape, const int *dims,
                      int n) {
  int64_t tmp[SHM_MAXDIM] = {0};
  for (int i = 0; i < n; i++)
    tmp[i] = shape[dims[i]];
  shape_str(buf, cap, n, tmp);
}

static bool dims_in_range(const int *d, int n, int ndim) {
  for (int i = 0; i < n; i++)
    if (d[i] < 0 || d[i] >= ndim)
      return false;
  return true;
}

static bool dims_distinct(const int *d, int n) {
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++)
      if (d[i] == d[j])
        return false;
  return true;
}

static bool dims_disjoint(const int *a, int na, const int *b, int nb) {
  for (int i = 0; i < na; i++)
    for (int j = 0; j < nb; j++)
      if (a[i] == b[j])
        return false;
  return true;
}

/* JAX's checks on one side ("lhs" or "rhs") of the dimension numbers. */
static int check_side(const char *side, const int *c, int nc, const int *b,
                      int nb, int ndim) {
  bool range = dims_in_range(c, nc, ndim) && dims_in_range(b, nb, ndim);
  if (range && dims_distinct(b, nb) && dims_distinct(c, nc) && dims_disjoint(c, nc, b, nb))
    return 0;   /* the messages below are formatted only when needed */
  char cs[200], bs[200];
  ints_str(cs, sizeof cs, c, nc);
  ints_str(bs, sizeof bs, b, nb);
  if (!range) {
    err_set(ERR_TYPE, "dot_general requires %s dimension numbers to be nonnegative "
            "and less than the number of axes of the %s value, got %s_batch of %s "
            "and %s_contracting of %s for %s of rank %d",
            side, side, side, bs, side, cs, side, ndim);
    return -1;
  }
  if (!dims_distinct(b, nb)) {
    err_set(ERR_TYPE, "dot_general requires %s batch dimensions to be distinct, "
            "got %s_batch %s", side, side, bs);
    return -1;
  }
  if (!dims_distinct(c, nc)) {
    err_set(ERR_TYPE, "dot_general requires %s contracting dimensions to be "
            "distinct, got %s_contracting %s", side, side, cs);
    return -1;
  }
  if (!dims_disjoint(c, nc, b, nb)) {
    err_set(ERR_TYPE, "dot_general requires %s batch dimensions to be disjoint "
            "from contracting dimensions, got %s_batch %s and %s_contracting %s",
            side, side, bs, side, cs);
    return -1;
  }
  return 0;
}

static bool sizes_equal(const int64_t *ls, const int *ld, const int64_t *rs,
                        const int *rd, int n) {
  for (int i = 0; i < n; i++)
    if (ls[ld[i]] != rs[rd[i]])
      return false;
  return true;
}

/* The counts and sizes must agree between the two sides. */
static int check_pairs(const DimNums *dn, const AVal *l, const AVal *r) {
  char a[200], b[200];
  if (dn->nlb != dn->nrb) {
    ints_str(a, sizeof a, dn->lb, dn->nlb);
    ints_str(b, sizeof b, dn->rb, dn->nrb);
    err_set(ERR_TYPE, "dot_general requires equal numbers of lhs_batch and "
            "rhs_batch dimensions, got lhs_batch %s and rhs_batch %s", a, b);
    return -1;
  }
  if (dn->nlc != dn->nrc) {
    ints_str(a, sizeof a, dn->lc, dn->nlc);
    ints_str(b, sizeof b, dn->rc, dn->nrc);
    err_set(ERR_TYPE, "dot_general requires equal numbers of lhs_contracting and "
            "rhs_contracting dimensions, got lhs_contracting %s and "
            "rhs_contracting %s", a, b);
    return -1;
  }
  if (!sizes_equal(l->shape, dn->lb, r->shape, dn->rb, dn->nb)) {
    sizes_str(a, sizeof a, l->shape, dn->lb, dn->nb);
    sizes_str(b, sizeof b, r->shape, dn->rb, dn->nb);
    err_set(ERR_VALUE, "dot_general requires lhs batch dimensions and rhs batch "
            "dimensions to have the same shape, got %s and %s", a, b);
    return -1;
  }
  if (!sizes_equal(l->shape, dn->lc, r->shape, dn->rc, dn->nc)) {
    sizes_str(a, sizeof a, l->shape, dn->lc, dn->nc);
    sizes_str(b, sizeof b, r->shape, dn->rc, dn->nc);
    err_set(ERR_VALUE, "dot_general requires contracting dimensions to have the "
            "same shape, got %s and %s", a, b);
    return -1;
  }
  return 0;
}

/* The free dims of an operand of rank [ndim]: neither batch nor contracting. */
static int free_dims(int ndim, const int *c, int nc, const int *b, int nb,
                     int *out) {
  int n = 0;
  for (int d = 0; d < ndim; d++)
    if (dims_disjoint(&d, 1, c, nc) && dims_disjoint(&d, 1, b, nb))
      out[n++] = d;
  return n;
}

/* Parses and checks everything; fills [dn] and the output aval [out]. */
static int dot_rule(const AVal *l, const AVal *r, const Params *p, DimNums *dn,
                    AVal *out) {
  bool has_pref;
  DType pref = DT_F32;
  if (read_dimnums(p, dn) < 0 || read_preferred(p, &has_pref, &pref) < 0)
    return -1;
  if (check_side("lhs", dn->lc, dn->nlc, dn->lb, dn->nlb, l->ndim) < 0 ||
      check_side("rhs", dn->rc, dn->nrc, dn->rb, dn->nrb, r->ndim) < 0 ||
      check_pairs(dn, l, r) < 0)
    return -1;
  int lf[SHM_MAXDIM], rf[SHM_MAXDIM];
  int nlf = free_dims(l->ndim, dn->lc, dn->nc, dn->lb, dn->nb, lf);
  int nrf = free_dims(r->ndim, dn->rc, dn->nc, dn->rb, dn->nb, rf);
  if (dn->nb + nlf + nrf > SHM_MAXDIM) {
    err_set(ERR_VALUE, "dot_general result would have %d dimensions, more than %d",
            dn->nb + nlf + nrf, SHM_MAXDIM);
    return -1;
  }
  memset(out, 0, sizeof *out);
  out->ndim = 0;
  for (int i = 0; i < dn->nb; i++)
    out->shape[out->ndim++] = l->shape[dn->lb[i]];
  for (int i = 0; i < nlf; i++)
    out->shape[out->ndim++] = l->shape[lf[i]];
  for (int i = 0; i < nrf; i++)
    out->shape[out->ndim++] = r->shape[rf[i]];
  bool weak = false;
  out->dtype = has_pref ? pref : dt_promote(l->dtype, l->weak, r->dtype, r->weak, &weak);
  out->weak = has_pref ? false : weak;
  out->vma = l->vma | r->vma;
  return 0;
}

int la_shape_dot_general(const AVal *in, int nin, const Params *p, AVal *out) {
  DimNums dn;
  if (nin != 2) {
    err_set(ERR_TYPE, "dot_general takes 2 operands, got %d", nin);
    return -1;
  }
  return dot_rule(&in[0], &in[1], p, &dn, out);
}

/* ---- reading an operand through a transpose ------------------------------------- */

/* A dims list mapped through [perm] into int64s (range already checked). */
static void dims_through(const int *d, int n, const int64_t *perm, int64_t *out) {
  for (int i = 0; i < n; i++)
    out[i] = perm[d[i]];
}

int la_dot_through_transpose(const Params *p, int operand, int ndim, const int64_t *perm,
                             Params *out) {
  DimNums dn;
  if (read_dimnums(p, &dn) < 0) {
    err_clear();   /* malformed: the product's own kernel reports it */
    return 0;
  }
  int *c = operand ? dn.rc : dn.lc, *b = operand ? dn.rb : dn.lb;
  if (dn.nlc != dn.nrc || dn.nlb != dn.nrb || !dims_in_range(c, dn.nc, ndim) ||
      !dims_in_range(b, dn.nb, ndim))
    return 0;
  int f[SHM_MAXDIM];
  int nf = free_dims(ndim, c, dn.nc, b, dn.nb, f);
  for (int i = 1; i < nf; i++)
    if (perm[f[i]] < perm[f[i - 1]])
      return 0;   /* the free dims would come out in another order */
  int64_t lc[SHM_MAXDIM], rc[SHM_MAXDIM], lb[SHM_MAXDIM], rb[SHM_MAXDIM];
  int64_t ident[SHM_MAXDIM];   /* the other operand's dims stay */
  for (int i = 0; i < SHM_MAXDIM; i++)
    ident[i] = i;
  dims_through(dn.lc, dn.nc, operand ? ident : perm, lc);
  dims_through(dn.rc, dn.nc, operand ? perm : ident, rc);
  dims_through(dn.lb, dn.nb, operand ? ident : perm, lb);
  dims_through(dn.rb, dn.nb, operand ? perm : ident, rb);
  Value *d = val_dot_dimension_numbers(dn.nc, lc, rc, dn.nb, lb, rb);
  if (!d)
    return err_nomem(), -1;
  params_init(out);
  for (int i = 0; i < p->n; i++)
    if (strcmp(p->p[i].name, "dimension_numbers") != 0)
      params_add(out, p->p[i].name, val_incref(p->p[i].value));
  params_add(out, "dimension_numbers", d);
  return 1;
}

/* ---- operands as stacks of matrices ----------------------------------------------- */

/* One operand seen as [batch..., rows, cols]: its data in the compute
 * dtype, the strides (in elements) of the batch dims, of a row and of a
 * column.  [owned] is a packed copy to free, of [owned_bytes]. */
typedef struct MatView {
  char *data;
  int64_t bstride[SHM_MAXDIM];
  int64_t rs, cs;
  int64_t rows, cols;
  void *owned;
  size_t owned_bytes;
} MatView;

/* The stride that steps through [dims] of [a] (in that order) as one
 * flattened index, if there is one; dims of size 1 are skipped.  1 for an
 * empty group.  False when the group does not collapse or a stride is not
 * positive (BLIS rejects those). */
static bool group_stride(const Array *a, const int *dims, int n, int64_t *out) {
  int64_t stride = 0, expect = 0;
  for (int i = n - 1; i >= 0; i--) {
    int64_t size = a->shape[dims[i]], st = a->strides[dims[i]];
    if (size == 1)
      continue;
    if (st <= 0 || (stride != 0 && st != expect))
      return false;
    if (stride == 0)
      stride = st;
    expect = st * size;
  }
  *out = stride ? stride : 1;
  return true;
}

static int64_t dims_product(const Array *a, const int *dims, int n) {
  int64_t p = 1;
  for (int i = 0; i < n; i++)
    p *= a->shape[dims[i]];
  return p;
}

/* BLIS accepts row- or column-stored matrices; a dim of size 1 may take
 * any stride, so give it the one that makes the matrix one of those. */
static bool blis_layout_ok(MatView *m) {
  if (m->rows <= 1)
    m->rs = m->cs == 1 ? (m->cols > 1 ? m->cols : 1) : 1;
  if (m->cols <= 1)
    m->cs = m->rs == 1 ? (m->rows > 1 ? m->rows : 1) : 1;
  return (m->cs == 1 && m->rs >= m->cols) || (m->rs == 1 && m->cs >= m->rows);
}

/* Tries to describe [a] in place as rows [rd] x cols [cd] with batch [bd]. */
static bool view_in_place(Array *a, const int *bd, int nb, const int *rd, int nr,
                          const int *cd, int nc, MatView *m) {
  if (!group_stride(a, rd, nr, &m->rs) || !group_stride(a, cd, nc, &m->cs))
    return false;
  m->rows = dims_product(a, rd, nr);
  m->cols = dims_product(a, cd, nc);
  if (!blis_layout_ok(m))
    return false;
  for (int i = 0; i < nb; i++)
    m->bstride[i] = a->strides[bd[i]];
  m->data = arr_data(a);
  m->owned = NULL;
  return true;
}

/* Copies [a] into a new contiguous [batch, rows, cols] buffer of dtype
 * [ct] and describes it in [m]. */
static int view_packed(Array *a, DType ct, const int *bd, int nb, const int *rd,
                       int nr, const int *cd, int nc, MatView *m) {
  int perm[SHM_MAXDIM], n = 0;
  int64_t shape[SHM_MAXDIM], strides[SHM_MAXDIM];
  for (int i = 0; i < nb; i++) perm[n++] = bd[i];
  for (int i = 0; i < nr; i++) perm[n++] = rd[i];
  for (int i = 0; i < nc; i++) perm[n++] = cd[i];
  for (int i = 0; i < n; i++) {
    shape[i] = a->shape[perm[i]];
    strides[i] = a->strides[perm[i]];
  }
  Array *v = arr_view(a, n, shape, strides, a->offset);
  if (!v)
    return -1;
  Array *c = arr_astype(v, ct, false);   /* a contiguous copy in ct */
  val_decref(&v->hdr);
  if (!c)
    return -1;
  m->rows = dims_product(a, rd, nr);
  m->cols = dims_product(a, cd, nc);
  m->rs = m->cols;
  m->cs = 1;
  blis_layout_ok(m);
  int64_t st = m->rows * m->cols;
  for (int i = nb - 1; i >= 0; i--) {
    m->bstride[i] = st;
    st *= shape[i];
  }
  m->data = arr_data(c);
  m->owned = c;
  return 0;
}

static int make_view(Array *a, DType ct, bool direct_ok, const int *bd, int nb,
                     const int *rd, int nr, const int *cd, int nc, MatView *m) {
  memset(m, 0, sizeof *m);
  if (direct_ok && a->dtype == ct && view_in_place(a, bd, nb, rd, nr, cd, nc, m))
    return 0;
  return view_packed(a, ct, bd, nb, rd, nr, cd, nc, m);
}

static void view_release(MatView *m) {
  if (m->owned)
    val_decref((Value *)m->owned);
  m->owned = NULL;
}

/* ---- the products --------------------------------------------------------------- */

/* The compute dtype: f64 if anything is f64, f32 for other floats, else
 * int64. */
static DType compute_dtype(DType l, DType r, DType o) {
  if (l == DT_F64 || r == DT_F64 || o == DT_F64)
    return DT_F64;
  if (dt_is_float(l) || dt_is_float(r) || dt_is_float(o))
    return DT_F32;
  return DT_I64;
}

/* Depth of the float products' packed panels (BLIS's KC).  BLIS 0.9's
 * Zen and Haswell configurations use 256, so a 2048^3 product reads and
 * writes its 16 MiB result eight times, from memory when the last-level
 * cache a virtual machine gets is smaller; at 512 it does so four times
 * and a block of A (MC x KC, 288 KiB) still fits the second-level cache.
 * Against NumPy's OpenBLAS on a 2-core Zen 3, interleaved call by call,
 * a 2048 product went from 0.91-0.98x to 0.99-1.03x (medians of three
 * runs), 1024 from 0.96x to 0.98-1.0x.  The microkernel and the other
 * block sizes stay BLIS's own. */
#define LA_SGEMM_KC 512

static cntx_t la_sgemm_cntx;
static pthread_once_t la_sgemm_once = PTHREAD_ONCE_INIT;

/* A copy of the context BLIS chose for this CPU (so after la_init's
 * BLIS_ARCH_TYPE), with the deeper float panels. */
static void la_sgemm_cntx_init(void) {
  la_sgemm_cntx = *bli_gks_query_cntx();
  blksz_t *kc = bli_cntx_get_blksz(BLIS_KC, &la_sgemm_cntx);
  if (bli_blksz_get_def(BLIS_FLOAT, kc) < LA_SGEMM_KC) {
    bli_blksz_set_def(LA_SGEMM_KC, BLIS_FLOAT, kc);
    bli_blksz_set_max(LA_SGEMM_KC, BLIS_FLOAT, kc);
  }
}

/* ---- threads ------------------------------------------------------------------ */

/* The cores this process may run on (its affinity mask, la_init), the
 * processes of this node sharing them (under mpirun) and the devices
 * running a shard_map body now (0: only the host thread runs). */
static int la_cores = 1;
static _Atomic int la_node_procs = 1;
static _Atomic int la_busy = 0;

/* Multiply-adds below which a product stays on one core: waking the
 * helper costs some microseconds, a 2^21 product about forty. */
#define LA_THREAD_WORK ((double)(1 << 21))

void la_set_busy_devices(int n) { atomic_store(&la_busy, n > 0 ? n : 0); }

void la_set_node_processes(int n) { atomic_store(&la_node_procs, n > 1 ? n : 1); }

/* Whether an m x n x k product may take a second core: one is idle when
 * the running devices and this node's processes leave it one. */
static bool la_spare_core(int64_t m, int64_t n, int64_t k) {
  int users = atomic_load(&la_busy), procs = atomic_load(&la_node_procs);
  return la_cores >= 2 * (users > 0 ? users : 1) * procs && (double)m * n * k >= LA_THREAD_WORK;
}

/* Vector products go to BLIS's level-1 and level-2 operations: sgemm
 * with n = 1 spends most of its time packing panels a gemv never builds
 * (NumPy's BLAS calls gemv there too).  One output element is a dotv; one
 * output column (n = 1) is A x; one output row (m = 1) is B^T x, a gemv
 * over B read transposed through its strides.  [acc] adds into C as the
 * gemm's beta 1 would. */
#define LA_GEMV(name, T, ch)                                                           \
  static bool name(const MatView *l, const MatView *r, T *c, int64_t ldc, int64_t m,      \
                   int64_t n, int64_t k, int64_t lo, int64_t ro, bool acc) {               \
    T one = 1, beta = acc ? 1 : 0, *a = (T *)l->data + lo, *b = (T *)r->data + ro;       \
    if (m == 1 && n == 1) {                                                              \
      T rho;                                                                             \
      bli_##ch##dotv(BLIS_NO_CONJUGATE, BLIS_NO_CONJUGATE, k, a, l->cs, b, r->rs, &rho); \
      c[0] = acc ? c[0] + rho : rho;                                                     \
    } else if (n == 1) {                                                                 \
      bli_##ch##gemv(BLIS_NO_TRANSPOSE, BLIS_NO_CONJUGATE, m, k, &one, a, l->rs, l->cs,  \
                     b, r->rs, &beta, c, ldc);                                           \
    } else if (m == 1) {                                                                 \
      bli_##ch##gemv(BLIS_TRANSPOSE, BLIS_NO_CONJUGATE, k, n, &one, b, r->rs, r->cs, a,  \
                     l->cs, &beta, c, 1);                                                \
    } else {                                                                             \
      return false;                                                                      \
    }                                                                                    \
    return true;                                                                         \
  }
LA_GEMV(gemv_f32, float, s)
LA_GEMV(gemv_f64, double, d)

/* C = A B, or C += A B when [acc] (BLIS's beta 0 or 1), for the m x k
 * block of A at element [lo] and the k x n block of B at [ro]. */
static void gemm_f32(const MatView *l, const MatView *r, float *c, int64_t ldc, int64_t m,
                     int64_t n, int64_t k, int64_t lo, int64_t ro, bool acc) {
  float one = 1.0f, beta = acc ? 1.0f : 0.0f;
  if (gemv_f32(l, r, c, ldc, m, n, k, lo, ro, acc))
    return;
  pthread_once(&la_sgemm_once, la_sgemm_cntx_init);
  bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &one,
               (float *)l->data + lo, l->rs, l->cs, (float *)r->data + ro, r->rs, r->cs,
               &beta, c, ldc, 1, &la_sgemm_cntx, NULL);
}

static void gemm_f64(const MatView *l, const MatView *r, double *c, int64_t ldc, int64_t m,
                     int64_t n, int64_t k, int64_t lo, int64_t ro, bool acc) {
  double one = 1.0, beta = acc ? 1.0 : 0.0;
  if (gemv_f64(l, r, c, ldc, m, n, k, lo, ro, acc))
    return;
  bli_dgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &one,
            (double *)l->data + lo, l->rs, l->cs, (double *)r->data + ro, r->rs,
            r->cs, &beta, c, ldc, 1);
}

/* Multiply-adds in one BLIS call of a float product: about 2^30, tens of
 * milliseconds, so Ctrl-C is seen within them. */
#define LA_PANEL_WORK ((int64_t)1 << 30)
/* Rows of C in one panel, at least: each row panel packs B again (k n
 * elements, at memory speed, against the panel's rows k n multiply-adds),
 * which at 512 rows stays near a percent. */
#define LA_PANEL_MIN_ROWS 512

/* How a float product is cut into BLIS calls: [np] equal panels of rows
 * of C, each cut along k into panels of [kp] (the last one takes the
 * rest).  BLIS itself walks k in blocks of its KC, adding each block's
 * product to C, so cuts at multiples of KC add the same products in the
 * same order: the result is the one call's, bit for bit.  That holds
 * only on BLIS's large-matrix path with a fixed KC (its largest block
 * equal to its default); otherwise, and for a product of one call's
 * work, the plan is one call. */
typedef struct {
  int64_t np, kp;
} PanelPlan;

static PanelPlan panel_plan(DType ct, int64_t m, int64_t n, int64_t k) {
  PanelPlan pl = {1, k};
  num_t dt = ct == DT_F32 ? BLIS_FLOAT : BLIS_DOUBLE;
  pthread_once(&la_sgemm_once, la_sgemm_cntx_init);
  cntx_t *cx = ct == DT_F32 ? &la_sgemm_cntx : bli_gks_query_cntx();
  dim_t kc = bli_cntx_get_blksz_def_dt(dt, BLIS_KC, cx);
  if ((double)m * n * k <= LA_PANEL_WORK || kc != bli_cntx_get_blksz_max_dt(dt, BLIS_KC, cx) ||
      bli_cntx_l3_sup_thresh_is_met(dt, m, n, k, cx))
    return pl;
  int64_t rows = LA_PANEL_WORK / (n * k);
  rows = rows < LA_PANEL_MIN_ROWS ? LA_PANEL_MIN_ROWS : rows;
  pl.np = m / rows > 1 ? m / rows : 1;
  int64_t mp = m / pl.np, kt = bli_cntx_get_l3_sup_thresh_dt(dt, BLIS_KT, cx);
  int64_t kp = LA_PANEL_WORK / (mp * n) / kc * kc;
  kp = kp < kc ? kc : kp;
  kp = kp < kt ? (kt + kc - 1) / kc * kc : kp;
  pl.kp = kp < k ? kp : k;
  if (bli_cntx_l3_sup_thresh_is_met(dt, mp, n, pl.kp, cx))   /* a panel would take the small path */
    pl = (PanelPlan){1, k};
  return pl;
}

/* The smallest piece of C's rows or columns given to a core: each piece
 * packs the other operand again (k elements per row or column against
 * LA_PIECE_MIN k multiply-adds per element of it). */
#define LA_PIECE_MIN 256

/* A float product cut into pieces that run on any core in any order:
 * panel_plan's row panels, or, for a product of one panel with a core to
 * spare, [np] blocks of C's rows or ([cols]) columns.  Each element of C
 * is still summed by one BLIS call over the same k panels, and a piece
 * is cut only when it stays on BLIS's large-matrix path (as the whole
 * does), whose sums do not depend on where C is cut: the bits are those
 * of the uncut product. */
typedef struct {
  const MatView *l, *r;
  DType ct;
  char *c;
  int64_t m, n, k, lo, ro;
  PanelPlan pl;
  bool cols;
  int64_t step;   /* gemm_cut's pieces: this many rows or columns each (the
                     last takes the rest); 0: panel_plan's equal panels */
} GemmJob;

/* The cut of a product of one row panel: up to 8 pieces of at least
 * LA_PIECE_MIN along the longer of m and n when a core is spare, cut at
 * multiples of 64.  Vector products stay whole: gemv's fused kernels
 * group rows from the first, so a cut could regroup them. */
static void gemm_cut(GemmJob *j) {
  num_t dt = j->ct == DT_F32 ? BLIS_FLOAT : BLIS_DOUBLE;
  cntx_t *cx = j->ct == DT_F32 ? &la_sgemm_cntx : bli_gks_query_cntx();
  if (j->pl.np > 1 || j->m == 1 || j->n == 1 || !la_spare_core(j->m, j->n, j->k) ||
      bli_cntx_l3_sup_thresh_is_met(dt, j->m, j->n, j->k, cx))
    return;
  j->cols = j->n > j->m;
  int64_t len = j->cols ? j->n : j->m, np = len / LA_PIECE_MIN;
  np = np > 8 ? 8 : np;
  if (np < 2)
    return;
  int64_t step = (len / np + 63) / 64 * 64;
  np = (len + step - 1) / step;
  int64_t last = len - (np - 1) * step;
  if (np < 2 || bli_cntx_l3_sup_thresh_is_met(dt, j->cols ? j->m : last,
                                                 j->cols ? last : j->n, j->k, cx))
    return;
  j->pl.np = np;
  j->step = step;
}

/* Pieces [lo, hi) of a GemmJob (a RangeFn of kern_parallel): each its
 * BLIS calls along k, looking at Ctrl-C before each (a 6000-square
 * product is seconds in one call; prim_run_kernel fails an interrupted
 * one). */
static void gemm_pieces(const void *ctx, int64_t lo, int64_t hi) {
  const GemmJob *j = ctx;
  int64_t nk = j->k / j->pl.kp, np = j->pl.np;
  size_t csz = dt_size(j->ct);
  for (int64_t p = lo; p < hi; p++)
    for (int64_t q = 0; q < nk && !shm_interrupt_pending(); q++) {
      int64_t len = j->cols ? j->n : j->m;
      int64_t a0 = j->step ? p * j->step : p * len / np;
      int64_t ap = (j->step ? (p + 1 < np ? (p + 1) * j->step : len) : (p + 1) * len / np) - a0;
      int64_t k0 = q * j->pl.kp, kq = q == nk - 1 ? j->k - k0 : j->pl.kp;
      int64_t mp = j->cols ? j->m : ap, npc = j->cols ? ap : j->n;
      char *cp = j->c + (size_t)(j->cols ? a0 : a0 * j->n) * csz;
      int64_t la = j->lo + (j->cols ? 0 : a0 * j->l->rs) + k0 * j->l->cs;
      int64_t rb = j->ro + (j->cols ? a0 * j->r->cs : 0) + k0 * j->r->rs;
      if (j->ct == DT_F32)
        gemm_f32(j->l, j->r, (float *)cp, j->n, mp, npc, kq, la, rb, q > 0);
      else
        gemm_f64(j->l, j->r, (double *)cp, j->n, mp, npc, kq, la, rb, q > 0);
    }
}

/* C = A B for float [ct]: panel_plan's BLIS calls, and the pieces on a
 * spare core when there is one. */
static void gemm_panels(const MatView *l, const MatView *r, DType ct, char *c,
                        int64_t m, int64_t n, int64_t k, int64_t lo, int64_t ro) {
  GemmJob j = {l, r, ct, c, m, n, k, lo, ro, panel_plan(ct, m, n, k), false, 0};
  gemm_cut(&j);
  if (j.pl.np > 1 && la_spare_core(m, n, k))
    kern_parallel(gemm_pieces, &j, j.pl.np, 2, 1);
  else
    gemm_pieces(&j, 0, j.pl.np);
}

/* C = A B in int64, i-k-j order so the inner loop runs along rows of B
 * and C.  Looks at Ctrl-C between rows (no BLIS here: a 2048-square
 * product is seconds of work); prim_run_kernel fails an interrupted one. */
static void gemm_i64(const MatView *l, const MatView *r, int64_t *c, int64_t m,
                     int64_t n, int64_t k, int64_t lo, int64_t ro) {
  const int64_t *a = (const int64_t *)l->data + lo;
  const int64_t *b = (const int64_t *)r->data + ro;
  memset(c, 0, (size_t)(m * n) * sizeof *c);
  for (int64_t i = 0; i < m && !shm_interrupt_pending(); i++)
    for (int64_t p = 0; p < k; p++) {
      uint64_t x = (uint64_t)a[i * l->rs + p * l->cs];
      const int64_t *brow = b + p * r->rs;
      int64_t *crow = c + i * n;
      for (int64_t j = 0; j < n; j++)   /* unsigned: wraps, no UB */
        crow[j] = (int64_t)((uint64_t)crow[j] + x * (uint64_t)brow[j * r->cs]);
    }
}

/* C = A B for k = 1 (nothing contracted, one outer product), by a plain
 * loop: a BLIS call costs more than a small product, and batched outer
 * products (per-example gradients under vmap) are many small ones.  Each
 * element is 0 + a b, the sum BLIS starts from zero (so a product of -0
 * is +0, as BLAS gives): the same bits as the BLIS call. */
#define LA_OUTER(name, T, kern)                                                         \
  static void name(const MatView *l, const MatView *r, T *c, int64_t m, int64_t n,     \
                   int64_t lo, int64_t ro) {                                            \
    const T *a = (const T *)l->data + lo, *b = (const T *)r->data + ro;                \
    if (r->cs == 1 || n == 1) {   /* rows of B contiguous: the vectorised loop */     \
      kern(a, l->rs, b, 0, c, m, n);                                                    \
      return;                                                                           \
    }                                                                                   \
    for (int64_t i = 0; i < m; i++) {                                                   \
      T x = a[i * l->rs];                                                               \
      for (int64_t j = 0; j < n; j++)                                                   \
        c[i * n + j] = (T)0 + x * b[j * r->cs];                                         \
    }                                                                                   \
  }
LA_OUTER(outer_f32, float, kern_outer_f32)
LA_OUTER(outer_f64, double, kern_outer_f64)

/* The products of a batched contraction: operands, result, shapes. */
typedef struct {
  const MatView *l, *r;
  DType ct;
  char *c;
  const int64_t *bshape;
  int nb;
  int64_t m, n, k;
} BatchJob;

/* Batch elements [lo, hi) of a BatchJob (a RangeFn of kern_parallel):
 * one product each, looking at Ctrl-C between them. */
static void run_batch_range(const void *ctx, int64_t lo, int64_t hi) {
  const BatchJob *j = ctx;
  size_t csz = dt_size(j->ct);
  int64_t m = j->m, n = j->n, k = j->k;
  for (int64_t b = lo; b < hi && !shm_interrupt_pending(); b++) {
    int64_t loff = 0, roff = 0, rest = b;
    for (int i = j->nb - 1; i >= 0; i--) {
      int64_t at = rest % j->bshape[i];
      rest /= j->bshape[i];
      loff += at * j->l->bstride[i];
      roff += at * j->r->bstride[i];
    }
    char *cb = j->c + (size_t)(b * m * n) * csz;
    if (k == 0)
      memset(cb, 0, (size_t)(m * n) * csz);
    else if (k == 1 && j->ct == DT_F32)
      outer_f32(j->l, j->r, (float *)cb, m, n, loff, roff);
    else if (k == 1 && j->ct == DT_F64)
      outer_f64(j->l, j->r, (double *)cb, m, n, loff, roff);
    else if (j->ct != DT_I64)
      gemm_panels(j->l, j->r, j->ct, cb, m, n, k, loff, roff);
    else
      gemm_i64(j->l, j->r, (int64_t *)cb, m, n, k, loff, roff);
  }
}

/* Whether batch element b of both operands starts at b [*ls] and b [*rs]
 * (the batch dims, size-1 ones aside, collapse to one stride each). */
static bool batch_flat(const MatView *l, const MatView *r, const int64_t *bshape, int nb,
                       int64_t *ls, int64_t *rs) {
  int64_t lst = 0, rst = 0, span = 0;   /* span: batch elements the inner dims cover */
  for (int i = nb - 1; i >= 0; i--) {
    if (bshape[i] == 1)
      continue;
    if (span && (l->bstride[i] != lst * span || r->bstride[i] != rst * span))
      return false;
    if (!span) {
      lst = l->bstride[i];
      rst = r->bstride[i];
      span = 1;
    }
    span *= bshape[i];
  }
  *ls = lst;
  *rs = rst;
  return true;
}

/* A batch of k = 1 products of one row each (vmap of an outer product
 * with a vector, a per-example gradient): batch elements [lo, hi) by one
 * outer-product loop, row b of C from element b of each operand. */
typedef struct {
  const MatView *l, *r;
  DType ct;
  char *c;
  int64_t n, ls, rs;
} RowsJob;

static void run_rows_range(const void *ctx, int64_t lo, int64_t hi) {
  const RowsJob *j = ctx;
  if (j->ct == DT_F32)
    kern_outer_f32((const float *)j->l->data + lo * j->ls, j->ls,
                   (const float *)j->r->data + lo * j->rs, j->rs,
                   (float *)j->c + lo * j->n, hi - lo, j->n);
  else
    kern_outer_f64((const double *)j->l->data + lo * j->ls, j->ls,
                   (const double *)j->r->data + lo * j->rs, j->rs,
                   (double *)j->c + lo * j->n, hi - lo, j->n);
}

/* Runs one product per batch element into [c] (contiguous, dtype ct):
 * one loop over all of them, shared with the spare core when there is
 * one and the batch's work is large (each product is whole on one
 * thread, so the bits do not depend on it). */
static void run_batches(const MatView *l, const MatView *r, DType ct, char *c,
                        const int64_t *bshape, int nb, int64_t m, int64_t n,
                        int64_t k) {
  int64_t nbatch = 1;
  for (int i = 0; i < nb; i++)
    nbatch *= bshape[i];
  RowsJob rj = {l, r, ct, c, n, 0, 0};
  if (m == 1 && k == 1 && nbatch > 1 && ct != DT_I64 && (r->cs == 1 || n == 1) &&
      batch_flat(l, r, bshape, nb, &rj.ls, &rj.rs)) {
    if (la_spare_core(nbatch, n, 1))
      kern_parallel(run_rows_range, &rj, nbatch, 2, 1);
    else
      run_rows_range(&rj, 0, nbatch);
    return;
  }
  BatchJob j = {l, r, ct, c, bshape, nb, m, n, k};
  if (nbatch > 1 && ct != DT_I64 && la_spare_core(nbatch * m, n, k > 0 ? k : 1))
    kern_parallel(run_batch_range, &j, nbatch, 2, 1);
  else
    run_batch_range(&j, 0, nbatch);
}

/* The product into [o], all operands described and checked. */
static int dot_compute(Array *l, Array *r, const DimNums *dn, Array *o) {
  int lf[SHM_MAXDIM], rf[SHM_MAXDIM];
  int nlf = free_dims(l->ndim, dn->lc, dn->nc, dn->lb, dn->nb, lf);
  int nrf = free_dims(r->ndim, dn->rc, dn->nc, dn->rb, dn->nb, rf);
  DType ct = compute_dtype(l->dtype, r->dtype, o->dtype);
  bool blas = ct != DT_I64;
  MatView lv, rv;
  if (make_view(l, ct, blas, dn->lb, dn->nb, lf, nlf, dn->lc, dn->nc, &lv) < 0)
    return -1;
  if (make_view(r, ct, blas, dn->rb, dn->nb, dn->rc, dn->nc, rf, nrf, &rv) < 0) {
    view_release(&lv);
    return -1;
  }
  int64_t bshape[SHM_MAXDIM];
  for (int i = 0; i < dn->nb; i++)
    bshape[i] = l->shape[dn->lb[i]];
  char *c = arr_data(o);
  size_t tmp_bytes = (size_t)o->size * dt_size(ct);
  bool convert = o->dtype != ct;
  int rc = 0;
  if (convert && !(c = shm_buf_alloc(tmp_bytes ? tmp_bytes : 1))) {
    err_nomem();
    rc = -1;
  } else {
    run_batches(&lv, &rv, ct, c, bshape, dn->nb, lv.rows, rv.cols, lv.cols);
    if (convert) {
      kern_convert(arr_data(o), o->dtype, c, ct, o->size);
      shm_buf_free(c, tmp_bytes ? tmp_bytes : 1);
    }
  }
  view_release(&lv);
  view_release(&rv);
  return rc;
}

int la_kernel_dot_general(Array **in, int nin, const Params *p, Array **out) {
  AVal la, ra, oa;
  DimNums dn;
  if (nin != 2)
    return err_set(ERR_TYPE, "dot_general takes 2 operands, got %d", nin), -1;
  aval_of(in[0], &la);
  aval_of(in[1], &ra);
  if (dot_rule(&la, &ra, p, &dn, &oa) < 0)
    return -1;
  bool made = false;
  if (!out[0]) {
    if (!(out[0] = arr_new(oa.dtype, oa.ndim, oa.shape)))
      return -1;
    out[0]->weak = oa.weak;
    made = true;
  }
  if (out[0]->size == 0)
    return 0;
  if (dot_compute(in[0], in[1], &dn, out[0]) < 0) {
    if (made) {
      val_decref(&out[0]->hdr);
      out[0] = NULL;
    }
    return -1;
  }
  return 0;
}

/* ---- BLIS set-up ------------------------------------------------------------------- */

/* BLIS 0.9's arch_t numbers, which BLIS_ARCH_TYPE must be given. */
static int best_arch_id(void) {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl"))
    return BLIS_ARCH_SKX;
  if (__builtin_cpu_is("znver3"))
    return BLIS_ARCH_ZEN3;
  if (__builtin_cpu_is("znver2"))
    return BLIS_ARCH_ZEN2;
  if (__builtin_cpu_is("znver1"))
    return BLIS_ARCH_ZEN;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return BLIS_ARCH_HASWELL;
  return -1;
}

void la_init(void) {
  const char *env = getenv("BLIS_ARCH_TYPE");
  if (!env || !*env) {
    int id = best_arch_id();
    if (id >= 0) {
      char num[16];
      snprintf(num, sizeof num, "%d", id);
      setenv("BLIS_ARCH_TYPE", num, 1);
    }
  }
  bli_thread_set_num_threads(1);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
    la_cores = CPU_COUNT(&set);
}

const char *la_blis_arch(void) {
  return bli_arch_string(bli_arch_query_id());
}
