// mixbench: collective bandwidth as mixtrain's gradient sync sees it.
//
//   mixrun -n 2 -- mixbench allreduce -b 1K -e 256M -f 2 -d half,float,bfloat16 -o sum -n 20 -w 5
//       [--check] [--csv FILE] [--device cpu|cuda]
//
// prints nccl-tests' all_reduce_perf table (size, count, type, redop, then
// time, algbw, busbw and #wrong out of place and in place) over MPI on host
// buffers, or over NCCL on device buffers with --device cuda.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>

#include "collective/communicator.h"
#include "collective/consistency.h"
#include "launch/allreduce_bench.h"
#include "launch/worker_main.h"

namespace {

/// CLI11 transform: "1K" / "256M" / "4096" -> bytes, with a message naming the value.
CLI::Validator byte_size() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        uint64_t v = 0;
        if (!mix::launch::parse_byte_size(text, v)) return "'" + text + "' is not a size (e.g. 1024, 1K, 256M, 1G)";
        return "";
      },
      "SIZE");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"mixbench: collective bandwidth through mixtrain's communicators (run one process per device)"};
  app.require_subcommand(1);
  mix::launch::AllreduceBenchConfig ar;
  std::string min_text = "1K", max_text = "32M";
  CLI::App* allreduce = app.add_subcommand("allreduce", "all-reduce time and bandwidth by size (nccl-tests' table)");
  allreduce->add_option("-b,--minbytes", min_text, "smallest size (1K)")->check(byte_size());
  allreduce->add_option("-e,--maxbytes", max_text, "largest size (32M)")->check(byte_size());
  allreduce->add_option("-f,--stepfactor", ar.factor, "each size is the last times this (2)")
      ->check(CLI::Range(1.0, 1024.0));
  allreduce->add_option("-d,--datatype", ar.types, "comma-separated: half, bfloat16, float (float)")
      ->delimiter(',')
      ->check(CLI::IsMember({"half", "f16", "float16", "bfloat16", "bf16", "float", "f32", "float32"}));
  allreduce->add_option("-o,--op", ar.ops, "comma-separated: sum, max, avg (sum)")
      ->delimiter(',')
      ->check(CLI::IsMember({"sum", "max", "avg"}));
  allreduce->add_option("-n,--iters", ar.iters, "timed calls per size (20)")->check(CLI::Range(1, 1000000));
  allreduce->add_option("-w,--warmup_iters", ar.warmup, "untimed calls per size first (5)")
      ->check(CLI::Range(0, 1000000));
  allreduce->add_flag("-c,--check", ar.check, "verify every result against exact expected values (#wrong)");
  allreduce->add_option("--csv", ar.csv, "also write the rows to this CSV file (rank 0)");
  allreduce->add_option("--device", ar.device, "cpu: MPI on host buffers; cuda: NCCL on device buffers (cpu)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  try {
    app.parse(argc, argv);
    mix::launch::parse_byte_size(min_text, ar.min_bytes);  // both checked by byte_size() above
    mix::launch::parse_byte_size(max_text, ar.max_bytes);
    if (ar.min_bytes > ar.max_bytes) throw CLI::ValidationError("-b", "-b " + min_text + " is larger than -e " + max_text);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "mixbench: " << e.what() << "\n(run mixbench allreduce --help for the flags)\n";
    return 2;
  }

  return mix::launch::run_worker("mixbench", [&](mix::collective::Communicator& comm) {
    // Every rank must run the same sizes and types, or one would wait forever.
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (auto& x : v) s += x + ",";
      return s;
    };
    mix::collective::check_same_on_all_ranks(
        comm, "mixbench configuration",
        {{"sizes", std::to_string(ar.min_bytes) + ".." + std::to_string(ar.max_bytes) + " x" + std::to_string(ar.factor)},
         {"types", list(ar.types)},
         {"ops", list(ar.ops)},
         {"iterations", std::to_string(ar.warmup) + "+" + std::to_string(ar.iters)},
         {"check", ar.check ? "on" : "off"},
         {"device", ar.device}});
    mix::Device device = mix::cpu_device();
    std::unique_ptr<mix::collective::Communicator> device_comm;
    if (ar.device == "cuda") {
      const int gpu = mix::collective::bind_device(comm);
      device = mix::Device{mix::DeviceKind::cuda, gpu};
      device_comm = mix::collective::make_device_communicator(comm, gpu);
    }
    const auto rows = mix::launch::run_allreduce_bench(ar, device_comm ? *device_comm : comm, device);
    int64_t wrong = 0;
    for (const auto& r : rows) wrong += std::max<int64_t>(r.wrong, 0) + std::max<int64_t>(r.wrong_ip, 0);
    return wrong == 0 ? 0 : 1;
  });
}
