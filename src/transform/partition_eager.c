/*
 * partition_eager.c - eager primitives on sharded arrays, run per device
 * (prim.h, prim_sharded_run_hook; shmap(7), THE THREE MODES).
 *
 * JAX dispatches an eager primitive as a jit of that one primitive, so
 * `x_sharded * 2` or `jnp.sum(x_sharded)` is partitioned from the
 * operands' shardings exactly as the same code under jit is.  shmap does
 * the same: a primitive with a sharding rule and an operand split over a
 * mesh runs as the jit of one equation (jit.c's partitioned call: the
 * per-device program on the device threads, with the collectives
 * propagation inserts), so eager and jit agree on values bit for bit
 * (a reduction over a split dimension adds each device's block, then
 * psums, in both) and on the results' shardings.
 *
 * Declined (the primitive runs on the global value, its results laid out
 * by the sharding hook, which gives the same values): on a device thread
 * (a sharded array a shard_map body closes over), inside such a call
 * (the partitioned call's own host steps), for a primitive without a
 * sharding rule (propagation would replicate its operands and compute
 * the whole result on every device: the same values), when no operand
 * is split (every device would compute the global value), and for an
 * operation whose values do not depend on where it runs, in one
 * process.  A round trip through the devices costs a few hundred
 * microseconds on a busy machine, against a microsecond for a small
 * kernel, and the global kernels use every core from 2^20 elements;
 * only an operation that adds across blocks (sum, product, contraction,
 * cumulative sum: the psum of the blocks' partial results orders the
 * additions differently) gives other bits per device, so it always runs
 * there.  So does every operation on an array holding only its
 * process's blocks (array.h), whose other blocks it must not read, and,
 * under mpirun, every one from EAGER_SPLIT_MIN elements, where each
 * process computes only its own devices' blocks (and keeps only those
 * when the result's layout lets it).
 *
 * The jit of each (primitive, parameters) is kept in a small cache; its
 * own cache holds a trace per operand signature (shapes, dtypes,
 * shardings).  Main thread only (device threads decline); a mutex keeps
 * the cache whole should another host thread ever dispatch.
 */
#include <pthread.h>
#include <string.h>

#include "array/prim.h"
#include "base/mem.h"
#include "spmd/device.h"
#include "spmd/sharding.h"
#include "spmd/transport.h"
#include "transform/jit.h"
#include "transform/partition.h"

/* One primitive with its parameters, callable: the function the jit of
 * an eager primitive traces. */
typedef struct PrimCall {
  Opaque base;
  PrimId id;
  Params params;   /* owned */
} PrimCall;

static void primcall_free(Value *v) { params_clear(&((PrimCall *)v)->params); }

static const OpaqueType primcall_type = {"primitive", primcall_free, NULL, NULL, NULL, NULL, NULL};

static Value *primcall_call(Value *self, const CallArgs *a) {
  PrimCall *c = (PrimCall *)self;
  return prim_bind(c->id, a->nargs, a->args, &c->params);
}

enum { EAGER_SLOTS = 64 };

typedef struct Slot {
  PrimCall *call;   /* owned; NULL: empty */
  int nin;
  Value *jit;       /* owned: jax.jit of the bound call */
} Slot;

static Slot slots[EAGER_SLOTS];
static int next_slot;
static pthread_mutex_t slots_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local bool running;   /* inside a partitioned eager call */

/* The jit of [id] on [nin] operands with [p] (borrowed): a new reference
 * from the cache, made now if missing; NULL with the error set. */
static Value *eager_jit(PrimId id, int nin, const Params *p) {
  pthread_mutex_lock(&slots_lock);
  for (int i = 0; i < EAGER_SLOTS; i++) {
    Slot *s = &slots[i];
    if (s->call && s->call->id == id && s->nin == nin && params_equal(&s->call->params, p)) {
      Value *j = val_incref(s->jit);
      pthread_mutex_unlock(&slots_lock);
      return j;
    }
  }
  pthread_mutex_unlock(&slots_lock);
  PrimCall *c = shm_calloc(1, sizeof(PrimCall));
  if (!c) return err_nomem();
  val_init(&c->base.hdr, V_OPAQUE);
  c->base.ot = &primcall_type;
  c->id = id;
  params_init(&c->params);
  for (int i = 0; p && i < p->n; i++)
    params_add(&c->params, p->p[i].name, val_incref(p->p[i].value));
  Value *b = c->params.nomem ? NULL : bound_new(prim_table[id].name, primcall_call, &c->base.hdr);
  Value *j = b ? jit_new(b, 0, NULL, 0, NULL) : NULL;
  if (b) val_decref(b);
  if (!j) {
    val_decref(&c->base.hdr);
    return err_kind() ? NULL : err_nomem();
  }
  pthread_mutex_lock(&slots_lock);
  Slot *s = &slots[next_slot];
  next_slot = (next_slot + 1) % EAGER_SLOTS;
  if (s->call) val_decref(&s->call->base.hdr), val_decref(s->jit);
  *s = (Slot){c, nin, val_incref(j)};
  pthread_mutex_unlock(&slots_lock);
  return j;
}

/* Operations from this many elements run per device whatever they are. */
enum { EAGER_SPLIT_MIN = 1 << 16 };   /* under mpirun */

/* Whether [id] adds across the blocks of a split dimension, so that per
 * device its bits are the partitioned jit's, not the global kernel's. */
static bool accumulates(PrimId id) {
  return id == P_REDUCE_SUM || id == P_REDUCE_PROD || id == P_DOT_GENERAL || id == P_CUMSUM ||
         id == P_CUMPROD;
}

/* Whether [id] on [in] is worth (or needs) the devices: see above. */
static bool per_device(PrimId id, Array *const *in, int nin) {
  if (accumulates(id)) return true;
  for (int i = 0; i < nin; i++)
    if (in[i]->buf->part || (in[i]->size >= EAGER_SPLIT_MIN && transport_active())) return true;
  return false;
}

/* Whether some operand is split over its mesh, all sharded ones over one
 * mesh, those replicated over another of its devices counting as
 * unsharded (sharding_unsharded_over; else the global way raises JAX's
 * error of mixed meshes). */
static bool split_over_one_mesh(Array *const *in, int nin) {
  const NamedSharding *ref = sharding_operands_ref(in, nin);
  bool split = false;
  for (int i = 0; i < nin; i++) {
    if (in[i]->vma) return false;
    const NamedSharding *s = (const NamedSharding *)in[i]->sharding;
    if (!s || !s->mesh) continue;
    if (!mesh_same(ref->mesh, s->mesh)) {
      if (sharding_unsharded_over(s, ref->mesh)) continue;
      return false;
    }
    for (int d = 0; d < s->spec->n && !split; d++)
      split = pspec_entry_size(s->spec, s->mesh, d) > 1;
  }
  return split;
}

/* prim_sharded_run_hook. */
static Value *eager_sharded(PrimId id, Array *const *in, int nin, const Params *p) {
  if (running || dev_ctx() || !prim_table[id].rules.sharding || !per_device(id, in, nin) ||
      !split_over_one_mesh(in, nin))
    return PRIM_DECLINED;
  Value *j = eager_jit(id, nin, p);
  if (!j) return NULL;
  CallArgs c = {.nargs = nin, .args = (Value **)in};
  running = true;
  Value *r = jit_call(j, &c);
  running = false;
  val_decref(j);
  return r;
}

void partition_eager_register(void) { prim_sharded_run_hook = eager_sharded; }
