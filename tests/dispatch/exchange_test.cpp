// KeyExchange on thread ranks: keys reach their holders in rank order, rows come back to the
// unique keys that asked for them (column slices side by side), gradients reach every holder, and
// the byte counts with and without dedup follow from the keys sent. The device forms (rows and
// gradients in device memory of each rank's emulated device) move the same values.

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <thread>

#include "dispatch/exchange.hpp"
#include "dispatch/local_communicator.hpp"
#include "gpu/device.hpp"
#include "host/dedup.hpp"

namespace strata::dispatch {
namespace {

// The value every holder stores at (key, column) of the whole table.
float value(Key k, std::int32_t col) { return static_cast<float>(k * 1000 + col); }

// One rank's emulated device, for the device forms: vectors up and down through pinned memory.
struct RankDevice {
  std::unique_ptr<gpu::Device> dev = gpu::make_emu_device().value();
  gpu::Stream stream = dev->create_stream().value();
  std::vector<gpu::DeviceBuffer> keep;
  float* up(const std::vector<float>& v) {
    keep.push_back(dev->allocate(std::max<std::size_t>(v.size(), 1) * 4).value());
    gpu::PinnedBuffer p = dev->allocate_pinned(std::max<std::size_t>(v.size(), 1) * 4).value();
    if (!v.empty()) std::memcpy(p.data(), v.data(), v.size() * 4);
    dev->copy_h2d(stream.view(), keep.back().data(), p.data(), v.size() * 4);
    EXPECT_TRUE(dev->synchronize(stream.view()).is_ok());
    return keep.back().as<float>();
  }
  void down(const float* d, std::vector<float>& v) {
    gpu::PinnedBuffer p = dev->allocate_pinned(std::max<std::size_t>(v.size(), 1) * 4).value();
    dev->copy_d2h(stream.view(), p.data(), d, v.size() * 4);
    EXPECT_TRUE(dev->synchronize(stream.view()).is_ok());
    if (!v.empty()) std::memcpy(v.data(), p.data(), v.size() * 4);
  }
};

TEST(KeyExchange, KeysRowsAndGradientsTakeTheSamePathBothWays) {
  for (bool device : {false, true})
    for (int world = 1; world <= 4; ++world)
      for (ShardingType type :
           {ShardingType::kReplicated, ShardingType::kTable, ShardingType::kRow, ShardingType::kColumn}) {
        TableSpec a, b;
        a.name = "a", a.rows = 50, a.dim = 6;
        b.name = "b", b.rows = 3, b.dim = 4;  // fewer rows than some worlds have ranks
        std::vector<ShardLayout> layouts = {ShardLayout::make(a, {type, -1}, world, 0).value(),
                                            ShardLayout::make(b, {type, -1}, world, 1).value()};
        std::vector<TableSpec> specs = {a, b};
        // Each rank's keys (with duplicates), deduped.
        std::vector<std::vector<UniqueKeys>> unique(static_cast<std::size_t>(world), std::vector<UniqueKeys>(2));
        for (int r = 0; r < world; ++r)
          for (std::size_t t = 0; t < 2; ++t) {
            std::mt19937_64 rng(static_cast<std::uint64_t>(r * 10 + static_cast<int>(t)));
            std::vector<Key> keys;
            const int n = r == 1 ? 0 : 1 + static_cast<int>(rng() % 30);  // rank 1 has no keys
            for (int i = 0; i < n; ++i)
              keys.push_back(static_cast<Key>(rng() % static_cast<std::uint64_t>(specs[t].rows)));
            unique[static_cast<std::size_t>(r)][t] = dedup_keys(keys.data(), static_cast<std::int64_t>(keys.size()));
          }
        auto group = make_local_group(world);
        ASSERT_TRUE(group.is_ok());
        std::vector<std::string> errors(static_cast<std::size_t>(world));
        std::vector<std::vector<std::vector<Key>>> served(static_cast<std::size_t>(world));
        std::vector<std::vector<std::vector<float>>> served_grads(static_cast<std::size_t>(world));
        std::vector<std::thread> threads;
        for (int r = 0; r < world; ++r)
          threads.emplace_back([&, r] {
            Communicator& comm = *group.value()[static_cast<std::size_t>(r)];
            const auto& mine = unique[static_cast<std::size_t>(r)];
            std::vector<ExchangeInput> in;
            for (std::size_t t = 0; t < 2; ++t)
              in.push_back({&layouts[t], mine[t].keys.data(), mine[t].size(), mine[t].offsets.data()});
            auto ex = KeyExchange::run(comm, in);
            if (!ex) {
              errors[static_cast<std::size_t>(r)] = ex.status().to_string();
              return;
            }
            // Holders answer with the value of (whole-table key, column) for their slice.
            std::vector<std::vector<float>> rows(2), uniq(2), grads(2), got_grads(2);
            std::vector<const float*> rp, gp;
            std::vector<float*> up, sp;
            for (std::size_t t = 0; t < 2; ++t) {
              const std::int32_t w = layouts[t].local_dim(r), c0 = layouts[t].col_offset(r);
              for (Key lr : ex->served(t))
                for (std::int32_t c = 0; c < w; ++c) {
                  const Key k = type == ShardingType::kRow ? lr * world + r : lr;
                  rows[t].push_back(value(k, c0 + c));
                }
              uniq[t].assign(static_cast<std::size_t>(mine[t].size() * specs[t].dim), -1.0f);
              for (std::int64_t u = 0; u < mine[t].size(); ++u)
                for (std::int32_t c = 0; c < specs[t].dim; ++c)
                  grads[t].push_back(value(mine[t].keys[static_cast<std::size_t>(u)], c) + 0.5f * r);
              got_grads[t].resize(ex->served(t).size() * static_cast<std::size_t>(w));
              rp.push_back(rows[t].data());
              up.push_back(uniq[t].data());
              gp.push_back(grads[t].data());
              sp.push_back(got_grads[t].data());
            }
            Status s;
            if (device) {
              RankDevice rd;
              ExchangeWorkspace ws(*rd.dev, rd.stream.view());
              std::vector<const float*> drp, dgp;
              std::vector<float*> dup, dsp;
              for (std::size_t t = 0; t < 2; ++t) {
                drp.push_back(rd.up(rows[t]));
                dup.push_back(rd.up(uniq[t]));
                dgp.push_back(rd.up(grads[t]));
                dsp.push_back(rd.up(got_grads[t]));
              }
              s = ex->return_rows(comm, ws, drp, dup);
              if (s.is_ok()) s = ex->send_grads(comm, ws, dgp, dsp);
              for (std::size_t t = 0; t < 2 && s.is_ok(); ++t) {
                rd.down(dup[t], uniq[t]);
                rd.down(dsp[t], got_grads[t]);
              }
              if (s.is_ok()) s = rd.dev->status();
              if (s.is_ok() && rd.dev->counters().snapshot().d2h !=
                                   (uniq[0].size() + uniq[1].size() + got_grads[0].size() + got_grads[1].size()) * 4)
                s = Status::internal("the device forms copied rows D2H");
            } else {
              s = ex->return_rows(comm, rp, up);
              if (s.is_ok()) s = ex->send_grads(comm, gp, sp);
            }
            if (!s.is_ok()) {
              errors[static_cast<std::size_t>(r)] = s.to_string();
              return;
            }
            for (std::size_t t = 0; t < 2; ++t)
              for (std::int64_t u = 0; u < mine[t].size(); ++u)
                for (std::int32_t c = 0; c < specs[t].dim; ++c)
                  if (uniq[t][static_cast<std::size_t>(u * specs[t].dim + c)] !=
                      value(mine[t].keys[static_cast<std::size_t>(u)], c))
                    errors[static_cast<std::size_t>(r)] += "row of key " +
                                                           std::to_string(mine[t].keys[static_cast<std::size_t>(u)]) +
                                                           " col " + std::to_string(c) + " wrong; ";
            for (std::size_t t = 0; t < 2; ++t) served[static_cast<std::size_t>(r)].push_back(ex->served(t));
            served_grads[static_cast<std::size_t>(r)] = got_grads;
          });
        for (auto& t : threads) t.join();
        for (const auto& e : errors)
          ASSERT_EQ(e, "") << to_string(type) << " world " << world << (device ? " device" : " host");
        // Served keys: every source's keys held here, sources in rank order; gradients alongside.
        for (int h = 0; h < world; ++h)
          for (std::size_t t = 0; t < 2; ++t) {
            std::vector<Key> want;
            std::vector<float> want_grads;
            const std::int32_t w = layouts[t].local_dim(h), c0 = layouts[t].col_offset(h);
            for (int s = 0; s < world; ++s)
              for (Key k : unique[static_cast<std::size_t>(s)][t].keys)
                if (layouts[t].to_all() || layouts[t].owner_of(k) == h) {
                  want.push_back(layouts[t].local_row(k));
                  for (std::int32_t c = 0; c < w; ++c) want_grads.push_back(value(k, c0 + c) + 0.5f * s);
                }
            if (!layouts[t].holds(h)) continue;
            EXPECT_EQ(served[static_cast<std::size_t>(h)][t], want)
                << to_string(type) << " world " << world << " holder " << h;
            EXPECT_EQ(served_grads[static_cast<std::size_t>(h)][t], want_grads)
                << to_string(type) << " world " << world << " holder " << h;
          }
      }
}

// A rank that failed before a device exchange still joins it, so that every rank fails (even
// one that has nothing to exchange with it) instead of going on without it.
TEST(KeyExchange, ALocalFailureBeforeADeviceExchangeFailsEveryRank) {
  TableSpec s;
  s.name = "t", s.rows = 10, s.dim = 4;
  const ShardLayout l = ShardLayout::make(s, {ShardingType::kRow, -1}, 2, 0).value();
  auto group = make_local_group(2);
  ASSERT_TRUE(group.is_ok());
  std::vector<Status> got(2), after(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      Communicator& comm = *group.value()[static_cast<std::size_t>(r)];
      ExchangeInput none{&l, nullptr, 0, nullptr};  // no keys at all: nothing to send or receive
      auto ex = KeyExchange::run(comm, {none});
      if (!ex) {
        got[static_cast<std::size_t>(r)] = ex.status();
        return;
      }
      RankDevice rd;
      ExchangeWorkspace ws(*rd.dev, rd.stream.view());
      float* d = rd.up({0.0f});
      const Status local = r == 0 ? Status::internal("rank 0 broke") : Status::ok();
      got[static_cast<std::size_t>(r)] = ex->return_rows(comm, ws, {d}, {d}, local);
      // The ranks agreed to fail the call: the communicator still works (a store's read_rows and
      // save after a device fault are collectives too).
      after[static_cast<std::size_t>(r)] = comm.barrier();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(got[0].message(), "rank 0 broke");
  EXPECT_FALSE(got[1].is_ok());
  EXPECT_NE(got[1].message().find("rank 0"), std::string::npos) << got[1].to_string();
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(after[static_cast<std::size_t>(r)].is_ok()) << after[r].to_string();
}

TEST(KeyExchange, DedupCutsTheBytesByTheDuplicationFactorOfTheKeysSent) {
  // Two ranks, row sharding: rank 0 sends its odd keys to rank 1. Keys 1 and 3 used 5 and 3 times.
  TableSpec s;
  s.name = "t", s.rows = 10, s.dim = 4;
  const ShardLayout l = ShardLayout::make(s, {ShardingType::kRow, -1}, 2, 0).value();
  auto group = make_local_group(2);
  ASSERT_TRUE(group.is_ok());
  ExchangeBytes bytes;
  std::thread peer([&] {
    ExchangeInput none{&l, nullptr, 0, nullptr};
    (void)KeyExchange::run(*group.value()[1], {none});
  });
  const std::vector<Key> keys = {1, 1, 3, 1, 2, 1, 3, 3, 1, 4};
  const UniqueKeys u = dedup_keys(keys.data(), static_cast<std::int64_t>(keys.size()));
  auto ex = KeyExchange::run(*group.value()[0], {{&l, u.keys.data(), u.size(), u.offsets.data()}});
  peer.join();
  ASSERT_TRUE(ex.is_ok());
  bytes = ex->bytes();
  // Sent to rank 1: keys 1 and 3 (2 unique, 8 uses). Per key: 8 bytes of key, 16 of row, 16 of gradient.
  EXPECT_EQ(bytes.keys, 2 * 8);
  EXPECT_EQ(bytes.rows, 2 * 16);
  EXPECT_EQ(bytes.grads, 2 * 16);
  EXPECT_EQ(bytes.total_no_dedup(), 8 * (8 + 16 + 16));
  EXPECT_EQ(bytes.total_no_dedup() / bytes.total(), 4);  // the duplication factor of the keys sent (8 uses / 2 keys)
}

}  // namespace
}  // namespace strata::dispatch
