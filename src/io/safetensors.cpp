// .safetensors files: an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, ...,
// "__metadata__": {...}}, then the data block the offsets index into.
//
// The header is untrusted: its length is checked against the file, its JSON
// nesting depth is bounded before parsing (the JSON parser recurses), and every
// offset and size is checked against the data block with overflow-safe arithmetic.
#include <algorithm>
#include <cstring>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>

#include "io/file_bytes.hpp"
#include "stsa/error.hpp"
#include "stsa/io.hpp"

namespace stsa::io {
namespace {

constexpr std::uint64_t kMaxHeaderBytes = 100u << 20;  // the format's own limit
constexpr int kMaxJsonDepth = 16;                      // real headers nest 3 deep

struct Entry {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0, end = 0;
};

struct Index {
  std::vector<std::pair<std::string, Entry>> tensors;
};

std::uint64_t read_u64_le(const std::byte* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | std::uint64_t(p[i]);
  return v;
}

// Deepest bracket nesting outside strings; stops counting once above the limit.
int json_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > kMaxJsonDepth) break;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

std::uint64_t header_length(const std::byte* first8, std::uint64_t file_size, const std::string& name) {
  STSA_CHECK(file_size >= 8, IoError, name, ": truncated (", file_size,
             " bytes; a .safetensors file starts with an 8-byte header length)");
  const std::uint64_t len = read_u64_le(first8);
  STSA_CHECK(len <= file_size - 8, IoError, name, ": truncated (header length ", len, " but only ", file_size - 8,
             " bytes follow)");
  STSA_CHECK(len <= kMaxHeaderBytes, IoError, name, ": header length ", len, " exceeds the format's limit of ",
             kMaxHeaderBytes, " bytes");
  return len;
}

Entry parse_entry(const std::string& tensor, const nlohmann::json& value, std::uint64_t data_size,
                  const std::string& name) {
  auto bad = [&](const std::string& what) {
    return IoError(stsa::detail::concat(name, ": malformed header entry for tensor '", tensor, "': ", what));
  };
  if (!value.is_object()) throw bad("not an object");
  Entry e;
  const auto dtype = value.find("dtype");
  if (dtype == value.end() || !dtype->is_string()) throw bad("'dtype' missing or not a string");
  e.dtype = dtype->get<std::string>();
  const auto shape = value.find("shape");
  if (shape == value.end() || !shape->is_array()) throw bad("'shape' missing or not a list");
  if (shape->size() > 32) throw bad("more than 32 dimensions");
  for (const auto& d : *shape) {
    if (!d.is_number_unsigned()) throw bad("shape entries must be non-negative integers");
    const std::uint64_t u = d.get<std::uint64_t>();
    if (u > std::uint64_t(INT64_MAX)) throw bad("dimension overflows 64 bits");
    e.shape.push_back(std::int64_t(u));
  }
  const auto offsets = value.find("data_offsets");
  if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned())
    throw bad("'data_offsets' must be two non-negative integers");
  e.begin = (*offsets)[0].get<std::uint64_t>();
  e.end = (*offsets)[1].get<std::uint64_t>();
  if (e.begin > e.end || e.end > data_size)
    throw bad(stsa::detail::concat("data_offsets [", e.begin, ", ", e.end, "] lie outside the data block of ", data_size,
                             " bytes"));
  return e;
}

Index parse_index(const std::byte* header, std::uint64_t header_len, std::uint64_t data_size, const std::string& name) {
  const std::string_view text(reinterpret_cast<const char*>(header), std::size_t(header_len));
  STSA_CHECK(json_depth(text) <= kMaxJsonDepth, IoError, name, ": malformed header (JSON nested deeper than ",
             kMaxJsonDepth, ")");
  // The JSON parser keeps the last of repeated keys: a tensor listed twice (or an entry with two
  // 'data_offsets') would read whichever came last, silently. Both are refused; repeats inside
  // __metadata__ (free-form strings, read by nothing here) are left alone.
  std::vector<std::set<std::string>> open_objects;  // the keys seen in each object being parsed
  std::string top_key, duplicate;
  const auto watch_keys = [&](int, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) open_objects.emplace_back();
    if (event == Event::object_end && !open_objects.empty()) open_objects.pop_back();
    if (event == Event::key && !open_objects.empty()) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (open_objects.size() == 1) top_key = key;
      const bool in_metadata = open_objects.size() > 1 && top_key == "__metadata__";
      if (!open_objects.back().insert(key).second && !in_metadata && duplicate.empty())
        duplicate = open_objects.size() == 1 ? stsa::detail::concat("tensor '", key, "' is listed twice")
                                             : stsa::detail::concat("key '", key, "' repeats in the entry of '",
                                                                    top_key, "'");
    }
    return true;
  };
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text.begin(), text.end(), watch_keys, /*allow_exceptions=*/false);
  } catch (const nlohmann::json::exception& e) {
    throw IoError(stsa::detail::concat(name, ": malformed header JSON (", e.what(), ")"));
  }
  STSA_CHECK(!json.is_discarded(), IoError, name, ": malformed header (not valid JSON)");
  STSA_CHECK(duplicate.empty(), IoError, name, ": malformed header (", duplicate, ")");
  STSA_CHECK(json.is_object(), IoError, name, ": malformed header (the JSON is not an object)");
  Index index;
  for (const auto& [key, value] : json.items()) {
    if (key == "__metadata__") continue;
    index.tensors.emplace_back(key, parse_entry(key, value, data_size, name));
  }
  return index;
}

DType dtype_of(const std::string& dtype, const std::string& tensor, const std::string& name) {
  if (dtype == "F32") return DType::F32;
  if (dtype == "BF16") return DType::BF16;
  if (dtype == "F16") return DType::F16;
  if (dtype == "F8_E4M3") return DType::F8E4M3;
  throw IoError(stsa::detail::concat(name, ": tensor '", tensor, "' has unsupported dtype ", dtype,
                               " (supported: F32, BF16, F16, F8_E4M3)"));
}

const Entry& find_tensor(const Index& index, const std::string& tensor, const std::string& name) {
  STSA_CHECK(!tensor.empty(), IoError, name, ": a tensor name is required to read a .safetensors file");
  for (const auto& [key, entry] : index.tensors)
    if (key == tensor) return entry;
  std::string available;
  for (std::size_t i = 0; i < index.tensors.size() && i < 10; ++i)
    available += (i ? ", " : "") + index.tensors[i].first;
  if (index.tensors.size() > 10) available += ", ...";
  throw IoError(stsa::detail::concat(name, ": no tensor named '", tensor, "' (available: ",
                               available.empty() ? "none" : available, ")"));
}

// Checks the entry's dtype and size and returns an array with the shape filled in (no data yet).
HostArray describe(const Entry& entry, const std::string& tensor, const std::string& name) {
  HostArray array;
  array.dtype = dtype_of(entry.dtype, tensor, name);
  array.shape = entry.shape;
  std::int64_t bytes = std::int64_t(element_size(array.dtype));
  for (std::int64_t d : entry.shape)
    STSA_CHECK(files::checked_mul(bytes, d, bytes), IoError, name, ": tensor '", tensor,
               "' shape overflows 64-bit sizes");
  STSA_CHECK(std::uint64_t(bytes) == entry.end - entry.begin, IoError, name, ": tensor '", tensor, "' needs ", bytes,
             " bytes for its shape and dtype but its data_offsets span ", entry.end - entry.begin);
  return array;
}

}  // namespace

HostArray parse_safetensors(const std::byte* bytes, std::size_t size, const std::string& tensor,
                            const std::string& name) {
  STSA_CHECK(bytes != nullptr || size == 0, IoError, name, ": no data");
  const std::uint64_t header_len = header_length(bytes, size, name);
  const std::uint64_t data_begin = 8 + header_len;
  const Index index = parse_index(bytes + 8, header_len, size - data_begin, name);
  const Entry& entry = find_tensor(index, tensor, name);
  HostArray array = describe(entry, tensor, name);
  array.data.assign(bytes + data_begin + entry.begin, bytes + data_begin + entry.end);
  return array;
}

std::vector<std::string> safetensors_names(const std::string& path) {
  const std::uint64_t size = files::file_size(path);
  const std::vector<std::byte> first8 = files::read_range(path, 0, std::min<std::uint64_t>(size, 8));
  const std::uint64_t header_len = header_length(first8.data(), size, path);
  const std::vector<std::byte> header = files::read_range(path, 8, header_len);
  const Index index = parse_index(header.data(), header_len, size - 8 - header_len, path);
  std::vector<std::string> names;
  for (const auto& [key, entry] : index.tensors) names.push_back(key);
  return names;
}

HostArray read_safetensors(const std::string& path, const std::string& tensor) {
  const std::uint64_t size = files::file_size(path);
  const std::vector<std::byte> first8 = files::read_range(path, 0, std::min<std::uint64_t>(size, 8));
  const std::uint64_t header_len = header_length(first8.data(), size, path);
  const std::vector<std::byte> header = files::read_range(path, 8, header_len);
  const std::uint64_t data_begin = 8 + header_len;
  const Index index = parse_index(header.data(), header_len, size - data_begin, path);
  const Entry& entry = find_tensor(index, tensor, path);
  HostArray array = describe(entry, tensor, path);
  array.data = files::read_range(path, data_begin + entry.begin, entry.end - entry.begin);
  return array;
}

}  // namespace stsa::io
