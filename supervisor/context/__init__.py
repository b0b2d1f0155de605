"""Project context and collaboration: the collaboration policy and its service."""
