#pragma once
// Byte sizes on the command line: "80GB", "80G", "1.5TB", "512MiB", "64 KiB", "1e9" (bytes).

#include <string>

#include "core/status.hpp"

namespace strata::tune {

/// Parses a size: a non-negative finite number, optionally followed by a unit, case-insensitive:
/// B, KB/K, MB/M, GB/G, TB/T (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024). Errors name
/// `flag` and the text: "--hbm-budget '80 XB': expected a size like 80GB, 512MiB or 1e9".
Result<double> parse_byte_size(const std::string& text, const std::string& flag);

}  // namespace strata::tune
