# Writes OUT, a C file holding each INPUTS file (a ;-list) as a NUL-terminated
# string named by its base name (INPUTS separated by |): how examples/clusters/*.txtpb, the one
# source of the built-in cluster profiles, become part of loom.
# cmake -DOUT=file.c -DINPUTS="a.txtpb|b.txtpb" -P embed_text.cmake
set(body "/* Generated from examples/clusters by scripts/embed_text.cmake: do not edit. */\n#include \"sim/profile_builtin.h\"\n\n")
set(table "")
set(count 0)
string(REPLACE "|" ";" INPUTS "${INPUTS}")
foreach(input IN LISTS INPUTS)
  get_filename_component(name "${input}" NAME_WE)
  file(READ "${input}" hex HEX)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  string(APPEND body "static const char text_${count}[] = {${bytes}0x00};\n")
  string(APPEND table "  {\"${name}\", text_${count}},\n")
  math(EXPR count "${count} + 1")
endforeach()
string(APPEND body "\nconst loom_builtin_profile LOOM_BUILTIN_PROFILES[] = {\n${table}};\nconst int LOOM_BUILTIN_PROFILE_COUNT = ${count};\n")
file(WRITE "${OUT}" "${body}")
