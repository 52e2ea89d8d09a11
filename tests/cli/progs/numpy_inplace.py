# NumPy's in-place writes to host arrays: a program that is both a
# Python program with NumPy and a shmap script (tests/cli/numpy_inplace.sh
# compares the two outputs line for line).
import numpy as np


def show(name, x):
    print(name, x.dtype, x.shape)
    print(x)


# basic indexing: ints, slices with steps, negative steps, Ellipsis, None
a = np.zeros((3, 4))
a[1] = 3
a[:, 2] += 1
a[0, ::2] = [7, 8]
a[-1, ::-1] = np.arange(4)
a[..., 3] = -1
a[None, 2, 1] = 42
show("a", a)

# views: basic slices, reshape, transpose, .T, ravel, squeeze
b = np.arange(12.0)
v = b.reshape(3, 4)
v[0, 0] = -1
v.T[1, 0] = -2
np.transpose(v)[2, 1] = -3
v.ravel()[7] = -4
b[::3][3] = -5
b[::-1][0] = -6
b.reshape(1, 12).squeeze()[10] = -7
row = v[1]
row[:] = row * 10
show("b", b)
for r in v:
    r[3] += 100
show("v", v)

# integer-array and boolean-mask indexing, broadcasting of the value
c = np.arange(12).reshape(3, 4)
c[c > 8] = -1
c[[0, 2], 1] = 7.9
c[[0, 1], [3, 2]] = [50, 60]
c[:, [0]] = np.array([[5], [6], [7]])
c[np.array([True, False, True])] += 1000
show("c", c)

# casting: setitem is NumPy's unsafe casting, op= its same_kind
d = np.ones(5, dtype=np.int64)
d[::2] = 2.7
d[1] = -3.9
show("d", d)
e = np.zeros(3, dtype=np.float32)
e[:] = np.array([1.1, 2.25, -1e30])
show("e", e)
f = np.zeros(4, dtype=bool)
f[1:3] = [2, 0]
show("f", f)
g = np.zeros(3)
g += np.arange(3)
g *= 2
g /= 4
g **= 2
g -= 1
show("g", g)
h = np.arange(6).reshape(2, 3)
h += np.array([1, 2, 3])
h //= 2
h %= 3
h *= True
show("h", h)

# a += b on a name mutates the array every name bound to it sees
x = np.arange(4)
y = x
x += 10
print(x is y, y)
z = x
x = x + 1
print(x is z, z, x)

# zeros, ones and full have buffers of their own
o = np.ones(3)
o2 = np.ones(3)
o[0] = 7
q = np.full((2, 2), 3)
q[1, 1] = 4.9
print(o, o2, q.dtype, q.tolist())

# copies: np.array, copy, flatten, astype, advanced indexing, 0-d items
k = np.arange(6.0)
cp = [np.array(k), k.copy(), k.flatten(), k.astype(np.float64), k[[1, 2]]]
s = k[1]
for w in cp:
    w[0] = -99
k[1] = 55
print(k, s, [float(w[0]) for w in cp])

# errors, NumPy's words
try:
    d += 1.5 * np.ones(5)
except TypeError as err:
    print("TypeError:", err)
try:
    d[:] = [1, 2]
except ValueError as err:
    print("ValueError:", err)
try:
    d += np.ones((2, 5), dtype=np.int64)
except ValueError as err:
    print("ValueError:", err)
try:
    d[7] = 1
except IndexError as err:
    print("IndexError:", err)
print(d)

# NumPy's promotion of Python numbers beside host arrays
n = np.arange(4)
show("n / 2", n / 2)
show("n + 0.1", n + 0.1)
show("bools + 1", np.array([True, False]) + 1)
m = np.ones(3, dtype=np.float32)
m += 0.1
show("m", m)
try:
    n += 0.5
except TypeError as err:
    print("TypeError:", err)
n -= True
show("n", n)

# inputs built as programs build them
X = np.empty((6, 4))
for i in range(6):
    X[i] = np.sin(np.arange(4) * i)
y = np.zeros(6, dtype=np.int32)
y[X[:, 1] > 0.5] = 1
print(y.tolist(), y.dtype)
mask = np.zeros((4, 4), dtype=bool)
mask[np.arange(4), np.arange(4)] = True
print(mask.sum(), mask.dtype)
I = np.eye(3)
I[0, 2] = 5
I[1:3, 1:3] = np.ones((2, 2)) * 2
I[I > 1] += 0.5
print(I.tolist())
L = np.linspace(0, 1, 5)
L[-1] = 9
L[1:4] *= -1
print(L.tolist())
np.random.seed(0)
W = np.random.randn(3, 2)
W[:, 0] = 0
W[-1] -= W[-1].mean()
print(W.round(6).tolist())
Z = np.zeros((2, 3, 4))
Z[..., 1:3] = np.arange(2)
Z[1, :, ::-2] = -1
print(Z.sum(), Z[1].tolist())
idx = np.array([2, 0])
A = np.arange(10)
A[idx] = A[idx] * 100
A[-3:] = A[:3]
print(A.tolist())
B = np.zeros(5, dtype=np.float32)
B[:] = np.arange(5) / 3
print(B.dtype, B.tolist())
C = np.arange(6).reshape(2, 3)
C[:, np.array([True, False, True])] = 0
print(C.tolist())

# repr: NumPy's arrays and scalars, inside containers too
sc = np.arange(3.0)
print([np.array(-99.0)], (sc[1],), {"k": np.arange(3)[2]}, [sc.sum()], repr(sc[0]))
print([sc, np.zeros(2, dtype=np.float32), np.array([], dtype=np.int64)], repr(np.ones((2, 0))))
print([np.array([1.5], dtype=np.float32)[0]], [sc > 0], [sc[1] > 0], [sc[2] * 2])

# 0-d arrays are written in place, scalars are bound anew
z0 = np.array(5.0)
z1 = z0
z0 += 1
zz = np.zeros(())
zw = zz
zz *= 3
zz += 2
s0 = sc[1]
s1 = s0
s0 += 1
r0 = sc.sum()
r1 = r0
r0 -= 1
print(z1, z0 is z1, zw, s0, s1, r0, r1)

# the results of operators with Python numbers are NumPy arrays, writable
t2 = np.arange(3) * 2
t2[0] = 9
mk = np.arange(4) > 1
mk[0] = True
print(t2.tolist(), mk.tolist())

# np.broadcast_to is read-only
bt = np.broadcast_to(np.arange(3), (2, 3))
for attempt in range(2):
    try:
        if attempt:
            bt += 1
        else:
            bt[0, 0] = 5
    except ValueError as err:
        print("ValueError:", err)
try:
    bt[1][0] = 5
except ValueError as err:
    print("ValueError:", err)
print(bt.tolist())

# strings written into numeric arrays: float(), int(), bool() of them
fs = np.zeros(3)
fs[0] = "1.5"
fs[1] = " 7 "
ints = np.zeros(2, dtype=np.int64)
ints[0] = "12"
bs = np.zeros(2, dtype=bool)
bs[0] = "x"
print(fs.tolist(), ints.tolist(), bs.tolist())
for arr, text in [(fs, "abc"), (ints, "1.5"), (fs, "")]:
    try:
        arr[1] = text
    except ValueError as err:
        print("ValueError:", err)
