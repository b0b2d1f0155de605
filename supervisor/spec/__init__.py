"""The swarm spec: pydantic models, one validation pass, one SpecError, the generated reference."""
