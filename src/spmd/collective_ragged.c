/*
 * collective_ragged.c - ragged_all_to_all (semantics: seed 002), within a
 * process and across processes (collective_impl.h): every participant
 * sends each other one a data-dependent number of rows, by offsets and
 * sizes that are operands too.
 *
 * Its family file: the complete row (ragged_rows, at the end) with its
 * rules beside it: shape, kernel, vma, JVP and transpose (JAX's rule in
 * parallel.py); vmap runs it example by example (no batching rule).
 */
#include "spmd/collective_impl.h"

#include "array/prim.h"
#include "lang/ops.h"

/* ---- ragged_all_to_all ------------------------------------------------------------- */

enum { RA_OPERAND, RA_OUTPUT, RA_IN_OFF, RA_SEND, RA_OUT_OFF, RA_RECV };

int coll_shape_ragged_all_to_all(const AVal *in, int nin, const Params *p,
                                 AVal *out) {
  (void)p;
  const char *prim = "ragged_all_to_all";
  if (nin != 6) return err_set(ERR_TYPE, "%s takes 6 operands, got %d", prim, nin), -1;
  const AVal *op = &in[RA_OPERAND], *o = &in[RA_OUTPUT];
  if (op->ndim < 1 || op->ndim != o->ndim || op->dtype != o->dtype)
    return err_set(ERR_VALUE, "%s: operand and output must have the same "
                   "dtype and rank (at least 1)", prim), -1;
  for (int d = 1; d < op->ndim; d++)
    if (op->shape[d] != o->shape[d])
      return err_set(ERR_VALUE, "%s: operand and output must agree in every "
                     "dimension but the first", prim), -1;
  for (int k = RA_IN_OFF; k <= RA_RECV; k++)
    if (in[k].ndim != 1 || !dt_is_int(in[k].dtype) ||
        in[k].shape[0] != in[RA_IN_OFF].shape[0])
      return err_set(ERR_VALUE, "%s: input_offsets, send_sizes, output_offsets "
                     "and recv_sizes must be 1-D integer arrays of one length",
                     prim), -1;
  *out = *o;
  return 0;
}

/* One slice sent from participant qs to participant qd (their j-th). */
typedef struct RaggedSlice {
  int64_t in_off, size, out_off;
} RaggedSlice;

static RaggedSlice ragged_slice(const Call *c, int qs, int qd, int64_t spd,
                                int64_t j) {
  int64_t i = qd * spd + j;
  RaggedSlice s;
  s.in_off = coll_elem_i64(coll_peer_in(c, qs, RA_IN_OFF), i);
  s.size = coll_elem_i64(coll_peer_in(c, qs, RA_SEND), i);
  s.out_off = coll_elem_i64(coll_peer_in(c, qs, RA_OUT_OFF), i);
  return s;
}

/* Checks the slice qs -> qd #j: in bounds on both sides, sizes agreeing. */
static int ragged_check(const Call *c, int qs, int qd, int64_t spd, int64_t j) {
  RaggedSlice s = ragged_slice(c, qs, qd, spd, j);
  int64_t i = qd * spd + j, k = qs * spd + j;
  int64_t rows = coll_peer_in(c, qs, RA_OPERAND)->shape[0];
  int64_t orows = coll_peer_in(c, qd, RA_OUTPUT)->shape[0];
  int64_t recv = coll_elem_i64(coll_peer_in(c, qd, RA_RECV), k);
  char cs[128], cd[128];
  coll_coords_of(c->g, c->peers[qs], cs, sizeof cs);
  coll_coords_of(c->g, c->peers[qd], cd, sizeof cd);
  if (s.size < 0 || s.in_off < 0 || s.in_off > rows - s.size)
    return err_set(ERR_INDEX, "ragged_all_to_all: device %s: input_offsets[%lld] "
                   "= %lld with send_sizes[%lld] = %lld reads outside the "
                   "operand's %lld rows", cs, (long long)i, (long long)s.in_off,
                   (long long)i, (long long)s.size, (long long)rows), -1;
  if (recv != s.size)
    return err_set(ERR_VALUE, "ragged_all_to_all: device %s sends %lld rows to "
                   "device %s (send_sizes[%lld]), which expects recv_sizes[%lld] "
                   "= %lld", cs, (long long)s.size, cd, (long long)i,
                   (long long)k, (long long)recv), -1;
  if (s.out_off < 0 || s.out_off > orows - s.size)
    return err_set(ERR_INDEX, "ragged_all_to_all: device %s: output_offsets[%lld] "
                   "= %lld with send_sizes[%lld] = %lld writes outside the %lld "
                   "output rows of device %s", cs, (long long)i,
                   (long long)s.out_off, (long long)i, (long long)s.size,
                   (long long)orows, cd), -1;
  return 0;
}

/* Every participant checks every slice, in the same order, so all of them
 * reach the same verdict and fail together. */
static int ragged_validate(const Call *c, int64_t spd) {
  for (int qs = 0; qs < c->n; qs++)
    for (int qd = 0; qd < c->n; qd++)
      for (int64_t j = 0; j < spd; j++)
        if (ragged_check(c, qs, qd, spd, j) < 0) return -1;
  return 0;
}

/* Copies rows [s.in_off, +s.size) of [src] to rows [s.out_off, ...) of out. */
static void ragged_copy(Array *out, const Array *src, RaggedSlice s) {
  View d, v;
  coll_view_of(&d, out);
  coll_view_of(&v, src);
  coll_view_slice(&d, 0, s.out_off, s.size);
  coll_view_slice(&v, 0, s.in_off, s.size);
  coll_view_copy(&d, &v);
}

static void fast_ragged(const Call *c, int64_t spd) {
  View d, v;
  coll_view_of(&d, c->out[0]);
  coll_view_of(&v, c->in[RA_OUTPUT]);
  coll_view_copy(&d, &v);
  for (int qs = 0; qs < c->n; qs++)
    for (int64_t j = 0; j < spd; j++)
      ragged_copy(c->out[0], coll_peer_in(c, qs, RA_OPERAND),
                  ragged_slice(c, qs, c->pos, spd, j));
}

/* Reference: the seed's pseudocode, element by element, from the gathered
 * operands: result = output, then result[off:off+size] = RECEIVE(...). */
static int ref_ragged(const Call *c, int64_t spd) {
  Global gl;
  if (coll_global_gather(&gl, c, RA_OPERAND) < 0) return -1;
  Array *out = c->out[0];
  size_t es = dt_size(out->dtype);
  int64_t row = out->shape[0] ? out->size / out->shape[0] : 0;
  View d, v;
  coll_view_of(&d, out);
  coll_view_of(&v, c->in[RA_OUTPUT]);
  coll_view_copy(&d, &v);
  for (int qs = 0; qs < c->n; qs++)
    for (int64_t j = 0; j < spd; j++) {
      RaggedSlice s = ragged_slice(c, qs, c->pos, spd, j);
      for (int64_t e = 0; e < s.size * row; e++) {
        int64_t idx[SHM_MAXDIM];
        coll_unravel(s.in_off * row + e, gl.blockview.ndim, gl.blockview.shape, idx);
        memcpy((char *)arr_data(out) + (size_t)(s.out_off * row + e) * es,
               coll_global_at(&gl, qs, idx), es);
      }
    }
  coll_global_free(&gl);
  return 0;
}

static int x_ragged(const Call *c, const void *arg) {
  int64_t spd = *(const int64_t *)arg;
  if (ragged_validate(c, spd) < 0) return -1;
  fast_ragged(c, spd);
  return 0;
}

/* ---- ragged_all_to_all across processes -------------------------------------------
 *
 * As MPI_Alltoallv moves data: each process sends each other one its
 * participants' offsets and sizes (every participant checks every slice,
 * ragged_validate) and then only the rows of their operands that the other
 * process's participants take, into proxies of those operands at the same
 * rows; x_ragged then copies as within a process. */

/* State of one leader's x_ragged_exchange. */
typedef struct XRagged {
  Call v;                         /* the call reading the leader's table */
  const XLocal *lc;
  int64_t spd;                    /* slices per destination */
  int64_t *iv;                    /* [2 * n * spd] row intervals (x_ragged_rows) */
  Array **send;                   /* [lc->n * nin] local inputs, contiguous */
  TransportIov *iov;              /* [n * (nin + n * spd)] pieces */
  void **reqs;                    /* [3 * np] */
  int nreqs;
} XRagged;

/* The row intervals [iv[2i], iv[2i + 1]) of participant qs's operand that
 * the participants on process [proc] take, merged, in increasing order:
 * their number.  Only slices inside the operand count (the others fail
 * ragged_validate).  The sender computes them from its own offsets, the
 * receiver from the sender's, received first: they agree. */
static int x_ragged_rows(const XRagged *x, int qs, int proc) {
  const Call *v = &x->v;
  int64_t rows = coll_peer_in(v, qs, RA_OPERAND)->shape[0], *iv = x->iv;
  int m = 0, w = 0;
  for (int qd = 0; qd < v->n; qd++) {
    if (coll_x_proc(v->g, v->peers[qd]) != proc) continue;
    for (int64_t j = 0; j < x->spd; j++) {
      RaggedSlice s = ragged_slice(v, qs, qd, x->spd, j);
      if (s.size <= 0 || s.in_off < 0 || s.in_off > rows - s.size) continue;
      int k = m++;
      for (; k > 0 && iv[2 * (k - 1)] > s.in_off; k--) {
        iv[2 * k] = iv[2 * (k - 1)];
        iv[2 * k + 1] = iv[2 * k - 1];
      }
      iv[2 * k] = s.in_off;
      iv[2 * k + 1] = s.in_off + s.size;
    }
  }
  for (int i = 0; i < m; i++)
    if (w > 0 && iv[2 * i] <= iv[2 * w - 1]) {
      if (iv[2 * i + 1] > iv[2 * w - 1]) iv[2 * w - 1] = iv[2 * i + 1];
    } else {
      iv[2 * w] = iv[2 * i];
      iv[2 * w + 1] = iv[2 * i + 1];
      w++;
    }
  return w;
}

/* The pieces of participant qs's operand [op] (contiguous) that process
 * [proc] takes, appended to x->iov from [k]: the new count. */
static int x_ragged_pieces(XRagged *x, int qs, int proc, Array *op, int k) {
  int64_t rows = op->shape[0];
  size_t row = rows ? (size_t)(op->size / rows) * dt_size(op->dtype) : 0;
  int m = x_ragged_rows(x, qs, proc);
  for (int i = 0; i < m; i++)
    x->iov[k++] = (TransportIov){(char *)arr_data(op) + (size_t)x->iv[2 * i] * row,
                                 (size_t)(x->iv[2 * i + 1] - x->iv[2 * i]) * row};
  return k;
}

static size_t x_iov_bytes(const TransportIov *iov, int k) {
  size_t t = 0;
  for (int i = 0; i < k; i++) t += iov[i].len;
  return t;
}

/* Sends process [proc] the header [hv], the local participants' offsets
 * and sizes, then the rows its participants take (none: no message). */
static void x_ragged_send(XRagged *x, const TransportIov *hv, int proc) {
  const Call *v = &x->v;
  const XLocal *lc = x->lc;
  int nin = v->desc.nin, key = coll_x_key(v->g, v->seq, v->peers[0]), k = 0;
  int data = transport_tag(TRANSPORT_DATA, key);
  for (int l = 0; l < lc->n; l++)
    for (int j = RA_IN_OFF; j <= RA_RECV; j++) {
      Array *a = x->send[l * nin + j];
      x->iov[k++] = (TransportIov){arr_data(a), (size_t)a->size * dt_size(a->dtype)};
    }
  x->reqs[x->nreqs++] = transport_isend(proc, transport_tag(TRANSPORT_HEADER, key), hv, 1);
  x->reqs[x->nreqs++] = transport_isend(proc, data, x->iov, k);
  k = 0;
  for (int l = 0, qs = 0; l < lc->n; l++) {
    while (v->peers[qs] != lc->peers[l]) qs++;
    k = x_ragged_pieces(x, qs, proc, x->send[l * nin + RA_OPERAND], k);
  }
  if (x_iov_bytes(x->iov, k)) x->reqs[x->nreqs++] = transport_isend(proc, data, x->iov, k);
}

/* Receives process [proc]'s header, its participants' offsets and sizes
 * (into proxies), then the rows this process's participants take, into
 * proxies of their operands at those rows. */
static int x_ragged_recv(XRagged *x, int proc) {
  const Call *v = &x->v;
  Slot *me = &v->g->slots[v->rank];
  int nin = v->desc.nin, key = coll_x_key(v->g, v->seq, v->peers[0]);
  int data = transport_tag(TRANSPORT_DATA, key);
  TransportMsg *m = coll_x_wait_header(v, proc, transport_tag(TRANSPORT_HEADER, key));
  if (!m) return -1;
  XHeader h;
  if (coll_x_header_read(m, &h) < 0) return transport_msg_free(m), -1;
  int nr = h.nloc, qs[nr], k = 0;
  int rc = coll_desc_equal(&h.desc, &v->desc)
               ? 0 : coll_mismatch_error(v->g, v->rank, &v->desc, h.ranks[0], &h.desc);
  for (int r = 0; rc == 0 && r < nr; r++)
    if ((qs[r] = coll_x_position(v, h.ranks[r])) < 0) rc = -1;
  transport_msg_free(m);
  for (int r = 0; rc == 0 && r < nr; r++)
    for (int j = 0; j < nin; j++) {
      Array *a = v->xin[qs[r] * nin + j] = coll_x_proxy(me, qs[r] * nin + j, v->in[j]);
      if (!a) return -1;
      if (j >= RA_IN_OFF)
        x->iov[k++] = (TransportIov){arr_data(a), (size_t)a->size * dt_size(a->dtype)};
    }
  if (rc < 0 || transport_recv_data(proc, data, x->iov, k) < 0) return -1;
  k = 0;
  for (int r = 0; r < nr; r++)
    k = x_ragged_pieces(x, qs[r], transport_rank(), v->xin[qs[r] * nin + RA_OPERAND], k);
  return x_iov_bytes(x->iov, k) ? transport_recv_data(proc, data, x->iov, k) : 0;
}

/* The leader's exchange of a ragged_all_to_all (an XExchange; arg: the
 * slices per destination): the local participants' inputs in the table,
 * then the messages each way. */
static int x_ragged_exchange(const Call *c, const XLocal *lc, const void *arg) {
  Slot *me = &c->g->slots[c->rank];
  int n = c->n, nin = c->desc.nin, procs[n], np = coll_x_procs(c, procs), rc = 0;
  XRagged x = {.v = *c, .lc = lc, .spd = *(const int64_t *)arg};
  Array **tab = x.v.xin = coll_x_tab(me, n * nin);
  me->xin = tab;
  me->xn = n;
  me->xnin = nin;
  x.iv = shm_malloc(sizeof(int64_t) * 2 * (size_t)(n * x.spd) + 1);
  x.send = shm_calloc((size_t)(lc->n * nin) + 1, sizeof(Array *));
  x.iov = shm_malloc(sizeof(TransportIov) * (size_t)(n * (nin + n * x.spd)) + 1);
  x.reqs = shm_calloc(3 * (size_t)np + 1, sizeof(void *));
  char *h = shm_malloc(coll_x_wire_cap(lc->n));
  if (!tab || !x.iv || !x.send || !x.iov || !x.reqs || !h) {
    err_nomem();
    rc = -1;
  }
  for (int q = 0, l = 0; rc == 0 && q < n; q++) {
    if (!coll_x_local(c->g, c->peers[q])) continue;
    for (int j = 0; j < nin; j++) {
      Array *a = tab[q * nin + j] = c->g->slots[c->peers[q]].in[j];
      if (a->contiguous || a->ndim == 0) val_incref(&a->hdr);
      else if (!(a = arr_contiguous(a))) rc = -1;
      x.send[l * nin + j] = a;
    }
    l++;
  }
  TransportIov hv = {h, rc == 0 ? coll_x_header_pack(h, c, lc, 0) : 0};
  for (int i = 0; rc == 0 && i < np; i++) x_ragged_send(&x, &hv, procs[i]);
  /* from the next process up first, as x_a2a_run */
  int first = 0;
  while (first < np && procs[first] < transport_rank()) first++;
  for (int k = 0; rc == 0 && k < np; k++) rc = x_ragged_recv(&x, procs[(first + k) % np]);
  coll_x_wait_sends(c, x.reqs, x.nreqs, rc);
  for (int i = 0; x.send && i < lc->n * nin; i++)
    val_decref(x.send[i] ? &x.send[i]->hdr : NULL);
  shm_free(x.iv), shm_free(x.send), shm_free(x.iov), shm_free(x.reqs), shm_free(h);
  return rc;
}

/* Semantics: seed 002, ragged_all_to_all, exactly; with axis_index_groups
 * the slices per peer follow the group's size and order.  Offsets and
 * sizes reading or writing out of bounds, and send_sizes disagreeing with
 * the receiver's recv_sizes, are errors naming the device and index. */
int coll_kernel_ragged_all_to_all(Array **in, int nin, const Params *p,
                                  Array **out) {
  Call c;
  if (coll_call_init(&c, P_RAGGED_ALL_TO_ALL, p, in, nin, out) < 0) return -1;
  int64_t k = in[RA_IN_OFF]->shape[0];
  if (k % c.n != 0)
    return err_set(ERR_VALUE, "ragged_all_to_all: the offset and size arrays "
                   "have length %lld, which the axis size %d does not divide",
                   (long long)k, c.n), -1;
  if (c.cross) {
    int64_t spd = k / c.n;
    return coll_x_run(&c, x_ragged_exchange, x_ragged, &spd, NULL);
  }
  if (coll_rendezvous(&c) < 0) return -1;
  int rc = ragged_validate(&c, k / c.n);
  if (rc == 0 && c.g->reference)
    rc = ref_ragged(&c, k / c.n);
  else if (rc == 0)
    fast_ragged(&c, k / c.n);
  coll_leave(&c);
  return rc;
}

uint32_t coll_vma_ragged_all_to_all(const uint32_t *in, int nin, const Params *p) {
  return coll_vma_add(in, nin, p);
}

/* ==== differentiation (seed 002) ============================================== */

/* Linear in (operand, output) jointly; the offsets and sizes are integers:
 * the same collective on the tangents, zeros for a symbolic zero. */
static int jvp_ragged_all_to_all(Value **x, Value **t, int nin, const Params *p, Value **yo,
                                 Value **to) {
  (void)nin;
  *to = NULL;
  if (!(*yo = coll_rule_apply(P_RAGGED_ALL_TO_ALL, 6, x, (Params *)p, false))) return -1;
  if (!t[0] && !t[1]) return 0;
  Value *in[6] = {t[0], t[1], x[2], x[3], x[4], x[5]}, *z[2] = {NULL, NULL};
  for (int i = 0; i < 2; i++) {
    AVal a;
    if (!in[i] && prim_value_aval(x[i], &a) == 0) in[i] = z[i] = prim_zeros(&a);
  }
  if (in[0] && in[1]) *to = coll_rule_apply(P_RAGGED_ALL_TO_ALL, 6, in, (Params *)p, false);
  for (int i = 0; i < 2; i++)
    if (z[i]) val_decref(z[i]);
  if (*to) return 0;
  val_decref(*yo);
  *yo = NULL;
  return -1;
}

/* all_to_all of a per-peer vector [v] (one entry per device of the axis):
 * entry j of the result is entry i of device j's, i this device. */
static Value *exchange(Value *v, const Params *p, int64_t n) {
  Params q;
  params_init(&q);
  params_add(&q, "axis_name", val_incref(params_get(p, "axis_name")));
  params_add(&q, "axis_size", val_int(n));
  params_add(&q, "axis_index_groups", val_incref(params_get(p, "axis_index_groups")));
  params_add(&q, "split_axis", val_int(0));
  params_add(&q, "concat_axis", val_int(0));
  params_add(&q, "tiled", val_bool(true));
  return coll_rule_apply(P_ALL_TO_ALL, 1, &v, &q, true);
}

/* [acc] with [c] added at each of the positions [at] (scatter-add). */
static Value *add_at(Value *acc, Value *at, int64_t c) {
  AVal a;
  if (!acc || prim_value_aval(at, &a) < 0) return NULL;
  Value *cv = arr_value(arr_scalar_i64(DT_I32, c, false));
  Params q;
  params_init(&q);
  params_add(&q, "shape", val_int_tuple(a.ndim, a.shape));
  params_add(&q, "broadcast_dimensions", val_int_tuple(0, NULL));
  Value *upd = coll_rule_apply(P_BROADCAST_IN_DIM, 1, &cv, &q, true);
  params_init(&q);
  params_add(&q, "axis", val_int(0));
  params_add(&q, "mode", str_from("add"));
  Value *r = upd ? coll_rule_apply(P_SCATTER, 3, (Value *[]){acc, at, upd}, &q, true) : NULL;
  params_clear(&q);
  val_decref(cv);
  if (upd) val_decref(upd);
  return r;
}

/* The rows of an output of [rows] rows that the peers wrote: rows
 * [start_j, start_j + size_j) for each j, as a bool vector, from a
 * difference array (+1 at each start, -1 at each end, summed). */
static Value *written_rows(Value *start, Value *size, int64_t rows) {
  Params q;
  params_init(&q);
  Value *end = coll_rule_apply(P_ADD, 2, (Value *[]){start, size}, &q, false);
  AVal ma = {.dtype = DT_I32, .ndim = 1, .shape = {rows + 1}};
  Value *z = prim_zeros(&ma), *m1 = add_at(z, start, 1), *m2 = end ? add_at(m1, end, -1) : NULL;
  Value *run = NULL, *cut = NULL, *r = NULL;
  if (m2) {
    params_init(&q);
    params_add(&q, "axis", val_int(0));
    params_add(&q, "reverse", val_bool(false));
    run = coll_rule_apply(P_CUMSUM, 1, &m2, &q, true);
  }
  if (run) {
    params_init(&q);
    params_add(&q, "start_indices", val_int_tuple(1, (int64_t[]){0}));
    params_add(&q, "limit_indices", val_int_tuple(1, (int64_t[]){rows}));
    params_add(&q, "strides", val_incref(VAL_NONE));
    cut = coll_rule_apply(P_SLICE, 1, &run, &q, true);
  }
  if (cut) {
    Value *zs = arr_value(arr_scalar_i64(DT_I32, 0, false));
    params_init(&q);
    r = coll_rule_apply(P_GT, 2, (Value *[]){cut, zs}, &q, false);
    val_decref(zs);
  }
  Value *tmp[] = {end, z, m1, m2, run, cut};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  return r;
}

/* The transpose sends each device's output cotangent back where it came
 * from: the rows a peer wrote (at that peer's output_offsets for this
 * device, learned by an all_to_all) go back to the peer's operand rows
 * (its input_offsets, likewise); the output's cotangent keeps the rows no
 * peer wrote.  JAX's rule in parallel.py. */
static int tr_ragged_all_to_all(Value **ct, Value **in, const AVal *av, const bool *lin,
                                int nin, const Params *p, Value **cts) {
  (void)nin;
  int64_t n = av[2].ndim ? av[2].shape[0] : 1, rows = av[1].ndim ? av[1].shape[0] : 0;
  Value *out_off = exchange(in[4], p, n), *in_off = out_off ? exchange(in[2], p, n) : NULL;
  Value *zero = prim_zeros(&av[0]);
  int rc = -1;
  if (out_off && in_off && zero) {
    if (lin[0]) {
      Value *args[6] = {ct[0], zero, out_off, in[5], in_off, in[3]};
      cts[0] = coll_rule_apply(P_RAGGED_ALL_TO_ALL, 6, args, (Params *)p, false);
    }
    if (lin[1]) {
      Value *w = written_rows(out_off, in[5], rows);
      AVal ca = av[1];
      Value *bw = NULL;
      if (w) {
        Params q;
        params_init(&q);
        params_add(&q, "shape", val_int_tuple(ca.ndim, ca.shape));
        params_add(&q, "broadcast_dimensions", val_int_tuple(1, (int64_t[]){0}));
        bw = coll_rule_apply(P_BROADCAST_IN_DIM, 1, &w, &q, true);
        val_decref(w);
      }
      Value *zo = bw ? prim_zeros(&ca) : NULL;
      Params none;
      params_init(&none);
      cts[1] = zo ? coll_rule_apply(P_SELECT_N, 3, (Value *[]){bw, ct[0], zo}, &none, false) : NULL;
      if (bw) val_decref(bw);
      if (zo) val_decref(zo);
    }
    rc = (!lin[0] || cts[0]) && (!lin[1] || cts[1]) ? 0 : -1;
  }
  Value *tmp[] = {out_off, in_off, zero};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  return rc;
}

/* The sizes exchanged are data, unknown when lowering: counted as a
 * dense all_to_all of the operand (an upper bound when the output buffer
 * is the operand's size). */
static void traffic_ragged(double b, int n, CollTraffic *t) {
  *t = (CollTraffic){"all-to-all (dense bound)", b * (n - 1) / n, b * (n - 1) / n, 1};
}

/* ==== the row ================================================================== */

static const CollRow ragged_rows[] = {
    {P_RAGGED_ALL_TO_ALL,
     {.shape = coll_shape_ragged_all_to_all, .kernel = coll_kernel_ragged_all_to_all,
      .vma = coll_vma_ragged_all_to_all, .jvp = jvp_ragged_all_to_all,
      .transpose = tr_ragged_all_to_all,
      .coll = &(const CollRules){.api_name = "ragged_all_to_all", .traffic = traffic_ragged}}},
};

void coll_ragged_register(void) {
  coll_register_rows(ragged_rows, sizeof ragged_rows / sizeof *ragged_rows);
}
