"""The swarm: isolated children, join barriers, delegation and delivery claims."""
