"""Fixtures shared by the unit tests: ``s3_server``/``s3``, a real S3-compatible object store
(tests/s3.py), started once per session and only by the tests that ask for it."""

from tests.s3 import s3, s3_server  # noqa: F401
