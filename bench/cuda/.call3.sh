ROOT=$PWD; . tests/cuda/gpu_deps_env.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DQTK_CUDA=ON -DCMAKE_CUDA_COMPILER=$(command -v nvcc) > $OUT/build.log 2>&1 && cmake --build build-gpu -j16 --target qtk_cuda_tests qtk_cuda_bench synth convert cuda_model_bench >> $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
build-gpu/bin/qtk_cuda_tests --gtest_filter='MmaMatmul.*:*Moe*:WarpMatmul*' > $OUT/tests.txt 2>&1; tail -3 $OUT/tests.txt; grep -E "FAILED|Failure" $OUT/tests.txt | head
OUT=$OUT timeout 480 bash bench/cuda/wide_ab.sh build-gpu 2>&1 | tail -12
cd $OUT && paste <(awk '{print $1, $2}' weight_matmul_4.txt) <(awk '{print $2}' weight_matmul_32.txt) <(awk '{print $2}' weight_matmul_64.txt) <(awk '{print $2}' weight_matmul_0.txt) | sed 's#/manual_time##' > wm_all.txt; cat wm_all.txt; rm -f weight_matmul_*.txt
