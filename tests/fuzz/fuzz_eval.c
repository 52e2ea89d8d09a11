/*
 * tests/fuzz/fuzz_eval.c - a libFuzzer target over the lexer, the parser
 * and the evaluator: each input is a program, run to its end or its first
 * error with the layers a script gets (meshes, shard_map, collectives on
 * four device threads, control flow, jit).  Anything but a clean return,
 * a crash, a sanitizer report, a leak or a hang, is a defect.
 *
 * Bounds that keep every input quick: 100,000 statements per program
 * (counted through eval_stmt_hook, on every thread), arrays of at most
 * 64 MiB, the interpreter's own recursion limit.  Output goes to
 * /dev/null.  Built and run by tests/fuzz/fuzz.sh (`make fuzz`).
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static atomic_long statements;

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
  arr_set_max_bytes((int64_t)64 << 20);
  if (interp_init(FUZZ_DEVICES) < 0) abort();
  Env *b = shm_interp->builtins;
  if (mesh_register(b) < 0 || shardmap_register(b) < 0 || ctl_register(b) < 0 ||
      jit_register(b) < 0 || dev_start(FUZZ_DEVICES) < 0)
    abort();
  eval_stmt_hook = budget;
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
    eval_source(src, globals, false);
    err_clear();
    atomic_store(&shm_interrupted, 0);
    env_clear(globals);   /* functions defined here hold the scope */
    env_decref(globals);
  }
  src_decref(src);
  return 0;
}
