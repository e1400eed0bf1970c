// The cross-rank consistency check under MPI: equal fields pass; a field that
// differs on one rank fails on every rank, naming that rank, the field and both
// values; long values that differ only past the record size still differ.
#include "tests/mpi/mpi_test_main.h"
#include <cstdio>

#include "collective/communicator.h"
#include "collective/consistency.h"

using namespace mix;
using namespace mix::collective;

static Communicator* g_comm = nullptr;

TEST_CASE("equal fields pass on every rank", "[consistency]") {
  REQUIRE(g_comm);
  CHECK_NOTHROW(check_same_on_all_ranks(*g_comm, "test", {{"step", "10"}, {"scale", "32768"}}));
}

TEST_CASE("a field that differs on the last rank fails everywhere, naming it", "[consistency]") {
  Communicator& c = *g_comm;
  const int last = c.world_size() - 1;
  Fields f = {{"step", "10"}, {"fp32 masters", c.rank() == last ? "deadbeef" : "cafef00d"}};
  try {
    check_same_on_all_ranks(c, "step 10 consistency check", f);
    FAIL("no error although rank " << last << " differs");
  } catch (const CollectiveError& e) {
    const std::string msg = e.what();
    CHECK_THAT(msg, Catch::Contains("step 10 consistency check"));
    CHECK_THAT(msg, Catch::Contains("rank " + std::to_string(last) + " differs from rank 0 in fp32 masters"));
    CHECK_THAT(msg, Catch::Contains("rank 0 has 'cafef00d', rank " + std::to_string(last) + " has 'deadbeef'"));
    CHECK_THAT(msg, !Catch::Contains("in step"));
  }
}

TEST_CASE("equal values under another field name differ (another build)", "[consistency]") {
  Communicator& c = *g_comm;
  if (c.world_size() < 2) return;
  const Fields f = {{c.rank() == 1 ? "fp32 masters" : "fp32 master", "cafef00d"}};
  CHECK_THROWS_AS(check_same_on_all_ranks(c, "names", f), CollectiveError);
}

TEST_CASE("long values differing only at the end are still told apart", "[consistency]") {
  Communicator& c = *g_comm;
  std::string v(500, 'x');
  if (c.rank() == 1) v.back() = 'y';
  CHECK_THROWS_AS(check_same_on_all_ranks(c, "long", {{"config", v}}), CollectiveError);
}

TEST_CASE("a different number of fields is an error, not a hang", "[consistency]") {
  Communicator& c = *g_comm;
  Fields f = {{"a", "1"}};
  if (c.rank() == 1) f.emplace_back("b", "2");
  CHECK_THROWS_WITH(check_same_on_all_ranks(c, "count", f), Catch::Contains("fields"));
}

int main(int argc, char** argv) { return mix::testing::run_mpi_tests(argc, argv, "test_consistency", g_comm); }
