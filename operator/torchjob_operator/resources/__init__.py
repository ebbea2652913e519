"""Manifest builders (pure): spec -> Pod and Service dicts."""
