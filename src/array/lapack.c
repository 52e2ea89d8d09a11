/*
 * lapack.c - the factorisation kernels through LAPACK's Fortran
 * interface (lapack.h).  Each kernel copies one matrix of the batch at a
 * time into a column-major work buffer, calls the single or double
 * precision routine, and copies the results back row-major; the work
 * buffers are the kernel's own, so device threads run kernels at once.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "array/lapack.h"
#include "base/mem.h"

/* ==== the Fortran interface ================================================ */

/* Fortran passes every argument by reference; a CHARACTER argument has
 * its length appended after the others (gfortran's convention).  The
 * array arguments are void * so one table holds both precisions. */
typedef void GetrfFn(const int *m, const int *n, void *a, const int *lda, int *ipiv, int *info);
typedef void TrsmFn(const char *side, const char *uplo, const char *transa, const char *diag,
                    const int *m, const int *n, const void *alpha, const void *a, const int *lda,
                    void *b, const int *ldb, size_t, size_t, size_t, size_t);
typedef void PotrfFn(const char *uplo, const int *n, void *a, const int *lda, int *info, size_t);
typedef void SyevdFn(const char *jobz, const char *uplo, const int *n, void *a, const int *lda,
                     void *w, void *work, const int *lwork, int *iwork, const int *liwork,
                     int *info, size_t, size_t);
typedef void GesddFn(const char *jobz, const int *m, const int *n, void *a, const int *lda,
                     void *s, void *u, const int *ldu, void *vt, const int *ldvt, void *work,
                     const int *lwork, int *iwork, int *info, size_t);
typedef void GeqrfFn(const int *m, const int *n, void *a, const int *lda, void *tau, void *work,
                     const int *lwork, int *info);
typedef void OrgqrFn(const int *m, const int *n, const int *k, void *a, const int *lda,
                     const void *tau, void *work, const int *lwork, int *info);

extern GetrfFn sgetrf_, dgetrf_;
extern TrsmFn strsm_, dtrsm_;
extern PotrfFn spotrf_, dpotrf_;
extern SyevdFn ssyevd_, dsyevd_;
extern GesddFn sgesdd_, dgesdd_;
extern GeqrfFn sgeqrf_, dgeqrf_;
extern OrgqrFn sorgqr_, dorgqr_;

/* One precision's routines. */
typedef struct Lapack {
  GetrfFn *getrf;
  TrsmFn *trsm;
  PotrfFn *potrf;
  SyevdFn *syevd;
  GesddFn *gesdd;
  GeqrfFn *geqrf;
  OrgqrFn *orgqr;
} Lapack;

static const Lapack lapack_s = {sgetrf_, strsm_, spotrf_, ssyevd_, sgesdd_, sgeqrf_, sorgqr_};
static const Lapack lapack_d = {dgetrf_, dtrsm_, dpotrf_, dsyevd_, dgesdd_, dgeqrf_, dorgqr_};

static const Lapack *routines(DType t) { return t == DT_F64 ? &lapack_d : &lapack_s; }

/* ==== work buffers and layouts ============================================= */

/* Element [i] of a float32 or float64 buffer, as a double. */
static double elem_get(DType t, const void *p, int64_t i) {
  return t == DT_F64 ? ((const double *)p)[i] : ((const float *)p)[i];
}

static void elem_set(DType t, void *p, int64_t i, double v) {
  if (t == DT_F64)
    ((double *)p)[i] = v;
  else
    ((float *)p)[i] = (float)v;
}

/* A buffer of [n] elements of [t] (at least one), or NULL with the
 * out-of-memory error set. */
static void *work_new(DType t, int64_t n) {
  void *p = shm_malloc((size_t)(n > 0 ? n : 1) * dt_size(t));
  if (!p) err_nomem();
  return p;
}

/* Copies the [r] x [c] row-major matrix at [src] into column-major [dst]
 * with leading dimension [ld]. */
static void to_cols(DType t, const void *src, int64_t r, int64_t c, void *dst, int64_t ld) {
  for (int64_t i = 0; i < r; i++)
    for (int64_t j = 0; j < c; j++) elem_set(t, dst, i + j * ld, elem_get(t, src, i * c + j));
}

/* Copies the [r] x [c] column-major matrix at [src] (leading dimension
 * [ld]) into row-major [dst]. */
static void from_cols(DType t, const void *src, int64_t ld, int64_t r, int64_t c, void *dst) {
  for (int64_t i = 0; i < r; i++)
    for (int64_t j = 0; j < c; j++) elem_set(t, dst, i * c + j, elem_get(t, src, i + j * ld));
}

/* The address of matrix [b] of a contiguous batch of [r] x [c] matrices. */
static void *mat_at(const Array *a, int64_t b, int64_t r, int64_t c) {
  return (char *)arr_data(a) + (size_t)(b * r * c) * dt_size(a->dtype);
}

/* Makes result [i] of aval ([t], [nd], [shape]) unless the caller did. */
static int out_make(Array **out, int i, DType t, int nd, const int64_t *shape) {
  if (out[i]) return 0;
  out[i] = arr_new(t, nd, shape);
  return out[i] ? 0 : -1;
}

/* Releases the results a failed kernel made. */
static int fail_outs(Array **out, int nout) {
  for (int i = 0; i < nout; i++)
    if (out[i]) {
      val_decref(&out[i]->hdr);
      out[i] = NULL;
    }
  return -1;
}

/* A LAPACK argument error: [info] < 0 names the bad argument. */
static int bad_info(const char *routine, int info) {
  err_set(ERR_VALUE, "LAPACK %s rejected its argument %d", routine, -info);
  return -1;
}

static int imax1(int64_t x) { return x > 1 ? (int)x : 1; }

/* The number of matrices in [a] whose last two dimensions are [r] x [c]. */
static int64_t batch_count(const Array *a, int64_t r, int64_t c) {
  int64_t n = 1;
  for (int i = 0; i + 2 < a->ndim; i++) n *= a->shape[i];
  (void)r, (void)c;
  return n;
}

/* [a]'s shape with the last [drop] dimensions replaced by [nk] sizes. */
static int shape_with(const Array *a, int drop, int nk, const int64_t *k, int64_t *shape) {
  int nd = a->ndim - drop;
  for (int i = 0; i < nd; i++) shape[i] = a->shape[i];
  for (int i = 0; i < nk; i++) shape[nd + i] = k[i];
  return nd + nk;
}

/* ==== lu ==================================================================== */

int lapack_kernel_lu(Array **in, int nin, const Params *p, Array **out) {
  (void)nin, (void)p;
  Array *a = arr_contiguous(in[0]);
  if (!a) return -1;
  DType t = a->dtype;
  int64_t m = a->shape[a->ndim - 2], n = a->shape[a->ndim - 1], k = m < n ? m : n;
  int64_t nb = batch_count(a, m, n), shp[SHM_MAXDIM];
  int nd;
  int rc = out_make(out, 0, t, a->ndim, a->shape);
  nd = shape_with(a, 2, 1, &k, shp);
  rc = rc < 0 ? -1 : out_make(out, 1, DT_I32, nd, shp);
  nd = shape_with(a, 2, 1, &m, shp);
  rc = rc < 0 ? -1 : out_make(out, 2, DT_I32, nd, shp);
  void *w = rc < 0 ? NULL : work_new(t, m * n);
  int *ipiv = w ? shm_malloc((size_t)imax1(k) * sizeof(int)) : NULL;
  if (w && !ipiv) err_nomem();
  int mi = (int)m, ni = (int)n, ld = imax1(m), info = 0;
  for (int64_t b = 0; ipiv && b < nb; b++) {
    to_cols(t, mat_at(a, b, m, n), m, n, w, m);
    if (m > 0 && n > 0) routines(t)->getrf(&mi, &ni, w, &ld, ipiv, &info);
    if (info < 0) break;
    from_cols(t, w, m, m, n, mat_at(out[0], b, m, n));
    int32_t *piv = (int32_t *)arr_data(out[1]) + b * k, *perm = (int32_t *)arr_data(out[2]) + b * m;
    for (int64_t i = 0; i < m; i++) perm[i] = (int32_t)i;
    for (int64_t i = 0; i < k; i++) {   /* the row swaps, applied in order */
      piv[i] = ipiv[i] - 1;
      int32_t s = perm[i];
      perm[i] = perm[piv[i]];
      perm[piv[i]] = s;
    }
  }
  shm_free(w);
  shm_free(ipiv);
  val_decref(&a->hdr);
  if (info < 0) bad_info("getrf", info);
  return rc < 0 || !ipiv || info < 0 ? fail_outs(out, 3) : 0;
}

/* ==== triangular_solve ====================================================== */

/* The boolean parameter [name], false when absent. */
static bool flag(const Params *p, const char *name) {
  Value *v = params_get(p, name);
  return v && val_truth(v) > 0;
}

int lapack_kernel_triangular_solve(Array **in, int nin, const Params *p, Array **out) {
  (void)nin;
  Array *a = arr_contiguous(in[0]), *b = a ? arr_contiguous(in[1]) : NULL;
  DType t = b ? b->dtype : DT_F32;
  int64_t m = a ? a->shape[a->ndim - 1] : 0, r = b ? b->shape[b->ndim - 2] : 0,
          c = b ? b->shape[b->ndim - 1] : 0;
  int rc = b ? out_make(out, 0, t, b->ndim, b->shape) : -1;
  void *wa = rc < 0 ? NULL : work_new(t, m * m), *wb = wa ? work_new(t, r * c) : NULL;
  bool left = flag(p, "left_side"), lower = flag(p, "lower");
  char side = left ? 'L' : 'R', uplo = lower ? 'L' : 'U';
  char trans = flag(p, "transpose_a") ? 'T' : 'N', diag = flag(p, "unit_diagonal") ? 'U' : 'N';
  double one_d = 1.0;
  float one_s = 1.0f;
  int ri = (int)r, ci = (int)c, lda = imax1(m), ldb = imax1(r);
  for (int64_t k = 0; wb && r > 0 && c > 0 && k < batch_count(b, r, c); k++) {
    to_cols(t, mat_at(a, k, m, m), m, m, wa, m);
    to_cols(t, mat_at(b, k, r, c), r, c, wb, r);
    routines(t)->trsm(&side, &uplo, &trans, &diag, &ri, &ci, t == DT_F64 ? (void *)&one_d : (void *)&one_s,
                      wa, &lda, wb, &ldb, 1, 1, 1, 1);
    from_cols(t, wb, r, r, c, mat_at(out[0], k, r, c));
  }
  bool ok = wb != NULL;
  shm_free(wa);
  shm_free(wb);
  if (a) val_decref(&a->hdr);
  if (b) val_decref(&b->hdr);
  return ok ? 0 : fail_outs(out, 1);
}

/* ==== cholesky ============================================================== */

int lapack_kernel_cholesky(Array **in, int nin, const Params *p, Array **out) {
  (void)nin, (void)p;
  Array *a = arr_contiguous(in[0]);
  if (!a) return -1;
  DType t = a->dtype;
  int64_t n = a->shape[a->ndim - 1];
  int rc = out_make(out, 0, t, a->ndim, a->shape);
  void *w = rc < 0 ? NULL : work_new(t, n * n);
  int ni = (int)n, ld = imax1(n), info = 0;
  for (int64_t b = 0; w && n > 0 && b < batch_count(a, n, n); b++) {
    to_cols(t, mat_at(a, b, n, n), n, n, w, n);
    routines(t)->potrf("L", &ni, w, &ld, &info, 1);
    if (info < 0) break;
    void *o = mat_at(out[0], b, n, n);
    for (int64_t i = 0; i < n; i++)   /* the lower triangle; NaNs where it failed */
      for (int64_t j = 0; j < n; j++)
        elem_set(t, o, i * n + j, info > 0 ? NAN : j <= i ? elem_get(t, w, i + j * n) : 0.0);
  }
  bool ok = w != NULL && info >= 0;
  if (info < 0) bad_info("potrf", info);
  shm_free(w);
  val_decref(&a->hdr);
  return ok ? 0 : fail_outs(out, 1);
}

/* ==== eigh ================================================================== */

int lapack_kernel_eigh(Array **in, int nin, const Params *p, Array **out) {
  (void)nin;
  Array *a = arr_contiguous(in[0]);
  if (!a) return -1;
  DType t = a->dtype;
  int64_t n = a->shape[a->ndim - 1], shp[SHM_MAXDIM];
  int rc = out_make(out, 0, t, a->ndim, a->shape);
  int nd = shape_with(a, 2, 1, &n, shp);
  rc = rc < 0 ? -1 : out_make(out, 1, t, nd, shp);
  char uplo = params_get(p, "lower") && !flag(p, "lower") ? 'U' : 'L';
  int ni = (int)n, ld = imax1(n), info = 0, lwork = -1, liwork = -1, iq = 0;
  double q[2];
  void *w = rc < 0 ? NULL : work_new(t, n * n), *work = NULL;
  int *iwork = NULL;
  if (w && n > 0) {   /* the workspace query */
    routines(t)->syevd("V", &uplo, &ni, w, &ld, q, q, &lwork, &iq, &liwork, &info, 1, 1);
    lwork = (int)elem_get(t, q, 0) + 1;
    liwork = iq > 1 ? iq : 1;
    work = work_new(t, lwork);
    iwork = work ? shm_malloc((size_t)liwork * sizeof(int)) : NULL;
    if (work && !iwork) err_nomem();
  }
  bool ready = w && (n == 0 || iwork);
  for (int64_t b = 0; ready && n > 0 && b < batch_count(a, n, n); b++) {
    to_cols(t, mat_at(a, b, n, n), n, n, w, n);
    void *ev = (char *)arr_data(out[1]) + (size_t)(b * n) * dt_size(t);
    routines(t)->syevd("V", &uplo, &ni, w, &ld, ev, work, &lwork, iwork, &liwork, &info, 1, 1);
    if (info < 0) break;
    void *o = mat_at(out[0], b, n, n);
    for (int64_t i = 0; i < n * n && info > 0; i++) elem_set(t, o, i, NAN);
    for (int64_t i = 0; i < n && info > 0; i++) elem_set(t, ev, i, NAN);
    if (info == 0) from_cols(t, w, n, n, n, o);
    info = 0;
  }
  if (info < 0) bad_info("syevd", info);
  shm_free(w);
  shm_free(work);
  shm_free(iwork);
  val_decref(&a->hdr);
  return ready && info >= 0 ? 0 : fail_outs(out, 2);
}

/* ==== svd =================================================================== */

/* Sets the [r] x [c] row-major matrix at [o] to the identity's first
 * columns: the factor of an empty matrix. */
static void eye_fill(DType t, void *o, int64_t r, int64_t c) {
  for (int64_t i = 0; i < r; i++)
    for (int64_t j = 0; j < c; j++) elem_set(t, o, i * c + j, i == j ? 1.0 : 0.0);
}

int lapack_kernel_svd(Array **in, int nin, const Params *p, Array **out) {
  (void)nin;
  Array *a = arr_contiguous(in[0]);
  if (!a) return -1;
  DType t = a->dtype;
  bool full = flag(p, "full_matrices");
  int64_t m = a->shape[a->ndim - 2], n = a->shape[a->ndim - 1], k = m < n ? m : n;
  int64_t uc = full ? m : k, vr = full ? n : k, shp[SHM_MAXDIM];
  int nd = shape_with(a, 2, 1, &k, shp);
  int rc = out_make(out, 0, t, nd, shp);
  nd = shape_with(a, 2, 2, (int64_t[]){m, uc}, shp);
  rc = rc < 0 ? -1 : out_make(out, 1, t, nd, shp);
  nd = shape_with(a, 2, 2, (int64_t[]){vr, n}, shp);
  rc = rc < 0 ? -1 : out_make(out, 2, t, nd, shp);
  char jobz = full ? 'A' : 'S';
  int mi = (int)m, ni = (int)n, lda = imax1(m), ldu = imax1(m), ldvt = imax1(vr), info = 0,
      lwork = -1;
  double q[2];
  void *w = rc < 0 ? NULL : work_new(t, m * n), *u = w ? work_new(t, m * uc) : NULL,
       *vt = u ? work_new(t, vr * n) : NULL, *work = NULL;
  int *iwork = vt ? shm_malloc((size_t)imax1(8 * k) * sizeof(int)) : NULL;
  if (vt && !iwork) err_nomem();
  if (iwork && k > 0) {
    routines(t)->gesdd(&jobz, &mi, &ni, w, &lda, q, u, &ldu, vt, &ldvt, q, &lwork, iwork, &info, 1);
    lwork = (int)elem_get(t, q, 0) + 1;
    work = work_new(t, lwork);
  }
  bool ready = iwork && (k == 0 || work);
  for (int64_t b = 0; ready && b < batch_count(a, m, n); b++) {
    void *s = (char *)arr_data(out[0]) + (size_t)(b * k) * dt_size(t);
    void *uo = mat_at(out[1], b, m, uc), *vo = mat_at(out[2], b, vr, n);
    if (k == 0) {
      eye_fill(t, uo, m, uc);
      eye_fill(t, vo, vr, n);
      continue;
    }
    to_cols(t, mat_at(a, b, m, n), m, n, w, m);
    routines(t)->gesdd(&jobz, &mi, &ni, w, &lda, s, u, &ldu, vt, &ldvt, work, &lwork, iwork,
                       &info, 1);
    if (info < 0) break;
    if (info > 0) {   /* did not converge: NaNs, as JAX's */
      for (int64_t i = 0; i < k; i++) elem_set(t, s, i, NAN);
      for (int64_t i = 0; i < m * uc; i++) elem_set(t, uo, i, NAN);
      for (int64_t i = 0; i < vr * n; i++) elem_set(t, vo, i, NAN);
      info = 0;
      continue;
    }
    from_cols(t, u, m, m, uc, uo);
    from_cols(t, vt, vr, vr, n, vo);
  }
  if (info < 0) bad_info("gesdd", info);
  shm_free(w);
  shm_free(u);
  shm_free(vt);
  shm_free(work);
  shm_free(iwork);
  val_decref(&a->hdr);
  return ready && info >= 0 ? 0 : fail_outs(out, 3);
}

/* ==== qr ==================================================================== */

int lapack_kernel_qr(Array **in, int nin, const Params *p, Array **out) {
  (void)nin;
  Array *a = arr_contiguous(in[0]);
  if (!a) return -1;
  DType t = a->dtype;
  bool full = flag(p, "full_matrices");
  int64_t m = a->shape[a->ndim - 2], n = a->shape[a->ndim - 1], k = m < n ? m : n;
  int64_t qc = full ? m : k, wc = n > qc ? n : qc, shp[SHM_MAXDIM];
  int nd = shape_with(a, 2, 2, (int64_t[]){m, qc}, shp);
  int rc = out_make(out, 0, t, nd, shp);
  nd = shape_with(a, 2, 2, (int64_t[]){qc, n}, shp);
  rc = rc < 0 ? -1 : out_make(out, 1, t, nd, shp);
  int mi = (int)m, ni = (int)n, qi = (int)qc, ki = (int)k, lda = imax1(m), info = 0, lwork = -1;
  double q1[2], q2[2];
  /* [w] holds the m x max(n, qc) columns: geqrf's result, then Q */
  void *w = rc < 0 ? NULL : work_new(t, m * wc), *tau = w ? work_new(t, k) : NULL, *work = NULL;
  if (tau && k > 0) {
    routines(t)->geqrf(&mi, &ni, w, &lda, tau, q1, &lwork, &info);
    routines(t)->orgqr(&mi, &qi, &ki, w, &lda, tau, q2, &lwork, &info);
    double l1 = elem_get(t, q1, 0), l2 = elem_get(t, q2, 0);
    lwork = (int)(l1 > l2 ? l1 : l2) + 1;
    work = work_new(t, lwork);
  }
  bool ready = tau && (k == 0 || work);
  for (int64_t b = 0; ready && b < batch_count(a, m, n); b++) {
    void *qo = mat_at(out[0], b, m, qc), *ro = mat_at(out[1], b, qc, n);
    to_cols(t, mat_at(a, b, m, n), m, n, w, m);
    if (k > 0) routines(t)->geqrf(&mi, &ni, w, &lda, tau, work, &lwork, &info);
    if (info < 0) break;
    for (int64_t i = 0; i < qc; i++)   /* R: the upper triangle */
      for (int64_t j = 0; j < n; j++)
        elem_set(t, ro, i * n + j, j >= i && i < m ? elem_get(t, w, i + j * m) : 0.0);
    if (k == 0) {
      eye_fill(t, qo, m, qc);
      continue;
    }
    routines(t)->orgqr(&mi, &qi, &ki, w, &lda, tau, work, &lwork, &info);
    if (info < 0) break;
    from_cols(t, w, m, m, qc, qo);
  }
  if (info < 0) bad_info("geqrf", info);
  shm_free(w);
  shm_free(tau);
  shm_free(work);
  val_decref(&a->hdr);
  return ready && info >= 0 ? 0 : fail_outs(out, 2);
}
