"""NumPy's figures for bench/grad_mlp.shm: the MLP's forward pass and its
value and gradient written by hand."""
import time
import numpy as np

b, d = 256, 1024
x = np.sin(np.arange(b * d, dtype=np.float32)).reshape(b, d)
y = np.cos(np.arange(b * d, dtype=np.float32)).reshape(b, d)
w1 = (np.sin(np.arange(d * d, dtype=np.float32) * np.float32(0.37)).reshape(d, d) *
      np.float32(0.03))
w2 = (np.cos(np.arange(d * d, dtype=np.float32) * np.float32(0.11)).reshape(d, d) *
      np.float32(0.03))


def forward():
    h = np.tanh(x @ w1)
    return np.mean((h @ w2 - y) ** 2)


def value_and_grad():
    h = np.tanh(x @ w1)
    r = h @ w2 - y
    loss = np.mean(r ** 2)
    dr = r * np.float32(2.0 / r.size)
    dw2 = h.T @ dr
    dh = (dr @ w2.T) * (np.float32(1) - h * h)
    dw1 = x.T @ dh
    return loss, dw1, dw2


def best_ms(f, reps):
    f()
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


print('mlp forward numpy', best_ms(forward, 5), 'ms')
print('mlp value_and_grad numpy', best_ms(value_and_grad, 5), 'ms')
