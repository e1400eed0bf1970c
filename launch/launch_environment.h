#pragma once
// What the launcher (mpirun, a PMI process manager, Slurm's srun) says about
// the job this process belongs to, read from the environment it left, and
// the check that catches a process whose MPI did not join that job: started
// by a plain `srun -n 2` with no PMI, each task's MPI comes up as a singleton
// (rank 0 of 1), and every task would silently train a model of its own.
#include <map>
#include <optional>
#include <string>

namespace mix::launch {

/// Environment variables by name (only the ones that matter need be there).
using Environment = std::map<std::string, std::string>;

/// How many tasks the launcher started for this job, and who said so.
struct LaunchExpectation {
  long tasks = 1;
  std::string source;              ///< the launcher, in words ("srun (Slurm job step 7.0)")
  std::optional<long> task_index;  ///< this process's index among them, when the launcher said
};

/// The launcher's task count, from the first of these that is set and valid:
///   OMPI_COMM_WORLD_SIZE  mpirun (Open MPI) set it for each rank: trusted above
///                         all, because the ranks of mpirun inside an allocation
///                         also carry the SLURM_* variables of the batch script
///                         or of the srun step that started mpirun's daemons;
///   PMI_SIZE              a PMI-1/PMI-2 process manager (srun --mpi=pmi2, Hydra);
///   SLURM_STEP_NUM_TASKS  a task of an srun step (also with --mpi=pmix, whose
///                         PMIX_* variables carry no size). The batch script and
///                         an salloc shell have SLURM_NTASKS (the allocation's)
///                         but no step variables: they run one process, legitimately.
/// nullopt when none is set: no launcher, or one that leaves no trace.
std::optional<LaunchExpectation> launcher_expectation(const Environment& env);

/// The message for a process whose communicator has a world of one while its
/// launcher started more than one task: it says
/// what happened and the two launches of `program` that work. nullopt when all is well.
std::optional<std::string> singleton_mismatch(const Environment& env, int world_size,
                                              const std::string& program = "mixtrain");

/// The variables launcher_expectation reads, from this process's environment.
Environment launch_variables();

}  // namespace mix::launch
