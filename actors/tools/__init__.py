"""Tools an agent's actions run: fs.*, effect.record, agent.*, process.*."""
