"""Several supervisors on one PostgreSQL ledger: the cluster tables and a supervisor's node service."""
