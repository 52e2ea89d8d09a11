/*
 * npy.h - reading and writing NumPy's .npy files (load / save).
 *
 * Format (numpy.lib.format, "NEP 1"): the magic "\x93NUMPY", a major and a
 * minor version byte, the header length (2 bytes little-endian in version
 * 1.0, 4 bytes in 2.0 and 3.0), then the header, a Python dict literal
 *     {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
 * padded with spaces and a final '\n' so the data starts at a multiple of
 * 64 bytes, then the raw elements.
 *
 * Dtypes: '|b1' bool, '|i1' int8, 'i4' int32, 'i8' int64, 'f2' float16,
 * 'f4' float32, 'f8' float64, each with any byte order ('<', '>', '=',
 * '|').  NumPy has no bfloat16 (ml_dtypes stores it as an opaque '<V2',
 * which cannot be told apart from other 2-byte records), so npy_save
 * writes a bf16 array as float32, exactly (every bf16 is a float32), and
 * it loads back as float32.  Everything else (unsigned ints, complex,
 * strings, records, objects) is refused with an error naming the dtype.
 */
#ifndef SHMAP_NPY_H
#define SHMAP_NPY_H

#include "array/array.h"
#include "base/value.h"

/*
 * Reads the .npy file at [path] (versions 1.0, 2.0, 3.0; little- or
 * big-endian, swapped to native; C or Fortran order, the latter copied
 * into C order).  Returns a new C-contiguous, not weakly typed Array, or
 * NULL with an ERR_IO error that names the file and the problem: cannot
 * open, bad magic, unknown version, truncated header, malformed header
 * dict, unsupported dtype, bad shape, data shorter or longer than the
 * header's shape needs.  ERR_MEMORY when the array cannot be allocated.
 */
Value *npy_load(const char *path);

/*
 * Writes [a] (any layout; borrowed) to [path] as NumPy's np.save does:
 * version 1.0 (2.0 when the header does not fit in 65535 bytes), C order,
 * little-endian, header padded to 64 bytes; bf16 is written as '<f4' (see
 * above).  Returns 0, or -1 with an ERR_IO error naming the file (cannot
 * create, write failed) or ERR_MEMORY.
 */
int npy_save(const char *path, Array *a);

#endif
