# The lines of a text as a CMake list, one element per line (empty lines
# included), for the source checks that report file:line. Characters a list
# treats specially (; \ [ ]) become control characters; hg_line_text() turns
# a line back into its text for printing.
string(ASCII 1 hg_semicolon)
string(ASCII 2 hg_backslash)
string(ASCII 3 hg_open_bracket)
string(ASCII 4 hg_close_bracket)

function(hg_text_lines text out)
  string(REPLACE ";" "${hg_semicolon}" text "${text}")
  string(REPLACE "\\" "${hg_backslash}" text "${text}")
  string(REPLACE "[" "${hg_open_bracket}" text "${text}")
  string(REPLACE "]" "${hg_close_bracket}" text "${text}")
  string(REPLACE "\n" ";" text "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

function(hg_line_text line out)
  string(REPLACE "${hg_semicolon}" ";" line "${line}")
  string(REPLACE "${hg_backslash}" "\\" line "${line}")
  string(REPLACE "${hg_open_bracket}" "[" line "${line}")
  string(REPLACE "${hg_close_bracket}" "]" line "${line}")
  string(STRIP "${line}" line)
  set(${out} "${line}" PARENT_SCOPE)
endfunction()
