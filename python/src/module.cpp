// The extension module strata._strata: Store for Python. Arguments are checked and converted with
// the GIL held (python/src/arrays.hpp); every Store call then runs with the GIL released, under a
// per-store mutex (a Store is driven by one thread at a time; Python threads may share one).
// Device arrays and streams: python/src/device.hpp. A store of one rank of a world over a
// torch.distributed ProcessGroup: python/src/process_group.hpp (its transport takes the GIL again
// per operation, on the thread of the call, which released it before taking the store's mutex).
//
// Every argument is taken as a py::handle and converted by the functions of arrays.hpp (to_int,
// to_name, ...), never by pybind11's casters: a wrong type raises TypeError naming the argument and
// what was expected ("batch_id is a float (expected an int)") instead of pybind11's generic
// "Unable to cast Python instance" or "incompatible function arguments".

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "dispatch/shard_layout.hpp"
#include "python/src/arrays.hpp"
#include "python/src/device.hpp"
#include "python/src/process_group.hpp"
#include "store/store.hpp"

namespace strata::python {
namespace {

StoreConfig to_config(py::handle config) {
  std::string text;
  if (py::isinstance<py::str>(config)) {
    text = config.cast<std::string>();
  } else if (py::isinstance<py::dict>(config)) {
    text = py::module_::import("json").attr("dumps")(config).cast<std::string>();
  } else {
    throw py::type_error("config is a " + type_name(config) + " (expected a dict or a JSON string)");
  }
  Result<StoreConfig> c = parse_store_config(text);
  throw_if_error(c.status());
  return std::move(c).value();
}

// The outputs of forward (None: new arrays) or the grads of backward: a sequence of arrays, one per
// feature in submit order (not a dict, whose order would be its own, nor a str).
void check_views(py::handle views, const char* what, bool none_allowed) {
  if (none_allowed && views.is_none()) return;
  if (py::isinstance<py::dict>(views) || py::isinstance<py::str>(views) || py::isinstance<py::bytes>(views) ||
      !py::isinstance<py::sequence>(views))
    throw py::type_error(std::string(what) + " is a " + type_name(views) + " (expected " +
                         (none_allowed ? "None or " : "") +
                         "a list of arrays of the tables' output_dtype, one per feature in submit order)");
}

// An optional table name: None or a str.
py::object optional_name(py::handle table, const std::string& what) {
  if (table.is_none()) return py::none();
  return py::str(to_name(table, what));
}

// Merges the dict `overrides` into `base` (a config as json.loads reads to_json's text): dicts into
// dicts key by key, "tables" ({name: {...}}) into the table of that name, any other value replaced.
// `where` names the level for errors ("overrides", "overrides['device']").
void merge_overrides(const py::dict& base, py::handle overrides, const std::string& where) {
  if (!py::isinstance<py::dict>(overrides))
    throw py::type_error(where + " is a " + type_name(overrides) + " (expected a dict)");
  for (auto item : py::reinterpret_borrow<py::dict>(overrides)) {
    const std::string key = to_name(item.first, where + " key");
    const std::string at = where + "['" + key + "']";
    if (key == "tables" && base.contains("tables")) {
      if (!py::isinstance<py::dict>(item.second))
        throw py::type_error(
            at + " is a " + type_name(item.second) +
            " (expected a dict {table name: {field: value}}, e.g. {'user': {'cache': {'rows': 100}}})");
      py::list tables = base["tables"];
      for (auto t : py::reinterpret_borrow<py::dict>(item.second)) {
        const std::string name = to_name(t.first, at + " key");
        bool found = false;
        for (py::handle table : tables) {
          if (table["name"].cast<std::string>() != name) continue;
          merge_overrides(py::reinterpret_borrow<py::dict>(table), t.second, at + "['" + name + "']");
          found = true;
        }
        if (!found) throw py::value_error(at + ": the checkpoint has no table '" + name + "'");
      }
    } else if (base.contains(key.c_str()) && py::isinstance<py::dict>(base[key.c_str()]) &&
               py::isinstance<py::dict>(item.second)) {
      merge_overrides(base[key.c_str()], item.second, at);
    } else {
      base[key.c_str()] = item.second;
    }
  }
}

// One table of repr(): "user: rows=1000, dim=16, dtype=fp32, placement=cpu, optimizer=adagrad(lr=0.05)".
std::string describe_table(const TableConfig& t) {
  char lr[32];
  std::snprintf(lr, sizeof lr, "%g", static_cast<double>(t.spec.optimizer.learning_rate));
  return t.spec.name + ": rows=" + std::to_string(t.spec.rows) + ", dim=" + std::to_string(t.spec.dim) +
         ", dtype=" + to_string(t.spec.dtype) + ", placement=" + to_string(t.placement) +
         ", optimizer=" + to_string(t.spec.optimizer.kind) + "(lr=" + lr + ")";
}

class PyStore {
 public:
  explicit PyStore(std::unique_ptr<Store> store) : store_(std::move(store)) {}

  // Closing a store of a world discards its batches in flight, collectives whose transport takes
  // the GIL: it is released first (as by every call; close() too), unless the interpreter is
  // finalizing (then the transport fails at once without Python, see without_gil).
  ~PyStore() {
    try {
      without_gil([this] { release(); });
    } catch (...) {  // a destructor reports nothing (the store's own destruction throws nothing)
    }
  }

  // Store::open_checkpoint, the recorded config merged with `overrides` (None or a dict).
  static std::unique_ptr<PyStore> from_checkpoint(py::handle dir_obj, py::handle overrides) {
    const std::string dir = to_path(dir_obj, "dir");
    if (!overrides.is_none() && !py::isinstance<py::dict>(overrides))
      throw py::type_error("overrides is a " + type_name(overrides) +
                           " (expected None or a dict merged into the recorded config)");
    // Merged into the config open_checkpoint passes in, on each of its attempts: a save that
    // replaces the checkpoint meanwhile is opened with the overrides, not refused as one.
    ConfigOverrides edit;
    std::exception_ptr failed;  // the merge's Python error, raised once open_checkpoint returns
    struct MergeFailed : std::exception {};
    if (!overrides.is_none()) {
      edit = [&overrides, &failed](StoreConfig& c) {
        py::gil_scoped_acquire gil;
        try {
          const py::module_ json = py::module_::import("json");
          py::dict merged = json.attr("loads")(to_json(c));
          merge_overrides(merged, overrides, "overrides");
          Result<StoreConfig> parsed = parse_store_config(json.attr("dumps")(merged).cast<std::string>());
          throw_if_error(parsed.status().with_context("from_checkpoint: overrides"));
          c = std::move(parsed).value();
        } catch (...) {
          failed = std::current_exception();
          throw MergeFailed{};
        }
      };
    }
    Result<std::unique_ptr<Store>> s = Status::internal("unreachable");
    try {
      py::gil_scoped_release nogil;
      s = Store::open_checkpoint(dir, edit);
    } catch (const MergeFailed&) {
      std::rethrow_exception(failed);
    }
    throw_if_error(s.status());
    return std::make_unique<PyStore>(std::move(s).value());
  }

  std::string repr() {
    if (!held()) return "strata.Store(closed)";
    std::string text;
    call([&](Store& s) {
      text = "strata.Store(step=" + std::to_string(s.step()) + ", tables=[";
      for (const auto& t : s.config().tables) text += "\n  " + describe_table(t) + ",";
      text += "\n])";
      return Status::ok();
    });
    return text;
  }

  // Store(config, process_group=None, timeout=None): one rank, or one rank of a world over a
  // torch.distributed ProcessGroup (python/src/process_group.hpp).
  PyStore(py::handle config, py::handle process_group, py::handle timeout) {
    StoreConfig c = to_config(config);
    Result<std::unique_ptr<Store>> s = Status::internal("unreachable");
    if (process_group.is_none()) {
      if (!timeout.is_none())
        throw py::value_error("timeout " + py::repr(timeout).cast<std::string>() +
                              " without a process_group (expected None: a store of one rank waits for no peer)");
      py::gil_scoped_release nogil;
      s = Store::open(c);
    } else {
      ProcessGroupWorld w = make_process_group_world(process_group, timeout, interrupt_);
      world_ = w.info;
      Result<std::unique_ptr<dispatch::Communicator>> comm =
          dispatch::make_transport_communicator(std::move(w.transport));
      throw_if_error(comm.status());
      std::shared_ptr<dispatch::Communicator> shared(std::move(comm).value());
      comm_ = shared;
      {
        py::gil_scoped_release nogil;
        s = Store::open(c, shared);
        shared.reset();  // the store holds it (a failed open: its destruction takes the GIL)
      }
      interrupt_->raise_if_any();
    }
    throw_if_error(s.status());
    store_ = std::move(s).value();
  }

  // Store.close(): discards the batches in flight (in a world a collective) and lets go of the
  // store, destroyed now unless a DeviceArray or Stream it made still holds it (then when the last
  // of them goes: nothing in flight, no collective); later calls raise "store is closed". Closing a
  // closed store does nothing.
  void close() {
    {
      py::gil_scoped_release nogil;
      release();
    }
    interrupt_->raise_if_any();
  }

  py::object world() const { return world_.is_none() ? py::object(py::none()) : py::object(py::dict(world_)); }

  // Store._world_broken: None, or why the world's communicator broke (its first breaking error: a
  // failure of the transport (a timeout, a peer that left, an error, an interrupt), ranks out of
  // step, a foreign collective, a verdict that breaks it, ...); from then on every collective of the
  // store fails. None without a world, and once the store (so its communicator) is gone.
  py::object world_broken() const {
    const std::shared_ptr<dispatch::Communicator> comm = comm_.lock();
    if (!comm) return py::none();
    const Status broken = comm->broken();
    if (broken.is_ok()) return py::none();
    return py::str(broken.to_string());
  }

  py::dict shard_info(py::handle table_obj) {
    const int t = table_of(table_obj);
    const ShardInfo info = shard_of(t);
    py::dict d;
    d["type"] = dispatch::to_string(info.type);
    d["world"] = info.world;
    d["rank"] = info.rank;
    d["rows"] = info.rows;
    d["dim"] = info.dim;
    d["local_rows"] = info.local_rows;
    d["row_start"] = info.row_start;
    d["row_step"] = info.row_step;
    d["col_offset"] = info.col_offset;
    d["local_dim"] = info.local_dim;
    d["state_dim"] = optimizer_state_dim(live()->config().tables[static_cast<std::size_t>(t)].spec.optimizer.kind,
                                         static_cast<std::int32_t>(info.dim));
    py::list replicas;
    for (int r : info.replicas) replicas.append(r);
    d["replicas"] = replicas;
    return d;
  }

  // read_shard(table, local_row0, n): (weights (n, local_dim), state (n, state columns)) of this
  // rank's shard. 0 rows from 0 of a table this rank does not hold: two empty arrays.
  py::tuple read_shard(py::handle table_obj, py::handle row0_obj, py::handle n_obj) {
    const int t = table_of(table_obj);
    const std::int64_t row0 = to_int(row0_obj, "local_row0");
    const std::int64_t n = to_int(n_obj, "n");
    const ShardInfo info = shard_of(t);
    const std::int64_t sd = shard_state_dim(t, info);
    const std::int64_t ld = info.local_dim;
    if (row0 == 0 && n == 0 && info.local_rows == 0) {
      const std::int64_t none = 0;
      return py::make_tuple(py::array_t<float>({none, ld}), py::array_t<float>({none, sd}));
    }
    if (row0 < 0 || n < 0 || row0 > info.local_rows || n > info.local_rows - row0)
      call([&](Store& s) { return s.read_shard(t, row0, n, nullptr, nullptr); });  // the store's words for it
    py::array_t<float> w({n, ld});
    py::array_t<float> st({n, sd});
    float* wp = w.mutable_data();
    float* sp = sd ? st.mutable_data() : nullptr;
    call([&](Store& s) { return s.read_shard(t, row0, n, wp, sp); });
    return py::make_tuple(w, st);
  }

  void write_shard(py::handle table_obj, py::handle row0_obj, py::handle weights, const py::object& state) {
    const int t = table_of(table_obj);
    const std::int64_t row0 = to_int(row0_obj, "local_row0");
    const ShardInfo info = shard_of(t);
    const std::int64_t sd = shard_state_dim(t, info);
    const std::string what = "table '" + live()->config().tables[static_cast<std::size_t>(t)].spec.name + "'";
    auto w = to_float_matrix(weights, what + ": weights");
    const std::int64_t n = w.shape(0);
    check_shape(w, n, info.local_dim, what + ": weights");
    py::array_t<float, py::array::c_style> st;
    if (!state.is_none()) {
      st = to_float_matrix(state, what + ": state");
      check_shape(st, n, sd, what + ": state");
    }
    const float* sp = !state.is_none() && sd ? st.data() : nullptr;
    call([&](Store& s) { return s.write_shard(t, row0, n, w.data(), sp); });
  }

  void submit(py::handle batch_id, py::handle features, py::handle train) {
    const std::int64_t id = to_int(batch_id, "batch_id");
    if (!py::isinstance<py::bool_>(train))
      throw py::type_error("train is a " + type_name(train) + " (expected a bool)");
    KeyBatch batch = to_key_batch(features);
    batch.train = train.cast<bool>();
    std::vector<Shape> shapes;
    const std::shared_ptr<Store> store = live();
    for (const auto& f : batch.features) {
      auto t = find_feature(store->config(), f.table);
      if (!t) break;  // submit names it
      const TableSpec& spec = store->config().tables[static_cast<std::size_t>(t.value().first)].spec;
      shapes.push_back({output_rows(f, t.value().second), spec.dim, spec.output_dtype});
    }
    call([&](Store& s) {
      Status st = s.submit(id, std::move(batch));
      if (st.is_ok()) shapes_[id] = std::move(shapes);
      return st;
    });
  }

  void preview(py::handle batch_id, py::handle features) {
    const std::int64_t id = to_int(batch_id, "batch_id");
    const KeyBatch batch = to_key_batch(features);
    call([&](Store& s) { return s.preview(id, batch); });
  }

  py::list forward(py::handle batch_id, const py::object& outputs, py::handle stream) {
    const std::int64_t id = to_int(batch_id, "batch_id");
    check_views(outputs, "outputs", true);
    const StreamArg on = parse_stream(stream);
    std::vector<Shape> shapes;
    bool known = false;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      auto it = shapes_.find(id);
      if (it != shapes_.end()) shapes = it->second, known = true;
    }
    if (!known) call([&](Store& s) { return s.forward(id, {}); });  // the store's words for it
    py::list arrays;
    if (outputs.is_none()) {
      // A bf16 output is its bits as int16 (NumPy has no bfloat16; torch views int16 as bfloat16).
      for (const Shape& sh : shapes)
        arrays.append(py::array(py::dtype(sh.dtype == DType::kF32   ? "float32"
                                          : sh.dtype == DType::kF16 ? "float16"
                                                                    : "int16"),
                                std::vector<py::ssize_t>{sh.rows, sh.cols}));
    } else {
      for (py::handle o : outputs) arrays.append(o);
    }
    // The arrays the store writes into stay alive until it returns (the GIL is released then):
    // `arrays` holds the device ones, `keep` the NumPy views of host ones.
    std::vector<py::array> keep;
    std::vector<MatrixView> views;
    std::vector<std::uintptr_t> producers;
    for (std::size_t i = 0; i < arrays.size(); ++i) {
      const std::string what = "outputs[" + std::to_string(i) + "]";
      if (is_device_array(arrays[i])) {
        const DeviceMatrix m = to_device_matrix(arrays[i], what, true);
        views.push_back({reinterpret_cast<float*>(m.ptr), m.rows, m.cols, MemorySpace::kDevice});
        if (m.has_stream) producers.push_back(m.stream);
      } else {
        HostMatrix m = to_host_matrix(arrays[i], what, true);
        keep.push_back(m.array);
        views.push_back({static_cast<float*>(m.array.mutable_data()), m.array.shape(0), m.array.shape(1),
                         MemorySpace::kHost, m.dtype});
      }
    }
    call_on("forward", id, on, producers,
            [&](Store& s, gpu::StreamView v) { return on.given ? s.forward(id, views, v) : s.forward(id, views); });
    return arrays;
  }

  void backward(py::handle batch_id, py::handle grads, py::handle stream) {
    const std::int64_t id = to_int(batch_id, "batch_id");
    check_views(grads, "grads", false);
    const StreamArg on = parse_stream(stream);
    // `grads` holds the device arrays, `keep` the (C-contiguous) NumPy forms of host ones.
    std::vector<py::array> keep;
    std::vector<ConstMatrixView> views;
    std::vector<std::uintptr_t> producers;
    keep.reserve(py::len(grads));
    std::size_t i = 0;
    for (py::handle g : grads) {
      const std::string what = "grads[" + std::to_string(i++) + "]";
      if (is_device_array(g)) {
        const DeviceMatrix m = to_device_matrix(g, what, false);
        views.push_back({reinterpret_cast<const float*>(m.ptr), m.rows, m.cols, MemorySpace::kDevice});
        if (m.has_stream) producers.push_back(m.stream);
      } else {
        HostMatrix m = to_host_matrix(g, what, false);
        keep.push_back(m.array);
        views.push_back({static_cast<const float*>(m.array.data()), m.array.shape(0), m.array.shape(1),
                         MemorySpace::kHost, m.dtype});
      }
    }
    call_on("backward", id, on, producers, [&](Store& s, gpu::StreamView v) {
      const std::int64_t before = s.in_flight();
      Status st = on.given ? s.backward(id, views, v) : s.backward(id, views);
      // Retired when applied, and when a failed device failed it (shapes_ holds what is in flight:
      // release() discards exactly those).
      if (st.is_ok() || s.in_flight() < before) shapes_.erase(id);
      return st;
    });
  }

  void discard(py::handle batch_id) {
    const std::int64_t id = to_int(batch_id, "batch_id");
    call([&](Store& s) {
      Status st = s.discard(id);
      shapes_.erase(id);  // retired either way (discard reports engine errors after retiring)
      return st;
    });
  }

  py::tuple read_rows(py::handle table_obj, py::handle row0_obj, py::handle n_obj, const py::object& out,
                      const py::object& state_out) {
    const std::string table = to_name(table_obj, "table");
    const std::int64_t row0 = to_int(row0_obj, "row0");
    const std::int64_t n_given = n_obj.is_none() ? 0 : to_int(n_obj, "n");
    const TableArg t = table_arg(table);
    const std::int64_t n = n_obj.is_none() ? t.spec.rows - row0 : n_given;
    if (row0 < 0 || n < 0 || row0 > t.spec.rows || n > t.spec.rows - row0)
      call([&](Store& s) { return s.read_rows(t.index, row0, n, nullptr, nullptr); });  // the store's words for it
    RowsOut rows = rows_out(t, n, out, state_out);
    call([&](Store& s) { return s.read_rows(t.index, row0, n, rows.weights_ptr, rows.state_ptr); });
    return py::make_tuple(rows.weights, rows.state);
  }

  void write_rows(py::handle table_obj, py::handle row0_obj, py::handle weights, const py::object& state) {
    const std::string table = to_name(table_obj, "table");
    const std::int64_t row0 = to_int(row0_obj, "row0");
    const TableArg t = table_arg(table);
    auto w = to_float_matrix(weights, t.what + "weights");
    const std::int64_t n = w.shape(0);
    check_shape(w, n, t.spec.dim, t.what + "weights");
    const RowsIn st = state_in(t, n, state);
    call([&](Store& s) { return s.write_rows(t.index, row0, n, w.data(), st.ptr); });
  }

  // keys_held(table): a dynamic table's keys that have a row, ascending (int64).
  py::array_t<std::int64_t> keys_held(py::handle table_obj) {
    const int t = index(to_name(table_obj, "table"));
    std::vector<Key> keys;
    call([&](Store& s) {
      Result<std::vector<Key>> r = s.keys_held(t);
      if (!r) return r.status();
      keys = std::move(r).value();
      return Status::ok();
    });
    py::array_t<std::int64_t> out(static_cast<py::ssize_t>(keys.size()));
    std::copy(keys.begin(), keys.end(), out.mutable_data());
    return out;
  }

  // read_keys(table, keys, out=None, state_out=None): (weights (n, dim), state (n, state_dim)) of a
  // dynamic table's rows of `keys`, as read_rows reads rows.
  py::tuple read_keys(py::handle table_obj, py::handle keys_obj, const py::object& out, const py::object& state_out) {
    const TableArg t = table_arg(to_name(table_obj, "table"));
    const std::vector<Key> keys = to_int64_vector(keys_obj, t.what + "keys");
    RowsOut rows = rows_out(t, static_cast<std::int64_t>(keys.size()), out, state_out);
    call([&](Store& s) { return s.read_keys(t.index, keys, rows.weights_ptr, rows.state_ptr); });
    return py::make_tuple(rows.weights, rows.state);
  }

  // key_owner(table, keys): the rank whose shard holds each key of a dynamic table (int32), as the store routes it
  // (dispatch::ShardLayout::key_owner for this store's world and the table's plan); 0 for each key without a world.
  py::array_t<std::int32_t> key_owner(py::handle table_obj, py::handle keys_obj) {
    const TableArg t = table_arg(to_name(table_obj, "table"));
    const std::vector<Key> keys = to_int64_vector(keys_obj, t.what + "keys");
    const TableConfig& tc = live()->config().tables[static_cast<std::size_t>(t.index)];
    if (!tc.dynamic) throw py::value_error(t.what + "key_owner of a dense table (expected a dynamic table)");
    py::array_t<std::int32_t> out(static_cast<py::ssize_t>(keys.size()));
    std::int32_t* owner = out.mutable_data();
    if (world_.is_none()) {
      std::fill(owner, owner + keys.size(), 0);
      return out;
    }
    TableSpec served = tc.spec;  // as the store's key index lays it out: the capacity and the row of keys without one
    served.rows = tc.spec.rows + 1;
    Result<dispatch::ShardLayout> layout =
        dispatch::ShardLayout::make(served, tc.sharding, py::cast<int>(world_["size"]), t.index);
    throw_if_error(layout.status());
    for (std::size_t i = 0; i < keys.size(); ++i) owner[i] = layout.value().key_owner(keys[i]);
    return out;
  }

  // write_keys(table, keys, weights, state=None): the dynamic table holds exactly `keys`, with these rows.
  void write_keys(py::handle table_obj, py::handle keys_obj, py::handle weights, const py::object& state) {
    const TableArg t = table_arg(to_name(table_obj, "table"));
    const std::vector<Key> keys = to_int64_vector(keys_obj, t.what + "keys");
    const auto n = static_cast<std::int64_t>(keys.size());
    auto w = to_float_matrix(weights, t.what + "weights");
    if (w.shape(0) != n)
      throw py::value_error(t.what + "weights has " + std::to_string(w.shape(0)) + " rows for " + std::to_string(n) +
                            " keys (expected one row per key: (" + std::to_string(n) + ", " +
                            std::to_string(t.spec.dim) + "))");
    check_shape(w, n, t.spec.dim, t.what + "weights");
    const RowsIn st = state_in(t, n, state);
    call([&](Store& s) { return s.write_keys(t.index, keys, w.data(), st.ptr); });
  }

  void set_learning_rate(py::handle lr_obj, py::handle table_obj) {
    const double rate = to_number(lr_obj, "lr");
    const py::object table = optional_name(table_obj, "table");
    // Python floats are doubles: a rate float32 cannot hold (1e-50 would read as 0, 1e39 as inf) is
    // refused here in the caller's words rather than by the store's check of the narrowed value. 0 is
    // a rate (an update of zero); negative and non-finite ones are refused by the store.
    const auto lr = static_cast<float>(rate);
    // The store's rule (check_rate: >= 0) on the rate given: -1e-50 would narrow to -0.0, a rate.
    if (rate < 0 && lr == 0)
      throw py::value_error(
          "set_learning_rate: " + (table.is_none() ? std::string() : "table '" + table.cast<std::string>() + "': ") +
          "learning_rate " + py::repr(py::float_(rate)).cast<std::string>() + " (expected a finite number >= 0)");
    if (std::isfinite(rate) && rate > 0 && (lr == 0 || !std::isfinite(lr)))
      throw py::value_error("set_learning_rate: learning_rate " + py::repr(py::float_(rate)).cast<std::string>() +
                            (table.is_none() ? std::string() : " for table '" + table.cast<std::string>() + "'") +
                            " is outside float32's range (expected 0 or a finite number that float32 holds, from "
                            "1.4e-45 to 3.4e+38)");
    if (table.is_none()) {
      call([&](Store& s) { return s.set_learning_rate(lr); });
    } else {
      const std::string name = table.cast<std::string>();
      call([&](Store& s) { return s.set_learning_rate(name, lr); });
    }
  }

  float learning_rate(py::handle table_obj) {
    const std::string table = to_name(table_obj, "table");
    float lr = 0;
    call([&](Store& s) {
      auto r = s.learning_rate(table);
      if (r) lr = r.value();
      return r.status();
    });
    return lr;
  }

  void set_step(py::handle step_obj) {
    const std::int64_t step = to_int(step_obj, "step");
    call([&](Store& s) { return s.set_step(step); });
  }

  py::dict stats() {
    StoreStats st;
    std::int64_t step = 0, in_flight = 0;
    call([&](Store& s) {
      st = s.stats();
      step = s.step();
      in_flight = s.in_flight();
      return Status::ok();
    });
    py::dict cache;
    for (const auto& [name, table_stats] : st.cache) {
      const cache::CacheStats& c = table_stats;  // a structured binding is not captured (C++17)
      py::dict d;
      cache::CacheStats::for_each_counter([&](const char* key, std::int64_t cache::CacheStats::*n) { d[key] = c.*n; });
      d["hit_rate"] = c.hit_rate();
      cache[py::str(name)] = d;
    }
    py::dict links;
    links["hbm_read"] = st.links.hbm_read;
    links["hbm_write"] = st.links.hbm_write;
    links["h2d"] = st.links.h2d;
    links["d2h"] = st.links.d2h;
    links["host_read"] = st.links.host_read_total();
    links["host_write"] = st.links.host_write_total();
    links["host_copy"] = st.links.host_copy;
    const auto staging = [](const StagingBytes& b) {
      py::dict d;
      d["pinned"] = b.pinned;
      d["device"] = b.device;
      d["entries"] = b.entries;
      d["ahead"] = b.ahead;
      return d;
    };
    py::dict resources;
    resources["allocations"] = st.device_resources.allocations;
    resources["frees"] = st.device_resources.frees;
    resources["events"] = st.device_resources.events;
    py::dict dispatch;
    dispatch["rank"] = st.dispatch.rank;
    dispatch["world"] = st.dispatch.world;
    dispatch["batches"] = st.dispatch.batches;
    dispatch["bytes"] = st.dispatch.bytes();
    dispatch["key_bytes"] = st.dispatch.key_bytes;
    dispatch["row_bytes"] = st.dispatch.row_bytes;
    dispatch["grad_bytes"] = st.dispatch.grad_bytes;
    dispatch["bytes_no_dedup"] = st.dispatch.bytes_no_dedup;
    dispatch["admission_bytes"] = st.dispatch.admission_bytes;
    dispatch["exchange_seconds"] = st.dispatch.exchange_seconds;
    dispatch["lookup_seconds"] = st.dispatch.lookup_seconds;
    dispatch["local_seconds"] = st.dispatch.local_seconds;
    const auto placement = [](const NumaPlacement& n) {
      py::dict d;
      d["memory_node"] = n.memory_node;
      d["thread_node"] = n.thread_node;
      d["pinned_node"] = n.pinned_node;
      d["note"] = n.note;
      return d;
    };
    py::list numa_engines, numa_tables;
    for (const auto& [engine, n] : st.numa_engines) {
      py::dict d = placement(n);
      d["engine"] = engine;
      numa_engines.append(d);
    }
    for (const TableNuma& t : st.numa_tables) {
      py::dict pages, nodes;
      for (const auto& [node, count] : t.pages.nodes) nodes[py::int_(node)] = count;
      pages["sampled"] = t.pages.sampled;
      pages["unfaulted"] = t.pages.unfaulted;
      pages["nodes"] = nodes;
      pages["note"] = t.pages.note;
      py::dict d;
      d["table"] = t.table;
      d["placement"] = t.placement;
      d["engine"] = t.engine;
      d["memory_node"] = t.memory_node;
      d["thread_node"] = t.thread_node;
      d["pages"] = pages;
      numa_tables.append(d);
    }
    py::dict dynamic;
    for (const auto& [name, table_stats] : st.dynamic) {
      py::dict d;
      d["rows"] = table_stats.rows;
      d["capacity"] = table_stats.capacity;
      d["admissions"] = table_stats.admissions;
      d["evictions"] = table_stats.evictions;
      d["expirations"] = table_stats.expirations;
      d["not_admitted"] = table_stats.not_admitted;
      d["unseen"] = table_stats.unseen;
      d["index_bytes"] = table_stats.index_bytes;
      dynamic[py::str(name)] = d;
    }
    py::dict out;
    out["cache"] = cache;
    out["device"] = st.device;
    out["links"] = links;
    out["device_peak_bytes"] = st.device_peak_bytes;
    out["device_resources"] = resources;
    out["staging"] = staging(st.staging);
    out["activation_staging"] = staging(st.activation_staging);
    out["dispatch"] = dispatch;
    out["numa"] = placement(st.numa);
    out["numa_engines"] = numa_engines;
    out["numa_tables"] = numa_tables;
    out["dynamic"] = dynamic;
    out["step"] = step;
    out["in_flight"] = in_flight;
    return out;
  }

  // Calls without arguments to convert. A KeyboardInterrupt or SystemExit that interrupted a
  // collective of the world is raised again here (its Status only says "interrupted").
  template <typename F>
  void call(F&& f) {
    Status s;
    bool closed = false;
    {
      py::gil_scoped_release nogil;
      std::lock_guard<std::mutex> lock(mu_);
      if (store_) {
        s = f(*store_);
      } else {
        closed = true;
      }
    }
    if (closed) throw_closed();
    interrupt_->raise_if_any();
    throw_if_error(s);
  }

  // A forward or backward (`op`) with views: `f(store, stream)` runs with the stream of `on`
  // resolved on the store's device (empty for stream=None) and ordered after `producers`, the
  // streams named by the device arrays' __cuda_array_interface__ (without a stream the host waits
  // for them; with one, it waits for them on the device). A store without a device gets the
  // stream unresolved, and refuses it (and every device view) in its own words.
  template <typename F>
  void call_on(const char* op, std::int64_t id, const StreamArg& on, const std::vector<std::uintptr_t>& producers,
               F&& f) {
    call([&](Store& s) -> Status {
      gpu::Device* dev = s.device();
      const std::string who = std::string(op) + " of batch " + std::to_string(id);
      gpu::Stream holder;
      gpu::StreamView view = on.view;
      if (dev && on.given) {
        STRATA_ASSIGN_OR_RETURN(view, resolve_stream(*dev, on, holder, who));
      }
      if (dev) STRATA_RETURN_IF_ERROR(order_after(*dev, on, view, producers, who));
      return f(s, view);
    });
  }

  // Orders the call's stream `view` (empty: the host) after each producer stream other than it.
  Status order_after(gpu::Device& dev, const StreamArg& on, gpu::StreamView view,
                     const std::vector<std::uintptr_t>& producers, const std::string& who) {
    if (view.state() && !dev.owns(view)) return Status::ok();  // the store refuses the stream
    for (std::size_t i = 0; i < producers.size(); ++i) {
      const std::uintptr_t p = producers[i];
      if ((on.native && p == on.handle) ||
          std::find(producers.begin(), producers.begin() + i, p) != producers.begin() + i)
        continue;
      StreamArg arg;
      arg.given = arg.native = true;
      arg.handle = p;
      gpu::Stream holder;
      STRATA_ASSIGN_OR_RETURN(gpu::StreamView ps,
                              resolve_stream(dev, arg, holder, who + ": a device array's __cuda_array_interface__"));
      if (!view.state()) {
        STRATA_RETURN_IF_ERROR(dev.synchronize(ps));
        continue;
      }
      if (!producer_event_) {
        STRATA_ASSIGN_OR_RETURN(producer_event_, dev.create_event());
      }
      dev.record(producer_event_.view(), ps);
      dev.wait(view, producer_event_.view());
    }
    return Status::ok();
  }

  // The store's device (null: none), as a pointer that holds the store (Store.stream(), device_array()).
  std::shared_ptr<gpu::Device> device() {
    std::shared_ptr<Store> s = live();
    gpu::Device* d = s->device();
    return std::shared_ptr<gpu::Device>(s, d);
  }

  // A value read from the store (GIL released, under the mutex).
  template <typename F>
  auto read(F&& f) {
    decltype(f(std::declval<Store&>())) v{};
    call([&](Store& s) {
      v = f(s);
      return Status::ok();
    });
    return v;
  }

  int index(const std::string& table) {
    Result<int> t = live()->table_index(table);
    throw_if_error(t.status());
    return t.value();
  }

  // The store, or RuntimeError "store is closed" after close(). For what does not change while it
  // is open (config, table indices, device), read with the GIL held and without the call mutex (a
  // call holding it may wait for the GIL); the pointer keeps the store alive meanwhile, should
  // another thread close it. Calls go through call().
  std::shared_ptr<Store> live() {
    std::shared_ptr<Store> s = held();
    if (!s) throw_closed();
    return s;
  }

 private:
  [[noreturn]] static void throw_closed() {
    throw std::runtime_error("store is closed (close() was called; open a new strata.Store)");
  }

  // A table by index (an int) or name (a str).
  int table_of(py::handle table) {
    if (py::isinstance<py::str>(table)) return index(to_name(table, "table"));
    if (py::isinstance<py::int_>(table) && !py::isinstance<py::bool_>(table)) {
      const auto n = static_cast<std::int64_t>(live()->config().tables.size());
      const std::int64_t t = to_int(table, "table");
      if (t < 0 || t >= n)
        throw py::value_error("table " + std::to_string(t) + " (expected a table index in [0, " + std::to_string(n) +
                              ") or a table name)");
      return static_cast<int>(t);
    }
    throw py::type_error("table is a " + type_name(table) + " (expected a table name: str, or index: int)");
  }

  ShardInfo shard_of(int t) {
    ShardInfo info;
    call([&](Store& s) {
      auto r = s.shard_info(t);
      if (r) info = r.value();
      return r.status();
    });
    return info;
  }

  std::int64_t shard_state_dim(int t, const ShardInfo& info) {
    return optimizer_state_dim(live()->config().tables[static_cast<std::size_t>(t)].spec.optimizer.kind,
                               static_cast<std::int32_t>(info.local_dim));
  }

  std::shared_ptr<Store> held() const {
    std::lock_guard<std::mutex> lock(ptr_mu_);
    return store_;
  }

  // close() and the destructor (GIL released): discards the batches in flight in id order (in a
  // world collectives, as the store's destructor would run them), drops the producer event of its
  // device, then lets go of the store: destroyed here unless a DeviceArray or Stream still holds it
  // (its destruction then discards nothing, so runs no collective, wherever it happens).
  void release() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!store_) return;
    std::vector<std::int64_t> ids;
    for (const auto& b : shapes_) ids.push_back(b.first);
    std::sort(ids.begin(), ids.end());
    for (std::int64_t id : ids) (void)store_->discard(id);
    producer_event_ = gpu::Event();
    shapes_.clear();
    std::shared_ptr<Store> last;
    {
      std::lock_guard<std::mutex> p(ptr_mu_);
      last = std::move(store_);
    }
    last.reset();
  }

  struct Shape {
    std::int64_t rows, cols;
    DType dtype;  ///< the table's output_dtype
  };
  static void check_shape(const py::array& a, std::int64_t rows, std::int64_t cols, const std::string& what) {
    if (a.shape(0) != rows || a.shape(1) != cols)
      throw py::value_error(what + " has shape (" + std::to_string(a.shape(0)) + ", " + std::to_string(a.shape(1)) +
                            ") (expected (" + std::to_string(rows) + ", " + std::to_string(cols) + "))");
  }

  // A table named in a row call: its index and spec, its optimizer's state columns, and the start of
  // the call's messages about its arrays ("table 'user': ").
  struct TableArg {
    int index = 0;
    TableSpec spec;
    std::int32_t state_dim = 0;
    std::string what;
  };
  TableArg table_arg(const std::string& table) {
    TableArg t;
    t.index = index(table);
    t.spec = live()->config().tables[static_cast<std::size_t>(t.index)].spec;
    t.state_dim = optimizer_state_dim(t.spec.optimizer.kind, t.spec.dim);
    t.what = "table '" + table + "': ";
    return t;
  }

  // The arrays a read of n rows of `t` writes: `out` and `state_out` as given (checked), or new ones.
  struct RowsOut {
    py::array_t<float> weights, state;
    float* weights_ptr = nullptr;
    float* state_ptr = nullptr;  // null without state columns
  };
  static RowsOut rows_out(const TableArg& t, std::int64_t n, const py::object& out, const py::object& state_out) {
    RowsOut r;
    r.weights = out.is_none() ? py::array_t<float>({n, static_cast<std::int64_t>(t.spec.dim)})
                              : to_output_matrix(out, t.what + "out");
    r.state = state_out.is_none() ? py::array_t<float>({n, static_cast<std::int64_t>(t.state_dim)})
                                  : to_output_matrix(state_out, t.what + "state_out");
    check_shape(r.weights, n, t.spec.dim, t.what + "out");
    check_shape(r.state, n, t.state_dim, t.what + "state_out");
    r.weights_ptr = r.weights.mutable_data();
    r.state_ptr = t.state_dim ? r.state.mutable_data() : nullptr;
    return r;
  }

  // The optional `state` of a write of n rows of `t` (None: ptr null, the rows keep theirs).
  struct RowsIn {
    py::array_t<float, py::array::c_style> array;
    const float* ptr = nullptr;
  };
  static RowsIn state_in(const TableArg& t, std::int64_t n, const py::object& state) {
    RowsIn r;
    if (state.is_none()) return r;
    r.array = to_float_matrix(state, t.what + "state");
    if (t.state_dim == 0 && r.array.size() > 0)
      throw py::value_error(t.what + "state given, but optimizer " + to_string(t.spec.optimizer.kind) +
                            " keeps no state (expected None)");
    check_shape(r.array, n, t.state_dim, t.what + "state");
    r.ptr = t.state_dim ? r.array.data() : nullptr;
    return r;
  }

  std::shared_ptr<Store> store_;  // null once closed (written under mu_ and ptr_mu_; read under either)
  mutable std::mutex ptr_mu_;     // store_ itself (held only to copy or reset the pointer)
  std::mutex mu_;                 // one Store call at a time
  gpu::Event producer_event_;     // orders a call's stream after a producer's (order_after; under mu_)
  std::unordered_map<std::int64_t, std::vector<Shape>> shapes_;           // outputs of each batch in flight (under mu_)
  std::shared_ptr<Interrupt> interrupt_ = std::make_shared<Interrupt>();  // of the world's transport (GIL held)
  py::object world_ = py::none();               // Store.world: None, or {"rank", "size", "kind", "backend"}
  std::weak_ptr<dispatch::Communicator> comm_;  // the world's communicator (its broken()), none without a world
};

// strata._strata._WorldComm(pg, timeout=None), test-only: the transport communicator of a world over
// a torch.distributed ProcessGroup by itself, its collectives over NumPy arrays (host memory), for
// the Python conformance subset. Every call releases the GIL (the transport takes it again per
// operation); errors raise as Store calls do.
class PyWorldComm {
 public:
  PyWorldComm(py::handle process_group, py::handle timeout) {
    ProcessGroupWorld w = make_process_group_world(process_group, timeout, interrupt_);
    auto c = dispatch::make_transport_communicator(std::move(w.transport));
    throw_if_error(c.status());
    comm_ = std::move(c).value();
  }
  ~PyWorldComm() {
    try {
      py::gil_scoped_release nogil;
      comm_.reset();
    } catch (...) {  // a destructor reports nothing
    }
  }

  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }

  void all_to_all_v(py::handle send, py::handle send_counts, py::handle send_displs, py::handle recv,
                    py::handle recv_counts, py::handle recv_displs) {
    const py::array in = bytes_of(send, "send", false), out = bytes_of(recv, "recv", true);
    const std::vector<std::int64_t> sc = counts(send_counts, "send_counts"), sd = counts(send_displs, "send_displs"),
                                    rc = counts(recv_counts, "recv_counts"), rd = counts(recv_displs, "recv_displs");
    within(in, "send", sc, sd);
    within(out, "recv", rc, rd);
    const void* sp = in.data();
    void* rp = out.request().ptr;
    run([&] { return comm_->all_to_all_v(sp, sc.data(), sd.data(), rp, rc.data(), rd.data()); });
  }

  py::array all_gather(py::handle send) {
    const py::array in = bytes_of(send, "send", false);
    const std::int64_t n = static_cast<std::int64_t>(in.nbytes());
    py::array_t<std::uint8_t> out(n * comm_->size());
    const void* sp = in.data();
    void* rp = out.mutable_data();
    run([&] { return comm_->all_gather(sp, n, rp); });
    return std::move(out);
  }

  void broadcast(py::handle data, py::handle root_obj) {
    const py::array a = bytes_of(data, "data", true);
    const int root = static_cast<int>(to_int(root_obj, "root"));
    void* p = a.request().ptr;
    const auto n = static_cast<std::int64_t>(a.nbytes());
    run([&] { return comm_->broadcast(p, n, root); });
  }

  // In place over a C-contiguous int32, int64, float32 or float64 array; op "sum", "min" or "max".
  void all_reduce(py::handle data, py::handle op_obj) {
    const py::array a = bytes_of(data, "data", true);
    const std::string op_name = to_name(op_obj, "op");
    dispatch::ReduceOp op;
    if (op_name == "sum") {
      op = dispatch::ReduceOp::kSum;
    } else if (op_name == "min") {
      op = dispatch::ReduceOp::kMin;
    } else if (op_name == "max") {
      op = dispatch::ReduceOp::kMax;
    } else {
      throw py::value_error("op '" + op_name + "' (expected 'sum', 'min' or 'max')");
    }
    dispatch::DataType type;
    const py::dtype dt = a.dtype();
    if (dt.is(py::dtype::of<std::int32_t>())) {
      type = dispatch::DataType::kInt32;
    } else if (dt.is(py::dtype::of<std::int64_t>())) {
      type = dispatch::DataType::kInt64;
    } else if (dt.is(py::dtype::of<float>())) {
      type = dispatch::DataType::kFloat32;
    } else if (dt.is(py::dtype::of<double>())) {
      type = dispatch::DataType::kFloat64;
    } else {
      throw py::type_error("data has dtype " + py::str(py::handle(dt)).cast<std::string>() +
                           " (expected int32, int64, float32 or float64)");
    }
    void* p = a.request().ptr;
    const auto n = static_cast<std::int64_t>(a.size());
    run([&] { return comm_->all_reduce(p, n, type, op); });
  }

  void barrier() {
    run([&] { return comm_->barrier(); });
  }

  py::dict counters() const {
    const dispatch::CommCounters c = comm_->counters();
    py::dict d;
    d["sent_bytes"] = c.sent_bytes;
    d["received_bytes"] = c.received_bytes;
    d["calls"] = c.calls;
    return d;
  }

 private:
  // A C-contiguous NumPy array (writable when `writable`) whose bytes a collective reads or writes.
  static py::array bytes_of(py::handle obj, const std::string& what, bool writable) {
    if (!py::isinstance<py::array>(obj))
      throw py::type_error(what + " is a " + type_name(obj) + " (expected a C-contiguous NumPy array)");
    py::array a = py::reinterpret_borrow<py::array>(obj);
    if (!(a.flags() & py::array::c_style) || (writable && !a.writeable()))
      throw py::value_error(what + " must be a C-contiguous" + std::string(writable ? ", writable" : "") +
                            " NumPy array");
    return a;
  }
  std::vector<std::int64_t> counts(py::handle obj, const std::string& what) const {
    std::vector<std::int64_t> v = to_int64_vector(obj, what);
    if (static_cast<int>(v.size()) != comm_->size())
      throw py::value_error(what + " has " + std::to_string(v.size()) + " entries (expected " +
                            std::to_string(comm_->size()) + ", one per rank)");
    return v;
  }
  // Every rank's bytes [displs[r], displs[r] + counts[r]) of `a` (named `what`) lie inside it.
  static void within(const py::array& a, const std::string& what, const std::vector<std::int64_t>& counts,
                     const std::vector<std::int64_t>& displs) {
    const auto bytes = static_cast<std::int64_t>(a.nbytes());
    for (std::size_t r = 0; r < counts.size(); ++r) {
      const std::string at = "[" + std::to_string(r) + "]";
      for (const auto& [name, v] : {std::pair<const char*, std::int64_t>{"_counts", counts[r]}, {"_displs", displs[r]}})
        if (v < 0) throw py::value_error(what + name + at + " = " + std::to_string(v) + " (expected >= 0)");
      if (counts[r] > bytes - displs[r])
        throw py::value_error(what + "_displs" + at + " + " + what + "_counts" + at + " = " +
                              std::to_string(displs[r] + counts[r]) + " (expected at most " + what + "'s " +
                              std::to_string(bytes) + " bytes: rank " + std::to_string(r) + "'s bytes lie in " + what +
                              ")");
    }
  }
  template <typename F>
  void run(F&& f) {
    Status s;
    {
      py::gil_scoped_release nogil;
      s = f();
    }
    interrupt_->raise_if_any();
    throw_if_error(s);
  }

  std::shared_ptr<Interrupt> interrupt_ = std::make_shared<Interrupt>();
  std::unique_ptr<dispatch::Communicator> comm_;
};

}  // namespace
}  // namespace strata::python

PYBIND11_MODULE(_strata, m) {
  using namespace strata;
  using namespace strata::python;
  m.doc() = "Strata embedding store (C++ core). Use the package `strata`, not this module.";
  register_device_types(m);
  py::class_<PyStore>(m, "Store", R"(An embedding store opened from a config (dict or JSON string).

Training step per batch id: [preview] -> submit -> forward -> backward (or discard). Keys are
NumPy arrays or CPU tensors (int64; int32 widened); outputs and gradients (rows, dim) of each
table's output_dtype (float32; float16 or bfloat16 in host memory), in host memory or in the
store's device memory (float32 objects with __cuda_array_interface__).
Bad input raises ValueError/TypeError (RuntimeError for state and device errors) and changes
nothing. Calls release the GIL; one call runs at a time per store.)")
      .def(py::init<py::handle, py::handle, py::handle>(), py::arg("config"), py::arg("process_group") = py::none(),
           py::arg("timeout") = py::none(),
           "config: a dict or a JSON string (README, \"Using the store\"). process_group: None (a store of this "
           "process alone) or a torch.distributed.ProcessGroup: the store is then this process's rank of a world over "
           "the group's ranks (Store::open(config, comm)): every rank opens it with the same config and makes the "
           "same calls in the same order (submit, forward, backward, discard, read_rows, set_learning_rate, close "
           "are collectives), each rank with its own batches; each row's update is the sum of every rank's "
           "gradients. Anything else is a TypeError. timeout: how long a collective waits for the other ranks "
           "(seconds, or a datetime.timedelta, from 1 ms to 365 days; None: torch.distributed's "
           "default_pg_timeout); a peer that does not arrive fails the call with RuntimeError 'timed out after N "
           "ms', one that left with 'a peer left the process group' (Ctrl-C interrupts the wait). Close a world's "
           "store with close(): it discards the batches in flight, a collective.")
      .def("close", &PyStore::close,
           "Discards the batches in flight (in a world a collective: every rank calls it) and destroys the store, "
           "or, while a DeviceArray or Stream it made is alive, leaves its device and memory to them until the last "
           "goes (usable meanwhile; no collective then). Later calls raise 'store is closed'; a second close() does "
           "nothing.")
      .def_property_readonly("world", &PyStore::world,
                             "None for a store of this process alone, else {'rank', 'size', 'kind': 'torch', "
                             "'backend': 'gloo' | 'nccl' | ...}.")
      .def_property_readonly("_world_broken", &PyStore::world_broken,
                             "Internal: None, or the first error that broke the world's communicator (every "
                             "collective of the store fails since).")
      .def("shard_info", &PyStore::shard_info, py::arg("table"),
           "What this rank holds of a table (by name or index; Store::shard_info): {'type': 'replicated' | "
           "'table' | 'row' | 'column', 'world', 'rank', 'rows', 'dim' (the whole table's), 'local_rows', "
           "'row_start', 'row_step' (local row i is global row row_start + i * row_step), 'col_offset', "
           "'local_dim' (local column j is global column col_offset + j), 'state_dim' (the whole table's optimizer "
           "state columns), 'replicas' (the ranks holding the same shard)}. Local: no collective. Without a world: the "
           "whole table, 'replicated', rank 0 of 1.")
      .def("read_shard", &PyStore::read_shard, py::arg("table"), py::arg("local_row0"), py::arg("n"),
           "Returns (weights float32 (n, local_dim), state float32 (n, state columns)) of local rows [local_row0, "
           "local_row0 + n) of this rank's shard (Store::read_shard; local: no collective). Refuses a table this "
           "rank does not hold, except for 0 rows from 0 (two empty arrays).")
      .def("write_shard", &PyStore::write_shard, py::arg("table"), py::arg("local_row0"), py::arg("weights"),
           py::arg("state") = py::none(),
           "Overwrites local rows [local_row0, local_row0 + len(weights)) of this rank's shard, and their "
           "optimizer state when `state` is given (Store::write_shard; local: no collective; no batch may be in "
           "flight). A replicated table's other replicas keep their rows: give each the same.")
      .def_static("from_checkpoint", &PyStore::from_checkpoint, py::arg("dir"), py::arg("overrides") = py::none(),
                  "Opens a store from a checkpoint alone (Store::open_checkpoint): the config its manifest "
                  "recorded, with the rows, optimizer state, step and learning rates. `overrides` (a dict merged "
                  "into that config: dicts key by key, 'tables' as {name: {...}}) may change what may differ between "
                  "ranks (what describes this machine or tunes speed and never changes results; the error of any "
                  "other change lists it); any other change raises ValueError naming the field.")
      .def("__repr__", &PyStore::repr)
      .def("submit", &PyStore::submit, py::arg("batch_id"), py::arg("features"), py::kw_only(), py::arg("train") = true,
           "Validates and submits a batch (batch_id: an int) of features {feature: {'keys', 'offsets' | 'lengths', "
           "['weights']}}. train=False: an evaluation batch (forward, then discard; dynamic tables admit nothing).")
      .def("preview", &PyStore::preview, py::arg("batch_id"), py::arg("features"),
           "Announces the keys of a batch to be submitted later (cache planning only).")
      .def("drop_previews",
           [](PyStore& p) {
             p.call([](Store& s) {
               s.drop_previews();
               return Status::ok();
             });
           })
      .def("forward", &PyStore::forward, py::arg("batch_id"), py::arg("outputs") = py::none(),
           py::arg("stream") = py::none(),
           "Looks up a submitted batch. Writes into `outputs` when given (one per feature, C-contiguous, of the "
           "table's output_dtype: float32, float16, or bfloat16 as a torch.bfloat16 tensor or its bits as int16; "
           "NumPy arrays or CPU tensors, or device arrays of the store's device: CUDA tensors, CuPy arrays, "
           "DeviceArray; a list is a TypeError), else into new NumPy arrays (a bf16 one holds the bits as int16: "
           "torch.from_numpy(a).view(torch.bfloat16)); returns them. Without `stream` it "
           "returns once every output is written; with one (a Stream, or a CUDA stream handle as an int or "
           "torch.cuda.Stream) it is Store::forward(id, views, stream): the writes are ordered after the work "
           "queued on the stream and before what is queued after the call. The store writes with the GIL "
           "released: no other thread may resize or free an output meanwhile.")
      .def("backward", &PyStore::backward, py::arg("batch_id"), py::arg("grads"), py::arg("stream") = py::none(),
           "Applies gradients (of the table's output_dtype, as forward's outputs, shaped as they are and in their "
           "memory: host or device) with the "
           "fused optimizer and retires the batch. `stream` as for forward (stream-ordered: the gradients are read "
           "before what is queued on the stream after the call; store/store.hpp says what the host waits for).")
      .def("discard", &PyStore::discard, py::arg("batch_id"), "Retires a submitted batch without backward.")
      .def("flush", [](PyStore& p) { p.call([](Store& s) { return s.flush(); }); })
      .def(
          "save",
          [](PyStore& p, py::handle dir) {
            const std::string d = to_path(dir, "dir");
            p.call([&](Store& s) { return s.save(d); });
          },
          py::arg("dir"),
          "Writes a checkpoint (dir: a path) of every table's rows and optimizer state, each table's learning rate "
          "and the step.")
      .def(
          "load",
          [](PyStore& p, py::handle dir, py::handle convert) {
            const std::string d = to_path(dir, "dir");
            if (!py::isinstance<py::bool_>(convert))
              throw py::type_error("convert_dtypes is a " + type_name(convert) + " (expected a bool)");
            const bool c = convert.cast<bool>();
            p.call([&](Store& s) { return c ? s.load_converting_dtypes(d) : s.load(d); });
          },
          py::arg("dir"), py::kw_only(), py::arg("convert_dtypes") = false,
          "Restores a checkpoint written by save(): rows, optimizer state, step and each table's learning rate "
          "(the checkpoint's rate wins over the config's; call set_learning_rate after load to change it). A table "
          "saved at another dtype or state_dtype is refused unless convert_dtypes=True (rounded to nearest into a "
          "half-size dtype, widened exactly into fp32).")
      .def(
          "export_npy",
          [](PyStore& p, py::handle table, py::handle path) {
            const std::string t = to_name(table, "table"), f = to_path(path, "path");
            p.call([&](Store& s) { return s.export_npy(t, f); });
          },
          py::arg("table"), py::arg("path"),
          "Writes a table's weights as a .npy file (rows, dim): float32, float16 for an fp16 table (bf16 "
          "rows widened to float32: NumPy has no bfloat16).")
      .def(
          "import_npy",
          [](PyStore& p, py::handle table, py::handle path) {
            const std::string t = to_name(table, "table"), f = to_path(path, "path");
            p.call([&](Store& s) { return s.import_npy(t, f); });
          },
          py::arg("table"), py::arg("path"),
          "Replaces a table's weights from a .npy file (rows, dim) of float32 or float16, rounded to nearest into "
          "a half-size table's dtype (optimizer state, rates and step unchanged).")
      .def("read_rows", &PyStore::read_rows, py::arg("table"), py::arg("row0") = 0, py::arg("n") = py::none(),
           py::arg("out") = py::none(), py::arg("state_out") = py::none(),
           "Returns (weights (n, dim), state (n, state_dim)) of rows [row0, row0 + n) (n: to the end), written "
           "into `out`/`state_out` when given (as forward's outputs). Rows only: learning_rate() and step hold the "
           "rest of what the next backward reads.")
      .def("write_rows", &PyStore::write_rows, py::arg("table"), py::arg("row0"), py::arg("weights"),
           py::arg("state") = py::none(),
           "Overwrites rows [row0, row0 + len(weights)) (and their state when given). Rows only: the learning rates "
           "and the step stay (set_learning_rate, set_step).")
      .def("keys_held", &PyStore::keys_held, py::arg("table"),
           "A dynamic table's keys that have a row, ascending (an int64 NumPy array; Store::keys_held). ValueError "
           "for a dense table.")
      .def("read_keys", &PyStore::read_keys, py::arg("table"), py::arg("keys"), py::arg("out") = py::none(),
           py::arg("state_out") = py::none(),
           "Returns (weights (n, dim), state (n, state_dim)) of a dynamic table's rows of `keys` (1-D int64 or "
           "int32), written into `out`/`state_out` when given (as read_rows). ValueError naming the first key "
           "without a row (keys_held lists those with one), nothing copied.")
      .def("key_owner", &PyStore::key_owner, py::arg("table"), py::arg("keys"),
           "The rank whose shard of a dynamic table holds each key (1-D int64 or int32 keys; an int32 NumPy array "
           "of ranks), as the store's world routes them (dispatch::ShardLayout::key_owner: row sharding a hash of the "
           "key, table sharding the owner); 0 for every key of a store without a world. Local: no collective. "
           "ValueError for a dense table.")
      .def("write_keys", &PyStore::write_keys, py::arg("table"), py::arg("keys"), py::arg("weights"),
           py::arg("state") = py::none(),
           "Makes a dynamic table hold exactly `keys` (distinct, at most its capacity) with `weights` (len(keys), "
           "dim) and `state` (len(keys), state_dim; None: a key it held keeps its own state, a new one gets the "
           "initial state), each as just used (Store::write_keys). No batch may be in flight; errors change "
           "nothing.")
      .def("set_learning_rate", &PyStore::set_learning_rate, py::arg("lr"), py::arg("table") = py::none(),
           "Sets a table's learning rate (lr: a number; every table's when table is None), used from the next "
           "backward.")
      .def("learning_rate", &PyStore::learning_rate, py::arg("table"), "The learning rate in force for a table.")
      .def("set_step", &PyStore::set_step, py::arg("step"),
           "Sets the step counter (an int >= 0; the property `step`) with no batch in flight: the next backward is "
           "step + 1 (Adam's bias correction). With read_rows/write_rows and learning_rate/set_learning_rate it "
           "restores what load() restores from a checkpoint.")
      .def("stats", &PyStore::stats,
           "Counters since open (StoreStats): 'cache' per cached table, 'links' (bytes per link; 'host_copy': "
           "activations copied through host memory, 0 while every view is a device array), 'device_peak_bytes', "
           "'device_resources' (allocations, frees, events: a steady training loop adds none), 'staging' and "
           "'activation_staging' ({'pinned', 'device', 'entries', 'ahead': entries made rather than wait for the "
           "device}), 'dispatch' (sharded tables: 'rank', 'world', "
           "'batches', 'bytes' = 'key_bytes' + 'row_bytes' + 'grad_bytes' exchanged with other ranks, 'bytes_no_dedup' "
           "(what they would be without dedup at the source), 'admission_bytes' (dynamic tables' keys, uses and rows "
           "sent "
           "to their shards' ranks at submit), 'exchange_seconds', 'lookup_seconds', 'local_seconds'), "
           "'numa' (the host tier's {'memory_node', 'thread_node', 'pinned_node', 'note'}, -1: not bound), "
           "'numa_engines' (a list: that per engine, with 'engine'), 'numa_tables' (a list, per table of host rows: "
           "'table', 'placement', 'engine', 'memory_node', 'thread_node' and 'pages': {'sampled', 'unfaulted', "
           "'nodes': {OS node: sampled pages on it}, 'note'}, where up to 64 of its pages are), 'dynamic' (per "
           "dynamic table: {'rows' in use, 'capacity', 'admissions', 'evictions' (when full), 'expirations' (by "
           "evict_after_steps), 'not_admitted' and 'unseen' (uses of keys without a row: by training batches, by "
           "evaluation ones), 'index_bytes'}), 'step', 'in_flight'.")
      .def_property_readonly(
          "device", [](PyStore& p) { return device_info(p.device().get()); },
          "None for a store without a device, else {'backend', 'name', 'ordinal', 'capacity'}.")
      .def(
          "stream", [](PyStore& p) { return make_stream(p.device()); }, py::keep_alive<0, 1>(),
          "A new Stream of the store's device (RuntimeError without one).")
      .def(
          "device_array",
          [](PyStore& p, py::handle shape) {
            if (!py::isinstance<py::tuple>(shape) && !py::isinstance<py::list>(shape))
              throw py::type_error("shape is a " + type_name(shape) + " (expected (rows, cols): a tuple of two ints)");
            if (py::len(shape) != 2)
              throw py::value_error("shape " + py::repr(shape).cast<std::string>() +
                                    " (expected (rows, cols): a tuple of two ints)");
            const py::sequence rc = py::reinterpret_borrow<py::sequence>(shape);
            return make_device_array(p.device(), to_int(rc[0], "shape[0]"), to_int(rc[1], "shape[1]"));
          },
          py::keep_alive<0, 1>(), py::arg("shape"),
          "A new DeviceArray of `shape` (rows, cols) float32 in the store's device memory (uninitialized).")
      .def_property_readonly(
          "step", [](PyStore& p) { return p.read([](Store& s) { return s.step(); }); },
          "Backward calls applied so far (restored by load and set_step).")
      .def_property_readonly("in_flight", [](PyStore& p) { return p.read([](Store& s) { return s.in_flight(); }); })
      .def_property_readonly("previewed", [](PyStore& p) { return p.read([](Store& s) { return s.previewed(); }); })
      .def_property_readonly("config", [](PyStore& p) {
        const std::string text = p.read([](Store& s) { return to_json(s.config()); });
        return py::module_::import("json").attr("loads")(text);
      });
  py::class_<PyWorldComm>(m, "_WorldComm",
                          "Test-only: the transport communicator of a world over a torch.distributed ProcessGroup "
                          "(python/src/process_group.hpp) by itself, over NumPy arrays in host memory.")
      .def(py::init<py::handle, py::handle>(), py::arg("process_group"), py::arg("timeout") = py::none())
      .def_property_readonly("rank", &PyWorldComm::rank)
      .def_property_readonly("size", &PyWorldComm::size)
      .def("all_to_all_v", &PyWorldComm::all_to_all_v, py::arg("send"), py::arg("send_counts"), py::arg("send_displs"),
           py::arg("recv"), py::arg("recv_counts"), py::arg("recv_displs"),
           "Communicator::all_to_all_v in bytes (counts and displacements: one int per rank).")
      .def("all_gather", &PyWorldComm::all_gather, py::arg("send"),
           "Every rank's bytes of `send` in rank order (a new uint8 array).")
      .def("broadcast", &PyWorldComm::broadcast, py::arg("data"), py::arg("root"), "`root`'s bytes into `data`.")
      .def("all_reduce", &PyWorldComm::all_reduce, py::arg("data"), py::arg("op") = "sum",
           "In place over int32, int64, float32 or float64 `data`; op 'sum', 'min' or 'max'.")
      .def("barrier", &PyWorldComm::barrier)
      .def("counters", &PyWorldComm::counters, "{'sent_bytes', 'received_bytes', 'calls'}");
}
