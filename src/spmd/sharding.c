/*
 * sharding.c - sharded jax.Arrays: NamedSharding, devices, device_put and
 * the layout of eager results (sharding.h).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "array/array.h"
#include "array/kernels.h"
#include "array/prim.h"
#include "array/print.h"
#include "base/error.h"
#include "base/intern.h"
#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/ops.h"
#include "lang/pytree.h"
#include "spmd/device.h"
#include "spmd/sharding.h"
#include "spmd/shardmap.h"
#include "spmd/transport.h"

/* ==== device objects ========================================================== */

/* A jax Device: its id; process_index and platform follow from it. */
typedef struct Device {
  Opaque base;
  int id;
} Device;

static Value *device_repr(Value *self) {
  char buf[48];
  snprintf(buf, sizeof buf, "CpuDevice(id=%d)", ((Device *)self)->id);
  return str_from(buf);
}

static int local_range(int *first);

/* Device.memory_stats(): what this process's device holds, as XLA's
 * allocator statistics name it (base/mem.h: the array payloads its thread
 * made and still live, and the argument blocks of a running shard_map
 * body): a dict of bytes_in_use and peak_bytes_in_use, or None for a
 * device of another process. */
static Value *device_memory_stats(Value *self, const CallArgs *a) {
  if (a->nargs || a->nkw) return err_set(ERR_TYPE, "memory_stats() takes no arguments");
  int first, n = local_range(&first), local = ((Device *)self)->id - first;
  long long in_use, peak;
  if (local < 0 || local >= n || !shm_mem_device_stats(local, &in_use, &peak))
    return val_incref(VAL_NONE);
  Value *d = dict_new(), *u = val_int(in_use), *p = val_int(peak);
  int rc = d && u && p && dict_set_str(d, "bytes_in_use", u) == 0 &&
                   dict_set_str(d, "peak_bytes_in_use", p) == 0
               ? 0
               : -1;
  val_decref(u);
  val_decref(p);
  if (rc < 0) {
    val_decref(d);
    return err_occurred() ? NULL : err_nomem();
  }
  return d;
}

static Value *device_getattr(Value *self, const char *name) {
  int id = ((Device *)self)->id;
  if (!strcmp(name, "memory_stats")) return bound_new("memory_stats", device_memory_stats, self);
  if (!strcmp(name, "id")) return val_int(id);
  if (!strcmp(name, "process_index")) return val_int(transport_process_of(id));
  if (!strcmp(name, "platform")) return str_from("cpu");
  if (!strcmp(name, "device_kind")) return str_from("cpu");
  return err_set(ERR_ATTRIBUTE, "'Device' object has no attribute '%s'", name);
}

static void nothing_to_free(Value *v) { (void)v; }

static const OpaqueType device_type = {"Device", nothing_to_free, device_repr, device_getattr,
                                       NULL, NULL, NULL};

/* One Device object per id, made on first use and never freed, so that
 * devices compare and hash (as dict keys) by identity, as JAX's do. */
static Device *device_objs[MESH_MAX_DEVICES / 1024];
/* guards device_objs' first fill (any thread may ask for a device) */
static pthread_mutex_t device_lock = PTHREAD_MUTEX_INITIALIZER;

static Value *device_new(int id) {
  if (id < 0 || id >= (int)(sizeof device_objs / sizeof device_objs[0]))
    return err_set(ERR_VALUE, "device id %d is out of range", id);
  pthread_mutex_lock(&device_lock);
  Device *d = device_objs[id];
  if (!d && (d = shm_calloc(1, sizeof *d))) {
    val_init(&d->base.hdr, V_OPAQUE);
    val_make_static(&d->base.hdr);
    d->base.ot = &device_type;
    d->id = id;
    device_objs[id] = d;
  }
  pthread_mutex_unlock(&device_lock);
  return d ? val_incref(&d->base.hdr) : err_nomem();
}

/* The id of a Device value, or -1 (no error) for anything else. */
static int device_id(const Value *v) {
  return v && v->type == V_OPAQUE && ((const Opaque *)v)->ot == &device_type ? ((const Device *)v)->id
                                                                             : -1;
}

/* The Devices of ids [first, first + n) as a list. */
static Value *device_list(int first, int n) {
  Value *l = list_new((size_t)n);
  for (int i = 0; l && i < n; i++)
    if (list_append_steal(l, device_new(first + i)) < 0) {
      val_decref(l);
      return err_nomem();
    }
  return l;
}

/* This process's devices: [*first] and the count (all without mpirun). */
static int local_range(int *first) {
  int procs = transport_procs(), n = shm_interp->ndevices / procs;
  *first = transport_rank() * n;
  return n;
}

static Value *bi_devices(const CallArgs *a) {
  if (a->nargs > 1 || a->nkw) return err_set(ERR_TYPE, "devices() takes at most one argument (the backend)");
  return device_list(0, shm_interp->ndevices);
}

static Value *bi_local_devices(const CallArgs *a) {
  if (a->nargs > 1 || a->nkw > 2) return err_set(ERR_TYPE, "local_devices() takes the process index and backend");
  int first, n = local_range(&first);
  return device_list(first, n);
}

static Value *bi_device_count(const CallArgs *a) {
  (void)a;
  return val_int(shm_interp->ndevices);
}

static Value *bi_local_device_count(const CallArgs *a) {
  (void)a;
  int first;
  return val_int(local_range(&first));
}

static Value *bi_process_index(const CallArgs *a) {
  (void)a;
  return val_int(transport_rank());
}

static Value *bi_process_count(const CallArgs *a) {
  (void)a;
  return val_int(transport_procs());
}

/* ==== NamedSharding ============================================================ */

static void sharding_free(Value *v) {
  NamedSharding *s = (NamedSharding *)v;
  if (s->mesh) val_decref(&s->mesh->hdr);
  val_decref(&s->spec->hdr);
}

static Value *sharding_repr(Value *self);
static Value *sharding_getattr(Value *self, const char *name);

static const OpaqueType sharding_type = {"NamedSharding", sharding_free, sharding_repr,
                                         sharding_getattr, NULL, NULL, NULL};

bool sharding_is(const Value *v) {
  return v && v->type == V_OPAQUE && ((const Opaque *)v)->ot == &sharding_type;
}

/* A new sharding of [mesh] (NULL: single device [device]) and [spec]. */
static Value *sharding_make(Mesh *mesh, PSpec *spec, int device) {
  NamedSharding *s = shm_calloc(1, sizeof *s);
  if (!s) return err_nomem();
  val_init(&s->base.hdr, V_OPAQUE);
  s->base.ot = &sharding_type;
  s->mesh = mesh ? (Mesh *)val_incref(&mesh->hdr) : NULL;
  s->spec = (PSpec *)val_incref(&spec->hdr);
  s->device = device;
  return &s->base.hdr;
}

Value *sharding_new(Mesh *mesh, PSpec *spec) { return sharding_make(mesh, spec, -1); }

static Value *single_device(int device) {
  PSpec *none = pspec_none(0);
  Value *r = none ? sharding_make(NULL, none, device) : NULL;
  if (none) val_decref(&none->hdr);
  return r;
}

int sharding_check(const NamedSharding *s, int ndim, const int64_t *shape) {
  if (!s->mesh) return 0;
  if (pspec_check(s->spec, s->mesh, ndim, "the sharding's spec") < 0) return -1;
  for (int d = 0; d < s->spec->n; d++) {
    int k = pspec_entry_size(s->spec, s->mesh, d);
    if (shape[d] % k) {
      char sb[256];
      pspec_str(s->spec, sb, sizeof sb);
      err_set(ERR_VALUE, "one of the array's dimensions is not divisible by its mesh axes: "
              "dimension %d of size %lld is split %d ways by %s", d, (long long)shape[d], k, sb);
      return -1;
    }
  }
  return 0;
}

/* The mesh axes that jax.sharding.auto_axes makes Auto while its
 * function runs on this thread (bits of the mesh's axes). */
static _Thread_local uint32_t auto_now;

uint32_t sharding_auto_axes(void) { return auto_now; }

void sharding_rule_mesh(const Mesh *m, Sharding *out) {
  out->explicit_axes = 0;
  out->axis_names = m ? m->axis_names : NULL;
  for (int i = 0; m && i < m->naxes; i++)
    if (m->axis_types[i] == MESH_EXPLICIT) out->explicit_axes |= 1u << i;
  out->explicit_axes &= ~auto_now;
}

void sharding_to_rule(const NamedSharding *s, int ndim, Sharding *out) {
  memset(out, 0, sizeof *out);
  out->ndim = ndim;
  out->naxes = s->mesh ? s->mesh->naxes : 0;
  for (int i = 0; i < out->naxes; i++) out->axis_sizes[i] = s->mesh->axis_sizes[i];
  sharding_rule_mesh(s->mesh, out);
  for (int d = 0; d < ndim && d < s->spec->n; d++) {
    out->nsplit[d] = (uint8_t)s->spec->e[d].nnames;
    for (int k = 0; k < s->spec->e[d].nnames; k++)
      out->split[d][k] = (int8_t)mesh_axis(s->mesh, s->spec->e[d].names[k]);
  }
}

/* sharding_from_rule, the spec one entry per dimension when [full]. */
static Value *from_rule(Mesh *mesh, const Sharding *r, bool full) {
  for (int a = 0; a < mesh->naxes; a++) full |= mesh->axis_types[a] == MESH_EXPLICIT;
  int n = r->ndim;
  while (!full && n > 0 && r->nsplit[n - 1] == 0) n--;
  PSpec *spec = pspec_none(n);
  if (!spec) return NULL;
  for (int d = 0; d < spec->n; d++) {
    spec->e[d].nnames = r->nsplit[d];
    for (int k = 0; k < r->nsplit[d]; k++) spec->e[d].names[k] = mesh->axis_names[r->split[d][k]];
  }
  Value *s = sharding_new(mesh, spec);
  val_decref(&spec->hdr);
  return s;
}

Value *sharding_from_rule(Mesh *mesh, const Sharding *r) { return from_rule(mesh, r, false); }

Value *sharding_from_rule_spec(Mesh *mesh, const Sharding *r) { return from_rule(mesh, r, true); }

/* The number of spec entries that matter: trailing Nones dropped (JAX
 * compares specs so: P('x') and P('x', None) lay out alike). */
static int spec_len(const PSpec *s) {
  int n = s->n;
  while (n > 0 && s->e[n - 1].nnames == 0) n--;
  return n;
}

/* NamedSharding == NamedSharding: one mesh, specs alike up to trailing
 * Nones; SingleDeviceShardings by device. */
static bool sharding_equal(const NamedSharding *a, const NamedSharding *b) {
  if (!a->mesh || !b->mesh) return !a->mesh && !b->mesh && a->device == b->device;
  int n = spec_len(a->spec);
  if (!mesh_same(a->mesh, b->mesh) || n != spec_len(b->spec)) return false;
  for (int d = 0; d < n; d++) {
    if (a->spec->e[d].nnames != b->spec->e[d].nnames) return false;
    for (int k = 0; k < a->spec->e[d].nnames; k++)
      if (a->spec->e[d].names[k] != b->spec->e[d].names[k]) return false;
  }
  return true;
}

Value *sharding_as_users(Value *out, int ndim, const Value *user, int user_ndim) {
  if (!out || !user || !sharding_is(user) || user_ndim != ndim) return out;
  const NamedSharding *u = (const NamedSharding *)user, *o = (const NamedSharding *)out;
  if (!u->mesh || !o->mesh) return out;
  for (int a = 0; a < o->mesh->naxes; a++)
    if (o->mesh->axis_types[a] == MESH_EXPLICIT) return out;
  if (!sharding_equal(u, o)) return out;
  val_decref(out);
  return val_incref((Value *)user);
}

static bool fully_replicated(const NamedSharding *s) {
  for (int d = 0; d < s->spec->n; d++)
    if (s->spec->e[d].nnames) return false;
  return true;
}

bool sharding_unsharded_over(const NamedSharding *s, const Mesh *m) {
  if (!s || !s->mesh) return true;
  if (mesh_same(s->mesh, m) || !fully_replicated(s) || s->mesh->size != m->size ||
      memcmp(s->mesh->devices, m->devices, sizeof(int) * (size_t)m->size))
    return false;
  for (int a = 0; a < s->mesh->naxes; a++)
    if (s->mesh->axis_types[a] == MESH_EXPLICIT) return false;
  for (int a = 0; a < m->naxes; a++)
    if (m->axis_types[a] == MESH_EXPLICIT) return false;
  return true;
}

static Value *sharding_repr(Value *self) {
  NamedSharding *s = (NamedSharding *)self;
  char buf[1024], sb[512];
  if (!s->mesh) {
    snprintf(buf, sizeof buf, "SingleDeviceSharding(device=CpuDevice(id=%d))", s->device);
    return str_from(buf);
  }
  Value *m = val_repr(&s->mesh->hdr);
  if (!m) return NULL;
  pspec_str(s->spec, sb, sizeof sb);
  snprintf(buf, sizeof buf, "NamedSharding(mesh=%s, spec=%s)", str_cstr(m), sb);
  val_decref(m);
  return str_from(buf);
}

/* The shape of one device's block of an array of [shape]. */
static Value *shard_shape(const NamedSharding *s, Value *shape_v) {
  int64_t shape[SHM_MAXDIM];
  Value *arr = ops_to_array(shape_v, DT_I64);
  if (!arr) return NULL;
  Array *a = AS_ARRAY(arr);
  int nd = a->ndim == 1 && a->size <= SHM_MAXDIM ? (int)a->size : -1;
  for (int d = 0; d < nd; d++) shape[d] = arr_get_i64(a, d);
  val_decref(arr);
  if (nd < 0) return err_set(ERR_TYPE, "shard_shape: expected a shape tuple");
  if (sharding_check(s, nd, shape) < 0) return NULL;
  for (int d = 0; s->mesh && d < s->spec->n; d++) shape[d] /= pspec_entry_size(s->spec, s->mesh, d);
  return val_int_tuple(nd, shape);
}

/* Reads a shape argument: a tuple of sizes. */
static int read_shape(Value *v, int *nd, int64_t *shape) {
  Value *arr = ops_to_array(v, DT_I64);
  if (!arr) return -1;
  Array *a = AS_ARRAY(arr);
  int ok = a->ndim == 1 && a->size <= SHM_MAXDIM;
  *nd = ok ? (int)a->size : 0;
  for (int d = 0; d < *nd; d++) shape[d] = arr_get_i64(a, d);
  val_decref(arr);
  if (!ok) err_set(ERR_TYPE, "expected a shape tuple");
  return ok ? 0 : -1;
}

/* Device [flat] of [s]'s mesh holds, along dimension d, the block
 * [start[d], start[d] + size[d]) of an array of [shape]. */
static void block_of(const NamedSharding *s, int flat, int nd, const int64_t *shape,
                     int64_t *start, int64_t *size) {
  int coords[MESH_MAX_AXES];
  if (s->mesh) mesh_coords(s->mesh, flat, coords);
  for (int d = 0; d < nd; d++) {
    int64_t idx = 0, k = 1;
    for (int q = 0; s->mesh && d < s->spec->n && q < s->spec->e[d].nnames; q++) {
      int mi = mesh_axis(s->mesh, s->spec->e[d].names[q]);
      idx = idx * s->mesh->axis_sizes[mi] + coords[mi];
      k *= s->mesh->axis_sizes[mi];
    }
    size[d] = shape[d] / k;
    start[d] = idx * size[d];
  }
}

/* The index of a block, as JAX gives it: a tuple of slices, slice(None)
 * for a whole dimension. */
static Value *block_index(int nd, const int64_t *shape, const int64_t *start, const int64_t *size) {
  Value *t = tuple_new((size_t)nd);
  for (int d = 0; t && d < nd; d++) {
    bool whole = size[d] == shape[d];
    Value *a = whole ? val_incref(VAL_NONE) : val_int(start[d]);
    Value *b = whole ? val_incref(VAL_NONE) : val_int(start[d] + size[d]);
    Value *sl = a && b ? slice_new(a, b, VAL_NONE) : NULL;
    if (a) val_decref(a);
    if (b) val_decref(b);
    if (!sl) {
      val_decref(t);
      return err_nomem();
    }
    tuple_set_steal(t, (size_t)d, sl);
  }
  return t;
}

/* The mesh's device count, or 1 for a single device. */
static int sharding_ndev(const NamedSharding *s) { return s->mesh ? s->mesh->size : 1; }

static int sharding_device(const NamedSharding *s, int flat) {
  return s->mesh ? s->mesh->devices[flat] : s->device;
}

/* {Device: index} for every device ([local]: this process's only). */
static Value *indices_map(const NamedSharding *s, Value *shape_v, bool local) {
  int nd;
  int64_t shape[SHM_MAXDIM], start[SHM_MAXDIM], size[SHM_MAXDIM];
  if (read_shape(shape_v, &nd, shape) < 0 || sharding_check(s, nd, shape) < 0) return NULL;
  Value *d = dict_new();
  for (int f = 0; d && f < sharding_ndev(s); f++) {
    int dev = sharding_device(s, f);
    if (local && !transport_is_local(dev)) continue;
    block_of(s, f, nd, shape, start, size);
    Value *k = device_new(dev), *v = k ? block_index(nd, shape, start, size) : NULL;
    int rc = v ? dict_set(d, k, v) : -1;
    if (k) val_decref(k);
    if (v) val_decref(v);
    if (rc < 0) {
      val_decref(d);
      return NULL;
    }
  }
  return d;
}

static Value *m_shard_shape(Value *self, const CallArgs *a) {
  Value *shape;
  if (args_bind("shard_shape", a, "global_shape", (Value **[]){&shape}) < 0) return NULL;
  return shard_shape((NamedSharding *)self, shape);
}

static Value *m_devices_indices_map(Value *self, const CallArgs *a) {
  Value *shape;
  if (args_bind("devices_indices_map", a, "global_shape", (Value **[]){&shape}) < 0) return NULL;
  return indices_map((NamedSharding *)self, shape, false);
}

static Value *m_addressable_map(Value *self, const CallArgs *a) {
  Value *shape;
  if (args_bind("addressable_devices_indices_map", a, "global_shape", (Value **[]){&shape}) < 0)
    return NULL;
  return indices_map((NamedSharding *)self, shape, true);
}

/* is_equivalent_to(other, ndim): the same blocks on the same devices for
 * arrays of rank ndim (JAX's; here: equal up to trailing Nones, or both
 * fully replicated over one mesh). */
static Value *m_is_equivalent_to(Value *self, const CallArgs *a) {
  Value *other, *ndim;
  if (args_bind("is_equivalent_to", a, "other, ndim", (Value **[]){&other, &ndim}) < 0) return NULL;
  if (!sharding_is(other)) return val_bool(false);
  NamedSharding *x = (NamedSharding *)self, *y = (NamedSharding *)other;
  bool rep = x->mesh && y->mesh && mesh_same(x->mesh, y->mesh) && fully_replicated(x) &&
             fully_replicated(y);
  return val_bool(rep || sharding_equal(x, y));
}

static Value *sharding_getattr(Value *self, const char *name) {
  NamedSharding *s = (NamedSharding *)self;
  if (!strcmp(name, "mesh") && s->mesh) return val_incref(&s->mesh->hdr);
  if (!strcmp(name, "spec")) return val_incref(&s->spec->hdr);
  if (!strcmp(name, "is_fully_replicated")) return val_bool(!s->mesh || fully_replicated(s));
  if (!strcmp(name, "is_fully_addressable")) {
    bool all = true;
    for (int f = 0; f < sharding_ndev(s); f++) all &= transport_is_local(sharding_device(s, f));
    return val_bool(all);
  }
  if (!strcmp(name, "num_devices")) return val_int(sharding_ndev(s));
  if (!strcmp(name, "memory_kind")) return str_from("device");
  if (!strcmp(name, "device_set") || !strcmp(name, "addressable_devices")) {
    Value *l = list_new(0);
    bool local = name[0] == 'a';
    for (int f = 0; l && f < sharding_ndev(s); f++)
      if ((!local || transport_is_local(sharding_device(s, f))) &&
          list_append_steal(l, device_new(sharding_device(s, f))) < 0) {
        val_decref(l);
        return err_nomem();
      }
    return l;
  }
  if (!strcmp(name, "shard_shape")) return bound_new("shard_shape", m_shard_shape, self);
  if (!strcmp(name, "devices_indices_map"))
    return bound_new("devices_indices_map", m_devices_indices_map, self);
  if (!strcmp(name, "addressable_devices_indices_map"))
    return bound_new("addressable_devices_indices_map", m_addressable_map, self);
  if (!strcmp(name, "is_equivalent_to")) return bound_new("is_equivalent_to", m_is_equivalent_to, self);
  return err_set(ERR_ATTRIBUTE, "'%s' object has no attribute '%s'",
                 s->mesh ? "NamedSharding" : "SingleDeviceSharding", name);
}

/* == between two opaque values: shardings and devices by content, any
 * other by identity. */
static bool opaque_equal(Value *a, Value *b) {
  if (sharding_is(a) && sharding_is(b)) return sharding_equal((NamedSharding *)a, (NamedSharding *)b);
  if (device_id(a) >= 0) return device_id(a) == device_id(b);
  return a == b;
}

/* NamedSharding(mesh, spec): [spec] a P(...); the context mesh's
 * abstract form is not needed, a Mesh is. */
static Value *bi_named_sharding(const CallArgs *a) {
  Value *mesh, *spec, *mk = NULL;
  if (args_bind("NamedSharding", a, "mesh, spec, memory_kind=", (Value **[]){&mesh, &spec, &mk}) < 0)
    return NULL;
  if (mesh->type != V_MESH) return err_set(ERR_TYPE, "NamedSharding: mesh must be a Mesh, got %s", val_type_name(mesh));
  if (spec->type != V_PSPEC)
    return err_set(ERR_TYPE, "NamedSharding: spec must be a PartitionSpec, got %s", val_type_name(spec));
  Mesh *m = (Mesh *)mesh;
  if (pspec_check((PSpec *)spec, m, ((PSpec *)spec)->n, "NamedSharding's spec") < 0) return NULL;
  return sharding_new(m, (PSpec *)spec);
}

static Value *bi_single_device_sharding(const CallArgs *a) {
  Value *dev, *mk = NULL;
  if (args_bind("SingleDeviceSharding", a, "device, memory_kind=", (Value **[]){&dev, &mk}) < 0) return NULL;
  if (device_id(dev) < 0)
    return err_set(ERR_TYPE, "SingleDeviceSharding: expected a Device (jax.devices()[i]), got %s",
                   val_type_name(dev));
  return single_device(device_id(dev));
}

/* ==== sharded arrays ============================================================= */

Value *sharding_put(Value *x, const NamedSharding *s) {
  Value *arr = ops_to_array(x, -1);
  if (!arr) return NULL;
  Array *a = AS_ARRAY(arr);
  if (sharding_check(s, a->ndim, a->shape) < 0) {
    val_decref(arr);
    return NULL;
  }
  /* a buffer holding only this process's blocks of another layout (or of
   * a larger array) is made whole first: the view laid out as [s] would
   * have its devices read blocks this process does not hold */
  PartialBuf *part = a->buf->part;
  if (part) {
    bool same = part->ndim == a->ndim && a->offset == 0 &&
                sharding_equal((const NamedSharding *)part->sharding, s);
    int64_t k = 1;
    for (int d = a->ndim - 1; same && d >= 0; k *= a->shape[d--])
      same = part->shape[d] == a->shape[d] && (a->shape[d] == 1 || a->strides[d] == k);
    if (!same && arr_make_whole(a) < 0) {
      val_decref(arr);
      return NULL;
    }
  }
  Array *v = arr_view(a, a->ndim, a->shape, a->strides, a->offset);
  val_decref(arr);
  if (!v) return NULL;
  v->weak = false;   /* a committed array is strongly typed */
  v->sharding = s->mesh ? val_incref((Value *)&s->base.hdr) : NULL;
  v->device1 = s->mesh ? 0 : s->device + 1;
  return &v->hdr;
}

/* ==== process-local shards (array.h) ============================================ */

/* The smallest array, in elements, that holds only this process's blocks
 * under mpirun: SHMAP_PARTIAL_MIN, else 1, every array (LANGUAGE.md: a
 * process holds only its devices' blocks).  A larger value keeps smaller
 * arrays whole on every process: eager operations on them then run on
 * the host rather than through the devices, faster for tiny arrays, at
 * the memory the language promises not to spend. */
static int64_t partial_min(void) {
  static int64_t min = -1;
  if (min < 0) {
    const char *e = getenv("SHMAP_PARTIAL_MIN");
    min = e && *e ? strtoll(e, NULL, 10) : 1;
  }
  return min;
}

/* Whether some process of the job holds some of [s]'s [ncells] blocks
 * (grid [nblk]) and not all: the same answer on every process. */
static bool split_between_processes(const NamedSharding *s, int nd, const int64_t *shape,
                                    const int64_t *nblk, int64_t ncells) {
  int procs = transport_procs();
  int64_t *count = shm_calloc((size_t)procs, sizeof(int64_t));
  uint8_t *seen = count ? shm_calloc((size_t)procs * (size_t)ncells, 1) : NULL;
  bool split = false;
  if (!seen) {
    shm_free(count);
    return false;   /* the whole array then, everywhere: correct, only larger */
  }
  int64_t start[SHM_MAXDIM], size[SHM_MAXDIM];
  for (int f = 0; f < sharding_ndev(s); f++) {
    int p = transport_process_of(sharding_device(s, f));
    block_of(s, f, nd, shape, start, size);
    int64_t cell = 0;
    for (int d = 0; d < nd; d++) cell = cell * nblk[d] + start[d] / size[d];
    uint8_t *mark = &seen[(size_t)p * (size_t)ncells + (size_t)cell];
    count[p] += !*mark;
    *mark = 1;
  }
  for (int p = 0; p < procs && !split; p++) split = count[p] > 0 && count[p] < ncells;
  shm_free(seen);
  shm_free(count);
  return split;
}

/* sharding_local_blocks for arrays of [min] elements or more.  Whether an
 * array is held in part is the same on every process (each decides from
 * it whether an operation runs on the devices, which is collective): it
 * is when some process holds some of its blocks and not all, and then a
 * process whose devices hold none of them holds no block either. */
static bool local_blocks(const NamedSharding *s, int nd, const int64_t *shape, int64_t min,
                         int64_t *nblk, uint8_t **held) {
  int64_t total = 1, ncells = 1, start[SHM_MAXDIM], size[SHM_MAXDIM];
  for (int d = 0; d < nd; d++) total *= shape[d];
  if (!transport_active() || !s->mesh || total < min || total == 0) return false;
  block_of(s, 0, nd, shape, start, size);
  for (int d = 0; d < nd; d++) nblk[d] = shape[d] / size[d], ncells *= nblk[d];
  if (!split_between_processes(s, nd, shape, nblk, ncells)) return false;
  uint8_t *h = shm_calloc((size_t)ncells, 1);
  if (!h) return false;   /* the whole array then: correct, only larger */
  for (int f = 0; f < sharding_ndev(s); f++) {
    if (!transport_is_local(sharding_device(s, f))) continue;
    block_of(s, f, nd, shape, start, size);
    int64_t cell = 0;
    for (int d = 0; d < nd; d++) cell = cell * nblk[d] + start[d] / size[d];
    h[cell] = 1;
  }
  *held = h;
  return true;
}

bool sharding_local_blocks(const NamedSharding *s, int nd, const int64_t *shape, int64_t *nblk,
                           uint8_t **held) {
  return local_blocks(s, nd, shape, partial_min(), nblk, held);
}

bool sharding_is_local(const NamedSharding *s, int nd, const int64_t *shape) {
  int64_t nblk[SHM_MAXDIM];
  uint8_t *held;
  if (!sharding_local_blocks(s, nd, shape, nblk, &held)) return false;
  shm_free(held);
  return true;
}

/* arr_partial_runs's callback of put_local: copies a run of [ctx]'s
 * source into its destination. */
typedef struct RunCopy {
  char *dst;
  const char *src;
  size_t es;
} RunCopy;

static void copy_run(int64_t lo, int64_t hi, void *ctx) {
  RunCopy *c = ctx;
  memcpy(c->dst + (size_t)lo * c->es, c->src + (size_t)lo * c->es, (size_t)(hi - lo) * c->es);
}

/* device_put's layout of [x] by [s] (borrowed): sharding_put, except that
 * an array holding only this process's blocks (sharding_local_blocks) is
 * a copy of those.  New reference or NULL with the error set. */
static Value *put_local(Value *x, const NamedSharding *s) {
  Value *arr = ops_to_array(x, -1);
  if (!arr) return NULL;
  Array *a = AS_ARRAY(arr);
  int64_t nblk[SHM_MAXDIM];
  uint8_t *held = NULL;
  if (sharding_check(s, a->ndim, a->shape) < 0 ||
      !sharding_local_blocks(s, a->ndim, a->shape, nblk, &held)) {
    val_decref(arr);
    return err_kind() ? NULL : sharding_put(x, s);
  }
  Array *c = arr_contiguous(a), *g = c ? arr_new(a->dtype, a->ndim, a->shape) : NULL;
  val_decref(arr);
  if (g && arr_set_partial(g, (Value *)&s->base.hdr, nblk, held) < 0) {
    val_decref(&g->hdr);
    g = NULL;
  }
  shm_free(held);
  if (g) {
    RunCopy rc = {.dst = g->buf->data, .src = arr_data(c), .es = dt_size(a->dtype)};
    arr_partial_runs(g->buf->part, copy_run, &rc);
    g->sharding = val_incref((Value *)&s->base.hdr);
  }
  if (c) val_decref(&c->hdr);
  return g ? &g->hdr : NULL;
}

bool sharding_lays_out(const Value *sharding, const Mesh *m, const PSpec *spec) {
  if (!sharding || !sharding_is(sharding)) return false;
  const NamedSharding *s = (const NamedSharding *)sharding;
  NamedSharding t = {.mesh = (Mesh *)m, .spec = (PSpec *)spec, .device = -1};
  return s->mesh && sharding_equal(s, &t);
}

/* arr_materialize_hook: the whole of [a]'s buffer on every process, by
 * an identity shard_map over its sharding's mesh whose results every
 * process receives (xcall.h), then copied into the buffer. */
static Value *identity(const CallArgs *a) { return val_incref(a->args[0]); }

static int materialize(Array *view) {
  if (dev_ctx())
    return err_set(ERR_COLLECTIVE, "a shard_map body read a sharded array whose other blocks are "
                   "held by other processes: pass it as an argument, with its in_spec"), -1;
  Buffer *b = view->buf;
  PartialBuf *p = b->part;
  NamedSharding *s = (NamedSharding *)p->sharding;
  int64_t strides[SHM_MAXDIM], k = 1;
  for (int d = p->ndim - 1; d >= 0; d--) strides[d] = k, k *= p->shape[d];
  Array *g = arr_view(view, p->ndim, p->shape, strides, 0);   /* the global array */
  if (!g) return -1;
  g->dtype = p->dtype;
  g->weak = false;
  g->vma = 0;
  g->sharding = val_incref(p->sharding);
  Value *body = builtin_new("materialize", identity, "");
  Value *f = body ? shardmap_new("materialize", body, &s->mesh->hdr, &s->spec->hdr, &s->spec->hdr, false) : NULL;
  Value *arg = &g->hdr;
  CallArgs c = {.nargs = 1, .args = &arg};
  Value *r = f ? shardmap_run(f, &c) : NULL;
  Array *w = r ? arr_contiguous(AS_ARRAY(r)) : NULL;
  if (w) {
    /* the held blocks come back as they are: copied over themselves */
    memcpy(b->data, arr_data(w), b->nbytes);
    b->part = NULL;
    val_decref(p->sharding);
    shm_free(p->held);
    shm_free(p);
    atomic_fetch_sub_explicit(&arr_partial_live, 1, memory_order_relaxed);
    val_decref(&w->hdr);
  }
  if (r) val_decref(r);
  if (f) val_decref(f);
  if (body) val_decref(body);
  val_decref(&g->hdr);
  return w ? 0 : -1;
}

/* The sharding an argument of device_put names: a sharding, a Device, or
 * a PartitionSpec over the context mesh (jax.set_mesh).  New reference. */
static Value *as_sharding(Value *v) {
  if (sharding_is(v)) return val_incref(v);
  if (device_id(v) >= 0) return single_device(device_id(v));
  if (v == VAL_NONE) return single_device(0);
  if (v->type == V_PSPEC) {
    Mesh *m = mesh_context();
    if (!m)
      return err_set(ERR_VALUE, "device_put with a PartitionSpec needs a mesh: use "
                                "NamedSharding(mesh, spec) or `with jax.set_mesh(mesh):`");
    return sharding_new(m, (PSpec *)v);
  }
  return err_set(ERR_TYPE, "device_put: expected a Sharding, a Device or a PartitionSpec, got %s",
                 val_type_name(v));
}

static bool put_leaf(Value *v) { return !pytree_is_node(v) || sharding_is(v) || v->type == V_PSPEC; }

static Value *put_one(Value *leaf, void *ctx) {
  Value *s = as_sharding((Value *)ctx);
  Value *r = s ? put_local(leaf, (NamedSharding *)s) : NULL;
  if (s) val_decref(s);
  return r;
}

typedef Value *(*PutFn)(Value *leaf, void *sharding);

/* [one] (device_put's or with_sharding_constraint's) over a tree [x] with
 * one sharding, or a tuple, list or dict of them matching x's (a pytree
 * prefix). */
static Value *put_tree(Value *x, Value *dev, PutFn one) {
  size_t n, m;
  Value *const *xs, *const *ds;
  if (dev->type == V_DICT && x->type == V_DICT) {
    Value *r = dict_new();
    Dict *dx = (Dict *)x;
    for (size_t i = 0; r && i < dx->len; i++) {
      Value *d = dict_get(dev, dx->keys[i]);
      Value *v = d ? put_tree(dx->vals[i], d, one)
                   : err_set(ERR_VALUE, "device_put: the device tree has no entry for a key of x");
      int rc = v ? dict_set(r, dx->keys[i], v) : -1;
      if (v) val_decref(v);
      if (rc < 0) {
        val_decref(r);
        return NULL;
      }
    }
    return r;
  }
  if (put_leaf(dev) || !val_seq(x, &n, &xs) || !val_seq(dev, &m, &ds))
    return pytree_map(x, NULL, one, dev);
  if (n != m)
    return err_set(ERR_VALUE, "device_put: the device tree has %zu entries where x has %zu", m, n);
  bool list = x->type == V_LIST;
  Value *r = list ? list_new(n) : tuple_new_like(x, n);
  for (size_t i = 0; r && i < n; i++) {
    Value *v = put_tree(xs[i], ds[i], one);
    if (!v) {
      val_decref(r);
      return NULL;
    }
    if (!list) tuple_set_steal(r, i, v);
    else if (list_append_steal(r, v) < 0) {
      val_decref(r);
      return err_nomem();
    }
  }
  return r;
}

Value *sharding_device_put(Value *x, Value *device) { return put_tree(x, device, put_one); }

/* jax.device_put(x, device=None): x's arrays laid out by the sharding. */
static Value *bi_device_put(const CallArgs *a) {
  Value *x, *dev = NULL, *src = NULL, *donate = NULL, *alias = NULL;
  if (args_bind("device_put", a, "x, device=, src=, donate=, may_alias=",
                (Value **[]){&x, &dev, &src, &donate, &alias}) < 0)
    return NULL;
  return put_tree(x, dev ? dev : VAL_NONE, put_one);
}

/* An unsharded copy of a leaf: the global value. */
static Value *get_one(Value *leaf, void *ctx) {
  (void)ctx;
  if (!IS_ARRAY(leaf) || !AS_ARRAY(leaf)->sharding) return val_incref(leaf);
  Array *a = AS_ARRAY(leaf);
  /* the host copy is read as any array: whole on every process now (a
   * read of it later may touch a block held here and not elsewhere) */
  if (a->buf->part && arr_make_whole(a) < 0) return NULL;
  Array *v = arr_view(a, a->ndim, a->shape, a->strides, a->offset);
  return v ? &v->hdr : NULL;
}

/* jax.device_get(x): the global values, unsharded. */
static Value *bi_device_get(const CallArgs *a) {
  Value *x;
  if (args_bind("device_get", a, "x", (Value **[]){&x}) < 0) return NULL;
  return pytree_map(x, NULL, get_one, NULL);
}

/* jax.block_until_ready(x): x itself.  Every shmap computation has
 * finished when its call returns (eager and jit dispatch are synchronous),
 * so there is nothing to wait for; it exists so JAX's timing loops run as
 * written.  semantics: JAX's jax.block_until_ready over a pytree. */
static Value *bi_block_until_ready(const CallArgs *a) {
  Value *x;
  if (args_bind("block_until_ready", a, "x", (Value **[]){&x}) < 0) return NULL;
  return val_incref(x);
}

/* The element offset of flat (row-major) position [i] of a block of
 * [size] starting at [start] in an array of [strides] and [offset]. */
static int64_t elem_offset(int nd, const int64_t *start, const int64_t *size,
                           const int64_t *strides, int64_t offset, int64_t i) {
  for (int d = nd - 1; d >= 0; d--) {
    offset += (start[d] + i % size[d]) * strides[d];
    i /= size[d];
  }
  return offset;
}

/* Where an array's blocks come from: device [f]'s block of [size] at
 * [start] in an array of [nd] dimensions of [shape], as an array of dtype
 * [t] (-1: its own); NULL with the error set. */
typedef struct BlockSource {
  Value *(*block)(const struct BlockSource *src, int f, int t, int nd, const int64_t *shape,
                  const int64_t *start, const int64_t *size);
  const char *what;          /* the function, for messages */
  Value *callback;           /* make_array_from_callback's data_callback */
  Value *const *arrays;      /* make_array_from_single_device_arrays': one per held device */
  const int *array_of;       /* ...the array of each device of the sharding (-1: none) */
} BlockSource;

static bool shard_shaped(Value *arr, int nd, const int64_t *size) {
  return AS_ARRAY(arr)->ndim == nd &&
         !memcmp(AS_ARRAY(arr)->shape, size, sizeof(int64_t) * (size_t)nd);
}

/* make_array_from_callback's block: data_callback(index). */
static Value *callback_block(const BlockSource *src, int f, int t, int nd, const int64_t *shape,
                             const int64_t *start, const int64_t *size) {
  (void)f;
  Value *idx = block_index(nd, shape, start, size);
  Value *blk = idx ? val_call_n(src->callback, 1, &idx) : NULL;
  Value *arr = blk ? ops_to_array(blk, t) : NULL;
  if (idx) val_decref(idx);
  if (blk) val_decref(blk);
  return arr;
}

/* make_array_from_single_device_arrays' block: the array given for the
 * device (its dtype must be the first one's). */
static Value *given_block(const BlockSource *src, int f, int t, int nd, const int64_t *shape,
                          const int64_t *start, const int64_t *size) {
  (void)nd, (void)shape, (void)start, (void)size;
  if (src->array_of[f] < 0)
    return err_set(ERR_VALUE, "make_array_from_single_device_arrays: the sharding's device is "
                              "not addressable by this process");
  Value *a = src->arrays[src->array_of[f]];
  if (t >= 0 && (int)AS_ARRAY(a)->dtype != t)
    return err_set(ERR_VALUE, "make_array_from_single_device_arrays: the arrays must have one "
                              "dtype, got %s and %s", dt_name((DType)t),
                   dt_name(AS_ARRAY(a)->dtype));
  return val_incref(a);
}

/* Copies block [b] into [g] at [start]. */
static void put_block(Array *g, const Array *b, const int64_t *start) {
  int64_t zero[SHM_MAXDIM] = {0};
  size_t es = dt_size(g->dtype);
  for (int64_t i = 0; i < b->size; i++)
    memcpy((char *)g->buf->data + es * (size_t)elem_offset(g->ndim, start, b->shape, g->strides, 0, i),
           (const char *)b->buf->data +
               es * (size_t)elem_offset(b->ndim, zero, b->shape, b->strides, b->offset, i),
           es);
}

/* The array of [shape] laid out by [s] whose block on each device [src]
 * gives, of the first block's dtype.  Under mpirun [src] is asked only
 * for this process's devices' blocks, as JAX asks a process only for its
 * addressable ones (its data may be only those); an array too small to
 * be held in part (sharding_local_blocks) is then gathered whole on
 * every process.  New reference, or NULL with the error set. */
static Value *assemble(const BlockSource *src, NamedSharding *ns, int nd, const int64_t *shape) {
  int64_t start[SHM_MAXDIM], size[SHM_MAXDIM], nblk[SHM_MAXDIM];
  Array *g = NULL;
  Value *r = NULL;
  uint8_t *held = NULL;
  bool part = local_blocks(ns, nd, shape, 1, nblk, &held);   /* this process's devices only */
  /* a process with a device of the sharding is asked for its own blocks
   * only: every block when it holds all of them, as on one process */
  bool own_only = false;
  for (int f = 0; transport_active() && ns->mesh && f < sharding_ndev(ns); f++)
    own_only |= transport_is_local(sharding_device(ns, f));
  for (int f = 0; f < sharding_ndev(ns); f++) {
    if (own_only && !transport_is_local(sharding_device(ns, f))) continue;
    block_of(ns, f, nd, shape, start, size);
    Value *b = src->block(src, f, g ? (int)g->dtype : -1, nd, shape, start, size);
    if (b && !shard_shaped(b, nd, size)) {
      val_decref(b);
      b = err_set(ERR_VALUE, "%s: the block for device %d does not have the sharding's shard "
                             "shape", src->what, sharding_device(ns, f));
    }
    if (b && !g) {
      g = arr_new(AS_ARRAY(b)->dtype, nd, shape);
      /* the held blocks are known before any is written (arr_set_partial) */
      if (g && part && arr_set_partial(g, &ns->base.hdr, nblk, held) < 0) {
        val_decref(b);
        goto out;
      }
    }
    if (b && g) put_block(g, AS_ARRAY(b), start);
    if (b) val_decref(b);
    if (!b || !g) goto out;
  }
  if (!part) {
    r = sharding_put(&g->hdr, ns);
  } else if (sharding_is_local(ns, nd, shape) || materialize(g) == 0) {
    g->sharding = val_incref(&ns->base.hdr);
    r = val_incref(&g->hdr);
  }
out:
  shm_free(held);
  if (g) val_decref(&g->hdr);
  return r;
}

/* jax.make_array_from_callback(shape, sharding, data_callback): the
 * array whose block on each device is data_callback(index), of the first
 * block's dtype. */
static Value *bi_make_array_from_callback(const CallArgs *a) {
  Value *shape_v, *sv, *cb, *dt = NULL;
  if (args_bind("make_array_from_callback", a, "shape, sharding, data_callback, dtype=",
                (Value **[]){&shape_v, &sv, &cb, &dt}) < 0)
    return NULL;
  int nd;
  int64_t shape[SHM_MAXDIM];
  Value *s = read_shape(shape_v, &nd, shape) < 0 ? NULL : as_sharding(sv);
  if (!s) return NULL;
  BlockSource src = {.block = callback_block, .what = "make_array_from_callback", .callback = cb};
  Value *r = sharding_check((NamedSharding *)s, nd, shape) < 0
                 ? NULL
                 : assemble(&src, (NamedSharding *)s, nd, shape);
  val_decref(s);
  return r;
}

/* Which of [n] [arrays] each of [s]'s devices gets, into [of] (-1 for a
 * device of another process): each goes to the device it is on (put
 * there by device_put, a shard's data, or computed from those), any
 * other array is on device 0, as in JAX; every addressable device of
 * [s] must get one.  0, or -1 with the error set. */
static int match_arrays(const NamedSharding *s, Value *const *arrays, size_t n, int *of) {
  int nlocal = 0;
  for (int f = 0; f < sharding_ndev(s); f++) {
    of[f] = -1;
    nlocal += transport_is_local(sharding_device(s, f));
  }
  if ((int)n != nlocal)
    return err_set(ERR_VALUE, "make_array_from_single_device_arrays: got %zu arrays for %d "
                              "addressable devices of the sharding", n, nlocal), -1;
  for (size_t i = 0; i < n; i++) {
    if (!IS_ARRAY(arrays[i]))
      return err_set(ERR_TYPE, "make_array_from_single_device_arrays: arrays must be arrays, "
                               "got %s", val_type_name(arrays[i])), -1;
    const Array *x = AS_ARRAY(arrays[i]);
    if (x->sharding)
      return err_set(ERR_VALUE, "make_array_from_single_device_arrays: array %zu is sharded "
                                "over a mesh, not on one device", i), -1;
    int f = -1, dev = x->device1 - 1;
    if (dev >= 0) {   /* put on a device */
      for (int k = 0; k < sharding_ndev(s) && f < 0; k++)
        if (sharding_device(s, k) == dev) f = k;
      if (f < 0 || !transport_is_local(dev))
        return err_set(ERR_VALUE, "make_array_from_single_device_arrays: array %zu is on "
                                  "device %d, not an addressable device of the sharding",
                       i, dev), -1;
    } else {   /* on device 0, as in JAX */
      for (int k = 0; k < sharding_ndev(s) && f < 0; k++)
        if (sharding_device(s, k) == 0) f = k;
      if (f < 0)
        return err_set(ERR_VALUE, "make_array_from_single_device_arrays: array %zu is on "
                                  "device 0 (put each on its device with jax.device_put(x, "
                                  "device)), not a device of the sharding", i), -1;
    }
    if (f >= sharding_ndev(s) || of[f] >= 0)
      return err_set(ERR_VALUE, "make_array_from_single_device_arrays: two arrays for device "
                                "%d", f < sharding_ndev(s) ? sharding_device(s, f) : -1), -1;
    of[f] = (int)i;
  }
  return 0;
}

/* jax.make_array_from_single_device_arrays(shape, sharding, arrays): the
 * array whose block on each addressable device of the sharding is the
 * array given for it, one per device, each of the shard shape (a device's
 * block of a replicated layout is the last given for it). */
static Value *bi_make_array_from_single_device_arrays(const CallArgs *a) {
  Value *shape_v, *sv, *arrs, *dt = NULL;
  if (args_bind("make_array_from_single_device_arrays", a, "shape, sharding, arrays, dtype=",
                (Value **[]){&shape_v, &sv, &arrs, &dt}) < 0)
    return NULL;
  int nd;
  int64_t shape[SHM_MAXDIM];
  size_t n;
  Value *const *items;
  if (!val_seq(arrs, &n, &items))
    return err_set(ERR_TYPE, "make_array_from_single_device_arrays: arrays must be a list of "
                             "arrays, got %s", val_type_name(arrs));
  Value *s = read_shape(shape_v, &nd, shape) < 0 ? NULL : as_sharding(sv);
  if (!s) return NULL;
  NamedSharding *ns = (NamedSharding *)s;
  int *of = shm_malloc(sizeof(int) * (size_t)sharding_ndev(ns));
  Value *r = NULL;
  if (!of) {
    err_nomem();
  } else if (sharding_check(ns, nd, shape) == 0 && match_arrays(ns, items, n, of) == 0) {
    BlockSource src = {.block = given_block,
                       .what = "make_array_from_single_device_arrays",
                       .arrays = items,
                       .array_of = of};
    r = assemble(&src, ns, nd, shape);
  }
  shm_free(of);
  val_decref(s);
  return r;
}

/* ==== jax.lax.with_sharding_constraint: the sharding_constraint row ============ */

/* Under a trace: [leaf] bound to sharding_constraint[sharding]. */
static Value *constrain_one(Value *leaf, void *ctx) {
  Value *s = as_sharding((Value *)ctx), *r = NULL;
  if (!s) return NULL;
  AVal av;
  if (prim_value_aval(leaf, &av) == 0 && sharding_check((NamedSharding *)s, av.ndim, av.shape) == 0) {
    Params q;
    params_init(&q);
    params_add(&q, "sharding", s);
    r = prim_bind(P_SHARDING_CONSTRAINT, 1, &leaf, &q);
    params_clear(&q);
  } else {
    val_decref(s);
  }
  return r;
}

/* Inside a partial-manual shard_map's body (axis_names=), where only
 * the automatic axes may be constrained: 0, or -1 + ERR_VALUE in JAX's
 * words when [ctx]'s layout names one of the body's manual axes (the
 * body is partitioned within each manual group; a split across the
 * groups has no meaning there). */
static int constraint_manual_check(void *ctx) {
  DevCtx *dc = dev_ctx();
  if (!dc || !dc->mesh || !dc->mesh->auto_axes) return 0;
  Value *sv = as_sharding((Value *)ctx);
  if (!sv) return -1;
  const NamedSharding *ns = (const NamedSharding *)sv;
  const MeshDesc *md = dc->mesh;
  bool bad = false;
  for (int d = 0; ns->spec && d < ns->spec->n; d++)
    for (int k = 0; k < ns->spec->e[d].nnames; k++)
      for (int a = 0; a < md->naxes; a++)
        if (!(md->auto_axes >> a & 1) && !strcmp(md->names[a], ns->spec->e[d].names[k])) bad = true;
  if (bad) {
    char sp[256], manual[256];
    size_t len = 0;
    int n = 0;
    pspec_str(ns->spec, sp, sizeof sp);
    manual[0] = '\0';
    for (int a = 0; a < md->naxes && len < sizeof manual; a++)
      if (!(md->auto_axes >> a & 1))
        n++, len += (size_t)snprintf(manual + len, sizeof manual - len, "%s'%s'", len ? ", " : "",
                                     md->names[a]);
    err_set(ERR_VALUE, "pspec %s contains a manual axes (%s%s) of mesh which is not allowed. If "
            "you are using a with_sharding_constraint under a shard_map, only use the mesh axis "
            "in PartitionSpec which are not manual.", sp, manual, n == 1 ? "," : "");
  }
  val_decref(sv);
  return bad ? -1 : 0;
}

/* A leaf of with_sharding_constraint: a concrete array laid out at once
 * (a device_put), a traced one (jit, grad, vmap) bound. */
static Value *constraint_leaf(Value *leaf, void *ctx) {
  if (constraint_manual_check(ctx) < 0) return NULL;
  return IS_ARRAY(leaf) && !prim_tracing() ? put_one(leaf, ctx) : constrain_one(leaf, ctx);
}

/* jax.lax.with_sharding_constraint(x, shardings): eagerly, x laid out so
 * (a device_put); traced, a sharding_constraint equation, which the
 * partitioner honours strictly (shmap(7), THE THREE MODES). */
static Value *bi_with_sharding_constraint(const CallArgs *a) {
  Value *x, *sh;
  if (args_bind("with_sharding_constraint", a, "x, shardings", (Value **[]){&x, &sh}) < 0) return NULL;
  return put_tree(x, sh, constraint_leaf);
}

/* jax.sharding.reshard(x, out_shardings): the same strict constraint,
 * Explicit mode's spelling. */
static Value *bi_reshard(const CallArgs *a) {
  Value *x, *sh;
  if (args_bind("reshard", a, "x, out_shardings", (Value **[]){&x, &sh}) < 0) return NULL;
  return put_tree(x, sh, constraint_leaf);
}

/* out_sharding= of the language's constructors and contractions
 * (builtins_out_sharding_hook). */
static Value *out_sharding(Value *x, Value *sh) { return put_tree(x, sh, constraint_leaf); }

/* The bits of mesh axes [axes] (None: all; a name or a sequence of
 * names) of the context mesh; -1 with the error set for a name it lacks. */
static int64_t axes_bits(Value *axes) {
  Mesh *m = mesh_context();
  if (!axes || axes == VAL_NONE || !m) return (int64_t)UINT32_MAX;
  size_t n = 1;
  Value *const *names = &axes;
  if (axes->type != V_STR && !val_seq(axes, &n, &names)) {
    err_set(ERR_TYPE, "auto_axes: axes= must be a mesh axis name or a sequence of them");
    return -1;
  }
  int64_t bits = 0;
  for (size_t i = 0; i < n; i++) {
    int a = names[i]->type == V_STR ? mesh_axis(m, intern_cstr(str_cstr(names[i]))) : -1;
    if (a < 0) {
      err_set(ERR_VALUE, "auto_axes: axes= names an axis the current mesh does not have");
      return -1;
    }
    bits |= (int64_t)1 << a;
  }
  return bits;
}

/* The call's keyword [name] (NULL: absent), and [c] the call without it
 * ([kn], [kv] its room, a->nkw entries). */
static Value *take_kw(const CallArgs *a, const char *name, CallArgs *c, const char **kn, Value **kv) {
  Value *got = NULL;
  *c = *a;
  c->nkw = 0;
  c->kwnames = kn;
  c->kwvals = kv;
  for (int k = 0; k < a->nkw; k++) {
    if (!strcmp(a->kwnames[k], name)) got = a->kwvals[k];
    else kn[c->nkw] = a->kwnames[k], kv[c->nkw++] = a->kwvals[k];
  }
  return got;
}

/* auto_axes(f, axes=, out_sharding=)'s function: f on the arguments
 * with [axes] Auto while it runs (Explicit mode's errors do not apply
 * there, eagerly or staged), its results laid out by out_sharding (the
 * wrapper's, or the call's keyword as JAX's takes it).  self: (f,
 * out_sharding, axes). */
static Value *auto_axes_call(Value *self, const CallArgs *a) {
  enum { MAXKW = 32 };
  const char *kn[MAXKW];
  Value *kv[MAXKW];
  CallArgs c;
  if (a->nkw > MAXKW) return err_set(ERR_TYPE, "auto_axes: too many keyword arguments");
  Value *given = take_kw(a, "out_sharding", &c, kn, kv), *sh = given ? given : tuple_get(self, 1);
  int64_t bits = axes_bits(tuple_get(self, 2));
  if (bits < 0) return NULL;
  uint32_t was = auto_now;
  auto_now |= (uint32_t)bits;
  Value *r = val_call(tuple_get(self, 0), &c);
  auto_now = was;
  if (!r || sh == VAL_NONE) return r;
  Value *o = put_tree(r, sh, constraint_leaf);
  val_decref(r);
  return o;
}

/* explicit_axes(f, axes=, in_sharding=)'s function: the positional
 * arguments laid out by in_sharding (the wrapper's, or the call's
 * keyword as JAX's takes it; one for all, or a tuple of one each), then
 * f.  self: (f, in_sharding, axes). */
static Value *explicit_axes_call(Value *self, const CallArgs *whole) {
  enum { MAXKW = 32 };
  const char *kn[MAXKW];
  Value *kv[MAXKW];
  CallArgs call;
  const CallArgs *a = &call;
  if (whole->nkw > MAXKW) return err_set(ERR_TYPE, "explicit_axes: too many keyword arguments");
  Value *given = take_kw(whole, "in_sharding", &call, kn, kv), *sh = given ? given : tuple_get(self, 1);
  if (sh == VAL_NONE) return val_call(tuple_get(self, 0), a);
  Value *args = tuple_pack((size_t)a->nargs, a->args), *put = NULL, *r = NULL;
  size_t n;
  Value *const *items;
  bool each = !sharding_is(sh) && sh->type != V_PSPEC && val_seq(sh, &n, &items);
  if (args && each && n != (size_t)a->nargs)
    err_set(ERR_VALUE, "explicit_axes: in_sharding has %zu entries for %d arguments", n, a->nargs);
  else if (args)
    put = each ? put_tree(args, sh, constraint_leaf) : pytree_map(args, NULL, constraint_leaf, sh);
  if (put) {
    CallArgs c = {a->nargs, ((Tuple *)put)->items, a->nkw, a->kwnames, a->kwvals};
    r = val_call(tuple_get(self, 0), &c);
  }
  if (args) val_decref(args);
  if (put) val_decref(put);
  return r;
}

/* jax.sharding.auto_axes(f, axes=None, out_sharding=None) and
 * explicit_axes(f, axes=None, in_sharding=None): Explicit axes behave as
 * Auto ones here, so each is f with its results (arguments) laid out as
 * given; [axes] names the axes JAX switches, accepted as it is. */
static Value *axes_wrapper(const CallArgs *a, const char *name, const char *spec, MethodFn call) {
  Value *f, *axes = NULL, *sh = NULL;
  if (args_bind(name, a, spec, (Value **[]){&f, &axes, &sh}) < 0) return NULL;
  Value *self = tuple_pack(3, (Value *[]){f, sh ? sh : VAL_NONE, axes ? axes : VAL_NONE});
  Value *r = self ? bound_new(name, call, self) : NULL;
  if (self) val_decref(self);
  return r;
}

static Value *bi_auto_axes(const CallArgs *a) {
  return axes_wrapper(a, "auto_axes", "fun, axes=, out_sharding=", auto_axes_call);
}

static Value *bi_explicit_axes(const CallArgs *a) {
  return axes_wrapper(a, "explicit_axes", "fun, axes=, in_sharding=", explicit_axes_call);
}

static int shape_constraint(const AVal *in, int nin, const Params *p, AVal *out) {
  (void)nin, (void)p;
  aval_copy(out, &in[0]);
  return 0;
}

/* The value as it is: a view eagerly (a layout primitive makes its
 * result), a copy into a compiled plan's slot.  The layout is the
 * partitioner's business. */
static int kern_constraint(Array **in, int nin, const Params *p, Array **out) {
  (void)nin, (void)p;
  Array *x = in[0];
  if (out[0]) {
    kern_copy_to_contiguous(arr_data(out[0]), x);
    return 0;
  }
  out[0] = arr_view(x, x->ndim, x->shape, x->strides, x->offset);
  return out[0] ? 0 : -1;
}

/* [x] constrained as [p] says (operands held, prim_apply_rule); NULL x:
 * NULL.  A concrete [x] outside a trace (an eager grad's tangent or
 * cotangent) is laid out at once, as with_sharding_constraint lays out
 * a concrete value: JAX binds the primitive there, which its eager
 * dispatch runs as a jit giving that layout. */
static Value *constrained(Value *x, const Params *p) {
  if (!x) return NULL;
  if (IS_ARRAY(x) && !prim_tracing()) return put_one(x, params_get(p, "sharding"));
  Params q;
  params_init(&q);
  params_add(&q, "sharding", val_incref(params_get(p, "sharding")));
  return prim_apply_rule(P_SHARDING_CONSTRAINT, 1, &x, &q);
}

/* The NamedSharding (new reference) of [x] (an array or a traced value)
 * over a mesh with Explicit axes, else NULL: its type's layout. */
static Value *operand_explicit_type(Value *x) {
  Value *s = IS_ARRAY(x) ? (AS_ARRAY(x)->sharding ? val_incref(AS_ARRAY(x)->sharding) : NULL)
             : shardmap_typeof_sharding_hook ? shardmap_typeof_sharding_hook(x) : NULL;
  bool expl = false;
  const Mesh *m = s && sharding_is(s) ? ((NamedSharding *)s)->mesh : NULL;
  for (int a = 0; m && a < m->naxes; a++) expl |= m->axis_types[a] == MESH_EXPLICIT;
  if (!expl && s) val_decref(s);
  if (!expl && err_occurred()) err_clear();
  return expl ? s : NULL;
}

/* Linear: the tangent laid out as the value is; the cotangent as the
 * constraint says, or over Explicit axes (a reshard) as the operand's
 * type (replicated for an operand without a layout), which the tangent's
 * equation then carries as src_sharding (JAX's reshard transposes to the
 * operand's cotangent type). */
static int jvp_constraint(Value **x, Value **t, int nin, const Params *p, Value **y, Value **ty) {
  (void)nin;
  *y = constrained(x[0], p);
  *ty = NULL;
  if (!*y || !t[0]) return *y ? 0 : -1;
  bool concrete = IS_ARRAY(t[0]) && !prim_tracing();
  NamedSharding *dst = (NamedSharding *)params_get(p, "sharding");
  bool expl = false;
  for (int a = 0; dst->mesh && a < dst->mesh->naxes; a++) expl |= dst->mesh->axis_types[a] == MESH_EXPLICIT;
  Value *src = !expl || params_get(p, "src_sharding") || concrete ? NULL : operand_explicit_type(x[0]);
  if (expl && !src && !concrete && !params_get(p, "src_sharding")) {
    /* an operand without a layout: replicated over the reshard's mesh */
    Value *none = pspec_from_args(0, NULL);
    src = none ? sharding_new(dst->mesh, (PSpec *)none) : NULL;
    if (none) val_decref(none);
    if (!src) return -1;
  }
  if (!src) {
    *ty = constrained(t[0], p);
  } else {
    Params q;
    params_init(&q);
    params_add(&q, "sharding", val_incref(params_get(p, "sharding")));
    params_add(&q, "src_sharding", src);
    *ty = prim_apply_rule(P_SHARDING_CONSTRAINT, 1, &t[0], &q);
  }
  return *ty ? 0 : -1;
}

static int tr_constraint(Value **ct, Value **in, const AVal *av, const bool *lin, int nin,
                         const Params *p, Value **ct_in) {
  (void)in, (void)av, (void)lin, (void)nin;
  Value *src = params_get(p, "src_sharding");
  if (!ct[0] || !src) {
    ct_in[0] = ct[0] ? constrained(ct[0], p) : NULL;
  } else {
    Params q;
    params_init(&q);
    params_add(&q, "sharding", val_incref(src));
    ct_in[0] = constrained(ct[0], &q);
    params_clear(&q);
  }
  return !ct[0] || ct_in[0] ? 0 : -1;
}

/* vmap: the batch dimension moved first and left unsplit. */
static int b_constraint(Value **in, const int *dims, int nin, const Params *p, Value **out, int *od) {
  (void)nin;
  NamedSharding *s = (NamedSharding *)params_get(p, "sharding");
  Value *x = dims[0] >= 0 ? prim_batch_moveaxis(in[0], dims[0], 0) : val_incref(in[0]);
  Value *spec = x && dims[0] >= 0 && s->mesh ? pspec_prepend_none(s->spec) : NULL;
  Params q;
  params_init(&q);
  params_add(&q, "sharding", spec ? sharding_new(s->mesh, (PSpec *)spec) : val_incref(&s->base.hdr));
  *out = x ? prim_apply_rule(P_SHARDING_CONSTRAINT, 1, &x, &q) : (params_clear(&q), NULL);
  if (spec) val_decref(spec);
  if (x) val_decref(x);
  *od = dims[0] >= 0 ? 0 : -1;
  return *out ? 0 : -1;
}

/* The operand and the result laid out as the constraint says: the
 * partitioner reshards the operand to it (shmap(7)). */
static int sh_constraint(const AVal *in, Sharding *in_sh, int nin, const Params *p, Sharding *out_sh) {
  (void)nin;
  NamedSharding *s = (NamedSharding *)params_get(p, "sharding");
  Sharding w = in_sh[0];
  if (s->mesh) {
    bool same = s->mesh->naxes == in_sh[0].naxes;
    for (int i = 0; same && i < s->mesh->naxes; i++) same = s->mesh->axis_sizes[i] == in_sh[0].axis_sizes[i];
    if (!same)
      return err_set(ERR_VALUE, "with_sharding_constraint: its mesh is not the mesh the "
                     "computation is partitioned over"), -1;
    sharding_to_rule(s, in[0].ndim, &w);
  } else {
    for (int d = 0; d < in[0].ndim; d++) w.nsplit[d] = 0;
  }
  w.partial = 0;
  w.partial_coll = NULL;
  in_sh[0] = w;
  *out_sh = w;
  return 0;
}

static const PrimRow constraint_rows[] = {
    {P_SHARDING_CONSTRAINT, {.shape = shape_constraint, .kernel = kern_constraint, .batch = b_constraint,
                             .jvp = jvp_constraint, .transpose = tr_constraint, .sharding = sh_constraint}},
};

/* ==== a sharded array's attributes ================================================ */

/* A jax Shard: device, index, data (the device's block, a view). */
typedef struct Shard {
  Opaque base;
  int device, replica;
  Value *index, *data;   /* owned */
} Shard;

static void shard_free(Value *v) {
  Shard *s = (Shard *)v;
  if (s->index) val_decref(s->index);
  if (s->data) val_decref(s->data);
}

static Value *shard_repr(Value *self) {
  Shard *s = (Shard *)self;
  char buf[512];
  Value *ix = val_repr(s->index);
  if (!ix) return NULL;
  snprintf(buf, sizeof buf, "Shard(device=CpuDevice(id=%d), index=%s, replica_id=%d, data=...)",
           s->device, str_cstr(ix), s->replica);
  val_decref(ix);
  return str_from(buf);
}

static Value *shard_getattr(Value *self, const char *name) {
  Shard *s = (Shard *)self;
  if (!strcmp(name, "device")) return device_new(s->device);
  if (!strcmp(name, "index")) return val_incref(s->index);
  if (!strcmp(name, "data")) return val_incref(s->data);
  if (!strcmp(name, "replica_id")) return val_int(s->replica);
  return err_set(ERR_ATTRIBUTE, "'Shard' object has no attribute '%s'", name);
}

static const OpaqueType shard_type = {"Shard", shard_free, shard_repr, shard_getattr, NULL, NULL, NULL};

/* Which copy of its block device [f] holds: its position among the
 * devices holding the same block, in mesh order. */
static int replica_of(const NamedSharding *s, int f, int nd, const int64_t *shape) {
  int64_t st[SHM_MAXDIM], sz[SHM_MAXDIM], st2[SHM_MAXDIM], sz2[SHM_MAXDIM];
  block_of(s, f, nd, shape, st, sz);
  int r = 0;
  for (int g = 0; g < f; g++) {
    block_of(s, g, nd, shape, st2, sz2);
    r += !memcmp(st, st2, sizeof(int64_t) * (size_t)nd);
  }
  return r;
}

static Value *shard_new(Array *a, const NamedSharding *s, int f) {
  int nd = a->ndim;
  int64_t start[SHM_MAXDIM], size[SHM_MAXDIM];
  block_of(s, f, nd, a->shape, start, size);
  Shard *sh = shm_calloc(1, sizeof *sh);
  if (!sh) return err_nomem();
  val_init(&sh->base.hdr, V_OPAQUE);
  sh->base.ot = &shard_type;
  sh->device = sharding_device(s, f);
  sh->replica = replica_of(s, f, nd, a->shape);
  int64_t off = a->offset;
  for (int d = 0; d < nd; d++) off += start[d] * a->strides[d];
  sh->index = block_index(nd, a->shape, start, size);
  sh->data = (Value *)arr_view(a, nd, size, a->strides, off);
  if (!sh->index || !sh->data) {
    val_decref(&sh->base.hdr);
    return NULL;
  }
  AS_ARRAY(sh->data)->device1 = sh->device + 1;   /* the block on its device */
  return &sh->base.hdr;
}

/* The sharding of array [a]: its own, or the device's it was put on, or
 * (uncommitted) the default device, this process's first as in JAX
 * (device 0 on one process), so that it is addressable here. */
static Value *array_sharding(Array *a) {
  if (a->sharding) return val_incref(a->sharding);
  int first = 0;
  if (!a->device1) local_range(&first);
  return single_device(a->device1 ? a->device1 - 1 : first);
}

static Value *addressable_shards(Array *a) {
  Value *s = array_sharding(a);
  Value *l = s ? list_new(0) : NULL;
  NamedSharding *ns = (NamedSharding *)s;
  for (int f = 0; l && f < sharding_ndev(ns); f++) {
    if (!transport_is_local(sharding_device(ns, f))) continue;
    if (list_append_steal(l, shard_new(a, ns, f)) < 0) {
      val_decref(l);
      l = NULL;
    }
  }
  if (s) val_decref(s);
  return l;
}

/* x.addressable_data(index): the data of x.addressable_shards[index]
 * (an IndexError past them, as a list's). */
static Value *m_addressable_data(Value *self, const CallArgs *a) {
  Value *iv;
  int64_t i;
  if (args_bind("addressable_data", a, "index", (Value **[]){&iv}) < 0 ||
      arr_to_index(iv, &i) < 0)
    return NULL;
  Value *l = addressable_shards(AS_ARRAY(self)), *r = NULL;
  if (!l) return NULL;
  int64_t n = (int64_t)list_len(l);
  if (i < -n || i >= n)
    err_set(ERR_INDEX, "addressable_data: index %lld out of range for %lld addressable shards",
            (long long)i, (long long)n);
  else
    r = val_incref(((Shard *)list_get(l, (size_t)(i < 0 ? i + n : i)))->data);
  val_decref(l);
  return r;
}

/* ops_array_attr_hook: sharding, addressable_shards, addressable_data,
 * is_fully_addressable, is_fully_replicated; NULL with no error for any
 * other name. */
static Value *array_attr(Value *x, const char *name) {
  if (!IS_ARRAY(x)) return NULL;
  Array *a = AS_ARRAY(x);
  if (!strcmp(name, "sharding")) return array_sharding(a);
  if (!strcmp(name, "addressable_shards")) return addressable_shards(a);
  if (!strcmp(name, "addressable_data")) return bound_new("addressable_data", m_addressable_data, x);
  if (!strcmp(name, "is_fully_addressable") || !strcmp(name, "is_fully_replicated")) {
    Value *s = array_sharding(a);
    Value *r = s ? sharding_getattr(s, name) : NULL;
    if (s) val_decref(s);
    return r;
  }
  return NULL;
}

/* ==== eager results: prim_sharding_hook ============================================== */

enum { EAGER_MAX_OPS = 16 };

const NamedSharding *sharding_operands_ref(Array *const *in, int nin) {
  const NamedSharding *ref = NULL;
  for (int i = 0; i < nin; i++) {
    const NamedSharding *s = (const NamedSharding *)in[i]->sharding;
    if (!s || !s->mesh) continue;
    if (!fully_replicated(s)) return s;
    if (!ref) ref = s;
  }
  return ref;
}

/* The sharding of operand [a] over [ref]'s mesh, for the rules. */
static int operand_rule(const Array *a, const NamedSharding *ref, Sharding *out) {
  const NamedSharding *s = a->sharding ? (const NamedSharding *)a->sharding : NULL;
  if (s && s->mesh && !mesh_same(s->mesh, ref->mesh) && sharding_unsharded_over(s, ref->mesh))
    s = NULL;
  if (s && s->mesh && !mesh_same(s->mesh, ref->mesh)) {
    err_set(ERR_VALUE, "received incompatible devices for jitted computation: operands are "
            "sharded over different meshes");
    return -1;
  }
  sharding_to_rule(s && s->mesh ? s : ref, a->ndim, out);
  if (!s || !s->mesh) memset(out->nsplit, 0, sizeof out->nsplit);
  return 0;
}

static int eager_sharding(PrimId id, Array *const *in, int nin, const Params *p, const AVal *outv,
                          int nout, Value **out) {
  const NamedSharding *ref = sharding_operands_ref(in, nin);
  if (!ref) return 0;
  Sharding sh[EAGER_MAX_OPS], osh[PRIM_MAX_OUTS];
  AVal av[EAGER_MAX_OPS];
  bool ruled = nout >= 1 && nout <= PRIM_MAX_OUTS && nin <= EAGER_MAX_OPS;
  for (int i = 0; ruled && i < nin; i++) {
    aval_of(in[i], &av[i]);
    if (operand_rule(in[i], ref, &sh[i]) < 0) return -1;
  }
  if (ruled) {
    /* jit's decision (partition.h): the same layouts eagerly and staged */
    Params local;
    bool has_local;
    params_init(&local);
    for (int k = 0; k < nout; k++) sharding_to_rule(ref, outv[k].ndim, &osh[k]);
    if (prim_sharding(id, av, sh, nin, p, outv, nout, osh, &local, &has_local) < 0) return -1;
    if (has_local) params_clear(&local);
    const Array *user = NULL;   /* the first operand with a NamedSharding */
    for (int i = 0; !user && i < nin; i++)
      if (in[i]->sharding && ((const NamedSharding *)in[i]->sharding)->mesh) user = in[i];
    for (int k = 0; k < nout; k++) {
      osh[k].ndim = outv[k].ndim;
      out[k] = sharding_from_rule(ref->mesh, &osh[k]);
      if (out[k] && user) out[k] = sharding_as_users(out[k], outv[k].ndim, user->sharding, user->ndim);
      if (!out[k]) return -1;
    }
    return 0;
  }
  for (int k = 0; k < nout; k++) {
    sharding_to_rule(ref, outv[k].ndim, &osh[0]);
    memset(osh[0].nsplit, 0, sizeof osh[0].nsplit);
    osh[0].ndim = outv[k].ndim;
    if (!(out[k] = sharding_from_rule(ref->mesh, &osh[0]))) return -1;
  }
  return 0;
}

/* ==== jax.debug.visualize_array_sharding ============================================ */

/* Draws one row of cells: [top] the rule above it ("┌┬┐" or "├┼┤"). */
static void draw_rule(const char *l, const char *m, const char *r, int ncols, int width) {
  for (int c = 0; c < ncols; c++) {
    eval_write(c ? m : l, strlen(l));
    for (int i = 0; i < width; i++) eval_write("─", strlen("─"));
  }
  eval_write(r, strlen(r));
  eval_write("\n", 1);
}

static void draw_cells(char (*labels)[128], int ncols, int width) {
  for (int line = 0; line < 3; line++) {
    for (int c = 0; c < ncols; c++) {
      const char *t = line == 1 ? labels[c] : "";
      int len = (int)strlen(t), left = (width - len) / 2;
      char buf[256];
      snprintf(buf, sizeof buf, "%*s%s%*s", left, "", t, width - len - left, "");
      eval_write("│", strlen("│"));
      eval_write(buf, strlen(buf));
    }
    eval_write("│\n", strlen("│\n"));
  }
}

/* The label of block ([r], [c]): "CPU " and the devices holding it. */
static void block_label(const NamedSharding *s, const Array *a, int r, int c, int nr, int nc,
                        char *buf, size_t cap) {
  size_t len = (size_t)snprintf(buf, cap, "CPU ");
  bool first = true;
  int64_t st[SHM_MAXDIM], sz[SHM_MAXDIM];
  for (int f = 0; f < sharding_ndev(s) && len < cap; f++) {
    block_of(s, f, a->ndim, a->shape, st, sz);
    int br = a->ndim == 2 ? (int)(st[0] / (a->shape[0] / nr)) : 0;
    int bc = (int)(st[a->ndim - 1] / (a->shape[a->ndim - 1] / nc));
    if (br != r || bc != c) continue;
    len += (size_t)snprintf(buf + len, cap - len, "%s%d", first ? "" : ",", sharding_device(s, f));
    first = false;
  }
}

/* visualize_array_sharding(arr): the blocks of a 1-D or 2-D array as a
 * grid of boxes, each naming the devices holding it (JAX's drawing, at
 * a fixed cell size). */
static Value *bi_visualize(const CallArgs *a) {
  Value *x, *uc = NULL, *mw = NULL, *cs = NULL;
  if (args_bind("visualize_array_sharding", a, "arr, use_color=, scale=, min_width=",
                (Value **[]){&x, &uc, &cs, &mw}) < 0)
    return NULL;
  if (!IS_ARRAY(x)) return err_set(ERR_TYPE, "visualize_array_sharding: expected an array");
  Array *arr = AS_ARRAY(x);
  if (arr->ndim < 1 || arr->ndim > 2)
    return err_set(ERR_VALUE, "visualize_array_sharding can only visualize one- or two-dimensional "
                              "arrays, got an array of rank %d", arr->ndim);
  Value *sv = array_sharding(arr);
  if (!sv) return NULL;
  NamedSharding *s = (NamedSharding *)sv;
  int nr = arr->ndim == 2 && s->mesh ? pspec_entry_size(s->spec, s->mesh, 0) : 1;
  int nc = s->mesh ? pspec_entry_size(s->spec, s->mesh, arr->ndim - 1) : 1;
  if (nr > 64 || nc > 16) {
    val_decref(sv);
    return err_set(ERR_VALUE, "visualize_array_sharding: too many blocks to draw");
  }
  static _Thread_local char labels[64][16][128];
  int width = 7;
  for (int r = 0; r < nr; r++)
    for (int c = 0; c < nc; c++) {
      block_label(s, arr, r, c, nr, nc, labels[r][c], sizeof labels[r][c]);
      int w = (int)strlen(labels[r][c]) + 4;
      width = w > width ? w : width;
    }
  for (int r = 0; r < nr; r++) {
    draw_rule(r ? "├" : "┌", r ? "┼" : "┬", r ? "┤" : "┐", nc, width);
    draw_cells(labels[r], nc, width);
  }
  draw_rule("└", "┴", "┘", nc, width);
  val_decref(sv);
  return val_incref(VAL_NONE);
}

/* ==== jax.experimental.mesh_utils ================================================== */

/* create_device_mesh(mesh_shape, devices=None): the devices (ids) in a
 * row-major array of that shape; on CPU threads no placement is better
 * than another, so it is the first devices in order. */
static Value *bi_create_device_mesh(const CallArgs *a) {
  Value *shape_v, *devs = NULL, *ci = NULL, *asr = NULL;
  if (args_bind("create_device_mesh", a, "mesh_shape, devices=, contiguous_submeshes=, allow_split_physical_axes=",
                (Value **[]){&shape_v, &devs, &ci, &asr}) < 0)
    return NULL;
  int nd;
  int64_t shape[SHM_MAXDIM], n = 1;
  if (read_shape(shape_v, &nd, shape) < 0) return NULL;
  for (int d = 0; d < nd; d++) n *= shape[d];
  Value *ids = devs && devs != VAL_NONE ? ops_to_array(devs, DT_I32) : NULL;
  if (devs && devs != VAL_NONE && !ids) return NULL;
  int64_t have = ids ? AS_ARRAY(ids)->size : shm_interp->ndevices;
  Array *r = n == have ? arr_new(DT_I32, nd, shape) : NULL;
  for (int64_t i = 0; r && i < n; i++)
    ((int32_t *)arr_data(r))[i] = ids ? (int32_t)arr_get_i64(AS_ARRAY(ids), i) : (int32_t)i;
  if (ids) val_decref(ids);
  if (n != have)
    return err_set(ERR_VALUE, "create_device_mesh: a mesh of %lld devices from %lld devices",
                   (long long)n, (long long)have);
  return r ? &r->hdr : NULL;
}

/* A namespace module [name] made here, an attribute [attr] of [parent]'s
 * and importable by its dotted name. */
static Value *add_module(const char *name, const char *parent, const char *attr) {
  Value *d = dict_new(), *m = d ? module_new(name, d) : NULL;
  int rc = m && builtins_add_to(parent, attr, m) == 0 &&
                   dict_set_str(shm_interp->modules, name, m) == 0 ? 0 : -1;
  if (d) val_decref(d);
  if (rc < 0 && m) val_decref(m);
  return rc < 0 ? NULL : m;
}

/* ==== registration ================================================================= */

static int add_to(const char *ns, const char *name, BuiltinFn fn, const char *doc) {
  Value *v = builtin_new(name, fn, doc);
  int rc = -1;
  if (v && !strcmp(ns, "jax.debug")) {
    Value *dbg = dict_get_str(((Module *)builtins_namespace("jax"))->globals, "debug");
    rc = dbg ? dict_set_str(((Module *)dbg)->globals, name, v) : -1;
  } else if (v) {
    rc = builtins_add_to(ns, name, v);
  }
  if (v) val_decref(v);
  return rc;
}

/* [x]'s Explicit type (a new reference to its sharding, NULL when it
 * has none) written into [ty] as JAX's errors print an aval's repr,
 * "ShapedArray(float32[8@X,4])"; [*typed]: some dimension is split over
 * an Explicit axis, [*bad]: one of the dimensions [touched] (bits) is. */
static Value *explicit_type(Value *x, uint64_t touched, char *ty, size_t cap, bool *typed, bool *bad) {
  Value *s = IS_ARRAY(x) ? (AS_ARRAY(x)->sharding ? val_incref(AS_ARRAY(x)->sharding) : NULL)
             : shardmap_typeof_sharding_hook ? shardmap_typeof_sharding_hook(x) : NULL;
  AVal av;
  *typed = *bad = false;
  if (!s || !sharding_is(s) || !((NamedSharding *)s)->mesh || ops_aval(x, &av) < 0) {
    val_decref(s);
    return NULL;
  }
  const NamedSharding *ns = (const NamedSharding *)s;
  uint32_t auto_bits = sharding_auto_axes();
  int n = snprintf(ty, cap, "ShapedArray(%s[", dt_name(av.dtype));
  for (int d = 0; d < av.ndim && (size_t)n < cap - 112; d++) {
    n += snprintf(ty + n, cap - (size_t)n, "%s%lld", d ? "," : "", (long long)av.shape[d]);
    const SpecEntry *e = d < ns->spec->n ? &ns->spec->e[d] : NULL;
    bool typed_axis[8] = {false};
    int shown = 0;
    for (int k = 0; e && k < e->nnames && k < 8; k++) {
      int a = mesh_axis(ns->mesh, e->names[k]);
      typed_axis[k] = a >= 0 && ns->mesh->axis_types[a] == MESH_EXPLICIT && !(auto_bits >> a & 1);
      shown += typed_axis[k];
    }
    *typed |= shown > 0;
    *bad |= shown > 0 && (touched >> d & 1);
    for (int k = 0, j = 0; shown && k < e->nnames && k < 8; k++)
      if (typed_axis[k])
        n += snprintf(ty + n, cap - (size_t)n, "%s%s", j++ ? "," : shown > 1 ? "@(" : "@",
                      e->names[k]);
    if (shown > 1) n += snprintf(ty + n, cap - (size_t)n, ")");
  }
  snprintf(ty + n, cap - (size_t)n, "])");
  return s;
}

static void put_aval(StrBuf *b, DType dt, int ndim, const int64_t *shape, const Sharding *r,
                     const Mesh *m);
static void type_rule(Value *x, int ndim, Mesh *m, Sharding *r);

/* ops_scatter_type_hook (JAX's _scatter_sharding_rule for x.at[index]):
 * a dimension the index selects part of may not be split over Explicit
 * axes; the result has x's type. */
static Value *scatter_type(Value *x, uint64_t touched, const AVal *ind, Value *y, const AVal *upd) {
  char ty[512];
  bool typed, bad;
  Value *s = explicit_type(x, touched, ty, sizeof ty, &typed, &bad);
  if (bad) {
    Mesh *m = ((NamedSharding *)s)->mesh;
    AVal ya;
    Sharding yr, ur;
    memset(&ur, 0, sizeof ur);
    sharding_rule_mesh(m, &ur);
    ur.ndim = upd->ndim;
    if (ops_aval(y, &ya) == 0) {   /* y broadcast: its splits where the sizes meet */
      type_rule(y, ya.ndim, m, &yr);
      for (int k = 1; k <= ya.ndim && k <= upd->ndim; k++)
        if (ya.shape[ya.ndim - k] == upd->shape[upd->ndim - k]) {
          ur.nsplit[upd->ndim - k] = yr.nsplit[ya.ndim - k];
          memcpy(ur.split[upd->ndim - k], yr.split[ya.ndim - k], sizeof yr.split[0]);
        }
    }
    err_clear();
    StrBuf b = {0}, c = {0};
    put_aval(&b, ind->dtype, ind->ndim, ind->shape, NULL, m);
    put_aval(&c, upd->dtype, upd->ndim, upd->shape, &ur, m);
    err_set(ERR_TYPE, "ShardingTypeError: Use `.at[...].set/add/mul/...(out_sharding=)` to "
                   "provide output PartitionSpec for the scatter update as out sharding could "
                   "not be resolved unambiguously (or would require collectives on inputs). Got "
                   "operand=%s, indices=%s, updates=%s", ty, sbuf_text(&b), sbuf_text(&c));
    sbuf_free(&b);
    sbuf_free(&c);
    val_decref(s);
    return NULL;
  }
  if (!typed) {
    val_decref(s);
    return NULL;
  }
  return s;
}

/* ---- the types of what shmap composes from several primitives ---- */

/* [x]'s sharding (a new reference; NULL: none known): an array's, or a
 * traced value's as jax.typeof gives it. */
static Value *value_sharding(Value *x) {
  Value *s = IS_ARRAY(x) ? (AS_ARRAY(x)->sharding ? val_incref(AS_ARRAY(x)->sharding) : NULL)
             : shardmap_typeof_sharding_hook ? shardmap_typeof_sharding_hook(x) : NULL;
  if (s && (!sharding_is(s) || !((NamedSharding *)s)->mesh)) {
    val_decref(s);
    s = NULL;
  }
  return s;
}

/* The mesh with an Explicit axis the first of [xs] ([n]) laid out over
 * one is laid out over (borrowed: [*keep] holds it), or NULL. */
static Mesh *explicit_mesh_of(Value *const *xs, int n, Value **keep) {
  Mesh *found = NULL;
  *keep = NULL;
  for (int i = 0; i < n; i++) {
    Value *s = value_sharding(xs[i]);
    Mesh *m = s ? ((NamedSharding *)s)->mesh : NULL;
    for (int a = 0; m && !found && a < m->naxes; a++)
      if (m->axis_types[a] == MESH_EXPLICIT) {
        *keep = val_incref(s);
        found = m;
      }
    val_decref(s);
  }
  if (!found && *keep) {
    val_decref(*keep);
    *keep = NULL;
  }
  return found;
}

/* Whether [x]'s layout is known here: an array's, a value the current
 * jit traces, or one being differentiated or batched whose primal's
 * (batched value's) layout is known. */
static bool layout_known(Value *x) {
  if (IS_ARRAY(x)) return true;
  Value *s = value_sharding(x);
  err_clear();
  val_decref(s);
  return s != NULL;
}

/* [x]'s type over [m] as a rule (rank [ndim]): its splits over m's
 * Explicit axes (those auto_axes makes Auto excepted); replicated when
 * it is not laid out over [m], or its layout is not known. */
static void type_rule(Value *x, int ndim, Mesh *m, Sharding *r) {
  Value *s = value_sharding(x);
  if (s && mesh_same(((NamedSharding *)s)->mesh, m)) {
    sharding_to_rule((NamedSharding *)s, ndim, r);
  } else {
    memset(r, 0, sizeof *r);
    sharding_rule_mesh(m, r);
  }
  val_decref(s);
  r->ndim = ndim;
  r->partial = 0;
  r->partial_coll = NULL;
  uint32_t typed = r->explicit_axes & ~sharding_auto_axes();
  for (int d = 0; d < ndim; d++) {
    int k = 0;
    for (int j = 0; j < r->nsplit[d]; j++)
      if (typed >> r->split[d][j] & 1) r->split[d][k++] = r->split[d][j];
    r->nsplit[d] = (uint8_t)k;
  }
}

static bool same_rule(const Sharding *a, const Sharding *b) {
  if (a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; d++)
    if (a->nsplit[d] != b->nsplit[d] || memcmp(a->split[d], b->split[d], (size_t)a->nsplit[d]))
      return false;
  return true;
}

static bool rule_split(const Sharding *r) {
  for (int d = 0; d < r->ndim; d++)
    if (r->nsplit[d]) return true;
  return false;
}

/* Appends to [b] the str of the NamedSharding rule [r] over [m] gives. */
static int put_named(StrBuf *b, Mesh *m, const Sharding *r) {
  Value *s = sharding_from_rule(m, r), *t = s ? val_repr(s) : NULL;
  if (t) sbuf_puts(b, str_cstr(t));
  val_decref(s);
  val_decref(t);
  return t ? 0 : -1;
}

/* Appends to [b] JAX's repr of an aval of [dt], [shape] typed [r] over
 * [m]: "ShapedArray(float32[8@X,4])". */
static void put_aval(StrBuf *b, DType dt, int ndim, const int64_t *shape, const Sharding *r,
                     const Mesh *m) {
  sbuf_printf(b, "ShapedArray(%s[", dt_name(dt));
  for (int d = 0; d < ndim; d++) {
    sbuf_printf(b, "%s%lld", d ? "," : "", (long long)shape[d]);
    int n = r && d < r->ndim ? r->nsplit[d] : 0;
    for (int j = 0; j < n; j++)
      sbuf_printf(b, "%s%s", j ? "," : n > 1 ? "@(" : "@", m->axis_names[r->split[d][j]]);
    if (n > 1) sbuf_puts(b, ")");
  }
  sbuf_puts(b, "])");
}

/* ops_sort_type_hook (JAX's _sort_abstract_eval of several operands). */
static Value *sort_type(Value *const *xs, int n, int ndim, int axis) {
  Value *keep;
  Mesh *m = explicit_mesh_of(xs, n, &keep);
  if (!m) return NULL;
  Sharding *r = shm_calloc((size_t)n + 1, sizeof(Sharding));
  bool *known = shm_calloc((size_t)n + 1, sizeof(bool));
  Value *res = NULL;
  int bad = -1, first = -1;
  bool differ = false;
  for (int i = 0; r && known && i < n && bad < 0 && !differ; i++) {
    if (!(known[i] = layout_known(xs[i]))) continue;   /* not checked */
    type_rule(xs[i], ndim, m, &r[i]);
    if (first < 0) first = i;
    if (r[i].nsplit[axis]) bad = i;
    else differ = !same_rule(&r[i], &r[first]);
  }
  StrBuf b = {0};
  if (!r || !known) {
    err_nomem();
  } else if (bad >= 0) {
    if (put_named(&b, m, &r[bad]) == 0)
      err_set(ERR_TYPE, "ShardingTypeError: Arguments to sort must be unsharded over the sorting "
              "dimension. Got arg sharding=%s and sorting dimension=%d", sbuf_text(&b), axis);
  } else if (differ) {
    for (int i = 0, shown = 0; i < n; i++) {
      if (!layout_known(xs[i])) continue;
      type_rule(xs[i], ndim, m, &r[i]);
      if (shown++) sbuf_puts(&b, " ");
      if (put_named(&b, m, &r[i]) < 0) break;
    }
    if (!err_occurred())
      err_set(ERR_TYPE, "ShardingTypeError: Arguments to sort must have equal shardings, got: %s",
              sbuf_text(&b));
  } else if (first >= 0 && rule_split(&r[first])) {
    res = sharding_from_rule(m, &r[first]);
  }
  shm_free(known);
  sbuf_free(&b);
  shm_free(r);
  val_decref(keep);
  return res;
}

/* The gather error of JAX's rule, its operand [x] (typed [xr]) and
 * indices [idx] (typed [ir], an index vector dimension of 1 appended). */
static void gather_error(Mesh *m, const AVal *xa, const Sharding *xr, const AVal *ia,
                         const Sharding *ir) {
  StrBuf b = {0}, c = {0};
  int64_t shape[SHM_MAXDIM + 1];
  memcpy(shape, ia->shape, sizeof(int64_t) * (size_t)ia->ndim);
  shape[ia->ndim] = 1;
  put_aval(&b, xa->dtype, xa->ndim, xa->shape, xr, m);
  put_aval(&c, ia->dtype, ia->ndim + 1, shape, ir, m);
  err_set(ERR_TYPE, "ShardingTypeError: Use `.at[...].get(out_sharding=)` to provide output "
          "PartitionSpec for the gather indexing as out sharding could not be resolved "
          "unambiguously (or would require collectives on inputs). Got operand=%s, indices=%s",
          sbuf_text(&b), sbuf_text(&c));
  sbuf_free(&b);
  sbuf_free(&c);
}

/* ops_take_along_type_hook (JAX's gather rule for take_along_axis: the
 * dimensions other than [axis] batch dimensions). */
static Value *take_along_type(Value *x, Value *idx, int axis) {
  Value *keep, *both[2] = {x, idx};
  Mesh *m = explicit_mesh_of(both, 2, &keep);
  AVal xa, ia;
  if (!m) return NULL;
  if (ops_aval(x, &xa) < 0 || ops_aval(idx, &ia) < 0 || ia.ndim != xa.ndim) {
    err_clear();   /* take_along_axis reports a wrong rank */
    val_decref(keep);
    return NULL;
  }
  Sharding xr, ir, out;
  type_rule(x, xa.ndim, m, &xr);
  type_rule(idx, ia.ndim, m, &ir);
  bool ok = (xr.nsplit[axis] == 0 || xa.shape[axis] == 1) && ir.nsplit[axis] == 0;
  out = xr;
  out.nsplit[axis] = 0;
  for (int d = 0; ok && d < xa.ndim; d++) {
    if (d == axis || !ir.nsplit[d]) continue;
    ok = !xr.nsplit[d] || (xr.nsplit[d] == ir.nsplit[d] &&
                           !memcmp(xr.split[d], ir.split[d], ir.nsplit[d]));
    out.nsplit[d] = ir.nsplit[d];
    memcpy(out.split[d], ir.split[d], ir.nsplit[d]);
  }
  Value *res = NULL;
  if (!ok) gather_error(m, &xa, &xr, &ia, &ir);
  else if (rule_split(&out)) res = sharding_from_rule(m, &out);
  val_decref(keep);
  return res;
}

/* ops_explicit_split_hook: whether [x] is split over an Explicit axis
 * along one of [dims] (bits), its type's str in [ty]. */
static bool explicit_split(Value *x, uint64_t dims, char *ty, size_t cap) {
  char t[512];
  bool typed, bad;
  Value *s = explicit_type(x, dims, t, sizeof t, &typed, &bad);
  val_decref(s);
  size_t n = strlen(t);   /* "ShapedArray(" ... ")" stripped */
  snprintf(ty, cap, "%.*s", n > 13 ? (int)(n - 13) : 0, t + (n > 13 ? 12 : n));
  return bad;
}

/* ops_index_hook: a Device stands for its id where arrays are built
 * (np.array(jax.devices()) is the array of ids a Mesh takes). */
static bool device_index(const Value *v, int64_t *out) {
  int id = device_id(v);
  if (id >= 0) *out = id;
  return id >= 0;
}

/* The jax.debug and mesh_utils namespaces, made here (cli/debug.c adds
 * print and breakpoint to jax.debug). */
static int add_namespaces(void) {
  Value *dbg = add_module("jax.debug", "jax", "debug");
  Value *mu = add_module("jax.experimental.mesh_utils", "jax.experimental", "mesh_utils");
  Value *f = mu ? builtin_new("create_device_mesh", bi_create_device_mesh,
                              "create_device_mesh(mesh_shape): device ids in that shape") : NULL;
  int rc = dbg && f && dict_set_str(((Module *)mu)->globals, "create_device_mesh", f) == 0 ? 0 : -1;
  if (f) val_decref(f);
  if (mu) val_decref(mu);
  if (dbg) val_decref(dbg);
  return rc;
}

void sharding_register_rules(void) {
  prim_register_rows(constraint_rows, sizeof constraint_rows / sizeof constraint_rows[0]);
}

int sharding_register(Env *b) {
  (void)b;
  if (add_namespaces() < 0) return -1;
  prim_sharding_hook = eager_sharding;
  arr_materialize_hook = materialize;
  builtins_out_sharding_hook = out_sharding;
  sharding_register_rules();
  ops_array_attr_hook = array_attr;
  ops_index_hook = device_index;
  ops_scatter_type_hook = scatter_type;
  ops_explicit_split_hook = explicit_split;
  ops_sort_type_hook = sort_type;
  ops_take_along_type_hook = take_along_type;
  ops_register_equal(V_OPAQUE, opaque_equal);
  static const struct {
    const char *ns, *name;
    BuiltinFn fn;
    const char *doc;
  } fns[] = {
      {"jax.sharding", "NamedSharding", bi_named_sharding, "NamedSharding(mesh, spec)"},
      {"jax.sharding", "SingleDeviceSharding", bi_single_device_sharding, "SingleDeviceSharding(device)"},
      {"jax", "device_put", bi_device_put, "device_put(x, device): x laid out by a sharding"},
      {"jax", "device_get", bi_device_get, "device_get(x): the global values"},
      {"jax", "block_until_ready", bi_block_until_ready, "block_until_ready(x): x, its computation done"},
      {"jax", "make_array_from_callback", bi_make_array_from_callback,
       "make_array_from_callback(shape, sharding, data_callback)"},
      {"jax", "make_array_from_single_device_arrays", bi_make_array_from_single_device_arrays,
       "make_array_from_single_device_arrays(shape, sharding, arrays)"},
      {"jax", "devices", bi_devices, "devices(): every Device"},
      {"jax", "local_devices", bi_local_devices, "local_devices(): this process's Devices"},
      {"jax", "device_count", bi_device_count, "device_count()"},
      {"jax", "local_device_count", bi_local_device_count, "local_device_count()"},
      {"jax", "process_index", bi_process_index, "process_index(): this process's number"},
      {"jax", "process_count", bi_process_count, "process_count(): the MPI job's processes"},
      {"jax.debug", "visualize_array_sharding", bi_visualize,
       "visualize_array_sharding(arr): draw which device holds which block"},
      {"jax.lax", "with_sharding_constraint", bi_with_sharding_constraint,
       "with_sharding_constraint(x, shardings)"},
      {"jax.sharding", "reshard", bi_reshard, "reshard(x, out_shardings): x laid out so, strictly"},
      {"jax.sharding", "auto_axes", bi_auto_axes, "auto_axes(f, axes=, out_sharding=): f, results laid out so"},
      {"jax.sharding", "explicit_axes", bi_explicit_axes,
       "explicit_axes(f, axes=, in_sharding=): f on arguments laid out so"},
  };
  for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++)
    if (add_to(fns[i].ns, fns[i].name, fns[i].fn, fns[i].doc) < 0) return -1;
  return 0;
}
