#pragma once
// Cross-rank consistency checks. Each rank contributes named text fields; the
// fields are all-gathered and compared with rank 0's. A mismatch throws
// CollectiveError on every rank (every rank sees the same gathered data), with a
// message that names the differing ranks, fields and values.
#include <string>
#include <utility>
#include <vector>

#include "collective/communicator.h"
#include "runtime/core/check.h"

namespace mix::collective {

/// An error every rank raises together, so the job can end without MPI_Abort.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

using Fields = std::vector<std::pair<std::string, std::string>>;

/// `what` names the check in the message ("startup fingerprint", "step 200 consistency check").
void check_same_on_all_ranks(Communicator& comm, const std::string& what, const Fields& fields);

}  // namespace mix::collective
