/*
 * prim.h - the primitive table and the one apply function.
 *
 * Every array operation of the language reaches the machine through
 * prim_apply(): the built-ins (`+`, `sum`, `@`, indexing, psum, ...) are
 * thin layers that turn the user's arguments into a primitive and its
 * parameters (builtins.c), the way jax.numpy is a layer over jax.lax.  So
 * there is one place where an operation is checked (its shape rule), one
 * where it runs (its kernel), and one where the tracer intercepts it (when
 * an operand is a V_TRACER, prim_apply hands the call to prim_trace_hook
 * instead of running it).  Eager and staged semantics cannot drift apart.
 *
 * Operand conventions.  Elementwise primitives (PK_UNARY, PK_BINARY) take
 * operands of one shape and, except where noted (select_n's predicate,
 * convert_element_type), one dtype; the built-ins broadcast (with
 * broadcast_in_dim) and promote (with convert_element_type) first, exactly
 * as jax.numpy does, so plans print as JAX's do.
 *
 * Parameters are named values (Params), named and valued as in jax.lax:
 * reduce_sum[axes=(0,)], broadcast_in_dim[shape=(8, 4) broadcast_dimensions=(1,)],
 * dot_general[dimension_numbers=(((1,), (0,)), ((), ()))], psum[axes=('j',)].
 */
#ifndef SHMAP_PRIM_H
#define SHMAP_PRIM_H

#include "array/array.h"
#include "base/error.h"
#include "base/timeline.h"
#include "base/value.h"

typedef enum { PK_UNARY, PK_BINARY, PK_REDUCE, PK_SHAPE, PK_CONTRACT,
               PK_COLLECTIVE, PK_HIGHER } PrimKind;

typedef enum {
#define PRIM(id, name, nin, nout, kind, kernel) P_##id,
#include "array/prim.def"
#undef PRIM
  P_COUNT
} PrimId;

/* An abstract value: what a shape rule sees and the tracer carries. */
typedef struct AVal {
  DType dtype;
  bool weak;
  int ndim;
  int64_t shape[SHM_MAXDIM];
  uint32_t vma;   /* mesh axes it may vary over (array.h) */
} AVal;

/* Copies [src] into [dst], only as many dimensions as it has (a whole
 * AVal is ~280 bytes, copied with a slow string move). */
static inline void aval_copy(AVal *dst, const AVal *src) {
  dst->dtype = src->dtype;
  dst->weak = src->weak;
  dst->ndim = src->ndim;
  for (int i = 0; i < src->ndim; i++)
    dst->shape[i] = src->shape[i];
  dst->vma = src->vma;
}

#define PRIM_MAX_PARAMS 8

/* Named parameters.  Names are static strings; values are owned. */
typedef struct Params {
  int n;
  struct { const char *name; Value *value; } p[PRIM_MAX_PARAMS];
  /* A params_add got no value (its maker ran out of memory): prim_apply
   * and prim_bind refuse the parameters with the out-of-memory error, so
   * the hundreds of callers that add without checking need not, and a
   * missing parameter is never blamed instead. */
  bool nomem;
} Params;

/* Infers the [nout] output avals from the operands'.  Returns 0, or -1
 * with the error set (the message names the primitive and the shapes, as
 * "dot_general requires contracting dimensions to have the same shape,
 * got (3,) and (4,)"). */
typedef int (*ShapeRule)(const AVal *in, int nin, const Params *p, AVal *out);

/* Computes outputs [out] (allocated by prim_apply from the shape rule's
 * avals; an elementwise output may alias an operand) from [in].  Returns
 * 0, or -1 with the error set (collectives may fail on a mismatch). */
typedef int (*Kernel)(Array **in, int nin, const Params *p, Array **out);

/* The row loops behind elementwise kernels (kernels.h): for a caller that
 * resolves dispatch once.  Binary: o[i] = f(a[i*sa], b[i*sb]) for i < n,
 * strides in elements (0: a broadcast scalar), [o] contiguous.  Unary:
 * y[i] = f(x[i]) over contiguous elements; [y] may equal [x].  A row
 * loop never fails, never splits over cores, never looks at Ctrl-C. */
typedef void (*KernRow2)(const void *a, int64_t sa, const void *b, int64_t sb, void *o,
                         int64_t n);
typedef void (*KernRow1)(const void *x, void *y, int64_t n);

/* Replication rule for the check of LANGUAGE.md §4: the vma set of the
 * outputs given the operands' sets.  NULL means the union of the operands. */
typedef uint32_t (*VmaRule)(const uint32_t *in, int nin, const Params *p);

/* Batching rule (vmap, and xmap's named axes; seed 001): applies the
 * primitive to operands [in] (borrowed) of which operand i carries a
 * batch axis at position in_dims[i] (-1: not batched), writing the [nout]
 * results (new references) to [out] and each result's batch axis to
 * [out_dims] (-1: not batched).  0, -1 with the error set, or
 * BATCH_BY_LOOP (below) for a case the rule leaves to the
 * example-by-example loop.
 * Semantics: JAX's batching rules (jax/_src/interpreters/batching.py). */
typedef int (*BatchRule)(Value **in, const int *in_dims, int nin,
                         const Params *p, Value **out, int *out_dims);

/* JVP rule (forward-mode differentiation, grad): from [primals] and
 * their [tangents] (borrowed; a tangent may be NULL for a symbolic zero)
 * writes [nout] primal results and tangents (new references; a NULL
 * tangent is a symbolic zero).  0, or -1 with the error set.
 * Semantics: JAX's ad.primitive_jvps. */
typedef int (*JvpRule)(Value **primals, Value **tangents, int nin,
                       const Params *p, Value **primals_out,
                       Value **tangents_out);

/* Transpose rule of a primitive linear in the operands marked [linear]
 * (reverse mode): from the cotangents of the results [cts_out] (borrowed;
 * NULL is a zero) and the non-linear operands [in] (the linear ones are
 * NULL, only their avals [in_avals] are known) writes a cotangent (new
 * reference, or NULL for zero) for each linear operand to [cts_in].
 * 0, or -1 with the error set.  Semantics: JAX's ad.primitive_transposes. */
typedef int (*TransposeRule)(Value **cts_out, Value **in, const AVal *in_avals,
                             const bool *linear, int nin, const Params *p,
                             Value **cts_in);

/* A primitive inside a fused loop (transform/fused_loop.c).  An element-wise
 * one gives its float32 loop, d[i] = f(a[i], b[i]) for i < n, where an
 * operand whose flag (va, vb) is false is one element broadcast ([b] NULL
 * for a unary primitive), and, for the four arithmetic operations, the
 * operator the fused loops may join with a neighbour's in one pass ('+',
 * '-', '*', '/'; 0 for none).  The loop gives the kernel's float32
 * values, element by element: a fused plan computes as the unfused one.
 * [sum] marks the reduction that may close a fused run when it sums a
 * float32 value of the run over every axis (reduce_sum).  A layout
 * primitive whose result is a view of its one operand (broadcast_in_dim)
 * gives [dims] instead: for each result dimension the operand dimension
 * it reads (-1: a new dimension), so the fused loop reads the operand at
 * stride 0 where it is broadcast and never materialises the result;
 * 0, or -1 with the error set. */
typedef struct FuseRule {
  void (*loop)(float *d, const float *a, bool va, const float *b, bool vb, int64_t n);
  char op;
  bool sum;
  int (*dims)(const AVal *in, const Params *p, int *src_dim);
} FuseRule;

/* A value's partitioning over a mesh, as the sharding rules see it
 * (GSPMD's sharding over a named mesh; JAX's NamedSharding with its axes
 * numbered): for each array dimension the mesh axes splitting it, major
 * to minor, as a PartitionSpec's entry; the mesh's axis sizes, for the
 * rules that must know whether a split divides a dimension; and the mesh
 * axes over which the value is a partial result that [partial_coll]
 * ("psum", "pmax", "pmin") must complete (a contraction or a reduction
 * over a split dimension).  Plain data, copied freely. */
enum { SHARDING_MAX_AXES = 8 };
typedef struct Sharding {
  int ndim, naxes;
  int axis_sizes[SHARDING_MAX_AXES];
  uint8_t nsplit[SHM_MAXDIM];
  int8_t split[SHM_MAXDIM][SHARDING_MAX_AXES];
  uint32_t partial;
  const char *partial_coll;
  /* the mesh axes of AxisType.Explicit (bits): a layout over them is part
   * of the value's type, so a rule raises JAX's ShardingTypeError where
   * the result's layout over them is ambiguous instead of choosing
   * (shmap(7), THE THREE MODES); the mesh's axis names (borrowed, NULL
   * when unknown) name the layouts in those errors */
  uint32_t explicit_axes;
  const char *const *axis_names;
} Sharding;

/* Sharding rule: how the primitive partitions.  From the operands' avals
 * and shardings [in_sh] writes each result's sharding to [out_sh], and
 * may rewrite an operand's entry of [in_sh] to the sharding it needs it
 * in (the partitioner reshards it first: an all_gather, or a local slice
 * of a replicated value); a result with [partial] bits set needs its
 * collective.  0, or -1 with the error set; or 1 when the blocks do not
 * compute [out_sh], the result's type in Explicit mode (JAX's rule keeps
 * a split the data moves across: a slice, a pad, a concatenation along a
 * split dimension): its operands are then replicated, every device
 * computes the whole result and keeps its block of it.  A primitive
 * without a rule has its operands replicated.  Semantics: GSPMD's
 * propagation rules (JAX's sharding rules), with the heuristics shmap(7)
 * documents. */
typedef int (*ShardingRule)(const AVal *in, Sharding *in_sh, int nin, const Params *p,
                            Sharding *out_sh);

struct CollRules;     /* spmd/collective.h */
struct HigherRules;   /* transform/higher.h */

/* All rules of one primitive, filled by its family's file (src/README.md,
 * "The primitive table"): the array layer's families at start-up
 * (prim_install), the layers above with prim_register (the collectives
 * from spmd/, the higher-order primitives from transform/), the way JAX's
 * lax.py and parallel.py attach rules to the primitives they define. */
/* Compiled plans: the parameters [out] (owned by the caller) of the same
 * primitive reading, as its operand [operand], the input of that
 * operand's transpose by [perm] (rank [ndim]) instead; 1, 0 when that
 * would change the result, -1 with the error set.  dot_general's reads
 * strides, as it does eagerly, where a transpose is a view. */
typedef int (*ThroughTransposeRule)(const Params *p, int operand, int ndim,
                                    const int64_t *perm, Params *out);

/* What one application costs on the device that runs it, as XLA's
 * HloCostAnalysis counts (Compiled.cost_analysis): floating-point
 * operations (a multiply-add is two) and transcendental evaluations
 * (exp, log, sin, ...: counted there, not in flops). */
typedef struct PrimCost {
  double flops, transcendentals;
} PrimCost;
/* Fills [c] (zeroed by the caller) for operands [in] and results [out]
 * under [p]. */
typedef void (*CostRule)(const Params *p, int nin, const AVal *in, int nout, const AVal *out,
                         PrimCost *c);

/* The cost rules most rows share (prim_rules.c): one flop per result
 * element (element-wise arithmetic and comparisons), one transcendental
 * per result element, one flop per operand element folded into a result
 * (reductions, cumulative ones: input minus output elements). */
void prim_cost_per_element(const Params *p, int nin, const AVal *in, int nout, const AVal *out,
                           PrimCost *c);
void prim_cost_transcendental(const Params *p, int nin, const AVal *in, int nout,
                              const AVal *out, PrimCost *c);
void prim_cost_reduction(const Params *p, int nin, const AVal *in, int nout, const AVal *out,
                         PrimCost *c);

typedef struct PrimRules {
  ShapeRule shape;          /* abstract evaluation; NULL for PK_HIGHER */
  Kernel kernel;            /* eager evaluation; NULL for PK_HIGHER */
  VmaRule vma;              /* replication; NULL: union of the operands */
  BatchRule batch;          /* vmap / xmap; NULL: not implemented yet */
  JvpRule jvp;              /* grad, jvp; NULL: not implemented yet */
  TransposeRule transpose;  /* grad, vjp; NULL: not linear, or not yet */
  unsigned dtypes;          /* operand dtypes accepted (bits over DType) */
  unsigned kept;            /* operands (bits) the kernel must not write
                               its result over; the others may be reused */
  bool updates_operand;     /* the result is operand 0 with some elements
                               changed (dynamic_update_slice, scatter): the
                               kernel writes it over operand 0 when that is
                               dead (prim_apply: held by no one else; a
                               compiled plan: its last use, compile.c), as
                               XLA updates a dead buffer in place */
  const FuseRule *fuse;     /* in a fused loop; NULL: runs its kernel */
  ShardingRule sharding;    /* partitioning; NULL: operands replicated */
  ThroughTransposeRule through_transpose; /* plans; NULL: a transpose read is copied */
  CostRule cost;            /* flops, transcendentals; NULL: moves data only */
  /* ---- the layers above's own rules, typed by them ---- */
  const struct CollRules *coll;  /* named-axis rules (spmd/collective.h);
                                    NULL: the primitive names no axis */
  const struct HigherRules *higher; /* transform/higher.h: cond ... pdot; NULL: first-order */
} PrimRules;

typedef struct PrimInfo {
  const char *name;   /* jax.lax name */
  int nin, nout;      /* -1: variadic / decided by the parameters */
  PrimKind kind;
  PrimRules rules;
} PrimInfo;

/* The table, indexed by PrimId.  Written only before the device threads
 * start (prim.c's static rules, then prim_register); read-only after. */
extern PrimInfo prim_table[P_COUNT];

/* Installs [rules] (copied) for primitive [id]; a family's file calls it
 * for the primitives whose rules it holds (the array layer's at load, a
 * layer above at start-up).  Not thread-safe: call before any device
 * thread runs. */
void prim_register(PrimId id, const PrimRules *rules);  /* hook */

/* One primitive's row as a family's file lists it; prim_register_rows
 * registers [n] of them. */
typedef struct PrimRow {
  PrimId id;
  PrimRules rules;
} PrimRow;
void prim_register_rows(const PrimRow *rows, size_t n);  /* hook */

/* Sets the error "<what> of '<name>' is not implemented" (e.g. "grad of
 * 'cumsum' is not implemented") and returns -1: what a transformation
 * says when the rule it needs is missing from the table. */
int prim_rule_missing(PrimId id, const char *what);

/* Finds a primitive by its jax.lax name; -1 if none. */
int prim_lookup(const char *name);

/*
 * Applies primitive [id] to [nin] operands (borrowed; each a V_ARRAY, or a
 * V_TRACER while tracing) with parameters [p] (borrowed).  Returns a new
 * reference: the result Array when nout == 1, else a Tuple of Arrays.
 * NULL with the error set when the shape rule or kernel fails.
 * Operands with refcount 1 may be reused as the output buffer.
 * Thread-safe: called concurrently from every device thread.
 */
Value *prim_apply(PrimId id, int nin, Value **in, const Params *p);

/*
 * As prim_apply for a two-operand elementwise primitive (add ... ge: kind
 * PK_BINARY, arity 2) on [x] and [y] (borrowed), with no parameters.
 * [kept] says which operands must never be overwritten as the result
 * whatever their reference count (bit 0: x, bit 1: y): operands borrowed
 * from a binding that outlives the call, as the evaluator's names are.
 * Operands that already agree (arrays of one dtype the primitive accepts,
 * one shape or a 0-d one, varying over no mesh axis) take a short way
 * that builds no avals; any other case is prim_apply's, with the kept
 * operands held across it.  The result, its dtype and weak type and the
 * errors are prim_apply's.  Thread-safe.
 */
Value *prim_apply_binary(PrimId id, Value *x, Value *y, unsigned kept);

/*
 * prim_apply_binary written into [dst] (borrowed) instead of a new array,
 * for arrays [x], [y] and [dst] (the caller has checked their type),
 * where that gives the same array: [x] and [y] agree as above, the result
 * has [dst]'s dtype and shape and is small enough for one row loop (no
 * timeline being written), and [dst] is a contiguous array nothing else
 * holds or views (its one reference is the caller's binding, a value
 * about to be replaced by the result).  [dst] may be [x] or [y] itself:
 * each element is read before the one in its place is written.  True
 * when done ([dst] then holds the result, weak type included, varying
 * over no axis); false, with nothing changed and no error set, when the
 * result must be made the usual way.  Thread-safe for a [dst] no other
 * thread reaches.  Why: a loop's `c = a + b` writes into c's buffer
 * instead of freeing one array and making another.
 */
bool prim_binary_into(PrimId id, Value *x, Value *y, Value *dst);

/* As prim_apply, for rules that build from primitives: the operands are
 * held across the call (none becomes the output, so the caller may use
 * them again), a NULL operand gives NULL (the error its maker set), and
 * [p] (NULL: no parameters) is consumed.  A broadcast_in_dim of a
 * concrete, unsharded operand is staged (prim_bind) while this thread
 * traces, as JAX stages full_like: a rule's constant (zeros, ones, a
 * reduction's cotangent) is an equation of the plan, a stride-0 view
 * there, not an array of the full shape captured as a constvar. */
Value *prim_apply_rule(PrimId id, int nin, Value **in, Params *p);

/* Set by the tracer: called instead of the kernel when an operand is a
 * V_TRACER.  Same contract as prim_apply. */
extern Value *(*prim_trace_hook)(PrimId id, int nin, Value **in, const Params *p);  /* hook */

/* Set by the evaluator: the source line running on this thread, for the
 * provenance of values that vary over mesh axes (array.h, VmaWhy). */
extern int (*prim_line_hook)(void);  /* hook */

/* Why a result that varies over the mesh axes [out_vma] (bits) does, for
 * the replication error's explanation (array.h, VmaWhy): primitive [id]
 * at source line [line] when it adds axes none of its [nin] operands
 * varies over ([in_vma], their union), else an operand's reason ([why],
 * nin of them) for axes it shares with the result, a primitive's
 * (axis_index, a collective) before an argument's, whose axes in_specs
 * and out_specs usually both name, and of arguments the one explaining
 * the most of the result's axes; {0} when none explains it.  One rule
 * for eager results and for a traced body's variables (plan_vma_whys). */
VmaWhy prim_vma_why(PrimId id, int line, int nin, const VmaWhy *why, uint32_t in_vma,
                    uint32_t out_vma);

/* The sharding of eager results (spmd/sharding.c): when an operand of
 * prim_apply is a sharded jax.Array (Array.sharding), the results' are
 * what the primitive's sharding rule makes them, as JAX's eager dispatch
 * is a jit of one primitive.  Fills [out] with new references (NULL:
 * unsharded) before the kernel runs; 0, or -1 with the error set. */
typedef int (*PrimShardingHook)(PrimId id, Array *const *in, int nin, const Params *p,
                                const AVal *outv, int nout, Value **out);
extern PrimShardingHook prim_sharding_hook;  /* hook */

/* Eager primitives on sharded operands run per device
 * (transform/partition_eager.c): called by prim_apply, before the
 * kernel, when an operand is a sharded jax.Array.  Returns prim_apply's
 * result, NULL with the error set, or PRIM_DECLINED when the primitive
 * runs here on the global value instead (its results laid out by
 * prim_sharding_hook).  Semantics: JAX's eager dispatch, a jit of one
 * primitive partitioned from its operands' shardings. */
typedef Value *(*PrimShardedRunHook)(PrimId id, Array *const *in, int nin, const Params *p);
extern PrimShardedRunHook prim_sharded_run_hook;  /* hook */
extern const Value prim_declined;
#define PRIM_DECLINED ((Value *)&prim_declined)

/* Set by the tracer: whether this thread is tracing now.  NULL (never
 * tracing) until the transform layer is registered. */
extern bool (*prim_tracing_hook)(void);  /* hook */

/* Whether this thread is staging a plan (jit): the layers under the
 * tracer ask it where JAX would look for the current trace. */
bool prim_tracing(void);

/* As prim_apply, but while this thread traces the call is staged even
 * when no operand is a tracer (axis_index has none; a constant operand
 * of a collective): JAX's Primitive.bind, which finds the current trace.
 * Same contract as prim_apply. */
Value *prim_bind(PrimId id, int nin, Value **in, const Params *p);

/* Runs primitive [id]'s kernel on [in] into [out] (prim_apply's and the
 * compiled executor's one way to a kernel): Kernel's contract.  While the
 * timeline records (base/timeline.h), puts the primitive on it, named by
 * the primitive with its result's aval as argument; collectives are put
 * there by the collective engine, with their waits.  At Ctrl-C (a long
 * kernel stops between chunks) it fails with ERR_INTERRUPT. */
int prim_run_kernel_timed(PrimId id, Array **in, int nin, const Params *p, Array **out);
int prim_interrupted(void);
static inline int prim_run_kernel(PrimId id, Array **in, int nin, const Params *p, Array **out) {
  int rc = __builtin_expect(tl_recording(), 0) ? prim_run_kernel_timed(id, in, nin, p, out)
                                             : prim_table[id].rules.kernel(in, nin, p, out);
  /* a long kernel stops early at Ctrl-C: its result must never be seen */
  if (rc == 0 && __builtin_expect(shm_interrupt_pending(), 0)) return prim_interrupted();
  return rc;
}

/* The row loop of binary elementwise primitive [id] over operands of
 * dtype [t], resolved when its kernel was registered: NULL for other
 * primitives, refused dtypes and bf16/f16 (which go through f32). */
KernRow2 prim_binary_row(PrimId id, DType t);

/* The element stride at which a row loop reads operand [a] of an
 * elementwise operation into [o] (contiguous): 1 when [a] is contiguous
 * of o's size, 0 for one element (broadcast), a's own stride when both
 * are 1-d (a broadcast ones(8)).  False for any other layout. */
static inline bool prim_row_stride(const Array *a, const Array *o, int64_t *stride) {
  if (a->size == o->size && (a->contiguous || (a->ndim == 1 && o->ndim == 1))) {
    *stride = a->contiguous ? 1 : a->strides[0];
    return true;
  }
  *stride = 0;
  return a->size == 1;
}

/* The most results a primitive's sharding rule lays out (prim_sharding). */
enum { PRIM_MAX_OUTS = 4 };

/* Primitive [id]'s layout on [nin] operands of avals [in] laid out as
 * [in_sh] over one mesh, for [nout] results of avals [out] (at most
 * PRIM_MAX_OUTS; [out_sh], nout entries, has the mesh's axes filled by
 * the caller, as the operands' are; a rule of a primitive with several
 * results writes each): its
 * sharding rule, kept only when each device's blocks compute its block
 * of each result: every split dimension divides evenly and the shape rule
 * on the blocks' avals gives the result blocks' avals, a "shape" or
 * "new_sizes" parameter (broadcast_in_dim, reshape) made the block's in
 * [*local] (params_init'ed by the caller; filled, and then owned by the
 * caller, only when [*has_local]).  1 with [in_sh] rewritten to the
 * operands' layouts and [out_sh] the result's (its partial axes to
 * complete); 0 when the rule does not apply (no rule, a higher-order
 * primitive, blocks that do not compute it: the operands then
 * replicated, [in_sh] so written, and [out_sh] replicated but, for one
 * result, for the rule's splits over Explicit axes that divide evenly,
 * the result's type, which each device slices its block of); -1 with the
 * error set (a rule's parameter error, or Explicit mode's
 * ShardingTypeError where the result's layout over Explicit axes is
 * ambiguous: Sharding.explicit_axes).  One decision for eager results
 * (spmd/sharding.c) and jit (transform/partition.c), so both lay results
 * out alike.  Semantics: GSPMD's propagation, shmap(7) THE THREE MODES. */
int prim_sharding(PrimId id, const AVal *in, Sharding *in_sh, int nin, const Params *p,
                  const AVal *out, int nout, Sharding *out_sh, Params *local, bool *has_local);

/* How often [id]'s sharding rule was kept (prim_sharding returned 1) with
 * some operand split: its devices computed on blocks.  For tests
 * (jax._primitive_table). */
long prim_sharding_runs(PrimId id);

/* The name of the primitive whose sharding rule this thread runs
 * (prim_sharding sets it; "" outside): Explicit mode's errors start with
 * it, as JAX's ("add got incompatible shardings ..."). */
const char *prim_sharding_op(void);

/* Computes output avals without running anything (the tracer uses it). */
int prim_infer(PrimId id, const AVal *in, int nin, const Params *p, AVal *out);

/* The aval of an array. */
void aval_of(const Array *a, AVal *out);

/* The aval of an operand: an Array's, or a tracer's through the hook the
 * tracer sets (prim_aval_hook).  0, or -1 with the error set ("expected
 * an array, got 'str'"). */
int prim_value_aval(Value *v, AVal *out);
extern int (*prim_aval_hook)(Value *v, AVal *out);  /* hook */

/* Whether tracer [v] stands for a variable of a plan being staged (jit),
 * rather than a value being transformed (differentiated, batched): set
 * by the tracer.  False for anything else. */
bool prim_value_is_staged(const Value *v);
extern bool (*prim_staged_hook)(const Value *v);  /* hook */

/* ---- what the transformations borrow of the rules ----------------------- */

/* Zeros of aval [a] (a concrete Array, new reference), the cotangent of an
 * operand no path reaches.  NULL on nomem. */
Value *prim_zeros(const AVal *a);

/* a + b for two cotangents of one aval (new reference); NULL operands are
 * zeros: returns the other (new reference), or NULL when both are. */
Value *prim_add_any(Value *a, Value *b);

/* take_along_axis: [x]'s elements at the int positions [idx] along axis
 * [axis] (idx of x's shape but along that axis; every other axis of
 * idx's length 1 or x's), as one gather of the rows flattened, so it
 * differentiates and stages (semantics: NumPy's take_along_axis, JAX's
 * default clamping of out-of-range positions).  A new reference, or NULL
 * with the error set. */
Value *prim_take_along(Value *x, Value *idx, int axis);

/* prim_take_along with [osh] (borrowed; NULL: none) the out_sharding of
 * its reshapes and gather: in Explicit mode the caller has typed the
 * result (JAX's rule of one gather with batch dimensions, or of sort)
 * and lays it out so, so the steps' own layouts raise nothing. */
Value *prim_take_along_sh(Value *x, Value *idx, int axis, Value *osh);

/* What a batching rule returns for a case it does not cover: the
 * interpreter then applies the primitive one example at a time. */
#define BATCH_BY_LOOP 1

/* The batch size: the length of the first batched operand's batch axis
 * ([dims][i] >= 0), or 1 when none is batched. */
int64_t prim_batch_size(Value **in, const int *dims, int nin);

/* [x] (borrowed) with axis [from] moved to position [to] (a transpose;
 * a new reference, or NULL with the error set). */
Value *prim_batch_moveaxis(Value *x, int from, int to);

/* [x] repeated [b] times along a new leading axis, its own axes after it
 * (a new reference, or NULL with the error set). */
Value *prim_batch_repeat_front(Value *x, int64_t b);

/* ---- parameters ---------------------------------------------------------- */

void params_init(Params *p);
/* Adds [name] = [v], stealing [v].  Returns 0, -1 on NULL v or a tuple
 * that is not complete (tuple_complete): the error is kept, [p] is marked
 * (Params.nomem). */
int params_add(Params *p, const char *name, Value *v);
/* Borrowed value of [name], or NULL (no error) when absent. */
Value *params_get(const Params *p, const char *name);
/* Reads an int / a tuple of ints / a dtype / a bool parameter; -1 with
 * the error set when absent or of the wrong type. */
int params_int(const Params *p, const char *name, int64_t *out);
int params_ints(const Params *p, const char *name, int *n, int64_t *out, int cap);
int params_dtype(const Params *p, const char *name, DType *out);
int params_bool(const Params *p, const char *name, bool *out);
/* Releases the values. */
/* Whether two parameter values are equal for caching and CSE: the same
 * value (dtypes are immortal), 0-d arrays of one dtype and value,
 * strings, and tuples of them; anything else only when identical (so a miss, never a false hit). */
bool param_value_equal(Value *a, Value *b);

/* Whether [a] and [b] hold the same parameters in the same order, by
 * param_value_equal. */
bool params_equal(const Params *a, const Params *b);

void params_clear(Params *p);

/* Value makers for parameters and shapes: a weakly typed int (i32 when it
 * fits, else i64; arr_python_int's, so -5..256 are shared and immortal,
 * never to be written) and a tuple of ints. */
Value *val_int(int64_t x);
Value *val_int_tuple(int n, const int64_t *xs);

/* dot_general's dimension_numbers ((lc, rc), (lb, rb)) from [nc]
 * contracting and [nb] batch dimension pairs (semantics: jax.lax.dot_general).
 * A new reference, or NULL on out of memory (nothing leaked). */
Value *val_dot_dimension_numbers(int nc, const int64_t *lc, const int64_t *rc, int nb,
                                 const int64_t *lb, const int64_t *rb);

/* Whether [v] is one of the dimension_numbers val_dot_dimension_numbers
 * handed out from its cache; if so its [nc] contracting and [nb] batch
 * pairs into [d] (lhs contracting, rhs contracting, lhs batch, rhs
 * batch): the rules of a product a transformation traces read them
 * without walking the tuples.  Any thread; no error. */
bool prim_dot_dims_known(const Value *v, int *nc, int *nb, int64_t d[4][SHM_MAXDIM]);

#endif
