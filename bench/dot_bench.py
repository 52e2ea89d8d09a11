"""NumPy's figures for bench/dot_bench.shm: the same products, the
per-example gradients batched by hand and the MLP training step written
by hand.  DOT_STEPS=N instead runs N training steps and prints the loss."""
import os
import timeit
import numpy as np


def best_ms(f, reps):
    """The fastest of [reps] calls after one warm-up, in milliseconds."""
    return min(timeit.repeat(f, number=1, repeat=reps + 1)[1:]) * 1e3


b, din, dh, dout = 256, 512, 1024, 512
f32 = np.float32
x = np.sin(np.arange(b * din, dtype=f32)).reshape(b, din)
t = np.cos(np.arange(b * dout, dtype=f32)).reshape(b, dout)
w1 = np.sin(np.arange(din * dh, dtype=f32) * f32(0.37)).reshape(din, dh) * f32(0.03)
w2 = np.cos(np.arange(dh * dout, dtype=f32) * f32(0.11)).reshape(dh, dout) * f32(0.03)


def step(w1, w2):
    h = np.tanh(x @ w1)
    r = h @ w2 - t
    loss = np.mean(r ** 2)
    dr = r * f32(2.0 / r.size)
    dw2 = h.T @ dr
    dh_ = (dr @ w2.T) * (f32(1) - h * h)
    dw1 = x.T @ dh_
    return loss, w1 - f32(0.01) * dw1, w2 - f32(0.01) * dw2


steps = int(os.environ.get('DOT_STEPS', '0'))
if steps:
    for _ in range(steps):
        loss, w1, w2 = step(w1, w2)
    print(float(loss))
else:
    for n in (1024, 4096):
        a = np.sin(np.arange(n * n, dtype=f32)).reshape(n, n)
        v = np.cos(np.arange(n, dtype=f32))
        print('matvec', n, best_ms(lambda: a @ v, 20), 'ms')
        print('vecmat', n, best_ms(lambda: v @ a, 20), 'ms')
    u = np.sin(np.arange(1000000, dtype=f32))
    print('dot 1e6', best_ms(lambda: u @ u, 20), 'ms')
    w = np.cos(np.arange(din, dtype=f32)) * f32(0.05)
    y = np.sin(np.arange(b, dtype=f32))
    print('by hand linear', best_ms(lambda: (f32(2) * (x @ w - y))[:, None] * x, 50), 'ms')
    print('mlp step', best_ms(lambda: step(w1, w2), 10), 'ms')
