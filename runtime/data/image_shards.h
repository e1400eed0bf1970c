#pragma once
// WebDataset-style tar shards of images (--data image-shards): DIR/train-*.tar
// and DIR/val-*.tar, each sample a KEY.jpg (or .jpeg) and a KEY.cls holding its
// class index as decimal text (scripts/make_image_shards.py writes them from
// an image folder). The shards are indexed once at start (tar_index.h) and a
// batch reads just its samples' bytes, so the sampler, the seeded crops and
// the decoding are the image folder's: the same examples in the same order
// give the same batches, bit for bit.
#include <string>

#include "runtime/data/dataset.h"
#include "runtime/data/image_folder.h"

namespace mix::data {

/// DIR's train and val shards as a TrainTest read on demand (as
/// load_image_folder). No train or val shard, a sample without an image or a
/// .cls member, or a .cls that is not a class index: mix::Error naming the
/// shard and the sample's key.
TrainTest load_image_shards(const std::string& dir, const ImageFolderOptions& opt);

}  // namespace mix::data
