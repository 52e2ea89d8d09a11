/*
 * sharding.h - sharded jax.Arrays: NamedSharding, SingleDeviceSharding,
 * device objects, jax.device_put and the layout of eager results
 * (semantics: JAX's jax.sharding module and "Distributed arrays and
 * automatic parallelization"; shmap(7), THE THREE MODES).
 *
 * A sharded array is an Array whose [sharding] is a NamedSharding
 * (array.h): a mesh and a PartitionSpec.  Its values are the global
 * array's; device d's shard is the view of the block the spec gives it,
 * the block shard_map's in_specs would give it.  NamedShardings are
 * immutable once made, so device threads read them freely.
 *
 * Under mpirun, jax.device_put and make_array_from_callback of an array
 * of SHMAP_PARTIAL_MIN elements or more (default 1: any) keep only this
 * process's blocks, whatever the layout, when some are on other
 * processes' devices only (array.h, "Process-local shards";
 * make_array_from_callback then calls data_callback for this process's
 * devices only, as JAX does);
 * a read of the rest materialises the whole array on every process.
 */
#ifndef SHMAP_SHARDING_H
#define SHMAP_SHARDING_H

#include "array/prim.h"
#include "spmd/mesh.h"

/* jax.sharding.NamedSharding(mesh, spec), or SingleDeviceSharding(device)
 * when [mesh] is NULL.  Both references owned. */
typedef struct NamedSharding {
  Opaque base;
  Mesh *mesh;      /* NULL for a SingleDeviceSharding */
  PSpec *spec;     /* P() for a SingleDeviceSharding */
  int device;      /* a SingleDeviceSharding's device id, else -1 */
} NamedSharding;

/* Whether [v] is a NamedSharding or SingleDeviceSharding value. */
bool sharding_is(const Value *v);

/* A new NamedSharding of [mesh] and [spec] (borrowed; the spec is not
 * checked here).  NULL on out of memory. */
Value *sharding_new(Mesh *mesh, PSpec *spec);

/* Checks that [s] can lay out an array of rank [ndim] and [shape]: the
 * spec's axes are the mesh's, used once, no longer than the rank, and
 * each split dimension is a multiple of its number of blocks (JAX's
 * error for an uneven shard_shape).  0, or -1 with the error set. */
int sharding_check(const NamedSharding *s, int ndim, const int64_t *shape);

/* Fills the sharding rules' view of [s] (prim.h, Sharding) for rank
 * [ndim]: each spec entry's mesh axes by index, and the mesh's as below. */
void sharding_to_rule(const NamedSharding *s, int ndim, Sharding *out);

/* Fills [out]'s mesh-wide fields from [m] (NULL: none): its Explicit
 * axes (the rules' errors of Explicit mode) and its axis names
 * (borrowed from [m]: valid while it lives). */
void sharding_rule_mesh(const Mesh *m, Sharding *out);

/* The mesh axes (bits) jax.sharding.auto_axes makes Auto on this thread
 * now: the rules see them as Auto (no Explicit-mode errors), eagerly
 * and, through the equations' PlanEqn.auto_axes, under jit. */
uint32_t sharding_auto_axes(void);

/* The NamedSharding of [mesh] (borrowed) that [r] describes, with its
 * partial axes completed (replicated): a layout inferred by the rules.
 * Over a mesh with no Explicit axis the spec ends at its last split
 * dimension (P('x') for rows of a matrix, P() replicated), as JAX reads
 * a compiled output's layout back (parse_flatten_op_sharding drops the
 * trailing unsplit dimensions); over Explicit axes it is the type's, one
 * entry per dimension.  New reference or NULL. */
Value *sharding_from_rule(Mesh *mesh, const Sharding *r);

/* [out] (a NamedSharding inferred for a result of [ndim] dimensions;
 * consumed) or, when it lays out alike and [user] (borrowed; the first
 * operand's NamedSharding, of an operand of [user_ndim] dimensions) has
 * as many dimensions over a mesh with no Explicit axis, [user] itself,
 * its spec as the user wrote it: P('x', None) stays so.  JAX recovers a
 * compiled output's sharding so (pxla.py, maybe_recover_user_shardings).
 * New reference; NULL when [out] is NULL. */
Value *sharding_as_users(Value *out, int ndim, const Value *user, int user_ndim);

/* As sharding_from_rule, the spec one entry per dimension always (a
 * partitioned plan's shard_map in_specs and out_specs, as written). */
Value *sharding_from_rule_spec(Mesh *mesh, const Sharding *r);

/* [x] (an array, borrowed) laid out by [s] (borrowed): a view of the same
 * values marked sharded (or unsharded for a SingleDeviceSharding).  New
 * reference or NULL with sharding_check's error. */
Value *sharding_put(Value *x, const NamedSharding *s);

/* Whether [sharding] (borrowed, may be NULL) is NamedSharding([m],
 * [spec]): a shard_map whose in_spec is [spec] then gives each device
 * the block the array's layout gives it (process-local shards, array.h,
 * need no materialising). */
bool sharding_lays_out(const Value *sharding, const Mesh *m, const PSpec *spec);

/* Whether an operand laid out by [s] (borrowed, may be NULL) joins an
 * operation over mesh [m] as an unsharded one: it is unsharded, or
 * replicated over another mesh of m's devices in m's order whose axes
 * are none Explicit.  JAX's jit compares its arguments' device
 * assignments, not their meshes, so a result replicated over one mesh
 * meets arrays laid out over another of the same devices; Explicit
 * types must share a mesh (JAX: "Mesh for all inputs should be equal").
 * A false answer for a mesh of other devices leaves the caller's
 * error of mixed meshes standing. */
bool sharding_unsharded_over(const NamedSharding *s, const Mesh *m);

/* The sharding whose mesh an operation on [in] (nin arrays, borrowed)
 * runs over: the first operand's split over its mesh, else the first
 * one laid out over a mesh; NULL when none is.  Borrowed. */
const NamedSharding *sharding_operands_ref(Array *const *in, int nin);

/* Whether an array of rank [nd] and [shape] laid out by [s] holds only
 * this process's blocks (array.h, "Process-local shards"): under mpirun,
 * of SHMAP_PARTIAL_MIN elements or more, some of its blocks on no device
 * of this process and some on one.  When true, nblk[0..nd) is the grid
 * of its blocks and *held a new array (shm_free) of their flags, as
 * arr_set_partial takes them. */
bool sharding_local_blocks(const NamedSharding *s, int nd, const int64_t *shape, int64_t *nblk,
                           uint8_t **held);

/* sharding_local_blocks's answer alone. */
bool sharding_is_local(const NamedSharding *s, int nd, const int64_t *shape);

/* jax.device_put(x, device): each array leaf of tree [x] laid out by
 * [device] (a sharding, a Device, a PartitionSpec over the context mesh,
 * None; or a tuple, list or dict of them matching x's).  New reference
 * or NULL with the error set. */
Value *sharding_device_put(Value *x, Value *device);

/* Registers the row of sharding_constraint (with_sharding_constraint
 * and reshard under a trace) in the primitive table.  At start-up. */
void sharding_register_rules(void);

/* Registers the types, the eager-result hook (prim_sharding_hook) and
 * the built-ins: jax.sharding.NamedSharding, SingleDeviceSharding,
 * jax.device_put, device_get, make_array_from_callback, devices,
 * local_devices, device_count, local_device_count, process_index,
 * process_count, jax.debug.visualize_array_sharding,
 * jax.lax.with_sharding_constraint, and the arrays' attributes sharding,
 * addressable_shards, is_fully_addressable, is_fully_replicated. */
int sharding_register(Env *builtins);

#endif
