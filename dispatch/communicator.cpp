#include "dispatch/communicator.hpp"

#include <string>

namespace strata::dispatch {

std::size_t size_of(DataType t) noexcept {
  switch (t) {
    case DataType::kInt32:
      return 4;
    case DataType::kInt64:
      return 8;
    case DataType::kFloat32:
      return 4;
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

Status all_to_all_counts(Communicator& comm, const std::vector<std::int64_t>& send, std::vector<std::int64_t>& recv) {
  const int n = comm.size();
  // A wrong length is this rank's bug, but returning before the collective would leave the peers
  // waiting for the timeout; pass it on as invalid arguments (null arrays) so every rank fails now.
  const bool bad = static_cast<int>(send.size()) != n;
  recv.assign(n, 0);
  std::vector<std::int64_t> counts(n, static_cast<std::int64_t>(sizeof(std::int64_t)));
  std::vector<std::int64_t> displs(n);
  for (int r = 0; r < n; ++r) displs[r] = r * static_cast<std::int64_t>(sizeof(std::int64_t));
  Status s = comm.all_to_all_v(bad ? nullptr : send.data(), bad ? nullptr : counts.data(), displs.data(), recv.data(),
                               counts.data(), displs.data());
  if (bad) {
    return Status::invalid_argument("all_to_all_counts: send has " + std::to_string(send.size()) +
                                    " entries, expected one per rank (" + std::to_string(n) + ")");
  }
  return s;
}

}  // namespace strata::dispatch
