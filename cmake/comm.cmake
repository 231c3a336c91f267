# comm/ build rules, included by the top-level CMakeLists.txt after the CUDA backend is decided.
#
# comm/*.c go into libstrata. comm_mpi.c (the only file that includes mpi.h) is compiled when MPI is found,
# comm_nccl.c (the only file that includes nccl.h) when the CUDA backend is built and nccl.h + libnccl sit
# with the CUDA toolkit; otherwise their *_none.c stand-ins are, so no file ever tests which were built.
# Sets STRATA_COMM_SOURCES, STRATA_HAVE_MPI, STRATA_HAVE_NCCL, STRATA_COMM_LIBS (what libstrata links) and
# STRATA_PC_COMM_LIBS (the same for strata.pc).
option(STRATA_MPI "Build the MPI collectives when MPI is found" ON)
option(STRATA_NCCL "Build the NCCL device collectives when CUDA is built and NCCL is found" ON)

set(STRATA_HAVE_MPI OFF)
if(STRATA_MPI)
  find_package(MPI QUIET COMPONENTS C)
  if(MPI_C_FOUND)
    set(STRATA_HAVE_MPI ON)
  endif()
endif()

set(STRATA_HAVE_NCCL OFF)
if(STRATA_NCCL AND STRATA_HAVE_CUDA AND STRATA_HAVE_MPI)
  find_path(STRATA_NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(STRATA_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(STRATA_NCCL_INCLUDE_DIR AND STRATA_NCCL_LIBRARY)
    set(STRATA_HAVE_NCCL ON)
  endif()
endif()
message(STATUS "strata: MPI ${STRATA_HAVE_MPI}, NCCL ${STRATA_HAVE_NCCL}")

set(STRATA_COMM_DIR ${PROJECT_SOURCE_DIR}/comm)
file(GLOB STRATA_COMM_SOURCES CONFIGURE_DEPENDS ${STRATA_COMM_DIR}/*.c)
foreach(pair "MPI;comm_mpi" "NCCL;comm_nccl")
  list(GET pair 0 dep)
  list(GET pair 1 file)
  if(STRATA_HAVE_${dep})
    list(FILTER STRATA_COMM_SOURCES EXCLUDE REGEX "/${file}_none\\.c$")
  else()
    list(FILTER STRATA_COMM_SOURCES EXCLUDE REGEX "/${file}\\.c$")
  endif()
endforeach()

set(STRATA_COMM_LIBS "")
set(STRATA_PC_COMM_LIBS "")
if(STRATA_HAVE_MPI)
  list(APPEND STRATA_COMM_LIBS MPI::MPI_C)
  string(JOIN " " STRATA_PC_COMM_LIBS ${MPI_C_LIBRARIES})
endif()
if(STRATA_HAVE_NCCL)
  set_source_files_properties(${STRATA_COMM_DIR}/comm_nccl.c PROPERTIES
    INCLUDE_DIRECTORIES "${STRATA_NCCL_INCLUDE_DIR}")
  list(APPEND STRATA_COMM_LIBS ${STRATA_NCCL_LIBRARY})
  string(APPEND STRATA_PC_COMM_LIBS " ${STRATA_NCCL_LIBRARY}")
endif()
