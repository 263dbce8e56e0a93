// What stoker-dataset does, as functions its main() calls: IDX datasets exported as image folders
// (torchvision's ImageFolder layout), and image folders packed into WebDataset tar shards.
//
// Errors name the file. INVALID_ARGUMENT, NOT_FOUND, DATA_LOSS and FAILED_PRECONDITION mean bad
// input (exit 2); anything else is a failure to write the output (exit 1).
#ifndef STOKER_TOOLS_DATASET_DATASET_COMMANDS_H_
#define STOKER_TOOLS_DATASET_DATASET_COMMANDS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace stoker {

// A line of progress for people (stderr); called at most about once a second, and at the end.
using ProgressLine = std::function<void(const std::string& line)>;

struct ExportOptions {
  std::string images_path;  // IDX images [N, H, W] (gray) or [N, H, W, C] with C 1 or 3; gz or raw
  std::string labels_path;  // IDX labels [N]
  std::string out_dir;      // created; must not exist or be empty
  std::string format = "png";  // "png" or "jpeg"
  int quality = 90;            // jpeg only, 1..100
  int64_t limit = 0;           // > 0: only the first `limit` samples
};

// Writes OUT/CLASS/NNNNNN.png (or .jpg): one file per sample, named by its index in the IDX file
// (zero-padded to at least 6 digits, so names sort in sample order), in the directory of its
// label, named by the label zero-padded to the width of the largest ("0".."9" for up to 10
// classes, "00".."99" up to 100, then 3 digits), so the directories sort in label order.
// BuildImageFolderIndex of OUT then gives the IDX's samples stably sorted by label, each with its
// label (ImageFolder groups a class's files together; within a class the IDX order is kept).
// Returns the number of images written.
absl::StatusOr<int64_t> ExportIdx(const ExportOptions& options, const ProgressLine& progress);

struct PackOptions {
  std::string root;        // an image folder
  std::string out_prefix;  // shards are OUT_PREFIX-000000.tar, OUT_PREFIX-000001.tar, ...
  int64_t samples_per_shard = 10000;
  uint64_t seed = 1;
  // JPEGs are stored re-encoded losslessly with a restart marker after every MCU row
  // (data/image/jpeg_restart.h), so that a loader decodes a crop without the rows above it; false
  // keeps every file's bytes unchanged.
  bool restart_markers = true;
};

// Packs the image folder's samples (BuildImageFolderIndex order) into WebDataset shards: sample
// EpochPermutation(count, seed, 0)[k] becomes the k-th sample of the shards (so each shard mixes
// classes), with key k zero-padded to at least 6 digits, as two members: KEY.EXT holding the
// image file's bytes (EXT its lowercased extension; a JPEG re-encoded losslessly with restart
// markers unless options.restart_markers is false, or kept as it was when it cannot be: a
// progressive, arithmetic-coded or damaged one) and KEY.cls its label in decimal. The last
// progress line counts the JPEGs given restart markers, their bytes before and after, and those
// kept.
// Shards are pax-restricted tar (ustar unless a name needs more), each written under a temporary
// name beside it and renamed once complete; the directory of OUT_PREFIX is created. Returns the
// brace pattern naming the shards ("OUT_PREFIX-{000000..000005}.tar", or the one shard's path).
absl::StatusOr<std::string> PackShards(const PackOptions& options, const ProgressLine& progress);

}  // namespace stoker

#endif  // STOKER_TOOLS_DATASET_DATASET_COMMANDS_H_
