ROOT=$PWD; . tests/cuda/gpu_deps_env.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DQTK_CUDA=ON -DCMAKE_CUDA_COMPILER=$(command -v nvcc) > $OUT/build.log 2>&1 && cmake --build build-gpu -j16 --target qtk_cuda_bench >> $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
for f in 0 64; do QTK_MMA_WIDE=$f build-gpu/bin/qtk_cuda_bench --benchmark_min_time=0.2 --benchmark_filter='BM_WeightMatmul/(32|64|128|256|512)/.*/1/manual_time' 2>&1 | grep -E "^BM_" > $OUT/wm_$f.txt; done
build-gpu/bin/qtk_cuda_bench --benchmark_min_time=0.2 --benchmark_filter='BM_Copy|BM_Gemm/(32|64|128|256|512)/(6144|24576|4096|1536)/(4096|12288|2048)/1/128' 2>&1 | grep -E "^BM_" | cut -c1-120 > $OUT/gemm.txt
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
$NCU --kernel-name regex:mma_split --launch-skip 3 --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section InstructionStats --section LaunchStats --section MemoryWorkloadAnalysis build-gpu/bin/qtk_cuda_bench --benchmark_filter='BM_WeightMatmul/128/6144/4096/1/1/manual_time' --benchmark_min_time=0.01 > $OUT/ncu_split.txt 2>&1
$NCU --kernel-name regex:mma_split --launch-skip 3 --launch-count 1 --section SourceCounters build-gpu/bin/qtk_cuda_bench --benchmark_filter='BM_WeightMatmul/128/6144/4096/1/1/manual_time' --benchmark_min_time=0.01 > $OUT/ncu_src.txt 2>&1
tail -5 $OUT/ncu_split.txt; paste <(awk '{print $1, $2}' $OUT/wm_0.txt) <(awk '{print $2}' $OUT/wm_64.txt)
