export OUT
QTK_GPU_SKIP_BENCH=1 QTK_GPU_SKIP_LONG=1 timeout 430 bash tests/cuda/run_gpu_tests.sh > $OUT/gpu_tests.txt 2>&1; echo "run_gpu_tests rc $?"
grep -E "PASSED|FAILED|FAIL:|PASS:|Failure" $OUT/gpu_tests.txt | head -30
left=$((570 - SECONDS)); echo "left $left s"
[ $left -gt 100 ] && WA_MICRO=0 WA_FORMS="4 0" WA_BATCHES=1,32,128,512 timeout $left bash bench/cuda/wide_ab.sh build-gpu 2>&1 | tail -8
