export OUT
ROOT=$PWD; . tests/cuda/gpu_deps_env.sh
cd /tmp && nvcc -std=c++17 -I$ROOT -isystem $ROOT/.gpu-deps/usr/include -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -O3 -cubin -o wm.cubin $ROOT/kernels/cuda/warp_matmul.cu 2>&1 | head
CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
$CUOBJ -sass -fun '_ZN3qtk4cuda3dev16mma_split_kernelI13__nv_bfloat16Lb1ELi8EEEvNS1_11MmaOperandsEPT_lNS1_9RowGroupsEi' wm.cubin > $OUT/split_fp8_8.sass 2>&1
$CUOBJ -sass -fun '_ZN3qtk4cuda3dev16mma_split_kernelI13__nv_bfloat16Lb1ELi4EEEvNS1_11MmaOperandsEPT_lNS1_9RowGroupsEi' wm.cubin > $OUT/split_fp8_4.sass 2>&1
wc -l $OUT/*.sass
