// The one place where the data pipeline reads a JobSpec: which files make the train and test
// sets, and what a loader does besides reading them. The trainer, the agent and the loader call
// these, so a new dataset or loader field in the proto is wired here only.
#ifndef STOKER_SPEC_JOB_OPTIONS_H_
#define STOKER_SPEC_JOB_OPTIONS_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "data/dataset.h"
#include "data/image/image_codec.h"
#include "data/image/image_transform.h"
#include "data/image_dataset.h"
#include "data/loader.h"
#include "stoker.pb.h"

namespace stoker {

// dataset.format and train_images/train_labels (csv: train_images only). Paths as in the spec.
// Labels are checked against dataset.classes; without it, every class up to the largest training
// label must occur (see DatasetFiles::classes).
DatasetFiles TrainDatasetFiles(const v1::JobSpec& spec);
// The same for test_images/test_labels. Test labels must be below dataset.classes, or, where the
// job does not declare it, below `train_classes` (what the training labels gave; 0 = unchecked).
DatasetFiles TestDatasetFiles(const v1::JobSpec& spec, int train_classes = 0);

// Loader `index`'s options: train.seed, loader.delay_ms, and augmentation (off until the proto
// carries it).
LoaderOptions LoaderOptionsFromSpec(const v1::JobSpec& spec, uint32_t index);

// Image datasets (format image_folder or shards).
// The sample shape {C, H, W} of an image job: dataset.image.channels where it is set, else 1 for
// grayscale first images and 3 otherwise; dataset.image.size where it is set, else the first
// image's height and width. `first` is what FirstImageHeader (the agent, from the training index)
// or ProbeImageDataset (the server's submit check, the CLI's dry run, from the folder) read: the
// first readable image, in colour if any of the first 16 is. The one place this is decided: the
// agent writes the result into the region header (RingGeometry::sample_dims), where the trainer
// and the loaders read it.
std::vector<int> ImageSampleShape(const v1::JobSpec& spec, const ImageHeader& first);

// The transforms for samples of `shape` (ImageSampleShape's, or the region header's).
// Training: random_resized_crop and horizontal_flip as the job says, else the evaluation
// transform (resize, center crop).
ImageTransform TrainImageTransform(const v1::JobSpec& spec, const std::vector<int>& shape);
// Evaluation: resize (shorter side to dataset.image.resize, or size) and center crop.
ImageTransform EvalImageTransform(const v1::JobSpec& spec, const std::vector<int>& shape);
// The loader's image source options, bad samples counted in `bad_samples_total`.
ImageSourceOptions ImageSourceOptionsFromSpec(const v1::JobSpec& spec,
                                              const std::vector<int>& shape,
                                              std::atomic<uint64_t>* bad_samples_total);

}  // namespace stoker

#endif  // STOKER_SPEC_JOB_OPTIONS_H_
