#pragma once
// ImageFolder data sets (torchvision's layout): DIR/train/<class>/*.jpg and
// DIR/val/<class>/*.jpg, read on demand: each batch's JPEGs are decoded,
// cropped and resized on a pool of worker threads (image_transforms.h) into
// 8-bit pixels; the model normalises them (the image_normalize op).
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/dataset.h"
#include "runtime/data/image_transforms.h"

namespace mix::data {

/// One split's files, in torchvision's order: by class (sorted folder
/// names), then by path within the class folder (sub-folders included).
struct ImageFolderIndex {
  std::vector<std::string> classes;  // the split's class folders, sorted
  std::vector<std::string> files;    // paths relative to the split folder
  std::vector<int64_t> class_of;     // index into `classes`, per file
  bool from_cache = false;           // read from the cached listing, not walked
  std::string cache_file;            // where the listing is (or would be) cached
};

/// Lists `split_dir` (e.g. DIR/train): its class folders and their
/// .jpg/.jpeg/.png files (any case). The listing is cached in
/// <split_dir>/../.mixtrain-index-<split>.txt, or under `fallback_cache_dir`
/// when that folder is not writable, with the modification time of every
/// folder it walked: adding, removing or renaming a file or class changes a
/// folder's time, and the next start walks again. A missing split folder or an
/// empty class folder throws mix::Error naming it.
ImageFolderIndex list_image_folder(const std::string& split_dir, const std::string& fallback_cache_dir = "");

struct ImageFolderOptions {
  ImageTransformOptions transform;
  int workers = 1;            // decoding threads per source (--data-workers)
  bool skip_bad_images = false;  // replace an unreadable image by the next good one, with a warning
  uint64_t seed = 1;          // with the epoch and the example's index, seeds its crop and flip
  std::string fallback_cache_dir;  // where listings go when the data's folder is read-only ("": the temp folder)
};

/// DIR/train and DIR/val as a TrainTest read on demand: inputs u8 [size, size,
/// 3], RGB pixels (training's random crop and flip, or evaluation's resize and
/// centre crop; normalised by the model, not here), labels i64 class indices
/// by train's sorted class folders. A val
/// class that train lacks throws naming it. A missing val folder throws too.
TrainTest load_image_folder(const std::string& dir, const ImageFolderOptions& opt);

/// Where a split's encoded images are: image j's bytes and its name (a path,
/// or a shard and key) for messages. Both are called from worker threads.
struct EncodedImages {
  int64_t count = 0;
  std::function<std::string(int64_t)> bytes;
  std::function<std::string(int64_t)> name;
};

/// A batch source of encoded images with their labels: decoded and
/// transformed (training's or evaluation's, by `train`) into u8 [size, size,
/// 3] pixels on opt.workers threads; `where` names the split in messages.
std::shared_ptr<const ExampleSource> make_encoded_image_source(const std::string& where, EncodedImages images,
                                                               std::vector<int64_t> labels, bool train,
                                                               const ImageFolderOptions& opt);

/// Reads one split's images as a batch source. Exposed for tests.
std::shared_ptr<const ExampleSource> make_image_folder_source(const std::string& split_dir,
                                                              std::vector<std::string> files,
                                                              std::vector<int64_t> labels, bool train,
                                                              const ImageFolderOptions& opt);

/// --data-workers' default: the host's cores shared among the ranks on it
/// (from Open MPI's, MPICH's or Slurm's local-size variables), at least 1.
int default_data_workers();

}  // namespace mix::data
