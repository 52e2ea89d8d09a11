/*
 * collective_move.c - the collectives that move data in blocks of equal
 * size: all_gather, psum_scatter, ppermute and all_to_all, also across
 * processes (collective_impl.h).  ragged_all_to_all: collective_ragged.c.
 *
 * Their family file: each one's complete row of the primitive table
 * (move_rows, at the end) with its rules beside it: shape, kernel and vma
 * rules; JVP (each is linear) and transpose (all_gather's invariant
 * result gives each device its own slice back, psum_scatter's is an
 * all_gather, ppermute's the inverse permutation, all_to_all's the swapped
 * axes: JAX's parallel.py under the replication types of LANGUAGE.md
 * §11); batching over mesh axes and over a vmap or xmap axis they name
 * (all_gather and ppermute); all_gather's removal of named axes.
 */
#include "spmd/collective_impl.h"

#include "array/prim.h"
#include "lang/ops.h"

/* ---- all_gather ---------------------------------------------------------------- */

static int gather_args(const Params *p, int ndim, GatherArgs *a, bool need_n) {
  const char *prim = "all_gather";
  if (coll_param_bool(prim, p, "tiled", &a->tiled) < 0) return -1;
  if (coll_param_dim(prim, p, "all_gather_dimension", a->tiled ? ndim : ndim + 1,
                     &a->dim) < 0)
    return -1;
  a->n = 0;
  return need_n ? coll_shape_axis_n(prim, p, &a->n) : 0;
}

int coll_shape_all_gather(const AVal *in, int nin, const Params *p, AVal *out) {
  GatherArgs a;
  if (coll_shape_same(in, nin, out) < 0 || gather_args(p, in[0].ndim, &a, true) < 0)
    return -1;
  if (a.tiled)
    out->shape[a.dim] *= a.n;
  else if (out->ndim >= SHM_MAXDIM)
    return err_set(ERR_VALUE, "all_gather: result would have more than %d "
                   "dimensions", SHM_MAXDIM), -1;
  else
    coll_shape_insert(out, a.dim, a.n);
  return 0;
}

/* The length along the gathered dimension of a block of operand [in]. */
static int64_t gather_len(const Array *in, const GatherArgs *a) {
  return a->tiled ? in->shape[a->dim] : 1;
}

/* Where participant q's block goes in the output. */
static void gather_dst(View *dst, const Array *out, const GatherArgs *a, int q,
                       int64_t len) {
  coll_view_of(dst, out);
  if (a->tiled) {
    coll_view_slice(dst, a->dim, q * len, len);
  } else {
    coll_view_slice(dst, a->dim, q, 1);
    coll_view_drop(dst, a->dim);
  }
}

/* Each participant copies its own block into the first participant's
 * output, which all of them then share (coll_share_output; the final barrier
 * publishes the writes): the output is written once in all, where a copy
 * of every block into every output writes it n times (n^2 blocks, 1 GiB
 * for 16 MiB blocks on 8 devices).  Inline (small) outputs cannot be
 * shared: each participant then copies every block into its own. */
static int fast_gather(const Call *c, const GatherArgs *a) {
  bool shared = coll_can_share(c) && coll_peer_out(c, 0)->contiguous;
  Array *out = shared ? coll_peer_out(c, 0) : c->out[0];
  int from = shared ? c->pos : 0, to = shared ? c->pos + 1 : c->n;
  for (int q = from; q < to; q++) {
    View src, dst;
    coll_view_of(&src, coll_peer_in(c, q, 0));
    gather_dst(&dst, out, a, q, a->tiled ? src.shape[a->dim] : 1);
    coll_view_copy(&dst, &src);
  }
  if (shared) coll_share_output(c);
  return 0;
}

static int map_gather(const Call *c, const void *arg, int64_t *idx) {
  const GatherArgs *a = arg;
  int q;
  if (a->tiled) {
    int64_t b = c->in[0]->shape[a->dim];
    q = (int)(idx[a->dim] / b);
    idx[a->dim] %= b;
  } else {
    q = (int)idx[a->dim];
    coll_idx_delete(idx, c->out[0]->ndim, a->dim);
  }
  return q;
}

/* Runs the common body of the data-movement collectives: rendezvous, the
 * fast or reference movement, the final barrier. */
static int move_kernel(Call *c, int (*fast)(const Call *, const void *),
                       RefMap map, const void *arg) {
  if (c->cross) return coll_x_run(c, coll_x_exchange, fast, arg, NULL);
  if (coll_rendezvous(c) < 0) return -1;
  int rc = 0;
  if (!c->g->reference) {
    rc = fast(c, arg);
  } else {
    Global gl;
    rc = coll_global_gather(&gl, c, 0);
    if (rc == 0) {
      coll_ref_fill(c, &gl, c->out[0], map, arg);
      coll_global_free(&gl);
    }
  }
  coll_leave(c);
  return rc;
}

static int fast_gather_v(const Call *c, const void *a) { return fast_gather(c, a); }

char *coll_x_gather_at(const Call *c, int q) {
  const Slot *me = &c->g->slots[c->rank];
  View dst;
  gather_dst(&dst, me->xres, me->xgather, q, gather_len(c->in[0], me->xgather));
  return dst.base;
}

/* The leader's exchange of an all_gather (an XExchange; arg: the
 * GatherArgs): coll_x_exchange's messages (each block once to each process),
 * received straight into the leader's output when it is contiguous, its
 * blocks are runs of memory, and every local output can share it (else
 * into proxies, as for other collectives). */
static int x_gather(const Call *c, const XLocal *lc, const void *arg) {
  const GatherArgs *a = arg;
  Slot *me = &c->g->slots[c->rank];
  Array *o = c->out[0];
  int64_t outer = 1;
  for (int d = 0; d < a->dim; d++) outer *= o->shape[d];
  bool direct = o->contiguous && o->ndim > 0 && outer == 1;
  for (int l = 0; direct && l < lc->n; l++) direct = c->g->slots[lc->peers[l]].shareable;
  if (direct) me->xres = o, me->xgather = a;
  int rc = coll_x_exchange(c, lc, arg);
  me->xgather = NULL;
  return rc;
}

/* Every local participant's part after x_gather: its own block into the
 * leader's output, which its output then shares (the final barrier
 * publishes the writes); fast_gather from the proxies otherwise. */
static int x_gather_local(const Call *c, const void *arg) {
  const GatherArgs *a = arg;
  int lead = 0;
  while (!coll_x_local(c->g, c->peers[lead])) lead++;
  Array *res = c->g->slots[c->peers[lead]].xres;
  if (!res) return fast_gather(c, a);
  View src, dst;
  coll_view_of(&src, c->in[0]);
  gather_dst(&dst, res, a, c->pos, gather_len(c->in[0], a));
  coll_view_copy(&dst, &src);
  if (c->out[0] != res) arr_share_buffer(c->out[0], res);
  return 0;
}

/* Semantics: jax.lax.all_gather (axis, tiled, axis_index_groups). */
int coll_kernel_all_gather(Array **in, int nin, const Params *p, Array **out) {
  Call c;
  GatherArgs a;
  (void)nin;
  if (coll_call_init(&c, P_ALL_GATHER, p, in, 1, out) < 0 ||
      gather_args(p, in[0]->ndim, &a, false) < 0 ||
      coll_check_axis_size("all_gather", p, c.n) < 0)
    return -1;
  a.n = c.n;
  if (c.cross) return coll_x_run(&c, x_gather, x_gather_local, &a, NULL);
  return move_kernel(&c, fast_gather_v, map_gather, &a);
}

uint32_t coll_vma_all_gather(const uint32_t *in, int nin, const Params *p) {
  return coll_vma_remove(in, nin, p);
}

/* ---- psum_scatter (reduce_scatter) ---------------------------------------------- */

static int scatter_args(const Params *p, const AVal *in, GatherArgs *a) {
  const char *prim = "psum_scatter";
  if (coll_param_bool(prim, p, "tiled", &a->tiled) < 0 ||
      coll_param_dim(prim, p, "scatter_dimension", in->ndim, &a->dim) < 0 ||
      coll_shape_axis_n(prim, p, &a->n) < 0)
    return -1;
  int64_t size = in->shape[a->dim];
  if (!a->tiled && size != a->n)
    return err_set(ERR_VALUE, "psum_scatter: scatter_dimension %d has size "
                   "%lld, which must equal the axis size %lld when "
                   "tiled=False", a->dim, (long long)size, (long long)a->n), -1;
  if (a->tiled && size % a->n != 0)
    return err_set(ERR_VALUE, "psum_scatter: scatter_dimension %d has size "
                   "%lld, which the axis size %lld does not divide", a->dim,
                   (long long)size, (long long)a->n), -1;
  return 0;
}

int coll_shape_psum_scatter(const AVal *in, int nin, const Params *p, AVal *out) {
  GatherArgs a;
  if (coll_shape_same(in, nin, out) < 0 || scatter_args(p, &in[0], &a) < 0) return -1;
  if (a.tiled)
    out->shape[a.dim] /= a.n;
  else
    coll_shape_delete(out, a.dim);
  return 0;
}

/* This device's block of participant q's operand. */
static void scatter_src(View *src, const Call *c, int q, const GatherArgs *a) {
  coll_view_of(src, coll_peer_in(c, q, 0));
  if (a->tiled) {
    int64_t b = src->shape[a->dim] / a->n;
    coll_view_slice(src, a->dim, c->pos * b, b);
  } else {
    coll_view_slice(src, a->dim, c->pos, 1);
    coll_view_drop(src, a->dim);
  }
}

static int ref_scatter(const Call *c, const GatherArgs *a, const RedArg *r) {
  Global gl;
  if (coll_global_gather(&gl, c, 0) < 0) return -1;
  Array *out = c->out[0];
  size_t es = dt_size(out->dtype);
  for (int64_t f = 0; f < out->size; f++) {
    int64_t idx[SHM_MAXDIM + 1];
    char *o = (char *)arr_data(out) + (size_t)f * es;
    coll_unravel(f, out->ndim, out->shape, idx);
    if (a->tiled)
      idx[a->dim] += c->pos * (c->in[0]->shape[a->dim] / a->n);
    else
      coll_idx_insert(idx, out->ndim, a->dim, c->pos);
    memcpy(o, coll_global_at(&gl, 0, idx), es);
    for (int q = 1; q < c->n; q++) coll_inner_reduce(o, coll_global_at(&gl, q, idx), 1, 1, 1, r);
  }
  coll_global_free(&gl);
  return 0;
}

static int fast_scatter(const Call *c, const GatherArgs *a, const RedArg *r) {
  View dst, src;
  coll_view_of(&dst, c->out[0]);
  for (int q = 0; q < c->n; q++) {
    scatter_src(&src, c, q, a);
    if (q == 0)
      coll_view_copy(&dst, &src);
    else
      coll_view_each2(&dst, &src, coll_inner_reduce, r);
  }
  return 0;
}

typedef struct XScatter {
  const GatherArgs *a;
  const RedArg *r;
} XScatter;

/* Across processes: each participant's block folded in participant
 * order from the local operands and the proxies, which hold just the
 * blocks this process's participants take (x_scatter_exchange). */
static int x_scatter(const Call *c, const void *arg) {
  const XScatter *xs = arg;
  return fast_scatter(c, xs->a, xs->r);
}

static int x_scatter_exchange(const Call *c, const XLocal *lc, const void *arg);

/* Semantics: jax.lax.psum_scatter (scatter_dimension, tiled, groups). */
int coll_kernel_psum_scatter(Array **in, int nin, const Params *p, Array **out) {
  Call c;
  GatherArgs a;
  AVal av;
  (void)nin;
  if (coll_call_init(&c, P_PSUM_SCATTER, p, in, 1, out) < 0) return -1;
  coll_aval_from(in[0], &av);
  if (coll_param_bool("psum_scatter", p, "tiled", &a.tiled) < 0 ||
      coll_param_dim("psum_scatter", p, "scatter_dimension", av.ndim, &a.dim) < 0 ||
      coll_check_axis_size("psum_scatter", p, c.n) < 0)
    return -1;
  a.n = c.n;
  RedArg r = {in[0]->dtype, RED_SUM};
  if (c.cross) {
    XScatter xs = {&a, &r};
    return coll_x_run(&c, x_scatter_exchange, x_scatter, &xs, NULL);
  }
  if (coll_rendezvous(&c) < 0) return -1;
  int rc = c.g->reference ? ref_scatter(&c, &a, &r) : fast_scatter(&c, &a, &r);
  coll_leave(&c);
  return rc;
}

uint32_t coll_vma_psum_scatter(const uint32_t *in, int nin, const Params *p) {
  return coll_vma_add(in, nin, p);
}

/* ---- ppermute --------------------------------------------------------------------- */

int coll_shape_ppermute(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)p;
  return coll_shape_same(in, nin, out);
}

/* Finds the source of position [me] in perm (pairs (src, dst) over an axis
 * of [size]); *src = -1 when none.  Errors: malformed pairs, indices out of
 * range, a source or a destination named twice. */
static int perm_source(const Params *p, int size, int me, int *src) {
  Value *perm = params_get(p, "perm");
  size_t n, two;
  Value *const *pairs, *const *sd;
  if (!perm || !val_seq(perm, &n, &pairs))
    return err_set(ERR_TYPE, "ppermute: perm must be a tuple of (source, "
                   "destination) pairs"), -1;
  *src = -1;
  for (size_t i = 0; i < n; i++) {
    if (!val_seq(pairs[i], &two, &sd) || two != 2 || !coll_is_intlike(sd[0]) ||
        !coll_is_intlike(sd[1]))
      return err_set(ERR_TYPE, "ppermute: perm must be a tuple of (source, "
                     "destination) pairs of ints"), -1;
    int64_t s = coll_elem_i64((Array *)sd[0], 0), d = coll_elem_i64((Array *)sd[1], 0);
    if (s < 0 || s >= size || d < 0 || d >= size)
      return err_set(ERR_VALUE, "ppermute: pair (%lld, %lld) is out of range "
                     "for an axis of size %d", (long long)s, (long long)d,
                     size), -1;
    for (size_t j = 0; j < i; j++) {
      val_seq(pairs[j], &two, &sd);
      if (coll_elem_i64((Array *)sd[0], 0) == s)
        return err_set(ERR_VALUE, "ppermute: source %lld appears twice in "
                       "perm", (long long)s), -1;
      if (coll_elem_i64((Array *)sd[1], 0) == d)
        return err_set(ERR_VALUE, "ppermute: destination %lld appears twice "
                       "in perm", (long long)d), -1;
    }
    if (d == me) *src = (int)s;
  }
  return 0;
}

static int fast_permute(const Call *c, const void *arg) {
  int src = *(const int *)arg;
  Array *out = c->out[0];
  if (src < 0) {
    memset(arr_data(out), 0, (size_t)out->size * dt_size(out->dtype));
    return 0;
  }
  View d, s;
  coll_view_of(&d, out);
  coll_view_of(&s, coll_peer_in(c, src, 0));
  coll_view_copy(&d, &s);
  return 0;
}

static int map_permute(const Call *c, const void *arg, int64_t *idx) {
  (void)c, (void)idx;
  return *(const int *)arg;
}

/* Semantics: jax.lax.ppermute; positions that receive nothing get zeros. */
int coll_kernel_ppermute(Array **in, int nin, const Params *p, Array **out) {
  Call c;
  int src;
  (void)nin;
  if (coll_call_init(&c, P_PPERMUTE, p, in, 1, out) < 0 ||
      perm_source(p, c.n, c.pos, &src) < 0)
    return -1;
  return move_kernel(&c, fast_permute, map_permute, &src);
}

uint32_t coll_vma_ppermute(const uint32_t *in, int nin, const Params *p) {
  return coll_vma_add(in, nin, p);
}

/* ---- all_to_all --------------------------------------------------------------------- */

typedef struct A2AArgs {
  int split, concat;
  bool tiled;
  int64_t n;
  int64_t b;                      /* tiled: split_axis / n */
  int64_t chunk_c;                /* tiled: a received chunk's size along concat */
} A2AArgs;

static int a2a_args(const Params *p, const AVal *in, int64_t n, A2AArgs *a) {
  const char *prim = "all_to_all";
  if (coll_param_bool(prim, p, "tiled", &a->tiled) < 0 ||
      coll_param_dim(prim, p, "split_axis", in->ndim, &a->split) < 0 ||
      coll_param_dim(prim, p, "concat_axis", in->ndim, &a->concat) < 0)
    return -1;
  int64_t size = in->shape[a->split];
  a->n = n;
  if (!a->tiled && size != n)
    return err_set(ERR_VALUE, "all_to_all: split_axis %d has size %lld, which "
                   "must equal the axis size %lld when tiled=False", a->split,
                   (long long)size, (long long)n), -1;
  if (a->tiled && size % n != 0)
    return err_set(ERR_VALUE, "all_to_all: split_axis %d has size %lld, which "
                   "the axis size %lld does not divide", a->split,
                   (long long)size, (long long)n), -1;
  a->b = size / n;
  a->chunk_c = a->split == a->concat ? a->b : in->shape[a->concat];
  return 0;
}

int coll_shape_all_to_all(const AVal *in, int nin, const Params *p, AVal *out) {
  A2AArgs a;
  int64_t n;
  if (coll_shape_same(in, nin, out) < 0 || coll_shape_axis_n("all_to_all", p, &n) < 0 ||
      a2a_args(p, &in[0], n, &a) < 0)
    return -1;
  if (a.tiled) {
    out->shape[a.split] /= n;
    out->shape[a.concat] *= n;
  } else {
    coll_shape_delete(out, a.split);
    coll_shape_insert(out, a.concat, n);
  }
  return 0;
}

/* Where output [o] takes participant q's slice: along the concat axis,
 * [q * chunk_c, (q + 1) * chunk_c), or q when not tiled (that axis kept,
 * of size 1: row-major, the same elements in the same order as the
 * slice x_a2a_slice takes). */
static void a2a_dst(View *dst, const Array *o, const A2AArgs *a, int q) {
  coll_view_of(dst, o);
  if (a->tiled)
    coll_view_slice(dst, a->concat, q * a->chunk_c, a->chunk_c);
  else
    coll_view_slice(dst, a->concat, q, 1);
}

/* This device's output's block from participant [q]. */
static void a2a_copy(const Call *c, const A2AArgs *a, int q) {
  View src, dst;
  coll_view_of(&src, coll_peer_in(c, q, 0));
  a2a_dst(&dst, c->out[0], a, q);
  if (a->tiled) {
    coll_view_slice(&src, a->split, c->pos * a->b, a->b);
  } else {
    coll_view_slice(&src, a->split, c->pos, 1);
    coll_view_drop(&src, a->split);
    coll_view_drop(&dst, a->concat);
  }
  coll_view_copy(&dst, &src);
}

static int fast_a2a(const Call *c, const void *arg) {
  for (int q = 0; q < c->n; q++) a2a_copy(c, arg, q);
  return 0;
}

/* Across processes (x_a2a): the blocks from the local participants; the
 * leader received the others' into the outputs. */
static int x_a2a_local(const Call *c, const void *arg) {
  for (int q = 0; q < c->n; q++)
    if (coll_x_local(c->g, c->peers[q])) a2a_copy(c, arg, q);
  return 0;
}

/* ---- all_to_all across processes: each process gets only its slices ---------- */

/* Slice [p] of operand [a] (what participant p takes of it): along the
 * split axis, [p * b, (p + 1) * b) with b = 1 when not tiled. */
static void x_a2a_slice(View *v, const Array *a, const A2AArgs *g, int p) {
  int64_t b = g->tiled ? g->b : 1;
  coll_view_of(v, a);
  coll_view_slice(v, g->split, p * b, b);
}

/* Whether slices of a contiguous array of [a]'s shape are contiguous
 * runs of memory (nothing before the split axis): they are then sent
 * from, and received into, the arrays themselves. */
static bool x_a2a_runs(const Array *a, const A2AArgs *g) {
  int64_t outer = 1;
  for (int d = 0; d < g->split; d++) outer *= a->shape[d];
  return outer == 1;
}

/* Whether [a]'s own slices are such runs. */
static bool x_a2a_flat(const Array *a, const A2AArgs *g) {
  return (a->contiguous || a->ndim == 0) && x_a2a_runs(a, g);
}

/* [v] made a row-major view of its own shape over [buf]. */
static void x_packed(View *v, char *buf) {
  v->base = buf;
  for (int d = v->ndim - 1, st = 1; d >= 0; st *= (int)v->shape[d], d--) v->strides[d] = st;
}

/* The positions of process [proc]'s participants, in order, into [pos]; their number. */
static int x_positions(const Call *c, int proc, int *pos) {
  int m = 0;
  for (int q = 0; q < c->n; q++)
    if (coll_x_proc(c->g, c->peers[q]) == proc) pos[m++] = q;
  return m;
}

/* State of one leader's x_a2a (or x_scatter_exchange). */
typedef struct XA2A {
  const Call *c;
  const XLocal *lc;
  const A2AArgs *a;
  size_t slice;                   /* bytes of one slice */
  Array **tab;                    /* the leader slot's xin */
  char **packs;                   /* [np]: packed slices sent, or received */
  size_t *pack_bytes;
  void **reqs;                    /* [2 * np] */
  int nreqs;
  /* where local participant lc->peers[l] takes participant q's slice,
   * and whether those places are runs of memory for every q */
  void (*dst)(View *v, const struct XA2A *s, int l, int q);
  bool (*dst_runs)(const struct XA2A *s, int l);
} XA2A;

/* all_to_all: into the output's block from q. */
static void x_a2a_dst(View *v, const XA2A *s, int l, int q) {
  a2a_dst(v, s->c->g->slots[s->lc->peers[l]].out[0], s->a, q);
}

static bool x_a2a_dst_runs(const XA2A *s, int l) {
  const Array *o = s->c->g->slots[s->lc->peers[l]].out[0];
  int64_t outer = 1;
  for (int d = 0; d < s->a->concat; d++) outer *= o->shape[d];
  return (o->contiguous || o->ndim == 0) && outer == 1;
}

/* Sends the header, then to each other process procs[i] the slices its
 * participants take of this process's operands (local participant-major). */
static int x_a2a_send(XA2A *s, const XLocal *lc, char *h, const int *procs, int np) {
  const Call *c = s->c;
  int key = coll_x_key(c->g, c->seq, c->peers[0]), pos[c->n];
  TransportIov hv = {h, coll_x_header_pack(h, c, lc, 0)};
  for (int i = 0; i < np; i++) {
    int m = x_positions(c, procs[i], pos), k = 0;
    TransportIov iov[lc->n * m + 1];
    char *pack = NULL;
    for (int l = 0; l < lc->n; l++) {
      const Array *op = c->g->slots[lc->peers[l]].in[0];
      bool flat = x_a2a_flat(op, s->a);
      if (!flat && !pack) {
        s->pack_bytes[i] = s->slice * (size_t)(lc->n * m) + 1;
        if (!(pack = s->packs[i] = shm_buf_alloc(s->pack_bytes[i]))) return err_nomem(), -1;
      }
      for (int j = 0; j < m; j++, k++) {
        View v;
        x_a2a_slice(&v, op, s->a, pos[j]);
        char *at = flat ? v.base : pack + s->slice * (size_t)k;
        if (!flat) {
          View dst = v;
          x_packed(&dst, at);
          coll_view_copy(&dst, &v);
        }
        iov[k] = (TransportIov){at, s->slice};
      }
    }
    s->reqs[s->nreqs++] = transport_isend(procs[i], transport_tag(TRANSPORT_HEADER, key), &hv, 1);
    s->reqs[s->nreqs++] = transport_isend(procs[i], transport_tag(TRANSPORT_DATA, key), iov, k);
  }
  return 0;
}

/* Receives process [proc]'s header and the slices of its participants'
 * operands that this process's participants [lc] take, straight into
 * their outputs where the block is a run of memory, else through a
 * buffer. */
static int x_a2a_recv(XA2A *s, const XLocal *lc, int proc, int i) {
  const Call *c = s->c;
  int key = coll_x_key(c->g, c->seq, c->peers[0]);
  TransportMsg *m = coll_x_wait_header(c, proc, transport_tag(TRANSPORT_HEADER, key));
  if (!m) return -1;
  XHeader h;
  if (coll_x_header_read(m, &h) < 0) {
    transport_msg_free(m);
    return -1;
  }
  int nr = h.nloc, rs[nr], k = 0;
  memcpy(rs, h.ranks, sizeof(int) * (size_t)nr);
  int rc = coll_desc_equal(&h.desc, &c->desc)
               ? 0 : coll_mismatch_error(c->g, c->rank, &c->desc, rs[0], &h.desc);
  transport_msg_free(m);
  if (rc < 0) return -1;
  TransportIov iov[nr * lc->n + 1];
  bool flat[lc->n];
  for (int l = 0; l < lc->n; l++) {
    flat[l] = s->dst_runs(s, l);
    if (!flat[l] && !s->packs[i]) {
      s->pack_bytes[i] = s->slice * (size_t)(nr * lc->n) + 1;
      if (!(s->packs[i] = shm_buf_alloc(s->pack_bytes[i]))) return err_nomem(), -1;
    }
  }
  int qs[nr > 0 ? nr : 1];
  for (int r = 0; r < nr; r++) {
    int q = qs[r] = coll_x_position(c, rs[r]);
    if (q < 0) return -1;
    for (int l = 0; l < lc->n; l++, k++) {
      View dst;
      s->dst(&dst, s, l, q);
      iov[k] = (TransportIov){flat[l] ? dst.base : s->packs[i] + s->slice * (size_t)k, s->slice};
    }
  }
  if (transport_recv_data(proc, transport_tag(TRANSPORT_DATA, key), iov, k) < 0) return -1;
  for (int r = 0, k2 = 0; r < nr; r++)
    for (int l = 0; l < lc->n; l++, k2++) {
      if (flat[l]) continue;
      View dst, src;
      s->dst(&dst, s, l, qs[r]);
      src = dst;
      x_packed(&src, s->packs[i] + s->slice * (size_t)k2);
      coll_view_copy(&dst, &src);
    }
  return 0;
}

/* x_a2a's exchange with [s] set up (c, lc, a, dst, dst_runs): each
 * process sends each other one the slices its participants take, then
 * receives theirs; with [proxies] the remote participants' operands get
 * proxies in the table first (x_scatter_exchange's places). */
static int x_a2a_run(XA2A *s, bool proxies) {
  const Call *c = s->c;
  const XLocal *lc = s->lc;
  Slot *me = &c->g->slots[c->rank];
  int n = c->n, procs[n], np = coll_x_procs(c, procs);
  s->slice = (size_t)c->in[0]->size / (size_t)n * dt_size(c->in[0]->dtype);
  s->tab = coll_x_tab(me, n);
  s->packs = shm_calloc((size_t)(2 * np) + 1, sizeof(char *));
  s->pack_bytes = shm_calloc((size_t)(2 * np) + 1, sizeof(size_t));
  s->reqs = shm_calloc((size_t)(2 * np) + 1, sizeof(void *));
  char *h = shm_malloc(coll_x_wire_cap(lc->n));
  me->xin = s->tab;
  me->xn = n;
  me->xnin = 1;
  int rc = s->tab && s->packs && s->pack_bytes && s->reqs && h ? 0 : (err_nomem(), -1);
  for (int q = 0; rc == 0 && q < n; q++)
    if (coll_x_local(c->g, c->peers[q]))
      s->tab[q] = c->g->slots[c->peers[q]].in[0];
    else if (proxies && !(s->tab[q] = coll_x_proxy(me, q, c->in[0])))
      rc = -1;
  if (rc == 0) rc = x_a2a_send(s, lc, h, procs, np);
  /* from the next process up first, as a pairwise exchange goes: at each
   * step every process reads from a different one */
  int first = 0;
  while (first < np && procs[first] < transport_rank()) first++;
  for (int k = 0; rc == 0 && k < np; k++) {
    int i = (first + k) % np;
    rc = x_a2a_recv(s, lc, procs[i], np + i);
  }
  coll_x_wait_sends(c, s->reqs, s->nreqs, rc);
  for (int i = 0; s->packs && i < 2 * np; i++)
    if (s->packs[i]) shm_buf_free(s->packs[i], s->pack_bytes[i]);
  shm_free(s->packs), shm_free(s->pack_bytes), shm_free(s->reqs), shm_free(h);
  return rc;
}

/* The leader's exchange of an all_to_all (an XExchange; arg: the
 * A2AArgs): every process sends each other one only the slices its
 * participants take, received into their outputs; x_a2a_local then
 * copies the local participants' blocks. */
static int x_a2a(const Call *c, const XLocal *lc, const void *arg) {
  XA2A s = {.c = c, .lc = lc, .a = arg, .dst = x_a2a_dst, .dst_runs = x_a2a_dst_runs};
  return x_a2a_run(&s, false);
}

/* psum_scatter across processes: participant q's slice that local
 * participant lc->peers[l] takes goes into q's proxy, at that slice. */
static void x_scatter_dst(View *v, const XA2A *s, int l, int q) {
  int pos = 0;
  while (s->c->peers[pos] != s->lc->peers[l]) pos++;
  x_a2a_slice(v, s->tab[q], s->a, pos);
}

/* The proxies are contiguous arrays of the operand's shape. */
static bool x_scatter_dst_runs(const XA2A *s, int l) {
  (void)l;
  return x_a2a_runs(s->c->in[0], s->a);
}

/* The leader's exchange of a psum_scatter (an XExchange; arg: the
 * XScatter), as MPI_Reduce_scatter_block moves data: every process sends
 * each other one only the blocks its participants take of this
 * process's operands (an all_to_all's exchange over the scatter
 * dimension), into proxies of the remote operands, from which x_scatter
 * folds each block in participant order (so the bits are a one-process
 * run's). */
static int x_scatter_exchange(const Call *c, const XLocal *lc, const void *arg) {
  const GatherArgs *g = ((const XScatter *)arg)->a;
  A2AArgs a = {.split = g->dim, .concat = g->dim, .tiled = g->tiled, .n = g->n,
               .b = g->tiled ? c->in[0]->shape[g->dim] / g->n : 1};
  XA2A s = {.c = c, .lc = lc, .a = &a, .dst = x_scatter_dst, .dst_runs = x_scatter_dst_runs};
  return x_a2a_run(&s, true);
}

static int map_a2a(const Call *c, const void *arg, int64_t *idx) {
  const A2AArgs *a = arg;
  int q;
  if (a->tiled) {
    q = (int)(idx[a->concat] / a->chunk_c);
    idx[a->concat] %= a->chunk_c;
    idx[a->split] += c->pos * a->b;
  } else {
    q = (int)idx[a->concat];
    coll_idx_delete(idx, c->out[0]->ndim, a->concat);
    coll_idx_insert(idx, c->out[0]->ndim - 1, a->split, c->pos);
  }
  return q;
}

/* Semantics: jax.lax.all_to_all, tiled and not (not tiled: the split axis
 * must be n long; it is removed and a new n-long axis appears at
 * concat_axis, np.insert(np.delete(shape, split), concat, n)). */
int coll_kernel_all_to_all(Array **in, int nin, const Params *p, Array **out) {
  Call c;
  A2AArgs a;
  AVal av;
  (void)nin;
  if (coll_call_init(&c, P_ALL_TO_ALL, p, in, 1, out) < 0) return -1;
  coll_aval_from(in[0], &av);
  if (a2a_args(p, &av, c.n, &a) < 0 || coll_check_axis_size("all_to_all", p, c.n) < 0)
    return -1;
  if (c.cross) return coll_x_run(&c, x_a2a, x_a2a_local, &a, NULL);
  return move_kernel(&c, fast_a2a, map_a2a, &a);
}

uint32_t coll_vma_all_to_all(const uint32_t *in, int nin, const Params *p) {
  return coll_vma_add(in, nin, p);
}

/* ==== all_gather, psum_scatter, ppermute, all_to_all: differentiation and
 * batching ===================================================================== */

/* ---- JVP: each is linear in its operand ------------------------------------ */

COLL_JVP_LINEAR(all_gather, ALL_GATHER)
COLL_JVP_LINEAR(psum_scatter, PSUM_SCATTER)
COLL_JVP_LINEAR(ppermute, PPERMUTE)
COLL_JVP_LINEAR(all_to_all, ALL_TO_ALL)

/* ---- transpose -------------------------------------------------------------- */

/* all_gather (invariant result): this device's own slice of the
 * cotangent along the gathered dimension. */
static int tr_all_gather(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                         const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin;
  int64_t dim;
  bool tiled = false;
  uint32_t extra;
  if (coll_grouped(p)) {   /* a varying result: the group's cotangents summed and scattered */
    Params q;
    coll_params_except(&q, p, "all_gather_dimension");
    params_add(&q, "scatter_dimension", val_incref(params_get(p, "all_gather_dimension")));
    return (cts[0] = coll_rule_apply(P_PSUM_SCATTER, 1, ct, &q, true)) ? 0 : -1;
  }
  if (coll_invariant_axes(p, &av[0], &extra) < 0 ||
      params_int(p, "all_gather_dimension", &dim) < 0 ||
      (params_get(p, "tiled") && params_bool(p, "tiled", &tiled) < 0))
    return -1;
  Params q;
  params_init(&q);
  params_add(&q, "axis_name", val_incref(params_get(p, "axis_name")));
  Value *idx = prim_bind(P_AXIS_INDEX, 0, NULL, &q);   /* staged too: it has no operand */
  params_clear(&q);
  if (!idx) return -1;
  int nd = av[0].ndim + (tiled ? 0 : 1);
  int64_t sizes[SHM_MAXDIM];
  Value *ops[SHM_MAXDIM + 1];
  Value *zero = val_int(0), *start = NULL;
  Params none;
  params_init(&none);
  if (tiled) {
    Value *bs = val_int(av[0].shape[dim]);
    start = coll_rule_apply(P_MUL, 2, (Value *[]){idx, bs}, &none, false);
    val_decref(bs);
  } else {
    start = val_incref(idx);
  }
  ops[0] = ct[0];
  for (int d = 0, k = 0; d < nd; d++) {
    ops[d + 1] = d == dim ? start : zero;
    sizes[d] = d == dim ? (tiled ? av[0].shape[dim] : 1) : av[0].shape[k];
    if (d != dim || tiled) k++;
  }
  Value *sl = NULL;
  if (start) {
    params_init(&q);
    params_add(&q, "slice_sizes", val_int_tuple(nd, sizes));
    sl = coll_rule_apply(P_DYNAMIC_SLICE, nd + 1, ops, &q, true);
  }
  Value *r = sl;
  if (sl && !tiled) {
    params_init(&q);
    params_add(&q, "new_sizes", val_int_tuple(av[0].ndim, av[0].shape));
    params_add(&q, "dimensions", val_incref(VAL_NONE));
    r = coll_rule_apply(P_RESHAPE, 1, &sl, &q, true);
    val_decref(sl);
  }
  val_decref(idx);
  val_decref(zero);
  if (start) val_decref(start);
  cts[0] = r ? coll_psum_over(r, extra) : NULL;
  if (r) val_decref(r);
  return cts[0] ? 0 : -1;
}

/* psum_scatter: all_gather of the cotangent */
static int tr_psum_scatter(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                           const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin;
  uint32_t extra;
  if (coll_invariant_axes(p, &av[0], &extra) < 0) return -1;
  Params q;
  coll_params_except(&q, p, "scatter_dimension");
  params_add(&q, "all_gather_dimension", val_incref(params_get(p, "scatter_dimension")));
  Value *g = coll_rule_apply(P_ALL_GATHER, 1, ct, &q, true);
  cts[0] = g ? coll_psum_over(g, extra) : NULL;
  if (g) val_decref(g);
  return cts[0] ? 0 : -1;
}

/* ppermute: the inverse permutation */
static int tr_ppermute(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                       const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin;
  uint32_t extra;
  size_t n, k;
  Value *const *items, *const *pr;
  if (coll_invariant_axes(p, &av[0], &extra) < 0) return -1;
  Value *perm = params_get(p, "perm");
  if (!perm || !val_seq(perm, &n, &items)) return prim_rule_missing(P_PPERMUTE, "transpose");
  Value *inv = tuple_new(n);
  for (size_t i = 0; inv && i < n; i++) {
    val_seq(items[i], &k, &pr);
    Value *sw = tuple_pack(2, (Value *[]){pr[1], pr[0]});
    tuple_set_steal(inv, i, sw ? sw : val_incref(VAL_NONE));
  }
  Params q;
  coll_params_except(&q, p, "perm");
  params_add(&q, "perm", inv);
  Value *r = coll_rule_apply(P_PPERMUTE, 1, ct, &q, true);
  cts[0] = r ? coll_psum_over(r, extra) : NULL;
  if (r) val_decref(r);
  return cts[0] ? 0 : -1;
}

/* all_to_all: the same with split_axis and concat_axis swapped */
static int tr_all_to_all(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                         const Params *p, Value **cts) {
  (void)in, (void)lin, (void)nin;
  uint32_t extra;
  if (coll_invariant_axes(p, &av[0], &extra) < 0) return -1;
  Params q;
  params_init(&q);
  for (int i = 0; i < p->n; i++) {
    const char *nm = p->p[i].name;
    const char *to = !strcmp(nm, "split_axis") ? "concat_axis"
                   : !strcmp(nm, "concat_axis") ? "split_axis" : nm;
    params_add(&q, to, val_incref(p->p[i].value));
  }
  Value *r = coll_rule_apply(P_ALL_TO_ALL, 1, ct, &q, true);
  cts[0] = r ? coll_psum_over(r, extra) : NULL;
  if (r) val_decref(r);
  return cts[0] ? 0 : -1;
}

/* ---- batching over mesh axes (a vmap inside or around a body) -------------- */

COLL_BATCH_SAME(ppermute, PPERMUTE)

/* all_gather, psum_scatter, all_to_all: the batch axis first and their
 * dimension parameters one further. */
static int batch_shift(PrimId id, const char *const *names, Value **in, const int *dims,
                       const Params *p, Value **out, int *od) {
  Value *x = prim_batch_moveaxis(in[0], dims[0], 0);
  if (!x) return -1;
  Params q;
  params_init(&q);
  for (int i = 0; i < p->n; i++) {
    bool shift = false;
    for (int k = 0; names[k]; k++) shift |= !strcmp(p->p[i].name, names[k]);
    int64_t v;
    if (shift && arr_to_index(p->p[i].value, &v) == 0)
      params_add(&q, p->p[i].name, val_int(v + 1));
    else
      params_add(&q, p->p[i].name, val_incref(p->p[i].value));
  }
  *out = coll_rule_apply(id, 1, &x, &q, true);
  val_decref(x);
  *od = 0;
  return *out ? 0 : -1;
}
static int batch_all_gather(Value **in, const int *dims, int nin, const Params *p,
                            Value **out, int *od) {
  (void)nin;
  return batch_shift(P_ALL_GATHER, (const char *[]){"all_gather_dimension", NULL}, in, dims, p,
                     out, od);
}
static int batch_psum_scatter(Value **in, const int *dims, int nin, const Params *p,
                              Value **out, int *od) {
  (void)nin;
  return batch_shift(P_PSUM_SCATTER, (const char *[]){"scatter_dimension", NULL}, in, dims, p,
                     out, od);
}
static int batch_all_to_all(Value **in, const int *dims, int nin, const Params *p,
                            Value **out, int *od) {
  (void)nin;
  return batch_shift(P_ALL_TO_ALL, (const char *[]){"split_axis", "concat_axis", NULL}, in, dims,
                     p, out, od);
}

/* ---- batching over a vmap or xmap axis the collective names ---------------- */

/* The named axis's whole size: its block times the mesh axes it is split
 * over (xmap axis_resources). */
static int64_t whole_size(const CollNamedAxis *ax) {
  return ax->size * (ax->resources ? ax->res_size : 1);
}

/* all_gather over the vmap axis: the batch stacked where the gathered axis
 * goes (tiled: merged into that axis); the result is the same for every
 * example. */
static Value *named_gather(Value *x, int d, int64_t size, const Params *p) {
  int64_t ax = 0;
  bool tiled = false;
  if (params_int(p, "all_gather_dimension", &ax) < 0 ||
      (params_get(p, "tiled") && params_bool(p, "tiled", &tiled) < 0))
    return NULL;
  Value *m = d >= 0 ? prim_batch_moveaxis(x, d, (int)ax) : NULL;
  if (d < 0) {
    AVal a;
    if (prim_value_aval(x, &a) < 0) return NULL;
    int64_t sh[SHM_MAXDIM], bd[SHM_MAXDIM];
    for (int i = 0, k = 0; i <= a.ndim; i++) {
      sh[i] = i == ax ? size : a.shape[k];
      if (i != ax) bd[k] = i, k++;
    }
    Params q;
    params_init(&q);
    params_add(&q, "shape", val_int_tuple(a.ndim + 1, sh));
    params_add(&q, "broadcast_dimensions", val_int_tuple(a.ndim, bd));
    m = prim_apply(P_BROADCAST_IN_DIM, 1, &x, &q);
    params_clear(&q);
  }
  if (!m || !tiled) return m;
  AVal a;
  prim_value_aval(m, &a);
  int64_t sh[SHM_MAXDIM];
  for (int i = 0, k = 0; i < a.ndim; i++) {
    if (i == ax + 1) continue;
    sh[k++] = i == ax ? a.shape[ax] * a.shape[ax + 1] : a.shape[i];
  }
  Params q;
  params_init(&q);
  params_add(&q, "new_sizes", val_int_tuple(a.ndim - 1, sh));
  params_add(&q, "dimensions", val_incref(VAL_NONE));
  Value *r = prim_apply(P_RESHAPE, 1, &m, &q);
  params_clear(&q);
  val_decref(m);
  return r;
}

/* ppermute over the vmap axis: example dst takes example src's value for
 * each (src, dst) pair, zeros where no pair sends (a gather along the
 * batch axis). */
static Value *named_permute(Value *x, int d, int64_t size, const Params *p, int *od) {
  Value *perm = params_get(p, "perm");
  size_t n, k;
  Value *const *items, *const *pr;
  if (!perm || !val_seq(perm, &n, &items)) return err_set(ERR_VALUE, "ppermute: no perm");
  int64_t one = size;
  Array *idx = arr_zeros(DT_I32, 1, &one), *mask = arr_zeros(DT_BOOL, 1, &one);
  bool all = true;
  if (!idx || !mask) goto fail;
  for (size_t i = 0; i < n; i++) {
    int64_t s, t;
    if (!val_seq(items[i], &k, &pr) || k != 2 || arr_to_index(pr[0], &s) < 0 ||
        arr_to_index(pr[1], &t) < 0 || s < 0 || t < 0 || s >= size || t >= size) {
      err_clear();
      err_set(ERR_VALUE, "ppermute: perm pairs must be indices into the axis of size %lld",
              (long long)size);
      goto fail;
    }
    ((int32_t *)arr_data(idx))[t] = (int32_t)s;
    ((uint8_t *)arr_data(mask))[t] = 1;
  }
  for (int64_t i = 0; i < size; i++) all &= ((uint8_t *)arr_data(mask))[i] != 0;
  if (d < 0) {   /* the same value everywhere: it moves onto itself */
    val_decref(&idx->hdr);
    val_decref(&mask->hdr);
    *od = -1;
    return val_incref(x);
  }
  Params q;
  params_init(&q);
  params_add(&q, "axis", val_int(d));
  Value *g = prim_apply_rule(P_GATHER, 2, (Value *[]){x, &idx->hdr}, &q), *r = g;
  if (g && !all) {   /* zeros where nothing arrives */
    AVal a;
    prim_value_aval(g, &a);
    int64_t bd[1] = {d};
    params_init(&q);
    params_add(&q, "shape", val_int_tuple(a.ndim, a.shape));
    params_add(&q, "broadcast_dimensions", val_int_tuple(1, bd));
    Value *mv = &mask->hdr;
    Value *mb = prim_apply_rule(P_BROADCAST_IN_DIM, 1, &mv, &q);
    Array *z = arr_scalar_f64(a.dtype, 0.0, false);
    r = mb && z ? ops_select(mb, g, &z->hdr) : NULL;
    if (mb) val_decref(mb);
    if (z) val_decref(&z->hdr);
    val_decref(g);
  }
  val_decref(&idx->hdr);
  val_decref(&mask->hdr);
  *od = d;
  return r;
fail:
  if (idx) val_decref(&idx->hdr);
  if (mask) val_decref(&mask->hdr);
  return NULL;
}

/* all_gather over a named axis split over mesh axes (axis_resources): the
 * device's blocks gathered locally ([g], consumed), then the devices'
 * concatenated along the same axis in device order, which is the named
 * axis's order (its block j of device k is index k * block + j). */
static Value *gather_across(const CollNamedAxis *ax, Value *g, const Params *p) {
  if (!g || !ax->resources) return g;
  int64_t dim = 0;
  if (params_int(p, "all_gather_dimension", &dim) < 0) {
    val_decref(g);
    return NULL;
  }
  Params q;
  params_init(&q);
  params_add(&q, "axis_name", val_incref(ax->resources));
  params_add(&q, "all_gather_dimension", val_int(dim));
  params_add(&q, "axis_size", val_int(ax->res_size));
  params_add(&q, "tiled", val_bool(true));
  params_add(&q, "axis_index_groups", val_incref(VAL_NONE));
  Value *r = prim_bind(P_ALL_GATHER, 1, &g, &q);
  params_clear(&q);
  val_decref(g);
  return r;
}

/* ppermute (and pshuffle) over a named axis split over mesh axes: the
 * whole axis gathered from every device, then each device takes, for each
 * position of its block, the source the perm gives it (zeros where none):
 * correct for any permutation, at the cost of one all_gather. */
static Value *permute_across(const CollNamedAxis *ax, Value *x, int d, const Params *p, int *od) {
  int64_t n = whole_size(ax), b = ax->size;
  Value *perm = params_get(p, "perm");
  size_t np, k;
  Value *const *items, *const *pr;
  if (!perm || !val_seq(perm, &np, &items)) return err_set(ERR_VALUE, "ppermute: no perm");
  Array *src = arr_zeros(DT_I32, 1, &n), *has = arr_zeros(DT_BOOL, 1, &n);
  Value *r = NULL, *whole = NULL, *local = NULL, *dev = NULL, *pos = NULL, *si = NULL, *hi = NULL;
  if (!src || !has) goto out;
  for (size_t i = 0; i < np; i++) {
    int64_t s0, t0;
    if (!val_seq(items[i], &k, &pr) || k != 2 || arr_to_index(pr[0], &s0) < 0 ||
        arr_to_index(pr[1], &t0) < 0 || s0 < 0 || t0 < 0 || s0 >= n || t0 >= n) {
      err_clear();
      err_set(ERR_VALUE, "ppermute: perm pairs must be indices into the axis of size %lld", (long long)n);
      goto out;
    }
    ((int32_t *)arr_data(src))[t0] = (int32_t)s0;
    ((uint8_t *)arr_data(has))[t0] = 1;
  }
  /* the whole axis, first: this device's block moved to the front, then
   * every device's concatenated in order */
  local = d >= 0 ? prim_batch_moveaxis(x, d, 0) : prim_batch_repeat_front(x, b);
  if (!local) goto out;
  Params q;
  params_init(&q);
  params_add(&q, "axis_name", val_incref(ax->resources));
  params_add(&q, "all_gather_dimension", val_int(0));
  params_add(&q, "axis_size", val_int(ax->res_size));
  params_add(&q, "tiled", val_bool(true));
  params_add(&q, "axis_index_groups", val_incref(VAL_NONE));
  whole = prim_bind(P_ALL_GATHER, 1, &local, &q);
  params_clear(&q);
  /* this device's positions along the axis, and their sources */
  params_init(&q);
  params_add(&q, "axis_name", val_incref(ax->resources));
  dev = whole ? prim_bind(P_AXIS_INDEX, 0, NULL, &q) : NULL;
  params_clear(&q);
  params_init(&q);
  params_add(&q, "dtype", dtype_value(DT_I32));
  params_add(&q, "shape", val_int_tuple(1, &b));
  params_add(&q, "dimension", val_int(0));
  Value *io = dev ? prim_apply(P_IOTA, 0, NULL, &q) : NULL;
  params_clear(&q);
  Value *bv = io ? val_int(b) : NULL, *start = bv ? ops_binary(OP_MUL, dev, bv) : NULL;
  pos = start ? ops_binary(OP_ADD, io, start) : NULL;
  if (io) val_decref(io);
  if (bv) val_decref(bv);
  if (start) val_decref(start);
  params_init(&q);
  params_add(&q, "axis", val_int(0));
  si = pos ? prim_apply(P_GATHER, 2, (Value *[]){&src->hdr, pos}, &q) : NULL;
  hi = si ? prim_apply(P_GATHER, 2, (Value *[]){&has->hdr, pos}, &q) : NULL;
  Value *g = hi ? prim_apply(P_GATHER, 2, (Value *[]){whole, si}, &q) : NULL;
  params_clear(&q);
  if (g) {   /* zeros where nothing arrives */
    AVal ga;
    prim_value_aval(g, &ga);
    params_init(&q);
    params_add(&q, "shape", val_int_tuple(ga.ndim, ga.shape));
    params_add(&q, "broadcast_dimensions", val_int_tuple(1, (int64_t[]){0}));
    Value *mb = prim_apply(P_BROADCAST_IN_DIM, 1, &hi, &q);
    params_clear(&q);
    Array *z = arr_scalar_f64(ga.dtype, 0.0, false);
    r = mb && z ? ops_select(mb, g, &z->hdr) : NULL;
    if (mb) val_decref(mb);
    if (z) val_decref(&z->hdr);
    val_decref(g);
  }
  *od = 0;
out:
  if (src) val_decref(&src->hdr);
  if (has) val_decref(&has->hdr);
  Value *tmp[] = {whole, local, dev, pos, si, hi};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  return r;
}

/* JAX has no pprod: the product over a named axis (collective.h). */
Value *coll_named_gathered(PrimId reduce, Value *x, Value *nm, int64_t size, bool carried) {
  Params q;
  params_init(&q);
  params_add(&q, "axis_name", tuple_pack(1, &nm));
  params_add(&q, "all_gather_dimension", val_int(0));
  params_add(&q, "axis_size", val_int(size));
  params_add(&q, "tiled", val_bool(false));
  params_add(&q, "axis_index_groups", val_incref(VAL_NONE));
  Value *g = carried ? prim_bind(P_ALL_GATHER, 1, &x, &q) : prim_batch_repeat_front(x, size);
  params_clear(&q);
  if (!g) return NULL;
  params_init(&q);
  params_add(&q, "axes", val_int_tuple(1, (int64_t[]){0}));
  Value *r = prim_bind(reduce, 1, &g, &q);
  params_clear(&q);
  val_decref(g);
  return r;
}

/* all_gather over the vmap axis alone (CollNamedBatchRule). */
static int batch_named_gather(PrimId id, Value *x, int d, const CollNamedAxis *ax, Value *rest,
                              const Params *p, Value **out, int *od) {
  (void)id;
  *od = -1;
  if (rest) return COLL_NAMED_MISSING;
  return (*out = gather_across(ax, named_gather(x, d, ax->size, p), p)) ? 0 : -1;
}

/* ppermute over the vmap axis alone (CollNamedBatchRule). */
static int batch_named_permute(PrimId id, Value *x, int d, const CollNamedAxis *ax, Value *rest,
                               const Params *p, Value **out, int *od) {
  (void)id;
  *od = -1;
  if (rest) return COLL_NAMED_MISSING;
  *out = ax->resources ? permute_across(ax, x, d, p, od) : named_permute(x, d, ax->size, p, od);
  return *out ? 0 : -1;
}

/* Ring all-gather: each device forwards n - 1 blocks of its operand's
 * size. */
static void traffic_all_gather(double b, int n, CollTraffic *t) {
  *t = (CollTraffic){"ring all-gather", b * (n - 1), b * (n - 1), n - 1};
}

/* Ring reduce-scatter: n - 1 rounds of one 1/n piece of the operand. */
static void traffic_reduce_scatter(double b, int n, CollTraffic *t) {
  *t = (CollTraffic){"ring reduce-scatter", b * (n - 1) / n, b * (n - 1) / n, n - 1};
}

/* ppermute: the whole operand to one peer, in one round. */
static void traffic_permute(double b, int n, CollTraffic *t) {
  (void)n;
  *t = (CollTraffic){"point-to-point", b, b, 1};
}

/* all_to_all: a 1/n chunk to each of the n - 1 others, all at once. */
static void traffic_all_to_all(double b, int n, CollTraffic *t) {
  *t = (CollTraffic){"all-to-all", b * (n - 1) / n, b * (n - 1) / n, 1};
}

/* ==== the rows ================================================================ */

static const CollRow move_rows[] = {
    {P_ALL_GATHER, {.shape = coll_shape_all_gather, .kernel = coll_kernel_all_gather,
                    .vma = coll_vma_all_gather, .batch = batch_all_gather,
                    .jvp = jvp_all_gather, .transpose = tr_all_gather,
                    .coll = &(const CollRules){.api_name = "all_gather",
                                               .named = COLL_NAMED_REMOVES,
                                               .named_batch = batch_named_gather,
                                               .traffic = traffic_all_gather}}},
    {P_PSUM_SCATTER, {.shape = coll_shape_psum_scatter, .kernel = coll_kernel_psum_scatter,
                      .vma = coll_vma_psum_scatter, .batch = batch_psum_scatter,
                      .jvp = jvp_psum_scatter, .transpose = tr_psum_scatter,
                      .coll = &(const CollRules){.api_name = "psum_scatter",
                                                 .traffic = traffic_reduce_scatter}}},
    {P_PPERMUTE, {.shape = coll_shape_ppermute, .kernel = coll_kernel_ppermute,
                  .vma = coll_vma_ppermute, .batch = batch_ppermute, .jvp = jvp_ppermute,
                  .transpose = tr_ppermute,
                  .coll = &(const CollRules){.api_name = "ppermute",
                                             .named_batch = batch_named_permute,
                                             .traffic = traffic_permute}}},
    {P_ALL_TO_ALL, {.shape = coll_shape_all_to_all, .kernel = coll_kernel_all_to_all,
                    .vma = coll_vma_all_to_all, .batch = batch_all_to_all,
                    .jvp = jvp_all_to_all, .transpose = tr_all_to_all,
                    .coll = &(const CollRules){.api_name = "all_to_all",
                                               .traffic = traffic_all_to_all}}},
};

void coll_move_register(void) {
  coll_register_rows(move_rows, sizeof move_rows / sizeof *move_rows);
}
