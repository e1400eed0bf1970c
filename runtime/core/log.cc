#include "runtime/core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "runtime/core/check.h"

namespace mix {

namespace {
std::string& identity() {
  static std::string id = "single process";
  return id;
}
}  // namespace

const std::string& process_identity() { return identity(); }

void set_process_identity(int rank, int world) {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  identity() = "rank " + std::to_string(rank) + "/" + std::to_string(world) + " on " + host;
}

void throw_check_failure(const char* what, const char* file, int line, const std::string& detail) {
  std::string msg = detail.empty() ? std::string("check failed") : detail;
  msg += " [";
  msg += what;
  msg += " at ";
  msg += file;
  msg += ":" + std::to_string(line) + ", " + process_identity() + "]";
  throw Error(msg);
}

namespace log {
void init(int rank, int world) {
  set_process_identity(rank, world);
  // mpirun hands ranks a pseudo-terminal, so spdlog would colour lines that end
  // up in log files; colour only a single process on a terminal (MIX_LOG_COLOR=1 forces it).
  const char* color = std::getenv("MIX_LOG_COLOR");
  const bool want_color = color ? std::string(color) == "1" : world == 1 && !std::getenv("OMPI_COMM_WORLD_SIZE");
  spdlog::drop("mixtrain");  // init may run more than once (tests)
  auto logger = spdlog::stdout_color_mt("mixtrain", want_color ? spdlog::color_mode::automatic : spdlog::color_mode::never);
  spdlog::set_default_logger(logger);
  spdlog::set_pattern("[rank " + std::to_string(rank) + "/" + std::to_string(world) + "] [%^%l%$] %v");
  const char* all = std::getenv("MIX_LOG_ALL_RANKS");
  const bool verbose = rank == 0 || (all && std::string(all) == "1");
  spdlog::set_level(verbose ? spdlog::level::info : spdlog::level::warn);
  if (const char* lvl = std::getenv("MIX_LOG_LEVEL")) spdlog::set_level(spdlog::level::from_str(lvl));
}
}  // namespace log

}  // namespace mix
