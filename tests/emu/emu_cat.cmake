# cmake -DOUT=file "-DIN=a;b;c" -P emu_cat.cmake: concatenates the kernel lists of the rewritten files.
file(WRITE ${OUT} "")
foreach(f ${IN})
  file(READ ${f} t)
  file(APPEND ${OUT} "${t}")
endforeach()
