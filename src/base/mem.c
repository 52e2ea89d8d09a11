/*
 * mem.c - the allocation choke point (mem.h).
 *
 * Small objects go straight to malloc.  Array payloads are 64-byte aligned
 * so the kernels' vector loops start on a cache line; payloads of 2 MiB or
 * more are rounded up to a whole number of 2 MiB pages, advised to use
 * transparent huge pages, and kept in a small cache on release, so an eager
 * loop over large arrays reuses warm, already-mapped memory instead of
 * faulting in fresh pages on every temporary.
 */
#define _GNU_SOURCE
#include "base/mem.h"

#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define BUF_ALIGN 64
#define HUGE_PAGE ((size_t)2 << 20)
/* Room for the large results of one step of every device (8 devices'
 * two 2 MiB gradients, the step's own outputs, the caller's previous
 * ones): with fewer, a steady loop misses every call, and a miss empties
 * the cache, so its large buffers fault their pages in again. */
#define CACHE_SLOTS 64
/* The cache never holds more than cache_max bytes (SHM_BUF_CACHE_DEFAULT
 * unless the configuration says otherwise), so a program that once made a
 * few huge temporaries does not keep them pinned forever. */

/* Allocation counting and failure injection.  The count is per thread: a
 * shared counter's cache line would bounce between device threads on every
 * allocation.  The countdown is a relaxed atomic, only read (a shared,
 * clean cache line) unless failure injection is on; each allocation then
 * takes one distinct tick. */
static _Thread_local long alloc_count;
static _Thread_local long long alloc_bytes;   /* shm_malloc/calloc/realloc's requests */
static atomic_long fail_countdown;   /* 0: disabled; n: the nth next fails */

/* The cache of released large buffers, keyed by their rounded size.
 * cache_lock guards cache[], cache_used and cache_bytes; it is held only
 * while a slot is searched, filled or emptied, never across malloc/free. */
static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static struct { void *p; size_t size; } cache[CACHE_SLOTS];
static int cache_used;
static size_t cache_bytes;
static size_t cache_max = SHM_BUF_CACHE_DEFAULT;

/* True when this allocation is the injected failure. */
static int shm_should_fail(void) {
  alloc_count++;
  long n = atomic_load_explicit(&fail_countdown, memory_order_relaxed);
  while (n > 0) {
    if (atomic_compare_exchange_weak_explicit(&fail_countdown, &n, n - 1,
                                              memory_order_relaxed,
                                              memory_order_relaxed))
      return n == 1;
  }
  return 0;
}

/* glibc's defaults make payloads under 2 MiB fault their pages in again
 * and again: freeing the last result gives the top of the heap back to
 * the kernel once it exceeds the trim threshold (and a brk shrink costs a
 * TLB flush), and the dynamic mmap threshold sends some sizes to mmap and
 * munmap on every call.  Here payloads of 2 MiB and more are mapped and
 * recycled by the buffer cache, so malloc may map only those (a fixed
 * M_MMAP_THRESHOLD of 2 MiB) and keeps up to HEAP_KEEP bytes of free heap
 * top (M_TRIM_THRESHOLD): every smaller temporary reuses warm heap pages.
 * The user's own tuning (GLIBC_TUNABLES, MALLOC_*_ environment variables)
 * wins. */
#define HEAP_KEEP ((size_t)64 << 20)
static void shm_malloc_tune(void) {
  if (getenv("GLIBC_TUNABLES") || getenv("MALLOC_TRIM_THRESHOLD_") ||
      getenv("MALLOC_MMAP_THRESHOLD_"))
    return;
#ifdef M_MMAP_THRESHOLD
  mallopt(M_MMAP_THRESHOLD, (int)HUGE_PAGE);
  mallopt(M_TRIM_THRESHOLD, (int)HEAP_KEEP);
#endif
}

__attribute__((constructor)) static void shm_mem_init(void) {
  const char *s = getenv("SHMAP_FAIL_ALLOC");
  if (s && *s)
    shm_mem_fail_after(strtol(s, NULL, 10));
  shm_malloc_tune();
}

void *shm_malloc(size_t n) {
  if (shm_should_fail())
    return NULL;
  alloc_bytes += (long long)n;
  return malloc(n ? n : 1);
}

/* glibc's calloc never takes a chunk from the thread's cache (tcache), so
 * every small object allocated with it went through the arena's bins
 * and its free filled those bins (about 150 instructions a pair more than
 * malloc's cached chunks: a third of a traced primitive's bookkeeping).
 * Small zeroed objects are malloc plus memset instead; larger ones keep
 * calloc, which skips clearing freshly mapped pages. */
#define SMALL_ZEROED ((size_t)4096)

void *shm_calloc(size_t count, size_t size) {
  if (size && count > SIZE_MAX / size)
    return NULL;
  if (shm_should_fail())
    return NULL;
  size_t n = count * size;
  alloc_bytes += (long long)n;
  if (n > SMALL_ZEROED)
    return calloc(count ? count : 1, size ? size : 1);
  void *p = malloc(n ? n : 1);
  if (p)
    memset(p, 0, n);
  return p;
}

void *shm_realloc(void *p, size_t n) {
  if (shm_should_fail())
    return NULL;
  return realloc(p, n ? n : 1);
}

void shm_free(void *p) { free(p); }

char *shm_strdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = shm_malloc(n);
  if (d)
    memcpy(d, s, n);
  return d;
}

/* The size a large buffer really has: a whole number of huge pages. */
static size_t shm_round_large(size_t nbytes) {
  return (nbytes + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
}

/* Takes a cached buffer of exactly [size] bytes, or NULL. */
static void *shm_cache_take(size_t size) {
  void *p = NULL;
  pthread_mutex_lock(&cache_lock);
  for (int i = 0; i < cache_used; i++) {
    if (cache[i].size == size) {
      p = cache[i].p;
      cache_bytes -= size;
      cache[i] = cache[--cache_used];
      break;
    }
  }
  pthread_mutex_unlock(&cache_lock);
  return p;
}

/* Puts [p] of [size] bytes in the cache; false when it is full. */
static int shm_cache_put(void *p, size_t size) {
  int ok = 0;
  pthread_mutex_lock(&cache_lock);
  if (cache_used < CACHE_SLOTS && cache_bytes + size <= cache_max) {
    cache[cache_used].p = p;
    cache[cache_used].size = size;
    cache_used++;
    cache_bytes += size;
    ok = 1;
  }
  pthread_mutex_unlock(&cache_lock);
  return ok;
}

static void *shm_large_alloc(size_t nbytes) {
  size_t size = shm_round_large(nbytes);
  void *p = shm_cache_take(size);
  if (p)
    return p;
  /* A miss: the program has moved on to other sizes (a loop over arrays
   * of one size hits every time), so what the cache holds is returned to
   * the system rather than kept beside the new buffer, which would make
   * the peak larger than the program's own arrays need. */
  shm_buf_trim();
  if (posix_memalign(&p, HUGE_PAGE, size) != 0)
    return NULL;
#ifdef MADV_HUGEPAGE
  madvise(p, size, MADV_HUGEPAGE);
#endif
  return p;
}

void *shm_buf_alloc(size_t nbytes) {
  void *p = NULL;
  if (nbytes > SIZE_MAX - HUGE_PAGE)
    return NULL;
  if (shm_should_fail())
    return NULL;
  if (nbytes >= HUGE_PAGE)
    return shm_large_alloc(nbytes);
  /* malloc and a manual alignment, the allocation's own address kept just
   * before the payload: posix_memalign takes no chunk from the thread's
   * cache and splits and frees a piece of every chunk it returns, several
   * times malloc's cost for the small temporaries of eager code. */
  size_t n = (nbytes + BUF_ALIGN - 1) & ~(size_t)(BUF_ALIGN - 1);
  char *raw = malloc((n ? n : BUF_ALIGN) + BUF_ALIGN);
  if (!raw)
    return NULL;
  p = (void *)(((uintptr_t)raw + BUF_ALIGN) & ~(uintptr_t)(BUF_ALIGN - 1));
  ((void **)p)[-1] = raw;   /* malloc aligns to 16: p - raw is 16 to 64 */
  return p;
}

void *shm_pair_alloc(size_t nbytes) {
  void *p = NULL;
  if (nbytes > SIZE_MAX - SHM_LINE_PAIR || shm_should_fail())
    return NULL;
  size_t n = (nbytes + SHM_LINE_PAIR - 1) & ~(size_t)(SHM_LINE_PAIR - 1);
  if (posix_memalign(&p, SHM_LINE_PAIR, n ? n : SHM_LINE_PAIR) != 0)
    return NULL;
  memset(p, 0, n ? n : SHM_LINE_PAIR);
  return p;
}

void shm_buf_free(void *p, size_t nbytes) {
  if (!p)
    return;
  if (nbytes < HUGE_PAGE) {
    free(((void **)p)[-1]);
    return;
  }
  if (shm_cache_put(p, shm_round_large(nbytes)))
    return;
  free(p);
}

void shm_release_pages(void *p, size_t n) {
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t lo = ((uintptr_t)p + page - 1) & ~(page - 1), hi = ((uintptr_t)p + n) & ~(page - 1);
  if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

void shm_huge_pages(void *p, size_t n, bool on) {
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
  uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  uintptr_t lo = (uintptr_t)p & ~(page - 1), hi = ((uintptr_t)p + n + page - 1) & ~(page - 1);
  if (n >= HUGE_PAGE) madvise((void *)lo, hi - lo, on ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#else
  (void)p, (void)n, (void)on;
#endif
}

void shm_buf_cache_limit(size_t bytes) {
  pthread_mutex_lock(&cache_lock);
  cache_max = bytes;
  pthread_mutex_unlock(&cache_lock);
  shm_buf_trim();
}

size_t shm_buf_cached(void) {
  pthread_mutex_lock(&cache_lock);
  size_t n = cache_bytes;
  pthread_mutex_unlock(&cache_lock);
  return n;
}

void shm_buf_trim(void) {
  pthread_mutex_lock(&cache_lock);
  int n = cache_used;
  void *ps[CACHE_SLOTS];
  for (int i = 0; i < n; i++)
    ps[i] = cache[i].p;
  cache_used = 0;
  cache_bytes = 0;
  pthread_mutex_unlock(&cache_lock);
  for (int i = 0; i < n; i++)
    free(ps[i]);
}

void shm_mem_fail_after(long n) {
  atomic_store_explicit(&fail_countdown, n > 0 ? n : 0, memory_order_relaxed);
}

long shm_mem_fail_pending(void) {
  return atomic_load_explicit(&fail_countdown, memory_order_relaxed);
}

long shm_mem_count(void) {
  return alloc_count;
}

long long shm_mem_bytes(void) { return alloc_bytes; }

/* ---- per-device accounting (mem.h) ---- */

/* One device's counters, on a cache-line pair of their own.  The bytes in
 * use are [added] - [taken]: [added] has one writer, the device's thread
 * (its payloads made, less those it frees itself), so it needs no atomic
 * read-modify-write; [taken] counts what other threads free. */
typedef struct DevMem {
  _Atomic long long added;    /* written only by the device's thread */
  _Atomic long long taken;    /* added to by any other thread */
  _Atomic long long peak;     /* written only by the device's thread */
  char pad[SHM_LINE_PAIR - 3 * sizeof(long long)];
} DevMem;

/* Set before the device threads start (pthread_create orders it before
 * their reads); [old_devmem] keeps the set before the last growth
 * reachable for a thread that read the pointer just before it. */
static DevMem *devmem, *old_devmem;
static int ndevmem;
_Thread_local int shm_mem_device = -1;

int shm_mem_track_devices(int n) {
  if (n <= ndevmem) return 0;
  DevMem *m = shm_pair_alloc(sizeof(DevMem) * (size_t)n);
  if (!m) return -1;
  for (int i = 0; i < ndevmem; i++) {   /* no device thread runs: plain copies */
    atomic_init(&m[i].added, atomic_load(&devmem[i].added));
    atomic_init(&m[i].taken, atomic_load(&devmem[i].taken));
    atomic_init(&m[i].peak, atomic_load(&devmem[i].peak));
  }
  shm_free(old_devmem);
  old_devmem = devmem;
  devmem = m;
  ndevmem = n;
  return 0;
}

void shm_mem_set_device(int device) { shm_mem_device = device; }

int shm_mem_charge_device(size_t bytes) {
  int d = shm_mem_device;
  if (d < 0 || d >= ndevmem) return 0;
  DevMem *m = &devmem[d];
  long long added = atomic_load_explicit(&m->added, memory_order_relaxed) + (long long)bytes;
  atomic_store_explicit(&m->added, added, memory_order_relaxed);
  long long now = added - atomic_load_explicit(&m->taken, memory_order_relaxed);
  if (now > atomic_load_explicit(&m->peak, memory_order_relaxed))
    atomic_store_explicit(&m->peak, now, memory_order_relaxed);
  return d + 1;
}

void shm_mem_uncharge_tag(int tag, size_t bytes) {
  if (tag <= 0 || tag > ndevmem) return;
  DevMem *m = &devmem[tag - 1];
  if (shm_mem_device == tag - 1)   /* the device's own thread: the only writer of [added] */
    atomic_store_explicit(&m->added,
                          atomic_load_explicit(&m->added, memory_order_relaxed) - (long long)bytes,
                          memory_order_relaxed);
  else
    atomic_fetch_add_explicit(&m->taken, (long long)bytes, memory_order_relaxed);
}

bool shm_mem_device_stats(int device, long long *in_use, long long *peak) {
  *in_use = *peak = 0;
  if (device < 0 || device >= ndevmem) return false;
  const DevMem *m = &devmem[device];
  *in_use = atomic_load_explicit(&m->added, memory_order_relaxed) -
            atomic_load_explicit(&m->taken, memory_order_relaxed);
  *peak = atomic_load_explicit(&m->peak, memory_order_relaxed);
  return true;
}
