"""gridbot: run bags of tasks on many resource pools at once.

The Python API is `gridbot.Client`; `gridbot.load_spec_file` validates a spec without submitting it.
"""

from gridbot.client import ApiError, Client, load_lines_file, load_spec_file
from gridbot.errors import GridbotError, ServerUnavailable
from gridbot.model.spec import BagSpec, SpecError

__all__ = ["ApiError", "BagSpec", "Client", "GridbotError", "ServerUnavailable", "SpecError", "load_lines_file",
           "load_spec_file"]
