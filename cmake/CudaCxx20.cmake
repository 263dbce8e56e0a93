# nvcc needs C++20 spelled out for CMake 3.25 (docs/toolchain.md). Included by the top-level
# CMakeLists.txt and by tests/gpu/CMakeLists.txt before either enables the CUDA language.
set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
set(CMAKE_CUDA20_COMPILE_FEATURES cuda_std_20)
set(CMAKE_CUDA_STANDARD 20)
