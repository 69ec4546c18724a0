#pragma once
// Conversions between Python objects (NumPy arrays, CPU torch tensors through their __array__;
// device arrays through their __cuda_array_interface__) and Strata's views, with the checks and
// messages of the Python API. Every function here
// runs with the GIL held and throws pybind11 exceptions (TypeError, ValueError) on bad input;
// nothing here touches a Store.

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/key_batch.hpp"
#include "core/status.hpp"
#include "core/table_spec.hpp"

namespace strata::python {

namespace py = pybind11;

/// The name of `obj`'s type, for messages ("int", "Tensor").
std::string type_name(py::handle obj);

/// The scalar arguments of the public calls. Each raises TypeError naming the argument (`what`:
/// "batch_id", "table") and what was expected when `obj` has another type, so that no call reaches
/// pybind11's generic cast error:
///  - to_int: an int, or an integer with __index__ (NumPy integers, integer 0-d tensors); not a
///    bool, a float or a str. ValueError when it does not fit int64.
///  - to_number: an int or a float, or a real with __float__ (NumPy floats, 0-d tensors); not a
///    bool or a str. ValueError for an int no double holds (10**400).
///  - to_name: a str (a table name).
///  - to_path: a str, bytes or os.PathLike, as the file system's bytes (os.fsencode: a name that is
///    not UTF-8 is kept as it is). ValueError for a str it cannot encode or a NUL byte.
std::int64_t to_int(py::handle obj, const std::string& what);
double to_number(py::handle obj, const std::string& what);
std::string to_name(py::handle obj, const std::string& what);
std::string to_path(py::handle obj, const std::string& what);

/// Raises the Python exception that fits `s` (ValueError for bad arguments, unknown tables and
/// batch ids; RuntimeError otherwise) with the Status text (bytes that are not UTF-8, as in a file
/// name, shown as \xNN); returns when `s` is OK.
void throw_if_error(const Status& s);

/// A NumPy view of `obj`: a NumPy array as is, a CPU torch tensor without a copy (detached). A
/// tensor on another device (keys on CUDA among them: keys stay host memory) raises ValueError; anything without an
/// array form raises TypeError. `what` names the argument in messages ("table 'user': keys").
py::array as_array(py::handle obj, const std::string& what);

/// 1-D integer array -> int64 values (int64 copied, int32 widened; any other dtype is a
/// TypeError, e.g. float keys). Strided arrays are read in place.
std::vector<std::int64_t> to_int64_vector(py::handle obj, const std::string& what);

/// A batch from {feature: {"keys": ..., "offsets" | "lengths": ..., "weights": ... (optional)}}; int32 keys and
/// offsets go to JaggedKeys::keys32 and offsets32 as they are
/// (a dict keeps its order: outputs come back in that order). "values" is accepted for "keys" and
/// "per_sample_weights" for "weights" (TorchRec's and torch.nn.EmbeddingBag's names).
KeyBatch to_key_batch(py::handle features);

/// A float32 array of shape (rows, cols) that a C++ call reads: C-contiguous as given, or one
/// C-contiguous copy of a strided one. dtype other than float32 -> TypeError; not 2-D -> ValueError.
py::array_t<float, py::array::c_style> to_float_matrix(py::handle obj, const std::string& what);

/// A float32 view of `obj` (a NumPy array or a CPU torch tensor, nothing else: a list -> TypeError)
/// that a C++ call writes into in place: it must be C-contiguous, writable and 2-D. The caller
/// keeps the returned array alive until the C++ call returned (it holds the tensor's view).
py::array_t<float> to_output_matrix(py::handle obj, const std::string& what);

/// A host matrix of outputs or gradients for a forward or backward: float32 (fp32), float16
/// (fp16), or bf16 as a torch.bfloat16 CPU tensor or its bits in a 2-byte integer array (NumPy
/// has no bfloat16), 2-D and C-contiguous; `writable` (outputs): written in place, so it must be
/// writable and a view of the caller's memory (as to_output_matrix); read-only (gradients): a
/// strided array becomes one C-contiguous copy. The store checks the dtype against the table's
/// output_dtype. `array` keeps the memory alive until the C++ call returned.
struct HostMatrix {
  py::array array;
  DType dtype = DType::kF32;
};
HostMatrix to_host_matrix(py::handle obj, const std::string& what, bool writable);

/// Whether `obj` is device memory: a torch tensor on CUDA, or anything else with a
/// __cuda_array_interface__ (CuPy, Numba, strata.DeviceArray).
bool is_device_array(py::handle obj);

/// A float32 (rows, cols) C-contiguous matrix in device memory, read from the object's
/// __cuda_array_interface__ (a torch tensor's after detach()). The pointer is not checked here
/// (the store checks that it is memory of its device) and never dereferenced.
struct DeviceMatrix {
  std::uintptr_t ptr = 0;
  std::int64_t rows = 0, cols = 0;
  /// The interface's "stream" (version 3): the producer's stream, which the consumer must order
  /// after (a CUDA stream handle; 1 is the legacy default stream). false when absent or None.
  bool has_stream = false;
  std::uintptr_t stream = 0;
};
/// `obj` as a DeviceMatrix: dtype other than float32 -> TypeError; not 2-D, not C-contiguous, a
/// mask, or read-only when `writable` -> ValueError. `what` names the argument.
DeviceMatrix to_device_matrix(py::handle obj, const std::string& what, bool writable);

}  // namespace strata::python
