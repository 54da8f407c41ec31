#include "io/file_bytes.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include "stsa/error.hpp"
#include "stsa/tensor.hpp"

namespace stsa::io::files {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

std::uint64_t file_size(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  STSA_CHECK(!ec && std::filesystem::exists(status), IoError, path, ": cannot open (no such file)");
  STSA_CHECK(std::filesystem::is_regular_file(status), IoError, path, ": not a regular file");
  const auto size = std::filesystem::file_size(path, ec);
  STSA_CHECK(!ec, IoError, path, ": cannot read its size (", ec.message(), ")");
  return size;
}

std::vector<std::byte> read_range(const std::string& path, std::uint64_t offset, std::uint64_t count) {
  const std::uint64_t size = file_size(path);
  STSA_CHECK(offset <= size && count <= size - offset, IoError, path, ": truncated (needs bytes [", offset, ", ",
             offset + count, ") but the file has ", size, ")");
  check_host_allocation(count, path.c_str());
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  STSA_CHECK(file != nullptr, IoError, path, ": cannot open (", std::strerror(errno), ")");
  std::vector<std::byte> bytes(count);
  if (count == 0) return bytes;
  STSA_CHECK(offset <= std::uint64_t(INT64_MAX) && fseeko(file.get(), off_t(offset), SEEK_SET) == 0, IoError, path,
             ": cannot seek to byte ", offset);
  const std::size_t got = std::fread(bytes.data(), 1, count, file.get());
  STSA_CHECK(got == count, IoError, path, ": short read (", got, " of ", count, " bytes)");
  return bytes;
}

std::vector<std::byte> read_whole(const std::string& path) { return read_range(path, 0, file_size(path)); }

bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t& out) {
  return !__builtin_mul_overflow(a, b, &out) && out >= 0;
}

}  // namespace stsa::io::files
