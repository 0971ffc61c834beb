#!/bin/bash
# resolve8 run 2 (last; killed at 90 s). src/ = this branch: streams resolve on clusters of 4 or 2
# blocks (pull protocol: CTA fences + relaxed cluster barriers), one block beyond.
#  1. checkers: src full, src with pairs only (full), src without clusters (quick), in parallel;
#  2. no-IO A/B: main (base/) vs src vs src with scalar probes, B = 2048/4096/8192 x 1/64/256;
#  3. IO at 64 streams (base vs src); 4. phase clock + floor; 5. memcheck (malformed, quick);
#  6. the no-IO A/B again (base, src).
set -x
OUT=$(realpath -m "${1:?outdir}"); mkdir -p "$OUT"
cd "$(dirname "$0")"
S=src
NV="nvcc -O3 -arch=sm_90 -std=c++17 -lineinfo"
NVC="nvcc -O2 -arch=sm_90 -std=c++17 -lineinfo"
CSRC="$S/ffi/tests/resolve_cuda_check.cu $S/ffi/resolve_kernels.cu $S/ffi/resolve_cpu.cc $S/ffi/pool_write_cpu.cc"
mkdir -p ab
( make -C $S/ffi/tests > "$OUT/build_check.log" 2>&1 ) & P5=$!
( $NVC -DHISPARSE_RESOLVE_NO_WIDE_CLUSTER -I $S/ffi $CSRC -o ab/check_pairs > "$OUT/build_check_pairs.log" 2>&1 ) & P6=$!
( $NVC -DHISPARSE_RESOLVE_NO_CLUSTER -I $S/ffi $CSRC -o ab/check_nocluster > "$OUT/build_check_nocluster.log" 2>&1 ) & P7=$!
( make -C $S/ffi/bench resolve > "$OUT/build_bench.log" 2>&1 ) & P1=$!
( make -C base/ffi/bench resolve > "$OUT/build_base.log" 2>&1 ) & P2=$!
( $NV -DHISPARSE_RESOLVE_SCALAR_PROBE -I $S/ffi $S/ffi/bench/resolve_bench.cu $S/ffi/resolve_kernels.cu -o ab/bench_scalar > "$OUT/build_scalar.log" 2>&1 ) & P3=$!
( $NV -DHISPARSE_RESOLVE_PHASE_CLOCK -I $S/ffi $S/ffi/bench/resolve_bench.cu $S/ffi/resolve_kernels.cu -o ab/bench_phase > "$OUT/build_phase.log" 2>&1 ) & P4=$!
N=$S/build/resolve_bench; BASE=base/build/resolve_bench; C=$S/build/tests/resolve_cuda_check
wait $P5 $P6 $P7; echo "checks built at ${SECONDS}s"
( timeout 25 $C --quiet > "$OUT/check.log" 2>&1; echo "check rc=$? at ${SECONDS}s" >> "$OUT/check.log" ) & Q1=$!
( timeout 25 ab/check_pairs --quiet > "$OUT/check_pairs.log" 2>&1; echo "check rc=$? at ${SECONDS}s" >> "$OUT/check_pairs.log" ) & Q2=$!
( timeout 25 ab/check_nocluster --quick --quiet > "$OUT/check_nocluster_quick.log" 2>&1; echo "check rc=$? at ${SECONDS}s" >> "$OUT/check_nocluster_quick.log" ) & Q3=$!
wait $Q1 $Q2 $Q3; echo "checks done at ${SECONDS}s"
wait $P1 $P2 $P3
ARGS="--no-io --hot-slots 2048,4096,8192 --streams 1,64,256 --miss 0.13 --record-bytes 1152"
timeout 12 $BASE "$OUT/base_noio.json" $ARGS > "$OUT/base_noio.log" 2>&1; echo "rc=$?" >> "$OUT/base_noio.log"
timeout 12 $N "$OUT/new_noio.json" $ARGS > "$OUT/new_noio.log" 2>&1; echo "rc=$?" >> "$OUT/new_noio.log"
timeout 12 ab/bench_scalar "$OUT/scalar_noio.json" $ARGS > "$OUT/scalar_noio.log" 2>&1; echo "rc=$?" >> "$OUT/scalar_noio.log"
echo "noio done at ${SECONDS}s"
IOARGS="--no-sweep --hot-slots 4096 --record-bytes 1152 --streams 64 --miss 0.13 --reps 30"
timeout 10 $BASE "$OUT/base_io.json" $IOARGS > "$OUT/base_io.log" 2>&1; echo "rc=$?" >> "$OUT/base_io.log"
timeout 10 $N "$OUT/new_io.json" $IOARGS > "$OUT/new_io.log" 2>&1; echo "rc=$?" >> "$OUT/new_io.log"
echo "io done at ${SECONDS}s"
wait $P4
[ $((86 - SECONDS)) -gt 5 ] && { timeout $((86 - SECONDS)) ab/bench_phase "$OUT/phase.json" --no-io --floor --phases --hot-slots 4096,8192 --streams 1,64 --miss 0,0.13 --record-bytes 1152 > "$OUT/phase.log" 2>&1; echo "rc=$? at ${SECONDS}s" >> "$OUT/phase.log"; }
[ $((87 - SECONDS)) -gt 4 ] && { timeout $((87 - SECONDS)) compute-sanitizer --tool memcheck --error-exitcode 3 $C --quick --quiet --only malformed > "$OUT/memcheck.log" 2>&1; echo "memcheck rc=$? at ${SECONDS}s" >> "$OUT/memcheck.log"; }
[ $((88 - SECONDS)) -gt 6 ] && { timeout $((88 - SECONDS)) $N "$OUT/new_noio2.json" $ARGS > "$OUT/new_noio2.log" 2>&1; }
[ $((89 - SECONDS)) -gt 6 ] && { timeout $((89 - SECONDS)) $BASE "$OUT/base_noio2.json" $ARGS > "$OUT/base_noio2.log" 2>&1; }
echo "done at ${SECONDS}s"
