"""Helpers the Python suites share (not shipped: the pyproject installs only
the kvtier_* packages; pytest's pythonpath puts this tree on sys.path)."""
