# The house as drawn from the includes (docs/design.md, section 7): a file in
# one library's folder includes nothing from a folder listed after it.
# Run: cmake -DSOURCE_DIR=<repo> -P tests/check_layers.cmake
# crypto/ is the floor: a leaf over OpenSSL that includes no other folder.
set(layers crypto messages config net kernels monitoring trace devices collectives models envs data checkpoint
  actors strategies runtime report api cli)
set(failures "")
list(LENGTH layers count)
math(EXPR last "${count} - 1")
foreach(i RANGE ${last})
  list(GET layers ${i} dir)
  file(GLOB_RECURSE files "${SOURCE_DIR}/${dir}/*.cpp" "${SOURCE_DIR}/${dir}/*.hpp"
    "${SOURCE_DIR}/${dir}/*.inc" "${SOURCE_DIR}/${dir}/*.cu")
  foreach(f ${files})
    file(STRINGS "${f}" includes REGEX "^#include \"[a-z_]+/")
    foreach(line ${includes})
      string(REGEX REPLACE "^#include \"([a-z_]+)/.*" "\\1" target "${line}")
      list(FIND layers "${target}" j)
      if(j GREATER i)
        file(RELATIVE_PATH rel "${SOURCE_DIR}" "${f}")
        string(APPEND failures "\n  ${rel}: ${line} (${dir}/ is below ${target}/)")
      endif()
    endforeach()
  endforeach()
endforeach()
if(failures)
  message(FATAL_ERROR "includes that run back up the library order:${failures}")
endif()
message(STATUS "layers: no include runs back up (${count} libraries)")
