"""NumPy's figures for bench/jit_bench.shm: the same expression and loop."""
import time
import numpy as np

n = 10 ** 7
x = np.arange(n, dtype=np.float32) / np.float32(n)
y = np.ones(n, dtype=np.float32) * np.float32(0.5)


def best_ms(f, reps):
    f()
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def expr():
    return np.sum(x + np.sin(y) * np.float32(3.) - x * y)


print('sum(x+sin(y)*3.-x*y) numpy', best_ms(expr, 10), 'ms')

iters = 10 ** 5
v = np.ones(8, dtype=np.float32)
t0 = time.perf_counter()
c = v
for i in range(iters):
    c = c * np.float32(0.999) + np.float32(1.)
print('fori_loop python+numpy', (time.perf_counter() - t0) / iters * 1e6, 'us/iter')
