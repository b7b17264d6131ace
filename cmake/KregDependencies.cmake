# Dependencies as imported targets (Debian 12 packages; see scripts/deps.sh).
find_package(Threads REQUIRED)
find_package(absl REQUIRED)
find_package(TBB REQUIRED)
find_package(dlpack REQUIRED)
find_package(Protobuf REQUIRED)
if(KREG_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()
if(KREG_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()
# Optional: MPI (Debian: libopenmpi-dev openmpi-bin) for the mpi backend,
# its tests and the collectives benchmark against Open MPI's own.
find_package(MPI COMPONENTS CXX QUIET)
# Optional: the CUDA toolkit (nvcc, the runtime) for the cuda device
# backend; no GPU is needed to build it. Debian's, or /usr/local/cuda.
if(NOT DEFINED CUDAToolkit_ROOT AND EXISTS /usr/local/cuda)
  set(CUDAToolkit_ROOT /usr/local/cuda)
endif()
find_package(CUDAToolkit QUIET)
# The cuda plugin's device code needs nvcc as CMake's CUDA compiler; not in
# sanitizer builds (nvcc takes no sanitizer flags).
set(KREG_CUDA_FOUND OFF)
set(KREG_CUDA_ARCHITECTURES "90-real;90-virtual" CACHE STRING "GPU architectures of the cuda plugin (sm_90 and its PTX)")
if(CUDAToolkit_FOUND AND NOT KREG_SANITIZE AND NOT KREG_FUZZ)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND CUDAToolkit_NVCC_EXECUTABLE)
    set(CMAKE_CUDA_COMPILER ${CUDAToolkit_NVCC_EXECUTABLE})
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    set(KREG_CUDA_FOUND ON)
  endif()
endif()

# Optional: the Python package (python/), on Debian's Python 3 with its
# headers (python3-dev) and pybind11 (pybind11-dev); its tests need NumPy
# and pytest (python3-numpy, python3-pytest). Debian's interpreter first:
# another python3 earlier on PATH may lack NumPy. Not with sanitizers (the
# interpreter is not instrumented).
set(KREG_PYTHON_FOUND OFF)
if(KREG_PYTHON AND NOT KREG_SANITIZE AND NOT KREG_FUZZ)
  if(NOT DEFINED Python3_EXECUTABLE AND EXISTS /usr/bin/python3)
    set(Python3_EXECUTABLE /usr/bin/python3)
  endif()
  find_package(Python3 COMPONENTS Interpreter Development.Module QUIET)
  if(Python3_FOUND)
    find_package(pybind11 CONFIG QUIET)
  endif()
  if(Python3_FOUND AND pybind11_FOUND)
    set(KREG_PYTHON_FOUND ON)
    set(KREG_PYTHON_INSTALL_DIR
      "${CMAKE_INSTALL_LIBDIR}/python${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}/dist-packages"
      CACHE STRING "The folder holding the kreg Python package, relative to the prefix")
    # The package's own folder; pip's wheel (pyproject.toml) makes it the
    # prefix itself, ".", with KREG_PYTHON_INSTALL_DIR "..".
    set(KREG_PYTHON_PACKAGE_DIR "${KREG_PYTHON_INSTALL_DIR}/kreg"
      CACHE STRING "The kreg Python package's folder, relative to the prefix")
    message(STATUS "kreg: Python ${Python3_VERSION} (${Python3_EXECUTABLE}) and pybind11 ${pybind11_VERSION} found: "
                   "building the Python package")
    # A Python with PyTorch and JAX for kreg.torch and kreg.jax (their shims
    # and tests): scripts/venv.sh makes build/venv from this same
    # interpreter, so the module imports in both.
    # Empty: build/venv/bin/python once it exists.
    set(kreg_doc "A Python with torch and jax for the framework shims and tests (empty: build/venv/bin/python, which scripts/venv.sh makes, where it exists; under pip the installing Python)")
    set(KREG_FRAMEWORK_PYTHON "" CACHE FILEPATH "${kreg_doc}")
    set(KREG_FRAMEWORK_PYTHON_RUN ${KREG_FRAMEWORK_PYTHON})
    if(SKBUILD)
      # Under pip (pyproject.toml; scikit-build-core sets SKBUILD) the
      # installing interpreter, so the shims match the torch and jax it
      # imports; asked outside pip's build isolation, whose PYTHONPATH
      # overlay (and PYTHONNOUSERSITE) hides its site packages.
      if(NOT KREG_FRAMEWORK_PYTHON)
        set(KREG_FRAMEWORK_PYTHON ${Python3_EXECUTABLE})
      endif()
      set(KREG_FRAMEWORK_PYTHON_RUN ${CMAKE_COMMAND} -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE
        ${KREG_FRAMEWORK_PYTHON})
    elseif(NOT KREG_FRAMEWORK_PYTHON AND EXISTS ${PROJECT_SOURCE_DIR}/build/venv/bin/python)
      set(KREG_FRAMEWORK_PYTHON ${PROJECT_SOURCE_DIR}/build/venv/bin/python CACHE FILEPATH "${kreg_doc}" FORCE)
      set(KREG_FRAMEWORK_PYTHON_RUN ${KREG_FRAMEWORK_PYTHON})
    endif()
  else()
    message(STATUS "kreg: Python 3 with its headers or pybind11 not found: skipping the Python package "
                   "(install python3-dev pybind11-dev)")
  endif()
endif()
