# cmake -P driver for tests/e2e/cuda_archs.sh: runs mirror_cuda_arch_lists (cmake/mirror_cuda_archs.cmake)
# with the -D values given and prints "cmake=<list> sass=<csv> ptx=<csv>".
include(${CMAKE_CURRENT_LIST_DIR}/../../cmake/mirror_cuda_archs.cmake)
mirror_cuda_arch_lists(cmake_list sass ptx)
message("cmake=${cmake_list} sass=${sass} ptx=${ptx}")
