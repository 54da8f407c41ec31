// Exception hierarchy of stsa. Every public function validates its input and
// throws one of these with a message that names the argument and the valid
// range; nothing in the library aborts or returns a silent wrong answer.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace stsa {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A value or shape the caller gave is outside what the call accepts.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// Valid input that this backend or build cannot handle (head dim, dtype, no GPU).
class Unsupported : public Error {
 public:
  using Error::Error;
};

// The request would need more memory than is sensible or available, or a size overflows 64 bits.
class ResourceError : public Error {
 public:
  using Error::Error;
};

// A file could not be read or written, or its content is malformed.
class IoError : public Error {
 public:
  using Error::Error;
};

// Sequence-parallel communication failed or ranks disagree.
class DistError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace stsa

// Throws ExceptionType with the streamed message when cond is false.
#define STSA_CHECK(cond, ExceptionType, ...)                                  \
  do {                                                                        \
    if (!(cond)) throw ExceptionType(::stsa::detail::concat(__VA_ARGS__));    \
  } while (0)
