// Exit codes of stoker-trainer and stoker-loader, read by the agent's supervisor.
#ifndef STOKER_WORKER_EXIT_CODES_H_
#define STOKER_WORKER_EXIT_CODES_H_

namespace stoker {

inline constexpr int kExitSuccess = 0;
// Bad data or spec: retrying the job cannot help.
inline constexpr int kExitBadInput = 2;
// The job was stopped (cancel, or the agent asked it to end).
inline constexpr int kExitStopped = 3;
// Anything else (a crash, a lost peer) may succeed on retry.
inline constexpr int kExitUsage = 64;

}  // namespace stoker

#endif  // STOKER_WORKER_EXIT_CODES_H_
