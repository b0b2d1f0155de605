"""The project a supervisor works in: its revision and its verifications."""
