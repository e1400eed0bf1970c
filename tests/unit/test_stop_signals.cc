// --stop-signals: the list's parsing, the flag a signal raises, a repeated
// SIGTERM or SIGUSR1 ignored (the same request from another sender), and the
// previous handlers restored.
#include <signal.h>

#include <catch2/catch.hpp>
#include <stdexcept>

#include "launch/stop_signals.h"

using mix::launch::parse_stop_signals;
using mix::launch::StopSignals;

namespace {
volatile sig_atomic_t g_previous_ran = 0;
extern "C" void previous_handler(int) { g_previous_ran = 1; }
}  // namespace

TEST_CASE("--stop-signals parses names with or without SIG, in any case, once each", "[stop_signals]") {
  CHECK(parse_stop_signals("TERM,INT,USR1") == std::vector<int>{SIGTERM, SIGINT, SIGUSR1});
  CHECK(parse_stop_signals("sigusr2,Hup,TERM,SIGTERM") == std::vector<int>{SIGUSR2, SIGHUP, SIGTERM});
  CHECK(parse_stop_signals("none").empty());
  CHECK_THROWS_AS(parse_stop_signals("KILL"), std::invalid_argument);  // cannot be caught, so cannot stop cleanly
  CHECK_THROWS_AS(parse_stop_signals("TERM,"), std::invalid_argument);
  CHECK_THROWS_AS(parse_stop_signals(""), std::invalid_argument);
  CHECK(mix::launch::signal_name(SIGUSR1) == "SIGUSR1");
}

TEST_CASE("a stop signal raises the flag; a second SIGUSR1 or SIGTERM is ignored; the old handler comes back",
          "[stop_signals]") {
  struct sigaction previous {};
  previous.sa_handler = previous_handler;
  sigemptyset(&previous.sa_mask);
  REQUIRE(::sigaction(SIGUSR1, &previous, nullptr) == 0);
  {
    const StopSignals stop({SIGUSR1, SIGUSR2});
    CHECK(stop.received() == 0);
    REQUIRE(::raise(SIGUSR2) == 0);
    CHECK(stop.received() == SIGUSR2);
    // Reaching the next line is the check: the default action would end the process.
    REQUIRE(::raise(SIGUSR1) == 0);
    REQUIRE(::raise(SIGUSR2) == 0);
    CHECK(stop.received() == SIGUSR2);  // the first one is kept
    CHECK(g_previous_ran == 0);
  }
  REQUIRE(::raise(SIGUSR1) == 0);
  CHECK(g_previous_ran == 1);
  ::signal(SIGUSR1, SIG_DFL);
}
