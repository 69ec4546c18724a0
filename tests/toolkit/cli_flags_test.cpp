// The integer and list flags of the bench programs (toolkit/cli_flags.hpp): the value as written or
// a refusal, never a saturated, wrapped or octal value, never a dropped item.

#include "toolkit/cli_flags.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

namespace strata::bench {
namespace {

constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();
constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();

TEST(CliFlags, IntegersAreTakenAsWritten) {
  EXPECT_EQ(parse_integer("0", 0, 10).value(), 0);
  EXPECT_EQ(parse_integer("010", 0, 10).value(), 10);  // decimal, not octal
  EXPECT_EQ(parse_integer("-5", -5, 5).value(), -5);
  EXPECT_EQ(parse_integer("9223372036854775807", kMin, kMax).value(), kMax);
  EXPECT_EQ(parse_integer("-9223372036854775808", kMin, kMax).value(), kMin);
}

TEST(CliFlags, AnythingElseIsRefusedWithTheTextAndTheRange) {
  for (const std::string text : {"", "-", "+1", " 1", "1 ", "1e3", "0x10", "1.0", "abc", "--1", "9223372036854775808",
                                 "-9223372036854775809", "99999999999999999999", "999999999999999999999999999999"}) {
    const auto v = parse_integer(text, kMin, kMax);
    ASSERT_FALSE(v.is_ok()) << "'" << text << "'";
    EXPECT_EQ(v.status().message(), "'" + text + "' is not an integer in [-9223372036854775808, 9223372036854775807]");
  }
  EXPECT_EQ(parse_integer("11", 1, 10).status().message(), "'11' is not an integer in [1, 10]");
  EXPECT_EQ(parse_integer("0", 1, 10).status().message(), "'0' is not an integer in [1, 10]");
  // A long text is quoted by its start.
  EXPECT_LT(parse_integer(std::string(10000, '9'), 0, 1).status().message().size(), 120u);
}

TEST(CliFlags, UnsignedIntegersReachTwoToTheSixtyFourMinusOne) {
  constexpr std::uint64_t kU64Max = std::numeric_limits<std::uint64_t>::max();
  EXPECT_EQ(parse_unsigned("18446744073709551615", kU64Max).value(), kU64Max);
  EXPECT_EQ(parse_unsigned("0", kU64Max).value(), 0u);
  for (const std::string text : {"18446744073709551616", "-1", "", "1x"})
    EXPECT_EQ(parse_unsigned(text, kU64Max).status().message(),
              "'" + text + "' is not an integer in [0, 18446744073709551615]");
}

TEST(CliFlags, ListsKeepEveryItemEmptyOnesToo) {
  using V = std::vector<std::string>;
  EXPECT_EQ(split_list(""), V{});
  EXPECT_EQ(split_list("a"), V{"a"});
  EXPECT_EQ(split_list(","), (V{"", ""}));
  EXPECT_EQ(split_list("0.5,"), (V{"0.5", ""}));
  EXPECT_EQ(split_list("a,,b"), (V{"a", "", "b"}));
}

TEST(CliFlags, IntegerListsRefuseAnEmptyItem) {
  EXPECT_EQ(parse_integer_list("64,128", 1, 1024).value(), (std::vector<std::int64_t>{64, 128}));
  EXPECT_EQ(parse_integer_list("64,,128", 1, 1024).status().message(),
            "'64,,128': item 2 '' is not an integer in [1, 1024] (an empty item is refused, not dropped)");
  EXPECT_EQ(parse_integer_list("64,2048", 1, 1024).status().message(),
            "'64,2048': item 2 '2048' is not an integer in [1, 1024]");
  EXPECT_EQ(parse_integer_list("", 1, 1024).status().message(),
            "'': no items (expected a comma-separated list of integers in [1, 1024])");
}

// The validator refuses as parse_integer does and hands CLI11 the canonical text.
TEST(CliFlags, TheCli11TransformReadsTheValueAsWritten) {
  for (const auto& [text, expected, ok] : std::vector<std::tuple<std::string, std::int64_t, bool>>{
           {"010", 10, true}, {"99999999999999999999", 0, false}, {"-1", 0, false}, {"0x10", 0, false}}) {
    CLI::App app;
    std::int64_t v = -7;
    app.add_option("--n", v)->transform(integer_in(0, kMax));
    const char* argv[] = {"app", "--n", text.c_str()};
    bool parsed = true;
    try {
      app.parse(3, const_cast<char**>(argv));
    } catch (const CLI::ParseError& e) {
      parsed = false;
      EXPECT_NE(std::string(e.what()).find("'" + text + "' is not an integer in [0, "), std::string::npos) << e.what();
    }
    EXPECT_EQ(parsed, ok) << text;
    if (ok) {
      EXPECT_EQ(v, expected) << text;
    }
  }
}

}  // namespace
}  // namespace strata::bench
