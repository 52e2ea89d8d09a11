#!/bin/bash
# tests/run-tests.sh BUILDDIR SRCDIR - the whole test suite; `make check`
# runs it.  Three parts, each counted in checks:
#
#   1. the Check unit tests: every tests/unit/test_*.c of SRCDIR must have
#      its binary in BUILDDIR/tests/unit; each "Checks: N, Failures: F,
#      Errors: E" summary counts N-F-E passed and F+E failed; a binary
#      that is missing, crashes, times out or fails without a summary
#      counts as one failure;
#   2. the language tests: `shmap --test tests/lang` (run from SRCDIR),
#      the examples (`shmap --test examples`), and the shard_map tests and
#      examples once more in reference mode (SHMAP_REFERENCE=1);
#      with MPI (and not under a sanitizer), the shard_map, collective
#      and xmap tests and the examples once more over `mpirun -np 2` and
#      `-np 4` (SHMAP_TEST_MPI, testrun.h), and over `-np 4` with every
#      message by MPI (SHMAP_MPI_NO_SHARED: as between machines);
#   3. the manual's examples: tests/man-examples.sh;
#   4. the --test runner itself: its report on the deliberately failing
#      fixtures of tests/testrun must equal tests/testrun/expected.out;
#   5. `mandoc -T lint -W warning` on each manual page (when mandoc is
#      installed).
#   6. the terminal sessions tests/tty/*.sh, through tmux (each is
#      skipped, with a note, when tmux is not installed), and the command
#      line's scripts tests/cli/*.sh (--trace, --comm-stats, Ctrl-C, races
#      whose right answers are more than one, out of memory at each
#      allocation; their programs in tests/cli/progs);
#   7. the debug adapter, `shmap --dap`, driven by VS Code's test client
#      (tests/dap/dap.sh; skipped, with a SKIP line, where node is absent);
#   8. the layering of src/: tests/check-layers.sh over the sources'
#      #include lines and the built objects' symbols, and
#      tests/check-hooks.sh, src/README.md's table of hooks against the
#      headers' /* hook */ declarations.
#
# Failures are shown in full; passes only as counts.  The last line is
# exactly "N passed, M failed", and the exit status is 0 iff M is 0.
#
# Environment: UNIT_TIMEOUT (seconds per unit binary, default 600),
# SHMAP_TEST_TIMEOUT (seconds per language test, default 60), both scaled
# by SHMAP_TEST_SCALE (default 1; 2 in an ASan build, 4 in a TSan one).
set -u

builddir=${1:?usage: run-tests.sh BUILDDIR SRCDIR}
srcdir=${2:?usage: run-tests.sh BUILDDIR SRCDIR}
builddir=$(cd "$builddir" && pwd)
srcdir=$(cd "$srcdir" && pwd)
passed=0
failed=0

# Sanitizer builds run several times slower (TSan most), and a busy
# machine slower still, so every time limit here grows by one factor:
# the Check cases' through CK_TIMEOUT_MULTIPLIER, the language tests'
# (SHMAP_TEST_TIMEOUT) and the scripts', which multiply their own limits
# by SHMAP_TEST_SCALE.  Set SHMAP_TEST_SCALE to choose it.
if [ -z "${SHMAP_TEST_SCALE:-}" ]; then
  syms=$(nm "$builddir/shmap" 2>/dev/null)
  if grep -q '__tsan_init' <<<"$syms"; then SHMAP_TEST_SCALE=4
  elif grep -q '__asan_init' <<<"$syms"; then SHMAP_TEST_SCALE=2
  else SHMAP_TEST_SCALE=1
  fi
fi
export SHMAP_TEST_SCALE
# LeakSanitizer ends a leaking run with status 1, the status of an
# expected error: its own status makes a leak fail any test or script
# that checks the status (the --test runner also fails a test whose
# stderr holds a sanitizer's report, wherever it stands).
export LSAN_OPTIONS="${LSAN_OPTIONS:+$LSAN_OPTIONS:}exitcode=23"
export CK_TIMEOUT_MULTIPLIER=${CK_TIMEOUT_MULTIPLIER:-$SHMAP_TEST_SCALE}
export SHMAP_TEST_TIMEOUT=${SHMAP_TEST_TIMEOUT:-$((60 * SHMAP_TEST_SCALE))}

# Indents its input, for quoting a failure's output.
indent() { sed 's/^/    /'; }

# Adds one part's counts and says how it went.
tally() {
  local part=$1 p=$2 f=$3
  passed=$((passed + p))
  failed=$((failed + f))
  printf '%-24s %d passed, %d failed\n' "$part:" "$p" "$f"
}

# Runs one Check binary and adds its counts.
run_unit() {
  local bin=$1 name out status p=0 f=0 n fl er
  name=$(basename "$bin")
  if [ ! -x "$bin" ]; then
    echo "FAIL unit/$name: not built"
    tally "unit/$name" 0 1
    return
  fi
  out=$(cd "$builddir" && timeout "${UNIT_TIMEOUT:-$((600 * SHMAP_TEST_SCALE))}" "$bin" 2>&1)
  status=$?
  while read -r n fl er; do
    p=$((p + n - fl - er))
    f=$((f + fl + er))
  done < <(sed -n 's/.*Checks: \([0-9]*\), Failures: \([0-9]*\), Errors: \([0-9]*\).*/\1 \2 \3/p' <<<"$out")
  if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then
    f=1  # crashed, timed out, or failed at exit (a sanitizer report)
  fi
  if [ "$f" -ne 0 ]; then
    echo "FAIL unit/$name (exit status $status):"
    tail -n 40 <<<"$out" | indent
  fi
  tally "unit/$name" "$p" "$f"
}

# Runs a command that prints a --test report; shows its failures and adds
# its "N passed, M failed" line (none at all counts as one failure).
run_report() {
  local part=$1 out last
  shift
  out=$("$@" 2>&1)
  last=$(tail -n 1 <<<"$out")
  grep -v '^PASS ' <<<"$out" | sed '$d'
  if [[ $last =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    tally "$part" "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
  else
    echo "FAIL $part: no summary line (the runner crashed?)"
    tail -n 20 <<<"$out" | indent
    tally "$part" 0 1
  fi
}

# Compares the runner's report on tests/testrun with the expected one.
run_selftest() {
  local diffs
  if diffs=$(cd "$srcdir" && SHMAP_TEST_TIMEOUT=1 "$builddir/shmap" --test tests/testrun 2>&1 |
             diff -u tests/testrun/expected.out -); then
    tally "test runner" 1 0
  else
    echo "FAIL test runner: its report on tests/testrun differs from expected.out:"
    indent <<<"$diffs"
    tally "test runner" 0 1
  fi
}

# Lints each manual page; a warning or worse fails it.
# Runs each script $2/*.sh on the built shmap, counted as part $1: exit
# status 0 passes, 77 is a skip (its last line is shown as a note).
run_scripts() {
  local part=$1 t out status p=0 f=0
  for t in "$srcdir/$2"/*.sh; do
    [ -e "$t" ] || continue
    out=$(timeout $((300 * SHMAP_TEST_SCALE)) bash "$t" "$builddir/shmap" 2>&1)
    status=$?
    if [ "$status" -eq 77 ]; then
      echo "note: $(tail -n 1 <<<"$out")"
    elif [ "$status" -eq 0 ]; then
      p=$((p + 1))
    else
      echo "FAIL $2/$(basename "$t" .sh) (exit status $status):"
      tail -n 40 <<<"$out" | indent
      f=$((f + 1))
    fi
  done
  tally "$part" "$p" "$f"
}

# Checks that src/'s includes and calls run from higher layers to lower.
run_layers() {
  local out
  if out=$(bash "$srcdir/tests/check-layers.sh" "$srcdir" "$builddir" 2>&1); then
    tally "layers" 1 0
  else
    echo "FAIL layers: calls that run upward (src/README.md):"
    indent <<<"$out"
    tally "layers" 0 1
  fi
  if out=$(bash "$srcdir/tests/check-hooks.sh" "$srcdir" 2>&1); then
    tally "hooks" 1 0
  else
    echo "FAIL hooks: src/README.md's table of hooks against the headers:"
    indent <<<"$out"
    tally "hooks" 0 1
  fi
}

run_lint() {
  local p=0 f=0 page msgs
  command -v mandoc >/dev/null || return 0
  for page in "$srcdir"/man/shmap.1 "$srcdir"/man/shmap.7; do
    if msgs=$(mandoc -T lint -W warning "$page" 2>&1) && [ -z "$msgs" ]; then
      p=$((p + 1))
    else
      echo "FAIL mandoc -T lint $(basename "$page"):"
      indent <<<"$msgs"
      f=$((f + 1))
    fi
  done
  tally "man lint" "$p" "$f"
}

for src in "$srcdir"/tests/unit/test_*.c; do
  [ -e "$src" ] || continue
  run_unit "$builddir/tests/unit/$(basename "$src" .c)"
done

if [ -x "$builddir/shmap" ]; then
  # shellcheck disable=SC2016 # $1 and $2 are bash -c's own arguments
  run_report "language" bash -c 'cd "$1" && exec "$2" --test tests/lang' _ "$srcdir" "$builddir/shmap"
  run_report "examples" bash -c 'cd "$1" && exec "$2" --test examples' _ "$srcdir" "$builddir/shmap"
  # The shard_map tests and examples again in reference mode: devices one
  # at a time, collectives by plain loops over all blocks (collective.h).
  # Their expected output is the threaded run's, so the two must agree.
  # shellcheck disable=SC2016
  run_report "reference mode" bash -c 'cd "$1" && SHMAP_REFERENCE=1 exec "$2" --test tests/lang/shard_map_*.shm tests/lang/coll_*.shm examples' _ "$srcdir" "$builddir/shmap"
  # The shard_map, collective and xmap tests and the examples again over
  # 2 and 4 MPI processes (LANGUAGE.md section 12), whose output must be
  # one process's; not in sanitizer builds (Open MPI is not instrumented).
  if "$builddir/shmap" --version | grep -q '^MPI: Open MPI' && command -v mpirun >/dev/null &&
     [ "$SHMAP_TEST_SCALE" -eq 1 ]; then
    # -np 4 twice: processes of one machine pass small messages through
    # shared memory (transport_node.c); SHMAP_MPI_NO_SHARED sends every
    # message by MPI, as processes on different machines do
    for run in "2" "4" "4 SHMAP_MPI_NO_SHARED=1"; do
      read -r np shared <<<"$run"
      # shellcheck disable=SC2016
      run_report "mpirun -np $np${shared:+, $shared}" bash -c 'cd "$1" && exec env $4 SHMAP_TEST_MPI="$3" "$2" --test tests/lang/*shard_map*.shm tests/lang/coll_*.shm tests/lang/xmap_*.shm examples' _ "$srcdir" "$builddir/shmap" "$np" "$shared"
    done
  else
    echo "note: the MPI runs are skipped (a build without MPI, no mpirun, or a sanitizer build)"
  fi
  run_report "man examples" bash "$srcdir/tests/man-examples.sh" "$builddir" "$srcdir"
  run_selftest
  run_scripts "terminal" tests/tty
  run_scripts "command line" tests/cli
  run_scripts "debug adapter" tests/dap
else
  echo "FAIL shmap: not built"
  tally "shmap" 0 1
fi
run_lint
run_layers

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
