#!/bin/bash
# tests/check-layers.sh SRCDIR [BUILDDIR] - checks that calls run downward
# through src/'s layers.  The layers, bottom to top, are the folders named
# in LAYERS; a file of layer k may include headers of layers 0..k only
# (src/README.md), with quotes or angle brackets.  With BUILDDIR, the objects built there are checked
# too: no object may use a symbol defined by an object of a higher layer
# (an upward call hidden behind an extern declaration); a higher layer
# reaches a lower one only through the hooks the lower one offers.
#
# Prints one line per offence ("src/base/value.c:12: includes
# transform/trace.h, a higher layer"; "src/array/prim.o uses coll_psum of
# src/spmd/collective.o, a higher layer") and, last, "layers: N files, M
# upward includes, K upward calls"; exits 1 when M + K > 0.
set -u
srcdir=${1:?usage: check-layers.sh SRCDIR [BUILDDIR]}
builddir=${2:-}
LAYERS=(base array lang spmd transform cli)

rank() {
  local i
  for i in "${!LAYERS[@]}"; do
    [ "${LAYERS[$i]}" = "$1" ] && { echo "$i"; return; }
  done
  echo -1
}

# The project's own headers included with angle brackets, "line:layer/file.h"
# (<base/mem.h>, as -I lets a compiler find it): checked as the quoted
# ones are; system headers (<stdio.h>, <sys/types.h>) are not a layer's.
project_angle_includes() {
  grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*<' "$1" |
    sed 's/^\([0-9]*\):.*<\([^>]*\)>.*/\1:\2/' |
    while IFS=: read -r line inc; do
      [ "$(rank "${inc%%/*}")" -ge 0 ] && echo "$line:$inc"
    done
}

files=0
bad=0
for f in "$srcdir"/src/*/*.[ch] "$srcdir"/src/*/*.def; do
  [ -e "$f" ] || continue
  files=$((files + 1))
  own=$(basename "$(dirname "$f")")
  own_rank=$(rank "$own")
  if [ "$own_rank" -lt 0 ]; then
    echo "${f#"$srcdir"/}: folder '$own' is not a layer"
    bad=$((bad + 1))
    continue
  fi
  while IFS=: read -r line inc; do
    layer=${inc%%/*}
    r=$(rank "$layer")
    if [ "$layer" = "$inc" ] || [ "$r" -lt 0 ]; then
      echo "${f#"$srcdir"/}:$line: includes \"$inc\", not a layer's header"
      bad=$((bad + 1))
    elif [ "$r" -gt "$own_rank" ]; then
      echo "${f#"$srcdir"/}:$line: includes $inc, a higher layer"
      bad=$((bad + 1))
    fi
  done < <(grep -n '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$f" |
           sed 's/^\([0-9]*\):.*"\([^"]*\)".*/\1:\2/'
           project_angle_includes "$f")
done
for f in "$srcdir"/src/*.[ch]; do
  [ -e "$f" ] || continue
  echo "${f#"$srcdir"/}: outside every layer"
  bad=$((bad + 1))
done
# Symbols each object defines and uses, as "D layer object symbol" and
# "U layer object symbol" lines, from nm.
symbols() {
  local o layer
  for o in "$builddir"/src/*/*.o; do
    [ -e "$o" ] || continue
    layer=$(basename "$(dirname "$o")")
    nm "$o" | awk -v L="$layer" -v O="${o#"$builddir"/}" '
      NF == 3 && $2 ~ /^[TDBRC]$/ { print "D", L, O, $3 }
      NF == 2 && $1 == "U"        { print "U", L, O, $2 }'
  done
}

calls=0
if [ -n "$builddir" ] && command -v nm >/dev/null; then
  ranks=$(IFS=,; echo "${LAYERS[*]}")
  while read -r line; do
    echo "$line"
    calls=$((calls + 1))
  done < <(symbols | awk -v ranks="$ranks" '
    BEGIN { n = split(ranks, r, ","); for (i = 1; i <= n; i++) rank[r[i]] = i }
    $1 == "D" { def[$4] = $3; deflayer[$4] = $2; next }
    { use[NR] = $0 }
    END {
      for (k in use) {
        split(use[k], f, " ")
        s = f[4]
        if ((s in def) && rank[deflayer[s]] > rank[f[2]])
          print f[3] " uses " s " of " def[s] ", a higher layer"
      }
    }' | sort)
fi

echo "layers: $files files, $bad upward includes, $calls upward calls"
[ "$bad" -eq 0 ] && [ "$calls" -eq 0 ]
