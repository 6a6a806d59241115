# cmake --install: the libraries, the public headers under include/mirror/, pkg-config files, a
# CMake package (find_package(mirror)) and the mirror command. Included at the end of the top-level
# CMakeLists.txt (README "Use mirror as a library").
#
#   lib/libmirror.so, libmirror.a        CPU backend; mirror.pc; mirror::mirror, mirror::mirror_static
#   lib/libmirror_cuda.so                CUDA builds: the same plus the CUDA backend (needs the CUDA
#                                        runtime, cuBLAS, cuDNN and NCCL at run time); mirror_cuda.pc;
#                                        mirror::mirror_cuda
#   include/mirror/<module>/<name>.h     every public header (not *_impl.h, not core/math/), included as
#                                        <mirror/core/tensor.h>; their includes of each other are
#                                        rewritten from "core/tensor.h" to <mirror/core/tensor.h>
#   bin/mirror
include(CMakePackageConfigHelpers)
set(MIRROR_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/mirror)

install(TARGETS mirror RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS mirror_shared EXPORT mirror-targets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS mirror_shared_static EXPORT mirror-static-targets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(MIRROR_HAVE_CUDA)
  install(TARGETS mirror_cuda EXPORT mirror-targets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
install(EXPORT mirror-targets NAMESPACE mirror:: DESTINATION ${MIRROR_CMAKE_DIR})
install(EXPORT mirror-static-targets NAMESPACE mirror:: DESTINATION ${MIRROR_CMAKE_DIR})

file(GLOB _mirror_public_headers RELATIVE ${PROJECT_SOURCE_DIR} CONFIGURE_DEPENDS
     ${PROJECT_SOURCE_DIR}/core/*.h ${PROJECT_SOURCE_DIR}/autodiff/*.h ${PROJECT_SOURCE_DIR}/models/*.h
     ${PROJECT_SOURCE_DIR}/optim/*.h ${PROJECT_SOURCE_DIR}/checkpoint/*.h ${PROJECT_SOURCE_DIR}/data/*.h
     ${PROJECT_SOURCE_DIR}/distribute/*.h ${PROJECT_SOURCE_DIR}/launch/config.h ${PROJECT_SOURCE_DIR}/train/*.h)
list(FILTER _mirror_public_headers EXCLUDE REGEX "_impl\\.h$")
install(CODE "set(MIRROR_SOURCE_DIR \"${PROJECT_SOURCE_DIR}\")
set(MIRROR_HEADERS \"${_mirror_public_headers}\")
set(MIRROR_INCLUDEDIR \"${CMAKE_INSTALL_INCLUDEDIR}\")
include(\"${PROJECT_SOURCE_DIR}/cmake/mirror_install_headers.cmake\")")

# pkg-config: Libs for the shared library, Libs.private for `pkg-config --static`. The prefix is
# found from the .pc file's own place (${pcfiledir}), so `cmake --install --prefix P` works.
file(RELATIVE_PATH MIRROR_PC_UP /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
set(_mirror_private "")
foreach(lib ${HDF5_C_LIBRARIES} ${MPI_C_LIBRARIES} ${YAML_LINK_LIBRARIES} ${PROTOBUFC_LINK_LIBRARIES} ${ZLIB_LIBRARIES})
  string(APPEND _mirror_private " ${lib}")
endforeach()
string(APPEND _mirror_private " ${OpenMP_C_FLAGS} -lpthread -ldl -lm")
foreach(variant mirror mirror_cuda)
  if(variant STREQUAL "mirror_cuda" AND NOT MIRROR_HAVE_CUDA)
    continue()
  endif()
  set(MIRROR_PC_NAME ${variant})
  set(MIRROR_PC_PRIVATE "${_mirror_private}")
  configure_file(${PROJECT_SOURCE_DIR}/cmake/mirror.pc.in ${PROJECT_BINARY_DIR}/${variant}.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/${variant}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/mirror-config.cmake.in
                              ${PROJECT_BINARY_DIR}/mirror-config.cmake INSTALL_DESTINATION ${MIRROR_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/mirror-config-version.cmake COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/mirror-config.cmake ${PROJECT_BINARY_DIR}/mirror-config-version.cmake
        DESTINATION ${MIRROR_CMAKE_DIR})
