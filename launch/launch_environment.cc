#include "launch/launch_environment.h"

#include <cerrno>
#include <cstdlib>
#include <sstream>

namespace mix::launch {
namespace {

// The value of `name` as a positive count, or nullopt when unset, empty or not a
// number (a variable that says nothing usable must not trigger the check).
std::optional<long> positive(const Environment& env, const char* name) {
  const auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(it->second.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < 1) return std::nullopt;
  return v;
}

std::optional<long> non_negative(const Environment& env, const char* name) {
  const auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(it->second.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < 0) return std::nullopt;
  return v;
}

std::string value_or(const Environment& env, const char* name, const char* fallback) {
  const auto it = env.find(name);
  return it == env.end() || it->second.empty() ? fallback : it->second;
}

bool has(const Environment& env, const char* name) {
  const auto it = env.find(name);
  return it != env.end() && !it->second.empty();
}

constexpr const char* kNames[] = {
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "PMI_RANK", "PMIX_RANK", "PMIX_NAMESPACE",
    "SLURM_STEP_NUM_TASKS", "SLURM_PROCID", "SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_MPI_TYPE", "SLURM_NTASKS",
};

}  // namespace

std::optional<LaunchExpectation> launcher_expectation(const Environment& env) {
  if (auto n = positive(env, "OMPI_COMM_WORLD_SIZE")) {
    return LaunchExpectation{*n, "mpirun (OMPI_COMM_WORLD_SIZE)", non_negative(env, "OMPI_COMM_WORLD_RANK")};
  }
  if (auto n = positive(env, "PMI_SIZE")) {
    return LaunchExpectation{*n, "a PMI process manager (PMI_SIZE)", non_negative(env, "PMI_RANK")};
  }
  if (auto n = positive(env, "SLURM_STEP_NUM_TASKS")) {
    const std::string step =
        value_or(env, "SLURM_JOB_ID", "?") + "." + value_or(env, "SLURM_STEP_ID", "?");
    std::string how = "srun (Slurm job step " + step;
    if (has(env, "SLURM_MPI_TYPE")) how += ", --mpi=" + value_or(env, "SLURM_MPI_TYPE", "");
    how += ")";
    return LaunchExpectation{*n, how, non_negative(env, "SLURM_PROCID")};
  }
  return std::nullopt;
}

std::optional<std::string> singleton_mismatch(const Environment& env, int world_size, const std::string& program) {
  if (world_size != 1) return std::nullopt;  // the MPI world did form: it is the job
  const auto expected = launcher_expectation(env);
  if (!expected || expected->tasks <= 1) return std::nullopt;

  std::ostringstream m;
  m << expected->source << " started " << expected->tasks << " tasks";
  if (expected->task_index) m << " (this is task " << *expected->task_index << ")";
  m << ", but this process's communicator has a world of 1: it did not join the others and would train a model "
       "of its own, as every other task would. ";
  if (has(env, "PMIX_RANK") || has(env, "PMI_RANK")) {
    m << "The launcher offered PMI, but this build's MPI did not use it (an MPI built without PMIx/PMI support, "
         "a PMIx version it cannot talk to, or a build without MPI). ";
  } else {
    m << "The launcher gave no PMI to join through (srun without --mpi=pmix, or MpiDefault=none), so MPI started "
         "as a singleton; or this build has no MPI. ";
  }
  m << "Launch in one of these ways:\n"
    << "  srun --mpi=pmix -n N " << program << " ...   (an MPI built with PMIx; `srun --mpi=list` shows the plugins)\n"
    << "  mixrun -n N -- " << program << " ...   (inside an allocation: mpirun with Open MPI's own Slurm support; "
    << "-n defaults to SLURM_NTASKS)";
  return m.str();
}

Environment launch_variables() {
  Environment env;
  for (const char* name : kNames) {
    if (const char* v = std::getenv(name)) env[name] = v;
  }
  return env;
}

}  // namespace mix::launch
