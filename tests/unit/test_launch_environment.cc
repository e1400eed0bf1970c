// launch/launch_environment.h: which launcher said how many tasks, and when a
// world of one is a task that failed to join its job. The environments below
// are the variables a real Slurm 22.05 and Open MPI 4.1 set (as recorded by
// tests/cluster/test_slurm.py's runs), trimmed to the ones that matter. The
// whole-job side (srun --mpi=none stopping each task): cluster.test_slurm.
#include <catch2/catch.hpp>

#include "launch/launch_environment.h"

using mix::launch::Environment;
using mix::launch::launcher_expectation;
using mix::launch::singleton_mismatch;

namespace {

// A task of `srun -n 2` (no --mpi): the step's variables, no PMI.
Environment srun_task(const char* procid = "1") {
  return {{"SLURM_JOB_ID", "7"},      {"SLURM_STEP_ID", "0"},  {"SLURM_STEP_NUM_TASKS", "2"},
          {"SLURM_NTASKS", "2"},      {"SLURM_PROCID", procid}, {"SLURM_LOCALID", procid}};
}

// The batch script of `sbatch -n 2`: the allocation's task count, no step variables.
Environment batch_script() {
  return {{"SLURM_JOB_ID", "7"}, {"SLURM_NTASKS", "2"}, {"SLURM_NPROCS", "2"}, {"SLURM_PROCID", "0"}};
}

Environment with(Environment env, const Environment& more) {
  for (const auto& [k, v] : more) env[k] = v;
  return env;
}

}  // namespace

TEST_CASE("no launcher variables: no expectation and no mismatch", "[launch]") {
  CHECK_FALSE(launcher_expectation({}).has_value());
  CHECK_FALSE(singleton_mismatch({}, 1).has_value());
}

TEST_CASE("a task of srun -n 2 without PMI that came up alone is refused", "[launch]") {
  const auto expected = launcher_expectation(srun_task());
  REQUIRE(expected.has_value());
  CHECK(expected->tasks == 2);
  CHECK(expected->task_index == 1);
  CHECK(expected->source.find("srun") != std::string::npos);
  CHECK(expected->source.find("7.0") != std::string::npos);

  const auto message = singleton_mismatch(srun_task(), 1);
  REQUIRE(message.has_value());
  CHECK(message->find("started 2 tasks") != std::string::npos);
  CHECK(message->find("task 1") != std::string::npos);
  CHECK(message->find("srun --mpi=pmix -n N mixtrain") != std::string::npos);
  CHECK(message->find("mixrun -n N -- mixtrain") != std::string::npos);
  CHECK(message->find("gave no PMI") != std::string::npos);
  // Task 0 is as wrong as task 1: it would also train alone.
  CHECK(singleton_mismatch(srun_task("0"), 1).has_value());
}

TEST_CASE("srun --mpi=pmix whose MPI did not take up PMIx is refused, naming PMI", "[launch]") {
  const Environment env = with(srun_task(), {{"PMIX_RANK", "1"}, {"PMIX_NAMESPACE", "slurm.pmix.7.0"},
                                             {"SLURM_MPI_TYPE", "pmix"}});
  const auto message = singleton_mismatch(env, 1, "mixbench");
  REQUIRE(message.has_value());
  CHECK(message->find("--mpi=pmix") != std::string::npos);
  CHECK(message->find("offered PMI") != std::string::npos);
  CHECK(message->find("mixrun -n N -- mixbench") != std::string::npos);
  // The same step whose MPI did form the world of 2: all is well.
  CHECK_FALSE(singleton_mismatch(env, 2).has_value());
}

TEST_CASE("srun --mpi=pmi2: PMI_SIZE is the task count", "[launch]") {
  const Environment env = with(srun_task(), {{"PMI_SIZE", "2"}, {"PMI_RANK", "1"}, {"SLURM_MPI_TYPE", "pmi2"}});
  REQUIRE(launcher_expectation(env).has_value());
  CHECK(launcher_expectation(env)->source.find("PMI_SIZE") != std::string::npos);
  CHECK(singleton_mismatch(env, 1).has_value());
  CHECK_FALSE(singleton_mismatch(env, 2).has_value());
}

TEST_CASE("the batch script itself runs one process legitimately", "[launch]") {
  CHECK_FALSE(launcher_expectation(batch_script()).has_value());
  CHECK_FALSE(singleton_mismatch(batch_script(), 1).has_value());
}

TEST_CASE("mpirun's count wins over the Slurm variables its ranks inherit", "[launch]") {
  // mpirun -n 1 inside a 2-task allocation: the rank carries the batch script's
  // variables (or, on another node, those of the srun step that started
  // mpirun's daemon, one task per node) and OMPI_COMM_WORLD_SIZE=1.
  const Environment on_first_node = with(batch_script(), {{"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "0"}});
  CHECK(launcher_expectation(on_first_node)->tasks == 1);
  CHECK_FALSE(singleton_mismatch(on_first_node, 1).has_value());
  const Environment daemon_step = with(srun_task("1"), {{"OMPI_COMM_WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "0"}});
  CHECK_FALSE(singleton_mismatch(daemon_step, 1).has_value());
  // mpirun -n 2 whose ranks each came up alone (a build without MPI): refused.
  const Environment two = with(batch_script(), {{"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_RANK", "1"}});
  const auto message = singleton_mismatch(two, 1);
  REQUIRE(message.has_value());
  CHECK(message->find("mpirun") != std::string::npos);
}

TEST_CASE("a one-task step and unusable values are no reason to stop", "[launch]") {
  CHECK_FALSE(singleton_mismatch(with(srun_task("0"), {{"SLURM_STEP_NUM_TASKS", "1"}}), 1).has_value());
  CHECK_FALSE(singleton_mismatch(with(srun_task(), {{"SLURM_STEP_NUM_TASKS", ""}}), 1).has_value());
  CHECK_FALSE(singleton_mismatch(with(srun_task(), {{"SLURM_STEP_NUM_TASKS", "two"}}), 1).has_value());
  CHECK_FALSE(singleton_mismatch(with(srun_task(), {{"SLURM_STEP_NUM_TASKS", "0"}}), 1).has_value());
  // An unusable mpirun count falls through to the next launcher that says something.
  CHECK(launcher_expectation(with(srun_task(), {{"OMPI_COMM_WORLD_SIZE", "x"}}))->tasks == 2);
}
