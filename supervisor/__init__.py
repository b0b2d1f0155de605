"""The root supervisor: supervision tree, ledger, action lifecycle, control API."""
