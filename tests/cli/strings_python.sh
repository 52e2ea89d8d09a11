#!/bin/bash
# tests/cli/strings_python.sh SHMAP - str against Python itself: several
# hundred random calls of the methods of str (splitlines over line
# boundaries too), indexing, slices, format widths and printf-style
# formatting (`fmt % values`) on short strings mixing ASCII, 'é', 'ß', '日', an emoji, white
# space beyond ASCII ('\u3000') and a non-ASCII digit ('٣'), made with a
# fixed seed and printed with repr() by shmap and by python3; the outputs
# must be the same line for line, the type of each error included.  Where
# the manual says shmap's case mapping differs from Python's, the strings
# hold none of those characters.  Skipped without python3.
set -u
shmap=${1:?usage: strings_python.sh SHMAP}
command -v python3 >/dev/null || { echo "skipped: python3 is not installed"; exit 77; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
python3 - "$dir" <<'PY'
import random, sys
d = sys.argv[1]
rng = random.Random(20261201)
alpha = ['a', 'b', ' ', 'é', '日', '😀', '\u3000', 'ß', 'A', 'É', '-', '\t', '1', '٣']
def text(k=None):
    k = rng.randint(0, 8) if k is None else k
    return ''.join(rng.choice(alpha) for _ in range(k))
def num():
    return rng.choice([None, -10, -3, -1, 0, 1, 2, 5, 20])
def call():
    s, t = text(), text(rng.randint(0, 2))
    m = rng.choice(['find', 'rfind', 'count', 'startswith', 'endswith', 'index', 'rindex', 'split',
                    'replace', 'strip', 'lstrip', 'rstrip', 'center', 'ljust', 'rjust', 'zfill',
                    'partition', 'rpartition', 'upper', 'lower', 'title', 'capitalize', 'swapcase',
                    'isalpha', 'isdigit', 'isspace', 'isupper', 'islower', 'isalnum', 'slice',
                    'item', 'format', 'in', 'order', 'splitlines', 'percent', 'percent'])
    if m == 'percent':
        return percent()
    if m == 'splitlines':
        lines = ''.join(rng.choice(['a', '\n', '\r', 'é', '\x0b', '\x0c', '\x1e', ' ']) for _ in range(rng.randint(0, 8)))
        return '%r.splitlines(%s)' % (lines, rng.choice(['', 'True', 'keepends=False']))
    if m in ('find', 'rfind', 'count', 'startswith', 'endswith', 'index', 'rindex'):
        a, b = num(), num()
        args = [repr(t)] + ([repr(a)] + ([repr(b)] if b is not None else []) if a is not None or b is not None else [])
        return '%r.%s(%s)' % (s, m, ', '.join(args))
    if m == 'split':
        sep = repr(t or 'a')
        return '%r.split(%s)' % (s, rng.choice(['', 'None, 1', sep, sep + ', ' + str(rng.randint(-1, 2))]))
    if m == 'replace':
        return '%r.replace(%r, %r%s)' % (s, t, text(1), rng.choice(['', ', 1', ', -1', ', 0']))
    if m in ('strip', 'lstrip', 'rstrip'):
        return '%r.%s(%s)' % (s, m, rng.choice(['', repr(t)]))
    if m in ('center', 'ljust', 'rjust'):
        return '%r.%s(%d%s)' % (s, m, rng.randint(-1, 12), rng.choice(['', ', ' + repr(rng.choice(alpha))]))
    if m == 'zfill':
        return '%r.zfill(%d)' % (s, rng.randint(-1, 10))
    if m in ('partition', 'rpartition'):
        return '%r.%s(%r)' % (s, m, t or 'a')
    if m == 'slice':
        parts = [num(), num(), rng.choice([None, 1, 2, -1, -2, 3])]
        return '%r[%s]' % (s, ':'.join('' if x is None else str(x) for x in parts))
    if m == 'item':
        return '%r[%d]' % (s, rng.randint(-9, 8))
    if m == 'format':
        spec = rng.choice(['', '*', '日']) + rng.choice('<>^') + str(rng.randint(0, 10)) + rng.choice(['', '.2', '.0'])
        return "'{:%s}'.format(%r)" % (spec, s)
    if m == 'in':
        return '%r in %r' % (t, s)
    return '(%r < %r, %r == %r)' % (s, t, s, t)
def percent():
    # one to three printf-style specifications with random flags, widths,
    # precisions (some from '*') and types, each given a value it takes
    # or one it refuses
    specs, vals = [], []
    for _ in range(rng.randint(1, 3)):
        t = rng.choice('diouxXeEfFgGcsra%')
        spec = '%' + ''.join(rng.sample('-+ #0', rng.randint(0, 3)))
        if rng.random() < 0.15:
            spec += '*'
            vals.append(repr(rng.randint(-8, 8)))
        elif rng.random() < 0.6:
            spec += str(rng.randint(0, 12))
        if rng.random() < 0.15:
            spec += '.*'
            vals.append(repr(rng.randint(0, 6)))
        elif rng.random() < 0.5:
            spec += '.' + str(rng.randint(0, 8))
        specs.append(text(rng.randint(0, 2)) + spec + t)
        if t == '%':
            continue
        ints = [0, 7, -42, 255, 10 ** 9, True]
        floats = [0.0, -0.0, 1.5, -2.675, 1e-7, 123456789.25, float('inf'), float('-inf'), float('nan')]
        pool = {'c': [65, 233, 128512, 'é', '日'], 's': ints + floats + [text(), None, (1, 'a')],
                'r': [text(), 3, None], 'a': [text(), 'é']}.get(t, ints + floats)
        if rng.random() < 0.08:
            pool = [text(1), None, 3.5]
        v = rng.choice(pool)
        vals.append("float('%r')" % v if isinstance(v, float) and v != v or v in (float('inf'), float('-inf')) else repr(v))
    args = vals[0] if len(vals) == 1 and rng.random() < 0.5 else '(' + ''.join(v + ', ' for v in vals) + ')'
    return '%r %% %s' % (''.join(specs), args)
lines = ''.join("try:\n    print(repr(%s))\nexcept (ValueError, IndexError, TypeError, OverflowError) as e:\n"
                "    print(type(e).__name__)\n" % call() for _ in range(500))
open(d + "/p.py", "w").write(lines)
open(d + "/p.shm", "w").write(lines)
PY
python3 "$dir/p.py" >"$dir/py.out" 2>&1 || { echo "python3 failed:"; cat "$dir/py.out"; exit 1; }
"$shmap" "$dir/p.shm" >"$dir/shm.out" 2>&1 || { echo "shmap failed:"; tail -5 "$dir/shm.out"; exit 1; }
if ! diff "$dir/py.out" "$dir/shm.out" >"$dir/diff"; then
  echo "shmap and python3 differ (< python3, > shmap):"
  head -20 "$dir/diff"
  exit 1
fi
echo "$(wc -l <"$dir/py.out") expressions agree"
