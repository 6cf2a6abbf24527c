"""Round 42. A pytest plugin that runs the suite in reverse order, to find tests that depend on what earlier ones
left in shared fixtures: PYTHONPATH=docs/bench/round42 .venv/bin/python -m pytest -p reverse_order -n 0 tests"""
import pytest

@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items):
    items.reverse()
