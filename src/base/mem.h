/*
 * mem.h - the one allocation choke point.
 *
 * Every heap allocation in shmap goes through shm_malloc/shm_free (small
 * objects) or shm_buf_alloc/shm_buf_free (array payloads).  Funnelling them
 * here lets a test build count allocations and fail the Nth one
 * (SHMAP_FAIL_ALLOC), and lets large array buffers get transparent huge
 * pages and be recycled: a fresh 40 MB buffer costs more in page faults
 * than `x * y + z` costs in arithmetic, so eager code must not be bound by
 * the kernel's allocator.  Smaller payloads come from malloc, tuned at
 * start-up (mem.c, shm_malloc_tune) to keep freed heap memory mapped, so
 * they too reuse warm pages (bench/pagefaults.sh counts the faults).
 *
 * Thread safety: every function here may be called from any device thread.
 * The buffer cache is guarded by one mutex (mem.c: cache_lock), held only
 * while a free list is searched or pushed.
 */
#ifndef SHMAP_MEM_H
#define SHMAP_MEM_H

#include <stdbool.h>
#include <stddef.h>

/* Allocates [n] bytes (n may be 0).  Returns NULL only when the system is
 * out of memory or an injected failure fires; callers raise an error then. */
void *shm_malloc(size_t n);

/* Like shm_malloc, zero-filled, for [count] elements of [size] bytes; NULL
 * on overflow of count*size as well as out of memory. */
void *shm_calloc(size_t count, size_t size);

/* Resizes [p] (which may be NULL) to [n] bytes; NULL on failure, [p] kept. */
void *shm_realloc(void *p, size_t n);

/* Frees [p] (NULL is allowed). */
void shm_free(void *p);

/* memcpy that allows [src] == NULL when [n] == 0 (plain memcpy makes that
 * undefined, and empty lists of values often have no storage). */
static inline void shm_memcpy(void *dst, const void *src, size_t n) {
  if (n) __builtin_memcpy(dst, src, n);
}

/* Duplicates the NUL-terminated string [s]; NULL on out of memory. */
char *shm_strdup(const char *s);

/* Allocates an array payload of [nbytes], 64-byte aligned.  Buffers of 2 MiB
 * and more are advised to use huge pages and are recycled through a small
 * size-keyed cache, so a steady-state eager loop does no page faulting.
 * The contents are undefined.  NULL on out of memory. */
void *shm_buf_alloc(size_t nbytes);

/* Returns a payload from shm_buf_alloc of the same [nbytes]. */
void shm_buf_free(void *p, size_t nbytes);

/* Allocates [nbytes] zeroed, on a boundary of SHM_LINE_PAIR bytes and
 * padded to a multiple of it, for memory that threads write concurrently:
 * x86's spatial prefetcher moves cache lines in aligned pairs, so data of
 * two threads must not share a pair, not only a line.  Freed with
 * shm_free.  NULL on out of memory. */
#define SHM_LINE_PAIR 128
void *shm_pair_alloc(size_t nbytes);

/* Gives the pages wholly inside [p, p + n) back to the system
 * (madvise MADV_DONTNEED): they read as zeros after, and count in no
 * process's resident memory until written again.  For memory from
 * shm_buf_alloc. */
void shm_release_pages(void *p, size_t n);

/* Whether the pages of [p, p + n) (memory from shm_buf_alloc) may be
 * transparent huge pages ([on], as shm_buf_alloc makes large buffers)
 * or only small ones: a buffer written in runs that are not whole huge
 * pages, whose gaps are to stay unbacked (madvise MADV_NOHUGEPAGE). */
void shm_huge_pages(void *p, size_t n, bool on);

/* Releases every cached buffer (at exit, and before leak checks). */
void shm_buf_trim(void);

/* Bounds the bytes of released buffers the cache keeps for reuse (the
 * configuration's memory.buffer_cache_mib; 0 keeps none); what a release
 * would put past the bound goes back to the system.  Releases what the
 * cache holds now.  Any thread. */
#define SHM_BUF_CACHE_DEFAULT ((size_t)256 << 20)
void shm_buf_cache_limit(size_t bytes);

/* Bytes of released buffers the cache holds now (for tests and
 * statistics).  A large allocation the cache cannot serve empties it
 * first: the program has moved on to other sizes. */
size_t shm_buf_cached(void);

/* Test hook: the [n]th allocation from now fails (0 disables).  Also read
 * from the environment variable SHMAP_FAIL_ALLOC at start-up. */
void shm_mem_fail_after(long n);

/* How many allocations are left before the injected failure: 0 when it
 * has fired or none was asked for.  With SHMAP_FAIL_ALLOC=N set, N minus
 * this is the count of allocations the run made (every thread's), which
 * is how a test learns how far to walk N. */
long shm_mem_fail_pending(void);

/* Number of allocations this thread made through shm_malloc/shm_buf_alloc
 * so far. */
long shm_mem_count(void);

/* Bytes this thread asked of shm_malloc and shm_calloc so far (not
 * realloc, not array payloads): tests bound what an operation allocates,
 * e.g. that lexing stays linear in the source's size. */
long long shm_mem_bytes(void);

/* ---- per-device accounting of array payloads --------------------------------
 *
 * What a device holds, as XLA's allocator statistics report it (jax's
 * Device.memory_stats(): bytes_in_use, peak_bytes_in_use).  A device
 * thread names its device once (shm_mem_set_device); from then on every
 * array payload made on that thread is charged to the device
 * (shm_mem_charge, called by array.c for each Buffer, whose tag the
 * Buffer keeps) until the payload is freed, on whatever thread frees it
 * (shm_mem_uncharge).  The shard_map call machinery charges the argument
 * blocks it hands a device (views of the global arrays: on hardware the
 * device's own memory) for as long as the body runs.  The high-water
 * mark is exact: only the device's own thread adds, so it compares the
 * sum it made with the mark, while others only subtract.  Threads that
 * name no device (the main thread) charge nothing.  Cost: a plain load
 * and store on the device's own cache-line pair per payload made and
 * freed on its thread (one writer: no atomic read-modify-write); an
 * atomic add when another thread frees it. */

/* Makes counters for devices 0..[n)-1 (all zero).  Called by the device
 * pool before its threads start; a later call with a larger [n] makes
 * new counters (the old ones stay, unused).  0, or -1 on out of memory
 * (the caller raises it). */
int shm_mem_track_devices(int n);

/* This thread allocates for device [device] from now on (-1: for none). */
void shm_mem_set_device(int device);

/* This thread's device (shm_mem_set_device), -1 for none: read inline by
 * the two calls below, so that the host thread's arrays pay one test. */
extern _Thread_local int shm_mem_device;
int shm_mem_charge_device(size_t bytes);
void shm_mem_uncharge_tag(int tag, size_t bytes);

/* Adds [bytes] to the bytes in use of this thread's device and moves its
 * high-water mark.  Returns the tag to give shm_mem_uncharge: 1 + the
 * device, or 0 when this thread names no tracked device. */
static inline int shm_mem_charge(size_t bytes) {
  return shm_mem_device < 0 ? 0 : shm_mem_charge_device(bytes);
}

/* Takes [bytes] charged under [tag] (shm_mem_charge's) off its device;
 * a no-op for tag 0.  Any thread. */
static inline void shm_mem_uncharge(int tag, size_t bytes) {
  if (tag > 0) shm_mem_uncharge_tag(tag, bytes);
}

/* The bytes device [device]'s payloads hold now (*[in_use]) and their
 * most since the start (*[peak]).  False (both 0) for a device without
 * counters.  Any thread; a running device's figures move meanwhile. */
bool shm_mem_device_stats(int device, long long *in_use, long long *peak);

#endif
