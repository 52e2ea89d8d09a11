# jax.numpy's functions that shmap writes in its standard library
# (stdlib/_jax_numpy.shm), against NumPy's: under python3 xp is NumPy,
# under shmap jax.numpy; values are printed rounded to 4 decimals, as
# float32 and float64 agree to there on these inputs.
try:
    import jax.numpy as xp
except ImportError:
    import numpy as xp

def show(name, v):
    if isinstance(v, (list, tuple)):
        for k, x in enumerate(v):
            show(f"{name}[{k}]", x)
        return
    v = xp.asarray(v)
    flat = [round(float(t), 4) + 0.0 for t in v.reshape(-1).tolist()]
    print(name, tuple(v.shape), flat)

a = xp.asarray([[1., 5., 2.], [4., 3., 6.]])
b = xp.asarray([[0.5, -1.], [2., 1.5], [3., -0.25]])
v = xp.asarray([3., -1., 2., 7., 0.5])
n = xp.asarray([1., xp.nan, 3., xp.inf, -xp.inf])
show('atleast_1d', xp.atleast_1d(2.))
show('atleast_2d', xp.atleast_2d(v))
show('broadcast_arrays', xp.broadcast_arrays(xp.ones((2, 1)), xp.arange(3.)))
show('column_stack', xp.column_stack((v, v * 2)))
show('dstack', xp.dstack((a, a)))
show('hsplit', xp.hsplit(xp.arange(8.).reshape(2, 4), 2))
show('vsplit', xp.vsplit(xp.arange(8.).reshape(4, 2), 2))
show('diag1', xp.diag(v[:3]))
show('diag1k', xp.diag(v[:3], 1))
show('diag2', xp.diag(a))
show('diagonal', xp.diagonal(xp.arange(12.).reshape(3, 4), 1))
show('diagonal-', xp.diagonal(xp.arange(12.).reshape(3, 4), -1))
show('trace', xp.trace(xp.arange(9.).reshape(3, 3)))
show('diff', xp.diff(v))
show('diff2', xp.diff(a, n=2, axis=1))
show('tensordot', xp.tensordot(a, b, 1))
show('tensordot2', xp.tensordot(xp.arange(24.).reshape(2, 3, 4), xp.arange(12.).reshape(3, 4), 2))
show('tensordot_axes', xp.tensordot(a, b, ([1], [0])))
show('inner', xp.inner(a, a))
show('kron', xp.kron(xp.asarray([[1., 2.], [3., 4.]]), xp.asarray([[0., 1.], [1., 0.]])))
show('meshgrid', xp.meshgrid(xp.arange(3.), xp.arange(2.)))
show('meshgrid_ij', xp.meshgrid(xp.arange(3.), xp.arange(2.), indexing='ij'))
show('nan_to_num', xp.nan_to_num(n, posinf=9., neginf=-9.))
show('nansum', xp.nansum(xp.asarray([[1., xp.nan], [2., 3.]]), axis=0))
show('nanmean', xp.nanmean(xp.asarray([[1., xp.nan], [2., 3.]]), axis=1))
show('nanmax', xp.nanmax(xp.asarray([1., xp.nan, 3.])))
show('nanmin', xp.nanmin(xp.asarray([[1., xp.nan], [-2., 3.]]), axis=1))
show('deg2rad', xp.deg2rad(xp.asarray([0., 90., 180.])))
show('rad2deg', xp.rad2deg(xp.asarray([0., 1., 3.])))
show('trunc', xp.trunc(xp.asarray([-1.7, -0.2, 0.2, 1.7])))
show('fix', xp.fix(xp.asarray([-2.5, 2.5])))
show('rint', xp.rint(xp.asarray([0.5, 1.5, 2.5, -0.5, -1.5])))
show('around', xp.around(xp.asarray([1.234, 5.678]), 1))
show('count_nonzero', xp.count_nonzero(xp.asarray([[0., 1.], [2., 0.]]), axis=1))
show('flipud', xp.flipud(a))
show('fliplr', xp.fliplr(a))
show('ptp', xp.ptp(a, axis=1))
show('hypot', xp.hypot(xp.asarray([3., 0., 1e-3]), xp.asarray([4., 0., 1e-3])))
show('fmax', xp.fmax(xp.asarray([1., xp.nan, 3.]), xp.asarray([2., 1., xp.nan])))
show('fmin', xp.fmin(xp.asarray([1., xp.nan, 3.]), xp.asarray([2., 1., xp.nan])))
show('average', xp.average(a, axis=1, weights=xp.asarray([1., 2., 3.])))
show('average_all', xp.average(v))
show('median', xp.median(v))
show('median_axis', xp.median(a, axis=0))
show('quantile', xp.quantile(v, 0.3))
show('quantile_q', xp.quantile(a, xp.asarray([0.25, 0.75]), axis=1))
show('percentile', xp.percentile(v, 90.))
show('logspace', xp.logspace(0., 2., 3))
show('sinc', xp.sinc(xp.asarray([0., 0.5, 1.5])))
show('permute_dims', getattr(xp, 'permute_dims', xp.transpose)(xp.arange(6.).reshape(1, 2, 3), (2, 0, 1)))
show('select', xp.select([v < 0, v > 5], [v * 10, v * 100], -1.))
show('cov', xp.cov(a))
show('cov_xy', xp.cov(v, v * 2))
show('corrcoef', xp.corrcoef(a))
