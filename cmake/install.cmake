# Install rules (cmake --install), the CMake package (find_package(flashgen CONFIG) -> flashgen::flashgen),
# the pkg-config file and the Debian package (cpack -G DEB). Included by the top-level CMakeLists.txt.
include(CMakePackageConfigHelpers)

set(FLASHGEN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/flashgen)

install(TARGETS flashgen EXPORT flashgen-targets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT development)
install(TARGETS flashgen_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)

# Headers: the C ABI at include/flashgen/, and the C++ API's layers (and the templates' shared parameter
# and traits headers, which those include) in their folders beside it.
install(DIRECTORY include/flashgen DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT development)
foreach(layer api dispatch tuner launch check runtime generator problem)
  install(DIRECTORY ${layer} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flashgen COMPONENT development
          FILES_MATCHING PATTERN "*.hpp")
endforeach()
install(DIRECTORY templates DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/flashgen COMPONENT development
        FILES_MATCHING PATTERN "*.cuh")

install(EXPORT flashgen-targets NAMESPACE flashgen:: DESTINATION ${FLASHGEN_CMAKE_DIR} COMPONENT development)
configure_package_config_file(cmake/flashgen-config.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/flashgen-config.cmake
                              INSTALL_DESTINATION ${FLASHGEN_CMAKE_DIR})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/flashgen-config-version.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flashgen-config.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/flashgen-config-version.cmake
        DESTINATION ${FLASHGEN_CMAKE_DIR} COMPONENT development)

# pkg-config: the C ABI needs only -I${includedir}; the C++ API's headers also want include/flashgen and
# cuda.h, so Cflags carries both. The prefix is found from the file's own place (${pcfiledir}), so an
# installed tree may move (DESTDIR, the Debian package's /usr).
set(FLASHGEN_DESCRIPTION "Flash-attention CUDA kernels generated from templates and compiled at run time with NVRTC")
file(RELATIVE_PATH FLASHGEN_PC_TO_PREFIX ${CMAKE_INSTALL_FULL_LIBDIR}/pkgconfig ${CMAKE_INSTALL_PREFIX})
string(REGEX REPLACE "/$" "" FLASHGEN_PC_TO_PREFIX "${FLASHGEN_PC_TO_PREFIX}")
list(GET CUDAToolkit_INCLUDE_DIRS 0 FLASHGEN_CUDA_INCLUDE_DIR)
configure_file(cmake/flashgen.pc.in ${CMAKE_CURRENT_BINARY_DIR}/flashgen.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/flashgen.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT development)

# Debian package of everything above. The CUDA toolkit's NVRTC comes from NVIDIA's own packages
# (cuda-nvrtc-<major>-<minor>) or a runfile install, not from Debian, so it is recommended, not a dependency
# dpkg could check; so is nlohmann-json3-dev, which only the C++ API's headers (and the CMake package) need.
set(CPACK_PACKAGE_NAME flashgen)
set(CPACK_PACKAGE_VENDOR flashgen)
set(CPACK_PACKAGE_CONTACT "flashgen developers")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${FLASHGEN_DESCRIPTION}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_GENERATOR DEB)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "libc6, libstdc++6, libsqlite3-0")
string(REPLACE "." ";" FLASHGEN_CUDA_VERSION_PARTS "${CUDAToolkit_VERSION}")
list(GET FLASHGEN_CUDA_VERSION_PARTS 0 FLASHGEN_CUDA_MAJOR)
list(GET FLASHGEN_CUDA_VERSION_PARTS 1 FLASHGEN_CUDA_MINOR)
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "cuda-nvrtc-${FLASHGEN_CUDA_MAJOR}-${FLASHGEN_CUDA_MINOR}, nlohmann-json3-dev")
include(CPack)
