#pragma once
// KeyExchange: the input and output dispatch of one batch between the ranks of a world
// (data parallel -> model parallel -> data parallel), for all sharded tables at once.
//
//   run()          every rank sends its unique keys of each table to the ranks that hold them (one
//                  exchange of counts, one of keys); each rank learns the keys it serves
//   return_rows()  forward: holders send the rows of the served keys back along the same path; the
//                  source puts them at its unique keys (column slices side by side)
//   send_grads()   backward: sources send the summed gradient of each unique key to its holders
//                  (every replica of a replicated table), which reduce them per row
//
// return_rows and send_grads come in two forms: host buffers, and device buffers with an
// ExchangeWorkspace (the engine's device scratch): then rows and gradients move device to device
// (packed with copies and column moves on the workspace's stream, exchanged by the communicator in
// device memory, BufferSpace), and only the lists of unique-key indexes cross PCIe, H2D.
//
// Keys are sent once per rank and batch (dedup happens before, at the source), so the bytes
// exchanged shrink by the batch's duplication factor. Tables are exchanged in one all-to-all per
// step, not one per table. All calls are collectives (see Communicator).

#include <cstdint>
#include <vector>

#include "core/status.hpp"
#include "core/table_spec.hpp"
#include "dispatch/communicator.hpp"
#include "dispatch/shard_layout.hpp"
#include "gpu/device.hpp"

namespace strata::dispatch {

/// Device scratch of one rank's exchanges, kept across batches: the wire buffers of the
/// all-to-alls and the index lists, each grown to twice the largest need (so a steady state
/// allocates nothing; growth frees and allocates, under cuda a device-wide sync). Its work runs on
/// `stream`. Not thread-safe; one exchange at a time.
class ExchangeWorkspace {
 public:
  /// Scratch of `device`, ordered on `stream` (a stream of `device`); both outlive the workspace.
  ExchangeWorkspace(gpu::Device& device, gpu::StreamView stream) noexcept : dev_(&device), stream_(stream) {}
  gpu::Device& device() const noexcept { return *dev_; }
  gpu::StreamView stream() const noexcept { return stream_; }
  /// Grows the wire buffers to at least `bytes` each and the index lists to `keys` entries (an
  /// engine reserves before its collectives, so that no exchange fails for memory midway).
  Status reserve(std::size_t bytes, std::size_t keys);

 private:
  friend class KeyExchange;
  gpu::Device* dev_;
  gpu::StreamView stream_;
  gpu::DeviceBuffer send_, recv_;  // all-to-all buffers
  gpu::DeviceBuffer index_;        // (keys) Key: unique-key indexes sent to each rank, per table
  gpu::PinnedBuffer index_host_;   // the same, staged for the H2D copy
};

/// One table of an exchange on this rank.
struct ExchangeInput {
  const ShardLayout* layout = nullptr;
  const Key* keys = nullptr;  ///< (n) this rank's unique keys of the batch (host)
  std::int64_t n = 0;
  const std::int64_t* use_offsets = nullptr;  ///< (n + 1) CSR offsets of each key's uses, or null (one use each)
};

/// Bytes this rank sent to other ranks (its own share excluded), and what they would have been
/// without dedup (every use of a key sent separately).
struct ExchangeBytes {
  std::int64_t keys = 0, rows = 0, grads = 0;
  std::int64_t keys_no_dedup = 0, rows_no_dedup = 0, grads_no_dedup = 0;
  std::int64_t total() const noexcept { return keys + rows + grads; }
  std::int64_t total_no_dedup() const noexcept { return keys_no_dedup + rows_no_dedup + grads_no_dedup; }
};

class KeyExchange {
 public:
  /// Collective: sends the keys (as local rows of their holders) and receives the served ones.
  static Result<KeyExchange> run(Communicator& comm, const std::vector<ExchangeInput>& tables);

  /// Local rows this rank serves for table t: every source's keys, sources in rank order.
  const std::vector<Key>& served(std::size_t t) const { return served_[t]; }
  /// Collective. served_rows[t]: (served(t).size(), local_dim(me)) in served order (may be null when
  /// empty); unique_rows[t]: (n_t, dim) host, receives the whole row of each unique key.
  Status return_rows(Communicator& comm, const std::vector<const float*>& served_rows,
                     const std::vector<float*>& unique_rows);
  /// Collective. unique_grads[t]: (n_t, dim), the summed gradient of each unique key;
  /// served_grads[t]: (served(t).size(), local_dim(me)) receives the served keys' gradients.
  Status send_grads(Communicator& comm, const std::vector<const float*>& unique_grads,
                    const std::vector<float*>& served_grads);

  /// Device form of return_rows: served_rows[t] (served(t).size(), local_dim(me)) and
  /// unique_rows[t] (n_t, dim) are device memory of ws.device(). Collective. Synchronizes
  /// ws.stream() (the served rows are read as the work queued there left them) and returns with
  /// the rows' placement at their unique keys queued on it. On the wire: the same bytes as the host
  /// form; over PCIe: the index lists (8 bytes per unique key sent, H2D).
  /// `local`: an error of this rank before the exchange; the ranks still meet, agree that it
  /// failed (dispatch::agree: every rank fails the call, and the communicator stays usable) and
  /// `local` is returned. The same happens when this rank fails to prepare the exchange (the index
  /// upload).
  Status return_rows(Communicator& comm, ExchangeWorkspace& ws, const std::vector<const float*>& served_rows,
                     const std::vector<float*>& unique_rows, const Status& local = Status::ok());
  /// Device form of send_grads: unique_grads[t] (n_t, dim) and served_grads[t]
  /// (served(t).size(), local_dim(me)) device memory of ws.device(). Collective. Synchronizes
  /// ws.stream() (the sums are read as the work queued there left them) and returns with the
  /// served gradients' placement queued on it.
  Status send_grads(Communicator& comm, ExchangeWorkspace& ws, const std::vector<const float*>& unique_grads,
                    const std::vector<float*>& served_grads, const Status& local = Status::ok());
  /// Wire bytes of return_rows and send_grads on this rank (the larger of what it sends and
  /// receives) and the unique-key indexes of send/receive lists: what ExchangeWorkspace::reserve needs.
  std::int64_t wire_bytes() const;
  std::int64_t index_keys() const;

  const ExchangeBytes& bytes() const noexcept { return bytes_; }

 private:
  // Copies the index lists sent_ (in [rank][table] order) to ws.index_ on ws.stream().
  Status upload_index(ExchangeWorkspace& ws) const;

  std::int64_t row_floats(int holder, std::size_t t) const { return layouts_[t]->local_dim(holder); }

  int me_ = 0, world_ = 1;
  std::vector<const ShardLayout*> layouts_;
  std::vector<std::int64_t> n_;
  std::vector<std::vector<std::vector<std::int32_t>>> sent_;  // [dest][table]: indexes of unique keys sent
  std::vector<std::vector<std::int64_t>> sent_uses_;          // [dest][table]: uses of the keys sent
  std::vector<std::vector<Key>> served_;                      // [table]
  std::vector<std::vector<std::int64_t>> served_off_;         // [table][source + 1]: CSR into served_[table]
  std::vector<float> send_buf_, recv_buf_;
  ExchangeBytes bytes_;
};

}  // namespace strata::dispatch
