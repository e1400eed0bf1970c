#include "runtime/data/worker_pool.h"

#include <algorithm>

namespace mix::data {

WorkerPool::WorkerPool(int workers) {
  for (int i = 1; i < std::max(workers, 1); ++i) threads_.emplace_back([this] { thread_main(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : threads_) t.join();
}

// Takes items one at a time until none are left: images differ in cost, so
// handing out single items keeps every worker busy to the end.
void WorkerPool::run_items() {
  std::unique_lock<std::mutex> lock(mu_);
  while (next_ < n_) {
    const int64_t i = next_++;
    const auto* body = body_;
    lock.unlock();
    try {
      (*body)(i);
    } catch (...) {
      lock.lock();
      if (!error_) error_ = std::current_exception();
      lock.unlock();
    }
    lock.lock();
    if (++finished_ == n_) done_cv_.notify_all();
  }
}

void WorkerPool::thread_main() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_items();
  }
}

void WorkerPool::parallel_for(int64_t n, const std::function<void(int64_t)>& body) {
  if (n <= 0) return;
  std::lock_guard<std::mutex> call(call_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    body_ = &body;
    n_ = n;
    next_ = 0;
    finished_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  work_cv_.notify_all();
  run_items();
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return finished_ == n_; });
    error = error_;
    body_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace mix::data
