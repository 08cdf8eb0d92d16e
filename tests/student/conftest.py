"""Fixtures of the student tests."""

from __future__ import annotations

import pytest

from tests.student.tiny import make_teacher


@pytest.fixture(scope="module")
def teacher_path(tmp_path_factory):
    return make_teacher(tmp_path_factory)
