/*
 * eager_fusion.h - eager evaluation's element-wise expressions, staged and
 * run as one fused loop (lang/eval.h: eval_fuse_try, eval_fuse_hook).
 *
 * Semantics are eager evaluation's, bit for bit: the staged tree performs
 * the float32 operations the operators would, in one pass over memory
 * (fused_loop.h's exactness).  Leaves are float32 arrays of one shape (not weak,
 * contiguous, varying over no mesh axis) and Python ints and floats, as
 * lang/eval_fusable.c checks; anything else is declined.
 * SHMAP_NO_EAGER_FUSION (any value) in the environment turns it off, for
 * comparing the two ways (tests/cli/eager_fusion.sh).
 */
#ifndef SHMAP_EAGER_FUSION_H
#define SHMAP_EAGER_FUSION_H

/* Sets eval_fuse_hook, unless SHMAP_NO_EAGER_FUSION is set.  Once, at
 * start-up (jit_register). */
void eager_fusion_register(void);

#endif
