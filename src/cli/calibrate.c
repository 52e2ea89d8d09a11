/*
 * calibrate.c - `shmap --calibrate`: the program that measures this
 * machine and prints its hardware profile (calibrate.h).
 *
 * It is a shmap program, run as `-c` code is, so it measures what shmap
 * programs get: a jit matmul's FLOP/s (the float32 peak), a jit fused
 * element-wise sum's bytes read per second over an array far larger than
 * the caches (the memory bandwidth; a sum, so that no fresh result's
 * page faults are timed), and a jit psum over every device thread
 * at two sizes, fitted to the ring all-reduce's alpha-beta model that
 * the estimate uses (2(n-1) rounds of latency; 2(n-1)/n of the operand
 * sent): the latency from a 4-byte-per-device call, the bandwidth from a
 * 4 MiB-per-device one.  Each time is the best of five calls after a
 * warm-up.  memory_capacity is written as 0 (unknown: no warning).
 */
#include "cli/calibrate.h"

const char calibrate_program[] =
    "import time\n"
    "def best(f, *args):\n"
    "    f(*args)\n"
    "    t = 1e9\n"
    "    for _ in range(5):\n"
    "        t0 = time.perf_counter()\n"
    "        f(*args)\n"
    "        t = min(t, time.perf_counter() - t0)\n"
    "    return t\n"
    "n = 512\n"
    "a = ones((n, n))\n"
    "peak = 2. * n ** 3 / best(jax.jit(lambda x: x @ x), a)\n"
    "m = 1 << 23\n"
    "x = ones(m)\n"
    "bw = 4. * m / best(jax.jit(lambda v: (v * 2. + 1.).sum()), x)\n"
    "d = len(devices())\n"
    "mesh cm(x=d)\n"
    "ar = jax.jit(shard_map(lambda v: psum(v, 'x'), mesh=cm, in_specs=P('x'), out_specs=P()))\n"
    "small = best(ar, ones(d))\n"
    "steps = 2 * (d - 1)\n"
    "alpha = small / steps\n"
    "B = 4. * (1 << 20)\n"
    "big = best(ar, ones(d * (1 << 20)))\n"
    "sent = 2. * (d - 1) / d * B\n"
    "beta = sent / max(big - steps * alpha, 1e-9)\n"
    "print('# shmap --calibrate: this machine, measured')\n"
    "print('name: this machine ({} device threads)'.format(d))\n"
    "print('peak_flops:')\n"
    "print('  float32: {:.4g}'.format(peak))\n"
    "print('memory_bandwidth: {:.4g}'.format(bw))\n"
    "print('memory_capacity: 0')\n"
    "print('links:')\n"
    "print('  default:')\n"
    "print('    bandwidth: {:.4g}'.format(beta))\n"
    "print('    latency: {:.4g}'.format(alpha))\n"
    "print('    topology: ring')\n";
