"""The supervision tree: actor slots, their state machine, restart decisions and readiness."""
