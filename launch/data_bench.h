#pragma once
// `mixbench data`: images/s of the image readers (decode, crop, resize and
// batch into uint8 NHWC pixels; no training), over a folder or shards, as
// many batches as asked, with N decoding threads. The normalisation is not
// timed: it is the model's first op (image_normalize), on the training device.
// The reference is torchvision's ImageFolder + DataLoader with the same
// transforms and as many workers, ToTensor and Normalize included
// (scripts/bench_data_torchvision.py; scripts/bench_data.sh runs both).
#include <cstdint>
#include <optional>
#include <string>

#include "launch/train_config.h"

namespace mix::launch {

struct DataBenchConfig {
  DataSet data = DataSet::image_folder;  // image-folder or image-shards
  std::string data_dir;
  int64_t image_size = 224;
  int64_t batch_size = 64;
  std::optional<int64_t> workers;  // unset: data::default_data_workers()
  int64_t batches = 20, warmup = 2;
  uint64_t seed = 1;
  Augment augment = Augment::imagenet;
};

/// Reads warmup + batches training batches of the sampler's first epoch
/// (shuffled), times the last `batches`, and prints the rate in all and per
/// worker, the peak resident set, and one JSON line of the same figures.
void run_data_bench(const DataBenchConfig& c);

}  // namespace mix::launch
