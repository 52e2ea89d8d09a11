#!/bin/bash
# tests/cli/threads_bits.sh SHMAP - work split over both cores gives the
# same bits on every run and the bits of one core: a contraction of 2^21
# multiply-adds or more (its rows or columns cut into pieces both cores
# take) and a fused loop over 10^7 elements with a closing sum (blocks
# both cores take, their partial sums added in block order), each run 20
# times in one process, and the whole program again with the helper
# thread off (SHMAP_SERIAL_KERNELS).  Exit 0 when all hold.
set -u
shmap=${1:?usage: threads_bits.sh SHMAP}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

cat >"$dir/prog.shm" <<'SHM'
import jax
import jax.numpy as jnp
n = 10 ** 7
x = jnp.sin(jnp.arange(n, dtype=jnp.float32))
y = jnp.cos(jnp.arange(n, dtype=jnp.float32) * 0.5)
f = jax.jit(lambda x, y: jnp.sum(x * y))
r = [f(x, y) for i in range(20)]
print(all(bool(jnp.array_equal(s, r[0])) for s in r), repr(float(r[0])))
a = jnp.sin(jnp.arange(384 * 640, dtype=jnp.float32)).reshape(384, 640)
b = jnp.cos(jnp.arange(640 * 512, dtype=jnp.float32)).reshape(640, 512)
c = [a @ b for i in range(20)]
print(all(bool(jnp.array_equal(d, c[0])) for d in c))
save(OUT, c[0])
SHM
for mode in two one; do
  if [ $mode = one ]; then export SHMAP_SERIAL_KERNELS=1; fi
  sed "s|OUT|'$dir/$mode.npy'|" "$dir/prog.shm" >"$dir/$mode.shm"
  "$shmap" "$dir/$mode.shm" >"$dir/$mode.out" 2>&1 || { echo "shmap failed:"; cat "$dir/$mode.out"; exit 1; }
done
unset SHMAP_SERIAL_KERNELS
[ "$(sed -n '1s/ .*//p;2p' "$dir/two.out" | tr '\n' ' ')" = "True True " ] ||
  { echo "runs on two cores differ from one another:"; cat "$dir/two.out"; exit 1; }
cmp -s "$dir/two.out" "$dir/one.out" || { echo "two cores and one differ:"; diff "$dir/two.out" "$dir/one.out"; exit 1; }
cmp -s "$dir/two.npy" "$dir/one.npy" || { echo "the products on two cores and one differ"; exit 1; }
exit 0
