# Run by `cmake --install` (cmake/mirror_install.cmake): copies each public header to
# <prefix>/include/mirror/<path>, rewriting mirror's own includes ("core/tensor.h", the form the
# source tree uses with the repository root on the include path) to <mirror/core/tensor.h>, so the
# installed headers need only <prefix>/include on the include path and put no "core/" directory
# of their own on it.
foreach(h ${MIRROR_HEADERS})
  file(READ ${MIRROR_SOURCE_DIR}/${h} text)
  string(REGEX REPLACE "#include \"((core|autodiff|models|optim|checkpoint|data|distribute|launch)/[a-z0-9_/]+\\.h)\""
         "#include <mirror/\\1>" text "${text}")
  if(text MATCHES "#include \"")
    message(FATAL_ERROR "mirror install: ${h} includes a header by a path that is not installed")
  endif()
  set(dst "$ENV{DESTDIR}${CMAKE_INSTALL_PREFIX}/${MIRROR_INCLUDEDIR}/mirror/${h}")
  message(STATUS "Installing: ${dst}")
  file(WRITE ${dst} "${text}")
endforeach()
