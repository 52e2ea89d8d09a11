#!/bin/bash
# tests/cli/jit_cache_memory.sh SHMAP - the jit signature cache is bounded:
# 3000 new shapes through one jit function keep at most jit.cache_size
# plans (tens of KiB each), so the peak memory stays near a program's
# baseline instead of growing by ~100 MB as it did without a bound.  (Under
# AddressSanitizer its quarantine, which would keep freed plans, is off.)
set -u
shmap=${1:?usage: jit_cache_memory.sh SHMAP}
command -v python3 >/dev/null || { echo "python3 is not installed: jit cache test skipped"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cat >"$dir/prog.shm" <<'SHM'
f = jit(lambda x: (x * 2. + 1.).sum())
t = 0.
for n in range(1, 3000):
    t = t + f(ones(n))
print(t)
SHM
printf 'jit:\n  cache_size: 4\n' >"$dir/small.yaml"
printf 'jit:\n  cache_size: 100000\n' >"$dir/big.yaml"
python3 - "$shmap" "$dir" <<'PY'
import resource, subprocess, sys, os
shmap, d = sys.argv[1], sys.argv[2]
def peak(cfg):
    # each run in its own child of a fresh python, so ru_maxrss is its own
    code = ("import resource, subprocess, sys; "
            "out = subprocess.run(sys.argv[1:], capture_output=True, text=True, "
            "env={'SHMAP_CONFIG': %r, 'ASAN_OPTIONS': 'quarantine_size_mb=0:detect_leaks=0'}); "
            "print(out.stdout.strip(), resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)") % cfg
    r = subprocess.run([sys.executable, "-c", code, shmap, os.path.join(d, "prog.shm"), cfg],
                       capture_output=True, text=True, check=True)
    value, kb = r.stdout.split()
    return value, int(kb)
small, big = peak(os.path.join(d, "small.yaml")), peak(os.path.join(d, "big.yaml"))
assert small[0] == big[0] == "13495500.0", (small, big)
assert big[1] - small[1] > 40000, ("the unbounded cache should hold tens of MB more", small, big)
PY
