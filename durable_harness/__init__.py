"""durable-harness: crash-durable runs for LLM agents."""

__version__ = "0.1.0"
