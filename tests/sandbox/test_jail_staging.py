"""The jail's root and scratch space are placed so they hide none of what is bound into the jail."""

import os

import pytest

from tempering.sandbox._jail import _STAGING_POINTS, _staging_point, scratch_point


def test_the_usual_staging_point_is_tmp():
    assert _staging_point(["/usr", "/etc", "/dev", "/opt/python/3.11"]) == "/tmp"


def test_a_python_environment_under_tmp_moves_the_staging_point():
    chosen = _staging_point(["/usr", "/etc", "/dev", "/tmp/checkout/.venv"])
    assert chosen != "/tmp"
    assert not "/tmp/checkout/.venv".startswith(chosen + "/")
    assert os.path.isdir(chosen)


def test_no_usable_staging_point_is_a_clear_error():
    with pytest.raises(OSError, match="no directory to build the sandbox root on"):
        _staging_point([f"{point}/python" for point in _STAGING_POINTS])


def test_scratch_moves_off_tmp_only_when_python_lives_there():
    assert scratch_point(["/usr/local", "/opt/venv"]) == "/tmp"
    assert scratch_point(["/usr/local", "/tmp/checkout/.venv"]) == "/scratch"
