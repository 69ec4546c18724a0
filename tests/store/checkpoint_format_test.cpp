// The checkpoint format (store/io/detail/checkpoint_format.hpp): manifests of format 1 (a store) and 2 (a world)
// parse into one Manifest and are refused when corrupt; piece files round-trip (format 3: each element at its table's
// element type) and are refused when truncated, mismatched or changed between verify and read; stale files go, kept
// ones stay.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "store/io/detail/checkpoint_format.hpp"
#include "store/io/detail/crc32c.hpp"
#include "tests/store/boxes.hpp"
#include "tests/store/half_tables.hpp"

namespace strata::detail {
namespace {

namespace fs = std::filesystem;

ManifestTable table(const std::string& name, std::int64_t rows, std::int32_t dim, const std::string& optimizer,
                    std::int32_t state_dim) {
  ManifestTable t;
  t.name = name;
  t.rows = rows;
  t.dim = dim;
  t.state_dim = state_dim;
  t.dtype = "fp32";
  t.optimizer = optimizer;
  t.learning_rate = 0.05f;
  t.has_learning_rate = true;
  return t;
}

PieceEntry piece(const ManifestTable& t, std::uint64_t save, int rank, const Box& box) {
  return {piece_file_name(t.name, 8, save, rank), rank, box, expected_file_bytes(t, box, kWorldFormatVersion),
          0x1a2b3c4du + rank};
}

// A world of 4's manifest: "user" row-sharded (adagrad), "item" column-sharded (adam), "ads" replicated (rowwise).
Manifest world_manifest() {
  Manifest m;
  m.version = kWorldFormatVersion;
  m.generation = 8;
  m.save_id = 0x3f9a2c1d5e6b7a80ull;
  m.world = 4;
  m.step = 1200;
  m.config = R"({"tables":[]})";
  ManifestTable user = table("user", 37, 8, "adagrad", 8);
  user.sharding = "row";
  for (int r = 0; r < 4; ++r) user.pieces.push_back(piece(user, m.save_id, r, row_box(37, r, 4, 8)));
  ManifestTable item = table("item", 11, 5, "adam", 10);
  item.sharding = "column";
  item.learning_rate = 0.25f;
  const std::int32_t c0[] = {0, 2, 3, 4, 5};
  for (int r = 0; r < 4; ++r)
    item.pieces.push_back(piece(item, m.save_id, r, column_box(11, c0[r], c0[r + 1] - c0[r])));
  ManifestTable ads = table("ads", 3, 4, "rowwise_adagrad", 1);
  ads.sharding = "replicated";
  ads.pieces.push_back(piece(ads, m.save_id, 2, whole_box(3, 4)));
  m.tables = {user, item, ads};
  return m;
}

// The manifest text `m` gives after `edit` changed its JSON (checksum line recomputed).
std::string edited(const Manifest& m, const std::function<void(nlohmann::json&)>& edit) {
  const std::string text = manifest_text(m);
  nlohmann::json j = nlohmann::json::parse(text.substr(0, text.rfind("\ncrc32c ")));
  edit(j);
  const std::string body = j.dump(2);
  return body + "\ncrc32c " + hex32(crc32c(body.data(), body.size())) + "\n";
}

void expect_refused(const std::string& text, StatusCode code, const std::vector<std::string>& parts) {
  Result<Manifest> m = parse_manifest("dir/MANIFEST", text);
  ASSERT_FALSE(m.is_ok());
  EXPECT_EQ(m.status().code(), code) << m.status().to_string();
  for (const auto& part : parts) EXPECT_NE(m.status().message().find(part), std::string::npos) << m.status().message();
}

TEST(CheckpointFormat, AWorldManifestRoundTrips) {
  const Manifest m = world_manifest();
  const std::string text = manifest_text(m);
  EXPECT_NE(text.find("\"save\": \"3f9a2c1d5e6b7a80\""), std::string::npos) << text;
  EXPECT_NE(text.find("\"file\": \"user.8.3f9a2c1d5e6b7a80.r0.tbl\""), std::string::npos) << text;
  Result<Manifest> back = parse_manifest("dir/MANIFEST", text);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  const Manifest& b = back.value();
  EXPECT_EQ(b.version, kWorldFormatVersion);
  EXPECT_EQ(b.generation, 8u);
  EXPECT_EQ(b.save_id, m.save_id);
  EXPECT_EQ(b.world, 4);
  EXPECT_EQ(b.step, 1200);
  EXPECT_EQ(b.config, m.config);
  ASSERT_EQ(b.tables.size(), 3u);
  for (std::size_t t = 0; t < 3; ++t) {
    EXPECT_EQ(b.tables[t].name, m.tables[t].name);
    EXPECT_EQ(b.tables[t].sharding, m.tables[t].sharding);
    EXPECT_EQ(b.tables[t].learning_rate, m.tables[t].learning_rate);
    EXPECT_TRUE(b.tables[t].has_learning_rate);
    ASSERT_EQ(b.tables[t].pieces.size(), m.tables[t].pieces.size());
    for (std::size_t k = 0; k < m.tables[t].pieces.size(); ++k) {
      const PieceEntry &got = b.tables[t].pieces[k], &want = m.tables[t].pieces[k];
      EXPECT_EQ(got.file, want.file);
      EXPECT_EQ(got.rank, want.rank);
      EXPECT_EQ(got.box, want.box);
      EXPECT_EQ(got.bytes, want.bytes);
      EXPECT_EQ(got.crc, want.crc);
    }
  }
  EXPECT_EQ(manifest_text(b), text);
  EXPECT_EQ(file_names(b).size(), 9u);
}

// Format 1 is what single stores write and what older builds read: manifest_text must give the bytes save always
// wrote (the JSON below is built the way save built it before manifest_text existed).
TEST(CheckpointFormat, AStoreManifestIsFormatOneByteForByteAndParsesToOneWholePiecePerTable) {
  Manifest m;
  m.generation = 3;
  m.step = 7;
  m.config = R"({"device":"emu","tables":[]})";
  ManifestTable user = table("user", 11, 4, "adagrad", 4);
  user.pieces.push_back({"user.3.tbl", 0, whole_box(11, 4), 64 + 11 * 8 * 4, 0x1234abcdu});
  ManifestTable item = table("item", 5, 2, "sgd", 0);
  item.learning_rate = 0.1f;
  item.pieces.push_back({"item.3.tbl", 0, whole_box(5, 2), 64 + 5 * 2 * 4, 0xdeadbeefu});
  m.tables = {user, item};

  nlohmann::json j;
  j["config"] = nlohmann::json::parse(m.config);
  j["format"] = "strata-checkpoint";
  j["version"] = std::uint32_t{1};
  j["generation"] = m.generation;
  j["step"] = m.step;
  j["tables"] = nlohmann::json::array();
  for (const auto& t : m.tables)
    j["tables"].push_back({{"name", t.name},
                           {"file", t.pieces[0].file},
                           {"rows", t.rows},
                           {"dim", t.dim},
                           {"state_dim", t.state_dim},
                           {"dtype", t.dtype},
                           {"optimizer", t.optimizer},
                           {"bytes", t.pieces[0].bytes},
                           {"crc32c", hex32(t.pieces[0].crc)},
                           {"learning_rate", t.learning_rate}});
  const std::string body = j.dump(2);
  const std::string before = body + "\ncrc32c " + hex32(crc32c(body.data(), body.size())) + "\n";
  EXPECT_EQ(manifest_text(m), before);

  Result<Manifest> back = parse_manifest("dir/MANIFEST", before);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back.value().version, kFormatVersion);
  EXPECT_EQ(back.value().world, 1);
  EXPECT_EQ(back.value().save_id, 0u);
  ASSERT_EQ(back.value().tables.size(), 2u);
  for (std::size_t t = 0; t < 2; ++t) {
    const ManifestTable& got = back.value().tables[t];
    EXPECT_TRUE(got.sharding.empty());
    ASSERT_EQ(got.pieces.size(), 1u);
    EXPECT_EQ(got.pieces[0].file, m.tables[t].pieces[0].file);
    EXPECT_EQ(got.pieces[0].box, whole_box(m.tables[t].rows, m.tables[t].dim));
    EXPECT_EQ(got.pieces[0].bytes, m.tables[t].pieces[0].bytes);
    EXPECT_EQ(got.pieces[0].crc, m.tables[t].pieces[0].crc);
  }
  EXPECT_EQ(manifest_text(back.value()), before);
  // A manifest from before learning rates were recorded keeps none.
  expect_refused(edited(m, [](nlohmann::json& e) { e["tables"][0]["learning_rate"] = -1.0; }), StatusCode::kDataLoss,
                 {"table 'user': learning_rate -1", "corrupt"});
  Result<Manifest> old = parse_manifest("dir/MANIFEST", edited(m, [](nlohmann::json& e) {
                                          for (auto& t : e["tables"]) t.erase("learning_rate");
                                        }));
  ASSERT_TRUE(old.is_ok()) << old.status().to_string();
  EXPECT_FALSE(old.value().tables[0].has_learning_rate);
}

TEST(CheckpointFormat, ManifestsThatAreCorruptOrOfAnotherVersionAreRefusedNamingWhatIsWrong) {
  const Manifest m = world_manifest();
  expect_refused(edited(m, [](nlohmann::json& j) { j["version"] = 6; }), StatusCode::kInvalidArgument,
                 {"dir/MANIFEST", "format version 6 (expected 1, 2, 3, 4 or 5)"});
  // A piece path outside the directory.
  expect_refused(edited(m, [](nlohmann::json& j) { j["tables"][0]["pieces"][1]["file"] = "../user.8.r1.tbl"; }),
                 StatusCode::kDataLoss, {"table 'user'", "'../user.8.r1.tbl' is not a file name inside"});
  // Pieces that do not tile: one dropped, one shifted, one of another step.
  expect_refused(edited(m, [](nlohmann::json& j) { j["tables"][0]["pieces"].erase(2); }), StatusCode::kDataLoss,
                 {"table 'user'", "do not cover rows 2 + 4i", "corrupt"});
  expect_refused(edited(m, [](nlohmann::json& j) { j["tables"][1]["pieces"][2]["col_offset"] = 2; }),
                 StatusCode::kDataLoss, {"table 'item'", "item.8.3f9a2c1d5e6b7a80.r2.tbl", "overlaps"});
  expect_refused(edited(m, [](nlohmann::json& j) { j["tables"][0]["pieces"][3]["row_step"] = 3; }),
                 StatusCode::kDataLoss, {"user.8.3f9a2c1d5e6b7a80.r3.tbl", "row step 3 (expected the step 4"});
  // A size that does not match the box; a rank outside the world; a file listed twice; a bad save id.
  expect_refused(edited(m, [](nlohmann::json& j) { j["tables"][0]["pieces"][0]["bytes"] = 100; }),
                 StatusCode::kDataLoss, {"piece 'user.8.3f9a2c1d5e6b7a80.r0.tbl'", "100 bytes (expected 704"});
  expect_refused(edited(m, [](nlohmann::json& j) { j["tables"][2]["pieces"][0]["rank"] = 4; }), StatusCode::kDataLoss,
                 {"table 'ads'", "rank 4 (expected a rank of the world of 4"});
  expect_refused(
      edited(m, [](nlohmann::json& j) { j["tables"][2]["pieces"][0]["file"] = j["tables"][0]["pieces"][0]["file"]; }),
      StatusCode::kDataLoss, {"table 'ads'", "'user.8.3f9a2c1d5e6b7a80.r0.tbl' is listed twice"});
  expect_refused(edited(m, [](nlohmann::json& j) { j["save"] = "3f9a"; }), StatusCode::kDataLoss,
                 {"save id '3f9a' (expected 16 lowercase hex digits"});
  expect_refused(edited(m, [](nlohmann::json& j) { j["tables"][1]["sharding"] = "diagonal"; }), StatusCode::kDataLoss,
                 {"table 'item'", "sharding 'diagonal'"});
  // A column piece of a table whose state is one float a row.
  expect_refused(edited(m,
                        [](nlohmann::json& j) {
                          auto& p = j["tables"][2]["pieces"];
                          p[0]["cols"] = 2;
                          nlohmann::json second = p[0];
                          second["col_offset"] = 2;
                          second["file"] = "ads.8.3f9a2c1d5e6b7a80.r3.tbl";
                          p.push_back(second);
                        }),
                 StatusCode::kDataLoss, {"table 'ads'", "cannot be split by column"});
  // The checksum line: wrong, missing, not last.
  std::string text = manifest_text(m);
  std::string flipped = text;
  flipped[text.find("\"step\": 1200") + 9] = '3';
  expect_refused(flipped, StatusCode::kDataLoss, {"dir/MANIFEST: checksum", "does not match the recorded"});
  expect_refused(text.substr(0, text.rfind("\ncrc32c ")), StatusCode::kDataLoss, {"no checksum line"});
  expect_refused(text + "x", StatusCode::kDataLoss, {"bytes after the checksum line"});
}

// Shapes no save writes: a negative or too wide table, a state width its optimizer does not keep, an optimizer that
// does not exist, byte counts past 2^63, element types a table cannot have. Each once parsed (the last but two made
// expected_file_bytes wrap to 64, and a reader of it threw std::length_error); each is refused naming the table and the
// field.
TEST(CheckpointFormat, ImpossibleTableShapesAreRefusedNamingTheField) {
  Manifest m;  // format 1: one whole piece, no piece sizes checked against boxes
  m.generation = 3;
  ManifestTable user = table("user", 3, 4, "adagrad", 4);
  user.pieces.push_back({"user.3.tbl", 0, whole_box(3, 4), 64 + 3 * 8 * 4, 0x1234abcdu});
  m.tables = {user};
  ASSERT_TRUE(parse_manifest("dir/MANIFEST", manifest_text(m)).is_ok());
  const auto shape = [&](std::int64_t rows, std::int32_t dim, std::int32_t state_dim, const std::string& optimizer,
                         std::uint64_t bytes) {
    return edited(m, [&](nlohmann::json& j) {
      auto& t = j["tables"][0];
      t["rows"] = rows;
      t["dim"] = dim;
      t["state_dim"] = state_dim;
      t["optimizer"] = optimizer;
      t["bytes"] = bytes;
    });
  };
  const std::string corrupt = "corrupt";
  expect_refused(shape(-5, 4, 4, "adagrad", 64), StatusCode::kDataLoss,
                 {"dir/MANIFEST: table 'user': rows -5 (expected >= 0", corrupt});
  expect_refused(shape(3, -2, 0, "sgd", 64), StatusCode::kDataLoss,
                 {"table 'user': dim -2 (expected 1 to 1048576", corrupt});
  expect_refused(shape(3, kMaxDim + 1, kMaxDim + 1, "adagrad", 64), StatusCode::kDataLoss,
                 {"table 'user': dim 1048577 (expected 1 to 1048576", corrupt});
  expect_refused(shape(3, 4, -4, "adagrad", 64), StatusCode::kDataLoss,
                 {"table 'user': state_dim -4 (expected 4 for optimizer adagrad and dim 4", corrupt});
  expect_refused(shape(std::int64_t{1} << 62, 1, -2, "adagrad", 64), StatusCode::kDataLoss,
                 {"table 'user': state_dim -2 (expected 1 for optimizer adagrad and dim 1", corrupt});
  expect_refused(shape(3, 4, 4, "lion", 64), StatusCode::kDataLoss,
                 {"table 'user': unknown optimizer 'lion' (expected sgd, adagrad", corrupt});
  expect_refused(shape(std::int64_t{1} << 62, 4, 4, "adagrad", 64), StatusCode::kDataLoss,
                 {"table 'user': rows 4611686018427387904 of 8 floats", "more than 2^63 - 1 bytes", corrupt});
  // Format 2 the same.
  expect_refused(edited(world_manifest(), [](nlohmann::json& j) { j["tables"][1]["state_dim"] = 5; }),
                 StatusCode::kDataLoss,
                 {"table 'item': state_dim 5 (expected 10 for optimizer adam and dim 5", corrupt});
  // Element types no store has: bf16 state of rowwise_adagrad (one fp32 a row), fp16 state.
  expect_refused(edited(world_manifest(), [](nlohmann::json& j) { j["tables"][2]["state_dtype"] = "bf16"; }),
                 StatusCode::kDataLoss, {"table 'ads': state_dtype bf16 with optimizer rowwise_adagrad", corrupt});
  expect_refused(edited(world_manifest(), [](nlohmann::json& j) { j["tables"][0]["state_dtype"] = "fp16"; }),
                 StatusCode::kDataLoss, {"table 'user': state_dtype fp16 (expected fp32 or bf16)", corrupt});
}

// A table saved without a learning rate (a checkpoint from before rates were recorded, loaded and saved again) keeps
// none: manifest_text writes the rate only when there is one.
TEST(CheckpointFormat, ATableWithoutALearningRateKeepsNoneThroughTheManifest) {
  Manifest m = world_manifest();
  m.tables[0].has_learning_rate = false;
  const std::string text = manifest_text(m);
  Result<Manifest> back = parse_manifest("dir/MANIFEST", text);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_FALSE(back.value().tables[0].has_learning_rate);
  EXPECT_TRUE(back.value().tables[1].has_learning_rate);
  EXPECT_EQ(back.value().tables[1].learning_rate, 0.25f);
  EXPECT_EQ(manifest_text(back.value()), text);
}

class PieceFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("strata_format_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Records of `box` of table `t`: distinct values.
  static std::vector<float> records(const ManifestTable& t, const Box& box) {
    std::vector<float> out(static_cast<std::size_t>(box.rows * record_floats(t, box)));
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(i) * 0.5f + 1.0f;
    return out;
  }

  // Writes `box` of `t` as piece `file` in two appends (records(t, box) in format 2 unless given); returns its
  // manifest entry.
  PieceEntry write(const ManifestTable& t, const std::string& file, const Box& box, std::uint64_t save) {
    return write(t, file, box, save, records(t, box), kWorldFormatVersion);
  }
  PieceEntry write(const ManifestTable& t, const std::string& file, const Box& box, std::uint64_t save,
                   const std::vector<float>& recs, std::uint32_t version) {
    Result<PieceWriter> w = PieceWriter::create(dir_, file, t, box, save, version);
    EXPECT_TRUE(w.is_ok()) << w.status().to_string();
    const std::int64_t half = box.rows / 2;
    EXPECT_TRUE(w.value().append(recs.data(), half).is_ok());
    EXPECT_TRUE(w.value().append(recs.data() + half * record_floats(t, box), box.rows - half).is_ok());
    PieceEntry p{file, 1, box, w.value().bytes(), w.value().crc()};
    const Status committed = w.value().commit();
    EXPECT_TRUE(committed.is_ok()) << committed.to_string();
    return p;
  }

  void flip_byte(const std::string& file, std::uint64_t offset) {
    std::fstream f(dir_ + "/" + file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x40);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(&c, 1);
  }

  static void expect_error(const Status& s, StatusCode code, const std::vector<std::string>& parts) {
    EXPECT_EQ(s.code(), code) << s.to_string();
    for (const auto& part : parts) EXPECT_NE(s.message().find(part), std::string::npos) << s.message();
  }

  std::string dir_;
};

TEST_F(PieceFiles, APieceRoundTripsThroughWriterAndReader) {
  const ManifestTable t = table("item", 11, 5, "adam", 10);
  const Box box = column_box(11, 2, 2);  // records of 2 weights and 4 state floats
  const std::string file = piece_file_name("item", 8, 0xabcull, 1);
  EXPECT_EQ(file, "item.8.0000000000000abc.r1.tbl");
  const PieceEntry p = write(t, file, box, 0xabc);
  EXPECT_EQ(p.bytes, expected_file_bytes(t, box, kWorldFormatVersion));
  EXPECT_EQ(p.bytes, 64u + 11u * 6u * 4u);
  EXPECT_EQ(fs::file_size(dir_ + "/" + file), p.bytes);

  Result<PieceReader> r = PieceReader::open(dir_, t, p, kWorldFormatVersion, 0xabc);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r.value().width(), 6);
  ASSERT_TRUE(r.value().verify().is_ok()) << r.value().verify().to_string();
  std::vector<float> got(static_cast<std::size_t>(11 * 6));
  ASSERT_TRUE(r.value().read_next(4, got.data()).is_ok());
  expect_error(r.value().finish(), StatusCode::kFailedPrecondition, {"finish after 4 of 11 records"});
  ASSERT_TRUE(r.value().read_next(7, got.data() + 4 * 6).is_ok());
  expect_error(r.value().read_next(1, got.data()), StatusCode::kOutOfRange, {"1 more records after 11"});
  EXPECT_TRUE(r.value().finish().is_ok());
  EXPECT_EQ(got, records(t, box));
  // A second pass after another verify reads the same.
  ASSERT_TRUE(r.value().verify().is_ok());
  ASSERT_TRUE(r.value().read_next(11, got.data()).is_ok());
  EXPECT_TRUE(r.value().finish().is_ok());
}

// Format 3: a piece of a bf16 table with bf16 state holds 2 bytes an element (its header records the state's element
// type), reads back bit for bit, and its writer refuses a value bf16 does not hold exactly instead of rounding it.
TEST_F(PieceFiles, ATypedPieceHoldsEachElementAtItsSizeAndRefusesWhatItsTypeDoesNotHold) {
  ManifestTable t = table("item", 11, 5, "adam", 10);
  t.dtype = "bf16";
  t.state_dtype = "bf16";
  const Box box = column_box(11, 2, 2);  // records of 2 weights and 4 state elements
  const std::vector<float> recs = testing::values_of(DType::kBF16, 11 * 6, 3);
  const std::string file = piece_file_name("item", 8, 0xabcull, 1);
  Result<PieceWriter> w = PieceWriter::create(dir_, file, t, box, 0xabc, kTypedFormatVersion);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  ASSERT_TRUE(w.value().append(recs.data(), 11).is_ok());
  const PieceEntry p{file, 1, box, w.value().bytes(), w.value().crc()};
  ASSERT_TRUE(w.value().commit().is_ok());
  EXPECT_EQ(p.bytes, 64u + 11u * 6u * 2u);
  EXPECT_EQ(p.bytes, expected_file_bytes(t, box, kTypedFormatVersion));
  EXPECT_EQ(fs::file_size(dir_ + "/" + file), p.bytes);
  Result<PieceReader> r = PieceReader::open(dir_, t, p, kTypedFormatVersion, 0xabc);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_TRUE(r.value().verify().is_ok()) << r.value().verify().to_string();
  std::vector<float> got(recs.size());
  ASSERT_TRUE(r.value().read_next(11, got.data()).is_ok());
  EXPECT_TRUE(r.value().finish().is_ok());
  EXPECT_EQ(std::memcmp(got.data(), recs.data(), recs.size() * sizeof(float)), 0);
  // The same bytes read as a piece of fp16 state: its header says bf16.
  ManifestTable f16_state = t;
  f16_state.state_dtype = "fp16";
  r = PieceReader::open(dir_, f16_state, p, kTypedFormatVersion, 0xabc);
  ASSERT_TRUE(r.is_ok());
  expect_error(r.value().verify(), StatusCode::kDataLoss, {file, "header has state dtype 2 (expected 1)", "corrupt"});

  std::vector<float> bad(recs.begin(), recs.begin() + 12);
  bad[6 + 2 + 1] = 1.0f + 1.0f / 1024;  // record 1, state column 1: between two bf16 values
  w = PieceWriter::create(dir_, piece_file_name("item", 9, 1, 0), t, box, 1, kTypedFormatVersion);
  ASSERT_TRUE(w.is_ok());
  expect_error(w.value().append(bad.data(), 2), StatusCode::kInvalidArgument,
               {"table 'item', rows 0-10, columns 2-3", "record 1, state column 1 is 1.0009765", "(bits 3f802000)",
                "bf16 does not hold exactly"});
  bad[6 + 2 + 1] = 1.0f;
  bad[0] = 1e-3f;  // record 0, weight column 0
  expect_error(w.value().append(bad.data(), 2), StatusCode::kInvalidArgument, {"record 0, weight column 0 is 0.001"});
  // Format 1 holds whole tables only.
  expect_error(PieceWriter::create(dir_, "item.1.tbl", t, box, 0, kFormatVersion).status(),
               StatusCode::kInvalidArgument, {"a part of the table in format 1"});
}

// Format 3 records of an odd dim and 2-byte elements (records of an odd number of bytes or not a multiple of 4) read
// in chunks of any size, each widened in place at the end of a buffer of exactly its records (guards after it stay),
// bit for bit as written (NaN payloads, signed zeros, subnormals), again after verify() rewinds: bf16 rows of sgd (6
// bytes a record), bf16 rows with bf16 adam state, fp32 rows with bf16 state and bf16 rows with fp32 state, whole and
// a part of the columns.
TEST_F(PieceFiles, TypedRecordsOfAnOddDimReadInChunksOfAnySizeBitForBit) {
  struct Case {
    const char *optimizer, *dtype, *state_dtype;
    std::int32_t dim, state_dim;
    Box box;
  };
  const Case cases[] = {
      {"sgd", "bf16", "fp32", 3, 0, whole_box(11, 3)},       {"adam", "bf16", "bf16", 5, 10, whole_box(11, 5)},
      {"adam", "bf16", "bf16", 5, 10, column_box(11, 2, 3)}, {"adam", "fp32", "bf16", 5, 10, column_box(11, 0, 3)},
      {"adam", "bf16", "fp32", 5, 10, column_box(11, 3, 2)},
  };
  const std::vector<std::vector<std::int64_t>> chunkings = {{4, 7}, {1, 1, 9}, {11}, {3, 3, 3, 2}};
  const float guard = bits_float(0x7fbadbadu);
  for (const Case& c : cases) {
    ManifestTable t = table("item", 11, c.dim, c.optimizer, c.state_dim);
    t.dtype = c.dtype;
    t.state_dtype = c.state_dtype;
    SCOPED_TRACE(std::string(c.optimizer) + " " + c.dtype + " rows, " + c.state_dtype + " state, box " +
                 std::to_string(c.box.col_offset) + "+" + std::to_string(c.box.cols));
    // Records [weights | state], each element a value of its type.
    const auto width = static_cast<std::size_t>(record_floats(t, c.box));
    const auto cols = static_cast<std::size_t>(c.box.cols);
    const std::vector<float> weights = testing::values_of(parse_dtype(c.dtype).value(), 11 * cols, 5);
    const std::vector<float> state = testing::values_of(parse_dtype(c.state_dtype).value(), 11 * (width - cols), 6);
    std::vector<float> recs;
    for (std::size_t r = 0; r < 11; ++r) {
      recs.insert(recs.end(), weights.begin() + r * cols, weights.begin() + (r + 1) * cols);
      recs.insert(recs.end(), state.begin() + r * (width - cols), state.begin() + (r + 1) * (width - cols));
    }
    const PieceEntry p = write(t, piece_file_name("item", 8, 7, 0), c.box, 7, recs, kTypedFormatVersion);
    ASSERT_EQ(p.bytes, expected_file_bytes(t, c.box, kTypedFormatVersion));
    Result<PieceReader> r = PieceReader::open(dir_, t, p, kTypedFormatVersion, 7);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    ASSERT_EQ(static_cast<std::size_t>(r.value().width()), width);
    for (const std::vector<std::int64_t>& chunks : chunkings) {
      SCOPED_TRACE("chunks of " + ::testing::PrintToString(chunks));
      ASSERT_TRUE(r.value().verify().is_ok());
      std::vector<float> got;
      for (const std::int64_t n : chunks) {
        std::vector<float> buf(static_cast<std::size_t>(n) * width + 2, guard);
        ASSERT_TRUE(r.value().read_next(n, buf.data()).is_ok());
        EXPECT_EQ(float_bits(buf[buf.size() - 2]), float_bits(guard));
        EXPECT_EQ(float_bits(buf.back()), float_bits(guard));
        got.insert(got.end(), buf.begin(), buf.end() - 2);
      }
      EXPECT_TRUE(r.value().finish().is_ok());
      ASSERT_EQ(got.size(), recs.size());
      for (std::size_t i = 0; i < recs.size(); ++i)
        ASSERT_EQ(float_bits(got[i]), float_bits(recs[i])) << "record " << i / width << ", element " << i % width;
    }
  }
}

TEST_F(PieceFiles, AStoreTableFileReadsAsOneWholePiece) {
  // Written as Store::save wrote format 1 before PieceWriter wrote it: TableHeader, then the records; the manifest's
  // crc over both.
  ManifestTable t = table("user", 3, 2, "adagrad", 2);
  TableHeader h{};
  std::memcpy(h.magic, kTableMagic, sizeof kTableMagic);
  h.version = kFormatVersion;
  h.dtype = static_cast<std::uint32_t>(DType::kF32);
  h.rows = 3;
  h.dim = 2;
  h.state_dim = 2;
  h.optimizer = static_cast<std::uint32_t>(OptimizerKind::kAdagrad);
  const std::vector<float> recs = records(t, whole_box(3, 2));
  Result<AtomicFileWriter> w = AtomicFileWriter::create(dir_ + "/user.1.tbl");
  ASSERT_TRUE(w.is_ok());
  ASSERT_TRUE(w.value().append(&h, sizeof h).is_ok());
  ASSERT_TRUE(w.value().append(recs.data(), recs.size() * 4).is_ok());
  const PieceEntry p{"user.1.tbl", 0, whole_box(3, 2), w.value().bytes(), w.value().crc()};
  ASSERT_TRUE(w.value().commit().is_ok());
  Result<PieceReader> r = PieceReader::open(dir_, t, p, kFormatVersion, 0);
  ASSERT_TRUE(r.is_ok());
  ASSERT_TRUE(r.value().verify().is_ok()) << r.value().verify().to_string();
  std::vector<float> got(recs.size());
  ASSERT_TRUE(r.value().read_next(3, got.data()).is_ok());
  EXPECT_TRUE(r.value().finish().is_ok());
  EXPECT_EQ(got, recs);
  // PieceWriter writes format 1 byte for byte as that.
  Result<PieceWriter> pw = PieceWriter::create(dir_, "user.2.tbl", t, whole_box(3, 2), 0, kFormatVersion);
  ASSERT_TRUE(pw.is_ok()) << pw.status().to_string();
  ASSERT_TRUE(pw.value().append(recs.data(), 3).is_ok());
  EXPECT_EQ(pw.value().crc(), p.crc);
  ASSERT_TRUE(pw.value().commit().is_ok());
  const auto bytes = [&](const std::string& file) {
    std::ifstream in(dir_ + "/" + file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes("user.2.tbl"), bytes("user.1.tbl"));
}

TEST_F(PieceFiles, ATruncatedMismatchedOrMissingPieceIsRefusedNamingIt) {
  const ManifestTable t = table("user", 37, 8, "adagrad", 8);
  const Box box = row_box(37, 2, 4, 8);
  const std::string file = piece_file_name("user", 8, 7, 2);
  const PieceEntry p = write(t, file, box, 7);
  const std::string name = dir_ + "/" + file + " (table 'user', rows 2 + 4i (9 rows), columns 0-7)";

  // Another save's id; another box of the same size.
  Result<PieceReader> r = PieceReader::open(dir_, t, p, kWorldFormatVersion, 8);
  ASSERT_TRUE(r.is_ok());
  expect_error(r.value().verify(), StatusCode::kDataLoss,
               {name, "save id 0000000000000007 (expected 0000000000000008, the manifest's save)", "corrupt"});
  PieceEntry shifted = p;
  shifted.box = row_box(37, 1, 4, 8);
  r = PieceReader::open(dir_, t, shifted, kWorldFormatVersion, 7);
  ASSERT_TRUE(r.is_ok());
  expect_error(r.value().verify(), StatusCode::kDataLoss, {"header has first row 2 (expected 1)"});
  // A flipped byte: the checksum.
  flip_byte(file, 64 + 100);
  r = PieceReader::open(dir_, t, p, kWorldFormatVersion, 7);
  ASSERT_TRUE(r.is_ok());
  expect_error(r.value().verify(), StatusCode::kDataLoss,
               {name, "checksum", "does not match the manifest's " + hex32(p.crc), "corrupt"});
  expect_error(r.value().read_next(1, nullptr), StatusCode::kFailedPrecondition, {"before verify() succeeded"});
  // Truncated.
  fs::resize_file(dir_ + "/" + file, p.bytes - 4);
  r = PieceReader::open(dir_, t, p, kWorldFormatVersion, 7);
  ASSERT_TRUE(r.is_ok());
  expect_error(r.value().verify(), StatusCode::kDataLoss,
               {name, std::to_string(p.bytes - 4) + " bytes", "expected " + std::to_string(p.bytes), "truncated"});
  // Vanished: kNotFound, so that load reads the manifest again.
  fs::remove(dir_ + "/" + file);
  r = PieceReader::open(dir_, t, p, kWorldFormatVersion, 7);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().to_string();
}

TEST_F(PieceFiles, FinishCatchesAByteChangedBetweenVerifyAndRead) {
  const ManifestTable t = table("user", 37, 8, "sgd", 0);
  const Box box = whole_box(37, 8);
  const PieceEntry p = write(t, "user.8.0000000000000001.r0.tbl", box, 1);
  Result<PieceReader> r = PieceReader::open(dir_, t, p, kWorldFormatVersion, 1);
  ASSERT_TRUE(r.is_ok());
  ASSERT_TRUE(r.value().verify().is_ok());
  flip_byte(p.file, p.bytes - 1);  // in place: the reader's descriptor sees it
  std::vector<float> got(static_cast<std::size_t>(37 * 8));
  ASSERT_TRUE(r.value().read_next(37, got.data()).is_ok());
  expect_error(r.value().finish(), StatusCode::kDataLoss,
               {"user.8.0000000000000001.r0.tbl", "of the rows read does not match the manifest's " + hex32(p.crc),
                "changed since it was verified"});
}

TEST_F(PieceFiles, AWriterRefusesTooManyOrTooFewRecordsAndLeavesNoFile) {
  const ManifestTable t = table("user", 5, 2, "sgd", 0);
  const std::vector<float> recs(12, 1.0f);
  {
    Result<PieceWriter> w =
        PieceWriter::create(dir_, "user.1.0000000000000001.r0.tbl", t, whole_box(5, 2), 1, kWorldFormatVersion);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    ASSERT_TRUE(w.value().append(recs.data(), 4).is_ok());
    expect_error(w.value().append(recs.data(), 2), StatusCode::kFailedPrecondition,
                 {"user.1.0000000000000001.r0.tbl (table 'user', rows 0-4, columns 0-1)", "2 more records after 4",
                  "at most 5"});
    expect_error(w.value().commit(), StatusCode::kFailedPrecondition, {"commit after 4 records (expected 5)"});
  }
  EXPECT_TRUE(fs::is_empty(dir_));
  expect_error(PieceWriter::create(dir_, "a/b.tbl", t, whole_box(5, 2), 1, kWorldFormatVersion).status(),
               StatusCode::kInvalidArgument, {"not a file name inside"});
  expect_error(PieceWriter::create(dir_, "b.tbl", t, column_box(5, 1, 2), 1, kWorldFormatVersion).status(),
               StatusCode::kInvalidArgument, {"not a part of the table"});
  ManifestTable bad = t;
  bad.optimizer = "lion";
  expect_error(PieceWriter::create(dir_, "b.tbl", bad, whole_box(5, 2), 1, kWorldFormatVersion).status(),
               StatusCode::kInvalidArgument, {"table 'user'", "lion"});
}

// The checks parse_manifest makes hold for a table built by hand too: the writer refuses a part of the columns of a
// table whose state is one float a row (it cannot be split by column), the reader a path outside the directory and a
// record of negative width (state_dim -2 of dim 1: verify once threw std::length_error), before touching any file.
TEST_F(PieceFiles, WriterAndReaderRefuseWhatNoManifestHolds) {
  const ManifestTable ads = table("ads", 3, 4, "rowwise_adagrad", 1);
  expect_error(
      PieceWriter::create(dir_, "ads.8.0000000000000001.r0.tbl", ads, column_box(3, 0, 2), 1, kWorldFormatVersion)
          .status(),
      StatusCode::kInvalidArgument,
      {"table 'ads', rows 0-2, columns 0-1", "cannot be split by column", "expected all 4 columns"});
  EXPECT_TRUE(fs::is_empty(dir_));

  const ManifestTable user = table("user", 3, 2, "sgd", 0);
  PieceEntry outside{"../user.1.tbl", 0, whole_box(3, 2),
                     expected_file_bytes(user, whole_box(3, 2), kWorldFormatVersion), 0};
  Result<PieceReader> r = PieceReader::open(dir_, user, outside, kFormatVersion, 0);
  ASSERT_FALSE(r.is_ok());
  expect_error(r.status(), StatusCode::kInvalidArgument, {"'../user.1.tbl'", "not a file name inside"});

  const ManifestTable negative = table("neg", 3, 1, "adagrad", -2);
  const PieceEntry p{"neg.1.tbl", 0, whole_box(3, 1), 64, 0};
  std::ofstream(dir_ + "/neg.1.tbl") << std::string(64, 'x');
  r = PieceReader::open(dir_, negative, p, kFormatVersion, 0);
  ASSERT_FALSE(r.is_ok());
  expect_error(r.status(), StatusCode::kInvalidArgument, {"table 'neg'", "records of -1 floats"});
}

TEST_F(PieceFiles, RemoveStaleFilesKeepsTheNamedFilesAndWhatIsNotATableFile) {
  for (const char* name : {"MANIFEST", "LOCK", "notes.txt", "user.1.tbl", "user.2.aaaa.r0.tbl", "user.2.aaaa.r1.tbl",
                           "user.3.bbbb.r0.tbl", "user.3.bbbb.r0.tbl.tmp-12-1", "MANIFEST.tmp-12-2"})
    std::ofstream(dir_ + "/" + name) << "x";
  remove_stale_files(dir_, {"user.2.aaaa.r0.tbl", "user.2.aaaa.r1.tbl"});
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(dir_)) left.insert(e.path().filename().string());
  EXPECT_EQ(left, (std::set<std::string>{"MANIFEST", "LOCK", "notes.txt", "user.2.aaaa.r0.tbl", "user.2.aaaa.r1.tbl"}));
}

}  // namespace
}  // namespace strata::detail
