// Image input-pipeline benchmark: real stoker-loader processes decoding and augmenting JPEGs of an
// image folder or WebDataset shards into the job's ring, a consumer releasing batches as fast as
// it can, with the job's dataset.image.decode set by --decode (exact or fast).
// bench/run_image_pipeline.sh runs it beside PyTorch's DataLoader
// (bench/image_pipeline_pytorch.py) and turns the key=value lines it prints into tables.
//
//   index       builds the training index as the agent does (BuildImageIndex, FirstImageHeader)
//               and writes it (WriteSampleIndex) to --index_file: the loaders' --data.
//   throughput  K loader processes (fork + exec, region fd inherited, --job with an image_folder or
//               shards JobSpec: size 224, random_resized_crop {}, horizontal_flip, channels 3),
//               batches of --batch over --epochs epochs; images/s from the first batch to the last
//               (samples after the first batch; start-up apart), per loader, and per CPU-second of
//               the loaders over the same window (/proc/PID/stat at the first batch, wait4 at the
//               end). The page cache is warmed first (every source file read once).
//   evict       drops the sources' pages from the page cache (posix_fadvise DONTNEED) and prints
//   the
//               fraction still resident (mincore): for a cold read without a global drop_caches.
//   read        reads one epoch's samples the way a loader does (ImageBatchSource::Make's I/O:
//               POSIX_FADV_WILLNEED for a batch's members, then ReadSampleBytes each, in
//               EpochSampleOrder), no decoding; MB/s, and the resident fraction before.
//   profile     one process, warm cache: per image, the time of the read (pread), of decoding only
//               the rows and columns the transform decodes (the crop box; Stoker's own decoder,
//               data/image/image_decoder.h, with the DCT scale the transform picks), of the whole
//               transform (DecodeTransformed: that decode + resize + flip + CHW), and, for
//               reference, of a full-size decode (DecodeImage, what PIL does) and of entropy
//               decoding alone (libjpeg's jpeg_read_coefficients on the whole image: the Huffman
//               decoding no crop can skip). resize = transform - box decode. Then
//               ImageBatchSource::Make in-process for one epoch (a loader without the ring).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

// jpeglib.h needs FILE (cstdio) declared first.
#include <jpeglib.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "bench/pipeline/pipeline_util.h"
#include "data/dataset.h"
#include "data/image/image_codec.h"
#include "data/image/image_decoder.h"
#include "data/image/image_transform.h"
#include "data/image_dataset.h"
#include "data/index/sample_index.h"
#include "data/job_region.h"
#include "spec/job_options.h"
#include "spec/job_spec.h"
#include "stoker.pb.h"

ABSL_FLAG(std::string, loader, STOKER_LOADER_PATH, "the stoker-loader executable");
ABSL_FLAG(std::string, parts, "index,throughput",
          "what to do, comma-separated, in this order: "
          "index, throughput, evict, read, profile");
ABSL_FLAG(std::string, format, "image_folder", "image_folder or shards");
ABSL_FLAG(std::string, path, "", "the image folder's root, or the shards' path or brace pattern");
ABSL_FLAG(std::string, index_file, "", "the training index: written by 'index', read by the rest");
ABSL_FLAG(std::string, work_dir, "/tmp", "where the job file goes");
ABSL_FLAG(std::string, loaders, "1,2", "throughput: loader process counts");
ABSL_FLAG(int, runs, 1, "throughput: runs per loader count (each one printed)");
ABSL_FLAG(int, epochs, 3, "throughput: epochs per run");
ABSL_FLAG(int, batch, 256, "samples per batch");
ABSL_FLAG(int, slots, 8, "ring slots (the job default, loader.ring_slots)");
ABSL_FLAG(int, size, 224, "output side");
ABSL_FLAG(int64_t, seed, 1, "train.seed");
ABSL_FLAG(int, profile_images, 0, "profile: images (0 = one epoch)");
ABSL_FLAG(std::string, decode, "exact",
          "dataset.image.decode: exact (torchvision's pixels) or fast (image_transform.h)");

namespace {

using stoker::bench::Clock;
using stoker::bench::Seconds;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "image_pipeline_bench: %s\n", what.c_str());
  std::exit(1);
}

template <typename T>
T Must(absl::StatusOr<T> value, const std::string& what) {
  if (!value.ok()) Die(absl::StrCat(what, ": ", value.status().ToString()));
  return *std::move(value);
}

double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

// The job as the agent writes it for an image dataset: the defaults, the dataset section of the
// issue's ImageNet-style pipeline.
stoker::v1::JobSpec BenchJobSpec() {
  stoker::v1::JobSpec spec = stoker::DefaultJobSpec();
  spec.set_name("image-pipeline-bench");
  stoker::v1::DatasetSpec* data = spec.mutable_dataset();
  data->set_format(absl::GetFlag(FLAGS_format));
  data->set_train_images(absl::GetFlag(FLAGS_path));
  stoker::v1::ImageSpec* image = data->mutable_image();
  image->set_size(absl::GetFlag(FLAGS_size));
  image->mutable_random_resized_crop();  // present = on, torchvision's default scale and ratio
  image->set_horizontal_flip(true);
  image->set_channels(3);
  image->set_decode(absl::GetFlag(FLAGS_decode));
  spec.mutable_train()->set_seed(absl::GetFlag(FLAGS_seed));
  spec.mutable_train()->set_batch_size(absl::GetFlag(FLAGS_batch));
  spec.mutable_loader()->set_ring_slots(absl::GetFlag(FLAGS_slots));
  return spec;
}

std::string IndexFile() {
  const std::string path = absl::GetFlag(FLAGS_index_file);
  if (path.empty()) Die("--index_file is required");
  return path;
}

// --- index --------------------------------------------------------------------------------

void BuildIndex() {
  const std::string format = absl::GetFlag(FLAGS_format);
  const Clock::time_point start = Clock::now();
  stoker::SampleIndex index =
      Must(stoker::BuildImageIndex(format, absl::GetFlag(FLAGS_path), [](const std::string&) {}),
           "indexing " + absl::GetFlag(FLAGS_path));
  const stoker::ImageHeader first = Must(stoker::FirstImageHeader(index), "first image header");
  const Clock::time_point built = Clock::now();
  if (absl::Status s = stoker::WriteSampleIndex(index, IndexFile()); !s.ok()) Die(s.ToString());
  const Clock::time_point written = Clock::now();
  uint64_t bytes = 0;
  for (int64_t i = 0; i < index.count(); ++i) bytes += index.sample(i).size;
  std::printf(
      "index format=%s samples=%lld sources=%u classes=%d image_bytes=%llu build_s=%.3f "
      "write_s=%.3f index_bytes=%llu first_image=%dx%dx%d\n",
      format.c_str(), static_cast<long long>(index.count()), index.source_count(), index.classes(),
      static_cast<unsigned long long>(bytes), Seconds(built - start), Seconds(written - built),
      static_cast<unsigned long long>(index.index_bytes()), first.width, first.height,
      first.channels);
  std::fflush(stdout);
}

// --- page cache ---------------------------------------------------------------------------

std::vector<std::string> SourcePaths(const stoker::SampleIndex& index) {
  std::vector<std::string> paths;
  for (uint32_t s = 0; s < index.source_count(); ++s) {
    paths.emplace_back(index.source_path(s));
  }
  return paths;
}

// Reads every source file once (both sides of the comparison run with a warm cache).
void WarmCache(const stoker::SampleIndex& index) {
  std::vector<char> buffer(1 << 20);
  uint64_t bytes = 0;
  const Clock::time_point start = Clock::now();
  for (const std::string& path : SourcePaths(index)) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) Die(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
    for (ssize_t n; (n = read(fd, buffer.data(), buffer.size())) > 0;) bytes += n;
    close(fd);
  }
  std::printf("warm bytes=%llu seconds=%.3f\n", static_cast<unsigned long long>(bytes),
              Seconds(Clock::now() - start));
  std::fflush(stdout);
}

// Fraction of the sources' pages in the page cache.
double ResidentFraction(const stoker::SampleIndex& index) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  uint64_t pages = 0, resident = 0;
  std::vector<unsigned char> vec;
  for (const std::string& path : SourcePaths(index)) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) Die(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
    struct stat st;
    if (fstat(fd, &st) != 0 || st.st_size == 0) {
      close(fd);
      continue;
    }
    const size_t length = static_cast<size_t>(st.st_size);
    void* map = mmap(nullptr, length, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) Die(absl::StrCat(path, ": cannot map: ", std::strerror(errno)));
    vec.resize((length + page - 1) / page);
    if (mincore(map, length, vec.data()) != 0) Die(absl::StrCat(path, ": mincore failed"));
    munmap(map, length);
    pages += vec.size();
    for (unsigned char v : vec) resident += v & 1;
  }
  return pages == 0 ? 0.0 : static_cast<double>(resident) / pages;
}

void Evict(const stoker::SampleIndex& index) {
  const double before = ResidentFraction(index);
  for (const std::string& path : SourcePaths(index)) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) Die(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
    fdatasync(fd);  // dirty pages (files just written) cannot be dropped
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
  }
  std::printf("evict format=%s sources=%u resident_before=%.3f resident_after=%.3f\n",
              absl::GetFlag(FLAGS_format).c_str(), index.source_count(), before,
              ResidentFraction(index));
  std::fflush(stdout);
}

// --- throughput ---------------------------------------------------------------------------

// Starts K stoker-loader processes on `region` as the agent does (fork + exec, fd inherited).
std::vector<pid_t> SpawnLoaders(const stoker::JobRegion& region, const std::string& job,
                                const std::string& data) {
  absl::StatusOr<std::vector<pid_t>> pids = stoker::bench::SpawnLoaders(
      region, absl::GetFlag(FLAGS_loader), {"--job", job, "--data", data});
  if (!pids.ok()) Die(std::string(pids.status().message()));
  return *std::move(pids);
}

// User + system CPU seconds of a running process (/proc/PID/stat fields 14 and 15).
double ProcessCpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  if (paren == std::string::npos) return 0;
  std::vector<std::string> fields = absl::StrSplit(text.substr(paren + 2), ' ');
  // fields[0] is field 3 (state): utime is field 14, stime field 15.
  if (fields.size() < 13) return 0;
  return (std::stod(fields[11]) + std::stod(fields[12])) / sysconf(_SC_CLK_TCK);
}

// Waits for every loader; their total CPU seconds (rusage). Dies unless all exited 0.
// User + system CPU seconds of this process so far (all its threads).
double OwnCpuSeconds() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_utime.tv_usec * 1e-6 + usage.ru_stime.tv_sec +
         usage.ru_stime.tv_usec * 1e-6;
}

double ReapLoaders(const std::vector<pid_t>& pids) {
  double cpu_s = 0;
  for (pid_t pid : pids) {
    int status = 0;
    rusage usage{};
    if (wait4(pid, &status, 0, &usage) != pid) Die(absl::StrCat("wait4 ", pid, " failed"));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      Die(absl::StrCat("loader ", pid, " failed (wait status ", status, ")"));
    }
    cpu_s += usage.ru_utime.tv_sec + usage.ru_utime.tv_usec * 1e-6 + usage.ru_stime.tv_sec +
             usage.ru_stime.tv_usec * 1e-6;
  }
  return cpu_s;
}

void Throughput(const stoker::SampleIndex& index) {
  const std::string format = absl::GetFlag(FLAGS_format);
  const std::string job =
      absl::StrCat(absl::GetFlag(FLAGS_work_dir), "/image-pipeline-bench-", getpid(), ".pb");
  {
    std::ofstream out(job, std::ios::binary | std::ios::trunc);
    if (!BenchJobSpec().SerializeToOstream(&out)) Die("cannot write " + job);
  }
  const int batch_size = absl::GetFlag(FLAGS_batch);
  const int epochs = absl::GetFlag(FLAGS_epochs);
  const size_t sample_bytes = 3 * static_cast<size_t>(absl::GetFlag(FLAGS_size)) *
                              static_cast<size_t>(absl::GetFlag(FLAGS_size));
  const std::vector<std::string> loader_counts = absl::StrSplit(absl::GetFlag(FLAGS_loaders), ',');
  for (int run = 1; run <= absl::GetFlag(FLAGS_runs); ++run) {
    for (const std::string& k : loader_counts) {
      stoker::RingGeometry g;
      g.slot_count = absl::GetFlag(FLAGS_slots);
      g.batch_size = batch_size;
      g.sample_bytes = static_cast<uint32_t>(sample_bytes);
      g.loader_count = static_cast<uint32_t>(std::stoul(k));
      g.total_batches = epochs * stoker::BatchesPerEpoch(index.count(), batch_size);
      // The sample shape the agent resolves and the loaders read from the region header.
      const uint32_t size = static_cast<uint32_t>(absl::GetFlag(FLAGS_size));
      g.sample_dims = {3, size, size};
      auto region = Must(stoker::JobRegion::Create(g), "ring");
      region->SetConsumerPid(getpid());
      const Clock::time_point spawned = Clock::now();
      const std::vector<pid_t> pids = SpawnLoaders(*region, job, IndexFile());
      Clock::time_point first{};
      double cpu_at_first = 0, consumer_at_first = 0;
      uint64_t images_after_first = 0, images = 0;
      uint64_t checksum = 0;
      for (uint64_t b = 0; b < g.total_batches; ++b) {
        const stoker::ReadableBatch batch =
            Must(region->WaitReadable(b, absl::Seconds(300)), absl::StrCat("batch ", b));
        if (b == 0) {
          first = Clock::now();
          for (pid_t pid : pids) cpu_at_first += ProcessCpuSeconds(pid);
          consumer_at_first = OwnCpuSeconds();
        } else {
          images_after_first += batch.count;
        }
        images += batch.count;
        // Released at once; a few bytes read so that the batch is known to be there.
        checksum += batch.samples[0] + batch.samples[sample_bytes * batch.count / 2];
        for (uint32_t i = 0; i < batch.count; ++i) {
          if (batch.labels[i] >= index.classes()) {
            Die(absl::StrCat("batch ", b, " sample ", i, ": label ", batch.labels[i]));
          }
        }
        region->Release(b);
      }
      const Clock::time_point end = Clock::now();
      // This process's share (the consumer taking and releasing the batches) over the window.
      const double consumer_cpu_s = OwnCpuSeconds() - consumer_at_first;
      const double cpu_s = ReapLoaders(pids) - cpu_at_first;
      const uint64_t expected = static_cast<uint64_t>(epochs) * index.count();
      const uint64_t bad = region->stats().bad_samples_total.load();
      if (images != expected || bad != 0) {
        Die(absl::StrCat(images, " images of ", expected, " arrived, ", bad, " bad"));
      }
      const double seconds = Seconds(end - first);
      const double per_s = images_after_first / seconds;
      std::printf(
          "throughput system=stoker format=%s decode=%s workers=%s run=%d batch=%d epochs=%d "
          "images=%llu seconds=%.3f images_per_s=%.1f per_worker=%.1f cpu_s=%.3f "
          "images_per_cpu_s=%.1f consumer_cpu_s=%.3f startup_s=%.3f checksum=%llu\n",
          format.c_str(), absl::GetFlag(FLAGS_decode).c_str(), k.c_str(), run, batch_size, epochs,
          static_cast<unsigned long long>(images_after_first), seconds, per_s, per_s / std::stoi(k),
          cpu_s, cpu_s > 0 ? images_after_first / (cpu_s + consumer_cpu_s) : 0.0, consumer_cpu_s,
          Seconds(first - spawned), static_cast<unsigned long long>(checksum));
      std::fflush(stdout);
    }
  }
  std::filesystem::remove(job);
}

// --- read ---------------------------------------------------------------------------------

// One epoch's samples read as ImageBatchSource::Make reads them (no decoding).
void Read(const stoker::SampleIndex& index) {
  const double resident = ResidentFraction(index);
  const std::vector<uint32_t> order =
      stoker::EpochSampleOrder(index, static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)), 0,
                               BenchJobSpec().dataset().shuffle_buffer());
  const size_t batch = static_cast<size_t>(absl::GetFlag(FLAGS_batch));
  stoker::FileCache files;
  std::vector<uint8_t> bytes;
  uint64_t total = 0, checksum = 0;
  const Clock::time_point start = Clock::now();
  for (size_t first = 0; first < order.size(); first += batch) {
    const size_t end = std::min(order.size(), first + batch);
    for (size_t i = first; i < end && index.sharded(); ++i) {
      const stoker::IndexedSample& s = index.sample(order[i]);
      absl::StatusOr<int> fd = files.Get(s.source, index.source_path(s.source), index.root());
      if (fd.ok()) {
        posix_fadvise(*fd, static_cast<off_t>(s.offset), static_cast<off_t>(s.size),
                      POSIX_FADV_WILLNEED);
      }
    }
    for (size_t i = first; i < end; ++i) {
      if (absl::Status s = stoker::ReadSampleBytes(index, order[i], files, bytes); !s.ok()) {
        Die(s.ToString());
      }
      total += bytes.size();
      checksum += bytes[bytes.size() / 2];
    }
  }
  const double seconds = Seconds(Clock::now() - start);
  std::printf(
      "read format=%s how=loader resident_before=%.3f samples=%zu bytes=%llu seconds=%.3f "
      "mb_per_s=%.1f checksum=%llu\n",
      absl::GetFlag(FLAGS_format).c_str(), resident, order.size(),
      static_cast<unsigned long long>(total), seconds, total / 1e6 / seconds,
      static_cast<unsigned long long>(checksum));
  std::fflush(stdout);
}

// --- profile ------------------------------------------------------------------------------

// libjpeg's errors end in a longjmp back to EntropyDecode (whose frame holds no C++ objects).
struct JpegErrorJump {
  jpeg_error_mgr manager;
  jmp_buf jump;
};

void JpegErrorExit(j_common_ptr cinfo) {
  longjmp(reinterpret_cast<JpegErrorJump*>(cinfo->err)->jump, 1);
}

void JpegQuiet(j_common_ptr) {}

// Entropy-decodes a whole JPEG into its DCT coefficients (no IDCT, upsampling or colour
// conversion). False when libjpeg reports an error.
bool EntropyDecode(const uint8_t* data, size_t size) {
  jpeg_decompress_struct cinfo{};
  JpegErrorJump error;
  cinfo.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = JpegErrorExit;
  error.manager.output_message = JpegQuiet;
  if (setjmp(error.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  jpeg_read_coefficients(&cinfo);
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

// The DCT scale DecodeTransformed picks for a crop box inside the image (image_transform.h), as
// the denominator of 1/1, 1/2, 1/4, 1/8.
int ScaleDenom(const stoker::CropBox& box, int size) {
  return 8 / stoker::JpegScaleEighths(box.height, box.width, size, size);
}

void Profile(stoker::SampleIndex index) {
  const stoker::ImageHeader first = Must(stoker::FirstImageHeader(index), "first image header");
  const stoker::v1::JobSpec spec = BenchJobSpec();
  stoker::ImageSourceOptions options =
      stoker::ImageSourceOptionsFromSpec(spec, stoker::ImageSampleShape(spec, first), nullptr);
  const stoker::ImageTransform& t = options.transform;
  const uint64_t seed = options.seed;
  const std::vector<uint32_t> order =
      stoker::EpochSampleOrder(index, seed, 0, options.shuffle_buffer);
  int64_t count = absl::GetFlag(FLAGS_profile_images);
  if (count <= 0 || count > index.count()) count = index.count();
  const uint32_t batch_size = static_cast<uint32_t>(absl::GetFlag(FLAGS_batch));

  stoker::FileCache files;
  std::vector<uint8_t> bytes;
  stoker::TransformScratch scratch;
  stoker::image_internal::ImageDecoder decoder;
  std::vector<uint8_t> out(stoker::TransformOutputBytes(t));
  // Seconds of thread CPU time per stage, summed over the images.
  double read_s = 0, decode_box_s = 0, transform_s = 0, full_decode_s = 0, entropy_s = 0;
  int64_t jpegs = 0;
  std::array<int64_t, 9> denoms{};
  uint64_t checksum = 0, box_pixels = 0, image_pixels = 0;
  double rows_needed = 0;  // sum of (box bottom / height): the rows a crop decode entropy-decodes
  const Clock::time_point start = Clock::now();
  for (int64_t i = 0; i < count; ++i) {
    const uint32_t sample = order[static_cast<size_t>(i)];
    const uint64_t bits = stoker::SampleRandomBits(seed, static_cast<uint64_t>(i) / batch_size,
                                                   static_cast<uint32_t>(i % batch_size));
    const std::string name = index.SampleName(sample);
    double t0 = ThreadCpuSeconds();
    if (absl::Status s = stoker::ReadSampleBytes(index, sample, files, bytes); !s.ok()) {
      Die(s.ToString());
    }
    double t1 = ThreadCpuSeconds();
    read_s += t1 - t0;

    // The region the transform decodes, decoded alone (rows handed to a no-op).
    if (absl::Status s = decoder.Open(name, bytes.data(), bytes.size()); !s.ok()) Die(s.ToString());
    const int height = decoder.header().height, width = decoder.header().width;
    const stoker::CropBox box = stoker::DrawRandomResizedCrop(t, height, width, bits);
    const int denom =
        decoder.header().encoding == stoker::ImageEncoding::kJpeg ? ScaleDenom(box, t.size) : 1;
    ++denoms[static_cast<size_t>(denom)];
    // The decode mode's settings: exact (SetScale) or fast (SetFastScale, the same scale).
    if (absl::Status s = t.decode == stoker::ImageDecodeMode::kFast
                             ? decoder.SetFastScale(8 / denom)
                             : decoder.SetScale(denom);
        !s.ok()) {
      Die(s.ToString());
    }
    const int x0 = box.left / denom, y0 = box.top / denom;
    const int x1 = std::min(decoder.scaled_width(), (box.left + box.width + denom - 1) / denom);
    const int y1 = std::min(decoder.scaled_height(), (box.top + box.height + denom - 1) / denom);
    uint64_t rows = 0;
    absl::Status region = decoder.ReadRegion(
        t.channels, x0, x1, y0, y1,
        [&](int y, const uint8_t* pixels) { rows += pixels[0] + static_cast<uint64_t>(y); });
    if (!region.ok()) Die(region.ToString());
    double t2 = ThreadCpuSeconds();
    decode_box_s += t2 - t1;
    box_pixels += static_cast<uint64_t>(box.width) * box.height;
    image_pixels += static_cast<uint64_t>(width) * height;
    rows_needed += static_cast<double>(box.top + box.height) / height;

    if (absl::Status s = stoker::DecodeTransformed(name, bytes.data(), bytes.size(), t, bits,
                                                   out.data(), &scratch);
        !s.ok()) {
      Die(s.ToString());
    }
    double t3 = ThreadCpuSeconds();
    transform_s += t3 - t2;

    absl::StatusOr<stoker::Image> full = stoker::DecodeImage(name, bytes.data(), bytes.size(), 3);
    if (!full.ok()) Die(full.status().ToString());
    double t4 = ThreadCpuSeconds();
    full_decode_s += t4 - t3;

    if (decoder.header().encoding == stoker::ImageEncoding::kJpeg) {
      if (!EntropyDecode(bytes.data(), bytes.size())) Die(name + ": libjpeg failed");
      entropy_s += ThreadCpuSeconds() - t4;
      ++jpegs;
    }
    checksum += out[out.size() / 2] + rows + full->pixels[0];
  }
  const double wall_s = Seconds(Clock::now() - start);
  const double n = static_cast<double>(count);
  std::printf(
      "profile format=%s decode=%s images=%lld read_us=%.1f decode_box_us=%.1f resize_us=%.1f "
      "transform_us=%.1f full_decode_us=%.1f entropy_us=%.1f jpegs=%lld box_fraction=%.3f "
      "rows_needed_fraction=%.3f "
      "denom1=%lld denom2=%lld "
      "denom4=%lld denom8=%lld wall_s=%.3f checksum=%llu\n",
      absl::GetFlag(FLAGS_format).c_str(), absl::GetFlag(FLAGS_decode).c_str(),
      static_cast<long long>(count), 1e6 * read_s / n, 1e6 * decode_box_s / n,
      1e6 * (transform_s - decode_box_s) / n, 1e6 * transform_s / n, 1e6 * full_decode_s / n,
      jpegs > 0 ? 1e6 * entropy_s / jpegs : 0.0, static_cast<long long>(jpegs),
      static_cast<double>(box_pixels) / image_pixels, rows_needed / n,
      static_cast<long long>(denoms[1]), static_cast<long long>(denoms[2]),
      static_cast<long long>(denoms[4]), static_cast<long long>(denoms[8]), wall_s,
      static_cast<unsigned long long>(checksum));
  std::fflush(stdout);

  // A loader's whole per-batch work (order, fadvise, reads, transforms, labels) without the ring.
  std::unique_ptr<stoker::ImageBatchSource> source =
      Must(stoker::ImageBatchSource::Create(std::move(index), batch_size, options), "source");
  std::vector<uint8_t> samples(static_cast<size_t>(batch_size) * out.size());
  std::vector<uint8_t> labels(batch_size);
  uint64_t made = 0;
  const double cpu0 = ThreadCpuSeconds();
  const Clock::time_point make_start = Clock::now();
  for (int64_t b = 0; b < source->batches_per_epoch(); ++b) {
    made += Must(source->Make(static_cast<uint64_t>(b), samples.data(), labels.data()),
                 absl::StrCat("batch ", b));
  }
  const double make_wall = Seconds(Clock::now() - make_start);
  const double make_cpu = ThreadCpuSeconds() - cpu0;
  std::printf(
      "profile_make format=%s decode=%s images=%llu seconds=%.3f images_per_s=%.1f cpu_s=%.3f "
      "images_per_cpu_s=%.1f\n",
      absl::GetFlag(FLAGS_format).c_str(), absl::GetFlag(FLAGS_decode).c_str(),
      static_cast<unsigned long long>(made), make_wall, made / make_wall, make_cpu,
      made / make_cpu);
  std::fflush(stdout);
}

stoker::SampleIndex OpenIndex() { return Must(stoker::OpenSampleIndex(IndexFile()), "index"); }

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_path).empty()) Die("--path is required");
  const std::string format = absl::GetFlag(FLAGS_format);
  if (format != "image_folder" && format != "shards") {
    Die("--format must be image_folder or shards");
  }
  for (const absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_parts), ',')) {
    if (part == "index") {
      BuildIndex();
    } else if (part == "throughput") {
      stoker::SampleIndex index = OpenIndex();
      WarmCache(index);
      Throughput(index);
    } else if (part == "evict") {
      Evict(OpenIndex());
    } else if (part == "read") {
      Read(OpenIndex());
    } else if (part == "profile") {
      stoker::SampleIndex index = OpenIndex();
      WarmCache(index);
      Profile(std::move(index));
    } else {
      Die(absl::StrCat("unknown part '", part, "' (index, throughput, evict, read, profile)"));
    }
  }
  return 0;
}
