#pragma once
// NumPy .npy files for 2-D fp32 (and fp16) matrices: how a table's rows are exported and imported
// (Store::export_npy / import_npy), so they can be inspected (and produced) with numpy.load / numpy.save.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace strata {

/// The parsed header of a .npy file.
struct NpyHeader {
  std::string descr;                ///< dtype string as written, e.g. "<f4"
  bool fortran_order = false;       ///< true: column-major data
  std::vector<std::int64_t> shape;  ///< dimensions, outermost first; empty for a scalar
  std::size_t data_offset = 0;      ///< bytes from the start of the file to the first element
};

/// Writes a (rows, cols) row-major fp32 matrix at `data` (host memory; may be nullptr when
/// rows * cols == 0) to `path` as .npy v1.0 ('<f4', C order, header padded to 64 bytes), atomically
/// (temp file, fsync, rename, fsync of the directory: `path` holds the old file or the complete new
/// one). kInvalidArgument for negative dimensions; kIoError naming the path when the OS refuses.
/// Thread-safe for distinct paths.
Status write_npy(const std::string& path, const float* data, std::int64_t rows, std::int64_t cols);
/// write_npy of fp16 elements (their bits, `core/half.hpp`): '<f2', numpy's float16.
Status write_npy_f16(const std::string& path, const std::uint16_t* bits, std::int64_t rows, std::int64_t cols);
/// write_npy of a vector of `n` int64 ('<i8', shape (n,)): a dynamic table's keys.
Status write_npy_i64(const std::string& path, const std::int64_t* data, std::int64_t n);

/// Parses the header at the start of `bytes` (the beginning of a .npy file: at least the whole
/// header; any data after it is ignored). Accepts versions 1.0, 2.0 and 3.0 and the dict layouts
/// numpy writes (any key order, extra whitespace, trailing commas, 1-d "(5,)" and scalar "()"
/// shapes, Python 2 "3L" integers). kDataLoss for a bad magic, a truncated or malformed header
/// (naming what was found and what was expected); kInvalidArgument for an unsupported version or a
/// structured dtype. Does not check the descr or the file size. Thread-safe.
Result<NpyHeader> parse_npy_header(const std::string& bytes);

/// Reads a .npy file that must hold exactly a (expected_rows, expected_cols) C-order matrix of '<f4'
/// (float32) or '<f2' (float16, widened to fp32 exactly) and returns its elements, row-major, in host
/// memory. Errors start with the path: kNotFound when the file is missing; kInvalidArgument for another
/// dtype ("dtype '<f8' is not supported (expected '<f4', little-endian float32, or '<f2', little-endian
/// float16)"), Fortran order, or another shape ("shape (3, 4) does not match the table (expected (3,
/// 5))"); kDataLoss for a corrupt header or a data section of the wrong size (naming the bytes found and
/// expected); kResourceExhausted when the matrix does not fit in memory; kIoError when the OS refuses.
/// Thread-safe.
Result<std::vector<float>> read_npy_matrix(const std::string& path, std::int64_t expected_rows,
                                           std::int64_t expected_cols);
/// Reads a .npy file of a vector of '<i8' (int64, shape (n,)), as write_npy_i64 writes it; errors as read_npy_matrix's.
Result<std::vector<std::int64_t>> read_npy_i64(const std::string& path);

}  // namespace strata
