# An op family is one folder, plugins/<family>/, found by plugins/CMakeLists.txt's
# glob: its op descriptors and layout (include/kreg/<family>/layout.h), its
# kernels (CPU, plugins of their own for oneDNN and CUDA), its typed C++
# front (include/kreg/<family>.h, if any), its conformance cases
# (conformance_test.cc, compiled into tests/' conformance_test), its other
# tests (tests.cmake, included by tests/CMakeLists.txt: MPI lists and the
# like), its benchmark and its fuzz seeds (fuzz/<fuzzer>/, added to that
# fuzzer's corpus). In-tree only; out-of-tree plugins use KregPlugin.cmake.

# kreg_add_family(NAME PLUGINS target...): after the family's plugins are
# defined. Gives each plugin the family's include/ folder (also as the
# target kreg::<NAME>_layout), makes the
# family's headers (layout, typed front) reachable as kreg/... from
# kreg::tuning_db in the build tree and installs them beside kreg's own, and
# records the family (global properties KREG_FAMILIES, KREG_FAMILY_PLUGINS,
# KREG_FAMILY_DIR_<NAME>) for tests/, bench/ and fuzz/.
function(kreg_add_family name)
  cmake_parse_arguments(ARG "" "" "PLUGINS" ${ARGN})
  set(include_dir ${CMAKE_CURRENT_SOURCE_DIR}/include)
  set(plugins)
  foreach(plugin IN LISTS ARG_PLUGINS)
    if(TARGET ${plugin})  # optional plugins (oneDNN, CUDA) may not be built
      list(APPEND plugins ${plugin})
      if(EXISTS ${include_dir})
        target_include_directories(${plugin} PRIVATE ${include_dir})
      endif()
    endif()
  endforeach()
  if(EXISTS ${include_dir})
    # kreg::<NAME>_layout: the family's headers alone, for code outside the
    # folder that includes its kernels' headers (tests' fake plugins).
    add_library(kreg_${name}_layout INTERFACE)
    add_library(kreg::${name}_layout ALIAS kreg_${name}_layout)
    target_include_directories(kreg_${name}_layout INTERFACE ${include_dir})
    target_include_directories(kreg_tuning_db INTERFACE $<BUILD_INTERFACE:${include_dir}>)
    install(DIRECTORY ${include_dir}/kreg DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  endif()
  set_property(GLOBAL APPEND PROPERTY KREG_FAMILIES ${name})
  set_property(GLOBAL APPEND PROPERTY KREG_FAMILY_PLUGINS ${plugins})
  set_property(GLOBAL PROPERTY KREG_FAMILY_DIR_${name} ${CMAKE_CURRENT_SOURCE_DIR})
endfunction()

# kreg_add_cuda_plugin(NAME SOURCES host.cc... CUDA_SOURCES kernel.cu...
# [LIBRARIES ...]): a family's CUDA kernels as a plugin of their own, built
# only where nvcc was found (cmake/KregDependencies.cmake), for
# KREG_CUDA_ARCHITECTURES, the CUDA runtime linked in statically. The
# device code is an object library of its own: kreg's C++ warnings go to
# the host sources, nvcc gets its own.
function(kreg_add_cuda_plugin name)
  cmake_parse_arguments(ARG "" "" "SOURCES;CUDA_SOURCES;LIBRARIES" ${ARGN})
  if(NOT KREG_CUDA_FOUND)
    message(STATUS "kreg: nvcc not found (or a sanitizer build): skipping plugin ${name}")
    return()
  endif()
  message(STATUS "kreg: nvcc ${CMAKE_CUDA_COMPILER_VERSION} found: building plugin ${name} (sm ${KREG_CUDA_ARCHITECTURES})")
  add_library(${name}_device_code OBJECT ${ARG_CUDA_SOURCES})
  set_target_properties(${name}_device_code PROPERTIES
    CUDA_ARCHITECTURES "${KREG_CUDA_ARCHITECTURES}"
    CUDA_STANDARD 17
    CUDA_VISIBILITY_PRESET hidden
    POSITION_INDEPENDENT_CODE ON)
  target_link_libraries(${name}_device_code PRIVATE kreg::plugin_abi)
  target_compile_options(${name}_device_code PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --expt-relaxed-constexpr>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${KREG_WERROR}>>:-Werror=all-warnings>)
  kreg_add_plugin(${name} SOURCES ${ARG_SOURCES} $<TARGET_OBJECTS:${name}_device_code>
    LIBRARIES CUDA::cudart_static ${CMAKE_DL_LIBS} ${ARG_LIBRARIES})
  # The device objects make CUDA one of the plugin's languages, whose
  # dialect would default to CXX_STANDARD (20, which CMake 3.25 cannot give
  # nvcc): CMake's file API (scikit-build-core, IDEs) asks for it.
  set_target_properties(${name} PROPERTIES CUDA_STANDARD 17)
endfunction()
