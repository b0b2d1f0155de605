"""Interactive runs: steers, questions to the user, conversations and forks."""
