#pragma once
// `mixbench grad-sync`: the gradient all-reduces of one training step of a real
// model, bucketed exactly as mixtrain buckets them (the same passes build the
// program), timed without the forward and backward around them.
#include <cstdint>
#include <string>

#include <optional>

#include "amp/precision.h"
#include "collective/communicator.h"
#include "collective/grad_allreduce_pass.h"
#include "runtime/core/device.h"

namespace mix::launch {

struct GradSyncBenchConfig {
  std::string model = "resnet50";  // mlp, resnet18/34/50, resnet-small, transformer (default sizes)
  amp::Precision precision = amp::Precision::amp;
  std::optional<collective::GradReduce> grad_reduce;  // unset: the precision's (launch/train_program.h)
  double bucket_mb = 25;
  int iters = 20, warmup = 5;
  std::string csv;  // append one row (rank 0)
  DeviceKind device = DeviceKind::cpu;
};

struct GradSyncResult {
  int buckets = 0;
  int64_t tensors = 0;
  uint64_t bytes = 0;  // payload bytes per rank per sync
  double time_us = 0, algbw = 0, busbw = 0;  // slowest rank's mean per sync; GB/s
};

/// Builds the model's training program, runs its gradient all-reduces
/// warmup + iters times on every rank, and prints (rank 0) what one sync moves
/// and costs. Every rank must pass the same config. `comm` is measured;
/// `host_comm` (the same one on the CPU) carries the timings.
GradSyncResult run_grad_sync_bench(const GradSyncBenchConfig& c, collective::Communicator& comm,
                                   collective::Communicator& host_comm, Device device);

}  // namespace mix::launch
