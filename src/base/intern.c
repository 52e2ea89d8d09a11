/*
 * intern.c - the table of interned names (intern.h).
 *
 * An open-addressing hash table (linear probing, FNV-1a hashes) of
 * NUL-terminated copies.  It only grows: names live until exit, so a
 * pointer handed out once stays valid and unique forever, and readers of
 * the strings need no lock.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "base/intern.h"
#include "base/mem.h"

/* intern_lock guards every field of the table below (slots, cap, count):
 * intern() is called by the parser, which may run on a device thread when a
 * body imports a module.  Never held while calling outside this file
 * except shm_malloc/shm_calloc. */
static pthread_mutex_t intern_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct Slot {
  uint64_t hash;
  const char *str;  /* NULL: empty slot */
  size_t len;
} Slot;

static Slot *slots;   /* cap entries; cap is 0 or a power of two */
static size_t cap;
static size_t count;  /* used slots; kept <= cap / 2 */

static uint64_t hash_bytes(const char *s, size_t len) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < len; i++) {
    h ^= (unsigned char)s[i];
    h *= 1099511628211ull;
  }
  return h;
}

/* The slot holding [s] or the empty slot where it belongs. */
static Slot *find_slot(Slot *tab, size_t n, uint64_t h, const char *s,
                       size_t len) {
  size_t i = (size_t)h & (n - 1);
  while (tab[i].str) {
    if (tab[i].hash == h && tab[i].len == len && !memcmp(tab[i].str, s, len))
      return &tab[i];
    i = (i + 1) & (n - 1);
  }
  return &tab[i];
}

/* Doubles the table (or makes the first one).  -1 on out of memory. */
static int grow(void) {
  size_t ncap = cap ? cap * 2 : 256;
  Slot *nt = shm_calloc(ncap, sizeof(Slot));
  if (!nt) return -1;
  for (size_t i = 0; i < cap; i++)
    if (slots[i].str)
      *find_slot(nt, ncap, slots[i].hash, slots[i].str, slots[i].len) =
          slots[i];
  shm_free(slots);
  slots = nt;
  cap = ncap;
  return 0;
}

/* Adds a copy of [s] at [slot] (an empty slot of the current table). */
static const char *insert(Slot *slot, uint64_t h, const char *s, size_t len) {
  char *copy = shm_malloc(len + 1);
  if (!copy) return NULL;
  memcpy(copy, s, len);
  copy[len] = '\0';
  slot->hash = h;
  slot->str = copy;
  slot->len = len;
  count++;
  return copy;
}

const char *intern(const char *s, size_t len) {
  uint64_t h = hash_bytes(s, len);
  const char *result = NULL;
  pthread_mutex_lock(&intern_lock);
  if ((count + 1) * 2 > cap && grow() < 0) goto out;
  Slot *slot = find_slot(slots, cap, h, s, len);
  result = slot->str ? slot->str : insert(slot, h, s, len);
out:
  pthread_mutex_unlock(&intern_lock);
  return result;
}

const char *intern_cstr(const char *s) { return intern(s, strlen(s)); }
