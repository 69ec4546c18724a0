#include "dispatch/exchange.hpp"

#include "dispatch/agreement.hpp"
#include "gpu/grow_buffer.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

namespace strata::dispatch {
namespace {

// Exclusive prefix sums of per-rank byte counts.
std::vector<std::int64_t> displs_of(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> d(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

std::int64_t sum(const std::vector<std::int64_t>& v) {
  std::int64_t s = 0;
  for (std::int64_t x : v) s += x;
  return s;
}

constexpr std::int64_t kF = sizeof(float);

}  // namespace

Result<KeyExchange> KeyExchange::run(Communicator& comm, const std::vector<ExchangeInput>& tables) {
  KeyExchange ex;
  ex.me_ = comm.rank();
  ex.world_ = comm.size();
  const std::size_t T = tables.size(), N = static_cast<std::size_t>(ex.world_);
  ex.sent_.resize(N);
  ex.sent_uses_.resize(N);
  for (std::size_t d = 0; d < N; ++d) {
    ex.sent_[d].resize(T);
    ex.sent_uses_[d].resize(T, 0);
  }
  for (std::size_t t = 0; t < T; ++t) {
    const ExchangeInput& in = tables[t];
    ex.layouts_.push_back(in.layout);
    ex.n_.push_back(in.n);
    const auto uses = [&](std::int64_t u) { return in.use_offsets ? in.use_offsets[u + 1] - in.use_offsets[u] : 1; };
    for (std::int64_t u = 0; u < in.n; ++u) {
      if (in.layout->to_all()) {
        for (std::size_t d = 0; d < N; ++d) {
          ex.sent_[d][t].push_back(static_cast<std::int32_t>(u));
          ex.sent_uses_[d][t] += uses(u);
        }
      } else {
        const std::size_t d = static_cast<std::size_t>(in.layout->owner_of(in.keys[u]));
        ex.sent_[d][t].push_back(static_cast<std::int32_t>(u));
        ex.sent_uses_[d][t] += uses(u);
      }
    }
  }
  // Counts: T per destination.
  std::vector<std::int64_t> send_counts(N * T), recv_counts(N * T);
  for (std::size_t d = 0; d < N; ++d)
    for (std::size_t t = 0; t < T; ++t) send_counts[d * T + t] = static_cast<std::int64_t>(ex.sent_[d][t].size());
  {
    const std::vector<std::int64_t> bytes(N, static_cast<std::int64_t>(T * sizeof(std::int64_t)));
    const std::vector<std::int64_t> displs = displs_of(bytes);
    STRATA_RETURN_IF_ERROR(comm.all_to_all_v(send_counts.data(), bytes.data(), displs.data(), recv_counts.data(),
                                             bytes.data(), displs.data()));
  }
  // Keys, as local rows of their holders.
  std::vector<std::int64_t> sbytes(N, 0), rbytes(N, 0);
  std::vector<Key> send_keys;
  for (std::size_t d = 0; d < N; ++d) {
    for (std::size_t t = 0; t < T; ++t) {
      for (std::int32_t u : ex.sent_[d][t]) send_keys.push_back(tables[t].layout->local_row(tables[t].keys[u]));
      sbytes[d] += static_cast<std::int64_t>(ex.sent_[d][t].size() * sizeof(Key));
      rbytes[d] += recv_counts[d * T + t] * static_cast<std::int64_t>(sizeof(Key));
      if (static_cast<int>(d) != ex.me_) {
        const std::int64_t row_back = tables[t].layout->returns_rows(static_cast<int>(d), ex.me_)
                                          ? ex.row_floats(static_cast<int>(d), t) * kF
                                          : 0;
        const std::int64_t grad = ex.row_floats(static_cast<int>(d), t) * kF;
        const std::int64_t k = static_cast<std::int64_t>(ex.sent_[d][t].size()), k_all = ex.sent_uses_[d][t];
        ex.bytes_.keys += k * static_cast<std::int64_t>(sizeof(Key));
        ex.bytes_.keys_no_dedup += k_all * static_cast<std::int64_t>(sizeof(Key));
        // Rows come back to this rank and gradients leave it: counted here as this rank's traffic
        // with its holders (each direction is counted by the rank it belongs to).
        ex.bytes_.rows += k * row_back;
        ex.bytes_.rows_no_dedup += k_all * row_back;
        ex.bytes_.grads += k * grad;
        ex.bytes_.grads_no_dedup += k_all * grad;
      }
    }
  }
  std::vector<Key> recv_keys(static_cast<std::size_t>(sum(rbytes)) / sizeof(Key));
  {
    const auto sd = displs_of(sbytes), rd = displs_of(rbytes);
    STRATA_RETURN_IF_ERROR(
        comm.all_to_all_v(send_keys.data(), sbytes.data(), sd.data(), recv_keys.data(), rbytes.data(), rd.data()));
  }
  // Served keys per table, sources in rank order.
  ex.served_.assign(T, {});
  ex.served_off_.assign(T, std::vector<std::int64_t>(N + 1, 0));
  for (std::size_t t = 0; t < T; ++t)
    for (std::size_t s = 0; s < N; ++s) ex.served_off_[t][s + 1] = ex.served_off_[t][s] + recv_counts[s * T + t];
  for (std::size_t t = 0; t < T; ++t) ex.served_[t].resize(static_cast<std::size_t>(ex.served_off_[t][N]));
  std::size_t pos = 0;
  for (std::size_t s = 0; s < N; ++s)
    for (std::size_t t = 0; t < T; ++t) {
      const std::size_t c = static_cast<std::size_t>(recv_counts[s * T + t]);
      if (c) std::memcpy(ex.served_[t].data() + ex.served_off_[t][s], recv_keys.data() + pos, c * sizeof(Key));
      pos += c;
    }
  return ex;
}

Status KeyExchange::return_rows(Communicator& comm, const std::vector<const float*>& served_rows,
                                const std::vector<float*>& unique_rows) {
  const std::size_t T = layouts_.size(), N = static_cast<std::size_t>(world_);
  std::vector<std::int64_t> sbytes(N, 0), rbytes(N, 0);
  for (std::size_t s = 0; s < N; ++s)
    for (std::size_t t = 0; t < T; ++t) {
      if (layouts_[t]->returns_rows(me_, static_cast<int>(s)))
        sbytes[s] += (served_off_[t][s + 1] - served_off_[t][s]) * row_floats(me_, t) * kF;
      if (layouts_[t]->returns_rows(static_cast<int>(s), me_))
        rbytes[s] += static_cast<std::int64_t>(sent_[s][t].size()) * row_floats(static_cast<int>(s), t) * kF;
    }
  send_buf_.resize(static_cast<std::size_t>(sum(sbytes) / kF));
  recv_buf_.resize(static_cast<std::size_t>(sum(rbytes) / kF));
  float* out = send_buf_.data();
  for (std::size_t s = 0; s < N; ++s)
    for (std::size_t t = 0; t < T; ++t) {
      if (!layouts_[t]->returns_rows(me_, static_cast<int>(s))) continue;
      const std::int64_t w = row_floats(me_, t), n = served_off_[t][s + 1] - served_off_[t][s];
      if (n) std::memcpy(out, served_rows[t] + served_off_[t][s] * w, static_cast<std::size_t>(n * w) * sizeof(float));
      out += n * w;
    }
  const auto sd = displs_of(sbytes), rd = displs_of(rbytes);
  STRATA_RETURN_IF_ERROR(
      comm.all_to_all_v(send_buf_.data(), sbytes.data(), sd.data(), recv_buf_.data(), rbytes.data(), rd.data()));
  const float* in = recv_buf_.data();
  for (std::size_t o = 0; o < N; ++o)
    for (std::size_t t = 0; t < T; ++t) {
      if (!layouts_[t]->returns_rows(static_cast<int>(o), me_)) continue;
      const std::int64_t w = row_floats(static_cast<int>(o), t), dim = layouts_[t]->dim();
      const std::int64_t c0 = layouts_[t]->col_offset(static_cast<int>(o));
      for (std::int32_t u : sent_[o][t]) {
        std::memcpy(unique_rows[t] + u * dim + c0, in, static_cast<std::size_t>(w) * sizeof(float));
        in += w;
      }
    }
  return Status::ok();
}

Status KeyExchange::send_grads(Communicator& comm, const std::vector<const float*>& unique_grads,
                               const std::vector<float*>& served_grads) {
  const std::size_t T = layouts_.size(), N = static_cast<std::size_t>(world_);
  std::vector<std::int64_t> sbytes(N, 0), rbytes(N, 0);
  for (std::size_t d = 0; d < N; ++d)
    for (std::size_t t = 0; t < T; ++t) {
      sbytes[d] += static_cast<std::int64_t>(sent_[d][t].size()) * row_floats(static_cast<int>(d), t) * kF;
      rbytes[d] += (served_off_[t][d + 1] - served_off_[t][d]) * row_floats(me_, t) * kF;
    }
  send_buf_.resize(static_cast<std::size_t>(sum(sbytes) / kF));
  recv_buf_.resize(static_cast<std::size_t>(sum(rbytes) / kF));
  float* out = send_buf_.data();
  for (std::size_t d = 0; d < N; ++d)
    for (std::size_t t = 0; t < T; ++t) {
      const std::int64_t w = row_floats(static_cast<int>(d), t), dim = layouts_[t]->dim();
      const std::int64_t c0 = layouts_[t]->col_offset(static_cast<int>(d));
      for (std::int32_t u : sent_[d][t]) {
        std::memcpy(out, unique_grads[t] + u * dim + c0, static_cast<std::size_t>(w) * sizeof(float));
        out += w;
      }
    }
  const auto sd = displs_of(sbytes), rd = displs_of(rbytes);
  STRATA_RETURN_IF_ERROR(
      comm.all_to_all_v(send_buf_.data(), sbytes.data(), sd.data(), recv_buf_.data(), rbytes.data(), rd.data()));
  const float* in = recv_buf_.data();
  for (std::size_t s = 0; s < N; ++s)
    for (std::size_t t = 0; t < T; ++t) {
      const std::int64_t w = row_floats(me_, t), n = served_off_[t][s + 1] - served_off_[t][s];
      if (n) std::memcpy(served_grads[t] + served_off_[t][s] * w, in, static_cast<std::size_t>(n * w) * sizeof(float));
      in += n * w;
    }
  return Status::ok();
}

// ---- device buffers ----

namespace {}  // namespace

Status ExchangeWorkspace::reserve(std::size_t bytes, std::size_t keys) {
  STRATA_RETURN_IF_ERROR(gpu::grow_buffer(send_, bytes, *dev_));
  STRATA_RETURN_IF_ERROR(gpu::grow_buffer(recv_, bytes, *dev_));
  STRATA_RETURN_IF_ERROR(gpu::grow_buffer(index_, keys * sizeof(Key), *dev_));
  return gpu::grow_buffer(index_host_, keys * sizeof(Key), *dev_);
}

std::int64_t KeyExchange::index_keys() const {
  std::int64_t k = 0;
  for (const auto& per_table : sent_)
    for (const auto& v : per_table) k += static_cast<std::int64_t>(v.size());
  return k;
}

std::int64_t KeyExchange::wire_bytes() const {
  const std::size_t T = layouts_.size(), N = static_cast<std::size_t>(world_);
  std::int64_t sent = 0, served = 0;
  for (std::size_t d = 0; d < N; ++d)
    for (std::size_t t = 0; t < T; ++t) {
      sent += static_cast<std::int64_t>(sent_[d][t].size()) * row_floats(static_cast<int>(d), t) * kF;
      served += (served_off_[t][d + 1] - served_off_[t][d]) * row_floats(me_, t) * kF;
    }
  return std::max(sent, served);
}

Status KeyExchange::upload_index(ExchangeWorkspace& ws) const {
  const std::int64_t keys = index_keys();
  STRATA_RETURN_IF_ERROR(ws.reserve(0, static_cast<std::size_t>(keys)));
  // The pinned list may still be the source of the previous exchange's copy.
  STRATA_RETURN_IF_ERROR(ws.dev_->synchronize(ws.stream_));
  Key* at = ws.index_host_.as<Key>();
  for (const auto& per_table : sent_)
    for (const auto& v : per_table)
      for (std::int32_t u : v) *at++ = u;
  ws.dev_->copy_h2d(ws.stream_, ws.index_.data(), ws.index_host_.data(), static_cast<std::size_t>(keys) * sizeof(Key));
  return Status::ok();
}

namespace {

// The all-to-all of a device form. The ranks first agree (dispatch::agree, which leaves the
// communicator usable) that every one is ready: its local steps succeeded and its device has not
// failed (the stream's work before the exchange has run). A rank that is not makes every rank fail
// this call, and the store's later collectives (read_rows, save, discard) still work. A device that
// fails after the agreement (work of another stream in flight, an inner engine's) is found by the
// all-to-all's own readiness check, which fails the call on every rank the same way and leaves the
// communicator usable too; one that fails during the copies fails this rank's call.
Status exchange(Communicator& comm, ExchangeWorkspace& ws, const char* send, const std::vector<std::int64_t>& sbytes,
                char* recv, const std::vector<std::int64_t>& rbytes, const Status& local) {
  const auto sd = displs_of(sbytes), rd = displs_of(rbytes);
  const BufferSpace space = BufferSpace::on(ws.device(), ws.stream());
  Status ready = local;
  if (ready.is_ok()) ready = ws.device().synchronize(ws.stream());
  STRATA_RETURN_IF_ERROR(agree(comm, {"device exchange"}, ready));
  return comm.all_to_all_v(send, sbytes.data(), sd.data(), recv, rbytes.data(), rd.data(), space);
}

}  // namespace

Status KeyExchange::return_rows(Communicator& comm, ExchangeWorkspace& ws, const std::vector<const float*>& served_rows,
                                const std::vector<float*>& unique_rows, const Status& failed) {
  const std::size_t T = layouts_.size(), N = static_cast<std::size_t>(world_);
  gpu::Device& dev = *ws.dev_;
  const gpu::StreamView st = ws.stream_;
  std::vector<std::int64_t> sbytes(N, 0), rbytes(N, 0);
  for (std::size_t s = 0; s < N; ++s)
    for (std::size_t t = 0; t < T; ++t) {
      if (layouts_[t]->returns_rows(me_, static_cast<int>(s)))
        sbytes[s] += (served_off_[t][s + 1] - served_off_[t][s]) * row_floats(me_, t) * kF;
      if (layouts_[t]->returns_rows(static_cast<int>(s), me_))
        rbytes[s] += static_cast<std::int64_t>(sent_[s][t].size()) * row_floats(static_cast<int>(s), t) * kF;
    }
  // A failure here is this rank's alone; exchange() still meets the other ranks, whose agreement
  // fails every rank with it instead of letting them wait for this one.
  Status local = failed;
  if (local.is_ok()) local = upload_index(ws);
  if (local.is_ok()) local = ws.reserve(static_cast<std::size_t>(std::max(sum(sbytes), sum(rbytes))), 0);
  char* send = local.is_ok() ? ws.send_.as<char>() : nullptr;
  char* recv = local.is_ok() ? ws.recv_.as<char>() : nullptr;
  std::int64_t out = 0;
  if (local.is_ok()) {
    for (std::size_t s = 0; s < N; ++s)
      for (std::size_t t = 0; t < T; ++t) {
        if (!layouts_[t]->returns_rows(me_, static_cast<int>(s))) continue;
        const std::int64_t w = row_floats(me_, t), n = served_off_[t][s + 1] - served_off_[t][s];
        if (n)
          dev.copy_d2d(st, send + out, served_rows[t] + served_off_[t][s] * w, static_cast<std::size_t>(n * w * kF));
        out += n * w * kF;
      }
  }
  STRATA_RETURN_IF_ERROR(exchange(comm, ws, send, sbytes, recv, rbytes, local));
  std::int64_t in = 0, ix = 0;
  for (std::size_t o = 0; o < N; ++o)
    for (std::size_t t = 0; t < T; ++t) {
      const std::int64_t k = static_cast<std::int64_t>(sent_[o][t].size());
      if (layouts_[t]->returns_rows(static_cast<int>(o), me_) && k > 0) {
        const std::int64_t w = row_floats(static_cast<int>(o), t), dim = layouts_[t]->dim();
        const gpu::SlotPool rows{unique_rows[t], n_[t], dim, static_cast<std::int32_t>(w), 0};
        dev.put_columns(st, rows, layouts_[t]->col_offset(static_cast<int>(o)), ws.index_.as<Key>() + ix, k,
                        reinterpret_cast<const float*>(recv + in));
        in += k * w * kF;
      }
      ix += k;
    }
  return Status::ok();
}

Status KeyExchange::send_grads(Communicator& comm, ExchangeWorkspace& ws, const std::vector<const float*>& unique_grads,
                               const std::vector<float*>& served_grads, const Status& failed) {
  const std::size_t T = layouts_.size(), N = static_cast<std::size_t>(world_);
  gpu::Device& dev = *ws.dev_;
  const gpu::StreamView st = ws.stream_;
  std::vector<std::int64_t> sbytes(N, 0), rbytes(N, 0);
  for (std::size_t d = 0; d < N; ++d)
    for (std::size_t t = 0; t < T; ++t) {
      sbytes[d] += static_cast<std::int64_t>(sent_[d][t].size()) * row_floats(static_cast<int>(d), t) * kF;
      rbytes[d] += (served_off_[t][d + 1] - served_off_[t][d]) * row_floats(me_, t) * kF;
    }
  Status local = failed;
  if (local.is_ok()) local = upload_index(ws);
  if (local.is_ok()) local = ws.reserve(static_cast<std::size_t>(std::max(sum(sbytes), sum(rbytes))), 0);
  char* send = local.is_ok() ? ws.send_.as<char>() : nullptr;
  char* recv = local.is_ok() ? ws.recv_.as<char>() : nullptr;
  if (local.is_ok()) {
    std::int64_t out = 0, ix = 0;
    for (std::size_t d = 0; d < N; ++d)
      for (std::size_t t = 0; t < T; ++t) {
        const std::int64_t k = static_cast<std::int64_t>(sent_[d][t].size());
        const std::int64_t w = row_floats(static_cast<int>(d), t), dim = layouts_[t]->dim();
        if (k > 0) {
          const gpu::SlotPool rows{const_cast<float*>(unique_grads[t]), n_[t], dim, static_cast<std::int32_t>(w), 0};
          dev.take_columns(st, rows, layouts_[t]->col_offset(static_cast<int>(d)), ws.index_.as<Key>() + ix, k,
                           reinterpret_cast<float*>(send + out));
        }
        out += k * w * kF;
        ix += k;
      }
  }
  STRATA_RETURN_IF_ERROR(exchange(comm, ws, send, sbytes, recv, rbytes, local));
  std::int64_t in = 0;
  for (std::size_t src = 0; src < N; ++src)
    for (std::size_t t = 0; t < T; ++t) {
      const std::int64_t w = row_floats(me_, t), n = served_off_[t][src + 1] - served_off_[t][src];
      if (n) {
        dev.copy_d2d(st, served_grads[t] + served_off_[t][src] * w, recv + in, static_cast<std::size_t>(n * w * kF));
      }
      in += n * w * kF;
    }
  return Status::ok();
}

}  // namespace strata::dispatch
