#pragma once
// The `local` communicator: the N ranks of a world are threads of one process (N emulated
// devices, or N ranks sharing one GPU). Collectives meet in shared memory: each rank posts its
// buffers, and once all have arrived every rank copies what it needs straight out of its peers'
// buffers (one memcpy per peer, no intermediate copy), then waits until no peer still reads its
// own buffers before returning. So an all-to-all moves each byte once, in parallel on all ranks.

#include <memory>
#include <vector>

#include "core/status.hpp"
#include "dispatch/communicator.hpp"

namespace strata::dispatch {

/// Creates a world of `size` ranks in this process; element r of the result is rank r's
/// communicator. Each communicator is used by one thread at a time (typically thread r runs rank
/// r), and the ranks' calls must be collective as for any Communicator; different ranks may and
/// should call from different threads at once. The communicators may be destroyed in any order,
/// from any thread; destroying one breaks the group for the others (their next call, or the one
/// they are waiting in, fails with kUnavailable naming the rank that left) rather than letting
/// them wait for the timeout. InvalidArgument when size < 1 or the timeout is not positive.
Result<std::vector<std::unique_ptr<Communicator>>> make_local_group(int size, const CommOptions& options = {});

}  // namespace strata::dispatch
