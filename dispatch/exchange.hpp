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
// Keys are sent once per rank and batch (dedup happens before, at the source), so the bytes
// exchanged shrink by the batch's duplication factor. Tables are exchanged in one all-to-all per
// step, not one per table. All calls are collectives (see Communicator).

#include <cstdint>
#include <vector>

#include "core/status.hpp"
#include "core/table_spec.hpp"
#include "dispatch/communicator.hpp"
#include "dispatch/sharding_plan.hpp"

namespace strata::dispatch {

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

  const ExchangeBytes& bytes() const noexcept { return bytes_; }

 private:
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
