#!/bin/bash
# attn3 run 2 (90 s): sparse MLA decode attention, issue 22. main's kernel (main/, a copy of main's
# ffi/ with the bench's output hash) vs attn3's (src/), same run: 64 heads, k = 2048, P = 1,
# batch 1, 2, 17, 41 (hot source). out = the outputs' bits hash (equal = the same arithmetic).
# Variants: w16 (16 warps a block), nosplit (no split of the combine plan's last round).
set -x
OUT=${1:?outdir}; mkdir -p "$OUT"
START=$(date +%s)
left() { echo $(( 86 - ($(date +%s) - START) )); }  # seconds left of the 90
cd "$(dirname "$0")"
NV="nvcc -O3 -arch=sm_90 -std=c++17 -lineinfo"
B=/tmp/attn3b2; mkdir -p $B
( make -C src/ffi/bench sparse-attention NVCCFLAGS="-O3 -arch=sm_90 -std=c++17 -lineinfo -Xptxas -v" > "$OUT/build_bench.log" 2>&1 ) &
( make -C src/ffi/tests sparse-attention > "$OUT/build_check.log" 2>&1 ) &
( cd main/ffi/bench && $NV -I .. sparse_attention_bench.cu ../sparse_attention_kernels.cu -o $B/main_bench > "$OUT/build_main_bench.log" 2>&1 ) &
( cd src/ffi/bench && $NV -DHISPARSE_SPARSE_ATTENTION_WARPS=16 -I .. sparse_attention_bench.cu ../sparse_attention_kernels.cu -o $B/w16_bench > "$OUT/build_w16.log" 2>&1 ) &
( cd src/ffi/bench && $NV -DHISPARSE_SPARSE_ATTENTION_SPLIT_TAIL=0 -I .. sparse_attention_bench.cu ../sparse_attention_kernels.cu -o $B/nosplit_bench > "$OUT/build_nosplit.log" 2>&1 ) &
( cd src/ffi/bench && $NV -DHISPARSE_SPARSE_ATTENTION_TRACE -I .. sparse_attention_bench.cu ../sparse_attention_kernels.cu -o $B/trace_bench > "$OUT/build_trace.log" 2>&1 ) &
( cd src/ffi/bench && $NV -DHISPARSE_SPARSE_ATTENTION_EVICT_FIRST=1 -I .. sparse_attention_bench.cu ../sparse_attention_kernels.cu -o $B/ef_bench > "$OUT/build_ef.log" 2>&1 ) &
( cd src/ffi/bench && $NV -DHISPARSE_SPARSE_ATTENTION_PDL=1 -I .. sparse_attention_bench.cu ../sparse_attention_kernels.cu -o $B/pdl_bench > "$OUT/build_pdl.log" 2>&1 ) &
( cd src/ffi/tests && nvcc -O2 -std=c++17 -lineinfo -arch=sm_90 -DHISPARSE_SPARSE_ATTENTION_PDL=1 -I .. sparse_attention_cuda_check.cu ../sparse_attention_kernels.cu ../sparse_attention_cpu.cc -o $B/pdl_check > "$OUT/build_pdl_check.log" 2>&1 ) &
( cd src/ffi/tests && nvcc -O2 -std=c++17 -lineinfo -arch=sm_90 -DHISPARSE_SPARSE_ATTENTION_WARPS=16 -I .. sparse_attention_cuda_check.cu ../sparse_attention_kernels.cu ../sparse_attention_cpu.cc -o $B/w16_check > "$OUT/build_w16_check.log" 2>&1 ) &
wait
grep -E "spill|error" "$OUT/build_bench.log" | sort | uniq -c
ls -la $B src/build src/build/tests
echo "left after builds: $(left) s"
# 1. The A/B, interleaved by batch.
run() {  # label binary json batch [plan]
  timeout 8 "$2" "$OUT/$3_b$4.json" $4 64 $5 2>&1 | grep -v "^NVIDIA\|^plan" | sed "s/^/$(printf '%-10s' $1)/" | tee -a "$OUT/ab.log"
}
for b in 1 2 17 41; do
  run main $B/main_bench main $b
  run attn3 src/build/sparse_attention_bench attn3 $b
  if [ $b -le 17 ]; then run w16 $B/w16_bench w16 $b; fi
  if [ $b -ge 17 ]; then run nosplit $B/nosplit_bench nosplit $b; fi
  if [ $b -le 2 ]; then run combine src/build/sparse_attention_bench attn3_combine $b combine; fi
  if [ $b -ge 2 ]; then run pdl $B/pdl_bench pdl $b; fi
  if [ $b -ge 17 ]; then run evictfirst $B/ef_bench ef $b; fi
done
src/build/sparse_attention_bench /dev/null 1 64 2>&1 | grep "^plan" | tee -a "$OUT/ab.log"
# 2. Correctness: the checker (CPU, batch, source and plan invariance).
timeout 40 src/build/tests/sparse_attention_cuda_check 2>&1 | tee "$OUT/check.log"; echo "check rc=${PIPESTATUS[0]}" | tee -a "$OUT/check.log"
echo "left after check: $(left) s"
# 3. Where a launch's time goes (trace build, phase stamps per block).
for b in 1 17; do timeout 8 $B/trace_bench /dev/null $b 64 2>&1 | tee -a "$OUT/trace.log"; done
# 4. memcheck (quick cases, both plans in each).
timeout $(( $(left) > 25 ? 20 : $(left) - 3 )) compute-sanitizer --tool memcheck --error-exitcode 3 src/build/tests/sparse_attention_cuda_check --quick --quiet > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$?" | tee -a "$OUT/memcheck.log"; tail -n 2 "$OUT/memcheck.log"
echo "left after memcheck: $(left) s"
# 5. The A/B builds' checkers (quick), the full table (both sources, 64 and 128 heads).
timeout $(( $(left) > 15 ? 12 : 3 )) $B/pdl_check --quick 2>&1 | tail -n 2 | tee "$OUT/check_pdl.log"
timeout $(( $(left) > 15 ? 12 : 3 )) $B/w16_check --quick 2>&1 | tail -n 2 | tee "$OUT/check_w16.log"
timeout $(( $(left) > 12 ? 10 : 2 )) src/build/sparse_attention_bench "$OUT/sparse_attention_bench.json" 2>&1 | tee "$OUT/bench.log"
echo "left after table: $(left) s"
# 6. racecheck on the quick cases, if time remains.
timeout $(( $(left) > 8 ? $(left) - 3 : 1 )) compute-sanitizer --tool racecheck --racecheck-report all --error-exitcode 3 \
  src/build/tests/sparse_attention_cuda_check --quick --quiet > "$OUT/racecheck.log" 2>&1
echo "racecheck rc=$?" | tee -a "$OUT/racecheck.log"; tail -n 2 "$OUT/racecheck.log"
