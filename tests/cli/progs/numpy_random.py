# NumPy's random numbers as scripts make their data: the same text is a
# Python program and a shmap script; tests/cli/numpy_random.sh runs both
# and compares the lines.  Floats print with repr (every bit shows).
import numpy as np

# the legacy API: MT19937 seeded by an int, then by a sequence of ints
for seed in [0, 1, 42, 2**32 - 1]:
    np.random.seed(seed)
    print(seed, np.random.rand(3).tolist(), np.random.rand())
    print(np.random.randn(3).tolist(), np.random.randn(2, 2).tolist())   # the spare value carried
    print(np.random.randint(0, 10, size=6).tolist(), np.random.randint(-5, 5, size=(2, 3)).tolist())
    print(np.random.randint(7), np.random.randint(0, 2**40, size=2).tolist())
    print(np.random.normal(1.5, 0.5, size=3).tolist(), np.random.normal())
    print(np.random.uniform(-2.0, 3.0, size=4).tolist(), np.random.uniform())
    print(np.random.random((2, 2)).tolist(), np.random.random_sample(2).tolist())
    print(np.random.standard_normal(3).tolist())
    print(np.random.permutation(12).tolist())
    print(np.random.permutation(np.arange(12).reshape(4, 3)).tolist())
    print(np.random.choice(10, 5).tolist(), np.random.choice(5), np.random.choice([1.5, 2.5, 3.5], size=(2, 2)).tolist())
    print(np.random.choice(4, 6, p=[0.1, 0.2, 0.3, 0.4]).tolist(), np.random.choice(8, 4, replace=False).tolist())
np.random.seed([1, 2, 3])
print(np.random.rand(2).tolist(), np.random.randn(1).tolist())
rs = np.random.RandomState(7)
print(rs.rand(2).tolist(), rs.randn(3).tolist(), rs.randint(100, size=4).tolist())
print(np.random.randint(0, 3, size=4, dtype=np.int32).tolist())

# default_rng: PCG64 seeded through SeedSequence
for seed in [0, 1, 42, 2**32, 2**45 + 12345, [1, 2, 3]]:
    rng = np.random.default_rng(seed)
    print(seed, rng.random(3).tolist(), rng.random())
    print(rng.integers(0, 10, size=7).tolist(), rng.integers(5), rng.integers(-3, 3, size=(2, 2)).tolist())
    print(rng.integers(0, 2**40, size=3).tolist(), rng.integers(1, 6, size=4, endpoint=True).tolist())
    print(rng.integers(0, 1000, size=3, dtype=np.int32).tolist())
    print(rng.uniform(2.0, 3.0, size=2).tolist(), rng.uniform())
    print(rng.permutation(10).tolist(), rng.permutation(np.arange(8)).tolist())
    print(rng.random((2, 3)).tolist())
    print(rng.choice(10, 5).tolist(), rng.choice([1.5, 2.5, 3.5], size=3).tolist(), rng.choice(4, 3, p=[0.1, 0.2, 0.3, 0.4]).tolist())

# default_rng's Gaussians: NumPy's ziggurat (its tables, its tail beyond
# R = 3.654 in level 0, its wedges), over 10**5 draws of each seed: the
# correctly rounded sum of all and every draw in the tail, bit for bit
import math
for seed in [0, 7, 2024]:
    rng = np.random.default_rng(seed)
    print(seed, rng.standard_normal(4).tolist(), rng.standard_normal(), rng.normal(), rng.normal(1.0, 2.0, size=(2, 2)).tolist())
    v = rng.standard_normal(100000).tolist()
    print(math.fsum(v), [x for x in v if abs(x) > 3.6541528853610088])
    w = rng.normal(-3.0, 0.5, size=1000).tolist()
    print(math.fsum(w), w[-3:])
