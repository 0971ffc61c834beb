// Phase timestamps of the resolve kernel, for finding its critical path on a
// GPU (ffi/bench/resolve_bench.cu --phases). Off by default: only a build with
// -DHISPARSE_RESOLVE_PHASE_CLOCK records them (thread 0 of each block writes
// clock64() at each phase boundary and the global timer at entry and exit);
// every other build compiles the marks to nothing and does not define
// ReadResolvePhaseClock.
#ifndef HISPARSE_FFI_RESOLVE_PHASE_CLOCK_H_
#define HISPARSE_FFI_RESOLVE_PHASE_CLOCK_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace hisparse {

// Stamps per stream: clock64() at the marks below, then the global timer (ns)
// at entry and exit. A mark a block did not reach stays 0.
enum ResolvePhaseMark : int {
  kMarkEntry = 0,     // kernel entry
  kMarkTable = 1,     // after barrier 1 (keys cleared, loads issued)
  kMarkProbe = 2,     // after barrier 2 (table built, slot_record staged)
  kMarkVerdict = 3,   // after barrier 3 (probes done, the state's verdict)
  kMarkLru = 4,       // new lru, slots of hits and the miss fill written
  kMarkMissRank = 5,  // after barrier 4 (misses flagged and counted)
  kMarkExit = 6,      // the block's last statement (any return)
  kMarkCount = 7,
  kStampEntryNs = kMarkCount,
  kStampExitNs = kMarkCount + 1,
  kStampsPerStream = kMarkCount + 2,
};
inline constexpr int kPhaseClockStreams = 1024;  // streams beyond this are not recorded

#ifdef HISPARSE_RESOLVE_PHASE_CLOCK
// Copies the stamps of the first `streams` streams of the last resolve launch
// into host[streams x kStampsPerStream] and clears them for the next one.
cudaError_t ReadResolvePhaseClock(uint64_t* host, int streams);
#endif

}  // namespace hisparse

#endif  // HISPARSE_FFI_RESOLVE_PHASE_CLOCK_H_
