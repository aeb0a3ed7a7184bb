// CRC-32C against published vectors: RFC 3720 (iSCSI) appendix B.4 and the check value of the
// CRC catalogue ("123456789" -> 0xE3069283); the mask against TensorFlow's definition applied
// by hand.
#include <catch2/catch.hpp>

#include <string>

#include "runlog/crc32c.h"

using loom::runlog::crc32c;
using loom::runlog::masked_crc32c;

TEST_CASE("crc32c matches the RFC 3720 and catalogue vectors", "[runlog]") {
  CHECK(crc32c("") == 0x00000000u);
  CHECK(crc32c("123456789") == 0xE3069283u);
  CHECK(crc32c(std::string(32, '\0')) == 0x8A9136AAu);
  CHECK(crc32c(std::string(32, '\xFF')) == 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  CHECK(crc32c(ascending) == 0x46DD794Eu);
  CHECK(crc32c(descending) == 0x113FDB5Cu);
}

TEST_CASE("masked crc32c rotates right by 15 and adds TensorFlow's constant", "[runlog]") {
  const uint32_t c = 0xE3069283u;
  CHECK(masked_crc32c("123456789") == ((c >> 15) | (c << 17)) + 0xa282ead8u);
  CHECK(masked_crc32c("") == 0xa282ead8u);
}
