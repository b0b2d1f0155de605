"""Local GGUF models as supervised actors: the spec section and the generation relay."""
