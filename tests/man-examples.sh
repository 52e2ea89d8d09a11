#!/bin/bash
# tests/man-examples.sh BUILDDIR SRCDIR - runs the examples of the manual
# pages as tests, so the documentation cannot drift from the program.
#
# In man/shmap.1 and man/shmap.7 an example is a literal display preceded
# by the comment line `.\" shmap-example`; the display after the next
# `.\" shmap-output` comment is its expected standard output:
#
#     .\" shmap-example
#     .Bd -literal -offset indent
#     print(arange(5.))
#     .Ed
#     prints
#     .\" shmap-output
#     .Bd -literal -offset indent
#     [0. 1. 2. 3. 4.]
#     .Ed
#
# An example followed by `.\" shmap-error` instead expects the program to
# fail, and the first line of that display is the expected error (compared
# as `# expect-error:` compares it: without the file name).
#
# Each example becomes a test file `PAGE-lineN.shm` (N: the line of its
# marker) in a temporary directory, run with `shmap --test`; the output is
# the runner's, ending with its "N passed, M failed" line.
set -u

builddir=${1:?usage: man-examples.sh BUILDDIR SRCDIR}
srcdir=${2:?usage: man-examples.sh BUILDDIR SRCDIR}
work=$(mktemp -d "${TMPDIR:-/tmp}/shmap-man.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Writes one test file per example of the page $1 into $work.
extract() {
  local page=$1 base
  base=$(basename "$page")
  awk -v out="$work" -v base="$base" '
    # roff escapes that may appear inside literal displays
    function unroff(s) {
      gsub(/\\&/, "", s); gsub(/\\\(aq/, "\047", s); gsub(/\\\(dq/, "\"", s)
      gsub(/\\\(ga/, "`", s); gsub(/\\-/, "-", s); gsub(/\\e/, "\\", s)
      return s
    }
    /^\.\\" shmap-example/ { want = "code"; line = NR; ncode = 0; next }
    /^\.\\" shmap-output/  { want = "output"; next }
    /^\.\\" shmap-error/   { want = "error"; next }
    /^\.Bd/ && want != "" { grab = want; want = ""; nout = 0; next }
    /^\.Ed/ && grab != "" {
      if (grab != "code") {
        file = out "/" base "-line" line ".shm"
        for (i = 1; i <= ncode; i++) print code[i] > file
        # after the code, so error line numbers match the example
        printf "# example from man/%s, line %d\n", base, line > file
        if (grab == "output") {
          print "# expect-block:" > file
          for (i = 1; i <= nout; i++) print (o[i] == "" ? "#" : "# " o[i]) > file
          print "# end" > file
        } else {
          print "# expect-error: " o[1] > file
        }
        close(file)
      }
      grab = ""; next
    }
    grab == "code" { code[++ncode] = unroff($0); next }
    grab != "" { o[++nout] = unroff($0); next }
  ' "$page"
}

for page in "$srcdir"/man/shmap.1 "$srcdir"/man/shmap.7; do
  [ -f "$page" ] && extract "$page"
done
if ! ls "$work"/*.shm >/dev/null 2>&1; then
  echo "0 passed, 0 failed"
  exit 0
fi
cd "$work" && exec "$builddir/shmap" --test .
