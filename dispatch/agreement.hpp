#pragma once
// agree(): the small collective every distributed call starts (and, where a local step can fail,
// ends) with. Each rank brings what it is doing (an operation and its arguments) and whether its
// local part succeeded; every rank learns whether all ranks are doing the same thing and whether
// all succeeded. This turns "a rank submitted a different batch" or "rank 2's cache refused the
// batch" into the same clear error on every rank instead of a hang or a mismatched exchange.

#include <cstdint>
#include <string>

#include "core/status.hpp"
#include "dispatch/communicator.hpp"

namespace strata::dispatch {

/// What a rank is doing: `op` ("submit", "forward", ...) with up to three integer arguments
/// (batch id, table, row range...), compared across ranks.
struct Step {
  const char* op = "";
  std::int64_t a = 0, b = 0, c = 0;
};

/// Returns OK when every rank is at the same step and every rank's `local` is OK. Otherwise:
/// `local` itself on a rank that failed; on the others an error with the code of the first rank
/// that failed (Status::from_code), naming the ranks that failed and the start of their messages, or the ranks whose
/// steps differ ("rank 0 is at submit(7), rank 1 at submit(8)"). A communicator error (timeout naming the missing
/// ranks) is returned as is.
Status agree(Communicator& comm, const Step& step, const Status& local);

}  // namespace strata::dispatch
