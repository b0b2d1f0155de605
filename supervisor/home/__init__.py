"""The supervisor's home directory: lock and endpoint, the files it owns, where a home may lie."""
