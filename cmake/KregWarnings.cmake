# kreg_set_warnings(target): warnings (and sanitizers) on kreg's own targets
# only, never globally.
function(kreg_set_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wshadow=local -Wnon-virtual-dtor)
  if(KREG_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  if(KREG_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=${KREG_SANITIZE} -fno-omit-frame-pointer)
    target_link_options(${target} PRIVATE -fsanitize=${KREG_SANITIZE})
  endif()
endfunction()
