#include "io/file_bytes.hpp"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include <fcntl.h>
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

namespace {

// Writes every part to `fd`, then closes it (the last bytes may only fail there): 0, or the
// errno of the first failure.
int write_and_close(int fd, std::initializer_list<std::span<const std::byte>> parts) {
  int error = 0;
  for (const auto& part : parts) {
    const std::byte* at = part.data();
    std::size_t left = part.size();
    while (left > 0 && error == 0) {
      const ssize_t wrote = ::write(fd, at, left);
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote <= 0) {
        error = wrote == 0 ? EIO : errno;
        break;
      }
      at += wrote;
      left -= std::size_t(wrote);
    }
  }
  if (::close(fd) != 0 && error == 0) error = errno;
  return error;
}

std::string write_failure(const std::string& path, int error, std::string_view note = {}) {
  return stsa::detail::concat(path, ": write failed (", error != 0 ? std::strerror(error) : "I/O error", note, ")");
}

// Overwriting a regular file: the bytes go to a new file beside it, with its permissions, which
// then replaces it in one rename. A failed write removes the new file and leaves the old one as it
// was. false, with nothing written, where no file can be made beside it (a directory the caller
// cannot write into): the caller then writes into the old file itself.
bool replace_regular_file(const std::string& path, mode_t mode,
                          std::initializer_list<std::span<const std::byte>> parts) {
  std::string temporary = path + ".stsa-XXXXXX";
  const int fd = ::mkstemp(temporary.data());
  if (fd < 0) return false;
  int error = ::fchmod(fd, mode & 07777) == 0 ? 0 : errno;
  if (error == 0) {
    error = write_and_close(fd, parts);
  } else {
    ::close(fd);
  }
  if (error == 0 && std::rename(temporary.c_str(), path.c_str()) != 0) error = errno;
  if (error == 0) return true;
  ::unlink(temporary.c_str());
  throw IoError(write_failure(path, error, "; the old file is as it was"));
}

}  // namespace

void write_file(const std::string& given, std::initializer_list<std::span<const std::byte>> parts, bool overwrite,
                std::string_view refusal) {
  // Overwriting through a symbolic link replaces the file it names, whole or not at all, and
  // keeps the link: resolved first, or the open below truncated that file through the link and
  // a failed write then removed the link and left the fragment in the file.
  std::string path = given;
  struct stat link {};
  if (overwrite && ::lstat(given.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) {
    const std::unique_ptr<char, decltype(&std::free)> resolved(::realpath(given.c_str(), nullptr), &std::free);
    if (resolved) path = resolved.get();  // (a dangling link: created through, as before)
  }
  // (A file the caller may not write is left to the open below to refuse, as before.)
  struct stat existing {};
  if (overwrite && ::lstat(path.c_str(), &existing) == 0 && S_ISREG(existing.st_mode) &&
      ::access(path.c_str(), W_OK) == 0 && replace_regular_file(path, existing.st_mode, parts))
    return;
  // O_EXCL opens exclusively, so an existing file is never clobbered even in a race.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (overwrite ? O_TRUNC : O_EXCL), 0666);
  if (fd < 0) {
    STSA_CHECK(overwrite || errno != EEXIST, IoError, path, ": already exists (", refusal, ")");
    throw IoError(stsa::detail::concat(path, ": cannot create (", std::strerror(errno), ")"));
  }
  struct stat opened {};
  const bool regular = ::fstat(fd, &opened) == 0 && S_ISREG(opened.st_mode);
  const int error = write_and_close(fd, parts);
  if (error == 0) return;
  // What is there now is a fragment. The file was created by this call, or (overwrite, where no
  // file could be made beside it) its old content went when the open truncated it: either way
  // nothing of the user's is left to keep, and a fragment would pass for output (or block the
  // next run as "exists"). Only a regular file, still the one we opened, is removed: never a
  // device such as /dev/full.
  struct stat now {};
  if (regular && ::lstat(path.c_str(), &now) == 0 && now.st_dev == opened.st_dev && now.st_ino == opened.st_ino)
    ::unlink(path.c_str());
  throw IoError(write_failure(path, error));
}

bool checked_mul(std::int64_t a, std::int64_t b, std::int64_t& out) {
  return !__builtin_mul_overflow(a, b, &out) && out >= 0;
}

}  // namespace stsa::io::files
