// mixrun: starts N ranks of a program through Open MPI's mpirun, with the flags
// a user would otherwise have to remember (root, oversubscription, binding,
// which environment variables reach the ranks).
//
//   mixrun -n N [--hosts h1:k,h2:k] [--oversubscribe] [--dry-run] [--mpirun PATH] -- PROGRAM ARGS...
//
// Inside a Slurm allocation (SLURM_JOB_ID set) -n defaults to the allocation's
// task count, and mpirun finds the nodes and slots itself and starts its
// daemons through Slurm (Open MPI's ras/plm slurm components).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "launch/cli_help.h"

extern char** environ;

namespace {

constexpr int kUsageError = 2;

// Sum of the slots in "h1:k,h2:k" (a host without ":k" has one slot), or an
// error message when an entry is malformed.
std::optional<long> parse_host_slots(const std::string& hosts, std::string* error) {
  long total = 0;
  size_t start = 0;
  while (start <= hosts.size()) {
    const size_t comma = std::min(hosts.find(',', start), hosts.size());
    const std::string entry = hosts.substr(start, comma - start);
    const size_t colon = entry.find(':');
    const std::string host = entry.substr(0, colon);
    if (host.empty()) {
      *error = "empty host name in '" + hosts + "' (expected host1:slots,host2:slots)";
      return std::nullopt;
    }
    long slots = 1;
    if (colon != std::string::npos) {
      const std::string count = entry.substr(colon + 1);
      char* end = nullptr;
      errno = 0;
      slots = count.empty() ? 0 : std::strtol(count.c_str(), &end, 10);
      if (count.empty() || errno != 0 || *end != '\0' || slots <= 0) {
        *error = "bad slot count '" + count + "' for host '" + host + "' (expected a positive integer)";
        return std::nullopt;
      }
    }
    total += slots;
    start = comma + 1;
  }
  return total;
}

// POSIX-shell quoting, only where needed, so the printed line can be pasted back.
std::string shell_quote(const std::string& arg) {
  if (!arg.empty() && arg.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-") ==
                          std::string::npos) {
    return arg;
  }
  std::string out = "'";
  for (char c : arg) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// Names of the variables the ranks need: mixtrain's, NCCL's, and the BLAS/OpenMP thread counts.
std::vector<std::string> forwarded_variables() {
  std::vector<std::string> names;
  for (char** e = environ; e && *e; ++e) {
    const std::string entry = *e;
    const std::string name = entry.substr(0, entry.find('='));
    if (starts_with(name, "MIX_") || starts_with(name, "NCCL_") || name == "OPENBLAS_NUM_THREADS" ||
        name == "OMP_NUM_THREADS") {
      names.push_back(name);
    }
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

bool env_set(const char* name) { return std::getenv(name) != nullptr; }

std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : fallback;
}

// The Slurm allocation this runs in (the batch script or an salloc shell), when any.
struct SlurmAllocation {
  std::string job_id;
  std::string nodes;
  std::optional<long> tasks;  // SLURM_NTASKS: set by -n/--ntasks-per-node, not by --nodes alone
};

std::optional<SlurmAllocation> slurm_allocation() {
  const std::string job = env_or("SLURM_JOB_ID", "");
  if (job.empty()) return std::nullopt;
  SlurmAllocation a{job, env_or("SLURM_JOB_NODELIST", "?"), std::nullopt};
  const std::string tasks = env_or("SLURM_NTASKS", "");
  char* end = nullptr;
  errno = 0;
  const long n = tasks.empty() ? 0 : std::strtol(tasks.c_str(), &end, 10);
  if (!tasks.empty() && errno == 0 && *end == '\0' && n >= 1) a.tasks = n;
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  // Everything after the first "--" is the program and its arguments, untouched.
  int split = -1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      split = i;
      break;
    }
  }

  CLI::App app{"mixrun: starts N ranks of PROGRAM with mpirun (Open MPI)", "mixrun"};
  app.formatter(mix::launch::help_formatter());
  app.set_version_flag("--version", [] { return mix::launch::version_text("mixrun"); },
                       "print the version, the commit and the libraries of this build, and exit");
  app.footer(
      "Usage: mixrun -n N [--hosts h1:k,h2:k] [--oversubscribe] [--dry-run] [--mpirun PATH] -- PROGRAM ARGS...\n"
      "Forwards MIX_*, NCCL_*, OPENBLAS_NUM_THREADS and OMP_NUM_THREADS to every rank.\n"
      "Inside a Slurm allocation (SLURM_JOB_ID set, e.g. in an sbatch script): -n defaults to SLURM_NTASKS, and\n"
      "mpirun takes the nodes and slots from Slurm and starts its daemons with srun; no oversubscription is implied.\n"
      "There, `srun --mpi=pmix PROGRAM ARGS...` also works, with an MPI built with PMIx (docs/cluster.md).\n");
  int ranks = 0;
  std::string hosts;
  bool oversubscribe = false;
  bool dry_run = false;
  std::string mpirun_flag;
  std::optional<int> stop_grace;
  const std::optional<SlurmAllocation> slurm = slurm_allocation();
  CLI::Option* np_option =
      app.add_option("-n,--np", ranks, "number of ranks to start (required, except in a Slurm allocation: SLURM_NTASKS)")
          ->type_name("N");
  np_option
      ->check(CLI::Validator(
          [](std::string& value) {
            char* end = nullptr;
            errno = 0;
            const long v = std::strtol(value.c_str(), &end, 10);
            const bool ok = !value.empty() && *end == '\0' && errno == 0 && v >= 1 && v <= 1000000;
            return ok ? std::string() : "'" + value + "' is not a number of ranks (a positive integer)";
          },
          ""));
  app.add_option("--hosts", hosts, "hosts and their slots, h1:k,h2:k (default: this machine)")
      ->type_name("HOSTS")
      ->check(CLI::Validator(
          [](std::string& value) {
            std::string error;
            return parse_host_slots(value, &error) ? std::string() : error;
          },
          ""));
  app.add_flag("--oversubscribe", oversubscribe,
               "allow more ranks than cores (implied when -n exceeds this machine's cores and no --hosts are given)");
  app.add_flag("--dry-run", dry_run, "print the mpirun command line and exit");
  app.add_option("--stop-grace", stop_grace,
                 "on SIGTERM or SIGINT, mpirun passes SIGTERM to the ranks S seconds later and kills them S seconds "
                 "after that: time for mixtrain to save. mpirun also waits 2 S at the end of a job a rank ended with "
                 "an error or a stop (default: Open MPI's, 1 s; SIGUSR1 is passed on at once)")
      ->type_name("S")
      ->check(CLI::Range(1, 3600));
  app.add_option("--mpirun", mpirun_flag, "mpirun to run (default: $MIX_MPIRUN, else mpirun on PATH)")->type_name("PATH");
  if (split < 0) app.prefix_command();  // no "--": the first word that is not ours starts the program

  std::vector<std::string> program;
  if (auto stop = mix::launch::parse_command_line(app, split < 0 ? argc : split, argv)) return *stop;
  if (split >= 0) {
    program.assign(argv + split + 1, argv + argc);
  } else {
    program = app.remaining();
    if (!program.empty() && starts_with(program[0], "-")) {
      std::cerr << "mixrun: unknown flag " << program[0]
                << " (put the program after --: mixrun -n N -- PROGRAM ARGS...)\n";
      return kUsageError;
    }
  }
  if (program.empty()) {
    std::cerr << "mixrun: missing PROGRAM: mixrun -n N [options] -- PROGRAM ARGS...\n";
    return kUsageError;
  }

  if (np_option->count() == 0) {
    if (!slurm || !slurm->tasks) {
      std::cerr << "mixrun: missing -n/--np N (the number of ranks)"
                << (slurm ? "; this Slurm allocation does not say SLURM_NTASKS (give sbatch -n or --ntasks-per-node)"
                          : "")
                << "\n";
      return kUsageError;
    }
    ranks = static_cast<int>(*slurm->tasks);
  }
  if (slurm) {
    std::cerr << "mixrun: launching " << ranks << " ranks inside Slurm job " << slurm->job_id << " on "
              << slurm->nodes << "\n";
  }

  if (!hosts.empty() && !oversubscribe) {
    std::string error;
    const long slots = parse_host_slots(hosts, &error).value_or(0);
    if (ranks > slots) {
      std::cerr << "mixrun: -n " << ranks << " is more than the " << slots << " slots of --hosts " << hosts
                << "; give hosts more slots or pass --oversubscribe\n";
      return kUsageError;
    }
  }

  const long cores = std::max(1u, std::thread::hardware_concurrency());
  // In an allocation the slots are Slurm's, on nodes that may not be this one:
  // this machine's cores say nothing, and mpirun refuses more ranks than slots.
  const bool oversubscribed = oversubscribe || (!slurm && hosts.empty() && ranks > cores);

  std::string mpirun = mpirun_flag;
  if (mpirun.empty()) {
    const char* env = std::getenv("MIX_MPIRUN");
    mpirun = (env && *env) ? env : "mpirun";
  }

  std::vector<std::string> cmd = {mpirun};
  if (geteuid() == 0) cmd.push_back("--allow-run-as-root");  // Open MPI refuses root without it
  cmd.insert(cmd.end(), {"-n", std::to_string(ranks)});
  if (!hosts.empty()) cmd.insert(cmd.end(), {"--host", hosts});
  // Open MPI's odls_base_sigkill_timeout: mpirun sends SIGCONT, then SIGTERM
  // this many seconds later, then SIGKILL as many seconds after that. Not
  // raised by default: mpirun sleeps through both delays also when the ranks
  // have already ended (a rank's error or a stop ends the job that way).
  if (stop_grace) cmd.insert(cmd.end(), {"--mca", "odls_base_sigkill_timeout", std::to_string(*stop_grace)});
  if (oversubscribed) {
    // Binding ranks to cores they must share would serialise them.
    cmd.insert(cmd.end(), {"--oversubscribe", "--bind-to", "none"});
  }
  for (const std::string& name : forwarded_variables()) cmd.insert(cmd.end(), {"-x", name});
  if (oversubscribed && ranks > cores) {
    // More ranks than cores: one BLAS/OpenMP thread each, unless the user chose.
    for (const char* name : {"OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"}) {
      if (!env_set(name)) cmd.insert(cmd.end(), {"-x", std::string(name) + "=1"});
    }
  }
  cmd.insert(cmd.end(), program.begin(), program.end());

  std::string line;
  for (const std::string& arg : cmd) line += (line.empty() ? "" : " ") + shell_quote(arg);
  if (dry_run) {
    std::cout << line << "\n";
    return 0;
  }
  std::cerr << "mixrun: " << line << std::endl;

  std::vector<char*> args;
  for (std::string& arg : cmd) args.push_back(arg.data());
  args.push_back(nullptr);
  execvp(args[0], args.data());
  const int err = errno;
  std::cerr << "mixrun: cannot run " << shell_quote(mpirun) << ": " << std::strerror(err) << "\n";
  if (err == ENOENT) {
    std::cerr << "mixrun: mpirun was not found. Install Open MPI with scripts/setup.sh "
                 "(it runs apt-get install openmpi-bin), or point --mpirun or MIX_MPIRUN at it.\n";
  }
  return 127;
}
