/*
 * repl.h - the interactive read-eval-print loop.
 *
 * On a terminal the REPL reads with GNU readline: prompts `>>> ` and
 * `... `, line editing, history kept across sessions, and tab completion
 * of names (the globals and the built-ins) and of attributes after a dot
 * (`x.sh<TAB>`, `jnp.ar<TAB>`).  An entry is one line, or several when
 * the first one is incomplete (lex_needs_more): an open bracket or string
 * continues until it closes; a block opened by a line ending in ':'
 * continues until a blank line, as in Python's REPL.
 *
 * Ctrl-C at the prompt abandons the line being typed (and the rest of a
 * block); during evaluation it interrupts the running statement with an
 * error (the evaluator polls shm_interrupted).  Either way the REPL goes
 * back to `>>> ` with every global intact.  Ctrl-D on an empty line ends
 * the session.
 *
 * When stdin is not a terminal the REPL reads it line by line with the
 * same grouping into entries, writes its prompts to stderr (so stdout has
 * only the program's output), and still echoes expression values.
 *
 * Every entry is a new Source named "<stdin>", evaluated with
 * eval_source(..., echo=true), so the value of a final expression is shown
 * as its repr.  Errors are printed with err_print and the loop goes on;
 * the last one is kept for pm() (dbg_keep_error).  breakpoint() typed at
 * the prompt stops at the next statement run, the first of the next
 * entry.
 *
 * Commands at the `>>> ` prompt:
 *   :plan F(ARGS)   prints plan(F, ARGS), the staged plan of F's call
 *   :help           lists the commands and keys
 *   :quit           ends the session, like Ctrl-D
 *
 * History: the file is history.file from the config when set, else
 * $XDG_STATE_HOME/shmap/history when XDG_STATE_HOME is set, else
 * ~/.shmap_history; it keeps the last history.size lines (0: none).
 */
#ifndef SHMAP_REPL_H
#define SHMAP_REPL_H

#include "lang/eval.h"

/*
 * Runs the REPL in the module scope [globals] (borrowed; a script run
 * before with -i shares it) until end of input or :quit.  Reads the
 * history and print settings from shm_options (config.h).  At a terminal
 * and with [banner] (a session without a script before it, as Python's)
 * it first greets the user with the version and where help is.  Returns
 * the process exit status: 0.
 */
int repl_run(Env *globals, bool banner);

/*
 * The file the REPL keeps its history in, as a new shm_malloc'd string
 * (see above), or NULL when there is none (history.size is 0, or neither
 * XDG_STATE_HOME nor HOME is set).  Creates $XDG_STATE_HOME/shmap if
 * needed.
 */
char *repl_history_path(void);

/*
 * The REPL's grouping of lines into an entry, for other prompts that read
 * statements (the debugger's `interact`): true when the entry goes on
 * after [line], its latest line, [entry] being the whole entry so far
 * with [line] last, each line ending in a newline.  An entry goes on
 * while a bracket or string is open or a line ends in a backslash, and,
 * once a line opened a block or the entry's first line starts a compound
 * statement, even one on a single line (*block, false for a new entry, is
 * set then), until a blank line.  Raises nothing.
 */
bool repl_entry_goes_on(const char *entry, const char *line, bool *block);

/* Tab completion of an attribute, for the REPL and the debugger: calls
 * [add]("base.name", ctx) for each attribute of the object that the
 * dotted path before [text]'s last dot names in [scope] (then among the
 * built-ins) whose name starts with what follows the dot.  Only names and
 * attributes are looked up: no call runs.  Nothing when [text] has no
 * dot or names nothing.  Raises nothing. */
void repl_each_attribute(Env *scope, const char *text, void (*add)(const char *, void *),
                         void *ctx);

#endif
