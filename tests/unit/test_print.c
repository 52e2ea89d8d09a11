/*
 * test_print.c - printing (print.c): arrays against the strings NumPy 1.24
 * prints (str) and JAX's Array repr built from NumPy's array2string, as
 * jax.Array.__repr__ does; scalars; summarisation and wrapping; print
 * options; and the Python forms of the other values.
 *
 * The expected strings below were produced by numpy itself (str(a), and
 * jax.Array.__repr__'s formula over np.array2string), not written by hand.
 */
#include <check.h>
#include <math.h>
#include <string.h>

#include "array/array.h"
#include "base/error.h"
#include "array/print.h"

/* One array case: dtype, weak flag, shape, values (or NULL: i * step). */
typedef struct PCase {
  const char *name;
  DType dtype;
  bool weak;
  int ndim;
  int64_t shape[4];
  int nvals;
  const double *vals;
  double step;
  const char *str;
  const char *repr;
} PCase;

/* ---- generated from NumPy -------------------------------------------------- */

static const PCase pcases[] = {
  {"ints", DT_I32, false, 1, {5}, 5, (const double[]){0x0.0p+0, 0x1.0000000000000p+0, 0x1.0000000000000p+1, 0x1.8000000000000p+1, 0x1.0000000000000p+2}, 0,
   "[0 1 2 3 4]",
   "Array([0, 1, 2, 3, 4], dtype=int32)"},
  {"floats_whole", DT_F32, false, 1, {3}, 3, (const double[]){0x0.0p+0, 0x1.0000000000000p+0, 0x1.0000000000000p+1}, 0,
   "[0. 1. 2.]",
   "Array([0., 1., 2.], dtype=float32)"},
  {"common_width", DT_F32, false, 1, {2}, 2, (const double[]){0x1.0000000000000p-1, 0x1.4000000000000p+0}, 0,
   "[0.5  1.25]",
   "Array([0.5 , 1.25], dtype=float32)"},
  {"sci_small", DT_F32, false, 1, {2}, 2, (const double[]){0x1.4f8b580000000p-17, 0x1.0000000000000p+0}, 0,
   "[1.e-05 1.e+00]",
   "Array([1.e-05, 1.e+00], dtype=float32)"},
  {"sci_ratio", DT_F64, false, 1, {2}, 2, (const double[]){0x1.0000000000000p+0, 0x1.f400000000000p+9}, 0,
   "[   1. 1000.]",
   "Array([   1., 1000.], dtype=float64)"},
  {"not_sci_ratio", DT_F64, false, 1, {2}, 2, (const double[]){0x1.0000000000000p+0, 0x1.f380000000000p+9}, 0,
   "[  1. 999.]",
   "Array([  1., 999.], dtype=float64)"},
  {"sci_big", DT_F64, false, 1, {2}, 2, (const double[]){0x1.7d78400000000p+26, 0x1.0000000000000p+0}, 0,
   "[1.e+08 1.e+00]",
   "Array([1.e+08, 1.e+00], dtype=float64)"},
  {"nan_inf", DT_F32, false, 1, {3}, 3, (const double[]){NAN, 0x1.8000000000000p+0, -INFINITY}, 0,
   "[ nan  1.5 -inf]",
   "Array([ nan,  1.5, -inf], dtype=float32)"},
  {"only_nonfinite", DT_F64, false, 1, {3}, 3, (const double[]){INFINITY, -INFINITY, NAN}, 0,
   "[ inf -inf  nan]",
   "Array([ inf, -inf,  nan], dtype=float64)"},
  {"nan_sci", DT_F64, false, 1, {2}, 2, (const double[]){NAN, 0x1.4f8b588e368f1p-17}, 0,
   "[   nan 1.e-05]",
   "Array([   nan, 1.e-05], dtype=float64)"},
  {"precision_cut", DT_F64, false, 1, {2}, 2, (const double[]){0x1.3333333333334p-2, 0x1.5555555555555p-2}, 0,
   "[0.3        0.33333333]",
   "Array([0.3       , 0.33333333], dtype=float64)"},
  {"f32_thirds", DT_F32, false, 1, {8}, 8, (const double[]){0x0.0p+0, 0x1.5555560000000p-2, 0x1.5555560000000p-1, 0x1.0000000000000p+0, 0x1.5555560000000p+0, 0x1.aaaaaa0000000p+0, 0x1.0000000000000p+1, 0x1.2aaaaa0000000p+1}, 0,
   "[0.         0.33333334 0.6666667  1.         1.3333334  1.6666666\n"
      " 2.         2.3333333 ]",
   "Array([0.        , 0.33333334, 0.6666667 , 1.        , 1.3333334 ,\n"
      "       1.6666666 , 2.        , 2.3333333 ], dtype=float32)"},
  {"neg_zero", DT_F64, false, 1, {2}, 2, (const double[]){-0.0, 0x1.0000000000000p+0}, 0,
   "[-0.  1.]",
   "Array([-0.,  1.], dtype=float64)"},
  {"bools", DT_BOOL, false, 1, {3}, 3, (const double[]){0x1.0000000000000p+0, 0x0.0p+0, 0x1.0000000000000p+0}, 0,
   "[ True False  True]",
   "Array([ True, False,  True], dtype=bool)"},
  {"bools_all_false", DT_BOOL, false, 1, {2}, 2, (const double[]){0x0.0p+0, 0x0.0p+0}, 0,
   "[False False]",
   "Array([False, False], dtype=bool)"},
  {"int8_neg", DT_I8, false, 1, {3}, 3, (const double[]){-0x1.0000000000000p+7, 0x1.4000000000000p+2, 0x1.fc00000000000p+6}, 0,
   "[-128    5  127]",
   "Array([-128,    5,  127], dtype=int8)"},
  {"int64_big", DT_I64, false, 1, {2}, 2, (const double[]){0x1.c6bf526340000p+49, -0x1.8000000000000p+1}, 0,
   "[1000000000000000               -3]",
   "Array([1000000000000000,               -3], dtype=int64)"},
  {"f16", DT_F16, false, 1, {3}, 3, (const double[]){0x1.9980000000000p-4, 0x1.5540000000000p-2, 0x1.0f00000000000p+15}, 0,
   "[9.998e-02 3.333e-01 3.469e+04]",
   "Array([9.998e-02, 3.333e-01, 3.469e+04], dtype=float16)"},
  {"matrix", DT_F32, false, 2, {3, 4}, 12, (const double[]){0x0.0p+0, 0x1.8000000000000p+0, 0x1.8000000000000p+1, 0x1.2000000000000p+2, 0x1.8000000000000p+2, 0x1.e000000000000p+2, 0x1.2000000000000p+3, 0x1.5000000000000p+3, 0x1.8000000000000p+3, 0x1.b000000000000p+3, 0x1.e000000000000p+3, 0x1.0800000000000p+4}, 0,
   "[[ 0.   1.5  3.   4.5]\n"
      " [ 6.   7.5  9.  10.5]\n"
      " [12.  13.5 15.  16.5]]",
   "Array([[ 0. ,  1.5,  3. ,  4.5],\n"
      "       [ 6. ,  7.5,  9. , 10.5],\n"
      "       [12. , 13.5, 15. , 16.5]], dtype=float32)"},
  {"cube", DT_I32, false, 3, {2, 3, 4}, 24, (const double[]){0x0.0p+0, 0x1.0000000000000p+0, 0x1.0000000000000p+1, 0x1.8000000000000p+1, 0x1.0000000000000p+2, 0x1.4000000000000p+2, 0x1.8000000000000p+2, 0x1.c000000000000p+2, 0x1.0000000000000p+3, 0x1.2000000000000p+3, 0x1.4000000000000p+3, 0x1.6000000000000p+3, 0x1.8000000000000p+3, 0x1.a000000000000p+3, 0x1.c000000000000p+3, 0x1.e000000000000p+3, 0x1.0000000000000p+4, 0x1.1000000000000p+4, 0x1.2000000000000p+4, 0x1.3000000000000p+4, 0x1.4000000000000p+4, 0x1.5000000000000p+4, 0x1.6000000000000p+4, 0x1.7000000000000p+4}, 0,
   "[[[ 0  1  2  3]\n"
      "  [ 4  5  6  7]\n"
      "  [ 8  9 10 11]]\n"
      "\n"
      " [[12 13 14 15]\n"
      "  [16 17 18 19]\n"
      "  [20 21 22 23]]]",
   "Array([[[ 0,  1,  2,  3],\n"
      "        [ 4,  5,  6,  7],\n"
      "        [ 8,  9, 10, 11]],\n"
      "\n"
      "       [[12, 13, 14, 15],\n"
      "        [16, 17, 18, 19],\n"
      "        [20, 21, 22, 23]]], dtype=int32)"},
  {"wrap", DT_F64, false, 1, {30}, 30, (const double[]){0x0.0p+0, 0x1.2492492492492p-3, 0x1.2492492492492p-2, 0x1.b6db6db6db6dbp-2, 0x1.2492492492492p-1, 0x1.6db6db6db6db7p-1, 0x1.b6db6db6db6dbp-1, 0x1.0000000000000p+0, 0x1.2492492492492p+0, 0x1.4924924924925p+0, 0x1.6db6db6db6db7p+0, 0x1.9249249249249p+0, 0x1.b6db6db6db6dbp+0, 0x1.db6db6db6db6ep+0, 0x1.0000000000000p+1, 0x1.1249249249249p+1, 0x1.2492492492492p+1, 0x1.36db6db6db6dbp+1, 0x1.4924924924925p+1, 0x1.5b6db6db6db6ep+1, 0x1.6db6db6db6db7p+1, 0x1.8000000000000p+1, 0x1.9249249249249p+1, 0x1.a492492492492p+1, 0x1.b6db6db6db6dbp+1, 0x1.c924924924925p+1, 0x1.db6db6db6db6ep+1, 0x1.edb6db6db6db7p+1, 0x1.0000000000000p+2, 0x1.0924924924925p+2}, 0,
   "[0.         0.14285714 0.28571429 0.42857143 0.57142857 0.71428571\n"
      " 0.85714286 1.         1.14285714 1.28571429 1.42857143 1.57142857\n"
      " 1.71428571 1.85714286 2.         2.14285714 2.28571429 2.42857143\n"
      " 2.57142857 2.71428571 2.85714286 3.         3.14285714 3.28571429\n"
      " 3.42857143 3.57142857 3.71428571 3.85714286 4.         4.14285714]",
   "Array([0.        , 0.14285714, 0.28571429, 0.42857143, 0.57142857,\n"
      "       0.71428571, 0.85714286, 1.        , 1.14285714, 1.28571429,\n"
      "       1.42857143, 1.57142857, 1.71428571, 1.85714286, 2.        ,\n"
      "       2.14285714, 2.28571429, 2.42857143, 2.57142857, 2.71428571,\n"
      "       2.85714286, 3.        , 3.14285714, 3.28571429, 3.42857143,\n"
      "       3.57142857, 3.71428571, 3.85714286, 4.        , 4.14285714],      dtype=float64)"},
  {"wrap_f32_2d", DT_F32, false, 2, {3, 20}, 60, (const double[]){0x0.0p+0, 0x1.7ae1480000000p-2, 0x1.7ae1480000000p-1, 0x1.1c28f60000000p+0, 0x1.7ae1480000000p+0, 0x1.d9999a0000000p+0, 0x1.1c28f60000000p+1, 0x1.4b85200000000p+1, 0x1.7ae1480000000p+1, 0x1.aa3d700000000p+1, 0x1.d9999a0000000p+1, 0x1.047ae20000000p+2, 0x1.1c28f60000000p+2, 0x1.33d70a0000000p+2, 0x1.4b85200000000p+2, 0x1.6333340000000p+2, 0x1.7ae1480000000p+2, 0x1.928f5c0000000p+2, 0x1.aa3d700000000p+2, 0x1.c1eb860000000p+2, 0x1.d9999a0000000p+2, 0x1.f147ae0000000p+2, 0x1.047ae20000000p+3, 0x1.1051ec0000000p+3, 0x1.1c28f60000000p+3, 0x1.2800000000000p+3, 0x1.33d70a0000000p+3, 0x1.3fae140000000p+3, 0x1.4b85200000000p+3, 0x1.575c2a0000000p+3, 0x1.6333340000000p+3, 0x1.6f0a3e0000000p+3, 0x1.7ae1480000000p+3, 0x1.86b8520000000p+3, 0x1.928f5c0000000p+3, 0x1.9e66660000000p+3, 0x1.aa3d700000000p+3, 0x1.b6147c0000000p+3, 0x1.c1eb860000000p+3, 0x1.cdc2900000000p+3, 0x1.d9999a0000000p+3, 0x1.e570a40000000p+3, 0x1.f147ae0000000p+3, 0x1.fd1eb80000000p+3, 0x1.047ae20000000p+4, 0x1.0a66660000000p+4, 0x1.1051ec0000000p+4, 0x1.163d700000000p+4, 0x1.1c28f60000000p+4, 0x1.22147c0000000p+4, 0x1.2800000000000p+4, 0x1.2deb860000000p+4, 0x1.33d70a0000000p+4, 0x1.39c2900000000p+4, 0x1.3fae140000000p+4, 0x1.45999a0000000p+4, 0x1.4b85200000000p+4, 0x1.5170a40000000p+4, 0x1.575c2a0000000p+4, 0x1.5d47ae0000000p+4}, 0,
   "[[ 0.         0.37       0.74       1.11       1.48       1.85\n"
      "   2.22       2.5900002  2.96       3.33       3.7        4.07\n"
      "   4.44       4.81       5.1800003  5.55       5.92       6.29\n"
      "   6.66       7.03     ]\n"
      " [ 7.4        7.77       8.14       8.51       8.88       9.25\n"
      "   9.62       9.99      10.360001  10.7300005 11.1       11.47\n"
      "  11.84      12.21      12.58      12.95      13.32      13.690001\n"
      "  14.06      14.43     ]\n"
      " [14.8       15.17      15.54      15.91      16.28      16.65\n"
      "  17.02      17.39      17.76      18.130001  18.5       18.87\n"
      "  19.24      19.61      19.98      20.35      20.720001  21.09\n"
      "  21.460001  21.83     ]]",
   "Array([[ 0.       ,  0.37     ,  0.74     ,  1.11     ,  1.48     ,\n"
      "         1.85     ,  2.22     ,  2.5900002,  2.96     ,  3.33     ,\n"
      "         3.7      ,  4.07     ,  4.44     ,  4.81     ,  5.1800003,\n"
      "         5.55     ,  5.92     ,  6.29     ,  6.66     ,  7.03     ],\n"
      "       [ 7.4      ,  7.77     ,  8.14     ,  8.51     ,  8.88     ,\n"
      "         9.25     ,  9.62     ,  9.99     , 10.360001 , 10.7300005,\n"
      "        11.1      , 11.47     , 11.84     , 12.21     , 12.58     ,\n"
      "        12.95     , 13.32     , 13.690001 , 14.06     , 14.43     ],\n"
      "       [14.8      , 15.17     , 15.54     , 15.91     , 16.28     ,\n"
      "        16.65     , 17.02     , 17.39     , 17.76     , 18.130001 ,\n"
      "        18.5      , 18.87     , 19.24     , 19.61     , 19.98     ,\n"
      "        20.35     , 20.720001 , 21.09     , 21.460001 , 21.83     ]],      dtype=float32)"},
  {"summary_1d", DT_F32, false, 1, {2000}, 0, NULL, 1.0,
   "[0.000e+00 1.000e+00 2.000e+00 ... 1.997e+03 1.998e+03 1.999e+03]",
   "Array([0.000e+00, 1.000e+00, 2.000e+00, ..., 1.997e+03, 1.998e+03,\n"
      "       1.999e+03], dtype=float32)"},
  {"summary_3d", DT_I32, false, 3, {10, 20, 15}, 0, NULL, 1.0,
   "[[[   0    1    2 ...   12   13   14]\n"
      "  [  15   16   17 ...   27   28   29]\n"
      "  [  30   31   32 ...   42   43   44]\n"
      "  ...\n"
      "  [ 255  256  257 ...  267  268  269]\n"
      "  [ 270  271  272 ...  282  283  284]\n"
      "  [ 285  286  287 ...  297  298  299]]\n"
      "\n"
      " [[ 300  301  302 ...  312  313  314]\n"
      "  [ 315  316  317 ...  327  328  329]\n"
      "  [ 330  331  332 ...  342  343  344]\n"
      "  ...\n"
      "  [ 555  556  557 ...  567  568  569]\n"
      "  [ 570  571  572 ...  582  583  584]\n"
      "  [ 585  586  587 ...  597  598  599]]\n"
      "\n"
      " [[ 600  601  602 ...  612  613  614]\n"
      "  [ 615  616  617 ...  627  628  629]\n"
      "  [ 630  631  632 ...  642  643  644]\n"
      "  ...\n"
      "  [ 855  856  857 ...  867  868  869]\n"
      "  [ 870  871  872 ...  882  883  884]\n"
      "  [ 885  886  887 ...  897  898  899]]\n"
      "\n"
      " ...\n"
      "\n"
      " [[2100 2101 2102 ... 2112 2113 2114]\n"
      "  [2115 2116 2117 ... 2127 2128 2129]\n"
      "  [2130 2131 2132 ... 2142 2143 2144]\n"
      "  ...\n"
      "  [2355 2356 2357 ... 2367 2368 2369]\n"
      "  [2370 2371 2372 ... 2382 2383 2384]\n"
      "  [2385 2386 2387 ... 2397 2398 2399]]\n"
      "\n"
      " [[2400 2401 2402 ... 2412 2413 2414]\n"
      "  [2415 2416 2417 ... 2427 2428 2429]\n"
      "  [2430 2431 2432 ... 2442 2443 2444]\n"
      "  ...\n"
      "  [2655 2656 2657 ... 2667 2668 2669]\n"
      "  [2670 2671 2672 ... 2682 2683 2684]\n"
      "  [2685 2686 2687 ... 2697 2698 2699]]\n"
      "\n"
      " [[2700 2701 2702 ... 2712 2713 2714]\n"
      "  [2715 2716 2717 ... 2727 2728 2729]\n"
      "  [2730 2731 2732 ... 2742 2743 2744]\n"
      "  ...\n"
      "  [2955 2956 2957 ... 2967 2968 2969]\n"
      "  [2970 2971 2972 ... 2982 2983 2984]\n"
      "  [2985 2986 2987 ... 2997 2998 2999]]]",
   "Array([[[   0,    1,    2, ...,   12,   13,   14],\n"
      "        [  15,   16,   17, ...,   27,   28,   29],\n"
      "        [  30,   31,   32, ...,   42,   43,   44],\n"
      "        ...,\n"
      "        [ 255,  256,  257, ...,  267,  268,  269],\n"
      "        [ 270,  271,  272, ...,  282,  283,  284],\n"
      "        [ 285,  286,  287, ...,  297,  298,  299]],\n"
      "\n"
      "       [[ 300,  301,  302, ...,  312,  313,  314],\n"
      "        [ 315,  316,  317, ...,  327,  328,  329],\n"
      "        [ 330,  331,  332, ...,  342,  343,  344],\n"
      "        ...,\n"
      "        [ 555,  556,  557, ...,  567,  568,  569],\n"
      "        [ 570,  571,  572, ...,  582,  583,  584],\n"
      "        [ 585,  586,  587, ...,  597,  598,  599]],\n"
      "\n"
      "       [[ 600,  601,  602, ...,  612,  613,  614],\n"
      "        [ 615,  616,  617, ...,  627,  628,  629],\n"
      "        [ 630,  631,  632, ...,  642,  643,  644],\n"
      "        ...,\n"
      "        [ 855,  856,  857, ...,  867,  868,  869],\n"
      "        [ 870,  871,  872, ...,  882,  883,  884],\n"
      "        [ 885,  886,  887, ...,  897,  898,  899]],\n"
      "\n"
      "       ...,\n"
      "\n"
      "       [[2100, 2101, 2102, ..., 2112, 2113, 2114],\n"
      "        [2115, 2116, 2117, ..., 2127, 2128, 2129],\n"
      "        [2130, 2131, 2132, ..., 2142, 2143, 2144],\n"
      "        ...,\n"
      "        [2355, 2356, 2357, ..., 2367, 2368, 2369],\n"
      "        [2370, 2371, 2372, ..., 2382, 2383, 2384],\n"
      "        [2385, 2386, 2387, ..., 2397, 2398, 2399]],\n"
      "\n"
      "       [[2400, 2401, 2402, ..., 2412, 2413, 2414],\n"
      "        [2415, 2416, 2417, ..., 2427, 2428, 2429],\n"
      "        [2430, 2431, 2432, ..., 2442, 2443, 2444],\n"
      "        ...,\n"
      "        [2655, 2656, 2657, ..., 2667, 2668, 2669],\n"
      "        [2670, 2671, 2672, ..., 2682, 2683, 2684],\n"
      "        [2685, 2686, 2687, ..., 2697, 2698, 2699]],\n"
      "\n"
      "       [[2700, 2701, 2702, ..., 2712, 2713, 2714],\n"
      "        [2715, 2716, 2717, ..., 2727, 2728, 2729],\n"
      "        [2730, 2731, 2732, ..., 2742, 2743, 2744],\n"
      "        ...,\n"
      "        [2955, 2956, 2957, ..., 2967, 2968, 2969],\n"
      "        [2970, 2971, 2972, ..., 2982, 2983, 2984],\n"
      "        [2985, 2986, 2987, ..., 2997, 2998, 2999]]], dtype=int32)"},
  {"summary_2d_f64", DT_F64, false, 2, {40, 40}, 0, NULL, 0.5,
   "[[0.000e+00 5.000e-01 1.000e+00 ... 1.850e+01 1.900e+01 1.950e+01]\n"
      " [2.000e+01 2.050e+01 2.100e+01 ... 3.850e+01 3.900e+01 3.950e+01]\n"
      " [4.000e+01 4.050e+01 4.100e+01 ... 5.850e+01 5.900e+01 5.950e+01]\n"
      " ...\n"
      " [7.400e+02 7.405e+02 7.410e+02 ... 7.585e+02 7.590e+02 7.595e+02]\n"
      " [7.600e+02 7.605e+02 7.610e+02 ... 7.785e+02 7.790e+02 7.795e+02]\n"
      " [7.800e+02 7.805e+02 7.810e+02 ... 7.985e+02 7.990e+02 7.995e+02]]",
   "Array([[0.000e+00, 5.000e-01, 1.000e+00, ..., 1.850e+01, 1.900e+01,\n"
      "        1.950e+01],\n"
      "       [2.000e+01, 2.050e+01, 2.100e+01, ..., 3.850e+01, 3.900e+01,\n"
      "        3.950e+01],\n"
      "       [4.000e+01, 4.050e+01, 4.100e+01, ..., 5.850e+01, 5.900e+01,\n"
      "        5.950e+01],\n"
      "       ...,\n"
      "       [7.400e+02, 7.405e+02, 7.410e+02, ..., 7.585e+02, 7.590e+02,\n"
      "        7.595e+02],\n"
      "       [7.600e+02, 7.605e+02, 7.610e+02, ..., 7.785e+02, 7.790e+02,\n"
      "        7.795e+02],\n"
      "       [7.800e+02, 7.805e+02, 7.810e+02, ..., 7.985e+02, 7.990e+02,\n"
      "        7.995e+02]], dtype=float64)"},
  {"empty_2d", DT_F32, false, 2, {0, 3}, 0, NULL, 0,
   "[]",
   "Array([], shape=(0, 3), dtype=float32)"},
  {"empty_1d", DT_I32, false, 1, {0}, 0, NULL, 0,
   "[]",
   "Array([], shape=(0,), dtype=int32)"},
  {"scalar_f32", DT_F32, false, 0, {0}, 1, (const double[]){0x1.8000000000000p+1}, 0,
   "3.0",
   "Array(3., dtype=float32)"},
  {"scalar_f32_e", DT_F32, false, 0, {0}, 1, (const double[]){0x1.26bb1c0000000p+1}, 0,
   "2.3025851",
   "Array(2.3025851, dtype=float32)"},
  {"scalar_tiny", DT_F64, false, 0, {0}, 1, (const double[]){0x1.4f8b588e368f1p-17}, 0,
   "1e-05",
   "Array(1.e-05, dtype=float64)"},
  {"scalar_big", DT_F64, false, 0, {0}, 1, (const double[]){0x1.1c37937e08000p+53}, 0,
   "1e+16",
   "Array(1.e+16, dtype=float64)"},
  {"scalar_int_weak", DT_I32, true, 0, {0}, 1, (const double[]){0x1.8000000000000p+1}, 0,
   "3",
   "Array(3, dtype=int32, weak_type=True)"},
  {"scalar_float_weak", DT_F32, true, 0, {0}, 1, (const double[]){0x1.4000000000000p+1}, 0,
   "2.5",
   "Array(2.5, dtype=float32, weak_type=True)"},
  {"scalar_bool", DT_BOOL, false, 0, {0}, 1, (const double[]){0x1.0000000000000p+0}, 0,
   "True",
   "Array(True, dtype=bool)"},
  {"scalar_nan", DT_F32, false, 0, {0}, 1, (const double[]){NAN}, 0,
   "nan",
   "Array(nan, dtype=float32)"},
  {"weak_vector", DT_F32, true, 1, {2}, 2, (const double[]){0x1.0000000000000p+0, 0x1.0000000000000p+1}, 0,
   "[1. 2.]",
   "Array([1., 2.], dtype=float32, weak_type=True)"},
  {"random_f32", DT_F32, false, 2, {4, 5}, 20, (const double[]){0x1.c398f00000000p+0, 0x1.99c2d00000000p-2, 0x1.f51d260000000p-1, 0x1.1ed5960000000p+1, 0x1.de18480000000p+0, -0x1.f45dc40000000p-1, 0x1.e671fe0000000p-1, -0x1.35fac40000000p-3, -0x1.a6c8d00000000p-4, 0x1.a473f00000000p-2, 0x1.2700500000000p-3, 0x1.744b440000000p+0, 0x1.85a6bc0000000p-1, 0x1.f261800000000p-4, 0x1.c684160000000p-2, 0x1.55aeba0000000p-2, 0x1.7e7bf80000000p+0, -0x1.a42a040000000p-3, 0x1.4094d20000000p-2, -0x1.b54c0a0000000p-1}, 0,
   "[[ 1.7640524   0.4001572   0.978738    2.2408931   1.867558  ]\n"
      " [-0.9772779   0.95008844 -0.1513572  -0.10321885  0.41059852]\n"
      " [ 0.14404356  1.4542735   0.7610377   0.12167501  0.44386324]\n"
      " [ 0.33367434  1.4940791  -0.20515826  0.3130677  -0.85409576]]",
   "Array([[ 1.7640524 ,  0.4001572 ,  0.978738  ,  2.2408931 ,  1.867558  ],\n"
      "       [-0.9772779 ,  0.95008844, -0.1513572 , -0.10321885,  0.41059852],\n"
      "       [ 0.14404356,  1.4542735 ,  0.7610377 ,  0.12167501,  0.44386324],\n"
      "       [ 0.33367434,  1.4940791 , -0.20515826,  0.3130677 , -0.85409576]],      dtype=float32)"},
  {"random_f64_sci", DT_F64, false, 2, {3, 3}, 9, (const double[]){-0x1.56a80fe7a2b10p-19, 0x1.5ee8a7ddbc3aap-21, 0x1.d01734de23732p-21, -0x1.8e72623ab321fp-21, 0x1.30a42ccf68120p-19, -0x1.86673f862ef5bp-20, 0x1.89100b2ef85f5p-25, -0x1.91f968e9cf177p-23, 0x1.9b73c91aa040fp-20}, 0,
   "[[-2.55298982e-06  6.53618595e-07  8.64436199e-07]\n"
      " [-7.42165020e-07  2.26975462e-06 -1.45436567e-06]\n"
      " [ 4.57585173e-08 -1.87183850e-07  1.53277921e-06]]",
   "Array([[-2.55298982e-06,  6.53618595e-07,  8.64436199e-07],\n"
      "       [-7.42165020e-07,  2.26975462e-06, -1.45436567e-06],\n"
      "       [ 4.57585173e-08, -1.87183850e-07,  1.53277921e-06]],      dtype=float64)"},
  {"col", DT_F64, false, 2, {4, 1}, 4, (const double[]){0x0.0p+0, 0x1.0000000000000p+0, 0x1.0000000000000p+1, 0x1.8000000000000p+1}, 0,
   "[[0.]\n"
      " [1.]\n"
      " [2.]\n"
      " [3.]]",
   "Array([[0.],\n"
      "       [1.],\n"
      "       [2.],\n"
      "       [3.]], dtype=float64)"},
};

/* Builds the array of case [c]: values made in f64, then converted. */
static Array *make_case(const PCase *c) {
  Array *f = arr_new(DT_F64, c->ndim, c->shape);
  double *d = arr_data(f);
  for (int64_t i = 0; i < f->size; i++)
    d[i] = c->vals ? c->vals[i] : (double)i * c->step;
  Array *a = arr_astype(f, c->dtype, c->weak);
  val_decref(&f->hdr);
  return a;
}

/* str(v) as a C string compared to [want]; releases the Str. */
static void expect_str(Value *s, const char *want, const char *name) {
  ck_assert_msg(s != NULL, "%s: %s", name, err_message());
  ck_assert_msg(strcmp(str_cstr(s), want) == 0, "%s:\n got: %s\nwant: %s", name,
                str_cstr(s), want);
  val_decref(s);
}

START_TEST(test_array_cases) {
  const PCase *c = &pcases[_i];
  Array *a = make_case(c);
  ck_assert_ptr_nonnull(a);
  expect_str(val_str(&a->hdr), c->str, c->name);
  expect_str(val_repr(&a->hdr), c->repr, c->name);
  val_decref(&a->hdr);
}
END_TEST

/* A transposed view prints its logical order, not its memory order. */
START_TEST(test_view_prints_logical_order) {
  int64_t shape[] = {2, 3}, tshape[] = {3, 2}, tstr[] = {1, 3};
  Array *a = arr_new(DT_I32, 2, shape);
  int32_t *d = arr_data(a);
  for (int i = 0; i < 6; i++)
    d[i] = i;
  Array *t = arr_view(a, 2, tshape, tstr, 0);
  expect_str(val_str(&t->hdr), "[[0 3]\n [1 4]\n [2 5]]", "transpose");
  val_decref(&t->hdr);
  val_decref(&a->hdr);
}
END_TEST

START_TEST(test_bf16_prints_its_own_shortest) {
  /* bf16(0.1) is 0.10009765625, but "0.1" already reads back as it */
  Array *a = arr_scalar_f64(DT_BF16, 0.1, false);
  expect_str(val_str(&a->hdr), "0.1", "bf16 scalar");
  val_decref(&a->hdr);
  int64_t shape[] = {2};
  Array *f = arr_new(DT_F32, 1, shape);
  ((float *)arr_data(f))[0] = 1.0f;
  ((float *)arr_data(f))[1] = 3.140625f;
  Array *b = arr_astype(f, DT_BF16, false);
  expect_str(val_str(&b->hdr), "[1.   3.14]", "bf16 vector");
  expect_str(val_repr(&b->hdr), "Array([1.  , 3.14], dtype=bfloat16)", "bf16 repr");
  val_decref(&b->hdr);
  val_decref(&f->hdr);
}
END_TEST

START_TEST(test_float_scalar_helper) {
  char buf[64];
  print_float_scalar(buf, sizeof buf, 0.1f, DT_F32);
  ck_assert_str_eq(buf, "0.1");
  print_float_scalar(buf, sizeof buf, 1e-5, DT_F64);
  ck_assert_str_eq(buf, "1e-05");
  print_float_scalar(buf, sizeof buf, 1.5e-7, DT_F64);
  ck_assert_str_eq(buf, "1.5e-07");
  print_float_scalar(buf, sizeof buf, 123456789.0f, DT_F32);
  ck_assert_str_eq(buf, "123456790.0");
  print_float_scalar(buf, sizeof buf, -0.0, DT_F64);
  ck_assert_str_eq(buf, "-0.0");
  print_float_scalar(buf, sizeof buf, -INFINITY, DT_F32);
  ck_assert_str_eq(buf, "-inf");
}
END_TEST

START_TEST(test_print_options) {
  PrintOptions saved = print_options, o = print_options;
  o.threshold = 5;
  o.edgeitems = 2;
  o.precision = 3;
  ck_assert_int_eq(print_set_options(&o), 0);
  int64_t shape[] = {7};
  Array *a = arr_new(DT_F64, 1, shape);
  for (int i = 0; i < 7; i++)
    ((double *)arr_data(a))[i] = i / 3.0;
  /* np.set_printoptions(threshold=5, edgeitems=2, precision=3) */
  expect_str(val_str(&a->hdr), "[0.    0.333 ... 1.667 2.   ]", "options");
  o.precision = -1;
  err_clear();
  ck_assert_int_eq(print_set_options(&o), -1);
  ck_assert_ptr_nonnull(strstr(err_message(), "precision"));
  ck_assert_int_eq(print_options.precision, 3);   /* unchanged on error */
  ck_assert_int_eq(print_set_options(&saved), 0);
  val_decref(&a->hdr);
}
END_TEST

START_TEST(test_linewidth_option) {
  PrintOptions saved = print_options, o = print_options;
  o.linewidth = 20;
  ck_assert_int_eq(print_set_options(&o), 0);
  int64_t shape[] = {10};
  Array *a = arr_new(DT_I32, 1, shape);
  for (int i = 0; i < 10; i++)
    ((int32_t *)arr_data(a))[i] = i * 10;
  /* np.set_printoptions(linewidth=20) */
  expect_str(val_str(&a->hdr), "[ 0 10 20 30 40 50\n 60 70 80 90]", "linewidth");
  print_set_options(&saved);
  val_decref(&a->hdr);
}
END_TEST

/* ---- Python's forms ------------------------------------------------------ */

/* A Python int (array.h: a host number), as literals and len() make. */
static Value *weak_int(int64_t x) { return arr_python_int(x); }

START_TEST(test_strings) {
  Value *s = str_from("it's");
  expect_str(val_str(s), "it's", "str");
  expect_str(val_repr(s), "\"it's\"", "repr with '");
  val_decref(s);
  s = str_from("a\"b'c\\\n\t\x01");
  expect_str(val_repr(s), "'a\"b\\'c\\\\\\n\\t\\x01'", "repr with both quotes");
  val_decref(s);
  s = str_from("");
  expect_str(val_repr(s), "''", "empty");
  val_decref(s);
}
END_TEST

START_TEST(test_tuples_lists_dicts) {
  Value *t = tuple_new(2);
  tuple_set_steal(t, 0, weak_int(8));
  tuple_set_steal(t, 1, weak_int(32));
  expect_str(val_str(t), "(8, 32)", "shape tuple");
  Value *one = tuple_new(1);
  tuple_set_steal(one, 0, weak_int(8));
  expect_str(val_repr(one), "(8,)", "1-tuple");
  Value *empty = tuple_new(0);
  expect_str(val_repr(empty), "()", "0-tuple");
  Value *l = list_new(0);
  list_append(l, t);
  list_append(l, VAL_NONE);
  list_append_steal(l, str_from("x"));
  list_append(l, val_true());
  expect_str(val_str(l), "[(8, 32), None, 'x', True]", "list");
  Value *d = dict_new();
  dict_set_str(d, "i", tuple_get(t, 0));
  Value *four = weak_int(4);
  dict_set_str(d, "j", four);
  expect_str(val_str(d), "{'i': 8, 'j': 4}", "dict");
  Value *ed = dict_new();
  expect_str(val_str(ed), "{}", "empty dict");
  val_decref(t);
  val_decref(one);
  val_decref(empty);
  val_decref(l);
  val_decref(d);
  val_decref(ed);
  val_decref(four);
}
END_TEST

START_TEST(test_arrays_inside_containers_use_repr) {
  int64_t shape[] = {2};
  Array *x = arr_new(DT_F32, 1, shape);
  ((float *)arr_data(x))[0] = 1.0f;
  ((float *)arr_data(x))[1] = 2.5f;
  Value *f = arr_python_float(0.1);
  Value *g = &arr_scalar_f64(DT_F32, 2.0, false)->hdr;
  Value *w = &arr_scalar_f64(DT_F32, 0.5, true)->hdr;   /* weak, not a Python number */
  Value *t = tuple_new(4);
  tuple_set_steal(t, 0, val_incref(&x->hdr));
  tuple_set_steal(t, 1, f);
  tuple_set_steal(t, 2, g);
  tuple_set_steal(t, 3, w);
  expect_str(val_str(t), "(Array([1. , 2.5], dtype=float32), 0.1, "
             "Array(2., dtype=float32), Array(0.5, dtype=float32, weak_type=True))",
             "tuple of arrays");
  val_decref(t);
  val_decref(&x->hdr);
}
END_TEST

START_TEST(test_other_values) {
  expect_str(val_str(VAL_NONE), "None", "None");
  expect_str(val_repr(VAL_ELLIPSIS), "Ellipsis", "Ellipsis");
  Value *r = range_new(0, 5, 1);
  expect_str(val_str(r), "range(0, 5)", "range");
  val_decref(r);
  r = range_new(10, 0, -2);
  expect_str(val_repr(r), "range(10, 0, -2)", "range step");
  val_decref(r);
  Value *one = weak_int(1);
  Value *s = slice_new(one, VAL_NONE, VAL_NONE);
  expect_str(val_repr(s), "slice(1, None, None)", "slice");
  val_decref(s);
  val_decref(one);
  expect_str(val_str(dtype_value(DT_F32)), "float32", "dtype str");
  expect_str(val_repr(dtype_value(DT_BF16)), "dtype('bfloat16')", "dtype repr");
  Value *b = builtin_new("sum", NULL, "sum of elements");
  expect_str(val_repr(b), "<built-in function sum>", "builtin");
  val_decref(b);
  Value *g = dict_new();
  Value *m = module_new("nn", g);
  expect_str(val_repr(m), "<module 'nn'>", "module");
  val_decref(m);
  val_decref(g);
}
END_TEST

static Value *mesh_repr(Value *v) {
  (void)v;
  return str_from("Mesh('i': 4, 'j': 2)");
}

START_TEST(test_registration_hook) {
  Value fake;
  val_init(&fake, V_MESH);
  fake.flags = VAL_IMMORTAL;   /* never freed: it lives on the stack */
  expect_str(val_repr(&fake), "<Mesh>", "default: the type's name");
  print_register(V_MESH, NULL, mesh_repr);
  expect_str(val_repr(&fake), "Mesh('i': 4, 'j': 2)", "registered repr");
  expect_str(val_str(&fake), "Mesh('i': 4, 'j': 2)", "str falls back to repr");
  print_register(V_MESH, NULL, NULL);
}
END_TEST

static Suite *print_suite(void) {
  Suite *s = suite_create("print");
  TCase *tc = tcase_create("arrays");
  tcase_add_loop_test(tc, test_array_cases, 0, (int)(sizeof pcases / sizeof pcases[0]));
  tcase_add_test(tc, test_view_prints_logical_order);
  tcase_add_test(tc, test_bf16_prints_its_own_shortest);
  tcase_add_test(tc, test_float_scalar_helper);
  tcase_add_test(tc, test_print_options);
  tcase_add_test(tc, test_linewidth_option);
  suite_add_tcase(s, tc);
  TCase *tp = tcase_create("python");
  tcase_add_test(tp, test_strings);
  tcase_add_test(tp, test_tuples_lists_dicts);
  tcase_add_test(tp, test_arrays_inside_containers_use_repr);
  tcase_add_test(tp, test_other_values);
  tcase_add_test(tp, test_registration_hook);
  suite_add_tcase(s, tp);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(print_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
