# Which GPU architectures the CUDA build makes code for (README "GPUs", issue 16 item 6).
#
#   -DMIRROR_CUDA_ARCHS="80;86;89;90;100"  the default: SASS for each (A100, A10/RTX 30xx,
#                                          L40S/RTX 40xx, H100/H200, B200) plus PTX of the newest,
#                                          which the driver JIT-compiles for later GPUs (RTX 50xx)
#   -DMIRROR_CUDA_ARCHS=native             the GPUs of the build machine only (fast local builds;
#                                          read from nvidia-smi, so it needs a GPU at configure time)
#   -DCMAKE_CUDA_ARCHITECTURES=...         CMake's own spelling (e.g. "90-real;100") still wins
# sm_80 is the floor: the bf16 kernels need it. The SASS and PTX lists reach the code as
# MIRROR_CUDA_SASS / MIRROR_CUDA_PTX ("80,86,89,90,100" and "100"), from which core/cuda_arch.c
# decides whether a GPU can run this build (mirror doctor, and the device probe, which refuses a GPU
# the build cannot run with a HINT instead of failing at the first kernel launch).

set(MIRROR_CUDA_ARCHS "80;86;89;90;100" CACHE STRING
    "CUDA architectures: a list of compute capabilities (>= 80; SASS for each, PTX of the newest) or native")

# mirror_cuda_arch_lists(<cmake_list_out> <sass_out> <ptx_out>): from MIRROR_CUDA_ARCHS, or from
# CMAKE_CUDA_ARCHITECTURES when the user set it.
function(mirror_cuda_arch_lists cmake_out sass_out ptx_out)
  set(sass "")
  set(ptx "")
  if(DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    # CMake's spelling: N (SASS + PTX), N-real (SASS), N-virtual (PTX)
    set(cmake_list ${CMAKE_CUDA_ARCHITECTURES})
    if(cmake_list MATCHES "^(native|all|all-major)$")
      message(FATAL_ERROR "CMAKE_CUDA_ARCHITECTURES=${cmake_list}: mirror needs the list spelled out to tell which "
                          "GPUs its build covers. HINT: use -DMIRROR_CUDA_ARCHS=native or a list such as 80;90")
    endif()
    foreach(a ${cmake_list})
      if(NOT a MATCHES "^([0-9]+)(-real|-virtual)?$")
        message(FATAL_ERROR "CMAKE_CUDA_ARCHITECTURES: '${a}' is not N, N-real or N-virtual")
      endif()
      set(n ${CMAKE_MATCH_1})
      if(NOT CMAKE_MATCH_2 STREQUAL "-virtual")
        list(APPEND sass ${n})
      endif()
      if(NOT CMAKE_MATCH_2 STREQUAL "-real")
        list(APPEND ptx ${n})
      endif()
    endforeach()
  else()
    set(archs ${MIRROR_CUDA_ARCHS})
    if(archs STREQUAL "native")
      find_program(_mirror_nvsmi nvidia-smi)
      set(caps "")
      if(_mirror_nvsmi)
        execute_process(COMMAND ${_mirror_nvsmi} --query-gpu=compute_cap --format=csv,noheader
                        OUTPUT_VARIABLE caps RESULT_VARIABLE rc ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
        if(NOT rc EQUAL 0)
          set(caps "")
        endif()
      endif()
      if(caps STREQUAL "")
        message(FATAL_ERROR "MIRROR_CUDA_ARCHS=native: no GPU answered nvidia-smi on this machine. "
                            "HINT: name the architectures, e.g. -DMIRROR_CUDA_ARCHS=90 (or keep the default list)")
      endif()
      string(REPLACE "." "" caps "${caps}")
      string(REPLACE "\n" ";" archs "${caps}")
      list(REMOVE_DUPLICATES archs)
    endif()
    foreach(a ${archs})
      if(NOT a MATCHES "^[0-9]+$")
        message(FATAL_ERROR "MIRROR_CUDA_ARCHS: '${a}' is not a compute capability such as 80 or 90. "
                            "HINT: -DMIRROR_CUDA_ARCHS=\"80;90\" or native")
      endif()
      if(a LESS 80)
        message(FATAL_ERROR "MIRROR_CUDA_ARCHS: ${a} is below 80, the floor (the bf16 kernels need sm_80). "
                            "HINT: drop it; GPUs older than the A100 are not supported")
      endif()
    endforeach()
    list(SORT archs COMPARE NATURAL)
    list(REMOVE_DUPLICATES archs)
    set(sass ${archs})
    list(GET archs -1 newest)
    set(ptx ${newest})
    set(cmake_list "")
    foreach(a ${archs})
      if(a STREQUAL newest)
        list(APPEND cmake_list ${a})
      else()
        list(APPEND cmake_list ${a}-real)
      endif()
    endforeach()
  endif()
  string(REPLACE ";" "," sass_csv "${sass}")
  string(REPLACE ";" "," ptx_csv "${ptx}")
  set(${cmake_out} "${cmake_list}" PARENT_SCOPE)
  set(${sass_out} "${sass_csv}" PARENT_SCOPE)
  set(${ptx_out} "${ptx_csv}" PARENT_SCOPE)
endfunction()
