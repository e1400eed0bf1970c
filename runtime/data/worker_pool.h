#pragma once
// A fixed set of threads that run one parallel loop at a time: the
// image-folder source decodes a batch's images on them. The calling thread
// works too, so a pool of N runs N loops bodies at once with N - 1 threads.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace mix::data {

class WorkerPool {
 public:
  explicit WorkerPool(int workers);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int workers() const { return static_cast<int>(threads_.size()) + 1; }
  /// Runs body(i) for every i in [0, n), spread over the workers; returns when
  /// all are done. The first exception a body throws is rethrown here (the
  /// other bodies still run). One loop at a time: calls are serialised.
  void parallel_for(int64_t n, const std::function<void(int64_t)>& body);

 private:
  void run_items();
  void thread_main();

  std::vector<std::thread> threads_;
  std::mutex call_mu_;  // one parallel_for at a time
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  const std::function<void(int64_t)>* body_ = nullptr;
  int64_t n_ = 0, next_ = 0, finished_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace mix::data
