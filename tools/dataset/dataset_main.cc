// stoker-dataset: prepares image datasets for Stoker. Exports IDX datasets (Fashion-MNIST, MNIST)
// as ImageFolder directories of PNG or JPEG files, and packs an ImageFolder into WebDataset tar
// shards (tools/dataset/dataset_commands.h).
//
//   stoker-dataset export-idx --images F --labels F --out DIR [--format png|jpeg] [--quality 90]
//                             [--limit N]
//   stoker-dataset export-fashion-mnist --out DIR [--format png|jpeg]  (DIR/train and DIR/test)
//   stoker-dataset pack --root DIR --out PREFIX [--samples-per-shard 10000] [--seed 1]
//                       [--keep-jpeg-bytes]
//
// Progress goes to stderr; pack prints the shards' brace pattern on stdout. Exit codes
// (common/exit_codes.h): 0 done, 1 the output could not be written, 2 bad input (a missing or
// damaged file, an output directory in use), 64 bad arguments.
#include <filesystem>
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "common/exit_codes.h"
#include "tools/dataset/dataset_commands.h"

namespace stoker {
namespace {

constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

int Fail(const absl::Status& status) {
  std::cerr << "stoker-dataset: " << status.message() << "\n";
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kDataLoss:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return kExitBadInput;
    default:
      return kExitFailure;
  }
}

void PrintProgress(const std::string& line) { std::cerr << "stoker-dataset: " << line << "\n"; }

int Main(int argc, char** argv) {
  CLI::App app{
      "stoker-dataset: export IDX datasets as image folders, pack image folders into "
      "WebDataset tar shards"};
  app.require_subcommand(1);

  ExportOptions idx;
  CLI::App* export_idx =
      app.add_subcommand("export-idx", "an IDX image/label pair -> DIR/CLASS/NNNNNN.png|jpg");
  export_idx->add_option("--images", idx.images_path, "IDX images (gzip or raw)")->required();
  export_idx->add_option("--labels", idx.labels_path, "IDX labels (gzip or raw)")->required();
  export_idx->add_option("--out", idx.out_dir, "output directory (new or empty)")->required();
  export_idx->add_option("--format", idx.format, "image format")
      ->check(CLI::IsMember({"png", "jpeg"}))
      ->capture_default_str();
  export_idx->add_option("--quality", idx.quality, "JPEG quality")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  export_idx->add_option("--limit", idx.limit, "only the first N samples (0: all)")
      ->check(CLI::NonNegativeNumber);

  ExportOptions fashion;
  std::string fashion_dir = kFashionMnistDir;
  CLI::App* export_fashion =
      app.add_subcommand("export-fashion-mnist",
                         "Fashion-MNIST (Debian's dataset-fashion-mnist) -> DIR/train, DIR/test");
  export_fashion->add_option("--out", fashion.out_dir, "output directory")->required();
  export_fashion->add_option("--format", fashion.format, "image format")
      ->check(CLI::IsMember({"png", "jpeg"}))
      ->capture_default_str();
  export_fashion->add_option("--quality", fashion.quality, "JPEG quality")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  export_fashion->add_option("--source", fashion_dir, "directory of the *-ubyte.gz files")
      ->capture_default_str();

  PackOptions pack;
  CLI::App* pack_command =
      app.add_subcommand("pack", "an image folder -> WebDataset shards PREFIX-NNNNNN.tar");
  pack_command->add_option("--root", pack.root, "image folder (ROOT/CLASS/IMAGE)")->required();
  pack_command->add_option("--out", pack.out_prefix, "shard path prefix")->required();
  pack_command->add_option("--samples-per-shard", pack.samples_per_shard, "samples per shard")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  bool keep_jpeg_bytes = false;
  pack_command->add_flag("--keep-jpeg-bytes", keep_jpeg_bytes,
                         "store JPEGs as they are, without the restart markers that let loaders "
                         "decode a crop without the rows above it");
  pack_command->add_option("--seed", pack.seed, "seed of the shuffle across shards")
      ->capture_default_str();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitSuccess : kExitUsage;
  }

  if (export_idx->parsed()) {
    absl::StatusOr<int64_t> written = ExportIdx(idx, PrintProgress);
    if (!written.ok()) return Fail(written.status());
    return kExitSuccess;
  }
  if (export_fashion->parsed()) {
    if (!std::filesystem::exists(fashion_dir + "/train-images-idx3-ubyte.gz")) {
      std::cerr << "stoker-dataset: " << fashion_dir
                << "/train-images-idx3-ubyte.gz not found: install the Debian package "
                   "dataset-fashion-mnist, or name its directory with --source\n";
      return kExitBadInput;
    }
    for (const auto& [split, prefix] : {std::pair{"train", "train"}, std::pair{"test", "t10k"}}) {
      ExportOptions options = fashion;
      options.images_path = fashion_dir + "/" + prefix + "-images-idx3-ubyte.gz";
      options.labels_path = fashion_dir + "/" + prefix + "-labels-idx1-ubyte.gz";
      options.out_dir = fashion.out_dir + "/" + split;
      absl::StatusOr<int64_t> written = ExportIdx(options, PrintProgress);
      if (!written.ok()) return Fail(written.status());
    }
    return kExitSuccess;
  }
  pack.restart_markers = !keep_jpeg_bytes;
  absl::StatusOr<std::string> pattern = PackShards(pack, PrintProgress);
  if (!pattern.ok()) return Fail(pattern.status());
  std::cout << *pattern << "\n";
  return kExitSuccess;
}

}  // namespace
}  // namespace stoker

int main(int argc, char** argv) { return stoker::Main(argc, argv); }
