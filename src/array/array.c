/*
 * array.c - arrays as views over reference-counted buffers (array.h).
 *
 * A payload of at most ARR_INLINE_MAX bytes lives in the same allocation as
 * its Array and Buffer header, so making a small array is one malloc;
 * larger payloads come from shm_buf_alloc (huge pages, recycled).
 */
#include "array/array.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>

#include "base/error.h"
#include "array/kernels.h"
#include "base/mem.h"

#define ARR_INLINE_MAX 256

/* ---- buffers ------------------------------------------------------------- */

/* The largest payload we try to allocate: physical memory.  Beyond it the
 * allocation could only succeed by overcommit and then die on first touch.
 * Set once at load time, read-only after, so threads need no lock. */
static int64_t arr_max_bytes = INT64_MAX;

static void arr_register_type(void);

/* At load time, before any array exists: the size limit, and V_ARRAY's
 * behaviour in the generic value operations (value.h). */
__attribute__((constructor)) static void arr_limit_init(void) {
  long pages = sysconf(_SC_PHYS_PAGES), psize = sysconf(_SC_PAGESIZE);
  if (pages > 0 && psize > 0)
    arr_max_bytes = (int64_t)pages * psize;
  arr_register_type();
}

/* Small payloads are embedded: one allocation holds the Array, then its
 * Buffer header at the first 64-byte boundary at least 8 bytes past the
 * Array (the Buffer type is 64-byte aligned), then the data.  The 8 bytes
 * before the header keep the allocation's address.  Such a buffer (owned
 * == false) outlives its Array when views still use it; the allocation is
 * freed when the last of the two lets go. */
#define ARR_EMBED_EXTRA (sizeof(void *) + 63)

static Buffer *arr_embedded(const Array *a, int ndim) {
  uintptr_t p = (uintptr_t)a + arr_header_size(ndim) + sizeof(void *);
  return (Buffer *)((p + 63) & ~(uintptr_t)63);
}

/* The bytes of one allocation holding an Array of [ndim] dimensions and
 * its embedded payload of [nbytes]. */
static size_t arr_embed_size(int ndim, size_t nbytes) {
  return arr_header_size(ndim) + ARR_EMBED_EXTRA + sizeof(Buffer) + nbytes;
}

/* The last small array this thread freed, kept for its next allocation
 * of the same size: `c = a + b` in a loop frees the old c just after
 * making the new one, so each iteration reuses the allocation the one
 * before let go, with no trip through malloc.  Given back at the
 * thread's exit (spare_key's destructor). */
typedef struct Spare {
  void *p;        /* NULL when empty */
  size_t size;    /* its allocation's bytes (arr_embed_size) */
  bool keyed;     /* this thread's destructor is set */
} Spare;
static _Thread_local Spare spare;
static pthread_key_t spare_key;
static pthread_once_t spare_once = PTHREAD_ONCE_INIT;

/* Another key's destructor may free an array after this one ran (a
 * cache of plans holding literals): the key is set again then, and POSIX
 * runs destructors again while a key has a value. */
static void spare_release(void *vs) {
  Spare *s = vs;
  shm_free(s->p);
  s->p = NULL;
  s->keyed = false;
}

static void spare_key_init(void) { pthread_key_create(&spare_key, spare_release); }

/* Keeps the freed allocation [p] of [size] bytes as this thread's spare;
 * false (the caller frees it) when one is kept already. */
static bool spare_put(void *p, size_t size) {
  if (spare.p) return false;
  if (!spare.keyed) {
    pthread_once(&spare_once, spare_key_init);
    if (pthread_setspecific(spare_key, &spare) != 0) return false;
    spare.keyed = true;
  }
  spare.p = p;
  spare.size = size;
  return true;
}

/* A small allocation of [size] bytes: the spare when it fits exactly. */
static void *spare_take(size_t size) {
  if (spare.p && spare.size == size) {
    void *p = spare.p;
    spare.p = NULL;
    return p;
  }
  return shm_malloc(size);
}

/* An Array with its buffer: embedded when small, else from shm_buf_alloc
 * (the separate header too, for its alignment). */
static Array *arr_alloc(int ndim, size_t nbytes) {
  Buffer *b;
  Array *a;
  if (nbytes <= ARR_INLINE_MAX) {
    a = spare_take(arr_embed_size(ndim, nbytes));
    if (!a)
      return NULL;
    b = arr_embedded(a, ndim);
    ((void **)b)[-1] = a;
    b->data = b->inline_data;
    b->owned = false;
    b->pinned = false;
    b->np = b->np_ro = b->np_0d = false;
    b->small_pages = false;
    b->part = NULL;
  } else {
    a = shm_malloc(arr_header_size(ndim));
    if (!a)
      return NULL;
    b = shm_buf_alloc(sizeof(Buffer));
    void *d = b ? shm_buf_alloc(nbytes) : NULL;
    if (!d) {
      shm_buf_free(b, sizeof(Buffer));
      shm_free(a);
      return NULL;
    }
    b->data = d;
    b->owned = true;
    b->pinned = false;
    b->np = b->np_ro = b->np_0d = false;
    b->small_pages = false;
    b->part = NULL;
  }
  atomic_init(&b->refcount, 1);
  b->nbytes = nbytes;
  b->charged = shm_mem_charge(nbytes);
  a->buf = b;
  arr_set_dims(a, ndim);
  return a;
}

/* Drops one reference to [b]; true when it was the last. */
static bool arr_buffer_release(Buffer *b) {
  /* a count of 1 is the caller's own: no other holder can change it */
  return atomic_load_explicit(&b->refcount, memory_order_acquire) == 1 ||
         atomic_fetch_sub_explicit(&b->refcount, 1, memory_order_acq_rel) == 1;
}

/* Frees [b]'s record of the bytes it holds, if it holds only some. */
static void arr_part_free(Buffer *b) {
  if (!b->part) return;
  val_decref(b->part->sharding);
  shm_free(b->part->held);
  shm_free(b->part);
  b->part = NULL;
  atomic_fetch_sub_explicit(&arr_partial_live, 1, memory_order_relaxed);
}

/* Frees a buffer whose count reached zero. */
static void arr_buffer_free(Buffer *b) {
  shm_mem_uncharge(b->charged, b->nbytes);
  arr_part_free(b);
  if (b->small_pages) shm_huge_pages(b->data, b->nbytes, true);   /* as shm_buf_alloc made it */
  if (b->owned) {
    shm_buf_free(b->data, b->nbytes);
    shm_buf_free(b, sizeof(Buffer));
  } else {
    shm_free(((void **)b)[-1]);   /* the allocation of the Array it came with */
  }
}

/* ---- process-local shards (array.h) ------------------------------------------ */

int (*arr_materialize_hook)(Array *a);
atomic_int arr_partial_live;

/* The last dimension of [p]'s grid cut in more than one block (there is
 * one: a grid of one block is held whole), the elements a step along it
 * moves ([*unit]) and the length of a block along it ([*blk]). */
static int last_cut(const PartialBuf *p, int64_t *unit, int64_t *blk) {
  int t = p->ndim - 1;
  int64_t u = 1;
  while (t > 0 && p->nblk[t] == 1) u *= p->shape[t--];
  *unit = u;
  *blk = p->shape[t] / p->nblk[t];
  return t;
}

/* The grid cell of the dimensions before [t] at leading row [lead] (the
 * row-major index over dimensions 0..t-1), times nblk[t]. */
static int64_t lead_cell(const PartialBuf *p, int t, int64_t lead) {
  int64_t cell = 0, k = 1;
  for (int d = t - 1; d >= 0; d--) {
    int64_t i = lead % p->shape[d];
    lead /= p->shape[d];
    cell += i / (p->shape[d] / p->nblk[d]) * k;
    k *= p->nblk[d];
  }
  return cell * p->nblk[t];
}

void arr_partial_runs(const PartialBuf *p, void (*fn)(int64_t lo, int64_t hi, void *ctx),
                      void *ctx) {
  int64_t unit, blk, nlead = 1;
  int t = last_cut(p, &unit, &blk);
  for (int d = 0; d < t; d++) nlead *= p->shape[d];
  int64_t run = blk * unit, row = p->shape[t] * unit, lo = -1, hi = -1;
  for (int64_t l = 0; l < nlead; l++) {
    int64_t cell = lead_cell(p, t, l);
    for (int64_t b = 0; b < p->nblk[t]; b++) {
      if (!p->held[cell + b]) continue;
      int64_t at = l * row + b * run;
      if (at != hi) {
        if (hi > lo) fn(lo, hi, ctx);
        lo = at;
      }
      hi = at + run;
    }
  }
  if (hi > lo) fn(lo, hi, ctx);
}

/* Whether [p] holds every element of [a, b) (row-major global indices). */
static bool held_range(const PartialBuf *p, int64_t a, int64_t b) {
  int64_t unit, blk;
  int t = last_cut(p, &unit, &blk);
  int64_t run = blk * unit, row = p->shape[t] * unit;
  while (a < b) {
    int64_t lead = a / row, bt = a % row / run;
    if (!p->held[lead_cell(p, t, lead) + bt]) return false;
    a = lead * row + (bt + 1) * run;
  }
  return true;
}

/* Whether [p] holds every element [a] reads, when each of a's dimensions
 * steps along one dimension of the global array without carrying into
 * the next (a block, a basic slice, a transpose of them, a broadcast):
 * the elements are then a product of progressions, one per global
 * dimension, and held exactly when every grid cell they meet is.  -1
 * when [a] is not of that form. */
static int held_grid(const PartialBuf *p, const Array *a) {
  enum { MAXB = 256 };
  int nd = p->ndim;
  int64_t G[SHM_MAXDIM], idx[SHM_MAXDIM], step[SHM_MAXDIM] = {0}, cnt[SHM_MAXDIM];
  int64_t total = 1, o = a->offset;
  for (int k = nd - 1; k >= 0; k--) G[k] = total, total *= p->shape[k];
  if (o < 0 || o >= total) return -1;
  for (int k = 0; k < nd; k++) idx[k] = o / G[k] % p->shape[k], cnt[k] = 1;
  for (int d = 0; d < a->ndim; d++) {
    int64_t s = a->strides[d], m = s < 0 ? -s : s;
    if (a->shape[d] <= 1 || s == 0) continue;
    int k = 0;
    while (k < nd && !(p->shape[k] > 1 && G[k] <= m && m < G[k] * p->shape[k])) k++;
    if (k == nd || m % G[k] || cnt[k] > 1) return -1;
    step[k] = s / G[k];
    cnt[k] = a->shape[d];
    int64_t last = idx[k] + step[k] * (cnt[k] - 1);
    if (last < 0 || last >= p->shape[k]) return -1;
  }
  /* the blocks met along each dimension */
  int64_t list[MAXB], *at[SHM_MAXDIM], n[SHM_MAXDIM];
  int used = 0;
  for (int k = 0; k < nd; k++) {
    int64_t c = p->shape[k] / p->nblk[k], first = idx[k], last = idx[k] + step[k] * (cnt[k] - 1);
    if (first > last) {
      int64_t x = first;
      first = last;
      last = x;
    }
    at[k] = list + used;
    n[k] = 0;
    if (cnt[k] == 1 || (step[k] < 0 ? -step[k] : step[k]) <= c) {
      if (used + last / c - first / c + 1 > MAXB) return -1;
      for (int64_t b = first / c; b <= last / c; b++) list[used++] = b, n[k]++;
    } else {
      for (int64_t j = 0; j < cnt[k]; j++) {
        int64_t b = (idx[k] + step[k] * j) / c;
        if (n[k] && at[k][n[k] - 1] == b) continue;
        if (used == MAXB) return -1;
        list[used++] = b, n[k]++;
      }
    }
  }
  /* every combination of them */
  int64_t odo[SHM_MAXDIM] = {0};
  for (;;) {
    int64_t cell = 0;
    for (int k = 0; k < nd; k++) cell = cell * p->nblk[k] + at[k][odo[k]];
    if (!p->held[cell]) return 0;
    int k = nd - 1;
    while (k >= 0 && ++odo[k] == n[k]) odo[k--] = 0;
    if (k < 0) return 1;
  }
}

/* Whether [p] holds every element [a] (a view of its buffer) reads: by
 * held_grid, else run by run of the contiguous elements a reads. */
static bool held_view(const PartialBuf *p, const Array *a) {
  if (dt_size(a->dtype) != dt_size(p->dtype)) {   /* a view of the bytes as another type */
    int64_t es = (int64_t)dt_size(p->dtype), first = a->offset, last = a->offset;
    for (int d = 0; d < a->ndim; d++) {
      int64_t step = (a->shape[d] - 1) * a->strides[d];
      if (step < 0) first += step;
      else last += step;
    }
    int64_t ae = (int64_t)dt_size(a->dtype);
    return held_range(p, first * ae / es, ((last + 1) * ae + es - 1) / es);
  }
  int g = held_grid(p, a);
  if (g >= 0) return g;
  /* the innermost dimensions a reads contiguously make one run */
  int inner = a->ndim;
  int64_t len = 1;
  while (inner > 0 && (a->shape[inner - 1] == 1 || a->strides[inner - 1] == len))
    len *= a->shape[--inner];
  int64_t odo[SHM_MAXDIM] = {0};
  for (;;) {
    int64_t off = a->offset;
    for (int d = 0; d < inner; d++) off += odo[d] * a->strides[d];
    if (!held_range(p, off, off + len)) return false;
    int d = inner - 1;
    while (d >= 0 && ++odo[d] == a->shape[d]) odo[d--] = 0;
    if (d < 0) return true;
  }
}

int arr_make_whole(Array *a) {
  Buffer *b = a->buf;
  if (!b->part) return 0;
  if (!arr_materialize_hook) {
    err_set(ERR_COLLECTIVE, "a sharded array's other blocks cannot be fetched here");
    return -1;
  }
  return arr_materialize_hook(a);
}

bool arr_partial_holds(const Array *a) {
  return !a->buf->part || a->size == 0 || held_view(a->buf->part, a);
}

void arr_partial_check(const Array *a) {
  if (arr_partial_holds(a)) return;
  if (arr_make_whole((Array *)a) == 0) return;
  /* arr_data has no way to fail: the read would see bytes never written */
  fflush(stdout);
  err_print(stderr);
  _exit(1);
}

/* arr_partial_runs's callbacks of arr_set_partial: whether a gap between
 * the runs starts or ends inside a huge page (2 MiB), and giving back
 * the pages of the gaps (ctx: the buffer, its element size, the end of
 * the last run in bytes, and that answer). */
typedef struct Gaps {
  Buffer *b;
  int64_t es, end;
  bool small;
} Gaps;

static void gap_small(int64_t lo, int64_t hi, void *ctx) {
  Gaps *g = ctx;
  int64_t huge = (int64_t)2 << 20;
  if (lo * g->es > g->end && ((lo * g->es) % huge || g->end % huge)) g->small = true;
  g->end = hi * g->es;
}

static void release_gap(int64_t lo, int64_t hi, void *ctx) {
  Gaps *g = ctx;
  if (lo * g->es > g->end)
    shm_release_pages((char *)g->b->data + g->end, (size_t)(lo * g->es - g->end));
  g->end = hi * g->es;
}

int arr_set_partial(Array *g, Value *sharding, const int64_t *nblk, const uint8_t *held) {
  PartialBuf *p = shm_calloc(1, sizeof *p);
  int64_t n = 1;
  for (int d = 0; d < g->ndim; d++) n *= nblk[d];
  uint8_t *h = p ? shm_malloc((size_t)n) : NULL;
  if (!h) {
    shm_free(p);
    return err_nomem(), -1;
  }
  memcpy(h, held, (size_t)n);
  p->held = h;
  p->ncells = n;
  p->sharding = val_incref(sharding);
  p->dtype = g->dtype;
  p->ndim = g->ndim;
  memcpy(p->shape, g->shape, sizeof(int64_t) * (size_t)g->ndim);
  memcpy(p->nblk, nblk, sizeof(int64_t) * (size_t)g->ndim);
  g->buf->part = p;
  atomic_fetch_add_explicit(&arr_partial_live, 1, memory_order_relaxed);
  /* a huge page backs all of itself when any byte of it is written */
  Gaps gaps = {.b = g->buf, .es = (int64_t)dt_size(g->dtype), .end = 0};
  arr_partial_runs(p, gap_small, &gaps);
  if (gaps.small && g->buf->owned && !g->buf->small_pages) {
    shm_huge_pages(g->buf->data, g->buf->nbytes, false);
    g->buf->small_pages = true;
  }
  gaps.end = 0;
  arr_partial_runs(p, release_gap, &gaps);
  shm_release_pages((char *)g->buf->data + gaps.end, g->buf->nbytes - (size_t)gaps.end);
  return 0;
}


/* ---- creation ----------------------------------------------------------- */

/* The error of an array too large for this machine, in GiB. */
static void too_large(DType t, const char *sbuf, int64_t nbytes) {
  /* the machine's size stays out of the message: tests expect it exactly */
  err_set(ERR_MEMORY, "array of shape %s and dtype %s needs %.2f GiB, more than this "
          "machine's memory", sbuf, dt_name(t), (double)nbytes / (1 << 30));
}

/* Checks a shape for arr_new; sets the error and returns -1 if bad. */
static int arr_check_shape(DType t, int ndim, const int64_t *shape,
                           int64_t *size, int64_t *nbytes) {
  char sbuf[256];
  if (ndim < 0 || ndim > SHM_MAXDIM) {
    err_set(ERR_VALUE, "maximum supported dimension for an array is %d, found %d",
            SHM_MAXDIM, ndim);
    return -1;
  }
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0) {
      err_set(ERR_VALUE, "negative dimensions are not allowed");
      return -1;
    }
  }
  *size = shape_size(ndim, shape);
  int64_t isz = (int64_t)dt_size(t);
  if (*size < 0 || *size > INT64_MAX / isz || *size * isz > arr_max_bytes) {
    shape_str(sbuf, sizeof sbuf, ndim, shape);
    if (*size < 0 || *size > INT64_MAX / isz)
      err_set(ERR_MEMORY, "array of shape %s is too big: its size overflows int64", sbuf);
    else
      too_large(t, sbuf, *size * isz);
    return -1;
  }
  *nbytes = *size * isz;
  return 0;
}

/* Fills the Array header of a fresh contiguous array (a->buf is set). */
static void arr_init(Array *a, DType t, int ndim, const int64_t *shape, int64_t size) {
  val_init(&a->hdr, V_ARRAY);
  a->dtype = t;
  a->weak = false;
  a->host = false;
  a->contiguous = true;
  a->ndim = (uint8_t)ndim;
  a->vma = 0;
  a->why = (VmaWhy){0};
  a->sharding = NULL;
  a->device1 = 0;
  a->size = size;
  a->offset = 0;
  int64_t st = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    a->shape[i] = shape[i];
    a->strides[i] = st;
    st *= shape[i];
  }
}

int arr_check_size(DType t, int ndim, const int64_t *shape) {
  int64_t size, nbytes;
  return arr_check_shape(t, ndim, shape, &size, &nbytes);
}

void arr_set_max_bytes(int64_t bytes) {
  if (bytes > 0 && bytes < arr_max_bytes) arr_max_bytes = bytes;
}

/* Below this size a failed allocation is memory that ran out, not an
 * array too large to have: the plain out-of-memory error says so, where
 * "needs 0.00 GiB, more than the memory available" would contradict it. */
#define LARGE_ARRAY_BYTES ((int64_t)64 << 20)

Array *arr_new(DType t, int ndim, const int64_t *shape) {
  int64_t size, nbytes;
  if (arr_check_shape(t, ndim, shape, &size, &nbytes) < 0)
    return NULL;
  Array *a = arr_alloc(ndim, (size_t)nbytes);
  if (!a && nbytes < LARGE_ARRAY_BYTES) return err_nomem();
  if (!a) {
    char sbuf[256];
    shape_str(sbuf, sizeof sbuf, ndim, shape);
    return err_set(ERR_MEMORY, "array of shape %s and dtype %s needs %.2f GiB, more than "
                   "the memory available now", sbuf, dt_name(t), (double)nbytes / (1 << 30));
  }
  arr_init(a, t, ndim, shape, size);
  return a;
}

Array *arr_new_like(DType t, const Array *like) {
  int64_t isz = (int64_t)dt_size(t);
  if (like->size > arr_max_bytes / isz)   /* arr_new says why */
    return arr_new(t, like->ndim, like->shape);
  Array *a = arr_alloc(like->ndim, (size_t)(like->size * isz));
  if (!a)
    return arr_new(t, like->ndim, like->shape);
  arr_init(a, t, like->ndim, like->shape, like->size);
  return a;
}

Array *arr_zeros(DType t, int ndim, const int64_t *shape) {
  Array *a = arr_new(t, ndim, shape);
  if (a)
    memset(a->buf->data, 0, a->buf->nbytes);
  return a;
}

Array *arr_scalar_f64(DType t, double x, bool weak) {
  Array *a = arr_new(t, 0, NULL);
  if (!a)
    return NULL;
  kern_convert(a->buf->data, t, &x, DT_F64, 1);
  a->weak = weak;
  return a;
}

Array *arr_scalar_i64(DType t, int64_t x, bool weak) {
  Array *a = arr_new(t, 0, NULL);
  if (!a)
    return NULL;
  kern_convert(a->buf->data, t, &x, DT_I64, 1);
  a->weak = weak;
  return a;
}

/* The small Python ints -5..256, one immortal weak int32 each, made once
 * (literals share them, as CPython shares its small ints: a script of
 * `x = 1` lines holds one array, not one per line).  Immortal values are
 * never reused in place (arr_unshared). */
enum { SMALL_LO = -5, SMALL_HI = 256 };
static Array *small_ints[SMALL_HI - SMALL_LO + 1];
static pthread_once_t small_once = PTHREAD_ONCE_INIT;

static void small_init(void) {
  for (int v = SMALL_LO; v <= SMALL_HI; v++) {
    Array *a = arr_scalar_i64(DT_I32, v, true);
    if (a) a->host = true;
    small_ints[v - SMALL_LO] = a ? (Array *)val_make_static(&a->hdr) : NULL;
  }
}

Value *arr_python_int(int64_t x) {
  if (x >= SMALL_LO && x <= SMALL_HI) {
    pthread_once(&small_once, small_init);
    Array *a = small_ints[x - SMALL_LO];
    if (a && (a->hdr.flags & VAL_IMMORTAL)) return &a->hdr;
  }
  DType t = (x >= INT32_MIN && x <= INT32_MAX) ? DT_I32 : DT_I64;
  Array *a = arr_scalar_i64(t, x, true);
  if (a) a->host = true;
  return (Value *)a;
}

/* Byte offset of a host float's double in its buffer (array.h). */
enum { HOST_F64_AT = 8 };

Value *arr_python_float(double x) {
  Array *a = arr_alloc(0, HOST_F64_AT + sizeof(double));
  if (!a) return err_nomem();
  arr_init(a, DT_F32, 0, NULL, 1);
  *(float *)a->buf->data = (float)x;
  memcpy((char *)a->buf->data + HOST_F64_AT, &x, sizeof x);
  a->weak = true;
  a->host = true;
  return &a->hdr;
}

Value *arr_host_copy(const Array *a) {
  if (dt_is_float(a->dtype)) return arr_python_float(arr_host_f64(a));
  Array *c = arr_scalar_i64(a->dtype, arr_get_i64(a, 0), a->weak);
  if (c) c->host = true;
  return (Value *)c;
}

double arr_host_f64(const Array *a) {
  if (a->host && a->dtype == DT_F32 && a->buf->nbytes >= HOST_F64_AT + sizeof(double)) {
    double x;
    memcpy(&x, (const char *)a->buf->data + HOST_F64_AT, sizeof x);
    return x;
  }
  return arr_get_f64(a, 0);
}

/* True when [strides] are the row-major ones for [shape] (size-1 dims may
 * have any stride, as NumPy's C_CONTIGUOUS flag allows). */
static bool arr_is_contiguous(int ndim, const int64_t *shape, const int64_t *strides) {
  int64_t st = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    if (shape[i] == 0)
      return true;
    if (shape[i] != 1 && strides[i] != st)
      return false;
    st *= shape[i];
  }
  return true;
}

Array *arr_view(Array *a, int ndim, const int64_t *shape,
                const int64_t *strides, int64_t offset) {
  Array *v = shm_malloc(arr_header_size(ndim));
  if (!v)
    return err_nomem();
  arr_set_dims(v, ndim);
  val_init(&v->hdr, V_ARRAY);
  v->dtype = a->dtype;
  v->weak = a->weak;
  v->host = false;  /* a view is an array function's result */
  v->ndim = (uint8_t)ndim;
  v->vma = a->vma;
  v->why = a->why;
  v->sharding = NULL;
  v->device1 = a->device1;   /* the same data, on the same device */
  v->offset = offset;
  v->size = shape_size(ndim, shape);
  for (int i = 0; i < ndim; i++) {  /* not memcpy: a few words, rep movs is slow */
    v->shape[i] = shape[i];
    v->strides[i] = strides[i];
  }
  v->contiguous = arr_is_contiguous(ndim, shape, strides);
  v->buf = a->buf;
  atomic_fetch_add_explicit(&a->buf->refcount, 1, memory_order_relaxed);
  return v;
}

Array *arr_copy(Array *a) {
  Array *c = arr_new(a->dtype, a->ndim, a->shape);
  if (!c)
    return NULL;
  kern_copy_to_contiguous(c->buf->data, a);
  c->weak = a->weak;
  c->vma = a->vma;
  c->why = a->why;
  return c;
}


void arr_pin(Array *a) { a->buf->pinned = true; }

/* ---- host NumPy arrays ---------------------------------------------------- */

atomic_bool arr_np_live;
_Thread_local ArrNpMode arr_np_mode;

bool arr_np_wanted(int nin, Array *const *ops) {
  if (arr_np_mode != ARR_NP_AUTO) return arr_np_mode == ARR_NP_HOST;
  bool any = false;
  for (int i = 0; i < nin; i++) {
    if (ops[i]->buf->np) any = true;
    else if (!ops[i]->host) return false;   /* a jax.Array among them */
  }
  return any;
}

/* Whether [a] repeats an element along a dim (a broadcast view). */
static bool arr_has_zero_stride(const Array *a) {
  for (int d = 0; d < a->ndim; d++)
    if (a->strides[d] == 0 && a->shape[d] > 1) return true;
  return false;
}

Array *arr_np_as(Array *a, bool np) {
  if (a->buf->np == np && !(np && arr_has_zero_stride(a))) return a;
  if (a->buf->np != np && arr_unshared(a) && !(np && arr_has_zero_stride(a))) {
    a->buf->np = np;   /* its only holder: nobody else sees the mark change */
    a->buf->np_ro = a->buf->np_0d = false;
    return a;
  }
  Array *c = arr_copy(a);
  if (c) {
    c->buf->np = np;
    if (a->sharding) c->sharding = val_incref(a->sharding);
    c->device1 = a->device1;
  }
  val_decref(&a->hdr);
  return c;
}

Value *arr_np_settle(Value *r, int nin, Array *const *ops) {
  if (!r) return NULL;
  bool np = arr_np_wanted(nin, ops);
  if (r->type == V_ARRAY) {
    if (!np && !AS_ARRAY(r)->buf->np) return r;   /* the common case: a jax.Array */
    return arr_value(arr_np_as(AS_ARRAY(r), np));
  }
  if (r->type != V_TUPLE) return r;
  Tuple *t = (Tuple *)r;   /* a primitive's fresh tuple: its items are ours to replace */
  for (size_t i = 0; i < t->len; i++) {
    if (!IS_ARRAY(t->items[i]) || AS_ARRAY(t->items[i])->buf->np == np) continue;
    Array *c = arr_np_as(AS_ARRAY(t->items[i]), np);
    t->items[i] = arr_value(c);
    if (!c) {
      t->items[i] = VAL_NONE;
      val_decref(r);
      return NULL;
    }
  }
  return r;
}

bool arr_share_buffer(Array *dst, const Array *src) {
  if (!arr_shareable(dst) || !arr_shareable(src)) return false;
  Buffer *old = dst->buf;
  atomic_fetch_add_explicit(&src->buf->refcount, 1, memory_order_relaxed);
  dst->buf = src->buf;
  dst->offset = src->offset;
  if (arr_buffer_release(old)) arr_buffer_free(old);
  return true;
}

Array *arr_contiguous(Array *a) {
  if (a->contiguous) {
    val_incref(&a->hdr);
    return a;
  }
  return arr_copy(a);
}

Array *arr_astype(Array *a, DType t, bool weak) {
  Array *src = arr_contiguous(a);
  if (!src)
    return NULL;
  Array *c = arr_new(t, a->ndim, a->shape);
  if (c) {
    kern_convert(c->buf->data, t, arr_data(src), src->dtype, src->size);
    c->weak = weak;
    c->vma = a->vma;
    c->why = a->why;
  }
  val_decref(&src->hdr);
  return c;
}

/* ---- element access ------------------------------------------------------ */

/* Element offset (in elements, from the buffer start) of row-major [flat]. */
static int64_t arr_flat_offset(const Array *a, int64_t flat) {
  int64_t off = a->offset;
  for (int i = a->ndim - 1; i >= 0; i--) {
    int64_t n = a->shape[i];
    off += (flat % n) * a->strides[i];
    flat /= n;
  }
  return off;
}

double arr_get_f64(const Array *a, int64_t flat) {
  double x;
  arr_check_held(a);
  const char *base = a->buf->data;
  size_t isz = dt_size(a->dtype);
  kern_convert(&x, DT_F64, base + (size_t)arr_flat_offset(a, flat) * isz, a->dtype, 1);
  return x;
}

int64_t arr_get_i64(const Array *a, int64_t flat) {
  int64_t x;
  arr_check_held(a);
  const char *base = a->buf->data;
  size_t isz = dt_size(a->dtype);
  const char *at = base + (size_t)arr_flat_offset(a, flat) * isz;
  if (a->dtype == DT_I64 || a->dtype == DT_I32) {   /* the common cases, without the dispatch */
    int32_t y;
    if (a->dtype == DT_I64) {
      memcpy(&x, at, sizeof x);
      return x;
    }
    memcpy(&y, at, sizeof y);
    return y;
  }
  kern_convert(&x, DT_I64, at, a->dtype, 1);
  return x;
}

int arr_to_index(Value *v, int64_t *out) {
  if (!IS_ARRAY(v)) {
    err_set(ERR_TYPE, "expected an integer, got %s", v ? val_type_name(v) : "nothing");
    return -1;
  }
  Array *a = AS_ARRAY(v);
  if (!dt_is_int(a->dtype) && a->dtype != DT_BOOL) {
    err_set(ERR_TYPE, "expected an integer, got %s array", dt_name(a->dtype));
    return -1;
  }
  if (a->size != 1) {
    err_set(ERR_TYPE, "only integer scalar arrays can be converted to a scalar index");
    return -1;
  }
  *out = arr_get_i64(a, 0);
  return 0;
}

int arr_to_double(Value *v, double *out) {
  if (!IS_ARRAY(v)) {
    err_set(ERR_TYPE, "expected a number, got %s", v ? val_type_name(v) : "nothing");
    return -1;
  }
  Array *a = AS_ARRAY(v);
  if (a->size != 1) {
    err_set(ERR_TYPE, "only size-1 arrays can be converted to Python scalars");
    return -1;
  }
  *out = a->host ? arr_host_f64(a) : arr_get_f64(a, 0);   /* a Python float: its double */
  return 0;
}

/* ---- shapes --------------------------------------------------------------- */

void shape_strides(int ndim, const int64_t *shape, int64_t *strides) {
  int64_t st = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    strides[i] = st;
    st *= shape[i];
  }
}

int64_t shape_size(int ndim, const int64_t *shape) {
  int64_t n = 1;
  bool zero = false;
  for (int i = 0; i < ndim; i++)
    zero |= shape[i] == 0;
  if (zero)
    return 0;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || __builtin_mul_overflow(n, shape[i], &n))
      return -1;
  }
  return n;
}

/* Appends [sep] and the int64 [x] at [pos], never writing past [cap];
 * returns the new position (which may exceed cap, as snprintf counts). */
static size_t shape_append(char *buf, size_t cap, size_t pos, const char *sep, int64_t x) {
  if (pos >= cap)
    return pos;
  int k = snprintf(buf + pos, cap - pos, "%s%" PRId64, sep, x);
  return k < 0 ? pos : pos + (size_t)k;
}

/* Appends the literal [s] at [pos], as shape_append. */
static size_t shape_puts(char *buf, size_t cap, size_t pos, const char *s) {
  if (pos >= cap)
    return pos;
  int k = snprintf(buf + pos, cap - pos, "%s", s);
  return k < 0 ? pos : pos + (size_t)k;
}

void shape_str(char *buf, size_t cap, int ndim, const int64_t *shape) {
  if (!cap)
    return;
  size_t pos = shape_puts(buf, cap, 0, "(");
  for (int i = 0; i < ndim; i++)
    pos = shape_append(buf, cap, pos, i ? ", " : "", shape[i]);
  shape_puts(buf, cap, pos, ndim == 1 ? ",)" : ")");
}

void aval_str(char *buf, size_t cap, DType t, int ndim, const int64_t *shape) {
  if (!cap)
    return;
  size_t pos = shape_puts(buf, cap, 0, dt_short(t));
  pos = shape_puts(buf, cap, pos, "[");
  for (int i = 0; i < ndim; i++)
    pos = shape_append(buf, cap, pos, i ? "," : "", shape[i]);
  shape_puts(buf, cap, pos, "]");
}

int shape_broadcast(int na, const int64_t *a, int nb, const int64_t *b,
                    int *out_ndim, int64_t *out) {
  int n = na > nb ? na : nb;
  int64_t res[SHM_MAXDIM];
  for (int i = 0; i < n; i++) {
    int64_t da = i < n - na ? 1 : a[i - (n - na)];
    int64_t db = i < n - nb ? 1 : b[i - (n - nb)];
    if (da != db && da != 1 && db != 1) {
      char sa[256], sb[256];
      shape_str(sa, sizeof sa, na, a);
      shape_str(sb, sizeof sb, nb, b);
      err_set(ERR_VALUE, "operands could not be broadcast together with shapes %s %s",
              sa, sb);
      return -1;
    }
    res[i] = da == 1 ? db : da;
  }
  memcpy(out, res, sizeof(int64_t) * n);
  *out_ndim = n;
  return 0;
}

int axis_normalize(int64_t axis, int ndim, int *out) {
  if (axis < -(int64_t)ndim || axis >= ndim) {
    err_set(ERR_INDEX, "axis %" PRId64 " is out of bounds for array of dimension %d",
            axis, ndim);
    return -1;
  }
  *out = (int)(axis < 0 ? axis + ndim : axis);
  return 0;
}

void arr_free(Value *v) {
  Array *a = AS_ARRAY(v);
  Buffer *b = a->buf;
  if (a->sharding) val_decref(a->sharding);
  /* read before the release: once it is dropped another holder may free b */
  bool embedded = !b->owned && ((void **)b)[-1] == (void *)a;
  bool last = arr_buffer_release(b);
  if (embedded) {   /* a's own embedded buffer */
    if (last) shm_mem_uncharge(b->charged, b->nbytes);
    if (last) arr_part_free(b);   /* a small array held in part (SHMAP_PARTIAL_MIN) */
    if (last && !spare_put(a, arr_embed_size(a->ndim, b->nbytes)))
      shm_free(a);   /* else the last view's release frees it */
    return;
  }
  if (last)
    arr_buffer_free(b);
  shm_free(a);
}

/* ---- V_ARRAY in the generic value operations (value.h) ------------------- */

/* Python's bool(a): an empty array is false, a one-element array its
 * element, anything larger an error, as NumPy and JAX say. */
static int arr_truth(Value *v) {
  Array *a = AS_ARRAY(v);
  if (a->size == 1) return arr_get_f64(a, 0) != 0.0;
  if (a->size == 0) return 0;
  err_set(ERR_VALUE, "the truth value of an array with more than one element "
                     "is ambiguous; use a.any() or a.all()");
  return -1;
}

/* A 0-d array is a number for dict keys: {1: x}[1.0] finds x; a Python
 * float by its double, so 0.1 + 0.2 is not the key 0.3, as in Python. */
static bool arr_number(Value *v, double *out) {
  Array *a = AS_ARRAY(v);
  if (a->ndim != 0) return false;
  *out = arr_host_f64(a);
  return true;
}

/* True and False are 0-d bool arrays, strongly typed, and Python bools. */
static Value *arr_make_bool(bool b) {
  Array *a = arr_scalar_i64(DT_BOOL, b, false);
  if (a) a->host = true;
  return (Value *)a;
}

static void arr_register_type(void) {
  val_register_free(V_ARRAY, arr_free);
  val_register_truth(V_ARRAY, arr_truth);
  val_register_number(V_ARRAY, arr_number);
  val_register_bools(arr_make_bool);
}
