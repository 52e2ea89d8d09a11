#!/usr/bin/env bash
# Checks the predicted step time against this machine: for each jit plan
# the bench programs run, asks `--estimate` for the plan's step time on a
# profile `shmap --calibrate` measures afresh (three times: before and
# after the timed runs; the median), and times the same plan by whole
# processes: the median wall time of runs making K2 calls less that of
# runs making K1, the two in turn (start-up, data and compiling cancel),
# over K2 - K1.
# Prints the machine and a Markdown table (README.md, "Planning at
# scale") with the ratio measured / predicted.
#   bench/validate_estimate.sh [BUILDDIR [RUNS]]   (default: . and 5 runs each)
#
# Each program makes only the calls asked for when its environment says
# so (SHMAP_BENCH_PLAN, SHMAP_BENCH_CALLS; dot_bench's SHMAP_DOT_STEPS);
# psum_jit's REPS argument is its number of psums (the estimate of its
# while loop, whose trip count is data, is of one iteration).
# The bench programs without a jit plan (elementwise, psum, all_gather,
# all_to_all, matmul_basic: eager) have nothing to estimate.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-.}" && pwd)
runs=${2:-5}
shmap="$build/shmap"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# program | plan | variable with the number of calls | other environment |
# K1 | K2 | arguments, where {K} stands for the number of calls
cases='jit_bench.shm|expr|SHMAP_BENCH_CALLS|SHMAP_BENCH_PLAN=expr|1|101
jit_bench.shm|loop|SHMAP_BENCH_CALLS|SHMAP_BENCH_PLAN=loop|1|301
jit_bench.shm|matmul_basic|SHMAP_BENCH_CALLS|SHMAP_BENCH_PLAN=matmul_basic|1|2001
rownorm.shm|rownorm|SHMAP_BENCH_CALLS||1|501
grad_mlp.shm|<jit>|SHMAP_BENCH_CALLS||1|41
dot_bench.shm|step|SHMAP_DOT_STEPS||1|41
xmap_network.shm|loss|SHMAP_BENCH_CALLS|SHMAP_BENCH_PLAN=positional|1|501
xmap_network.shm|<jit>|SHMAP_BENCH_CALLS|SHMAP_BENCH_PLAN=none|1|501
xmap_network.shm|<jit>|SHMAP_BENCH_CALLS|SHMAP_BENCH_PLAN=batch:x|1|201
xmap_network.shm|<jit>|SHMAP_BENCH_CALLS|SHMAP_BENCH_PLAN=hidden:x|1|201
xmap_network.shm|<jit>|SHMAP_BENCH_CALLS|SHMAP_BENCH_PLAN=batch:x,hidden:y|1|201
psum_jit.shm|many|||1|20001|8 1024 {K}'

# seconds of "12.3 ms", "4.5 us", "1.2 s"
seconds() { awk -v x="$1" -v u="$2" 'BEGIN { f = u == "s" ? 1 : u == "ms" ? 1e-3 : 1e-6; printf "%.9g\n", x * f }'; }

# the environment (in $extra) and arguments of a run making $1 calls
run_with() {
  local k=$1
  extra=()
  [ -n "$envs" ] && extra+=("$envs")
  [ -n "$var" ] && extra+=("$var=$k")
  read -r -a argv <<<"${args//\{K\}/$k}"
}

# the wall seconds of one run making $1 calls
wall() {
  run_with "$1"
  local t0 t1
  t0=$(date +%s.%N)
  env "${extra[@]}" "$shmap" "$here/$prog" "${argv[@]}" >/dev/null
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.6f\n", b - a }'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# $runs runs making $1 calls and $runs making $2, in turn (a drifting
# machine then slows both alike): the two medians
wall_medians() {
  : >"$tmp/a"; : >"$tmp/b"
  for ((r = 0; r < runs; r++)); do
    wall "$1" >>"$tmp/a"
    wall "$2" >>"$tmp/b"
  done
  echo "$(median <"$tmp/a") $(median <"$tmp/b")"
}

model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
mhz=$(grep -m1 'cpu MHz' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "machine: $(nproc) cores, ${model:-unknown CPU} at ${mhz:-?} MHz, $(date -u '+%F %H:%M') UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "(the prediction is the median of three, each on a profile measured afresh before"
echo " or after the timed runs: a shared machine's load drifts)"
echo
echo "| program | plan | predicted | measured | measured / predicted |"
echo "|---|---|---|---|---|"
# the predicted seconds of the case's plan on a profile measured now
predict() {
  "$shmap" --calibrate >"$tmp/me.yaml"
  run_with 1
  local total
  total=$(env "${extra[@]}" "$shmap" --estimate "$tmp/me.yaml" "$here/$prog" "${argv[@]}" 2>&1 >/dev/null |
    awk -v p="$plan" '/^predicted step time of / { on = ($5 == p) } on && /^total: / { print $2, $3; exit }')
  [ -n "$total" ] || { echo "no estimate of $plan in $prog" >&2; exit 1; }
  seconds $total
}

while IFS='|' read -r prog plan var envs k1 k2 args; do
  p1=$(predict)
  wall "$k1" >/dev/null   # a warm-up run, not counted
  read -r a b <<<"$(wall_medians "$k1" "$k2")"
  p2=$(predict)
  p3=$(predict)
  pred=$(printf '%s\n' "$p1" "$p2" "$p3" | sort -g | sed -n 2p)
  awk -v prog="$prog" -v plan="$plan" -v envs="$envs${args:+${envs:+ }argv ${args//\{K\}/K}}" -v p="$pred" -v a="$a" -v b="$b" -v n=$((k2 - k1)) '
    function show(t) { return t >= 1e-3 ? sprintf("%.3g ms", t * 1e3) : sprintf("%.3g us", t * 1e6) }
    BEGIN { m = (b - a) / n; name = envs == "" ? plan : plan " (" envs ")"
            printf "| `%s` | %s | %s | %s | %.2f |\n", prog, name, show(p), show(m), m / p }'
done <<<"$cases"
