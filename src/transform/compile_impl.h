/*
 * compile_impl.h - the compiled executor's internals (compile.c), shared
 * with the rules of the higher-order primitives (higher.h) that prepare
 * and run their steps: control_rules.c (cond, while, scan), jit_rules.c
 * (pjit, debug_callback), shardmap_rules.c (shard_map), xmap.c (xmap).  Not for any other
 * file: the executor's layout may change with it.
 *
 * An Exec is a plan compiled to steps over numbered slots; a Workspace
 * holds one run's arrays for them.  A higher-order step's rule reads its
 * operands and writes its results through the workspace's slots
 * (cmp_step_ins, cmp_step_outs), keeps its per-run arrays in the scratch
 * it reserved when prepared (cmp_add_scratch, from Step.scratch on), and
 * runs its sub-plans with cmp_run_into, or, across the iterations of a
 * loop, holding their workspaces (cmp_held_take, cmp_run_body) and from
 * tapes when their steps are all row loops (cmp_tape_build).
 */
#ifndef SHMAP_COMPILE_IMPL_H
#define SHMAP_COMPILE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "array/kernels.h"
#include "base/mem.h"
#include "transform/compile.h"
#include "transform/fused_loop.h"

/* ==== executable form ======================================================= */

/* SL_VIEW: a result its step makes itself each run, held in the slot
 * until the run ends and never written by another step: a reshape's view
 * of its operand, a shard_map's assembled result (cmp_adopt).  Eager
 * evaluation copies neither, so a plan does not copy them into a buffer
 * of its own either. */
typedef enum { SL_INPUT, SL_CONST, SL_TEMP, SL_OUTPUT, SL_VIEW } SlotKind;

typedef struct Slot {
  SlotKind kind;
  AVal aval;
  int index;        /* SL_INPUT: input number; SL_OUTPUT: output number */
  Value *value;     /* SL_CONST: the array (owned) */
  bool splat;       /* SL_CONST: one value repeated (a folded broadcast of a
                       scalar), which a fused loop reads as that scalar */
} Slot;

/* A kernel, a fused loop, or a higher-order primitive's step, which its
 * row's rules prepare and run (higher.h). */
typedef enum { ST_KERNEL, ST_FUSED, ST_HIGHER } StepKind;

typedef struct CmpStep {
  StepKind kind;
  const PlanEqn *eqn;  /* borrowed from the plan: prim and params (ST_FUSED: its
                          first equation; Fused.eqns lists them all) */
  int nin, nout;
  int *in, *out;       /* references while compiling, slots afterwards */
  Fused *fused;        /* ST_FUSED, owned */
  Value *own;          /* ST_HIGHER: what its prepare rule made (shard_map's ShardFn,
                          xmap's lowered plan), owned, or NULL */
  PlanEqn *folded;     /* ST_KERNEL: the equation as compiled, when it differs from
                          the plan's (a product reading a transpose's operand):
                          eqn points here; owned, its out borrowed, or NULL */
  int scratch;         /* first scratch array of this step */
  KernRow2 row2;       /* ST_KERNEL: a small elementwise step's row loop, its dispatch */
  KernRow1 row1;       /* resolved when compiled (resolve_rows), or NULL */
  bool view;           /* ST_KERNEL: a reshape, squeeze or expand_dims whose result
                          is its operand's buffer, in an SL_VIEW slot (run_view) */
} Step;

typedef struct CmpWorkspace Workspace;

/* Per-thread workspace slots of a plan: a thread uses slot
 * (its ordinal % WS_SLOTS); ordinals are handed out on first use. */
#define WS_SLOTS 16

/* Most steps and copies a loop body may have to run from a tape; a
 * longer body's dispatch is a small part of its time. */
#define TAPE_MAX 24

typedef struct CmpExec {
  int nslots, capslots;
  Slot *slots;
  int nsteps;
  Step *steps;
  int nin, nout;
  int *in_slot, *out_slot;
  bool *out_copy;      /* output i is copied from out_slot[i], not bound */
  bool *in_contig;     /* input i is read in place (fused, scan): make it contiguous */
  int *out_in_place;   /* output i may be written over input out_in_place[i] (-1: none):
                          cmp_out_in_place */
  int ncontig;         /* how many in_contig are true */
  int nbound, ncopied; /* outputs bound in place and outputs copied, */
  int *bound, *copied; /* listed by index: a run reads no flags */
  int nscratch, capscratch;
  AVal *scratch;       /* avals of per-workspace scratch arrays */
  int nregs;           /* fused registers needed */
  int64_t npartials;   /* fused reduction partial sums needed */
  bool split;          /* some fused loop runs on two cores */
  int nviews;          /* the SL_VIEW slots, emptied at the end of every run */
  int *views;
  bool tapeable;       /* every step a row loop: a loop runs it from a tape */
  /* Idle workspaces.  A thread first looks in its own slot of [mine]
   * (64 bytes apart: never two on one cache line, so a loop running a plan over and over takes
   * and gives back its workspace without a lock or a shared line); the
   * locked [pool] holds the rest (a plan entered again on the same
   * thread, threads beyond WS_SLOTS). */
  struct { _Atomic(Workspace *) w; char pad[64 - sizeof(void *)]; } mine[WS_SLOTS];
  pthread_mutex_t lock;/* guards [pool] */
  Workspace *pool;
} Exec;

struct CmpWorkspace {
  Workspace *next;
  Array **slot;        /* TEMP: owned; CONST: borrowed; INPUT/OUTPUT: bound per run;
                          VIEW: owned during a run, NULL between runs */
  Array **scratch;     /* owned */
  Array **ops;         /* owned: a step's operand lists (ws_ops_len), so no step has a
                          fixed limit on its operands */
  Value **vargs;       /* owned: the operands as values, for calls out */
  Array **kept;        /* owned: [nout] private views of the last device-body run's
                          output buffers (NULL: none), reused once no one else
                          holds them (compile.c: fresh_output) */
  FuseMem fm;          /* registers and partials for fused steps */
};

/* Reserves a per-workspace scratch array of aval [a] for the step being
 * prepared: its index, or -1 with the error set (out of memory). */
int cmp_add_scratch(Exec *e, const AVal *a);

/* The sub-plan parameter [name] of [q], or NULL when it is not a plan. */
static inline Plan *cmp_param_plan(const PlanEqn *q, const char *name) {
  Value *v = params_get(&q->params, name);
  return v && IS_PLAN(v) ? AS_PLAN(v) : NULL;
}

/* Whether a run of [e] may be given one array as both its input [in] and
 * its output [out], the output then written over the input: the output
 * is the input changed by in-place updates (dynamic_update_slice,
 * scatter) and no step reads the input after the first of them
 * (compile.c's buffer planning).  A loop uses it for a carry it owns. */
static inline bool cmp_out_in_place(const Exec *e, int out, int in) {
  return out < e->nout && e->out_in_place[out] == in;
}

/* ==== running a step ========================================================= */

/* Copies [src] (any layout) into the contiguous [dst] of the same aval. */
static inline void cmp_copy_into(Array *dst, Array *src) {
  if (dst == src) return;
  size_t n = (size_t)dst->size * dt_size(dst->dtype);
  if (!src->contiguous) kern_copy_to_contiguous(arr_data(dst), src);
  else if (n == 4) memcpy(arr_data(dst), arr_data(src), 4);   /* a loop's scalar carries: */
  else if (n == 8) memcpy(arr_data(dst), arr_data(src), 8);   /* a move, not a call */
  else shm_memcpy(arr_data(dst), arr_data(src), n);
}

/* Result [k] of higher-order step [s] when its slot is an SL_VIEW (empty
 * during the run: the rule's HigherRules.adopts_results): a reference to
 * [x] (borrowed) as a new header, not a copy, unless [x]'s buffer is a
 * plan's workspace memory (arr_pin: another step or run writes it again),
 * part of a process's run only, or not contiguous; those are copied into
 * a new array.  0, or -1 with the error set (out of memory). */
int cmp_adopt(Step *s, Workspace *w, int k, Array *x);

/* The step's operand arrays from input [first] on, in the workspace's
 * operand list. */
static inline Array **cmp_step_ins(Step *s, Workspace *w, int first) {
  for (int k = first; k < s->nin; k++) w->ops[k - first] = w->slot[s->in[k]];
  return w->ops;
}

/* The step's result arrays, after its inputs in the operand list. */
static inline Array **cmp_step_outs(Step *s, Workspace *w) {
  Array **buf = w->ops + s->nin;
  for (int k = 0; k < s->nout; k++) buf[k] = w->slot[s->out[k]];
  return buf;
}

/* The operand list's room for a loop body's inputs, and a scan body's
 * outputs (ws_ops_len). */
static inline Array **cmp_body_ins(Step *s, Workspace *w) { return w->ops + s->nin + s->nout; }
static inline Array **cmp_body_outs(Step *s, Workspace *w) {
  return w->ops + 2 * (s->nin + s->nout);
}

/* The step's operands as values, for calls out of the plan. */
static inline Value **cmp_step_values(Step *s, Workspace *w) {
  for (int k = 0; k < s->nin; k++) w->vargs[k] = &w->slot[s->in[k]]->hdr;
  return w->vargs;
}

/* -1 with ERR_INTERRUPT set after Ctrl-C, else 0: a loop looks between
 * iterations. */
static inline int cmp_interrupted(void) {
  if (!atomic_load_explicit(&shm_interrupted, memory_order_relaxed)) return 0;
  err_set(ERR_INTERRUPT, "interrupted");
  return -1;
}

/* ==== sub-plans held across a loop =========================================== */

/* A sub-plan with a workspace of its own held across a loop: taken once
 * before the first iteration and given back after the last, so an
 * iteration pays neither the take nor the give (an exchange and a
 * compare-and-swap on the plan's slot). */
typedef struct Held {
  Exec *e;
  Workspace *w;
} Held;

/* Takes a workspace of compiled [p] into [h]: 0, or -1 with the error set
 * (not compiled, out of memory).  cmp_held_give gives it back (NULL-safe). */
int cmp_held_take(Plan *p, Held *h);
void cmp_held_give(Held *h);

/* Runs a loop body plan on (consts ++ carry ++ extra), gathered in [ins],
 * into [outs]: 0, or -1 with the error set. */
int cmp_run_body(Held *body, Array **consts, int nconsts, Array **carry, int ncarry,
                 Array **extra, int nextra, Array **outs, Array **ins);

/* ==== tapes ==================================================================== */

/* A step resolved to data pointers: a row loop over arrays bound once, or
 * (both rows NULL) a copy of [n] bytes from [a] to [o]. */
typedef struct TapeOp {
  KernRow2 row2;
  KernRow1 row1;
  const void *a, *b;
  void *o;
  int64_t sa, sb, n;
} TapeOp;

/* A plan's run resolved to pointers for one binding of its inputs and
 * outputs: a while loop's carries alternate between the same two sets,
 * so every pointer its small body touches is known before the first
 * iteration, and an iteration is a few calls of row loops. */
typedef struct Tape {
  int n;
  TapeOp op[TAPE_MAX];
} Tape;

/* Binds [in] and [out] in [w] and resolves [e]'s steps and copied outputs
 * into [t].  False when a step's operands are not laid out for its row
 * loop, or a copied output's source is not contiguous. */
bool cmp_tape_build(Exec *e, Workspace *w, Array **in, Array **out, Tape *t);

static inline void cmp_tape_op_run(const TapeOp *op) {
  if (op->row2) op->row2(op->a, op->sa, op->b, op->sb, op->o, op->n);
  else if (op->row1) op->row1(op->a, op->o, op->n);
  else memcpy(op->o, op->a, (size_t)op->n);
}

static inline void cmp_tape_run(const Tape *t) {
  for (int i = 0; i < t->n; i++) cmp_tape_op_run(&t->op[i]);
}

#endif
