/*
 * collective_x.c - collectives across MPI processes, under the engine
 * (collective_impl.h): one leader per process exchanges its local
 * participants' headers and operands with the other processes' leaders
 * over the transport (transport.h), and the local participants then
 * read what it received.
 */
#include "spmd/collective_impl.h"

/* ---- across processes ------------------------------------------------------------
 *
 * Under mpirun a call's devices live in several processes (transport.h);
 * each process runs the body on its own devices only.  A collective whose
 * participants are all local runs as above.  One with participants
 * elsewhere (c->cross) runs in three steps:
 *   1. the local participants meet as usual (rendezvous over them alone);
 *   2. the local leader (the first of them, in whose slot the exchange's
 *      state lives; whichever local participant leaves the rendezvous
 *      first runs its part, x_elect) sends a header (the
 *      collective's number and descriptor, and which participants it
 *      speaks for) and their operands to every other process holding
 *      participants, and receives theirs into arrays of its own (proxies);
 *      the descriptors must agree, as within a process.  Operands of up
 *      to COLL_XINLINE_BYTES ride in the header.  Five kernels exchange
 *      less than whole operands (the XExchange given to coll_x_run): large
 *      reductions reduce-scatter and all-gather between the processes
 *      (x_reduce), all_to_all sends only the slices each process takes
 *      (x_a2a), psum_scatter only the blocks it keeps (x_scatter_exchange,
 *      into proxies), ragged_all_to_all the offsets and sizes, then only
 *      the rows each process takes (x_ragged_exchange, into proxies), and
 *      all_to_all and all_gather (x_gather) receive straight into the
 *      outputs;
 *   3. after a barrier every local participant computes its own output
 *      from all the operands with the algorithms that read peers' operands
 *      and write only their own output (the same folds, in the same
 *      participant order: the bits equal a one-process run's), and a
 *      final barrier lets the leader free the proxies.  A small reduction
 *      instead has the leader fold once, into an array of its own, which
 *      the others copy before they leave without the final barrier; the
 *      leader's next exchange waits until they have (coll_x_run).
 * While it waits for a header the leader reads what the other processes
 * said: a header of the same number listing one of its participants under
 * another descriptor is a mismatch, a later one a participant that went
 * past it, an exit record one that returned from the body; each is the
 * error a one-process run gives, never a hang.
 */

int coll_x_device(const CollGroup *g, int r) {
  return g->mesh.device_ids ? g->mesh.device_ids[r] : r;
}

bool coll_x_local(const CollGroup *g, int r) { return g->slots[r].xlocal; }

int coll_x_proc(const CollGroup *g, int r) { return g->slots[r].xproc; }

void coll_x_tab_free(Slot *s) {
  for (int i = 0; i < s->xtab_cap; i++) {
    Array *a = s->xtab[s->xtab_cap + i];
    val_decref(a ? &a->hdr : NULL);
  }
  shm_free(s->xtab);
  s->xtab = NULL;
  s->xtab_cap = 0;
}

Array **coll_x_tab(Slot *s, int n) {
  if (n > s->xtab_cap) {
    coll_x_tab_free(s);
    if (!(s->xtab = shm_calloc(2 * (size_t)n, sizeof(Array *)))) return NULL;
    s->xtab_cap = n;
  }
  memset(s->xtab, 0, sizeof(Array *) * (size_t)n);
  return s->xtab;
}

Array *coll_x_proxy(Slot *s, int i, const Array *mine) {
  Array **kept = s->xtab + s->xtab_cap, *a = kept[i];
  kept[i] = NULL;
  if (a && a->dtype == mine->dtype && a->ndim == mine->ndim && a->contiguous &&
      a->offset == 0 && memcmp(a->shape, mine->shape, sizeof(int64_t) * a->ndim) == 0 &&
      arr_sole_holder(a))
    return a;
  val_decref(a ? &a->hdr : NULL);
  return arr_new(mine->dtype, mine->ndim, mine->shape);
}

/* A header on the wire: XWire, the descriptor's dims in use (int64_t
 * each), the sender's participants (int each), the descriptor's
 * parameters with their NUL, zeros to a multiple of 8 bytes (so every
 * field is aligned in the mailbox's copy), then (coll_x_exchange) the
 * operands when these total at most COLL_XINLINE_BYTES: a small
 * collective is one message each way.  Only what is in use travels (a
 * CollDesc is ~1.9 KB): a psum of one float is ~150 bytes, which Open
 * MPI sends inline (up to 256), with no request to complete. */
typedef struct XWire {
  int64_t seq;
  int32_t first, nloc, inline_bytes;
  int32_t kind, naxes, line, nin, ndims, params_len;
  int32_t axes[DEV_MAX_AXES];
  signed char dtype[COLL_MAX_IN], ndim[COLL_MAX_IN];
} XWire;

#define COLL_XINLINE_BYTES 1024

size_t coll_x_wire_cap(int nloc) {
  return sizeof(XWire) + sizeof(int64_t) * COLL_MAX_IN * SHM_MAXDIM + COLL_PARAMS_CAP +
         sizeof(int) * (size_t)nloc + 8 + COLL_XINLINE_BYTES;
}

size_t coll_x_header_pack(char *buf, const Call *c, const XLocal *lc, int inline_bytes) {
  const CollDesc *d = &c->desc;
  XWire w = {c->seq, c->peers[0], lc->n, inline_bytes, d->kind, d->naxes, d->line, d->nin,
             d->ndims, (int32_t)strlen(d->params) + 1, {0}, {0}, {0}};
  memcpy(w.axes, d->axes, sizeof(int) * (size_t)d->naxes);
  memcpy(w.dtype, d->dtype, (size_t)d->nin);
  memcpy(w.ndim, d->ndim, (size_t)d->nin);
  char *p = buf;
  memcpy(p, &w, sizeof w);
  p += sizeof w;
  memcpy(p, d->dims, sizeof(int64_t) * (size_t)d->ndims);
  p += sizeof(int64_t) * (size_t)d->ndims;
  memcpy(p, lc->peers, sizeof(int) * (size_t)lc->n);
  p += sizeof(int) * (size_t)lc->n;
  memcpy(p, d->params, (size_t)w.params_len);
  p += w.params_len;
  size_t len = ((size_t)(p - buf) + 7) & ~(size_t)7;
  memset(p, 0, len - (size_t)(p - buf));
  return len;
}

/* The header of collective [c] from leader [me] for its local
 * participants [lc], with [inline_bytes] of operands to follow, in
 * me->xhdr (NULL when out of memory); its length into [len].  A call
 * repeating the descriptor of the leader's last one (its generation
 * unchanged: equal up to the line) for the same participants takes the
 * last header with its number, line and inline size written over:
 * packing it anew cost a one-float psum ~200 instructions before its
 * send. */
static char *x_header(Slot *me, const Call *c, const XLocal *lc, int inline_bytes, size_t *len) {
  if (me->xhdr && me->xhdr_gen == me->gen && me->xhdr_first == c->peers[0] &&
      me->xhdr_nloc == lc->n) {
    int64_t seq = c->seq;
    int32_t line = c->desc.line, inl = inline_bytes;
    memcpy(me->xhdr + offsetof(XWire, seq), &seq, sizeof seq);
    memcpy(me->xhdr + offsetof(XWire, line), &line, sizeof line);
    memcpy(me->xhdr + offsetof(XWire, inline_bytes), &inl, sizeof inl);
    *len = me->xhdr_len;
    return me->xhdr;
  }
  if (!me->xhdr && !(me->xhdr = shm_malloc(coll_x_wire_cap(dev_count())))) return err_nomem();
  me->xhdr_len = *len = coll_x_header_pack(me->xhdr, c, lc, inline_bytes);
  me->xhdr_gen = me->gen;
  me->xhdr_first = c->peers[0];
  me->xhdr_nloc = lc->n;
  return me->xhdr;
}

/* coll_x_header_read of the [len] bytes at [data] from process [source]:
 * a message, or a header inside one (an exit record's evidence). */
static int x_header_parse(const char *data, size_t len, int source, XHeader *h) {
  XWire w;
  if (len < sizeof w) goto bad;
  memcpy(&w, data, sizeof w);
  if (w.naxes < 0 || w.naxes > DEV_MAX_AXES || w.nin < 0 || w.nin > COLL_MAX_IN ||
      w.ndims < 0 || w.ndims > COLL_MAX_IN * SHM_MAXDIM || w.params_len < 1 ||
      w.params_len > COLL_PARAMS_CAP || w.nloc < 1 || w.inline_bytes < 0 || w.kind < 0 ||
      w.kind >= P_COUNT || !prim_table[w.kind].rules.coll || !prim_table[w.kind].rules.coll->api_name)
    goto bad;
  size_t ranks = sizeof w + sizeof(int64_t) * (size_t)w.ndims;
  size_t params = ranks + sizeof(int) * (size_t)w.nloc, end = params + (size_t)w.params_len;
  size_t payload = (end + 7) & ~(size_t)7;
  if (payload + (size_t)w.inline_bytes > len || data[end - 1] != 0) goto bad;
  /* field by field: a compound literal would clear all of desc (~1.9 KB) */
  h->seq = w.seq;
  h->first = w.first;
  h->nloc = w.nloc;
  h->inline_bytes = w.inline_bytes;
  h->ranks = (const int *)(data + ranks);
  h->payload = data + payload;
  CollDesc *d = &h->desc;
  d->kind = w.kind;
  d->naxes = w.naxes;
  memcpy(d->axes, w.axes, sizeof d->axes);
  d->line = w.line;
  d->nin = w.nin;
  d->ndims = w.ndims;
  memcpy(d->dtype, w.dtype, sizeof d->dtype);
  memcpy(d->ndim, w.ndim, sizeof d->ndim);
  memcpy(d->dims, data + sizeof w, sizeof(int64_t) * (size_t)w.ndims);
  memcpy(d->params, data + params, (size_t)w.params_len);
  return 0;
bad:
  return err_set(ERR_COLLECTIVE, "a malformed collective header from process %d", source), -1;
}

int coll_x_header_read(const TransportMsg *m, XHeader *h) {
  return x_header_parse(m->data, m->len, m->source, h);
}

int coll_x_key(const CollGroup *g, long seq, int first) {
  return (g->parity << 27) | (int)((seq & 0xFFFF) << 11) | (first & 0x7FF);
}

/* Notes that remote device [s] reached [h]'s descriptor at #h.seq (and
 * on, up to the numbers already noted, when [run]) (lock held): a
 * device's own runs replace what another's mismatch said of it, which
 * is kept only where nothing else is known. */
static void x_note_reached(Slot *s, const XHeader *h, bool run, bool first) {
  if (!s->xruns && !(s->xruns = shm_malloc(sizeof(DescRun) * XRUNS_MAX))) return;
  if (!run && s->nxruns > 0) return;
  if (!run || first) {
    s->nxruns = 0;
    s->xlast = h->seq;
  }
  if (s->nxruns < XRUNS_MAX) s->xruns[s->nxruns++] = (DescRun){h->seq, h->desc};
}

/* What remote device [s] reached at collective #seq, as exit records'
 * evidence says (lock held), or NULL: the newest run from #seq or before,
 * as desc_at reads a local device's history. */
static const CollDesc *x_reached(const Slot *s, long seq) {
  if (!s->xruns || seq > s->xlast) return NULL;
  for (int i = 0; i < s->nxruns; i++)
    if (s->xruns[i].from <= seq) return &s->xruns[i].d;
  return NULL;
}

/* Notes, from exit record [m] ([e]), what its evidence says the remote
 * devices it names reached (lock held); a malformed piece ends the
 * reading (evidence only refines an error already coming). */
static void x_apply_evidence(CollGroup *g, const TransportMsg *m, const XExit *e) {
  size_t at = sizeof *e;
  for (int i = 0; i < e->nevid && at + sizeof(int64_t) <= m->len; i++) {
    int64_t len;
    memcpy(&len, m->data + at, sizeof len);
    at += sizeof len;
    XHeader h;
    if (len < 0 || (size_t)len > m->len - at ||
        x_header_parse(m->data + at, (size_t)len, m->source, &h) < 0) {
      err_clear();
      return;
    }
    at += ((size_t)len + 7) & ~(size_t)7;
    int r = h.ranks[0];
    if (r < 0 || r >= g->mesh.ndevices || coll_x_local(g, r)) continue;
    x_note_reached(&g->slots[r], &h, e->runs, i == 0);
  }
}

/* Applies exit records of this call to the remote slots (lock held). */
static bool x_apply_exit(TransportMsg *m, void *arg) {
  CollGroup *g = arg;
  if (m->tag != transport_tag(TRANSPORT_EXIT, g->parity << 27) || m->len < sizeof(XExit))
    return false;
  XExit e;
  memcpy(&e, m->data, sizeof e);
  if (e.rank >= 0 && e.rank < g->mesh.ndevices) {
    Slot *s = &g->slots[e.rank];
    s->exited = true;
    s->failed = e.failed;
    s->exit_line = e.line;
    s->xcount = e.count;
    x_apply_evidence(g, m, &e);
  }
  transport_msg_free(m);
  return true;
}

/* The first participant of [c] on process [proc] whose descriptor of
 * c's collective exit records' evidence gives (its own runs, or another
 * device's mismatch: XMismatch) and differs from c's: the mismatch error,
 * as a device of one process finds it among its peers' (lock held); 0
 * when none. */
static int x_evidence_error(const Call *c, int proc) {
  CollGroup *g = c->g;
  for (int q = 0; q < c->n; q++) {
    const CollDesc *d = x_reached(&g->slots[c->peers[q]], c->seq);
    if (coll_x_proc(g, c->peers[q]) == proc && d && !coll_desc_equal(d, &c->desc))
      return coll_mismatch_error(g, c->rank, &c->desc, c->peers[q], d);
  }
  return 0;
}

/* What a conflicting header says, for x_check. */
typedef struct XConflict {
  const Call *c;
  int proc;
  int rank;                       /* the participant it concerns, or -1 */
  int key;                        /* the header's key (coll_x_key) */
  CollDesc desc;
  bool later;                     /* a later collective (went past) */
} XConflict;

static bool x_find_conflict(TransportMsg *m, void *arg) {
  XConflict *x = arg;
  const Call *c = x->c;
  if (x->rank >= 0 || m->source != x->proc || ((m->tag >> 29) & 1) != c->g->parity) return false;
  XHeader h;
  if (coll_x_header_read(m, &h) < 0) {
    err_clear();   /* not a conflict found; its waiter reports it */
    return false;
  }
  if (h.seq < c->seq || (h.seq == c->seq && h.first == c->peers[0])) return false;
  for (int i = 0; i < h.nloc; i++)
    for (int q = 0; q < c->n; q++)
      if (c->peers[q] == h.ranks[i]) {
        x->rank = h.ranks[i];
        x->key = coll_x_key(c->g, h.seq, h.first);
        x->desc = h.desc;
        x->later = h.seq > c->seq;
        return false;
      }
  return false;
}

/* Whether process [proc]'s message [tag] is there: a small message, or
 * with [data] a matched data message. */
static bool x_arrived(int proc, int tag, bool data) {
  return data ? transport_has_data(proc, tag) : transport_has(proc, tag);
}

/* Checks, while waiting for process [proc]'s message [tag] (a header, or
 * with [data] a data message sent after its header), whether it can still
 * come: 0 yes, -1 with the error set.  What it reads may have come in
 * (another thread polls) after the caller looked for the message, and the
 * message before it (one sender's messages arrive in the order sent): so
 * no error while the message is there. */
static int x_check(const Call *c, int proc, int tag, bool data) {
  if (x_arrived(proc, tag, data)) return 0;
  CollGroup *g = c->g;
  pthread_mutex_lock(&g->lock);
  transport_scan(TRANSPORT_EXIT, x_apply_exit, g);
  if (x_arrived(proc, tag, data)) {   /* it came with the records */
    pthread_mutex_unlock(&g->lock);
    return 0;
  }
  int rc = coll_abort_error(g);
  /* a participant that reached another collective is the cause, as within
   * a process; then one that returned; one that failed may be its echo */
  if (rc == 0) rc = x_evidence_error(c, proc);
  for (int pass = 0; pass < 2; pass++)
    for (int q = 0; rc == 0 && q < c->n; q++) {
      int p = c->peers[q];
      if (coll_x_proc(g, p) == proc && g->slots[p].exited && g->slots[p].failed == (pass == 1))
        rc = coll_left_error(g, c, p, g->slots[p].failed);
    }
  pthread_mutex_unlock(&g->lock);
  if (rc < 0) return -1;
  XConflict x = {.c = c, .proc = proc, .rank = -1};
  transport_scan(TRANSPORT_HEADER, x_find_conflict, &x);
  if (x_arrived(proc, tag, data)) return 0;
  if (x.rank < 0) {
    /* a BYE: transport_departed polls, and knows only small messages */
    if (transport_departed(proc, tag, "a collective") == 0) return 0;
    if (!x_arrived(proc, tag, data)) return -1;
    err_clear();
    return 0;
  }
  /* its sender may wait for its data to this process to be received */
  g->slots[c->rank].xconflict = true;
  g->slots[c->rank].xconflict_key = x.key;
  if (x.later) return coll_passed_error(g, c, x.rank);
  return coll_mismatch_error(g, c->rank, &c->desc, x.rank, &x.desc);
}

/* The longest header any process sends in group [g], which a receive
 * posted for one must hold: a sender lists at most its own devices (as
 * many as this process's pool), or the mesh's. */
static size_t x_header_cap(const CollGroup *g) {
  int n = dev_count();
  return coll_x_wire_cap(n > g->mesh.ndevices ? n : g->mesh.ndevices);
}

TransportMsg *coll_x_wait_header(const Call *c, int proc, int tag) {
  TransportExpect *e = transport_expect(proc, tag, x_header_cap(c->g));
  for (unsigned i = 0;; i++) {
    TransportMsg *m;
    if (e) {
      m = transport_expect_take(e);
    } else {
      transport_poll();
      m = transport_take(proc, tag);
    }
    if (m) return m;
    /* the checks lock the group and scan the mailbox: not at every turn of
     * a wait that usually ends within microseconds */
    if (i % 64 == 63 && x_check(c, proc, tag, false) < 0) {
      transport_expect_cancel(e);
      return NULL;
    }
    transport_idle(i);
  }
}

int coll_x_wait_data(const Call *c, int proc, int tag, const TransportIov *iov, int niov) {
  for (unsigned i = 0; !transport_has_data(proc, tag); i++) {
    transport_poll();
    if (i % 64 == 63 && x_check(c, proc, tag, true) < 0) return -1;
    transport_idle(i);
  }
  return transport_recv_data(proc, tag, iov, niov);
}

int coll_x_procs(const Call *c, int *procs) {
  int np = 0, me = transport_rank();
  for (int q = 0; q < c->n; q++) {
    int p = coll_x_proc(c->g, c->peers[q]), i = 0;
    if (p == me) continue;
    while (i < np && procs[i] != p) i++;
    if (i == np) procs[np++] = p;
  }
  for (int i = 1; i < np; i++)
    for (int j = i; j > 0 && procs[j - 1] > procs[j]; j--) {
      int t = procs[j]; procs[j] = procs[j - 1]; procs[j - 1] = t;
    }
  return np;
}

int coll_x_position(const Call *c, int rank) {
  for (int q = 0; q < c->n; q++)
    if (c->peers[q] == rank) return q;
  return err_set(ERR_COLLECTIVE, "collective mismatch: another process sent operands for "
                 "devices outside this group"), -1;
}

static int x_proxies(const Call *c, const XHeader *h, Array **tab, TransportIov *iov) {
  int nin = c->desc.nin, k = 0;
  Slot *me = &c->g->slots[c->rank];
  for (int i = 0; i < h->nloc; i++) {
    int q = coll_x_position(c, h->ranks[i]);
    if (q < 0) return -1;
    if (me->xgather) {   /* x_gather: into the result (one operand) */
      iov[k++] = (TransportIov){coll_x_gather_at(c, q),
                                (size_t)c->in[0]->size * dt_size(c->in[0]->dtype)};
      continue;
    }
    for (int j = 0; j < nin; j++) {
      Array *a = tab[q * nin + j] = coll_x_proxy(me, q * nin + j, c->in[j]);
      if (!a) return -1;
      iov[k++] = (TransportIov){arr_data(a), (size_t)a->size * dt_size(a->dtype)};
    }
  }
  return k;
}

/* Copies the operands inline in header [h] into the pieces [iov]: their
 * number, or -1 with the error set when the lengths differ. */
static int x_unpack(const XHeader *h, const TransportIov *iov, int k) {
  size_t total = 0;
  for (int i = 0; i < k; i++) total += iov[i].len;
  if (total != (size_t)h->inline_bytes)
    return err_set(ERR_VALUE, "a message of %d bytes where %zu were expected",
                   h->inline_bytes, total), -1;
  const char *p = h->payload;
  for (int i = 0; i < k; p += iov[i].len, i++) memcpy(iov[i].base, p, iov[i].len);
  return k;
}

/* Whether header message [m] from process [proc] repeats the last one
 * leader [me] accepted from it, while the leader's descriptor is the
 * same (equal up to the line): every byte but the number, line and
 * inline size.  Then it matches as that one did, and [h] gets what
 * x_receive reads besides the descriptor: reading and comparing it
 * anew cost a one-float psum ~230 instructions after its wait. */
static bool x_header_known(const Slot *me, int proc, const TransportMsg *m, XHeader *h) {
  const XSeen *v = me->xseen ? &me->xseen[proc] : NULL;
  if (!v || !v->bytes || v->gen != me->gen || m->len < v->len) return false;
  const char *a = m->data, *b = v->bytes;
  size_t first = offsetof(XWire, first), kind = offsetof(XWire, kind), nin = offsetof(XWire, nin);
  if (memcmp(a + first, b + first, offsetof(XWire, inline_bytes) - first) != 0 ||
      memcmp(a + kind, b + kind, offsetof(XWire, line) - kind) != 0 ||
      memcmp(a + nin, b + nin, v->len - nin) != 0)
    return false;
  int32_t inl, ndims;
  int64_t seq;
  memcpy(&inl, a + offsetof(XWire, inline_bytes), sizeof inl);
  memcpy(&ndims, a + offsetof(XWire, ndims), sizeof ndims);
  memcpy(&seq, a + offsetof(XWire, seq), sizeof seq);
  if (inl < 0 || v->len + (size_t)inl > m->len) return false;
  memcpy(&h->first, a + first, sizeof h->first);
  memcpy(&h->nloc, a + offsetof(XWire, nloc), sizeof h->nloc);
  h->seq = seq;
  h->inline_bytes = inl;
  h->ranks = (const int *)(a + sizeof(XWire) + sizeof(int64_t) * (size_t)ndims);
  h->payload = a + v->len;
  return true;
}

/* Remembers header message [m] (read into [h]) from process [proc] as
 * accepted by leader [me]; nothing when out of memory. */
static void x_header_accepted(Slot *me, const CollGroup *g, int proc, const TransportMsg *m,
                              const XHeader *h) {
  if (!me->xseen && !(me->xseen = shm_calloc((size_t)transport_procs(), sizeof(XSeen))))
    return;
  XSeen *v = &me->xseen[proc];
  if (!v->bytes && !(v->bytes = shm_malloc(x_header_cap(g)))) return;
  v->len = (size_t)(h->payload - m->data);
  memcpy(v->bytes, m->data, v->len);
  v->gen = me->gen;
}

void coll_x_seen_free(Slot *s) {
  for (int p = 0; s->xseen && p < transport_procs(); p++) shm_free(s->xseen[p].bytes);
  shm_free(s->xseen);
  s->xseen = NULL;
}

/* Reads header message [m] from process [proc] into [h] and checks its
 * descriptor against [c]'s; then the pieces to receive the operands
 * into (x_proxies): their number, or -1 with the error set. */
static int x_header_accept(const Call *c, int proc, const TransportMsg *m, XHeader *h,
                           Array **tab, TransportIov *iov) {
  Slot *me = &c->g->slots[c->rank];
  if (x_header_known(me, proc, m, h)) return x_proxies(c, h, tab, iov);
  if (coll_x_header_read(m, h) < 0) return -1;
  if (!coll_desc_equal(&h->desc, &c->desc))
    return coll_mismatch_error(c->g, c->rank, &c->desc, h->ranks[0], &h->desc);
  x_header_accepted(me, c->g, proc, m, h);
  return x_proxies(c, h, tab, iov);
}

/* Receives every other process's header and operands into [tab]. */
static int x_receive(const Call *c, const int *procs, int np, Array **tab, TransportIov *iov) {
  int tag = transport_tag(TRANSPORT_HEADER, coll_x_key(c->g, c->seq, c->peers[0]));
  for (int i = 0; i < np; i++) {
    TransportMsg *m = coll_x_wait_header(c, procs[i], tag);
    if (!m) return -1;
    XHeader h;
    int k = x_header_accept(c, procs[i], m, &h, tab, iov);
    if (k >= 0 && h.inline_bytes) {
      k = x_unpack(&h, iov, k);
      transport_msg_free(m);
      if (k < 0) return -1;
      continue;
    }
    transport_msg_free(m);
    if (k < 0 || transport_recv_data(procs[i], tag & ~3, iov, k) < 0) return -1;
  }
  return 0;
}

void coll_x_wait_sends(const Call *c, void **reqs, int n, int rc) {
  Slot *me = &c->g->slots[c->rank];
  int tags[2] = {transport_tag(TRANSPORT_DATA, coll_x_key(c->g, c->seq, c->peers[0])),
                 transport_tag(TRANSPORT_DATA, me->xconflict_key)};
  bool conflict = me->xconflict;
  me->xconflict = false;
  if (rc == 0)
    transport_wait_sends(reqs, n);
  else
    transport_wait_sends_dropping(reqs, n, tags, conflict ? 2 : 1);
}

int coll_x_exchange(const Call *c, const XLocal *lc, const void *arg) {
  (void)arg;
  CollGroup *g = c->g;
  Slot *me = &g->slots[c->rank];
  int nin = c->desc.nin, n = c->n, procs[c->n], np = coll_x_procs(c, procs);
  Array **tab = coll_x_tab(me, n * nin);
  /* the rest on the stack (16 MiB, DEV_STACK_BYTES): a small collective's
   * time is mostly such overheads */
  Array *copies[lc->n * nin + 1];
  /* iov[0] the header, then this process's operands, then (x_receive)
   * the pieces to receive the others' into */
  TransportIov iov[n * nin + 2];
  void *reqs[2 * np + 1];
  memset(copies, 0, sizeof copies);
  me->xin = tab;
  me->xn = n;
  me->xnin = nin;
  if (!tab) return err_nomem(), -1;
  int k = 0;
  for (int q = 0; q < n && k % nin == 0; q++) {
    if (!coll_x_local(g, c->peers[q])) continue;
    for (int j = 0; j < nin; j++, k++) {
      Array *a = g->slots[c->peers[q]].in[j];
      tab[q * nin + j] = a;
      if (!a->contiguous && a->ndim > 0 && !(a = copies[k] = arr_contiguous(a))) break;
      iov[1 + k] = (TransportIov){arr_data(a), (size_t)a->size * dt_size(a->dtype)};
    }
  }
  int ncopies = lc->n * nin;
  if (k != ncopies) {   /* a contiguous copy failed: nothing was sent */
    for (int i = 0; i < ncopies; i++) val_decref(copies[i] ? &copies[i]->hdr : NULL);
    return -1;
  }
  int key = coll_x_key(g, c->seq, c->peers[0]);
  size_t total = 0;
  for (int i = 1; i <= k; i++) total += iov[i].len;
  /* the operands ride in the header (one message, gathered by the
   * transport) when small; none (empty arrays) still come as a data
   * message, as the header's inline_bytes 0 says */
  bool inl = total > 0 && total <= COLL_XINLINE_BYTES;
  size_t hlen = 0;
  char *h = x_header(me, c, lc, inl ? (int)total : 0, &hlen);
  if (!h) {
    for (int i = 0; i < ncopies; i++) val_decref(copies[i] ? &copies[i]->hdr : NULL);
    return -1;
  }
  iov[0] = (TransportIov){h, hlen};
  for (int i = 0; i < np; i++) {
    reqs[2 * i] = transport_isend(procs[i], transport_tag(TRANSPORT_HEADER, key), iov,
                                  inl ? 1 + k : 1);
    reqs[2 * i + 1] = inl ? NULL
                          : transport_isend(procs[i], transport_tag(TRANSPORT_DATA, key), iov + 1, k);
  }
  /* the pieces of this process's operands are in iov[1..k]; receive after them */
  int rc = x_receive(c, procs, np, tab, iov + 1 + k);
  coll_x_wait_sends(c, reqs, 2 * np, rc);
  for (int i = 0; i < lc->n * nin; i++) val_decref(copies[i] ? &copies[i]->hdr : NULL);
  return rc;
}

/* Lets the leader's proxies (the remote participants' operands) go, kept
 * for the next call at their places in the table, and frees its result
 * (x_reduce) when it is not its output.  After a call without the final
 * barrier (xsmall) the local participants may still read xin and xres:
 * x_lead clears them. */
static void x_free(CollGroup *g, Slot *lead, bool barrier) {
  if (lead->xres && lead->xres != lead->out[0] && lead->xres != lead->xsmall)
    val_decref(&lead->xres->hdr);
  if (barrier) lead->xres = NULL;
  if (!lead->xin) return;
  Array **kept = lead->xtab + lead->xtab_cap;
  for (int q = 0; q < lead->xn; q++)
    if (!coll_x_local(g, lead->peers[q]))
      for (int j = 0; j < lead->xnin; j++) {
        int i = q * lead->xnin + j;
        if (!lead->xin[i]) continue;
        val_decref(kept[i] ? &kept[i]->hdr : NULL);
        kept[i] = lead->xin[i];
      }
  if (barrier) lead->xin = NULL;
}

/* Swaps call [c]'s participants with [l]'s.  x_run's local steps
 * (rendezvous, barriers, finish) take a Call over the local participants
 * alone: the call itself with them swapped in, not a copy of it (with its
 * descriptor ~1.9 KB, a copy cost a one-float psum ~250 instructions). */
static void x_swap(Call *c, XLocal *l) {
  XLocal t = {c->n, c->pos, c->peers};
  c->n = l->n, c->pos = l->pos, c->peers = l->peers;
  *l = t;
}

/* The leader's exchange and, when given, its [lead] step, the error
 * copied into the leader slot for the other local participants (who read
 * it after the barrier that follows).  Its last call's local
 * participants are done with what it left them (x_lead_for). */
static void x_lead(Call *c, const XLocal *lc, XExchange exchange, XExchange step,
                   const void *arg) {
  Slot *lead = &c->g->slots[c->rank];
  lead->xin = NULL;
  lead->xres = NULL;
  lead->xconflict = false;
  lead->xrc = exchange(c, lc, arg);
  if (lead->xrc == 0 && step) {
    c->xin = lead->xin;
    lead->xrc = step(c, lc, arg);
    c->xin = NULL;
  }
  if (lead->xrc < 0) {
    lead->xkind = err_kind();
    lead->xsecondary = dev_error_is_secondary();
    snprintf(lead->xmsg, sizeof lead->xmsg, "%s", err_message());
  }
}

/* Records, at the end of leader [lead]'s call [c] (over its local
 * participants) without the final barrier, who may still read its xres. */
static void x_readers(Slot *lead, const Call *c) {
  lead->xread_seq = c->seq;
  lead->xread_n = 0;
  for (int l = 0; l < c->n; l++)
    if (c->peers[l] != c->rank) lead->xread_peers[lead->xread_n++] = c->peers[l];
}

/* Whether the caller runs the leader's part of call [c] (over all
 * participants; [l] the local ones): the first of them out of the
 * rendezvous, which is usually the last to arrive and still running, so
 * the exchange starts without handing the core to another device (with
 * more devices than cores each hand-off is a turn of the scheduler; a
 * one-float psum at 4 processes x 2 devices on 2 cores took ~1.5 us less).
 * Reference mode keeps the first local participant. */
static bool x_elect(const Call *c, const XLocal *l) {
  Slot *first = &c->g->slots[l->peers[0]];
  if (c->g->reference || l->n == 1) return l->peers[0] == c->rank;
  long last = atomic_load_explicit(&first->xlead_seq, memory_order_relaxed);
  return last < c->seq &&
         atomic_compare_exchange_strong(&first->xlead_seq, &last, c->seq);
}

/* x_lead run by the calling device on behalf of the first local
 * participant [first] (at position [pos] of c's participants): with its
 * slot, operands, outputs and line, so the exchange, its state kept from
 * call to call and its errors' wording are the same whichever device
 * runs it.  First the slot's last call's readers must be done with what
 * it left them (coll_x_run); the caller waits as itself, with its own
 * slot's caches: the first participant may still be noting the arrivals
 * in its own. */
static void x_lead_for(Call *c, int first, int pos, const XLocal *lc, XExchange exchange,
                       XExchange step, const void *arg) {
  Slot *f = &c->g->slots[first];
  if (f->xread_n) coll_wait_readers(c, f->xread_seq, f->xread_n, f->xread_peers);
  f->xread_n = 0;
  int rank = c->rank, self = c->pos, line = c->desc.line;
  Array **in = c->in, **out = c->out;
  c->rank = first, c->pos = pos, c->desc.line = atomic_load(&f->line);
  c->in = f->in, c->out = f->out;
  x_lead(c, lc, exchange, step, arg);
  c->rank = rank, c->pos = self, c->desc.line = line, c->in = in, c->out = out;
}

int coll_x_run(Call *c, XExchange exchange, XStep body, const void *arg, XExchange lead_step) {
  CollGroup *g = c->g;
  XLocal l = {0, 0, g->slots[c->rank].lpeers};
  int first_pos = -1;
  for (int q = 0; q < c->n; q++)
    if (coll_x_local(g, c->peers[q])) {
      if (c->peers[q] == c->rank) l.pos = l.n;
      if (first_pos < 0) first_pos = q;
      l.peers[l.n++] = c->peers[q];
    }
  Slot *lead = &g->slots[l.peers[0]];
  bool barrier = !lead_step || g->reference;
  x_swap(c, &l);   /* c: the local participants; l: all of them */
  int rc = coll_rendezvous(c);
  x_swap(c, &l);
  if (rc < 0) return -1;
  bool leader = x_elect(c, &l);
  if (leader) x_lead_for(c, l.peers[0], first_pos, &l, exchange, lead_step, arg);
  x_swap(c, &l);
  coll_barrier(c);
  x_swap(c, &l);
  rc = lead->xrc;
  if (rc < 0 && !leader) {
    /* as primary or secondary as the leader's own copy */
    err_set(lead->xkind, "%s", lead->xmsg);
    if (lead->xsecondary) dev_error_secondary();
  } else if (rc == 0) {
    c->xin = lead->xin;
    rc = body(c, arg);
  }
  x_swap(c, &l);
  if (barrier) coll_barrier(c);
  /* the slot's own device lets the exchange go, whoever ran it: the
   * others may be past the call, and the slot's fields its next one's */
  if (lead == &g->slots[c->rank]) {
    x_free(g, lead, barrier);
    if (!barrier) x_readers(lead, c);
  }
  coll_finish(c);
  x_swap(c, &l);
  return rc;
}

/* Appends to exit record [buf] (of [len] bytes, at most [cap]) the
 * header of what device [rank] reached at collective #seq, [d]: the new
 * length, or [len] when it does not fit. */
static size_t x_evidence_pack(char *buf, size_t len, size_t cap, long seq, int rank,
                              const CollDesc *d) {
  Call t = {.seq = seq, .desc = *d, .peers = &rank};
  XLocal one = {1, 0, &rank};
  char h[coll_x_wire_cap(1)];
  int64_t n = (int64_t)coll_x_header_pack(h, &t, &one, 0);
  size_t need = sizeof n + (((size_t)n + 7) & ~(size_t)7);
  if (len + need > cap) return len;
  memcpy(buf + len, &n, sizeof n);
  memcpy(buf + len + sizeof n, h, (size_t)n);
  memset(buf + len + sizeof n + n, 0, need - sizeof n - (size_t)n);
  return len + need;
}

/* Appends to exit record [buf] (of [len] bytes, at most
 * TRANSPORT_COPY_BYTES) device [rank]'s (slot [s]) runs of descriptors,
 * newest first, its last collective alone first (with its own line, as
 * desc_at reads it), counting them in [nevid]: the new length.  A device
 * of another process that waits for it in another collective of a number
 * it reached then names both, as in one process (check_peer), not a
 * device that returned from the body. */
static size_t x_runs_pack(const Slot *s, int rank, char *buf, size_t len, int *nevid) {
  CollDesc d = s->runs[(s->nruns - 1) % COLL_HIST].d;
  d.line = atomic_load(&s->line);
  size_t n = x_evidence_pack(buf, len, TRANSPORT_COPY_BYTES, s->seq, rank, &d);
  *nevid += n > len;
  for (long k = s->nruns - 1; n > len && k >= 0 && k >= s->nruns - COLL_HIST; k--) {
    const DescRun *run = &s->runs[k % COLL_HIST];
    len = n;
    n = x_evidence_pack(buf, len, TRANSPORT_COPY_BYTES, run->from, rank, &run->d);
    *nevid += n > len;
  }
  return n;
}

void coll_x_send_exit(CollGroup *g, Slot *s, int rank, int line, bool failed) {
  XExit e = {rank, line, failed, 0, 0, atomic_load(&s->published) + 1};
  /* a failure with a mismatch found carries both descriptors; the record
   * stays a small message (sent from a copy, unless memory is short) */
  char *buf = s->xexit;
  size_t len = sizeof e;
  if (failed && s->xmis && s->xmis->seq == s->seq) {
    for (int i = 0; i < 2; i++) {
      size_t n = x_evidence_pack(buf, len, TRANSPORT_COPY_BYTES, s->xmis->seq, s->xmis->rank[i],
                                 &s->xmis->desc[i]);
      e.nevid += n > len;
      len = n;
    }
  } else if (!failed && s->nruns > 0) {
    e.runs = 1;
    len = x_runs_pack(s, rank, buf, len, &e.nevid);
  }
  memcpy(buf, &e, sizeof e);
  TransportIov v = {buf, len};
  for (int p = 0; p < transport_procs(); p++)
    if (p != transport_rank())
      s->xreqs[p] = transport_isend(p, transport_tag(TRANSPORT_EXIT, g->parity << 27), &v, 1);
}
