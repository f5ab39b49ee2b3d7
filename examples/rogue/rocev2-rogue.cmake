# Included by rocev2Config.cmake: the rogue drop-in.
#   rocev2_rogue_adapter(<target>)  adds the adapter sources (Core.cpp,
#   Server.cpp) to <target> and links rocev2::rocev2 to it.
# rogue's src/rogue/protocols/rocev2/CMakeLists.txt switches with one option:
#   if (ROGUE_ROCEV2_RS)
#      find_package(rocev2 REQUIRED)   # no version: the adapter comes with the package
#      rocev2_rogue_adapter(rogue-core)
#   else() ... upstream Core.cpp / Server.cpp ... endif()
set(_rocev2_share "${CMAKE_CURRENT_LIST_DIR}/@ROCEV2_CMAKEDIR_TO_PREFIX@@CMAKE_INSTALL_DATADIR@/rocev2/rogue")
set(ROCEV2_ROGUE_ADAPTER_SOURCES "${_rocev2_share}/Core.cpp" "${_rocev2_share}/Server.cpp")
foreach(_f IN LISTS ROCEV2_ROGUE_ADAPTER_SOURCES)
  get_filename_component(_abs "${_f}" ABSOLUTE)
  list(APPEND _rocev2_rogue_abs "${_abs}")
endforeach()
set(ROCEV2_ROGUE_ADAPTER_SOURCES "${_rocev2_rogue_abs}")
unset(_rocev2_rogue_abs)

function(rocev2_rogue_adapter target)
  target_sources(${target} PRIVATE ${ROCEV2_ROGUE_ADAPTER_SOURCES})
  target_include_directories(${target} PRIVATE "${ROCEV2_INCLUDE_DIR}")
  # Visible from rogue's top directory, where its libraries are defined.
  set_property(TARGET rocev2::rocev2 PROPERTY IMPORTED_GLOBAL TRUE)
  target_link_libraries(${target} PUBLIC rocev2::rocev2)
  # rogue builds its shared and static libraries from the rogue-core objects:
  # link them too, once the top directory has defined them.
  cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL _rocev2_link_rogue_libraries)
endfunction()

function(_rocev2_link_rogue_libraries)
  foreach(t rogue-core-shared rogue-core-static)
    if(TARGET ${t})
      target_link_libraries(${t} PUBLIC rocev2::rocev2)
    endif()
  endforeach()
endfunction()
