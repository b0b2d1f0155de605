"""The ground every layer of corral stands on: failpoints, redaction, process
helpers, the base error and the one illegal-transition error. Nothing here imports a
layer above."""
