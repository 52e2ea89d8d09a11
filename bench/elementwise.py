"""NumPy's figures for bench/elementwise.shm, same operations, same sizes."""
import time
import numpy as np

n = 10 ** 7
x = np.arange(n, dtype=np.float32) / np.float32(n)
y = np.ones(n, dtype=np.float32) * np.float32(0.5)
z = np.ones(n, dtype=np.float32) * np.float32(0.25)


def per_element(f, reps):
    """The best of [reps] timed calls, per element (as bench/c_loops.c)."""
    f()
    best = 1e30
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e9


print('x*y+z', per_element(lambda: x * y + z, 20), 'ns/element')
print('sin(x)*3.+x', per_element(lambda: np.sin(x) * np.float32(3.) + x, 10), 'ns/element')

a = np.ones(8, dtype=np.float32)
b = np.ones(8, dtype=np.float32)
t0 = time.perf_counter()
for _ in range(1000000):
    c = a + b
print('tiny a+b (8,)', (time.perf_counter() - t0) * 1e3, 'ns/op')

for size in [1024, 2048]:
    p = np.ones((size, size), dtype=np.float32) / size
    q = np.ones((size, size), dtype=np.float32) / size
    p @ q
    reps = 10 if size == 1024 else 5
    best = 1e30
    for _ in range(reps):   # the best call, as for the large element-wise work
        t0 = time.perf_counter()
        p @ q
        best = min(best, time.perf_counter() - t0)
    print('matmul', size, 2. * size ** 3 / best / 1e9, 'GFLOP/s')
