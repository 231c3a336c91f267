# Included by CMakeLists.txt inside if(STRATA_TESTS), after STRATA_TEST_ENV is set.
# Python tests: tests/py_*.py, run with STRATA_TEST_PYTHON (Debian's interpreter, which has python3-torch), and
# tests/mpi_py_*.py, run as 2 ranks by tests/helpers/mpi.sh. Both load this tree's libstrata.so (STRATA_LIB)
# and the package from the source tree (PYTHONPATH); exit 77 = skipped, as for the C tests.
#
# Two stacks: each test runs on the declared floor (Debian's torch 1.13; the Hugging Face tests re-run themselves in
# build/venv, which adds transformers 4.40.2 to it) as <name>, and on today's releases from PyPI (the venv
# STRATA_CURRENT_VENV, which tools/run makes: torch, transformers, accelerate, peft, safetensors; tools/run pins
# them) as <name>@current, which skips naming tools/run when that venv is not there. MKL_ENABLE_INSTRUCTIONS=AVX2:
# PyPI's torch takes a CPU tensor's sqrt from MKL, whose AVX-512 path is not correctly rounded, so its AdamW, the
# oracle, would round Adam's denominator otherwise than IEEE on AVX-512 machines
# (python/strata/torch/_torch_formula.py); its AVX2 path is IEEE on Intel machines. Where torch's sqrt is not IEEE
# even so (an AMD EPYC), the tests give their torch optimizers a correctly rounded one (tests/helpers/adam_oracle.py).
# Debian's torch has no MKL. MKL_CBWR=AUTO,STRICT: MKL's strict reproducibility mode, in which a panel of a
# product has the whole product's bits (torch 2.15's MKL otherwise picks another kernel for a narrower panel), so
# strata.torch.TiledLinear's tiles are bit-identical to nn.Linear there (python/strata/torch/_tiled_linear.py).
if(EXISTS /usr/bin/python3)
  set(STRATA_TEST_PYTHON_DEFAULT /usr/bin/python3)
else()
  find_program(STRATA_TEST_PYTHON_DEFAULT NAMES python3)
endif()
set(STRATA_TEST_PYTHON "${STRATA_TEST_PYTHON_DEFAULT}" CACHE FILEPATH "The Python that runs tests/py_*.py")
set(STRATA_PY_TEST_ENV "${STRATA_TEST_ENV};STRATA_LIB=$<TARGET_FILE:strata>;PYTHONPATH=${CMAKE_CURRENT_SOURCE_DIR}/python;MKL_ENABLE_INSTRUCTIONS=AVX2;MKL_CBWR=AUTO,STRICT")
set(STRATA_CURRENT_VENV "${CMAKE_BINARY_DIR}/venv-current" CACHE PATH
  "The venv with today's torch and Hugging Face releases that runs every Python test a second time (<name>@current)")
# Tests of the floor only: the offline Debian install recipe and the wheel built from a clean clone (each builds and
# installs once), the type check (mypy lives in the floor's venv), and the device-budget stress of prefetches in
# flight (the library's, whatever torch drives it; 90 s of serial time on today's torch).
set(STRATA_PY_TESTS_FLOOR_ONLY py_package py_package_wheel py_types py_hf_device_pressure)
# The Python tests the sanitized build runs: those that drive the library's own paths from torch (the engine's
# protocol, OffloadAdam, activations, real models, device pressure, a failing rank, ranks, fp16's skipped steps).
# The others test Python logic (schedulers, launchers, configs, Trainer, packaging) on a library the plain build and
# the sanitized C tests already cover, so the sanitized pass skips them, saying so.
set(STRATA_PY_TESTS_SANITIZED py_torch_engine py_offload_adam py_torch_activations py_hf_models py_hf_device_pressure
  py_torch_rank_fault py_torch_mixed_precision mpi_py_torch_ranks mpi_py_hf_ranks)
# A sanitized libstrata.so in an interpreter that is not: its runtimes must be loaded first (LD_PRELOAD, found
# where the compiler keeps them), and leak checking stays off because the interpreter frees little at exit by
# design. The mpi runs preload them into the ranks only (through env), not into mpirun.
set(STRATA_PY_PRELOAD "")
set(STRATA_PY_SKIP "")
if(STRATA_SANITIZE)
  set(runtimes "")
  if(CMAKE_C_COMPILER_ID STREQUAL "GNU")
    if(STRATA_SANITIZE MATCHES "address")
      list(APPEND runtimes libasan.so)
    endif()
    if(STRATA_SANITIZE MATCHES "undefined")
      list(APPEND runtimes libubsan.so)
    endif()
  elseif(CMAKE_C_COMPILER_ID MATCHES "Clang" AND STRATA_SANITIZE MATCHES "address")
    list(APPEND runtimes libclang_rt.asan-${CMAKE_SYSTEM_PROCESSOR}.so)  # holds UBSan's runtime too
  elseif(CMAKE_C_COMPILER_ID MATCHES "Clang" AND STRATA_SANITIZE MATCHES "undefined")
    list(APPEND runtimes libclang_rt.ubsan_standalone-${CMAKE_SYSTEM_PROCESSOR}.so)
  endif()
  foreach(rt IN LISTS runtimes)
    execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=${rt} OUTPUT_VARIABLE path
      OUTPUT_STRIP_TRAILING_WHITESPACE)
    if(IS_ABSOLUTE "${path}" AND EXISTS "${path}")
      list(APPEND STRATA_PY_PRELOAD "${path}")
    else()
      set(STRATA_PY_SKIP "${CMAKE_C_COMPILER} -print-file-name=${rt} did not find the sanitizer runtime")
    endif()
  endforeach()
  if(NOT runtimes)
    set(STRATA_PY_SKIP "no known sanitizer runtime to preload for STRATA_SANITIZE=${STRATA_SANITIZE} with ${CMAKE_C_COMPILER_ID}")
  endif()
  list(JOIN STRATA_PY_PRELOAD ":" STRATA_PY_PRELOAD)
  set(STRATA_PY_SAN_ENV "LD_PRELOAD=${STRATA_PY_PRELOAD};ASAN_OPTIONS=detect_leaks=0:abort_on_error=0")
endif()
if(NOT STRATA_TEST_PYTHON)
  set(STRATA_PY_SKIP "no python3 found; set STRATA_TEST_PYTHON")
endif()
# Python tests that start a world of ranks themselves: serial, like the mpi runs (a world already fills the cores).
set(STRATA_PY_TESTS_LAUNCHING_MPIRUN py_torch_rank_fault py_hf_device_pressure py_torch_launchers)
file(GLOB STRATA_PY_TESTS CONFIGURE_DEPENDS tests/py_*.py)
file(GLOB STRATA_MPI_PY_TESTS CONFIGURE_DEPENDS tests/mpi_py_*.py)
# strata_add_py_test(<name> <file> <python> <skip reason or "">): one Python test on one interpreter.
function(strata_add_py_test name py python skip)
  if(skip)
    add_test(NAME ${name} COMMAND bash -c "echo 'SKIP ${name}: ${skip}'; exit 77")
  elseif(name MATCHES "^mpi_py_")
    set(preload "")
    if(STRATA_PY_PRELOAD)
      set(preload env LD_PRELOAD=${STRATA_PY_PRELOAD})
    endif()
    add_test(NAME ${name} COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/helpers/mpi.sh 2 ${preload} ${python} ${py})
    set_tests_properties(${name} PROPERTIES RUN_SERIAL TRUE)
  else()
    add_test(NAME ${name} COMMAND ${python} ${py})
    get_filename_component(base ${py} NAME_WE)
    if(base IN_LIST STRATA_PY_TESTS_LAUNCHING_MPIRUN)
      set_tests_properties(${name} PROPERTIES RUN_SERIAL TRUE)
    endif()
  endif()
  set(env "${STRATA_PY_TEST_ENV};STRATA_CURRENT_VENV=${STRATA_CURRENT_VENV}")
  if(name MATCHES "@current$")  # a scratch space of its own: the floor's run of the same test may run beside it
    set(env "${env};STRATA_SCRATCH=${CMAKE_CURRENT_BINARY_DIR}/scratch-current")
  endif()
  if(STRATA_SANITIZE AND name MATCHES "^mpi_py_")
    set(env "${env};ASAN_OPTIONS=detect_leaks=0:abort_on_error=0")
  elseif(STRATA_SANITIZE)
    set(env "${env};${STRATA_PY_SAN_ENV}")
  endif()
  set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 ENVIRONMENT "${env}")
endfunction()

set(current_python bash ${CMAKE_CURRENT_SOURCE_DIR}/tests/helpers/current_python.sh)
foreach(py IN LISTS STRATA_PY_TESTS STRATA_MPI_PY_TESTS)
  get_filename_component(name ${py} NAME_WE)
  set(skip "${STRATA_PY_SKIP}")
  if(STRATA_SANITIZE AND NOT name IN_LIST STRATA_PY_TESTS_SANITIZED)
    set(skip "Python logic on a library the sanitized C tests cover, run in the plain build")
  endif()
  strata_add_py_test(${name} ${py} "${STRATA_TEST_PYTHON}" "${skip}")
  if(name IN_LIST STRATA_PY_TESTS_FLOOR_ONLY)
    continue()
  endif()
  # Today's stack: skipped under the sanitizers (the floor covers the library there); current_python.sh skips where
  # its venv is missing.
  set(skip "${STRATA_PY_SKIP}")
  if(STRATA_SANITIZE)
    set(skip "the current PyPI stack runs in the plain build only, the floor runs here")
  endif()
  strata_add_py_test(${name}@current ${py} "${current_python}" "${skip}")
endforeach()
