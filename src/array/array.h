/*
 * array.h - n-dimensional arrays: one buffer, a shape, strides and an offset.
 *
 * Layout.  An Array is a view: [ndim] sizes in shape[], strides[] counted
 * in ELEMENTS (not bytes), and a start [offset] in elements into a
 * reference-counted Buffer.  A fresh array is C-contiguous (row-major)
 * with offset 0.  reshape of a contiguous array, transpose, basic slices,
 * broadcast_to and expand_dims make views sharing the buffer, as NumPy
 * does; everything else writes a new contiguous buffer.
 *
 * Immutability.  Arrays are immutable to the user (x.at[i].set(v) makes a
 * new array).  An array whose own refcount is 1 and whose buffer's refcount
 * is 1 belongs to one holder, which may overwrite it in place; prim.c uses
 * that to reuse temporaries in `x * y + z`.
 *
 * Replication.  [vma] is the set of mesh axes (bit i = axis i of the mesh of
 * the running shard_map) the value may vary over, for the static check of
 * LANGUAGE.md §4; it is 0 outside shard_map bodies.
 *
 * Sharded arrays.  [sharding] marks a global jax.Array laid out over a
 * mesh's devices (jax.device_put, a partitioned jit's results).  The
 * values are the global array's, held once per process; each device's
 * shard is the view of its block.  An eager primitive on a split one
 * runs per device, as the jit of that primitive (prim_sharded_run_hook);
 * otherwise its results are laid out as the primitive's sharding rule
 * says (prim_sharding_hook).  A view, a copy or a kernel's fresh result
 * starts unsharded.
 *
 * Process-local shards.  Under mpirun a large sharded array whose
 * blocks are not all on this process's devices holds only the bytes of
 * those blocks (Buffer.part, whatever the layout): the rest of the
 * buffer is address space whose pages are never touched (where whole
 * pages fall outside the blocks), so a process's memory is its own
 * devices' shards (jax.device_put,
 * make_array_from_callback, a partitioned jit's outputs; spmd/sharding.h,
 * shardmap.h: ShardFn.local_results).  Device threads read only
 * their blocks.  Any other read of a byte outside them (arr_data checks
 * every view of such a buffer, exactly) first materialises the whole array, once,
 * through the devices' collective exchange on every process (the
 * processes run the same program, so they all reach it): JAX asks for
 * process_allgather there, shmap does it when the value is read.
 *
 * Python numbers.  [host] marks a Python int, float or bool that has not
 * met an array function: a literal, len(), True, or the result of Python
 * arithmetic between two of them (lang/ops.c).  It is also weak (an int
 * an int32, a float a float32), and every array function reads it as
 * such, so it becomes a weakly typed array where it meets one, as in
 * JAX.  A host float keeps its exact double beside the float32: its
 * buffer holds 16 bytes, the float32 at byte 0 and the double at byte 8
 * (arr_python_float, arr_host_f64).  Whatever an array function makes is
 * a fresh array with [host] false; a host array is never changed in place
 * (arr_unshared is false for it).
 *
 * Host NumPy arrays.  A buffer with [np] set belongs to host NumPy
 * (`import numpy`, lang/hostnp.h): the arrays viewing it are NumPy
 * arrays, which the host thread writes in place (`a[i] = v`, `a += b`),
 * every view seeing the write.  The rule that keeps this apart from the
 * immutable jax.Arrays: a buffer with [np] set is viewed by NumPy arrays
 * only.  prim_apply settles each result by arr_np_settle: under
 * NumPy's functions (mode ARR_NP_HOST), or for operators and methods
 * whose operands are NumPy arrays and no jax.Array (ARR_NP_AUTO), the
 * result is a NumPy array (a view keeps the buffer; anything else gets
 * a buffer of its own, materialised: no broadcast view of one element);
 * otherwise (ARR_NP_JAX: jax functions, jit, shard_map) a result that
 * would view an [np] buffer is a copy.  Until a script imports numpy
 * ([arr_np_live] false) none of this runs: one load of a flag per
 * primitive.
 *
 * Limits.  ndim <= SHM_MAXDIM; the element count and byte size must fit in
 * int64 and be allocatable: arr_new fails with "array of shape (..) needs N
 * bytes, more than available" rather than crash.
 */
#ifndef SHMAP_ARRAY_H
#define SHMAP_ARRAY_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/value.h"

#define SHM_MAXDIM 32

/* This process's part of a sharded array's buffer under mpirun (see
 * "Process-local shards" above).  The global array is cut by its
 * sharding into a grid of blocks, nblk[d] along dimension d (a block is
 * shape[d] / nblk[d] long); held[] flags, row-major over the grid, the
 * blocks this process's devices hold.  Only their bytes are held: the
 * rest is not (its pages untouched where whole pages fall outside). */
typedef struct PartialBuf {
  Value *sharding;   /* owned: the global array's NamedSharding */
  DType dtype;
  int ndim;
  int64_t shape[SHM_MAXDIM];   /* the global array's (contiguous over the buffer) */
  int64_t nblk[SHM_MAXDIM];    /* blocks along each dimension */
  int64_t ncells;              /* blocks in all: the product of nblk */
  uint8_t *held;               /* owned: ncells flags, 1 for a block held here */
} PartialBuf;

typedef struct Buffer {
  atomic_int refcount;
  size_t nbytes;   /* payload size */
  void *data;      /* 64-byte aligned; points into inline_data for small ones */
  bool owned;      /* data came from shm_buf_alloc and is returned to it */
  bool pinned;     /* a compiled plan's workspace memory (arr_pin): never shared */
  bool np;         /* a host NumPy buffer, writable in place: see "Host NumPy arrays" */
  bool np_ro;      /* ... but read-only (np.broadcast_to's result) */
  bool np_0d;      /* ... of a 0-d NumPy array (np.array(5.0)), not a NumPy scalar */
  int32_t charged; /* 1 + the device whose bytes in use count it (shm_mem_charge), 0: none */
  bool small_pages; /* made of small pages only (shm_huge_pages): a part's gaps stay unbacked */
  PartialBuf *part; /* owned: only this process's blocks are held; NULL: all */
  _Alignas(64) unsigned char inline_data[];  /* payloads of <= 256 bytes */
} Buffer;

/* Where a value's variation over mesh axes comes from, for the error of
 * an out_spec that leaves them out: the primitive that introduced it
 * (axis_index, ppermute, ...) at a source line, or the in_spec of an
 * argument, and the mesh axes that reason explains (a value may vary over
 * others for other reasons: the error names it only for these).  All
 * zero: unknown. */
typedef struct VmaWhy {
  int32_t line;       /* source line of the primitive, 0 if none */
  int16_t prim;       /* PrimId + 1, 0 if none */
  int16_t arg;        /* shard_map argument index + 1, 0 if none */
  uint32_t axes;      /* the mesh axes (vma bits) it makes the value vary over */
} VmaWhy;

typedef struct Array {
  Value hdr;          /* type V_ARRAY */
  DType dtype;
  bool weak;          /* weakly typed (a number literal or derived from one) */
  bool contiguous;    /* C-contiguous: strides are the row-major ones */
  uint8_t ndim;
  bool host;          /* a Python number (int, float, bool), see below */
  uint32_t vma;       /* mesh axes it may vary over, see above */
  VmaWhy why;         /* what first made it vary (for the replication error) */
  Value *sharding;    /* owned: a sharded jax.Array's NamedSharding (spmd/sharding.h),
                         NULL for an unsharded one; see "Sharded arrays" above */
  int32_t device1;    /* 1 + the device jax.device_put(x, device) committed an
                         unsharded array to; 0: device 0 (anything else) */
  int64_t size;       /* number of elements, product of shape */
  int64_t offset;     /* start, in elements, within buf */
  Buffer *buf;        /* owned reference */
  int64_t *shape;     /* ndim sizes, in [dims] */
  int64_t *strides;   /* ndim strides in elements, in [dims] after the sizes */
  int64_t dims[];     /* the storage of both: an array costs 16 bytes a dimension,
                         not SHM_MAXDIM's (a list of numbers holds many 0-d ones) */
} Array;

/* The bytes of an Array header of [ndim] dimensions. */
static inline size_t arr_header_size(int ndim) {
  return sizeof(Array) + 2 * (size_t)ndim * sizeof(int64_t);
}

/* Points [a]'s shape and strides at its own storage for [ndim] dims. */
static inline void arr_set_dims(Array *a, int ndim) {
  a->shape = a->dims;
  a->strides = a->dims + ndim;
}

static inline Array *AS_ARRAY(Value *v) { return (Array *)v; }
static inline bool IS_ARRAY(const Value *v) { return v && v->type == V_ARRAY; }

/* Makes sure the elements view [a] reads are held here: those of a
 * buffer with [part] outside this process's bytes are fetched first (the
 * materialisation, arr_materialize_hook).  A read that cannot be served
 * (on a device thread, or the fetch failed) ends the program with the
 * error: never a read of bytes that were not written. */
void arr_partial_check(const Array *a);

/* Whether every element view [a] reads is held here (always, for a
 * buffer without [part]): exact, element by element, however the view
 * steps through the buffer.  Any thread. */
bool arr_partial_holds(const Array *a);

/* arr_partial_check when [a]'s buffer holds only part of its bytes: for
 * readers that address a->buf->data themselves. */
static inline void arr_check_held(const Array *a) {
  if (__builtin_expect(a->buf->part != NULL, 0)) arr_partial_check(a);
}

/* Pointer to the first element of [a] (its offset applied). */
static inline void *arr_data(const Array *a) {
  if (__builtin_expect(a->buf->part != NULL, 0)) arr_partial_check(a);
  return (char *)a->buf->data + (size_t)a->offset * dt_size(a->dtype);
}

/* Fills the buffer of [a] (any view of a buffer with [part]) whole
 * (every process's blocks), then frees its part and sets it NULL: 0, or
 * -1 with the error set.  Set by the spmd layer; main thread only. */
extern int (*arr_materialize_hook)(Array *a);  /* hook */

/* Makes [g] (a fresh contiguous array, offset 0, sole holder of its
 * buffer) hold only the blocks of [sharding]'s (borrowed) layout that
 * [held] flags (copied: the product of nblk[0..g->ndim) flags, row-major
 * over the grid of nblk[d] blocks along dimension d; at least one 0).
 * The pages wholly outside them are given back to the system (their
 * contents are dropped), and where the gaps between the blocks are not
 * whole huge pages the buffer takes small pages only: best called before
 * anything is written, the blocks then written through g->buf->data (as
 * arr_data would check them).  0, or -1 when out of memory. */
int arr_set_partial(Array *g, Value *sharding, const int64_t *nblk, const uint8_t *held);

/* Calls [fn] for each maximal run [lo, hi) (in elements of the row-major
 * global array, increasing) of the blocks [p] holds. */
void arr_partial_runs(const PartialBuf *p, void (*fn)(int64_t lo, int64_t hi, void *ctx),
                      void *ctx);

/* How many buffers hold only part of their bytes now: callers skip
 * their search for them while none lives. */
extern atomic_int arr_partial_live;

/* Materialises [a]'s buffer when it holds only part of its bytes (any
 * thread may call it, but only the main thread can fetch): 0, or -1 with
 * the error set. */
int arr_make_whole(Array *a);

/* ---- creation (all return new references; NULL + error on failure) ------- */

/* Checks that an array of dtype [t] and [shape] could be made here: 0,
 * or -1 with the error set (a negative dimension; a size past int64; more
 * bytes than this machine's memory, named in GiB with the shape).  For
 * what would be a view (zeros, ones, full broadcast from one element),
 * so a size no program could hold is an error where it is asked for. */
int arr_check_size(DType t, int ndim, const int64_t *shape);

/* Lowers the largest array this process makes to [bytes] (never above the
 * machine's memory): a fuzzer's bound, so no input can ask for gigabytes.
 * Call before any device thread runs. */
void arr_set_max_bytes(int64_t bytes);

/* A new C-contiguous array with uninitialised contents.  Errors: ndim too
 * large, negative dimension, size overflow, out of memory (ERR_MEMORY:
 * for an array of 64 MiB or more, with the shape and the size in GiB in
 * the message; else err_nomem's). */
/* [a] as a Value, or NULL when [a] is (an allocation that failed). */
static inline Value *arr_value(Array *a) { return a ? &a->hdr : NULL; }

Array *arr_new(DType t, int ndim, const int64_t *shape);
Array *arr_zeros(DType t, int ndim, const int64_t *shape);

/* As arr_new(t, like->ndim, like->shape), for the shape of an existing
 * array [like] (borrowed): only the byte size is checked.  The hot
 * allocation of elementwise results. */
Array *arr_new_like(DType t, const Array *like);

/* 0-d arrays from C numbers, converted to [t] as NumPy's astype would. */
Array *arr_scalar_f64(DType t, double x, bool weak);
Array *arr_scalar_i64(DType t, int64_t x, bool weak);

/* A Python int: a weak int32 0-d array (int64 past int32), shared and
 * immortal for -5..256 as CPython's small ints.  A reference the caller
 * releases (a no-op on the shared ones); never to be written. */
Value *arr_python_int(int64_t x);

/* A Python float: a weak, host float32 0-d array holding [x] rounded to
 * float32 for array functions and [x] itself for Python arithmetic and
 * printing (see "Python numbers" above).  A new reference; NULL with the
 * error set on out of memory. */
Value *arr_python_float(double x);

/* A new Python number equal to host [a] (int, float with its double, or
 * bool): a copy that keeps what a Python number is.  NULL on out of
 * memory. */
Value *arr_host_copy(const Array *a);

/* Whether [v] is a Python number (an int, float or bool with [host] set). */
static inline bool arr_is_host(const Value *v) {
  return v && v->type == V_ARRAY && ((const Array *)v)->host;
}

/* The value of a 0-d [a] as a double: a host float's exact double, else
 * its element (a float32 widened, an int converted). */
double arr_host_f64(const Array *a);

/* A view of [a]'s buffer with the given shape, strides and offset (in
 * elements).  The caller guarantees the view stays inside the buffer. */
Array *arr_view(Array *a, int ndim, const int64_t *shape,
                const int64_t *strides, int64_t offset);

/* Points [dst] at [src]'s buffer and releases its own; both C-contiguous,
 * of one dtype and shape.  For results that are the same on every device
 * (psum): one buffer, written once, instead of one per device; a shared
 * buffer is never overwritten in place (prim.c checks its count).  The
 * caller makes sure nobody else uses [dst] meanwhile.  Returns false, and
 * changes nothing, when either payload is inline (small arrays). */
bool arr_share_buffer(Array *dst, const Array *src);

/* Marks [a]'s buffer as memory its holder writes again after handing the
 * array on: a compiled plan's temporary slots and loop carries, which
 * every run (and every step reusing the slot) overwrites without looking
 * at counts.  Such a buffer is never shared: arr_shareable is false for
 * it and arr_share_buffer refuses it on either side.  The ownership rule
 * for shared outputs (spmd/collective.h): a collective may point several
 * devices' outputs at one buffer only when every one of them is
 * shareable, i.e. a fresh array that is immutable once written. */
void arr_pin(Array *a);

/* Whether [a]'s buffer may be shared with other arrays by
 * arr_share_buffer: its payload is not inline and not pinned. */
static inline bool arr_shareable(const Array *a) { return a->buf->owned && !a->buf->pinned; }

/* arr_unshared without its exception for Python numbers: for a caller
 * that overwrites a host int with another host int of the same dtype
 * (a range loop's variable), which keeps the mark true.  Inline: the
 * eager hot path asks it of every small result. */
static inline bool arr_sole_holder(const Array *a) {
  const Buffer *b = a->buf;
  bool local = b->owned || b->data == b->inline_data;   /* embedded: arr_alloc's two kinds */
  return !(a->hdr.flags & VAL_IMMORTAL) && val_refcount(&a->hdr) == 1 &&
         atomic_load_explicit(&((Buffer *)b)->refcount, memory_order_acquire) == 1 && local;
}

/* Whether [a] and its buffer have one holder each and the payload is its
 * own (not a mapped or borrowed one): then [a] may be changed in place
 * (value.h: a count of 1 means changeable in place). */
static inline bool arr_unshared(const Array *a) { return !a->host && arr_sole_holder(a); }

/* [a] itself (incref'd) if C-contiguous, else a contiguous copy. */
Array *arr_contiguous(Array *a);

/* A contiguous copy, always a new buffer. */
Array *arr_copy(Array *a);

/* A contiguous copy converted to dtype [t] (weak flag cleared unless
 * [weak]).  Float to int truncates toward zero; bool is x != 0. */
Array *arr_astype(Array *a, DType t, bool weak);

/* ---- element access (any layout) ------------------------------------------ */

/* Element [flat] (row-major index over the logical shape) as double/int64. */
double arr_get_f64(const Array *a, int64_t flat);
int64_t arr_get_i64(const Array *a, int64_t flat);

/* Reads a 0-d (or size-1) integer or bool array as an int64.  Errors: not
 * an array, not an integer dtype ("expected an integer, got float32
 * array"), size != 1. */
int arr_to_index(Value *v, int64_t *out);

/* Reads a size-1 array of any dtype as a double (a Python float: its
 * exact double, not the float32 array functions read). */
int arr_to_double(Value *v, double *out);

/* ---- shapes ------------------------------------------------------------------ */

/* Row-major strides for [shape]. */
void shape_strides(int ndim, const int64_t *shape, int64_t *strides);

/* Product of the dims; -1 on int64 overflow. */
int64_t shape_size(int ndim, const int64_t *shape);

/* Writes "(8, 32)" (Python's tuple form; "(8,)" for one dim) into [buf]. */
void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape);

/* Writes "f32[8,32]" (the plan's form) into [buf]. */
void aval_str(char *buf, size_t cap, DType t, int ndim, const int64_t *shape);

/* NumPy broadcasting of two shapes into [out] (*out_ndim set).  Error
 * "operands could not be broadcast together with shapes (2, 3) (4,)". */
int shape_broadcast(int na, const int64_t *a, int nb, const int64_t *b,
                    int *out_ndim, int64_t *out);

/* Normalises a possibly negative [axis] for rank [ndim]; error "axis 3 is
 * out of bounds for array of dimension 2". */
int axis_normalize(int64_t axis, int ndim, int *out);

/* ---- host NumPy arrays (see "Host NumPy arrays" above) -------------------- */

/* Set once, at the first import of numpy (any thread), never cleared. */
extern atomic_bool arr_np_live;

/* Who is applying primitives on this thread: NumPy's functions, jax's,
 * or an operator or method (decided by its operands). */
typedef enum { ARR_NP_AUTO, ARR_NP_HOST, ARR_NP_JAX } ArrNpMode;
extern _Thread_local ArrNpMode arr_np_mode;

static inline bool arr_np_is_live(void) {
  return atomic_load_explicit(&arr_np_live, memory_order_relaxed);
}

/* Whether [v] is a NumPy array (its buffer is a host NumPy buffer).  The
 * flag first: a script that never imports numpy pays one load. */
static inline bool arr_is_np(const Value *v) {
  return arr_np_is_live() && v && v->type == V_ARRAY && ((const Array *)v)->buf->np;
}

/* Whether a result of operands [ops] (concrete, [nin]) is a NumPy array
 * in the current mode: ARR_NP_HOST yes, ARR_NP_JAX no, ARR_NP_AUTO when
 * some operand is one and no operand is a jax.Array (Python numbers
 * count for neither). */
bool arr_np_wanted(int nin, Array *const *ops);

/* [a] (stolen) as a NumPy array ([np]) or a jax.Array (![np]): marked in
 * place when it is its buffer's only holder and no Python number, else
 * a copy with its own buffer; a NumPy array with a zero stride over a
 * dim of more than one element (a broadcast view) is materialised.  The
 * header's weak, vma and sharding are kept.  NULL with the error set
 * (out of memory). */
Array *arr_np_as(Array *a, bool np);

/* The results [r] (stolen: an array or a tuple of them) of a primitive
 * whose operands were [ops], settled by arr_np_wanted and arr_np_as. */
Value *arr_np_settle(Value *r, int nin, Array *const *ops);

/* Called by val_free_ for V_ARRAY. */
void arr_free(Value *v);

#endif
