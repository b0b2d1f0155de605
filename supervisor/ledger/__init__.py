"""The ledger: its port and SQLite backend, the PostgreSQL backend, the schema, the SQL dialect, group commit."""
