/*
 * trace.h - the tracer: staging ordinary evaluation into a plan.
 *
 * Tracing runs the ORDINARY evaluator over abstract values.  A tracer is a
 * Value of type V_TRACER carrying an AVal and the plan variable it stands
 * for.  Every array operation reaches prim_apply (prim.h), which hands any
 * call with a tracer operand to prim_trace_hook = trace_apply: instead of
 * running a kernel, it infers the output avals with the primitive's shape
 * rule (so shape and dtype errors are the eager ones, located by the
 * evaluator at the user's line) and records an equation in the innermost
 * trace of this thread.  Semantics: seed 004 (how make_jaxpr stages).
 *
 * Traces nest (a cond branch inside a jit body, a jit called from another
 * jit): each thread keeps a stack of them; the innermost records.  An
 * operand that does not belong to the innermost trace is resolved so:
 *   - a 0-d concrete array (a number, or a number converted to the other
 *     operand's dtype) becomes an inline literal, as JAX inlines scalar
 *     constants;
 *   - another concrete array becomes, in a top-level trace, a constvar of
 *     the plan (hoisted, as seed 004's func6); in a nested trace, a
 *     capture;
 *   - a tracer of an enclosing trace becomes a capture.
 * Captures become the leading invars of the nested plan (trace_end hands
 * back the captured values, which the enclosing trace resolves in turn
 * and passes as the operands of the cond/while/scan/pjit equation).
 *
 * A tracer used after its trace ended (stored in a global, say) is an
 * error ("a traced value escaped ..."), never a crash: tracers name their
 * trace by a unique id, not by pointer.
 *
 * Threads: the trace stack is thread-local, so device threads trace their
 * own bodies independently; trace ids come from an atomic counter.
 */
#ifndef SHMAP_TRACE_H
#define SHMAP_TRACE_H

#include "transform/plan.h"
#include "array/prim.h"
#include "base/value.h"

typedef struct Trace Trace;

/* What a tracer stands for.  A staging tracer is a variable of a plan (jit,
 * and the linear plan that reverse-mode differentiation records); a JVP
 * tracer is a concrete-or-staged primal carried with its tangent
 * (transform/ad.h; semantics: JAX's JVPTracer, docs/autodidax.py); a
 * batch tracer is a value with an extra axis, one example per index
 * (transform/batch.h; JAX's BatchTracer). */
typedef enum { TR_STAGE, TR_JVP, TR_BATCH, TR_KINDS } TracerKind;

typedef struct Tracer {
  Value hdr;          /* V_TRACER */
  AVal aval;
  unsigned trace_id;  /* the trace it belongs to; ids grow with nesting */
  int var;            /* TR_STAGE: its variable in that trace's plan */
  const char *name;   /* interned parameter name for an input, else NULL */
  int line;           /* source line that computed it (0: unknown) */
  TracerKind kind;
  Value *primal;      /* TR_JVP: the primal value (owned) */
  Value *tangent;     /* TR_JVP: its tangent (owned, never a zero) */
  Value *batched;     /* TR_BATCH: the value with the batch axis (owned) */
  int bdim;           /* TR_BATCH: where the batch axis is in [batched] */
  NamedShape *named;  /* TR_STAGE in an xmap body: its named shape (owned), or NULL */
} Tracer;

static inline bool IS_TRACER(const Value *v) { return v && v->type == V_TRACER; }
static inline bool IS_STAGE_TRACER(const Value *v) {
  return IS_TRACER(v) && ((const Tracer *)v)->kind == TR_STAGE;
}
static inline bool IS_JVP_TRACER(const Value *v) {
  return IS_TRACER(v) && ((const Tracer *)v)->kind == TR_JVP;
}
static inline bool IS_BATCH_TRACER(const Value *v) {
  return IS_TRACER(v) && ((const Tracer *)v)->kind == TR_BATCH;
}

/* How the transformation owning tracers of [kind] applies a primitive when
 * one of its tracers is the innermost among the operands ([top]):
 * prim_apply's contract.  The transformations register theirs at start-up
 * (trace_set_kind); staging is trace_apply.  Dispatch: trace_dispatch,
 * the prim_trace_hook, picks the operand tracer with the largest trace id
 * (the innermost trace), as JAX's find_top_trace does. */
typedef Value *(*KindApply)(Tracer *top, PrimId id, int nin, Value **in, const Params *p);

/* Python truth of a tracer of [kind] (val_truth's contract). */
typedef int (*KindTruth)(Value *v);

void trace_set_kind(TracerKind kind, KindApply apply, KindTruth truth);

/* prim_trace_hook: the innermost trace among the operands applies it. */
Value *trace_dispatch(PrimId id, int nin, Value **in, const Params *p);

/* A new tracer of [kind] belonging to trace [id], its aval [a], made at
 * the current line (the caller fills the kind's fields).  NULL on nomem. */
Tracer *tracer_alloc(TracerKind kind, unsigned id, const AVal *a);

/* Whether a staging trace of this thread met a value being transformed
 * (differentiated, batched) since the last call: the error trace_atom set
 * then is the one control flow recovers from by not staging (control.c).
 * Clears the flag. */
bool trace_transformed_operand(void);

/* The kind of the last such value (TR_JVP, TR_BATCH), which names what
 * control flow could not stage, and the id of its trace. */
TracerKind trace_transformed_kind(void);
unsigned trace_transformed_id(void);

/* A fresh trace id, above every id handed out before (traces of one
 * thread nest, so the innermost has the largest id). */
unsigned trace_next_id(void);

/* Starts a trace recording into a new plan named [fname] and makes it the
 * innermost trace of this thread.  [top]: concrete arrays become constvars
 * (a jit entry point) rather than captures (a sub-plan).  NULL on nomem. */
Trace *trace_begin(const char *fname, bool top);

/* Starts a LINEAR trace (reverse-mode differentiation's tangent plan,
 * JAX's partial evaluation): it records only the operations that have one
 * of its own tracers as an operand, wherever they run; everything else
 * (concrete values, the enclosing jit's tracers, an outer JVP tracer) is a
 * capture.  It is not made the current trace, so code that asks whether
 * it is staging (control flow, jit) is unaffected.  End it with trace_end
 * or trace_abort.  NULL on nomem. */
Trace *trace_begin_linear(const char *fname);

/* A new input of [t] of aval [a]: adds an invar and returns its tracer (a
 * new reference), named [name] (interned, may be NULL) for messages. */
Value *trace_new_arg(Trace *t, const AVal *a, const char *name);

/*
 * Ends [t] (which must be innermost): sets the plan's outputs to the atoms
 * of the [nout] values [outs] (tracers of [t], or concrete arrays resolved
 * as above), puts the captures first among the invars, pops [t] and frees
 * it.  Returns the plan (new reference) and, through [caps]/[ncap], the
 * captured values in invar order (an owned shm_malloc'd array of new
 * references; the caller releases them with trace_caps_free).  NULL with
 * the error set on failure (the trace is ended anyway).
 */
Plan *trace_end(Trace *t, int nout, Value **outs, Value ***caps, int *ncap);

/* Ends [t] after an error, discarding what it recorded (error kept). */
void trace_abort(Trace *t);

void trace_caps_free(Value **caps, int ncap);

/* The innermost trace of this thread, or NULL when not tracing. */
Trace *trace_current(void);

/* The plan [t] records into (borrowed). */
Plan *trace_plan(Trace *t);

/* [t]'s id: its tracers' Tracer.trace_id. */
unsigned trace_id_of(const Trace *t);

/* Resolves [v] (a tracer or a concrete array) as an operand of the
 * innermost trace [t], per the rules above.  0, or -1 with the error set
 * (a value that is not an array, a leaked tracer). */
int trace_atom(Trace *t, Value *v, PlanAtom *out);

/*
 * Records equation prim[params] over [nin] operand values in the innermost
 * trace (or the linear trace that owns an operand), with output avals [outs] given (higher-order primitives, whose
 * avals come from their sub-plans).  [params] is moved.  Returns the
 * outputs as a Tuple of tracers (always a tuple, even for one), or NULL.
 */
Value *trace_emit(PrimId prim, Params *params, int nin, Value **in, int nout,
                  const AVal *outs);

/* Marks the equations recorded until the next call with [on] as a
 * lax.cond's (PlanEqn.true_first): control.c sets it around emitting a
 * cond from a bool predicate and clears it after. */
void trace_set_true_first(bool on);

/* trace_emit with the outputs' named shapes given ([named], one per
 * output; NULL: each the union of the operands', as trace_apply gives). */
Value *trace_emit_named(PrimId prim, Params *params, int nin, Value **in, int nout,
                        const AVal *outs, const NamedShape *named);

/* ---- named axes of a staged xmap body (LANGUAGE.md §10; seed 001) ----------
 *
 * An xmap under jit traces its body once per named index: the body's
 * trace has the xmap's named axes in scope (trace_set_axes), its inputs
 * carry named shapes (trace_new_arg_named), and every recorded equation
 * gives its outputs the union of its operands' named shapes (JAX's
 * standard named-shape rule), except that psum, pmax, pmin, all_gather
 * and pdot over a name remove it and axis_index over one adds it. */

/* Puts the named axes [axes] (copied) in scope of trace [t], mapped to
 * mesh axes by [resources] (the xmap's axis_resources dict, borrowed for
 * the trace's life; NULL: none).  An operation whose operands together
 * carry two names mapped to a common mesh axis is then the eager call's
 * error (LANGUAGE.md §10: they can never meet in one value).  0 or -1. */
int trace_set_axes(Trace *t, const NamedShape *axes, Value *resources);

/* Whether [name] (interned or not) is a named axis of a staged xmap body
 * enclosing this thread's current trace; its size in [*size]. */
bool trace_axis_size(const char *name, int64_t *size);

/* trace_new_arg whose input carries the named shape [ns] (may be NULL). */
Value *trace_new_arg_named(Trace *t, const AVal *a, const NamedShape *ns, const char *name);

/* The named shape of staging tracer [v] (borrowed), or NULL when it has
 * none (or is no staging tracer). */
const NamedShape *trace_named(Value *v);

/* prim_trace_hook: records a first-order primitive (prim.h contract). */
Value *trace_apply(PrimId id, int nin, Value **in, const Params *p);

/* The abstract value of a tracer (prim_aval_hook). */
int trace_aval(Value *v, AVal *out);

/* Sets the error of a Python-level truth test on tracer [v]: LANGUAGE.md
 * §6's message naming the value and the line that computed it, pointing to
 * cond/switch/while_loop/fori_loop/scan.  Returns -1. */
int trace_truth_error(Value *v);

/* Registers V_TRACER's destructor and printer and sets prim_trace_hook
 * and prim_aval_hook.  Call once at start-up. */
void trace_register(void);

/* Re-enters trace [id] (a vmap's batch trace, a jvp's) as the innermost,
 * below which a staged sub-trace was opened since: an operation on its
 * tracers and the sub-trace's goes to it first, as if the sub-trace were
 * outside it (a transformed while_loop's cond and body, staged inside the
 * vmap or jvp; a value of that trace the body closes over is then
 * transformed with the carry).  Re-entries nest (a while_loop inside
 * another's body, a jvp of a jvp): each ranks above those before it, up
 * to TRACE_REENTRY_MAX deep (past it, not re-entered: the operation
 * stays an error to stage).  Returns the state for trace_reenter_end. */
#define TRACE_REENTRY_MAX 32
typedef struct TraceReentry {
  int depth;
} TraceReentry;
TraceReentry trace_reenter(unsigned id);
void trace_reenter_end(TraceReentry prev);

#endif
