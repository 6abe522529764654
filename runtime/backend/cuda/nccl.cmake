# qtk_cuda_nccl: tensor parallelism's device collective (nccl.h). NCCL itself
# is opened at run time (dlopen), so nothing of NCCL is needed to build.
# Included by this directory's CMakeLists.txt and by the GPU-only build
# (tests/cuda/gpu_only), whose GPU tests use it.
add_library(qtk_cuda_nccl STATIC ${CMAKE_CURRENT_LIST_DIR}/nccl.cpp)
set_target_properties(qtk_cuda_nccl PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_link_libraries(qtk_cuda_nccl PUBLIC qtk_cuda_kernels CUDA::cudart PRIVATE ${CMAKE_DL_LIBS})
