"""What users see when something goes wrong: one error type, a paragraph that names the thing and what to do, and
no library chatter around it."""

import logging
import os
import warnings


class DraftsmithError(Exception):
    """A problem with the user's input or environment, shown without a traceback."""


def quiet_libraries() -> None:
    """Keep library chatter (weight-loading bars, deprecation notes) out of the user's way."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
