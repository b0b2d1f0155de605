"""corral: a supervised actor runtime for local LLM agent swarms."""

__version__ = "0.1.0"

#: Wire protocol version carried by every envelope and the endpoint file.
PROTOCOL_VERSION = 1
