#pragma once
// Small helpers the strata-tune subcommands share: error exit, input and output files, progress.

#include <string>

#include "core/status.hpp"
#include "store/model/cost_model.hpp"
#include "tune/tune_input.hpp"

namespace strata::tune {

/// Prints "strata-tune: <message>" on stderr and returns `code`.
int fail(const std::string& message, int code = 2);

/// Parses --ranks: an integer in [1, max]; else "--ranks 'TEXT' (expected an integer in [1, MAX])".
Result<int> parse_ranks(const std::string& text, int max);

/// Reads a profile file within the bench input limits (a regular file of at most 4 MiB, bounded
/// JSON nesting) and parses it.
Result<HardwareProfile> load_profile_file(const std::string& path);

/// Checks, before any work, that `path` can be written (a regular file or nothing there, in a
/// writable directory); `flag` names it in the message.
Status check_output(const std::string& path, const std::string& flag);

/// Writes `text` to `path` atomically (a temporary file renamed into place).
Status write_output(const std::string& path, const std::string& text);

/// A ProgressFn printing "strata-tune: <line>" on stderr when `enabled` and stderr is a terminal;
/// an empty function otherwise.
ProgressFn progress_printer(bool enabled);

}  // namespace strata::tune
