// Helpers shared by the op tests: tolerance checks that report the worst element.
#pragma once

#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <sstream>
#include <string>

namespace loom::test {

/// |a - b| <= atol + rtol |b| elementwise (b is the reference), compared in float64.
inline bool close_to(const at::Tensor& a, const at::Tensor& b, double rtol, double atol,
                     std::string* why) {
  if (a.sizes() != b.sizes()) {
    std::ostringstream os;
    os << "shape " << a.sizes() << " vs reference " << b.sizes();
    *why = os.str();
    return false;
  }
  const at::Tensor x = a.detach().to(at::kCPU, at::kDouble);
  const at::Tensor y = b.detach().to(at::kCPU, at::kDouble);
  const at::Tensor excess = (x - y).abs() - (atol + rtol * y.abs());
  if (x.numel() == 0) return true;
  const double worst = excess.max().item<double>();
  const bool finite = at::isfinite(x).all().item<bool>();
  std::ostringstream os;
  os << "max |a-b| = " << (x - y).abs().max().item<double>() << ", worst excess over tolerance "
     << worst << " (rtol " << rtol << ", atol " << atol << "), finite " << finite;
  *why = os.str();
  return finite && worst <= 0.0;
}

}  // namespace loom::test

#define LOOM_CHECK_CLOSE(a, b, rtol, atol)                        \
  do {                                                            \
    std::string _why;                                             \
    const bool _ok = loom::test::close_to((a), (b), rtol, atol, &_why); \
    INFO(#a " vs " #b ": " << _why);                              \
    CHECK(_ok);                                                   \
  } while (0)
