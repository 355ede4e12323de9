// CRC-32C (Castagnoli: reflected polynomial 0x82F63B78, initial value and
// final xor 0xFFFFFFFF; RFC 3720 §12.1), and the masked form TFRecord files
// store (TensorFlow's crc32c::Mask: rotate right by 15, add 0xa282ead8), so
// that a CRC over data that itself contains CRCs does not degenerate.
// Table-driven, portable, dependency-free.
#pragma once

#include <cstdint>
#include <string_view>

namespace kappa::base {

// CRC-32C of `data`, continuing from the CRC of what came before (0: none),
// so Crc32c(b, Crc32c(a)) == Crc32c(a + b).
uint32_t Crc32c(std::string_view data, uint32_t crc = 0);

inline uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace kappa::base
