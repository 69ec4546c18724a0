#pragma once
// What every communicator does the same way: judging one rank's arguments, judging whether all
// ranks agree on a collective (kind and sizes), naming ranks in messages, and counting the bytes a
// collective moves. Each implementation gathers one CallInfo per rank its own way (shared memory,
// an MPI header exchange, an NCCL or Transport all-gather; the last three in one wire format,
// WireHeader) and then asks check_agreement(), so every rank of a world reaches the same verdict
// with the same message, whichever transport carried it.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "dispatch/communicator.hpp"

namespace strata::dispatch::detail {

/// The collectives of Communicator. The values travel in headers (WireHeader): append, never renumber.
enum class Collective : std::int32_t { kAllToAllV = 1, kAllGather = 2, kAllReduce = 3, kBroadcast = 4, kBarrier = 5 };

/// "all_to_all_v", "all_gather", ... ("unknown collective" for a value off the enum).
const char* collective_name(Collective c) noexcept;
const char* data_type_name(DataType t) noexcept;
const char* reduce_op_name(ReduceOp op) noexcept;

/// One rank's call as its peers need to see it. Only the fields of `kind` are meaningful.
struct CallInfo {
  Collective kind = Collective::kBarrier;
  std::int64_t bytes = 0;  ///< all_gather, broadcast
  std::int64_t count = 0;  ///< all_reduce
  DataType type = DataType::kInt32;
  ReduceOp op = ReduceOp::kSum;
  int root = 0;  ///< broadcast
  /// all_to_all_v: size() entries each, host; borrowed from the caller (or from a received header).
  const std::int64_t* send_counts = nullptr;
  const std::int64_t* recv_counts = nullptr;
  /// Non-empty when this rank's own arguments are invalid (what check_arguments() said).
  std::string arg_error;
  /// With valid arguments: OK, or why this rank cannot take part although the ranks are in step:
  /// its device failed before the collective (ready_space), or staging its device buffers did.
  /// Nothing has moved yet, so the call fails on every rank and the communicator stays usable.
  Status device_error;
};

/// Writes `text` into `dst` (`cap` >= 4 bytes), NUL-terminated: whole when it fits, else cut at a
/// character boundary (UTF-8), without the spaces and opening brackets before the cut, and ended
/// with "…", so that a cut text says so and never ends in a dangling "(".
void copy_text(char* dst, std::size_t cap, const std::string& text) noexcept;

/// The failure of a call as a header carries it between ranks: `has_arg_error` (1 when the
/// arguments are invalid), `device_code` (the device_error's StatusCode, 0 when none) and `text`
/// (`cap` bytes: the arg_error, else the device_error's message, through copy_text()).
void encode_failure(const CallInfo& info, std::int32_t& has_arg_error, std::int32_t& device_code, char* text,
                    std::size_t cap) noexcept;
/// Sets the arg_error or device_error of `info` from fields encode_failure() wrote (`text`: `cap`
/// bytes, read up to its NUL). Every rank judges every call decoded, its own too (from the header
/// it just encoded), so the verdicts' texts are the same on every rank however long the errors.
void decode_failure(std::int32_t has_arg_error, std::int32_t device_code, const char* text, std::size_t cap,
                    CallInfo& info);

/// A rank's CallInfo as the communicators that exchange headers (mpi, nccl, transport) put it on
/// the wire: this header, then send_counts[size] and recv_counts[size] (an all_to_all_v with valid
/// arguments; zeros otherwise), wire_words(size) int64 words in all. Both ends are the same
/// program, so no byte-order conversion.
struct WireHeader {
  char magic[8] = {};     ///< kWireMagic: a header of Strata's, not some other message
  std::uint64_t seq = 0;  ///< the call's number on its communicator (0 where unused)
  std::int64_t bytes = 0;
  std::int64_t count = 0;
  std::int32_t kind = 0;
  std::int32_t type = 0;
  std::int32_t op = 0;
  std::int32_t root = 0;
  std::int32_t has_arg_error = 0;
  std::int32_t device_code = 0;  ///< the StatusCode of CallInfo::device_error, 0 (kOk) when none
  char error[216] = {};          ///< encode_failure()'s text
};
static_assert(sizeof(WireHeader) % sizeof(std::int64_t) == 0, "the counts after the header stay aligned");

inline constexpr char kWireMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'W', '1'};
/// The header's size in int64 words (without the counts).
inline constexpr std::size_t kWireHeaderWords = sizeof(WireHeader) / sizeof(std::int64_t);
/// A header and its counts in a world of `size` ranks, in int64 words.
constexpr std::size_t wire_words(int size) noexcept { return kWireHeaderWords + 2 * static_cast<std::size_t>(size); }

/// Writes `call` (its number `seq`) into `out` (wire_words(size) words, host): the header, then the
/// counts of an all_to_all_v with valid arguments, zeros otherwise. Returns how many words carry
/// something: wire_words(size) with counts, else kWireHeaderWords (what a sender may send alone).
std::size_t encode_call(const CallInfo& call, std::uint64_t seq, int size, std::int64_t* out) noexcept;
/// Whether the words at `in` (kWireHeaderWords at least) start with kWireMagic.
bool is_wire_header(const std::int64_t* in) noexcept;
/// Sets `call` from the header at `in` (as encode_call() wrote it, in a world of `size`); an
/// all_to_all_v's counts point into `in`, which must outlive `call`'s use. Returns the call's seq.
std::uint64_t decode_call(const std::int64_t* in, int size, CallInfo& call);

/// Judges what one rank can judge alone (negative sizes, null buffers with non-zero sizes, a root
/// or an enum value out of range); returns "" when fine, else the reason (without the kind).
/// `send`/`recv`/`data` are the caller's pointers, never dereferenced: null-checked and, for
/// all_to_all_v, compared as addresses. all_to_all_v of rank `me` also refuses a displacement +
/// count of a non-empty range that overflows int64 or ends past the address space, send counts
/// whose total overflows int64, a send range that shares a byte with a receive range
/// (Communicator::all_to_all_v: no in-place exchange), except this rank's own share at the same
/// address in both, and two receive ranges that share a byte; send ranges may overlap each other.
/// Judges the usual call (send and receive ranges apart, the receive ranges in rank order) without
/// allocating.
std::string check_a2a_arguments(int size, int me, const void* send, const std::int64_t* send_counts,
                                const std::int64_t* send_displs, const void* recv, const std::int64_t* recv_counts,
                                const std::int64_t* recv_displs);
/// all_gather of `bytes` per rank over `size` ranks: recv holds size x bytes, which must fit int64.
std::string check_all_gather_arguments(int size, const void* send, std::int64_t bytes, const void* recv);
std::string check_all_reduce_arguments(const void* data, std::int64_t count, DataType type, ReduceOp op);
std::string check_broadcast_arguments(int size, const void* data, std::int64_t bytes, int root);

/// A call of each collective as CallInfo, with this rank's own arguments judged (arg_error: the
/// check_*_arguments() above). The count arrays are borrowed.
CallInfo all_to_all_v_call(int size, int me, const void* send, const std::int64_t* send_counts,
                           const std::int64_t* send_displs, const void* recv, const std::int64_t* recv_counts,
                           const std::int64_t* recv_displs);
CallInfo all_gather_call(int size, const void* send, std::int64_t bytes, const void* recv);
CallInfo all_reduce_call(const void* data, std::int64_t count, DataType type, ReduceOp op);
CallInfo broadcast_call(int size, const void* data, std::int64_t bytes, int root);

/// Judges a BufferSpace: for device buffers, that `stream` is a stream of `device`. "" when fine,
/// else the reason (this rank's argument error).
std::string check_space(const BufferSpace& space);

/// Readies the buffers of a BufferSpace that check_space() accepted: for device buffers, waits
/// (host) for the work queued on `stream` and for a sticky error. OK when the buffers may be
/// used, else the device's failure (its code; the message names the device), which the caller
/// passes on as its CallInfo::device_error.
Status ready_space(const BufferSpace& space);

/// Fills in what `info`, a call on `space` whose own arguments were judged (arg_error), needs of
/// the space: when the arguments are valid, check_space() as the argument error, else when the
/// space is fine ready_space() as the device error.
void judge_space(CallInfo& info, const BufferSpace& space);
/// The same for a call on host buffers that stand in for device ones (detail/device_stage.hpp):
/// when the arguments are valid, `space_error` (what staging found of the space) as the argument
/// error, else when it is "" `device_error` (the device's state, or a staging failure).
void judge_staging(CallInfo& info, const std::string& space_error, const Status& device_error);

/// What every rank concludes from every rank's CallInfo: OK, or the error every rank returns and
/// whether it breaks the communicator.
struct Verdict {
  Status status;
  /// The ranks are out of step or disagree (different collectives, an invalid argument on some
  /// rank, sizes that do not match): every later call fails too. False for a verdict that fails
  /// the call on device errors alone (CallInfo::device_error): nothing moved, and every rank read
  /// the same calls, so the ranks stay in step and the next collective runs as usual.
  bool breaks = false;
};

/// The verdict on one collective from every rank's CallInfo (`calls[r]` is rank r's): OK; or,
/// breaking, FailedPrecondition when ranks called different collectives, InvalidArgument when a
/// rank's arguments were invalid or ranks disagree on a size that must match; or, when the calls
/// agree but some rank's device_error is set, that error (the code of the first such rank; the
/// message names the ranks by message, "ranks 0, 2: <message>; rank 5: <another>", at most 16
/// messages and 16 ranks for each, then how many more), not breaking. Deterministic: every rank computes the same
/// verdict from the same calls.
Verdict check_agreement(const std::vector<const CallInfo*>& calls);

/// "rank 3" or "ranks 2, 3" (at most 16 listed, then "and N more").
std::string rank_list(const std::vector<int>& ranks);

/// kUnavailable: "<what>: timed out after 200 ms; ranks 2, 3 of 4 did not arrive".
Status timeout_status(const char* what, std::chrono::milliseconds timeout, const std::vector<int>& missing, int size);

/// The error every later call of a broken communicator returns: the first error, same code,
/// prefixed with the new call's name.
Status broken_status(const char* what, const Status& first);

/// Bytes a successful collective moved for rank `me` (its own share excluded); the same
/// accounting for every implementation, so the conformance suite can check counters exactly:
/// all_gather and all_reduce count the buffer once per peer in each direction, broadcast counts it
/// once per peer at the root and once at every other rank.
struct MovedBytes {
  std::int64_t sent = 0, received = 0;
};
MovedBytes moved_bytes(const CallInfo& call, int me, int size);

/// A communicator's CommCounters: counted by the thread that makes the calls, read from any thread.
class CallTally {
 public:
  /// A call made, whatever its outcome.
  void count_call() noexcept { calls_.fetch_add(1, std::memory_order_relaxed); }
  /// `call` of rank `me` of `size` succeeded: the bytes it moved (moved_bytes()).
  void count_moved(const CallInfo& call, int me, int size) noexcept;
  CommCounters counters() const noexcept;

 private:
  std::atomic<std::int64_t> sent_{0}, received_{0}, calls_{0};
};

/// Reduces `count` elements of `in` into `acc` (acc = op(acc, in)), element-wise. Every
/// implementation that reduces on the host uses it, in rank order, so results are bit-identical.
void reduce_into(void* acc, const void* in, std::int64_t count, DataType type, ReduceOp op) noexcept;

}  // namespace strata::dispatch::detail
