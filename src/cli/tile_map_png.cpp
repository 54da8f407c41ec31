#include "cli/tile_map_png.hpp"

#include <png.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <vector>

#include "stsa/error.hpp"

namespace stsa::cli {
namespace {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

void write_tile_map_png(const TilePlan& plan, const std::string& path, bool overwrite, int max_side) {
  STSA_CHECK(overwrite || !std::filesystem::exists(path), IoError, path,
             ": already exists (pass --force to overwrite)");
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

  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "wb"));
  STSA_CHECK(file != nullptr, IoError, path, ": cannot open for writing");
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  if (!png || !info || setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw IoError(detail::concat(path, ": libpng failed to write the image"));
  }
  png_init_io(png, file.get());
  png_set_IHDR(png, info, png_uint_32(width), png_uint_32(height), 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (std::size_t y = 0; y < height; ++y) png_write_row(png, rgb.data() + y * width * 3);
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
}

}  // namespace stsa::cli
