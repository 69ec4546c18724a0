# strata_tristate(NAME DOC): a cache option taking AUTO (the default), ON or OFF; any other value is
# a configure error naming the option and the value.
function(strata_tristate name doc)
  set(${name} "AUTO" CACHE STRING "${doc}: AUTO (when found), ON (required) or OFF")
  set_property(CACHE ${name} PROPERTY STRINGS AUTO ON OFF)
  string(TOUPPER "${${name}}" value)
  if(NOT value MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "${name} must be AUTO, ON or OFF, got '${${name}}'")
  endif()
  set(${name} "${value}" PARENT_SCOPE)
endfunction()
