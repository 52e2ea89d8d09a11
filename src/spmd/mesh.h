/*
 * mesh.h - device meshes and partition specs (LANGUAGE.md §3; seed 000).
 *
 * A Mesh names the axes of an n-dimensional grid of devices, row-major:
 * in `mesh m(i=4, j=2)` the device at coordinates (i, j) is the flat index
 * i*2 + j, which maps to device id devices[flat] (the identity unless
 * `devices [...]` gives an explicit order).
 *
 * A PSpec (jax.sharding.PartitionSpec, written P(...)) says, per array
 * axis, which mesh axes split it: None, one name, or a tuple of names
 * (major to minor).  Meshes and specs are immutable once made, so device
 * threads read them freely.
 */
#ifndef SHMAP_MESH_H
#define SHMAP_MESH_H

#include "lang/eval.h"
#include "base/value.h"

#define MESH_MAX_AXES 8

typedef struct Mesh {
  Value hdr;                             /* V_MESH */
  const char *name;                      /* interned variable name, or NULL */
  int naxes;
  const char *axis_names[MESH_MAX_AXES]; /* interned */
  int axis_sizes[MESH_MAX_AXES];
  int size;                              /* product of the sizes */
  int *devices;                          /* owned: device id of each flat index */
  uint8_t axis_types[MESH_MAX_AXES];     /* MeshAxisType of each axis (jax.sharding.AxisType) */
  bool abstract;                         /* jax.sharding.AbstractMesh: names and
                                            sizes only, for lowering; running on it
                                            needs [size] real devices */
} Mesh;

/* jax.sharding.AxisType: how a program treats a mesh axis (shmap(7), THE
 * THREE MODES).  Explicit axes are laid out as Auto ones, and are part of
 * the types: the sharding rules raise JAX's errors where a layout over
 * them is ambiguous (prim.h, Sharding.explicit_axes). */
typedef enum MeshAxisType { MESH_AUTO, MESH_EXPLICIT, MESH_MANUAL } MeshAxisType;

/* One entry of a spec: the mesh axes splitting one array axis. */
typedef struct SpecEntry {
  int nnames;                            /* 0 for None */
  const char *names[MESH_MAX_AXES];      /* interned */
} SpecEntry;

typedef struct PSpec {
  Value hdr;                             /* V_PSPEC */
  int n;                                 /* number of entries (array axes) */
  SpecEntry e[];
} PSpec;

/* Makes a mesh.  [names] interned, [sizes] positive, [devices] the device
 * id of each flat index or NULL for the identity.  Errors: a repeated
 * axis name, a non-positive size, more than MESH_MAX_DEVICES devices (the
 * message names the product of the sizes as given), more devices needed
 * than exist ("mesh m
 * needs 8 devices but only 4 exist; run with --devices 8 or set
 * SHMAP_DEVICES=8"), a devices list of the wrong length, out-of-range or
 * repeated device ids. */
Value *mesh_new(const char *name, int naxes, const char *const *names,
                const int64_t *sizes, const int *devices);
/* jax.sharding.AbstractMesh(axis_sizes, axis_names): a mesh of names and
 * sizes that no device backs (semantics: JAX's AbstractMesh), up to
 * MESH_MAX_DEVICES devices whatever --devices says.  Lowering and tracing
 * work on it; a shard_map run on it needs as many real devices as its size
 * (mesh_check_runnable).  Errors: as mesh_new's, less the device count. */
Value *mesh_new_abstract(int naxes, const char *const *names, const int64_t *sizes);

/* 0 when [m] can run on this process's devices, else -1 with the error
 * "shard_map on AbstractMesh('x': 65536) needs a real mesh of 65536
 * devices, but only 8 exist ...". */
int mesh_check_runnable(const Mesh *m);

/* The most devices a mesh may have: 2^20. */
#define MESH_MAX_DEVICES (1 << 20)

/* Fills the device layer's description of [m] (device.h); the names and
 * device ids stay borrowed from [m]. */
struct MeshDesc;
void mesh_to_desc(const Mesh *m, struct MeshDesc *d);

/* Index of axis [name] (interned) in [m], or -1. */
int mesh_axis(const Mesh *m, const char *name);

/* Whether [a] and [b] are one mesh: the same axes (names, sizes) over the
 * same devices in the same order (either may be NULL: never the same as
 * a mesh). */
bool mesh_same(const Mesh *a, const Mesh *b);

/* Coordinates of flat index [flat] into [coords] (naxes entries). */
void mesh_coords(const Mesh *m, int flat, int *coords);

/* Writes "(i=0, j=1)" for flat index [flat]. */
void mesh_coords_str(const Mesh *m, int flat, char *buf, size_t cap);

/* Converts a P(...) argument list, a tuple or None into a spec.  Each
 * entry: None, a str, or a tuple of str.  Error: "PartitionSpec entries
 * must be None, an axis name or a tuple of axis names, got Array". */
Value *pspec_from_args(int n, Value *const *entries);

/* Writes "P('i', None)" / "P(('j', 'i'), None)" / "P()". */
void pspec_str(const PSpec *s, char *buf, size_t cap);

/* A spec of [n] None entries (P(None, ...)), to be filled in.  New
 * reference, or NULL on out of memory. */
PSpec *pspec_none(int n);

/* [s] with a None entry first: the spec of the same blocks with an
 * unsplit axis in front (a vmap's batch axis).  New reference. */
Value *pspec_prepend_none(const PSpec *s);

/* Checks [s] against mesh [m] for an array of rank [ndim]: names known,
 * no mesh axis named twice, spec no longer than the rank.  [what] names
 * the spec in messages ("in_specs[0]").  0 or -1 with the error set. */
int pspec_check(const PSpec *s, const Mesh *m, int ndim, const char *what);

/* Whether specs [x] and [y] (borrowed) have the same entries: P('x') and
 * P('x', None) differ, as PartitionSpec's == says. */
bool pspec_same(const PSpec *x, const PSpec *y);

/* Product of the sizes of the mesh axes splitting entry [i] (1 if None). */
int pspec_entry_size(const PSpec *s, const Mesh *m, int i);

/* Registers P, PartitionSpec, Mesh, devices, show_sharding, and the
 * `mesh` statement executor. */
int mesh_register(Env *builtins);

/* The context mesh: the innermost `with m:` block's mesh, else the one
 * jax.set_mesh set, else NULL (semantics: JAX's set_mesh and LANGUAGE.md
 * §10, a shard_map that names no mesh uses it).  Borrowed. */
Mesh *mesh_context(void);

#endif
