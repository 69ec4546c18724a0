#include "python/src/arrays.hpp"

#include <pybind11/stl.h>

namespace strata::python {
namespace {

std::string shape_of(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) s += (d ? ", " : "") + std::to_string(a.shape(d));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

std::string dtype_of(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// A torch tensor, duck-typed: the module does not link libtorch.
bool is_tensor(py::handle obj) {
  return py::hasattr(obj, "device") && py::hasattr(obj, "detach") && !py::isinstance<py::array>(obj);
}

// Whether each element of `a` lies at a multiple of its size (NumPy's ALIGNED flag): the store
// loads and stores whole elements.
bool aligned(const py::array& a) { return (a.flags() & py::detail::npy_api::NPY_ARRAY_ALIGNED_) != 0; }

}  // namespace

std::string type_name(py::handle obj) { return py::str(py::type::of(obj).attr("__name__")).cast<std::string>(); }

std::int64_t to_int(py::handle obj, const std::string& what) {
  if (py::isinstance<py::bool_>(obj) || py::isinstance(obj, py::module_::import("numpy").attr("bool_")) ||
      !PyIndex_Check(obj.ptr()))
    throw py::type_error(what + " is a " + type_name(obj) + " (expected an int)");
  py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(obj.ptr()));
  if (!i) {  // an __index__ that refused (a float tensor, a tensor of several elements)
    PyErr_Clear();
    throw py::type_error(what + " is a " + type_name(obj) + " that is not an integer (expected an int)");
  }
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow)
    throw py::value_error(what + " " + py::repr(i).cast<std::string>() +
                          " is out of range (expected an int64: from -2^63 to 2^63 - 1)");
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return static_cast<std::int64_t>(v);
}

double to_number(py::handle obj, const std::string& what) {
  const bool text = py::isinstance<py::str>(obj) || py::isinstance<py::bytes>(obj);
  if (!text && !py::isinstance<py::bool_>(obj) && !py::isinstance(obj, py::module_::import("numpy").attr("bool_"))) {
    const double d = PyFloat_AsDouble(obj.ptr());
    if (!(d == -1.0 && PyErr_Occurred())) return d;
    const bool overflow = PyErr_ExceptionMatches(PyExc_OverflowError);  // an int no double holds (10**400)
    PyErr_Clear();  // else no __float__ (or __index__), or one that refused (a tensor of several elements)
    if (overflow)
      throw py::value_error(what + " is out of range (expected a number that a double holds: at most 1.8e308 in " +
                            "magnitude)");
  }
  throw py::type_error(what + " is a " + type_name(obj) + " (expected a number)");
}

std::string to_name(py::handle obj, const std::string& what) {
  if (!py::isinstance<py::str>(obj))
    throw py::type_error(what + " is a " + type_name(obj) + " (expected a table name: str)");
  return obj.cast<std::string>();
}

std::string to_path(py::handle obj, const std::string& what) {
  const py::module_ os = py::module_::import("os");
  if (!py::isinstance<py::str>(obj) && !py::isinstance<py::bytes>(obj) && !py::isinstance(obj, os.attr("PathLike")))
    throw py::type_error(what + " is a " + type_name(obj) + " (expected a path: str, bytes or os.PathLike)");
  // The file system's bytes (os.fsencode): a name that is not UTF-8 (bytes, or a str with the
  // surrogate escapes os.listdir gives for one) is the file's name, not a cast error.
  py::object p;
  try {
    p = os.attr("fsencode")(obj);
  } catch (py::error_already_set& e) {
    if (e.matches(PyExc_UnicodeEncodeError))
      throw py::value_error(what + " cannot be encoded as a file name (" + py::str(e.value()).cast<std::string>() +
                            "; expected a path os.fsencode takes)");
    // A PathLike's __fspath__ may return anything.
    throw py::type_error(what + " is a " + type_name(obj) + " whose __fspath__ gives no str or bytes (expected a " +
                         "path: str, bytes or os.PathLike)");
  }
  std::string path = p.cast<std::string>();
  if (path.find('\0') != std::string::npos)
    throw py::value_error(what + " holds a NUL byte (expected a path without one: the file system would read it " +
                          "only up to the NUL)");
  return path;
}

namespace {

// Raises `type` with `message` decoded as UTF-8, the bytes that are not shown as \xNN (a file name
// that is not UTF-8): pybind11's exceptions decode strictly, and raised UnicodeDecodeError instead.
[[noreturn]] void raise(PyObject* type, const std::string& message) {
  const py::object text = py::reinterpret_steal<py::object>(
      PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "backslashreplace"));
  if (text) PyErr_SetObject(type, text.ptr());
  throw py::error_already_set();
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
      raise(PyExc_ValueError, s.to_string());
    default:
      raise(PyExc_RuntimeError, s.to_string());
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
                            " (expected a CPU tensor or a NumPy array; outputs and gradients may also be CUDA "
                            "tensors of the store's device, while keys, offsets, lengths and weights stay host "
                            "memory: the store plans on the CPU, ahead of the device)");
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
    throw py::type_error(what + " has dtype " + dtype_of(a) + " (expected int64 or int32)");
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

// A 1-D int64 array into `wide`, or an int32 one into `narrow` as it is (the store reads int32 keys and offsets).
void to_key_vector(py::handle obj, const std::string& what, std::vector<std::int64_t>& wide,
                   std::vector<std::int32_t>& narrow) {
  py::array a = as_array(obj, what);
  if (a.dtype().kind() == 'i' && a.itemsize() == 4 && a.ndim() == 1) {
    auto v = py::array_t<std::int32_t>(a).unchecked<1>();
    narrow.resize(static_cast<std::size_t>(v.shape(0)));
    for (py::ssize_t i = 0; i < v.shape(0); ++i) narrow[static_cast<std::size_t>(i)] = v(i);
    return;
  }
  wide = to_int64_vector(obj, what);
}

py::array float_array(py::handle obj, const std::string& what, int ndim) {
  py::array a = as_array(obj, what);
  if (!(a.dtype().kind() == 'f' && a.itemsize() == 4))
    throw py::type_error(what + " has dtype " + dtype_of(a) + " (expected float32)");
  if (a.ndim() != ndim)
    throw py::value_error(what + " has shape " + shape_of(a) + " (expected " + std::to_string(ndim) + "-D)");
  return a;
}

// The entry `name` of a feature's mapping, or None where absent (an entry given as None is).
py::object entry(const py::dict& d, const char* name) {
  if (d.contains(name)) return d[name];
  return py::none();
}

// The entry `name` or its `alias` (TorchRec's or torch's name of it), or None; both given is
// refused (`who` names the table).
py::object entry(const py::dict& d, const char* name, const char* alias, const std::string& who) {
  py::object ours = entry(d, name), theirs = entry(d, alias);
  if (!ours.is_none() && !theirs.is_none())
    throw py::value_error(who + "both '" + name + "' and '" + alias + "' (expected one: '" + alias +
                          "' is another name of '" + name + "')");
  return ours.is_none() ? theirs : ours;
}

}  // namespace

KeyBatch to_key_batch(py::handle features) {
  if (!py::isinstance<py::dict>(features))
    throw py::type_error("features is a " + type_name(features) +
                         " (expected a dict {feature: {'keys': ..., 'offsets' or 'lengths': ..., 'weights': ...}})");
  KeyBatch batch;
  for (auto [key, value] : py::reinterpret_borrow<py::dict>(features)) {
    if (!py::isinstance<py::str>(key))
      throw py::type_error("features key " + py::repr(key).cast<std::string>() + " (expected a feature name: str)");
    JaggedKeys f;
    f.table = key.cast<std::string>();
    const std::string who = "table '" + f.table + "': ";
    if (!py::isinstance<py::dict>(value))
      throw py::type_error(who + "features value is a " + type_name(value) +
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
    py::object keys = entry(d, "keys", "values", who), offsets = entry(d, "offsets"), lengths = entry(d, "lengths"),
               weights = entry(d, "weights", "per_sample_weights", who);
    if (keys.is_none()) throw py::value_error(who + "no 'keys' (expected a 1-D integer array)");
    if (offsets.is_none() == lengths.is_none())
      throw py::value_error(who + "give exactly one of 'offsets' (batch + 1) and 'lengths' (batch)");
    to_key_vector(keys, who + "keys", f.keys, f.keys32);
    if (!offsets.is_none()) {
      to_key_vector(offsets, who + "offsets", f.offsets, f.offsets32);
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
  // A strided (or unaligned) array becomes one C-contiguous, aligned copy; a contiguous one is used as is.
  py::array_t<float, py::array::c_style> a = py::array_t<float, py::array::c_style>::ensure(float_array(obj, what, 2));
  if (!aligned(a)) a = py::array_t<float, py::array::c_style>(py::module_::import("numpy").attr("array")(a));
  return a;
}

namespace {

// Checks that `a`, the array form of `obj`, is memory a C++ call may write in place for its caller:
// C-contiguous, writable, in native byte order (checked by `native`, the typed form of `a`) and, for
// a tensor, a view of its memory rather than a copy. `kind` names the dtype in messages.
void check_in_place(py::handle obj, const py::array& a, const py::array& native, const std::string& what,
                    const std::string& kind) {
  if (!(a.flags() & py::array::c_style))
    throw py::value_error(what + " is not C-contiguous (expected a C-contiguous " + kind + " array to write into)");
  if (!a.writeable()) throw py::value_error(what + " is read-only (expected a writable array)");
  if (!aligned(a)) throw py::value_error(what + " is not aligned (expected an array aligned to its element size)");
  // An array of another byte order converts into a copy, which would not reach the caller.
  if (native.data() != a.data())
    throw py::value_error(what + " is not in native byte order (expected a native " + kind + " array to write into)");
  // The NumPy form of a tensor must be a view of its memory, not a copy.
  if (is_tensor(obj) && a.size() > 0 &&
      reinterpret_cast<std::uintptr_t>(a.data()) != obj.attr("data_ptr")().cast<std::uintptr_t>())
    throw py::value_error(what + " is a tensor whose memory NumPy cannot view in place (expected a C-contiguous " +
                          kind + " CPU tensor to write into)");
}

// Anything but an array or a tensor (a list) would be converted into a temporary copy: the caller
// would never see what the store wrote.
void check_writable_kind(py::handle obj, const std::string& what, const std::string& kind) {
  if (!is_tensor(obj) && !py::isinstance<py::array>(obj))
    throw py::type_error(what + " is a " + type_name(obj) + " (expected a " + kind +
                         " NumPy array or CPU torch tensor to write into)");
}

}  // namespace

py::array_t<float> to_output_matrix(py::handle obj, const std::string& what) {
  check_writable_kind(obj, what, "float32");
  py::array a = float_array(obj, what, 2);
  py::array_t<float> out(a);
  check_in_place(obj, a, out, what, "float32");
  return out;
}

HostMatrix to_host_matrix(py::handle obj, const std::string& what, bool writable) {
  const char* kinds = "float32, float16 or bfloat16";
  if (writable) check_writable_kind(obj, what, kinds);
  py::object o = py::reinterpret_borrow<py::object>(obj);
  // A torch.bfloat16 tensor has no NumPy form: its bits, viewed as int16, have one.
  if (is_tensor(o) && py::str(o.attr("dtype")).cast<std::string>() == "torch.bfloat16")
    o = o.attr("view")(py::module_::import("torch").attr("int16"));
  HostMatrix m{as_array(o, what)};
  const char kind = m.array.dtype().kind();
  const py::ssize_t size = m.array.itemsize();
  if (kind == 'f' && size == 4) {
    m.dtype = DType::kF32;
  } else if (kind == 'f' && size == 2) {
    m.dtype = DType::kF16;
  } else if ((kind == 'i' || kind == 'u') && size == 2) {
    m.dtype = DType::kBF16;
  } else {
    throw py::type_error(what + " has dtype " + dtype_of(m.array) + " (expected " + kinds +
                         " as the table's output_dtype: bfloat16 as a torch.bfloat16 tensor or its bits as int16 or "
                         "uint16)");
  }
  if (m.array.ndim() != 2) throw py::value_error(what + " has shape " + shape_of(m.array) + " (expected 2-D)");
  if (writable && !(m.array.flags() & py::array::c_style))  // refused before any copy below
    throw py::value_error(what + " is not C-contiguous (expected a C-contiguous array to write into)");
  // The native-order, C-contiguous, aligned form of the same dtype (a copy only when the array is not one).
  const py::object native_order = m.array.dtype().attr("newbyteorder")("=");
  py::array native = py::module_::import("numpy").attr("require")(m.array, native_order, py::make_tuple("C", "A"));
  if (writable) {
    check_in_place(o, m.array, native, what, kinds);
  } else {
    m.array = native;
  }
  return m;
}

bool is_device_array(py::handle obj) {
  if (is_tensor(obj)) {
    py::object device = obj.attr("device");
    return py::hasattr(device, "type") && py::str(device.attr("type")).cast<std::string>() == "cuda";
  }
  return !py::isinstance<py::array>(obj) && py::hasattr(obj, "__cuda_array_interface__");
}

DeviceMatrix to_device_matrix(py::handle obj, const std::string& what, bool writable) {
  // A tensor's dtype first: torch has no interface typestr for bfloat16 (its own KeyError).
  if (is_tensor(obj)) {
    const std::string dtype = py::str(obj.attr("dtype")).cast<std::string>();
    if (dtype != "torch.float32")
      throw py::type_error(what + " is a device tensor of " + dtype + " (expected torch.float32" +
                           (dtype == "torch.bfloat16" || dtype == "torch.float16"
                                ? ": the Python module passes half-size outputs and gradients in host memory only)"
                                : ")"));
  }
  // A tensor that requires grad has no interface until detached (it is the same memory).
  py::object o = is_tensor(obj) ? obj.attr("detach")() : py::reinterpret_borrow<py::object>(obj);
  py::object iface = o.attr("__cuda_array_interface__");
  if (!py::isinstance<py::dict>(iface))
    throw py::type_error(what + ": __cuda_array_interface__ is a " + type_name(iface) + " (expected a dict)");
  const py::dict d = iface.cast<py::dict>();
  for (const char* key : {"shape", "typestr", "data"})
    if (!d.contains(key))
      throw py::value_error(what + ": __cuda_array_interface__ has no '" + key +
                            "' (expected shape, typestr and data)");
  const std::string typestr = py::str(d["typestr"]).cast<std::string>();
  if (!py::dtype(typestr).equal(py::dtype::of<float>()))
    throw py::type_error(what + " is a device array of dtype " + py::str(py::dtype(typestr)).cast<std::string>() +
                         " (typestr '" + typestr + "'; expected float32)");
  const auto shape = d["shape"].cast<std::vector<std::int64_t>>();
  std::string sh = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) sh += (i ? ", " : "") + std::to_string(shape[i]);
  sh += shape.size() == 1 ? ",)" : ")";
  if (shape.size() != 2) throw py::value_error(what + " is a device array of shape " + sh + " (expected 2-D)");
  if (d.contains("mask") && !d["mask"].is_none())
    throw py::value_error(what + " is a masked device array (expected no mask)");
  if (d.contains("strides") && !d["strides"].is_none()) {
    const auto strides = d["strides"].cast<std::vector<std::int64_t>>();
    // A dimension of extent 1 (or an empty array) may carry any stride and still be contiguous.
    const bool contiguous = shape[0] * shape[1] == 0 ||
                            ((shape[1] == 1 || strides[1] == 4) && (shape[0] == 1 || strides[0] == 4 * shape[1]));
    if (!contiguous)
      throw py::value_error(what + " is a device array of shape " + sh + " that is not C-contiguous (strides (" +
                            std::to_string(strides[0]) + ", " + std::to_string(strides[1]) +
                            ") bytes; expected a C-contiguous float32 array: .contiguous() makes one)");
  }
  const py::tuple data = d["data"].cast<py::tuple>();
  if (writable && data[1].cast<bool>())
    throw py::value_error(what + " is a read-only device array (expected a writable array to write into)");
  DeviceMatrix m;
  m.ptr = data[0].cast<std::uintptr_t>();
  m.rows = shape[0];
  m.cols = shape[1];
  if (d.contains("stream") && !d["stream"].is_none()) {
    m.has_stream = true;
    m.stream = d["stream"].cast<std::uintptr_t>();
  }
  return m;
}

}  // namespace strata::python
