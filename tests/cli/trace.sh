#!/bin/bash
# tests/cli/trace.sh SHMAP - `shmap --trace FILE` writes a timeline that
# loads as Trace Event Format JSON with one track per device, and
# `--comm-stats` prints the communication table.  Exit 0 when all hold.
set -u
shmap=${1:?usage: trace.sh SHMAP}
command -v python3 >/dev/null || { echo "python3 is not installed: trace test skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

cat >"$dir/prog.shm" <<'SHM'
mesh m(i=4, j=2)
a = arange(8 * 16.).reshape(8, 16)
b = arange(16 * 32.).reshape(16, 32)

shard_map matmul_basic(a_block: P('i', 'j'), b_block: P('j', None)) -> P('i', None) on m:
    z = a_block @ b_block
    return psum(z, 'j')

c = matmul_basic(a, b)
jit def f(x):
    return sum(x * 2. + 1.)
print(allclose(c, a @ b), f(ones(10000)))
SHM

out=$("$shmap" --trace "$dir/t.json" --comm-stats "$dir/prog.shm" 2>"$dir/err") || {
  echo "shmap failed:"; cat "$dir/err"; exit 1; }
[ "$out" = "True 30000.0" ] || { echo "unexpected output: $out"; exit 1; }

python3 - "$dir/t.json" <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"]
names = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M"}
assert names[0] == "main" and all(names[1 + k] == "device %d" % k for k in range(8)), names
x = [e for e in ev if e["ph"] == "X"]
assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in x)
def on(cat, pred=lambda e: True):
    return sorted({e["tid"] for e in x if e["cat"] == cat and pred(e)})
devices = list(range(1, 9))
assert on("statement", lambda e: e["name"] == "6: z = a_block @ b_block") == devices
assert on("primitive", lambda e: e["name"] == "dot_general" and e["args"]["result"] == "f32[2,32]") == devices
coll = [e for e in x if e["cat"] == "collective"]
assert len(coll) == 8 and all(e["name"] == "psum" and e["args"] == {"axes": "'j'", "line": "7"} for e in coll), coll
waits = [e for e in x if e["cat"] == "wait"]
assert len(waits) == 8 and all(w["args"]["waited for"] == "nobody" or w["args"]["waited for"].startswith("(i=") for w in waits)
# a collective lies inside its statement on the same track
for c in coll:
    st = [e for e in x if e["tid"] == c["tid"] and e["cat"] == "statement" and e["name"].startswith("7:")]
    assert st and st[0]["ts"] <= c["ts"] + 1e-3 and c["ts"] + c["dur"] <= st[0]["ts"] + st[0]["dur"] + 1e-3, (c, st)
assert on("primitive", lambda e: e["name"] == "fused loop") == [0], "jit's fused loop on the main track"
assert d["otherData"]["dropped_events"] == 0
PY

grep -Eq "^ +7  psum +'j' +1 +2.0 KiB " "$dir/err" || { echo "no psum row in --comm-stats:"; cat "$dir/err"; exit 1; }

# a jit shard_map's collectives carry the body's line too (not line 0)
cat >"$dir/jit.shm" <<'SHM'
mesh m(i=2)
def body(x):
    y = psum(x, 'i')
    return y * 2.0
print(jit(shard_map(body, mesh=m, in_specs=P('i'), out_specs=P()))(ones(2)))
SHM
out=$("$shmap" --trace "$dir/j.json" --comm-stats "$dir/jit.shm" 2>"$dir/err3") || {
  echo "shmap failed:"; cat "$dir/err3"; exit 1; }
grep -Eq "^ +3  psum +'i' +1 " "$dir/err3" || { echo "jit psum not on line 3 in --comm-stats:"; cat "$dir/err3"; exit 1; }
python3 - "$dir/j.json" <<'PY' || exit 1
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
coll = [e for e in ev if e["ph"] == "X" and e["cat"] == "collective"]
assert len(coll) == 2 and all(e["args"]["line"] == "3" for e in coll), coll
PY

# an eager operation on a sharded array runs per device: the collectives
# its partitioning inserts are counted under its own line, and the values
# are jit's bit for bit
cat >"$dir/eager.shm" <<'SHM'
from jax.sharding import NamedSharding
x = jax.device_put(arange(64.).reshape(8, 8) / 7., NamedSharding(jax.make_mesh((4, 2), ('x', 'y'), axis_types=(jax.sharding.AxisType.Auto,) * 2), P('x', 'y')))
s = sum(x)
m = x @ x
print(s.sharding.spec, m.sharding.spec, bool(s == jit(sum)(x)), bool((m == jit(lambda a: a @ a)(x)).all()))
SHM
out=$("$shmap" --devices 8 --comm-stats "$dir/eager.shm" 2>"$dir/err4") || {
  echo "shmap failed:"; cat "$dir/err4"; exit 1; }
[ "$out" = "P() P('x', 'y') True True" ] || { echo "eager sharded: unexpected output: $out"; exit 1; }
grep -Eq "^ +3  psum +\('x', 'y'\) +1 " "$dir/err4" && grep -Eq "^ +4  all_gather +'y' +1 " "$dir/err4" || {
  echo "eager sharded operations' collectives not on their lines in --comm-stats:"; cat "$dir/err4"; exit 1; }

# an unwritable file is a clear error, exit status 1, after the program ran
out=$("$shmap" --trace "$dir/no/such/dir/t.json" -c 'print(1)' 2>"$dir/err2"); st=$?
[ $st -eq 1 ] && [ "$out" = 1 ] && grep -q "error: --trace: cannot write '$dir/no/such/dir/t.json'" "$dir/err2" || {
  echo "unwritable --trace file: status $st, output '$out':"; cat "$dir/err2"; exit 1; }
"$shmap" --trace 2>/dev/null; [ $? -eq 2 ] || { echo "--trace without a file is not a usage error"; exit 1; }
exit 0
