# kreg_add_plugin(NAME SOURCES ... [LIBRARIES ...] [OUTPUT_DIR dir] [NO_INSTALL])
#
# A kreg plugin: a MODULE library named NAME.so with hidden visibility whose
# only exported symbols are the kreg_plugin_v* entry points. ISA flags belong
# on the plugin's own sources (set_source_files_properties), never globally.
set(KREG_PLUGIN_VERSION_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/plugin.map)

function(kreg_add_plugin name)
  cmake_parse_arguments(ARG "NO_INSTALL" "OUTPUT_DIR" "SOURCES;LIBRARIES" ${ARGN})
  if(NOT ARG_OUTPUT_DIR)
    set(ARG_OUTPUT_DIR ${KREG_PLUGIN_OUTPUT_DIR})
  endif()
  add_library(${name} MODULE ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE kreg::plugin_abi ${ARG_LIBRARIES})
  set_target_properties(${name} PROPERTIES
    PREFIX ""
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIR})
  target_link_options(${name} PRIVATE
    "LINKER:--version-script=${KREG_PLUGIN_VERSION_SCRIPT}" "LINKER:--no-undefined")
  set_property(TARGET ${name} APPEND PROPERTY LINK_DEPENDS ${KREG_PLUGIN_VERSION_SCRIPT})
  kreg_set_warnings(${name})
  if(NOT ARG_NO_INSTALL)
    install(TARGETS ${name} LIBRARY DESTINATION ${KREG_INSTALL_PLUGINDIR})
  endif()
endfunction()
