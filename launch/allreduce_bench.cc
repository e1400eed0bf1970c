#include "launch/allreduce_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "runtime/core/check.h"
#include "runtime/core/half.h"
#include "runtime/core/tensor.h"

namespace mix::launch {

namespace {

using collective::ReduceOp;
using Clock = std::chrono::steady_clock;

DType dtype_of(const std::string& name) {
  if (name == "half" || name == "f16" || name == "float16") return DType::f16;
  if (name == "bfloat16" || name == "bf16") return DType::bf16;
  if (name == "float" || name == "f32" || name == "float32") return DType::f32;
  MIX_FAIL("mixbench: unknown type '" << name << "' (use half, bfloat16 or float)");
}

// nccl-tests' name of a dtype.
std::string type_name(DType t) { return t == DType::f16 ? "half" : t == DType::bf16 ? "bfloat16" : "float"; }

ReduceOp op_of(const std::string& name) {
  if (name == "sum") return ReduceOp::sum;
  if (name == "max") return ReduceOp::max;
  if (name == "avg") return ReduceOp::avg;
  MIX_FAIL("mixbench: unknown reduction '" << name << "' (use sum, max or avg)");
}

// ---- the data: closed-form values whose reductions are known exactly ---------------
// Rank r holds x[i] = (r % 4 + 1) * (i % 3 + 1): small integers, exact in every
// dtype, so a sum over ranks is exact at every hop as long as it stays within
// the dtype's run of consecutive integers (2^8 in bfloat16, 2^11 in half, 2^24
// in float). Partial sums are at most 12 per rank, so that holds up to 21
// ranks in bfloat16 and 170 in half; past that the check allows one rounding
// per hop.

// Significand bits of a dtype (the integers up to 2^bits are all exact).
int significand_bits(DType t) { return t == DType::f16 ? 11 : t == DType::bf16 ? 8 : 24; }

// Allowed |got - expected| of element i: 0 where every partial sum is exact;
// an avg's scaling by 1/world rounds twice (the factor and the product), and
// sums beyond the exact-integer range round once per hop.
double allowed_error(ReduceOp op, DType t, int world, double want) {
  const double ulp = std::ldexp(1.0, 1 - significand_bits(t));  // relative spacing
  const double max_sum = 3.0 * 4.0 * world;                      // bound on any partial sum
  double err = 0;
  if (max_sum > std::ldexp(1.0, significand_bits(t))) err += world * ulp * max_sum;
  if (op == ReduceOp::avg) err += 2 * ulp * std::fabs(want);
  return err;
}

// A host tensor of `count` elements of dtype t holding this rank's values.
Tensor pattern(DType t, uint64_t count, int rank) {
  Tensor h = Tensor::empty({static_cast<int64_t>(count)}, t);
  for (uint64_t i = 0; i < count; ++i)
    h.set_float(static_cast<int64_t>(i), static_cast<float>(check_pattern_value(rank, i)));
  return h;
}

}  // namespace

double check_pattern_value(int rank, uint64_t i) {
  return static_cast<double>((rank % 4 + 1) * static_cast<int>(i % 3 + 1));
}

double check_expected_value(ReduceOp op, int world, uint64_t i) {
  double sum = 0, max = 0;
  for (int r = 0; r < world; ++r) {
    sum += check_pattern_value(r, i);
    max = std::max(max, check_pattern_value(r, i));
  }
  return op == ReduceOp::max ? max : op == ReduceOp::avg ? sum / world : sum;
}

int64_t count_wrong_elements(const Tensor& result, ReduceOp op, int world) {
  const Tensor h = result.to(cpu_device());
  int64_t wrong = 0;
  for (int64_t i = 0; i < h.numel(); ++i) {
    const double want = check_expected_value(op, world, static_cast<uint64_t>(i));
    const double got = h.item_float(i);
    if (!(std::fabs(got - want) <= allowed_error(op, h.dtype(), world, want))) ++wrong;
  }
  return wrong;
}

namespace {

// The slowest rank's mean microseconds per call of `iters` calls of `call`
// on `comm`; the figures travel over `host` (host memory).
template <typename F>
double time_calls(collective::Communicator& comm, collective::Communicator& host, int warmup, int iters, F&& call) {
  for (int i = 0; i < warmup; ++i) call();
  comm.barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) call();
  comm.synchronize();
  float us = static_cast<float>(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters);
  host.all_reduce(&us, 1, DType::f32, ReduceOp::max);
  return us;
}

std::vector<uint64_t> sizes_of(const AllreduceBenchConfig& c) {
  MIX_CHECK(c.min_bytes > 0 && c.min_bytes <= c.max_bytes,
            "mixbench: -b " << c.min_bytes << " must be positive and at most -e " << c.max_bytes);
  MIX_CHECK(c.factor > 1 || c.min_bytes == c.max_bytes, "mixbench: -f must be greater than 1, got " << c.factor);
  std::vector<uint64_t> sizes;
  for (double s = static_cast<double>(c.min_bytes); s <= static_cast<double>(c.max_bytes) * (1 + 1e-12);
       s *= c.factor) {
    const auto bytes = static_cast<uint64_t>(s);
    if (sizes.empty() || bytes != sizes.back()) sizes.push_back(bytes);
    if (c.factor <= 1) break;
  }
  return sizes;
}

void print_header(const AllreduceBenchConfig& c, collective::Communicator& comm, Device device) {
  std::printf("# mixbench allreduce: %d rank(s), backend %s (%s buffers), %d iterations after %d warm-up per size\n",
              comm.world_size(), comm.backend_name().c_str(), device.kind == DeviceKind::cpu ? "host" : "device",
              c.iters, c.warmup);
  std::printf("# time: the slowest rank's mean per call; algbw = size / time; busbw = algbw * 2(n-1)/n = algbw * %.3f\n",
              allreduce_bus_factor(comm.world_size()));
  std::printf("#%58s%-34s%-34s\n", "", "          out-of-place", "          in-place");
  std::printf("#%12s %12s %9s %6s %9s %8s %8s %6s %9s %8s %8s %6s\n", "size", "count", "type", "redop", "time",
              "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  std::printf("#%12s %12s %9s %6s %9s %8s %8s %6s %9s %8s %8s %6s\n", "(B)", "(elements)", "", "", "(us)", "(GB/s)",
              "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

std::string wrong_text(int64_t w) { return w < 0 ? "N/A" : std::to_string(w); }

void print_row(const AllreduceRow& r) {
  std::printf(" %12llu %12llu %9s %6s %9.2f %8.3f %8.3f %6s %9.2f %8.3f %8.3f %6s\n",
              static_cast<unsigned long long>(r.bytes), static_cast<unsigned long long>(r.count), r.type.c_str(),
              r.redop.c_str(), r.time_us, r.algbw, r.busbw, wrong_text(r.wrong).c_str(), r.time_us_ip, r.algbw_ip,
              r.busbw_ip, wrong_text(r.wrong_ip).c_str());
}

void write_csv(const std::string& path, const std::vector<AllreduceRow>& rows, int world,
               const std::string& backend) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    MIX_CHECK(f, "mixbench: cannot write " << tmp << " (check the directory exists and is writable)");
    f << "size,count,type,redop,time_us,algbw,busbw,wrong,time_us_ip,algbw_ip,busbw_ip,wrong_ip,world,backend\n";
    for (const AllreduceRow& r : rows)
      f << r.bytes << ',' << r.count << ',' << r.type << ',' << r.redop << ',' << r.time_us << ',' << r.algbw << ','
        << r.busbw << ',' << r.wrong << ',' << r.time_us_ip << ',' << r.algbw_ip << ',' << r.busbw_ip << ','
        << r.wrong_ip << ',' << world << ',' << backend << '\n';
    MIX_CHECK(f.good(), "mixbench: writing " << tmp << " failed (disk full?)");
  }
  std::rename(tmp.c_str(), path.c_str());
}

}  // namespace

bool parse_byte_size(const std::string& text, uint64_t& out) {
  if (text.empty()) return false;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  std::string suffix = text.substr(used);
  double mult = 1;
  if (suffix == "K" || suffix == "k") mult = 1024.0;
  else if (suffix == "M" || suffix == "m") mult = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g") mult = 1024.0 * 1024 * 1024;
  else if (!suffix.empty()) return false;
  if (!(v > 0) || !std::isfinite(v)) return false;
  out = static_cast<uint64_t>(v * mult);
  return out > 0;
}

double allreduce_bus_factor(int world) { return world > 0 ? 2.0 * (world - 1) / world : 0.0; }

std::vector<AllreduceRow> run_allreduce_bench(const AllreduceBenchConfig& c, collective::Communicator& comm,
                                              collective::Communicator& host_comm, Device device) {
  MIX_CHECK(c.iters > 0 && c.warmup >= 0, "mixbench: -n must be positive and -w non-negative");
  const std::vector<uint64_t> sizes = sizes_of(c);
  const int rank = comm.rank(), world = comm.world_size();
  if (rank == 0) print_header(c, comm, device);
  std::vector<AllreduceRow> rows;
  double busbw_sum = 0;
  int64_t total_wrong = 0;
  for (const std::string& tname : c.types) {
    const DType t = dtype_of(tname);
    const uint64_t max_count = c.max_bytes / dtype_size(t);
    if (max_count == 0) continue;
    // Buffers for the largest size, used by prefix. The checked calls run on
    // fresh copies of the pattern, after the timed ones.
    const Tensor host = pattern(t, max_count, rank);
    Tensor send = host.to(device).clone();
    Tensor recv = Tensor::zeros({static_cast<int64_t>(max_count)}, t, device);
    for (const std::string& oname : c.ops) {
      const ReduceOp op = op_of(oname);
      for (uint64_t bytes : sizes) {
        const uint64_t count = bytes / dtype_size(t);
        if (count == 0) continue;
        AllreduceRow r;
        r.count = count;
        r.bytes = count * dtype_size(t);
        r.type = type_name(t);
        r.redop = oname;
        const double gb = static_cast<double>(r.bytes) / 1e9;
        r.time_us = time_calls(comm, host_comm, c.warmup, c.iters, [&] {
          comm.all_reduce_into(send.raw(), recv.raw(), count, t, op);
        });
        // In place: the values grow with every call; only the timing uses them.
        r.time_us_ip =
            time_calls(comm, host_comm, c.warmup, c.iters, [&] { comm.all_reduce(recv.raw(), count, t, op); });
        r.algbw = gb / (r.time_us * 1e-6);
        r.busbw = r.algbw * allreduce_bus_factor(world);
        r.algbw_ip = gb / (r.time_us_ip * 1e-6);
        r.busbw_ip = r.algbw_ip * allreduce_bus_factor(world);
        if (c.check) {
          Tensor out = Tensor::zeros({static_cast<int64_t>(count)}, t, device);
          Tensor in = pattern(t, count, rank).to(device).clone();
          comm.all_reduce_into(in.raw(), out.raw(), count, t, op);
          int64_t wrong[2] = {count_wrong_elements(out, op, world), 0};
          comm.all_reduce(in.raw(), count, t, op);  // in place on a fresh copy of the pattern
          wrong[1] = count_wrong_elements(in, op, world);
          // Any rank's wrong elements count: sum them over ranks.
          float w[2] = {static_cast<float>(wrong[0]), static_cast<float>(wrong[1])};
          host_comm.all_reduce(w, 2, DType::f32, ReduceOp::sum);
          r.wrong = static_cast<int64_t>(w[0]);
          r.wrong_ip = static_cast<int64_t>(w[1]);
          total_wrong += r.wrong + r.wrong_ip;
        }
        busbw_sum += r.busbw + r.busbw_ip;  // nccl-tests averages both calls of each row
        if (rank == 0) {
          print_row(r);
          std::fflush(stdout);
        }
        rows.push_back(r);
      }
    }
  }
  if (rank == 0) {
    std::printf("# Out of bounds values : %lld %s\n", static_cast<long long>(c.check ? total_wrong : 0),
                c.check ? (total_wrong == 0 ? "OK" : "FAILED") : "(not checked: add --check)");
    std::printf("# Avg bus bandwidth    : %.3f GB/s\n",
                rows.empty() ? 0.0 : busbw_sum / static_cast<double>(2 * rows.size()));
    if (!c.csv.empty()) write_csv(c.csv, rows, world, comm.backend_name());
  }
  return rows;
}

}  // namespace mix::launch
