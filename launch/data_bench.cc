#include "launch/data_bench.h"

#include <chrono>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/core/check.h"
#include "runtime/data/dataset.h"
#include "runtime/data/image_folder.h"
#include "runtime/data/image_shards.h"

namespace mix::launch {

namespace {

// The process's peak resident set (VmHWM), in bytes; 0 where /proc has none.
uint64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // "VmHWM:  1234 kB"
  return 0;
}

}  // namespace

void run_data_bench(const DataBenchConfig& c) {
  MIX_CHECK(c.data == DataSet::image_folder || c.data == DataSet::image_shards,
            "mixbench data reads --data image-folder or image-shards");
  data::ImageFolderOptions o;
  o.transform.size = c.image_size;
  o.transform.augment = c.augment == Augment::imagenet;
  o.workers = static_cast<int>(c.workers.value_or(data::default_data_workers()));
  o.seed = c.seed;
  const data::TrainTest tt =
      c.data == DataSet::image_folder ? data::load_image_folder(c.data_dir, o) : data::load_image_shards(c.data_dir, o);
  const data::Dataset& train = tt.train;
  MIX_CHECK(train.size() >= c.batch_size, c.data_dir << ": " << train.size() << " training images, fewer than one "
                                                     << "batch of " << c.batch_size);
  const data::DistributedSampler sampler(train.size(), 0, 1, /*shuffle=*/true, c.seed);
  std::vector<int64_t> order = sampler.indices(0);
  Tensor inputs, labels;
  const int64_t per_epoch = train.size() / c.batch_size;
  auto read_batch = [&](int64_t b) {
    const int64_t epoch = b / per_epoch;
    if (b % per_epoch == 0 && epoch > 0) order = sampler.indices(epoch);
    data::gather_batch(train, order, (b % per_epoch) * c.batch_size, c.batch_size, inputs, labels, nullptr, epoch);
  };
  for (int64_t b = 0; b < c.warmup; ++b) read_batch(b);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t b = c.warmup; b < c.warmup + c.batches; ++b) read_batch(b);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double rate = static_cast<double>(c.batches * c.batch_size) / secs;
  const uint64_t rss = peak_rss_bytes();
  std::cout << "data: " << to_string(c.data) << " " << c.data_dir << " (" << train.size()
            << " training images): " << c.batches << " batches of " << c.batch_size << " x " << c.image_size << " x "
            << c.image_size << " x 3 uint8 pixels in " << secs << " s: " << rate << " images/s, " << rate / o.workers
            << " images/s per worker (" << o.workers << " workers); peak resident set " << rss / (1024 * 1024) << " MiB"
            << std::endl;
  std::cout << nlohmann::json{{"images_per_s", rate},
                              {"images_per_s_per_worker", rate / o.workers},
                              {"workers", o.workers},
                              {"batches", c.batches},
                              {"batch_size", c.batch_size},
                              {"image_size", c.image_size},
                              {"training_images", train.size()},
                              {"peak_rss_bytes", rss}}
                   .dump()
            << std::endl;
}

}  // namespace mix::launch
