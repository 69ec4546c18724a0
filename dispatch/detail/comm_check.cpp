#include "dispatch/detail/comm_check.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>
#include <utility>

namespace strata::dispatch::detail {

const char* collective_name(Collective c) noexcept {
  switch (c) {
    case Collective::kAllToAllV:
      return "all_to_all_v";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kBarrier:
      return "barrier";
  }
  return "unknown collective";
}

const char* data_type_name(DataType t) noexcept {
  switch (t) {
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
  }
  return "unknown type";
}

const char* reduce_op_name(ReduceOp op) noexcept {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
  }
  return "unknown op";
}

namespace {

bool valid_type(DataType t) {
  return t == DataType::kInt32 || t == DataType::kInt64 || t == DataType::kFloat32 || t == DataType::kFloat64;
}
bool valid_op(ReduceOp op) { return op == ReduceOp::kSum || op == ReduceOp::kMin || op == ReduceOp::kMax; }

// "ranks 0, 1, 3: 64; rank 2: 32": the ranks r with `listed(r)` (all when empty) grouped by
// value, groups in order of first rank; at most 16 groups (rank_list's cap), then "and N more
// ranks".
template <class T>
std::string grouped(const std::vector<T>& values, const std::function<std::string(const T&)>& show,
                    const char* separator = ": ", const std::function<bool(int)>& listed = {}) {
  constexpr std::size_t kMaxGroups = 16;
  std::vector<std::pair<const T*, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(values.size()); ++r) {
    if (listed && !listed(r)) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return *g.first == values[r]; });
    if (it == groups.end()) {
      groups.push_back({&values[r], {r}});
    } else {
      it->second.push_back(r);
    }
  }
  std::string out;
  std::size_t more = 0;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    if (i >= kMaxGroups) {
      more += groups[i].second.size();
      continue;
    }
    if (!out.empty()) out += "; ";
    out += rank_list(groups[i].second) + separator + show(*groups[i].first);
  }
  if (more) out += "; and " + std::to_string(more) + " more rank" + (more == 1 ? "" : "s");
  return out;
}

// InvalidArgument naming what the ranks disagree on, or OK when every rank has the same value.
template <class T>
Status agree_on(const char* kind, const char* what, const std::vector<T>& values,
                const std::function<std::string(const T&)>& show) {
  if (std::all_of(values.begin(), values.end(), [&](const T& v) { return v == values.front(); })) return Status::ok();
  return Status::invalid_argument(std::string(kind) + ": ranks disagree on " + what + ": " + grouped(values, show));
}

std::string show_int(const std::int64_t& v) { return std::to_string(v); }

// One non-empty range of an all_to_all_v: bytes [begin, end) of `send` (what goes to `rank`) or of
// `recv` (what comes from it), as addresses.
struct A2aRange {
  std::uintptr_t begin = 0, end = 0;
  bool recv = false;
  int rank = 0;
};

// "" when no byte is both in a send range and in a receive range (this rank's own share at the
// same address in both aside) and no byte is in two receive ranges, else a pair of ranges that
// overlap. Send ranges may overlap each other: they are only read (MPI allows it too). The counts
// and displacements are valid (non-negative, each range inside the address space). O(size) and
// no allocation when the send and receive ranges lie apart and the receive ranges come in rank
// order (the usual layouts); else O(size log size).
std::string a2a_overlap(int size, int me, const void* send, const std::int64_t* send_counts,
                        const std::int64_t* send_displs, const void* recv, const std::int64_t* recv_counts,
                        const std::int64_t* recv_displs) {
  const auto send_at = reinterpret_cast<std::uintptr_t>(send);
  const auto recv_at = reinterpret_cast<std::uintptr_t>(recv);
  // The own share in place (as many bytes to send as to receive, at one address): nothing moves,
  // so it is no receive range (it stays a send range).
  const bool own_in_place =
      me >= 0 && me < size && send_counts[me] == recv_counts[me] &&
      recv_at + static_cast<std::uintptr_t>(recv_displs[me]) == send_at + static_cast<std::uintptr_t>(send_displs[me]);
  auto range = [&](bool is_recv, int r) {
    A2aRange x;
    const std::int64_t count = is_recv ? recv_counts[r] : send_counts[r];
    if (count == 0 || (is_recv && r == me && own_in_place)) return x;  // empty: begin == end
    x.begin = (is_recv ? recv_at : send_at) + static_cast<std::uintptr_t>(is_recv ? recv_displs[r] : send_displs[r]);
    x.end = x.begin + static_cast<std::uintptr_t>(count);
    x.recv = is_recv;
    x.rank = r;
    return x;
  };

  // First the span of each kind, and whether the receive ranges come in rank order, each after
  // the last: then two receive ranges cannot overlap, and the usual call needs no sorting.
  std::uintptr_t lo[2] = {UINTPTR_MAX, UINTPTR_MAX}, hi[2] = {0, 0};
  bool recv_in_order = true;
  std::uintptr_t recv_reach = 0;
  int ranges = 0;
  for (bool is_recv : {false, true}) {
    for (int r = 0; r < size; ++r) {
      const A2aRange x = range(is_recv, r);
      if (x.begin == x.end) continue;
      ++ranges;
      lo[is_recv] = std::min(lo[is_recv], x.begin);
      hi[is_recv] = std::max(hi[is_recv], x.end);
      if (is_recv) {
        recv_in_order = recv_in_order && x.begin >= recv_reach;
        recv_reach = std::max(recv_reach, x.end);
      }
    }
  }
  const bool kinds_apart = hi[0] <= lo[1] || hi[1] <= lo[0];
  if (kinds_apart && recv_in_order) return "";

  std::vector<A2aRange> sorted;
  sorted.reserve(static_cast<std::size_t>(ranges));
  for (bool is_recv : {false, true}) {
    for (int r = 0; r < size; ++r) {
      const A2aRange x = range(is_recv, r);
      if (x.begin != x.end) sorted.push_back(x);
    }
  }
  std::sort(sorted.begin(), sorted.end(), [](const A2aRange& a, const A2aRange& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.recv != b.recv) return !a.recv;
    return a.rank < b.rank;
  });
  // In order of their starts, a range overlaps an earlier one of some kind iff the one of that
  // kind reaching furthest so far ends after it starts. A send range is checked against the
  // receive ranges only; a receive range against both kinds.
  const A2aRange* reach[2] = {nullptr, nullptr};
  for (const A2aRange& x : sorted) {
    const A2aRange* other = reach[!x.recv];
    if (other && other->end > x.begin) {
      const A2aRange& s = x.recv ? *other : x;
      const A2aRange& r = x.recv ? x : *other;
      return "send and recv overlap: the " + std::to_string(send_counts[s.rank]) + " bytes to rank " +
             std::to_string(s.rank) + " at send + " + std::to_string(send_displs[s.rank]) + " and the " +
             std::to_string(recv_counts[r.rank]) + " bytes from rank " + std::to_string(r.rank) + " at recv + " +
             std::to_string(recv_displs[r.rank]) + " share memory (only this rank's own share may be in place)";
    }
    if (x.recv && reach[1] && reach[1]->end > x.begin) {
      const A2aRange& a = *reach[1];
      return "recv ranges overlap: the " + std::to_string(recv_counts[a.rank]) + " bytes from rank " +
             std::to_string(a.rank) + " at recv + " + std::to_string(recv_displs[a.rank]) + " and the " +
             std::to_string(recv_counts[x.rank]) + " bytes from rank " + std::to_string(x.rank) + " at recv + " +
             std::to_string(recv_displs[x.rank]) + " share memory (each byte of recv may receive one share only)";
    }
    if (!reach[x.recv] || x.end > reach[x.recv]->end) reach[x.recv] = &x;
  }
  return "";
}

// "" when the `count` bytes (> 0) at `base + displ` (base not null, displ >= 0) can be addressed:
// displ + count fits int64 and the range ends inside the address space. Else what is wrong, for
// the range to or from `rank`.
std::string addressable(bool is_recv, int rank, const void* base, std::int64_t count, std::int64_t displ) {
  const char* kind = is_recv ? "recv" : "send";
  if (displ > std::numeric_limits<std::int64_t>::max() - count) {
    return std::string(kind) + "_displs[" + std::to_string(rank) + "] + " + kind + "_counts[" + std::to_string(rank) +
           "] = " + std::to_string(displ) + " + " + std::to_string(count) + " overflows int64";
  }
  const auto at = reinterpret_cast<std::uintptr_t>(base);
  if (static_cast<std::uintmax_t>(displ + count) > std::uintmax_t{UINTPTR_MAX - at}) {
    return "the " + std::to_string(count) + " bytes " + (is_recv ? "from" : "to") + " rank " + std::to_string(rank) +
           " at " + kind + " + " + std::to_string(displ) + " run past the end of the address space";
  }
  return "";
}

}  // namespace

std::string check_a2a_arguments(int size, int me, const void* send, const std::int64_t* send_counts,
                                const std::int64_t* send_displs, const void* recv, const std::int64_t* recv_counts,
                                const std::int64_t* recv_displs) {
  if (!send_counts || !send_displs || !recv_counts || !recv_displs) {
    return "the count and displacement arrays must not be null (each has size() entries)";
  }
  std::int64_t send_total = 0;
  for (int r = 0; r < size; ++r) {
    if (send_counts[r] < 0)
      return "send_counts[" + std::to_string(r) + "] = " + std::to_string(send_counts[r]) + " is negative";
    if (recv_counts[r] < 0)
      return "recv_counts[" + std::to_string(r) + "] = " + std::to_string(recv_counts[r]) + " is negative";
    if (send_displs[r] < 0)
      return "send_displs[" + std::to_string(r) + "] = " + std::to_string(send_displs[r]) + " is negative";
    if (recv_displs[r] < 0)
      return "recv_displs[" + std::to_string(r) + "] = " + std::to_string(recv_displs[r]) + " is negative";
    if (send_counts[r] > 0 && !send)
      return "send is null but send_counts[" + std::to_string(r) + "] = " + std::to_string(send_counts[r]);
    if (recv_counts[r] > 0 && !recv)
      return "recv is null but recv_counts[" + std::to_string(r) + "] = " + std::to_string(recv_counts[r]);
    // Beyond this point every communicator computes `displ + count` and `base + displ + count`.
    if (send_counts[r] > 0) {
      std::string e = addressable(false, r, send, send_counts[r], send_displs[r]);
      if (!e.empty()) return e;
    }
    if (recv_counts[r] > 0) {
      std::string e = addressable(true, r, recv, recv_counts[r], recv_displs[r]);
      if (!e.empty()) return e;
    }
    // Send ranges may overlap, so their total is not bounded by what they span (the receive
    // ranges', which may not, is), and the communicators add them up.
    if (send_counts[r] > std::numeric_limits<std::int64_t>::max() - send_total) {
      return "the send counts overflow int64: send_counts[" + std::to_string(r) +
             "] = " + std::to_string(send_counts[r]) + " after " + std::to_string(send_total) +
             " bytes to the ranks before it";
    }
    send_total += send_counts[r];
  }
  return a2a_overlap(size, me, send, send_counts, send_displs, recv, recv_counts, recv_displs);
}

std::string check_all_gather_arguments(int size, const void* send, std::int64_t bytes, const void* recv) {
  if (bytes < 0) return "bytes = " + std::to_string(bytes) + " is negative";
  if (size > 0 && bytes > std::numeric_limits<std::int64_t>::max() / size)
    return "bytes = " + std::to_string(bytes) + " from each of " + std::to_string(size) +
           " ranks add up past int64 (the receive buffer holds them all)";
  if (bytes > 0 && (!send || !recv)) return "send and recv must not be null when bytes = " + std::to_string(bytes);
  return "";
}

std::string check_all_reduce_arguments(const void* data, std::int64_t count, DataType type, ReduceOp op) {
  if (count < 0) return "count = " + std::to_string(count) + " is negative";
  if (!valid_type(type)) return "data type " + std::to_string(static_cast<int>(type)) + " is not a DataType";
  if (!valid_op(op)) return "reduce op " + std::to_string(static_cast<int>(op)) + " is not a ReduceOp";
  if (count > 0 && !data) return "data is null but count = " + std::to_string(count);
  return "";
}

std::string check_broadcast_arguments(int size, const void* data, std::int64_t bytes, int root) {
  if (root < 0 || root >= size)
    return "root " + std::to_string(root) + " out of range [0, " + std::to_string(size) + ")";
  if (bytes < 0) return "bytes = " + std::to_string(bytes) + " is negative";
  if (bytes > 0 && !data) return "data is null but bytes = " + std::to_string(bytes);
  return "";
}

std::string check_space(const BufferSpace& space) {
  if (!space.on_device() || space.device->owns(space.stream)) return "";
  return "device buffers ordered on " +
         std::string(space.stream.device() ? "a stream of another device" : "an empty stream view") +
         " (expected a stream of the buffers' device " + space.device->info().name + ")";
}

Status ready_space(const BufferSpace& space) {
  if (!space.on_device()) return Status::ok();
  return space.device->synchronize(space.stream)
      .with_context("device " + space.device->info().name + " failed before the collective");
}

void judge_space(CallInfo& info, const BufferSpace& space) {
  if (info.arg_error.empty()) info.arg_error = check_space(space);
  if (info.arg_error.empty()) info.device_error = ready_space(space);
}

void judge_staging(CallInfo& info, const std::string& space_error, const Status& device_error) {
  if (info.arg_error.empty()) info.arg_error = space_error;
  if (info.arg_error.empty()) info.device_error = device_error;
}

void copy_text(char* dst, std::size_t cap, const std::string& text) noexcept {
  static constexpr char kCut[] = "\u2026";  // "…", 3 bytes of UTF-8
  std::size_t n = text.size();
  const bool cut = n > cap - 1;
  if (cut) {
    n = cap - sizeof(kCut);  // room for the mark and the NUL
    // Not inside a character: back to the start of the one the cut falls in.
    while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
    while (n > 0 && (text[n - 1] == ' ' || text[n - 1] == '(' || text[n - 1] == '[')) --n;
  }
  std::memcpy(dst, text.data(), n);
  if (cut) {
    std::memcpy(dst + n, kCut, sizeof(kCut));  // with its NUL
  } else {
    dst[n] = '\0';
  }
}

void encode_failure(const CallInfo& info, std::int32_t& has_arg_error, std::int32_t& device_code, char* text,
                    std::size_t cap) noexcept {
  has_arg_error = info.arg_error.empty() ? 0 : 1;
  device_code = has_arg_error ? 0 : static_cast<std::int32_t>(info.device_error.code());
  copy_text(text, cap, has_arg_error ? info.arg_error : info.device_error.message());
}

void decode_failure(std::int32_t has_arg_error, std::int32_t device_code, const char* text, std::size_t cap,
                    CallInfo& info) {
  std::string s(text, std::find(text, text + cap, '\0'));
  if (has_arg_error) {
    info.arg_error = s.empty() ? "invalid arguments" : std::move(s);
  } else if (device_code != 0) {
    info.device_error = Status::from_code(static_cast<StatusCode>(device_code), std::move(s));
  }
}

CallInfo all_to_all_v_call(int size, int me, const void* send, const std::int64_t* send_counts,
                           const std::int64_t* send_displs, const void* recv, const std::int64_t* recv_counts,
                           const std::int64_t* recv_displs) {
  CallInfo c;
  c.kind = Collective::kAllToAllV;
  c.send_counts = send_counts;
  c.recv_counts = recv_counts;
  c.arg_error = check_a2a_arguments(size, me, send, send_counts, send_displs, recv, recv_counts, recv_displs);
  return c;
}

CallInfo all_gather_call(int size, const void* send, std::int64_t bytes, const void* recv) {
  CallInfo c;
  c.kind = Collective::kAllGather;
  c.bytes = bytes;
  c.arg_error = check_all_gather_arguments(size, send, bytes, recv);
  return c;
}

CallInfo all_reduce_call(const void* data, std::int64_t count, DataType type, ReduceOp op) {
  CallInfo c;
  c.kind = Collective::kAllReduce;
  c.count = count;
  c.type = type;
  c.op = op;
  c.arg_error = check_all_reduce_arguments(data, count, type, op);
  return c;
}

CallInfo broadcast_call(int size, const void* data, std::int64_t bytes, int root) {
  CallInfo c;
  c.kind = Collective::kBroadcast;
  c.bytes = bytes;
  c.root = root;
  c.arg_error = check_broadcast_arguments(size, data, bytes, root);
  return c;
}

std::size_t encode_call(const CallInfo& call, std::uint64_t seq, int size, std::int64_t* out) noexcept {
  WireHeader h;
  std::memcpy(h.magic, kWireMagic, sizeof(kWireMagic));
  h.seq = seq;
  h.bytes = call.bytes;
  h.count = call.count;
  h.kind = static_cast<std::int32_t>(call.kind);
  h.type = static_cast<std::int32_t>(call.type);
  h.op = static_cast<std::int32_t>(call.op);
  h.root = call.root;
  encode_failure(call, h.has_arg_error, h.device_code, h.error, sizeof(h.error));
  std::memset(out, 0, wire_words(size) * sizeof(std::int64_t));
  std::memcpy(out, &h, sizeof(h));
  if (call.kind != Collective::kAllToAllV || !call.arg_error.empty()) return kWireHeaderWords;
  std::memcpy(out + kWireHeaderWords, call.send_counts, static_cast<std::size_t>(size) * sizeof(std::int64_t));
  std::memcpy(out + kWireHeaderWords + size, call.recv_counts, static_cast<std::size_t>(size) * sizeof(std::int64_t));
  return wire_words(size);
}

bool is_wire_header(const std::int64_t* in) noexcept { return std::memcmp(in, kWireMagic, sizeof(kWireMagic)) == 0; }

std::uint64_t decode_call(const std::int64_t* in, int size, CallInfo& call) {
  WireHeader h;
  std::memcpy(static_cast<void*>(&h), in, sizeof(h));
  call.kind = static_cast<Collective>(h.kind);
  call.bytes = h.bytes;
  call.count = h.count;
  call.type = static_cast<DataType>(h.type);
  call.op = static_cast<ReduceOp>(h.op);
  call.root = h.root;
  decode_failure(h.has_arg_error, h.device_code, h.error, sizeof(h.error), call);
  if (call.kind == Collective::kAllToAllV && !h.has_arg_error) {
    call.send_counts = in + kWireHeaderWords;
    call.recv_counts = in + kWireHeaderWords + size;
  }
  return h.seq;
}

namespace {

// The breaking part of check_agreement: whether the ranks are in step and agree.
Status agreement(const std::vector<const CallInfo*>& calls) {
  const int n = static_cast<int>(calls.size());
  STRATA_CHECK(n > 0);
  const CallInfo& first = *calls[0];

  std::vector<std::int32_t> kinds(n);
  for (int r = 0; r < n; ++r) kinds[r] = static_cast<std::int32_t>(calls[r]->kind);
  if (std::any_of(kinds.begin(), kinds.end(), [&](std::int32_t k) { return k != kinds[0]; })) {
    const std::string msg =
        "collective mismatch: " +
        grouped<std::int32_t>(
            kinds, [](const std::int32_t& k) { return std::string(collective_name(static_cast<Collective>(k))); },
            " called ");
    return Status::failed_precondition(msg + " (every rank must make the same collective calls in the same order)");
  }
  const char* kind = collective_name(first.kind);

  std::string bad;
  for (int r = 0; r < n; ++r) {
    if (calls[r]->arg_error.empty()) continue;
    bad += bad.empty() ? "" : "; ";
    bad += "rank " + std::to_string(r) + ": " + calls[r]->arg_error;
  }
  if (!bad.empty()) return Status::invalid_argument(std::string(kind) + ": invalid arguments: " + bad);

  std::vector<std::int64_t> v(n);
  switch (first.kind) {
    case Collective::kAllGather:
      for (int r = 0; r < n; ++r) v[r] = calls[r]->bytes;
      return agree_on<std::int64_t>(kind, "bytes", v, show_int);
    case Collective::kAllReduce: {
      for (int r = 0; r < n; ++r) v[r] = calls[r]->count;
      STRATA_RETURN_IF_ERROR(agree_on<std::int64_t>(kind, "count", v, show_int));
      std::vector<std::int32_t> t(n);
      for (int r = 0; r < n; ++r) t[r] = static_cast<std::int32_t>(calls[r]->type);
      STRATA_RETURN_IF_ERROR(agree_on<std::int32_t>(kind, "data type", t, [](const std::int32_t& x) {
        return std::string(data_type_name(static_cast<DataType>(x)));
      }));
      for (int r = 0; r < n; ++r) t[r] = static_cast<std::int32_t>(calls[r]->op);
      return agree_on<std::int32_t>(kind, "reduce op", t, [](const std::int32_t& x) {
        return std::string(reduce_op_name(static_cast<ReduceOp>(x)));
      });
    }
    case Collective::kBroadcast: {
      for (int r = 0; r < n; ++r) v[r] = calls[r]->root;
      STRATA_RETURN_IF_ERROR(agree_on<std::int64_t>(kind, "root", v, show_int));
      for (int r = 0; r < n; ++r) v[r] = calls[r]->bytes;
      return agree_on<std::int64_t>(kind, "bytes", v, show_int);
    }
    case Collective::kAllToAllV: {
      constexpr int kMaxListed = 4;
      std::string msg;
      int mismatches = 0;
      for (int s = 0; s < n; ++s) {
        for (int r = 0; r < n; ++r) {
          const std::int64_t sent = calls[s]->send_counts[r];
          const std::int64_t expected = calls[r]->recv_counts[s];
          if (sent == expected) continue;
          if (mismatches++ < kMaxListed) {
            msg += msg.empty() ? "" : "; ";
            msg += "rank " + std::to_string(s) + " sends " + std::to_string(sent) + " bytes to rank " +
                   std::to_string(r) + ", which expects " + std::to_string(expected) + " from it";
          }
        }
      }
      if (mismatches == 0) return Status::ok();
      if (mismatches > kMaxListed) msg += "; and " + std::to_string(mismatches - kMaxListed) + " more mismatches";
      return Status::invalid_argument(std::string(kind) + ": send and receive counts disagree: " + msg);
    }
    case Collective::kBarrier:
      return Status::ok();
  }
  return Status::internal(std::string("unknown collective ") + std::to_string(kinds[0]) + " in a call");
}

}  // namespace

Verdict check_agreement(const std::vector<const CallInfo*>& calls) {
  Status disagreement = agreement(calls);
  if (!disagreement.is_ok()) return {std::move(disagreement), true};
  // The ranks are in step and nothing moved: the devices that failed fail the call on every rank,
  // the ranks with one message named together (the first failed rank's code), and the next call
  // goes on as usual.
  const int n = static_cast<int>(calls.size());
  std::vector<std::string> messages(n);
  StatusCode code = StatusCode::kOk;
  for (int r = 0; r < n; ++r) {
    const Status& e = calls[r]->device_error;
    if (e.is_ok()) continue;
    if (code == StatusCode::kOk) code = e.code();
    messages[r] = e.message();
  }
  if (code == StatusCode::kOk) return {};
  const std::string failed = grouped<std::string>(
      messages, [](const std::string& m) { return m; }, ": ", [&](int r) { return !calls[r]->device_error.is_ok(); });
  return {Status::from_code(code, std::string(collective_name(calls[0]->kind)) + ": " + failed +
                                      " (no data moved; the communicator stays usable)"),
          false};
}

std::string rank_list(const std::vector<int>& ranks) {
  constexpr std::size_t kMaxListed = 16;
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size() && i < kMaxListed; ++i) {
    if (i) out += ", ";
    out += std::to_string(ranks[i]);
  }
  if (ranks.size() > kMaxListed) out += " and " + std::to_string(ranks.size() - kMaxListed) + " more";
  return out;
}

Status timeout_status(const char* what, std::chrono::milliseconds timeout, const std::vector<int>& missing, int size) {
  return Status::unavailable(std::string(what) + ": timed out after " + std::to_string(timeout.count()) + " ms; " +
                             rank_list(missing) + " of " + std::to_string(size) + " did not arrive");
}

Status broken_status(const char* what, const Status& first) {
  return first.with_context(std::string(what) + ": communicator broken by an earlier failure");
}

MovedBytes moved_bytes(const CallInfo& call, int me, int size) {
  MovedBytes m;
  const std::int64_t peers = size - 1;
  switch (call.kind) {
    case Collective::kAllToAllV:
      for (int r = 0; r < size; ++r) {
        if (r == me) continue;
        m.sent += call.send_counts[r];
        m.received += call.recv_counts[r];
      }
      break;
    case Collective::kAllGather:
      m.sent = m.received = peers * call.bytes;
      break;
    case Collective::kAllReduce:
      m.sent = m.received = peers * call.count * static_cast<std::int64_t>(size_of(call.type));
      break;
    case Collective::kBroadcast:
      if (me == call.root) {
        m.sent = peers * call.bytes;
      } else {
        m.received = call.bytes;
      }
      break;
    case Collective::kBarrier:
      break;
  }
  return m;
}

void CallTally::count_moved(const CallInfo& call, int me, int size) noexcept {
  const MovedBytes m = moved_bytes(call, me, size);
  sent_.fetch_add(m.sent, std::memory_order_relaxed);
  received_.fetch_add(m.received, std::memory_order_relaxed);
}

CommCounters CallTally::counters() const noexcept {
  CommCounters c;
  c.sent_bytes = sent_.load(std::memory_order_relaxed);
  c.received_bytes = received_.load(std::memory_order_relaxed);
  c.calls = calls_.load(std::memory_order_relaxed);
  return c;
}

namespace {

template <class T, class Op>
void reduce_typed(T* acc, const T* in, std::int64_t n, Op op) noexcept {
  for (std::int64_t i = 0; i < n; ++i) acc[i] = op(acc[i], in[i]);
}

// Integer sums wrap (two's complement) instead of overflowing into undefined behaviour, as MPI
// and NCCL do in practice.
template <class T>
T add(T x, T y) noexcept {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(x) + static_cast<U>(y));
  } else {
    return x + y;
  }
}

template <class T>
void reduce_op(void* acc, const void* in, std::int64_t n, ReduceOp op) noexcept {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(in);
  switch (op) {
    case ReduceOp::kSum:
      reduce_typed(a, b, n, [](T x, T y) { return add(x, y); });
      break;
    case ReduceOp::kMin:
      reduce_typed(a, b, n, [](T x, T y) { return y < x ? y : x; });
      break;
    case ReduceOp::kMax:
      reduce_typed(a, b, n, [](T x, T y) { return x < y ? y : x; });
      break;
  }
}

}  // namespace

void reduce_into(void* acc, const void* in, std::int64_t count, DataType type, ReduceOp op) noexcept {
  switch (type) {
    case DataType::kInt32:
      reduce_op<std::int32_t>(acc, in, count, op);
      break;
    case DataType::kInt64:
      reduce_op<std::int64_t>(acc, in, count, op);
      break;
    case DataType::kFloat32:
      reduce_op<float>(acc, in, count, op);
      break;
    case DataType::kFloat64:
      reduce_op<double>(acc, in, count, op);
      break;
  }
}

}  // namespace strata::dispatch::detail
