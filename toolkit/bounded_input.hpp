#pragma once
// Bounded reading of the files and JSON documents the benchmark programs take from their users
// (`--workload`, `--profile`): a file is read only when it is a regular file of at most a fixed
// size, a JSON document is refused when it nests deeper than a fixed depth (checked without
// recursion, before any value is built), and an error message quotes a bounded prefix of a user
// value instead of the whole value. Each limit is far above what a valid input needs.

#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.hpp"
#include "core/text.hpp"

namespace strata::bench {

/// Largest input file read (4 MiB): a workload listing 65,536 tables is about 3 MiB, a hardware
/// profile about 3 KiB.
inline constexpr std::uint64_t kMaxInputFileBytes = std::uint64_t{4} << 20;

/// Deepest nesting of arrays and objects accepted in an input JSON document (a workload or a
/// profile nests 3 levels).
inline constexpr int kMaxJsonDepth = 32;

/// Characters of a user value quoted in an error message.
inline constexpr std::size_t kMaxQuotedChars = 64;

/// Reads the whole file at `path`, which must be a regular file of at most `max_bytes` bytes.
/// `what` names the file in messages ("workload file"). Refuses, without reading it, a path that
/// is not a regular file (a device such as /dev/zero, a FIFO, a directory), and reads at most
/// `max_bytes` + 1 bytes of a regular file (one that grows past the limit while read is refused
/// too). Errors: kNotFound "cannot open <what> '<path>': No such file or directory",
/// kInvalidArgument naming the path and the file type or its size and the limit, kIoError naming
/// the path and the OS error. Thread-safe.
Result<std::string> read_input_file(const std::string& path, const std::string& what,
                                    std::uint64_t max_bytes = kMaxInputFileBytes);

/// Parses `text` as one JSON document whose arrays and objects nest at most `max_depth` levels
/// (the top-level value is level 1). The depth is checked by a non-recursive SAX pass before the
/// document is built, so any input is refused or parsed with bounded stack and no exception
/// escapes. Errors (kInvalidArgument) start with `who`: "<who>: invalid JSON: <parser message,
/// at most 200 characters>" or "<who>: JSON nested deeper than <max_depth> levels (expected at
/// most <max_depth> levels of arrays and objects)", or "<who>: key 'tables[0].name' is given
/// twice (expected each key at most once in an object)", naming the key by its path (the parser
/// would keep the last value silently; the store's JSON inputs refuse the same, in the same words:
/// core/json_keys.hpp).
Result<nlohmann::json> parse_json_limited(const std::string& text, const std::string& who,
                                          int max_depth = kMaxJsonDepth);

/// At most `max_chars` characters of `v` as compact JSON, for an error message: the whole value
/// when it is that short, else a prefix ending in "..." (cut at a UTF-8 character boundary).
/// Walks only as much of `v` as it shows and nests at most 8 levels ("[...]" beyond), so the
/// cost does not depend on the size or depth of `v`. Never throws for invalid UTF-8 (replaced).
std::string json_excerpt(const nlohmann::json& v, std::size_t max_chars = kMaxQuotedChars);

/// At most `max_chars` bytes of `s`, ending in "..." when cut (at a UTF-8 character boundary):
/// core's strata::quote_prefix with the tools' default length.
inline std::string quote_prefix(const std::string& s, std::size_t max_chars = kMaxQuotedChars) {
  return strata::quote_prefix(s, max_chars);
}

}  // namespace strata::bench
