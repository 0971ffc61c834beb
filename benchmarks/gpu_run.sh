#!/usr/bin/env bash
# Builds hisparse-jax with CUDA and runs the GPU checks and benchmarks, on a
# machine with an NVIDIA GPU, nvcc, jax[cuda], nanobind and scikit-build-core.
#
#   benchmarks/gpu_run.sh OUT_DIR [STAGE...]
#
# Without stages it runs `build slices`: the deployment slices are the headline benchmark.
# Stages (in the order given):
#   build     HISPARSE_CUDA=ON pip install into $SITE (default /tmp/hisparse-site)
#   check     the standalone kernel check (ffi/tests) against the CPU implementation
#   sanitize  compute-sanitizer memcheck + racecheck on the check's --quick cases
#   pytest    the whole test suite with the CUDA handler as the default implementation
#   resolve   ffi/bench/resolve_bench.cu (ceilings + RESOLVE table), JSON in OUT_DIR
#   graphs    benchmarks/check_command_buffer.py: is RESOLVE captured in CUDA graphs?
#   indexer   the lightning indexer: tests/test_indexer.py with the CUDA handler (needs build),
#             ffi/bench/indexer_bench.cu (kernel alone vs the HBM ceilings, checked against the
#             CPU) and benchmarks/indexer_xla_bench.py (ffi vs XLA under jit), JSON in OUT_DIR
#   topk      TOP-K: ffi/tests/topk_cuda_check.cu (every launch path against the CPU),
#             ffi/bench/topk_bench.cu (the kernel alone, GPU time), tests/test_topk.py with the
#             CUDA handler (needs build) and benchmarks/topk_xla_bench.py (lax.top_k vs ffi under
#             jit), JSON in OUT_DIR
#   grouped-matmul
#             the MoE grouped matmul: ffi/tests check + memcheck, ffi/bench/grouped_matmul_bench.cu
#             (auto plan and the best variant against HBM bandwidth, JSON in OUT_DIR; then --ab: the
#             streaming kernel's launch shapes against the warp-tile kernel at the slices' shapes, the
#             shared expert's split K included), and tests/test_grouped_matmul.py's GPU tests (needs
#             build)
#   attention-plans
#             the sparse attention's two merges at the slices' batches: the cluster plan (the 16
#             chunk blocks of a request merge on chip, in waves of clusters past one) against the
#             combine plan (partials through HBM, a second kernel) at batch 1, 2, 10, 17 and 41 (64
#             heads, k = 2048; alternating, twice; the same output bits, hashed by the bench)
#   attention-wgmma
#             the experimental wgmma chunk kernel of sparse attention (ffi/sparse_attention_wgmma.cuh,
#             sm_90a): the checker (--quick, then memcheck and racecheck), the kernel alone against
#             sm_90a's default kernel at batch 1, 2, 17 and 41 (64 heads, k = 2048; alternating,
#             twice), then the full checker and Nsight Compute's source view at batch 17 (the
#             report and JSON in OUT_DIR)
#   attention-wgmma-slices
#             the glm5-h200 slice at 128K and 32K (GLM-5.1-like trace, both modes one at a time,
#             profiled) with two sm_90a builds: the default sparse attention kernel and the wgmma
#             one (HISPARSE_SPARSE_ATTENTION_WGMMA=ON); sites in $SITE-attention-default and -wgmma
#   graphs-slices
#             launch gaps (issue: the roofline): the glm5-h200 slice at 128K, profiled, with XLA's
#             default command buffers and with the whole loop nest in one graph (WHILE and
#             CONDITIONAL command buffers, loops unrolled: benchmarks/check_command_buffer.py's
#             one-launch configuration), then benchmarks/launch_gaps.py over both
#   pdl-slices
#             XLA's programmatic dependent launch (--xla_gpu_enable_pdl: XLA's own kernels start while
#             the kernel before them drains, and wait for its results in a griddepcontrol.wait) off
#             and on: the glm5-h200 slice at PDL_CONTEXTS (default 131072 262144; GLM-5.1-like trace,
#             both modes one at a time, profiled), off and on in turn at each context, then
#             benchmarks/launch_gaps.py over the runs
#   grouped-matmul-split-slices
#             the shared expert's split K on the streaming kernel (HISPARSE_GROUPED_MATMUL_STREAM_SPLIT):
#             the checker of that build (its automatic plan streams the split weights, every warp-tile
#             variant against it) and its --slices --quick --ab bench, then the glm5-h200 slice at
#             128K and 32K (GLM-5.1-like trace, both modes one at a time, profiled) with the default
#             build and with the split one; sites in $SITE-gmm-default and -split
#   one-wave-slices
#             the grouped matmul's one-wave rule (routed experts below 2.5 rows streamed where their
#             units fill one to two blocks an SM; HISPARSE_GROUPED_MATMUL_STREAM_ONE_WAVE=0 drops it):
#             full-KV of the glm5-h200 slice at 256K (GLM-5.1-like trace, profiled) with the default
#             build and without the rule; sites in $SITE-onewave-default and -off
#   topk-trace
#             where TOP-K's resident launches spend their time: the trace build of ffi/bench/topk_bench.cu
#             (-DHISPARSE_TOPK_TRACE: each block's phase stamps, and the launch floor of an empty kernel
#             in the same launch shape, then the same grid without clusters, without the dynamic
#             shared memory and without both) at 17 and 2 rows of 131072 and 41 of 32768, and at
#             17 rows of 131265 (the slice's odd R at 128K: 4-byte copies); then the default build's
#             timing at 17 and 2 rows of 131072 and of 131265
#   topk-aligned
#             TOP-K's aligned slices (HISPARSE_TOPK_ALIGNED_SLICES=1: each block's slice starts on the
#             16-byte grid, so rows whose length is not a multiple of 4 copy 16 bytes at a time): that
#             build's checker (every case, memcheck of --quick, racecheck of --race), then its
#             topk_bench against the default build's at 17 and 2 rows of 131265 (the slices' R at
#             128K) and of 131072 and 41 of 32768, alternating, twice; JSON in OUT_DIR
#   topk-aligned-slices
#             HiSparse of the glm5-h200 slice at 128K (GLM-5.1-like trace, profiled) with the default
#             build and with aligned slices; sites in $SITE-topkaligned-default and -aligned
#   token-tiles-slices
#             the grouped matmul's 32-token passes on the streaming kernel where 64-token ones do not
#             fit two blocks an SM (the default; HISPARSE_GROUPED_MATMUL_STREAM_FEWER_TOKEN_TILES=0
#             runs them on the warp-tile kernel): the default build's checker and its
#             grouped_matmul_bench --slices --dsv32 --quick --ab, then HiSparse of the dsv32-h200 slice
#             at 32K (DeepSeek-V3.2-like trace, profiled) with the default build and without them;
#             sites in $SITE-tokentiles-default and -off
#   grouped-matmul-tiled
#             the grouped matmul's tiled-weight experiment (ffi/grouped_matmul_tiled.h): checkers of
#             tiles of 16 and 32 rows (--quick, memcheck), then --slices --quick row-major / 16 / 32
#             alternating, twice, and the full checkers; JSON in OUT_DIR
#   moe-route
#             the MoE's routing in one custom call (issue: the roofline, fewer launches): the
#             checker against the CPU (+ memcheck and racecheck), ffi/bench/moe_route_bench.cu (the
#             kernel alone at the slices' decode batches, JSON in OUT_DIR), tests/test_moe_route.py
#             and the routing tests with the CUDA handler (needs build), then the glm5-h200 slice at
#             128K, 32K and 256K (ROUTING_CONTEXTS) with routing_implementation count and fused (one
#             at a time, profiled) and benchmarks/launch_gaps.py over all of them
#   gather-layout
#             ffi/bench/gather_layout_bench.cu: random 1152-byte records gathered into shared memory
#             by 16-byte cp.async (the wgmma attention's core-matrix layout), by one TMA tensor
#             copy per 64-element slab (a 128-byte-swizzled layout), and by one bulk copy per row;
#             each layout checked, then GB/s with every SM copying, twice; JSON in OUT_DIR
#   ncu-profiles
#             Nsight Compute on the kernels whose limit is not yet known (profile before changing
#             them): the routed grouped matmul at 136 and 328 pairs (gate_up, down at 328; it falls
#             from ~92% of HBM at 136 to ~60% at 328) and TOP-K at 17 rows of 131072; speed of
#             light, occupancy, warp states, scheduler, memory and instruction statistics, one
#             launch each, in OUT_DIR/ncu_*.log
#   headline  the headline table of BENCHMARKS.md: glm5-h200 under the GLM-5.1-like trace and dsv32-h200
#             under the DeepSeek-V3.2-like one at HEADLINE_CONTEXTS (default 32768 131072 262144),
#             both modes one at a time, profiled; each run's kernel table (benchmarks/kernel_table.py,
#             OUT_DIR/kernels-*.log; the traces themselves are deleted), then benchmarks/launch_gaps.py
#   slices    the deployment slices (docs/deployments.md): hisparse-bench decode --deployment
#             glm5-h200 and dsv32-h200 at 32K, 128K and 256K, qwen3-quest-h200 at 128K; each
#             under both trace calibrations, with the profile; one process per context.
#   prefetch-tests
#             exact layer-wise prefetch: tests/test_prefetch.py and tests/models/test_prefetch_decode.py
#             with the CUDA handler (needs build)
#   prefetch  the glm5-h200 slice with a shared indexer (index_share = 4) at 128K, HiSparse with
#             and without --prefetch (one run at a time), profiled, under
#             PREFETCH_TRACES (default: both calibrations, one process each), and the device
#             timeline of one prefetch step (benchmarks/prefetch_timeline.py) as a PNG.
#             Profiler traces go to $PROFILE_DIR (default OUT_DIR/profiles).
#   decode-dsa, decode-nsa, decode-quest
#             the older regime (realistic presets with a dense MLP, not the headline):
#             hisparse-bench decode at the capacity wall (24 GiB HBM budget for decode
#             state, 88 GiB pinned host budget for pools), synthetic fill, trace selection,
#             no-IO and equal-batch runs; DSA at 32K and 128K, NSA and Quest at 128K.
#             Each context is its own run (own JSON, table and plots under OUT_DIR).
#   train     python -m hisparse_jax.train fit: the trace model (docs/training.md) trained on the
#             Python standard library, model.npz and training.json in OUT_DIR/train
#             (TRAIN_ARGS: extra fit arguments, e.g. --dense-steps 20 --sparse-steps 10 to time it)
#   record    python -m hisparse_jax.train record: that model decoding 8 held-out documents
#             (32K-token prefill, 512 teacher-forced steps), the trace in OUT_DIR/trace.npz
#             (RECORD_ARGS: extra record arguments)
# Logs of every stage land in OUT_DIR; the script stops at the first failing stage.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT_DIR="$(mkdir -p "${1:?usage: gpu_run.sh OUT_DIR [STAGE...]}" && cd "$1" && pwd)"
shift
if [ $# -eq 0 ]; then set -- build slices; fi
SITE="${SITE:-/tmp/hisparse-site}"
PY="${PYTHON:-python3}"
DECODE_ARGS="${DECODE_ARGS:-}"  # extra hisparse-bench decode arguments, e.g. --set hot_slots=6144
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1

bench_decode() {  # bench_decode FAMILY CONTEXT...: one hisparse-bench run per context
  local family=$1; shift
  for context in "$@"; do
    # Preallocated: the growing allocator fragments between the baseline and HiSparse runs.
    run "decode-$family-$context" env PYTHONPATH="$SITE" XLA_PYTHON_CLIENT_PREALLOCATE=true \
      XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 "$PY" "$SITE/bin/hisparse-bench" decode \
      --family "$family" --preset realistic --contexts "$context" --device-budget-gib 24 \
      --host-budget-gib 88 --max-batch 1024 --fill synthetic --selection trace --no-io \
      --steps 16 --reps 3 --out "$OUT_DIR/decode-$family-$context" $DECODE_ARGS
  done
}

bench_slice() {  # bench_slice DEPLOYMENT CONTEXT...: one hisparse-bench run per context
  local name=$1; shift
  for context in "$@"; do
    clocked "slice-$name-$context" env PYTHONPATH="$SITE" XLA_PYTHON_CLIENT_PREALLOCATE=true \
      XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 "$PY" "$SITE/bin/hisparse-bench" decode --deployment "$name" \
      --contexts "$context" --profile --out "$OUT_DIR/slice-$name-$context" $DECODE_ARGS
  done
}

run() {  # run STAGE_NAME CMD...: tee the output into OUT_DIR/STAGE_NAME.log
  local name=$1; shift
  echo "=== $name: $*"
  local t0=$SECONDS
  "$@" 2>&1 | tee "$OUT_DIR/$name.log"
  echo "=== $name: ok in $((SECONDS - t0)) s"
}

# clocked STAGE_NAME CMD...: run, while nvidia-smi samples the SM and memory clocks, the power and
# the temperature every 200 ms into OUT_DIR/STAGE_NAME.clocks.csv: whether a kernel slower in the
# step than alone ran at a lower clock (power or heat) there. The sampler stops with the command
# (and within 30 minutes whatever happens).
clocked() {
  local name=$1 sampler
  timeout 1800 nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv \
    -lms 200 > "$OUT_DIR/$name.clocks.csv" 2>&1 &
  sampler=$!
  run "$@"
  kill "$sampler" 2>/dev/null || true
  wait "$sampler" 2>/dev/null || true
}

# ab_slices NAME VARIANT=DEFINES...: one site per variant ($SITE-NAME-VARIANT, built with its
# space-separated -Ccmake.define.X=Y), then the glm5-h200 slice (AB_DEPLOYMENT) at 128K and 32K
# (AB_CONTEXTS; GLM-5.1-like trace, AB_TRACE; both modes one at a time, profiled; AB_ARGS: more
# decode arguments, e.g. --modes full-kv) with each, the variants in turn at each context.
ab_slices() {
  local name=$1 spec variant context
  shift
  for spec in "$@"; do
    variant=${spec%%=*}
    # shellcheck disable=SC2086  # the defines are words of their own
    run "build-$name-$variant" env HISPARSE_CUDA=ON "$PY" -m pip install --no-build-isolation --no-deps --upgrade \
      --target "$SITE-$name-$variant" ${spec#*=} .
  done
  for context in ${AB_CONTEXTS:-131072 32768}; do
    for spec in "$@"; do
      variant=${spec%%=*}
      # shellcheck disable=SC2086  # AB_ARGS are words of their own
      clocked "slice-$name-$variant-$context" env PYTHONPATH="$SITE-$name-$variant" XLA_PYTHON_CLIENT_PREALLOCATE=true \
        XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 "$PY" "$SITE-$name-$variant/bin/hisparse-bench" decode \
        --deployment "${AB_DEPLOYMENT:-glm5-h200}" --contexts "$context" --trace "${AB_TRACE:-glm-5.1}" --no-equal-batch \
        --one-at-a-time --reps 10 --profile --no-plots --out "$OUT_DIR/slice-$name-$variant-$context" ${AB_ARGS:-} $DECODE_ARGS
    done
  done
}

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT_DIR/gpu.txt"
"$PY" -c 'import jax; print("jax", jax.__version__, jax.devices())' | tee -a "$OUT_DIR/gpu.txt"

for stage in "$@"; do
  case "$stage" in
    build)
      run build env HISPARSE_CUDA=ON "$PY" -m pip install --no-build-isolation --no-deps --upgrade \
        --target "$SITE" . ;;
    check)
      run check make -C ffi/tests check ;;
    train)
      run train env PYTHONPATH="$SITE" "$PY" -m hisparse_jax.train fit --out "$OUT_DIR/train" ${TRAIN_ARGS:-} ;;
    record)
      run record env PYTHONPATH="$SITE" "$PY" -m hisparse_jax.train record \
        --checkpoint "$OUT_DIR/train/model.npz" --out "$OUT_DIR/trace.npz" ${RECORD_ARGS:-} ;;
    sanitize)
      run sanitize make -C ffi/tests sanitize ;;
    pytest)
      run pytest env PYTHONPATH="$SITE" "$PY" -m pytest tests -q -p no:cacheprovider ;;
    resolve)
      mkdir -p build
      run resolve_build make -C ffi/bench resolve
      run resolve build/resolve_bench "$OUT_DIR/resolve_bench.json" ;;
    graphs)
      run graphs env PYTHONPATH="$SITE" "$PY" benchmarks/check_command_buffer.py ;;
    indexer)
      mkdir -p build
      run indexer_pytest env PYTHONPATH="$SITE" "$PY" -m pytest tests/test_indexer.py -q -p no:cacheprovider
      run indexer_build make -C ffi/bench indexer
      run indexer build/indexer_bench "$OUT_DIR/indexer_bench.json"
      run indexer_xla env PYTHONPATH="$SITE" "$PY" benchmarks/indexer_xla_bench.py \
        --out "$OUT_DIR/indexer_xla.json" ;;
    topk)
      mkdir -p build
      run topk_check make -C ffi/tests check-topk
      run topk_build make -C ffi/bench topk
      run topk build/topk_bench "$OUT_DIR/topk_bench.json"
      run topk_pytest env PYTHONPATH="$SITE" "$PY" -m pytest tests/test_topk.py -q -p no:cacheprovider
      run topk_xla env PYTHONPATH="$SITE" "$PY" benchmarks/topk_xla_bench.py "$OUT_DIR/topk_xla.json" ;;
    grouped-matmul)
      mkdir -p build
      run grouped_matmul_check make -C ffi/tests check-grouped-matmul sanitize-grouped-matmul
      run grouped_matmul_build make -C ffi/bench grouped-matmul
      run grouped_matmul build/grouped_matmul_bench "$OUT_DIR/grouped_matmul.json"
      run grouped_matmul_ab build/grouped_matmul_bench "$OUT_DIR/grouped_matmul_ab.json" --slices --quick --ab
      run grouped_matmul_pytest env PYTHONPATH="$SITE" "$PY" -m pytest tests/test_grouped_matmul.py -q \
        -p no:cacheprovider -m gpu ;;
    attention-plans)
      run attn_plans_build make -C ffi/bench sparse-attention
      for rep in 1 2; do
        for b in 1 2 10 17 41; do
          for plan in combine cluster; do
            run "attn_${plan}_b$b-$rep" build/sparse_attention_bench "$OUT_DIR/attn_${plan}_b$b-$rep.json" "$b" 64 "$plan"
          done
        done
      done ;;
    attention-wgmma)
      # The wgmma chunk kernel (warpgroup w scores stage w of each two-stage step), checked (and
      # sanitized) before it is timed against today's mma.sync kernel.
      mkdir -p build/tests
      run attn_bench_build make -C ffi/bench sparse-attention ARCH=sm_90a OUT="$PWD/build/sm90a"
      flags="-DHISPARSE_SPARSE_ATTENTION_WGMMA=1"
      check="$PWD/build/tests/sparse_attention_cuda_check_wgmma"
      run attn_wgmma_build make -C ffi/tests sparse-attention ARCH=sm_90a EXTRA="$flags" ATTN_BIN="$check"
      # Bounded: a kernel never run before may hang (a barrier or mbarrier wait that never completes).
      run attn_wgmma_check_quick timeout 120 "$check" --quick
      run attn_wgmma_memcheck timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$check" --quick --quiet
      run attn_wgmma_racecheck timeout 300 compute-sanitizer --tool racecheck --error-exitcode 3 "$check" --quick --quiet
      run attn_wgmma_bench_build make -C ffi/bench sparse-attention ARCH=sm_90a EXTRA="$flags" OUT="$PWD/build/wgmma"
      for rep in 1 2; do
        for b in 1 2 17 41; do
          run "attn_mma_b$b-$rep" build/sm90a/sparse_attention_bench "$OUT_DIR/attn_mma_b$b-$rep.json" "$b" 64
          run "attn_wgmma_b$b-$rep" timeout 120 build/wgmma/sparse_attention_bench "$OUT_DIR/attn_wgmma_b$b-$rep.json" "$b" 64
        done
      done
      run attn_wgmma_check timeout 300 "$check"
      # Where its time goes at batch 17, by instruction (stall samples with the source).
      run attn_wgmma_ncu timeout 300 ncu --set full --import-source yes -k regex:WgmmaChunkKernel --launch-skip 3 \
        --launch-count 1 -o "$OUT_DIR/attn_wgmma_ncu" build/wgmma/sparse_attention_bench "$OUT_DIR/attn_wgmma_ncu.json" 17 64
      run attn_wgmma_ncu_source ncu -i "$OUT_DIR/attn_wgmma_ncu.ncu-rep" --page source --csv --print-source sass ;;
    grouped-matmul-tiled)
      mkdir -p build/tests
      run gmm_rows_bench_build make -C ffi/bench grouped-matmul OUT="$PWD/build/rows"
      for tile in 16 32; do
        check="$PWD/build/tests/grouped_matmul_cuda_check_tiled$tile"
        run "gmm_tiled${tile}_build" make -C ffi/tests grouped-matmul EXTRA="-DHISPARSE_GROUPED_MATMUL_TILE_ROWS=$tile" \
          GMM_BIN="$check"
        run "gmm_tiled${tile}_check_quick" timeout 120 "$check" --quick
        run "gmm_tiled${tile}_memcheck" timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$check" --quick --quiet
        run "gmm_tiled${tile}_bench_build" make -C ffi/bench grouped-matmul \
          EXTRA="-DHISPARSE_GROUPED_MATMUL_TILE_ROWS=$tile" OUT="$PWD/build/tiled$tile"
      done
      for rep in 1 2; do
        for layout in rows tiled16 tiled32; do
          run "gmm_${layout}-$rep" "build/$layout/grouped_matmul_bench" "$OUT_DIR/gmm_${layout}-$rep.json" --slices --quick
        done
      done
      for tile in 16 32; do run "gmm_tiled${tile}_check" "$PWD/build/tests/grouped_matmul_cuda_check_tiled$tile"; done ;;
    attention-wgmma-slices)
      ab_slices attention "default=-Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90a" \
        "wgmma=-Ccmake.define.CMAKE_CUDA_ARCHITECTURES=90a -Ccmake.define.HISPARSE_SPARSE_ATTENTION_WGMMA=ON" ;;
    grouped-matmul-split-slices)
      mkdir -p build/tests
      split_check="$PWD/build/tests/grouped_matmul_cuda_check_split"
      run gmm_split_check_build make -C ffi/tests grouped-matmul EXTRA=-DHISPARSE_GROUPED_MATMUL_STREAM_SPLIT=1 \
        GMM_BIN="$split_check"
      # Bounded: the split streaming kernel had never run when this stage was written.
      run gmm_split_check timeout 600 "$split_check" --quiet
      run gmm_split_memcheck timeout 600 compute-sanitizer --tool memcheck --error-exitcode 3 "$split_check" --quick --quiet
      run gmm_split_bench_build make -C ffi/bench grouped-matmul EXTRA=-DHISPARSE_GROUPED_MATMUL_STREAM_SPLIT=1 \
        OUT="$PWD/build/gmm-split"
      run gmm_split_ab build/gmm-split/grouped_matmul_bench "$OUT_DIR/gmm_split_ab.json" --slices --quick --ab
      ab_slices gmm "default=" "split=-Ccmake.define.HISPARSE_GROUPED_MATMUL_STREAM_SPLIT=ON" ;;
    one-wave-slices)
      # Full-KV at 256K is the one run the one-wave rule changes (its routed gate_up at batch 1).
      AB_CONTEXTS=262144 AB_ARGS="--modes full-kv" ab_slices onewave "default=" \
        "off=-Ccmake.define.CMAKE_CUDA_FLAGS=-DHISPARSE_GROUPED_MATMUL_STREAM_ONE_WAVE=0" ;;
    topk-trace)
      run topk_trace_build make -C ffi/bench topk EXTRA=-DHISPARSE_TOPK_TRACE OUT="$PWD/build/topk-trace"
      # 17 x 131265 is the glm5-h200 slice's row at 128K (context plus every decoded token plus one):
      # R % 4 != 0, so its rows are not 16-byte aligned and TOP-K copies them 4 bytes at a time.
      run topk_trace build/topk-trace/topk_bench "$OUT_DIR/topk_trace.json" --shape 17x131072 --shape 17x131072:3 \
        --shape 17x131265 --shape 2x131072 --shape 41x32768 --reps 50
      run topk_bench_build make -C ffi/bench topk
      run topk_bench_in_step_rows build/topk_bench "$OUT_DIR/topk_in_step_rows.json" \
        --shape 17x131072 --shape 17x131265 --shape 2x131072 --shape 2x131265 ;;
    topk-aligned)
      aligned=-DHISPARSE_TOPK_ALIGNED_SLICES=1
      run topk_aligned_check_build make -C ffi/tests topk EXTRA="$aligned" TOPK_BIN="$PWD/build/tests/topk_cuda_check_aligned"
      run topk_aligned_check timeout 600 build/tests/topk_cuda_check_aligned --quiet
      run topk_aligned_sanitize timeout 900 make -C ffi/tests sanitize-topk EXTRA="$aligned" \
        TOPK_BIN="$PWD/build/tests/topk_cuda_check_aligned"
      run topk_aligned_bench_build make -C ffi/bench topk EXTRA="$aligned" OUT="$PWD/build/topk-aligned"
      run topk_default_bench_build make -C ffi/bench topk
      for rep in 1 2; do
        for variant in default aligned; do
          bench=build/topk_bench
          if [ "$variant" = aligned ]; then bench=build/topk-aligned/topk_bench; fi
          run "topk_aligned_ab-$variant-$rep" "$bench" "$OUT_DIR/topk_aligned_ab-$variant-$rep.json" \
            --shape 17x131265 --shape 2x131265 --shape 17x131072 --shape 2x131072 --shape 41x32768
        done
      done ;;
    topk-aligned-slices)
      AB_CONTEXTS=131072 AB_ARGS="--modes hisparse" ab_slices topkaligned "default=" \
        "aligned=-Ccmake.define.CMAKE_CUDA_FLAGS=-DHISPARSE_TOPK_ALIGNED_SLICES=1" ;;
    token-tiles-slices)
      # HiSparse of dsv32-h200 at 32K (70 tokens x 8 of 32 experts) is the run whose routed experts
      # take 64-token passes, which two streaming blocks an SM cannot hold.
      mkdir -p build/tests
      run gmm_tokentiles_check_build make -C ffi/tests grouped-matmul
      run gmm_tokentiles_check timeout 600 build/tests/grouped_matmul_cuda_check --quiet
      run gmm_dsv32_ab_build make -C ffi/bench grouped-matmul
      run gmm_dsv32_ab build/grouped_matmul_bench "$OUT_DIR/gmm_dsv32_ab.json" --slices --dsv32 --quick --ab --iters 20
      AB_DEPLOYMENT=dsv32-h200 AB_TRACE=deepseek-v3.2 AB_CONTEXTS=32768 AB_ARGS="--modes hisparse" ab_slices tokentiles \
        "default=" "off=-Ccmake.define.CMAKE_CUDA_FLAGS=-DHISPARSE_GROUPED_MATMUL_STREAM_FEWER_TOKEN_TILES=0" ;;
    graphs-slices)
      one_graph="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,DYNAMIC_SLICE_FUSION,CONDITIONAL,WHILE"
      one_graph="$one_graph --xla_gpu_command_buffer_unroll_loops=true"
      for graphs in default one; do
        flags=""
        if [ "$graphs" = one ]; then flags="$one_graph"; fi
        run "slice-graphs-$graphs" env XLA_FLAGS="${XLA_FLAGS:-} $flags" PYTHONPATH="$SITE" \
          XLA_PYTHON_CLIENT_PREALLOCATE=true XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 "$PY" "$SITE/bin/hisparse-bench" \
          decode --deployment glm5-h200 --contexts 131072 --trace glm-5.1 --no-equal-batch --one-at-a-time \
          --reps 10 --profile --no-plots --out "$OUT_DIR/slice-graphs-$graphs" $DECODE_ARGS
      done
      run launch_gaps env PYTHONPATH="$SITE" "$PY" benchmarks/launch_gaps.py "$OUT_DIR"/slice-graphs-*/decode.json ;;
    pdl-slices)
      for context in ${PDL_CONTEXTS:-131072 262144}; do
        for pdl in false true; do
          clocked "slice-pdl-$pdl-$context" env XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_pdl=$pdl" \
            PYTHONPATH="$SITE" XLA_PYTHON_CLIENT_PREALLOCATE=true XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 \
            "$PY" "$SITE/bin/hisparse-bench" decode --deployment glm5-h200 --contexts "$context" --trace glm-5.1 \
            --no-equal-batch --one-at-a-time --reps 10 --profile --no-plots --out "$OUT_DIR/slice-pdl-$pdl-$context" \
            $DECODE_ARGS
        done
      done
      run launch_gaps env PYTHONPATH="$SITE" "$PY" benchmarks/launch_gaps.py "$OUT_DIR"/slice-pdl-*/decode.json ;;
    prefetch-tests)
      run prefetch_pytest env PYTHONPATH="$SITE" "$PY" -m pytest tests/test_prefetch.py \
        tests/models/test_prefetch_decode.py -q -p no:cacheprovider ;;
    prefetch)
      profiles="${PROFILE_DIR:-$OUT_DIR/profiles}"
      for trace in ${PREFETCH_TRACES:-glm-5.1 deepseek-v3.2}; do
        # One run at a time: a HiSparse pool at the capacity batch is 42.8 GiB, and XLA's pinned-host
        # allocator, capped below the machine's RAM, cannot hold two (it grows in doubling regions).
        run "prefetch-glm5-h200-131072-$trace" env PYTHONPATH="$SITE" XLA_PYTHON_CLIENT_PREALLOCATE=true \
          XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 XLA_PJRT_GPU_HOST_MEMORY_LIMIT_GB=100 \
          "$PY" "$SITE/bin/hisparse-bench" decode --deployment glm5-h200 --set index_share=4 \
          --contexts 131072 --trace "$trace" --prefetch --no-equal-batch --one-at-a-time --reps 10 --profile \
          --profile-dir "$profiles/$trace" --out "$OUT_DIR/prefetch-$trace" $DECODE_ARGS
        run "prefetch-timeline-$trace" env PYTHONPATH="$SITE" "$PY" benchmarks/prefetch_timeline.py \
          "$profiles/$trace/hisparse-prefetch-131072-$trace" --out "$OUT_DIR/prefetch-timeline-$trace.png"
      done ;;
    gather-layout)
      run gather_layout_build make -C ffi/bench gather-layout
      for rep in 1 2; do run "gather_layout-$rep" timeout 120 build/gather_layout_bench "$OUT_DIR/gather_layout-$rep.json"; done ;;
    moe-route)
      mkdir -p build
      run moe_route_check timeout 600 make -C ffi/tests check-moe-route sanitize-moe-route
      run moe_route_build make -C ffi/bench moe-route
      run moe_route timeout 120 build/moe_route_bench --json "$OUT_DIR/moe_route_bench.json"
      run moe_route_pytest env PYTHONPATH="$SITE" "$PY" -m pytest tests/test_moe_route.py \
        tests/models/test_routing.py -q -p no:cacheprovider
      # Every context of the roofline issue's glm5 slices (the default waits on all three), the two
      # routings in turn at each.
      for context in ${ROUTING_CONTEXTS:-131072 32768 262144}; do
        for routing in count fused; do
          clocked "slice-routing-$routing-$context" env PYTHONPATH="$SITE" XLA_PYTHON_CLIENT_PREALLOCATE=true \
            XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 "$PY" "$SITE/bin/hisparse-bench" decode --deployment glm5-h200 \
            --set routing_implementation=$routing --contexts "$context" --trace glm-5.1 --no-equal-batch \
            --one-at-a-time --reps 10 --profile --no-plots --out "$OUT_DIR/slice-routing-$routing-$context" \
            $DECODE_ARGS
        done
      done
      run launch_gaps_routing env PYTHONPATH="$SITE" "$PY" benchmarks/launch_gaps.py "$OUT_DIR"/slice-routing-*/decode.json ;;
    ncu-profiles)
      mkdir -p build
      run ncu_gmm_build make -C ffi/bench grouped-matmul
      run ncu_topk_build make -C ffi/bench topk
      sections=(--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
                --section SchedulerStats --section MemoryWorkloadAnalysis --section InstructionStats
                --section ComputeWorkloadAnalysis)
      for only in gate_up:32:136 gate_up:32:328 down:32:328; do
        run "ncu_gmm_${only//:/_}" ncu "${sections[@]}" -k regex:GroupedMatmulKernel --launch-skip 2 --launch-count 1 \
          build/grouped_matmul_bench "$OUT_DIR/ncu_gmm_${only//:/_}.json" --slices --quick --only "$only" --iters 3
      done
      run ncu_topk ncu "${sections[@]}" -k regex:TopkResidentKernel --launch-skip 5 --launch-count 1 \
        build/topk_bench "$OUT_DIR/ncu_topk.json" --shape 17x131072 --reps 10 ;;
    headline)
      for spec in glm5-h200:glm-5.1 dsv32-h200:deepseek-v3.2; do
        name=${spec%%:*} trace=${spec#*:}
        for context in ${HEADLINE_CONTEXTS:-32768 131072 262144}; do
          profiles="$OUT_DIR/profiles-$name-$context"
          # shellcheck disable=SC2086  # DECODE_ARGS are words of their own
          clocked "headline-$name-$context" env PYTHONPATH="$SITE" XLA_PYTHON_CLIENT_PREALLOCATE=true \
            XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 "$PY" "$SITE/bin/hisparse-bench" decode --deployment "$name" \
            --contexts "$context" --trace "$trace" --no-equal-batch --one-at-a-time --reps 10 --profile \
            --profile-dir "$profiles" --no-plots --out "$OUT_DIR/headline-$name-$context" $DECODE_ARGS
          for run_dir in "$profiles"/*/; do
            run "kernels-$name-$context-$(basename "$run_dir")" env PYTHONPATH="$SITE" "$PY" \
              benchmarks/kernel_table.py "$run_dir" 16 --category all
          done
          rm -rf "$profiles"  # hundreds of MB of traces; the kernel tables keep what they say
        done
      done
      run launch_gaps_headline env PYTHONPATH="$SITE" "$PY" benchmarks/launch_gaps.py "$OUT_DIR"/headline-*/decode.json ;;
    slices)
      bench_slice glm5-h200 32768 131072 262144
      bench_slice dsv32-h200 32768 131072 262144
      bench_slice qwen3-quest-h200 131072 ;;
    decode-dsa)
      bench_decode dsa 32768 131072 ;;
    decode-nsa)
      bench_decode nsa 131072 ;;
    decode-quest)
      bench_decode quest 131072 ;;
    *)
      echo "unknown stage $stage" >&2; exit 2 ;;
  esac
done
