#!/bin/bash
# tests/cli/aot_comm_bytes.sh SHMAP - the bytes cost_analysis predicts for
# each collective (its operand on every device of the group, per call)
# equal what `--comm-stats` measures running the same jit shard_map, line
# by line, at 2, 4 and 8 devices; `--estimate` prints a prediction for
# the plan and `--calibrate` a profile it accepts.  Exit 0 when all hold.
set -u
shmap=${1:?usage: aot_comm_bytes.sh SHMAP}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

cat >"$dir/prog.shm" <<'SHM'
n = len(devices())
mesh m(x=n)
def body(v):
    a = psum(v, 'x')
    b = all_gather(v, 'x', tiled=True)
    c = psum_scatter(v, 'x', tiled=True)
    d = all_to_all(v, 'x', 0, 0, tiled=True)
    e = ppermute(v, 'x', [(i, (i + 1) % n) for i in range(n)])
    return a, b, c, d, e
f = jax.jit(shard_map(body, mesh=m, in_specs=P('x'), out_specs=(P(), P(), P('x'), P('x'), P('x'))))
x = arange(n * n * 1.)
f(x)
f(x)
for k in f.lower(jax.ShapeDtypeStruct(x.shape, x.dtype)).cost_analysis()['collectives']:
    # two calls, each device of the group sends its operand
    print(k['line'], k['kind'], int(2 * k['count'] * k['operand_bytes'] * n))
SHM

for n in 2 4 8; do
  out=$("$shmap" --devices "$n" --comm-stats "$dir/prog.shm" 2>"$dir/err") || {
    echo "shmap failed at $n devices:"; cat "$dir/err"; exit 1; }
  while read -r line kind bytes; do
    grep -Eq "^ +$line  $kind +'x' +2 +$bytes B " "$dir/err" || {
      echo "at $n devices, line $line: predicted $kind of $bytes B, measured:"; cat "$dir/err"; exit 1; }
  done <<<"$out"
  [ "$(wc -l <<<"$out")" -eq 5 ] || { echo "expected 5 collectives, got: $out"; exit 1; }
done

"$shmap" --calibrate >"$dir/me.yaml" 2>"$dir/err" || { echo "--calibrate failed:"; cat "$dir/err"; exit 1; }
grep -q "^  float32: " "$dir/me.yaml" && grep -q "^    topology: ring" "$dir/me.yaml" || {
  echo "--calibrate printed:"; cat "$dir/me.yaml"; exit 1; }
"$shmap" --estimate "$dir/me.yaml" "$dir/prog.shm" >/dev/null 2>"$dir/err" || {
  echo "--estimate failed:"; cat "$dir/err"; exit 1; }
grep -q "^predicted step time of body on this machine (8 device threads), per device of 8:" "$dir/err" &&
  grep -q "^total: .* (bound: " "$dir/err" || { echo "--estimate printed:"; cat "$dir/err"; exit 1; }
"$shmap" --estimate "$dir/none.yaml" "$dir/prog.shm" >/dev/null 2>"$dir/err" && {
  echo "--estimate with a missing profile succeeded"; exit 1; }
grep -q "^shmap: --estimate: estimate: cannot open profile" "$dir/err" || {
  echo "--estimate with a missing profile printed:"; cat "$dir/err"; exit 1; }
exit 0
