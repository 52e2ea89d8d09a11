/*
 * fused_loop.c - fused elementwise loops (fused_loop.h).
 */
/* Vectorised as the eager kernels are (kern_elementwise.c), with the same
 * floating-point options so both compute the same bits. */
#pragma GCC optimize("O3", "no-math-errno", "no-trapping-math")
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "transform/compile.h"
#include "transform/fused_loop.h"
#include "array/kernels.h"
#include "base/mem.h"

/* The loops are compiled for AVX-512, AVX2 and baseline x86-64, picked at
 * load time as kern_elementwise.c's are (not under sanitizers, whose
 * runtimes are not ready when ifunc resolvers run). */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define FUSE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define FUSE_CLONES
#endif

#define FUSE_MAX_REGS 16

typedef enum { FK_REG, FK_MEM, FK_SCALAR } FKind;

/* A value in the program: register [idx], or slot [idx] (a reference
 * until fuse_resolve) read in place (FK_MEM) or broadcast (FK_SCALAR). */
typedef struct FRef {
  FKind kind;
  int idx;
  DType dtype;   /* f32, or bool (comparisons, select_n's predicate) */
} FRef;

typedef enum {
  FO_LOOP,    /* the primitive's float32 loop (PrimRules.fuse) */
  FO_KERNEL,  /* its kernel, over views of the block */
  FO_PAIR,    /* two arithmetic operations in one pass: see pair_up */
  FO_VIEW,    /* a layout view of an outside operand (FuseRule.dims),
                 read at its strides, 0 where it is broadcast */
  FO_VIEW_BIN /* a view read once by the binary loop after it: see fold_view */
} FOp;

typedef struct FInstr {
  FOp op;
  const FuseRule *rule; /* FO_LOOP: the loop */
  const PlanEqn *eqn;   /* for FO_KERNEL: prim and params */
  int nin;
  FRef in[3];
  FRef dst;
  int pair;             /* FO_PAIR: which of the pair loops (pair_loops);
                           FO_VIEW_BIN: 1 when the view is the left operand */
  int8_t src_dim[SHM_MAXDIM]; /* FO_VIEW(_BIN): the operand dimension of each
                                 result dimension, -1 for a new one */
} FInstr;

typedef struct Prog {
  int n;
  FInstr ins[FUSE_RUN_MAX];
  int64_t size;         /* elements of the run's shape */
  int ndim;             /* the run's shape, for FO_VIEW's indexing */
  int64_t shape[SHM_MAXDIM];
  bool split;           /* run on two cores: long, and no kernel call */
  bool reduce;
  FRef red_src, red_dst;
} Prog;

/* ==== deciding ================================================================ */

static const AVal *ref_aval(const FuseEnv *fe, int ref) {
  return ref >= 0 ? &fe->p->vars[ref] : fe->const_aval(fe->ctx, -1 - ref);
}

static bool same_shape(const AVal *a, const AVal *b) {
  return a->ndim == b->ndim && !memcmp(a->shape, b->shape, sizeof(int64_t) * (size_t)a->ndim);
}

static bool fused_dtype(DType t) { return t == DT_F32 || t == DT_BOOL; }

/* True when [it] is a view of an outside operand of another shape as
 * the run's shape [s] (FuseRule.dims; a value of the run has shape [s],
 * so the operand is never one of the run's, which lives in registers). */
static bool fusible_view(const FuseEnv *fe, const FuseItem *it, const AVal *s) {
  const FuseRule *r = prim_table[it->eqn->prim].rules.fuse;
  if (!r || !r->dims || it->eqn->nin != 1 || it->eqn->nout != 1) return false;
  const AVal *o = &fe->p->vars[it->out[0]], *a = ref_aval(fe, it->in[0]);
  return fused_dtype(o->dtype) && a->dtype == o->dtype && o->ndim > 0 && same_shape(o, s) &&
         !same_shape(a, s);
}

/* True when [it] is an elementwise equation over shape [s] whose values
 * are all f32 or bool, or a view read in place (fusible_view). */
static bool fusible(const FuseEnv *fe, const FuseItem *it, const AVal *s) {
  if (!it->eqn) return false;
  if (fusible_view(fe, it, s)) return true;
  PrimKind k = prim_table[it->eqn->prim].kind;
  if ((k != PK_UNARY && k != PK_BINARY) || it->eqn->nout != 1 || it->eqn->nin > 3) return false;
  const AVal *o = &fe->p->vars[it->out[0]];
  if (!fused_dtype(o->dtype) || o->ndim == 0 || !same_shape(o, s)) return false;
  for (int k2 = 0; k2 < it->eqn->nin; k2++) {
    const AVal *a = ref_aval(fe, it->in[k2]);
    if (!fused_dtype(a->dtype) || (a->ndim != 0 && !same_shape(a, s))) return false;
  }
  return true;
}

/* Whether [e] is a reduction that may close a run (FuseRule.sum). */
static bool sums(const PlanEqn *e) {
  const FuseRule *r = prim_table[e->prim].rules.fuse;
  return r && r->sum;
}

/* True when [it] is a closing sum of every axis of a value defined in
 * the run [i, j). */
static bool closing_sum(const FuseEnv *fe, const FuseItem *items, int i, int j, const FuseItem *it) {
  if (!it->eqn || !sums(it->eqn) || it->in[0] < 0) return false;
  const AVal *a = &fe->p->vars[it->in[0]];
  if (a->dtype != DT_F32 || fe->p->vars[it->out[0]].ndim != 0) return false;
  for (int k = i; k < j; k++)
    if (items[k].out[0] == it->in[0]) return true;
  return false;
}

int fuse_run_length(const FuseEnv *fe, const FuseItem *items, int i, int n) {
  if (!items[i].eqn) return 0;
  const AVal *s = &fe->p->vars[items[i].out[0]];
  /* within one block every temporary stays in the first-level cache
   * anyway: fusing would only trade each step's resolved row loop for
   * the fused program's dispatch, which costs more (a small loop body) */
  if (!fusible(fe, &items[i], s) || shape_size(s->ndim, s->shape) <= CMP_BLOCK) return 0;
  int j = i + 1;
  while (j < n && j - i < FUSE_RUN_MAX - 1 && fusible(fe, &items[j], s)) j++;
  if (j < n && closing_sum(fe, items, i, j, &items[j])) j++;
  return j - i;
}

int fuse_join_at(const FuseEnv *fe, const FuseItem *items, int i, int j, int k) {
  if (!items[i].eqn || !items[k].eqn || j - i >= FUSE_RUN_MAX - 1) return -1;
  const AVal *s = &fe->p->vars[items[i].out[0]];
  if (sums(items[j - 1].eqn))   /* closed: an elementwise step goes before its sum */
    return fusible(fe, &items[k], s) && !sums(items[k].eqn) ? j - 1 : -1;
  return fusible(fe, &items[k], s) || closing_sum(fe, items, i, j, &items[k]) ? j : -1;
}

bool fuse_feeds(const FuseEnv *fe, const FuseItem *x, const FuseItem *c) {
  if (!x->eqn || !c->eqn || x->eqn->nout != 1 || c->eqn->nout != 1) return false;
  PrimKind k = prim_table[x->eqn->prim].kind;
  if (k != PK_UNARY && k != PK_BINARY) return false;
  const AVal *s = &fe->p->vars[x->out[0]];
  return shape_size(s->ndim, s->shape) > CMP_BLOCK && fusible(fe, x, s) && fusible(fe, c, s) &&
         !sums(c->eqn);
}

/* ==== building ================================================================ */

typedef struct Builder {
  const FuseEnv *fe;
  const FuseItem *items;
  int i, len;
  Prog *prog;
  int *ins, nins;         /* outside operand references */
  int *outs, nouts;       /* results used after the run */
  bool reg_busy[FUSE_MAX_REGS];
  int nregs;
} Builder;

/* Index in the run of the item defining [ref], or -1. */
static int defined_at(const Builder *b, int ref) {
  for (int k = 0; ref >= 0 && k < b->len; k++)
    if (b->items[b->i + k].out[0] == ref) return k;
  return -1;
}

static int uses_in_run(const Builder *b, int var) {
  int n = 0;
  for (int k = 0; k < b->len; k++)
    for (int m = 0; m < b->items[b->i + k].eqn->nin; m++) n += b->items[b->i + k].in[m] == var;
  return n;
}

static int last_use_in_run(const Builder *b, int var) {
  int last = -1;
  for (int k = 0; k < b->len; k++)
    for (int m = 0; m < b->items[b->i + k].eqn->nin; m++)
      if (b->items[b->i + k].in[m] == var) last = k;
  return last;
}

static bool external(const Builder *b, int var) {
  return b->fe->uses[var] > uses_in_run(b, var);
}

static void add_unique(int *arr, int *n, int x) {
  for (int k = 0; k < *n; k++)
    if (arr[k] == x) return;
  arr[(*n)++] = x;
}

/* Where the value defined by item [k] lives. */
static FRef *loc_of(Builder *b, FRef *locs, int var) {
  int k = defined_at(b, var);
  return k >= 0 ? &locs[k] : NULL;
}

bool fuse_reads_scalar(const FuseEnv *fe, int ref) {
  return ref_aval(fe, ref)->ndim == 0 || (ref < 0 && fe->const_splat(fe->ctx, -1 - ref));
}

static FRef operand(Builder *b, FRef *locs, int ref) {
  FRef *l = loc_of(b, locs, ref);
  if (l) return *l;
  add_unique(b->ins, &b->nins, ref);
  return (FRef){fuse_reads_scalar(b->fe, ref) ? FK_SCALAR : FK_MEM, ref, ref_aval(b->fe, ref)->dtype};
}

static int reg_alloc(Builder *b) {
  for (int r = 0; r < FUSE_MAX_REGS; r++)
    if (!b->reg_busy[r]) {
      b->reg_busy[r] = true;
      if (r + 1 > b->nregs) b->nregs = r + 1;
      return r;
    }
  return -1;
}

/* The destination of item [k]'s result: its slot if used after the run,
 * else a register. */
static int place_result(Builder *b, FRef *locs, int k) {
  int var = b->items[b->i + k].out[0];
  DType t = b->fe->p->vars[var].dtype;
  if (external(b, var)) {
    add_unique(b->outs, &b->nouts, var);
    locs[k] = (FRef){FK_MEM, var, t};
    return 0;
  }
  int r = reg_alloc(b);
  if (r < 0) return err_set(ERR_VALUE, "jit: fused loop needs too many registers"), -1;
  locs[k] = (FRef){FK_REG, r, t};
  return 0;
}

/* Frees registers whose value item [k] read for the last time. */
static void release_regs(Builder *b, FRef *locs, int k) {
  const FuseItem *it = &b->items[b->i + k];
  for (int m = 0; m < it->eqn->nin; m++) {
    FRef *l = loc_of(b, locs, it->in[m]);
    if (l && l->kind == FK_REG && last_use_in_run(b, it->in[m]) == k) b->reg_busy[l->idx] = false;
  }
}

/* Instruction [ins] as a view of its operand (fusible_view). */
static int build_view(Builder *b, FInstr *ins, const FuseItem *it) {
  int dims[SHM_MAXDIM];
  const AVal *a = ref_aval(b->fe, it->in[0]);
  if (prim_table[it->eqn->prim].rules.fuse->dims(a, &it->eqn->params, dims) < 0) return -1;
  for (int d = 0; d < b->prog->ndim; d++) ins->src_dim[d] = (int8_t)dims[d];
  ins->op = FO_VIEW;
  ins->rule = NULL;
  return 0;
}

/* Whether [e] is integer_pow by 2. */
static bool squares(const PlanEqn *e) {
  int64_t y;
  if (e->prim != P_INTEGER_POW) return false;
  if (params_int(&e->params, "y", &y) == 0) return y == 2;
  err_clear();
  return false;
}

static int build_instr(Builder *b, FRef *locs, int k) {
  const FuseItem *it = &b->items[b->i + k];
  FInstr *ins = &b->prog->ins[b->prog->n++];
  ins->eqn = it->eqn;
  ins->nin = it->eqn->nin;
  for (int m = 0; m < ins->nin; m++) ins->in[m] = operand(b, locs, it->in[m]);
  if (place_result(b, locs, k) < 0) return -1;
  ins->dst = locs[k];
  if (fusible_view(b->fe, it, &b->fe->p->vars[it->out[0]])) {
    release_regs(b, locs, k);
    return build_view(b, ins, it);
  }
  /* the hand-written loops are f32 only; the rest calls the kernel */
  bool all_f32 = ins->dst.dtype == DT_F32;
  for (int m = 0; m < ins->nin; m++) all_f32 &= ins->in[m].dtype == DT_F32;
  const FuseRule *r = prim_table[it->eqn->prim].rules.fuse;
  if (all_f32 && squares(it->eqn)) {
    r = prim_table[P_MUL].rules.fuse;   /* x * x, its kernel's product: the same bits */
    ins->in[ins->nin++] = ins->in[0];
  }
  ins->rule = all_f32 && r && r->loop ? r : NULL;
  ins->op = ins->rule ? FO_LOOP : FO_KERNEL;
  for (int m = 0; ins->op == FO_KERNEL && m < ins->nin; m++)   /* a kernel broadcasts 0-d ones only */
    if (ins->in[m].kind == FK_SCALAR && ref_aval(b->fe, ins->in[m].idx)->ndim) ins->in[m].kind = FK_MEM;
  release_regs(b, locs, k);
  return 0;
}

static int build_reduce(Builder *b, FRef *locs, int k) {
  const FuseItem *it = &b->items[b->i + k];
  b->prog->reduce = true;
  b->prog->red_src = operand(b, locs, it->in[0]);
  b->prog->red_dst = (FRef){FK_MEM, it->out[0], DT_F32};
  add_unique(b->outs, &b->nouts, it->out[0]);
  return 0;
}

/* ---- pairs ---- */

/* The operations a pair may join: the arithmetic ones, whose vector
 * forms are the same IEEE operations as the single loops'. */
static int pair_code(const FInstr *ins) {
  switch (ins->op == FO_LOOP ? ins->rule->op : 0) {
  case '+': return 0;
  case '-': return 1;
  case '*': return 2;
  case '/': return 3;
  default: return -1;
  }
}

static bool same_reg(FRef a, FRef b) { return a.kind == FK_REG && b.kind == FK_REG && a.idx == b.idx; }

/* True when register [r] is read after instruction [k] before being
 * written again (or by the closing sum). */
static bool read_later(const Prog *p, int k, FRef r) {
  for (int j = k + 1; j < p->n; j++) {
    for (int m = 0; m < p->ins[j].nin; m++)
      if (same_reg(p->ins[j].in[m], r)) return true;
    if (same_reg(p->ins[j].dst, r)) return false;
  }
  return p->reduce && same_reg(p->red_src, r);
}

/* Joins instruction [k], t = a op1 b, and [k + 1], which reads t once as
 * one of its two operands and is the last to read it, into one pass that
 * keeps t in a vector register: d = t op2 c or c op2 t.  Each element
 * goes through the same two roundings, so the bits are those of the two
 * loops; the pass saves a store and a load of t and a loop. */
static bool pair_up(Prog *p, int k) {
  FInstr *i1 = &p->ins[k], *i2 = &p->ins[k + 1];
  int c1 = pair_code(i1), c2 = pair_code(i2);
  if (c1 < 0 || c2 < 0 || i1->dst.kind != FK_REG) return false;
  bool left = same_reg(i2->in[0], i1->dst), right = same_reg(i2->in[1], i1->dst);
  if (left == right || read_later(p, k + 1, i1->dst)) return false;
  FInstr j = *i2;
  j.op = FO_PAIR;
  j.nin = 3;
  j.in[0] = i1->in[0];
  j.in[1] = i1->in[1];
  j.in[2] = left ? i2->in[1] : i2->in[0];
  j.pair = (c1 * 4 + c2) * 2 + (left ? 0 : 1);
  *i1 = j;
  memmove(i2, i2 + 1, sizeof(FInstr) * (size_t)(p->n - k - 2));
  p->n--;
  return true;
}

static void pair_all(Prog *p) {
  for (int k = 0; k + 1 < p->n; k++) pair_up(p, k);
}

/* Joins the view [k] (FO_VIEW, f32) and the binary loop [k + 1] that
 * reads its register once, as one of its operands, and last: where the
 * view is one value along each run of the innermost dimension (a
 * per-row factor broadcast along the rows), the loop then reads that
 * value as its broadcast scalar run by run instead of a register filled
 * with it, one pass instead of two (the same operation on the same
 * values: the same bits).  The register stays the view's, for a view
 * whose innermost stride is not 0 (known when the loop runs). */
static bool fold_view(Prog *p, int k) {
  FInstr *v = &p->ins[k], *b = &p->ins[k + 1];
  if (v->op != FO_VIEW || v->dst.dtype != DT_F32 || v->dst.kind != FK_REG || b->op != FO_LOOP ||
      b->nin != 2 || p->shape[p->ndim - 1] < 16)
    return false;
  bool left = same_reg(b->in[0], v->dst), right = same_reg(b->in[1], v->dst);
  if (left == right || read_later(p, k + 1, v->dst)) return false;
  FInstr j = *b;
  j.op = FO_VIEW_BIN;
  j.nin = 3;
  j.in[0] = v->in[0];
  j.in[1] = left ? b->in[1] : b->in[0];
  j.in[2] = v->dst;
  j.pair = left;
  memcpy(j.src_dim, v->src_dim, sizeof j.src_dim);
  *v = j;
  memmove(b, b + 1, sizeof(FInstr) * (size_t)(p->n - k - 2));
  p->n--;
  return true;
}

static void fold_views(Prog *p) {
  for (int k = 0; k + 1 < p->n; k++) fold_view(p, k);
}

/* Whether every instruction is one of the loop's own (no kernel call,
 * which could fail on the helper thread, where its error would be lost). */
static bool splittable(const Prog *p) {
  for (int k = 0; k < p->n; k++)
    if (p->ins[k].op == FO_KERNEL) return false;
  return true;
}

Fused *fuse_build(const FuseEnv *fe, const FuseItem *items, int i, int len, int *nin,
                  int **in, int *nout, int **out) {
  Fused *f = shm_calloc(1, sizeof *f);
  Prog *prog = shm_calloc(1, sizeof *prog);
  FRef locs[FUSE_RUN_MAX];
  Builder b = {fe, items, i, len, prog, shm_calloc(3 * (size_t)len + 1, sizeof(int)), 0,
               shm_calloc((size_t)len + 1, sizeof(int)), 0, {0}, 0};
  if (!f || !prog || !b.ins || !b.outs) {
    err_nomem();
    goto fail;
  }
  const AVal *s = &fe->p->vars[items[i].out[0]];
  prog->size = 1;
  prog->ndim = s->ndim;
  for (int d = 0; d < s->ndim; d++) prog->size *= prog->shape[d] = s->shape[d];
  for (int k = 0; k < len; k++) {
    bool red = sums(items[i + k].eqn);
    if ((red ? build_reduce(&b, locs, k) : build_instr(&b, locs, k)) < 0) goto fail;
  }
  pair_all(prog);
  fold_views(prog);
  if (!(f->eqns = shm_malloc(sizeof *f->eqns * (size_t)len))) {
    err_nomem();
    goto fail;
  }
  for (int k = 0; k < len; k++) f->eqns[k] = items[i + k].eqn;
  f->neqns = len;
  f->impl = prog;
  f->nregs = b.nregs;
  f->npartials = prog->reduce ? prog->size / CMP_BLOCK + 2 : 0;
  f->split = prog->split = prog->size >= KERN_PAR_MIN && splittable(prog);
  *nin = b.nins;
  *in = b.ins;
  *nout = b.nouts;
  *out = b.outs;
  return f;
fail:
  shm_free(b.ins);
  shm_free(b.outs);
  shm_free(prog);
  shm_free(f);
  return NULL;
}

static void resolve_ref(FRef *r, const int *var_slot) {
  if (r->kind != FK_REG) r->idx = r->idx < 0 ? -1 - r->idx : var_slot[r->idx];
}

void fuse_resolve(Fused *f, const int *var_slot) {
  Prog *p = f->impl;
  for (int k = 0; k < p->n; k++) {
    for (int m = 0; m < p->ins[k].nin; m++) resolve_ref(&p->ins[k].in[m], var_slot);
    resolve_ref(&p->ins[k].dst, var_slot);
  }
  if (p->reduce) {
    resolve_ref(&p->red_src, var_slot);
    resolve_ref(&p->red_dst, var_slot);
  }
}

void fuse_free(Fused *f) {
  if (!f) return;
  shm_free(f->eqns);
  shm_free(f->impl);
  shm_free(f);
}

/* ==== running ================================================================== */

/* Block views for kernel calls: 4 buffers and 4 array headers. */
typedef struct Views {
  Buffer *buf[4];
  Array *arr[4];   /* one-dimensional headers */
} Views;

static int lane_init(FuseLane *l, size_t regs_bytes) {
  l->regs = shm_buf_alloc(regs_bytes);
  Views *v = shm_buf_alloc(sizeof(Views));
  if (v) memset(v, 0, sizeof *v);   /* lane_free reads every pointer, whatever failed */
  l->views = v;
  if (!l->regs || !v) return -1;
  for (int k = 0; k < 4; k++) {
    if (!(v->buf[k] = shm_buf_alloc(sizeof(Buffer)))) return -1;
    memset(v->buf[k], 0, sizeof(Buffer));
    if (!(v->arr[k] = shm_malloc(arr_header_size(1)))) return -1;
  }
  return 0;
}

static void lane_free(FuseLane *l, size_t regs_bytes) {
  Views *v = l->views;
  for (int k = 0; v && k < 4; k++) {
    if (v->buf[k]) shm_buf_free(v->buf[k], sizeof(Buffer));
    shm_free(v->arr[k]);
  }
  if (v) shm_buf_free(v, sizeof(Views));
  if (l->regs) shm_buf_free(l->regs, regs_bytes);
  l->regs = NULL;
  l->views = NULL;
}

int fuse_mem_init(FuseMem *m, int nregs, int64_t npartials, bool split) {
  memset(m, 0, sizeof *m);
  m->regs_bytes = (size_t)(nregs ? nregs : 1) * CMP_BLOCK * sizeof(float);
  m->partials_bytes = (size_t)(npartials ? npartials : 1) * sizeof(float);
  m->partials = shm_buf_alloc(m->partials_bytes);
  if (m->partials && lane_init(&m->lane, m->regs_bytes) == 0 &&
      (!split || lane_init(&m->lane2, m->regs_bytes) == 0))
    return 0;
  fuse_mem_free(m);
  err_nomem();
  return -1;
}

void fuse_mem_free(FuseMem *m) {
  lane_free(&m->lane, m->regs_bytes);
  lane_free(&m->lane2, m->regs_bytes);
  if (m->partials) shm_buf_free(m->partials, m->partials_bytes);
  memset(m, 0, sizeof *m);
}

/* A pair's loop: t = a OP1 b, then d = t OP2 c (LEFT) or c OP2 t, over
 * n elements; a broadcast operand has its flag false.  d may be the very
 * line of a, b or c (a register freed by the pair's first operation and
 * taken for its result): every element is read before it is written, in
 * vectors of 8 read whole before any is stored, so the loop is written
 * with vector types rather than left to the vectoriser, which would
 * need an overlap check. */
typedef float V8 __attribute__((vector_size(32)));

#define PAIR_OPS(X) X(add, +) X(sub, -) X(mul, *) X(div, /)
#define PAIR_LOOP(N1, O1, N2, O2, LEFT, SUF)                                     \
  static inline __attribute__((always_inline)) void pair_body_##N1##_##N2##SUF(   \
      float *d, const float *a, bool va, const float *b, bool vb, const float *c, \
      bool vc, int64_t n) {                                                      \
    float as = a[0], bs = b[0], cs = c[0];                                       \
    V8 av = (V8){0} + as, bv = (V8){0} + bs, cv = (V8){0} + cs;                  \
    int64_t i = 0;                                                               \
    _Pragma("GCC unroll 2")                                                      \
    for (; i + 8 <= n; i += 8) {                                                 \
      V8 x1 = av, x2 = bv, o = cv;                                               \
      if (va) memcpy(&x1, a + i, sizeof x1);                                     \
      if (vb) memcpy(&x2, b + i, sizeof x2);                                     \
      if (vc) memcpy(&o, c + i, sizeof o);                                       \
      V8 t = x1 O1 x2;                                                           \
      V8 r = LEFT ? t O2 o : o O2 t;                                             \
      memcpy(d + i, &r, sizeof r);                                               \
    }                                                                            \
    for (; i < n; i++) {                                                         \
      float t = (va ? a[i] : as) O1 (vb ? b[i] : bs);                            \
      float o = vc ? c[i] : cs;                                                  \
      d[i] = LEFT ? t O2 o : o O2 t;                                             \
    }                                                                            \
  }                                                                              \
  /* the broadcast patterns of chains are made constant, so their loops are    \
   * plain vector code; a scalar is never read past its one element */         \
  FUSE_CLONES static void pair_##N1##_##N2##SUF(float *d, const float *a, bool va, \
                                             const float *b, bool vb,           \
                                             const float *c, bool vc, int64_t n) { \
    if (va && vb && vc)                                                          \
      pair_body_##N1##_##N2##SUF(d, a, true, b, true, c, true, n);               \
    else if (va && !vb && vc)                                                    \
      pair_body_##N1##_##N2##SUF(d, a, true, b, false, c, true, n);              \
    else if (!va && vb && vc)                                                    \
      pair_body_##N1##_##N2##SUF(d, a, false, b, true, c, true, n);             \
    else if (va && vb && !vc)                                                    \
      pair_body_##N1##_##N2##SUF(d, a, true, b, true, c, false, n);             \
    else                                                                         \
      pair_body_##N1##_##N2##SUF(d, a, va, b, vb, c, vc, n);                     \
  }
#define PAIR_BOTH(N1, O1, N2, O2) PAIR_LOOP(N1, O1, N2, O2, 1, _l) PAIR_LOOP(N1, O1, N2, O2, 0, _r)
#define PAIR_SECOND(N1, O1)                                                       \
  PAIR_BOTH(N1, O1, add, +) PAIR_BOTH(N1, O1, sub, -) PAIR_BOTH(N1, O1, mul, *)  \
  PAIR_BOTH(N1, O1, div, /)
PAIR_OPS(PAIR_SECOND)

typedef void (*PairLoop)(float *, const float *, bool, const float *, bool, const float *, bool,
                         int64_t);
/* Indexed by (first * 4 + second) * 2 + (t on the right), in pair_code's
 * order. */
#define PAIR_ENTRY2(N1, N2) pair_##N1##_##N2##_l, pair_##N1##_##N2##_r,
#define PAIR_ROW(N1, O1) PAIR_ENTRY2(N1, add) PAIR_ENTRY2(N1, sub) PAIR_ENTRY2(N1, mul) PAIR_ENTRY2(N1, div)
static const PairLoop pair_loops[32] = {PAIR_OPS(PAIR_ROW)};

/* A whole block runs as four lines of FUSE_LINE elements: the lines of
 * the registers and of the operands read in place (2 KiB each) then stay
 * in the first-level cache from one instruction to the next, where a
 * whole block's would not, while each instruction's dispatch is still
 * paid once per 512 elements.  Lines of 512 rather than 1024: each
 * instruction reads its operands from memory one after another (y for
 * sin, then x for the next), and shorter lines keep those streams
 * closer together, as a hand-fused loop reads them (10^7 elements: about
 * 15% faster on one core).  kern_sum_f32 sums a whole block as halves
 * of halves, so the closing sum of the lines' sums added as the same tree
 * gives the same bits.  Registers are FUSE_PAD floats further apart than
 * a line, so that the lines of two registers never sit at the same
 * offset within a 4 KiB page (loads and stores that do may be taken to
 * depend on each other). */
#define FUSE_LINE 512
#define FUSE_PAD 16
#define FUSE_NLINES (CMP_BLOCK / FUSE_LINE)
_Static_assert(FUSE_NLINES * FUSE_LINE == CMP_BLOCK && (FUSE_NLINES & (FUSE_NLINES - 1)) == 0 &&
                   FUSE_LINE >= 256,
               "a block's sum is a tree of whole lines' sums");

/* Where an operand or result of an instruction is, looked up once per
 * run rather than on every line. */
typedef struct Site {
  char *mem;            /* the slot's data, or NULL for a register */
  int64_t step;         /* bytes per element; 0 for a broadcast scalar */
  int reg;
} Site;

typedef struct Ctx {
  const Prog *prog;
  Array **slots;
  FuseLane *lane;
  int64_t off, n;
  int64_t rstride;      /* floats from one register to the next */
  Site site[FUSE_RUN_MAX][4];   /* each instruction's operands, then its result */
  int64_t *vstride[FUSE_RUN_MAX]; /* FO_VIEW: its operand's strides over the run's shape */
  Site red;             /* a closing sum's operand */
} Ctx;

static Site site_of(Array **slots, FRef r) {
  if (r.kind == FK_REG) return (Site){NULL, 0, r.idx};
  return (Site){arr_data(slots[r.idx]), r.kind == FK_MEM ? (int64_t)dt_size(r.dtype) : 0, -1};
}

/* The strides, in elements, at which view [ins] reads its operand over
 * the run's shape: the operand's own, 0 for a new dimension or one of
 * size 1 broadcast. */
static void view_strides(const Prog *p, const FInstr *ins, const Array *x, int64_t *st) {
  for (int d = 0; d < p->ndim; d++) {
    int sd = ins->src_dim[d];
    st[d] = sd >= 0 && x->shape[sd] == p->shape[d] ? x->strides[sd] : 0;
  }
}

static void sites_init(Ctx *c, const Prog *p, int64_t (*vst)[SHM_MAXDIM]) {
  for (int k = 0; k < p->n; k++) {
    if (p->ins[k].op == FO_VIEW || p->ins[k].op == FO_VIEW_BIN) {
      c->vstride[k] = vst[k];
      view_strides(p, &p->ins[k], c->slots[p->ins[k].in[0].idx], vst[k]);
    }
    for (int m = 0; m < p->ins[k].nin; m++) c->site[k][m] = site_of(c->slots, p->ins[k].in[m]);
    c->site[k][3] = site_of(c->slots, p->ins[k].dst);
  }
  if (p->reduce) c->red = site_of(c->slots, p->red_src);
}

/* The line or block of [s] (a register holds up to CMP_BLOCK elements of
 * any fused dtype: at most 4 bytes each). */
static inline void *at(const Ctx *c, const Site *s) {
  if (s->mem) return s->mem + c->off * s->step;
  return c->lane->regs + (size_t)s->reg * (size_t)c->rstride;
}

/* A block-sized view over [p] (n floats) in view slot [k]. */
static Array *view(FuseLane *l, int k, void *p, DType t, int64_t n) {
  Views *v = l->views;
  Buffer *b = v->buf[k];
  Array *a = v->arr[k];
  atomic_init(&b->refcount, 1);
  b->data = p;
  b->nbytes = (size_t)n * dt_size(t);
  b->owned = false;
  memset(a, 0, sizeof(Array));
  arr_set_dims(a, 1);
  a->hdr.type = V_ARRAY;
  a->hdr.flags = VAL_IMMORTAL;
  atomic_init(&a->hdr.refcount, 1);
  a->dtype = t;
  a->contiguous = true;
  a->ndim = 1;
  a->size = n;
  a->buf = b;
  a->shape[0] = n;
  a->strides[0] = 1;
  return a;
}

static int run_kernel(const Ctx *c, int k) {
  const FInstr *ins = &c->prog->ins[k];
  Array *in[3], *out;
  for (int m = 0; m < ins->nin; m++)
    in[m] = ins->in[m].kind == FK_SCALAR
                ? c->slots[ins->in[m].idx]
                : view(c->lane, m, at(c, &c->site[k][m]), ins->in[m].dtype, c->n);
  out = view(c->lane, 3, at(c, &c->site[k][3]), ins->dst.dtype, c->n);
  /* one chunk of a fused loop: the timeline shows the loop, not its chunks */
  return prim_table[ins->eqn->prim].rules.kernel(in, ins->nin, &ins->eqn->params, &out);
}

/* [n] copies of [v]: a broadcast operand's run (a row's mean, or the
 * per-example factor of a hand-batched gradient), in the CPU's widest
 * vectors (the baseline build's are 4 floats: the fill cost as much as
 * the product that reads it). */
KERN_CLONES static void fill_f32(float *restrict dst, float v, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = v;
}

/* Copies [n] elements of [esz] bytes from run position [off] on: the
 * element at index i of the run's shape is src[sum of i[d] * st[d]].
 * Walks the innermost dimension in runs: one element repeated where it is
 * broadcast (a row's mean), a plain copy where it is contiguous. */
static void view_copy(char *dst, const char *src, size_t esz, const Prog *p,
                      const int64_t *st, int64_t off, int64_t n) {
  int64_t idx[SHM_MAXDIM], pos = 0, rem = off;
  int in = p->ndim - 1;
  for (int d = in; d >= 0; d--) {
    idx[d] = rem % p->shape[d];
    rem /= p->shape[d];
    pos += idx[d] * st[d];
  }
  while (n > 0) {
    int64_t run = p->shape[in] - idx[in] < n ? p->shape[in] - idx[in] : n;
    if (st[in] == 0 && esz == 4) {
      float v;
      memcpy(&v, src + (size_t)pos * 4, 4);
      fill_f32((float *)dst, v, run);
    } else if (st[in] == 0) {
      memset(dst, src[pos], (size_t)run);   /* bool: one byte */
    } else if (st[in] == 1) {
      memcpy(dst, src + (size_t)pos * esz, (size_t)run * esz);
    } else {
      for (int64_t i = 0; i < run; i++)
        memcpy(dst + (size_t)i * esz, src + (size_t)(pos + i * st[in]) * esz, esz);
    }
    dst += (size_t)run * esz;
    n -= run;
    pos += run * st[in];
    idx[in] += run;
    for (int d = in; d > 0 && idx[d] == p->shape[d]; d--) {   /* carry */
      pos += st[d - 1] - idx[d] * st[d];
      idx[d] = 0;
      idx[d - 1]++;
    }
  }
}

/* FO_VIEW_BIN [ins] over [n] elements from run position [off] into [d]:
 * the loop over each run of the innermost dimension with the view's
 * value there as its broadcast operand, the other operand [o] (a line,
 * or a scalar when not [vo]) at the same place. */
static void view_bin(const FInstr *ins, float *d, const float *src, const float *o, bool vo,
                     const Prog *p, const int64_t *st, int64_t off, int64_t n) {
  int64_t idx[SHM_MAXDIM], pos = 0, rem = off;
  int in = p->ndim - 1;
  for (int dm = in; dm >= 0; dm--) {
    idx[dm] = rem % p->shape[dm];
    rem /= p->shape[dm];
    pos += idx[dm] * st[dm];
  }
  while (n > 0) {
    int64_t run = p->shape[in] - idx[in] < n ? p->shape[in] - idx[in] : n;
    const float *v = src + pos;
    if (ins->pair)
      ins->rule->loop(d, v, false, o, vo, run);
    else
      ins->rule->loop(d, o, vo, v, false, run);
    d += run;
    if (vo) o += run;
    n -= run;
    idx[in] += run;
    for (int dm = in; dm > 0 && idx[dm] == p->shape[dm]; dm--) {   /* carry */
      pos += st[dm - 1] - idx[dm] * st[dm];
      idx[dm] = 0;
      idx[dm - 1]++;
    }
  }
}

static int run_instr(const Ctx *c, int k) {
  const FInstr *ins = &c->prog->ins[k];
  const Site *s = c->site[k];
  float *d = at(c, &s[3]), *a = at(c, &s[0]);
  float *b = ins->nin > 1 ? at(c, &s[1]) : NULL;
  bool va = ins->in[0].kind != FK_SCALAR, vb = ins->nin > 1 && ins->in[1].kind != FK_SCALAR;
  switch (ins->op) {
  case FO_PAIR:
    pair_loops[ins->pair](d, a, va, b, vb, at(c, &s[2]), ins->in[2].kind != FK_SCALAR, c->n);
    return 0;
  case FO_LOOP: ins->rule->loop(d, a, va, b, vb, c->n); return 0;
  case FO_KERNEL: return run_kernel(c, k);
  case FO_VIEW:
    view_copy((char *)d, arr_data(c->slots[ins->in[0].idx]), dt_size(ins->dst.dtype), c->prog,
              c->vstride[k], c->off, c->n);
    return 0;
  case FO_VIEW_BIN: {
    const float *src = arr_data(c->slots[ins->in[0].idx]);
    if (c->vstride[k][c->prog->ndim - 1] == 0) {
      view_bin(ins, d, src, b, vb, c->prog, c->vstride[k], c->off, c->n);
      return 0;
    }
    float *r = at(c, &s[2]);   /* read along the rows: the view's register */
    view_copy((char *)r, (const char *)src, sizeof(float), c->prog, c->vstride[k], c->off, c->n);
    if (ins->pair)
      ins->rule->loop(d, r, true, b, vb, c->n);
    else
      ins->rule->loop(d, b, vb, r, true, c->n);
    return 0;
  }
  }
  return 0;
}

/* Runs every instruction over [c]'s elements; -1 when a kernel failed. */
static int run_span(const Prog *p, const Ctx *c) {
  for (int k = 0; k < p->n; k++)
    if (run_instr(c, k) < 0) return -1;
  return 0;
}

/* A whole block as FUSE_LINE lines, registers packed line by line; its
 * closing sum is kern_sum_f32's over the block. */
static int run_whole_block(const Prog *p, Ctx *c, float *partial) {
  float line_sum[FUSE_NLINES];
  int64_t base = c->off;
  c->n = FUSE_LINE;
  c->rstride = FUSE_LINE + FUSE_PAD;
  for (int l = 0; l < FUSE_NLINES; l++) {
    c->off = base + l * FUSE_LINE;
    if (run_span(p, c) < 0) return -1;
    if (p->reduce) line_sum[l] = kern_sum_f32(at(c, &c->red), FUSE_LINE);
  }
  if (p->reduce) {
    /* kern_sum_f32's halves, level by level */
    for (int w = FUSE_NLINES; w > 1; w /= 2)
      for (int l = 0; l < w / 2; l++) line_sum[l] = line_sum[2 * l] + line_sum[2 * l + 1];
    *partial = line_sum[0];
  }
  return 0;
}

/* Blocks [b0, b1) of [p] with the registers of [lane]; a closing sum
 * leaves one partial per block.  The last block may be short: it runs
 * in one span, summed by kern_sum_f32 as a whole. */
static int run_blocks(const Prog *p, Array **slots, FuseMem *m, FuseLane *lane, int64_t b0,
                      int64_t b1) {
  Ctx c = {.prog = p, .slots = slots, .lane = lane};
  int64_t vst[FUSE_RUN_MAX][SHM_MAXDIM];
  sites_init(&c, p, vst);
  for (int64_t blk = b0; blk < b1; blk++) {
    c.off = blk * CMP_BLOCK;
    if (p->size - c.off >= CMP_BLOCK) {
      if (run_whole_block(p, &c, &m->partials[blk]) < 0) return -1;
    } else {
      c.n = p->size - c.off;
      c.rstride = CMP_BLOCK;
      if (run_span(p, &c) < 0) return -1;
      if (p->reduce) m->partials[blk] = kern_sum_f32(at(&c, &c.red), c.n);
    }
    /* Ctrl-C is looked at every 512 Ki elements: a fused block may chain
     * many costly operations, so more often than the eager kernels do */
    if ((blk & 255) == 255 && shm_interrupt_pending()) return -1;
  }
  return 0;
}

/* A loop split over two cores: the calling thread uses the first lane,
 * the helper the second. */
typedef struct Split {
  const Prog *p;
  Array **slots;
  FuseMem *m;
  pthread_t caller;
} Split;

static void run_range(const void *ctx, int64_t b0, int64_t b1) {
  const Split *s = ctx;
  FuseLane *lane = pthread_equal(pthread_self(), s->caller) ? &s->m->lane : &s->m->lane2;
  (void)run_blocks(s->p, s->slots, s->m, lane, b0, b1);
}

int fuse_run(const Fused *f, Array **slots, FuseMem *m) {
  const Prog *p = f->impl;
  int64_t nblocks = (p->size + CMP_BLOCK - 1) / CMP_BLOCK;
  if (p->split) {
    /* long loops are bound by one core's memory bandwidth, as eager
     * kernels are: the second core adds to it (kernels.h) */
    Split s = {p, slots, m, pthread_self()};
    kern_parallel(run_range, &s, nblocks, KERN_PAR_MIN / CMP_BLOCK, 1);
    if (shm_interrupt_pending()) return prim_interrupted();
  } else if (run_blocks(p, slots, m, &m->lane, 0, nblocks) < 0) {
    return shm_interrupt_pending() ? prim_interrupted() : -1;
  }
  if (p->reduce) *(float *)arr_data(slots[p->red_dst.idx]) = kern_sum_f32(m->partials, nblocks);
  return 0;
}
