"""Kill-and-restart chaos testing with an invariant report."""
