#!/bin/bash
# tests/check-hooks.sh SRCDIR - checks src/README.md's table of hooks
# against the headers.  A hook is how a lower layer lets a higher one in
# (src/README.md, "How a lower layer reaches a higher one"); each is
# declared in a header of src/ with the comment /* hook */ on the line
# that names it.  Every such declaration must be a row of the table, and
# every name in the table's first column must be declared, with the
# marker, in the header the row names.
#
# Prints one line per offence ("src/lang/eval.h: eval_stmt_hook is a hook
# missing from src/README.md's table") and, last, "hooks: N declared, M in
# the table, K offences"; exits 1 when K > 0.
set -u
srcdir=${1:?usage: check-hooks.sh SRCDIR}
readme="$srcdir/src/README.md"
bad=0

# "header name" for each marked declaration: the variable of an extern
# function pointer, (*name), else the function's name (the identifier
# before the first parenthesis), else the variable's.
declared() {
  grep -n '/\* hook \*/' "$srcdir"/src/*/*.h | while IFS=: read -r file _ text; do
    name=$(sed -n 's/^extern[^(]*(\*\([A-Za-z_][A-Za-z0-9_]*\)).*/\1/p' <<<"$text")
    [ -n "$name" ] || name=$(sed -n 's/^\([^(]*[^A-Za-z0-9_]\)\{0,1\}\([A-Za-z_][A-Za-z0-9_]*\)[[:space:]]*(.*/\2/p' <<<"$text")
    [ -n "$name" ] || name=$(sed -n 's/^.*[^A-Za-z0-9_]\([A-Za-z_][A-Za-z0-9_]*\)[[:space:]]*;.*/\1/p' <<<"$text")
    echo "${file#"$srcdir"/src/} $name"
  done | sort -u
}

# "header name" for each name of the table's first column: the rows
# between the table's heading row and the next blank line; the header is
# the row's (`layer/file.h`).
tabled() {
  awk '/^\| hook \(declared in\)/ {on = 1; next}
       on && /^$/ {on = 0}
       on && /^\|[^-]/ {split($0, c, "|"); print c[2]}' "$readme" |
    while read -r cell; do
      header=$(grep -o '`[a-z]*/[a-z_]*\.h`' <<<"$cell" | head -1 | tr -d '`')
      grep -o '`[A-Za-z_][A-Za-z0-9_]*`' <<<"$cell" | tr -d '`' |
        while read -r name; do echo "$header $name"; done
    done | sort -u
}

decl=$(declared)
tab=$(tabled)
while read -r header name; do
  [ -n "$name" ] || continue
  grep -qx "$header $name" <<<"$tab" ||
    { echo "src/$header: $name is a hook missing from src/README.md's table"; bad=$((bad + 1)); }
done <<<"$decl"
while read -r header name; do
  [ -n "$name" ] || continue
  grep -qx "$header $name" <<<"$decl" ||
    { echo "src/README.md: the table's $name is not a hook declared in src/$header"; bad=$((bad + 1)); }
done <<<"$tab"
echo "hooks: $(grep -c . <<<"$decl") declared, $(grep -c . <<<"$tab") in the table, $bad offences"
[ "$bad" -eq 0 ]
