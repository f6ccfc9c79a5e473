# sluice_add_plugin(NAME SOURCES source...) (or sluice_add_plugin(NAME source...)): a plugin
# library, built as a module against the SDK only. Within this tree it lands in the bundled plugin
# folder; elsewhere in the build's lib folder.
function(sluice_add_plugin name)
  cmake_parse_arguments(PARSE_ARGV 1 plugin "" "" "SOURCES")
  set(sources ${plugin_SOURCES} ${plugin_UNPARSED_ARGUMENTS})
  if(NOT sources)
    message(FATAL_ERROR "sluice_add_plugin(${name}): no sources; write sluice_add_plugin(${name} SOURCES file.cpp ...)")
  endif()
  add_library(${name} MODULE ${sources})
  target_link_libraries(${name} PRIVATE Sluice::sdk)
  # Only the entry symbol needs to be visible; the rest stays private to the plugin.
  set_target_properties(${name} PROPERTIES CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN OFF)
  if(SLUICE_PLUGIN_OUTPUT_DIR)
    set_target_properties(${name} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${SLUICE_PLUGIN_OUTPUT_DIR})
  endif()
endfunction()
