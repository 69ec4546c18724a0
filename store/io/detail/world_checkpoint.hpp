#pragma once
// The checkpoint protocol of a world (formats 2, 3 and 5, checkpoint_format.hpp), the piece writer of every save and
// the one loader of every checkpoint.
//
// save_world: a collective into one directory all ranks share. Each rank writes the pieces it holds (its row,
// column or table shard; a replicated table once, by replicas[t % replicas.size()]; a dynamic table: every rank its
// shard, DynamicAccess::read_dynamic, as a file of dynamic_piece.hpp); rank 0 alone takes the
// directory's lock (polled, so that its peers' collectives never time out while it waits), and commits the
// manifest only once every rank's pieces are durable. Every round ends in one all_gather of each rank's outcome,
// so every rank returns the same Status, except when a collective itself fails (a rank that never came: the
// communicator is broken): then each rank returns that error with what it knows of the directory (nothing
// committed; rank 0 once it renamed the manifest: committed; the others after the pieces were durable: maybe).
//
// load_pieces: one manifest (rank 0's) for every rank, a plan per table (reshard.hpp: which rank reads which piece,
// spans of rows), every piece verified (size, header, checksum) by its reader before any row changes, then the rows
// copied span by span through one all_to_all_v per span and table, each rank writing its own shard (write_shard).
// A failure on any rank during the copy stops every rank's copy at that span, each keeping what it wrote before.
// A store without a world (comm null) loads every format through the same code, as a world of one.
//
// A dynamic table's N files (a world's shards; a store's format 4 file: N = 1) load into M ranks (a store without a
// world: M = 1). When they are the store's layout (N == M, the same sharding and owner, so the same capacities), each
// rank reads its own file and restores it exactly: rows, order, clock, sketch (the store continues bit for bit). Else
// (a reshard) each rank reads and checks every file and keeps the keys ShardLayout::key_owner gives it now, ordered by
// last use, then the saving rank, then position in its file, on its rows 0 to n - 1, at the files' clock (the
// manifest's, checked in each header); its sketch starts empty (keys seen but not admitted count afresh). A shard that
// cannot hold its keys refuses the load on every rank (naming the table, the rank, the keys and the capacity). Every
// rank's shard is read and checked, and agreed, before any row changes; written after the dense tables.
//
// Long local work (writing, verifying or copying whole pieces, rank 0's removal of stale files) runs on a thread of its
// own while the rank's thread meets its peers every 20 ms in a short all_gather, so that no rank waits in one
// collective for another rank's I/O past the communicator's timeout. Each call spawns and joins such threads; the store
// is used by one of them at a time. The work counts its progress (each chunk of rows written, verified, read or
// copied, each file removed): when no rank still working made any for one communicator timeout
// (Communicator::timeout()), every rank fails in step with kUnavailable naming them ("rank 1's local I/O made no
// progress for 3000 ms"). A rank joins its own work before it returns (the work reads the caller's memory; it stops at
// its next chunk), so a rank stuck in a system call returns only when that call does; its peers return at once.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "store/detail/dynamic_state.hpp"
#include "store/io/detail/checkpoint_format.hpp"

namespace strata {
class Store;
}  // namespace strata
namespace strata::dispatch {
class Communicator;
}  // namespace strata::dispatch

namespace strata::detail {

/// Store::save on a world: see the top of this file. Errors name the rank and the piece, the same text on every rank.
Status save_world(Store& store, dispatch::Communicator& comm, const std::string& dir);

/// The manifest entry of config table `t`: manifest_entry and the table's sharding type (its pieces not yet listed).
ManifestTable table_entry(const StoreConfig& config, int t);
/// A random save id (format 2 and 3: in every piece's name and header).
std::uint64_t new_save_id();

/// Reads local rows [row0, row0 + n) of what a piece holds as fp32: n x cols weights, n x state cols state (null when
/// the table keeps none). Store::read_shard on a world, Store::read_rows on a store without one.
using ReadRecords = std::function<Status(std::int64_t row0, std::int64_t n, float* weights, float* state)>;
/// Writes piece `piece.file` of table `mt` holding `piece.box` in format `version` into `dir` (PieceWriter: durable
/// under its name once this returns OK), its rows read by `read` in chunks, and sets piece.bytes and piece.crc.
/// Counts progress per chunk (run_polled) and calls the save hook at kPieceHalfWritten as rank `rank`. PieceWriter's
/// and `read`'s errors.
Status write_piece(const ReadRecords& read, const ManifestTable& mt, const std::string& dir, std::uint64_t save_id,
                   std::uint32_t version, int rank, PieceEntry& piece);

/// Counts progress of the local work running on this thread (run_polled's stall check: a rank's work calls it at least
/// once per chunk of rows). An error once its ranks gave up waiting for the work (it then stops); OK off such work.
Status progressed();
/// Runs `call`, one call into the store or an index whose time grows with a shard and that cannot be split (a dynamic
/// table's read_dynamic, write_dynamic, KeyIndex::restore), counting as progress while it runs for at most
/// kLongCallTimeouts communicator timeouts (a call stuck longer, say on a device that never answers, is a stall), then
/// progressed(). `call`'s error, else progressed()'s.
Status long_call(const std::function<Status()>& call);
inline constexpr int kLongCallTimeouts = 10;

/// The generation a save into `dir` writes: the manifest's + 1, or 1 when there is none. A manifest that cannot be
/// read or parsed refuses the save (it names files the save must not remove as stale). Called with the lock held.
Result<std::uint64_t> next_generation(const std::string& dir);

/// What load_pieces read besides the rows: the caller (Store::load_checkpoint) applies them.
struct Loaded {
  std::int64_t step = 0;
  std::vector<float> rate;     ///< per config table: the checkpoint's learning rate ...
  std::vector<bool> has_rate;  ///< ... when it recorded one
};

/// Loads the checkpoint of `dir` into `store` (collective over `comm`; null: a store without a world).
/// `pinned_manifest`: that manifest text only, no retry with a newer one (open_checkpoint's). `convert_dtypes`: a
/// table saved at another dtype or state_dtype loads (its fp32 records written through the store, which rounds them
/// to nearest into a half-size table) instead of being refused (check_entry). Dynamic tables: each rank's shard read
/// from the files and checked with the rest before any row changes (the same layout: its own file exactly; else every
/// file, resharded: see the top of this file), then written after the dense tables (DynamicAccess::write_dynamic).
Result<Loaded> load_pieces(Store& store, dispatch::Communicator* comm, const std::string& dir,
                           const std::string* pinned_manifest, bool convert_dtypes);

/// Where a rank of save_world calls the test hook.
enum class SavePoint {
  kStart,             ///< before anything (a non-OK status fails the save there, nothing written)
  kLocked,            ///< rank 0, the directory's lock held
  kPieceHalfWritten,  ///< each piece, after its first half of the rows
  kPiecesCommitted,   ///< every piece of this rank renamed into place, before the gather (on the rank's own thread:
                      ///< a stall there stalls the rank, unlike one while its pieces are written)
  kManifestWritten,   ///< rank 0, the manifest's temp file written, before its rename
  kManifestRenamed,   ///< rank 0, the manifest committed
  kCommitted,  ///< each rank, rank 0's commit done, before its outcome is gathered (on the rank's own thread; the
               ///< hook's status is ignored: the manifest is in place or not by then)
};

/// The save hook's call at `point` as rank `rank` (OK without a hook): write_piece's and write_dynamic_piece's.
Status at_save_point(int rank, SavePoint point);

/// Test-only: called by each rank at each point; a non-OK Status fails that rank there (a hook may also sleep or
/// raise SIGKILL). Set it before the ranks start and clear it after they stopped; the calls are concurrent (thread
/// ranks), their safety is the hook's business. Empty (the default): none.
void set_world_save_hook(std::function<Status(int rank, SavePoint point)> hook);

/// Where a rank of load_pieces calls the test hook (a non-OK status fails that rank there, as an I/O error would).
enum class LoadPoint {
  kPieceVerified,  ///< each piece this rank reads, once verified
  kSpanRead,       ///< each span of a table of which this rank reads pieces, before it reads their runs
  kSpanWritten,    ///< each span in which this rank holds rows, once it wrote them
};

/// Test-only: as set_world_save_hook, for load_pieces.
void set_world_load_hook(std::function<Status(int rank, LoadPoint point)> hook);

}  // namespace strata::detail
