"""Conformance fixtures for the intent layer: vectors, upstream's schemas, the seed's examples, Node programs."""
