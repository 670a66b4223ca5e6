"""Whether the exactness tests may skip on this CPU.

The verifier is bit-exact where this CPU's packed linears are row-invariant (`specdec.probes.linear_min_rows`).
A test of that promise skips where the probe says they are not; but a regression in the probe would then turn the
promise's tests into skips. So under `make test` (`SPECDEC_REQUIRE_EXACT=1`) a test fails instead wherever the
CPU's features say it should pass: float32 wherever torch packs float32 linears for oneDNN (every x86-64 CPU with
AVX2 seen so far), bfloat16 where the CPU also multiplies bf16 natively (AVX512-BF16 or AMX).
"""

import os

import pytest
import torch

from specdec import probes


def expected_row_invariant(dtype: torch.dtype) -> bool:
    """Whether a CPU with this one's features should have row-invariant packed linears of `dtype`."""
    if dtype == torch.bfloat16 and not probes.cpu_has_native_bf16():
        return False
    return dtype in probes.PACKED_DTYPES and probes.packing_available(dtype)


def require_row_invariant(dtype: torch.dtype, shapes: tuple[tuple[int, int], ...]) -> int:
    """The rows packed linears of `dtype` and these shapes pad a lone row to here; where they are not row-invariant,
    skip, or under SPECDEC_REQUIRE_EXACT=1 fail where this CPU should pass."""
    rows = probes.linear_min_rows(dtype, shapes)
    if rows is None:
        why = f"this CPU's packed {probes.dtype_name(dtype)} linears are not row-invariant"
        if os.environ.get("SPECDEC_REQUIRE_EXACT") == "1" and expected_row_invariant(dtype):
            pytest.fail(f"{why}, though a CPU with its features should pass the probe (SPECDEC_REQUIRE_EXACT=1)")
        pytest.skip(why)
    return rows
