#pragma once
// `mixbench allreduce`: the all-reduce bandwidth table of nccl-tests'
// all_reduce_perf, measured through mixtrain's own Communicator (MPI on host
// buffers, NCCL on device buffers), so the figures are those gradient sync sees.
#include <cstdint>
#include <string>
#include <vector>

#include "collective/communicator.h"
#include "runtime/core/device.h"
#include "runtime/core/tensor.h"

namespace mix::launch {

struct AllreduceBenchConfig {
  uint64_t min_bytes = 1024;                    // -b
  uint64_t max_bytes = 32ull << 20;             // -e
  double factor = 2;                            // -f: each size is the last times this
  std::vector<std::string> types = {"float"};   // -d: half, bfloat16, float
  std::vector<std::string> ops = {"sum"};       // -o: sum, max, avg
  int iters = 20;                               // -n: timed iterations per size
  int warmup = 5;                               // -w: untimed iterations per size
  bool check = false;                           // verify every result against exact expected values
  std::string csv;                              // write the rows as CSV too
  DeviceKind device = DeviceKind::cpu;          // cpu (MPI, host buffers) or cuda (NCCL, device buffers)
};

/// One row of the table: one size, dtype and reduction.
struct AllreduceRow {
  uint64_t bytes = 0, count = 0;
  std::string type, redop;
  // out-of-place, then in-place: mean time per call of the slowest rank, its
  // algorithm and bus bandwidth (GB/s, 1e9 bytes), and wrong elements (-1: not checked)
  double time_us = 0, algbw = 0, busbw = 0;
  int64_t wrong = -1;
  double time_us_ip = 0, algbw_ip = 0, busbw_ip = 0;
  int64_t wrong_ip = -1;
};

/// "1K", "256M", "1G", "4096": bytes (K, M, G are powers of 1024, as in
/// nccl-tests). Returns false when the text is not such a size.
bool parse_byte_size(const std::string& text, uint64_t& out);

/// Bus bandwidth from algorithm bandwidth for an all-reduce over `world`
/// ranks: busbw = algbw * 2 (world - 1) / world, the factor that makes a ring
/// all-reduce's figure comparable with the link speed (nccl-tests' definition).
double allreduce_bus_factor(int world);

/// --check's data: rank r's value at element i, small integers exact in every
/// dtype, and the exact reduction of element i over `world` ranks.
double check_pattern_value(int rank, uint64_t i);
double check_expected_value(collective::ReduceOp op, int world, uint64_t i);
/// Elements of an all-reduce result (any device) farther from the exact value
/// than the dtype allows (0 where every partial sum is an exact integer).
int64_t count_wrong_elements(const Tensor& result, collective::ReduceOp op, int world);

/// Runs the benchmark on every rank (all ranks must pass the same config);
/// rank 0 prints the table and writes the CSV. Returns the rows (on every rank).
/// `comm` is measured (buffers on `device`); `host_comm` (the same one on the
/// CPU) carries the timings and wrong-element counts, which live in host memory.
std::vector<AllreduceRow> run_allreduce_bench(const AllreduceBenchConfig& c, collective::Communicator& comm,
                                              collective::Communicator& host_comm, Device device);

}  // namespace mix::launch
