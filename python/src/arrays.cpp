#include "python/src/arrays.hpp"

namespace strata::python {
namespace {

std::string shape_of(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) s += (d ? ", " : "") + std::to_string(a.shape(d));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

std::string dtype_of(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

std::string type_name(py::handle obj) { return py::str(py::type::of(obj).attr("__name__")).cast<std::string>(); }

// A torch tensor, duck-typed: the module does not link libtorch.
bool is_tensor(py::handle obj) {
  return py::hasattr(obj, "device") && py::hasattr(obj, "detach") && !py::isinstance<py::array>(obj);
}

}  // namespace

void throw_if_error(const Status& s) {
  switch (s.code()) {
    case StatusCode::kOk:
      return;
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kNotFound:
    case StatusCode::kAlreadyExists:
      throw py::value_error(s.to_string());
    default:
      throw std::runtime_error(s.to_string());  // pybind11 raises RuntimeError
  }
}

py::array as_array(py::handle obj, const std::string& what) {
  py::object o = py::reinterpret_borrow<py::object>(obj);
  // A torch tensor: refuse other devices by name, and detach so that NumPy may view a tensor that
  // requires grad.
  if (is_tensor(o)) {
    py::object device = o.attr("device");
    const std::string type = py::hasattr(device, "type") ? py::str(device.attr("type")).cast<std::string>() : "";
    if (type != "cpu")
      throw py::value_error(what + " is a tensor on " + py::str(device).cast<std::string>() +
                            " (expected a CPU tensor or a NumPy array; CUDA tensors wait for the device data path)");
    o = o.attr("detach")();
  }
  py::array a = py::array::ensure(o);
  if (!a) {
    PyErr_Clear();
    throw py::type_error(what + " is a " + type_name(o) + " (expected a NumPy array or a CPU torch tensor)");
  }
  return a;
}

std::vector<std::int64_t> to_int64_vector(py::handle obj, const std::string& what) {
  py::array a = as_array(obj, what);
  const char kind = a.dtype().kind();
  if (!(kind == 'i' && (a.itemsize() == 8 || a.itemsize() == 4)))
    throw py::type_error(what + " has dtype " + dtype_of(a) + " (expected int64, or int32 which is widened)");
  if (a.ndim() != 1) throw py::value_error(what + " has shape " + shape_of(a) + " (expected 1-D)");
  std::vector<std::int64_t> out(static_cast<std::size_t>(a.shape(0)));
  if (a.itemsize() == 8) {
    auto v = py::array_t<std::int64_t>(a).unchecked<1>();
    for (py::ssize_t i = 0; i < v.shape(0); ++i) out[static_cast<std::size_t>(i)] = v(i);
  } else {
    auto v = py::array_t<std::int32_t>(a).unchecked<1>();
    for (py::ssize_t i = 0; i < v.shape(0); ++i) out[static_cast<std::size_t>(i)] = v(i);
  }
  return out;
}

namespace {

py::array float_array(py::handle obj, const std::string& what, int ndim) {
  py::array a = as_array(obj, what);
  if (!(a.dtype().kind() == 'f' && a.itemsize() == 4))
    throw py::type_error(what + " has dtype " + dtype_of(a) + " (expected float32)");
  if (a.ndim() != ndim)
    throw py::value_error(what + " has shape " + shape_of(a) + " (expected " + std::to_string(ndim) + "-D)");
  return a;
}

// The entry `name` (or its alias) of a feature's mapping, or None.
py::object entry(const py::dict& d, const char* name, const char* alias) {
  if (d.contains(name)) return d[name];
  if (alias && d.contains(alias)) return d[alias];
  return py::none();
}

}  // namespace

KeyBatch to_key_batch(py::handle features) {
  if (!py::isinstance<py::dict>(features))
    throw py::type_error("features is a " + py::str(py::type::of(features).attr("__name__")).cast<std::string>() +
                         " (expected a dict {table: {'keys': ..., 'offsets' or 'lengths': ..., 'weights': ...}})");
  KeyBatch batch;
  for (auto [key, value] : py::reinterpret_borrow<py::dict>(features)) {
    if (!py::isinstance<py::str>(key))
      throw py::type_error("features key " + py::repr(key).cast<std::string>() + " (expected a table name)");
    JaggedKeys f;
    f.table = key.cast<std::string>();
    const std::string who = "table '" + f.table + "': ";
    if (!py::isinstance<py::dict>(value))
      throw py::type_error(who + "features value is a " +
                           py::str(py::type::of(value).attr("__name__")).cast<std::string>() +
                           " (expected a dict with 'keys' and 'offsets' or 'lengths')");
    const py::dict d = py::reinterpret_borrow<py::dict>(value);
    for (auto [k, v] : d) {
      (void)v;
      const std::string name = py::str(k).cast<std::string>();
      if (name != "keys" && name != "values" && name != "offsets" && name != "lengths" && name != "weights" &&
          name != "per_sample_weights")
        throw py::value_error(who + "unknown entry '" + name +
                              "' (expected keys (or values), offsets or lengths, and optional weights)");
    }
    py::object keys = entry(d, "keys", "values"), offsets = entry(d, "offsets", nullptr),
               lengths = entry(d, "lengths", nullptr), weights = entry(d, "weights", "per_sample_weights");
    if (keys.is_none()) throw py::value_error(who + "no 'keys' (expected a 1-D integer array)");
    if (offsets.is_none() == lengths.is_none())
      throw py::value_error(who + "give exactly one of 'offsets' (batch + 1) and 'lengths' (batch)");
    f.keys = to_int64_vector(keys, who + "keys");
    if (!offsets.is_none()) {
      f.offsets = to_int64_vector(offsets, who + "offsets");
    } else {
      const std::vector<std::int64_t> len = to_int64_vector(lengths, who + "lengths");
      f.offsets.assign(1, 0);
      for (std::size_t b = 0; b < len.size(); ++b) {
        if (len[b] < 0)
          throw py::value_error(who + "lengths[" + std::to_string(b) + "] = " + std::to_string(len[b]) +
                                " (expected >= 0)");
        f.offsets.push_back(f.offsets.back() + len[b]);
      }
    }
    if (!weights.is_none()) {
      auto w = py::array_t<float>(float_array(weights, who + "weights", 1)).unchecked<1>();
      f.weights.resize(static_cast<std::size_t>(w.shape(0)));
      for (py::ssize_t i = 0; i < w.shape(0); ++i) f.weights[static_cast<std::size_t>(i)] = w(i);
    }
    batch.features.push_back(std::move(f));
  }
  return batch;
}

py::array_t<float, py::array::c_style> to_float_matrix(py::handle obj, const std::string& what) {
  // A strided array becomes one C-contiguous copy; a contiguous one is used as is.
  return py::array_t<float, py::array::c_style>::ensure(float_array(obj, what, 2));
}

py::array_t<float> to_output_matrix(py::handle obj, const std::string& what) {
  // Anything else (a list) would be converted into a temporary copy: the caller would never see
  // what the store wrote.
  const bool tensor = is_tensor(obj);
  if (!tensor && !py::isinstance<py::array>(obj))
    throw py::type_error(what + " is a " + type_name(obj) +
                         " (expected a float32 NumPy array or CPU torch tensor to write into)");
  py::array a = float_array(obj, what, 2);
  if (!(a.flags() & py::array::c_style))
    throw py::value_error(what + " is not C-contiguous (expected a C-contiguous float32 array to write into)");
  if (!a.writeable()) throw py::value_error(what + " is read-only (expected a writable array)");
  py::array_t<float> out(a);
  // A float32 of another byte order converts into a copy, which would not reach the caller.
  if (out.data() != a.data())
    throw py::value_error(what + " is not in native byte order (expected a native float32 array to write into)");
  // The NumPy form of a tensor must be a view of its memory, not a copy.
  if (tensor && a.size() > 0 &&
      reinterpret_cast<std::uintptr_t>(a.data()) != obj.attr("data_ptr")().cast<std::uintptr_t>())
    throw py::value_error(what +
                          " is a tensor whose memory NumPy cannot view in place (expected a C-contiguous "
                          "float32 CPU tensor to write into)");
  return out;
}

}  // namespace strata::python
