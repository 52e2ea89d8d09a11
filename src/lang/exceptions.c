/*
 * exceptions.c - exception classes, raise and except matching
 * (exceptions.h).
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "array/array.h"
#include "array/prim.h"
#include "array/print.h"
#include "base/intern.h"
#include "base/mem.h"
#include "lang/builtins.h"
#include "lang/classes.h"
#include "lang/exceptions.h"

/* The classes, each with its parent and the error kind it raises. */
typedef struct ExcClass {
  const char *name;
  int parent;          /* index, -1 for BaseException */
  ErrKind kind;
} ExcClass;

enum {
  X_BASE, X_EXCEPTION, X_ARITH, X_LOOKUP, X_VALUE, X_TYPE, X_INDEX, X_KEY, X_NAME,
  X_ZERO, X_OVERFLOW, X_ASSERT, X_RUNTIME, X_NOTIMPL, X_MEMORY, X_OS, X_SYNTAX,
  X_RECURSION, X_KEYBOARD, X_ATTRIBUTE, X_FLOATING, X_IMPORT, X_MODULE_NOT_FOUND, X_SYSTEM_EXIT,
  X_STOP_ITERATION, X_SHARDING_TYPE, X_COUNT
};

static const ExcClass classes[X_COUNT] = {
    [X_BASE] = {"BaseException", -1, ERR_VALUE},
    [X_EXCEPTION] = {"Exception", X_BASE, ERR_VALUE},
    [X_ARITH] = {"ArithmeticError", X_EXCEPTION, ERR_VALUE},
    [X_LOOKUP] = {"LookupError", X_EXCEPTION, ERR_INDEX},
    [X_VALUE] = {"ValueError", X_EXCEPTION, ERR_VALUE},
    [X_TYPE] = {"TypeError", X_EXCEPTION, ERR_TYPE},
    [X_INDEX] = {"IndexError", X_LOOKUP, ERR_INDEX},
    [X_KEY] = {"KeyError", X_LOOKUP, ERR_INDEX},
    [X_NAME] = {"NameError", X_EXCEPTION, ERR_NAME},
    [X_ZERO] = {"ZeroDivisionError", X_ARITH, ERR_ZERO_DIVISION},
    [X_OVERFLOW] = {"OverflowError", X_ARITH, ERR_OVERFLOW},
    [X_ASSERT] = {"AssertionError", X_EXCEPTION, ERR_ASSERT},
    [X_RUNTIME] = {"RuntimeError", X_EXCEPTION, ERR_VALUE},
    [X_NOTIMPL] = {"NotImplementedError", X_RUNTIME, ERR_NOT_IMPLEMENTED},
    [X_MEMORY] = {"MemoryError", X_EXCEPTION, ERR_MEMORY},
    [X_OS] = {"OSError", X_EXCEPTION, ERR_IO},
    [X_SYNTAX] = {"SyntaxError", X_EXCEPTION, ERR_SYNTAX},
    [X_RECURSION] = {"RecursionError", X_RUNTIME, ERR_VALUE},
    [X_KEYBOARD] = {"KeyboardInterrupt", X_BASE, ERR_INTERRUPT},
    [X_ATTRIBUTE] = {"AttributeError", X_EXCEPTION, ERR_ATTRIBUTE},
    [X_FLOATING] = {"FloatingPointError", X_ARITH, ERR_FLOATING_POINT},
    [X_IMPORT] = {"ImportError", X_EXCEPTION, ERR_IO},
    [X_MODULE_NOT_FOUND] = {"ModuleNotFoundError", X_IMPORT, ERR_IO},
    [X_SYSTEM_EXIT] = {"SystemExit", X_BASE, ERR_SYSTEM_EXIT},
    [X_STOP_ITERATION] = {"StopIteration", X_EXCEPTION, ERR_VALUE},
    /* JAX's (jax._src.core): Explicit mode's sharding rules raise it, an
     * ERR_TYPE whose message starts "ShardingTypeError: "; not a name of
     * the built-ins, as it is not one of Python's */
    [X_SHARDING_TYPE] = {"ShardingTypeError", X_EXCEPTION, ERR_TYPE},
};

static Value *class_values[X_COUNT];   /* the built-ins, by index */

/* An instance: its class, message, and the argument it was made with
 * (SystemExit's code). */
typedef struct Exc {
  Opaque base;
  int cls;
  Value *msg;   /* Str */
  Value *arg;   /* the first argument; NULL for none */
} Exc;

static void exc_free(Value *v) {
  val_decref(((Exc *)v)->msg);
  val_decref(((Exc *)v)->arg);
}

static Value *exc_repr(Value *v) {
  Exc *e = (Exc *)v;
  if (!e->arg && !*str_cstr(e->msg)) return str_printf("%s()", classes[e->cls].name);
  Value *m = val_repr(e->arg ? e->arg : e->msg);
  Value *r = m ? str_printf("%s(%s)", classes[e->cls].name, str_cstr(m)) : NULL;
  val_decref(m);
  return r;
}

static Value *exc_getattr(Value *v, const char *name) {
  Exc *e = (Exc *)v;
  if (!strcmp(name, "args")) return e->arg ? tuple_pack(1, &e->arg) : tuple_pack(1, &e->msg);
  if (!strcmp(name, "code") && e->cls == X_SYSTEM_EXIT) return val_incref(e->arg ? e->arg : VAL_NONE);
  return err_set(ERR_ATTRIBUTE, "'%s' object has no attribute '%s'", classes[e->cls].name, name);
}

static Value *exc_str(Value *v) { return val_incref(((Exc *)v)->msg); }

static const OpaqueType exc_type = {"exception", exc_free, exc_repr, exc_getattr, exc_str, NULL, NULL};

static Value *exc_new(int cls, Value *msg, Value *arg) {
  Exc *e = shm_calloc(1, sizeof *e);
  if (!e) return err_nomem();
  val_init(&e->base.hdr, V_OPAQUE);
  e->base.ot = &exc_type;
  e->cls = cls;
  e->msg = val_incref(msg);
  e->arg = arg ? val_incref(arg) : NULL;
  return &e->base.hdr;
}

static bool is_exc(Value *v) { return v->type == V_OPAQUE && ((Opaque *)v)->ot == &exc_type; }

static int class_index(Value *v) {
  for (int i = 0; i < X_COUNT; i++)
    if (class_values[i] == v) return i;
  return -1;
}

static bool subclass(int c, int of) {
  for (; c >= 0; c = classes[c].parent)
    if (c == of) return true;
  return false;
}

/* ---- the error being handled ---------------------------------------------------- */

/* What the last raise of this thread set: its instance, and the message
 * it gave the error (to know the error still is that one).  raised_msg
 * holds a whole message (error.c keeps 2048 bytes of one): a shorter copy
 * would not compare equal to a long message, and its class would be lost. */
static _Thread_local Value *raised;
static _Thread_local char raised_msg[2048];

/* The code of the last SystemExit raised on any thread: a device's
 * raise reaches the main thread as its error's message only (the
 * instance is the device thread's), and the status needs the code.
 * NONE: no code or None; INT: [code]; TEXT: str(code) in [text]. */
enum { EXIT_UNSET, EXIT_NONE, EXIT_INT, EXIT_TEXT };
static struct {
  pthread_mutex_t lock;
  int kind;
  int64_t code;
  char text[200];
} last_exit = {PTHREAD_MUTEX_INITIALIZER, EXIT_UNSET, 0, ""};

static void note_exit(const Exc *e) {
  pthread_mutex_lock(&last_exit.lock);
  bool is_int = e->arg && arr_is_host(e->arg) && !dt_is_float(AS_ARRAY(e->arg)->dtype);
  last_exit.kind = !e->arg || e->arg == VAL_NONE ? EXIT_NONE : is_int ? EXIT_INT : EXIT_TEXT;
  last_exit.code = is_int ? arr_get_i64(AS_ARRAY(e->arg), 0) : 0;
  snprintf(last_exit.text, sizeof last_exit.text, "%s", str_cstr(e->msg));
  pthread_mutex_unlock(&last_exit.lock);
}

/* The last SystemExit's code as a value (NULL for none), when the pending
 * error's message is the one it made. */
static Value *noted_code(void) {
  pthread_mutex_lock(&last_exit.lock);
  const char *m = strstr(err_message(), "SystemExit");
  bool same = m && (last_exit.kind == EXIT_NONE ? !strcmp(m, "SystemExit")
                                                : !strncmp(m, "SystemExit: ", 12) && !strcmp(m + 12, last_exit.text));
  Value *v = !same || last_exit.kind == EXIT_NONE ? NULL
             : last_exit.kind == EXIT_INT ? arr_python_int(last_exit.code) : str_from(last_exit.text);
  pthread_mutex_unlock(&last_exit.lock);
  return v;
}

/* The built-in class of exception instance [v]: its own, or the one its
 * user class derives from (classes.h). */
static int instance_class(Value *v) { return is_exc(v) ? ((Exc *)v)->cls : cls_exc_base(v); }

/* Whether the pending error is the last raise's. */
static bool raised_pending(void) { return raised && !strcmp(err_message(), raised_msg); }

/* The class of the pending error: the raised instance's, else its kind's. */
static int current_class(void) {
  if (raised_pending()) return instance_class(raised);
  switch (err_kind()) {
  case ERR_NAME: return X_NAME;
  case ERR_TYPE: return strncmp(err_message(), "ShardingTypeError: ", 19) ? X_TYPE : X_SHARDING_TYPE;
  case ERR_INDEX: return strncmp(err_message(), "KeyError: ", 10) ? X_INDEX : X_KEY;
  case ERR_IO:
    if (!strncmp(err_message(), "no module named ", 16)) return X_MODULE_NOT_FOUND;
    return strncmp(err_message(), "cannot import name ", 19) ? X_OS : X_IMPORT;
  case ERR_MEMORY: return X_MEMORY;
  case ERR_ASSERT: return X_ASSERT;
  case ERR_INTERRUPT: return X_KEYBOARD;
  case ERR_NOT_IMPLEMENTED: return X_NOTIMPL;
  case ERR_ZERO_DIVISION: return X_ZERO;
  case ERR_OVERFLOW: return X_OVERFLOW;
  case ERR_SYNTAX: return X_SYNTAX;
  case ERR_ATTRIBUTE: return X_ATTRIBUTE;
  case ERR_FLOATING_POINT: return X_FLOATING;
  case ERR_SYSTEM_EXIT: return X_SYSTEM_EXIT;
  default: return strcmp(err_message(), "StopIteration") ? X_VALUE : X_STOP_ITERATION;   /* next()'s */
  }
}

/* Whether message [m] starts with a class's name, as a raise's and
 * KeyError's do: "ValueError: msg", or the bare name; after the
 * "on device (i=0): " a device's error gets on its way out. */
static bool names_class(const char *m) {
  while (!strncmp(m, "on device (", 11) && strstr(m, "): ")) m = strstr(m, "): ") + 3;
  for (int i = 0; i < X_COUNT; i++) {
    size_t n = strlen(classes[i].name);
    if (!strncmp(m, classes[i].name, n) && (m[n] == '\0' || (m[n] == ':' && m[n + 1] == ' ')))
      return true;
  }
  return false;
}

/* err_class_hook: the class to print before an uncaught error's message.
 * Not for ValueError, the class of the errors shmap itself finds in
 * specs, shapes and dtypes, which LANGUAGE.md section 9 prints without a
 * class; nor for what is not an exception (a collective that failed
 * elsewhere, the debugger's quit). */
static const char *class_to_print(void) {
  ErrKind k = err_kind();
  if (k == ERR_QUIT || k == ERR_COLLECTIVE || names_class(err_message())) return NULL;
  /* a raised instance of a class of the program's: its message is
   * already "E: boom" (raise_user) */
  if (raised_pending() && !is_exc(raised)) return NULL;
  int c = current_class();
  return c == X_VALUE ? NULL : classes[c].name;
}

int exc_matches(Value *handler) {
  ErrKind k = err_kind();
  if (k == ERR_QUIT || k == ERR_COLLECTIVE || k == ERR_NONE) return 0;
  int c = current_class();
  if (!handler) return c != X_KEYBOARD;   /* a bare except: every Exception */
  size_t n = 1;
  Value *const *hs = &handler;
  if (handler->type == V_TUPLE) val_seq(handler, &n, &hs);
  for (size_t i = 0; i < n; i++) {
    int h = class_index(hs[i]);
    if (h < 0 && cls_exc_base(hs[i]) >= 0) {   /* a class derived from an exception */
      if (raised_pending() && cls_isinstance(raised, hs[i]) == 1) return 1;
      continue;
    }
    if (h < 0) {
      err_set(ERR_TYPE, "catching classes that do not inherit from BaseException is not allowed");
      return -1;
    }
    if (subclass(c, h)) return 1;
  }
  return 0;
}

Value *exc_current(void) {
  if (raised_pending()) return val_incref(raised);
  int c = current_class();
  const char *m = err_message();
  if (c == X_SYSTEM_EXIT) {   /* raised on a device: the code it was given */
    Value *code = noted_code(), *msg = code ? val_str(code) : str_from("");
    Value *e = msg ? exc_new(c, msg, code) : NULL;
    val_decref(code);
    val_decref(msg);
    return e;
  }
  if (c == X_KEY && !strncmp(m, "KeyError: ", 10)) m += 10;
  if (c == X_MEMORY && !strncmp(m, "MemoryError: ", 13)) m += 13;
  if (c == X_SHARDING_TYPE) m += 19;
  if (!strcmp(m, classes[c].name)) m = "";   /* a bare `assert`'s */
  Value *msg = str_from(m);
  Value *e = msg ? exc_new(c, msg, NULL) : NULL;
  val_decref(msg);
  return e;
}

int exc_isinstance(Value *x, Value *cls) {
  int c = class_index(cls), k = instance_class(x);
  if (c < 0) return -1;
  return k >= 0 && subclass(k, c);
}

int exc_class_index(Value *v) { return class_index(v); }

Value *exc_type_of(Value *x) {
  return is_exc(x) ? val_incref(class_values[((Exc *)x)->cls]) : NULL;
}

/* raise of an instance (or a class) derived from an exception class: its
 * message is str() of the instance, its name the user class's. */
static int raise_user(Value *v, Loc loc) {
  Value *inst = cls_is_class(v) ? val_call_n(v, 0, NULL) : val_incref(v);
  Value *msg = inst ? val_str(inst) : NULL;
  if (!msg) {
    val_decref(inst);
    return -1;
  }
  ErrKind kind = classes[cls_exc_base(inst)].kind;
  const char *name = cls_name(cls_class_of(inst));
  if (*str_cstr(msg)) err_set_at(loc, kind, "%s: %s", name, str_cstr(msg));
  else err_set_at(loc, kind, "%s", name);
  val_decref(msg);
  if (raised) val_decref(raised);
  raised = inst;
  snprintf(raised_msg, sizeof raised_msg, "%s", err_message());
  return -1;
}

int exc_raise(Value *v, Loc loc) {
  Value *inst = NULL;
  if (cls_exc_base(v) >= 0) return raise_user(v, loc);
  int c = class_index(v);
  if (c >= 0) {
    Value *empty = str_from("");
    inst = empty ? exc_new(c, empty, NULL) : NULL;
    val_decref(empty);
  } else if (is_exc(v)) {
    inst = val_incref(v);
  } else {
    err_set_at(loc, ERR_TYPE, "exceptions must derive from BaseException");
    return -1;
  }
  if (!inst) return -1;
  Exc *e = (Exc *)inst;
  const char *m = str_cstr(e->msg);
  if (*m)
    err_set_at(loc, classes[e->cls].kind, "%s: %s", classes[e->cls].name, m);
  else
    err_set_at(loc, classes[e->cls].kind, "%s", classes[e->cls].name);
  if (e->cls == X_SYSTEM_EXIT) note_exit(e);
  if (raised) val_decref(raised);
  raised = inst;
  snprintf(raised_msg, sizeof raised_msg, "%s", err_message());
  return -1;
}

void exc_forget(void) {
  val_decref(raised);
  raised = NULL;
  raised_msg[0] = '\0';
}

/* ---- the classes as built-ins ----------------------------------------------------- */

/* Calling a class: an instance whose message is its argument's str. */
static Value *class_call(Value *self, const CallArgs *a) {
  int c = (int)arr_get_i64(AS_ARRAY(self), 0);
  if (a->nkw) return err_set(ERR_TYPE, "%s() takes no keyword arguments", classes[c].name);
  Value *msg = a->nargs == 0 ? str_from("")
               : a->args[0]->type == V_STR ? val_incref(a->args[0]) : val_str(a->args[0]);
  Value *e = msg ? exc_new(c, msg, a->nargs ? a->args[0] : NULL) : NULL;
  val_decref(msg);
  return e;
}

Value *exc_system_exit(Value *code) {
  bool none = !code || code == VAL_NONE;
  Value *msg = none ? str_from("") : code->type == V_STR ? val_incref(code) : val_str(code);
  Value *e = msg ? exc_new(X_SYSTEM_EXIT, msg, none ? NULL : code) : NULL;
  val_decref(msg);
  if (e) exc_raise(e, eval_current_loc());
  val_decref(e);
  return NULL;
}

int exc_exit_status(FILE *err) {
  Exc *e = raised_pending() && is_exc(raised) ? (Exc *)raised : NULL;
  Value *code = e ? val_incref(e->arg) : noted_code();
  int status = 1;
  if (!code || code == VAL_NONE) {
    /* sys.exit() or None; a class of the program's: its message */
    const char *m = e || !raised_pending() ? "" : strstr(err_message(), ": ");
    status = m && *m ? (fprintf(err, "%s\n", m + 2), 1) : 0;
  } else if (arr_is_host(code) && !dt_is_float(AS_ARRAY(code)->dtype)) {
    status = (int)(arr_get_i64(AS_ARRAY(code), 0) & 0xff);
  } else {
    Value *s = val_str(code);
    if (s) fprintf(err, "%s\n", str_cstr(s));
    val_decref(s);
  }
  val_decref(code);
  return status;
}

int exc_register(Env *b) {
  err_class_hook = class_to_print;
  for (int i = 0; i < X_COUNT; i++) {
    Value *idx = val_int(i);
    Value *v = idx ? bound_new(classes[i].name, class_call, idx) : NULL;
    val_decref(idx);
    if (v) ((BoundMethod *)v)->is_class = true;
    if (!v || (i != X_SHARDING_TYPE && env_set(b, intern_cstr(classes[i].name), v) < 0)) {
      val_decref(v);
      return -1;
    }
    class_values[i] = v;   /* kept for the run: the environment holds it too */
  }
  return 0;
}
