// mixbench: collective bandwidth as mixtrain's gradient sync sees it.
//
//   mixrun -n 2 -- mixbench allreduce -b 1K -e 256M -f 2 -d half,float,bfloat16 -o sum -n 20 -w 5
//       [--check] [--csv FILE] [--device cpu|cuda]
//   mixrun -n 2 -- mixbench grad-sync --model resnet50 --precision amp --grad-reduce fp16 [--bucket-mb 25]
//       [-n 20] [-w 5] [--csv FILE] [--device cpu|cuda]
//
// allreduce prints nccl-tests' all_reduce_perf table (size, count, type, redop,
// then time, algbw, busbw and #wrong out of place and in place); grad-sync
// times the gradient all-reduces of one training step of a model, bucketed as
// mixtrain buckets them. Both run over MPI on host buffers, or over NCCL on
// device buffers with --device cuda.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <functional>
#include <iostream>
#include <thread>

#include "collective/communicator.h"
#include "collective/consistency.h"
#include "launch/allreduce_bench.h"
#include "launch/data_bench.h"
#include "launch/cli_checks.h"
#include "launch/cli_help.h"
#include "launch/grad_sync_bench.h"
#include "launch/make_images.h"
#include "launch/train_program.h"
#include "launch/worker_main.h"

namespace {

// CLI11 transform: "1K" / "256M" / "4096" -> bytes, with a message naming the value.
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
  CLI::App app{"mixbench: collective bandwidth through mixtrain's communicators (run one process per device)",
               "mixbench"};
  app.formatter(mix::launch::help_formatter());
  app.set_version_flag("--version", [] { return mix::launch::version_text("mixbench"); },
                       "print the version, the commit and the libraries of this build, and exit");
  app.footer("Run one process per device: mixrun -n 2 -- mixbench allreduce ...\ndocs/bandwidth.md explains the "
             "tables, algbw and busbw.\n");
  app.require_subcommand(1);
  mix::launch::AllreduceBenchConfig ar;
  std::string min_text = "1K", max_text = "32M";
  CLI::App* allreduce = app.add_subcommand("allreduce", "all-reduce time and bandwidth by size (nccl-tests' table)");
  allreduce->option_defaults()->always_capture_default();
  allreduce->add_option("-b,--minbytes", min_text, "smallest size")->check(byte_size())->type_name("SIZE");
  allreduce->add_option("-e,--maxbytes", max_text, "largest size")->check(byte_size())->type_name("SIZE");
  allreduce->add_option("-f,--stepfactor", ar.factor, "each size is the last times this")
      ->check(mix::launch::number_in(1.0, 1024.0));
  allreduce->add_option("-d,--datatype", ar.types, "comma-separated dtypes (f16, float16, bf16, f32, float32 too)")
      ->delimiter(',')
      ->check(mix::launch::one_of({"half", "f16", "float16", "bfloat16", "bf16", "float", "f32", "float32"}))
      ->type_name("half|bfloat16|float");
  allreduce->add_option("-o,--op", ar.ops, "comma-separated reductions")
      ->delimiter(',')
      ->check(mix::launch::one_of({"sum", "max", "avg"}))
      ->type_name("sum|max|avg");
  allreduce->add_option("-n,--iters", ar.iters, "timed calls per size")->check(CLI::Range(1, 1000000));
  allreduce->add_option("-w,--warmup_iters", ar.warmup, "untimed calls per size first")
      ->check(CLI::Range(0, 1000000));
  allreduce->add_flag("-c,--check", ar.check, "verify every result against exact expected values (#wrong)");
  allreduce->add_option("--csv", ar.csv, "also write the rows to this CSV file (rank 0)");
  allreduce->formatter(app.get_formatter());
  mix::launch::add_choice(*allreduce, "--device", ar.device, mix::kDeviceKindNames,
                          "cpu: MPI on host buffers; cuda: NCCL on device buffers");

  mix::launch::GradSyncBenchConfig gs;
  CLI::App* grad_sync = app.add_subcommand("grad-sync", "one training step's gradient all-reduces of a model");
  grad_sync->formatter(app.get_formatter());
  grad_sync->option_defaults()->always_capture_default();
  grad_sync->add_option("--model", gs.model, "the model whose gradients to all-reduce, at its default size")
      ->check(mix::launch::one_of({"mlp", "resnet18", "resnet34", "resnet50", "resnet-small", "transformer", "gpt2"}))
      ->type_name("mlp|resnet18|resnet34|resnet50|resnet-small|transformer|gpt2");
  mix::launch::add_choice(*grad_sync, "--precision", gs.precision, mix::amp::kPrecisionNames,
                          "the training program's precision, as mixtrain's");
  mix::launch::add_choice(*grad_sync, "--grad-reduce", gs.grad_reduce, mix::collective::kGradReduceNames,
                          "dtype of the all-reduce: fp16 (the FP16 gradients, before their cast; amp only) or fp32",
                          "fp16 under amp, fp32 under fp32, as mixtrain");
  grad_sync->add_option("--bucket-mb", gs.bucket_mb, "largest gradient bucket in MB")
      ->check(mix::launch::number_in(1e-6, 1e6));
  grad_sync->add_option("-n,--iters", gs.iters, "timed syncs")->check(CLI::Range(1, 1000000));
  grad_sync->add_option("-w,--warmup_iters", gs.warmup, "untimed syncs first")->check(CLI::Range(0, 1000000));
  grad_sync->add_option("--csv", gs.csv, "append a row to this CSV file (rank 0)");
  mix::launch::add_choice(*grad_sync, "--device", gs.device, mix::kDeviceKindNames,
                          "cpu: MPI on host buffers; cuda: NCCL on device buffers");
  mix::launch::DataBenchConfig db;
  CLI::App* data_bench = app.add_subcommand("data", "images/s of the image readers: decode, crop, resize, normalise, batch");
  data_bench->formatter(app.get_formatter());
  data_bench->option_defaults()->always_capture_default();
  mix::launch::add_choice(*data_bench, "--data", db.data, mix::launch::kDataSetNames,
                          "image-folder or image-shards (the other data sets are in memory)");
  data_bench->add_option("--data-dir", db.data_dir, "the folder (DIR/train/<class>/*.jpg) or the shards' folder")
      ->required();
  data_bench->add_option("--image-size", db.image_size, "crop size")->check(CLI::Range(1, 4096));
  data_bench->add_option("--batch-size", db.batch_size, "images a batch")->check(CLI::Range(1, 1000000));
  data_bench->add_option("--data-workers", db.workers, "decoding threads")
      ->check(CLI::Range(1, 1024))
      ->default_str("the host's cores divided among its ranks");
  data_bench->add_option("--batches", db.batches, "timed batches")->check(CLI::Range(1, 1000000));
  data_bench->add_option("--warmup", db.warmup, "untimed batches first")->check(CLI::Range(0, 1000000));
  data_bench->add_option("--seed", db.seed, "seed of the order and the crops");
  mix::launch::add_choice(*data_bench, "--augment", db.augment, mix::launch::kAugmentNames,
                          "imagenet: the training crops and flips; none: evaluation's resize and centre crop");
  mix::launch::MakeImagesConfig mi;
  mi.workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  CLI::App* make_images =
      app.add_subcommand("make-images", "write a synthetic JPEG image folder (DIR/train/c<k>/, DIR/val/c<k>/)");
  make_images->formatter(app.get_formatter());
  make_images->option_defaults()->always_capture_default();
  make_images->add_option("--out", mi.out, "the folder to write")->required();
  make_images->add_option("--train", mi.train, "training images")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  make_images->add_option("--val", mi.val, "validation images")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  make_images->add_option("--classes", mi.classes, "class folders")->check(CLI::Range(1, 1000000));
  make_images->add_option("--width", mi.width, "image width")->check(CLI::Range(8, 16384));
  make_images->add_option("--height", mi.height, "image height")->check(CLI::Range(8, 16384));
  make_images->add_option("--quality", mi.quality, "JPEG quality")->check(CLI::Range(1, 100));
  make_images->add_option("--seed", mi.seed, "seed of the images");
  make_images->add_option("--workers", mi.workers, "encoding threads")->check(CLI::Range(1, 1024));
  if (auto stop = mix::launch::parse_command_line(app, argc, argv)) return *stop;
  // The one-process subcommands: no communicator, this host alone.
  auto run_alone = [](const char* name, const std::function<void()>& work) {
    try {
      work();
      return 0;
    } catch (const std::exception& e) {
      std::cerr << "mixbench " << name << ": " << e.what() << "\n";
      return 1;
    }
  };
  if (make_images->parsed()) return run_alone("make-images", [&] { mix::launch::run_make_images(mi); });
  if (data_bench->parsed()) return run_alone("data", [&] { mix::launch::run_data_bench(db); });
  auto bad = [](const std::string& msg) {
    std::cerr << "mixbench: " << msg << "\n";
    return 2;
  };
  mix::launch::parse_byte_size(min_text, ar.min_bytes);  // both checked by byte_size() above
  mix::launch::parse_byte_size(max_text, ar.max_bytes);
  if (ar.min_bytes > ar.max_bytes) return bad("-b " + min_text + " is larger than -e " + max_text);
  if (ar.factor <= 1 && ar.min_bytes != ar.max_bytes)
    return bad("-f must be above 1 to go from -b " + min_text + " to -e " + max_text +
               " (or give -b and -e the same size)");
  if (grad_sync->parsed())
    if (const std::string why = mix::launch::grad_reduce_conflict(
            gs.precision, gs.grad_reduce.value_or(mix::launch::default_grad_reduce(gs.precision)));
        !why.empty())
      return bad(why);

  const bool is_allreduce = allreduce->parsed();
  return mix::launch::run_worker("mixbench", [&](mix::collective::Communicator& comm) {
    // Every rank must run the same benchmark, or one would wait forever.
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      for (auto& x : v) s += x + ",";
      return s;
    };
    mix::collective::Fields fields;
    if (is_allreduce)
      fields = {{"benchmark", "allreduce"},
                {"sizes", std::to_string(ar.min_bytes) + ".." + std::to_string(ar.max_bytes) + " x" +
                              std::to_string(ar.factor)},
                {"types", list(ar.types)},
                {"ops", list(ar.ops)},
                {"iterations", std::to_string(ar.warmup) + "+" + std::to_string(ar.iters)},
                {"check", ar.check ? "on" : "off"},
                {"device", std::string(mix::to_string(ar.device))}};
    else
      fields = {{"benchmark", "grad-sync"},
                {"model", gs.model},
                {"precision", std::string(mix::amp::to_string(gs.precision))},
                {"grad-reduce", gs.grad_reduce ? std::string(mix::collective::to_string(*gs.grad_reduce)) : "default"},
                {"bucket-mb", std::to_string(gs.bucket_mb)},
                {"iterations", std::to_string(gs.warmup) + "+" + std::to_string(gs.iters)},
                {"device", std::string(mix::to_string(gs.device))}};
    mix::collective::check_same_on_all_ranks(comm, "mixbench configuration", fields);
    mix::Device device = mix::cpu_device();
    std::unique_ptr<mix::collective::Communicator> device_comm;
    if ((is_allreduce ? ar.device : gs.device) == mix::DeviceKind::cuda) {
      const int gpu = mix::collective::bind_device(comm);
      device = mix::Device{mix::DeviceKind::cuda, gpu};
      device_comm = mix::collective::make_device_communicator(comm, gpu);
    }
    mix::collective::Communicator& bench_comm = device_comm ? *device_comm : comm;
    if (!is_allreduce) {
      mix::launch::run_grad_sync_bench(gs, bench_comm, comm, device);
      return 0;
    }
    const auto rows = mix::launch::run_allreduce_bench(ar, bench_comm, comm, device);
    int64_t wrong = 0;
    for (const auto& r : rows) wrong += std::max<int64_t>(r.wrong, 0) + std::max<int64_t>(r.wrong_ip, 0);
    return wrong == 0 ? 0 : 1;
  });
}
