// Whole-file and ranged reads shared by the array readers, and the writers' file output. Every failure is an
// IoError naming the file; sizes are checked before anything is allocated.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace stsa::io::files {

// Size of the regular file at `path` in bytes.
std::uint64_t file_size(const std::string& path);
// `count` bytes starting at `offset`; the range must lie inside the file.
std::vector<std::byte> read_range(const std::string& path, std::uint64_t offset, std::uint64_t count);
// The whole file.
std::vector<std::byte> read_whole(const std::string& path);

// Writes `parts`, in order, into a new file at `path`, or (overwrite) in place of what is there:
// a regular file, or the one a link names (the link stays), is replaced whole by a new one written
// beside it, with its permissions, so that a failed write leaves it as it was; anything else (a
// device, a dangling link) is written into. An existing file without overwrite: IoError
// "<path>: already exists (<refusal>)".
// A failed write (disk full, file size limit) removes the regular file it made (see write_file)
// and throws one line naming the path and the system's reason.
void write_file(const std::string& path, std::initializer_list<std::span<const std::byte>> parts, bool overwrite,
                std::string_view refusal);

// Multiplies sizes with an overflow check (false when the product does not fit in 63 bits).
bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t& out);

}  // namespace stsa::io::files
