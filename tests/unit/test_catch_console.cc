// The unit tests' main (tests/catch_main.cc) reports a failing test whose
// name Catch2 2.13 could not wrap at its default 80 columns: that wrapping
// printed lines of "-" without end, or aborted, where it should have printed
// the failure. This test runs such a failing case, hidden from normal runs,
// in a child process of this same program and checks what the child prints
// and how it ends; the child's output is cut at 1 MB and its time at 60 s, so
// a regression fails here instead of hanging.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <string>

TEST_CASE(
    "grad_global_norm's and the clips' kernels, emulated in multi-tensor launches: the CPU's norm to an FP32 ulp, "
    "the clips bit for bit",
    "[.wrap_hazard]") {
  CHECK(1 == 2);  // fails on purpose: its report must print this test's name
}

TEST_CASE("a failing test whose name Catch2 once could not wrap is reported, and its program ends", "[catch]") {
  std::array<char, 4096> path{};
  const ssize_t n = readlink("/proc/self/exe", path.data(), path.size() - 1);
  REQUIRE(n > 0);
  // pipefail: the status is the child's (1: a test failed), not head's; 137 a
  // timeout, 141 killed writing past head's 1 MB, 134 an abort.
  const std::string cmd = "bash -c 'set -o pipefail; timeout -s KILL 60 \"" + std::string(path.data(), n) +
                          "\" \"[.wrap_hazard]\" 2>&1 | head -c 1000000'";
  FILE* child = popen(cmd.c_str(), "r");
  REQUIRE(child != nullptr);
  std::string out;
  std::array<char, 65536> buf;
  for (size_t got; (got = fread(buf.data(), 1, buf.size(), child)) > 0;) out.append(buf.data(), got);
  const int status = pclose(child);
  INFO("the child's output (" << out.size() << " bytes) begins: " << out.substr(0, 2000));
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(out.size() < 100000);
  CHECK(out.find("emulated in multi-tensor launches: the CPU's norm to an FP32 ulp, the clips bit for bit") !=
        std::string::npos);
  CHECK(out.find("1 failed") != std::string::npos);  // the summary line, "test cases: 1 | 0 passed | 1 failed" padded
}
