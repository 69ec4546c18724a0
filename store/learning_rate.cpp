// Store::set_learning_rate / learning_rate: the learning rate in force lives in config_ (every
// engine reads its table's optimizer spec from there at backward); implementations that copy the
// spec are told through learning_rate_changed.

#include <cmath>
#include <cstdio>

#include "store/store.hpp"

namespace strata {
namespace {

Status check_rate(const std::string& table, float lr) {
  if (lr > 0.0f && std::isfinite(lr)) return Status::ok();
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(lr));
  return Status::invalid_argument("set_learning_rate: table '" + table + "': learning_rate " + buf +
                                  " (expected a finite number > 0)");
}

}  // namespace

Status Store::set_learning_rate(const std::string& table, float learning_rate) {
  auto t = table_index(table);
  if (!t) return t.status().with_context("set_learning_rate");
  STRATA_RETURN_IF_ERROR(check_rate(table, learning_rate));
  config_.tables[static_cast<std::size_t>(t.value())].spec.optimizer.learning_rate = learning_rate;
  learning_rate_changed(t.value(), learning_rate);
  return Status::ok();
}

Status Store::set_learning_rate(float learning_rate) {
  for (const auto& t : config_.tables) STRATA_RETURN_IF_ERROR(check_rate(t.spec.name, learning_rate));
  for (std::size_t t = 0; t < config_.tables.size(); ++t) {
    config_.tables[t].spec.optimizer.learning_rate = learning_rate;
    learning_rate_changed(static_cast<int>(t), learning_rate);
  }
  return Status::ok();
}

Result<float> Store::learning_rate(const std::string& table) const {
  STRATA_ASSIGN_OR_RETURN(int t, table_index(table));
  return config_.tables[static_cast<std::size_t>(t)].spec.optimizer.learning_rate;
}

}  // namespace strata
