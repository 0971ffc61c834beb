// Bit-exactness check of the CUDA RESOLVE and pool write against the CPU
// reference (resolve_cpu.cc): no XLA, no Python. Every case runs a sequence of
// calls with the state carried, under each launch variant (fused / split /
// auto, fetch on / off), and compares slots, miss_records, miss_slots, misses,
// invalid, malformed and the whole state (slot_record, lru, hot of every
// layer) byte for byte after every call. Guard bytes around every device
// buffer catch writes out of bounds; outputs are poisoned before each call so
// unwritten entries show up. The malformed_* cases corrupt some streams' rows
// before each call (lru values outside [0, B) or repeated, slot records
// outside [-1, R) or held twice): those streams must resolve nothing, bit for
// bit like the CPU, and the other streams as usual.
// The */range variants resolve a stream range per call (resolve.h "Stream
// range": a random range, the last stream, every stream, an empty one, half
// the batch) on the whole selection, and must give what the whole-batch CPU
// call gives with -1 outside the range (malformed 0 outside it), bit for bit,
// state included; so must the CPU range call. fork16/range is the prefetch's
// path: the resolve without its copy, then the copy alone with 16 blocks.
//
// Build (from the repository root; `make -C ffi/tests` does the same):
//   mkdir -p build/tests
//   nvcc -O2 -arch=sm_90 -std=c++17 -lineinfo -I ffi ffi/tests/resolve_cuda_check.cu ffi/resolve_kernels.cu ffi/resolve_cpu.cc -o build/tests/resolve_cuda_check
// Run:
//   build/tests/resolve_cuda_check              # every case
//   build/tests/resolve_cuda_check --quick      # small case set, for compute-sanitizer
//   build/tests/resolve_cuda_check --only dup   # cases whose name contains "dup"
//   build/tests/resolve_cuda_check --seed 7     # other random inputs
//   build/tests/resolve_cuda_check --quiet      # print failures and the summary only
//   compute-sanitizer --tool memcheck --error-exitcode 3 build/tests/resolve_cuda_check --quick --quiet
//   compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 3 build/tests/resolve_cuda_check --quick --quiet
// Last line: "N passed, M failed"; the exit status is non-zero on failure.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "harness.h"
#include "pool_write.h"
#include "pool_write_cuda.h"
#include "resolve.h"
#include "resolve_cuda.h"

namespace {

using harness::Format;

using hisparse::PoolWriteDims;
using hisparse::ResolveBuffers;
using hisparse::ResolveDims;
using hisparse::ResolveLaunchPlan;
using hisparse::StreamRange;

using harness::DeviceBuffer;
using harness::Rng;
using harness::Uniform;
using harness::Unit;

// ---------------------------------------------------------------------------
// Host buffers.

// Pinned host memory, mapped (the kernels use the host pointer through UVA).
class PinnedBuffer {
 public:
  PinnedBuffer(size_t bytes, size_t misalign_bytes = 0) : bytes_(bytes), lead_(misalign_bytes) {
    CUDA_OK(cudaHostAlloc(reinterpret_cast<void**>(&base_), bytes + misalign_bytes + 16,
                          cudaHostAllocMapped | cudaHostAllocPortable));
    void* device = nullptr;
    CUDA_OK(cudaHostGetDevicePointer(&device, base_, 0));
    if (device != base_) {
      std::fprintf(stderr, "pinned memory is not addressed by its host pointer (no UVA?)\n");
      std::exit(2);
    }
  }
  ~PinnedBuffer() { cudaFreeHost(base_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  uint8_t* get() const { return base_ + lead_; }
  size_t bytes() const { return bytes_; }

 private:
  uint8_t* base_ = nullptr;
  size_t bytes_, lead_;
};

void FillRandom(uint8_t* p, size_t n, Rng& rng) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = rng();
    std::memcpy(p + i, &v, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(rng());
}

// ---------------------------------------------------------------------------
// Cases.

struct Shape {
  int64_t layers, streams, top_k, hot_slots, pool_records, record_bytes;
};

// The CPU model's state, which generators read to pick resident ids.
struct State {
  Shape shape;
  std::vector<uint8_t> hot;          // [L, S, B, W]
  std::vector<int32_t> slot_record;  // [L, S, B]
  std::vector<int32_t> lru;          // [L, S, B]
};

struct CallInput {
  std::vector<int32_t> selection;  // [S, k]
  std::vector<int32_t> sealed;     // [S]
  int32_t layer = 0;
};

using Generator = std::function<void(int call, Rng& rng, const State& state, CallInput& in)>;
// Changes the state before a call (both implementations get the result).
using Corruptor = std::function<void(int call, Rng& rng, State& state)>;

struct Case {
  std::string name;
  Shape shape;
  int calls = 4;
  bool random_initial_state = false;
  size_t pool_misalign = 0;  // bytes added to the pool's base address
  size_t hot_misalign = 0;   // bytes added to the hot buffer's base address
  Generator generate;
  Corruptor corrupt;  // empty: the state is only ever changed by RESOLVE
  bool expect_no_misses_after_first = false;  // sanity of the case itself
  bool expect_malformed = false;  // sanity: some stream, not all, is reported malformed
};

// Default selection generator: a mix of padding, invalid ids, duplicates,
// ids resident in the chosen layer (hits) and random sealed ids (misses).
struct Mix {
  double pad = 0.05, invalid = 0.03, dup = 0.05, resident = 0.5;
  enum class Sealed { kAll, kRandom, kNonPositive, kBeyondPool } sealed = Sealed::kRandom;
  enum class Layer { kRandom, kZero, kSometimesOutOfRange } layer = Layer::kRandom;
};

int32_t InvalidId(Rng& rng, int64_t limit, int64_t pool_records) {
  switch (Uniform(rng, 0, 6)) {
    case 0: return static_cast<int32_t>(-2 - Uniform(rng, 0, 1000));
    case 1: return INT32_MIN;
    case 2: return INT32_MAX;
    case 3: return static_cast<int32_t>(pool_records + Uniform(rng, 0, 1000));
    case 4: return static_cast<int32_t>(pool_records);
    case 5: return static_cast<int32_t>(limit);  // first id past the sealed ones
    default: return static_cast<int32_t>(limit + Uniform(rng, 0, 100));
  }
}

Generator MixGenerator(Mix mix) {
  return [mix](int /*call*/, Rng& rng, const State& st, CallInput& in) {
    const Shape& d = st.shape;
    const int64_t S = d.streams, k = d.top_k, B = d.hot_slots, R = d.pool_records;
    switch (mix.layer) {
      case Mix::Layer::kZero: in.layer = 0; break;
      case Mix::Layer::kRandom: in.layer = static_cast<int32_t>(Uniform(rng, 0, d.layers - 1)); break;
      case Mix::Layer::kSometimesOutOfRange: {
        const int32_t bad[] = {-1, static_cast<int32_t>(d.layers), INT32_MAX, INT32_MIN, -7};
        in.layer = Unit(rng) < 0.4 ? bad[Uniform(rng, 0, 4)]
                                   : static_cast<int32_t>(Uniform(rng, 0, d.layers - 1));
        break;
      }
    }
    const int64_t lay = (in.layer >= 0 && in.layer < d.layers) ? in.layer : 0;
    in.sealed.resize(S);
    in.selection.resize(S * k);
    for (int64_t s = 0; s < S; ++s) {
      int64_t sealed = R;
      switch (mix.sealed) {
        case Mix::Sealed::kAll: sealed = R; break;
        case Mix::Sealed::kRandom: sealed = Unit(rng) < 0.5 ? R : Uniform(rng, 1, R); break;
        case Mix::Sealed::kNonPositive: {
          const int64_t options[] = {0, -1, -5, INT32_MIN, R, Uniform(rng, 1, R)};
          sealed = options[Uniform(rng, 0, 5)];
          break;
        }
        case Mix::Sealed::kBeyondPool:
          sealed = Unit(rng) < 0.5 ? INT32_MAX : R + Uniform(rng, 1, 1000);
          break;
      }
      in.sealed[s] = static_cast<int32_t>(sealed);
      const int64_t limit = std::max<int64_t>(0, std::min<int64_t>(sealed, R));
      std::vector<int32_t> resident;
      const int32_t* rec = st.slot_record.data() + (lay * S + s) * B;
      for (int64_t b = 0; b < B; ++b)
        if (rec[b] >= 0) resident.push_back(rec[b]);
      int32_t* sel = in.selection.data() + s * k;
      for (int64_t j = 0; j < k; ++j) {
        double u = Unit(rng);
        int32_t id;
        if ((u -= mix.pad) < 0) {
          id = -1;
        } else if ((u -= mix.invalid) < 0) {
          id = InvalidId(rng, limit, R);
        } else if ((u -= mix.dup) < 0 && j > 0) {
          id = sel[Uniform(rng, 0, j - 1)];
        } else if ((u -= mix.resident) < 0 && !resident.empty()) {
          id = resident[Uniform(rng, 0, resident.size() - 1)];
        } else if (limit > 0) {
          id = static_cast<int32_t>(Uniform(rng, 0, limit - 1));
        } else {
          id = static_cast<int32_t>(Uniform(rng, 0, R + 10));
        }
        sel[j] = id;
      }
    }
  };
}

// k distinct ids per stream, drawn from [0, R), in random order.
void DistinctIds(Rng& rng, int64_t k, int64_t lo, int64_t hi, int32_t* out) {
  std::vector<int32_t> pool(hi - lo);
  std::iota(pool.begin(), pool.end(), static_cast<int32_t>(lo));
  for (int64_t j = 0; j < k; ++j) {
    const int64_t pick = Uniform(rng, j, pool.size() - 1);
    std::swap(pool[j], pool[pick]);
    out[j] = pool[j];
  }
}

// Call c selects, in every stream of layer 0, k ids no earlier call used:
// [c * k, (c + 1) * k) in random order, so every call misses on every id.
void AllNewIds(int call, Rng& rng, const State& st, CallInput& in) {
  const Shape& d = st.shape;
  in.layer = 0;
  in.sealed.assign(d.streams, static_cast<int32_t>(d.pool_records));
  in.selection.resize(d.streams * d.top_k);
  for (int64_t s = 0; s < d.streams; ++s)
    DistinctIds(rng, d.top_k, call * d.top_k, (call + 1) * d.top_k, in.selection.data() + s * d.top_k);
}

// Ways to break a row of the state (resolve.h, "Malformed state").
enum class Fault {
  kLruOutOfRange,    // an lru value >= B (1 << 30, INT32_MAX, 0x8000, 0xffff, B + 1)
  kLruNegative,      // an lru value < 0
  kLruEqualsB,       // an lru value == B
  kLruRepeated,      // one slot twice in lru (so another one missing)
  kRecordBelowEmpty, // a slot record < -1
  kRecordPastPool,   // a slot record >= R
  kRecordTwice,      // one record id >= 0 in two slots
  kAny,              // one of the above, at random
};

void BreakRow(Fault fault, Rng& rng, int64_t B, int64_t R, int32_t* rec, int32_t* lru) {
  if (fault == Fault::kAny) fault = static_cast<Fault>(Uniform(rng, 0, 6));
  if (B < 2 && (fault == Fault::kLruRepeated || fault == Fault::kRecordTwice))
    fault = Fault::kLruEqualsB;
  const int64_t i = Uniform(rng, 0, B - 1);
  const int64_t other = B > 1 ? (i + Uniform(rng, 1, B - 1)) % B : i;
  switch (fault) {
    case Fault::kLruOutOfRange: {
      const int32_t values[] = {1 << 30, INT32_MAX, 0x8000, 0xffff, static_cast<int32_t>(B + 1)};
      lru[i] = values[Uniform(rng, 0, 4)];
      break;
    }
    case Fault::kLruNegative: {
      const int32_t values[] = {-1, -2, INT32_MIN};
      lru[i] = values[Uniform(rng, 0, 2)];
      break;
    }
    case Fault::kLruEqualsB: lru[i] = static_cast<int32_t>(B); break;
    case Fault::kLruRepeated: lru[i] = lru[other]; break;
    case Fault::kRecordBelowEmpty: {
      const int32_t values[] = {-2, -3, INT32_MIN};
      rec[i] = values[Uniform(rng, 0, 2)];
      break;
    }
    case Fault::kRecordPastPool: {
      const int32_t values[] = {static_cast<int32_t>(R), static_cast<int32_t>(R + 1), INT32_MAX};
      rec[i] = values[Uniform(rng, 0, 2)];
      break;
    }
    case Fault::kRecordTwice: {
      const int32_t id = rec[i] >= 0 ? rec[i] : static_cast<int32_t>(Uniform(rng, 0, R - 1));
      rec[i] = rec[other] = id;
      break;
    }
    case Fault::kAny: break;
  }
}

// Before each call, in every layer: breaks stream call % (S - 1), then each
// other row but those of the last stream with probability `break_p`, and
// empties rows (slot_record -1, lru 0..B-1, as reset_streams does) with
// probability `reset_p`. The last stream is only ever changed by RESOLVE, so
// every call has broken and healthy streams whatever layer it resolves.
Corruptor CorruptRows(Fault fault, double break_p, double reset_p) {
  return [=](int call, Rng& rng, State& st) {
    const Shape& d = st.shape;
    const int64_t B = d.hot_slots, S = d.streams;
    for (int64_t ls = 0; ls < d.layers * S; ++ls) {
      const int64_t s = ls % S;
      if (s == S - 1) continue;
      int32_t* rec = st.slot_record.data() + ls * B;
      int32_t* lru = st.lru.data() + ls * B;
      const double u = Unit(rng);
      if (s == call % (S - 1) || u < break_p) {
        BreakRow(fault, rng, B, d.pool_records, rec, lru);
      } else if (u < break_p + reset_p) {
        std::fill(rec, rec + B, -1);
        std::iota(lru, lru + B, 0);
      }
    }
  };
}

// ---------------------------------------------------------------------------
// Comparison and reporting.

struct Report {
  std::string label;
  int printed = 0;
  bool failed = false;
  static constexpr int kMaxLines = 12;
  void Line(const std::string& text) {
    failed = true;
    if (printed < kMaxLines) std::printf("  FAIL %s: %s\n", label.c_str(), text.c_str());
    if (printed == kMaxLines) std::printf("  FAIL %s: (further mismatches not shown)\n", label.c_str());
    ++printed;
  }
};

// Compares int32 arrays laid out as [outer, inner]; returns the mismatch count.
int64_t CompareInts(Report& report, int call, const char* field, const int32_t* expected,
                    const int32_t* got, int64_t outer, int64_t inner, const char* outer_name,
                    const char* inner_name, int64_t layer_streams = 0) {
  int64_t bad = 0;
  int shown = 0;
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      const int64_t at = o * inner + i;
      if (expected[at] == got[at]) continue;
      ++bad;
      if (shown++ < 4) {
        std::string where;
        if (outer == 1) {
          where = Format("%s %lld", inner_name, (long long)i);
        } else if (layer_streams > 0) {
          where = Format("layer %lld, stream %lld, %s %lld", (long long)(o / layer_streams),
                         (long long)(o % layer_streams), inner_name, (long long)i);
        } else {
          where = Format("%s %lld, %s %lld", outer_name, (long long)o, inner_name, (long long)i);
        }
        report.Line(Format("call %d: %s[%s]: expected %d, got %d", call, field, where.c_str(),
                           expected[at], got[at]));
      }
    }
  }
  if (bad > 4) report.Line(Format("call %d: %s: %lld mismatches in all", call, field, (long long)bad));
  return bad;
}

int64_t CompareHot(Report& report, int call, const uint8_t* expected, const uint8_t* got,
                   const Shape& d) {
  const int64_t W = d.record_bytes, rows = d.layers * d.streams * d.hot_slots;
  int64_t bad_rows = 0;
  int shown = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* e = expected + r * W;
    const uint8_t* g = got + r * W;
    if (std::memcmp(e, g, W) == 0) continue;
    ++bad_rows;
    if (shown++ < 4) {
      int64_t byte = 0;
      while (e[byte] == g[byte]) ++byte;
      const int64_t slot = r % d.hot_slots, ls = r / d.hot_slots;
      report.Line(Format("call %d: hot[layer %lld, stream %lld, slot %lld] differs from byte %lld "
                         "(expected 0x%02x, got 0x%02x)",
                         call, (long long)(ls / d.streams), (long long)(ls % d.streams),
                         (long long)slot, (long long)byte, e[byte], g[byte]));
    }
  }
  if (bad_rows > 4)
    report.Line(Format("call %d: hot: %lld rows differ in all", call, (long long)bad_rows));
  return bad_rows;
}

// ---------------------------------------------------------------------------
// One case under one launch variant.

struct Variant {
  ResolveLaunchPlan plan;
  bool fetch;
  const char* name;
  bool range = false;  // a stream range per call (PickRange), against the padded CPU call
  bool fork = false;   // resolve without fetch, then LaunchResolveFetch with 16 blocks (prefetch)
};

const Variant kVariants[] = {
    {ResolveLaunchPlan::kFused, true, "fused/fetch"},
    {ResolveLaunchPlan::kFused, false, "fused/no-fetch"},
    {ResolveLaunchPlan::kSplit, true, "split/fetch"},
    {ResolveLaunchPlan::kSplit, false, "split/no-fetch"},
    {ResolveLaunchPlan::kAuto, true, "auto/fetch"},
    {ResolveLaunchPlan::kFused, true, "fused/fetch/range", true},
    {ResolveLaunchPlan::kSplit, true, "split/fetch/range", true},
    {ResolveLaunchPlan::kAuto, true, "fork16/range", true, true},
};

// The prefetch's fetch blocks (prefetch_cuda.h kPrefetchFetchBlocks; that header's code is not
// linked here).
constexpr int64_t kForkFetchBlocks = 16;

// Call `call`'s stream range of S streams: in turn a random non-empty range, the last stream,
// every stream, an empty range (anywhere), the second half (an overlap group), any range.
StreamRange PickRange(int call, Rng& rng, int64_t S) {
  switch (call % 6) {
    case 0: {
      const int64_t begin = Uniform(rng, 0, S - 1);
      return {begin, Uniform(rng, 1, S - begin)};
    }
    case 1: return {S - 1, 1};
    case 2: return {0, S};
    case 3: return {Uniform(rng, 0, S), 0};
    case 4: return {S / 2, S - S / 2};
    default: {
      const int64_t begin = Uniform(rng, 0, S);
      return {begin, Uniform(rng, 0, S - begin)};
    }
  }
}

State InitialState(const Case& c, Rng& rng) {
  const Shape& d = c.shape;
  const int64_t LS = d.layers * d.streams, B = d.hot_slots;
  State st;
  st.shape = d;
  st.hot.resize(LS * B * d.record_bytes);
  FillRandom(st.hot.data(), st.hot.size(), rng);
  st.slot_record.assign(LS * B, -1);
  st.lru.resize(LS * B);
  for (int64_t ls = 0; ls < LS; ++ls) {
    int32_t* lru = st.lru.data() + ls * B;
    std::iota(lru, lru + B, 0);
    if (!c.random_initial_state) continue;
    // A well-formed random state: distinct records, some slots empty, any lru order.
    std::shuffle(lru, lru + B, rng);
    const int64_t held = Uniform(rng, 0, std::min<int64_t>(B, d.pool_records));
    std::vector<int32_t> ids(held);
    DistinctIds(rng, held, 0, d.pool_records, ids.data());
    int32_t* rec = st.slot_record.data() + ls * B;
    std::vector<int32_t> slots(B);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng);
    for (int64_t h = 0; h < held; ++h) rec[slots[h]] = ids[h];
  }
  return st;
}

bool RunVariant(const Case& c, const Variant& v, const PinnedBuffer& pool, uint64_t seed,
                bool verbose) {
  const Shape& d = c.shape;
  const int64_t L = d.layers, S = d.streams, k = d.top_k, B = d.hot_slots, W = d.record_bytes;
  Report report;
  report.label = "[" + c.name + " " + v.name + "]";

  Rng rng(seed);
  State cpu = InitialState(c, rng);
  DeviceBuffer<uint8_t> hot(cpu.hot.size(), c.hot_misalign);
  DeviceBuffer<int32_t> slot_record(cpu.slot_record.size()), lru(cpu.lru.size());
  DeviceBuffer<int32_t> selection(S * k), sealed(S), layer(1);
  DeviceBuffer<int32_t> slots(S * k), miss_records(S * k), miss_slots(S * k), misses(S),
      invalid(S), malformed(S);
  hot.Upload(cpu.hot.data());
  slot_record.Upload(cpu.slot_record.data());
  lru.Upload(cpu.lru.data());

  std::vector<int32_t> cpu_slots(S * k), cpu_mrec(S * k), cpu_mslot(S * k), cpu_misses(S),
      cpu_invalid(S), cpu_malformed(S);
  std::vector<int32_t> gpu_slots(S * k), gpu_mrec(S * k), gpu_mslot(S * k), gpu_misses(S),
      gpu_invalid(S), gpu_malformed(S), gpu_rec(cpu.slot_record.size()), gpu_lru(cpu.lru.size());
  int64_t malformed_seen = 0, healthy_seen = 0;
  std::vector<uint8_t> gpu_hot(cpu.hot.size());
  std::vector<uint8_t> pool_before(pool.get(), pool.get() + pool.bytes());

  ResolveDims dims{L, S, k, B, d.pool_records, W};
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Rng input_rng(seed ^ 0x9e3779b97f4a7c15ull);
  Rng range_rng(seed ^ 0x5bd1e9955bd1e995ull);  // apart, so every variant gets the same inputs
  const bool cpu_fetch = v.fetch || v.fork;
  int64_t total_misses = 0;
  for (int call = 0; call < c.calls && !report.failed; ++call) {
    if (c.corrupt) {
      c.corrupt(call, input_rng, cpu);
      slot_record.Upload(cpu.slot_record.data());
      lru.Upload(cpu.lru.data());
    }
    CallInput in;
    c.generate(call, input_rng, cpu, in);
    selection.Upload(in.selection.data());
    sealed.Upload(in.sealed.data());
    layer.Upload(&in.layer);
    for (auto* out : {&slots, &miss_records, &miss_slots, &misses, &invalid, &malformed})
      out->Poison(0x5A);
    // The poison is queued on the legacy stream, which the launch's non-blocking stream does
    // not wait for: without this, a late memset overwrote outputs the kernel had written
    // (seen with three checkers sharing the GPU) and the split plan's copy read a poisoned count.
    CUDA_OK(cudaDeviceSynchronize());

    // CPU reference: the whole-batch call, on a selection of -1 outside the range.
    const StreamRange range = v.range ? PickRange(call, range_rng, S) : hisparse::AllStreams(dims);
    auto outside = [&range](int64_t s) { return s < range.begin || s >= range.begin + range.count; };
    std::vector<int32_t> padded = in.selection;
    for (int64_t s = 0; s < S; ++s)
      if (outside(s)) std::fill(padded.begin() + s * k, padded.begin() + (s + 1) * k, -1);
    const State before = v.range ? cpu : State{};
    std::fill(cpu_slots.begin(), cpu_slots.end(), 0x7b7b7b7b);
    std::fill(cpu_malformed.begin(), cpu_malformed.end(), 0x7b7b7b7b);
    ResolveBuffers host_io{pool.get(),        padded.data(),          in.sealed.data(),
                           cpu.hot.data(),    cpu.slot_record.data(), cpu.lru.data(),
                           cpu_slots.data(),  cpu_mrec.data(),        cpu_mslot.data(),
                           cpu_misses.data(), cpu_invalid.data(),     cpu_malformed.data()};
    hisparse::ResolveCpu(dims, hisparse::AllStreams(dims), in.layer, host_io, cpu_fetch);
    if (v.range) {
      // Outside the range the state is not looked at: no stream there is reported malformed.
      for (int64_t s = 0; s < S; ++s)
        if (outside(s)) cpu_malformed[s] = 0;
      // The CPU range call, on the whole selection, must give the same.
      State mine = before;
      std::vector<int32_t> r_slots(S * k, 0x7b7b7b7b), r_mrec(S * k, 0x7b7b7b7b),
          r_mslot(S * k, 0x7b7b7b7b), r_misses(S, 0x7b7b7b7b), r_invalid(S, 0x7b7b7b7b),
          r_malformed(S, 0x7b7b7b7b);
      ResolveBuffers range_io{pool.get(),         in.selection.data(),     in.sealed.data(),
                              mine.hot.data(),    mine.slot_record.data(), mine.lru.data(),
                              r_slots.data(),     r_mrec.data(),           r_mslot.data(),
                              r_misses.data(),    r_invalid.data(),        r_malformed.data()};
      hisparse::ResolveCpu(dims, range, in.layer, range_io, cpu_fetch);
      const char* label = "cpu range";
      Report& r = report;
      CompareInts(r, call, Format("%s misses", label).c_str(), cpu_misses.data(), r_misses.data(), 1, S, "", "stream");
      CompareInts(r, call, Format("%s invalid", label).c_str(), cpu_invalid.data(), r_invalid.data(), 1, S, "", "stream");
      CompareInts(r, call, Format("%s malformed", label).c_str(), cpu_malformed.data(), r_malformed.data(), 1, S, "",
                  "stream");
      CompareInts(r, call, Format("%s slots", label).c_str(), cpu_slots.data(), r_slots.data(), S, k, "stream", "j");
      CompareInts(r, call, Format("%s miss_records", label).c_str(), cpu_mrec.data(), r_mrec.data(), S, k, "stream",
                  "m");
      CompareInts(r, call, Format("%s miss_slots", label).c_str(), cpu_mslot.data(), r_mslot.data(), S, k, "stream",
                  "m");
      CompareInts(r, call, Format("%s slot_record", label).c_str(), cpu.slot_record.data(), mine.slot_record.data(),
                  L * S, B, "", "slot", S);
      CompareInts(r, call, Format("%s lru", label).c_str(), cpu.lru.data(), mine.lru.data(), L * S, B, "",
                  "position", S);
      if (CompareHot(r, call, cpu.hot.data(), mine.hot.data(), d) > 0) r.Line("(cpu range: hot)");
    }

    // CUDA.
    ResolveBuffers dev_io{pool.get(),      selection.get(),    sealed.get(),
                          hot.get(),       slot_record.get(),  lru.get(),
                          slots.get(),     miss_records.get(), miss_slots.get(),
                          misses.get(),    invalid.get(),      malformed.get()};
    const char* failed_kernel = "?";
    cudaError_t err = hisparse::LaunchResolve(dims, range, layer.get(), dev_io, v.fetch && !v.fork,
                                              v.plan, stream, &failed_kernel);
    if (err == cudaSuccess && v.fork)
      err = hisparse::LaunchResolveFetch(dims, range, layer.get(), dev_io, kForkFetchBlocks, stream,
                                         &failed_kernel);
    if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess) {
      report.Line(Format("call %d: %s: %s", call, failed_kernel, cudaGetErrorString(err)));
      break;
    }
    slots.Download(gpu_slots.data());
    miss_records.Download(gpu_mrec.data());
    miss_slots.Download(gpu_mslot.data());
    misses.Download(gpu_misses.data());
    invalid.Download(gpu_invalid.data());
    malformed.Download(gpu_malformed.data());
    slot_record.Download(gpu_rec.data());
    lru.Download(gpu_lru.data());
    hot.Download(gpu_hot.data());

    CompareInts(report, call, "misses", cpu_misses.data(), gpu_misses.data(), 1, S, "", "stream");
    CompareInts(report, call, "invalid", cpu_invalid.data(), gpu_invalid.data(), 1, S, "",
                "stream");
    CompareInts(report, call, "malformed", cpu_malformed.data(), gpu_malformed.data(), 1, S, "",
                "stream");
    CompareInts(report, call, "slots", cpu_slots.data(), gpu_slots.data(), S, k, "stream", "j");
    CompareInts(report, call, "miss_records", cpu_mrec.data(), gpu_mrec.data(), S, k, "stream",
                "m");
    CompareInts(report, call, "miss_slots", cpu_mslot.data(), gpu_mslot.data(), S, k, "stream",
                "m");
    CompareInts(report, call, "slot_record", cpu.slot_record.data(), gpu_rec.data(), L * S, B, "",
                "slot", S);
    CompareInts(report, call, "lru", cpu.lru.data(), gpu_lru.data(), L * S, B, "", "position", S);
    CompareHot(report, call, cpu.hot.data(), gpu_hot.data(), d);
    for (auto [buf, name] :
         {std::pair{&slot_record, "slot_record"}, {&lru, "lru"}, {&selection, "selection"},
          {&sealed, "sealed"}, {&layer, "layer"}, {&slots, "slots"},
          {&miss_records, "miss_records"}, {&miss_slots, "miss_slots"}, {&misses, "misses"},
          {&invalid, "invalid"}, {&malformed, "malformed"}}) {
      if (!buf->GuardsIntact()) report.Line(Format("call %d: write outside %s", call, name));
    }
    if (!hot.GuardsIntact()) report.Line(Format("call %d: write outside hot", call));
    // Judged on whole-batch calls only: a range variant's first call loads only its range, so a
    // stream outside it misses when a later call's range takes it in.
    if (call > 0 && c.expect_no_misses_after_first && !v.range) {
      for (int64_t s = 0; s < S; ++s)
        if (cpu_misses[s] != 0)
          report.Line(Format("call %d: case expects only hits, reference has %d misses (stream "
                             "%lld): the case is wrong",
                             call, cpu_misses[s], (long long)s));
    }
    for (int64_t s = 0; s < S; ++s) {
      total_misses += cpu_misses[s];
      malformed_seen += cpu_malformed[s] == 1;
      healthy_seen += cpu_malformed[s] == 0 && in.layer >= 0 && in.layer < L;
    }
  }
  // (The case's own sanity, judged on whole-batch calls: a range may leave out every broken row.)
  if (c.expect_malformed && !v.range && !report.failed && (malformed_seen == 0 || healthy_seen == 0))
    report.Line(Format("case expects malformed and healthy streams, the reference saw %lld and "
                       "%lld: the case is wrong",
                       (long long)malformed_seen, (long long)healthy_seen));
  if (std::memcmp(pool_before.data(), pool.get(), pool.bytes()) != 0)
    report.Line("the host pool changed (RESOLVE must only read it)");
  CUDA_OK(cudaStreamDestroy(stream));
  if (verbose || report.failed) {
    std::printf("%s %s: %d calls, %lld misses, %lld malformed streams\n",
                report.failed ? "FAIL" : "ok  ", report.label.c_str(), c.calls,
                (long long)total_misses, (long long)malformed_seen);
  }
  return !report.failed;
}

// ---------------------------------------------------------------------------
// The case list.

Shape MakeShape(int64_t L, int64_t S, int64_t k, int64_t B, int64_t R, int64_t W) {
  return Shape{L, S, k, B, R, W};
}

std::vector<Case> ResolveCases(bool quick) {
  std::vector<Case> cases;
  auto add = [&](std::string name, Shape shape, int calls, Generator gen) -> Case& {
    Case c;
    c.name = std::move(name);
    c.shape = shape;
    c.calls = calls;
    c.generate = std::move(gen);
    cases.push_back(std::move(c));
    return cases.back();
  };
  const int n = quick ? 3 : 6;  // calls of the generic cases

  Mix plain;
  add("empty_cache_first_call", MakeShape(2, 3, 64, 128, 1000, 40), 1, MixGenerator(plain));
  {
    Mix m;
    m.pad = 0.3;
    add("mixed_sequence", MakeShape(3, 4, 128, 256, 600, 48), quick ? 4 : 12, MixGenerator(m));
  }
  // All hits: the same ids again, then in another order.
  add("all_hits", MakeShape(2, 5, 100, 160, 500, 32), 3,
      [](int call, Rng& rng, const State& st, CallInput& in) {
        static thread_local std::vector<int32_t> first;
        const Shape& d = st.shape;
        in.layer = 1;
        in.sealed.assign(d.streams, static_cast<int32_t>(d.pool_records));
        in.selection.resize(d.streams * d.top_k);
        if (call == 0) {
          for (int64_t s = 0; s < d.streams; ++s)
            DistinctIds(rng, d.top_k, 0, d.pool_records, in.selection.data() + s * d.top_k);
          first = in.selection;
        } else {
          in.selection = first;
          if (call == 2)
            for (int64_t s = 0; s < d.streams; ++s)
              std::shuffle(in.selection.begin() + s * d.top_k,
                           in.selection.begin() + (s + 1) * d.top_k, rng);
        }
      })
      .expect_no_misses_after_first = true;
  // All misses: every call selects k ids no earlier call used.
  add("all_misses", MakeShape(1, 3, 96, 128, 96 * 5, 24), 5, AllNewIds);
  {
    Mix m;
    m.resident = 0.4;
    add("b_equals_k", MakeShape(2, 4, 200, 200, 700, 56), n, MixGenerator(m));
    add("b_equals_k_all_new", MakeShape(1, 2, 64, 64, 64 * 4, 16), 4, AllNewIds);
  }
  add("padding_only", MakeShape(2, 3, 50, 80, 300, 16), 3,
      [](int call, Rng& rng, const State& st, CallInput& in) {
        const Shape& d = st.shape;
        if (call == 1) {  // a real call in between, so the state is not empty
          MixGenerator(Mix{})(call, rng, st, in);
          return;
        }
        in.layer = call % 2;
        in.sealed.assign(d.streams, static_cast<int32_t>(d.pool_records));
        in.selection.assign(d.streams * d.top_k, -1);
      });
  {
    Mix m;
    m.dup = 0.6;
    m.pad = 0.1;
    add("duplicate_ids", MakeShape(2, 4, 256, 300, 400, 32), n, MixGenerator(m));
  }
  add("one_id_repeated", MakeShape(1, 3, 128, 128, 50, 8), 3,
      [](int call, Rng& rng, const State& st, CallInput& in) {
        const Shape& d = st.shape;
        in.layer = 0;
        in.sealed.assign(d.streams, static_cast<int32_t>(d.pool_records));
        in.selection.resize(d.streams * d.top_k);
        for (int64_t s = 0; s < d.streams; ++s) {
          const int32_t id = static_cast<int32_t>(Uniform(rng, 0, d.pool_records - 1));
          for (int64_t j = 0; j < d.top_k; ++j)
            in.selection[s * d.top_k + j] = (j % 3 == 1) ? -1 : (call == 2 ? id : 7);
        }
      });
  {
    Mix m;
    m.invalid = 0.35;
    m.sealed = Mix::Sealed::kRandom;
    add("invalid_ids", MakeShape(2, 4, 128, 192, 300, 24), n, MixGenerator(m));
  }
  {
    Mix m;
    m.sealed = Mix::Sealed::kNonPositive;
    m.invalid = 0.1;
    add("sealed_nonpositive", MakeShape(1, 8, 64, 96, 200, 16), n, MixGenerator(m));
  }
  {
    Mix m;
    m.sealed = Mix::Sealed::kBeyondPool;
    m.invalid = 0.15;
    add("sealed_beyond_pool", MakeShape(1, 4, 64, 96, 150, 16), n, MixGenerator(m));
  }
  {
    Mix m;
    m.layer = Mix::Layer::kSometimesOutOfRange;
    add("layer_out_of_range", MakeShape(3, 4, 96, 128, 400, 24), quick ? 6 : 14,
        MixGenerator(m));
  }
  add("layer_out_of_range_first", MakeShape(2, 2, 32, 48, 100, 8), 2,
      [](int call, Rng& rng, const State& st, CallInput& in) {
        MixGenerator(Mix{})(call, rng, st, in);
        in.layer = call == 0 ? 2 : -1;  // never a valid layer: state must stay initial
      });
  add("several_layers", MakeShape(5, 3, 80, 120, 300, 40), quick ? 6 : 20, MixGenerator(plain));
  {
    Case& c = add("random_initial_state", MakeShape(2, 6, 128, 512, 2000, 32), n,
                  MixGenerator(plain));
    c.random_initial_state = true;
  }
  for (int64_t W : {8, 24, 656, 1152}) {
    add("record_bytes_" + std::to_string(W), MakeShape(2, 3, 128, 256, 700, W), n,
        MixGenerator(plain));
  }
  {
    Case& c = add("pool_misaligned_8", MakeShape(1, 2, 128, 192, 500, 1152), 3,
                  MixGenerator(plain));
    c.pool_misalign = 8;
    Case& h = add("hot_misaligned_8", MakeShape(1, 2, 128, 192, 500, 656), 3,
                  MixGenerator(plain));
    h.hot_misalign = 8;
  }
  add("tiny_k1_b1", MakeShape(1, 3, 1, 1, 4, 8), quick ? 4 : 10, MixGenerator(plain));
  add("tiny_k1_b3", MakeShape(2, 2, 1, 3, 5, 16), quick ? 4 : 10, MixGenerator(plain));
  add("k0", MakeShape(1, 2, 0, 4, 10, 8), 2, MixGenerator(plain));
  // More streams than SMs (132 on an H200) selects 512-thread resolve blocks
  // up to B = 4096 (kResolveSmallBlockMaxSlots): their last variant (8 lru
  // items per lane), and the 1024-thread one just above. Random full caches,
  // so most slots are probed and ranked.
  add("s_140_b_4096_small_block", MakeShape(1, 140, 32, 4096, 5000, 8), 2, MixGenerator(plain))
      .random_initial_state = true;
  add("s_140_b_4097_large_block", MakeShape(1, 140, 32, 4097, 5000, 8), 2, MixGenerator(plain))
      .random_initial_state = true;
  add("k_600_b_4096", MakeShape(1, 2, 600, 4096, 5000, 16), 3, MixGenerator(plain))
      .random_initial_state = true;
  add("k_max_8192_b_16384", MakeShape(2, quick ? 1 : 2, 8192, 16384, 30000, 24),
      quick ? 2 : 3, MixGenerator(plain));
  if (!quick) {
    {
      Mix m;
      m.pad = 0.0;
      m.invalid = 0.0;
      m.dup = 0.0;
      m.resident = 0.7;
      m.sealed = Mix::Sealed::kAll;
      add("k_8192_b_16384_w1152", MakeShape(1, 1, 8192, 16384, 24000, 1152), 3,
          MixGenerator(m));
    }
    add("k_8192_b_8192", MakeShape(1, 2, 8192, 8192, 20000, 16), 3, MixGenerator(plain));
    add("k_5000_b_9000", MakeShape(1, 2, 5000, 9000, 16000, 8), 3, MixGenerator(plain));
    add("k_2048_b_4096_s64", MakeShape(1, 64, 2048, 4096, 6000, 656), 3, MixGenerator(plain));
    add("k_2048_b_2048", MakeShape(2, 4, 2048, 2048, 5000, 1152), 3, MixGenerator(plain));
    add("k_1000_b_1024", MakeShape(1, 3, 1000, 1024, 3000, 24), 4, MixGenerator(plain));
    add("k_1025_b_1025", MakeShape(1, 3, 1025, 1025, 3000, 24), 4, MixGenerator(plain));
    add("k_2047_b_3071", MakeShape(1, 3, 2047, 3071, 5000, 40), 4, MixGenerator(plain));
  }
  // Malformed states: every fault on its own, then mixed faults on the shapes
  // of each kernel variant family (1024- and 512-thread blocks, packed lru
  // slots, 16 lru rounds, ChecksStateFirst and its boundary, the largest
  // shared memory at k = B = 8192, k = 0), with rows broken and reset
  // between calls and healthy rows resolving alongside.
  auto add_malformed = [&](std::string name, Shape shape, int calls, Fault fault) -> Case& {
    Case& c = add("malformed_" + std::move(name), shape, calls, MixGenerator(plain));
    c.random_initial_state = true;
    c.corrupt = CorruptRows(fault, 0.3, 0.2);
    c.expect_malformed = true;
    return c;
  };
  const std::pair<const char*, Fault> faults[] = {
      {"lru_out_of_range", Fault::kLruOutOfRange}, {"lru_negative", Fault::kLruNegative},
      {"lru_equals_b", Fault::kLruEqualsB},         {"lru_repeated", Fault::kLruRepeated},
      {"record_below_empty", Fault::kRecordBelowEmpty},
      {"record_past_pool", Fault::kRecordPastPool}, {"record_twice", Fault::kRecordTwice}};
  for (const auto& [name, fault] : faults)
    add_malformed(name, MakeShape(2, 6, 24, 40, 120, 16), quick ? 3 : 5, fault);
  add_malformed("mixed", MakeShape(3, 8, 64, 96, 300, 24), quick ? 4 : 10, Fault::kAny);
  // The slot_record check marks records in a bitmap while R <= 16 x the
  // held-record set's capacity (128 at B = 40: R <= 2048), else it inserts
  // them into the set: both sides of the boundary, healthy and malformed.
  for (int64_t R : {2048, 2049, 5000}) {
    add_malformed("record_check_r" + std::to_string(R), MakeShape(2, 6, 24, 40, R, 16),
                  quick ? 3 : 5, Fault::kAny);
    add("record_check_r" + std::to_string(R), MakeShape(2, 6, 24, 40, R, 16), quick ? 3 : 5,
        MixGenerator(plain))
        .random_initial_state = true;
  }
  add_malformed("b1", MakeShape(1, 6, 1, 1, 4, 8), quick ? 3 : 6, Fault::kAny);
  add_malformed("k0", MakeShape(1, 6, 0, 8, 20, 8), 3, Fault::kAny);
  add_malformed("small_blocks_s_140_b_4096", MakeShape(1, 140, 32, 4096, 5000, 8), 2,
                Fault::kAny);
  add_malformed("k_2048_b_16384", MakeShape(1, 3, 2048, 16384, 30000, 8), 2, Fault::kAny);
  add_malformed("k_8192_b_8192", MakeShape(1, 3, 8192, 8192, 20000, 8), 2, Fault::kAny);
  add_malformed("check_first_k_8192_b_16384", MakeShape(1, quick ? 2 : 3, 8192, 16384, 30000, 8),
                2, Fault::kAny);
  if (!quick) {
    add_malformed("check_first_k_4097_b_8193", MakeShape(1, 3, 4097, 8193, 20000, 8), 3,
                  Fault::kAny);
    add_malformed("k_4096_b_16384", MakeShape(1, 3, 4096, 16384, 30000, 8), 3, Fault::kAny);
    add_malformed("many_layers", MakeShape(4, 5, 128, 256, 600, 40), 12, Fault::kAny);
  }
  // Few streams resolve on clusters of four blocks, more on pairs, up to the
  // clusters the device runs at once (resolve_cluster_kernel.cuh,
  // ResolveClusterBlocks), while 4096 < B <= 8192, k <= 4096 and the record
  // bitmap fits; one block per stream past any of these. Both sides of each
  // boundary, healthy and malformed, random full caches so every part of lru
  // holds hits and evictables. (A build with
  // -DHISPARSE_RESOLVE_CLUSTER_MIN_SLOTS=0 runs every other case with few
  // streams on quads too, one that adds -DHISPARSE_RESOLVE_NO_WIDE_CLUSTER
  // on pairs, one with -DHISPARSE_RESOLVE_NO_CLUSTER on single blocks.)
  std::vector<int64_t> boundary;  // the last stream count of each cluster size, and the next
  {
    int prev = 0;
    for (int64_t S = 1; S <= 200; ++S) {
      const int blocks = hisparse::ResolveClusterBlocks(ResolveDims{1, S, 2048, 6144, 9000, 16});
      if (prev != 0 && blocks != prev) {
        boundary.push_back(S - 1);
        boundary.push_back(S);
      }
      prev = blocks;
    }
  }
  for (int64_t S : boundary) {
    const std::string s = "_s" + std::to_string(S);
    add("cluster_boundary" + s, MakeShape(1, S, 2048, 6144, 9000, 16), 2, MixGenerator(plain))
        .random_initial_state = true;
    add_malformed("cluster_boundary" + s, MakeShape(1, S, 256, 4608, 6000, 8), 2, Fault::kAny);
  }
  add("cluster_k_4096_b_8192", MakeShape(1, 3, 4096, 8192, 20000, 8), 3, MixGenerator(plain))
      .random_initial_state = true;
  add_malformed("cluster_k_4096_b_8192", MakeShape(1, 3, 4096, 8192, 20000, 8), 3, Fault::kAny);
  add("cluster_k_4097_b_8192", MakeShape(1, 2, 4097, 8192, 20000, 8), 2, MixGenerator(plain))
      .random_initial_state = true;
  if (!quick) {
    add("k_4096_b_8192_s34", MakeShape(1, 34, 4096, 8192, 9000, 8), 2, MixGenerator(plain))
        .random_initial_state = true;
    Mix m;
    m.dup = 0.5;
    m.pad = 0.1;
    m.invalid = 0.1;
    add("duplicate_ids_s40", MakeShape(2, 40, 256, 300, 400, 32), 4, MixGenerator(m));
  }
  add_malformed("cluster_odd_b_k_7_b_9", MakeShape(2, 5, 7, 9, 40, 8), quick ? 3 : 6,
                Fault::kAny);
  for (int64_t S : quick ? std::vector<int64_t>{1, 17} : std::vector<int64_t>{1, 2, 17, 64, 300}) {
    add("streams_" + std::to_string(S), MakeShape(2, S, 64, 96, 300, 24), quick ? 3 : 5,
        MixGenerator(plain));
  }
  return cases;
}

// ---------------------------------------------------------------------------
// Pool write.

struct PoolWriteCase {
  std::string name;
  PoolWriteDims dims;
};

bool RunPoolWrite(const PoolWriteCase& c, uint64_t seed, bool verbose) {
  const PoolWriteDims& d = c.dims;
  Report report;
  report.label = "[pool_write " + c.name + "]";
  Rng rng(seed);
  const int64_t LS = d.layers * d.streams;
  const size_t pool_bytes = LS * d.pool_records * d.record_bytes;
  const size_t record_bytes = LS * d.rows * d.record_bytes;
  PinnedBuffer pool(pool_bytes);
  FillRandom(pool.get(), pool_bytes, rng);
  std::vector<uint8_t> expected(pool.get(), pool.get() + pool_bytes);
  std::vector<uint8_t> records(record_bytes);
  FillRandom(records.data(), record_bytes, rng);
  std::vector<int32_t> start(d.streams), count(d.streams);
  for (int64_t s = 0; s < d.streams; ++s) {
    switch (Uniform(rng, 0, 5)) {
      case 0: start[s] = -static_cast<int32_t>(Uniform(rng, 0, d.rows + 2)); break;
      case 1: start[s] = static_cast<int32_t>(d.pool_records - Uniform(rng, 0, d.rows)); break;
      case 2: start[s] = static_cast<int32_t>(d.pool_records + Uniform(rng, 0, 3)); break;
      default: start[s] = static_cast<int32_t>(Uniform(rng, 0, std::max<int64_t>(0, d.pool_records - 1)));
    }
    switch (Uniform(rng, 0, 4)) {
      case 0: count[s] = -static_cast<int32_t>(Uniform(rng, 1, 5)); break;
      case 1: count[s] = static_cast<int32_t>(d.rows + Uniform(rng, 0, 5)); break;
      case 2: count[s] = 0; break;
      default: count[s] = static_cast<int32_t>(Uniform(rng, 0, d.rows));
    }
  }
  hisparse::PoolWriteCpu(d, records.data(), start.data(), count.data(), expected.data());
  DeviceBuffer<uint8_t> dev_records(record_bytes);
  DeviceBuffer<int32_t> dev_start(d.streams), dev_count(d.streams);
  if (record_bytes > 0) dev_records.Upload(records.data());
  dev_start.Upload(start.data());
  dev_count.Upload(count.data());
  const char* failed_kernel = "?";
  cudaError_t err = hisparse::LaunchPoolWrite(d, dev_records.get(), dev_start.get(),
                                              dev_count.get(), pool.get(), 0, &failed_kernel);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    report.Line(Format("%s: %s", failed_kernel, cudaGetErrorString(err)));
  } else {
    const int64_t W = d.record_bytes;
    int shown = 0;
    int64_t bad = 0;
    for (int64_t row = 0; row < LS * d.pool_records; ++row) {
      if (std::memcmp(expected.data() + row * W, pool.get() + row * W, W) == 0) continue;
      ++bad;
      if (shown++ < 4) {
        const int64_t ls = row / d.pool_records;
        report.Line(Format("host_pool[layer %lld, stream %lld, record %lld] differs (start %d, "
                           "count %d)",
                           (long long)(ls / d.streams), (long long)(ls % d.streams),
                           (long long)(row % d.pool_records), start[ls % d.streams],
                           count[ls % d.streams]));
      }
    }
    if (bad > 4) report.Line(Format("%lld pool rows differ in all", (long long)bad));
  }
  if (verbose || report.failed)
    std::printf("%s %s\n", report.failed ? "FAIL" : "ok  ", report.label.c_str());
  return !report.failed;
}

std::vector<PoolWriteCase> PoolWriteCases(bool quick) {
  std::vector<PoolWriteCase> cases;
  for (int64_t W : {8, 24, 656, 1152}) {
    cases.push_back({"w" + std::to_string(W), PoolWriteDims{2, 5, 7, 40, W}});
    if (!quick) cases.push_back({"w" + std::to_string(W) + "_big", PoolWriteDims{3, 37, 64, 300, W}});
  }
  cases.push_back({"one_record_pool", PoolWriteDims{1, 4, 3, 1, 16}});
  cases.push_back({"no_rows", PoolWriteDims{2, 3, 0, 10, 16}});
  cases.push_back({"streams_300", PoolWriteDims{1, 300, 4, 16, 32}});
  return cases;
}

}  // namespace

int main(int argc, char** argv) {
  const harness::CheckOptions options = harness::StartCheck(argc, argv, /*default_seed=*/1234);
  const bool verbose = options.verbose;

  int passed = 0, failed = 0;
  uint64_t case_seed = options.seed;
  for (const Case& c : ResolveCases(options.quick)) {
    ++case_seed;
    if (options.Skips(c.name)) continue;
    const Shape& d = c.shape;
    Rng pool_rng(case_seed * 7919);
    PinnedBuffer pool(d.layers * d.streams * d.pool_records * d.record_bytes, c.pool_misalign);
    FillRandom(pool.get(), pool.bytes(), pool_rng);
    for (const Variant& v : kVariants) {
      // Same seed for every variant: identical inputs and initial state.
      if (RunVariant(c, v, pool, case_seed, verbose)) {
        ++passed;
      } else {
        ++failed;
      }
    }
  }
  for (const PoolWriteCase& c : PoolWriteCases(options.quick)) {
    ++case_seed;
    if (options.Skips("pool_write_" + c.name)) continue;
    if (RunPoolWrite(c, case_seed, verbose)) {
      ++passed;
    } else {
      ++failed;
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
