#include "runtime/data/image_folder.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "runtime/core/check.h"
#include "runtime/core/hash.h"
#include "runtime/core/random.h"
#include "runtime/data/worker_pool.h"

namespace mix::data {
namespace fs = std::filesystem;
namespace {

constexpr const char* kIndexHeader = "mixtrain-image-index 1";

bool is_image_name(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// A folder's modification time in nanoseconds: it changes whenever an entry
// is added, removed or renamed in it, which is what makes a listing stale.
int64_t mtime_ns(const fs::path& p) {
  return static_cast<int64_t>(fs::last_write_time(p).time_since_epoch().count());
}

// The walk's result before labels: the folders seen (for the cache's check)
// and the files, relative to the split folder.
struct Listing {
  std::vector<std::pair<std::string, int64_t>> dirs;  // relative path ("." for the split), mtime
  std::vector<std::string> classes;
  std::vector<std::string> files;
  std::vector<int64_t> class_of;
};

Listing walk(const fs::path& split) {
  Listing l;
  l.dirs.emplace_back(".", mtime_ns(split));
  for (const auto& e : fs::directory_iterator(split))
    if (e.is_directory()) l.classes.push_back(e.path().filename().string());
  // Byte order of UTF-8 names is code point order, Python's sorted().
  std::sort(l.classes.begin(), l.classes.end());
  MIX_CHECK(!l.classes.empty(), split.string() << ": no class folders (expected " << split.string()
                                               << "/<class>/*.jpg, torchvision's ImageFolder layout)");
  for (size_t c = 0; c < l.classes.size(); ++c) {
    const fs::path cls = split / l.classes[c];
    std::vector<std::string> files;
    l.dirs.emplace_back(l.classes[c], mtime_ns(cls));
    for (auto it = fs::recursive_directory_iterator(cls, fs::directory_options::follow_directory_symlink);
         it != fs::recursive_directory_iterator(); ++it) {
      if (it->is_directory()) {
        l.dirs.emplace_back(fs::relative(it->path(), split).string(), mtime_ns(it->path()));
      } else if (is_image_name(it->path())) {
        files.push_back(fs::relative(it->path(), split).string());
      }
    }
    MIX_CHECK(!files.empty(), cls.string() << ": an empty class folder (no .jpg, .jpeg or .png file): remove it or "
                                              "add its images");
    // torchvision sorts by folder, then by name within it.
    std::sort(files.begin(), files.end(), [](const std::string& a, const std::string& b) {
      const fs::path pa(a), pb(b);
      const std::string da = pa.parent_path().string(), db = pb.parent_path().string();
      return da != db ? da < db : pa.filename().string() < pb.filename().string();
    });
    for (auto& f : files) {
      l.files.push_back(std::move(f));
      l.class_of.push_back(static_cast<int64_t>(c));
    }
  }
  return l;
}

// A whole decimal integer, or false (a damaged cache is walked again, never an error).
bool parse_int64(const std::string& text, int64_t& out) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end && !text.empty();
}

// The cache: a header, one "dir <mtime> <path>" line per folder walked, then
// "class <name>" lines in order, then "file <class> <path>" lines. Paths run
// to the end of the line (names with newlines are not cached). Anything
// else, or a class index out of range, makes the cache damaged: false.
bool read_cache(const fs::path& file, const fs::path& split, Listing& l) {
  std::ifstream in(file);
  std::string line;
  if (!in || !std::getline(in, line) || line != kIndexHeader) return false;
  while (std::getline(in, line)) {
    const size_t sp = line.find(' ');
    if (sp == std::string::npos) return false;
    const std::string kind = line.substr(0, sp), rest = line.substr(sp + 1);
    if (kind == "dir") {
      const size_t sp2 = rest.find(' ');
      if (sp2 == std::string::npos) return false;
      int64_t t = 0;
      if (!parse_int64(rest.substr(0, sp2), t)) return false;
      const std::string rel = rest.substr(sp2 + 1);
      std::error_code ec;
      const auto now = fs::last_write_time(split / rel, ec);
      if (ec || static_cast<int64_t>(now.time_since_epoch().count()) != t) return false;  // changed since
      l.dirs.emplace_back(rel, t);
    } else if (kind == "class") {
      l.classes.push_back(rest);
    } else if (kind == "file") {
      const size_t sp2 = rest.find(' ');
      if (sp2 == std::string::npos) return false;
      int64_t c = 0;
      if (!parse_int64(rest.substr(0, sp2), c) || c < 0) return false;
      l.class_of.push_back(c);
      l.files.push_back(rest.substr(sp2 + 1));
    } else {
      return false;
    }
  }
  // The class lines come first, so only now is their count known.
  for (int64_t c : l.class_of)
    if (c >= static_cast<int64_t>(l.classes.size())) return false;
  return !l.classes.empty() && !l.files.empty();
}

void write_cache(const fs::path& file, const Listing& l) {
  for (const auto& s : l.files)
    if (s.find('\n') != std::string::npos) return;
  // A folder changed within the last two seconds may change again within
  // the same tick of its clock, unseen by the time check: walk again next time.
  const auto recent = fs::file_time_type::clock::now() - std::chrono::seconds(2);
  for (const auto& [rel, t] : l.dirs)
    if (t > static_cast<int64_t>(recent.time_since_epoch().count())) return;
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  // Ranks start together and may all write: each writes its own file and
  // renames it into place, which is atomic, so a reader sees a whole listing.
  const fs::path tmp = file.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return;
    out << kIndexHeader << "\n";
    for (const auto& [rel, t] : l.dirs) out << "dir " << t << " " << rel << "\n";
    for (const auto& c : l.classes) out << "class " << c << "\n";
    for (size_t i = 0; i < l.files.size(); ++i) out << "file " << l.class_of[i] << " " << l.files[i] << "\n";
    if (!out.flush()) {
      fs::remove(tmp, ec);
      return;
    }
  }
  fs::rename(tmp, file, ec);
  if (ec) fs::remove(tmp, ec);
}

bool writable_dir(const fs::path& d) { return ::access(d.c_str(), W_OK) == 0; }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MIX_CHECK(in, path << ": cannot open the image: " << std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Encoded images (JPEG files of a folder, members of tar shards) decoded and
// transformed a batch at a time on a pool of worker threads, into 8-bit HWC
// pixels: the model normalises them on its device (image_normalize), so a
// batch crosses to a GPU as a quarter of FP32's bytes.
class EncodedImageSource final : public ExampleSource {
 public:
  EncodedImageSource(std::string where, EncodedImages images, std::vector<int64_t> labels, bool train,
                     const ImageFolderOptions& opt)
      : dir_(std::move(where)),
        images_(std::move(images)),
        labels_(std::move(labels)),
        train_(train),
        opt_(opt),
        pool_(std::make_unique<WorkerPool>(opt.workers)) {}

  ~EncodedImageSource() override {
    if (replaced_ > 0)
      spdlog::warn("{}: {} read(s) of {} bad image(s) were replaced by the next good image (--skip-bad-images)", dir_,
                   replaced_.load(), bad_files_.size());
  }

  int64_t size() const override { return images_.count; }
  Shape example_shape() const override { return {opt_.transform.size, opt_.transform.size, 3}; }
  DType input_dtype() const override { return DType::u8; }
  Shape label_shape() const override { return {}; }
  int64_t replaced_reads() const override { return replaced_; }

  void read(const std::vector<int64_t>& idx, int64_t begin, int64_t count, int64_t epoch, Tensor& inputs,
            Tensor& labels) const override {
    uint8_t* x = inputs.data<uint8_t>();
    int64_t* y = labels.data<int64_t>();
    const int64_t per = 3 * opt_.transform.size * opt_.transform.size;
    // Every example depends only on (seed, epoch, index): the same bits whatever the number of workers.
    pool_->parallel_for(count, [&](int64_t i) { y[i] = load(idx[begin + i], epoch, x + i * per); });
  }

 private:
  // Transforms example `index` into `out` and returns its label; with
  // --skip-bad-images a bad file is replaced by the next good one in the
  // listing (wrapping around), the same one every time.
  int64_t load(int64_t index, int64_t epoch, uint8_t* out) const {
    const int64_t n = size();
    for (int64_t k = 0; k < n; ++k) {
      const int64_t j = (index + k) % n;
      const std::string path = images_.name(j);
      Rng rng = Rng::for_stream(Rng::for_stream(opt_.seed, static_cast<uint64_t>(epoch)).next_u64(),
                                static_cast<uint64_t>(index));
      try {
        transform_image(images_.bytes(j), path, train_ && opt_.transform.augment, opt_.transform, rng, out);
        return labels_[j];
      } catch (const Error& e) {
        if (!opt_.skip_bad_images) throw;
        ++replaced_;
        std::lock_guard<std::mutex> lock(mu_);
        if (bad_files_.insert(j).second)
          spdlog::warn("skipping a bad image (--skip-bad-images), replaced by the next good one: {}", e.what());
      }
    }
    MIX_FAIL(dir_ << ": no image could be read (every file failed; see the warnings)");
  }

  std::string dir_;
  EncodedImages images_;
  std::vector<int64_t> labels_;
  bool train_;
  ImageFolderOptions opt_;
  std::unique_ptr<WorkerPool> pool_;
  mutable std::atomic<int64_t> replaced_{0};
  mutable std::mutex mu_;
  mutable std::set<int64_t> bad_files_;
};

}  // namespace

ImageFolderIndex list_image_folder(const std::string& split_dir, const std::string& fallback_cache_dir) {
  const fs::path split = fs::absolute(split_dir).lexically_normal();
  MIX_CHECK(fs::is_directory(split), split_dir << ": no such folder (an image folder needs train/ and val/ with a "
                                                  "folder of images per class)");
  const std::string name = split.filename().string();
  const fs::path parent = split.parent_path();
  fs::path cache = parent / (".mixtrain-index-" + name + ".txt");
  if (!writable_dir(parent) && !(fs::exists(cache) && ::access(cache.c_str(), R_OK) == 0)) {
    // Read-only data: the listing goes to a folder of our own, keyed by the split's absolute path.
    const fs::path base = fallback_cache_dir.empty() ? fs::temp_directory_path() / "mixtrain-image-index"
                                                     : fs::path(fallback_cache_dir);
    char key[17];
    std::snprintf(key, sizeof key, "%016llx", static_cast<unsigned long long>(fnv1a(split.string())));
    cache = base / (std::string(key) + "-" + name + ".txt");
  }
  Listing l;
  ImageFolderIndex out;
  out.cache_file = cache.string();
  if (read_cache(cache, split, l)) {
    out.from_cache = true;
  } else {
    l = walk(split);
    write_cache(cache, l);
  }
  out.classes = std::move(l.classes);
  out.files = std::move(l.files);
  out.class_of = std::move(l.class_of);
  return out;
}

std::shared_ptr<const ExampleSource> make_image_folder_source(const std::string& split_dir,
                                                              std::vector<std::string> files,
                                                              std::vector<int64_t> labels, bool train,
                                                              const ImageFolderOptions& opt) {
  EncodedImages images;
  images.count = static_cast<int64_t>(files.size());
  auto paths = std::make_shared<std::vector<std::string>>();
  for (const std::string& f : files) paths->push_back((fs::path(split_dir) / f).string());
  images.name = [paths](int64_t j) { return (*paths)[static_cast<size_t>(j)]; };
  images.bytes = [paths](int64_t j) { return read_file((*paths)[static_cast<size_t>(j)]); };
  return make_encoded_image_source(split_dir, std::move(images), std::move(labels), train, opt);
}

std::shared_ptr<const ExampleSource> make_encoded_image_source(const std::string& where, EncodedImages images,
                                                               std::vector<int64_t> labels, bool train,
                                                               const ImageFolderOptions& opt) {
  MIX_CHECK(static_cast<int64_t>(labels.size()) == images.count,
            where << ": " << images.count << " images but " << labels.size() << " labels");
  return std::make_shared<EncodedImageSource>(where, std::move(images), std::move(labels), train, opt);
}

TrainTest load_image_folder(const std::string& dir, const ImageFolderOptions& opt) {
  MIX_CHECK(fs::is_directory(dir), dir << ": no such folder (--data-dir of --data image-folder)");
  const std::string train_dir = (fs::path(dir) / "train").string(), val_dir = (fs::path(dir) / "val").string();
  MIX_CHECK(fs::is_directory(train_dir), train_dir << ": missing (an image folder needs train/<class>/*.jpg)");
  MIX_CHECK(fs::is_directory(val_dir), val_dir << ": missing (an image folder needs val/<class>/*.jpg)");
  ImageFolderIndex train = list_image_folder(train_dir, opt.fallback_cache_dir);
  ImageFolderIndex val = list_image_folder(val_dir, opt.fallback_cache_dir);
  // Labels are positions in train's sorted classes, for val as well.
  std::map<std::string, int64_t> label_of;
  for (size_t i = 0; i < train.classes.size(); ++i) label_of[train.classes[i]] = static_cast<int64_t>(i);
  std::vector<int64_t> val_label(val.classes.size());
  for (size_t i = 0; i < val.classes.size(); ++i) {
    const auto it = label_of.find(val.classes[i]);
    MIX_CHECK(it != label_of.end(), (fs::path(val_dir) / val.classes[i]).string()
                                        << ": class '" << val.classes[i] << "' has no folder in " << train_dir
                                        << ", so it has no label");
    val_label[i] = it->second;
  }
  std::vector<int64_t> train_labels = train.class_of, val_labels;
  for (int64_t c : val.class_of) val_labels.push_back(val_label[c]);
  TrainTest t;
  t.train.name = t.test.name = "image-folder";
  t.train.num_classes = t.test.num_classes = static_cast<int64_t>(train.classes.size());
  t.train.source = make_image_folder_source(train_dir, std::move(train.files), std::move(train_labels), true, opt);
  t.test.source = make_image_folder_source(val_dir, std::move(val.files), std::move(val_labels), false, opt);
  return t;
}

int default_data_workers() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int local = 1;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* v = std::getenv(var); v && std::atoi(v) > 0) {
      local = std::atoi(v);
      break;
    }
  return std::max(1, cores / local);
}

}  // namespace mix::data
