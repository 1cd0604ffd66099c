"""What every process the tests start gets besides its compile caches (tests/conftest.py,
tests/vllm_pooling/run.py; `make test` gives the pytest processes themselves the same), unless
the user set the variable. Neither changes what a process computes, only the CPU it spends: the
suite runs two engines at a time on two cores, so CPU burnt in one is taken from the other.

- `TORCHINDUCTOR_VEC_ISA_OK=1`: Inductor checks each vector ISA the CPU's flags claim (AMX,
  AVX-512 VNNI, AVX-512, AVX2) by compiling a small program and loading it in a fresh Python
  (`VecISA.check_build`, torch/_inductor/cpu_vec_isa.py, torch 2.11 and 2.13), once per
  process that compiles: every compiled engine's worker. Seen here: 24 CPU-s for the check on
  a Xeon with AMX, 10 with the variable set, which makes Inductor take the ISAs the CPU's flags
  claim without building them; it picks the same one (`pick_vec_isa()`: VecAMX there, either
  way). The tests' compiler (Debian's gcc 12) builds every x86 ISA torch knows; a compiler that
  could not would fail the compile loudly instead of falling back to a narrower ISA.
- `OMP_WAIT_POLICY=PASSIVE`: torch's OpenMP (GNU libgomp) threads wait for the next parallel
  region by spinning first; between the small kernels of a tiny model's forward they spin
  most of the time, on cores another engine or server needs. Passive waiting sleeps instead.
  Measured on 2 cores (Xeon, idle otherwise), the same tests with and without it: vLLM 0.32's
  test_model_parity 1.9 against 2.2-2.3 CPU-min, tests/reranker/test_server.py 2.7 against
  3.1, vLLM 0.23's test_generation and test_shared_prefix 3.6 against 4.1 (all passed both
  ways). torch's wheels bundle libgomp, for which vLLM sets no wait policy (vLLM 0.23/0.32
  `utils/ompmultiprocessing.py`: GOMP_CPU_AFFINITY; a block time only for Intel OpenMP).
"""

from __future__ import annotations

CHILD_ENV = {"TORCHINDUCTOR_VEC_ISA_OK": "1", "OMP_WAIT_POLICY": "PASSIVE"}
