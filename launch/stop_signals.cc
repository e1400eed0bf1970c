#include "launch/stop_signals.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstring>
#include <stdexcept>

namespace mix::launch {

namespace {

constexpr std::pair<const char*, int> kStopSignalNames[] = {
    {"TERM", SIGTERM}, {"INT", SIGINT}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"HUP", SIGHUP}};

// Written by the handler, read by the training loop: lock-free, so safe in a handler.
std::atomic<int> g_received{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int sig) {
  int none = 0;
  if (g_received.compare_exchange_strong(none, sig)) {
    // After SIGTERM or SIGINT the launcher may stop reading our output
    // (mpirun does, while it waits to kill the job): a log line into a full
    // pipe would then block this rank before its checkpoint. From here a log
    // line that cannot be written is dropped instead. (fcntl is safe in a
    // handler; SIGUSR1 leaves mpirun reading, so the log stays whole.)
    if (sig == SIGTERM || sig == SIGINT)
      for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
        const int flags = ::fcntl(fd, F_GETFL);
        if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
      }
    return;
  }
  // A second Ctrl-C: the user will not wait for the step boundary; end as
  // SIGINT's default action would, at once. A second SIGTERM or SIGUSR1 is
  // the same request from another sender (under Slurm the ranks get the
  // scheduler's SIGTERM and then mpirun's): ignored, so the save goes on.
  if (sig != SIGINT) return;
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

std::vector<int> parse_stop_signals(const std::string& text) {
  if (text == "none") return {};
  std::vector<int> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    std::string entry = text.substr(start, comma - start);
    for (char& ch : entry) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    if (entry.rfind("SIG", 0) == 0) entry = entry.substr(3);
    int found = 0;
    for (const auto& [name, number] : kStopSignalNames)
      if (entry == name) found = number;
    if (found == 0)
      throw std::invalid_argument("'" + text.substr(start, comma - start) +
                                  "' is not a stop signal: give TERM, INT, USR1, USR2 or HUP, comma separated, or none");
    if (std::find(out.begin(), out.end(), found) == out.end()) out.push_back(found);
    start = comma + 1;
  }
  return out;
}

std::string signal_name(int signal) {
  for (const auto& [name, number] : kStopSignalNames)
    if (number == signal) return std::string("SIG") + name;
  return "signal " + std::to_string(signal);
}

StopSignals::StopSignals(const std::vector<int>& signals) : signals_(signals) {
  g_received = 0;
  for (int sig : signals_) {
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    // Interrupted system calls (a file read, a sleep in a library) resume:
    // the flag is all the handler changes.
    action.sa_flags = SA_RESTART;
    previous_.emplace_back();
    ::sigaction(sig, &action, &previous_.back());
  }
}

StopSignals::~StopSignals() {
  for (size_t i = 0; i < signals_.size(); ++i) {
    ::sigaction(signals_[i], &previous_[i], nullptr);
  }
}

int StopSignals::received() const { return g_received.load(); }

}  // namespace mix::launch
