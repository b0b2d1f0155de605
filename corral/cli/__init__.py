"""The ``corral`` command: a thin layer over ``corral.Client`` (``main`` parses and
dispatches; one module per group of commands)."""
