// A read-only array of T stored at any address. Megatron's .idx arrays start at byte 34 (then
// 34 + 4N, 34 + 12N), so they are not aligned for int32/int64: reading them through T* is
// undefined behaviour, and vectorised loops that assume alignment may fault. Each element is
// copied out with memcpy, which compiles to one unaligned load. Aligned arrays (a
// std::vector's data) convert implicitly, so functions taking an UnalignedArray take both.
#pragma once
#include <cstdint>
#include <cstring>

namespace loom::data {

template <class T>
class UnalignedArray {
 public:
  UnalignedArray() = default;
  UnalignedArray(const T* aligned) : bytes_(reinterpret_cast<const unsigned char*>(aligned)) {}  // NOLINT: implicit
  /// The array whose first element starts at `bytes` (any alignment).
  static UnalignedArray at(const void* bytes) {
    UnalignedArray a;
    a.bytes_ = static_cast<const unsigned char*>(bytes);
    return a;
  }
  T operator[](int64_t i) const {
    T value;
    std::memcpy(&value, bytes_ + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
    return value;
  }

 private:
  const unsigned char* bytes_ = nullptr;
};

}  // namespace loom::data
