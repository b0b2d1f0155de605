"""Runs: their state machine, the stores, the run service, what people read, finalization and recovery."""
