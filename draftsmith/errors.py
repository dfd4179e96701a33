"""The one error type users see: a paragraph that names the thing and what to do."""


class DraftsmithError(Exception):
    """A problem with the user's input or environment, shown without a traceback."""
