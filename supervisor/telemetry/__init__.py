"""OpenTelemetry traces of finished run trees, projected from the ledger (docs/telemetry.md)."""
