"""The release of vitzoo (pyproject.toml says the same), below every module that records it: a saved
model's config.json and the Hub's user agent."""

__version__ = "0.1.0"
