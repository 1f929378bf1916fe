#!/usr/bin/env bash
# Patch an unpacked Horovod 0.28.1 sdist so it builds against torch 2.14 and TensorFlow 2.21.
#   bash scripts/patch-horovod.sh path/to/horovod-0.28.1
# Each edit must apply: a source that no longer matches stops the build with the reason.
set -euo pipefail
src=$1
edit() {  # edit FILE SED-EXPR WHAT
    local file=$src/$1
    if ! grep -q -- "$4" "$file"; then
        echo "patch-horovod: cannot apply '$3' to $1 (pattern '$4' not found)" >&2; exit 1
    fi
    sed -i -e "$2" "$file"
    echo "patched $1: $3"
}
# torch >= 2.1 headers need C++20 (upstream 3a31d933 did this for torch 2.1, never released).
edit horovod/torch/CMakeLists.txt 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 20)/' \
     "C++20 for torch ops" 'set(CMAKE_CXX_STANDARD 14)'
# With C++20 the torch ops must link the C++17 gloo target, else gloo symbols are defined twice.
edit horovod/torch/CMakeLists.txt 's/list(APPEND PYTORCH_LINKER_LIBS gloo)/list(APPEND PYTORCH_LINKER_LIBS compatible17_gloo)/' \
     "link compatible17_gloo" 'list(APPEND PYTORCH_LINKER_LIBS gloo)'
# That target is only made when TF asks for it: make it for the torch ops too (a torch-only build,
# --frameworks torch, would fail to link -lcompatible17_gloo), with torch's ABI when TF is absent.
edit CMakeLists.txt 's/^if(HAVE_GLOO AND (DEFINED Tensorflow_CXX17 AND Tensorflow_CXX17))$/if(HAVE_GLOO AND ((DEFINED Tensorflow_CXX17 AND Tensorflow_CXX17) OR DEFINED Pytorch_CXX11))/' \
     "C++17 gloo for torch-only builds" 'if(HAVE_GLOO AND (DEFINED Tensorflow_CXX17 AND Tensorflow_CXX17))'
edit CMakeLists.txt 's/^    if (Tensorflow_CXX11)$/    if (Tensorflow_CXX11 OR (NOT DEFINED Tensorflow_CXX11 AND Pytorch_CXX11))/' \
     "C++17 gloo with torch's ABI without TF" '^    if (Tensorflow_CXX11)$'
# Both ops libraries now link compatible17_gloo, so the plain gloo target is linked by nothing
# (MXNet is never built): make it only when something links it, as for an older TF. 38 of the
# build's ~140 C++ objects, in every build.
edit CMakeLists.txt 's|^    add_subdirectory(third_party/gloo)$|    add_subdirectory(third_party/gloo EXCLUDE_FROM_ALL)|' \
     "plain gloo only when linked" '^    add_subdirectory(third_party/gloo)$'
# Line tables only (-g1), not full debug info (-g): a C++ backtrace still names files and lines,
# each object compiles ~25 % faster and is ~4x smaller (mpi_ops_v2.cc: 42.6 s and 23 MB with -g,
# 30.8 s and 5 MB with -g1, GCC 12), so the link and the wheel are faster too. Set-up builds
# Horovod on a login node's shared cores, and the test suite builds it three times on a cold machine.
edit CMakeLists.txt 's/^string(REPLACE "-O2" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO "${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")$/&\
string(REPLACE "-g" "-g1" CMAKE_C_FLAGS_RELWITHDEBINFO "${CMAKE_C_FLAGS_RELWITHDEBINFO}")\
string(REPLACE "-g" "-g1" CMAKE_CXX_FLAGS_RELWITHDEBINFO "${CMAKE_CXX_FLAGS_RELWITHDEBINFO}")/' \
     "line tables only (-g1) in C and C++ objects" '^string(REPLACE "-O2" "-O3" CMAKE_CXX_FLAGS_RELWITHDEBINFO'
# GCC >= 13's libstdc++ no longer brings <string> in through <mutex>/<unordered_map>: group_table.h
# uses std::string without including it, and the build stops there (seen with GCC 13.3 on the
# GPU check's machine; Debian 12's GCC 12 compiles it as it is).
edit horovod/common/group_table.h 's|^#include <mutex>$|&\
#include <string>|' \
     "include <string> for GCC >= 13" '^#include <mutex>$'
# TF 2.21 no longer ships the XLA headers the optional XLA custom-call ops include.
edit horovod/tensorflow/CMakeLists.txt '/xla_mpi_ops.cc/d' \
     "drop optional XLA ops" 'xla_mpi_ops.cc'
# A CPU build needs no CUDA toolkit, even against PyPI's CUDA build of torch: Horovod decides
# "torch has CUDA" from torch.utils.cpp_extension.CUDA_HOME, which any nvcc on PATH or
# /usr/local/cuda sets, and then requires a full toolkit. HVDTRAIN_TORCH_CPU_OPS=1 says no.
edit cmake/Modules/FindPytorch.cmake \
     "s/(CUDA_HOME is not None)) else False)/(CUDA_HOME is not None) and __import__('os').environ.get('HVDTRAIN_TORCH_CPU_OPS') != '1') else False)/" \
     "CPU ops without a CUDA toolkit (HVDTRAIN_TORCH_CPU_OPS=1)" '(CUDA_HOME is not None)) else False)'
# NCCL build: the CUDA kernels' nvcc flags come from cmake/build_utils.py's get_nvcc_flags, which
# calls int() on each HOROVOD_BUILD_CUDA_CC_LIST entry; when it raises ("90a", "compute_90", an
# empty list), CMake went on with no flags at all: no -O3 -Xcompiler -fPIC and no -gencode, a
# library for CMake's default architecture only. Stop the build there instead, saying why.
edit horovod/common/ops/cuda/CMakeLists.txt \
     's|^\( *OUTPUT_VARIABLE HVD_NVCC_COMPILE_FLAGS OUTPUT_STRIP_TRAILING_WHITESPACE\))$|\1 RESULT_VARIABLE HVD_NVCC_FLAGS_RESULT)|; /^MESSAGE(STATUS "HVD_NVCC_COMPILE_FLAGS = /a\
if(NOT HVD_NVCC_FLAGS_RESULT EQUAL 0 OR NOT HVD_NVCC_COMPILE_FLAGS MATCHES "-gencode")\
    message(FATAL_ERROR "hvdtrain: no -gencode flags for the CUDA kernels (build_utils.get_nvcc_flags: ${HVD_NVCC_FLAGS_RESULT}; HOROVOD_BUILD_CUDA_CC_LIST=\x27$ENV{HOROVOD_BUILD_CUDA_CC_LIST}\x27 must be compute capabilities as numbers, e.g. 75,80,90)")\
endif()' \
     "stop when the CUDA kernels would get no -gencode flags" 'OUTPUT_VARIABLE HVD_NVCC_COMPILE_FLAGS OUTPUT_STRIP_TRAILING_WHITESPACE)$'
# NCCL build: TF's GPU ops ask TF for the CUDA stream through stream_executor::gpu::AsGpuStreamValue,
# which TF >= 2.16 no longer exports (the TF ops then fail to load: undefined symbol). The stream
# is also what the virtual Stream::platform_specific_handle() returns; use that there.
edit horovod/tensorflow/mpi_ops.cc \
     's|^#endif // TENSORFLOW_VERSION >= 2011000000$|&\
static GpuStreamHandle hvdtrain_gpu_stream(stream_executor::Stream* stream) {\
#if TENSORFLOW_VERSION >= 2016000000\
  return static_cast<GpuStreamHandle>(stream->platform_specific_handle().stream);\
#else\
  return stream_executor::gpu::AsGpuStreamValue(stream);\
#endif\
}|; s|stream_executor::gpu::AsGpuStreamValue(\([^s]\)|hvdtrain_gpu_stream(\1|g; s|stream_executor::gpu::AsGpuStreamValue($|hvdtrain_gpu_stream(|' \
     "CUDA stream from Stream::platform_specific_handle (TF >= 2.16)" 'stream_executor::gpu::AsGpuStreamValue(device_context'
# horovodrun under Open MPI 5 (PyPI's wheel, current sites): its prterun no longer reads the
# single-dash long options Horovod passes (`-bind-to none` made it look for a program "none").
# The double-dash spellings work on Open MPI 4 and 5 alike; MPICH's hydra keeps its own.
edit horovod/runner/mpi_run.py \
     "s/return list(_OMPI_FLAGS), list(_NO_BINDING_ARGS), _OMPI_IMPL/return list(_OMPI_FLAGS), ['--bind-to none', '--map-by slot'], _OMPI_IMPL/; s/'-mca /'--mca /g; s/f'-mca /f'--mca /g" \
     "Open MPI 5 option spellings for horovodrun" "return list(_OMPI_FLAGS), list(_NO_BINDING_ARGS), _OMPI_IMPL"
# Keras 3 (tf.keras in TF >= 2.16): users' own Horovod TF code as Horovod documents it —
# DistributedGradientTape, PartialDistributedGradientTape, broadcast_variables, SyncBatchNormalization
# and horovod.tensorflow.keras — plus one-line refusals where Keras 3 cannot do what Horovod asks.
# A Python-only diff, one row per change in docs/horovod-build.md.
keras3_patch=$(cd "$(dirname "$0")" && pwd)/horovod-keras3.patch
if command -v patch >/dev/null; then
    (cd "$src" && patch -p1 --forward --batch --quiet <"$keras3_patch")
else
    (cd "$src" && git apply -p1 "$keras3_patch")
fi || { echo "patch-horovod: cannot apply horovod-keras3.patch to $src" >&2; exit 1; }
echo "patched horovod/tensorflow, horovod/_keras: Keras 3 (horovod-keras3.patch)"
