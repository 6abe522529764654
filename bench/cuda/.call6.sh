export OUT
ROOT=$PWD; . tests/cuda/gpu_deps_env.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DQTK_CUDA=ON -DCMAKE_CUDA_COMPILER=$(command -v nvcc) > $OUT/build.log 2>&1 && cmake --build build-gpu -j16 --target qtk_cuda_bench synth convert cuda_model_bench >> $OUT/build.log 2>&1 || { tail -40 $OUT/build.log; exit 1; }
echo built $SECONDS
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
M=""; for s in barrier long_scoreboard short_scoreboard math_pipe_throttle mio_throttle wait not_selected dispatch_stall lg_throttle no_instruction selected tex_throttle drain branch_resolving imc_miss membar sleeping; do M="$M,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio"; done
M="${M#,},sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed.sum,sm__inst_executed_pipe_tensor_op_hmma.sum,lts__t_bytes.sum,dram__bytes.sum,gpu__time_duration.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed_op_shared_ld.sum,local_load_bytes:=l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"
M=${M%,local_load_bytes*}
for shape in 128/24576/4096/1/1 128/6144/4096/1/1; do
timeout 100 $NCU --kernel-name regex:mma_split --launch-skip 2 --launch-count 1 --metrics "$M" build-gpu/bin/qtk_cuda_bench --benchmark_filter="BM_WeightMatmul/$shape/manual_time" --benchmark_min_time=0.01 2>&1 | grep -E "^\s+(sm|smsp|lts|dram|gpu|l1tex)__" | sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | awk '{print $1, $NF}' > $OUT/ncu_$(echo $shape | tr / _).txt
done
echo ncu $SECONDS
CUOBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
obj=$(find build-gpu -name "warp_matmul.cu.o" | head -1)
$CUOBJ -sass $obj > /tmp/all.sass 2>/dev/null
python3 - > $OUT/sass_hist.txt <<'PY'
import re, collections
txt = open('/tmp/all.sass').read()
funcs = re.split(r'\n\s+Function : ', txt)
for f in funcs:
    name = f.split('\n')[0]
    if 'mma_split_kernelI13__nv_bfloat16Lb1ELi8' not in name and 'mma_wide_kernelI13__nv_bfloat16Lb1E' not in name: continue
    ops = re.findall(r'/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)', f)
    c = collections.Counter(o for o in ops)
    print(name[:90], len(ops))
    print(sorted(c.items(), key=lambda x: -x[1])[:40])
PY
grep -c . $OUT/sass_hist.txt
left=$((560 - SECONDS)); echo "left $left"
WA_MICRO=0 WA_FORMS="4 0" WA_BATCHES=1,32,128,512 timeout $left bash bench/cuda/wide_ab.sh build-gpu 2>&1 | tail -8
