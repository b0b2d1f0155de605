"""Work taken from an agent-task bridge: the spec section and the service."""
