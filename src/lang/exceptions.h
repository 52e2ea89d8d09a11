/*
 * exceptions.h - Python's exception classes over the interpreter's errors:
 * try/except/else/finally and raise (semantics: Python's; the classes
 * are the ones the interpreter raises, in Python's hierarchy).
 *
 * An error of the interpreter (base/error.h) has a kind; each kind is an
 * exception class (ERR_VALUE is ValueError, ERR_INDEX IndexError or
 * KeyError, ERR_ZERO_DIVISION ZeroDivisionError, ...).  The classes are
 * built-in values (ValueError, TypeError, ..., Exception, BaseException)
 * that make instances when called; `raise` sets the error of the class's
 * kind, its message "ValueError: msg" as Python prints it, and remembers
 * the instance so `except ... as e` gets it back (str(e) is "msg").
 * Errors that are not exceptions in a program's sense stay uncatchable:
 * the debugger's quit, and a collective that failed on another device
 * (every device must see it, or the group would go on without them).
 * Ctrl-C is KeyboardInterrupt, caught only by that name or BaseException.
 */
#ifndef SHMAP_EXCEPTIONS_H
#define SHMAP_EXCEPTIONS_H

#include <stdio.h>

#include "lang/eval.h"

/* Registers the classes as built-ins.  0 or -1. */
int exc_register(Env *builtins);

/* Whether the pending error may be caught by [handler] (a class, a tuple
 * of classes, or NULL for a bare except).  -1 with a new error when
 * [handler] is not a class. */
int exc_matches(Value *handler);

/* The pending error as an exception instance (a new reference), for
 * `except ... as e`; the error stays pending. */
Value *exc_current(void);

/* isinstance(x, cls) for an exception class [cls]: 1 or 0, or -1 when
 * [cls] is not one (no error set). */
int exc_isinstance(Value *x, Value *cls);

/* The index of built-in exception class [v] (ValueError, Exception, ...)
 * among the classes, for classes.c's classes derived from one; -1 when
 * [v] is not one. */
int exc_class_index(Value *v);

/* type(x) for an exception instance: its class (the built-in
 * ValueError itself, so type(e) is ValueError and type(e).__name__ is
 * its name, as in Python); NULL (no error set) when [x] is not one (a
 * class's type is `type`: builtins_type_of).  A new reference. */
Value *exc_type_of(Value *x);

/* raise [v]: sets the error for [v] (a class or an instance) at [loc];
 * always returns -1. */
int exc_raise(Value *v, Loc loc);

/* sys.exit([code]): raises SystemExit(code) at the statement being run
 * (ERR_SYSTEM_EXIT, which `except SystemExit`, `except BaseException` and
 * a bare except catch, and `except Exception` does not).  Returns NULL. */
Value *exc_system_exit(Value *code);

/* The exit status of the pending ERR_SYSTEM_EXIT, as Python's: 0 for no
 * code or None, an int code's low 8 bits (what the system keeps), else 1
 * after writing str(code) and a newline to [err].  The error stays
 * pending. */
int exc_exit_status(FILE *err);

/* Releases this thread's last raised instance (kept so `except ... as e`
 * gets it back): a device thread calls it when its job is over, the
 * interpreter at exit, since the reference lives in thread-local storage
 * that nothing else frees when the thread ends. */
void exc_forget(void);

#endif
