// Exit codes of Stoker's worker-side programs: stoker-trainer, stoker-loader and stoker-worker
// (the agent). One table, so the agent's job runner reads a child's status with the same names the
// child wrote it with. The CLI (client/main.cc) has its own, user-facing codes.
#ifndef STOKER_COMMON_EXIT_CODES_H_
#define STOKER_COMMON_EXIT_CODES_H_

namespace stoker {

inline constexpr int kExitSuccess = 0;
// The program could not do its work (a region it cannot use, a lost parent, a failed write, a
// setup error); a retry may succeed.
inline constexpr int kExitFailure = 1;
// Bad data or spec: retrying the job cannot help. Also the agent's bad configuration (token, TLS).
inline constexpr int kExitBadInput = 2;
// The job was stopped (cancel, or the agent asked it to end).
inline constexpr int kExitStopped = 3;
// Bad command-line arguments (EX_USAGE).
inline constexpr int kExitUsage = 64;

}  // namespace stoker

#endif  // STOKER_COMMON_EXIT_CODES_H_
