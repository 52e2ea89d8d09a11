#!/usr/bin/env bash
# The MLP training step of bench/partitioned_mlp.shm in each layout, as a
# jit that partitions (Auto) and as the hand-written shard_map (Manual):
# the bytes every collective sent (--comm-stats; they must be equal) and
# the step time (best of 5), with the ratio Auto/Manual.
#   bench/partitioned_mlp.sh [BUILDDIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
shmap="$(cd "${1:-.}" && pwd)/shmap"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The total bytes of a --comm-stats table, each row read back in the unit
# it prints (so to a tenth of a KiB or MiB: a row of megabytes hides a
# few bytes of scalar psums).
bytes() {
  awk '/^ *[0-9]+ +[a-z_]+ /{
         for (i = 1; i <= NF; i++) if ($i ~ /^(B|KiB|MiB|GiB)$/) {
           m = $i == "B" ? 1 : $i == "KiB" ? 1024 : $i == "MiB" ? 1048576 : 1073741824
           t += $(i - 1) * m } }
       END { printf "%.0f", t }' "$1"
}

printf '%-6s %14s %14s %10s %10s %7s\n' layout "auto bytes" "manual bytes" "auto ms" "manual ms" ratio
for mode in dp fsdp tp; do
  for how in auto manual; do
    "$shmap" --devices 8 --comm-stats "$here/partitioned_mlp.shm" "$mode" "$how" \
      > "$tmp/$how.out" 2> "$tmp/$how.err"
    grep -q 'matches True' "$tmp/$how.out" || { echo "$mode $how: wrong result: $(cat "$tmp/$how.out")"; exit 1; }
  done
  ta=$(awk '{print $3}' "$tmp/auto.out"); tm=$(awk '{print $3}' "$tmp/manual.out")
  printf '%-6s %14s %14s %10s %10s %7.2f\n' "$mode" "$(bytes "$tmp/auto.err")" \
    "$(bytes "$tmp/manual.err")" "$ta" "$tm" "$(echo "$ta / $tm" | bc -l)"
done
