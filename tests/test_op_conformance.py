"""Every installed backend's ops against the reference backend (deepinfer.testing.conformance).

On CPU each case's own check judges the reference op (oracle, edge cases, invariants). Other backends
run on CUDA against the reference op on the same inputs; they are skipped without CUDA.
"""

from __future__ import annotations

import pytest
import torch

from deepinfer.ops import available_backends
from deepinfer.ops.reference import REFERENCE_OPS
from deepinfer.testing.conformance import Case, cases

CASES = cases()
OTHER_BACKENDS = sorted(name for name in available_backends() if name != "reference")


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_cases_name_ops_of_the_op_set():
    unknown = sorted({c.op for c in CASES} - set(REFERENCE_OPS))
    assert not unknown, f"conformance cases for ops outside REFERENCE_OPS: {unknown}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_reference(case: Case):
    args, kwargs = case.inputs("cpu")
    out = REFERENCE_OPS[case.op](*args, **kwargs)
    case.check(out, args, kwargs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", OTHER_BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_backend_matches_reference(backend: str, case: Case):
    impl = available_backends()[backend]
    device = torch.device("cuda")
    if not impl.supports(device):
        pytest.skip(f"{backend} does not support {device}")
    op = impl.ops().get(case.op)
    if op is None:
        pytest.skip(f"{backend} does not provide {case.op}")
    args, kwargs = case.inputs(device, {**REFERENCE_OPS, **impl.ops()})
    actual = case.judged(op(*args, **kwargs), args, kwargs)
    ref_args, ref_kwargs = case.inputs(device)
    expected = case.judged(REFERENCE_OPS[case.op](*ref_args, **ref_kwargs), ref_args, ref_kwargs)
    case.assert_matches(actual, expected)
