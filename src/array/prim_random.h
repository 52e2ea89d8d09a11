/*
 * prim_random.h - the PRNG primitives (random_split, random_fold_in,
 * random_bits, random_uniform) and erf_inv, with their shape rules and
 * kernels (semantics: JAX's threefry2x32 PRNG, jax/_src/prng.py, with
 * jax_threefry_partitionable on, as JAX defaults; XLA's erf_inv).
 */
#ifndef SHMAP_PRIM_RANDOM_H
#define SHMAP_PRIM_RANDOM_H

#include <stdint.h>

#include "array/prim.h"

/* The Threefry-2x32 hash (20 rounds) of counter words (*x0, *x1) under key
 * (k0, k1), in place: Random123's known answers hold (counter and key 0 give
 * 0x6b200159 0x99ba4efe). */
void prim_threefry2x32(uint32_t k0, uint32_t k1, uint32_t *x0, uint32_t *x1);

#endif
