"""Hooks for every session of the suite: each test that a wait's timeout failed is told
again, shortened, at the very end of the output (tests/failure_tail.py)."""

from tests.failure_tail import pytest_runtest_makereport, pytest_terminal_summary

__all__ = ["pytest_runtest_makereport", "pytest_terminal_summary"]
