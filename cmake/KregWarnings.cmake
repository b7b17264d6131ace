# kreg_set_warnings(target): warnings (and sanitizers) on kreg's own targets
# only, never globally.
function(kreg_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wnon-virtual-dtor)
  # A local hiding a local: GCC's -Wshadow=local; clang has no such subset
  # (its -Wshadow also covers namespace-scope names).
  if(CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE -Wshadow)
  else()
    target_compile_options(${target} PRIVATE -Wshadow=local)
  endif()
  if(KREG_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(KREG_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${KREG_SANITIZE} -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=${KREG_SANITIZE})
    # A UBSan report stops the program, so a test or fuzzer that hits one fails.
    if(KREG_SANITIZE MATCHES "undefined")
      target_compile_options(${target} PRIVATE -fno-sanitize-recover=undefined)
    endif()
  endif()
  # KREG_FUZZ (clang): every kreg target carries libFuzzer's coverage
  # instrumentation, so the fuzzers in fuzz/ see the library and plugin code
  # they drive; only the fuzzers link libFuzzer itself.
  if(KREG_FUZZ AND CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    target_compile_options(${target} PRIVATE -fsanitize=fuzzer-no-link)
    target_link_options(${target} PRIVATE -fsanitize=fuzzer-no-link)
  endif()
endfunction()
