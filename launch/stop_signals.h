#pragma once
// Preemption: the signals a scheduler sends before it kills a job (Slurm's
// SIGTERM, or SIGUSR1 ahead of the time limit with --signal; mpirun forwards
// them to the ranks) only raise a flag here. The training loop reads the flag
// at a step boundary, every rank agrees through the loss all-reduce the step
// already makes, one checkpoint is saved and mixtrain exits with
// kStoppedExitCode (launch/trainer.cc). A second SIGINT ends the process at
// once, as a second Ctrl-C does in most programs; a second SIGTERM or SIGUSR1
// is ignored (it is the same request from another sender).
#include <signal.h>

#include <string>
#include <vector>

namespace mix::launch {

/// Exit status of a run stopped by a signal after saving: EX_TEMPFAIL of
/// <sysexits.h>, "try again later", so a job script can tell it from a
/// failure (1) or a usage error (2) and requeue.
inline constexpr int kStoppedExitCode = 75;

/// Parses --stop-signals: a comma-separated list of TERM, INT, USR1, USR2,
/// HUP (with or without "SIG"), or "none". Returns the signal numbers, or
/// throws std::invalid_argument naming the bad entry.
std::vector<int> parse_stop_signals(const std::string& text);

/// "SIGTERM" for SIGTERM.
std::string signal_name(int signal);

/// Installs the flag-raising handler for `signals` (each a stop signal until
/// the object is destroyed, when the previous handlers come back). One object
/// at a time.
class StopSignals {
 public:
  explicit StopSignals(const std::vector<int>& signals);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  /// The first stop signal received, or 0.
  int received() const;

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> previous_;  // restored by the destructor
};

}  // namespace mix::launch
