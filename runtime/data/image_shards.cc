#include "runtime/data/image_shards.h"

#include <algorithm>
#include <filesystem>
#include <memory>

#include "runtime/core/check.h"
#include "runtime/data/tar_index.h"

namespace mix::data {

namespace fs = std::filesystem;

namespace {

// Labels are class indices the output layer has a row for: as the safetensors
// data set's rule, below 2^24.
constexpr int64_t kMaxLabel = (int64_t{1} << 24) - 1;

// DIR/<split>-*.tar, sorted by name.
std::vector<std::string> shards_of(const std::string& dir, const std::string& split) {
  std::vector<std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.rfind(split + "-", 0) == 0 && e.path().extension() == ".tar")
      out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  MIX_CHECK(!out.empty(), dir << ": no " << split << "-*.tar shard (--data image-shards reads DIR/train-000000.tar, "
                                 "..., and DIR/val-000000.tar, ...; scripts/make_image_shards.py writes them)");
  return out;
}

struct SplitSamples {
  EncodedImages images;
  std::vector<int64_t> labels;
  std::vector<int64_t> shard_sizes;  // samples per shard, in the index's order
};

SplitSamples split_samples(const std::string& dir, const std::string& split) {
  auto index = std::make_shared<const TarIndex>(index_tar_shards(shards_of(dir, split)));
  auto image_of = std::make_shared<std::vector<TarMemberSpan>>();
  // "SHARD:KEY.EXT" of each sample: the reader picks the decoder by the name's extension.
  auto names = std::make_shared<std::vector<std::string>>();
  SplitSamples out;
  out.shard_sizes.assign(index->shards.size(), 0);
  for (const TarSample& s : index->samples) {
    const std::string& shard = index->shards[static_cast<size_t>(s.shard)];
    const auto cls = s.members.find("cls");
    auto image = s.members.end();
    for (const char* ext : {"jpg", "jpeg", "png"})
      if (image == s.members.end()) image = s.members.find(ext);
    MIX_CHECK(image != s.members.end() && cls != s.members.end(),
              shard << ": sample '" << s.key << "' has no " << (image == s.members.end() ? ".jpg (or .png)" : ".cls")
                    << " member (each sample needs KEY.jpg or KEY.png, and KEY.cls)");
    names->push_back(shard + ":" + s.key + "." + image->first);
    ++out.shard_sizes[static_cast<size_t>(s.shard)];
    const std::vector<uint8_t> text = read_tar_member(shard, cls->second);
    const std::string digits(text.begin(), text.end());
    const size_t end = digits.find_last_not_of(" \n");
    const std::string trimmed = end == std::string::npos ? "" : digits.substr(0, end + 1);
    MIX_CHECK(!trimmed.empty() && trimmed.size() <= 8 && std::all_of(trimmed.begin(), trimmed.end(), ::isdigit) &&
                  std::stoll(trimmed) <= kMaxLabel,
              shard << ": sample '" << s.key << "' has the class '" << digits.substr(0, 32)
                    << "' in its .cls member; expected a class index 0.." << kMaxLabel);
    out.labels.push_back(std::stoll(trimmed));
    image_of->push_back(image->second);
  }
  MIX_CHECK(!out.labels.empty(), dir << ": the " << split << " shards hold no sample");
  out.images.count = static_cast<int64_t>(image_of->size());
  out.images.name = [names](int64_t j) { return (*names)[static_cast<size_t>(j)]; };
  out.images.bytes = [index, image_of](int64_t j) {
    const std::vector<uint8_t> b =
        read_tar_member(index->shards[static_cast<size_t>(index->samples[static_cast<size_t>(j)].shard)],
                        (*image_of)[static_cast<size_t>(j)]);
    return std::string(b.begin(), b.end());
  };
  return out;
}

}  // namespace

TrainTest load_image_shards(const std::string& dir, const ImageFolderOptions& opt) {
  MIX_CHECK(fs::is_directory(dir), dir << ": no such folder (--data-dir of --data image-shards)");
  SplitSamples train = split_samples(dir, "train");
  SplitSamples val = split_samples(dir, "val");
  const int64_t classes = *std::max_element(train.labels.begin(), train.labels.end()) + 1;
  for (size_t i = 0; i < val.labels.size(); ++i)
    MIX_CHECK(val.labels[i] < classes, val.images.name(static_cast<int64_t>(i))
                                           << ": class " << val.labels[i] << " is beyond the train shards' classes (0.."
                                           << classes - 1 << ")");
  TrainTest t;
  t.train.name = t.test.name = "image-shards";
  t.train.num_classes = t.test.num_classes = classes;
  t.train.shard_sizes = std::move(train.shard_sizes);
  t.test.shard_sizes = std::move(val.shard_sizes);
  t.train.source = make_encoded_image_source(dir + " (train shards)", std::move(train.images), std::move(train.labels),
                                             true, opt);
  t.test.source =
      make_encoded_image_source(dir + " (val shards)", std::move(val.images), std::move(val.labels), false, opt);
  return t;
}

}  // namespace mix::data
