# cmake -DIN=file -DOUT=file.c -DNAME=symbol -P embed.cmake: writes a C
# file defining `const char NAME[]` (the file's bytes, NUL-terminated) and
# `const unsigned long NAME_len`, so that a program carries a page with it.
file(READ ${IN} hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" bytes "${bytes}")
file(WRITE ${OUT} "/* Generated from ${IN} by cmake/embed.cmake. */\n"
  "const char ${NAME}[] = {\n${bytes}0};\n"
  "const unsigned long ${NAME}_len = sizeof ${NAME} - 1;\n")
