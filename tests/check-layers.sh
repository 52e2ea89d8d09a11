#!/bin/bash
# tests/check-layers.sh SRCDIR - checks that calls run downward through
# src/'s layers: no file may include a header of a higher layer than its
# own.  The layers, bottom to top, are the folders named in LAYERS; a file
# of layer k may include headers of layers 0..k (src/README.md).
#
# Prints one line per offending #include ("src/base/value.c:12: includes
# transform/trace.h, a higher layer") and, last, "layers: N files, M
# upward includes"; exits 1 when M > 0.
set -u
srcdir=${1:?usage: check-layers.sh SRCDIR}
LAYERS=(base array lang spmd transform cli)

rank() {
  local i
  for i in "${!LAYERS[@]}"; do
    [ "${LAYERS[$i]}" = "$1" ] && { echo "$i"; return; }
  done
  echo -1
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
           sed 's/^\([0-9]*\):.*"\([^"]*\)".*/\1:\2/')
done
for f in "$srcdir"/src/*.[ch]; do
  [ -e "$f" ] || continue
  echo "${f#"$srcdir"/}: outside every layer"
  bad=$((bad + 1))
done
echo "layers: $files files, $bad upward includes"
[ "$bad" -eq 0 ]
