// .npy and .safetensors: round trips, header variants, and every kind of
// malformed or truncated input giving IoError that names the file.
#include <gtest/gtest.h>

#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "stsa/error.hpp"
#include "stsa/io.hpp"

namespace stsa::io {
namespace {

namespace fs = std::filesystem;

class IoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("stsa_io_test_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

std::vector<std::byte> bytes_of(const std::string& s) {
  std::vector<std::byte> out(s.size());
  std::memcpy(out.data(), s.data(), s.size());
  return out;
}

void write_file(const std::string& path, const std::vector<std::byte>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

HostArray counting(DType dtype, std::vector<std::int64_t> shape) {
  HostArray a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.data.resize(std::size_t(a.numel()) * element_size(dtype));
  for (std::size_t i = 0; i < a.data.size(); ++i) a.data[i] = std::byte(i * 7 + 3);
  return a;
}

// A .npy file by hand: version, dict text, data bytes.
std::vector<std::byte> npy(int major, const std::string& dict, std::size_t data_bytes) {
  std::string s = "\x93NUMPY";
  s += char(major);
  s += char(0);
  const std::uint32_t len = std::uint32_t(dict.size());
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) s += char((len >> (8 * i)) & 0xff);
  s += dict;
  s.append(data_bytes, '\x01');
  return bytes_of(s);
}

void expect_io_error(const std::vector<std::byte>& bytes, const std::string& needle) {
  try {
    parse_npy(bytes.data(), bytes.size(), "case.npy");
    ADD_FAILURE() << "no error, expected one mentioning '" << needle << "'";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("case.npy"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST_F(IoTest, NpyRoundTripsEveryDtypeAndShape) {
  for (DType dtype : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3})
    for (const auto& shape : std::vector<std::vector<std::int64_t>>{{}, {0}, {3}, {2, 3, 4}, {1, 5, 2, 8}}) {
      const HostArray a = counting(dtype, shape);
      const std::string p = path("a.npy");
      write_npy(p, a, /*overwrite=*/true);
      const HostArray b = read_npy(p);
      EXPECT_EQ(b.dtype, dtype);
      EXPECT_EQ(b.shape, shape);
      EXPECT_EQ(b.data, a.data);
      EXPECT_EQ(fs::file_size(p) % 64, a.data.size() % 64);  // header padded to 64 bytes
      EXPECT_EQ(read_array(p).data, a.data);
    }
}

TEST_F(IoTest, NpyWriterRefusesToOverwrite) {
  const std::string p = path("keep.npy");
  write_npy(p, counting(DType::F32, {2}));
  EXPECT_THROW(write_npy(p, counting(DType::F32, {3})), IoError);
  EXPECT_EQ(read_npy(p).shape, std::vector<std::int64_t>{2});
  write_npy(p, counting(DType::F32, {3}), true);
  EXPECT_EQ(read_npy(p).shape, std::vector<std::int64_t>{3});
  HostArray inconsistent = counting(DType::F32, {4});
  inconsistent.data.pop_back();
  EXPECT_THROW(write_npy(path("bad.npy"), inconsistent), InvalidArgument);
  EXPECT_THROW(write_npy(path("no/such/dir.npy"), counting(DType::F32, {1})), IoError);
  // What read_npy refuses is not written: a cast DType (written as descr ''), 33 dimensions.
  HostArray cast = counting(DType::F32, {2});
  cast.dtype = DType(9);
  EXPECT_THROW(write_npy(path("cast.npy"), cast), InvalidArgument);
  EXPECT_THROW(write_npy(path("deep.npy"), counting(DType::F32, std::vector<std::int64_t>(33, 1))), InvalidArgument);
  EXPECT_FALSE(fs::exists(path("cast.npy")) || fs::exists(path("deep.npy")));
}

// Past a file size limit (as under `ulimit -f`, SIGXFSZ ignored as the CLI does) the write
// fails: one line naming the file, and no fragment is left for a later run to take for
// output. A file the call created is removed; one it was to overwrite is as it was (the new
// bytes went to a file beside it, removed too).
TEST_F(IoTest, NpyWriterLeavesNoFragmentWhenTheWriteFails) {
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 1000;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string created = path("created.npy"), replaced = path("replaced.npy");
  const std::string target = path("target.npy"), link = path("link.npy");
  std::ofstream(replaced) << "old";
  std::ofstream(target) << "old";
  fs::create_symlink(target, link);
  const auto failure = [](const std::string& p, bool overwrite) -> std::string {
    try {
      write_npy(p, counting(DType::F32, {1000}), overwrite);  // 4 KB of data
    } catch (const IoError& e) {
      return e.what();
    }
    return "no error";
  };
  // Through a link, the file it names is what gets replaced: the link stays (it was removed,
  // and the file it named truncated to the fragment).
  const std::string messages[] = {failure(created, false), failure(replaced, true), failure(link, true)};
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  for (const std::string& m : messages) {
    EXPECT_NE(m.find("write failed"), std::string::npos) << m;
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(created));
  for (const std::string& p : {replaced, target}) {
    std::string kept;
    std::getline(std::ifstream(p), kept);
    EXPECT_EQ(kept, "old") << p;
  }
  EXPECT_TRUE(fs::is_symlink(link));
  const auto entries = std::distance(fs::directory_iterator(fs::path(replaced).parent_path()), fs::directory_iterator());
  EXPECT_EQ(entries, 3) << "a temporary file was left beside an old one";
}

// Overwriting replaces a regular file whole and keeps its permissions; a link is written
// through (the file it names gets the bytes, the link stays); a file the caller may not
// write is refused as before, and stays.
TEST_F(IoTest, NpyOverwriteReplacesTheFileAndKeepsItsPermissions) {
  const std::string p = path("mode.npy");
  write_npy(p, counting(DType::F32, {2}));
  fs::permissions(p, fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);
  write_npy(p, counting(DType::F32, {5}), /*overwrite=*/true);
  EXPECT_EQ(read_npy(p).shape, std::vector<std::int64_t>{5});
  EXPECT_EQ(fs::status(p).permissions(), fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read);

  const std::string link = path("link.npy");
  fs::create_symlink(p, link);
  write_npy(link, counting(DType::F32, {7}), /*overwrite=*/true);
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(read_npy(p).shape, std::vector<std::int64_t>{7});

  if (::geteuid() != 0) {  // root may write anything
    fs::permissions(p, fs::perms::owner_read);
    EXPECT_THROW(write_npy(p, counting(DType::F32, {9}), /*overwrite=*/true), IoError);
    fs::permissions(p, fs::perms::owner_read | fs::perms::owner_write);
    EXPECT_EQ(read_npy(p).shape, std::vector<std::int64_t>{7});
  }
}

// A device is written into, never removed: /dev/full refuses the bytes and stays.
TEST_F(IoTest, NpyWriterReportsAFullDeviceAndLeavesIt) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  try {
    write_npy("/dev/full", counting(DType::F32, {4}), /*overwrite=*/true);
    ADD_FAILURE() << "writing into /dev/full succeeded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/dev/full: write failed"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::is_character_file("/dev/full"));
}

TEST(Npy, AcceptsVersionsTwoAndThreeAndNumpyVariants) {
  for (int major : {1, 2, 3}) {
    const auto b = npy(major, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }       \n", 24);
    const HostArray a = parse_npy(b.data(), b.size(), "v.npy");
    EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  }
  // Key order, double quotes, no trailing comma, Python 2 longs, bfloat16 as '|V2'.
  auto b = npy(1, "{\"shape\": (4L,), \"fortran_order\": False, \"descr\": \"|V2\"}\n", 8);
  HostArray a = parse_npy(b.data(), b.size(), "v.npy");
  EXPECT_EQ(a.dtype, DType::BF16);
  EXPECT_EQ(a.shape, std::vector<std::int64_t>{4});
  b = npy(1, "{'descr': '<f2', 'fortran_order': False, 'shape': ()}\n", 2);
  EXPECT_EQ(parse_npy(b.data(), b.size()).numel(), 1);
}

TEST(Npy, RejectsMalformedHeaders) {
  const std::string ok_tail = "'fortran_order': False, 'shape': (2,), }\n";
  expect_io_error(bytes_of("not numpy at all"), "magic");
  expect_io_error(npy(4, "{}", 0), "version");
  expect_io_error(npy(1, "{'descr': '>f4', " + ok_tail, 8), "unsupported dtype");
  expect_io_error(npy(1, "{'descr': '<i8', " + ok_tail, 16), "unsupported dtype");
  expect_io_error(npy(1, "{'descr': [('a', '<f4')], " + ok_tail, 8), "structured");
  expect_io_error(npy(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }\n", 8), "Fortran");
  expect_io_error(npy(1, "{'descr': '<f4', 'shape': (2,), }\n", 8), "needs");
  expect_io_error(npy(1, "{'descr': '<f4', 'color': 1, " + ok_tail, 8), "unknown header key");
  expect_io_error(npy(1, "{'descr': '<f4', " + ok_tail, 9), "data size mismatch");
  expect_io_error(npy(1, "{'descr': '<f4', " + ok_tail, 7), "data size mismatch");
  expect_io_error(npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }\n", 8), "non-negative");
  expect_io_error(npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }\n", 8),
                  "overflows");
  expect_io_error(npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }\n", 8),
                  "overflows");
  expect_io_error(npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } junk\n", 8), "after the header");
  expect_io_error(npy(1, "{'descr': '<f4\\x', " + ok_tail, 8), "escape");
  expect_io_error(npy(1, "{'descr': '<f4", 0), "unterminated");
  expect_io_error(npy(1, "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }\n", 8), "True or False");
  std::string deep = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
  for (int i = 0; i < 40; ++i) deep += "1, ";
  expect_io_error(npy(1, deep + "), }\n", 4), "32 dimensions");
}

TEST(Npy, EveryTruncationIsAnErrorNotACrash) {
  const auto full = npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }          \n", 24);
  for (std::size_t size = 0; size < full.size(); ++size)
    EXPECT_THROW(parse_npy(full.data(), size, "cut.npy"), IoError) << "size " << size;
  // A header length pointing past the end.
  auto lying = full;
  lying[8] = std::byte(0xff);
  lying[9] = std::byte(0xff);
  EXPECT_THROW(parse_npy(lying.data(), lying.size(), "lie.npy"), IoError);
  EXPECT_THROW(parse_npy(nullptr, 0, "empty.npy"), IoError);
}

// A .safetensors file by hand.
std::vector<std::byte> safetensors(const std::string& header, const std::vector<std::byte>& data) {
  std::vector<std::byte> out(8);
  const std::uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out[std::size_t(i)] = std::byte((len >> (8 * i)) & 0xff);
  const auto h = bytes_of(header);
  out.insert(out.end(), h.begin(), h.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

const std::string kHeader =
    R"({"__metadata__": {"format": "pt"}, "q": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},)"
    R"( "k": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},)"
    R"( "v": {"dtype": "F16", "shape": [1, 2], "data_offsets": [32, 36]},)"
    R"( "idx": {"dtype": "I64", "shape": [1], "data_offsets": [36, 44]}})";

std::vector<std::byte> sample_data() {
  std::vector<std::byte> d(44);
  for (std::size_t i = 0; i < d.size(); ++i) d[i] = std::byte(i);
  return d;
}

void expect_st_error(const std::string& header, const std::vector<std::byte>& data, const std::string& tensor,
                     const std::string& needle) {
  const auto file = safetensors(header, data);
  try {
    parse_safetensors(file.data(), file.size(), tensor, "case.safetensors");
    ADD_FAILURE() << "no error, expected one mentioning '" << needle << "'";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("case.safetensors"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST_F(IoTest, SafetensorsReadsEachTensorFromMemoryAndFile) {
  const auto file = safetensors(kHeader, sample_data());
  const HostArray q = parse_safetensors(file.data(), file.size(), "q");
  EXPECT_EQ(q.dtype, DType::F32);
  EXPECT_EQ(q.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(q.data.size(), 24u);
  EXPECT_EQ(q.data[5], std::byte(5));
  const HostArray k = parse_safetensors(file.data(), file.size(), "k");
  EXPECT_EQ(k.dtype, DType::BF16);
  EXPECT_EQ(k.data[0], std::byte(24));
  const std::string p = path("qkv.safetensors");
  write_file(p, file);
  const HostArray v = read_safetensors(p, "v");
  EXPECT_EQ(v.dtype, DType::F16);
  EXPECT_EQ(v.data, (std::vector<std::byte>{std::byte(32), std::byte(33), std::byte(34), std::byte(35)}));
  EXPECT_EQ(read_array(p, "q").data, q.data);
  const auto names = safetensors_names(p);
  EXPECT_EQ(names.size(), 4u);
  EXPECT_NE(std::find(names.begin(), names.end(), "idx"), names.end());
  EXPECT_THROW(read_array(p), IoError);                // a name is required
  EXPECT_THROW(read_array(path("x.npy"), "q"), InvalidArgument);  // names only apply to safetensors
  EXPECT_THROW(read_array(path("missing.npy")), IoError);
  EXPECT_THROW(read_array(dir_.string()), IoError);  // a directory
}

// fp8 as safetensors names it (F8_E4M3, one byte each); its other fp8 type is refused by name.
TEST(Safetensors, ReadsFp8E4M3AndRefusesE5M2) {
  const std::vector<std::byte> data{std::byte(0x38), std::byte(0x7e), std::byte(0x80), std::byte(0x01),
                                    std::byte(0xff), std::byte(0x40)};
  const auto file = safetensors(R"({"q": {"dtype": "F8_E4M3", "shape": [2, 3], "data_offsets": [0, 6]},)"
                                R"( "k": {"dtype": "F8_E5M2", "shape": [6], "data_offsets": [0, 6]}})",
                                data);
  const HostArray q = parse_safetensors(file.data(), file.size(), "q");
  EXPECT_EQ(q.dtype, DType::F8E4M3);
  EXPECT_EQ(q.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(q.data, data);
  EXPECT_EQ(f8e4m3_to_float(std::uint8_t(q.data[0])), 1.0f);
  EXPECT_EQ(f8e4m3_to_float(std::uint8_t(q.data[1])), 448.0f);
  try {
    parse_safetensors(file.data(), file.size(), "k", "fp8.safetensors");
    ADD_FAILURE() << "F8_E5M2 accepted";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported dtype F8_E5M2"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, RejectsMalformedFiles) {
  const auto data = sample_data();
  expect_st_error(kHeader, data, "nope", "no tensor named 'nope'");
  expect_st_error(kHeader, data, "idx", "unsupported dtype I64");
  expect_st_error(kHeader, data, "", "tensor name is required");
  expect_st_error(R"({"q": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 28]}})", data, "q", "needs 24 bytes");
  expect_st_error(R"({"q": {"dtype": "F32", "shape": [2, 3], "data_offsets": [30, 54]}})", data, "q", "outside");
  expect_st_error(R"({"q": {"dtype": "F32", "shape": [2, 3], "data_offsets": [8, 4]}})", data, "q", "outside");
  expect_st_error(R"({"q": {"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 24]}})", data, "q", "non-negative");
  expect_st_error(R"({"q": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 24]}})", data, "q", "non-negative");
  expect_st_error(R"({"q": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 24]}})", data, "q",
                  "overflows");
  expect_st_error(R"({"q": {"dtype": "F32", "data_offsets": [0, 24]}})", data, "q", "'shape'");
  expect_st_error(R"({"q": {"dtype": 3, "shape": [6], "data_offsets": [0, 24]}})", data, "q", "'dtype'");
  expect_st_error(R"({"q": {"dtype": "F32", "shape": [6], "data_offsets": [0]}})", data, "q", "data_offsets");
  expect_st_error(R"({"q": [1, 2]})", data, "q", "not an object");
  expect_st_error(R"([1, 2, 3])", data, "q", "not an object");
  expect_st_error(R"({"q": {"dtype": "F32", )", data, "q", "not valid JSON");
  expect_st_error(std::string(5000, '[') + std::string(5000, ']'), data, "q", "nested deeper");
  expect_st_error("\xff\xfe{}", data, "q", "JSON");
}

TEST(Safetensors, EveryTruncationAndLyingLengthIsAnError) {
  const auto full = safetensors(kHeader, sample_data());
  for (std::size_t size = 0; size + 8 < full.size(); ++size) {
    // A cut inside the data only fails for tensors whose bytes are cut; "q" spans [0, 24).
    if (size >= 8 + kHeader.size() + 24) continue;
    EXPECT_THROW(parse_safetensors(full.data(), size, "q", "cut.safetensors"), IoError) << "size " << size;
  }
  auto lying = full;
  lying[7] = std::byte(0x7f);  // header length ~2^62
  EXPECT_THROW(parse_safetensors(lying.data(), lying.size(), "q"), IoError);
  lying = full;
  lying[0] = std::byte(0xff), lying[1] = std::byte(0xff), lying[2] = std::byte(0xff);
  lying[3] = std::byte(0x7f);  // fits in the file's size? no: still past the end
  EXPECT_THROW(parse_safetensors(lying.data(), lying.size(), "q"), IoError);
  EXPECT_THROW(parse_safetensors(nullptr, 0, "q"), IoError);
}

// Edges of the formats: no .npy minor version but 0 exists; 32 dimensions are
// the limit of both readers (33 are refused); a zero-size safetensors tensor
// has equal data offsets, which the format allows, even at the data's end.
TEST(Npy, MinorVersionsAndTheDimensionLimit) {
  auto b = npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n", 8);
  b[7] = std::byte(1);  // version 1.1
  expect_io_error(b, "version");
  const auto dims = [](int count) {
    std::string s = "{'descr': '<f4', 'fortran_order': False, 'shape': (";
    for (int i = 0; i < count; ++i) s += "1, ";
    return s + "), }\n";
  };
  b = npy(1, dims(32), 4);
  EXPECT_EQ(parse_npy(b.data(), b.size(), "v.npy").shape.size(), 32u);
  expect_io_error(npy(1, dims(33), 4), "32 dimensions");
}

TEST(Safetensors, ZeroSizeTensorsAndTheDimensionLimit) {
  const auto data = sample_data();
  const std::string header = R"({"e": {"dtype": "F32", "shape": [0, 3], "data_offsets": [44, 44]},)"
                             R"( "q": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})";
  const auto file = safetensors(header, data);
  const HostArray e = parse_safetensors(file.data(), file.size(), "e");
  EXPECT_EQ(e.shape, (std::vector<std::int64_t>{0, 3}));
  EXPECT_TRUE(e.data.empty());
  EXPECT_EQ(parse_safetensors(file.data(), file.size(), "q").data.size(), 24u);
  const auto only_empty = safetensors(R"({"e": {"dtype": "BF16", "shape": [0], "data_offsets": [0, 0]}})", {});
  EXPECT_EQ(parse_safetensors(only_empty.data(), only_empty.size(), "e").numel(), 0);
  const auto dims = [](int count) {
    std::string s = R"({"q": {"dtype": "F32", "shape": [)";
    for (int i = 0; i < count; ++i) s += i ? ", 1" : "1";
    return s + R"(], "data_offsets": [0, 4]}})";
  };
  const auto ok = safetensors(dims(32), data);
  EXPECT_EQ(parse_safetensors(ok.data(), ok.size(), "q").shape.size(), 32u);
  expect_st_error(dims(33), data, "q", "more than 32 dimensions");
  // Brackets inside a string (after an escaped quote) are text, not nesting.
  const std::string text = R"({"__metadata__": {"note": "5\" [[[[[[[[[[[[[[[[[[[[ run"},)"
                           R"( "q": {"dtype": "F32", "shape": [6], "data_offsets": [0, 24]}})";
  const auto quoted = safetensors(text, data);
  EXPECT_EQ(parse_safetensors(quoted.data(), quoted.size(), "q").numel(), 6);
}

// The JSON parser keeps the last of repeated keys, so a tensor listed twice, or an entry with a
// second dtype or data_offsets, read whichever came last. Both are refused; repeats inside
// __metadata__ (free-form, read by nothing here) are not.
TEST(Safetensors, RepeatedTensorsAndEntryKeysAreRefused) {
  const auto data = sample_data();
  const std::string q0 = R"("q": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})";
  const std::string q1 = R"("q": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]})";
  expect_st_error("{" + q0 + ", " + q1 + "}", data, "q", "tensor 'q' is listed twice");
  expect_st_error("{" + q0 + R"(, "k": {"dtype": "F32", "shape": [1], "data_offsets": [16, 20]}, )" + q1 + "}", data,
                  "k", "tensor 'q' is listed twice");
  expect_st_error(R"({"q": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "data_offsets": [8, 16]}})", data,
                  "q", "key 'data_offsets' repeats in the entry of 'q'");
  expect_st_error(R"({"q": {"dtype": "F16", "shape": [2], "dtype": "F32", "data_offsets": [0, 8]}})", data, "q",
                  "key 'dtype' repeats");
  expect_st_error(R"({"__metadata__": {}, "__metadata__": {}, )" + q0 + "}", data, "q", "listed twice");
  const auto metadata = safetensors(R"({"__metadata__": {"a": "1", "a": "2"}, )" + q0 + "}", data);
  EXPECT_EQ(parse_safetensors(metadata.data(), metadata.size(), "q").data.size(), 8u);
  // The same key in different entries is no repeat.
  const auto two = safetensors("{" + q0 + R"(, "k": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", data);
  EXPECT_EQ(parse_safetensors(two.data(), two.size(), "k").data[0], std::byte(8));
}

// numel() of a caller's own shape: the product overflowed (UB; [2^40, 2^40] came out 0) and a
// negative dimension gave a negative count.
TEST(HostArrayNumel, RefusesOverflowAndNegativeDimensions) {
  HostArray a;
  a.shape = {std::int64_t(1) << 40, std::int64_t(1) << 40};
  EXPECT_THROW(a.numel(), ResourceError);
  a.shape = {3, -2};
  EXPECT_THROW(a.numel(), InvalidArgument);
  a.shape = {0, std::int64_t(1) << 62};
  EXPECT_EQ(a.numel(), 0);
  a.shape = {};
  EXPECT_EQ(a.numel(), 1);
}

}  // namespace
}  // namespace stsa::io
