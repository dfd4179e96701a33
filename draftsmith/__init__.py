"""draftsmith: train, measure and ship drafters for speculative decoding."""

from draftsmith.errors import DraftsmithError

__version__ = "0.1.0"
__all__ = ["DraftsmithError", "__version__"]
