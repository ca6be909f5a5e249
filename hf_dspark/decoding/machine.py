"""What this machine is, for the keys of what is measured or compiled on it: the CPU's model and ISA flags (from
/proc/cpuinfo) and a device's name. Two CPUs sold under one name ("AMD EPYC") can differ in exactly what matters
(a Zen 3 has no AVX-512, a Zen 4 has avx512_bf16), so the name alone never keys anything.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import torch

# The ISA features that change what a forward costs: native bf16 dot products (avx512_bf16), AMX tiles, AVX-512,
# AVX2.
CPU_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")


@functools.cache
def read_cpuinfo() -> str:
    """/proc/cpuinfo's text ("" where there is none); read once per process."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_fields(cpuinfo: str | None = None) -> dict[str, str]:
    """The first processor's block of /proc/cpuinfo (or of the text given, for tests) as {field: value}: all cores
    are one model here."""
    cpuinfo = read_cpuinfo() if cpuinfo is None else cpuinfo
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        k, _, v = line.partition(":")
        fields.setdefault(k.strip(), v.strip())
    return fields


def _flags(fields: dict[str, str]) -> list[str]:
    return sorted(set(fields.get("flags", fields.get("Features", "")).split()))


def cpu_info(cpuinfo: str | None = None) -> dict:
    """What the CPU is: {"name", "vendor", "family", "model", "flags"} with flags the sorted subset of CPU_FLAGS
    present. Fields missing from the text are ""."""
    return _info(cpu_fields(cpuinfo))


def _info(fields: dict[str, str]) -> dict:
    return {
        "name": fields.get("model name", "") or platform.processor() or platform.machine(),
        "vendor": fields.get("vendor_id", ""),
        "family": fields.get("cpu family", ""),
        "model": fields.get("model", ""),
        "flags": [f for f in _flags(fields) if f in CPU_FLAGS],
    }


def cpu_identity(cpuinfo: str | None = None) -> str:
    """The CPU as compiled kernels depend on it: model name, vendor, family, model and every ISA flag (inductor
    builds its kernels for the CPU it runs on, so a kernel built on one CPU may not run on another of the same
    name)."""
    fields = cpu_fields(cpuinfo)
    c = _info(fields)
    return " | ".join((c["name"], c["vendor"], c["family"], c["model"], " ".join(_flags(fields))))


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU multiplies bf16 natively (avx512_bf16 or AMX): only there is bf16 faster than float32."""
    return bool({"avx512_bf16", "amx_bf16"} & set(cpu_info(cpuinfo)["flags"]))


def device_name(device: torch.device | str, cpuinfo: str | None = None) -> str:
    """GPU name, or the CPU's model string, vendor/family/model, the ISA flags that matter (CPU_FLAGS) and torch's
    thread count: everything a CPU timing depends on besides the model, dtype and torch."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type != "cpu":
        return device.type
    c = cpu_info(cpuinfo)
    ident = " ".join(x for x in (c["vendor"], c["family"] and f"family {c['family']}",
                                 c["model"] and f"model {c['model']}") if x)
    flags = " ".join(c["flags"]) or "no avx2"
    return f"{c['name']} [{ident + '; ' if ident else ''}{flags}] ({torch.get_num_threads()} threads)"
