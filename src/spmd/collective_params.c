/*
 * collective_params.c - a collective's parameters, its named axes and
 * participants, and the memo of a device's last set-up
 * (collective_impl.h).
 *
 * Parameters are read and written as canonical text (coll_params_canon) that
 * the descriptors compare; the named axes resolve to mesh axes, and the
 * participants are the devices that agree with the caller on every axis
 * not named (or its axis_index_groups group).  A loop repeating one
 * collective finds all of that in the memo.
 */
#include "spmd/collective_impl.h"

/* ---- parameters ---------------------------------------------------------- */

int64_t coll_elem_i64(const Array *a, int64_t flat) {
  int64_t off = 0;
  for (int d = a->ndim - 1; d >= 0; d--) {
    off += (flat % a->shape[d]) * a->strides[d];
    flat /= a->shape[d];
  }
  arr_check_held(a);
  const char *base = (const char *)a->buf->data;
  int64_t at = a->offset + off;
  switch (a->dtype) {
  case DT_BOOL: return ((const uint8_t *)base)[at];
  case DT_I8: return ((const int8_t *)base)[at];
  case DT_I32: return ((const int32_t *)base)[at];
  case DT_I64: return ((const int64_t *)base)[at];
  default: return 0;
  }
}

bool coll_is_intlike(const Value *v) {
  if (!IS_ARRAY(v)) return false;
  const Array *a = (const Array *)v;
  return a->size == 1 && (dt_is_int(a->dtype) || a->dtype == DT_BOOL);
}

int coll_param_int(const char *prim, const Params *p, const char *name,
                   int64_t dflt, int64_t *out) {
  Value *v = params_get(p, name);
  if (!v || v == VAL_NONE) return *out = dflt, 0;
  if (!coll_is_intlike(v))
    return err_set(ERR_TYPE, "%s: parameter %s must be an integer", prim, name), -1;
  *out = coll_elem_i64((const Array *)v, 0);
  return 0;
}

int coll_param_bool(const char *prim, const Params *p, const char *name,
                    bool *out) {
  int64_t x;
  if (coll_param_int(prim, p, name, 0, &x) < 0) return -1;
  *out = x != 0;
  return 0;
}

/* A bounded text under construction.  Appends truncate as snprintf
 * would (the text stays NUL-terminated within cap) but parse no format:
 * every collective call builds its descriptor, and printf was most of a
 * small psum's cost. */
typedef struct Text {
  char *s;
  size_t cap, len;                /* len < cap once begun */
} Text;

static Text text_begin(char *buf, size_t cap) {
  buf[0] = 0;
  return (Text){buf, cap, 0};
}

static void text_puts(Text *t, const char *str) {
  size_t n = strlen(str), room = t->cap - 1 - t->len;
  if (n > room) n = room;
  memcpy(t->s + t->len, str, n);
  t->len += n;
  t->s[t->len] = 0;
}

static void text_int(Text *t, int64_t x) {
  char digits[24], *d = digits + sizeof digits;
  uint64_t u = x < 0 ? -(uint64_t)x : (uint64_t)x;
  *--d = 0;
  do *--d = (char)('0' + u % 10); while (u /= 10);
  if (x < 0) *--d = '-';
  text_puts(t, d);
}

static bool text_full(const Text *t) { return t->len + 1 >= t->cap; }

/* Appends the repr of a parameter value (ints, bools, strings, None and
 * tuples of them). */
static void repr_value(Text *t, Value *v) {
  if (!v || v == VAL_NONE) {
    text_puts(t, "None");
  } else if (v->type == V_STR) {
    text_puts(t, "'");
    text_puts(t, str_cstr(v));
    text_puts(t, "'");
  } else if (coll_is_intlike(v) && ((Array *)v)->dtype == DT_BOOL) {
    text_puts(t, coll_elem_i64((Array *)v, 0) ? "True" : "False");
  } else if (coll_is_intlike(v)) {
    text_int(t, coll_elem_i64((Array *)v, 0));
  } else if (v->type == V_TUPLE || v->type == V_LIST) {
    size_t n;
    Value *const *items;
    val_seq(v, &n, &items);
    text_puts(t, "(");
    for (size_t i = 0; i < n && !text_full(t); i++) {
      if (i) text_puts(t, ", ");
      repr_value(t, items[i]);
    }
    text_puts(t, n == 1 ? ",)" : ")");
  } else {
    text_puts(t, "<");
    text_puts(t, val_type_name(v));
    text_puts(t, ">");
  }
}

void coll_params_canon(const Params *p, char *buf, size_t cap) {
  Text t = text_begin(buf, cap);
  for (int i = 0; p && i < p->n && !text_full(&t); i++) {
    const char *name = p->p[i].name;
    if (strcmp(name, "axes") == 0 || strcmp(name, "axis_name") == 0) continue;
    if (t.len) text_puts(&t, " ");
    text_puts(&t, name);
    text_puts(&t, "=");
    repr_value(&t, p->p[i].value);
  }
}

void coll_sig_of(Array **in, int nin, CollDesc *d) {
  d->nin = nin;
  d->ndims = 0;
  for (int i = 0; i < nin; i++) {
    d->dtype[i] = (signed char)in[i]->dtype;
    d->ndim[i] = (signed char)in[i]->ndim;
    memcpy(d->dims + d->ndims, in[i]->shape, sizeof(int64_t) * (size_t)in[i]->ndim);
    d->ndims += in[i]->ndim;
  }
}

bool coll_sig_equal(const CollDesc *a, const CollDesc *b) {
  if (a->nin != b->nin || a->ndims != b->ndims) return false;
  for (int i = 0; i < a->nin; i++)
    if (a->dtype[i] != b->dtype[i] || a->ndim[i] != b->ndim[i]) return false;
  for (int i = 0; i < a->ndims; i++)
    if (a->dims[i] != b->dims[i]) return false;
  return true;
}

void coll_sig_str(const CollDesc *d, char *buf, size_t cap) {
  Text t = text_begin(buf, cap);
  const int64_t *dim = d->dims;
  for (int i = 0; i < d->nin && !text_full(&t); i++) {
    if (i) text_puts(&t, ", ");
    text_puts(&t, dt_short((DType)d->dtype[i]));
    text_puts(&t, "[");
    for (int k = 0; k < d->ndim[i]; k++) {
      if (k) text_puts(&t, ",");
      text_int(&t, *dim++);
    }
    text_puts(&t, "]");
  }
}

/* ---- axes and participants ------------------------------------------------- */

Value *coll_axis_param(const Params *p) {
  static const char *const axis_name = "axis_name", *const axes = "axes";
  for (int i = 0; i < p->n; i++)
    if (p->p[i].name == axis_name || p->p[i].name == axes) return p->p[i].value;
  Value *v = params_get(p, axis_name);
  return v ? v : params_get(p, axes);
}

void coll_axes_str(const MeshDesc *m, const CollDesc *d, char *buf, size_t cap) {
  size_t len = 0;
  if (d->naxes == 1) {
    snprintf(buf, cap, "'%s'", m->names[d->axes[0]]);
    return;
  }
  len += (size_t)snprintf(buf, cap, "(");
  for (int k = 0; k < d->naxes && len < cap; k++)
    len += (size_t)snprintf(buf + len, cap - len, "%s'%s'", k ? ", " : "",
                            m->names[d->axes[k]]);
  if (len < cap) snprintf(buf + len, cap - len, ")");
}

int coll_unknown_axis(const char *prim, const MeshDesc *m, const char *name) {
  char have[256] = "";
  size_t len = 0;
  for (int a = 0; a < m->naxes && len < sizeof have; a++)
    len += (size_t)snprintf(have + len, sizeof have - len, "%s'%s'",
                            a ? ", " : "", m->names[a]);
  err_set(ERR_NAME, "%s: unknown axis name '%s' (the mesh's axes are %s)",
          prim, name, m->naxes ? have : "none");
  return -1;
}

int coll_auto_axis(const char *prim, const MeshDesc *m, int a) {
  char have[256] = "";
  size_t len = 0;
  for (int q = 0; q < m->naxes && len < sizeof have; q++)
    if (!(m->auto_axes >> q & 1))
      len += (size_t)snprintf(have + len, sizeof have - len, "%s'%s'", len ? ", " : "",
                              m->names[q]);
  err_set(ERR_NAME, "%s: unbound axis name '%s': this shard_map is manual only over %s "
          "(axis_names=), and '%s' is an automatic axis, which collectives and axis_index "
          "cannot name", prim, m->names[a], len ? have : "no axis", m->names[a]);
  return -1;
}

/* Resolves the axis names of [p] against [m] into axes[] (user's order). */
static int resolve_axes(const char *prim, const MeshDesc *m, const Params *p,
                        int *axes, int *naxes) {
  Value *v = coll_axis_param(p);
  size_t n = 1;
  Value *const *items = &v;
  if (!v) return err_set(ERR_TYPE, "%s: missing axis name", prim), -1;
  if (v->type != V_STR && !val_seq(v, &n, &items))
    return err_set(ERR_TYPE, "%s: axis_name must be a string or a tuple of "
                   "strings", prim), -1;
  if (n == 0 || n > DEV_MAX_AXES)
    return err_set(ERR_VALUE, "%s: expected 1 to %d axis names, got %zu", prim,
                   DEV_MAX_AXES, n), -1;
  for (size_t k = 0; k < n; k++) {
    if (items[k]->type != V_STR)
      return err_set(ERR_TYPE, "%s: axis names must be strings", prim), -1;
    int a = dev_mesh_axis(m, str_cstr(items[k]));
    if (a < 0) return coll_unknown_axis(prim, m, str_cstr(items[k]));
    if (m->auto_axes >> a & 1) return coll_auto_axis(prim, m, a);
    for (size_t q = 0; q < k; q++)
      if (axes[q] == a)
        return err_set(ERR_VALUE, "%s: axis '%s' named twice", prim,
                       m->names[a]), -1;
    axes[k] = a;
  }
  *naxes = (int)n;
  return 0;
}

int coll_flat_size(const MeshDesc *m, const int *axes, int naxes) {
  int n = 1;
  for (int k = 0; k < naxes; k++) n *= m->sizes[axes[k]];
  return n;
}

int coll_flat_index(const MeshDesc *m, const int *axes, int naxes,
                    const int *coords) {
  int idx = 0;
  for (int k = 0; k < naxes; k++) idx = idx * m->sizes[axes[k]] + coords[axes[k]];
  return idx;
}

int coll_rank_at(const MeshDesc *m, const int *axes, int naxes,
                 const int *coords, int idx) {
  int c[DEV_MAX_AXES];
  memcpy(c, coords, sizeof c);
  for (int k = naxes - 1; k >= 0; k--) {
    c[axes[k]] = idx % m->sizes[axes[k]];
    idx /= m->sizes[axes[k]];
  }
  return dev_mesh_rank(m, c);
}

int coll_check_groups(const char *prim, Value *v, int size, int *gsize) {
  size_t ng, len0 = 0;
  Value *const *groups;
  if (!val_seq(v, &ng, &groups) || ng == 0)
    return err_set(ERR_TYPE, "%s: axis_index_groups must be a tuple of tuples "
                   "of ints", prim), -1;
  int seen[1024] = {0};
  if (size > 1024)
    return err_set(ERR_VALUE, "%s: axis_index_groups over an axis of size %d "
                   "(at most 1024 supported)", prim, size), -1;
  for (size_t i = 0; i < ng; i++) {
    size_t len;
    Value *const *ids;
    if (!val_seq(groups[i], &len, &ids) || (i && len != len0) || len == 0)
      return err_set(ERR_VALUE, "%s: axis_index_groups must all have the same "
                     "nonzero size", prim), -1;
    len0 = len;
    for (size_t j = 0; j < len; j++) {
      int64_t x = coll_is_intlike(ids[j]) ? coll_elem_i64((Array *)ids[j], 0) : -1;
      if (x < 0 || x >= size || seen[x]++)
        return err_set(ERR_VALUE, "%s: axis_index_groups must cover every "
                       "index of the axis (size %d) exactly once", prim, size), -1;
    }
  }
  if (len0 * ng != (size_t)size)
    return err_set(ERR_VALUE, "%s: axis_index_groups must cover every index "
                   "of the axis (size %d) exactly once", prim, size), -1;
  *gsize = (int)len0;
  return 0;
}

/* The group (tuple of ints) of axis_index_groups [v] holding [idx]. */
static Value *group_of(Value *v, int idx, int *pos) {
  size_t ng, len;
  Value *const *groups, *const *ids;
  val_seq(v, &ng, &groups);
  for (size_t i = 0; i < ng; i++) {
    val_seq(groups[i], &len, &ids);
    for (size_t j = 0; j < len; j++)
      if (coll_elem_i64((Array *)ids[j], 0) == idx) return *pos = (int)j, groups[i];
  }
  return NULL;
}

Value *coll_groups_param(const Params *p) {
  Value *v = params_get(p, "axis_index_groups");
  return v == VAL_NONE ? NULL : v;
}

int coll_find_participants(Call *c, const char *prim, const Params *p) {
  const MeshDesc *m = &c->g->mesh;
  const int *coords = c->g->slots[c->rank].ctx.coords;
  const int *axes = c->desc.axes, na = c->desc.naxes;
  int me = coll_flat_index(m, axes, na, coords);
  c->axis_size = coll_flat_size(m, axes, na);
  Value *groups = coll_groups_param(p);
  if (!groups) {
    c->n = c->axis_size;
    c->pos = me;
    for (int i = 0; i < c->n; i++) c->peers[i] = coll_rank_at(m, axes, na, coords, i);
    return 0;
  }
  if (coll_check_groups(prim, groups, c->axis_size, &c->n) < 0) return -1;
  size_t len;
  Value *const *ids;
  val_seq(group_of(groups, me, &c->pos), &len, &ids);
  for (size_t j = 0; j < len; j++)
    c->peers[j] = coll_rank_at(m, axes, na, coords, (int)coll_elem_i64((Array *)ids[j], 0));
  return 0;
}

/* ---- the memo of the last set-up ------------------------------------------- */

/* Whether parameter values [a] and [b] are the same for a collective: one
 * value, or equal strings, equal tuples of such, or numbers of one dtype
 * and value (not 1 and True: their canonical texts differ). */
static bool param_same(const Value *a, const Value *b) {
  if (a == b) return true;
  if (a->type != b->type) return false;
  switch ((VType)a->type) {
  case V_STR:
    return ((const Str *)a)->len == ((const Str *)b)->len &&
           memcmp(str_cstr(a), str_cstr(b), ((const Str *)a)->len) == 0;
  case V_TUPLE:
    if (tuple_len(a) != tuple_len(b)) return false;
    for (size_t i = 0; i < tuple_len(a); i++)
      if (!param_same(tuple_get(a, i), tuple_get(b, i))) return false;
    return true;
  case V_ARRAY: {
    const Array *x = (const Array *)a, *y = (const Array *)b;
    return x->ndim == 0 && y->ndim == 0 && x->dtype == y->dtype &&
           memcmp(arr_data(x), arr_data(y), dt_size(x->dtype)) == 0;
  }
  default:
    return false;
  }
}

bool coll_axes_memo_hit(AxesMemo *am, Value *v) {
  if (!v || !am->v) return false;
  if (v == am->v) return true;
  if (!param_same(v, am->v)) return false;
  val_decref(am->v);
  am->v = val_incref(v);
  return true;
}

int coll_memo_axes(Slot *s, const char *prim, const MeshDesc *m, const Params *p,
                   int *axes, int *naxes) {
  AxesMemo *am = &s->axes_memo;
  Value *v = coll_axis_param(p);
  if (coll_axes_memo_hit(am, v)) {
    memcpy(axes, am->axes, sizeof(int) * (size_t)am->naxes);
    *naxes = am->naxes;
    return 0;
  }
  if (resolve_axes(prim, m, p, axes, naxes) < 0) return -1;
  val_decref(am->v);
  am->v = val_incref(v);
  am->naxes = *naxes;
  memcpy(am->axes, axes, sizeof(int) * (size_t)*naxes);
  am->mask = 0;
  for (int k = 0; k < *naxes; k++) am->mask |= 1u << axes[k];
  return 0;
}

int coll_ctx_axes(const DevCtx *ctx, const char *prim, const Params *p,
                  int *axes, int *naxes) {
  if (ctx->group && ctx->mesh == &ctx->group->mesh)
    return coll_memo_axes(&ctx->group->slots[ctx->rank], prim, ctx->mesh, p, axes, naxes);
  return resolve_axes(prim, ctx->mesh, p, axes, naxes);
}

void coll_memo_clear(CallMemo *m) {
  for (int i = 0; m->valid && i < m->np; i++) val_decref(m->vals[i]);
  m->valid = false;
}

bool coll_memo_hit(CallMemo *m, int kind, const Params *p) {
  if (!m->valid || m->kind != kind || m->np != p->n) return false;
  for (int i = 0; i < p->n; i++)
    if ((m->names[i] != p->p[i].name && strcmp(m->names[i], p->p[i].name) != 0) ||
        !param_same(m->vals[i], p->p[i].value))
      return false;
  for (int i = 0; i < p->n; i++)
    if (m->vals[i] != p->p[i].value) {
      val_decref(m->vals[i]);
      m->vals[i] = val_incref(p->p[i].value);
    }
  return true;
}

void coll_memo_fill(CallMemo *m, int kind, const Params *p, const Call *c) {
  m->kind = kind;
  m->np = p->n;
  for (int i = 0; i < p->n; i++) {
    m->names[i] = p->p[i].name;
    m->vals[i] = val_incref(p->p[i].value);
  }
  m->naxes = c->desc.naxes;
  memcpy(m->axes, c->desc.axes, sizeof m->axes);
  m->n = c->n;
  m->pos = c->pos;
  m->axis_size = c->axis_size;
  m->cross = c->cross;
  memcpy(m->params, c->desc.params, sizeof m->params);
  m->valid = true;
}

void coll_memo_free(Slot *s) {
  coll_memo_clear(&s->memo);
  val_decref(s->axes_memo.v);
  s->axes_memo.v = NULL;
}
