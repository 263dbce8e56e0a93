// Checks at submit that a job's model can take its dataset's samples, from what can be read
// cheaply (file headers, labels, directory listings), so that a job that cannot run is refused
// with the field to fix rather than failing on a worker after its wait in the queue.
#ifndef STOKER_SERVER_SUBMIT_CHECKS_H_
#define STOKER_SERVER_SUBMIT_CHECKS_H_

#include <string>

#include "absl/status/status.h"
#include "stoker.pb.h"

namespace stoker {

// A cnn that cannot take the dataset's samples (a kernel larger than the image, an output that
// is not one logit per class, a test set shaped unlike the training set) is refused at submit
// rather than failing on a worker after its wait in the queue. Only IDX and NPY files are probed
// here (headers and labels: milliseconds); CSV, and files that cannot be read, are left to the
// worker, which names the byte or line. Labels outside dataset.classes are refused here too
// (OUT_OF_RANGE from the probe), naming the file as the job wrote it; a job that does not declare
// dataset.classes (and is not a cnn) is not probed, and a bad label fails it on the worker.
// Image datasets: what can be seen without building an index (ProbeImageDataset): image folders
// have class directories and the test folder's classes are among the training folder's; every
// shard a pattern names exists. Where the sample geometry is known (dataset.image.size, and the
// channels from the job or the first training image) and the classes too (dataset.classes or the
// training folder's class directories), a cnn is checked against them.
// `written` is the spec as submitted, `resolved` the same with its dataset paths resolved under
// the data root (ResolveDatasetPaths); errors name the paths as written. INVALID_ARGUMENT names
// the field.
// `data_root` confines an image dataset's probe (ProbeImageDataset): entries that lead outside it
// are left out as the worker's index leaves them out.
absl::Status CheckModelAgainstData(const v1::JobSpec& written, const v1::JobSpec& resolved,
                                   const std::string& data_root = "");

}  // namespace stoker

#endif  // STOKER_SERVER_SUBMIT_CHECKS_H_
