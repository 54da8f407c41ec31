// Turns a fuzzer's bytes into bounded integers, two bytes at a time. Past the
// end a draw reads as its lower bound (short inputs stay small cases), or, with
// random_tail, comes from a generator seeded by the input's bytes, so that
// choices drawn late still vary while libFuzzer's inputs are short.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace stsa::fuzz {

class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t size, bool random_tail = false)
      : data_(data), size_(size), random_tail_(random_tail) {
    for (std::size_t i = 0; i < size; ++i) state_ = (state_ ^ data[i]) * 0x100000001b3ULL;  // FNV-1a
  }

  std::int64_t next(std::int64_t lo, std::int64_t hi) {  // inclusive range, hi - lo < 65536
    std::uint16_t raw = 0;
    if (size_ == 0 && random_tail_) {
      raw = std::uint16_t(splitmix() >> 48);
    } else {
      const std::size_t take = std::min<std::size_t>(2, size_);
      std::memcpy(&raw, data_, take);
      data_ += take;
      size_ -= take;
    }
    return lo + std::int64_t(std::uint32_t(raw) % std::uint32_t(hi - lo + 1));
  }
  bool one_in(std::int64_t n) { return next(0, n - 1) == n - 1; }

 private:
  std::uint64_t splitmix() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

  const std::uint8_t* data_;
  std::size_t size_;
  bool random_tail_;
  std::uint64_t state_ = 0xcbf29ce484222325ULL;
};

}  // namespace stsa::fuzz
