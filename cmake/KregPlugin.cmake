# kreg_add_plugin(NAME SOURCES ... [LIBRARIES ...] [OUTPUT_DIR dir] [NO_INSTALL])
#
# A kreg plugin: a MODULE library named NAME.so with hidden visibility whose
# only exported symbols are the kreg_plugin_v* entry points, linked against
# kreg::plugin_abi alone. ISA flags belong on the plugin's own sources
# (set_source_files_properties), never globally. Installed with kreg, so an
# out-of-tree plugin uses it after find_package(kreg COMPONENTS plugin); it
# installs into <prefix>/lib/kreg/plugins, where kreg looks.
include(GNUInstallDirs)
set(KREG_PLUGIN_VERSION_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/plugin.map)

function(kreg_add_plugin name)
  cmake_parse_arguments(ARG "NO_INSTALL" "OUTPUT_DIR" "SOURCES;LIBRARIES" ${ARGN})
  if(NOT ARG_OUTPUT_DIR AND DEFINED KREG_PLUGIN_OUTPUT_DIR)
    set(ARG_OUTPUT_DIR ${KREG_PLUGIN_OUTPUT_DIR})
  endif()
  add_library(${name} MODULE ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE kreg::plugin_abi ${ARG_LIBRARIES})
  set_target_properties(${name} PROPERTIES
    PREFIX ""
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  if(ARG_OUTPUT_DIR)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIR})
  endif()
  target_link_options(${name} PRIVATE "LINKER:--version-script=${KREG_PLUGIN_VERSION_SCRIPT}")
  # Every symbol resolved at link time — except in kreg's clang sanitizer and
  # fuzzing builds, whose runtimes (__asan_*, __ubsan_*, __sanitizer_cov_*)
  # live in the executable that loads the plugin.
  if(NOT ((KREG_SANITIZE OR KREG_FUZZ) AND CMAKE_CXX_COMPILER_ID MATCHES "Clang"))
    target_link_options(${name} PRIVATE "LINKER:--no-undefined")
  endif()
  set_property(TARGET ${name} APPEND PROPERTY LINK_DEPENDS ${KREG_PLUGIN_VERSION_SCRIPT})
  if(COMMAND kreg_set_warnings)  # inside kreg's own tree
    kreg_set_warnings(${name})
  endif()
  # ABI structs grow by appended optional fields that plugins may leave out.
  target_compile_options(${name} PRIVATE -Wno-missing-field-initializers)
  if(NOT ARG_NO_INSTALL)
    if(NOT DEFINED KREG_INSTALL_PLUGINDIR)
      set(KREG_INSTALL_PLUGINDIR ${CMAKE_INSTALL_LIBDIR}/kreg/plugins)
    endif()
    install(TARGETS ${name} LIBRARY DESTINATION ${KREG_INSTALL_PLUGINDIR})
  endif()
endfunction()
