"""Settings shared by every test in the workspace."""

import pytest
import torch


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    # Test tensors are tiny: intra-op threads only add synchronisation (up to 30x slower on a busy
    # 2-core machine), and one thread keeps BLAS reductions in a fixed order.
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
