# `troupe validate` on every config in examples/: each loads and is valid,
# so that no example rots unseen. The list is read at test time: a new
# example is checked without a line here.
file(GLOB examples "${SOURCE_DIR}/examples/*.json")
list(LENGTH examples n)
if(n LESS 10)
  message(FATAL_ERROR "only ${n} configs found in ${SOURCE_DIR}/examples")
endif()
# Gymnasium examples start python3 to validate: the venv
# scripts/install-deps.sh makes (GYM_VENV) comes first on the PATH. Without
# it they must fail exactly for want of Gymnasium (the config itself parsed).
set(have_gymnasium FALSE)
if(GYM_VENV AND EXISTS "${GYM_VENV}/bin/python")
  set(ENV{PATH} "${GYM_VENV}/bin:$ENV{PATH}")
  set(have_gymnasium TRUE)
endif()
foreach(example IN LISTS examples)
  execute_process(COMMAND ${TROUPE} validate ${example} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err WORKING_DIRECTORY ${SOURCE_DIR} TIMEOUT 60)
  if(NOT have_gymnasium AND example MATCHES "gymnasium|pong|halfcheetah"
     AND "${out}${err}" MATCHES "rl.env.python: 'python3' cannot (import Gymnasium|run)")
    message(STATUS "no Gymnasium venv at '${GYM_VENV}': ${example} refused for that alone")
    continue()
  endif()
  # Atari and MuJoCo need ale-py and OpenCV, or mujoco, in that venv.
  if(example MATCHES "pong|halfcheetah"
     AND "${out}${err}" MATCHES "No module named '(ale_py|cv2|mujoco)'|opencv-python package")
    message(STATUS "no ale-py/OpenCV/mujoco in '${GYM_VENV}': ${example} refused for that alone")
    continue()
  endif()
  if(NOT rc EQUAL 0 OR NOT "${out}${err}" MATCHES "valid")
    message(FATAL_ERROR "${example}: troupe validate exited ${rc}\n${out}${err}")
  endif()
  message(STATUS "valid: ${example}")
endforeach()
