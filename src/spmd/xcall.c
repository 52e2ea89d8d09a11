/*
 * xcall.c - the END messages of a shard_map call across processes (xcall.h).
 */
#include "spmd/xcall.h"

#include <sched.h>
#include <stdint.h>
#include <string.h>

#include "array/array.h"
#include "base/error.h"
#include "base/intern.h"
#include "base/mem.h"
#include "base/strbuf.h"
#include "lang/classes.h"
#include "spmd/transport.h"

/* ---- writing --------------------------------------------------------------- */

static void put_i64(StrBuf *w, int64_t x) { sbuf_add(w, &x, sizeof x); }

static void put_str(StrBuf *w, const char *s) {
  size_t n = s ? strlen(s) : 0;
  put_i64(w, (int64_t)n);
  sbuf_add(w, s ? s : "", n);
}

static void put_loc(StrBuf *w, Loc l) {
  put_str(w, l.src ? l.src->name : "");
  put_i64(w, l.line);
  put_i64(w, l.col);
}

/* A named tuple (V_NAMED_TAG) and a registered class's instance
 * (V_NODE_TAG) name their class by its number and name (classes.h): every
 * process runs the same program, so defines the same classes in the same
 * order. */
enum { V_NONE_TAG, V_ARRAY_TAG, V_TUPLE_TAG, V_LIST_TAG, V_DICT_TAG, V_STR_TAG, V_NAMED_TAG,
       V_NODE_TAG };

/* Writes array [a]: its type, shape and elements (a Python number: its
 * exact value). */
static void put_array(StrBuf *w, const Array *a) {
  put_i64(w, a->dtype);
  put_i64(w, a->weak | (a->host << 1));
  put_i64(w, a->vma);
  put_i64(w, a->ndim);
  for (int d = 0; d < a->ndim; d++) put_i64(w, a->shape[d]);
  if (a->host) {
    double x = arr_host_f64(a);
    int64_t i = arr_get_i64(a, 0);
    sbuf_add(w, &x, sizeof x);
    put_i64(w, i);
    return;
  }
  Array *c = arr_contiguous((Array *)a);
  if (!c) {
    w->failed = true;
    return;
  }
  sbuf_add(w, arr_data(c), (size_t)c->size * dt_size(c->dtype));
  val_decref(&c->hdr);
}

static void put_value(StrBuf *w, Value *v, bool shape_only);

static void put_class(StrBuf *w, Value *cls) {
  put_i64(w, cls_id(cls));
  put_str(w, cls_name(cls));
}

/* Whether put_value writes [v] as it is: None, arrays, strings, and
 * containers of them (a custom node's auxiliary data must be). */
static bool sendable(Value *v, int depth) {
  size_t n;
  Value *const *items;
  if (v == VAL_NONE || v->type == V_STR || IS_ARRAY(v)) return true;
  if (depth > 64) return false;
  if (v->type == V_DICT) {
    for (size_t i = 0; i < ((Dict *)v)->len; i++)
      if (!sendable(((Dict *)v)->keys[i], depth + 1) || !sendable(((Dict *)v)->vals[i], depth + 1))
        return false;
    return true;
  }
  if (!val_seq(v, &n, &items)) return false;
  for (size_t i = 0; i < n; i++)
    if (!sendable(items[i], depth + 1)) return false;
  return true;
}

/* A registered class's instance: its class, auxiliary data and children. */
static void put_node(StrBuf *w, Value *v, bool shape_only) {
  Value *aux, *kids = cls_tree_children(v, &aux);
  if (kids && !sendable(aux, 0))
    err_set(ERR_VALUE, "a pytree node of class '%s' cannot go from one process to another: its "
            "auxiliary data holds a %s", cls_name(cls_class_of(v)), val_type_name(aux));
  if (!kids || !sendable(aux, 0)) {
    w->failed = true;
  } else {
    put_i64(w, V_NODE_TAG);
    put_class(w, cls_class_of(v));
    put_value(w, aux, false);
    put_value(w, kids, shape_only);
  }
  if (kids) val_decref(aux);
  val_decref(kids);
}

/* Writes a device's result: arrays, strings, and tuples, lists and dicts
 * of them (a pytree); anything else as None (shard_map then says what the
 * body returned), or with [shape_only] (a pytree kept for its structure,
 * whose leaves may be abstract values) as a 0-d placeholder array. */
static void put_value(StrBuf *w, Value *v, bool shape_only) {
  size_t n;
  Value *const *items;
  if (v && cls_is_tree_node(v)) {
    put_node(w, v, shape_only);
  } else if (v && tuple_class(v)) {
    put_i64(w, V_NAMED_TAG);
    put_class(w, tuple_class(v));
    put_i64(w, (int64_t)tuple_len(v));
    for (size_t i = 0; i < tuple_len(v); i++) put_value(w, tuple_get(v, i), shape_only);
  } else if (v && v->type == V_STR) {
    put_i64(w, V_STR_TAG);
    put_str(w, str_cstr(v));
  } else if (v && v->type == V_DICT) {
    const Dict *d = (const Dict *)v;
    put_i64(w, V_DICT_TAG);
    put_i64(w, (int64_t)d->len);
    for (size_t i = 0; i < d->len; i++) {
      put_value(w, d->keys[i], false);
      put_value(w, d->vals[i], shape_only);
    }
  } else if (v && IS_ARRAY(v)) {
    put_i64(w, V_ARRAY_TAG);
    put_array(w, (const Array *)v);
  } else if (v && (v->type == V_TUPLE || v->type == V_LIST) && val_seq(v, &n, &items)) {
    put_i64(w, v->type == V_TUPLE ? V_TUPLE_TAG : V_LIST_TAG);
    put_i64(w, (int64_t)n);
    for (size_t i = 0; i < n; i++) put_value(w, items[i], shape_only);
  } else if (shape_only && v && v != VAL_NONE) {
    Array *z = arr_scalar_f64(DT_F32, 0.0, false);
    put_i64(w, V_ARRAY_TAG);
    if (z) put_array(w, z), val_decref(&z->hdr);
    else w->failed = true;
  } else {
    put_i64(w, V_NONE_TAG);
  }
}

/* Writes this thread's pending error, keeping it pending. */
static void put_error(StrBuf *w) {
  ErrState st;
  bool secondary = dev_run_error_secondary();
  err_save(&st);
  put_i64(w, 1);
  put_i64(w, secondary);
  put_i64(w, st.kind);
  put_str(w, st.msg);
  put_loc(w, st.loc);
  put_i64(w, st.ntrace);
  for (int i = 0; i < st.ntrace; i++) {
    put_loc(w, st.trace[i].loc);
    put_str(w, st.trace[i].fname);
  }
  err_restore(&st);
}

/* The END message of this process: per local rank its number, output and
 * result, then the outcome (0, or 1 and the error); after a 0 the caller
 * adds the shared slots' values (xcall_end). */
/* Result [v] of a device, with the results [withheld] names sent as
 * None (each process keeps its own blocks of them). */
static void put_result(StrBuf *w, Value *v, uint32_t withheld) {
  if (!withheld || !v || v->type != V_TUPLE) {
    put_value(w, v, false);
    return;
  }
  put_i64(w, V_TUPLE_TAG);
  put_i64(w, (int64_t)tuple_len(v));
  for (size_t i = 0; i < tuple_len(v); i++) {
    if (i < 32 && (withheld >> i & 1)) put_i64(w, V_NONE_TAG);
    else put_value(w, tuple_get(v, i), false);
  }
}

static void put_end(StrBuf *w, const MeshDesc *m, Value **results, OutBuf *outs, int rc,
                    uint32_t withheld) {
  for (int r = 0; r < m->ndevices; r++) {
    if (!transport_is_local(m->device_ids ? m->device_ids[r] : r)) continue;
    put_i64(w, r);
    put_i64(w, (int64_t)outs[r].len);
    sbuf_add(w, outs[r].data ? outs[r].data : "", outs[r].len);
    put_result(w, rc < 0 ? NULL : results[r], withheld);
  }
  put_i64(w, -1);
  if (rc < 0)
    put_error(w);
  else
    put_i64(w, 0);
}

/* ---- reading ----------------------------------------------------------------- */

typedef struct Rbuf {
  const char *p, *end;
} Rbuf;

static int64_t get_i64(Rbuf *r) {
  int64_t x = 0;
  if (r->end - r->p >= (ptrdiff_t)sizeof x) memcpy(&x, r->p, sizeof x);
  r->p += sizeof x;
  return x;
}

static const char *get_bytes(Rbuf *r, size_t n) {
  const char *p = r->p;
  r->p += n;
  return p;
}

/* A string of the message, copied into [buf]. */
static const char *get_str(Rbuf *r, char *buf, size_t cap) {
  size_t n = (size_t)get_i64(r);
  const char *s = get_bytes(r, n);
  snprintf(buf, cap, "%.*s", (int)n, s);
  return buf;
}

static Loc get_loc(Rbuf *r) {
  char name[1024];
  get_str(r, name, sizeof name);
  Loc l = {NULL, 0, 0};
  l.line = (int)get_i64(r);
  l.col = (int)get_i64(r);
  if (*name) l.src = src_find(name);   /* a counted reference, or NULL */
  return l;
}

static Value *get_array(Rbuf *r) {
  DType t = (DType)get_i64(r);
  int64_t flags = get_i64(r), vma = get_i64(r), ndim = get_i64(r), shape[SHM_MAXDIM];
  for (int d = 0; d < ndim; d++) shape[d] = get_i64(r);
  Array *a;
  if (flags & 2) {
    double x;
    memcpy(&x, get_bytes(r, sizeof x), sizeof x);
    int64_t i = get_i64(r);
    Value *v = dt_is_float(t) ? arr_python_float(x) : NULL;
    if (v) return v;
    a = arr_scalar_i64(t, i, flags & 1);
    if (a) a->host = true;
    return a ? &a->hdr : NULL;
  }
  a = arr_new(t, (int)ndim, shape);
  if (!a) return NULL;
  size_t n = (size_t)a->size * dt_size(t);
  memcpy(arr_data(a), get_bytes(r, n), n);
  a->weak = flags & 1;
  a->vma = (uint32_t)vma;
  return &a->hdr;
}

static Value *get_dict(Rbuf *r);
static Value *get_value(Rbuf *r);

/* The class put_class named: this process's class of that number, which
 * must have that name. */
static Value *get_class(Rbuf *r) {
  int64_t id = get_i64(r);
  char name[256];
  get_str(r, name, sizeof name);
  Value *c = cls_from_id((int)id);
  if (!c || strcmp(cls_name(c), name))
    return err_set(ERR_VALUE, "a result of class '%s' came from another process, where the "
                   "classes were defined in another order", name);
  return c;
}

static Value *get_node(Rbuf *r) {
  Value *cls = get_class(r);
  Value *aux = get_value(r), *kids = aux ? get_value(r) : NULL;
  Value *v = cls && kids ? cls_tree_unflatten(cls, aux, kids) : NULL;
  val_decref(aux);
  val_decref(kids);
  return v;
}

static Value *get_value(Rbuf *r) {
  int64_t tag = get_i64(r);
  if (tag == V_ARRAY_TAG) return get_array(r);
  if (tag == V_DICT_TAG) return get_dict(r);
  if (tag == V_STR_TAG) {
    size_t n = (size_t)get_i64(r);
    return str_new(get_bytes(r, n), n);
  }
  if (tag == V_NODE_TAG) return get_node(r);
  Value *cls = tag == V_NAMED_TAG ? get_class(r) : NULL;
  if (tag == V_NAMED_TAG && !cls) return NULL;
  if (tag != V_TUPLE_TAG && tag != V_LIST_TAG && !cls) return val_incref(VAL_NONE);
  size_t n = (size_t)get_i64(r);
  Value *t = cls ? tuple_new_named(n, cls) : tag == V_TUPLE_TAG ? tuple_new(n) : list_new(n);
  for (size_t i = 0; t && i < n; i++) {
    Value *x = get_value(r);
    if (!x) {
      val_decref(t);
      return NULL;
    }
    if (tag != V_LIST_TAG)
      tuple_set_steal(t, i, x);
    else if (list_append_steal(t, x) < 0) {
      val_decref(t);
      return NULL;
    }
  }
  return t;
}

static Value *get_dict(Rbuf *r) {
  size_t n = (size_t)get_i64(r);
  Value *d = dict_new();
  for (size_t i = 0; d && i < n; i++) {
    Value *k = get_value(r), *v = k ? get_value(r) : NULL;
    if (!v || dict_set(d, k, v) < 0) {
      val_decref(k), val_decref(v), val_decref(d);
      return NULL;
    }
    val_decref(k), val_decref(v);
  }
  return d;
}

/* Makes another process's error this thread's. */
static void raise_remote(Rbuf *r) {
  ErrState st = {0};
  char msg[2048];
  st.kind = (ErrKind)get_i64(r);
  get_str(r, msg, sizeof msg);
  st.msg = shm_strdup(msg);
  st.loc = get_loc(r);
  st.ntrace = (int)get_i64(r);
  st.trace = st.ntrace ? shm_calloc((size_t)st.ntrace, sizeof(ErrFrame)) : NULL;
  for (int i = 0; i < st.ntrace; i++) {
    char fname[256];
    Loc l = get_loc(r);
    get_str(r, fname, sizeof fname);
    if (st.trace) st.trace[i] = (ErrFrame){l, intern(fname, strlen(fname)), 0};
    else src_decref(l.src);
  }
  if (!st.trace) st.ntrace = 0;
  err_clear();
  err_restore(&st);
}

/* Reads the rank records of an END message into results and outs. */
static int get_ranks(Rbuf *r, Value **results, OutBuf *outs) {
  for (int64_t rank; (rank = get_i64(r)) >= 0;) {
    size_t n = (size_t)get_i64(r);
    const char *text = get_bytes(r, n);
    OutBuf *o = &outs[rank];
    o->data = shm_malloc(n + 1);
    if (!o->data) return err_nomem(), -1;
    memcpy(o->data, text, n);
    o->len = n;
    o->cap = n + 1;
    if (!(results[rank] = get_value(r))) return -1;
  }
  return 0;
}

/* ---- the exchange -------------------------------------------------------------------- */

/* Waits for process [p]'s END message of the call; NULL with the error
 * set when p has ended the program instead.  Meanwhile drops the call's
 * data messages (tag bit 29, the parity, and class 0): every local device
 * has left the call, so nobody here will receive them, and their sender,
 * a leader that failed, may be waiting for them to complete. */
static TransportMsg *wait_end(int p, int tag) {
  int mask = (1 << 29) | 3, value = tag & (1 << 29);
  for (;;) {
    transport_drop_data(mask, value);
    TransportMsg *m = transport_take(p, tag);
    if (m) return m;
    if (transport_departed(p, tag, "the end of a shard_map call") < 0) return NULL;
    sched_yield();
  }
}

int xcall_end(CollGroup *g, const MeshDesc *mesh, Value **results, OutBuf *outs, int rc,
              Value ***shared, int nshared, uint32_t withheld) {
  int procs = transport_procs(), me = transport_rank();
  int tag = transport_tag(TRANSPORT_END, coll_group_parity(g) << 27);
  StrBuf w = {0};
  put_end(&w, mesh, results, outs, rc, withheld);
  for (int i = 0; i < nshared; i++) put_value(&w, *shared[i], true);
  if (w.failed) return sbuf_free(&w), err_nomem(), -1;
  void *reqs[procs];
  TransportIov v = {w.data, w.len};
  for (int p = 0; p < procs; p++) reqs[p] = p == me ? NULL : transport_isend(p, tag, &v, 1);
  TransportMsg *ends[procs];
  for (int p = 0; p < procs; p++) ends[p] = NULL;
  Rbuf errs[procs];
  int pick = -1, out = 0;               /* the process whose error wins */
  bool gone = false;                    /* a process ended the program */
  bool pick_primary = false;
  for (int p = 0; p < procs; p++) {
    ends[p] = NULL;
    Rbuf r = {w.data, w.data + w.len};
    if (p != me) {
      if (!(ends[p] = wait_end(p, tag))) {
        gone = true;
        break;
      }
      r = (Rbuf){ends[p]->data, ends[p]->data + ends[p]->len};
      if (out == 0) out = get_ranks(&r, results, outs);
    } else {
      while (get_i64(&r) >= 0) {        /* skip this process's own ranks */
        get_bytes(&r, (size_t)get_i64(&r));
        val_decref(get_value(&r));
      }
    }
    if (out < 0) continue;
    if (get_i64(&r) == 0) {
      for (int i = 0; i < nshared; i++) {
        Value *sv = get_value(&r);
        if (!*shared[i] && sv && sv != VAL_NONE) *shared[i] = val_incref(sv);
        val_decref(sv);
      }
      continue;
    }
    bool primary = !get_i64(&r);
    errs[p] = r;
    if (pick < 0 || (primary && !pick_primary)) pick = p, pick_primary = primary;
  }
  if (gone) {   /* its error is set; the sends to it may never complete */
    for (int p = 0; p < procs; p++)
      if (ends[p]) transport_msg_free(ends[p]);
    return -1;
  }
  transport_wait_sends(reqs, procs);
  if (out == 0 && pick >= 0) {
    out = -1;
    if (pick != me) raise_remote(&errs[pick]);   /* else this thread's own error stands */
  }
  for (int p = 0; p < procs; p++)
    if (ends[p]) transport_msg_free(ends[p]);
  sbuf_free(&w);
  /* everything of this call any process sent came before its END */
  transport_clear(3 << 28, coll_group_parity(g) << 29);
  return out;
}
