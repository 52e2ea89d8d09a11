/*
 * fused_loop.h - fusion of elementwise chains into one blocked loop, a pass of
 * the compiler (compile.h, step 4).
 *
 * A fusible run is a sequence of elementwise equations (PK_UNARY /
 * PK_BINARY, every operand and result f32 or bool, so comparisons and
 * select_n join in) whose results all have one shape S of more than
 * CMP_BLOCK elements (smaller ones stay in cache unfused), each
 * operand being of shape S or 0-d, or a view of an outside operand as
 * shape S (broadcast_in_dim, FuseRule.dims: read at stride 0 where it
 * is broadcast, never materialised), optionally closed by a float32
 * reduce_sum over every axis of a value of the run.  compile.c schedules
 * such equations next to each other first when nothing in between needs
 * them.
 * The run becomes a small program over "registers" (CMP_BLOCK floats
 * each), executed block by block, a whole block in two lines of 1024
 * elements so that the lines of the registers and operands stay in the
 * first-level cache between instructions: an operand read from memory is
 * read in place, a value only the run uses lives in a register, a value
 * used after the run is written to its slot.  So
 * `sum(x + sin(y) * 3. - x*y)` reads x and y once and writes nothing but
 * the sum.
 *
 * Exactness: add, sub, mul, div, max, min, neg, abs and sqrt over f32 are
 * the same C expressions the eager kernels use, as is integer_pow by 2
 * (x * x, run as mul: a loss's square) (two of add, sub, mul and
 * div in a row, the first's value read only by the second, run in one
 * pass as the same two IEEE operations); sin, cos, exp and log call the
 * eager kernels' vectorised routines (kernels.h); every other operation
 * calls its eager kernel on block-sized views.  Results therefore equal
 * eager evaluation bit for bit, except a fused sum, which adds blockwise
 * then pairwise over the block sums (allclose to eager).
 *
 * References: while compiling, an operand is a variable id (>= 0) or a
 * constant slot (-1 - slot), as compile.c encodes them; fuse_resolve turns
 * them into slots once buffers are planned.
 */
#ifndef SHMAP_FUSED_LOOP_H
#define SHMAP_FUSED_LOOP_H

#include "transform/plan.h"

/* Most equations in one fused run. */
#define FUSE_RUN_MAX 24

/* One step seen by the pass: its equation (NULL for a step that is not a
 * kernel call) and its operand and result references (borrowed). */
typedef struct FuseItem {
  const PlanEqn *eqn;
  const int *in, *out;
} FuseItem;

/* What the pass reads about the plan being compiled. */
typedef struct FuseEnv {
  const Plan *p;          /* avals of variables */
  const int *uses;        /* readers of each variable among all steps and outputs */
  const AVal *(*const_aval)(void *ctx, int slot);  /* aval of a constant slot */
  bool (*const_splat)(void *ctx, int slot);        /* a constant of one value repeated */
  void *ctx;
} FuseEnv;

typedef struct Fused Fused;

/* Public summary of a fused program, for workspace sizing. */
struct Fused {
  int nregs;              /* registers of CMP_BLOCK floats needed */
  int64_t npartials;      /* partial sums of a closing reduction */
  bool split;             /* long enough to run on two cores (a second lane) */
  int neqns;              /* the plan's equations it runs (borrowed, owned array), */
  const PlanEqn **eqns;   /* in its order: not always adjacent in the plan */
  void *impl;             /* fused_loop.c's program */
};

/* Registers and block views of a fused loop. */
typedef struct FuseLane {
  float *regs;            /* nregs * CMP_BLOCK floats, 64-byte aligned */
  void *views;            /* block view headers for kernel calls */
} FuseLane;

/* The scratch of one workspace. */
typedef struct FuseMem {
  FuseLane lane;
  FuseLane lane2;         /* the second core's, when a long loop is split */
  size_t regs_bytes;
  float *partials;        /* one per block of a closing reduction */
  size_t partials_bytes;
} FuseMem;

/* Whether a fused loop reads operand [ref] as a scalar: a 0-d value, or
 * a constant of one value repeated (read as that value, the same bits). */
bool fuse_reads_scalar(const FuseEnv *fe, int ref);

/* Length of the fusible run starting at item [i] of [n] (0 or 1: none). */
int fuse_run_length(const FuseEnv *fe, const FuseItem *items, int i, int n);

/* Where item [k] could join the run [i, j): at position [j] (an
 * elementwise equation of the run's shape, or its closing sum), or, when
 * the run is closed by its sum, at [j - 1] before the sum (an elementwise
 * equation: the sum reads a value of the run wherever that one sits).
 * -1: it cannot join. */
int fuse_join_at(const FuseEnv *fe, const FuseItem *items, int i, int j, int k);

/* True when item [x], an elementwise equation, and item [c], an
 * elementwise equation reading its result, would be one fused loop were
 * they next to each other (one shape of more than CMP_BLOCK elements). */
bool fuse_feeds(const FuseEnv *fe, const FuseItem *x, const FuseItem *c);

/* Builds the program for items [i, i+len); sets the fused step's operand
 * references (*nin, *in: shm_malloc'd) and results (*nout, *out).  NULL
 * with the error set on nomem. */
Fused *fuse_build(const FuseEnv *fe, const FuseItem *items, int i, int len, int *nin,
                  int **in, int *nout, int **out);

/* Turns references into slots: [var_slot] maps variables to slots. */
void fuse_resolve(Fused *f, const int *var_slot);

/* Runs [f] over the slot arrays [slots] with scratch [m].  0 or -1. */
int fuse_run(const Fused *f, Array **slots, FuseMem *m);

void fuse_free(Fused *f);

/* Allocates the scratch for [nregs] registers and [npartials] sums, with
 * the second core's registers when [split] (some loop has Fused.split). */
int fuse_mem_init(FuseMem *m, int nregs, int64_t npartials, bool split);
void fuse_mem_free(FuseMem *m);

#endif
