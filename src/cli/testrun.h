/*
 * testrun.h - `shmap --test FILE...`: scripts that carry their expected
 * output in comments, in the manner of Wren's test suite.
 *
 * Each argument is a .shm file, or a directory whose *.shm files (not its
 * subdirectories, and not files whose name starts with '_', which are
 * helper modules for the others) are run in sorted order.  Every test runs
 * in a fresh child process (this same executable, /proc/self/exe, with the
 * test's path as the script), stdin from /dev/null (unless a stdin
 * directive gives it), stdout and stderr
 * captured.  One line is printed per test, `PASS path` or `FAIL path`
 * followed by indented lines saying what differed, and the run ends with
 * exactly one line `N passed, M failed`.
 *
 * THE EXPECTATION SYNTAX.  Directives are `#` comments; a directive may
 * stand alone on its line or follow code on the same line
 * (`print(1 + 1)  # expect: 2`).  The text after "directive:" begins
 * after exactly one space and runs to the end of the line, kept exact
 * (trailing blanks matter).
 *
 *   # expect: TEXT        the next line of stdout is TEXT.  `# expect:`
 *                         with nothing after it expects an empty line.
 *   # expect-block:       every following line up to `# end` is an expected
 *   # TEXT                stdout line, with its leading "# " (or a lone
 *   # end                 "#") removed; for long outputs.
 *   # expect-error: MSG   the first line of stderr is the error MSG.  The
 *                         file name is not compared: "3:5: error: bad"
 *                         compares line, column and message, "error: bad"
 *                         only the message ("path:" before either is
 *                         accepted and ignored).  Implies exit status 1.
 *   # expect-stderr: TEXT the next line of stderr (after the error line,
 *                         if any) is TEXT, exactly.
 *   # expect-exit: N      the exit status is N (default 0, or 1 with
 *                         expect-error).
 *   # options: ARGS       command-line options put before the script path
 *                         (split at blanks), e.g. `--devices 4`.
 *   # args: ARGS          arguments after the script path (argv[1:]).
 *   # env: NAME=VALUE     sets an environment variable for the child.
 *   # stdin: TEXT         a line of the child's standard input: the TEXTs
 *                         of every stdin directive, in order, each ended
 *                         by a newline (scripted debugger sessions).
 *   # stdin-file: NAME    the child's standard input is the file NAME,
 *                         relative to the test's directory.
 *
 * In ARGS and VALUE, `${TESTDIR}` is the directory of the test file.
 * A comment that begins "# expect" and has a ':' but is none of the
 * directives above (a misspelling), an expect-exit that is not 0..255,
 * or an expect-block without its `# end`, makes the test fail as a bad
 * test, so a typo cannot make it pass vacuously.
 *
 * What is compared: stdout must equal the expected lines exactly, no more
 * and no fewer.  If the test names no stderr lines, stderr must be empty;
 * otherwise the named lines must be the first lines of stderr, in order,
 * and any later lines (an error's source line and caret) are not
 * compared.  The exit status must match.  A test killed by a signal, or
 * still running after the timeout (SHMAP_TEST_TIMEOUT seconds, default
 * 60), fails and says so.
 *
 * With SHMAP_TEST_MPI=P in the environment every test runs as `mpirun
 * --oversubscribe --bind-to none -np P` processes of this executable
 * (LANGUAGE.md section 12) with the same expectations: a program's output
 * over P processes is one process's.  A test that reads the terminal
 * (--debug, -i, stdin directives), writes per-process files (--trace,
 * --comm-stats), or whose device count P does not divide is not run: its
 * line says `SKIP path (why)` and it is not counted.
 * The child's environment is made reproducible: SHMAP_CONFIG is set to ""
 * (no config file is read) and SHMAP_DEVICES and SHMAP_PATH are removed,
 * before the test's own `# env:` lines apply.  The child runs in the
 * runner's working directory.
 */
#ifndef SHMAP_TESTRUN_H
#define SHMAP_TESTRUN_H

/*
 * Runs the tests named by the [n] paths in [paths] (files or
 * directories), printing one line per test and the closing
 * "N passed, M failed" line to stdout.  [exe] is the program to run each
 * test with (NULL: /proc/self/exe).  Returns the process exit status:
 * 0 if every test passed, 1 if any failed or a path could not be read.
 */
int testrun_main(int n, char *const paths[], const char *exe);

#endif
