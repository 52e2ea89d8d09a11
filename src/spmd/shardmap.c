/*
 * shardmap.c - shard_map calls, and the collective built-ins (shardmap.h).
 */
#include <stdio.h>
#include <string.h>

#include "array/array.h"
#include <pthread.h>

#include "lang/builtins.h"
#include "lang/classes.h"
#include "lang/pytree.h"
#include "spmd/collective.h"
#include "spmd/device.h"
#include "base/error.h"
#include "base/intern.h"
#include "base/mem.h"
#include "lang/ops.h"
#include "array/prim.h"
#include "array/print.h"
#include "spmd/shardmap.h"
#include "spmd/sharding.h"
#include "spmd/transport.h"
#include "spmd/xcall.h"

/* ==== the ShardFn value ===================================================== */

static void shardfn_free(Value *v) {
  ShardFn *f = (ShardFn *)v;
  val_decref(f->body);
  val_decref(&f->mesh->hdr);
  val_decref(f->in_specs);
  val_decref(f->out_specs);
  if (f->in_tree) val_decref(f->in_tree);
  if (f->out_tree) val_decref(f->out_tree);
  if (f->arg_labels) val_decref(f->arg_labels);
  shm_free(f->out_why);
  if (f->ret.src) src_decref(f->ret.src);
  shm_free(f);
}

static Value *shardfn_repr(Value *v) {
  return str_printf("<shard_map function %s>", ((ShardFn *)v)->name);
}

/* True if [v] is a P(...) or a tuple/list of them. */
static bool is_specs(Value *v) {
  if (v->type == V_PSPEC) return true;
  size_t n;
  Value *const *items;
  if (!val_seq(v, &n, &items)) return false;
  for (size_t i = 0; i < n; i++)
    if (items[i]->type != V_PSPEC) return false;
  return true;
}

/* True if [v] is specs nested in tuples, lists and dicts, None among them
 * (a pytree prefix of arguments or results). */
static bool is_spec_tree(Value *v, int depth) {
  if (v->type == V_PSPEC || v == VAL_NONE) return true;
  if (depth > 64) return false;
  if (cls_is_tree_node(v)) {   /* a registered class's instance holding specs */
    Value *aux, *kids = cls_tree_children(v, &aux);
    bool ok = kids && is_spec_tree(kids, depth + 1);
    if (kids) val_decref(aux);
    val_decref(kids);
    if (!kids) err_clear();
    return ok;
  }
  if (v->type == V_DICT) {
    Dict *d = (Dict *)v;
    for (size_t i = 0; i < d->len; i++)
      if (!is_spec_tree(d->vals[i], depth + 1)) return false;
    return true;
  }
  size_t n;
  Value *const *items;
  if (!val_seq(v, &n, &items)) return false;
  for (size_t i = 0; i < n; i++)
    if (!is_spec_tree(items[i], depth + 1)) return false;
  return true;
}

/* A list of specs becomes a tuple, so the rest of this file sees two forms. */
static Value *specs_normalize(Value *v) {
  if (v->type != V_LIST) return val_incref(v);
  return tuple_pack(list_len(v), ((List *)v)->items);
}

Value *shardmap_new(const char *name, Value *body, Value *mesh, Value *in_specs,
                    Value *out_specs, bool check_rep) {
  if (mesh->type != V_MESH)
    return err_set(ERR_TYPE, "shard_map: mesh must be a Mesh, got %s", val_type_name(mesh));
  bool tree = !is_specs(in_specs) || !is_specs(out_specs);
  if (tree && !(is_spec_tree(in_specs, 0) && is_spec_tree(out_specs, 0)))
    return err_set(ERR_TYPE, "shard_map: in_specs and out_specs must be P(...) or pytrees of "
                             "P(...) (None: an argument passed whole to every device)");
  ShardFn *f = shm_calloc(1, sizeof *f);
  if (!f) return err_nomem();
  val_init(&f->hdr, V_SHARDFN);
  f->name = name ? name : intern_cstr("<shard_map>");
  f->body = val_incref(body);
  f->mesh = (Mesh *)val_incref(mesh);
  f->check_rep = check_rep;
  if (tree) {   /* per call, the specs of the arguments' leaves (shardmap_call_tree) */
    f->in_tree = val_incref(in_specs);
    f->out_tree = val_incref(out_specs);
    f->in_specs = pspec_from_args(0, NULL);
    f->out_specs = pspec_from_args(0, NULL);
  } else {
    f->in_specs = specs_normalize(in_specs);
    f->out_specs = specs_normalize(out_specs);
  }
  if (!f->in_specs || !f->out_specs) {
    val_decref(&f->hdr);
    return NULL;
  }
  return &f->hdr;
}

/* ==== splitting the arguments into blocks ==================================== */

/* The spec for argument [i] of [n]. */
static PSpec *in_spec_of(const ShardFn *f, int i) {
  if (f->in_specs->type == V_PSPEC) return (PSpec *)f->in_specs;
  return (PSpec *)tuple_get(f->in_specs, (size_t)i);
}

PSpec *shardmap_in_spec(const ShardFn *f, int i) { return in_spec_of(f, i); }

PSpec *shardmap_out_spec(const ShardFn *f, int k) {
  return f->out_specs->type == V_PSPEC ? (PSpec *)f->out_specs
                                       : (PSpec *)tuple_get(f->out_specs, (size_t)k);
}


static void entry_names_str(const SpecEntry *e, char *buf, size_t cap) {
  if (e->nnames == 1) {
    snprintf(buf, cap, "mesh axis '%s'", e->names[0]);
    return;
  }
  size_t len = (size_t)snprintf(buf, cap, "mesh axes (");
  for (int k = 0; k < e->nnames && len < cap; k++)
    len += (size_t)snprintf(buf + len, cap - len, "%s'%s'", k ? ", " : "", e->names[k]);
  if (len < cap) snprintf(buf + len, cap - len, ")");
}

/* The name of the body's parameter [i], or NULL (not a user function). */
static const char *param_name(const ShardFn *f, int i) {
  if (f->body->type != V_FUNC) return NULL;
  const Node *d = ((Func *)f->body)->node;
  return i < d->nparams && !d->params[i].star && !d->params[i].starstar ? d->params[i].name : NULL;
}

/* How messages name argument [i] of [nargs] ("argument 0 ('x')", or a
 * leaf of a pytree argument), or "" for the only argument of a builtin. */
static void arg_label(const ShardFn *f, int i, int nargs, char *buf, size_t cap) {
  const char *param = param_name(f, i);
  buf[0] = 0;
  if (f->arg_labels && (size_t)i < tuple_len(f->arg_labels))
    snprintf(buf, cap, "%s", str_cstr(tuple_get(f->arg_labels, (size_t)i)));
  else if (param) snprintf(buf, cap, "argument %d ('%s')", i, param);
  else if (nargs > 1) snprintf(buf, cap, "argument %d", i);
}

Value *shardmap_arg_label(const ShardFn *f, int i) {
  char buf[160];
  arg_label(f, i, 2, buf, sizeof buf);
  return str_from(buf);
}

Value *shardmap_arg_labels(const ShardFn *f, int lead, int n, int trail) {
  Value *t = tuple_new((size_t)(lead + n + trail));
  for (int i = 0; t && i < lead + n + trail; i++) {
    char buf[160];
    if (i >= lead && i < lead + n) arg_label(f, i - lead, 2, buf, sizeof buf);
    else snprintf(buf, sizeof buf, "captured value %d", i < lead ? i : i - lead - n);
    Value *s = str_from(buf);
    if (!s) {
      for (int k = i; k < lead + n + trail; k++) tuple_set_steal(t, (size_t)k, val_incref(VAL_NONE));
      val_decref(t);
      return NULL;
    }
    tuple_set_steal(t, (size_t)i, s);
  }
  return t ? t : err_nomem();
}

/* Checks argument [x] against in_spec [s]: rank, axes, even division.
 * Messages follow LANGUAGE.md §9; with several arguments they say which. */
static int check_arg(const ShardFn *f, int i, int nargs, int ndim, const int64_t *shape,
                     PSpec *s) {
  char what[160], sb[256], names[128], arg[144] = "";
  arg_label(f, i, nargs, arg, sizeof arg - 2);
  if (arg[0]) strcat(arg, ": ");
  snprintf(what, sizeof what, "%sin_specs", arg);
  if (pspec_check(s, f->mesh, ndim, what) < 0) return -1;
  pspec_str(s, sb, sizeof sb);
  for (int ax = 0; ax < s->n; ax++) {
    int n = pspec_entry_size(s, f->mesh, ax);
    if (shape[ax] % n == 0) continue;
    entry_names_str(&s->e[ax], names, sizeof names);
    err_set(ERR_VALUE, "%sin_specs %s splits axis %d (size %lld) over %s (size %d), which "
                       "does not divide it; check the in_specs, or change the mesh axis "
                       "sizes, or pad the argument and adapt %s to it, as JAX suggests",
            arg, sb, ax, (long long)shape[ax], names, n, f->name);
    return -1;
  }
  return 0;
}

/* Block index along array axis [ax] for the device at [coords]: the mixed
 * radix number of its coordinates along the entry's axes, major first. */
static int64_t block_index(const PSpec *s, const Mesh *m, int ax, const int *coords) {
  int64_t idx = 0;
  for (int k = 0; ax < s->n && k < s->e[ax].nnames; k++) {
    int mi = mesh_axis(m, s->e[ax].names[k]);
    idx = idx * m->axis_sizes[mi] + coords[mi];
  }
  return idx;
}

/* The mesh axes named anywhere in [s], as a bit set. */
static uint32_t spec_axes(const PSpec *s, const Mesh *m) {
  uint32_t bits = 0;
  for (int ax = 0; ax < s->n; ax++)
    for (int k = 0; k < s->e[ax].nnames; k++) bits |= 1u << mesh_axis(m, s->e[ax].names[k]);
  return bits;
}

/* Device [rank]'s block of [x] under [s]: a view sharing x's buffer. */
static Array *block_of(Array *x, const PSpec *s, const Mesh *m, int rank) {
  int coords[MESH_MAX_AXES];
  int64_t shape[SHM_MAXDIM], off = x->offset;
  mesh_coords(m, rank, coords);
  for (int ax = 0; ax < x->ndim; ax++) {
    int n = ax < s->n ? pspec_entry_size(s, m, ax) : 1;
    shape[ax] = x->shape[ax] / n;
    off += block_index(s, m, ax, coords) * shape[ax] * x->strides[ax];
  }
  Array *b = arr_view(x, x->ndim, shape, x->strides, off);
  if (b) b->vma = spec_axes(s, m);
  return b;
}

/* ==== running on the devices =================================================== */

typedef struct Call {
  ShardFn *f;
  int nargs;
  Array **args;      /* the checked, converted arguments (owned) */
  Value **results;   /* per rank (owned) */
  OutBuf *out;       /* per rank print output */
  Loc *ret;          /* per rank: where the body returned (its last statement) */
  uint32_t withheld; /* results (bits) each process keeps its own blocks of (local_results) */
} Call;

/* The bytes of [a]'s elements. */
static size_t block_bytes(const Array *a) { return (size_t)a->size * dt_size(a->dtype); }

/* Runs the body on device [rank].  Its argument blocks are views of the
 * global arrays; they count as the device's memory while the body runs
 * (shm_mem_charge), as an argument's shard is on hardware. */
static void run_device(int rank, void *vctx) {
  Call *c = vctx;
  Value *blocks[SHARDMAP_MAX_ARGS];
  int made = 0, tags[SHARDMAP_MAX_ARGS];
  eval_set_output(&c->out[rank]);
  DevCtx *dc = dev_ctx();
  if (dc) dc->unchecked = !c->f->check_rep;
  for (; made < c->nargs; made++) {
    Array *b = block_of(c->args[made], in_spec_of(c->f, made), c->f->mesh, rank);
    if (!b) break;
    if (b->vma) b->why = (VmaWhy){0, 0, (int16_t)(made + 1), b->vma};   /* its in_spec splits it */
    blocks[made] = &b->hdr;
    tags[made] = shm_mem_charge(block_bytes(b));
  }
  Loc before = eval_current_loc();
  if (made == c->nargs) c->results[rank] = val_call_n(c->f->body, c->nargs, blocks);
  /* the body's last statement, its return, when the interpreter ran it (a
   * compiled body leaves the thread's location as it was) */
  Loc after = eval_current_loc();
  if (c->ret && (after.src != before.src || after.line != before.line || after.col != before.col))
    c->ret[rank] = after;
  for (int i = 0; i < made; i++) {
    shm_mem_uncharge(tags[i], block_bytes(AS_ARRAY(blocks[i])));
    val_decref(blocks[i]);
  }
  eval_const_cache_clear();
  eval_set_output(NULL);
}

/* Writes each device's print output, line by line, prefixed by its mesh
 * coordinates, in device order. */
static void flush_outputs(const Call *c) {
  for (int r = 0; r < c->f->mesh->size; r++) {
    const OutBuf *b = &c->out[r];
    char coords[160];
    mesh_coords_str(c->f->mesh, r, coords, sizeof coords);
    size_t start = 0;
    while (start < b->len) {
      const char *nl = memchr(b->data + start, '\n', b->len - start);
      size_t end = nl ? (size_t)(nl - b->data) : b->len;
      eval_write(coords, strlen(coords));
      eval_write(": ", 2);
      eval_write(b->data + start, end - start);
      eval_write("\n", 1);
      start = end + 1;
    }
  }
}


/* ==== assembling the results ======================================================== */

/* Copies contiguous [src] (shape [bs]) into contiguous [dst] (shape [gs])
 * at the element offsets [at] per axis. */
static void place_block(char *dst, const int64_t *gs, const char *src, const int64_t *bs,
                        const int64_t *at, int ndim, size_t isz) {
  if (ndim <= 1) {
    memcpy(dst + (size_t)(ndim ? at[0] : 0) * isz, src, (size_t)(ndim ? bs[0] : 1) * isz);
    return;
  }
  size_t gstride = isz, bstride = isz;
  for (int i = 1; i < ndim; i++) {
    gstride *= (size_t)gs[i];
    bstride *= (size_t)bs[i];
  }
  for (int64_t r = 0; r < bs[0]; r++)
    place_block(dst + (size_t)(at[0] + r) * gstride, gs + 1, src + (size_t)r * bstride,
                bs + 1, at + 1, ndim - 1, isz);
}

/* The first flat index where contiguous [a] and [b] (same shape) differ
 * bitwise, or -1.  Blocks that share a buffer (a psum's result) are
 * equal at once; others are compared in runs of memcmp. */
static int64_t first_difference(Array *a, Array *b) {
  size_t isz = dt_size(a->dtype);
  const char *pa = arr_data(a), *pb = arr_data(b);
  if (pa == pb) return -1;
  const int64_t run = 4096;
  for (int64_t lo = 0; lo < a->size; lo += run) {
    int64_t n = a->size - lo < run ? a->size - lo : run;
    if (!memcmp(pa + (size_t)lo * isz, pb + (size_t)lo * isz, (size_t)n * isz)) continue;
    for (int64_t i = lo;; i++)
      if (memcmp(pa + (size_t)i * isz, pb + (size_t)i * isz, isz)) return i;
  }
  return -1;
}

static void index_str(const Array *a, int64_t flat, char *buf, size_t cap) {
  int64_t idx[SHM_MAXDIM];
  for (int i = a->ndim - 1; i >= 0; i--) {
    idx[i] = a->shape[i] ? flat % a->shape[i] : 0;
    flat = a->shape[i] ? flat / a->shape[i] : 0;
  }
  shape_str(buf, cap, a->ndim, idx);
}

/* Why a result varies over mesh axis number [a] (from [why], when it
 * explains that axis; [label] and [arg_spec] the argument it names), and
 * the fitting hint, into [buf]. */
static void vma_reason(const Mesh *m, VmaWhy why, int a, const char *label,
                       const PSpec *arg_spec, char *buf, size_t cap) {
  const char *ax = m->axis_names[a];
  if (!(why.axes & (1u << a)) || (!why.prim && (!why.arg || !label || !arg_spec))) {
    snprintf(buf, cap, " (is a psum over '%s' missing?)", ax);
  } else if (why.prim) {
    const char *prim = prim_table[why.prim - 1].name;
    bool index = why.prim - 1 == P_AXIS_INDEX;
    snprintf(buf, cap, ": %s%s at line %d makes it vary over '%s'; reduce it over '%s' "
                       "(psum, pmax, pmin) or name '%s' in out_specs",
             prim, index ? "" : " (a collective whose result differs per device)", why.line, ax,
             ax, ax);
  } else {
    char sb[256];
    pspec_str(arg_spec, sb, sizeof sb);
    snprintf(buf, cap, ": it is computed from %s, which in_specs %s splits over '%s' "
                       "(is a psum over '%s' missing?)", label, sb, ax, ax);
  }
}

int shardmap_vma_error(const Mesh *m, const PSpec *s, int k, int a, VmaWhy why,
                       const char *label, const PSpec *arg_spec, Loc at) {
  char sb[256], reason[512];
  pspec_str(s, sb, sizeof sb);
  vma_reason(m, why, a, label, arg_spec, reason, sizeof reason);
  const char *ax = m->axis_names[a];
  if (at.src)   /* at the body's return */
    err_set_at(at, ERR_VALUE, "out_specs %s does not mention mesh axis '%s', but result %d "
                              "varies over '%s'%s", sb, ax, k, ax, reason);
  else
    err_set(ERR_VALUE, "out_specs %s does not mention mesh axis '%s', but result %d varies over "
                       "'%s'%s", sb, ax, k, ax, reason);
  return -1;
}

/* The replication error of [f]'s result [k] over axis [a], explained by
 * [why] (a compiled body's blocks record none: its plan's reason,
 * ShardFn.out_why, and its return, ShardFn.ret, are used then). */
static int fn_vma_error(const ShardFn *f, const PSpec *s, int k, int a, VmaWhy why, Loc at) {
  if (!(why.axes & (1u << a)) && f->out_why) why = f->out_why[k];
  if (!at.src) at = f->ret;
  char label[144] = "";
  const PSpec *spec = NULL;
  if (why.arg) {
    arg_label(f, why.arg - 1, 2, label, sizeof label);
    spec = in_spec_of(f, why.arg - 1);
  }
  return shardmap_vma_error(f->mesh, s, k, a, why, label, spec, at);
}

/* The first device whose block [blocks] varies over mesh axis [a], one
 * whose recorded reason explains that axis if there is one. */
static int device_varying(const Mesh *m, Array *const *blocks, int a) {
  int any = -1;
  for (int r = 0; r < m->size; r++) {
    if (!(blocks[r]->vma & (1u << a))) continue;
    if (blocks[r]->why.axes & (1u << a)) return r;
    if (any < 0) any = r;
  }
  return any;
}

/* Checks that result [k] varies only over axes its out_spec names. */
static int check_vma(const ShardFn *f, const PSpec *s, Array *const *blocks, int k,
                     const Loc *ret) {
  const Mesh *m = f->mesh;
  uint32_t vary = 0, named = spec_axes(s, m);
  for (int r = 0; r < m->size; r++) vary |= blocks[r]->vma;
  for (int a = 0; a < m->naxes; a++) {
    if (!(vary & ~named & (1u << a))) continue;
    int r = device_varying(m, blocks, a);
    return fn_vma_error(f, s, k, a, blocks[r]->why, ret ? ret[r] : (Loc){0});
  }
  return 0;
}

static int check_blocks_agree(const ShardFn *f, const PSpec *s, Array *const *blocks, int k) {
  const Mesh *m = f->mesh;
  char sb[256], w0[64], w1[64], ca[160], cb[160];
  pspec_str(s, sb, sizeof sb);
  if (s->n > blocks[0]->ndim) {
    err_set(ERR_VALUE, "out_specs %s has %d entries but result %d has rank %d", sb, s->n, k,
            blocks[0]->ndim);
    return -1;
  }
  if (pspec_check(s, m, blocks[0]->ndim, "out_specs") < 0) return -1;
  for (int r = 1; r < m->size; r++) {
    Array *a = blocks[0], *b = blocks[r];
    if (a->dtype == b->dtype && a->ndim == b->ndim &&
        memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim) == 0)
      continue;
    aval_str(w0, sizeof w0, a->dtype, a->ndim, a->shape);
    aval_str(w1, sizeof w1, b->dtype, b->ndim, b->shape);
    mesh_coords_str(m, 0, ca, sizeof ca);
    mesh_coords_str(m, r, cb, sizeof cb);
    err_set(ERR_VALUE, "result %d has different shapes on different devices: device %s "
                       "returned %s, device %s returned %s", k, ca, w0, cb, w1);
    return -1;
  }
  return 0;
}

/* The untile check: blocks of devices that differ only along mesh axes
 * the out_spec leaves out must be equal, bit for bit. */
static int check_untiled(const ShardFn *f, const PSpec *s, Array *a, Array *b, int ra, int rb) {
  int64_t d = first_difference(a, b);
  if (d < 0) return 0;
  char sb[256], ca[160], cb[160], at[128];
  pspec_str(s, sb, sizeof sb);
  mesh_coords_str(f->mesh, ra, ca, sizeof ca);
  mesh_coords_str(f->mesh, rb, cb, sizeof cb);
  index_str(a, d, at, sizeof at);
  err_set(ERR_VALUE, "out_specs %s untiles a result whose blocks differ: device %s and "
                     "device %s returned different values (first difference at index %s)",
          sb, ca, cb, at);
  return -1;
}

/* Marks [out] (a new result, not yet shared) laid out by [s] over [c]'s
 * mesh, whatever the arguments' layouts (LANGUAGE.md; JAX's shard_map:
 * its results carry the sharding its out_specs give), as a jit of the
 * call lays them out (transform/partition.c runs a shard_map over its
 * own mesh in place), so eager and jit agree.  0, or -1 out of memory. */
static int lay_out_result(const Call *c, Value *out, PSpec *s) {
  if (!IS_ARRAY(out)) return 0;
  Value *ns = sharding_new(c->f->mesh, s);
  if (!ns) return err_nomem(), -1;
  Array *a = AS_ARRAY(out);
  if (a->sharding) val_decref(a->sharding);
  a->sharding = ns;
  return 0;
}

/* Result [k] laid out by [s] from the blocks of this process's devices
 * only (the others' are NULL: Call.withheld): an array holding only
 * this process's blocks of it. */
static Value *assemble_local(const ShardFn *f, const PSpec *s, Array **blocks) {
  const Mesh *m = f->mesh;
  Array *b0 = NULL;
  for (int r = 0; r < m->size && !b0; r++) b0 = blocks[r];
  int64_t gs[SHM_MAXDIM], nblk[SHM_MAXDIM];
  uint8_t *held = NULL;
  for (int ax = 0; ax < b0->ndim; ax++) gs[ax] = b0->shape[ax] * pspec_entry_size(s, m, ax);
  Value *ns = sharding_new(f->mesh, (PSpec *)s);
  Array *out = ns ? arr_new(b0->dtype, b0->ndim, gs) : NULL;
  if (!out || !sharding_local_blocks((NamedSharding *)ns, b0->ndim, gs, nblk, &held)) {
    if (out) val_decref(&out->hdr);
    if (ns) val_decref(ns);
    return err_kind() ? NULL : err_set(ERR_COLLECTIVE, "shard_map: processes disagree on "
                                       "which results they keep their own blocks of");
  }
  out->weak = b0->weak;
  out->vma = 0;
  /* the held blocks are known before any is written (arr_set_partial);
   * they are then written through the buffer, as arr_data would check */
  int rc = arr_set_partial(out, ns, nblk, held);
  shm_free(held);
  if (rc < 0) {
    val_decref(&out->hdr);
    val_decref(ns);
    return NULL;
  }
  for (int r = 0; r < m->size; r++) {
    if (!blocks[r]) continue;
    int coords[MESH_MAX_AXES];
    int64_t at[SHM_MAXDIM];
    mesh_coords(m, r, coords);
    for (int ax = 0; ax < b0->ndim; ax++) at[ax] = block_index(s, m, ax, coords) * b0->shape[ax];
    place_block(out->buf->data, gs, arr_data(blocks[r]), blocks[r]->shape, at, b0->ndim,
                dt_size(b0->dtype));
  }
  out->sharding = ns;
  return &out->hdr;
}

static Value *assemble(const ShardFn *f, const PSpec *s, Array **blocks, int k,
                       const Loc *ret) {
  const Mesh *m = f->mesh;
  for (int r = 0; r < m->size; r++)
    if (!blocks[r]) return assemble_local(f, s, blocks);
  if (check_blocks_agree(f, s, blocks, k) < 0) return NULL;
  if (f->check_rep && check_vma(f, s, blocks, k, ret) < 0) return NULL;
  Array *b0 = blocks[0];
  int64_t gs[SHM_MAXDIM], nblocks = 1;
  for (int ax = 0; ax < b0->ndim; ax++) {
    int n = pspec_entry_size(s, m, ax);
    gs[ax] = b0->shape[ax] * n;
    nblocks *= n;
  }
  /* One block (a replicated result, P()): the global array is a view of
   * device 0's block, not a copy; values are immutable once shared. */
  Array *out = nblocks == 1 ? arr_view(b0, b0->ndim, b0->shape, b0->strides, b0->offset)
                            : arr_new(b0->dtype, b0->ndim, gs);
  int *owner = shm_malloc(sizeof(int) * (size_t)nblocks);
  if (!out || !owner) {
    if (out) err_nomem();
    goto fail;
  }
  out->weak = b0->weak;
  out->vma = 0;
  for (int64_t i = 0; i < nblocks; i++) owner[i] = -1;
  for (int r = 0; r < m->size; r++) {
    int coords[MESH_MAX_AXES];
    int64_t at[SHM_MAXDIM], flat = 0;
    mesh_coords(m, r, coords);
    for (int ax = 0; ax < b0->ndim; ax++) {
      int64_t bi = block_index(s, m, ax, coords);
      flat = flat * pspec_entry_size(s, m, ax) + bi;
      at[ax] = bi * b0->shape[ax];
    }
    if (owner[flat] >= 0) {
      if (f->check_rep && check_untiled(f, s, blocks[owner[flat]], blocks[r], owner[flat], r) < 0)
        goto fail;
      continue;
    }
    owner[flat] = r;
    if (nblocks > 1)
      place_block(arr_data(out), gs, arr_data(blocks[r]), blocks[r]->shape, at, b0->ndim,
                  dt_size(b0->dtype));
  }
  shm_free(owner);
  return &out->hdr;
fail:
  shm_free(owner);
  val_decref(out ? &out->hdr : NULL);
  return NULL;
}

/* Result [k] of every device, as contiguous arrays (NULL for another
 * process's device when it kept its blocks: Call.withheld). */
static int gather_result(const Call *c, int k, bool single, Array **blocks) {
  int n = c->f->mesh->size;
  for (int r = 0; r < n; r++) {
    Value *v = single ? c->results[r] : tuple_get(c->results[r], (size_t)k);
    if (k < 32 && (c->withheld >> k & 1) && v == VAL_NONE) {
      blocks[r] = NULL;
      continue;
    }
    Value *arr = ops_to_array(v, -1);
    if (!arr) {
      for (int q = 0; q < r; q++) val_decref(blocks[q] ? &blocks[q]->hdr : NULL);
      err_set(ERR_TYPE, "shard_map body must return arrays, got %s", val_type_name(v));
      return -1;
    }
    Array *cont = arr_contiguous(AS_ARRAY(arr));
    if (cont) cont->vma |= AS_ARRAY(arr)->vma;
    val_decref(arr);
    if (!cont) {
      for (int q = 0; q < r; q++) val_decref(blocks[q] ? &blocks[q]->hdr : NULL);
      return -1;
    }
    blocks[r] = cont;
  }
  return 0;
}

/* Number of results the out_specs describe, checked against the body's. */
static int result_arity(const Call *c, int *nres, bool *single) {
  Value *os = c->f->out_specs, *r0 = c->results[0];
  bool tuple_out = r0->type == V_TUPLE;
  if (os->type == V_PSPEC) {
    *single = !tuple_out;
    *nres = tuple_out ? (int)tuple_len(r0) : 1;
  } else {
    *single = false;
    *nres = (int)tuple_len(os);
    if (!tuple_out || (int)tuple_len(r0) != *nres) {
      err_set(ERR_VALUE, "out_specs has %d entries but the body returned %s", *nres,
              tuple_out ? "a tuple of another length" : "one value");
      return -1;
    }
  }
  for (int r = 1; r < c->f->mesh->size; r++) {
    bool t = c->results[r]->type == V_TUPLE;
    if (t != tuple_out || (t && tuple_len(c->results[r]) != tuple_len(r0))) {
      err_set(ERR_VALUE, "devices returned different numbers of results");
      return -1;
    }
  }
  return 0;
}

static int leaf_specs(Value *tree, Value *spec, Value *specs, Value *split, const char *what);
static bool leaf_is_array(Value *v);

/* Whether device 0's result holds a tuple, list or dict below its top. */
static bool results_nest(const Call *c) {
  Value *r0 = c->results[0];
  if (r0->type == V_LIST || r0->type == V_DICT || cls_is_tree_node(r0)) return true;
  size_t n;
  Value *const *items;
  if (r0->type != V_TUPLE || !val_seq(r0, &n, &items)) return false;
  for (size_t i = 0; i < n; i++)
    if (items[i]->type == V_TUPLE || items[i]->type == V_LIST || items[i]->type == V_DICT ||
        cls_is_tree_node(items[i]))
      return true;
  return false;
}

/* Results that are pytrees (a dict, a list, nested tuples): each leaf
 * assembled by the spec the out_specs prefix gives it, and the tree of
 * device 0's result rebuilt around them; every device must return the
 * same structure. */
static Value *assemble_tree(const Call *c) {
  int n = c->f->mesh->size;
  Value *tmpl = c->results[0], *out = c->f->out_tree ? c->f->out_tree : c->f->out_specs;
  Value *specs = list_new(4), *flags = list_new(4), *r = NULL;
  PyLeaves *l = shm_calloc((size_t)n, sizeof *l);
  Array **blocks = shm_calloc((size_t)n, sizeof(Array *));
  Value **vals = NULL;
  int k = 0, nl = 0;
  if (!specs || !flags || !l || !blocks) {
    err_nomem();
    goto done;
  }
  if (leaf_specs(tmpl, out, specs, flags, "out_specs") < 0) goto done;
  for (int d = 0; d < n; d++) {
    if (pytree_flatten(c->results[d], leaf_is_array, &l[d]) < 0) goto done;
    if (l[d].n != l[0].n || (int)list_len(specs) != l[0].n) {
      err_set(ERR_VALUE, "devices returned results of different structures");
      goto done;
    }
  }
  nl = l[0].n;
  if (!(vals = shm_calloc((size_t)nl + 1, sizeof(Value *)))) goto done;
  for (; k < nl; k++) {
    int d = 0;
    for (; d < n; d++) {
      Value *arr = ops_to_array(l[d].v[k], -1);
      Array *cont = arr ? arr_contiguous(AS_ARRAY(arr)) : NULL;
      if (cont) cont->vma |= AS_ARRAY(arr)->vma;
      if (arr) val_decref(arr);
      if (!(blocks[d] = cont)) break;
    }
    PSpec *ks = (PSpec *)list_get(specs, (size_t)k);
    vals[k] = d == n ? assemble(c->f, ks, blocks, k, c->ret) : NULL;
    if (vals[k] && lay_out_result(c, vals[k], ks) < 0) {
      val_decref(vals[k]);
      vals[k] = NULL;
    }
    for (int q = 0; q < d; q++) val_decref(&blocks[q]->hdr);
    if (!vals[k]) break;
  }
  int pos = 0;
  if (k == nl) r = pytree_replace(tmpl, leaf_is_array, vals, &pos);
done:
  for (int i = 0; vals && i < k; i++) val_decref(vals[i]);
  shm_free(vals);
  for (int d = 0; l && d < n; d++) pytree_leaves_free(&l[d]);
  shm_free(l);
  shm_free(blocks);
  if (specs) val_decref(specs);
  if (flags) val_decref(flags);
  return r;
}

static Value *assemble_all(const Call *c) {
  if (results_nest(c)) return assemble_tree(c);
  int nres;
  bool single;
  if (result_arity(c, &nres, &single) < 0) return NULL;
  int n = c->f->mesh->size;
  Array **blocks = shm_malloc(sizeof(Array *) * (size_t)n);
  Value *out = single ? NULL : tuple_new((size_t)nres);
  if (!blocks || (!single && !out)) {
    shm_free(blocks);
    return err_nomem();
  }
  for (int k = 0; k < nres; k++) {
    PSpec *s = c->f->out_specs->type == V_PSPEC ? (PSpec *)c->f->out_specs
                                                 : (PSpec *)tuple_get(c->f->out_specs, (size_t)k);
    Value *res = NULL;
    if (gather_result(c, k, single, blocks) == 0) {
      res = assemble(c->f, s, blocks, k, c->ret);
      for (int r = 0; r < n; r++) val_decref(blocks[r] ? &blocks[r]->hdr : NULL);
      if (res && lay_out_result(c, res, s) < 0) {
        val_decref(res);
        res = NULL;
      }
    }
    if (!res) {
      val_decref(out);
      out = NULL;
      break;
    }
    if (single) out = res;
    else tuple_set_steal(out, (size_t)k, res);
  }
  shm_free(blocks);
  return out;
}

/* ==== the call ==================================================================== */

static bool is_container(const Value *x) {
  return x->type == V_TUPLE || x->type == V_LIST || x->type == V_DICT || cls_is_tree_node(x);
}

bool shardmap_needs_tree(const ShardFn *f, const CallArgs *a) {
  if (f->in_tree || f->out_tree) return true;
  for (int i = 0; i < a->nargs; i++)
    if (is_container(a->args[i])) return true;
  return false;
}

int shardmap_check_shape(const ShardFn *f, int i, int nargs, int ndim, const int64_t *shape) {
  return check_arg(f, i, nargs, ndim, shape, in_spec_of(f, i));
}

int shardmap_check_arg(const ShardFn *f, const CallArgs *a, int i) {
  Value *x = a->args[i];
  if (f->in_tree || !is_container(x)) return 0;
  err_set(ERR_TYPE, "%s(): argument %d is a %s; shard_map takes arrays here, not pytrees: "
          "pass its leaves as separate arguments, each with its own in_spec",
          f->name, i, val_type_name(x));
  return -1;
}

Value *shardmap_arg(const ShardFn *f, const CallArgs *a, int i) {
  return shardmap_check_arg(f, a, i) < 0 ? NULL : ops_to_array(a->args[i], -1);
}

static int prepare_args(Call *c, const CallArgs *a) {
  ShardFn *f = c->f;
  if (a->nkw) {
    err_set(ERR_TYPE, "%s() takes no keyword arguments (shard_map functions are called "
                      "positionally)", f->name);
    return -1;
  }
  if (f->in_specs->type == V_TUPLE && (int)tuple_len(f->in_specs) != a->nargs) {
    err_set(ERR_TYPE, "%s() has %zu in_specs but was called with %d argument%s", f->name,
            tuple_len(f->in_specs), a->nargs, a->nargs == 1 ? "" : "s");
    return -1;
  }
  if (a->nargs > SHARDMAP_MAX_ARGS) {
    err_set(ERR_VALUE, "shard_map supports at most %d arguments (pytree leaves)",
            SHARDMAP_MAX_ARGS);
    return -1;
  }
  c->nargs = a->nargs;
  for (int i = 0; i < a->nargs; i++) {
    Value *x = shardmap_arg(f, a, i);
    if (!x) return -1;
    c->args[i] = AS_ARRAY(x);
    if (check_arg(f, i, a->nargs, c->args[i]->ndim, c->args[i]->shape, in_spec_of(f, i)) < 0)
      return -1;
    /* process-local shards whose blocks are not the in_spec's: whole first */
    if (c->args[i]->buf->part &&
        !sharding_lays_out(c->args[i]->sharding, f->mesh, in_spec_of(f, i)) &&
        arr_make_whole(c->args[i]) < 0)
      return -1;
  }
  return 0;
}

static void call_release(Call *c, int n) {
  for (int i = 0; i < c->nargs; i++) val_decref(c->args[i] ? &c->args[i]->hdr : NULL);
  for (int r = 0; r < n; r++) {
    val_decref(c->results ? c->results[r] : NULL);
    if (c->out) shm_free(c->out[r].data);
  }
  shm_free(c->args);
  shm_free(c->results);
  shm_free(c->out);
  shm_free(c->ret);
}

/* Plain coll_run: the runner until the debugger installs its own. */
static int run_plain(CollGroup *g, const MeshDesc *mesh, void (*fn)(int rank, void *ctx),
                     void *ctx, OutBuf *outs) {
  (void)mesh, (void)outs;
  return coll_run(g, fn, ctx);
}

static ShardmapRunner runner = run_plain;
static ShardmapStager stager;
static ShardmapStager differentiator;

void shardmap_set_differentiator(ShardmapStager d) { differentiator = d; }

void shardmap_set_runner(ShardmapRunner run) { runner = run ? run : run_plain; }

void shardmap_set_stager(ShardmapStager stage) { stager = stage; }

static ShardmapStager auto_runner;

void shardmap_set_auto_runner(ShardmapStager run) { auto_runner = run; }

/* Whether an argument of [a] is a tracer (being transformed). */
static bool leaf_is_array(Value *v);
static bool is_container(const Value *x);

/* Whether an argument is, or a pytree argument holds, a tracer. */
static bool traced_arg(const CallArgs *a) {
  for (int i = 0; i < a->nargs; i++) {
    if (a->args[i]->type == V_TRACER) return true;
    if (!is_container(a->args[i])) continue;
    PyLeaves l = {0};
    if (pytree_flatten(a->args[i], leaf_is_array, &l) < 0) {
      err_clear();
      return true;   /* not taken apart here: left to the call's own checks */
    }
    bool found = false;
    for (int k = 0; k < l.n && !found; k++) found = l.v[k]->type == V_TRACER;
    pytree_leaves_free(&l);
    if (found) return true;
  }
  return false;
}

static Value **tree_template(Value *body);
static int tree_settle(Value *body);

static ShardmapSharedFn finders[4];
static ShardmapSettleFn settlers[4];
static int nfinders;

void shardmap_add_shared(ShardmapSharedFn find, ShardmapSettleFn settle) {
  if (nfinders < 4) finders[nfinders] = find, settlers[nfinders++] = settle;
}

int shardmap_settle(Value *body) {
  int rc = tree_settle(body);
  for (int i = 0; rc == 0 && i < nfinders; i++)
    if (settlers[i]) rc = settlers[i](body);
  return rc;
}

int shardmap_shared_slots(Value *body, Value ***slots, int cap) {
  int n = 0;
  Value **t = tree_template(body);
  if (t && n < cap) slots[n++] = t;
  for (int i = 0; i < nfinders && n < cap; i++) n += finders[i](body, slots + n, cap - n);
  return n;
}

/* The results of a call of a ShardFn with local_results that each
 * process keeps only its own blocks of (bits; sharding_is_local on the
 * global shape), when every process holds devices of the mesh: the same
 * answer on every process, from its first device's blocks (a
 * partitioned plan's devices return blocks of one shape).  0 otherwise. */
static uint32_t withheld_results(const Call *c) {
  const ShardFn *f = c->f;
  const Mesh *m = f->mesh;
  if (!f->local_results || f->check_rep || f->out_specs->type != V_TUPLE) return 0;
  int procs = transport_procs(), first = -1;
  bool *has = shm_calloc((size_t)procs, sizeof(bool));
  if (!has) return 0;
  for (int r = 0; r < m->size; r++) {
    int d = m->devices[r];
    has[transport_process_of(d)] = true;
    if (first < 0 && transport_is_local(d)) first = r;
  }
  bool all = true;
  for (int p = 0; p < procs; p++) all &= has[p];
  shm_free(has);
  Value *r0 = first >= 0 ? c->results[first] : NULL;
  size_t n = tuple_len(f->out_specs);
  if (!all || !r0 || r0->type != V_TUPLE || tuple_len(r0) != n) return 0;
  uint32_t bits = 0;
  for (size_t k = 0; k < n && k < 32; k++) {
    Value *b = tuple_get(r0, k);
    const PSpec *s = (const PSpec *)tuple_get(f->out_specs, k);
    if (!IS_ARRAY(b) || AS_ARRAY(b)->ndim < s->n) continue;
    const Array *a = AS_ARRAY(b);
    int64_t gs[SHM_MAXDIM];
    for (int d = 0; d < a->ndim; d++) gs[d] = a->shape[d] * pspec_entry_size(s, m, d);
    NamedSharding ns = {.mesh = (Mesh *)m, .spec = (PSpec *)s, .device = -1};
    if (sharding_is_local(&ns, a->ndim, gs)) bits |= 1u << k;
  }
  return bits;
}

static int run_on_devices(Call *c) {
  MeshDesc md;
  mesh_to_desc(c->f->mesh, &md);
  md.auto_axes = c->f->auto_axes;
  CollGroup *g = coll_group_new(&md, shm_interp->reference);
  if (!g) return -1;
  int rc = runner(g, &md, run_device, c, c->out);
  if (transport_active()) {
    Value **slots[8];
    int nslots = shardmap_shared_slots(c->f->body, slots, 8);
    c->withheld = rc == 0 ? withheld_results(c) : 0;
    rc = xcall_end(g, &md, c->results, c->out, rc, slots, nslots, c->withheld);
    if (rc == 0) rc = shardmap_settle(c->f->body);   /* a process without a device */
  }
  coll_group_free(g);
  return rc;
}

/* ==== pytree arguments and results ============================================= */

/*
 * A call whose arguments or results are pytrees runs a shard_map over
 * their leaves: each argument's leaves get the spec its in_spec prefix
 * gives them (None: the leaves are passed whole to every device, not
 * split), a wrapper body rebuilds the trees on each device and flattens
 * the results, whose specs come from the out_specs prefix, and the
 * results' tree comes back from the wrapper (JAX's shard_map on pytrees).
 */
typedef struct TreeCall {
  Opaque base;
  ShardFn *f;            /* the user's (owned: a differentiated call that keeps the
                            flat call runs the body again in its backward pass) */
  int nargs;
  Value *args;           /* tuple: the arguments as given (templates) */
  Value *split;          /* tuple of bool tuples: per leaf, split (True) or whole */
  Value *out_template;   /* the body's result (set by the first device) */
  bool leaf_specs;       /* flat's out_specs were set from out_template */
  ShardFn *flat;         /* the shard_map over the leaves (borrowed, during the call) */
  pthread_mutex_t lock;
} TreeCall;

static void treecall_free(Value *v) {
  TreeCall *t = (TreeCall *)v;
  val_decref(&t->f->hdr);
  val_decref(t->args);
  val_decref(t->split);
  if (t->out_template) val_decref(t->out_template);
  pthread_mutex_destroy(&t->lock);
}

static const OpaqueType treecall_type = {"shard_map call", treecall_free, NULL, NULL, NULL, NULL, NULL};

static bool leaf_is_array(Value *v) { return ops_is_array(v); }

/* Appends to [specs] (and [split] flags) one entry per leaf of [tree]
 * under the prefix [spec]. */
static int leaf_specs(Value *tree, Value *spec, Value *specs, Value *split, const char *what) {
  if (spec->type == V_PSPEC || spec == VAL_NONE) {
    PyLeaves l = {0};
    if (pytree_flatten(tree, leaf_is_array, &l) < 0) return -1;
    int rc = 0;
    for (int i = 0; i < l.n && rc == 0; i++) {
      /* a whole argument leaf being differentiated or batched goes as an input
       * replicated with P(): the same blocks, which the transformation
       * then sees (one reaching the devices as it is would be another
       * thread's tracer there) */
      bool traced = !strncmp(what, "in_specs", 8) && l.v[i]->type == V_TRACER &&
                    !prim_value_is_staged(l.v[i]);
      Value *s = spec != VAL_NONE ? val_incref(spec) : traced ? pspec_from_args(0, NULL) : NULL;
      rc = list_append(split, val_bool(s != NULL));
      if (rc == 0 && s) rc = list_append(specs, s);
      if (s) val_decref(s);
    }
    pytree_leaves_free(&l);
    return rc;
  }
  if (spec->type == V_DICT && tree->type == V_DICT) {
    size_t *order = pytree_key_order(tree);
    Dict *d = (Dict *)tree;
    int rc = order ? 0 : -1;
    for (size_t i = 0; rc == 0 && i < d->len; i++) {
      Value *s = dict_get(spec, d->keys[order[i]]);
      rc = s ? leaf_specs(d->vals[order[i]], s, specs, split, what)
             : (err_set(ERR_VALUE, "%s: a dict of specs lacks a key of the value", what), -1);
    }
    shm_free(order);
    return rc;
  }
  Value *tk, *sk;   /* a registered class's instance holding specs */
  int custom = pytree_prefix_children(tree, spec, &tk, &sk, what);
  if (custom) {
    int rc = custom < 0 ? -1 : leaf_specs(tk, sk, specs, split, what);
    val_decref(tk);
    val_decref(sk);
    return rc;
  }
  size_t n, m;
  Value *const *ts, *const *ss;
  if (tree->type != V_DICT && val_seq(tree, &n, &ts) && val_seq(spec, &m, &ss) && n == m) {
    for (size_t i = 0; i < n; i++)
      if (leaf_specs(ts[i], ss[i], specs, split, what) < 0) return -1;
    return 0;
  }
  err_set(ERR_VALUE, "%s must be a pytree prefix of the value: got a %s of specs for a %s", what,
          val_type_name(spec), val_type_name(tree));
  return -1;
}

Value *shardmap_out_leaf_specs(const ShardFn *f, Value *result) {
  Value *out = f->out_tree ? f->out_tree : f->out_specs;
  Value *specs = list_new(4), *flags = list_new(4), *r = NULL;
  if (specs && flags && leaf_specs(result, out, specs, flags, "out_specs") == 0)
    r = tuple_pack(list_len(specs), ((List *)specs)->items);
  if (specs) val_decref(specs);
  if (flags) val_decref(flags);
  return r;
}

/* Sets the flat call's out_specs to one spec per leaf of the body's
 * result [res], as the user's out_specs prefix gives them: a spec of the
 * prefix covers a whole subtree ((P(), P()) for ((a, b), c)), which the
 * prefix alone cannot count.  One P(...) for every leaf needs nothing.
 * 0, or -1 with the error of a prefix that does not fit. */
static int leaf_out_specs(TreeCall *t, Value *res) {
  Value *out = t->f->out_tree ? t->f->out_tree : t->f->out_specs;
  if (out->type == V_PSPEC || !t->flat) return 0;
  Value *specs = shardmap_out_leaf_specs(t->f, res);
  if (!specs) return -1;
  val_decref(t->flat->out_specs);
  t->flat->out_specs = specs;
  t->leaf_specs = true;
  return 0;
}

/* The wrapper body on one device: leaves in, the trees rebuilt, the
 * body's result flattened out (a tuple). */
static Value *tree_body(Value *self, const CallArgs *a) {
  TreeCall *t = (TreeCall *)self;
  Value *args[64], *r = NULL;
  int pos = 0, made = 0;
  for (; made < t->nargs; made++) {
    Value *tmpl = tuple_get(t->args, (size_t)made), *flags = tuple_get(t->split, (size_t)made);
    PyLeaves l = {0};
    if (pytree_flatten(tmpl, leaf_is_array, &l) < 0) break;
    Value **vals = shm_calloc((size_t)l.n + 1, sizeof(Value *));
    for (int k = 0; vals && k < l.n; k++)
      vals[k] = val_truth(tuple_get(flags, (size_t)k)) == 1 ? a->args[pos++] : l.v[k];
    int p2 = 0;
    args[made] = vals ? pytree_replace(tmpl, leaf_is_array, vals, &p2) : err_nomem();
    shm_free(vals);
    pytree_leaves_free(&l);
    if (!args[made]) break;
  }
  Value *res = made == t->nargs ? val_call_n(t->f->body, t->nargs, args) : NULL;
  for (int k = 0; k < made; k++) val_decref(args[k]);
  if (!res) return NULL;
  PyLeaves l = {0};
  if (pytree_flatten(res, leaf_is_array, &l) == 0) {
    pthread_mutex_lock(&t->lock);
    int rc = t->out_template ? 0 : leaf_out_specs(t, res);
    if (rc == 0 && !t->out_template) t->out_template = val_incref(res);
    pthread_mutex_unlock(&t->lock);
    if (rc == 0) r = tuple_pack((size_t)l.n, l.v);
  }
  pytree_leaves_free(&l);
  val_decref(res);
  return r;
}

/* The slot of the result's pytree when [body] is a tree call's flat
 * call's, else NULL: under mpirun a process none of whose devices ran the
 * body gets it from another process (xcall.h). */
static Value **tree_template(Value *body) {
  BoundMethod *b = (BoundMethod *)body;
  if (body->type != V_BOUND || b->fn != tree_body) return NULL;
  return &((TreeCall *)b->self)->out_template;
}

/* shardmap_settle for a tree call's flat call: a process none of whose
 * devices ran the body got the result's tree from another one (xcall.h)
 * and takes the per-leaf out_specs from it, as a device would have. */
static int tree_settle(Value *body) {
  Value **tmpl = tree_template(body);
  if (!tmpl || !*tmpl) return 0;
  TreeCall *t = (TreeCall *)((BoundMethod *)body)->self;
  return t->leaf_specs ? 0 : leaf_out_specs(t, *tmpl);
}

/* The out_specs of the flat call: one P for every leaf, or one per leaf of
 * the out_specs tree until the body's first result gives each leaf its
 * spec (leaf_out_specs: a P may cover a subtree). */
static Value *flat_out_specs(Value *out) {
  if (out->type == V_PSPEC) return val_incref(out);
  PyLeaves l = {0};
  if (pytree_flatten(out, NULL, &l) < 0) return NULL;
  Value *t = tuple_pack((size_t)l.n, l.v);
  pytree_leaves_free(&l);
  return t;
}

/* Appends to [labels] the words for leaf [k] of argument [i] of [f]
 * (k < 0: the argument is itself the leaf). */
static int add_label(Value *labels, const ShardFn *f, int i, int k) {
  char b[176], l[144];
  arg_label(f, i, 2, l, sizeof l);   /* f's own label (a lifted call's), else its parameter's */
  if (k < 0) snprintf(b, sizeof b, "%s", l);
  else snprintf(b, sizeof b, "leaf %d of %s", k, l);
  Value *s = str_from(b);
  int rc = s ? list_append(labels, s) : -1;
  if (s) val_decref(s);
  return rc;
}

static Value *shardmap_call_tree(ShardFn *f, const CallArgs *a) {
  if (a->nkw) return err_set(ERR_TYPE, "%s() takes no keyword arguments", f->name);
  if (a->nargs > 64) return err_set(ERR_VALUE, "shard_map supports at most 64 arguments");
  Value *in = f->in_tree ? f->in_tree : f->in_specs, *out = f->out_tree ? f->out_tree : f->out_specs;
  size_t ni;
  Value *const *is;
  bool per_arg = in->type != V_PSPEC && in != VAL_NONE && val_seq(in, &ni, &is);
  if (per_arg && (int)ni != a->nargs)
    return err_set(ERR_TYPE, "%s() has %zu in_specs but was called with %d argument%s", f->name,
                   ni, a->nargs, a->nargs == 1 ? "" : "s");
  Value *specs = list_new(8), *splits = tuple_new((size_t)a->nargs), *leaves = list_new(8);
  Value *labels = list_new(8);
  TreeCall *t = shm_calloc(1, sizeof *t);
  Value *r = NULL, *sf = NULL, *fn = NULL, *res = NULL;
  if (!specs || !splits || !leaves || !labels || !t) {
    err_nomem();
    goto out;
  }
  val_init(&t->base.hdr, V_OPAQUE);
  t->base.ot = &treecall_type;
  pthread_mutex_init(&t->lock, NULL);
  t->f = (ShardFn *)val_incref(&f->hdr);
  t->nargs = a->nargs;
  t->args = tuple_pack((size_t)a->nargs, a->args);
  t->split = splits;
  splits = NULL;
  for (int i = 0; i < a->nargs; i++) {
    Value *flags = list_new(4);
    char what[64];
    snprintf(what, sizeof what, "in_specs of argument %d", i);
    int rc = flags ? leaf_specs(a->args[i], per_arg ? is[i] : in, specs, flags, what) : -1;
    Value *ft = rc == 0 ? tuple_pack(list_len(flags), ((List *)flags)->items) : NULL;
    val_decref(flags);
    if (!ft) goto out;
    tuple_set_steal(t->split, (size_t)i, ft);
    PyLeaves l = {0};
    if (pytree_flatten(a->args[i], leaf_is_array, &l) < 0) goto out;
    rc = 0;
    for (int k = 0; k < l.n && rc == 0; k++)
      if (val_truth(tuple_get(ft, (size_t)k)) == 1)
        rc = list_append(leaves, l.v[k]) < 0 ||
             add_label(labels, f, i, is_container(a->args[i]) ? k : -1) < 0 ? -1 : 0;
    pytree_leaves_free(&l);
    if (rc < 0) goto out;
  }
  Value *in_flat = tuple_pack(list_len(specs), ((List *)specs)->items);
  Value *out_flat = flat_out_specs(out);
  fn = in_flat && out_flat ? bound_new(f->name, tree_body, &t->base.hdr) : NULL;
  sf = fn ? shardmap_new(f->name, fn, &f->mesh->hdr, in_flat, out_flat, f->check_rep) : NULL;
  if (in_flat) val_decref(in_flat);
  if (out_flat) val_decref(out_flat);
  if (!sf) goto out;
  ((ShardFn *)sf)->auto_axes = f->auto_axes;
  ((ShardFn *)sf)->internal = true;
  ((ShardFn *)sf)->traceable = !f->internal || f->traceable;
  ((ShardFn *)sf)->jit_run = f->jit_run;
  ((ShardFn *)sf)->arg_labels = tuple_pack(list_len(labels), ((List *)labels)->items);
  if (!((ShardFn *)sf)->arg_labels) goto out;
  CallArgs c = {(int)list_len(leaves), ((List *)leaves)->items, 0, NULL, NULL};
  t->flat = (ShardFn *)sf;
  res = shardmap_call(sf, &c);
  t->flat = NULL;
  if (!res) goto out;
  if (!t->out_template) {
    err_set(ERR_VALUE, "%s(): the body returned no result to rebuild", f->name);
    goto out;
  }
  /* the wrapper returned a tuple of the leaves; the flat call gives that
   * tuple back, or its one leaf bare (leaves are never tuples) */
  PyLeaves tl = {0};
  if (pytree_flatten(t->out_template, leaf_is_array, &tl) < 0) goto out;
  size_t nres;
  Value *const *items;
  Value *one[1] = {res};
  int pos = 0;
  if (res->type == V_TUPLE && val_seq(res, &nres, &items) && (int)nres == tl.n)
    r = pytree_replace(t->out_template, leaf_is_array, (Value **)items, &pos);
  else if (tl.n == 1)
    r = pytree_replace(t->out_template, leaf_is_array, one, &pos);
  else
    err_set(ERR_VALUE, "%s(): the body's results do not match its out_specs", f->name);
  pytree_leaves_free(&tl);
out:
  if (res) val_decref(res);
  if (sf) val_decref(sf);
  if (fn) val_decref(fn);
  if (t && t->args) {
    val_decref(&t->base.hdr);
  } else if (t) {
    if (t->f) val_decref(&t->f->hdr);
    shm_free(t);
  }
  val_decref(specs);
  val_decref(leaves);
  val_decref(labels);
  if (splits) val_decref(splits);
  return r;
}

bool shardmap_returns_leaves(const ShardFn *f) { return tree_template(f->body) != NULL; }

Value *shardmap_call_leaves(Value *f, const CallArgs *a) {
  return shardmap_call_tree((ShardFn *)f, a);
}

static Value *shardmap_call_nested(ShardFn *f, const CallArgs *a, DevCtx *dc);

Value *shardmap_run_auto(Value *fv, const CallArgs *a) {
  ShardFn *sf = (ShardFn *)fv;
  DevCtx *dc = dev_ctx();
  if ((!sf->auto_axes && !sf->jit_run) || !auto_runner || (dc && dc->mesh) || prim_tracing() ||
      traced_arg(a))
    return NULL;
  return auto_runner(fv, a);
}

Value *shardmap_call(Value *fv, const CallArgs *a) {
  Value *lifted = differentiator ? shardmap_lift_call((ShardFn *)fv, a) : LIFT_NONE;
  if (lifted != LIFT_NONE) return lifted;
  ShardFn *sf = (ShardFn *)fv;
  DevCtx *dc = dev_ctx();
  if (sf->auto_axes && !sf->internal && auto_runner && !(dc && dc->mesh) && !prim_tracing() &&
      !traced_arg(a)) {
    /* partitioned along the automatic axes, as jit runs it; a body jit
     * cannot trace runs replicated below */
    Value *r = auto_runner(fv, a);
    if (r || err_occurred()) return r;
  }
  if (shardmap_needs_tree((ShardFn *)fv, a)) return shardmap_call_tree((ShardFn *)fv, a);
  if (dc && dc->mesh) return shardmap_call_nested((ShardFn *)fv, a, dc);
  /* arguments being transformed (differentiated, batched), staged or not */
  for (int i = 0; differentiator && i < a->nargs; i++)
    if (a->args[i]->type == V_TRACER && !prim_value_is_staged(a->args[i]))
      return differentiator(fv, a);
  if (prim_tracing()) {   /* called under jit: one staged equation */
    if (!stager) return err_set(ERR_TYPE, "shard_map: cannot be staged (no jit)");
    return stager(fv, a);
  }
  return shardmap_run(fv, a);
}

Value *shardmap_run(Value *fv, const CallArgs *a) {
  ShardFn *f = (ShardFn *)fv;
  if (mesh_check_runnable(f->mesh) < 0 || shardmap_whole_closures(f) < 0) return NULL;
  int n = f->mesh->size;
  Call c = {.f = f};
  c.args = shm_calloc((size_t)a->nargs + 1, sizeof(Array *));
  c.results = shm_calloc((size_t)n, sizeof(Value *));
  c.out = shm_calloc((size_t)n, sizeof(OutBuf));
  c.ret = shm_calloc((size_t)n, sizeof(Loc));
  Value *res = NULL;
  if (!c.args || !c.results || !c.out || !c.ret) {
    err_nomem();
  } else if (prepare_args(&c, a) == 0) {
    int rc = run_on_devices(&c);
    flush_outputs(&c);
    if (rc == 0) res = assemble_all(&c);
  }
  call_release(&c, n);
  return res;
}

/* ==== the two forms ================================================================ */

static int read_check_rep(Value *check_rep, Value *check_vma, bool *out) {
  Value *v = check_rep ? check_rep : check_vma;
  *out = true;
  if (!v) return 0;
  int t = val_truth(v);
  if (t < 0) return -1;
  *out = t;
  return 0;
}

/* [m]'s axes in [bits] as "'x', 'y'" into buf. */
static void axes_list(const Mesh *m, uint32_t bits, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int q = 0; q < m->naxes && len < cap; q++)
    if (bits >> q & 1)
      len += (size_t)snprintf(buf + len, cap - len, "%s'%s'", len ? ", " : "", m->axis_names[q]);
}

/* The mesh axes [v] names (a str, or a tuple or list of them: the
 * language has no set display, so JAX's {'x'} is written ('x',)) as bits
 * of [m] in [*bits].  0, or -1 + ERR_TYPE (not names) / ERR_VALUE (a name
 * [m] does not have, as jax.shard_map's subset check). */
static int read_axis_set(const char *kw, Value *v, const Mesh *m, uint32_t *bits) {
  size_t n = 1;
  Value *const *items = &v;
  *bits = 0;
  if (val_is_set(v)) {   /* JAX's own spelling: axis_names={'x'} */
    items = ((Dict *)v)->keys;
    n = ((Dict *)v)->len;
  } else if (v->type != V_STR && !val_seq(v, &n, &items)) {
    return err_set(ERR_TYPE, "shard_map: %s= must be a collection of mesh axis names (a set, "
                   "tuple, list or str), got %s", kw, val_type_name(v)), -1;
  }
  for (size_t i = 0; i < n; i++) {
    if (items[i]->type != V_STR)
      return err_set(ERR_TYPE, "shard_map: %s= must hold mesh axis names (str), got %s", kw,
                     val_type_name(items[i])), -1;
    int a = mesh_axis(m, intern_cstr(str_cstr(items[i])));
    if (a < 0) {
      char have[256];
      axes_list(m, ~0u, have, sizeof have);
      return err_set(ERR_VALUE, "shard_map requires %s= to be a subset of the mesh's axis "
                     "names (%s), but it names '%s'", kw, have, str_cstr(items[i])), -1;
    }
    *bits |= 1u << a;
  }
  return 0;
}

/* Checks that every P(...) in the spec tree [v] names only axes outside
 * [auto_axes] of [m]: 0, or -1 + ERR_VALUE in the words of JAX's check
 * (specs of a partial-manual shard_map may refer only to manual axes). */
static int specs_manual_only(const char *what, Value *v, const Mesh *m, uint32_t auto_axes,
                             int depth) {
  if (v->type == V_PSPEC) {
    const PSpec *sp = (const PSpec *)v;
    for (int i = 0; i < sp->n; i++)
      for (int k = 0; k < sp->e[i].nnames; k++) {
        int a = mesh_axis(m, sp->e[i].names[k]);
        if (a < 0 || !(auto_axes >> a & 1)) continue;
        char sb[256], manual[256];
        pspec_str(sp, sb, sizeof sb);
        axes_list(m, ~auto_axes, manual, sizeof manual);
        return err_set(ERR_VALUE, "shard_map %s must refer only to axes marked as manual (%s), "
                       "but %s refers to '%s', an automatic axis (not in axis_names=)",
                       what, manual[0] ? manual : "none", sb, sp->e[i].names[k]), -1;
      }
    return 0;
  }
  if (depth > 64) return 0;
  if (v->type == V_DICT) {
    Dict *d = (Dict *)v;
    for (size_t i = 0; i < d->len; i++)
      if (specs_manual_only(what, d->vals[i], m, auto_axes, depth + 1) < 0) return -1;
    return 0;
  }
  size_t n;
  Value *const *items;
  if (!val_seq(v, &n, &items)) return 0;   /* None, or a class's node: checked when split */
  for (size_t i = 0; i < n; i++)
    if (specs_manual_only(what, items[i], m, auto_axes, depth + 1) < 0) return -1;
  return 0;
}

int shardmap_set_manual(Value *fv, Value *axis_names, Value *auto_) {
  ShardFn *f = (ShardFn *)fv;
  const Mesh *m = f->mesh;
  uint32_t all = m->naxes >= 32 ? ~0u : (1u << m->naxes) - 1, manual = all, au = 0;
  if (axis_names && axis_names != VAL_NONE) {
    if (read_axis_set("axis_names", axis_names, m, &manual) < 0) return -1;
    if (!manual) manual = all;   /* JAX: an empty set means every axis */
  }
  if (auto_ && auto_ != VAL_NONE) {
    if (read_axis_set("auto", auto_, m, &au) < 0) return -1;
    if (axis_names && axis_names != VAL_NONE && au & manual)
      return err_set(ERR_VALUE, "shard_map: an axis cannot be in both axis_names= and auto="), -1;
    manual &= ~au;
  }
  f->auto_axes = all & ~manual;
  if (!f->auto_axes) return 0;
  Value *in = f->in_tree ? f->in_tree : f->in_specs, *out = f->out_tree ? f->out_tree : f->out_specs;
  if (specs_manual_only("in_specs", in, m, f->auto_axes, 0) < 0 ||
      specs_manual_only("out_specs", out, m, f->auto_axes, 0) < 0)
    return -1;
  return 0;
}

/* shard_map(f, mesh, in_specs, out_specs, check_rep=True): the function
 * form, as jax.shard_map. */
static Value *bi_shard_map(const CallArgs *a);

/* shard_map(mesh=..., in_specs=..., out_specs=...) without the function:
 * the decorator form, @jax.shard_map(mesh=m, ...) on a def
 * (functools.partial of shard_map over the keywords). */
static Value *shard_map_decorator(const CallArgs *a) {
  Value *ns = builtins_namespace("functools");
  Value *partial = ns ? dict_get_str(((Module *)ns)->globals, "partial") : NULL;
  Value *self = builtin_new("shard_map", bi_shard_map, "shard_map(f, mesh, in_specs, out_specs)");
  Value *r = NULL;
  if (partial && self) {
    CallArgs c = {1, &self, a->nkw, a->kwnames, a->kwvals};
    r = val_call(partial, &c);
  }
  if (self) val_decref(self);
  return r ? r : err_occurred() ? NULL : err_set(ERR_TYPE, "shard_map() missing argument 'f'");
}

static Value *bi_shard_map(const CallArgs *a) {
  if (a->nargs == 0) return shard_map_decorator(a);
  Value *f, *mesh, *in_specs, *out_specs, *check_rep, *check_vma, *axis_names, *auto_;
  if (args_bind("shard_map", a,
                "f, mesh=, in_specs=, out_specs=, check_rep=, check_vma=, axis_names=, auto=",
                (Value **[]){&f, &mesh, &in_specs, &out_specs, &check_rep, &check_vma,
                             &axis_names, &auto_}) < 0)
    return NULL;
  if (!mesh) mesh = mesh_context() ? &mesh_context()->hdr : NULL;
  if (!mesh)
    return err_set(ERR_TYPE, "shard_map() needs a mesh: pass mesh=, or define it under "
                             "`with m:` or after jax.set_mesh(m)");
  if (!in_specs || !out_specs)
    return err_set(ERR_TYPE, "shard_map() needs in_specs= and out_specs=");
  bool cr;
  if (read_check_rep(check_rep, check_vma, &cr) < 0) return NULL;
  const char *name = f->type == V_FUNC ? ((Func *)f)->name : NULL;
  Value *sf = shardmap_new(name, f, mesh, in_specs, out_specs, cr);
  if (sf && shardmap_set_manual(sf, axis_names, auto_) < 0) {
    val_decref(sf);
    return NULL;
  }
  return sf;
}

/* The block form: `[jit] shard_map NAME(x: SPEC, ...) -> SPECS on MESH[, opts]:` */
static Value *block_specs(const Node *s, Env *env) {
  Value *t = tuple_new((size_t)s->nparams);
  for (int i = 0; t && i < s->nparams; i++) {
    const Param *p = &s->params[i];
    if (!p->annotation || p->star || p->starstar) {
      val_decref(t);
      return err_set_at(p->loc, ERR_SYNTAX,
                        "parameter '%s' of shard_map %s needs an in_spec, e.g. %s: P('i')",
                        p->name, s->name, p->name);
    }
    Value *spec = eval_node(p->annotation, env);
    if (!spec) {
      val_decref(t);
      return NULL;
    }
    tuple_set_steal(t, (size_t)i, spec);
  }
  return t;
}

static int block_options(const Node *s, Env *env, bool *check_rep, Value **axis_names,
                         Value **auto_) {
  Value *cr = NULL, *cv = NULL;
  int rc = 0;
  for (int k = 0; rc == 0 && k < s->nkw; k++) {
    const char *kw = s->kws[k].name;
    Value **slot = kw && strcmp(kw, "check_rep") == 0 ? &cr
                 : kw && strcmp(kw, "check_vma") == 0 ? &cv
                 : kw && strcmp(kw, "axis_names") == 0 ? axis_names
                 : kw && strcmp(kw, "auto") == 0 ? auto_ : NULL;
    if (!slot) {
      err_set_at(s->kws[k].loc, ERR_TYPE, "shard_map got an unknown option '%s'",
                 kw ? kw : "**");
      rc = -1;
    } else if (!(*slot = eval_node(s->kws[k].value, env))) {
      rc = -1;
    }
  }
  if (rc == 0) rc = read_check_rep(cr, cv, check_rep);
  val_decref(cr);
  val_decref(cv);
  return rc;
}

static int exec_shard_map(const Node *s, Env *env, AstModule *mod) {
  Value *in = NULL, *out = NULL, *mesh = NULL, *body = NULL, *sf = NULL, *an = NULL, *au = NULL;
  bool check_rep;
  int rc = -1;
  if (!s->a) {
    err_set_at(s->loc, ERR_SYNTAX, "shard_map %s needs out_specs: add '-> P(...)'", s->name);
    return -1;
  }
  if (!(in = block_specs(s, env)) || !(out = eval_node(s->a, env)) ||
      !(mesh = eval_node(s->b, env)) || block_options(s, env, &check_rep, &an, &au) < 0 ||
      !(body = eval_make_func(s, env, mod)))
    goto out;
  if (!(sf = shardmap_new(s->name, body, mesh, in, out, check_rep))) goto out;
  if (shardmap_set_manual(sf, an, au) < 0) goto out;
  if (s->is_jit) {
    if (!eval_make_jit) {
      err_set_at(s->loc, ERR_VALUE, "jit is not available in this build");
      goto out;
    }
    Value *j = eval_make_jit(sf);
    sf = j;
    if (!sf) goto out;
  }
  rc = env_set(env, s->name, sf);
out:
  val_decref(in);
  val_decref(out);
  val_decref(mesh);
  val_decref(body);
  val_decref(sf);
  val_decref(an);
  val_decref(au);
  return rc;
}

/* ==== collectives as built-ins (LANGUAGE.md §5, jax.lax names) ===================== */

/* An axis_name argument (a str or a tuple of str) as the primitives take
 * it: the value itself, so a loop repeating a collective passes the same
 * value each time (the collective engine remembers what it resolved it
 * to); a list as a tuple, and under jit always a tuple, as jaxprs print
 * axes. */
static Value *axis_names(Value *v) {
  if (v->type == V_STR) return prim_tracing() ? tuple_pack(1, &v) : val_incref(v);
  size_t n;
  Value *const *items;
  if (val_seq(v, &n, &items) && n > 0) {
    for (size_t i = 0; i < n; i++)
      if (items[i]->type != V_STR) goto bad;
    return v->type == V_TUPLE ? val_incref(v) : tuple_pack(n, items);
  }
bad:
  return err_set(ERR_TYPE, "axis_name must be a mesh axis name or a tuple of names, got %s",
                 val_type_name(v));
}

/* The names in [*v], a value made by axis_names; their number in *n. */
static Value *const *names_of(Value *const *v, size_t *n) {
  if ((*v)->type == V_STR) {
    *n = 1;
    return v;
  }
  *n = tuple_len(*v);
  return ((Tuple *)*v)->items;
}

/* The size of the (flattened) axes [names] in the running body's mesh, or
 * of one group when [groups] is given. */
static const NamedAxisHooks *named_axes;

void shardmap_set_named_axes(const NamedAxisHooks *hooks) { named_axes = hooks; }

/* The product of the sizes of [names] that are named (vmap) axes; the
 * others' count in *mesh_left. */
static int64_t named_size(Value *names, size_t *mesh_left) {
  size_t n;
  Value *const *items = names_of(&names, &n);
  int64_t size = 1, s;
  *mesh_left = 0;
  for (size_t i = 0; i < n; i++) {
    if (items[i]->type == V_STR && named_axes && named_axes->size(str_cstr(items[i]), &s))
      size *= s;
    else
      (*mesh_left)++;
  }
  return size;
}

/* The size of the (flattened) axes [names] in the running body's mesh,
 * or of one group when [groups] is given; an unknown name is an error of
 * collective [prim] that lists the mesh's axes. */
static int axis_size_of(const char *prim, Value *names, Value *groups, int64_t *out) {
  size_t left;
  int64_t named = (!groups || groups->type == V_NONE) ? named_size(names, &left) : 1;
  if ((!groups || groups->type == V_NONE) && left == 0) {
    *out = named;
    return 0;
  }
  DevCtx *c = dev_ctx();
  if (!c) {
    err_set(ERR_VALUE, "collectives can only be used inside a shard_map body");
    return -1;
  }
  if (groups && groups->type != V_NONE) {
    size_t n;
    Value *const *items;
    if (!val_seq(groups, &n, &items) || n == 0 || !val_seq(items[0], &n, &items)) {
      err_set(ERR_TYPE, "axis_index_groups must be a tuple of tuples of axis indices");
      return -1;
    }
    *out = (int64_t)n;
    return 0;
  }
  int64_t size = 1;
  size_t nn;
  Value *const *items = names_of(&names, &nn);
  for (size_t i = 0; i < nn; i++) {
    int64_t s;
    if (named_axes && named_axes->size(str_cstr(items[i]), &s)) {
      size *= s;
      continue;
    }
    int ax = dev_mesh_axis(c->mesh, str_cstr(items[i]));
    if (ax < 0) {
      return coll_unknown_axis(prim, c->mesh, str_cstr(items[i]));
    }
    if (c->mesh->auto_axes >> ax & 1) return coll_auto_axis(prim, c->mesh, ax);
    size *= c->mesh->sizes[ax];
  }
  *out = size;
  return 0;
}

/* The error when collective [prim]'s parameters [p] name an axis the
 * body's partial-manual shard_map leaves automatic: checked before the
 * collective binds, since a traced one resolves its axes only when the
 * plan runs, and a plan run in place inside a partitioned jit runs over
 * the whole mesh (no axis automatic there).  0, or -1 with the error. */
static int no_auto_axis(const char *prim, const Params *p) {
  DevCtx *c = dev_ctx();
  Value *v = params_get(p, "axes");
  if (!v) v = params_get(p, "axis_name");
  if (!c || !c->mesh || !c->mesh->auto_axes || !v) return 0;
  size_t n = 1;
  Value *const *items = &v;
  if (v->type != V_STR && !val_seq(v, &n, &items)) return 0;   /* the rule's error */
  for (size_t k = 0; k < n; k++) {
    int a = items[k]->type == V_STR ? dev_mesh_axis(c->mesh, str_cstr(items[k])) : -1;
    if (a >= 0 && c->mesh->auto_axes >> a & 1) return coll_auto_axis(prim, c->mesh, a);
  }
  return 0;
}

/* Under jit every collective is recorded, concrete operands too, so the
 * compiled plan runs it on every device (trace.h). */
static Value *coll_apply(PrimId id, int n, Value **in, const Params *p) {
  if (no_auto_axis(prim_table[id].name, p) < 0) return NULL;
  return prim_bind(id, n, in, p);
}

/* Applies collective [id] to [x] with [p] (stolen), converting x first. */
static Value *apply1(PrimId id, Value *x, Params *p) {
  Value *arr = ops_is_array(x) ? x : ops_to_array(x, -1);  /* x is borrowed */
  Value *r = arr ? coll_apply(id, 1, &arr, p) : NULL;
  if (arr != x) val_decref(arr);
  params_clear(p);
  return r;
}

static Value *groups_param(Value *g) { return val_incref(g ? g : VAL_NONE); }

static int axis_size_of(const char *prim, Value *names, Value *groups, int64_t *out);

/* psum of a value that is not a tracer while a body is traced (jit): it is
 * the same on every device, so the sum is the axis size times it, a
 * concrete value: psum(1, 'i') is the axis size, usable in range(), as
 * JAX computes psum of non-tracers.  Eagerly the collective runs: values
 * there are concrete on every device, varying or not. */
static Value *psum_of_constant(Value *x, Value *name, Value *groups) {
  int64_t n;
  if (axis_size_of("psum", name, groups, &n) < 0) return NULL;
  Value *size = val_int(n);
  Value *r = size ? ops_binary(OP_MUL, size, x) : NULL;
  val_decref(size);
  return r;
}

/* A reduction of a Python number gives a Python number, as JAX computes
 * psum(1, 'i') of a non-tracer.  Eagerly one may still differ between
 * devices (int(axis_index('i'))), so the collective runs, on the number's
 * exact value ([x] as a float64 for a Python float), and its 0-d result
 * [r] (stolen) becomes a Python number again. */
static Value *host_operand(Value *x) {
  Array *h = AS_ARRAY(x);
  if (!dt_is_float(h->dtype)) return val_incref(x);
  return (Value *)arr_scalar_f64(DT_F64, arr_host_f64(h), true);
}

static Value *host_result(Value *r) {
  if (!r || !IS_ARRAY(r) || AS_ARRAY(r)->ndim != 0) return r;
  const Array *a = AS_ARRAY(r);
  Value *h = dt_is_float(a->dtype) ? arr_python_float(arr_get_f64(a, 0))
             : a->dtype == DT_BOOL ? val_bool(arr_get_i64(a, 0) != 0)
                                   : val_int(arr_get_i64(a, 0));
  val_decref(r);
  return h;
}

static Value *reduce_collective(const char *fname, PrimId id, const CallArgs *a) {
  Value *x, *name, *groups;
  if (args_bind(fname, a, "x, axis_name, axis_index_groups=",
                (Value **[]){&x, &name, &groups}) < 0)
    return NULL;
  if (id == P_PSUM && prim_tracing() && ops_is_array(x) && x->type != V_TRACER)
    return psum_of_constant(x, name, groups);
  Value *kept = NULL, *xv = NULL;
  if (named_axes && (!groups || groups == VAL_NONE)) {
    /* vmap/xmap axes x does not vary along: a psum multiplies by their
     * size, pmax and pmin leave x (the same on every example) */
    Value *nm = axis_names(name);
    if (!nm) return NULL;
    size_t n;
    Value *const *items = names_of(&nm, &n);
    Value *keep[16];
    size_t k = 0;
    int64_t factor = 1, s;
    for (size_t i = 0; i < n && i < 16; i++) {
      const char *nmi = str_cstr(items[i]);
      if (named_axes->size(nmi, &s) && !named_axes->carries(x, nmi))
        factor *= s;
      else
        keep[k++] = items[i];
    }
    if (k < n) {
      Value *f = val_int(factor);
      xv = id == P_PSUM && f ? ops_binary(OP_MUL, f, x) : val_incref(x);
      val_decref(f);
      kept = k ? tuple_pack(k, keep) : NULL;
      val_decref(nm);
      if (!xv || !kept) return xv;   /* nothing left to reduce across */
      x = xv;
      name = kept;
    } else {
      val_decref(nm);
    }
  }
  AVal av;
  bool host = arr_is_host(x) && !prim_tracing();
  bool count = id == P_PSUM && (IS_ARRAY(x) ? AS_ARRAY(x)->dtype == DT_BOOL
                                            : ops_is_array(x) && ops_aval(x, &av) == 0 &&
                                                  av.dtype == DT_BOOL);
  /* JAX sums booleans as int32: a count, not a logical or */
  Value *xs = count ? ops_convert(x, DT_I32, false) : host ? host_operand(x) : val_incref(x);
  Params p;
  params_init(&p);
  if (!xs || params_add(&p, "axes", axis_names(name)) < 0 ||
      params_add(&p, "axis_index_groups", groups_param(groups)) < 0) {
    params_clear(&p);
    val_decref(xs);
    return NULL;
  }
  Value *r = apply1(id, xs, &p);
  val_decref(xs);
  if (xv) val_decref(xv);
  if (kept) val_decref(kept);
  return host ? host_result(r) : r;
}

static Value *bi_psum(const CallArgs *a) { return reduce_collective("psum", P_PSUM, a); }
static Value *bi_pmax(const CallArgs *a) { return reduce_collective("pmax", P_PMAX, a); }
static Value *bi_pmin(const CallArgs *a) { return reduce_collective("pmin", P_PMIN, a); }

/* pmean: psum divided by the axis size, as jax.lax.pmean. */
static Value *bi_pmean(const CallArgs *a) {
  Value *x, *name, *groups;
  if (args_bind("pmean", a, "x, axis_name, axis_index_groups=",
                (Value **[]){&x, &name, &groups}) < 0)
    return NULL;
  Value *names = axis_names(name);
  int64_t n;
  if (!names || axis_size_of("pmean", names, groups, &n) < 0) {
    val_decref(names);
    return NULL;
  }
  val_decref(names);
  Value *sum = reduce_collective("pmean", P_PSUM, a);
  Value *nv = sum ? val_int(n) : NULL;
  Value *r = nv ? ops_binary(OP_DIV, sum, nv) : NULL;
  val_decref(nv);
  val_decref(sum);
  return r;
}

static Value *bi_axis_index(const CallArgs *a) {
  Value *name;
  if (args_bind("axis_index", a, "axis_name", (Value **[]){&name}) < 0) return NULL;
  if (named_axes && name->type == V_STR) {
    Value *r = named_axes->index(str_cstr(name));
    if (r || err_occurred()) return r;
  }
  Params p;
  params_init(&p);
  if (params_add(&p, "axis_name", axis_names(name)) < 0) {
    params_clear(&p);
    return NULL;
  }
  Value *r = coll_apply(P_AXIS_INDEX, 0, NULL, &p);
  params_clear(&p);
  return r;
}

static Value *bi_axis_size(const CallArgs *a) {
  Value *name;
  if (args_bind("axis_size", a, "axis_name", (Value **[]){&name}) < 0) return NULL;
  Value *names = axis_names(name);
  int64_t n;
  Value *r = names && axis_size_of("axis_size", names, NULL, &n) == 0 ? val_int(n) : NULL;
  val_decref(names);
  return r;
}

/* Adds axis_name, axis_size and axis_index_groups to [p], for collective
 * [prim] (named in errors). */
static int axis_params(const char *prim, Params *p, Value *name, Value *groups) {
  Value *names = axis_names(name);
  int64_t n;
  if (!names || axis_size_of(prim, names, groups, &n) < 0) {
    val_decref(names);
    return -1;
  }
  if (params_add(p, "axis_name", names) < 0 || params_add(p, "axis_size", val_int(n)) < 0)
    return -1;
  return params_add(p, "axis_index_groups", groups_param(groups));
}

static Value *int_param(Value *v, int64_t deflt) {
  int64_t x = deflt;
  if (v && arr_to_index(v, &x) < 0) return NULL;
  return val_int(x);
}

static Value *bool_param(Value *v) {
  int t = v ? val_truth(v) : 0;
  return t < 0 ? NULL : val_incref(val_bool(t));
}

static Value *bi_pvary(const CallArgs *a);

static Value *bi_all_gather(const CallArgs *a) {
  Value *x, *name, *axis, *tiled, *groups, *to = NULL;
  if (args_bind("all_gather", a, "x, axis_name, axis_index_groups=, axis=, tiled=, to=",
                (Value **[]){&x, &name, &groups, &axis, &tiled, &to}) < 0)
    return NULL;
  bool varying = false;   /* the result is invariant here (LANGUAGE.md §4) */
  if (to && to != VAL_NONE) {
    if (to->type != V_STR || (strcmp(str_cstr(to), "varying") && strcmp(str_cstr(to), "invarying")))
      return err_set(ERR_VALUE, "all_gather: to must be 'varying' or 'invarying'");
    varying = !strcmp(str_cstr(to), "varying");
  }
  if (varying) {   /* gather, then type the result as varying: JAX's default */
    Value *kw[] = {groups ? groups : VAL_NONE, axis ? axis : VAL_NONE, tiled ? tiled : VAL_NONE};
    const char *kn[] = {"axis_index_groups", "axis", "tiled"};
    CallArgs c = {2, (Value *[]){x, name}, 0, kn, kw};
    int k = 0;
    Value *kv[3];
    const char *knn[3];
    for (int i = 0; i < 3; i++)
      if (kw[i] != VAL_NONE) kv[k] = kw[i], knn[k++] = kn[i];
    c.nkw = k, c.kwnames = knn, c.kwvals = kv;
    Value *g = bi_all_gather(&c);
    if (!g) return NULL;
    CallArgs v = {2, (Value *[]){g, name}, 0, NULL, NULL};
    Value *r = bi_pvary(&v);
    val_decref(g);
    return r;
  }
  Params p;
  params_init(&p);
  if (axis_params("all_gather", &p, name, groups) < 0 ||
      params_add(&p, "all_gather_dimension", int_param(axis, 0)) < 0 ||
      params_add(&p, "tiled", bool_param(tiled)) < 0) {
    params_clear(&p);
    return NULL;
  }
  return apply1(P_ALL_GATHER, x, &p);
}

static Value *bi_psum_scatter(const CallArgs *a) {
  Value *x, *name, *dim, *tiled, *groups;
  if (args_bind("psum_scatter", a, "x, axis_name, scatter_dimension=, axis_index_groups=, tiled=",
                (Value **[]){&x, &name, &dim, &groups, &tiled}) < 0)
    return NULL;
  Params p;
  params_init(&p);
  if (axis_params("psum_scatter", &p, name, groups) < 0 ||
      params_add(&p, "scatter_dimension", int_param(dim, 0)) < 0 ||
      params_add(&p, "tiled", bool_param(tiled)) < 0) {
    params_clear(&p);
    return NULL;
  }
  return apply1(P_PSUM_SCATTER, x, &p);
}

/* A perm argument as a tuple of (source, destination) int pairs. */
static Value *perm_param(Value *perm) {
  size_t n, k;
  Value *const *items, *const *pair;
  if (!val_seq(perm, &n, &items))
    return err_set(ERR_TYPE, "perm must be a list of (source, destination) pairs");
  Value *t = tuple_new(n);
  for (size_t i = 0; t && i < n; i++) {
    int64_t s, d;
    if (!val_seq(items[i], &k, &pair) || k != 2 || arr_to_index(pair[0], &s) < 0 ||
        arr_to_index(pair[1], &d) < 0) {
      val_decref(t);
      return err_set(ERR_TYPE, "perm entry %zu is not a (source, destination) pair of ints", i);
    }
    int64_t sd[2] = {s, d};
    Value *pv = val_int_tuple(2, sd);
    if (!pv) {
      val_decref(t);
      return NULL;
    }
    tuple_set_steal(t, i, pv);
  }
  return t;
}

/* pvary(x, axis_name): x, typed as varying over the axes (lax.pvary). */
static Value *bi_pvary(const CallArgs *a) {
  Value *x, *name;
  if (args_bind("pvary", a, "x, axis_name", (Value **[]){&x, &name}) < 0) return NULL;
  Params p;
  params_init(&p);
  if (params_add(&p, "axes", axis_names(name)) < 0) {
    params_clear(&p);
    return NULL;
  }
  return apply1(P_PVARY, x, &p);
}

/* pcast(x, axis_name, to='varying'): lax.pcast; only the cast to varying
 * (pvary) changes anything here. */
static Value *bi_pcast(const CallArgs *a) {
  Value *x, *name, *to = NULL;
  if (args_bind("pcast", a, "x, axis_name, to=", (Value **[]){&x, &name, &to}) < 0) return NULL;
  if (!to || to->type != V_STR || strcmp(str_cstr(to), "varying"))
    return err_set(ERR_NOT_IMPLEMENTED, "pcast: only to='varying' is implemented");
  CallArgs c = {2, (Value *[]){x, name}, 0, NULL, NULL};
  return bi_pvary(&c);
}

/* The type of a value as jax.typeof prints it (JAX's ShapedArray: str
 * float32[2,2]{V:i,j}, the dtype's full name; repr
 * ShapedArray(float32[2,2]{V:i,j})). */
typedef struct TypeOf {
  Opaque base;
  Value *text;
} TypeOf;

static void typeof_free(Value *v) { val_decref(((TypeOf *)v)->text); }
static Value *typeof_str(Value *v) { return val_incref(((TypeOf *)v)->text); }
static Value *typeof_repr(Value *v) {
  Value *t = ((TypeOf *)v)->text;
  size_t n = ((Str *)t)->len + 16;
  char *buf = shm_malloc(n);
  if (!buf) return err_nomem();
  snprintf(buf, n, "ShapedArray(%s)", str_cstr(t));
  Value *r = str_from(buf);
  shm_free(buf);
  return r;
}
static const OpaqueType typeof_type = {"ShapedArray", typeof_free, typeof_repr, NULL, typeof_str, NULL, NULL};

Value *(*shardmap_typeof_sharding_hook)(Value *x);

/* A sharded array's type names the Explicit mesh axes splitting each
 * dimension, as "8@X" or "8@(X,Y)" (shmap(7), THE THREE MODES): [buf]
 * holding "f32[8,4]" is rewritten so. */
static void explicit_axes(const NamedSharding *s, int ndim, const int64_t *shape, char *buf,
                          size_t cap) {
  if (!s->mesh) return;
  char *open = strchr(buf, '[');
  if (!open) return;
  int n = (int)(open - buf) + 1;
  for (int d = 0; d < ndim && (size_t)n < cap - 64; d++) {
    n += snprintf(buf + n, cap - (size_t)n, "%s%lld", d ? "," : "", (long long)shape[d]);
    const SpecEntry *e = d < s->spec->n ? &s->spec->e[d] : NULL;
    int shown = 0;
    for (int k = 0; e && k < e->nnames; k++) {
      int a = mesh_axis(s->mesh, e->names[k]);
      shown += a >= 0 && s->mesh->axis_types[a] == MESH_EXPLICIT;
    }
    for (int k = 0, j = 0; shown && k < e->nnames && (size_t)n < cap - 64; k++) {
      int a = mesh_axis(s->mesh, e->names[k]);
      if (a < 0 || s->mesh->axis_types[a] != MESH_EXPLICIT) continue;
      n += snprintf(buf + n, cap - (size_t)n, "%s%s", j++ ? "," : shown > 1 ? "@(" : "@", e->names[k]);
    }
    if (shown > 1) n += snprintf(buf + n, cap - (size_t)n, ")");
  }
  snprintf(buf + n, cap - (size_t)n, "]");
}

/* jax.typeof(x): dtype, shape and the mesh axes x varies over. */
static Value *bi_typeof(const CallArgs *a) {
  Value *x;
  if (args_bind("typeof", a, "x", (Value **[]){&x}) < 0) return NULL;
  AVal av;
  if (ops_aval(x, &av) < 0) return NULL;
  char buf[512];
  int n = snprintf(buf, sizeof buf, "%s[", dt_name(av.dtype));
  for (int i = 0; i < av.ndim && n < 400; i++)
    n += snprintf(buf + n, sizeof buf - (size_t)n, "%s%lld", i ? "," : "", (long long)av.shape[i]);
  n += snprintf(buf + n, sizeof buf - (size_t)n, "]");
  if (IS_ARRAY(x) && AS_ARRAY(x)->sharding) {
    explicit_axes((const NamedSharding *)AS_ARRAY(x)->sharding, av.ndim, av.shape, buf, sizeof buf);
  } else if (!IS_ARRAY(x) && shardmap_typeof_sharding_hook) {
    Value *ns = shardmap_typeof_sharding_hook(x);
    if (ns) explicit_axes((const NamedSharding *)ns, av.ndim, av.shape, buf, sizeof buf);
    if (ns) val_decref(ns);
  }
  n = (int)strlen(buf);
  dev_vma_str(av.vma, buf + n, sizeof buf - (size_t)n);
  TypeOf *t = shm_calloc(1, sizeof *t);
  if (!t) return err_nomem();
  val_init(&t->base.hdr, V_OPAQUE);
  t->base.ot = &typeof_type;
  if (!(t->text = str_from(buf))) {
    shm_free(t);
    return NULL;
  }
  return &t->base.hdr;
}

static Value *bi_ppermute(const CallArgs *a) {
  Value *x, *name, *perm;
  if (args_bind("ppermute", a, "x, axis_name, perm", (Value **[]){&x, &name, &perm}) < 0)
    return NULL;
  Params p;
  params_init(&p);
  if (params_add(&p, "axis_name", axis_names(name)) < 0 ||
      params_add(&p, "perm", perm_param(perm)) < 0) {
    params_clear(&p);
    return NULL;
  }
  return apply1(P_PPERMUTE, x, &p);
}

/* pshuffle: device i receives from perm[i]; a ppermute with pairs
 * (perm[i], i), as jax.lax.pshuffle. */
static Value *bi_pshuffle(const CallArgs *a) {
  Value *x, *name, *perm;
  if (args_bind("pshuffle", a, "x, axis_name, perm", (Value **[]){&x, &name, &perm}) < 0)
    return NULL;
  size_t n;
  Value *const *items;
  if (!val_seq(perm, &n, &items))
    return err_set(ERR_TYPE, "pshuffle: perm must be a list of source indices");
  Value *pairs = list_new(n);
  for (size_t i = 0; pairs && i < n; i++) {
    int64_t s;
    if (arr_to_index(items[i], &s) < 0) {
      val_decref(pairs);
      return NULL;
    }
    int64_t sd[2] = {s, (int64_t)i};
    list_append_steal(pairs, val_int_tuple(2, sd));
  }
  if (!pairs) return NULL;
  Value *args[3] = {x, name, pairs};
  CallArgs pa = {.nargs = 3, .args = args};
  Value *r = bi_ppermute(&pa);
  val_decref(pairs);
  return r;
}

static Value *bi_all_to_all(const CallArgs *a) {
  Value *x, *name, *split, *concat, *groups, *tiled;
  if (args_bind("all_to_all", a, "x, axis_name, split_axis, concat_axis, axis_index_groups=, tiled=",
                (Value **[]){&x, &name, &split, &concat, &groups, &tiled}) < 0)
    return NULL;
  Params p;
  params_init(&p);
  if (axis_params("all_to_all", &p, name, groups) < 0 ||
      params_add(&p, "split_axis", int_param(split, 0)) < 0 ||
      params_add(&p, "concat_axis", int_param(concat, 0)) < 0 ||
      params_add(&p, "tiled", bool_param(tiled)) < 0) {
    params_clear(&p);
    return NULL;
  }
  return apply1(P_ALL_TO_ALL, x, &p);
}

/* ragged_all_to_all: seed 002, exactly. */
static Value *bi_ragged_all_to_all(const CallArgs *a) {
  Value *v[6], *name, *groups;
  if (args_bind("ragged_all_to_all", a,
                "operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, "
                "axis_name=, axis_index_groups=",
                (Value **[]){&v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &name, &groups}) < 0)
    return NULL;
  if (!name) return err_set(ERR_TYPE, "ragged_all_to_all() missing required argument 'axis_name'");
  Params p;
  params_init(&p);
  Value *arr[6] = {0};
  Value *r = NULL;
  if (params_add(&p, "axis_name", axis_names(name)) < 0 ||
      params_add(&p, "axis_index_groups", groups_param(groups)) < 0)
    goto out;
  for (int i = 0; i < 6; i++)
    if (!(arr[i] = ops_to_array(v[i], -1))) goto out;
  r = coll_apply(P_RAGGED_ALL_TO_ALL, 6, arr, &p);
out:
  for (int i = 0; i < 6; i++) val_decref(arr[i]);
  params_clear(&p);
  return r;
}

/* ==== pytrees of operands, and the collectives built from others ============ */

static bool is_pytree_node(Value *x) {
  return x->type == V_TUPLE || x->type == V_LIST || x->type == V_DICT || cls_is_tree_node(x);
}

/* A collective [fn] of a pytree: the collective of each leaf, in the
 * tree's shape (JAX binds the leaves together, with the same meaning). */
static Value *tree_collective(BuiltinFn fn, const CallArgs *a) {
  if (a->nargs < 1 || !is_pytree_node(a->args[0])) return fn(a);
  PyLeaves l = {0};
  if (pytree_flatten(a->args[0], NULL, &l) < 0) return NULL;
  Value **outs = shm_calloc((size_t)l.n + 1, sizeof(Value *)), *r = NULL;
  Value **args = shm_calloc((size_t)a->nargs, sizeof(Value *));
  int k = 0;
  if (outs && args) {
    for (int i = 1; i < a->nargs; i++) args[i] = a->args[i];
    for (; k < l.n; k++) {
      args[0] = l.v[k];
      CallArgs one = {a->nargs, args, a->nkw, a->kwnames, a->kwvals};
      if (!(outs[k] = fn(&one))) break;
    }
    int pos = 0;
    if (k == l.n) r = pytree_replace(a->args[0], NULL, outs, &pos);
  } else {
    err_nomem();
  }
  for (int i = 0; i < k; i++) val_decref(outs[i]);
  shm_free(outs);
  shm_free(args);
  pytree_leaves_free(&l);
  return r;
}
/* Calls builtin [fn] on [n] positional arguments. */
static Value *call_builtin(BuiltinFn fn, int n, Value **args) {
  CallArgs c = {n, args, 0, NULL, NULL};
  return fn(&c);
}

/* This device's index along [name], as a value. */
static Value *index_along(Value *name) { return call_builtin(bi_axis_index, 1, &name); }

/* pbroadcast(x, axis_name, source): device [source]'s x on every device
 * of the axis (lax.pbroadcast): a psum of x kept on the source only. */
static Value *bi_pbroadcast(const CallArgs *a) {
  Value *x, *name, *source, *groups;
  if (args_bind("pbroadcast", a, "x, axis_name, source, axis_index_groups=",
                (Value **[]){&x, &name, &source, &groups}) < 0)
    return NULL;
  Value *idx = index_along(name);
  Value *here = idx ? ops_compare(OP_EQ, idx, source) : NULL;
  Value *zero = here ? val_int(0) : NULL;
  Value *kept = zero ? ops_select(here, x, zero) : NULL;
  Value *xa = kept ? ops_to_array(x, -1) : NULL;
  AVal xv;
  Value *typed = xa && ops_aval(xa, &xv) == 0 ? ops_convert(kept, xv.dtype, xv.weak) : NULL;
  Value *args[3] = {typed, name, groups ? groups : VAL_NONE};
  Value *r = typed ? call_builtin(bi_psum, 3, args) : NULL;
  Value *tmp[] = {idx, here, zero, kept, xa, typed};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  return r;
}

/* pargmax/pargmin(x, axis_name): per element, the index along the axis
 * of the device holding the largest (smallest) x, the lowest on ties. */
static Value *parg(const char *fname, BuiltinFn reduce, const CallArgs *a) {
  Value *x, *name;
  if (args_bind(fname, a, "x, axis_name", (Value **[]){&x, &name}) < 0) return NULL;
  Value *args[2] = {x, name};
  Value *best = call_builtin(reduce, 2, args);
  Value *here = best ? ops_compare(OP_EQ, x, best) : NULL;
  Value *idx = here ? index_along(name) : NULL;
  Value *big = idx ? val_int(INT32_MAX) : NULL;
  Value *cand = big ? ops_select(here, idx, big) : NULL;
  Value *margs[2] = {cand, name};
  Value *r = cand ? call_builtin(bi_pmin, 2, margs) : NULL;
  Value *tmp[] = {best, here, idx, big, cand};
  for (size_t i = 0; i < sizeof tmp / sizeof *tmp; i++)
    if (tmp[i]) val_decref(tmp[i]);
  return r;
}
static Value *bi_pargmax(const CallArgs *a) { return parg("pargmax", bi_pmax, a); }
static Value *bi_pargmin(const CallArgs *a) { return parg("pargmin", bi_pmin, a); }

/* pswapaxes(x, axis_name, axis): the mapped axis swapped with positional
 * axis [axis]: all_to_all(x, axis_name, axis, axis), as JAX defines it. */
static Value *bi_pswapaxes(const CallArgs *a) {
  Value *x, *name, *axis, *groups;
  if (args_bind("pswapaxes", a, "x, axis_name, axis, axis_index_groups=",
                (Value **[]){&x, &name, &axis, &groups}) < 0)
    return NULL;
  Value *args[5] = {x, name, axis, axis, groups ? groups : VAL_NONE};
  return call_builtin(bi_all_to_all, 5, args);
}

/* A shard_map function's attributes: functools.wraps' __wrapped__, its
 * per-device body (the debugger's `b f` breaks in it). */
static Value *shardfn_getattr(Value *self, const char *name) {
  if (strcmp(name, "__wrapped__") == 0) return val_incref(((ShardFn *)self)->body);
  return err_set(ERR_ATTRIBUTE, "'shard_map' object has no attribute '%s'", name);
}

/* ==== the built-ins' one list ================================================== */

/*
 * Every built-in of this file, once, in the order they are registered
 * (each also as lax.NAME; shard_map as jax.shard_map):
 *   X(name, form, group, doc)
 *   name   the function is bi_<name>
 *   form   TREE: applied to each leaf of a pytree operand (tree_collective,
 *          through the bi_<name>_tree made below); PLAIN: as it is
 *   group  whether it needs every device of the body (shardmap_is_collective)
 *   doc    its line for help() and completion
 */
#define SHARDMAP_BUILTINS(X)                                                               \
  X(shard_map, PLAIN, false, "shard_map(f, mesh, in_specs, out_specs, check_rep=True)")    \
  X(axis_index, PLAIN, false, "axis_index(axis_name): this device's index")               \
  X(axis_size, PLAIN, false, "axis_size(axis_name): the axis size")                       \
  X(psum, TREE, true, "psum(x, axis_name, axis_index_groups=None)")                       \
  X(pmean, TREE, true, "pmean(x, axis_name, axis_index_groups=None)")                     \
  X(pmax, TREE, true, "pmax(x, axis_name, axis_index_groups=None)")                       \
  X(pmin, TREE, true, "pmin(x, axis_name, axis_index_groups=None)")                       \
  X(all_gather, TREE, true, "all_gather(x, axis_name, axis=0, tiled=False)")              \
  X(psum_scatter, TREE, true, "psum_scatter(x, axis_name, scatter_dimension=0, tiled=False)") \
  X(ppermute, TREE, true, "ppermute(x, axis_name, perm)")                                 \
  X(pvary, TREE, false, "pvary(x, axis_name): x, typed as varying over the axes")         \
  X(pcast, TREE, false, "pcast(x, axis_name, to='varying')")                              \
  X(pshuffle, TREE, true, "pshuffle(x, axis_name, perm)")                                 \
  X(all_to_all, TREE, true,                                                                \
    "all_to_all(x, axis_name, split_axis, concat_axis, tiled=False)")                     \
  X(pbroadcast, PLAIN, true, "pbroadcast(x, axis_name, source): device source's x")       \
  X(pargmax, PLAIN, true, "pargmax(x, axis_name): the index of the device of the max")    \
  X(pargmin, PLAIN, true, "pargmin(x, axis_name): the index of the device of the min")    \
  X(pswapaxes, PLAIN, true,                                                                \
    "pswapaxes(x, axis_name, axis): all_to_all(x, axis_name, axis, axis)")                \
  X(ragged_all_to_all, PLAIN, true,                                                        \
    "ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, "      \
    "recv_sizes, axis_name=, axis_index_groups=None)")

/* bi_<name>_tree of each TREE built-in, and the function each registers */
#define TREE_WRAPPER_TREE(name) \
  static Value *bi_##name##_tree(const CallArgs *a) { return tree_collective(bi_##name, a); }
#define TREE_WRAPPER_PLAIN(name)
#define FN_TREE(name) bi_##name##_tree
#define FN_PLAIN(name) bi_##name
#define X(name, form, group, doc) TREE_WRAPPER_##form(name)
SHARDMAP_BUILTINS(X)
#undef X

static const struct {
  const char *name;
  BuiltinFn fn;
  bool group;
  const char *doc;
} shardmap_builtins[] = {
#define X(name, form, group, doc) {#name, FN_##form(name), group, doc},
    SHARDMAP_BUILTINS(X)
#undef X
};

bool shardmap_is_collective(const Value *fn) {
  if (!fn || fn->type != V_BUILTIN) return false;
  for (size_t i = 0; i < sizeof shardmap_builtins / sizeof *shardmap_builtins; i++)
    if (shardmap_builtins[i].group && ((const Builtin *)fn)->fn == shardmap_builtins[i].fn)
      return true;
  return false;
}

int shardmap_register(Env *b) {
  val_register_free(V_SHARDFN, shardfn_free);
  print_register(V_SHARDFN, shardfn_repr, shardfn_repr);
  eval_register_call(V_SHARDFN, shardmap_call);
  ops_register_getattr(V_SHARDFN, shardfn_getattr);
  eval_exec_shard_map = exec_shard_map;
  coll_register_prims();
  for (size_t i = 0; i < sizeof shardmap_builtins / sizeof *shardmap_builtins; i++) {
    /* Each is also lax.NAME / jax.lax.NAME; shard_map is jax.shard_map. */
    const char *name = shardmap_builtins[i].name;
    Value *v = builtin_new(name, shardmap_builtins[i].fn, shardmap_builtins[i].doc);
    const char *ns = i == 0 ? "jax" : "lax";
    int rc = v ? env_set(b, intern_cstr(name), v) : -1;
    if (rc == 0) rc = builtins_add_to(ns, name, v);
    if (rc == 0 && i == 0) rc = builtins_add_to("jax.experimental.shard_map", name, v);
    val_decref(v);
    if (rc < 0) return -1;
  }
  Value *tv = builtin_new("typeof", bi_typeof, "typeof(x): dtype, shape and varying mesh axes");
  int trc = tv && builtins_add_to("jax", "typeof", tv) == 0 ? 0 : -1;
  if (tv) val_decref(tv);
  return trc;
}

/* ==== a shard_map inside a partial-manual body ====================================== */

/*
 * A shard_map called inside a shard_map body that left some mesh axes
 * automatic makes some of those axes manual as well (JAX's nested
 * partial-auto shard_map).  Each device already runs the outer body on
 * values whole along the automatic axes, so the inner call runs on the
 * same device thread: the device takes its own block along the inner
 * manual axes, runs the inner body with those axes manual too, and puts
 * each result back together with a tiled all_gather over the axes its
 * out_spec splits (an axis the out_spec leaves out must be invariant:
 * the usual check_vma rule).  No new threads: the outer call's
 * collective group serves the inner body's collectives.  Under a
 * transformation the call goes to shard_map's rules (grad, vmap) or is
 * staged (jit) as at the top level; what they call runs here again.
 */

/* True when mesh [m] is the one [d] describes (names, sizes, devices). */
static bool desc_is_mesh(const MeshDesc *d, const Mesh *m) {
  MeshDesc md;
  mesh_to_desc(m, &md);
  if (md.naxes != d->naxes) return false;
  for (int a = 0; a < d->naxes; a++)
    if (md.sizes[a] != d->sizes[a] || strcmp(md.names[a], d->names[a]) != 0) return false;
  for (int r = 0; r < d->ndevices; r++) {
    int x = md.device_ids ? md.device_ids[r] : r, y = d->device_ids ? d->device_ids[r] : r;
    if (x != y) return false;
  }
  return true;
}

/* JAX's checks of a nested call: the same mesh, and manual axes the outer
 * body left automatic.  Returns the inner manual axes, or 0 with the error
 * set. */
static uint32_t nested_axes(const ShardFn *f, const MeshDesc *outer) {
  if (!desc_is_mesh(outer, f->mesh)) {
    char want[256] = "";
    axes_list(f->mesh, ~0u, want, sizeof want);
    err_set(ERR_VALUE, "%s(): the context mesh (the enclosing shard_map's) should match the "
                       "mesh passed to shard_map (axes %s)", f->name, want);
    return 0;
  }
  uint32_t all = (f->mesh->naxes >= 32 ? ~0u : (1u << f->mesh->naxes) - 1);
  uint32_t inner = all & ~f->auto_axes, already = inner & ~outer->auto_axes;
  if (already) {
    char names[256] = "";
    axes_list(f->mesh, already, names, sizeof names);
    err_set(ERR_VALUE, "%s(): axis_names %s are already manual in the enclosing shard_map; a "
                       "nested shard_map may make manual only axes the enclosing one left "
                       "automatic", f->name, names);
    return 0;
  }
  return inner;
}

/* The check_vma rule for result [k] of a nested call: over the inner
 * manual axes [inner], [r] may vary only along axes its out_spec names. */
static int nested_check_vma(const ShardFn *f, const PSpec *s, Array *r, int k, uint32_t inner) {
  uint32_t bad = r->vma & inner & ~spec_axes(s, f->mesh);
  for (int a = 0; bad && a < f->mesh->naxes; a++) {
    if (!(bad >> a & 1)) continue;
    return fn_vma_error(f, s, k, a, r->why, (Loc){0});
  }
  return 0;
}

/* Result [x] (consumed) of the inner body, whole again along the inner
 * axes: a tiled all_gather along each dimension [s] splits. */
static Value *nested_reassemble(const ShardFn *f, const PSpec *s, Value *x, int k,
                                uint32_t inner) {
  if (!ops_is_array(x)) {
    val_decref(x);
    return err_set(ERR_NOT_IMPLEMENTED, "%s(): a nested shard_map's results must be arrays",
                   f->name);
  }
  if (f->check_rep && nested_check_vma(f, s, AS_ARRAY(x), k, inner) < 0) {
    val_decref(x);
    return NULL;
  }
  const Mesh *m = f->mesh;
  for (int d = 0; x && d < s->n && d < AS_ARRAY(x)->ndim; d++) {
    const SpecEntry *e = &s->e[d];
    if (!e->nnames) continue;
    Value *names = tuple_new((size_t)e->nnames);
    for (int q = 0; names && q < e->nnames; q++) tuple_set_steal(names, (size_t)q, str_from(e->names[q]));
    Params p;
    params_init(&p);
    params_add(&p, "axis_name", names);
    params_add(&p, "all_gather_dimension", val_int(d));
    params_add(&p, "axis_size", val_int(pspec_entry_size(s, m, d)));
    params_add(&p, "tiled", val_bool(true));
    params_add(&p, "axis_index_groups", val_incref(VAL_NONE));
    Value *g = coll_apply(P_ALL_GATHER, 1, &x, &p);
    params_clear(&p);
    val_decref(x);
    x = g;
  }
  return x;
}

/* The blocks of the nested call's arguments on this device: views split
 * along the inner axes, still varying over what the outer body's values
 * vary over. */
static int nested_blocks(Call *c, const DevCtx *dc, Value **blocks) {
  for (int i = 0; i < c->nargs; i++) {
    Array *x = c->args[i];
    Array *b = block_of(x, in_spec_of(c->f, i), c->f->mesh, dc->rank);
    if (!b) {
      while (i-- > 0) val_decref(blocks[i]);
      return -1;
    }
    uint32_t split = b->vma;
    b->vma |= x->vma;
    if (split) b->why = (VmaWhy){0, 0, (int16_t)(i + 1), split};
    blocks[i] = &b->hdr;
  }
  return 0;
}

/* [x] (a result, or NULL) no longer varies over the inner axes; an
 * array that never did is left unwritten (the body may return a value
 * other devices share). */
static void nested_invariant(Value *x, uint32_t inner) {
  if (x && AS_ARRAY(x)->vma & inner) AS_ARRAY(x)->vma &= ~inner;
}

/* The inner body's results [r] (consumed), each whole again along the
 * inner axes and no longer varying over them. */
static Value *nested_results(const ShardFn *f, Value *r, uint32_t inner) {
  size_t nres = 1;
  Value *const *items = &r;
  bool single = f->out_specs->type == V_PSPEC && r->type != V_TUPLE;
  if (!single && (!val_seq(r, &nres, &items) ||
                  (f->out_specs->type == V_TUPLE && tuple_len(f->out_specs) != nres))) {
    val_decref(r);
    return err_set(ERR_VALUE, "%s(): the body's results do not match its out_specs", f->name);
  }
  if (single) {
    Value *one = nested_reassemble(f, shardmap_out_spec(f, 0), r, 0, inner);
    nested_invariant(one, inner);
    return one;
  }
  Value *out = tuple_new(nres);
  for (size_t k = 0; out && k < nres; k++) {
    Value *one = nested_reassemble(f, shardmap_out_spec(f, (int)k), val_incref(items[k]),
                                   (int)k, inner);
    if (!one) {
      val_decref(out);
      out = NULL;
      break;
    }
    nested_invariant(one, inner);
    tuple_set_steal(out, k, one);
  }
  val_decref(r);
  return out;
}

/* Runs the inner body with [inner] manual as well, then reassembles (its
 * all_gathers name the inner axes, so they too run with them manual). */
static Value *nested_run(Call *c, DevCtx *dc, uint32_t inner) {
  Value *blocks[SHARDMAP_MAX_ARGS];
  if (nested_blocks(c, dc, blocks) < 0) return NULL;
  MeshDesc md = *dc->mesh;
  const MeshDesc *saved = dc->mesh;
  bool unchecked = dc->unchecked;
  md.auto_axes &= ~inner;
  dc->mesh = &md;
  dc->unchecked = !c->f->check_rep;
  Value *r = val_call_n(c->f->body, c->nargs, blocks);
  for (int i = 0; i < c->nargs; i++) val_decref(blocks[i]);
  if (r) r = nested_results(c->f, r, inner);
  dc->mesh = saved;
  dc->unchecked = unchecked;
  return r;
}

/* A shard_map called on device [dc]'s thread, inside another's body (or
 * inside one's body being traced).  On values being differentiated or
 * batched, the shard_map row's rules take the call and come back here
 * with shard_maps of the body's JVP, linearization, backward pass or
 * vmap, which run on this device like any nested call; under jit, one
 * shard_map equation in the enclosing body's plan, which runs here when
 * the plan does. */
static Value *shardmap_call_nested(ShardFn *f, const CallArgs *a, DevCtx *dc) {
  uint32_t inner = nested_axes(f, dc->mesh);
  if (!inner) return NULL;
  for (int i = 0; differentiator && i < a->nargs; i++)
    if (a->args[i]->type == V_TRACER && !prim_value_is_staged(a->args[i]))
      return differentiator(&f->hdr, a);
  if (prim_tracing()) {
    if (!stager) return err_set(ERR_TYPE, "shard_map: cannot be staged (no jit)");
    return stager(&f->hdr, a);
  }
  Call c = {.f = f};
  c.args = shm_calloc((size_t)a->nargs + 1, sizeof(Array *));
  Value *res = NULL;
  if (!c.args) err_nomem();
  else if (prepare_args(&c, a) == 0) res = nested_run(&c, dc, inner);
  for (int i = 0; i < c.nargs; i++) val_decref(c.args[i] ? &c.args[i]->hdr : NULL);
  shm_free(c.args);
  return res;
}
