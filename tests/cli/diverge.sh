#!/bin/bash
# tests/cli/diverge.sh SHMAP - random programs whose devices diverge in
# their collectives (fixed seed): each must end within seconds, threaded
# and in reference mode (SHMAP_REFERENCE=1, a separate implementation of
# every collective), and the two must agree: both succeed with the same
# output, or both fail with a located error (the wording of a mismatch may
# differ: which device notices first is a race).  Never a hang, a crash or
# a wrong number.  DIVERGE_PROGRAMS sets the count (default 300);
# DIVERGE_KEEP=1 keeps the programs and their outputs.
set -u
shmap=${1:?usage: diverge.sh SHMAP}
scale=${SHMAP_TEST_SCALE:-1}   # time limits grow in sanitizer builds (run-tests.sh)
command -v python3 >/dev/null || { echo "python3 is not installed: divergence test skipped"; exit 77; }
dir=$(mktemp -d)
[ -n "${DIVERGE_KEEP:-}" ] && echo "programs kept in $dir" || trap 'rm -rf "$dir"' EXIT
python3 - "$dir" "${DIVERGE_PROGRAMS:-300}" <<'PY'
import random, sys
out, count = sys.argv[1], int(sys.argv[2])
rng = random.Random(20261124)
axes = ["'i'", "'j'", "('i', 'j')"]
def coll(var):
    k = rng.randrange(6)
    ax = rng.choice(axes)
    if k == 0: return f"{var} = psum({var}, {ax})"
    if k == 1: return f"{var} = pmax({var}, {ax})"
    if k == 2: return f"{var} = pmean({var}, {ax})"
    if k == 3: return f"{var} = all_gather({var}, 'j', tiled=True)[:2]"
    if k == 4: return f"{var} = ppermute({var}, 'i', [(0, 1), (1, 0)])"
    return f"{var} = {var} * 2. + 1."
def cond():
    return rng.choice(["i == 0", "j == 1", "i == j", "i + j == 1", "True", "False"])
for n in range(count):
    lines = ["mesh m(i=2, j=2)", "x = arange(16.).reshape(4, 4)",
             "shard_map f(b: P('i', 'j')) -> P('i', 'j') on m, check_rep=False:",
             "    i = axis_index('i')", "    j = axis_index('j')", "    y = b"]
    for _ in range(rng.randrange(1, 5)):
        if rng.random() < 0.5:
            lines.append(f"    if {cond()}:")
            for _ in range(rng.randrange(1, 3)): lines.append("        " + coll("y"))
            if rng.random() < 0.5:
                lines.append("    else:")
                lines.append("        " + coll("y"))
        elif rng.random() < 0.5:
            lines.append(f"    for k in range({rng.randrange(1, 12)} if {cond()} else {rng.randrange(1, 12)}):")
            lines.append("        " + coll("y"))
        elif rng.random() < 0.4:   # slow local work on some devices: lets peers run ahead
            lines.append(f"    if {cond()}:")
            lines.append(f"        for k in range({rng.choice([2000, 20000])}):")
            lines.append("            y = y + 0.")
        else:
            lines.append("    " + coll("y"))
    lines += ["    return y", "print(f(x))"]
    open(f"{out}/p{n:03d}.shm", "w").write("\n".join(lines) + "\n")
PY
fail=0
for p in "$dir"/p*.shm; do
  timeout $((20 * scale)) "$shmap" "$p" >"$p.out" 2>"$p.err"; a=$?
  SHMAP_REFERENCE=1 timeout $((20 * scale)) "$shmap" "$p" >"$p.ref" 2>"$p.referr"; b=$?
  bad=""
  if [ $a -gt 1 ] || [ $b -gt 1 ]; then bad="exit statuses $a (threaded) and $b (reference): a hang or a crash"
  elif [ $a -ne $b ]; then bad="threaded exit $a, reference exit $b"
  elif [ $a -eq 0 ] && ! cmp -s "$p.out" "$p.ref"; then bad="threaded and reference outputs differ"
  elif [ $a -eq 1 ] && ! grep -v '^Traceback (most recent call last):$\|^  ' "$p.err" | head -n 1 | grep -qE '^[^:]+:[0-9]+:[0-9]+: error: '; then bad="an error without a location"
  fi
  if [ -n "$bad" ]; then
    echo "FAIL $(basename "$p"): $bad"; sed 's/^/    /' "$p"; head -n 3 "$p.err" "$p.referr" | sed 's/^/    /'
    fail=$((fail + 1))
  fi
done
[ $fail -eq 0 ]
