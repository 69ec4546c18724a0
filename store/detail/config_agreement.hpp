#pragma once
// Agreement on the config at Store::open(config, comm): every rank of a world must open the store
// with the same tables and the same settings that change results or the calls a store accepts.
// Each rank serializes that part of its config canonically, all ranks exchange it, and every rank
// compares each rank's with rank 0's, so a mismatch gives every rank the same error naming the
// rank and the field instead of a crash, an abort, or ranks that silently train apart.

#include <string>

#include "core/status.hpp"
#include "dispatch/communicator.hpp"
#include "store/store_config.hpp"

namespace strata::detail {

/// The part of `config` that every rank must share, as canonical JSON text (keys sorted, no
/// spaces): to_json(config) without the per-rank fields listed in Store::open's comment (threads,
/// NUMA, huge pages, fake NUMA nodes, the device, offload_gather, the cache policy, lookahead and
/// planner partitions, each table's cache size), plus the initializer origin of each table. A field
/// added to to_json later is shared unless it is added to that list.
std::string shared_config(const StoreConfig& config);

/// The fields that shared_config leaves out (may differ per rank), for messages: "threads, numa,
/// ..., cache.policy, ..., each table's cache".
std::string per_rank_fields();

/// The first field in which shared config `mine` differs from `rank0`'s, as "table 'user' rows
/// 1000 differs from rank 0's 2000", or "" when they are the same. Both are shared_config texts.
/// `whose` names the other config in the text (Store::open_checkpoint: "the checkpoint's"). The
/// same fields that may differ per rank may differ from a checkpoint's recorded config on reopen.
std::string config_difference(const std::string& mine, const std::string& rank0, const std::string& whose = "rank 0's");

/// Collective: exchanges every rank's shared_config (of any size) and returns OK when all equal
/// rank 0's; otherwise InvalidArgument, the same on every rank, naming each rank that differs and
/// its first differing field. A communicator error is returned as is.
Status agree_on_config(dispatch::Communicator& comm, const StoreConfig& config);

}  // namespace strata::detail
