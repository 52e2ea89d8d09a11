/*
 * mesh.c - meshes, partition specs, the `mesh` statement and
 * show_sharding (mesh.h).
 */
#include <stdio.h>
#include <string.h>

#include "array/array.h"
#include "lang/builtins.h"
#include "base/error.h"
#include "base/intern.h"
#include "base/mem.h"
#include "spmd/mesh.h"
#include "spmd/device.h"
#include "lang/ops.h"
#include "array/prim.h"
#include "array/print.h"
#include "spmd/transport.h"

/* ==== meshes ================================================================ */

static void mesh_free(Value *v) {
  shm_free(((Mesh *)v)->devices);
  shm_free(v);
}

static int check_devices(const Mesh *m, const int *devices) {
  int ndev = shm_interp ? shm_interp->ndevices : m->size;
  for (int i = 0; i < m->size; i++) {
    if (devices[i] < 0 || devices[i] >= ndev) {
      err_set(ERR_VALUE, "mesh device id %d is out of range: there are %d devices (0 to %d)",
              devices[i], ndev, ndev - 1);
      return -1;
    }
    for (int j = 0; j < i; j++)
      if (devices[j] == devices[i]) {
        err_set(ERR_VALUE, "mesh device id %d is listed twice", devices[i]);
        return -1;
      }
  }
  return 0;
}

static int check_axes(int naxes, const char *const *names, const int64_t *sizes) {
  if (naxes > MESH_MAX_AXES) {
    err_set(ERR_VALUE, "a mesh may have at most %d axes", MESH_MAX_AXES);
    return -1;
  }
  for (int i = 0; i < naxes; i++) {
    if (sizes[i] < 1) {
      err_set(ERR_VALUE, "mesh axis '%s' has size %lld; sizes must be positive", names[i],
              (long long)sizes[i]);
      return -1;
    }
    for (int j = 0; j < i; j++)
      if (names[j] == names[i]) {
        err_set(ERR_VALUE, "mesh axis '%s' is named twice", names[i]);
        return -1;
      }
  }
  return 0;
}

/* Device of position [i] of a mesh of [size] devices given no `devices`
 * clause: the first [size] devices; under mpirun, when the processes
 * divide [size], an equal share of every process's devices (JAX's
 * meshes span the processes too), so that every process runs part of
 * each call. */
static int default_device(int size, int ndev, int i) {
  int procs = transport_procs();
  if (procs == 1 || size >= ndev || size % procs) return i;
  int share = size / procs;
  return (i / share) * (ndev / procs) + i % share;
}

/* Builds a mesh; [abstract] skips the count of real devices. */
static Value *mesh_make(const char *name, int naxes, const char *const *names,
                        const int64_t *sizes, const int *devices, bool abstract) {
  if (check_axes(naxes, names, sizes) < 0) return NULL;
  int64_t size = 1;
  bool overflow = false;
  for (int i = 0; i < naxes; i++)
    overflow |= __builtin_mul_overflow(size, sizes[i], &size);
  if (overflow)
    return err_set(ERR_VALUE, "mesh of more than %lld devices is too large (at most %d)",
                   (long long)INT64_MAX, MESH_MAX_DEVICES);
  if (size > MESH_MAX_DEVICES)
    return err_set(ERR_VALUE, "mesh of %lld devices is too large (at most %d)",
                   (long long)size, MESH_MAX_DEVICES);
  int ndev = shm_interp && !abstract ? shm_interp->ndevices : (int)size;
  if (!devices && size > ndev)
    return err_set(ERR_VALUE,
                   "mesh %s needs %lld devices but only %d exist; run with --devices %lld "
                   "or set SHMAP_DEVICES=%lld",
                   name ? name : "", (long long)size, ndev, (long long)size, (long long)size);
  Mesh *m = shm_calloc(1, sizeof *m);
  if (!m) return err_nomem();
  val_init(&m->hdr, V_MESH);
  m->name = name;
  m->naxes = naxes;
  m->size = (int)size;
  m->abstract = abstract;
  for (int i = 0; i < naxes; i++) {
    m->axis_names[i] = names[i];
    m->axis_sizes[i] = (int)sizes[i];
  }
  if (!(m->devices = shm_malloc(sizeof(int) * (size_t)size))) {
    val_decref(&m->hdr);
    return err_nomem();
  }
  for (int i = 0; i < m->size; i++) m->devices[i] = devices ? devices[i] : default_device(m->size, ndev, i);
  if (devices && check_devices(m, devices) < 0) {
    val_decref(&m->hdr);
    return NULL;
  }
  return &m->hdr;
}

Value *mesh_new(const char *name, int naxes, const char *const *names, const int64_t *sizes,
                const int *devices) {
  return mesh_make(name, naxes, names, sizes, devices, false);
}

Value *mesh_new_abstract(int naxes, const char *const *names, const int64_t *sizes) {
  return mesh_make(NULL, naxes, names, sizes, NULL, true);
}

int mesh_check_runnable(const Mesh *m) {
  int ndev = shm_interp ? shm_interp->ndevices : m->size;
  if (!m->abstract || m->size <= ndev) return 0;
  Value *r = val_repr((Value *)&m->hdr);
  err_set(ERR_VALUE, "shard_map on %s needs a real mesh of %d devices, but only %d exist; "
          "an abstract mesh is for lowering and analysis (run with --devices %d to run it)",
          r ? str_cstr(r) : "AbstractMesh", m->size, ndev, m->size);
  val_decref(r);
  return -1;
}

void mesh_to_desc(const Mesh *m, MeshDesc *d) {
  memset(d, 0, sizeof *d);
  d->naxes = m->naxes;
  for (int i = 0; i < m->naxes; i++) {
    d->names[i] = m->axis_names[i];
    d->sizes[i] = m->axis_sizes[i];
  }
  d->ndevices = m->size;
  d->device_ids = m->devices;
}

bool mesh_same(const Mesh *a, const Mesh *b) {
  if (a == b) return true;
  if (!a || !b || a->naxes != b->naxes || a->size != b->size) return false;
  for (int i = 0; i < a->naxes; i++)
    if (a->axis_names[i] != b->axis_names[i] || a->axis_sizes[i] != b->axis_sizes[i]) return false;
  return !memcmp(a->devices, b->devices, sizeof(int) * (size_t)a->size);
}

int mesh_axis(const Mesh *m, const char *name) {
  for (int i = 0; i < m->naxes; i++)
    if (m->axis_names[i] == name) return i;
  return -1;
}

void mesh_coords(const Mesh *m, int flat, int *coords) {
  for (int i = m->naxes - 1; i >= 0; i--) {
    coords[i] = flat % m->axis_sizes[i];
    flat /= m->axis_sizes[i];
  }
}

void mesh_coords_str(const Mesh *m, int flat, char *buf, size_t cap) {
  int c[MESH_MAX_AXES];
  mesh_coords(m, flat, c);
  size_t len = (size_t)snprintf(buf, cap, "(");
  for (int i = 0; i < m->naxes && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%s=%d", i ? ", " : "",
                            m->axis_names[i], c[i]);
  if (len < cap) snprintf(buf + len, cap - len, ")");
}

/* Reads a list, tuple or array of device ids of length [n]. */
static int read_device_ids(Value *v, int n, int *out) {
  Value *arr = ops_to_array(v, DT_I64);
  if (!arr) return -1;
  Array *a = AS_ARRAY(arr);
  int rc = 0;
  if (a->size != n) {
    err_set(ERR_VALUE, "the mesh has %d positions but the devices list has %lld entries", n,
            (long long)a->size);
    rc = -1;
  }
  for (int i = 0; rc == 0 && i < n; i++) out[i] = (int)arr_get_i64(a, i);
  val_decref(arr);
  return rc;
}

/* `mesh NAME(AXIS=SIZE, ...) [devices EXPR]` */
static int exec_mesh(const Node *s, Env *env, AstModule *mod) {
  int64_t sizes[MESH_MAX_AXES];
  int n = s->nnames;
  if (n > MESH_MAX_AXES) {
    err_set_at(s->loc, ERR_VALUE, "a mesh may have at most %d axes", MESH_MAX_AXES);
    return -1;
  }
  for (int i = 0; i < n; i++) {
    Value *v = eval_node(s->items.items[i], env);
    int64_t x;
    int rc = v ? arr_to_index(v, &x) : -1;
    val_decref(v);
    if (rc < 0) {
      err_locate(s->items.items[i]->loc);
      return -1;
    }
    sizes[i] = x;
  }
  int *devs = NULL;
  Value *m = NULL;
  if (s->a) {
    int64_t size = 1;
    for (int i = 0; i < n; i++)
      if (__builtin_mul_overflow(size, sizes[i] > 0 ? sizes[i] : 1, &size)) size = INT64_MAX;
    Value *dv = eval_node(s->a, env);
    devs = dv && size <= MESH_MAX_DEVICES ? shm_malloc(sizeof(int) * (size_t)size) : NULL;
    if (dv && size > MESH_MAX_DEVICES) m = mesh_new(s->name, n, s->names, sizes, NULL);   /* its error */
    else if (dv && devs && read_device_ids(dv, (int)size, devs) < 0) err_locate(s->a->loc);
    else if (dv && devs) m = mesh_new(s->name, n, s->names, sizes, devs);
    val_decref(dv);
  } else {
    m = mesh_new(s->name, n, s->names, sizes, NULL);
  }
  shm_free(devs);
  if (!m) return -1;
  int rc = env_set(env, s->name, m);
  val_decref(m);
  return rc;
}

/* ==== jax.sharding.AxisType ==================================================== */

static const char *const axis_type_names[] = {"Auto", "Explicit", "Manual"};

typedef struct AxisTypeVal {
  Opaque base;
  MeshAxisType t;
} AxisTypeVal;

static Value *axis_type_repr(Value *self) {
  char buf[48];
  snprintf(buf, sizeof buf, "AxisType.%s", axis_type_names[((AxisTypeVal *)self)->t]);
  return str_from(buf);
}

static Value *axis_type_getattr(Value *self, const char *name) {
  if (!strcmp(name, "name")) return str_from(axis_type_names[((AxisTypeVal *)self)->t]);
  return err_set(ERR_ATTRIBUTE, "'AxisType' object has no attribute '%s'", name);
}

static void axis_type_free(Value *v) { (void)v; }

static const OpaqueType axis_type_type = {"AxisType", axis_type_free, axis_type_repr,
                                          axis_type_getattr, NULL, NULL, NULL};

/* The three members, immortal, so == and dict keys go by identity. */
static AxisTypeVal axis_types[3] = {
    {{{1, V_OPAQUE, VAL_IMMORTAL}, &axis_type_type}, MESH_AUTO},
    {{{1, V_OPAQUE, VAL_IMMORTAL}, &axis_type_type}, MESH_EXPLICIT},
    {{{1, V_OPAQUE, VAL_IMMORTAL}, &axis_type_type}, MESH_MANUAL},
};

/* The class jax.sharding.AxisType: its members as attributes. */
static Value *axis_type_class_getattr(Value *self, const char *name) {
  (void)self;
  for (int i = 0; i < 3; i++)
    if (!strcmp(name, axis_type_names[i])) return &axis_types[i].base.hdr;
  return err_set(ERR_ATTRIBUTE, "type object 'AxisType' has no attribute '%s'", name);
}

static const OpaqueType axis_type_class = {"AxisType", axis_type_free, NULL,
                                           axis_type_class_getattr, NULL, NULL, NULL};
static Opaque axis_type_cls = {{1, V_OPAQUE, VAL_IMMORTAL}, &axis_type_class};

/* Reads axis_types= (NULL or None: every axis Auto) for [n] axes. */
static int read_axis_types(Value *v, int n, Mesh *m) {
  size_t k;
  Value *const *items;
  if (!v || v == VAL_NONE) return 0;
  if (!val_seq(v, &k, &items) || (int)k != n) {
    err_set(ERR_VALUE, "axis_types must be a tuple of one jax.sharding.AxisType per mesh axis");
    return -1;
  }
  for (int i = 0; i < n; i++) {
    if (items[i]->type != V_OPAQUE || ((Opaque *)items[i])->ot != &axis_type_type) {
      err_set(ERR_TYPE, "axis_types entries must be jax.sharding.AxisType members, got %s",
              val_type_name(items[i]));
      return -1;
    }
    m->axis_types[i] = (uint8_t)((AxisTypeVal *)items[i])->t;
  }
  return 0;
}

/* The mesh [m] (a new reference, stolen) with [types] read in, or NULL. */
static Value *with_axis_types(Value *m, Value *types) {
  if (m && read_axis_types(types, ((Mesh *)m)->naxes, (Mesh *)m) < 0) {
    val_decref(m);
    return NULL;
  }
  return m;
}

/* Mesh(devices, axis_names): the function form, as jax.sharding.Mesh. */
static Value *bi_mesh(const CallArgs *a) {
  Value *devs, *names, *types = NULL;
  if (args_bind("Mesh", a, "devices, axis_names, axis_types=", (Value **[]){&devs, &names, &types}) < 0)
    return NULL;
  Value *arr = ops_to_array(devs, DT_I64);
  if (!arr) return NULL;
  Array *d = AS_ARRAY(arr);
  size_t nn;
  Value *const *items;
  Value *res = NULL;
  if (names->type == V_STR) {   /* axis_names=('i') is the string 'i': one axis */
    items = &names;
    nn = 1;
  } else if (!val_seq(names, &nn, &items)) {
    nn = (size_t)-1;
  }
  if ((int)nn != d->ndim) {
    err_set(ERR_VALUE, "Mesh: axis_names must be a tuple with one name per axis of "
                       "devices (devices has %d axes)", d->ndim);
    goto out;
  }
  const char *an[MESH_MAX_AXES];
  int64_t sizes[MESH_MAX_AXES];
  int *ids = shm_malloc(sizeof(int) * (size_t)(d->size ? d->size : 1));
  if (!ids || nn > MESH_MAX_AXES) {
    shm_free(ids);
    err_set(ERR_VALUE, "Mesh: too many axes");
    goto out;
  }
  for (size_t i = 0; i < nn; i++) {
    if (items[i]->type != V_STR) {
      shm_free(ids);
      err_set(ERR_TYPE, "Mesh: axis names must be strings");
      goto out;
    }
    if (!(an[i] = intern_cstr(str_cstr(items[i])))) {
      shm_free(ids);
      err_nomem();
      goto out;
    }
    sizes[i] = d->shape[i];
  }
  for (int64_t i = 0; i < d->size; i++) ids[i] = (int)arr_get_i64(d, i);
  res = with_axis_types(mesh_new(NULL, (int)nn, an, sizes, ids), types);
  shm_free(ids);
out:
  val_decref(arr);
  return res;
}

/* Binds a builtin as a global and in the namespace [ns] (jax.P,
 * jax.sharding.PartitionSpec, ...); when it constructs values of VType
 * [kind] (-1: none), it is the class type() gives for them. */
static int add_class_to_ns(Env *b, const char *ns, const char *name, BuiltinFn fn,
                           const char *doc, int kind) {
  Value *v = builtin_new(name, fn, doc);
  int rc = v && env_set(b, intern_cstr(name), v) == 0 && builtins_add_to(ns, name, v) == 0 ? 0 : -1;
  if (rc == 0 && kind >= 0) builtins_set_class(kind, v);
  if (v) val_decref(v);
  return rc;
}

static int add_to_ns(Env *b, const char *ns, const char *name, BuiltinFn fn, const char *doc) {
  return add_class_to_ns(b, ns, name, fn, doc, -1);
}

/* Binds [fn] as [name] at the top level and in the jax namespace. */
static int add_to_jax(Env *b, const char *name, BuiltinFn fn, const char *doc) {
  return add_to_ns(b, "jax", name, fn, doc);
}

/* The sizes and names of make_mesh and AbstractMesh: [what] names the
 * function in messages.  The count, or -1 with the error set. */
static int read_axes(const char *what, Value *shapes, Value *names, const char **an,
                     int64_t *sizes) {
  size_t ns, nn;
  Value *const *si, *const *ni;
  if (!val_seq(shapes, &ns, &si) || !val_seq(names, &nn, &ni) || ns != nn || ns > MESH_MAX_AXES)
    return err_set(ERR_VALUE, "%s: axis sizes and axis_names must be sequences of one size and "
                              "one name per axis", what), -1;
  for (size_t i = 0; i < ns; i++) {
    if (ni[i]->type != V_STR) return err_set(ERR_TYPE, "%s: axis names must be strings", what), -1;
    if (arr_to_index(si[i], &sizes[i]) < 0) return -1;
    if (sizes[i] <= 0) return err_set(ERR_VALUE, "%s: axis sizes must be positive", what), -1;
    if (!(an[i] = intern_cstr(str_cstr(ni[i])))) return err_nomem(), -1;
  }
  return (int)ns;
}

/* jax.sharding.AbstractMesh(axis_sizes, axis_names, axis_types=None):
 * JAX's current signature; axis_types, when given, has one entry per
 * axis (every axis behaves as Auto: shard_map's manual axes are its
 * specs'). */
static Value *bi_abstract_mesh(const CallArgs *a) {
  Value *shapes, *names, *types = NULL;
  if (args_bind("AbstractMesh", a, "axis_sizes, axis_names, axis_types=",
                (Value **[]){&shapes, &names, &types}) < 0)
    return NULL;
  const char *an[MESH_MAX_AXES];
  int64_t sizes[MESH_MAX_AXES];
  int n = read_axes("AbstractMesh", shapes, names, an, sizes);
  if (n < 0) return NULL;
  size_t nt;
  Value *const *ti;
  if (types && types != VAL_NONE && (!val_seq(types, &nt, &ti) || (int)nt != n))
    return err_set(ERR_VALUE, "AbstractMesh: axis_types must have one entry per axis (%d)", n);
  return mesh_new_abstract(n, an, sizes);
}

/* jax.make_mesh(axis_shapes, axis_names, axis_types=None): a mesh over
 * the first devices, in row-major order; without axis_types every axis
 * is Explicit, as current JAX's make_mesh makes them (Mesh's default is
 * Auto).  Semantics: jax.make_mesh (jax/_src/mesh_utils.py). */
static Value *bi_make_mesh(const CallArgs *a) {
  Value *shapes, *names, *devs = NULL, *types = NULL;
  if (args_bind("make_mesh", a, "axis_shapes, axis_names, devices=, axis_types=",
                (Value **[]){&shapes, &names, &devs, &types}) < 0)
    return NULL;
  const char *an[MESH_MAX_AXES];
  int64_t sizes[MESH_MAX_AXES];
  int ns = read_axes("make_mesh", shapes, names, an, sizes);
  (void)devs;
  Value *m = ns < 0 ? NULL : mesh_new(NULL, ns, an, sizes, NULL);
  if (m && (!types || types == VAL_NONE))
    memset(((Mesh *)m)->axis_types, MESH_EXPLICIT, sizeof ((Mesh *)m)->axis_types);
  return with_axis_types(m, types);
}

/* devices(): the ids of every device, as an int32 array (reshape it to
 * build a Mesh, as with jax.devices()). */
static Value *bi_devices(const CallArgs *a) {
  if (a->nargs || a->nkw) return err_set(ERR_TYPE, "devices() takes no arguments");
  int64_t n = shm_interp->ndevices;
  Array *r = arr_new(DT_I32, 1, &n);
  if (!r) return NULL;
  for (int64_t i = 0; i < n; i++) ((int32_t *)arr_data(r))[i] = (int32_t)i;
  return &r->hdr;
}

/* The AbstractMesh of [m]: its axes' names, sizes and types, no devices
 * (JAX's Mesh.abstract_mesh).  New reference, or NULL out of memory. */
static Value *abstract_of(const Mesh *m) {
  int64_t sizes[MESH_MAX_AXES];
  for (int i = 0; i < m->naxes; i++) sizes[i] = m->axis_sizes[i];
  Value *r = mesh_new_abstract(m->naxes, m->axis_names, sizes);
  if (r) memcpy(((Mesh *)r)->axis_types, m->axis_types, sizeof m->axis_types);
  return r;
}

static Value *mesh_getattr(Value *self, const char *name) {
  Mesh *m = (Mesh *)self;
  if (strcmp(name, "abstract_mesh") == 0) return m->abstract ? val_incref(self) : abstract_of(m);
  if (strcmp(name, "empty") == 0) return val_incref(val_bool(m->naxes == 0));
  if (strcmp(name, "axis_sizes") == 0) {   /* a tuple of sizes, as JAX's */
    int64_t sizes[MESH_MAX_AXES];
    for (int i = 0; i < m->naxes; i++) sizes[i] = m->axis_sizes[i];
    return val_int_tuple(m->naxes, sizes);
  }
  if (strcmp(name, "shape") == 0) {
    Value *d = dict_new();
    for (int i = 0; d && i < m->naxes; i++) {
      Value *sz = val_int(m->axis_sizes[i]);
      int rc = sz ? dict_set_str(d, m->axis_names[i], sz) : -1;
      val_decref(sz);
      if (rc < 0) {
        val_decref(d);
        return NULL;
      }
    }
    return d;
  }
  if (strcmp(name, "axis_names") == 0) {
    Value *t = tuple_new((size_t)m->naxes);
    for (int i = 0; t && i < m->naxes; i++) {
      Value *s = str_from(m->axis_names[i]);
      if (!s) {
        val_decref(t);
        return NULL;
      }
      tuple_set_steal(t, (size_t)i, s);
    }
    return t;
  }
  if (strcmp(name, "size") == 0) return val_int(m->size);
  if (strcmp(name, "axis_types") == 0) {
    Value *t = tuple_new((size_t)m->naxes);
    for (int i = 0; t && i < m->naxes; i++) tuple_set_steal(t, (size_t)i, &axis_types[m->axis_types[i]].base.hdr);
    return t;
  }
  if (strcmp(name, "devices") == 0) {
    int64_t shape[MESH_MAX_AXES];
    for (int i = 0; i < m->naxes; i++) shape[i] = m->axis_sizes[i];
    Array *r = arr_new(DT_I32, m->naxes, shape);
    if (!r) return NULL;
    for (int i = 0; i < m->size; i++) ((int32_t *)arr_data(r))[i] = m->devices[i];
    return &r->hdr;
  }
  return err_set(ERR_ATTRIBUTE, "'Mesh' object has no attribute '%s'", name);
}

static Value *mesh_repr(Value *self) {
  Mesh *m = (Mesh *)self;
  char buf[512];
  size_t len = (size_t)snprintf(buf, sizeof buf, m->abstract ? "AbstractMesh(" : "Mesh(");
  for (int i = 0; i < m->naxes && len < sizeof buf; i++)
    len += (size_t)snprintf(buf + len, sizeof buf - len, "%s'%s': %d", i ? ", " : "",
                            m->axis_names[i], m->axis_sizes[i]);
  if (len < sizeof buf) snprintf(buf + len, sizeof buf - len, ")");
  return str_from(buf);
}

/* ==== partition specs ========================================================= */

static int spec_entry(Value *v, SpecEntry *e) {
  e->nnames = 0;
  if (v->type == V_NONE) return 0;
  if (v->type == V_STR) {
    if (!(e->names[e->nnames++] = intern_cstr(str_cstr(v)))) return err_nomem(), -1;
    return 0;
  }
  size_t n;
  Value *const *items;
  if (v->type == V_TUPLE && val_seq(v, &n, &items) && n <= MESH_MAX_AXES) {
    for (size_t i = 0; i < n; i++) {
      if (items[i]->type != V_STR) goto bad;
      if (!(e->names[e->nnames++] = intern_cstr(str_cstr(items[i])))) return err_nomem(), -1;
    }
    return 0;
  }
bad:
  err_set(ERR_TYPE, "PartitionSpec entries must be None, an axis name or a tuple of axis "
                    "names, got %s", val_type_name(v));
  return -1;
}

Value *pspec_from_args(int n, Value *const *entries) {
  PSpec *s = shm_calloc(1, sizeof *s + sizeof(SpecEntry) * (size_t)n);
  if (!s) return err_nomem();
  val_init(&s->hdr, V_PSPEC);
  s->n = n;
  for (int i = 0; i < n; i++)
    if (spec_entry(entries[i], &s->e[i]) < 0) {
      val_decref(&s->hdr);
      return NULL;
    }
  return &s->hdr;
}

PSpec *pspec_none(int n) {
  PSpec *t = shm_calloc(1, sizeof *t + sizeof(SpecEntry) * (size_t)(n + 1));
  if (!t) return err_nomem();
  val_init(&t->hdr, V_PSPEC);
  t->n = n;
  return t;
}

Value *pspec_prepend_none(const PSpec *s) {
  PSpec *t = pspec_none(s->n + 1);
  if (!t) return NULL;
  for (int i = 0; i < s->n; i++) t->e[i + 1] = s->e[i];
  return &t->hdr;
}

void pspec_str(const PSpec *s, char *buf, size_t cap) {
  size_t len = (size_t)snprintf(buf, cap, "P(");
  for (int i = 0; i < s->n && len < cap; i++) {
    const SpecEntry *e = &s->e[i];
    len += (size_t)snprintf(buf + len, cap - len, "%s", i ? ", " : "");
    if (e->nnames == 0) len += (size_t)snprintf(buf + len, cap - len, "None");
    if (e->nnames > 1) len += (size_t)snprintf(buf + len, cap - len, "(");
    for (int k = 0; k < e->nnames && len < cap; k++)
      len += (size_t)snprintf(buf + len, cap - len, "%s'%s'", k ? ", " : "", e->names[k]);
    if (e->nnames > 1 && len < cap) len += (size_t)snprintf(buf + len, cap - len, ")");
  }
  if (len < cap) snprintf(buf + len, cap - len, ")");
}

int pspec_check(const PSpec *s, const Mesh *m, int ndim, const char *what) {
  char sb[256];
  pspec_str(s, sb, sizeof sb);
  if (s->n > ndim) {
    err_set(ERR_VALUE, "%s %s has %d entries but the array has rank %d", what, sb, s->n,
            ndim);
    return -1;
  }
  const char *seen[MESH_MAX_AXES * 4];
  int nseen = 0;
  for (int i = 0; i < s->n; i++)
    for (int k = 0; k < s->e[i].nnames; k++) {
      const char *a = s->e[i].names[k];
      if (mesh_axis(m, a) < 0) {
        char axes[256];
        size_t len = 0;
        axes[0] = '\0';
        for (int q = 0; q < m->naxes && len < sizeof axes; q++)
          len += (size_t)snprintf(axes + len, sizeof axes - len, "%s'%s'", q ? ", " : "",
                                  m->axis_names[q]);
        err_set(ERR_VALUE, "%s %s names '%s', which is not an axis of the mesh (its axes are %s)",
                what, sb, a, axes);
        return -1;
      }
      for (int j = 0; j < nseen; j++)
        if (seen[j] == a) {
          err_set(ERR_VALUE, "%s %s names mesh axis '%s' twice", what, sb, a);
          return -1;
        }
      if (nseen < MESH_MAX_AXES * 4) seen[nseen++] = a;
    }
  return 0;
}

int pspec_entry_size(const PSpec *s, const Mesh *m, int i) {
  int size = 1;
  if (i >= s->n) return 1;
  for (int k = 0; k < s->e[i].nnames; k++) size *= m->axis_sizes[mesh_axis(m, s->e[i].names[k])];
  return size;
}

static Value *bi_pspec(const CallArgs *a) {
  if (a->nkw) return err_set(ERR_TYPE, "P() takes no keyword arguments");
  return pspec_from_args(a->nargs, a->args);
}

static Value *pspec_repr(Value *self) {
  char buf[512];
  pspec_str((PSpec *)self, buf, sizeof buf);
  return str_from(buf);
}

static Value *pspec_getitem_len(Value *self, const char *name) {
  (void)self;
  return err_set(ERR_ATTRIBUTE, "'PartitionSpec' object has no attribute '%s'", name);
}

/* ==== show_sharding ============================================================ */

/* Devices (flat mesh indices) holding block ([r], [c]) of an array split
 * by [s], written as "0,1" into [buf]. */
static void block_holders(const Mesh *m, const PSpec *s, int r, int c, char *buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int d = 0; d < m->size && len < cap; d++) {
    int coords[MESH_MAX_AXES], idx[2] = {0, 0};
    mesh_coords(m, d, coords);
    for (int ax = 0; ax < 2 && ax < s->n; ax++)
      for (int k = 0; k < s->e[ax].nnames; k++) {
        int mi = mesh_axis(m, s->e[ax].names[k]);
        idx[ax] = idx[ax] * m->axis_sizes[mi] + coords[mi];
      }
    if (idx[0] == r && idx[1] == c)
      len += (size_t)snprintf(buf + len, cap - len, "%s%d", len ? "," : "", m->devices[d]);
  }
}

static void rule(int ncols, int width) {
  for (int c = 0; c < ncols; c++) {
    eval_write("+", 1);
    for (int i = 0; i < width; i++) eval_write("-", 1);
  }
  eval_write("+\n", 2);
}

static void cell_row(const char *const *cells, int ncols, int width) {
  for (int c = 0; c < ncols; c++) {
    int len = (int)strlen(cells[c]), left = (width - len) / 2;
    char buf[256];
    snprintf(buf, sizeof buf, "|%*s%s%*s", left, "", cells[c], width - len - left, "");
    eval_write(buf, strlen(buf));
  }
  eval_write("|\n", 2);
}

/* show_sharding(x, mesh, spec): the blocks of x as a grid, each cell
 * naming its block's shape and the devices holding it. */
static Value *bi_show_sharding(const CallArgs *a) {
  Value *x, *mv, *sv;
  if (args_bind("show_sharding", a, "x, mesh, spec", (Value **[]){&x, &mv, &sv}) < 0)
    return NULL;
  if (!IS_ARRAY(x) || mv->type != V_MESH || sv->type != V_PSPEC)
    return err_set(ERR_TYPE, "show_sharding(x, mesh, spec) takes an array, a Mesh and a P(...)");
  Array *arr = AS_ARRAY(x);
  Mesh *m = (Mesh *)mv;
  PSpec *s = (PSpec *)sv;
  if (arr->ndim > 2 || arr->ndim < 1)
    return err_set(ERR_VALUE, "show_sharding draws 1-D and 2-D arrays, got rank %d", arr->ndim);
  if (pspec_check(s, m, arr->ndim, "spec") < 0) return NULL;
  int nr = arr->ndim == 2 ? pspec_entry_size(s, m, 0) : 1;
  int nc = arr->ndim == 2 ? pspec_entry_size(s, m, 1) : pspec_entry_size(s, m, 0);
  int64_t rows = arr->ndim == 2 ? arr->shape[0] : 1, cols = arr->shape[arr->ndim - 1];
  if (rows % nr || cols % nc)
    return err_set(ERR_VALUE, "show_sharding: the mesh axes do not divide the array's shape");
  if (nr > 64 || nc > 16) return err_set(ERR_VALUE, "show_sharding: too many blocks to draw");
  char labels[64 * 16][96], shapes[64 * 16][48];
  int width = 10;
  for (int r = 0; r < nr; r++)
    for (int c = 0; c < nc; c++) {
      char devs[64];
      /* A 1-D array's only split axis (entry 0) is drawn as the columns. */
      block_holders(m, s, arr->ndim == 2 ? r : c, arr->ndim == 2 ? c : 0, devs, sizeof devs);
      snprintf(labels[r * nc + c], sizeof labels[0], "dev %s", devs);
      if (arr->ndim == 2)
        snprintf(shapes[r * nc + c], sizeof shapes[0], "[%lld, %lld]", (long long)(rows / nr),
                 (long long)(cols / nc));
      else
        snprintf(shapes[r * nc + c], sizeof shapes[0], "[%lld]", (long long)(cols / nc));
      int w = (int)strlen(labels[r * nc + c]) + 2;
      if (w > width) width = w;
    }
  for (int r = 0; r < nr; r++) {
    const char *lc[16], *sc[16];
    for (int c = 0; c < nc; c++) {
      lc[c] = labels[r * nc + c];
      sc[c] = shapes[r * nc + c];
    }
    rule(nc, width);
    cell_row(lc, nc, width);
    cell_row(sc, nc, width);
  }
  rule(nc, width);
  return val_incref(VAL_NONE);
}

/* ==== registration ============================================================== */

/* P(...) == P(...): the same entries, as JAX's PartitionSpec tuples. */
/* Mesh == Mesh as JAX compares them: the same axes (names, sizes, types)
 * over the same devices; an AbstractMesh equals only an AbstractMesh. */
static bool mesh_equal(Value *a, Value *b) {
  const Mesh *x = (const Mesh *)a, *y = (const Mesh *)b;
  return x->abstract == y->abstract && mesh_same(x, y) &&
         !memcmp(x->axis_types, y->axis_types, sizeof(x->axis_types[0]) * (size_t)x->naxes);
}

/* A mesh's hash as a dict key: its axes' names and sizes (equal meshes,
 * as mesh_equal says, hash alike). */
static bool mesh_hash(Value *v, uint64_t *h) {
  const Mesh *m = (const Mesh *)v;
  uint64_t acc = 0x4d455348u + (uint64_t)m->abstract;
  for (int i = 0; i < m->naxes; i++)
    acc = acc * 31 + (uint64_t)(uintptr_t)m->axis_names[i] * 7 + (uint64_t)m->axis_sizes[i];
  *h = acc;
  return true;
}

static bool pspec_equal(Value *a, Value *b) { return pspec_same((PSpec *)a, (PSpec *)b); }

bool pspec_same(const PSpec *x, const PSpec *y) {
  if (x->n != y->n) return false;
  for (int i = 0; i < x->n; i++) {
    if (x->e[i].nnames != y->e[i].nnames) return false;
    for (int k = 0; k < x->e[i].nnames; k++)
      if (x->e[i].names[k] != y->e[i].names[k]) return false;
  }
  return true;
}

/* ==== the context mesh: `with m:` and jax.set_mesh ============================ */

/* `with m:` blocks, innermost last (borrowed: the with statement holds
 * each), over the mesh jax.set_mesh set (owned).  The main thread's. */
static Mesh *with_stack[64];
static int with_depth;
static Mesh *set_mesh_current;

Mesh *mesh_context(void) {
  return with_depth ? with_stack[with_depth - 1] : set_mesh_current;
}

static Value *mesh_enter(Value *self) {
  if (with_depth == 64) return err_set(ERR_VALUE, "with: meshes nested more than 64 deep");
  with_stack[with_depth++] = (Mesh *)self;
  return val_incref(self);
}

static int mesh_exit(Value *self) {
  (void)self;
  if (with_depth) with_depth--;
  return 0;
}

/* What jax.set_mesh returns: the mesh it replaced, restored when it is
 * used as a context manager and its block ends. */
typedef struct MeshSetting {
  Opaque base;
  Mesh *mesh, *prev;   /* owned */
} MeshSetting;

static void setting_free(Value *v) {
  MeshSetting *m = (MeshSetting *)v;
  val_decref(&m->mesh->hdr);
  if (m->prev) val_decref(&m->prev->hdr);
}

static Value *setting_enter(Value *self) { return val_incref(&((MeshSetting *)self)->mesh->hdr); }

static int setting_exit(Value *self) {
  MeshSetting *m = (MeshSetting *)self;
  if (set_mesh_current) val_decref(&set_mesh_current->hdr);
  set_mesh_current = m->prev;
  m->prev = NULL;
  if (set_mesh_current) val_incref(&set_mesh_current->hdr);
  return 0;
}

static const OpaqueType setting_type = {"set_mesh", setting_free, NULL, NULL, NULL,
                                        setting_enter, setting_exit};

/* jax.set_mesh(mesh): the mesh of every shard_map that names none, from
 * now on, or within a `with jax.set_mesh(m):` block (JAX's). */
static Value *bi_set_mesh(const CallArgs *a) {
  Value *m;
  if (args_bind("set_mesh", a, "mesh", (Value **[]){&m}) < 0) return NULL;
  if (m->type != V_MESH) return err_set(ERR_TYPE, "set_mesh: expected a Mesh, got %s", val_type_name(m));
  MeshSetting *s = shm_calloc(1, sizeof *s);
  if (!s) return err_nomem();
  val_init(&s->base.hdr, V_OPAQUE);
  s->base.ot = &setting_type;
  s->mesh = (Mesh *)val_incref(m);
  s->prev = set_mesh_current;
  if (s->prev) val_incref(&s->prev->hdr);
  if (set_mesh_current) val_decref(&set_mesh_current->hdr);
  set_mesh_current = (Mesh *)val_incref(m);
  return &s->base.hdr;
}

/* jax.sharding.get_abstract_mesh(): the AbstractMesh of the context mesh
 * (jax.set_mesh, use_mesh, `with m:`), or an empty one when none is set,
 * as JAX's. */
static Value *bi_get_abstract_mesh(const CallArgs *a) {
  if (args_bind("get_abstract_mesh", a, "", NULL) < 0) return NULL;
  Mesh *m = mesh_context();
  return m ? abstract_of(m) : mesh_new_abstract(0, NULL, NULL);
}

int mesh_register(Env *b) {
  val_register_free(V_MESH, mesh_free);
  print_register(V_MESH, mesh_repr, mesh_repr);
  print_register(V_PSPEC, pspec_repr, pspec_repr);
  ops_register_getattr(V_MESH, mesh_getattr);
  ops_register_getattr(V_PSPEC, pspec_getitem_len);
  ops_register_equal(V_PSPEC, pspec_equal);
  ops_register_equal(V_MESH, mesh_equal);
  val_register_key(V_MESH, mesh_hash, mesh_equal);
  eval_register_context(V_MESH, mesh_enter, mesh_exit);
  eval_exec_mesh = exec_mesh;
  if (add_to_ns(b, "jax", "P", bi_pspec, "P(*entries): a PartitionSpec") < 0 ||
      add_class_to_ns(b, "jax.sharding", "PartitionSpec", bi_pspec, "PartitionSpec(*entries)",
                      V_PSPEC) < 0 ||
      add_class_to_ns(b, "jax.sharding", "Mesh", bi_mesh, "Mesh(devices, axis_names)", V_MESH) < 0 ||
      builtins_add_to("jax.sharding", "AxisType", &axis_type_cls.hdr) < 0 ||
      builtins_add(b, "devices", bi_devices, "devices(): ids of every device") < 0 ||
      add_to_ns(b, "jax.sharding", "AbstractMesh", bi_abstract_mesh,
                "AbstractMesh(axis_sizes, axis_names, axis_types=None)") < 0 ||
      add_to_jax(b, "make_mesh", bi_make_mesh, "make_mesh(axis_shapes, axis_names)") < 0 ||
      add_to_jax(b, "set_mesh", bi_set_mesh, "set_mesh(mesh): the mesh of shard_maps naming none") < 0 ||
      add_to_ns(b, "jax.sharding", "use_mesh", bi_set_mesh, "use_mesh(mesh): as jax.set_mesh") < 0 ||
      add_to_ns(b, "jax.sharding", "get_abstract_mesh", bi_get_abstract_mesh,
                "get_abstract_mesh(): the context mesh's AbstractMesh") < 0 ||
      builtins_add(b, "show_sharding", bi_show_sharding,
                   "show_sharding(x, mesh, spec): draw which device holds which block") < 0)
    return -1;
  return 0;
}
