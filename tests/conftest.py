"""Shared fixtures: tiny random checkpoints written by transformers, loaded once per session."""

from __future__ import annotations

import gc
import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

# The test models are tiny: one thread is fastest, and pytest-xdist's workers share the cores.
torch.set_num_threads(1)
# Calibration results (early-exit layer) must not leak between test runs or into the user's cache.
# The CPU kernels, a build keyed by their source, are shared by the run's workers: one builds them
# while the other waits (kernels._build_once), instead of both compiling for ~20 s.
_cache = Path(tempfile.mkdtemp(prefix="quickdraft-test-cache-"))
_kernels = Path(tempfile.gettempdir()) / f"quickdraft-test-kernels-{os.environ.get('PYTEST_XDIST_TESTRUNUID', os.getpid())}"
_kernels.mkdir(exist_ok=True)
(_cache / "kernels").symlink_to(_kernels, target_is_directory=True)
os.environ["QUICKDRAFT_CACHE_DIR"] = str(_cache)
# One thread for inductor's compiles: with two (its default here) each compile starts a pool of
# compiling subprocesses that fights the other xdist worker for the cores, and the module of
# compiled-step tests took 288 s of the suite against 78 s run alone.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

from hf_factory import make_hf_checkpoint  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with long (``slow``) tests first, each module kept whole (its fixtures are built
    once): with two workers, the long tests start early instead of leaving one worker alone at the end."""
    slow_modules = {item.module.__name__ for item in items if item.get_closest_marker("slow")}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (item.module.__name__ not in slow_modules, order[id(item)]))


def pytest_configure(config: pytest.Config) -> None:
    """The second xdist worker builds the lesser kernel builds this CPU runs (for the test that checks
    them in a subprocess) before collecting: collection makes both workers load this run's kernels,
    and while one compiles them (~20 s) the other only waited for it. Only in a whole run, where that
    test is selected: the kernel tests collected, and no ``-m`` or ``-k``."""
    if os.environ.get("PYTEST_XDIST_WORKER") != "gw1" or config.option.markexpr or config.option.keyword:
        return
    kernel_tests = Path(__file__).with_name("test_kernels.py").resolve()
    paths = [Path(arg.split("::")[0]).resolve() for arg in config.args] or [config.rootpath / "tests"]
    if not any(path == kernel_tests or (path.is_dir() and kernel_tests.is_relative_to(path)) for path in paths):
        return
    from quickdraft import kernels

    chosen = kernels.isa() if os.environ.get("QUICKDRAFT_KERNELS", "1") != "0" else None
    if chosen is None or os.environ.get("QUICKDRAFT_KERNELS_ISA"):
        return
    runnable = kernels.runnable_isas()
    for lesser in runnable[runnable.index(chosen) + 1:]:
        try:
            kernels.build_only(lesser)
        except Exception:  # noqa: BLE001 - the test that loads it reports the failure
            pass


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection built (modules, torch, hypothesis: ~400,000 objects) out of the garbage
    collector's way (``gc.freeze``): every full collection rescanned them, ~15-20% of the batched
    chi-square run's 240,000 requests. Objects the tests make are collected as usual.
    QUICKDRAFT_TEST_GC_FREEZE=0 leaves them in."""
    if os.environ.get("QUICKDRAFT_TEST_GC_FREEZE", "1") != "0":
        gc.collect()
        gc.freeze()


# Modules whose tests share one xdist worker (``pytest.mark.xdist_group``).
GROUPED_MODULES = ("tests/test_ray_serve.py", "tests/test_compiled_drafter.py")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """Under ``--dist loadgroup`` a grouped test's id carries its group (``...@ray``); without the
    suffix xdist spreads the group over the workers, silently, and each rebuilds the module's
    fixtures (the Ray tests started Ray twice, ~90 s each). Stop instead."""
    if node.config.getoption("dist") != "loadgroup":
        return
    lost = [i for i in ids if i.startswith(GROUPED_MODULES) and "@" not in i]
    if lost:
        raise pytest.UsageError(f"pytest-xdist did not group {lost[0]}: this pytest and pytest-xdist disagree on "
                                "node ids (pytest-dev/pytest-xdist#1386); install the versions pinned by "
                                "pyproject.toml's dev extra")

from quickdraft.model.loader import LoadedModel, load_model  # noqa: E402
from quickdraft.model.weights import save_pretrained  # noqa: E402


def perturbed_copy(source: Path, out_dir: Path, noise: float, seed: int) -> Path:
    """A 'related' draft: the target's weights plus relative Gaussian noise."""
    loaded = load_model(source, tokenizer=False)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in loaded.model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * noise * p.std())
    save_pretrained(loaded.model, out_dir)
    return out_dir


@pytest.fixture
def every_call_shared():
    """The kernels share every product and attention among the threads, however small (their
    default keeps small ones on one thread): what a test of thread counts needs to exercise."""
    from quickdraft import kernels

    if not kernels.available():
        yield
        return
    least = kernels.min_task_work()
    kernels.set_min_task_work(0)
    yield
    kernels.set_min_task_work(least)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    target = make_hf_checkpoint("llama", root / "target", seed=1)
    return {
        "target": target,
        "related": perturbed_copy(target, root / "related", noise=0.1, seed=3),
        "unrelated": make_hf_checkpoint("llama", root / "unrelated", seed=2, num_hidden_layers=1, hidden_size=32),
    }


@pytest.fixture(scope="session")
def models(checkpoints) -> dict[str, LoadedModel]:
    return {name: load_model(path) for name, path in checkpoints.items()}
