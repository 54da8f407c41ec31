// NumPy .npy files (format versions 1.0, 2.0 and 3.0).
//
// Layout: the magic "\x93NUMPY", two version bytes, the header length
// (little-endian uint16 in 1.0, uint32 in 2.0/3.0), then a Python dict literal
// {'descr': ..., 'fortran_order': ..., 'shape': (...)} padded with spaces and a
// newline, then the raw C-order data. The header is untrusted: it is parsed by
// a small literal parser that checks every index, and all sizes are multiplied
// with overflow checks before they are compared with the bytes present.
#include <cstring>
#include <optional>
#include <span>
#include <string_view>

#include "io/file_bytes.hpp"
#include "stsa/error.hpp"
#include "stsa/io.hpp"

namespace stsa::io {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicSize = 6;

struct NpyHeader {
  std::optional<std::string> descr;
  std::optional<bool> fortran_order;
  std::optional<std::vector<std::int64_t>> shape;
};

// Parser of the restricted Python literal that numpy writes. Throws IoError with the file name.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& name) : text_(text), name_(name) {}

  NpyHeader parse() {
    NpyHeader header;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') { ++pos_; break; }
      const std::string key = parse_string();
      expect(':');
      if (key == "descr") {
        skip_space();
        if (peek() == '[') fail("structured dtypes (a list descr) are not supported");
        header.descr = parse_string();
      } else if (key == "fortran_order") {
        header.fortran_order = parse_bool();
      } else if (key == "shape") {
        header.shape = parse_tuple();
      } else {
        fail("unknown header key '" + key + "'");
      }
      skip_space();
      if (peek() == ',') { ++pos_; continue; }
      expect('}');
      break;
    }
    // Only padding may follow the dict.
    for (; pos_ < text_.size(); ++pos_)
      if (text_[pos_] != ' ' && text_[pos_] != '\n' && text_[pos_] != '\t' && text_[pos_] != '\r' && text_[pos_] != '\0')
        fail("unexpected text after the header dict");
    return header;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw IoError(stsa::detail::concat(name_, ": malformed .npy header: ", what, " (at header byte ", pos_, ")"));
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c || pos_ >= text_.size()) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string parse_string() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"') fail("expected a quoted string");
    const std::size_t begin = ++pos_;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\') fail("escapes in strings are not supported");
      ++pos_;
    }
    if (pos_ >= text_.size()) fail("unterminated string");
    const std::string value(text_.substr(begin, pos_ - begin));
    ++pos_;
    return value;
  }
  bool parse_bool() {
    skip_space();
    if (text_.substr(pos_, 4) == "True") { pos_ += 4; return true; }
    if (text_.substr(pos_, 5) == "False") { pos_ += 5; return false; }
    fail("expected True or False");
  }
  std::int64_t parse_int() {
    skip_space();
    if (peek() < '0' || peek() > '9') fail("expected a non-negative integer dimension");
    std::int64_t value = 0;
    while (peek() >= '0' && peek() <= '9' && pos_ < text_.size()) {
      if (__builtin_mul_overflow(value, 10, &value) || __builtin_add_overflow(value, peek() - '0', &value))
        fail("dimension overflows 64 bits");
      ++pos_;
    }
    if (peek() == 'L') ++pos_;  // Python 2 long suffix
    return value;
  }
  std::vector<std::int64_t> parse_tuple() {
    expect('(');
    std::vector<std::int64_t> dims;
    while (true) {
      skip_space();
      if (peek() == ')') { ++pos_; break; }
      if (dims.size() >= 32) fail("more than 32 dimensions");
      dims.push_back(parse_int());
      skip_space();
      if (peek() == ',') { ++pos_; continue; }
      expect(')');
      break;
    }
    return dims;
  }

  std::string_view text_;
  const std::string& name_;
  std::size_t pos_ = 0;
};

DType dtype_of_descr(const std::string& descr, const std::string& name) {
  if (descr == "<f4") return DType::F32;
  if (descr == "<f2") return DType::F16;
  if (descr == "<V2" || descr == "|V2") return DType::BF16;  // ml_dtypes bfloat16 saved by np.save
  if (descr == "<V1" || descr == "|V1") return DType::F8E4M3;  // ml_dtypes float8_e4m3fn saved by np.save
  throw IoError(stsa::detail::concat(name, ": unsupported dtype '", descr,
                                     "' (supported: '<f4' fp32, '<f2' fp16, '<V2'/'|V2' bfloat16, '<V1'/'|V1' ",
                                     "float8_e4m3fn)"));
}

std::string_view descr_of(DType t) {
  switch (t) {
    case DType::F32: return "<f4";
    case DType::F16: return "<f2";
    case DType::BF16: return "<V2";
    case DType::F8E4M3: return "<V1";
  }
  return "";
}

std::uint32_t read_le(const std::byte* p, int bytes) {
  std::uint32_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | std::uint32_t(p[i]);
  return v;
}

}  // namespace

HostArray parse_npy(const std::byte* bytes, std::size_t size, const std::string& name) {
  STSA_CHECK(bytes != nullptr || size == 0, IoError, name, ": no data");
  STSA_CHECK(size >= kMagicSize + 2 && std::memcmp(bytes, kMagic, kMagicSize) == 0, IoError, name,
             ": not a .npy file (missing the \\x93NUMPY magic)");
  const int major = int(bytes[kMagicSize]);
  const int minor = int(bytes[kMagicSize + 1]);
  STSA_CHECK(major >= 1 && major <= 3 && minor == 0, IoError, name, ": unsupported .npy format version ", major, ".",
             minor, " (supported: 1.0, 2.0, 3.0)");
  const std::size_t length_bytes = major == 1 ? 2 : 4;
  const std::size_t header_begin = kMagicSize + 2 + length_bytes;
  STSA_CHECK(size >= header_begin, IoError, name, ": truncated (file ends inside the header length)");
  const std::uint64_t header_len = read_le(bytes + kMagicSize + 2, int(length_bytes));
  STSA_CHECK(header_len <= size - header_begin, IoError, name, ": truncated (header says ", header_len,
             " header bytes but only ", size - header_begin, " follow)");
  const std::string_view text(reinterpret_cast<const char*>(bytes + header_begin), std::size_t(header_len));
  const NpyHeader header = HeaderParser(text, name).parse();
  STSA_CHECK(header.descr && header.fortran_order && header.shape, IoError, name,
             ": malformed .npy header: it needs 'descr', 'fortran_order' and 'shape'");
  STSA_CHECK(!*header.fortran_order, IoError, name, ": Fortran-order arrays are not supported (save in C order)");

  HostArray array;
  array.dtype = dtype_of_descr(*header.descr, name);
  array.shape = *header.shape;
  std::int64_t bytes_needed = std::int64_t(element_size(array.dtype));
  for (std::int64_t d : array.shape)
    STSA_CHECK(files::checked_mul(bytes_needed, d, bytes_needed), IoError, name, ": shape overflows 64-bit sizes");
  const std::uint64_t data_begin = header_begin + header_len;
  const std::uint64_t present = size - data_begin;
  STSA_CHECK(present == std::uint64_t(bytes_needed), IoError, name, ": data size mismatch (the shape needs ",
             bytes_needed, " bytes, the file has ", present, ")");
  array.data.assign(bytes + data_begin, bytes + size);
  return array;
}

HostArray read_npy(const std::string& path) {
  const std::vector<std::byte> bytes = files::read_whole(path);
  return parse_npy(bytes.data(), bytes.size(), path);
}

void write_npy(const std::string& path, const HostArray& array, bool overwrite) {
  // What read_npy refuses is not written either (a cast DType became "'descr': ''").
  STSA_CHECK(!descr_of(array.dtype).empty(), InvalidArgument, path, ": dtype ", int(array.dtype),
             " is not a DType value");
  STSA_CHECK(array.shape.size() <= 32, InvalidArgument, path, ": ", array.shape.size(),
             " dimensions; .npy files hold at most 32");
  std::int64_t bytes_needed = std::int64_t(element_size(array.dtype));
  for (std::int64_t d : array.shape) {
    STSA_CHECK(d >= 0, InvalidArgument, path, ": negative dimension ", d);
    STSA_CHECK(files::checked_mul(bytes_needed, d, bytes_needed), InvalidArgument, path,
               ": shape overflows 64-bit sizes");
  }
  STSA_CHECK(std::uint64_t(bytes_needed) == array.data.size(), InvalidArgument, path, ": the shape needs ",
             bytes_needed, " bytes of data but the array holds ", array.data.size());

  std::string dict = stsa::detail::concat("{'descr': '", descr_of(array.dtype), "', 'fortran_order': False, 'shape': (");
  // Python's tuple repr: (), (3,), (3, 4).
  for (std::size_t i = 0; i < array.shape.size(); ++i) dict += stsa::detail::concat(i ? ", " : "", array.shape[i]);
  dict += array.shape.size() == 1 ? ",), }" : "), }";
  // Pad with spaces so the data starts at a multiple of 64 bytes, newline last.
  const bool v1 = dict.size() + 1 + kMagicSize + 4 < 65535;
  const std::size_t prefix = kMagicSize + 2 + (v1 ? 2 : 4);
  const std::size_t total = (prefix + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prefix - dict.size() - 1, ' ');
  dict += '\n';

  std::string head(kMagic, kMagicSize);
  head += char(v1 ? 1 : 2);
  head += char(0);
  const std::uint32_t len = std::uint32_t(dict.size());
  for (std::size_t i = 0; i < (v1 ? 2u : 4u); ++i) head += char((len >> (8 * i)) & 0xff);
  head += dict;
  files::write_file(path, {std::as_bytes(std::span(head)), std::span(array.data)}, overwrite,
                    "refusing to overwrite");
}

}  // namespace stsa::io
