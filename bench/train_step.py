"""NumPy's figures for bench/train_step.shm: the loss, its value and
gradients by hand, and the training step (value_and_grad + SGD) of the
512-1024-512 MLP, batch 256, float32.  Run with BLIS_NUM_THREADS /
OPENBLAS_NUM_THREADS / OMP_NUM_THREADS set to 1 and to 2."""
import sys
import timeit
import numpy as np

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 10
b, din, dh, dout = 256, 512, 1024, 512
f32 = np.float32
x = np.sin(np.arange(b * din, dtype=f32)).reshape(b, din)
t = np.cos(np.arange(b * dout, dtype=f32)).reshape(b, dout)
w1 = np.sin(np.arange(din * dh, dtype=f32) * f32(0.37)).reshape(din, dh) * f32(0.03)
w2 = np.cos(np.arange(dh * dout, dtype=f32) * f32(0.11)).reshape(dh, dout) * f32(0.03)


def loss():
    h = np.tanh(x @ w1)
    return np.mean((h @ w2 - t) ** 2)


def value_and_grad():
    h = np.tanh(x @ w1)
    r = h @ w2 - t
    dr = r * f32(2.0 / r.size)
    dw2 = h.T @ dr
    dw1 = x.T @ ((dr @ w2.T) * (f32(1) - h * h))
    return np.mean(r ** 2), dw1, dw2


def step():
    l, dw1, dw2 = value_and_grad()
    return l, w1 - f32(0.01) * dw1, w2 - f32(0.01) * dw2


for name, f in (('loss', loss), ('value_and_grad', value_and_grad), ('step', step)):
    ms = min(timeit.repeat(f, number=1, repeat=reps + 1)[1:]) * 1e3
    print(name, 'numpy', round(ms, 2), 'ms')
