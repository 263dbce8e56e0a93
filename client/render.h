// Text for people: tables, job details, event lines and the live progress line. Pure formatting,
// so it is unit-tested without a server.
#ifndef STOKER_CLIENT_RENDER_H_
#define STOKER_CLIENT_RENDER_H_

#include <string>
#include <vector>

#include "stoker.pb.h"

namespace stoker {

std::string JobTable(const v1::ListJobsResponse& jobs);
std::string JobDetails(const v1::Job& job);
std::string WorkerTable(const v1::ListWorkersResponse& workers);
// One line per event: "12:00:01 [attempt 1] epoch 3/10: test accuracy 0.8612, loss 0.3810".
std::string EventLine(const v1::JobEvent& event);
// "epoch 3/10 [#####.....] 40% step 1876/4690 loss 0.4123 61.2k samples/s ETA 0:42".
std::string ProgressText(const v1::TrainingProgress& progress, int bar_width);
// "j-000001 succeeded: test accuracy 0.8876 (10 epochs, 52.3 s)" or the failure and its reason.
std::string FinalSummary(const v1::Job& job);
// A job's metric history (GetMetrics' points of one kind) as a table or CSV ("table", "csv"):
// step, epoch, attempt, time, train loss, test loss and accuracy (epochs), samples/s, stall.
std::string MetricsText(const std::vector<v1::MetricPoint>& points, const std::string& format);
// Left-aligned columns separated by two spaces, the first row a header.
std::string TextTable(const std::vector<std::vector<std::string>>& rows);
// "2026-12-05 04:11:28" in local time; "-" for 0.
std::string LocalClock(int64_t unix_ms);
// "1:02:03" / "4:05".
std::string FormatSeconds(double seconds);

// Keeps one terminal line updated in place (TTY), or prints a progress line every few seconds.
class ProgressLine {
 public:
  explicit ProgressLine(bool tty) : tty_(tty) {}
  void Update(const v1::TrainingProgress& progress);
  // Erases the live line so that other output starts on a clean line.
  void Clear();

 private:
  bool tty_;
  bool shown_ = false;
  int64_t last_print_ms_ = 0;
};

}  // namespace stoker

#endif  // STOKER_CLIENT_RENDER_H_
