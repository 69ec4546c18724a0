#pragma once
// Text for error messages: a user's string cut to a length without splitting a UTF-8 character (a
// message cut inside one is not valid UTF-8, and Python cannot decode it).

#include <cstddef>
#include <string>

namespace strata {

/// The length of the longest prefix of `s` of at most `n` bytes that does not end inside a UTF-8
/// sequence (s.size() when n >= s.size()).
std::size_t utf8_cut(const std::string& s, std::size_t n) noexcept;

/// `s` when it has at most `max_bytes` bytes, else its first max_bytes - 3 bytes or fewer (cut at a
/// UTF-8 character boundary) followed by "...".
std::string quote_prefix(const std::string& s, std::size_t max_bytes);

/// The shortest text that reads back as `d`; the double of a float prints as that float ("0.01",
/// not "0.009999999776482582"; -0.0 as "-0"). For messages that quote a value.
std::string number_text(double d);

}  // namespace strata
