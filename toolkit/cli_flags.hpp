#pragma once
// The command lines of the bench programs (strata-bench, strata-tune): integer and list flags
// checked as written, byte sizes, and one way to end on a usage error.
//
// An integer flag is a plain decimal integer in a stated range: digits with an optional leading
// '-', nothing else (no '+', spaces, exponent, hex or octal), never saturated or wrapped: CLI11
// alone would read "99999999999999999999" as INT64_MAX and "010" as 8. A list flag is
// comma-separated items, every one of them given: "0.5,", ",0.5" and "64,,128" hold an empty item,
// which is refused rather than dropped. A usage error is one line on stderr and exit code 2 (not
// CLI11's own codes, 100 and up), so a program running another (strata-tune validate runs
// strata-bench) can relay the reason as it is.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/status.hpp"

namespace strata::bench {

/// Parses `text` as a decimal integer in [lo, hi] (see the header). Errors (kInvalidArgument):
/// "'TEXT' is not an integer in [LO, HI]", TEXT cut to kMaxQuotedChars characters.
Result<std::int64_t> parse_integer(const std::string& text, std::int64_t lo, std::int64_t hi);

/// Parses `text` as a decimal integer in [0, hi] of 64 bits unsigned (a seed). Errors as
/// parse_integer's.
Result<std::uint64_t> parse_unsigned(const std::string& text, std::uint64_t hi);

/// The items of a comma-separated list, empty ones included: "" has none, "," two empty ones,
/// "0.5," the items "0.5" and "". Callers refuse what they cannot use; nothing is dropped here.
std::vector<std::string> split_list(const std::string& text);

/// Parses a comma-separated list of decimal integers in [lo, hi], at least one, in the order
/// given. Errors (kInvalidArgument), for the caller to prefix with the flag: "'': no items
/// (expected a comma-separated list of integers in [LO, HI])", "'LIST': item N 'ITEM' is not an
/// integer in [LO, HI]" (N from 1; an empty item too).
Result<std::vector<std::int64_t>> parse_integer_list(const std::string& text, std::int64_t lo, std::int64_t hi);

/// A CLI11 transform for an integer option: the text must pass parse_integer(lo, hi), and is
/// rewritten as the canonical decimal (so CLI11's own conversion reads the same value). CLI11
/// reports a failure as "--FLAG: 'TEXT' is not an integer in [LO, HI]"; --help shows `desc`, or
/// "INT in [LO, HI]" when empty. Use with Option::transform.
CLI::Validator integer_in(std::int64_t lo, std::int64_t hi, const std::string& desc = "");

/// Parses the command line with `app`. Returns nullopt when it parsed; else the exit code: 0
/// after --help (printed on stdout), 2 after a usage error, printed on stderr as the one line
/// "<program>: <what was wrong> (run with --help for the usage)".
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv, const std::string& program);

/// Parses a byte size ("80GB", "80G", "1.5TB", "512MiB", "64 KiB", "1e9"): a non-negative finite
/// number, optionally followed by a unit, case-insensitive: B, KB/K, MB/M, GB/G, TB/T (powers of
/// 1000) or KiB, MiB, GiB, TiB (powers of 1024). Errors name `flag` and the text: "--hbm-budget
/// '80 XB': expected a size like 80GB, 512MiB or 1e9".
Result<double> parse_byte_size(const std::string& text, const std::string& flag);

}  // namespace strata::bench
