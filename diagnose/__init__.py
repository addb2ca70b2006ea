"""diagnose: a troubleshooting engine for LLM inference servers."""

__version__ = "0.1.0"
