#pragma once
// CRC-32C (Castagnoli), the checksum of checkpoint files. Uses the SSE4.2 crc32 instruction when
// the CPU has it (three interleaved streams, ~3x the single-stream speed), else slice-by-8 tables.

#include <cstddef>
#include <cstdint>

namespace strata::detail {

/// CRC-32C of `n` bytes at `data` (host memory; may be nullptr when n == 0), continuing from `crc`,
/// the value returned for the preceding bytes (0 to start). Incremental:
/// crc32c(b, nb, crc32c(a, na)) == crc32c(a + b, na + nb). crc32c("123456789", 9) == 0xE3069283.
/// Picks the hardware or the table implementation once, at first call. Thread-safe, no allocation.
std::uint32_t crc32c(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept;

/// The portable slice-by-8 implementation (same contract as crc32c). Exposed for tests and benches.
std::uint32_t crc32c_sw(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept;

/// Whether this CPU has the SSE4.2 crc32 instruction (always false off x86-64).
bool crc32c_hw_available() noexcept;

/// The SSE4.2 implementation (same contract as crc32c). Only call when crc32c_hw_available();
/// elsewhere it aborts. Exposed for tests and benches.
std::uint32_t crc32c_hw(const void* data, std::size_t n, std::uint32_t crc = 0) noexcept;

}  // namespace strata::detail
