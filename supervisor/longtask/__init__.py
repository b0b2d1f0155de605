"""Long tasks: the durable plan, goal mode and token-aware context compaction."""
