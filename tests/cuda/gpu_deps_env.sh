# Sourced by the device scripts (tests/cuda/run_gpu_tests.sh,
# bench/kernels/amx_device.sh): when ROOT/.gpu-deps exists (the Debian 12
# libraries made by tests/cuda/make_device_bundle.sh), point CMake,
# pkg-config and the loader at it.
if [ -d "$ROOT/.gpu-deps" ]; then
  D=$ROOT/.gpu-deps
  export CMAKE_PREFIX_PATH="$D/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
  export PKG_CONFIG_PATH="$D/usr/lib/x86_64-linux-gnu/pkgconfig:$D/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$D/usr/lib/x86_64-linux-gnu"
  command -v pkg-config >/dev/null || export PATH="$PATH:$D/usr/bin"
fi
