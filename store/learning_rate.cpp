// Store::set_learning_rate / learning_rate / set_step: what a backward reads besides the rows.
// The learning rate in force lives in config_ (every engine reads its table's optimizer spec from
// there at backward); implementations that copy the spec are told through learning_rate_changed.
// The step counter is step_ (backward passes step_ + 1 to the engines). On a world of several
// ranks each rank updates its own shards, so a change of either is a collective: every rank checks
// its own call, then the ranks compare what they are setting, and all apply it or none does.

#include <cmath>
#include <vector>

#include "core/text.hpp"
#include "dispatch/agreement.hpp"
#include "store/detail/batch_checks.hpp"
#include "store/detail/config_agreement.hpp"
#include "store/store.hpp"

namespace strata {
namespace {

constexpr std::int32_t kEveryTable = -1;

Status check_rate(const std::string& table, float lr) {
  if (lr >= 0.0f && std::isfinite(lr)) return Status::ok();
  return Status::invalid_argument("set_learning_rate: table '" + table + "': learning_rate " + number_text(lr) +
                                  " (expected a finite number >= 0)");
}

// What one rank sets (fixed size: all_gather needs equal sizes).
struct RateCall {
  std::int64_t step;
  std::int32_t table;  // or kEveryTable
  float rate;
};

std::string describe(const StoreConfig& c, const RateCall& x) {
  const std::string what =
      x.table == kEveryTable ? "every table" : "table '" + c.tables[static_cast<std::size_t>(x.table)].spec.name + "'";
  return what + " to " + number_text(x.rate) + " at step " + std::to_string(x.step);
}

// OK when this is one store, or when every rank of its world checked its call (`local`) and sets
// the same rate of the same table at the same step. Otherwise the same error on every rank (a
// rank's own check failing: its own error there, naming it elsewhere).
Status agree_on_rate(dispatch::Communicator* comm, const StoreConfig& c, const RateCall& mine, const Status& local) {
  if (!comm || comm->size() == 1) return local;
  // Every rank is in set_learning_rate and its call passed its own checks (dispatch's words for
  // a rank in another call or a failed check)...
  STRATA_RETURN_IF_ERROR(dispatch::agree(*comm, {"set_learning_rate", 0, 0, 0}, local));
  // ...and all set the same thing.
  std::vector<RateCall> all(static_cast<std::size_t>(comm->size()));
  STRATA_RETURN_IF_ERROR(comm->all_gather(&mine, sizeof(RateCall), all.data()));
  bool same = true;
  std::string calls;
  for (std::size_t r = 0; r < all.size(); ++r) {
    same = same && all[r].step == all[0].step && all[r].table == all[0].table && all[r].rate == all[0].rate;
    calls += (r ? ", rank " : "rank ") + std::to_string(r) + " sets " + describe(c, all[r]);
  }
  if (same) return Status::ok();
  return Status::failed_precondition("set_learning_rate: ranks disagree: " + calls +
                                     " (every rank must set the same rate of the same table at the same step; no "
                                     "rate changed)");
}

// -0.0 is held as 0: no rate in force is negative (the config's at open, and every rate set).
float held_rate(float learning_rate) { return learning_rate == 0.0f ? 0.0f : learning_rate; }

}  // namespace

StoreConfig Store::rates_held(StoreConfig config) {
  for (auto& t : config.tables) t.spec.optimizer.learning_rate = held_rate(t.spec.optimizer.learning_rate);
  return config;
}

void Store::apply_learning_rate(int table, float learning_rate) {
  learning_rate = held_rate(learning_rate);
  config_.tables[static_cast<std::size_t>(table)].spec.optimizer.learning_rate = learning_rate;
  learning_rate_changed(table, learning_rate);
}

Status Store::set_learning_rate(const std::string& table, float learning_rate) {
  auto t = table_index(table);
  const Status local = t ? check_rate(table, learning_rate) : t.status().with_context("set_learning_rate");
  STRATA_RETURN_IF_ERROR(agree_on_rate(world(), config_, {step_, t ? t.value() : kEveryTable, learning_rate}, local));
  apply_learning_rate(t.value(), learning_rate);
  return Status::ok();
}

Status Store::set_learning_rate(float learning_rate) {
  Status local;
  for (const auto& t : config_.tables)
    if (local.is_ok()) local = check_rate(t.spec.name, learning_rate);
  STRATA_RETURN_IF_ERROR(agree_on_rate(world(), config_, {step_, kEveryTable, learning_rate}, local));
  for (std::size_t t = 0; t < config_.tables.size(); ++t) apply_learning_rate(static_cast<int>(t), learning_rate);
  return Status::ok();
}

Status Store::set_step(std::int64_t step) {
  Status local;
  if (step < 0)
    local = Status::invalid_argument("set_step: step " + std::to_string(step) + " (expected a step count >= 0)");
  else if (step > kMaxStep)
    local = Status::invalid_argument("set_step: step " + std::to_string(step) + " (expected at most " +
                                     std::to_string(kMaxStep) + " = 2^63 - 2: the next backward takes step + 1)");
  else if (in_flight() > 0)
    local = detail::busy("set_step", in_flight());
  // The step is an argument of the agreement: ranks that set different steps are refused by it.
  dispatch::Communicator* comm = world();
  STRATA_RETURN_IF_ERROR(comm ? dispatch::agree(*comm, {"set_step", step, 0, 0}, local) : local);
  step_ = step;
  return Status::ok();
}

Result<float> Store::learning_rate(const std::string& table) const {
  STRATA_ASSIGN_OR_RETURN(int t, table_index(table));
  return config_.tables[static_cast<std::size_t>(t)].spec.optimizer.learning_rate;
}

}  // namespace strata
