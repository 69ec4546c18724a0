#include "bench/bench_verdict.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <vector>

#include "bench/bench_results.hpp"
#include "toolkit/cli_flags.hpp"

namespace strata::bench {

Result<MemoryBudgets> memory_budgets(const Options& o, const HardwareProfile& profile) {
  MemoryBudgets b;
  // Per rank, as strata-tune plan budgets: one GPU's HBM, and the host memory of the ranks sharing a host.
  const int world = o.mpi ? o.mpi->size() : o.ranks;
  const double ranks_per_host = std::max(1.0, std::min<double>(world, profile.gpus.value));
  b.hbm = profile.hbm_capacity_gb.value * 1e9;
  b.host = profile.host_memory_gb.value * 1e9 / ranks_per_host;
  if (!o.hbm_budget.empty()) {
    STRATA_ASSIGN_OR_RETURN(b.hbm, parse_byte_size(o.hbm_budget, "--hbm-budget"));
    b.hbm_given = true;
  }
  if (!o.host_budget.empty()) {
    STRATA_ASSIGN_OR_RETURN(b.host, parse_byte_size(o.host_budget, "--host-budget"));
    b.host_given = true;
  }
  return b;
}

json memory_fit_json(const ModeMemory& memory, const MemoryBudgets& budgets) {
  const bool fits_hbm = memory.hbm <= budgets.hbm, fits_host = memory.host() <= budgets.host;
  std::string why;
  if (!fits_hbm) why = "HBM " + human_bytes(memory.hbm) + " > " + human_bytes(budgets.hbm);
  if (!fits_host)
    why += (why.empty() ? "" : ", ") + std::string("host ") + human_bytes(memory.host()) + " > " +
           human_bytes(budgets.host);
  return {{"hbm_bytes", memory.hbm}, {"host_bytes", memory.host()},   {"fits_hbm", fits_hbm},
          {"fits_host", fits_host},  {"fits", fits_hbm && fits_host}, {"why", why}};
}

namespace {

// One placement the verdict can choose: a mode that ran, or a point of the cache sweep.
struct Candidate {
  std::string label;  // "gpu", "cached (cache fraction 0.1)"
  const json* doc = nullptr;
  bool fits = false;
  double step_ms = 0;  // what decides: measured p50 or modelled
};

std::string ms_text(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, ms >= 100 ? "%.0f ms" : "%.3g ms", ms);
  return buf;
}

std::string percent_text(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", f * 100);
  return buf;
}

// A caching mode's label names its cache size (the --cache-fraction to give); a config's is its own.
std::string label_of(const json& m) {
  std::string label = m["mode"].get<std::string>();
  if (m.contains("cache") && m["cache"]["cache_fraction"].is_number()) {
    char buf[64];
    std::snprintf(buf, sizeof buf, " (cache fraction %g)", m["cache"]["cache_fraction"].get<double>());
    label += buf;
  }
  return label;
}

// "emu" when a mode ran on the emulated device, "cuda" when one ran on a GPU, else "none" (every
// mode on the CPU).
std::string device_kind(const json& doc) {
  std::string kind = "none";
  for (const json& m : doc["results"]) {
    const std::string d = m["device"].get<std::string>();
    if (d == "emu") return "emu";
    if (d.rfind("cuda", 0) == 0) kind = "cuda";
  }
  return kind;
}

std::vector<Candidate> candidates(const json& doc, bool measured) {
  std::vector<Candidate> c;
  const auto add = [&](const json& m) {
    if (!m.contains("memory_fit")) return;
    Candidate x;
    x.label = label_of(m);
    x.doc = &m;
    x.fits = m["memory_fit"]["fits"].get<bool>();
    x.step_ms = measured ? m["train_step_ms_p50"].get<double>() : m["modelled"]["step_ms"].get<double>();
    c.push_back(x);
  };
  for (const json& m : doc["results"]) add(m);
  // A sweep point the cached mode already ran is that run.
  for (const json& p : doc["sweep"]) {
    if (!p["skipped"].is_null()) continue;
    const bool same = std::any_of(doc["results"].begin(), doc["results"].end(), [&](const json& m) {
      return m["mode"] == "cached" && m.contains("cache") && m["cache"]["cache_fraction"] == p["cache_fraction"];
    });
    if (!same) add(p);
  }
  return c;
}

// "HBM 1.02 GB of 141 GB, host 1.50 GB of 137 GB": a mode's memory against the budgets.
std::string memory_text(const json& fit, const MemoryBudgets& b) {
  return "HBM " + human_bytes(fit["hbm_bytes"].get<double>()) + " of " + human_bytes(b.hbm) + ", host " +
         human_bytes(fit["host_bytes"].get<double>()) + " of " + human_bytes(b.host);
}

}  // namespace

json verdict_json(const json& doc, const MemoryBudgets& budgets, const std::string& profile_name) {
  const std::string kind = device_kind(doc);
  const bool measured = kind != "emu";
  std::vector<Candidate> all = candidates(doc, measured);
  std::vector<const Candidate*> fit, misfit;
  for (const Candidate& c : all) (c.fits ? fit : misfit).push_back(&c);
  std::stable_sort(fit.begin(), fit.end(),
                   [](const Candidate* a, const Candidate* b) { return a->step_ms < b->step_ms; });
  const char* decider = measured ? "measured" : "modelled";
  const std::string budget_source = std::string("budgets per rank: ") +
                                    (budgets.hbm_given ? "--hbm-budget" : "the profile's HBM") + " and " +
                                    (budgets.host_given ? "--host-budget" : "the profile's host memory");

  json v;
  v["profile"] = profile_name;
  v["decided_by"] = decider;
  v["device_kind"] = kind;
  v["hbm_budget_bytes"] = budgets.hbm;
  v["host_budget_bytes"] = budgets.host;
  v["hbm_budget_from"] = budgets.hbm_given ? "--hbm-budget" : "profile";
  v["host_budget_from"] = budgets.host_given ? "--host-budget" : "profile";
  json not_fitting = json::array();
  for (const Candidate* c : misfit)
    not_fitting.push_back({{"mode", c->label}, {"why", (*c->doc)["memory_fit"]["why"]}});
  v["not_fitting"] = not_fitting;
  json lines = json::array();
  if (fit.empty()) {
    v["mode"] = nullptr;
    v["cache_fraction"] = nullptr;
    std::string headline = "no placement that ran fits the memory on " + profile_name + " (HBM " +
                           human_bytes(budgets.hbm) + ", host " + human_bytes(budgets.host) + " per rank)";
    v["headline"] = headline;
    lines.push_back(
        "raise --hbm-budget or --host-budget, choose a --profile with more memory, or use smaller "
        "tables or caches (" +
        budget_source + ")");
  } else {
    const Candidate& best = *fit.front();
    const json& m = *best.doc;
    v["mode"] = m["mode"];
    v["cache_fraction"] = m.contains("cache") ? m["cache"]["cache_fraction"] : json(nullptr);
    v["step_ms"] = best.step_ms;
    v["modelled_step_ms"] = m["modelled"]["step_ms"];
    v["measured_step_ms_p50"] = m["train_step_ms_p50"];
    v["hit_rate"] = m["hit_rate"];
    v["hbm_bytes"] = m["memory_fit"]["hbm_bytes"];
    v["host_bytes"] = m["memory_fit"]["host_bytes"];
    const std::string n = std::to_string(fit.size());
    v["headline"] = "use " + best.label + " on " + profile_name + ": the fastest " + decider + " step (" +
                    ms_text(best.step_ms) + ") of the " + n + " placement" + (fit.size() == 1 ? "" : "s") +
                    " that fit its memory";
    std::string step = std::string("step: ") + decider + " " + ms_text(best.step_ms);
    if (measured)
      step += " on this machine (modelled on " + profile_name + ": " + ms_text(m["modelled"]["step_ms"].get<double>()) +
              ")";
    else
      step += " on " + profile_name + ", " + m["modelled"]["explanation"].get<std::string>();
    lines.push_back(step);
    if (fit.size() > 1) {
      std::string next = "next: ";
      for (std::size_t i = 1; i < fit.size(); ++i) {
        const double more = fit[i]->step_ms / std::max(best.step_ms, 1e-12) - 1;
        char pct[32];
        std::snprintf(pct, sizeof pct, " (+%.0f%%)", more * 100);
        next += (i > 1 ? ", " : "") + fit[i]->label + " " + ms_text(fit[i]->step_ms) + pct;
      }
      if (fit[1]->step_ms <= best.step_ms * 1.05)
        next += "; " + fit[1]->label + " is within 5%: a tie by this measure, either will do";
      lines.push_back(next);
    }
    lines.push_back("memory (engine model, per rank, every table's largest step): " +
                    memory_text(m["memory_fit"], budgets) + " (" + budget_source + ")");
    std::string hits;
    for (const Candidate* c : fit)
      if ((*c->doc)["hit_rate"].is_number())
        hits += (hits.empty() ? "" : ", ") + c->label + " " + percent_text((*c->doc)["hit_rate"].get<double>());
    if (!hits.empty()) lines.push_back("hit rate, measured on this run's batches: " + hits);
  }
  if (!misfit.empty()) {
    std::string no = "does not fit (never chosen): ";
    for (std::size_t i = 0; i < misfit.size(); ++i)
      no += (i ? "; " : "") + misfit[i]->label + ": " + (*misfit[i]->doc)["memory_fit"]["why"].get<std::string>();
    lines.push_back(no);
  }
  // Which figures are this machine's and which the profile's.
  std::string here;
  if (kind == "emu")
    here =
        "measured on this machine (emu: no GPU, the device modes ran on the emulated device): bytes per link, hit "
        "rates, peak memory, and step times, which are this CPU running the GPU kernels' logic and rank CPU work "
        "only, so the modelled step decides";
  else if (kind == "cuda")
    here = "measured on this machine's GPU: step times (they decide), bytes per link, hit rates, peak memory";
  else
    here =
        "measured on this machine (every mode on the CPU): step times (they decide), bytes per link, hit rates, "
        "peak memory";
  const std::string modelled = "modelled on " + profile_name +
                               ": each step time from the measured bytes per link, and each mode's memory (engine "
                               "model) against the budgets";
  v["measured"] = here;
  v["modelled"] = modelled;
  lines.push_back(here);
  lines.push_back(modelled);
  v["lines"] = lines;
  return v;
}

}  // namespace strata::bench
