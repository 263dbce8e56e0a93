// Copies into ring slots with non-temporal (streaming) stores.
//
// A loader writes a batch that another process, on another core, reads next. With ordinary
// stores the batch sits dirty in the loader core's cache and the consumer pulls every line
// across cores; on the 2-vCPU VM this project is built on that ran at 6-8 GB/s. Streaming
// stores send the lines to memory instead, and the consumer reads them from there at 23-28 GB/s
// (bench/RESULTS.md, "bench/pipeline"). They are weakly ordered: JobRegion::Publish fences them
// before it publishes the slot, so a consumer never sees a slot before its bytes.
#ifndef STOKER_DATA_STREAM_COPY_H_
#define STOKER_DATA_STREAM_COPY_H_

#include <cstddef>

namespace stoker {

// memcpy(dst, src, bytes), with streaming stores for the 16-byte-aligned part of `dst` where
// the CPU has them (x86-64); ordinary stores for the unaligned head and tail, for short copies,
// and on other CPUs. The ranges must not overlap. Call StreamFence() before handing `dst` to
// another thread or process (JobRegion::Publish does).
void StreamCopy(void* dst, const void* src, size_t bytes);

// Orders every earlier StreamCopy before later stores (sfence on x86-64, nothing elsewhere).
void StreamFence();

}  // namespace stoker

#endif  // STOKER_DATA_STREAM_COPY_H_
