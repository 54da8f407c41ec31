#include "cli/tile_map_png.hpp"

#include <png.h>

#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <filesystem>
#include <new>
#include <span>
#include <system_error>
#include <vector>

#include "io/file_bytes.hpp"
#include "stsa/error.hpp"

namespace stsa::cli {
namespace {

// Where libpng puts the encoded bytes and its error message. The image is encoded in
// memory and written in one go, so a libpng failure never leaves a file behind.
struct PngSink {
  std::vector<std::byte> bytes;
  char error[200] = "unknown error";  // no allocation inside libpng's callbacks
};

// libpng's default handlers print to stderr ("libpng error: ..."): errors are kept for
// our one line instead, and warnings (nothing that harms the image) are dropped.
void on_png_error(png_structp png, png_const_charp message) {
  auto* sink = static_cast<PngSink*>(png_get_error_ptr(png));
  std::snprintf(sink->error, sizeof sink->error, "%s", message != nullptr ? message : "unknown error");
  png_longjmp(png, 1);
}

void on_png_warning(png_structp, png_const_charp) {}

void on_png_write(png_structp png, png_bytep data, png_size_t size) {
  auto* sink = static_cast<PngSink*>(png_get_io_ptr(png));
  bool grown = true;
  try {
    sink->bytes.insert(sink->bytes.end(), reinterpret_cast<const std::byte*>(data),
                       reinterpret_cast<const std::byte*>(data) + size);
  } catch (const std::bad_alloc&) {
    grown = false;  // png_error longjmps: not from inside the handler
  }
  if (!grown) png_error(png, "out of memory");
}

void on_png_flush(png_structp) {}

// Holds the setjmp, with only trivially destructible locals, so that libpng's longjmp
// skips no destructor. False on failure, with sink.error set.
bool encode_png(PngSink& sink, std::uint8_t* rgb, std::size_t width, std::size_t height) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &sink, on_png_error, on_png_warning);
  png_infop info = png != nullptr ? png_create_info_struct(png) : nullptr;
  if (info == nullptr) {
    std::snprintf(sink.error, sizeof sink.error, "out of memory");
    png_destroy_write_struct(&png, nullptr);
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  png_set_write_fn(png, &sink, on_png_write, on_png_flush);
  png_set_IHDR(png, info, png_uint_32(width), png_uint_32(height), 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (std::size_t y = 0; y < height; ++y) png_write_row(png, rgb + y * width * 3);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return true;
}

}  // namespace

void write_tile_map_png(const TilePlan& plan, const std::string& path, bool overwrite, int max_side) {
  constexpr const char* kRefusal = "pass --force to overwrite";
  // Checked before the picture is drawn as well as when the file is opened (exclusively).
  std::error_code ec;
  STSA_CHECK(overwrite || !std::filesystem::exists(std::filesystem::symlink_status(path, ec)), IoError, path,
             ": already exists (", kRefusal, ")");
  const std::int64_t rows = plan.q_tiles(), cols = plan.k_tiles();
  const std::int64_t step = std::max<std::int64_t>(1, (std::max(rows, cols) + max_side - 1) / max_side);
  const auto height = std::size_t((rows + step - 1) / step), width = std::size_t((cols + step - 1) / step);
  // Per pixel, the strongest class among its tiles: partial > full > empty.
  std::vector<std::uint8_t> cls(height * width, 0);
  for (std::int64_t qt = 0; qt < rows; ++qt) {
    std::uint8_t* line = cls.data() + std::size_t(qt / step) * width;
    for (auto kt : plan.full_tiles(qt)) line[kt / step] = std::max<std::uint8_t>(line[kt / step], 1);
    for (auto kt : plan.partial_tiles(qt)) line[kt / step] = 2;
  }
  static constexpr std::uint8_t kColors[3][3] = {{255, 255, 255}, {40, 90, 200}, {240, 140, 30}};
  std::vector<std::uint8_t> rgb(height * width * 3);
  for (std::size_t i = 0; i < cls.size(); ++i) std::copy_n(kColors[cls[i]], 3, rgb.data() + 3 * i);

  PngSink sink;
  sink.bytes.reserve(rgb.size() / 4 + 1024);
  STSA_CHECK(encode_png(sink, rgb.data(), width, height), IoError, path, ": cannot encode the image (libpng: ",
             sink.error, ")");
  io::files::write_file(path, {std::span<const std::byte>(sink.bytes)}, overwrite, kRefusal);
}

}  // namespace stsa::cli
