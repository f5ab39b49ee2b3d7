# Included by rocev2Config.cmake: the rogue drop-in.
#   rocev2_rogue_adapter(<target>)  adds the adapter sources (Core.cpp,
#   Server.cpp) to <target> and links rocev2::rocev2 to it.
# rogue's src/rogue/protocols/rocev2/CMakeLists.txt switches with one option:
#   if (ROGUE_ROCEV2_RS)
#      find_package(rocev2 1 REQUIRED)
#      rocev2_rogue_adapter(rogue-core)
#   else() ... upstream Core.cpp / Server.cpp ... endif()
set(ROCEV2_ROGUE_ADAPTER_SOURCES
    "${CMAKE_CURRENT_LIST_DIR}/../../../share/rocev2/rogue/Core.cpp"
    "${CMAKE_CURRENT_LIST_DIR}/../../../share/rocev2/rogue/Server.cpp")
foreach(_f IN LISTS ROCEV2_ROGUE_ADAPTER_SOURCES)
  get_filename_component(_abs "${_f}" ABSOLUTE)
  list(APPEND _rocev2_rogue_abs "${_abs}")
endforeach()
set(ROCEV2_ROGUE_ADAPTER_SOURCES "${_rocev2_rogue_abs}")
unset(_rocev2_rogue_abs)

function(rocev2_rogue_adapter target)
  target_sources(${target} PRIVATE ${ROCEV2_ROGUE_ADAPTER_SOURCES})
  target_include_directories(${target} PRIVATE "${ROCEV2_INCLUDE_DIR}")
  get_target_property(_type ${target} TYPE)
  if(_type STREQUAL "OBJECT_LIBRARY")
    # rogue-core is an object library: its users (the shared/static rogue
    # libraries) need the link; CMake propagates it from the object library.
    target_link_libraries(${target} PUBLIC rocev2::rocev2)
  else()
    target_link_libraries(${target} PUBLIC rocev2::rocev2)
  endif()
endfunction()
