"""What every process the tests start gets for Inductor, besides its caches (tests/conftest.py).

Inductor checks each vector ISA the CPU's flags claim (AMX, AVX-512 VNNI, AVX-512, AVX2) by
compiling a small program and loading it in a fresh Python (`VecISA.check_build`,
torch/_inductor/cpu_vec_isa.py, torch 2.11 and 2.13), once per process that compiles: every
compiled engine's worker. Seen here: 24 CPU-s for the check on a Xeon with AMX, 10 with
`TORCHINDUCTOR_VEC_ISA_OK=1`, which makes Inductor take the ISAs the CPU's flags claim without
building them; it picks the same one (`pick_vec_isa()`: VecAMX there, either way). The tests'
compiler (Debian's gcc 12) builds every x86 ISA torch knows; a compiler that could not would
fail the compile loudly instead of falling back to a narrower ISA.
"""

from __future__ import annotations

INDUCTOR_ENV = {"TORCHINDUCTOR_VEC_ISA_OK": "1"}
