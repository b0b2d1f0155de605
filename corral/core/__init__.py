"""The ground every layer of corral stands on: failpoints, redaction, optional
imports, process helpers and the base error. Nothing here imports a layer above."""
