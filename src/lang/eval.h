/*
 * eval.h - the tree-walking evaluator: scopes, functions, calls, modules.
 *
 * Threads.  The parsed program (ast.h) and the builtins scope are read-only
 * once made, so device threads run function bodies concurrently with this
 * same evaluator.  Each thread has its own Frame stack and error state
 * (thread-local).  A module's globals are written only by the main thread;
 * device code reads them (the main thread is blocked in the shard_map call
 * meanwhile), and a `global` assignment inside a shard_map body is an error.
 *
 * Names are interned (intern.h) at parse time, so scope lookups compare
 * pointers.
 */
#ifndef SHMAP_EVAL_H
#define SHMAP_EVAL_H

#include "lang/ast.h"
#include "base/value.h"

typedef struct Env Env;

/* A scope: a small hash map from interned names to owned values, with a
 * parent (the enclosing function's scope or NULL for module globals).
 * Reference counted: closures keep their defining scope alive. */
Env *env_new(Env *parent);
void env_incref(Env *e);
void env_decref(Env *e);
/* Borrowed value of interned [name] in [e] or its parents, or NULL (no
 * error set). */
Value *env_lookup(Env *e, const char *name);
/* Binds [name] (interned) to [v] (borrowed) in [e] itself.  -1 on nomem,
 * MemoryError set; a NULL [name] (an interning that failed) is that too. */
int env_set(Env *e, const char *name, Value *v);
/* env_set taking [v]'s reference (released on failure too). */
int env_set_steal(Env *e, const char *name, Value *v);
/* Drops every binding of [e] itself.  Functions defined in a scope hold
 * that scope as their closure, a reference cycle; clearing the scope
 * before its last env_decref frees both (module scopes at exit). */
void env_clear(Env *e);
/* Drops a reference to the scope [e] of a call that is over (or of any
 * scope kept past its frame, such as a traceback's): when what is left
 * holding it is only closures bound in [e] itself that nothing else holds
 * (a nested def: a reference cycle), [e] is cleared first so the cycle is
 * freed.  Otherwise [e] outlives the call, held by a closure or by a
 * cycle this cannot see (a shard_map of a lambda defined in [e]): it is
 * recorded, and interp_free clears the recorded scopes still alive at
 * exit.  Raises nothing. */
void env_release_scope(Env *e);

/* Calls [fn] on each binding of [e] itself (not parents), for completion,
 * `dir()` and the debugger. */
void env_each(Env *e, void (*fn)(const char *name, Value *v, void *ctx), void *ctx);

/* env_each in the order of the names (strcmp): a scope is a hash on the
 * names' addresses, which differ from run to run and between the
 * processes of an MPI job, so whatever must come out the same everywhere
 * (a module's dict, the values a shard_map body lifts) visits it so.
 * 0, or -1 out of memory (MemoryError set; nothing visited). */
int env_each_sorted(Env *e, void (*fn)(const char *name, Value *v, void *ctx), void *ctx);

/* The scope enclosing [e] (borrowed), or NULL when [e] is a module's. */
Env *env_parent(const Env *e);

/* A user function: a `def` or `lambda` with its closure. */
typedef struct Func {
  Value hdr;             /* V_FUNC */
  const char *name;      /* interned */
  AstModule *mod;        /* the tree it lives in; kept alive by mod_ref */
  Value *mod_ref;        /* owned: keeps [mod] alive */
  const Node *node;      /* N_DEF or N_LAMBDA */
  Env *closure;          /* owned */
  Value **defaults;      /* owned, one per param (NULL: required) */
} Func;

/* The interpreter: one per process, made by interp_init on the main thread. */
typedef struct Interp {
  Env *builtins;         /* read-only after init */
  Value *modules;        /* Dict: module name -> Module, main thread only */
  Value *argv;           /* List of Str, visible to scripts as `argv` */
  char **path;           /* module search path: script dir, SHMAP_PATH, stdlib */
  int npath;
  int ndevices;          /* --devices */
  bool verbose;
  bool dump_plans;
  bool reference;        /* --reference: shard_map runs devices one at a time
                            with reference collectives (collective.h) */
} Interp;

extern Interp *shm_interp;

/* Sets up the builtins scope (the language's own and jax.numpy's built-ins)
 * and the module path; the layers above lang/ then register their
 * built-ins, statements and value types (cli/main.c).  [ndevices] is
 * recorded for them.  0 or -1 with the error set. */
int interp_init(int ndevices);

/* Releases the interpreter.  The device threads must be stopped first
 * (dev_stop), since their frames may hold module values. */
void interp_free(void);

/* Whether module [m] is being loaded on this thread (its file has not run
 * to the end: a circular import got it partially initialised). */
bool eval_module_loading(Value *m);

/* True on a device thread while it runs a body (spmd/device.c sets it
 * with the device's context): constants are then read through this
 * thread's private copies, so cores do not share a literal's reference
 * count. */
extern _Thread_local bool eval_on_device;  /* hook */

/* Adds [dir] to the module search path (copied). */
int interp_add_path(const char *dir);

/* Completes built-in namespaces with the functions the standard library
 * writes in shmap itself (stdlib/_jax.shm, _jax_nn.shm, _jax_numpy.shm,
 * _jax_lax.shm, _jax_random.shm): each module's __all__ names join jax,
 * jax.nn, jax.numpy, jax.lax or jax.random where the namespace lacks
 * them.  Called once, after every
 * layer has registered and the module path is complete; the modules load
 * from the path's folders only, never the script's (one no folder has is
 * left out).  0, or -1 with the error set (a module's own error). */
int interp_extend_namespaces(void);

/*
 * Parses and runs [src] in the module scope [globals].  When [echo] is set
 * (the REPL), the value of a final expression statement that is not None is
 * printed as its repr to stdout.  Returns 0, or -1 with the error set (its
 * location inside [src] or a module it called into).
 */
int eval_source(Source *src, Env *globals, bool echo);

/* Evaluates the expression node [n] in [env]: a new reference, or NULL
 * with the error set and located. */
Value *eval_node(const Node *n, Env *env);

/* Evaluates the single expression [text] in [scope] (the debugger's `p`,
 * the REPL's `:plan`).  Returns a new reference or NULL with the error. */
Value *eval_expr_text(const char *text, Env *scope);

/* Calls any callable (Func, Builtin, BoundMethod, shard_map and jit
 * wrappers, dtypes as converters) with [a] (borrowed).  Errors: "'int' ...
 * object is not callable", argument binding errors as Python words them. */
Value *val_call(Value *f, const CallArgs *a);

/* Python's callable(): whether val_call would call [f] rather than raise
 * "object is not callable" (its arguments aside): functions, lambdas,
 * built-ins, methods, dtypes, classes, instances whose class has
 * __call__, and the callable types of higher layers (jit, shard_map,
 * custom_vjp functions, plans).  Never an error. */
bool val_callable(Value *f);

/* Lets another subsystem make its values callable (shard_map and jit
 * wrappers, meshes' methods): val_call dispatches type [t] to [call]. */
void eval_register_call(VType t, Value *(*call)(Value *f, const CallArgs *a));  /* hook */

/* Makes the opaque objects of type [ot] (a higher layer's: jax.custom_vjp
 * functions) callable: val_call on one calls [call], before the opaque
 * types' call hook (classes).  At start-up; not thread-safe.  0, or -1
 * with the error set (more than 8 such types). */
int eval_register_opaque_call(const OpaqueType *ot, Value *(*call)(Value *f, const CallArgs *a));  /* hook */

/* Makes values of type [t] context managers for `with`: [enter] (a new
 * reference, bound by `as`) when the block starts, [exit] (0, or -1 with
 * the error set) however it ends.  Opaque values use their OpaqueType's
 * enter and exit instead. */
void eval_register_context(VType t, Value *(*enter)(Value *self), int (*exit)(Value *self));  /* hook */

/* Executors for the language's own statements, registered by the
 * subsystems that own them (mesh.c, shardmap.c, jit.c): each runs [stmt]
 * in [env] and returns 0 or -1 with the error set.  Unregistered, the
 * statement is an error saying the feature is not available. */
typedef int (*StmtExec)(const Node *stmt, Env *env, AstModule *mod);
extern StmtExec eval_exec_mesh;  /* hook */
extern StmtExec eval_exec_shard_map;  /* hook */

/* Wraps a freshly defined `jit def` function (a new reference to a Func)
 * into a jit function; registered by jit.c.  Steals [fn]. */
extern Value *(*eval_make_jit)(Value *fn);  /* hook */

/* Makes a Func for the def or lambda [node] closing over [env]; the
 * default values are evaluated now, in [env].  New reference. */
Value *eval_make_func(const Node *node, Env *env, AstModule *mod);


/* Shorthand for a positional-only call. */
Value *val_call_n(Value *f, int n, Value **args);

/* The value bound to N_NAME [n] in [env] or among the built-ins, borrowed,
 * or NULL when it is not defined (no error set). */
Value *eval_lookup_name(const Node *n, Env *env);

/* ---- element-wise expressions in one pass (eval_fusable.c) ----------------- */

/* What eval_fuse_hook returns to let the usual evaluation run. */
extern Value eval_declined;
#define EVAL_DECLINED (&eval_declined)
#define EVAL_FUSE_MAX_LEAVES 16

/* Node.fuse, the memo of whether a node roots such a tree: not yet looked
 * at, yes, or no (the evaluator's fast path skips eval_fuse_try). */
enum { EVAL_FUSE_UNKNOWN, EVAL_FUSE_TREE, EVAL_FUSE_NO };

/* Evaluates an expression tree of + - * /, unary minus and the built-in
 * sin, cos, exp, log over float32 arrays of one shape and Python numbers
 * (at most EVAL_FUSE_MAX_LEAVES leaves, at least two operations) in one
 * pass, with the same result bit for bit as [eval_plain], which evaluates
 * [n] operator by operator and is what runs for any other tree (and
 * raises every error).  A new reference or NULL with the error set. */
Value *eval_fuse_try(const Node *n, Env *env, Value *(*eval_plain)(const Node *, Env *));

/* Set by the transform layer (transform/eager_fusion.c): runs tree [root]
 * over its [nleaf] leaf values (borrowed: float32 arrays of one shape and
 * Python numbers, in evaluation order), staged once per kind of leaves
 * through eval_fuse_apply.  A new reference, NULL with the error set, or
 * EVAL_DECLINED. */
extern Value *(*eval_fuse_hook)(const Node *root, int nleaf, Value **leaves);  /* hook */

/* Applies tree [root]'s operations, in the evaluator's order, to [vals]
 * standing for its leaves (tracers while staging).  A new reference, or
 * NULL with the error set. */
Value *eval_fuse_apply(const Node *root, Value **vals);

/* Imports module [name] (cached in shm_interp->modules): [name].shm from
 * the importing script's folder, then each SHMAP_PATH folder, then the
 * installed stdlib/.  Error: "no module named 'nn' (searched: ...)".
 * Any thread (the devices of a body import under one lock, loading a
 * module once). */
Value *eval_import(const char *name, const char *from_dir);

/* ---- per-thread execution state (the debugger and shard_map use it) ---- */

/* One activation of user code. */
typedef struct Frame {
  struct Frame *back;    /* caller */
  const char *fname;     /* function name or "<module>" */
  Env *env;              /* borrowed */
  const Node *stmt;      /* statement being executed */
  AstModule *mod;
  const Node *jump;      /* set by the statement hook with EVAL_HOOK_JUMP */
  const Node *def;       /* the N_DEF or N_LAMBDA running (super() reads its
                            first parameter); NULL for a module or class body */
} Frame;

/* The innermost frame of this thread (NULL outside user code). */
Frame *eval_current_frame(void);

/* Hook run before each statement (the debugger's tracing function); NULL
 * when no debugger is attached.  It returns 0 to run [stmt]; a negative
 * value aborts with the error set (the debugger's quit); EVAL_HOOK_JUMP
 * (pdb's jump) after setting f->jump to a statement of the same block as
 * [stmt]: the block goes on at that statement instead, without running
 * the hook for it (the hook has just stopped there).  When [stmt] is a
 * loop whose header runs again, the jump leaves the loop for the block
 * that holds it. */
extern int (*eval_stmt_hook)(Frame *f, const Node *stmt);  /* hook */
#define EVAL_HOOK_JUMP 1

/* When the statement hook runs: before every statement of every thread
 * while [eval_hook_all] is set (the debugger may stop anywhere: it is
 * engaged) or a Ctrl-C for the debugger is pending, and of this thread
 * while [eval_hook_here] is (the thread's place is watched, or it is to
 * stop at its next statement).  Otherwise a statement runs without the
 * call.  Both are kept by the hook's owner. */
extern atomic_bool eval_hook_all;
extern _Thread_local bool eval_hook_here;

/* Hook run when a user function's frame returns a value (pdb's "return"
 * event): [f] is the returning frame, still this thread's innermost;
 * [at] the return statement, or the last statement run when the body ran
 * off its end, or for a lambda its N_LAMBDA expression (f->stmt is NULL
 * then); [ret] the value returned, borrowed.  Not run when the frame ends
 * with an error.  NULL when no debugger is attached.  A nonzero return
 * aborts the call with the error set (the debugger's quit): the value is
 * released and the call fails. */
extern int (*eval_return_hook)(Frame *f, const Node *at, Value *ret);  /* hook */

/* Hook run as a def's frame starts, before its first statement (pdb's
 * "call" event), when the statement hook would run: [f] is the new frame,
 * this thread's innermost, its stmt the def [def] for the while.  NULL
 * when no debugger is attached.  A nonzero return aborts the call with
 * the error set (the debugger's quit). */
extern int (*eval_call_hook)(Frame *f, const Node *def);  /* hook */

/* Hook run when statement [stmt] of frame [f] (this thread's innermost)
 * has just failed, the error still pending (a debugger's stop on raised
 * errors, as debugpy's "raised exceptions").  It runs only where the
 * statement hook does (eval_hook_all, eval_hook_here), and for each
 * statement the error leaves: the hook tells the one that raised it.  It
 * returns 0 with the error as it found it, or nonzero with the error
 * replaced (the debugger's quit).  NULL when no debugger is attached. */
extern int (*eval_raise_hook)(Frame *f, const Node *stmt);  /* hook */

/* Drops this device thread's private copies of source constants (eval.c
 * explains them); called when a shard_map body ends on the thread. */
void eval_const_cache_clear(void);

/* Where print() output goes on this thread: NULL for stdout; device
 * threads set a buffer that shard_map writes out in device order. */
typedef struct OutBuf {
  char *data;
  size_t len, cap;
} OutBuf;
void eval_set_output(OutBuf *b);
/* Writes [n] bytes to this thread's output. */
void eval_write(const char *s, size_t n);
/* print(..., flush=True): the standard output's buffer is written now.
 * Output a device buffers (inside a body) is written in device order
 * when the call ends, whatever flush says. */
void eval_flush(void);
/* Whether the standard output has taken everything written to it: 0, or
 * -1 with an ERR_IO error, Python's OSError ("cannot write the standard
 * output: [Errno 28] No space left on device") once a write or a flush of it failed (a full disk,
 * /dev/full, a closed descriptor); output after that is dropped, and
 * every later call fails the same way, as each of Python's prints
 * raises again.  On a device thread, whose output goes to its buffer,
 * always 0: the main thread's write of the buffers is what can fail. */
int eval_output_check(void);
/* The program started with descriptor 1 closed (cli/main.c): its first
 * write to the standard output fails, "[Errno 9] Bad file descriptor";
 * a program that writes nothing there does not fail. */
void eval_output_closed(void);

/* The error the innermost `except` block of this thread is handling
 * (borrowed, valid while that block runs), or NULL outside one: what
 * pdb.post_mortem() debugs there. */
const ErrState *eval_handled_error(void);

/* Location of the innermost expression this thread is applying: the
 * call, operator, comparison, subscript or attribute whose operation runs
 * (where its error is located, so an equation a jit traces there records
 * the place an eager error shows), else the statement being run; after a
 * function returns, its return statement (a lambda's caller's place).
 * The call of a collective, for mismatch messages; {NULL,0,0} outside. */
Loc eval_current_loc(void);

/* Sets it to [loc] (borrowed: [loc].src must outlive its use) and
 * returns the previous one, for code that runs a staged equation made at
 * [loc]: a compiled collective reports its line as an eager one does. */
Loc eval_set_current_loc(Loc loc);


#endif
