"""What the machine is (decoding/machine.py): CPUs sold under one name are told apart by what changes a forward's
cost (the device in a profile's key) and by every ISA flag (what compiled kernels are built for)."""

import torch

from hf_dspark.decoding import machine
from hf_dspark.decoding.machine import cpu_has_native_bf16, cpu_identity, cpu_info, device_name

ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 1
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx avx2 fma

processor\t: 1
vendor_id\t: AuthenticAMD
"""
ZEN4 = ZEN3.replace("model\t\t: 1", "model\t\t: 17").replace("avx2 fma", "avx2 fma avx512f avx512bw avx512_bf16")
SAPPHIRE = """vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
"""


def test_cpu_info_reads_the_first_processor_and_the_flags_that_change_costs():
    assert cpu_info(ZEN3) == {"name": "AMD EPYC", "vendor": "AuthenticAMD", "family": "25", "model": "1",
                              "flags": ["avx2"]}
    assert cpu_info(ZEN4)["flags"] == ["avx2", "avx512_bf16", "avx512f"]
    assert cpu_info(SAPPHIRE)["flags"] == ["amx_bf16", "amx_tile", "avx2", "avx512_bf16", "avx512f"]
    assert not cpu_has_native_bf16(ZEN3)
    assert cpu_has_native_bf16(ZEN4) and cpu_has_native_bf16(SAPPHIRE)
    assert not cpu_has_native_bf16("")  # nothing known: not native


def test_cpus_sharing_a_name_have_different_device_names():
    names = {device_name("cpu", text) for text in (ZEN3, ZEN4, SAPPHIRE)}
    assert len(names) == 3 and all(n.startswith(("AMD EPYC [", "Intel(R)")) for n in names)
    assert "family 25 model 1; avx2]" in device_name("cpu", ZEN3)


def test_thread_count_is_part_of_the_device_name():
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = device_name("cpu", ZEN4)
        torch.set_num_threads(2)
        assert device_name("cpu", ZEN4) != one
    finally:
        torch.set_num_threads(before)


def test_cpu_identity_names_the_cpu_and_every_flag():
    """Compiled kernels are keyed by it: /proc/cpuinfo pads its field names with tabs, which must not lose them."""
    ident = cpu_identity(ZEN4)
    assert ident.startswith("AMD EPYC | AuthenticAMD | 25 | 17 | ") and "avx512bw" in ident and "fma" in ident
    assert cpu_identity(ZEN4.replace("avx2 fma", "avx2 gfni fma")) != ident  # a flag outside device_name's set
    assert cpu_identity(ZEN3) != ident and cpu_identity(SAPPHIRE) != ident
    assert machine.cpu_identity() == cpu_identity(machine.read_cpuinfo())  # this machine's, read once
