/*
 * calibrate.c - `shmap --calibrate`: the program that measures this
 * machine and prints its hardware profile (calibrate.h).
 *
 * It is a shmap program, run as `-c` code is, so it measures what shmap
 * programs get: a jit matmul's FLOP/s (the float32 peak), a jit fused
 * element-wise sum's bytes read per second over two arrays far larger
 * than the caches (the memory bandwidth; a sum, so that no fresh result's
 * page faults are timed; arrays written out, since ones() alone is a
 * broadcast view read at stride 0), the sines and exponentials per
 * second of a jit fused loop over an array that stays in the caches (the
 * transcendentals' rate), an iteration of a jit fori_loop of a tiny body
 * over four kernels (two float32 operations on 8 elements, the counter's
 * add and the condition: the kernel overhead), the time of a jit
 * shard_map call
 * whose body does next to nothing on every device thread (the call
 * overhead: waking the devices and waiting for the last), and a jit psum
 * over every device thread at two sizes, fitted to the ring all-reduce's
 * alpha-beta model that the estimate uses (2(n-1) rounds of latency;
 * 2(n-1)/n of the operand sent) through two points: 200 psums of 4 KiB
 * per device in a loop in one call (the call overhead spread over them:
 * a difference of two short calls is mostly noise on a loaded machine)
 * and one call of 4 MiB per device less the call overhead.
 * Each time is the median of 21 calls after a warm-up (of 50 for the
 * call overhead and the latency, which are short), a typical call rather
 * than the luckiest, as the estimate's are to be compared with runs of
 * many calls, and one that a loaded machine shakes less.  host_cores is the processors this process may
 * use: the device threads share them.  memory_capacity
 * is written as 0 (unknown: no warning).
 */
#include "cli/calibrate.h"

const char calibrate_program[] =
    "import time\n"
    "import os\n"
    "def typical(f, *args, reps=21):\n"
    "    f(*args)\n"
    "    ts = []\n"
    "    for _ in range(reps):\n"
    "        t0 = time.perf_counter()\n"
    "        f(*args)\n"
    "        ts.append(time.perf_counter() - t0)\n"
    "    return sorted(ts)[reps // 2]\n"
    "n = 1024\n"
    "a = ones((n, n)) * 1.\n"
    "peak = 2. * n ** 3 / typical(jax.jit(lambda x: x @ x), a)\n"
    "m = 1 << 23\n"
    "x = ones(m) * 1.\n"
    "y = ones(m) * 2.\n"
    "bw = 8. * m / typical(jax.jit(lambda v, w: (v * 2. + w).sum()), x, y)\n"
    "z = ones(1 << 20) * 0.5\n"
    "tr = 2. * (1 << 20) / typical(jax.jit(lambda v: (sin(v) + exp(v)).sum()), z)\n"
    "iters = 100000\n"
    "lp = jax.jit(lambda v: fori_loop(0, iters, lambda i, c: c * 0.999 + 1., v))\n"
    "kern = typical(lp, ones(8) * 1.) / iters / 4\n"
    "d = len(devices())\n"
    "mesh cm(x=d)\n"
    "call = typical(jax.jit(shard_map(lambda v: v * 2., mesh=cm, in_specs=P('x'), out_specs=P('x'))),\n"
    "            ones(d) * 1., reps=50)\n"
    "k = 200\n"
    "arl = jax.jit(shard_map(lambda v: fori_loop(0, k, lambda i, y: psum(y, 'x') / d, v), mesh=cm,\n"
    "                        in_specs=P('x'), out_specs=P('x'), check_rep=False))\n"
    "small = max(typical(arl, ones(d * 1024) * 1.) - call, 0.) / k\n"
    "ar = jax.jit(shard_map(lambda v: psum(v, 'x'), mesh=cm, in_specs=P('x'), out_specs=P()))\n"
    "big = max(typical(ar, ones(d * (1 << 20)) * 1.) - call, 0.)\n"
    "steps = 2 * (d - 1)\n"
    "sent1, sent2 = 2. * (d - 1) / d * 4096, 2. * (d - 1) / d * 4 * (1 << 20)\n"
    "beta = (sent2 - sent1) / max(big - small, 1e-9)\n"
    "alpha = max(small - sent1 / beta, 0.) / steps\n"
    "print('# shmap --calibrate: this machine, measured')\n"
    "print('name: this machine ({} device threads)'.format(d))\n"
    "print('peak_flops:')\n"
    "print('  float32: {:.4g}'.format(peak))\n"
    "print('memory_bandwidth: {:.4g}'.format(bw))\n"
    "print('memory_capacity: 0')\n"
    "print('host_cores: {}'.format(os.cpu_count()))\n"
    "print('transcendentals: {:.4g}'.format(tr))\n"
    "print('kernel_overhead: {:.4g}'.format(kern))\n"
    "print('call_overhead: {:.4g}'.format(call))\n"
    "print('links:')\n"
    "print('  default:')\n"
    "print('    bandwidth: {:.4g}'.format(beta))\n"
    "print('    latency: {:.4g}'.format(alpha))\n"
    "print('    topology: ring')\n";
