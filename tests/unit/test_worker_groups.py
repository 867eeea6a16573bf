"""``make test``'s two workers: the groups ``tests/conftest.py`` gives pytest-xdist's scheduler."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests.conftest import SMOKE_FILES, TRAINED_POLICY_FILES, _group, pytest_collection_modifyitems


def _item(nodeid: str, *fixtures: str) -> SimpleNamespace:
    return SimpleNamespace(nodeid=nodeid, fixturenames=list(fixtures), add_marker=lambda mark: None)


def test_each_file_is_a_group_and_the_smoke_pipelines_files_are_one():
    assert {"tests/e2e/test_pipeline.py", "tests/e2e/test_kill_anywhere.py", "tests/e2e/test_declared_reads.py"} <= SMOKE_FILES
    assert "tests/unit/test_stats.py" not in SMOKE_FILES
    assert _group("tests/e2e/test_pipeline.py::test_x") == _group("tests/e2e/test_kill_anywhere.py::test_y[a]") == "smoke-pipeline"
    assert _group("tests/unit/test_stats.py::test_x") == "tests/unit/test_stats.py" != _group("tests/integration/test_params.py::test_x")


def test_the_files_rolling_out_the_trained_tiny_policy_share_one_worker():
    # tests/tiny_policy.py caches it per process: one group trains it once
    assert {"tests/unit/test_sampling.py", "tests/unit/test_rollout_engine.py"} <= TRAINED_POLICY_FILES
    assert _group("tests/unit/test_sampling.py::t") == _group("tests/unit/test_rollout_engine.py::t") == "trained-policy"
    assert not TRAINED_POLICY_FILES & SMOKE_FILES


def test_the_smoke_group_runs_first_and_keeps_each_files_order():
    items = [_item("tests/test_a.py::t1"), _item("tests/e2e/test_pipeline.py::t1", "smoke_recorded"),
             _item("tests/test_a.py::t2"), _item("tests/e2e/test_pipeline.py::t2")]
    pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == ["tests/e2e/test_pipeline.py::t1", "tests/e2e/test_pipeline.py::t2",
                                         "tests/test_a.py::t1", "tests/test_a.py::t2"]


def test_a_smoke_fixture_reached_from_outside_the_group_is_an_error():
    # e.g. through a fixture defined elsewhere that wraps smoke_recorded: on the other worker it would build
    # a second pipeline and race the group's dvc runs in the first one's repository
    items = [_item("tests/unit/test_stats.py::t", "wrapper", "smoke_recorded")]
    with pytest.raises(pytest.UsageError, match="tests/unit/test_stats.py::t"):
        pytest_collection_modifyitems(None, items)
