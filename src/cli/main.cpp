// `stsa`: plan, benchmark and route spatio-temporal sparse attention.
// Every error ends as one line on stderr and exit code 2.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string>

#include "cli/commands.hpp"
#include "stsa/error.hpp"

namespace {

int fail(const std::string& what) {
  std::string line = what;
  for (char& c : line)
    if (c == '\n') c = ' ';
  std::fprintf(stderr, "stsa: error: %s\n", line.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"stsa: spatio-temporal sparse attention for video diffusion transformers.\n"
               "Run without arguments for a short demo."};
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", "stsa 0.1.0");
  stsa::cli::add_plan_command(app);
  stsa::cli::add_bench_command(app);
  stsa::cli::add_route_command(app);
  try {
    app.parse(argc, argv);
    if (app.get_subcommands().empty()) stsa::cli::run_demo();
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    return fail(std::string(e.what()) + " (see --help)");
  } catch (const stsa::Error& e) {
    return fail(e.what());
  } catch (const std::bad_alloc&) {
    return fail("out of memory");
  } catch (const std::exception& e) {
    return fail(e.what());
  }
  return 0;
}
