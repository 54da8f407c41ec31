#include <chrono>
#include <cstdio>

#include "cli/commands.hpp"

namespace stsa::cli {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

Progress::Progress(std::string what, bool enabled) : what_(std::move(what)), enabled_(enabled), start_s_(now_s()) {}

void Progress::update(double fraction) {
  if (!enabled_) return;
  const double t = now_s();
  // Quiet for short tasks; then at most twice a second.
  if (t - start_s_ < 2.0 || t - last_print_s_ < 0.5) return;
  last_print_s_ = t;
  printed_ = true;
  std::fprintf(stderr, "\rstsa: %s... %3.0f%%", what_.c_str(), 100.0 * fraction);
  std::fflush(stderr);
}

Progress::~Progress() {
  if (printed_) std::fprintf(stderr, "\rstsa: %s... done (%.1f s)\n", what_.c_str(), now_s() - start_s_);
}

}  // namespace stsa::cli
