export OUT
QTK_GPU_EXTRA_TARGETS="synth convert cuda_model_bench" QTK_GPU_SKIP_BENCH=1 QTK_GPU_SKIP_LONG=1 timeout 330 bash tests/cuda/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; echo "run_gpu_tests rc $? at $SECONDS s"
grep -E "PASSED|FAILED|FAIL:|PASS:|Failure" $OUT/gpu_tests.txt | head -20
for f in 4 0; do QTK_MMA_WIDE=$f timeout 100 build-gpu/bin/qtk_cuda_bench --benchmark_min_time=0.1 --benchmark_filter='BM_WeightMatmul/(32|128|512)/(6144|24576|1536)/(4096|2048)/./1/manual_time|BM_WeightMatmul/(64|128)/4096/12288/1/1/manual_time' 2>&1 | grep -E "^BM_" | awk '{print $1, $2}' | sed 's#/manual_time##' > $OUT/wm_$f.txt; done
paste $OUT/wm_4.txt $OUT/wm_0.txt | awk '{print $1, $2, $4}' > $OUT/wm.txt; cat $OUT/wm.txt; rm -f $OUT/wm_4.txt $OUT/wm_0.txt
echo "at $SECONDS s"
left=$((585 - SECONDS)); [ $left -gt 90 ] && WA_MICRO=0 WA_FORMS="4 0" WA_BATCHES=1,32,128,512 timeout $left bash bench/cuda/wide_ab.sh build-gpu 2>&1 | tail -6
