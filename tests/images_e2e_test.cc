// Image datasets end to end: Fashion-MNIST exported as a PNG image folder and packed into tar
// shards by stoker-dataset, trained through a real server, worker, loaders and trainer; bad
// images skipped and counted, or failing the job once there are too many; missing shards and
// unknown test classes refused at submit.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "spec/job_spec.h"
#include "tests/test_cluster.h"

namespace stoker::testing {
namespace {

constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

class ImagesEndToEndTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(
        std::filesystem::exists(std::string(kFashionMnistDir) + "/train-images-idx3-ubyte.gz"))
        << "Fashion-MNIST is missing: install the Debian package dataset-fashion-mnist";
    root_ = cluster_.dir() + "/data";
    std::filesystem::create_directories(root_);
    // 3000 training and 500 test images as PNG folders, and the training folder as 3 shards.
    for (auto [split, prefix, limit] :
         {std::tuple{"train", "train", 3000}, std::tuple{"test", "t10k", 500}}) {
      const CommandResult exported =
          RunCommand(absl::StrCat(STOKER_DATASET_PATH, " export-idx --images ", kFashionMnistDir,
                                  "/", prefix, "-images-idx3-ubyte.gz --labels ", kFashionMnistDir,
                                  "/", prefix, "-labels-idx1-ubyte.gz --out ", root_, "/png/",
                                  split, " --format png --limit ", limit, " 2>&1"));
      ASSERT_EQ(exported.exit_code, 0) << exported.output;
    }
    const CommandResult packed =
        RunCommand(absl::StrCat(STOKER_DATASET_PATH, " pack --root ", root_, "/png/train --out ",
                                root_, "/shards/train --samples-per-shard 1000 2>&1"));
    ASSERT_EQ(packed.exit_code, 0) << packed.output;
    ASSERT_TRUE(std::filesystem::exists(root_ + "/shards/train-000002.tar")) << packed.output;
    cluster_.StartServer({"--data-root", root_});
  }

  // An MLP on the exported images, 3 epochs.
  v1::JobSpec ImageJob(const std::string& format, const std::string& train) {
    v1::JobSpec spec = DefaultJobSpec();
    spec.set_name("images-" + format);
    v1::DatasetSpec* data = spec.mutable_dataset();
    data->set_format(format);
    data->set_train_images(train);
    data->set_test_images(format == "shards" ? "shards/train-000000.tar" : "png/test");
    spec.mutable_model()->add_hidden(128);
    spec.mutable_train()->set_epochs(3);
    spec.mutable_train()->set_batch_size(64);
    spec.mutable_train()->set_precision(v1::PRECISION_BF16);
    spec.mutable_loader()->set_processes(2);
    return spec;
  }

  std::string Log(const std::string& job_id) {
    std::string text;
    for (const v1::JobEvent& event : cluster_.History(job_id)) {
      absl::StrAppend(&text, event.message(), "\n");
    }
    return text;
  }

  TestCluster cluster_;
  std::string root_;
};

// The folder job goes through the decoded cache (its transform has no random step), the shards
// job has it turned off: both paths train.
TEST_F(ImagesEndToEndTest, TrainsFromAPngFolderAndFromShards) {
  cluster_.StartWorker("w1", {"--data-root", root_});
  v1::JobSpec uncached = ImageJob("shards", "shards/train-{000000..000002}.tar");
  uncached.mutable_dataset()->set_decoded_cache("off");
  for (const v1::JobSpec& spec : {ImageJob("image_folder", "png/train"), uncached}) {
    absl::StatusOr<v1::Job> submitted = cluster_.Submit(spec);
    ASSERT_TRUE(submitted.ok()) << spec.name() << ": " << submitted.status();
    absl::StatusOr<v1::Job> done = cluster_.WaitForFinal(submitted->id(), absl::Minutes(3));
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << spec.name() << ": " << done->error();
    // 3000 samples, 3 epochs: well above chance (0.1); an MLP on IDX gets ~0.78 here.
    EXPECT_GT(done->progress().test_accuracy(), 0.70) << spec.name();
    const std::string log = Log(done->id());
    EXPECT_TRUE(absl::StrContains(log, "3000 training samples")) << log;
    EXPECT_TRUE(absl::StrContains(log, spec.dataset().decoded_cache() == "off"
                                           ? "decoded cache: none (dataset.decoded_cache is off)"
                                           : "decoded cache: 3000 training images decoded once"))
        << log;
  }
}

// The data root confines what a job reads (issue 28): an image folder's class directory and an
// image that lead outside it through symbolic links are left out of the index, named in the job's
// log and counted; a link that stays inside it is followed as before; the server's submit check
// leaves out the same classes (the model is checked against 10, not 11); a shard outside the root
// is refused at submit.
TEST_F(ImagesEndToEndTest, SymbolicLinksOutOfTheDataRootAreLeftOut) {
  // Outside the root: a whole class directory and one image.
  const std::string outside = cluster_.dir() + "/outside";
  std::filesystem::create_directories(outside + "/intruder");
  std::filesystem::copy_file(
      root_ + "/png/train/0/" +
          std::filesystem::directory_iterator(root_ + "/png/train/0")->path().filename().string(),
      outside + "/intruder/x.png");
  std::filesystem::copy_file(outside + "/intruder/x.png", outside + "/secret.png");
  std::filesystem::create_directory_symlink(outside + "/intruder", root_ + "/png/train/intruder");
  std::filesystem::create_symlink(outside + "/secret.png", root_ + "/png/train/1/secret.png");
  // Inside the root: a link to an image of the same folder is followed.
  std::filesystem::create_symlink(
      root_ + "/png/train/2/" +
          std::filesystem::directory_iterator(root_ + "/png/train/2")->path().filename().string(),
      root_ + "/png/train/2/again.png");
  std::filesystem::create_symlink(outside + "/secret.png", root_ + "/shards/train-000003.tar");

  cluster_.StartWorker("w1", {"--data-root", root_});
  v1::JobSpec spec = ImageJob("image_folder", "png/train");
  spec.mutable_train()->set_epochs(1);
  spec.mutable_dataset()->set_classes(10);  // refused at submit if the outside class counted
  absl::StatusOr<v1::Job> done = cluster_.RunJob(spec, absl::Minutes(3));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  const std::string log = Log(done->id());
  // 3000 images, one more through the inside link, none from outside.
  EXPECT_TRUE(absl::StrContains(log, "3001 training samples")) << log;
  EXPECT_TRUE(absl::StrContains(log,
                                "left out (leads outside the data root through a symbolic "
                                "link): png/train/intruder"))
      << log;
  EXPECT_TRUE(absl::StrContains(log, "png/train/1/secret.png")) << log;
  EXPECT_TRUE(absl::StrContains(log, "2 entries of png/train left out")) << log;
  // Nothing names where the links lead.
  EXPECT_FALSE(absl::StrContains(log, outside)) << log;

  v1::JobSpec shards = ImageJob("shards", "shards/train-{000000..000003}.tar");
  absl::StatusOr<v1::Job> refused = cluster_.Submit(shards);
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "leads outside the data root"))
      << refused.status();
  EXPECT_FALSE(absl::StrContains(refused.status().message(), outside)) << refused.status();
}

TEST_F(ImagesEndToEndTest, BadImagesAreSkippedAndCountedUntilThereAreTooMany) {
  // Three training images damaged: truncated, zeroed, not an image at all.
  const std::string train = root_ + "/png/train";
  std::vector<std::string> victims;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(train)) {
    if (entry.is_regular_file() && victims.size() < 3) victims.push_back(entry.path().string());
  }
  ASSERT_EQ(victims.size(), 3u);
  std::filesystem::resize_file(victims[0], 20);
  std::ofstream(victims[1], std::ios::binary | std::ios::trunc) << std::string(300, '\0');
  std::ofstream(victims[2], std::ios::binary | std::ios::trunc) << "no image here";
  cluster_.StartWorker("w1", {"--data-root", root_});

  // Three epochs meet the three bad images three times each: three bad samples, within a limit
  // of 3 (the limit counts images, not skips).
  v1::JobSpec tolerant = ImageJob("image_folder", "png/train");
  tolerant.mutable_train()->set_epochs(3);
  tolerant.mutable_dataset()->set_max_bad_samples(3);
  absl::StatusOr<v1::Job> submitted = cluster_.Submit(tolerant);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  absl::StatusOr<v1::Job> done = cluster_.WaitForFinal(submitted->id(), absl::Minutes(2));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
  const std::string log = Log(done->id());
  // Decoded once by the agent, where they fail; the loaders then name and count them.
  EXPECT_TRUE(absl::StrContains(log, "3 did not decode and are left to the loaders")) << log;
  for (const std::string& victim : victims) {
    const std::string relative = victim.substr(root_.size() + 1);
    size_t named = 0;
    for (size_t at = log.find("bad sample " + relative); at != std::string::npos;
         at = log.find("bad sample " + relative, at + 1)) {
      ++named;
    }
    EXPECT_EQ(named, 1u) << relative << " named " << named << " times in:\n" << log;
  }

  v1::JobSpec strict = tolerant;
  strict.set_name("strict");
  strict.mutable_dataset()->set_max_bad_samples(1);
  submitted = cluster_.Submit(strict);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  done = cluster_.WaitForFinal(submitted->id(), absl::Minutes(2));
  ASSERT_TRUE(done.ok()) << done.status();
  ASSERT_EQ(done->state(), v1::JOB_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(done->error(), "dataset.max_bad_samples (1)")) << done->error();
  EXPECT_EQ(done->attempt(), 1) << "bad data is not retried";
}

TEST_F(ImagesEndToEndTest, MissingShardsAndUnknownTestClassesAreRefusedAtSubmit) {
  absl::StatusOr<v1::Job> refused =
      cluster_.Submit(ImageJob("shards", "shards/train-{000000..000004}.tar"));
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_EQ(refused.status().message(),
            "dataset.train_images: shard shards/train-000003.tar not found (2 of the 5 shards "
            "the pattern names are missing)");

  // A test class the training set does not have (with an image: an empty one is refused as
  // empty first).
  std::filesystem::create_directories(root_ + "/png/test/zebra");
  std::filesystem::path some_image;
  for (const auto& dir : std::filesystem::directory_iterator(root_ + "/png/test")) {
    if (dir.path().filename() == "zebra") continue;
    some_image = std::filesystem::directory_iterator(dir.path())->path();
    break;
  }
  ASSERT_FALSE(some_image.empty());
  std::filesystem::copy_file(some_image, root_ + "/png/test/zebra/z.png");
  refused = cluster_.Submit(ImageJob("image_folder", "png/train"));
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_TRUE(absl::StartsWith(refused.status().message(),
                               "dataset.test_images: class directory 'zebra' is not among the "
                               "training classes ("))
      << refused.status();

  std::filesystem::remove(root_ + "/png/test/zebra/z.png");
  refused = cluster_.Submit(ImageJob("image_folder", "png/train"));
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_EQ(refused.status().message(),
            "dataset.test_images: png/test/zebra: class directory without any .jpg, .jpeg or .png "
            "file; remove it or add its images");
}

// stoker-worker --jpeg-cache-dir: a JPEG folder's loaders build the cache in the first epoch, read
// it in the second, and a later job reads it from its first.
TEST_F(ImagesEndToEndTest, AJpegFolderIsReadThroughTheWorkersJpegCache) {
  const CommandResult exported = RunCommand(absl::StrCat(
      STOKER_DATASET_PATH, " export-idx --images ", kFashionMnistDir,
      "/train-images-idx3-ubyte.gz --labels ", kFashionMnistDir,
      "/train-labels-idx1-ubyte.gz --out ", root_, "/jpeg/train --format jpeg --limit 600 2>&1"));
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  const std::string cache = cluster_.dir() + "/jpeg-cache";
  cluster_.StartWorker("w1", {"--data-root", root_, "--jpeg-cache-dir", cache});
  std::vector<std::string> loader_logs;
  for (int job = 0; job < 2; ++job) {
    v1::JobSpec spec = ImageJob("image_folder", "jpeg/train");
    spec.set_name(absl::StrCat("jpeg-cache-", job));
    spec.mutable_dataset()->set_decoded_cache("off");  // else the loaders never decode
    spec.mutable_train()->set_epochs(2);
    spec.mutable_loader()->set_processes(1);
    absl::StatusOr<v1::Job> done = cluster_.RunJob(spec, absl::Minutes(3));
    ASSERT_TRUE(done.ok()) << done.status();
    ASSERT_EQ(done->state(), v1::JOB_STATE_SUCCEEDED) << done->error();
    std::ifstream in(cluster_.dir() + "/w1/" + done->id() + "-a1/loader-0.log");
    loader_logs.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // 600 JPEGs: built in the first job's first epoch, hits from then on.
  EXPECT_TRUE(absl::StrContains(loader_logs[0], "jpeg cache, epoch 0: 600 built ("))
      << loader_logs[0];
  EXPECT_TRUE(absl::StrContains(loader_logs[0], "jpeg cache, epoch 1: 600 hits")) << loader_logs[0];
  EXPECT_TRUE(absl::StrContains(loader_logs[1], "jpeg cache, epoch 0: 600 hits")) << loader_logs[1];
  EXPECT_FALSE(absl::StrContains(loader_logs[1], "built")) << loader_logs[1];
  int entries = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(cache)) {
    entries += e.path().extension() == ".jpg" ? 1 : 0;
  }
  EXPECT_EQ(entries, 600);
}

}  // namespace
}  // namespace stoker::testing
