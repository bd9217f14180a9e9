"""Helpers shared by test folders (each folder's conftest.py shadows the others' under one name)."""
