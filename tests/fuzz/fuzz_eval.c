/*
 * tests/fuzz/fuzz_eval.c - a libFuzzer target over the lexer, the parser
 * and the evaluator: each input is a program, run to its end or its first
 * error with the layers a script gets (meshes, shard_map, collectives on
 * four device threads, control flow, jit).  Anything but a clean return,
 * a crash, a sanitizer report, a leak or a hang, is a defect.
 *
 * Bounds that keep every input quick: 100,000 statements per program
 * (counted through eval_stmt_hook, on every thread), arrays of at most
 * 16 MiB (one BLIS product of two such stays near a second), the
 * interpreter's own recursion limit, and a deadline of
 * FUZZ_DEADLINE_MS of wall-clock time: a watchdog thread then raises
 * the Ctrl-C flag, which statements, loops (eager and compiled),
 * kernels and collectives all poll, so one long kernel or a compiled
 * loop forever ends as "interrupted" rather than as libFuzzer's timeout
 * (10 s, which a busy machine can reach with honest work).  Output goes
 * to /dev/null.  Built and run by tests/fuzz/fuzz.sh (`make fuzz`).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "array/array.h"
#include "base/error.h"
#include "base/mem.h"
#include "lang/eval.h"
#include "spmd/device.h"
#include "spmd/mesh.h"
#include "spmd/shardmap.h"
#include "transform/control.h"
#include "transform/jit.h"

#define FUZZ_DEVICES 4
#define FUZZ_MAX_STATEMENTS 100000
#define FUZZ_DEADLINE_MS 2000

static atomic_long statements;

/* The input being run, for the watchdog: whether one runs and since when.
 * Guarded by [watch_lock] so the flag is never raised after the input it
 * was meant for has ended (the next one starts with it clear). */
static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static bool watch_running;
static struct timespec watch_start;

static long ms_since(const struct timespec *t) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (now.tv_sec - t->tv_sec) * 1000L + (now.tv_nsec - t->tv_nsec) / 1000000L;
}

/* The watchdog thread: every 50 ms, interrupts an input past its deadline. */
static void *watchdog(void *unused) {
  (void)unused;
  for (;;) {
    nanosleep(&(struct timespec){0, 50 * 1000000L}, NULL);
    pthread_mutex_lock(&watch_lock);
    if (watch_running && ms_since(&watch_start) > FUZZ_DEADLINE_MS)
      atomic_store(&shm_interrupted, 1);
    pthread_mutex_unlock(&watch_lock);
  }
  return NULL;
}

/* Marks an input as started (true) or ended (false), the flag cleared. */
static void watch(bool running) {
  pthread_mutex_lock(&watch_lock);
  watch_running = running;
  clock_gettime(CLOCK_MONOTONIC, &watch_start);
  atomic_store(&shm_interrupted, 0);
  pthread_mutex_unlock(&watch_lock);
}

/* eval_stmt_hook: stops a program that runs too long (a loop forever). */
static int budget(Frame *f, const Node *stmt) {
  (void)f, (void)stmt;
  if (atomic_fetch_add_explicit(&statements, 1, memory_order_relaxed) < FUZZ_MAX_STATEMENTS)
    return 0;
  err_set(ERR_INTERRUPT, "statement budget exhausted");
  return -1;
}

/* The interpreter, once: the layers registered as cli/main.c does. */
static void start(void) {
  if (!freopen("/dev/null", "w", stdout)) abort();
  arr_set_max_bytes((int64_t)16 << 20);
  if (interp_init(FUZZ_DEVICES) < 0) abort();
  Env *b = shm_interp->builtins;
  if (mesh_register(b) < 0 || shardmap_register(b) < 0 || ctl_register(b) < 0 ||
      jit_register(b) < 0 || dev_start(FUZZ_DEVICES) < 0)
    abort();
  eval_stmt_hook = budget;
  pthread_t t;
  if (pthread_create(&t, NULL, watchdog, NULL) != 0) abort();
  pthread_detach(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int started;
  if (!started++) start();
  char *text = malloc(size + 1);
  if (!text) return 0;
  memcpy(text, data, size);
  text[size] = '\0';
  Source *src = src_new("<fuzz>", text);
  free(text);
  Env *globals = src ? env_new(NULL) : NULL;
  if (globals) {
    atomic_store(&statements, 0);
    watch(true);
    eval_source(src, globals, false);
    watch(false);
    err_clear();
    env_clear(globals);   /* functions defined here hold the scope */
    env_decref(globals);
  }
  src_decref(src);
  return 0;
}
