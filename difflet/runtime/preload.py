"""Imported by the model processes' forkserver only (see procs.prestart), never by the API
process: work every model process would otherwise repeat at its start, done once before they
fork from the forkserver (module caches are inherited by fork).

- AOTInductor's package loader compares the CPU's vector ISA with the one a program was built
  for; finding it compiles and dlopens probe programs in subprocesses (about 1 s on an idle
  2-core machine, far more on a loaded one). The result is cached per process
  (`valid_vec_isa_list` is a functools.cache), so the forkserver finds it once.
"""
from torch._inductor import cpu_vec_isa

cpu_vec_isa.valid_vec_isa_list()
