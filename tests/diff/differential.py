#!/usr/bin/env python3
"""Differential test: generated shard_map programs run four ways must agree.

Usage: differential.py SHMAP [--programs N] [--seed S] [--per-file K]
                       [--no-mpi] [--keep DIR]

Each generated case is one shard_map body over a 2 x 2 mesh, built from
element-wise chains (unary functions, arithmetic with constants and with
earlier values, row reductions broadcast back), collectives (psum, pmax,
pmin, pmean, all_gather tiled or not and then element-wise work on the
gathered array before it is cut back, ppermute, all_to_all, axis_index),
fori_loops, while_loops, scans, conds and switches whose bodies hold
collectives, psum_scatter, and vmap over the block's rows.  Every case is
called eagerly and as `jit shard_map`, a third of them are also batched by
vmap outside the shard_map, eagerly and under jax.jit, and a quarter
differentiated by jax.grad, eagerly and under jax.jit.
A file of cases then runs as a whole in three ways: threaded, in reference
mode (SHMAP_REFERENCE=1: devices one at a time, every collective a plain
loop) and under `mpirun -np 2` (two devices a process).  Every case must
give the same numbers (to float32 rounding) in all of them, or the same
exception class.

The generator tracks which mesh axes each value varies over and applies a
collective over an axis only to a value that varies over it, and keeps a
loop's carry varying over the same axes on entry and exit, so every
program is valid under JAX's typing whatever shmap's rules for the corner
cases; out_specs always name both axes.

Prints one line per disagreement (with the case's program) and closes with
"differential: N programs, M disagree"; exit status 1 when any disagree.
"""
import argparse
import os
import random
import re
import subprocess
import sys
import tempfile

AXES = {"i": 2, "j": 2}
AXIS_CHOICES = ["'i'", "'j'", "('i', 'j')"]
UNARY = ["sin({})", "tanh({})", "cos({})", "exp(-{0} * {0})", "abs({})",
         "maximum({}, 0.)", "where({0} > 0., {0}, {0} * -0.5)", "{0} * {0}",
         "sqrt(abs({}) + 1.)"]


def axes_of(choice):
    """The axis names of an AXIS_CHOICES entry."""
    return re.findall(r"'(\w)'", choice)


class Body:
    """One shard_map body being generated: its lines and the variables,
    each with its block shape (rows, cols) and the axes it varies over."""

    def __init__(self, rng, rows, cols):
        self.rng, self.rows, self.cols = rng, rows, cols
        self.lines = []
        self.vars = {"t": {"i", "j"}}
        self.n = 0

    def fresh(self):
        self.n += 1
        return f"v{self.n}"

    def pick(self):
        return self.rng.choice(sorted(self.vars))

    def varying_choice(self, vma):
        """A collective's axes among those [vma] varies over, or None."""
        ok = [c for c in AXIS_CHOICES if set(axes_of(c)) <= vma]
        return self.rng.choice(ok) if ok else None

    def emit(self, expr, vma):
        v = self.fresh()
        self.lines.append(f"    {v} = {expr}")
        self.vars[v] = vma
        return v


def chain(rng, x, depth):
    """An element-wise chain of [depth] steps on the expression [x]."""
    for _ in range(depth):
        k = rng.randrange(3)
        if k == 0:
            x = rng.choice(UNARY).format(x)
        elif k == 1:
            x = f"({x} * {rng.choice(['0.5', '1.5', '-0.75', '2.'])} + {rng.choice(['1.', '-0.25', '0.5'])})"
        else:
            x = f"tanh({x} * {rng.choice(['0.5', '1.25', '3.'])})"
    return x


def collective(b, v, vma, in_loop=False, row=False):
    """A collective applied to variable [v], of the block's shape or, with
    [row], one of its rows; returns (expr, vma) or None.  Every result has
    the shape of [v] again."""
    rng = b.rng
    ax = b.varying_choice(vma)
    if ax is None:
        return None
    names = set(axes_of(ax))
    n = 1
    for a in names:
        n *= AXES[a]
    kinds = ["psum", "pmax", "pmin", "pmean", "gather_tiled", "gather", "ppermute", "all_to_all",
             "psum_scatter"]
    if in_loop:
        kinds = ["psum", "pmax", "pmean", "gather_tiled", "gather"]
    k = rng.choice(kinds)
    rest = vma - names
    if k in ("psum", "pmax", "pmin", "pmean"):
        return f"{k}({v}, {ax})", rest
    if k == "gather_tiled":
        g = chain(rng, f"all_gather({v}, {ax}, tiled=True)", rng.randrange(1, 4))
        lead, shape = (b.cols, f"{b.cols}") if row else (b.rows, f"{b.rows}, {b.cols}")
        cut = rng.choice([f"[:{lead}]", f"[{lead * (n - 1)}:]",
                          f".reshape({n}, {shape}).sum(0) * {1.0 / n}"])
        return f"({g}){cut}", vma
    if k == "gather":
        g = chain(rng, f"all_gather({v}, {ax})", rng.randrange(1, 4))
        return f"({g}).{rng.choice(['mean', 'max', 'min'])}(0)", vma
    if k == "ppermute":
        a = rng.choice(sorted(names))
        return f"ppermute({v}, '{a}', [(0, 1), (1, 0)])", vma
    if k == "all_to_all" and b.cols % 2 == 0 and len(names) == 1:
        return f"all_to_all({v}, {ax}, 1, 1, tiled=True)", vma
    if k == "psum_scatter" and b.cols % n == 0 and not row:
        s = chain(rng, f"psum_scatter({v}, {ax}, scatter_dimension=1, tiled=True)", rng.randrange(0, 3))
        return f"all_gather({s}, {ax}, axis=1, tiled=True)", vma
    return f"psum({v}, {ax})", rest


def collective_chain(b, name, vma, high, low=0, row=False):
    """A loop-safe collective on [name] (when one fits its axes), then an
    element-wise chain of [low, high) steps."""
    c = collective(b, name, vma, in_loop=True, row=row)
    return chain(b.rng, c[0] if c else name, b.rng.randrange(low, high))


def loop(b, v, vma):
    """A fori_loop whose carry starts at [v]: its body keeps the carry
    varying over the same axes (a collective's result joined with the
    carry itself)."""
    rng = b.rng
    inner = collective_chain(b, "c", vma, 3)
    steps = rng.randrange(1, 5)
    return f"fori_loop(0, {steps}, lambda k, c: {inner} * 0.5 + c * 0.25, {v})", vma


def branch(b, v, vma):
    """lax.cond or lax.switch on a predicate that is the same on every
    device or varies over an axis; branches hold collectives."""
    rng = b.rng
    preds = [(f"psum({v}.sum(), ('i', 'j')) > 0.", set()) if vma >= {"i", "j"} else ("True", set()),
             ("axis_index('i') == 0", {"i"}), (f"{v}.sum() > 0.", set(vma))]
    pred, pv = rng.choice(preds)
    def arm(same):
        # devices that take different arms must not reach collectives
        c = collective(b, "a", vma, in_loop=True) if same else None
        return chain(rng, c[0] if c else "a", rng.randrange(0, 3))
    if rng.random() < 0.7:
        same = not pv and "sum() > 0." not in pred or pred.startswith("psum")
        return f"lax.cond({pred}, lambda a: {arm(same)}, lambda a: {arm(same)}, {v})", vma | pv
    if rng.random() < 0.5:
        idx, same, iv = "axis_index('j')", False, {"j"}
    else:
        idx, same, iv = f"(psum(({v}.sum() > 0.) * 1, ('i', 'j')) % 3)", vma >= {"i", "j"}, set()
        if not same:
            idx = f"({v}.sum() > 0.) * 1"
            iv = set(vma)
    return (f"lax.switch({idx}, [lambda a: {arm(same)}, lambda a: {arm(same)}, lambda a: {arm(same)}], {v})",
            vma | iv)


def while_(b, v, vma):
    """lax.while_loop counting to a trip count the data decides (the same
    on every device: a psum over both axes)."""
    rng = b.rng
    if not vma >= {"i", "j"}:
        return loop(b, v, vma)
    inner = collective_chain(b, "c[1]", vma, 2)
    n = f"(psum(({v} > 0.).sum(), ('i', 'j')) % 4)"
    return (f"lax.while_loop(lambda c: c[0] < {n}, lambda c: (c[0] + 1, {inner} * 0.5 + c[1] * 0.25), (0, {v}))[1]",
            vma)


def scan(b, v, vma):
    """lax.scan over the block's rows, carrying a row."""
    rng = b.rng
    inner = collective_chain(b, "c", vma, 2, row=True)
    return (f"(lambda cy: cy[0][None, :] * 0.5 + cy[1])(lax.scan(lambda c, r: ({inner} * 0.5 + r * 0.25, tanh(c + r)), {v}[0], {v}))",
            vma)


def vmapped(b, v, vma):
    """vmap over the block's rows of a chain holding a collective."""
    rng = b.rng
    inner = collective_chain(b, "r", vma, 3, low=1, row=True)
    return f"jax.vmap(lambda r: {inner})({v})", vma


def statement(b):
    rng = b.rng
    v = b.pick()
    vma = b.vars[v]
    k = rng.randrange(13)
    if k == 10:
        return b.emit(*branch(b, v, vma))
    if k == 11:
        return b.emit(*while_(b, v, vma))
    if k == 12:
        return b.emit(*scan(b, v, vma))
    if k < 3:
        return b.emit(chain(rng, v, rng.randrange(1, 4)), vma)
    if k == 3:
        w = b.pick()
        op = rng.choice(["+", "*", "-"])
        return b.emit(f"tanh({v} {op} {w})", vma | b.vars[w])
    if k == 4:
        return b.emit(f"{v} - {v}.{rng.choice(['mean', 'max', 'sum'])}(axis={rng.randrange(2)}, keepdims=True) * 0.5", vma)
    if k == 5:
        a = rng.choice(["i", "j"])
        return b.emit(f"{v} + axis_index('{a}') * 0.25", vma | {a})
    if k == 6:
        r = loop(b, v, vma)
        return b.emit(*r)
    if k == 7:
        r = vmapped(b, v, vma)
        return b.emit(*r)
    r = collective(b, v, vma)
    if r is None:
        return b.emit(chain(rng, v, 2), vma)
    return b.emit(*r)


def case(rng, k):
    """The text of case [k] and whether it is batched by vmap too."""
    rows, cols = rng.choice([(1, 1), (2, 3), (1, 8), (4, 2), (2, 48), (8, 40), (3, 16)])
    b = Body(rng, rows, cols)
    for _ in range(rng.randrange(2, 8)):
        statement(b)
    outs = sorted(b.vars)[-2:] if rng.random() < 0.3 else [f"v{b.n}"]
    ret = ", ".join(outs)
    spec = "P('i', 'j')"
    specs = spec if len(outs) == 1 else "(" + ", ".join([spec] * len(outs)) + ")"
    head = f"(t: P('i', 'j')) -> {specs} on m:"
    body = "\n".join(b.lines) + f"\n    return {ret}\n"
    batched = rng.random() < 0.33
    text = [f"# case {k}",
            f"def body_{k}(t):", body.rstrip("\n"),
            f"shard_map e_{k}{head}", f"    return body_{k}(t)",
            f"jit shard_map j_{k}{head}", f"    return body_{k}(t)",
            f"x_{k} = jax.random.uniform(jax.random.PRNGKey({k}), ({2 * rows}, {2 * cols}), minval=-1., maxval=1.)",
            f"show({k}, 'eager', lambda: e_{k}(x_{k}))",
            f"show({k}, 'jit', lambda: j_{k}(x_{k}))",
            f"show({k}, 'jit again', lambda: j_{k}(x_{k}))"]
    if batched:
        text += [f"xb_{k} = jax.random.uniform(jax.random.PRNGKey({k + 100000}), (2, {2 * rows}, {2 * cols}), minval=-1., maxval=1.)",
                 f"show({k}, 'vmap', lambda: jax.vmap(e_{k})(xb_{k}))",
                 f"show({k}, 'jit vmap', lambda: jax.jit(jax.vmap(e_{k}))(xb_{k}))"]
    if rng.random() < 0.25:
        loss = f"lambda z: (lambda r: sum([(a * a).sum() for a in (r if isinstance(r, tuple) else (r,))]))"
        text += [f"show({k}, 'grad', lambda: jax.grad({loss}(e_{k}(z)))(x_{k}))",
                 f"show({k}, 'jit grad', lambda: jax.jit(jax.grad({loss}(j_{k}(z))))(x_{k}))"]
    return "\n".join(text) + "\n"


PRELUDE = """mesh m(i=2, j=2)
def show(k, mode, thunk):
    try:
        r = thunk()
        if not isinstance(r, tuple):
            r = (r,)
        vals = []
        for a in r:
            vals += [float(v) for v in a.ravel()]
        print('R', k, mode.replace(' ', '_'), *vals)
    except Exception as ex:
        print('E', k, mode.replace(' ', '_'), type(ex).__name__)
"""


def generate(seed, count, per_file, outdir):
    rng = random.Random(seed)
    files, texts = [], {}
    for start in range(0, count, per_file):
        parts = [PRELUDE]
        for k in range(start, min(count, start + per_file)):
            texts[k] = case(rng, k)
            parts.append(texts[k])
        path = os.path.join(outdir, f"diff_{start // per_file:04d}.shm")
        with open(path, "w") as f:
            f.write("\n".join(parts))
        files.append(path)
    return files, texts


def run(cmd, env, timeout):
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return None, "", "timed out"


def parse(out):
    """{(case, mode): ('R', values) or ('E', name)} from a run's output."""
    res = {}
    for line in out.splitlines():
        w = line.split()
        if len(w) >= 3 and w[0] in ("R", "E") and w[1].isdigit():
            res[(int(w[1]), w[2])] = (w[0], w[3:] if w[0] == "R" else w[3])
    return res


def close(a, b):
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        x, y = float(x), float(y)
        if x != x and y != y:
            continue
        if x == y:
            continue
        if not abs(x - y) <= 1e-4 + 1e-4 * abs(y):
            return False
    return True


def same(r, s):
    if r[0] != s[0]:
        return False
    return close(r[1], s[1]) if r[0] == "R" else r[1] == s[1]


def brief(r):
    if r is None:
        return "(no result)"
    if r[0] == "E":
        return r[1]
    v = r[1]
    return " ".join(v[:6]) + (" ..." if len(v) > 6 else "")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shmap")
    ap.add_argument("--programs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--per-file", type=int, default=25)
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument("--keep")
    ap.add_argument("--timeout", type=float, default=120)
    a = ap.parse_args()
    outdir = a.keep or tempfile.mkdtemp(prefix="shmap-diff-")
    os.makedirs(outdir, exist_ok=True)
    files, texts = generate(a.seed, a.programs, a.per_file, outdir)
    base = dict(os.environ)
    base.pop("SHMAP_REFERENCE", None)
    ways = [("threaded", [a.shmap], base),
            ("reference", [a.shmap], dict(base, SHMAP_REFERENCE="1"))]
    if not a.no_mpi:
        mpi = dict(base, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1")
        ways.append(("mpirun -np 2", ["mpirun", "-np", "2", a.shmap], mpi))
    bad, failed_runs = 0, []
    for path in files:
        results = {}
        for name, cmd, env in ways:
            rc, out, err = run(cmd + [path], env, a.timeout)
            if rc != 0:
                failed_runs.append(f"{name} {os.path.basename(path)}: exit {rc}: {err.strip()[-600:]}")
            results[name] = parse(out)
        keys = sorted({k for r in results.values() for k in r})
        ref = results["threaded"]
        for key in keys:
            want = ref.get((key[0], next((m for m in ("vmap", "grad") if m in key[1]), "eager")))
            for name, _, _ in ways:
                got = results[name].get(key)
                if want is not None and got is not None and same(got, want):
                    continue
                bad += 1
                print(f"DISAGREE case {key[0]}, {key[1]} ({name}): {brief(got)}  vs threaded eager: {brief(want)}")
                print("  " + texts[key[0]].replace("\n", "\n  "))
                break
    for f in failed_runs:
        print("FAILED RUN " + f)
    if not a.keep:
        for f in files:
            os.remove(f)
        os.rmdir(outdir)
    print(f"differential: {a.programs} programs, {bad} disagree, {len(failed_runs)} runs failed")
    return 1 if bad or failed_runs else 0


if __name__ == "__main__":
    sys.exit(main())
