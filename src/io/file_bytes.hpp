// Whole-file and ranged reads shared by the array readers. Every failure is an
// IoError naming the file; sizes are checked before anything is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace stsa::io::files {

// Size of the regular file at `path` in bytes.
std::uint64_t file_size(const std::string& path);
// `count` bytes starting at `offset`; the range must lie inside the file.
std::vector<std::byte> read_range(const std::string& path, std::uint64_t offset, std::uint64_t count);
// The whole file.
std::vector<std::byte> read_whole(const std::string& path);

// Multiplies sizes with an overflow check (false when the product does not fit in 63 bits).
bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t& out);

}  // namespace stsa::io::files
