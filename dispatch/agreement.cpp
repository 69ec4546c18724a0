#include "dispatch/agreement.hpp"

#include <cstring>
#include <vector>

namespace strata::dispatch {
namespace {

// Fixed-size record every rank contributes (all_gather needs equal sizes).
struct Record {
  char op[24];
  std::int64_t a, b, c;
  std::int32_t code;  // StatusCode of the local result
  char message[180];  // its first characters
};

std::string describe(const Record& r) {
  return std::string(r.op) + "(" + std::to_string(r.a) +
         (r.b || r.c ? ", " + std::to_string(r.b) + ", " + std::to_string(r.c) : "") + ")";
}

}  // namespace

Status agree(Communicator& comm, const Step& step, const Status& local) {
  if (comm.size() == 1) return local;
  Record mine{};
  std::strncpy(mine.op, step.op, sizeof(mine.op) - 1);
  mine.a = step.a;
  mine.b = step.b;
  mine.c = step.c;
  mine.code = static_cast<std::int32_t>(local.code());
  std::strncpy(mine.message, local.message().c_str(), sizeof(mine.message) - 1);
  std::vector<Record> all(static_cast<std::size_t>(comm.size()));
  STRATA_RETURN_IF_ERROR(comm.all_gather(&mine, sizeof(Record), all.data()));
  // Disagreement on the step first: the results of different steps mean nothing together.
  std::string differ;
  for (int r = 1; r < comm.size(); ++r) {
    const Record& x = all[static_cast<std::size_t>(r)];
    if (std::strcmp(x.op, all[0].op) != 0 || x.a != all[0].a || x.b != all[0].b || x.c != all[0].c)
      differ += (differ.empty() ? "" : ", ") + ("rank " + std::to_string(r) + " at " + describe(x));
  }
  if (!differ.empty())
    return Status::failed_precondition("ranks disagree on the step: rank 0 at " + describe(all[0]) + ", " + differ +
                                       " (every rank must make the same calls in the same order)");
  if (!local.is_ok()) return local;
  std::string failed;
  StatusCode code = StatusCode::kOk;
  for (int r = 0; r < comm.size(); ++r) {
    const Record& x = all[static_cast<std::size_t>(r)];
    if (x.code == 0) continue;
    if (code == StatusCode::kOk) code = static_cast<StatusCode>(x.code);
    failed += (failed.empty() ? "" : "; ") + ("rank " + std::to_string(r) + ": " + x.message);
  }
  if (failed.empty()) return Status::ok();
  return Status::from_code(code, describe(mine) + " failed on another rank (" + failed + ")");
}

}  // namespace strata::dispatch
