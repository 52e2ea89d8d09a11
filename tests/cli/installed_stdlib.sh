#!/bin/bash
# tests/cli/installed_stdlib.sh SHMAP - only the binary the build made,
# run where it was built, searches its source tree's stdlib/ for modules
# (shmap(1), FILES); a copy elsewhere, as `make install` puts one under
# its prefix, searches the installed stdlib alone (it used to search the
# build tree's too).  --verbose shows the module search path.
set -u
shmap=${1:?usage: installed_stdlib.sh SHMAP}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
search_path() { "$1" --verbose -c 'x = 1' 2>&1 | grep '^shmap: module search path:'; }
built=$(search_path "$shmap")
cp "$shmap" "$dir/shmap"
copied=$(search_path "$dir/shmap")
case "$built" in
  */stdlib\ */stdlib) ;;
  *) echo "the built binary's path lacks the source tree's stdlib/: $built"; exit 1 ;;
esac
# the copy's path is the built one's without its last folder
[ "$copied" = "${built% *}" ] || { echo "built:  $built"; echo "copied: $copied"; exit 1; }
exit 0
