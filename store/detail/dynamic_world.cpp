// DynamicKeys::admit in a world (dynamic_keys.hpp): each rank's distinct keys go to the ranks whose shards hold them,
// which admit them under the one-rank rules and answer their rows. Collective; host memory only (keys and rows are
// control data beside the rows the sharded engine moves).
#include <algorithm>
#include <string>
#include <utility>

#include "dispatch/agreement.hpp"
#include "store/detail/dynamic_keys.hpp"

namespace strata::detail {
namespace {

std::vector<std::int64_t> displs_of(const std::vector<std::int64_t>& counts) {
  std::vector<std::int64_t> d(counts.size(), 0);
  for (std::size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

// An all-to-all of int64 values: counts[d] values from `send` (grouped by destination) to rank d; `recv` is sized
// from recv_counts. Adds the bytes sent to other ranks to `sent`.
Status exchange(dispatch::Communicator& comm, const std::vector<std::int64_t>& send,
                const std::vector<std::int64_t>& send_counts, std::vector<std::int64_t>& recv,
                const std::vector<std::int64_t>& recv_counts, std::int64_t& sent) {
  std::vector<std::int64_t> sbytes(send_counts.size()), rbytes(recv_counts.size());
  std::int64_t total = 0;
  for (std::size_t r = 0; r < sbytes.size(); ++r) sbytes[r] = send_counts[r] * 8;
  for (std::size_t r = 0; r < rbytes.size(); ++r) {
    rbytes[r] = recv_counts[r] * 8;
    total += recv_counts[r];
  }
  recv.resize(static_cast<std::size_t>(total));
  for (std::size_t r = 0; r < sbytes.size(); ++r)
    if (static_cast<int>(r) != comm.rank()) sent += sbytes[r];
  const auto sd = displs_of(sbytes), rd = displs_of(rbytes);
  return comm.all_to_all_v(send.data(), sbytes.data(), sd.data(), recv.data(), rbytes.data(), rd.data());
}

}  // namespace

Result<Admitted> DynamicKeys::admit_world(TableBatch& tb, bool train, std::int64_t id, const Reset& reset) {
  dispatch::Communicator& comm = *comm_;
  const std::size_t W = static_cast<std::size_t>(comm.size()), T = tables_.size(), n = tb.batch.features.size();
  const int me = comm.rank();
  // Every rank is at this batch's submit (a rank that refused it before admission agrees "submit" with its error).
  STRATA_RETURN_IF_ERROR(dispatch::agree(comm, {"submit", id, 0, 0}, Status::ok()));
  Admitted a;
  a.rows.resize(n);
  a.missing_at.resize(n);
  a.missing_key.resize(n);
  a.held.resize(T);
  std::vector<int> entry(T, -1);  // per table: its entry of tb (a batch has one entry per table), or -1
  for (std::size_t e = 0; e < n; ++e)
    for (std::size_t j = 0; j < T; ++j)
      if (tables_[j].table == tb.tables[e]) entry[j] = static_cast<int>(e);

  // This rank's distinct keys in first-use order, by owner: counts (T per destination), then (key, uses) pairs.
  std::vector<std::int64_t> counts(W * T, 0), got_counts(W * T);
  for (std::size_t j = 0; j < T; ++j) {
    Table& t = tables_[j];
    t.sent.resize(W);  // each destination's list keeps its memory across batches
    for (auto& v : t.sent) v.clear();
    t.unique.keys.clear();
    if (entry[j] < 0) continue;
    const JaggedKeys& f = tb.batch.features[static_cast<std::size_t>(entry[j])];
    dedup_keys(f.keys.data(), static_cast<std::int64_t>(f.keys.size()), t.unique, t.scratch, DedupOrder::kFirstUse);
    for (std::size_t u = 0; u < t.unique.keys.size(); ++u)
      t.sent[static_cast<std::size_t>(t.layout.key_owner(t.unique.keys[u]))].push_back(static_cast<std::int32_t>(u));
    for (std::size_t d = 0; d < W; ++d) counts[d * T + j] = static_cast<std::int64_t>(t.sent[d].size());
  }
  std::vector<std::int64_t>&send = wire_send_, &got = wire_got_;  // kept across batches
  send.clear();
  {
    const std::vector<std::int64_t> per_rank(W, static_cast<std::int64_t>(T));
    STRATA_RETURN_IF_ERROR(exchange(comm, counts, per_rank, got_counts, per_rank, admission_bytes_));
  }
  std::vector<std::int64_t> scounts(W, 0), rcounts(W, 0);
  for (std::size_t d = 0; d < W; ++d)
    for (std::size_t j = 0; j < T; ++j) {
      const Table& t = tables_[j];
      for (const std::int32_t u : t.sent[d]) {
        send.push_back(t.unique.keys[static_cast<std::size_t>(u)]);
        send.push_back(t.unique.offsets[static_cast<std::size_t>(u) + 1] -
                       t.unique.offsets[static_cast<std::size_t>(u)]);
      }
      scounts[d] += 2 * counts[d * T + j];
      rcounts[d] += 2 * got_counts[d * T + j];
    }
  STRATA_RETURN_IF_ERROR(exchange(comm, send, scounts, got, rcounts, admission_bytes_));

  // This rank's shard: the keys it received, sources in rank order, merged into distinct keys in first-use order.
  for (Table& t : tables_) {
    t.got.clear();
    t.got_uses.clear();
  }
  for (std::size_t s = 0, at = 0; s < W; ++s)
    for (std::size_t j = 0; j < T; ++j)
      for (std::int64_t i = 0; i < got_counts[s * T + j]; ++i, at += 2) {
        tables_[j].got.push_back(got[at]);
        tables_[j].got_uses.push_back(got[at + 1]);
      }
  std::vector<Status> status(T);
  for (std::size_t j = 0; j < T; ++j) {
    Table& t = tables_[j];
    dedup_keys(t.got.data(), static_cast<std::int64_t>(t.got.size()), t.merged, t.merged_scratch,
               DedupOrder::kFirstUse);
    t.merged_uses.assign(t.merged.keys.size(), 0);
    for (std::size_t p = 0; p < t.got.size(); ++p)
      t.merged_uses[static_cast<std::size_t>(t.merged_scratch.uid[p])] += t.got_uses[p];
    const bool fits = t.index->capacity() - t.index->pinned() >= static_cast<std::int64_t>(t.merged.keys.size());
    if (train && !fits)
      status[j] = t.index->check(t.merged.keys, t.merged_uses)
                      .with_context("table '" + t.spec.name + "', rank " + std::to_string(me) + "'s shard of " +
                                    std::to_string(t.capacity) + " rows");
  }
  // Every rank's shards fit the batch, or it is refused on every rank and nothing changed.
  Status checked;
  for (const Status& st : status)
    if (checked.is_ok()) checked = st;
  STRATA_RETURN_IF_ERROR(dispatch::agree(comm, {"admit", id, train ? 1 : 0, 0}, checked));

  // Train (or look up) every shard and write the new rows.
  for (std::size_t j = 0; j < T; ++j) {
    Table& t = tables_[j];
    t.made.clear();
    if (train) {
      STRATA_CHECK(t.index->train(t.merged.keys, t.merged_uses, a.held[j], t.made).is_ok());
      for (auto& made : t.made) made.first = t.layout.global_row(me, made.first);
    } else {
      t.index->find(t.merged.keys, t.merged_uses, a.held[j]);
    }
    new_rows(t);
  }
  Status written;
  std::size_t failed_at = T;
  for (std::size_t j = 0; j < T && written.is_ok(); ++j) {
    const Table& t = tables_[j];
    if (!t.fresh.rows.empty()) written = reset(t.table, t.fresh.rows, t.fresh.w.data(), t.fresh.s.data());
    if (!written.is_ok()) failed_at = j;
  }
  // Rows a rank could not write fail the submit on every rank: the batch's pins are released, and on that rank the
  // keys given rows whose writes failed or were not made (this table and the ones after it) take none
  // (KeyIndex::forget); the rows every other shard wrote stand, as on one rank (dynamic_keys.hpp).
  if (Status all = dispatch::agree(comm, {"admit rows", id, 0, 0}, written); !all.is_ok()) {
    release(tb, a);
    for (std::size_t j = failed_at; j < T; ++j) {
      Table& t = tables_[j];
      std::vector<std::int64_t> local(t.made.size());
      for (std::size_t i = 0; i < local.size(); ++i) local[i] = t.layout.local_row(t.made[i].first);
      t.index->forget(local);
    }
    return all;
  }

  // Each source learns its keys' global rows (KeyIndex::kNone: no row), in the order it sent them.
  std::vector<std::int64_t>& answer = send;
  answer.clear();
  std::vector<std::size_t> cursor(T, 0);  // per table: its next received key
  for (std::size_t s = 0; s < W; ++s)
    for (std::size_t j = 0; j < T; ++j) {
      const Table& t = tables_[j];
      for (std::int64_t i = 0; i < got_counts[s * T + j]; ++i) {
        const std::int64_t local = a.held[j][static_cast<std::size_t>(t.merged_scratch.uid[cursor[j]++])];
        answer.push_back(local == KeyIndex::kNone ? KeyIndex::kNone : t.layout.global_row(me, local));
      }
    }
  for (std::size_t r = 0; r < W; ++r) std::swap(scounts[r], rcounts[r]);
  for (std::size_t r = 0; r < W; ++r) {
    scounts[r] /= 2;
    rcounts[r] /= 2;
  }
  // A failed exchange broke the communicator; the batch's pins go with it (no retire will release them).
  if (Status sent = exchange(comm, answer, scounts, got, rcounts, admission_bytes_); !sent.is_ok()) {
    release(tb, a);
    return sent;
  }
  std::size_t at = 0;
  for (std::size_t d = 0; d < W; ++d)
    for (std::size_t j = 0; j < T; ++j) {
      Table& t = tables_[j];
      t.answered.resize(t.unique.keys.size());
      for (const std::int32_t u : t.sent[d]) t.answered[static_cast<std::size_t>(u)] = got[at++];
    }
  for (std::size_t j = 0; j < T; ++j) {
    if (entry[j] < 0) continue;
    const auto e = static_cast<std::size_t>(entry[j]);
    translate(tables_[j], tables_[j].scratch.uid, tables_[j].answered, tb.batch.features[e], a.missing_at[e],
              a.missing_key[e]);
  }
  return a;
}

}  // namespace strata::detail
