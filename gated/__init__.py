"""gated: an online gate-learning daemon for AI-agent tool-call gateways."""

__version__ = "0.1.0"
