"""Process sessions (PTY and pipes) as supervised actors with durable transcripts."""
