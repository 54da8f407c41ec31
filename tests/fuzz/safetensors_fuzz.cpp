// Fuzzes the .safetensors parser: any byte string is parsed or rejected with stsa::IoError.
// Then a well-formed file built from the same bytes (1-3 tensors, keys in any order, sometimes
// __metadata__ with repeated keys, which are allowed): every tensor reads back as written, or,
// where one defect was planted (a tensor listed twice, __metadata__ listed twice, or a key
// repeated inside an entry), every read is refused with IoError.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "fuzz_finding.hpp"
#include "fuzz_reader.hpp"
#include "stsa/error.hpp"
#include "stsa/io.hpp"

namespace {

void require(bool ok, const char* what) { stsa::fuzz::require(ok, "safetensors_fuzz", what); }

struct Tally {
  long parsed = 0, built_read = 0, twice = 0, key_repeated = 0;
  ~Tally() {
    std::fprintf(stderr,
                 "safetensors_fuzz: %ld inputs parsed; %ld tensors of built files read back; planted defects "
                 "refused: %ld tensors listed twice, %ld keys repeated in an entry\n",
                 parsed, built_read, twice, key_repeated);
  }
} tally;

struct Entry {
  std::string name, json_name;  // json_name: as the header spells it (sometimes escaped)
  stsa::DType dtype;
  std::vector<std::int64_t> shape;
  std::size_t begin = 0, end = 0;
};

const char* dtype_name(stsa::DType dtype) {
  switch (dtype) {
    case stsa::DType::F32:
      return "F32";
    case stsa::DType::BF16:
      return "BF16";
    case stsa::DType::F16:
      return "F16";
    default:
      return "F8_E4M3";
  }
}

std::string shape_json(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// An entry's three keys in an order from `in`, one of them twice when `repeat` (the copy first or last).
std::string entry_json(stsa::fuzz::Reader& in, const Entry& e, bool repeat) {
  std::vector<std::string> keys = {
      std::string(R"("dtype": ")") + dtype_name(e.dtype) + "\"", "\"shape\": " + shape_json(e.shape),
      "\"data_offsets\": [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]"};
  if (repeat) {
    const std::size_t which = std::size_t(in.next(0, 2));
    const std::string copy = in.next(0, 1) ? keys[which]  // the same value again, or another one
                             : which == 0   ? std::string(R"("dtype": "F32")")
                             : which == 1   ? std::string(R"("shape": [1])")
                                            : std::string(R"("data_offsets": [0, 0])");
    keys.insert(keys.begin() + in.next(0, 3), copy);
  }
  for (std::size_t i = keys.size(); i > 1; --i)
    std::swap(keys[i - 1], keys[std::size_t(in.next(0, std::int64_t(i) - 1))]);
  std::string s = "{";
  for (std::size_t i = 0; i < keys.size(); ++i) s += (i ? ", " : "") + keys[i];
  return s + "}";
}

void check_built(stsa::fuzz::Reader& in) {
  constexpr const char* kNames[] = {"q", "weight", "k"};
  const std::size_t count = std::size_t(in.next(1, 3));
  std::vector<Entry> entries;
  std::size_t offset = 0;
  for (std::size_t i = 0; i < count; ++i) {
    Entry e;
    e.name = kNames[i];
    // "\u0071" is the JSON parser's "q": a repeat under another spelling.
    e.json_name = e.name == "q" && in.one_in(4) ? "\\u0071" : e.name;
    e.dtype = stsa::DType(in.next(0, 3));
    const std::size_t rank = std::size_t(in.next(0, 3));
    std::int64_t numel = 1;
    for (std::size_t d = 0; d < rank; ++d) {
      e.shape.push_back(in.next(0, 3));
      numel *= e.shape.back();
    }
    e.begin = offset;
    e.end = offset += std::size_t(numel) * stsa::element_size(e.dtype);
    entries.push_back(e);
  }
  // 0: none; 1: a tensor listed twice; 2: __metadata__ listed twice; 3: a key repeated in an entry.
  const std::int64_t plant = in.next(0, 5) > 3 ? 0 : in.next(0, 3);
  const std::size_t victim = std::size_t(in.next(0, std::int64_t(count) - 1));
  std::vector<std::string> members;
  for (std::size_t i = 0; i < count; ++i)
    members.push_back("\"" + entries[i].json_name + "\": " + entry_json(in, entries[i], plant == 3 && i == victim));
  const bool metadata = plant == 2 || in.one_in(3);
  if (metadata) {
    // Repeats inside __metadata__ (free-form) are no defect.
    members.push_back(in.next(0, 1) ? R"("__metadata__": {"a": "1", "a": "2"})" : R"("__metadata__": {})");
    if (plant == 2) members.push_back(R"("__metadata__": {"b": "3"})");
  }
  if (plant == 1) {  // the same name again, with its own (valid) entry
    Entry again = entries[victim];
    again.json_name = again.name == "q" && in.next(0, 1) ? "\\u0071" : again.name;
    members.push_back("\"" + again.json_name + "\": " + entry_json(in, again, false));
  }
  for (std::size_t i = members.size(); i > 1; --i)
    std::swap(members[i - 1], members[std::size_t(in.next(0, std::int64_t(i) - 1))]);
  std::string header = "{";
  for (std::size_t i = 0; i < members.size(); ++i) header += (i ? ", " : "") + members[i];
  header += "}";
  header.append(std::size_t(in.next(0, 7)), ' ');
  std::vector<std::byte> file(8 + header.size() + offset);
  const std::uint64_t length = header.size();
  for (int i = 0; i < 8; ++i) file[std::size_t(i)] = std::byte(length >> (8 * i));
  std::memcpy(file.data() + 8, header.data(), header.size());
  for (std::size_t i = 0; i < offset; ++i) file[8 + header.size() + i] = std::byte(in.next(0, 255));
  const std::byte* data = file.data() + 8 + header.size();
  for (const Entry& e : entries) {
    try {
      const auto array = stsa::io::parse_safetensors(file.data(), file.size(), e.name, "built");
      require(plant == 0, "a header with a planted repeat was read");
      require(array.dtype == e.dtype && array.shape == e.shape, "a tensor read back with another dtype or shape");
      require(array.data.size() == e.end - e.begin && std::equal(array.data.begin(), array.data.end(), data + e.begin),
              "a tensor read back with other bytes");
      ++tally.built_read;
    } catch (const stsa::IoError& error) {
      if (plant == 0) {
        std::fprintf(stderr, "safetensors_fuzz: %s\nheader: %s\n", error.what(), header.c_str());
        require(false, "a well-formed file was refused");
      }
    }
  }
  if (plant == 1 || plant == 2) ++tally.twice;
  if (plant == 3) ++tally.key_repeated;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  for (const char* name : {"q", "weight"}) {
    try {
      const auto array = stsa::io::parse_safetensors(reinterpret_cast<const std::byte*>(data), size, name, "fuzz");
      if (std::size_t(array.numel()) * stsa::element_size(array.dtype) != array.data.size()) __builtin_trap();
      ++tally.parsed;
    } catch (const stsa::IoError&) {
    }
  }
  stsa::fuzz::Reader in(data, size, /*random_tail=*/true);
  check_built(in);
  return 0;
}
