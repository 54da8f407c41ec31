#include "io/file_bytes.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include <sys/stat.h>
#include <unistd.h>

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

void write_file(const std::string& path, std::initializer_list<std::span<const std::byte>> parts, bool overwrite,
                std::string_view refusal) {
  // "x" opens exclusively, so an existing file is never clobbered even in a race.
  std::FILE* file = std::fopen(path.c_str(), overwrite ? "wb" : "wbx");
  if (file == nullptr) {
    STSA_CHECK(overwrite || errno != EEXIST, IoError, path, ": already exists (", refusal, ")");
    throw IoError(stsa::detail::concat(path, ": cannot create (", std::strerror(errno), ")"));
  }
  struct stat opened {};
  const bool regular = ::fstat(::fileno(file), &opened) == 0 && S_ISREG(opened.st_mode);
  bool ok = true;
  int error = 0;  // the first failure's errno
  const auto note = [&](bool step_ok) {
    if (!step_ok && ok) error = errno;
    ok = ok && step_ok;
  };
  for (const auto& part : parts)
    if (ok && !part.empty()) note(std::fwrite(part.data(), 1, part.size(), file) == part.size());
  note(std::fflush(file) == 0);
  note(std::fclose(file) == 0);  // the last buffered bytes may only fail here
  if (ok) return;
  // What is there now is a fragment. The file was created by this call, or (overwrite) its old
  // content went when the open truncated it: either way nothing of the user's is left to keep,
  // and a fragment would pass for output (or block the next run as "exists"). Only a regular
  // file, still the one we opened, is removed: never a device such as /dev/full.
  struct stat now {};
  if (regular && ::stat(path.c_str(), &now) == 0 && now.st_dev == opened.st_dev && now.st_ino == opened.st_ino)
    ::unlink(path.c_str());
  throw IoError(stsa::detail::concat(path, ": write failed (", error != 0 ? std::strerror(error) : "I/O error", ")"));
}

bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t& out) {
  return !__builtin_mul_overflow(a, b, &out) && out >= 0;
}

}  // namespace stsa::io::files
