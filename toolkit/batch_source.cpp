#include "toolkit/batch_source.hpp"

#include <algorithm>
#include <utility>

namespace strata::bench {
namespace {

using ProgressFn = std::function<void(std::int64_t, std::int64_t)>;

// Adds one batch to the summary.
void count(SourceSummary& s, const KeyBatch& b, std::int64_t& bags) {
  const std::int64_t samples = b.batch_size();
  s.min_batch_size = s.samples == 0 ? samples : std::min(s.min_batch_size, samples);
  s.samples += samples;
  for (const JaggedKeys& f : b.features) {
    s.max_batch_size = std::max(s.max_batch_size, f.batch_size());
    s.keys += f.num_keys();
    bags += f.batch_size();
  }
}

// A cursor over the batches of a vector shared with the source.
class MemoryCursor : public BatchCursor {
 public:
  MemoryCursor(std::shared_ptr<const std::vector<KeyBatch>> all, std::int64_t first, std::int64_t stride)
      : all_(std::move(all)), next_(first), stride_(stride) {}
  Result<KeyBatch> next() override {
    const auto n = static_cast<std::int64_t>(all_->size());
    KeyBatch b = (*all_)[static_cast<std::size_t>(next_ % n)];
    next_ += stride_;
    return b;
  }

 private:
  std::shared_ptr<const std::vector<KeyBatch>> all_;
  std::int64_t next_;
  std::int64_t stride_;
};

// A cursor over a file read front to back: `read` gives the file's next batch (false at its end),
// `restart` goes back to its first. Batches it does not return are read and dropped.
class FileCursor : public BatchCursor {
 public:
  FileCursor(std::function<Result<bool>(KeyBatch&)> read, std::function<Status()> restart,
             std::vector<TraceTable> tables, std::int64_t size, std::int64_t first, std::int64_t stride)
      : read_(std::move(read)),
        restart_(std::move(restart)),
        tables_(std::move(tables)),
        size_(size),
        next_(first),
        stride_(stride) {}
  Result<KeyBatch> next() override {
    const std::int64_t target = next_ % size_;
    next_ += stride_;
    if (target < pos_) {
      STRATA_RETURN_IF_ERROR(restart_());
      pos_ = 0;
    }
    KeyBatch b;
    for (; pos_ <= target; ++pos_) {
      STRATA_ASSIGN_OR_RETURN(const bool more, read_(b));
      if (!more) return Status::data_loss("the file ended before batch " + std::to_string(target) + " (it changed?)");
    }
    order_features(b, tables_);
    return b;
  }

 private:
  std::function<Result<bool>(KeyBatch&)> read_;
  std::function<Status()> restart_;
  std::vector<TraceTable> tables_;
  std::int64_t size_;
  std::int64_t pos_ = 0;  // file batch the next read returns
  std::int64_t next_;
  std::int64_t stride_;
};

std::vector<TraceTable> trace_tables(const std::vector<TableSpec>& specs) {
  std::vector<TraceTable> t;
  t.reserve(specs.size());
  for (const TableSpec& s : specs) t.push_back({s.name, s.rows});
  return t;
}

// Reads the first `needed` batches of a file through `read`, keeping the head and the counts.
Status scan(const std::function<Result<bool>(KeyBatch&)>& read, const std::vector<TraceTable>& tables,
            std::int64_t needed, std::int64_t expected, const ProgressFn& progress, std::int64_t& size,
            std::vector<KeyBatch>& head, SourceSummary& summary) {
  std::int64_t bags = 0;
  KeyBatch b;
  for (size = 0; size < needed; ++size) {
    STRATA_ASSIGN_OR_RETURN(const bool more, read(b));
    if (!more) break;
    order_features(b, tables);
    count(summary, b, bags);
    if (size < kSourceHeadBatches) head.push_back(b);
    if (progress && (size % 64 == 63 || size + 1 == expected)) progress(size + 1, expected);
  }
  summary.mean_keys_per_bag = bags > 0 ? static_cast<double>(summary.keys) / static_cast<double>(bags) : 0.0;
  return Status::ok();
}

}  // namespace

Status check_source_holds_phase(const std::string& kind, const std::string& path, std::int64_t batches,
                                std::int64_t warmup, std::int64_t steps, int world) {
  const std::int64_t per_phase = (warmup + steps) * world;
  if (batches >= per_phase) return Status::ok();
  // Which flag to lower: --steps alone when the file holds more than the warm-up, else both (or
  // fewer ranks when it holds less than a batch per rank).
  const std::int64_t per_rank = batches / world;
  std::string lower;
  if (per_rank > warmup) {
    lower = "lower --steps to at most " + std::to_string(per_rank - warmup);
  } else if (per_rank >= 1) {
    lower = "lower --warmup and --steps to add up to at most " + std::to_string(per_rank) + " (e.g. --warmup " +
            std::to_string(per_rank / 2) + " --steps " + std::to_string(per_rank - per_rank / 2) + ")";
  } else {
    lower = "use at most " + std::to_string(batches) + " ranks";
  }
  return Status::invalid_argument(
      kind + " " + path + " has " + std::to_string(batches) + " batches but --warmup " + std::to_string(warmup) +
      " + --steps " + std::to_string(steps) + (world > 1 ? " on " + std::to_string(world) + " ranks" : "") +
      " need at least " + std::to_string(per_phase) +
      " (each phase runs warmup + steps batches per rank; up to twice that are read, fewer are cycled): " + lower);
}

void order_features(KeyBatch& batch, const std::vector<TraceTable>& tables) {
  const std::int64_t bags = batch.batch_size();
  std::vector<JaggedKeys> ordered(tables.size());
  for (std::size_t t = 0; t < tables.size(); ++t) {
    ordered[t].table = tables[t].name;
    ordered[t].offsets.assign(static_cast<std::size_t>(bags + 1), 0);
  }
  for (JaggedKeys& f : batch.features) {
    const auto it = std::find_if(tables.begin(), tables.end(), [&](const TraceTable& t) { return t.name == f.table; });
    ordered[static_cast<std::size_t>(it - tables.begin())] = std::move(f);
  }
  batch.features = std::move(ordered);
}

BatchSource BatchSource::generated(std::vector<KeyBatch> batches) {
  BatchSource s;
  for (const JaggedKeys& f : batches.front().features) s.tables_.push_back({f.table, 0});
  s.size_ = static_cast<std::int64_t>(batches.size());
  std::int64_t bags = 0;
  for (const KeyBatch& b : batches) count(s.summary_, b, bags);
  s.summary_.mean_keys_per_bag = bags > 0 ? static_cast<double>(s.summary_.keys) / static_cast<double>(bags) : 0.0;
  s.head_.assign(batches.begin(), batches.begin() + std::min<std::ptrdiff_t>(kSourceHeadBatches, s.size_));
  s.all_ = std::make_shared<const std::vector<KeyBatch>>(std::move(batches));
  return s;
}

Result<BatchSource> BatchSource::open_trace(const std::string& path, std::int64_t needed, const ProgressFn& progress) {
  STRATA_ASSIGN_OR_RETURN(TraceReader reader, TraceReader::open(path));
  BatchSource s;
  s.kind_ = "trace";
  s.path_ = path;
  s.tables_ = reader.tables();
  if (reader.num_batches() == 0) return Status::invalid_argument("trace " + path + " has no batches");
  const auto expected = static_cast<std::int64_t>(std::min<std::uint64_t>(reader.num_batches(), needed));
  STRATA_RETURN_IF_ERROR(scan([&](KeyBatch& b) { return reader.next(b); }, s.tables_, needed, expected, progress,
                              s.size_, s.head_, s.summary_));
  // The batches after those used: their framing only, so that a truncated file is found now.
  for (;;) {
    STRATA_ASSIGN_OR_RETURN(const bool more, reader.skip());
    if (!more) break;
  }
  if (s.summary_.keys == 0)
    return Status::invalid_argument("trace " + path + " has no keys in its first " + std::to_string(s.size_) +
                                    " batches");
  return s;
}

Result<BatchSource> BatchSource::open_criteo(const std::string& path, const std::vector<TableSpec>& tables,
                                             const CriteoTsvOptions& options, std::int64_t needed,
                                             const ProgressFn& progress) {
  STRATA_ASSIGN_OR_RETURN(CriteoTsvReader reader, CriteoTsvReader::open(path, tables, options));
  BatchSource s;
  s.kind_ = "criteo";
  s.path_ = path;
  s.tables_ = trace_tables(tables);
  s.criteo_tables_ = tables;
  s.criteo_options_ = options;
  STRATA_RETURN_IF_ERROR(
      scan([&](KeyBatch& b) { return reader.next(b); }, s.tables_, needed, 0, progress, s.size_, s.head_, s.summary_));
  if (s.size_ == 0) return Status::invalid_argument("criteo " + path + " has no samples");
  return s;
}

Result<std::unique_ptr<BatchCursor>> BatchSource::cursor(std::int64_t first, std::int64_t stride) const {
  if (kind_ == "generated") return std::unique_ptr<BatchCursor>(new MemoryCursor(all_, first, stride));
  if (kind_ == "trace") {
    STRATA_ASSIGN_OR_RETURN(TraceReader reader, TraceReader::open(path_));
    auto r = std::make_shared<TraceReader>(std::move(reader));
    return std::unique_ptr<BatchCursor>(new FileCursor([r](KeyBatch& b) { return r->next(b); },
                                                       [r] { return r->rewind(); }, tables_, size_, first, stride));
  }
  const CriteoTsvOptions options = criteo_options_;
  STRATA_ASSIGN_OR_RETURN(CriteoTsvReader reader, CriteoTsvReader::open(path_, criteo_tables_, options));
  auto r = std::make_shared<CriteoTsvReader>(std::move(reader));
  const std::string path = path_;
  const std::vector<TableSpec> specs = criteo_tables_;
  return std::unique_ptr<BatchCursor>(
      new FileCursor([r](KeyBatch& b) { return r->next(b); },
                     [r, path, specs, options]() -> Status {
                       STRATA_ASSIGN_OR_RETURN(CriteoTsvReader again, CriteoTsvReader::open(path, specs, options));
                       *r = std::move(again);
                       return Status::ok();
                     },
                     tables_, size_, first, stride));
}

}  // namespace strata::bench
