# The CUDA emulator build (tests/emu/, README "The CUDA emulator"): the same core/cuda/*.cu files,
# rewritten by emu_rewrite and compiled as host C++ against an emulated runtime, cuBLAS(Lt), cuDNN
# and NCCL, linked with a second copy of the core library built as a CUDA build; the GPU tests of
# tests/gpu/ are built against it as emu.<test> (label emu). Needs only the CUDA toolkit's headers,
# not nvcc or a GPU, so it is on in every build that finds them (MIRROR_EMU=AUTO), the sanitizer
# build included. Included from the top-level CMakeLists.txt after mirror_core.
#
# Inputs: MIRROR_CORE_SOURCES (the core library's sources; the .c files are taken),
# distribute/comm_nccl.c, core/cuda/*.cu and core/cuda/*.h.

set(MIRROR_EMU AUTO CACHE STRING "Build the CUDA emulator and the emu tests: AUTO, ON or OFF")
set_property(CACHE MIRROR_EMU PROPERTY STRINGS AUTO ON OFF)
set(MIRROR_HAVE_EMU OFF)
if(NOT MIRROR_EMU STREQUAL "OFF")
  find_path(MIRROR_EMU_CUDA_INCLUDE cuda_runtime_api.h
            HINTS ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include /usr/local/cuda/targets/x86_64-linux/include)
  find_path(MIRROR_EMU_CUDNN_INCLUDE cudnn.h HINTS ${MIRROR_EMU_CUDA_INCLUDE} /usr/local/cuda/include /usr/include)
  find_path(MIRROR_EMU_NCCL_INCLUDE nccl.h HINTS ${MIRROR_EMU_CUDA_INCLUDE} /usr/local/cuda/include /usr/include)
  set(_emu_libs_src ${PROJECT_SOURCE_DIR}/tests/emu/emu_blas.cc ${PROJECT_SOURCE_DIR}/tests/emu/emu_dnn.cc
                    ${PROJECT_SOURCE_DIR}/tests/emu/emu_dnn_graph.cc)
  if(MIRROR_EMU_LIBS_OVERRIDE) # development only: other sources for the library fakes
    set(_emu_libs_src ${MIRROR_EMU_LIBS_OVERRIDE})
  endif()
  set(_emu_libs_ok ON)
  foreach(f ${_emu_libs_src})
    if(NOT EXISTS ${f})
      set(_emu_libs_ok OFF)
    endif()
  endforeach()
  if(MIRROR_EMU_CUDA_INCLUDE AND MIRROR_EMU_CUDNN_INCLUDE AND MIRROR_EMU_NCCL_INCLUDE
     AND EXISTS ${MIRROR_EMU_CUDA_INCLUDE}/cublasLt.h AND _emu_libs_ok AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
    set(MIRROR_HAVE_EMU ON)
  elseif(MIRROR_EMU STREQUAL "ON")
    message(FATAL_ERROR "MIRROR_EMU=ON but the CUDA toolkit's headers (cuda_runtime_api.h, cublasLt.h, cudnn.h, "
                        "nccl.h) were not found, or this is not x86-64. HINT: install the CUDA toolkit or configure "
                        "with -DMIRROR_EMU=OFF")
  endif()
endif()
message(STATUS "mirror: CUDA emulator ${MIRROR_HAVE_EMU}")

if(MIRROR_HAVE_EMU)
  enable_language(CXX)
  set(_emu_dir ${PROJECT_SOURCE_DIR}/tests/emu)
  set(_emu_src ${PROJECT_BINARY_DIR}/emu-src)
  set(_emu_san "")
  if(MIRROR_SANITIZE)
    set(_emu_san -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  endif()

  # the rewriter (a build tool: no sanitizer)
  add_executable(emu_rewrite ${_emu_dir}/emu_rewrite.c)
  target_compile_options(emu_rewrite PRIVATE -fno-sanitize=all)
  target_link_options(emu_rewrite PRIVATE -fno-sanitize=all)

  # rewritten .cu and private headers of core/cuda, and the list of every __global__ function
  file(GLOB _emu_cu CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/core/cuda/*.cu)
  file(GLOB _emu_h CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/core/cuda/*.h)
  set(_emu_cc "")
  set(_emu_kernel_lists "")
  foreach(f ${_emu_cu} ${_emu_h})
    get_filename_component(n ${f} NAME)
    if(n MATCHES "\\.cu$")
      string(REGEX REPLACE "\\.cu$" ".cc" out ${n})
    else()
      set(out ${n})
    endif()
    add_custom_command(OUTPUT ${_emu_src}/core/cuda/${out} ${_emu_src}/kernels/${n}.txt
                       COMMAND ${CMAKE_COMMAND} -E make_directory ${_emu_src}/core/cuda ${_emu_src}/kernels
                       COMMAND emu_rewrite ${f} ${_emu_src}/core/cuda/${out} ${_emu_src}/kernels/${n}.txt
                       DEPENDS emu_rewrite ${f} COMMENT "emu: rewriting ${n}" VERBATIM)
    list(APPEND _emu_kernel_lists ${_emu_src}/kernels/${n}.txt)
    if(n MATCHES "\\.cu$")
      list(APPEND _emu_cc ${_emu_src}/core/cuda/${out})
    else()
      list(APPEND _emu_hdr ${_emu_src}/core/cuda/${out})
    endif()
  endforeach()
  set(MIRROR_EMU_KERNELS ${PROJECT_BINARY_DIR}/emu-kernels.txt)
  add_custom_command(OUTPUT ${MIRROR_EMU_KERNELS}
                     COMMAND ${CMAKE_COMMAND} -DOUT=${MIRROR_EMU_KERNELS} "-DIN=${_emu_kernel_lists}"
                             -P ${_emu_dir}/emu_cat.cmake
                     DEPENDS ${_emu_kernel_lists} COMMENT "emu: the kernel list" VERBATIM)
  add_custom_target(emu_kernel_list ALL DEPENDS ${MIRROR_EMU_KERNELS} ${_emu_hdr})

  # the emulated build covers the GPUs the real one would (the default list without nvcc)
  if(NOT MIRROR_CUDA_SASS)
    set(CMAKE_CUDA_ARCHITECTURES "")
    mirror_cuda_arch_lists(_emu_archs MIRROR_CUDA_SASS MIRROR_CUDA_PTX)
  endif()
  set(_emu_defs MIRROR_HAVE_CUDA=1 MIRROR_HAVE_CUDNN=1 MIRROR_HAVE_NCCL=1 MIRROR_EMU=1
                MIRROR_VERSION="${PROJECT_VERSION}" MIRROR_CUDA_SASS="${MIRROR_CUDA_SASS}"
                MIRROR_CUDA_PTX="${MIRROR_CUDA_PTX}")
  set(_emu_inc ${_emu_src} ${PROJECT_SOURCE_DIR} ${MIRROR_EMU_CUDA_INCLUDE} ${MIRROR_EMU_CUDNN_INCLUDE}
               ${MIRROR_EMU_NCCL_INCLUDE})

  # the emulator itself and the fakes of the libraries
  add_library(mirror_emu_rt STATIC ${_emu_dir}/emu_exec.cc ${_emu_dir}/emu_runtime.cc ${_emu_dir}/emu_nccl.cc
              ${_emu_dir}/emu_values.cc
              ${_emu_libs_src})
  target_include_directories(mirror_emu_rt PRIVATE ${_emu_inc})
  target_include_directories(mirror_emu_rt PUBLIC ${PROJECT_SOURCE_DIR}/tests/emu)
  target_compile_options(mirror_emu_rt PRIVATE -std=c++17 -Wall -Wextra -Wno-unused-parameter -O2 -g ${_emu_san})
  target_link_libraries(mirror_emu_rt PUBLIC Threads::Threads)

  # the CUDA sources, as host C++
  add_library(mirror_emu_cuda STATIC ${_emu_cc})
  add_dependencies(mirror_emu_cuda emu_kernel_list)
  target_include_directories(mirror_emu_cuda BEFORE PRIVATE ${_emu_inc})
  target_compile_definitions(mirror_emu_cuda PRIVATE ${_emu_defs})
  target_compile_options(mirror_emu_cuda PRIVATE -std=c++17 -include ${_emu_dir}/emu_cuda.h -O2 -g
                         -Wno-unused-parameter -fno-math-errno ${_emu_san})

  # the core library as a CUDA build
  set(_emu_core "")
  foreach(f ${MIRROR_CORE_SOURCES})
    if(f MATCHES "\\.c$")
      list(APPEND _emu_core ${f})
    endif()
  endforeach()
  list(APPEND _emu_core ${PROJECT_SOURCE_DIR}/distribute/comm_nccl.c)
  list(REMOVE_DUPLICATES _emu_core)
  add_library(mirror_core_emu STATIC ${_emu_core})
  target_include_directories(mirror_core_emu PUBLIC ${PROJECT_SOURCE_DIR} ${MIRROR_GEN_DIR} ${HDF5_INCLUDE_DIRS})
  target_include_directories(mirror_core_emu PRIVATE ${MIRROR_EMU_CUDA_INCLUDE} ${MIRROR_EMU_CUDNN_INCLUDE}
                             ${MIRROR_EMU_NCCL_INCLUDE})
  target_compile_definitions(mirror_core_emu PUBLIC ${_emu_defs})
  target_link_libraries(mirror_core_emu PUBLIC OpenMP::OpenMP_C Threads::Threads ZLIB::ZLIB ${CMAKE_DL_LIBS} m
                        PkgConfig::YAML PkgConfig::PROTOBUFC ${HDF5_C_LIBRARIES} MPI::MPI_C stdc++)
  # what a program links: the core and the CUDA objects refer to each other, so one link group
  add_library(mirror_emu INTERFACE)
  target_link_libraries(mirror_emu INTERFACE "$<LINK_GROUP:RESCAN,mirror_core_emu,mirror_emu_cuda,mirror_emu_rt>")
  if(MIRROR_SANITIZE)
    target_link_libraries(mirror_core_emu PUBLIC -fsanitize=address,undefined)
  endif()

  # the command line on the emulator: build/mirror-emu trains on emulated GPUs (MR_EMU_DEVICES of
  # them) through the same launch/ code as build/mirror, so the GPU trainer's user path (YAML,
  # distribute.devices, checkpoints, bench/run_gpu_dp.sh) runs in CI
  add_executable(mirror_emu_cli ${PROJECT_SOURCE_DIR}/launch/main.c ${PROJECT_SOURCE_DIR}/launch/doctor.c
                 ${PROJECT_SOURCE_DIR}/launch/sweep.c ${PROJECT_SOURCE_DIR}/launch/sweep_store.c)
  target_link_libraries(mirror_emu_cli PRIVATE mirror_emu)
  set_target_properties(mirror_emu_cli PROPERTIES OUTPUT_NAME mirror-emu RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})

  add_test(NAME emu.gpu_dp COMMAND bash ${PROJECT_SOURCE_DIR}/tests/e2e/gpu_dp.sh $<TARGET_FILE:mirror_emu_cli>)
  set_tests_properties(emu.gpu_dp PROPERTIES LABELS emu TIMEOUT 300)
  add_test(NAME emu.gpu_cli COMMAND bash ${PROJECT_SOURCE_DIR}/tests/e2e/gpu_cli.sh $<TARGET_FILE:mirror_emu_cli>
                                   $<TARGET_FILE:mirror>)
  set_tests_properties(emu.gpu_cli PROPERTIES LABELS emu TIMEOUT 600 SKIP_RETURN_CODE 77)

  # the GPU tests against the emulator
  add_library(mirror_test_harness_emu STATIC ${PROJECT_SOURCE_DIR}/tests/harness.c)
  target_link_libraries(mirror_test_harness_emu PUBLIC mirror_emu PkgConfig::CMOCKA)
  target_include_directories(mirror_test_harness_emu PUBLIC ${PROJECT_SOURCE_DIR}/tests)

  set(MIRROR_EMU_CENSUS_DIR ${PROJECT_BINARY_DIR}/emu-census)
  add_test(NAME emu.census_reset COMMAND ${CMAKE_COMMAND} -E rm -rf ${MIRROR_EMU_CENSUS_DIR})
  set_tests_properties(emu.census_reset PROPERTIES FIXTURES_SETUP emu_census LABELS emu)
  set(MIRROR_EMU_TESTS "")
  # emu_add_test(NAME TARGET [ARGS...]): an emulated test that counts toward the kernel census
  function(emu_add_test name target)
    add_test(NAME emu.${name} COMMAND ${target} ${ARGN})
    set_tests_properties(emu.${name} PROPERTIES TIMEOUT 900 LABELS emu FIXTURES_REQUIRED emu_census
                         ENVIRONMENT "OMP_NUM_THREADS=2;MR_EMU_CENSUS=${MIRROR_EMU_CENSUS_DIR}/${name}.txt")
    set(MIRROR_EMU_TESTS ${MIRROR_EMU_TESTS} emu.${name} PARENT_SCOPE)
  endfunction()

  file(GLOB _emu_gpu_tests CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/gpu/test_*.c)
  foreach(src ${_emu_gpu_tests})
    get_filename_component(name ${src} NAME_WE)
    add_executable(emu_${name} ${src} ${PROJECT_SOURCE_DIR}/tests/gpu/gpu_util.c)
    target_link_libraries(emu_${name} PRIVATE mirror_test_harness_emu)
    emu_add_test(${name} emu_${name})
    # glibc hands out heap memory filled with 0x5A bytes (not the fresh, zeroed pages a large
    # malloc often gets from mmap): host state read before it is written shows up every run, not
    # one run in five (test_gpu_overlap's ZeRO-1 resume read uninitialised optimizer padding)
    set_property(TEST emu.${name} APPEND PROPERTY ENVIRONMENT "MALLOC_PERTURB_=165" "MALLOC_MMAP_THRESHOLD_=16777216")
  endforeach()

  # the emulator's own tests: the runtime's semantics, the planted bugs (.cu files, rewritten like
  # core/cuda's), the library fakes
  file(GLOB _emu_own_tests CONFIGURE_DEPENDS ${_emu_dir}/test_emu_*.c ${_emu_dir}/test_emu_*.cc ${_emu_dir}/test_emu_*.cu)
  foreach(src ${_emu_own_tests})
    get_filename_component(name ${src} NAME_WE)
    set(build_src ${src})
    if(src MATCHES "\\.cu$")
      set(build_src ${_emu_src}/tests/emu/${name}.cc)
      add_custom_command(OUTPUT ${build_src}
                         COMMAND ${CMAKE_COMMAND} -E make_directory ${_emu_src}/tests/emu
                         COMMAND emu_rewrite ${src} ${build_src} ${_emu_src}/tests/emu/${name}.kernels.txt
                         DEPENDS emu_rewrite ${src} COMMENT "emu: rewriting ${name}.cu" VERBATIM)
    endif()
    add_executable(emu_${name} ${build_src})
    target_link_libraries(emu_${name} PRIVATE mirror_test_harness_emu)
    target_include_directories(emu_${name} BEFORE PRIVATE ${_emu_inc})
    target_compile_definitions(emu_${name} PRIVATE ${_emu_defs})
    if(src MATCHES "\\.cu$")
      target_compile_options(emu_${name} PRIVATE -std=c++17 -include ${_emu_dir}/emu_cuda.h -O1 -g ${_emu_san})
    elseif(src MATCHES "\\.cc$")
      target_compile_options(emu_${name} PRIVATE -std=c++17 -g ${_emu_san})
    endif()
    emu_add_test(${name} emu_${name})
  endforeach()

  # every __global__ function of core/cuda ran in at least one emu test
  add_test(NAME emu.census COMMAND ${CMAKE_COMMAND} -DKERNELS=${MIRROR_EMU_KERNELS} -DDIR=${MIRROR_EMU_CENSUS_DIR}
                                   "-DTESTS=${MIRROR_EMU_TESTS}" -P ${_emu_dir}/emu_census.cmake)
  set_tests_properties(emu.census PROPERTIES LABELS emu DEPENDS "${MIRROR_EMU_TESTS}" FIXTURES_REQUIRED emu_census)
endif()
