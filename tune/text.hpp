#pragma once
// Numbers as strata-tune prints them (console, HTML, messages): one format everywhere.

#include <string>

namespace strata::tune {

/// Bytes in the largest decimal unit that keeps the value >= 1, 3 significant digits: "512 B",
/// "6.67 MB", "80 GB".
std::string bytes_text(double bytes);

/// A fraction as a percentage with one decimal: "93.1%"; "-" for a negative value (not computed).
std::string percent_text(double fraction);

/// Seconds as milliseconds, 3 significant digits: "0.0144 ms", "3.1 ms".
std::string ms_text(double seconds);

}  // namespace strata::tune
