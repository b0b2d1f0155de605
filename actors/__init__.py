"""The actor process runtime and the actor templates."""
