// CRC-32C (Castagnoli; reflected polynomial 0x82F63B78), the checksum of TFRecord files, and
// TensorFlow's "masked" form of it (docs/design/tensorboard.md, "Record framing"). Debian 12 has
// no packaged CRC-32C library, so this is the usual 256-entry table, tested against RFC 3720's
// vectors (tests/runlog/test_crc32c.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace loom::runlog {

/// CRC-32C of `bytes` (initial value ~0, final complement: the iSCSI definition).
uint32_t crc32c(std::string_view bytes);

/// TFRecord's mask: rotate right by 15 bits and add 0xa282ead8, so that a CRC of data that
/// itself holds CRCs is not trivially related to them.
uint32_t masked_crc32c(std::string_view bytes);

}  // namespace loom::runlog
