// The world-size-1 backend. With one rank every collective is the identity
// (avg divides by 1), but the byte counters still move, so that metrics of a
// single-process run read the same as those of a multi-rank one.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "collective/communicator.h"
#include "runtime/core/check.h"

namespace mix::collective {

namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string backend_name() const override { return "local"; }

  void all_reduce(void* buf, size_t n, DType dtype, ReduceOp op, Traffic traffic) override {
    MIX_CHECK(buf != nullptr || n == 0, "all_reduce of " << n << " " << dtype_name(dtype) << " elements ("
                                                          << reduce_op_name(op) << ") got a null buffer");
    count(n * dtype_size(dtype), traffic);
  }

  void all_reduce_into(const void* send, void* recv, size_t n, DType dtype, ReduceOp op, Traffic traffic) override {
    MIX_CHECK((send != nullptr && recv != nullptr) || n == 0, "all_reduce of " << n << " " << dtype_name(dtype)
                                                                                 << " elements got a null buffer");
    if (n > 0 && send != recv) std::memmove(recv, send, n * dtype_size(dtype));
    all_reduce(recv, n, dtype, op, traffic);
  }

  void broadcast(void* buf, size_t bytes, int root) override {
    MIX_CHECK(root == 0, "broadcast root " << root << " is not a rank of a world of size 1");
    MIX_CHECK(buf != nullptr || bytes == 0, "broadcast of " << bytes << " bytes got a null buffer");
    count(bytes, Traffic::control);
  }

  void all_gather(const void* send, void* recv, size_t bytes_per_rank) override {
    MIX_CHECK((send != nullptr && recv != nullptr) || bytes_per_rank == 0,
              "all_gather of " << bytes_per_rank << " bytes got a null buffer");
    if (bytes_per_rank > 0 && send != recv) std::memmove(recv, send, bytes_per_rank);
    count(bytes_per_rank, Traffic::control);
  }

  void barrier() override {}

  [[noreturn]] void abort(int exit_code) override {
    // _Exit skips destructors and atexit handlers, so flush what was logged first.
    std::fflush(nullptr);
    std::_Exit(exit_code);
  }
};

}  // namespace

std::unique_ptr<Communicator> make_local_communicator() { return std::make_unique<LocalCommunicator>(); }

}  // namespace mix::collective
