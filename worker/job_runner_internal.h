// What job_runner.cc and job_runner_data.cc share; not for other users.
#ifndef STOKER_WORKER_JOB_RUNNER_INTERNAL_H_
#define STOKER_WORKER_JOB_RUNNER_INTERNAL_H_

#include <string>

#include "stoker.pb.h"

namespace stoker {

// A log line of the job's event stream.
inline v1::JobEvent LogEvent(const std::string& message) {
  v1::JobEvent event;
  event.set_type(v1::EVENT_TYPE_LOG);
  event.set_message(message);
  return event;
}

}  // namespace stoker

#endif  // STOKER_WORKER_JOB_RUNNER_INTERNAL_H_
