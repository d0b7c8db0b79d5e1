# Copies the small run's output SRC to OUT, tampers with its latest manifest
# (MODE step: one digit of "step"; deep: "config" nested 200,000 levels deep;
# none: left as it is),
# then runs CMD and checks it as cli_check.cmake does.
file(REMOVE_RECURSE ${OUT})
file(COPY ${SRC}/ DESTINATION ${OUT})
set(man ${OUT}/checkpoints/ckpt-0000000040/manifest.json)
file(READ ${man} text)
if(MODE STREQUAL "none")
  set(tampered "${text}x")
elseif(MODE STREQUAL "step")
  string(REPLACE "\"step\": 40," "\"step\": 41," tampered "${text}")
else()
  string(REPEAT "[" 200000 open)
  string(REPEAT "]" 200000 close)
  string(REPLACE "\"config\": {" "\"config\": ${open}${close}, \"config_\": {" tampered "${text}")
endif()
if(tampered STREQUAL text)
  message(FATAL_ERROR "could not tamper with ${man}")
endif()
if(NOT MODE STREQUAL "none")
  file(WRITE ${man} "${tampered}")
endif()
include(${CMAKE_CURRENT_LIST_DIR}/cli_check.cmake)
