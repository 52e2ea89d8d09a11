#!/usr/bin/env python3
"""Differential test of Auto and Explicit modes: generated jax.numpy
programs on sharded jax.Arrays, run unsharded, eagerly and under jit.

Usage: partitioned.py SHMAP [--programs N] [--seed S] [--per-file K]
                      [--no-mpi] [--np P] [--keep DIR]

Each generated case is a function of 1-3 float32 arrays (dimensions from
{2, 4, 8}, deterministic values) over a mesh ('x', 'y') of 2 x 2 (half
the cases), 4 x 2 or 2 x 4 devices whose axes are all Auto or (a quarter
of the cases) all Explicit; each argument is
device_put with a random PartitionSpec that divides its shape (None, one
axis, or two axes on one dimension).  The body is a random chain of
jax.numpy and lax operations valid for the shapes the generator tracks:
element-wise functions, arithmetic with broadcasting, sum, max and mean
over an axis or all, transposes, reshapes that merge or split
dimensions, dot, matmul and einsum, slices, concatenation, cumsum,
jnp.where, flip, pad, stack, expand_dims and squeeze, broadcast_to,
flattening, gathers (x[idx]) and scatters (x.at[i].set/add/multiply),
sort, argsort, argmax, prod, cumprod, dynamic_slice, fori_loop,
while_loop, scan, cond, vmap over the rows, shard_map over the Auto
mesh (an element-wise body, psum, a tiled all_gather or psum_scatter,
ppermute, axis_index with pmax, two operands, or vmapped; its results
laid out by out_specs whatever its arguments'), and a sharding constraint to
a random spec (with_sharding_constraint over the Auto mesh,
jax.sharding.reshard over the Explicit one).  Every case runs
  ref        on the unsharded arrays, eagerly, its constraints left out;
  eager      on the sharded arrays, eagerly;
  jit        jax.jit of it on the sharded arrays;
  jitu       jax.jit of it on the unsharded arrays (constraints kept);
and a quarter of them jax.grad of sum(f) with respect to the first
argument the same four ways.  A file of cases then runs as a whole
threaded and under `mpirun -np 2 SHMAP --devices 8` (--np: 4 or 8) with
SHMAP_PARTIAL_MIN=1 (every sharded array holds only its process's
blocks).

shmap(7), THE THREE MODES, promises: eager and jit agree on values bit
for bit and on shardings (x.sharding.spec, or jax.typeof over Explicit
axes); values equal the unsharded computation's to float32 rounding; an
error is the same exception class eagerly and under jit (over Explicit
axes a sharding rule's ShardingTypeError, and then the unsharded run is
not compared).
The mpirun run must print what the threaded run prints
(values to float32 rounding, the same layouts and errors).

Prints one line per disagreement (with the case's program) and closes
with "partitioned: N programs, M disagree"; exit status 1 when any
disagree or a run fails.
"""
import argparse
import os
import random
import re
import subprocess
import sys
import tempfile

SIZES = [2, 4, 8]
AXES = {"x": 2, "y": 2}
DIM_SPECS = [None, "'x'", "'y'", "('x', 'y')", "('y', 'x')"]
UNARY = ["jnp.sin({})", "jnp.tanh({})", "jnp.cos({})", "jnp.exp(-{0} * {0})", "jnp.abs({})",
         "jnp.maximum({}, 0.)", "{0} * {0}", "jnp.sqrt(jnp.abs({}) + 1.)", "-{}"]
MAXDIM = 16


def spec_axes(s):
    return [] if s is None else [c for c in "xy" if f"'{c}'" in s]


def random_spec(rng, shape):
    """A PartitionSpec text for [shape] whose splits divide it, each mesh
    axis used once."""
    return spec_text(random_entries(rng, shape))


def spec_text(entries):
    return "P(" + ", ".join("None" if e is None else e for e in entries) + ")"


def entry_text(axes):
    return None if not axes else f"'{axes[0]}'" if len(axes) == 1 else \
        "(" + ", ".join(f"'{a}'" for a in axes) + ")"


def random_entries(rng, shape):
    """random_spec's entries: None or the text of one dimension's axes."""
    used, entries = set(), []
    for d in shape:
        opts = []
        for s in DIM_SPECS:
            ax = spec_axes(s)
            n = 1
            for a in ax:
                n *= AXES[a]
            if not set(ax) & used and d % n == 0:
                opts.append(s)
        s = rng.choice(opts) if rng.random() < 0.75 else None
        used |= set(spec_axes(s))
        entries.append(s)
    while entries and entries[-1] is None and rng.random() < 0.5:
        entries.pop()
    return entries


def bcast(s, t):
    """numpy's broadcast of shapes [s] and [t], or None."""
    r = []
    for i in range(1, max(len(s), len(t)) + 1):
        a = s[-i] if i <= len(s) else 1
        b = t[-i] if i <= len(t) else 1
        if a != b and a != 1 and b != 1:
            return None
        r.append(max(a, b))
    return tuple(reversed(r))


class Body:
    """One function being generated: its lines and each variable's shape."""

    def __init__(self, rng, shapes, mesh=None, explicit=False):
        self.rng = rng
        self.mesh, self.explicit = mesh, explicit
        self.lines = []
        self.vars = {f"a{i}": s for i, s in enumerate(shapes)}
        self.n = 0

    def pick(self, pred=lambda s: True):
        names = [v for v, s in self.vars.items() if pred(s)]
        if not names:
            return None
        # recent values more often, so the chain grows
        names.sort(key=lambda v: (v[0] != "a", int(v[1:])))
        return names[-1] if self.rng.random() < 0.5 else self.rng.choice(names)

    def emit(self, expr, shape):
        self.n += 1
        v = f"v{self.n}"
        self.lines.append(f"    {v} = {expr}")
        self.vars[v] = tuple(shape)
        return v


def size(s):
    n = 1
    for d in s:
        n *= d
    return n


def statement(b):
    rng = b.rng
    v = b.pick()
    s = b.vars[v]
    r = len(s)
    k = rng.randrange(40)
    if k < 2:
        return b.emit(rng.choice(UNARY).format(v), s)
    if k == 2 or k == 3:
        cands = [w for w, t in b.vars.items() if bcast(s, t) and size(bcast(s, t)) <= 512] or [v]
        w = rng.choice(cands)
        op = rng.choice(["{} + {}", "{} * {}", "{} - {}", "jnp.maximum({}, {})", "jnp.tanh({} * {})"])
        return b.emit(op.format(v, w) if rng.random() < 0.5 else op.format(w, v), bcast(s, b.vars[w]))
    if k == 4 and r >= 1:
        d = rng.randrange(r)
        red = rng.choice(["sum", "max", "mean", "min"])
        if rng.random() < 0.4:
            return b.emit(f"{v} - {v}.{red}(axis={d}, keepdims=True) * 0.5", s)
        if r == 1 or rng.random() < 0.15:
            return b.emit(f"jnp.{red}({v})", ())
        return b.emit(f"jnp.{red}({v}, axis={d})", s[:d] + s[d + 1:])
    if k == 5 and r >= 2:
        perm = list(range(r))
        rng.shuffle(perm)
        if r == 2 and rng.random() < 0.5:
            return b.emit(f"{v}.T", s[::-1])
        return b.emit(f"jnp.transpose({v}, {tuple(perm)})", [s[p] for p in perm])
    if k == 6 and r >= 1:
        opts = []
        for i in range(r - 1):
            opts.append(s[:i] + (s[i] * s[i + 1],) + s[i + 2:])
        if r < 4:
            for i in range(r):
                for a in (2, 4):
                    if s[i] % a == 0 and s[i] // a >= 2:
                        opts.append(s[:i] + (a, s[i] // a) + s[i + 1:])
        if opts:
            t = rng.choice(opts)
            return b.emit(f"{v}.reshape({', '.join(map(str, t))})", t)
    if k in (7, 8) and r >= 1:
        return b.emit(*dot(b, v, s))
    if k == 9 and r >= 1:
        d = rng.randrange(r)
        n = s[d]
        if n >= 2:
            cut = rng.choice(["1:", f":{n // 2}", f"{n // 2}:", f":{n - 1}", "::2"])
            m = len(range(n)[slice(*[int(x) if x else None for x in cut.split(":")])]) if "::" not in cut else (n + 1) // 2
            idx = ", ".join([":"] * d + [cut])
            return b.emit(f"{v}[{idx}]", s[:d] + (m,) + s[d + 1:])
    if k == 10 and r >= 1:
        d = rng.randrange(r)
        if s[d] * 2 <= MAXDIM:
            cands = [w for w, t in b.vars.items() if t == s]
            w = rng.choice(cands)
            other = rng.choice([w, f"jnp.cos({w})", f"{w} * 0.5"])
            return b.emit(f"jnp.concatenate([{v}, {other}], axis={d})", s[:d] + (s[d] * 2,) + s[d + 1:])
    if k == 11 and r >= 1:
        d = rng.randrange(r)
        return b.emit(f"jnp.cumsum({v}, axis={d}) * 0.5", s)
    if k == 12:
        cands = [w for w, t in b.vars.items() if bcast(s, t) == s]
        w = rng.choice(cands)
        return b.emit(f"jnp.where({v} > 0., {v}, {w} * 0.5)", s)
    if k in (13, 14) and r >= 1:
        return b.emit(f"C({v}, {random_spec(rng, s)})", s)
    if k == 15:
        cands = [w for w, t in b.vars.items() if bcast(s, t) == s]
        w = rng.choice(cands)
        body = rng.choice([f"jnp.tanh(c * 0.5 + {w})", f"c * 0.5 + jnp.sin(c) * 0.25",
                           f"jnp.tanh(c + jnp.sum(c) * 0.1)"])
        if r == 2 and s[0] == s[1] and rng.random() < 0.5:
            body = f"jnp.tanh(c @ {w} * 0.25)"
        return b.emit(f"jax.lax.fori_loop(0, {rng.randrange(1, 4)}, lambda i, c: {body}, {v})", s)
    if k == 16:
        # the predicate a max, not a sum: the same bits whatever the layout
        t = rng.choice(UNARY).format("c")
        return b.emit(f"jax.lax.cond(jnp.max({v}) > 0.125, lambda c: {t}, lambda c: c * 0.5 - 1., {v})", s)
    if k in (17, 39) and not b.explicit and r >= 1:
        return b.emit(*manual(b, v, s))
    if k >= 18:
        r_ = more(b, v, s, k)
        if r_:
            return b.emit(*r_)
    return b.emit(f"jnp.tanh({v} * 1.5)", s)


def manual(b, v, s):
    """A shard_map over the case's (Auto) mesh of [v]: an element-wise body,
    or a psum over a mesh axis (one splitting a dimension, which then
    shrinks, or one the block is replicated over), or a tiled all_gather
    over one; its results laid out by out_specs whatever v's layout."""
    rng = b.rng
    ents = random_entries(rng, s)
    ents += [None] * (len(s) - len(ents))
    used = [(d, a) for d, e in enumerate(ents) for a in spec_axes(e)]
    free = [a for a in "xy" if a not in [u for _, u in used]]
    call = f"jax.shard_map(lambda c: {{}}, mesh={b.mesh}, in_specs={spec_text(ents)}, out_specs={{}})({v})"
    kind = rng.randrange(9)
    others = [w for w, t in b.vars.items() if t == s and w != v]
    if kind == 7 and others:   # two operands, each with its own in_spec
        w = rng.choice(others)
        ents2 = random_entries(rng, s)
        body = rng.choice(["c * d", "c + jnp.sin(d)", "jnp.maximum(c, d) - c * 0.5"])
        return (f"jax.shard_map(lambda c, d: {body}, mesh={b.mesh}, "
                f"in_specs=({spec_text(ents)}, {spec_text(ents2)}), out_specs={spec_text(ents)})({v}, {w})"), s
    if kind == 8 and len(s) >= 2:   # vmapped over the leading dimension
        inner = ents[1:]
        return (f"jax.vmap(jax.shard_map(lambda c: jnp.tanh(c) * 2., mesh={b.mesh}, "
                f"in_specs={spec_text(inner)}, out_specs={spec_text(inner)}))({v})"), s
    if kind == 4 and used:   # a cyclic shift of the blocks along one axis
        d, ax = rng.choice(used)
        n = AXES[ax]
        perm = [(i, (i + 1) % n) for i in range(n)]
        return call.format(f"jax.lax.ppermute(c, '{ax}', {perm})", spec_text(ents)), s
    if kind == 5 and free:   # a sum scattered over a free axis along dimension d
        ax = rng.choice(free)
        ds = [d for d in range(len(s)) if ents[d] is None and s[d] % AXES[ax] == 0]
        if ds:
            d = rng.choice(ds)
            out = list(ents)
            out[d] = f"'{ax}'"
            return call.format(f"jax.lax.psum_scatter(c, '{ax}', scatter_dimension={d}, tiled=True)",
                               spec_text(out)), s
    if kind == 6 and used:   # the block's position in the mesh
        d, ax = rng.choice(used)
        return call.format(f"c * (jax.lax.axis_index('{ax}') + 1.) + jax.lax.pmax(c, '{ax}')",
                           spec_text(ents)), s
    if kind == 1 and used:
        d, ax = rng.choice(used)
        out = list(ents)
        out[d] = entry_text([a for a in spec_axes(ents[d]) if a != ax])
        t = s[:d] + (s[d] // AXES[ax],) + s[d + 1:]
        return call.format(f"jax.lax.psum(c, '{ax}')", spec_text(out)), t
    if kind == 2 and free:
        ax = rng.choice(free)
        return call.format(f"jax.lax.psum(jnp.sin(c), '{ax}')", spec_text(ents)), s
    if kind == 3 and used:
        d, ax = rng.choice(used)
        out = list(ents)
        out[d] = entry_text([a for a in spec_axes(ents[d]) if a != ax])
        return call.format(f"jax.lax.all_gather(c, '{ax}', axis={d}, tiled=True)", spec_text(out)), s
    return call.format(rng.choice(UNARY).format("c"), spec_text(ents)), s


def more(b, v, s, k):
    """Statements past the basic ones: layout moves (flip, pad, stack,
    expand/squeeze, broadcast_to, flatten), gathers and scatters, sorts,
    argmax, prod, dynamic slices, while_loop, scan and vmap; (expr,
    shape) or None when [s] does not fit."""
    rng = b.rng
    r = len(s)
    if k == 18 and r >= 1:
        d = rng.randrange(r)
        return f"jnp.flip({v}, axis={d})", s
    if k == 19 and r >= 1:
        d = rng.randrange(r)
        lo, hi = rng.choice([(1, 1), (2, 0), (0, 2), (1, 0)])
        if s[d] + lo + hi <= MAXDIM:
            pads = [(0, 0)] * r
            pads[d] = (lo, hi)
            return f"jnp.pad({v}, {tuple(pads)})", s[:d] + (s[d] + lo + hi,) + s[d + 1:]
    if k == 20 and r <= 2:
        cands = [w for w, t in b.vars.items() if t == s]
        w = rng.choice(cands)
        d = rng.randrange(r + 1)
        return f"jnp.stack([{v}, jnp.cos({w})], axis={d})", s[:d] + (2,) + s[d:]
    if k == 21:
        if r >= 1 and 1 in s:
            d = s.index(1)
            return f"jnp.squeeze({v}, axis={d})", s[:d] + s[d + 1:]
        if r < 4:
            d = rng.randrange(r + 1)
            return f"jnp.expand_dims({v}, {d})", s[:d] + (1,) + s[d:]
    if k == 22 and r <= 2:
        n = rng.choice([2, 4])
        return f"jnp.broadcast_to({v}, {(n,) + s})", (n,) + s
    if k == 23 and r >= 2:
        return f"{v}.reshape(-1)", (size(s),)
    if k == 24 and r >= 1:
        d = rng.randrange(r)
        n = s[d]
        if rng.random() < 0.5:
            idx = sorted(rng.sample(range(n), min(n, 2)))
            sel = ", ".join([":"] * d + [f"jnp.array({idx})"])
            return f"{v}[{sel}]", s[:d] + (len(idx),) + s[d + 1:]
        i = rng.randrange(n)
        sel = [":"] * d + [f"{i}"]
        if rng.random() < 0.5:   # within a box of the others: slices, ints, or an array
            for e in range(r):
                if e == d:
                    continue
                lo = rng.randrange(s[e])
                hi = rng.randrange(lo + 1, s[e] + 1)
                sel = sel + [":"] * (e + 1 - len(sel)) if e >= len(sel) else sel
                sel[e] = rng.choice([f"{lo}:{hi}", f"{lo}", ":"])
            if rng.random() < 0.5:
                sel[d] = f"jnp.array({[rng.randrange(n) for _ in range(3)]})"
        op = rng.choice(["set(0.5)", "add(1.)", "multiply(2.)", "min(0.25)", "max(-0.25)"])
        return f"{v}.at[{', '.join(sel)}].{op}", s
    if k == 25 and r >= 1:
        d = rng.randrange(r)
        f = rng.choice(["jnp.sort({}, axis={})", "jnp.argsort({}, axis={}) * 0.25", "jnp.argmax({}, axis={}) * 0.5",
                        "jnp.prod(jnp.tanh({}), axis={})", "jnp.cumprod(jnp.tanh({}), axis={})"])
        out = s if "sort" in f or "cum" in f else s[:d] + s[d + 1:]
        return f.format(v, d), out
    if k == 26 and r >= 1:
        d = rng.randrange(r)
        n = s[d]
        m = rng.choice([x for x in (1, 2, n // 2, n) if 1 <= x <= n])
        start = rng.randrange(n - m + 1)
        starts = ", ".join(str(start) if i == d else "0" for i in range(r))
        sizes = ", ".join(str(m) if i == d else str(s[i]) for i in range(r))
        if rng.random() < 0.5:   # an update of that box, the start possibly clamped
            starts = ", ".join(str(rng.randrange(-1, n + 1)) if i == d else "0" for i in range(r))
            shp = s[:d] + (m,) + s[d + 1:]
            return (f"jax.lax.dynamic_update_slice({v}, jnp.full({shp}, -0.5), ({starts}{',' if r == 1 else ''}))",
                    s)
        return (f"jax.lax.dynamic_slice({v}, ({starts}{',' if r == 1 else ''}), ({sizes}{',' if r == 1 else ''}))",
                s[:d] + (m,) + s[d + 1:])
    if k == 27:
        return (f"jax.lax.while_loop(lambda c: c[0] < {rng.randrange(1, 4)}, "
                f"lambda c: (c[0] + 1, jnp.tanh(c[1] * 1.5 + 0.25)), (0, {v}))[1]", s)
    if k == 28 and r >= 1:
        row = s[1:]
        inner = rng.choice(["jnp.tanh(c + x)", "c * 0.5 + jnp.sin(x)", "jnp.maximum(c, x)"])
        return f"jax.lax.scan(lambda c, x: ({inner}, c * x), {v}[0], {v})[1]", s
    if k == 29 and r >= 1:
        inner = rng.choice(["jnp.tanh(r * 2.) - r.sum() * 0.1", "jnp.sin(r) * r.max()", "r / (1. + jnp.abs(r))"])
        return f"jax.vmap(lambda r: {inner})({v})", s
    if k == 30 and r >= 1:
        d = rng.randrange(r)
        f = rng.choice(["jax.nn.softmax({}, axis={})", "jax.nn.log_softmax({}, axis={})",
                        "jax.nn.logsumexp({}, axis={})", "jnp.var({}, axis={})", "jnp.std({}, axis={}) + 0.5",
                        "jnp.linalg.norm({}, axis={})"])
        keep = "softmax" in f
        return f.format(v, d), s if keep else s[:d] + s[d + 1:]
    if k == 31 and r >= 1:
        d = rng.randrange(r)
        return f"jnp.roll({v}, {rng.choice([1, -1, 2])}, axis={d})", s
    if k == 32 and r >= 1:
        d = rng.randrange(r)
        if s[d] * 2 <= MAXDIM:
            if rng.random() < 0.5:
                reps = [1] * r
                reps[d] = 2
                return f"jnp.tile({v}, {tuple(reps)})", s[:d] + (s[d] * 2,) + s[d + 1:]
            return f"jnp.repeat({v}, 2, axis={d})", s[:d] + (s[d] * 2,) + s[d + 1:]
    if k == 33 and r == 1:
        ws = [w for w, t in b.vars.items() if len(t) == 1]
        w = rng.choice(ws)
        return f"jnp.outer({v}, {w}) * 0.5", s + b.vars[w]
    if k == 34 and r >= 2:
        ws = [w for w, t in b.vars.items() if len(t) >= 1 and t[0] == s[-1]]
        if ws:
            w = rng.choice(ws)
            return f"jnp.tensordot({v}, {w}, axes=1) * 0.5", s[:-1] + b.vars[w][1:]
    if k == 35:
        inner = rng.choice(["jnp.tanh(z) * 2.", "z - jnp.mean(z)", "jnp.cumsum(z, axis=-1)" if r else "z * 3.",
                            "C(z, %s)" % random_spec(rng, s) if r else "z + 1."])
        return f"jax.jit(lambda z: {inner})({v})", s
    if k == 36 and r >= 2:
        inner = rng.choice(["jnp.tanh(c) * c.sum()", "c / (1. + c.max())", "jnp.cumsum(c, axis=0) * 0.5"])
        return f"jax.vmap(lambda c: {inner}, in_axes=1, out_axes=1)({v})", s
    if k == 37 and r == 3:
        ws = [w for w, t in b.vars.items() if len(t) == 3 and t[0] == s[0] and t[2] == s[2]]
        w = rng.choice(ws)
        return f"jnp.einsum('bik,bjk->bij', {v}, {w}) * 0.5", (s[0], s[1], b.vars[w][1])
    if k == 38 and r == 2:
        # out_sharding= on a contraction (Explicit mode's; Auto's too)
        ws = [w for w, t in b.vars.items() if len(t) == 2 and t[0] == s[1]]
        if ws:
            w = rng.choice(ws)
            out = (s[0], b.vars[w][1])
            return (f"jnp.matmul({v}, {w}, out_sharding=None if C.mesh is None else "
                    f"NamedSharding(C.mesh, {random_spec(rng, out)})) * 0.5", out)
    if k == 39 and r >= 2:
        t_ = (size(s),) if rng.random() < 0.5 else (s[0] * s[1],) + s[2:]
        return (f"jnp.reshape({v}, {t_}, out_sharding=None if C.mesh is None else "
                f"NamedSharding(C.mesh, {random_spec(rng, t_)}))", t_)
    return None


def dot(b, v, s):
    """A contraction of [v] (shape [s]) with itself or another value."""
    rng = b.rng
    r = len(s)
    if r == 1:
        ws = [w for w, t in b.vars.items() if len(t) == 2 and t[0] == s[0]]
        if ws and rng.random() < 0.6:
            w = rng.choice(ws)
            return f"jnp.dot({v}, {w}) * 0.5", (b.vars[w][1],)
        return f"jnp.dot({v}, {v}) * 0.25", ()
    if r == 2:
        m, kk = s
        ws = [w for w, t in b.vars.items() if len(t) == 2 and t[0] == kk]
        wt = [w for w, t in b.vars.items() if len(t) == 2 and t[1] == kk]
        c = rng.randrange(4)
        if c == 0 and ws:
            w = rng.choice(ws)
            return f"jnp.dot({v}, {w}) * 0.5", (m, b.vars[w][1])
        if c == 1 and wt:
            w = rng.choice(wt)
            return f"jnp.einsum('ij,kj->ik', {v}, {w}) * 0.5", (m, b.vars[w][0])
        if c == 2:
            return f"jnp.matmul({v}.T, {v}) * 0.5", (kk, kk)
        return f"jnp.einsum('ij,ik->jk', {v}, {v}) * 0.5", (kk, kk)
    if r == 3:
        bb, m, kk = s
        ws = [w for w, t in b.vars.items() if len(t) == 3 and t[0] == bb and t[1] == kk]
        w2 = [w for w, t in b.vars.items() if len(t) == 2 and t[0] == kk]
        c = rng.randrange(3)
        if c == 0 and ws:
            w = rng.choice(ws)
            return f"jnp.matmul({v}, {w}) * 0.5", (bb, m, b.vars[w][2])
        if c == 1 and w2:
            w = rng.choice(w2)
            return f"jnp.matmul({v}, {w}) * 0.5", (bb, m, b.vars[w][1])
        return f"jnp.einsum('bij,bkj->bik', {v}, {v}) * 0.5", (bb, m, m)
    # rank 4: contract the last dimension with itself
    return f"jnp.einsum('abij,abkj->abik', {v}, {v}) * 0.5", s[:3] + (s[2],)


def case(rng, k):
    """The text of case [k]."""
    explicit = rng.random() < 0.25
    # the mesh: 2 x 2 mostly, else 4 x 2 or 2 x 4 (8 devices)
    AXES["x"], AXES["y"] = rng.choice([(2, 2), (2, 2), (4, 2), (2, 4)])
    nargs = rng.randrange(1, 4)
    shapes = []
    for _ in range(nargs):
        if shapes and rng.random() < 0.4:
            shapes.append(rng.choice(shapes))
            continue
        rank = rng.choice([1, 2, 2, 2, 3])
        shapes.append(tuple(rng.choice(SIZES) for _ in range(rank)))
    mesh = f"{'me' if explicit else 'ma'}{AXES['x']}{AXES['y']}"
    b = Body(rng, shapes, mesh, explicit)
    for _ in range(rng.randrange(2, 7)):
        statement(b)
    args = ", ".join(f"a{i}" for i in range(nargs))
    # a fifth of the cases return two values (each one's layout compared)
    ret = f"v{b.n}" if b.n < 2 or rng.random() < 0.8 else f"(v{b.n}, v{rng.randrange(1, b.n)})"
    loss = "sum(jnp.sum(o) for o in (r if isinstance(r, tuple) else (r,)))"
    C = f"{'Ce' if explicit else 'Ca'}({mesh})"
    specs = [random_spec(rng, s) for s in shapes]
    if explicit and nargs > 1 and rng.random() < 0.5:
        # operands laid out alike more often, so fewer cases raise
        for i in range(1, nargs):
            if shapes[i] == shapes[0]:
                specs[i] = specs[0]
    vals = []
    for i, s in enumerate(shapes):
        vals.append(f"jnp.sin(jnp.arange({float(size(s))}) * {rng.choice([0.3, 0.7, 1.1, 1.9])} + {k % 7 + i}.)"
                    f".reshape({', '.join(map(str, s))}{',' if len(s) == 1 else ''})")
    e = "True" if explicit else "False"
    text = [f"# case {k}",
            f"def f_{k}(C, {args}):",
            "\n".join(b.lines),
            f"    return {ret}",
            f"x_{k} = [{', '.join(vals)}]",
            f"s_{k} = [jax.device_put(a, NamedSharding({mesh}, s)) for a, s in zip(x_{k}, [{', '.join(specs)}])]",
            f"show({k}, 'ref', {e}, lambda: f_{k}(Cr, *x_{k}))",
            f"show({k}, 'eager', {e}, lambda: f_{k}({C}, *s_{k}))",
            f"show({k}, 'jit', {e}, lambda: jax.jit(lambda *a: f_{k}({C}, *a))(*s_{k}))",
            f"show({k}, 'jitu', {e}, lambda: jax.jit(lambda *a: f_{k}({C}, *a))(*x_{k}))"]
    if rng.random() < 0.25:
        g = f"lambda c: jax.grad(lambda *a: (lambda r: {loss})(f_{k}(c, *a)))"
        text += [f"show({k}, 'grad_ref', {e}, lambda: ({g})(Cr)(*x_{k}))",
                 f"show({k}, 'grad_eager', {e}, lambda: ({g})({C})(*s_{k}))",
                 f"show({k}, 'grad_jit', {e}, lambda: jax.jit(({g})({C}))(*s_{k}))",
                 f"show({k}, 'grad_jitu', {e}, lambda: jax.jit(({g})({C}))(*x_{k}))"]
    return "\n".join(text) + "\n"


PRELUDE = """import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P, AxisType
auto, expl = (AxisType.Auto, AxisType.Auto), (AxisType.Explicit, AxisType.Explicit)
ma22 = jax.make_mesh((2, 2), ('x', 'y'), axis_types=auto)
me22 = jax.make_mesh((2, 2), ('x', 'y'), axis_types=expl)
ma42 = jax.make_mesh((4, 2), ('x', 'y'), axis_types=auto)
me42 = jax.make_mesh((4, 2), ('x', 'y'), axis_types=expl)
ma24 = jax.make_mesh((2, 4), ('x', 'y'), axis_types=auto)
me24 = jax.make_mesh((2, 4), ('x', 'y'), axis_types=expl)
class Con:
    def __init__(self, mesh, fn):
        self.mesh, self.fn = mesh, fn
    def __call__(self, v, s):
        return self.fn(v, s)
Cr = Con(None, lambda v, s: v)
Ca = lambda m: Con(m, lambda v, s: jax.lax.with_sharding_constraint(v, NamedSharding(m, s)))
Ce = lambda m: Con(m, lambda v, s: jax.sharding.reshard(v, NamedSharding(m, s)))
def layout(r, explicit):
    if explicit:
        return str(jax.typeof(r))
    return str(r.sharding.spec) if hasattr(r.sharding, 'spec') else 'single'
def show(k, mode, explicit, thunk):
    try:
        r = thunk()
        rs = r if isinstance(r, tuple) else (r,)
        vals = [repr(float(v)) for o in rs for v in jax.device_get(o).ravel()]
        print('R', k, mode, ';'.join(layout(o, explicit).replace(' ', '') for o in rs), *vals)
    except Exception as ex:
        print('E', k, mode, type(ex).__name__)
"""


def generate(seed, count, per_file, outdir):
    rng = random.Random(seed)
    files, texts = [], {}
    for start in range(0, count, per_file):
        parts = [PRELUDE]
        for k in range(start, min(count, start + per_file)):
            texts[k] = case(rng, k)
            parts.append(texts[k])
        path = os.path.join(outdir, f"part_{start // per_file:04d}.shm")
        with open(path, "w") as f:
            f.write("\n".join(parts))
        files.append((path, range(start, min(count, start + per_file))))
    return files, texts


def run(cmd, env, timeout):
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return None, "", "timed out"


def parse(out):
    """{(case, mode): ('R', layout, values) or ('E', name)} from a run's output."""
    res = {}
    for line in out.splitlines():
        w = line.split()
        if len(w) >= 4 and w[0] == "R" and w[1].isdigit():
            res[(int(w[1]), w[2])] = ("R", w[3], w[4:])
        elif len(w) == 4 and w[0] == "E" and w[1].isdigit():
            res[(int(w[1]), w[2])] = ("E", w[3])
    return res


def close(a, b):
    """Values [a] and [b] equal to float32 rounding, relative to [b]'s scale."""
    if len(a) != len(b):
        return False
    scale = max([abs(float(y)) for y in b if float(y) == float(y)] + [1.0])
    for x, y in zip(a, b):
        x, y = float(x), float(y)
        if x != x and y != y or x == y:
            continue
        if not abs(x - y) <= 1e-4 * scale + 1e-4 * abs(y):
            return False
    return True


def spec_key(layouts):
    """Layouts (';'-separated, one per result) with trailing None entries
    left out: NamedShardings whose specs differ only so are equal
    (shmap(7), Sharded arrays)."""
    out = []
    for layout in layouts.split(";"):
        while layout.endswith(",None)") or layout == "P(None)":
            layout = layout[:-6] + ")" if layout != "P(None)" else "P()"
        out.append(layout)
    return ";".join(out)


def brief(r):
    if r is None:
        return "(no result)"
    if r[0] == "E":
        return r[1]
    v = r[2]
    return r[1] + " " + " ".join(v[:4]) + (" ..." if len(v) > 4 else "")


def compare(res, k, prefix, explicit_errors, exact):
    """The first disagreement among the modes of case [k] (a string), or None.
    [prefix] is '' or 'grad_'; eager and jit must agree bit for bit when
    [exact] and not a grad."""
    ref = res.get((k, prefix + "ref"))
    eager = res.get((k, prefix + "eager"))
    jit = res.get((k, prefix + "jit"))
    jitu = res.get((k, prefix + "jitu"))
    if None in (ref, eager, jit, jitu):
        return f"{prefix}missing results"
    if eager[0] != jit[0] or eager[0] == "E" and eager[1] != jit[1]:
        return f"{prefix}eager {brief(eager)} vs jit {brief(jit)}"
    if eager[0] == "R":
        if spec_key(eager[1]) != spec_key(jit[1]):
            return f"{prefix}layout: eager {eager[1]} vs jit {jit[1]}"
        if eager[2] != jit[2] and (not exact or prefix):
            if not close(jit[2], eager[2]):
                return f"{prefix}values: eager {brief(eager)} vs jit {brief(jit)}"
        elif eager[2] != jit[2]:
            return (f"{prefix}bits: eager {brief(eager)} vs jit {brief(jit)}; jit "
                    f"{'close to' if ref[0] == 'R' and close(jit[2], ref[2]) else 'differs from'} ref")
    if eager[0] == "E" and explicit_errors:
        return None
    if eager[0] != ref[0] or eager[0] == "E" and eager[1] != ref[1]:
        return f"{prefix}eager {brief(eager)} vs ref {brief(ref)}"
    if eager[0] == "R" and not close(eager[2], ref[2]):
        return f"{prefix}values: eager {brief(eager)} vs ref {brief(ref)}"
    if jitu[0] == "E" and explicit_errors and ref[0] == "R":
        return None   # the constraints type the values where the reference's are untyped
    if jitu[0] != ref[0] or jitu[0] == "E" and jitu[1] != ref[1]:
        return f"{prefix}jitu {brief(jitu)} vs ref {brief(ref)}"
    if jitu[0] == "R" and not close(jitu[2], ref[2]):
        return f"{prefix}values: jitu {brief(jitu)} vs ref {brief(ref)}"
    return None


def exact(text):
    """Whether eager and jit must agree bit for bit on case [text]: it sums
    nothing.  Under jit a partial sum (of a reduction or contraction over
    a split dimension) passes through the linear operations after it and
    is completed later than eagerly, rounded in another order (shmap(7),
    Propagation); grads sum the cotangents of broadcasts."""
    body = text.split("    return")[0]
    return not re.search(r"sum|mean|dot|matmul|einsum|@|var|std|norm|softmax|logsumexp", body)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("shmap")
    ap.add_argument("--programs", type=int, default=150)
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--per-file", type=int, default=50)
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument("--np", type=int, default=2, help="processes of the mpirun run (2, 4 or 8)")
    ap.add_argument("--keep")
    ap.add_argument("--timeout", type=float, default=300)
    a = ap.parse_args()
    outdir = a.keep or tempfile.mkdtemp(prefix="shmap-part-")
    os.makedirs(outdir, exist_ok=True)
    files, texts = generate(a.seed, a.programs, a.per_file, outdir)
    base = dict(os.environ)
    base.pop("SHMAP_REFERENCE", None)
    ways = [("threaded", [a.shmap, "--devices", "8"], base)]
    if not a.no_mpi:
        mpi = dict(base, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   SHMAP_PARTIAL_MIN="1")
        ways.append((f"mpirun -np {a.np}", ["mpirun", "--oversubscribe", "--bind-to", "none", "-np",
                                             str(a.np), a.shmap, "--devices", "8"], mpi))
    bad, failed_runs = 0, []
    for path, cases in files:
        results = {}
        for name, cmd, env in ways:
            rc, out, err = run(cmd + [path], env, a.timeout)
            if rc != 0:
                failed_runs.append(f"{name} {os.path.basename(path)}: exit {rc}: {err.strip()[-600:]}")
            results[name] = parse(out)
        res = results["threaded"]
        for k in cases:
            explicit = "(Ce(me" in texts[k]
            why = compare(res, k, "", explicit, exact(texts[k]))
            if why is None and (k, "grad_ref") in res:
                why = compare(res, k, "grad_", explicit, False)
            if why is None and len(ways) > 1:
                other = results[ways[1][0]]
                for key in sorted(x for x in res if x[0] == k):
                    r, s = res[key], other.get(key)
                    if s is None or r[0] != s[0] or r[0] == "E" and r[1] != s[1] or \
                            r[0] == "R" and (r[1] != s[1] or not close(s[2], r[2])):
                        why = f"{ways[1][0]} {key[1]}: {brief(s)} vs threaded {brief(r)}"
                        break
            if why:
                bad += 1
                print(f"DISAGREE case {k}: {why}")
                print("  " + texts[k].replace("\n", "\n  "))
    for f in failed_runs:
        print("FAILED RUN " + f)
    if not a.keep:
        for f, _ in files:
            os.remove(f)
        os.rmdir(outdir)
    print(f"partitioned: {a.programs} programs, {bad} disagree" +
          (f", {len(failed_runs)} runs failed" if failed_runs else ""))
    return 1 if bad or failed_runs else 0


if __name__ == "__main__":
    sys.exit(main())
