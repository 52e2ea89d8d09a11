/*
 * prim_rules.c - the helpers of the rules that the transformations borrow
 * (prim.h): zeros and sums of cotangents for the transpose interpreter,
 * and the batch-axis moves of the batching interpreter.
 */
#include "array/prim_rules.h"


Value *prim_zeros(const AVal *a) {
  Scope s = {0};
  return scope_return(&s, zeros_of(&s, a));
}

Value *prim_add_any(Value *a, Value *b) {
  if (!a || !b) return a ? val_incref(a) : b ? val_incref(b) : NULL;
  Scope s = {0};
  return scope_return(&s, add(&s, a, b));
}

Value *prim_batch_moveaxis(Value *x, int from, int to) { return moveaxis(x, from, to); }

Value *prim_batch_repeat_front(Value *x, int64_t b) { return repeat_front(x, b); }

int64_t prim_batch_size(Value **in, const int *dims, int nin) {
  for (int i = 0; i < nin; i++) {
    AVal a;
    if (dims[i] >= 0 && prim_value_aval(in[i], &a) == 0) return a.shape[dims[i]];
  }
  return 1;
}

/* ---- costs ---- */

static double elements(const AVal *a) { return (double)shape_size(a->ndim, a->shape); }

void prim_cost_per_element(const Params *p, int nin, const AVal *in, int nout, const AVal *out,
                           PrimCost *c) {
  (void)p, (void)nin, (void)in;
  for (int i = 0; i < nout; i++) c->flops += elements(&out[i]);
}

void prim_cost_transcendental(const Params *p, int nin, const AVal *in, int nout,
                              const AVal *out, PrimCost *c) {
  (void)p, (void)nin, (void)in;
  for (int i = 0; i < nout; i++) c->transcendentals += elements(&out[i]);
}

/* A reduction of n elements into m results applies its operator n - m
 * times (a cumulative one: once per element past the first of a run,
 * about n as well). */
void prim_cost_reduction(const Params *p, int nin, const AVal *in, int nout, const AVal *out,
                         PrimCost *c) {
  (void)p;
  double n = nin ? elements(&in[0]) : 0, m = nout ? elements(&out[0]) : 0;
  c->flops += n > m ? n - m : n;
}
