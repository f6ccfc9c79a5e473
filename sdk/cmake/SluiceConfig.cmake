# find_package(Sluice) for plugin authors: provides Sluice::sdk and sluice_add_plugin().
include(${CMAKE_CURRENT_LIST_DIR}/SluiceTargets.cmake)
include(${CMAKE_CURRENT_LIST_DIR}/SluicePlugin.cmake)
